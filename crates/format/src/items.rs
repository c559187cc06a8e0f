//! Typed decoders for every item type a current kernel writes.

use crate::bytes::Cursor;
use crate::consts::*;
use crate::key::Key;
use crate::{FormatError, Result};
use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub const SIZE: usize = 12;
    fn parse(c: &mut Cursor<'_>) -> Result<Timespec> {
        Ok(Timespec {
            sec: c.u64()? as i64,
            nsec: c.u32()?,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InodeItem {
    pub generation: u64,
    pub transid: u64,
    pub size: u64,
    pub nbytes: u64,
    pub block_group: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub rdev: u64,
    pub flags: u64,
    pub sequence: u64,
    pub atime: Timespec,
    pub ctime: Timespec,
    pub mtime: Timespec,
    pub otime: Timespec,
}

impl InodeItem {
    pub const SIZE: usize = 160;
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InodeRef {
    pub parent: u64,
    pub index: u64,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DirItem {
    pub location: Key,
    pub transid: u64,
    pub ty: u8,
    pub name: Vec<u8>,
    /// xattr value (empty for directory entries).
    pub data: Vec<u8>,
}

pub const DIR_ITEM_HEADER_SIZE: usize = 30;

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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum FileExtentBody {
    /// Inline data (possibly compressed) stored in the item itself.
    Inline { data: Vec<u8> },
    /// Regular or prealloc extent. disk_bytenr 0 means a hole.
    Regular {
        disk_bytenr: u64,
        disk_num_bytes: u64,
        offset: u64,
        num_bytes: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileExtentItem {
    pub generation: u64,
    pub ram_bytes: u64,
    pub compression: u8,
    pub encryption: u8,
    pub other_encoding: u16,
    pub ty: u8,
    pub body: FileExtentBody,
}

pub const FILE_EXTENT_INLINE_DATA_START: usize = 21;
pub const FILE_EXTENT_SIZE: usize = 53;

impl FileExtentItem {
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

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RootItem {
    pub inode: InodeItem,
    pub generation: u64,
    pub root_dirid: u64,
    pub bytenr: u64,
    pub byte_limit: u64,
    pub bytes_used: u64,
    pub last_snapshot: u64,
    pub flags: u64,
    pub refs: u32,
    pub drop_progress: Key,
    pub drop_level: u8,
    pub level: u8,
    /// Fields below exist only in the 439-byte item (generation_v2 == generation).
    pub generation_v2: u64,
    pub uuid: [u8; 16],
    pub parent_uuid: [u8; 16],
    pub received_uuid: [u8; 16],
    pub ctransid: u64,
    pub otransid: u64,
    pub stransid: u64,
    pub rtransid: u64,
    pub ctime: Timespec,
    pub otime: Timespec,
    pub stime: Timespec,
    pub rtime: Timespec,
}

impl RootItem {
    pub const SIZE: usize = 439;
    pub const LEGACY_SIZE: usize = 239;
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
    pub fn is_v2(&self) -> bool {
        self.generation_v2 == self.generation
    }
}

/// ROOT_REF (parent, 156, child) and ROOT_BACKREF (child, 144, parent) body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RootRef {
    pub dirid: u64,
    pub sequence: u64,
    pub name: Vec<u8>,
}

impl RootRef {
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum InlineRef {
    TreeBlock {
        root: u64,
    },
    SharedBlock {
        parent: u64,
    },
    ExtentData {
        root: u64,
        objectid: u64,
        offset: u64,
        count: u32,
    },
    SharedData {
        parent: u64,
        count: u32,
    },
    Owner {
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExtentItem {
    pub refs: u64,
    pub generation: u64,
    pub flags: u64,
    /// Non-skinny tree block: first key of the block and its level.
    pub tree_block_info: Option<(Key, u8)>,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExtentDataRef {
    pub root: u64,
    pub objectid: u64,
    pub offset: u64,
    pub count: u32,
}

impl ExtentDataRef {
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockGroupItem {
    pub used: u64,
    pub chunk_objectid: u64,
    pub flags: u64,
}

impl BlockGroupItem {
    pub fn parse(b: &[u8]) -> Result<BlockGroupItem> {
        let mut c = Cursor::new(b, "block group item");
        Ok(BlockGroupItem {
            used: c.u64()?,
            chunk_objectid: c.u64()?,
            flags: c.u64()?,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DevItem {
    pub devid: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub io_align: u32,
    pub io_width: u32,
    pub sector_size: u32,
    pub ty: u64,
    pub generation: u64,
    pub start_offset: u64,
    pub dev_group: u32,
    pub seek_speed: u8,
    pub bandwidth: u8,
    pub uuid: [u8; 16],
    pub fsid: [u8; 16],
}

impl DevItem {
    pub const SIZE: usize = 98;
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stripe {
    pub devid: u64,
    pub offset: u64,
    pub dev_uuid: [u8; 16],
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Chunk {
    pub length: u64,
    pub owner: u64,
    pub stripe_len: u64,
    pub ty: u64,
    pub io_align: u32,
    pub io_width: u32,
    pub sector_size: u32,
    pub num_stripes: u16,
    pub sub_stripes: u16,
    pub stripes: Vec<Stripe>,
}

pub const CHUNK_BASE_SIZE: usize = 48;
pub const STRIPE_SIZE: usize = 32;

impl Chunk {
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
    pub fn item_size(&self) -> usize {
        CHUNK_BASE_SIZE + STRIPE_SIZE * self.stripes.len()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DevExtent {
    pub chunk_tree: u64,
    pub chunk_objectid: u64,
    pub chunk_offset: u64,
    pub length: u64,
    pub chunk_tree_uuid: [u8; 16],
}

impl DevExtent {
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreeSpaceInfo {
    pub extent_count: u32,
    pub flags: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QgroupStatus {
    pub version: u64,
    pub generation: u64,
    pub flags: u64,
    pub rescan: u64,
    pub enable_gen: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QgroupInfo {
    pub generation: u64,
    pub rfer: u64,
    pub rfer_cmpr: u64,
    pub excl: u64,
    pub excl_cmpr: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QgroupLimit {
    pub flags: u64,
    pub max_rfer: u64,
    pub max_excl: u64,
    pub rsv_rfer: u64,
    pub rsv_excl: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DevReplaceItem {
    pub src_devid: u64,
    pub cursor_left: u64,
    pub cursor_right: u64,
    pub cont_reading_from_srcdev_mode: u64,
    pub replace_state: u64,
    pub time_started: u64,
    pub time_stopped: u64,
    pub num_write_errors: u64,
    pub num_uncorrectable_read_errors: u64,
}

/// Every item decoded by its key type; unknown or opaque items keep their bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
// Decoded items are built for display and checks, one at a time; boxing the large
// variants would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Item {
    Inode(InodeItem),
    InodeRef(Vec<InodeRef>),
    InodeExtref(Vec<InodeRef>),
    DirItems(Vec<DirItem>),
    Xattrs(Vec<DirItem>),
    FileExtent(FileExtentItem),
    Csum(Vec<u8>),
    Root(RootItem),
    RootRef(RootRef),
    Extent(ExtentItem),
    TreeBlockRef,
    SharedBlockRef,
    ExtentDataRef(ExtentDataRef),
    SharedDataRef { count: u32 },
    ExtentOwnerRef { root: u64 },
    BlockGroup(BlockGroupItem),
    FreeSpaceInfo(FreeSpaceInfo),
    FreeSpaceExtent,
    FreeSpaceBitmap(Vec<u8>),
    DevExtent(DevExtent),
    Dev(DevItem),
    Chunk(Chunk),
    QgroupStatus(QgroupStatus),
    QgroupInfo(QgroupInfo),
    QgroupLimit(QgroupLimit),
    QgroupRelation,
    DevStats(Vec<u64>),
    DevReplace(DevReplaceItem),
    UuidList(Vec<u64>),
    Orphan,
    DirLogIndex { end: u64 },
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
}
