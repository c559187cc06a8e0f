//! Subvolumes on a `ubtrfs mount` look as on the kernel's mount, for the tools that
//! identify files by (st_dev, st_ino): find, du, tar, cp -a, rsync -aH.
//!
//! The kernel makes an image (mkfs.btrfs, loop mount): files and hard links, nested
//! subvolumes, a writable and a read-only snapshot of a subvolume that holds another
//! one (so the snapshots show the ino-2 placeholder directory), a snapshot of the top
//! level. Then the same commands run on the kernel's read-only mount and on
//! `ubtrfs mount -o ro` and `-o rw`, and must print the same, with nothing on stderr
//! (no "File system loop detected"); copies made with `cp -a` and `rsync -aH` must be
//! equal (`diff -r`) with the same hard-link groups. On the read-write mounts (the
//! kernel's, of a copy of the image, and ubtrfs') rename and link across subvolumes
//! give EXDEV and every change in the read-only snapshot EROFS; after the ubtrfs
//! mount wrote a few changes and is unmounted, `btrfs check` is clean.
//!
//! Needs root (/dev/fuse, loop devices); skipped with a line outside CI.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use ubtrfs_sim::host::{bash_in, btrfs_check, require_fuse, serial, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount, ScratchBtrfs};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// What the kernel writes into the fresh filesystem (run at its root).
const FILL: &str = r#"
set -eu
gen() { head -c "$2" /dev/zero | tr '\0' "$1"; }
mkdir -p d/e
gen a 100000 > d/big
echo top > top.txt
ln top.txt d/e/top-link
btrfs -q subvolume create sv1
echo a > sv1/a
ln sv1/a sv1/a2
mkdir sv1/dir
ln sv1/a sv1/dir/a3
gen b 50000 > sv1/dir/data
ln -s a sv1/sym
btrfs -q subvolume create sv1/nested
echo n > sv1/nested/n
ln sv1/nested/n sv1/nested/n2
mkdir sv1/nested/deep
btrfs -q subvolume create sv1/nested/deep/inner
gen c 20000 > sv1/nested/deep/inner/f
ln sv1/nested/deep/inner/f sv1/nested/deep/inner/g
mkdir vols
btrfs -q subvolume create vols/sv2
echo b > vols/sv2/b
ln vols/sv2/b vols/sv2/b2
btrfs -q subvolume snapshot sv1 snap-rw
btrfs -q subvolume snapshot -r sv1 snap-ro
btrfs -q subvolume snapshot sv1/nested snap-nested
mkdir snaps
btrfs -q subvolume snapshot . snaps/top
echo changed >> snap-rw/a
gen d 30000 > snap-rw/new
ln snap-rw/new snap-rw/dir/new-link
sync
"#;

/// Commands whose output (stdout and stderr) must be the same on every mount.
const SCRIPTS: &[&str] = &[
    "find . | sort",
    "find . -printf '%y %n %s %P\\n' | sort",
    "du -s --block-size=1 .; du -s --apparent-size --block-size=1 .",
    "du -a .",
    // Dates and times left out: the kernel makes up the placeholders' times.
    "tar cf - . | tar tvf - | awk '{$4=\"\"; $5=\"\"; print}' | sort",
    // Hard links, with times (the linked files are real ones).
    "tar cf - . | tar tvf - | grep ' link to ' | sort",
];

/// Runs the scripts in `dir`: one "$ script\nstdout\nstderr: ..." text per script.
fn outputs(dir: &Path) -> Vec<(String, String)> {
    SCRIPTS.iter().map(|s| bash_in(dir, s)).collect()
}

/// Hard-link groups of the regular files under `dir` (paths relative to it), sorted.
fn link_groups(dir: &Path) -> Vec<Vec<String>> {
    let (out, err) = bash_in(dir, "find . -type f -links +1 -printf '%D:%i %P\\n'");
    assert!(err.is_empty(), "find in {}: {err}", dir.display());
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in out.lines() {
        let (id, p) = l.split_once(' ').expect("find line");
        by.entry(id.to_string()).or_default().push(p.to_string());
    }
    let mut g: Vec<Vec<String>> = by
        .into_values()
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    g.sort();
    g
}

/// Copies `src` with `cp -a` and `rsync -aH` into `dest`/cp and `dest`/rsync; what
/// failed goes to `diffs`.
fn copies(src: &Path, dest: &Path, diffs: &mut Vec<String>) {
    std::fs::create_dir_all(dest).expect("mkdir");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dest.join("cp"))
        .output()
        .expect("cp");
    if !cp.status.success() {
        diffs.push(format!(
            "cp -a {}: {}",
            src.display(),
            String::from_utf8_lossy(&cp.stderr)
        ));
    }
    let rs = Command::new("rsync")
        .arg("-aH")
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", dest.join("rsync").display()))
        .output()
        .expect("rsync (tests/install-deps.sh installs it)");
    if !rs.status.success() {
        diffs.push(format!(
            "rsync -aH {}: {}",
            src.display(),
            String::from_utf8_lossy(&rs.stderr)
        ));
    }
}

