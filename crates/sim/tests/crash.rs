//! Crash consistency of the commit protocol: a workload (mkfs, then transactions of
//! random file operations, then an uncommitted tail) runs on a `RecordingDevice`. For
//! every flush point the image a power cut would leave right after that flush, and a
//! few images cut inside the following batch of writes (prefix, reordered subset, torn
//! write), must open, carry the generation of a committed transaction (the last one
//! whose superblock write finished, or for cuts inside a superblock batch the previous
//! one too), and hold exactly the model state of that commit. A sample of the images
//! also goes through `btrfs check --readonly --check-data-csum`.
//!
//! Environment: `UBTRFS_CRASH_SEED` (workload seed, default 1), `UBTRFS_CRASH_IMAGES`
//! (crash images per flush point, default 4), `CI` (a missing `btrfs` binary fails the
//! test instead of skipping the btrfs check part).

use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use ubtrfs_core::dev::{Device, MemDevice};
use ubtrfs_core::disk_io::read_best_super;
use ubtrfs_core::format::consts::{super_mirror_offset, SUPER_INFO_OFFSET, SUPER_MIRROR_MAX};
use ubtrfs_sim::fault_dev::RecordingDevice;
use ubtrfs_sim::model::{
    btrfs_check_image, compare_tree, gen_op, have_btrfs, open_ro, FsConfig, Harness, Kind, Model,
    Op,
};
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

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
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
    let mut h = Harness::mkfs(dev, &fsc).unwrap_or_else(|e| panic!("{fsc:?}: {e}"));
    eprintln!("crash: {fsc:?}");
    let mut commits = vec![Committed {
        generation: h.t.fs.info.sb.generation,
        flushes: rec.flushes(),
        model: h.model.clone(),
    }];
    let mut r = Rng::new(seed);
    let fail = |h: &Harness, e: String| -> ! {
        panic!(
            "workload seed {seed}: {e}\nlast operations:\n{}",
            h.tail(30)
        )
    };
    for _ in 0..TRANSACTIONS {
        for _ in 0..r.range(3, 12) {
            let op = gen_op(&h.model, &mut r);
            h.step(&op).unwrap_or_else(|e| fail(&h, e));
        }
        h.commit().unwrap_or_else(|e| fail(&h, e));
        commits.push(Committed {
            generation: h.t.fs.info.sb.generation,
            flushes: rec.flushes(),
            model: h.model.clone(),
        });
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
    // The last commit whose superblock batch ended at or before flush n.
    let last = commits.iter().rposition(|c| c.flushes <= n);
    let mut ok: Vec<usize> = last.into_iter().collect();
    if inside {
        // Batch n holds the superblock writes of the commit that completes at flush n + 1.
        if let Some(k) = commits.iter().position(|c| c.flushes == n + 1) {
            ok.push(k);
        }
    }
    (ok, last.is_none())
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
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("{what}: PANIC: {msg}"))
        }
    }
}

/// Runs `btrfs check` on the image, on the superblock copy ubtrfs would use.
fn btrfs_check(img: &[u8], what: &str) -> Result<(), String> {
    let super_copy = match read_best_super(&SliceDev(img)) {
        Ok((sb, _)) if sb.bytenr != SUPER_INFO_OFFSET => {
            // The primary copy is torn or stale: check the copy ubtrfs used.
            (0..SUPER_MIRROR_MAX).find(|&i| super_mirror_offset(i) == sb.bytenr)
        }
        _ => None,
    };
    let fill = |f: &std::fs::File| -> std::io::Result<()> {
        for (i, block) in img.chunks(4096).enumerate() {
            if block.iter().any(|&b| b != 0) {
                f.write_all_at(block, (i * 4096) as u64)?;
            }
        }
        Ok(())
    };
    btrfs_check_image(img.len() as u64, fill, super_copy).map_err(|e| format!("{what}: {e}"))
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
        assert!(
            std::env::var_os("CI").is_none(),
            "btrfs (btrfs-progs) is not installed, and CI is set"
        );
        eprintln!("crash: btrfs not found; skipping the btrfs check part");
    }

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
                                    if let Err(e) = btrfs_check(&img, &what) {
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
