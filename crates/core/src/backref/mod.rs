//! Back references: who points at an extent. Serves fiemap's SHARED flag, `du`, and
//! later qgroups and relocation.
//!
//! An extent's references live in the extent tree under its bytenr: the EXTENT_ITEM
//! (data, key offset = length) or METADATA_ITEM (tree block, key offset = level) with
//! inline refs, then keyed refs (TREE_BLOCK_REF, EXTENT_DATA_REF, SHARED_BLOCK_REF,
//! SHARED_DATA_REF). A "shared" ref names the parent block; the others name a root
//! and must be resolved by searching that root.
//!
//! Sharedness follows the kernel (btrfs_is_data_extent_shared): a data extent is
//! shared when it has more than one distinct reference, or when any tree block on
//! the way from it to a root has more than one. Results for tree blocks are memoised
//! for the whole run (the image does not change under us), which is the kernel's
//! per-path cache made exact and global.

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::tree::ctree::{next_item, read_root, search_forward, Path};
use crate::tree::tree_checker::Expect;
use crate::tree::RootPtr;
use std::collections::HashMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{ExtentDataRef, ExtentItem, FileExtentBody, FileExtentItem, InlineRef};
use ubtrfs_format::key::Key;

/// One reference to an extent, inline or keyed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BackRef {
    /// Some block of `root` points at this tree block.
    Tree { root: u64 },
    /// Tree block `parent` points at this tree block.
    SharedBlock { parent: u64 },
    /// File extent items of (root, inode) with key offset - extent offset == offset.
    Data {
        root: u64,
        ino: u64,
        offset: u64,
        count: u32,
    },
    /// File extent items in leaf `parent`.
    SharedData { parent: u64, count: u32 },
}

#[derive(Clone, Debug)]
pub struct ExtentRefs {
    pub bytenr: u64,
    /// Bytes on disk: the data extent's length, or nodesize for a tree block.
    pub num_bytes: u64,
    pub refs: u64,
    pub generation: u64,
    pub flags: u64,
    pub refs_list: Vec<BackRef>,
}

impl ExtentRefs {
    pub fn is_tree_block(&self) -> bool {
        self.flags & EXTENT_FLAG_TREE_BLOCK != 0
    }
}

/// A forward cursor over the extent tree that re-uses its position: lookups in
/// ascending bytenr order mostly stay in the current leaf (no search from the root).
pub(crate) struct ExtentCursor<'a> {
    fs: &'a FsInfo,
    root: RootPtr,
    path: Option<Path>,
}

