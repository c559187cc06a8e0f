//! Constants from the btrfs on-disk format (object ids, item types, flags, features).

/// Superblock magic "_BHRfS_M".
pub const BTRFS_MAGIC: u64 = 0x4D5F_5366_5248_425F;
/// Byte offset of the primary superblock (64 KiB).
pub const SUPER_INFO_OFFSET: u64 = 0x10000;
/// Size of a superblock in bytes.
pub const SUPER_INFO_SIZE: usize = 4096;
/// Superblock copies: 64 KiB, 64 MiB, 256 GiB.
pub const SUPER_MIRROR_MAX: usize = 3;
/// Byte offset of superblock copy `i` (0: 64 KiB, 1: 64 MiB, 2: 256 GiB).
pub fn super_mirror_offset(i: usize) -> u64 {
    if i == 0 {
        SUPER_INFO_OFFSET
    } else {
        (16 * 1024u64) << (12 * i as u64)
    }
}
/// Size of the superblock's sys_chunk_array (BTRFS_SYSTEM_CHUNK_ARRAY_SIZE).
pub const SYSTEM_CHUNK_ARRAY_SIZE: usize = 2048;
/// Size of the checksum field of tree blocks and the superblock (BTRFS_CSUM_SIZE).
pub const CSUM_SIZE_MAX: usize = 32;
/// Bytes of a filesystem id (BTRFS_FSID_SIZE).
pub const FSID_SIZE: usize = 16;
/// Bytes of a UUID (BTRFS_UUID_SIZE).
pub const UUID_SIZE: usize = 16;
/// Bytes of the superblock's label field (BTRFS_LABEL_SIZE).
pub const LABEL_SIZE: usize = 256;
/// Size of a tree block header (struct btrfs_header).
pub const HEADER_SIZE: usize = 101;
/// Size of a leaf item header (struct btrfs_item).
pub const ITEM_SIZE: usize = 25;
/// Size of a node's key pointer (struct btrfs_key_ptr).
pub const KEY_PTR_SIZE: usize = 33;
/// Size of an on-disk key (struct btrfs_disk_key).
pub const DISK_KEY_SIZE: usize = 17;
/// Number of tree levels (BTRFS_MAX_LEVEL); valid levels are below it.
pub const MAX_LEVEL: u8 = 8;
/// Longest file name in bytes (BTRFS_NAME_LEN).
pub const NAME_LEN_MAX: usize = 255;
/// Stripe length of a chunk (BTRFS_STRIPE_LEN, 64 KiB).
pub const STRIPE_LEN: u64 = 64 * 1024;
/// Default `max_inline`: the largest file data stored inline in a leaf.
pub const MAX_INLINE_DATA_SIZE_DEFAULT: u64 = 2048;
/// Object id of CHUNK_ITEM keys (and of block groups' chunk_objectid).
pub const FIRST_CHUNK_TREE_OBJECTID: u64 = 256;

