//! The read-write `ubtrfs mount` against the kernel, in the same run:
//! - one workload (namespace changes, unaligned writes, truncates, holes, fallocate
//!   modes, links, xattrs, owners, modes, times, special files) runs on a ubtrfs
//!   mount and on a kernel btrfs loop mount; both trees must be equal (all but inode
//!   numbers and the times the workload did not set);
//! - after unmounting, `btrfs check --readonly --check-data-csum` is clean and the
//!   kernel shows exactly what the FUSE mount showed (every stat field, st_ino and
//!   times included); the kernel writes more, ubtrfs mounts it read-write again and
//!   goes on, and the result checks clean;
//! - fsync and BTRFS_IOC_SYNC are durable: what was synced survives SIGKILL of the server.
//!
//! Needs root (/dev/fuse, loop devices); skipped with a line outside CI.

use std::path::Path;
use std::time::Duration;
use ubtrfs_sim::golden::{compare_walks as compare, report, walk_mounted};
use ubtrfs_sim::host::{bash_in, btrfs_check, require_fuse, serial, EnableUring, Ubtrfs};
use ubtrfs_sim::mount::{kernel_round_trip, kernel_writes, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// A workload that gives the same tree wherever it runs (deterministic data; times
/// set explicitly where they are compared).
const WORKLOAD: &str = r#"
set -eu
mkdir -p a/b/c many
echo hello > a/f
seq 1 100000 > a/seq
yes abcdefghij | head -c 5000000 > big
printf 'ZZZ' | dd of=big bs=1 seek=12345 conv=notrunc status=none
dd if=/dev/zero of=big bs=4096 seek=300 count=3 conv=notrunc status=none
printf 'tail' | dd of=big bs=1 seek=7000001 conv=notrunc status=none
truncate -s 6000000 big
truncate -s 9000000 big
fallocate -p -o 4096 -l 8192 big
fallocate -z -o 100000 -l 50000 big
fallocate -l 1M fa
fallocate -n -o 2M -l 1M fa
head -c 1500 big > small
head -c 70000 big > medium
printf 'x' | dd of=medium bs=1 seek=69999 conv=notrunc status=none
ln a/f a/b/hard
ln -s ../f a/b/sym
mkfifo a/fifo
mknod a/cdev c 1 3
setfattr -n user.k -v v a/f
setfattr -n user.big -v "$(head -c 3000 big)" a/f
setfattr -n user.gone -v 1 a/f
setfattr -x user.gone a/f
chmod 640 a/f
chown 1000:1001 a/seq
mv a/seq a/b/seq2
mv a/b/c a/c2
rmdir a/c2
mv -n small a/small
for i in $(seq 1 300); do echo $i > many/f$i; done
rm many/f1*
rm a/b/hard
mkdir gone && touch gone/x && rm -r gone
mkdir -m 700 acld
setfacl --set u::rwx,g::r-x,o::r-x acld
cp -a a/b acl-copy
touch aclf
setfacl -m u:1000:rw aclf
chmod 640 aclf
touch aclg
setfacl -m u:1000:rwx,g::r aclg
setfacl --set u::rw,g::r,o::- aclg
mkdir defd defe
setfacl -d -m u:1000:rwx defd
setfacl -d --set u::rwx,g::rx,o::- defe
(umask 022; touch defd/f; mkdir defd/sub defd/sub/deeper; mknod defd/fifo p; ln -s f defd/sym)
(umask 077; touch defe/f; mkdir defe/d; echo x > defd/sub/g)
(umask 027; touch plainf; mkdir plaind; mknod plainp p)
touch -m -d '2020-01-02 03:04:05.123456789' a/b/seq2
touch -a -d '2021-01-02 03:04:05.5' a/b/seq2
"#;

/// What the workload's trees are compared by (all but inode numbers and the times
/// it did not set).
const COMPARED: &[&str] = &[
    "type",
    "mode",
    "nlink",
    "uid",
    "gid",
    "rdev",
    "size",
    "sha256",
    "target_hex",
    "xattrs",
];

/// The tree WORKLOAD leaves on a kernel loop mount of a fresh image in `dir`.
fn kernel_tree_of_workload(dir: &Path) -> std::collections::BTreeMap<String, serde_json::Value> {
    let kimg = fresh_image(dir, "kernel.img");
    // noatime (the ubtrfs mount too): the walk reads every file, and the times the
    // workload set must be compared as set.
    let k = KernelMount::new(&kimg, "rw,noatime");
    let (_, err) = bash_in(&k.path(""), &format!("{WORKLOAD}\necho done >&2"));
    assert!(
        err.trim_end().ends_with("done"),
        "workload on the kernel: {err}"
    );
    let tree = walk_mounted(&k.path(""));
    k.umount();
    tree
}

/// Runs WORKLOAD on a ubtrfs mount: the tree it leaves there.
fn fuse_tree_of_workload(fm: &FuseMount) -> std::collections::BTreeMap<String, serde_json::Value> {
    let (_, err) = bash_in(&fm.mnt, &format!("{WORKLOAD}\necho done >&2"));
    assert!(
        err.trim_end().ends_with("done"),
        "workload on ubtrfs: {err}\nserver: {}",
        fm.log()
    );
    walk_mounted(&fm.mnt)
}

fn fresh_image(dir: &Path, name: &str) -> std::path::PathBuf {
    let img = dir.join(name);
    mkfs_btrfs(&img, 1 << 30, &[]);
    img
}

#[test]
fn rw_mount_matches_kernel_and_round_trips() {
    if !require_fuse("rw_mount_matches_kernel_and_round_trips") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path(), "ubtrfs.img");
    // The same workload on both.
    let kernel_tree = kernel_tree_of_workload(dir.path());

    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw,noatime"]);
    let fuse_tree = fuse_tree_of_workload(&fm);
    let mut diffs = compare(
        "ubtrfs mount vs kernel mount (same workload)",
        &kernel_tree,
        &fuse_tree,
        COMPARED,
    );
    for p in ["/a/b/seq2"] {
        for f in ["mtime", "atime"] {
            if kernel_tree[p][f] != fuse_tree[p][f] {
                diffs.push(format!(
                    "{p}: {f}: kernel {} ubtrfs {}",
                    kernel_tree[p][f], fuse_tree[p][f]
                ));
            }
        }
    }
    let st = fm.unmount();
    assert!(st.success(), "server exit {st}: {}", fm.log());
    report(diffs);

    // Round trip: btrfs check, then the kernel shows what the FUSE mount showed.
    kernel_round_trip(&img, &fuse_tree, "after the ubtrfs mount");

    // The kernel writes more; ubtrfs mounts read-write again and goes on.
    kernel_writes(
        &img,
        "echo kernel > kfile; rm a/f; mkdir kdir",
        "after the ubtrfs mount",
    );
    let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let (_, err) = bash_in(
        &fm.mnt,
        "set -e; test \"$(cat kfile)\" = kernel; echo again >> kfile; mv kdir kdir2; \
         seq 1 5000 > kdir2/s; rm -r many; echo done >&2",
    );
    assert!(
        err.trim_end().ends_with("done"),
        "second ubtrfs mount: {err}\n{}",
        fm.log()
    );
    let again = fm.walk_and_unmount();
    kernel_round_trip(&img, &again, "after the second mount");
}

