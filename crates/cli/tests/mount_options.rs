//! The kernel's btrfs mount options on `ubtrfs mount`, and filesystems made before
//! the free-space tree (the v1 space cache, mkfs.btrfs before btrfs-progs 5.15):
//!
//! - a v1-cache filesystem the kernel wrote is converted to the free-space tree by
//!   `ubtrfs tune --convert-to-free-space-tree` and by `ubtrfs mount -o
//!   space_cache=v2`, with the same result as `btrfstune --convert-to-free-space-tree`
//!   and the kernel's own `-o space_cache=v2` mount on copies of the same image (the
//!   free-space items of every data block group, the root tree's keys, the
//!   superblock's flags and cache_generation); `-o clear_cache` rebuilds a tree
//!   btrfs-progs removed; writing without converting is refused, naming the way out;
//! - options that change what is written (`nodatacow`, `nodatasum`, `max_inline`)
//!   give the same inode flags and inline extents as the kernel's mount with them;
//!   the options a kernel's fstab line carries (`ssd`, `discard=async`, ...) mount;
//! - the UUID tree is rebuilt when missing and checked when stale or with
//!   `rescan_uuid_tree`, as by the kernel's mount.
//!
//! Needs root (/dev/fuse, loop devices) and btrfs-progs; skipped with a line outside
//! CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use ubtrfs_sim::host::{bash_ok, btrfs_check, require_fuse, serial, shell_quote, Ubtrfs};
use ubtrfs_sim::mount::{kernel_round_trip, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// `btrfs inspect-internal dump-tree` of one tree (or `-t` value) of an image.
fn dump_tree(img: &Path, tree: &str) -> String {
    bash_ok(
        Path::new("/"),
        &format!(
            "btrfs inspect-internal dump-tree -t {tree} {}",
            shell_quote(img)
        ),
    )
    .unwrap_or_else(|e| panic!("dump-tree {tree}: {e}"))
}

/// The item keys of a tree dump, `(objectid TYPE offset)` as printed.
fn keys(dump: &str) -> Vec<String> {
    dump.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            if !l.starts_with("item ") {
                return None;
            }
            let a = l.find("key (")?;
            let b = l[a..].find(')')?;
            Some(l[a + 4..a + b + 1].to_string())
        })
        .collect()
}

/// The starts and lengths of the DATA block groups (from the extent tree's
/// BLOCK_GROUP_ITEMs).
fn data_groups(img: &Path) -> Vec<(u64, u64)> {
    let d = dump_tree(img, "extent");
    let mut out = Vec::new();
    let mut lines = d.lines().peekable();
    while let Some(l) = lines.next() {
        if !l.contains("BLOCK_GROUP_ITEM") {
            continue;
        }
        let is_data = lines
            .peek()
            .is_some_and(|n| n.contains("flags DATA") && !n.contains("METADATA"));
        let k = keys(l);
        let parts: Vec<&str> = k
            .first()
            .map(|k| {
                k.trim_matches(|c| c == '(' || c == ')')
                    .split(' ')
                    .collect()
            })
            .unwrap_or_default();
        if is_data && parts.len() == 3 {
            out.push((
                parts[0].parse().expect("group start"),
                parts[2].parse().expect("group length"),
            ));
        }
    }
    assert!(!out.is_empty(), "no data block group in {}", img.display());
    out
}

/// The free-space tree's keys inside the data block groups: what a conversion
/// writes for them, independent of where each tool put its own tree blocks.
fn data_free_space(img: &Path) -> Vec<String> {
    let groups = data_groups(img);
    keys(&dump_tree(img, "10"))
        .into_iter()
        .filter(|k| {
            let start: u64 = k
                .trim_start_matches('(')
                .split(' ')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            groups.iter().any(|&(s, l)| start >= s && start < s + l)
        })
        .collect()
}

/// Fields of `btrfs inspect-internal dump-super` by name (the line's first word),
/// None where the dump has no such line.
fn super_values<const N: usize>(img: &Path, names: [&str; N]) -> [Option<String>; N] {
    let out = bash_ok(
        Path::new("/"),
        &format!("btrfs inspect-internal dump-super {}", shell_quote(img)),
    )
    .expect("dump-super");
    names.map(|name| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(str::to_string)
    })
}

/// compat_ro_flags and cache_generation from the superblock.
fn super_fields(img: &Path) -> (String, String) {
    let [flags, cache] = super_values(img, ["compat_ro_flags", "cache_generation"]);
    (flags.unwrap_or_default(), cache.unwrap_or_default())
}

/// Copies an image, keeping it sparse.
fn copy(from: &Path, to: &Path) {
    bash_ok(
        Path::new("/"),
        &format!(
            "cp --sparse=always {} {}",
            shell_quote(from),
            shell_quote(to)
        ),
    )
    .expect("copy image");
}

