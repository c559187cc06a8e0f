//! `ubtrfs dedupe`: finds file data with identical contents and makes it share one
//! extent, as duperemove does on a mounted btrfs with FIDEDUPERANGE — here offline,
//! on the image, through [`Trans::dedupe_range`].
//!
//! The algorithm (block signatures, then runs):
//! 1. Every regular file below the given directories (subvolumes included, hard links
//!    once) gets a signature per block of [`DEDUPE_BLOCK_BYTES`] at file offsets
//!    that are multiples of it (a file's last block may be short): the xxhash64 of
//!    its sectors' data checksums, taken from the csum tree where it has them, so
//!    this pass reads metadata, not data (see `hash_file`). Files smaller than the
//!    minimum size are skipped.
//! 2. The first block seen with a given (signature, length, checksum flag) is
//!    canonical. Going through the files in order, a block whose canonical copy is
//!    elsewhere starts a run, extended while the following blocks of both files
//!    also match.
//! 3. Runs whose ranges already share the same extents are set aside; the bytes of
//!    every other run are compared (a signature match is only a hint).
//! 4. Each equal run is one dedupe: the later range is made to share the canonical
//!    range's extents.
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
use crate::tree::ctree::{prefetch_tree, TreeIter};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::xxh64;
use ubtrfs_format::items::{parse_dir_items, FileExtentBody, InodeItem};
use ubtrfs_format::key::Key;

/// The unit of hashing and the alignment of deduplicated ranges (duperemove's
/// default block size).
pub const DEDUPE_BLOCK_BYTES: u64 = 128 << 10;

/// Bytes read from a file per request while hashing.
const READ_CHUNK_BYTES: u64 = 8 * DEDUPE_BLOCK_BYTES;

