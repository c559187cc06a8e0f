//! `ubtrfs mount` (FUSE) against the kernel: every golden image mounted and walked
//! with std::fs must show what the kernel showed (manifest); real programs (find,
//! du, tar, cp -a, rsync, lsattr) must print the same on both mounts; concurrent
//! readers get the kernel's data; bad images, busy mountpoints and bad options are
//! refused with one line and no mount; a corrupt data sector is EIO for that file
//! only, logged once; writes are EROFS; SIGTERM/SIGINT unmount.
//!
//! Needs root (/dev/fuse, loop devices, mount); without root the tests are skipped
//! with a line on stderr, except in CI, where that fails them
//! (`ubtrfs_sim::host::require_fuse`). Every mount is undone by a Drop guard
//! (`ubtrfs_sim::mount`), also when a test fails.
//!
//! What FUSE cannot present, and is therefore not compared: st_dev (the kernel has
//! one per subvolume; a FUSE mount has one), statx attributes (the FUSE kernel
//! module does not pass them on), fiemap (no FUSE operation), and the made-up times
//! of the ino-2 placeholder directories.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use ubtrfs_sim::golden::{
    basic_image, comparable, entries_under, hex, manifest, manifest_names, report, sha256_file,
    unpack_set, walk_mounted, STAT_FIELDS,
};
use ubtrfs_sim::host::{bash_in as sh, require_fuse, serial, Ubtrfs};
use ubtrfs_sim::mount::{
    image_arg, is_mounted, mkfs_btrfs, FuseMount, FuseUnmount, KernelMount, ScratchBtrfs,
};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// The subvolume a manifest entry is in: its own, or for an ino-2 placeholder (which
/// has none) its parent directory's.
fn subvol_of(kernel: &BTreeMap<String, Value>, path: &str) -> Option<u64> {
    let e = kernel.get(path)?;
    if e["ino"] == 2 {
        let parent = match path.rsplit_once('/') {
            Some(("", _)) | None => "/",
            Some((p, _)) => p,
        };
        return subvol_of(kernel, parent);
    }
    e["subvol"].as_u64()
}

/// st_ino the mount shows for a manifest entry: with the default ino=unique
/// (`mounted` is the subvolume at the mountpoint) the kernel's number in the mounted
/// subvolume and `(subvolume << 40) | ino` in the others (README: one st_dev);
/// with ino=kernel (None) the kernel's number.
fn want_ino(kernel: &BTreeMap<String, Value>, path: &str, mounted: Option<u64>) -> Value {
    let ino = kernel[path]["ino"].as_u64().expect("ino");
    match (mounted, subvol_of(kernel, path)) {
        (Some(m), Some(s)) if s != m => Value::from((s << 40) | ino),
        _ => Value::from(ino),
    }
}

fn compare(
    name: &str,
    kernel: &BTreeMap<String, Value>,
    ours: &BTreeMap<String, Value>,
    mounted: Option<u64>,
) -> Vec<String> {
    let mut diffs = Vec::new();
    for p in kernel.keys().filter(|p| !ours.contains_key(*p)) {
        diffs.push(format!("{name}: {p}: missing on the ubtrfs mount"));
    }
    for p in ours.keys().filter(|p| !kernel.contains_key(*p)) {
        diffs.push(format!(
            "{name}: {p}: on the ubtrfs mount, not on the kernel's"
        ));
    }
    for (p, k) in kernel {
        let Some(o) = ours.get(p) else { continue };
        for f in STAT_FIELDS {
            // The kernel invents the ino-2 placeholder's times when it looks it up.
            if !comparable(k, f) {
                continue;
            }
            let want = if *f == "ino" {
                want_ino(kernel, p, mounted)
            } else {
                k[*f].clone()
            };
            if want != o[*f] {
                diffs.push(format!(
                    "{name}: {p}: {f}: kernel {} (want {want}) ubtrfs {}",
                    k[*f], o[*f]
                ));
            }
        }
    }
    diffs
}

