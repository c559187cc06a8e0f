//! Tree blocks: a 101-byte header, then either 25-byte item headers with data packed
//! from the end of the block (leaf, level 0) or 33-byte key pointers (node).
//!
//! Header: 00 csum[32] | 20 fsid | 30 bytenr | 38 flags (low 56 bits) + backref rev (top
//! byte) | 40 chunk_tree_uuid | 50 generation | 58 owner | 60 nritems u32 | 64 level u8.
//! Leaf item data offsets are relative to the end of the header.

use crate::bytes::{le32, le64, Cursor};
use crate::consts::*;
use crate::key::Key;
use crate::{FormatError, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub csum: [u8; 32],
    pub fsid: [u8; 16],
    pub bytenr: u64,
    pub flags: u64,
    pub chunk_tree_uuid: [u8; 16],
    pub generation: u64,
    pub owner: u64,
    pub nritems: u32,
    pub level: u8,
}

impl Header {
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
    pub fn backref_rev(&self) -> u64 {
        self.flags >> BACKREF_REV_SHIFT
    }
    pub fn block_flags(&self) -> u64 {
        self.flags & ((1u64 << BACKREF_REV_SHIFT) - 1)
    }
}

/// A leaf item header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemHeader {
    pub key: Key,
    /// Data offset relative to the end of the block header.
    pub offset: u32,
    pub size: u32,
}

/// A node's pointer to a child block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPtr {
    pub key: Key,
    pub blockptr: u64,
    pub generation: u64,
}

/// Read-only view of a tree block's bytes. Accessors are bounds-checked against the
/// buffer; structural rules (ordering, overlap, sizes) are the tree checker's job.
#[derive(Clone, Copy, Debug)]
pub struct BlockView<'a> {
    pub buf: &'a [u8],
}

impl<'a> BlockView<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        BlockView { buf }
    }
    pub fn header(&self) -> Result<Header> {
        Header::parse(self.buf)
    }
    pub fn bytenr(&self) -> u64 {
        le64(self.buf, 0x30, "header").unwrap_or(0)
    }
    pub fn generation(&self) -> u64 {
        le64(self.buf, 0x50, "header").unwrap_or(0)
    }
    pub fn owner(&self) -> u64 {
        le64(self.buf, 0x58, "header").unwrap_or(0)
    }
    pub fn nritems(&self) -> u32 {
        le32(self.buf, 0x60, "header").unwrap_or(0)
    }
    pub fn level(&self) -> u8 {
        self.buf.get(0x64).copied().unwrap_or(0)
    }
    pub fn item(&self, i: usize) -> Result<ItemHeader> {
        let off = HEADER_SIZE + i * ITEM_SIZE;
        let mut c = Cursor::at(self.buf, off, "leaf item header");
        Ok(ItemHeader {
            key: Key::parse(&mut c)?,
            offset: c.u32()?,
            size: c.u32()?,
        })
    }
    pub fn item_key(&self, i: usize) -> Result<Key> {
        Key::parse(&mut Cursor::at(
            self.buf,
            HEADER_SIZE + i * ITEM_SIZE,
            "leaf item header",
        ))
    }
    /// The data of item `i`, or an error if it points outside the block.
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
    pub fn key_at(&self, i: usize) -> Result<Key> {
        if self.level() == 0 {
            self.item_key(i)
        } else {
            Ok(self.key_ptr(i)?.key)
        }
    }
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
}