#[test]
fn rw_mount_sync_survives_sigkill() {
    if !require_fuse("rw_mount_sync_survives_sigkill") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path(), "a.img");
    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw", "commit=300"]);
    let (_, err) = bash_in(
        &fm.mnt,
        "set -e; seq 1 10 > fsynced; \
         python3 -c 'import os; f=os.open(\"fsynced\", os.O_RDWR); os.fsync(f)'; \
         seq 1 20000 > synced; btrfs filesystem sync .; \
         echo lost > unsynced; echo done >&2",
    );
    assert!(err.trim_end().ends_with("done"), "{err}\n{}", fm.log());
    // Power cut: the server dies without unmounting or committing.
    let _ = fm.child.kill();
    fm.wait(Duration::from_secs(10));
    drop(fm);
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after SIGKILL: {e}"));
    let k = KernelMount::new(&img, "ro");
    let synced = std::fs::read_to_string(k.path("synced")).expect("synced file");
    assert_eq!(synced.lines().count(), 20000);
    assert_eq!(
        std::fs::read_to_string(k.path("fsynced"))
            .expect("fsynced file")
            .lines()
            .count(),
        10
    );
    assert!(
        !k.path("unsynced").exists(),
        "neither committed nor fsynced: the kernel \
         must not see it"
    );
    k.umount();
}