#[test]
fn mount_golden_matches_manifest() {
    if !require_fuse("mount_golden_matches_manifest") {
        return;
    }
    let mut diffs = Vec::new();
    let runs = manifest_names()
        .into_iter()
        .map(|n| (n, false))
        .chain([("subvols".to_string(), true)]);
    for (name, kernel_ino) in runs {
        let m = manifest(&name);
        let u = unpack_set(&m);
        let opts: &[&str] = if kernel_ino { &["ino=kernel"] } else { &[] };
        let mut fm = FuseMount::start(&UBTRFS, &u.devices, opts);
        let ours = walk_mounted(&fm.mnt);
        let all = entries_under(&m, "");
        let mounted = (!kernel_ino).then(|| subvol_of(&all, "/").expect("root subvol"));
        let name = format!("{name} {opts:?}");
        diffs.extend(compare(&name, &all, &ours, mounted));
        let st = fm.unmount();
        if !st.success() {
            diffs.push(format!("{name}: server exited with {st}: {}", fm.log()));
        }
        let log = fm.log();
        // A set left with the kernel's tree log is shown replayed, and says so.
        let log: Vec<&str> = log
            .lines()
            .filter(|l| {
                !(ubtrfs_sim::golden::has_unreplayed_log(&m) && l.contains("has a tree log"))
            })
            .filter(|l| !l.trim().is_empty())
            .collect();
        if !log.is_empty() {
            diffs.push(format!("{name}: unexpected messages: {}", log.join("\n")));
        }
    }
    report(diffs);
}

