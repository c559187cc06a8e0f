//! Space allocation: block groups and their free-space indexes, device space for new
//! chunks, and the queue of delayed reference changes.
//!
//! Owns: which bytes are free, used or pinned, in memory. May use: `io`, `tree` (to
//! read block groups and the free-space tree), `format`, `error`. It never edits a tree:
//! the transaction writes what the allocator decided at commit.

pub(crate) mod block_group;
pub(crate) mod delayed_ref;
pub(crate) mod free_space_cache;

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use block_group::{BlockGroup, DevSpace, PendingChunk};
use free_space_cache::{SearchMode, SearchStats};
use std::collections::{BTreeMap, HashMap};
use ubtrfs_format::consts::*;

pub(crate) mod free_space_tree;

/// Allocation statistics (the allocator benchmark reads them).
#[derive(Debug, Default, Clone)]
pub struct AllocStats {
    /// Free-space searches made (failed ones too).
    pub searches: u64,
    /// Free-space index entries looked at by those searches.
    pub entries_visited: u64,
    /// Wall time spent finding free space, per search, in nanoseconds.
    pub latencies_ns: Vec<u64>,
    /// Whether `latencies_ns` is filled (off by default: it costs a clock read).
    pub record_latency: bool,
}

/// The allocator's state for one transaction handle (the kernel keeps it in
/// btrfs_fs_info: block group cache, free-space caches, pinned extents). The
/// transaction owns it; it reads trees but never edits one.
#[derive(Debug)]
pub(crate) struct Allocator {
    /// Every block group by logical start.
    pub(crate) bgs: BTreeMap<u64, BlockGroup>,
    /// Profiles for new chunks by type (set by mkfs; else taken from existing groups).
    pub(crate) profiles: HashMap<u64, u64>,
    /// Allocated and free device space, per devid.
    pub(crate) dev_space: BTreeMap<u64, DevSpace>,
    pub(crate) dev_uuids: HashMap<u64, [u8; 16]>,
    /// Chunks created in this transaction; their items are inserted at commit.
    pub(crate) pending_chunks: Vec<PendingChunk>,
    /// Space freed in this transaction: reusable only once the commit is durable.
    pub(crate) pinned: Vec<(u64, u64)>,
    /// Tree-log blocks (one node each) written since the last commit: in no extent
    /// tree, so free to the free-space tree, yet in use until the next commit is
    /// durable (tree_log/log.rs frees the ones a later fsync replaced earlier).
    pub(crate) log_blocks: std::collections::BTreeSet<u64>,
    /// End of the last allocation per type: the next search starts there (locality).
    pub(crate) last_alloc: HashMap<u64, u64>,
    pub(crate) search_mode: SearchMode,
    pub(crate) stats: AllocStats,
    /// Upper bound of new chunks' size (mkfs --shrink).
    pub(crate) chunk_size_max: Option<u64>,
    /// Balance's convert: per type (DATA, METADATA, SYSTEM), the only profile
    /// allocations may use (groups of other profiles are being emptied).
    pub(crate) convert_to: HashMap<u64, u64>,
    /// Block groups removed in this transaction (relocation): their chunk mapping
    /// and device ranges stay until the commit is durable, because the last
    /// committed trees still live in them.
    pub(crate) removed: Vec<block_group::RemovedGroup>,
    /// Block groups emptied by relocation, removed by the commit once its delayed
    /// refs have freed their last extents.
    pub(crate) remove_at_commit: Vec<u64>,
}

impl Allocator {
    /// An allocator with no block groups yet (they are loaded or created by the caller).
    pub(crate) fn new() -> Allocator {
        Allocator {
            bgs: BTreeMap::new(),
            profiles: HashMap::new(),
            dev_space: BTreeMap::new(),
            dev_uuids: HashMap::new(),
            pending_chunks: Vec::new(),
            pinned: Vec::new(),
            log_blocks: std::collections::BTreeSet::new(),
            last_alloc: HashMap::new(),
            search_mode: SearchMode::SizeIndex,
            stats: AllocStats::default(),
            chunk_size_max: None,
            convert_to: HashMap::new(),
            removed: Vec::new(),
            remove_at_commit: Vec::new(),
        }
    }

