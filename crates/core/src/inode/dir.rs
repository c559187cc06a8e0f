//! Directories: lookup by name hash (DIR_ITEM) and listing in DIR_INDEX order, with
//! subvolume entries resolved the way the kernel does (ROOT_REF must agree).

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node};
use crate::tree::ctree::{lookup_exact, TreeIter};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::{parse_dir_items, DirItem, RootRef};
use ubtrfs_format::key::Key;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub node: Node,
    /// FT_* file type from the entry.
    pub ty: u8,
    /// DIR_INDEX sequence (readdir order); 0 for lookups.
    pub index: u64,
    /// The entry's location objectid: the inode number, or the subvolume id for a
    /// subvolume entry (what the kernel's readdir reports as d_ino).
    pub location: u64,
}

impl Filesystem {
    /// Where a directory entry leads: an inode of this subvolume, another subvolume's
    /// root, or the ino-2 placeholder when the subvolume's ROOT_REF is not from here.
    fn entry_node(&self, dir: Node, d: &DirItem) -> Result<Node> {
        match d.location.ty {
            INODE_ITEM_KEY => Ok(Node::new(dir.root, d.location.objectid)),
            ROOT_ITEM_KEY => {
                let child = d.location.objectid;
                let rr = lookup_exact(
                    &self.info,
                    &self.info.root_tree_ptr(),
                    &Key::new(dir.root, ROOT_REF_KEY, child),
                )?;
                let linked = match rr {
                    Some(it) => {
                        let r = RootRef::parse(it.data()).map_err(|e| {
                            Error::corrupt(format!("ROOT_REF {} -> {child}: {e}", dir.root))
                        })?;
                        r.dirid == dir.ino && r.name == d.name
                    }
                    None => false,
                };
                if linked && self.try_root(child)?.is_some() {
                    Ok(Node::new(child, FIRST_FREE_OBJECTID))
                } else {
                    Ok(Node {
                        root: dir.root,
                        ino: EMPTY_SUBVOL_DIR_OBJECTID,
                        parent_dir: dir.ino,
                    })
                }
            }
            t => Err(Error::corrupt(format!(
                "subvolume {} dir {}: entry {:?} has location type {t}",
                dir.root,
                dir.ino,
                String::from_utf8_lossy(&d.name)
            ))),
        }
    }

    /// Looks a name up in a directory.
    pub fn lookup(&self, dir: Node, name: &[u8]) -> Result<Option<DirEntry>> {
        if dir.is_placeholder() {
            return Ok(None);
        }
        let root = self.root(dir.root)?;
        let key = Key::new(dir.ino, DIR_ITEM_KEY, name_hash(name));
        let Some(it) = lookup_exact(&self.info, &root, &key)? else {
            return Ok(None);
        };
        let items = parse_dir_items(it.data())
            .map_err(|e| Error::corrupt(format!("subvolume {} {key}: {e}", dir.root)))?;
        for d in items {
            if d.name == name {
                let node = self.entry_node(dir, &d)?;
                return Ok(Some(DirEntry {
                    name: d.name,
                    node,
                    ty: d.ty,
                    index: 0,
                    location: d.location.objectid,
                }));
            }
        }
        Ok(None)
    }

    /// Every entry of a directory in DIR_INDEX order (what readdir returns, minus . and ..).
    pub fn readdir(&self, dir: Node) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        self.readdir_each(dir, |e| {
            out.push(e);
            Ok(true)
        })?;
        Ok(out)
    }

    /// Streams a directory's entries; `f` returns false to stop.
    pub fn readdir_each(&self, dir: Node, f: impl FnMut(DirEntry) -> Result<bool>) -> Result<()> {
        self.readdir_from(dir, 0, f)
    }

    /// Like [`Filesystem::readdir_each`], starting at the first entry whose DIR_INDEX
    /// sequence is `>= start` (a resumable readdir offset).
    pub fn readdir_from(
        &self,
        dir: Node,
        start: u64,
        mut f: impl FnMut(DirEntry) -> Result<bool>,
    ) -> Result<()> {
        if dir.is_placeholder() {
            return Ok(());
        }
        let root = self.root(dir.root)?;
        let iter = TreeIter::new(
            &self.info,
            &root,
            Key::new(dir.ino, DIR_INDEX_KEY, start),
            Key::new(dir.ino, DIR_INDEX_KEY, u64::MAX),
        )?;
        for it in iter {
            let it = it?;
            let k = it.key();
            let items = parse_dir_items(it.data())
                .map_err(|e| Error::corrupt(format!("subvolume {} {k}: {e}", dir.root)))?;
            for d in items {
                let node = self.entry_node(dir, &d)?;
                let e = DirEntry {
                    name: d.name,
                    node,
                    ty: d.ty,
                    index: k.offset,
                    location: d.location.objectid,
                };
                if !f(e)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}
