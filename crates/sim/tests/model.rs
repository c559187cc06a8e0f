//! Differential test of the write engine against the model filesystem
//! (`ubtrfs_sim::model`): random operation sequences, checked after every operation
//! (the touched paths, through the uncommitted state), and in full after every commit,
//! through the handle and through a fresh open of a copy of the device. After a sixth
//! of the operations, a random file or directory is fsynced through the tree log and
//! a power cut is simulated: a copy of the device, replayed by a fresh handle, must
//! hold the fsynced inode exactly as the model has it (`check_fsync_cut`). The final
//! image of every tenth seed also goes through `btrfs check` (and a quarter of its
//! fsync cuts, replayed), and, as root, the kernel replays its first logged cut: its
//! mount must show the same tree as ubtrfs's replay.
//!
//! Subvolumes: one op in twenty creates, snapshots or deletes one (or changes
//! something in a read-only snapshot, which must fail with EROFS); the model copies
//! for a snapshot. Right after a snapshot, `subvolume du`'s recount must give it no
//! data of its own and its source's referenced data; every deletion must free
//! exactly the data bytes the recount predicted for it.
//!
//! Environment:
//! * `UBTRFS_MODEL_SEEDS=N`: run N seeds (default 1000; more for a long run), from
//!   `UBTRFS_MODEL_FIRST_SEED` (default 0);
//! * `UBTRFS_MODEL_PROGRESS=1`: print each seed as it starts (to find one that hangs
//!   or runs out of memory);
//! * `UBTRFS_MODEL_OPS=M`: operations per seed (default 60);
//! * `UBTRFS_MODEL_SEED=n`: run exactly seed n (what a failure asks for);
//! * `UBTRFS_MODEL_BTRFS_CHECK=K`: btrfs check the final image of seeds divisible by K
//!   (default 10; 1 = every seed, 0 = never); skipped without `btrfs`, except in CI
//!   (`CI` or `UBTRFS_CI` set), where that is a failure;
//! * `UBTRFS_MODEL_THREADS=T`: worker threads (default: available parallelism);
//! * `UBTRFS_MODEL_MAX_FAILURES=F`: stop after F failing seeds (default 3);
//! * `UBTRFS_MODEL_MINIMIZE=1`: shrink each failing seed's operations to a minimal
//!   sequence failing the same way, and print it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use ubtrfs_core::{Device, Synced};
use ubtrfs_sim::host::{env_u64, have_btrfs, panic_message, require_root, skip};
use ubtrfs_sim::model::{
    check_fsync_cut, failure_signature, minimize, run_seed_recorded, FsConfig, Harness, Op,
    RunConfig, RunStats, SparseMem,
};

#[derive(Default)]
struct Totals {
    seeds: u64,
    ops: u64,
    commits: u64,
    reopens: u64,
    balances: u64,
    fsyncs: u64,
    fsyncs_logged: u64,
    kernel_replays: u64,
    expected_errors: u64,
    unsupported: u64,
    snapshots: u64,
    subvols_created: u64,
    deletes_checked: u64,
    btrfs_checks: u64,
    max_level: u8,
    max_nodes: usize,
}

impl Totals {
    fn add(&mut self, st: &RunStats, checked: bool) {
        self.seeds += 1;
        self.ops += st.ops;
        self.commits += st.commits;
        self.reopens += st.reopens;
        self.balances += st.balances;
        self.fsyncs += st.fsyncs;
        self.fsyncs_logged += st.fsyncs_logged;
        self.kernel_replays += st.kernel_replays;
        self.expected_errors += st.expected_errors;
        self.unsupported += st.unsupported;
        self.snapshots += st.snapshots;
        self.subvols_created += st.subvols_created;
        self.deletes_checked += st.deletes_checked;
        self.btrfs_checks += u64::from(checked);
        self.max_level = self.max_level.max(st.max_fs_tree_level);
        self.max_nodes = self.max_nodes.max(st.max_nodes);
    }
}

