//! `--format json` output. The engine's types carry no serde; this module maps them
//! to JSON, and is the only place in ubtrfs that knows the JSON layout.
//!
//! Layout notes (the output is a stable interface, keep it byte for byte):
//! * Objects built with `json!` are `serde_json::Map`s, which (without serde_json's
//!   `preserve_order` feature) print their keys in alphabetical order.
//! * The mirror structs below print their fields in declaration order when written
//!   directly (`subvolume list`), and alphabetically once nested in a `json!` value.
//!   Their field order is that of the engine types they mirror.

use crate::fmt;
use anyhow::Result;
use serde::Serialize;
use serde_json::{json, Value};
use std::io::Write;

use ubtrfs_core::tools::dedupe::DedupeReport;
use ubtrfs_core::tools::du::{DuLine, Footprint, FootprintRow};
use ubtrfs_core::tools::fiemap::FiemapExtent;
use ubtrfs_core::tools::subvol_du::QgroupNumbers;
use ubtrfs_core::tools::usage::Usage;
use ubtrfs_core::{Stat, SubvolInfo};

/// Pretty-prints `v` (two-space indent) and a newline.
pub fn write(out: &mut dyn Write, v: &impl Serialize) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)?;
    Ok(())
}

/// `stat` / `ls` object for one path; `target` is a symlink's target.
pub fn stat(path: &str, st: &Stat, target: Option<&[u8]>) -> Value {
    let mut v = json!({
        "path": path,
        "type": fmt::type_name(st.mode),
        "subvol": st.subvol,
        "ino": st.ino,
        "mode": st.mode,
        "nlink": st.nlink,
        "uid": st.uid,
        "gid": st.gid,
        "rdev": st.rdev,
        "size": st.size,
        "blocks": st.blocks,
        "blksize": st.blksize,
        "atime": fmt::ts_string(&st.atime),
        "mtime": fmt::ts_string(&st.mtime),
        "ctime": fmt::ts_string(&st.ctime),
        "crtime": fmt::ts_string(&st.crtime),
    });
    if let Some(t) = target {
        v["target"] = Value::String(fmt::name_display(t));
    }
    v
}

/// `ls` object for a directory entry: [`stat`] plus the entry's name.
pub fn ls_entry(path: &str, name: &[u8], st: &Stat, target: Option<&[u8]>) -> Value {
    let mut v = stat(path, st, target);
    v["name"] = Value::String(fmt::name_display(name));
    v
}

/// One subvolume of `subvolume list`.
#[derive(Serialize)]
pub struct Subvol<'a> {
    id: u64,
    gen: u64,
    cgen: u64,
    top_level: u64,
    dirid: u64,
    path: &'a str,
    uuid: &'a str,
    parent_uuid: &'a str,
    received_uuid: &'a str,
    flags: u64,
    readonly: bool,
    otime: i64,
}

impl<'a> From<&'a SubvolInfo> for Subvol<'a> {
    fn from(s: &'a SubvolInfo) -> Self {
        Subvol {
            id: s.id,
            gen: s.gen,
            cgen: s.cgen,
            top_level: s.top_level,
            dirid: s.dirid,
            path: &s.path,
            uuid: &s.uuid,
            parent_uuid: &s.parent_uuid,
            received_uuid: &s.received_uuid,
            flags: s.flags,
            readonly: s.readonly,
            otime: s.otime,
        }
    }
}

/// The `subvolume list` array.
pub fn subvolumes(subs: &[SubvolInfo]) -> Vec<Subvol<'_>> {
    subs.iter().map(Subvol::from).collect()
}

#[derive(Serialize)]
struct Extent {
    logical: u64,
    physical: u64,
    length: u64,
    flags: u32,
}

impl From<&FiemapExtent> for Extent {
    fn from(e: &FiemapExtent) -> Self {
        Extent {
            logical: e.logical,
            physical: e.physical,
            length: e.length,
            flags: e.flags,
        }
    }
}

/// `inspect fiemap` object for one file.
pub fn fiemap_file(path: &str, size: u64, exts: &[FiemapExtent]) -> Value {
    let extents: Vec<Extent> = exts.iter().map(Extent::from).collect();
    json!({"path": path, "size": size, "extents": extents})
}

#[derive(Serialize)]
struct Du<'a> {
    total: u64,
    exclusive: u64,
    set_shared: Option<u64>,
    path: &'a str,
}

#[derive(Serialize)]
struct Row {
    disk: u64,
    uncompressed: u64,
    referenced: u64,
}

impl From<&FootprintRow> for Row {
    fn from(r: &FootprintRow) -> Self {
        Row {
            disk: r.disk,
            uncompressed: r.uncompressed,
            referenced: r.referenced,
        }
    }
}

#[derive(Serialize)]
struct Foot {
    files: u64,
    regular_extents: u64,
    refs: u64,
    inline_extents: u64,
    by_type: [Row; 4],
}