    /// Returns pinned space to the free indexes: the commit that stopped referencing
    /// it is on disk. `pinned` and `log_blocks` are what that commit's transaction
    /// freed (taken from [`Allocator::pinned`] and [`Allocator::log_blocks`] when it
    /// started writing); `removed` the block groups it removed, whose space is not
    /// returned.
    pub(crate) fn unpin(
        &mut self,
        pinned: Vec<(u64, u64)>,
        log_blocks: std::collections::BTreeSet<u64>,
        removed: &[block_group::RemovedGroup],
        nodesize: u64,
    ) -> Result<()> {
        for (b, l) in pinned
            .into_iter()
            .chain(log_blocks.into_iter().map(|b| (b, nodesize)))
        {
            if block_group::RemovedGroup::any_contains(removed, b) {
                continue; // its block group is gone with this commit
            }
            let s = self.bg_of(b)?;
            self.bgs
                .get_mut(&s)
                .ok_or_else(|| Error::corrupt(format!("unpinning {b}: no block group")))?
                .free
                .add(b, l)
                .map_err(|e| Error::corrupt(format!("unpinning {b}: {e}")))?;
        }
        Ok(())
    }

    fn type_matches(bg_flags: u64, ty: u64) -> bool {
        bg_flags & ty != 0
    }

    /// Finds and takes `len` bytes of type `ty` (DATA, METADATA or SYSTEM), trying the
    /// block group of `hint` first. Allocates a new chunk when nothing fits.
    pub(crate) fn alloc_extent(
        &mut self,
        info: &mut FsInfo,
        ty: u64,
        len: u64,
        hint: u64,
    ) -> Result<u64> {
        if let Some(b) = self.find_free(info, ty, len, hint)? {
            return Ok(b);
        }
        self.alloc_chunk(info, ty, len)?;
        self.find_free(info, ty, len, hint)?.ok_or_else(|| {
            Error::NoSpace(format!(
                "no {len} bytes free for {}",
                block_group::block_group_type_name(ty)
            ))
        })
    }

    pub(crate) fn find_free(
        &mut self,
        info: &FsInfo,
        ty: u64,
        len: u64,
        hint: u64,
    ) -> Result<Option<u64>> {
        let t0 = self.stats.record_latency.then(std::time::Instant::now);
        let found = self.find_free_inner(info, ty, len, hint)?;
        // Every search counts, failed ones too (as funclatency counts every call).
        self.stats.searches += 1;
        if let Some(t0) = t0 {
            self.stats.latencies_ns.push(t0.elapsed().as_nanos() as u64);
        }
        Ok(found)
    }

    /// Whether new extents of type `ty` may go into group `b`: not one being
    /// relocated, not an unmirrored one where the type is mirrored (unless a
    /// conversion names the profile), and of the target profile while converting.
    fn open_for(&self, b: &BlockGroup, ty: u64) -> bool {
        Self::serves(b.flags, ty)
            && !b.ro
            && (!b.unmirrored || self.convert_to.contains_key(&ty))
            && self
                .convert_to
                .get(&ty)
                .is_none_or(|p| b.flags & BLOCK_GROUP_PROFILE_MASK == *p)
    }

    /// Mixed groups serve both; pure data groups never hold tree blocks.
    fn serves(bg_flags: u64, ty: u64) -> bool {
        Self::type_matches(bg_flags, ty)
            && (ty == BLOCK_GROUP_DATA
                || bg_flags & BLOCK_GROUP_DATA == 0
                || bg_flags & BLOCK_GROUP_METADATA != 0)
    }

