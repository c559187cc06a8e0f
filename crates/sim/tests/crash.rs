//! Crash consistency of the commit protocol: a workload (mkfs, then transactions of
//! random file operations, then an uncommitted tail) runs on a `RecordingDevice`. For
//! every flush point the image a power cut would leave right after that flush, and a
//! few images cut inside the following batch of writes (prefix, reordered subset, torn
//! write), must open, carry the generation of a committed transaction (the last one
//! whose superblock write finished, or for cuts inside a superblock batch the previous
//! one too), and hold exactly the model state of that commit. A sample of the images
//! also goes through `btrfs check --readonly --check-data-csum`.
//!
//! The kernel is a second oracle (root only): the image after every flush at which a
//! commit completed, and a reordered subset and a torn image inside two superblock-write
//! batches, a tree-block batch and the unflushed tail, are mounted read-only through a
//! loop device (undone by a Drop guard, also when a check fails). The kernel must mount
//! each, at a committed generation (it reads the primary superblock only; a torn primary
//! is first restored from the mirrors with `btrfs rescue super-recover`), log no btrfs
//! errors, and show exactly the model state of that commit: every path, type, mode,
//! nlink, size, content, symlink target, rdev, xattrs and hard-link identity.
//!
//! Environment: `UBTRFS_CRASH_SEED` (workload seed, default 1), `UBTRFS_CRASH_IMAGES`
//! (crash images per flush point, default 4), `CI` or `UBTRFS_CI` (a missing `btrfs`
//! binary, or not being root, fails the test instead of skipping the btrfs check /
//! kernel part; see `ubtrfs_sim::host::require_root`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use ubtrfs_core::format::consts::{
    super_mirror_offset, BTRFS_MAGIC, SUPER_INFO_OFFSET, SUPER_INFO_SIZE, SUPER_MIRROR_MAX,
};
use ubtrfs_core::format::superblock::SuperBlock;
use ubtrfs_core::kernel_rdev_to_user;
use ubtrfs_core::read_best_super;
use ubtrfs_core::{CommitIo, Device, MemDevice};
use ubtrfs_sim::fault_dev::{allowed_points, RecordingDevice};
use ubtrfs_sim::golden::type_name;
use ubtrfs_sim::host::{
    btrfs_check_image, dmesg_since, env_u64, have_btrfs, kmsg_marker, panic_message, require_root,
    skip, unique_name, write_sparse, ScratchFile,
};
use ubtrfs_sim::model::{
    compare_tree, gen_op, open_ro, show, FsConfig, Harness, Id, Kind, Model, Op,
};
use ubtrfs_sim::mount::KernelMount;
use ubtrfs_sim::rng::Rng;

const TRANSACTIONS: usize = 10;
/// Most images given to `btrfs check` (each run costs ~0.1 s).
const BTRFS_CHECKS_MAX: usize = 40;

/// A committed transaction: its generation, the number of flushes once its superblock
/// was durable, and the model state it holds.
struct Committed {
    generation: u64,
    flushes: usize,
    model: Model,
}

