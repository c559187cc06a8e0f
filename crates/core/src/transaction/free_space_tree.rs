//! The free-space tree (tree 10): per block group a FREE_SPACE_INFO item (extent count,
//! flags) and either FREE_SPACE_EXTENT items (one per free range) or FREE_SPACE_BITMAP
//! items (one bit per sector, 2048 sectors per item). Read lazily when the allocator
//! first needs a block group; rewritten at commit for dirty block groups by diffing the
//! wanted items against the stored ones, so an unchanged group costs one search.
//!
//! Also creating the tree for a filesystem that kept the v1 space cache, and rebuilding
//! it ([`Trans::finish_free_space_tree`], the kernel's btrfs_create_free_space_tree and
//! btrfs_rebuild_free_space_tree at mount).

use crate::alloc::block_group::{FREE_SPACE_BITMAP_BITS, FREE_SPACE_USING_BITMAPS};
use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::ctree::TreeIter;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{FileExtentBody, FileExtentItem};
use ubtrfs_format::key::Key;

impl Trans {
    /// Completes what the open began when asked to create or rebuild the free-space
    /// tree (`FreeSpaceTreeAction`; every block group's free space was then worked
    /// out from the extent tree): removes the v1 space cache, creates tree 10 if
    /// there is none, marks every block group for writing, sets FREE_SPACE_TREE and
    /// FREE_SPACE_TREE_VALID and cache_generation 0 (no v1 cache), and commits, as
    /// the kernel's mount with `space_cache=v2` or `clear_cache` and btrfstune
    /// --convert-to-free-space-tree leave it. Runs after a log replay, whose
    /// blocks are in no extent tree and must not be allocated over.
    pub(crate) fn finish_free_space_tree(&mut self) -> Result<()> {
        if !self.fst_rebuild_pending {
            return Ok(());
        }
        self.remove_v1_space_cache()?;
        match self.fs.info.tree_ptr(FREE_SPACE_TREE_OBJECTID) {
            None => self.create_tree(FREE_SPACE_TREE_OBJECTID)?,
            // Rebuilding: items of no block group (left by a removed group, or
            // damage) go too, as the kernel empties the tree first; the groups'
            // own items are rewritten by the commit's diff.
            Some(ptr) => {
                let mut stray = Vec::new();
                for item in TreeIter::new(&self.fs.info, &ptr, Key::MIN, Key::MAX)? {
                    let k = item?.key();
                    let group = self.alloc.bgs.range(..=k.objectid).next_back();
                    if !group.is_some_and(|(_, b)| b.contains(k.objectid)) {
                        stray.push(k);
                    }
                }
                for k in stray {
                    self.delete_item(FREE_SPACE_TREE_OBJECTID, &k)?;
                }
            }
        }
        let sb = &mut self.fs.info.sb;
        sb.compat_ro_flags |=
            FEATURE_COMPAT_RO_FREE_SPACE_TREE | FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID;
        sb.cache_generation = 0;
        for b in self.alloc.bgs.values_mut() {
            b.dirty = true;
        }
        self.commit()?;
        self.fst_rebuild_pending = false;
        Ok(())
    }

    /// Deletes the v1 space cache from the root tree: per block group a header item
    /// (FREE_SPACE_OBJECTID, 0, group start) naming a hidden inode whose preallocated
    /// data holds the cache; the inode's items go, and its data extents lose their
    /// reference (freed by the delayed refs), as the kernel's
    /// cleanup_free_space_cache_v1. Returns how many caches there were.
    fn remove_v1_space_cache(&mut self) -> Result<u64> {
        let rt = self.root_ptr(ROOT_TREE_OBJECTID)?;
        let mut headers = Vec::new();
        for item in TreeIter::new(
            &self.fs.info,
            &rt,
            Key::new(FREE_SPACE_OBJECTID, 0, 0),
            Key::new(FREE_SPACE_OBJECTID, 0, u64::MAX),
        )? {
            let item = item?;
            let (k, d) = (item.key(), item.data());
            // struct btrfs_free_space_header: location (a disk key), generation,
            // num_entries, num_bitmaps.
            let ino = d
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                .filter(|&i| (FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&i))
                .ok_or_else(|| Error::corrupt(format!("root tree {k}: bad space cache header")))?;
            headers.push((k, ino));
        }
        let count = headers.len() as u64;
        for (header, ino) in headers {
            self.delete_item(ROOT_TREE_OBJECTID, &header)?;
            let rt = self.root_ptr(ROOT_TREE_OBJECTID)?;
            let mut keys = Vec::new();
            let mut refs = Vec::new();
            for item in TreeIter::new(
                &self.fs.info,
                &rt,
                Key::new(ino, 0, 0),
                Key::new(ino, u8::MAX, u64::MAX),
            )? {
                let item = item?;
                let k = item.key();
                match k.ty {
                    INODE_ITEM_KEY | INODE_REF_KEY | XATTR_ITEM_KEY => {}
                    EXTENT_DATA_KEY => {
                        let fe = FileExtentItem::parse(item.data())
                            .map_err(|e| Error::corrupt(format!("root tree {k}: {e}")))?;
                        if let FileExtentBody::Regular {
                            disk_bytenr,
                            disk_num_bytes,
                            offset,
                            ..
                        } = fe.body
                        {
                            if disk_bytenr != 0 {
                                let at = k.offset.wrapping_sub(offset);
                                refs.push((disk_bytenr, disk_num_bytes, at));
                            }
                        }
                    }
                    // Anything else with this objectid (a subvolume's ROOT_ITEM would
                    // be one) is not the cache's.
                    _ => continue,
                }
                keys.push(k);
            }
            for k in keys {
                self.delete_item(ROOT_TREE_OBJECTID, &k)?;
            }
            for (bytenr, len, at) in refs {
                self.add_data_ref(bytenr, len, ROOT_TREE_OBJECTID, ino, at, -1);
            }
        }
        Ok(count)
    }

