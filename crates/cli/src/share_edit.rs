//! Commands that make data shared inside an image: `cp` (with reflinks, like
//! `cp --reflink` on a kernel mount) and `dedupe` (like duperemove -d). Both are one
//! writing session on the image and commit at the end.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use ubtrfs_core::tools::cp::{cp_paths, CpOptions, ReflinkMode as CoreReflink};
use ubtrfs_core::tools::dedupe::{dedupe, DedupeOptions, DedupeReport};
use ubtrfs_core::tools::du::pretty_size as human;

use crate::edit::{open_rw, parse_size};

/// How `cp` treats file data (GNU cp's --reflink).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReflinkMode {
    /// Share every extent (FICLONE); fail where the kernel's clone would.
    Always,
    /// Share what can be shared, copy the rest (copy_file_range on btrfs).
    Auto,
    /// Copy the bytes.
    Never,
}

#[derive(Args)]
pub struct CpArgs {
    /// Image file or block device, or a directory of a read-write `ubtrfs mount`
    /// (its process copies; SRC and DEST are then relative to that directory).
    pub image: PathBuf,
    /// Source path inside the image.
    pub src: String,
    /// Destination: a new name, an existing file (replaced) or an existing directory.
    pub dest: String,
    /// Copy directories recursively.
    #[arg(short = 'r', short_alias = 'R', long)]
    pub recursive: bool,
    /// Share data instead of copying it.
    #[arg(long, value_enum, default_value = "auto", num_args = 0..=1, default_missing_value = "always")]
    pub reflink: ReflinkMode,
    /// Keep owner, mode, times and xattrs (like cp -a). Without it, as cp run by
    /// root: copies are owned by root, get the mode less a 022 umask and the current
    /// time.
    #[arg(short = 'a', long)]
    pub archive: bool,
}

#[derive(Args)]
pub struct DedupeArgs {
    /// Image file or block device, or a directory of a read-write `ubtrfs mount`
    /// (its process does the work; PATHs are then relative to that directory).
    pub image: PathBuf,
    /// Directories or files inside the image to look at (default: everything below
    /// the top-level subvolume, subvolumes included).
    pub paths: Vec<String>,
    /// Files smaller than this are skipped (e.g. 64K, 1M).
    #[arg(long, default_value = "4K")]
    pub min_size: String,
    /// Find and compare duplicates, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// `ubtrfs cp`: offline on an image, else (a directory of a `ubtrfs mount`) by the
/// mount's process.
pub fn cp(a: CpArgs) -> Result<()> {
    let reflink = match a.reflink {
        ReflinkMode::Always => CoreReflink::Always,
        ReflinkMode::Auto => CoreReflink::Auto,
        ReflinkMode::Never => CoreReflink::Never,
    };
    let opts = CpOptions {
        reflink,
        archive: a.archive,
        recursive: a.recursive,
    };
    if a.image.is_dir() {
        same_file_refused(&a)?;
        let dir = std::fs::File::open(&a.image)
            .with_context(|| format!("{}: cannot open", a.image.display()))?;
        let r = ubtrfs_fuse::cp_ops::client::cp(&dir, &a.src, &a.dest, &opts)
            .with_context(|| format!("cp {} {}: through the mount", a.src, a.dest))?;
        for w in r.warnings {
            eprintln!("cp: {w}");
        }
        return Ok(());
    }
    let mut t = open_rw(&a.image)?;
    let r = cp_paths(&mut t, &|fs, p| fs.resolve(p), &a.src, &a.dest, &opts)?;
    for w in r.warnings {
        eprintln!("cp: {w}");
    }
    t.commit()?;
    Ok(())
}

/// Through a mount the server's refusal of a file copied onto itself reaches the
/// command as a bare EINVAL: the same check here first, with cp's words.
fn same_file_refused(a: &CpArgs) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let at = |p: &str| a.image.join(p.trim_start_matches('/'));
    let (src, mut dest) = (at(&a.src), at(&a.dest));
    if dest.is_dir() {
        if let Some(name) = src.file_name() {
            dest.push(name);
        }
    }
    if let (Ok(s), Ok(d)) = (src.symlink_metadata(), dest.symlink_metadata()) {
        if (s.dev(), s.ino()) == (d.dev(), d.ino()) {
            anyhow::bail!(
                "cp {} {}: the source and the destination are the same file",
                a.src,
                a.dest
            );
        }
    }
    Ok(())
}

