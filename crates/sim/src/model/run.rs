//! The engine side of a model run: [`apply_engine`] applies an [`Op`] to a `Trans`;
//! [`Harness`] applies each op to the engine and to the model, checks the touched paths
//! after every op and the whole tree after commits, also on a freshly opened copy of
//! the device ([`SparseMem`] makes copies cheap). [`run_seed`] runs one seeded
//! workload; [`replay`] reruns recorded [`Step`]s and [`minimize`] shrinks a failing
//! sequence to a short reproduction.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::sync::Arc;

use ubtrfs_compress::Compression;
use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::mode::{S_IFDIR, S_IFREG};
use ubtrfs_core::tools::mkfs::make_filesystem;
use ubtrfs_core::Device;
use ubtrfs_core::NewInode;
use ubtrfs_core::{Error, FilePos, Filesystem, FsInfo, OpenOptions, Synced, Trans, TreeLog};

use super::op::{bulk_data, bulk_name, bulk_victims, link_name};
use super::{
    compare_paths, compare_quotas, compare_tree, gen_op, gen_op_with, join, open_ro, show,
    write_data, FsConfig, Id, Model, Op, FS_TREE, ROOT, TOP_DIR,
};
use crate::host::btrfs_check_image;
use crate::rng::Rng;

/// Wall-clock-free time stamps: deterministic runs.
pub fn time_of(step: u64) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + step as i64,
        nsec: (step * 7919 % 1_000_000_000) as u32,
    }
}

/// Applies `op` to the engine: the new inode for creating ops (the new tree for
/// subvolume create and snapshot), else `None`. `ino_of` maps model identities to
/// inode numbers and `tree_of` subvolume roots to tree ids; a model path resolves to
/// its tree and inode through them.
///
/// The rules a mount applies before the engine sees an op are made here too, in
/// the model's order: EROFS for a change inside a read-only subvolume (read from
/// the engine's ROOT_ITEM), EXDEV for a name moved or linked between subvolumes.
pub fn apply_engine(
    t: &mut Trans,
    m: &Model,
    ino_of: &HashMap<Id, u64>,
    tree_of: &HashMap<Id, u64>,
    op: &Op,
    step: u64,
) -> Result<Option<u64>, Error> {
    let tm = time_of(step);
    // (tree, inode) of a model path.
    let at = |p: &[u8]| -> Result<(u64, u64), Error> {
        let (sv, id) = m.resolve_sv(p).ok_or_else(|| Error::NotFound(show(p)))?;
        let tree = tree_of
            .get(&sv)
            .copied()
            .ok_or_else(|| Error::NotFound(format!("{} (no tree mapped)", show(p))))?;
        let ino = ino_of
            .get(&id)
            .copied()
            .ok_or_else(|| Error::NotFound(format!("{} (no inode mapped)", show(p))))?;
        Ok((tree, ino))
    };
    let ino = |p: &[u8]| at(p).map(|(_, i)| i);
    for p in op.written() {
        if let Ok((tree, _)) = at(p) {
            let flags = t.fs.subvol_root_item(tree)?.flags;
            if flags & ubtrfs_core::format::consts::ROOT_SUBVOL_RDONLY != 0 {
                return Err(Error::ReadOnly(show(p)));
            }
        }
    }
    if let Some((a, b)) = op.linked_dirs() {
        if let (Ok((x, _)), Ok((y, _))) = (at(a), at(b)) {
            if x != y {
                return Err(Error::CrossDevice(format!("{} and {}", show(a), show(b))));
            }
        }
    }
    // The tree every other op works in: that of its first written path.
    let tree = op
        .written()
        .first()
        .and_then(|p| at(p).ok())
        .map_or(FS_TREE, |(tr, _)| tr);
    let attr = |mode: u32, uid: u32, gid: u32, rdev: u64| NewInode {
        mode,
        uid,
        gid,
        rdev,
        time: tm,
    };
    match op {
        Op::Create {
            dir,
            name,
            mode,
            rdev,
        } => {
            let a = attr(*mode, 1000, 100, *rdev);
            return t.create(tree, ino(dir)?, name, a).map(Some);
        }
        Op::Symlink { dir, name, target } => {
            let a = attr(0o120777, 0, 0, 0);
            return t.symlink(tree, ino(dir)?, name, target, a).map(Some);
        }
        Op::Write {
            path,
            offset,
            len,
            seed,
        } => t.write(tree, ino(path)?, *offset, &write_data(*len, *seed), tm)?,
        Op::Truncate { path, size } => t.truncate(tree, ino(path)?, *size, tm)?,
        Op::CopyRange {
            src,
            src_off,
            dst,
            dst_off,
            len,
        } => {
            let ((st, s), (dt, d)) = (at(src)?, at(dst)?);
            // One copy_file_range(2) on the kernel copies what the source held when
            // it started; the engine copies in bounded calls, which must not go on
            // into what they appended themselves (a copy within one file).
            let size = t.read_inode(st, s)?.size;
            let len = (*len).min(size.saturating_sub(*src_off));
            let mut done = 0;
            while done < len {
                let (n, _) = t.copy_file_range(
                    FilePos::new(st, s, src_off + done),
                    FilePos::new(dt, d, dst_off + done),
                    len - done,
                    tm,
                )?;
                if n == 0 {
                    break;
                }
                done += n;
            }
        }
        Op::Dedupe {
            src,
            src_off,
            dst,
            dst_off,
            len,
        } => {
            let ((st, s), (dt, d)) = (at(src)?, at(dst)?);
            t.dedupe_range(
                FilePos::new(st, s, *src_off),
                FilePos::new(dt, d, *dst_off),
                *len,
            )?;
        }
        Op::Fallocate {
            path,
            offset,
            len,
            keep_size,
        } => drop(t.fallocate(tree, ino(path)?, *offset, *len, *keep_size, tm)?),
        Op::Unlink { dir, name } => t.unlink(tree, ino(dir)?, name, tm)?,
        Op::Rmdir { dir, name } => t.rmdir(tree, ino(dir)?, name, tm)?,
        Op::Rename {
            odir,
            oname,
            ndir,
            nname,
            noreplace,
        } => {
            let (od, nd) = (ino(odir)?, ino(ndir)?);
            t.rename(tree, od, oname, nd, nname, *noreplace, tm)?
        }
        Op::Link { src, dir, name } => t.link(tree, ino(src)?, ino(dir)?, name, tm)?,
        Op::SetXattr { path, name, value } => t.set_xattr(tree, ino(path)?, name, value, tm)?,
        Op::RemoveXattr { path, name } => t.remove_xattr(tree, ino(path)?, name, tm)?,
        Op::Chmod { path, perm } => {
            t.setattr(tree, ino(path)?, Some(*perm), None, None, None, None, tm)?
        }
        Op::PunchHole { path, offset, len } => t.punch_hole(tree, ino(path)?, *offset, *len, tm)?,
        Op::ZeroRange {
            path,
            offset,
            len,
            keep_size,
        } => t.zero_range(tree, ino(path)?, *offset, *len, *keep_size, tm)?,
        Op::RenameExchange {
            adir,
            aname,
            bdir,
            bname,
        } => t.rename_exchange(tree, ino(adir)?, aname, ino(bdir)?, bname, tm)?,
        Op::BulkCreate { dir, first, count } => {
            let d = ino(dir)?;
            for i in *first..first + count {
                if t.lookup(tree, d, &bulk_name(i))?.is_some() {
                    return Err(Error::Exists(show(&bulk_name(i))));
                }
            }
            for i in *first..first + count {
                let f = t.create(tree, d, &bulk_name(i), attr(S_IFREG | 0o644, 0, 0, 0))?;
                t.write(tree, f, 0, &bulk_data(i), tm)?;
                if i % 5 == 0 {
                    t.set_xattr(tree, f, b"user.bulk", &i.to_le_bytes(), tm)?;
                }
            }
        }
        Op::BulkLink {
            src,
            dir,
            first,
            count,
        } => {
            let (s, d) = (ino(src)?, ino(dir)?);
            for i in *first..first + count {
                t.link(tree, s, d, &link_name(i), tm)?;
            }
        }
        Op::BulkUnlink { dir, keep_every } => {
            let d = ino(dir)?;
            let id = m.resolve(dir).ok_or_else(|| Error::NotFound(show(dir)))?;
            let entries = m
                .node(id)
                .entries()
                .ok_or_else(|| Error::NotDir(show(dir)))?;
            for v in bulk_victims(entries, m, *keep_every) {
                t.unlink(tree, d, &v, tm)?;
            }
        }
        Op::SubvolCreate { dir, name } => {
            let d = ino(dir)?;
            return t
                .create_subvolume(tree, d, name, S_IFDIR | 0o755, 0, 0, tm)
                .map(Some);
        }
        Op::Snapshot {
            src,
            dir,
            name,
            readonly,
        } => {
            let (sv, id) = m
                .resolve_sv(src)
                .ok_or_else(|| Error::NotFound(show(src)))?;
            if sv != id {
                return Err(Error::Invalid(format!("{}: not a subvolume", show(src))));
            }
            let src_tree = at(src)?.0;
            let d = ino(dir)?;
            return t
                .create_snapshot(src_tree, tree, d, name, *readonly, tm)
                .map(Some);
        }
        Op::SubvolDelete { dir, name } => {
            let d = ino(dir)?;
            t.delete_subvolume(tree, d, name, tm)?;
            // Offline `subvolume delete` drops the tree to the end.
            t.drop_dead_roots(None, None, &mut |_| {})?;
        }
    }
    Ok(None)
}

