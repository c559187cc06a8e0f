//! A commit's write-out, apart from the transaction: what [`Trans::commit_start`]
//! decided (every tree block of the transaction with the places its copies go, the
//! superblock bytes per device) written by [`CommitIo::run`], which needs nothing of
//! the `Trans`. A mount runs it with the transaction released, so the next
//! transaction's operations go on while the commit is written (the kernel's
//! btrfs_commit_transaction likewise unblocks new transactions before it writes the
//! tree blocks out, in btrfs_write_and_wait_transaction).
//!
//! Until [`Trans::commit_finish`] the blocks stay readable from
//! `FsInfo::committing`, and what the committing transaction freed stays pinned
//! (outside `Allocator::pinned`, which is the next transaction's): the previous
//! superblock still references it until the new one is durable.
//!
//! Owns: the write order of a commit (blocks, flush, superblocks, flush). May use:
//! `io` (devices), `tree` (the write-time tree check), `format`, `error`.

use super::Trans;
use crate::alloc::block_group::RemovedGroup;
use crate::error::{Error, Result};
use crate::io::dev::Device;
use crate::tree::tree_checker::{check_block, check_header, CheckCtx, Expect};
use crate::tree::TreeBlock;
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::CsumType;

/// One copy of a range: `len` bytes from offset `from` of the source go to `physical`
/// on `dev`.
pub(crate) struct Place {
    pub dev: Arc<dyn Device>,
    pub physical: u64,
    pub from: usize,
    pub len: usize,
    /// In a RAID5/6 chunk: the row whose parity the write must update.
    pub parity: Option<crate::io::raid56::ParityFix>,
}

/// Where a commit stands.
enum IoState {
    /// Nobody has started writing.
    Waiting,
    /// A thread is writing; others wait for it.
    Running,
    /// Written and flushed (`Ok` with the finished blocks, for the block cache), or
    /// failed (the message; the first caller got the error itself).
    Done(std::result::Result<Vec<Arc<TreeBlock>>, String>),
}

/// The write-out of one commit (see the module documentation). Runs once; every
/// other caller of [`CommitIo::run`] waits for that run and gets its outcome.
pub struct CommitIo {
    transid: u64,
    /// The transaction's tree blocks by address, as the transaction left them
    /// (without the WRITTEN flag and checksum, which the write-out adds).
    blocks: Vec<Arc<TreeBlock>>,
    /// Per block, where its copies go.
    places: Vec<Vec<Place>>,
    /// Each superblock copy: its bytes and where they go.
    supers: Vec<(Vec<u8>, Place)>,
    devices: Vec<Arc<dyn Device>>,
    /// Bytes of written blocks kept for the block cache: its capacity (more would
    /// only evict each other), so a large commit does not hold a second copy of
    /// itself until the finish.
    keep_bytes_max: usize,
    csum_type: CsumType,
    ctx: CheckCtx,
    state: Mutex<IoState>,
    done: Condvar,
}

impl std::fmt::Debug for CommitIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CommitIo(transid {}, {} blocks)",
            self.transid,
            self.blocks.len()
        )
    }
}

/// A commit started and not yet finished: its write-out and what becomes free once
/// it is durable.
#[derive(Debug)]
pub(crate) struct Inflight {
    pub io: Arc<CommitIo>,
    pub pinned: Vec<(u64, u64)>,
    pub log_blocks: BTreeSet<u64>,
    pub removed: Vec<RemovedGroup>,
}

impl CommitIo {
    /// The generation this commit writes.
    pub fn transid(&self) -> u64 {
        self.transid
    }

