//! Sharedness commands: `inspect fiemap` (filefrag -v layout) and `filesystem du`
//! (btrfs filesystem du layout).

use anyhow::{bail, Result};
use clap::Args;
use std::io::Write;
use ubtrfs_core::mode::{S_IFMT, S_IFREG};
use ubtrfs_core::tools::fiemap::{flag_names, FiemapExtent, FIEMAP_EXTENT_DATA_INLINE};
use ubtrfs_core::Filesystem;
use ubtrfs_core::ShareCtx;

#[derive(Args)]
pub struct FiemapArgs {
    #[command(flatten)]
    pub img: crate::Image,
    /// Files (absolute paths inside the filesystem).
    #[arg(required = true)]
    pub paths: Vec<String>,
    /// Print every extent like `filefrag -v`.
    #[arg(short = 'v')]
    pub verbose: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: crate::Format,
}

#[derive(Args)]
pub struct DuArgs {
    #[command(flatten)]
    pub img: crate::Image,
    #[arg(required = true)]
    pub paths: Vec<String>,
    /// Only a total for each argument.
    #[arg(short = 's', long = "summarize")]
    pub summarize: bool,
    /// Plain byte counts.
    #[arg(long)]
    pub raw: bool,
    /// Also print what the given paths occupy on disk (each extent once, at its
    /// compressed size) per compression type, like compsize.
    #[arg(long)]
    pub footprint: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: crate::Format,
}

fn int_log10(mut v: u64) -> usize {
    let mut l = 0;
    v /= 10;
    while v > 0 {
        l += 1;
        v /= 10;
    }
    l
}

/// filefrag's extent count: a new extent wherever the physical block does not
/// follow the previous one (except at logical 0).
fn filefrag_lines(
    exts: &[FiemapExtent],
    size: u64,
    blksize: u64,
    lw: usize,
    pw: usize,
    out: &mut dyn Write,
) -> Result<usize> {
    let shift = blksize.trailing_zeros();
    let mut expected = 0u64;
    let mut tot = 0usize;
    for (n, e) in exts.iter().enumerate() {
        let s = if e.flags & FIEMAP_EXTENT_DATA_INLINE != 0 {
            0
        } else {
            shift
        };
        let (lb, pb, len) = (e.logical >> s, e.physical >> s, e.length >> s);
        let phys_blk = e.physical >> shift;
        if (e.logical >> shift) != 0 && phys_blk != expected {
            tot += 1;
        } else {
            expected = 0;
            if tot == 0 {
                tot = 1;
            }
        }
        let mut flags: Vec<String> = flag_names(e.flags).iter().map(|s| s.to_string()).collect();
        if e.logical + e.length >= size {
            flags.push("eof".into());
        }
        // filefrag: "%*llu:" when a discontinuity is expected, blanks otherwise.
        let exp = if expected != 0 {
            format!("{expected:>pw$}:")
        } else {
            format!("{:>w$}", "", w = pw + 1)
        };
        // The flags column carries its own leading space, so none trails when empty.
        let flags = if flags.is_empty() {
            String::new()
        } else {
            format!(" {}", flags.join(","))
        };
        writeln!(
            out,
            "{n:4}: {lb:>lw$}..{:>lw$}: {pb:>pw$}..{:>pw$}: {len:6}: {exp}{flags}",
            lb + len.saturating_sub(1),
            pb + len.saturating_sub(1),
        )?;
        expected = phys_blk + (e.length >> shift);
    }
    Ok(tot)
}

/// The extent count filefrag prints, without formatting every line.
fn filefrag_count(exts: &[FiemapExtent], blksize: u64) -> usize {
    let shift = blksize.trailing_zeros();
    let mut expected = 0u64;
    let mut tot = 0usize;
    for e in exts {
        let phys_blk = e.physical >> shift;
        if (e.logical >> shift) != 0 && phys_blk != expected {
            tot += 1;
        } else if tot == 0 {
            tot = 1;
        }
        expected = phys_blk + (e.length >> shift);
    }
    tot
}

pub fn cmd_fiemap(fs: &Filesystem, a: &FiemapArgs, out: &mut dyn Write) -> Result<()> {
    let mut share = ShareCtx::new(&fs.info)?;
    let mut files = Vec::new();
    let ss = fs.info.sectorsize as u64;
    // filefrag sizes its columns from the filesystem's block count.
    let pw = (int_log10(fs.info.sb.total_bytes / ss) + 1).max(10);
    for (i, path) in a.paths.iter().enumerate() {
        let node = fs.resolve(path)?;
        let st = fs.stat(node)?;
        if st.mode & S_IFMT != S_IFREG {
            bail!("{path}: not a regular file");
        }
        let exts = fs.fiemap(node, &mut share)?;
        if a.format == crate::Format::Json {
            files.push(crate::json::fiemap_file(path, st.size, &exts));
            continue;
        }
        let blocks = st.size.div_ceil(ss);
        let lw = (int_log10(blocks) + 1).max(8);
        if a.verbose {
            if i == 0 {
                writeln!(out, "Filesystem type is: 9123683e")?;
            }
            writeln!(
                out,
                "File size of {path} is {} ({blocks} block{} of {ss} bytes)",
                st.size,
                if blocks == 1 { "" } else { "s" }
            )?;
            writeln!(
                out,
                " ext: {:>w1$} {:>w2$} length: {:>w3$} flags:",
                "logical_offset:",
                "physical_offset:",
                "expected:",
                w1 = lw * 2 + 3,
                w2 = pw * 2 + 3,
                w3 = pw + 1
            )?;
        }
        let n = if a.verbose {
            filefrag_lines(&exts, st.size, ss, lw, pw, out)?
        } else {
            filefrag_count(&exts, ss)
        };
        if n == 1 {
            writeln!(out, "{path}: 1 extent found")?;
        } else {
            writeln!(out, "{path}: {n} extents found")?;
        }
    }
    if a.format == crate::Format::Json {
        crate::json::write(out, &files)?;
    }
    Ok(())
}