/// subvol= / subvolid= show a subvolume at the mountpoint (root inode 256) with
/// the same contents the kernel showed under its path; a plain directory is refused.
#[test]
fn mount_subvolume_options() {
    if !require_fuse("mount_subvolume_options") {
        return;
    }
    let m = manifest("subvols");
    let u = unpack_set(&m);
    let mut diffs = Vec::new();
    for (opt, prefix) in [
        ("subvol=sub1", "/sub1"),
        ("subvol=/sub1/sub2", "/sub1/sub2"),
        ("subvolid=258", "/dir/sub3"),
        ("subvolid=5", ""),
        ("subvol=snaps/top-snap", "/snaps/top-snap"),
    ] {
        let fm = FuseMount::start(&UBTRFS, &u.devices, &[opt]);
        let root = std::fs::metadata(&fm.mnt).expect("stat root");
        assert_eq!(root.ino(), 256, "{opt}: root inode");
        let want = entries_under(&m, prefix);
        let mounted = subvol_of(&want, "/");
        diffs.extend(compare(opt, &want, &walk_mounted(&fm.mnt), mounted));
    }
    report(diffs);
    let mnt = u.dir.path().join("m");
    std::fs::create_dir(&mnt).expect("mkdir");
    for bad in ["subvol=dir", "subvolid=999", "subvol=sub1,subvolid=258"] {
        let out = UBTRFS.output(&[
            OsStr::new("mount"),
            &image_arg(&u.devices),
            mnt.as_os_str(),
            "-o".as_ref(),
            bad.as_ref(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} must fail");
        assert_eq!(err.trim().lines().count(), 1, "{bad}: one line: {err}");
        assert!(!is_mounted(&mnt), "{bad}: nothing mounted");
    }
}

const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// find, du, tar, ls, lsattr, cp -a and rsync print the same on both mounts. Images
/// with nested subvolumes get unique st_ino outside the mounted subvolume (the
/// default ino=unique: with one st_dev, inode 256 everywhere would look like a
/// directory loop to find/du), so -printf %i is not compared for them. The ino-2 placeholders are left out where times show (the kernel
/// makes theirs up at lookup).
#[test]
fn mount_programs_match_kernel() {
    if !require_fuse("mount_programs_match_kernel") {
        return;
    }
    let mut diffs = Vec::new();
    for (name, subvols) in [
        ("compress-zstd", false),
        ("raid1", false),
        ("manyfiles", false),
        ("basic", true),
        ("subvols", true),
    ] {
        let m = manifest(name);
        let placeholders: Vec<String> = m["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["ino"] == 2)
            .map(|e| e["path"].as_str().expect("path").to_string())
            .collect();
        let prune: String = placeholders
            .iter()
            .map(|p| format!("-path '.{p}' -prune -o "))
            .collect();
        let tar_excl: String = placeholders
            .iter()
            .map(|p| format!(" --exclude='.{p}'"))
            .collect();
        let tar = |extra: &str| {
            format!(
                "tar c --sort=name --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f{extra} \
                 --xattrs --xattrs-include='*' --acls --anchored{tar_excl} . 2>/dev/null | sha256sum"
            )
        };
        let fmt = if subvols {
            "%y %m %n %U %G %s %b %T@ %C@ %A@ %p -> %l\\n"
        } else {
            "%y %i %m %n %U %G %s %b %T@ %C@ %A@ %p -> %l\\n"
        };
        let mut scripts = vec![
            format!("find . {prune}-printf '{fmt}'"),
            "du -s .; du --apparent-size -s .; du -a . | sha256sum".to_string(),
            tar(""),
            "lsattr -R -a . 2>&1 | sha256sum".to_string(),
        ];
        if placeholders.is_empty() {
            scripts.push("ls -lAR --time-style=full-iso . | sha256sum".to_string());
        }
        // dev,suid like the kernel's mount (lsattr opens device nodes).
        let opts: &[&str] = &["dev,suid"];
        let u = unpack_set(&m);
        let scratch = ScratchBtrfs::new();
        let kdest = scratch.path().join("kernel");
        let udest = scratch.path().join("ubtrfs");
        let kout: Vec<(String, String)> = {
            let _serial = serial();
            let k = KernelMount::try_new(&u.devices, "ro").unwrap_or_else(|e| panic!("{e}"));
            let r: Vec<(String, String)> = scripts.iter().map(|s| sh(&k.mnt, s)).collect();
            for (s, (out, _)) in scripts.iter().zip(&r) {
                // A command that printed nothing hashes to this on both sides.
                assert!(
                    !out.trim().is_empty() && !out.contains(EMPTY_SHA256),
                    "{name}: `{s}` printed nothing on the kernel mount"
                );
            }
            let ok = Command::new("cp")
                .arg("-a")
                .arg(&k.mnt)
                .arg(&kdest)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "{name}: cp -a from the kernel mount");
            r
        };
        let fm = FuseMount::start(&UBTRFS, &u.devices, opts);
        for (s, k) in scripts.iter().zip(&kout) {
            let o = sh(&fm.mnt, s);
            if &o != k {
                diffs.push(format!(
                    "{name}: `{s}` differs:\nkernel: {}{}\nubtrfs: {}{}",
                    k.0.chars().take(2000).collect::<String>(),
                    k.1,
                    o.0.chars().take(2000).collect::<String>(),
                    o.1
                ));
            }
        }
        let ok = Command::new("cp")
            .arg("-a")
            .arg(&fm.mnt)
            .arg(&udest)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            diffs.push(format!("{name}: cp -a from the ubtrfs mount failed"));
        }
        // The two copies hold the same (their own atime/ctime are new).
        let copies = tar(",delete=atime,delete=ctime");
        let (a, _) = sh(&kdest, &copies);
        let (b, _) = sh(&udest, &copies);
        if a != b {
            diffs.push(format!("{name}: cp -a copies differ (tar hash {a} vs {b})"));
        }
        if Command::new("rsync").arg("--version").output().is_ok() {
            let mut cmd = Command::new("rsync");
            cmd.args(["-aHAXc", "--dry-run", "--itemize-changes", "--delete"]);
            for p in &placeholders {
                cmd.arg(format!("--exclude={p}"));
            }
            let out = cmd
                .arg(format!("{}/", fm.mnt.display()))
                .arg(format!("{}/", kdest.display()))
                .output()
                .expect("rsync");
            let items = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || !items.trim().is_empty() {
                diffs.push(format!(
                    "{name}: rsync -aHAXc --dry-run from the ubtrfs mount to the kernel's copy: {}\n{}",
                    out.status,
                    items.chars().take(2000).collect::<String>()
                ));
            }
        } else {
            eprintln!("rsync not installed: rsync comparison skipped");
        }
    }
    report(diffs);
}

/// Deterministic data: compressible text when `text`, else noise.
fn gen(seed: u64, len: usize, text: bool) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len);
    let words: [&[u8]; 8] = [
        b"btrfs ",
        b"extent ",
        b"checksum ",
        b"subvolume ",
        b"tree ",
        b"leaf ",
        b"node\n",
        b"inode ",
    ];
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if text {
            v.extend_from_slice(words[(x % 8) as usize]);
        } else {
            v.extend_from_slice(&x.to_le_bytes());
        }
    }
    v.truncate(len);
    v
}