// Tree object ids.
/// The root tree: root items of all other trees.
pub const ROOT_TREE_OBJECTID: u64 = 1;
/// The extent tree: allocated extents and their back references.
pub const EXTENT_TREE_OBJECTID: u64 = 2;
/// The chunk tree: logical to physical address mapping and devices.
pub const CHUNK_TREE_OBJECTID: u64 = 3;
/// The device tree: device extents.
pub const DEV_TREE_OBJECTID: u64 = 4;
/// The top-level subvolume's FS tree.
pub const FS_TREE_OBJECTID: u64 = 5;
/// Directory in the root tree holding the "default" subvolume entry.
pub const ROOT_TREE_DIR_OBJECTID: u64 = 6;
/// The checksum tree: data checksums.
pub const CSUM_TREE_OBJECTID: u64 = 7;
/// The quota tree: qgroup items.
pub const QUOTA_TREE_OBJECTID: u64 = 8;
/// The UUID tree: subvolume UUIDs to subvolume ids.
pub const UUID_TREE_OBJECTID: u64 = 9;
/// The free space tree.
pub const FREE_SPACE_TREE_OBJECTID: u64 = 10;
/// The block group tree (block group items, with the block-group-tree feature).
pub const BLOCK_GROUP_TREE_OBJECTID: u64 = 11;
/// The raid stripe tree.
pub const RAID_STRIPE_TREE_OBJECTID: u64 = 12;
/// Object id of the device statistics items (PERSISTENT_ITEM, offset = devid).
pub const DEV_STATS_OBJECTID: u64 = 0;
/// Object id of the balance status item.
pub const BALANCE_OBJECTID: u64 = (-4i64) as u64;
/// Object id of orphan items (inodes or roots awaiting deletion).
pub const ORPHAN_OBJECTID: u64 = (-5i64) as u64;
/// Object id of log tree root items (fsync log).
pub const TREE_LOG_OBJECTID: u64 = (-6i64) as u64;
/// Object id used temporarily during log replay.
pub const TREE_LOG_FIXUP_OBJECTID: u64 = (-7i64) as u64;
/// Object id of relocation tree root items (balance).
pub const TREE_RELOC_OBJECTID: u64 = (-8i64) as u64;
/// The data relocation tree (balance).
pub const DATA_RELOC_TREE_OBJECTID: u64 = (-9i64) as u64;
/// Object id of EXTENT_CSUM items in the checksum tree.
pub const EXTENT_CSUM_OBJECTID: u64 = (-10i64) as u64;
/// Object id of free space cache (v1) items.
pub const FREE_SPACE_OBJECTID: u64 = (-11i64) as u64;
/// Object id of the obsolete free inode number cache.
pub const FREE_INO_OBJECTID: u64 = (-12i64) as u64;
/// Dummy object id standing for several object ids.
pub const MULTIPLE_OBJECTIDS: u64 = (-255i64) as u64;
/// First object id available for inodes and subvolumes.
pub const FIRST_FREE_OBJECTID: u64 = 256;
/// Last object id available for inodes and subvolumes.
pub const LAST_FREE_OBJECTID: u64 = (-256i64) as u64;
/// Inode number of a subvolume's root directory, the first inode of a tree.
pub const FIRST_REGULAR_INODE: u64 = 256;
/// Object id of DEV_ITEM keys in the chunk tree.
pub const DEV_ITEMS_OBJECTID: u64 = 1;
/// Inode number the kernel shows for the placeholder of a subvolume inside a snapshot.
pub const EMPTY_SUBVOL_DIR_OBJECTID: u64 = 2;

