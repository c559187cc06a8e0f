//! B-tree search and iteration. A [`Path`] holds one (block, slot) per level from the
//! root down to a leaf, like the kernel's btrfs_path; iteration moves the leaf slot and
//! climbs only when a leaf is exhausted, so a forward walk reads each block once.

use crate::error::{Error, Result};
use crate::tree::tree_checker::Expect;
use crate::tree::{BlockSource, RootPtr, TreeBlock};
use std::sync::Arc;
use ubtrfs_format::key::Key;

#[derive(Clone, Debug)]
/// A position in a b-tree: one (block, slot) per level, leaf first (the kernel's
/// btrfs_path).
pub struct Path {
    /// `nodes[0]` is the leaf; `nodes[level]` the block at that level.
    pub nodes: Vec<(Arc<TreeBlock>, usize)>,
}

impl Path {
    /// The leaf block.
    pub fn leaf(&self) -> &Arc<TreeBlock> {
        &self.nodes[0].0
    }
    /// The slot in the leaf.
    pub fn slot(&self) -> usize {
        self.nodes[0].1
    }
    /// True when the leaf slot points at an item (not past the end).
    pub fn valid(&self) -> bool {
        self.slot() < self.leaf().nritems()
    }
    /// The key at the leaf slot.
    pub fn key(&self) -> Result<Key> {
        self.leaf()
            .view()
            .item_key(self.slot())
            .map_err(|e| Error::corrupt(e.to_string()))
    }
    /// The item data at the leaf slot.
    pub fn data(&self) -> Result<&[u8]> {
        self.leaf()
            .view()
            .item_data(self.slot())
            .map_err(|e| Error::corrupt(e.to_string()))
    }
    /// A handle to the item at the leaf slot.
    pub fn item(&self) -> ItemRef {
        ItemRef {
            block: self.leaf().clone(),
            slot: self.slot(),
        }
    }
}

/// A handle to one leaf item that keeps its block alive.
#[derive(Clone, Debug)]
pub struct ItemRef {
    /// The leaf holding the item.
    pub block: Arc<TreeBlock>,
    /// Its slot in the leaf.
    pub slot: usize,
}

impl ItemRef {
    /// The item's key.
    pub fn key(&self) -> Key {
        // The tree checker validated every item header of this leaf.
        self.block.view().item_key(self.slot).unwrap_or_default()
    }
    /// The item's data.
    pub fn data(&self) -> &[u8] {
        self.block.view().item_data(self.slot).unwrap_or(&[])
    }
}

pub(crate) fn child_expect(parent: &TreeBlock, slot: usize) -> Result<(u64, Expect)> {
    let p = parent
        .view()
        .key_ptr(slot)
        .map_err(|e| Error::corrupt(format!("tree block {}: {e}", parent.bytenr)))?;
    Ok((
        p.blockptr,
        Expect {
            level: Some(parent.level() - 1),
            generation: Some(p.generation),
            first_key: Some(p.key),
        },
    ))
}

fn read_child(fs: &dyn BlockSource, parent: &TreeBlock, slot: usize) -> Result<Arc<TreeBlock>> {
    let (bytenr, expect) = child_expect(parent, slot)?;
    fs.read_tree_block(bytenr, &expect)
}

pub(crate) fn read_root(fs: &dyn BlockSource, root: &RootPtr) -> Result<Arc<TreeBlock>> {
    fs.read_tree_block(
        root.bytenr,
        &Expect {
            level: Some(root.level),
            generation: Some(root.generation),
            first_key: None,
        },
    )
    .map_err(|e| match e {
        Error::Corrupt(m) => Error::Corrupt(format!("{m} (root of tree {})", root.id as i64)),
        e => e,
    })
}

