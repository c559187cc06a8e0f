//! The free-space tree (tree 10), read: the free ranges of one block group, from
//! FREE_SPACE_EXTENT or FREE_SPACE_BITMAP items. Read lazily when the allocator first
//! needs a block group; `transaction::free_space_tree` writes the tree at commit.
//! Without a free-space tree to trust (creating or rebuilding one), the free ranges
//! come from the extent tree instead ([`extent_tree_free_ranges`]).

use crate::alloc::block_group::FREE_SPACE_USING_BITMAPS;
use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::tree::ctree::TreeIter;
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

/// Why a filesystem without a free-space tree is not written, and what to do.
pub(crate) const NO_FREE_SPACE_TREE: &str = "writing needs the free-space tree \
     (space_cache=v2, the mkfs default since btrfs-progs 5.15); this filesystem keeps \
     the v1 space cache: convert it with `ubtrfs tune --convert-to-free-space-tree \
     IMAGE` or by mounting with `-o space_cache=v2` (as the kernel does)";

pub(crate) fn fst_items(fs: &FsInfo, start: u64, length: u64) -> Result<Vec<(Key, Vec<u8>)>> {
    let ptr = fs
        .tree_ptr(FREE_SPACE_TREE_OBJECTID)
        .ok_or_else(|| Error::corrupt("the free-space tree has no root item"))?;
    let mut out = Vec::new();
    let it = TreeIter::new(
        fs,
        &ptr,
        Key::new(start, FREE_SPACE_INFO_KEY, 0),
        Key::new(start + length, 0, 0),
    )?;
    for item in it {
        let item = item?;
        out.push((item.key(), item.data().to_vec()));
    }
    Ok(out)
}

/// Free ranges of a block group per the free-space tree, and whether it is stored
/// as bitmaps.
pub(crate) fn read_fst_ranges(
    fs: &FsInfo,
    start: u64,
    length: u64,
) -> Result<(Vec<(u64, u64)>, bool)> {
    if fs.sb.compat_ro_flags & FEATURE_COMPAT_RO_FREE_SPACE_TREE == 0 {
        return Err(Error::Unsupported(NO_FREE_SPACE_TREE.into()));
    }
    let items = fst_items(fs, start, length)?;
    let bad = |m: String| Error::corrupt(format!("free space tree, block group {start}: {m}"));
    let Some((k0, info)) = items.first() else {
        return Err(bad("no FREE_SPACE_INFO item".into()));
    };
    if k0.ty != FREE_SPACE_INFO_KEY || k0.objectid != start || k0.offset != length || info.len() < 8
    {
        return Err(bad(format!("expected FREE_SPACE_INFO first, found {k0}")));
    }
    let flags = u32::from_le_bytes([info[4], info[5], info[6], info[7]]);
    let bitmaps = flags & FREE_SPACE_USING_BITMAPS != 0;
    let ss = fs.sectorsize as u64;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let push = |s: u64, l: u64, ranges: &mut Vec<(u64, u64)>| {
        if let Some(last) = ranges.last_mut() {
            if last.0 + last.1 == s {
                last.1 += l;
                return;
            }
        }
        ranges.push((s, l));
    };
    for (k, data) in &items[1..] {
        if k.objectid < start || k.objectid + k.offset > start + length {
            return Err(bad(format!("item {k} outside the block group")));
        }
        match k.ty {
            FREE_SPACE_EXTENT_KEY => push(k.objectid, k.offset, &mut ranges),
            FREE_SPACE_BITMAP_KEY => {
                let bits = k.offset / ss;
                if (data.len() as u64) * 8 < bits {
                    return Err(bad(format!("bitmap {k} too short")));
                }
                let mut run: Option<u64> = None;
                for i in 0..bits {
                    let set = data[(i / 8) as usize] & (1 << (i % 8)) != 0;
                    match (set, run) {
                        (true, None) => run = Some(i),
                        (false, Some(r)) => {
                            push(k.objectid + r * ss, (i - r) * ss, &mut ranges);
                            run = None;
                        }
                        _ => {}
                    }
                }
                if let Some(r) = run {
                    push(k.objectid + r * ss, (bits - r) * ss, &mut ranges);
                }
            }
            _ => return Err(bad(format!("unexpected item {k}"))),
        }
    }
    Ok((ranges, bitmaps))
}

/// The largest data extent the kernel makes (BTRFS_MAX_EXTENT_SIZE).
const MAX_DATA_EXTENT_BYTES: u64 = 128 << 20;

/// Free ranges of a block group per the extent tree: the group minus its EXTENT_ITEM
/// and METADATA_ITEM ranges, what the kernel's populate_free_space_tree stores when
/// it creates the free-space tree (superblock copies, which are no extents, are in
/// it). Read from the tree as `fs` has it, so only before anything is allocated.
pub(crate) fn extent_tree_free_ranges(
    fs: &FsInfo,
    start: u64,
    length: u64,
) -> Result<Vec<(u64, u64)>> {
    let ptr = fs
        .tree_ptr(EXTENT_TREE_OBJECTID)
        .ok_or_else(|| Error::corrupt("the extent tree has no root item"))?;
    let end = start + length;
    let bad = |m: String| Error::corrupt(format!("extent tree, block group {start}: {m}"));
    let mut free = Vec::new();
    let mut pos = start;
    // An extent starting below the group must end there too: look at those that
    // could reach it (a data extent is at most 128 MiB).
    let back = start.saturating_sub(MAX_DATA_EXTENT_BYTES);
    for item in TreeIter::new(fs, &ptr, Key::new(back, 0, 0), Key::new(start, 0, 0))? {
        let k = item?.key();
        let len = match k.ty {
            EXTENT_ITEM_KEY => k.offset,
            METADATA_ITEM_KEY => fs.nodesize as u64,
            _ => continue,
        };
        if k.objectid < start && k.objectid.saturating_add(len) > start {
            return Err(bad(format!("extent {k} runs into the group")));
        }
    }
    for item in TreeIter::new(
        fs,
        &ptr,
        Key::new(start, 0, 0),
        Key::new(end - 1, u8::MAX, u64::MAX),
    )? {
        let k = item?.key();
        let len = match k.ty {
            EXTENT_ITEM_KEY => k.offset,
            METADATA_ITEM_KEY => fs.nodesize as u64,
            _ => continue,
        };
        let e = k.objectid.checked_add(len).filter(|&e| e <= end && len > 0);
        let Some(e) = e else {
            return Err(bad(format!("extent {k} does not fit in the group")));
        };
        if k.objectid < pos {
            return Err(bad(format!("extent {k} overlaps the one before")));
        }
        if k.objectid > pos {
            free.push((pos, k.objectid - pos));
        }
        pos = e;
    }
    if pos < end {
        free.push((pos, end - pos));
    }
    Ok(free)
}
