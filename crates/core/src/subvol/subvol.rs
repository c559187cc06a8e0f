//! Subvolumes and snapshots: ROOT_ITEMs, ROOT_REF/ROOT_BACKREF links and their paths.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node};
use crate::tree::ctree::{lookup_exact, TreeIter};
use std::collections::HashMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::{parse_dir_items, RootItem, RootRef};
use ubtrfs_format::key::Key;

/// One subvolume or snapshot, as `btrfs subvolume list` shows it.
#[derive(Clone, Debug)]
pub struct SubvolInfo {
    /// Subvolume id (its tree's objectid).
    pub id: u64,
    /// ROOT_ITEM generation (what `btrfs subvolume list` prints as gen).
    pub gen: u64,
    /// Generation that created the subvolume (ROOT_ITEM otransid).
    pub cgen: u64,
    /// Parent subvolume ("top level").
    pub top_level: u64,
    /// Directory inode in the parent that holds the entry.
    pub dirid: u64,
    /// Path from the top-level subvolume, without a leading slash.
    pub path: String,
    /// UUID, or "-" when none.
    pub uuid: String,
    /// UUID of the subvolume this is a snapshot of, or "-".
    pub parent_uuid: String,
    /// UUID it was received from (`btrfs receive`), or "-".
    pub received_uuid: String,
    /// ROOT_ITEM flags.
    pub flags: u64,
    /// The read-only flag (BTRFS_ROOT_SUBVOL_RDONLY) is set.
    pub readonly: bool,
    /// Creation time, seconds since the epoch.
    pub otime: i64,
}

fn uuid_or_dash(u: &[u8; 16]) -> String {
    if u.iter().all(|&b| b == 0) {
        "-".into()
    } else {
        ubtrfs_format::bytes::uuid_string(u)
    }
}

