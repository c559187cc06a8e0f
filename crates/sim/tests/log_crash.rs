//! Crash safety of fsync through the tree log (issue 12). On a `RecordingDevice`,
//! files in the top directory and in a committed directory `d` are written, appended,
//! overwritten in the middle, truncated down and up, punched, made anew, and fsynced
//! through [`TreeLog::fsync`] (commits now and then). The model: after an fsync of X,
//! X and every file logged earlier in the same transaction are durable as they are
//! at that moment (the log is one consistent picture); after a commit, everything.
//!
//! For every flush point, the image a power cut leaves right after it (and a few cut
//! inside the next batch: prefix, reordered subset, torn write) must open — replaying
//! the log — with exactly the durable files: names and contents, no file that was
//! never made durable. A sample of the cuts goes to the kernel (root): its mount
//! replays the log, then `btrfs check --readonly --check-data-csum` must be clean and
//! the kernel must read the same files.
//!
//! `UBTRFS_CI`/`CI`: the kernel sample may not be skipped.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::{Device, Filesystem, NewInode, OpenOptions, Synced, Trans, TreeLog};
use ubtrfs_sim::fault_dev::{allowed_points, RecordingDevice};
use ubtrfs_sim::host::{btrfs_check, panic_message, require_root, ScratchFile};
use ubtrfs_sim::model::{write_data, FsConfig, Harness};
use ubtrfs_sim::mount::KernelMount;
use ubtrfs_sim::rng::Rng;

/// Path -> contents.
type Files = BTreeMap<String, Vec<u8>>;

/// A durable point: the flush count once it was durable, and what it made durable.
struct Point {
    flushes: usize,
    files: Files,
}

const DEV_BYTES: usize = 160 << 20;

fn t0(n: u64) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + n as i64,
        nsec: 0,
    }
}

fn read_files(fs: &Filesystem) -> Result<Files, String> {
    let mut out = Files::new();
    for dir in ["/", "/d"] {
        let d = fs.resolve(dir).map_err(|e| format!("{dir}: {e}"))?;
        for e in fs.readdir(d).map_err(|e| format!("{dir}: {e}"))? {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if name == "d" {
                continue;
            }
            let path = format!("{}/{name}", dir.trim_end_matches('/'));
            let size = fs.stat(e.node).map_err(|e| format!("{path}: {e}"))?.size;
            let data = fs
                .read(e.node, 0, size as usize)
                .map_err(|e| format!("{path}: {e}"))?;
            out.insert(path, data);
        }
    }
    Ok(out)
}

struct Work {
    t: Trans,
    log: TreeLog,
    /// Current contents, by path, and inode numbers.
    cur: Files,
    ino: BTreeMap<String, u64>,
    /// Durable contents now, and the paths logged in this transaction.
    durable: Files,
    logged: Vec<String>,
    step: u64,
}

impl Work {
    fn dir_of(&self, path: &str) -> (u64, String) {
        match path.strip_prefix("/d/") {
            Some(n) => (self.ino["/d"], n.to_string()),
            None => (256, path.trim_start_matches('/').to_string()),
        }
    }

    fn create(&mut self, path: &str) {
        let (dir, name) = self.dir_of(path);
        let a = NewInode {
            mode: 0o100644,
            uid: 0,
            gid: 0,
            rdev: 0,
            time: t0(self.step),
        };
        let ino = self.t.create(5, dir, name.as_bytes(), a).expect("create");
        self.ino.insert(path.to_string(), ino);
        self.cur.insert(path.to_string(), Vec::new());
    }

    fn write(&mut self, path: &str, off: u64, data: &[u8]) {
        let ino = self.ino[path];
        self.t
            .write(5, ino, off, data, t0(self.step))
            .expect("write");
        let c = self.cur.get_mut(path).expect("known file");
        let end = off as usize + data.len();
        if c.len() < end {
            c.resize(end, 0);
        }
        c[off as usize..end].copy_from_slice(data);
    }

    fn truncate(&mut self, path: &str, size: u64) {
        let ino = self.ino[path];
        self.t
            .truncate(5, ino, size, t0(self.step))
            .expect("truncate");
        self.cur
            .get_mut(path)
            .expect("known")
            .resize(size as usize, 0);
    }

    fn punch(&mut self, path: &str, off: u64, len: u64) {
        let ino = self.ino[path];
        self.t
            .punch_hole(5, ino, off, len, t0(self.step))
            .expect("punch");
        let c = self.cur.get_mut(path).expect("known");
        let end = ((off + len) as usize).min(c.len());
        if (off as usize) < end {
            c[off as usize..end].fill(0);
        }
    }

    fn fsync(&mut self, path: &str, rec: &RecordingDevice, points: &mut Vec<Point>) {
        let ino = self.ino[path];
        let r = self.log.fsync(&mut self.t, 5, ino, false).expect("fsync");
        match r {
            Synced::Logged => {
                if !self.logged.iter().any(|p| p == path) {
                    self.logged.push(path.to_string());
                }
                for p in self.logged.clone() {
                    self.durable.insert(p.clone(), self.cur[&p].clone());
                }
            }
            Synced::Committed(_) => self.committed(),
        }
        points.push(Point {
            flushes: rec.flushes(),
            files: self.durable.clone(),
        });
    }