/// A subvolume deletion's check: (its tree, (data bytes used before, data bytes
/// the recount predicts it frees)).
type FreedPrediction = (u64, (u64, u64));

/// True unless a deleted subvolume waits for the cleaner (an rmdir during an
/// overlapped commit): quota accounting keeps such a tree until its drop ends,
/// the recount leaves it out.
fn no_dead_roots(t: &Trans) -> Result<bool, String> {
    Ok(t.dead_roots()
        .map_err(|e| format!("dead roots: {e}"))?
        .is_empty())
}

/// Bytes used in the data block groups.
fn data_used(fs: &Filesystem) -> Result<u64, String> {
    Ok(ubtrfs_core::tools::space_info::space_infos(fs)
        .map_err(|e| format!("space info: {e}"))?
        .iter()
        .filter(|s| s.ty == ubtrfs_core::format::consts::BLOCK_GROUP_DATA)
        .map(|s| s.used_bytes)
        .sum())
}

/// Granularity of [`SparseMem`].
const SPARSE_CHUNK: usize = 64 << 10;

/// An in-memory device storing only the 64 KiB chunks ever written (the rest reads as
/// zeros), so a copy of a mostly empty 128 MiB image costs a few MiB.
#[derive(Debug)]
pub struct SparseMem {
    size: u64,
    chunks: std::sync::RwLock<Vec<Option<Box<[u8]>>>>,
    name: String,
}

impl SparseMem {
    /// An all-zero device of `size` bytes; `name` identifies it in messages.
    pub fn new(size: u64, name: &str) -> Arc<SparseMem> {
        let n = (size as usize).div_ceil(SPARSE_CHUNK);
        Arc::new(SparseMem {
            size,
            chunks: std::sync::RwLock::new(vec![None; n]),
            name: name.to_string(),
        })
    }

    /// An independent copy of the current bytes.
    pub fn copy(&self, name: &str) -> Arc<SparseMem> {
        let c = self
            .chunks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Arc::new(SparseMem {
            size: self.size,
            chunks: std::sync::RwLock::new(c),
            name: name.to_string(),
        })
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at {offset} beyond the end of {}", self.name),
            )),
        }
    }
}