#[test]
fn v1_space_cache_is_converted_like_btrfstune_and_the_kernel() {
    if !require_fuse("v1_space_cache_is_converted_like_btrfstune_and_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let v1 = dir.path().join("v1.img");
    mkfs_btrfs(&v1, 1 << 30, &["-O", "^free-space-tree"]);
    // The kernel's default on such a filesystem is space_cache (v1): it writes a
    // cache inode per block group it changed.
    let km = KernelMount::new(&v1, "space_cache=v1");
    bash_ok(
        &km.mnt,
        "cp -a /usr/share/doc/apt* . 2>/dev/null || cp -a /etc .
         head -c 30M /dev/urandom > big; head -c 5M /dev/urandom > gone
         mkdir d; for i in $(seq 200); do echo $i > d/$i; done
         sync; rm gone d/1*; sync",
    )
    .expect("kernel workload");
    km.umount();
    let rt = dump_tree(&v1, "root");
    assert!(
        rt.contains("FREE_SPACE UNTYPED"),
        "the kernel wrote no v1 space cache:\n{rt}"
    );
    assert_eq!(super_fields(&v1).0, "0x0");

    // Writing without converting is refused, and says how to convert.
    let v1_arg = v1.to_str().expect("utf-8 path");
    let host = dir.path().join("host.txt");
    std::fs::write(&host, "x").expect("host file");
    let (ok, _, err) = UBTRFS.run(&["put", v1_arg, host.to_str().expect("utf-8"), "/x"]);
    assert!(
        !ok && err.contains("tune --convert-to-free-space-tree") && err.contains("space_cache=v2"),
        "put on a v1-cache image: {err}"
    );
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let (ok, _, err) = UBTRFS.run(&["mount", v1_arg, mnt.to_str().expect("utf-8"), "-o", "rw"]);
    assert!(!ok && err.contains("space_cache=v2"), "mount -o rw: {err}");

    // The same image converted four ways.
    let progs = dir.path().join("progs.img");
    let tune = dir.path().join("tune.img");
    let kernel = dir.path().join("kernel.img");
    let mounted = dir.path().join("mounted.img");
    for p in [&progs, &tune, &kernel, &mounted] {
        copy(&v1, p);
    }
    bash_ok(
        Path::new("/"),
        &format!(
            "btrfstune --convert-to-free-space-tree {}",
            shell_quote(&progs)
        ),
    )
    .expect("btrfstune");
    let out = UBTRFS.stdout(&[
        "tune",
        "--convert-to-free-space-tree",
        tune.to_str().expect("utf-8"),
    ]);
    assert_eq!(out, "Converted to free space tree feature\n");
    let (ok, _, err) = UBTRFS.run(&[
        "tune",
        "--convert-to-free-space-tree",
        tune.to_str().expect("utf-8"),
    ]);
    assert!(!ok && err.contains("already has free-space-tree"), "{err}");
    KernelMount::new(&kernel, "space_cache=v2").umount();
    let fm = FuseMount::start(&UBTRFS, &[&mounted], &["rw,space_cache=v2"]);
    bash_ok(&fm.mnt, "echo new > d/new; rm -rf apt* etc")
        .unwrap_or_else(|e| panic!("writing after the conversion: {e}\n{}", fm.log()));
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&mounted, &seen, "v1 cache converted at mount");

    let want = data_free_space(&progs);
    for (img, who) in [(&tune, "ubtrfs tune"), (&kernel, "the kernel's mount")] {
        btrfs_check(img, None).unwrap_or_else(|e| panic!("{who}: {e}"));
        assert_eq!(super_fields(img), ("0x3".into(), "0".into()), "{who}");
        assert_eq!(
            data_free_space(img),
            want,
            "{who}: free space of the data groups"
        );
        let k: BTreeSet<String> = keys(&dump_tree(img, "root")).into_iter().collect();
        let p: BTreeSet<String> = keys(&dump_tree(&progs, "root")).into_iter().collect();
        assert_eq!(k, p, "{who}: root tree keys against btrfstune's");
    }
    assert_eq!(super_fields(&mounted), ("0x3".into(), "0".into()));

    // A tree log the kernel left on a v1-cache filesystem (fsyncs, then a copy of
    // the image while it is still mounted) is replayed before the conversion: the
    // log's blocks are in no extent tree and must not be allocated over.
    let logged = dir.path().join("logged.img");
    let replayed = dir.path().join("replayed.img");
    let km = KernelMount::new(&v1, "commit=300");
    bash_ok(
        &km.mnt,
        &format!(
            "echo a > f1; head -c 1M /dev/urandom > f2; sync
             python3 -c \"
import os
for n, b in (('f1', b'z' * 20000), ('f2', b'y' * 3000000)):
    fd = os.open(n, os.O_WRONLY | os.O_APPEND); os.write(fd, b); os.fsync(fd)\"
             cp --sparse=always {v1} {logged}; cp --sparse=always {v1} {replayed}",
            v1 = shell_quote(&v1),
            logged = shell_quote(&logged),
            replayed = shell_quote(&replayed)
        ),
    )
    .expect("kernel fsyncs");
    km.umount();
    let dump = bash_ok(
        Path::new("/"),
        &format!("btrfs inspect-internal dump-super {}", shell_quote(&logged)),
    )
    .expect("dump-super");
    assert!(
        dump.lines()
            .any(|l| l.starts_with("log_root\t") && !l.ends_with("\t0")),
        "the kernel left no tree log:\n{dump}"
    );
    let fm = FuseMount::start(&UBTRFS, &[&logged], &["rw,space_cache=v2"]);
    let seen = fm.walk_and_unmount();
    btrfs_check(&logged, None).unwrap_or_else(|e| panic!("log replayed, converted: {e}"));
    assert_eq!(super_fields(&logged), ("0x3".into(), "0".into()));
    // The kernel's own replay of the same copy shows the same files.
    // (Read-write: on a read-only loop device the kernel refuses to replay.)
    let k = KernelMount::new(&replayed, "");
    let theirs = ubtrfs_sim::golden::walk_mounted(&k.mnt);
    k.umount();
    ubtrfs_sim::golden::report(ubtrfs_sim::golden::compare_walks(
        "v1 cache, log replayed then converted, against the kernel's replay",
        &seen,
        &theirs,
        &["type", "mode", "nlink", "size", "sha256"],
    ));

    // clear_cache rebuilds a free-space tree: one btrfs-progs removed, and one intact.
    bash_ok(
        Path::new("/"),
        &format!("btrfs rescue clear-space-cache v2 {}", shell_quote(&tune)),
    )
    .expect("btrfs rescue clear-space-cache v2");
    assert_eq!(super_fields(&tune).0, "0x0");
    // Without the tree, clear_cache alone is refused (the kernel would rebuild a v1
    // cache); with space_cache=v2 it is created.
    let (ok, _, err) = UBTRFS.run(&[
        "mount",
        tune.to_str().expect("utf-8"),
        mnt.to_str().expect("utf-8"),
        "-o",
        "rw,clear_cache",
    ]);
    assert!(
        !ok && err.contains("space_cache=v2"),
        "clear_cache without a tree: {err}"
    );
    for (round, opts) in [
        ("removed", "rw,clear_cache,space_cache=v2"),
        ("intact", "rw,clear_cache"),
    ] {
        let fm = FuseMount::start(&UBTRFS, &[&tune], &[opts]);
        let seen = fm.walk_and_unmount();
        kernel_round_trip(&tune, &seen, &format!("clear_cache, tree {round}"));
        assert_eq!(super_fields(&tune).0, "0x3", "{round}");
        assert_eq!(data_free_space(&tune), want, "clear_cache, tree {round}");
    }
}

