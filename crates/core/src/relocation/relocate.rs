//! Relocating one block group: every extent in it gets one new copy outside it,
//! every block that points at a moved extent or at a block with a new copy gets
//! one new copy too, up to the roots, and one commit swaps the filesystem from
//! "group present" to "group gone" (docs/relocation.md, design (b)).
//!
//! The rewritten blocks form a closure over the tree DAG, so a block shared by
//! several trees stays one block with the same parents' new copies: sharing,
//! FULL_BACKREF state and reference counts are kept exactly, only addresses
//! change. That is why no reference change here is traced for quotas: no
//! subvolume's set of extents changes, so every qgroup number stays as it is.
//!
//! Generations: a copy of a block of a subvolume tree (not its root) keeps the
//! block's generation, in its header, its parent's pointer and its extent item.
//! Whether a block may be shared is decided from it (generation no newer than
//! the tree's last snapshot, btrfs_block_can_be_shared), so a new generation
//! would make a shared block look private to the next CoW. The kernel's own
//! relocation marks such copies HEADER_FLAG_RELOC instead, which needs them and
//! every block below to be FULL_BACKREF (btrfs check insists); keeping the
//! generation needs no reference rewritten. Root blocks and blocks of the other
//! trees are never shared: they get the transaction's generation, as a CoW
//! would give them (the superblock and ROOT_ITEMs name it).

use crate::alloc::delayed_ref::{NewTreeBlock, RefKey};
use crate::error::{Error, Result};
use crate::qgroup::rescan::leaf_file_extents;
use crate::transaction::Trans;
use crate::tree::block_edit as eb;
use crate::tree::tree_checker::Expect;
use std::collections::{BTreeMap, HashMap};
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

/// Bytes of file data read and written at a time while moving an extent.
const DATA_COPY_BYTES_MAX: u64 = 8 << 20;

/// What relocating one block group did.
#[derive(Debug, Default, Clone, Copy)]
pub struct RelocStats {
    /// Tree blocks given a new copy (those in the group and every block above
    /// them, or above a moved data extent).
    pub blocks_rewritten: u64,
    /// Tree blocks that lay in the group.
    pub blocks_in_group: u64,
    /// Data extents moved out of the group.
    pub data_extents: u64,
    /// Bytes of data moved.
    pub data_bytes: u64,
    /// Tree nodes read to find the blocks to rewrite.
    pub nodes_visited: u64,
    /// Extents a whole-subtree quota trace of the moved subvolume blocks would
    /// record (the kernel before seed 003): those blocks and the distinct data
    /// extents their leaves point at.
    pub trace_full_extents: u64,
    /// Extents the commit's quota accounting looked at (0: relocation changes no
    /// subvolume's extents, so nothing is traced).
    pub qgroup_extents: u64,
}

/// Phase 1's result: what moves, and every block to rewrite.
struct Plan {
    start: u64,
    end: u64,
    /// Leaves must be read (the group holds data extents their items point at).
    read_leaves: bool,
    /// Data extents of the group: old bytenr -> (length, new bytenr).
    data: BTreeMap<u64, (u64, u64)>,
    /// Tree blocks of the group (their extent items), for the final check.
    group_blocks: Vec<u64>,
    /// Every block visited: whether it is rewritten.
    seen: HashMap<u64, bool>,
    /// Blocks to rewrite, children before parents: (old bytenr, level).
    order: Vec<(u64, u8)>,
    /// Old bytenr -> (new bytenr, new generation) of every block in `order`.
    moved: HashMap<u64, (u64, u64)>,
    /// Root blocks -> the tree whose root each is.
    roots: HashMap<u64, u64>,
    nodes_visited: u64,
}

impl Plan {
    fn in_group(&self, bytenr: u64) -> bool {
        bytenr >= self.start && bytenr < self.end
    }
}

/// Offset of disk_bytenr in a regular EXTENT_DATA item (struct
/// btrfs_file_extent_item: generation, ram_bytes, compression, encryption,
/// other_encoding, type, then disk_bytenr).
const FILE_EXTENT_DISK_BYTENR_OFFSET: usize = 21;

