//! Subvolume commands that write: create, snapshot, delete (and the cleaner that
//! drops deleted trees), set-default; and the reading ones that go with them
//! (get-default, show) plus `property get|set ... ro`. Messages follow btrfs-progs.

use crate::edit::{open_rw, writable};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::ProgressBar;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use ubtrfs_core::format::consts::*;
use ubtrfs_core::{now, Filesystem, Node, Trans};

#[derive(Subcommand)]
pub enum SubvolEditCmd {
    /// Create empty subvolumes, like `btrfs subvolume create`.
    Create {
        /// Image file, or a mounted directory (ubtrfs or kernel mount; paths are
        /// then relative to it and the mount makes the change).
        image: PathBuf,
        #[arg(required = true)]
        paths: Vec<String>,
        /// Add the new subvolume's qgroup to this higher-level qgroup (repeatable),
        /// like `btrfs subvolume create -i`.
        #[arg(short = 'i', value_name = "QGROUPID")]
        inherit: Vec<String>,
    },
    /// Snapshot a subvolume, like `btrfs subvolume snapshot` (constant time).
    Snapshot {
        /// Image file, or a mounted directory (ubtrfs or kernel mount; paths are
        /// then relative to it and the mount makes the change).
        image: PathBuf,
        /// The subvolume to snapshot.
        src: String,
        /// The new snapshot's path, or an existing directory to put it in.
        dest: String,
        /// Make the snapshot read-only.
        #[arg(short = 'r')]
        readonly: bool,
        /// Add the snapshot's qgroup to this higher-level qgroup (repeatable), like
        /// `btrfs subvolume snapshot -i`; the numbers are exact at the commit.
        #[arg(short = 'i', value_name = "QGROUPID")]
        inherit: Vec<String>,
    },
    /// Delete subvolumes and drop their trees, like `btrfs subvolume delete` followed
    /// by the kernel's cleaner. Interrupted, the next `subvolume sync` (or a kernel
    /// mount) finishes the drop.
    Delete(DeleteArgs),
    /// Finish dropping deleted subvolumes (the kernel's cleaner), like `btrfs
    /// subvolume sync`.
    Sync {
        image: PathBuf,
        /// No progress bar.
        #[arg(short = 'q', long)]
        quiet: bool,
        #[command(flatten)]
        drop: DropLimits,
    },
    /// Set the subvolume a mount without subvol= opens.
    SetDefault {
        /// Image file, or a directory where ubtrfs mounted it (the mount does it).
        image: PathBuf,
        /// Subvolume id, or a path to a subvolume.
        subvol: String,
    },
    /// Print the default subvolume like `btrfs subvolume get-default`.
    GetDefault {
        /// Image file, or a directory where ubtrfs mounted it.
        image: PathBuf,
    },
    /// Details of one subvolume like `btrfs subvolume show`.
    Show { image: PathBuf, path: String },
}

#[derive(Args)]
pub struct DeleteArgs {
    /// Image file, or a mounted directory (ubtrfs or kernel mount; paths are then
    /// relative to it, and the mount's cleaner drops the tree).
    pub image: PathBuf,
    #[arg(required_unless_present = "subvolid")]
    pub paths: Vec<String>,
    /// Delete the subvolume with this id instead of a path.
    #[arg(short = 'i', long)]
    pub subvolid: Option<u64>,
    /// Accepted for btrfs-progs compatibility: every deletion is committed.
    #[arg(short = 'c', long)]
    pub commit_after: bool,
    /// Accepted for btrfs-progs compatibility: every deletion is committed.
    #[arg(short = 'C', long)]
    pub commit_each: bool,
    /// Only unlink and mark for the cleaner; leave the drop to `subvolume sync` or
    /// the kernel (as the kernel's delete returns before its cleaner runs).
    #[arg(long)]
    pub no_drop: bool,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    #[command(flatten)]
    pub drop: DropLimits,
}

/// Test knobs: how much the cleaner does per commit, and when it stops.
#[derive(Args, Clone, Copy)]
pub struct DropLimits {
    #[arg(long, hide = true)]
    pub drop_blocks_per_commit: Option<u64>,
    #[arg(long, hide = true)]
    pub max_drop_commits: Option<u64>,
}

