//! The b-tree: validated tree blocks, the tree checker, search and iteration, and the
//! byte-level item edits the write path uses.
//!
//! Owns: the structure of a btrfs b-tree (nodes, leaves, keys, slots) and what makes a
//! block well formed. May use: `format`, `error`, and the `io` layer's block reads.

pub(crate) mod block_edit;
pub(crate) mod ctree;
pub(crate) mod tree_checker;

use crate::error::Result;
use std::sync::Arc;
use tree_checker::Expect;
use ubtrfs_format::tree::BlockView;

/// Where tree blocks come from. [`crate::FsInfo`] reads them from the devices, verified
/// and cached; the b-tree code needs nothing else of the I/O layer.
pub trait BlockSource {
    /// Reads the tree block at logical `bytenr`, checked against what its parent
    /// says of it (`expect`).
    fn read_tree_block(&self, bytenr: u64, expect: &Expect) -> Result<Arc<TreeBlock>>;
}

/// A validated tree block.
#[derive(Debug, Clone)]
pub struct TreeBlock {
    /// Logical address.
    pub bytenr: u64,
    /// The block's bytes (nodesize).
    pub data: Vec<u8>,
}

impl TreeBlock {
    /// Typed access to header, keys and items.
    pub fn view(&self) -> BlockView<'_> {
        BlockView::new(&self.data)
    }
    /// 0 for a leaf.
    pub fn level(&self) -> u8 {
        self.view().level()
    }
    /// Items (leaf) or key pointers (node) in the block.
    pub fn nritems(&self) -> usize {
        self.view().nritems() as usize
    }
    /// Transaction that wrote the block.
    pub fn generation(&self) -> u64 {
        self.view().generation()
    }
    /// Tree that owns the block.
    pub fn owner(&self) -> u64 {
        self.view().owner()
    }
}

/// Where a tree's root block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootPtr {
    /// Tree id.
    pub id: u64,
    /// Logical address of the root block.
    pub bytenr: u64,
    /// Level of the root block (0: the root is a leaf).
    pub level: u8,
    /// Generation the root block was written in.
    pub generation: u64,
}