/// A fresh image made by the kernel: 4 plain and 4 zstd-compressed files.
fn big_files_image(dir: &Path, size: usize) -> (PathBuf, Vec<(String, String)>) {
    let img = dir.join("big.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    let _serial = serial();
    let k = KernelMount::new(&img, "compress-force=zstd");
    let mut want = Vec::new();
    for i in 0..8u64 {
        let text = i >= 4;
        let name = format!("f{i}");
        let data = gen(i + 1, size + i as usize * 4097, text);
        std::fs::write(k.path(&name), &data).expect("write");
        want.push((name, hex(&Sha256::digest(&data))));
    }
    k.umount();
    (img, want)
}

/// 8 threads hashing 8 different files at once get what the kernel wrote and
/// reads back.
#[test]
fn mount_concurrent_readers() {
    if !require_fuse("mount_concurrent_readers") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (img, want) = big_files_image(dir.path(), 48 << 20);
    {
        let _serial = serial();
        let k = KernelMount::new(&img, "ro");
        for (name, h) in &want {
            assert_eq!(&sha256_file(&k.mnt.join(name)), h, "kernel read of {name}");
        }
    }
    // Cold page cache for the image, so the reads really run concurrently.
    let _ = Command::new("sh")
        .args(["-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        .status();
    let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &[]);
    let t0 = Instant::now();
    let got: Vec<(String, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = want
            .iter()
            .map(|(name, _)| {
                let p = fm.mnt.join(name);
                let name = name.clone();
                s.spawn(move || (name, sha256_file(&p)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("reader")).collect()
    });
    eprintln!("8 concurrent readers: {:?}", t0.elapsed());
    assert_eq!(got, want);
}

/// `ubtrfs mount ARGS`: (exited 0, stderr).
fn ubtrfs_mount(args: &[&OsStr]) -> (bool, String) {
    let (ok, _, err) = UBTRFS.run(&[&[OsStr::new("mount")], args].concat());
    (ok, err)
}

/// Refusals are one line, with a non-zero exit and nothing left mounted.
#[test]
fn mount_refuses_bad_image_and_mountpoint() {
    if !require_fuse("mount_refuses_bad_image_and_mountpoint") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = basic_image(dir.path());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let check = |what: &str, r: (bool, String), needle: &str, mp: &Path| {
        assert!(!r.0, "{what}: must fail");
        assert_eq!(r.1.trim().lines().count(), 1, "{what}: one line: {}", r.1);
        assert!(r.1.contains(needle), "{what}: {:?} lacks {needle:?}", r.1);
        assert!(!is_mounted(mp) || what == "busy", "{what}: nothing mounted");
    };
    // Every superblock copy zeroed.
    let bad = dir.path().join("zeroed.img");
    std::fs::copy(&img, &bad).expect("copy");
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&bad)
            .expect("open");
        for off in [64u64 << 10, 64 << 20] {
            f.write_all_at(&[0u8; 4096], off).expect("zero");
        }
    }
    check(
        "zeroed superblock",
        ubtrfs_mount(&[bad.as_os_str(), mnt.as_os_str()]),
        "cannot open",
        &mnt,
    );
    check(
        "missing image",
        ubtrfs_mount(&[dir.path().join("nope.img").as_os_str(), mnt.as_os_str()]),
        "nope.img",
        &mnt,
    );
    let missing = dir.path().join("missing");
    check(
        "missing mountpoint",
        ubtrfs_mount(&[img.as_os_str(), missing.as_os_str()]),
        "does not exist",
        &missing,
    );
    let full = dir.path().join("full");
    std::fs::create_dir(&full).expect("mkdir");
    std::fs::write(full.join("x"), b"x").expect("write");
    check(
        "non-empty mountpoint",
        ubtrfs_mount(&[img.as_os_str(), full.as_os_str()]),
        "not empty",
        &full,
    );
    check(
        "unknown option",
        ubtrfs_mount(&[
            img.as_os_str(),
            mnt.as_os_str(),
            "-o".as_ref(),
            "nosuchoption".as_ref(),
        ]),
        "unknown mount option",
        &mnt,
    );
    // Detached mount: returns once ready; a second mount there is refused.
    let (ok, err) = ubtrfs_mount(&[img.as_os_str(), mnt.as_os_str()]);
    assert!(ok, "daemon mount: {err}");
    let guard = FuseUnmount(&mnt);
    assert!(is_mounted(&mnt));
    assert_eq!(
        std::fs::read(mnt.join("dir1/size-1")).expect("read").len(),
        1
    );
    check(
        "busy",
        ubtrfs_mount(&[img.as_os_str(), mnt.as_os_str()]),
        "already mounted",
        &mnt,
    );
    drop(guard);
    assert!(
        !is_mounted(&mnt),
        "fusermount3 -u unmounted the detached mount"
    );
}

/// A flipped byte in one file's data: EIO for that file (every time), logged once
/// with its path, and the rest of the mount keeps working.
#[test]
fn mount_checksum_error_is_eio_for_that_file_only() {
    if !require_fuse("mount_checksum_error_is_eio_for_that_file_only") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = basic_image(dir.path());
    let path = "dir1/dir2/size-1m";
    {
        use ubtrfs_core::{Filesystem, OpenOptions};
        use ubtrfs_format::items::FileExtentBody;
        let fs = Filesystem::open_paths(&[&img], OpenOptions::default()).expect("open");
        let node = fs.resolve(&format!("/{path}")).expect("resolve");
        let ext = fs.file_extents(node).expect("extents");
        let FileExtentBody::Regular {
            disk_bytenr,
            offset,
            ..
        } = ext[0].item.body
        else {
            panic!("expected a regular extent");
        };
        let l = disk_bytenr + offset + 8192;
        let phys = fs
            .info
            .chunk_map
            .lookup(l)
            .expect("chunk")
            .map(l, 0)
            .expect("map")
            .offset;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .expect("open image");
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, phys + 7).expect("read");
        b[0] ^= 0x5a;
        f.write_all_at(&b, phys + 7).expect("write");
    }
    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &[]);
    for _ in 0..3 {
        let e = std::fs::read(fm.mnt.join(path)).expect_err("corrupt file must fail");
        assert_eq!(e.raw_os_error(), Some(5), "EIO, got {e}");
    }
    // Other files are fine, and the mount still answers.
    assert_eq!(
        std::fs::read(fm.mnt.join("dir1/size-4097"))
            .expect("read")
            .len(),
        4097
    );
    assert!(
        std::fs::read_dir(fm.mnt.join("names"))
            .expect("readdir")
            .count()
            > 5
    );
    assert!(fm.unmount().success());
    let log = fm.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(path)).collect();
    assert_eq!(lines.len(), 1, "logged once: {log}");
    assert!(lines[0].contains("checksum mismatch"), "{}", lines[0]);
    assert!(lines[0].contains("offset"), "{}", lines[0]);
}