    fn committed(&mut self) {
        self.durable = self.cur.clone();
        self.logged.clear();
    }
}

fn run_workload() -> (Arc<RecordingDevice>, Vec<Point>, u64, u64) {
    let fsc = FsConfig {
        nodesize: 4096,
        ..FsConfig::default()
    };
    let rec = RecordingDevice::new(vec![0u8; DEV_BYTES], "log-crash");
    let dev: Arc<dyn Device> = rec.clone();
    let h = Harness::mkfs(dev, &fsc).unwrap_or_else(|e| panic!("mkfs: {e}"));
    let mut w = Work {
        t: h.t,
        log: TreeLog::new(),
        cur: Files::new(),
        ino: BTreeMap::new(),
        durable: Files::new(),
        logged: Vec::new(),
        step: 1,
    };
    let a = NewInode {
        mode: 0o40755,
        uid: 0,
        gid: 0,
        rdev: 0,
        time: t0(0),
    };
    let d = w.t.create(5, 256, b"d", a).expect("mkdir");
    w.ino.insert("/d".into(), d);
    for i in 0..6 {
        let p = if i % 2 == 0 {
            format!("/f{i}")
        } else {
            format!("/d/f{i}")
        };
        w.create(&p);
        w.write(&p, 0, &write_data(20_000 + i * 7000, i));
    }
    w.t.commit().expect("commit");
    w.committed();
    let mut points = vec![Point {
        flushes: rec.flushes(),
        files: w.durable.clone(),
    }];
    let mut rng = Rng::new(0x10c_c4a5);
    let mut new_files = 0;
    for step in 0..90u64 {
        w.step = step + 2;
        let paths: Vec<String> = w.cur.keys().cloned().collect();
        let p = paths[rng.below(paths.len() as u64) as usize].clone();
        let len = w.cur[&p].len() as u64;
        match rng.below(8) {
            0 | 1 => {
                let n = 1 + rng.below(9000);
                w.write(&p, len, &write_data(n, step * 31));
            }
            2 => {
                let off = rng.below(len + 1);
                w.write(&p, off, &write_data(1 + rng.below(20_000), step * 37));
            }
            3 => {
                let s = rng.below(len + 1);
                w.truncate(&p, s);
                if rng.below(2) == 0 {
                    w.truncate(&p, s + rng.below(30_000));
                }
            }
            4 if len > 8192 => {
                let off = rng.below(len / 4096) * 4096;
                w.punch(&p, off, 4096 * (1 + rng.below(3)));
            }
            5 => {
                new_files += 1;
                let np = if rng.below(2) == 0 {
                    format!("/n{new_files}")
                } else {
                    format!("/d/n{new_files}")
                };
                w.create(&np);
                w.write(&np, 0, &write_data(1 + rng.below(50_000), step * 41));
            }
            _ => {}
        }
        // fsync the file just changed, or another one.
        if rng.below(3) != 0 {
            let target = if rng.below(4) == 0 {
                paths[rng.below(paths.len() as u64) as usize].clone()
            } else {
                p
            };
            w.fsync(&target, &rec, &mut points);
        }
        if step % 30 == 29 {
            w.t.commit().expect("commit");
            w.committed();
            points.push(Point {
                flushes: rec.flushes(),
                files: w.durable.clone(),
            });
        }
    }
    let st = w.log.stats();
    (rec, points, st.logged, st.fast_path)
}

/// The durable points a cut after flush `n` may show: the last one durable by then,
/// and (inside the next batch) the one that batch completes.
fn allowed(points: &[Point], n: usize, inside: bool) -> Vec<usize> {
    let at: Vec<usize> = points.iter().map(|c| c.flushes).collect();
    allowed_points(&at, n, inside)
}

/// A cut image as a sparse file (the openers take paths), removed on drop.
fn image_file(img: &[u8]) -> Result<ScratchFile, String> {
    ScratchFile::of_image("cut", img)
}