/// `diff -r` of two copies and their hard-link groups.
fn compare_copies(what: &str, want: &Path, got: &Path, diffs: &mut Vec<String>) {
    for tool in ["cp", "rsync"] {
        let (a, b) = (want.join(tool), got.join(tool));
        let d = Command::new("diff")
            .args(["-r", "--no-dereference"])
            .arg(&a)
            .arg(&b)
            .output()
            .expect("diff");
        if !d.status.success() {
            diffs.push(format!(
                "{what}: {tool} copies differ: {}{}",
                String::from_utf8_lossy(&d.stdout),
                String::from_utf8_lossy(&d.stderr)
            ));
        }
        let (ga, gb) = (link_groups(&a), link_groups(&b));
        if ga.is_empty() {
            diffs.push(format!(
                "{what}: {tool} copy of the kernel's mount has no hard links"
            ));
        }
        if ga != gb {
            diffs.push(format!(
                "{what}: {tool} copies' hard links differ:\nkernel: {ga:?}\nubtrfs: {gb:?}"
            ));
        }
    }
}

type Probe = (&'static str, Result<(), i32>);

fn errno<T>(r: std::io::Result<T>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Changes across subvolumes and inside the read-only snapshot, each with the errno
/// it got. Every one of them fails on the kernel, so the tree is unchanged after.
fn probes(m: &Path) -> Vec<Probe> {
    let p = |s: &str| m.join(s);
    let open = |s: &str, f: fn(&mut OpenOptions) -> &mut OpenOptions| {
        let mut o = OpenOptions::new();
        f(&mut o);
        errno(o.open(p(s)))
    };
    vec![
        (
            "rename file into another subvolume",
            errno(std::fs::rename(p("sv1/a"), p("vols/sv2/a"))),
        ),
        (
            "rename file into a snapshot",
            errno(std::fs::rename(p("sv1/dir/data"), p("snap-rw/data9"))),
        ),
        (
            "rename dir into the parent subvolume",
            errno(std::fs::rename(p("sv1/dir"), p("d/dir9"))),
        ),
        (
            "rename file out of a nested subvolume",
            errno(std::fs::rename(p("sv1/nested/n"), p("sv1/n9"))),
        ),
        (
            "link into another subvolume",
            errno(std::fs::hard_link(p("sv1/a"), p("vols/sv2/a9"))),
        ),
        (
            "link from the top level into a subvolume",
            errno(std::fs::hard_link(p("top.txt"), p("sv1/top9"))),
        ),
        (
            "link out of the ro snapshot",
            errno(std::fs::hard_link(p("snap-ro/a"), p("sv1/ro9"))),
        ),
        (
            "link into the ro snapshot",
            errno(std::fs::hard_link(p("sv1/a"), p("snap-ro/a9"))),
        ),
        (
            "rename out of the ro snapshot",
            errno(std::fs::rename(p("snap-ro/a"), p("sv1/a9"))),
        ),
        (
            "open for writing in the ro snapshot",
            open("snap-ro/a", |o| o.write(true)),
        ),
        (
            "open for appending in the ro snapshot",
            open("snap-ro/a", |o| o.append(true)),
        ),
        (
            "open with O_TRUNC in the ro snapshot",
            open("snap-ro/dir/data", |o| o.write(true).truncate(true)),
        ),
        (
            "create in the ro snapshot",
            open("snap-ro/new9", |o| {
                o.write(true).create_new(true).mode(0o644)
            }),
        ),
        (
            "mkdir in the ro snapshot",
            errno(std::fs::create_dir(p("snap-ro/dir9"))),
        ),
        (
            "symlink in the ro snapshot",
            errno(symlink("a", p("snap-ro/sym9"))),
        ),
        (
            "unlink in the ro snapshot",
            errno(std::fs::remove_file(p("snap-ro/a2"))),
        ),
        (
            "rmdir in the ro snapshot",
            errno(std::fs::remove_dir(p("snap-ro/dir"))),
        ),
        (
            "rename inside the ro snapshot",
            errno(std::fs::rename(p("snap-ro/a"), p("snap-ro/a9"))),
        ),
        (
            "chmod in the ro snapshot",
            errno(std::fs::set_permissions(
                p("snap-ro/a"),
                std::fs::Permissions::from_mode(0o600),
            )),
        ),
        (
            "chown in the ro snapshot",
            errno(std::os::unix::fs::chown(p("snap-ro/a"), Some(1), Some(1))),
        ),
        (
            "truncate in the ro snapshot",
            errno(nix::unistd::truncate(&p("snap-ro/a"), 0).map_err(std::io::Error::from)),
        ),
        (
            "setxattr in the ro snapshot",
            errno(xattr::set(p("snap-ro/a"), "user.x", b"1")),
        ),
        (
            "chmod of the ro snapshot's root",
            errno(std::fs::set_permissions(
                p("snap-ro"),
                std::fs::Permissions::from_mode(0o700),
            )),
        ),
    ]
}

/// What the kernel answers to each probe: EROFS for a change in the read-only
/// snapshot (its permission check comes before the subvolume check), EXDEV across
/// subvolumes (a link out of the read-only snapshot: the target directory is
/// writable, the link crosses subvolumes).
fn expected(name: &str) -> i32 {
    if name.contains("ro snapshot") && name != "link out of the ro snapshot" {
        EROFS
    } else {
        EXDEV
    }
}

const EXDEV: i32 = 18;
const EROFS: i32 = 30;
const ENOTEMPTY: i32 = 39;

/// Writes that succeed on the ubtrfs mount, so that btrfs check has something to
/// check: links and renames inside one subvolume, a new file in a snapshot.
fn writes(m: &Path) {
    std::fs::hard_link(m.join("snap-rw/a"), m.join("snap-rw/a4")).expect("link in a snapshot");
    std::fs::rename(m.join("sv1/dir/data"), m.join("sv1/data2")).expect("rename in sv1");
    let mut f = std::fs::File::create(m.join("vols/sv2/new")).expect("create in sv2");
    f.write_all(b"new file\n").expect("write");
    f.sync_all().expect("fsync");
    // As on the kernel: a subvolume moves (and back), renaming over a subvolume is
    // ENOTEMPTY; the placeholder's removal is tried on the kernel in
    // crates/cli/tests/subvol_edit.rs.
    std::fs::rename(m.join("sv1"), m.join("sv1-moved")).expect("rename of a subvolume");
    std::fs::rename(m.join("sv1-moved"), m.join("sv1")).expect("rename back");
    assert_eq!(
        errno(std::fs::rename(m.join("d/e"), m.join("vols/sv2"))),
        Err(ENOTEMPTY),
        "rename over a subvolume"
    );
}

#[test]
fn mount_subvolumes_like_the_kernel() {
    if !require_fuse("mount_subvolumes_like_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("subvols.img");
    mkfs_btrfs(&img, 512 << 20, &[]);
    {
        let k = KernelMount::new(&img, "rw");
        let (out, err) = bash_in(&k.mnt, FILL);
        assert!(err.is_empty(), "filling the image: {out}{err}");
        k.umount();
    }
    let scratch = ScratchBtrfs::new();
    let mut diffs = Vec::new();

    let kout = {
        let k = KernelMount::new(&img, "ro");
        let out = outputs(&k.mnt);
        for (s, (o, e)) in SCRIPTS.iter().zip(&out) {
            assert!(
                !o.trim().is_empty(),
                "`{s}` printed nothing on the kernel's mount"
            );
            assert!(e.is_empty(), "`{s}` on the kernel's mount: {e}");
        }
        // The cases this test is about are there: placeholders, hard links.
        let placeholders = bash_in(&k.mnt, "find . -inum 2 | wc -l").0;
        assert!(
            placeholders.trim().parse::<u32>().unwrap_or(0) >= 4,
            "placeholders: {placeholders}"
        );
        assert!(
            out[5].0.contains("./snap-ro/a2 link to ./snap-ro/a"),
            "tar links: {}",
            out[5].0
        );
        let mut errors = Vec::new();
        copies(&k.mnt, &scratch.path().join("kernel"), &mut errors);
        assert!(
            errors.is_empty(),
            "copies of the kernel's mount: {errors:?}"
        );
        k.umount();
        out
    };

    for mode in ["ro", "rw"] {
        let mut fm = FuseMount::start(&UBTRFS, &[&img], &[mode]);
        let out = outputs(&fm.mnt);
        for ((s, k), o) in SCRIPTS.iter().zip(&kout).zip(&out) {
            if k != o {
                diffs.push(format!(
                    "-o {mode}: `{s}` differs:\nkernel:\n{}{}\nubtrfs:\n{}{}",
                    k.0, k.1, o.0, o.1
                ));
            }
        }
        // Every subvolume root is inode 256 to the kernel; here only the mounted one.
        let roots = bash_in(
            &fm.mnt,
            "stat -c %i . sv1 sv1/nested snap-rw snap-ro | sort -u | wc -l",
        )
        .0;
        if roots.trim() != "5" {
            diffs.push(format!("-o {mode}: subvolume roots share st_ino: {roots}"));
        }
        let dest = scratch.path().join(format!("ubtrfs-{mode}"));
        copies(&fm.mnt, &dest, &mut diffs);
        compare_copies(
            &format!("-o {mode}"),
            &scratch.path().join("kernel"),
            &dest,
            &mut diffs,
        );
        let st = fm.unmount();
        assert!(
            st.success(),
            "-o {mode}: server exited with {st}: {}",
            fm.log()
        );
    }

    // The kernel's answers on a read-write mount of a copy (it may write to it).
    let kimg = dir.path().join("kernel-rw.img");
    let ok = Command::new("cp")
        .args(["--sparse=always"])
        .arg(&img)
        .arg(&kimg)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "copying the image");
    let kprobes = {
        let k = KernelMount::new(&kimg, "rw");
        let p = probes(&k.mnt);
        k.umount();
        p
    };
    for (name, r) in &kprobes {
        assert_eq!(*r, Err(expected(name)), "kernel: {name}");
    }

    let mut fm = FuseMount::start(&UBTRFS, &[&img], &["rw"]);
    let uprobes = probes(&fm.mnt);
    for ((name, k), (_, u)) in kprobes.iter().zip(&uprobes) {
        if k != u {
            diffs.push(format!("-o rw: {name}: kernel {k:?}, ubtrfs {u:?}"));
        }
    }
    // Nothing changed: the tree is the one the kernel made.
    let after = outputs(&fm.mnt);
    if after[1] != kout[1] {
        diffs.push(format!(
            "-o rw: the failed changes changed the tree:\n{}",
            after[1].0
        ));
    }
    writes(&fm.mnt);
    let st = fm.unmount();
    assert!(st.success(), "-o rw: server exited with {st}: {}", fm.log());
    let log = fm.log();
    if !log.trim().is_empty() {
        diffs.push(format!("-o rw: server messages: {log}"));
    }
    if let Err(e) = btrfs_check(&img, None) {
        diffs.push(format!("after the ubtrfs read-write mount: {e}"));
    }
    // The kernel sees the changes.
    let k = KernelMount::new(&img, "ro");
    let (o, e) = bash_in(
        &k.mnt,
        "stat -c '%h %n' snap-rw/a4 sv1/data2 && cat vols/sv2/new && test ! -e sv1/dir/data \
         && test -f sv1/nested/n && test -d snap-rw/nested && test -f vols/sv2/b",
    );
    if o != "4 snap-rw/a4\n1 sv1/data2\nnew file\n" || !e.is_empty() {
        diffs.push(format!("the kernel after the ubtrfs mount: {o}{e}"));
    }
    k.umount();
    if !diffs.is_empty() {
        panic!("{} differences:\n{}", diffs.len(), diffs.join("\n"));
    }
}

/// A subvolume or snapshot made through the mount is there for the very next path
/// walk, with the CPUs busy: the mount makes the kernel forget the name (which
/// `ubtrfs subvolume snapshot` itself looked up and found absent, a negative entry
/// the kernel keeps) before it answers the ioctl. It used to answer first, and one
/// `stat` in ten or so right after the command then failed with ENOENT.
#[test]
fn new_snapshots_are_seen_at_once_under_load() {
    if !require_fuse("new_snapshots_are_seen_at_once_under_load") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("a.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    let fm = FuseMount::start(&UBTRFS, &[&img], &["rw"]);
    std::fs::write(fm.mnt.join("f"), b"x").expect("write f");
    // Busy CPUs make the server's notification thread start late.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let burners: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                }
            })
        })
        .collect();
    let mut missing = Vec::new();
    for i in 0..60 {
        let (name, args): (String, Vec<String>) = if i % 2 == 0 {
            let n = format!("snap{i}");
            let dest = format!("/{n}");
            (
                n,
                vec![
                    "subvolume".into(),
                    "snapshot".into(),
                    "-r".into(),
                    fm.mnt.display().to_string(),
                    "/".into(),
                    dest,
                ],
            )
        } else {
            let n = format!("sub{i}");
            let path = format!("/{n}");
            (
                n,
                vec![
                    "subvolume".into(),
                    "create".into(),
                    fm.mnt.display().to_string(),
                    path,
                ],
            )
        };
        let out = Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
            .args(&args)
            .output()
            .expect("ubtrfs");
        assert!(
            out.status.success(),
            "ubtrfs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let probe = if i % 2 == 0 {
            fm.mnt.join(&name).join("f")
        } else {
            fm.mnt.join(&name)
        };
        if let Err(e) = std::fs::metadata(&probe) {
            missing.push(format!("{}: {e}", probe.display()));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in burners {
        b.join().expect("burner");
    }
    assert!(
        missing.is_empty(),
        "not seen right after the command: {missing:#?}\n{}",
        fm.log()
    );
    fm.walk_and_unmount();
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check: {e}"));
}
