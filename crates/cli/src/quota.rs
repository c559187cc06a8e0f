//! `ubtrfs quota` and `ubtrfs qgroup`: btrfs-progs' quota commands on an image. The
//! numbers are kept exact at every commit by the engine (transaction/quota.rs); these
//! commands turn quotas on and off, edit qgroups, relations and limits, and print
//! `btrfs qgroup show`'s table (or its JSON).

use crate::edit::open_rw;
use crate::Format;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use ubtrfs_core::format::key::fmt_qgroupid;
use ubtrfs_core::{Filesystem, OpenOptions, QgroupEntry, QgroupLimitKind, QuotaReport};
use ubtrfs_fuse::quota_ops::client::QuotaCtl;

#[derive(Subcommand)]
pub enum QuotaCmd {
    /// Turn quotas on, like `btrfs quota enable` + `btrfs quota rescan -w`: a qgroup
    /// per subvolume, counted before the command returns.
    Enable {
        /// Image file, or a directory of a mounted filesystem (ubtrfs or kernel).
        image: PathBuf,
        /// Simple quotas (squota, kernel 6.7+): each extent is charged to the
        /// subvolume that wrote it, from the next transaction on; no rescans.
        #[arg(short = 's', long)]
        simple: bool,
    },
    /// Turn quotas off (the quota tree goes), like `btrfs quota disable`.
    Disable { image: PathBuf },
    /// Recount every qgroup, like `btrfs quota rescan -w` (always waits).
    Rescan {
        image: PathBuf,
        /// Kept for btrfs-progs' users: the rescan always finishes before return.
        #[arg(short = 'w', long)]
        wait: bool,
        /// Print whether a rescan is running (never, after this command).
        #[arg(short = 's', long)]
        status: bool,
    },
    /// Whether quotas are on and consistent, and how many qgroups there are.
    Status {
        image: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

#[derive(Subcommand)]
pub enum QgroupCmd {
    /// List qgroups like `btrfs qgroup show`.
    Show(ShowArgs),
    /// Create a qgroup, like `btrfs qgroup create QGROUPID`.
    Create { image: PathBuf, qgroupid: String },
    /// Destroy a qgroup (refused while it has members or its subvolume exists).
    Destroy { image: PathBuf, qgroupid: String },
    /// Make SRC a member of DST (the numbers of DST are recounted).
    Assign {
        image: PathBuf,
        src: String,
        dst: String,
    },
    /// Remove SRC from DST.
    Remove {
        image: PathBuf,
        src: String,
        dst: String,
    },
    /// Set or clear a limit, like `btrfs qgroup limit [-e] SIZE|none QGROUPID`.
    Limit {
        image: PathBuf,
        /// Bytes (K/M/G/T/P/E suffixes, base 1024) or `none`.
        size: String,
        qgroupid: String,
        /// Limit exclusive bytes instead of referenced bytes.
        #[arg(short = 'e')]
        exclusive: bool,
        /// Kept for btrfs-progs' users: limits apply to the compressed size anyway.
        #[arg(short = 'c')]
        compressed: bool,
    },
}

#[derive(Args)]
pub struct ShowArgs {
    image: PathBuf,
    /// Print the parent qgroups.
    #[arg(short = 'p')]
    parents: bool,
    /// Print the member qgroups.
    #[arg(short = 'c')]
    children: bool,
    /// Print the limit on referenced bytes.
    #[arg(short = 'r')]
    max_rfer: bool,
    /// Print the limit on exclusive bytes.
    #[arg(short = 'e')]
    max_excl: bool,
    /// Bytes, not KiB/MiB/...
    #[arg(long)]
    raw: bool,
    /// Sort by qgroupid, rfer, excl, max_rfer, max_excl or path; `-` for descending.
    #[arg(long, allow_hyphen_values = true)]
    sort: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

/// Parses "1/100" (or a bare subvolume id, level 0).
pub fn parse_qgroupid(s: &str) -> Result<u64> {
    let bad = || anyhow::anyhow!("invalid qgroup id {s:?} (LEVEL/ID or a subvolume id)");
    let (level, id) = match s.split_once('/') {
        Some((l, i)) => (
            l.parse::<u64>().map_err(|_| bad())?,
            i.parse::<u64>().map_err(|_| bad())?,
        ),
        None => (0, s.parse::<u64>().map_err(|_| bad())?),
    };
    if level >= 1 << 16 || id >= 1 << 48 {
        return Err(bad());
    }
    Ok(level << 48 | id)
}

/// Parses a size with an optional K/M/G/T/P/E suffix (base 1024), or `none`.
fn parse_size(s: &str) -> Result<Option<u64>> {
    if s == "none" {
        return Ok(None);
    }
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                'p' => 50,
                'e' => 60,
                _ => bail!("invalid size {s:?}"),
            };
            (&s[..i], 1u64 << shift)
        }
        _ => (s, 1),
    };
    let n: u64 = num.parse().with_context(|| format!("invalid size {s:?}"))?;
    n.checked_mul(mult)
        .map(Some)
        .ok_or_else(|| anyhow::anyhow!("size {s:?} too large"))
}

