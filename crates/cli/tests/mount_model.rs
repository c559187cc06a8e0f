//! The model test through the read-write `ubtrfs mount`: random operation sequences
//! (the model's own generator, `ubtrfs_sim::model::gen_op`) run as system calls on the
//! mount by several threads at once, each in its own directory with its own model.
//! Every call must succeed or fail as the model says (with the kernel's errno where
//! the VFS answers differently from the engine API), and the paths it touched must
//! then look through the mount as the model says: type, mode, nlink, size, contents,
//! symlink target, xattrs. Threads fsync their directory now and then (a commit while
//! the others keep writing).
//!
//! Then the crash: every thread syncs (BTRFS_IOC_SYNC), the models are saved, more
//! operations run unsynced, and the server is killed with SIGKILL. `btrfs check` must
//! be clean, and the image opened offline must equal the saved models exactly.
//!
//! Environment: `UBTRFS_MOUNT_MODEL_SEEDS` (default 3), `UBTRFS_MOUNT_MODEL_OPS`
//! (operations per thread and seed, default 120), `UBTRFS_MOUNT_MODEL_THREADS`
//! (default 3). Needs root (/dev/fuse); skipped with a line outside CI.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{copy_file_range, fallocate, renameat2, FallocateFlags, RenameFlags};
use nix::sys::stat::{mknod, Mode, SFlag};
use ubtrfs_core::tools::mkfs::make_filesystem;
use ubtrfs_core::{kernel_rdev_to_user, Device, FileDevice};
use ubtrfs_sim::host::{btrfs_check, env_u64, require_fuse, serial, sh, shell_quote, Ubtrfs};
use ubtrfs_sim::model::{
    bulk_data, bulk_name, bulk_victims, compare_subtree, gen_op, join, link_name, open_ro, show,
    write_data, FsConfig, Kind, Model, Op,
};
use ubtrfs_sim::mount::FuseMount;
use ubtrfs_sim::rng::Rng;

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOTEMPTY: i32 = 39;
const ENODATA: i32 = 61;
const ENAMETOOLONG: i32 = 36;
const EOPNOTSUPP: i32 = 95;

