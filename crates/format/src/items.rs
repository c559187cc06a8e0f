//! Typed decoders for every item type a current kernel writes.

use crate::bytes::{push16, push32, push64, Cursor};
use crate::consts::*;
use crate::key::Key;
use crate::{FormatError, Result};

/// A timestamp (struct btrfs_timespec).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timespec {
    /// Seconds since the Unix epoch.
    pub sec: i64,
    /// Nanoseconds within the second.
    pub nsec: u32,
}

impl Timespec {
    /// On-disk size in bytes.
    pub const SIZE: usize = 12;
    fn parse(c: &mut Cursor<'_>) -> Result<Timespec> {
        Ok(Timespec {
            sec: c.u64()? as i64,
            nsec: c.u32()?,
        })
    }
}

/// An INODE_ITEM body (struct btrfs_inode_item).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeItem {
    /// NFS-style generation: transaction id that created the inode.
    pub generation: u64,
    /// Transaction id that last changed the inode.
    pub transid: u64,
    /// File size in bytes (st_size).
    pub size: u64,
    /// Bytes of data extents the file references (st_blocks in bytes).
    pub nbytes: u64,
    /// Block group allocation hint (unused by current kernels).
    pub block_group: u64,
    /// Number of hard links.
    pub nlink: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// File type and permission bits (st_mode).
    pub mode: u32,
    /// Device number of a character or block device inode.
    pub rdev: u64,
    /// Inode flags (`INODE_*`).
    pub flags: u64,
    /// Change counter for NFS (i_version).
    pub sequence: u64,
    /// Last access time.
    pub atime: Timespec,
    /// Last status change time.
    pub ctime: Timespec,
    /// Last modification time.
    pub mtime: Timespec,
    /// Creation time.
    pub otime: Timespec,
}

impl InodeItem {
    /// On-disk size in bytes.
    pub const SIZE: usize = 160;
    /// Decodes a 160-byte INODE_ITEM body.
    pub fn parse(b: &[u8]) -> Result<InodeItem> {
        let mut c = Cursor::new(b, "inode item");
        let mut i = InodeItem {
            generation: c.u64()?,
            transid: c.u64()?,
            size: c.u64()?,
            nbytes: c.u64()?,
            block_group: c.u64()?,
            nlink: c.u32()?,
            uid: c.u32()?,
            gid: c.u32()?,
            mode: c.u32()?,
            rdev: c.u64()?,
            flags: c.u64()?,
            sequence: c.u64()?,
            ..Default::default()
        };
        c.skip(32)?;
        i.atime = Timespec::parse(&mut c)?;
        i.ctime = Timespec::parse(&mut c)?;
        i.mtime = Timespec::parse(&mut c)?;
        i.otime = Timespec::parse(&mut c)?;
        Ok(i)
    }
}

/// One name of an inode in a directory (INODE_REF key offset = parent directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRef {
    /// Inode number of the parent directory.
    pub parent: u64,
    /// Index of the entry in the parent (its DIR_INDEX key offset).
    pub index: u64,
    /// The name, raw bytes.
    pub name: Vec<u8>,
}

/// INODE_REF body: packed {index u64, name_len u16, name}.
pub fn parse_inode_refs(parent: u64, b: &[u8]) -> Result<Vec<InodeRef>> {
    let mut c = Cursor::new(b, "inode ref");
    let mut out = Vec::new();
    while !c.is_empty() {
        let index = c.u64()?;
        let len = c.u16()? as usize;
        out.push(InodeRef {
            parent,
            index,
            name: c.bytes(len)?.to_vec(),
        });
    }
    Ok(out)
}

/// INODE_EXTREF body: packed {parent u64, index u64, name_len u16, name}.
pub fn parse_inode_extrefs(b: &[u8]) -> Result<Vec<InodeRef>> {
    let mut c = Cursor::new(b, "inode extref");
    let mut out = Vec::new();
    while !c.is_empty() {
        let parent = c.u64()?;
        let index = c.u64()?;
        let len = c.u16()? as usize;
        out.push(InodeRef {
            parent,
            index,
            name: c.bytes(len)?.to_vec(),
        });
    }
    Ok(out)
}

/// A DIR_ITEM / DIR_INDEX / XATTR_ITEM entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    /// Key of the target: its INODE_ITEM, or the ROOT_ITEM of a subvolume (zeros for xattrs).
    pub location: Key,
    /// Transaction id that created the entry.
    pub transid: u64,
    /// Entry type (`FT_*`).
    pub ty: u8,
    /// Entry or xattr name, raw bytes.
    pub name: Vec<u8>,
    /// xattr value (empty for directory entries).
    pub data: Vec<u8>,
}

/// Size of struct btrfs_dir_item, before the name and data.
pub const DIR_ITEM_HEADER_SIZE: usize = 30;

/// Decodes the packed entries of a DIR_ITEM / DIR_INDEX / XATTR_ITEM body.
pub fn parse_dir_items(b: &[u8]) -> Result<Vec<DirItem>> {
    let mut c = Cursor::new(b, "dir item");
    let mut out = Vec::new();
    while !c.is_empty() {
        let location = Key::parse(&mut c)?;
        let transid = c.u64()?;
        let data_len = c.u16()? as usize;
        let name_len = c.u16()? as usize;
        let ty = c.u8()?;
        let name = c.bytes(name_len)?.to_vec();
        let data = c.bytes(data_len)?.to_vec();
        out.push(DirItem {
            location,
            transid,
            ty,
            name,
            data,
        });
    }
    Ok(out)
}

/// The type-specific part of a file extent item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileExtentBody {
    /// Inline data (possibly compressed) stored in the item itself.
    Inline {
        /// The payload as stored (compressed if `compression` is set).
        data: Vec<u8>,
    },
    /// Regular or prealloc extent. disk_bytenr 0 means a hole.
    Regular {
        /// Logical address of the extent on disk (0: a hole).
        disk_bytenr: u64,
        /// Size of the extent on disk (compressed size if compressed).
        disk_num_bytes: u64,
        /// Offset into the uncompressed extent where this file range starts.
        offset: u64,
        /// Bytes of the file this item covers.
        num_bytes: u64,
    },
}

/// An EXTENT_DATA body (struct btrfs_file_extent_item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileExtentItem {
    /// Transaction id that created the extent.
    pub generation: u64,
    /// Size of the extent's data uncompressed.
    pub ram_bytes: u64,
    /// Compression type (0 none, 1 zlib, 2 lzo, 3 zstd).
    pub compression: u8,
    /// Encryption type (always 0).
    pub encryption: u8,
    /// Other encoding (reserved, always 0).
    pub other_encoding: u16,
    /// Extent type (`FILE_EXTENT_*`).
    pub ty: u8,
    /// Inline data or the on-disk extent.
    pub body: FileExtentBody,
}

/// Offset of inline data in the item (the fixed header's size).
pub const FILE_EXTENT_INLINE_DATA_START: usize = 21;
/// Size of a regular or prealloc file extent item.
pub const FILE_EXTENT_SIZE: usize = 53;

impl FileExtentItem {
    /// Decodes an EXTENT_DATA body.
    pub fn parse(b: &[u8]) -> Result<FileExtentItem> {
        let mut c = Cursor::new(b, "file extent item");
        let generation = c.u64()?;
        let ram_bytes = c.u64()?;
        let compression = c.u8()?;
        let encryption = c.u8()?;
        let other_encoding = c.u16()?;
        let ty = c.u8()?;
        let body = match ty {
            FILE_EXTENT_INLINE => FileExtentBody::Inline {
                data: b[FILE_EXTENT_INLINE_DATA_START..].to_vec(),
            },
            FILE_EXTENT_REG | FILE_EXTENT_PREALLOC => {
                if b.len() != FILE_EXTENT_SIZE {
                    return Err(FormatError::invalid(
                        "file extent item",
                        format!("regular extent item size {} != 53", b.len()),
                    ));
                }
                FileExtentBody::Regular {
                    disk_bytenr: c.u64()?,
                    disk_num_bytes: c.u64()?,
                    offset: c.u64()?,
                    num_bytes: c.u64()?,
                }
            }
            t => {
                return Err(FormatError::invalid(
                    "file extent item",
                    format!("unknown extent type {t}"),
                ))
            }
        };
        Ok(FileExtentItem {
            generation,
            ram_bytes,
            compression,
            encryption,
            other_encoding,
            ty,
            body,
        })
    }
}

