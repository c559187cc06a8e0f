//! Power cuts under a read-write mount (issue 11's crash proof): the FUSE server runs
//! in this process on a `RecordingDevice`, two threads work through the mountpoint
//! (each in its own directory: writes, appends, truncates, punched holes, new files,
//! renames over other files, hard links, unlinks, fsync, fdatasync, directory fsync,
//! and now and then syncfs + a commit), then the mount is unmounted cleanly.
//!
//! Every path keeps the list of states it went through (contents, or absent), each
//! with the flush count at which the operation making it started, and the states
//! made durable: an fsync or fdatasync of that path (at the flush count once it
//! returned), an fsync of its directory for a removed name, a commit for every path
//! (the state it had when syncfs started). For every flush point, the image a power
//! cut leaves right after it (and two cut inside the next batch: a prefix, a
//! reordered subset, a torn write) must open, replaying the log, with every path in
//! one of the states from its last durable one up to the last one whose operation
//! began before the cut (an operation in flight may be half there: each 4 KiB page
//! from one of those states). A sample goes to the kernel (root): its mount replays
//! the log and must show exactly what ubtrfs's replay shows, and `btrfs check
//! --readonly --check-data-csum` must be clean after it; another sample is replayed
//! by ubtrfs's writing open (which commits the replay), then checked the same way.
//!
//! Needs root and /dev/fuse; `UBTRFS_CI`/`CI`: may not be skipped.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions as StdOpen};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ubtrfs_core::{Device, Filesystem, OpenOptions, Trans};
use ubtrfs_fuse::{Config, Engine, Writer};
use ubtrfs_sim::fault_dev::RecordingDevice;
use ubtrfs_sim::host::{btrfs_check, require_fuse, ScratchFile};
use ubtrfs_sim::model::{write_data, FsConfig, Harness};
use ubtrfs_sim::mount::{fuse_unmount, KernelMount};
use ubtrfs_sim::rng::Rng;

const DEV_BYTES: usize = 160 << 20;
const DIRS: [&str; 2] = ["a", "b"];
const OPS_PER_THREAD: u64 = 70;
const PAGE: usize = 4096;

type Content = Option<Vec<u8>>;

#[derive(Default)]
struct PathLog {
    /// (flush count when the operation that made it started, contents).
    states: Vec<(usize, Content)>,
    /// (flush count once durable, index into `states`).
    durable: Vec<(usize, usize)>,
}

/// What the workload did, shared by the threads (each changes only its own
/// directory's paths, so a path's states are in the order they happened).
#[derive(Default)]
struct Model {
    /// inode -> contents; path -> inode.
    inodes: BTreeMap<u64, Vec<u8>>,
    names: BTreeMap<String, u64>,
    next_ino: u64,
    paths: BTreeMap<String, PathLog>,
    /// What each thread did, a line per operation with its flush counts (printed
    /// with a failure).
    trace: Vec<String>,
}

impl Model {
    fn content(&self, p: &str) -> Content {
        self.names.get(p).map(|i| self.inodes[i].clone())
    }

    /// Notes the state of every path of `dir` that changed, made by an operation
    /// that started at flush count `started`.
    fn record(&mut self, dir: &str, started: usize) {
        let prefix = format!("/{dir}/");
        let mut all: Vec<String> = self
            .names
            .keys()
            .filter(|p| p.starts_with(&prefix))
            .cloned()
            .collect();
        all.extend(
            self.paths
                .keys()
                .filter(|p| p.starts_with(&prefix))
                .cloned(),
        );
        all.sort();
        all.dedup();
        for p in all {
            let c = self.content(&p);
            let log = self.paths.entry(p).or_insert_with(|| PathLog {
                states: vec![(0, None)],
                durable: vec![(0, 0)],
            });
            if log.states.last().map(|s| &s.1) != Some(&c) {
                log.states.push((started, c));
            }
        }
    }

    fn make_durable(&mut self, p: &str, flushes: usize) {
        if let Some(log) = self.paths.get_mut(p) {
            let idx = log.states.len() - 1;
            log.durable.push((flushes, idx));
        }
    }
}

struct Shared {
    rec: Arc<RecordingDevice>,
    writer: Arc<Writer>,
    mnt: PathBuf,
    model: Mutex<Model>,
}