// Item types.
/// INODE_ITEM key type: an inode (struct btrfs_inode_item).
pub const INODE_ITEM_KEY: u8 = 1;
/// INODE_REF key type: an inode's names in one directory (offset = parent inode).
pub const INODE_REF_KEY: u8 = 12;
/// INODE_EXTREF key type: extended inode refs (offset = hash of parent and name).
pub const INODE_EXTREF_KEY: u8 = 13;
/// XATTR_ITEM key type: extended attributes (offset = name hash).
pub const XATTR_ITEM_KEY: u8 = 24;
/// VERITY_DESC_ITEM key type: fs-verity descriptor.
pub const VERITY_DESC_ITEM_KEY: u8 = 36;
/// VERITY_MERKLE_ITEM key type: fs-verity Merkle tree.
pub const VERITY_MERKLE_ITEM_KEY: u8 = 37;
/// ORPHAN_ITEM key type: an inode or root pending deletion.
pub const ORPHAN_ITEM_KEY: u8 = 48;
/// DIR_LOG_ITEM key type: log tree range of logged DIR_ITEM entries.
pub const DIR_LOG_ITEM_KEY: u8 = 60;
/// DIR_LOG_INDEX key type: log tree range of logged DIR_INDEX entries.
pub const DIR_LOG_INDEX_KEY: u8 = 72;
/// DIR_ITEM key type: directory entries by name hash.
pub const DIR_ITEM_KEY: u8 = 84;
/// DIR_INDEX key type: a directory entry by index (readdir order).
pub const DIR_INDEX_KEY: u8 = 96;
/// EXTENT_DATA key type: a file extent (offset = file offset).
pub const EXTENT_DATA_KEY: u8 = 108;
/// EXTENT_CSUM key type: data checksums (offset = logical address).
pub const EXTENT_CSUM_KEY: u8 = 128;
/// ROOT_ITEM key type: a tree's root (struct btrfs_root_item).
pub const ROOT_ITEM_KEY: u8 = 132;
/// ROOT_BACKREF key type: subvolume to parent link (child, 144, parent).
pub const ROOT_BACKREF_KEY: u8 = 144;
/// ROOT_REF key type: parent to subvolume link (parent, 156, child).
pub const ROOT_REF_KEY: u8 = 156;
/// EXTENT_ITEM key type: an allocated extent (offset = length).
pub const EXTENT_ITEM_KEY: u8 = 168;
/// METADATA_ITEM key type: a skinny tree block extent (offset = level).
pub const METADATA_ITEM_KEY: u8 = 169;
/// EXTENT_OWNER_REF key type: owning root of a data extent (simple quotas).
pub const EXTENT_OWNER_REF_KEY: u8 = 172;
/// TREE_BLOCK_REF key type: tree block back reference by root.
pub const TREE_BLOCK_REF_KEY: u8 = 176;
/// EXTENT_DATA_REF key type: data back reference by (root, inode, offset).
pub const EXTENT_DATA_REF_KEY: u8 = 178;
/// SHARED_BLOCK_REF key type: tree block back reference by parent block.
pub const SHARED_BLOCK_REF_KEY: u8 = 182;
/// SHARED_DATA_REF key type: data back reference by parent leaf.
pub const SHARED_DATA_REF_KEY: u8 = 184;
/// BLOCK_GROUP_ITEM key type: a block group (objectid = start, offset = length).
pub const BLOCK_GROUP_ITEM_KEY: u8 = 192;
/// FREE_SPACE_INFO key type: a block group's free space summary.
pub const FREE_SPACE_INFO_KEY: u8 = 198;
/// FREE_SPACE_EXTENT key type: a free range (objectid = start, offset = length).
pub const FREE_SPACE_EXTENT_KEY: u8 = 199;
/// FREE_SPACE_BITMAP key type: a free space bitmap.
pub const FREE_SPACE_BITMAP_KEY: u8 = 200;
/// DEV_EXTENT key type: a device extent (objectid = devid, offset = physical start).
pub const DEV_EXTENT_KEY: u8 = 204;
/// DEV_ITEM key type: a device (struct btrfs_dev_item).
pub const DEV_ITEM_KEY: u8 = 216;
/// CHUNK_ITEM key type: a chunk (offset = logical start).
pub const CHUNK_ITEM_KEY: u8 = 228;
/// RAID_STRIPE key type: a raid stripe tree entry.
pub const RAID_STRIPE_KEY: u8 = 230;
/// QGROUP_STATUS key type: quota status.
pub const QGROUP_STATUS_KEY: u8 = 240;
/// QGROUP_INFO key type: a qgroup's usage.
pub const QGROUP_INFO_KEY: u8 = 242;
/// QGROUP_LIMIT key type: a qgroup's limits.
pub const QGROUP_LIMIT_KEY: u8 = 244;
/// QGROUP_RELATION key type: qgroup parent/child relation.
pub const QGROUP_RELATION_KEY: u8 = 246;
/// TEMPORARY_ITEM key type (balance status).
pub const TEMPORARY_ITEM_KEY: u8 = 248;
/// PERSISTENT_ITEM key type (device statistics).
pub const PERSISTENT_ITEM_KEY: u8 = 249;
/// DEV_REPLACE key type: device replace status.
pub const DEV_REPLACE_KEY: u8 = 250;
/// UUID tree key type: subvolume UUID to subvolume id.
pub const UUID_KEY_SUBVOL: u8 = 251;
/// UUID tree key type: received UUID to subvolume ids.
pub const UUID_KEY_RECEIVED_SUBVOL: u8 = 252;
/// STRING_ITEM key type (debugging).
pub const STRING_ITEM_KEY: u8 = 253;

// Block group / chunk type flags.
/// Block group / chunk holds data.
pub const BLOCK_GROUP_DATA: u64 = 1 << 0;
/// Block group / chunk holds the chunk tree.
pub const BLOCK_GROUP_SYSTEM: u64 = 1 << 1;
/// Block group / chunk holds metadata.
pub const BLOCK_GROUP_METADATA: u64 = 1 << 2;
/// RAID0 profile: striped, no redundancy.
pub const BLOCK_GROUP_RAID0: u64 = 1 << 3;
/// RAID1 profile: two copies on different devices.
pub const BLOCK_GROUP_RAID1: u64 = 1 << 4;
/// DUP profile: two copies on one device.
pub const BLOCK_GROUP_DUP: u64 = 1 << 5;
/// RAID10 profile: striped mirrors.
pub const BLOCK_GROUP_RAID10: u64 = 1 << 6;
/// RAID5 profile: one parity stripe.
pub const BLOCK_GROUP_RAID5: u64 = 1 << 7;
/// RAID6 profile: two parity stripes.
pub const BLOCK_GROUP_RAID6: u64 = 1 << 8;
/// RAID1C3 profile: three copies.
pub const BLOCK_GROUP_RAID1C3: u64 = 1 << 9;
/// RAID1C4 profile: four copies.
pub const BLOCK_GROUP_RAID1C4: u64 = 1 << 10;
/// The type bits (DATA, SYSTEM, METADATA).
pub const BLOCK_GROUP_TYPE_MASK: u64 = BLOCK_GROUP_DATA | BLOCK_GROUP_SYSTEM | BLOCK_GROUP_METADATA;
/// The profile bits (no bit set means single).
pub const BLOCK_GROUP_PROFILE_MASK: u64 = BLOCK_GROUP_RAID0
    | BLOCK_GROUP_RAID1
    | BLOCK_GROUP_DUP
    | BLOCK_GROUP_RAID10
    | BLOCK_GROUP_RAID5
    | BLOCK_GROUP_RAID6
    | BLOCK_GROUP_RAID1C3
    | BLOCK_GROUP_RAID1C4;