#[test]
fn model_random_workloads() {
    let mut cfg = RunConfig::default();
    let default_ops = cfg.ops;
    if let Some(n) = env_u64("UBTRFS_MODEL_OPS") {
        cfg.ops = n as usize;
    }
    let seeds: Vec<u64> = match env_u64("UBTRFS_MODEL_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env_u64("UBTRFS_MODEL_FIRST_SEED").unwrap_or(0);
            (first..first + env_u64("UBTRFS_MODEL_SEEDS").unwrap_or(1000)).collect()
        }
    };
    let threads = env_u64("UBTRFS_MODEL_THREADS")
        .map(|n| n as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .clamp(1, 64);
    let mut check_every = env_u64("UBTRFS_MODEL_BTRFS_CHECK").unwrap_or(10);
    if check_every != 0 && !have_btrfs() {
        skip(
            "model: btrfs check of the final images",
            "btrfs (btrfs-progs) is not installed",
        );
        check_every = 0;
    }
    let max_failures = env_u64("UBTRFS_MODEL_MAX_FAILURES").unwrap_or(3) as usize;
    let ops_hint = if cfg.ops != default_ops {
        format!(" UBTRFS_MODEL_OPS={}", cfg.ops)
    } else {
        String::new()
    };

    let progress = std::env::var_os("UBTRFS_MODEL_PROGRESS").is_some();
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { break };
                // Stop early once a few seeds failed: one is enough to debug.
                if failures.lock().unwrap().len() >= max_failures {
                    break;
                }
                let checked = check_every != 0 && seed % check_every == 0;
                let cfg = RunConfig {
                    btrfs_check: checked,
                    // Those seeds also have the kernel replay a logged cut (root).
                    kernel_replay: checked && nix::unistd::geteuid().is_root(),
                    ..cfg.clone()
                };
                if progress {
                    eprintln!("seed {seed} starts");
                }
                let res = catch_unwind(AssertUnwindSafe(|| run_seed_recorded(seed, &cfg)));
                let err = match res {
                    Ok(Ok(st)) => {
                        totals.lock().unwrap().add(&st, cfg.btrfs_check);
                        continue;
                    }
                    Ok(Err((e, steps))) => {
                        if std::env::var_os("UBTRFS_MODEL_MINIMIZE").is_some() {
                            let fsc = FsConfig::for_seed(seed);
                            let sig = failure_signature(&e);
                            let min = minimize(&fsc, &steps, cfg.btrfs_check, &sig);
                            let list: String = min.iter().map(|s| format!("  {s:?}\n")).collect();
                            eprintln!("seed {seed}: minimal sequence ({} of {} steps) failing with `{sig}` on {fsc:?}:\n{list}", min.len(), steps.len());
                        }
                        e
                    }
                    Err(p) => format!("panic: {}", panic_message(&*p)),
                };
                eprintln!("seed {seed} FAILED: {err}\nreproduce with UBTRFS_MODEL_SEED={seed}{ops_hint}\n");
                failures.lock().unwrap().push((seed, err));
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let t = totals.into_inner().unwrap();
    eprintln!(
        "model: {} of {} seeds x {} ops passed in {:.1?} ({threads} threads): {} ops, {} commits, {} balances, {} fsyncs \
         with a power cut after each ({} through the tree log, {} replayed by the kernel too), {} reopens for writing, {} expected errors matched, {} fallocate calls refused as unsupported, \
         {} snapshots and {} subvolumes made, {} subvolume deletions freeing what subvolume du predicted, {} final images passed \
         btrfs check; deepest FS tree: level {}, most files: {}",
        t.seeds,
        seeds.len(),
        cfg.ops,
        start.elapsed(),
        t.ops,
        t.commits,
        t.balances,
        t.fsyncs,
        t.fsyncs_logged,
        t.kernel_replays,
        t.reopens,
        t.expected_errors,
        t.unsupported,
        t.snapshots,
        t.subvols_created,
        t.deletes_checked,
        t.btrfs_checks,
        t.max_level,
        t.max_nodes
    );
    if !failures.is_empty() {
        let mut kinds: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
        for (seed, e) in &failures {
            kinds.entry(failure_signature(e)).or_default().push(*seed);
        }
        for (sig, seeds) in &kinds {
            eprintln!(
                "model: {} seed(s) fail with `{sig}`: {seeds:?}",
                seeds.len()
            );
        }
        let list: Vec<String> = failures
            .iter()
            .map(|(s, e)| format!("seed {s}: {}", e.lines().next().unwrap_or("")))
            .collect();
        panic!(
            "{} seed(s) failed:\n{}\nreproduce with UBTRFS_MODEL_SEED={}{ops_hint}",
            failures.len(),
            list.join("\n"),
            failures[0].0
        );
    }
}