    /// Tree blocks this commit writes.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Writes the commit and makes it durable: every block (checked by the tree
    /// checker first: a block it would reject on read is never written), a flush,
    /// the superblocks, a flush. The first caller writes; a caller arriving while
    /// it does waits and gets the same outcome; later calls return it at once.
    pub fn run(&self) -> Result<()> {
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                match &*st {
                    IoState::Waiting => break,
                    IoState::Running => {
                        st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                    IoState::Done(r) => return self.outcome(r),
                }
            }
            *st = IoState::Running;
        }
        let r = self.write_out();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (stored, first) = match r {
            Ok(blocks) => (Ok(blocks), Ok(())),
            Err(e) => (Err(e.to_string()), Err(e)),
        };
        *st = IoState::Done(stored);
        self.done.notify_all();
        first
    }

    fn outcome(&self, r: &std::result::Result<Vec<Arc<TreeBlock>>, String>) -> Result<()> {
        match r {
            Ok(_) => Ok(()),
            Err(msg) => Err(Error::io(
                format!("the commit of generation {}", self.transid),
                std::io::Error::other(msg.clone()),
            )),
        }
    }

    /// The blocks as written (for the block cache; at most its capacity), once;
    /// empty before the write-out succeeded.
    pub(crate) fn take_written(&self) -> Vec<Arc<TreeBlock>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *st {
            IoState::Done(Ok(v)) => std::mem::take(v),
            _ => Vec::new(),
        }
    }

    fn write_out(&self) -> Result<Vec<Arc<TreeBlock>>> {
        let mut written = Vec::new();
        let mut kept_bytes = 0usize;
        for (b, places) in self.blocks.iter().zip(&self.places) {
            let mut data = b.data.clone();
            let flags = crate::tree::block_edit::flags(&data) | HEADER_FLAG_WRITTEN;
            crate::tree::block_edit::set_flags(&mut data, flags);
            ubtrfs_format::tree::finish_block(&mut data, self.csum_type);
            check_header(&self.ctx, b.bytenr, &data, &Expect::default())
                .and_then(|_| check_block(&self.ctx, b.bytenr, &data, &Expect::default()))
                .map_err(|e| {
                    Error::corrupt(format!("refusing to write an invalid block (a bug): {e}"))
                })?;
            write_places(&data, places, b.bytenr)?;
            if kept_bytes + data.len() <= self.keep_bytes_max {
                kept_bytes += data.len();
                written.push(Arc::new(TreeBlock {
                    bytenr: b.bytenr,
                    data,
                }));
            }
        }
        self.flush()?;
        for (bytes, p) in &self.supers {
            p.dev.write_at(p.physical, bytes).map_err(|e| {
                Error::io(
                    format!("writing superblock at {} on {}", p.physical, p.dev.name()),
                    e,
                )
            })?;
        }
        self.flush()?;
        Ok(written)
    }

    fn flush(&self) -> Result<()> {
        for d in &self.devices {
            d.flush()
                .map_err(|e| Error::io(format!("flushing {}", d.name()), e))?;
        }
        Ok(())
    }
}

/// Writes `data` (which starts at `logical`) to each of its places.
pub(crate) fn write_places(data: &[u8], places: &[Place], logical: u64) -> Result<()> {
    for p in places {
        let piece = &data[p.from..p.from + p.len];
        match &p.parity {
            Some(fix) => crate::io::raid56::write_with_parity(&*p.dev, p.physical, piece, fix),
            None => p.dev.write_at(p.physical, piece),
        }
        .map_err(|err| {
            Error::io(
                format!(
                    "writing {} bytes at logical {} ({} physical {})",
                    p.len,
                    logical + p.from as u64,
                    p.dev.name(),
                    p.physical
                ),
                err,
            )
        })?;
    }
    Ok(())
}

