//! Writing the tree log (the kernel's btrfs_log_inode and btrfs_sync_log): an fsync
//! makes one inode durable without committing the transaction.
//!
//! [`TreeLog`] keeps, for the running transaction, one log tree per subvolume (the
//! items the fsyncs logged, in memory, with the leaf layout last written) and the log
//! root tree over them. An fsync:
//! 1. copies the inode's items from the subvolume tree into its log tree: the inode
//!    item, its names (INODE_REF/EXTREF), xattrs, file extents (holes made explicit,
//!    as the kernel's btrfs_log_holes does with NO_HOLES) and the checksums of the
//!    extents written in this transaction (EXTENT_CSUM items); a file logged before
//!    in the transaction copies only its extents from the first one changed since
//!    (`Trans::file_extent_changes`). A directory made in this transaction logs every
//!    DIR_INDEX item, copied a leaf at a time (seed 004), and a DIR_LOG_INDEX range
//!    saying the log has every name; one in the last commit logs only the names
//!    changed since, with ranges covering them (from `Trans::dir_index_changes`,
//!    else its leaves compared with the commit's); both log the inodes of names made in this
//!    transaction. Directories made in this transaction on the way up to the
//!    subvolume root are logged too (inode and name), so a replay can link the inode;
//! 2. logs again every inode logged earlier in this transaction that has changed
//!    since (so the log stays one consistent picture of what was fsynced);
//! 3. writes the log leaves that changed, the nodes above them and the log root tree,
//!    into metadata space no committed tree uses; flushes; writes the primary
//!    superblock (the last commit's, plus `log_root`) and flushes again.
//!
//! The log's blocks are in no extent tree. They stay out of the free space until the
//! next commit is durable (`Allocator::log_blocks`); a block a later fsync replaces
//! is freed as soon as the superblock naming the new log is durable.
//!
//! Where a log could not say what the fsync must make durable, the fsync commits the
//! transaction instead, as the kernel falls back to a full commit, and counts why
//! ([`LogStats::full_commits`]): an old parent directory removed, a directory
//! logged earlier in the transaction removed, a subvolume entry in a directory to log,
//! a subvolume's entry renamed or removed in this transaction, a directory holding a
//! subvolume's entry moved away from a logged name, a chunk allocated in this transaction
//! (the log could not be read before the commit), metadata space short (known
//! before the children of a directory are copied: their items' lower bound against
//! the free metadata space), items this log does not copy (verity), or a log past
//! its size limit.
//!
//! Owns: the in-memory log trees and writing them. May use: `transaction` (the
//! handle, its commit), `alloc` (log blocks), `io`, `tree`.

use crate::error::{Error, Result};
use crate::io::disk_io::read_best_super;
use crate::transaction::Trans;
use crate::tree::block_edit as eb;
use crate::tree::ctree::{lookup_exact, lookup_prev, next_leaf, search_slot};
use crate::tree::tree_checker::{check_block, check_header, Expect};
use crate::tree::{RootPtr, TreeBlock};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{parse_dir_items, FileExtentBody, FileExtentItem, InodeItem, RootItem};
use ubtrfs_format::key::Key;
use ubtrfs_format::superblock::SuperBlock;

/// Most items the log trees of one transaction hold before fsyncs commit instead
/// (a bound on the memory the log keeps: about 200 MiB at the largest items).
pub const LOG_ITEMS_MAX: usize = 4_000_000;

/// Most inodes one fsync logs (the inode, new ancestors, new entries of a directory
/// and their trees) before it commits instead.
const INODES_PER_FSYNC_MAX: usize = 2_000_000;

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

/// Counters of the tree log over its life (all transactions).
#[derive(Debug, Default, Clone)]
pub struct LogStats {
    /// fsync/fdatasync calls.
    pub fsyncs: u64,
    /// fsyncs answered by writing the log.
    pub logged: u64,
    /// fsyncs answered by a full commit, and why.
    pub full_commits: u64,
    /// Full commits by reason.
    pub commit_reasons: BTreeMap<&'static str, u64>,
    /// Inodes copied into a log (each time one is logged).
    pub inodes_logged: u64,
    /// Of those, files logged again through the fast path (only their extents from
    /// the first one changed since).
    pub fast_path: u64,
    /// Items written into the log trees (unchanged items are not counted).
    pub items_logged: u64,
    /// Searches of a subvolume tree made to copy items (one per inode range).
    pub searches: u64,
    /// Subvolume leaves whose items were copied in one batch (seed 004's "one data
    /// move per leaf").
    pub leaf_copies: u64,
    /// Log tree blocks written.
    pub blocks_written: u64,
    /// Bytes written to the devices by log syncs (blocks and superblocks).
    pub bytes_written: u64,
}

/// What an fsync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    /// The inode's changes went to the tree log.
    Logged,
    /// The transaction was committed instead (the reason).
    Committed(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Everything about the inode.
    Full,
    /// The inode item and its names only (a directory made in this transaction on
    /// the way to a logged inode).
    Exists,
}

#[derive(Debug, Clone)]
struct Logged {
    mode: Mode,
    /// The INODE_ITEM as logged: a different one later means log it again.
    inode: Vec<u8>,
    /// A regular file: logged again, only its extents from the first one changed
    /// since are copied (the fast path).
    reg: bool,
}

/// One log tree in memory: its items and the leaves last written.
#[derive(Debug, Default)]
struct LogBuf {
    items: BTreeMap<Key, Vec<u8>>,
    /// The leaf layout: each leaf holds the keys from its partition key up to the
    /// next one's; the value is the block last written for it (0: none yet).
    leaves: BTreeMap<Key, u64>,
    /// Partition keys of leaves whose items changed since last written.
    dirty: BTreeSet<Key>,
    /// Nodes last written, by their pointers: reused while unchanged.
    nodes: HashMap<Vec<(Key, u64)>, u64>,
    /// The root block last written: (bytenr, level).
    root: Option<(u64, u8)>,
    /// Item bytes (headers and data) stored anew over the buffer's life: what
    /// leaves to be written hold (an item stored again unchanged is not counted).
    stored_bytes: u64,
}

impl LogBuf {
    fn leaf_of(&mut self, k: &Key) -> Key {
        if self.leaves.is_empty() {
            self.leaves.insert(Key::MIN, 0);
        }
        self.leaves
            .range(..=*k)
            .next_back()
            .map_or(Key::MIN, |(p, _)| *p)
    }

    /// The partition holding `k` and where the next one starts (None: the last).
    fn partition_of(&mut self, k: &Key) -> (Key, Option<Key>) {
        let part = self.leaf_of(k);
        let next = self
            .leaves
            .range((std::ops::Bound::Excluded(part), std::ops::Bound::Unbounded))
            .next()
            .map(|(p, _)| *p);
        (part, next)
    }

    fn set(&mut self, k: Key, v: Vec<u8>) -> bool {
        if !self.put(k, v) {
            return false;
        }
        let l = self.leaf_of(&k);
        self.dirty.insert(l);
        true
    }

    /// Stores an item without marking its leaf: false when it is there already.
    fn put(&mut self, k: Key, v: Vec<u8>) -> bool {
        use std::collections::btree_map::Entry;
        let bytes = (ITEM_SIZE + v.len()) as u64;
        match self.items.entry(k) {
            Entry::Occupied(mut o) => {
                if *o.get() == v {
                    return false;
                }
                o.insert(v);
            }
            Entry::Vacant(e) => {
                e.insert(v);
            }
        }
        self.stored_bytes += bytes;
        true
    }

    fn del(&mut self, k: &Key) {
        if self.items.remove(k).is_some() {
            let l = self.leaf_of(k);
            self.dirty.insert(l);
        }
    }

    /// Makes the items in [lo, hi] exactly `new`; returns how many were stored anew.
    /// Leaves are marked dirty once per partition met, not per item: a directory of
    /// 100,000 new files logs 300,000 items in one fsync.
    fn replace_range(&mut self, lo: Key, hi: Key, new: Vec<(Key, Vec<u8>)>) -> u64 {
        if self.items.range(lo..=hi).next().is_some() {
            let keep: BTreeSet<Key> = new.iter().map(|(k, _)| *k).collect();
            let gone: Vec<Key> = self
                .items
                .range(lo..=hi)
                .map(|(k, _)| *k)
                .filter(|k| !keep.contains(k))
                .collect();
            for k in gone {
                self.del(&k);
            }
        }
        let mut n = 0;
        // The partition of the last item stored, and where the next one starts.
        let mut cur: Option<(Key, Option<Key>)> = None;
        for (k, v) in new {
            if !self.put(k, v) {
                continue;
            }
            n += 1;
            let inside = cur.is_some_and(|(p, next)| k >= p && next.is_none_or(|x| k < x));
            if !inside {
                let (p, next) = self.partition_of(&k);
                self.dirty.insert(p);
                cur = Some((p, next));
            }
        }
        n
    }
}

