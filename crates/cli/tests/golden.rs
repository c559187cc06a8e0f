//! Kernel-made golden images: every manifest under tests/golden (or $UBTRFS_GOLDEN_DIR,
//! which CI points at a set freshly made with this machine's kernel) is compared with
//! what ubtrfs reads — through the library walk, `ubtrfs subvolume list`, and
//! `ubtrfs extract`.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;
use ubtrfs_core::mode::*;
use ubtrfs_core::{Filesystem, Node, OpenOptions};

mod common;
use common::{golden_dir, unpack_set, Unpacked, STAT_FIELDS};

fn manifests() -> Vec<(String, Value)> {
    let dir = golden_dir();
    let mut v = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if let Some(n) = name.strip_suffix(".manifest.json") {
            if let Ok(only) = std::env::var("UBTRFS_GOLDEN_ONLY") {
                if !only.split(',').any(|o| o == n) {
                    continue;
                }
            }
            let m: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            v.push((n.to_string(), m));
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!v.is_empty(), "no golden manifests in {}", dir.display());
    v
}

fn ts(t: &ubtrfs_format::items::Timespec) -> String {
    format!("{}.{:09}", t.sec, t.nsec)
}

fn type_name(mode: u32) -> &'static str {
    match mode & S_IFMT {
        S_IFDIR => "dir",
        S_IFLNK => "symlink",
        S_IFCHR => "chr",
        S_IFBLK => "blk",
        S_IFIFO => "fifo",
        S_IFSOCK => "sock",
        _ => "file",
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What ubtrfs shows for every path, in the manifest's shape.
fn walk(fs: &Filesystem) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(String, Node)> = vec![("/".into(), fs.top())];
    while let Some((path, node)) = stack.pop() {
        let st = fs.stat(node).unwrap_or_else(|e| panic!("stat {path}: {e}"));
        let mut v = serde_json::json!({
            "type": type_name(st.mode), "subvol": st.subvol, "ino": st.ino, "mode": st.mode, "nlink": st.nlink,
            "uid": st.uid, "gid": st.gid, "rdev": st.rdev, "size": st.size,
            "blocks": st.blocks, "atime": ts(&st.atime), "mtime": ts(&st.mtime),
            "ctime": ts(&st.ctime), "crtime": ts(&st.crtime),
        });
        let mut x = serde_json::Map::new();
        for (k, val) in fs
            .xattrs(node)
            .unwrap_or_else(|e| panic!("xattrs {path}: {e}"))
        {
            x.insert(String::from_utf8(k).unwrap(), Value::String(hex(&val)));
        }
        v["xattrs"] = Value::Object(x);
        match st.mode & S_IFMT {
            S_IFREG => {
                let inode = fs.inode_item(node).unwrap();
                let mut h = Sha256::new();
                let mut off = 0;
                while off < inode.size {
                    let b = fs
                        .read_inode(node, &inode, off, 4 << 20)
                        .unwrap_or_else(|e| panic!("read {path} at {off}: {e}"));
                    assert!(!b.is_empty());
                    h.update(&b);
                    off += b.len() as u64;
                }
                v["sha256"] = Value::String(hex(&h.finalize()));
            }
            S_IFLNK => {
                v["target_hex"] = Value::String(hex(&fs.readlink(node).unwrap()));
            }
            S_IFDIR => {
                for e in fs
                    .readdir(node)
                    .unwrap_or_else(|e| panic!("readdir {path}: {e}"))
                {
                    let name = String::from_utf8(e.name.clone()).unwrap();
                    let p = if path == "/" {
                        format!("/{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    stack.push((p, e.node));
                }
            }
            _ => {}
        }
        out.insert(path, v);
    }
    out
}

/// Fields the kernel makes up for the ino-2 placeholder of a subvolume inside a
/// snapshot (times are "now" at lookup) cannot be compared.
fn comparable(entry: &Value, field: &str) -> bool {
    !(entry["ino"] == 2 && ["atime", "mtime", "ctime", "crtime"].contains(&field))
}

/// What the kernel shows that ubtrfs must show too (st_dev-free fields plus the
/// subvolume, which the library reports directly).
const FIELDS: &[&str] = &["subvol"];

fn entries(m: &Value) -> BTreeMap<String, Value> {
    m["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (e["path"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

fn compare(
    name: &str,
    kernel: &BTreeMap<String, Value>,
    ours: &BTreeMap<String, Value>,
) -> Vec<String> {
    let mut diffs = Vec::new();
    for p in kernel.keys() {
        if !ours.contains_key(p) {
            diffs.push(format!("{name}: {p}: missing in ubtrfs"));
        }
    }
    for p in ours.keys() {
        if !kernel.contains_key(p) {
            diffs.push(format!("{name}: {p}: ubtrfs shows it, the kernel does not"));
        }
    }
    for (p, k) in kernel {
        let Some(o) = ours.get(p) else { continue };
        for f in STAT_FIELDS.iter().chain(FIELDS) {
            let kv = &k[*f];
            if kv.is_null() || !comparable(k, f) {
                continue;
            }
            if *f == "xattrs" && kv.as_object().is_some_and(|m| m.is_empty()) && o[*f].is_null() {
                continue;
            }
            if &o[*f] != kv {
                diffs.push(format!("{name}: {p}: {f}: kernel {kv} ubtrfs {}", o[*f]));
            }
        }
    }
    diffs
}

fn report(diffs: Vec<String>) {
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

#[test]
fn golden_walk_matches_kernel() {
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let fs = match Filesystem::open_paths(&u.devices, OpenOptions::default()) {
            Ok(fs) => fs,
            Err(e) => {
                diffs.push(format!("{name}: open failed: {e}"));
                continue;
            }
        };
        let ours = walk(&fs);
        diffs.extend(compare(&name, &entries(&m), &ours));
        for w in fs.info.take_warnings() {
            diffs.push(format!("{name}: unexpected warning: {w}"));
        }
    }
    report(diffs);
}

fn ubtrfs(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .args(args)
        .output()
        .expect("run ubtrfs")
}

fn image_arg(u: &Unpacked) -> std::ffi::OsString {
    let parts: Vec<_> = u.devices.iter().map(|d| d.as_os_str().to_owned()).collect();
    parts.join(std::ffi::OsStr::new(","))
}

#[test]
fn golden_subvolume_list_matches_kernel() {
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let img = image_arg(&u);
        for (field, extra) in [("subvolume_list", None), ("subvolume_list_a", Some("-a"))] {
            let Some(expected) = m[field].as_str() else {
                continue;
            };
            let mut args = vec![
                std::ffi::OsStr::new("subvolume"),
                "list".as_ref(),
                img.as_os_str(),
            ];
            if let Some(x) = extra {
                args.push(x.as_ref());
            }
            let out = ubtrfs(&args);
            let got = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || got != expected {
                diffs.push(format!(
                    "{name}: {field}: kernel\n{expected}ubtrfs ({}):\n{got}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    report(diffs);
}

/// A scratch btrfs loop mount to extract into: tmpfs and ext4 cannot hold the 16 KB
/// xattrs the golden images carry. Unmounted (and its loop device freed) on drop,
/// also when the test fails.
struct ScratchMount {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl ScratchMount {
    fn new() -> ScratchMount {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("scratch.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        File::create(&img).unwrap().set_len(2 << 30).unwrap();
        let ok = Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-n", "65536"])
            .arg(&img)
            .status()
            .expect("mkfs.btrfs (install btrfs-progs)")
            .success();
        assert!(ok, "mkfs.btrfs failed");
        let st = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt)
            .status()
            .expect("mount");
        assert!(
            st.success(),
            "cannot loop-mount the scratch filesystem: the extract test needs root"
        );
        ScratchMount { dir, mounted: true }
    }
    fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for ScratchMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(self.path()).status();
        }
    }
}

/// `ubtrfs extract` reproduces the kernel's view: contents, modes, owners, times,
/// xattrs, symlinks, hard links, special files.
#[test]
fn golden_extract_matches_kernel() {
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let dest = ScratchMount::new();
        let out = ubtrfs(&[
            "extract".as_ref(),
            image_arg(&u).as_os_str(),
            dest.path().join("x").as_os_str(),
        ]);
        if !out.status.success() {
            diffs.push(format!(
                "{name}: extract failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let root = dest.path().join("x");
        let mut to_hash = Vec::new();
        for (p, k) in entries(&m) {
            let host = root.join(p.trim_start_matches('/'));
            let md = match std::fs::symlink_metadata(&host) {
                Ok(md) => md,
                Err(e) => {
                    diffs.push(format!("{name}: {p}: not extracted: {e}"));
                    continue;
                }
            };
            let is_dir = md.is_dir();
            let mut local = Vec::new();
            let chk = |f: &str, got: Value| {
                (k[f] != got)
                    .then(|| format!("{name}: {p}: extracted {f}: kernel {} got {got}", k[f]))
            };
            local.extend(chk("mode", md.mode().into()));
            local.extend(chk("uid", md.uid().into()));
            local.extend(chk("gid", md.gid().into()));
            if !is_dir {
                local.extend(chk("size", md.size().into()));
                local.extend(chk("nlink", md.nlink().into()));
            }
            if k["type"] == "chr" || k["type"] == "blk" {
                local.extend(chk("rdev", md.rdev().into()));
            }
            if k["ino"] != 2 {
                local.extend(chk(
                    "mtime",
                    format!("{}.{:09}", md.mtime(), md.mtime_nsec()).into(),
                ));
                local.extend(chk(
                    "atime",
                    format!("{}.{:09}", md.atime(), md.atime_nsec()).into(),
                ));
            }
            let mut x = serde_json::Map::new();
            for n in xattr::list(&host).unwrap() {
                let v = xattr::get(&host, &n).unwrap().unwrap_or_default();
                x.insert(String::from_utf8_lossy(n.as_bytes()).into(), hex(&v).into());
            }
            if let Some(kx) = k["xattrs"].as_object() {
                if kx != &x {
                    local.push(format!("{name}: {p}: extracted xattrs {x:?} kernel {kx:?}"));
                }
            }
            if k["type"] == "symlink" {
                let t = std::fs::read_link(&host).unwrap();
                local.extend(chk("target_hex", hex(t.as_os_str().as_bytes()).into()));
            }
            if k["type"] == "file" {
                // Hashed after every stat: reading updates atime (hard links share it).
                to_hash.push((p.clone(), host.clone(), k["sha256"].clone()));
            }
            diffs.extend(local);
        }
        for (p, host, want) in to_hash {
            let mut h = Sha256::new();
            h.update(std::fs::read(&host).unwrap());
            let got = Value::from(hex(&h.finalize()));
            if got != want {
                diffs.push(format!(
                    "{name}: {p}: extracted sha256: kernel {want} got {got}"
                ));
            }
        }
    }
    report(diffs);
}

/// fiemap of every regular file equals the kernel's FS_IOC_FIEMAP (extents, merged
/// ranges, SHARED/ENCODED/INLINE/UNWRITTEN/LAST flags).
#[test]
fn golden_fiemap_matches_kernel() {
    let mut diffs = Vec::new();
    let mut checked = 0usize;
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let fs = Filesystem::open_paths(&u.devices, OpenOptions::default()).unwrap();
        let mut share = ubtrfs_core::ShareCtx::new(&fs.info).unwrap();
        for (p, k) in entries(&m) {
            let Some(kf) = k.get("fiemap") else { continue };
            let node = fs.resolve(&p).unwrap();
            let ours: Vec<Value> = fs
                .fiemap(node, &mut share)
                .unwrap_or_else(|e| panic!("{name}: fiemap {p}: {e}"))
                .iter()
                .map(|e| serde_json::json!([e.logical, e.physical, e.length, e.flags]))
                .collect();
            checked += 1;
            if &Value::Array(ours.clone()) != kf {
                diffs.push(format!(
                    "{name}: {p}: fiemap kernel {kf} ubtrfs {}",
                    Value::Array(ours)
                ));
            }
        }
    }
    report(diffs);
    eprintln!("fiemap compared for {checked} files");
}

/// `filesystem du -s` of the top, top-level directories and subvolume roots equals
/// `btrfs filesystem du --raw -s` on the kernel mount.
#[test]
fn golden_du_matches_kernel() {
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let Some(du) = m.get("fi_du").and_then(|d| d.as_object()) else {
            continue;
        };
        let u = unpack_set(&m);
        let fs = Filesystem::open_paths(&u.devices, OpenOptions::default()).unwrap();
        let mut share = ubtrfs_core::ShareCtx::new(&fs.info).unwrap();
        for (p, want) in du {
            let lines = fs
                .filesystem_du(&mut share, p, true)
                .unwrap_or_else(|e| panic!("{name}: du {p}: {e}"));
            let l = lines.last().unwrap();
            let got = serde_json::json!([l.total, l.exclusive, l.set_shared.unwrap_or(0)]);
            if &got != want {
                diffs.push(format!("{name}: du -s {p}: kernel {want} ubtrfs {got}"));
            }
        }
    }
    report(diffs);
}

/// `subvolume du` equals `btrfs qgroup show --raw` after `quota enable` +
/// `quota rescan -w` on the kernel (referenced and exclusive per subvolume).
#[test]
fn golden_subvolume_du_matches_qgroup_rescan() {
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let Some(q) = m.get("qgroups").and_then(|d| d.as_object()) else {
            continue;
        };
        let u = unpack_set(&m);
        let fs = Filesystem::open_paths(&u.devices, OpenOptions::default()).unwrap();
        let sharing = ubtrfs_core::tools::subvol_du::compute_sharing(&fs.info).unwrap();
        let ours: BTreeMap<String, Value> = sharing
            .numbers()
            .iter()
            .map(|n| {
                (
                    format!("0/{}", n.subvol),
                    serde_json::json!([n.referenced, n.exclusive]),
                )
            })
            .collect();
        for (id, want) in q {
            // Level-0 qgroups of deleted subvolumes stay in the quota tree at 0/0.
            if !id.starts_with("0/") {
                continue;
            }
            let got = ours.get(id).cloned().unwrap_or(serde_json::json!([0, 0]));
            if &got != want {
                diffs.push(format!("{name}: qgroup {id}: kernel {want} ubtrfs {got}"));
            }
        }
        for id in ours.keys() {
            if !q.contains_key(id) {
                diffs.push(format!(
                    "{name}: qgroup {id}: ubtrfs reports it, the kernel does not"
                ));
            }
        }
    }
    report(diffs);
}
