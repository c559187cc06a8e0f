//! The fuzz harness, shared by the cargo-fuzz target (`fuzz/fuzz_targets/image.rs`) and
//! the regression test (`crates/core/tests/fuzz_regress.rs`), so an input that once
//! crashed the fuzzer is replayed by plain `cargo test`.
//!
//! Input: one flags byte, then a [`crate::fuzzing::sparse_dev`] encoding of a device.
//!
//! * [`FLAG_FIX_CSUMS`]: before opening, recompute the checksum of every superblock
//!   copy and of every stored block that carries the filesystem's fsid at the tree
//!   block header's fsid offset. Without this almost every mutation of metadata dies
//!   at the checksum check and the fuzzer never reaches the code behind it.
//! * [`FLAG_VERIFY_DATA`]: verify data checksums on reads.
//!
//! The run is bounded: at most [`Limits::entries`] inodes visited, [`Limits::file_bytes`]
//! read per file and [`Limits::total_bytes`] in all, and [`Limits::dump_bytes`] of
//! dump-tree output. Everything the engine returns must be `Ok` or `Err`; a panic, a
//! hang or an unbounded allocation is a bug in the engine.

use crate::fs::{Filesystem, Node, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use crate::fuzzing::sparse_dev::{decode, SparseDevice, SPARSE_BLOCK_SIZE};
use crate::io::dev::Device;
use crate::io::disk_io::{FsInfo, OpenOptions};
use crate::io::root_tree::root_ptr_of;
use crate::tree::RootPtr;
use std::collections::HashSet;
use std::io::Write;
use std::sync::Arc;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::RootItem;
use ubtrfs_format::key::Key;
use ubtrfs_format::superblock::SuperBlock;

/// Flags byte: recompute metadata checksums before opening.
pub const FLAG_FIX_CSUMS: u8 = 1;
/// Flags byte: verify data checksums on reads.
pub const FLAG_VERIFY_DATA: u8 = 2;
/// The flags byte seeds are written with.
pub const SEED_FLAGS: u8 = FLAG_FIX_CSUMS | FLAG_VERIFY_DATA;

/// Bounds of one run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Directory entries visited.
    pub entries: usize,
    /// Bytes read from one file.
    pub file_bytes: usize,
    /// Bytes read from all files.
    pub total_bytes: u64,
    /// Bytes of dump-tree output produced.
    pub dump_bytes: u64,
    /// Items visited by the whole-tree walks (every tree, in key order).
    pub tree_items: usize,
    /// Tree-block cache of the opened filesystem.
    pub cache_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            entries: 10_000,
            file_bytes: 1 << 20,
            total_bytes: 16 << 20,
            dump_bytes: 16 << 20,
            tree_items: 200_000,
            cache_bytes: 8 << 20,
        }
    }
}

/// What a run did, for tests.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The input decoded into a device.
    pub decoded: bool,
    /// Why the filesystem did not open (None when it did or the input did not decode).
    pub open_error: Option<String>,
    /// Errors met while walking (the first 100).
    pub errors: Vec<String>,
    /// Inodes visited.
    pub entries: usize,
    /// File bytes read.
    pub bytes_read: u64,
    /// dump-tree ran to the end without error.
    pub dumped: bool,
    /// The image was opened for writing (validation, replay and recovery passed).
    pub write_started: bool,
    /// The write phase's changes were committed.
    pub write_committed: bool,
}

impl Outcome {
    fn note<T>(&mut self, what: &str, r: crate::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                if self.errors.len() < 100 {
                    self.errors.push(format!("{what}: {e}"));
                }
                None
            }
        }
    }
}

/// The fuzz target's body.
pub fn fuzz_one(data: &[u8]) {
    let _ = run(data);
}

/// Decodes, optionally repairs checksums, opens and walks; with default limits.
pub fn run(data: &[u8]) -> Outcome {
    run_with(data, Limits::default())
}

/// Decodes, optionally repairs checksums, opens and walks within `limits`.
pub fn run_with(data: &[u8], limits: Limits) -> Outcome {
    let Some((&flags, body)) = data.split_first() else {
        return Outcome::default();
    };
    let Some(dev) = decode(body) else {
        return Outcome::default();
    };
    if flags & FLAG_FIX_CSUMS != 0 {
        fix_checksums(&dev);
    }
    let mut out = run_device(Arc::new(dev), flags & FLAG_VERIFY_DATA != 0, limits);
    out.decoded = true;
    out
}