/// Runs the workload; returns the device and the commits.
fn run_workload(seed: u64) -> (Arc<RecordingDevice>, Vec<Committed>, Vec<String>) {
    // Seed 1: the mkfs defaults (dup metadata, crc32c, 16 KiB nodes); others vary.
    let fsc = if seed == 1 {
        FsConfig::default()
    } else {
        FsConfig::for_seed(seed)
    };
    // Just above the mkfs minimum: every image is a full copy of the device.
    let size = if fsc.dup { 148 << 20 } else { 108 << 20 };
    let rec = RecordingDevice::new(vec![0u8; size], "crash");
    let dev: Arc<dyn Device> = rec.clone();
    // Commits mkfs makes before its last (quotas are enabled in a second one).
    let mut early: Vec<(u64, usize)> = Vec::new();
    let mut h = Harness::mkfs_noting(dev, &fsc, |generation| {
        early.push((generation, rec.flushes()))
    })
    .unwrap_or_else(|e| panic!("{fsc:?}: {e}"));
    eprintln!("crash: {fsc:?}");
    let mut commits: Vec<Committed> = early
        .into_iter()
        .map(|(generation, flushes)| Committed {
            generation,
            flushes,
            model: h.model.clone(),
        })
        .collect();
    commits.push(Committed {
        generation: h.t.fs.info.sb.generation,
        flushes: rec.flushes(),
        model: h.model.clone(),
    });
    let mut r = Rng::new(seed);
    let fail = |h: &Harness, e: String| -> ! {
        panic!(
            "workload seed {seed}: {e}\nlast operations:\n{}",
            h.tail(30)
        )
    };
    // Every other commit is written the way a mount writes it: started, then the
    // next transaction's first operations run (CoWing the committing blocks, reading
    // them, freeing them) before the write-out and the finish.
    let mut in_flight: Option<(Arc<CommitIo>, Model)> = None;
    let finish = |h: &mut Harness, io: Arc<CommitIo>, model: Model| -> Committed {
        io.run()
            .unwrap_or_else(|e| fail(h, format!("commit write-out: {e}")));
        h.t.commit_finish()
            .unwrap_or_else(|e| fail(h, format!("commit finish: {e}")));
        assert_eq!(h.t.fs.info.sb.generation + 1, h.t.transid);
        Committed {
            generation: io.transid(),
            flushes: rec.flushes(),
            model,
        }
    };
    for i in 0..TRANSACTIONS {
        let ops = r.range(3, 12);
        for k in 0..ops {
            let op = gen_op(&h.model, &mut r);
            h.step(&op).unwrap_or_else(|e| fail(&h, e));
            if k == ops / 2 {
                if let Some((io, model)) = in_flight.take() {
                    let c = finish(&mut h, io, model);
                    commits.push(c);
                }
            }
        }
        if i % 2 == 0 {
            h.commit().unwrap_or_else(|e| fail(&h, e));
            commits.push(Committed {
                generation: h.t.fs.info.sb.generation,
                flushes: rec.flushes(),
                model: h.model.clone(),
            });
        } else {
            h.log.push("commit started".into());
            let io =
                h.t.commit_start()
                    .unwrap_or_else(|e| fail(&h, format!("commit start: {e}")))
                    .expect("a transaction with changes");
            in_flight = Some((io, h.model.clone()));
        }
    }
    if let Some((io, model)) = in_flight.take() {
        let c = finish(&mut h, io, model);
        commits.push(c);
    }
    // An uncommitted tail: data writes reach the device, no superblock does. Besides
    // random operations: overwrite committed files (CoW must not touch their old data)
    // and write a new file.
    let committed_files: Vec<Vec<u8>> = h
        .model
        .paths()
        .into_iter()
        .filter(|(_, id)| matches!(&h.model.node(*id).kind, Kind::File(d) if !d.is_empty()))
        .map(|(p, _)| p)
        .take(3)
        .collect();
    let mut tail: Vec<Op> = committed_files
        .into_iter()
        .map(|path| Op::Write {
            path,
            offset: 0,
            len: 20_000,
            seed: r.next_u64(),
        })
        .collect();
    tail.push(Op::Create {
        dir: Vec::new(),
        name: b"tail-file".to_vec(),
        mode: 0o100644,
        rdev: 0,
    });
    tail.push(Op::Write {
        path: b"tail-file".to_vec(),
        offset: 0,
        len: 70_000,
        seed: r.next_u64(),
    });
    for _ in 0..4 {
        tail.push(gen_op(&h.model, &mut r));
    }
    for op in &tail {
        h.step(op).unwrap_or_else(|e| fail(&h, e));
    }
    (rec, commits, h.log.clone())
}

/// Which commits an image may show: `(allowed commit indices, may fail to open)`.
/// `inside` is false for the image right after flush `n`, true for images cut inside
/// the batch that follows flush `n`.
fn allowed(commits: &[Committed], n: usize, inside: bool) -> (Vec<usize>, bool) {
    let at: Vec<usize> = commits.iter().map(|c| c.flushes).collect();
    // Before the first commit's superblock is durable, nothing need open.
    (allowed_points(&at, n, inside), !at.iter().any(|&f| f <= n))
}