impl Shared {
    fn model(&self) -> std::sync::MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// syncfs (the kernel's dirty pages reach the server), then a commit: every
    /// path is durable at the state it had when syncfs started.
    fn commit(&self) {
        let at: Vec<(String, usize)> = self
            .model()
            .paths
            .iter()
            .map(|(p, l)| (p.clone(), l.states.len() - 1))
            .collect();
        let f = File::open(&self.mnt).expect("open mountpoint");
        nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)).expect("syncfs");
        self.writer.commit().expect("commit");
        let flushes = self.rec.flushes();
        let mut m = self.model();
        for (p, idx) in at {
            if let Some(l) = m.paths.get_mut(&p) {
                l.durable.push((flushes, idx));
            }
        }
    }
}

fn open_rw(p: &Path) -> File {
    StdOpen::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
}

/// One thread's operations in directory `dir`.
fn work(s: &Shared, t: usize, seed: u64) {
    let dir = DIRS[t];
    let mut rng = Rng::new(seed);
    let host = |p: &str| s.mnt.join(p.trim_start_matches('/'));
    for step in 0..OPS_PER_THREAD {
        let names: Vec<String> = s
            .model()
            .names
            .keys()
            .filter(|p| p.starts_with(&format!("/{dir}/")))
            .cloned()
            .collect();
        let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
        let fresh = |rng: &mut Rng| format!("/{dir}/f{}", rng.below(12));
        let started = s.rec.flushes();
        let op = if names.is_empty() { 0 } else { rng.below(14) };
        let seedv = seed.wrapping_mul(1000) + step;
        let mut did = String::new();
        match op {
            0 | 1 => {
                // A new file (or one rewritten from the start, O_TRUNC).
                let p = fresh(&mut rng);
                let data = write_data(1 + rng.below(300_000), seedv);
                std::fs::write(host(&p), &data).expect("write new");
                did = format!("write {p} {} bytes", data.len());
                let mut m = s.model();
                let ino = match m.names.get(&p) {
                    Some(&i) => {
                        // O_TRUNC, then the write: in flight, the empty file may show.
                        m.inodes.insert(i, Vec::new());
                        m.record(dir, started);
                        i
                    }
                    None => {
                        // Created, then written: in flight, the empty file may show.
                        m.next_ino += 1;
                        let i = m.next_ino;
                        m.names.insert(p.clone(), i);
                        m.inodes.insert(i, Vec::new());
                        m.record(dir, started);
                        i
                    }
                };
                m.inodes.insert(ino, data);
                m.record(dir, started);
            }
            2..=4 => {
                // Overwrite or append.
                let p = pick(&mut rng);
                let len = s.model().content(&p).map_or(0, |c| c.len()) as u64;
                let off = if op == 2 { rng.below(len + 1) } else { len };
                let data = write_data(1 + rng.below(150_000), seedv);
                open_rw(&host(&p)).write_all_at(&data, off).expect("pwrite");
                did = format!("pwrite {p} {} bytes at {off}", data.len());
                let mut m = s.model();
                let ino = m.names[&p];
                let c = m.inodes.get_mut(&ino).expect("inode");
                let end = off as usize + data.len();
                if c.len() < end {
                    c.resize(end, 0);
                }
                c[off as usize..end].copy_from_slice(&data);
                m.record(dir, started);
            }
            5 => {
                let p = pick(&mut rng);
                let len = s.model().content(&p).map_or(0, |c| c.len()) as u64;
                let size = if rng.below(2) == 0 {
                    rng.below(len + 1)
                } else {
                    len + rng.below(100_000)
                };
                open_rw(&host(&p)).set_len(size).expect("truncate");
                did = format!("truncate {p} to {size}");
                let mut m = s.model();
                let ino = m.names[&p];
                m.inodes
                    .get_mut(&ino)
                    .expect("inode")
                    .resize(size as usize, 0);
                m.record(dir, started);
            }
            6 => {
                let p = pick(&mut rng);
                let len = s.model().content(&p).map_or(0, |c| c.len());
                if len > 3 * PAGE {
                    let off = rng.below((len / PAGE) as u64) as usize * PAGE;
                    let n = (PAGE * (1 + rng.below(8) as usize)).min(len - off);
                    let f = open_rw(&host(&p));
                    nix::fcntl::fallocate(
                        std::os::fd::AsRawFd::as_raw_fd(&f),
                        nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                        off as i64,
                        n as i64,
                    )
                    .expect("punch hole");
                    did = format!("punch {p} {n} at {off}");
                    let mut m = s.model();
                    let ino = m.names[&p];
                    m.inodes.get_mut(&ino).expect("inode")[off..off + n].fill(0);
                    m.record(dir, started);
                }
            }
            7 => {
                // Rename, maybe over another file.
                let (from, to) = (pick(&mut rng), fresh(&mut rng));
                if from != to {
                    std::fs::rename(host(&from), host(&to)).expect("rename");
                    did = format!("rename {from} {to}");
                    let mut m = s.model();
                    // Two links of one inode: rename(2) leaves both.
                    if m.names.get(&to) != m.names.get(&from) {
                        let ino = m.names.remove(&from).expect("renamed");
                        if let Some(old) = m.names.insert(to, ino) {
                            if !m.names.values().any(|&i| i == old) {
                                m.inodes.remove(&old);
                            }
                        }
                        m.record(dir, started);
                    }
                }
            }
            8 => {
                let (from, to) = (pick(&mut rng), fresh(&mut rng));
                if std::fs::hard_link(host(&from), host(&to)).is_ok() {
                    did = format!("link {from} {to}");
                    let mut m = s.model();
                    let ino = m.names[&from];
                    m.names.insert(to, ino);
                    m.record(dir, started);
                }
            }
            9 => {
                let p = pick(&mut rng);
                std::fs::remove_file(host(&p)).expect("unlink");
                did = format!("unlink {p}");
                let mut m = s.model();
                let ino = m.names.remove(&p).expect("unlinked");
                if !m.names.values().any(|&i| i == ino) {
                    m.inodes.remove(&ino);
                }
                m.record(dir, started);
            }
            10 => {
                // The directory's fsync: its removed names stay removed.
                File::open(host(&format!("/{dir}")))
                    .and_then(|f| f.sync_all())
                    .expect("fsync dir");
                did = format!("fsync /{dir}");
                let flushes = s.rec.flushes();
                let mut m = s.model();
                let gone: Vec<String> = m
                    .paths
                    .iter()
                    .filter(|(p, l)| {
                        p.starts_with(&format!("/{dir}/"))
                            && l.states.last().is_some_and(|s| s.1.is_none())
                    })
                    .map(|(p, _)| p.clone())
                    .collect();
                for p in gone {
                    m.make_durable(&p, flushes);
                }
            }
            11 if step % 3 == 0 => {
                s.commit();
                did = "syncfs + commit".into();
            }
            _ => {
                let p = pick(&mut rng);
                let f = open_rw(&host(&p));
                if rng.below(2) == 0 {
                    f.sync_all().expect("fsync");
                    did = format!("fsync {p}");
                } else {
                    f.sync_data().expect("fdatasync");
                    did = format!("fdatasync {p}");
                }
                let flushes = s.rec.flushes();
                s.model().make_durable(&p, flushes);
            }
        }
        if !did.is_empty() {
            let line = format!(
                "{dir} step {step}, flushes {started}..{}: {did}",
                s.rec.flushes()
            );
            s.model().trace.push(line);
        }
    }
}

