//! `ubtrfs filesystem resize` against the kernel's `btrfs filesystem resize` on twin
//! images: growing and shrinking (where no chunk lies beyond) give the same
//! superblock total, device item and image size; the kernel then fills the grown
//! space; a shrink over allocated chunks relocates them first (the same sizes and
//! files as the kernel's shrink of the twin), and one below the data is refused.
//!
//! Needs root (loop devices); skipped with a line outside CI.

use std::path::Path;
use ubtrfs_sim::host::{btrfs_check, require_root, serial, sh, shell_quote, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, KernelMount};

fn bin() -> Ubtrfs {
    Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs")).with_limit(120)
}

/// The sizes the filesystem records: superblock total, its device item, the chunk
/// tree's device item, and the image file's length.
fn sizes(img: &Path) -> (String, String, String, u64) {
    let q = shell_quote(img);
    let sb = sh(&format!("btrfs inspect-internal dump-super {q}"));
    let field = |name: &str| {
        sb.lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    let chunk = sh(&format!(
        "btrfs inspect-internal dump-tree -t chunk {q} | grep -A2 DEV_ITEM | grep total_bytes"
    ));
    let len = std::fs::metadata(img).expect("stat").len();
    (
        field("total_bytes"),
        field("dev_item.total_bytes"),
        chunk.trim().to_string(),
        len,
    )
}

/// The kernel's resize of `img` by `spec` (the loop device sized to the file, grown
/// first when the size grows).
fn kernel_resize(img: &Path, spec: &str, grow_to: Option<u64>) {
    if let Some(n) = grow_to {
        std::fs::OpenOptions::new()
            .write(true)
            .open(img)
            .and_then(|f| f.set_len(n))
            .expect("grow the file");
    }
    let k = KernelMount::new(img, "rw");
    sh(&format!(
        "btrfs filesystem resize {spec} {} >/dev/null",
        k.q()
    ));
    k.umount();
}

#[test]
fn resize_like_the_kernel() {
    if !require_root("resize_like_the_kernel") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let ours = dir.path().join("ours.img");
    let theirs = dir.path().join("theirs.img");
    mkfs_btrfs(&ours, 1 << 30, &[]);
    {
        let k = KernelMount::new(&ours, "rw");
        sh(&format!(
            "head -c 50000000 /dev/urandom > {}/x; sync",
            k.q()
        ));
        k.umount();
    }
    std::fs::copy(&ours, &theirs).expect("twin");
    let p = ours.display().to_string();

    // Grow by 512 MiB.
    bin().stdout(&["filesystem", "resize", &p, "+512M"]);
    kernel_resize(&theirs, "+512M", Some(1536 << 20));
    assert_eq!(sizes(&ours), sizes(&theirs), "after growing");
    btrfs_check(&ours, None).unwrap_or_else(|e| panic!("after growing: {e}"));
    // The kernel uses the new space: more than the old size in all.
    {
        let k = KernelMount::new(&ours, "rw");
        sh(&format!(
            "head -c 1200000000 /dev/zero > {}/big; sync",
            k.q()
        ));
        k.umount();
    }
    btrfs_check(&ours, None).unwrap_or_else(|e| panic!("after the kernel filled it: {e}"));

    // Shrink a fresh pair by 256 MiB (nothing allocated there).
    mkfs_btrfs(&ours, 1 << 30, &[]);
    std::fs::copy(&ours, &theirs).expect("twin");
    bin().stdout(&["filesystem", "resize", &p, "-256M"]);
    kernel_resize(&theirs, "-256M", None);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&theirs)
        .and_then(|f| f.set_len(768 << 20))
        .expect("cut the twin");
    assert_eq!(sizes(&ours), sizes(&theirs), "after shrinking");
    btrfs_check(&ours, None).unwrap_or_else(|e| panic!("after shrinking: {e}"));
    let k = KernelMount::new(&ours, "ro");
    k.umount();

    // A shrink over allocated chunks: they are relocated below the new size, as
    // the kernel does; both twins end with the same sizes and the same files.
    mkfs_btrfs(&ours, 1 << 30, &[]);
    {
        let k = KernelMount::new(&ours, "rw");
        sh(&format!(
            "cd {}; for i in $(seq 1 180); do head -c 1000000 /dev/urandom > f$i; \
             [ $((i % 30)) = 0 ] && sync; done; rm f*[02468]; \
             btrfs subvolume snapshot . snap >/dev/null; echo x >> f1; sync",
            k.q()
        ));
        k.umount();
    }
    std::fs::copy(&ours, &theirs).expect("twin");
    let chunks_end = |img: &Path| -> u64 {
        sh(&format!(
            "btrfs inspect-internal dump-tree -t dev {} | awk '/DEV_EXTENT/ {{ o = $6 }} /length/ {{ e = o + $NF; if (e > m) m = e }} END {{ print m }}'",
            shell_quote(img)
        ))
        .trim()
        .parse()
        .expect("dev extent end")
    };
    assert!(
        chunks_end(&ours) > 300 << 20,
        "the data reaches past 300 MiB"
    );
    let view = |img: &Path| {
        let k = KernelMount::new(img, "ro");
        let t = ubtrfs_sim::golden::walk_mounted(&k.mnt);
        k.umount();
        t
    };
    let files = view(&ours);
    bin().stdout(&["filesystem", "resize", &p, "300M"]);
    kernel_resize(&theirs, "300M", None);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&theirs)
        .and_then(|f| f.set_len(300 << 20))
        .expect("cut the twin");
    assert_eq!(sizes(&ours), sizes(&theirs), "after shrinking over chunks");
    assert!(chunks_end(&ours) <= 300 << 20);
    btrfs_check(&ours, None).unwrap_or_else(|e| panic!("after shrinking over chunks: {e}"));
    assert_eq!(view(&ours), files, "files after shrinking over chunks");

    // Too small for what is allocated: refused with ENOSPC, the device keeps
    // its size and the filesystem stays valid.
    let before = sizes(&ours);
    let o = bin().output(&["filesystem", "resize", &p, "80M"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "a shrink below the data: {err}");
    assert_eq!(sizes(&ours), before, "a refused shrink changed the size");
    btrfs_check(&ours, None).unwrap_or_else(|e| panic!("after a refused shrink: {e}"));
    assert_eq!(view(&ours), files, "files after a refused shrink");
}