/// `filesystem du` output: the lines, and the footprint if asked for (else null).
pub fn du(lines: &[DuLine], footprint: Option<&Footprint>) -> Value {
    let du: Vec<Du> = lines
        .iter()
        .map(|l| Du {
            total: l.total,
            exclusive: l.exclusive,
            set_shared: l.set_shared,
            path: &l.path,
        })
        .collect();
    let footprint = footprint.map(|f| Foot {
        files: f.files,
        regular_extents: f.regular_extents,
        refs: f.refs,
        inline_extents: f.inline_extents,
        by_type: f.by_type.each_ref().map(Row::from),
    });
    json!({"du": du, "footprint": footprint})
}

/// `subvolume du` output; `path_of` names a subvolume, `freed` is what deleting all
/// the given subvolumes frees (null when none were given).
pub fn subvol_du(
    numbers: &[QgroupNumbers],
    path_of: impl Fn(u64) -> String,
    freed: Option<u64>,
) -> Value {
    let v: Vec<Value> = numbers
        .iter()
        .map(|q| {
            json!({"subvol": q.subvol, "path": path_of(q.subvol),
                "referenced": q.referenced, "exclusive": q.exclusive})
        })
        .collect();
    json!({"subvolumes": v, "freed_by_deleting_all_given": freed})
}

/// `dedupe` summary.
pub fn dedupe(r: &DedupeReport, dry_run: bool) -> Value {
    json!({
        "dry_run": dry_run,
        "files": r.files,
        "bytes_scanned": r.bytes_scanned,
        "ranges": r.ranges,
        "bytes_deduped": r.bytes_deduped,
        "bytes_already_shared": r.bytes_already_shared,
        "bytes_differing": r.bytes_differing,
        "bytes_unreadable": r.bytes_unreadable,
        "data_used_before": r.data_used_before,
        "data_used_after": r.data_used_after,
        "bytes_freed": r.bytes_freed(),
    })
}

/// `btrfs --format json filesystem df`: its rows (type, profile, total, used) in
/// btrfs-progs's key order (structs, not `json!`, which would sort the keys).
pub fn filesystem_df<'a>(rows: &[(&'a str, &'a str, u64, u64)]) -> impl Serialize + 'a {
    #[derive(Serialize)]
    struct Row<'a> {
        #[serde(rename = "bg-type")]
        ty: &'a str,
        #[serde(rename = "bg-profile")]
        profile: &'a str,
        total: u64,
        used: u64,
    }
    #[derive(Serialize)]
    struct Header {
        version: &'static str,
    }
    #[derive(Serialize)]
    struct Df<'a> {
        #[serde(rename = "__header")]
        header: Header,
        #[serde(rename = "filesystem-df")]
        rows: Vec<Row<'a>>,
    }
    Df {
        header: Header { version: "1" },
        rows: rows
            .iter()
            .map(|&(ty, profile, total, used)| Row {
                ty,
                profile,
                total,
                used,
            })
            .collect(),
    }
}

/// `filesystem usage --format json` (btrfs-progs has no JSON for it): the overall
/// figures, each space with its bytes per device, and each device; `paths` are the
/// devices' paths in [`Usage::devices`] order.
pub fn filesystem_usage(u: &Usage, paths: &[String]) -> Value {
    use ubtrfs_core::tools::space_info::names;
    let spaces: Vec<Value> = u
        .spaces
        .iter()
        .map(|s| {
            let (t, p) = names(s.ty, s.profile);
            let kind = s.ty | s.profile;
            let devices: Vec<Value> = u
                .devices
                .iter()
                .zip(paths)
                .filter_map(|(d, path)| {
                    let bytes = d
                        .allocated
                        .iter()
                        .filter(|&&(k, _)| k == kind)
                        .map(|&(_, b)| b)
                        .sum::<u64>();
                    (bytes > 0).then(|| json!({"devid": d.devid, "path": path, "bytes": bytes}))
                })
                .collect();
            json!({"type": t, "profile": p, "size": s.total_bytes, "used": s.used_bytes,
                   "devices": devices})
        })
        .collect();
    let devices: Vec<Value> = u
        .devices
        .iter()
        .zip(paths)
        .map(|(d, path)| {
            json!({"devid": d.devid, "path": path, "missing": d.path.is_none(),
                   "size": d.size_bytes, "device_size": d.device_size_bytes,
                   "unallocated": d.unallocated_bytes})
        })
        .collect();
    json!({
        "overall": {
            "device_size": u.device_size_bytes,
            "device_allocated": u.device_allocated_bytes,
            "device_unallocated": u.device_unallocated_bytes,
            "device_missing": u.device_missing_bytes,
            "device_slack": u.device_slack_bytes,
            "used": u.used_bytes,
            "free_estimated": u.free_estimated_bytes,
            "free_estimated_min": u.free_min_bytes,
            "free_statfs": u.free_statfs_bytes,
            "data_ratio": u.data_ratio,
            "metadata_ratio": u.metadata_ratio,
            "global_reserve": u.global_reserve.total_bytes,
            "global_reserve_used": u.global_reserve.used_bytes,
            "multiple_profiles": u.multiple_profiles,
        },
        "spaces": spaces,
        "devices": devices,
    })
}