fn errno(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn nix_errno(e: nix::Error) -> i32 {
    e as i32
}

/// One thread's directory on the mount and its model.
struct Worker {
    dir: PathBuf,
    model: Model,
    rng: Rng,
    step: u64,
    /// Every operation with what the mount answered (printed on a failure).
    log: Vec<String>,
}

impl Worker {
    fn path(&self, p: &[u8]) -> PathBuf {
        if p.is_empty() {
            self.dir.clone()
        } else {
            self.dir.join(OsStr::from_bytes(p))
        }
    }

    fn kind(&self, p: &[u8]) -> Option<&Kind> {
        self.model.resolve(p).map(|id| &self.model.node(id).kind)
    }

    /// Whether the VFS can express `op` as the model means it (else it is skipped on
    /// both sides): no chmod of a symlink (chmod follows links), no data operation on
    /// a symlink, fifo or device (open would follow or block).
    fn expressible(&self, op: &Op) -> bool {
        // FIDEDUPERANGE never reaches a FUSE server.
        if matches!(op, Op::Dedupe { .. }) {
            return false;
        }
        let data_path = match op {
            Op::Write { path, .. }
            | Op::Truncate { path, .. }
            | Op::Fallocate { path, .. }
            | Op::PunchHole { path, .. }
            | Op::ZeroRange { path, .. }
            | Op::Chmod { path, .. } => Some(path),
            _ => None,
        };
        !matches!(
            data_path.and_then(|p| self.kind(p)),
            Some(Kind::Symlink(_) | Kind::Special(_))
        )
    }

    /// The errno the kernel's VFS gives where the model (the engine API's semantics)
    /// says `want`, or refuses what the model allows.
    fn kernel_errno(&self, op: &Op, want: Result<(), i32>) -> Result<(), i32> {
        if let Op::SetXattr { path, name, .. } | Op::RemoveXattr { path, name } = op {
            if name.starts_with(b"user.")
                && matches!(self.kind(path), Some(Kind::Symlink(_) | Kind::Special(_)))
            {
                // user.* xattrs only on files and directories (the VFS's rule, checked
                // before the filesystem is asked).
                return Err(EPERM);
            }
        }
        match (op, want) {
            (Op::Link { .. } | Op::BulkLink { .. }, Err(EISDIR)) => Err(EPERM),
            (Op::RemoveXattr { .. }, Err(ENOENT)) if self.kind(op_path(op)).is_some() => {
                Err(ENODATA)
            }
            // RENAME_NOREPLACE onto an existing name (itself included): the VFS
            // answers EEXIST before any other check.
            (
                Op::Rename {
                    odir,
                    oname,
                    ndir,
                    nname,
                    noreplace: true,
                },
                _,
            ) if self.kind(&join(odir, oname)).is_some()
                && self.kind(&join(ndir, nname)).is_some() =>
            {
                Err(EEXIST)
            }
            // Renaming onto an ancestor of the source: the VFS's lock_rename "trap".
            (
                Op::Rename {
                    odir,
                    oname,
                    ndir,
                    nname,
                    ..
                },
                Err(_),
            ) if is_ancestor(&join(ndir, nname), &join(odir, oname)) => Err(ENOTEMPTY),
            // The VFS finds the name taken before btrfs looks at the target.
            (Op::Symlink { dir, name, .. }, Err(EINVAL)) => {
                if self.kind(&join(dir, name)).is_some() {
                    Err(EEXIST)
                } else {
                    Err(ENAMETOOLONG)
                }
            }
            (_, w) => w,
        }
    }

    /// Runs `op` as system calls on the mount.
    fn apply_mount(&self, op: &Op) -> Result<(), i32> {
        let p = |x: &[u8]| self.path(x);
        let j = |d: &[u8], n: &[u8]| self.path(&join(d, n));
        let open_w = |x: &[u8]| fs::OpenOptions::new().write(true).open(p(x)).map_err(errno);
        match op {
            Op::Create {
                dir,
                name,
                mode,
                rdev,
            } => {
                let at = j(dir, name);
                let perm = mode & 0o7777;
                match mode & 0o170000 {
                    // mkdir(2) never sets S_ISGID itself (only inherits it): chmod.
                    0o040000 => {
                        use std::os::unix::fs::PermissionsExt;
                        fs::DirBuilder::new()
                            .mode(perm)
                            .create(&at)
                            .map_err(errno)?;
                        fs::set_permissions(&at, fs::Permissions::from_mode(perm)).map_err(errno)
                    }
                    0o100000 => fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(perm)
                        .open(&at)
                        .map(drop)
                        .map_err(errno),
                    ty => mknod(
                        &at,
                        SFlag::from_bits_truncate(ty),
                        Mode::from_bits_truncate(perm),
                        kernel_rdev_to_user(*rdev) as libc_dev_t,
                    )
                    .map_err(nix_errno),
                }
            }
            Op::Symlink { dir, name, target } => {
                std::os::unix::fs::symlink(OsStr::from_bytes(target), j(dir, name)).map_err(errno)
            }
            Op::Write {
                path,
                offset,
                len,
                seed,
            } => open_w(path)?
                .write_all_at(&write_data(*len, *seed), *offset)
                .map_err(errno),
            Op::Truncate { path, size } => open_w(path)?.set_len(*size).map_err(errno),
            Op::Fallocate {
                path,
                offset,
                len,
                keep_size,
            } => {
                let f = open_w(path)?;
                let fl = if *keep_size {
                    FallocateFlags::FALLOC_FL_KEEP_SIZE
                } else {
                    FallocateFlags::empty()
                };
                fallocate(f.as_raw_fd(), fl, *offset as i64, *len as i64).map_err(nix_errno)
            }
            Op::PunchHole { path, offset, len } => {
                let f = open_w(path)?;
                let fl = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
                fallocate(f.as_raw_fd(), fl, *offset as i64, *len as i64).map_err(nix_errno)
            }
            Op::ZeroRange {
                path,
                offset,
                len,
                keep_size,
            } => {
                let f = open_w(path)?;
                let mut fl = FallocateFlags::FALLOC_FL_ZERO_RANGE;
                if *keep_size {
                    fl |= FallocateFlags::FALLOC_FL_KEEP_SIZE;
                }
                fallocate(f.as_raw_fd(), fl, *offset as i64, *len as i64).map_err(nix_errno)
            }
            Op::Unlink { dir, name } => fs::remove_file(j(dir, name)).map_err(errno),
            Op::Rmdir { dir, name } => fs::remove_dir(j(dir, name)).map_err(errno),
            Op::Rename {
                odir,
                oname,
                ndir,
                nname,
                noreplace,
            } => {
                let fl = if *noreplace {
                    RenameFlags::RENAME_NOREPLACE
                } else {
                    RenameFlags::empty()
                };
                renameat2(None, &j(odir, oname), None, &j(ndir, nname), fl).map_err(nix_errno)
            }
            Op::RenameExchange {
                adir,
                aname,
                bdir,
                bname,
            } => renameat2(
                None,
                &j(adir, aname),
                None,
                &j(bdir, bname),
                RenameFlags::RENAME_EXCHANGE,
            )
            .map_err(nix_errno),
            Op::Link { src, dir, name } => fs::hard_link(p(src), j(dir, name)).map_err(errno),
            Op::SetXattr { path, name, value } => {
                xattr::set(p(path), OsStr::from_bytes(name), value).map_err(errno)
            }
            Op::RemoveXattr { path, name } => {
                xattr::remove(p(path), OsStr::from_bytes(name)).map_err(errno)
            }
            Op::Chmod { path, perm } => {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(p(path), fs::Permissions::from_mode(*perm)).map_err(errno)
            }
            Op::BulkCreate { dir, first, count } => {
                for i in *first..first + count {
                    if fs::symlink_metadata(j(dir, &bulk_name(i))).is_ok() {
                        return Err(17);
                    }
                }
                for i in *first..first + count {
                    let at = j(dir, &bulk_name(i));
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o644)
                        .open(&at)
                        .and_then(|f| f.write_all_at(&bulk_data(i), 0))
                        .map_err(errno)?;
                    if i % 5 == 0 {
                        xattr::set(&at, "user.bulk", &i.to_le_bytes()).map_err(errno)?;
                    }
                }
                Ok(())
            }
            Op::BulkLink {
                src,
                dir,
                first,
                count,
            } => {
                for i in *first..first + count {
                    fs::hard_link(p(src), j(dir, &link_name(i))).map_err(errno)?;
                }
                Ok(())
            }
            Op::CopyRange {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => {
                let fi = fs::File::open(p(src)).map_err(errno)?;
                let fo = open_w(dst)?;
                let (mut so, mut dof) = (*src_off as i64, *dst_off as i64);
                // Short counts are normal: loop, as cp does, over what the source
                // held at the start (a copy within one file must not go on into what
                // it appended; one call on the kernel's btrfs does it all).
                let size = fi.metadata().map_err(errno)?.len();
                let mut left = (*len).min(size.saturating_sub(*src_off)) as usize;
                while left > 0 {
                    let n = copy_file_range(&fi, Some(&mut so), &fo, Some(&mut dof), left)
                        .map_err(nix_errno)?;
                    if n == 0 {
                        break;
                    }
                    left -= n;
                }
                Ok(())
            }
            // FIDEDUPERANGE never reaches a FUSE server (the VFS answers EOPNOTSUPP):
            // left out by `expressible`.
            Op::Dedupe { .. } => Err(EOPNOTSUPP),
            Op::SubvolCreate { .. } | Op::Snapshot { .. } | Op::SubvolDelete { .. } => {
                unreachable!("gen_op makes no subvolume operations")
            }
            Op::BulkUnlink { dir, keep_every } => {
                let id = self.model.resolve(dir).ok_or(ENOENT)?;
                let Kind::Dir(entries) = &self.model.node(id).kind else {
                    return Err(20);
                };
                for v in bulk_victims(entries, &self.model, *keep_every) {
                    fs::remove_file(j(dir, &v)).map_err(errno)?;
                }
                Ok(())
            }
        }
    }

    /// Checks the paths `op` touched through the mount against the model.
    fn check(&self, op: &Op) -> Result<(), String> {
        for p in op.touched() {
            let at = self.path(&p);
            let id = self.model.resolve(&p);
            let md = fs::symlink_metadata(&at);
            let (id, md) = match (id, md) {
                (None, Err(_)) => continue,
                (None, Ok(_)) => return Err(format!("{}: exists, not in the model", show(&p))),
                (Some(_), Err(e)) => return Err(format!("{}: {e}", show(&p))),
                (Some(id), Ok(md)) => (id, md),
            };
            let n = self.model.node(id);
            let ft = md.file_type();
            let ok_type = match &n.kind {
                Kind::Dir(_) => ft.is_dir(),
                Kind::File(_) => ft.is_file(),
                Kind::Symlink(_) => ft.is_symlink(),
                Kind::Special(_) => !ft.is_dir() && !ft.is_file() && !ft.is_symlink(),
            };
            if !ok_type {
                return Err(format!("{}: type {ft:?}, model {:?}", show(&p), n.kind));
            }
            if !ft.is_symlink() && md.mode() & 0o7777 != n.mode & 0o7777 {
                return Err(format!(
                    "{}: mode {:o}, model {:o}",
                    show(&p),
                    md.mode(),
                    n.mode
                ));
            }
            if md.nlink() != u64::from(n.nlink) {
                return Err(format!(
                    "{}: nlink {}, model {}",
                    show(&p),
                    md.nlink(),
                    n.nlink
                ));
            }
            match &n.kind {
                Kind::File(data) => {
                    let got = fs::read(&at).map_err(|e| format!("{}: read: {e}", show(&p)))?;
                    if &got != data {
                        return Err(format!(
                            "{}: contents differ ({} bytes, model {})",
                            show(&p),
                            got.len(),
                            data.len()
                        ));
                    }
                }
                Kind::Symlink(t) => {
                    let got = fs::read_link(&at).map_err(|e| format!("{}: {e}", show(&p)))?;
                    if got.as_os_str().as_bytes() != t.as_slice() {
                        return Err(format!("{}: symlink target differs", show(&p)));
                    }
                }
                _ => {}
            }
            let mut names: Vec<Vec<u8>> = xattr::list(&at)
                .map_err(|e| format!("{}: listxattr: {e}", show(&p)))?
                .map(|n| n.as_bytes().to_vec())
                .collect();
            names.sort();
            let want: Vec<Vec<u8>> = n.xattrs.keys().cloned().collect();
            if names != want {
                return Err(format!("{}: xattr names differ", show(&p)));
            }
            for (k, v) in &n.xattrs {
                let got = xattr::get(&at, OsStr::from_bytes(k))
                    .map_err(|e| format!("{}: getxattr: {e}", show(&p)))?;
                if got.as_ref() != Some(v) {
                    return Err(format!("{}: xattr {} differs", show(&p), show(k)));
                }
            }
        }
        Ok(())
    }

    /// One random operation on both sides, compared.
    fn step(&mut self) -> Result<(), String> {
        self.step += 1;
        let op = gen_op(&self.model, &mut self.rng);
        if !self.expressible(&op) {
            return Ok(());
        }
        // Both sides see the state before the op (BulkUnlink picks its victims from
        // the model; the errno rules look at types).
        let before = self.model.clone();
        let got = self.apply_mount(&op);
        self.log.push(format!("{} {op:?} -> {got:?}", self.step));
        let want = self.model.apply(&op).map(drop);
        let want_kernel = {
            let after = std::mem::replace(&mut self.model, before.clone());
            let w = self.kernel_errno(&op, want);
            self.model = after;
            w
        };
        match (want_kernel, got) {
            (Ok(()), Ok(())) => {}
            (Err(w), Err(g)) if w == g => {}
            (w, g) => {
                return Err(format!(
                    "step {} {op:?}: the mount gave {g:?}, the model expects {w:?}",
                    self.step
                ))
            }
        }
        if want.is_ok() && want_kernel.is_err() {
            // The VFS refused what the engine allows: nothing changed.
            self.model = before;
        }
        self.check(&op)
            .map_err(|e| format!("step {} after {op:?}: {e}", self.step))
    }
}

/// Whether `a` is a proper ancestor of `b`.
fn is_ancestor(a: &[u8], b: &[u8]) -> bool {
    b.len() > a.len() && b.starts_with(a) && (a.is_empty() || b[a.len()] == b'/')
}

/// The path of an xattr operation.
fn op_path(op: &Op) -> &[u8] {
    match op {
        Op::SetXattr { path, .. } | Op::RemoveXattr { path, .. } => path,
        _ => &[],
    }
}

// nix's mknod takes dev_t.
#[allow(non_camel_case_types)]
type libc_dev_t = u64;

/// Makes the seed's filesystem (node size, checksum, NO_HOLES, DUP...) in an image file.
fn make_image(path: &Path, cfg: &FsConfig) -> Result<(), String> {
    let f = fs::File::create(path).map_err(|e| e.to_string())?;
    f.set_len(cfg.dev_size(256 << 20))
        .map_err(|e| e.to_string())?;
    drop(f);
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(path, true).map_err(|e| format!("open: {e}"))?);
    let t = make_filesystem(dev, &cfg.mkfs_options()).map_err(|e| format!("mkfs: {e}"))?;
    drop(t);
    Ok(())
}

