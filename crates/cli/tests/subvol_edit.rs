//! Subvolume create/snapshot/delete and edits inside subvolumes, offline, against the
//! kernel (issue 13):
//! - the same subvolume operations done by the kernel on one twin image and by
//!   `ubtrfs` on the other give the same trees as a kernel mount shows them, the same
//!   `subvolume list`, and `btrfs check` is clean; the kernel then writes into the
//!   snapshots ubtrfs made (CoW of blocks whose references ubtrfs converted) and the
//!   image stays clean;
//! - deleting a snapshot whose own blocks are shared with a later snapshot (the
//!   cleaner's UPDATE_BACKREF stage), interrupted after a few commits: `btrfs check`
//!   is clean half-way, the kernel finishes the drop, ubtrfs finishes it too, and
//!   both free what the kernel's own deletion frees;
//! - a deletion the kernel left half-done (unmounted while its cleaner ran) is
//!   finished by `ubtrfs subvolume sync`;
//! - offline edits in a kernel-made subvolume equal the kernel's; read-only snapshots
//!   refuse (EROFS), renames and links between subvolumes give EXDEV, `rm -r` removes
//!   a nested subvolume as the kernel's rmdir does.
//!
//! - on a read-write `ubtrfs mount`, `mv` of a subvolume, `rm -r` of a snapshot (the
//!   kernel's rmdir of an emptied subvolume) and rmdir of a non-empty subvolume
//!   (ENOTEMPTY) behave as on the kernel's mount, and the mount's cleaner drops the
//!   deleted tree in the background;
//! - `ubtrfs subvolume create|snapshot|delete` given a mounted directory send the
//!   btrfs ioctls: on the kernel's mount and on a ubtrfs mount they give the same
//!   result, and a read-only snapshot made through the ubtrfs mount refuses writes.
//!
//! Needs root (loop devices, /dev/fuse); skipped with a line outside CI.

use std::path::{Path, PathBuf};
use ubtrfs_sim::golden::{compare_walks, report, walk_mounted};
use ubtrfs_sim::host::{btrfs_check, progs_errors, require_root, serial, sh, shell_quote, Ubtrfs};
use ubtrfs_sim::mount::{kernel_writes, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// Contents (not times, inode numbers of new subvolumes' roots are equal anyway).
const FIELDS: &[&str] = &[
    "type", "ino", "mode", "uid", "gid", "nlink", "size", "sha256", "xattrs", "readlink",
];

/// A subvolume big enough for a three-level tree at 4 KiB nodes, reflinked and
/// inline files, a nested subvolume, and a snapshot changed after it was taken.
const SOURCE: &str = r#"
set -eu
btrfs -q subvolume create home
python3 - <<'PY'
import os, random
random.seed(5)
for d in range(6):
    os.makedirs(f'home/d{d}')
    for i in range(700):
        with open(f'home/d{d}/f{i}', 'wb') as f:
            f.write(random.randbytes(300 if i % 3 else 5000))
open('home/big', 'wb').write(random.randbytes(3 << 20))
os.symlink('big', 'home/link')
os.setxattr('home/d0/f1', 'user.tag', b'v')
PY
cp --reflink=always home/big home/big2
btrfs -q subvolume create home/nested
echo n > home/nested/x
btrfs -q subvolume snapshot home snap
python3 - <<'PY'
for d in range(0, 6, 2):
    for i in range(0, 700, 4):
        with open(f'snap/d{d}/f{i}', 'wb') as f:
            f.write(b'changed %d' % i * 100)
PY
sync
"#;

fn twin_images(dir: &Path, script: &str) -> (PathBuf, PathBuf) {
    let img = dir.join("ubtrfs.img");
    let kimg = dir.join("kernel.img");
    mkfs_btrfs(&img, 1 << 30, &["-n", "4096"]);
    kernel_writes(&img, script, "source tree");
    std::fs::copy(&img, &kimg).expect("twin image");
    (img, kimg)
}

fn kernel_tree(img: &Path) -> std::collections::BTreeMap<String, serde_json::Value> {
    let k = KernelMount::new(img, "ro");
    let t = walk_mounted(&k.path(""));
    k.umount();
    t
}

/// `btrfs subvolume list` of a kernel mount, without the generations (the kernel
/// commits more often than one offline command does).
fn kernel_subvol_list(img: &Path) -> Vec<String> {
    let k = KernelMount::new(img, "ro");
    let text = sh(&format!(
        "btrfs subvolume list {}",
        shell_quote(&k.path(""))
    ));
    k.umount();
    text.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // ID n gen g top level t path p
            format!("{} {} {} {}", w[1], w[5], w[6], w[8..].join(" "))
        })
        .collect()
}