/// A mounted directory given instead of an image: the quota ioctls go to the mount
/// (a ubtrfs mount, or the kernel's), which makes and commits the change.
fn mounted(p: &std::path::Path) -> Option<std::fs::File> {
    if !p.is_dir() {
        return None;
    }
    std::fs::File::open(p).ok()
}

/// The image behind a mounted directory (the mount's source), read after a commit
/// of the mount (BTRFS_IOC_SYNC), for the commands that print.
pub(crate) fn image_of_mount(dir: &std::path::Path) -> Result<PathBuf> {
    let canon = dir
        .canonicalize()
        .with_context(|| dir.display().to_string())?;
    let (fstype, src) = ubtrfs_fuse::mount_source(&canon)
        .ok_or_else(|| anyhow::anyhow!("{}: not on a mounted filesystem", dir.display()))?;
    if !(fstype == "btrfs" || fstype == "fuse.ubtrfs" || fstype == "fuse") {
        bail!("{}: a {fstype} mount, not btrfs or ubtrfs", dir.display());
    }
    let f = std::fs::File::open(dir).with_context(|| dir.display().to_string())?;
    ubtrfs_fuse::subvol_ops::client::sync(&f)
        .with_context(|| format!("{}: committing before reading", dir.display()))?;
    Ok(PathBuf::from(src))
}

fn on_mount(what: &str, r: std::io::Result<()>) -> Result<()> {
    r.with_context(|| what.to_string())
}

