//! The free-space tree (tree 10): per block group a FREE_SPACE_INFO item (extent count,
//! flags) and either FREE_SPACE_EXTENT items (one per free range) or FREE_SPACE_BITMAP
//! items (one bit per sector, 2048 sectors per item). Read lazily when the allocator
//! first needs a block group; rewritten at commit for dirty block groups by diffing the
//! wanted items against the stored ones, so an unchanged group costs one search.

use crate::alloc::block_group::{FREE_SPACE_BITMAP_BITS, FREE_SPACE_USING_BITMAPS};
use crate::error::Result;
use crate::transaction::Trans;
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

impl Trans {
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
