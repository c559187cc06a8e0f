//! Subvolume trees, item by item: every inode against its names (nlink), its directory
//! entries (size, DIR_ITEM and DIR_INDEX for each INODE_REF/INODE_EXTREF and back),
//! its file extents (order, overlap, holes without NO_HOLES, nbytes) and orphan items.
//! Names are matched from compact facts sorted by (parent, child, name), so no
//! inode's items are held.
//!
//! Snapshots share most of their blocks with the tree they were taken of, so each
//! tree is checked bottom-up, one subtree at a time, and what a subtree shared by
//! several parents says is worked out once ([`Summary`], kept in a [`Memo`] until
//! its last parent has used it), as btrfs check does with its shared-node records.
//! What a subtree can settle by itself it settles: every inode whose items all lie
//! inside it (any inode number strictly between its first and last), and every name
//! whose directory and inode both do. The rest (its first and last inode, which may
//! continue in a neighbour, and the names that reach outside) goes up to the parent,
//! which settles what its wider range covers; the root settles everything left. The
//! problems found are the same as a check of each tree item by item, in another
//! order.

use super::blocks::{tree_kind, RefKind, TreeKind, Walk, DATA_LEVEL};
use super::refstore::Ranges;
use super::{Findings, Problem, Progress};
use crate::error::{Error, Result};
use crate::fs::{
    Filesystem, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
use crate::io::root_tree::root_ptr_of;
use crate::tree::ctree::{child_expect, TreeIter};
use crate::tree::tree_checker::Expect;
use crate::tree::{RootPtr, TreeBlock};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::{extref_hash, name_hash};
use ubtrfs_format::items::{
    parse_dir_items, parse_inode_extrefs, parse_inode_refs, FileExtentBody, FileExtentItem,
    InodeItem, RootItem,
};
use ubtrfs_format::key::Key;

/// A directory entry that names a subvolume (location is a ROOT_ITEM key).
#[derive(Clone, Debug)]
pub(super) struct SubvolEntry {
    pub tree: u64,
    pub dirid: u64,
    pub child: u64,
    /// DIR_INDEX: its index; DIR_ITEM: `None`.
    pub index: Option<u64>,
    pub name: Vec<u8>,
}

/// What the fs-roots phase leaves for the checksum and root-ref phases.
#[derive(Default)]
pub(super) struct FsRoots {
    /// Data ranges file extents need checksums for (read with `merged`).
    pub csum_need: Ranges,
    /// Data ranges that must have no checksums (nodatasum files, prealloc), with the
    /// tree and inode that say so; sorted.
    pub csum_forbid: Vec<(u64, u64, u64, u64)>,
    /// Directory entries naming subvolumes.
    pub subvol_entries: Vec<SubvolEntry>,
    /// Subvolume trees read to the end.
    pub checked: BTreeSet<u64>,
}

const FACT_REF: u8 = 0;
const FACT_ITEM: u8 = 1;
const FACT_INDEX: u8 = 2;

/// A fact's `own_ty` when the inode has no (readable) INODE_ITEM.
const NO_INODE: u8 = u8::MAX;

/// One side of a name: an inode's ref, or a directory's DIR_ITEM or DIR_INDEX.
#[derive(Clone, Copy, Debug)]
struct Fact {
    parent: u64,
    child: u64,
    name_h: u64,
    kind: u8,
    index: u64,
    /// A directory entry: the type it names.
    ty: u8,
    /// The type of the inode whose item this is (the child for a ref, the directory
    /// for an entry), or [`NO_INODE`]: a name settled where only one side is seen
    /// needs no lookup of the other's.
    own_ty: u8,
    /// The leaf holding it, for reports.
    block: u64,
}

#[derive(Default)]
struct Ino {
    ino: u64,
    item: Option<InodeItem>,
    block: u64,
    names: u32,
    dir_size: u64,
    nbytes: u64,
    ext_end: u64,
    has_extents: bool,
    has_items: bool,
}

/// Items of one inode inside a subtree: runs of slots of leaves, in key order.
#[derive(Clone, Debug)]
struct Group {
    ino: u64,
    segs: Vec<Seg>,
}

/// Slots `start..end` of the leaf at `bytenr` (read again, by its generation, when
/// the inode is complete).
#[derive(Clone, Copy, Debug)]
struct Seg {
    bytenr: u64,
    generation: u64,
    /// The leaf's first key, so that the read again finds the same block.
    first_key: Option<Key>,
    start: u32,
    end: u32,
}

/// What a subtree says once everything it settles by itself is checked.
#[derive(Clone, Default)]
struct Summary {
    /// The first inode of the subtree (its items may start in the left neighbour);
    /// `None` when the subtree holds no inode items.
    first: Option<Group>,
    /// The last inode, when it is not the first (its items may go on to the right).
    last: Option<Group>,
    /// Problems settled here (their tree is filled in when a tree reports them).
    problems: Vec<Problem>,
    /// Notes, without the tree they are in.
    notes: Vec<String>,
    /// Names not settled yet.
    pending: Vec<Fact>,
    /// Inodes with no name and nlink 0: they need an orphan item.
    unlinked: Vec<(u64, u64)>,
    /// ORPHAN_ITEMs.
    orphans: Vec<u64>,
    /// Entries naming subvolumes (their tree is filled in when reported).
    subvols: Vec<SubvolEntry>,
    /// Data ranges that must have no checksums, with the inode (start, length,
    /// inode): reported for each tree, as the others.
    csum_forbid: Vec<(u64, u64, u64)>,
    /// The last key of the last leaf (an empty leaf: the key its parent gives it):
    /// the key the next subtree's must be above, as a walk item by item requires.
    floor: Option<Key>,
}

impl Summary {
    fn add(&mut self, rule: &'static str, block: u64, key: Key, message: String) {
        self.problems.push(Problem {
            rule,
            tree: None,
            block: Some(block),
            key: Some(key),
            message,
        });
    }

    /// The objectids strictly between these are wholly inside the subtree.
    fn bounds(&self) -> Option<(u64, u64)> {
        let f = self.first.as_ref()?;
        Some((f.ino, self.last.as_ref().map_or(f.ino, |l| l.ino)))
    }
}

/// Summaries of blocks with more than one parent, kept until each parent used one.
struct Memo {
    /// Parents of each block that has several (from the walk's references).
    parents: HashMap<u64, u32>,
    slots: Mutex<HashMap<u64, Slot>>,
    ready: Condvar,
}

enum Slot {
    /// Being worked out by a thread: wait for it.
    Busy,
    /// Worked out; `left` parents have not used it yet.
    Done { s: Arc<Summary>, left: u32 },
}

impl Memo {
    fn new(walk: &Walk) -> Memo {
        let mut parents = HashMap::new();
        let mut cur = (0u64, 0u32);
        // In bytenr order: count each tree block's pointers.
        for r in walk.refs.iter() {
            if r.level == DATA_LEVEL || matches!(r.kind, RefKind::Data(..)) {
                continue;
            }
            if r.bytenr != cur.0 {
                if cur.1 > 1 {
                    parents.insert(cur.0, cur.1);
                }
                cur = (r.bytenr, 0);
            }
            cur.1 = cur.1.saturating_add(r.count);
        }
        if cur.1 > 1 {
            parents.insert(cur.0, cur.1);
        }
        Memo {
            parents,
            slots: Mutex::new(HashMap::new()),
            ready: Condvar::new(),
        }
    }

    /// The summary of `bytenr`, worked out by `make` unless another parent's walk
    /// did (or is doing) it. Waiting cannot deadlock: the caller has verified the
    /// block against its parent's pointer (level one below the parent's), so a
    /// thread only waits for a block of a lower level than every block it is
    /// working out.
    fn get(
        &self,
        bytenr: u64,
        use_memo: bool,
        make: impl FnOnce() -> Result<Summary>,
    ) -> Result<Arc<Summary>> {
        let Some(&parents) = self.parents.get(&bytenr).filter(|_| use_memo) else {
            return make().map(Arc::new);
        };
        let lock = || self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut slots = lock();
        loop {
            match slots.get_mut(&bytenr) {
                None => break,
                Some(Slot::Busy) => {
                    slots = self.ready.wait(slots).unwrap_or_else(|p| p.into_inner());
                }
                Some(Slot::Done { s, left }) => {
                    let s = s.clone();
                    *left -= 1;
                    if *left == 0 {
                        slots.remove(&bytenr);
                    }
                    return Ok(s);
                }
            }
        }
        slots.insert(bytenr, Slot::Busy);
        drop(slots);
        // Should `make` panic (a bug), the slot must not stay Busy: the threads
        // waiting for it would wait forever, and the scope that joins them with it.
        let guard = BusyGuard { memo: self, bytenr };
        let made = make().map(Arc::new);
        std::mem::forget(guard);
        let mut slots = lock();
        match &made {
            Ok(s) if parents > 1 => {
                slots.insert(
                    bytenr,
                    Slot::Done {
                        s: s.clone(),
                        left: parents - 1,
                    },
                );
            }
            _ => {
                slots.remove(&bytenr);
            }
        }
        drop(slots);
        self.ready.notify_all();
        made
    }
}

/// Frees a Busy slot when the thread working it out unwinds.
struct BusyGuard<'a> {
    memo: &'a Memo,
    bytenr: u64,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let mut slots = self.memo.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.remove(&self.bytenr);
        drop(slots);
        self.memo.ready.notify_all();
    }
}

