//! Access times on the read-write `ubtrfs mount`, against the kernel in the same
//! run: one sequence (`mount_atime.sh`: reads, listings, readlink, O_NOATIME, an
//! empty file, the `A` and `i` flags, remounts to strictatime, nodiratime, noatime
//! and back through mount(8), a read-only snapshot, a read-only remount) runs on a
//! kernel btrfs loop mount and on a ubtrfs mount made with `mount -t fuse.ubtrfs`
//! (so remounts go through mount(8) and the helper as on the kernel); each step's
//! line says which of atime, mtime and ctime changed, and the two outputs must be
//! equal. Then the ubtrfs image checks clean and the kernel shows every time the
//! FUSE mount showed.
//!
//! Needs root (/dev/fuse, loop devices); skipped with a line outside CI.

use std::path::{Path, PathBuf};
use std::process::Command;
use ubtrfs_sim::golden::walk_mounted;
use ubtrfs_sim::host::{bash_ok, output_text, require_fuse, serial};
use ubtrfs_sim::mount::{is_mounted, kernel_round_trip, mkfs_btrfs, HelperLink, KernelMount};

const SEQUENCE: &str = include_str!("mount_atime.sh");

/// Runs the sequence in `dir` with the remount and snapshot commands given.
fn run_sequence(dir: &Path, remount: &str, snapshot: &str, what: &str) -> String {
    // Single quotes: $1 belongs to the functions, not to the assignment.
    let script = format!("REMOUNT='{remount}'\nSNAPSHOT='{snapshot}'\n{SEQUENCE}");
    bash_ok(dir, &script).unwrap_or_else(|e| panic!("the sequence on {what}: {e}"))
}

/// A `mount -t fuse.ubtrfs` mount, unmounted on drop (also when the test fails).
struct HelperMount(PathBuf);

impl Drop for HelperMount {
    fn drop(&mut self) {
        for _ in 0..20 {
            if !is_mounted(&self.0) {
                return;
            }
            let _ = Command::new("umount").arg(&self.0).status();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[test]
fn atime_follows_the_kernels_rules() {
    if !require_fuse("atime_follows_the_kernels_rules") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");

    let kimg = dir.path().join("k.img");
    mkfs_btrfs(&kimg, 1 << 30, &[]);
    let k = KernelMount::new(&kimg, "rw");
    let kmnt = k.mnt.display().to_string();
    let kernel = run_sequence(
        &k.mnt,
        &format!("f() {{ mount -o remount,$1 {kmnt}; }}; f"),
        &format!("g() {{ btrfs -q subvolume snapshot -r {kmnt} {kmnt}/$1; }}; g"),
        "the kernel",
    );
    k.umount();

    let _link = HelperLink::ensure(Path::new(env!("CARGO_BIN_EXE_ubtrfs")));
    let uimg = dir.path().join("u.img");
    mkfs_btrfs(&uimg, 1 << 30, &[]);
    let umnt = dir.path().join("m");
    std::fs::create_dir(&umnt).expect("mkdir");
    let o = Command::new("mount")
        // ino=kernel: the snapshot's st_ino as the kernel shows them in the round trip.
        .args(["-t", "fuse.ubtrfs", "-o", "rw,ino=kernel"])
        .arg(&uimg)
        .arg(&umnt)
        .output()
        .expect("mount");
    assert!(
        o.status.success(),
        "mount -t fuse.ubtrfs: {}",
        output_text(&o)
    );
    let guard = HelperMount(umnt.clone());
    let m = umnt.display().to_string();
    let ubtrfs = run_sequence(
        &umnt,
        &format!("f() {{ mount -o remount,$1 {m}; }}; f"),
        &format!(
            "g() {{ {} subvolume snapshot -r {m} / /$1 > /dev/null; }}; g",
            env!("CARGO_BIN_EXE_ubtrfs")
        ),
        "ubtrfs",
    );
    let seen = walk_mounted(&umnt);
    let o = Command::new("umount").arg(&umnt).output().expect("umount");
    assert!(o.status.success(), "umount: {}", output_text(&o));
    drop(guard);
    // The server's last commit, then the image is free.
    let o = Command::new("flock")
        .args(["-w", "60"])
        .arg(&uimg)
        .arg("true")
        .output()
        .expect("flock");
    assert!(
        o.status.success(),
        "image still locked: {}",
        output_text(&o)
    );

    let diffs: Vec<String> = kernel
        .lines()
        .zip(ubtrfs.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("kernel {a:?}, ubtrfs {b:?}"))
        .collect();
    assert!(
        diffs.is_empty() && kernel.lines().count() == ubtrfs.lines().count(),
        "atime steps differ:\n{}\nkernel:\n{kernel}\nubtrfs:\n{ubtrfs}",
        diffs.join("\n")
    );
    // The sequence's expectations hold on both (not two equal mistakes).
    for want in [
        "read a new file: A--",
        "read it again: ---",
        "list a new directory: A--",
        "strictatime: read again: A--",
        "strictatime: readlink again: A--",
        "list it with O_NOATIME: ---",
        "nodiratime: list a changed directory: ---",
        "noatime: read a new file: ---",
        "read-only snapshot: read: ---",
        "read-only mount: read: ---",
        "remount,relatime of a noatime mount: read: ---",
        "relatime again: read: A--",
        "read-write again: read: A--",
    ] {
        assert!(kernel.lines().any(|l| l == want), "kernel lacks {want:?}");
    }
    // Times included: what the FUSE mount showed is what the kernel shows.
    kernel_round_trip(&uimg, &seen, "atime sequence");
}