#[derive(Subcommand)]
pub enum PropertyCmd {
    /// Print a property (`ro` of a subvolume) like `btrfs property get`.
    Get {
        /// Image file, or a directory where ubtrfs mounted it (PATH relative to it).
        image: PathBuf,
        path: String,
        /// Only `ro` is a subvolume property here.
        name: Option<String>,
    },
    /// Set `ro` of a subvolume like `btrfs property set PATH ro true|false`.
    Set {
        /// Image file, or a directory where ubtrfs mounted it (the mount does it).
        image: PathBuf,
        path: String,
        name: String,
        value: String,
        /// Make a received subvolume writable (clears its received_uuid).
        #[arg(short = 'f', long)]
        force: bool,
    },
}

fn split(path: &str) -> Result<(String, Vec<u8>)> {
    let p = path.trim_end_matches('/');
    let (parent, name) = match p.rfind('/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => ("", p),
    };
    if name.is_empty() || name == "." || name == ".." {
        bail!("{path}: not a name for a subvolume");
    }
    Ok((format!("/{parent}"), name.as_bytes().to_vec()))
}

/// A reading open (a tree log is replayed in memory only).
fn open_ro(image: &Path) -> Result<Filesystem> {
    Ok(Filesystem::open_replayed(
        &crate::edit::image_paths(image),
        ubtrfs_core::OpenOptions::default(),
    )?)
}

fn parent_dir(t: &Trans, parent: &str) -> Result<Node> {
    let d =
        t.fs.resolve(parent)
            .with_context(|| format!("{parent}: cannot access"))?;
    writable(t, d, parent.as_bytes())?;
    Ok(d)
}

/// The subvolume whose root a path names ("Not a Btrfs subvolume" otherwise).
fn subvol_at(fs: &Filesystem, path: &str) -> Result<u64> {
    let n = fs
        .resolve(path)
        .with_context(|| format!("{path}: cannot access"))?;
    if n.ino != FIRST_FREE_OBJECTID || n.is_placeholder() {
        bail!("{path}: Not a Btrfs subvolume");
    }
    Ok(n.root)
}

fn bar(quiet: bool, what: &str) -> Option<ProgressBar> {
    (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = crate::fmt::spinner(true, "{spinner} {msg} [{elapsed}]");
        b.set_message(what.to_string());
        b
    })
}

/// Runs the cleaner to the end on every deleted tree.
fn drop_all(t: &mut Trans, quiet: bool, limits: DropLimits) -> Result<Vec<u64>> {
    let b = bar(quiet, "dropping deleted subvolumes");
    let done = t.drop_dead_roots(
        limits.drop_blocks_per_commit,
        limits.max_drop_commits,
        &mut |n| {
            if let Some(b) = &b {
                b.set_message(format!("dropping deleted subvolumes: {n} tree blocks"));
            }
        },
    )?;
    if let Some(b) = b {
        b.finish_and_clear();
    }
    Ok(done)
}

/// A path inside a mounted directory: (its parent directory, open; its name).
fn mounted_parent(mnt: &Path, path: &str) -> Result<(File, Vec<u8>)> {
    let (parent, name) = split(path)?;
    let dir = mnt.join(parent.trim_start_matches('/'));
    let f = File::open(&dir).with_context(|| format!("{}: cannot open", dir.display()))?;
    Ok((f, name))
}

