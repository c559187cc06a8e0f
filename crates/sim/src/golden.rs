//! The kernel-made golden images (tests/golden, or `$UBTRFS_GOLDEN_DIR`): finding,
//! unpacking and reading their manifests, and the manifest's value formats (hex,
//! times, type names, SHA-256 of a file) that walks of a filesystem produce to be
//! compared with them.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// The golden "basic" image, unpacked into `dir`.
pub fn basic_image(dir: &Path) -> PathBuf {
    let img = dir.join("basic.img");
    unpack(&golden_dir().join("basic.img.zst"), &img);
    img
}

/// A golden set's devices, unpacked into a temporary directory.
pub struct Unpacked {
    /// Temporary directory holding the devices (removed on drop).
    pub dir: tempfile::TempDir,
    /// The unpacked device images, in manifest order.
    pub devices: Vec<PathBuf>,
}

/// Unpacks the devices a manifest names.
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

/// The manifest of golden set `name`.
pub fn manifest(name: &str) -> Value {
    let p = golden_dir().join(format!("{name}.manifest.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .expect("manifest json")
}

/// The names of the golden sets, sorted; only those listed in `$UBTRFS_GOLDEN_ONLY`
/// (comma-separated) when it is set. Panics when there is none.
pub fn manifest_names() -> Vec<String> {
    let dir = golden_dir();
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let n = e.ok()?.file_name().to_string_lossy().to_string();
            n.strip_suffix(".manifest.json").map(str::to_string)
        })
        .filter(|n| match std::env::var("UBTRFS_GOLDEN_ONLY") {
            Ok(only) => only.split(',').any(|o| o == n),
            Err(_) => true,
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no golden manifests in {}", dir.display());
    v
}

/// Every golden set ([`manifest_names`]) with its manifest.
pub fn manifests() -> Vec<(String, Value)> {
    manifest_names()
        .into_iter()
        .map(|n| {
            let m = manifest(&n);
            (n, m)
        })
        .collect()
}

/// The manifest's entries under `prefix` ("" for all) by path, re-rooted there.
pub fn entries_under(m: &Value, prefix: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for e in m["entries"].as_array().expect("entries") {
        let p = e["path"].as_str().expect("path");
        let rel = if prefix.is_empty() {
            Some(p.to_string())
        } else if p == prefix {
            Some("/".to_string())
        } else {
            p.strip_prefix(prefix)
                .filter(|r| r.starts_with('/'))
                .map(str::to_string)
        };
        if let Some(r) = rel {
            out.insert(r, e.clone());
        }
    }
    out
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

/// Whether `field` of a manifest entry can be compared: the kernel makes up the times
/// of the ino-2 placeholder of a subvolume inside a snapshot ("now" at lookup).
pub fn comparable(entry: &Value, field: &str) -> bool {
    !(entry["ino"] == 2 && ["atime", "mtime", "ctime", "crtime"].contains(&field))
}

/// Differences of `fields` between two walks ([`walk_mounted`]) of one tree: paths
/// missing from `got`, paths only in `got`, and every field that differs, each line
/// starting with `what`.
pub fn compare_walks(
    what: &str,
    want: &BTreeMap<String, Value>,
    got: &BTreeMap<String, Value>,
    fields: &[&str],
) -> Vec<String> {
    compare_walks_except(what, want, got, fields, |_, _, _| false)
}

/// [`compare_walks`], where `allowed(field, want, got)` may excuse a difference
/// (e.g. times a replay sets to "now"). The made-up times of a placeholder
/// ([`comparable`]) are never compared.
pub fn compare_walks_except(
    what: &str,
    want: &BTreeMap<String, Value>,
    got: &BTreeMap<String, Value>,
    fields: &[&str],
    allowed: impl Fn(&str, &Value, &Value) -> bool,
) -> Vec<String> {
    let mut diffs = Vec::new();
    for p in want.keys().filter(|p| !got.contains_key(*p)) {
        diffs.push(format!("{what}: {p}: missing"));
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("{what}: {p}: unexpected"));
    }
    for (p, w) in want {
        let Some(g) = got.get(p) else { continue };
        for f in fields {
            let made_up = !comparable(w, f) || !comparable(g, f);
            if w[*f] != g[*f] && !made_up && !allowed(f, &w[*f], &g[*f]) {
                diffs.push(format!("{what}: {p}: {f}: want {} got {}", w[*f], g[*f]));
            }
        }
    }
    diffs
}

/// Panics listing (the first 60 of) `diffs`, if there are any.
pub fn report(diffs: Vec<String>) {
    if !diffs.is_empty() {
        let n = diffs.len();
        let shown: Vec<_> = diffs
            .into_iter()
            .take(60)
            .map(|d| d.chars().take(400).collect::<String>())
            .collect();
        panic!("{n} differences from the kernel:\n{}", shown.join("\n"));
    }
}

// ---------------------------------------------------------------------------------
// Value formats of the manifests

/// A set whose image keeps a tree log the kernel wrote and did not replay
/// (make-golden.sh `treelog`, noted in its manifest): readers show it replayed,
/// with a warning saying so.
pub fn has_unreplayed_log(m: &Value) -> bool {
    m["notes"].as_array().is_some_and(|n| {
        n.iter().any(|x| {
            x.as_str()
                .is_some_and(|s| s.contains("unreplayed tree log"))
        })
    })
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A time as the manifests write it: `SEC.NSEC` (nine digits).
pub fn ts(sec: i64, nsec: impl Into<i64>) -> String {
    format!("{sec}.{:09}", nsec.into())
}

/// [`ts`] of a `SystemTime` (before 1970 too).
pub fn systime(t: SystemTime) -> String {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => ts(d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos() as i64);
            if n == 0 {
                ts(-s, 0)
            } else {
                ts(-s - 1, 1_000_000_000 - n)
            }
        }
    }
}

/// The manifest's type name of an `st_mode`: dir, symlink, chr, blk, fifo, sock, file.
pub fn type_name(mode: u32) -> &'static str {
    match mode & 0o170000 {
        0o040000 => "dir",
        0o120000 => "symlink",
        0o020000 => "chr",
        0o060000 => "blk",
        0o010000 => "fifo",
        0o140000 => "sock",
        _ => "file",
    }
}