/// Positions a path at the first item >= `key` in its leaf (the slot may equal
/// nritems when every key in that leaf is smaller; `search_forward` moves past it).
pub fn search_slot(fs: &dyn BlockSource, root: &RootPtr, key: &Key) -> Result<Path> {
    let top = read_root(fs, root)?;
    let levels = top.level() as usize + 1;
    let mut nodes: Vec<Option<(Arc<TreeBlock>, usize)>> = vec![None; levels];
    let mut cur = top;
    loop {
        let v = cur.view();
        let n = cur.nritems();
        // Binary search for the first slot whose key is > key.
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let k = v
                .key_at(mid)
                .map_err(|e| Error::corrupt(format!("tree block {}: {e}", cur.bytenr)))?;
            if k <= *key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let level = cur.level() as usize;
        if level == 0 {
            // lo = first slot with key > key; step back if the previous is equal.
            let slot = if lo > 0
                && v.key_at(lo - 1)
                    .map_err(|e| Error::corrupt(e.to_string()))?
                    == *key
            {
                lo - 1
            } else {
                lo
            };
            nodes[0] = Some((cur, slot));
            break;
        }
        let slot = lo.saturating_sub(1);
        let child = read_child(fs, &cur, slot)?;
        nodes[level] = Some((cur, slot));
        cur = child;
    }
    let nodes = nodes
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::corrupt(format!("tree {} has a level gap", root.id)))?;
    Ok(Path { nodes })
}

/// Moves to the next leaf when the slot is past the end; false when the tree ends.
fn fixup_forward(fs: &dyn BlockSource, path: &mut Path) -> Result<bool> {
    if path.valid() {
        return Ok(true);
    }
    next_leaf(fs, path)
}

/// Moves the path to the first item of the next leaf. False at the end of the tree.
///
/// Keys must grow from leaf to leaf: a hostile tree that links one block from several
/// nodes (the first-key check cannot tell the copies apart when their parents differ)
/// would otherwise be walked again and again, exponentially in its height.
pub(crate) fn next_leaf(fs: &dyn BlockSource, path: &mut Path) -> Result<bool> {
    let leaf = path.leaf();
    let mut floor = match leaf.nritems() {
        0 => None,
        n => Some(key_of(leaf, n - 1)?),
    };
    loop {
        let mut level = 1;
        loop {
            if level >= path.nodes.len() {
                let leaf_n = path.leaf().nritems();
                path.nodes[0].1 = leaf_n;
                return Ok(false);
            }
            let (ref node, slot) = path.nodes[level];
            if slot + 1 < node.nritems() {
                path.nodes[level].1 = slot + 1;
                break;
            }
            level += 1;
        }
        let (node, slot) = &path.nodes[level];
        let k = key_of(node, *slot)?;
        if let Some(f) = floor {
            if k <= f {
                return Err(Error::corrupt(format!(
                    "tree block {}: slot {slot} key {k} does not follow {f} (a block reached twice?)",
                    node.bytenr
                )));
            }
        }
        // Descend along the leftmost edge.
        while level > 0 {
            let (node, slot) = path.nodes[level].clone();
            let child = read_child(fs, &node, slot)?;
            level -= 1;
            path.nodes[level] = (child, 0);
        }
        if path.leaf().nritems() > 0 {
            return Ok(true);
        }
        floor = Some(k);
    }
}

fn key_of(b: &TreeBlock, slot: usize) -> Result<Key> {
    b.view()
        .key_at(slot)
        .map_err(|e| Error::corrupt(format!("tree block {}: {e}", b.bytenr)))
}

/// Advances to the next item. False at the end of the tree.
pub(crate) fn next_item(fs: &dyn BlockSource, path: &mut Path) -> Result<bool> {
    path.nodes[0].1 += 1;
    fixup_forward(fs, path)
}