/// A ROOT_ITEM body (struct btrfs_root_item).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootItem {
    /// Embedded inode item (mostly unused; see [`INODE_ROOT_ITEM_INIT`]).
    pub inode: InodeItem,
    /// Transaction id of the tree's last commit.
    pub generation: u64,
    /// Object id of the tree's root directory (256 for subvolumes).
    pub root_dirid: u64,
    /// Logical address of the tree's root block.
    pub bytenr: u64,
    /// Byte limit (unused).
    pub byte_limit: u64,
    /// Bytes of tree blocks the tree uses.
    pub bytes_used: u64,
    /// Transaction id of the latest snapshot of this tree.
    pub last_snapshot: u64,
    /// Root flags (`ROOT_SUBVOL_*`).
    pub flags: u64,
    /// Reference count (0 once the subvolume is deleted).
    pub refs: u32,
    /// Key where an interrupted subvolume deletion resumes.
    pub drop_progress: Key,
    /// Tree level of `drop_progress`.
    pub drop_level: u8,
    /// Level of the root block.
    pub level: u8,
    /// Fields below exist only in the 439-byte item (generation_v2 == generation).
    pub generation_v2: u64,
    /// UUID of the subvolume.
    pub uuid: [u8; 16],
    /// UUID of the subvolume this is a snapshot of.
    pub parent_uuid: [u8; 16],
    /// UUID of the sent subvolume this one was received from.
    pub received_uuid: [u8; 16],
    /// Transaction id of the last change to the subvolume.
    pub ctransid: u64,
    /// Transaction id that created the subvolume.
    pub otransid: u64,
    /// Transaction id of the source when sent (received subvolumes).
    pub stransid: u64,
    /// Transaction id when received (received subvolumes).
    pub rtransid: u64,
    /// Time of the last change to the subvolume.
    pub ctime: Timespec,
    /// Creation time.
    pub otime: Timespec,
    /// Time the source was sent (received subvolumes).
    pub stime: Timespec,
    /// Time the subvolume was received.
    pub rtime: Timespec,
}

impl RootItem {
    /// Size of the current (v2) root item.
    pub const SIZE: usize = 439;

    /// The kernel's btrfs_check_and_init_root_item: a subvolume root item whose
    /// embedded inode lacks [`INODE_ROOT_ITEM_INIT`] comes from a writer that left
    /// `flags` and `byte_limit` uninitialised (the oldest kernels), so both are
    /// taken as 0 and the mark is set. The kernel applies it to every subvolume root
    /// it loads and to a snapshot's copy of its source's item, then writes the
    /// item back with the mark: a read-only flag without it is lost.
    pub fn check_and_init(&mut self) {
        if self.inode.flags & INODE_ROOT_ITEM_INIT == 0 {
            self.inode.flags |= INODE_ROOT_ITEM_INIT;
            self.flags = 0;
            self.byte_limit = 0;
        }
    }
    /// Size of the legacy root item (before generation_v2).
    pub const LEGACY_SIZE: usize = 239;
    /// Decodes a ROOT_ITEM body, legacy or v2.
    pub fn parse(b: &[u8]) -> Result<RootItem> {
        if b.len() < Self::LEGACY_SIZE {
            return Err(FormatError::invalid(
                "root item",
                format!("size {} below the legacy {}", b.len(), Self::LEGACY_SIZE),
            ));
        }
        let mut c = Cursor::new(b, "root item");
        let mut r = RootItem {
            inode: InodeItem::parse(c.bytes(InodeItem::SIZE)?)?,
            generation: c.u64()?,
            root_dirid: c.u64()?,
            bytenr: c.u64()?,
            byte_limit: c.u64()?,
            bytes_used: c.u64()?,
            last_snapshot: c.u64()?,
            flags: c.u64()?,
            refs: c.u32()?,
            drop_progress: Key::parse(&mut c)?,
            drop_level: c.u8()?,
            level: c.u8()?,
            ..Default::default()
        };
        if b.len() >= Self::SIZE {
            r.generation_v2 = c.u64()?;
            r.uuid = c.array()?;
            r.parent_uuid = c.array()?;
            r.received_uuid = c.array()?;
            r.ctransid = c.u64()?;
            r.otransid = c.u64()?;
            r.stransid = c.u64()?;
            r.rtransid = c.u64()?;
            r.ctime = Timespec::parse(&mut c)?;
            r.otime = Timespec::parse(&mut c)?;
            r.stime = Timespec::parse(&mut c)?;
            r.rtime = Timespec::parse(&mut c)?;
        }
        Ok(r)
    }
    /// Whether the v2 fields are valid (generation_v2 matches generation).
    pub fn is_v2(&self) -> bool {
        self.generation_v2 == self.generation
    }
}

/// ROOT_REF (parent, 156, child) and ROOT_BACKREF (child, 144, parent) body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootRef {
    /// Directory (in the parent subvolume) holding the subvolume's entry.
    pub dirid: u64,
    /// Index of that entry in the directory (its DIR_INDEX key offset).
    pub sequence: u64,
    /// Name of the entry, raw bytes.
    pub name: Vec<u8>,
}

impl RootRef {
    /// Decodes a ROOT_REF / ROOT_BACKREF body.
    pub fn parse(b: &[u8]) -> Result<RootRef> {
        let mut c = Cursor::new(b, "root ref");
        let dirid = c.u64()?;
        let sequence = c.u64()?;
        let len = c.u16()? as usize;
        Ok(RootRef {
            dirid,
            sequence,
            name: c.bytes(len)?.to_vec(),
        })
    }
}

/// A back reference stored inline in an extent item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InlineRef {
    /// TREE_BLOCK_REF: a tree block referenced by its tree.
    TreeBlock {
        /// Object id of the tree.
        root: u64,
    },
    /// SHARED_BLOCK_REF: a tree block referenced by a parent block.
    SharedBlock {
        /// Logical address of the parent block.
        parent: u64,
    },
    /// EXTENT_DATA_REF: data referenced by file extents of one inode.
    ExtentData {
        /// Subvolume tree id.
        root: u64,
        /// Inode number.
        objectid: u64,
        /// File offset of the extent's start (file extent key offset minus its `offset`).
        offset: u64,
        /// Number of references.
        count: u32,
    },
    /// SHARED_DATA_REF: data referenced by file extents of one leaf.
    SharedData {
        /// Logical address of the leaf.
        parent: u64,
        /// Number of references.
        count: u32,
    },
    /// EXTENT_OWNER_REF: the root owning a data extent (simple quotas).
    Owner {
        /// Object id of the owning tree.
        root: u64,
    },
}

impl InlineRef {
    /// References this entry contributes to the extent item's refs.
    pub fn count(&self) -> u64 {
        match self {
            InlineRef::TreeBlock { .. } | InlineRef::SharedBlock { .. } => 1,
            InlineRef::ExtentData { count, .. } | InlineRef::SharedData { count, .. } => {
                *count as u64
            }
            InlineRef::Owner { .. } => 0,
        }
    }
}

/// An EXTENT_ITEM or METADATA_ITEM body (struct btrfs_extent_item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentItem {
    /// Total references to the extent.
    pub refs: u64,
    /// Transaction id that allocated the extent.
    pub generation: u64,
    /// Extent flags (`EXTENT_FLAG_*`, [`BLOCK_FLAG_FULL_BACKREF`]).
    pub flags: u64,
    /// Non-skinny tree block: first key of the block and its level.
    pub tree_block_info: Option<(Key, u8)>,
    /// Back references stored in the item.
    pub inline_refs: Vec<InlineRef>,
}

