//! Commands that make data shared inside an image: `cp` (with reflinks, like
//! `cp --reflink` on a kernel mount) and `dedupe` (like duperemove -d). Both are one
//! writing session on the image and commit at the end.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use ubtrfs_core::format::consts::*;
use ubtrfs_core::format::items::InodeItem;
use ubtrfs_core::mode::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use ubtrfs_core::tools::dedupe::{dedupe, DedupeOptions, DedupeReport};
use ubtrfs_core::tools::du::pretty_size as human;
use ubtrfs_core::{now, Error, FilePos, NewInode, Node, Trans};

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
    /// Image file or block device.
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

const S_IFMT_DIR: u32 = S_IFDIR;

fn is_readonly(t: &Trans, root: u64) -> Result<bool> {
    Ok(t.fs.subvol_root_item(root)?.flags & ROOT_SUBVOL_RDONLY != 0)
}

fn name_of(path: &str) -> Result<(String, Vec<u8>)> {
    let trimmed = path.trim_end_matches('/');
    let (parent, name) = match trimmed.rfind('/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => ("", trimmed),
    };
    if name.is_empty() || name == "." || name == ".." {
        bail!("{path}: not a name to create");
    }
    Ok((format!("/{parent}"), name.as_bytes().to_vec()))
}

/// `ubtrfs cp`.
pub fn cp(a: CpArgs) -> Result<()> {
    let mut t = open_rw(&a.image)?;
    let src =
        t.fs.resolve(&a.src)
            .with_context(|| format!("{}: cannot stat", a.src))?;
    let src_i = t.fs.inode_item(src)?;
    if src_i.mode & S_IFMT == S_IFDIR && !a.recursive {
        bail!("{}: is a directory (use -r)", a.src);
    }
    // Into an existing directory, under the source's name; else as the given name.
    let (dir, name) = match t.fs.resolve(&a.dest) {
        Ok(d) if t.fs.inode_item(d)?.mode & S_IFMT == S_IFMT_DIR => (d, name_of(&a.src)?.1),
        _ => {
            let (parent, name) = name_of(&a.dest)?;
            let d =
                t.fs.resolve(&parent)
                    .with_context(|| format!("{}: no such directory", parent))?;
            (d, name)
        }
    };
    if is_readonly(&t, dir.root)? {
        bail!("{}: Read-only file system", a.dest);
    }
    let mut c = Copy {
        mode: a.reflink,
        archive: a.archive,
        shared_bytes: 0,
        copied_bytes: 0,
    };
    c.copy(&mut t, src, dir, &name, &a.src)?;
    t.commit()?;
    Ok(())
}

struct Copy {
    mode: ReflinkMode,
    archive: bool,
    shared_bytes: u64,
    copied_bytes: u64,
}