/// The tree log of a writing handle (see the module comment). Keep one next to the
/// [`Trans`] and call [`TreeLog::fsync`]; a commit of the transaction makes the log
/// obsolete, which the next call notices.
#[derive(Debug, Default)]
pub struct TreeLog {
    /// Transaction the log belongs to (0: none yet).
    transid: u64,
    subvols: BTreeMap<u64, LogBuf>,
    root_tree: LogBuf,
    logged: BTreeMap<(u64, u64), Logged>,
    /// Per device, the superblock of the last commit (read when the log starts).
    supers: Vec<(u64, SuperBlock)>,
    /// Root pointers of subvolumes as of the last commit (None: made since).
    committed_roots: HashMap<u64, Option<RootPtr>>,
    /// Log blocks the next durable sync frees (replaced by this one).
    garbage: Vec<u64>,
    /// The counters, and the leaf hint of the fsync running.
    copy: Copier,
}

/// A directory name against the last commit.
enum Ix {
    /// The same item.
    Same,
    /// New or changed since: the current item (logged).
    New(Vec<u8>),
    /// Gone or changed since: the committed item.
    Gone(Vec<u8>),
}

/// The DIR_INDEX keys to log (new or changed) and the DIR_LOG_INDEX ranges
/// [start, end] that cover every change, each reaching to the unchanged neighbours:
/// the replay deletes the committed names inside a range that the log lacks.
fn changed_ranges(diff: &[(Key, Ix)]) -> Vec<(u64, u64)> {
    let mut ranges = Vec::new();
    let mut last_same: Option<u64> = None;
    let mut open: Option<u64> = None;
    for (k, ix) in diff {
        match ix {
            Ix::Same => {
                if let Some(start) = open.take() {
                    ranges.push((start, k.offset - 1));
                }
                last_same = Some(k.offset);
            }
            Ix::New(_) | Ix::Gone(_) => {
                if open.is_none() {
                    open = Some(last_same.map_or(0, |o| o + 1));
                }
            }
        }
    }
    if let Some(start) = open {
        ranges.push((start, u64::MAX));
    }
    ranges
}

/// Checks the entries of a DIR_INDEX item to log: a subvolume entry means commit
/// instead; entries made in this transaction name inodes to log too.
fn check_entries(
    t: &Trans,
    root: u64,
    k: &Key,
    d: &[u8],
    new_children: &mut Vec<u64>,
) -> Result<Fallback> {
    for e in parse_dir_items(d).map_err(|e| Error::corrupt(format!("tree {root} item {k}: {e}")))? {
        if e.location.ty != INODE_ITEM_KEY {
            return Ok(Some("subvolume entry in a logged directory"));
        }
        if e.transid >= t.transid {
            new_children.push(e.location.objectid);
        }
    }
    Ok(None)
}

/// The inodes one fsync has logged, and how many more it may.
struct Visit {
    seen: BTreeSet<(u64, u64)>,
    /// Those of `seen` logged whole ([`Mode::Full`]). An inode first reached as a
    /// renamed ancestor (names only) may be needed whole later in the same fsync:
    /// as the old parent of another renamed directory, whose lost name only its
    /// whole logging (the changed DIR_INDEX range) removes at replay.
    seen_full: BTreeSet<(u64, u64)>,
    budget: usize,
    /// The transaction's file extent changes, taken for this fsync: (tree, inode) ->
    /// lowest offset changed. What no inode logged here used goes back.
    changes: HashMap<(u64, u64), u64>,
    /// Item bytes (headers and data) the metadata space free when the fsync began
    /// could hold in log leaves: the log's blocks can come from nowhere else.
    room_bytes: u64,
    /// Directories asked whether they existed at the last commit (a directory made
    /// since had no names then, so none of its names can conflict with one).
    committed_dirs: HashMap<(u64, u64), bool>,
    /// Item bytes the log trees had stored when this fsync began
    /// ([`LogBuf::stored_bytes`]): what it stores is the difference.
    start_bytes: u64,
}

impl Visit {
    /// Whether the items logged so far plus `ahead_bytes` more would not fit into
    /// the free metadata space: then the fsync commits at once, before copying what
    /// could not be written (a directory of a million new files: the log would need
    /// more than the free space, and stopping after the directory's own items saves
    /// the copying of every child that a commit makes durable anyway).
    fn short(&self, log: &TreeLog, ahead_bytes: u64) -> bool {
        let stored = log.stored_bytes().saturating_sub(self.start_bytes);
        stored + ahead_bytes > self.room_bytes
    }
}

/// The fewest item bytes logging an inode not logged before adds: its INODE_ITEM
/// (160 bytes) and one INODE_REF (index and name length, 10 bytes, then a name of
/// at least one byte), each with its item header: the log's lower bound per child.
const CHILD_LOG_BYTES_MIN: u64 = (2 * ITEM_SIZE + 160 + 10 + 1) as u64;

/// A reason to commit instead of logging.
type Fallback = Option<&'static str>;

/// The fallback when the log's blocks would not fit into the free metadata space.
const SPACE_SHORT: &str = "metadata space short for the log";

fn is_dir(mode: u32) -> bool {
    mode & S_IFMT == S_IFDIR
}

fn is_reg(mode: u32) -> bool {
    mode & S_IFMT == S_IFREG
}

/// Logs with at least this many items are freed on a thread of their own.
const BACKGROUND_FREE_ITEMS_MIN: usize = 4096;

fn inode_range(ino: u64) -> (Key, Key) {
    (Key::new(ino, 0, 0), Key::new(ino, u8::MAX, u64::MAX))
}

impl TreeLog {
    /// An empty log.
    pub fn new() -> TreeLog {
        TreeLog::default()
    }

    /// Counters so far.
    pub fn stats(&self) -> &LogStats {
        &self.copy.stats
    }

    /// Item bytes the log trees of the running transaction have stored anew.
    fn stored_bytes(&self) -> u64 {
        self.subvols.values().map(|b| b.stored_bytes).sum()
    }

    /// Items held in the log trees of the running transaction.
    pub fn items(&self) -> usize {
        self.subvols.values().map(|b| b.items.len()).sum()
    }

    /// Makes inode `ino` of subvolume `root` durable: logs it and syncs the log, or
    /// commits the transaction where a log cannot say it (see the module comment).
    /// `datasync` (fdatasync) is logged as fsync is.
    pub fn fsync(&mut self, t: &mut Trans, root: u64, ino: u64, _datasync: bool) -> Result<Synced> {
        self.copy.stats.fsyncs += 1;
        // A log replays over the last commit's superblock: a commit still being
        // written must be durable first.
        t.commit_finish()?;
        if self.transid != t.transid {
            self.reset(t.transid);
        }
        let why = self.try_log(t, root, ino)?;
        if let Some(why) = why {
            return self.commit_instead(t, why);
        }
        match self.sync(t)? {
            None => {
                self.copy.stats.logged += 1;
                Ok(Synced::Logged)
            }
            Some(why) => self.commit_instead(t, why),
        }
    }

    /// Lets go of the log of a transaction that has committed since (`transid`: the
    /// running one), so the next fsync does not pay for freeing it. Call after a
    /// commit; without it the next fsync notices.
    pub fn retire(&mut self, transid: u64) {
        if self.transid != 0 && self.transid != transid {
            self.reset(transid);
        }
    }

    fn commit_instead(&mut self, t: &mut Trans, why: &'static str) -> Result<Synced> {
        t.commit()?;
        self.reset(t.transid);
        self.copy.stats.full_commits += 1;
        *self.copy.stats.commit_reasons.entry(why).or_insert(0) += 1;
        Ok(Synced::Committed(why))
    }

    /// Forgets the log of an earlier transaction (its blocks went back to the free
    /// space when that transaction committed).
    fn reset(&mut self, transid: u64) {
        let stats = std::mem::take(&mut self.copy.stats);
        let old = std::mem::replace(
            self,
            TreeLog {
                transid,
                copy: Copier {
                    stats,
                    last_leaf: None,
                },
                ..TreeLog::default()
            },
        );
        // Freeing a log of many inodes (an allocation per item) takes tens of
        // milliseconds: not on the fsync that finds the log stale. (If no thread
        // can be started, the closure and the log are dropped here.)
        if old.items() >= BACKGROUND_FREE_ITEMS_MIN {
            let _ = std::thread::Builder::new()
                .name("ubtrfs-log-free".into())
                .spawn(move || drop(old));
        }
    }

    fn try_log(&mut self, t: &mut Trans, root: u64, ino: u64) -> Result<Fallback> {
        // The trees may have changed since the last fsync: its leaf is no hint.
        self.copy.last_leaf = None;
        let why = self.try_log_inner(t, root, ino);
        self.copy.last_leaf = None;
        why
    }

