//! Crash safety of fsync through the tree log for names (issue 12): renames, hard
//! links and unlinks across three directories, file and directory fsyncs, on a
//! `RecordingDevice`, cut at every flush (and inside the next batch: prefix,
//! reordered subset, torn write). What must hold after a cut, once replayed:
//! - a file fsynced and never touched again (content, names) is there with exactly
//!   the names it had at its fsync — no fewer, and no name it had given up — and
//!   its content at that moment;
//! - a name unlinked and then made durable by an fsync of its directory (names are
//!   never reused) is gone for good;
//! - the image opens with the log replayed, and ubtrfs's own check is clean on a
//!   sample.
//!
//! A sample of the cuts goes to the kernel (root): its mount replays the log, shows
//! the same names, inode numbers and contents as ubtrfs's replay, and `btrfs check
//! --readonly --check-data-csum` is clean afterwards.
//!
//! `UBTRFS_CI`/`CI`: the kernel sample may not be skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::{Device, Filesystem, NewInode, OpenOptions, Synced, Trans, TreeLog};
use ubtrfs_sim::fault_dev::RecordingDevice;
use ubtrfs_sim::host::{btrfs_check, panic_message, require_root, ScratchFile};
use ubtrfs_sim::model::{write_data, FsConfig, Harness};
use ubtrfs_sim::mount::KernelMount;
use ubtrfs_sim::rng::Rng;

/// Path -> (inode number, contents; None for a directory).
type Tree = BTreeMap<String, (u64, Option<Vec<u8>>)>;

const DEV_BYTES: usize = 160 << 20;
const DIRS: [&str; 3] = ["a", "b", "c"];

fn ts(n: u64) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + n as i64,
        nsec: 0,
    }
}

/// A file fsynced and left alone from then on: durable from flush `flushes` on.
struct Frozen {
    flushes: usize,
    ino: u64,
    names: BTreeSet<String>,
    data: Vec<u8>,
}

/// A name whose removal an fsync of its directory made durable at `flushes`.
struct Gone {
    flushes: usize,
    path: String,
}

struct Work {
    t: Trans,
    log: TreeLog,
    dir_ino: BTreeMap<&'static str, u64>,
    /// Live files: inode -> (names as "dir/name", contents).
    files: BTreeMap<u64, (BTreeSet<String>, Vec<u8>)>,
    frozen: BTreeSet<u64>,
    /// Names unlinked since their directory's last fsync, per directory.
    unlinked: BTreeMap<&'static str, Vec<String>>,
    next_name: u64,
    step: u64,
}

impl Work {
    /// A new filesystem on `rec` with the three directories (not committed yet).
    fn mkfs(rec: &Arc<RecordingDevice>, fsc: &FsConfig) -> Work {
        let dev: Arc<dyn Device> = rec.clone();
        let h = Harness::mkfs(dev, fsc).unwrap_or_else(|e| panic!("mkfs: {e}"));
        let mut w = Work {
            t: h.t,
            log: TreeLog::new(),
            dir_ino: BTreeMap::new(),
            files: BTreeMap::new(),
            frozen: BTreeSet::new(),
            unlinked: BTreeMap::new(),
            next_name: 0,
            step: 1,
        };
        for d in DIRS {
            let a = NewInode {
                mode: 0o40755,
                uid: 0,
                gid: 0,
                rdev: 0,
                time: ts(0),
            };
            let ino = w.t.create(5, 256, d.as_bytes(), a).expect("mkdir");
            w.dir_ino.insert(d, ino);
        }
        w
    }

    fn new_name(&mut self, dir: &'static str) -> (u64, String, String) {
        self.next_name += 1;
        let name = format!("n{}", self.next_name);
        (self.dir_ino[dir], name.clone(), format!("{dir}/{name}"))
    }

    fn create(&mut self, dir: &'static str, data: Vec<u8>) {
        let (d, name, path) = self.new_name(dir);
        let a = NewInode {
            mode: 0o100644,
            uid: 0,
            gid: 0,
            rdev: 0,
            time: ts(self.step),
        };
        let ino = self.t.create(5, d, name.as_bytes(), a).expect("create");
        self.t
            .write(5, ino, 0, &data, ts(self.step))
            .expect("write");
        self.files.insert(ino, (BTreeSet::from([path]), data));
    }

    fn split(path: &str) -> (&str, &str) {
        path.split_once('/').expect("dir/name")
    }

    fn dir_static(d: &str) -> &'static str {
        DIRS.iter().copied().find(|x| *x == d).expect("known dir")
    }
}