/// The bit that stands for "single" where profiles are a set (the kernel's
/// BTRFS_AVAIL_ALLOC_BIT_SINGLE; in no block group item).
pub const AVAIL_ALLOC_BIT_SINGLE: u64 = 1 << 48;

// Tree block header flags.
/// Tree block header flag: written in its transaction.
pub const HEADER_FLAG_WRITTEN: u64 = 1 << 0;
/// Tree block header flag: block of a relocation tree.
pub const HEADER_FLAG_RELOC: u64 = 1 << 1;
/// Shift of the back reference revision in the header flags.
pub const BACKREF_REV_SHIFT: u32 = 56;
/// Back reference revision of current filesystems.
pub const MIXED_BACKREF_REV: u64 = 1;

// Extent item flags.
/// Extent item flag: the extent holds file data.
pub const EXTENT_FLAG_DATA: u64 = 1 << 0;
/// Extent item flag: the extent is a tree block.
pub const EXTENT_FLAG_TREE_BLOCK: u64 = 1 << 1;
/// Extent item flag: the tree block uses full (parent) back references.
pub const BLOCK_FLAG_FULL_BACKREF: u64 = 1 << 8;

// File extent types.
/// File extent type: data inline in the item.
pub const FILE_EXTENT_INLINE: u8 = 0;
/// File extent type: regular extent on disk.
pub const FILE_EXTENT_REG: u8 = 1;
/// File extent type: preallocated, reads as zeros.
pub const FILE_EXTENT_PREALLOC: u8 = 2;

// Dir item file types (same as fs_types in the kernel).
/// Directory entry type: unknown.
pub const FT_UNKNOWN: u8 = 0;
/// Directory entry type: regular file.
pub const FT_REG_FILE: u8 = 1;
/// Directory entry type: directory.
pub const FT_DIR: u8 = 2;
/// Directory entry type: character device.
pub const FT_CHRDEV: u8 = 3;
/// Directory entry type: block device.
pub const FT_BLKDEV: u8 = 4;
/// Directory entry type: FIFO.
pub const FT_FIFO: u8 = 5;
/// Directory entry type: socket.
pub const FT_SOCK: u8 = 6;
/// Directory entry type: symbolic link.
pub const FT_SYMLINK: u8 = 7;
/// Entry type of XATTR_ITEM entries.
pub const FT_XATTR: u8 = 8;

// Inode flags.
/// Inode flag: no data checksums.
pub const INODE_NODATASUM: u64 = 1 << 0;
/// Inode flag: data is overwritten in place (no copy-on-write).
pub const INODE_NODATACOW: u64 = 1 << 1;
/// Inode flag: read-only.
pub const INODE_READONLY: u64 = 1 << 2;
/// Inode flag: never compress.
pub const INODE_NOCOMPRESS: u64 = 1 << 3;
/// Inode flag: has preallocated extents.
pub const INODE_PREALLOC: u64 = 1 << 4;
/// Inode flag: synchronous writes (chattr +S).
pub const INODE_SYNC: u64 = 1 << 5;
/// Inode flag: immutable (chattr +i).
pub const INODE_IMMUTABLE: u64 = 1 << 6;
/// Inode flag: append only (chattr +a).
pub const INODE_APPEND: u64 = 1 << 7;
/// Inode flag: not dumped (chattr +d).
pub const INODE_NODUMP: u64 = 1 << 8;
/// Inode flag: atime not updated (chattr +A).
pub const INODE_NOATIME: u64 = 1 << 9;
/// Inode flag: synchronous directory updates (chattr +D).
pub const INODE_DIRSYNC: u64 = 1 << 10;
/// Inode flag: compress data (chattr +c).
pub const INODE_COMPRESS: u64 = 1 << 11;
/// Set in a root item's embedded inode once the root item's flags and limit are initialised.
pub const INODE_ROOT_ITEM_INIT: u64 = 1 << 31;

