//! O_TMPFILE on the read-write `ubtrfs mount`, as on the kernel's btrfs: a file with
//! no name that linkat(2) can name (unless opened O_EXCL), that vanishes when closed
//! unnamed, and that a crash while it is open leaves as an orphan the next mount
//! deletes. The same script runs on a kernel btrfs loop mount; both trees must be
//! equal, the image checks clean and the kernel shows what the FUSE mount showed.
//!
//! Needs root (/dev/fuse, loop devices); skipped with a line outside CI.

use std::time::Duration;
use ubtrfs_sim::golden::{compare_walks, report, walk_mounted, STAT_FIELDS};
use ubtrfs_sim::host::{bash_in, btrfs_check, require_fuse, serial, Ubtrfs};
use ubtrfs_sim::mount::{kernel_workload, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

const WORKLOAD: &str = r#"
set -eu
mkdir d
python3 - <<'PY'
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def link(fd, path):
    # linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH): names an open file (root).
    if libc.linkat(fd, b'', -100, path.encode(), 0x1000) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def tmp(flags=0):
    return os.open('d', os.O_TMPFILE | os.O_RDWR | flags, 0o640)
fd = tmp()
os.write(fd, b'named later\n' * 1000)
assert os.listdir('d') == []
link(fd, 'd/named')
os.write(fd, b'after the link\n')
os.close(fd)
fd = tmp()
os.write(fd, b'never named')
os.close(fd)
fd = tmp(os.O_EXCL)
try:
    link(fd, 'd/excl')
    raise SystemExit('O_EXCL tmpfile was linked')
except OSError as e:
    assert e.errno == errno.ENOENT, e
os.close(fd)
st = os.stat('d/named')
assert st.st_nlink == 1 and st.st_mode & 0o777 == 0o640, st
PY
"#;

#[test]
fn rw_mount_o_tmpfile() {
    if !require_fuse("rw_mount_o_tmpfile") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("ubtrfs.img");
    let kimg = dir.path().join("kernel.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    mkfs_btrfs(&kimg, 1 << 30, &[]);

    let kernel_tree = kernel_workload(&kimg, "rw", WORKLOAD, "tmpfile workload");
    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    fm.run(WORKLOAD, "tmpfile workload");
    let tree = walk_mounted(&fm.mnt);
    report(compare_walks(
        "ubtrfs vs kernel",
        &kernel_tree,
        &tree,
        &["type", "mode", "nlink", "size", "sha256"],
    ));

    // A tmpfile open across a commit, then the server dies: an orphan on disk. (The
    // fsync of an unnamed tmpfile makes nothing else durable, as on the kernel, whose
    // log replay skips an inode without links: `btrfs filesystem sync` commits.)
    let held = dir.path().join("held.out");
    let (_, err) = bash_in(
        &fm.mnt,
        &format!(
            "python3 -c \"import os,time; fd=os.open('d', os.O_TMPFILE|os.O_RDWR, 0o600); \
             os.write(fd, b'x'*100000); os.fsync(fd); print('ready', flush=True); time.sleep(20)\" \
             > {held} 2>&1 </dev/null & \
             for i in $(seq 100); do grep -q ready {held} 2>/dev/null && break; sleep 0.1; done; \
             btrfs -q filesystem sync . && echo done >&2",
            held = held.display()
        ),
    );
    assert!(err.trim_end().ends_with("done"), "{err}");
    let _ = fm.child.kill();
    fm.wait(Duration::from_secs(10));
    drop(fm);
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check with an orphan: {e}"));
    // The kernel deletes the orphan at mount; the named file stays.
    let k = KernelMount::new(&img, "rw");
    let seen = walk_mounted(&k.path(""));
    k.umount();
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after orphan cleanup: {e}"));
    report(compare_walks("kernel view", &tree, &seen, STAT_FIELDS));
}
