//! statfs(2) numbers as the kernel's btrfs reports them for a read-only mount.
//!
//! The kernel derives them from its in-memory space accounting, which on a freshly
//! mounted filesystem is exactly what the block group items, the device items and a
//! few root items say:
//!
//! * `f_blocks`: the superblock's total_bytes divided by the data profile's copy
//!   count ("factor"), in sectors.
//! * `f_bfree`: f_blocks minus every block group's used bytes (times its own copy
//!   count, divided by the data factor), minus the global block reserve.
//! * `f_bavail`: free space inside writable data block groups plus the data that
//!   still fits in unallocated device space (each device less its first MiB,
//!   rounded down to 64 KiB stripes, filled the way the chunk allocator would),
//!   over the factor. On read-only devices (a `mount -o loop,ro` of an image) every
//!   block group is read-only, so only the unallocated part counts.
//! * `f_files`/`f_ffree` are 0 (btrfs has no inode table); `f_namelen` 255;
//!   `f_bsize` = `f_frsize` = the sector size.
//!
//! The global block reserve is sized from the bytes_used of the extent, checksum,
//! free-space and block-group trees, with a floor of nodesize * 16 per item for
//! the root tree, those trees and an unlink (6), plus the unlink's delayed refs (6,
//! doubled with a free space tree), capped at 512 MiB (matches `btrfs fi df`'s
//! GlobalReserve on every golden image).
//!
//! Known gaps: `f_type` and `f_fsid` are filled in by the FUSE kernel module
//! (FUSE_SUPER_MAGIC, 0), not by us. We model what a read-only loop mount sees (no
//! writable device): a kernel mounting a writable block device with `-o ro` counts
//! the free space inside data block groups too and may use the real data profile
//! for unallocated space, so its f_bavail is larger. The
//! metadata-exhausted clamp (f_bavail = 0 when metadata space is full) never applies
//! to a read-only mount and is not modelled. Block groups the kernel holds
//! read-only (mid-balance) are not subtracted.

