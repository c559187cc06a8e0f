//! Constants from the btrfs on-disk format (object ids, item types, flags, features).

/// Superblock magic "_BHRfS_M".
pub const BTRFS_MAGIC: u64 = 0x4D5F_5366_5248_425F;
pub const SUPER_INFO_OFFSET: u64 = 0x10000;
pub const SUPER_INFO_SIZE: usize = 4096;
/// Superblock copies: 64 KiB, 64 MiB, 256 GiB.
pub const SUPER_MIRROR_MAX: usize = 3;
pub fn super_mirror_offset(i: usize) -> u64 {
    if i == 0 {
        SUPER_INFO_OFFSET
    } else {
        (16 * 1024u64) << (12 * i as u64)
    }
}
pub const SYSTEM_CHUNK_ARRAY_SIZE: usize = 2048;
pub const CSUM_SIZE_MAX: usize = 32;
pub const FSID_SIZE: usize = 16;
pub const UUID_SIZE: usize = 16;
pub const LABEL_SIZE: usize = 256;
pub const HEADER_SIZE: usize = 101;
pub const ITEM_SIZE: usize = 25;
pub const KEY_PTR_SIZE: usize = 33;
pub const DISK_KEY_SIZE: usize = 17;
pub const MAX_LEVEL: u8 = 8;
pub const NAME_LEN_MAX: usize = 255;
pub const STRIPE_LEN: u64 = 64 * 1024;
pub const MAX_INLINE_DATA_SIZE_DEFAULT: u64 = 2048;
pub const FIRST_CHUNK_TREE_OBJECTID: u64 = 256;

// Tree object ids.
pub const ROOT_TREE_OBJECTID: u64 = 1;
pub const EXTENT_TREE_OBJECTID: u64 = 2;
pub const CHUNK_TREE_OBJECTID: u64 = 3;
pub const DEV_TREE_OBJECTID: u64 = 4;
pub const FS_TREE_OBJECTID: u64 = 5;
pub const ROOT_TREE_DIR_OBJECTID: u64 = 6;
pub const CSUM_TREE_OBJECTID: u64 = 7;
pub const QUOTA_TREE_OBJECTID: u64 = 8;
pub const UUID_TREE_OBJECTID: u64 = 9;
pub const FREE_SPACE_TREE_OBJECTID: u64 = 10;
pub const BLOCK_GROUP_TREE_OBJECTID: u64 = 11;
pub const RAID_STRIPE_TREE_OBJECTID: u64 = 12;
pub const DEV_STATS_OBJECTID: u64 = 0;
pub const BALANCE_OBJECTID: u64 = (-4i64) as u64;
pub const ORPHAN_OBJECTID: u64 = (-5i64) as u64;
pub const TREE_LOG_OBJECTID: u64 = (-6i64) as u64;
pub const TREE_LOG_FIXUP_OBJECTID: u64 = (-7i64) as u64;
pub const TREE_RELOC_OBJECTID: u64 = (-8i64) as u64;
pub const DATA_RELOC_TREE_OBJECTID: u64 = (-9i64) as u64;
pub const EXTENT_CSUM_OBJECTID: u64 = (-10i64) as u64;
pub const FREE_SPACE_OBJECTID: u64 = (-11i64) as u64;
pub const FREE_INO_OBJECTID: u64 = (-12i64) as u64;
pub const MULTIPLE_OBJECTIDS: u64 = (-255i64) as u64;
pub const FIRST_FREE_OBJECTID: u64 = 256;
pub const LAST_FREE_OBJECTID: u64 = (-256i64) as u64;
pub const FIRST_REGULAR_INODE: u64 = 256;
pub const DEV_ITEMS_OBJECTID: u64 = 1;
/// Inode number the kernel shows for the placeholder of a subvolume inside a snapshot.
pub const EMPTY_SUBVOL_DIR_OBJECTID: u64 = 2;