fn verify(img: &[u8], points: &[Point], ok: &[usize]) -> Result<(), String> {
    let cut = image_file(img)?;
    let path = cut.path.clone();
    let fs = Filesystem::open_replayed(&[&path], OpenOptions::default())
        .map_err(|e| format!("does not open: {e}"))?;
    for w in fs.info.take_warnings() {
        if w.contains("cannot be replayed") {
            return Err(w);
        }
    }
    let got = read_files(&fs)?;
    if ok.iter().any(|&k| points[k].files == got) {
        return Ok(());
    }
    let want = &points[ok[0]].files;
    let mut diff = Vec::new();
    for (p, v) in want {
        match got.get(p) {
            None => diff.push(format!("{p} missing")),
            Some(g) if g != v => diff.push(format!("{p}: {} bytes, want {}", g.len(), v.len())),
            _ => {}
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        diff.push(format!("{p} unexpected"));
    }
    Err(format!("not a durable state: {}", diff.join(", ")))
}

/// The kernel replays a cut image: btrfs check clean, the same files.
fn kernel_sample(img: &[u8], want: &Files) -> Result<(), String> {
    let cut = image_file(img)?;
    let path = cut.path.clone();
    let k = KernelMount::try_new(&[&path], "")?;
    let mut got = Files::new();
    for (p, _) in want.iter() {
        if let Ok(data) = std::fs::read(k.path(p.trim_start_matches('/'))) {
            got.insert(p.clone(), data);
        }
    }
    k.try_umount()?;
    if got != *want {
        return Err("the kernel's replay shows other files than ubtrfs's".into());
    }
    btrfs_check(&path, None)
        .map(|_| ())
        .map_err(|e| format!("btrfs check after the kernel replay: {e}"))
}

#[test]
fn fsync_log_survives_every_cut() {
    let (rec, points, logged, fast) = run_workload();
    let flushes = rec.flushes();
    let kernel = require_root("fsync_log_survives_every_cut: the kernel replay sample");
    let mut failures = Vec::new();
    let mut sampled = 0;
    for n in 0..=flushes {
        for (what, img, inside) in rec.cut_images(n, 2) {
            let ok = allowed(&points, n, inside);
            if ok.is_empty() {
                continue; // before the setup's commit
            }
            match catch_unwind(AssertUnwindSafe(|| verify(&img, &points, &ok))) {
                Ok(Ok(())) => {
                    if kernel && !inside && n % 9 == 4 {
                        sampled += 1;
                        let want = &points[ok[0]].files;
                        if let Err(e) = kernel_sample(&img, want) {
                            failures.push(format!("{what}: kernel: {e}"));
                        }
                    }
                }
                Ok(Err(e)) => failures.push(format!("{what}: {e}")),
                Err(p) => failures.push(format!("{what}: PANIC {}", panic_message(&*p))),
            }
        }
    }
    eprintln!(
        "log crash: {} durable points, {logged} logged fsyncs ({fast} files through the fast \
         path), {flushes} flush points, {sampled} kernel replays",
        points.len()
    );
    assert!(logged > 20, "most fsyncs are logged ({logged})");
    assert!(fast > 10, "files logged again take the fast path ({fast})");
    ubtrfs_sim::host::assert_no_failures(&failures);
}

/// A directory of many new files whose log could not fit into the free metadata
/// space: the fsync commits at once, after copying the directory's own items and
/// before logging any child (a million files in the benchmark of seed 004: the log
/// of all of them would cost more than the commit that makes them durable). The
/// commit makes every file durable: the image opens with all of them, check clean.
#[test]
fn fsync_commits_at_once_when_the_log_cannot_fit() {
    let rec = RecordingDevice::new(vec![0u8; DEV_BYTES], "log-short");
    let dev: Arc<dyn Device> = rec.clone();
    let h = Harness::mkfs(dev, &FsConfig::default()).unwrap_or_else(|e| panic!("mkfs: {e}"));
    let mut t = h.t;
    let mut log = TreeLog::new();
    let a = |mode| NewInode {
        mode,
        uid: 0,
        gid: 0,
        rdev: 0,
        time: t0(1),
    };
    // Fill the metadata chunk mkfs made until the transaction allocates another,
    // and commit it: the next transaction has that new chunk's free space only.
    let pre = t.create(5, 256, b"pre", a(0o40755)).expect("mkdir");
    let mut i = 0u64;
    while !t.chunks_allocated() {
        assert!(i < 200_000, "no metadata chunk allocated after {i} files");
        t.create(5, pre, format!("f{i}").as_bytes(), a(0o100644))
            .expect("create");
        i += 1;
    }
    t.commit().expect("commit");
    // New files in a new directory until their log would exceed what is free, no
    // new chunk allocated: each needs at least 277 bytes of log items (its DIR_INDEX
    // item, 25 + 30 + name, and the inode's two), so 250 per file is past it.
    let d = t.create(5, 256, b"big", a(0o40755)).expect("mkdir");
    let mut m = 0u64;
    while m * 250 <= t.metadata_free_bytes() {
        t.create(5, d, format!("g{m}").as_bytes(), a(0o100644))
            .expect("create");
        m += 1;
    }
    assert!(!t.chunks_allocated(), "a chunk allocated for {m} files");
    assert!(m > 1000, "only {m} files fill the free space");
    let r = log.fsync(&mut t, 5, d, false).expect("fsync");
    let st = log.stats().clone();
    assert_eq!(
        r,
        Synced::Committed("metadata space short for the log"),
        "{m} files: {st:?}"
    );
    // Only the directory itself was looked at: no child was copied into the log.
    assert!(st.inodes_logged <= 1, "{st:?}");
    assert_eq!(st.blocks_written, 0, "{st:?}");
    let img = image_file(&rec.image_after_flush(rec.flushes())).expect("image");
    let fs = Filesystem::open_replayed(&[&img.path], OpenOptions::default()).expect("open");
    let big = fs.resolve("/big").expect("/big");
    assert_eq!(fs.readdir(big).expect("readdir").len() as u64, m);
    drop(fs);
    btrfs_check(&img.path, None).expect("btrfs check");
}
