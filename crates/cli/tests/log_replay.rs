//! Replay of tree logs the kernel wrote, against the kernel's own replay, in the same
//! run. For each scenario the kernel makes a crash image: mkfs.btrfs, a loop mount with
//! `commit=300` (no transaction commit during the test), a committed setup (`sync`),
//! then changes and fsyncs; the image file is copied right after the last fsync,
//! while still mounted (the fsync wrote the log and the superblock through the loop
//! device into the file's page cache, which `cp` reads). The copy's superblock must
//! have a log_root. Then, on copies of it:
//! - the kernel mounts one (replaying the log): the oracle tree;
//! - `ubtrfs mount -o ro` shows the same tree, and `ubtrfs ls -R` works, and the
//!   image's bytes do not change;
//! - `ubtrfs mount` (read-write) replays into the image; after unmounting, `btrfs
//!   check --readonly --check-data-csum` is clean, log_root is 0, and the kernel shows
//!   the same tree again;
//! - `ubtrfs rescue zero-log` and `btrfs rescue zero-log` give the same superblock;
//! - a log item replay does not know is refused by name, and nothing is written.
//!
//! Times: where a replay unlinks a name (a rename's old name, a removed entry), the
//! kernel sets the inode's ctime to the time of the replay (not the directory's:
//! btrfs_unlink_inode leaves those while a log is recovered), and so does ubtrfs:
//! those may differ, but both must be later than the crash. Every other field,
//! times included, must be equal.
//!
//! Needs root (loop devices, /dev/fuse); skipped with a line outside CI.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use ubtrfs_sim::golden::{compare_walks_except, report, walk_mounted, STAT_FIELDS};
use ubtrfs_sim::host::{bash_in, btrfs_check, require_fuse, serial, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// (name, committed setup, changes with fsyncs after the commit).
const SCENARIOS: &[(&str, &str, &str)] = &[
    (
        "new-file",
        "mkdir d",
        "xfs_io -f -c 'pwrite -S 0x61 0 100k' -c 'pwrite -S 0x62 200k 5000' -c fsync d/new",
    ),
    (
        "append",
        "head -c 40960 /dev/urandom > app; echo small > inl",
        "xfs_io -c 'pwrite -S 0x62 40k 20k' -c fsync app; \
         xfs_io -c 'pwrite -S 0x63 6 30' -c fsync inl",
    ),
    (
        "overwrite",
        "head -c 262144 /dev/urandom > f",
        // The first fsync after the commit may commit again (it did on 6.18): the
        // second is logged.
        "xfs_io -c 'pwrite -S 0x66 0 4k' -c fsync f; \
         xfs_io -c 'pwrite -S 0x64 8k 12k' -c 'pwrite -S 0x65 100k 4k' -c fsync f",
    ),
    (
        "rename",
        "mkdir a b; echo x > a/f; echo y > g",
        "mv a/f b/f2; xfs_io -c fsync b/f2; mv g g2; xfs_io -c fsync g2",
    ),
    (
        "dir-entries",
        "mkdir d; touch d/a d/b; mkdir d/sub",
        "touch d/c; rm d/a; rmdir d/sub; mkdir d/newdir; xfs_io -c fsync d",
    ),
    (
        "hard-link",
        "mkdir d e; echo y > hl; echo z > two; ln two e/two2",
        "ln hl d/hl2; xfs_io -c fsync hl; rm e/two2; xfs_io -c fsync two",
    ),
    (
        "new-dir-file",
        "mkdir top",
        "mkdir -p top/n1/n2; xfs_io -f -c 'pwrite -S 0x67 0 70000' -c fsync top/n1/n2/f",
    ),
    (
        "prealloc-hole",
        "head -c 131072 /dev/urandom > p",
        "xfs_io -c 'pwrite -S 0x68 0 4k' -c fsync p; \
         xfs_io -c 'falloc 200k 64k' -c 'fpunch 16k 8k' -c 'falloc -k 300k 40k' -c fsync p",
    ),
    (
        "subvolume",
        "btrfs -q subvolume create sv; echo a > sv/a; echo top > t",
        "xfs_io -f -c 'pwrite -S 0x69 0 12k' -c fsync sv/b; \
         xfs_io -c 'pwrite -S 0x6a 0 3' -c fsync t",
    ),
    (
        "rename-over",
        "mkdir d; echo old > d/victim; echo new > d/src; echo keep > k; ln k d/k2",
        "mv d/src d/victim; xfs_io -c fsync d/victim; rm d/k2; xfs_io -c fsync k",
    ),
    (
        "truncate-down-up",
        "head -c 300000 /dev/urandom > f",
        "xfs_io -c 'pwrite -S 0x6b 0 4k' -c fsync f; \
         truncate -s 10000 f; truncate -s 500000 f; xfs_io -c fsync f",
    ),
    (
        "many-entries",
        "mkdir big; for i in $(seq 1 300); do echo $i > big/old$i; done",
        "for i in $(seq 1 3000); do : > big/f$i; done; rm big/old7 big/old200; \
         ln -s target big/sym; mkfifo big/fifo; xfs_io -c fsync big",
    ),
    (
        // A committed directory of many leaves where a few names change, and a run
        // of 400 goes (whole leaves emptied): only changed ranges need logging.
        "dir-partial",
        "mkdir big; for i in $(seq 1 3000); do : > big/f$i; done",
        "rm big/f10 big/f2990 big/f1{000..399}; : > big/new; mv big/f20 big/f20b; \
         xfs_io -c fsync big",
    ),
    (
        "compressed-inline",
        "touch c; btrfs property set c compression zstd; mkdir p; mv p q",
        "yes abcdefgh | head -c 300000 > c; xfs_io -c fsync c; \
         echo tiny > q/tiny; xfs_io -c fsync q/tiny",
    ),
    (
        // A file fsynced after its committed parent directory moved: the kernel
        // logs only the file (its parent stays at the old path after its replay);
        // ubtrfs logs the moved directory too, so both replays of ubtrfs's log
        // show the fsynced paths.
        "renamed-parent",
        "mkdir -p a/d b; echo x > a/d/f",
        "mv a/d b/d; xfs_io -c 'pwrite -S 0x6c 0 8k' -c fsync b/d/f; \
         echo n > b/d/new; xfs_io -c fsync b/d/new",
    ),
    (
        "xattr-truncate",
        "head -c 100000 /dev/urandom > t; setfattr -n user.a -v 1 t; setfattr -n user.b -v 2 t",
        "setfattr -x user.a t; setfattr -n user.c -v 3 t; truncate -s 5000 t; xfs_io -c fsync t",
    ),
];

fn dump_super(img: &Path) -> String {
    let o = Command::new("btrfs")
        .args(["inspect-internal", "dump-super", "-f"])
        .arg(img)
        .output()
        .expect("btrfs inspect-internal dump-super");
    assert!(o.status.success(), "dump-super {}", img.display());
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn super_field(img: &Path, field: &str) -> u64 {
    dump_super(img)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(field)).then(|| w.next().and_then(|v| v.parse().ok()))?
        })
        .unwrap_or_else(|| panic!("{field} not in dump-super of {}", img.display()))
}