fn root_tree_text(img: &Path) -> String {
    sh(&format!(
        "btrfs inspect-internal dump-tree -t root {}",
        shell_quote(img)
    ))
}

/// The drop_progress line of subvolume `id`'s ROOT_ITEM, if it still has one.
fn drop_progress(img: &Path, id: u64) -> Option<String> {
    let text = root_tree_text(img);
    let mut lines = text.lines();
    lines.find(|l| l.contains(&format!("key ({id} ROOT_ITEM")))?;
    lines
        .take(5)
        .find(|l| l.contains("drop_progress"))
        .map(|l| l.trim().to_string())
}

/// The fields of tree `id`'s ROOT_ITEM that do not count commits, as dump-tree
/// prints them: root_dirid, byte_limit, bytes_used, flags, refs, drop_level, level.
fn root_item_fields(img: &Path, id: u64) -> Vec<String> {
    let text = root_tree_text(img);
    let mut lines = text.lines();
    lines.find(|l| l.contains(&format!("key ({id} ROOT_ITEM")));
    let words: Vec<&str> = lines
        .take_while(|l| !l.trim_start().starts_with("item "))
        .flat_map(|l| l.split_whitespace())
        .collect();
    let names = [
        "root_dirid",
        "byte_limit",
        "bytes_used",
        "flags",
        "refs",
        "drop_level",
        "level",
    ];
    let fields: Vec<String> = words
        .windows(2)
        .filter(|w| names.contains(&w[0]))
        .map(|w| format!("{} {}", w[0], w[1]))
        .collect();
    assert_eq!(
        fields.len(),
        names.len(),
        "ROOT_ITEM of tree {id} in {}: {fields:?}",
        img.display()
    );
    fields
}

