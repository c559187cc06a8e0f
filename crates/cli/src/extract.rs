//! `ubtrfs extract`: copy files out of an image with their metadata, like
//! `btrfs restore` (contents, modes, owners, times, xattrs, symlinks, hard links,
//! special files, holes).
//!
//! Salvage (the default; `--strict` stops at the first error instead): the image is
//! opened so that tree blocks no copy gives intact read as empty (see the core's
//! `io/salvage.rs`), and data failing its checksums in every copy is written as
//! found. Every loss is reported once on stderr with what it affects; an entry that
//! cannot be restored is reported and skipped. After the walk, a subvolume that lost
//! blocks is swept for inodes the walk did not reach (their directory entries were
//! in a lost block): each is restored under its parent's path through its
//! INODE_REF/INODE_EXTREF, or in `lost+found/<subvolume>/<inode>` when no name
//! leads anywhere. Subvolumes no path reaches go to `lost+found/<subvolume>` too.
//! Then the older generations of the superblock's backup roots are walked, newest
//! first, for what is still missing: entries restored at their path there, and
//! what lost+found holds moved to the name that generation gives it.

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use nix::sys::stat::{mknod, utimensat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, PermissionsExt};
use std::path::{Path, PathBuf};
use ubtrfs_core::mode::*;
use ubtrfs_core::Stat;
use ubtrfs_core::{Filesystem, Node};
use ubtrfs_format::items::{InodeItem, Timespec};

pub struct Summary {
    pub entries: u64,
    /// Metadata that could not be applied (owner, mode, xattrs, times).
    pub failures: u64,
    /// Tree blocks lost (no copy intact).
    pub lost_blocks: u64,
    /// Data ranges written as found (checksums failed in every copy).
    pub damaged_data: u64,
    /// Entries that could not be restored at all.
    pub lost_entries: u64,
    /// Inodes restored through their back references after their directory entry
    /// was lost.
    pub recovered: u64,
    /// Of those, the ones without a usable name (in lost+found).
    pub in_lost_found: u64,
    /// Entries restored from an older generation (a backup root) because the
    /// current one lost them.
    pub from_older: u64,
}

impl Summary {
    /// Whether anything of the image could not be restored as it was.
    pub fn lost_anything(&self) -> bool {
        self.lost_blocks + self.damaged_data + self.lost_entries > 0
    }
}

/// What the caller asked for.
pub struct ExtractOptions {
    /// Stop at the first error (no salvage).
    pub strict: bool,
    /// List what would be restored, write nothing.
    pub dry_run: bool,
    /// Opens the image again at an older root tree (a backup root's block), to fill
    /// in what the current one lost; None: older generations are not tried.
    pub open_older: Option<OpenOlder>,
}

/// See [`ExtractOptions::open_older`].
pub type OpenOlder = Box<dyn Fn(u64) -> Result<Filesystem>>;

struct Ctx<'a> {
    fs: &'a Filesystem,
    opts: &'a ExtractOptions,
    dest: PathBuf,
    /// Directories on the current path: an entry leading back to one is a loop.
    ancestors: Vec<Node>,
    links: HashMap<(u64, u64), PathBuf>,
    bar: ProgressBar,
    summary: Summary,
    warned: HashMap<&'static str, u64>,
    /// Lost tree blocks and damaged data already reported.
    lost_reported: (u64, u64),
    /// Subvolumes whose trees lost blocks while they were walked.
    damaged: BTreeSet<u64>,
    /// Every inode restored (or found unrestorable), and where directories went.
    done: HashSet<(u64, u64)>,
    dir_paths: HashMap<(u64, u64), PathBuf>,
    /// After the walk: entries restored now are counted as recovered.
    recovering: bool,
    /// Inodes put in lost+found (no name found): an older generation that names
    /// them moves them to their path.
    /// (Where, whether it was made without its inode: a directory whose own item
    /// is lost, made to hold the children that name it.)
    in_lost_found: HashMap<(u64, u64), (PathBuf, bool)>,
    /// Walking an older generation (this generation): only what is not restored
    /// yet is restored; its own losses are not reported (it is older by design).
    filling: Option<u64>,
}