/// Opens a device and walks everything within `limits`.
pub fn run_device(dev: Arc<dyn Device>, verify_data: bool, limits: Limits) -> Outcome {
    let mut out = Outcome::default();
    let opts = OpenOptions {
        verify_data_csum: verify_data,
        cache_bytes_max: limits.cache_bytes,
        ..Default::default()
    };
    let info = match FsInfo::open(vec![dev.clone()], opts) {
        Ok(i) => i,
        Err(e) => {
            out.open_error = Some(e.to_string());
            return out;
        }
    };
    let fs = Filesystem::from_info(info);
    walk_trees(&fs, &limits, &mut out);
    walk(&fs, &limits, &mut out);
    let mut sink = LimitedSink {
        left: limits.dump_bytes,
    };
    let r = crate::tools::print_tree::dump_tree(&fs.info, None, None, &mut sink);
    out.dumped = out.note("dump-tree", r).is_some();
    // The whole check: every problem is a finding, never a panic.
    let copts = crate::check::CheckOptions {
        check_data_csum: verify_data,
        qgroup_report: false,
        item_by_item: false,
        // Small, so that fuzzed images go through the spill to a temporary file
        // and its merge too.
        refs_mem_bytes_max: 64 << 10,
    };
    let r = crate::check::check(&fs, &copts, &mut |_, _| {});
    out.note("check", r);
    let _ = fs.info.take_warnings();
    drop(fs);
    write_phase(dev, verify_data, &limits, &mut out);
    out
}

/// The write side, after the read side is done with the device: the image opened
/// for writing as every writing command opens it (validation, log replay,
/// relocation recovery, orphan cleanup), changes to new and to existing inodes, an
/// fsync through the tree log, a snapshot, a commit, and the committed image opened
/// and walked again. Any step may fail with an error (a damaged image is refused or
/// a change is refused where it meets the damage); none may panic or hang.
fn write_phase(dev: Arc<dyn Device>, verify_data: bool, limits: &Limits, out: &mut Outcome) {
    use crate::inode::reflink::FilePos;
    use crate::transaction::Trans;
    use crate::tree_log::TreeLog;
    use crate::NewInode;
    use ubtrfs_format::items::Timespec;
    let opts = OpenOptions {
        writable: true,
        verify_data_csum: verify_data,
        cache_bytes_max: limits.cache_bytes,
        ..Default::default()
    };
    let Some(info) = out.note("write: open", FsInfo::open(vec![dev.clone()], opts.clone())) else {
        return;
    };
    let Some(mut t) = out.note("write: start", Trans::from_fs(info)) else {
        return;
    };
    out.write_started = true;
    let time = Timespec {
        sec: 1_700_000_000,
        nsec: 0,
    };
    let (root, top) = (FS_TREE_OBJECTID, FIRST_FREE_OBJECTID);
    let attr = |mode: u32| NewInode {
        mode,
        uid: 0,
        gid: 0,
        rdev: 0,
        time,
    };
    // Existing entries of the top directory: their inodes are changed too, so the
    // changes meet whatever the image holds.
    let existing = out
        .note("write: list", t.list_dir(root, top))
        .unwrap_or_default();
    let dir = out.note(
        "write: mkdir",
        t.create(root, top, b"fuzz-d", attr(0o40755)),
    );
    if let Some(dir) = dir {
        if let Some(f) = out.note("write: create", t.create(root, dir, b"f", attr(0o100644))) {
            let data = vec![0x5a; 9000];
            out.note("write: write", t.write(root, f, 0, &data, time));
            out.note(
                "write: overwrite",
                t.write(root, f, 4096, &data[..4096], time),
            );
            out.note(
                "write: xattr",
                t.set_xattr(root, f, b"user.fuzz", b"v", time),
            );
            out.note("write: punch", t.punch_hole(root, f, 0, 4096, time));
            let mut log = TreeLog::new();
            out.note("write: fsync", log.fsync(&mut t, root, f, false));
            out.note("write: link", t.link(root, f, top, b"fuzz-link", time));
        }
    }
    for (i, (name, _)) in existing.iter().take(4).enumerate() {
        // A subvolume entry's location is another tree's root: renamed only.
        let Some(Some((ino, _, loc))) = out.note("write: lookup", t.lookup(root, top, name)) else {
            continue;
        };
        let inode = if loc.ty == INODE_ITEM_KEY {
            match out.note("write: read inode", t.read_inode(root, ino)) {
                Some(i) => i,
                None => continue,
            }
        } else {
            Default::default()
        };
        let regular = inode.mode & S_IFMT == S_IFREG;
        if regular {
            out.note("write: cow", t.write(root, ino, 0, &[0xa5; 4096], time));
            let size = inode.size.max(4096) / 2;
            out.note("write: truncate", t.truncate(root, ino, size, time));
            if size >= 8192 {
                let at = |offset| FilePos { root, ino, offset };
                out.note("write: clone", t.clone_range(at(0), at(4096), 4096, time));
            }
        }
        if regular && i % 2 == 1 {
            out.note("write: unlink", t.unlink(root, top, name, time));
        } else {
            let moved = format!("fuzz-moved-{i}");
            let r = t.rename(root, top, name, top, moved.as_bytes(), false, time);
            out.note("write: rename", r);
        }
    }
    out.note(
        "write: snapshot",
        t.create_snapshot(root, root, top, b"fuzz-snap", false, time),
    );
    if out.note("write: commit", t.commit()).is_none() {
        return;
    }
    out.write_committed = true;
    // FITRIM after the commit: every block group's free space is read (from a
    // hostile free-space tree too) and discarded; the reopen below must still work.
    out.note("write: trim", t.trim(0, u64::MAX, 0));
    drop(t);
    let opts = OpenOptions {
        writable: false,
        ..opts
    };
    let Some(info) = out.note("write: reopen", FsInfo::open(vec![dev], opts)) else {
        return;
    };
    let fs = Filesystem::from_info(info);
    walk(&fs, limits, out);
}