/// Threads that read at once: the passes wait on the device far more than they
/// compute, and a cold device serves parallel requests faster.
const IO_THREADS: usize = 8;

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
    /// Bytes not shared because reading them for the comparison failed (a damaged
    /// copy: the data fails its checksums in every copy, or the device errs); each
    /// such range is also reported as a warning of the filesystem.
    pub bytes_unreadable: u64,
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
    // Ranges that already share their extents (a second run, reflinked copies)
    // need no reading at all.
    let mut todo = Vec::with_capacity(runs.len());
    for r in runs {
        let (src, dst) = r.positions(&files);
        if t.shares_extents(src, dst, r.len)? {
            report.bytes_already_shared += r.len;
        } else {
            todo.push(r);
        }
    }
    // A range that cannot be read is left as it is, as FIDEDUPERANGE fails with
    // EIO for it, and the others go on.
    let equal = parallel_map(
        &todo,
        &|r| {
            let (a, b) = r.positions(&files);
            Ok(ranges_equal(&t.fs, a, b, r.len).map_err(|e| {
                t.fs.info.warn(format!(
                    "dedupe: {} bytes at offset {} of subvolume {} inode {} not shared with \
                     offset {} of inode {}: {e}",
                    r.len, b.offset, b.root, b.ino, a.offset, a.ino
                ))
            }))
        },
        &|r| r.len,
        progress,
    )?;

    for (r, same) in todo.iter().zip(equal) {
        let (src, dst) = r.positions(&files);
        match same {
            Ok(true) => {}
            Ok(false) => {
                report.bytes_differing += r.len;
                continue;
            }
            Err(()) => {
                report.bytes_unreadable += r.len;
                continue;
            }
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

/// `work` applied to every item on [`IO_THREADS`] threads (the calling one included),
/// results in item order; `progress(done, total)` with the summed `weight` of the
/// items done, from the calling thread. The first error wins.
fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    work: &(dyn Fn(&T) -> Result<R> + Sync),
    weight: &(dyn Fn(&T) -> u64 + Sync),
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<R>> {
    let total: u64 = items.iter().map(weight).sum();
    let threads = IO_THREADS;
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
///
/// Where both ranges lie in plain extents (uncompressed, on disk) the bytes are
/// read raw, without verifying them against their data checksums, and compared:
/// first the two sides' checksums from the csum tree (different checksums, or a
/// sector without one, send the piece to the verified path below), then the bytes.
/// Skipping the verification is exact, not a gamble, for data with one copy:
/// equal bytes under equal checksums verify on both sides or on neither, so
/// sharing one side's extent with the other never turns a readable range into an
/// unreadable one (the
/// kernel's FIDEDUPERANGE reads both through verification and would refuse the
/// second case with EIO, where this shares two equally damaged copies). Anything
/// else (compressed or inline extents, holes, preallocated ranges, files without
/// checksums on one side only) is read through the file, verified.
fn ranges_equal(fs: &Filesystem, a: FilePos, b: FilePos, len: u64) -> Result<bool> {
    let (na, nb) = (Node::new(a.root, a.ino), Node::new(b.root, b.ino));
    let (ia, ib) = (fs.inode_item(na)?, fs.inode_item(nb)?);
    let sums_a = ia.flags & INODE_NODATASUM == 0;
    let sums_b = ib.flags & INODE_NODATASUM == 0;
    let pa = plain_pieces(fs, na, a.offset, len)?;
    let pb = plain_pieces(fs, nb, b.offset, len)?;
    let ss = fs.info.sectorsize as u64;
    // Walk both piece lists together: each step covers the longest stretch where
    // neither side changes extent.
    let (mut i, mut j, mut pos) = (0usize, 0usize, 0u64);
    while pos < len {
        let (Some(x), Some(y)) = (pa.get(i), pb.get(j)) else {
            return Err(Error::corrupt(format!(
                "subvolume {} inode {}: extent map of a dedupe range ends early",
                a.root, a.ino
            )));
        };
        let end = x.end.min(y.end).min(len);
        let n = end - pos;
        // Single-copy data only: with DUP or RAID1 the first copies could be equal
        // and equally damaged while the source's second copy is bad too and the
        // destination's good; the verified path reads past a bad copy as the
        // kernel does.
        let single = |l: u64| fs.info.num_mirrors(l).is_ok_and(|m| m == 1);
        let raw = match (x.logical, y.logical) {
            (Some(la), Some(lb)) if sums_a == sums_b => {
                let (la, lb) = (la + (pos - x.start), lb + (pos - y.start));
                (single(la) && single(lb)).then_some((la, lb))
            }
            _ => None,
        };
        let same = match raw {
            Some((la, lb)) if !sums_a || (la % ss == 0 && lb % ss == 0) => {
                let sums_equal = !sums_a || {
                    let sectors = n.div_ceil(ss) as usize;
                    let (ca, cb) = (
                        fs.info.lookup_csums(la, sectors)?,
                        fs.info.lookup_csums(lb, sectors)?,
                    );
                    ca.iter().all(Option::is_some) && ca == cb
                };
                // Whole sectors, so a differing tail past the end of the file in the
                // last one (which its checksum covers) cannot hide.
                let whole = if sums_a { n.div_ceil(ss) * ss } else { n };
                // A read error or a difference in that tail: the verified path
                // decides (it also tries the other copies).
                (sums_equal && raw_equal(fs, la, lb, whole).unwrap_or(false))
                    || file_equal(fs, (na, &ia, a.offset + pos), (nb, &ib, b.offset + pos), n)?
            }
            _ => file_equal(fs, (na, &ia, a.offset + pos), (nb, &ib, b.offset + pos), n)?,
        };
        if !same {
            return Ok(false);
        }
        pos = end;
        if pos >= x.end {
            i += 1;
        }
        if pos >= y.end {
            j += 1;
        }
    }
    Ok(true)
}

/// A stretch of a dedupe range (offsets relative to the range's start) lying in one
/// file extent item; `logical` is where its first byte is on disk when that extent
/// is a plain one (uncompressed, neither inline, hole nor preallocated).
struct PlainPiece {
    start: u64,
    end: u64,
    logical: Option<u64>,
}

/// The extent items covering `[offset, offset + len)` of a file, as
/// [`PlainPiece`]s; gaps between items (holes without items) are pieces too.
fn plain_pieces(fs: &Filesystem, node: Node, offset: u64, len: u64) -> Result<Vec<PlainPiece>> {
    let end = offset.saturating_add(len);
    let mut out: Vec<PlainPiece> = Vec::new();
    let mut at = offset;
    fs.for_each_extent(node, offset, end, |fe| {
        let s = fe.file_offset.max(at);
        let e = fe.end().min(end);
        if s > at {
            out.push(PlainPiece {
                start: at - offset,
                end: s - offset,
                logical: None,
            });
        }
        if s < e {
            let logical = match fe.item.body {
                FileExtentBody::Regular {
                    disk_bytenr,
                    offset: o,
                    ..
                } if !fe.is_hole_or_prealloc() && fe.item.compression == 0 => disk_bytenr
                    .checked_add(o)
                    .and_then(|l| l.checked_add(s - fe.file_offset)),
                _ => None,
            };
            out.push(PlainPiece {
                start: s - offset,
                end: e - offset,
                logical,
            });
            at = e;
        }
        Ok(at < end)
    })?;
    if at < end {
        out.push(PlainPiece {
            start: at - offset,
            end: len,
            logical: None,
        });
    }
    Ok(out)
}

thread_local! {
    /// Each comparing thread's two read buffers, kept between ranges (fresh ones
    /// would be zeroed and faulted in for every read).
    static RAW_BUFFERS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Whether `len` bytes on disk at logical `a` and `b` are equal, read raw.
fn raw_equal(fs: &Filesystem, a: u64, b: u64, len: u64) -> Result<bool> {
    RAW_BUFFERS.with(|cell| {
        let mut bufs = cell.borrow_mut();
        let (ba, bb) = &mut *bufs;
        let chunk = len.min(READ_CHUNK_BYTES) as usize;
        ba.resize(chunk, 0);
        bb.resize(chunk, 0);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(READ_CHUNK_BYTES) as usize;
            fs.info.read_logical(a + done, &mut ba[..n], 0)?;
            fs.info.read_logical(b + done, &mut bb[..n], 0)?;
            if ba[..n] != bb[..n] {
                return Ok(false);
            }
            done += n as u64;
        }
        Ok(true)
    })
}

/// Whether `len` bytes of two files read the same through the file (verified).
fn file_equal(
    fs: &Filesystem,
    (na, ia, oa): (Node, &InodeItem, u64),
    (nb, ib, ob): (Node, &InodeItem, u64),
    len: u64,
) -> Result<bool> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(READ_CHUNK_BYTES) as usize;
        if fs.read_inode(na, ia, oa + done, n)? != fs.read_inode(nb, ib, ob + done, n)? {
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
            // The sweep reads every leaf: ask for them all at once first.
            let cache_half = fs.info.opts.cache_bytes_max as u64 / 2;
            prefetch_tree(&fs.info, &root, IO_THREADS, cache_half);
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

/// Each block's signature: the xxhash64 of its sectors' data checksums. Where the
/// csum tree has them (uncompressed extents of a file with checksums) they are
/// taken from it and no data is read; elsewhere (compressed or inline extents,
/// holes, nodatasum files, sectors without a checksum) the block is read and its
/// sectors checksummed the same way, so equal contents give equal signatures
/// whichever way they were found. (A file's last sector is checksummed padded with
/// zeros, as its on-disk sector is.) A signature is only a hint: every run is
/// compared byte for byte before it is shared.
fn hash_file(fs: &Filesystem, f: &FileRec) -> Result<Vec<u64>> {
    let inode = fs.inode_item(f.node)?;
    let ss = fs.info.sectorsize as u64;
    let csum = fs.info.csum_type;
    let csize = csum.size();
    let mut hashes = Vec::with_capacity(f.size.div_ceil(DEDUPE_BLOCK_BYTES) as usize);
    // Per window of READ_CHUNK_BYTES: each sector's checksum, if known.
    let sectors_max = (READ_CHUNK_BYTES / ss) as usize;
    let mut sums = vec![0u8; sectors_max * csize];
    let mut known = vec![false; sectors_max];
    let mut w0 = 0u64;
    while w0 < f.size {
        let w1 = (w0 + READ_CHUNK_BYTES).min(f.size);
        known.fill(false);
        if !f.nodatasum {
            window_csums(fs, f.node, (w0, w1), &mut sums, &mut known)?;
        }
        let mut b0 = w0;
        while b0 < w1 {
            let b1 = (b0 + DEDUPE_BLOCK_BYTES).min(w1);
            let (s0, s1) = (((b0 - w0) / ss) as usize, ((b1 - w0).div_ceil(ss)) as usize);
            let sig = if known[s0..s1].iter().all(|&k| k) {
                xxh64(&sums[s0 * csize..s1 * csize])
            } else {
                let data = fs.read_inode(f.node, &inode, b0, (b1 - b0) as usize)?;
                let mut own = Vec::with_capacity((s1 - s0) * csize);
                let mut last = vec![0u8; ss as usize];
                for sector in data.chunks(ss as usize) {
                    let c = if sector.len() == ss as usize {
                        csum.compute(sector)
                    } else {
                        last[..sector.len()].copy_from_slice(sector);
                        csum.compute(&last)
                    };
                    own.extend_from_slice(&c[..csize]);
                }
                xxh64(&own)
            };
            hashes.push(sig);
            b0 = b1;
        }
        w0 = w1;
    }
    Ok(hashes)
}

/// Fills the checksums of the sectors of file range `[w0, w1)` that lie in
/// uncompressed extents, from the csum tree (`known` marks them).
fn window_csums(
    fs: &Filesystem,
    node: Node,
    (w0, w1): (u64, u64),
    sums: &mut [u8],
    known: &mut [bool],
) -> Result<()> {
    let ss = fs.info.sectorsize as u64;
    let csize = fs.info.csum_type.size();
    fs.for_each_extent(node, w0, w1, |fe| {
        let FileExtentBody::Regular {
            disk_bytenr,
            offset,
            ..
        } = fe.item.body
        else {
            return Ok(true);
        };
        if fe.is_hole_or_prealloc() || fe.item.compression != 0 {
            return Ok(true);
        }
        let s = fe.file_offset.max(w0);
        let e = fe.end().min(w1);
        // Sector-aligned pieces only (the format keeps file offsets aligned; a
        // hostile item that does not is simply read).
        let logical = disk_bytenr
            .checked_add(offset)
            .and_then(|l| l.checked_add(s - fe.file_offset));
        let Some(logical) = logical else {
            return Ok(true);
        };
        if s >= e || (s - w0) % ss != 0 || logical % ss != 0 {
            return Ok(true);
        }
        let first = ((s - w0) / ss) as usize;
        let n = ((e - s).div_ceil(ss) as usize).min(known.len().saturating_sub(first));
        for (i, c) in fs.info.lookup_csums(logical, n)?.into_iter().enumerate() {
            if let Some(c) = c.filter(|c| c.len() == csize) {
                let at = first + i;
                sums[at * csize..(at + 1) * csize].copy_from_slice(&c);
                known[at] = true;
            }
        }
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::inode::NewInode;
    use crate::tools::mkfs::{make_filesystem, MkfsOptions};
    use crate::{Device, MemDevice};
    use std::sync::Arc;
    use ubtrfs_compress::Compression;
    use ubtrfs_format::items::Timespec;

    fn new_file(t: &mut Trans, name: &[u8], data: &[u8]) -> Node {
        let attr = NewInode {
            mode: 0o100644,
            uid: 0,
            gid: 0,
            rdev: 0,
            time: Timespec::default(),
        };
        let ino = t
            .create(FS_TREE_OBJECTID, FIRST_FREE_OBJECTID, name, attr)
            .expect("create");
        t.write(FS_TREE_OBJECTID, ino, 0, data, Timespec::default())
            .expect("write");
        Node::new(FS_TREE_OBJECTID, ino)
    }

    /// Signatures from the csum tree (an uncompressed copy) and from reading the
    /// data (a compressed copy) agree, so the two are found and shared.
    #[test]
    fn csum_tree_and_read_signatures_agree() {
        let dev = MemDevice::new(vec![0u8; 256 << 20], "dedupe");
        let mut t = make_filesystem(dev as Arc<dyn Device>, &MkfsOptions::default()).expect("mkfs");
        // Compressible, not a multiple of the sector or the dedupe block.
        let data: Vec<u8> = (0..(1u64 << 20) + 3 * 4096 + 77)
            .map(|i| b"dedupe me, "[(i % 11) as usize] ^ ((i / 5000) as u8))
            .collect();
        let plain = new_file(&mut t, b"plain", &data);
        let copy = new_file(&mut t, b"copy", &data);
        t.compress = Some((Compression::Zstd, None));
        let packed = new_file(&mut t, b"packed", &data);
        t.compress = None;
        t.commit().expect("commit");
        let exts = t.fs.file_extents(packed).expect("extents");
        assert!(exts.iter().all(|e| e.item.compression != 0), "{exts:?}");

        let sig = |node: Node| {
            let f = FileRec {
                node,
                size: data.len() as u64,
                nodatasum: false,
                hashes: Vec::new(),
            };
            hash_file(&t.fs, &f).expect("hash")
        };
        let want = sig(plain);
        assert_eq!(want.len(), 9);
        assert_eq!(sig(copy), want);
        assert_eq!(sig(packed), want, "read and csum-tree signatures differ");

        let opts = DedupeOptions {
            min_size_bytes: 1,
            dry_run: false,
        };
        let top = Node::new(FS_TREE_OBJECTID, FIRST_FREE_OBJECTID);
        let r = dedupe(&mut t, &[top], &opts, &mut |_, _| {}).expect("dedupe");
        assert_eq!(r.files, 3);
        assert_eq!(r.bytes_deduped, 2 * data.len() as u64, "{r:?}");
        assert_eq!(r.bytes_differing, 0, "{r:?}");
        for n in [plain, copy, packed] {
            assert!(t.fs.read(n, 0, data.len()).expect("read") == data);
        }
        let again = dedupe(&mut t, &[top], &opts, &mut |_, _| {}).expect("dedupe");
        assert_eq!(again.bytes_deduped, 0, "{again:?}");
        assert_eq!(again.bytes_already_shared, 2 * data.len() as u64);
    }

    /// A copy whose data fails its checksums is left unshared and reported, and
    /// the rest of the run goes on (the comparison reads it raw first and finds
    /// the bytes differ, then the verified read fails).
    #[test]
    fn damaged_copy_is_left_unshared() {
        let dev = MemDevice::new(vec![0u8; 256 << 20], "dedupe");
        let mut t =
            make_filesystem(dev.clone() as Arc<dyn Device>, &MkfsOptions::default()).expect("mkfs");
        let data: Vec<u8> = (0..256u32 << 10).map(|i| (i % 251) as u8).collect();
        let other: Vec<u8> = (0..384u32 << 10).map(|i| (i % 241) as u8).collect();
        let a = new_file(&mut t, b"a", &data);
        let b = new_file(&mut t, b"b", &data);
        let c = new_file(&mut t, b"c", &other);
        let d = new_file(&mut t, b"d", &other);
        t.commit().expect("commit");
        // Damage one byte of b's data on the device (not its checksum).
        let exts = t.fs.file_extents(b).expect("extents");
        let FileExtentBody::Regular { disk_bytenr, .. } = exts[0].item.body else {
            panic!("{exts:?}");
        };
        let logical = disk_bytenr + 70_000;
        let phys =
            t.fs.info
                .chunk_map
                .lookup(logical)
                .and_then(|e| e.map(logical, 0))
                .expect("map");
        let mut byte = [0u8; 1];
        dev.read_at(phys.offset, &mut byte).expect("read");
        byte[0] ^= 0x5a;
        dev.write_at(phys.offset, &byte).expect("write");

        let opts = DedupeOptions {
            min_size_bytes: 1,
            dry_run: false,
        };
        let top = Node::new(FS_TREE_OBJECTID, FIRST_FREE_OBJECTID);
        let r = dedupe(&mut t, &[top], &opts, &mut |_, _| {}).expect("dedupe");
        assert_eq!(r.bytes_unreadable, data.len() as u64, "{r:?}");
        assert_eq!(r.bytes_deduped, other.len() as u64, "{r:?}");
        let warnings = t.fs.info.take_warnings();
        assert!(
            warnings.iter().any(|w| w.contains("not shared")),
            "{warnings:?}"
        );
        assert!(t.fs.read(a, 0, data.len()).expect("read a") == data);
        assert!(
            t.fs.read(b, 0, data.len()).is_err(),
            "b still reads as damaged"
        );
        assert!(t.fs.read(d, 0, other.len()).expect("read d") == other);
        let (ea, eb) = (
            t.fs.file_extents(a).expect("a"),
            t.fs.file_extents(b).expect("b"),
        );
        assert_ne!(
            ea[0].item.body, eb[0].item.body,
            "the damaged copy was shared"
        );
        let (ec, ed) = (
            t.fs.file_extents(c).expect("c"),
            t.fs.file_extents(d).expect("d"),
        );
        assert_eq!(ec[0].item.body, ed[0].item.body, "c and d not shared");
    }
}