use ubtrfs_core::lookup_exact;
use ubtrfs_core::{Filesystem, Result};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::BlockGroupItem;
use ubtrfs_format::key::Key;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Per-profile facts (the kernel's RAID attribute table, as numbers).
struct Raid {
    /// Order of the kernel's raid index (which profile's factor wins when several
    /// exist in one space).
    index: usize,
    ncopies: u64,
    devs_min: usize,
    dev_stripes: u64,
}

fn raid(flags: u64) -> Raid {
    let r = |index, ncopies, devs_min, dev_stripes| Raid {
        index,
        ncopies,
        devs_min,
        dev_stripes,
    };
    match flags & BLOCK_GROUP_PROFILE_MASK {
        BLOCK_GROUP_RAID10 => r(0, 2, 2, 1),
        BLOCK_GROUP_RAID1 => r(1, 2, 2, 1),
        BLOCK_GROUP_DUP => r(2, 2, 1, 2),
        BLOCK_GROUP_RAID0 => r(3, 1, 1, 1),
        BLOCK_GROUP_RAID5 => r(5, 1, 2, 1),
        BLOCK_GROUP_RAID6 => r(6, 1, 3, 1),
        BLOCK_GROUP_RAID1C3 => r(7, 3, 3, 1),
        BLOCK_GROUP_RAID1C4 => r(8, 4, 4, 1),
        _ => r(4, 1, 1, 1),
    }
}

const STRIPE_LEN: u64 = 64 << 10;
const DEVICE_RANGE_RESERVED: u64 = 1 << 20;
const MAX_LEVEL: u64 = 8;
const UNLINK_METADATA_UNITS: u64 = 6;
const GLOBAL_RSV_MAX: u64 = 512 << 20;

#[derive(Default)]
struct Space {
    flags: u64,
    disk_total: u64,
    disk_used: u64,
    /// Highest raid index seen among its block groups, and that profile's copies.
    top_raid: Option<(usize, u64)>,
}

/// The numbers a read-only loop mount of the image shows (no device is writable).
pub(crate) fn compute(fs: &Filesystem) -> Result<StatFs> {
    compute_with(fs, 0)
}

/// The numbers for a mount with `writable_devices` writable devices.
pub(crate) fn compute_with(fs: &Filesystem, writable_devices: usize) -> Result<StatFs> {
    let info = &fs.info;
    let sb = &info.sb;
    let ss = info.sectorsize as u64;
    let bits = ss.trailing_zeros();
    let bg_tree = if sb.compat_ro_flags & FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        info.tree_ptr(BLOCK_GROUP_TREE_OBJECTID)
    } else {
        info.tree_ptr(EXTENT_TREE_OBJECTID)
    };
    // One space per type combination (mixed groups are DATA|METADATA).
    let mut spaces: Vec<Space> = Vec::new();
    let mut data_profiles = 0u64;
    for chunk in info.chunk_map.iter() {
        let (flags, used) = match &bg_tree {
            Some(t) => match lookup_exact(
                info,
                t,
                &Key::new(chunk.start, BLOCK_GROUP_ITEM_KEY, chunk.length),
            )? {
                Some(it) => match BlockGroupItem::parse(it.data()) {
                    Ok(bg) => (bg.flags, bg.used),
                    Err(_) => (chunk.ty, 0),
                },
                None => (chunk.ty, 0),
            },
            None => (chunk.ty, 0),
        };
        let r = raid(flags);
        let ty = flags & BLOCK_GROUP_TYPE_MASK;
        if ty & BLOCK_GROUP_DATA != 0 {
            data_profiles |= flags & BLOCK_GROUP_PROFILE_MASK;
        }
        let s = match spaces.iter_mut().position(|s| s.flags == ty) {
            Some(i) => &mut spaces[i],
            None => {
                spaces.push(Space {
                    flags: ty,
                    ..Default::default()
                });
                let n = spaces.len() - 1;
                &mut spaces[n]
            }
        };
        s.disk_total += chunk.length * r.ncopies;
        s.disk_used += used * r.ncopies;
        if s.top_raid.is_none_or(|(i, _)| r.index > i) {
            s.top_raid = Some((r.index, r.ncopies));
        }
    }
    let mut factor = 1u64;
    let mut total_free_data = 0u64;
    let mut total_used = 0u64;
    for s in &spaces {
        if s.flags & BLOCK_GROUP_DATA != 0 {
            // A block group whose chunk sits on a read-only device is read-only, and
            // the free space of read-only block groups is not available. With no
            // writable device (a read-only loop mount), that is all of it.
            if writable_devices > 0 {
                total_free_data += s.disk_total.saturating_sub(s.disk_used);
            }
            if let Some((_, f)) = s.top_raid {
                factor = f;
            }
        }
        total_used += s.disk_used;
    }
    let blocks = (sb.total_bytes / factor) >> bits;
    let mut bfree = blocks.saturating_sub((total_used / factor) >> bits);
    bfree = bfree.saturating_sub(global_reserve(fs) >> bits);
    let unallocated = avail_data_space(fs, data_profiles, writable_devices)?;
    let bavail = (total_free_data / factor + unallocated / factor) >> bits;
    Ok(StatFs {
        blocks,
        bfree,
        bavail,
        files: 0,
        ffree: 0,
        bsize: info.sectorsize,
        namelen: 255,
        frsize: info.sectorsize,
    })
}

/// Size of the global block reserve right after mount.
fn global_reserve(fs: &Filesystem) -> u64 {
    let info = &fs.info;
    let used = |id| info.tree_roots.get(&id).map(|r| r.bytes_used);
    let mut bytes = 0u64;
    // One for the root tree, one per global tree below.
    let mut items = 1u64;
    for id in [
        EXTENT_TREE_OBJECTID,
        CSUM_TREE_OBJECTID,
        FREE_SPACE_TREE_OBJECTID,
    ] {
        if let Some(u) = used(id) {
            bytes += u;
            items += 1;
        }
    }
    if info.sb.compat_ro_flags & FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        bytes += used(BLOCK_GROUP_TREE_OBJECTID).unwrap_or(0);
        items += 1;
    }
    items += UNLINK_METADATA_UNITS;
    let insert = |n: u64| info.nodesize as u64 * MAX_LEVEL * 2 * n;
    let mut delayed_refs = insert(UNLINK_METADATA_UNITS);
    if info.sb.compat_ro_flags & FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0 {
        delayed_refs *= 2;
    }
    bytes.max(insert(items) + delayed_refs).min(GLOBAL_RSV_MAX)
}