/// The files of the two directories in an opened filesystem.
fn read_tree(fs: &Filesystem) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    for dir in DIRS {
        let d = fs
            .resolve(&format!("/{dir}"))
            .map_err(|e| format!("/{dir}: {e}"))?;
        for e in fs.readdir(d).map_err(|e| format!("/{dir}: {e}"))? {
            let path = format!("/{dir}/{}", String::from_utf8_lossy(&e.name));
            let size = fs.stat(e.node).map_err(|e| format!("{path}: {e}"))?.size;
            let data = fs
                .read(e.node, 0, size as usize)
                .map_err(|e| format!("{path}: {e}"))?;
            out.insert(path, data);
        }
    }
    Ok(out)
}

/// Whether `got` is one of `allowed`, or what an operation in flight may leave: a
/// size between the smallest and the largest, each byte from one of them (the
/// server learns data a page at a time, and the size a write's end at a time, as
/// the kernel's btrfs may persist an in-flight append's size as its ordered extents
/// complete).
fn acceptable(got: &Content, allowed: &[&Content]) -> bool {
    if allowed.contains(&got) {
        return true;
    }
    let Some(g) = got else { return false };
    let present: Vec<&Vec<u8>> = allowed.iter().filter_map(|c| c.as_ref()).collect();
    let (Some(lo), Some(hi)) = (
        present.iter().map(|c| c.len()).min(),
        present.iter().map(|c| c.len()).max(),
    ) else {
        return false;
    };
    (lo..=hi).contains(&g.len())
        && g.iter()
            .enumerate()
            .all(|(i, &b)| present.iter().any(|c| c.get(i).copied().unwrap_or(0) == b))
}