/// [`type_name`] of a host file type.
pub fn file_type_name(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "dir"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "sock"
    } else if ft.is_char_device() {
        "chr"
    } else if ft.is_block_device() {
        "blk"
    } else {
        "file"
    }
}

/// SHA-256 of a file's contents, in hex (read in 1 MiB pieces).
pub fn sha256_file(p: &Path) -> String {
    let mut f = File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex(&h.finalize())
}

/// What a mounted tree shows, walked with std::fs in the manifests' shape: every stat
/// field, sha256 of contents, xattrs (hex) and link targets, by path from `root`.
pub fn walk_mounted(root: &Path) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut stack = vec![("/".to_string(), root.to_path_buf())];
    while let Some((path, host)) = stack.pop() {
        let first =
            std::fs::symlink_metadata(&host).unwrap_or_else(|e| panic!("lstat {path}: {e}"));
        let ty = file_type_name(first.file_type());
        // Contents, link target and listing first, stat after: reading them may give
        // a new atime (relatime on a read-write mount), which the stat then shows.
        let mut v = serde_json::json!({});
        match ty {
            "file" => {
                let data = std::fs::read(&host).unwrap_or_else(|e| panic!("read {path}: {e}"));
                v["sha256"] = hex(&Sha256::digest(&data)).into();
            }
            "symlink" => {
                let t = std::fs::read_link(&host).expect("readlink");
                v["target_hex"] = hex(t.as_os_str().as_bytes()).into();
            }
            "dir" => {
                for e in std::fs::read_dir(&host).unwrap_or_else(|e| panic!("readdir {path}: {e}"))
                {
                    let e = e.expect("dirent");
                    let name = e.file_name().to_string_lossy().into_owned();
                    let p = if path == "/" {
                        format!("/{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    stack.push((p, e.path()));
                }
            }
            _ => {}
        }
        let md = std::fs::symlink_metadata(&host).unwrap_or_else(|e| panic!("lstat {path}: {e}"));
        let stat = serde_json::json!({
            "type": ty, "ino": md.ino(), "mode": md.mode(), "nlink": md.nlink(),
            "uid": md.uid(), "gid": md.gid(), "rdev": md.rdev(), "size": md.size(),
            "blocks": md.blocks(),
            "atime": ts(md.atime(), md.atime_nsec()),
            "mtime": ts(md.mtime(), md.mtime_nsec()),
            "ctime": ts(md.ctime(), md.ctime_nsec()),
            "crtime": md.created().ok().map(systime),
        });
        if let (Value::Object(v), Value::Object(stat)) = (&mut v, stat) {
            v.extend(stat);
        }
        let mut x = serde_json::Map::new();
        for n in xattr::list(&host).unwrap_or_else(|e| panic!("listxattr {path}: {e}")) {
            let val = xattr::get(&host, &n)
                .unwrap_or_else(|e| panic!("getxattr {path}: {e}"))
                .unwrap_or_default();
            x.insert(
                String::from_utf8_lossy(n.as_bytes()).into(),
                hex(&val).into(),
            );
        }
        v["xattrs"] = Value::Object(x);
        out.insert(path, v);
    }
    out
}
