//! Extended attributes (XATTR_ITEM, keyed by name hash). ACLs are ordinary xattrs
//! (system.posix_acl_access / _default) and are returned raw.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node};
use crate::inode::props::XATTR_BTRFS_PREFIX;
use crate::transaction::Trans;
use crate::tree::ctree::{lookup_exact, TreeIter};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::{parse_dir_items, Timespec};
use ubtrfs_format::key::Key;

impl Filesystem {
    /// All xattrs (name, value) in the order listxattr(2) gives them.
    pub fn xattrs(&self, node: Node) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if node.is_placeholder() {
            return Ok(vec![]);
        }
        let root = self.root(node.root)?;
        let mut out = Vec::new();
        let iter = TreeIter::new(
            &self.info,
            &root,
            Key::new(node.ino, XATTR_ITEM_KEY, 0),
            Key::new(node.ino, XATTR_ITEM_KEY, u64::MAX),
        )?;
        for it in iter {
            let it = it?;
            let items = parse_dir_items(it.data()).map_err(|e| {
                Error::corrupt(format!("subvolume {} {}: {e}", node.root, it.key()))
            })?;
            out.extend(items.into_iter().map(|d| (d.name, d.data)));
        }
        Ok(out)
    }

    /// One extended attribute's value, `None` if it is not set.
    pub fn getxattr(&self, node: Node, name: &[u8]) -> Result<Option<Vec<u8>>> {
        if node.is_placeholder() {
            return Ok(None);
        }
        let root = self.root(node.root)?;
        let key = Key::new(node.ino, XATTR_ITEM_KEY, name_hash(name));
        let Some(it) = lookup_exact(&self.info, &root, &key)? else {
            return Ok(None);
        };
        let items = parse_dir_items(it.data())
            .map_err(|e| Error::corrupt(format!("subvolume {} {key}: {e}", node.root)))?;
        Ok(items.into_iter().find(|d| d.name == name).map(|d| d.data))
    }
}

impl Trans {
    /// Sets an extended attribute (replacing a previous value). Names in the
    /// `btrfs.` namespace are properties ([`Trans::set_prop`]).
    pub fn set_xattr(
        &mut self,
        root: u64,
        ino: u64,
        name: &[u8],
        value: &[u8],
        t: Timespec,
    ) -> Result<()> {
        if name.is_empty() || name.len() > NAME_LEN_MAX {
            return Err(Error::Invalid("xattr name".into()));
        }
        if name.starts_with(XATTR_BTRFS_PREFIX) {
            return self.set_prop(root, ino, name, Some(value), false, t);
        }
        // The kernel accepts only these namespaces.
        let known = [&b"user."[..], b"trusted.", b"security."];
        let acl = name == b"system.posix_acl_access" || name == b"system.posix_acl_default";
        if !acl
            && !known
                .iter()
                .any(|p| name.starts_with(p) && name.len() > p.len())
        {
            return Err(Error::Unsupported(format!(
                "xattr name {:?} (namespaces: user., trusted., security., system.posix_acl_*, btrfs.)",
                String::from_utf8_lossy(name)
            )));
        }
        self.set_xattr_raw(root, ino, name, value)?;
        let mut i = self.read_inode(root, ino)?;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)
    }

    /// Stores an xattr item (replacing a previous value), leaving the inode alone.
    pub(crate) fn set_xattr_raw(
        &mut self,
        root: u64,
        ino: u64,
        name: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let entry_len = 30 + name.len() + value.len();
        if entry_len > self.max_item_size() {
            // Checked before any change, so the mount goes on (fstests generic/020
            // sets a 64 KiB value, which FUSE allows and btrfs' leaves do not).
            return Err(Error::TooLarge(format!(
                "xattr value of {} bytes exceeds the item size limit",
                value.len()
            )));
        }
        let key = Key::new(ino, XATTR_ITEM_KEY, name_hash(name));
        // Names with the same hash share the item: when the new value cannot fit
        // beside the others, fail before the old value goes (the kernel keeps the
        // old value too: a replace is atomic, btrfs_setxattr).
        let ptr = self.root_ptr(root)?;
        if let Some(it) = crate::tree::ctree::lookup_exact(&self.fs.info, &ptr, &key)? {
            let d = it.data();
            let old = crate::inode::dir_item::dir_entry_span(d, name).map_or(0, |(a, b)| b - a);
            if d.len() - old + entry_len > self.max_item_size() {
                return Err(Error::NoSpace(format!(
                    "item {key} is full (xattrs whose names share a hash)"
                )));
            }
        }
        self.remove_xattr_entry(root, ino, name)?;
        let e = ubtrfs_format::items::dir_item_bytes(
            &Key::new(0, 0, 0),
            self.transid,
            value,
            name,
            FT_XATTR,
        );
        self.append_to_item(root, &key, &e)
    }

    /// Removes an extended attribute (ENODATA as [`Error::NotFound`] if absent).
    pub fn remove_xattr(&mut self, root: u64, ino: u64, name: &[u8], t: Timespec) -> Result<()> {
        if name.starts_with(XATTR_BTRFS_PREFIX) {
            return self.set_prop(root, ino, name, None, true, t);
        }
        if !self.remove_xattr_entry(root, ino, name)? {
            return Err(Error::NotFound(format!(
                "xattr {}",
                String::from_utf8_lossy(name)
            )));
        }
        let mut i = self.read_inode(root, ino)?;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)
    }

    pub(crate) fn remove_xattr_entry(&mut self, root: u64, ino: u64, name: &[u8]) -> Result<bool> {
        let key = Key::new(ino, XATTR_ITEM_KEY, name_hash(name));
        self.remove_from_item(root, &key, |d| {
            crate::inode::dir_item::dir_entry_span(d, name)
        })
    }
}
