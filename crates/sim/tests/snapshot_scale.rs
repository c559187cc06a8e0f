//! A snapshot costs the same whatever its subvolume holds (issue 13: "a snapshot of
//! a subvolume with a million files is as quick as of an empty one"). Made by the
//! engine: a subvolume `big` with `UBTRFS_SNAPSHOT_FILES` files (default 1,000,000;
//! every hundredth with 100 bytes of data), and an empty one. The commit writing a
//! snapshot of `big` writes no more tree blocks than the one writing a snapshot of
//! the empty subvolume, give or take the extent tree leaves that the references of
//! `big`'s root's children touch (its fan-out, at most a node's worth, not its
//! size; the kernel's copied root adds the same references) — counted in blocks,
//! never timed. Then a file is changed in the snapshot, the image is `btrfs check`
//! clean, and (as root) the kernel mounts it, lists every name of the snapshot and
//! reads both versions of the changed file; it deletes the snapshot and its cleaner
//! finishes, `btrfs check` clean again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::tools::mkfs::{make_filesystem, MkfsOptions};
use ubtrfs_core::{Device, NewInode};
use ubtrfs_sim::host::{bash_ok, btrfs_check, env_u64, require_root};
use ubtrfs_sim::model::SparseMem;
use ubtrfs_sim::mount::KernelMount;

/// Counts the bytes written to a device.
#[derive(Debug)]
struct Counting {
    inner: Arc<SparseMem>,
    written: AtomicU64,
}

impl Device for Counting {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.written.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

fn t0(n: i64) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + n,
        nsec: 0,
    }
}

#[test]
fn snapshot_of_a_million_files_costs_what_an_empty_one_does() {
    let files = env_u64("UBTRFS_SNAPSHOT_FILES").unwrap_or(1_000_000);
    let mem = SparseMem::new(6 << 30, "snapshot-scale");
    let dev = Arc::new(Counting {
        inner: mem.clone(),
        written: AtomicU64::new(0),
    });
    // Single metadata: every block counted once.
    let opts = MkfsOptions {
        time: Some(t0(0)),
        metadata_profile: 0,
        ..Default::default()
    };
    let nodesize = u64::from(opts.nodesize);
    let mut t = make_filesystem(dev.clone() as Arc<dyn Device>, &opts).expect("mkfs");
    let big = t
        .create_subvolume(5, 256, b"big", 0o40755, 0, 0, t0(1))
        .expect("subvolume big");
    let empty = t
        .create_subvolume(5, 256, b"empty", 0o40755, 0, 0, t0(1))
        .expect("subvolume empty");
    let attr = NewInode {
        mode: 0o100644,
        uid: 0,
        gid: 0,
        rdev: 0,
        time: t0(2),
    };
    for i in 0..files {
        let name = format!("file-{i:07}");
        let ino = t.create(big, 256, name.as_bytes(), attr).expect("create");
        if i % 100 == 0 {
            t.write(big, ino, 0, &[(i % 251) as u8; 100], t0(2))
                .expect("write");
        }
        if i % 100_000 == 99_999 {
            t.commit().expect("commit");
        }
    }
    t.commit().expect("commit");
    let root_ptr = t.root_ptr(big).expect("big's root");
    let level = root_ptr.level;
    let path = ubtrfs_core::search_slot(&t.fs.info, &root_ptr, &ubtrfs_core::format::key::Key::MIN)
        .expect("search big's tree");
    let children = path.nodes.last().expect("a root").0.nritems() as u64;

    // A snapshot's own commit: what the snapshot made, written.
    let snapshot_blocks = |t: &mut ubtrfs_core::Trans, src: u64, name: &[u8]| -> u64 {
        let before = dev.written.load(Ordering::Relaxed);
        t.create_snapshot(src, 5, 256, name, false, t0(3))
            .expect("snapshot");
        t.commit().expect("commit the snapshot");
        (dev.written.load(Ordering::Relaxed) - before) / nodesize
    };
    let of_empty = snapshot_blocks(&mut t, empty, b"snap-empty");
    let of_big = snapshot_blocks(&mut t, big, b"snap-big");
    eprintln!(
        "snapshot_scale: {files} files (tree level {level}, {children} children under its \
         root): the snapshot's commit wrote {of_big} blocks of {nodesize} bytes, {of_empty} \
         for an empty subvolume"
    );
    // Beyond what any snapshot writes: the extent items of the root's children gain
    // a reference (the kernel's btrfs_inc_ref on a copied root), at most one extent
    // tree leaf and one free-space tree leaf each.
    assert!(
        of_big <= of_empty + 2 * children,
        "a snapshot of {files} files wrote {of_big} blocks, of an empty subvolume {of_empty} \
         ({children} children under the root)"
    );
    // A change on the snapshot's side only.
    let snap = t.fs.resolve("/snap-big").expect("snapshot").root;
    let (ino, _, _) = t
        .lookup(snap, 256, b"file-0000100")
        .expect("lookup")
        .expect("file-0000100");
    t.write(snap, ino, 0, b"changed in the snapshot", t0(4))
        .expect("write into the snapshot");
    t.commit().expect("commit");
    drop(t);

    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("img");
    let f = std::fs::File::create(&img).expect("image");
    f.set_len(mem.size()).expect("size");
    mem.write_to(&f).expect("write the image");
    drop(f);
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check: {e}"));
    if !require_root("snapshot_of_a_million_files_costs_what_an_empty_one_does: the kernel") {
        return;
    }
    let k = KernelMount::new(&img, "rw");
    let script = format!(
        "set -e; test $(ls -f snap-big | wc -l) = {}; \
         test \"$(head -c 23 snap-big/file-0000100)\" = 'changed in the snapshot'; \
         test \"$(od -An -tu1 -N1 big/file-0000100 | tr -d ' ')\" = {}; \
         btrfs -q subvolume delete snap-big; btrfs filesystem sync .; btrfs subvolume sync .",
        files + 2,
        // file-0000100's data: 100 bytes of 100 % 251.
        100
    );
    bash_ok(&k.path(""), &script).unwrap_or_else(|e| panic!("the kernel's view: {e}"));
    k.umount();
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after the kernel: {e}"));
}
