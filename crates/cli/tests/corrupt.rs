//! Damaged images: a flipped data sector is an I/O error naming the file, offset and
//! both checksums for `cat --strict` (plain `cat` gives the bytes as found, reports
//! them and exits 3); a damaged metadata copy is worked around with a warning naming the
//! copy; a wrecked superblock or tree root is a one-line error, never a panic.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use ubtrfs_core::{Filesystem, OpenOptions as FsOpen};
use ubtrfs_format::items::FileExtentBody;
use ubtrfs_sim::golden::basic_image;
use ubtrfs_sim::host::Ubtrfs;

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// Physical offset (single device) of logical `l`, copy `mirror`.
fn physical(fs: &Filesystem, l: u64, mirror: usize) -> u64 {
    fs.info
        .chunk_map
        .lookup(l)
        .unwrap()
        .map(l, mirror)
        .unwrap()
        .offset
}

fn flip(img: &Path, off: u64) {
    let f = OpenOptions::new().read(true).write(true).open(img).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, off).unwrap();
}

#[test]
fn data_checksum_mismatch_names_file_offset_and_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let img = basic_image(dir.path());
    let path = "/dir1/dir2/size-1m";
    let (disk, second_sector) = {
        let fs = Filesystem::open_paths(&[&img], FsOpen::default()).unwrap();
        let node = fs.resolve(path).unwrap();
        let ext = fs.file_extents(node).unwrap();
        let FileExtentBody::Regular {
            disk_bytenr,
            offset,
            ..
        } = ext[0].item.body
        else {
            panic!("expected a regular extent: {:?}", ext[0]);
        };
        assert_eq!(ext[0].item.compression, 0);
        let l = disk_bytenr + offset + 4096;
        (physical(&fs, l, 0), l)
    };
    flip(&img, disk + 100);
    // cat salvages: every byte, the damaged sector as found, the damage reported,
    // exit 3. --strict: a one-line error and no success.
    let o = UBTRFS.output(&["cat", img.to_str().unwrap(), path]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert_eq!(o.stdout.len(), 1 << 20);
    assert!(
        err.contains("ubtrfs: damaged:") && err.contains(&second_sector.to_string()),
        "{err}"
    );
    let (ok, out, err) = UBTRFS.run(&["cat", "--strict", img.to_str().unwrap(), path]);
    assert!(!ok, "cat --strict of a corrupted file must fail");
    assert!(out.len() < 1 << 20, "no partial file reported as success");
    let line = err.trim();
    assert_eq!(line.lines().count(), 1, "one-line error: {err}");
    assert!(line.contains(path), "{line}");
    assert!(line.contains("checksum mismatch"), "{line}");
    assert!(
        line.contains("expected") && line.contains("found"),
        "{line}"
    );
    assert!(line.contains(&second_sector.to_string()), "{line}");
    // --no-csum reads what is there.
    let (ok, out, _) = UBTRFS.run(&["cat", "--no-csum", img.to_str().unwrap(), path]);
    assert!(ok);
    assert_eq!(out.len(), 1 << 20);
}

#[test]
fn bad_metadata_copy_is_worked_around_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let img = basic_image(dir.path());
    let (p0, root_bytenr) = {
        let fs = Filesystem::open_paths(&[&img], FsOpen::default()).unwrap();
        let root = fs.root(5).unwrap();
        assert_eq!(
            fs.info.num_mirrors(root.bytenr).unwrap(),
            2,
            "metadata is DUP"
        );
        (physical(&fs, root.bytenr, 0), root.bytenr)
    };
    flip(&img, p0 + 200);
    let (ok, out, err) = UBTRFS.run(&["ls", img.to_str().unwrap(), "/"]);
    assert!(ok, "the second copy must rescue the read: {err}");
    assert!(out.contains("dir1"));
    assert!(err.contains("warning"), "{err}");
    assert!(err.contains(&format!("tree block {root_bytenr}")), "{err}");
    assert!(
        err.contains("copy 1") && err.contains("used copy 2"),
        "{err}"
    );
}

#[test]
fn both_metadata_copies_bad_is_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let img = basic_image(dir.path());
    let (p0, p1, root_bytenr) = {
        let fs = Filesystem::open_paths(&[&img], FsOpen::default()).unwrap();
        let root = fs.root(5).unwrap();
        (
            physical(&fs, root.bytenr, 0),
            physical(&fs, root.bytenr, 1),
            root.bytenr,
        )
    };
    flip(&img, p0 + 200);
    flip(&img, p1 + 200);
    // ls and cat salvage: the lost block is one line naming it, then the error
    // that stopped it (the top directory is in that block); `cat --strict` and the
    // other readers: one line.
    let o = UBTRFS.output(&["ls", img.to_str().unwrap(), "/"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 2, "{err}");
    assert!(
        err.contains(&format!("lost: tree block {root_bytenr}")),
        "{err}"
    );
    assert!(err.contains("checksum mismatch"), "{err}");
    let (ok, _, err) = UBTRFS.run(&["cat", img.to_str().unwrap(), "/dir1/dir2/size-1m"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 2, "{err}");
    let (ok, _, err) = UBTRFS.run(&[
        "cat",
        "--strict",
        img.to_str().unwrap(),
        "/dir1/dir2/size-1m",
    ]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&format!("tree block {root_bytenr}")), "{err}");
}

#[test]
fn bad_primary_superblock_falls_back_to_a_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let img = basic_image(dir.path());
    flip(&img, 0x10000 + 0x100);
    let (ok, out, err) = UBTRFS.run(&["ls", img.to_str().unwrap(), "/"]);
    assert!(ok, "{err}");
    assert!(out.contains("dir1"));
    assert!(
        err.contains("superblock copy 0") && err.contains("checksum mismatch"),
        "{err}"
    );
}

#[test]
fn hostile_and_truncated_images_give_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("zeros", vec![0u8; 1 << 20]),
        ("short", vec![0xffu8; 70000]),
    ];
    for (name, bytes) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let (ok, _, err) = UBTRFS.run(&["ls", p.to_str().unwrap(), "/"]);
        assert!(!ok, "{name}");
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(err.starts_with("ubtrfs: error:"), "{name}: {err}");
    }
    // A truncated real image: the superblock is fine, the trees are gone.
    let img = basic_image(dir.path());
    let f = OpenOptions::new().write(true).open(&img).unwrap();
    f.set_len(4 << 20).unwrap();
    let (ok, _, err) = UBTRFS.run(&["ls", "-R", img.to_str().unwrap(), "/"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let mut f = File::open(&img).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
}

#[test]
fn missing_path_and_wrong_types_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let img = basic_image(dir.path());
    let img = img.to_str().unwrap();
    let (ok, _, err) = UBTRFS.run(&["cat", img, "/no/such/file"]);
    assert!(!ok);
    assert!(err.contains("No such file or directory"), "{err}");
    let (ok, _, err) = UBTRFS.run(&["cat", img, "/dir1"]);
    assert!(!ok);
    assert!(err.contains("Is a directory"), "{err}");
    let (ok, _, err) = UBTRFS.run(&["ls", img, "/dir1/dir2/size-1m/x"]);
    assert!(!ok);
    assert!(err.contains("Not a directory"), "{err}");
}
