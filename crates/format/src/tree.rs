//! Tree blocks: a 101-byte header, then either 25-byte item headers with data packed
//! from the end of the block (leaf, level 0) or 33-byte key pointers (node).
//!
//! Header: 00 csum\[32\] | 20 fsid | 30 bytenr | 38 flags (low 56 bits) + backref rev (top
//! byte) | 40 chunk_tree_uuid | 50 generation | 58 owner | 60 nritems u32 | 64 level u8.
//! Leaf item data offsets are relative to the end of the header.

use crate::bytes::{le32, le64, put32, put64, Cursor};
use crate::consts::*;
use crate::csum::CsumType;
use crate::key::Key;
use crate::{FormatError, Result};

/// A tree block header (struct btrfs_header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Checksum of the block from byte 0x20 on (left-aligned).
    pub csum: [u8; 32],
    /// fsid (or metadata_uuid) of the filesystem.
    pub fsid: [u8; 16],
    /// Logical address of this block.
    pub bytenr: u64,
    /// Flags (low 56 bits) and back reference revision (top byte).
    pub flags: u64,
    /// UUID of the chunk tree.
    pub chunk_tree_uuid: [u8; 16],
    /// Transaction id that wrote the block.
    pub generation: u64,
    /// Object id of the tree owning the block.
    pub owner: u64,
    /// Number of items (leaf) or key pointers (node).
    pub nritems: u32,
    /// Level in the tree: 0 for leaves.
    pub level: u8,
}

impl Header {
    /// Decodes the 101-byte header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Header> {
        let mut c = Cursor::new(buf, "tree block header");
        Ok(Header {
            csum: c.array()?,
            fsid: c.array()?,
            bytenr: c.u64()?,
            flags: c.u64()?,
            chunk_tree_uuid: c.array()?,
            generation: c.u64()?,
            owner: c.u64()?,
            nritems: c.u32()?,
            level: c.u8()?,
        })
    }
    /// Encodes the 101-byte header, checksum field included, into `out[..101]` (panics
    /// if `out` is shorter). Use [`finish_block`] once the block is complete.
    pub fn write(&self, out: &mut [u8]) {
        out[..CSUM_SIZE_MAX].copy_from_slice(&self.csum);
        out[0x20..0x30].copy_from_slice(&self.fsid);
        put64(out, 0x30, self.bytenr);
        put64(out, 0x38, self.flags);
        out[0x40..0x50].copy_from_slice(&self.chunk_tree_uuid);
        put64(out, 0x50, self.generation);
        put64(out, 0x58, self.owner);
        put32(out, 0x60, self.nritems);
        out[0x64] = self.level;
    }
    /// The 101-byte header.
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        self.write(&mut b);
        b
    }
    /// Back reference revision (top byte of the flags).
    pub fn backref_rev(&self) -> u64 {
        self.flags >> BACKREF_REV_SHIFT
    }
    /// Block flags (`HEADER_FLAG_*`), without the back reference revision.
    pub fn block_flags(&self) -> u64 {
        self.flags & ((1u64 << BACKREF_REV_SHIFT) - 1)
    }
}

/// A leaf item header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemHeader {
    /// The item's key.
    pub key: Key,
    /// Data offset relative to the end of the block header.
    pub offset: u32,
    /// Size of the item's data.
    pub size: u32,
}

/// A node's pointer to a child block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPtr {
    /// First key of the child block.
    pub key: Key,
    /// Logical address of the child block.
    pub blockptr: u64,
    /// Transaction id the child block was written in.
    pub generation: u64,
}

/// Read-only view of a tree block's bytes. Accessors are bounds-checked against the
/// buffer; structural rules (ordering, overlap, sizes) are the tree checker's job.
#[derive(Clone, Copy, Debug)]
pub struct BlockView<'a> {
    /// The block's bytes.
    pub buf: &'a [u8],
}

impl<'a> BlockView<'a> {
    /// A view of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        BlockView { buf }
    }
    /// The decoded header.
    pub fn header(&self) -> Result<Header> {
        Header::parse(self.buf)
    }
    /// Header bytenr (0 if the buffer is too short).
    #[inline]
    pub fn bytenr(&self) -> u64 {
        le64(self.buf, 0x30, "header").unwrap_or(0)
    }
    /// Header generation (0 if the buffer is too short).
    #[inline]
    pub fn generation(&self) -> u64 {
        le64(self.buf, 0x50, "header").unwrap_or(0)
    }
    /// Header owner (0 if the buffer is too short).
    #[inline]
    pub fn owner(&self) -> u64 {
        le64(self.buf, 0x58, "header").unwrap_or(0)
    }
    /// Header nritems (0 if the buffer is too short).
    #[inline]
    pub fn nritems(&self) -> u32 {
        le32(self.buf, 0x60, "header").unwrap_or(0)
    }
    /// Header level (0 if the buffer is too short).
    #[inline]
    pub fn level(&self) -> u8 {
        self.buf.get(0x64).copied().unwrap_or(0)
    }
    /// Leaf item header `i`.
    #[inline]
    pub fn item(&self, i: usize) -> Result<ItemHeader> {
        let off = HEADER_SIZE + i * ITEM_SIZE;
        let mut c = Cursor::at(self.buf, off, "leaf item header");
        Ok(ItemHeader {
            key: Key::parse(&mut c)?,
            offset: c.u32()?,
            size: c.u32()?,
        })
    }
    /// Key of leaf item `i`.
    #[inline]
    pub fn item_key(&self, i: usize) -> Result<Key> {
        Key::parse(&mut Cursor::at(
            self.buf,
            HEADER_SIZE + i * ITEM_SIZE,
            "leaf item header",
        ))
    }
    /// The data of item `i`, or an error if it points outside the block.
    #[inline]
    pub fn item_data(&self, i: usize) -> Result<&'a [u8]> {
        let it = self.item(i)?;
        let start = HEADER_SIZE + it.offset as usize;
        let end = start + it.size as usize;
        self.buf.get(start..end).ok_or_else(|| {
            FormatError::invalid(
                "leaf item",
                format!(
                    "item {} data [{}, {}) outside the block of {} bytes",
                    i,
                    start,
                    end,
                    self.buf.len()
                ),
            )
        })
    }
    /// Node key pointer `i`.
    #[inline]
    pub fn key_ptr(&self, i: usize) -> Result<KeyPtr> {
        let off = HEADER_SIZE + i * KEY_PTR_SIZE;
        let mut c = Cursor::at(self.buf, off, "node key pointer");
        Ok(KeyPtr {
            key: Key::parse(&mut c)?,
            blockptr: c.u64()?,
            generation: c.u64()?,
        })
    }
    /// Key of slot `i`, for either a leaf or a node.
    #[inline]
    pub fn key_at(&self, i: usize) -> Result<Key> {
        if self.level() == 0 {
            self.item_key(i)
        } else {
            Ok(self.key_ptr(i)?.key)
        }
    }
}

