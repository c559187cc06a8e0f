//! A full filesystem on the read-write `ubtrfs mount` behaves as on the kernel's:
//! writers get ENOSPC, the mount stays read-write, nothing already written is lost,
//! and once files are removed the space can be written again. Two ways to fill it,
//! each on a ubtrfs mount and on a kernel btrfs loop mount of the same size in the
//! same run: data (one big file), and metadata (many small inline files). After each,
//! `btrfs check --readonly --check-data-csum` is clean and the kernel shows what the
//! FUSE mount showed.
//!
//! Needs root (/dev/fuse, loop devices); skipped with a line outside CI.

use std::path::Path;
use ubtrfs_sim::golden::{compare_walks, report, walk_mounted, STAT_FIELDS};
use ubtrfs_sim::host::{bash_in, btrfs_check, require_fuse, serial, EnableUring, Ubtrfs};
use ubtrfs_sim::mount::{kernel_round_trip, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// Fills the filesystem, prints what fit ("filled N"), checks the first file is
/// intact, frees everything but it, and writes again ("rewrote N") unless
/// `REWRITE=0`. Every ENOSPC is expected; any other error fails the script.
const WORKLOAD: &str = r#"
set -eu
python3 - "$MODE" "$REWRITE" <<'PY'
import errno, hashlib, os, random, sys
mode = sys.argv[1]
rewrite = sys.argv[2] == '1'
random.seed(3)
keep = random.randbytes(1 << 20)
open('keep', 'wb').write(keep)
os.sync()
def fill():
    n = 0
    try:
        if mode == 'data':
            with open('big', 'wb') as f:
                while True:
                    f.write(random.randbytes(1 << 20))
                    n += 1
        else:
            os.makedirs('many', exist_ok=True)
            while True:
                with open(f'many/f{n:07d}', 'wb') as f:
                    f.write(b'%07d' % n * 250)
                n += 1
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    return n
n = fill()
print('filled', n)
assert n > 0
assert open('keep', 'rb').read() == keep, 'kept file changed'
# The mount is still read-write: removing works on a full filesystem.
if mode == 'data':
    os.unlink('big')
else:
    for name in os.listdir('many'):
        os.unlink('many/' + name)
    os.rmdir('many')
os.sync()
if not rewrite:
    print('rewrote 0')
    sys.exit(0)
m = fill()
print('rewrote', m)
assert m > n // 2, f'after freeing, only {m} of {n} fit again'
if mode == 'data':
    os.unlink('big')
else:
    for name in sorted(os.listdir('many'))[1000:]:
        os.unlink('many/' + name)
PY
"#;

/// Runs the workload in `dir`; returns (filled, rewrote).
fn run(dir: &Path, mode: &str, rewrite: bool, log: impl Fn() -> String) -> (u64, u64) {
    let script = format!(
        "MODE={mode} REWRITE={}\n{WORKLOAD}\necho done >&2",
        rewrite as u8
    );
    let (out, err) = bash_in(dir, &script);
    assert!(
        err.trim_end().ends_with("done"),
        "{mode} workload in {}: {out}\n{err}\n{}",
        dir.display(),
        log()
    );
    let num = |key: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no '{key}' in: {out}"))
    };
    (num("filled "), num("rewrote "))
}

#[test]
fn rw_mount_full_filesystem_gives_enospc_and_recovers() {
    if !require_fuse("rw_mount_full_filesystem_gives_enospc_and_recovers") {
        return;
    }
    let _serial = serial();
    fill_free_fill(&["data", "metadata"]);
}

/// The metadata fill again under FUSE over io_uring, where the kernel's forgets of
/// the removed files come in batches and their inodes are deleted a group to a
/// change: on the full filesystem a group's reservation did not fit, and every
/// batched orphan stayed until the next mount (2,000 new files fit again of 48,300).
#[test]
fn rw_mount_full_filesystem_recovers_over_io_uring() {
    if !require_fuse("rw_mount_full_filesystem_recovers_over_io_uring") {
        return;
    }
    let _serial = serial();
    let Some(_uring) = EnableUring::on_or_skip("rw_mount_full_filesystem_recovers_over_io_uring")
    else {
        return;
    };
    fill_free_fill(&["metadata"]);
}