impl ExtentItem {
    /// Parses EXTENT_ITEM or METADATA_ITEM (skinny: no tree_block_info) bodies.
    pub fn parse(key_ty: u8, b: &[u8]) -> Result<ExtentItem> {
        let mut c = Cursor::new(b, "extent item");
        let refs = c.u64()?;
        let generation = c.u64()?;
        let flags = c.u64()?;
        let tree_block_info = if key_ty == EXTENT_ITEM_KEY && flags & EXTENT_FLAG_TREE_BLOCK != 0 {
            let k = Key::parse(&mut c)?;
            Some((k, c.u8()?))
        } else {
            None
        };
        let mut inline_refs = Vec::new();
        while !c.is_empty() {
            let ty = c.u8()?;
            let r = match ty {
                TREE_BLOCK_REF_KEY => InlineRef::TreeBlock { root: c.u64()? },
                SHARED_BLOCK_REF_KEY => InlineRef::SharedBlock { parent: c.u64()? },
                EXTENT_OWNER_REF_KEY => InlineRef::Owner { root: c.u64()? },
                EXTENT_DATA_REF_KEY => InlineRef::ExtentData {
                    root: c.u64()?,
                    objectid: c.u64()?,
                    offset: c.u64()?,
                    count: c.u32()?,
                },
                SHARED_DATA_REF_KEY => InlineRef::SharedData {
                    parent: c.u64()?,
                    count: c.u32()?,
                },
                t => {
                    return Err(FormatError::invalid(
                        "extent item",
                        format!("unknown inline ref type {t} at offset {}", c.pos() - 1),
                    ))
                }
            };
            inline_refs.push(r);
        }
        Ok(ExtentItem {
            refs,
            generation,
            flags,
            tree_block_info,
            inline_refs,
        })
    }
}

/// Keyed EXTENT_DATA_REF body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentDataRef {
    /// Subvolume tree id.
    pub root: u64,
    /// Inode number.
    pub objectid: u64,
    /// File offset of the extent's start (file extent key offset minus its `offset`).
    pub offset: u64,
    /// Number of references.
    pub count: u32,
}

impl ExtentDataRef {
    /// Decodes a keyed EXTENT_DATA_REF body.
    pub fn parse(b: &[u8]) -> Result<ExtentDataRef> {
        let mut c = Cursor::new(b, "extent data ref");
        Ok(ExtentDataRef {
            root: c.u64()?,
            objectid: c.u64()?,
            offset: c.u64()?,
            count: c.u32()?,
        })
    }
}

/// A BLOCK_GROUP_ITEM body (struct btrfs_block_group_item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockGroupItem {
    /// Bytes used in the block group.
    pub used: u64,
    /// Object id of the chunk item ([`FIRST_CHUNK_TREE_OBJECTID`]).
    pub chunk_objectid: u64,
    /// Type and profile flags (`BLOCK_GROUP_*`).
    pub flags: u64,
}

impl BlockGroupItem {
    /// Decodes a BLOCK_GROUP_ITEM body.
    pub fn parse(b: &[u8]) -> Result<BlockGroupItem> {
        let mut c = Cursor::new(b, "block group item");
        Ok(BlockGroupItem {
            used: c.u64()?,
            chunk_objectid: c.u64()?,
            flags: c.u64()?,
        })
    }
}

/// A DEV_ITEM body (struct btrfs_dev_item), also embedded in the superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevItem {
    /// Device id within the filesystem.
    pub devid: u64,
    /// Size of the device in bytes.
    pub total_bytes: u64,
    /// Bytes allocated to device extents.
    pub bytes_used: u64,
    /// Optimal I/O alignment.
    pub io_align: u32,
    /// Optimal I/O width.
    pub io_width: u32,
    /// Minimal I/O size.
    pub sector_size: u32,
    /// Device type (unused).
    pub ty: u64,
    /// Expected generation of the device (unused).
    pub generation: u64,
    /// Start of the usable area on the device (unused).
    pub start_offset: u64,
    /// Allocation group (unused).
    pub dev_group: u32,
    /// Seek speed hint, 0-100 (unused).
    pub seek_speed: u8,
    /// Bandwidth hint, 0-100 (unused).
    pub bandwidth: u8,
    /// UUID of the device.
    pub uuid: [u8; 16],
    /// fsid of the filesystem owning the device.
    pub fsid: [u8; 16],
}

impl DevItem {
    /// On-disk size in bytes.
    pub const SIZE: usize = 98;
    /// Decodes a DEV_ITEM body.
    pub fn parse(b: &[u8]) -> Result<DevItem> {
        let mut c = Cursor::new(b, "dev item");
        Ok(DevItem {
            devid: c.u64()?,
            total_bytes: c.u64()?,
            bytes_used: c.u64()?,
            io_align: c.u32()?,
            io_width: c.u32()?,
            sector_size: c.u32()?,
            ty: c.u64()?,
            generation: c.u64()?,
            start_offset: c.u64()?,
            dev_group: c.u32()?,
            seek_speed: c.u8()?,
            bandwidth: c.u8()?,
            uuid: c.array()?,
            fsid: c.array()?,
        })
    }
}

/// One stripe of a chunk (struct btrfs_stripe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripe {
    /// Device id.
    pub devid: u64,
    /// Physical byte offset on the device.
    pub offset: u64,
    /// UUID of the device.
    pub dev_uuid: [u8; 16],
}

/// A CHUNK_ITEM body (struct btrfs_chunk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Logical size of the chunk in bytes.
    pub length: u64,
    /// Object id of the tree referencing the chunk (the extent tree).
    pub owner: u64,
    /// Stripe length.
    pub stripe_len: u64,
    /// Type and profile flags (`BLOCK_GROUP_*`).
    pub ty: u64,
    /// Optimal I/O alignment.
    pub io_align: u32,
    /// Optimal I/O width.
    pub io_width: u32,
    /// Minimal I/O size.
    pub sector_size: u32,
    /// Number of stripes as stored.
    pub num_stripes: u16,
    /// Sub-stripes (2 for RAID10, else 1).
    pub sub_stripes: u16,
    /// The stripes.
    pub stripes: Vec<Stripe>,
}

/// Size of struct btrfs_chunk before its stripes.
pub const CHUNK_BASE_SIZE: usize = 48;
/// Size of a struct btrfs_stripe.
pub const STRIPE_SIZE: usize = 32;

impl Chunk {
    /// Decodes a CHUNK_ITEM body.
    pub fn parse(b: &[u8]) -> Result<Chunk> {
        let mut c = Cursor::new(b, "chunk item");
        let length = c.u64()?;
        let owner = c.u64()?;
        let stripe_len = c.u64()?;
        let ty = c.u64()?;
        let io_align = c.u32()?;
        let io_width = c.u32()?;
        let sector_size = c.u32()?;
        let num_stripes = c.u16()?;
        let sub_stripes = c.u16()?;
        if num_stripes == 0 {
            return Err(FormatError::invalid("chunk item", "num_stripes is 0"));
        }
        let mut stripes = Vec::with_capacity(num_stripes as usize);
        for _ in 0..num_stripes {
            stripes.push(Stripe {
                devid: c.u64()?,
                offset: c.u64()?,
                dev_uuid: c.array()?,
            });
        }
        Ok(Chunk {
            length,
            owner,
            stripe_len,
            ty,
            io_align,
            io_width,
            sector_size,
            num_stripes,
            sub_stripes,
            stripes,
        })
    }
    /// Size of the item with its stripes.
    pub fn item_size(&self) -> usize {
        CHUNK_BASE_SIZE + STRIPE_SIZE * self.stripes.len()
    }
}

/// A DEV_EXTENT body (struct btrfs_dev_extent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevExtent {
    /// Object id of the chunk tree ([`CHUNK_TREE_OBJECTID`]).
    pub chunk_tree: u64,
    /// Object id of the chunk item ([`FIRST_CHUNK_TREE_OBJECTID`]).
    pub chunk_objectid: u64,
    /// Logical start of the chunk this extent backs.
    pub chunk_offset: u64,
    /// Length of the extent on the device.
    pub length: u64,
    /// UUID of the chunk tree.
    pub chunk_tree_uuid: [u8; 16],
}

impl DevExtent {
    /// Decodes a DEV_EXTENT body.
    pub fn parse(b: &[u8]) -> Result<DevExtent> {
        let mut c = Cursor::new(b, "dev extent");
        Ok(DevExtent {
            chunk_tree: c.u64()?,
            chunk_objectid: c.u64()?,
            chunk_offset: c.u64()?,
            length: c.u64()?,
            chunk_tree_uuid: c.array()?,
        })
    }
}

