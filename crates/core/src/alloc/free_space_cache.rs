//! In-memory free-space index of one block group (the kernel's
//! `fs/btrfs/free-space-cache.c` extent entries, without bitmaps).
//!
//! Free space is kept as maximal, non-overlapping, non-adjacent extents
//! `[offset, offset + len)`, indexed twice:
//!
//! * by offset (`BTreeMap<offset, len>`), for merging, splitting and
//!   locality-honouring searches from an allocation hint;
//! * by size (`BTreeSet<(len, Reverse(offset))>`), mirroring the kernel's
//!   `free_space_bytes` cached rb-tree added by "btrfs: index free space
//!   entries on size" (commit 59c7b566a3b6). Walking it from the largest
//!   entry downwards lets a search stop at the first entry that is too small,
//!   instead of scanning every (possibly tiny) fragment by offset.
//!
//! Every `add`/`remove` is O(log n). [`FreeSpaceIndex::find`] with
//! [`SearchMode::OffsetOnly`] is the pre-patch linear scan; with
//! [`SearchMode::SizeIndex`] it does one O(log n) locality probe at the hint
//! and then walks the size index.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

/// Errors from [`FreeSpaceIndex::add`] and [`FreeSpaceIndex::remove`]. On error
/// the index is left unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FreeSpaceError {
    /// `add` of a range that overlaps space that is already free.
    #[error("free space [{offset}, +{len}) overlaps existing free space")]
    Overlap { offset: u64, len: u64 },
    /// `remove` of a range that is not entirely free.
    #[error("range [{offset}, +{len}) is not entirely free")]
    NotFree { offset: u64, len: u64 },
    /// Zero length, or `offset + len` overflows `u64`.
    #[error("invalid free space range [{offset}, +{len})")]
    InvalidRange { offset: u64, len: u64 },
}

/// How a block group's free-space index is searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    /// Pre-patch kernel behaviour: linear scan by offset from the hint, then
    /// wrap around to the start and scan up to the hint.
    OffsetOnly,
    /// Post-patch behaviour: one locality probe at the hint (unless the hint
    /// is 0), then walk the size index from the largest entry down, stopping
    /// at the first entry smaller than the request.
    SizeIndex,
}

/// Counters filled in by [`FreeSpaceIndex::find`]. They accumulate across
/// calls; reset with `SearchStats::default()`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SearchStats {
    /// Free-space entries examined.
    pub entries_visited: u64,
}

/// The free space of one block group, indexed by offset and by size.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeSpaceIndex {
    /// offset -> len; entries never overlap nor touch.
    by_offset: BTreeMap<u64, u64>,
    /// (len, Reverse(offset)): iterating in reverse yields the largest entry
    /// first and, among equal sizes, the lowest offset first.
    by_size: BTreeSet<(u64, Reverse<u64>)>,
    /// Sum of all entry lengths.
    total: u64,
}

/// Round `v` up to a multiple of `align` (`align` >= 1); `None` on overflow.
fn align_up(v: u64, align: u64) -> Option<u64> {
    v.checked_next_multiple_of(align)
}

/// The aligned start of a `len`-byte allocation inside the entry
/// `[off, off + elen)` at or after `from`, if it fits.
fn fit_in(off: u64, elen: u64, from: u64, len: u64, align: u64) -> Option<u64> {
    let end = off + elen; // entries never overflow (checked on insert)
    let start = align_up(from.max(off), align)?;
    let alloc_end = start.checked_add(len)?;
    (alloc_end <= end).then_some(start)
}