impl Device for SparseMem {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let chunks = self.chunks.read().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (ci, co) = (pos / SPARSE_CHUNK, pos % SPARSE_CHUNK);
            let n = (SPARSE_CHUNK - co).min(buf.len() - done);
            match &chunks[ci] {
                Some(c) => buf[done..done + n].copy_from_slice(&c[co..co + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut chunks = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (ci, co) = (pos / SPARSE_CHUNK, pos % SPARSE_CHUNK);
            let n = (SPARSE_CHUNK - co).min(buf.len() - done);
            let c = chunks[ci].get_or_insert_with(|| vec![0u8; SPARSE_CHUNK].into_boxed_slice());
            c[co..co + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    /// Zeros the range, dropping the chunks it covers whole (so a trimmed device
    /// reads zeros where the engine said nothing lives).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let n = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        self.check(offset, n)?;
        let mut chunks = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        let mut pos = offset as usize;
        let end = pos + n;
        while pos < end {
            let (ci, co) = (pos / SPARSE_CHUNK, pos % SPARSE_CHUNK);
            let m = (SPARSE_CHUNK - co).min(end - pos);
            if m == SPARSE_CHUNK {
                chunks[ci] = None;
            } else if let Some(c) = chunks[ci].as_mut() {
                c[co..co + m].fill(0);
            }
            pos += m;
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn name(&self) -> String {
        self.name.clone()
    }
}

impl SparseMem {
    /// Writes the stored chunks into `f` (which must be `size` bytes long and read as
    /// zeros elsewhere, e.g. fresh from `set_len`).
    pub fn write_to(&self, f: &std::fs::File) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let chunks = self.chunks.read().unwrap_or_else(|e| e.into_inner());
        for (i, c) in chunks.iter().enumerate() {
            if let Some(c) = c {
                f.write_all_at(c, (i * SPARSE_CHUNK) as u64)?;
            }
        }
        Ok(())
    }
}

/// Runs operations on an engine handle and the model side by side.
pub struct Harness {
    /// The engine's write handle.
    pub t: Trans,
    /// The model, kept in step with the engine.
    pub model: Model,
    /// Inode number of each model node.
    pub ino_of: HashMap<Id, u64>,
    /// Tree id of each model subvolume (by the identity of its root directory).
    pub tree_of: HashMap<Id, u64>,
    /// Subvolume deletions whose freed data was checked against `subvolume du`'s
    /// prediction.
    pub deletes_checked: u64,
    /// Snapshots made.
    pub snapshots: u64,
    /// Empty subvolumes made.
    pub subvols_created: u64,
    /// Operations applied so far (for failure reports).
    pub log: Vec<String>,
    /// The same, replayable.
    pub steps: Vec<Step>,
    /// Step counter; the source of the operations' timestamps ([`time_of`]).
    pub step: u64,
    /// Calls the engine refused as unsupported where the model expected success
    /// (fallocate on an inline file).
    pub unsupported: u64,
    /// Calls that failed as the model predicted.
    pub expected_errors: u64,
    /// Compression set on every handle.
    pub compress: Option<Compression>,
    /// The tree log fsyncs write to.
    pub tree_log: TreeLog,
}

impl Harness {
    /// mkfs on `dev`; the model starts as the empty top directory.
    pub fn mkfs(dev: Arc<dyn Device>, cfg: &FsConfig) -> Result<Harness, String> {
        Self::mkfs_noting(dev, cfg, |_| {})
    }

    /// [`Harness::mkfs`], calling `committed` with the generation of each commit it
    /// makes before the last (mkfs's own, when quotas are then enabled in a second
    /// commit): a crash test must allow those states too, which hold the same empty
    /// top directory.
    pub fn mkfs_noting(
        dev: Arc<dyn Device>,
        cfg: &FsConfig,
        mut committed: impl FnMut(u64),
    ) -> Result<Harness, String> {
        let opts = cfg.mkfs_options();
        let mut t = make_filesystem(dev, &opts).map_err(|e| format!("mkfs: {e}"))?;
        if cfg.quotas {
            committed(t.fs.info.sb.generation);
            t.quota_enable(cfg.simple_quotas)
                .and_then(|()| t.commit())
                .map_err(|e| format!("quota enable: {e}"))?;
        }
        t.compress = cfg.compress.map(|c| (c, None));
        let mut ino_of = HashMap::new();
        ino_of.insert(ROOT, TOP_DIR);
        Ok(Harness {
            t,
            model: Model::new(opts.root_mode, opts.nodesize),
            ino_of,
            tree_of: HashMap::from([(ROOT, FS_TREE)]),
            deletes_checked: 0,
            snapshots: 0,
            subvols_created: 0,
            log: Vec::new(),
            steps: Vec::new(),
            step: 1,
            unsupported: 0,
            expected_errors: 0,
            compress: cfg.compress,
            tree_log: TreeLog::new(),
        })
    }

    /// Replaces the handle by one opened from `dev` (which must hold the last commit).
    pub fn reopen(&mut self, dev: Arc<dyn Device>) -> Result<(), String> {
        let info = FsInfo::open(
            vec![dev],
            OpenOptions {
                writable: true,
                ..Default::default()
            },
        )
        .map_err(|e| format!("reopen for writing: {e}"))?;
        self.t = Trans::from_fs(info).map_err(|e| format!("Trans::from_fs: {e}"))?;
        self.t.compress = self.compress.map(|c| (c, None));
        self.tree_log = TreeLog::new();
        self.log.push("reopen for writing".into());
        self.steps.push(Step::Reopen);
        compare_tree(&self.t.fs, &self.model).map_err(|e| format!("reopened for writing: {e}"))
    }

    /// Applies one op to both sides and checks the touched paths.
    pub fn step(&mut self, op: &Op) -> Result<(), String> {
        self.step += 1;
        self.log.push(format!("{op:?}"));
        self.steps.push(Step::Op(op.clone()));
        let before = self.model.clone();
        let freed = self.predict_freed(op)?;
        let got = apply_engine(
            &mut self.t,
            &self.model,
            &self.ino_of,
            &self.tree_of,
            op,
            self.step,
        );
        let want = self.model.apply(op);
        match (&got, &want) {
            (Ok(Some(tree)), Ok(Some(id)))
                if matches!(op, Op::SubvolCreate { .. } | Op::Snapshot { .. }) =>
            {
                self.tree_of.insert(*id, *tree);
                self.ino_of.insert(*id, TOP_DIR);
                if let Op::Snapshot { dir, name, .. } = op {
                    self.map_snapshot(&join(dir, name), *tree)?;
                    self.snapshots += 1;
                } else {
                    self.subvols_created += 1;
                }
            }
            (Ok(ino), Ok(id)) => {
                if let (Some(ino), Some(id)) = (ino, id) {
                    self.ino_of.insert(*id, *ino);
                }
            }
            (Err(e), Err(errno)) if e.errno() == *errno => self.expected_errors += 1,
            (Err(e @ Error::Unsupported(_)), Ok(None)) if matches!(op, Op::Fallocate { .. }) => {
                // fallocate of a file with an inline extent: the engine refuses it (the
                // kernel would convert the extent). The file must be untouched (checked
                // below against the restored model).
                let inline = match op {
                    Op::Fallocate { path, .. } => self
                        .t
                        .fs
                        .resolve_bytes(path)
                        .and_then(|n| self.t.fs.file_extents(n))
                        .is_ok_and(|x| {
                            x.first().is_some_and(|e| {
                                matches!(
                                    e.item.body,
                                    ubtrfs_core::format::items::FileExtentBody::Inline { .. }
                                )
                            })
                        }),
                    _ => false,
                };
                if !inline {
                    return Err(format!(
                        "{op:?}: engine error `{e}` on a file without an inline extent"
                    ));
                }
                self.model = before;
                self.unsupported += 1;
            }
            (Err(e), Err(errno)) => {
                return Err(format!(
                    "{op:?}: engine error `{e}` (errno {}), model expects errno {errno}",
                    e.errno()
                ))
            }
            (Err(e), Ok(_)) => {
                return Err(format!(
                    "{op:?}: engine error `{e}`, the model expects success"
                ))
            }
            (Ok(_), Err(errno)) => {
                return Err(format!(
                    "{op:?}: engine succeeded, the model expects errno {errno}"
                ))
            }
        }
        if let (Op::BulkCreate { dir, first, count }, Ok(_)) = (op, &want) {
            // The new inodes, by name (the engine has them all by now).
            let (sv, did) = self.model.resolve_sv(dir).expect("bulk dir");
            let (tree, d) = (self.tree_of[&sv], self.ino_of[&did]);
            for i in *first..first + count {
                let id = self
                    .model
                    .resolve(&join(dir, &bulk_name(i)))
                    .expect("just created");
                let (ino, _, _) = self
                    .t
                    .lookup(tree, d, &bulk_name(i))
                    .map_err(|e| format!("{op:?}: lookup: {e}"))?
                    .ok_or_else(|| format!("{op:?}: {} missing", show(&bulk_name(i))))?;
                self.ino_of.insert(id, ino);
            }
        }
        // Forget inodes of nodes that are gone.
        self.ino_of
            .retain(|id, _| self.model.nodes.contains_key(id));
        self.tree_of
            .retain(|id, _| self.model.subvols.contains_key(id));
        compare_paths(&self.t.fs, &self.model, &op.touched())
            .map_err(|e| format!("after {op:?}: {e}"))?;
        if let (Some((tree, bytes)), Ok(_)) = (freed, &want) {
            self.check_freed(tree, bytes)
                .map_err(|e| format!("after {op:?}: {e}"))?;
        }
        if matches!(op, Op::Snapshot { .. } | Op::SubvolDelete { .. }) && want.is_ok() {
            compare_tree(&self.t.fs, &self.model).map_err(|e| format!("after {op:?}: {e}"))?;
            if let (Op::Snapshot { src, .. }, Ok(Some(tree))) = (op, &got) {
                self.check_snapshot_shares(src, *tree)
                    .map_err(|e| format!("after {op:?}: {e}"))?;
            }
        }
        Ok(())
    }

    /// The inodes of a new snapshot's nodes, by path (a snapshot keeps its
    /// source's inode numbers; stand-ins are inode 2).
    fn map_snapshot(&mut self, snap: &[u8], tree: u64) -> Result<(), String> {
        for (p, id) in self.model.paths() {
            let inside = p == snap || (p.starts_with(snap) && p.get(snap.len()) == Some(&b'/'));
            if !inside {
                continue;
            }
            let node = self
                .t
                .fs
                .resolve_bytes(&p)
                .map_err(|e| format!("snapshot {}: {e}", show(&p)))?;
            if node.root != tree && !node.is_placeholder() {
                return Err(format!(
                    "snapshot {}: in tree {}, the snapshot is {tree}",
                    show(&p),
                    node.root
                ));
            }
            self.ino_of.insert(id, node.ino);
        }
        Ok(())
    }

    /// Before deleting a subvolume: commits, then asks the recount (`subvolume
    /// du`'s) what deleting it will free in data: (its tree, data bytes used now,
    /// bytes it predicts freed). None for any other op, or a name that is no
    /// subvolume.
    fn predict_freed(&mut self, op: &Op) -> Result<Option<FreedPrediction>, String> {
        let Op::SubvolDelete { dir, name } = op else {
            return Ok(None);
        };
        let Some(id) = self.model.resolve(&join(dir, name)) else {
            return Ok(None);
        };
        let Some(&tree) = self.tree_of.get(&id) else {
            return Ok(None);
        };
        self.t
            .commit()
            .map_err(|e| format!("commit before deleting: {e}"))?;
        let sharing = ubtrfs_core::tools::subvol_du::compute_sharing(&self.t.fs.info)
            .map_err(|e| format!("recount before deleting: {e}"))?;
        let used = data_used(&self.t.fs)?;
        Ok(Some((tree, (used, sharing.data_freed_by(&[tree])))))
    }

    /// After the deletion (dropped to the end and committed): the data block groups
    /// hold exactly the predicted bytes less.
    fn check_freed(&mut self, tree: u64, (used, predicted): (u64, u64)) -> Result<(), String> {
        let now = data_used(&self.t.fs)?;
        if used.checked_sub(now) != Some(predicted) {
            return Err(format!(
                "deleting subvolume {tree} freed {} data bytes ({used} used before, {now} after), \
                 subvolume du predicted {predicted}",
                used as i128 - now as i128
            ));
        }
        self.deletes_checked += 1;
        Ok(())
    }

    /// After a snapshot (committed by its creation): the recount shows the new tree
    /// holding no data of its own, and referencing exactly its source's data.
    fn check_snapshot_shares(&mut self, src: &[u8], tree: u64) -> Result<(), String> {
        let (sv, _) = self
            .model
            .resolve_sv(src)
            .ok_or_else(|| format!("{}: gone", show(src)))?;
        let src_tree = self.tree_of[&sv];
        let sharing = ubtrfs_core::tools::subvol_du::compute_sharing(&self.t.fs.info)
            .map_err(|e| format!("recount after the snapshot: {e}"))?;
        let own = sharing.data_freed_by(&[tree]);
        let (a, b) = (
            sharing.data_referenced(src_tree),
            sharing.data_referenced(tree),
        );
        if own != 0 || a != b {
            return Err(format!(
                "snapshot {tree} of {src_tree}: subvolume du gives it {own} exclusive data bytes \
                 (want 0) and {b} referenced (its source {a})"
            ));
        }
        Ok(())
    }

    /// fsync (`datasync`: fdatasync) of the model path `path` through the tree
    /// log: no commit unless the log cannot say it (the reason is returned).
    pub fn fsync(&mut self, path: &[u8], datasync: bool) -> Result<Synced, String> {
        let what = if datasync { "fdatasync" } else { "fsync" };
        self.log.push(format!("{what} {}", show(path)));
        self.steps.push(Step::Fsync(path.to_vec(), datasync));
        let id = self
            .model
            .resolve(path)
            .ok_or_else(|| format!("{what} {}: not in the model", show(path)))?;
        let ino = *self
            .ino_of
            .get(&id)
            .ok_or_else(|| format!("{what} {}: no inode mapped", show(path)))?;
        let (sv, _) = self.model.resolve_sv(path).expect("resolved above");
        self.tree_log
            .fsync(&mut self.t, self.tree_of[&sv], ino, datasync)
            .map_err(|e| format!("{what} {}: {e}", show(path)))
    }

    /// Commits the engine and compares the whole tree with the model.
    pub fn commit(&mut self) -> Result<(), String> {
        self.log.push("commit".into());
        self.steps.push(Step::Commit);
        // Subvolumes deleted by rmdir: the cleaner drops them before the commit
        // (the recount the quota comparison makes leaves dead trees out).
        self.t
            .drop_dead_roots(None, None, &mut |_| {})
            .map_err(|e| format!("dropping deleted subvolumes: {e}"))?;
        self.t.commit().map_err(|e| format!("commit: {e}"))?;
        // Every commit also trims (FITRIM): free space reads as zeros from here on,
        // so a tree or extent the engine still uses but counts as free shows up in
        // the comparisons, and trimming itself must never change what files hold.
        match self.t.trim(0, u64::MAX, 0) {
            // A test device that cannot discard (the fault-injecting ones).
            Ok(_) | Err(ubtrfs_core::Error::Unsupported(_)) => {}
            Err(e) => return Err(format!("trim after commit: {e}")),
        }
        compare_tree(&self.t.fs, &self.model)
            .map_err(|e| format!("after commit (uncommitted view): {e}"))
    }

    /// A commit written as a mount writes it: started, then `during` runs in the
    /// next transaction (CoWing, reading and freeing the committing blocks), then
    /// the write-out and the finish. Returns the model as committed.
    pub fn commit_overlapped(
        &mut self,
        during: impl FnOnce(&mut Harness) -> Result<(), String>,
    ) -> Result<Model, String> {
        self.log
            .push("commit (written after the next operations)".into());
        self.steps.push(Step::Commit);
        self.t
            .drop_dead_roots(None, None, &mut |_| {})
            .map_err(|e| format!("dropping deleted subvolumes: {e}"))?;
        let committed = self.model.clone();
        let io = self
            .t
            .commit_start()
            .map_err(|e| format!("commit start: {e}"))?;
        during(self)?;
        if let Some(io) = io {
            io.run().map_err(|e| format!("commit write-out: {e}"))?;
        }
        self.t
            .commit_finish()
            .map_err(|e| format!("commit finish: {e}"))?;
        compare_tree(&self.t.fs, &self.model)
            .map_err(|e| format!("after an overlapped commit (uncommitted view): {e}"))?;
        Ok(committed)
    }

    /// Balances (after committing): `which` 0 = data, 1 = metadata and system,
    /// 2 = everything, 3 = data with usage=50. Contents never change; the whole
    /// tree is compared after it.
    pub fn balance(&mut self, which: u8) -> Result<(), String> {
        use ubtrfs_core::{balance_flags as bf, BalanceArgs, BalanceRequest};
        self.log.push(format!("balance {which}"));
        self.steps.push(Step::Balance(which));
        let usage = BalanceArgs::parse_filters("usage=50").map_err(|e| e.to_string())?;
        let req = match which {
            0 => BalanceRequest {
                flags: bf::DATA,
                ..Default::default()
            },
            1 => BalanceRequest {
                flags: bf::METADATA | bf::SYSTEM,
                ..Default::default()
            },
            3 => BalanceRequest {
                flags: bf::DATA,
                data: usage,
                ..Default::default()
            },
            _ => BalanceRequest {
                flags: bf::DATA | bf::METADATA | bf::SYSTEM,
                ..Default::default()
            },
        };
        self.t
            .commit()
            .map_err(|e| format!("commit before balance: {e}"))?;
        self.t
            .balance(&req, &mut |_, _| {}, &|| false)
            .map_err(|e| format!("balance {which}: {e}"))?;
        compare_tree(&self.t.fs, &self.model).map_err(|e| format!("after balance {which}: {e}"))
    }

    /// The last lines of the log, for a failure message.
    pub fn tail(&self, n: usize) -> String {
        let s = self.log.len().saturating_sub(n);
        self.log[s..]
            .iter()
            .enumerate()
            .map(|(i, l)| format!("  #{}: {l}\n", s + i))
            .collect()
    }
}

/// Parameters of one model run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Random operations to run.
    pub ops: usize,
    /// Device size (at least what the seed's configuration needs).
    pub dev_size: u64,
    /// Run `btrfs check` on the final image.
    pub btrfs_check: bool,
    /// Have the kernel replay one logged fsync cut (needs root).
    pub kernel_replay: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            ops: 60,
            dev_size: 0,
            btrfs_check: false,
            kernel_replay: false,
        }
    }
}

/// Statistics of a successful run.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// Operations applied.
    pub ops: u64,
    /// Commits made.
    pub commits: u64,
    /// Reopens of the handle from the device.
    pub reopens: u64,
    /// Balances run (after a commit).
    pub balances: u64,
    /// fsyncs (each followed by a checked power cut).
    pub fsyncs: u64,
    /// Of those, fsyncs the tree log answered (the others committed).
    pub fsyncs_logged: u64,
    /// Cuts the kernel replayed too (equal to ubtrfs's replay).
    pub kernel_replays: u64,
    /// Calls that failed as the model predicted.
    pub expected_errors: u64,
    /// Calls the engine refused as unsupported where the model expected success.
    pub unsupported: u64,
    /// Deepest FS tree seen at a commit (0 = a single leaf).
    pub max_fs_tree_level: u8,
    /// Most model nodes at a commit.
    pub max_nodes: usize,
    /// Commits written while the next transaction's operations ran.
    pub overlapped_commits: u64,
    /// Snapshots made.
    pub snapshots: u64,
    /// Empty subvolumes made.
    pub subvols_created: u64,
    /// Subvolume deletions that freed exactly the data `subvolume du` predicted.
    pub deletes_checked: u64,
}