/// create/snapshot/delete on a mounted filesystem (a ubtrfs mount, or the kernel's):
/// the btrfs ioctls on the parent directory, so the mount's own daemon does the
/// change. Paths are relative to the mounted directory.
fn run_mounted(cmd: SubvolEditCmd, out: &mut dyn Write) -> Result<()> {
    use ubtrfs_fuse::subvol_ops::client;
    match cmd {
        SubvolEditCmd::Create {
            image,
            paths,
            inherit,
        } => {
            let inherit = parse_inherit(&inherit)?;
            for p in &paths {
                let (dir, name) = mounted_parent(&image, p)?;
                let new_path = image.join(p.trim_start_matches('/'));
                create_mounted(&image, &dir, None, &name, false, &inherit, &new_path)
                    .with_context(|| format!("{p}: cannot create subvolume"))?;
                writeln!(out, "Create subvolume '{p}'")?;
            }
        }
        SubvolEditCmd::Snapshot {
            image,
            src,
            dest,
            readonly,
            inherit,
        } => {
            let inherit = parse_inherit(&inherit)?;
            let srcf = File::open(image.join(src.trim_start_matches('/')))
                .with_context(|| format!("{src}: cannot open"))?;
            let d = image.join(dest.trim_start_matches('/'));
            let (dir, name, shown, new_path) = if d.is_dir() {
                let (_, n) = split(&src)?;
                let shown = format!(
                    "{}/{}",
                    dest.trim_end_matches('/'),
                    String::from_utf8_lossy(&n)
                );
                let new_path = d.join(String::from_utf8_lossy(&n).as_ref());
                (
                    File::open(&d).with_context(|| format!("{dest}: cannot open"))?,
                    n,
                    shown,
                    new_path,
                )
            } else {
                let (f, n) = mounted_parent(&image, &dest)?;
                (f, n, dest.clone(), image.join(dest.trim_start_matches('/')))
            };
            create_mounted(
                &image,
                &dir,
                Some(&srcf),
                &name,
                readonly,
                &inherit,
                &new_path,
            )
            .with_context(|| format!("{shown}: cannot snapshot '{src}'"))?;
            let ro = if readonly { "readonly " } else { "" };
            writeln!(out, "Create {ro}snapshot of '{src}' in '{shown}'")?;
        }
        SubvolEditCmd::Delete(a) => {
            if a.subvolid.is_some() {
                bail!("--subvolid: give the path on a mounted filesystem");
            }
            for p in &a.paths {
                let (dir, name) = mounted_parent(&a.image, p)?;
                client::delete_subvolume(&dir, &name)
                    .with_context(|| format!("{p}: cannot delete"))?;
                writeln!(out, "Delete subvolume '{p}'")?;
            }
        }
        _ => bail!("this subvolume command takes an image, not a mounted directory"),
    }
    Ok(())
}

/// Creates a subvolume (or, `src` given, a snapshot) `name` in `dir` of a mounted
/// filesystem, joining the `inherit` qgroups. The kernel's mount takes them with
/// the create (QGROUP_INHERIT); a ubtrfs mount cannot carry that list through
/// FUSE, so the new subvolume (`new_path`) is looked up and assigned to each
/// qgroup right after, which leaves the same qgroups and numbers at the next
/// commit.
fn create_mounted(
    mnt: &Path,
    dir: &File,
    src: Option<&File>,
    name: &[u8],
    readonly: bool,
    inherit: &[u64],
    new_path: &Path,
) -> Result<()> {
    use ubtrfs_fuse::subvol_ops::client;
    let kernel = ubtrfs_fuse::mount_source(&mnt.canonicalize()?).is_some_and(|(t, _)| t == "btrfs");
    if !inherit.is_empty() && kernel {
        return Ok(client::create_inheriting(
            dir, src, name, readonly, inherit,
        )?);
    }
    match src {
        Some(s) => client::create_snapshot(dir, s, name, readonly)?,
        None => client::create_subvolume(dir, name)?,
    }
    if inherit.is_empty() {
        return Ok(());
    }
    // The mount tells the kernel to forget its cached names of `dir` before it
    // answers, but gives up waiting after a second (the notification then
    // follows), so a "not there" the kernel kept may still be answered for a
    // moment: try again briefly.
    let mut tries = 0;
    let new = loop {
        match File::open(new_path) {
            Ok(f) => break f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => {
                return Err(e).with_context(|| format!("{}: cannot open", new_path.display()))
            }
        }
    };
    let id = client::subvolume_id(&new).context("the new subvolume's id")?;
    for &q in inherit {
        ubtrfs_fuse::quota_ops::client::qgroup_assign(&new, id, q, true).with_context(|| {
            format!(
                "assigning the new subvolume {id} to qgroup {}",
                ubtrfs_core::format::key::fmt_qgroupid(q)
            )
        })?;
    }
    Ok(())
}

/// `-i` qgroup ids: higher-level qgroups (level >= 1), as the kernel requires.
fn parse_inherit(ids: &[String]) -> Result<Vec<u64>> {
    ids.iter()
        .map(|s| {
            let q = crate::quota::parse_qgroupid(s)?;
            if q >> 48 == 0 {
                bail!("-i {s}: a qgroup of level 1 or higher (LEVEL/ID)");
            }
            Ok(q)
        })
        .collect()
}

