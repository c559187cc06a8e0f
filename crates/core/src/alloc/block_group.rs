//! Block groups: the in-memory state of every chunk's space (used bytes, the free-space
//! index the allocator searches, what the free-space tree must say at commit), loading
//! it lazily from the free-space tree, and allocating new chunks (device extents, chunk
//! item, block group item) when a type runs out of space.
//!
//! Two free-space views per block group, both [`FreeSpaceIndex`]:
//! - `free`: what may be allocated now. Space freed in this transaction is *pinned*
//!   (kept out of `free`) until the commit is durable, because the last committed
//!   trees may still point at it.
//! - `fst_free`: the complement of the extent tree's items, i.e. exactly what the
//!   free-space tree must hold after the commit. Running delayed refs updates it.

use super::Allocator;
use crate::alloc::free_space_cache::FreeSpaceIndex;
use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::io::volumes::{data_stripes, nparity, MapEntry, MapStripe};
use std::collections::BTreeMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{BlockGroupItem, Chunk, Stripe, CHUNK_BASE_SIZE, STRIPE_SIZE};
use ubtrfs_format::key::Key;

pub(crate) const FREE_SPACE_USING_BITMAPS: u32 = 1;
pub(crate) const FREE_SPACE_BITMAP_BITS: u64 = 256 * 8;

#[derive(Debug)]
pub(crate) struct BlockGroup {
    pub start: u64,
    pub length: u64,
    pub flags: u64,
    pub used: u64,
    pub loaded: bool,
    pub free: FreeSpaceIndex,
    pub fst_free: FreeSpaceIndex,
    /// The free-space tree currently stores this group as bitmaps.
    pub fst_bitmaps: bool,
    /// Block group item and free-space tree need writing at commit.
    pub dirty: bool,
    /// Created in this transaction: its items do not exist yet.
    pub new: bool,
    /// Being relocated: nothing is allocated in it (the kernel's read-only block
    /// group, btrfs_inc_block_group_ro).
    pub ro: bool,
    /// A SINGLE or RAID0 group of a type whose new chunks are mirrored (a
    /// conversion stopped half-way): nothing new is allocated in it, as the kernel
    /// makes such groups read-only when it mounts (btrfs_read_block_groups), so that
    /// new data and metadata get the redundancy asked for. Balance may still move
    /// what it holds.
    pub unmirrored: bool,
}

impl BlockGroup {
    pub(crate) fn end(&self) -> u64 {
        self.start + self.length
    }
    pub(crate) fn contains(&self, bytenr: u64) -> bool {
        bytenr >= self.start && bytenr < self.end()
    }
    /// Bitmap conversion thresholds, the kernel's rule: switch to bitmaps when the
    /// extent form would need more item space than all bitmaps, back below 100 fewer.
    pub(crate) fn bitmap_thresholds(&self, sectorsize: u32) -> (u64, u64) {
        let range = sectorsize as u64 * FREE_SPACE_BITMAP_BITS;
        let num_bitmaps = self.length.div_ceil(range);
        let total = num_bitmaps * (ITEM_SIZE as u64 + 256);
        let high = total / ITEM_SIZE as u64;
        let low = high.saturating_sub(100);
        (high, low)
    }
}

/// Physical free ranges of one device, derived from its device extents.
#[derive(Debug, Default, Clone)]
pub(crate) struct DevSpace {
    pub total_bytes: u64,
    pub bytes_used: u64,
    /// Allocated physical ranges: start -> length.
    pub used: BTreeMap<u64, u64>,
    /// New chunks end below this (a shrink in progress: the device keeps its
    /// recorded size until the last chunk beyond is relocated).
    pub alloc_end: Option<u64>,
}

impl DevSpace {
    /// Free holes from 1 MiB (the kernel never allocates below) to the device end.
    pub(crate) fn holes(&self) -> Vec<(u64, u64)> {
        let end = self
            .alloc_end
            .map_or(self.total_bytes, |e| e.min(self.total_bytes));
        let mut out = Vec::new();
        let mut pos = 1u64 << 20;
        for (&s, &l) in &self.used {
            let s_end = s.min(end);
            if s_end > pos {
                out.push((pos, s_end - pos));
            }
            pos = pos.max(s.saturating_add(l));
        }
        if end > pos {
            out.push((pos, end - pos));
        }
        out
    }
}

/// Where a new striped chunk goes ([`Allocator::striped_stripes`]).
struct StripedPlace {
    /// (devid, physical) of each stripe, in the chunk's order.
    stripes: Vec<(u64, u64)>,
    /// Bytes each stripe takes on its device.
    stripe_bytes: u64,
    /// The chunk's logical length.
    length: u64,
}