/// The recording, the frozen files, the durable removals, the fsyncs logged and
/// the flush count once the setup (three directories, nine files) was committed.
fn run_workload() -> (Arc<RecordingDevice>, Vec<Frozen>, Vec<Gone>, usize, usize) {
    let fsc = FsConfig {
        nodesize: 4096,
        ..FsConfig::default()
    };
    let rec = RecordingDevice::new(vec![0u8; DEV_BYTES], "log-names-crash");
    let mut w = Work::mkfs(&rec, &fsc);
    for i in 0..9u64 {
        w.create(DIRS[(i % 3) as usize], write_data(3000 + i * 2500, i));
    }
    w.t.commit().expect("commit");
    let setup = rec.flushes();
    let mut frozen = Vec::new();
    let mut gone = Vec::new();
    let mut rng = Rng::new(0x5a4e_11f0);
    let mut logged = 0usize;
    for step in 0..140u64 {
        w.step = step + 2;
        let live: Vec<u64> = w
            .files
            .keys()
            .copied()
            .filter(|i| !w.frozen.contains(i))
            .collect();
        if live.len() < 3 {
            let d = DIRS[rng.below(3) as usize];
            w.create(d, write_data(1 + rng.below(30_000), step));
            continue;
        }
        let ino = live[rng.below(live.len() as u64) as usize];
        let dir = DIRS[rng.below(3) as usize];
        match rng.below(10) {
            0 => {
                let len = w.files[&ino].1.len() as u64;
                let data = write_data(1 + rng.below(9000), step * 31);
                w.t.write(5, ino, len, &data, ts(w.step)).expect("append");
                w.files
                    .get_mut(&ino)
                    .expect("live")
                    .1
                    .extend_from_slice(&data);
            }
            1 => w.create(dir, write_data(1 + rng.below(40_000), step * 7)),
            2 => {
                // Rename one of its names to a new name in some directory.
                let names: Vec<String> = w.files[&ino].0.iter().cloned().collect();
                let old = names[rng.below(names.len() as u64) as usize].clone();
                let (od, on) = Work::split(&old);
                let (nd_ino, nn, np) = w.new_name(dir);
                let od_ino = w.dir_ino[od];
                w.t.rename(
                    5,
                    od_ino,
                    on.as_bytes(),
                    nd_ino,
                    nn.as_bytes(),
                    true,
                    ts(w.step),
                )
                .expect("rename");
                let f = w.files.get_mut(&ino).expect("live");
                f.0.remove(&old);
                f.0.insert(np);
            }
            3 => {
                let (d, n, p) = w.new_name(dir);
                w.t.link(5, ino, d, n.as_bytes(), ts(w.step)).expect("link");
                w.files.get_mut(&ino).expect("live").0.insert(p);
            }
            4 => {
                let names: Vec<String> = w.files[&ino].0.iter().cloned().collect();
                let old = names[rng.below(names.len() as u64) as usize].clone();
                let (od, on) = Work::split(&old);
                let od_ino = w.dir_ino[od];
                w.t.unlink(5, od_ino, on.as_bytes(), ts(w.step))
                    .expect("unlink");
                w.unlinked
                    .entry(Work::dir_static(od))
                    .or_default()
                    .push(old.clone());
                let f = w.files.get_mut(&ino).expect("live");
                f.0.remove(&old);
                if f.0.is_empty() {
                    w.files.remove(&ino);
                }
            }
            5..=7 => {
                let r = w.log.fsync(&mut w.t, 5, ino, false).expect("fsync");
                if matches!(r, Synced::Logged) {
                    logged += 1;
                }
                if rng.below(2) == 0 {
                    let (names, data) = w.files[&ino].clone();
                    frozen.push(Frozen {
                        flushes: rec.flushes(),
                        ino,
                        names,
                        data,
                    });
                    w.frozen.insert(ino);
                }
            }
            8 => {
                let r = w
                    .log
                    .fsync(&mut w.t, 5, w.dir_ino[dir], false)
                    .expect("directory fsync");
                if matches!(r, Synced::Logged) {
                    logged += 1;
                }
                for path in w.unlinked.remove(dir).unwrap_or_default() {
                    gone.push(Gone {
                        flushes: rec.flushes(),
                        path,
                    });
                }
            }
            _ => {
                if step % 4 == 0 {
                    w.t.commit().expect("commit");
                    let f = rec.flushes();
                    for (_, names) in std::mem::take(&mut w.unlinked) {
                        gone.extend(names.into_iter().map(|path| Gone { flushes: f, path }));
                    }
                }
            }
        }
    }
    (rec, frozen, gone, logged, setup)
}

/// A cut image as a sparse file (the openers take paths), removed on drop.
fn image_file(img: &[u8]) -> Result<ScratchFile, String> {
    ScratchFile::of_image("cut", img)
}