/// A fresh default filesystem on a memory device for one fsync case, and whether
/// the kernel (root) replays its cuts and btrfs check runs on them.
fn fsync_case(test: &str) -> (std::sync::Arc<SparseMem>, Harness, bool, bool) {
    let kernel = require_root(&format!("{test}: the kernel's replay"));
    let btrfs = have_btrfs();
    let fsc = FsConfig::default();
    let mem = SparseMem::new(fsc.dev_size(0), test);
    let h = Harness::mkfs(mem.clone() as std::sync::Arc<dyn Device>, &fsc).expect("mkfs");
    (mem, h, kernel, btrfs)
}

/// The model's create of `dir/name` with `mode`.
fn create_op(dir: &[u8], name: &[u8], mode: u32) -> Op {
    Op::Create {
        dir: dir.to_vec(),
        name: name.to_vec(),
        mode,
        rdev: 0,
    }
}

/// A file fsynced after its committed parent directory moved, then a new file made in
/// the moved directory and fsynced: both logged, not committed (the kernel does not
/// commit either), and the log moves the directory: a power cut after each fsync
/// replays (ubtrfs, and as root the kernel, which must show the same tree) with the
/// files at the paths they had when fsynced; `btrfs check` is clean.
#[test]
fn fsync_after_the_parent_directory_moved() {
    let (mem, mut h, kernel, btrfs) = fsync_case("fsync_after_the_parent_directory_moved");
    let make = create_op;
    let setup = [
        make(b"", b"a", 0o40755),
        make(b"", b"b", 0o40755),
        make(b"a", b"d", 0o40755),
        make(b"a/d", b"f", 0o100644),
        Op::Write {
            path: b"a/d/f".to_vec(),
            offset: 0,
            len: 5000,
            seed: 1,
        },
    ];
    for op in &setup {
        h.step(op).expect("setup");
    }
    h.commit().expect("commit");
    h.step(&Op::Rename {
        odir: b"a".to_vec(),
        oname: b"d".to_vec(),
        ndir: b"b".to_vec(),
        nname: b"d".to_vec(),
        noreplace: false,
    })
    .expect("rename");
    h.step(&Op::Write {
        path: b"b/d/f".to_vec(),
        offset: 4096,
        len: 20_000,
        seed: 2,
    })
    .expect("write");
    let synced = h.fsync(b"b/d/f", false).expect("fsync");
    assert_eq!(synced, Synced::Logged);
    check_fsync_cut(&mem, &h.model, &h.tree_of, b"b/d/f", synced, btrfs, kernel)
        .expect("cut after fsync");
    h.step(&make(b"b/d", b"new", 0o100644)).expect("create");
    let synced = h.fsync(b"b/d/new", false).expect("fsync of the new file");
    assert_eq!(synced, Synced::Logged);
    check_fsync_cut(
        &mem, &h.model, &h.tree_of, b"b/d/new", synced, btrfs, kernel,
    )
    .expect("cut after the second fsync");
}

/// Model seed 938 at 87 operations, reduced: a directory `l/b` moved out to `y/y`,
/// then its old parent `l` moved below it (`y/y/dir`), then a file of `l` fsynced.
/// The fsync logs `l` and `b` with their new names; `b`'s lost name in `l` is only
/// removed at replay if `l` is logged whole, but `l` had been reached first as a
/// renamed ancestor (names only), and the second, whole logging was skipped: the
/// replay kept `l/b`, a directory cycle (`l` -> `b` -> `l`) whose walk never ended.
#[test]
fn fsync_after_a_directory_moved_below_its_old_child() {
    let (mem, mut h, kernel, btrfs) =
        fsync_case("fsync_after_a_directory_moved_below_its_old_child");
    let make = create_op;
    let rename = |odir: &[u8], oname: &[u8], ndir: &[u8], nname: &[u8]| Op::Rename {
        odir: odir.to_vec(),
        oname: oname.to_vec(),
        ndir: ndir.to_vec(),
        nname: nname.to_vec(),
        noreplace: false,
    };
    for op in [
        make(b"", b"l", 0o40755),
        make(b"l", b"b", 0o40755),
        make(b"l", b"zz", 0o100644),
        make(b"", b"y", 0o40755),
    ] {
        h.step(&op).expect("setup");
    }
    h.commit().expect("commit");
    h.step(&rename(b"l", b"b", b"y", b"y")).expect("rename l/b");
    h.step(&rename(b"", b"l", b"y/y", b"dir"))
        .expect("rename l below it");
    h.step(&Op::Write {
        path: b"y/y/dir/zz".to_vec(),
        offset: 0,
        len: 3000,
        seed: 3,
    })
    .expect("write");
    let synced = h.fsync(b"y/y/dir/zz", false).expect("fsync");
    assert_eq!(synced, Synced::Logged);
    check_fsync_cut(
        &mem,
        &h.model,
        &h.tree_of,
        b"y/y/dir/zz",
        synced,
        btrfs,
        kernel,
    )
    .expect("cut after fsync");
}