/// A block group removed in the running transaction (see `Allocator::removed`).
#[derive(Debug, Clone)]
pub(crate) struct RemovedGroup {
    pub start: u64,
    pub length: u64,
    /// (devid, physical offset) of each stripe's device extent.
    pub stripes: Vec<(u64, u64)>,
}

impl RemovedGroup {
    /// Whether logical address `bytenr` lies in any of `groups`.
    pub(crate) fn any_contains(groups: &[RemovedGroup], bytenr: u64) -> bool {
        groups
            .iter()
            .any(|r| bytenr >= r.start && bytenr < r.start + r.length)
    }
}

/// A chunk allocated in this transaction whose items are inserted at commit.
#[derive(Debug, Clone)]
pub(crate) struct PendingChunk {
    pub logical: u64,
    pub chunk: Chunk,
}

impl PendingChunk {
    /// Bytes each stripe takes on its device (its DEV_EXTENT's length): the chunk's
    /// length, except for striped profiles (RAID0, RAID10, RAID5/6), which spread it.
    pub(crate) fn stripe_bytes(&self) -> u64 {
        let c = &self.chunk;
        c.length / data_stripes(c.ty, u64::from(c.num_stripes), c.sub_stripes)
    }
}

/// Logical ranges of a chunk that hold superblock copies on some stripe: never free,
/// never extents (the kernel's and progs' exclude_super_stripes: a whole 64 KiB stripe
/// unit around each copy).
pub(crate) fn super_stripes(e: &MapEntry) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let profile = e.ty & BLOCK_GROUP_PROFILE_MASK;
    let nstripes = e.stripes.len() as u64;
    // RAID5/6: a copy in any strip of a full stripe (data or parity) takes the
    // whole row out, as the kernel's btrfs_rmap_block maps it (its data, the
    // row's logical range, would be rewritten with its parity).
    let parity = nparity(e.ty) > 0;
    let rmap_len = if parity {
        STRIPE_LEN * data_stripes(e.ty, nstripes, e.sub_stripes)
    } else {
        STRIPE_LEN
    };
    let per_stripe = e.stripe_size();
    for i in 0..SUPER_MIRROR_MAX {
        let sb = super_offset(i);
        for (si, st) in e.stripes.iter().enumerate() {
            if st.physical > sb || st.physical + per_stripe <= sb {
                continue;
            }
            let mut nr = (sb - st.physical) / e.stripe_len.max(1);
            if profile & BLOCK_GROUP_RAID10 != 0 {
                nr = (nr * nstripes + si as u64) / e.sub_stripes.max(1) as u64;
            } else if profile & BLOCK_GROUP_RAID0 != 0 {
                nr = nr * nstripes + si as u64;
            }
            let logical = e.start + nr * rmap_len;
            if logical >= e.start + e.length {
                continue;
            }
            let len = rmap_len.min(e.start + e.length - logical);
            if !out.contains(&(logical, len)) {
                out.push((logical, len));
            }
        }
    }
    out.sort();
    out
}

/// Marks whatever part of `[start, start + len)` is free in `free` as used.
pub(crate) fn remove_overlap(
    free: &mut FreeSpaceIndex,
    start: u64,
    len: u64,
) -> std::result::Result<(), crate::alloc::free_space_cache::FreeSpaceError> {
    let end = start.saturating_add(len);
    let hits: Vec<(u64, u64)> = free
        .iter()
        .filter(|&(o, l)| o < end && o.saturating_add(l) > start)
        .map(|(o, l)| {
            let a = o.max(start);
            (a, o.saturating_add(l).min(end) - a)
        })
        .collect();
    for (a, l) in hits {
        free.remove(a, l)?;
    }
    Ok(())
}

pub(crate) fn super_offset(i: usize) -> u64 {
    if i == 0 {
        SUPER_INFO_OFFSET
    } else {
        (16 * 1024u64) << (12 * i)
    }
}

pub(crate) fn block_group_type_name(ty: u64) -> &'static str {
    if ty & BLOCK_GROUP_DATA != 0 && ty & BLOCK_GROUP_METADATA != 0 {
        "mixed"
    } else if ty & BLOCK_GROUP_DATA != 0 {
        "data"
    } else if ty & BLOCK_GROUP_SYSTEM != 0 {
        "system"
    } else {
        "metadata"
    }
}

/// The tree holding BLOCK_GROUP_ITEMs: the block-group tree if the filesystem has one,
/// else the extent tree.
pub(crate) fn bg_tree_id(info: &FsInfo) -> u64 {
    if info.sb.compat_ro_flags & FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        BLOCK_GROUP_TREE_OBJECTID
    } else {
        EXTENT_TREE_OBJECTID
    }
}

