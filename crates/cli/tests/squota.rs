//! Simple quotas (squota, `btrfs quota enable -s`, issue 14), against the kernel:
//! - on a kernel-made squota image, after every ubtrfs operation (put, rm of a file
//!   shared with a snapshot, reflink copy, snapshot, subvolume create and delete
//!   with its drop, truncate, qgroup create/assign/remove, a snapshot joining its
//!   parent's qgroups, data and metadata balance), `btrfs check --readonly
//!   --qgroup-report` recounts every qgroup to the numbers ubtrfs wrote, the full
//!   check is clean, and `ubtrfs qgroup show` prints what the kernel's `btrfs qgroup
//!   show` prints on a read-only mount of the same image (a deleted subvolume's
//!   qgroup that still holds space is a `<squota space holder>`; one that holds
//!   nothing is removed, as the kernel removes it);
//! - `quota rescan` is refused, as the kernel refuses it;
//! - the kernel then writes, snapshots and deletes on the image and the numbers stay
//!   exact; `ubtrfs quota enable -s` on a kernel image and `mkfs -O squota` give
//!   images the kernel keeps counting;
//! - on a read-write ubtrfs mount, `quota enable -s` goes through the quota ioctl,
//!   the writes are charged, and a limit gives EDQUOT.
//!
//! Needs root (loop devices, /dev/fuse); skipped with a line outside CI.

use std::path::Path;
use ubtrfs_sim::host::{btrfs_check, progs_errors, require_fuse, require_root, serial, sh, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount};

fn bin() -> Ubtrfs {
    Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs")).with_limit(120)
}

fn ubtrfs(args: &[&str]) -> String {
    bin().stdout(args)
}

/// `btrfs qgroup show --raw -pc` on the kernel's read-only mount of a copy.
fn kernel_show(img: &Path) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("copy.img");
    std::fs::copy(img, &copy).expect("copy image");
    let k = KernelMount::new(&copy, "ro");
    let out = sh(&format!("btrfs qgroup show --raw -pc {}", k.q()));
    k.umount();
    out
}

/// The (referenced, exclusive) pairs `btrfs check --qgroup-report` recounted and
/// read from disk for every qgroup it reports, which must be equal. (btrfs-progs
/// lists every qgroup in simple mode: the kernel keeps no compressed numbers
/// there, and check's recount has them.)
fn qgroup_report_mismatches(text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for block in text.split("Counts for qgroup id: ").skip(1) {
        let id = block.split_whitespace().next().unwrap_or("?");
        let nums = |who: &str| -> Vec<(String, String)> {
            block
                .lines()
                .filter_map(|l| l.trim().strip_prefix(who))
                .filter_map(|l| {
                    let mut w = l.split_whitespace();
                    Some((w.next()?.to_string(), w.next()?.to_string()))
                })
                .collect()
        };
        let (ours, disk) = (nums("our:"), nums("disk:"));
        if ours != disk || ours.is_empty() {
            bad.push(format!("{id}: recount {ours:?}, on disk {disk:?}"));
        }
    }
    bad
}

