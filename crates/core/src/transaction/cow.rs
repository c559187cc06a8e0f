//! Copy-on-write b-tree modification (the write half of the kernel's ctree.c): search
//! with intent to modify (CoW every block on the path, split full nodes on the way down
//! when inserting), insert (batched into one leaf when keys allow), delete with empty
//! leaf removal and merging of small leaves into a sibling, item resize, level growth
//! and shrink. Blocks touched in a transaction live in `FsInfo::dirty` until commit and
//! are modified in place there; a block is CoWed at most once per transaction.

use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::block_edit as eb;
use crate::tree::tree_checker::Expect;
use crate::tree::TreeBlock;
use std::sync::Arc;
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

/// A path from the root to a leaf: `nodes[level] = (bytenr, slot)`.
#[derive(Clone, Debug)]
pub(crate) struct WPath {
    pub nodes: Vec<(u64, usize)>,
}

impl WPath {
    pub(crate) fn leaf(&self) -> u64 {
        self.nodes[0].0
    }
    pub(crate) fn slot(&self) -> usize {
        self.nodes[0].1
    }
}

impl Trans {
    pub(crate) fn block(&self, bytenr: u64) -> Result<Arc<TreeBlock>> {
        self.fs.info.read_tree_block(bytenr, &Expect::default())
    }

    /// Runs `f` on the bytes of a dirty (CoWed in this transaction) block.
    pub(crate) fn with_block<R>(&self, bytenr: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let mut d = self
            .fs
            .info
            .dirty
            .lock()
            .map_err(|_| Error::corrupt("internal: dirty block map poisoned"))?;
        let b = d.get_mut(&bytenr).ok_or_else(|| {
            Error::corrupt(format!("internal: block {bytenr} modified without CoW"))
        })?;
        Ok(f(&mut Arc::make_mut(b).data))
    }

    pub(crate) fn is_dirty(&self, bytenr: u64) -> bool {
        self.fs.info.dirty_get(bytenr).is_some()
    }

    pub(crate) fn put_dirty(&self, bytenr: u64, data: Vec<u8>) -> Result<()> {
        let mut d = self
            .fs
            .info
            .dirty
            .lock()
            .map_err(|_| Error::corrupt("internal: dirty block map poisoned"))?;
        d.insert(bytenr, Arc::new(TreeBlock { bytenr, data }));
        Ok(())
    }

    pub(crate) fn drop_dirty(&self, bytenr: u64) {
        if let Ok(mut d) = self.fs.info.dirty.lock() {
            d.remove(&bytenr);
        }
    }

    fn dirty_copy(&self, bytenr: u64) -> Result<Vec<u8>> {
        Ok(self.block(bytenr)?.data.clone())
    }

    /// A fresh, empty block owned by `root_id` at `level`.
    pub(crate) fn new_block(
        &mut self,
        root_id: u64,
        level: u8,
        key: Option<Key>,
        hint: u64,
    ) -> Result<(u64, Vec<u8>)> {
        let bytenr = self.alloc_tree_block(root_id, level, key, hint)?;
        let mut data = vec![0u8; self.fs.info.nodesize as usize];
        eb::set_header(
            &mut data,
            bytenr,
            self.transid,
            root_id,
            level,
            &self.fs.info.sb.metadata_fsid(),
            &self.chunk_tree_uuid,
        );
        Ok((bytenr, data))
    }

