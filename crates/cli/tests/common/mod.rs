//! Shared by the golden-image tests: where the golden set is and how to unpack it.
#![allow(dead_code)]

use serde_json::Value;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// tests/golden, or $UBTRFS_GOLDEN_DIR (CI points it at a set made by this kernel).
pub fn golden_dir() -> PathBuf {
    match std::env::var_os("UBTRFS_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden"),
    }
}

/// Decompresses a .img.zst into a sparse file (zero runs become holes).
pub fn unpack(src: &Path, dst: &Path) {
    let f = File::open(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let mut dec = zstd::stream::read::Decoder::new(f).expect("zstd");
    let mut out = File::create(dst).expect("create image");
    let mut buf = vec![0u8; 1 << 16];
    let mut pos = 0u64;
    loop {
        let mut n = 0;
        while n < buf.len() {
            let r = dec.read(&mut buf[n..]).expect("decompress");
            if r == 0 {
                break;
            }
            n += r;
        }
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            out.seek(SeekFrom::Start(pos)).expect("seek");
            out.write_all(&buf[..n]).expect("write");
        }
        pos += n as u64;
    }
    out.set_len(pos).expect("set_len");
}

/// A golden set's devices, unpacked into a temporary directory.
pub struct Unpacked {
    pub dir: tempfile::TempDir,
    pub devices: Vec<PathBuf>,
}

pub fn unpack_set(m: &Value) -> Unpacked {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut devices = Vec::new();
    for d in m["devices"].as_array().expect("devices") {
        let name = d.as_str().expect("device name");
        let out = dir.path().join(name.trim_end_matches(".zst"));
        unpack(&golden_dir().join(name), &out);
        devices.push(out);
    }
    Unpacked { dir, devices }
}

/// Manifest fields a reader must reproduce exactly (besides the subvolume, which a
/// FUSE mount cannot show: it has one st_dev).
pub const STAT_FIELDS: &[&str] = &[
    "type",
    "ino",
    "mode",
    "nlink",
    "uid",
    "gid",
    "rdev",
    "size",
    "blocks",
    "atime",
    "mtime",
    "ctime",
    "crtime",
    "sha256",
    "target_hex",
    "xattrs",
];
