//! `filesystem usage`: the numbers `btrfs filesystem usage` prints for a filesystem
//! just mounted read-write by the kernel, worked out from the unmounted filesystem.
//!
//! btrfs-progs builds them from three kernel answers, all of which a fresh mount
//! derives from the trees: the space infos (BTRFS_IOC_SPACE_INFO, here
//! [`space_infos`] and [`global_reserve`]), the chunk items (a TREE_SEARCH of the
//! chunk tree: bytes per block-group flags, device and stripe count), the devices
//! (BTRFS_IOC_DEV_INFO: each device item's size, and the size of the device or file
//! itself, whose excess is "slack"), and statfs(2) ([`statfs`], every device
//! writable). The overall figures are its arithmetic (cmds/filesystem-usage.c),
//! with its types, so that the rounding is the same: ratios and free-space
//! estimates in double precision, the percentage in single precision.

use super::space_info::{global_reserve, space_infos, GlobalReserve, SpaceInfo};
use super::statfs::statfs;
use crate::alloc::block_group::raid;
use crate::error::Result;
use crate::fs::Filesystem;
use ubtrfs_format::consts::*;

/// Below this much unallocated space btrfs-progs does not count it as free.
const MIN_UNALLOCATED_THRESH_BYTES: u64 = 16 << 20;

/// One device as `btrfs filesystem usage` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceUsage {
    /// Device id.
    pub devid: u64,
    /// Its path (the image file or block device opened), `None` when missing.
    pub path: Option<String>,
    /// The filesystem's size on it (the device item's total_bytes).
    pub size_bytes: u64,
    /// The size of the device or file itself (0 when missing).
    pub device_size_bytes: u64,
    /// Bytes of each block-group kind (type and profile bits) on it, as btrfs-progs
    /// counts them (a chunk's length per stripe, over its data stripes for striped
    /// profiles), in the order of [`Usage::spaces`].
    pub allocated: Vec<(u64, u64)>,
    /// `size_bytes` less everything allocated on it (negative if a hostile image
    /// allocates more than the device holds).
    pub unallocated_bytes: i64,
}

/// Everything `btrfs filesystem usage` prints.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    /// Sum of the devices' sizes.
    pub device_size_bytes: u64,
    /// Raw bytes in chunks (each copy counted).
    pub device_allocated_bytes: u64,
    /// Raw bytes in no chunk.
    pub device_unallocated_bytes: i64,
    /// Sum of the sizes of missing devices.
    pub device_missing_bytes: u64,
    /// Device (or file) bytes beyond the filesystem's size on it.
    pub device_slack_bytes: u64,
    /// Raw bytes used (each copy counted).
    pub used_bytes: u64,
    /// Free space estimated with the data profile's ratio.
    pub free_estimated_bytes: u64,
    /// The same with the highest ratio any profile has (what a worst case leaves).
    pub free_min_bytes: u64,
    /// statfs's f_bavail in bytes, as `df` shows it.
    pub free_statfs_bytes: u64,
    /// Raw over logical bytes of data chunks.
    pub data_ratio: f64,
    /// Raw over logical bytes of metadata chunks.
    pub metadata_ratio: f64,
    /// The global reserve.
    pub global_reserve: GlobalReserve,
    /// Block-group types with more than one profile ("data", "metadata",
    /// "data+metadata", "system", comma-separated), empty when none.
    pub multiple_profiles: String,
    /// The space infos in btrfs-progs' order (by type, system last, then profile).
    pub spaces: Vec<SpaceInfo>,
    /// The devices by id.
    pub devices: Vec<DeviceUsage>,
}

/// Chunk bytes of one block-group kind with one stripe count on one device
/// (btrfs-progs' `struct chunk_info`).
struct ChunkInfo {
    flags: u64,
    devid: u64,
    num_stripes: u64,
    bytes: u64,
}

/// Parity stripes of a profile.
fn nparity(flags: u64) -> u64 {
    if flags & BLOCK_GROUP_RAID5 != 0 {
        1
    } else if flags & BLOCK_GROUP_RAID6 != 0 {
        2
    } else {
        0
    }
}

/// A chunk kind's bytes on one device: mirrored profiles keep the whole length on
/// each, striped ones a share (btrfs-progs' calc_chunk_size).
fn on_device_bytes(c: &ChunkInfo) -> u64 {
    let mirrored = BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID1C3 | BLOCK_GROUP_RAID1C4 | BLOCK_GROUP_DUP;
    if c.flags & mirrored != 0 {
        return c.bytes;
    }
    let sub_stripes = if c.flags & BLOCK_GROUP_RAID10 != 0 {
        2
    } else {
        1
    };
    let div = (c.num_stripes.saturating_sub(nparity(c.flags)) / sub_stripes).max(1);
    c.bytes / div
}

