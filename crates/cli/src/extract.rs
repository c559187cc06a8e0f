//! `ubtrfs extract`: copy files out of an image with their metadata, like
//! `btrfs restore` (contents, modes, owners, times, xattrs, symlinks, hard links,
//! special files, holes).

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use nix::sys::stat::{mknod, utimensat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{IsTerminal, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, PermissionsExt};
use std::path::{Path, PathBuf};
use ubtrfs_core::mode::*;
use ubtrfs_core::Stat;
use ubtrfs_core::{Filesystem, Node};
use ubtrfs_format::items::{InodeItem, Timespec};

pub struct Summary {
    pub entries: u64,
    pub failures: u64,
}

struct Ctx<'a> {
    fs: &'a Filesystem,
    /// Directories on the current path: an entry leading back to one is a loop.
    ancestors: Vec<Node>,
    links: HashMap<(u64, u64), PathBuf>,
    bar: ProgressBar,
    summary: Summary,
    warned: HashMap<&'static str, u64>,
}

/// Read size for file data.
const COPY_CHUNK_BYTES: usize = 1 << 20;

impl Ctx<'_> {
    /// Metadata that cannot be applied (not root, a filesystem without xattrs) is
    /// reported once per kind; data errors fail the entry.
    fn soft_fail(&mut self, kind: &'static str, path: &Path, e: impl std::fmt::Display) {
        self.summary.failures += 1;
        let n = self.warned.entry(kind).or_insert(0);
        *n += 1;
        if *n <= 5 {
            self.bar
                .suspend(|| eprintln!("ubtrfs: warning: {}: {kind}: {e}", path.display()));
        }
    }
}