impl FreeSpaceIndex {
    /// An empty index.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn insert_entry(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, Reverse(offset)));
        self.total += len;
    }

    fn remove_entry(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, Reverse(offset)));
        self.total -= len;
    }

    /// The entry containing byte `pos`, if any.
    fn entry_containing(&self, pos: u64) -> Option<(u64, u64)> {
        let (&off, &len) = self.by_offset.range(..=pos).next_back()?;
        (pos - off < len).then_some((off, len))
    }

    /// The entry containing `pos`, or else the first entry after `pos`.
    fn entry_at_or_after(&self, pos: u64) -> Option<(u64, u64)> {
        self.entry_containing(pos).or_else(|| {
            self.by_offset
                .range((Bound::Excluded(pos), Bound::Unbounded))
                .next()
                .map(|(&o, &l)| (o, l))
        })
    }

    /// Mark `[offset, offset + len)` free, merging with adjacent free entries.
    /// Fails with [`FreeSpaceError::Overlap`] if any byte of it is already free.
    pub(crate) fn add(&mut self, offset: u64, len: u64) -> Result<(), FreeSpaceError> {
        let end = match offset.checked_add(len) {
            Some(end) if len > 0 => end,
            _ => return Err(FreeSpaceError::InvalidRange { offset, len }),
        };
        let prev = self
            .by_offset
            .range(..=offset)
            .next_back()
            .map(|(&o, &l)| (o, l));
        let next = self
            .by_offset
            .range((Bound::Excluded(offset), Bound::Unbounded))
            .next()
            .map(|(&o, &l)| (o, l));
        if let Some((po, pl)) = prev {
            if po + pl > offset {
                return Err(FreeSpaceError::Overlap { offset, len });
            }
        }
        if let Some((no, _)) = next {
            if no < end {
                return Err(FreeSpaceError::Overlap { offset, len });
            }
        }
        let (mut new_off, mut new_end) = (offset, end);
        if let Some((po, pl)) = prev {
            if po + pl == offset {
                self.remove_entry(po, pl);
                new_off = po;
            }
        }
        if let Some((no, nl)) = next {
            if no == end {
                self.remove_entry(no, nl);
                new_end = no + nl;
            }
        }
        self.insert_entry(new_off, new_end - new_off);
        Ok(())
    }

    /// Mark `[offset, offset + len)` used. The whole range must be free (and
    /// therefore inside one entry); the entry is split around it. Fails with
    /// [`FreeSpaceError::NotFree`] otherwise.
    pub(crate) fn remove(&mut self, offset: u64, len: u64) -> Result<(), FreeSpaceError> {
        let end = match offset.checked_add(len) {
            Some(end) if len > 0 => end,
            _ => return Err(FreeSpaceError::InvalidRange { offset, len }),
        };
        let (eo, el) = self
            .entry_containing(offset)
            .ok_or(FreeSpaceError::NotFree { offset, len })?;
        let eend = eo + el;
        if end > eend {
            return Err(FreeSpaceError::NotFree { offset, len });
        }
        self.remove_entry(eo, el);
        if eo < offset {
            self.insert_entry(eo, offset - eo);
        }
        if end < eend {
            self.insert_entry(end, eend - end);
        }
        Ok(())
    }

    /// Whether every byte of `[offset, offset + len)` is free. An empty range
    /// is free; a range overflowing `u64` is not.
    pub(crate) fn is_free(&self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        match self.entry_containing(offset) {
            Some((eo, el)) => end <= eo + el,
            None => false,
        }
    }

    /// Find `len` free bytes starting at a multiple of `align` (0 is treated
    /// as 1). Returns the start; `[start, start + len)` lies inside one free
    /// entry. Does not remove anything. Returns `None` for `len == 0`.
    ///
    /// `hint` is the preferred start (locality). With
    /// [`SearchMode::OffsetOnly`] the entries are scanned by offset from the
    /// entry holding `align_up(hint)` (starting there) or the next one, then
    /// from the beginning up to the hint. With [`SearchMode::SizeIndex`] only
    /// that one entry is probed (skipped when `hint == 0`, i.e. "search from the
    /// block group start, locality does not matter"), then the size index is
    /// walked from the largest entry down until an entry is smaller than `len`.
    ///
    /// `stats.entries_visited` is incremented by the number of entries examined.
    pub(crate) fn find(
        &self,
        hint: u64,
        len: u64,
        align: u64,
        mode: SearchMode,
        stats: &mut SearchStats,
    ) -> Option<u64> {
        if len == 0 {
            return None;
        }
        let align = align.max(1);
        // `None` when aligning the hint overflows: nothing can be at/after it.
        let pos = align_up(hint, align);
        match mode {
            SearchMode::OffsetOnly => self.find_by_offset(pos, len, align, stats),
            SearchMode::SizeIndex => {
                if hint != 0 {
                    if let Some(pos) = pos {
                        if let Some((eo, el)) = self.entry_at_or_after(pos) {
                            stats.entries_visited += 1;
                            if let Some(start) = fit_in(eo, el, pos, len, align) {
                                return Some(start);
                            }
                        }
                    }
                }
                self.find_by_size(len, align, stats)
            }
        }
    }

    fn find_by_offset(
        &self,
        pos: Option<u64>,
        len: u64,
        align: u64,
        stats: &mut SearchStats,
    ) -> Option<u64> {
        let Some(pos) = pos else {
            // Hint beyond the address space: just the wrap-around pass.
            return self.scan(self.by_offset.iter(), 0, len, align, stats);
        };
        // Pass 1: the entry holding `pos` (from `pos`) and every later entry.
        let first = self.entry_containing(pos).map_or(pos, |(eo, _)| eo);
        if let Some(start) = self.scan(self.by_offset.range(first..), pos, len, align, stats) {
            return Some(start);
        }
        // Pass 2: wrap around; every entry starting before `pos`, from its start
        // (this re-examines the entry holding `pos`, as a whole).
        self.scan(self.by_offset.range(..pos), 0, len, align, stats)
    }

    fn scan<'a>(
        &self,
        entries: impl Iterator<Item = (&'a u64, &'a u64)>,
        from: u64,
        len: u64,
        align: u64,
        stats: &mut SearchStats,
    ) -> Option<u64> {
        for (&eo, &el) in entries {
            stats.entries_visited += 1;
            if el < len {
                continue;
            }
            if let Some(start) = fit_in(eo, el, from, len, align) {
                return Some(start);
            }
        }
        None
    }

    fn find_by_size(&self, len: u64, align: u64, stats: &mut SearchStats) -> Option<u64> {
        for &(el, Reverse(eo)) in self.by_size.iter().rev() {
            stats.entries_visited += 1;
            if el < len {
                // Everything after this is smaller still.
                break;
            }
            // Alignment may waste up to `align - 1` bytes of this entry; a
            // smaller, better-aligned entry may still fit, so keep walking.
            if let Some(start) = fit_in(eo, el, eo, len, align) {
                return Some(start);
            }
        }
        None
    }

    /// Total free bytes.
    pub(crate) fn total_free(&self) -> u64 {
        self.total
    }

    /// Length of the largest free entry (0 when empty).
    pub(crate) fn largest(&self) -> u64 {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }

    /// Number of free entries (maximal free extents).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.by_offset.len()
    }

    /// `(offset, len)` of every free entry, by ascending offset.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_offset.iter().map(|(&o, &l)| (o, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K4: u64 = 4096;

    fn entries_of(idx: &FreeSpaceIndex) -> Vec<(u64, u64)> {
        idx.iter().collect()
    }

    fn find(
        idx: &FreeSpaceIndex,
        hint: u64,
        len: u64,
        align: u64,
        mode: SearchMode,
    ) -> Option<u64> {
        idx.find(hint, len, align, mode, &mut SearchStats::default())
    }

    #[test]
    fn add_merges_neighbours() {
        let mut idx = FreeSpaceIndex::new();
        idx.add(0, K4).unwrap();
        idx.add(2 * K4, K4).unwrap();
        assert_eq!(entries_of(&idx), vec![(0, K4), (2 * K4, K4)]);
        // Fills the hole: merges with both sides.
        idx.add(K4, K4).unwrap();
        assert_eq!(entries_of(&idx), vec![(0, 3 * K4)]);
        // Merge on the right only.
        idx.add(10 * K4, K4).unwrap();
        idx.add(9 * K4, K4).unwrap();
        assert_eq!(entries_of(&idx), vec![(0, 3 * K4), (9 * K4, 2 * K4)]);
        // Merge on the left only.
        idx.add(11 * K4, K4).unwrap();
        assert_eq!(entries_of(&idx), vec![(0, 3 * K4), (9 * K4, 3 * K4)]);
        assert_eq!(idx.total_free(), 6 * K4);
        assert_eq!(idx.largest(), 3 * K4);
        assert_eq!(idx.entries(), 2);
    }

    #[test]
    fn add_overlap_errors_leave_index_unchanged() {
        let mut idx = FreeSpaceIndex::new();
        idx.add(10, 10).unwrap();
        let before = entries_of(&idx);
        for (o, l) in [(10, 10), (5, 6), (19, 5), (12, 2), (0, 100), (10, 1)] {
            assert_eq!(
                idx.add(o, l),
                Err(FreeSpaceError::Overlap { offset: o, len: l }),
                "add({o}, {l})"
            );
        }
        assert_eq!(entries_of(&idx), before);
        assert_eq!(idx.total_free(), 10);
        // Touching is fine.
        idx.add(5, 5).unwrap();
        idx.add(20, 1).unwrap();
        assert_eq!(entries_of(&idx), vec![(5, 16)]);
        assert!(matches!(
            idx.add(0, 0),
            Err(FreeSpaceError::InvalidRange { .. })
        ));
        assert!(matches!(
            idx.add(u64::MAX, 2),
            Err(FreeSpaceError::InvalidRange { .. })
        ));
        // The very last byte of the address space is representable.
        idx.add(u64::MAX - 1, 1).unwrap();
        assert!(idx.is_free(u64::MAX - 1, 1));
        assert!(!idx.is_free(u64::MAX - 1, 2));
    }

    #[test]
    fn remove_splits() {
        let mut idx = FreeSpaceIndex::new();
        idx.add(0, 10 * K4).unwrap();
        idx.remove(2 * K4, 3 * K4).unwrap();
        assert_eq!(entries_of(&idx), vec![(0, 2 * K4), (5 * K4, 5 * K4)]);
        // Remove at the head of an entry.
        idx.remove(5 * K4, K4).unwrap();
        // Remove at the tail of an entry.
        idx.remove(9 * K4, K4).unwrap();
        assert_eq!(entries_of(&idx), vec![(0, 2 * K4), (6 * K4, 3 * K4)]);
        // Remove a whole entry.
        idx.remove(0, 2 * K4).unwrap();
        assert_eq!(entries_of(&idx), vec![(6 * K4, 3 * K4)]);
        assert_eq!(idx.total_free(), 3 * K4);
        assert_eq!(idx.largest(), 3 * K4);
        assert_eq!(idx.entries(), 1);
    }

    #[test]
    fn remove_not_free_errors_leave_index_unchanged() {
        let mut idx = FreeSpaceIndex::new();
        idx.add(10, 10).unwrap();
        idx.add(30, 10).unwrap();
        let before = entries_of(&idx);
        for (o, l) in [
            (0, 5),
            (5, 10),
            (15, 10),
            (10, 30),
            (20, 10),
            (39, 2),
            (40, 1),
        ] {
            assert_eq!(
                idx.remove(o, l),
                Err(FreeSpaceError::NotFree { offset: o, len: l }),
                "remove({o}, {l})"
            );
        }
        assert!(matches!(
            idx.remove(10, 0),
            Err(FreeSpaceError::InvalidRange { .. })
        ));
        assert!(matches!(
            idx.remove(u64::MAX, 2),
            Err(FreeSpaceError::InvalidRange { .. })
        ));
        assert_eq!(entries_of(&idx), before);
        assert_eq!(idx.total_free(), 20);
    }

    #[test]
    fn is_free_basic() {
        let mut idx = FreeSpaceIndex::new();
        idx.add(100, 50).unwrap();
        assert!(idx.is_free(100, 50));
        assert!(idx.is_free(120, 30));
        assert!(idx.is_free(149, 1));
        assert!(!idx.is_free(99, 2));
        assert!(!idx.is_free(149, 2));
        assert!(!idx.is_free(150, 1));
        assert!(idx.is_free(0, 0));
        assert!(!idx.is_free(u64::MAX, 2));
    }

    #[test]
    fn find_alignment() {
        let mut idx = FreeSpaceIndex::new();
        // [4097, 12288): the only 4K-aligned start inside is 8192, leaving 4K.
        idx.add(K4 + 1, 2 * K4 - 1).unwrap();
        for mode in [SearchMode::OffsetOnly, SearchMode::SizeIndex] {
            assert_eq!(find(&idx, 0, 2 * K4 - 1, 1, mode), Some(K4 + 1));
            assert_eq!(find(&idx, 0, K4, K4, mode), Some(2 * K4));
            assert_eq!(find(&idx, 0, K4 + 1, K4, mode), None);
            assert_eq!(find(&idx, 0, 2 * K4, 1, mode), None);
            assert_eq!(find(&idx, 0, 0, 1, mode), None);
        }
        // A large but badly aligned entry must not stop the size walk.
        let mut idx = FreeSpaceIndex::new();
        idx.add(1, 100).unwrap(); // largest; 64-aligned 64 bytes: [64, 128) > 101
        idx.add(128, 64).unwrap(); // smaller, perfectly aligned
        let mut st = SearchStats::default();
        assert_eq!(
            idx.find(0, 64, 64, SearchMode::SizeIndex, &mut st),
            Some(128)
        );
        assert_eq!(st.entries_visited, 2);
        assert_eq!(find(&idx, 0, 64, 64, SearchMode::OffsetOnly), Some(128));
        // align 0 is treated as 1.
        assert_eq!(find(&idx, 0, 10, 0, SearchMode::SizeIndex), Some(1));
    }

    #[test]
    fn find_hint_locality_and_wrap() {
        let mut idx = FreeSpaceIndex::new();
        idx.add(0, 10 * K4).unwrap();
        idx.add(20 * K4, 2 * K4).unwrap();
        idx.add(30 * K4, 5 * K4).unwrap();
        for mode in [SearchMode::OffsetOnly, SearchMode::SizeIndex] {
            // Hint inside an entry that fits: start at the aligned hint.
            assert_eq!(find(&idx, 3 * K4 + 1, K4, K4, mode), Some(4 * K4));
            assert_eq!(find(&idx, 20 * K4, 2 * K4, K4, mode), Some(20 * K4));
            // Hint in a gap before an entry that fits: that entry.
            assert_eq!(find(&idx, 25 * K4, 3 * K4, K4, mode), Some(30 * K4));
        }
        // Hint inside an entry that is too small (from the hint): OffsetOnly
        // moves forward, SizeIndex takes the largest entry.
        assert_eq!(
            find(&idx, 21 * K4, 2 * K4, K4, SearchMode::OffsetOnly),
            Some(30 * K4)
        );
        assert_eq!(
            find(&idx, 21 * K4, 2 * K4, K4, SearchMode::SizeIndex),
            Some(0)
        );
        // Nothing after the hint fits: OffsetOnly wraps to the beginning.
        assert_eq!(
            find(&idx, 31 * K4, 6 * K4, K4, SearchMode::OffsetOnly),
            Some(0)
        );
        // The wrap also considers the entry holding the hint from its start.
        assert_eq!(
            find(&idx, 8 * K4, 6 * K4, K4, SearchMode::OffsetOnly),
            Some(0)
        );
        // Hint 0: SizeIndex ignores locality and takes the largest entry.
        let mut idx = FreeSpaceIndex::new();
        idx.add(0, K4).unwrap();
        idx.add(10 * K4, 4 * K4).unwrap();
        assert_eq!(find(&idx, 0, K4, K4, SearchMode::OffsetOnly), Some(0));
        assert_eq!(find(&idx, 0, K4, K4, SearchMode::SizeIndex), Some(10 * K4));
        // Equal sizes: lowest offset first.
        idx.add(20 * K4, 4 * K4).unwrap();
        idx.add(5 * K4, 4 * K4).unwrap();
        assert_eq!(find(&idx, 0, K4, K4, SearchMode::SizeIndex), Some(5 * K4));
        // Hint whose alignment overflows.
        assert_eq!(
            find(&idx, u64::MAX, K4, K4, SearchMode::OffsetOnly),
            Some(0)
        );
        assert_eq!(
            find(&idx, u64::MAX, K4, K4, SearchMode::SizeIndex),
            Some(5 * K4)
        );
        // find does not remove anything.
        assert_eq!(idx.total_free(), 13 * K4);
    }

    #[test]
    fn size_index_visits_few_entries_when_fragmented() {
        let mut idx = FreeSpaceIndex::new();
        let n = 100_000u64;
        for i in 0..n {
            idx.add(i * 2 * K4, K4).unwrap();
        }
        let big = n * 2 * K4;
        idx.add(big, 1 << 30).unwrap();
        assert_eq!(idx.entries(), n as usize + 1);

        let mut off = SearchStats::default();
        let a = idx.find(0, 1 << 20, K4, SearchMode::OffsetOnly, &mut off);
        let mut size = SearchStats::default();
        let b = idx.find(0, 1 << 20, K4, SearchMode::SizeIndex, &mut size);
        assert_eq!(a, Some(big));
        assert_eq!(b, Some(big));
        assert_eq!(off.entries_visited, n + 1);
        assert!(size.entries_visited <= 2, "{size:?}");

        // With a hint in the middle of the fragments: one locality probe, then
        // the largest entry.
        let mut size = SearchStats::default();
        let b = idx.find(n * K4 + 1, 1 << 20, K4, SearchMode::SizeIndex, &mut size);
        assert_eq!(b, Some(big));
        assert!(size.entries_visited <= 2, "{size:?}");

        // A request nothing can satisfy: SizeIndex gives up after one entry.
        let mut off = SearchStats::default();
        let mut size = SearchStats::default();
        assert_eq!(
            idx.find(0, 2 << 30, K4, SearchMode::OffsetOnly, &mut off),
            None
        );
        assert_eq!(
            idx.find(0, 2 << 30, K4, SearchMode::SizeIndex, &mut size),
            None
        );
        assert_eq!(off.entries_visited, n + 1);
        assert_eq!(size.entries_visited, 1);
    }

    // ---- randomized comparison against a bitmap model ----

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        /// Uniform-ish in `0..n` (n > 0).
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Blocks of `bs` bytes starting at `base`; `free[i]` for block i.
    struct Model {
        base: u64,
        bs: u64,
        free: Vec<bool>,
    }

    impl Model {
        fn addr(&self, block: usize) -> u64 {
            self.base + block as u64 * self.bs
        }
        fn all(&self, b: usize, n: usize, want: bool) -> bool {
            self.free[b..b + n].iter().all(|&f| f == want)
        }
        /// Maximal free runs as byte ranges (offset, len).
        fn runs(&self) -> Vec<(u64, u64)> {
            let mut out = Vec::new();
            let mut i = 0;
            while i < self.free.len() {
                if self.free[i] {
                    let s = i;
                    while i < self.free.len() && self.free[i] {
                        i += 1;
                    }
                    out.push((self.addr(s), (i - s) as u64 * self.bs));
                } else {
                    i += 1;
                }
            }
            out
        }
        /// Byte range [s, s + len) is entirely free (block granularity).
        fn bytes_free(&self, s: u64, len: u64) -> bool {
            if s < self.base {
                return false;
            }
            let first = ((s - self.base) / self.bs) as usize;
            let last = ((s + len - self.base).div_ceil(self.bs)) as usize;
            last <= self.free.len() && self.all(first, last - first, true)
        }
    }

    fn model_fit(run: (u64, u64), from: u64, len: u64, align: u64) -> Option<u64> {
        let s = from.max(run.0).next_multiple_of(align);
        (s + len <= run.0 + run.1).then_some(s)
    }

    /// Independent statement of the OffsetOnly semantics over the model's runs.
    fn model_offset_only(runs: &[(u64, u64)], hint: u64, len: u64, align: u64) -> Option<u64> {
        let p = hint.next_multiple_of(align);
        let pass1 = runs
            .iter()
            .filter(|r| r.0 + r.1 > p)
            .find_map(|&r| model_fit(r, p, len, align));
        pass1.or_else(|| {
            runs.iter()
                .filter(|r| r.0 < p)
                .find_map(|&r| model_fit(r, r.0, len, align))
        })
    }

    fn check(idx: &FreeSpaceIndex, m: &Model, rng: &mut XorShift, ctx: &str) {
        let runs = m.runs();
        assert_eq!(entries_of(idx), runs, "{ctx}: entries");
        for b in 0..m.free.len() {
            assert_eq!(idx.is_free(m.addr(b), m.bs), m.free[b], "{ctx}: block {b}");
        }
        assert!(!idx.is_free(m.base - 1, 1));
        assert!(!idx.is_free(m.addr(m.free.len()), 1));
        let total: u64 = m.free.iter().filter(|&&f| f).count() as u64 * m.bs;
        assert_eq!(idx.total_free(), total, "{ctx}: total");
        let largest = runs.iter().map(|r| r.1).max().unwrap_or(0);
        assert_eq!(idx.largest(), largest, "{ctx}: largest");
        assert_eq!(idx.entries(), runs.len(), "{ctx}: entries()");

        // Random range is_free queries (sub-block granularity too).
        let span = m.free.len() as u64 * m.bs;
        for _ in 0..8 {
            let s = m.base + rng.below(span);
            let l = 1 + rng.below(span - (s - m.base));
            assert_eq!(
                idx.is_free(s, l),
                m.bytes_free(s, l),
                "{ctx}: is_free({s}, {l})"
            );
        }

        for _ in 0..6 {
            let len = match rng.below(3) {
                0 => 1 + rng.below(m.bs * 4),
                1 => m.bs * (1 + rng.below(8)),
                _ => 1 + rng.below(largest.max(1) + m.bs),
            };
            let align = match rng.below(5) {
                0 => 1,
                1 => m.bs,
                2 => m.bs * (1 + rng.below(4)),
                3 => 1 + rng.below(3 * m.bs),
                _ => 3,
            };
            let hint = match rng.below(4) {
                0 => 0,
                1 => m.addr(rng.below(m.free.len() as u64) as usize),
                _ => rng.below(m.addr(m.free.len()) + m.bs),
            };
            let exists = runs
                .iter()
                .any(|&r| model_fit(r, r.0, len, align).is_some());
            let p = hint.next_multiple_of(align);
            let hint_fits = m.bytes_free(p, len);
            let q = format!("{ctx}: find(hint {hint}, len {len}, align {align})");

            let mut st = SearchStats::default();
            let a = idx.find(hint, len, align, SearchMode::OffsetOnly, &mut st);
            assert_eq!(
                a,
                model_offset_only(&runs, hint, len, align),
                "{q} OffsetOnly"
            );
            assert!(st.entries_visited <= 2 * runs.len() as u64 + 1, "{q}");

            let mut st = SearchStats::default();
            let b = idx.find(hint, len, align, SearchMode::SizeIndex, &mut st);
            assert!(st.entries_visited <= runs.len() as u64 + 1, "{q}");

            for (r, mode) in [(a, "OffsetOnly"), (b, "SizeIndex")] {
                assert_eq!(r.is_some(), exists, "{q} {mode}: {r:?}");
                if let Some(s) = r {
                    assert_eq!(s % align, 0, "{q} {mode}: unaligned {s}");
                    assert!(m.bytes_free(s, len), "{q} {mode}: {s} not free");
                    assert!(idx.is_free(s, len), "{q} {mode}");
                }
            }
            if hint_fits {
                assert_eq!(a, Some(p), "{q}: OffsetOnly locality");
                if hint != 0 {
                    assert_eq!(b, Some(p), "{q}: SizeIndex locality");
                }
            }
            if hint == 0 {
                if let Some(s) = b {
                    // Largest fitting run, lowest offset among equals.
                    let best = runs
                        .iter()
                        .filter(|&&r| model_fit(r, r.0, len, align).is_some())
                        .max_by_key(|r| (r.1, Reverse(r.0)))
                        .copied();
                    let got = runs.iter().find(|r| r.0 <= s && s < r.0 + r.1).copied();
                    assert_eq!(got, best, "{q}: SizeIndex picks the largest fitting entry");
                    assert_eq!(b, best.and_then(|r| model_fit(r, r.0, len, align)), "{q}");
                }
            }
        }
    }

    fn run_random(seed: u64, base: u64, bs: u64, nblocks: usize, ops: usize) {
        let mut rng = XorShift(seed);
        let mut idx = FreeSpaceIndex::new();
        let mut m = Model {
            base,
            bs,
            free: vec![false; nblocks],
        };
        for op in 0..ops {
            // Pick a range: sometimes fully random, sometimes a sub-range of
            // one uniform run so that the operation is likely to succeed.
            let b = rng.below(nblocks as u64) as usize;
            let n = if rng.below(2) == 0 {
                1 + rng.below((nblocks - b).min(16) as u64) as usize
            } else {
                let state = m.free[b];
                let mut e = b;
                while e < nblocks && m.free[e] == state {
                    e += 1;
                }
                1 + rng.below((e - b) as u64) as usize
            };
            let (off, len) = (m.addr(b), n as u64 * bs);
            // Bias towards adding while mostly used, removing while mostly free.
            let nfree = m.free.iter().filter(|&&f| f).count();
            let do_add = rng.below(nblocks as u64) >= nfree as u64;
            let before = entries_of(&idx);
            if do_add {
                let r = idx.add(off, len);
                if m.all(b, n, false) {
                    assert_eq!(r, Ok(()), "seed {seed} op {op}: add({off}, {len})");
                    m.free[b..b + n].iter_mut().for_each(|f| *f = true);
                } else {
                    assert_eq!(r, Err(FreeSpaceError::Overlap { offset: off, len }));
                    assert_eq!(entries_of(&idx), before);
                }
            } else {
                let r = idx.remove(off, len);
                if m.all(b, n, true) {
                    assert_eq!(r, Ok(()), "seed {seed} op {op}: remove({off}, {len})");
                    m.free[b..b + n].iter_mut().for_each(|f| *f = false);
                } else {
                    assert_eq!(r, Err(FreeSpaceError::NotFree { offset: off, len }));
                    assert_eq!(entries_of(&idx), before);
                }
            }
            let ctx = format!("seed {seed} op {op}");
            check(&idx, &m, &mut rng, &ctx);
        }
    }

    #[test]
    fn randomized_against_bitmap_model() {
        // (seed, base, block size, blocks, ops)
        let cases: [(u64, u64, u64, usize, usize); 6] = [
            (0x9e37_79b9_7f4a_7c15, 1, 1, 97, 4000),
            (0xdead_beef_cafe_f00d, 7, 3, 200, 4000),
            (0x1234_5678_9abc_def1, 1 << 20, K4, 256, 4000),
            (0x0bad_5eed_0bad_5eed, 13 * K4, K4, 300, 3000),
            (0x5151_5151_5151_5151, 1 << 30, 16 * K4, 64, 3000),
            (0x0123_4567_89ab_cdef, 5, 1, 512, 3000),
        ];
        for (seed, base, bs, nblocks, ops) in cases {
            run_random(seed, base, bs, nblocks, ops);
        }
    }
}