    /// Rewrites the free-space tree of dirty block groups; returns whether anything
    /// changed (more CoW, so the commit loop must run again).
    pub(crate) fn write_free_space_tree(&mut self) -> Result<bool> {
        let has_fst = self.fs.info.sb.compat_ro_flags & FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0;
        let dirty: Vec<u64> = self
            .alloc
            .bgs
            .values()
            .filter(|b| b.dirty)
            .map(|b| b.start)
            .collect();
        let mut changed = false;
        for start in dirty {
            if !has_fst {
                if let Some(b) = self.alloc.bgs.get_mut(&start) {
                    b.dirty = false;
                }
                continue;
            }
            let (length, ranges, was_bitmaps, thresholds) = {
                let b = &self.alloc.bgs[&start];
                (
                    b.length,
                    b.fst_free.iter().collect::<Vec<_>>(),
                    b.fst_bitmaps,
                    b.bitmap_thresholds(self.fs.info.sectorsize),
                )
            };
            let count = ranges.len() as u64;
            let bitmaps = if was_bitmaps {
                count >= thresholds.1
            } else {
                count > thresholds.0
            };
            let want = self.fst_wanted(start, length, &ranges, bitmaps);
            let have = crate::alloc::free_space_tree::fst_items(&self.fs.info, start, length)?;
            changed |= self.apply_diff(FREE_SPACE_TREE_OBJECTID, &have, &want)?;
            if let Some(b) = self.alloc.bgs.get_mut(&start) {
                b.fst_bitmaps = bitmaps;
                b.dirty = false;
            }
        }
        Ok(changed)
    }

    fn fst_wanted(
        &self,
        start: u64,
        length: u64,
        ranges: &[(u64, u64)],
        bitmaps: bool,
    ) -> Vec<(Key, Vec<u8>)> {
        let mut out = Vec::new();
        let mut info = Vec::with_capacity(8);
        info.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
        info.extend_from_slice(&(if bitmaps { FREE_SPACE_USING_BITMAPS } else { 0 }).to_le_bytes());
        out.push((Key::new(start, FREE_SPACE_INFO_KEY, length), info));
        if !bitmaps {
            for &(s, l) in ranges {
                out.push((Key::new(s, FREE_SPACE_EXTENT_KEY, l), Vec::new()));
            }
            return out;
        }
        let ss = self.fs.info.sectorsize as u64;
        let range = ss * FREE_SPACE_BITMAP_BITS;
        let end = start + length;
        let mut pos = start;
        let mut ri = 0usize;
        while pos < end {
            let len = range.min(end - pos);
            let bits = len / ss;
            let mut bm = vec![0u8; bits.div_ceil(8) as usize];
            while ri < ranges.len() && ranges[ri].0 + ranges[ri].1 <= pos {
                ri += 1;
            }
            let mut j = ri;
            while j < ranges.len() && ranges[j].0 < pos + len {
                let s = ranges[j].0.max(pos);
                let e = (ranges[j].0 + ranges[j].1).min(pos + len);
                for bit in (s - pos) / ss..(e - pos) / ss {
                    bm[(bit / 8) as usize] |= 1 << (bit % 8);
                }
                j += 1;
            }
            out.push((Key::new(pos, FREE_SPACE_BITMAP_KEY, len), bm));
            pos += len;
        }
        out
    }

    /// Makes the items of `tree` in a key range equal `want`, given they are `have`
    /// (both sorted): deletes, inserts and rewrites only what differs.
    pub(crate) fn apply_diff(
        &mut self,
        tree: u64,
        have: &[(Key, Vec<u8>)],
        want: &[(Key, Vec<u8>)],
    ) -> Result<bool> {
        let mut changed = false;
        let (mut i, mut j) = (0, 0);
        while i < have.len() || j < want.len() {
            let ord = match (have.get(i), want.get(j)) {
                (Some(h), Some(w)) => h.0.cmp(&w.0),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match ord {
                std::cmp::Ordering::Less => {
                    self.delete_item(tree, &have[i].0)?;
                    changed = true;
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    self.insert_item(tree, &want[j].0, &want[j].1)?;
                    changed = true;
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    if have[i].1 != want[j].1 {
                        self.replace_item(tree, &want[j].0, &want[j].1)?;
                        changed = true;
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        Ok(changed)
    }
}
