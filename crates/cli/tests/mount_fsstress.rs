//! fsstress (fstests' random operation generator: creates, writes, fsyncs, renames,
//! links, xattrs, fallocate, punch/zero/collapse/insert ranges, copy_file_range,
//! clone and dedupe ranges, truncates, mmap and direct I/O, snapshots and subvolume
//! creation and deletion, from four processes) on a read-write `ubtrfs mount`:
//! plain, with `compress=zstd`, on a 128 MiB filesystem that fills up (ENOSPC in
//! every kind of operation), and with quotas on, each once to the end with a clean
//! unmount: the kernel must then show exactly what the mount showed (and btrfs
//! check's recount of the quota groups must match the mount's). The compressed one runs
//! again and its server is killed (SIGKILL: no commit, no unmount) in the middle. What the fsyncs left in the tree log must come back the same whoever
//! replays it:
//! - the kernel (a mount),
//! - ubtrfs, by a writing command (which replays, commits, then writes),
//! - ubtrfs read-only (`ubtrfs mount -o ro` replays in memory, writes nothing):
//!
//! the three views must be equal (names, types, modes, sizes, links, owners, st_ino,
//! times, contents, xattrs; a ctime only where each replay set it to its own "now"),
//! and `btrfs check --readonly --check-data-csum` clean after both writing replays.
//!
//! fsstress is built from the fstests source snapshot by tests/fstests/run.sh
//! (`--build-only`, shared with the fstests test and cached), with libbtrfsutil for
//! its btrfs operations; FSSTRESS_FORCE_BTRFS=1 keeps them on a FUSE mount (whose
//! statfs reports FUSE's magic). The mounts use `-o ino=kernel`, so st_ino in
//! snapshots is the kernel's. Needs root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use ubtrfs_sim::golden::{compare_walks_except, report, walk_mounted, STAT_FIELDS};
use ubtrfs_sim::host::{btrfs_check, require_fuse, sh, Ubtrfs};
use ubtrfs_sim::mount::{kernel_round_trip, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// fsstress from the fstests build (built on first use).
fn fsstress() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = sh(&format!(
        "bash {} --build-only",
        repo.join("tests/fstests/run.sh").display()
    ));
    let bin = Path::new(src.trim()).join("ltp/fsstress");
    assert!(bin.is_file(), "no fsstress at {}", bin.display());
    bin
}