pub fn run_quota(cmd: QuotaCmd, out: &mut dyn Write) -> Result<()> {
    let cmd = match cmd {
        QuotaCmd::Enable { image, simple } => {
            if let Some(f) = mounted(&image) {
                let ctl = if simple {
                    QuotaCtl::EnableSimple
                } else {
                    QuotaCtl::Enable
                };
                return on_mount(
                    "quota enable",
                    ubtrfs_fuse::quota_ops::client::quota_ctl(&f, ctl),
                );
            }
            QuotaCmd::Enable { image, simple }
        }
        QuotaCmd::Disable { image } => {
            if let Some(f) = mounted(&image) {
                return on_mount(
                    "quota disable",
                    ubtrfs_fuse::quota_ops::client::quota_ctl(&f, QuotaCtl::Disable),
                );
            }
            QuotaCmd::Disable { image }
        }
        QuotaCmd::Rescan {
            image,
            wait,
            status,
        } if !status => {
            if let Some(f) = mounted(&image) {
                on_mount("quota rescan", ubtrfs_fuse::quota_ops::client::rescan(&f))?;
                writeln!(out, "quota rescan started")?;
                return Ok(());
            }
            QuotaCmd::Rescan {
                image,
                wait,
                status,
            }
        }
        QuotaCmd::Rescan {
            image,
            wait,
            status,
        } if image.is_dir() => QuotaCmd::Rescan {
            image: image_of_mount(&image)?,
            wait,
            status,
        },
        QuotaCmd::Status { image, format } if image.is_dir() => QuotaCmd::Status {
            image: image_of_mount(&image)?,
            format,
        },
        c => c,
    };
    match cmd {
        QuotaCmd::Enable { image, simple } => {
            let mut t = open_rw(&image)?;
            t.quota_enable(simple)?;
            t.commit()?;
        }
        QuotaCmd::Disable { image } => {
            let mut t = open_rw(&image)?;
            t.quota_disable()?;
            t.commit()?;
        }
        QuotaCmd::Rescan {
            image,
            wait: _,
            status,
        } => {
            if status {
                let fs = open_ro(&image)?;
                if fs.quotas()?.is_none() {
                    bail!("quotas are not enabled on {}", image.display());
                }
                writeln!(out, "no rescan operation in progress")?;
                return Ok(());
            }
            let mut t = open_rw(&image)?;
            t.quota_rescan()?;
            t.commit()?;
            writeln!(out, "quota rescan started")?;
        }
        QuotaCmd::Status { image, format } => {
            let fs = open_ro(&image)?;
            let q = fs.quotas()?;
            let levels = |r: &QuotaReport| {
                let mut m: BTreeMap<u64, usize> = BTreeMap::new();
                for g in &r.qgroups {
                    *m.entry(g.qgroupid >> 48).or_default() += 1;
                }
                m
            };
            if format == Format::Json {
                let v = match &q {
                    None => json!({"enabled": false}),
                    Some(r) => json!({
                        "enabled": true,
                        "mode": if r.simple() { "squota" } else { "qgroup" },
                        "inconsistent": r.inconsistent(),
                        "total_count": r.qgroups.len(),
                        "levels": levels(r).iter().map(|(l, n)| json!({"level": l, "count": n})).collect::<Vec<_>>(),
                    }),
                };
                crate::json::write(out, &v)?;
                return Ok(());
            }
            writeln!(out, "Quotas on {}:", image.display())?;
            let Some(r) = q else {
                writeln!(out, "{:<25}no", "Enabled:")?;
                return Ok(());
            };
            writeln!(out, "{:<25}yes", "Enabled:")?;
            let mode = if r.simple() {
                "squota (simplified accounting)"
            } else {
                "qgroup (full accounting)"
            };
            writeln!(out, "{:<25}{mode}", "Mode:")?;
            let inc = if r.inconsistent() { "yes" } else { "no" };
            writeln!(out, "{:<25}{inc}", "Inconsistent:")?;
            writeln!(out, "{:<25}{}", "Total count:", r.qgroups.len())?;
            for (l, n) in levels(&r) {
                writeln!(out, "{:<25}{n}", format!("Level {l}:"))?;
            }
        }
    }
    Ok(())
}

fn open_ro(image: &std::path::Path) -> Result<Filesystem> {
    Ok(Filesystem::open_replayed(
        &crate::edit::image_paths(image),
        OpenOptions::default(),
    )?)
}

