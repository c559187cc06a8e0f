//! `ubtrfs dedupe`: finds file data with identical contents and makes it share one
//! extent, as duperemove does on a mounted btrfs with FIDEDUPERANGE — here offline,
//! on the image, through [`Trans::dedupe_range`].
//!
//! The algorithm (block hashing, then runs):
//! 1. Every regular file below the given directories (subvolumes included, hard links
//!    once) is read and hashed in blocks of [`DEDUPE_BLOCK_BYTES`] at file offsets
//!    that are multiples of it; a file's last block may be short. Files smaller than
//!    the minimum size are skipped.
//! 2. The first block seen with a given (hash, length, checksum flag) is canonical.
//!    Going through the files in order, a block whose canonical copy is elsewhere
//!    starts a run, extended while the following blocks of both files also hash
//!    equal.
//! 3. The bytes of every run are compared (a hash match is only a hint).
//! 4. Each equal run is one dedupe: the later range is made to share the canonical
//!    range's extents. Ranges that already share the same extents are skipped.
//!
//! Steps 1 and 3 only read, on several threads; step 4 changes the image, one
//! clone after another (contents never change, so the comparisons stay true).
//!
//! Memory: one 8-byte hash per block (128 KiB) plus one map entry per distinct
//! block, about 1/4000 of the data scanned.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node, S_IFDIR, S_IFMT, S_IFREG};
use crate::inode::reflink::{Compare, FilePos, CLONE_CHUNK_BYTES_MAX};
use crate::transaction::Trans;
use crate::tree::ctree::TreeIter;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::CsumType;
use ubtrfs_format::items::{parse_dir_items, InodeItem};
use ubtrfs_format::key::Key;

/// The unit of hashing and the alignment of deduplicated ranges (duperemove's
/// default block size).
pub const DEDUPE_BLOCK_BYTES: u64 = 128 << 10;

/// Bytes read from a file per request while hashing.
const READ_CHUNK_BYTES: u64 = 8 * DEDUPE_BLOCK_BYTES;

/// Metadata dirtied before an intermediate commit, so memory stays bounded.
const DIRTY_BYTES_COMMIT: usize = 256 << 20;

/// What to deduplicate.
#[derive(Clone, Debug)]
pub struct DedupeOptions {
    /// Files smaller than this are not looked at.
    pub min_size_bytes: u64,
    /// Only find and compare: change nothing.
    pub dry_run: bool,
}

/// What a run found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DedupeReport {
    /// Regular files hashed.
    pub files: u64,
    /// Bytes of file data hashed.
    pub bytes_scanned: u64,
    /// Ranges made to share (or, with `dry_run`, found equal).
    pub ranges: u64,
    /// Bytes in those ranges.
    pub bytes_deduped: u64,
    /// Bytes found equal that already shared their extents.
    pub bytes_already_shared: u64,
    /// Bytes whose hashes matched but whose contents did not (or that could not be
    /// shared: an inline extent, mismatched checksum flags).
    pub bytes_differing: u64,
    /// Data bytes allocated before and after (after the final commit); equal with
    /// `dry_run`.
    pub data_used_before: u64,
    /// See `data_used_before`.
    pub data_used_after: u64,
}

impl DedupeReport {
    /// Data bytes the deduplication gave back to free space.
    pub fn bytes_freed(&self) -> u64 {
        self.data_used_before.saturating_sub(self.data_used_after)
    }
}

/// A file to hash.
struct FileRec {
    node: Node,
    size: u64,
    nodatasum: bool,
    /// Hash of each block; the last block may be short.
    hashes: Vec<u64>,
}

impl FileRec {
    fn block_len(&self, i: usize) -> u64 {
        (self.size - i as u64 * DEDUPE_BLOCK_BYTES).min(DEDUPE_BLOCK_BYTES)
    }
}

/// (hash, block length, no data checksums): blocks that may be shared with each
/// other.
type BlockKey = (u64, u64, bool);

/// One range to deduplicate: `blocks` blocks of file `dst` from block `dst_block`
/// equal (by hash) those of file `src` from block `src_block`; `len` bytes.
struct Run {
    src: usize,
    src_block: usize,
    dst: usize,
    dst_block: usize,
    len: u64,
}

impl Run {
    fn positions(&self, files: &[FileRec]) -> (FilePos, FilePos) {
        let (s, d) = (&files[self.src], &files[self.dst]);
        (
            FilePos::new(
                s.node.root,
                s.node.ino,
                self.src_block as u64 * DEDUPE_BLOCK_BYTES,
            ),
            FilePos::new(
                d.node.root,
                d.node.ino,
                self.dst_block as u64 * DEDUPE_BLOCK_BYTES,
            ),
        )
    }
}

