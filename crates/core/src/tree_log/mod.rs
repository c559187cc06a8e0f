//! The tree log (the kernel's tree-log.c): replaying the log an fsync left behind.
//!
//! An fsync on the kernel's btrfs does not commit the transaction: it copies the
//! inode's changed items into a per-subvolume log tree, writes the log trees and the
//! log root tree (ROOT_ITEMs keyed (TREE_LOG_OBJECTID, ROOT_ITEM, subvolume id)) and
//! points the superblock's `log_root` at it. After a crash, the next mount copies the
//! log back into the subvolumes ("replay"), commits, and so clears `log_root`.
//!
//! Here:
//! - [`Trans::open_paths`] and [`Trans::from_fs`] replay a log before anything else
//!   happens in the transaction and commit the result (as the kernel's mount does);
//! - [`Filesystem::open_replayed`] shows the replayed state to readers without writing
//!   to the image: the replay is committed to a copy-on-write overlay of the devices
//!   kept in memory ([`overlay::CowDevice`]);
//! - [`zero_log`] forgets a log, as `btrfs rescue zero-log` does.
//!
//! Owns: reading log trees and applying them. May use: `transaction` (the edits),
//! `inode` (links, extents, checksums), `alloc` (log blocks are pinned), `fs`, `io`,
//! `tree`.

mod log;
pub(crate) mod overlay;
mod replay;

use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::io::dev::Device;
use crate::io::disk_io::{FsInfo, OpenOptions};
use crate::transaction::Trans;
use std::path::Path;
use std::sync::Arc;
use ubtrfs_format::consts::*;

pub use log::{LogStats, Synced, TreeLog, LOG_ITEMS_MAX};
pub use replay::ReplayStats;

impl Trans {
    /// Opens image files or block devices for writing: refuses mounted devices, takes
    /// an exclusive lock, validates what a write depends on, and replays a tree log
    /// left by fsyncs before a crash (committing the replay, as the kernel's mount
    /// does), so the handle starts from the state the fsyncs made durable; then
    /// drops the relocation trees a kernel balance cut short left (committed), as
    /// the kernel's mount recovers them.
    pub fn open_paths(paths: &[impl AsRef<Path>]) -> Result<Trans> {
        Trans::open_paths_with(paths, OpenOptions::default())
    }

    /// [`Trans::open_paths`] with options (`free_space_tree`, the cache size; the
    /// devices are opened writable whatever `opts` says).
    pub fn open_paths_with(paths: &[impl AsRef<Path>], opts: OpenOptions) -> Result<Trans> {
        let mut t = Trans::open_paths_no_replay(paths, opts)?;
        t.replay_log_if_any()?;
        t.finish_free_space_tree()?;
        t.recover_relocation()?;
        t.clean_orphans()?;
        t.finish_uuid_tree()?;
        Ok(t)
    }

    /// Starts writing an opened filesystem (devices must be writable); replays and
    /// commits a tree log first, as [`Trans::open_paths`].
    pub fn from_fs(fs: FsInfo) -> Result<Trans> {
        let mut t = Trans::from_fs_no_replay(fs)?;
        t.replay_log_if_any()?;
        t.finish_free_space_tree()?;
        t.recover_relocation()?;
        t.clean_orphans()?;
        t.finish_uuid_tree()?;
        Ok(t)
    }

    /// [`Trans::orphan_cleanup_root`] of every live subvolume, as the kernel's
    /// read-write mount does; returns how many inodes were deleted (nothing is
    /// committed here).
    pub(crate) fn orphan_cleanup(&mut self) -> Result<u64> {
        let mut evicted = 0;
        for (root, _) in crate::qgroup::rescan::live_fs_roots(&self.fs.info)? {
            evicted += self.orphan_cleanup_root(root)?;
        }
        Ok(evicted)
    }

    /// Deletes the inodes left orphaned (by a crash while they were open, or by a
    /// log replay), committed when there were any, as the kernel's read-write mount
    /// does.
    fn clean_orphans(&mut self) -> Result<()> {
        if self.orphan_cleanup()? > 0 || self.has_pending_work() || self.dirty_bytes() > 0 {
            self.commit()?;
        }
        Ok(())
    }

    /// Replays the tree log, if the superblock has one, and commits.
    fn replay_log_if_any(&mut self) -> Result<Option<ReplayStats>> {
        if self.fs.info.sb.log_root == 0 {
            return Ok(None);
        }
        let stats = self.replay_log()?;
        self.commit()?;
        Ok(Some(stats))
    }
}

