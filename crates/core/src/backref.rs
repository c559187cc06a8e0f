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

use crate::ctree::{next_item, read_root, search_forward, Path};
use crate::disk_io::{FsInfo, RootPtr};
use crate::error::{Error, Result};
use crate::tree_checker::Expect;
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
pub struct ExtentCursor<'a> {
    fs: &'a FsInfo,
    root: RootPtr,
    path: Option<Path>,
}

impl<'a> ExtentCursor<'a> {
    pub fn new(fs: &'a FsInfo) -> Result<ExtentCursor<'a>> {
        let root = fs
            .tree_ptr(EXTENT_TREE_OBJECTID)
            .ok_or_else(|| Error::corrupt("no extent tree"))?;
        Ok(ExtentCursor {
            fs,
            root,
            path: None,
        })
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
    pub fn lookup(&mut self, bytenr: u64) -> Result<Option<ExtentRefs>> {
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

/// Memo of tree-block sharedness plus the cursors a sharedness walk needs.
pub struct ShareCtx<'a> {
    fs: &'a FsInfo,
    cursor: ExtentCursor<'a>,
    block_shared: HashMap<u64, bool>,
    roots: HashMap<u64, Option<RootPtr>>,
}

/// Upper bound on levels walked up from a block (a hostile image cannot loop us).
const LEVELS_MAX: usize = MAX_LEVEL as usize + 1;

impl<'a> ShareCtx<'a> {
    pub fn new(fs: &'a FsInfo) -> Result<ShareCtx<'a>> {
        Ok(ShareCtx {
            fs,
            cursor: ExtentCursor::new(fs)?,
            block_shared: HashMap::new(),
            roots: HashMap::new(),
        })
    }

    pub fn cursor(&mut self) -> &mut ExtentCursor<'a> {
        &mut self.cursor
    }

    fn root(&mut self, id: u64) -> Result<Option<RootPtr>> {
        if let Some(r) = self.roots.get(&id) {
            return Ok(*r);
        }
        let r = self.fs.subvol_ptr(id)?;
        self.roots.insert(id, r);
        Ok(r)
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
        let Some(e) = self.cursor.lookup(bytenr)? else {
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
            } => self.leaves_referencing(*r, *i, *offset, *count, bytenr)?,
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

    /// Leaves of `root` holding file extent items of `ino` that point at `bytenr`.
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
            if let FileExtentBody::Regular { disk_bytenr, .. } = fe.body {
                if disk_bytenr == bytenr {
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
            let Some(e) = self.cursor.lookup(cur)? else {
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
                BackRef::Tree { root } => match self.parent_in_root(root, cur)? {
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

    /// The block of `root`'s tree that points at `child` (None when `child` is the
    /// root node itself).
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

fn slot_for(node: &crate::disk_io::TreeBlock, key: &Key) -> Result<usize> {
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
