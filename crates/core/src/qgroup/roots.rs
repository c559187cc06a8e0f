//! Which subvolumes reach an extent in one state of the filesystem (the kernel's
//! btrfs_find_all_roots), bottom-up through the back references: a tree block held by
//! tree R is reached by whatever reaches its parent in R (R itself at R's root node),
//! one held by address by whatever reaches that parent; a data extent by whatever
//! reaches the leaves holding its file extent items. Tree-block answers are memoised
//! for the finder's life (one state, one commit).

use crate::backref::{BackRef, FsRefGraph, RefGraph};
use crate::error::Result;
use crate::qgroup::is_fs_tree;
use std::collections::{BTreeSet, HashMap};
use ubtrfs_format::consts::MAX_LEVEL;

/// Blocks climbed above an extent at most (a hostile image cannot loop us).
const DEPTH_MAX: usize = MAX_LEVEL as usize + 2;

/// Finds the subvolumes reaching extents of one state.
pub(crate) struct RootFinder<'a> {
    graph: FsRefGraph<'a>,
    blocks: HashMap<u64, Vec<u64>>,
    /// Extent items looked up (for the benchmark's counters).
    pub lookups: u64,
}

impl<'a> RootFinder<'a> {
    pub(crate) fn new(graph: FsRefGraph<'a>) -> RootFinder<'a> {
        RootFinder {
            graph,
            blocks: HashMap::new(),
            lookups: 0,
        }
    }

    /// Subvolumes reaching the extent at `bytenr` (sorted; empty when it is not
    /// allocated in this state).
    pub(crate) fn roots(&mut self, bytenr: u64, is_data: bool) -> Result<Vec<u64>> {
        if is_data {
            self.data_roots(bytenr)
        } else {
            self.block_roots(bytenr, 0)
        }
    }

    fn data_roots(&mut self, bytenr: u64) -> Result<Vec<u64>> {
        self.lookups += 1;
        let Some(refs) = self.graph.extent_refs(bytenr)? else {
            return Ok(Vec::new());
        };
        let mut out = BTreeSet::new();
        for r in &refs.refs_list {
            match *r {
                BackRef::Data {
                    root,
                    ino,
                    offset,
                    count,
                } if is_fs_tree(root) => {
                    let leaves = self
                        .graph
                        .leaves_referencing(root, ino, offset, count, bytenr)?;
                    for leaf in leaves {
                        out.extend(self.block_roots(leaf, 1)?);
                    }
                }
                BackRef::SharedData { parent, .. } => {
                    out.extend(self.block_roots(parent, 1)?);
                }
                _ => {}
            }
        }
        Ok(out.into_iter().collect())
    }

    fn block_roots(&mut self, bytenr: u64, depth: usize) -> Result<Vec<u64>> {
        if let Some(r) = self.blocks.get(&bytenr) {
            return Ok(r.clone());
        }
        if depth > DEPTH_MAX {
            return Ok(Vec::new());
        }
        self.lookups += 1;
        let Some(refs) = self.graph.extent_refs(bytenr)? else {
            self.blocks.insert(bytenr, Vec::new());
            return Ok(Vec::new());
        };
        let mut out = BTreeSet::new();
        for r in &refs.refs_list {
            match *r {
                BackRef::Tree { root } if is_fs_tree(root) => {
                    if self.graph.root_block(root)? == Some(bytenr) {
                        out.insert(root);
                    } else if let Some(p) = self.graph.parent_in_root(root, bytenr)? {
                        out.extend(self.block_roots(p, depth + 1)?);
                    }
                }
                BackRef::SharedBlock { parent } => {
                    out.extend(self.block_roots(parent, depth + 1)?);
                }
                _ => {}
            }
        }
        let v: Vec<u64> = out.into_iter().collect();
        self.blocks.insert(bytenr, v.clone());
        Ok(v)
    }
}