/// Writes are EROFS; SIGTERM and SIGINT unmount and end the server cleanly.
#[test]
fn mount_is_read_only_and_unmounts_on_signals() {
    if !require_fuse("mount_is_read_only_and_unmounts_on_signals") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = basic_image(dir.path());
    for sig in ["TERM", "INT"] {
        let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &[]);
        let m = fm.mnt.clone();
        let erofs = |what: &str, r: std::io::Result<()>| {
            let e = r.expect_err(what);
            assert_eq!(e.raw_os_error(), Some(30), "{what}: EROFS, got {e}");
        };
        erofs("create", File::create(m.join("new")).map(drop));
        erofs("mkdir", std::fs::create_dir(m.join("newdir")));
        erofs(
            "open for write",
            std::fs::OpenOptions::new()
                .write(true)
                .open(m.join("dir1/size-1"))
                .map(drop),
        );
        erofs("unlink", std::fs::remove_file(m.join("dir1/size-1")));
        erofs("rename", std::fs::rename(m.join("dir1"), m.join("dir9")));
        erofs(
            "setxattr",
            xattr::set(m.join("dir1/size-1"), "user.x", b"1"),
        );
        erofs("symlink", std::os::unix::fs::symlink("x", m.join("lnk")));
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(fm.child.id().to_string())
            .status()
            .expect("kill");
        assert!(st.success());
        let st = fm.wait(Duration::from_secs(20));
        assert!(st.success(), "SIG{sig}: server exit {st}: {}", fm.log());
        assert!(!is_mounted(&fm.mnt), "SIG{sig}: unmounted");
    }
}