pub fn run_qgroup(cmd: QgroupCmd, out: &mut dyn Write) -> Result<()> {
    use ubtrfs_fuse::quota_ops::client;
    match &cmd {
        QgroupCmd::Create { image, qgroupid } | QgroupCmd::Destroy { image, qgroupid } => {
            if let Some(f) = mounted(image) {
                let create = matches!(cmd, QgroupCmd::Create { .. });
                let q = parse_qgroupid(qgroupid)?;
                return on_mount(
                    "qgroup create/destroy",
                    client::qgroup_create(&f, q, create),
                );
            }
        }
        QgroupCmd::Assign { image, src, dst } | QgroupCmd::Remove { image, src, dst } => {
            if let Some(f) = mounted(image) {
                let assign = matches!(cmd, QgroupCmd::Assign { .. });
                let (s, d) = (parse_qgroupid(src)?, parse_qgroupid(dst)?);
                return on_mount(
                    "qgroup assign/remove",
                    client::qgroup_assign(&f, s, d, assign),
                );
            }
        }
        QgroupCmd::Limit {
            image,
            size,
            qgroupid,
            exclusive,
            ..
        } => {
            if let Some(f) = mounted(image) {
                let q = parse_qgroupid(qgroupid)?;
                let b = parse_size(size)?;
                let canon = image.canonicalize().unwrap_or_else(|_| image.clone());
                let fuse = ubtrfs_fuse::mount_source(&canon)
                    .is_some_and(|(t, _)| t == "fuse" || t.starts_with("fuse."));
                return on_mount(
                    "qgroup limit",
                    client::qgroup_limit(&f, q, *exclusive, b, fuse),
                );
            }
        }
        QgroupCmd::Show(_) => {}
    }
    match cmd {
        QgroupCmd::Show(mut a) => {
            if a.image.is_dir() {
                a.image = image_of_mount(&a.image)?;
            }
            return show(a, out);
        }
        QgroupCmd::Create { image, qgroupid } => {
            let q = parse_qgroupid(&qgroupid)?;
            let mut t = open_rw(&image)?;
            t.qgroup_create(q)?;
            t.commit()?;
        }
        QgroupCmd::Destroy { image, qgroupid } => {
            let q = parse_qgroupid(&qgroupid)?;
            let mut t = open_rw(&image)?;
            t.qgroup_destroy(q)?;
            t.commit()?;
        }
        QgroupCmd::Assign { image, src, dst } => relation(&image, &src, &dst, true)?,
        QgroupCmd::Remove { image, src, dst } => relation(&image, &src, &dst, false)?,
        QgroupCmd::Limit {
            image,
            size,
            qgroupid,
            exclusive,
            compressed: _,
        } => {
            let q = parse_qgroupid(&qgroupid)?;
            let bytes = parse_size(&size)?;
            let kind = if exclusive {
                QgroupLimitKind::Exclusive
            } else {
                QgroupLimitKind::Referenced
            };
            let mut t = open_rw(&image)?;
            t.qgroup_limit(q, kind, bytes)?;
            t.commit()?;
        }
    }
    Ok(())
}

fn relation(image: &std::path::Path, src: &str, dst: &str, add: bool) -> Result<()> {
    let (s, d) = (parse_qgroupid(src)?, parse_qgroupid(dst)?);
    let mut t = open_rw(image)?;
    t.qgroup_relation(s, d, add)?;
    t.commit()?;
    Ok(())
}

/// The path column: the subvolume's path for level 0 (`<toplevel>`, `<stale>` when
/// the subvolume is gone; `<squota space holder>` when, with simple quotas, it
/// still holds space its deleted subvolume made), `<N member qgroups>` above
/// (btrfs-progs counts the qgroups it is a member of); JSON has "" for the top
/// level and higher levels.
fn path_of(g: &QgroupEntry, paths: &BTreeMap<u64, String>, json: bool, simple: bool) -> String {
    if g.qgroupid >> 48 > 0 {
        if json {
            return String::new();
        }
        let n = g.parents.len();
        return format!("<{n} member qgroup{}>", if n == 1 { "" } else { "s" });
    }
    let id = g.qgroupid & ((1 << 48) - 1);
    if id == 5 {
        return if json {
            String::new()
        } else {
            "<toplevel>".into()
        };
    }
    match paths.get(&id) {
        Some(p) => p.clone(),
        None if simple && (g.referenced, g.exclusive) != (0, 0) => "<squota space holder>".into(),
        None => "<stale>".into(),
    }
}