/// Finds duplicates below `starts` (directories or files) and deduplicates them,
/// committing at the end (unless `dry_run`). `progress(done, total)` is called with
/// the bytes hashed, then with the bytes compared.
///
/// Hashing and comparing read the image on several threads (nothing changes it
/// until every comparison is done: a dedupe never changes contents); the clones are
/// made one by one afterwards.
pub fn dedupe(
    t: &mut Trans,
    starts: &[Node],
    opts: &DedupeOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DedupeReport> {
    let mut report = DedupeReport {
        data_used_before: t.data_used_bytes(),
        ..Default::default()
    };
    let mut files = collect_files(t, starts, opts.min_size_bytes)?;
    let total: u64 = files.iter().map(|f| f.size).sum();
    report.files = files.len() as u64;
    report.bytes_scanned = total;
    let hashes = parallel_map(&files, &|f| hash_file(&t.fs, f), &|f| f.size, progress)?;
    for (f, h) in files.iter_mut().zip(hashes) {
        f.hashes = h;
    }

    let runs = plan_runs(&files);
    let equal = parallel_map(
        &runs,
        &|r| {
            let (a, b) = r.positions(&files);
            ranges_equal(&t.fs, a, b, r.len)
        },
        &|r| r.len,
        progress,
    )?;

    for (r, same) in runs.iter().zip(equal) {
        let (src, dst) = r.positions(&files);
        if !same {
            report.bytes_differing += r.len;
            continue;
        }
        if t.shares_extents(src, dst, r.len)? {
            report.bytes_already_shared += r.len;
            continue;
        }
        let n = if opts.dry_run {
            r.len
        } else {
            t.dedupe_range_checked(src, dst, r.len, Compare::Done)?
        };
        if n == 0 {
            report.bytes_differing += r.len;
        } else {
            report.ranges += 1;
            report.bytes_deduped += n;
        }
        if t.dirty_bytes() > DIRTY_BYTES_COMMIT {
            t.commit()?;
        }
    }
    if !opts.dry_run {
        t.commit()?;
    }
    report.data_used_after = t.data_used_bytes();
    Ok(report)
}

/// The ranges to deduplicate, in file order: a block whose canonical copy (the first
/// block seen with its key) is elsewhere starts a run against that copy.
fn plan_runs(files: &[FileRec]) -> Vec<Run> {
    let mut canonical: HashMap<BlockKey, (u32, u32)> = HashMap::new();
    for (fi, f) in files.iter().enumerate() {
        for (bi, h) in f.hashes.iter().enumerate() {
            canonical
                .entry((*h, f.block_len(bi), f.nodatasum))
                .or_insert((fi as u32, bi as u32));
        }
    }
    let mut runs = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let mut bi = 0usize;
        while bi < f.hashes.len() {
            let key = (f.hashes[bi], f.block_len(bi), f.nodatasum);
            match canonical.get(&key) {
                Some(&(g, j)) if (g as usize, j as usize) != (fi, bi) => {
                    let (gi, gj) = (g as usize, j as usize);
                    let blocks = run_blocks(f, bi, &files[gi], gj, fi == gi);
                    runs.push(Run {
                        src: gi,
                        src_block: gj,
                        dst: fi,
                        dst_block: bi,
                        len: (bi..bi + blocks).map(|i| f.block_len(i)).sum(),
                    });
                    bi += blocks;
                }
                _ => bi += 1,
            }
        }
    }
    runs
}

/// `work` applied to every item on up to 4 threads (the calling one included),
/// results in item order; `progress(done, total)` with the summed `weight` of the
/// items done, from the calling thread. The first error wins.
fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    work: &(dyn Fn(&T) -> Result<R> + Sync),
    weight: &(dyn Fn(&T) -> u64 + Sync),
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<R>> {
    let total: u64 = items.iter().map(weight).sum();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let worker = || -> Result<Vec<(usize, R)>> {
        let mut out = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return Ok(out);
            };
            out.push((i, work(item)?));
            done.fetch_add(weight(item), Ordering::Relaxed);
        }
    };
    let mut parts = Vec::new();
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(worker)).collect();
        // The calling thread works too, and reports progress between items.
        let mut mine = Vec::new();
        let mut mine_err = None;
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            match work(item) {
                Ok(r) => mine.push((i, r)),
                Err(e) => {
                    mine_err = Some(e);
                    // Stop the others early too.
                    next.store(items.len(), Ordering::Relaxed);
                    break;
                }
            }
            let d = done.fetch_add(weight(item), Ordering::Relaxed) + weight(item);
            progress(d, total);
        }
        parts.push(match mine_err {
            Some(e) => Err(e),
            None => Ok(mine),
        });
        for h in helpers {
            parts.push(
                h.join()
                    .unwrap_or_else(|_| Err(Error::corrupt("internal: dedupe worker panicked"))),
            );
        }
    });
    let mut all = Vec::with_capacity(items.len());
    for p in parts {
        all.extend(p?);
    }
    all.sort_unstable_by_key(|(i, _)| *i);
    progress(total, total);
    Ok(all.into_iter().map(|(_, r)| r).collect())
}