/// Opens an image and checks it; returns the generation found.
fn verify_image(
    img: Vec<u8>,
    commits: &[Committed],
    ok: &[usize],
    may_fail: bool,
    what: &str,
) -> Result<Option<u64>, String> {
    let dev: Arc<dyn Device> = MemDevice::new(img, "image");
    let res = catch_unwind(AssertUnwindSafe(|| -> Result<Option<u64>, String> {
        let fs = match open_ro(dev) {
            Ok(fs) => fs,
            Err(e) if may_fail => {
                let _ = e;
                return Ok(None);
            }
            Err(e) => return Err(format!("does not open: {e}")),
        };
        let generation = fs.info.sb.generation;
        let Some(&k) = ok.iter().find(|&&k| commits[k].generation == generation) else {
            let want: Vec<u64> = ok.iter().map(|&k| commits[k].generation).collect();
            return Err(format!("generation {generation}, expected one of {want:?}"));
        };
        compare_tree(&fs, &commits[k].model)
            .map_err(|e| format!("generation {generation}: {e}"))?;
        Ok(Some(generation))
    }));
    match res {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(p) => Err(format!("{what}: PANIC: {}", panic_message(&*p))),
    }
}

/// Runs `btrfs check` on the image, on the superblock copy ubtrfs would use.
fn btrfs_check_bytes(img: &[u8], what: &str) -> Result<(), String> {
    let super_copy = match read_best_super(&SliceDev(img)) {
        Ok((sb, _)) if sb.bytenr != SUPER_INFO_OFFSET => {
            // The primary copy is torn or stale: check the copy ubtrfs used.
            (0..SUPER_MIRROR_MAX).find(|&i| super_mirror_offset(i) == sb.bytenr)
        }
        _ => None,
    };
    btrfs_check_image(img.len() as u64, |f| write_sparse(f, img), super_copy)
        .map_err(|e| format!("{what}: {e}"))
}

/// Reads a borrowed image (superblock probing without a copy).
#[derive(Debug)]
struct SliceDev<'a>(&'a [u8]);

impl Device for SliceDev<'_> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let s = usize::try_from(offset)
            .ok()
            .and_then(|o| self.0.get(o..o.checked_add(buf.len())?));
        buf.copy_from_slice(s.ok_or(std::io::ErrorKind::UnexpectedEof)?);
        Ok(())
    }
    fn write_at(&self, _: u64, _: &[u8]) -> std::io::Result<()> {
        Err(std::io::ErrorKind::PermissionDenied.into())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
    fn name(&self) -> String {
        "image".into()
    }
}

// ---------------------------------------------------------------------------------
// The kernel as a second oracle: a sample of the images is mounted read-only through a
// loop device and must show exactly the model state of the commit its primary
// superblock names.

/// True when the kernel part may run (root and btrfs); without root it is skipped,
/// except in CI (`require_root` panics there).
fn kernel_oracle_enabled(btrfs: bool) -> bool {
    if !require_root("crash_consistency: the kernel mount part") {
        return false;
    }
    if !btrfs {
        eprintln!("crash: btrfs not found; skipping the kernel mount part");
        return false;
    }
    true
}

/// The primary superblock's generation, or why the kernel would refuse it (the kernel
/// mounts from the primary copy only).
fn primary_generation(img: &[u8]) -> Result<u64, String> {
    let buf = img
        .get(SUPER_INFO_OFFSET as usize..SUPER_INFO_OFFSET as usize + SUPER_INFO_SIZE)
        .ok_or("image too small")?;
    let sb = SuperBlock::parse(buf).map_err(|e| e.to_string())?;
    if sb.magic != BTRFS_MAGIC {
        return Err("no btrfs magic".into());
    }
    sb.verify_csum()
        .map_err(|_| "checksum mismatch".to_string())?;
    sb.check(SUPER_INFO_OFFSET).map_err(|e| e.to_string())?;
    Ok(sb.generation)
}

