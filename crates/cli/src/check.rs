//! `ubtrfs check`: the engine's read-only consistency check, printed as btrfs check
//! prints it (phase lines on stderr, `ERROR:` lines and the totals on stdout), or as
//! one JSON object. Exit status 0 when clean, 1 when anything is wrong.

use crate::{json, Format};
use anyhow::Result;
use clap::Args;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use ubtrfs_core::format::bytes::uuid_string;
use ubtrfs_core::CHECK_PHASES;
use ubtrfs_core::{check_filesystem, CheckOptions, CheckReport, Filesystem, FsInfo, OpenOptions};

#[derive(Args)]
pub struct CheckArgs {
    /// Image files or block devices (all devices of a multi-device filesystem, as
    /// separate arguments or joined by commas).
    #[arg(required = true)]
    images: Vec<String>,
    /// Read every copy of every data sector and compare it with its checksum.
    #[arg(long)]
    check_data_csum: bool,
    /// Print the recounted quota groups (quotas are checked whenever they are on).
    #[arg(long, short = 'Q')]
    qgroup_report: bool,
    /// Show progress on a terminal (always on stderr).
    #[arg(long, short = 'p')]
    progress: bool,
    /// Kept for btrfs check's users: ubtrfs check never writes.
    #[arg(long)]
    readonly: bool,
    /// Check each subvolume tree item by item, without sharing the work on the
    /// subtrees snapshots share (slower; for tests comparing the two).
    #[arg(long, hide = true)]
    item_by_item: bool,
    /// Memory for the references the extent tree must hold, and for each list of
    /// data ranges, before they spill to a temporary file, in bytes (default 256
    /// and 64 MiB; for tests of the spill).
    #[arg(long, hide = true, value_name = "BYTES")]
    refs_mem_max: Option<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

/// Problems were found (exit status 1, the summary already printed).
#[derive(Debug)]
pub struct Unclean(pub u64);

impl std::fmt::Display for Unclean {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} problem(s) found", self.0)
    }
}

impl std::error::Error for Unclean {}

pub fn run(a: CheckArgs, out: &mut dyn Write) -> Result<()> {
    let paths: Vec<PathBuf> = a
        .images
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    let text = a.format == Format::Text;
    if text {
        eprintln!("Opening filesystem to check...");
    }
    let opts = OpenOptions {
        // The check reads each tree block about once (the subvolume trees bottom-up,
        // a subtree snapshots share worked out once), so a small cache is enough:
        // on a /usr copy with 16 snapshots, 16 MiB checks as fast as 256 MiB in
        // half the memory.
        cache_bytes_max: 16 << 20,
        ..OpenOptions::default()
    };
    let fs = Filesystem::from_info(FsInfo::open_paths(&paths, opts)?);
    // Bad copies the open worked around are reported by the check itself.
    let _ = fs.info.take_warnings();
    if text {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        eprintln!("Checking filesystem on {}", names.join(","));
        eprintln!("UUID: {}", uuid_string(&fs.info.sb.fsid));
    }
    let bar = crate::fmt::spinner(a.progress, "{spinner} {msg} [{elapsed}]");
    let copts = CheckOptions {
        check_data_csum: a.check_data_csum,
        qgroup_report: a.qgroup_report,
        item_by_item: a.item_by_item,
        refs_mem_bytes_max: a.refs_mem_max.unwrap_or(0),
    };
    let mut progress = |phase: usize, n: u64| {
        bar.set_message(format!("{}: {n}", CHECK_PHASES[phase]));
        bar.tick();
    };
    let report = check_filesystem(&fs, &copts, &mut progress)?;
    bar.finish_and_clear();
    if text {
        for (i, phase) in CHECK_PHASES.iter().enumerate() {
            match report.skipped.iter().find(|s| s.0 == *phase) {
                Some((_, why)) => eprintln!("[{}/8] {phase} skipped ({why})", i + 1),
                None => eprintln!("[{}/8] {phase}", i + 1),
            }
        }
        for n in &report.notes {
            eprintln!("note: {n}");
        }
        print_text(&report, out)?;
    } else {
        json::write(out, &to_json(&report))?;
    }
    out.flush()?;
    if report.is_clean() {
        Ok(())
    } else {
        Err(Unclean(report.problem_count).into())
    }
}

fn print_text(r: &CheckReport, out: &mut dyn Write) -> Result<()> {
    for p in &r.problems {
        writeln!(out, "ERROR: {p}")?;
    }
    if r.problem_count > r.problems.len() as u64 {
        writeln!(
            out,
            "ERROR: ... and {} more",
            r.problem_count - r.problems.len() as u64
        )?;
    }
    let s = &r.stats;
    let verdict = if r.is_clean() {
        "no error found"
    } else {
        "error(s) found"
    };
    writeln!(out, "found {} bytes used, {verdict}", s.bytes_used)?;
    writeln!(out, "total csum bytes: {}", s.csum_bytes)?;
    writeln!(out, "total tree bytes: {}", s.tree_bytes)?;
    writeln!(out, "total fs tree bytes: {}", s.fs_tree_bytes)?;
    writeln!(out, "total extent tree bytes: {}", s.extent_tree_bytes)?;
    writeln!(out, "btree space waste bytes: {}", s.btree_space_waste)?;
    writeln!(
        out,
        "file data blocks allocated: {}",
        s.data_bytes_allocated
    )?;
    writeln!(out, " referenced {}", s.data_bytes_referenced)?;
    Ok(())
}

fn to_json(r: &CheckReport) -> serde_json::Value {
    let problems: Vec<serde_json::Value> = r
        .problems
        .iter()
        .map(|p| {
            json!({
                "rule": p.rule,
                "tree": p.tree.map(|t| t as i64),
                "block": p.block,
                "key": p.key.map(|k| k.to_string()),
                "message": p.message,
            })
        })
        .collect();
    let s = &r.stats;
    json!({
        "problems": problems,
        "problem_count": r.problem_count,
        "bytes_used": s.bytes_used,
        "csum_bytes": s.csum_bytes,
        "tree_bytes": s.tree_bytes,
        "fs_tree_bytes": s.fs_tree_bytes,
        "extent_tree_bytes": s.extent_tree_bytes,
        "btree_space_waste": s.btree_space_waste,
        "data_bytes_allocated": s.data_bytes_allocated,
        "data_bytes_referenced": s.data_bytes_referenced,
        "tree_blocks": s.tree_blocks,
        "data_bytes_verified": s.data_bytes_verified,
        "refs_spilled": s.refs_spilled,
        "notes": r.notes,
        "skipped": r.skipped.iter().map(|(p, w)| json!({"phase": p, "reason": w})).collect::<Vec<_>>(),
    })
}