pub fn cmd_du(fs: &Filesystem, a: &DuArgs, out: &mut dyn Write) -> Result<()> {
    let mut share = ShareCtx::new(&fs.info)?;
    let size = |v: u64| crate::fmt::progs_size(v, a.raw);
    let mut lines = Vec::new();
    if a.format == crate::Format::Text {
        writeln!(
            out,
            "{:>10}  {:>10}  {:>10}  Filename",
            "Total", "Exclusive", "Set shared"
        )?;
    }
    for p in &a.paths {
        for l in fs.filesystem_du(&mut share, p, a.summarize)? {
            if a.format == crate::Format::Json {
                lines.push(l);
                continue;
            }
            writeln!(
                out,
                "{:>10}  {:>10}  {:>10}  {}",
                size(l.total),
                size(l.exclusive),
                l.set_shared.map(size).unwrap_or_else(|| "-".into()),
                l.path
            )?;
        }
    }
    let footprint = if a.footprint {
        let paths: Vec<&str> = a.paths.iter().map(|s| s.as_str()).collect();
        Some(fs.footprint(&paths)?)
    } else {
        None
    };
    if a.format == crate::Format::Json {
        crate::json::write(out, &crate::json::du(&lines, footprint.as_ref()))?;
        return Ok(());
    }
    if let Some(fp) = footprint {
        writeln!(
            out,
            "Footprint: {} files, {} regular extents ({} refs), {} inline",
            fp.files, fp.regular_extents, fp.refs, fp.inline_extents
        )?;
        writeln!(
            out,
            "{:<10} {:>5} {:>12} {:>12} {:>12}",
            "Type", "Perc", "Disk Usage", "Uncompressed", "Referenced"
        )?;
        let row = |name: &str, r: &ubtrfs_core::tools::du::FootprintRow, out: &mut dyn Write| {
            let perc = (r.disk * 100).checked_div(r.uncompressed).unwrap_or(0);
            writeln!(
                out,
                "{:<10} {:>4}% {:>12} {:>12} {:>12}",
                name,
                perc,
                size(r.disk),
                size(r.uncompressed),
                size(r.referenced)
            )
        };
        row("TOTAL", &fp.total(), out)?;
        for (i, name) in ["none", "zlib", "lzo", "zstd"].iter().enumerate() {
            if fp.by_type[i] != Default::default() {
                row(name, &fp.by_type[i], out)?;
            }
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct SubvolDuArgs {
    #[command(flatten)]
    pub img: crate::Image,
    /// Subvolumes (paths) to report, and whose joint deletion to price; all if none.
    pub paths: Vec<String>,
    /// Plain byte counts.
    #[arg(long)]
    pub raw: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: crate::Format,
}

/// `subvolume du`: referenced/exclusive per subvolume (what `btrfs qgroup show`
/// reports after a rescan), and what deleting the given set together would free.
pub fn cmd_subvol_du(fs: &Filesystem, a: &SubvolDuArgs, out: &mut dyn Write) -> Result<()> {
    let sharing = ubtrfs_core::tools::subvol_du::compute_sharing(&fs.info)?;
    let subs = fs.subvolumes()?;
    let path_of = |id: u64| -> String {
        if id == ubtrfs_format::consts::FS_TREE_OBJECTID {
            "<toplevel>".into()
        } else {
            subs.iter()
                .find(|s| s.id == id)
                .map(|s| s.path.clone())
                .unwrap_or_else(|| "<unreachable>".into())
        }
    };
    let mut chosen: Vec<u64> = Vec::new();
    for p in &a.paths {
        let node = fs.resolve(p)?;
        match fs.subvol_of(node) {
            Some(id) => chosen.push(id),
            None => bail!("{p}: not a subvolume"),
        }
    }
    let numbers: Vec<_> = sharing
        .numbers()
        .into_iter()
        .filter(|q| chosen.is_empty() || chosen.contains(&q.subvol))
        .collect();
    let freed = (!chosen.is_empty()).then(|| sharing.freed_by(&chosen));
    if a.format == crate::Format::Json {
        crate::json::write(out, &crate::json::subvol_du(&numbers, path_of, freed))?;
        return Ok(());
    }
    let size = |v: u64| crate::fmt::progs_size(v, a.raw);
    writeln!(
        out,
        "{:<10} {:>13} {:>13}   Path",
        "Qgroupid", "Referenced", "Exclusive"
    )?;
    writeln!(
        out,
        "{:<10} {:>13} {:>13}   ----",
        "--------", "----------", "---------"
    )?;
    for q in &numbers {
        writeln!(
            out,
            "{:<10} {:>13} {:>13}   {}",
            format!("0/{}", q.subvol),
            size(q.referenced),
            size(q.exclusive),
            path_of(q.subvol)
        )?;
    }
    if let Some(f) = freed {
        writeln!(
            out,
            "Deleting {} subvolume(s) together would free {}",
            chosen.len(),
            size(f)
        )?;
    }
    Ok(())
}
