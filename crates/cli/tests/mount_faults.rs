//! Faults under the read-write `ubtrfs mount`, as they happen to real disks:
//!
//! - The host's disk fills up under a sparse image, so writes of the image fail
//!   (ENOSPC from the host, an I/O error to ubtrfs) in the middle of data write-out
//!   and commits. The mount must abort as the kernel's btrfs aborts a transaction:
//!   one log line, read-only from then on, nothing half-written committed. Once the
//!   host has room again, the image is clean for `btrfs check`, the kernel shows the
//!   last commit, and ubtrfs mounts it read-write and goes on.
//! - A block device held by the mount is refused to the kernel's mount and to
//!   mkfs.btrfs (EBUSY: ubtrfs claims it exclusively, as the kernel's btrfs claims
//!   its devices), and is free again after the unmount.
//!
//! Needs root (/dev/fuse, tmpfs and loop devices); skipped with a line outside CI.

use std::path::{Path, PathBuf};
use std::process::Command;
use ubtrfs_sim::host::{
    bash_in, btrfs_check, forget_devices, require_fuse, run_text, serial, shell_quote, Ubtrfs,
};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// A tmpfs of a given size mounted on a fresh directory; unmounted on drop (lazily,
/// so a panic with something still open there does not leave it behind).
struct Tmpfs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = dir.path().join("host");
        std::fs::create_dir(&mnt).expect("mkdir");
        run_text(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&mnt),
        )
        .unwrap_or_else(|e| panic!("mount tmpfs: {e}"));
        Tmpfs { mnt, _dir: dir }
    }

    fn resize(&self, size: &str) {
        run_text(
            Command::new("mount")
                .args(["-o", &format!("remount,size={size}")])
                .arg(&self.mnt),
        )
        .unwrap_or_else(|e| panic!("remount tmpfs: {e}"));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// A loop device for an image file, read-write; forgotten by btrfs and detached on
/// drop.
struct Loop(String);

impl Loop {
    fn attach(img: &Path) -> Loop {
        let dev = run_text(Command::new("losetup").args(["-f", "--show"]).arg(img))
            .unwrap_or_else(|e| panic!("losetup: {e}"));
        Loop(dev.trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        forget_devices(Some(&self.0));
        for _ in 0..50 {
            let ok = Command::new("losetup")
                .args(["-d", &self.0])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// Writes 1 MiB pieces of random data to `big` until a write (or the final fsync)
/// fails; prints the errno's name. Anything but EIO, EROFS or ENOSPC fails the
/// script, and so does writing 400 MiB without an error (the host has far less).
const FILL: &str = r#"
python3 - <<'PY'
import errno, os, random
random.seed(7)
fd = os.open('big', os.O_WRONLY | os.O_CREAT, 0o644)
err = None
try:
    for i in range(400):
        os.write(fd, random.randbytes(1 << 20))
    os.fsync(fd)
except OSError as e:
    err = e.errno
try:
    os.close(fd)
except OSError:
    pass
assert err in (errno.EIO, errno.EROFS, errno.ENOSPC), f'writes ended with {err}'
print('failed with', errno.errorcode[err])
PY
"#;

#[test]
fn host_disk_full_under_the_image_aborts_the_mount_and_keeps_the_last_commit() {
    if !require_fuse("host_disk_full_under_the_image_aborts_the_mount_and_keeps_the_last_commit") {
        return;
    }
    let _serial = serial();
    // mkfs.btrfs writes a few MiB of the 1 GiB sparse image; the rest of the host's
    // 64 MiB is what the mount can write before the host is full.
    let host = Tmpfs::new("64m");
    let img = host.mnt.join("img");
    mkfs_btrfs(&img, 1 << 30, &[]);

    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let m = shell_quote(&fm.mnt);
    fm.run(
        &format!(
            "head -c 3M /dev/urandom > keep; mkdir -p d/e; echo kept > d/e/f
             sha256sum keep > /dev/shm/ubtrfs-faults-keep.sum
             btrfs filesystem sync {m}"
        ),
        "the committed files",
    );
    let (out, err) = bash_in(&fm.mnt, FILL);
    assert!(
        out.contains("failed with"),
        "filling the host: {out}\n{err}\nserver: {}",
        fm.log()
    );
    eprintln!("host full: {}", out.trim());

    // One line, the kernel's transaction abort; read-only from then on.
    let log = fm.log();
    eprintln!(
        "{}",
        log.lines()
            .find(|l| l.contains("aborted"))
            .unwrap_or("no abort line")
    );
    assert_eq!(
        log.matches("transaction aborted").count(),
        1,
        "expected one abort line: {log}"
    );
    let (out, err) = bash_in(
        &fm.mnt,
        "touch after 2>&1 || echo refused; mkdir newdir 2>&1 || echo refused",
    );
    assert_eq!(
        out.matches("refused").count(),
        2,
        "changes after the abort: {out}\n{err}"
    );
    assert!(
        out.contains("Read-only file system") || out.contains("Input/output error"),
        "changes after the abort fail with EROFS or EIO: {out}"
    );
    // What was committed still reads back through the aborted mount.
    fm.run(
        "sha256sum -c --quiet /dev/shm/ubtrfs-faults-keep.sum; grep -qx kept d/e/f",
        "reading after the abort",
    );

    // The host gets room again; the server exits at the unmount without writing.
    host.resize("2g");
    let st = fm.unmount();
    assert!(
        st.code().is_some(),
        "the server had to be killed at the unmount ({st}): {}",
        fm.log()
    );
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after the abort: {e}"));
    let k = KernelMount::new(&img, "ro");
    let kq = k.q();
    let (out, err) = bash_in(
        Path::new("/"),
        &format!(
            "cd {kq} && sha256sum -c --quiet /dev/shm/ubtrfs-faults-keep.sum && grep -qx kept d/e/f && echo same"
        ),
    );
    k.umount();
    assert!(
        out.contains("same"),
        "the kernel shows the last commit: {out}\n{err}"
    );

    // And the image goes on: read-write again, written, clean, seen by the kernel.
    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    fm.run(
        "head -c 5M /dev/urandom > again; sha256sum again > /dev/shm/ubtrfs-faults-again.sum
         sha256sum -c --quiet /dev/shm/ubtrfs-faults-keep.sum",
        "writing after the host has room",
    );
    let st = fm.unmount();
    assert!(st.success(), "server exit {st}: {}", fm.log());
    assert!(
        !fm.log().contains("transaction aborted"),
        "the second mount aborted: {}",
        fm.log()
    );
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after writing again: {e}"));
    let k = KernelMount::new(&img, "rw");
    let kq = k.q();
    let (out, err) = bash_in(
        Path::new("/"),
        &format!(
            "cd {kq} && sha256sum -c --quiet /dev/shm/ubtrfs-faults-again.sum && echo more > k && echo same"
        ),
    );
    k.umount();
    let _ = std::fs::remove_file("/dev/shm/ubtrfs-faults-keep.sum");
    let _ = std::fs::remove_file("/dev/shm/ubtrfs-faults-again.sum");
    assert!(
        out.contains("same"),
        "the kernel reads what the second mount wrote: {out}\n{err}"
    );
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after the kernel wrote: {e}"));
}

#[test]
fn a_block_device_the_mount_holds_is_refused_to_the_kernel_and_mkfs() {
    if !require_fuse("a_block_device_the_mount_holds_is_refused_to_the_kernel_and_mkfs") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("img");
    mkfs_btrfs(&img, 512 << 20, &[]);
    let dev = Loop::attach(&img);
    let mut fm = FuseMount::start(&UBTRFS, &[dev.0.as_str()], &["rw"]);
    fm.run("echo held > held", "writing");

    let kmnt = dir.path().join("k");
    std::fs::create_dir(&kmnt).expect("mkdir");
    let kernel = Command::new("mount")
        .arg(&dev.0)
        .arg(&kmnt)
        .output()
        .expect("mount");
    if kernel.status.success() {
        let _ = Command::new("umount").arg(&kmnt).status();
        panic!("the kernel mounted {} while ubtrfs held it", dev.0);
    }
    let mkfs = Command::new("mkfs.btrfs")
        .args(["-q", "-f", &dev.0])
        .output()
        .expect("mkfs.btrfs");
    assert!(
        !mkfs.status.success(),
        "mkfs.btrfs formatted {} under the mount",
        dev.0
    );
    // Another ubtrfs writer is refused too (the lock, and the claim).
    let (ok, _, err) = UBTRFS.run(&["mkdir", dev.0.as_str(), "/other"]);
    assert!(!ok, "a second ubtrfs writer was let in");
    assert!(
        err.contains("busy") || err.contains("in use"),
        "the refusal says why: {err}"
    );

    let st = fm.unmount();
    assert!(st.success(), "server exit {st}: {}", fm.log());
    // Released at the unmount: the kernel mounts that very device and sees the file.
    forget_devices(None);
    run_text(Command::new("mount").arg(&dev.0).arg(&kmnt))
        .unwrap_or_else(|e| panic!("the kernel's mount after the unmount: {e}"));
    let seen = std::fs::read_to_string(kmnt.join("held")).unwrap_or_default();
    let _ = Command::new("umount").arg(&kmnt).status();
    assert_eq!(seen, "held\n", "the kernel's view after the unmount");
    drop(dev);
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("{e}"));
}