// Item types.
pub const INODE_ITEM_KEY: u8 = 1;
pub const INODE_REF_KEY: u8 = 12;
pub const INODE_EXTREF_KEY: u8 = 13;
pub const XATTR_ITEM_KEY: u8 = 24;
pub const VERITY_DESC_ITEM_KEY: u8 = 36;
pub const VERITY_MERKLE_ITEM_KEY: u8 = 37;
pub const ORPHAN_ITEM_KEY: u8 = 48;
pub const DIR_LOG_ITEM_KEY: u8 = 60;
pub const DIR_LOG_INDEX_KEY: u8 = 72;
pub const DIR_ITEM_KEY: u8 = 84;
pub const DIR_INDEX_KEY: u8 = 96;
pub const EXTENT_DATA_KEY: u8 = 108;
pub const EXTENT_CSUM_KEY: u8 = 128;
pub const ROOT_ITEM_KEY: u8 = 132;
pub const ROOT_BACKREF_KEY: u8 = 144;
pub const ROOT_REF_KEY: u8 = 156;
pub const EXTENT_ITEM_KEY: u8 = 168;
pub const METADATA_ITEM_KEY: u8 = 169;
pub const EXTENT_OWNER_REF_KEY: u8 = 172;
pub const TREE_BLOCK_REF_KEY: u8 = 176;
pub const EXTENT_DATA_REF_KEY: u8 = 178;
pub const SHARED_BLOCK_REF_KEY: u8 = 182;
pub const SHARED_DATA_REF_KEY: u8 = 184;
pub const BLOCK_GROUP_ITEM_KEY: u8 = 192;
pub const FREE_SPACE_INFO_KEY: u8 = 198;
pub const FREE_SPACE_EXTENT_KEY: u8 = 199;
pub const FREE_SPACE_BITMAP_KEY: u8 = 200;
pub const DEV_EXTENT_KEY: u8 = 204;
pub const DEV_ITEM_KEY: u8 = 216;
pub const CHUNK_ITEM_KEY: u8 = 228;
pub const RAID_STRIPE_KEY: u8 = 230;
pub const QGROUP_STATUS_KEY: u8 = 240;
pub const QGROUP_INFO_KEY: u8 = 242;
pub const QGROUP_LIMIT_KEY: u8 = 244;
pub const QGROUP_RELATION_KEY: u8 = 246;
pub const TEMPORARY_ITEM_KEY: u8 = 248;
pub const PERSISTENT_ITEM_KEY: u8 = 249;
pub const DEV_REPLACE_KEY: u8 = 250;
pub const UUID_KEY_SUBVOL: u8 = 251;
pub const UUID_KEY_RECEIVED_SUBVOL: u8 = 252;
pub const STRING_ITEM_KEY: u8 = 253;

// Block group / chunk type flags.
pub const BLOCK_GROUP_DATA: u64 = 1 << 0;
pub const BLOCK_GROUP_SYSTEM: u64 = 1 << 1;
pub const BLOCK_GROUP_METADATA: u64 = 1 << 2;
pub const BLOCK_GROUP_RAID0: u64 = 1 << 3;
pub const BLOCK_GROUP_RAID1: u64 = 1 << 4;
pub const BLOCK_GROUP_DUP: u64 = 1 << 5;
pub const BLOCK_GROUP_RAID10: u64 = 1 << 6;
pub const BLOCK_GROUP_RAID5: u64 = 1 << 7;
pub const BLOCK_GROUP_RAID6: u64 = 1 << 8;
pub const BLOCK_GROUP_RAID1C3: u64 = 1 << 9;
pub const BLOCK_GROUP_RAID1C4: u64 = 1 << 10;
pub const BLOCK_GROUP_TYPE_MASK: u64 = BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA;
pub const BLOCK_GROUP_PROFILE_MASK: u64 = BLOCK_GROUP_RAID0
    | BLOCK_GROUP_RAID1
    | BLOCK_GROUP_DUP
    | BLOCK_GROUP_RAID10
    | BLOCK_GROUP_RAID5
    | BLOCK_GROUP_RAID6
    | BLOCK_GROUP_RAID1C3
    | BLOCK_GROUP_RAID1C4;

// Tree block header flags.
pub const HEADER_FLAG_WRITTEN: u64 = 1 << 0;
pub const HEADER_FLAG_RELOC: u64 = 1 << 1;
pub const BACKREF_REV_SHIFT: u32 = 56;
pub const MIXED_BACKREF_REV: u64 = 1;

// Extent item flags.
pub const EXTENT_FLAG_DATA: u64 = 1 << 0;
pub const EXTENT_FLAG_TREE_BLOCK: u64 = 1 << 1;
pub const BLOCK_FLAG_FULL_BACKREF: u64 = 1 << 8;

// File extent types.
pub const FILE_EXTENT_INLINE: u8 = 0;
pub const FILE_EXTENT_REG: u8 = 1;
pub const FILE_EXTENT_PREALLOC: u8 = 2;

// Dir item file types (same as fs_types in the kernel).
pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG_FILE: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHRDEV: u8 = 3;
pub const FT_BLKDEV: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;
pub const FT_XATTR: u8 = 8;