    /// Copy-on-write of one block; returns the address of the writable copy (the block
    /// itself if it was already CoWed in this transaction). `parent` is the (dirty)
    /// node pointing at it, None for the root.
    pub(crate) fn cow_block(
        &mut self,
        root_id: u64,
        bytenr: u64,
        parent: Option<(u64, usize)>,
        expect: Expect,
    ) -> Result<u64> {
        if self.is_dirty(bytenr) {
            return Ok(bytenr);
        }
        let old = self.fs.info.read_tree_block(bytenr, &expect)?;
        let level = old.level();
        let first = eb::first_key(&old.data);
        let new = self.alloc_tree_block(root_id, level, first, bytenr)?;
        let mut data = old.data.clone();
        eb::set_bytenr(&mut data, new);
        eb::set_generation(&mut data, self.transid);
        let flags = eb::flags(&data)
            & ((1u64 << BACKREF_REV_SHIFT) - 1)
            & !(HEADER_FLAG_WRITTEN | HEADER_FLAG_RELOC);
        eb::set_flags(&mut data, flags | (MIXED_BACKREF_REV << BACKREF_REV_SHIFT));
        eb::set_owner(&mut data, root_id);
        self.update_ref_for_cow(root_id, &old, new, &data)?;
        self.put_dirty(new, data)?;
        match parent {
            Some((p, slot)) => {
                let t = self.transid;
                self.with_block(p, |b| eb::set_node_ptr(b, slot, new, t))?;
            }
            None => self.set_root(root_id, new, level)?,
        }
        self.free_tree_block(root_id, bytenr, level)?;
        Ok(new)
    }

