//! `ubtrfs`: read and write btrfs filesystems without a kernel mount.
//! A thin layer over ubtrfs-core: argument parsing, output formatting, exit codes.

mod balance;
mod check;
mod edit;
mod extract;
mod fmt;
mod json;
mod mount;
mod quota;
mod share;
mod share_edit;
mod space;
mod subvol_edit;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use ubtrfs_core::mode::{S_IFBLK, S_IFCHR, S_IFLNK, S_IFMT};
use ubtrfs_core::DirEntry;
use ubtrfs_core::Stat;
use ubtrfs_core::{Filesystem, Node, OpenOptions};

#[derive(Parser)]
#[command(
    name = "ubtrfs",
    version,
    about = "btrfs in userspace: read images and devices without a kernel mount"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
pub struct Image {
    /// Image file or block device (several devices: a,b or repeat --device).
    image: String,
    /// More devices of a multi-device filesystem.
    #[arg(long = "device", short = 'D', value_name = "DEV")]
    devices: Vec<PathBuf>,
    /// Do not verify data checksums.
    #[arg(long)]
    no_csum: bool,
}

impl Image {
    /// The image (or comma-separated devices) as a mount names it.
    pub(crate) fn of(image: &str, verify_csum: bool) -> Image {
        Image {
            image: image.to_string(),
            devices: Vec::new(),
            no_csum: !verify_csum,
        }
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a filesystem (optionally filled from a directory).
    Mkfs(edit::MkfsArgs),
    /// Check a filesystem read-only, like `btrfs check --readonly`: exit 0 when clean,
    /// 1 with one `ERROR:` line per problem (rule, tree, block, key).
    Check(check::CheckArgs),
    /// Copy files or directories into an image: put IMAGE SRC... DEST.
    Put {
        image: PathBuf,
        #[arg(required = true, num_args = 2..)]
        args: Vec<String>,
    },
    /// Create directories in an image.
    Mkdir {
        image: PathBuf,
        #[arg(required = true)]
        paths: Vec<String>,
        #[arg(short = 'p')]
        parents: bool,
        #[arg(short = 'm', default_value = "755", value_parser = parse_octal)]
        mode: u32,
    },
    /// Remove files (and with -r directories) from an image.
    Rm {
        image: PathBuf,
        #[arg(required = true)]
        paths: Vec<String>,
        #[arg(short = 'r')]
        recursive: bool,
    },
    /// Rename or move within an image.
    Mv {
        image: PathBuf,
        from: String,
        to: String,
        /// Fail if the target exists (RENAME_NOREPLACE).
        #[arg(short = 'n', long)]
        no_clobber: bool,
    },
    /// Make a hard link (or with -s a symbolic link) in an image.
    Ln {
        image: PathBuf,
        target: String,
        link: String,
        #[arg(short = 's')]
        symbolic: bool,
    },
    /// Set (or with -x remove) an extended attribute in an image.
    Setfattr {
        image: PathBuf,
        path: String,
        #[arg(short = 'n')]
        name: String,
        #[arg(short = 'v')]
        value: Option<String>,
        #[arg(short = 'x')]
        remove: bool,
    },
    /// Set a file's size in an image.
    Truncate {
        image: PathBuf,
        path: String,
        #[arg(short = 's')]
        size: String,
    },
    /// Copy inside an image, sharing data (reflink) like `cp --reflink` on btrfs.
    Cp(share_edit::CpArgs),
    /// Find identical file data and make it share extents (like duperemove -d).
    Dedupe {
        #[command(flatten)]
        args: share_edit::DedupeArgs,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// List a directory (paths are absolute from the top-level subvolume).
    Ls {
        #[command(flatten)]
        img: Image,
        #[arg(default_value = "/")]
        path: String,
        /// Long listing (mode, links, uid, gid, size, mtime).
        #[arg(short = 'l')]
        long: bool,
        /// Recurse into subdirectories (and subvolumes).
        #[arg(short = 'R')]
        recursive: bool,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Read the root tree from this block (an older generation).
        #[arg(long, short = 't', value_name = "BYTENR")]
        tree_root: Option<u64>,
        /// Read the root tree of this generation (see `extract --generation`).
        #[arg(long, value_name = "GEN", conflicts_with = "tree_root")]
        generation: Option<u64>,
    },
    /// Write a file's contents to stdout.
    Cat {
        #[command(flatten)]
        img: Image,
        path: String,
        /// Stop at the first damaged block or checksum failure (default: lost ranges
        /// read as zeros, damaged data as found, each loss reported, exit 3).
        #[arg(long)]
        strict: bool,
    },
    /// Show every stat(2) field the kernel reports for a path.
    Stat {
        #[command(flatten)]
        img: Image,
        path: String,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Copy files out of the image (like `btrfs restore`), keeping metadata.
    Extract {
        #[command(flatten)]
        img: Image,
        dest: PathBuf,
        /// Extract only this path (its contents go into DEST).
        #[arg(long, default_value = "/")]
        path: String,
        /// Stop at the first damaged block or error (default: restore everything
        /// reachable, report each loss, exit 3 when anything was lost).
        #[arg(long)]
        strict: bool,
        /// List what would be restored (and find what is lost); write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Kept for btrfs restore's users: going on past errors is the default.
        #[arg(long, short = 'i')]
        ignore_errors: bool,
        /// Read the root tree from this block (an older generation, as
        /// `btrfs restore -t`; `btrfs-find-root` lists candidates).
        #[arg(long, short = 't', value_name = "BYTENR")]
        tree_root: Option<u64>,
        /// Read the root tree of this generation (from a backup root, else found by
        /// scanning the metadata as `btrfs-find-root` does).
        #[arg(long, value_name = "GEN", conflicts_with = "tree_root")]
        generation: Option<u64>,
    },
    /// Filesystem-wide commands.
    Filesystem {
        #[command(subcommand)]
        cmd: FsCmd,
    },
    /// Subvolume commands.
    Subvolume {
        #[command(subcommand)]
        cmd: SubvolCmd,
    },
    /// Mount with FUSE, read-write unless `-o ro`, like the kernel's btrfs mount.
    Mount(mount::MountArgs),
    /// Relocate chunks (move extents elsewhere, convert profiles), like
    /// `btrfs balance`.
    Balance {
        #[command(subcommand)]
        cmd: balance::BalanceCmd,
    },
    /// Quotas on or off, rescan, status, like `btrfs quota`.
    Quota {
        #[command(subcommand)]
        cmd: quota::QuotaCmd,
    },
    /// Quota groups: show, create, destroy, assign, remove, limit, like `btrfs qgroup`.
    Qgroup {
        #[command(subcommand)]
        cmd: quota::QgroupCmd,
    },
    /// Subvolume properties (`ro`), like `btrfs property`.
    Property {
        #[command(subcommand)]
        cmd: subvol_edit::PropertyCmd,
    },
    /// Change a filesystem's features, like btrfstune.
    Tune {
        /// Image file or block device (a multi-device filesystem: `a.img,b.img`).
        image: String,
        /// Create the free-space tree of a filesystem that keeps the v1 space cache
        /// (removed), as `btrfstune --convert-to-free-space-tree` and the kernel's
        /// mount with `-o space_cache=v2` do; ubtrfs writes only such filesystems.
        #[arg(long, required = true)]
        convert_to_free_space_tree: bool,
    },
    /// Recovery commands.
    Rescue {
        #[command(subcommand)]
        cmd: RescueCmd,
    },
    /// Verify every copy of every block and checksummed sector, and RAID5/6 parity,
    /// repairing what a good copy or parity can, like `btrfs scrub` (offline).
    Scrub {
        #[command(subcommand)]
        cmd: ScrubCmd,
    },
    /// Low-level inspection.
    Inspect {
        #[command(subcommand)]
        cmd: InspectCmd,
    },
}

#[derive(Subcommand)]
enum FsCmd {
    /// Disk usage with exclusive and shared bytes, like `btrfs filesystem du`.
    Du(share::DuArgs),
    /// Discard the free space of an image (unmounted): holes punched in an image
    /// file, BLKDISCARD on a device, as fstrim(8) does on a mount (FITRIM, which
    /// `ubtrfs mount` also answers): the free extents of every block group (each
    /// copy) and the space no chunk holds.
    Trim {
        image: PathBuf,
        /// Logical offset where the block groups to trim begin (fstrim -o).
        #[arg(short = 'o', long, default_value = "0")]
        offset: String,
        /// Bytes of block groups to trim from the offset (fstrim -l; default all).
        #[arg(short = 'l', long)]
        length: Option<String>,
        /// Free extents shorter than this are left (fstrim -m).
        #[arg(short = 'm', long, default_value = "0")]
        minimum: String,
        /// Print how much was trimmed, as `fstrim -v`.
        #[arg(short = 'v', long)]
        verbose: bool,
    },
    /// Space per block-group type and profile, and the kernel's global reserve, like
    /// `btrfs filesystem df` on a mount of the filesystem (same text; `--format json`
    /// as `btrfs --format json filesystem df`).
    Df(SpaceArgs),
    /// Space of the devices, per block-group type and profile and per device, like
    /// `btrfs filesystem usage` on a fresh read-write mount of the filesystem (same
    /// text, the image's path where the kernel names its device).
    Usage(SpaceArgs),
    /// The filesystem's label, uuid, size and devices, like `btrfs filesystem show`
    /// of an unmounted device.
    Show {
        #[command(flatten)]
        img: Image,
        /// Sizes in bytes (`--raw`).
        #[arg(long)]
        raw: bool,
    },
    /// Show or set the filesystem's label, like `btrfs filesystem label`: of an
    /// image, or of a mounted ubtrfs (or kernel btrfs) filesystem given by a
    /// directory in it (FS_IOC_GETFSLABEL / FS_IOC_SETFSLABEL).
    Label {
        /// Image file, device, or a directory of a mounted filesystem.
        target: PathBuf,
        /// The new label (at most 255 bytes); without it the label is printed.
        new_label: Option<String>,
    },
    /// Grow or shrink a device of the filesystem, like `btrfs filesystem resize`:
    /// [DEVID:][+|-]SIZE[KMGTPE] or [DEVID:]max. An image file grows or is cut to
    /// the size; chunks beyond a smaller size are relocated first (as the kernel does).
    Resize {
        image: PathBuf,
        #[arg(allow_hyphen_values = true)]
        size: String,
    },
}

/// The image and units of `filesystem df` and `filesystem usage`.
#[derive(Args)]
struct SpaceArgs {
    #[command(flatten)]
    img: Image,
    /// Sizes in bytes (`-b`, `--raw`).
    #[arg(short = 'b', long)]
    raw: bool,
    /// `usage` only: the per-device part as a table (btrfs-progs' `-T`).
    #[arg(short = 'T')]
    tabular: bool,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

#[derive(Subcommand)]
enum SubvolCmd {
    #[command(flatten)]
    Edit(subvol_edit::SubvolEditCmd),
    /// Referenced and exclusive bytes per subvolume (the numbers of a qgroup rescan,
    /// no quota tree needed), and what deleting the given subvolumes together frees.
    Du(share::SubvolDuArgs),
    /// List subvolumes and snapshots like `btrfs subvolume list`.
    List {
        #[command(flatten)]
        img: Image,
        /// Print paths with <FS_TREE>/ like `btrfs subvolume list -a`.
        #[arg(short = 'a')]
        all: bool,
        /// Also print parent uuid (-q) and uuid (-u) columns.
        #[arg(short = 'q')]
        parent_uuid: bool,
        #[arg(short = 'u')]
        uuid: bool,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum RescueCmd {
    /// List the blocks that may be root tree roots of older generations, newest
    /// first, like `btrfs-find-root` (for `extract -t BYTENR` or `--generation`).
    FindRoot {
        #[command(flatten)]
        img: Image,
        /// Print every generation, the superblock's too (btrfs-find-root -a).
        #[arg(short = 'a')]
        all: bool,
        /// Tree to look for (default 1, the root tree).
        #[arg(short = 'o', long, default_value_t = 1)]
        objectid: u64,
    },
    /// Clear the tree log (superblock log_root and log_root_level), like `btrfs rescue
    /// zero-log`: what was fsynced after the last commit is lost.
    ZeroLog {
        /// Image file or block device (a multi-device filesystem: `a.img,b.img`).
        image: String,
    },
}

#[derive(Subcommand)]
enum ScrubCmd {
    /// Scrub an unmounted filesystem and print btrfs-progs' `scrub start -B` summary;
    /// exit 1 when errors are left uncorrected (with `-r`: when any is found).
    Start {
        /// Image file or block device (a multi-device filesystem: `a.img,b.img`).
        image: String,
        /// Stay in the foreground (always: accepted as btrfs-progs' `-B`).
        #[arg(short = 'B')]
        foreground: bool,
        /// Read-only: report errors, repair nothing.
        #[arg(short = 'r')]
        readonly: bool,
    },
}

#[derive(Subcommand)]
enum InspectCmd {
    /// Extents with SHARED/ENCODED/INLINE flags like the kernel's FIEMAP (`-v`: filefrag -v).
    Fiemap(share::FiemapArgs),
    /// Print the superblock like `btrfs inspect-internal dump-super`.
    DumpSuper {
        #[command(flatten)]
        img: Image,
        /// Print backup roots and the system chunk array too.
        #[arg(short = 'f', long)]
        full: bool,
        /// Which copy (0, 1, 2).
        #[arg(short = 's', long, default_value_t = 0)]
        super_mirror: usize,
    },
    /// Print trees like `btrfs inspect-internal dump-tree`.
    DumpTree {
        #[command(flatten)]
        img: Image,
        /// Tree id or name (root, extent, chunk, dev, fs, csum, quota, uuid, free-space, ...).
        #[arg(short = 't', long)]
        tree: Option<String>,
        /// Print only the block at this logical address.
        #[arg(short = 'b', long)]
        block: Option<u64>,
    },
    /// The id of the subvolume a path is in, like `btrfs inspect-internal rootid`:
    /// `rootid PATH` on a mounted filesystem (ubtrfs or the kernel's), or `rootid
    /// IMAGE PATH` in an image.
    Rootid {
        /// A path on a mount, or an image file.
        target: std::path::PathBuf,
        /// With an image: the path inside it.
        path: Option<String>,
    },
}

fn open(img: &Image) -> Result<Filesystem> {
    open_with(img, false, None)
}

/// Opens an image; with `salvage`, damaged tree blocks read as empty and are logged
/// (see `extract`); `tree_root` reads an older root tree.
fn open_with(img: &Image, salvage: bool, tree_root: Option<u64>) -> Result<Filesystem> {
    let mut paths: Vec<PathBuf> = img.image.split(',').map(PathBuf::from).collect();
    paths.extend(img.devices.iter().cloned());
    let opts = OpenOptions {
        verify_data_csum: !img.no_csum,
        salvage,
        tree_root,
        ..Default::default()
    };
    // A tree log (fsyncs before a crash) is replayed in memory: the image is not
    // written by reading commands.
    let fs = Filesystem::open_replayed(&paths, opts)?;
    flush_warnings(&fs);
    Ok(fs)
}

/// [`open_with`] salvaging, at root tree `tree_root`, its warnings kept back.
fn open_quiet(img: &Image, tree_root: Option<u64>) -> Result<Filesystem> {
    let mut paths: Vec<PathBuf> = img.image.split(',').map(PathBuf::from).collect();
    paths.extend(img.devices.iter().cloned());
    let opts = OpenOptions {
        verify_data_csum: !img.no_csum,
        salvage: true,
        tree_root,
        ..Default::default()
    };
    Ok(Filesystem::open_replayed(&paths, opts)?)
}

/// Something was lost: the run went on and restored the rest (exit status 3).
#[derive(Debug)]
struct Incomplete;

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("parts of the filesystem are lost (see above)")
    }
}

impl std::error::Error for Incomplete {}

/// After a salvaging read: one line per lost tree block and damaged data range;
/// whether there were any.
/// The root tree root of generation `generation`: a backup root of the superblock,
/// else the block a scan of the metadata finds (as `btrfs-find-root`).
pub(crate) fn root_of_generation(img: &Image, generation: u64) -> Result<u64> {
    let fs = open_with(img, true, None)?;
    let sb = on_disk_super(img)?;
    if generation == sb.generation {
        return Ok(sb.root);
    }
    if let Some(b) = sb
        .backup_roots
        .iter()
        .find(|b| b.tree_root_gen == generation && b.tree_root != 0)
    {
        return Ok(b.tree_root);
    }
    let found = ubtrfs_core::tools::find_root::find_roots(
        &fs.info,
        ubtrfs_core::format::consts::ROOT_TREE_OBJECTID,
        sb.generation,
        None,
    )?;
    match found.iter().find(|c| c.generation == generation) {
        Some(c) => Ok(c.bytenr),
        None => bail!(
            "no root tree root of generation {generation} found (backup roots: {}; \
             `ubtrfs rescue find-root` lists what the metadata holds)",
            sb.backup_roots
                .iter()
                .map(|b| b.tree_root_gen.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The newest valid superblock of the image's first device, as written (a salvage
/// open may have moved its root to a backup).
fn on_disk_super(img: &Image) -> Result<ubtrfs_core::format::superblock::SuperBlock> {
    let first = img.image.split(',').next().unwrap_or(&img.image);
    let dev = ubtrfs_core::FileDevice::open(Path::new(first), false)
        .with_context(|| format!("opening {first}"))?;
    Ok(ubtrfs_core::read_best_super(&dev)?.0)
}

/// `rescue find-root`: btrfs-find-root's lines.
fn cmd_find_root(img: &Image, all: bool, objectid: u64, out: &mut dyn Write) -> Result<()> {
    let fs = open_with(img, true, None)?;
    let sb = on_disk_super(img)?;
    // Without -a the scan ends at the superblock's own root, as btrfs-find-root's.
    let stop = (!all).then_some((sb.generation, sb.root_level));
    let found = ubtrfs_core::tools::find_root::find_roots(&fs.info, objectid, sb.generation, stop)?;
    writeln!(out, "Superblock thinks the generation is {}", sb.generation)?;
    writeln!(out, "Superblock thinks the level is {}", sb.root_level)?;
    for c in found {
        if c.generation == sb.generation && c.level == sb.root_level {
            if all {
                writeln!(
                    out,
                    "Well block {}(gen: {} level: {}) seems good, and it matches superblock",
                    c.bytenr, c.generation, c.level
                )?;
            } else {
                writeln!(
                    out,
                    "Found tree root at {} gen {} level {}",
                    c.bytenr, c.generation, c.level
                )?;
            }
        } else {
            writeln!(
                out,
                "Well block {}(gen: {} level: {}) seems good, but generation/level doesn't \
                 match, want gen: {} level: {}",
                c.bytenr, c.generation, c.level, sb.generation, sb.root_level
            )?;
        }
    }
    Ok(())
}

fn print_losses(fs: &Filesystem) -> bool {
    let (lost, blocks) = fs.info.lost_blocks();
    let (bad, data) = fs.info.damaged_data();
    for b in &lost {
        let from = b
            .first_key
            .map_or(String::new(), |k| format!(", keys from {k}"));
        eprintln!("ubtrfs: lost: tree block {}{from}: {}", b.bytenr, b.error);
    }
    for d in &bad {
        eprintln!("ubtrfs: damaged: {d}");
    }
    blocks + data > 0
}

fn flush_warnings(fs: &Filesystem) {
    for w in fs.info.take_warnings() {
        eprintln!("ubtrfs: warning: {w}");
    }
}

fn parse_octal(s: &str) -> std::result::Result<u32, String> {
    u32::from_str_radix(s, 8).map_err(|e| format!("bad octal mode {s:?}: {e}"))
}

/// Called as `mount.fuse.ubtrfs` (or `mount.ubtrfs`) by mount(8), for
/// `mount -t fuse.ubtrfs IMAGE DIR -o OPTS` and /etc/fstab lines: mount(8) passes
/// `SOURCE DIR [-sfnv] [-o OPTS]`; this becomes `ubtrfs mount SOURCE DIR -o OPTS`,
/// without the options that are mount(8)'s own (noauto, user, nofail, _netdev, x-*);
/// the VFS flags (noexec, sync, ...) are passed on: FUSE mounts with them.
/// mount(8) passes nosuid and nodev (also those `user` implies) but not its defaults
/// suid and dev; called by `root`, the mount honours them as a kernel filesystem
/// mounted by mount(8) does (a FUSE mount is otherwise nosuid,nodev).
fn mount_helper_args(args: &[std::ffi::OsString], root: bool) -> Option<Vec<std::ffi::OsString>> {
    let prog = std::path::Path::new(args.first()?).file_name()?.to_str()?;
    if prog != "mount.fuse.ubtrfs" && prog != "mount.ubtrfs" {
        return None;
    }
    let mut out: Vec<std::ffi::OsString> = vec!["ubtrfs".into(), "mount".into()];
    let mut opts: Vec<String> = Vec::new();
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => {
                if let Some(o) = it.next() {
                    opts.extend(o.to_string_lossy().split(',').map(str::to_string));
                }
            }
            Some(f) if f.starts_with('-') => {} // -s -f -n -v: mount(8)'s own
            _ => out.push(a.clone()),
        }
    }
    let own = |o: &str| {
        matches!(
            o,
            "" | "defaults"
                | "auto"
                | "noauto"
                | "user"
                | "users"
                | "nouser"
                | "owner"
                | "group"
                | "nofail"
                | "_netdev"
        ) || o.starts_with("x-")
            || o.starts_with("comment=")
    };
    let mut kept: Vec<String> = opts.into_iter().filter(|o| !own(o)).collect();
    for (yes, no) in [("suid", "nosuid"), ("dev", "nodev")] {
        if root && !kept.iter().any(|o| o == no || o == yes) {
            kept.push(yes.to_string());
        }
    }
    if !kept.is_empty() {
        out.push("-o".into());
        out.push(kept.join(",").into());
    }
    Some(out)
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match mount_helper_args(&args, nix::unistd::geteuid().is_root()) {
        Some(a) => Cli::parse_from(a),
        None => Cli::parse_from(balance::rewrite_args(args)),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (ubtrfs cat | head) is not an error worth a message.
            if let Some(ioe) = e.downcast_ref::<io::Error>() {
                if ioe.kind() == io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            if e.downcast_ref::<check::Unclean>().is_some() {
                return ExitCode::FAILURE;
            }
            let msg = format!("{e:#}");
            eprintln!("ubtrfs: error: {}", msg.replace('\n', " "));
            if e.downcast_ref::<Incomplete>().is_some() {
                return ExitCode::from(3);
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    match cli.cmd {
        Cmd::Check(a) => check::run(a, &mut out)?,
        Cmd::Mkfs(a) => edit::mkfs(a)?,
        Cmd::Put { image, args } => {
            let (dest, srcs) = args.split_last().context("put needs SRC... DEST")?;
            let srcs: Vec<PathBuf> = srcs.iter().map(PathBuf::from).collect();
            edit::put(&image, &srcs, dest)?
        }
        Cmd::Mkdir {
            image,
            paths,
            parents,
            mode,
        } => edit::mkdir(&image, &paths, parents, mode)?,
        Cmd::Rm {
            image,
            paths,
            recursive,
        } => edit::rm(&image, &paths, recursive)?,
        Cmd::Mv {
            image,
            from,
            to,
            no_clobber,
        } => edit::mv(&image, &from, &to, no_clobber)?,
        Cmd::Ln {
            image,
            target,
            link,
            symbolic,
        } => edit::ln(&image, &target, &link, symbolic)?,
        Cmd::Setfattr {
            image,
            path,
            name,
            value,
            remove,
        } => edit::setfattr(&image, &path, &name, value.as_deref(), remove)?,
        Cmd::Cp(a) => share_edit::cp(a)?,
        Cmd::Dedupe { args, format } => {
            let dry_run = args.dry_run;
            let r = share_edit::dedupe_cmd(args)?;
            if format == Format::Json {
                json::write(&mut out, &json::dedupe(&r, dry_run))?;
            } else {
                share_edit::print_dedupe(&mut out, &r, dry_run)?;
            }
        }
        Cmd::Truncate { image, path, size } => {
            edit::truncate(&image, &path, edit::parse_size(&size)?)?
        }
        Cmd::Ls {
            img,
            path,
            long,
            recursive,
            format,
            tree_root,
            generation,
        } => {
            let tree_root = match generation {
                Some(g) => Some(root_of_generation(&img, g)?),
                None => tree_root,
            };
            // Salvaging: a damaged block does not stop the listing (exit 3).
            let fs = open_with(&img, true, tree_root)?;
            let r = cmd_ls(&fs, &path, long, recursive, format, &mut out);
            out.flush()?;
            flush_warnings(&fs);
            let lost = print_losses(&fs);
            r?;
            if lost {
                return Err(anyhow::Error::new(Incomplete));
            }
        }
        Cmd::Cat { img, path, strict } => {
            // Salvaging unless --strict: ranges whose extent items are in a lost
            // block read as zeros, data failing its checksums in every copy is
            // written as found; each loss is reported and the exit status is 3.
            let fs = open_with(&img, !strict, None)?;
            let r = cmd_cat(&fs, &path, &mut out);
            out.flush()?;
            flush_warnings(&fs);
            let lost = print_losses(&fs);
            r?;
            if lost {
                return Err(anyhow::Error::new(Incomplete));
            }
        }
        Cmd::Stat { img, path, format } => {
            let fs = open(&img)?;
            cmd_stat(&fs, &path, format, &mut out)?;
        }
        Cmd::Extract {
            img,
            dest,
            path,
            strict,
            dry_run,
            ignore_errors: _,
            tree_root,
            generation,
        } => {
            let tree_root = match generation {
                Some(g) => Some(root_of_generation(&img, g)?),
                None => tree_root,
            };
            let fs = open_with(&img, !strict, tree_root)?;
            let older_img = img.clone();
            let opts = extract::ExtractOptions {
                strict,
                dry_run,
                // Reading an older commit on purpose: no older still.
                open_older: tree_root.is_none().then(|| {
                    Box::new(move |b: u64| open_quiet(&older_img, Some(b))) as extract::OpenOlder
                }),
            };
            let r = extract::extract(&fs, &path, &dest, &opts);
            flush_warnings(&fs);
            let s = r?;
            if s.lost_anything() || s.recovered > 0 {
                eprintln!(
                    "ubtrfs: salvage: {} entries restored ({} through back references, {} in \
                     lost+found, {} from older generations), {} not restored; {} tree blocks \
                     lost, {} data ranges damaged (written as found)",
                    s.entries,
                    s.recovered,
                    s.in_lost_found,
                    s.from_older,
                    s.lost_entries,
                    s.lost_blocks,
                    s.damaged_data
                );
            }
            if s.lost_blocks > 0 && tree_root.is_none() {
                // Older commits may still hold what was lost.
                let gens: Vec<String> = fs
                    .info
                    .sb
                    .backup_roots
                    .iter()
                    .filter(|b| b.tree_root != 0 && b.tree_root_gen < fs.info.sb.generation)
                    .map(|b| b.tree_root_gen.to_string())
                    .collect();
                eprintln!(
                    "ubtrfs: hint: older generations may hold what was lost (backup roots: {}; \
                     `ubtrfs rescue find-root` lists more): `ubtrfs extract --generation GEN` \
                     into another directory",
                    if gens.is_empty() {
                        "none".to_string()
                    } else {
                        gens.join(", ")
                    }
                );
            }
            if s.failures > 0 {
                eprintln!(
                    "ubtrfs: warning: {} of {} entries lack some metadata (see warnings above)",
                    s.failures, s.entries
                );
            }
            if s.lost_anything() {
                return Err(anyhow::Error::new(Incomplete));
            }
            if s.failures > 0 {
                bail!("{} entries could not be fully restored", s.failures);
            }
        }
        Cmd::Subvolume {
            cmd: SubvolCmd::Du(a),
        } => {
            let fs = open(&a.img)?;
            let r = share::cmd_subvol_du(&fs, &a, &mut out);
            flush_warnings(&fs);
            r?;
        }
        Cmd::Subvolume {
            cmd:
                SubvolCmd::List {
                    img,
                    all,
                    parent_uuid,
                    uuid,
                    format,
                },
        } => {
            let fs = open(&img)?;
            cmd_subvol_list(&fs, all, parent_uuid, uuid, format, &mut out)?;
        }
        Cmd::Subvolume {
            cmd: SubvolCmd::Edit(c),
        } => subvol_edit::run(c, &mut out)?,
        Cmd::Property { cmd } => subvol_edit::property(cmd, &mut out)?,
        Cmd::Balance { cmd } => balance::run(cmd, &mut out)?,
        Cmd::Quota { cmd } => quota::run_quota(cmd, &mut out)?,
        Cmd::Qgroup { cmd } => quota::run_qgroup(cmd, &mut out)?,
        Cmd::Mount(args) => mount::run(args)?,
        Cmd::Rescue {
            cmd: RescueCmd::FindRoot { img, all, objectid },
        } => cmd_find_root(&img, all, objectid, &mut out)?,
        Cmd::Tune {
            image,
            convert_to_free_space_tree: _,
        } => {
            let paths: Vec<PathBuf> = image.split(',').map(PathBuf::from).collect();
            let sb = on_disk_super(&Image::of(&image, true))?;
            let fst = ubtrfs_core::format::consts::FEATURE_COMPAT_RO_FREE_SPACE_TREE;
            if sb.compat_ro_flags & fst != 0 {
                bail!("filesystem already has free-space-tree feature");
            }
            let opts = OpenOptions {
                free_space_tree: ubtrfs_core::FreeSpaceTreeAction::Create,
                ..Default::default()
            };
            drop(ubtrfs_core::Trans::open_paths_with(&paths, opts)?);
            // The line btrfstune prints.
            println!("Converted to free space tree feature");
        }
        Cmd::Scrub {
            cmd:
                ScrubCmd::Start {
                    image,
                    foreground: _,
                    readonly,
                },
        } => {
            let paths: Vec<PathBuf> = image.split(',').map(PathBuf::from).collect();
            let t0 = std::time::Instant::now();
            // Read-only opens without writing anything (a writing open would replay a
            // tree log and commit); a repairing scrub takes the write lock.
            let r = if readonly {
                for p in &paths {
                    ubtrfs_core::refuse_if_mounted(p)?;
                }
                let fs = ubtrfs_core::Filesystem::open_paths(&paths, Default::default())?;
                ubtrfs_core::tools::scrub::scrub(&fs.info, true)?
            } else {
                let t = ubtrfs_core::Trans::open_paths(&paths)?;
                ubtrfs_core::tools::scrub::scrub(&t.fs.info, false)?
            };
            let secs = t0.elapsed().as_secs();
            let total = r.tree_bytes + r.data_bytes;
            // The lines of btrfs-progs' `scrub start -B` summary.
            writeln!(out, "Status:           finished")?;
            writeln!(
                out,
                "Duration:         {}:{:02}:{:02}",
                secs / 3600,
                secs / 60 % 60,
                secs % 60
            )?;
            writeln!(out, "Total to scrub:   {}", fmt::progs_size(total, false))?;
            let mut errs = Vec::new();
            for (n, what) in [
                (r.read_errors, "read"),
                (r.verify_errors, "verify"),
                (r.csum_errors, "csum"),
                (r.parity_errors, "parity"),
            ] {
                if n > 0 {
                    errs.push(format!("{what}={n}"));
                }
            }
            if errs.is_empty() {
                writeln!(out, "Error summary:    no errors found")?;
            } else {
                writeln!(out, "Error summary:    {}", errs.join(" "))?;
                writeln!(out, "  Corrected:      {}", r.corrected)?;
                writeln!(out, "  Uncorrectable:  {}", r.uncorrectable)?;
                writeln!(out, "  Unverified:     0")?;
            }
            if r.uncorrectable > 0 {
                anyhow::bail!("{image}: {} uncorrectable errors", r.uncorrectable);
            }
            if readonly && r.errors() {
                anyhow::bail!("{image}: errors found (read-only scrub: nothing repaired)");
            }
        }
        Cmd::Rescue {
            cmd: RescueCmd::ZeroLog { image },
        } => {
            let paths: Vec<PathBuf> = image.split(',').map(PathBuf::from).collect();
            let z = ubtrfs_core::zero_log(&paths)?;
            // The same line btrfs-progs prints.
            println!(
                "Clearing log on {image}, previous log_root {}, level {}",
                z.log_root, z.log_root_level
            );
        }
        Cmd::Filesystem {
            cmd: FsCmd::Resize { image, size },
        } => edit::resize(&image, &size, &mut out)?,
        Cmd::Filesystem {
            cmd:
                FsCmd::Trim {
                    image,
                    offset,
                    length,
                    minimum,
                    verbose,
                },
        } => {
            let offset = edit::parse_size(&offset)?;
            let length = length.as_deref().map(edit::parse_size).transpose()?;
            let minimum = edit::parse_size(&minimum)?;
            let n = edit::trim(&image, offset, length.unwrap_or(u64::MAX), minimum)?;
            if verbose {
                writeln!(
                    out,
                    "{}: {} ({n} bytes) trimmed",
                    image.display(),
                    fmt::size_3letter(n)
                )?;
            }
        }
        Cmd::Filesystem {
            cmd: FsCmd::Label { target, new_label },
        } => edit::label(&target, new_label.as_deref(), &mut out)?,
        Cmd::Filesystem { cmd: FsCmd::Df(a) } => {
            let fs = open(&a.img)?;
            space::cmd_fs_df(&fs, a.raw, a.format, &mut out)?;
        }
        Cmd::Filesystem {
            cmd: FsCmd::Usage(a),
        } => {
            let fs = open(&a.img)?;
            space::cmd_fs_usage(&fs, a.raw, a.format, a.tabular, &mut out)?;
        }
        Cmd::Filesystem {
            cmd: FsCmd::Show { img, raw },
        } => {
            let fs = open(&img)?;
            cmd_fs_show(&fs, raw, &mut out)?;
        }
        Cmd::Filesystem { cmd: FsCmd::Du(a) } => {
            let fs = open(&a.img)?;
            let r = share::cmd_du(&fs, &a, &mut out);
            flush_warnings(&fs);
            r?;
        }
        Cmd::Inspect { cmd } => match cmd {
            InspectCmd::Fiemap(a) => {
                let fs = open(&a.img)?;
                let r = share::cmd_fiemap(&fs, &a, &mut out);
                flush_warnings(&fs);
                r?;
            }
            InspectCmd::DumpSuper {
                img,
                full,
                super_mirror,
            } => cmd_dump_super(&img, full, super_mirror, &mut out)?,
            InspectCmd::DumpTree { img, tree, block } => {
                let fs = open(&img)?;
                let tree = match tree {
                    None => None,
                    Some(t) => Some(
                        t.parse::<i64>()
                            .map(|v| v as u64)
                            .ok()
                            .or_else(|| ubtrfs_core::tools::print_tree::parse_tree_name(&t))
                            .with_context(|| format!("unknown tree {t:?}"))?,
                    ),
                };
                let r = ubtrfs_core::tools::print_tree::dump_tree(&fs.info, tree, block, &mut out);
                flush_warnings(&fs);
                r?;
            }
            InspectCmd::Rootid { target, path } => {
                let id = match path {
                    None => {
                        let f = std::fs::File::open(&target)
                            .with_context(|| format!("{}: cannot open", target.display()))?;
                        ubtrfs_fuse::subvol_ops::client::subvolume_id(&f).with_context(|| {
                            format!("{}: not on a btrfs or ubtrfs mount", target.display())
                        })?
                    }
                    Some(p) => {
                        let fs = Filesystem::open_replayed(
                            &edit::image_paths(&target),
                            OpenOptions::default(),
                        )?;
                        fs.resolve(&p)?.root
                    }
                };
                writeln!(out, "{id}")?;
            }
        },
    }
    out.flush()?;
    Ok(())
}

fn target_of(fs: &Filesystem, node: Node, st: &Stat) -> Result<Option<Vec<u8>>> {
    if st.mode & S_IFMT == S_IFLNK {
        Ok(Some(fs.readlink(node)?))
    } else {
        Ok(None)
    }
}

fn ls_line(fs: &Filesystem, name: &[u8], node: Node, st: &Stat, long: bool) -> Result<String> {
    let name = fmt::name_display(name);
    if !long {
        return Ok(name);
    }
    let size = match st.mode & S_IFMT {
        S_IFCHR | S_IFBLK => {
            let (maj, min) = (
                nix::sys::stat::major(st.rdev),
                nix::sys::stat::minor(st.rdev),
            );
            format!("{maj}, {min}")
        }
        _ => st.size.to_string(),
    };
    let mut s = format!(
        "{} {} {} {} {} {} {}",
        fmt::mode_string(st.mode),
        st.nlink,
        st.uid,
        st.gid,
        size,
        fmt::ls_time(&st.mtime),
        name
    );
    if let Some(t) = target_of(fs, node, st)? {
        s.push_str(" -> ");
        s.push_str(&fmt::name_display(&t));
    }
    Ok(s)
}

fn join(dir: &str, name: &[u8]) -> String {
    let n = fmt::name_display(name);
    if dir.ends_with('/') {
        format!("{dir}{n}")
    } else {
        format!("{dir}/{n}")
    }
}

fn sorted_entries(fs: &Filesystem, dir: Node) -> Result<Vec<DirEntry>> {
    let mut v = fs.readdir(dir)?;
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(v)
}

fn cmd_ls(
    fs: &Filesystem,
    path: &str,
    long: bool,
    recursive: bool,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let node = fs.resolve(path)?;
    let st = fs.stat(node)?;
    let mut items = Vec::new();
    if st.mode & S_IFMT != ubtrfs_core::mode::S_IFDIR {
        if format == Format::Json {
            let target = target_of(fs, node, &st)?;
            json::write(out, &[json::stat(path, &st, target.as_deref())])?;
        } else {
            writeln!(out, "{}", ls_line(fs, path.as_bytes(), node, &st, long)?)?;
        }
        return Ok(());
    }
    // A directory reachable twice (a loop in a corrupt image) is listed once.
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![(path.to_string(), node)];
    let mut first = true;
    while let Some((dpath, dnode)) = stack.pop() {
        if !dnode.is_placeholder() && !seen.insert(dnode) {
            bail!(
                "{dpath}: directory loop (subvolume {} inode {})",
                dnode.root,
                dnode.ino
            );
        }
        let entries = sorted_entries(fs, dnode)?;
        if recursive && format == Format::Text {
            if !first {
                writeln!(out)?;
            }
            writeln!(out, "{dpath}:")?;
        }
        first = false;
        let mut subdirs = Vec::new();
        for e in &entries {
            let st = fs.stat(e.node)?;
            let p = join(&dpath, &e.name);
            if format == Format::Json {
                let target = target_of(fs, e.node, &st)?;
                items.push(json::ls_entry(&p, &e.name, &st, target.as_deref()));
            } else {
                writeln!(out, "{}", ls_line(fs, &e.name, e.node, &st, long)?)?;
            }
            if recursive && st.mode & S_IFMT == ubtrfs_core::mode::S_IFDIR {
                subdirs.push((p, e.node));
            }
        }
        // Depth-first in name order, as ls -R prints.
        stack.extend(subdirs.into_iter().rev());
    }
    if format == Format::Json {
        json::write(out, &items)?;
    }
    Ok(())
}

fn cmd_cat(fs: &Filesystem, path: &str, out: &mut dyn Write) -> Result<()> {
    let node = fs.resolve(path)?;
    let inode = fs.inode_item(node)?;
    if inode.mode & S_IFMT == ubtrfs_core::mode::S_IFDIR {
        bail!("{path}: Is a directory");
    }
    const CHUNK: usize = 1 << 20;
    let mut off = 0u64;
    while off < inode.size {
        let buf = fs
            .read_inode(node, &inode, off, CHUNK)
            .with_context(|| format!("{path}: read at offset {off}"))?;
        if buf.is_empty() {
            break;
        }
        out.write_all(&buf)?;
        off += buf.len() as u64;
    }
    Ok(())
}

fn cmd_stat(fs: &Filesystem, path: &str, format: Format, out: &mut dyn Write) -> Result<()> {
    let node = fs.resolve(path)?;
    let st = fs.stat(node)?;
    if format == Format::Json {
        let target = target_of(fs, node, &st)?;
        json::write(out, &json::stat(path, &st, target.as_deref()))?;
        return Ok(());
    }
    let file = match target_of(fs, node, &st)? {
        Some(t) => format!("{path} -> {}", fmt::name_display(&t)),
        None => path.to_string(),
    };
    writeln!(out, "  File: {file}")?;
    writeln!(
        out,
        "  Size: {:<15} Blocks: {:<10} IO Block: {:<6} {}",
        st.size,
        st.blocks,
        st.blksize,
        fmt::stat_type_text(st.mode, st.size)
    )?;
    let dev = if st.mode & S_IFMT == S_IFCHR || st.mode & S_IFMT == S_IFBLK {
        format!(
            " Device type: {},{}",
            nix::sys::stat::major(st.rdev),
            nix::sys::stat::minor(st.rdev)
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "Subvol: {:<15} Inode: {:<11} Links: {}{dev}",
        st.subvol, st.ino, st.nlink
    )?;
    writeln!(
        out,
        "Access: ({:04o}/{})  Uid: {:>5}   Gid: {:>5}",
        st.mode & 0o7777,
        fmt::mode_string(st.mode),
        st.uid,
        st.gid
    )?;
    writeln!(out, "Access: {}", fmt::stat_time(&st.atime))?;
    writeln!(out, "Modify: {}", fmt::stat_time(&st.mtime))?;
    writeln!(out, "Change: {}", fmt::stat_time(&st.ctime))?;
    writeln!(out, " Birth: {}", fmt::stat_time(&st.crtime))?;
    Ok(())
}

/// `btrfs filesystem show` of unmounted devices: label, fsid, device count and
/// the superblock's bytes used, then per device (the chunk tree's DEV_ITEMs, by
/// devid) its size, bytes in device extents and absolute path; devices not given
/// are reported missing as btrfs-progs does.
fn cmd_fs_show(fs: &Filesystem, raw: bool, out: &mut dyn Write) -> Result<()> {
    let size = |b: u64| fmt::progs_size(b, raw);
    let sb = &fs.info.sb;
    let devs = fs.info.dev_items()?;
    // Up to the first NUL, as btrfs-progs reads it.
    let end = sb
        .label_raw
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(sb.label_raw.len());
    let label = String::from_utf8_lossy(&sb.label_raw[..end]).to_string();
    let label = if label.is_empty() {
        "none".to_string()
    } else {
        format!("'{label}'")
    };
    writeln!(
        out,
        "Label: {label}  uuid: {}",
        ubtrfs_core::format::bytes::uuid_string(&sb.fsid)
    )?;
    writeln!(
        out,
        "\tTotal devices {} FS bytes used {}",
        sb.num_devices,
        size(sb.bytes_used)
    )?;
    let mut shown = 0;
    for d in &devs {
        let Some(dev) = fs.info.devices.get(&d.devid) else {
            continue;
        };
        let name = dev.name();
        let path = std::fs::canonicalize(&name)
            .map(|p| p.display().to_string())
            .unwrap_or(name);
        writeln!(
            out,
            "\tdevid {:4} size {} used {} path {path}",
            d.devid,
            size(d.total_bytes),
            size(d.bytes_used)
        )?;
        shown += 1;
    }
    if shown < devs.len() {
        writeln!(out, "\t*** Some devices missing")?;
    }
    Ok(())
}

fn cmd_subvol_list(
    fs: &Filesystem,
    all: bool,
    parent_uuid: bool,
    uuid: bool,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let subs = fs.subvolumes()?;
    if format == Format::Json {
        json::write(out, &json::subvolumes(&subs))?;
        return Ok(());
    }
    for s in &subs {
        let mut line = format!("ID {} gen {} top level {}", s.id, s.gen, s.top_level);
        if parent_uuid {
            line.push_str(&format!(" parent_uuid {}", s.parent_uuid));
        }
        if uuid {
            line.push_str(&format!(" uuid {}", s.uuid));
        }
        // Like progs: with -a, paths of subvolumes not directly below the listed
        // subvolume (the top level here) are marked absolute.
        if all && s.top_level != ubtrfs_format::consts::FS_TREE_OBJECTID {
            line.push_str(&format!(" path <FS_TREE>/{}", s.path));
        } else {
            line.push_str(&format!(" path {}", s.path));
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn cmd_dump_super(img: &Image, full: bool, mirror: usize, out: &mut dyn Write) -> Result<()> {
    use ubtrfs_core::{Device, FileDevice};
    use ubtrfs_format::consts::*;
    use ubtrfs_format::superblock::SuperBlock;
    if mirror >= SUPER_MIRROR_MAX {
        bail!("superblock copy {mirror} does not exist (0, 1 or 2)");
    }
    let path = img.image.split(',').next().unwrap_or(&img.image);
    let dev = FileDevice::open(std::path::Path::new(path), false)
        .with_context(|| format!("cannot open {path}"))?;
    let off = super_mirror_offset(mirror);
    if off + SUPER_INFO_SIZE as u64 > dev.size() {
        bail!("{path}: superblock copy {mirror} at {off} is beyond the end of the device");
    }
    let mut buf = vec![0u8; SUPER_INFO_SIZE];
    dev.read_at(off, &mut buf)
        .with_context(|| format!("{path}: reading superblock at {off}"))?;
    let sb = SuperBlock::parse(&buf).with_context(|| format!("{path}: superblock at {off}"))?;
    let text = ubtrfs_core::tools::print_tree::dump_super_with(&sb, off, path, full);
    out.write_all(text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn mount_helper() {
        let a = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(super::mount_helper_args(&a(&["ubtrfs", "ls"]), false), None);
        let helper = a(&[
            "/sbin/mount.fuse.ubtrfs",
            "/i.img",
            "/mnt",
            "-n",
            "-o",
            "rw,noauto,x-systemd.automount,commit=5,nofail,noexec",
        ]);
        assert_eq!(
            super::mount_helper_args(&helper, true),
            Some(a(&[
                "ubtrfs",
                "mount",
                "/i.img",
                "/mnt",
                "-o",
                "rw,commit=5,noexec,suid,dev"
            ]))
        );
        let mut nosuid = helper.clone();
        nosuid[5] = "nosuid,ro".into();
        assert_eq!(
            super::mount_helper_args(&nosuid, true),
            Some(a(&[
                "ubtrfs",
                "mount",
                "/i.img",
                "/mnt",
                "-o",
                "nosuid,ro,dev"
            ]))
        );
        assert_eq!(
            super::mount_helper_args(&helper, false),
            Some(a(&[
                "ubtrfs",
                "mount",
                "/i.img",
                "/mnt",
                "-o",
                "rw,commit=5,noexec"
            ]))
        );
    }
}