// Inode flags.
pub const INODE_NODATASUM: u64 = 1 << 0;
pub const INODE_NODATACOW: u64 = 1 << 1;
pub const INODE_READONLY: u64 = 1 << 2;
pub const INODE_NOCOMPRESS: u64 = 1 << 3;
pub const INODE_PREALLOC: u64 = 1 << 4;
pub const INODE_SYNC: u64 = 1 << 5;
pub const INODE_IMMUTABLE: u64 = 1 << 6;
pub const INODE_APPEND: u64 = 1 << 7;
pub const INODE_NODUMP: u64 = 1 << 8;
pub const INODE_NOATIME: u64 = 1 << 9;
pub const INODE_DIRSYNC: u64 = 1 << 10;
pub const INODE_COMPRESS: u64 = 1 << 11;
pub const INODE_ROOT_ITEM_INIT: u64 = 1 << 31;

// Root item flags.
pub const ROOT_SUBVOL_RDONLY: u64 = 1 << 0;
pub const ROOT_SUBVOL_DEAD: u64 = 1 << 48;

// Superblock flags.
pub const SUPER_FLAG_SEEDING: u64 = 1 << 32;
pub const SUPER_FLAG_METADUMP: u64 = 1 << 33;
pub const SUPER_FLAG_METADUMP_V2: u64 = 1 << 34;
pub const SUPER_FLAG_CHANGING_FSID: u64 = 1 << 35;
pub const SUPER_FLAG_CHANGING_FSID_V2: u64 = 1 << 36;

// Features.
pub const FEATURE_COMPAT_RO_FREE_SPACE_TREE: u64 = 1 << 0;
pub const FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID: u64 = 1 << 1;
pub const FEATURE_COMPAT_RO_VERITY: u64 = 1 << 2;
pub const FEATURE_COMPAT_RO_BLOCK_GROUP_TREE: u64 = 1 << 3;
pub const FEATURE_COMPAT_RO_SUPP: u64 = FEATURE_COMPAT_RO_FREE_SPACE_TREE
    | FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID
    | FEATURE_COMPAT_RO_VERITY
    | FEATURE_COMPAT_RO_BLOCK_GROUP_TREE;

pub const FEATURE_INCOMPAT_MIXED_BACKREF: u64 = 1 << 0;
pub const FEATURE_INCOMPAT_DEFAULT_SUBVOL: u64 = 1 << 1;
pub const FEATURE_INCOMPAT_MIXED_GROUPS: u64 = 1 << 2;
pub const FEATURE_INCOMPAT_COMPRESS_LZO: u64 = 1 << 3;
pub const FEATURE_INCOMPAT_COMPRESS_ZSTD: u64 = 1 << 4;
pub const FEATURE_INCOMPAT_BIG_METADATA: u64 = 1 << 5;
pub const FEATURE_INCOMPAT_EXTENDED_IREF: u64 = 1 << 6;
pub const FEATURE_INCOMPAT_RAID56: u64 = 1 << 7;
pub const FEATURE_INCOMPAT_SKINNY_METADATA: u64 = 1 << 8;
pub const FEATURE_INCOMPAT_NO_HOLES: u64 = 1 << 9;
pub const FEATURE_INCOMPAT_METADATA_UUID: u64 = 1 << 10;
pub const FEATURE_INCOMPAT_RAID1C34: u64 = 1 << 11;
pub const FEATURE_INCOMPAT_ZONED: u64 = 1 << 12;
pub const FEATURE_INCOMPAT_EXTENT_TREE_V2: u64 = 1 << 13;
pub const FEATURE_INCOMPAT_RAID_STRIPE_TREE: u64 = 1 << 14;
pub const FEATURE_INCOMPAT_SIMPLE_QUOTA: u64 = 1 << 16;
pub const FEATURE_INCOMPAT_REMAP_TREE: u64 = 1 << 17;