/// Simple quotas as btrfs check recounts them, a clean check, and qgroup show as
/// the kernel shows it.
fn assert_squota(img: &Path, after: &str) {
    let p = img.display().to_string();
    let out = std::process::Command::new("btrfs")
        .args(["check", "--readonly", "--qgroup-report", &p])
        .output()
        .expect("btrfs check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = qgroup_report_mismatches(&text);
    assert!(
        out.status.success() && bad.is_empty() && progs_errors(&text).is_empty(),
        "after {after}: btrfs check --qgroup-report: {bad:?}\n{text}"
    );
    assert!(
        text.contains("Counts for qgroup id: 0/5"),
        "after {after}: btrfs check did not recount simple quotas:\n{text}"
    );
    btrfs_check(img, None).unwrap_or_else(|e| panic!("after {after}: {e}"));
    let ours = ubtrfs(&["qgroup", "show", &p, "--raw", "-p", "-c"]);
    let theirs = kernel_show(img);
    assert_eq!(
        ours, theirs,
        "after {after}: ubtrfs qgroup show (left) differs from the kernel's (right)"
    );
    let status = ubtrfs(&["quota", "status", &p]);
    assert!(
        status.contains("squota (simplified accounting)")
            && status.contains("Inconsistent:            no"),
        "after {after}: {status}"
    );
}

/// The referenced bytes `qgroup show --raw` gives qgroup `q`.
fn referenced(show: &str, q: &str) -> Option<u64> {
    show.lines()
        .find(|l| l.split_whitespace().next() == Some(q))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

#[test]
fn simple_quotas_kept_like_the_kernel() {
    if !require_root("simple_quotas_kept_like_the_kernel") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("sq.img");
    let p = img.display().to_string();
    let file = dir.path().join("file");
    std::fs::write(
        &file,
        (0..2_500_000u32)
            .map(|i| (i * 13 + i / 4001) as u8)
            .collect::<Vec<u8>>(),
    )
    .expect("write file");
    let f = file.display().to_string();
    mkfs_btrfs(&img, 512 << 20, &[]);
    {
        let k = KernelMount::new(&img, "rw");
        sh(&format!(
            "set -e; cd {m}
            btrfs quota enable -s .
            btrfs -q subvolume create sv
            head -c 3000000 /dev/urandom > sv/a
            mkdir sv/d; for i in $(seq 1 200); do echo $i > sv/d/f$i; done
            cp --reflink=always sv/a top-copy
            btrfs -q subvolume snapshot sv snap
            echo more >> snap/a
            head -c 100000 /dev/urandom > snap/own
            sync",
            m = k.q()
        ));
        k.umount();
    }
    assert_squota(&img, "the kernel's writes");
    let steps: Vec<(&str, Vec<&str>)> = vec![
        ("put", vec!["put", &p, &f, "/sv/new"]),
        (
            "rm of a file shared with a snapshot",
            vec!["rm", &p, "/sv/a"],
        ),
        (
            "reflink copy across subvolumes",
            vec!["cp", &p, "/snap/a", "/sv/a-again"],
        ),
        ("truncate", vec!["truncate", "-s", "1000000", &p, "/sv/new"]),
        (
            "snapshot",
            vec!["subvolume", "snapshot", &p, "/sv", "/snap2"],
        ),
        ("subvolume create", vec!["subvolume", "create", &p, "/nsv"]),
        ("put into the new subvolume", vec!["put", &p, &f, "/nsv/x"]),
        (
            "deleting a snapshot that still owns space",
            vec!["subvolume", "delete", &p, "/snap"],
        ),
        (
            "deleting a subvolume whose space all goes",
            vec!["subvolume", "delete", &p, "/nsv"],
        ),
        ("qgroup create", vec!["qgroup", "create", &p, "1/100"]),
        (
            "qgroup assign",
            vec!["qgroup", "assign", &p, "0/256", "1/100"],
        ),
        (
            "a snapshot inside sv, joining sv's qgroups",
            vec!["subvolume", "snapshot", &p, "/sv", "/sv/inner"],
        ),
        (
            "put into the inner snapshot",
            vec!["put", &p, &f, "/sv/inner/y"],
        ),
        (
            "qgroup remove",
            vec!["qgroup", "remove", &p, "0/256", "1/100"],
        ),
        (
            "data balance",
            vec!["balance", "start", &p, "-d", "--full-balance"],
        ),
        (
            "metadata balance",
            vec!["balance", "start", &p, "-m", "--full-balance"],
        ),
    ];
    for (what, args) in &steps {
        let (ok, out, err) = bin().run(args);
        assert!(ok, "{what}: ubtrfs {args:?} failed:\n{out}{err}");
        assert_squota(&img, what);
    }
    let show = ubtrfs(&["qgroup", "show", &p, "--raw", "-p"]);
    assert!(show.contains("<squota space holder>"), "{show}");
    assert!(
        !show.contains("<stale>"),
        "nsv's empty qgroup stays:\n{show}"
    );
    // The inner snapshot (made while sv was in 1/100) joined 1/100, as the
    // kernel's auto-inherit makes it join; 1/100 now holds only its bytes.
    let inner = show
        .lines()
        .find(|l| l.ends_with("sv/inner"))
        .unwrap_or_else(|| panic!("no sv/inner in\n{show}"));
    assert!(inner.contains("1/100"), "{show}");
    assert_eq!(
        referenced(&show, "1/100"),
        inner.split_whitespace().nth(1).and_then(|n| n.parse().ok()),
        "{show}"
    );
    // No rescan with simple quotas, here or in the kernel.
    let (ok, _, err) = bin().run(&["quota", "rescan", &p]);
    assert!(!ok && err.contains("simple quotas"), "{err}");
    {
        let k = KernelMount::new(&img, "rw");
        let out = sh(&format!(
            "cd {m}; btrfs quota rescan . >/dev/null 2>&1 && echo rescanned || echo refused",
            m = k.q()
        ));
        assert!(out.contains("refused"), "the kernel rescans: {out}");
        sh(&format!(
            "set -e; cd {m}
            head -c 1000000 /dev/urandom > sv/kern
            rm sv/new
            btrfs -q subvolume snapshot sv snap3
            echo y >> snap3/a-again
            btrfs -q subvolume delete -c snap2
            sync",
            m = k.q()
        ));
        k.umount();
    }
    assert_squota(&img, "the kernel's writes after ubtrfs's");
    let (ok, out, err) = bin().run(&["put", &p, &f, "/snap3/after-kernel"]);
    assert!(ok, "put after the kernel: {out}{err}");
    assert_squota(&img, "ubtrfs's writes after the kernel's");

    // `ubtrfs quota enable -s` on a kernel image, then the kernel writes.
    let img2 = dir.path().join("enable.img");
    let p2 = img2.display().to_string();
    mkfs_btrfs(&img2, 256 << 20, &[]);
    {
        let k = KernelMount::new(&img2, "rw");
        sh(&format!(
            "set -e; cd {m}; btrfs -q subvolume create sv; head -c 500000 /dev/urandom > sv/old; sync",
            m = k.q()
        ));
        k.umount();
    }
    ubtrfs(&["quota", "enable", "-s", &p2]);
    assert_squota(&img2, "ubtrfs quota enable -s");
    let show = ubtrfs(&["qgroup", "show", &p2, "--raw"]);
    assert_eq!(
        referenced(&show, "0/256"),
        Some(0),
        "older data is not charged:\n{show}"
    );
    ubtrfs(&["put", &p2, &f, "/sv/new"]);
    assert_squota(&img2, "a put after enable -s");
    {
        let k = KernelMount::new(&img2, "rw");
        sh(&format!(
            "set -e; cd {m}; head -c 700000 /dev/urandom > sv/k; rm sv/old; btrfs -q subvolume snapshot sv s; sync",
            m = k.q()
        ));
        k.umount();
    }
    assert_squota(
        &img2,
        "the kernel's writes after ubtrfs enabled simple quotas",
    );

    // mkfs -O squota with --rootdir: what mkfs wrote is not charged; later writes are.
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sv")).expect("mkdir");
    std::fs::copy(&file, src.join("sv/a")).expect("copy");
    let mk = dir.path().join("mkfs.img");
    let (mks, srcs) = (mk.display().to_string(), src.display().to_string());
    ubtrfs(&[
        "mkfs", "-q", "--size", "256M", "-O", "squota", "-r", &srcs, "--subvol", "sv", &mks,
    ]);
    assert_squota(&mk, "mkfs -O squota --rootdir");
    ubtrfs(&["put", &mks, &f, "/sv/b"]);
    assert_squota(&mk, "a put into a mkfs -O squota image");
}

#[test]
fn simple_quotas_on_the_mount() {
    if !require_fuse("simple_quotas_on_the_mount") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("m.img");
    mkfs_btrfs(&img, 512 << 20, &[]);
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    let mut fm = FuseMount::start(&bin(), &[&img], &["rw"]);
    fm.run(
        &format!(
            "set -e
            {u} subvolume create . sv >/dev/null
            head -c 400000 /dev/urandom > sv/before
            {u} quota enable -s .
            head -c 1500000 /dev/urandom > sv/b
            cp --reflink=auto sv/b b-copy
            mkdir sv/d; for i in $(seq 1 200); do echo $i > sv/d/f$i; done
            rm sv/before
            btrfs filesystem sync .
            {u} qgroup limit . 3M 0/256
            ! head -c 3000000 /dev/urandom > sv/too-big 2>err
            grep -q 'Disk quota exceeded' err
            rm -f sv/too-big err"
        ),
        "a workload with simple quotas on the mount",
    );
    fm.unmount();
    assert_squota(&img, "a ubtrfs mount's writes with simple quotas");
    let show = ubtrfs(&["qgroup", "show", &img.display().to_string(), "--raw"]);
    let sv = referenced(&show, "0/256").unwrap_or(0);
    assert!(sv >= 1_500_000, "sv's new data is charged to it:\n{show}");
}