/// The root directory inode of a subvolume, as in the core's consts.
const FIRST_FREE_OBJECTID_CLI: u64 = ubtrfs_core::format::consts::FIRST_FREE_OBJECTID;

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

    /// Reports the tree blocks and data lost since the last call, once each, as
    /// affecting `what` (a path and the kind of read) in subvolume `subvol`.
    fn note_losses(&mut self, subvol: u64, what: &dyn Fn() -> String) {
        if self.filling.is_some() {
            return;
        }
        let (_, blocks) = self.fs.info.lost_blocks();
        let (_, data) = self.fs.info.damaged_data();
        if (blocks, data) == self.lost_reported {
            return;
        }
        let (lost, _) = self.fs.info.lost_blocks();
        let (bad, _) = self.fs.info.damaged_data();
        let affects = what();
        for b in lost.iter().skip(self.lost_reported.0 as usize) {
            let level = b.level.map_or("?".to_string(), |l| l.to_string());
            let from = b
                .first_key
                .map_or(String::new(), |k| format!(", keys from {k}"));
            self.bar.suspend(|| {
                eprintln!(
                    "ubtrfs: lost: tree block {} (level {level}{from}) of subvolume {subvol}, \
                     affects {affects}: {}",
                    b.bytenr, b.error
                )
            });
        }
        for d in bad.iter().skip(self.lost_reported.1 as usize) {
            self.bar
                .suspend(|| eprintln!("ubtrfs: damaged: {affects}: {d}"));
        }
        if blocks > self.lost_reported.0 {
            self.damaged.insert(subvol);
        }
        self.summary.lost_blocks = blocks;
        self.summary.damaged_data = data;
        self.lost_reported = (blocks, data);
    }

    /// An entry that cannot be restored: an error with `--strict`, else reported and
    /// counted.
    fn lose_entry(&mut self, p: &Path, e: anyhow::Error) -> Result<()> {
        if self.opts.strict {
            return Err(e);
        }
        self.summary.lost_entries += 1;
        self.bar
            .suspend(|| eprintln!("ubtrfs: lost: {}: {e:#}", p.display()));
        Ok(())
    }
}