    fn try_log_inner(&mut self, t: &mut Trans, root: u64, ino: u64) -> Result<Fallback> {
        if !t.alloc.pending_chunks.is_empty() {
            return Ok(Some("chunk allocated in this transaction"));
        }
        if self.committed_root(t, root)?.is_none() {
            return Ok(Some("subvolume made in this transaction"));
        }
        if let Some(why) = t.log_full_commit {
            return Ok(Some(why));
        }
        let mut v = Visit {
            seen: BTreeSet::new(),
            seen_full: BTreeSet::new(),
            budget: INODES_PER_FSYNC_MAX,
            changes: {
                t.track_log_changes();
                std::mem::take(t.file_extent_changes.get_or_insert_with(HashMap::new))
            },
            room_bytes: {
                let ns = t.fs.info.nodesize as u64;
                let free = t.alloc.free_in_groups(BLOCK_GROUP_METADATA);
                free / ns * (ns - HEADER_SIZE as u64)
            },
            committed_dirs: HashMap::new(),
            start_bytes: self.stored_bytes(),
        };
        let why = self.log_inodes(t, root, ino, &mut v)?;
        // Changes of inodes this fsync did not log stay for their turn.
        if let Some(c) = t.file_extent_changes.as_mut() {
            c.extend(v.changes);
        }
        if why.is_some() {
            return Ok(why);
        }
        if self.items() > LOG_ITEMS_MAX {
            return Ok(Some("log size limit"));
        }
        Ok(None)
    }

