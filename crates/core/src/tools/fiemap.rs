//! FS_IOC_FIEMAP as the kernel answers it for a btrfs file: one entry per file extent
//! item (holes omitted), adjacent entries merged when logically and physically
//! contiguous with equal flags, SHARED from the back references, LAST on the final
//! entry that reaches the end of the last non-hole extent.

use crate::backref::ShareCtx;
use crate::error::Result;
use crate::fs::{Filesystem, Node};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::FileExtentBody;

/// FIEMAP flag: Last extent of the file.
pub const FIEMAP_EXTENT_LAST: u32 = 0x0001;
/// FIEMAP flag: Location unknown.
pub const FIEMAP_EXTENT_UNKNOWN: u32 = 0x0002;
/// FIEMAP flag: Delayed allocation (not yet on disk).
pub const FIEMAP_EXTENT_DELALLOC: u32 = 0x0004;
/// FIEMAP flag: Data is encoded (compressed).
pub const FIEMAP_EXTENT_ENCODED: u32 = 0x0008;
/// FIEMAP flag: Data is encrypted.
pub const FIEMAP_EXTENT_DATA_ENCRYPTED: u32 = 0x0080;
/// FIEMAP flag: Offsets are not block aligned.
pub const FIEMAP_EXTENT_NOT_ALIGNED: u32 = 0x0100;
/// FIEMAP flag: Data lives in metadata (inline extent).
pub const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x0200;
/// FIEMAP flag: Data is packed with other files' tails.
pub const FIEMAP_EXTENT_DATA_TAIL: u32 = 0x0400;
/// FIEMAP flag: Preallocated, not written.
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x0800;
/// FIEMAP flag: Several extents merged into this entry.
pub const FIEMAP_EXTENT_MERGED: u32 = 0x1000;
/// FIEMAP flag: Shared with another file or snapshot.
pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// One fiemap extent, as FS_IOC_FIEMAP returns it.
pub struct FiemapExtent {
    /// File offset.
    pub logical: u64,
    /// Disk (logical btrfs) address.
    pub physical: u64,
    /// Length in bytes.
    pub length: u64,
    /// FIEMAP_EXTENT_* flags.
    pub flags: u32,
}

/// Names of flags in filefrag's order and spelling.
pub fn flag_names(flags: u32) -> Vec<&'static str> {
    const NAMES: &[(u32, &str)] = &[
        (FIEMAP_EXTENT_LAST, "last"),
        (FIEMAP_EXTENT_UNKNOWN, "unknown_loc"),
        (FIEMAP_EXTENT_DELALLOC, "delalloc"),
        (FIEMAP_EXTENT_ENCODED, "encoded"),
        (FIEMAP_EXTENT_DATA_ENCRYPTED, "encrypted"),
        (FIEMAP_EXTENT_NOT_ALIGNED, "not_aligned"),
        (FIEMAP_EXTENT_DATA_INLINE, "inline"),
        (FIEMAP_EXTENT_DATA_TAIL, "tail_packed"),
        (FIEMAP_EXTENT_UNWRITTEN, "unwritten"),
        (FIEMAP_EXTENT_MERGED, "merged"),
        (FIEMAP_EXTENT_SHARED, "shared"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

impl Filesystem {
    /// The kernel's fiemap of a regular file (whole range).
    pub fn fiemap(&self, node: Node, share: &mut ShareCtx<'_>) -> Result<Vec<FiemapExtent>> {
        let ss = self.info.sectorsize as u64;
        let mut out: Vec<FiemapExtent> = Vec::new();
        let mut cache: Option<FiemapExtent> = None;
        let mut last_extent_end = 0u64;
        let mut emit = |e: FiemapExtent, out: &mut Vec<FiemapExtent>| {
            if let Some(c) = cache.as_mut() {
                if c.logical + c.length == e.logical
                    && c.physical + c.length == e.physical
                    && c.flags == e.flags
                {
                    c.length += e.length;
                    return;
                }
                out.push(*c);
            }
            cache = Some(e);
        };
        self.for_each_extent(node, 0, u64::MAX, |fe| {
            let compressed = fe.item.compression != 0;
            let mut flags = if compressed { FIEMAP_EXTENT_ENCODED } else { 0 };
            match &fe.item.body {
                FileExtentBody::Inline { .. } => {
                    // Inline extents end at the sector-aligned uncompressed size.
                    let len = fe.item.ram_bytes.div_ceil(ss) * ss;
                    last_extent_end = fe.file_offset + len;
                    flags |= FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_NOT_ALIGNED;
                    emit(
                        FiemapExtent {
                            logical: fe.file_offset,
                            physical: 0,
                            length: len,
                            flags,
                        },
                        &mut out,
                    );
                }
                FileExtentBody::Regular {
                    disk_bytenr,
                    offset,
                    num_bytes,
                    ..
                } => {
                    if *disk_bytenr == 0 {
                        return Ok(true);
                    }
                    last_extent_end = fe.file_offset + num_bytes;
                    if fe.item.ty == FILE_EXTENT_PREALLOC {
                        flags |= FIEMAP_EXTENT_UNWRITTEN;
                    }
                    if share.is_data_extent_shared_in(
                        node.root,
                        node.ino,
                        *disk_bytenr,
                        Some(fe.leaf),
                    )? {
                        flags |= FIEMAP_EXTENT_SHARED;
                    }
                    // Compressed extents report the start of the on-disk extent.
                    let physical = if compressed {
                        *disk_bytenr
                    } else {
                        disk_bytenr + offset
                    };
                    emit(
                        FiemapExtent {
                            logical: fe.file_offset,
                            physical,
                            length: *num_bytes,
                            flags,
                        },
                        &mut out,
                    );
                }
            }
            Ok(true)
        })?;
        if let Some(mut c) = cache {
            if c.logical + c.length >= last_extent_end {
                c.flags |= FIEMAP_EXTENT_LAST;
            }
            out.push(c);
        }
        Ok(out)
    }
}