/// Model seed 3153 at 100 operations, reduced: a committed directory holding a
/// snapshot's entry is exchanged with a new file, and the file (now at the
/// directory's old name) fsynced. The replay once tried to remove the snapshot's
/// entry, which is never in a log, and failed; it now keeps it. Both replays (ubtrfs,
/// and as root the kernel: the same tree) show the file, `btrfs check` is clean.
#[test]
fn fsync_after_exchanging_a_directory_holding_a_snapshot() {
    let (mem, mut h, kernel, btrfs) =
        fsync_case("fsync_after_exchanging_a_directory_holding_a_snapshot");
    let make = create_op;
    h.step(&make(b"", b"x.txt", 0o40755)).expect("mkdir");
    h.step(&Op::Snapshot {
        src: Vec::new(),
        dir: b"x.txt".to_vec(),
        name: b"y".to_vec(),
        readonly: false,
    })
    .expect("snapshot");
    h.commit().expect("commit");
    h.step(&make(b"", b"a", 0o40644)).expect("mkdir a");
    h.step(&make(b"a", b"laomblew", 0o100755)).expect("create");
    h.step(&Op::RenameExchange {
        adir: Vec::new(),
        aname: b"x.txt".to_vec(),
        bdir: b"a".to_vec(),
        bname: b"laomblew".to_vec(),
    })
    .expect("exchange");
    let synced = h.fsync(b"x.txt", false).expect("fsync");
    check_fsync_cut(&mem, &h.model, &h.tree_of, b"x.txt", synced, btrfs, kernel)
        .expect("cut after fsync");
}

/// The same without a snapshot: a committed directory with a file in it is
/// exchanged with a new file, which is fsynced. The replay gives the file the
/// directory's old name and so unlinks the directory's: the log must say where the
/// directory is now, or the replay drops it with its committed contents. Both
/// replays (ubtrfs, and as root the kernel: the same tree) keep it at its new name.
#[test]
fn fsync_of_a_file_that_took_a_moved_directory_s_name() {
    let (mem, mut h, kernel, btrfs) =
        fsync_case("fsync_of_a_file_that_took_a_moved_directory_s_name");
    let make = create_op;
    h.step(&make(b"", b"x.txt", 0o40755)).expect("mkdir");
    h.step(&make(b"x.txt", b"kept", 0o100644)).expect("create");
    h.step(&Op::Write {
        path: b"x.txt/kept".to_vec(),
        offset: 0,
        len: 9000,
        seed: 3,
    })
    .expect("write");
    h.commit().expect("commit");
    h.step(&make(b"", b"a", 0o40755)).expect("mkdir a");
    h.step(&make(b"a", b"new", 0o100644)).expect("create");
    h.step(&Op::RenameExchange {
        adir: Vec::new(),
        aname: b"x.txt".to_vec(),
        bdir: b"a".to_vec(),
        bname: b"new".to_vec(),
    })
    .expect("exchange");
    let synced = h.fsync(b"x.txt", false).expect("fsync");
    assert_eq!(synced, Synced::Logged);
    check_fsync_cut(&mem, &h.model, &h.tree_of, b"x.txt", synced, btrfs, kernel)
        .expect("cut after fsync: the file");
    check_fsync_cut(&mem, &h.model, &h.tree_of, b"a/new", synced, false, false)
        .expect("cut after fsync: the moved directory");
    check_fsync_cut(
        &mem,
        &h.model,
        &h.tree_of,
        b"a/new/kept",
        synced,
        false,
        false,
    )
    .expect("cut after fsync: the moved directory's file");
}