pub fn extract(fs: &Filesystem, src: &str, dest: &Path) -> Result<Summary> {
    let node = fs.resolve(src)?;
    let (st, inode) = stat_and_inode(fs, node)?;
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new_spinner();
        b.set_style(
            ProgressStyle::with_template("{spinner} {pos} entries, {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let mut ctx = Ctx {
        fs,
        ancestors: Vec::new(),
        links: HashMap::new(),
        bar,
        summary: Summary {
            entries: 0,
            failures: 0,
        },
        warned: HashMap::new(),
    };
    if st.mode & S_IFMT == S_IFDIR {
        fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        extract_dir(&mut ctx, node, dest)?;
        apply_meta(&mut ctx, node, &st, dest)?;
    } else {
        fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        let name = src.rsplit('/').next().unwrap_or(src);
        extract_one(&mut ctx, node, &st, inode.as_ref(), &dest.join(name))?;
    }
    ctx.bar.finish_and_clear();
    for (kind, n) in &ctx.warned {
        if *n > 5 {
            eprintln!("ubtrfs: warning: {kind}: {} more like this", n - 5);
        }
    }
    Ok(ctx.summary)
}

/// Deeper than any real tree (PATH_MAX allows ~2048 levels of 1-byte names).
const DEPTH_MAX: usize = 4096;

fn extract_dir(ctx: &mut Ctx<'_>, dir: Node, path: &Path) -> Result<()> {
    if ctx.ancestors.contains(&dir) {
        anyhow::bail!(
            "{}: directory loop (subvolume {} inode {} is its own ancestor)",
            path.display(),
            dir.root,
            dir.ino
        );
    }
    if ctx.ancestors.len() >= DEPTH_MAX {
        anyhow::bail!(
            "{}: directories nested deeper than {DEPTH_MAX}",
            path.display()
        );
    }
    ctx.ancestors.push(dir);
    let entries = ctx.fs.readdir(dir)?;
    for e in entries {
        let p = path.join(OsStr::from_bytes(&e.name));
        let (st, inode) = stat_and_inode(ctx.fs, e.node)?;
        extract_one(ctx, e.node, &st, inode.as_ref(), &p)?;
    }
    ctx.ancestors.pop();
    Ok(())
}

/// The inode is read once per entry: stat is derived from it and the data copy
/// reuses it (no second tree search per file).
fn stat_and_inode(fs: &Filesystem, node: Node) -> Result<(Stat, Option<InodeItem>)> {
    if node.is_placeholder() {
        return Ok((fs.stat(node)?, None));
    }
    let i = fs.inode_item(node)?;
    Ok((fs.stat_of(node, &i), Some(i)))
}

fn extract_one(
    ctx: &mut Ctx<'_>,
    node: Node,
    st: &Stat,
    inode: Option<&InodeItem>,
    p: &Path,
) -> Result<()> {
    ctx.summary.entries += 1;
    ctx.bar.inc(1);
    let kind = st.mode & S_IFMT;
    if kind != S_IFDIR && st.nlink > 1 {
        if let Some(first) = ctx.links.get(&(node.root, node.ino)) {
            let _ = fs::remove_file(p);
            fs::hard_link(first, p)
                .with_context(|| format!("linking {} to {}", p.display(), first.display()))?;
            return Ok(());
        }
        ctx.links.insert((node.root, node.ino), p.to_path_buf());
    }
    match kind {
        S_IFDIR => {
            match fs::create_dir(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => {}
                Err(e) => return Err(e).with_context(|| format!("creating {}", p.display())),
            }
            extract_dir(ctx, node, p)?;
        }
        S_IFREG => {
            ctx.bar.set_message(p.display().to_string());
            write_file(ctx, node, st, inode, p)?;
        }
        S_IFLNK => {
            let t = ctx.fs.readlink(node)?;
            let _ = fs::remove_file(p);
            std::os::unix::fs::symlink(OsStr::from_bytes(&t), p)
                .with_context(|| format!("creating symlink {}", p.display()))?;
        }
        S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK => {
            let _ = fs::remove_file(p);
            let flag = SFlag::from_bits_truncate(kind);
            if let Err(e) = mknod(p, flag, Mode::from_bits_truncate(st.mode & 0o777), st.rdev) {
                ctx.soft_fail("mknod", p, e);
                return Ok(());
            }
        }
        _ => {
            ctx.soft_fail("unknown file type", p, format!("mode {:o}", st.mode));
            return Ok(());
        }
    }
    apply_meta(ctx, node, st, p)
}

fn write_file(
    ctx: &mut Ctx<'_>,
    node: Node,
    st: &Stat,
    inode: Option<&InodeItem>,
    p: &Path,
) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)
        .with_context(|| format!("creating {}", p.display()))?;
    let inode = match inode {
        Some(i) => i.clone(),
        None => ctx.fs.inode_item(node)?,
    };
    let ranges = ctx.fs.data_ranges(node, inode.size)?;
    let disp = p.display().to_string();
    for (start, end) in ranges {
        let mut off = start;
        f.seek(SeekFrom::Start(off))?;
        while off < end {
            let n = ((end - off) as usize).min(COPY_CHUNK_BYTES);
            let buf = ctx
                .fs
                .read_inode(node, &inode, off, n)
                .with_context(|| format!("{disp}: reading offset {off}"))?;
            if buf.is_empty() {
                break;
            }
            f.write_all(&buf)
                .with_context(|| format!("{disp}: writing offset {off}"))?;
            off += buf.len() as u64;
        }
    }
    // Holes at the end (and a file that is all hole) come from the size.
    f.set_len(st.size)?;
    drop::<File>(f);
    Ok(())
}

fn ts(t: &Timespec) -> TimeSpec {
    TimeSpec::new(t.sec, t.nsec as i64)
}

fn apply_meta(ctx: &mut Ctx<'_>, node: Node, st: &Stat, p: &Path) -> Result<()> {
    let kind = st.mode & S_IFMT;
    // Owner first: chown clears setuid/setgid, so the mode follows it.
    if let Err(e) = lchown(p, Some(st.uid), Some(st.gid)) {
        ctx.soft_fail("chown", p, e);
    }
    if kind != S_IFLNK {
        if let Err(e) = fs::set_permissions(p, fs::Permissions::from_mode(st.mode & 0o7777)) {
            ctx.soft_fail("chmod", p, e);
        }
    }
    for (name, value) in ctx.fs.xattrs(node)? {
        if let Err(e) = xattr::set(p, OsStr::from_bytes(&name), &value) {
            ctx.soft_fail(
                "setxattr",
                p,
                format!("{}: {e}", String::from_utf8_lossy(&name)),
            );
        }
    }
    if let Err(e) = utimensat(
        None,
        p,
        &ts(&st.atime),
        &ts(&st.mtime),
        UtimensatFlags::NoFollowSymlink,
    ) {
        ctx.soft_fail("utimensat", p, e);
    }
    Ok(())
}
