//! Kernel-made golden images: every manifest under tests/golden (or $UBTRFS_GOLDEN_DIR,
//! which CI points at a set freshly made with this machine's kernel) is compared with
//! what ubtrfs reads — through the library walk, `ubtrfs subvolume list`, and
//! `ubtrfs extract`.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use ubtrfs_core::mode::*;
use ubtrfs_core::{Filesystem, Node, OpenOptions};
use ubtrfs_sim::golden::{
    comparable, entries_under, hex, manifests, report, ts, type_name, unpack_set, STAT_FIELDS,
};
use ubtrfs_sim::host::{require_root, Ubtrfs};
use ubtrfs_sim::mount::{image_arg, ScratchBtrfs};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// What ubtrfs shows for every path, in the manifest's shape.
fn walk(fs: &Filesystem) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(String, Node)> = vec![("/".into(), fs.top())];
    while let Some((path, node)) = stack.pop() {
        let st = fs.stat(node).unwrap_or_else(|e| panic!("stat {path}: {e}"));
        let mut v = serde_json::json!({
            "type": type_name(st.mode), "subvol": st.subvol, "ino": st.ino, "mode": st.mode, "nlink": st.nlink,
            "uid": st.uid, "gid": st.gid, "rdev": st.rdev, "size": st.size,
            "blocks": st.blocks, "atime": ts(st.atime.sec, st.atime.nsec),
            "mtime": ts(st.mtime.sec, st.mtime.nsec), "ctime": ts(st.ctime.sec, st.ctime.nsec),
            "crtime": ts(st.crtime.sec, st.crtime.nsec),
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

/// What the kernel shows that ubtrfs must show too (st_dev-free fields plus the
/// subvolume, which the library reports directly).
const FIELDS: &[&str] = &["subvol"];

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

use ubtrfs_sim::golden::has_unreplayed_log as has_log;

#[test]
fn golden_walk_matches_kernel() {
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let fs = match Filesystem::open_replayed(&u.devices, OpenOptions::default()) {
            Ok(fs) => fs,
            Err(e) => {
                diffs.push(format!("{name}: open failed: {e}"));
                continue;
            }
        };
        let ours = walk(&fs);
        diffs.extend(compare(&name, &entries_under(&m, ""), &ours));
        for w in fs.info.take_warnings() {
            // A set left with the kernel's tree log is shown replayed, and says so.
            if has_log(&m) && w.contains("has a tree log") {
                continue;
            }
            diffs.push(format!("{name}: unexpected warning: {w}"));
        }
    }
    report(diffs);
}

#[test]
fn golden_subvolume_list_matches_kernel() {
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let img = image_arg(&u.devices);
        for (field, extra) in [("subvolume_list", None), ("subvolume_list_a", Some("-a"))] {
            let Some(expected) = m[field].as_str() else {
                continue;
            };
            let mut args = vec![OsStr::new("subvolume"), "list".as_ref(), img.as_os_str()];
            if let Some(x) = extra {
                args.push(x.as_ref());
            }
            let out = UBTRFS.output(&args);
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

/// `ubtrfs extract` reproduces the kernel's view: contents, modes, owners, times,
/// xattrs, symlinks, hard links, special files.
#[test]
fn golden_extract_matches_kernel() {
    if !require_root("golden_extract_matches_kernel") {
        return;
    }
    let mut diffs = Vec::new();
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let dest = ScratchBtrfs::new();
        let out = UBTRFS.output(&[
            "extract".as_ref(),
            image_arg(&u.devices).as_os_str(),
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
        for (p, k) in entries_under(&m, "") {
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
                local.extend(chk("mtime", ts(md.mtime(), md.mtime_nsec()).into()));
                local.extend(chk("atime", ts(md.atime(), md.atime_nsec()).into()));
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
        let fs = Filesystem::open_replayed(&u.devices, OpenOptions::default()).unwrap();
        let mut share = ubtrfs_core::ShareCtx::new(&fs.info).unwrap();
        for (p, k) in entries_under(&m, "") {
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
        let fs = Filesystem::open_replayed(&u.devices, OpenOptions::default()).unwrap();
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
        let fs = Filesystem::open_replayed(&u.devices, OpenOptions::default()).unwrap();
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
            if has_log(&m) && got != *want {
                // The replayed trees are ubtrfs's own: a leaf more or less than the
                // kernel's replay makes. Data must be the same; tree blocks may
                // differ by a few.
                let ns = fs.info.nodesize as i64;
                let n = |v: &Value, i: usize| v[i].as_i64().unwrap_or(0);
                let (dr, de) = (n(&got, 0) - n(want, 0), n(&got, 1) - n(want, 1));
                if dr % ns == 0 && de % ns == 0 && dr.abs() <= 4 * ns && de.abs() <= 4 * ns {
                    continue;
                }
            }
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

/// Balance of every kernel-made golden image the write engine can write (snapshots,
/// reflinks, compression, prealloc, inline, DUP and RAID1 profiles, several
/// checksums, the block-group tree, mixed groups...): a full balance (data,
/// metadata, system) moves every chunk, and afterwards ubtrfs still reads exactly
/// what the kernel showed; with root, single-device results also pass btrfs check.
/// Sets whose features or profiles the engine does not write, or without room to
/// move a chunk (as for the kernel), are listed, not balanced.
#[test]
fn golden_balance_keeps_every_file() {
    use ubtrfs_core::{balance_flags as bf, BalanceEnd, BalanceRequest, Error, Trans};
    let root = require_root("golden_balance_keeps_every_file: btrfs check of the results");
    let mut diffs = Vec::new();
    let (mut balanced, mut skipped) = (Vec::new(), Vec::new());
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let mut t = match Trans::open_paths(&u.devices) {
            Ok(t) => t,
            Err(e @ (Error::Unsupported(_) | Error::Invalid(_))) => {
                skipped.push(format!("{name} ({e})"));
                continue;
            }
            Err(e) => {
                diffs.push(format!("{name}: open for writing: {e}"));
                continue;
            }
        };
        let chunks_before = t.fs.info.chunk_map.len();
        let req = BalanceRequest {
            flags: bf::DATA | bf::METADATA | bf::SYSTEM | bf::FORCE,
            ..Default::default()
        };
        match t.balance(&req, &mut |_, _| {}, &|| false) {
            Ok((BalanceEnd::Finished, p)) => {
                if p.completed as usize != chunks_before {
                    diffs.push(format!(
                        "{name}: relocated {} of {chunks_before} chunks",
                        p.completed
                    ));
                }
            }
            // raid1c4's four 160 MiB devices have no room for a new data chunk
            // on every device: the kernel's own full balance of it fails with
            // ENOSPC too. The other chunks still move.
            Ok((BalanceEnd::NoSpace(n), p)) => {
                skipped.push(format!(
                    "{name} ({n} chunk(s) without room elsewhere, {} relocated)",
                    p.completed
                ));
            }
            Ok((end, _)) => diffs.push(format!("{name}: balance ended {end:?}")),
            Err(e @ (Error::Unsupported(_) | Error::NoSpace(_))) => {
                skipped.push(format!("{name} ({e})"));
                continue;
            }
            Err(e) => {
                diffs.push(format!("{name}: balance: {e}"));
                continue;
            }
        }
        drop(t);
        let fs = match Filesystem::open_replayed(&u.devices, OpenOptions::default()) {
            Ok(fs) => fs,
            Err(e) => {
                diffs.push(format!("{name}: open after balance: {e}"));
                continue;
            }
        };
        diffs.extend(compare(
            &format!("{name} after balance"),
            &entries_under(&m, ""),
            &walk(&fs),
        ));
        drop(fs);
        if root && u.devices.len() == 1 {
            if let Err(e) = ubtrfs_sim::host::btrfs_check(&u.devices[0], None) {
                diffs.push(format!("{name} after balance: {e}"));
            }
        }
        balanced.push(name);
    }
    eprintln!(
        "golden balance: {} sets balanced ({}), {} not written by the engine: {}",
        balanced.len(),
        balanced.join(", "),
        skipped.len(),
        skipped.join("; ")
    );
    assert!(balanced.len() >= 10, "too few golden sets balanced");
    report(diffs);
}