/// A 64-bit hash of a name, to match the three sides of a name without keeping it
/// (xxhash64: several times faster than the std hasher on short names).
fn hash_name(name: &[u8]) -> u64 {
    ubtrfs_format::csum::xxh64(name)
}

pub(super) fn file_type(mode: u32) -> u8 {
    match mode & S_IFMT {
        S_IFREG => FT_REG_FILE,
        S_IFDIR => FT_DIR,
        S_IFLNK => FT_SYMLINK,
        S_IFCHR => FT_CHRDEV,
        S_IFBLK => FT_BLKDEV,
        S_IFIFO => FT_FIFO,
        S_IFSOCK => FT_SOCK,
        _ => FT_UNKNOWN,
    }
}

/// Checks every live subvolume tree. The trees are checked on up to
/// [`FS_ROOT_THREADS_MAX`] threads (the calling one included, which alone reports
/// progress), sharing one [`Memo`]; each tree's findings are kept apart and merged in
/// tree order, so the report is the same however the work was shared.
pub(super) fn check_fs_roots(
    fs: &Filesystem,
    walk: &Walk,
    item_by_item: bool,
    ranges_mem_bytes: usize,
    f: &mut Findings,
    progress: Progress<'_>,
) -> Result<FsRoots> {
    let trees: Vec<(u64, &RootItem)> = walk
        .roots
        .iter()
        .filter(|(k, r)| {
            tree_kind(k.objectid) == TreeKind::Fs
                && k.objectid != TREE_RELOC_OBJECTID
                && r.refs != 0
        })
        .map(|(k, r)| (k.objectid, r))
        .collect();
    let items = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    let memo = Memo::new(walk);
    let need = Mutex::new(Ranges::new(ranges_mem_bytes));
    let threads = if item_by_item {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, FS_ROOT_THREADS_MAX)
    };
    // Each worker takes the next tree until none is left.
    let work = |report: &mut dyn FnMut(u64)| {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(id, r)) = trees.get(i) else {
                return done;
            };
            let tc = (&memo, &need, item_by_item);
            done.push((i, check_tree(fs, id, r, tc, &items, report)));
        }
    };
    let mut results = std::thread::scope(|sc| {
        let helpers: Vec<_> = (1..threads)
            .map(|_| sc.spawn(|| work(&mut |_| {})))
            .collect();
        let mut all = work(&mut |n| progress(4, n));
        for h in helpers {
            // A worker only panics on a bug; its trees are then reported unread.
            if let Ok(v) = h.join() {
                all.extend(v);
            }
        }
        all
    });
    results.sort_unstable_by_key(|(i, _)| *i);
    let mut out = FsRoots::default();
    let mut seen = BTreeSet::new();
    for (i, (part, findings)) in results {
        seen.insert(i);
        f.absorb(findings);
        out.csum_forbid.extend(part.csum_forbid);
        out.subvol_entries.extend(part.subvol_entries);
        out.checked.extend(part.checked);
    }
    for (i, &(id, _)) in trees.iter().enumerate() {
        if !seen.contains(&i) {
            f.add(
                "block-structure",
                Some(id),
                None,
                None,
                "internal: the tree's check did not finish".into(),
            );
        }
    }
    out.csum_need = need.into_inner().unwrap_or_else(|p| p.into_inner());
    out.csum_need.finish()?;
    out.csum_forbid.sort_unstable();
    out.csum_forbid.dedup();
    Ok(out)
}