/// A FREE_SPACE_INFO body (struct btrfs_free_space_info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeSpaceInfo {
    /// Number of free extents in the block group.
    pub extent_count: u32,
    /// Flags (1: the block group uses bitmaps).
    pub flags: u32,
}

/// A QGROUP_STATUS body (struct btrfs_qgroup_status_item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QgroupStatus {
    /// Format version.
    pub version: u64,
    /// Transaction id of the last update.
    pub generation: u64,
    /// Status flags (on, rescan, inconsistent, simple mode).
    pub flags: u64,
    /// Rescan progress: the next logical address to scan.
    pub rescan: u64,
    /// Transaction id quotas were enabled in (simple quotas; absent in older items).
    pub enable_gen: Option<u64>,
}

/// A QGROUP_INFO body (struct btrfs_qgroup_info_item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QgroupInfo {
    /// Transaction id of the last update.
    pub generation: u64,
    /// Referenced bytes.
    pub rfer: u64,
    /// Referenced bytes, compressed.
    pub rfer_cmpr: u64,
    /// Exclusive bytes.
    pub excl: u64,
    /// Exclusive bytes, compressed.
    pub excl_cmpr: u64,
}

/// A QGROUP_LIMIT body (struct btrfs_qgroup_limit_item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QgroupLimit {
    /// Which limits are set.
    pub flags: u64,
    /// Limit on referenced bytes.
    pub max_rfer: u64,
    /// Limit on exclusive bytes.
    pub max_excl: u64,
    /// Reserved referenced bytes.
    pub rsv_rfer: u64,
    /// Reserved exclusive bytes.
    pub rsv_excl: u64,
}

/// A DEV_REPLACE body (struct btrfs_dev_replace_item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevReplaceItem {
    /// Device id being replaced.
    pub src_devid: u64,
    /// Start of the source range being copied (everything before it is done).
    pub cursor_left: u64,
    /// End of the source range being copied.
    pub cursor_right: u64,
    /// Whether reads use the source device (0 always, 1 avoid).
    pub cont_reading_from_srcdev_mode: u64,
    /// Replace state (never started, started, finished, canceled, suspended).
    pub replace_state: u64,
    /// Start time, seconds since the epoch.
    pub time_started: u64,
    /// Stop time, seconds since the epoch.
    pub time_stopped: u64,
    /// Write errors seen.
    pub num_write_errors: u64,
    /// Uncorrectable read errors seen.
    pub num_uncorrectable_read_errors: u64,
}

/// Every item decoded by its key type; unknown or opaque items keep their bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
// Decoded items are built for display and checks, one at a time; boxing the large
// variants would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Item {
    /// INODE_ITEM.
    Inode(InodeItem),
    /// INODE_REF entries.
    InodeRef(Vec<InodeRef>),
    /// INODE_EXTREF entries.
    InodeExtref(Vec<InodeRef>),
    /// DIR_ITEM or DIR_INDEX entries.
    DirItems(Vec<DirItem>),
    /// XATTR_ITEM entries.
    Xattrs(Vec<DirItem>),
    /// EXTENT_DATA.
    FileExtent(FileExtentItem),
    /// EXTENT_CSUM: packed checksums.
    Csum(Vec<u8>),
    /// ROOT_ITEM.
    Root(RootItem),
    /// ROOT_REF or ROOT_BACKREF.
    RootRef(RootRef),
    /// EXTENT_ITEM or METADATA_ITEM.
    Extent(ExtentItem),
    /// Keyed TREE_BLOCK_REF (no body).
    TreeBlockRef,
    /// Keyed SHARED_BLOCK_REF (no body).
    SharedBlockRef,
    /// Keyed EXTENT_DATA_REF.
    ExtentDataRef(ExtentDataRef),
    /// Keyed SHARED_DATA_REF.
    SharedDataRef {
        /// Number of references from the parent leaf.
        count: u32,
    },
    /// Keyed EXTENT_OWNER_REF.
    ExtentOwnerRef {
        /// Object id of the owning tree.
        root: u64,
    },
    /// BLOCK_GROUP_ITEM.
    BlockGroup(BlockGroupItem),
    /// FREE_SPACE_INFO.
    FreeSpaceInfo(FreeSpaceInfo),
    /// FREE_SPACE_EXTENT (no body; the key holds the range).
    FreeSpaceExtent,
    /// FREE_SPACE_BITMAP: the bitmap bytes.
    FreeSpaceBitmap(Vec<u8>),
    /// DEV_EXTENT.
    DevExtent(DevExtent),
    /// DEV_ITEM.
    Dev(DevItem),
    /// CHUNK_ITEM.
    Chunk(Chunk),
    /// QGROUP_STATUS.
    QgroupStatus(QgroupStatus),
    /// QGROUP_INFO.
    QgroupInfo(QgroupInfo),
    /// QGROUP_LIMIT.
    QgroupLimit(QgroupLimit),
    /// QGROUP_RELATION (no body).
    QgroupRelation,
    /// Device statistics counters (PERSISTENT_ITEM of [`DEV_STATS_OBJECTID`]).
    DevStats(Vec<u64>),
    /// DEV_REPLACE.
    DevReplace(DevReplaceItem),
    /// UUID tree item: subvolume ids.
    UuidList(Vec<u64>),
    /// ORPHAN_ITEM (no body).
    Orphan,
    /// DIR_LOG_ITEM or DIR_LOG_INDEX.
    DirLogIndex {
        /// End of the logged range (the key offset is its start).
        end: u64,
    },
    /// Any other item: its body bytes.
    Raw(Vec<u8>),
}

fn u64_list(b: &[u8], what: &'static str) -> Result<Vec<u64>> {
    if !b.len().is_multiple_of(8) {
        return Err(FormatError::invalid(
            what,
            format!("size {} not a multiple of 8", b.len()),
        ));
    }
    let mut c = Cursor::new(b, what);
    let mut v = Vec::with_capacity(b.len() / 8);
    while !c.is_empty() {
        v.push(c.u64()?);
    }
    Ok(v)
}