/// Twin images in `dir`: one fresh filesystem written by `script` through the
/// kernel's mount with `kernel_opts` (`k.img`) and its copy written by the same
/// script through `ubtrfs mount -o rw,OPTS` (`u.img`), which the kernel then reads
/// back identically. Returns (kernel's image, ubtrfs's image).
fn twins(dir: &Path, kernel_opts: &str, opts: &str, script: &str) -> (PathBuf, PathBuf) {
    let k = dir.join("k.img");
    let u = dir.join("u.img");
    mkfs_btrfs(&k, 1 << 30, &[]);
    copy(&k, &u);
    let km = KernelMount::new(&k, kernel_opts);
    bash_ok(&km.mnt, script).unwrap_or_else(|e| panic!("kernel -o {kernel_opts}: {e}"));
    km.umount();
    let fm = FuseMount::start(&UBTRFS, &[&u], &["rw", opts]);
    bash_ok(&fm.mnt, script).unwrap_or_else(|e| panic!("-o {opts}: {e}\n{}", fm.log()));
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&u, &seen, opts);
    (k, u)
}

#[test]
fn kernel_mount_options_have_the_kernels_effect() {
    if !require_fuse("kernel_mount_options_have_the_kernels_effect") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = "mkdir d; head -c 150 /dev/zero > d/a; head -c 90 /dev/zero > d/b
                  head -c 100000 /dev/zero > d/c; head -c 3000 /dev/zero > d/m
                  mkfifo d/p; ln -s a d/s";
    for opts in [
        "nodatacow,max_inline=100",
        "nodatasum,max_inline=0",
        "max_inline=9000",
        "max_inline=3k",
    ] {
        let (k, u) = twins(dir.path(), opts, opts, script);
        assert_eq!(
            extent_kinds(&u, true),
            extent_kinds(&k, true),
            "-o {opts}: inode flags, inline data"
        );
    }

    // Only small files compressed inline still mark the filesystem as using zstd
    // (incompat COMPRESS_ZSTD), as on the kernel.
    let incompat = |img: &Path| {
        bash_ok(
            Path::new("/"),
            &format!(
                "btrfs inspect-internal dump-super {} | grep ^incompat_flags",
                shell_quote(img)
            ),
        )
        .expect("dump-super")
    };
    // Also what the kernel's heuristic decides before compressing: random data
    // (written plain, inode not marked), random data with a compressible part.
    // (Each file made outside first and copied in by one writer: ubtrfs judges
    // what arrives apart apart, the kernel its whole dirty range.)
    let small = "yes | head -c 3000 > s; echo tiny > t; head -c 3000 /dev/urandom > r
                 x=$(mktemp -d)
                 { head -c 126K /dev/urandom; head -c 2K /dev/zero; } > $x/m1
                 { head -c 120K /dev/urandom; head -c 8K /dev/zero; } > $x/m2
                 { head -c 64K /dev/urandom; yes | head -c 64K; } > $x/m3
                 yes 'hello world' | head -c 240K > $x/m4
                 cp $x/m1 $x/m2 $x/m3 $x/m4 .; rm -r $x";
    let (k, u) = twins(dir.path(), "compress=zstd", "compress=zstd", small);
    let flags = incompat(&u);
    let bits = flags
        .split_whitespace()
        .nth(1)
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    assert!(bits & 0x10 != 0, "COMPRESS_ZSTD (0x10) missing: {flags}");
    assert_eq!(flags, incompat(&k));
    assert_eq!(
        extent_kinds(&u, false),
        extent_kinds(&k, false),
        "zstd: small files, heuristic"
    );

    // The options of a kernel's fstab line mount; the few ubtrfs cannot honour are
    // refused with their reason.
    let img = dir.path().join("f.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    let fstab = "rw,noatime,compress=zstd:1,ssd,discard=async,space_cache=v2,autodefrag,\
                 commit=120,thread_pool=4,skip_balance,flushoncommit,enospc_debug,barrier,\
                 acl,fatal_errors=bug,datacow,datasum,compress=no,nossd,nodiscard,\
                 metadata_ratio=2,subvol=/";
    KernelMount::new(&img, fstab).umount();
    let fm = FuseMount::start(&UBTRFS, &[&img], &[fstab]);
    bash_ok(&fm.mnt, "echo hi > f").unwrap_or_else(|e| panic!("{e}\n{}", fm.log()));
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&img, &seen, "fstab options");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let img_arg = img.to_str().expect("utf-8 path");
    for (opt, why) in [
        ("nobarrier", "always flushes"),
        ("noacl", "POSIX ACLs"),
        ("space_cache=v1", "only the free-space tree"),
        ("bogus", "unknown mount option"),
    ] {
        let (ok, _, err) = UBTRFS.run(&[
            "mount",
            img_arg,
            mnt.to_str().expect("utf-8"),
            "-o",
            &format!("rw,{opt}"),
        ]);
        assert!(!ok && err.contains(why), "-o {opt}: {err}");
    }
}