/// bytes_used of the superblock (what the extent tree accounts).
fn bytes_used(img: &Path) -> u64 {
    let text = sh(&format!(
        "btrfs inspect-internal dump-super {}",
        shell_quote(img)
    ));
    text.lines()
        .find(|l| l.starts_with("bytes_used"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("dump-super: {text}"))
}

fn check(img: &Path, what: &str) {
    btrfs_check(img, None).unwrap_or_else(|e| panic!("btrfs check {what}: {e}"));
}

#[test]
fn snapshots_and_deletion_as_the_kernel() {
    if !require_root("snapshots_and_deletion_as_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (img, kimg) = twin_images(dir.path(), SOURCE);
    kernel_writes(
        &kimg,
        "btrfs -q subvolume snapshot home snap2; btrfs -q subvolume snapshot -r snap ro; \
         btrfs -q subvolume create home/new; mkdir home/new/dir; \
         btrfs -q subvolume delete snap; btrfs filesystem sync .; btrfs subvolume sync . >/dev/null; sync",
        "kernel subvolume operations",
    );
    let s = img.to_str().expect("utf-8 path");
    for args in [
        &["subvolume", "snapshot", s, "/home", "/snap2"][..],
        &["subvolume", "snapshot", "-r", s, "/snap", "/ro"],
        &["subvolume", "create", s, "/home/new"],
        &["mkdir", s, "/home/new/dir"],
        &["subvolume", "delete", s, "/snap"],
    ] {
        UBTRFS.stdout(args);
    }
    check(&img, "after ubtrfs snapshot/create/delete");
    report(compare_walks(
        "subvolume operations",
        &kernel_tree(&kimg),
        &kernel_tree(&img),
        FIELDS,
    ));
    assert_eq!(kernel_subvol_list(&img), kernel_subvol_list(&kimg));
    // The ROOT_ITEMs' fields that do not count commits: home (256, snapshotted),
    // snap2 (259), ro (260), home/new (261).
    for id in [256, 259, 260, 261] {
        assert_eq!(
            root_item_fields(&img, id),
            root_item_fields(&kimg, id),
            "ROOT_ITEM of tree {id}, ubtrfs against the kernel"
        );
    }
    // `subvolume show` prints what btrfs-progs prints on the kernel's mount.
    let k = KernelMount::new(&img, "ro");
    for p in ["home", "snap2", "ro"] {
        let want = sh(&format!("btrfs subvolume show {}", shell_quote(&k.path(p))));
        let got = UBTRFS.stdout(&["subvolume", "show", s, &format!("/{p}")]);
        assert_eq!(got, want, "subvolume show /{p}");
    }
    k.umount();
    let ro = UBTRFS.stdout(&["property", "get", s, "/ro", "ro"]);
    assert_eq!(ro.trim(), "ro=true");
    assert!(UBTRFS
        .stdout(&["subvolume", "show", s, "/ro"])
        .contains("Flags: \t\t\treadonly"));

    // The kernel writes where ubtrfs shared and converted references.
    let edit = "set -e; for d in 0 2 4; do echo k >> home/d$d/f1; echo k >> snap2/d$d/f2; done; \
                rm -r snap2/d5; btrfs -q subvolume delete ro; btrfs filesystem sync .; btrfs subvolume sync . >/dev/null; sync";
    kernel_writes(&img, edit, "kernel edits after ubtrfs snapshots");
    kernel_writes(&kimg, edit, "kernel edits after kernel snapshots");
    check(&img, "after the kernel wrote to ubtrfs's snapshots");
    report(compare_walks(
        "kernel edits",
        &kernel_tree(&kimg),
        &kernel_tree(&img),
        FIELDS,
    ));
}

#[test]
fn interrupted_deletion_resumes_both_ways() {
    if !require_root("interrupted_deletion_resumes_both_ways") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    // snap's own blocks (its changes) are shared with snap-of-snap: deleting snap
    // must convert their references before dropping it.
    let script = format!(
        "{SOURCE}\nbtrfs -q subvolume snapshot snap snap-of-snap; echo z > snap/d1/f1; sync"
    );
    let (img, kimg) = twin_images(dir.path(), &script);
    kernel_writes(
        &kimg,
        "btrfs -q subvolume delete snap; btrfs filesystem sync .; btrfs subvolume sync . >/dev/null; sync",
        "kernel deletion",
    );
    let s = img.to_str().expect("utf-8 path");
    let show = UBTRFS.stdout(&["subvolume", "show", s, "/snap"]);
    let id: u64 = show
        .lines()
        .find_map(|l| l.trim().strip_prefix("Subvolume ID:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("subvolume show: {show}"));
    UBTRFS.stdout(&[
        "subvolume",
        "delete",
        s,
        "/snap",
        "--drop-blocks-per-commit",
        "40",
        "--max-drop-commits",
        "3",
    ]);
    let progress = drop_progress(&img, id);
    assert!(
        progress
            .as_deref()
            .is_some_and(|p| !p.contains("key (0 UNKNOWN.0 0)")),
        "ubtrfs stopped half-way, so the ROOT_ITEM keeps a drop position: {progress:?}"
    );
    check(&img, "half-way through ubtrfs's drop");
    let half = dir.path().join("half.img");
    std::fs::copy(&img, &half).expect("copy");

    // ubtrfs finishes its own drop; the kernel finishes the copy.
    let out = UBTRFS.stdout(&["subvolume", "sync", s]);
    assert!(out.contains(&format!("Subvolume id {id} is gone")), "{out}");
    assert_eq!(drop_progress(&img, id), None, "ROOT_ITEM gone");
    let orphan = format!("ORPHAN ORPHAN_ITEM {id}");
    assert!(!root_tree_text(&img).contains(&orphan));
    check(&img, "after ubtrfs finished its drop");
    kernel_writes(
        &half,
        "btrfs filesystem sync .; btrfs subvolume sync . >/dev/null; sync",
        "kernel finishes",
    );
    check(&half, "after the kernel finished ubtrfs's drop");
    assert!(!root_tree_text(&half).contains(&orphan));

    // Everything the kernel's own deletion freed is free: the only difference
    // allowed is tree shape (a few tree blocks).
    let ns = 4096i64;
    for (what, i) in [("ubtrfs", &img), ("kernel-finished", &half)] {
        let d = bytes_used(i) as i64 - bytes_used(&kimg) as i64;
        assert!(
            d.abs() <= 16 * ns,
            "{what}: bytes_used off by {d} from the kernel's deletion"
        );
    }
    let want = kernel_tree(&kimg);
    for i in [&img, &half] {
        report(compare_walks(
            "after deletion",
            &want,
            &kernel_tree(i),
            FIELDS,
        ));
    }
    // Writing into the snapshot that shared the dropped tree's blocks.
    kernel_writes(
        &img,
        "echo more >> snap-of-snap/d0/f0; rm -r snap-of-snap/d2; sync",
        "kernel edit",
    );
    check(&img, "kernel edits after ubtrfs's drop");
}

#[test]
fn kernel_half_dropped_subvolume_finished_by_ubtrfs() {
    if !require_root("kernel_half_dropped_subvolume_finished_by_ubtrfs") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("k.img");
    // The kernel's cleaner stops at unmount and saves its position: a tree big
    // enough that unmounting right after the deletion catches it half-way.
    let mut caught = None;
    for attempt in 0..5 {
        mkfs_btrfs(&img, 2 << 30, &["-n", "4096"]);
        kernel_writes(
            &img,
            "btrfs -q subvolume create big; python3 -c \"\nimport os\nfor d in range(40):\n    os.makedirs(f'big/d{d}')\n    for i in range(2000):\n        open(f'big/d{d}/f{i}', 'wb').write(b'x' * 5000)\n\"; echo keep > kept; sync",
            "big subvolume",
        );
        kernel_writes(
            &img,
            "btrfs -q subvolume delete -c big",
            "kernel deletion, unmounted at once",
        );
        if let Some(p) = drop_progress(&img, 256) {
            if !p.contains("key (0 UNKNOWN.0 0)") {
                caught = Some(p);
                break;
            }
        }
        eprintln!("attempt {attempt}: the kernel's cleaner was not caught half-way");
    }
    let p = caught.expect("the kernel left a half-dropped subvolume in 5 attempts");
    eprintln!("kernel stopped at {p}");
    check(&img, "the kernel's half-done drop");
    let s = img.to_str().expect("utf-8 path");
    let out = UBTRFS.stdout(&["subvolume", "sync", s]);
    assert!(out.contains("Subvolume id 256 is gone"), "{out}");
    check(&img, "after ubtrfs finished the kernel's drop");
    let text = sh(&format!(
        "btrfs check --readonly {} 2>&1",
        shell_quote(&img)
    ));
    assert!(
        text.contains("file data blocks allocated: 4096")
            || text.contains("file data blocks allocated: 0"),
        "every data extent of the dropped tree is freed: {text}"
    );
    let t = kernel_tree(&img);
    assert_eq!(
        t.keys().filter(|k| k.as_str() != "/").count(),
        1,
        "only `kept` is left: {:?}",
        t.keys()
    );
}

#[test]
fn edits_inside_subvolumes_as_the_kernel() {
    if !require_root("edits_inside_subvolumes_as_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = "set -e; btrfs -q subvolume create home; mkdir -p home/u/docs; \
                  echo a > home/u/docs/a; echo b > home/u/b; btrfs -q subvolume create home/u/inner; \
                  echo i > home/u/inner/i; btrfs -q subvolume snapshot -r home homesnap; sync";
    let (img, kimg) = twin_images(dir.path(), script);
    let host = dir.path().join("hostfile");
    std::fs::write(&host, b"from the host\n").expect("host file");
    kernel_writes(
        &kimg,
        &format!(
            "set -e; cp {} home/u/docs/new; chmod 644 home/u/docs/new; mkdir -p home/u/x/y; \
             mv home/u/b home/u/x/b; ln home/u/docs/a home/u/x/a-link; ln -s ../docs home/u/x/sl; \
             setfattr -n user.k -v val home/u/docs/a; truncate -s 10000 home/u/docs/a; \
             rm home/u/docs/new; rm -r home/u/inner; sync",
            shell_quote(&host)
        ),
        "kernel edits in a subvolume",
    );
    let s = img.to_str().expect("utf-8 path");
    let h = host.to_str().expect("utf-8 path");
    for args in [
        &["put", s, h, "/home/u/docs/new"][..],
        &["mkdir", "-p", s, "/home/u/x/y"],
        &["mv", s, "/home/u/b", "/home/u/x/b"],
        &["ln", s, "/home/u/docs/a", "/home/u/x/a-link"],
        &["ln", "-s", s, "../docs", "/home/u/x/sl"],
        &["setfattr", s, "/home/u/docs/a", "-n", "user.k", "-v", "val"],
        &["truncate", "-s", "10000", s, "/home/u/docs/a"],
        &["rm", s, "/home/u/docs/new"],
        &["rm", "-r", s, "/home/u/inner"],
    ] {
        UBTRFS.stdout(args);
    }
    // What the kernel refuses.
    for (args, want) in [
        (
            &["put", s, h, "/homesnap/u/new"][..],
            "Read-only file system",
        ),
        (&["rm", s, "/homesnap/u/b"], "Read-only file system"),
        (
            &["mv", s, "/home/u/docs/a", "/a"],
            "Invalid cross-device link",
        ),
        (
            &["ln", s, "/home/u/docs/a", "/hard"],
            "Invalid cross-device link",
        ),
        (
            &["subvolume", "delete", s, "/home/u"],
            "Not a Btrfs subvolume",
        ),
    ] {
        let (ok, _, err) = UBTRFS.run(args);
        assert!(!ok && err.contains(want), "{args:?}: want {want}: {err}");
    }
    check(&img, "after edits inside a subvolume");
    report(compare_walks(
        "edits in a subvolume",
        &kernel_tree(&kimg),
        &kernel_tree(&img),
        FIELDS,
    ));
    assert_eq!(kernel_subvol_list(&img), kernel_subvol_list(&kimg));
}

#[test]
fn subvolumes_on_the_mount_as_the_kernel() {
    if !require_root("subvolumes_on_the_mount_as_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (img, kimg) = twin_images(dir.path(), SOURCE);
    let script = "set -e; mv home/nested home/d0/moved; \
                  if rmdir home/d0/moved 2>err; then exit 1; fi; grep -q 'Directory not empty' err; rm err; \
                  rm -r snap; mkdir home/d1/sub; mv home/d0/moved home/d1/sub/again; \
                  ls home/d1/sub/again; echo x > home/d1/sub/again/y";
    let k = KernelMount::new(&kimg, "rw");
    ubtrfs_sim::host::bash_ok(&k.path(""), script).unwrap_or_else(|e| panic!("kernel: {e}"));
    k.umount();
    let mut m = FuseMount::start(&UBTRFS, &[&img], &["rw,commit=1"]);
    m.run(script, "subvolume moves and deletion");
    // The cleaner runs after the next timer commits.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let st = m.unmount();
    assert!(st.success(), "ubtrfs mount: {st}: {}", m.log());
    check(&img, "after the mount's subvolume changes");
    assert!(
        !root_tree_text(&img).contains("ORPHAN ORPHAN_ITEM"),
        "the mount's cleaner dropped the deleted snapshot"
    );
    report(compare_walks(
        "subvolumes on the mount",
        &kernel_tree(&kimg),
        &kernel_tree(&img),
        FIELDS,
    ));
    assert_eq!(kernel_subvol_list(&img), kernel_subvol_list(&kimg));
}

#[test]
fn subvolume_ioctls_on_mounts_as_the_kernel() {
    if !require_root("subvolume_ioctls_on_mounts_as_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (img, kimg) = twin_images(dir.path(), SOURCE);
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    let script = format!(
        "set -e; M=$PWD; {u} subvolume create $M /made; echo hi > made/f; \
         {u} subvolume snapshot $M /home /made/s1; {u} subvolume snapshot -r $M /home /ro; \
         {u} subvolume delete $M /snap; ls made/s1/d0 | wc -l; \
         if (echo x > ro/new) 2>err; then exit 1; fi; grep -q 'Read-only' err; rm err"
    );
    let k = KernelMount::new(&kimg, "rw");
    let kout =
        ubtrfs_sim::host::bash_ok(&k.path(""), &script).unwrap_or_else(|e| panic!("kernel: {e}"));
    k.umount();
    let m = FuseMount::start(&UBTRFS, &[&img], &["rw,commit=1"]);
    let uout = m.run(&script, "subvolume ioctls");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let mut m = m;
    let st = m.unmount();
    assert!(st.success(), "ubtrfs mount: {st}: {}", m.log());
    assert_eq!(uout, kout);
    check(&img, "after subvolume ioctls on the ubtrfs mount");
    report(compare_walks(
        "subvolume ioctls",
        &kernel_tree(&kimg),
        &kernel_tree(&img),
        FIELDS,
    ));
    assert_eq!(kernel_subvol_list(&img), kernel_subvol_list(&kimg));
}

/// Offline edits on a two-device RAID1 filesystem given as `a.img,b.img` (as every
/// reading command takes it): put, mkdir, cp --reflink, rm, subvolume create and
/// snapshot, label; the kernel then mounts both devices and shows what was written,
/// and `btrfs check` of the pair is clean.
#[test]
fn edits_on_a_multi_device_image() {
    if !require_root("edits_on_a_multi_device_image") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    for p in [&a, &b] {
        std::fs::File::create(p)
            .and_then(|f| f.set_len(1 << 30))
            .expect("image file");
    }
    sh(&format!(
        "mkfs.btrfs -q -f -m raid1 -d raid1 {} {}",
        shell_quote(&a),
        shell_quote(&b)
    ));
    let host = dir.path().join("f");
    std::fs::write(&host, "multi-device\n").expect("host file");
    let devs = format!("{},{}", a.display(), b.display());
    let h = host.to_str().expect("utf-8 path");
    for args in [
        vec!["put", devs.as_str(), h, "/f"],
        vec!["mkdir", devs.as_str(), "/d"],
        vec!["cp", devs.as_str(), "/f", "/d/g", "--reflink=always"],
        vec!["put", devs.as_str(), h, "/gone"],
        vec!["rm", devs.as_str(), "/gone"],
        vec!["subvolume", "create", devs.as_str(), "/sv"],
        vec!["subvolume", "snapshot", devs.as_str(), "/sv", "/snap"],
        vec!["filesystem", "label", devs.as_str(), "pair"],
    ] {
        UBTRFS.stdout(&args);
    }
    assert_eq!(
        UBTRFS.stdout(&["cat", devs.as_str(), "/d/g"]),
        "multi-device\n"
    );
    let km = KernelMount::try_new(&[&a, &b], "ro").expect("kernel mount of both devices");
    let names = sh(&format!("cd {} && ls -A && cat d/g", shell_quote(&km.mnt)));
    let label = sh(&format!("btrfs filesystem label {}", shell_quote(&km.mnt)));
    km.umount();
    assert_eq!(names, "d\nf\nsnap\nsv\nmulti-device\n");
    assert_eq!(label, "pair\n");
    // btrfs check finds the second device by scanning loop devices of both; they
    // are detached in the same script whatever the outcome.
    let check = sh(&format!(
        "l1=$(losetup -f --show {a}); l2=$(losetup -f --show {b})
         btrfs device scan $l1 $l2 >/dev/null 2>&1
         btrfs check --readonly --check-data-csum $l1 2>&1; rc=$?
         losetup -d $l1 $l2; echo rc=$rc",
        a = shell_quote(&a),
        b = shell_quote(&b)
    ));
    assert!(
        check.ends_with("rc=0\n") && progs_errors(&check).is_empty(),
        "{check}"
    );
}

/// Read-only snapshots ubtrfs makes offline are read-only to the kernel (their
/// ROOT_ITEM carries the kernel's "flags initialised" mark, without which the
/// kernel drops the read-only flag as it loads the subvolume), so `btrfs send`
/// takes them: a full send of the first and an incremental one of the second,
/// received by the kernel into another filesystem, give back both snapshots; the
/// read-only flag also survives the kernel rewriting the item (a kernel snapshot of
/// the source updates its last_snapshot).
#[test]
fn read_only_snapshots_are_sent_by_the_kernel() {
    if !require_root("read_only_snapshots_are_sent_by_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("src.img");
    let recv = dir.path().join("recv.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    mkfs_btrfs(&recv, 1 << 30, &[]);
    let host = dir.path().join("host");
    sh(&format!(
        "set -e; mkdir -p {h}/d; seq 1 20000 > {h}/a; echo b > {h}/b
         head -c 300000 /dev/urandom > {h}/d/c; ln -s a {h}/l; echo new > {h}/new",
        h = shell_quote(&host)
    ));
    let s = img.to_str().expect("utf-8 path");
    let h = |p: &str| host.join(p).to_str().expect("utf-8 path").to_string();
    for args in [
        vec!["subvolume", "create", s, "/sv"],
        vec!["put", s, &h("a"), &h("b"), &h("d"), &h("l"), "/sv/"],
        vec!["subvolume", "snapshot", "-r", s, "/sv", "/s1"],
        vec!["put", s, &h("new"), "/sv/new"],
        vec!["rm", s, "/sv/b"],
        vec!["mv", s, "/sv/a", "/sv/a2"],
        vec!["truncate", "-s", "1000", s, "/sv/d/c"],
        vec!["subvolume", "snapshot", "-r", s, "/sv", "/s2"],
    ] {
        UBTRFS.stdout(&args);
    }
    check(&img, "ubtrfs snapshots");
    let src = KernelMount::new(&img, "");
    let dst = KernelMount::new(&recv, "");
    let (sq, dq) = (shell_quote(&src.path("")), shell_quote(&dst.path("")));
    let out = sh(&format!(
        "cd {sq}; btrfs property get s1 ro; btrfs property get s2 ro
         touch s1/x 2>&1 | grep -o 'Read-only file system' || echo writable
         btrfs -q send s1 | btrfs -q receive {dq}
         btrfs -q send -p s1 s2 | btrfs -q receive {dq} && echo received"
    ));
    assert_eq!(
        out, "ro=true\nro=true\nRead-only file system\nreceived\n",
        "the kernel's view of ubtrfs's read-only snapshots"
    );
    for p in ["s1", "s2"] {
        report(compare_walks(
            &format!("{p} received by the kernel"),
            &walk_mounted(&src.path(p)),
            &walk_mounted(&dst.path(p)),
            FIELDS,
        ));
    }
    // The kernel rewrites the ROOT_ITEMs of sv (a snapshot of it) and s1 (its
    // last_snapshot, by a snapshot of the snapshot): s1 stays read-only.
    sh(&format!(
        "cd {sq}; btrfs -q subvolume snapshot sv k; btrfs -q subvolume snapshot -r s1 k1; sync"
    ));
    dst.umount();
    src.umount();
    let src = KernelMount::new(&img, "ro");
    assert_eq!(
        sh(&format!(
            "cd {}; btrfs property get s1 ro",
            shell_quote(&src.path(""))
        )),
        "ro=true\n"
    );
    src.umount();
    check(&img, "after the kernel's snapshots");
    assert_eq!(
        UBTRFS.stdout(&["property", "get", s, "/s1", "ro"]).trim(),
        "ro=true"
    );
}

/// Snapshots of snapshots ten deep at 64 KiB nodes, each changed after it was
/// taken (a new file, a removed one, an overwritten one), then deleted in an order
/// that takes the middle, the origin and the newest first: offline by ubtrfs on
/// one twin, by the kernel on the other. After the chain and after the deletions
/// the kernel sees the same trees (`btrfs subvolume list -a -q -u -R` aside from
/// uuids and generations: the same ids, parents and paths), `btrfs check` is clean
/// with quotas counted, and the kernel then writes into every remaining snapshot
/// of the ubtrfs twin and deletes one more, and the image stays clean.
#[test]
fn snapshot_chain_ten_deep_at_64k_nodes_as_the_kernel() {
    if !require_root("snapshot_chain_ten_deep_at_64k_nodes_as_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("ubtrfs.img");
    let kimg = dir.path().join("kernel.img");
    mkfs_btrfs(&img, 1 << 30, &["-n", "65536"]);
    kernel_writes(
        &img,
        r#"set -eu
        btrfs quota enable .
        btrfs -q subvolume create s0
        python3 - <<'PY'
import os, random
random.seed(11)
for d in range(4):
    os.makedirs(f's0/d{d}')
    for i in range(500):
        with open(f's0/d{d}/f{i}', 'wb') as f:
            f.write(random.randbytes(200 if i % 4 else 9000))
PY
        btrfs quota rescan -w . >/dev/null
        sync"#,
        "the origin",
    );
    std::fs::copy(&img, &kimg).expect("twin image");
    let new_file = dir.path().join("new");
    std::fs::write(&new_file, b"a new file in the snapshot\n").expect("write");
    let s = img.to_str().expect("utf-8 path");
    let nf = new_file.to_str().expect("utf-8 path");
    let mut kernel_script = String::from("set -eu\n");
    for i in 1..=10 {
        let (prev, cur) = (format!("/s{}", i - 1), format!("/s{i}"));
        for args in [
            vec!["subvolume", "snapshot", s, &prev, &cur],
            vec!["put", s, nf, &format!("{cur}/new{i}")],
            vec!["rm", s, &format!("{cur}/d{}/f{}", i % 4, i * 7)],
            // Replaced, not rewritten in place (put does not overwrite): both sides.
            vec!["rm", s, &format!("{cur}/d{}/f{}", (i + 1) % 4, i * 11)],
            vec!["put", s, nf, &format!("{cur}/d{}/f{}", (i + 1) % 4, i * 11)],
        ] {
            let (ok, _, err) = UBTRFS.run(&args);
            assert!(ok, "{args:?}: {err}");
        }
        kernel_script.push_str(&format!(
            "btrfs -q subvolume snapshot s{p} s{i}; cp {nf} s{i}/new{i}; rm s{i}/d{a}/f{b}; \
             rm s{i}/d{c}/f{d}; cp {nf} s{i}/d{c}/f{d}\n",
            p = i - 1,
            a = i % 4,
            b = i * 7,
            c = (i + 1) % 4,
            d = i * 11,
        ));
    }
    kernel_script.push_str("sync\n");
    kernel_writes(&kimg, &kernel_script, "the kernel's chain");
    let list = |img: &Path| -> Vec<String> {
        let k = KernelMount::new(img, "ro");
        let text = sh(&format!(
            "btrfs subvolume list -a -q -u -R {}",
            shell_quote(&k.path(""))
        ));
        k.umount();
        // ID n gen g top level t parent_uuid p received_uuid r uuid u path P: the
        // ids, parents and paths (uuids are random, generations count commits).
        text.lines()
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let parent = if w[8] == "-" { "-" } else { "parent" };
                format!("{} {} {parent} {}", w[1], w[6], w[14..].join(" "))
            })
            .collect()
    };
    let compare_twins = |what: &str| {
        check(&img, what);
        check(&kimg, what);
        report(compare_walks(
            what,
            &kernel_tree(&kimg),
            &kernel_tree(&img),
            FIELDS,
        ));
        assert_eq!(list(&img), list(&kimg), "{what}: subvolume list");
    };
    compare_twins("a chain ten deep");
    let order = ["/s5", "/s0", "/s10", "/s3"];
    for p in order {
        let (ok, _, err) = UBTRFS.run(&["subvolume", "delete", s, p]);
        assert!(ok, "delete {p}: {err}");
    }
    kernel_writes(
        &kimg,
        "set -eu; for p in s5 s0 s10 s3; do btrfs -q subvolume delete $p; done
         btrfs subvolume sync . >/dev/null; sync",
        "the kernel's deletions",
    );
    compare_twins("after deleting s5, s0, s10, s3");
    let out = kernel_writes(
        &img,
        "set -eu; for i in 1 2 4 6 7 8 9; do echo more > s$i/more; rm s$i/d1/f3; done
         btrfs -q subvolume delete s7; btrfs subvolume sync . >/dev/null; sync; ls",
        "the kernel after ubtrfs's chain",
    );
    assert!(!out.contains("s7"), "s7 deleted by the kernel: {out}");
    check(&img, "after the kernel wrote into ubtrfs's snapshots");
}