impl Filesystem {
    /// Opens image files or block devices for reading. When the superblock has a tree
    /// log (fsyncs after the last commit, before a crash) the log is replayed into an
    /// in-memory copy-on-write overlay of the devices, so readers see what the kernel
    /// shows after its mount replays the log, and nothing is written to the devices.
    /// (The kernel writes the replay even on a read-only mount, unless `nologreplay`.)
    /// A log that cannot be replayed is reported as a warning, and the last committed
    /// state is shown.
    pub fn open_replayed(paths: &[impl AsRef<Path>], opts: OpenOptions) -> Result<Filesystem> {
        let info = FsInfo::open_paths(paths, opts.clone())?;
        if info.sb.log_root == 0 {
            return Ok(Filesystem::from_info(info));
        }
        let devs: Vec<Arc<dyn Device>> = info
            .devices
            .values()
            .map(|d| Arc::new(overlay::CowDevice::new(d.clone())) as Arc<dyn Device>)
            .collect();
        let warnings = info.take_warnings();
        let replayed = (|| -> Result<Filesystem> {
            // The replay writes (to the overlay): never through a salvage open. A
            // salvaging reader then opens the replayed state afresh.
            let strict = OpenOptions {
                salvage: false,
                ..opts.clone()
            };
            let o = FsInfo::open(devs.clone(), strict)?;
            let mut t = Trans::from_fs_no_replay(o)?;
            let stats = t.replay_log()?;
            // What a read-write mount shows after its replay: the inodes the log
            // left without names are gone too.
            t.orphan_cleanup()?;
            t.commit()?;
            let fs = if opts.salvage {
                drop(t);
                Filesystem::from_info(FsInfo::open(devs, opts.clone())?)
            } else {
                t.into_fs()
            };
            fs.info.warn(format!(
                "the filesystem has a tree log (fsyncs after the last commit): showing it \
                 replayed ({} log items) in memory only; mounting read-write or any writing \
                 command writes the replay",
                stats.items
            ));
            Ok(fs)
        })();
        match replayed {
            Ok(fs) => {
                for w in warnings {
                    fs.info.warn(w);
                }
                Ok(fs)
            }
            Err(e) => {
                for w in warnings {
                    info.warn(w);
                }
                info.warn(format!(
                    "the filesystem has a tree log that cannot be replayed ({e}); showing the \
                     last committed state, without what was fsynced after it"
                ));
                Ok(Filesystem::from_info(info))
            }
        }
    }
}

/// Offsets in struct btrfs_super_block.
const SB_BYTENR: usize = 0x30;
const SB_LOG_ROOT: usize = 0x60;
const SB_LOG_ROOT_LEVEL: usize = 0xc8;

/// What [`zero_log`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroLog {
    /// The superblock's log_root before.
    pub log_root: u64,
    /// The superblock's log_root_level before.
    pub log_root_level: u8,
}

/// Clears the tree log pointer in every superblock copy of every device (log_root
/// and log_root_level to 0, checksum recomputed), as `btrfs rescue zero-log` does:
/// whatever was fsynced after the last commit is forgotten. Refuses mounted devices
/// and takes the exclusive lock.
pub fn zero_log(paths: &[impl AsRef<Path>]) -> Result<ZeroLog> {
    let mut locks = Vec::new();
    let mut devs = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let busy = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::ResourceBusy => Error::Busy(e.to_string()),
            _ => Error::io(p.display().to_string(), e),
        };
        crate::io::dev::refuse_if_mounted(p).map_err(busy)?;
        locks.push(crate::io::dev::lock_exclusive(p).map_err(busy)?);
        let d = crate::io::dev::FileDevice::open(p, true)
            .map_err(|e| Error::io(p.display().to_string(), e))?;
        devs.push(d);
    }
    let mut before = None;
    for dev in &devs {
        let (sb, _) = crate::io::disk_io::read_best_super(dev)?;
        before.get_or_insert(ZeroLog {
            log_root: sb.log_root,
            log_root_level: sb.log_root_level,
        });
        let csum = sb
            .csum_type()
            .ok_or_else(|| Error::Unsupported(format!("csum type {}", sb.csum_type_raw)))?;
        // Patch the bytes of the copy that was read rather than re-encoding it:
        // btrfs-progs writes its in-memory copy, bytes past the used part of the
        // system chunk array included, and so must this.
        let mut raw = vec![0u8; SUPER_INFO_SIZE];
        dev.read_at(sb.bytenr, &mut raw)
            .map_err(|e| Error::io(format!("reading superblock on {}", dev.name()), e))?;
        raw[SB_LOG_ROOT..SB_LOG_ROOT + 8].fill(0);
        raw[SB_LOG_ROOT_LEVEL] = 0;
        for i in 0..SUPER_MIRROR_MAX {
            let off = crate::alloc::block_group::super_offset(i);
            if off + SUPER_INFO_SIZE as u64 > dev.size() {
                break;
            }
            raw[SB_BYTENR..SB_BYTENR + 8].copy_from_slice(&off.to_le_bytes());
            let c = csum.compute(&raw[32..]);
            raw[..32].fill(0);
            raw[..csum.size()].copy_from_slice(&c[..csum.size()]);
            dev.write_at(off, &raw).map_err(|e| {
                Error::io(format!("writing superblock at {off} on {}", dev.name()), e)
            })?;
        }
        dev.flush()
            .map_err(|e| Error::io(format!("flushing {}", dev.name()), e))?;
    }
    drop(locks);
    before.ok_or_else(|| Error::Invalid("no device given".into()))
}