fn copy(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(st.success(), "cp {} {}", from.display(), to.display());
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    Command::new("cmp")
        .arg("-s")
        .arg(a)
        .arg(b)
        .status()
        .expect("cmp")
        .success()
}

/// The kernel's crash image of a scenario, and the time it was taken. The kernel
/// may answer an fsync with a full commit (a background commit under load, or its
/// own fallbacks), leaving no log: the scenario is then run again, up to 3 times.
fn crash_image(dir: &Path, name: &str, setup: &str, changes: &str) -> (PathBuf, u64) {
    for attempt in 1..=3 {
        let (crash, t) = crash_image_once(dir, name, setup, changes);
        if super_field(&crash, "log_root") != 0 {
            return (crash, t);
        }
        eprintln!("{name}: attempt {attempt}: the kernel committed instead of logging; again");
    }
    panic!("{name}: the crash image has no tree log in 3 attempts (the kernel committed)");
}

fn crash_image_once(dir: &Path, name: &str, setup: &str, changes: &str) -> (PathBuf, u64) {
    let img = dir.join(format!("{name}.live.img"));
    let crash = dir.join(format!("{name}.crash.img"));
    mkfs_btrfs(&img, 1 << 30, &[]);
    let k = KernelMount::new(&img, "commit=300");
    let script = format!(
        "set -eu\n{setup}\nsync\n{changes}\ncp --sparse=always {} {}\n",
        ubtrfs_sim::host::shell_quote(&img),
        ubtrfs_sim::host::shell_quote(&crash)
    );
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let (out, err) = bash_in(&k.mnt, &script);
    assert!(
        crash.exists() && err.trim().is_empty(),
        "{name}: workload failed: {out}{err}"
    );
    k.umount();
    let _ = std::fs::remove_file(&img);
    (crash, t)
}

