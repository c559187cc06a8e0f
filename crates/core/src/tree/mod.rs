//! The b-tree: validated tree blocks, the tree checker, search and iteration, and the
//! byte-level item edits the write path uses.
//!
//! Owns: the structure of a btrfs b-tree (nodes, leaves, keys, slots) and what makes a
//! block well formed. May use: `format`, `error`, and the `io` layer's block reads.

pub(crate) mod block_edit;
pub(crate) mod ctree;
pub(crate) mod tree_checker;