/// btrfs-progs' order of block-group kinds: same type by profile bits, system
/// last, other types by their bits.
fn progs_order(a: u64, b: u64) -> std::cmp::Ordering {
    let (ta, tb) = (a & BLOCK_GROUP_TYPE_MASK, b & BLOCK_GROUP_TYPE_MASK);
    if ta == tb {
        (a & BLOCK_GROUP_PROFILE_MASK).cmp(&(b & BLOCK_GROUP_PROFILE_MASK))
    } else if tb & BLOCK_GROUP_SYSTEM != 0 {
        std::cmp::Ordering::Less
    } else if ta & BLOCK_GROUP_SYSTEM != 0 {
        std::cmp::Ordering::Greater
    } else {
        ta.cmp(&tb)
    }
}

/// The chunk tree's chunks summed per (flags, device, stripe count), as
/// btrfs-progs' load_chunk_info does (a DUP chunk counts twice on its device).
fn chunk_infos(fs: &Filesystem) -> Vec<ChunkInfo> {
    let mut out: Vec<ChunkInfo> = Vec::new();
    for chunk in fs.info.chunk_map.iter() {
        let num_stripes = chunk.stripes.len() as u64;
        for s in &chunk.stripes {
            match out
                .iter_mut()
                .find(|c| c.flags == chunk.ty && c.devid == s.devid && c.num_stripes == num_stripes)
            {
                Some(c) => c.bytes = c.bytes.saturating_add(chunk.length),
                None => out.push(ChunkInfo {
                    flags: chunk.ty,
                    devid: s.devid,
                    num_stripes,
                    bytes: chunk.length,
                }),
            }
        }
    }
    out
}

/// The block-group types (DATA, METADATA, DATA|METADATA for mixed groups, SYSTEM,
/// in that order) whose block groups have more than one profile, each with its
/// profiles' lower-case names ("single, dup"), as btrfs-progs lists them when it
/// warns of them (`filesystem df`) or says "Multiple profiles: yes" (`usage`).
pub fn multiple_profiles(spaces: &[SpaceInfo]) -> Vec<(u64, String)> {
    let both = BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA;
    let mut out = Vec::new();
    for ty in [
        BLOCK_GROUP_DATA,
        BLOCK_GROUP_METADATA,
        both,
        BLOCK_GROUP_SYSTEM,
    ] {
        let mine = |s: &&SpaceInfo| {
            if ty == both || s.ty == both {
                s.ty == ty
            } else {
                s.ty & ty != 0
            }
        };
        let profiles = spaces.iter().filter(mine).fold(0u64, |a, s| a | s.profile);
        let single = spaces.iter().filter(mine).any(|s| s.profile == 0);
        if profiles.count_ones() + single as u32 <= 1 {
            continue;
        }
        let mut names: Vec<&str> = Vec::new();
        if single {
            names.push("single");
        }
        // btrfs_raid_array's order, lower-case.
        for (bit, name) in [
            (BLOCK_GROUP_RAID10, "raid10"),
            (BLOCK_GROUP_RAID1, "raid1"),
            (BLOCK_GROUP_DUP, "dup"),
            (BLOCK_GROUP_RAID0, "raid0"),
            (BLOCK_GROUP_RAID5, "raid5"),
            (BLOCK_GROUP_RAID6, "raid6"),
            (BLOCK_GROUP_RAID1C3, "raid1c3"),
            (BLOCK_GROUP_RAID1C4, "raid1c4"),
        ] {
            if profiles & bit != 0 {
                names.push(name);
            }
        }
        out.push((ty, names.join(", ")));
    }
    out
}