/// Every chunk's BLOCK_GROUP_ITEM as (start, length, item), in chunk order; a chunk
/// without its item, or whose item's flags differ from the chunk's, is corruption.
pub(crate) fn block_group_items(info: &FsInfo) -> Result<Vec<(u64, u64, BlockGroupItem)>> {
    let tree = bg_tree_id(info);
    let ptr = info
        .tree_ptr(tree)
        .ok_or_else(|| Error::corrupt(format!("tree {tree} (block groups) not found")))?;
    let mut out = Vec::new();
    for e in info.chunk_map.iter() {
        let key = Key::new(e.start, BLOCK_GROUP_ITEM_KEY, e.length);
        let item = crate::tree::ctree::lookup_exact(info, &ptr, &key)?.ok_or_else(|| {
            Error::corrupt(format!(
                "chunk at logical {} has no block group item",
                e.start
            ))
        })?;
        let bg = BlockGroupItem::parse(item.data())
            .map_err(|err| Error::corrupt(format!("block group item {key}: {err}")))?;
        if bg.flags != e.ty {
            return Err(Error::corrupt(format!(
                "block group {} flags {:#x} differ from its chunk's {:#x}",
                e.start, bg.flags, e.ty
            )));
        }
        out.push((e.start, e.length, bg));
    }
    Ok(out)
}