impl<'a> ExtentCursor<'a> {
    pub(crate) fn new(fs: &'a FsInfo) -> Result<ExtentCursor<'a>> {
        let root = fs
            .tree_ptr(EXTENT_TREE_OBJECTID)
            .ok_or_else(|| Error::corrupt("no extent tree"))?;
        Ok(ExtentCursor::at(fs, root))
    }

    /// A cursor over the extent tree rooted at `root` (an older commit's, for one).
    pub(crate) fn at(fs: &'a FsInfo, root: RootPtr) -> ExtentCursor<'a> {
        ExtentCursor {
            fs,
            root,
            path: None,
        }
    }

    /// Positions at the first item >= key; false when none.
    fn seek(&mut self, key: &Key) -> Result<bool> {
        if let Some(p) = self.path.as_mut() {
            let leaf = p.leaf().clone();
            let v = leaf.view();
            let n = leaf.nritems();
            if n > 0 {
                let first = v.item_key(0).map_err(|e| Error::corrupt(e.to_string()))?;
                let last = v
                    .item_key(n - 1)
                    .map_err(|e| Error::corrupt(e.to_string()))?;
                if first <= *key && *key <= last {
                    // Binary search inside the leaf we already hold.
                    let (mut lo, mut hi) = (0usize, n);
                    while lo < hi {
                        let mid = (lo + hi) / 2;
                        let k = v.item_key(mid).map_err(|e| Error::corrupt(e.to_string()))?;
                        if k < *key {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    p.nodes[0].1 = lo;
                    return Ok(true);
                }
            }
        }
        self.path = search_forward(self.fs, &self.root, key)?;
        Ok(self.path.is_some())
    }

    /// The extent item at `bytenr` and every reference to it.
    pub(crate) fn lookup(&mut self, bytenr: u64) -> Result<Option<ExtentRefs>> {
        if !self.seek(&Key::new(bytenr, 0, 0))? {
            return Ok(None);
        }
        let fs = self.fs;
        let Some(p) = self.path.as_mut() else {
            return Ok(None);
        };
        let mut out: Option<ExtentRefs> = None;
        loop {
            let k = p.key()?;
            if k.objectid != bytenr {
                break;
            }
            let data = p.data()?;
            let bad = |e: ubtrfs_format::FormatError| {
                Error::corrupt(format!("extent tree item {k}: {e}"))
            };
            match k.ty {
                EXTENT_ITEM_KEY | METADATA_ITEM_KEY => {
                    let ei = ExtentItem::parse(k.ty, data).map_err(bad)?;
                    let num_bytes = if k.ty == METADATA_ITEM_KEY {
                        fs.nodesize as u64
                    } else {
                        k.offset
                    };
                    let refs_list = ei
                        .inline_refs
                        .iter()
                        .filter_map(|r| match *r {
                            InlineRef::TreeBlock { root } => Some(BackRef::Tree { root }),
                            InlineRef::SharedBlock { parent } => {
                                Some(BackRef::SharedBlock { parent })
                            }
                            InlineRef::ExtentData {
                                root,
                                objectid,
                                offset,
                                count,
                            } => Some(BackRef::Data {
                                root,
                                ino: objectid,
                                offset,
                                count,
                            }),
                            InlineRef::SharedData { parent, count } => {
                                Some(BackRef::SharedData { parent, count })
                            }
                            InlineRef::Owner { .. } => None,
                        })
                        .collect();
                    out = Some(ExtentRefs {
                        bytenr,
                        num_bytes,
                        refs: ei.refs,
                        generation: ei.generation,
                        flags: ei.flags,
                        refs_list,
                    });
                }
                TREE_BLOCK_REF_KEY | SHARED_BLOCK_REF_KEY | EXTENT_DATA_REF_KEY
                | SHARED_DATA_REF_KEY => {
                    let Some(e) = out.as_mut() else {
                        return Err(Error::corrupt(format!(
                            "extent tree: keyed ref {k} without an extent item"
                        )));
                    };
                    e.refs_list.push(match k.ty {
                        TREE_BLOCK_REF_KEY => BackRef::Tree { root: k.offset },
                        SHARED_BLOCK_REF_KEY => BackRef::SharedBlock { parent: k.offset },
                        EXTENT_DATA_REF_KEY => {
                            let r = ExtentDataRef::parse(data).map_err(bad)?;
                            BackRef::Data {
                                root: r.root,
                                ino: r.objectid,
                                offset: r.offset,
                                count: r.count,
                            }
                        }
                        _ => BackRef::SharedData {
                            parent: k.offset,
                            count: ubtrfs_format::bytes::le32(data, 0, "shared data ref")
                                .map_err(bad)?,
                        },
                    });
                }
                _ => {}
            }
            if !next_item(fs, p)? {
                break;
            }
        }
        Ok(out)
    }
}

/// Where a sharedness walk gets its facts. The filesystem implements it
/// ([`FsRefGraph`]); tests implement it with hand-built reference graphs.
pub trait RefGraph {
    /// The extent item at `bytenr` and every reference to it.
    fn extent_refs(&mut self, bytenr: u64) -> Result<Option<ExtentRefs>>;
    /// The block of `root`'s tree pointing at `child` (None for the root node).
    fn parent_in_root(&mut self, root: u64, child: u64) -> Result<Option<u64>>;
    /// Leaves of `root` with file extent items of `ino` pointing at `bytenr`.
    fn leaves_referencing(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        count: u32,
        bytenr: u64,
    ) -> Result<Vec<u64>>;
}

/// Sharedness checks with a memo of tree-block answers for the whole run.
pub struct SharedCheck<G: RefGraph> {
    pub graph: G,
    block_shared: HashMap<u64, bool>,
}

/// The checker over a real filesystem.
pub type ShareCtx<'a> = SharedCheck<FsRefGraph<'a>>;

/// Upper bound on levels walked up from a block (a hostile image cannot loop us).
const LEVELS_MAX: usize = MAX_LEVEL as usize + 1;

impl<'a> SharedCheck<FsRefGraph<'a>> {
    pub fn new(fs: &'a FsInfo) -> Result<ShareCtx<'a>> {
        Ok(SharedCheck::with_graph(FsRefGraph {
            fs,
            cursor: ExtentCursor::new(fs)?,
            root_tree: None,
            roots: HashMap::new(),
        }))
    }
}

impl<G: RefGraph> SharedCheck<G> {
    pub fn with_graph(graph: G) -> SharedCheck<G> {
        SharedCheck {
            graph,
            block_shared: HashMap::new(),
        }
    }

    /// Is the data extent at `bytenr`, referenced by (root, ino), shared?
    pub fn is_data_extent_shared(&mut self, root: u64, ino: u64, bytenr: u64) -> Result<bool> {
        self.is_data_extent_shared_in(root, ino, bytenr, None)
    }

    /// Same, with the leaf that holds the caller's file extent item: when the only
    /// reference is that single item, no search is needed to find its leaf.
    pub fn is_data_extent_shared_in(
        &mut self,
        root: u64,
        ino: u64,
        bytenr: u64,
        leaf_hint: Option<u64>,
    ) -> Result<bool> {
        let Some(e) = self.graph.extent_refs(bytenr)? else {
            return Err(Error::corrupt(format!(
                "data extent {bytenr} referenced by subvolume {root} inode {ino} has no extent item"
            )));
        };
        let refs: Vec<&BackRef> = e
            .refs_list
            .iter()
            .filter(
                |r| !matches!(r, BackRef::Data { root, .. } if *root == DATA_RELOC_TREE_OBJECTID),
            )
            .collect();
        if refs.len() != 1 {
            return Ok(refs.len() > 1);
        }
        let leaves = match refs[0] {
            BackRef::Data { ino: i, .. } if *i != ino => return Ok(true),
            BackRef::SharedData { parent, .. } => vec![*parent],
            BackRef::Data {
                root: r,
                ino: i,
                count: 1,
                ..
            } if *r == root && *i == ino && leaf_hint.is_some() => leaf_hint.into_iter().collect(),
            BackRef::Data {
                root: r,
                ino: i,
                offset,
                count,
            } => self
                .graph
                .leaves_referencing(*r, *i, *offset, *count, bytenr)?,
            _ => {
                return Err(Error::corrupt(format!(
                    "data extent {bytenr} has a tree-block reference"
                )))
            }
        };
        for leaf in leaves {
            if self.is_block_shared(leaf)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Is this tree block reachable through more than one reference on its way up?
    pub fn is_block_shared(&mut self, bytenr: u64) -> Result<bool> {
        let mut chain = Vec::new();
        let mut cur = bytenr;
        let mut result = false;
        for _ in 0..LEVELS_MAX {
            if let Some(&s) = self.block_shared.get(&cur) {
                result = s;
                break;
            }
            chain.push(cur);
            let Some(e) = self.graph.extent_refs(cur)? else {
                return Err(Error::corrupt(format!(
                    "tree block {cur} has no extent item"
                )));
            };
            if e.refs_list.len() != 1 || e.refs > 1 {
                result = e.refs_list.len() > 1 || e.refs > 1;
                break;
            }
            match e.refs_list[0] {
                BackRef::SharedBlock { parent } => cur = parent,
                BackRef::Tree { root } => match self.graph.parent_in_root(root, cur)? {
                    Some(p) => cur = p,
                    None => {
                        result = false;
                        break;
                    }
                },
                _ => {
                    return Err(Error::corrupt(format!(
                        "tree block {cur} has a data reference"
                    )))
                }
            }
        }
        for b in chain {
            self.block_shared.insert(b, result);
        }
        Ok(result)
    }
}

/// References read from the image's extent tree and subvolume trees.
pub struct FsRefGraph<'a> {
    fs: &'a FsInfo,
    cursor: ExtentCursor<'a>,
    /// Where ROOT_ITEMs are looked up: None for the filesystem's current root tree.
    root_tree: Option<RootPtr>,
    roots: HashMap<u64, Option<RootPtr>>,
}

impl<'a> FsRefGraph<'a> {
    /// The graph of one consistent state of the filesystem, given by its extent tree
    /// and root tree roots (the last commit's, while a transaction changes the
    /// current ones: its blocks stay intact until the next commit).
    pub(crate) fn at(fs: &'a FsInfo, extent_root: RootPtr, root_tree: RootPtr) -> FsRefGraph<'a> {
        FsRefGraph {
            fs,
            cursor: ExtentCursor::at(fs, extent_root),
            root_tree: Some(root_tree),
            roots: HashMap::new(),
        }
    }

    /// The graph of the filesystem's current state.
    pub(crate) fn current(fs: &'a FsInfo) -> Result<FsRefGraph<'a>> {
        Ok(FsRefGraph {
            fs,
            cursor: ExtentCursor::new(fs)?,
            root_tree: None,
            roots: HashMap::new(),
        })
    }

    fn root(&mut self, id: u64) -> Result<Option<RootPtr>> {
        if let Some(r) = self.roots.get(&id) {
            return Ok(*r);
        }
        let r = match &self.root_tree {
            None => self.fs.subvol_ptr(id)?,
            Some(rt) => match crate::tree::ctree::lookup_prev(
                self.fs,
                rt,
                Key::new(id, ROOT_ITEM_KEY, u64::MAX),
            )? {
                Some((k, data)) if k.objectid == id && k.ty == ROOT_ITEM_KEY => {
                    let r = ubtrfs_format::items::RootItem::parse(&data)
                        .map_err(|e| Error::corrupt(format!("root tree item {k}: {e}")))?;
                    Some(crate::io::root_tree::root_ptr_of(id, &r))
                }
                _ => None,
            },
        };
        self.roots.insert(id, r);
        Ok(r)
    }

    /// The root node's address of tree `id`, None when the tree does not exist.
    pub(crate) fn root_block(&mut self, id: u64) -> Result<Option<u64>> {
        Ok(self.root(id)?.map(|r| r.bytenr))
    }
}

impl RefGraph for FsRefGraph<'_> {
    fn extent_refs(&mut self, bytenr: u64) -> Result<Option<ExtentRefs>> {
        self.cursor.lookup(bytenr)
    }

    fn leaves_referencing(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        count: u32,
        bytenr: u64,
    ) -> Result<Vec<u64>> {
        let Some(rp) = self.root(root)? else {
            return Ok(vec![]);
        };
        // After clones the ref offset can wrap (file pos - extent offset < 0).
        let start = if offset >= i64::MAX as u64 { 0 } else { offset };
        let mut out: Vec<u64> = Vec::new();
        let Some(mut p) = search_forward(self.fs, &rp, &Key::new(ino, EXTENT_DATA_KEY, start))?
        else {
            return Ok(out);
        };
        let mut found = 0u32;
        loop {
            let k = p.key()?;
            if k.objectid != ino || k.ty != EXTENT_DATA_KEY {
                break;
            }
            let fe = FileExtentItem::parse(p.data()?)
                .map_err(|e| Error::corrupt(format!("subvolume {root} {k}: {e}")))?;
            if let FileExtentBody::Regular {
                disk_bytenr,
                offset: extent_offset,
                ..
            } = fe.body
            {
                // The ref names (inode, file offset - extent offset): other items of
                // the same extent at other positions belong to other refs.
                if disk_bytenr == bytenr && k.offset.wrapping_sub(extent_offset) == offset {
                    found += 1;
                    let leaf = p.leaf().bytenr;
                    if out.last() != Some(&leaf) {
                        out.push(leaf);
                    }
                    if found >= count {
                        break;
                    }
                }
            }
            if !next_item(self.fs, &mut p)? {
                break;
            }
        }
        Ok(out)
    }

    fn parent_in_root(&mut self, root: u64, child: u64) -> Result<Option<u64>> {
        let Some(rp) = self.root(root)? else {
            return Ok(None);
        };
        if rp.bytenr == child {
            return Ok(None);
        }
        let blk = self.fs.read_tree_block(child, &Expect::default())?;
        let level = blk.level();
        let first = if blk.nritems() > 0 {
            blk.view()
                .key_at(0)
                .map_err(|e| Error::corrupt(e.to_string()))?
        } else {
            Key::MIN
        };
        let mut node = read_root(self.fs, &rp)?;
        while node.level() > level + 1 {
            let slot = slot_for(&node, &first)?;
            let p = node
                .view()
                .key_ptr(slot)
                .map_err(|e| Error::corrupt(e.to_string()))?;
            node = self.fs.read_tree_block(
                p.blockptr,
                &Expect {
                    level: Some(node.level() - 1),
                    generation: Some(p.generation),
                    first_key: Some(p.key),
                },
            )?;
        }
        if node.level() != level + 1 {
            return Ok(None);
        }
        for i in 0..node.nritems() {
            let p = node
                .view()
                .key_ptr(i)
                .map_err(|e| Error::corrupt(e.to_string()))?;
            if p.blockptr == child {
                return Ok(Some(node.bytenr));
            }
        }
        Ok(None)
    }
}

fn slot_for(node: &crate::tree::TreeBlock, key: &Key) -> Result<usize> {
    let v = node.view();
    let (mut lo, mut hi) = (0usize, node.nritems());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let k = v.key_at(mid).map_err(|e| Error::corrupt(e.to_string()))?;
        if k <= *key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    //! Hand-built reference graphs whose answers are known.
    use super::*;

    const R: u64 = 5;
    const S: u64 = 256;
    const INO: u64 = 257;

    #[derive(Default)]
    struct Graph {
        refs: HashMap<u64, ExtentRefs>,
        parents: HashMap<(u64, u64), u64>,
        leaves: HashMap<(u64, u64, u64), Vec<u64>>,
    }

    impl Graph {
        fn block(&mut self, bytenr: u64, refs: Vec<BackRef>) {
            let n = refs.len() as u64;
            self.refs.insert(
                bytenr,
                ExtentRefs {
                    bytenr,
                    num_bytes: 16384,
                    refs: n,
                    generation: 1,
                    flags: EXTENT_FLAG_TREE_BLOCK,
                    refs_list: refs,
                },
            );
        }
        fn data(&mut self, bytenr: u64, refs: Vec<BackRef>) {
            let n = refs
                .iter()
                .map(|r| match r {
                    BackRef::Data { count, .. } | BackRef::SharedData { count, .. } => {
                        *count as u64
                    }
                    _ => 1,
                })
                .sum();
            self.refs.insert(
                bytenr,
                ExtentRefs {
                    bytenr,
                    num_bytes: 4096,
                    refs: n,
                    generation: 1,
                    flags: EXTENT_FLAG_DATA,
                    refs_list: refs,
                },
            );
        }
    }

    impl RefGraph for Graph {
        fn extent_refs(&mut self, bytenr: u64) -> Result<Option<ExtentRefs>> {
            Ok(self.refs.get(&bytenr).cloned())
        }
        fn parent_in_root(&mut self, root: u64, child: u64) -> Result<Option<u64>> {
            Ok(self.parents.get(&(root, child)).copied())
        }
        fn leaves_referencing(
            &mut self,
            root: u64,
            ino: u64,
            _offset: u64,
            _count: u32,
            bytenr: u64,
        ) -> Result<Vec<u64>> {
            Ok(self
                .leaves
                .get(&(root, ino, bytenr))
                .cloned()
                .unwrap_or_default())
        }
    }

    fn dref(root: u64, ino: u64, offset: u64, count: u32) -> BackRef {
        BackRef::Data {
            root,
            ino,
            offset,
            count,
        }
    }

    /// Root R: node 1000 -> leaf 2000 -> data 9000, nothing shared.
    fn private_tree() -> Graph {
        let mut g = Graph::default();
        g.block(1000, vec![BackRef::Tree { root: R }]);
        g.block(2000, vec![BackRef::Tree { root: R }]);
        g.parents.insert((R, 2000), 1000);
        g.data(9000, vec![dref(R, INO, 0, 1)]);
        g.leaves.insert((R, INO, 9000), vec![2000]);
        g
    }

    #[test]
    fn private_extent_is_not_shared() {
        let mut c = SharedCheck::with_graph(private_tree());
        assert!(!c.is_data_extent_shared(R, INO, 9000).unwrap());
        assert!(!c
            .is_data_extent_shared_in(R, INO, 9000, Some(2000))
            .unwrap());
    }

    #[test]
    fn reflink_to_another_inode_is_shared() {
        let mut g = private_tree();
        g.data(9000, vec![dref(R, INO, 0, 1), dref(R, INO + 1, 0, 1)]);
        assert!(SharedCheck::with_graph(g)
            .is_data_extent_shared(R, INO, 9000)
            .unwrap());
    }

    #[test]
    fn reflink_within_the_same_file_is_shared() {
        // Two items of one inode at different ref offsets: two distinct refs.
        let mut g = private_tree();
        g.data(9000, vec![dref(R, INO, 0, 1), dref(R, INO, 65536, 1)]);
        assert!(SharedCheck::with_graph(g)
            .is_data_extent_shared(R, INO, 9000)
            .unwrap());
    }

    #[test]
    fn split_extent_in_one_file_is_not_shared() {
        // A partial overwrite splits one item into two with the same ref offset:
        // one ref with count 2, both in the private leaf.
        let mut g = private_tree();
        g.data(9000, vec![dref(R, INO, 0, 2)]);
        assert!(!SharedCheck::with_graph(g)
            .is_data_extent_shared(R, INO, 9000)
            .unwrap());
    }

    #[test]
    fn leaf_shared_by_a_snapshot_makes_the_extent_shared() {
        // Snapshot S shares leaf 2000 (two tree refs) while the data extent still has
        // a single reference from R.
        let mut g = private_tree();
        g.block(
            2000,
            vec![BackRef::Tree { root: R }, BackRef::Tree { root: S }],
        );
        let mut c = SharedCheck::with_graph(g);
        assert!(c.is_data_extent_shared(R, INO, 9000).unwrap());
        assert!(c.is_data_extent_shared(S, INO, 9000).unwrap());
    }

    #[test]
    fn shared_node_above_a_private_leaf_makes_it_shared() {
        // Leaf 2000 has one ref (root R), but its parent node 1000 is shared with S.
        let mut g = private_tree();
        g.block(
            1000,
            vec![BackRef::Tree { root: R }, BackRef::Tree { root: S }],
        );
        assert!(SharedCheck::with_graph(g)
            .is_data_extent_shared(R, INO, 9000)
            .unwrap());
    }

    #[test]
    fn full_backref_parent_chain_is_followed() {
        // Data referenced through SHARED_DATA_REF from leaf 2100, whose only ref is
        // SHARED_BLOCK_REF from node 1100, which two roots reference.
        let mut g = Graph::default();
        g.data(
            9100,
            vec![BackRef::SharedData {
                parent: 2100,
                count: 1,
            }],
        );
        g.block(2100, vec![BackRef::SharedBlock { parent: 1100 }]);
        g.block(
            1100,
            vec![BackRef::Tree { root: R }, BackRef::Tree { root: S }],
        );
        assert!(SharedCheck::with_graph(g)
            .is_data_extent_shared(R, INO, 9100)
            .unwrap());
        // And not shared when the chain ends at a single root's root node.
        let mut g = Graph::default();
        g.data(
            9100,
            vec![BackRef::SharedData {
                parent: 2100,
                count: 1,
            }],
        );
        g.block(2100, vec![BackRef::SharedBlock { parent: 1100 }]);
        g.block(1100, vec![BackRef::Tree { root: R }]);
        assert!(!SharedCheck::with_graph(g)
            .is_data_extent_shared(R, INO, 9100)
            .unwrap());
    }

    #[test]
    fn data_reloc_references_are_ignored() {
        let mut g = private_tree();
        g.data(
            9000,
            vec![
                dref(R, INO, 0, 1),
                dref(DATA_RELOC_TREE_OBJECTID, 257, 0, 1),
            ],
        );
        assert!(!SharedCheck::with_graph(g)
            .is_data_extent_shared(R, INO, 9000)
            .unwrap());
    }

    #[test]
    fn missing_extent_item_is_an_error_not_a_panic() {
        let mut c = SharedCheck::with_graph(Graph::default());
        assert!(c.is_data_extent_shared(R, INO, 1).is_err());
        assert!(c.is_block_shared(1).is_err());
    }

    #[test]
    fn parent_cycle_terminates() {
        // Hostile: two blocks naming each other as parent.
        let mut g = Graph::default();
        g.block(1, vec![BackRef::SharedBlock { parent: 2 }]);
        g.block(2, vec![BackRef::SharedBlock { parent: 1 }]);
        assert!(!SharedCheck::with_graph(g).is_block_shared(1).unwrap());
    }
}
