//! statfs(2) numbers as the kernel's btrfs_statfs reports them for a filesystem
//! just mounted (what `df` and `btrfs filesystem usage`'s "Free (statfs, df)" show).
//!
//! The kernel derives them from its in-memory space accounting, which on a freshly
//! mounted filesystem is exactly what the block group items, the device items and a
//! few root items say:
//!
//! * `f_blocks`: the superblock's total_bytes divided by the data profile's copy
//!   count ("factor"), in sectors.
//! * `f_bfree`: f_blocks minus every block group's used bytes (times its own copy
//!   count, divided by the data factor), minus the global block reserve
//!   ([`super::space_info::global_reserve`]).
//! * `f_bavail`: free space inside writable data block groups plus the data that
//!   still fits in unallocated device space (each device less its first MiB,
//!   rounded down to 64 KiB stripes, filled the way the chunk allocator would),
//!   over the factor. A block group whose chunk sits on a read-only device is
//!   read-only: on a read-only loop mount (`mount -o loop,ro`, no writable device)
//!   only the unallocated part counts, and the profile new chunks would get is
//!   reduced to SINGLE.
//! * `f_files`/`f_ffree` are 0 (btrfs has no inode table); `f_namelen` 255;
//!   `f_bsize` = `f_frsize` = the sector size.
//!
//! Known gaps: `f_type` and `f_fsid` are the caller's (FUSE fills in its own). The
//! metadata-exhausted clamp (f_bavail = 0 when metadata space is full and no chunk
//! can be allocated) is not modelled, nor block groups the kernel holds read-only
//! in the middle of a balance.

use super::space_info::{global_reserve, space_infos};
use crate::alloc::block_group::{raid, reduce_profile, Raid, MIRRORED};
use crate::error::Result;
use crate::fs::Filesystem;
use ubtrfs_format::consts::*;

/// What statfs(2) answers, in its units (blocks of `frsize` bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// f_blocks: the size, over the data profile's copies.
    pub blocks: u64,
    /// f_bfree: blocks not used, less the global reserve.
    pub bfree: u64,
    /// f_bavail: blocks new data could still take.
    pub bavail: u64,
    /// f_files: 0 (no inode table).
    pub files: u64,
    /// f_ffree: 0.
    pub ffree: u64,
    /// f_bsize: the sector size.
    pub bsize: u32,
    /// f_namelen: 255.
    pub namelen: u32,
    /// f_frsize: the sector size.
    pub frsize: u32,
}

const STRIPE_LEN: u64 = 64 << 10;
const DEVICE_RANGE_RESERVED: u64 = 1 << 20;

#[derive(Default)]
struct Space {
    flags: u64,
    disk_total: u64,
    disk_used: u64,
    /// Highest raid index seen among its block groups, and that profile's copies.
    top_raid: Option<(u8, u64)>,
    /// Profiles of its block groups.
    profiles: u64,
    /// Free bytes in its SINGLE and RAID0 block groups (read-only once the type
    /// allocates mirrored chunks, see below).
    unmirrored_free: u64,
}

/// The numbers a fresh mount shows whose `writable_devices` devices are writable:
/// 0 for a read-only loop mount, every open device for a read-write mount.
pub fn statfs(fs: &Filesystem, writable_devices: usize) -> Result<StatFs> {
    let info = &fs.info;
    let sb = &info.sb;
    let ss = info.sectorsize as u64;
    let bits = ss.trailing_zeros();
    // One space per type combination (mixed groups are DATA|METADATA), summed over
    // the profiles of its block groups.
    let mut spaces: Vec<Space> = Vec::new();
    let mut data_profiles = 0u64;
    for si in space_infos(fs)? {
        let r = raid(si.profile);
        if si.ty & BLOCK_GROUP_DATA != 0 {
            data_profiles |= si.profile;
        }
        let s = match spaces.iter().position(|s| s.flags == si.ty) {
            Some(i) => &mut spaces[i],
            None => {
                spaces.push(Space {
                    flags: si.ty,
                    ..Default::default()
                });
                let n = spaces.len() - 1;
                &mut spaces[n]
            }
        };
        // Sums of on-disk numbers: a hostile image must not overflow them.
        s.disk_total = s
            .disk_total
            .saturating_add(si.total_bytes.saturating_mul(r.ncopies));
        s.disk_used = s
            .disk_used
            .saturating_add(si.used_bytes.saturating_mul(r.ncopies));
        if s.top_raid.is_none_or(|(i, _)| r.index > i) {
            s.top_raid = Some((r.index, r.ncopies));
        }
        s.profiles |= si.profile;
        if si.profile & !BLOCK_GROUP_RAID0 == 0 {
            s.unmirrored_free = s
                .unmirrored_free
                .saturating_add(si.total_bytes.saturating_sub(si.used_bytes));
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
                let mut free = s.disk_total.saturating_sub(s.disk_used);
                // At mount the kernel makes a type's SINGLE and RAID0 block groups
                // read-only when it allocates mirrored chunks for that type (left
                // over from a conversion: btrfs_read_block_groups, so that nothing
                // new lands unmirrored), and their free space is not available.
                if reduce_profile(s.profiles, writable_devices) & MIRRORED != 0 {
                    free = free.saturating_sub(s.unmirrored_free);
                }
                total_free_data = total_free_data.saturating_add(free);
            }
            if let Some((_, f)) = s.top_raid {
                factor = f;
            }
        }
        total_used = total_used.saturating_add(s.disk_used);
    }
    let blocks = (sb.total_bytes / factor) >> bits;
    let mut bfree = blocks.saturating_sub((total_used / factor) >> bits);
    bfree = bfree.saturating_sub(global_reserve(fs)?.total_bytes >> bits);
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

/// Data that new chunks could still hold in unallocated device space.
fn avail_data_space(fs: &Filesystem, data_profiles: u64, writable_devices: usize) -> Result<u64> {
    let info = &fs.info;
    // The kernel reduces the data profile to those possible with the number of
    // writable devices: with none, SINGLE.
    let profile = reduce_profile(data_profiles, writable_devices);
    let r: Raid = raid(profile & BLOCK_GROUP_PROFILE_MASK);
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