fn check_cut(
    got: &BTreeMap<String, Vec<u8>>,
    m: &Model,
    n: usize,
    inside: bool,
) -> Result<(), String> {
    // Inside the batch after flush n, what flush n + 1 makes durable may be there or
    // not: the lower bound stays the last state durable at flush n.
    let durable_by = n;
    let mut bad = Vec::new();
    for p in got.keys().filter(|p| !m.paths.contains_key(*p)) {
        bad.push(format!("{p}: never made"));
    }
    for (p, log) in &m.paths {
        let d = log
            .durable
            .iter()
            .filter(|&&(f, _)| f <= durable_by)
            .map(|&(_, i)| i)
            .max()
            .unwrap_or(0);
        let hi = log
            .states
            .iter()
            .rposition(|&(s, _)| if inside { s <= n } else { s < n })
            .unwrap_or(0)
            .max(d);
        let allowed: Vec<&Content> = log.states[d..=hi].iter().map(|s| &s.1).collect();
        let g = got.get(p).cloned();
        if !acceptable(&g, &allowed) {
            bad.push(format!(
                "{p}: {} (states {d}..={hi} allowed: {})",
                g.map_or("absent".into(), |c| format!("{} bytes", c.len())),
                allowed
                    .iter()
                    .map(|c| c.as_ref().map_or("absent".into(), |c| c.len().to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

fn image_file(img: &[u8]) -> ScratchFile {
    ScratchFile::of_image("mount-cut", img).expect("scratch image")
}

/// The kernel's replay of a cut: the same files as ubtrfs's, btrfs check clean.
fn kernel_sample(img: &[u8], want: &BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    let cut = image_file(img);
    let k = KernelMount::try_new(&[&cut.path], "")?;
    let mut got = BTreeMap::new();
    for dir in DIRS {
        for e in std::fs::read_dir(k.path(dir)).map_err(|e| format!("{dir}: {e}"))? {
            let e = e.map_err(|e| e.to_string())?;
            let p = format!("/{dir}/{}", e.file_name().to_string_lossy());
            got.insert(p, std::fs::read(e.path()).map_err(|e| e.to_string())?);
        }
    }
    k.try_umount()?;
    if got != *want {
        let diff: Vec<&String> = got
            .keys()
            .chain(want.keys())
            .filter(|p| got.get(*p) != want.get(*p))
            .collect();
        return Err(format!(
            "the kernel's replay differs from ubtrfs's at {diff:?}"
        ));
    }
    btrfs_check(&cut.path, None)
        .map(|_| ())
        .map_err(|e| format!("btrfs check after the kernel's replay: {e}"))
}

/// ubtrfs's writing open replays and commits; then btrfs check and the same files.
fn ubtrfs_write_sample(img: &[u8], want: &BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    let cut = image_file(img);
    let t = Trans::open_paths(&[&cut.path]).map_err(|e| format!("writing open: {e}"))?;
    drop(t);
    btrfs_check(&cut.path, None).map_err(|e| format!("btrfs check after ubtrfs's replay: {e}"))?;
    let fs = Filesystem::open_replayed(&[&cut.path], OpenOptions::default())
        .map_err(|e| e.to_string())?;
    if read_tree(&fs)? != *want {
        return Err("after ubtrfs's writing replay the files differ".into());
    }
    Ok(())
}

#[test]
fn mount_workload_survives_every_cut() {
    if !require_fuse("mount_workload_survives_every_cut") {
        return;
    }
    let rec = RecordingDevice::new(vec![0u8; DEV_BYTES], "mount-crash");
    let dev: Arc<dyn Device> = rec.clone();
    let mut h = Harness::mkfs(dev, &FsConfig::default()).expect("mkfs");
    let a = ubtrfs_core::NewInode {
        mode: 0o40755,
        uid: 0,
        gid: 0,
        rdev: 0,
        time: ubtrfs_core::format::items::Timespec {
            sec: 1_700_000_000,
            nsec: 0,
        },
    };
    for d in DIRS {
        h.t.create(5, 256, d.as_bytes(), a).expect("mkdir");
    }
    h.t.commit().expect("commit");
    let base_flushes = rec.flushes();
    let writer = Writer::new(h.t);
    let root = writer
        .read(|fs| ubtrfs_fuse::resolve_root(fs, None, None))
        .expect("root");
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir mnt");
    let session = ubtrfs_fuse::mount(
        Engine::ReadWrite(Arc::clone(&writer)),
        &mnt,
        &Config::new("mount-crash", root),
    )
    .expect("mount");
    let server = std::thread::spawn(move || session.run());
    let committer = writer.spawn_committer(Duration::from_secs(3600));
    let s = Arc::new(Shared {
        rec: Arc::clone(&rec),
        writer: Arc::clone(&writer),
        mnt: mnt.clone(),
        model: Mutex::new(Model::default()),
    });
    // Unmounted also when a thread panics.
    let guard = ubtrfs_sim::mount::FuseUnmount(&mnt);
    let threads: Vec<_> = (0..DIRS.len())
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || work(&s, t, 0x6d0c_7a5e + t as u64))
        })
        .collect();
    let mut panicked = false;
    for th in threads {
        panicked |= th.join().is_err();
    }
    let stats = writer.log_stats();
    fuse_unmount(&mnt);
    drop(guard);
    let served = server.join();
    writer.stop();
    let _ = committer.join();
    assert!(!panicked, "a workload thread failed");
    assert!(matches!(served, Ok(Ok(()))), "the server: {served:?}");
    writer.finish().expect("the unmount's commit");
    let final_flushes = rec.flushes();
    let model = s.model();
    let stats = stats.expect("tree log stats");
    // The clean unmount: exactly the last state.
    let last: BTreeMap<String, Vec<u8>> = model
        .names
        .iter()
        .map(|(p, i)| (p.clone(), model.inodes[i].clone()))
        .collect();

    let mut failures = Vec::new();
    let mut kernel = 0;
    let mut cuts = 0;
    for n in base_flushes..=final_flushes {
        for (what, img, inside) in rec.cut_images(n, 2) {
            cuts += 1;
            let cut = image_file(&img);
            let got = Filesystem::open_replayed(&[&cut.path], OpenOptions::default())
                .map_err(|e| format!("does not open: {e}"))
                .and_then(|fs| {
                    for w in fs.info.take_warnings() {
                        if w.contains("cannot be replayed") {
                            return Err(w);
                        }
                    }
                    read_tree(&fs)
                });
            drop(cut);
            let got = match got {
                Ok(g) => g,
                Err(e) => {
                    failures.push(format!("{what}: {e}"));
                    continue;
                }
            };
            if n == final_flushes && !inside && got != last {
                failures.push(format!("{what}: the unmounted image is not the last state"));
            }
            if let Err(e) = check_cut(&got, &model, n, inside) {
                failures.push(format!("{what}: {e}"));
                continue;
            }
            if !inside && n % 11 == 5 {
                kernel += 1;
                if let Err(e) = kernel_sample(&img, &got) {
                    failures.push(format!("{what}: kernel: {e}"));
                }
            }
            if !inside && n % 11 == 0 {
                if let Err(e) = ubtrfs_write_sample(&img, &got) {
                    failures.push(format!("{what}: {e}"));
                }
            }
        }
    }
    let durable: usize = model.paths.values().map(|l| l.durable.len()).sum();
    eprintln!(
        "mount crash: {} paths, {durable} durable points, {} fsyncs ({} logged, {} full \
         commits {:?}), {} flush points, {cuts} cut images, {kernel} kernel replays",
        model.paths.len(),
        stats.fsyncs,
        stats.logged,
        stats.full_commits,
        stats.commit_reasons,
        final_flushes - base_flushes,
    );
    if !failures.is_empty() {
        // The history of the paths that failed, then every operation.
        for (p, log) in &model.paths {
            if failures.iter().any(|f| f.contains(&format!("{p}:"))) {
                let states: Vec<String> = log
                    .states
                    .iter()
                    .map(|(f, c)| {
                        format!(
                            "{f}:{}",
                            c.as_ref().map_or("absent".into(), |c| c.len().to_string())
                        )
                    })
                    .collect();
                eprintln!(
                    "{p}: states {states:?}, durable (flush, state) {:?}",
                    log.durable
                );
            }
        }
        for l in &model.trace {
            eprintln!("  {l}");
        }
    }
    assert!(stats.logged > 10, "most fsyncs are logged: {stats:?}");
    ubtrfs_sim::host::assert_no_failures(&failures);
}