fn target_is_mounted(cmd: &SubvolEditCmd) -> bool {
    let p = match cmd {
        SubvolEditCmd::Create { image, .. } | SubvolEditCmd::Snapshot { image, .. } => image,
        SubvolEditCmd::Delete(a) => &a.image,
        _ => return false,
    };
    p.is_dir()
}

pub fn run(cmd: SubvolEditCmd, out: &mut dyn Write) -> Result<()> {
    if target_is_mounted(&cmd) {
        return run_mounted(cmd, out);
    }
    match cmd {
        SubvolEditCmd::Create {
            image,
            paths,
            inherit,
        } => {
            let inherit = parse_inherit(&inherit)?;
            let mut t = open_rw(&image)?;
            for p in &paths {
                let (parent, name) = split(p)?;
                let d = parent_dir(&t, &parent)?;
                let id = t
                    .create_subvolume(d.root, d.ino, &name, 0o755, 0, 0, now())
                    .with_context(|| format!("{p}: cannot create subvolume"))?;
                for &q in &inherit {
                    t.qgroup_relation(id, q, true)
                        .with_context(|| format!("{p}: qgroup inheritance"))?;
                }
                writeln!(out, "Create subvolume '{p}'")?;
            }
            t.commit()?;
        }
        SubvolEditCmd::Snapshot {
            image,
            src,
            dest,
            readonly,
            inherit,
        } => {
            let inherit = parse_inherit(&inherit)?;
            let mut t = open_rw(&image)?;
            let id = subvol_at(&t.fs, &src)?;
            let (dir, name, shown) = match t.fs.resolve(&dest) {
                Ok(d) if t.fs.stat(d)?.mode & 0o170000 == 0o040000 => {
                    let (_, n) = split(&src)?;
                    let shown = format!(
                        "{}/{}",
                        dest.trim_end_matches('/'),
                        String::from_utf8_lossy(&n)
                    );
                    (d, n, shown)
                }
                Ok(_) => bail!("{dest}: File exists"),
                Err(_) => {
                    let (parent, n) = split(&dest)?;
                    (
                        t.fs.resolve(&parent)
                            .with_context(|| format!("{parent}: cannot access"))?,
                        n,
                        dest.clone(),
                    )
                }
            };
            writable(&t, dir, dest.as_bytes())?;
            let new = t
                .create_snapshot(id, dir.root, dir.ino, &name, readonly, now())
                .with_context(|| format!("{shown}: cannot snapshot"))?;
            for &q in &inherit {
                t.qgroup_relation(new, q, true)
                    .with_context(|| format!("{shown}: qgroup inheritance"))?;
            }
            t.commit()?;
            let ro = if readonly { "readonly " } else { "" };
            writeln!(out, "Create {ro}snapshot of '{src}' in '{shown}'")?;
        }
        SubvolEditCmd::Delete(a) => {
            let mut t = open_rw(&a.image)?;
            let mut targets: Vec<(String, Node, Vec<u8>)> = Vec::new();
            if let Some(id) = a.subvolid {
                let s =
                    t.fs.subvolumes()?
                        .into_iter()
                        .find(|s| s.id == id)
                        .with_context(|| format!("subvolume id {id}: not found"))?;
                let path = format!("/{}", s.path);
                let (parent, name) = split(&path)?;
                targets.push((path, t.fs.resolve(&parent)?, name));
            }
            for p in &a.paths {
                subvol_at(&t.fs, p)?;
                let (parent, name) = split(p)?;
                targets.push((p.clone(), parent_dir(&t, &parent)?, name));
            }
            for (p, dir, name) in &targets {
                t.delete_subvolume(dir.root, dir.ino, name, now())
                    .with_context(|| format!("{p}: cannot delete"))?;
                writeln!(out, "Delete subvolume '{p}'")?;
            }
            t.commit()?;
            if !a.no_drop {
                drop_all(&mut t, a.quiet, a.drop)?;
            }
        }
        SubvolEditCmd::Sync { image, .. } if image.is_dir() => {
            let f = File::open(&image).with_context(|| image.display().to_string())?;
            for id in ubtrfs_fuse::subvol_props::client::sync(&f)
                .with_context(|| format!("{}: subvolume sync", image.display()))?
            {
                writeln!(out, "Subvolume id {id} is gone")?;
            }
        }
        SubvolEditCmd::Sync { image, quiet, drop } => {
            let mut t = open_rw(&image)?;
            let done = drop_all(&mut t, quiet, drop)?;
            for id in done {
                writeln!(out, "Subvolume id {id} is gone")?;
            }
        }
        SubvolEditCmd::SetDefault { image, subvol } if image.is_dir() => {
            use ubtrfs_fuse::subvol_props::client;
            let (f, id) = match subvol.parse::<u64>() {
                Ok(id) => (
                    File::open(&image),
                    if id == 0 { FS_TREE_OBJECTID } else { id },
                ),
                Err(_) => (File::open(image.join(subvol.trim_start_matches('/'))), 0),
            };
            let f = f.with_context(|| format!("{subvol}: cannot open"))?;
            client::set_default(&f, id)
                .with_context(|| format!("{subvol}: cannot set the default subvolume"))?;
        }
        SubvolEditCmd::GetDefault { image } if image.is_dir() => {
            let f = File::open(&image).with_context(|| image.display().to_string())?;
            let d = ubtrfs_fuse::subvol_props::client::get_default(&f)
                .with_context(|| format!("{}: default subvolume", image.display()))?;
            if d.value == FS_TREE_OBJECTID {
                writeln!(out, "ID 5 (FS_TREE)")?;
            } else {
                writeln!(
                    out,
                    "ID {} gen {} top level {} path {}",
                    d.value, d.gen, d.top_level, d.path
                )?;
            }
        }
        SubvolEditCmd::SetDefault { image, subvol } => {
            let mut t = open_rw(&image)?;
            let id = match subvol.parse::<u64>() {
                Ok(id) => id,
                Err(_) => subvol_at(&t.fs, &subvol)?,
            };
            t.set_default_subvolume(id)?;
            t.commit()?;
        }
        SubvolEditCmd::GetDefault { image } => {
            let fs = open_ro(&image)?;
            let id = fs.default_subvolume()?;
            if id == FS_TREE_OBJECTID {
                writeln!(out, "ID 5 (FS_TREE)")?;
            } else {
                let s = fs
                    .subvolumes()?
                    .into_iter()
                    .find(|s| s.id == id)
                    .with_context(|| format!("default subvolume {id} is not linked anywhere"))?;
                writeln!(
                    out,
                    "ID {} gen {} top level {} path {}",
                    s.id, s.gen, s.top_level, s.path
                )?;
            }
        }
        SubvolEditCmd::Show { image, path } => {
            if image.is_dir() {
                let f = File::open(image.join(path.trim_start_matches('/')))
                    .with_context(|| format!("{path}: cannot access"))?;
                let s = ubtrfs_fuse::subvol_props::client::show(&f).map_err(|e| {
                    if e.raw_os_error() == Some(22) {
                        anyhow::anyhow!("{path}: Not a Btrfs subvolume")
                    } else {
                        anyhow::Error::new(e)
                            .context(format!("{path}: subvolume show through the mount"))
                    }
                })?;
                return print_show(&s, out);
            }
            show(&open_ro(&image)?, &path, out)?;
        }
    }
    Ok(())
}