fn show(a: ShowArgs, out: &mut dyn Write) -> Result<()> {
    let fs = open_ro(&a.image)?;
    let Some(r) = fs.quotas()? else {
        bail!("quotas not enabled on {}", a.image.display());
    };
    let paths: BTreeMap<u64, String> = fs
        .subvolumes()?
        .into_iter()
        .map(|s| (s.id, s.path))
        .collect();
    let simple = r.simple();
    let mut rows = r.qgroups.clone();
    if let Some(spec) = &a.sort {
        let mut keys = Vec::new();
        for k in spec.split(',') {
            let (desc, name) = match k.strip_prefix('-') {
                Some(n) => (true, n),
                None => (false, k.strip_prefix('+').unwrap_or(k)),
            };
            if !["qgroupid", "rfer", "excl", "max_rfer", "max_excl", "path"].contains(&name) {
                bail!("unknown sort key {name:?}");
            }
            keys.push((desc, name.to_string()));
        }
        rows.sort_by(|x, y| {
            for (desc, name) in &keys {
                let o = match name.as_str() {
                    "rfer" => x.referenced.cmp(&y.referenced),
                    "excl" => x.exclusive.cmp(&y.exclusive),
                    "max_rfer" => x.max_referenced.cmp(&y.max_referenced),
                    "max_excl" => x.max_exclusive.cmp(&y.max_exclusive),
                    "path" => {
                        path_of(x, &paths, false, simple).cmp(&path_of(y, &paths, false, simple))
                    }
                    _ => x.qgroupid.cmp(&y.qgroupid),
                };
                let o = if *desc { o.reverse() } else { o };
                if o.is_ne() {
                    return o;
                }
            }
            x.qgroupid.cmp(&y.qgroupid)
        });
    }
    if a.format == Format::Json {
        let limit = |l: Option<u64>| l.map_or(json!("none"), |b| json!(b));
        let list: Vec<Value> = rows
            .iter()
            .map(|g| {
                json!({
                    "qgroupid": fmt_qgroupid(g.qgroupid),
                    "referenced": g.referenced,
                    "max_referenced": limit(g.max_referenced),
                    "exclusive": g.exclusive,
                    "max_exclusive": limit(g.max_exclusive),
                    "path": path_of(g, &paths, true, simple),
                    "parents": g.parents.iter().map(|&p| fmt_qgroupid(p)).collect::<Vec<_>>(),
                    "children": g.children.iter().map(|&p| fmt_qgroupid(p)).collect::<Vec<_>>(),
                })
            })
            .collect();
        crate::json::write(
            out,
            &json!({"__header": {"version": "1"}, "qgroup-show": list}),
        )?;
        return Ok(());
    }
    let size = |b: u64| crate::fmt::progs_size(b, a.raw);
    let limit = |l: Option<u64>| l.map_or_else(|| "none".to_string(), size);
    let ids = |v: &[u64]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.iter()
                .map(|&q| fmt_qgroupid(q))
                .collect::<Vec<_>>()
                .join(",")
        }
    };
    // (header, right-aligned, minimum width) as btrfs-progs lays the table out.
    let mut cols: Vec<(&str, bool, usize)> = vec![
        ("Qgroupid", false, 8),
        ("Referenced", true, 13),
        ("Exclusive", true, 12),
    ];
    if a.max_rfer {
        cols.push(("Max referenced", true, 15));
    }
    if a.max_excl {
        cols.push(("Max exclusive", true, 14));
    }
    if a.parents {
        cols.push(("Parent", false, 8));
    }
    if a.children {
        cols.push(("Child", false, 5));
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|g| {
            let mut v = vec![
                fmt_qgroupid(g.qgroupid),
                size(g.referenced),
                size(g.exclusive),
            ];
            if a.max_rfer {
                v.push(limit(g.max_referenced));
            }
            if a.max_excl {
                v.push(limit(g.max_exclusive));
            }
            if a.parents {
                v.push(ids(&g.parents));
            }
            if a.children {
                v.push(ids(&g.children));
            }
            v.push(path_of(g, &paths, false, simple));
            v
        })
        .collect();
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| table.iter().map(|r| r[i].len()).fold(c.2, usize::max))
        .collect();
    let line = |cells: &[String], last: &str, trailing: &str| {
        let mut s = String::new();
        for (i, (c, w)) in cols.iter().zip(&widths).enumerate() {
            if i > 0 {
                s.push(' ');
            }
            if c.1 {
                s.push_str(&format!("{:>w$}", cells[i], w = *w));
            } else {
                s.push_str(&format!("{:<w$}", cells[i], w = *w));
            }
        }
        s.push_str("   ");
        s.push_str(last);
        s.push_str(trailing);
        s
    };
    let head: Vec<String> = cols.iter().map(|c| c.0.to_string()).collect();
    let dash: Vec<String> = cols.iter().map(|c| "-".repeat(c.0.len())).collect();
    writeln!(out, "{}", line(&head, "Path", " "))?;
    writeln!(out, "{}", line(&dash, "----", " "))?;
    for r in &table {
        let last = r.last().map(String::as_str).unwrap_or("");
        writeln!(out, "{}", line(&r[..r.len() - 1], last, ""))?;
    }
    Ok(())
}