/// Data that new chunks could still hold in unallocated device space.
fn avail_data_space(fs: &Filesystem, data_profiles: u64, writable_devices: usize) -> Result<u64> {
    let info = &fs.info;
    // The kernel reduces the data profile to those possible with the number of
    // writable devices: with none, SINGLE.
    let profile = reduce_profile(data_profiles, writable_devices);
    let r = raid(profile);
    let devs = info.dev_items()?;
    let open = devs
        .iter()
        .filter(|d| info.devices.contains_key(&d.devid))
        .count();
    let mut num_stripes = match profile & BLOCK_GROUP_PROFILE_MASK {
        BLOCK_GROUP_RAID0 => open,
        BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID1C3 | BLOCK_GROUP_RAID1C4 => r.ncopies as usize,
        BLOCK_GROUP_RAID10 => 4,
        _ => 1,
    };
    let min_stripe = r.dev_stripes * STRIPE_LEN;
    let mut avail: Vec<u64> = devs
        .iter()
        .filter(|d| info.devices.contains_key(&d.devid))
        .filter_map(|d| {
            let a = d.total_bytes.saturating_sub(d.bytes_used) / STRIPE_LEN * STRIPE_LEN;
            (a > DEVICE_RANGE_RESERVED + min_stripe).then(|| a - DEVICE_RANGE_RESERVED)
        })
        .collect();
    avail.sort_unstable_by(|a, b| b.cmp(a));
    let mut total = 0u64;
    let mut n = avail.len();
    while n >= r.devs_min.max(1) {
        let i = n - 1;
        num_stripes = num_stripes.min(n);
        if avail[i] >= min_stripe {
            let size = avail[i];
            total += size * num_stripes as u64;
            for a in &mut avail[i + 1 - num_stripes..=i] {
                *a -= size;
            }
        }
        n -= 1;
    }
    Ok(total)
}

/// The profile new chunks get: the most redundant of those present that the number
/// of writable devices allows (SINGLE when none does).
fn reduce_profile(profiles: u64, devices: usize) -> u64 {
    let all = [
        BLOCK_GROUP_RAID10,
        BLOCK_GROUP_RAID1,
        BLOCK_GROUP_DUP,
        BLOCK_GROUP_RAID0,
        BLOCK_GROUP_RAID5,
        BLOCK_GROUP_RAID6,
        BLOCK_GROUP_RAID1C3,
        BLOCK_GROUP_RAID1C4,
    ];
    let allowed: u64 = all
        .iter()
        .filter(|&&p| devices >= raid(p).devs_min)
        .fold(0, |a, p| a | p)
        & profiles;
    for p in [
        BLOCK_GROUP_RAID1C4,
        BLOCK_GROUP_RAID6,
        BLOCK_GROUP_RAID1C3,
        BLOCK_GROUP_RAID5,
        BLOCK_GROUP_RAID10,
        BLOCK_GROUP_RAID1,
        BLOCK_GROUP_DUP,
        BLOCK_GROUP_RAID0,
    ] {
        if allowed & p != 0 {
            return p;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_reduction() {
        assert_eq!(reduce_profile(BLOCK_GROUP_RAID1, 0), 0);
        assert_eq!(reduce_profile(BLOCK_GROUP_RAID1, 2), BLOCK_GROUP_RAID1);
        assert_eq!(
            reduce_profile(BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID6, 4),
            BLOCK_GROUP_RAID6
        );
        assert_eq!(reduce_profile(BLOCK_GROUP_DUP, 1), BLOCK_GROUP_DUP);
    }
}