/// Decodes an item body by its key.
pub fn parse_item(key: &Key, b: &[u8]) -> Result<Item> {
    Ok(match key.ty {
        INODE_ITEM_KEY => Item::Inode(InodeItem::parse(b)?),
        INODE_REF_KEY => Item::InodeRef(parse_inode_refs(key.offset, b)?),
        INODE_EXTREF_KEY => Item::InodeExtref(parse_inode_extrefs(b)?),
        DIR_ITEM_KEY | DIR_INDEX_KEY => Item::DirItems(parse_dir_items(b)?),
        XATTR_ITEM_KEY => Item::Xattrs(parse_dir_items(b)?),
        EXTENT_DATA_KEY => Item::FileExtent(FileExtentItem::parse(b)?),
        EXTENT_CSUM_KEY => Item::Csum(b.to_vec()),
        ROOT_ITEM_KEY => Item::Root(RootItem::parse(b)?),
        ROOT_REF_KEY | ROOT_BACKREF_KEY => Item::RootRef(RootRef::parse(b)?),
        EXTENT_ITEM_KEY | METADATA_ITEM_KEY => Item::Extent(ExtentItem::parse(key.ty, b)?),
        TREE_BLOCK_REF_KEY => Item::TreeBlockRef,
        SHARED_BLOCK_REF_KEY => Item::SharedBlockRef,
        EXTENT_DATA_REF_KEY => Item::ExtentDataRef(ExtentDataRef::parse(b)?),
        SHARED_DATA_REF_KEY => Item::SharedDataRef {
            count: Cursor::new(b, "shared data ref").u32()?,
        },
        EXTENT_OWNER_REF_KEY => Item::ExtentOwnerRef {
            root: Cursor::new(b, "extent owner ref").u64()?,
        },
        BLOCK_GROUP_ITEM_KEY => Item::BlockGroup(BlockGroupItem::parse(b)?),
        FREE_SPACE_INFO_KEY => {
            let mut c = Cursor::new(b, "free space info");
            Item::FreeSpaceInfo(FreeSpaceInfo {
                extent_count: c.u32()?,
                flags: c.u32()?,
            })
        }
        FREE_SPACE_EXTENT_KEY => Item::FreeSpaceExtent,
        FREE_SPACE_BITMAP_KEY => Item::FreeSpaceBitmap(b.to_vec()),
        DEV_EXTENT_KEY => Item::DevExtent(DevExtent::parse(b)?),
        DEV_ITEM_KEY => Item::Dev(DevItem::parse(b)?),
        CHUNK_ITEM_KEY => Item::Chunk(Chunk::parse(b)?),
        QGROUP_STATUS_KEY => {
            let mut c = Cursor::new(b, "qgroup status");
            Item::QgroupStatus(QgroupStatus {
                version: c.u64()?,
                generation: c.u64()?,
                flags: c.u64()?,
                rescan: c.u64()?,
                enable_gen: if c.remaining() >= 8 {
                    Some(c.u64()?)
                } else {
                    None
                },
            })
        }
        QGROUP_INFO_KEY => {
            let mut c = Cursor::new(b, "qgroup info");
            Item::QgroupInfo(QgroupInfo {
                generation: c.u64()?,
                rfer: c.u64()?,
                rfer_cmpr: c.u64()?,
                excl: c.u64()?,
                excl_cmpr: c.u64()?,
            })
        }
        QGROUP_LIMIT_KEY => {
            let mut c = Cursor::new(b, "qgroup limit");
            Item::QgroupLimit(QgroupLimit {
                flags: c.u64()?,
                max_rfer: c.u64()?,
                max_excl: c.u64()?,
                rsv_rfer: c.u64()?,
                rsv_excl: c.u64()?,
            })
        }
        QGROUP_RELATION_KEY => Item::QgroupRelation,
        PERSISTENT_ITEM_KEY if key.objectid == DEV_STATS_OBJECTID => {
            Item::DevStats(u64_list(b, "dev stats")?)
        }
        DEV_REPLACE_KEY => {
            let mut c = Cursor::new(b, "dev replace");
            Item::DevReplace(DevReplaceItem {
                src_devid: c.u64()?,
                cursor_left: c.u64()?,
                cursor_right: c.u64()?,
                cont_reading_from_srcdev_mode: c.u64()?,
                replace_state: c.u64()?,
                time_started: c.u64()?,
                time_stopped: c.u64()?,
                num_write_errors: c.u64()?,
                num_uncorrectable_read_errors: c.u64()?,
            })
        }
        UUID_KEY_SUBVOL | UUID_KEY_RECEIVED_SUBVOL => Item::UuidList(u64_list(b, "uuid item")?),
        ORPHAN_ITEM_KEY => Item::Orphan,
        DIR_LOG_INDEX_KEY | DIR_LOG_ITEM_KEY => Item::DirLogIndex {
            end: Cursor::new(b, "dir log item").u64()?,
        },
        _ => Item::Raw(b.to_vec()),
    })
}

// ---------------------------------------------------------------------------------------
// Serializers: the exact inverse of the parsers above (little endian, packed, the kernel's
// layout). Bytes a parser skips are written as zeros.

/// `name` and its length as the u16 the format stores. Names longer than u16::MAX are
/// cut to that length so the length field always matches the bytes written (the kernel
/// never writes names longer than 255 bytes; xattr values are bounded by the leaf size).
fn len16(name: &[u8]) -> (u16, &[u8]) {
    match u16::try_from(name.len()) {
        Ok(n) => (n, name),
        Err(_) => (u16::MAX, &name[..u16::MAX as usize]),
    }
}

impl Timespec {
    /// Appends the 12-byte {sec i64, nsec u32}.
    pub fn write(&self, out: &mut Vec<u8>) {
        push64(out, self.sec as u64);
        push32(out, self.nsec);
    }
}

impl InodeItem {
    /// Appends the 160-byte inode item (the 32 reserved bytes before atime are zeros).
    pub fn write(&self, out: &mut Vec<u8>) {
        push64(out, self.generation);
        push64(out, self.transid);
        push64(out, self.size);
        push64(out, self.nbytes);
        push64(out, self.block_group);
        push32(out, self.nlink);
        push32(out, self.uid);
        push32(out, self.gid);
        push32(out, self.mode);
        push64(out, self.rdev);
        push64(out, self.flags);
        push64(out, self.sequence);
        out.extend_from_slice(&[0u8; 32]);
        self.atime.write(out);
        self.ctime.write(out);
        self.mtime.write(out);
        self.otime.write(out);
    }
    /// The 160-byte INODE_ITEM body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.write(&mut out);
        out
    }
}

/// One INODE_REF entry: {index u64, name_len u16, name}. An INODE_REF item holds one or
/// more of these back to back (key offset = parent directory).
pub fn inode_ref_bytes(index: u64, name: &[u8]) -> Vec<u8> {
    let (len, name) = len16(name);
    let mut out = Vec::with_capacity(10 + name.len());
    push64(&mut out, index);
    push16(&mut out, len);
    out.extend_from_slice(name);
    out
}

/// One INODE_EXTREF entry: {parent_objectid u64, index u64, name_len u16, name}.
pub fn inode_extref_bytes(parent: u64, index: u64, name: &[u8]) -> Vec<u8> {
    let (len, name) = len16(name);
    let mut out = Vec::with_capacity(18 + name.len());
    push64(&mut out, parent);
    push64(&mut out, index);
    push16(&mut out, len);
    out.extend_from_slice(name);
    out
}

/// One DIR_ITEM / DIR_INDEX / XATTR_ITEM entry: {location key, transid u64, data_len u16,
/// name_len u16, type u8, name, data}. `data` is the xattr value (empty for dir entries).
pub fn dir_item_bytes(location: &Key, transid: u64, data: &[u8], name: &[u8], ty: u8) -> Vec<u8> {
    let (name_len, name) = len16(name);
    let (data_len, data) = len16(data);
    let mut out = Vec::with_capacity(DIR_ITEM_HEADER_SIZE + name.len() + data.len());
    out.extend_from_slice(&location.to_bytes());
    push64(&mut out, transid);
    push16(&mut out, data_len);
    push16(&mut out, name_len);
    out.push(ty);
    out.extend_from_slice(name);
    out.extend_from_slice(data);
    out
}

impl DirItem {
    /// This entry's bytes; see [`dir_item_bytes`].
    pub fn to_bytes(&self) -> Vec<u8> {
        dir_item_bytes(
            &self.location,
            self.transid,
            &self.data,
            &self.name,
            self.ty,
        )
    }
}

impl FileExtentItem {
    /// The EXTENT_DATA body: the 21-byte header then either the inline data or the
    /// 32 bytes of a regular/prealloc extent (53 in all). The layout follows `body`;
    /// `ty` is written as is.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FILE_EXTENT_SIZE);
        push64(&mut out, self.generation);
        push64(&mut out, self.ram_bytes);
        out.push(self.compression);
        out.push(self.encryption);
        push16(&mut out, self.other_encoding);
        out.push(self.ty);
        match &self.body {
            FileExtentBody::Inline { data } => out.extend_from_slice(data),
            FileExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            } => {
                push64(&mut out, *disk_bytenr);
                push64(&mut out, *disk_num_bytes);
                push64(&mut out, *offset);
                push64(&mut out, *num_bytes);
            }
        }
        out
    }
}

impl RootItem {
    /// The full 439-byte (v2) ROOT_ITEM body; the 64 reserved bytes at the end are zeros.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.inode.write(&mut out);
        push64(&mut out, self.generation);
        push64(&mut out, self.root_dirid);
        push64(&mut out, self.bytenr);
        push64(&mut out, self.byte_limit);
        push64(&mut out, self.bytes_used);
        push64(&mut out, self.last_snapshot);
        push64(&mut out, self.flags);
        push32(&mut out, self.refs);
        out.extend_from_slice(&self.drop_progress.to_bytes());
        out.push(self.drop_level);
        out.push(self.level);
        push64(&mut out, self.generation_v2);
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&self.parent_uuid);
        out.extend_from_slice(&self.received_uuid);
        push64(&mut out, self.ctransid);
        push64(&mut out, self.otransid);
        push64(&mut out, self.stransid);
        push64(&mut out, self.rtransid);
        self.ctime.write(&mut out);
        self.otime.write(&mut out);
        self.stime.write(&mut out);
        self.rtime.write(&mut out);
        out.resize(Self::SIZE, 0);
        out
    }
}

