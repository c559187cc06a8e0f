//! FUSE node ids for btrfs files.
//!
//! The kernel names every inode it knows by a 64-bit node id that we hand out in
//! LOOKUP (and READDIRPLUS) replies and that it returns with FORGET. st_ino is
//! reported separately (fuse_attr.ino), so (subvolume, inode) pairs that share an
//! inode number (every subvolume root is 256) still get distinct node ids.
//!
//! Each entry remembers its parent and name: `..` for readdir, and a path for log
//! messages. Entries are dropped when the kernel forgets them.
//!
//! Node ids are made from (subvolume, inode) where they can be, so they are the
//! same on every mount: the kernel's file handles (name_to_handle_at, NFS export;
//! FUSE_EXPORT_SUPPORT) carry the node id and come back after the kernel forgot the
//! inode, or after a remount, as a LOOKUP of "." ([`Nodes::decode`]). The mounted
//! subvolume's root directory is ROOT_ID; its other inodes are their inode numbers
//! (below 2^40); other subvolumes' inodes are (subvolume << 40) | inode, for
//! subvolume ids below 2^23 (so below 2^63); the rest (placeholders, larger numbers)
//! get ids counted up from 2^63, which last one mount.

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
    /// The next id for a node that has no lasting one.
    next: u64,
}

/// Bits of a lasting id given to the inode number.
const INO_BITS: u32 = 40;
/// Subvolume ids that fit above them while staying below FALLBACK_FIRST.
const SUBVOL_LIMIT: u64 = 1 << 23;
/// First id of the nodes that have no lasting one.
const FALLBACK_FIRST: u64 = 1 << 63;

#[derive(Debug)]
pub(crate) struct Nodes {
    t: Mutex<Table>,
    /// The directory at the mountpoint (ROOT_ID).
    root: Node,
}

impl Nodes {
    pub(crate) fn new(root: Node) -> Nodes {
        let mut t = Table {
            next: FALLBACK_FIRST,
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
        Nodes {
            t: Mutex::new(t),
            root,
        }
    }

    /// The lasting id of `key`, if it has one (see the module's comment).
    pub(crate) fn lasting_id(&self, key: NodeKey) -> Option<u64> {
        let n = key.node;
        if n.is_placeholder() {
            return None;
        }
        if n == self.root {
            return Some(ROOT_ID);
        }
        if n.ino <= ROOT_ID || n.ino >= 1 << INO_BITS {
            return None;
        }
        if n.root == self.root.root {
            return Some(n.ino);
        }
        // Subvolume ids are 5 (the top level) or from 256 on.
        let subvol = n.root == 5 || (256..SUBVOL_LIMIT).contains(&n.root);
        subvol.then_some((n.root << INO_BITS) | n.ino)
    }

    /// The inode a lasting id names, whether or not the kernel still knows it (the
    /// caller checks that it exists).
    pub(crate) fn decode(&self, id: u64) -> Option<Node> {
        if id == ROOT_ID {
            return Some(self.root);
        }
        if id == 0 || id >= FALLBACK_FIRST {
            return None;
        }
        let n = if id < 1 << INO_BITS {
            Node::new(self.root.root, id)
        } else {
            Node::new(id >> INO_BITS, id & ((1 << INO_BITS) - 1))
        };
        // Only what lasting_id hands out: a packed id of the mounted subvolume or a
        // subvolume id below 5 is nobody's.
        (self.lasting_id(NodeKey::new(n, 0)) == Some(id)).then_some(n)
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
        let id = match self.lasting_id(key) {
            Some(id) => id,
            None => {
                let id = t.next;
                t.next += 1;
                id
            }
        };
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

    /// A name of the node known as `key` now lives in directory `parent` as `name`
    /// (RENAME: the kernel moves its dentry without asking again), so `..` of a moved
    /// directory, listed by READDIR, names its new parent.
    pub(crate) fn moved(&self, key: NodeKey, parent: u64, name: &[u8]) {
        let mut t = self.lock();
        if let Some(&id) = t.by_key.get(&key) {
            if let Some(e) = t.by_id.get_mut(&id) {
                e.parent = parent;
                e.name = name.to_vec();
            }
        }
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
    fn lasting_ids_decode_back() {
        let n = Nodes::new(Node::new(5, 256));
        let f = n.intern(NodeKey::new(Node::new(5, 300), 0), ROOT_ID, b"f");
        assert_eq!(f, 300);
        let g = n.intern(NodeKey::new(Node::new(257, 260), 0), ROOT_ID, b"g");
        assert_eq!(g, (257 << 40) | 260);
        assert_eq!(n.decode(f), Some(Node::new(5, 300)));
        assert_eq!(n.decode(g), Some(Node::new(257, 260)));
        assert_eq!(n.decode(ROOT_ID), Some(Node::new(5, 256)));
        // Subvolume 5's inodes are never packed, ids of no subvolume decode to none.
        assert_eq!(n.decode((5 << 40) | 300), None);
        assert_eq!(n.decode((2 << 40) | 300), None);
        assert_eq!(n.decode(FALLBACK_FIRST + 1), None);
        // A subvolume mounted elsewhere: its inodes are plain, the top level's packed.
        let m = Nodes::new(Node::new(257, 256));
        assert_eq!(
            m.lasting_id(NodeKey::new(Node::new(5, 300), 0)),
            Some((5 << 40) | 300)
        );
        assert_eq!(
            m.lasting_id(NodeKey::new(Node::new(257, 300), 0)),
            Some(300)
        );
        assert_eq!(m.decode(300), Some(Node::new(257, 300)));
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
