//! What a mount serves: an image opened read-only, or a running write transaction
//! whose uncommitted state the reads see (the read-write mount).
//!
//! The read-write side is one [`Trans`] behind a reader-writer lock: reads share it,
//! each change takes it alone for the length of one engine call. Changes accumulate
//! in the running transaction, which is committed every `commit=` seconds, on
//! fsync/syncfs and at unmount. A commit holds the transaction only to end it; its
//! write-out runs with the lock released, while the next transaction takes changes. An error that may have left the transaction half
//! applied (an I/O error, corruption, no space) aborts it, as the kernel's
//! transaction abort does: the mount turns read-only and nothing more is committed,
//! so the image stays at its last commit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockWriteGuard};
use std::time::Duration;
use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::{
    now, CommitIo, Error, Filesystem, LogStats, Node, Reservation, Synced, Trans, TreeLog,
};

use crate::ops::errno;

/// Items a namespace change may touch (the kernel's btrfs_create reserves 5: inode
/// item, inode ref, dir item, dir index, a security xattr; a rename up to 11).
pub(crate) const DEFAULT_ITEMS: u64 = 11;
/// Orphans deleted in one change when the kernel forgets many inodes at once.
const EVICT_BATCH: usize = 16;

/// The engine behind a mount.
pub enum Engine {
    /// `-o ro`: the image never changes under the mount.
    ReadOnly(Arc<Filesystem>),
    /// Read-write: a running transaction.
    ReadWrite(Arc<Writer>),
}

impl Engine {
    /// Runs `f` on the filesystem as it stands (uncommitted changes included).
    pub fn read<R>(&self, f: impl FnOnce(&Filesystem) -> R) -> R {
        match self {
            Engine::ReadOnly(fs) => f(fs),
            Engine::ReadWrite(w) => w.read(f),
        }
    }

    /// [`Engine::read`] for a request about one file (its attributes, its data):
    /// only that file's delayed data is flushed first.
    pub fn read_node<R>(&self, node: Node, f: impl FnOnce(&Filesystem) -> R) -> R {
        match self {
            Engine::ReadOnly(fs) => f(fs),
            Engine::ReadWrite(w) => w.read_flushing(Some((node.root, node.ino)), f),
        }
    }

    /// [`Engine::read`] for what delayed data cannot change (xattrs, symlink
    /// targets): nothing is flushed.
    pub fn read_metadata<R>(&self, f: impl FnOnce(&Filesystem) -> R) -> R {
        match self {
            Engine::ReadOnly(fs) => f(fs),
            Engine::ReadWrite(w) => w.read_flushing(None, f),
        }
    }

    /// True for a read-write mount.
    pub fn writable(&self) -> bool {
        matches!(self, Engine::ReadWrite(_))
    }
}

/// The running transaction of a read-write mount.
pub struct Writer {
    trans: RwLock<Trans>,
    /// Set by a fatal error: no more changes, no more commits.
    aborted: AtomicBool,
    /// Changes made since the last commit.
    changes: AtomicU64,
    /// Changes begun since the mount started; never goes back (see
    /// [`Writer::change_seq`]).
    change_seq: AtomicU64,
    /// Wakes the commit thread early: to stop (unmount), or to commit now.
    stop: (Mutex<Wake>, Condvar),
    /// The committer was asked to commit the running transaction early (see
    /// [`Writer::commit_soon`]); cleared when a commit starts.
    kicked: AtomicBool,
    /// Unlinked inodes the kernel may still hold open: (tree, inode). They go when
    /// the kernel forgets them, or at unmount.
    orphans: Mutex<HashSet<(u64, u64)>>,
    /// Written data not yet given extents. Locked only with `trans` held for writing.
    delalloc: Mutex<Delalloc>,
    /// Bytes in `delalloc`, readable without its lock (readers flush when non-zero).
    delalloc_bytes: AtomicU64,
    /// The tree log fsyncs write (None: `-o notreelog`, every fsync commits).
    /// Locked only with `trans` held for writing.
    log: Mutex<Option<TreeLog>>,
    /// Held by a commit from its start to its end, the write-out included (which
    /// runs with `trans` released), and by fsync: so sync and fsync return only once
    /// everything before them is durable. Taken before `trans`, never while holding
    /// it.
    commit_serial: Mutex<()>,
    /// The periodic commit's interval in milliseconds (`commit=`; a remount may
    /// change it).
    commit_interval_ms: std::sync::atomic::AtomicU64,
}

/// Why the commit thread wakes before its timer.
#[derive(Debug, Default)]
struct Wake {
    /// Unmounting: the thread ends (the caller commits one last time).
    stopped: bool,
    /// Commit the running transaction now.
    commit: bool,
}

/// Dirty tree blocks a transaction holds before the committer is asked to commit it
/// (without waiting for `commit=`): bounds the memory a long transaction keeps (a
/// million new files make about 600 MiB of them), as the kernel writes dirty
/// metadata back and ends large transactions.
pub(crate) const DIRTY_METADATA_COMMIT_BYTES: usize = 256 << 20;

