//! Directories: lookup by name hash (DIR_ITEM) and listing in DIR_INDEX order, with
//! subvolume entries resolved the way the kernel does (ROOT_REF must agree).

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node};
use crate::transaction::Trans;
use crate::tree::ctree::{lookup_exact, lookup_prev, TreeIter};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::{parse_dir_items, DirItem, InodeItem, RootRef};
use ubtrfs_format::key::Key;

#[derive(Clone, Debug, PartialEq, Eq)]
/// One directory entry, in readdir (DIR_INDEX) order.
pub struct DirEntry {
    /// The name, raw bytes as stored.
    pub name: Vec<u8>,
    /// What the entry points at (a subvolume entry points at its root, 256).
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

    /// One past the highest DIR_INDEX of `dir`: where its next new entry goes (2 in
    /// an empty directory, 0 for a placeholder). A listing can stop there to skip
    /// entries added after it began, as the kernel's btrfs_opendir records it, so
    /// that renaming while reading does not list renamed entries forever.
    pub fn dir_index_end(&self, dir: Node) -> Result<u64> {
        if dir.is_placeholder() {
            return Ok(0);
        }
        let root = self.root(dir.root)?;
        Ok(
            match lookup_prev(
                &self.info,
                &root,
                Key::new(dir.ino, DIR_INDEX_KEY, u64::MAX),
            )? {
                Some((k, _)) if k.objectid == dir.ino && k.ty == DIR_INDEX_KEY => k.offset + 1,
                _ => 2,
            },
        )
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

/// Byte range of the entry named `name` among the packed dir_item entries of a
/// DIR_ITEM or XATTR_ITEM (30-byte header, name, data).
pub(crate) fn dir_entry_span(d: &[u8], name: &[u8]) -> Option<(usize, usize)> {
    let mut pos = 0;
    while pos + 30 <= d.len() {
        let dl = u16::from_le_bytes([d[pos + 25], d[pos + 26]]) as usize;
        let nl = u16::from_le_bytes([d[pos + 27], d[pos + 28]]) as usize;
        let end = pos + 30 + nl + dl;
        if d.get(pos + 30..pos + 30 + nl) == Some(name) {
            return Some((pos, end));
        }
        pos = end;
    }
    None
}

impl Trans {
    /// The index of a new name in directory `dir`: after its highest DIR_INDEX,
    /// and after every index handed out or freed since the last commit. An index
    /// freed by an unlink in this transaction is not given again before the commit
    /// (the kernel's in-memory index_cnt only grows): the committed tree may still
    /// have it, and a tree log replayed over that tree would find it taken.
    pub(crate) fn next_dir_index(&mut self, root: u64, dir: u64) -> Result<u64> {
        let ptr = self.root_ptr(root)?;
        let in_tree =
            match lookup_prev(&self.fs.info, &ptr, Key::new(dir, DIR_INDEX_KEY, u64::MAX))? {
                Some((k, _)) if k.objectid == dir && k.ty == DIR_INDEX_KEY => k.offset + 1,
                _ => 2,
            };
        let floor = self.dir_index_next.entry((root, dir)).or_insert(0);
        let index = in_tree.max(*floor);
        *floor = index + 1;
        Ok(index)
    }

    /// Removes `name`'s DIR_ITEM entry and its DIR_INDEX `index` from directory `dir`
    /// and takes the name from the directory's size; returns the directory's inode
    /// item for the caller to stamp and write (its times depend on who asks).
    pub(crate) fn remove_dir_entry(
        &mut self,
        root: u64,
        dir: u64,
        name: &[u8],
        index: u64,
    ) -> Result<InodeItem> {
        let dkey = Key::new(dir, DIR_ITEM_KEY, name_hash(name));
        self.remove_from_item(root, &dkey, |d| dir_entry_span(d, name))?;
        self.delete_item(root, &Key::new(dir, DIR_INDEX_KEY, index))?;
        self.dir_index_freed(root, dir, index);
        let mut d = self.read_inode(root, dir)?;
        d.size = d.size.saturating_sub(name.len() as u64 * 2);
        Ok(d)
    }

    /// Notes that `index` of directory `dir` was removed (see `next_dir_index`).
    pub(crate) fn dir_index_freed(&mut self, root: u64, dir: u64, index: u64) {
        let floor = self.dir_index_next.entry((root, dir)).or_insert(0);
        *floor = (*floor).max(index.saturating_add(1));
    }

    /// Appends bytes to an item, creating it if missing.
    pub(crate) fn append_to_item(&mut self, root: u64, key: &Key, bytes: &[u8]) -> Result<()> {
        let ptr = self.root_ptr(root)?;
        match lookup_exact(&self.fs.info, &ptr, key)? {
            None => self.insert_item(root, key, bytes),
            Some(it) => {
                let old = it.data().len();
                if old + bytes.len() > self.max_item_size() {
                    return Err(Error::NoSpace(format!("item {key} is full")));
                }
                self.resize_item(root, key, old + bytes.len(), |d| {
                    d[old..].copy_from_slice(bytes)
                })
            }
        }
    }

    /// Removes one entry from an item holding several packed entries; `find` returns
    /// the byte range of the entry to remove.
    pub(crate) fn remove_from_item(
        &mut self,
        root: u64,
        key: &Key,
        find: impl Fn(&[u8]) -> Option<(usize, usize)>,
    ) -> Result<bool> {
        let ptr = self.root_ptr(root)?;
        let Some(it) = lookup_exact(&self.fs.info, &ptr, key)? else {
            return Ok(false);
        };
        let data = it.data().to_vec();
        drop(it);
        let Some((s, e)) = find(&data) else {
            return Ok(false);
        };
        if s == 0 && e == data.len() {
            self.delete_item(root, key)?;
        } else {
            let mut nd = data[..s].to_vec();
            nd.extend_from_slice(&data[e..]);
            self.replace_item(root, key, &nd)?;
        }
        Ok(true)
    }
}