    fn try_group(
        &mut self,
        info: &FsInfo,
        ty: u64,
        start: u64,
        len: u64,
        hint: u64,
        align: u64,
    ) -> Result<Option<u64>> {
        self.ensure_loaded(info, start)?;
        let mode = self.search_mode;
        let bg = self
            .bgs
            .get_mut(&start)
            .ok_or_else(|| Error::corrupt(format!("no block group at {start}")))?;
        // The size index knows the largest entry at once; the offset-only search (the
        // kernel before seed 001) has to walk to find out.
        if mode == SearchMode::SizeIndex && bg.free.largest() < len {
            return Ok(None);
        }
        // Hint 0: no locality wanted, so the size index may take the largest entry.
        let h = if bg.contains(hint) && hint != bg.start {
            hint
        } else {
            0
        };
        let mut stats = SearchStats::default();
        let found = bg.free.find(h, len, align, mode, &mut stats);
        self.stats.entries_visited += stats.entries_visited;
        if let Some(off) = found {
            bg.free
                .remove(off, len)
                .map_err(|e| Error::corrupt(format!("allocator: {e}")))?;
            self.last_alloc.insert(ty, off + len);
        }
        Ok(found)
    }

    fn find_free_inner(
        &mut self,
        info: &FsInfo,
        ty: u64,
        len: u64,
        hint: u64,
    ) -> Result<Option<u64>> {
        let align = if ty & BLOCK_GROUP_DATA != 0 {
            info.sectorsize as u64
        } else {
            info.nodesize as u64
        };
        // The hint's group first (locality), then the others in address order.
        let hint_bg = self
            .bgs
            .range(..=hint)
            .next_back()
            .filter(|(_, b)| b.contains(hint) && self.open_for(b, ty))
            .map(|(s, _)| *s);
        if let Some(h) = hint_bg {
            if let Some(off) = self.try_group(info, ty, h, len, hint, align)? {
                return Ok(Some(off));
            }
        }
        let mut next = 0u64;
        loop {
            let cand = self
                .bgs
                .range(next..)
                .find(|(s, b)| Some(**s) != hint_bg && self.open_for(b, ty))
                .map(|(s, _)| *s);
            let Some(start) = cand else { return Ok(None) };
            if let Some(off) = self.try_group(info, ty, start, len, hint, align)? {
                return Ok(Some(off));
            }
            next = start + 1;
        }
    }

    /// Allocates a data extent of up to `len` bytes (less when space is fragmented);
    /// returns (bytenr, length).
    pub(crate) fn alloc_data(&mut self, info: &mut FsInfo, len: u64) -> Result<(u64, u64)> {
        let hint = self.last_alloc.get(&BLOCK_GROUP_DATA).copied().unwrap_or(0);
        if let Some(b) = self.find_free(info, BLOCK_GROUP_DATA, len, hint)? {
            return Ok((b, len));
        }
        match self.alloc_chunk(info, BLOCK_GROUP_DATA, len) {
            Ok(_) => {
                if let Some(b) = self.find_free(info, BLOCK_GROUP_DATA, len, hint)? {
                    return Ok((b, len));
                }
            }
            Err(Error::NoSpace(_)) => {}
            Err(e) => return Err(e),
        }
        // Fragmented: take the largest piece there is.
        let ss = info.sectorsize as u64;
        let starts: Vec<u64> = self
            .bgs
            .values()
            .filter(|b| self.open_for(b, BLOCK_GROUP_DATA))
            .map(|b| b.start)
            .collect();
        let mut best = 0u64;
        for s in starts {
            self.ensure_loaded(info, s)?;
            best = best.max(self.bgs[&s].free.largest());
        }
        let take = (best.min(len) / ss) * ss;
        if take == 0 {
            return Err(Error::NoSpace("data space exhausted".into()));
        }
        let b = self
            .find_free(info, BLOCK_GROUP_DATA, take, hint)?
            .ok_or_else(|| Error::NoSpace("data space exhausted".into()))?;
        Ok((b, take))
    }