/// Real programs that trust stat data: `git status` finds a repository written by the
/// kernel clean on the ubtrfs mount (its index records ino, times and sizes, so any
/// difference from the kernel's view would show as modified files), and
/// `sha256sum -c` verifies a list made on the kernel mount.
#[test]
fn mount_git_status_and_sha256sum_check() {
    if !require_fuse("mount_git_status_and_sha256sum_check") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("git.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    {
        let _serial = serial();
        let k = KernelMount::new(&img, "compress=zstd");
        let (_, err) = sh(
            &k.mnt,
            "set -e
             mkdir repo && cd repo
             git init -q . && git config user.email t@example.invalid && git config user.name t
             for i in $(seq 1 40); do mkdir -p d$((i % 5)); seq $i 3000 > d$((i % 5))/f$i.txt; done
             head -c 300000 /dev/urandom > blob.bin
             ln -s d1/f1.txt link
             git add -A && git commit -q -m initial
             echo change >> d1/f1.txt && git commit -q -am second
             sha256sum $(find . -path ./.git -prune -o -type f -print | sort) > ../SHA256SUMS
             git status --porcelain > ../status-kernel.txt",
        );
        assert!(err.is_empty(), "setting up the repository: {err}");
        k.umount();
    }
    let m = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &[]);
    let repo = m.mnt.join("repo");
    let (out, err) = sh(&repo, "git status --porcelain; echo rc=$?");
    assert_eq!(
        out.trim(),
        "rc=0",
        "git status on the ubtrfs mount: {out} {err}"
    );
    let (out, _) = sh(
        &repo,
        "git log --oneline | wc -l; git fsck --no-progress 2>&1 | wc -l",
    );
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["2", "0"],
        "git log/fsck: {out}"
    );
    let (out, err) = sh(&repo, "sha256sum --quiet -c ../SHA256SUMS; echo rc=$?");
    assert_eq!(
        out.trim(),
        "rc=0",
        "sha256sum -c on the ubtrfs mount: {out} {err}"
    );
}