/// Steps back to the previous item. False at the start of the tree. Keys must shrink
/// from leaf to leaf (see [`next_leaf`]).
pub(crate) fn prev_item(fs: &dyn BlockSource, path: &mut Path) -> Result<bool> {
    if path.nodes[0].1 > 0 {
        path.nodes[0].1 -= 1;
        return Ok(true);
    }
    let leaf = path.leaf();
    let mut ceiling = match leaf.nritems() {
        0 => None,
        _ => Some(key_of(leaf, 0)?),
    };
    loop {
        let mut level = 1;
        loop {
            if level >= path.nodes.len() {
                return Ok(false);
            }
            let slot = path.nodes[level].1;
            if slot > 0 {
                path.nodes[level].1 = slot - 1;
                break;
            }
            level += 1;
        }
        let (node, slot) = &path.nodes[level];
        let k = key_of(node, *slot)?;
        if let Some(c) = ceiling {
            if k >= c {
                return Err(Error::corrupt(format!(
                    "tree block {}: slot {slot} key {k} does not precede {c} (a block reached twice?)",
                    node.bytenr
                )));
            }
        }
        while level > 0 {
            let (node, slot) = path.nodes[level].clone();
            let child = read_child(fs, &node, slot)?;
            let last = child.nritems().saturating_sub(1);
            level -= 1;
            path.nodes[level] = (child, last);
        }
        if path.leaf().nritems() > 0 {
            return Ok(true);
        }
        ceiling = Some(k);
    }
}

/// A path at the first item >= key, or None when no such item exists.
pub(crate) fn search_forward(
    fs: &dyn BlockSource,
    root: &RootPtr,
    key: &Key,
) -> Result<Option<Path>> {
    let mut p = search_slot(fs, root, key)?;
    if fixup_forward(fs, &mut p)? {
        Ok(Some(p))
    } else {
        Ok(None)
    }
}

/// The item with exactly this key.
pub fn lookup_exact(fs: &dyn BlockSource, root: &RootPtr, key: &Key) -> Result<Option<ItemRef>> {
    let p = search_slot(fs, root, key)?;
    if p.valid() && p.key()? == *key {
        Ok(Some(p.item()))
    } else {
        Ok(None)
    }
}

/// The last item with key <= `key`.
pub(crate) fn lookup_prev(
    fs: &dyn BlockSource,
    root: &RootPtr,
    key: Key,
) -> Result<Option<(Key, Vec<u8>)>> {
    let mut p = search_slot(fs, root, &key)?;
    if p.valid() && p.key()? == key {
        return Ok(Some((key, p.data()?.to_vec())));
    }
    if !prev_item(fs, &mut p)? {
        return Ok(None);
    }
    Ok(Some((p.key()?, p.data()?.to_vec())))
}

/// The last item with key <= `key`, as a path (for walking on from there).
pub(crate) fn search_prev(fs: &dyn BlockSource, root: &RootPtr, key: &Key) -> Result<Option<Path>> {
    let mut p = search_slot(fs, root, key)?;
    if p.valid() && p.key()? == *key {
        return Ok(Some(p));
    }
    if prev_item(fs, &mut p)? {
        Ok(Some(p))
    } else {
        Ok(None)
    }
}

/// Calls `f` for every item from `start` on, in key order, until it returns false.
pub fn walk_items(
    fs: &dyn BlockSource,
    root: &RootPtr,
    start: Key,
    mut f: impl FnMut(&Key, &[u8]) -> Result<bool>,
) -> Result<()> {
    let Some(mut p) = search_forward(fs, root, &start)? else {
        return Ok(());
    };
    // Bound the walk: a corrupt tree cannot make us loop forever because every step
    // moves strictly forward in key order (checked per block) and down in level.
    loop {
        let k = p.key()?;
        if !f(&k, p.data()?)? {
            return Ok(());
        }
        if !next_item(fs, &mut p)? {
            return Ok(());
        }
    }
}

/// Iterates items in [start, end] in key order.
pub struct TreeIter<'a> {
    fs: &'a dyn BlockSource,
    path: Option<Path>,
    end: Key,
    started: bool,
}