fn show(fs: &Filesystem, path: &str, out: &mut dyn Write) -> Result<()> {
    let id = subvol_at(fs, path)?;
    print_show(&ubtrfs_core::tools::subvol_show::subvol_show(fs, id)?, out)
}

/// `subvolume show`'s text, as btrfs-progs prints it.
fn print_show(s: &ubtrfs_core::tools::subvol_show::SubvolShow, out: &mut dyn Write) -> Result<()> {
    let item = &s.item;
    let uuid = |u: &[u8; 16]| {
        if u.iter().all(|&b| b == 0) {
            "-".to_string()
        } else {
            ubtrfs_core::format::bytes::uuid_string(u)
        }
    };
    let time = |sec: i64| {
        if sec == 0 {
            "-".to_string()
        } else {
            format!("{} +0000", crate::fmt::datetime(sec))
        }
    };
    let name = match &s.path {
        Some(p) => p.rsplit('/').next().unwrap_or("").to_string(),
        None => "<FS_TREE>".to_string(),
    };
    writeln!(out, "{}", s.path.as_deref().unwrap_or("/"))?;
    writeln!(out, "\tName: \t\t\t{name}")?;
    writeln!(out, "\tUUID: \t\t\t{}", uuid(&item.uuid))?;
    writeln!(out, "\tParent UUID: \t\t{}", uuid(&item.parent_uuid))?;
    writeln!(out, "\tReceived UUID: \t\t{}", uuid(&item.received_uuid))?;
    writeln!(out, "\tCreation time: \t\t{}", time(item.otime.sec))?;
    writeln!(out, "\tSubvolume ID: \t\t{}", s.id)?;
    writeln!(out, "\tGeneration: \t\t{}", item.generation)?;
    writeln!(out, "\tGen at creation: \t{}", item.otransid)?;
    writeln!(out, "\tParent ID: \t\t{}", s.top_level)?;
    writeln!(out, "\tTop level ID: \t\t{}", s.top_level)?;
    let ro = item.flags & ROOT_SUBVOL_RDONLY != 0;
    writeln!(out, "\tFlags: \t\t\t{}", if ro { "readonly" } else { "-" })?;
    writeln!(out, "\tSend transid: \t\t{}", item.stransid)?;
    // btrfs-progs 6.14 prints the creation time (otime) on this line, not stime:
    // the same here, so the outputs compare.
    writeln!(out, "\tSend time: \t\t{}", time(item.otime.sec))?;
    writeln!(out, "\tReceive transid: \t{}", item.rtransid)?;
    writeln!(out, "\tReceive time: \t\t{}", time(item.rtime.sec))?;
    writeln!(out, "\tSnapshot(s):")?;
    for p in &s.snapshots {
        writeln!(out, "\t\t\t\t{p}")?;
    }
    if s.quota_enabled {
        writeln!(out, "\tQuota group:\t\t0/{}", s.id)?;
    } else {
        writeln!(out, "\tQuota group:\t\tn/a")?;
    }
    Ok(())
}