impl Trans {
    /// Moves everything out of the block group at `start` and removes it (the
    /// kernel's btrfs_relocate_chunk): its address range in pieces of at most
    /// `Trans::reloc_batch_bytes`, a commit each, the group removed by the last.
    /// Between pieces the filesystem is complete and consistent (the group holds
    /// fewer extents); a balance cut there relocates the group again on resume.
    /// Pending work is committed first and dead subvolumes are dropped to the end
    /// (their half-dropped trees cannot be walked). A failure before a commit
    /// leaves the image as the last commit wrote it; the handle must then be
    /// dropped.
    pub fn relocate_block_group(&mut self, start: u64) -> Result<RelocStats> {
        self.commit()?;
        if !self.dead_roots()?.is_empty() {
            self.drop_dead_roots(None, None, &mut |_| {})?;
        }
        let (length, flags) = match self.alloc.bgs.get(&start) {
            Some(b) => (b.length, b.flags),
            None => return Err(Error::NotFound(format!("block group at {start}"))),
        };
        if self.fs.info.sb.log_root != 0 {
            return Err(Error::Unsupported(
                "relocating with a tree log not replayed".into(),
            ));
        }
        if let Some(b) = self.alloc.bgs.get_mut(&start) {
            b.ro = true;
        }
        // The kernel keeps a data chunk when the last one is relocated
        // (btrfs_may_alloc_data_chunk): the data profile would be lost otherwise.
        if flags & BLOCK_GROUP_DATA != 0
            && !self
                .alloc
                .bgs
                .values()
                .any(|b| !b.ro && b.flags & BLOCK_GROUP_DATA != 0)
        {
            let ss = self.fs.info.sectorsize as u64;
            self.alloc
                .alloc_chunk(&mut self.fs.info, BLOCK_GROUP_DATA, ss)?;
        }
        let mut stats = RelocStats::default();
        let batch = self.reloc_batch_bytes.max(self.fs.info.nodesize as u64);
        let end = start + length;
        let mut from = start;
        while from < end {
            let to = from.saturating_add(batch).min(end);
            self.relocate_range(start, from, to, &mut stats)?;
            if to == end {
                self.alloc.remove_at_commit.push(start);
            }
            self.commit()?;
            stats.qgroup_extents += self.qgroup_stats.extents;
            from = to;
        }
        Ok(stats)
    }

    /// Moves the extents that start in `[from, to)` of the group at `group` (its
    /// extents elsewhere stay), without committing.
    fn relocate_range(
        &mut self,
        group: u64,
        from: u64,
        to: u64,
        stats: &mut RelocStats,
    ) -> Result<()> {
        let start = group;
        let mut plan = Plan {
            start: from,
            end: to,
            read_leaves: false,
            data: BTreeMap::new(),
            group_blocks: Vec::new(),
            seen: HashMap::new(),
            order: Vec::new(),
            moved: HashMap::new(),
            roots: HashMap::new(),
            nodes_visited: 0,
        };
        self.collect_group_extents(&mut plan)?;
        plan.read_leaves = !plan.data.is_empty();
        for (id, ptr) in self.all_tree_roots()? {
            plan.roots.insert(ptr.0, id);
            self.plan_visit(&mut plan, ptr.0, ptr.1, None)?;
        }
        for b in &plan.group_blocks {
            if plan.seen.get(b) != Some(&true) {
                return Err(Error::corrupt(format!(
                    "tree block {b} of block group {start} is in no tree (a leaked extent): \
                     `btrfs check --repair` removes it"
                )));
            }
        }
        self.check_room(&plan, group)?;
        stats.blocks_in_group += plan.group_blocks.len() as u64;
        stats.data_extents += plan.data.len() as u64;
        stats.data_bytes += plan.data.values().map(|d| d.0).sum::<u64>();
        stats.nodes_visited += plan.nodes_visited;
        // Relocation changes no subvolume's extents: nothing to account.
        let touched = self.delayed.touched.take();
        let res = self.rewrite(&mut plan, stats);
        self.delayed.touched = touched;
        res
    }

    /// ENOSPC before anything is allocated when the new copies cannot fit (in the
    /// other groups of their type or in new chunks), as the kernel's
    /// btrfs_inc_block_group_ro refuses a group with no room elsewhere; the group
    /// is usable again, and a balance goes on with the next chunk.
    fn check_room(&mut self, plan: &Plan, group: u64) -> Result<()> {
        let ns = self.fs.info.nodesize as u64;
        // The commit's own copy-on-write of the extent, csum and free-space trees.
        let margin = 64 * ns;
        let total = self.fs.info.sb.total_bytes;
        let meta = plan.order.len() as u64 * ns + margin;
        let data: u64 = plan.data.values().map(|d| d.0).sum();
        let short = if self.alloc.available(total, BLOCK_GROUP_METADATA) < meta {
            Some(("metadata", meta))
        } else if data > 0 && self.alloc.available(total, BLOCK_GROUP_DATA) < data {
            Some(("data", data))
        } else {
            None
        };
        if let Some((what, need)) = short {
            if let Some(b) = self.alloc.bgs.get_mut(&group) {
                b.ro = false;
            }
            return Err(Error::NoSpace(format!(
                "relocating block group {group}: no room for {need} bytes of {what} elsewhere"
            )));
        }
        Ok(())
    }