impl Copy {
    fn copy(
        &mut self,
        t: &mut Trans,
        src: Node,
        dir: Node,
        name: &[u8],
        shown: &str,
    ) -> Result<()> {
        let si = t.read_inode(src.root, src.ino)?;
        if si.mode & S_IFMT == S_IFDIR && src.root == dir.root && self.is_below(t, dir, src)? {
            bail!("{shown}: cannot copy a directory into itself");
        }
        let attr = if self.archive {
            NewInode {
                mode: si.mode,
                uid: si.uid,
                gid: si.gid,
                rdev: si.rdev,
                time: now(),
            }
        } else {
            // As cp run by root without -p: owned by root, the mode less a 022
            // umask, no set-id bits when the owner changes.
            let mut perm = si.mode & 0o7777 & !0o022;
            if si.uid != 0 || si.gid != 0 {
                perm &= !0o6000;
            }
            NewInode {
                mode: (si.mode & S_IFMT) | perm,
                uid: 0,
                gid: 0,
                rdev: si.rdev,
                time: now(),
            }
        };
        let existing = t.lookup(dir.root, dir.ino, name)?;
        let ino = match si.mode & S_IFMT {
            S_IFDIR => match existing {
                Some((ino, FT_DIR, _)) => ino,
                Some(_) => bail!("{shown}: cannot overwrite a non-directory with a directory"),
                None => t.create(dir.root, dir.ino, name, attr)?,
            },
            S_IFLNK => {
                if existing.is_some() {
                    t.unlink(dir.root, dir.ino, name, now())?;
                }
                let target = t.fs.readlink(src)?;
                t.symlink(dir.root, dir.ino, name, &target, attr)?
            }
            S_IFREG => match existing {
                Some((ino, FT_REG_FILE, _)) => {
                    t.truncate(dir.root, ino, 0, now())?;
                    ino
                }
                Some(_) => bail!("{shown}: destination exists and is not a regular file"),
                None => t.create(dir.root, dir.ino, name, attr)?,
            },
            _ => {
                if existing.is_some() {
                    t.unlink(dir.root, dir.ino, name, now())?;
                }
                t.create(dir.root, dir.ino, name, attr)?
            }
        };
        let dst = Node::new(dir.root, ino);
        match si.mode & S_IFMT {
            S_IFREG => self.copy_data(t, src, &si, dst, shown)?,
            S_IFDIR => {
                for e in t.fs.readdir(src)? {
                    if e.node.root != src.root {
                        // As cp -r on a kernel mount: a nested subvolume is copied as a
                        // plain directory with its contents.
                        eprintln!(
                            "cp: {shown}/{}: a subvolume, copied as a directory",
                            String::from_utf8_lossy(&e.name)
                        );
                    }
                    let child = format!("{shown}/{}", String::from_utf8_lossy(&e.name));
                    self.copy(t, e.node, dst, &e.name, &child)?;
                }
            }
            _ => {}
        }
        if self.archive {
            for (n, v) in t.fs.xattrs(src)? {
                t.set_xattr(dst.root, dst.ino, &n, &v, now())?;
            }
            let mut di = t.read_inode(dst.root, dst.ino)?;
            di.atime = si.atime;
            di.mtime = si.mtime;
            t.write_inode(dst.root, dst.ino, &di)?;
        }
        Ok(())
    }

    /// Whether directory `node` is `ancestor` or below it (same subvolume).
    fn is_below(&self, t: &Trans, node: Node, ancestor: Node) -> Result<bool> {
        let mut p = t.fs.dir_path_in(node.root, node.ino)?;
        let mut a = t.fs.dir_path_in(ancestor.root, ancestor.ino)?;
        p.push(b'/');
        a.push(b'/');
        Ok(p.starts_with(&a))
    }

    fn copy_data(
        &mut self,
        t: &mut Trans,
        src: Node,
        si: &InodeItem,
        dst: Node,
        shown: &str,
    ) -> Result<()> {
        let size = si.size;
        match self.mode {
            ReflinkMode::Always => {
                let mut off = 0;
                while off < size {
                    let n = (size - off).min(1 << 30);
                    t.clone_range(
                        FilePos::new(src.root, src.ino, off),
                        FilePos::new(dst.root, dst.ino, off),
                        n,
                        now(),
                    )
                    .map_err(|e| match e {
                        Error::Invalid(m) => anyhow::anyhow!("{shown}: {m}"),
                        e => e.into(),
                    })?;
                    off += n;
                }
                self.shared_bytes += size;
            }
            ReflinkMode::Auto => {
                let mut off = 0;
                while off < size {
                    let (n, shared) = t.copy_file_range(
                        FilePos::new(src.root, src.ino, off),
                        FilePos::new(dst.root, dst.ino, off),
                        size - off,
                        now(),
                    )?;
                    if n == 0 {
                        break;
                    }
                    if shared {
                        self.shared_bytes += n;
                    } else {
                        self.copied_bytes += n;
                    }
                    off += n;
                }
            }
            ReflinkMode::Never => {
                let mut off = 0;
                while off < size {
                    let n = (size - off).min(8 << 20);
                    let data = t.read_file_range(src.root, src.ino, off, n as usize, si)?;
                    t.write(dst.root, dst.ino, off, &data, now())?;
                    off += n;
                }
                self.copied_bytes += size;
                t.truncate(dst.root, dst.ino, size, now())?;
            }
        }
        Ok(())
    }
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