/// Tree blocks the mount's cleaner visits while holding the transaction (between two
/// commits): bounds how long a file operation can wait behind it.
const CLEANER_BLOCKS_PER_STEP: u64 = 1024;

/// What `Writer::write_data_once` answers (never a real errno, never sent) when a
/// quota limit refused the data and a commit might make room.
const QUOTA_RETRY: i32 = -1;

/// Most bytes of written data held before extents are allocated for them: the memory
/// a writing mount holds beyond the engine's caches.
pub(crate) const DELALLOC_BYTES_MAX: u64 = 8 << 20;

/// Free data space below which writes are not gathered but written at once. Held
/// data has no reservation that a new metadata chunk would respect (the kernel's
/// bytes_may_use): this margin keeps a metadata chunk of a small filesystem (a tenth
/// of it, twice for DUP) from taking the space a held run counts on. Not a proof for
/// large filesystems, whose metadata chunks are larger: the accounting is to come.
pub(crate) const DELALLOC_LOW_SPACE_BYTES: u64 = 128 << 20;

/// Data written to one file and not yet in the transaction: one contiguous run.
#[derive(Debug)]
struct Pending {
    start: u64,
    data: Vec<u8>,
    /// Time of the last write into the run (its mtime and ctime).
    time: Timespec,
}

/// Delayed allocation, as the kernel's delalloc: WRITE requests (at most 1 MiB each)
/// are gathered per file and written as one run when something else needs the file
/// or the transaction (any other request, a commit, a non-contiguous write, the
/// memory limit), so a sequential writer gets extents of up to
/// [`DELALLOC_BYTES_MAX`] rather than one per request.
#[derive(Debug, Default)]
struct Delalloc {
    files: HashMap<(u64, u64), Pending>,
    bytes: u64,
}

/// Errors that can leave a transaction half applied: abort it.
fn is_fatal(e: &Error) -> bool {
    matches!(
        e,
        Error::Io { .. } | Error::Corrupt(_) | Error::DataCsum(_) | Error::NoSpace(_)
    )
}

impl Writer {
    /// Serves `trans` (opened with [`Trans::open_paths`], which locks the devices).
    pub fn new(mut trans: Trans) -> Arc<Writer> {
        trans.defer_eviction = true;
        trans.quota_reserved_by_caller = true;
        // From the first change on: a directory's fsync then logs what changed
        // without comparing the directory with the last commit's.
        trans.track_log_changes();
        Arc::new(Writer {
            orphans: Mutex::new(HashSet::new()),
            delalloc: Mutex::new(Delalloc::default()),
            delalloc_bytes: AtomicU64::new(0),
            trans: RwLock::new(trans),
            aborted: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            change_seq: AtomicU64::new(0),
            stop: (Mutex::new(Wake::default()), Condvar::new()),
            kicked: AtomicBool::new(false),
            log: Mutex::new(Some(TreeLog::new())),
            commit_serial: Mutex::new(()),
            commit_interval_ms: std::sync::atomic::AtomicU64::new(30_000),
        })
    }

    /// Changes settings of the running transaction handle that take effect from
    /// the next change on (compression, flags of new files, max_inline, discard):
    /// the transaction's lock is held only for `f`.
    pub fn configure(&self, f: impl FnOnce(&mut Trans)) {
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        f(&mut t);
    }

