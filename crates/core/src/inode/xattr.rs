//! Extended attributes (XATTR_ITEM, keyed by name hash). ACLs are ordinary xattrs
//! (system.posix_acl_access / _default) and are returned raw.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node};
use crate::tree::ctree::{lookup_exact, TreeIter};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::parse_dir_items;
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
