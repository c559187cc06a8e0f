//! `ubtrfs cp --reflink` and `ubtrfs dedupe` on images, against the kernel:
//! - cp: the same copies made by GNU cp on a kernel mount of a twin image and by
//!   `ubtrfs cp` offline give the same trees, and the kernel's `btrfs filesystem du`
//!   finds the same exclusive bytes in every copy (0 for a reflink, all for
//!   `--reflink=never`), across subvolumes too; existing files are overwritten in
//!   place (`-a` gives them the source's owner and mode) and existing directories
//!   merged into; a read-only snapshot refuses, and so does a file copied onto
//!   itself; through a mount, the kernel's cached pages, sizes and names of what
//!   was overwritten or added are gone at once;
//! - dedupe: on a tree with duplicates (a copy with some files changed),
//!   `ubtrfs dedupe` frees at least what `duperemove -dr` frees on a kernel mount of
//!   a twin image, the contents stay identical, `btrfs check` is clean, and the
//!   kernel then overwrites one of the shared copies without touching the other.
//!
//! - dedupe through a `ubtrfs mount` (the mount's process does it) finds and frees
//!   what the offline command does on a twin image, unsynced writes included.
//!
//! Needs root (loop devices, /dev/fuse); skipped with a line outside CI.

use std::path::{Path, PathBuf};
use ubtrfs_sim::golden::{compare_walks, report, walk_mounted};
use ubtrfs_sim::host::{bash_ok, btrfs_check, require_root, serial, sh, shell_quote, Ubtrfs};
use ubtrfs_sim::mount::{kernel_exclusive_bytes, kernel_writes, mkfs_btrfs, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// Contents, not times or inode numbers (copies get new ones on both sides).
const CONTENT_FIELDS: &[&str] = &["type", "mode", "uid", "gid", "nlink", "size", "sha256"];

/// Files of every kind of extent layout, and a subvolume.
const SOURCE: &str = r#"
set -eu
python3 - <<'PY'
import os, random
random.seed(11)
os.makedirs('d/sub', exist_ok=True)
open('d/big', 'wb').write(random.randbytes(5 * 1048576 + 123))
open('d/aligned', 'wb').write(random.randbytes(256 * 1024))
open('d/aligned2', 'wb').write(random.randbytes(256 * 1024))
open('d/small', 'wb').write(b'inline\n' * 50)
with open('d/holey', 'wb') as f:
    f.truncate(2 << 20)
    f.seek(700000)
    f.write(random.randbytes(90000))
open('d/sub/x', 'wb').write(random.randbytes(70000))
os.symlink('big', 'd/link')
os.chown('d/sub/x', 1000, 1000)
PY
btrfs -q subvolume create sv
btrfs -q subvolume snapshot -r sv ro
sync
"#;

/// Two identical images holding what `script` wrote on a kernel mount: (ubtrfs's,
/// the kernel's).
fn twin_images(dir: &Path, script: &str) -> (PathBuf, PathBuf) {
    let img = dir.join("ubtrfs.img");
    let kimg = dir.join("kernel.img");
    mkfs_btrfs(&img, 512 << 20, &[]);
    kernel_writes(&img, script, "source tree");
    std::fs::copy(&img, &kimg).expect("twin image");
    (img, kimg)
}

/// Data bytes used, from the kernel's `btrfs filesystem df -b` of a mount.
fn data_used(mnt: &Path) -> u64 {
    let text = sh(&format!("btrfs filesystem df -b {}", shell_quote(mnt)));
    text.lines()
        .find(|l| l.starts_with("Data,"))
        .and_then(|l| l.split("used=").nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("btrfs filesystem df: {text}"))
}

const COPIES: &[&str] = &[
    "d2/big",
    "d2/aligned",
    "d2/holey",
    "d2/sub/x",
    "sv/big",
    "bignever",
    "autocopy",
];

#[test]
fn cp_reflink_shares_as_the_kernel() {
    if !require_root("cp_reflink_shares_as_the_kernel") {
        return;
    }
    cp_as_the_kernel(false);
}

/// The same copies made through a `ubtrfs mount` (its process copies: UBTRFS_IOC_CP),
/// `--reflink=always` included; the mount shows them at once, and the kernel's
/// view of the image after the unmount is the same as after the offline copies.
#[test]
fn cp_through_a_mount_shares_as_the_kernel() {
    if !ubtrfs_sim::host::require_fuse("cp_through_a_mount_shares_as_the_kernel") {
        return;
    }
    cp_as_the_kernel(true);
}

fn cp_as_the_kernel(through_mount: bool) {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (img, kimg) = twin_images(dir.path(), SOURCE);

    kernel_writes(
        &kimg,
        "cp -r --reflink=always d d2; cp --reflink=always d/big sv/big; \
         cp --reflink=never d/big bignever; cp --reflink=auto d/aligned autocopy; \
         cp --reflink=always d/aligned d2/holey; cp --reflink=always d/aligned d2/aligned2; \
         cp -a --reflink=always d/sub/x autocopy; \
         cp -r --reflink=always sv d2/sub; cp --reflink=always d/small d2/sub/sv/small; \
         cp -r --reflink=always d2/sub/sv .; sync",
        "kernel copies",
    );
    let mut fm = through_mount
        .then(|| ubtrfs_sim::mount::FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]));
    let target = match &fm {
        Some(m) => m.mnt.to_str().expect("utf-8 path").to_string(),
        None => img.to_str().expect("utf-8 path").to_string(),
    };
    let img_s = target.as_str();
    if let Some(m) = &fm {
        // Looked up before they exist: the kernel may cache "no such name".
        bash_ok(
            &m.mnt,
            "test ! -e bignever && test ! -e d2 && test ! -e sv/big",
        )
        .unwrap_or_else(|e| panic!("before the copies: {e}"));
    }
    for args in [
        &["cp", img_s, "/d", "/d2", "-r", "--reflink=always"][..],
        &["cp", img_s, "/d/big", "/sv/", "--reflink=always"],
        &["cp", img_s, "/d/big", "/bignever", "--reflink=never"],
        &["cp", img_s, "/d/aligned", "/autocopy"],
    ] {
        UBTRFS.stdout(args);
    }
    // Overwrites: a file in place (and a copy of a file onto itself is refused).
    if let Some(m) = &fm {
        // The kernel holds the old pages and sizes of d2/holey and d2/aligned2 (the
        // same size as its new contents: only the pages tell), an open descriptor
        // keeps the latter's inode, and "no such name" for d2/sub/sv.
        bash_ok(
            &m.mnt,
            &format!(
                "exec 3<d2/aligned2; cat d2/holey d2/aligned2 autocopy >/dev/null; \
                 test ! -e d2/sub/sv; \
                 {bin} cp . /d/aligned /d2/holey --reflink=always; \
                 {bin} cp . /d/aligned /d2/aligned2 --reflink=always; \
                 cmp - d/aligned <&3; test \"$(stat -c %s d2/holey)\" = 262144; \
                 cmp d/aligned d2/holey",
                bin = UBTRFS.bin
            ),
        )
        .unwrap_or_else(|e| panic!("overwrite through the mount: {e}"));
    } else {
        UBTRFS.stdout(&["cp", img_s, "/d/aligned", "/d2/holey", "--reflink=always"]);
        UBTRFS.stdout(&[
            "cp",
            img_s,
            "/d/aligned",
            "/d2/aligned2",
            "--reflink=always",
        ]);
    }
    for args in [
        &[
            "cp",
            img_s,
            "-a",
            "/d/sub/x",
            "/autocopy",
            "--reflink=always",
        ][..],
        &["cp", img_s, "-r", "/sv", "/d2/sub", "--reflink=always"],
        &[
            "cp",
            img_s,
            "/d/small",
            "/d2/sub/sv/small",
            "--reflink=always",
        ],
        // Merged into the subvolume sv (another tree): big again, small anew.
        &["cp", img_s, "-r", "/d2/sub/sv", "/", "--reflink=always"],
    ] {
        UBTRFS.stdout(args);
    }
    let (ok, _, err) = UBTRFS.run(&["cp", img_s, "/d/big", "/d/big"]);
    assert!(
        !ok && err.contains("same file"),
        "cp of a file onto itself: {err}"
    );
    // What the kernel refuses: writing into a read-only snapshot; a directory
    // without -r.
    let (ok, _, err) = UBTRFS.run(&["cp", img_s, "/d/big", "/ro/big"]);
    assert!(
        !ok && err.contains("Read-only"),
        "cp into a ro snapshot: {err}"
    );
    let (ok, _, err) = UBTRFS.run(&["cp", img_s, "/d", "/d3"]);
    assert!(
        !ok && err.to_lowercase().contains("is a directory"),
        "cp of a directory: {err}"
    );
    if let Some(m) = fm.as_mut() {
        // The mount shows the copies at once (no stale "no such name", size, owner
        // or pages).
        bash_ok(
            &m.mnt,
            "cmp d/big bignever && cmp d/big sv/big && cmp -s d/small d2/small && \
             cmp sv/big d2/sub/sv/big && cmp d/sub/x autocopy && cmp d/small sv/small && \
             test \"$(stat -c %s:%u:%a autocopy)\" = \"$(stat -c %s:%u:%a d/sub/x)\"",
        )
        .unwrap_or_else(|e| panic!("copies seen through the mount: {e}"));
        let st = m.unmount();
        assert!(st.success(), "server exit {st}: {}", m.log());
    }

    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after ubtrfs cp: {e}"));
    let k = KernelMount::new(&kimg, "ro");
    let kernel_tree = walk_mounted(&k.path(""));
    let kernel_excl = kernel_exclusive_bytes(&k.path(""), COPIES);
    k.umount();
    let k = KernelMount::new(&img, "rw");
    let ours_tree = walk_mounted(&k.path(""));
    let ours_excl = kernel_exclusive_bytes(&k.path(""), COPIES);
    report(compare_walks(
        "ubtrfs cp vs GNU cp on the kernel",
        &kernel_tree,
        &ours_tree,
        CONTENT_FIELDS,
    ));
    assert_eq!(ours_excl, kernel_excl, "exclusive bytes per copy");
    assert_eq!(ours_excl["d2/big"], 0, "a reflink owns nothing");
    assert_eq!(
        ours_excl["sv/big"], 0,
        "a reflink across subvolumes owns nothing"
    );
    assert!(ours_excl["bignever"] >= 5 << 20, "--reflink=never copies");
    // The kernel overwrites one reflinked copy; the source keeps its bytes.
    bash_ok(
        &k.path(""),
        "set -e; want=$(sha256sum < d/big); \
         dd if=/dev/zero of=d2/big bs=64K count=4 seek=3 conv=notrunc status=none; sync; \
         test \"$(sha256sum < d/big)\" = \"$want\"; ! cmp -s d/big d2/big",
    )
    .unwrap_or_else(|e| panic!("kernel overwrite of a copy: {e}"));
    k.umount();
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after the kernel: {e}"));
}