    /// Bytes the block groups serving type `ty` have free now, without new chunks
    /// (space freed in this transaction is pinned and not counted until the commit).
    pub(crate) fn free_in_groups(&self, ty: u64) -> u64 {
        self.bgs
            .values()
            .filter(|b| self.open_for(b, ty))
            .map(|b| {
                if b.loaded {
                    b.free.total_free()
                } else {
                    b.length.saturating_sub(b.used)
                }
            })
            .sum()
    }

    /// Bytes of type `ty` (DATA or METADATA) allocations could take now: what the
    /// groups serving it have free (space freed in this transaction is pinned and
    /// not counted until the commit), plus what new chunks could take of the device
    /// space (data leaving metadata its room, as [`Allocator::alloc_chunk`] does).
    pub(crate) fn available(&self, total_bytes: u64, ty: u64) -> u64 {
        let in_groups = self.free_in_groups(ty);
        let profile = self.profile_for(ty);
        let Some(copies) = block_group::profile_copies(profile) else {
            return in_groups;
        };
        let mut unallocated = self.unallocated();
        if ty == BLOCK_GROUP_DATA {
            unallocated = unallocated.saturating_sub(self.metadata_room_kept(total_bytes));
        }
        // RAID5/6: of every row of n strips, one or two hold parity.
        let n = self.dev_space.len() as u64;
        let nparity = crate::io::volumes::nparity(profile);
        let usable = if nparity > 0 && n > nparity {
            unallocated / n * (n - nparity)
        } else {
            unallocated / copies
        };
        in_groups + (usable & !((1 << 20) - 1))
    }

    /// Takes a tree block of the tree log out of the free space until the next commit
    /// is durable (the kernel's btrfs_pin_extent_for_log_replay): log blocks are in no
    /// extent tree, so the free-space tree calls them free, yet the log must stay
    /// readable until the replay is committed.
    pub(crate) fn pin_for_log_replay(
        &mut self,
        info: &FsInfo,
        bytenr: u64,
        len: u64,
    ) -> Result<()> {
        self.take_free(info, bytenr, len, "tree log block")?;
        self.pinned.push((bytenr, len));
        Ok(())
    }

    /// Keeps a data extent a log points at, and the extent tree does not know yet,
    /// from being allocated before the replay references it (the kernel's
    /// btrfs_exclude_logged_extents); the replay then creates its extent item.
    pub(crate) fn exclude_logged_extent(
        &mut self,
        info: &FsInfo,
        bytenr: u64,
        len: u64,
    ) -> Result<()> {
        self.take_free(info, bytenr, len, "logged data extent")
    }

    fn take_free(&mut self, info: &FsInfo, bytenr: u64, len: u64, what: &str) -> Result<()> {
        let s = self.bg_of(bytenr)?;
        self.ensure_loaded(info, s)?;
        let bg = self
            .bgs
            .get_mut(&s)
            .ok_or_else(|| Error::corrupt(format!("no block group at {s}")))?;
        if bytenr + len > bg.end() || !bg.free.is_free(bytenr, len) {
            return Err(Error::corrupt(format!(
                "{what} at {bytenr} ({len} bytes) is not free space: the log and the extent tree disagree"
            )));
        }
        bg.free
            .remove(bytenr, len)
            .map_err(|e| Error::corrupt(format!("{what} at {bytenr}: {e}")))
    }

    /// Returns unreferenced space allocated in this transaction (e.g. a failed write).
    pub(crate) fn release_unused(&mut self, bytenr: u64, len: u64) -> Result<()> {
        let s = self.bg_of(bytenr)?;
        let bg = self
            .bgs
            .get_mut(&s)
            .ok_or_else(|| Error::corrupt(format!("no block group at {s}")))?;
        bg.free
            .add(bytenr, len)
            .map_err(|e| Error::corrupt(format!("allocator: {e}")))
    }
}