    /// Every tree: the root tree, the chunk tree and each ROOT_ITEM's tree, as
    /// (id, (root bytenr, level)).
    fn all_tree_roots(&mut self) -> Result<Vec<(u64, (u64, u8))>> {
        let sb = &self.fs.info.sb;
        let mut out = vec![
            (ROOT_TREE_OBJECTID, (sb.root, sb.root_level)),
            (CHUNK_TREE_OBJECTID, (sb.chunk_root, sb.chunk_root_level)),
        ];
        let rt = self.fs.info.root_tree_ptr();
        let mut ids = Vec::new();
        for item in crate::tree::ctree::TreeIter::new(
            &self.fs.info,
            &rt,
            Key::MIN,
            Key::new(u64::MAX, u8::MAX, u64::MAX),
        )? {
            let k = item?.key();
            if k.ty == ROOT_ITEM_KEY {
                ids.push(k.objectid);
            }
        }
        for id in ids {
            if id == TREE_RELOC_OBJECTID || id == TREE_LOG_OBJECTID {
                return Err(Error::Unsupported(format!(
                    "relocating with tree {} in the root tree",
                    id as i64
                )));
            }
            let (b, l) = self.root_node(id)?;
            out.push((id, (b, l)));
        }
        Ok(out)
    }

    /// The extent items in the group: data extents to move, tree blocks to check.
    fn collect_group_extents(&self, plan: &mut Plan) -> Result<()> {
        let et = self.root_ptr(EXTENT_TREE_OBJECTID)?;
        for item in crate::tree::ctree::TreeIter::new(
            &self.fs.info,
            &et,
            Key::new(plan.start, 0, 0),
            Key::new(plan.end - 1, u8::MAX, u64::MAX),
        )? {
            let item = item?;
            let k = item.key();
            match k.ty {
                EXTENT_ITEM_KEY => {
                    let flags = ubtrfs_format::bytes::le64(item.data(), 16, "extent item")
                        .map_err(|e| Error::corrupt(format!("extent tree item {k}: {e}")))?;
                    if flags & EXTENT_FLAG_DATA != 0 {
                        plan.data.insert(k.objectid, (k.offset, 0));
                    } else {
                        plan.group_blocks.push(k.objectid);
                    }
                }
                METADATA_ITEM_KEY => plan.group_blocks.push(k.objectid),
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether block `bytenr` gets a new copy: it lies in the group, or a child
    /// does, or (leaves) an item points at a data extent that moves. Visits each
    /// block once; records the rewrite order children first.
    fn plan_visit(
        &self,
        plan: &mut Plan,
        bytenr: u64,
        level: u8,
        generation: Option<u64>,
    ) -> Result<bool> {
        if let Some(&r) = plan.seen.get(&bytenr) {
            return Ok(r);
        }
        let mut need = plan.in_group(bytenr);
        if level > 0 || plan.read_leaves {
            let expect = Expect {
                level: Some(level),
                generation,
                first_key: None,
            };
            let b = self.fs.info.read_tree_block(bytenr, &expect)?;
            if level > 0 {
                plan.nodes_visited += 1;
                for i in 0..eb::nritems(&b.data) {
                    let c = eb::node_blockptr(&b.data, i);
                    let g = eb::node_ptr_gen(&b.data, i);
                    need |= self.plan_visit(plan, c, level - 1, Some(g))?;
                }
            } else {
                need |= leaf_file_extents(&b)?
                    .iter()
                    .any(|(_, x, _)| plan.data.contains_key(x));
            }
        }
        plan.seen.insert(bytenr, need);
        if need {
            plan.order.push((bytenr, level));
        }
        Ok(need)
    }

    /// Phase 2: new addresses for every block and data extent, the new block
    /// contents, the references moved over, the data copied with its checksums.
    fn rewrite(&mut self, plan: &mut Plan, stats: &mut RelocStats) -> Result<()> {
        let ns = self.fs.info.nodesize as u64;
        // Addresses first: a parent's copy names its children's new addresses.
        let t = self.transid;
        for &(old, _) in &plan.order {
            let blk = self.fs.info.read_tree_block(old, &Expect::default())?;
            let owner = blk.owner();
            let generation = if Self::is_shareable(owner) && !plan.roots.contains_key(&old) {
                blk.generation()
            } else {
                t
            };
            let ty = if owner == CHUNK_TREE_OBJECTID {
                BLOCK_GROUP_SYSTEM
            } else {
                BLOCK_GROUP_METADATA
            };
            let hint = self.alloc.last_alloc.get(&ty).copied().unwrap_or(0);
            let new = self.alloc.alloc_extent(&mut self.fs.info, ty, ns, hint)?;
            self.fs.info.cache_forget(new);
            plan.moved.insert(old, (new, generation));
        }
        for (_, d) in plan.data.iter_mut() {
            let hint = self
                .alloc
                .last_alloc
                .get(&BLOCK_GROUP_DATA)
                .copied()
                .unwrap_or(0);
            d.1 = self
                .alloc
                .alloc_extent(&mut self.fs.info, BLOCK_GROUP_DATA, d.0, hint)?;
        }
        let translate = |plan: &Plan, r: RefKey| -> Result<RefKey> {
            Ok(match r {
                RefKey::TreeShared(p) => RefKey::TreeShared(
                    plan.moved
                        .get(&p)
                        .ok_or_else(|| {
                            Error::corrupt(format!(
                                "parent block {p} of a moved block is not moved"
                            ))
                        })?
                        .0,
                ),
                RefKey::DataShared(l) => RefKey::DataShared(
                    plan.moved
                        .get(&l)
                        .ok_or_else(|| {
                            Error::corrupt(format!("leaf {l} of a moved data extent is not moved"))
                        })?
                        .0,
                ),
                r => r,
            })
        };
        let order = std::mem::take(&mut plan.order);
        let mut traced_data = std::collections::HashSet::new();
        for &(old, level) in &order {
            let (new, generation) = *plan.moved.get(&old).ok_or_else(|| {
                Error::corrupt(format!("internal: block {old} has no new address"))
            })?;
            let blk = self.fs.info.read_tree_block(old, &Expect::default())?;
            if Self::is_shareable(blk.owner()) {
                stats.trace_full_extents += 1;
                if level == 0 {
                    for (_, x, _) in leaf_file_extents(&blk)? {
                        if traced_data.insert(x) {
                            stats.trace_full_extents += 1;
                        }
                    }
                }
            }
            let mut data = blk.data.clone();
            eb::set_bytenr(&mut data, new);
            let mut hflags = eb::flags(&data) & !HEADER_FLAG_WRITTEN;
            if generation != blk.generation() {
                // A new version, as a CoW makes it (ctree.c clears RELOC).
                hflags &= !HEADER_FLAG_RELOC;
                eb::set_generation(&mut data, generation);
            }
            eb::set_flags(&mut data, hflags);
            let ext = self
                .extent_refs(old)?
                .ok_or_else(|| Error::corrupt(format!("tree block {old} has no extent item")))?;
            let full = ext.flags & BLOCK_FLAG_FULL_BACKREF != 0;
            if level > 0 {
                for i in 0..eb::nritems(&data) {
                    let c = eb::node_blockptr(&data, i);
                    if let Some(&(nc, ng)) = plan.moved.get(&c) {
                        eb::set_node_ptr(&mut data, i, nc, ng);
                    } else if full {
                        self.delayed.add(c, ns, false, RefKey::TreeShared(old), -1);
                        self.delayed.add(c, ns, false, RefKey::TreeShared(new), 1);
                    }
                }
            } else {
                for (slot, x, len) in leaf_file_extents(&blk)? {
                    if let Some(&(_, nx)) = plan.data.get(&x) {
                        let r = eb::item_range(&data, slot);
                        let at = r.start + FILE_EXTENT_DISK_BYTENR_OFFSET;
                        data[at..at + 8].copy_from_slice(&nx.to_le_bytes());
                    } else if full {
                        self.delayed.add(x, len, true, RefKey::DataShared(old), -1);
                        self.delayed.add(x, len, true, RefKey::DataShared(new), 1);
                    }
                }
            }
            let first = eb::first_key(&data).unwrap_or(Key::MIN);
            let tree = NewTreeBlock { level, key: first };
            let refs = ext
                .refs
                .into_iter()
                .map(|(r, n)| Ok((r, translate(plan, r)?, n)))
                .collect::<Result<Vec<_>>>()?;
            self.rename_extent((old, new, ns), Some(tree), generation, &refs)?;
            // Simple quotas charge the copy to the tree the block belongs to.
            self.delayed.set_owner(new, Some(blk.owner()));
            if full {
                self.delayed.set_flags(new, ns, BLOCK_FLAG_FULL_BACKREF);
            }
            self.put_dirty(new, data)?;
            if let Some(&id) = plan.roots.get(&old) {
                self.set_root(id, new, level)?;
            }
            stats.blocks_rewritten += 1;
        }
        for (&x, &(len, nx)) in &plan.data {
            let ext = self
                .extent_refs(x)?
                .ok_or_else(|| Error::corrupt(format!("data extent {x} has no extent item")))?;
            let refs = ext
                .refs
                .into_iter()
                .map(|(r, n)| Ok((r, translate(plan, r)?, n)))
                .collect::<Result<Vec<_>>>()?;
            self.rename_extent((x, nx, len), None, ext.generation, &refs)?;
            // The copy stays charged where the original was (simple quotas); its
            // generation is kept too, so the charge moves without changing.
            if ext.owner.is_some() {
                self.delayed.set_owner(nx, ext.owner);
            }
            self.copy_data_extent(x, nx, len, plan.start)?;
        }
        Ok(())
    }

    /// Moves every reference of extent `old` to `new` (`(old, new, length)`;
    /// `tree`: a tree block's level and first key, None for data): each `(ref on
    /// old, the same ref translated to new addresses, count)` is dropped from the
    /// old extent and added to the new one, whose item keeps `generation`. The old
    /// extent ends with no reference and is freed at the commit.
    fn rename_extent(
        &mut self,
        (old, new, len): (u64, u64, u64),
        tree: Option<NewTreeBlock>,
        generation: u64,
        refs: &[(RefKey, RefKey, u64)],
    ) -> Result<()> {
        let is_data = tree.is_none();
        let Some((&(_, first, _), _)) = refs.split_first() else {
            return Err(Error::corrupt(format!("extent {old} has no references")));
        };
        // The new extent's item is made with one count of its first reference.
        self.delayed.add_new(new, len, is_data, tree, first);
        self.delayed.set_generation(new, generation);
        for (i, &(r, nr, count)) in refs.iter().enumerate() {
            self.delayed.add(old, len, is_data, r, -(count as i64));
            let more = count as i64 - i64::from(i == 0);
            if more != 0 {
                self.delayed.add(new, len, is_data, nr, more);
            }
        }
        Ok(())
    }

    /// Copies a data extent's bytes (verified against their checksums, other
    /// copies tried) and its checksum items to the new address. The old csums go
    /// when the old extent is freed at commit.
    fn copy_data_extent(&mut self, old: u64, new: u64, len: u64, group: u64) -> Result<()> {
        let ss = self.fs.info.sectorsize as u64;
        let mut off = 0;
        while off < len {
            let n = (len - off).min(DATA_COPY_BYTES_MAX);
            let what =
                |at: u64| format!("data extent {old} at {at} (relocating block group {group})");
            let buf = self
                .fs
                .info
                .read_data_verified(old + off, n as usize, true, &what)?;
            self.write_logical(new + off, &buf)?;
            off += n;
        }
        // Runs of sectors that have checksums (nodatasum and prealloc ranges have
        // none), each inserted at the same offset of the new extent.
        let mut run: Option<(u64, Vec<u8>)> = None;
        for (i, c) in self
            .fs
            .info
            .lookup_csums(old, (len / ss) as usize)?
            .into_iter()
            .enumerate()
        {
            match (c, run.as_mut()) {
                (Some(c), Some((_, sums))) => sums.extend_from_slice(&c),
                (Some(c), None) => run = Some((new + i as u64 * ss, c)),
                (None, _) => {
                    if let Some((at, sums)) = run.take() {
                        self.insert_csum_run(at, &sums)?;
                    }
                }
            }
        }
        if let Some((at, sums)) = run {
            self.insert_csum_run(at, &sums)?;
        }
        Ok(())
    }
}