/// Bytes the host has allocated for an image file.
fn allocated(img: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(img).expect("stat image").blocks() * 512
}

/// `-o discard`: once the commit that freed them is on disk, the freed extents are
/// discarded, so an image file gives the host the space of a deleted file back, as
/// the kernel's loop mount with `discard=sync` does (its loop device punches holes);
/// without the option nothing is discarded until fstrim.
#[test]
fn discard_gives_freed_space_back_like_the_kernel() {
    if !require_fuse("discard_gives_freed_space_back_like_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let write = "head -c 60M /dev/urandom > big; head -c 20M /dev/urandom > keep
                 echo kept > small; btrfs filesystem sync .";
    let delete = "rm big; btrfs filesystem sync .; btrfs filesystem sync .";
    let mb = |b: u64| b / (1 << 20);
    // Per side: MB given back by the deletion, and MB the host gained over a full
    // data balance (which copies `keep` to a new block group and removes the old
    // one: with discard, the removed group is discarded whole).
    let mut freed = Vec::new();
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    for side in ["kernel discard=sync", "ubtrfs discard", "ubtrfs nodiscard"] {
        let img = dir.path().join("d.img");
        let _ = std::fs::remove_file(&img);
        mkfs_btrfs(&img, 1 << 30, &[]);
        let run = |mnt: &Path, balance: &str| {
            bash_ok(mnt, write).unwrap_or_else(|e| panic!("{side}: {e}"));
            let before = allocated(&img);
            bash_ok(mnt, delete).unwrap_or_else(|e| panic!("{side}: {e}"));
            let after = allocated(&img);
            bash_ok(
                mnt,
                &format!("{balance} >/dev/null; btrfs filesystem sync .; btrfs filesystem sync ."),
            )
            .unwrap_or_else(|e| panic!("{side}: balance: {e}"));
            let balanced = allocated(&img);
            (
                mb(before.saturating_sub(after)),
                mb(balanced.saturating_sub(after)),
            )
        };
        let got = if side.starts_with("kernel") {
            let km = KernelMount::new(&img, "discard=sync");
            let got = run(&km.mnt, "btrfs balance start -d --full-balance .");
            km.umount();
            got
        } else {
            let opt = if side.ends_with("nodiscard") {
                "nodiscard"
            } else {
                "discard"
            };
            let fm = FuseMount::start(&UBTRFS, &[&img], &["rw", opt]);
            let got = run(&fm.mnt, &format!("{u} balance start . -d --full-balance"));
            let seen = fm.walk_and_unmount();
            kernel_round_trip(&img, &seen, side);
            got
        };
        freed.push((side, got));
    }
    let got = |s: &str| freed.iter().find(|f| f.0 == s).map_or((0, 0), |f| f.1);
    assert!(got("kernel discard=sync").0 >= 55, "{freed:?}");
    assert!(got("ubtrfs discard").0 >= 55, "{freed:?}");
    assert!(got("ubtrfs nodiscard").0 < 5, "{freed:?}");
    // The balance wrote `keep` (20 MB) again; with discard its old place went back.
    assert!(got("kernel discard=sync").1 < 10, "{freed:?}");
    assert!(got("ubtrfs discard").1 < 10, "{freed:?}");
    assert!(got("ubtrfs nodiscard").1 >= 15, "{freed:?}");
}

/// The subvolume ioctls from users other than root, as `ubtrfs subvolume` issues them
/// on a mounted directory (BTRFS_IOC_SUBVOL_CREATE, SNAP_CREATE, SNAP_DESTROY): the
/// same steps on a kernel loop mount and on a ubtrfs mount (allow_other), without and
/// with `user_subvol_rm_allowed`, give the same outcome each (the errno's text), and
/// the new subvolume roots the same owner and mode: creating needs write permission
/// on the directory, a snapshot owning its source, deleting CAP_SYS_ADMIN or the
/// option plus write permission on the subvolume's root, and rmdir's sticky-bit rule.
#[test]
fn subvolume_ioctls_check_permissions_like_the_kernel() {
    if !require_fuse("subvolume_ioctls_check_permissions_like_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    let script = format!(
        r#"set +e
        U={u}
        as() {{ setpriv --reuid="$1" --regid="$1" --clear-groups -- "${{@:2}}"; }}
        step() {{
            local name=$1; shift
            if out=$("$@" 2>&1); then echo "$name: ok"; else
                echo "$name: $(echo "$out" | grep -o 'Permission denied\|Operation not permitted\|Read-only file system\|Invalid argument\|No such file or directory\|Directory not empty\|File exists' | head -1)"
            fi
        }}
        mkdir pub priv sticky && chmod 777 pub && chmod 755 priv && chmod 1777 sticky
        $U subvolume create . rootsub >/dev/null
        setfacl -d -m u:4321:rwx,m::rwx priv
        step create-pub as 1234 $U subvolume create . pub/u1
        step create-priv as 1234 $U subvolume create . priv/u2
        echo "owner-mode: $(stat -c '%u:%g %a' pub/u1)"
        step snap-own as 1234 $U subvolume snapshot . pub/u1 pub/u1snap
        step snap-other as 1234 $U subvolume snapshot . rootsub pub/rsnap
        step snap-ro as 1234 $U subvolume snapshot -r . pub/u1 pub/ro1
        step del-own as 1234 $U subvolume delete . pub/u1snap
        step del-other as 4321 $U subvolume delete . pub/u1
        step del-ro as 1234 $U subvolume delete . pub/ro1
        step create-sticky as 1234 $U subvolume create . sticky/s1
        step chmod-sticky as 1234 chmod 777 sticky/s1
        step del-sticky as 4321 $U subvolume delete . sticky/s1
        step del-sticky-owner as 1234 $U subvolume delete . sticky/s1
        step rmdir-empty as 1234 rmdir pub/u1
        step del-root $U subvolume delete . pub/ro1
        setfacl -m u:1234:rwx priv
        step create-priv-acl as 1234 $U subvolume create . priv/u3
        echo "inherited: $(getfacl -cp priv/u3 2>&1 | tr '\n' ' ')" 
        step create-priv-other as 4321 $U subvolume create . priv/u4
        step create-exists as 1234 $U subvolume create . priv/u3
        step userns-create-priv as 4321 unshare -r $U subvolume create . priv/u5
        step userns-del as 4321 unshare -r $U subvolume delete . priv/u3
        mkdir imm && chmod 777 imm && chattr +i imm
        step create-imm as 1234 $U subvolume create . imm/x
        step create-imm-root $U subvolume create . imm/y
        chattr -i imm
        ls priv imm | tr '\n' ' '; echo
        ls pub sticky | tr '\n' ' '; echo
        "#
    );
    let mut outcomes = Vec::new();
    for opts in ["", "user_subvol_rm_allowed"] {
        let k = dir.path().join("k.img");
        let img = dir.path().join("u.img");
        mkfs_btrfs(&k, 1 << 30, &[]);
        copy(&k, &img);
        let km = KernelMount::new(&k, opts);
        let open = |mnt: &Path| {
            bash_ok(
                Path::new("/"),
                &format!(
                    "chmod 755 {} {}",
                    shell_quote(mnt.parent().expect("parent")),
                    shell_quote(mnt)
                ),
            )
            .expect("chmod mountpoint");
        };
        open(&km.mnt);
        let theirs = bash_ok(&km.mnt, &script).expect("kernel steps");
        km.umount();
        let mount_opts = if opts.is_empty() {
            "rw,allow_other,ino=kernel".to_string()
        } else {
            format!("rw,allow_other,ino=kernel,{opts}")
        };
        let fm = FuseMount::start(&UBTRFS, &[&img], &[mount_opts.as_str()]);
        open(&fm.mnt);
        let ours = bash_ok(&fm.mnt, &script).unwrap_or_else(|e| panic!("{e}\n{}", fm.log()));
        let seen = fm.walk_and_unmount();
        kernel_round_trip(&img, &seen, &format!("subvolume ioctls, -o {opts}"));
        assert_eq!(
            ours, theirs,
            "-o {opts}: ubtrfs (left) against the kernel (right)"
        );
        outcomes.push(ours);
    }
    // The option changes what users may delete, and the steps show it.
    assert_ne!(outcomes[0], outcomes[1], "{outcomes:?}");
    assert!(outcomes[1].contains("del-own: ok"), "{}", outcomes[1]);
    assert!(
        outcomes[0].contains("owner-mode: 1234:1234 755"),
        "{}",
        outcomes[0]
    );
}

/// Per inode of subvolume 5 in an unmounted image: its flags, and the (inline or
/// regular, compression) kinds of its extents: each extent with `per_extent`, else
/// runs of one kind once (where the two sides may split extents differently).
fn extent_kinds(img: &Path, per_extent: bool) -> Vec<String> {
    let d = dump_tree(img, "5");
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut kind = "";
    for l in d.lines() {
        let t = l.trim_start();
        if t.starts_with("item ") {
            if let Some(k) = keys(t).first() {
                cur = k.split(' ').next().unwrap_or_default().to_string();
            }
        } else if t.starts_with("sequence ") && t.contains(" flags ") {
            out.push(format!(
                "{cur}) flags {}",
                t.split(" flags ").nth(1).unwrap_or_default()
            ));
        } else if t.starts_with("inline extent") {
            kind = "inline";
            let c = t.split("compression ").nth(1).unwrap_or_default();
            out.push(format!("{cur}) inline compression {c}"));
        } else if t.starts_with("extent data disk byte") {
            kind = "regular";
        } else if t.starts_with("extent compression") && kind == "regular" {
            out.push(format!("{cur}) regular {t}"));
        }
    }
    if !per_extent {
        out.dedup();
    }
    out
}

/// `mount -o remount,...` changes the options the kernel lets a remount change
/// (compress, nodatasum, max_inline, commit, discard, notreelog), keeps those it
/// does not name, and files written after each remount get the same flags and kinds
/// of extents as on the kernel's mount remounted the same way.
#[test]
fn remount_changes_options_like_the_kernel() {
    if !require_fuse("remount_changes_options_like_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let k = dir.path().join("k.img");
    let img = dir.path().join("u.img");
    mkfs_btrfs(&k, 1 << 30, &[]);
    copy(&k, &img);
    let steps: &[(&str, &str)] = &[
        ("", "yes | head -c 300K > a"),
        (
            "compress=zstd",
            "yes | head -c 300K > b; echo short > b2; yes | head -c 3000 > b3",
        ),
        ("commit=5,discard", "yes | head -c 300K > c"),
        ("compress=no,nodatasum", "yes | head -c 300K > d"),
        (
            "compress=lzo",
            "echo short > g; yes | head -c 4096 > g2; yes | head -c 3000 > g3
             truncate -s 1000 g3",
        ),
        ("max_inline=0,notreelog", "echo tiny > e; sync e"),
        (
            "datasum,treelog,compress-force=zlib",
            "head -c 300K /dev/zero > f; sync f",
        ),
    ];
    let km = KernelMount::new(&k, "");
    let kmnt = km.mnt.clone();
    for (opts, script) in steps {
        if !opts.is_empty() {
            bash_ok(
                Path::new("/"),
                &format!("mount -o remount,{opts} {}", shell_quote(&kmnt)),
            )
            .unwrap_or_else(|e| panic!("kernel remount {opts}: {e}"));
        }
        bash_ok(&kmnt, script).expect("kernel step");
    }
    km.umount();
    let fm = FuseMount::start(&UBTRFS, &[&img], &["rw"]);
    let (u, m, i) = (
        env!("CARGO_BIN_EXE_ubtrfs"),
        shell_quote(&fm.mnt),
        shell_quote(&img),
    );
    for (opts, script) in steps {
        if !opts.is_empty() {
            bash_ok(
                Path::new("/"),
                &format!("{u} mount {i} {m} -o remount,{opts}"),
            )
            .unwrap_or_else(|e| panic!("ubtrfs remount {opts}: {e}\n{}", fm.log()));
        }
        bash_ok(&fm.mnt, script).unwrap_or_else(|e| panic!("{script}: {e}\n{}", fm.log()));
    }
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&img, &seen, "remounts");
    let (ours, theirs) = (extent_kinds(&img, false), extent_kinds(&k, false));
    for want in [
        "regular extent compression 3",
        "inline compression 3",
        "inline compression 2",
        "NOCOMPRESS",
    ] {
        assert!(ours.iter().any(|l| l.contains(want)), "{want}: {ours:#?}");
    }
    assert_eq!(ours, theirs, "ubtrfs (left) against the kernel (right)");
}

/// The UUID tree's entries as `btrfs inspect-internal dump-tree -t uuid` prints
/// them: each key with its subvolume ids.
fn uuid_entries(img: &Path) -> Vec<String> {
    dump_tree(img, "uuid")
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("item ") || l.starts_with("subvol_id"))
        .map(|l| match l.find("key (") {
            Some(a) => l[a..].split(" itemoff").next().unwrap_or(l).to_string(),
            None => l.to_string(),
        })
        .collect()
}