fn read_tree(fs: &Filesystem) -> Result<Tree, String> {
    let mut out = Tree::new();
    for d in DIRS {
        let dn = fs
            .resolve(&format!("/{d}"))
            .map_err(|e| format!("/{d}: {e}"))?;
        out.insert(d.to_string(), (dn.ino, None));
        for e in fs.readdir(dn).map_err(|e| format!("{d}: {e}"))? {
            let path = format!("{d}/{}", String::from_utf8_lossy(&e.name));
            let size = fs.stat(e.node).map_err(|e| format!("{path}: {e}"))?.size;
            let data = fs
                .read(e.node, 0, size as usize)
                .map_err(|e| format!("{path}: {e}"))?;
            out.insert(path, (e.node.ino, Some(data)));
        }
    }
    Ok(out)
}

fn kernel_tree(mnt: &std::path::Path) -> Result<Tree, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Tree::new();
    for d in DIRS {
        let dp = mnt.join(d);
        let md = std::fs::metadata(&dp).map_err(|e| format!("{d}: {e}"))?;
        out.insert(d.to_string(), (md.ino(), None));
        for e in std::fs::read_dir(&dp).map_err(|e| format!("{d}: {e}"))? {
            let e = e.map_err(|e| e.to_string())?;
            let path = format!("{d}/{}", e.file_name().to_string_lossy());
            let ino = e.metadata().map_err(|e| format!("{path}: {e}"))?.ino();
            let data = std::fs::read(e.path()).map_err(|e| format!("{path}: {e}"))?;
            out.insert(path, (ino, Some(data)));
        }
    }
    Ok(out)
}

/// What a cut after flush `n` must show: every frozen file and gone name made
/// durable by then.
/// The kernel mounts a copy of the cut `img` (replaying its log) and shows `tree`,
/// ubtrfs's replay of it; `btrfs check` is clean after the kernel's replay.
fn kernel_replay_agrees(img: &[u8], tree: &Tree) -> Result<(), String> {
    let cut = image_file(img)?;
    let k = KernelMount::try_new(&[&cut.path], "")?;
    let got = kernel_tree(&k.mnt);
    k.try_umount()?;
    let got = got?;
    if got != *tree {
        let only_k: Vec<_> = got.keys().filter(|p| !tree.contains_key(*p)).collect();
        let only_u: Vec<_> = tree.keys().filter(|p| !got.contains_key(*p)).collect();
        let differ: Vec<_> = tree
            .iter()
            .filter(|(p, v)| got.get(*p).is_some_and(|g| g != *v))
            .map(|(p, _)| p)
            .collect();
        return Err(format!(
            "the kernel's replay differs: only there {only_k:?}, only in ubtrfs's \
             {only_u:?}, different {differ:?}"
        ));
    }
    btrfs_check(&cut.path, None)
        .map(|_| ())
        .map_err(|e| format!("btrfs check after the kernel's replay: {e}"))
}

