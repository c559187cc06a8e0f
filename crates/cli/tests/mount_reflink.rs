//! copy_file_range on the read-write `ubtrfs mount` shares extents, as on the kernel's
//! btrfs (where the VFS turns it into a clone): one workload of copy_file_range
//! calls (aligned, unaligned, to end of file, within one file, over holes, of inline
//! files, into existing data) and `cp --reflink=auto` runs on a ubtrfs mount and on a
//! kernel btrfs loop mount, plain and with compress=zstd. Then:
//! - both trees are equal (sizes, contents);
//! - after unmounting, `btrfs check --readonly --check-data-csum` is clean and the
//!   kernel shows the ubtrfs image as the FUSE mount showed it;
//! - the kernel's `btrfs filesystem du` finds the copies sharing their data: the
//!   exclusive bytes of every copy are what they are on the kernel-made image (0 for
//!   a whole-sector copy), and a copy with unaligned offsets owns its data;
//! - the kernel then overwrites the shared data of one copy, the other stays intact.
//!
//! Needs root (/dev/fuse, loop devices); skipped with a line outside CI.

use ubtrfs_sim::golden::{compare_walks, report};
use ubtrfs_sim::host::{bash_ok, btrfs_check, require_fuse, serial, Ubtrfs};
use ubtrfs_sim::mount::{
    kernel_exclusive_bytes, kernel_round_trip, kernel_workload, mkfs_btrfs, FuseMount, KernelMount,
};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// Deterministic data, then copies made with copy_file_range(2) (looping on short
/// counts, as every caller must) and cp.
const WORKLOAD: &str = r#"
set -eu
python3 - <<'PY'
import os, random
random.seed(7)
open('big', 'wb').write(random.randbytes(3 * 1048576 + 100))
open('small', 'wb').write(b'inline data\n' * 10)
with open('holey', 'wb') as f:
    f.truncate(1 << 20)
    f.seek(200000)
    f.write(random.randbytes(70000))
open('target', 'wb').write(random.randbytes(300000))

def cfr(src, dst, so, do, n):
    fi = os.open(src, os.O_RDONLY)
    fo = os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644)
    while n > 0:
        c = os.copy_file_range(fi, fo, n, so, do)
        if c == 0:
            break
        so += c
        do += c
        n -= c
    os.close(fi)
    os.close(fo)

cfr('big', 'part', 4096, 8192, 1048576)      # aligned, from the middle
cfr('big', 'unaligned', 1000, 3, 500000)     # nothing aligned: copied
cfr('big', 'tail', 2 * 1048576, 0, 1 << 30)  # to the source's end of file
cfr('holey', 'holey2', 0, 0, 1 << 20)        # holes stay holes
cfr('small', 'small2', 0, 0, 1000)           # an inline file
cfr('big', 'target', 1048576, 65536, 131072) # into existing data
cfr('big', 'big', 0, 3 * 1048576 + 4096, 40960)  # within one file, past its end
PY
cp --reflink=auto big bigcopy
sync
"#;

const COPIES: &[&str] = &["part", "tail", "holey2", "bigcopy", "unaligned"];

#[test]
fn rw_mount_copy_file_range_shares_extents() {
    if !require_fuse("rw_mount_copy_file_range_shares_extents") {
        return;
    }
    let _serial = serial();
    for compress in ["", "compress=zstd"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("ubtrfs.img");
        let kimg = dir.path().join("kernel.img");
        mkfs_btrfs(&img, 1 << 30, &[]);
        mkfs_btrfs(&kimg, 1 << 30, &[]);
        let kopts = if compress.is_empty() {
            "rw".to_string()
        } else {
            format!("rw,{compress}")
        };

        let kernel_tree = kernel_workload(&kimg, &kopts, WORKLOAD, "copies");
        let k = KernelMount::new(&kimg, "ro");
        let kernel_excl = kernel_exclusive_bytes(&k.path(""), COPIES);
        k.umount();

        let mut opts = vec!["rw"];
        if !compress.is_empty() {
            opts.push(compress);
        }
        let fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &opts);
        fm.run(WORKLOAD, &format!("copies ({compress})"));
        let fuse_tree = fm.walk_and_unmount();
        report(compare_walks(
            &format!("ubtrfs mount vs kernel mount ({compress})"),
            &kernel_tree,
            &fuse_tree,
            &["type", "mode", "nlink", "size", "sha256"],
        ));
        kernel_round_trip(&img, &fuse_tree, &format!("copy_file_range ({compress})"));

        let k = KernelMount::new(&img, "rw");
        let ours = kernel_exclusive_bytes(&k.path(""), COPIES);
        assert_eq!(
            ours, kernel_excl,
            "exclusive bytes of the copies ({compress}): ubtrfs image vs kernel image"
        );
        assert_eq!(ours["bigcopy"], 0, "cp --reflink=auto shares everything");
        assert_eq!(ours["part"], 0, "an aligned range is shared");
        assert!(ours["unaligned"] > 0, "an unaligned copy owns its data");

        // The kernel overwrites shared data of one copy; the other keeps its bytes.
        bash_ok(
            &k.path(""),
            "want=$(sha256sum < big); \
             dd if=/dev/zero of=bigcopy bs=64K count=4 seek=2 conv=notrunc status=none; \
             sync; test \"$(sha256sum < big)\" = \"$want\"; ! cmp -s big bigcopy",
        )
        .unwrap_or_else(|e| panic!("kernel overwrite: {e}"));
        k.umount();
        btrfs_check(&img, None)
            .unwrap_or_else(|e| panic!("btrfs check after the kernel's overwrite: {e}"));
    }
}