/// The numbers of `btrfs filesystem usage` on a fresh read-write mount.
pub fn usage(fs: &Filesystem) -> Result<Usage> {
    let info = &fs.info;
    let mut spaces = space_infos(fs)?;
    spaces.sort_by(|a, b| progs_order(a.ty | a.profile, b.ty | b.profile));
    let reserve = global_reserve(fs)?;
    let chunks = chunk_infos(fs);

    let mut devices = Vec::new();
    for d in info.dev_items()? {
        let dev = info.devices.get(&d.devid);
        let allocated_on = |flags: u64| -> u64 {
            chunks
                .iter()
                .filter(|c| c.devid == d.devid && c.flags == flags)
                .map(on_device_bytes)
                .fold(0u64, u64::saturating_add)
        };
        let allocated: Vec<(u64, u64)> = spaces
            .iter()
            .map(|s| (s.ty | s.profile, allocated_on(s.ty | s.profile)))
            .collect();
        let all: u64 = chunks
            .iter()
            .filter(|c| c.devid == d.devid)
            .map(on_device_bytes)
            .fold(0u64, u64::saturating_add);
        devices.push(DeviceUsage {
            devid: d.devid,
            path: dev.map(|x| x.name()),
            size_bytes: d.total_bytes,
            device_size_bytes: dev.map_or(0, |x| x.size()),
            allocated,
            unallocated_bytes: (d.total_bytes as i64).wrapping_sub(all as i64),
        });
    }
    devices.sort_by_key(|d| d.devid);

    let total_size: u64 = devices
        .iter()
        .map(|d| d.size_bytes)
        .fold(0, u64::saturating_add);
    let slack: u64 = devices
        .iter()
        .map(|d| d.device_size_bytes.saturating_sub(d.size_bytes))
        .fold(0, u64::saturating_add);
    let missing: u64 = devices
        .iter()
        .filter(|d| d.path.is_none())
        .map(|d| d.size_bytes)
        .fold(0, u64::saturating_add);

    // Raw (r_) and logical (l_) bytes per type. RAID5/6 chunks are counted from
    // their chunk infos: raw = length over data stripes, used in proportion.
    let (mut r_data_used, mut r_data_chunks, mut l_data_chunks) = (0u64, 0u64, 0u64);
    let (mut r_meta_used, mut r_meta_chunks, mut l_meta_chunks) = (0u64, 0u64, 0u64);
    let (mut r_sys_used, mut r_sys_chunks) = (0u64, 0u64);
    let mut max_data_ratio = 1.0f64;
    let mut mixed = false;
    let ratio56 = |profile: u64, ty: u64| -> f64 {
        let (used, total) = spaces
            .iter()
            .filter(|s| s.profile & profile != 0 && s.ty & ty != 0)
            .fold((0u64, 0u64), |(u, t), s| {
                (
                    u.saturating_add(s.used_bytes),
                    t.saturating_add(s.total_bytes),
                )
            });
        if total == 0 {
            0.0
        } else {
            used as f64 / total as f64
        }
    };
    for c in &chunks {
        let profile = c.flags & (BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6);
        if profile == 0 {
            continue;
        }
        let data_stripes = c.num_stripes.saturating_sub(nparity(c.flags)).max(1);
        let rt = c.num_stripes as f64 / data_stripes as f64;
        if rt > max_data_ratio {
            max_data_ratio = rt;
        }
        let size = c.bytes / data_stripes;
        let (chunks_acc, used_acc, ty) = if c.flags & BLOCK_GROUP_DATA != 0 {
            (&mut r_data_chunks, &mut r_data_used, BLOCK_GROUP_DATA)
        } else if c.flags & BLOCK_GROUP_METADATA != 0 {
            (&mut r_meta_chunks, &mut r_meta_used, BLOCK_GROUP_METADATA)
        } else {
            (&mut r_sys_chunks, &mut r_sys_used, BLOCK_GROUP_SYSTEM)
        };
        *chunks_acc = chunks_acc.saturating_add(size);
        *used_acc = used_acc.saturating_add((size as f64 * ratio56(profile, ty)) as u64);
    }
    for s in &spaces {
        let ratio = if s.profile & (BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6) != 0 {
            0
        } else {
            raid(s.profile).ncopies
        };
        if ratio as f64 > max_data_ratio {
            max_data_ratio = ratio as f64;
        }
        if s.ty == BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA {
            mixed = true;
        }
        let raw = |b: u64| b.saturating_mul(ratio);
        if s.ty & BLOCK_GROUP_DATA != 0 {
            r_data_used = r_data_used.saturating_add(raw(s.used_bytes));
            r_data_chunks = r_data_chunks.saturating_add(raw(s.total_bytes));
            l_data_chunks = l_data_chunks.saturating_add(s.total_bytes);
        }
        if s.ty & BLOCK_GROUP_METADATA != 0 {
            r_meta_used = r_meta_used.saturating_add(raw(s.used_bytes));
            r_meta_chunks = r_meta_chunks.saturating_add(raw(s.total_bytes));
            l_meta_chunks = l_meta_chunks.saturating_add(s.total_bytes);
        }
        if s.ty & BLOCK_GROUP_SYSTEM != 0 {
            r_sys_used = r_sys_used.saturating_add(raw(s.used_bytes));
            r_sys_chunks = r_sys_chunks.saturating_add(raw(s.total_bytes));
        }
    }
    let mut r_total_chunks = r_data_chunks.saturating_add(r_sys_chunks);
    let mut r_total_used = r_data_used.saturating_add(r_sys_used);
    if !mixed {
        r_total_chunks = r_total_chunks.saturating_add(r_meta_chunks);
        r_total_used = r_total_used.saturating_add(r_meta_used);
    }
    let r_total_unused = (total_size as i64).wrapping_sub(r_total_chunks as i64);
    // btrfs-progs divides by these as doubles: NaN when a type has no chunk, which
    // it prints as "-nan"; a filesystem always has data and metadata chunks.
    let data_ratio = r_data_chunks as f64 / l_data_chunks as f64;
    let metadata_ratio = if mixed {
        data_ratio
    } else {
        r_meta_chunks as f64 / l_meta_chunks as f64
    };
    let mut free_estimated = (r_data_chunks.saturating_sub(r_data_used) as f64 / data_ratio) as u64;
    if mixed {
        free_estimated =
            free_estimated.saturating_sub(reserve.total_bytes.saturating_sub(reserve.used_bytes));
    }
    let mut free_min = free_estimated;
    if r_total_unused >= MIN_UNALLOCATED_THRESH_BYTES as i64 {
        let unused = r_total_unused as u64 as f64;
        free_estimated = (free_estimated as f64 + unused / data_ratio) as u64;
        free_min = (free_min as f64 + unused / max_data_ratio) as u64;
    }

    let st = statfs(fs, info.devices.len())?;
    let free_statfs = st.bavail.saturating_mul(st.bsize as u64);

    let types: Vec<&str> = multiple_profiles(&spaces)
        .iter()
        .map(|(ty, _)| match *ty {
            BLOCK_GROUP_DATA => "data",
            BLOCK_GROUP_METADATA => "metadata",
            BLOCK_GROUP_SYSTEM => "system",
            _ => "data+metadata",
        })
        .collect();

    Ok(Usage {
        device_size_bytes: total_size,
        device_allocated_bytes: r_total_chunks,
        device_unallocated_bytes: r_total_unused,
        device_missing_bytes: missing,
        device_slack_bytes: slack,
        used_bytes: r_total_used,
        free_estimated_bytes: free_estimated,
        free_min_bytes: free_min,
        free_statfs_bytes: free_statfs,
        data_ratio,
        metadata_ratio,
        global_reserve: reserve,
        multiple_profiles: types.join(", "),
        spaces,
        devices,
    })
}