    /// `-o treelog` on a remount of a `notreelog` mount: commits first, so the new
    /// log starts from a committed state, then fsync writes the tree log again.
    pub fn enable_tree_log(&self) -> Result<(), i32> {
        if self.log.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return Ok(());
        }
        self.commit()?;
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.is_none() {
            *log = Some(TreeLog::new());
        }
        Ok(())
    }

    /// Sets the periodic commit's interval (the committer picks it up at once).
    pub fn set_commit_interval(&self, interval: Duration) {
        let ms = interval.as_millis().clamp(1, u64::MAX as u128) as u64;
        self.commit_interval_ms.store(ms, Ordering::Release);
        // Under the committer's lock, so it cannot have read the old interval and
        // not be waiting yet (the wakeup would be lost).
        let _g = self.stop.0.lock().unwrap_or_else(|p| p.into_inner());
        self.stop.1.notify_all();
    }

    fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.commit_interval_ms.load(Ordering::Acquire))
    }

    /// `-o notreelog`: fsync commits the transaction (the kernel's option of the
    /// same name).
    pub fn disable_tree_log(&self) {
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The tree log's counters (None with `-o notreelog`).
    pub fn log_stats(&self) -> Option<LogStats> {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|l| l.stats().clone())
    }

    /// fsync/fdatasync of one inode: durable when it returns Ok. Written through the
    /// tree log (only that inode's changes, no commit), or a commit where the log
    /// cannot say it (tree_log/log.rs) or with `-o notreelog`.
    pub fn fsync(&self, root: u64, ino: u64, datasync: bool) -> Result<(), i32> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EIO);
        }
        // After a commit being written (the log replays over it; and what it
        // holds may be this file's).
        let _serial = self.commit_serial.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        if self.changes.load(Ordering::Acquire) == 0
            && self.delalloc_bytes.load(Ordering::Acquire) == 0
        {
            // Nothing since the last commit: durable already.
            return Ok(());
        }
        self.flush(&mut t)?;
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let Some(log) = log.as_mut() else {
            return self.commit_locked(&mut t);
        };
        match log.fsync(&mut t, root, ino, datasync) {
            Ok(Synced::Logged) => Ok(()),
            Ok(Synced::Committed(_)) => {
                self.changes.store(0, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                self.abort(&format!("fsync of inode {ino} (tree log): {e}"));
                Err(errno::EIO)
            }
        }
    }

    /// Runs `f` on the filesystem with the transaction's changes visible (written
    /// data waiting for extents is flushed first).
    pub fn read<R>(&self, f: impl FnOnce(&Filesystem) -> R) -> R {
        if self.delalloc_bytes.load(Ordering::Acquire) > 0 {
            let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
            // On failure the mount is aborted (logged); reads go on from what is there.
            let _ = self.flush(&mut t);
        }
        let t = self.trans.read().unwrap_or_else(|p| p.into_inner());
        f(&t.fs)
    }

    /// [`Writer::read`], flushing only the delayed data of `only` (none for `None`).
    pub fn read_flushing<R>(
        &self,
        only: Option<(u64, u64)>,
        f: impl FnOnce(&Filesystem) -> R,
    ) -> R {
        if let Some(key) = only {
            if self.delalloc_bytes.load(Ordering::Acquire) > 0 {
                let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
                let _ = self.flush_where(&mut t, |k| k == key);
            }
        }
        let t = self.trans.read().unwrap_or_else(|p| p.into_inner());
        f(&t.fs)
    }

    /// Writes every pending run into the transaction. A failure aborts the mount:
    /// data the writer was told was written cannot be kept.
    fn flush(&self, t: &mut Trans) -> Result<(), i32> {
        self.flush_where(t, |_| true)
    }

    /// Writes the pending runs of the files `which` picks.
    fn flush_where(&self, t: &mut Trans, which: impl Fn((u64, u64)) -> bool) -> Result<(), i32> {
        let mut d = self.delalloc.lock().unwrap_or_else(|p| p.into_inner());
        if d.files.is_empty() {
            return Ok(());
        }
        let keys: Vec<(u64, u64)> = d.files.keys().copied().filter(|k| which(*k)).collect();
        let mut files = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(p) = d.files.remove(&k) {
                d.bytes -= p.data.len() as u64;
                files.push((k, p));
            }
        }
        self.delalloc_bytes.store(d.bytes, Ordering::Release);
        drop(d);
        for ((root, ino), p) in files {
            if let Err(e) = t.write(root, ino, p.start, &p.data, p.time) {
                self.abort(&format!("writing delayed data of inode {ino}: {e}"));
                return Err(e.errno());
            }
        }
        Ok(())
    }

    /// A WRITE request: `data` at `offset` of regular file `ino`, gathered with the
    /// file's pending run when it continues it (delayed allocation), else after that
    /// run is written. ENOSPC, with nothing changed, when the data could not get
    /// extents later. `page_cache`: the kernel writes back pages a program already
    /// stored into (a shared mmap), which may use the data reserve kept for that
    /// ([`Reservation::page_cache`]).
    ///
    /// Returns the bytes taken: all of `data`, or, when a quota limit leaves room
    /// for only part of it, the whole sectors that fit (a short write, as the
    /// kernel's buffered write stops at the chunk its reservation refused; the
    /// caller's next write gets EDQUOT). Page-cache write-back is all or nothing.
    pub fn write_data(
        &self,
        root: u64,
        ino: u64,
        offset: u64,
        data: &[u8],
        page_cache: bool,
    ) -> Result<usize, i32> {
        if data.is_empty() {
            return Ok(0);
        }
        let r = match self.write_data_once(root, ino, offset, data, page_cache, true) {
            // Over a quota limit counting what this transaction wrote: the kernel's
            // try_flush_qgroup commits and asks again, since what the transaction
            // freed (a file just removed) counts only once committed.
            Err(QUOTA_RETRY) => {
                self.commit()?;
                self.write_data_once(root, ino, offset, data, page_cache, false)
            }
            r => r,
        };
        match r {
            Ok(()) => Ok(data.len()),
            Err(QUOTA_RETRY) | Err(libc::EDQUOT) if !page_cache => {
                let fits = self.quota_short_write(root, offset, data.len())?;
                if fits == 0 {
                    return Err(libc::EDQUOT);
                }
                match self.write_data_once(root, ino, offset, &data[..fits], false, false) {
                    Ok(()) => Ok(fits),
                    Err(QUOTA_RETRY) => Err(libc::EDQUOT),
                    Err(e) => Err(e),
                }
            }
            Err(QUOTA_RETRY) => Err(libc::EDQUOT),
            Err(e) => Err(e),
        }
    }

    /// How much of a `len`-byte write at `offset` fits under the quota limits now:
    /// up to a sector boundary of the file, less than `len`.
    fn quota_short_write(&self, root: u64, offset: u64, len: usize) -> Result<usize, i32> {
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        let Some(room) = t.qgroup_headroom(root).map_err(|e| e.errno())? else {
            return Ok(0);
        };
        let ss = t.fs.info.sectorsize as u64;
        let end = (offset + room.min((len as u64).saturating_sub(1))) / ss * ss;
        Ok(end.saturating_sub(offset) as usize)
    }

    fn write_data_once(
        &self,
        root: u64,
        ino: u64,
        offset: u64,
        data: &[u8],
        page_cache: bool,
        may_retry: bool,
    ) -> Result<(), i32> {
        let reservation = |len| {
            if page_cache {
                Reservation::page_cache_write(len)
            } else {
                Reservation::write(len)
            }
        };
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
        }
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
        }
        let key = (root, ino);
        let len = data.len() as u64;
        let mut d = self.delalloc.lock().unwrap_or_else(|p| p.into_inner());
        let continues = d.files.get(&key).is_some_and(|p| {
            p.start + p.data.len() as u64 == offset
                && p.data.len() as u64 + len <= DELALLOC_BYTES_MAX
        });
        if !continues {
            if let Some(p) = d.files.remove(&key) {
                d.bytes -= p.data.len() as u64;
                self.delalloc_bytes.store(d.bytes, Ordering::Release);
                if let Err(e) = t.write(root, ino, p.start, &p.data, p.time) {
                    self.abort(&format!("writing delayed data of inode {ino}: {e}"));
                    return Err(e.errno());
                }
            }
            // Checked now, not when the run is written: the kernel never sends WRITE
            // for anything else, but a bad request must not poison the buffer.
            let inode = t.read_inode(root, ino).map_err(|e| e.errno())?;
            if inode.mode & 0o170000 != 0o100000 {
                return Err(errno::EINVAL);
            }
        }
        // Near full, no gathering: a reservation here holds nothing, so a metadata
        // chunk allocated meanwhile could take the space the pending data counted on,
        // and a run that cannot be written after its WRITE was answered loses data.
        // Write through instead, reserved and allocated in one step, as without
        // delayed allocation.
        // Quota limits answer at WRITE (EDQUOT), before the data is accepted.
        match t.qgroup_reserve(root, len) {
            Ok(()) => {}
            Err(Error::QuotaExceeded(_)) if may_retry && self.commit_may_free(&t) => {
                return Err(QUOTA_RETRY);
            }
            Err(e) => return Err(e.errno()),
        }
        if t.data_available_bytes() < DELALLOC_LOW_SPACE_BYTES + 2 * (d.bytes + len) {
            drop(d);
            self.flush(&mut t)?;
            match t.reserve(reservation(len)) {
                Ok(()) => {}
                Err(Error::NoSpace(_)) => return Err(errno::ENOSPC),
                Err(e) => {
                    self.abort(&format!("write: {e}"));
                    return Err(e.errno());
                }
            }
            self.changes.fetch_add(1, Ordering::Relaxed);
            return t.write(root, ino, offset, data, now()).map_err(|e| {
                if is_fatal(&e) {
                    self.abort(&format!("write: {e}"));
                }
                e.errno()
            });
        }
        // Room for this run and every other pending one, as when they are written.
        match t.reserve(reservation(d.bytes + len)) {
            Ok(()) => {}
            Err(Error::NoSpace(_)) => return Err(errno::ENOSPC),
            Err(e) => {
                self.abort(&format!("write: {e}"));
                return Err(e.errno());
            }
        }
        let p = d.files.entry(key).or_insert_with(|| Pending {
            start: offset,
            // Room for eight such writes at once: a streaming writer's run would
            // otherwise be copied again at every doubling (7 MiB for 8).
            data: Vec::with_capacity(len.saturating_mul(8).min(DELALLOC_BYTES_MAX) as usize),
            time: now(),
        });
        p.data.extend_from_slice(data);
        p.time = now();
        d.bytes += len;
        self.delalloc_bytes.store(d.bytes, Ordering::Release);
        self.changes.fetch_add(1, Ordering::Relaxed);
        // Over the limit: write the largest runs first (the writer that has gathered
        // most), keeping the others gathering.
        while d.bytes > DELALLOC_BYTES_MAX {
            let Some(largest) = d
                .files
                .iter()
                .max_by_key(|(_, p)| p.data.len())
                .map(|(k, _)| *k)
            else {
                break;
            };
            drop(d);
            self.flush_where(&mut t, |k| k == largest)?;
            d = self.delalloc.lock().unwrap_or_else(|p| p.into_inner());
        }
        drop(d);
        self.commit_soon_if_needed(&t);
        Ok(())
    }

    /// Charges what a change is about to add to subvolume `root` against its
    /// qgroups' limits, before the change runs: `bytes` (computed with the
    /// transaction held: the data a preallocation will allocate) plus `items` tree
    /// items of metadata, a node each, as the kernel's btrfs_start_transaction
    /// reserves (num_items * nodesize) for quotas. The charge lasts until the
    /// commit, like the kernel's per-transaction reservation. Over a limit, when
    /// the running transaction holds anything, it is committed and the charge asked
    /// again (the kernel's try_flush_qgroup: what was freed counts once committed,
    /// and the transaction's charges end); then EDQUOT. Nothing to do without
    /// limits.
    pub fn charge_quota(
        &self,
        root: u64,
        items: u64,
        bytes: impl Fn(&Trans) -> ubtrfs_core::Result<u64>,
    ) -> Result<(), i32> {
        // Every create passes here: without quotas, a shared look is enough.
        if !self
            .trans
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .quotas_enabled()
        {
            return Ok(());
        }
        for first in [true, false] {
            if self.aborted.load(Ordering::Acquire) {
                return Err(errno::EROFS);
            }
            let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
            if !t.quota_limits_set().map_err(|e| e.errno())? {
                return Ok(());
            }
            let want = bytes(&t).map_err(|e| e.errno())? + items * t.fs.info.nodesize as u64;
            match t.qgroup_reserve(root, want) {
                Ok(()) => return Ok(()),
                Err(Error::QuotaExceeded(_)) if first && self.commit_may_free(&t) => {
                    drop(t);
                    self.commit()?;
                }
                Err(e) => return Err(e.errno()),
            }
        }
        Err(libc::EDQUOT)
    }

    /// Whether a commit could change what quotas allow: the running transaction
    /// holds changes (frees it accounts, charges it ends) or one is being written.
    fn commit_may_free(&self, t: &Trans) -> bool {
        self.changes.load(Ordering::Acquire) > 0 || t.commit_in_flight()
    }

    /// Runs one change that touches a few items and writes no data (a create, a
    /// rename, a setattr): [`Writer::change_reserved`] with the kernel's item count for
    /// such operations.
    pub fn change<R>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Trans) -> ubtrfs_core::Result<R>,
    ) -> Result<R, i32> {
        self.change_reserved(what, Reservation::items(DEFAULT_ITEMS), f)
    }

    /// Runs one change, after making sure the space it may need is there (ENOSPC
    /// otherwise, with nothing changed). EROFS once aborted; a fatal error aborts
    /// (logged once).
    pub fn change_reserved<R>(
        &self,
        what: &str,
        need: Reservation,
        f: impl FnOnce(&mut Trans) -> ubtrfs_core::Result<R>,
    ) -> Result<R, i32> {
        self.change_inner(what, need, true, f)
    }

    /// A change of inode items alone that written data waiting for extents does not
    /// need to precede (an access time: that data's later write keeps it), so the
    /// delayed runs stay whole.
    pub fn change_inode_only<R>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Trans) -> ubtrfs_core::Result<R>,
    ) -> Result<R, i32> {
        self.change_inner(what, Reservation::items(1), false, f)
    }

    fn change_inner<R>(
        &self,
        what: &str,
        need: Reservation,
        flush_first: bool,
        f: impl FnOnce(&mut Trans) -> ubtrfs_core::Result<R>,
    ) -> Result<R, i32> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
        }
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
        }
        self.change_seq.fetch_add(1, Ordering::AcqRel);
        if flush_first {
            self.flush(&mut t)?;
        }
        match t.reserve(need) {
            Ok(()) => {}
            // Refused before anything changed: the mount goes on.
            Err(Error::NoSpace(_)) => return Err(errno::ENOSPC),
            Err(e) => {
                // The commit that would have freed space failed.
                self.abort(&format!("{what}: {e}"));
                return Err(e.errno());
            }
        }
        let r = f(&mut t);
        self.commit_soon_if_needed(&t);
        let orphaned = t.take_orphans();
        if !orphaned.is_empty() {
            self.orphans
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(orphaned);
        }
        match r {
            Err(e) if is_fatal(&e) => {
                self.abort(&format!("{what}: {e}"));
                Err(e.errno())
            }
            // Other errors are found before anything changes (ENOENT, EEXIST, ...), but
            // the engine may have CoWed blocks on the way: they commit harmlessly.
            r => {
                self.changes.fetch_add(1, Ordering::Relaxed);
                r.map_err(|e| e.errno())
            }
        }
    }

    /// How many changes have begun since the mount started, counted under the
    /// transaction's write lock. A reply built from what it read while this stayed the
    /// same holds no attribute that a change has since replaced.
    pub fn change_seq(&self) -> u64 {
        self.change_seq.load(Ordering::Acquire)
    }

    /// The kernel forgot these inodes (root, inode): those unlinked while held are
    /// deleted now, 16 to a change (`EVICT_BATCH`), so an `rm` of many files (a
    /// BATCH_FORGET) takes the transaction once per group instead of once per file.
    pub fn forgotten(&self, nodes: &[(u64, u64)]) {
        let gone: Vec<(u64, u64)> = {
            let mut o = self.orphans.lock().unwrap_or_else(|p| p.into_inner());
            nodes.iter().copied().filter(|k| o.remove(k)).collect()
        };
        let evict = |group: &[(u64, u64)]| {
            let items = DEFAULT_ITEMS * group.len() as u64;
            self.change_reserved("evict", Reservation::freeing(items), |t| {
                group
                    .iter()
                    .try_for_each(|&(root, ino)| t.evict_orphan(root, ino))
            })
        };
        for group in gone.chunks(EVICT_BATCH) {
            // A group reserves a single inode's space times its size. Near full only
            // one at a time may fit: ENOSPC changed nothing, so each is tried alone
            // (before this, a full filesystem kept every batched orphan until the
            // next mount, and writing after an `rm` of 48,300 small files met ENOSPC
            // after 2,000 new ones). As for one inode: a failed eviction leaves its
            // ORPHAN_ITEM on disk, which the next mount's orphan cleanup deletes.
            if evict(group) == Err(errno::ENOSPC) && group.len() > 1 {
                for one in group.chunks(1) {
                    let _ = evict(one);
                }
            }
        }
    }

    /// Unmounting: deletes the inodes still orphaned, then commits.
    pub fn finish(&self) -> Result<(), i32> {
        let left: Vec<(u64, u64)> = self
            .orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        for (root, ino) in left {
            self.change_reserved("evict", Reservation::freeing(DEFAULT_ITEMS), |t| {
                t.evict_orphan(root, ino)
            })?;
        }
        self.commit()
    }

    fn abort(&self, why: &str) {
        if !self.aborted.swap(true, Ordering::AcqRel) {
            eprintln!(
                "ubtrfs: transaction aborted ({why}); the mount is read-only from now on \
                 and the image stays at its last commit"
            );
        }
    }

    /// True once a fatal error turned the mount read-only.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Commits the running transaction if anything changed (sync, the timer,
    /// unmount). Durable when it returns Ok.
    ///
    /// The transaction is held only to end it ([`Trans::commit_start`]: delayed
    /// data, delayed refs, the tree updates) and to finish; the write-out, flushes
    /// and superblock included, runs with it released, so file operations and reads
    /// go on in the next transaction meanwhile (as on the kernel, whose commit lets
    /// new transactions start before it writes the tree blocks).
    pub fn commit(&self) -> Result<(), i32> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EIO);
        }
        let _serial = self.commit_serial.lock().unwrap_or_else(|p| p.into_inner());
        let t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        if self.changes.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.commit_held(t, "commit", |_| Ok(()))
    }

    /// Commits the transaction `t` (write-locked; the caller holds `commit_serial`):
    /// delayed data, then `step` (the cleaner's part of a dead tree), then the
    /// commit's start; its write-out runs with `t` released. An early commit asked
    /// for ([`Writer::commit_soon`]) is answered by this one. A failure aborts, named
    /// by `what`.
    fn commit_held(
        &self,
        mut t: RwLockWriteGuard<'_, Trans>,
        what: &str,
        step: impl FnOnce(&mut Trans) -> ubtrfs_core::Result<()>,
    ) -> Result<(), i32> {
        self.changes.store(0, Ordering::Release);
        self.kicked.store(false, Ordering::Release);
        self.flush(&mut t)?;
        let io = match step(&mut t).and_then(|_| t.commit_start()) {
            Ok(Some(io)) => io,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.abort(&format!("{what}: {e}"));
                return Err(errno::EIO);
            }
        };
        drop(t);
        self.write_out(&io, what)
    }

    /// Writes a started commit with the transaction released, then finishes it.
    /// The caller holds `commit_serial`.
    fn write_out(&self, io: &CommitIo, what: &str) -> Result<(), i32> {
        let written = io.run();
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = written.and_then(|_| t.commit_finish()) {
            self.abort(&format!("{what}: {e}"));
            return Err(errno::EIO);
        }
        self.retire_log(&t);
        Ok(())
    }

    /// The log of the committed transaction is obsolete: freed now, off the next
    /// fsync's path. (An fsync holding the log waits for the transaction: never
    /// wait for the log here.)
    fn retire_log(&self, t: &Trans) {
        if let Ok(mut g) = self.log.try_lock() {
            if let Some(l) = g.as_mut() {
                l.retire(t.transid);
            }
        }
    }

    /// FITRIM: commits (so what the transaction freed is free on disk too), then
    /// trims with the transaction held and no commit in flight ([`Trans::trim`]).
    pub fn trim(&self, start: u64, len: u64, minlen: u64) -> Result<u64, i32> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
        }
        let _serial = self.commit_serial.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        self.commit_locked(&mut t)?;
        t.trim(start, len, minlen)
            .map(|r| r.trimmed_bytes)
            .map_err(|e| e.errno())
    }

    /// A tool's whole run on the engine (`ubtrfs dedupe` or `cp` through the
    /// mount): with the transaction held and no commit in flight, delayed data is
    /// written and committed (the tool reads what files hold), then `f` runs, then
    /// (`commit_after`) what it changed is committed. Warnings it met (ranges that
    /// could not be read) are logged as the offline commands print them. A fatal
    /// error aborts, named by `what`.
    pub fn exclusive<R>(
        &self,
        what: &str,
        commit_after: bool,
        f: impl FnOnce(&mut Trans) -> ubtrfs_core::Result<R>,
    ) -> Result<R, i32> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
        }
        let _serial = self.commit_serial.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        self.commit_locked(&mut t)?;
        let r = f(&mut t);
        for w in t.fs.info.take_warnings() {
            eprintln!("ubtrfs: {what}: warning: {w}");
        }
        match r {
            Ok(out) => {
                if commit_after {
                    self.commit_locked(&mut t)?;
                }
                self.retire_log(&t);
                Ok(out)
            }
            Err(e) if is_fatal(&e) => {
                self.abort(&format!("{what}: {e}"));
                Err(errno::EIO)
            }
            Err(e) => Err(e.errno()),
        }
    }

    /// Commits, with the transaction held: delayed data first; a failure aborts.
    fn commit_locked(&self, t: &mut Trans) -> Result<(), i32> {
        self.changes.store(0, Ordering::Release);
        self.flush(t)?;
        t.commit().map_err(|e| {
            self.abort(&format!("commit: {e}"));
            errno::EIO
        })?;
        self.retire_log(t);
        Ok(())
    }

    /// After a change: asks the committer to commit now when the transaction holds
    /// more than [`DIRTY_METADATA_COMMIT_BYTES`] of dirty tree blocks, or allocated a
    /// chunk. The latter because an fsync in a transaction that created a block
    /// group must commit (the log could point into a chunk the committed chunk tree
    /// does not map; the kernel's btrfs_make_block_group forces the same full
    /// commit): committed soon after, later fsyncs are logged again.
    fn commit_soon_if_needed(&self, t: &Trans) {
        if self.kicked.load(Ordering::Acquire) {
            return;
        }
        if t.dirty_bytes() > DIRTY_METADATA_COMMIT_BYTES || t.chunks_allocated() {
            self.commit_soon();
        }
    }

    /// Wakes the committer to commit the running transaction now, not at its timer.
    pub fn commit_soon(&self) {
        self.kicked.store(true, Ordering::Release);
        let (lock, cv) = &self.stop;
        lock.lock().unwrap_or_else(|p| p.into_inner()).commit = true;
        cv.notify_all();
    }

    /// Commits every `interval` until [`Writer::stop`] (the kernel's commit= timer),
    /// and at once when [`Writer::commit_soon`] asks.
    pub fn spawn_committer(self: &Arc<Self>, interval: Duration) -> std::thread::JoinHandle<()> {
        self.set_commit_interval(interval);
        let w = Arc::clone(self);
        std::thread::spawn(move || {
            let (lock, cv) = &w.stop;
            let mut wake = lock.lock().unwrap_or_else(|p| p.into_inner());
            let mut last = std::time::Instant::now();
            while !wake.stopped {
                let now = std::time::Instant::now();
                // Read each round: a remount may have changed it.
                let deadline = last + w.commit_interval();
                if !wake.commit && now < deadline {
                    let (g, _) = cv
                        .wait_timeout(wake, deadline - now)
                        .unwrap_or_else(|p| p.into_inner());
                    wake = g;
                    continue;
                }
                wake.commit = false;
                drop(wake);
                let _ = w.commit();
                w.clean();
                last = std::time::Instant::now();
                wake = lock.lock().unwrap_or_else(|p| p.into_inner());
            }
        })
    }

    /// The cleaner (the kernel's cleaner thread): drops the trees of deleted
    /// subvolumes a step at a time, committing after each step with the transaction
    /// released in between, so file operations go on meanwhile. Returns at unmount
    /// or when nothing is left; every step's position is saved, so a drop cut short
    /// resumes at the next mount (or in the kernel).
    pub fn clean(&self) {
        loop {
            let stopping = self
                .stop
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .stopped;
            if stopping || self.is_aborted() {
                return;
            }
            let _serial = self.commit_serial.lock().unwrap_or_else(|p| p.into_inner());
            let t = self.trans.write().unwrap_or_else(|p| p.into_inner());
            let Ok(dead) = t.dead_roots() else { return };
            let Some(&id) = dead.first() else { return };
            let what = format!("dropping deleted subvolume {id}");
            let step = |t: &mut Trans| {
                t.drop_dead_root_step(id, CLEANER_BLOCKS_PER_STEP)
                    .map(|_| ())
            };
            if self.commit_held(t, &what, step).is_err() {
                return;
            }
        }
    }

    /// Deleted subvolumes whose trees the cleaner has not dropped yet.
    pub fn dead_roots(&self) -> Result<Vec<u64>, i32> {
        let t = self.trans.read().unwrap_or_else(|p| p.into_inner());
        t.dead_roots().map_err(|e| e.errno())
    }

    /// Stops the commit thread (the caller commits one last time).
    pub fn stop(&self) {
        let (lock, cv) = &self.stop;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stopped = true;
        cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use ubtrfs_core::format::consts::{FIRST_FREE_OBJECTID, FS_TREE_OBJECTID};
    use ubtrfs_core::tools::mkfs::{make_filesystem, MkfsOptions};
    use ubtrfs_core::{Device, FsInfo, MemDevice, NewInode, OpenOptions};

    /// A device whose flushes wait while the gate is closed: holds a commit inside
    /// its write-out.
    #[derive(Debug)]
    struct GateDevice {
        inner: Arc<MemDevice>,
        closed: Mutex<bool>,
        cv: Condvar,
        waiting: AtomicUsize,
    }

    impl GateDevice {
        fn set(&self, closed: bool) {
            *self.closed.lock().unwrap() = closed;
            self.cv.notify_all();
        }
    }

    impl Device for GateDevice {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.inner.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.inner.write_at(offset, buf)
        }
        fn flush(&self) -> std::io::Result<()> {
            let mut closed = self.closed.lock().unwrap();
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while *closed {
                closed = self.cv.wait(closed).unwrap();
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            self.inner.flush()
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn name(&self) -> String {
            "gate".into()
        }
    }

    fn file(t: &mut Trans, name: &[u8]) -> ubtrfs_core::Result<u64> {
        let attr = NewInode {
            mode: 0o100644,
            uid: 0,
            gid: 0,
            rdev: 0,
            time: now(),
        };
        t.create(FS_TREE_OBJECTID, FIRST_FREE_OBJECTID, name, attr)
    }

    /// A commit held inside its write-out (its flush does not return) does not
    /// stop the mount: a change and a read complete meanwhile, in the next
    /// transaction; the commit then returns, and the next one makes the change
    /// durable too.
    #[test]
    fn operations_go_on_while_a_commit_is_written() {
        let mem = MemDevice::new(vec![0u8; 160 << 20], "mem");
        let gate = Arc::new(GateDevice {
            inner: mem.clone(),
            closed: Mutex::new(false),
            cv: Condvar::new(),
            waiting: AtomicUsize::new(0),
        });
        let t = make_filesystem(gate.clone() as Arc<dyn Device>, &MkfsOptions::default())
            .expect("mkfs");
        let w = Writer::new(t);
        w.change("create a", |t| file(t, b"a")).expect("create a");
        w.write_data(FS_TREE_OBJECTID, 257, 0, &[7u8; 100_000], false)
            .map(|_| ())
            .expect("write a");
        gate.set(true);
        let committer = {
            let w = Arc::clone(&w);
            std::thread::spawn(move || w.commit())
        };
        while gate.waiting.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // The commit is inside its write-out: the mount goes on.
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let w = Arc::clone(&w);
            std::thread::spawn(move || {
                let b = w.change("create b", |t| file(t, b"b"));
                let names = w.read(|fs| {
                    fs.readdir(fs.top())
                        .map(|v| v.into_iter().map(|e| e.name).collect::<Vec<_>>())
                });
                let size = w.read(|fs| fs.stat(ubtrfs_core::Node::new(FS_TREE_OBJECTID, 257)));
                let _ = tx.send((b, names, size.map(|s| s.size)));
            });
        }
        let Ok((b, names, size)) = rx.recv_timeout(Duration::from_secs(20)) else {
            gate.set(false);
            panic!("a change and a read waited for the commit's write-out");
        };
        assert_eq!(names.expect("readdir"), vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(size.expect("stat a"), 100_000);
        let b = b.expect("create b");
        assert!(!committer.is_finished(), "the commit waits for its flush");
        gate.set(false);
        committer.join().expect("committer").expect("commit");
        w.commit().expect("second commit");
        let copy = MemDevice::new(mem.snapshot(), "copy");
        let info = FsInfo::open(vec![copy as Arc<dyn Device>], OpenOptions::default())
            .expect("open the image");
        let fs = Filesystem::from_info(info);
        let names: Vec<Vec<u8>> = fs
            .readdir(fs.top())
            .expect("readdir")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(b, 258);
    }

    /// The generation of the superblock on `dev` (what a crash would find).
    fn generation_on(dev: &MemDevice) -> u64 {
        let copy = MemDevice::new(dev.snapshot(), "copy");
        FsInfo::open(vec![copy as Arc<dyn Device>], OpenOptions::default())
            .expect("open the image")
            .sb
            .generation
    }

    /// Data that makes the transaction allocate a chunk wakes the committer at once
    /// (its timer is an hour here): the transaction commits soon, so later fsyncs
    /// can be logged again instead of committing.
    #[test]
    fn a_new_chunk_commits_soon() {
        let mem = MemDevice::new(vec![0u8; 512 << 20], "mem");
        let t =
            make_filesystem(mem.clone() as Arc<dyn Device>, &MkfsOptions::default()).expect("mkfs");
        let w = Writer::new(t);
        let committer = w.spawn_committer(Duration::from_secs(3600));
        let before = generation_on(&mem);
        w.change("create a", |t| file(t, b"a")).expect("create a");
        let chunk = vec![5u8; 1 << 20];
        let mut off = 0u64;
        while !w.read(|_| w.kicked.load(Ordering::Acquire)) {
            assert!(off < 400 << 20, "400 MiB written without a new chunk");
            w.write_data(FS_TREE_OBJECTID, 257, off, &chunk, false)
                .expect("write");
            off += chunk.len() as u64;
        }
        let t0 = std::time::Instant::now();
        while generation_on(&mem) == before {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no commit 20 s after a chunk was allocated"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        w.stop();
        committer.join().expect("committer");
        w.commit().expect("last commit");
    }
}
