//! Inode back references (the kernel's inode-item.c): INODE_REF items (parent dir,
//! index, name) and INODE_EXTREF items once a ref item is full, added on link and
//! removed on unlink.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node};
use crate::transaction::Trans;
use crate::tree::ctree::{lookup_exact, TreeIter};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::extref_hash;
use ubtrfs_format::items::{parse_inode_extrefs, parse_inode_refs, InodeItem, InodeRef};
use ubtrfs_format::key::Key;

impl Filesystem {
    /// The names of an inode from its back references: every INODE_REF and
    /// INODE_EXTREF entry (parent directory, index, name), in key order.
    pub fn inode_refs(&self, node: Node) -> Result<Vec<InodeRef>> {
        let root = self.root(node.root)?;
        let iter = TreeIter::new(
            &self.info,
            &root,
            Key::new(node.ino, INODE_REF_KEY, 0),
            Key::new(node.ino, INODE_EXTREF_KEY, u64::MAX),
        )?;
        let mut out = Vec::new();
        for it in iter {
            let it = it?;
            let k = it.key();
            let refs = if k.ty == INODE_REF_KEY {
                parse_inode_refs(k.offset, it.data())
            } else {
                parse_inode_extrefs(it.data())
            }
            .map_err(|e| Error::corrupt(format!("subvolume {} {k}: {e}", node.root)))?;
            out.extend(refs);
        }
        Ok(out)
    }

    /// Calls `f` with every INODE_ITEM of subvolume `root`, in inode order (one sweep
    /// of the tree), until it returns false.
    pub fn for_each_inode(
        &self,
        root: u64,
        mut f: impl FnMut(u64, &InodeItem) -> Result<bool>,
    ) -> Result<()> {
        let rp = self.root(root)?;
        for it in TreeIter::new(&self.info, &rp, Key::new(0, 0, 0), Key::MAX)? {
            let it = it?;
            let k = it.key();
            if k.ty != INODE_ITEM_KEY {
                continue;
            }
            let i = InodeItem::parse(it.data())
                .map_err(|e| Error::corrupt(format!("subvolume {root} {k}: {e}")))?;
            if !f(k.objectid, &i)? {
                break;
            }
        }
        Ok(())
    }
}

impl Trans {
    pub(crate) fn add_inode_ref(
        &mut self,
        root: u64,
        ino: u64,
        dir: u64,
        index: u64,
        name: &[u8],
    ) -> Result<()> {
        let key = Key::new(ino, INODE_REF_KEY, dir);
        let r = ubtrfs_format::items::inode_ref_bytes(index, name);
        match self.append_to_item(root, &key, &r) {
            Err(Error::NoSpace(_))
                if self.fs.info.sb.incompat_flags & FEATURE_INCOMPAT_EXTENDED_IREF != 0 =>
            {
                let k = Key::new(ino, INODE_EXTREF_KEY, extref_hash(dir, name));
                let e = ubtrfs_format::items::inode_extref_bytes(dir, index, name);
                self.append_to_item(root, &k, &e)
            }
            other => other,
        }
    }

    pub(crate) fn del_inode_ref(
        &mut self,
        root: u64,
        ino: u64,
        dir: u64,
        name: &[u8],
    ) -> Result<u64> {
        let key = Key::new(ino, INODE_REF_KEY, dir);
        let ptr = self.root_ptr(root)?;
        if let Some(it) = lookup_exact(&self.fs.info, &ptr, &key)? {
            let refs = parse_inode_refs(dir, it.data())
                .map_err(|e| Error::corrupt(format!("inode ref {key}: {e}")))?;
            drop(it);
            if let Some(r) = refs.iter().find(|r| r.name == name) {
                let index = r.index;
                self.remove_from_item(root, &key, |d| {
                    let mut pos = 0;
                    while pos + 10 <= d.len() {
                        let nl = u16::from_le_bytes([d[pos + 8], d[pos + 9]]) as usize;
                        let end = pos + 10 + nl;
                        if d.get(pos + 10..end) == Some(name) {
                            return Some((pos, end));
                        }
                        pos = end;
                    }
                    None
                })?;
                return Ok(index);
            }
        }
        let key = Key::new(ino, INODE_EXTREF_KEY, extref_hash(dir, name));
        let ptr = self.root_ptr(root)?;
        if let Some(it) = lookup_exact(&self.fs.info, &ptr, &key)? {
            let refs = parse_inode_extrefs(it.data())
                .map_err(|e| Error::corrupt(format!("inode extref {key}: {e}")))?;
            drop(it);
            if let Some(r) = refs.iter().find(|r| r.name == name && r.parent == dir) {
                let index = r.index;
                self.remove_from_item(root, &key, |d| {
                    let mut pos = 0;
                    while pos + 18 <= d.len() {
                        let parent =
                            u64::from_le_bytes(d[pos..pos + 8].try_into().unwrap_or([0; 8]));
                        let nl = u16::from_le_bytes([d[pos + 16], d[pos + 17]]) as usize;
                        let end = pos + 18 + nl;
                        if parent == dir && d.get(pos + 18..end) == Some(name) {
                            return Some((pos, end));
                        }
                        pos = end;
                    }
                    None
                })?;
                return Ok(index);
            }
        }
        Err(Error::corrupt(format!(
            "inode {ino} has no reference named {:?} in {dir}",
            String::from_utf8_lossy(name)
        )))
    }
}