/// `uuid_tree_generation` and `generation` from the superblock.
fn uuid_generations(img: &Path) -> (u64, u64) {
    let names = ["uuid_tree_generation", "generation"];
    let [ug, g] = super_values(img, names).map(|v| {
        v.and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("dump-super lacks {names:?}"))
    });
    (ug, g)
}

/// Makes the UUID tree stale the way a writer that does not keep it would leave it:
/// in its only leaf (a single-profile image), the entry holding subvolume `from`
/// names `to` instead; the leaf's checksum is fixed.
fn make_uuid_entry_stale(img: &Path, from: u64, to: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    use ubtrfs_format::csum::CsumType;
    let dump = dump_tree(img, "uuid");
    let leaf: u64 = dump
        .lines()
        .find(|l| l.starts_with("leaf "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("the UUID tree is not one leaf:\n{dump}"));
    let map = bash_ok(
        Path::new("/"),
        &format!("btrfs-map-logical -l {leaf} {}", shell_quote(img)),
    )
    .expect("btrfs-map-logical");
    let physical: u64 = map
        .split_whitespace()
        .skip_while(|w| *w != "physical")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("btrfs-map-logical: {map}"));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .expect("open image");
    let mut b = vec![0u8; 16384];
    f.seek(SeekFrom::Start(physical)).expect("seek");
    f.read_exact(&mut b).expect("read leaf");
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
    let nritems = u32_at(&b, 0x60) as usize;
    let slot = (0..nritems)
        .map(|i| 101 + i * 25)
        .find(|&item| {
            let (off, size) = (u32_at(&b, item + 17) as usize, u32_at(&b, item + 21));
            size == 8 && b[101 + off..101 + off + 8] == from.to_le_bytes()
        })
        .unwrap_or_else(|| panic!("no UUID entry holds subvolume {from}"));
    let off = 101 + u32_at(&b, slot + 17) as usize;
    b[off..off + 8].copy_from_slice(&to.to_le_bytes());
    let csum = CsumType::Crc32c.compute(&b[32..]);
    b[..32].copy_from_slice(&csum);
    f.seek(SeekFrom::Start(physical)).expect("seek");
    f.write_all(&b).expect("write leaf");
}