/// Every item of every tree the root tree knows, in key order.
fn walk_trees(fs: &Filesystem, limits: &Limits, out: &mut Outcome) {
    let mut roots: Vec<RootPtr> = vec![fs.info.root_tree_ptr()];
    let ids = (CHUNK_TREE_OBJECTID..FIRST_FREE_OBJECTID).chain([DATA_RELOC_TREE_OBJECTID]);
    roots.extend(ids.filter_map(|id| fs.info.tree_ptr(id)));
    // Subvolume trees come from their ROOT_ITEMs (found while walking the root tree).
    let mut left = limits.tree_items;
    let mut i = 0;
    while i < roots.len() {
        let root = roots[i];
        i += 1;
        let mut subvols = Vec::new();
        let r = crate::tree::ctree::walk_items(&fs.info, &root, Key::MIN, |k, data| {
            if root.id == ROOT_TREE_OBJECTID
                && k.ty == ROOT_ITEM_KEY
                && k.objectid >= FIRST_FREE_OBJECTID
                && subvols.len() < 1000
            {
                if let Ok(ri) = RootItem::parse(data) {
                    subvols.push(root_ptr_of(k.objectid, &ri));
                }
            }
            left = left.saturating_sub(1);
            Ok(left > 0)
        });
        out.note("tree walk", r);
        roots.extend(subvols);
        if left == 0 {
            break;
        }
    }
}