/// `ubtrfs dedupe`.
pub fn dedupe_cmd(a: DedupeArgs) -> Result<DedupeReport> {
    if a.image.is_dir() {
        return dedupe_mounted(&a);
    }
    let mut t = open_rw(&a.image)?;
    let paths = if a.paths.is_empty() {
        vec!["/".to_string()]
    } else {
        a.paths.clone()
    };
    let mut starts = Vec::new();
    for p in &paths {
        starts.push(
            t.fs.resolve(p)
                .with_context(|| format!("{p}: cannot stat"))?,
        );
    }
    let opts = DedupeOptions {
        min_size_bytes: parse_size(&a.min_size)?,
        dry_run: a.dry_run,
    };
    let bar = if !a.quiet && std::io::stderr().is_terminal() {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{msg:10} [{bar:40}] {bytes}/{total_bytes} {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let mut phase = 0u32;
    let mut last_done = u64::MAX;
    let report = dedupe(&mut t, &starts, &opts, &mut |done, total| {
        if let Some(b) = &bar {
            if done < last_done {
                phase += 1;
                b.set_message(if phase == 1 { "hashing" } else { "deduping" });
                b.set_length(total);
            }
            b.set_position(done);
        }
        last_done = done;
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for w in t.fs.info.take_warnings() {
        eprintln!("ubtrfs: warning: {w}");
    }
    Ok(report)
}

/// `ubtrfs dedupe MNT [PATH...]`: the mount's process deduplicates (paths relative
/// to MNT), as `ubtrfs_fuse::dedupe_ops` describes.
fn dedupe_mounted(a: &DedupeArgs) -> Result<DedupeReport> {
    let dir = std::fs::File::open(&a.image)
        .with_context(|| format!("{}: cannot open", a.image.display()))?;
    let rel: Vec<&[u8]> = a
        .paths
        .iter()
        .map(|p| p.trim_start_matches('/').as_bytes())
        .collect();
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new_spinner();
        b.set_message("deduplicating through the mount");
        b.enable_steady_tick(std::time::Duration::from_millis(120));
        b
    });
    let r =
        ubtrfs_fuse::dedupe_ops::client::dedupe(&dir, &rel, parse_size(&a.min_size)?, a.dry_run)
            .with_context(|| format!("{}: dedupe through the mount", a.image.display()));
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let r = r?;
    if r.bytes_unreadable > 0 {
        eprintln!(
            "ubtrfs: warning: {} bytes could not be read and were left unshared (the mount's log names them)",
            r.bytes_unreadable
        );
    }
    Ok(r)
}

/// The text summary of `dedupe`.
pub fn print_dedupe(out: &mut dyn Write, r: &DedupeReport, dry_run: bool) -> Result<()> {
    writeln!(
        out,
        "Scanned {} files, {} of data",
        r.files,
        human(r.bytes_scanned)
    )?;
    let verb = if dry_run {
        "Would deduplicate"
    } else {
        "Deduplicated"
    };
    writeln!(
        out,
        "{verb} {} in {} ranges ({} already shared, {} matched by hash but differed)",
        human(r.bytes_deduped),
        r.ranges,
        human(r.bytes_already_shared),
        human(r.bytes_differing)
    )?;
    if r.bytes_unreadable > 0 {
        writeln!(
            out,
            "Left {} unshared that could not be read (see the warnings)",
            human(r.bytes_unreadable)
        )?;
    }
    if !dry_run {
        writeln!(
            out,
            "Freed {} (data used {} -> {})",
            human(r.bytes_freed()),
            human(r.data_used_before),
            human(r.data_used_after)
        )?;
    }
    Ok(())
}