impl RootRef {
    /// ROOT_REF / ROOT_BACKREF body: {dirid u64, sequence u64, name_len u16, name}.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (len, name) = len16(&self.name);
        let mut out = Vec::with_capacity(18 + name.len());
        push64(&mut out, self.dirid);
        push64(&mut out, self.sequence);
        push16(&mut out, len);
        out.extend_from_slice(name);
        out
    }
}

impl InlineRef {
    /// Appends this inline back reference: its type byte, then its body.
    pub fn write(&self, out: &mut Vec<u8>) {
        match *self {
            InlineRef::TreeBlock { root } => {
                out.push(TREE_BLOCK_REF_KEY);
                push64(out, root);
            }
            InlineRef::SharedBlock { parent } => {
                out.push(SHARED_BLOCK_REF_KEY);
                push64(out, parent);
            }
            InlineRef::ExtentData {
                root,
                objectid,
                offset,
                count,
            } => {
                out.push(EXTENT_DATA_REF_KEY);
                push64(out, root);
                push64(out, objectid);
                push64(out, offset);
                push32(out, count);
            }
            InlineRef::SharedData { parent, count } => {
                out.push(SHARED_DATA_REF_KEY);
                push64(out, parent);
                push32(out, count);
            }
            InlineRef::Owner { root } => {
                out.push(EXTENT_OWNER_REF_KEY);
                push64(out, root);
            }
        }
    }
}

impl ExtentItem {
    /// EXTENT_ITEM / METADATA_ITEM body: {refs, generation, flags}, the tree block info
    /// (key + level) when present, then the inline refs in the given order (the kernel
    /// keeps them sorted by type, then by hash/parent). `tree_block_info` is written
    /// whenever it is `Some`: leave it `None` for METADATA_ITEM and data extents.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 18 + 29 * self.inline_refs.len());
        push64(&mut out, self.refs);
        push64(&mut out, self.generation);
        push64(&mut out, self.flags);
        if let Some((key, level)) = &self.tree_block_info {
            out.extend_from_slice(&key.to_bytes());
            out.push(*level);
        }
        for r in &self.inline_refs {
            r.write(&mut out);
        }
        out
    }
}

impl ExtentDataRef {
    /// Keyed EXTENT_DATA_REF body: {root, objectid, offset u64, count u32} (28 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(28);
        push64(&mut out, self.root);
        push64(&mut out, self.objectid);
        push64(&mut out, self.offset);
        push32(&mut out, self.count);
        out
    }
}

impl BlockGroupItem {
    /// BLOCK_GROUP_ITEM body: {used, chunk_objectid, flags} (24 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        push64(&mut out, self.used);
        push64(&mut out, self.chunk_objectid);
        push64(&mut out, self.flags);
        out
    }
}

impl DevItem {
    /// Appends the 98-byte dev item.
    pub fn write(&self, out: &mut Vec<u8>) {
        push64(out, self.devid);
        push64(out, self.total_bytes);
        push64(out, self.bytes_used);
        push32(out, self.io_align);
        push32(out, self.io_width);
        push32(out, self.sector_size);
        push64(out, self.ty);
        push64(out, self.generation);
        push64(out, self.start_offset);
        push32(out, self.dev_group);
        out.push(self.seek_speed);
        out.push(self.bandwidth);
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&self.fsid);
    }
    /// The 98-byte DEV_ITEM body (also embedded in the superblock).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        self.write(&mut out);
        out
    }
}

impl Stripe {
    /// Appends the 32-byte stripe `{devid u64, offset u64, dev_uuid[16]}`.
    pub fn write(&self, out: &mut Vec<u8>) {
        push64(out, self.devid);
        push64(out, self.offset);
        out.extend_from_slice(&self.dev_uuid);
    }
}

impl Chunk {
    /// CHUNK_ITEM body (also the sys_chunk_array entry after its key): 48 bytes then
    /// 32 per stripe. num_stripes is written as `stripes.len()` so the count always
    /// matches the stripes that follow.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.item_size());
        push64(&mut out, self.length);
        push64(&mut out, self.owner);
        push64(&mut out, self.stripe_len);
        push64(&mut out, self.ty);
        push32(&mut out, self.io_align);
        push32(&mut out, self.io_width);
        push32(&mut out, self.sector_size);
        let n = u16::try_from(self.stripes.len()).unwrap_or(u16::MAX);
        push16(&mut out, n);
        push16(&mut out, self.sub_stripes);
        for s in self.stripes.iter().take(n as usize) {
            s.write(&mut out);
        }
        out
    }
}

impl DevExtent {
    /// DEV_EXTENT body: {chunk_tree, chunk_objectid, chunk_offset, length, chunk_tree_uuid}
    /// (48 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        push64(&mut out, self.chunk_tree);
        push64(&mut out, self.chunk_objectid);
        push64(&mut out, self.chunk_offset);
        push64(&mut out, self.length);
        out.extend_from_slice(&self.chunk_tree_uuid);
        out
    }
}

impl FreeSpaceInfo {
    /// FREE_SPACE_INFO body: {extent_count u32, flags u32}.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8);
        push32(&mut out, self.extent_count);
        push32(&mut out, self.flags);
        out
    }
}

impl QgroupStatus {
    /// QGROUP_STATUS body: {version, generation, flags, rescan} and, when present,
    /// enable_gen (40 bytes; 32 without it, like older kernels wrote).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40);
        push64(&mut out, self.version);
        push64(&mut out, self.generation);
        push64(&mut out, self.flags);
        push64(&mut out, self.rescan);
        if let Some(g) = self.enable_gen {
            push64(&mut out, g);
        }
        out
    }
}

impl QgroupInfo {
    /// QGROUP_INFO body: {generation, rfer, rfer_cmpr, excl, excl_cmpr} (40 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40);
        push64(&mut out, self.generation);
        push64(&mut out, self.rfer);
        push64(&mut out, self.rfer_cmpr);
        push64(&mut out, self.excl);
        push64(&mut out, self.excl_cmpr);
        out
    }
}

impl QgroupLimit {
    /// QGROUP_LIMIT body: {flags, max_rfer, max_excl, rsv_rfer, rsv_excl} (40 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40);
        push64(&mut out, self.flags);
        push64(&mut out, self.max_rfer);
        push64(&mut out, self.max_excl);
        push64(&mut out, self.rsv_rfer);
        push64(&mut out, self.rsv_excl);
        out
    }
}