    /// Search for `key` in tree `root_id`. With `cow`, every block on the path is made
    /// writable; `ins_len > 0` guarantees that many free bytes in the leaf (splitting
    /// as needed). Returns the path and whether the key exists (else the slot is where
    /// it would be inserted).
    pub(crate) fn search_mut(
        &mut self,
        root_id: u64,
        key: &Key,
        ins_len: usize,
        cow: bool,
    ) -> Result<(WPath, bool)> {
        let mut restarts = 0u32;
        'restart: loop {
            restarts += 1;
            if restarts > 64 {
                return Err(Error::corrupt(format!(
                    "internal: no room for a {ins_len}-byte insert into tree {root_id}"
                )));
            }
            let (root_bytenr, root_level) = self.root_node(root_id)?;
            let mut bytenr = if cow {
                self.cow_block(root_id, root_bytenr, None, Expect::default())?
            } else {
                root_bytenr
            };
            let mut path = WPath {
                nodes: vec![(0, 0); root_level as usize + 1],
            };
            let mut level = root_level as usize;
            loop {
                let blk = self.block(bytenr)?;
                let b = &blk.data;
                if eb::level(b) as usize != level {
                    return Err(Error::corrupt(format!(
                        "tree block {bytenr}: level {} expected {level}",
                        eb::level(b)
                    )));
                }
                if level > 0 {
                    let n = eb::nritems(b);
                    if n == 0 {
                        return Err(Error::corrupt(format!("tree block {bytenr}: empty node")));
                    }
                    let slot = match eb::bin_search(b, key) {
                        Ok(s) => s,
                        Err(0) => 0,
                        Err(s) => s - 1,
                    };
                    path.nodes[level] = (bytenr, slot);
                    if ins_len > 0 && cow && n + 3 >= eb::node_ptrs_max(b) {
                        drop(blk);
                        self.split_node(root_id, &mut path, level)?;
                        continue 'restart;
                    }
                    let child = eb::node_blockptr(b, slot);
                    let expect = Expect {
                        level: Some(level as u8 - 1),
                        generation: Some(eb::node_ptr_gen(b, slot)),
                        first_key: None,
                    };
                    drop(blk);
                    bytenr = if cow {
                        self.cow_block(root_id, child, Some((bytenr, slot)), expect)?
                    } else {
                        self.fs.info.read_tree_block(child, &expect)?;
                        child
                    };
                    level -= 1;
                } else {
                    let (slot, found) = match eb::bin_search(b, key) {
                        Ok(s) => (s, true),
                        Err(s) => (s, false),
                    };
                    path.nodes[0] = (bytenr, slot);
                    if ins_len > 0 && cow && eb::leaf_free_space(b) < ins_len {
                        drop(blk);
                        self.split_leaf(root_id, &mut path, key, ins_len)?;
                        continue 'restart;
                    }
                    return Ok((path, found));
                }
            }
        }
    }

    fn insert_new_root(&mut self, root_id: u64, path: &mut WPath, new_level: usize) -> Result<()> {
        let (old, _) = path.nodes[new_level - 1];
        let blk = self.block(old)?;
        let first = eb::first_key(&blk.data).unwrap_or(Key::MIN);
        let gen = blk.generation();
        drop(blk);
        let (nb, mut data) = self.new_block(root_id, new_level as u8, Some(first), old)?;
        eb::node_insert_ptr(&mut data, 0, &first, old, gen);
        self.put_dirty(nb, data)?;
        self.set_root(root_id, nb, new_level as u8)?;
        path.nodes.push((nb, 0));
        Ok(())
    }

    fn split_leaf(
        &mut self,
        root_id: u64,
        path: &mut WPath,
        key: &Key,
        ins_len: usize,
    ) -> Result<()> {
        if path.nodes.len() == 1 {
            self.insert_new_root(root_id, path, 1)?;
        }
        let (leaf, slot) = path.nodes[0];
        let mut data = self.dirty_copy(leaf)?;
        let n = eb::nritems(&data);
        let mid = if slot >= n {
            n
        } else if n == 1 {
            slot
        } else {
            let total = eb::leaf_space_used(&data, 0, n) + ins_len;
            let mut acc = 0;
            let mut m = 0;
            while m < n {
                let used = eb::leaf_space_used(&data, m, 1) + if m == slot { ins_len } else { 0 };
                if acc + used > total / 2 {
                    break;
                }
                acc += used;
                m += 1;
            }
            m.clamp(1, n - 1)
        };
        let rkey = if mid < n {
            eb::item_key(&data, mid)
        } else {
            *key
        };
        let (right, mut rdata) = self.new_block(root_id, 0, Some(rkey), leaf)?;
        eb::leaf_copy_items(&mut rdata, 0, &data, mid, n - mid);
        eb::leaf_del_items(&mut data, mid, n - mid);
        self.put_dirty(leaf, data)?;
        self.put_dirty(right, rdata)?;
        let (parent, pslot) = path.nodes[1];
        let t = self.transid;
        self.with_block(parent, |p| {
            eb::node_insert_ptr(p, pslot + 1, &rkey, right, t)
        })?;
        Ok(())
    }

    fn split_node(&mut self, root_id: u64, path: &mut WPath, level: usize) -> Result<()> {
        if level + 1 == path.nodes.len() {
            self.insert_new_root(root_id, path, level + 1)?;
        }
        let (node, _) = path.nodes[level];
        let mut data = self.dirty_copy(node)?;
        let n = eb::nritems(&data);
        let mid = n / 2;
        let k = eb::node_key(&data, mid);
        let (right, mut rdata) = self.new_block(root_id, level as u8, Some(k), node)?;
        eb::node_copy_ptrs(&mut rdata, 0, &data, mid, n - mid);
        eb::set_nritems(&mut data, mid);
        self.put_dirty(node, data)?;
        self.put_dirty(right, rdata)?;
        let (parent, pslot) = path.nodes[level + 1];
        let t = self.transid;
        self.with_block(parent, |p| eb::node_insert_ptr(p, pslot + 1, &k, right, t))?;
        Ok(())
    }

    /// After slot 0 of a block at `level` changed key, updates the keys above it.
    fn fixup_low_keys(&mut self, path: &WPath, from_level: usize, key: &Key) -> Result<()> {
        for lvl in from_level..path.nodes.len() {
            let (node, slot) = path.nodes[lvl];
            self.with_block(node, |b| eb::set_node_key(b, slot, key))?;
            if slot != 0 {
                break;
            }
        }
        Ok(())
    }

    /// The smallest key that must not go into the path's leaf (the next leaf's first
    /// key), None if the leaf is the last.
    fn path_next_key(&self, path: &WPath) -> Result<Option<Key>> {
        for lvl in 1..path.nodes.len() {
            let (node, slot) = path.nodes[lvl];
            let b = self.block(node)?;
            if slot + 1 < eb::nritems(&b.data) {
                return Ok(Some(eb::node_key(&b.data, slot + 1)));
            }
        }
        Ok(None)
    }

    /// Inserts one item; `Exists` if the key is taken.
    pub fn insert_item(&mut self, root_id: u64, key: &Key, data: &[u8]) -> Result<()> {
        self.insert_items(root_id, &[(*key, data.to_vec())])
    }

    /// Records a file extent or DIR_INDEX item change for the tree log (see
    /// `Trans::file_extent_changes`, `Trans::dir_index_changes`); every item
    /// change passes here.
    fn note_change(&mut self, root_id: u64, key: &Key) {
        if root_id == QUOTA_TREE_OBJECTID {
            // Limits or numbers change: qgroup_reserve reads the quota tree again.
            self.quota_limits = None;
        }
        if key.ty == DIR_INDEX_KEY && Self::is_shareable(root_id) {
            if let Some(c) = self.dir_index_changes.as_mut() {
                let e = c
                    .dirs
                    .entry((root_id, key.objectid))
                    .or_insert_with(|| Some(Default::default()));
                if let Some(set) = e {
                    set.insert(key.offset);
                    if set.len() > crate::transaction::DIR_INDEX_CHANGES_MAX {
                        *e = None;
                    }
                }
            }
            return;
        }
        if key.ty != EXTENT_DATA_KEY || !Self::is_shareable(root_id) {
            return;
        }
        if let Some(c) = self.file_extent_changes.as_mut() {
            let e = c.entry((root_id, key.objectid)).or_insert(u64::MAX);
            *e = (*e).min(key.offset);
        }
    }

    /// Inserts sorted items, as many per leaf as fit with one data move per leaf.
    pub fn insert_items(&mut self, root_id: u64, items: &[(Key, Vec<u8>)]) -> Result<()> {
        for (k, _) in items {
            self.note_change(root_id, k);
        }
        let max_item = self.max_item_size();
        let mut i = 0;
        while i < items.len() {
            if items[i].1.len() > max_item {
                return Err(Error::Invalid(format!(
                    "item {} of {} bytes exceeds the leaf capacity {max_item}",
                    items[i].0,
                    items[i].1.len()
                )));
            }
            let (path, found) =
                self.search_mut(root_id, &items[i].0, items[i].1.len() + ITEM_SIZE, true)?;
            if found {
                return Err(Error::Exists(format!("tree {root_id} key {}", items[i].0)));
            }
            let (leaf, slot) = (path.leaf(), path.slot());
            let blk = self.block(leaf)?;
            let mut free = eb::leaf_free_space(&blk.data);
            let n = eb::nritems(&blk.data);
            let next_in_leaf = if slot < n {
                Some(eb::item_key(&blk.data, slot))
            } else {
                None
            };
            drop(blk);
            let bound = match next_in_leaf {
                Some(k) => Some(k),
                None => self.path_next_key(&path)?,
            };
            // Take the run of items that sort before `bound` and fit.
            let mut j = i;
            while j < items.len() {
                let need = items[j].1.len() + ITEM_SIZE;
                if need > free
                    || bound.is_some_and(|b| items[j].0 >= b)
                    || (j > i && items[j].0 <= items[j - 1].0)
                {
                    break;
                }
                free -= need;
                j += 1;
            }
            let keys: Vec<Key> = items[i..j].iter().map(|x| x.0).collect();
            let sizes: Vec<usize> = items[i..j].iter().map(|x| x.1.len()).collect();
            self.with_block(leaf, |b| {
                eb::leaf_insert_empty(b, slot, &keys, &sizes);
                for (k, it) in items[i..j].iter().enumerate() {
                    eb::item_data_mut(b, slot + k).copy_from_slice(&it.1);
                }
            })?;
            if slot == 0 && path.nodes.len() > 1 {
                self.fixup_low_keys(&path, 1, &items[i].0)?;
            }
            i = j;
        }
        Ok(())
    }

    pub(crate) fn max_item_size(&self) -> usize {
        self.fs.info.nodesize as usize - HEADER_SIZE - ITEM_SIZE
    }

    /// Modifies an existing item's data in place (same size).
    pub fn update_item(
        &mut self,
        root_id: u64,
        key: &Key,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        let (path, found) = self.search_mut(root_id, key, 0, true)?;
        if !found {
            return Err(Error::NotFound(format!("tree {root_id} key {key}")));
        }
        self.note_change(root_id, key);
        let slot = path.slot();
        self.with_block(path.leaf(), |b| f(eb::item_data_mut(b, slot)))
    }

    /// Replaces an existing item's data with `data` of any size.
    pub fn replace_item(&mut self, root_id: u64, key: &Key, data: &[u8]) -> Result<()> {
        let (path, found) = self.search_mut(root_id, key, 0, true)?;
        if !found {
            return Err(Error::NotFound(format!("tree {root_id} key {key}")));
        }
        self.note_change(root_id, key);
        let slot = path.slot();
        let blk = self.block(path.leaf())?;
        let old = eb::item_size(&blk.data, slot);
        let free = eb::leaf_free_space(&blk.data);
        drop(blk);
        if data.len() <= old || data.len() - old <= free {
            self.with_block(path.leaf(), |b| {
                eb::leaf_resize_item(b, slot, data.len());
                eb::item_data_mut(b, slot).copy_from_slice(data);
            })
        } else {
            self.del_items(root_id, &path, slot, 1)?;
            self.insert_item(root_id, key, data)
        }
    }

    /// Resizes an item (keeping its leading bytes) and lets `f` fill it.
    pub fn resize_item(
        &mut self,
        root_id: u64,
        key: &Key,
        new_size: usize,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        let (path, found) = self.search_mut(root_id, key, 0, true)?;
        if !found {
            return Err(Error::NotFound(format!("tree {root_id} key {key}")));
        }
        self.note_change(root_id, key);
        let slot = path.slot();
        let blk = self.block(path.leaf())?;
        let old_data = eb::item_data(&blk.data, slot).to_vec();
        let free = eb::leaf_free_space(&blk.data);
        drop(blk);
        if new_size <= old_data.len() || new_size - old_data.len() <= free {
            self.with_block(path.leaf(), |b| {
                eb::leaf_resize_item(b, slot, new_size);
                f(eb::item_data_mut(b, slot));
            })
        } else {
            let mut d = old_data;
            d.resize(new_size, 0);
            f(&mut d);
            self.del_items(root_id, &path, slot, 1)?;
            self.insert_item(root_id, key, &d)
        }
    }

    /// Deletes the item with exactly this key (ENOENT if absent).
    pub fn delete_item(&mut self, root_id: u64, key: &Key) -> Result<()> {
        let (path, found) = self.search_mut(root_id, key, 0, true)?;
        if !found {
            return Err(Error::NotFound(format!("tree {root_id} key {key}")));
        }
        let slot = path.slot();
        self.del_items(root_id, &path, slot, 1)
    }

    /// Deletes every item with key in [start, end] of a tree; returns how many.
    pub fn delete_range(&mut self, root_id: u64, start: &Key, end: &Key) -> Result<u64> {
        let mut deleted = 0u64;
        loop {
            let (path, _) = self.search_mut(root_id, start, 0, true)?;
            let (leaf, slot) = (path.leaf(), path.slot());
            let blk = self.block(leaf)?;
            let n = eb::nritems(&blk.data);
            let mut j = slot;
            while j < n && eb::item_key(&blk.data, j) <= *end {
                j += 1;
            }
            drop(blk);
            if j > slot {
                self.del_items(root_id, &path, slot, j - slot)?;
                deleted += (j - slot) as u64;
                continue;
            }
            if slot < n {
                return Ok(deleted);
            }
            // The range may continue in the next leaf.
            match self.path_next_key(&path)? {
                Some(k) if k <= *end => {
                    // Items at the next leaf's start: search for them directly.
                    let (p2, _) = self.search_mut(root_id, &k, 0, true)?;
                    let blk = self.block(p2.leaf())?;
                    let n2 = eb::nritems(&blk.data);
                    let mut j2 = p2.slot();
                    while j2 < n2 && eb::item_key(&blk.data, j2) <= *end {
                        j2 += 1;
                    }
                    drop(blk);
                    if j2 == p2.slot() {
                        return Ok(deleted);
                    }
                    let s2 = p2.slot();
                    self.del_items(root_id, &p2, s2, j2 - s2)?;
                    deleted += (j2 - s2) as u64;
                }
                _ => return Ok(deleted),
            }
        }
    }

    /// Deletes `nr` items at `slot` of the path's (dirty) leaf; removes the leaf if it
    /// empties and merges it into a sibling when it gets small.
    pub(crate) fn del_items(
        &mut self,
        root_id: u64,
        path: &WPath,
        slot: usize,
        nr: usize,
    ) -> Result<()> {
        let leaf = path.leaf();
        if (self.file_extent_changes.is_some() || self.dir_index_changes.is_some())
            && Self::is_shareable(root_id)
        {
            let gone: Vec<Key> = self.with_block(leaf, |b| {
                (slot..slot + nr).map(|s| eb::item_key(b, s)).collect()
            })?;
            for k in gone {
                self.note_change(root_id, &k);
            }
        }
        let (left, used) = self.with_block(leaf, |b| {
            eb::leaf_del_items(b, slot, nr);
            let n = eb::nritems(b);
            (n, eb::leaf_space_used(b, 0, n))
        })?;
        if path.nodes.len() == 1 {
            return Ok(());
        }
        if left == 0 {
            self.del_ptr(root_id, path, 1)?;
            self.free_tree_block(root_id, leaf, 0)?;
            return Ok(());
        }
        if slot == 0 {
            let k = self.with_block(leaf, |b| eb::item_key(b, 0))?;
            self.fixup_low_keys(path, 1, &k)?;
        }
        if used < (self.fs.info.nodesize as usize - HEADER_SIZE) / 4 {
            self.merge_leaf(root_id, path)?;
        }
        Ok(())
    }

    /// Moves all items of a small leaf into its left or right sibling when they fit.
    fn merge_leaf(&mut self, root_id: u64, path: &WPath) -> Result<()> {
        let leaf = path.leaf();
        let (parent, pslot) = path.nodes[1];
        let pblk = self.block(parent)?;
        let pn = eb::nritems(&pblk.data);
        let left_sib = (pslot > 0).then(|| {
            (
                eb::node_blockptr(&pblk.data, pslot - 1),
                eb::node_ptr_gen(&pblk.data, pslot - 1),
            )
        });
        let right_sib = (pslot + 1 < pn).then(|| {
            (
                eb::node_blockptr(&pblk.data, pslot + 1),
                eb::node_ptr_gen(&pblk.data, pslot + 1),
            )
        });
        drop(pblk);
        let data = self.dirty_copy(leaf)?;
        let n = eb::nritems(&data);
        let used = eb::leaf_space_used(&data, 0, n);
        let expect = |g: u64| Expect {
            level: Some(0),
            generation: Some(g),
            first_key: None,
        };
        if let Some((lb, lg)) = left_sib {
            let lfree = eb::leaf_free_space(&self.block(lb)?.data);
            if lfree >= used {
                let l = self.cow_block(root_id, lb, Some((parent, pslot - 1)), expect(lg))?;
                self.with_block(l, |b| {
                    let ln = eb::nritems(b);
                    eb::leaf_copy_items(b, ln, &data, 0, n)
                })?;
                let mut p = path.clone();
                p.nodes.truncate(path.nodes.len());
                self.del_ptr(root_id, &p, 1)?;
                self.free_tree_block(root_id, leaf, 0)?;
                return Ok(());
            }
        }
        if let Some((rb, rg)) = right_sib {
            let rblk = self.block(rb)?;
            let rn = eb::nritems(&rblk.data);
            let rused = eb::leaf_space_used(&rblk.data, 0, rn);
            drop(rblk);
            if eb::leaf_free_space(&data) >= rused {
                let r = self.cow_block(root_id, rb, Some((parent, pslot + 1)), expect(rg))?;
                let rdata = self.dirty_copy(r)?;
                self.with_block(leaf, |b| eb::leaf_copy_items(b, n, &rdata, 0, rn))?;
                let mut p = path.clone();
                p.nodes[1].1 = pslot + 1;
                for lvl in 2..p.nodes.len() {
                    p.nodes[lvl] = path.nodes[lvl];
                }
                self.del_ptr(root_id, &p, 1)?;
                self.free_tree_block(root_id, r, 0)?;
            }
        }
        Ok(())
    }

    /// Removes the pointer at `path.nodes[level]` from its node, removing emptied nodes
    /// and shrinking the tree when the root is left with one child.
    fn del_ptr(&mut self, root_id: u64, path: &WPath, level: usize) -> Result<()> {
        let (node, slot) = path.nodes[level];
        let (left, first) = self.with_block(node, |b| {
            eb::node_del_ptrs(b, slot, 1);
            (eb::nritems(b), eb::first_key(b))
        })?;
        let is_root = level + 1 == path.nodes.len();
        if is_root {
            if left == 1 && level > 0 {
                // Shrink: the only child becomes the root.
                let blk = self.block(node)?;
                let child = eb::node_blockptr(&blk.data, 0);
                let gen = eb::node_ptr_gen(&blk.data, 0);
                drop(blk);
                let child = self.cow_block(
                    root_id,
                    child,
                    Some((node, 0)),
                    Expect {
                        level: Some(level as u8 - 1),
                        generation: Some(gen),
                        first_key: None,
                    },
                )?;
                self.set_root(root_id, child, level as u8 - 1)?;
                self.free_tree_block(root_id, node, level as u8)?;
            }
            return Ok(());
        }
        if left == 0 {
            self.del_ptr(root_id, path, level + 1)?;
            self.free_tree_block(root_id, node, level as u8)?;
            return Ok(());
        }
        if slot == 0 {
            if let Some(k) = first {
                self.fixup_low_keys(path, level + 1, &k)?;
            }
        }
        let max = (self.fs.info.nodesize as usize - HEADER_SIZE) / KEY_PTR_SIZE;
        if left < max / 4 {
            self.merge_node(root_id, path, level)?;
        }
        Ok(())
    }

    /// Moves all pointers of a small node into its left or right sibling when they
    /// fit, then removes the emptied node from the parent.
    fn merge_node(&mut self, root_id: u64, path: &WPath, level: usize) -> Result<()> {
        let node = path.nodes[level].0;
        let (parent, pslot) = path.nodes[level + 1];
        let pblk = self.block(parent)?;
        let pn = eb::nritems(&pblk.data);
        let sib = |s: usize| {
            (
                eb::node_blockptr(&pblk.data, s),
                eb::node_ptr_gen(&pblk.data, s),
            )
        };
        let left_sib = (pslot > 0).then(|| sib(pslot - 1));
        let right_sib = (pslot + 1 < pn).then(|| sib(pslot + 1));
        drop(pblk);
        let max = (self.fs.info.nodesize as usize - HEADER_SIZE) / KEY_PTR_SIZE;
        let data = self.dirty_copy(node)?;
        let n = eb::nritems(&data);
        let expect = |g: u64| Expect {
            level: Some(level as u8),
            generation: Some(g),
            first_key: None,
        };
        if let Some((lb, lg)) = left_sib {
            if eb::nritems(&self.block(lb)?.data) + n < max {
                let l = self.cow_block(root_id, lb, Some((parent, pslot - 1)), expect(lg))?;
                self.with_block(l, |b| {
                    let ln = eb::nritems(b);
                    eb::node_copy_ptrs(b, ln, &data, 0, n)
                })?;
                self.del_ptr(root_id, path, level + 1)?;
                self.free_tree_block(root_id, node, level as u8)?;
                return Ok(());
            }
        }
        if let Some((rb, rg)) = right_sib {
            let rn = eb::nritems(&self.block(rb)?.data);
            if rn + n < max {
                let r = self.cow_block(root_id, rb, Some((parent, pslot + 1)), expect(rg))?;
                let rdata = self.dirty_copy(r)?;
                self.with_block(node, |b| eb::node_copy_ptrs(b, n, &rdata, 0, rn))?;
                let mut p = path.clone();
                p.nodes[level + 1].1 = pslot + 1;
                self.del_ptr(root_id, &p, level + 1)?;
                self.free_tree_block(root_id, r, level as u8)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::tools::mkfs::{make_filesystem, MkfsOptions};
    use crate::{Device, MemDevice};
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use ubtrfs_format::consts::*;
    use ubtrfs_format::key::Key;

    /// A block CoWed in this transaction whose delayed ref was already run (the
    /// commit runs delayed refs in rounds, and the extent tree shrinks while they
    /// run) and that is then freed must not be written: an emptied node would be a
    /// node without pointers (seen as "refusing to write an invalid block" when
    /// finishing a large subvolume drop the kernel had started).
    #[test]
    fn freed_block_whose_ref_already_ran_is_not_written() {
        let dev = MemDevice::new(vec![0u8; 128 << 20], "emptied");
        let opts = MkfsOptions {
            nodesize: 4096,
            metadata_profile: 0,
            ..Default::default()
        };
        let mut t = make_filesystem(dev as Arc<dyn Device>, &opts).expect("mkfs");
        const TREE: u64 = 1000;
        t.create_tree(TREE).expect("create tree");
        let key = |n: u64| Key::new(FIRST_FREE_OBJECTID + n, PERSISTENT_ITEM_KEY, 0);
        let items: Vec<(Key, Vec<u8>)> = (0..40_000).map(|n| (key(n), vec![1u8; 8])).collect();
        t.insert_items(TREE, &items).expect("insert");
        t.commit().expect("commit");
        assert!(
            t.root_ptr(TREE).expect("root").level >= 2,
            "a three-level tree"
        );
        assert_eq!(
            t.delete_range(TREE, &key(0), &key(19_999))
                .expect("first half"),
            20_000
        );
        t.run_delayed_refs().expect("run delayed refs");
        assert_eq!(
            t.delete_range(TREE, &key(20_000), &key(39_999))
                .expect("second half"),
            20_000
        );
        let root = t.root_ptr(TREE).expect("root");
        assert_eq!(root.level, 0, "the emptied tree is a leaf again");
        let dirty_of_tree: BTreeSet<u64> = {
            let d = t.fs.info.dirty.lock().expect("dirty map");
            d.iter()
                .filter(|(_, b)| b.owner() == TREE)
                .map(|(&b, _)| b)
                .collect()
        };
        assert_eq!(
            dirty_of_tree,
            BTreeSet::from([root.bytenr]),
            "only the live root of the tree is left to write"
        );
        t.commit().expect("commit after emptying the tree");
    }
}
