//! `filesystem df`: what the kernel's BTRFS_IOC_SPACE_INFO answers, worked out from
//! an unmounted filesystem: per block-group type and profile, the bytes of block
//! groups and the bytes used in them, and the size of the kernel's global block
//! reserve as it sizes it at mount (block-rsv.c btrfs_update_global_block_rsv).

use crate::alloc::block_group::raid;
use crate::error::Result;
use crate::fs::Filesystem;
use ubtrfs_format::consts::*;

/// One line of `btrfs filesystem df`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceInfo {
    /// Block group type bits (DATA, SYSTEM, METADATA, both for mixed groups).
    pub ty: u64,
    /// Profile bit (0: single).
    pub profile: u64,
    /// Logical bytes of the block groups.
    pub total_bytes: u64,
    /// Bytes used in them.
    pub used_bytes: u64,
}

/// The kernel's global reserve and what it says of it (`GlobalReserve, single`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalReserve {
    /// Its size.
    pub total_bytes: u64,
    /// Used: 0 on a filesystem at rest (the kernel fills it at mount).
    pub used_bytes: u64,
}

/// The space infos in the order the kernel's ioctl gives them: data, system,
/// metadata, mixed; within each, profiles in raid index order.
pub fn space_infos(fs: &Filesystem) -> Result<Vec<SpaceInfo>> {
    let mut out: Vec<SpaceInfo> = Vec::new();
    for (_, length, bg) in crate::alloc::block_group::block_group_items(&fs.info)? {
        let ty = bg.flags & BLOCK_GROUP_TYPE_MASK;
        let profile = bg.flags & BLOCK_GROUP_PROFILE_MASK;
        match out.iter_mut().find(|s| s.ty == ty && s.profile == profile) {
            Some(s) => {
                // Sums of on-disk numbers: a hostile image must not overflow them.
                s.total_bytes = s.total_bytes.saturating_add(length);
                s.used_bytes = s.used_bytes.saturating_add(bg.used);
            }
            None => out.push(SpaceInfo {
                ty,
                profile,
                total_bytes: length,
                used_bytes: bg.used,
            }),
        }
    }
    let type_order = |ty: u64| match ty {
        BLOCK_GROUP_DATA => 0,
        BLOCK_GROUP_SYSTEM => 1,
        BLOCK_GROUP_METADATA => 2,
        _ => 3,
    };
    out.sort_by_key(|s| (type_order(s.ty), raid(s.profile).index));
    Ok(out)
}

/// The global reserve's size as the kernel sets it at mount: the bytes of the
/// extent, checksum and free-space trees (and the block-group tree), but at least
/// room to insert one item per tree it counts, one for the root tree, and the six
/// of an unlink (`nodesize * 8 levels * 2` each), plus the delayed refs of that
/// unlink (twice as much with a free-space tree to update too); at most 512 MiB.
pub fn global_reserve(fs: &Filesystem) -> Result<GlobalReserve> {
    const UNLINK_METADATA_UNITS: u64 = 6;
    const MAX_LEVEL: u64 = 8;
    let info = &fs.info;
    let insert_size = |items: u64| info.nodesize as u64 * MAX_LEVEL * 2 * items;
    let mut trees = vec![EXTENT_TREE_OBJECTID, CSUM_TREE_OBJECTID];
    let fst = info.sb.compat_ro_flags & FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0;
    if fst {
        trees.push(FREE_SPACE_TREE_OBJECTID);
    }
    if info.sb.compat_ro_flags & FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        trees.push(BLOCK_GROUP_TREE_OBJECTID);
    }
    let mut bytes = 0u64;
    let mut items = 1u64;
    for id in trees {
        if let Some(r) = info.read_root_item(id)? {
            bytes = bytes.saturating_add(r.bytes_used);
            items += 1;
        }
    }
    items += UNLINK_METADATA_UNITS;
    let delayed_refs = insert_size(UNLINK_METADATA_UNITS) * if fst { 2 } else { 1 };
    let total = bytes.max(insert_size(items) + delayed_refs).min(512 << 20);
    Ok(GlobalReserve {
        total_bytes: total,
        used_bytes: 0,
    })
}

/// `btrfs filesystem df`'s name of a type ("Data", "System", "Metadata",
/// "Data+Metadata") and of a profile ("single", "DUP", "RAID1", ...).
pub fn names(ty: u64, profile: u64) -> (&'static str, &'static str) {
    let t = match ty {
        BLOCK_GROUP_DATA => "Data",
        BLOCK_GROUP_SYSTEM => "System",
        BLOCK_GROUP_METADATA => "Metadata",
        t if t == BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA => "Data+Metadata",
        _ => "unknown",
    };
    (t, profile_name(profile))
}