/// Ranges needing checksums a tree keeps before handing them to the shared store.
const NEED_BATCH: usize = 1 << 16;

/// Most threads the subvolume trees are checked on.
const FS_ROOT_THREADS_MAX: usize = 4;

/// One subvolume tree, with findings of its own.
fn check_tree(
    fs: &Filesystem,
    id: u64,
    r: &RootItem,
    (memo, need, item_by_item): (&Memo, &Mutex<Ranges>, bool),
    items: &AtomicU64,
    report: &mut dyn FnMut(u64),
) -> (FsRoots, Findings) {
    let mut f = Findings::new();
    let mut out = FsRoots::default();
    let ptr = root_ptr_of(id, r);
    let mut t = TreeCheck {
        fs,
        ptr,
        root_dirid: r.root_dirid,
        no_holes: fs.info.sb.incompat_flags & FEATURE_INCOMPAT_NO_HOLES != 0,
        memo,
        items,
        report,
        need: Vec::new(),
        need_sink: need,
    };
    let root = Expect {
        level: Some(ptr.level),
        generation: Some(ptr.generation),
        first_key: None,
    };
    // The root read first, so that an error in it names the tree as elsewhere.
    let read = if item_by_item {
        t.stream()
    } else {
        crate::tree::ctree::read_root(&fs.info, &ptr)
            .and_then(|_| t.summary(ptr.bytenr, &root))
            .and_then(|s| t.settle_root(s))
    };
    t.flush_need();
    match read {
        Ok(s) => {
            for p in s.problems {
                f.add(p.rule, Some(id), p.block, p.key, p.message);
            }
            for n in s.notes {
                f.note(format!("tree {} {n}", id as i64));
            }
            let orphans: BTreeSet<u64> = s.orphans.into_iter().collect();
            for (ino, block) in s.unlinked {
                if !orphans.contains(&ino) {
                    f.add(
                        "orphan",
                        Some(id),
                        Some(block),
                        Some(Key::new(ino, INODE_ITEM_KEY, 0)),
                        format!("inode {ino} has no name and no orphan item"),
                    );
                }
            }
            out.csum_forbid
                .extend(s.csum_forbid.iter().map(|&(st, l, ino)| (st, l, id, ino)));
            for mut e in s.subvols {
                e.tree = id;
                out.subvol_entries.push(e);
            }
            out.checked.insert(id);
        }
        Err(e) => f.add(
            "block-structure",
            Some(id),
            None,
            None,
            format!("the tree cannot be read to its end: {e}"),
        ),
    }
    (out, f)
}