/// Compares what the kernel shows under `root` with the model: every path (and no
/// other), type, mode, nlink, size, content, symlink target, rdev, xattrs, and that
/// hard links are one inode and distinct model nodes distinct inodes.
fn kernel_compare(root: &Path, m: &Model) -> Result<(), String> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::os::unix::fs::MetadataExt;
    const S_IFMT: u32 = 0o170000;
    let mut ino_of: BTreeMap<Id, u64> = BTreeMap::new();
    let mut id_of: BTreeMap<u64, Id> = BTreeMap::new();
    for (path, id) in m.paths() {
        let p = show(&path);
        let n = m.node(id);
        let full = root.join(std::ffi::OsStr::from_bytes(&path));
        let md = std::fs::symlink_metadata(&full).map_err(|e| format!("{p}: lstat: {e}"))?;
        if md.mode() & S_IFMT != n.mode & S_IFMT {
            return Err(format!(
                "{p}: kernel shows a {}, model a {}",
                type_name(md.mode()),
                type_name(n.mode)
            ));
        }
        if md.mode() != n.mode {
            return Err(format!("{p}: mode {:o}, model {:o}", md.mode(), n.mode));
        }
        if md.nlink() != u64::from(n.nlink) {
            return Err(format!("{p}: nlink {}, model {}", md.nlink(), n.nlink));
        }
        match (ino_of.insert(id, md.ino()), id_of.insert(md.ino(), id)) {
            (Some(a), _) if a != md.ino() => {
                return Err(format!(
                    "{p}: hard link with inode {}, another name of it has inode {a}",
                    md.ino()
                ))
            }
            (_, Some(other)) if other != id => {
                return Err(format!(
                    "{p}: inode {} is also a different model node",
                    md.ino()
                ))
            }
            _ => {}
        }
        match &n.kind {
            Kind::Dir(entries) => {
                let want: u64 = entries.keys().map(|k| 2 * k.len() as u64).sum();
                if md.size() != want {
                    return Err(format!(
                        "{p}: directory size {}, expected {want}",
                        md.size()
                    ));
                }
                let mut got = BTreeMap::new();
                for e in std::fs::read_dir(&full).map_err(|e| format!("{p}: readdir: {e}"))? {
                    let e = e.map_err(|e| format!("{p}: readdir: {e}"))?;
                    let ft = e.file_type().map_err(|err| format!("{p}: d_type: {err}"))?;
                    let name = e.file_name().into_vec();
                    let ty = if ft.is_dir() {
                        "dir"
                    } else if ft.is_symlink() {
                        "symlink"
                    } else if ft.is_file() {
                        "file"
                    } else {
                        "special"
                    };
                    if got.insert(name.clone(), ty).is_some() {
                        return Err(format!("{p}: readdir returns {} twice", show(&name)));
                    }
                }
                let want: BTreeMap<Vec<u8>, &str> = entries
                    .iter()
                    .map(|(k, c)| {
                        let t = match type_name(m.node(*c).mode) {
                            t @ ("dir" | "symlink" | "file") => t,
                            _ => "special",
                        };
                        (k.clone(), t)
                    })
                    .collect();
                if got != want {
                    let fmt = |s: &BTreeMap<Vec<u8>, &str>| {
                        s.iter()
                            .map(|(k, t)| format!("{}:{t}", k.escape_ascii()))
                            .collect::<Vec<_>>()
                    };
                    return Err(format!(
                        "{p}: entries {:?}, model {:?}",
                        fmt(&got),
                        fmt(&want)
                    ));
                }
            }
            Kind::File(data) => {
                if md.size() != data.len() as u64 {
                    return Err(format!("{p}: size {}, model {}", md.size(), data.len()));
                }
                let got = std::fs::read(&full).map_err(|e| format!("{p}: read: {e}"))?;
                if got != *data {
                    let first = got
                        .iter()
                        .zip(data)
                        .position(|(a, b)| a != b)
                        .unwrap_or(got.len().min(data.len()));
                    return Err(format!(
                        "{p}: content differs from byte {first} (read {} bytes, model {})",
                        got.len(),
                        data.len()
                    ));
                }
            }
            Kind::Symlink(target) => {
                let got = std::fs::read_link(&full)
                    .map_err(|e| format!("{p}: readlink: {e}"))?
                    .into_os_string()
                    .into_vec();
                if got != *target || md.size() != target.len() as u64 {
                    return Err(format!(
                        "{p}: symlink target {} (size {}), model {}",
                        show(&got),
                        md.size(),
                        show(target)
                    ));
                }
            }
            Kind::Special(rdev) => {
                let want = kernel_rdev_to_user(*rdev);
                if md.size() != 0 || md.rdev() != want {
                    return Err(format!(
                        "{p}: size {} rdev {:#x}, model rdev {want:#x}",
                        md.size(),
                        md.rdev()
                    ));
                }
            }
        }
        let names: BTreeSet<Vec<u8>> = xattr::list(&full)
            .map_err(|e| format!("{p}: listxattr: {e}"))?
            .map(|n| n.into_vec())
            .collect();
        if names.iter().ne(n.xattrs.keys()) {
            let fmt = |v: &mut dyn Iterator<Item = &Vec<u8>>| {
                v.map(|k| k.escape_ascii().to_string()).collect::<Vec<_>>()
            };
            return Err(format!(
                "{p}: xattrs {:?}, model {:?}",
                fmt(&mut names.iter()),
                fmt(&mut n.xattrs.keys())
            ));
        }
        // The kernel hides the values of user.* xattrs on anything but regular files and
        // directories (ENODATA); there only the listed name can be compared.
        let user_hidden = !matches!(n.kind, Kind::Dir(_) | Kind::File(_));
        for (k, v) in &n.xattrs {
            let got = xattr::get(&full, std::ffi::OsStr::from_bytes(k))
                .map_err(|e| format!("{p}: getxattr {}: {e}", k.escape_ascii()))?;
            match got {
                Some(g) if g == *v => {}
                None if user_hidden && k.starts_with(b"user.") => {}
                g => {
                    let head = |b: &[u8]| b[..b.len().min(16)].escape_ascii().to_string();
                    return Err(format!(
                        "{p}: xattr {} is {}, model {} bytes {:?}...",
                        k.escape_ascii(),
                        g.map_or("missing (ENODATA)".into(), |g| format!(
                            "{} bytes {:?}...",
                            g.len(),
                            head(&g)
                        )),
                        v.len(),
                        head(v)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Writes the image to a temporary file, mounts it read-only in the kernel and
/// compares with the commit the primary superblock names (one of `ok`). Returns the
/// generation and how long it took. A primary superblock the kernel cannot use (torn)
/// is first restored from the newest valid mirror with `btrfs rescue super-recover`,
/// as an administrator would; that is noted in the result.
fn kernel_check(
    img: &[u8],
    commits: &[Committed],
    ok: &[usize],
    what: &str,
) -> Result<(u64, bool), String> {
    let fail = |e: String| format!("{what}: kernel: {e}");
    let file = ScratchFile::create("ubtrfs-crash-kernel", img.len() as u64, |f| {
        write_sparse(f, img)
    })
    .map_err(fail)?;
    let path = &file.path;
    let mut recovered = false;
    let generation = match primary_generation(img) {
        Ok(g) => g,
        Err(why) => {
            // Exit status 2 with this message means the bad copies were rewritten.
            let o = Command::new("btrfs")
                .args(["rescue", "super-recover", "-y"])
                .arg(path)
                .output()
                .map_err(|e| fail(format!("running btrfs rescue super-recover: {e}")))?;
            let out = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            if o.status.code() != Some(2) || !out.contains("Recovered bad superblocks successful") {
                return Err(fail(format!(
                    "primary superblock unusable ({why}); btrfs rescue super-recover: {}:\n{out}",
                    o.status
                )));
            }
            recovered = true;
            let mut buf = vec![0u8; SUPER_INFO_SIZE];
            std::fs::File::open(path)
                .and_then(|f| f.read_exact_at(&mut buf, SUPER_INFO_OFFSET))
                .map_err(|e| fail(format!("{e}")))?;
            let mut probe = vec![0u8; SUPER_INFO_OFFSET as usize];
            probe.extend_from_slice(&buf);
            primary_generation(&probe).map_err(|e| {
                fail(format!(
                    "primary superblock unusable ({why}); after super-recover: {e}\n{out}"
                ))
            })?
        }
    };
    let Some(&k) = ok.iter().find(|&&k| commits[k].generation == generation) else {
        let want: Vec<u64> = ok.iter().map(|&k| commits[k].generation).collect();
        return Err(fail(format!(
            "primary superblock{} has generation {generation}, expected one of {want:?}",
            if recovered {
                " (after super-recover)"
            } else {
                ""
            }
        )));
    };
    let tag = unique_name("ubtrfs-crash-kernel");
    kmsg_marker(&tag);
    let m = KernelMount::try_new(&[path], "ro").map_err(fail)?;
    let cmp = kernel_compare(&m.mnt, &commits[k].model);
    let um = m.try_umount();
    let log = dmesg_since(&tag);
    let bad: Vec<&String> = log
        .iter()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("btrfs")
                && [
                    "error",
                    "critical",
                    "corrupt",
                    "csum failed",
                    "bad tree block",
                ]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    let rec = if recovered {
        " (primary superblock restored by super-recover)"
    } else {
        ""
    };
    cmp.map_err(|e| {
        fail(format!(
            "generation {generation}{rec}: {e}\nkernel log:\n{}",
            log.join("\n")
        ))
    })?;
    um.map_err(fail)?;
    if !bad.is_empty() {
        return Err(fail(format!(
            "generation {generation}{rec}: kernel logged errors:\n{}",
            log.join("\n")
        )));
    }
    Ok((generation, recovered))
}

/// The kernel sample: `(description, flush point, inside the batch)` for the image
/// after every flush at which a commit completed, and a reordered subset and a torn
/// image inside a few batches: two superblock-write batches, a tree-block batch and the
/// unflushed tail. Crash images come from the same generator as the ubtrfs pass.
fn kernel_sample(
    commits: &[Committed],
    flushes: usize,
) -> (Vec<usize>, Vec<(usize, &'static str)>) {
    let after: Vec<usize> = commits.iter().map(|c| c.flushes).collect();
    let mut inside = Vec::new();
    let last = commits.len() - 1;
    for (k, kind) in [(last / 3, "superblock batch"), (last, "superblock batch")] {
        if k >= 1 {
            inside.push((commits[k].flushes - 1, kind));
        }
    }
    // The batch after the previous commit holds the transaction's data and tree blocks.
    let k = (2 * last / 3).max(1);
    if commits[k].flushes >= commits[k - 1].flushes + 2 {
        inside.push((commits[k - 1].flushes, "tree-block batch"));
    }
    inside.push((flushes, "unflushed tail"));
    (after, inside)
}

#[test]
fn crash_consistency() {
    let seed = env_u64("UBTRFS_CRASH_SEED").unwrap_or(1);
    let per_point = env_u64("UBTRFS_CRASH_IMAGES").unwrap_or(4) as usize;
    let (rec, commits, log) = run_workload(seed);
    let flushes = rec.flushes();
    let gens: Vec<u64> = commits.iter().map(|c| c.generation).collect();
    eprintln!(
        "crash: workload seed {seed}: {} operations, generations {gens:?}, {flushes} flushes, {} writes in the unflushed tail",
        log.len(),
        rec.writes_since_flush()
    );

    let btrfs = have_btrfs();
    if !btrfs {
        skip(
            "crash_consistency: the btrfs check part",
            "btrfs (btrfs-progs) is not installed",
        );
    }

    let kernel = kernel_oracle_enabled(btrfs);
    // Kernel mounts: (count, restored by super-recover, time spent).
    let kernel_stats = Mutex::new((0usize, 0usize, std::time::Duration::ZERO));

    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    // btrfs check runs: (count, time spent); at most BTRFS_CHECKS_MAX.
    let checks = Mutex::new((0usize, std::time::Duration::ZERO));
    let tested = Mutex::new((0usize, 0usize, 0usize)); // images, opened, refused (allowed)
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    let first_fs = commits[0].flushes;
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        if kernel {
            // One thread mounts the kernel sample (one mount at a time: every image has
            // the same fsid) while the others verify with ubtrfs.
            s.spawn(|| {
                let t0 = std::time::Instant::now();
                let (after, inside) = kernel_sample(&commits, flushes);
                let run = |what: String, img: Vec<u8>, ok: Vec<usize>| match kernel_check(
                    &img, &commits, &ok, &what,
                ) {
                    Ok((g, recovered)) => {
                        eprintln!(
                            "crash: kernel: {what}: generation {g}{}",
                            if recovered {
                                " (primary superblock restored by super-recover)"
                            } else {
                                ""
                            }
                        );
                        let mut k = kernel_stats.lock().unwrap();
                        k.0 += 1;
                        k.1 += usize::from(recovered);
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                };
                for n in after {
                    let (ok, _) = allowed(&commits, n, false);
                    run(
                        format!("image after flush {n}"),
                        rec.image_after_flush(n),
                        ok,
                    );
                }
                for (n, kind) in inside {
                    let (ok, _) = allowed(&commits, n, true);
                    // The generator's cycle: prefix, subset (reordered), torn.
                    for (d, img) in rec.crash_images(n, seed ^ 0xC0FFEE, 3).into_iter().skip(1) {
                        run(format!("{d} ({kind})"), img, ok.clone());
                    }
                }
                kernel_stats.lock().unwrap().2 = t0.elapsed();
            });
        }
        for _ in 0..threads {
            s.spawn(|| loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n > flushes {
                    break;
                }
                let mut images = vec![(
                    format!("image after flush {n}"),
                    rec.image_after_flush(n),
                    false,
                )];
                for (d, img) in rec.crash_images(n, seed ^ 0xC0FFEE, per_point) {
                    images.push((d, img, true));
                }
                for (i, (what, img, inside)) in images.into_iter().enumerate() {
                    let (ok, may_fail) = allowed(&commits, n, inside);
                    if ok.is_empty() && !inside {
                        // Before mkfs's first superblock: nothing to open; only no panic.
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            open_ro(MemDevice::new(img, "pre-mkfs")).map(|_| ())
                        }));
                        if r.is_err() {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{what}: PANIC opening a pre-mkfs image"));
                        }
                        continue;
                    }
                    // btrfs check sample: the image after every flush point from the first
                    // commit on, and a subset and a torn image inside a few superblock
                    // batches and every fifth batch.
                    let super_batch = commits.iter().any(|c| c.flushes == n + 1);
                    let sample = btrfs
                        && n >= first_fs
                        && (i == 0
                            || inside
                                && (i == 2 || i == 3)
                                && (super_batch && n % 4 == 1 || n.is_multiple_of(5)));
                    let copy = if sample { Some(img.clone()) } else { None };
                    match verify_image(img, &commits, &ok, may_fail, &what) {
                        Ok(g) => {
                            let mut t = tested.lock().unwrap();
                            t.0 += 1;
                            if g.is_some() {
                                t.1 += 1;
                            } else {
                                t.2 += 1;
                            }
                            drop(t);
                            if let (Some(img), Some(_)) = (copy, g) {
                                let mut c = checks.lock().unwrap();
                                if c.0 < BTRFS_CHECKS_MAX {
                                    c.0 += 1;
                                    drop(c);
                                    let t0 = std::time::Instant::now();
                                    if let Err(e) = btrfs_check_bytes(&img, &what) {
                                        failures.lock().unwrap().push(e);
                                    }
                                    checks.lock().unwrap().1 += t0.elapsed();
                                }
                            }
                        }
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            });
        }
    });
    let (images, opened, refused) = *tested.lock().unwrap();
    eprintln!(
        "crash: {} flush points (cut points), {images} images verified ({opened} opened and matched a commit, \
         {refused} before the first commit refused to open) in {:.1?}",
        flushes + 1,
        start.elapsed()
    );

    if btrfs {
        let (n, time) = checks.into_inner().unwrap();
        eprintln!("crash: btrfs check ran on {n} images ({time:.1?} in total)");
    }

    if kernel {
        let (n, recovered, time) = kernel_stats.into_inner().unwrap();
        eprintln!(
            "crash: kernel mounted and matched {n} images ({recovered} after super-recover) in {time:.1?}"
        );
    }

    let failures = failures.into_inner().unwrap();
    if !failures.is_empty() {
        let _ = std::io::stderr().write_all(format!("workload:\n{}\n", log.join("\n")).as_bytes());
        for f in &failures {
            eprintln!("FAILURE: {f}");
        }
        panic!(
            "{} crash image(s) failed (workload seed {seed}); first: {}",
            failures.len(),
            failures[0]
        );
    }
}