/// One seeded run: mkfs on a [`SparseMem`] device, `cfg.ops` random ops with random commits, a
/// full comparison after every commit (through the handle and through a fresh
/// read-only open of a copy of the device), sometimes continuing on a handle reopened from disk.
/// Returns the error and the log tail on failure.
pub fn run_seed(seed: u64, cfg: &RunConfig) -> Result<RunStats, String> {
    run_seed_recorded(seed, cfg).map_err(|(e, _)| e)
}

/// [`run_seed`], returning the steps done up to a failure with it.
pub fn run_seed_recorded(seed: u64, cfg: &RunConfig) -> Result<RunStats, (String, Vec<Step>)> {
    let mut steps = Vec::new();
    run_seed_inner(seed, cfg, &mut steps).map_err(|e| (e, steps))
}

fn run_seed_inner(
    seed: u64,
    cfg: &RunConfig,
    steps_out: &mut Vec<Step>,
) -> Result<RunStats, String> {
    let mut r = Rng::new(seed);
    let fsc = FsConfig::for_seed(seed);
    let dev_size = fsc.dev_size(cfg.dev_size);
    let mem = SparseMem::new(dev_size, &format!("model-{seed}"));
    let dev: Arc<dyn Device> = mem.clone();
    let mut h = Harness::mkfs(dev.clone(), &fsc)?;
    let mut stats = RunStats::default();
    let res = (|| -> Result<(), String> {
        for i in 0..cfg.ops {
            let op = gen_op_with(&h.model, &mut r, true);
            h.step(&op)?;
            stats.ops += 1;
            if r.chance(1, 6) {
                // fsync something (a file or directory), then a power cut.
                let paths: Vec<Vec<u8>> = h
                    .model
                    .paths()
                    .into_iter()
                    .filter(|(_, id)| !h.model.placeholders.contains(id))
                    .map(|(p, _)| p)
                    .collect();
                let path = paths[r.below(paths.len() as u64) as usize].clone();
                let synced = h.fsync(&path, r.chance(1, 3))?;
                stats.fsyncs += 1;
                if synced == Synced::Logged {
                    stats.fsyncs_logged += 1;
                }
                let with_check = cfg.btrfs_check && r.chance(1, 4);
                // The kernel replays the first logged cut of the seeds asked.
                let kernel =
                    cfg.kernel_replay && synced == Synced::Logged && stats.kernel_replays == 0;
                check_fsync_cut(
                    &mem, &h.model, &h.tree_of, &path, synced, with_check, kernel,
                )?;
                stats.kernel_replays += u64::from(kernel);
            }
            let last = i + 1 == cfg.ops;
            if last || r.chance(1, 5) {
                // Half the commits are written while the next operations run.
                let overlapped = !last && r.chance(1, 2);
                let committed = if overlapped {
                    stats.overlapped_commits += 1;
                    h.commit_overlapped(|h| {
                        for _ in 0..r.range(1, 4) {
                            let op = gen_op(&h.model, &mut r);
                            h.step(&op)?;
                            stats.ops += 1;
                        }
                        Ok(())
                    })?
                } else {
                    h.commit()?;
                    h.model.clone()
                };
                stats.commits += 1;
                let level =
                    h.t.root_ptr(FS_TREE)
                        .map_err(|e| format!("FS tree root: {e}"))?
                        .level;
                stats.max_fs_tree_level = stats.max_fs_tree_level.max(level);
                stats.max_nodes = stats.max_nodes.max(h.model.nodes.len());
                // A copy of the bytes, opened from scratch.
                let fs = open_ro(mem.copy("copy"))
                    .map_err(|e| format!("open a copy after the commit: {e}"))?;
                compare_tree(&fs, &committed)
                    .map_err(|e| format!("copy of the device after the commit: {e}"))?;
                if no_dead_roots(&h.t)? {
                    compare_quotas(&fs).map_err(|e| format!("quotas after the commit: {e}"))?;
                }
                if !last && r.chance(1, 6) {
                    // Relocate chunks: nothing may change, quotas stay exact.
                    h.balance(r.below(4) as u8)?;
                    stats.balances += 1;
                    let fs = open_ro(mem.copy("copy"))
                        .map_err(|e| format!("open a copy after the balance: {e}"))?;
                    compare_tree(&fs, &h.model)
                        .map_err(|e| format!("copy of the device after the balance: {e}"))?;
                    compare_quotas(&fs).map_err(|e| format!("quotas after the balance: {e}"))?;
                }
                if !last && !overlapped && r.chance(1, 3) {
                    // Continue on a handle opened from disk (which holds what was
                    // committed: not after an overlapped commit).
                    h.reopen(dev.clone())?;
                    stats.reopens += 1;
                }
            }
        }
        if cfg.btrfs_check {
            btrfs_check_image(dev_size, |f| mem.write_to(f), None)
                .map_err(|e| format!("final image: {e}"))?;
        }
        Ok(())
    })();
    *steps_out = h.steps.clone();
    res.map_err(|e| format!("{e}\n{fsc:?}; last operations:\n{}", h.tail(25)))?;
    stats.expected_errors = h.expected_errors;
    stats.snapshots = h.snapshots;
    stats.subvols_created = h.subvols_created;
    stats.deletes_checked = h.deletes_checked;
    stats.unsupported = h.unsupported;
    Ok(stats)
}