pub fn property(cmd: PropertyCmd, out: &mut dyn Write) -> Result<()> {
    use ubtrfs_fuse::subvol_props::client;
    let mounted = |image: &Path, path: &str| -> Result<File> {
        File::open(image.join(path.trim_start_matches('/')))
            .with_context(|| format!("{path}: cannot open"))
    };
    match cmd {
        PropertyCmd::Get { image, path, name } => {
            if let Some(n) = name.as_deref() {
                if n != "ro" {
                    bail!("{n}: unknown property for a subvolume (only ro)");
                }
            }
            if image.is_dir() {
                let a = client::get_readonly(&mounted(&image, &path)?)
                    .with_context(|| format!("{path}: not a subvolume, or cannot be read"))?;
                writeln!(out, "ro={}", a.value != 0)?;
                return Ok(());
            }
            let fs = open_ro(&image)?;
            let id = subvol_at(&fs, &path)?;
            let ro = fs.subvol_root_item(id)?.flags & ROOT_SUBVOL_RDONLY != 0;
            writeln!(out, "ro={ro}")?;
        }
        PropertyCmd::Set {
            image,
            path,
            name,
            value,
            force,
        } => {
            if name != "ro" {
                bail!("{name}: unknown property for a subvolume (only ro)");
            }
            let ro = match value.as_str() {
                "true" => true,
                "false" => false,
                v => bail!("{v}: invalid value for ro (true or false)"),
            };
            if image.is_dir() {
                let f = mounted(&image, &path)?;
                let now_ro = client::get_readonly(&f)
                    .with_context(|| format!("{path}: not a subvolume, or cannot be read"))?;
                // btrfs-progs' rule, before the change (the mount applies the kernel's).
                if !ro && now_ro.value != 0 && now_ro.received && !force {
                    bail!(
                        "{path}: cannot flip ro->rw with received_uuid set, use -f to clear it \
                         (received_uuid is what incremental send relies on; a snapshot keeps it)"
                    );
                }
                client::set_readonly(&f, ro, force)
                    .with_context(|| format!("{path}: cannot set ro={ro}"))?;
                return Ok(());
            }
            let mut t = open_rw(&image)?;
            let id = subvol_at(&t.fs, &path)?;
            t.set_subvolume_readonly(id, ro, force, now())?;
            t.commit()?;
        }
    }
    Ok(())
}