pub fn extract(fs: &Filesystem, src: &str, dest: &Path, opts: &ExtractOptions) -> Result<Summary> {
    let node = fs.resolve(src)?;
    // A subvolume's root directory whose inode item was lost is still walked (its
    // entries may be in other blocks), without its own metadata.
    let (st, inode, root_lost) = match stat_and_inode(fs, node) {
        Ok((st, i)) => (st, i, false),
        Err(e) if !opts.strict && node.ino == FIRST_FREE_OBJECTID_CLI => {
            eprintln!(
                "ubtrfs: lost: the root directory of subvolume {} ({e}): its entries are \
                 restored without its own owner, mode and times",
                node.root
            );
            let st = Stat {
                subvol: node.root,
                ino: node.ino,
                mode: S_IFDIR | 0o755,
                nlink: 1,
                uid: 0,
                gid: 0,
                rdev: 0,
                size: 0,
                blocks: 0,
                blksize: fs.info.sectorsize,
                atime: Timespec::default(),
                mtime: Timespec::default(),
                ctime: Timespec::default(),
                crtime: Timespec::default(),
                generation: 0,
                flags: 0,
            };
            (st, None, true)
        }
        Err(e) => return Err(e),
    };
    let bar = crate::fmt::spinner(true, "{spinner} {pos} entries, {msg} [{elapsed}]");
    let mut ctx = Ctx {
        fs,
        opts,
        dest: dest.to_path_buf(),
        ancestors: Vec::new(),
        links: HashMap::new(),
        bar,
        summary: Summary {
            entries: 0,
            failures: 0,
            lost_blocks: 0,
            damaged_data: 0,
            lost_entries: 0,
            recovered: 0,
            in_lost_found: 0,
            from_older: 0,
        },
        warned: HashMap::new(),
        lost_reported: (0, 0),
        damaged: BTreeSet::new(),
        done: HashSet::new(),
        dir_paths: HashMap::new(),
        recovering: false,
        in_lost_found: HashMap::new(),
        filling: None,
    };
    // Losses met while opening (chunk and root trees) and finding the start.
    ctx.note_losses(node.root, &|| format!("the way to {src}"));
    if !opts.dry_run {
        fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    }
    if st.mode & S_IFMT == S_IFDIR {
        ctx.done.insert((node.root, node.ino));
        ctx.dir_paths
            .insert((node.root, node.ino), dest.to_path_buf());
        extract_dir(&mut ctx, node, dest)?;
        if root_lost {
            ctx.summary.lost_entries += 1;
        } else if !opts.dry_run {
            apply_meta(&mut ctx, node, &st, dest)?;
        }
    } else {
        let name = src.rsplit('/').next().unwrap_or(src);
        extract_one(&mut ctx, node, &st, inode.as_ref(), &dest.join(name))?;
    }
    // Only a whole-filesystem extract can tell what no path reached.
    if !opts.strict && (src == "/" || src.is_empty()) {
        ctx.recovering = true;
        recover_unreached(&mut ctx)?;
        if ctx.summary.lost_blocks > 0 {
            ctx.recovering = false;
            fill_from_older(&mut ctx)?;
        }
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
    let entries = ctx.fs.readdir(dir);
    ctx.note_losses(dir.root, &|| format!("the listing of {}", path.display()));
    let entries = match entries {
        Ok(e) => e,
        Err(e) => {
            ctx.ancestors.pop();
            return ctx.lose_entry(path, anyhow::Error::from(e).context("listing"));
        }
    };
    for e in entries {
        let p = path.join(OsStr::from_bytes(&e.name));
        if ctx.filling.is_some() && !ctx.opts.dry_run && fs::symlink_metadata(&p).is_err() {
            // In lost+found for want of a name: this generation names it.
            if let Some((from, made)) = ctx.in_lost_found.remove(&(e.node.root, e.node.ino)) {
                if fs::rename(&from, &p).is_ok() {
                    if made {
                        // Its own owner, mode and times, from this generation.
                        if let Ok((st, _)) = stat_and_inode(ctx.fs, e.node) {
                            apply_meta(ctx, e.node, &st, &p)?;
                        }
                    }
                    ctx.bar.suspend(|| {
                        eprintln!(
                            "ubtrfs: recovered: {} is {} in generation {}",
                            from.display(),
                            p.display(),
                            ctx.filling.unwrap_or(0)
                        )
                    });
                    for v in ctx.dir_paths.values_mut() {
                        if let Ok(rest) = v.strip_prefix(&from) {
                            *v = p.join(rest);
                        }
                    }
                    for (v, _) in ctx.in_lost_found.values_mut() {
                        if let Ok(rest) = v.strip_prefix(&from) {
                            *v = p.join(rest);
                        }
                    }
                }
            }
        }
        if ctx.filling.is_some() && ctx.done.contains(&(e.node.root, e.node.ino)) {
            // An older generation: only what is missing is restored; directories
            // restored already are walked for it (where they went), in the
            // subvolumes that lost blocks.
            if let Some(d) = ctx.dir_paths.get(&(e.node.root, e.node.ino)).cloned() {
                if ctx.damaged.contains(&e.node.root) || e.node.ino == FIRST_FREE_OBJECTID_CLI {
                    extract_dir(ctx, e.node, &d)?;
                }
            }
            continue;
        }
        if ctx.filling.is_some() && fs::symlink_metadata(&p).is_ok() {
            continue;
        }
        if ctx.done.contains(&(e.node.root, e.node.ino)) && !e.node.is_placeholder() {
            // Reached twice: a hard link is linked again (extract_one); anything else
            // (a directory, or an inode salvage reached by two ways) is not.
            match stat_and_inode(ctx.fs, e.node) {
                Ok((st, _)) if st.mode & S_IFMT != S_IFDIR && st.nlink > 1 => {}
                _ => continue,
            }
        }
        let got = stat_and_inode(ctx.fs, e.node);
        ctx.note_losses(e.node.root, &|| format!("the inode of {}", p.display()));
        match got {
            Ok((st, inode)) => extract_one(ctx, e.node, &st, inode.as_ref(), &p)?,
            Err(err) if !ctx.opts.strict && !e.node.is_placeholder() => {
                ctx.done.insert((e.node.root, e.node.ino));
                let err = err.context(format!("subvolume {} inode {}", e.node.root, e.node.ino));
                without_inode(ctx, &e, &p, err)?;
            }
            Err(err) => {
                ctx.done.insert((e.node.root, e.node.ino));
                let err = err.context(format!("subvolume {} inode {}", e.node.root, e.node.ino));
                ctx.lose_entry(&p, err)?;
            }
        }
    }
    ctx.ancestors.pop();
    Ok(())
}

/// Largest file size asked for when an inode's own size is lost (its extents say).
const SIZE_UNKNOWN: u64 = 1 << 62;

/// An entry whose inode item is lost (as `btrfs restore` does, from what the
/// directory entry says it is): a regular file gets the data its extent items
/// still describe, its size the end of the last one; a directory is created and
/// walked (its entries may be intact). Owner, mode and times are lost with the
/// inode: the entry is counted and reported as lost all the same.
fn without_inode(
    ctx: &mut Ctx<'_>,
    e: &ubtrfs_core::DirEntry,
    p: &Path,
    err: anyhow::Error,
) -> Result<()> {
    use ubtrfs_core::format::{FT_DIR, FT_REG_FILE};
    let kind = match e.ty {
        FT_REG_FILE => "file",
        FT_DIR => "directory",
        _ => return ctx.lose_entry(p, err),
    };
    ctx.lose_entry(
        p,
        err.context(format!(
            "its inode item is lost: the {kind} is restored from its directory entry, \
             without owner, mode and times"
        )),
    )?;
    if ctx.opts.dry_run {
        ctx.bar.suspend(|| println!("{}", p.display()));
        return Ok(());
    }
    ctx.summary.entries += 1;
    if e.ty == FT_DIR {
        match fs::create_dir(p) {
            Ok(()) => {}
            Err(x) if x.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => {}
            Err(x) => return ctx.lose_entry(p, anyhow::Error::from(x).context("mkdir")),
        }
        ctx.dir_paths
            .insert((e.node.root, e.node.ino), p.to_path_buf());
        return extract_dir(ctx, e.node, p);
    }
    let ranges = ctx.fs.data_ranges(e.node, SIZE_UNKNOWN);
    ctx.note_losses(e.node.root, &|| format!("the data of {}", p.display()));
    let size = ranges
        .as_ref()
        .ok()
        .and_then(|r| r.last().map(|r| r.1))
        .unwrap_or(0);
    let inode = InodeItem {
        size,
        mode: S_IFREG | 0o600,
        nlink: 1,
        ..Default::default()
    };
    let st = ctx.fs.stat_of(e.node, &inode);
    let r = write_file(ctx, e.node, &st, Some(&inode), p);
    ctx.note_losses(e.node.root, &|| format!("the data of {}", p.display()));
    if let Err(x) = r {
        ctx.lose_entry(p, x)?;
    }
    Ok(())
}

/// Restores what the walk did not reach in the subvolumes that lost blocks (see
/// the module comment), and the subvolumes no path reached.
fn recover_unreached(ctx: &mut Ctx<'_>) -> Result<()> {
    // Subvolumes first: their root directories anchor their inodes' paths.
    if let Ok(subs) = ctx.fs.subvolumes() {
        for sv in subs {
            let root_dir = Node::new(sv.id, FIRST_FREE_OBJECTID_CLI);
            if ctx.done.contains(&(sv.id, FIRST_FREE_OBJECTID_CLI)) {
                continue;
            }
            let p = lost_found(ctx, sv.id, None);
            match stat_and_inode(ctx.fs, root_dir) {
                Ok((st, inode)) => {
                    ctx.bar.suspend(|| {
                        eprintln!(
                            "ubtrfs: recovered: subvolume {} ({}) reached by no path: {}",
                            sv.id,
                            sv.path,
                            p.display()
                        )
                    });
                    extract_one(ctx, root_dir, &st, inode.as_ref(), &p)?;
                }
                Err(e) => ctx.lose_entry(&p, e)?,
            }
        }
    }
    let damaged: Vec<u64> = ctx.damaged.iter().copied().collect();
    for subvol in damaged {
        let mut unreached = Vec::new();
        let done = &ctx.done;
        let swept = ctx.fs.for_each_inode(subvol, |ino, i| {
            if i.nlink > 0 && !done.contains(&(subvol, ino)) {
                unreached.push(ino);
            }
            Ok(true)
        });
        ctx.note_losses(subvol, &|| format!("the sweep of subvolume {subvol}"));
        if let Err(e) = swept {
            ctx.lose_entry(&ctx.dest.clone(), anyhow::Error::from(e).context("sweep"))?;
        }
        for ino in unreached {
            recover_inode(ctx, Node::new(subvol, ino), 0)?;
        }
    }
    Ok(())
}

/// After blocks were lost: the backup roots of older generations, newest first,
/// are walked for entries not restored yet (what the lost blocks held when that
/// commit was made, if its blocks are intact still), each restored at its path
/// there and reported. Their data is checked against that commit's checksums.
fn fill_from_older(ctx: &mut Ctx<'_>) -> Result<()> {
    let Some(open) = &ctx.opts.open_older else {
        return Ok(());
    };
    let sb = &ctx.fs.info.sb;
    let mut older: Vec<(u64, u64)> = sb
        .backup_roots
        .iter()
        .filter(|b| b.tree_root != 0 && b.tree_root_gen < sb.generation && b.tree_root != sb.root)
        .map(|b| (b.tree_root_gen, b.tree_root))
        .collect();
    older.sort_unstable_by(|a, b| b.cmp(a));
    older.dedup();
    for (generation, bytenr) in older {
        let old = match open(bytenr) {
            Ok(f) => f,
            Err(e) => {
                ctx.bar.suspend(|| {
                    eprintln!(
                        "ubtrfs: warning: generation {generation} (backup root {bytenr}): {e:#}"
                    )
                });
                continue;
            }
        };
        let _ = old.info.take_warnings();
        let before = ctx.summary.from_older;
        let mut octx = Ctx {
            fs: &old,
            opts: ctx.opts,
            dest: ctx.dest.clone(),
            ancestors: Vec::new(),
            links: std::mem::take(&mut ctx.links),
            bar: ctx.bar.clone(),
            summary: std::mem::replace(&mut ctx.summary, empty_summary()),
            warned: std::mem::take(&mut ctx.warned),
            lost_reported: (0, 0),
            damaged: std::mem::take(&mut ctx.damaged),
            done: std::mem::take(&mut ctx.done),
            dir_paths: std::mem::take(&mut ctx.dir_paths),
            recovering: false,
            in_lost_found: std::mem::take(&mut ctx.in_lost_found),
            filling: Some(generation),
        };
        let root = Node::new(
            ubtrfs_core::format::FS_TREE_OBJECTID,
            FIRST_FREE_OBJECTID_CLI,
        );
        let dest = octx.dest.clone();
        let r = extract_dir(&mut octx, root, &dest);
        ctx.links = octx.links;
        ctx.summary = octx.summary;
        ctx.warned = octx.warned;
        ctx.damaged = octx.damaged;
        ctx.done = octx.done;
        ctx.dir_paths = octx.dir_paths;
        ctx.in_lost_found = octx.in_lost_found;
        r?;
        if !ctx.opts.dry_run {
            // What older generations named leaves lost+found empty: not kept.
            let lf = ctx.dest.join("lost+found");
            if let Ok(rd) = fs::read_dir(&lf) {
                for d in rd.flatten() {
                    let _ = fs::remove_dir(d.path());
                }
            }
            let _ = fs::remove_dir(&lf);
        }
        if ctx.summary.from_older > before {
            ctx.bar.suspend(|| {
                eprintln!(
                    "ubtrfs: recovered: {} entries from generation {generation} (backup root \
                     {bytenr})",
                    ctx.summary.from_older - before
                )
            });
        }
    }
    Ok(())
}

fn empty_summary() -> Summary {
    Summary {
        entries: 0,
        failures: 0,
        lost_blocks: 0,
        damaged_data: 0,
        lost_entries: 0,
        recovered: 0,
        in_lost_found: 0,
        from_older: 0,
    }
}

/// Where an unnamed inode (or with `ino` None, a subvolume's root) goes.
fn lost_found(ctx: &mut Ctx<'_>, subvol: u64, ino: Option<u64>) -> PathBuf {
    let mut p = ctx.dest.join("lost+found").join(subvol.to_string());
    if let Some(i) = ino {
        if !ctx.opts.dry_run {
            let _ = fs::create_dir_all(&p);
        }
        p = p.join(i.to_string());
    } else if !ctx.opts.dry_run {
        let _ = fs::create_dir_all(ctx.dest.join("lost+found"));
    }
    p
}

/// Restores an inode the walk did not reach, under its parent's path when a back
/// reference names a directory that is (or can be) restored; returns where it went.
fn recover_inode(ctx: &mut Ctx<'_>, node: Node, depth: usize) -> Result<Option<PathBuf>> {
    if let Some(p) = ctx.dir_paths.get(&(node.root, node.ino)) {
        return Ok(Some(p.clone()));
    }
    if ctx.done.contains(&(node.root, node.ino)) || depth > DEPTH_MAX {
        return Ok(None);
    }
    let (st, inode) = match stat_and_inode(ctx.fs, node) {
        Ok(x) => x,
        Err(_) => return Ok(None),
    };
    let refs = ctx.fs.inode_refs(node).unwrap_or_default();
    let mut at = None;
    for r in refs {
        if r.name.is_empty() || r.name.contains(&b'/') || r.parent == node.ino {
            continue;
        }
        if let Some(parent) = recover_inode(ctx, Node::new(node.root, r.parent), depth + 1)? {
            at = Some(parent.join(OsStr::from_bytes(&r.name)));
            break;
        }
    }
    let p = match at {
        Some(p) => p,
        None => {
            // A name whose directory is lost keeps the name, under the lost
            // directory's inode number; no name at all: the inode number.
            let usable = ctx
                .fs
                .inode_refs(node)
                .unwrap_or_default()
                .into_iter()
                .find(|r| !r.name.is_empty() && !r.name.contains(&b'/'));
            match usable {
                Some(r) => {
                    let d = lost_found(ctx, node.root, Some(r.parent));
                    let lost_dir = Node::new(node.root, r.parent);
                    if !ctx.dir_paths.contains_key(&(lost_dir.root, lost_dir.ino)) {
                        // The directory's own item is lost, but its entries may not
                        // be: list what is left of it there, this inode included.
                        if !ctx.opts.dry_run {
                            let _ = fs::create_dir_all(&d);
                        }
                        ctx.dir_paths
                            .insert((lost_dir.root, lost_dir.ino), d.clone());
                        ctx.in_lost_found
                            .insert((lost_dir.root, lost_dir.ino), (d.clone(), true));
                        ctx.done.insert((lost_dir.root, lost_dir.ino));
                        extract_dir(ctx, lost_dir, &d)?;
                        if ctx.done.contains(&(node.root, node.ino)) {
                            return Ok(ctx.dir_paths.get(&(node.root, node.ino)).cloned());
                        }
                    }
                    d.join(OsStr::from_bytes(&r.name))
                }
                None => lost_found(ctx, node.root, Some(node.ino)),
            }
        }
    };
    if ctx.done.contains(&(node.root, node.ino)) {
        // Restored meanwhile (a parent's recovery listed it).
        return Ok(ctx.dir_paths.get(&(node.root, node.ino)).cloned());
    }
    ctx.bar.suspend(|| {
        eprintln!(
            "ubtrfs: recovered: subvolume {} inode {} (its directory entry is lost): {}",
            node.root,
            node.ino,
            p.display()
        )
    });
    extract_one(ctx, node, &st, inode.as_ref(), &p)?;
    Ok((st.mode & S_IFMT == S_IFDIR).then_some(p))
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
    ctx.done.insert((node.root, node.ino));
    if let Some(g) = ctx.filling {
        ctx.summary.from_older += 1;
        ctx.bar.suspend(|| {
            eprintln!(
                "ubtrfs: recovered: subvolume {} inode {} from generation {g} (lost in the \
                 current one; older contents): {}",
                node.root,
                node.ino,
                p.display()
            )
        });
    }
    if ctx.recovering {
        ctx.summary.recovered += 1;
        if p.starts_with(ctx.dest.join("lost+found")) {
            ctx.summary.in_lost_found += 1;
            ctx.in_lost_found
                .insert((node.root, node.ino), (p.to_path_buf(), false));
        }
    }
    let kind = st.mode & S_IFMT;
    if ctx.opts.dry_run {
        ctx.bar.suspend(|| println!("{}", p.display()));
        if kind == S_IFDIR {
            ctx.dir_paths.insert((node.root, node.ino), p.to_path_buf());
            extract_dir(ctx, node, p)?;
        } else if kind == S_IFREG {
            // Reading the data finds what is lost in it.
            let r = ctx.fs.data_ranges(node, st.size).and_then(|ranges| {
                for (start, end) in ranges {
                    let mut off = start;
                    while off < end {
                        let n = ((end - off) as usize).min(COPY_CHUNK_BYTES);
                        ctx.fs.read(node, off, n)?;
                        off += n as u64;
                    }
                }
                Ok(())
            });
            ctx.note_losses(node.root, &|| format!("the data of {}", p.display()));
            if let Err(e) = r {
                ctx.lose_entry(p, e.into())?;
            }
        }
        return Ok(());
    }
    match extract_kind(ctx, node, st, inode, p) {
        Ok(true) => apply_meta(ctx, node, st, p),
        Ok(false) => Ok(()),
        Err(e) => ctx.lose_entry(p, e),
    }
}

/// Creates the entry and its contents; false when its metadata is not to be applied
/// (a hard link to one restored before, a device node that could not be made).
fn extract_kind(
    ctx: &mut Ctx<'_>,
    node: Node,
    st: &Stat,
    inode: Option<&InodeItem>,
    p: &Path,
) -> Result<bool> {
    let kind = st.mode & S_IFMT;
    if kind != S_IFDIR && st.nlink > 1 {
        if let Some(first) = ctx.links.get(&(node.root, node.ino)) {
            let _ = fs::remove_file(p);
            fs::hard_link(first, p)
                .with_context(|| format!("linking {} to {}", p.display(), first.display()))?;
            return Ok(false);
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
            ctx.dir_paths.insert((node.root, node.ino), p.to_path_buf());
            extract_dir(ctx, node, p)?;
        }
        S_IFREG => {
            ctx.bar.set_message(p.display().to_string());
            let r = write_file(ctx, node, st, inode, p);
            ctx.note_losses(node.root, &|| format!("the data of {}", p.display()));
            r?;
        }
        S_IFLNK => {
            let t = ctx.fs.readlink(node);
            ctx.note_losses(node.root, &|| format!("the target of {}", p.display()));
            let t = t?;
            let _ = fs::remove_file(p);
            std::os::unix::fs::symlink(OsStr::from_bytes(&t), p)
                .with_context(|| format!("creating symlink {}", p.display()))?;
        }
        S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK => {
            let _ = fs::remove_file(p);
            let flag = SFlag::from_bits_truncate(kind);
            if let Err(e) = mknod(p, flag, Mode::from_bits_truncate(st.mode & 0o777), st.rdev) {
                ctx.soft_fail("mknod", p, e);
                return Ok(false);
            }
        }
        _ => {
            ctx.soft_fail("unknown file type", p, format!("mode {:o}", st.mode));
            return Ok(false);
        }
    }
    Ok(true)
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
    let xattrs = ctx.fs.xattrs(node);
    ctx.note_losses(node.root, &|| format!("the xattrs of {}", p.display()));
    for (name, value) in xattrs.unwrap_or_default() {
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