impl DevReplaceItem {
    /// DEV_REPLACE body: nine u64 in declaration order (72 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(72);
        for v in [
            self.src_devid,
            self.cursor_left,
            self.cursor_right,
            self.cont_reading_from_srcdev_mode,
            self.replace_state,
            self.time_started,
            self.time_stopped,
            self.num_write_errors,
            self.num_uncorrectable_read_errors,
        ] {
            push64(&mut out, v);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn dir_item_truncated_name() {
        let mut b = vec![0u8; 30];
        b[27..29].copy_from_slice(&10u16.to_le_bytes());
        assert!(parse_dir_items(&b).is_err());
    }
    #[test]
    fn inline_ref_parse() {
        let mut b = vec![];
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend_from_slice(&EXTENT_FLAG_DATA.to_le_bytes());
        b.push(EXTENT_DATA_REF_KEY);
        b.extend_from_slice(&5u64.to_le_bytes());
        b.extend_from_slice(&257u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        let e = ExtentItem::parse(EXTENT_ITEM_KEY, &b).unwrap();
        assert_eq!(e.inline_refs.len(), 1);
        assert_eq!(e.inline_refs[0].count(), 1);
        b.push(99);
        assert!(ExtentItem::parse(EXTENT_ITEM_KEY, &b).is_err());
    }
    #[test]
    fn chunk_zero_stripes_rejected() {
        assert!(Chunk::parse(&[0u8; 48]).is_err());
    }

    fn ts(sec: i64, nsec: u32) -> Timespec {
        Timespec { sec, nsec }
    }

    fn sample_inode(seed: u64) -> InodeItem {
        InodeItem {
            generation: seed + 1,
            transid: seed + 2,
            size: seed + 3,
            nbytes: seed + 4,
            block_group: seed + 5,
            nlink: 6,
            uid: 7,
            gid: 0xfffe_fffe,
            mode: 0o100644,
            rdev: (300 << 20) | 70000,
            flags: 0x11,
            sequence: seed + 12,
            atime: ts(-14_182_940, 1),
            ctime: ts(1_700_000_000, 999_999_999),
            mtime: ts(4_102_444_800, 123),
            otime: ts(1, 2),
        }
    }

    fn uuid(b: u8) -> [u8; 16] {
        std::array::from_fn(|i| b.wrapping_add(i as u8 * 17))
    }

    #[test]
    fn timespec_write() {
        let mut out = Vec::new();
        ts(-1, 5).write(&mut out);
        assert_eq!(out.len(), Timespec::SIZE);
        assert_eq!(&out[..8], &[0xff; 8]);
        let mut c = Cursor::new(&out, "t");
        assert_eq!(Timespec::parse(&mut c).unwrap(), ts(-1, 5));
    }

    #[test]
    fn inode_item_roundtrip() {
        let i = sample_inode(100);
        let b = i.to_bytes();
        assert_eq!(b.len(), InodeItem::SIZE);
        assert!(b[0x50..0x70].iter().all(|&x| x == 0), "reserved bytes");
        assert_eq!(InodeItem::parse(&b).unwrap(), i);
    }

    #[test]
    fn inode_refs_roundtrip() {
        let mut b = inode_ref_bytes(2, b"first");
        b.extend(inode_ref_bytes(u64::MAX - 1, &[0xffu8; 255]));
        assert_eq!(b.len(), 10 + 5 + 10 + 255);
        let refs = parse_inode_refs(256, &b).unwrap();
        assert_eq!(
            refs,
            vec![
                InodeRef {
                    parent: 256,
                    index: 2,
                    name: b"first".to_vec()
                },
                InodeRef {
                    parent: 256,
                    index: u64::MAX - 1,
                    name: vec![0xff; 255]
                },
            ]
        );
        let mut e = inode_extref_bytes(257, 3, "名前".as_bytes());
        e.extend(inode_extref_bytes(1 << 40, 4, b"x"));
        let ex = parse_inode_extrefs(&e).unwrap();
        assert_eq!(ex.len(), 2);
        assert_eq!(
            ex[0],
            InodeRef {
                parent: 257,
                index: 3,
                name: "名前".as_bytes().to_vec()
            }
        );
        assert_eq!(
            (ex[1].parent, ex[1].index, &ex[1].name[..]),
            (1 << 40, 4, &b"x"[..])
        );
        // Over-long names are cut so the length field stays truthful.
        let long = vec![b'a'; 70_000];
        let b = inode_ref_bytes(1, &long);
        assert_eq!(parse_inode_refs(1, &b).unwrap()[0].name.len(), 65535);
    }

    #[test]
    fn dir_item_roundtrip() {
        let d1 = DirItem {
            location: Key::new(257, INODE_ITEM_KEY, 0),
            transid: 0x1234_5678_9abc,
            ty: 1,
            name: b"hello".to_vec(),
            data: vec![],
        };
        let d2 = DirItem {
            location: Key::new(0, 0, 0),
            transid: 9,
            ty: 8,
            name: b"user.attr".to_vec(),
            data: (0..=255u8).collect(),
        };
        let mut b = dir_item_bytes(&d1.location, d1.transid, &d1.data, &d1.name, d1.ty);
        assert_eq!(b.len(), DIR_ITEM_HEADER_SIZE + 5);
        assert_eq!(b, d1.to_bytes());
        b.extend(d2.to_bytes());
        assert_eq!(parse_dir_items(&b).unwrap(), vec![d1, d2]);
    }

    #[test]
    fn file_extent_roundtrip() {
        let inline = FileExtentItem {
            generation: 11,
            ram_bytes: 3000,
            compression: 3,
            encryption: 1,
            other_encoding: 0x0102,
            ty: FILE_EXTENT_INLINE,
            body: FileExtentBody::Inline {
                data: b"compressed bytes".to_vec(),
            },
        };
        let b = inline.to_bytes();
        assert_eq!(b.len(), FILE_EXTENT_INLINE_DATA_START + 16);
        assert_eq!(FileExtentItem::parse(&b).unwrap(), inline);
        for ty in [FILE_EXTENT_REG, FILE_EXTENT_PREALLOC] {
            let r = FileExtentItem {
                generation: 12,
                ram_bytes: 1 << 20,
                compression: 1,
                encryption: 2,
                other_encoding: 3,
                ty,
                body: FileExtentBody::Regular {
                    disk_bytenr: 13_631_488,
                    disk_num_bytes: 131_072,
                    offset: 4096,
                    num_bytes: 8192,
                },
            };
            let b = r.to_bytes();
            assert_eq!(b.len(), FILE_EXTENT_SIZE);
            assert_eq!(FileExtentItem::parse(&b).unwrap(), r);
        }
    }

    fn sample_root_item() -> RootItem {
        RootItem {
            inode: sample_inode(7),
            generation: 42,
            root_dirid: 256,
            bytenr: 30_408_704,
            byte_limit: 5,
            bytes_used: 16384,
            last_snapshot: 41,
            flags: 1,
            refs: 3,
            drop_progress: Key::new(300, DIR_INDEX_KEY, 77),
            drop_level: 2,
            level: 1,
            generation_v2: 42,
            uuid: uuid(1),
            parent_uuid: uuid(2),
            received_uuid: uuid(3),
            ctransid: 43,
            otransid: 44,
            stransid: 45,
            rtransid: 46,
            ctime: ts(10, 11),
            otime: ts(12, 13),
            stime: ts(14, 15),
            rtime: ts(16, 17),
        }
    }

    #[test]
    fn root_item_roundtrip() {
        let r = sample_root_item();
        let b = r.to_bytes();
        assert_eq!(b.len(), RootItem::SIZE);
        assert!(b[RootItem::SIZE - 64..].iter().all(|&x| x == 0));
        assert_eq!(RootItem::parse(&b).unwrap(), r);
        assert!(RootItem::parse(&b).unwrap().is_v2());
        // The legacy prefix is the same bytes.
        let legacy = RootItem::parse(&b[..RootItem::LEGACY_SIZE]).unwrap();
        assert_eq!(legacy.drop_progress, r.drop_progress);
        assert_eq!(legacy.level, 1);
    }

    #[test]
    fn root_ref_roundtrip() {
        let r = RootRef {
            dirid: 256,
            sequence: 7,
            name: b"subvol".to_vec(),
        };
        let b = r.to_bytes();
        assert_eq!(b.len(), 18 + 6);
        assert_eq!(RootRef::parse(&b).unwrap(), r);
    }

    #[test]
    fn extent_item_roundtrip() {
        let tree = ExtentItem {
            refs: 1,
            generation: 9,
            flags: EXTENT_FLAG_TREE_BLOCK,
            tree_block_info: Some((Key::new(256, INODE_ITEM_KEY, 0), 1)),
            inline_refs: vec![
                InlineRef::TreeBlock { root: 5 },
                InlineRef::SharedBlock { parent: 1 << 30 },
            ],
        };
        let b = tree.to_bytes();
        assert_eq!(b.len(), 24 + 18 + 9 + 9);
        assert_eq!(ExtentItem::parse(EXTENT_ITEM_KEY, &b).unwrap(), tree);
        let skinny = ExtentItem {
            tree_block_info: None,
            ..tree.clone()
        };
        let b = skinny.to_bytes();
        assert_eq!(ExtentItem::parse(METADATA_ITEM_KEY, &b).unwrap(), skinny);
        let data = ExtentItem {
            refs: 7,
            generation: 10,
            flags: EXTENT_FLAG_DATA,
            tree_block_info: None,
            inline_refs: vec![
                InlineRef::ExtentData {
                    root: 5,
                    objectid: 257,
                    offset: 4096,
                    count: 3,
                },
                InlineRef::SharedData {
                    parent: 1 << 31,
                    count: 4,
                },
                InlineRef::Owner { root: 256 },
            ],
        };
        let b = data.to_bytes();
        assert_eq!(b.len(), 24 + 29 + 13 + 9);
        assert_eq!(ExtentItem::parse(EXTENT_ITEM_KEY, &b).unwrap(), data);
    }

    #[test]
    fn small_items_roundtrip() {
        let e = ExtentDataRef {
            root: 5,
            objectid: 258,
            offset: 1 << 33,
            count: 0x0102_0304,
        };
        assert_eq!(e.to_bytes().len(), 28);
        assert_eq!(ExtentDataRef::parse(&e.to_bytes()).unwrap(), e);
        let bg = BlockGroupItem {
            used: 1 << 20,
            chunk_objectid: FIRST_CHUNK_TREE_OBJECTID,
            flags: 0x14,
        };
        assert_eq!(bg.to_bytes().len(), 24);
        assert_eq!(BlockGroupItem::parse(&bg.to_bytes()).unwrap(), bg);
        let de = DevExtent {
            chunk_tree: 3,
            chunk_objectid: 256,
            chunk_offset: 22_020_096,
            length: 8 << 20,
            chunk_tree_uuid: uuid(9),
        };
        assert_eq!(de.to_bytes().len(), 48);
        assert_eq!(DevExtent::parse(&de.to_bytes()).unwrap(), de);
        let key = |ty, objectid| Key::new(objectid, ty, 1 << 20);
        let fsi = FreeSpaceInfo {
            extent_count: 17,
            flags: 1,
        };
        assert_eq!(
            parse_item(&key(FREE_SPACE_INFO_KEY, 1), &fsi.to_bytes()).unwrap(),
            Item::FreeSpaceInfo(fsi)
        );
        for enable_gen in [None, Some(99)] {
            let qs = QgroupStatus {
                version: 1,
                generation: 2,
                flags: 3,
                rescan: 4,
                enable_gen,
            };
            assert_eq!(
                parse_item(&key(QGROUP_STATUS_KEY, 0), &qs.to_bytes()).unwrap(),
                Item::QgroupStatus(qs)
            );
        }
        let qi = QgroupInfo {
            generation: 1,
            rfer: 2,
            rfer_cmpr: 3,
            excl: 4,
            excl_cmpr: 5,
        };
        assert_eq!(
            parse_item(&key(QGROUP_INFO_KEY, 0), &qi.to_bytes()).unwrap(),
            Item::QgroupInfo(qi)
        );
        let ql = QgroupLimit {
            flags: 6,
            max_rfer: 7,
            max_excl: 8,
            rsv_rfer: 9,
            rsv_excl: 10,
        };
        assert_eq!(
            parse_item(&key(QGROUP_LIMIT_KEY, 0), &ql.to_bytes()).unwrap(),
            Item::QgroupLimit(ql)
        );
        let dr = DevReplaceItem {
            src_devid: 1,
            cursor_left: 2,
            cursor_right: 3,
            cont_reading_from_srcdev_mode: 4,
            replace_state: 5,
            time_started: 6,
            time_stopped: 7,
            num_write_errors: 8,
            num_uncorrectable_read_errors: 9,
        };
        assert_eq!(dr.to_bytes().len(), 72);
        assert_eq!(
            parse_item(&key(DEV_REPLACE_KEY, 0), &dr.to_bytes()).unwrap(),
            Item::DevReplace(dr)
        );
    }

    #[test]
    fn dev_item_and_chunk_roundtrip() {
        let d = DevItem {
            devid: 1,
            total_bytes: 268_435_456,
            bytes_used: 159_383_552,
            io_align: 4096,
            io_width: 8192,
            sector_size: 512,
            ty: 3,
            generation: 4,
            start_offset: 5,
            dev_group: 6,
            seek_speed: 7,
            bandwidth: 8,
            uuid: uuid(0x10),
            fsid: uuid(0x20),
        };
        let b = d.to_bytes();
        assert_eq!(b.len(), DevItem::SIZE);
        assert_eq!(DevItem::parse(&b).unwrap(), d);
        let c = Chunk {
            length: 33_554_432,
            owner: 2,
            stripe_len: 65536,
            ty: 0x24,
            io_align: 65536,
            io_width: 65537,
            sector_size: 4096,
            num_stripes: 2,
            sub_stripes: 1,
            stripes: vec![
                Stripe {
                    devid: 1,
                    offset: 38_797_312,
                    dev_uuid: uuid(0x30),
                },
                Stripe {
                    devid: 2,
                    offset: 72_351_744,
                    dev_uuid: uuid(0x40),
                },
            ],
        };
        let b = c.to_bytes();
        assert_eq!(b.len(), CHUNK_BASE_SIZE + 2 * STRIPE_SIZE);
        assert_eq!(b.len(), c.item_size());
        assert_eq!(Chunk::parse(&b).unwrap(), c);
    }

    /// Re-encodes a decoded item, for the kinds that have a serializer.
    fn reencode(item: &Item) -> Option<Vec<u8>> {
        Some(match item {
            Item::Inode(i) => i.to_bytes(),
            Item::InodeRef(v) => v
                .iter()
                .flat_map(|r| inode_ref_bytes(r.index, &r.name))
                .collect(),
            Item::InodeExtref(v) => v
                .iter()
                .flat_map(|r| inode_extref_bytes(r.parent, r.index, &r.name))
                .collect(),
            Item::DirItems(v) | Item::Xattrs(v) => v.iter().flat_map(|d| d.to_bytes()).collect(),
            Item::FileExtent(f) => f.to_bytes(),
            Item::Root(r) => r.to_bytes(),
            Item::RootRef(r) => r.to_bytes(),
            Item::Extent(e) => e.to_bytes(),
            Item::ExtentDataRef(e) => e.to_bytes(),
            Item::BlockGroup(b) => b.to_bytes(),
            Item::FreeSpaceInfo(f) => f.to_bytes(),
            Item::DevExtent(d) => d.to_bytes(),
            Item::Dev(d) => d.to_bytes(),
            Item::Chunk(c) => c.to_bytes(),
            Item::QgroupStatus(q) => q.to_bytes(),
            Item::QgroupInfo(q) => q.to_bytes(),
            Item::QgroupLimit(q) => q.to_bytes(),
            Item::DevReplace(d) => d.to_bytes(),
            _ => return None,
        })
    }

    /// Kernel-written leaves (tests/data/README.md): every item with a serializer must
    /// come back byte for byte.
    #[test]
    fn kernel_leaves_reencode_exactly() {
        use crate::tree::BlockView;
        use std::collections::BTreeSet;
        let blocks: &[u8] = include_bytes!("../tests/data/nodesize4k-blocks.bin");
        let mut seen = BTreeSet::new();
        let mut extent_kinds = BTreeSet::new();
        for block in blocks.chunks(4096) {
            let v = BlockView::new(block);
            if v.level() != 0 {
                continue;
            }
            for i in 0..v.nritems() as usize {
                let key = v.item_key(i).unwrap();
                let data = v.item_data(i).unwrap();
                let item = parse_item(&key, data).unwrap();
                let Some(again) = reencode(&item) else {
                    continue;
                };
                assert_eq!(again, data, "item {i} {key}");
                seen.insert(key.ty);
                if let Item::FileExtent(f) = &item {
                    extent_kinds.insert((f.ty, f.compression != 0));
                }
                if let Item::Root(r) = &item {
                    assert_eq!(data.len(), RootItem::SIZE);
                    assert!(r.is_v2());
                }
            }
        }
        for ty in [
            INODE_ITEM_KEY,
            INODE_REF_KEY,
            INODE_EXTREF_KEY,
            DIR_ITEM_KEY,
            DIR_INDEX_KEY,
            XATTR_ITEM_KEY,
            EXTENT_DATA_KEY,
            ROOT_ITEM_KEY,
            ROOT_REF_KEY,
            ROOT_BACKREF_KEY,
            EXTENT_ITEM_KEY,
            METADATA_ITEM_KEY,
            BLOCK_GROUP_ITEM_KEY,
            DEV_ITEM_KEY,
            CHUNK_ITEM_KEY,
            DEV_EXTENT_KEY,
            FREE_SPACE_INFO_KEY,
        ] {
            assert!(seen.contains(&ty), "fixture has no item of type {ty}");
        }
        for kind in [
            (FILE_EXTENT_INLINE, false),
            (FILE_EXTENT_REG, false),
            (FILE_EXTENT_REG, true),
            (FILE_EXTENT_PREALLOC, false),
        ] {
            assert!(extent_kinds.contains(&kind), "no file extent {kind:?}");
        }
    }
}