impl<'a> TreeIter<'a> {
    /// Items with keys in [start, end] of the tree rooted at `root`.
    pub fn new(
        fs: &'a dyn BlockSource,
        root: &RootPtr,
        start: Key,
        end: Key,
    ) -> Result<TreeIter<'a>> {
        Ok(TreeIter {
            fs,
            path: search_forward(fs, root, &start)?,
            end,
            started: false,
        })
    }
    /// The next item, `None` past the end.
    pub fn next_item(&mut self) -> Result<Option<ItemRef>> {
        let Some(p) = self.path.as_mut() else {
            return Ok(None);
        };
        if self.started && !next_item(self.fs, p)? {
            self.path = None;
            return Ok(None);
        }
        self.started = true;
        let k = p.key()?;
        if k > self.end {
            self.path = None;
            return Ok(None);
        }
        Ok(Some(p.item()))
    }
}

impl Iterator for TreeIter<'_> {
    type Item = Result<ItemRef>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_item().transpose()
    }
}

/// The address of every block of a tree (nodes and leaves), each read and verified
/// against its parent pointer.
pub(crate) fn tree_block_addrs(fs: &dyn BlockSource, root: &RootPtr) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut stack = vec![read_root(fs, root)?];
    while let Some(b) = stack.pop() {
        out.push(b.bytenr);
        if b.level() == 0 {
            continue;
        }
        for slot in 0..b.nritems() {
            stack.push(read_child(fs, &b, slot)?);
        }
    }
    Ok(out)
}

/// Reads `want` (address and what its parent says of it) on `threads` threads;
/// the results in the order asked.
pub(crate) fn read_tree_blocks<S: BlockSource + Sync>(
    fs: &S,
    want: &[(u64, Expect)],
    threads: usize,
) -> Vec<Result<Arc<TreeBlock>>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let mut got: Vec<(usize, Result<Arc<TreeBlock>>)> = Vec::with_capacity(want.len());
    std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads.clamp(1, want.len().max(1)))
            .map(|_| {
                sc.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((bytenr, expect)) = want.get(i) else {
                            return mine;
                        };
                        mine.push((i, fs.read_tree_block(*bytenr, expect)));
                    }
                })
            })
            .collect();
        for w in workers {
            if let Ok(mine) = w.join() {
                got.extend(mine);
            }
        }
    });
    got.sort_unstable_by_key(|(i, _)| *i);
    let mut out = Vec::with_capacity(want.len());
    let mut it = got.into_iter().peekable();
    for (i, (bytenr, _)) in want.iter().enumerate() {
        match it.next_if(|(j, _)| *j == i) {
            Some((_, r)) => out.push(r),
            // Its reader panicked: say so for this block.
            None => out.push(Err(Error::corrupt(format!(
                "tree block {bytenr}: its read did not finish"
            )))),
        }
    }
    out
}

/// Reads a whole tree ahead of a walk that will need all of it, a level at a time
/// in address order, on `threads` threads ([`read_tree_blocks`]), so a cold device
/// serves many requests at once instead of one leaf after another (the blocks land
/// in the block cache, verified against their parents as a walk would). Stops once
/// `bytes_max` bytes were read (a tree larger than the cache would only evict
/// itself). Errors are left for the walk to report where it meets them.
pub(crate) fn prefetch_tree<S: BlockSource + Sync>(
    fs: &S,
    root: &RootPtr,
    threads: usize,
    bytes_max: u64,
) {
    let Ok(top) = read_root(fs, root) else {
        return;
    };
    let node_bytes = top.data.len().max(1) as u64;
    let mut budget_blocks = (bytes_max / node_bytes).saturating_sub(1);
    let mut level = vec![top];
    while budget_blocks > 0 && level.first().is_some_and(|b| b.level() > 0) {
        // Every child pointer of this level, as far as the budget goes.
        let mut wanted = Vec::new();
        for b in &level {
            wanted.extend((0..b.nritems()).filter_map(|slot| child_expect(b, slot).ok()));
        }
        wanted.truncate(usize::try_from(budget_blocks).unwrap_or(usize::MAX));
        budget_blocks -= wanted.len() as u64;
        wanted.sort_unstable_by_key(|(bytenr, _)| *bytenr);
        level = read_tree_blocks(fs, &wanted, threads)
            .into_iter()
            .filter_map(|r| r.ok())
            .collect();
    }
}