/// A power cut right after an fsync of `path` (which answered `synced`): the
/// device as it is (a transaction writes its trees only at its commit, and the
/// log is flushed before fsync returns, so every byte there is durable) is opened
/// by a writing handle on a copy, which replays the log and commits as a mount
/// does. The fsynced inode must be as the model has it now: a file under every
/// one of its names, with its data, size, mode, nlink and xattrs; a directory
/// with exactly its names. (Other changes since the commit may or may not be
/// there.) The names are looked up from the root of the inode's subvolume (found by
/// its tree id): an fsync makes nothing durable in other trees, so the path from
/// the top level to that root may be the committed one. Every file of the replayed tree must read; an fsync that committed
/// instead makes the whole tree equal the model. `btrfs_check`: btrfs check the
/// replayed image too. `kernel`: the kernel's mount replays the same cut too, and
/// must show the same tree as ubtrfs's replay (every path, mode, nlink, size,
/// contents, symlink target, xattrs): the log ubtrfs writes is the kernel's format.
#[allow(clippy::too_many_arguments)]
pub fn check_fsync_cut(
    mem: &SparseMem,
    m: &Model,
    tree_of: &HashMap<Id, u64>,
    path: &[u8],
    synced: Synced,
    btrfs_check: bool,
    kernel: bool,
) -> Result<(), String> {
    // The kernel gets the cut as it is, before ubtrfs's replay writes into it.
    let for_kernel = kernel.then(|| mem.copy("kernel-cut"));
    let cut = mem.copy("cut");
    let dev: Arc<dyn Device> = cut.clone();
    let info = FsInfo::open(
        vec![dev],
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .map_err(|e| format!("a cut after fsync {}: open: {e}", show(path)))?;
    let t = Trans::from_fs(info)
        .map_err(|e| format!("a cut after fsync {}: replay: {e}", show(path)))?;
    let fs = &t.fs;
    let fail = |e: String| format!("a cut after fsync {} ({synced:?}): {e}", show(path));
    if let Synced::Committed(_) = synced {
        compare_tree(fs, m).map_err(fail)?;
    } else {
        let id = m
            .resolve(path)
            .ok_or_else(|| fail("not in the model".into()))?;
        for (p, _) in m.paths().into_iter().filter(|(_, i)| *i == id) {
            let node = resolve_in_subvol(fs, m, tree_of, &p)
                .map_err(|e| fail(format!("{}: {e}", show(&p))))?;
            super::compare_node(fs, node, m, id, &p).map_err(|e| {
                // Which names the replayed inode has, for the report.
                let names = fs
                    .inode_refs(node)
                    .map(|r| {
                        r.iter()
                            .map(|r| format!("{}:{}", r.parent, show(&r.name)))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_else(|e| e.to_string());
                fail(format!("{e} (inode {}, replayed names: {names})", node.ino))
            })?;
        }
        read_everything(fs).map_err(fail)?;
    }
    if btrfs_check {
        btrfs_check_image(mem.size(), |f| cut.write_to(f), None)
            .map_err(|e| fail(format!("the replayed image: {e}")))?;
    }
    if let Some(k) = for_kernel {
        let ours = tree_view(fs).map_err(fail)?;
        let theirs = kernel_replay_view(&k).map_err(fail)?;
        if ours != theirs {
            let diff: Vec<String> = ours
                .iter()
                .filter(|(p, v)| theirs.get(*p) != Some(v))
                .map(|(p, v)| format!("{p}: ubtrfs {v:?}, kernel {:?}", theirs.get(p)))
                .chain(
                    theirs
                        .iter()
                        .filter(|(p, _)| !ours.contains_key(*p))
                        .map(|(p, v)| format!("{p}: only in the kernel's replay: {v:?}")),
                )
                .take(10)
                .collect();
            return Err(fail(format!(
                "the kernel's replay of the same cut differs from ubtrfs's:\n{}",
                diff.join("\n")
            )));
        }
    }
    Ok(())
}

/// Resolves a model path from the root of the subvolume it ends in (by tree id).
fn resolve_in_subvol(
    fs: &Filesystem,
    m: &Model,
    tree_of: &HashMap<Id, u64>,
    path: &[u8],
) -> Result<ubtrfs_core::Node, String> {
    let comps: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect();
    // The last component entering a subvolume, and that subvolume.
    let (mut sv, mut from, mut cur) = (ROOT, 0, ROOT);
    for (i, c) in comps.iter().enumerate() {
        cur = *m
            .node(cur)
            .entries()
            .and_then(|e| e.get(*c))
            .ok_or("not in the model")?;
        if m.subvols.contains_key(&cur) {
            (sv, from) = (cur, i + 1);
        }
    }
    let tree = *tree_of.get(&sv).ok_or("no tree mapped")?;
    let mut node = ubtrfs_core::Node::new(tree, TOP_DIR);
    for c in &comps[from..] {
        node = fs
            .lookup(node, c)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{}: No such file or directory", show(c)))?
            .node;
    }
    Ok(node)
}

/// What a replay is compared on, per path ("/" for the top, names made lossy
/// UTF-8 as the kernel-side walk makes them): mode, nlink, size, sha256 of the
/// contents or the symlink target (hex), xattrs (hex).
type TreeView = BTreeMap<String, (u32, u64, u64, String, BTreeMap<String, String>)>;

fn tree_view(fs: &Filesystem) -> Result<TreeView, String> {
    use sha2::{Digest, Sha256};
    let mut out = TreeView::new();
    let mut stack = vec![("/".to_string(), fs.top())];
    while let Some((p, node)) = stack.pop() {
        let st = fs.stat(node).map_err(|e| format!("{p}: stat: {e}"))?;
        let what = match st.mode & ubtrfs_core::mode::S_IFMT {
            ubtrfs_core::mode::S_IFDIR => {
                for e in fs.readdir(node).map_err(|e| format!("{p}: readdir: {e}"))? {
                    let name = String::from_utf8_lossy(&e.name);
                    let child = if p == "/" {
                        format!("/{name}")
                    } else {
                        format!("{p}/{name}")
                    };
                    stack.push((child, e.node));
                }
                String::new()
            }
            S_IFREG => {
                let d = fs
                    .read(node, 0, st.size as usize)
                    .map_err(|e| format!("{p}: read: {e}"))?;
                crate::golden::hex(&Sha256::digest(&d))
            }
            ubtrfs_core::mode::S_IFLNK => crate::golden::hex(
                &fs.readlink(node)
                    .map_err(|e| format!("{p}: readlink: {e}"))?,
            ),
            _ => String::new(),
        };
        let xattrs = fs
            .xattrs(node)
            .map_err(|e| format!("{p}: xattrs: {e}"))?
            .into_iter()
            .map(|(k, v)| {
                // The kernel answers ENODATA to reading a user.* xattr of anything
                // but a file or directory (it lists them): only the name compares.
                let readable = !k.starts_with(b"user.")
                    || matches!(
                        st.mode & ubtrfs_core::mode::S_IFMT,
                        S_IFREG | ubtrfs_core::mode::S_IFDIR
                    );
                let v = if readable {
                    crate::golden::hex(&v)
                } else {
                    String::new()
                };
                (String::from_utf8_lossy(&k).into_owned(), v)
            })
            .collect();
        out.insert(p, (st.mode, st.nlink as u64, st.size, what, xattrs));
    }
    Ok(out)
}

/// The kernel's replay of a cut: its mount (read-write: a read-only loop device
/// cannot take the replay) replays the log into a scratch copy, then the tree is
/// walked.
fn kernel_replay_view(cut: &SparseMem) -> Result<TreeView, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let img = dir.path().join("cut.img");
    let f = std::fs::File::create(&img).map_err(|e| format!("{}: {e}", img.display()))?;
    f.set_len(cut.size())
        .map_err(|e| format!("{}: {e}", img.display()))?;
    cut.write_to(&f)
        .map_err(|e| format!("writing the cut: {e}"))?;
    drop(f);
    // Every seed's filesystem has the same fsid: one kernel mount at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let k = crate::mount::KernelMount::try_new(&[&img], "rw")?;
    let walked = crate::golden::walk_mounted(&k.mnt);
    k.try_umount()?;
    let mut out = TreeView::new();
    for (p, v) in walked {
        let s = |f: &str| v[f].as_str().unwrap_or_default().to_string();
        let what = match v["type"].as_str() {
            Some("file") => s("sha256"),
            Some("symlink") => s("target_hex"),
            _ => String::new(),
        };
        let xattrs = v["xattrs"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, x)| (k.clone(), x.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let n = |f: &str| v[f].as_u64().unwrap_or(u64::MAX);
        out.insert(p, (n("mode") as u32, n("nlink"), n("size"), what, xattrs));
    }
    Ok(out)
}

/// Reads every name, file and symlink of the top-level subvolume (errors only).
fn read_everything(fs: &Filesystem) -> Result<(), String> {
    let mut stack = vec![(Vec::new(), fs.top())];
    let mut dirs = std::collections::HashSet::new();
    while let Some((p, node)) = stack.pop() {
        let st = fs
            .stat(node)
            .map_err(|e| format!("{}: stat: {e}", show(&p)))?;
        match st.mode & ubtrfs_core::mode::S_IFMT {
            ubtrfs_core::mode::S_IFDIR => {
                // A directory has one name: met twice, the tree has a cycle (and a
                // walk of it would not end).
                if !node.is_placeholder() && !dirs.insert(node) {
                    return Err(format!(
                        "{}: directory inode {} reached a second time (a cycle)",
                        show(&p),
                        node.ino
                    ));
                }
                for e in fs
                    .readdir(node)
                    .map_err(|e| format!("{}: readdir: {e}", show(&p)))?
                {
                    stack.push((join(&p, &e.name), e.node));
                }
            }
            S_IFREG => {
                fs.read(node, 0, st.size as usize)
                    .map_err(|e| format!("{}: read: {e}", show(&p)))?;
            }
            ubtrfs_core::mode::S_IFLNK => {
                fs.readlink(node)
                    .map_err(|e| format!("{}: readlink: {e}", show(&p)))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// One step of a recorded run.
#[derive(Clone, PartialEq, Eq)]
pub enum Step {
    /// Apply an operation to both sides.
    Op(Op),
    /// Commit, then compare the whole tree, also on a fresh copy of the device.
    Commit,
    /// Continue on a handle opened from the device.
    Reopen,
    /// Commit, balance (see [`Harness::balance`]), compare.
    Balance(u8),
    /// fsync (true: fdatasync) of a path, then a power cut checked
    /// ([`check_fsync_cut`]).
    Fsync(Vec<u8>, bool),
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Op(op) => write!(f, "{op:?}"),
            Step::Commit => write!(f, "commit"),
            Step::Reopen => write!(f, "reopen for writing"),
            Step::Balance(w) => write!(f, "balance {w}"),
            Step::Fsync(p, d) => {
                write!(f, "{} {}", if *d { "fdatasync" } else { "fsync" }, show(p))
            }
        }
    }
}

/// Replays recorded steps on a fresh filesystem with the same checks as [`run_seed`];
/// ends with a commit (and `btrfs check` if asked).
pub fn replay(fsc: &FsConfig, steps: &[Step], btrfs_check: bool) -> Result<(), String> {
    let dev_size = fsc.dev_size(0);
    let mem = SparseMem::new(dev_size, "replay");
    let dev: Arc<dyn Device> = mem.clone();
    let mut h = Harness::mkfs(dev.clone(), fsc)?;
    let commit = |h: &mut Harness| -> Result<(), String> {
        h.commit()?;
        let fs =
            open_ro(mem.copy("copy")).map_err(|e| format!("open a copy after the commit: {e}"))?;
        compare_tree(&fs, &h.model)
            .map_err(|e| format!("copy of the device after the commit: {e}"))?;
        compare_quotas(&fs).map_err(|e| format!("quotas after the commit: {e}"))
    };
    for s in steps {
        match s {
            Step::Op(op) => h.step(op)?,
            Step::Commit => commit(&mut h)?,
            Step::Reopen => {
                // A reopen reads the last commit: in a run it always follows one; a
                // shortened sequence (minimize) may have lost it.
                commit(&mut h)?;
                h.reopen(dev.clone())?
            }
            Step::Balance(w) => h.balance(*w)?,
            Step::Fsync(p, d) => {
                let synced = h.fsync(p, *d)?;
                check_fsync_cut(&mem, &h.model, &h.tree_of, p, synced, false, false)?;
            }
        }
    }
    commit(&mut h)?;
    if btrfs_check {
        btrfs_check_image(dev_size, |f| mem.write_to(f), None)
            .map_err(|e| format!("final image: {e}"))?;
    }
    Ok(())
}

/// What kind of failure a message reports, without numbers and paths (so a smaller
/// reproduction of the same bug still matches).
pub fn failure_signature(e: &str) -> String {
    let line = match e.find("btrfs check failed") {
        // The first complaint btrfs check printed.
        Some(_) => e
            .lines()
            .find(|l| {
                l.contains("error")
                    && !l.starts_with("found ")
                    && !l.starts_with("ERROR: errors found")
            })
            .unwrap_or("btrfs check failed"),
        None => {
            let first = e.lines().next().unwrap_or("");
            first.split_once(": ").map_or(first, |(_, rest)| rest)
        }
    };
    line.split_whitespace()
        .filter(|w| !w.starts_with('/') && !w.starts_with("`/"))
        .map(|w| {
            w.chars()
                .filter(|c| !c.is_ascii_digit())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Shrinks a failing step list to a (locally) minimal one failing with the same
/// signature (delta debugging: drop chunks, then single steps).
pub fn minimize(fsc: &FsConfig, steps: &[Step], btrfs_check: bool, signature: &str) -> Vec<Step> {
    let fails = |s: &[Step]| {
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replay(fsc, s, btrfs_check)));
        match r {
            Ok(Err(e)) => failure_signature(&e) == signature,
            Ok(Ok(())) => false,
            Err(_) => signature == "panic",
        }
    };
    let mut cur = steps.to_vec();
    if !fails(&cur) {
        return cur;
    }
    let mut chunk = cur.len().div_ceil(2).max(1);
    loop {
        let mut progress = false;
        let mut i = 0;
        while i < cur.len() {
            let mut cand = cur.clone();
            cand.drain(i..(i + chunk).min(cur.len()));
            if fails(&cand) {
                cur = cand;
                progress = true;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 && !progress {
            break;
        }
        if !progress {
            chunk = (chunk / 2).max(1);
        }
    }
    cur
}