/// Whether `len` bytes at `a` and `b` read the same (read side: nothing changes
/// the image while the comparisons run).
fn ranges_equal(fs: &Filesystem, a: FilePos, b: FilePos, len: u64) -> Result<bool> {
    let (na, nb) = (Node::new(a.root, a.ino), Node::new(b.root, b.ino));
    let (ia, ib) = (fs.inode_item(na)?, fs.inode_item(nb)?);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(READ_CHUNK_BYTES) as usize;
        if fs.read_inode(na, &ia, a.offset + done, n)?
            != fs.read_inode(nb, &ib, b.offset + done, n)?
        {
            return Ok(false);
        }
        done += n as u64;
    }
    Ok(true)
}

/// How many blocks from `f[bi]` equal their counterparts from `g[gj]`: at least
/// one, at most what one dedupe call shares, never overlapping within one file
/// (the canonical block of a file's own duplicate lies before it).
fn run_blocks(f: &FileRec, bi: usize, g: &FileRec, gj: usize, same_file: bool) -> usize {
    let max_blocks = (CLONE_CHUNK_BYTES_MAX / DEDUPE_BLOCK_BYTES) as usize;
    let mut n = 1;
    while n < max_blocks
        && bi + n < f.hashes.len()
        && gj + n < g.hashes.len()
        && !(same_file && gj + n >= bi)
        && f.hashes[bi + n] == g.hashes[gj + n]
        && f.block_len(bi + n) == g.block_len(gj + n)
    {
        n += 1;
    }
    n
}

/// Regular files below `starts`, each inode once: a subvolume's root directory is
/// read as one sweep of its tree (every INODE_ITEM, in inode order, and the
/// subvolumes its directories hold), any other directory entry by entry.
fn collect_files(t: &Trans, starts: &[Node], min_size_bytes: u64) -> Result<Vec<FileRec>> {
    let fs = &t.fs;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut stack: Vec<Node> = starts.iter().rev().copied().collect();
    let keep = |out: &mut Vec<FileRec>, node: Node, inode: &InodeItem| {
        if inode.mode & S_IFMT == S_IFREG && inode.size >= min_size_bytes.max(1) {
            out.push(FileRec {
                node,
                size: inode.size,
                nodatasum: inode.flags & INODE_NODATASUM != 0,
                hashes: Vec::new(),
            });
        }
    };
    while let Some(node) = stack.pop() {
        if node.is_placeholder() || !seen.insert((node.root, node.ino)) {
            continue;
        }
        if node.ino == FIRST_FREE_OBJECTID {
            let root = fs.root(node.root)?;
            let iter = TreeIter::new(&fs.info, &root, Key::new(0, 0, 0), Key::MAX)?;
            for it in iter {
                let it = it?;
                let k = it.key();
                let what = || format!("subvolume {} {k}", node.root);
                match k.ty {
                    INODE_ITEM_KEY => {
                        let inode = InodeItem::parse(it.data())
                            .map_err(|e| Error::corrupt(format!("{}: {e}", what())))?;
                        // Orphans (nlink 0) are on their way out.
                        if inode.nlink > 0 && seen.insert((node.root, k.objectid)) {
                            keep(&mut out, Node::new(node.root, k.objectid), &inode);
                        }
                    }
                    DIR_INDEX_KEY => {
                        for d in parse_dir_items(it.data())
                            .map_err(|e| Error::corrupt(format!("{}: {e}", what())))?
                        {
                            if d.location.ty == ROOT_ITEM_KEY {
                                stack.push(Node::new(d.location.objectid, FIRST_FREE_OBJECTID));
                            }
                        }
                    }
                    _ => {}
                }
            }
            continue;
        }
        let inode = fs.inode_item(node)?;
        if inode.mode & S_IFMT == S_IFDIR {
            let entries = fs.readdir(node)?;
            stack.extend(entries.into_iter().rev().map(|e| e.node));
        } else {
            keep(&mut out, node, &inode);
        }
    }
    Ok(out)
}

/// The xxhash64 of each block of `f`.
fn hash_file(fs: &Filesystem, f: &FileRec) -> Result<Vec<u64>> {
    let inode = fs.inode_item(f.node)?;
    let mut hashes = Vec::with_capacity(f.size.div_ceil(DEDUPE_BLOCK_BYTES) as usize);
    let mut off = 0u64;
    while off < f.size {
        let n = (f.size - off).min(READ_CHUNK_BYTES);
        let data = fs.read_inode(f.node, &inode, off, n as usize)?;
        for block in data.chunks(DEDUPE_BLOCK_BYTES as usize) {
            let sum = CsumType::Xxhash64.compute(block);
            let mut h = [0u8; 8];
            h.copy_from_slice(&sum[..8]);
            hashes.push(u64::from_le_bytes(h));
        }
        off += n;
    }
    Ok(hashes)
}