impl Filesystem {
    /// Path of directory `dir` inside subvolume `root`, relative to its root dir.
    pub fn dir_path_in(&self, root: u64, dir: u64) -> Result<Vec<u8>> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut cur = dir;
        let mut guard = 0usize;
        while cur != FIRST_FREE_OBJECTID {
            guard += 1;
            if guard > 4096 {
                return Err(Error::corrupt(format!(
                    "subvolume {root}: directory {dir} has a parent loop"
                )));
            }
            let found = self.inode_refs(Node::new(root, cur))?.into_iter().next();
            let r = found.ok_or_else(|| {
                Error::corrupt(format!(
                    "subvolume {root}: directory {cur} has no INODE_REF"
                ))
            })?;
            parts.push(r.name);
            cur = r.parent;
        }
        parts.reverse();
        Ok(parts.join(&b'/'))
    }

    /// The directory that `..` of directory `dir` names: its parent (first
    /// INODE_REF), or for a subvolume's root directory the directory holding the
    /// subvolume's entry (its ROOT_BACKREF). None for the top level's root and for a
    /// subvolume no directory holds (being deleted).
    pub fn parent_dir(&self, dir: Node) -> Result<Option<Node>> {
        if dir.ino != FIRST_FREE_OBJECTID {
            return Ok(self
                .inode_refs(dir)?
                .into_iter()
                .next()
                .map(|r| Node::new(dir.root, r.parent)));
        }
        if dir.root == FS_TREE_OBJECTID {
            return Ok(None);
        }
        let rt = self.info.root_tree_ptr();
        let mut iter = TreeIter::new(
            &self.info,
            &rt,
            Key::new(dir.root, ROOT_BACKREF_KEY, 0),
            Key::new(dir.root, ROOT_BACKREF_KEY, u64::MAX),
        )?;
        let Some(it) = iter.next() else {
            return Ok(None);
        };
        let it = it?;
        let k = it.key();
        let r =
            RootRef::parse(it.data()).map_err(|e| Error::corrupt(format!("root tree {k}: {e}")))?;
        Ok(Some(Node::new(k.offset, r.dirid)))
    }

    /// Every subvolume and snapshot reachable from the top level, by id.
    pub fn subvolumes(&self) -> Result<Vec<SubvolInfo>> {
        let rt = self.info.root_tree_ptr();
        // (child -> (parent, backref)), from ROOT_BACKREF items.
        let mut links: Vec<(u64, u64, RootRef)> = Vec::new();
        let iter = TreeIter::new(
            &self.info,
            &rt,
            Key::new(FIRST_FREE_OBJECTID, 0, 0),
            Key::new(LAST_FREE_OBJECTID, u8::MAX, u64::MAX),
        )?;
        for it in iter {
            let it = it?;
            let k = it.key();
            if k.ty == ROOT_BACKREF_KEY {
                let r = RootRef::parse(it.data())
                    .map_err(|e| Error::corrupt(format!("root tree {k}: {e}")))?;
                links.push((k.objectid, k.offset, r));
            }
        }
        let by_child: HashMap<u64, (u64, RootRef)> = links
            .iter()
            .map(|(c, p, r)| (*c, (*p, r.clone())))
            .collect();
        let mut paths: HashMap<u64, Option<String>> = HashMap::new();
        let mut out = Vec::new();
        for (child, parent, rr) in &links {
            let Some(path) = self.subvol_path(*child, &by_child, &mut paths, 0)? else {
                continue;
            };
            let Some(item) = self.info.read_root_item(*child)? else {
                continue;
            };
            out.push(self.subvol_info(*child, *parent, rr.dirid, path, &item));
        }
        out.sort_by_key(|s| s.id);
        Ok(out)
    }

    fn subvol_info(
        &self,
        id: u64,
        parent: u64,
        dirid: u64,
        path: String,
        r: &RootItem,
    ) -> SubvolInfo {
        SubvolInfo {
            id,
            gen: r.generation,
            cgen: r.otransid,
            top_level: parent,
            dirid,
            path,
            uuid: uuid_or_dash(&r.uuid),
            parent_uuid: uuid_or_dash(&r.parent_uuid),
            received_uuid: uuid_or_dash(&r.received_uuid),
            flags: r.flags,
            readonly: r.flags & ROOT_SUBVOL_RDONLY != 0,
            otime: r.otime.sec,
        }
    }

    fn subvol_path(
        &self,
        id: u64,
        by_child: &HashMap<u64, (u64, RootRef)>,
        memo: &mut HashMap<u64, Option<String>>,
        depth: usize,
    ) -> Result<Option<String>> {
        if id == FS_TREE_OBJECTID {
            return Ok(Some(String::new()));
        }
        if let Some(p) = memo.get(&id) {
            return Ok(p.clone());
        }
        if depth > 1024 {
            return Err(Error::corrupt(format!("subvolume {id}: ROOT_BACKREF loop")));
        }
        let Some((parent, rr)) = by_child.get(&id) else {
            return Ok(None);
        };
        let Some(ppath) = self.subvol_path(*parent, by_child, memo, depth + 1)? else {
            memo.insert(id, None);
            return Ok(None);
        };
        if self.try_root(*parent)?.is_none() {
            memo.insert(id, None);
            return Ok(None);
        }
        let dir = self.dir_path_in(*parent, rr.dirid)?;
        let mut p = ppath;
        for part in [dir.as_slice(), rr.name.as_slice()] {
            if part.is_empty() {
                continue;
            }
            if !p.is_empty() {
                p.push('/');
            }
            p.push_str(&String::from_utf8_lossy(part));
        }
        memo.insert(id, Some(p.clone()));
        Ok(Some(p))
    }

    /// The subvolume whose root directory is `node`, if it is one.
    pub fn subvol_of(&self, node: Node) -> Option<u64> {
        (node.ino == FIRST_FREE_OBJECTID).then_some(node.root)
    }

    /// ROOT_ITEM of a subvolume.
    pub fn subvol_root_item(&self, id: u64) -> Result<RootItem> {
        self.info
            .read_root_item(id)?
            .ok_or_else(|| Error::NotFound(format!("subvolume {id}")))
    }

    /// True when a ROOT_REF links `child` under `parent`.
    pub fn has_root_ref(&self, parent: u64, child: u64) -> Result<bool> {
        Ok(lookup_exact(
            &self.info,
            &self.info.root_tree_ptr(),
            &Key::new(parent, ROOT_REF_KEY, child),
        )?
        .is_some())
    }

    /// The default subvolume (the root tree's "default" entry; 5 without one).
    pub fn default_subvolume(&self) -> Result<u64> {
        let rt = self.info.root_tree_ptr();
        let key = Key::new(ROOT_TREE_DIR_OBJECTID, DIR_ITEM_KEY, name_hash(b"default"));
        let Some(it) = lookup_exact(&self.info, &rt, &key)? else {
            return Ok(FS_TREE_OBJECTID);
        };
        let items = parse_dir_items(it.data())
            .map_err(|e| Error::corrupt(format!("root tree dir item {key}: {e}")))?;
        Ok(items
            .iter()
            .find(|d| d.name == b"default")
            .map_or(FS_TREE_OBJECTID, |d| d.location.objectid))
    }
}