fn secs(v: &serde_json::Value) -> u64 {
    v.as_str()
        .and_then(|s| s.split('.').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Differences between the kernel's replayed tree and ubtrfs's (see the module
/// comment for the replay-time exception of ctime/mtime).
fn compare(
    what: &str,
    want: &BTreeMap<String, serde_json::Value>,
    got: &BTreeMap<String, serde_json::Value>,
    crash_time: u64,
) -> Vec<String> {
    compare_walks_except(what, want, got, STAT_FIELDS, |f, w, g| {
        f == "ctime" && secs(w) >= crash_time && secs(g) >= crash_time
    })
}

/// The kernel's view (`noatime`: the walk reads every file, which must not change
/// what it compares).
fn kernel_walk(img: &Path) -> BTreeMap<String, serde_json::Value> {
    let k = KernelMount::new(img, "noatime");
    let w = walk_mounted(&k.mnt);
    k.umount();
    w
}

#[test]
fn kernel_logs_replay_like_the_kernel() {
    if !require_fuse("kernel_logs_replay_like_the_kernel") {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut diffs = Vec::new();
    let only = std::env::var("UBTRFS_LOG_SCENARIO").ok();
    for (name, setup, changes) in SCENARIOS {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        let (crash, t) = crash_image(dir.path(), name, setup, changes);
        let kimg = dir.path().join(format!("{name}.kernel.img"));
        copy(&crash, &kimg);
        let want = kernel_walk(&kimg);
        let _ = std::fs::remove_file(&kimg);

        // (a) Read-only: the replayed state, and the image unchanged. (`ino=kernel`:
        // the btrfs inode numbers in every subvolume, as the kernel's st_ino.)
        let ro = dir.path().join(format!("{name}.ro.img"));
        copy(&crash, &ro);
        let ls = UBTRFS.stdout(&["ls".as_ref(), "-R".as_ref(), ro.as_os_str()]);
        assert!(!ls.is_empty(), "{name}: ls -R printed nothing");
        let mut m = FuseMount::start(&UBTRFS, &[&ro], &["ro,ino=kernel"]);
        let got = walk_mounted(&m.mnt);
        let st = m.unmount();
        assert!(st.success(), "{name}: ro mount exited {st}: {}", m.log());
        diffs.extend(compare(&format!("{name} ro mount"), &want, &got, t));
        assert!(
            same_bytes(&crash, &ro),
            "{name}: reading the image with a log changed it"
        );
        let _ = std::fs::remove_file(&ro);

        // (a') `-o ro,rescue=nologreplay` (and its old name norecovery): the last
        // commit without the log, as the kernel shows it with the same option.
        let nolog = dir.path().join(format!("{name}.nolog.img"));
        copy(&crash, &nolog);
        let k = KernelMount::new(&nolog, "ro,rescue=nologreplay");
        let want_nolog = walk_mounted(&k.mnt);
        k.umount();
        for opt in [
            "ro,rescue=nologreplay,ino=kernel",
            "ro,norecovery,ino=kernel",
        ] {
            let mut m = FuseMount::start(&UBTRFS, &[&nolog], &[opt]);
            let got = walk_mounted(&m.mnt);
            let st = m.unmount();
            assert!(st.success(), "{name}: {opt} mount exited {st}: {}", m.log());
            diffs.extend(compare(&format!("{name} {opt}"), &want_nolog, &got, t));
        }
        assert!(
            same_bytes(&crash, &nolog),
            "{name}: a nologreplay mount changed the image"
        );
        let _ = std::fs::remove_file(&nolog);

        // (b) Read-write: replayed into the image.
        let rw = dir.path().join(format!("{name}.rw.img"));
        copy(&crash, &rw);
        // noatime, as the kernel's walks: the walk reads every file.
        let mut m = FuseMount::start(&UBTRFS, &[&rw], &["rw,ino=kernel,noatime"]);
        let got = walk_mounted(&m.mnt);
        let st = m.unmount();
        assert!(st.success(), "{name}: rw mount exited {st}: {}", m.log());
        diffs.extend(compare(&format!("{name} rw mount"), &want, &got, t));
        if let Err(e) = btrfs_check(&rw, None) {
            diffs.push(format!("{name}: btrfs check after the rw mount: {e}"));
        }
        assert_eq!(
            super_field(&rw, "log_root"),
            0,
            "{name}: log_root after replay"
        );
        let after = kernel_walk(&rw);
        diffs.extend(compare(
            &format!("{name} kernel after rw"),
            &want,
            &after,
            t,
        ));
        let _ = std::fs::remove_file(&rw);
        let _ = std::fs::remove_file(&crash);
    }
    report(diffs);
}

#[test]
fn a_writing_command_replays_first() {
    if !require_fuse("a_writing_command_replays_first") {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (crash, t) = crash_image(
        dir.path(),
        "cmd",
        "mkdir d; echo a > d/a",
        "xfs_io -f -c 'pwrite -S 0x41 0 9000' -c fsync d/b",
    );
    let kimg = dir.path().join("cmd.kernel.img");
    copy(&crash, &kimg);
    {
        let k = KernelMount::new(&kimg, "");
        std::fs::create_dir(k.path("/new")).expect("mkdir");
        k.umount();
    }
    let want = kernel_walk(&kimg);
    UBTRFS.stdout(&["mkdir".as_ref(), crash.as_os_str(), "/new".as_ref()]);
    btrfs_check(&crash, None).unwrap_or_else(|e| panic!("btrfs check: {e}"));
    assert_eq!(super_field(&crash, "log_root"), 0);
    let got = kernel_walk(&crash);
    // /new and / were made at different times on the two sides.
    let mut diffs = compare("mkdir after replay", &want, &got, t);
    diffs.retain(|d| !(d.contains(": /new: ") || d.contains(": /: ")) || !d.contains("time"));
    report(diffs);
}

#[test]
fn rescue_zero_log_equals_btrfs_progs() {
    if !require_fuse("rescue_zero_log_equals_btrfs_progs") {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (crash, _) = crash_image(
        dir.path(),
        "zero",
        "echo a > a",
        "xfs_io -f -c 'pwrite 0 8192' -c fsync b",
    );
    let theirs = dir.path().join("theirs.img");
    copy(&crash, &theirs);
    let o = Command::new("btrfs")
        .args(["rescue", "zero-log"])
        .arg(&theirs)
        .output()
        .expect("btrfs rescue zero-log");
    assert!(o.status.success(), "btrfs rescue zero-log failed");
    let progs_said = String::from_utf8_lossy(&o.stdout).into_owned();
    let ours_said = UBTRFS.stdout(&["rescue".as_ref(), "zero-log".as_ref(), crash.as_os_str()]);
    // progs names the device as given: compare the numbers.
    let tail = |s: &str| s.split(", previous").nth(1).map(str::to_string);
    assert_eq!(tail(&ours_said), tail(&progs_said), "messages differ");
    assert_eq!(super_field(&crash, "log_root"), 0);
    // Every field of every copy equal (the checksum too: same bytes in, same out).
    for copy_nr in ["0", "1"] {
        let d = |img: &Path| {
            let o = Command::new("btrfs")
                .args(["inspect-internal", "dump-super", "-f", "-s", copy_nr])
                .arg(img)
                .output()
                .expect("dump-super");
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.starts_with("superblock:"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(d(&crash), d(&theirs), "superblock copy {copy_nr} differs");
    }
    btrfs_check(&crash, None).unwrap_or_else(|e| panic!("btrfs check after zero-log: {e}"));
}

/// Rewrites the log tree's leaf so that its last item has a key type no replay
/// knows (the same objectid, so the leaf stays sorted), checksum recomputed.
fn give_last_log_item_an_unknown_type(img: &Path, ty: u8) {
    use ubtrfs_core::format::consts::{HEADER_SIZE, ITEM_SIZE};
    use ubtrfs_core::format::items::RootItem;
    use ubtrfs_core::format::tree::{finish_block, BlockView};
    let opts = ubtrfs_core::OpenOptions {
        writable: true,
        ..Default::default()
    };
    let info = ubtrfs_core::FsInfo::open_paths(&[img], opts).expect("open");
    let ns = info.nodesize as usize;
    let mut top = vec![0u8; ns];
    info.read_logical(info.sb.log_root, &mut top, 0)
        .expect("read log root");
    let v = BlockView::new(&top);
    assert_eq!(v.level(), 0, "log root tree of one leaf");
    let r = RootItem::parse(v.item_data(0).expect("item")).expect("root item");
    assert_eq!(r.level, 0, "log tree of one leaf");
    let mut leaf = vec![0u8; ns];
    info.read_logical(r.bytenr, &mut leaf, 0)
        .expect("read log leaf");
    let n = BlockView::new(&leaf).nritems() as usize;
    leaf[HEADER_SIZE + (n - 1) * ITEM_SIZE + 8] = ty;
    finish_block(&mut leaf, info.csum_type);
    let e = info.chunk_map.lookup(r.bytenr).expect("chunk");
    for m in 0..e.num_mirrors() {
        let p = e.map(r.bytenr, m).expect("map");
        info.devices[&p.devid]
            .write_at(p.offset, &leaf)
            .expect("write");
    }
}

#[test]
fn unsupported_log_items_are_refused_by_name() {
    if !require_fuse("unsupported_log_items_are_refused_by_name") {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (crash, _) = crash_image(
        dir.path(),
        "odd",
        "mkdir d; echo a > d/a",
        "xfs_io -f -c 'pwrite -S 0x70 0 8k' -c fsync d/f",
    );
    give_last_log_item_an_unknown_type(&crash, 0xfd);
    let before = dir.path().join("before.img");
    copy(&crash, &before);
    // A writing command refuses, naming the item, and writes nothing.
    let (ok, _, err) = UBTRFS.run(&["mkdir".as_ref(), crash.as_os_str(), "/x".as_ref()]);
    assert!(
        !ok,
        "mkdir on an image whose log cannot be replayed succeeded"
    );
    assert!(
        err.contains("tree log replay: log item") && err.contains("type 253"),
        "unclear error: {err}"
    );
    assert!(same_bytes(&crash, &before), "a refused replay wrote");
    // Readers see the last commit, with a warning saying what is not shown.
    let (ok, out, err) = UBTRFS.run(&["ls".as_ref(), "-R".as_ref(), crash.as_os_str()]);
    assert!(ok, "ls failed: {err}");
    assert!(err.contains("cannot be replayed"), "no warning: {err}");
    assert!(
        out.lines().any(|l| l == "a") && !out.lines().any(|l| l == "f"),
        "not the last committed state: {out}"
    );
    assert!(same_bytes(&crash, &before), "ls wrote");
}

/// `pre` with each directory's mtime and ctime taken from `got` where those are
/// older: an fsync of a file makes its name durable, not its directory's times (a
/// directory fsynced itself has its inode logged and keeps them exactly).
fn dir_times_as_replayed(
    pre: &BTreeMap<String, serde_json::Value>,
    got: &BTreeMap<String, serde_json::Value>,
) -> BTreeMap<String, serde_json::Value> {
    let mut out = pre.clone();
    for (p, v) in out.iter_mut() {
        let Some(g) = got.get(p) else { continue };
        if v["type"] != "dir" {
            continue;
        }
        for f in ["mtime", "ctime"] {
            if g[f].as_str() < v[f].as_str() {
                v[f] = g[f].clone();
            }
        }
    }
    out
}

/// The same scenarios on a read-write `ubtrfs mount` (`commit=300`: the fsyncs write
/// the tree log, nothing commits), then SIGKILL: the image must hold a log
/// (log_root), and a copy of it replayed by the kernel's mount must show what the
/// kernel's replay of its own log shows (times aside: the two runs happen at
/// different times), `btrfs check` clean after; ubtrfs's replay (`-o ro`) shows the
/// same. Scenarios where the kernel's log would replay a state ubtrfs logs
/// differently would show up here as differences.
#[test]
fn ubtrfs_logs_replay_in_the_kernel() {
    if !require_fuse("ubtrfs_logs_replay_in_the_kernel") {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut diffs = Vec::new();
    let only = std::env::var("UBTRFS_LOG_SCENARIO").ok();
    let untimed: Vec<&str> = STAT_FIELDS
        .iter()
        .copied()
        .filter(|f| !matches!(*f, "atime" | "mtime" | "ctime" | "crtime"))
        .collect();
    let noise = dir.path().join("noise");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let bytes: Vec<u8> = (0..(1u32 << 20))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&noise, bytes).expect("noise file");
    // Where the kernel's own log says less than the fsynced state: in rename-over,
    // `rm d/k2; fsync k` does not remove d/k2 on the kernel (d was logged by the
    // first fsync, and the unlink is not logged), while ubtrfs's log of k removes it,
    // as the fsynced state has it. Both replays are checked against the fsynced state.
    // In renamed-parent the kernel's log leaves the moved directory where it was.
    let kernel_less: &[(&str, &[&str])] = &[
        ("rename-over", &["/d/k2", "/d", "/k"]),
        (
            "renamed-parent",
            &[
                "/a", "/a/d", "/a/d/f", "/a/d/new", "/b", "/b/d", "/b/d/f", "/b/d/new",
            ],
        ),
    ];
    let cmp = |what: &str,
               want: &BTreeMap<String, serde_json::Value>,
               got: &BTreeMap<String, serde_json::Value>| {
        let skip: &[&str] = kernel_less
            .iter()
            .find(|(n, _)| what.starts_with(&format!("{n}:")))
            .map_or(&[], |(_, p)| p);
        let want: BTreeMap<_, _> = want
            .iter()
            .filter(|(p, _)| !skip.contains(&p.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let got: BTreeMap<_, _> = got
            .iter()
            .filter(|(p, _)| !skip.contains(&p.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        compare_walks_except(what, &want, &got, &untimed, |_, _, _| false)
    };
    for (name, setup, changes) in SCENARIOS {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        // The same "random" bytes in both runs.
        let setup = setup.replace("/dev/urandom", &noise.display().to_string());
        let (crash, _) = crash_image(dir.path(), name, &setup, changes);
        let want = kernel_walk(&crash);
        let _ = std::fs::remove_file(&crash);

        let img = dir.path().join(format!("{name}.ubtrfs.img"));
        mkfs_btrfs(&img, 1 << 30, &[]);
        // noatime: the walk of the fsynced state must not change it.
        let mut m = FuseMount::start(&UBTRFS, &[&img], &["rw,commit=300,ino=kernel,noatime"]);
        // sync(2) never reaches a FUSE server: BTRFS_IOC_SYNC commits the setup.
        // btrfs-progs refuses a FUSE mount (statfs magic): the same through ubtrfs.
        let ubtrfs_setup = setup
            .replace(
                "btrfs property set c compression zstd",
                "setfattr -n btrfs.compression -v zstd c",
            )
            .replace(
                "btrfs -q subvolume create sv",
                &format!(
                    "{} subvolume create . /sv >/dev/null",
                    env!("CARGO_BIN_EXE_ubtrfs")
                ),
            );
        m.run(
            &format!("set -eu\n{ubtrfs_setup}\nbtrfs -q filesystem sync .\n{changes}\n"),
            name,
        );
        let pre = walk_mounted(&m.mnt);
        let crash_time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let _ = m.child.kill();
        let _ = m.child.wait();
        drop(m);
        assert_ne!(
            super_field(&img, "log_root"),
            0,
            "{name}: no tree log after SIGKILL (the fsyncs committed)"
        );
        let ro = dir.path().join(format!("{name}.ubtrfs.ro.img"));
        copy(&img, &ro);
        let mut r = FuseMount::start(&UBTRFS, &[&ro], &["ro,ino=kernel"]);
        let own = walk_mounted(&r.mnt);
        let st = r.unmount();
        assert!(st.success(), "{name}: ro mount exited {st}: {}", r.log());
        diffs.extend(cmp(
            &format!("{name}: ubtrfs's replay of its log"),
            &want,
            &own,
        ));
        diffs.extend(compare(
            &format!("{name}: ubtrfs's replay against the fsynced state"),
            &dir_times_as_replayed(&pre, &own),
            &own,
            crash_time,
        ));
        let _ = std::fs::remove_file(&ro);

        let got = kernel_walk(&img);
        diffs.extend(cmp(
            &format!("{name}: the kernel's replay of ubtrfs's log"),
            &want,
            &got,
        ));
        diffs.extend(compare(
            &format!("{name}: the kernel's replay against the fsynced state"),
            &dir_times_as_replayed(&pre, &got),
            &got,
            crash_time,
        ));
        if let Err(e) = btrfs_check(&img, None) {
            diffs.push(format!(
                "{name}: btrfs check after the kernel's replay: {e}"
            ));
        }
        let _ = std::fs::remove_file(&img);
    }
    report(diffs);
}