/// The percentage btrfs-progs prints after a space's used bytes, computed as it
/// computes it (single precision, total + 1 so that an empty group is 0).
pub fn used_percent(s: &SpaceInfo) -> f32 {
    100.0f32 * s.used_bytes as f32 / (s.total_bytes.wrapping_add(1)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_sort_as_progs() {
        let mut v = vec![
            BLOCK_GROUP_SYSTEM | BLOCK_GROUP_DUP,
            BLOCK_GROUP_METADATA | BLOCK_GROUP_DUP,
            BLOCK_GROUP_DATA,
            BLOCK_GROUP_METADATA,
            BLOCK_GROUP_DATA | BLOCK_GROUP_RAID1,
        ];
        v.sort_by(|a, b| progs_order(*a, *b));
        assert_eq!(
            v,
            vec![
                BLOCK_GROUP_DATA,
                BLOCK_GROUP_DATA | BLOCK_GROUP_RAID1,
                BLOCK_GROUP_METADATA,
                BLOCK_GROUP_METADATA | BLOCK_GROUP_DUP,
                BLOCK_GROUP_SYSTEM | BLOCK_GROUP_DUP,
            ]
        );
    }

    #[test]
    fn striped_profiles_count_their_share() {
        let c = |flags, num_stripes, bytes| ChunkInfo {
            flags,
            devid: 1,
            num_stripes,
            bytes,
        };
        assert_eq!(on_device_bytes(&c(BLOCK_GROUP_DUP, 2, 2 << 20)), 2 << 20);
        assert_eq!(on_device_bytes(&c(BLOCK_GROUP_RAID0, 4, 4 << 20)), 1 << 20);
        assert_eq!(on_device_bytes(&c(BLOCK_GROUP_RAID10, 4, 4 << 20)), 2 << 20);
        assert_eq!(on_device_bytes(&c(BLOCK_GROUP_RAID6, 4, 4 << 20)), 2 << 20);
        assert_eq!(on_device_bytes(&c(0, 1, 8 << 20)), 8 << 20);
    }
}