#[test]
fn mount_model_concurrent_and_sigkill() {
    if !require_fuse("mount_model_concurrent_and_sigkill") {
        return;
    }
    let _serial = serial();
    let seeds = env_u64("UBTRFS_MOUNT_MODEL_SEEDS").unwrap_or(3);
    let ops = env_u64("UBTRFS_MOUNT_MODEL_OPS").unwrap_or(120);
    let threads = env_u64("UBTRFS_MOUNT_MODEL_THREADS").unwrap_or(3);
    nix::sys::stat::umask(Mode::empty());
    for seed in 0..seeds {
        let cfg = FsConfig::for_seed(seed);
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("model.img");
        make_image(&img, &cfg).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let mut opts = vec!["rw".to_string()];
        if let Some(c) = cfg.compress {
            opts.push(format!("compress={}", format!("{c:?}").to_lowercase()));
        }
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &opts);
        let mut workers: Vec<Worker> = (0..threads)
            .map(|t| {
                let d = fm.mnt.join(format!("t{t}"));
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&d)
                    .expect("worker dir");
                Worker {
                    dir: d,
                    model: Model::new(0o40755, cfg.nodesize),
                    rng: Rng::new(seed * 1000 + t),
                    step: 0,
                    log: Vec::new(),
                }
            })
            .collect();

        // Phase 1: all threads at once, fsyncing their directory now and then.
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let hs: Vec<_> = workers
                .iter_mut()
                .map(|w| {
                    s.spawn(move || {
                        for i in 0..ops {
                            w.step()?;
                            if i % 37 == 36 {
                                fs::File::open(&w.dir)
                                    .and_then(|d| d.sync_all())
                                    .map_err(|e| format!("fsync of the directory: {e}"))?;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                .collect()
        });
        for (t, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                let log = fm.log();
                panic!("seed {seed} ({cfg:?}) thread {t}: {e}\nserver: {log}");
            }
        }

        // Phase 2: a sync point, then unsynced work, then a power cut.
        let synced = sh(&format!(
            "btrfs filesystem sync {} && echo synced",
            shell_quote(&fm.mnt)
        ));
        assert!(synced.contains("synced"), "btrfs filesystem sync: {synced}");
        let saved: Vec<Model> = workers.iter().map(|w| w.model.clone()).collect();
        for w in workers.iter_mut() {
            for _ in 0..env_u64("UBTRFS_MOUNT_MODEL_UNSYNCED").unwrap_or(10) {
                w.step()
                    .unwrap_or_else(|e| panic!("seed {seed} unsynced phase: {e}"));
            }
        }
        let _ = fm.child.kill();
        fm.wait(Duration::from_secs(10));
        drop(fm);

        btrfs_check(&img, None).unwrap_or_else(|e| panic!("seed {seed}: btrfs check: {e}"));
        let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&img, false).expect("open image"));
        let fs_ro = open_ro(dev).expect("open the image offline");
        for (t, m) in saved.iter().enumerate() {
            let top = fs_ro
                .resolve_bytes(format!("t{t}").as_bytes())
                .unwrap_or_else(|e| panic!("seed {seed}: t{t}: {e}"));
            compare_subtree(&fs_ro, top, m).unwrap_or_else(|e| {
                panic!(
                    "seed {seed} thread {t}: after SIGKILL, not the synced state: {e}\n\
                     operations:\n{}",
                    workers[t].log.join("\n")
                )
            });
        }
        eprintln!(
            "seed {seed}: {threads} threads x {ops} ops through the mount, then 10 unsynced each \
             and SIGKILL: ok ({cfg:?})"
        );
    }
}
