//! What a mount serves: an image opened read-only, or a running write transaction
//! whose uncommitted state the reads see (the read-write mount).
//!
//! The read-write side is one [`Trans`] behind a reader-writer lock: reads share it,
//! each change takes it alone for the length of one engine call. Changes accumulate
//! in the running transaction, which is committed every `commit=` seconds, on
//! fsync/syncfs and at unmount. An error that may have left the transaction half
//! applied (an I/O error, corruption, no space) aborts it, as the kernel's
//! transaction abort does: the mount turns read-only and nothing more is committed,
//! so the image stays at its last commit.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;
use ubtrfs_core::{Error, Filesystem, Reservation, Trans};

use crate::ops::errno;

/// Items a namespace change may touch (the kernel's btrfs_create reserves 5: inode
/// item, inode ref, dir item, dir index, a security xattr; a rename up to 11).
pub(crate) const DEFAULT_ITEMS: u64 = 11;

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
    /// Wakes the commit thread early (unmount).
    stop: (Mutex<bool>, Condvar),
    /// Unlinked inodes the kernel may still hold open: (tree, inode). They go when
    /// the kernel forgets them, or at unmount.
    orphans: Mutex<HashSet<(u64, u64)>>,
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
        Arc::new(Writer {
            orphans: Mutex::new(HashSet::new()),
            trans: RwLock::new(trans),
            aborted: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            stop: (Mutex::new(false), Condvar::new()),
        })
    }

    /// Runs `f` on the filesystem with the transaction's changes visible.
    pub fn read<R>(&self, f: impl FnOnce(&Filesystem) -> R) -> R {
        let t = self.trans.read().unwrap_or_else(|p| p.into_inner());
        f(&t.fs)
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
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
        }
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EROFS);
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

    /// The kernel forgot an inode: if it was unlinked while held, delete it now.
    pub fn forgotten(&self, root: u64, ino: u64) {
        let was_orphan = self
            .orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(root, ino));
        if was_orphan {
            let _ = self.change_reserved("evict", Reservation::freeing(DEFAULT_ITEMS), |t| {
                t.evict_orphan(root, ino)
            });
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

    /// Commits the running transaction if anything changed (sync, fsync, the timer,
    /// unmount). Durable when it returns Ok.
    pub fn commit(&self) -> Result<(), i32> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(errno::EIO);
        }
        let mut t = self.trans.write().unwrap_or_else(|p| p.into_inner());
        if self.changes.swap(0, Ordering::AcqRel) == 0 {
            return Ok(());
        }
        t.commit().map_err(|e| {
            self.abort(&format!("commit: {e}"));
            errno::EIO
        })
    }

    /// Commits every `interval` until [`Writer::stop`] (the kernel's commit= timer).
    pub fn spawn_committer(self: &Arc<Self>, interval: Duration) -> std::thread::JoinHandle<()> {
        let w = Arc::clone(self);
        std::thread::spawn(move || {
            let (lock, cv) = &w.stop;
            let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
            while !*stopped {
                let (g, timeout) = cv
                    .wait_timeout(stopped, interval)
                    .unwrap_or_else(|p| p.into_inner());
                stopped = g;
                if timeout.timed_out() && !*stopped {
                    drop(stopped);
                    let _ = w.commit();
                    stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                }
            }
        })
    }

    /// Stops the commit thread (the caller commits one last time).
    pub fn stop(&self) {
        let (lock, cv) = &self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }
}