/// Each mode's workload on a ubtrfs mount and (filling only) a kernel mount of the
/// same size, then the checks against the kernel.
fn fill_free_fill(modes: &[&str]) {
    for &mode in modes {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("ubtrfs.img");
        let kimg = dir.path().join("kernel.img");
        let size = 256 << 20;
        mkfs_btrfs(&img, size, &[]);
        mkfs_btrfs(&kimg, size, &[]);

        // The kernel only fills (what the assertion below compares with): its
        // ENOSPC flushing makes a metadata fill take a minute here, so it runs
        // beside ubtrfs's whole workload instead of before it.
        let k = KernelMount::new(&kimg, "rw");
        let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
        let (kernel, ours) = std::thread::scope(|s| {
            let kernel = s.spawn(|| run(&k.path(""), mode, false, String::new));
            let ours = run(&fm.mnt, mode, true, || fm.log());
            (kernel.join().expect("kernel workload"), ours)
        });
        k.umount();
        let tree = walk_mounted(&fm.mnt);
        let st = fm.unmount();
        assert!(st.success(), "server exit {st}: {}", fm.log());
        eprintln!(
            "{mode}: kernel filled {}; ubtrfs filled {} and rewrote {}",
            kernel.0, ours.0, ours.1
        );
        // Both count what fit in units of 1 MiB files or 1,750-byte files: ubtrfs
        // must not give up much earlier than the kernel.
        assert!(
            ours.0 * 10 >= kernel.0 * 7,
            "{mode}: ubtrfs fit {} where the kernel fit {}",
            ours.0,
            kernel.0
        );
        assert!(
            !fm.log().contains("transaction aborted"),
            "{mode}: the mount aborted: {}",
            fm.log()
        );
        btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check ({mode}): {e}"));
        let k = KernelMount::new(&img, "ro");
        report(compare_walks(
            &format!("kernel view after filling ({mode})"),
            &tree,
            &walk_mounted(&k.path("")),
            STAT_FIELDS,
        ));
        k.umount();
    }
}

/// A program that stores into a shared mmap of a file learns nothing until msync:
/// the kernel's btrfs reserves data space when the page is first dirtied (SIGBUS
/// when the filesystem is full), but the FUSE module never asks the server then, so
/// the mount learns of the data only when the kernel writes the pages back. On a
/// full filesystem: what fits in the data reserve kept for such write-back is
/// written (msync succeeds); beyond it msync reports ENOSPC, and reads show what the
/// filesystem holds, not the pages that could not be written (the kernel's view
/// after the unmount). Found by fsstress (mwrite) on a full 128 MiB filesystem: the
/// mount showed data that was gone after the unmount. Before that, a
/// copy_file_range (a clone, needing no data space on the kernel) must work on the
/// full filesystem: ubtrfs reserved a sector of data for it.
const MMAP_WORKLOAD: &str = r#"
set -eu
python3 - <<'PY'
import errno, hashlib, mmap, os
MIB = 1 << 20
fd = os.open('h', os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 16 * MIB)  # a hole: every page stored into needs new space
os.fsync(fd)
with open('src', 'wb') as f:
    f.write(os.urandom(MIB))
for size in (MIB, 4096):
    try:
        with open(f'fill{size}', 'wb') as f:
            while True:
                f.write(os.urandom(size))
                f.flush()
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
# copy_file_range shares the extents, as the kernel's clone: no data space needed.
s, t = os.open('src', os.O_RDONLY), os.open('clone', os.O_WRONLY | os.O_CREAT, 0o644)
assert os.copy_file_range(s, t, MIB) == MIB
os.close(s)
os.close(t)
assert open('clone', 'rb').read() == open('src', 'rb').read()
print('cloned on a full filesystem')
m = mmap.mmap(fd, 16 * MIB)
m[:MIB] = b'x' * MIB
m.flush()  # msync: within the reserve, written
print('first MiB synced')
m[MIB:] = b'y' * (15 * MIB)
try:
    m.flush()
    print('rest synced')
except OSError as e:
    assert e.errno == errno.ENOSPC, e
    print('rest: ENOSPC')
m.close()
os.close(fd)
data = open('h', 'rb').read()
assert data[:MIB] == b'x' * MIB, 'the synced MiB is not what reads show'
print('sha', hashlib.sha256(data).hexdigest())
PY
"#;

#[test]
fn mmap_write_back_on_a_full_filesystem() {
    if !require_fuse("mmap_write_back_on_a_full_filesystem") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("ubtrfs.img");
    mkfs_btrfs(&img, 128 << 20, &[]);
    let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let (out, err) = bash_in(&fm.mnt, MMAP_WORKLOAD);
    assert!(
        out.contains("cloned on a full filesystem")
            && out.contains("first MiB synced")
            && out.contains("sha "),
        "{out}\n{err}\n{}",
        fm.log()
    );
    eprintln!("{out}");
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&img, &seen, "mmap write-back on a full filesystem");
}
