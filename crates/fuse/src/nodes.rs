//! FUSE node ids for btrfs files.
//!
//! The kernel names every inode it knows by a 64-bit node id that we hand out in
//! LOOKUP (and READDIRPLUS) replies and that it returns with FORGET. st_ino is
//! reported separately (fuse_attr.ino), so (subvolume, inode) pairs that share an
//! inode number (every subvolume root is 256) still get distinct node ids.
//!
//! Each entry remembers its parent and name: `..` for readdir, and a path for log
//! messages. Entries are dropped when the kernel forgets them.

use std::collections::HashMap;
use std::sync::Mutex;
use ubtrfs_core::Node;

use crate::abi::ROOT_ID;

/// What a node id stands for. Placeholders (ino 2) are told apart by the subvolume
/// id their directory entry names: two of them can sit in one directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct NodeKey {
    pub node: Node,
    pub location: u64,
}

impl NodeKey {
    pub(crate) fn new(node: Node, location: u64) -> NodeKey {
        NodeKey {
            node,
            location: if node.is_placeholder() { location } else { 0 },
        }
    }
}

#[derive(Debug)]
struct Entry {
    key: NodeKey,
    lookups: u64,
    parent: u64,
    name: Vec<u8>,
}

#[derive(Debug, Default)]
struct Table {
    by_id: HashMap<u64, Entry>,
    by_key: HashMap<NodeKey, u64>,
    next: u64,
}

#[derive(Debug)]
pub(crate) struct Nodes {
    t: Mutex<Table>,
}

impl Nodes {
    pub(crate) fn new(root: Node) -> Nodes {
        let mut t = Table {
            next: ROOT_ID + 1,
            ..Default::default()
        };
        let key = NodeKey::new(root, 0);
        t.by_id.insert(
            ROOT_ID,
            Entry {
                key,
                lookups: 1,
                parent: ROOT_ID,
                name: Vec::new(),
            },
        );
        t.by_key.insert(key, ROOT_ID);
        Nodes { t: Mutex::new(t) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way
        // that matters more than losing the mount; keep serving.
        self.t.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, id: u64) -> Option<NodeKey> {
        self.lock().by_id.get(&id).map(|e| e.key)
    }

    /// The node id of the directory `id` was found in (itself for the root).
    pub(crate) fn parent(&self, id: u64) -> Option<u64> {
        self.lock().by_id.get(&id).map(|e| e.parent)
    }

    /// Returns the node id for `key` found as `name` in directory `parent`, counting
    /// one kernel lookup.
    pub(crate) fn intern(&self, key: NodeKey, parent: u64, name: &[u8]) -> u64 {
        let mut t = self.lock();
        if let Some(&id) = t.by_key.get(&key) {
            if let Some(e) = t.by_id.get_mut(&id) {
                e.lookups += 1;
                return id;
            }
        }
        let id = t.next;
        t.next += 1;
        t.by_id.insert(
            id,
            Entry {
                key,
                lookups: 1,
                parent,
                name: name.to_vec(),
            },
        );
        t.by_key.insert(key, id);
        id
    }

    /// The kernel dropped `n` references to `id`.
    /// Drops `n` lookups of node `id`; returns its key when the kernel forgot it.
    pub(crate) fn forget(&self, id: u64, n: u64) -> Option<NodeKey> {
        if id == ROOT_ID {
            return None;
        }
        let mut t = self.lock();
        let gone = match t.by_id.get_mut(&id) {
            Some(e) => {
                e.lookups = e.lookups.saturating_sub(n);
                (e.lookups == 0).then_some(e.key)
            }
            None => None,
        };
        if let Some(key) = gone {
            t.by_id.remove(&id);
            if t.by_key.get(&key) == Some(&id) {
                t.by_key.remove(&key);
            }
        }
        gone
    }

    /// A path for messages ("/dir/file"), from the names nodes were found under.
    pub(crate) fn path(&self, id: u64) -> String {
        let t = self.lock();
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = id;
        while cur != ROOT_ID && parts.len() < 4096 {
            let Some(e) = t.by_id.get(&cur) else {
                parts.push(b"?");
                break;
            };
            parts.push(&e.name);
            cur = e.parent;
        }
        let mut s = String::new();
        for p in parts.iter().rev() {
            s.push('/');
            s.push_str(&String::from_utf8_lossy(p));
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subvolume_roots_get_distinct_ids() {
        let n = Nodes::new(Node::new(5, 256));
        let a = n.intern(NodeKey::new(Node::new(256, 256), 256), ROOT_ID, b"sub1");
        let b = n.intern(NodeKey::new(Node::new(257, 256), 257), a, b"sub2");
        assert_ne!(a, b);
        assert_ne!(a, ROOT_ID);
        assert_eq!(n.path(b), "/sub1/sub2");
        assert_eq!(
            n.intern(NodeKey::new(Node::new(256, 256), 256), ROOT_ID, b"sub1"),
            a
        );
        n.forget(a, 1);
        assert!(n.get(a).is_some());
        n.forget(a, 1);
        assert!(n.get(a).is_none());
    }

    #[test]
    fn placeholders_in_one_dir_are_distinct() {
        let n = Nodes::new(Node::new(5, 256));
        let p = |loc| {
            NodeKey::new(
                Node {
                    root: 260,
                    ino: 2,
                    parent_dir: 256,
                },
                loc,
            )
        };
        let a = n.intern(p(256), ROOT_ID, b"a");
        let b = n.intern(p(258), ROOT_ID, b"b");
        assert_ne!(a, b);
    }
}