// Root item flags.
/// Root item flag: read-only subvolume.
pub const ROOT_SUBVOL_RDONLY: u64 = 1 << 0;
/// Root item flag: subvolume being deleted.
pub const ROOT_SUBVOL_DEAD: u64 = 1 << 48;

// Superblock flags.
/// Superblock flag: seed device.
pub const SUPER_FLAG_SEEDING: u64 = 1 << 32;
/// Superblock flag: image made by btrfs-image.
pub const SUPER_FLAG_METADUMP: u64 = 1 << 33;
/// Superblock flag: image made by btrfs-image (version 2).
pub const SUPER_FLAG_METADUMP_V2: u64 = 1 << 34;
/// Superblock flag: an fsid change is in progress.
pub const SUPER_FLAG_CHANGING_FSID: u64 = 1 << 35;
/// Superblock flag: a metadata_uuid change is in progress.
pub const SUPER_FLAG_CHANGING_FSID_V2: u64 = 1 << 36;

// Features.
/// compat_ro feature: free space tree.
pub const FEATURE_COMPAT_RO_FREE_SPACE_TREE: u64 = 1 << 0;
/// compat_ro feature: the free space tree is valid.
pub const FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID: u64 = 1 << 1;
/// compat_ro feature: fs-verity.
pub const FEATURE_COMPAT_RO_VERITY: u64 = 1 << 2;
/// compat_ro feature: block group items in their own tree.
pub const FEATURE_COMPAT_RO_BLOCK_GROUP_TREE: u64 = 1 << 3;
/// compat_ro features this reader understands.
pub const FEATURE_COMPAT_RO_SUPP: u64 = FEATURE_COMPAT_RO_FREE_SPACE_TREE
    | FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID
    | FEATURE_COMPAT_RO_VERITY
    | FEATURE_COMPAT_RO_BLOCK_GROUP_TREE;

/// incompat feature: mixed back references (all current filesystems).
pub const FEATURE_INCOMPAT_MIXED_BACKREF: u64 = 1 << 0;
/// incompat feature: a default subvolume was set.
pub const FEATURE_INCOMPAT_DEFAULT_SUBVOL: u64 = 1 << 1;
/// incompat feature: data and metadata share block groups.
pub const FEATURE_INCOMPAT_MIXED_GROUPS: u64 = 1 << 2;
/// incompat feature: LZO compression.
pub const FEATURE_INCOMPAT_COMPRESS_LZO: u64 = 1 << 3;
/// incompat feature: zstd compression.
pub const FEATURE_INCOMPAT_COMPRESS_ZSTD: u64 = 1 << 4;
/// incompat feature: tree blocks larger than a page.
pub const FEATURE_INCOMPAT_BIG_METADATA: u64 = 1 << 5;
/// incompat feature: INODE_EXTREF items (many hard links).
pub const FEATURE_INCOMPAT_EXTENDED_IREF: u64 = 1 << 6;
/// incompat feature: RAID5/RAID6 profiles.
pub const FEATURE_INCOMPAT_RAID56: u64 = 1 << 7;
/// incompat feature: METADATA_ITEM (skinny) extent items for tree blocks.
pub const FEATURE_INCOMPAT_SKINNY_METADATA: u64 = 1 << 8;
/// incompat feature: holes are implicit, not file extent items.
pub const FEATURE_INCOMPAT_NO_HOLES: u64 = 1 << 9;
/// incompat feature: tree blocks carry metadata_uuid instead of fsid.
pub const FEATURE_INCOMPAT_METADATA_UUID: u64 = 1 << 10;
/// incompat feature: RAID1C3/RAID1C4 profiles.
pub const FEATURE_INCOMPAT_RAID1C34: u64 = 1 << 11;
/// incompat feature: zoned devices.
pub const FEATURE_INCOMPAT_ZONED: u64 = 1 << 12;
/// incompat feature: extent tree v2.
pub const FEATURE_INCOMPAT_EXTENT_TREE_V2: u64 = 1 << 13;
/// incompat feature: raid stripe tree.
pub const FEATURE_INCOMPAT_RAID_STRIPE_TREE: u64 = 1 << 14;
/// incompat feature: simple quotas.
pub const FEATURE_INCOMPAT_SIMPLE_QUOTA: u64 = 1 << 16;
/// incompat feature: remap tree.
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

/// Names of compat_ro feature bits, as btrfs-progs prints them.
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