#[test]
fn rw_mount_refuses_what_the_kernel_refuses() {
    if !require_fuse("rw_mount_refuses_what_the_kernel_refuses") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path(), "a.img");
    let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let m = &fm.mnt;
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
    std::fs::create_dir(m.join("d")).expect("mkdir");
    std::fs::write(m.join("d/f"), b"x").expect("write");
    assert_eq!(errno(std::fs::create_dir(m.join("d"))), Some(17), "EEXIST");
    assert_eq!(
        errno(std::fs::remove_dir(m.join("d"))),
        Some(39),
        "ENOTEMPTY"
    );
    assert_eq!(
        errno(std::fs::remove_file(m.join("nope"))),
        Some(2),
        "ENOENT"
    );
    assert_eq!(
        errno(std::fs::remove_dir(m.join("d/f"))),
        Some(20),
        "ENOTDIR"
    );
    assert_eq!(
        errno(xattr::remove(m.join("d/f"), "user.none")),
        Some(61),
        "ENODATA"
    );
    // A value larger than a leaf holds: ENOSPC as from the kernel, and the mount goes
    // on (it once aborted the transaction: fstests generic/020).
    assert_eq!(
        errno(xattr::set(m.join("d/f"), "user.big", &vec![b'x'; 65536])),
        Some(28),
        "ENOSPC"
    );
    std::fs::write(m.join("d/g"), b"after").expect("write after ENOSPC");
    // fallocate beyond the free space: ENOSPC and nothing changed, as the kernel
    // (it ran out half-way and aborted: fstests generic/213).
    let (out, _) = bash_in(m, "fallocate -l 4G big 2>&1; echo after > after; cat after");
    assert!(
        out.contains("No space left on device") && out.ends_with("after\n"),
        "{out}"
    );
    // A directory replaced by rename while open is still there for fstat, nlink 0, as
    // on the kernel (it was deleted at once: fstests generic/035).
    std::fs::create_dir(m.join("r1")).expect("mkdir");
    std::fs::create_dir(m.join("r2")).expect("mkdir");
    let open = std::fs::File::open(m.join("r2")).expect("open dir");
    std::fs::rename(m.join("r1"), m.join("r2")).expect("rename over a directory");
    let md = open.metadata().expect("fstat of the replaced directory");
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&md), 0);
    drop(open);
    // The image is locked while mounted read-write: offline writers are refused.
    let (ok, _, err) = UBTRFS.run(&["mkdir".as_ref(), img.as_os_str(), "/x".as_ref()]);
    assert!(
        !ok && err.contains("in use"),
        "offline writer refused: {err}"
    );
}

#[test]
fn mount_t_fuse_ubtrfs_through_the_helper() {
    if !require_fuse("mount_t_fuse_ubtrfs_through_the_helper") {
        return;
    }
    let _link = ubtrfs_sim::mount::HelperLink::ensure(Path::new(env!("CARGO_BIN_EXE_ubtrfs")));
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path(), "a.img");
    let mnt = dir.path().join("m");
    std::fs::create_dir(&mnt).expect("mkdir");
    let (_, err) = bash_in(
        dir.path(),
        &format!(
            // subtype= makes the type plain "fuse" (fstests' FSTYP=fuse checks it);
            // the second mount right after umount waits for the first server's last
            // commit instead of calling the image busy; remount,ro refuses writes and
            // remount,rw allows them again. noexec reaches the mount (the helper once
            // dropped it).
            // On failure (set -e), the trap unmounts what is still mounted.
            "set -e; trap 'while grep -q \" {mnt} \" /proc/mounts; do umount {mnt} || break; done' EXIT; \
             mount -t fuse.ubtrfs {img} {mnt} -o rw,noauto,nofail,commit=5,subtype=,noexec; \
             grep -q ' {mnt} fuse rw,.*noexec' /proc/mounts; \
             echo through-mount > {mnt}/x; umount {mnt}; \
             mount -t fuse.ubtrfs {img} {mnt} -o rw; grep -q ' {mnt} fuse.ubtrfs ' /proc/mounts; \
             cat {mnt}/x >&2; mount -o remount,ro {mnt}; \
             if touch {mnt}/ro 2>/dev/null; then echo remount-ro-ignored >&2; fi; \
             mount -o remount,rw {mnt}; echo again >> {mnt}/x; umount {mnt}; \
             flock -w 60 {img} true; echo done >&2",
            img = img.display(),
            mnt = mnt.display()
        ),
    );
    assert_eq!(err, "through-mount\ndone\n", "mount -t fuse.ubtrfs");
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check: {e}"));
    let k = KernelMount::new(&img, "ro");
    assert_eq!(
        std::fs::read_to_string(k.path("x")).expect("x"),
        "through-mount\nagain\n"
    );
    k.umount();
}