/// Sorts and merges overlapping or touching ranges.
pub(super) fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, l) in v {
        match out.last_mut() {
            Some(p) if s <= p.0.saturating_add(p.1) => p.1 = p.1.max(s.saturating_add(l) - p.0),
            _ => out.push((s, l)),
        }
    }
    out
}

struct TreeCheck<'a> {
    fs: &'a Filesystem,
    ptr: RootPtr,
    root_dirid: u64,
    no_holes: bool,
    memo: &'a Memo,
    items: &'a AtomicU64,
    report: &'a mut dyn FnMut(u64),
    /// Ranges that need checksums, on their way to `need_sink`: a subtree's are
    /// needed once, whichever tree meets it first.
    need: Vec<(u64, u64)>,
    need_sink: &'a Mutex<Ranges>,
}

impl TreeCheck<'_> {
    /// Hands the ranges needing checksums to the shared store, merged first
    /// (snapshots repeat the same extents).
    fn flush_need(&mut self) {
        let v = merge(std::mem::take(&mut self.need));
        let mut sink = self.need_sink.lock().unwrap_or_else(|p| p.into_inner());
        for r in v {
            sink.push(r);
        }
    }

    /// The summary of the subtree at `bytenr`, from the memo when it has one.
    fn summary(&mut self, bytenr: u64, expect: &Expect) -> Result<Arc<Summary>> {
        // Read (and verified against the parent's pointer) even when the memo has
        // it: a pointer that does not match the block is an error here as in a
        // walk item by item, and a hostile pointer to an ancestor is refused before
        // the memo could wait on that ancestor's summary.
        let b = self.fs.info.read_tree_block(bytenr, expect)?;
        let memo = self.memo;
        // A summary depends on the tree's root directory (its ".." names itself):
        // one of another root directory than every subvolume's is not shared.
        let memo_ok = self.root_dirid == FIRST_FREE_OBJECTID;
        memo.get(bytenr, memo_ok, || {
            if b.level() == 0 {
                return Ok(self.leaf(&b, expect));
            }
            let mut acc = Summary::default();
            for slot in 0..b.nritems() {
                let (child, e) = child_expect(&b, slot)?;
                // Keys must grow from subtree to subtree (TreeIter's rule, with its
                // words): overlapping siblings would otherwise split an inode, and
                // a block linked from several nodes would be counted again and
                // again, exponentially in the tree's height.
                if let (Some(fl), Some(k)) = (acc.floor, e.first_key) {
                    if slot > 0 && k <= fl {
                        return Err(Error::corrupt(format!(
                            "tree block {}: slot {slot} key {k} does not follow {fl} (a block reached twice?)",
                            b.bytenr
                        )));
                    }
                }
                let s = self.summary(child, &e)?;
                self.append(&mut acc, &s)?;
            }
            let bounds = acc.bounds();
            self.settle_names(&mut acc, bounds);
            Ok(acc)
        })
    }

    /// A leaf: every inode but its first and last checked now.
    fn leaf(&mut self, b: &TreeBlock, expect: &Expect) -> Summary {
        let v = b.view();
        let n = v.nritems() as usize;
        let done = self.items.fetch_add(n as u64, Ordering::Relaxed);
        if done / 65536 != (done + n as u64) / 65536 {
            (self.report)(done + n as u64);
        }
        let mut s = Summary {
            floor: match n {
                0 => expect.first_key,
                n => v.item_key(n - 1).ok(),
            },
            ..Summary::default()
        };
        // Runs of slots by inode (inode numbers are one contiguous part of the key
        // space: the other objectids sort before or after all of them).
        let mut runs: Vec<(u64, u32, u32)> = Vec::new();
        for i in 0..n {
            let Ok(k) = v.item_key(i) else { continue };
            if k.objectid == ORPHAN_OBJECTID && k.ty == ORPHAN_ITEM_KEY {
                s.orphans.push(k.offset);
                continue;
            }
            if !(FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&k.objectid) {
                continue;
            }
            match runs.last_mut() {
                Some(r) if r.0 == k.objectid && r.2 == i as u32 => r.2 += 1,
                _ => runs.push((k.objectid, i as u32, i as u32 + 1)),
            }
        }
        let seg = |r: &(u64, u32, u32)| Group {
            ino: r.0,
            segs: vec![Seg {
                bytenr: b.bytenr,
                generation: v.generation(),
                first_key: v.item_key(0).ok(),
                start: r.1,
                end: r.2,
            }],
        };
        let Some(first) = runs.first() else {
            return s;
        };
        s.first = Some(seg(first));
        if runs.len() > 1 {
            s.last = runs.last().map(seg);
        }
        for r in runs.iter().skip(1).take(runs.len().saturating_sub(2)) {
            let mut cur = Ino {
                ino: r.0,
                block: b.bytenr,
                ..Ino::default()
            };
            for i in r.1..r.2 {
                let i = i as usize;
                if let (Ok(k), Ok(d)) = (v.item_key(i), v.item_data(i)) {
                    self.item(&mut s, &mut cur, &k, d, b.bytenr);
                }
            }
            self.finish(&mut s, cur);
        }
        let bounds = s.bounds();
        self.settle_names(&mut s, bounds);
        s
    }

    /// Adds the next subtree to the right of `acc`: an inode split between them is
    /// joined, and an inode that now has items of other inodes on both sides is
    /// complete and checked.
    fn append(&mut self, acc: &mut Summary, s: &Summary) -> Result<()> {
        acc.problems.extend_from_slice(&s.problems);
        acc.notes.extend_from_slice(&s.notes);
        acc.pending.extend_from_slice(&s.pending);
        acc.unlinked.extend_from_slice(&s.unlinked);
        acc.orphans.extend_from_slice(&s.orphans);
        acc.subvols.extend_from_slice(&s.subvols);
        acc.csum_forbid.extend_from_slice(&s.csum_forbid);
        acc.floor = s.floor;
        let Some(sf) = &s.first else {
            return Ok(());
        };
        if acc.first.is_none() {
            acc.first = s.first.clone();
            acc.last = s.last.clone();
            return Ok(());
        }
        let open_ino = acc
            .last
            .as_ref()
            .or(acc.first.as_ref())
            .map_or(0, |g| g.ino);
        if open_ino == sf.ino {
            // One inode across the seam.
            if let Some(open) = acc.last.as_mut().or(acc.first.as_mut()) {
                open.segs.extend_from_slice(&sf.segs);
            }
            if s.last.is_some() {
                if let Some(done) = acc.last.take() {
                    self.complete(acc, &done)?;
                }
                acc.last = s.last.clone();
            }
        } else {
            if let Some(done) = acc.last.take() {
                self.complete(acc, &done)?;
            }
            if s.last.is_some() {
                self.complete(acc, sf)?;
                acc.last = s.last.clone();
            } else {
                acc.last = Some(sf.clone());
            }
        }
        Ok(())
    }

    /// Checks an inode whose items are all known, reading them from their leaves.
    fn complete(&mut self, acc: &mut Summary, g: &Group) -> Result<()> {
        let mut cur = Ino {
            ino: g.ino,
            ..Ino::default()
        };
        for seg in &g.segs {
            let b = self.fs.info.read_tree_block(
                seg.bytenr,
                &Expect {
                    level: Some(0),
                    generation: Some(seg.generation),
                    first_key: seg.first_key,
                },
            )?;
            let v = b.view();
            if cur.block == 0 {
                cur.block = b.bytenr;
            }
            for i in seg.start..seg.end {
                let i = i as usize;
                if let (Ok(k), Ok(d)) = (v.item_key(i), v.item_data(i)) {
                    self.item(acc, &mut cur, &k, d, b.bytenr);
                }
            }
        }
        self.finish(acc, cur);
        Ok(())
    }

    /// The whole tree item by item, in key order: each inode checked when the
    /// next begins, every name settled at the end.
    fn stream(&mut self) -> Result<Summary> {
        let mut s = Summary::default();
        let mut cur = Ino::default();
        let fs = self.fs;
        let ptr = self.ptr;
        for item in TreeIter::new(&fs.info, &ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            let n = self.items.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(65536) {
                (self.report)(n);
            }
            if k.objectid == ORPHAN_OBJECTID && k.ty == ORPHAN_ITEM_KEY {
                s.orphans.push(k.offset);
                continue;
            }
            if !(FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&k.objectid) {
                continue;
            }
            if k.objectid != cur.ino {
                let done = std::mem::take(&mut cur);
                self.finish(&mut s, done);
                cur.ino = k.objectid;
                cur.block = item.block.bytenr;
            }
            self.item(&mut s, &mut cur, &k, item.data(), item.block.bytenr);
        }
        self.finish(&mut s, cur);
        self.settle_names(&mut s, None);
        Ok(s)
    }

    /// The whole tree: its first and last inodes are complete, and every name left
    /// is settled.
    fn settle_root(&mut self, s: Arc<Summary>) -> Result<Summary> {
        let mut s = Arc::try_unwrap(s).unwrap_or_else(|shared| (*shared).clone());
        if let Some(g) = s.first.take() {
            self.complete(&mut s, &g)?;
        }
        if let Some(g) = s.last.take() {
            self.complete(&mut s, &g)?;
        }
        self.settle_names(&mut s, None);
        Ok(s)
    }

    fn item(&mut self, s: &mut Summary, cur: &mut Ino, k: &Key, data: &[u8], block: u64) {
        let ino = k.objectid;
        if k.ty != INODE_ITEM_KEY {
            cur.has_items = true;
        }
        let own_ty = cur.item.as_ref().map_or(NO_INODE, |i| file_type(i.mode));
        match k.ty {
            INODE_ITEM_KEY => {
                if let Ok(i) = InodeItem::parse(data) {
                    cur.block = block;
                    cur.item = Some(i);
                }
            }
            INODE_REF_KEY | INODE_EXTREF_KEY => {
                let refs = if k.ty == INODE_REF_KEY {
                    parse_inode_refs(k.offset, data)
                } else {
                    parse_inode_extrefs(data)
                };
                for r in refs.unwrap_or_default() {
                    cur.names += 1;
                    if k.ty == INODE_EXTREF_KEY && extref_hash(r.parent, &r.name) != k.offset {
                        s.add(
                            "inode-ref",
                            block,
                            *k,
                            format!("extref name hash does not match parent {} name", r.parent),
                        );
                    }
                    // The root directory's ".." names itself; it has no entry.
                    if r.parent == ino && ino == self.root_dirid {
                        continue;
                    }
                    s.pending.push(Fact {
                        parent: r.parent,
                        child: ino,
                        name_h: hash_name(&r.name),
                        kind: FACT_REF,
                        index: r.index,
                        ty: own_ty,
                        own_ty,
                        block,
                    });
                }
            }
            DIR_ITEM_KEY | DIR_INDEX_KEY => {
                let entries = parse_dir_items(data).unwrap_or_default();
                if k.ty == DIR_INDEX_KEY && entries.len() != 1 {
                    s.add(
                        "dir-item",
                        block,
                        *k,
                        format!("DIR_INDEX holds {} entries", entries.len()),
                    );
                }
                for e in entries {
                    cur.dir_size += e.name.len() as u64;
                    if k.ty == DIR_ITEM_KEY && name_hash(&e.name) != k.offset {
                        s.add(
                            "dir-item",
                            block,
                            *k,
                            "name does not hash to the key offset".into(),
                        );
                    }
                    let index = (k.ty == DIR_INDEX_KEY).then_some(k.offset);
                    match e.location.ty {
                        INODE_ITEM_KEY => s.pending.push(Fact {
                            parent: ino,
                            child: e.location.objectid,
                            name_h: hash_name(&e.name),
                            kind: if index.is_some() {
                                FACT_INDEX
                            } else {
                                FACT_ITEM
                            },
                            index: index.unwrap_or(u64::MAX),
                            ty: e.ty,
                            own_ty,
                            block,
                        }),
                        ROOT_ITEM_KEY => s.subvols.push(SubvolEntry {
                            tree: 0,
                            dirid: ino,
                            child: e.location.objectid,
                            index,
                            name: e.name,
                        }),
                        t => s.add(
                            "dir-item",
                            block,
                            *k,
                            format!("entry points to a key of type {t}"),
                        ),
                    }
                }
            }
            EXTENT_DATA_KEY => self.file_extent(s, cur, k, data, block),
            _ => {}
        }
    }

    fn file_extent(&mut self, s: &mut Summary, cur: &mut Ino, k: &Key, data: &[u8], block: u64) {
        let Ok(fe) = FileExtentItem::parse(data) else {
            return;
        };
        let (end, nbytes) = match &fe.body {
            FileExtentBody::Inline { .. } => (k.offset.saturating_add(fe.ram_bytes), fe.ram_bytes),
            FileExtentBody::Regular {
                disk_bytenr,
                num_bytes,
                ..
            } => (
                k.offset.saturating_add(*num_bytes),
                if *disk_bytenr != 0 { *num_bytes } else { 0 },
            ),
        };
        if cur.has_extents && k.offset < cur.ext_end {
            s.add(
                "file-extent",
                block,
                *k,
                format!(
                    "overlaps the previous extent of inode {} (ends at {})",
                    k.objectid, cur.ext_end
                ),
            );
        } else if !self.no_holes && k.offset > cur.ext_end {
            // The kernel writes hole items without NO_HOLES, but reads a gap as a
            // hole all the same, and btrfs check passes it: a note, not a problem.
            s.notes.push(format!(
                "block {block} {k}: inode {}: no extent for {}..{} and the \
                 filesystem has no NO_HOLES (read as a hole)",
                k.objectid, cur.ext_end, k.offset
            ));
        }
        cur.has_extents = true;
        cur.ext_end = cur.ext_end.max(end);
        cur.nbytes = cur.nbytes.saturating_add(nbytes);
        if let FileExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } = fe.body
        {
            if disk_bytenr == 0 || num_bytes == 0 {
                return;
            }
            let flags = cur.item.as_ref().map_or(0, |i| i.flags);
            let range = if fe.compression != 0 {
                (disk_bytenr, disk_num_bytes)
            } else {
                (disk_bytenr.saturating_add(offset), num_bytes)
            };
            if fe.ty == FILE_EXTENT_PREALLOC || flags & INODE_NODATASUM != 0 {
                s.csum_forbid.push((range.0, range.1, k.objectid));
            } else {
                self.need.push(range);
                if self.need.len() >= NEED_BATCH {
                    self.flush_need();
                }
            }
        }
    }

    fn finish(&mut self, s: &mut Summary, cur: Ino) {
        if cur.ino == 0 {
            return;
        }
        let Some(i) = cur.item else {
            if cur.has_items {
                s.add(
                    "inode-missing",
                    cur.block,
                    Key::new(cur.ino, INODE_ITEM_KEY, 0),
                    format!("inode {} has items but no INODE_ITEM", cur.ino),
                );
            }
            return;
        };
        let key = Key::new(cur.ino, INODE_ITEM_KEY, 0);
        if i.nlink != cur.names {
            if cur.names == 0 && i.nlink == 0 {
                s.unlinked.push((cur.ino, cur.block));
            } else {
                s.add(
                    "inode-nlink",
                    cur.block,
                    key,
                    format!(
                        "inode {} has nlink {} but {} names",
                        cur.ino, i.nlink, cur.names
                    ),
                );
            }
        } else if cur.names == 0 {
            s.unlinked.push((cur.ino, cur.block));
        }
        let ft = file_type(i.mode);
        if ft == FT_DIR && i.size != cur.dir_size {
            s.add(
                "inode-isize",
                cur.block,
                key,
                format!(
                    "directory {} has size {} but its entries' names add up to {}",
                    cur.ino, i.size, cur.dir_size
                ),
            );
        }
        if ft != FT_DIR && cur.dir_size > 0 {
            s.add(
                "dir-item",
                cur.block,
                key,
                format!(
                    "inode {} is not a directory but has directory entries",
                    cur.ino
                ),
            );
        }
        // mkfs gives the root directory nbytes of one node; directories own no
        // extents, so only files and symlinks are compared (as btrfs check does).
        if ft != FT_DIR && i.nbytes != cur.nbytes {
            s.add(
                "inode-nbytes",
                cur.block,
                key,
                format!(
                    "inode {} has nbytes {} but its extents add up to {}",
                    cur.ino, i.nbytes, cur.nbytes
                ),
            );
        }
        if cur.has_extents && ft != FT_REG_FILE && ft != FT_SYMLINK {
            s.add(
                "file-extent",
                cur.block,
                key,
                format!("inode {} has file extents but is not a file", cur.ino),
            );
        }
    }

    /// The type of inode `ino`'s INODE_ITEM, looked up in the tree (only for a name
    /// one side of which is missing: the facts carry the types otherwise).
    fn inode_type(&self, ino: u64) -> Option<u8> {
        let k = Key::new(ino, INODE_ITEM_KEY, 0);
        let mut it = TreeIter::new(&self.fs.info, &self.ptr, k, k).ok()?;
        let item = it.next()?.ok()?;
        InodeItem::parse(item.data())
            .ok()
            .map(|i| file_type(i.mode))
    }

    /// Settles every name whose directory and inode both lie strictly inside
    /// `bounds` (all of them with `None`): all three sides of such a name are in
    /// `s.pending` by now. The others stay pending.
    fn settle_names(&mut self, s: &mut Summary, bounds: Option<(u64, u64)>) {
        if s.pending.is_empty() {
            return;
        }
        let inside = |x: u64| bounds.is_none_or(|(lo, hi)| lo < x && x < hi);
        let mut facts = std::mem::take(&mut s.pending);
        // A stable sort: the facts are the children's sorted leftovers one after
        // the other, and it merges such runs instead of sorting from scratch.
        facts.sort_by_key(|x| (x.parent, x.child, x.name_h, x.kind, x.index));
        let mut keep = Vec::new();
        let mut i = 0;
        while i < facts.len() {
            let a = facts[i];
            let mut j = i;
            while j < facts.len()
                && (facts[j].parent, facts[j].child, facts[j].name_h)
                    == (a.parent, a.child, a.name_h)
            {
                j += 1;
            }
            let g = &facts[i..j];
            i = j;
            if inside(a.parent) && inside(a.child) {
                self.check_name(s, g);
            } else {
                keep.extend_from_slice(g);
            }
        }
        s.pending = keep;
    }

    /// One name seen from every side it has: the inode's ref, the DIR_ITEM, the
    /// DIR_INDEX.
    fn check_name(&self, s: &mut Summary, g: &[Fact]) {
        let a = g[0];
        // The group is sorted by side (ref, DIR_ITEM, DIR_INDEX) after the name.
        let i_item = g.partition_point(|x| x.kind < FACT_ITEM);
        let i_index = g.partition_point(|x| x.kind < FACT_INDEX);
        let (refs, items, idxs) = (&g[..i_item], &g[i_item..i_index], &g[i_index..]);
        let known = |t: u8| (t != NO_INODE).then_some(t);
        let child_ty = match refs.first() {
            Some(r) => known(r.own_ty),
            None => self.inode_type(a.child),
        };
        if let Some(r) = refs.first() {
            let rkey = Key::new(a.child, INODE_REF_KEY, a.parent);
            let parent_ty = match items.first().or(idxs.first()) {
                Some(d) => known(d.own_ty),
                None => self.inode_type(a.parent),
            };
            match parent_ty {
                Some(FT_DIR) => {}
                Some(_) => s.add(
                    "inode-ref",
                    r.block,
                    rkey,
                    format!(
                        "inode {} is named in {}, which is not a directory",
                        a.child, a.parent
                    ),
                ),
                None => s.add(
                    "inode-ref",
                    r.block,
                    rkey,
                    format!(
                        "inode {} is named in {}, which does not exist",
                        a.child, a.parent
                    ),
                ),
            }
            for r in refs {
                if !idxs.iter().any(|x| x.index == r.index) {
                    s.add(
                        "inode-ref",
                        r.block,
                        rkey,
                        format!(
                            "inode {}'s name in {} (index {}) has no DIR_INDEX",
                            a.child, a.parent, r.index
                        ),
                    );
                }
            }
            if items.is_empty() {
                s.add(
                    "inode-ref",
                    r.block,
                    rkey,
                    format!("inode {}'s name in {} has no DIR_ITEM", a.child, a.parent),
                );
            }
        }
        for d in items.iter().chain(idxs.iter()) {
            let (ty, off) = if d.kind == FACT_INDEX {
                (DIR_INDEX_KEY, d.index)
            } else {
                (DIR_ITEM_KEY, 0)
            };
            let dkey = Key::new(a.parent, ty, off);
            let what = if d.kind == FACT_INDEX {
                "DIR_INDEX"
            } else {
                "DIR_ITEM"
            };
            match child_ty {
                None => s.add(
                    "dir-item",
                    d.block,
                    dkey,
                    format!(
                        "{what} in {} points to inode {}, which does not exist",
                        a.parent, a.child
                    ),
                ),
                Some(ct) => {
                    if refs.is_empty() {
                        s.add(
                            "dir-item",
                            d.block,
                            dkey,
                            format!(
                                "{what} in {} names inode {}, which has no INODE_REF for it",
                                a.parent, a.child
                            ),
                        );
                    } else if d.kind == FACT_INDEX && !refs.iter().any(|r| r.index == d.index) {
                        s.add(
                            "dir-item",
                            d.block,
                            dkey,
                            format!(
                                "DIR_INDEX {} in {} names inode {}, whose ref says another index",
                                d.index, a.parent, a.child
                            ),
                        );
                    }
                    if d.ty != ct {
                        s.add(
                            "dir-item",
                            d.block,
                            dkey,
                            format!(
                                "{what} in {} says type {} for inode {}, which is of type {ct}",
                                a.parent, d.ty, a.child
                            ),
                        );
                    }
                }
            }
        }
    }
}