/// The UUID tree at a writing open, as the kernel's mount keeps it: a missing tree
/// (`btrfs rescue clear-uuid-tree`) is rebuilt with every subvolume's uuid and
/// received uuid; a stale entry is mended when the superblock says a writer that
/// does not keep the tree wrote since (`uuid_tree_generation` behind), or with
/// `-o rescan_uuid_tree`, and left alone otherwise — each the same on ubtrfs and
/// on the kernel, copies of one image.
#[test]
fn uuid_tree_is_rebuilt_and_checked_like_the_kernel() {
    if !require_fuse("uuid_tree_is_rebuilt_and_checked_like_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.img");
    mkfs_btrfs(&base, 1 << 30, &["-m", "single", "-d", "single"]);
    // Subvolumes, a read-only snapshot, a received subvolume (received_uuid) and a
    // writable snapshot of it.
    let km = KernelMount::new(&base, "");
    bash_ok(
        &km.mnt,
        "btrfs -q subvolume create a; btrfs -q subvolume create b; echo x > a/f
         btrfs -q subvolume snapshot -r a s; mkdir r
         btrfs -q send s | btrfs -q receive r
         btrfs -q subvolume snapshot r/s w",
    )
    .expect("kernel workload");
    km.umount();
    let want = uuid_entries(&base);
    assert_eq!(
        want.iter().filter(|l| l.starts_with("subvol_id")).count(),
        7,
        "5, a, b, s, r/s, its received uuid, w:\n{want:?}"
    );

    // Each case: a copy of the image made so, mounted by the kernel and by ubtrfs
    // with the same options and unmounted; both must end with the same entries.
    let b_id = 257;
    // (what, how the copy is made, mount options, mended)
    #[derive(Clone, Copy, PartialEq)]
    enum Prep {
        Cleared,
        StaleBehind,
        StaleCurrent,
    }
    let cases = [
        ("cleared", Prep::Cleared, "", true),
        ("stale, generation behind", Prep::StaleBehind, "", true),
        // clear_cache commits at the open before the UUID tree is looked at:
        // that commit must not stamp the stale tree current.
        (
            "stale, generation behind, clear_cache",
            Prep::StaleBehind,
            "clear_cache",
            true,
        ),
        (
            "stale, rescan_uuid_tree",
            Prep::StaleCurrent,
            "rescan_uuid_tree",
            true,
        ),
        ("stale, current generation", Prep::StaleCurrent, "", false),
    ];
    for (n, (what, prep, opts, mended)) in cases.into_iter().enumerate() {
        let img = dir.path().join(format!("case{n}.img"));
        copy(&base, &img);
        let q = shell_quote(&img);
        match prep {
            Prep::Cleared => {
                bash_ok(Path::new("/"), &format!("btrfs rescue clear-uuid-tree {q}")).map(drop)
            }
            Prep::StaleBehind => {
                make_uuid_entry_stale(&img, b_id, 4242);
                // btrfs-progs commits without stamping uuid_tree_generation.
                bash_ok(Path::new("/"), &format!("btrfs filesystem label {q} x")).map(drop)
            }
            Prep::StaleCurrent => {
                make_uuid_entry_stale(&img, b_id, 4242);
                Ok(())
            }
        }
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let before = uuid_entries(&img);
        let (ug, g) = uuid_generations(&img);
        assert_eq!(
            ug != g,
            prep != Prep::StaleCurrent,
            "{what}: uuid_tree_generation {ug}, generation {g}"
        );
        let kimg = dir.path().join(format!("case{n}-kernel.img"));
        copy(&img, &kimg);
        let km = KernelMount::new(&kimg, opts);
        // The kernel checks the tree in a thread of its own, which gives up when an
        // unmount begins (btrfs_uuid_tree_iterate stops on btrfs_fs_closing): wait
        // for it, as its commit then stamps uuid_tree_generation current. Each round
        // dirties the top directory's times so that the sync commits: a commit made
        // while the check runs leaves uuid_tree_generation behind, and without one
        // the generations of a StaleCurrent copy are equal before the check ends.
        let t0 = std::time::Instant::now();
        loop {
            let m = km.q();
            bash_ok(
                Path::new("/"),
                &format!("touch {m} && btrfs filesystem sync {m}"),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let (ug, g) = uuid_generations(&kimg);
            if ug == g || t0.elapsed() > std::time::Duration::from_secs(20) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        km.umount();
        let mut fm = FuseMount::start(&UBTRFS, &[&img], &["rw", opts]);
        let st = fm.unmount();
        assert!(st.success(), "{what}: ubtrfs mount: {}", fm.log());
        let (k, u) = (uuid_entries(&kimg), uuid_entries(&img));
        assert_eq!(u, k, "{what}: UUID tree, ubtrfs against the kernel");
        if mended {
            assert_eq!(u, want, "{what}: the kernel's own entries come back");
            let (ug, g) = uuid_generations(&img);
            assert_eq!(ug, g, "{what}: uuid_tree_generation stamped");
        } else {
            assert_eq!(u, before, "{what}: left as it was");
        }
        btrfs_check(&img, None).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// The VFS's own mount flags (noexec, nosymfollow, sync, dirsync) reach the FUSE
/// mount and have there the effect they have on the kernel's btrfs mount: one script
/// on both prints the flags /proc/mounts shows, whether a copied executable runs and
/// whether a path through a symlink resolves, then, after `remount` with their
/// opposites, the same again. (mount.fuse.ubtrfs once dropped noexec silently.)
#[test]
fn vfs_mount_flags_as_on_the_kernel() {
    if !require_fuse("vfs_mount_flags_as_on_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let k = dir.path().join("k.img");
    let img = dir.path().join("u.img");
    mkfs_btrfs(&k, 1 << 30, &[]);
    copy(&k, &img);
    let flags = "noexec,nosymfollow,sync,dirsync";
    // `remount OPTS` is defined before it: mount(8) for the kernel, ubtrfs for FUSE.
    let script = r#"
        show() {
            for f in $(awk -v m="$PWD" '$2 == m { print $4 }' /proc/mounts | tr , ' '); do
                case $f in noexec|nosymfollow|sync|dirsync) echo "flag $f";; esac
            done
            if ./true 2>/dev/null; then echo "exec: runs"; else echo "exec: refused ($?)"; fi
            if cat link/f >/dev/null 2>&1; then echo "symlink: followed"; else echo "symlink: refused"; fi
            echo data >> d/f; echo "write: $(cat d/f | wc -l) lines"
        }
        mkdir -p d; ln -sfn d link; cp /bin/true true
        show; remount exec,symfollow,async; show
    "#;
    let km = KernelMount::new(&k, flags);
    let kmnt = shell_quote(&km.mnt);
    let theirs = bash_ok(
        &km.mnt,
        &format!("remount() {{ mount -o remount,rw,$1 {kmnt}; }}\n{}", script),
    )
    .unwrap_or_else(|e| panic!("kernel: {e}"));
    km.umount();
    let fm = FuseMount::start(&UBTRFS, &[&img], &["rw", flags]);
    let (u, m, i) = (
        env!("CARGO_BIN_EXE_ubtrfs"),
        shell_quote(&fm.mnt),
        shell_quote(&img),
    );
    let ours = bash_ok(
        &fm.mnt,
        &format!(
            "remount() {{ {u} mount {i} {m} -o remount,rw,$1; }}\n{}",
            script
        ),
    )
    .unwrap_or_else(|e| panic!("ubtrfs: {e}\n{}", fm.log()));
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&img, &seen, "vfs flags");
    for want in [
        "flag noexec",
        "exec: refused",
        "symlink: refused",
        "exec: runs",
    ] {
        assert!(
            theirs.contains(want),
            "the kernel's mount: {want}\n{theirs}"
        );
    }
    assert_eq!(ours, theirs, "ubtrfs (left) against the kernel (right)");
}