/// Many writers at once, in one directory and in one file: every update is kept,
/// the image checks clean and the kernel shows what the mount showed.
#[test]
fn rw_mount_concurrent_writers() {
    if !require_fuse("rw_mount_concurrent_writers") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path(), "a.img");
    let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let (_, err) = bash_in(
        &fm.mnt,
        "set -e; mkdir d; : > shared
         for w in 1 2 3 4 5 6 7 8; do
           ( for i in $(seq 1 150); do echo $w-$i > d/w$w-$i; done
             yes $w | head -c 65536 | dd of=shared bs=65536 seek=$w conv=notrunc status=none
             for i in $(seq 1 50); do rm d/w$w-$((i * 3)); done ) &
         done
         wait; echo done >&2",
    );
    assert!(err.trim_end().ends_with("done"), "{err}\n{}", fm.log());
    let names = std::fs::read_dir(fm.mnt.join("d"))
        .expect("readdir")
        .count();
    assert_eq!(names, 8 * 100, "files left in the shared directory");
    let shared = std::fs::read(fm.mnt.join("shared")).expect("shared");
    assert_eq!(shared.len(), 9 * 65536);
    for w in 1..=8usize {
        let part = &shared[w * 65536..(w + 1) * 65536];
        let want = format!("{w}\n").repeat(32768);
        assert!(
            part == want.as_bytes(),
            "writer {w}'s range of the shared file"
        );
    }
    let tree = fm.walk_and_unmount();
    kernel_round_trip(&img, &tree, "concurrent writers");
}

/// POSIX ACLs on the mount behave as on the kernel: an access ACL sets the mode (and
/// is not stored when the mode says it all), chmod rewrites the ACL, new inodes in a
/// directory with a default ACL inherit it instead of having the umask applied, and
/// elsewhere the umask applies (fstests generic/099). One script on both, outputs equal.
#[test]
fn rw_mount_acls_as_the_kernel() {
    if !require_fuse("rw_mount_acls_as_the_kernel") {
        return;
    }
    let _serial = serial();
    if std::process::Command::new("setfacl")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("setfacl is missing (apt-get install acl; tests/install-deps.sh installs it)");
    }
    let script = "set -u; umask 022
        touch f0; mkdir d0; mknod p0 p; stat -c '%n %A' f0 d0 p0
        touch f1; setfacl -m u::r--,g::rwx,o::rw- f1; stat -c '%n %A' f1; getfacl -c f1
        setfacl -m u:1000:rwx f1; stat -c '%n %A' f1; chmod 640 f1; getfacl -c f1
        stat -c '%n %A' f1
        mkdir acldir; setfacl -d -m u::r,g::r,o::- acldir; setfacl -d -m u:1000:rw acldir
        touch acldir/file2; mkdir acldir/sub; stat -c '%n %A' acldir/file2 acldir/sub
        getfacl -c acldir/file2 acldir/sub
        mkdir acl2; setfacl -d -m u::rwx,g::r-x,o::--- acl2; umask 077; touch acl2/x
        stat -c '%n %A' acl2/x; getfacl -c acl2/x
        umask 027; touch g; mkdir gd; stat -c '%n %A' g gd; echo done";
    let dir = tempfile::tempdir().expect("tempdir");
    let kimg = fresh_image(dir.path(), "k.img");
    let k = KernelMount::new(&kimg, "rw");
    let (want, kerr) = bash_in(&k.mnt, script);
    k.umount();
    assert!(want.ends_with("done\n"), "kernel: {want}{kerr}");
    let img = fresh_image(dir.path(), "a.img");
    let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let (got, err) = bash_in(&fm.mnt, script);
    assert_eq!(got, want, "ubtrfs vs kernel ({err})");
    drop(fm);
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check: {e}"));
}