/// A tree and a copy of it with about 10% of the files changed (GNU cp with
/// --reflink=never: nothing shared yet).
const DUPLICATES: &str = r#"
set -eu
python3 - <<'PY'
import os, random
random.seed(5)
os.makedirs('a/deep', exist_ok=True)
sizes = [3000, 9000, 70000, 131072, 200000, 1048576, 3 * 1048576 + 77, 10 * 1048576]
for i in range(40):
    d = 'a/deep' if i % 3 == 0 else 'a'
    open(f'{d}/f{i}', 'wb').write(random.randbytes(sizes[i % len(sizes)]))
PY
cp -r --reflink=never a b
python3 - <<'PY'
import os
for i in range(0, 40, 10):
    d = 'b/deep' if i % 3 == 0 else 'b'
    p = f'{d}/f{i}'
    with open(p, 'r+b') as f:
        f.seek(os.path.getsize(p) // 2)
        f.write(b'changed')
PY
sync
"#;

#[test]
fn dedupe_frees_what_duperemove_frees() {
    if !require_root("dedupe_frees_what_duperemove_frees") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (img, kimg) = twin_images(dir.path(), DUPLICATES);

    let k = KernelMount::new(&kimg, "rw");
    let before_tree = walk_mounted(&k.path(""));
    let before = data_used(&k.path(""));
    bash_ok(&k.path(""), "duperemove -dr -q . >/dev/null; sync")
        .unwrap_or_else(|e| panic!("duperemove: {e}"));
    let duperemove_used = data_used(&k.path(""));
    k.umount();

    let img_s = img.to_str().expect("utf-8 path");
    let dry = UBTRFS.stdout(&["dedupe", img_s, "--dry-run"]);
    assert!(dry.contains("Would deduplicate"), "{dry}");
    let out = UBTRFS.stdout(&["dedupe", img_s, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("dedupe json");
    let freed = v["bytes_freed"].as_u64().expect("bytes_freed");
    // A second run finds everything already shared.
    let again = UBTRFS.stdout(&["dedupe", img_s, "/a", "/b", "--format", "json"]);
    let v2: serde_json::Value = serde_json::from_str(&again).expect("dedupe json");
    assert_eq!(v2["bytes_deduped"], 0, "second run: {again}");
    assert_eq!(v2["bytes_freed"], 0, "second run: {again}");

    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after dedupe: {e}"));
    let k = KernelMount::new(&img, "rw");
    let after_tree = walk_mounted(&k.path(""));
    let ours_used = data_used(&k.path(""));
    report(compare_walks(
        "contents before and after ubtrfs dedupe",
        &before_tree,
        &after_tree,
        CONTENT_FIELDS,
    ));
    eprintln!(
        "dedupe: data used {before} -> ubtrfs {ours_used} (reported freed {freed}), \
         duperemove {duperemove_used}"
    );
    assert_eq!(
        before - ours_used,
        freed,
        "reported vs kernel-measured bytes freed"
    );
    assert!(
        ours_used <= duperemove_used,
        "ubtrfs dedupe left {ours_used} bytes used, duperemove {duperemove_used}"
    );
    assert!(freed > 20 << 20, "the duplicates were found: {out}");
    bash_ok(
        &k.path(""),
        "set -e; want=$(sha256sum < a/f7); \
         dd if=/dev/zero of=b/f7 bs=4K count=8 seek=5 conv=notrunc status=none; sync; \
         test \"$(sha256sum < a/f7)\" = \"$want\"; ! cmp -s a/f7 b/f7",
    )
    .unwrap_or_else(|e| panic!("kernel overwrite of a deduplicated file: {e}"));
    k.umount();
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after the kernel: {e}"));
}

/// `ubtrfs dedupe MNT` asks the mount's process (UBTRFS_IOC_DEDUPE): on twin images
/// it finds and frees exactly what the offline command does; then data written
/// through the mount and not yet synced (waiting for extents) is deduplicated too;
/// after the unmount the image is `btrfs check` clean, the kernel shows what the
/// mount showed and counts the data used the mount's report gave, and it overwrites
/// one shared copy without touching the other.
#[test]
fn dedupe_through_a_mount_as_offline() {
    if !ubtrfs_sim::host::require_fuse("dedupe_through_a_mount_as_offline") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (img, offline) = twin_images(dir.path(), DUPLICATES);
    let json = |out: &str| -> serde_json::Value {
        serde_json::from_str(out).unwrap_or_else(|e| panic!("dedupe json ({e}): {out}"))
    };
    let keys = [
        "files",
        "bytes_scanned",
        "ranges",
        "bytes_deduped",
        "bytes_freed",
    ];
    let off = json(&UBTRFS.stdout(&[
        "dedupe",
        offline.to_str().expect("utf-8"),
        "--format",
        "json",
    ]));

    let mut fm = ubtrfs_sim::mount::FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let mnt = fm.mnt.to_str().expect("utf-8").to_string();
    let dry = UBTRFS.stdout(&["dedupe", &mnt, "--dry-run"]);
    assert!(dry.contains("Would deduplicate"), "{dry}");
    let on = json(&UBTRFS.stdout(&["dedupe", &mnt, "--format", "json"]));
    for k in keys {
        assert_eq!(on[k], off[k], "{k}: through the mount {on}, offline {off}");
    }
    assert!(on["bytes_freed"].as_u64().unwrap_or(0) > 20 << 20, "{on}");
    // A copy written through the mount, still in the daemon's delayed allocation.
    bash_ok(&fm.mnt, "cp -r --reflink=never a c").unwrap_or_else(|e| panic!("cp: {e}"));
    let again = json(&UBTRFS.stdout(&["dedupe", &mnt, "a", "/c", "--format", "json"]));
    let a_bytes: u64 = sh(&format!(
        "du -sb --apparent-size {}/a | cut -f1",
        shell_quote(&fm.mnt)
    ))
    .trim()
    .parse()
    .expect("du");
    assert!(
        again["bytes_deduped"].as_u64().unwrap_or(0) >= a_bytes - (1 << 20),
        "the unsynced copy of a ({a_bytes} bytes) shares it: {again}"
    );
    let (ok, _, err) = UBTRFS.run(&["dedupe", &mnt, "../x"]);
    assert!(!ok && err.contains("Invalid argument"), "{err}");
    let seen = walk_mounted(&fm.mnt);
    let st = fm.unmount();
    assert!(st.success(), "server exit {st}: {}", fm.log());

    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after dedupe: {e}"));
    let k = KernelMount::new(&img, "rw");
    report(compare_walks(
        "the kernel against the mount after dedupe",
        &seen,
        &walk_mounted(&k.path("")),
        CONTENT_FIELDS,
    ));
    assert_eq!(
        data_used(&k.path("")),
        again["data_used_after"].as_u64().expect("data_used_after"),
        "data used as the mount's report said: {again}"
    );
    bash_ok(
        &k.path(""),
        "set -e; want=$(sha256sum < a/f7); \
         dd if=/dev/zero of=c/f7 bs=4K count=8 seek=5 conv=notrunc status=none; sync; \
         test \"$(sha256sum < a/f7)\" = \"$want\"; ! cmp -s a/f7 c/f7",
    )
    .unwrap_or_else(|e| panic!("kernel overwrite of a deduplicated file: {e}"));
    k.umount();
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after the kernel: {e}"));
}