fn walk(fs: &Filesystem, limits: &Limits, out: &mut Outcome) {
    let mut stack = vec![fs.top()];
    if let Some(subvols) = out.note("subvolumes", fs.subvolumes()) {
        for s in subvols.iter().rev() {
            stack.push(Node::new(s.id, FIRST_FREE_OBJECTID));
        }
    }
    let mut visited: HashSet<Node> = HashSet::new();
    while let Some(node) = stack.pop() {
        if out.entries >= limits.entries {
            break;
        }
        if !visited.insert(node) {
            continue;
        }
        out.entries += 1;
        let Some(st) = out.note("stat", fs.stat(node)) else {
            continue;
        };
        let r = fs.xattrs(node);
        if let Some(xs) = out.note("xattrs", r) {
            // The by-name side (XATTR_ITEM lookup by hash) of the first few.
            for (name, _) in xs.iter().take(8) {
                let r = fs.getxattr(node, name);
                out.note("getxattr", r);
            }
        }
        match st.mode & S_IFMT {
            S_IFDIR => {
                let mut kids = Vec::new();
                let room = limits.entries.saturating_sub(out.entries + stack.len());
                let r = fs.readdir_each(node, |e| {
                    kids.push(e);
                    Ok(kids.len() < room)
                });
                out.note("readdir", r);
                for e in kids.iter().rev() {
                    // The DIR_ITEM side of the same entry.
                    let r = fs.lookup(node, &e.name);
                    out.note("lookup", r);
                    stack.push(e.node);
                }
            }
            S_IFREG => {
                let left = limits.total_bytes.saturating_sub(out.bytes_read);
                let want = (limits.file_bytes as u64).min(left) as usize;
                if want > 0 {
                    if let Some(d) = out.note("read", fs.read(node, 0, want)) {
                        out.bytes_read += d.len() as u64;
                    }
                }
                if st.size > limits.file_bytes as u64 && out.bytes_read < limits.total_bytes {
                    // The tail, through a search that does not start at offset 0.
                    let r = fs.read(node, st.size.saturating_sub(4096), 8192);
                    if let Some(d) = out.note("read tail", r) {
                        out.bytes_read += d.len() as u64;
                    }
                }
                let r = fs.data_ranges(node, st.size.min(limits.file_bytes as u64));
                out.note("data ranges", r);
            }
            S_IFLNK => {
                let r = fs.readlink(node);
                out.note("readlink", r);
            }
            _ => {}
        }
    }
}

/// A writer that accepts `left` bytes, then fails (which stops dump-tree).
struct LimitedSink {
    left: u64,
}

impl Write for LimitedSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            self.left = 0;
            return Err(std::io::Error::other("dump output limit reached"));
        }
        self.left -= buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Recomputes the checksum of every superblock copy (that has the btrfs magic) and of
/// every stored block that looks like a tree block of this filesystem (the fsid from the
/// primary superblock at the header's fsid offset), with the primary superblock's
/// checksum type and nodesize. Lets tests and the fuzzer change metadata freely.
pub fn fix_checksums(dev: &SparseDevice) {
    let mut buf = vec![0u8; SUPER_INFO_SIZE];
    if dev.read_at(SUPER_INFO_OFFSET, &mut buf).is_err() {
        return;
    }
    let Ok(sb) = SuperBlock::parse(&buf) else {
        return;
    };
    let Some(ct) = sb.csum_type() else {
        return;
    };
    let n = ct.size();
    let supers: Vec<u64> = (0..SUPER_MIRROR_MAX).map(super_mirror_offset).collect();
    let fsid = sb.metadata_fsid();
    let ns = sb.nodesize;
    if ns.is_power_of_two() && (4096..=65536).contains(&ns) {
        let mut node = vec![0u8; ns as usize];
        for idx in dev.block_indexes() {
            let off = idx * SPARSE_BLOCK_SIZE as u64;
            if supers.contains(&off) || dev.read_at(off, &mut node).is_err() {
                continue;
            }
            if node[0x20..0x30] != fsid[..] {
                continue;
            }
            let c = ct.compute(&node[CSUM_SIZE_MAX..]);
            let _ = dev.write_at(off, &c[..n]);
        }
    }
    for off in supers {
        if dev.read_at(off, &mut buf).is_err() {
            continue;
        }
        if buf[0x40..0x48] != BTRFS_MAGIC.to_le_bytes() {
            continue;
        }
        let c = ct.compute(&buf[CSUM_SIZE_MAX..]);
        let _ = dev.write_at(off, &c[..n]);
    }
}

/// A fuzz input (flags byte and encoding) for a raw image.
pub fn seed_from_image(image: &[u8]) -> Vec<u8> {
    let mut v = vec![SEED_FLAGS];
    v.extend_from_slice(&crate::fuzzing::sparse_dev::encode(image));
    v
}
