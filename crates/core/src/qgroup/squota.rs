//! Simple quotas recounted: the bytes each subvolume owns, from one pass over the
//! extent tree (what `btrfs check --qgroup-report` computes in simple mode). An
//! extent counts when it was made in transaction `enable_gen` or later, for the
//! subvolume in its inline EXTENT_OWNER_REF (data) or its header's owner (tree
//! blocks); other trees own nothing. The engine never needs this (it charges as it
//! goes, transaction/quota.rs); `ubtrfs check` compares the quota tree with it.

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::qgroup::is_fs_tree;
use crate::tree::ctree::TreeIter;
use crate::tree::tree_checker::Expect;
use std::collections::BTreeMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{parse_item, InlineRef, Item};
use ubtrfs_format::key::Key;

/// Simple quotas' recount: bytes owned per subvolume (extents of transaction
/// `enable_gen` and later).
pub fn owned_bytes(fs: &FsInfo, enable_gen: u64) -> Result<BTreeMap<u64, u64>> {
    let mut out: BTreeMap<u64, u64> = BTreeMap::new();
    let Some(ptr) = fs.tree_ptr(EXTENT_TREE_OBJECTID) else {
        return Ok(out);
    };
    let nodesize = fs.nodesize as u64;
    for item in TreeIter::new(fs, &ptr, Key::MIN, Key::MAX)? {
        let item = item?;
        let k = item.key();
        if k.ty != EXTENT_ITEM_KEY && k.ty != METADATA_ITEM_KEY {
            continue;
        }
        let bad = |e| Error::corrupt(format!("extent tree item {k}: {e}"));
        let ext = match parse_item(&k, item.data()).map_err(bad)? {
            Item::Extent(e) => e,
            _ => continue,
        };
        if ext.generation < enable_gen {
            continue;
        }
        let (owner, bytes) = if ext.flags & EXTENT_FLAG_DATA != 0 {
            match ext.inline_refs.first() {
                Some(InlineRef::Owner { root }) => (*root, k.offset),
                _ => continue,
            }
        } else {
            let blk = fs.read_tree_block(k.objectid, &Expect::default())?;
            (blk.owner(), nodesize)
        };
        if is_fs_tree(owner) {
            *out.entry(owner).or_insert(0) += bytes;
        }
    }
    Ok(out)
}