impl Trans {
    /// Where `len` bytes at `logical` go: every copy of every stripe piece.
    pub(crate) fn places(&self, logical: u64, len: usize) -> Result<Vec<Place>> {
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let l = logical + done as u64;
            let e = self.fs.info.chunk_map.lookup(l)?;
            let mut n = len - done;
            let mut copies = Vec::new();
            let parity = crate::io::raid56::row_of(e, l, &|devid| {
                self.fs.info.devices.get(&devid).cloned()
            })?;
            for m in 0..e.num_mirrors() {
                let p = e.map(l, m)?;
                n = n.min(p.len as usize);
                let dev = self
                    .fs
                    .info
                    .devices
                    .get(&p.devid)
                    .ok_or_else(|| Error::Invalid(format!("devid {} missing", p.devid)))?;
                copies.push((dev.clone(), p.offset));
            }
            for (dev, physical) in copies {
                out.push(Place {
                    dev,
                    physical,
                    from: done,
                    len: n,
                    parity: parity.clone(),
                });
            }
            done += n;
        }
        Ok(out)
    }

    /// Turns the transaction's dirty blocks and superblock into a [`CommitIo`]: the
    /// blocks move from `FsInfo::dirty` to `FsInfo::committing` (still read from
    /// there), the superblock is brought to this generation in memory.
    pub(crate) fn prepare_write_out(&mut self) -> Result<Arc<CommitIo>> {
        let blocks: Vec<Arc<TreeBlock>> = {
            let mut d = self
                .fs
                .info
                .dirty
                .lock()
                .map_err(|_| Error::corrupt("internal: dirty map poisoned"))?;
            let mut v: Vec<_> = d.drain().map(|(_, b)| b).collect();
            v.sort_by_key(|b| b.bytenr);
            v
        };
        {
            let mut c = self
                .fs
                .info
                .committing
                .lock()
                .map_err(|_| Error::corrupt("internal: committing map poisoned"))?;
            c.clear();
            c.extend(blocks.iter().map(|b| (b.bytenr, b.clone())));
        }
        let mut places = Vec::with_capacity(blocks.len());
        for b in &blocks {
            places.push(self.places(b.bytenr, b.data.len())?);
        }
        let supers = self.prepare_supers()?;
        let mut ctx = self.fs.info.check_ctx();
        ctx.super_generation = self.transid;
        Ok(Arc::new(CommitIo {
            transid: self.transid,
            blocks,
            places,
            supers,
            devices: self.fs.info.devices.values().cloned().collect(),
            keep_bytes_max: self.fs.info.opts.cache_bytes_max,
            csum_type: self.fs.info.csum_type,
            ctx,
            state: Mutex::new(IoState::Waiting),
            done: Condvar::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::io::disk_io::{FsInfo, OpenOptions};
    use crate::tools::mkfs::{make_filesystem, MkfsOptions};
    use crate::tree::ctree::TreeIter;
    use crate::{Device, MemDevice};
    use std::sync::Arc;
    use ubtrfs_format::consts::*;
    use ubtrfs_format::key::Key;

    const TREE: u64 = 1000;

    fn key(n: u64) -> Key {
        Key::new(FIRST_FREE_OBJECTID + n, PERSISTENT_ITEM_KEY, 0)
    }

    fn count(info: &FsInfo, root: &crate::tree::RootPtr) -> usize {
        TreeIter::new(info, root, Key::MIN, Key::MAX)
            .expect("iter")
            .inspect(|i| assert!(i.is_ok(), "item: {i:?}"))
            .count()
    }

    fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
        a.0 < b.0 + b.1 && b.0 < a.0 + a.1
    }

    /// The next transaction runs between `commit_start` and the write-out, as on a
    /// mount: it must not reuse what the committing transaction freed (the previous
    /// superblock still references it until the new one is durable), must CoW the
    /// committing blocks rather than edit them, and must read them; both commits
    /// then land intact, and the freed space comes back at `commit_finish`.
    #[test]
    fn next_transaction_runs_while_a_commit_is_written() {
        let dev = MemDevice::new(vec![0u8; 128 << 20], "overlap");
        let opts = MkfsOptions {
            nodesize: 4096,
            metadata_profile: 0,
            ..Default::default()
        };
        let mut t = make_filesystem(dev.clone() as Arc<dyn Device>, &opts).expect("mkfs");
        t.create_tree(TREE).expect("create tree");
        let items: Vec<(Key, Vec<u8>)> = (0..6_000).map(|n| (key(n), vec![1u8; 40])).collect();
        t.insert_items(TREE, &items).expect("insert");
        t.commit().expect("commit");
        // Frees most of the tree's blocks: pinned by the commit.
        t.delete_range(TREE, &key(0), &key(4_999)).expect("delete");
        let io = t.commit_start().expect("start").expect("changes to commit");
        let pinned = t.inflight.as_ref().expect("in flight").pinned.clone();
        assert!(pinned.len() > 20, "the deletion freed blocks: {pinned:?}");
        let committing: Vec<(u64, Vec<u8>)> = {
            let c = t.fs.info.committing.lock().expect("committing");
            c.values().map(|b| (b.bytenr, b.data.clone())).collect()
        };
        assert_eq!(committing.len(), io.blocks());
        for &(b, l) in &pinned {
            let bg = &t.alloc.bgs[&t.alloc.bg_of(b).expect("group")];
            assert!(!bg.free.iter().any(|r| overlaps(r, (b, l))), "{b} is free");
        }
        // The next transaction reads the committing state and rewrites the tree.
        let root = t.root_ptr(TREE).expect("root");
        assert_eq!(count(&t.fs.info, &root), 1_000);
        let more: Vec<(Key, Vec<u8>)> = (0..5_000).map(|n| (key(n), vec![2u8; 40])).collect();
        t.insert_items(TREE, &more).expect("insert again");
        let dirty: Vec<u64> =
            t.fs.info
                .dirty
                .lock()
                .expect("dirty")
                .keys()
                .copied()
                .collect();
        let ns = t.fs.info.nodesize as u64;
        for &d in &dirty {
            assert!(
                !pinned.iter().any(|&p| overlaps(p, (d, ns))),
                "block {d} of the next transaction reuses space the committing one freed"
            );
            assert!(
                !committing.iter().any(|(b, _)| *b == d),
                "{d} edited in place"
            );
        }
        for (b, data) in &committing {
            let now = t.fs.info.committing.lock().expect("committing")[b]
                .data
                .clone();
            assert_eq!(&now, data, "committing block {b} changed");
        }
        io.run().expect("write-out");
        // Durable: the generation on disk is the committed one, with its 1,000 items.
        let copy = MemDevice::new(dev.snapshot(), "after write-out");
        let info = FsInfo::open(vec![copy as Arc<dyn Device>], OpenOptions::default())
            .expect("open the committed state");
        assert_eq!(info.sb.generation, io.transid());
        let r = info.subvol_ptr(TREE).expect("tree").expect("its root");
        assert_eq!(count(&info, &r), 1_000);
        drop(info);
        t.commit_finish().expect("finish");
        for &(b, l) in &pinned {
            let bg = &t.alloc.bgs[&t.alloc.bg_of(b).expect("group")];
            assert!(bg.free.is_free(b, l), "{b} came back");
        }
        t.commit().expect("second commit");
        let copy = MemDevice::new(dev.snapshot(), "after the second commit");
        let info = FsInfo::open(vec![copy as Arc<dyn Device>], OpenOptions::default())
            .expect("open the second commit");
        assert_eq!(info.sb.generation, io.transid() + 1);
        let r = info.subvol_ptr(TREE).expect("tree").expect("its root");
        assert_eq!(count(&info, &r), 6_000);
    }
}