/// Runs fsstress with `seed` in `dir` (four processes, up to `ops` operations each),
/// with snapshots and subvolume creation and deletion if `btrfs_ops`.
fn start_fsstress(
    bin: &Path,
    dir: &Path,
    seed: u32,
    ops: u32,
    btrfs_ops: bool,
) -> std::process::Child {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut cmd = Command::new(bin);
    if btrfs_ops {
        cmd.env("FSSTRESS_FORCE_BTRFS", "1");
    }
    cmd.arg("-d")
        .arg(dir)
        .args(["-p", "4", "-n", &ops.to_string(), "-s", &seed.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fsstress")
}

/// The superblock's log_root.
fn log_root(img: &Path) -> u64 {
    UBTRFS
        .stdout(&["inspect", "dump-super", img.to_str().unwrap()])
        .lines()
        .find_map(|l| l.strip_prefix("log_root\t"))
        .and_then(|v| v.trim().parse().ok())
        .expect("log_root in dump-super")
}

/// One fsstress run: seed, mount options, filesystem bytes, operations per
/// process, btrfs operations, also cut, mkfs.btrfs arguments.
type Config = (
    u32,
    &'static str,
    u64,
    u32,
    bool,
    bool,
    &'static [&'static str],
);

/// Seconds since the epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// Whole seconds of a walk's time ("SECS.NANOS").
fn secs(v: &serde_json::Value) -> u64 {
    v.as_str()
        .and_then(|s| s.split('.').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}

/// Differences between two replays of one log, done at different times. Both set
/// the ctime of some inodes to "now" (a replayed link or unlink, as the kernel's
/// btrfs_unlink_inode and btrfs_add_link do): a ctime may differ only where each
/// side's value falls within its own replay's time span.
fn compare_replays(
    what: &str,
    want: &std::collections::BTreeMap<String, serde_json::Value>,
    want_span: (u64, u64),
    got: &std::collections::BTreeMap<String, serde_json::Value>,
    got_span: (u64, u64),
) {
    let within = |v: &serde_json::Value, (a, b): (u64, u64)| (a..=b).contains(&secs(v));
    report(compare_walks_except(
        what,
        want,
        got,
        STAT_FIELDS,
        |f, w, g| f == "ctime" && within(w, want_span) && within(g, got_span),
    ));
}

fn copy(from: &Path, to: &Path) {
    sh(&format!(
        "cp --sparse=always {} {}",
        from.display(),
        to.display()
    ));
}

#[test]
fn fsstress_then_kill_replays_alike_everywhere() {
    if !require_fuse("fsstress_then_kill_replays_alike_everywhere") {
        return;
    }
    let bin = fsstress();
    // All run to the end; the compressed one is also cut (CI's time: one cut),
    // without btrfs operations: a snapshot commits, leaving no log to replay. The
    // small one fills up: fsstress's writes are up to a few MiB each.
    // The fourth keeps quotas: their numbers after snapshots, deletions, clones and
    // dedupes must be what btrfs check recounts.
    let configs: [Config; 4] = [
        (1, "rw,ino=kernel", 2 << 30, 1000, true, false, &[]),
        (
            2,
            "rw,ino=kernel,compress=zstd",
            2 << 30,
            1000,
            false,
            true,
            &[],
        ),
        (3, "rw,ino=kernel", 128 << 20, 2000, true, false, &[]),
        (
            4,
            "rw,ino=kernel",
            1 << 30,
            1000,
            true,
            false,
            &["-O", "quota"],
        ),
    ];
    for (seed, opts, size, ops, btrfs_ops, cut, mkfs_args) in configs {
        let what = format!("seed {seed}, -o {opts}, {} MiB {mkfs_args:?}", size >> 20);
        let dir = tempfile::tempdir().unwrap();

        // To the end, then a clean unmount: the kernel shows what the mount showed.
        let img = dir.path().join("whole.img");
        mkfs_btrfs(&img, size, mkfs_args);
        let m = FuseMount::start(&UBTRFS, &[&img], &[opts]);
        let mut f = start_fsstress(&bin, &m.mnt.join("t"), seed, ops, btrfs_ops);
        assert!(f.wait().expect("fsstress").success(), "fsstress, {what}");
        let seen = m.walk_and_unmount();
        kernel_round_trip(&img, &seen, &format!("fsstress to the end, {what}"));
        if mkfs_args.contains(&"quota") {
            let report = sh(&format!(
                "btrfs check --readonly --qgroup-report {} 2>&1; echo rc=$?",
                img.display()
            ));
            assert!(
                report.ends_with("rc=0\n")
                    && !report.contains("are different")
                    && !report.to_lowercase().contains("inconsistent"),
                "{what}: btrfs check --qgroup-report:\n{report}"
            );
        }

        if !cut {
            continue;
        }
        // Killed in the middle: the tree log is all that holds the fsyncs since the
        // last commit.
        let img = dir.path().join("cut.img");
        // The kill must find a log: after 4 s, as soon as the superblock names one
        // (a fresh filesystem allocates chunks at first, and an fsync in a
        // transaction that made a chunk commits; on a loaded machine that can last
        // past 4 s). A commit between the look and the kill leaves none: try again.
        for attempt in 1..=3 {
            mkfs_btrfs(&img, size, &[]);
            let mut m = FuseMount::start(&UBTRFS, &[&img], &[opts]);
            let mut f = start_fsstress(&bin, &m.mnt.join("t"), seed + 100, 1_000_000, false);
            std::thread::sleep(Duration::from_secs(4));
            for _ in 0..200 {
                if log_root(&img) != 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            m.child.kill().expect("kill the server");
            let _ = m.child.wait();
            let _ = f.kill();
            let _ = f.wait();
            // The connection is gone with the server: detach the dead mountpoint.
            let _ = Command::new("umount").arg("-l").arg(&m.mnt).status();
            drop(m);
            if log_root(&img) != 0 || attempt == 3 {
                break;
            }
            eprintln!("{what}: no tree log at the kill (attempt {attempt}): again");
        }
        assert_ne!(log_root(&img), 0, "{what}: no tree log to replay");
        let by_kernel = dir.path().join("kernel.img");
        let by_ubtrfs = dir.path().join("ubtrfs.img");
        copy(&img, &by_kernel);
        copy(&img, &by_ubtrfs);

        // The kernel replays at a read-write mount (a read-only loop device is
        // refused); it is looked at read-only, so that reads leave atime alone.
        let t0 = now_secs();
        KernelMount::new(&by_kernel, "").umount();
        let kernel_span = (t0, now_secs());
        let k = KernelMount::new(&by_kernel, "ro");
        let kernel = walk_mounted(&k.mnt);
        k.umount();
        btrfs_check(&by_kernel, None)
            .unwrap_or_else(|e| panic!("{what}: after the kernel's replay: {e}"));

        // Read-only, in memory: the image is not written.
        let before = std::fs::read(&img).expect("read image");
        let t0 = now_secs();
        let ro = FuseMount::start(&UBTRFS, &[&img], &["ro,ino=kernel"]);
        let ro_span = (t0, now_secs());
        let in_memory = ro.walk_and_unmount();
        assert!(
            std::fs::read(&img).expect("read image") == before,
            "{what}: the read-only mount wrote to the image"
        );
        compare_replays(
            &format!("{what}: ubtrfs -o ro (replayed in memory) vs the kernel's replay"),
            &kernel,
            kernel_span,
            &in_memory,
            ro_span,
        );

        // A writing command replays first (the label changes nothing in the trees).
        let t0 = now_secs();
        UBTRFS.stdout(&["filesystem", "label", by_ubtrfs.to_str().unwrap(), "x"]);
        let ubtrfs_span = (t0, now_secs());
        assert_eq!(log_root(&by_ubtrfs), 0, "{what}: ubtrfs left the log");
        btrfs_check(&by_ubtrfs, None)
            .unwrap_or_else(|e| panic!("{what}: after ubtrfs's replay: {e}"));
        let k = KernelMount::new(&by_ubtrfs, "ro");
        let replayed = walk_mounted(&k.mnt);
        k.umount();
        compare_replays(
            &format!("{what}: ubtrfs's replay vs the kernel's"),
            &kernel,
            kernel_span,
            &replayed,
            ubtrfs_span,
        );
    }
}