/// Incompat features this reader understands. Zoned devices, extent-tree-v2, the raid
/// stripe tree and the remap tree change how data is located; refusing them is safer
/// than showing wrong contents.
pub const FEATURE_INCOMPAT_SUPP: u64 = FEATURE_INCOMPAT_MIXED_BACKREF
    | FEATURE_INCOMPAT_DEFAULT_SUBVOL
    | FEATURE_INCOMPAT_MIXED_GROUPS
    | FEATURE_INCOMPAT_COMPRESS_LZO
    | FEATURE_INCOMPAT_COMPRESS_ZSTD
    | FEATURE_INCOMPAT_BIG_METADATA
    | FEATURE_INCOMPAT_EXTENDED_IREF
    | FEATURE_INCOMPAT_RAID56
    | FEATURE_INCOMPAT_SKINNY_METADATA
    | FEATURE_INCOMPAT_NO_HOLES
    | FEATURE_INCOMPAT_METADATA_UUID
    | FEATURE_INCOMPAT_RAID1C34
    | FEATURE_INCOMPAT_SIMPLE_QUOTA;

/// Names of incompat feature bits, as btrfs-progs prints them.
pub fn incompat_names(flags: u64) -> Vec<&'static str> {
    const NAMES: &[(u64, &str)] = &[
        (FEATURE_INCOMPAT_MIXED_BACKREF, "MIXED_BACKREF"),
        (FEATURE_INCOMPAT_DEFAULT_SUBVOL, "DEFAULT_SUBVOL"),
        (FEATURE_INCOMPAT_MIXED_GROUPS, "MIXED_GROUPS"),
        (FEATURE_INCOMPAT_COMPRESS_LZO, "COMPRESS_LZO"),
        (FEATURE_INCOMPAT_COMPRESS_ZSTD, "COMPRESS_ZSTD"),
        (FEATURE_INCOMPAT_BIG_METADATA, "BIG_METADATA"),
        (FEATURE_INCOMPAT_EXTENDED_IREF, "EXTENDED_IREF"),
        (FEATURE_INCOMPAT_RAID56, "RAID56"),
        (FEATURE_INCOMPAT_SKINNY_METADATA, "SKINNY_METADATA"),
        (FEATURE_INCOMPAT_NO_HOLES, "NO_HOLES"),
        (FEATURE_INCOMPAT_METADATA_UUID, "METADATA_UUID"),
        (FEATURE_INCOMPAT_RAID1C34, "RAID1C34"),
        (FEATURE_INCOMPAT_ZONED, "ZONED"),
        (FEATURE_INCOMPAT_EXTENT_TREE_V2, "EXTENT_TREE_V2"),
        (FEATURE_INCOMPAT_RAID_STRIPE_TREE, "RAID_STRIPE_TREE"),
        (FEATURE_INCOMPAT_SIMPLE_QUOTA, "SIMPLE_QUOTA"),
        (FEATURE_INCOMPAT_REMAP_TREE, "REMAP_TREE"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

pub fn compat_ro_names(flags: u64) -> Vec<&'static str> {
    const NAMES: &[(u64, &str)] = &[
        (FEATURE_COMPAT_RO_FREE_SPACE_TREE, "FREE_SPACE_TREE"),
        (
            FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID,
            "FREE_SPACE_TREE_VALID",
        ),
        (FEATURE_COMPAT_RO_VERITY, "VERITY"),
        (FEATURE_COMPAT_RO_BLOCK_GROUP_TREE, "BLOCK_GROUP_TREE"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// Item type name as btrfs-progs' dump-tree prints it.
pub fn key_type_name(t: u8) -> Option<&'static str> {
    Some(match t {
        INODE_ITEM_KEY => "INODE_ITEM",
        INODE_REF_KEY => "INODE_REF",
        INODE_EXTREF_KEY => "INODE_EXTREF",
        XATTR_ITEM_KEY => "XATTR_ITEM",
        VERITY_DESC_ITEM_KEY => "VERITY_DESC_ITEM",
        VERITY_MERKLE_ITEM_KEY => "VERITY_MERKLE_ITEM",
        ORPHAN_ITEM_KEY => "ORPHAN_ITEM",
        DIR_LOG_ITEM_KEY => "DIR_LOG_ITEM",
        DIR_LOG_INDEX_KEY => "DIR_LOG_INDEX",
        DIR_ITEM_KEY => "DIR_ITEM",
        DIR_INDEX_KEY => "DIR_INDEX",
        EXTENT_DATA_KEY => "EXTENT_DATA",
        EXTENT_CSUM_KEY => "EXTENT_CSUM",
        ROOT_ITEM_KEY => "ROOT_ITEM",
        ROOT_BACKREF_KEY => "ROOT_BACKREF",
        ROOT_REF_KEY => "ROOT_REF",
        EXTENT_ITEM_KEY => "EXTENT_ITEM",
        METADATA_ITEM_KEY => "METADATA_ITEM",
        EXTENT_OWNER_REF_KEY => "EXTENT_OWNER_REF",
        TREE_BLOCK_REF_KEY => "TREE_BLOCK_REF",
        EXTENT_DATA_REF_KEY => "EXTENT_DATA_REF",
        SHARED_BLOCK_REF_KEY => "SHARED_BLOCK_REF",
        SHARED_DATA_REF_KEY => "SHARED_DATA_REF",
        BLOCK_GROUP_ITEM_KEY => "BLOCK_GROUP_ITEM",
        FREE_SPACE_INFO_KEY => "FREE_SPACE_INFO",
        FREE_SPACE_EXTENT_KEY => "FREE_SPACE_EXTENT",
        FREE_SPACE_BITMAP_KEY => "FREE_SPACE_BITMAP",
        DEV_EXTENT_KEY => "DEV_EXTENT",
        DEV_ITEM_KEY => "DEV_ITEM",
        CHUNK_ITEM_KEY => "CHUNK_ITEM",
        RAID_STRIPE_KEY => "RAID_STRIPE",
        QGROUP_STATUS_KEY => "QGROUP_STATUS",
        QGROUP_INFO_KEY => "QGROUP_INFO",
        QGROUP_LIMIT_KEY => "QGROUP_LIMIT",
        QGROUP_RELATION_KEY => "QGROUP_RELATION",
        TEMPORARY_ITEM_KEY => "TEMPORARY_ITEM",
        PERSISTENT_ITEM_KEY => "PERSISTENT_ITEM",
        DEV_REPLACE_KEY => "DEV_REPLACE",
        UUID_KEY_SUBVOL => "UUID_KEY_SUBVOL",
        UUID_KEY_RECEIVED_SUBVOL => "UUID_KEY_RECEIVED_SUBVOL",
        STRING_ITEM_KEY => "STRING_ITEM",
        _ => return None,
    })
}

/// Object id name as btrfs-progs' dump-tree prints it (for the well-known ids).
pub fn objectid_name(id: u64) -> Option<&'static str> {
    Some(match id {
        ROOT_TREE_OBJECTID => "ROOT_TREE",
        EXTENT_TREE_OBJECTID => "EXTENT_TREE",
        CHUNK_TREE_OBJECTID => "CHUNK_TREE",
        DEV_TREE_OBJECTID => "DEV_TREE",
        FS_TREE_OBJECTID => "FS_TREE",
        ROOT_TREE_DIR_OBJECTID => "ROOT_TREE_DIR",
        CSUM_TREE_OBJECTID => "CSUM_TREE",
        QUOTA_TREE_OBJECTID => "QUOTA_TREE",
        UUID_TREE_OBJECTID => "UUID_TREE",
        FREE_SPACE_TREE_OBJECTID => "FREE_SPACE_TREE",
        BLOCK_GROUP_TREE_OBJECTID => "BLOCK_GROUP_TREE",
        RAID_STRIPE_TREE_OBJECTID => "RAID_STRIPE_TREE",
        BALANCE_OBJECTID => "BALANCE",
        ORPHAN_OBJECTID => "ORPHAN",
        TREE_LOG_OBJECTID => "TREE_LOG",
        TREE_LOG_FIXUP_OBJECTID => "TREE_LOG_FIXUP",
        TREE_RELOC_OBJECTID => "TREE_RELOC",
        DATA_RELOC_TREE_OBJECTID => "DATA_RELOC_TREE",
        EXTENT_CSUM_OBJECTID => "EXTENT_CSUM",
        FREE_SPACE_OBJECTID => "FREE_SPACE",
        FREE_INO_OBJECTID => "FREE_INO",
        MULTIPLE_OBJECTIDS => "MULTIPLE",
        _ => return None,
    })
}

/// Profile name of a block group type, as `btrfs filesystem df` spells it.
pub fn profile_name(flags: u64) -> &'static str {
    match flags & BLOCK_GROUP_PROFILE_MASK {
        0 => "single",
        BLOCK_GROUP_RAID0 => "RAID0",
        BLOCK_GROUP_RAID1 => "RAID1",
        BLOCK_GROUP_DUP => "DUP",
        BLOCK_GROUP_RAID10 => "RAID10",
        BLOCK_GROUP_RAID5 => "RAID5",
        BLOCK_GROUP_RAID6 => "RAID6",
        BLOCK_GROUP_RAID1C3 => "RAID1C3",
        BLOCK_GROUP_RAID1C4 => "RAID1C4",
        _ => "mixed-profile",
    }
}