fn verify(tree: &Tree, frozen: &[Frozen], gone: &[Gone], n: usize) -> Result<(), String> {
    let mut bad = Vec::new();
    for f in frozen.iter().filter(|f| f.flushes <= n) {
        let names: BTreeSet<String> = tree
            .iter()
            .filter(|(_, (ino, data))| *ino == f.ino && data.is_some())
            .map(|(p, _)| p.clone())
            .collect();
        if names != f.names {
            bad.push(format!(
                "inode {} fsynced at flush {} with names {:?}, has {:?}",
                f.ino, f.flushes, f.names, names
            ));
            continue;
        }
        for p in &f.names {
            if tree.get(p).and_then(|(_, d)| d.as_ref()) != Some(&f.data) {
                bad.push(format!(
                    "{p}: not the contents fsynced at flush {}",
                    f.flushes
                ));
            }
        }
    }
    for g in gone.iter().filter(|g| g.flushes <= n) {
        if tree.contains_key(&g.path) {
            bad.push(format!(
                "{} came back (its removal durable at flush {})",
                g.path, g.flushes
            ));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

#[test]
fn names_survive_every_cut_as_fsynced() {
    let (rec, frozen, gone, logged, setup) = run_workload();
    let flushes = rec.flushes();
    let kernel = require_root("names_survive_every_cut_as_fsynced: the kernel replay sample");
    let mut failures = Vec::new();
    let mut sampled = 0;
    for n in 0..=flushes {
        // Before the setup's commit is durable there is nothing to look for.
        if n < setup {
            continue;
        }
        for (what, img, inside) in rec.cut_images(n, 2) {
            let r = catch_unwind(AssertUnwindSafe(|| -> Result<Option<Tree>, String> {
                let cut = image_file(&img)?;
                let path = cut.path.clone();
                let fs = Filesystem::open_replayed(&[&path], OpenOptions::default())
                    .map_err(|e| format!("does not open: {e}"))?;
                for w in fs.info.take_warnings() {
                    if w.contains("cannot be replayed") {
                        return Err(w);
                    }
                }
                let tree = read_tree(&fs)?;
                verify(&tree, &frozen, &gone, n)?;
                Ok(Some(tree))
            }));
            let tree = match r {
                Ok(Ok(Some(t))) => t,
                Ok(Ok(None)) => continue,
                Ok(Err(e)) => {
                    failures.push(format!("{what}: {e}"));
                    continue;
                }
                Err(p) => {
                    failures.push(format!("{what}: PANIC {}", panic_message(&*p)));
                    continue;
                }
            };
            if kernel && !inside && n % 7 == 3 {
                sampled += 1;
                if let Err(e) = kernel_replay_agrees(&img, &tree) {
                    failures.push(format!("{what}: kernel: {e}"));
                }
            }
        }
    }
    eprintln!(
        "log names crash: {} frozen files, {} durable removals, {logged} logged fsyncs, \
         {flushes} flush points, {sampled} kernel replays",
        frozen.len(),
        gone.len()
    );
    assert!(logged > 20, "most fsyncs are logged ({logged})");
    assert!(
        frozen.len() > 10 && gone.len() > 5,
        "the workload exercised both rules"
    );
    ubtrfs_sim::host::assert_no_failures(&failures);
}

/// A file fsynced, then unlinked in the same transaction (left an orphan, or
/// evicted as the mount does once the kernel forgets it), then another file's fsync
/// writes the log again: the replay must show the first file as fsynced or not at
/// all, never at its contents of the last commit (the mount crash test found one
/// back at 168,195 bytes after it had been fsynced at 334,141). The kernel replays
/// the same image to the same tree, and `btrfs check` is clean after it.
#[test]
fn an_unlinked_fsynced_file_never_comes_back_older() {
    let kernel = require_root("an_unlinked_fsynced_file_never_comes_back_older: the kernel replay");
    let mut failures = Vec::new();
    for evict in [false, true] {
        let rec = RecordingDevice::new(vec![0u8; DEV_BYTES], "log-unlinked-fsynced");
        let mut w = Work::mkfs(&rec, &FsConfig::default());
        let committed = write_data(168_195, 1);
        w.create("a", committed.clone());
        w.create("b", write_data(20_000, 2));
        w.t.commit().expect("commit");
        // a/n1 and b/n2, in the order they were made.
        let [x, y] = w.files.keys().copied().collect::<Vec<_>>()[..] else {
            panic!("two files");
        };
        let more = write_data(165_946, 3);
        w.t.write(5, x, committed.len() as u64, &more, ts(2))
            .expect("append");
        let r = w.log.fsync(&mut w.t, 5, x, false).expect("fsync");
        assert!(matches!(r, Synced::Logged), "the fsync of a/n1 is logged");
        let durable = rec.flushes();
        w.t.unlink(5, w.dir_ino["a"], b"n1", ts(3)).expect("unlink");
        if evict {
            for (root, ino) in w.t.take_orphans() {
                w.t.evict_orphan(root, ino).expect("evict");
            }
        }
        w.t.write(5, y, 20_000, &write_data(9_000, 4), ts(4))
            .expect("append");
        let r = w.log.fsync(&mut w.t, 5, y, false).expect("fsync");
        assert!(matches!(r, Synced::Logged), "the fsync of b/n2 is logged");
        let mut fsynced = committed.clone();
        fsynced.extend_from_slice(&more);
        for n in durable..=rec.flushes() {
            let what = format!("evicted {evict}, cut after flush {n}");
            let img = rec.image_after_flush(n);
            let r = (|| -> Result<(), String> {
                let cut = image_file(&img)?;
                let fs = Filesystem::open_replayed(&[&cut.path], OpenOptions::default())
                    .map_err(|e| format!("does not open: {e}"))?;
                let tree = read_tree(&fs)?;
                match tree.get("a/n1").and_then(|(_, d)| d.as_ref()) {
                    None => {}
                    Some(d) if *d == fsynced => {}
                    Some(d) => return Err(format!("a/n1 came back with {} bytes", d.len())),
                }
                if !kernel {
                    return Ok(());
                }
                kernel_replay_agrees(&img, &tree)
            })();
            if let Err(e) = r {
                failures.push(format!("{what}: {e}"));
            }
        }
    }
    ubtrfs_sim::host::assert_no_failures(&failures);
}