impl Allocator {
    /// Loads every block group's item (not its free space) at open.
    pub(crate) fn load_block_groups(&mut self, info: &FsInfo) -> Result<()> {
        for (start, length, bg) in block_group_items(info)? {
            self.bgs.insert(
                start,
                BlockGroup {
                    start,
                    length,
                    flags: bg.flags,
                    used: bg.used,
                    loaded: false,
                    free: FreeSpaceIndex::new(),
                    fst_free: FreeSpaceIndex::new(),
                    fst_bitmaps: false,
                    dirty: false,
                    new: false,
                    ro: false,
                    unmirrored: false,
                },
            );
        }
        for ty in [BLOCK_GROUP_DATA, BLOCK_GROUP_METADATA, BLOCK_GROUP_SYSTEM] {
            if self.profile_for(ty) & MIRRORED == 0 {
                continue;
            }
            for b in self.bgs.values_mut() {
                if b.flags & BLOCK_GROUP_TYPE_MASK == ty
                    && b.flags & BLOCK_GROUP_PROFILE_MASK & !BLOCK_GROUP_RAID0 == 0
                {
                    b.unmirrored = true;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn bg_of(&self, bytenr: u64) -> Result<u64> {
        self.bgs
            .range(..=bytenr)
            .next_back()
            .filter(|(_, b)| b.contains(bytenr))
            .map(|(s, _)| *s)
            .ok_or_else(|| Error::corrupt(format!("logical {bytenr} is in no block group")))
    }

    /// Reads a block group's free space from the free-space tree.
    pub(crate) fn ensure_loaded(&mut self, info: &FsInfo, start: u64) -> Result<()> {
        let (length, loaded) = match self.bgs.get(&start) {
            Some(b) => (b.length, b.loaded),
            None => return Err(Error::corrupt(format!("no block group at {start}"))),
        };
        if loaded {
            return Ok(());
        }
        let ranges = super::free_space_tree::read_fst_ranges(info, start, length)?;
        self.set_loaded(info, start, &ranges.0, ranges.1, "free space tree")
    }

    /// Works every block group's free space out from the extent tree, to create or
    /// rebuild the free-space tree: each group is loaded and dirty, so the commit
    /// writes its items. Before anything is allocated: a group loaded later would
    /// see extent items its delayed refs then add again.
    pub(crate) fn load_all_from_extent_tree(&mut self, info: &FsInfo) -> Result<()> {
        let groups: Vec<(u64, u64)> = self.bgs.values().map(|b| (b.start, b.length)).collect();
        for (start, length) in groups {
            let ranges = super::free_space_tree::extent_tree_free_ranges(info, start, length)?;
            self.set_loaded(info, start, &ranges, false, "extent tree")?;
            if let Some(bg) = self.bgs.get_mut(&start) {
                bg.dirty = true;
            }
        }
        Ok(())
    }

    /// Takes `ranges` as the stored free space of a group (`fst_free`) and, without
    /// the superblock copies, as what may be allocated (`free`).
    fn set_loaded(
        &mut self,
        info: &FsInfo,
        start: u64,
        ranges: &[(u64, u64)],
        bitmaps: bool,
        from: &str,
    ) -> Result<()> {
        let bg = self
            .bgs
            .get_mut(&start)
            .ok_or_else(|| Error::corrupt(format!("no block group at {start}")))?;
        let mut free = FreeSpaceIndex::new();
        for r in ranges {
            free.add(r.0, r.1)
                .map_err(|e| Error::corrupt(format!("{from} of block group {start}: {e}")))?;
        }
        bg.fst_free = free.clone();
        // Superblock copies are never allocatable, whatever the free-space tree says:
        // btrfs-progs' mkfs and the kernel (a group whose free space is added after
        // its excluded extents were dropped) list them as free, and the kernel's
        // loader skips them (btrfs_add_new_free_space). A tree block there would be
        // overwritten by the next superblock write. `fst_free` keeps them as stored.
        if let Ok(e) = info.chunk_map.lookup(start) {
            for (s, l) in super_stripes(e) {
                remove_overlap(&mut free, s, l).map_err(|e| {
                    Error::corrupt(format!("free space of block group {start}: {e}"))
                })?;
            }
        }
        bg.free = free;
        bg.fst_bitmaps = bitmaps;
        bg.loaded = true;
        Ok(())
    }

    /// Picks the profile for new chunks of a type: that of the existing block groups.
    /// Device space no chunk holds yet, over all devices.
    pub(crate) fn unallocated(&self) -> u64 {
        self.dev_space
            .values()
            .flat_map(|d| d.holes())
            .map(|h| h.1)
            .sum()
    }

    /// Device space that new data chunks must leave for metadata to grow: a
    /// metadata chunk's worth (all copies) while metadata has less than half of
    /// that free, else nothing.
    pub(crate) fn metadata_room_kept(&self, total_bytes: u64) -> u64 {
        let meta_copies =
            profile_copies(self.profile_for(BLOCK_GROUP_METADATA)).map_or(1, |c| c.min(2));
        let reserve = meta_copies
            * (32u64 << 20)
                .min((total_bytes / 10) & !((1 << 20) - 1))
                .max(1 << 20);
        let meta_free: u64 = self
            .bgs
            .values()
            .filter(|b| b.flags & BLOCK_GROUP_METADATA != 0)
            .map(|b| b.length.saturating_sub(b.used))
            .sum();
        if meta_free < reserve / 2 {
            reserve
        } else {
            0
        }
    }

    /// The profile of new chunks of type `ty`: mkfs's choice, else the kernel's
    /// (btrfs_reduce_alloc_profile): the most redundant profile among the type's
    /// block groups that the devices allow.
    pub(crate) fn profile_for(&self, ty: u64) -> u64 {
        if let Some(p) = self.profiles.get(&ty) {
            return *p;
        }
        let mut present = None;
        for b in self.bgs.values() {
            if b.flags & BLOCK_GROUP_TYPE_MASK == ty {
                present = Some(present.unwrap_or(0) | b.flags & BLOCK_GROUP_PROFILE_MASK);
            }
        }
        match present {
            Some(profiles) => reduce_profile(profiles, self.dev_space.len()),
            None if ty == BLOCK_GROUP_DATA => 0,
            None => BLOCK_GROUP_DUP,
        }
    }

    /// Creates a new chunk and block group of type `ty` (DATA, METADATA or SYSTEM).
    /// Its items are written at commit; the space is usable at once.
    pub(crate) fn alloc_chunk(
        &mut self,
        info: &mut FsInfo,
        ty: u64,
        min_bytes: u64,
    ) -> Result<u64> {
        let profile = self.profile_for(ty);
        let ncopies = profile_copies(profile).ok_or_else(|| {
            Error::Unsupported(format!("allocating {} chunks", profile_name(profile)))
        })? as usize;
        if profile & STRIPED != 0 {
            let p = self.striped_stripes(info, ty, profile, min_bytes)?;
            return self.add_chunk(info, ty | profile, &p.stripes, p.stripe_bytes, p.length);
        }
        let total = info.sb.total_bytes;
        let max_stripe: u64 = match ty {
            BLOCK_GROUP_DATA => 1 << 30,
            BLOCK_GROUP_SYSTEM => 32 << 20,
            _ => {
                if total > 50 << 30 {
                    1 << 30
                } else {
                    256 << 20
                }
            }
        };
        // At most a tenth of the filesystem, as the kernel does, but never below what
        // the caller needs; mkfs --shrink caps chunks so little space is left over.
        let max_stripe = self
            .chunk_size_max
            .map_or(max_stripe, |c| max_stripe.min(c));
        let mut want = max_stripe.min((total / 10) & !((1 << 20) - 1));
        want = want.max(min_bytes.next_multiple_of(1 << 20)).max(1 << 20);
        if ty == BLOCK_GROUP_DATA {
            let reserve = self.metadata_room_kept(total);
            if reserve > 0 {
                let room = (self.unallocated().saturating_sub(reserve) / ncopies as u64)
                    & !((1 << 20) - 1);
                if room < min_bytes.max(1 << 20) {
                    return Err(Error::NoSpace(
                        "data space exhausted (the rest is kept for metadata)".into(),
                    ));
                }
                want = want.min(room);
            }
        }
        // Choose stripes: DUP takes two ranges on one device; RAID1* one per device.
        let mut stripes: Vec<(u64, u64)> = Vec::new(); // (devid, physical)
        let mut stripe_len = want;
        for attempt in 0..2 {
            stripes.clear();
            let devids: Vec<u64> = self.dev_space.keys().copied().collect();
            if profile == BLOCK_GROUP_DUP || profile == 0 {
                let Some(&devid) = devids.iter().max_by_key(|d| {
                    self.dev_space[d]
                        .holes()
                        .iter()
                        .map(|h| h.1)
                        .max()
                        .unwrap_or(0)
                }) else {
                    break;
                };
                let mut holes = self.dev_space[&devid].holes();
                for _ in 0..ncopies {
                    let Some(h) = holes.iter_mut().find(|h| h.1 >= stripe_len) else {
                        break;
                    };
                    stripes.push((devid, h.0));
                    h.0 += stripe_len;
                    h.1 -= stripe_len;
                }
            } else {
                let mut cands: Vec<(u64, u64)> = devids
                    .iter()
                    .filter_map(|d| {
                        self.dev_space[d]
                            .holes()
                            .into_iter()
                            .find(|h| h.1 >= stripe_len)
                            .map(|h| (*d, h.0))
                    })
                    .collect();
                cands.truncate(ncopies);
                stripes = cands;
            }
            if stripes.len() == ncopies {
                break;
            }
            if attempt == 0 {
                // Shrink to the largest hole that fits every copy.
                let best = self
                    .dev_space
                    .values()
                    .flat_map(|d| d.holes())
                    .map(|h| {
                        if profile == BLOCK_GROUP_DUP {
                            h.1 / 2
                        } else {
                            h.1
                        }
                    })
                    .max()
                    .unwrap_or(0)
                    & !((1 << 20) - 1);
                if best < min_bytes.max(1 << 20) {
                    break;
                }
                stripe_len = best;
            }
        }
        if stripes.len() != ncopies {
            return Err(Error::NoSpace(format!(
                "no device space for a new {} chunk",
                block_group_type_name(ty)
            )));
        }
        self.add_chunk(info, ty | profile, &stripes, stripe_len, stripe_len)
    }

    /// Where a new RAID0, RAID10, RAID5 or RAID6 chunk of type `ty` goes: each
    /// stripe's device and offset, the bytes each takes, and the chunk's length. The
    /// kernel's rule (gather_device_info, decide_stripe_size_regular):
    /// - the largest stripe is the type's chunk size (data 10 GiB, metadata 256 MiB or
    ///   1 GiB above 50 GiB, system 32 MiB), at most 1 GiB; the chunk at most that
    ///   size and a tenth of the filesystem;
    /// - a device offers its first free range that holds a largest stripe (counted
    ///   as exactly that), else its largest free range, if at least one 64 KiB unit;
    /// - devices by what they offer, then by their unallocated bytes, most first; as
    ///   many as offer (RAID10 an even number: stripes 2k and 2k+1 mirror each other;
    ///   a system chunk at most 29, what the superblock's array holds);
    /// - the stripe is the smallest offer; when the chunk would pass its limit, the
    ///   limit / data stripes rounded up to 16 MiB if smaller; then in 64 KiB units.
    ///
    /// A data chunk also leaves the metadata reserve unallocated. Smaller than
    /// `min_bytes` is refused for metadata and system (a tree block must fit); data
    /// takes what there is, as the kernel does (the caller splits its extent).
    fn striped_stripes(
        &self,
        info: &FsInfo,
        ty: u64,
        profile: u64,
        min_bytes: u64,
    ) -> Result<StripedPlace> {
        let r = raid(profile);
        let nparity = nparity(profile) as usize;
        let total = info.sb.total_bytes;
        let type_chunk_bytes: u64 = match ty {
            BLOCK_GROUP_DATA => 10 << 30,
            BLOCK_GROUP_SYSTEM => 32 << 20,
            _ if total > 50 << 30 => 1 << 30,
            _ => 256 << 20,
        };
        let mut max_stripe = type_chunk_bytes.min(1 << 30);
        let mut max_chunk = type_chunk_bytes.min(total / 10);
        if let Some(c) = self.chunk_size_max {
            max_stripe = max_stripe.min(c);
            max_chunk = max_chunk.min(c);
        }
        // (devid, offset, offered bytes, unallocated bytes)
        let mut devs: Vec<(u64, u64, u64, u64)> = self
            .dev_space
            .iter()
            .filter_map(|(&devid, ds)| {
                let holes = ds.holes();
                let unallocated: u64 = holes.iter().map(|h| h.1).sum();
                let (off, offer) = match holes.iter().find(|h| h.1 >= max_stripe) {
                    Some(h) => (h.0, max_stripe),
                    None => holes
                        .iter()
                        .copied()
                        .max_by_key(|h| (h.1, u64::MAX - h.0))?,
                };
                (offer >= STRIPE_LEN).then_some((devid, off, offer, unallocated))
            })
            .collect();
        devs.sort_by_key(|&(devid, _, offer, unallocated)| {
            (u64::MAX - offer, u64::MAX - unallocated, devid)
        });
        if ty == BLOCK_GROUP_SYSTEM {
            devs.truncate(SYSTEM_CHUNK_DEVS_MAX);
        }
        let step = if profile == BLOCK_GROUP_RAID10 { 2 } else { 1 };
        let ndevs = devs.len() / step * step;
        let no_room = || {
            Error::NoSpace(format!(
                "no device space for a new {} {} chunk",
                profile_name(profile),
                block_group_type_name(ty)
            ))
        };
        if ndevs < r.devs_min || ndevs <= nparity {
            return Err(no_room());
        }
        devs.truncate(ndevs);
        let data_stripes = ((ndevs - nparity) as u64 / r.ncopies).max(1);
        let mut stripe = devs[ndevs - 1].2;
        if stripe.saturating_mul(data_stripes) > max_chunk {
            stripe = stripe.min((max_chunk / data_stripes).next_multiple_of(16 << 20));
        }
        if ty == BLOCK_GROUP_DATA {
            let reserve = self.metadata_room_kept(total);
            if reserve > 0 {
                let raw_per_stripe = r.ncopies * data_stripes + nparity as u64;
                let room = self.unallocated().saturating_sub(reserve);
                stripe = stripe.min(room / raw_per_stripe.max(1));
            }
        }
        stripe -= stripe % STRIPE_LEN;
        let length = stripe * data_stripes;
        let least = if ty == BLOCK_GROUP_DATA {
            info.sectorsize as u64
        } else {
            min_bytes
        };
        if stripe == 0 || length < least {
            return Err(no_room());
        }
        Ok(StripedPlace {
            stripes: devs.iter().map(|&(d, off, _, _)| (d, off)).collect(),
            stripe_bytes: stripe,
            length,
        })
    }

    /// Records a new chunk of `flags` (type and profile) whose stripes start at
    /// `stripes` (devid, physical), each taking `stripe_len` bytes, `length` bytes
    /// of logical space: the device ranges, the mapping and block group (usable at
    /// once), and the chunk for the commit to insert.
    fn add_chunk(
        &mut self,
        info: &mut FsInfo,
        flags: u64,
        stripes: &[(u64, u64)],
        stripe_len: u64,
        length: u64,
    ) -> Result<u64> {
        // The superblock says which new profiles the filesystem uses, as the kernel
        // sets these flags when it creates such a block group (older kernels refuse
        // what they do not know).
        if flags & (BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6) != 0 {
            info.sb.incompat_flags |= FEATURE_INCOMPAT_RAID56;
        }
        if flags & (BLOCK_GROUP_RAID1C3 | BLOCK_GROUP_RAID1C4) != 0 {
            info.sb.incompat_flags |= FEATURE_INCOMPAT_RAID1C34;
        }
        let sub_stripes: u16 = if flags & BLOCK_GROUP_RAID10 != 0 {
            2
        } else {
            1
        };
        let logical = info
            .chunk_map
            .iter()
            .map(|e| e.start + e.length)
            .max()
            .unwrap_or(1 << 20)
            .next_multiple_of(1 << 20);
        let mut chunk_stripes = Vec::new();
        for &(devid, physical) in stripes {
            let ds = self.dev_space.get_mut(&devid).ok_or_else(|| {
                Error::corrupt(format!("internal: devid {devid} has no free-space map"))
            })?;
            ds.used.insert(physical, stripe_len);
            ds.bytes_used += stripe_len;
            let uuid = self
                .dev_uuids
                .get(&devid)
                .copied()
                .ok_or_else(|| Error::corrupt(format!("devid {devid} has no device item")))?;
            chunk_stripes.push(Stripe {
                devid,
                offset: physical,
                dev_uuid: uuid,
            });
        }
        let chunk = Chunk {
            length,
            owner: EXTENT_TREE_OBJECTID,
            stripe_len: STRIPE_LEN,
            ty: flags,
            io_align: STRIPE_LEN as u32,
            io_width: STRIPE_LEN as u32,
            sector_size: info.sectorsize,
            num_stripes: stripes.len() as u16,
            sub_stripes,
            stripes: chunk_stripes,
        };
        let entry = MapEntry {
            start: logical,
            length,
            ty: flags,
            stripe_len: STRIPE_LEN,
            sub_stripes,
            stripes: stripes
                .iter()
                .map(|&(devid, physical)| MapStripe { devid, physical })
                .collect(),
        };
        info.chunk_map.insert(entry.clone())?;
        self.add_new_block_group(&entry)?;
        self.pending_chunks.push(PendingChunk { logical, chunk });
        Ok(logical)
    }

    /// Registers a block group created in this transaction (mkfs or a new chunk).
    pub(crate) fn add_new_block_group(&mut self, e: &MapEntry) -> Result<()> {
        let mut free = FreeSpaceIndex::new();
        free.add(e.start, e.length)
            .map_err(|err| Error::corrupt(format!("new block group {}: {err}", e.start)))?;
        for (s, l) in super_stripes(e) {
            free.remove(s, l)
                .map_err(|err| Error::corrupt(format!("new block group {}: {err}", e.start)))?;
        }
        self.bgs.insert(
            e.start,
            BlockGroup {
                start: e.start,
                length: e.length,
                flags: e.ty,
                used: 0,
                loaded: true,
                fst_free: free.clone(),
                free,
                fst_bitmaps: false,
                dirty: true,
                new: true,
                ro: false,
                unmirrored: false,
            },
        );
        Ok(())
    }
}

/// Copies of every byte a chunk of `profile` keeps (RAID5/6: one, with parity
/// besides; None: a profile new chunks are not made in).
pub(crate) fn profile_copies(profile: u64) -> Option<u64> {
    match profile {
        0 | BLOCK_GROUP_RAID0 | BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6 => Some(1),
        BLOCK_GROUP_DUP | BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID10 => Some(2),
        BLOCK_GROUP_RAID1C3 => Some(3),
        BLOCK_GROUP_RAID1C4 => Some(4),
        _ => None,
    }
}

/// Per-profile facts (the kernel's btrfs_raid_array, as far as space is concerned).
pub(crate) struct Raid {
    /// The kernel's raid index (btrfs_bg_flags_to_raid_index): SINGLE 0, then the
    /// profile bits in their order (RAID0 1, RAID1 2, DUP 3, RAID10 4, RAID5 5,
    /// RAID6 6, RAID1C3 7, RAID1C4 8; older kernels ordered them otherwise).
    /// The order in which a space info lists its profiles, and the last one present
    /// gives statfs its factor.
    pub(crate) index: u8,
    /// Copies of every byte (ncopies).
    pub(crate) ncopies: u64,
    /// Fewest devices a chunk of the profile needs.
    pub(crate) devs_min: usize,
    /// Stripes per device (2 for DUP).
    pub(crate) dev_stripes: u64,
}

/// The facts of one profile bit (0: single).
pub(crate) fn raid(profile: u64) -> Raid {
    let r = |index, ncopies, devs_min, dev_stripes| Raid {
        index,
        ncopies,
        devs_min,
        dev_stripes,
    };
    match profile {
        BLOCK_GROUP_RAID0 => r(1, 1, 1, 1),
        BLOCK_GROUP_RAID1 => r(2, 2, 2, 1),
        BLOCK_GROUP_DUP => r(3, 2, 1, 2),
        BLOCK_GROUP_RAID10 => r(4, 2, 2, 1),
        BLOCK_GROUP_RAID5 => r(5, 1, 2, 1),
        BLOCK_GROUP_RAID6 => r(6, 1, 3, 1),
        BLOCK_GROUP_RAID1C3 => r(7, 3, 3, 1),
        BLOCK_GROUP_RAID1C4 => r(8, 4, 4, 1),
        _ => r(0, 1, 1, 1),
    }
}

/// Profiles that spread a chunk over its stripes in 64 KiB units (RAID5/6 with
/// parity, written by io/raid56.rs).
pub(crate) const STRIPED: u64 =
    BLOCK_GROUP_RAID0 | BLOCK_GROUP_RAID10 | BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6;

/// Most stripes a system chunk may have: what fits in half the superblock's
/// sys_chunk_array with its key (the kernel's BTRFS_MAX_DEVS_SYS_CHUNK).
const SYSTEM_CHUNK_DEVS_MAX: usize =
    (SYSTEM_CHUNK_ARRAY_SIZE / 2 - DISK_KEY_SIZE - CHUNK_BASE_SIZE - STRIPE_SIZE) / STRIPE_SIZE + 1;

/// Profiles that keep more than one copy (or parity).
pub(crate) const MIRRORED: u64 = BLOCK_GROUP_RAID10
    | BLOCK_GROUP_RAID1
    | BLOCK_GROUP_RAID1C3
    | BLOCK_GROUP_RAID1C4
    | BLOCK_GROUP_RAID5
    | BLOCK_GROUP_RAID6
    | BLOCK_GROUP_DUP;

/// The profile new chunks get: the most redundant of those present that the number
/// of writable devices allows (SINGLE when none does).
pub(crate) fn reduce_profile(profiles: u64, devices: usize) -> u64 {
    let all = [
        BLOCK_GROUP_RAID10,
        BLOCK_GROUP_RAID1,
        BLOCK_GROUP_DUP,
        BLOCK_GROUP_RAID0,
        BLOCK_GROUP_RAID5,
        BLOCK_GROUP_RAID6,
        BLOCK_GROUP_RAID1C3,
        BLOCK_GROUP_RAID1C4,
    ];
    let allowed: u64 = all
        .iter()
        .filter(|&&p| devices >= raid(p).devs_min)
        .fold(0, |a, p| a | p)
        & profiles;
    for p in [
        BLOCK_GROUP_RAID1C4,
        BLOCK_GROUP_RAID6,
        BLOCK_GROUP_RAID1C3,
        BLOCK_GROUP_RAID5,
        BLOCK_GROUP_RAID10,
        BLOCK_GROUP_RAID1,
        BLOCK_GROUP_DUP,
        BLOCK_GROUP_RAID0,
    ] {
        if allowed & p != 0 {
            return p;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::dev::{Device, MemDevice};
    use crate::io::disk_io::OpenOptions;
    use crate::tools::mkfs::{make_filesystem, MkfsOptions};
    use crate::transaction::Trans;
    use std::sync::Arc;

    fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
        a.0 < b.0 + b.1 && b.0 < a.0 + a.1
    }

    /// A free-space tree that lists a superblock copy's stripe as free (btrfs-progs'
    /// mkfs writes such trees for its DUP metadata chunk, the kernel at times) must not
    /// make the allocator hand that stripe out: a tree block there loses its first
    /// 4 KiB on that copy to the next superblock write (seen as a checksum mismatch of
    /// one copy of an fs-tree block after tar x on a btrfs-progs-made image).
    #[test]
    fn super_stripes_listed_free_are_never_allocated() {
        let dev = MemDevice::new(vec![0u8; 256 << 20], "supers");
        let mut t =
            make_filesystem(dev.clone() as Arc<dyn Device>, &MkfsOptions::default()).expect("mkfs");
        let (start, length, ty, stripes) =
            t.fs.info
                .chunk_map
                .iter()
                .map(|e| (e.start, e.length, e.ty, super_stripes(e)))
                .find(|c| !c.3.is_empty())
                .expect("a chunk holds a superblock copy");
        // Store the group's free space as btrfs-progs' mkfs does: supers free.
        {
            let bg = t.alloc.bgs.get_mut(&start).expect("block group");
            assert!(bg.loaded);
            for &(s, l) in &stripes {
                assert!(!bg.free.iter().any(|r| overlaps(r, (s, l))));
                bg.fst_free.add(s, l).expect("add super stripe");
            }
            bg.dirty = true;
        }
        t.commit().expect("commit");
        drop(t);

        let copy = MemDevice::new(dev.snapshot(), "reopen");
        let opts = OpenOptions {
            writable: true,
            ..Default::default()
        };
        let info = FsInfo::open(vec![copy as Arc<dyn Device>], opts).expect("reopen");
        let mut t = Trans::from_fs_no_replay(info).expect("trans");
        let (stored, _) =
            crate::alloc::free_space_tree::read_fst_ranges(&t.fs.info, start, length).expect("fst");
        for &(s, l) in &stripes {
            assert!(
                stored.iter().any(|&(o, n)| o <= s && s + l <= o + n),
                "the free-space tree lists {s}+{l} as free"
            );
        }
        t.alloc.ensure_loaded(&t.fs.info, start).expect("load");
        let bg = &t.alloc.bgs[&start];
        for &(s, l) in &stripes {
            assert!(
                !bg.free.iter().any(|r| overlaps(r, (s, l))),
                "super stripe {s}+{l} is allocatable"
            );
            // What the tree must say stays as stored (no needless rewrite).
            assert!(bg.fst_free.is_free(s, l));
        }
        // Take every free block of the group: none in a super stripe.
        let len = if ty & BLOCK_GROUP_DATA != 0 {
            t.fs.info.sectorsize as u64
        } else {
            t.fs.info.nodesize as u64
        };
        let mut taken = 0u64;
        while let Some(b) = t
            .alloc
            .find_free(&t.fs.info, ty & BLOCK_GROUP_TYPE_MASK, len, start)
            .expect("find_free")
        {
            if b < start || b >= start + length {
                break;
            }
            for &(s, l) in &stripes {
                assert!(
                    !overlaps((b, len), (s, l)),
                    "allocated {b} in super stripe {s}"
                );
            }
            taken += 1;
        }
        assert!(taken > 0);
    }

    #[test]
    fn profile_reduction() {
        assert_eq!(reduce_profile(BLOCK_GROUP_RAID1, 0), 0);
        assert_eq!(reduce_profile(BLOCK_GROUP_RAID1, 2), BLOCK_GROUP_RAID1);
        assert_eq!(
            reduce_profile(BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID6, 4),
            BLOCK_GROUP_RAID6
        );
        assert_eq!(reduce_profile(BLOCK_GROUP_DUP, 1), BLOCK_GROUP_DUP);
    }
}