/// Renaming each entry while listing its directory ends, listing each original entry
/// once, as on the kernel (fstests generic/736: renamed entries get new DIR_INDEX
/// numbers and were listed again, forever); rewinddir then sees what changed.
#[test]
fn rw_mount_readdir_while_renaming() {
    if !require_fuse("rw_mount_readdir_while_renaming") {
        return;
    }
    let _serial = serial();
    let script = r#"mkdir d; for i in $(seq 1 300); do : > d/f$i; done
        perl -e 'opendir(D, "d") or die; my $n = 0;
            while (defined(my $e = readdir(D))) { $n++; die "endless\n" if $n > 10000;
                rename("d/$e", "d/r$e") if $e =~ /^f/; }
            open(F, ">d/new") or die; close F; rewinddir(D); my @b = readdir(D);
            print "$n ", scalar(@b), "\n";'"#;
    let dir = tempfile::tempdir().expect("tempdir");
    let kimg = fresh_image(dir.path(), "k.img");
    let k = KernelMount::new(&kimg, "rw");
    let (want, kerr) = bash_in(&k.mnt, script);
    k.umount();
    assert_eq!(want, "302 303\n", "kernel: {kerr}");
    let img = fresh_image(dir.path(), "a.img");
    let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let (got, err) = bash_in(&fm.mnt, script);
    assert_eq!(got, want, "ubtrfs vs kernel ({err})");
}

/// FUSE over io_uring (the per-CPU queues the mount uses when the kernel offers
/// them): the same workload as above, plus a snapshot (an ioctl whose answer is
/// followed by a notification), gives the kernel's tree, and the image round-trips.
#[test]
fn rw_mount_through_io_uring_matches_kernel() {
    if !require_fuse("rw_mount_through_io_uring_matches_kernel") {
        return;
    }
    let _serial = serial();
    let Some(_uring) = EnableUring::on_or_skip("rw_mount_through_io_uring_matches_kernel") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path(), "ubtrfs.img");
    let kernel_tree = kernel_tree_of_workload(dir.path());

    let mut fm = FuseMount::start_env(
        &UBTRFS,
        std::slice::from_ref(&img),
        // st_ino as the kernel shows it, also in the subvolume made below.
        &["rw,ino=kernel"],
        &[("UBTRFS_FUSE_STATS", "1")],
    );
    let fuse_tree = fuse_tree_of_workload(&fm);
    let diffs = compare(
        "ubtrfs mount over io_uring vs kernel mount (same workload)",
        &kernel_tree,
        &fuse_tree,
        COMPARED,
    );
    report(diffs);
    // Subvolume ioctls through the mount: answered, then the directory's names
    // dropped by a notification.
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    fm.run(
        &format!(
            "{u} subvolume create . /sv && cp -a a/b big sv/ && {u} subvolume snapshot . /sv /snap \
             && diff -r --no-dereference sv snap && {u} subvolume delete . /snap && test ! -e snap"
        ),
        "subvolumes",
    );
    // Removed files go when the kernel forgets them: under io_uring the FORGETs come
    // through /dev/fuse, gathered into batches, and their inodes are deleted a group
    // to a change. Their space must be free again while the mount still runs (the
    // unmount would delete leftover orphans itself and hide a lost eviction).
    let free = |fm: &ubtrfs_sim::mount::FuseMount| -> u64 {
        // BTRFS_IOC_SYNC: the mount commits (freed extents count as free after it).
        let out = fm.run(
            "python3 -c \"import fcntl, os; fcntl.ioctl(os.open('.', os.O_RDONLY), 0x9408)\" \
             && stat -f -c '%f %S' .",
            "commit and statfs",
        );
        let v: Vec<u64> = out
            .split_whitespace()
            .map(|x| x.parse().expect("stat -f number"))
            .collect();
        v[0] * v[1]
    };
    let before = free(&fm);
    fm.run(
        "mkdir gone && python3 -c \"
import os
for i in range(1000):
    with open(f'gone/f{i}', 'wb') as f:
        f.write(os.urandom(65536))
\"",
        "1,000 files of 64 KiB",
    );
    let full = free(&fm);
    assert!(
        before - full >= 60 << 20,
        "the files took {} bytes",
        before - full
    );
    fm.run("rm -r gone", "rm of 1,000 files");
    let t0 = std::time::Instant::now();
    let mut now = free(&fm);
    while before.saturating_sub(now) > 4 << 20 && t0.elapsed() < std::time::Duration::from_secs(30)
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
        now = free(&fm);
    }
    assert!(
        before.saturating_sub(now) <= 4 << 20,
        "removed files' space not freed while mounted: {before} free before, {full} with \
         the files, {now} after rm: {}",
        fm.log()
    );
    let seen = walk_mounted(&fm.mnt);
    let st = fm.unmount();
    assert!(st.success(), "server exit {st}: {}", fm.log());
    // The server says how many requests came through the rings.
    let log = fm.log();
    let through: u64 = log
        .split(" through io_uring")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        through > 1000,
        "the workload did not go through FUSE over io_uring: {log}"
    );
    kernel_round_trip(&img, &seen, "after the io_uring mount");
}