    /// The inode, then every inode logged earlier in the transaction that changed
    /// since (its inode item, or its file extents).
    fn log_inodes(&mut self, t: &Trans, root: u64, ino: u64, v: &mut Visit) -> Result<Fallback> {
        if let Some(why) = self.log_inode(t, root, ino, Mode::Full, v)? {
            return Ok(Some(why));
        }
        // Inodes logged before that changed since: log them again.
        // (An inode gone since, or failing to read, is logged again: that forgets it
        // or reports the error.)
        let stale: Vec<((u64, u64), Mode)> = self
            .logged
            .iter()
            .filter(|(k, _)| !v.seen.contains(*k))
            .filter(|(k, l)| {
                v.changes.contains_key(*k)
                    || !current_inode_bytes(t, k.0, k.1)
                        .is_ok_and(|b| b.as_deref() == Some(l.inode.as_slice()))
            })
            .map(|(k, l)| (*k, l.mode))
            .collect();
        for ((r, i), m) in stale {
            if let Some(why) = self.log_inode(t, r, i, m, v)? {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }

    /// The subvolume's root as of the last commit (None: made since).
    fn committed_root(&mut self, t: &Trans, root: u64) -> Result<Option<RootPtr>> {
        if let Some(r) = self.committed_roots.get(&root) {
            return Ok(*r);
        }
        self.read_supers(t)?;
        let sb = &self.supers[0].1;
        let rt = RootPtr {
            id: ROOT_TREE_OBJECTID,
            bytenr: sb.root,
            level: sb.root_level,
            generation: sb.generation,
        };
        let found = match lookup_prev(&t.fs.info, &rt, Key::new(root, ROOT_ITEM_KEY, u64::MAX))? {
            Some((k, d)) if k.objectid == root && k.ty == ROOT_ITEM_KEY => {
                let r = RootItem::parse(&d)
                    .map_err(|e| Error::corrupt(format!("root tree item {k}: {e}")))?;
                Some(RootPtr {
                    id: root,
                    bytenr: r.bytenr,
                    level: r.level,
                    generation: r.generation,
                })
            }
            _ => None,
        };
        self.committed_roots.insert(root, found);
        Ok(found)
    }

    fn read_supers(&mut self, t: &Trans) -> Result<()> {
        if !self.supers.is_empty() {
            return Ok(());
        }
        for (devid, dev) in &t.fs.info.devices {
            let (sb, _) = read_best_super(dev.as_ref())?;
            if sb.generation + 1 != t.transid {
                return Err(Error::corrupt(format!(
                    "{}: superblock generation {} is not the last commit ({})",
                    dev.name(),
                    sb.generation,
                    t.transid - 1
                )));
            }
            self.supers.push((*devid, sb));
        }
        if self.supers.is_empty() {
            return Err(Error::Invalid("no devices".into()));
        }
        Ok(())
    }

    /// Items of one inode in the committed tree, in [lo, hi].
    fn committed_items(
        &mut self,
        t: &Trans,
        root: u64,
        lo: Key,
        hi: Key,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let Some(ptr) = self.committed_root(t, root)? else {
            return Ok(Vec::new());
        };
        copy_items(t, &ptr, lo, hi, &mut self.copy)
    }

    /// Logs one inode (and what its durability needs); returns a reason to commit
    /// instead, if there is one.
    fn log_inode(
        &mut self,
        t: &Trans,
        root: u64,
        ino: u64,
        mode: Mode,
        v: &mut Visit,
    ) -> Result<Fallback> {
        let first_visit = v.seen.insert((root, ino));
        let upgrade = !first_visit && mode == Mode::Full && !v.seen_full.contains(&(root, ino));
        if !first_visit && !upgrade {
            return Ok(None);
        }
        if mode == Mode::Full {
            v.seen_full.insert((root, ino));
        }
        if v.budget == 0 {
            return Ok(Some("too many inodes for one fsync"));
        }
        v.budget -= 1;
        let was_full = self
            .logged
            .get(&(root, ino))
            .is_some_and(|l| l.mode == Mode::Full);
        let mode = if was_full { Mode::Full } else { mode };
        // Logged as far as asked and unchanged since (inode item, file extents): the
        // log says it already (the kernel's inode-in-log check). Every change to names,
        // entries, xattrs or data touches the inode item.
        if let Some(l) = self.logged.get(&(root, ino)) {
            if (was_full || mode == Mode::Exists)
                && !v.changes.contains_key(&(root, ino))
                && current_inode_bytes(t, root, ino)?.as_deref() == Some(l.inode.as_slice())
            {
                // A directory above it may have moved since (a rename changes the
                // directories, not this inode): checked as at the first logging.
                return self.check_parents(t, root, ino, v);
            }
        }
        let ptr = t.root_ptr(root)?;
        let (lo, hi) = inode_range(ino);
        let hi_copy = match mode {
            Mode::Full => hi,
            Mode::Exists => Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
        };
        // The fast path (the kernel's, for a file logged before in this transaction):
        // its inode item, names and xattrs, and its extents from the log's last
        // extent item at or below the lowest offset changed since (so the tail hole
        // follows a size change too); the extents below are as logged.
        let fast_from = match mode {
            Mode::Exists => None,
            Mode::Full => {
                let changed = v.changes.remove(&(root, ino)).unwrap_or(u64::MAX);
                match (self.logged.get(&(root, ino)), self.subvols.get(&root)) {
                    (Some(l), Some(buf)) if l.mode == Mode::Full && l.reg => Some(
                        buf.items
                            .range(
                                Key::new(ino, EXTENT_DATA_KEY, 0)
                                    ..=Key::new(ino, EXTENT_DATA_KEY, changed),
                            )
                            .next_back()
                            .map_or(0, |(k, _)| k.offset),
                    ),
                    _ => None,
                }
            }
        };
        let head_hi = Key::new(ino, XATTR_ITEM_KEY, u64::MAX);
        let tail_lo = Key::new(ino, EXTENT_DATA_KEY, fast_from.unwrap_or(0));
        // The INODE_ITEM is the range's first item: one search (two on the fast path).
        // A directory in the last commit logs only the names changed since (below):
        // its DIR_INDEX items are not copied here.
        let transid = t.transid;
        let partial_dir = |head: &[(Key, Vec<u8>)]| {
            head.first().is_some_and(|(k, d)| {
                k.ty == INODE_ITEM_KEY
                    && InodeItem::parse(d).is_ok_and(|i| is_dir(i.mode) && i.generation < transid)
            })
        };
        let src = match fast_from {
            None => copy_items_then(t, &ptr, lo, hi_copy, head_hi, &mut self.copy, |h| {
                !partial_dir(h)
            })?,
            Some(_) => {
                let mut a = copy_items(t, &ptr, lo, head_hi, &mut self.copy)?;
                a.extend(copy_items(t, &ptr, tail_lo, hi, &mut self.copy)?);
                a
            }
        };
        let inode_bytes = match src.first() {
            Some((k, d)) if k.ty == INODE_ITEM_KEY => d.clone(),
            // Gone since it was logged: the log forgets it.
            _ => return self.forget_gone(t, root, ino, v),
        };
        let inode = InodeItem::parse(&inode_bytes)
            .map_err(|e| Error::corrupt(format!("inode {ino} of tree {root}: {e}")))?;
        if inode.nlink == 0 {
            return self.forget_gone(t, root, ino, v);
        }
        self.copy.stats.inodes_logged += 1;
        self.copy.stats.fast_path += u64::from(fast_from.is_some());
        let mut items = Vec::with_capacity(src.len() + 1);
        let mut parents = Vec::new();
        let mut new_children = Vec::new();
        let mut extents = Vec::new();
        for (k, d) in src {
            match k.ty {
                INODE_ITEM_KEY | XATTR_ITEM_KEY => items.push((k, d)),
                INODE_REF_KEY => {
                    // A subvolume root's ".." names itself: nothing to link.
                    if k.offset != ino {
                        for r in ubtrfs_format::items::parse_inode_refs(k.offset, &d)
                            .map_err(|e| Error::corrupt(format!("tree {root} item {k}: {e}")))?
                        {
                            parents.push((r.parent, r.name));
                        }
                        items.push((k, d));
                    }
                }
                INODE_EXTREF_KEY => {
                    for r in ubtrfs_format::items::parse_inode_extrefs(&d)
                        .map_err(|e| Error::corrupt(format!("tree {root} item {k}: {e}")))?
                    {
                        parents.push((r.parent, r.name));
                    }
                    items.push((k, d));
                }
                EXTENT_DATA_KEY => {
                    let fe = FileExtentItem::parse(&d)
                        .map_err(|e| Error::corrupt(format!("tree {root} item {k}: {e}")))?;
                    extents.push((k.offset, fe));
                    items.push((k, d));
                }
                DIR_INDEX_KEY => {
                    if let Some(why) = check_entries(t, root, &k, &d, &mut new_children)? {
                        return Ok(Some(why));
                    }
                    items.push((k, d));
                }
                DIR_ITEM_KEY => {}
                _ => return Ok(Some("item the log does not copy")),
            }
        }
        // An inode made in this transaction had no names at the commit.
        let is_new = inode.generation >= t.transid;
        if inode.transid >= t.transid && !is_new {
            if let Some(why) = self.log_lost_parents(t, root, ino, &parents, v)? {
                return Ok(Some(why));
            }
        }
        if inode.transid >= t.transid {
            if let Some(why) = self.log_conflicting(t, root, ino, &parents, v)? {
                return Ok(Some(why));
            }
        }
        if mode == Mode::Full && is_dir(inode.mode) {
            if is_new {
                // Made in this transaction: every name (copied above), and one range
                // saying so.
                items.push((
                    Key::new(ino, DIR_LOG_INDEX_KEY, 0),
                    u64::MAX.to_le_bytes().to_vec(),
                ));
            } else {
                // In the last commit: only the names changed since, with ranges that
                // cover them up to the unchanged neighbours (the kernel logs a
                // directory's changed index ranges the same way); none when the
                // directory is untouched since.
                let diff = if inode.transid >= t.transid {
                    self.index_diff(t, root, ino)?
                } else {
                    Vec::new()
                };
                if let Some(why) = self.log_gone_names(t, root, &diff, v)? {
                    return Ok(Some(why));
                }
                for (k, ix) in &diff {
                    if let Ix::New(d) = ix {
                        if let Some(why) = check_entries(t, root, k, d, &mut new_children)? {
                            return Ok(Some(why));
                        }
                        items.push((*k, d.clone()));
                    }
                }
                for (start, end) in changed_ranges(&diff) {
                    items.push((
                        Key::new(ino, DIR_LOG_INDEX_KEY, start),
                        end.to_le_bytes().to_vec(),
                    ));
                }
            }
            items.sort_by_key(|a| a.0);
        }
        if mode == Mode::Full && is_reg(inode.mode) {
            let holes = holes_of(t, ino, &inode, &extents, fast_from.unwrap_or(0));
            if !holes.is_empty() {
                items.extend(holes);
                items.sort_by_key(|a| a.0);
            }
        }
        let buf = self.subvols.entry(root).or_default();
        self.copy.stats.items_logged += match fast_from {
            None => buf.replace_range(lo, hi_copy, items),
            Some(_) => {
                let (head, tail): (Vec<_>, Vec<_>) =
                    items.into_iter().partition(|(k, _)| *k <= head_hi);
                buf.replace_range(lo, head_hi, head) + buf.replace_range(tail_lo, hi, tail)
            }
        };
        if mode == Mode::Full {
            for (_, fe) in &extents {
                self.log_csums(t, root, fe)?;
            }
        }
        // What is stored so far, and what the children still to log need at least,
        // against the free space (stopping here leaves a log the commit replaces).
        let children_new = new_children
            .iter()
            .filter(|c| !self.logged.contains_key(&(root, **c)))
            .count() as u64;
        if v.short(self, children_new * CHILD_LOG_BYTES_MIN) {
            return Ok(Some(SPACE_SHORT));
        }
        // Logged whole by a nested call while this one logged its names only.
        let logged_mode = if v.seen_full.contains(&(root, ino)) {
            Mode::Full
        } else {
            mode
        };
        self.logged.insert(
            (root, ino),
            Logged {
                mode: logged_mode,
                inode: inode_bytes,
                reg: is_reg(inode.mode),
            },
        );
        // The names must be replayable: every parent exists after the replay.
        let dirs: BTreeSet<u64> = parents.iter().map(|(p, _)| *p).collect();
        for p in dirs {
            if let Some(why) = self.log_parent(t, root, p, v)? {
                return Ok(Some(why));
            }
        }
        for c in new_children {
            if let Some(why) = self.log_inode(t, root, c, Mode::Full, v)? {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }

    /// [`TreeLog::log_parent`] for every directory an inode has a name in now.
    fn check_parents(&mut self, t: &Trans, root: u64, ino: u64, v: &mut Visit) -> Result<Fallback> {
        let ptr = t.root_ptr(root)?;
        let names = copy_items(
            t,
            &ptr,
            Key::new(ino, INODE_REF_KEY, 0),
            Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
            &mut self.copy,
        )?;
        let mut dirs = BTreeSet::new();
        for (k, d) in names {
            let bad = |e| Error::corrupt(format!("tree {root} item {k}: {e}"));
            match k.ty {
                INODE_REF_KEY if k.offset != ino => {
                    dirs.insert(k.offset);
                }
                INODE_EXTREF_KEY => {
                    for r in ubtrfs_format::items::parse_inode_extrefs(&d).map_err(bad)? {
                        dirs.insert(r.parent);
                    }
                }
                _ => {}
            }
        }
        for p in dirs {
            if let Some(why) = self.log_parent(t, root, p, v)? {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }

    /// A parent directory of a logged inode: made in this transaction, or moved
    /// since the commit, it is logged (inode and names, and so on up), so the
    /// replay places it where it is now; committed and unmoved, its own parents are
    /// checked the same way.
    fn log_parent(&mut self, t: &Trans, root: u64, dir: u64, v: &mut Visit) -> Result<Fallback> {
        let mut cur = dir;
        for _ in 0..4096 {
            // Logged (or being logged) by this fsync: its chain is checked there.
            if v.seen.contains(&(root, cur)) {
                return Ok(None);
            }
            // The inode item and names, as committed and as now: one search each.
            let lo = Key::new(cur, INODE_ITEM_KEY, 0);
            let hi = Key::new(cur, INODE_EXTREF_KEY, u64::MAX);
            let then = self.committed_items(t, root, lo, hi)?;
            if then.first().is_none_or(|(k, _)| k.ty != INODE_ITEM_KEY) {
                // New: log it (its own parents follow from there).
                return self.log_inode(t, root, cur, Mode::Exists, v);
            }
            let now = copy_items(t, &t.root_ptr(root)?, lo, hi, &mut self.copy)?;
            let refs = |items: &[(Key, Vec<u8>)]| -> Vec<(Key, Vec<u8>)> {
                items
                    .iter()
                    .filter(|(k, _)| k.ty != INODE_ITEM_KEY)
                    .cloned()
                    .collect()
            };
            if refs(&then) != refs(&now) {
                // Renamed (or linked elsewhere) since the commit: logged with its
                // names as they are now, and the parents it lost a name in logged
                // whole, so the replay moves it (the kernel logs a renamed directory
                // the same way, at the rename, once it or its old parent is in the
                // log). Its new parents follow from there.
                return self.log_inode(t, root, cur, Mode::Exists, v);
            }
            if cur == FIRST_FREE_OBJECTID {
                return Ok(None);
            }
            let Some((k, _)) = now.iter().find(|(k, _)| k.ty == INODE_REF_KEY) else {
                return Ok(None);
            };
            if k.offset == cur {
                return Ok(None);
            }
            cur = k.offset;
        }
        Ok(Some("directory chain too deep"))
    }

    /// A directory's DIR_INDEX items against the last commit's, in key order. A leaf
    /// both trees share (same block) is unchanged: only its first and last keys are
    /// listed, as bounds for the ranges; the items of the other leaves are merged
    /// (one pass over both sorted lists). A leaf emptied and dropped since shows as
    /// its names gone.
    fn index_diff(&mut self, t: &Trans, root: u64, dir: u64) -> Result<Vec<(Key, Ix)>> {
        let lo = Key::new(dir, DIR_INDEX_KEY, 0);
        let hi = Key::new(dir, DIR_INDEX_KEY, u64::MAX);
        let Some(old_ptr) = self.committed_root(t, root)? else {
            return Ok(Vec::new());
        };
        if let Some(c) = t.dir_index_changes.as_ref().filter(|c| c.complete) {
            match c.dirs.get(&(root, dir)) {
                // No DIR_INDEX of it changed in this transaction.
                None => return Ok(Vec::new()),
                Some(Some(changed)) => return self.index_changes(t, root, dir, &old_ptr, changed),
                // Too many to keep: compare the leaves.
                Some(None) => {}
            }
        }
        self.copy.stats.searches += 2;
        let now_leaves = range_leaves(t, &t.root_ptr(root)?, lo, hi)?;
        let then_leaves = range_leaves(t, &old_ptr, lo, hi)?;
        let then_blocks: BTreeSet<u64> = then_leaves.iter().map(|b| b.bytenr).collect();
        let shared: BTreeSet<u64> = now_leaves
            .iter()
            .map(|b| b.bytenr)
            .filter(|b| then_blocks.contains(b))
            .collect();
        let in_range = |k: &Key| lo <= *k && *k <= hi;
        // Borrowed from the leaves: only what changed is copied out.
        let mut then: Vec<(Key, &[u8])> = Vec::new();
        for b in then_leaves.iter().filter(|b| !shared.contains(&b.bytenr)) {
            then.extend(leaf_items(b, 0)?.into_iter().filter(|(k, _)| in_range(k)));
        }
        // Current items: Some(data) from changed leaves, None for a shared leaf's bounds.
        let mut now: Vec<(Key, Option<&[u8]>)> = Vec::new();
        for b in &now_leaves {
            let items: Vec<(Key, &[u8])> = leaf_items(b, 0)?
                .into_iter()
                .filter(|(k, _)| in_range(k))
                .collect();
            if shared.contains(&b.bytenr) {
                for (k, _) in [items.first(), items.last()].into_iter().flatten() {
                    if now.last().is_none_or(|(l, _)| l != k) {
                        now.push((*k, None));
                    }
                }
            } else {
                self.copy.stats.leaf_copies += 1;
                now.extend(items.into_iter().map(|(k, d)| (k, Some(d))));
            }
        }
        let ix = |nd: Option<&[u8]>| nd.map_or(Ix::Same, |d| Ix::New(d.to_vec()));
        let mut out = Vec::new();
        let mut cur = now.into_iter().peekable();
        for (k, d) in then {
            while let Some((c, nd)) = cur.next_if(|(c, _)| *c < k) {
                out.push((c, ix(nd)));
            }
            match cur.next_if(|(c, _)| *c == k) {
                Some((_, Some(nd))) if nd == d => out.push((k, Ix::Same)),
                Some((_, nd)) => {
                    out.push((k, Ix::Gone(d.to_vec())));
                    out.push((k, ix(nd)));
                }
                None => out.push((k, Ix::Gone(d.to_vec()))),
            }
        }
        out.extend(cur.map(|(c, nd)| (c, ix(nd))));
        Ok(out)
    }

    /// [`TreeLog::index_diff`] from the transaction's record of the directory's
    /// changed indexes (`Trans::dir_index_changes`): each is looked up in the
    /// commit's tree and in the current one, so the work follows the changes, not the
    /// directory's size. Every run of consecutive changed indexes is bounded by
    /// `Ix::Same` marks just outside it, so its DIR_LOG_INDEX range covers exactly
    /// those indexes (the replay deletes the committed names inside a range that the
    /// log lacks: precisely the ones gone).
    fn index_changes(
        &mut self,
        t: &Trans,
        root: u64,
        dir: u64,
        old_ptr: &RootPtr,
        changed: &BTreeSet<u64>,
    ) -> Result<Vec<(Key, Ix)>> {
        let now_ptr = t.root_ptr(root)?;
        let mut out = Vec::new();
        let mut prev: Option<u64> = None;
        for &i in changed {
            let k = Key::new(dir, DIR_INDEX_KEY, i);
            self.copy.stats.searches += 2;
            let then = lookup_exact(&t.fs.info, old_ptr, &k)?.map(|it| it.data().to_vec());
            let now = lookup_exact(&t.fs.info, &now_ptr, &k)?.map(|it| it.data().to_vec());
            let entries = match (then, now) {
                (None, None) => continue,
                (Some(a), Some(b)) if a == b => continue,
                (Some(a), Some(b)) => vec![Ix::Gone(a), Ix::New(b)],
                (Some(a), None) => vec![Ix::Gone(a)],
                (None, Some(b)) => vec![Ix::New(b)],
            };
            if prev.is_none_or(|p| p + 1 != i) {
                // A new run: close the last one, open this one.
                if let Some(p) = prev.filter(|&p| p < u64::MAX) {
                    out.push((Key::new(dir, DIR_INDEX_KEY, p + 1), Ix::Same));
                }
                if i > 0 {
                    out.push((Key::new(dir, DIR_INDEX_KEY, i - 1), Ix::Same));
                }
            }
            out.extend(entries.into_iter().map(|e| (k, e)));
            prev = Some(i);
        }
        if let Some(p) = prev.filter(|&p| p < u64::MAX) {
            out.push((Key::new(dir, DIR_INDEX_KEY, p + 1), Ix::Same));
        }
        Ok(out)
    }

    /// A name a logged directory lost since the commit is deleted by the replay
    /// (its range covers it). Fine for an inode that is gone; one still linked
    /// elsewhere (moved, or one of its links removed) is logged too, so the replay
    /// links it where it is now.
    fn log_gone_names(
        &mut self,
        t: &Trans,
        root: u64,
        diff: &[(Key, Ix)],
        v: &mut Visit,
    ) -> Result<Fallback> {
        let mut moved = Vec::new();
        for (k, ix) in diff {
            let Ix::Gone(d) = ix else { continue };
            for e in parse_dir_items(d)
                .map_err(|e| Error::corrupt(format!("tree {root} item {k}: {e}")))?
            {
                if e.location.ty != INODE_ITEM_KEY {
                    return Ok(Some("subvolume entry in a logged directory"));
                }
                match relink(t, root, e.location.objectid)? {
                    Relink::Nothing => {}
                    Relink::Log { .. } => moved.push(e.location.objectid),
                    Relink::Commit(why) => return Ok(Some(why)),
                }
            }
        }
        for m in moved {
            if let Some(why) = self.log_inode(t, root, m, Mode::Full, v)? {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }

    /// A name the inode has now that another inode had at the last commit (a
    /// rename over it, an exchange): the replay, adding the name, unlinks the other
    /// inode's, which would leave that inode without a name if it is still linked
    /// elsewhere and the log does not say where (a committed directory dropped with
    /// everything in it). So that inode is logged too, a directory whole, anything
    /// else with its names, and the replay links it where it is now (the kernel's
    /// conflicting inodes, btrfs_check_ref_name_override). One holding a
    /// subvolume's entry: commit instead.
    fn log_conflicting(
        &mut self,
        t: &Trans,
        root: u64,
        ino: u64,
        names: &[(u64, Vec<u8>)],
        v: &mut Visit,
    ) -> Result<Fallback> {
        for (parent, name) in names {
            // One search per directory, not per name: the 100,000 new files of a new
            // directory (seed 004) need none each.
            let existed = match v.committed_dirs.get(&(root, *parent)) {
                Some(&e) => e,
                None => {
                    let k = Key::new(*parent, INODE_ITEM_KEY, 0);
                    let e = !self.committed_items(t, root, k, k)?.is_empty();
                    v.committed_dirs.insert((root, *parent), e);
                    e
                }
            };
            if !existed {
                continue;
            }
            let key = Key::new(*parent, DIR_ITEM_KEY, ubtrfs_format::csum::name_hash(name));
            for (k, d) in self.committed_items(t, root, key, key)? {
                let entries = parse_dir_items(&d)
                    .map_err(|e| Error::corrupt(format!("tree {root} item {k}: {e}")))?;
                for e in entries.into_iter().filter(|e| e.name == *name) {
                    if e.location.ty != INODE_ITEM_KEY {
                        return Ok(Some("subvolume entry in a logged directory"));
                    }
                    let other = e.location.objectid;
                    if other == ino {
                        continue;
                    }
                    let mode = match relink(t, root, other)? {
                        Relink::Nothing => continue,
                        Relink::Log { dir: true } => Mode::Full,
                        Relink::Log { dir: false } => Mode::Exists,
                        Relink::Commit(why) => return Ok(Some(why)),
                    };
                    if let Some(why) = self.log_inode(t, root, other, mode, v)? {
                        return Ok(Some(why));
                    }
                }
            }
        }
        Ok(None)
    }

    /// The replay adds the logged names of an inode, and drops only names in the
    /// same log item key (INODE_REF per parent; INODE_EXTREF per name hash): a
    /// name the inode lost since the last commit would come back, so every
    /// directory where it lost one is logged too (its changed ranges then drop the
    /// stale name), as the kernel logs all parents of an inode unlinked in the
    /// transaction. A parent directory that is gone: commit instead. `names`: the
    /// inode's (parent, name) pairs now.
    fn log_lost_parents(
        &mut self,
        t: &Trans,
        root: u64,
        ino: u64,
        names: &[(u64, Vec<u8>)],
        v: &mut Visit,
    ) -> Result<Fallback> {
        let then = self.committed_items(
            t,
            root,
            Key::new(ino, INODE_REF_KEY, 0),
            Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
        )?;
        let now: BTreeSet<(u64, &[u8])> = names.iter().map(|(p, n)| (*p, n.as_slice())).collect();
        let mut lost = BTreeSet::new();
        for (k, d) in then {
            let bad = |e| Error::corrupt(format!("tree {root} item {k}: {e}"));
            let refs = match k.ty {
                INODE_REF_KEY if k.offset == ino => continue,
                INODE_REF_KEY => {
                    ubtrfs_format::items::parse_inode_refs(k.offset, &d).map_err(bad)?
                }
                _ => ubtrfs_format::items::parse_inode_extrefs(&d).map_err(bad)?,
            };
            for r in refs {
                if !now.contains(&(r.parent, r.name.as_slice())) {
                    lost.insert(r.parent);
                }
            }
        }
        for p in lost {
            if current_inode_bytes(t, root, p)?.is_none() {
                return Ok(Some("old parent directory removed"));
            }
            if let Some(why) = self.log_inode(t, root, p, Mode::Full, v)? {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }

    /// An inode logged earlier is gone (or unlinked): the log forgets it, unless
    /// it is a directory logged with its changed names: those may remove a name of
    /// another inode the log must keep (an fsynced file unlinked from it), and a
    /// directory that is gone cannot be logged any more, so commit instead.
    ///
    /// A file forgotten this way may still have names in the last commit. Replayed
    /// without its logged items, such a name would show the committed contents,
    /// older than what an fsync of it logged (the mount crash test found a file
    /// fsynced at 334,141 bytes back at its committed 168,195 after it was unlinked
    /// and another file's fsync wrote the log again). So the directories of those
    /// names are logged too, and the replay drops the names (the kernel keeps the
    /// inode in its log and deletes its names from the logged directories instead;
    /// both leave either the fsynced file or none).
    fn forget_gone(&mut self, t: &Trans, root: u64, ino: u64, v: &mut Visit) -> Result<Fallback> {
        let Some(logged) = self.logged.get(&(root, ino)) else {
            // Never logged in this transaction: the replay leaves its committed
            // state, a state it was durable in.
            self.forget(root, ino);
            return Ok(None);
        };
        let was_dir = logged.mode == Mode::Full
            && InodeItem::parse(&logged.inode).is_ok_and(|i| is_dir(i.mode));
        if was_dir {
            return Ok(Some("a logged directory was removed"));
        }
        self.forget(root, ino);
        self.log_lost_parents(t, root, ino, &[], v)
    }

    fn forget(&mut self, root: u64, ino: u64) {
        self.logged.remove(&(root, ino));
        if let Some(buf) = self.subvols.get_mut(&root) {
            let (lo, hi) = inode_range(ino);
            buf.replace_range(lo, hi, Vec::new());
        }
    }

    /// Checksums of an extent written in this transaction go into the log (the
    /// replay copies them into the csum tree; older extents' are there already).
    fn log_csums(&mut self, t: &Trans, root: u64, fe: &FileExtentItem) -> Result<()> {
        let FileExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } = fe.body
        else {
            return Ok(());
        };
        if disk_bytenr == 0 || fe.ty != FILE_EXTENT_REG || fe.generation < t.transid {
            return Ok(());
        }
        let ss = t.fs.info.sectorsize as u64;
        let (start, len) = if fe.compression != 0 {
            (disk_bytenr, disk_num_bytes)
        } else {
            let s = disk_bytenr + offset / ss * ss;
            (
                s,
                (disk_bytenr + offset + num_bytes).next_multiple_of(ss) - s,
            )
        };
        let n = (len / ss) as usize;
        let sums = t.fs.info.lookup_csums(start, n)?;
        let per_item = t.csums_per_item().max(1);
        let buf = self.subvols.entry(root).or_default();
        // Runs of present checksums, cut at the item size limit; an item the log has
        // at the same address is replaced, and any overlapping one is cut away.
        let mut i = 0;
        while i < n {
            if sums[i].is_none() {
                i += 1;
                continue;
            }
            let mut j = i;
            let mut data = Vec::new();
            while j < n && j - i < per_item {
                match &sums[j] {
                    Some(c) => data.extend_from_slice(c),
                    None => break,
                }
                j += 1;
            }
            let a = start + i as u64 * ss;
            let b = start + j as u64 * ss;
            let key = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, a);
            if buf.items.get(&key) == Some(&data) {
                // Logged by an earlier fsync: nothing to rewrite.
                i = j;
                continue;
            }
            trim_csums(buf, a, b, t.fs.info.csum_type.size(), ss);
            buf.set(key, data);
            self.copy.stats.items_logged += 1;
            i = j;
        }
        Ok(())
    }

    /// Writes the changed log trees and points the primary superblock at them;
    /// returns a reason to commit instead when the log cannot be written.
    fn sync(&mut self, t: &mut Trans) -> Result<Fallback> {
        self.read_supers(t)?;
        let mut garbage = Vec::new();
        let subvols: Vec<u64> = self.subvols.keys().copied().collect();
        for id in subvols {
            let buf = self.subvols.get_mut(&id).ok_or_else(|| {
                Error::corrupt(format!("internal: log of subvolume {id} vanished"))
            })?;
            let Some((bytenr, level)) = write_tree(t, buf, &mut garbage, &mut self.copy.stats)?
            else {
                return Ok(Some(SPACE_SHORT));
            };
            // Unchanged roots give the same item, which `set` leaves alone.
            let ns = t.fs.info.nodesize as u64;
            let mut r = RootItem::default();
            r.inode.generation = 1;
            r.inode.size = 3;
            r.inode.nlink = 1;
            r.inode.nbytes = ns;
            r.inode.mode = S_IFDIR | 0o755;
            r.bytenr = bytenr;
            r.level = level;
            r.generation = t.transid;
            r.generation_v2 = t.transid;
            self.root_tree.set(log_root_key(id), r.to_bytes());
        }
        let Some((top, top_level)) =
            write_tree(t, &mut self.root_tree, &mut garbage, &mut self.copy.stats)?
        else {
            return Ok(Some(SPACE_SHORT));
        };
        flush_all(t)?;
        for (devid, sb) in &mut self.supers {
            sb.log_root = top;
            sb.log_root_level = top_level;
            sb.bytenr = SUPER_INFO_OFFSET;
            let bytes = sb.to_bytes();
            let dev =
                t.fs.info
                    .devices
                    .get(devid)
                    .ok_or_else(|| Error::Invalid(format!("devid {devid} missing")))?;
            dev.write_at(SUPER_INFO_OFFSET, &bytes).map_err(|e| {
                Error::io(format!("writing the log superblock on {}", dev.name()), e)
            })?;
            self.copy.stats.bytes_written += bytes.len() as u64;
        }
        flush_all(t)?;
        // Durable: what the previous log used and this one does not is free now.
        for b in std::mem::take(&mut self.garbage) {
            if t.alloc.log_blocks.remove(&b) {
                t.alloc.release_unused(b, t.fs.info.nodesize as u64)?;
            }
        }
        self.garbage = garbage;
        Ok(None)
    }
}

fn log_root_key(subvol: u64) -> Key {
    Key::new(TREE_LOG_OBJECTID, ROOT_ITEM_KEY, subvol)
}

fn flush_all(t: &Trans) -> Result<()> {
    for d in t.fs.info.devices.values() {
        d.flush()
            .map_err(|e| Error::io(format!("flushing {}", d.name()), e))?;
    }
    Ok(())
}

/// What to do about an inode that the replay will take a name from (one in a logged
/// directory's changed range, or one another inode takes over).
enum Relink {
    /// Gone, or without a name left: nothing to keep.
    Nothing,
    /// Still linked elsewhere: log it, so the replay links it where it is now (an
    /// inode item that does not parse is logged too, and reported there).
    Log { dir: bool },
    /// A directory holding a subvolume's entry: a replay that did not link it
    /// where it is now would drop it with that entry, which no log holds.
    Commit(&'static str),
}

fn relink(t: &Trans, root: u64, ino: u64) -> Result<Relink> {
    let Some(b) = current_inode_bytes(t, root, ino)? else {
        return Ok(Relink::Nothing);
    };
    let Ok(i) = InodeItem::parse(&b) else {
        return Ok(Relink::Log { dir: false });
    };
    if i.nlink == 0 {
        return Ok(Relink::Nothing);
    }
    let dir = is_dir(i.mode);
    if dir && holds_subvol_entry(t, root, ino)? {
        return Ok(Relink::Commit("moved directory holding a subvolume entry"));
    }
    Ok(Relink::Log { dir })
}

/// Whether directory `dir` of tree `root` has a subvolume's entry (one DIR_INDEX
/// item per name: a walk of the directory's items).
fn holds_subvol_entry(t: &Trans, root: u64, dir: u64) -> Result<bool> {
    let ptr = t.root_ptr(root)?;
    for it in crate::tree::ctree::TreeIter::new(
        &t.fs.info,
        &ptr,
        Key::new(dir, DIR_INDEX_KEY, 0),
        Key::new(dir, DIR_INDEX_KEY, u64::MAX),
    )? {
        let it = it?;
        let k = it.key();
        let items = parse_dir_items(it.data())
            .map_err(|e| Error::corrupt(format!("tree {root} item {k}: {e}")))?;
        if items.iter().any(|d| d.location.ty == ROOT_ITEM_KEY) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn current_inode_bytes(t: &Trans, root: u64, ino: u64) -> Result<Option<Vec<u8>>> {
    let ptr = t.root_ptr(root)?;
    Ok(
        lookup_exact(&t.fs.info, &ptr, &Key::new(ino, INODE_ITEM_KEY, 0))?
            .map(|i| i.data().to_vec()),
    )
}

/// Items in [lo, hi] of a tree, read a leaf at a time after one search (seed 004:
/// the items of one leaf are copied in one batch).
fn copy_items(
    t: &Trans,
    ptr: &RootPtr,
    lo: Key,
    hi: Key,
    c: &mut Copier,
) -> Result<Vec<(Key, Vec<u8>)>> {
    copy_items_then(t, ptr, lo, hi, hi, c, |_| true)
}

/// What the item copies of one fsync share: the counters, and the leaf the last
/// copy ended in, of the tree it was found in (tree id, root block). The trees do
/// not change while one fsync logs (it holds the transaction shared), so a range
/// that lies inside that leaf is copied from it without a search: the inodes of
/// seed 004's directory sit side by side, a hundred to a leaf.
#[derive(Debug, Default)]
struct Copier {
    stats: LogStats,
    last_leaf: Option<(u64, u64, Arc<TreeBlock>)>,
}

/// The last leaf, when it holds every item of [lo, hi] there is: its first key at
/// or below `lo` (no earlier leaf has one) and its last key above `hi` (no later
/// leaf has one).
fn hinted_leaf(c: &Copier, ptr: &RootPtr, lo: &Key, hi: &Key) -> Option<Arc<TreeBlock>> {
    let (id, root, leaf) = c.last_leaf.as_ref()?;
    let n = leaf.nritems();
    // A leaf read through the cache was validated: its keys are in bounds.
    let inside = *id == ptr.id
        && *root == ptr.bytenr
        && n > 0
        && eb::item_key(&leaf.data, 0) <= *lo
        && eb::item_key(&leaf.data, n - 1) > *hi;
    inside.then(|| leaf.clone())
}

/// [`copy_items`], asking `go_on` with the items up to `split` whether to copy the
/// rest (still one search, or none when the last leaf holds the range).
fn copy_items_then(
    t: &Trans,
    ptr: &RootPtr,
    lo: Key,
    hi: Key,
    split: Key,
    c: &mut Copier,
    go_on: impl FnOnce(&[(Key, Vec<u8>)]) -> bool,
) -> Result<Vec<(Key, Vec<u8>)>> {
    let mut go_on = Some(go_on);
    let mut out = Vec::new();
    let mut path = match hinted_leaf(c, ptr, &lo, &hi) {
        Some(leaf) => {
            let slot = eb::bin_search(&leaf.data, &lo).unwrap_or_else(|s| s);
            crate::tree::ctree::Path {
                nodes: vec![(leaf, slot)],
            }
        }
        None => {
            c.stats.searches += 1;
            search_slot(&t.fs.info, ptr, &lo)?
        }
    };
    loop {
        let leaf = path.leaf().clone();
        let v = leaf.view();
        let bad = |e| Error::corrupt(format!("tree block {}: {e}", leaf.bytenr));
        let mut copied = false;
        // Item by item, stopping at `hi`: an inode's few items sit among a leaf's
        // hundreds (seed 004 logs 100,000 inodes this way).
        for slot in path.slot()..leaf.nritems() {
            let k = v.item_key(slot).map_err(bad)?;
            let stop = k > hi || (k > split && go_on.take().is_some_and(|f| !f(&out)));
            if stop {
                c.stats.leaf_copies += u64::from(copied);
                c.last_leaf = Some((ptr.id, ptr.bytenr, leaf.clone()));
                return Ok(out);
            }
            out.push((k, v.item_data(slot).map_err(bad)?.to_vec()));
            copied = true;
        }
        c.stats.leaf_copies += u64::from(copied);
        c.last_leaf = Some((ptr.id, ptr.bytenr, leaf.clone()));
        path.nodes[0].1 = leaf.nritems();
        // (A path made from the hint stops inside its leaf, above: it never gets
        // here, and next_leaf would end it, having no nodes above the leaf.)
        if !next_leaf(&t.fs.info, &mut path)? {
            return Ok(out);
        }
    }
}

/// The (key, data) of a leaf's items from `slot` on.
fn leaf_items(leaf: &crate::tree::TreeBlock, slot: usize) -> Result<Vec<(Key, &[u8])>> {
    let v = leaf.view();
    let bad = |e| Error::corrupt(format!("tree block {}: {e}", leaf.bytenr));
    (slot..leaf.nritems())
        .map(|s| Ok((v.item_key(s).map_err(bad)?, v.item_data(s).map_err(bad)?)))
        .collect()
}

/// The leaves holding keys in [lo, hi] of a tree, in key order.
fn range_leaves(t: &Trans, ptr: &RootPtr, lo: Key, hi: Key) -> Result<Vec<Arc<TreeBlock>>> {
    let mut out = Vec::new();
    let mut path = search_slot(&t.fs.info, ptr, &lo)?;
    loop {
        let leaf = path.leaf().clone();
        let n = leaf.nritems();
        if path.slot() < n {
            let first = leaf
                .view()
                .item_key(path.slot())
                .map_err(|e| Error::corrupt(format!("tree block {}: {e}", leaf.bytenr)))?;
            if first > hi {
                return Ok(out);
            }
            out.push(leaf.clone());
        }
        path.nodes[0].1 = n;
        if !next_leaf(&t.fs.info, &mut path)? {
            return Ok(out);
        }
    }
}

/// The holes of a regular file as explicit extent items (with NO_HOLES the tree has
/// none; the replay must still drop what a committed version had there).
fn holes_of(
    t: &Trans,
    ino: u64,
    inode: &InodeItem,
    extents: &[(u64, FileExtentItem)],
    from: u64,
) -> Vec<(Key, Vec<u8>)> {
    if t.fs.info.sb.incompat_flags & FEATURE_INCOMPAT_NO_HOLES == 0 {
        return Vec::new();
    }
    let ss = t.fs.info.sectorsize as u64;
    let ino_end = inode.size.next_multiple_of(ss);
    let mut out = Vec::new();
    let mut prev_end = from;
    let hole = |len: u64| FileExtentItem {
        generation: t.transid,
        ram_bytes: len,
        compression: 0,
        encryption: 0,
        other_encoding: 0,
        ty: FILE_EXTENT_REG,
        body: FileExtentBody::Regular {
            disk_bytenr: 0,
            disk_num_bytes: 0,
            offset: 0,
            num_bytes: len,
        },
    };
    for (off, fe) in extents {
        if *off > prev_end {
            out.push((
                Key::new(ino, EXTENT_DATA_KEY, prev_end),
                hole(off - prev_end),
            ));
        }
        let len = match &fe.body {
            FileExtentBody::Inline { .. } => fe.ram_bytes.next_multiple_of(ss),
            FileExtentBody::Regular { num_bytes, .. } => *num_bytes,
        };
        prev_end = prev_end.max(off + len);
    }
    if prev_end < ino_end {
        out.push((
            Key::new(ino, EXTENT_DATA_KEY, prev_end),
            hole(ino_end - prev_end),
        ));
    }
    out.into_iter().map(|(k, fe)| (k, fe.to_bytes())).collect()
}

/// Cuts the log's checksum items overlapping [a, b) so a new item can cover it.
fn trim_csums(buf: &mut LogBuf, a: u64, b: u64, csize: usize, ss: u64) {
    let lo = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0);
    let from = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, a);
    // The item before `a` may reach into the range.
    let mut hit: Vec<(Key, Vec<u8>)> = buf
        .items
        .range(lo..from)
        .next_back()
        .filter(|(k, d)| k.offset + (d.len() / csize) as u64 * ss > a)
        .map(|(k, d)| (*k, d.clone()))
        .into_iter()
        .collect();
    hit.extend(
        buf.items
            .range(from..Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, b))
            .map(|(k, d)| (*k, d.clone())),
    );
    for (k, d) in hit {
        buf.del(&k);
        let start = k.offset;
        let end = start + (d.len() / csize) as u64 * ss;
        if start < a {
            let n = ((a - start) / ss) as usize * csize;
            buf.set(k, d[..n].to_vec());
        }
        if end > b {
            let skip = ((b - start) / ss) as usize * csize;
            buf.set(
                Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, b),
                d[skip..].to_vec(),
            );
        }
    }
}

/// Writes the leaves of `buf` that changed and the nodes above them; returns the
/// root (None: no metadata space without a new chunk).
fn write_tree(
    t: &mut Trans,
    buf: &mut LogBuf,
    garbage: &mut Vec<u64>,
    stats: &mut LogStats,
) -> Result<Option<(u64, u8)>> {
    let ns = t.fs.info.nodesize as usize;
    let room = ns - HEADER_SIZE;
    if buf.leaves.is_empty() {
        buf.leaves.insert(Key::MIN, 0);
        buf.dirty.insert(Key::MIN);
    }
    let dirty: Vec<Key> = std::mem::take(&mut buf.dirty).into_iter().collect();
    let changed = !dirty.is_empty() || buf.root.is_none();
    for part in dirty {
        let Some(old) = buf.leaves.remove(&part) else {
            continue;
        };
        if old != 0 {
            garbage.push(old);
        }
        let next = buf.leaves.range(part..).next().map(|(k, _)| *k);
        let items: Vec<(Key, &Vec<u8>)> = match next {
            Some(n) => buf.items.range(part..n).map(|(k, v)| (*k, v)).collect(),
            None => buf.items.range(part..).map(|(k, v)| (*k, v)).collect(),
        };
        // Greedy packing: as many items per leaf as fit.
        let mut chunks: Vec<(usize, usize)> = Vec::new();
        let (mut s, mut used) = (0usize, 0usize);
        for (i, (_, v)) in items.iter().enumerate() {
            let need = ITEM_SIZE + v.len();
            if used + need > room && i > s {
                chunks.push((s, i));
                s = i;
                used = 0;
            }
            used += need;
        }
        if s < items.len() {
            chunks.push((s, items.len()));
        }
        if chunks.is_empty() {
            // An empty partition: its range joins the previous leaf's (the first
            // partition stays, possibly empty).
            if part == Key::MIN {
                buf.leaves.insert(part, 0);
            }
            continue;
        }
        for (ci, (a, b)) in chunks.into_iter().enumerate() {
            let key = if ci == 0 { part } else { items[a].0 };
            let Some(bytenr) = alloc_log_block(t)? else {
                return Ok(None);
            };
            let mut data = vec![0u8; ns];
            init_header(t, &mut data, bytenr, 0);
            let keys: Vec<Key> = items[a..b].iter().map(|(k, _)| *k).collect();
            let sizes: Vec<usize> = items[a..b].iter().map(|(_, v)| v.len()).collect();
            eb::leaf_insert_empty(&mut data, 0, &keys, &sizes);
            for (slot, (_, v)) in items[a..b].iter().enumerate() {
                eb::item_data_mut(&mut data, slot).copy_from_slice(v);
            }
            write_block(t, bytenr, data, stats)?;
            buf.leaves.insert(key, bytenr);
        }
    }
    if !changed {
        if let Some(r) = buf.root {
            return Ok(Some(r));
        }
    }
    // The leaves in key order, with their first keys.
    let mut level_ptrs: Vec<(Key, u64)> = Vec::new();
    let mut empty_root = None;
    for (part, &b) in &buf.leaves {
        if b == 0 {
            continue;
        }
        let first = buf.items.range(*part..).next().map(|(k, _)| *k);
        match first {
            Some(k) => level_ptrs.push((k, b)),
            None => empty_root = Some(b),
        }
    }
    if level_ptrs.is_empty() {
        // No items at all: an empty leaf is the root.
        let bytenr = match empty_root {
            Some(b) => b,
            None => {
                let Some(bytenr) = alloc_log_block(t)? else {
                    return Ok(None);
                };
                let mut data = vec![0u8; ns];
                init_header(t, &mut data, bytenr, 0);
                write_block(t, bytenr, data, stats)?;
                buf.leaves.insert(Key::MIN, bytenr);
                bytenr
            }
        };
        retire_nodes(buf, &BTreeSet::new(), garbage);
        buf.root = Some((bytenr, 0));
        return Ok(buf.root);
    }
    let per_node = (room / KEY_PTR_SIZE).max(2);
    let mut level = 0u8;
    let mut kept = BTreeSet::new();
    let mut nodes = HashMap::new();
    while level_ptrs.len() > 1 {
        level += 1;
        let mut up = Vec::new();
        for group in level_ptrs.chunks(per_node) {
            let ptrs = group.to_vec();
            let bytenr = match buf.nodes.get(&ptrs) {
                Some(&b) => b,
                None => {
                    let Some(bytenr) = alloc_log_block(t)? else {
                        return Ok(None);
                    };
                    let mut data = vec![0u8; ns];
                    init_header(t, &mut data, bytenr, level);
                    for (slot, (k, b)) in ptrs.iter().enumerate() {
                        eb::node_insert_ptr(&mut data, slot, k, *b, t.transid);
                    }
                    write_block(t, bytenr, data, stats)?;
                    bytenr
                }
            };
            kept.insert(bytenr);
            up.push((group[0].0, bytenr));
            nodes.insert(ptrs, bytenr);
        }
        level_ptrs = up;
    }
    retire_nodes(buf, &kept, garbage);
    buf.nodes = nodes;
    buf.root = Some((level_ptrs[0].1, level));
    Ok(buf.root)
}

/// Nodes of the previous write that this one does not use become garbage.
fn retire_nodes(buf: &mut LogBuf, kept: &BTreeSet<u64>, garbage: &mut Vec<u64>) {
    for (_, b) in buf.nodes.drain() {
        if !kept.contains(&b) {
            garbage.push(b);
        }
    }
}

fn init_header(t: &Trans, data: &mut [u8], bytenr: u64, level: u8) {
    eb::set_header(
        data,
        bytenr,
        t.transid,
        TREE_LOG_OBJECTID,
        level,
        &t.fs.info.sb.metadata_fsid(),
        &t.chunk_tree_uuid,
    );
}

/// A metadata block no committed tree and no log uses, held until the next commit
/// (None: none without a new chunk, which a log could not reference).
fn alloc_log_block(t: &mut Trans) -> Result<Option<u64>> {
    let ns = t.fs.info.nodesize as u64;
    let hint = t
        .alloc
        .last_alloc
        .get(&BLOCK_GROUP_METADATA)
        .copied()
        .unwrap_or(0);
    let Some(b) = t
        .alloc
        .find_free(&t.fs.info, BLOCK_GROUP_METADATA, ns, hint)?
    else {
        return Ok(None);
    };
    t.alloc.log_blocks.insert(b);
    t.fs.info.cache_forget(b);
    Ok(Some(b))
}

fn write_block(t: &Trans, bytenr: u64, mut data: Vec<u8>, stats: &mut LogStats) -> Result<()> {
    let flags = eb::flags(&data) | HEADER_FLAG_WRITTEN;
    eb::set_flags(&mut data, flags);
    ubtrfs_format::tree::finish_block(&mut data, t.fs.info.csum_type);
    let mut ctx = t.fs.info.check_ctx();
    ctx.super_generation = t.transid;
    check_header(&ctx, bytenr, &data, &Expect::default())
        .and_then(|_| check_block(&ctx, bytenr, &data, &Expect::default()))
        .map_err(|e| {
            Error::corrupt(format!(
                "refusing to write an invalid log block (a bug): {e}"
            ))
        })?;
    t.write_logical(bytenr, &data)?;
    stats.blocks_written += 1;
    stats.bytes_written += data.len() as u64;
    Ok(())
}