/// Seals a complete tree block: checksums `buf[32..]` with `csum` and stores the result
/// in `buf[..32]` (the bytes past the checksum's size zeroed). Panics if `buf` is shorter
/// than 32 bytes.
pub fn finish_block(buf: &mut [u8], csum: CsumType) {
    let sum = csum.compute(&buf[CSUM_SIZE_MAX..]);
    buf[..CSUM_SIZE_MAX].copy_from_slice(&sum);
}

/// Max items' data bytes in a leaf of this nodesize.
pub fn leaf_data_size(nodesize: u32) -> usize {
    nodesize as usize - HEADER_SIZE
}

/// Max key pointers in a node of this nodesize.
pub fn node_ptrs_max(nodesize: u32) -> usize {
    (nodesize as usize - HEADER_SIZE) / KEY_PTR_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn out_of_block_item_is_error() {
        let mut b = vec![0u8; 4096];
        b[0x60] = 1; // one item
        let it = HEADER_SIZE;
        b[it + 17..it + 21].copy_from_slice(&5000u32.to_le_bytes());
        b[it + 21..it + 25].copy_from_slice(&10u32.to_le_bytes());
        let v = BlockView::new(&b);
        assert!(v.item_data(0).is_err());
        assert!(v.item(1000).is_err());
    }

    #[test]
    fn header_roundtrip() {
        let h = Header {
            csum: std::array::from_fn(|i| i as u8 + 1),
            fsid: std::array::from_fn(|i| 0x40 + i as u8),
            bytenr: 30_408_704,
            flags: (1 << BACKREF_REV_SHIFT) | 1,
            chunk_tree_uuid: std::array::from_fn(|i| 0x80 + i as u8),
            generation: 0x0102_0304_0506,
            owner: FS_TREE_OBJECTID,
            nritems: 0xdead_beef,
            level: 7,
        };
        let b = h.to_bytes();
        assert_eq!(b.len(), HEADER_SIZE);
        assert_eq!(Header::parse(&b).unwrap(), h);
        let mut block = vec![0xaau8; 4096];
        h.write(&mut block);
        assert_eq!(&block[..HEADER_SIZE], &b[..]);
        assert_eq!(block[HEADER_SIZE], 0xaa, "writes only the header");
        let v = BlockView::new(&block);
        assert_eq!(
            (
                v.bytenr(),
                v.generation(),
                v.owner(),
                v.nritems(),
                v.level()
            ),
            (h.bytenr, h.generation, h.owner, h.nritems, h.level)
        );
    }

    #[test]
    fn finish_block_all_csum_types() {
        for t in [
            CsumType::Crc32c,
            CsumType::Xxhash64,
            CsumType::Sha256,
            CsumType::Blake2b,
        ] {
            let mut block: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
            finish_block(&mut block, t);
            let want = t.compute(&block[32..]);
            assert_eq!(&block[..32], &want[..]);
            assert!(block[t.size()..32].iter().all(|&b| b == 0));
        }
    }

    /// Kernel-written tree blocks (tests/data/README.md): re-writing the header over a
    /// zeroed header area and finishing the block gives back the same bytes.
    #[test]
    fn kernel_blocks_rebuild_exactly() {
        let blocks: &[u8] = include_bytes!("../tests/data/nodesize4k-blocks.bin");
        let mut levels = [0usize; 2];
        for orig in blocks.chunks(4096) {
            let h = Header::parse(orig).unwrap();
            levels[(h.level > 0) as usize] += 1;
            let mut b = orig.to_vec();
            b[..HEADER_SIZE].fill(0);
            Header {
                csum: [0; 32],
                ..h.clone()
            }
            .write(&mut b);
            finish_block(&mut b, CsumType::Crc32c);
            assert_eq!(b, orig, "block {}", h.bytenr);
            assert_eq!(&h.to_bytes()[..], &orig[..HEADER_SIZE]);
        }
        assert!(levels[0] > 0 && levels[1] > 0, "{levels:?}");
    }
}
