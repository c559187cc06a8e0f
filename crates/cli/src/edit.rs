//! Writing commands: mkfs (with --rootdir), and offline edits of an image (put, mkdir,
//! rm, mv, ln, setfattr, truncate). Each edit command is one transaction: it commits
//! at the end, or leaves the image untouched on error.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::io::{IsTerminal, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use ubtrfs_core::format::consts::*;
use ubtrfs_core::format::csum::CsumType;
use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::tools::mkfs::{make_filesystem_devices, MkfsOptions};
use ubtrfs_core::{now, NewInode, MAX_EXTENT_SIZE};
use ubtrfs_core::{Node, Trans};

/// Commit when this much metadata is dirty, so memory stays bounded on big copies.
const DIRTY_BYTES_COMMIT: usize = 256 << 20;

#[derive(Args)]
pub struct MkfsArgs {
    /// Image file or block device (a file is created or extended to --size).
    pub image: PathBuf,
    /// More devices, as mkfs.btrfs takes them: one filesystem over all (device ids
    /// in the order given; each file sized to --size).
    pub more: Vec<PathBuf>,
    /// Size of the image file (e.g. 1G, 512M); `-b`/`--byte-count` as mkfs.btrfs.
    #[arg(long, short = 'b', visible_alias = "byte-count")]
    pub size: Option<String>,
    #[arg(long, short = 'n', default_value = "16384")]
    pub nodesize: u32,
    #[arg(long, short = 's', default_value = "4096")]
    pub sectorsize: u32,
    /// crc32c, xxhash, sha256 or blake2.
    #[arg(long, visible_alias = "checksum", default_value = "crc32c")]
    pub csum: String,
    #[arg(long, short = 'L', default_value = "")]
    pub label: String,
    #[arg(long, short = 'U')]
    pub uuid: Option<String>,
    /// Data profile: single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5,
    /// raid6 (the last seven on several devices).
    #[arg(long, short = 'd', default_value = "single")]
    pub data: String,
    /// Metadata profile (the same names); as mkfs.btrfs: dup on one device, raid1
    /// on several.
    #[arg(long, short = 'm')]
    pub metadata: Option<String>,
    /// Features, comma separated: block-group-tree, ^no-holes, quota (qgroups on,
    /// counted, as mkfs.btrfs -O quota), squota (simple quotas, as -O squota).
    #[arg(long, short = 'O')]
    pub features: Option<String>,
    /// Copy this directory's contents into the new filesystem.
    #[arg(long, short = 'r')]
    pub rootdir: Option<PathBuf>,
    /// With --rootdir: make this directory (relative to DIR) a subvolume; repeatable.
    /// As mkfs.btrfs, TYPE: before it makes the subvolume read-only (`ro:`), the
    /// default subvolume (`default:`), both (`default-ro:`) or neither (`rw:`).
    #[arg(long = "subvol", short = 'u', value_name = "[TYPE:]PATH")]
    pub subvols: Vec<String>,
    /// Compress file data copied by --rootdir: zlib, lzo or zstd, optionally :LEVEL.
    #[arg(long)]
    pub compress: Option<String>,
    /// With --rootdir: share file data with the source (reflink) instead of copying,
    /// where the host filesystem allows (source and image on the same btrfs or XFS).
    #[arg(long)]
    pub reflink: bool,
    /// After --rootdir, shrink the image to what is used (chunks are kept small).
    #[arg(long)]
    pub shrink: bool,
    /// Overwrite an existing filesystem.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// As mkfs.btrfs -K: no TRIM of the device first (ubtrfs never trims at mkfs:
    /// an image file's unwritten ranges are holes already).
    #[arg(long = "nodiscard", short = 'K')]
    pub nodiscard: bool,
    /// Quiet: no progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// What mkfs.btrfs's `--subvol TYPE:DIR` asks of a subvolume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SubvolKind {
    read_only: bool,
    default: bool,
}

/// Splits mkfs.btrfs's `--subvol [TYPE:]DIR`: TYPE is rw, ro, default or default-ro;
/// anything else before a colon is part of the path.
fn subvol_kind(arg: &str) -> (SubvolKind, &str) {
    for (prefix, read_only, default) in [
        ("rw:", false, false),
        ("ro:", true, false),
        ("default:", false, true),
        ("default-ro:", true, true),
    ] {
        if let Some(p) = arg.strip_prefix(prefix) {
            return (SubvolKind { read_only, default }, p);
        }
    }
    (SubvolKind::default(), arg)
}

/// `ubtrfs filesystem resize IMAGE [DEVID:][+|-]SIZE|max`: the new size is set in
/// the filesystem and the image file follows it (grown before the commit, cut after
/// it, so a crash leaves a file at least as large as the filesystem says).
pub fn resize(image: &Path, spec: &str, out: &mut dyn std::io::Write) -> Result<()> {
    let (devid, amount) = match spec.split_once(':') {
        Some((d, a)) => (
            d.parse::<u64>()
                .with_context(|| format!("device id {d:?}"))?,
            a,
        ),
        None => (1, spec),
    };
    let mut t = open_rw(image)?;
    let old = t.device_size(devid)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .with_context(|| image.display().to_string())?;
    let is_file = file.metadata()?.file_type().is_file();
    let new = if amount == "max" {
        if is_file {
            bail!("resize max: {} is a file, give a size", image.display());
        }
        u64::MAX
    } else if let Some(d) = amount.strip_prefix('+') {
        old.checked_add(parse_size(d)?)
            .ok_or_else(|| anyhow::anyhow!("size overflows"))?
    } else if let Some(d) = amount.strip_prefix('-') {
        old.checked_sub(parse_size(d)?)
            .ok_or_else(|| anyhow::anyhow!("cannot shrink below zero"))?
    } else {
        parse_size(amount)?
    };
    let new = if new == u64::MAX {
        t.fs.info
            .devices
            .get(&devid)
            .map(|d| d.size())
            .ok_or_else(|| anyhow::anyhow!("device {devid} is not open"))?
    } else {
        new
    };
    if is_file && new > file.metadata()?.len() {
        // The device must hold the new size before the filesystem says so.
        file.set_len(new)
            .with_context(|| format!("growing {}", image.display()))?;
        drop(t);
        t = open_rw(image)?;
    }
    let set = if new < old {
        t.shrink_device(devid, new)?
    } else {
        t.resize_device(devid, new)?
    };
    t.commit()?;
    drop(t);
    if is_file && set < file.metadata()?.len() {
        file.set_len(set)
            .with_context(|| format!("cutting {} to {set}", image.display()))?;
    }
    writeln!(
        out,
        "Resize device id {devid} ({}) from {} to {}",
        image.display(),
        ubtrfs_core::tools::du::pretty_size(old),
        ubtrfs_core::tools::du::pretty_size(set)
    )?;
    Ok(())
}

pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        Some('T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num.parse().with_context(|| format!("bad size {s:?}"))?;
    n.checked_mul(mult)
        .with_context(|| format!("size {s:?} too large"))
}

/// A mkfs profile name (progs' spelling): the block-group bits, 0 for single.
fn parse_profile(s: &str) -> Result<u64> {
    let bits = ubtrfs_core::parse_balance_profile(s).map_err(anyhow::Error::msg)?;
    Ok(bits & !ubtrfs_core::AVAIL_ALLOC_BIT_SINGLE)
}

fn parse_uuid(s: &str) -> Result<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        bail!("bad uuid {s:?}");
    }
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .with_context(|| format!("bad uuid {s:?}"))?;
    }
    Ok(u)
}

pub fn parse_compress(s: &str) -> Result<(ubtrfs_compress::Compression, Option<i32>)> {
    let (alg, level) = match s.split_once(':') {
        Some((a, l)) => (
            a,
            Some(
                l.parse::<i32>()
                    .with_context(|| format!("bad level in {s:?}"))?,
            ),
        ),
        None => (s, None),
    };
    let c = match alg {
        "zlib" => ubtrfs_compress::Compression::Zlib,
        "lzo" => ubtrfs_compress::Compression::Lzo,
        "zstd" => ubtrfs_compress::Compression::Zstd,
        other => bail!("unknown compression {other:?} (zlib, lzo, zstd)"),
    };
    Ok((c, level))
}

pub fn mkfs(a: MkfsArgs) -> Result<()> {
    let mut opts = MkfsOptions {
        nodesize: a.nodesize,
        sectorsize: a.sectorsize,
        csum: CsumType::from_name(&a.csum)
            .with_context(|| format!("unknown checksum {:?}", a.csum))?,
        label: a.label.clone(),
        fsid: a.uuid.as_deref().map(parse_uuid).transpose()?,
        data_profile: parse_profile(&a.data)?,
        metadata_profile: parse_profile(a.metadata.as_deref().unwrap_or(if a.more.is_empty() {
            "dup"
        } else {
            "raid1"
        }))?,
        shrink: a.shrink,
        ..Default::default()
    };
    if a.shrink && a.rootdir.is_none() {
        bail!("--shrink needs --rootdir");
    }
    let mut quota = false;
    let mut simple_quota = false;
    if let Some(f) = &a.features {
        for feat in f.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match feat {
                // mkfs.btrfs's runtime feature: quotas on, every subvolume counted.
                "quota" => quota = true,
                "^quota" => quota = false,
                // Simple quotas (as mkfs.btrfs -O squota): extents of later
                // transactions are charged to the subvolume that made them.
                "squota" => (quota, simple_quota) = (true, true),
                "^squota" => (quota, simple_quota) = (false, false),
                "block-group-tree" | "bgt" => opts.block_group_tree = true,
                "^block-group-tree" => opts.block_group_tree = false,
                "no-holes" | "extref" | "skinny-metadata" | "free-space-tree" => {}
                "^no-holes" => opts.no_holes = false,
                other => bail!("feature {other:?} is not supported"),
            }
        }
    }
    if opts.block_group_tree && !opts.no_holes {
        // The kernel refuses to mount that combination.
        bail!("block-group-tree requires the no-holes and free-space-tree features");
    }
    let all: Vec<PathBuf> = std::iter::once(a.image.clone())
        .chain(a.more.iter().cloned())
        .collect();
    if all.len() > 1 && a.shrink {
        bail!("--shrink works on one device");
    }
    let mut locks = Vec::new();
    for path in &all {
        let exists = path.exists();
        if exists && !a.force {
            let mut sig = [0u8; 8];
            if let Ok(mut f) = std::fs::File::open(path) {
                if f.seek(SeekFrom::Start(SUPER_INFO_OFFSET + 0x40)).is_ok()
                    && f.read_exact(&mut sig).is_ok()
                    && u64::from_le_bytes(sig) == BTRFS_MAGIC
                {
                    bail!(
                        "{} already holds a btrfs filesystem (use -f to overwrite)",
                        path.display()
                    );
                }
            }
        }
        if exists {
            ubtrfs_core::refuse_if_mounted(path).with_context(|| path.display().to_string())?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        locks.push(ubtrfs_core::lock_exclusive(path)?);
        if let Some(s) = &a.size {
            let size = parse_size(s)?;
            file.set_len(size)
                .with_context(|| format!("sizing {}", path.display()))?;
        } else if a.shrink && file.metadata()?.len() == 0 {
            // A sparse working size from the source's size; --shrink trims it after.
            let src = a.rootdir.as_deref().context("--shrink needs --rootdir")?;
            let bytes = tree_sizes(src, opts.sectorsize as u64)?.rough_bytes;
            file.set_len(bytes.saturating_mul(2).saturating_add(1 << 30))?;
        }
        // As mkfs.btrfs --rootdir: an image file (new, empty or too small) grows to
        // what the tree needs; a block device is what it is.
        if let (Some(src), false) = (&a.rootdir, a.shrink) {
            let md = file.metadata()?;
            if md.is_file() && all.len() == 1 {
                let need = rootdir_bytes(src, &opts)?;
                if md.len() < need {
                    file.set_len(need)
                        .with_context(|| format!("sizing {}", path.display()))?;
                }
            }
        }
    }
    if let Some(root) = &a.rootdir {
        let md = std::fs::metadata(root).with_context(|| root.display().to_string())?;
        if !md.is_dir() {
            bail!("{}: not a directory", root.display());
        }
        opts.root_uid = md.uid();
        opts.root_gid = md.gid();
        opts.root_mode = md.mode();
    }
    let mut devs: Vec<Arc<dyn ubtrfs_core::Device>> = Vec::new();
    for path in &all {
        devs.push(Arc::new(
            ubtrfs_core::FileDevice::open(path, true)
                .with_context(|| path.display().to_string())?,
        ));
    }
    let mut t = make_filesystem_devices(devs, &opts)?;
    t.hold_locks(locks);
    t.compress = a.compress.as_deref().map(parse_compress).transpose()?;
    if let Some(root) = &a.rootdir {
        let mut c = Copier::new(!a.quiet && std::io::stderr().is_terminal());
        c.reflink = a.reflink;
        if a.reflink && t.compress.is_some() {
            bail!("--reflink and --compress exclude each other");
        }
        let mut kinds = Vec::new();
        let croot = std::fs::canonicalize(root)?;
        for arg in &a.subvols {
            let (kind, sv) = subvol_kind(arg);
            let p = root.join(sv);
            let p = match std::fs::canonicalize(&p) {
                Ok(p) if p.is_dir() && p != croot && p.starts_with(&croot) => p,
                _ => bail!("--subvol {arg}: not a directory under {}", root.display()),
            };
            c.subvols.push(p.clone());
            kinds.push((p, kind));
        }
        if kinds.iter().filter(|(_, k)| k.default).count() > 1 {
            bail!("--subvol: the default subvolume can only be specified once");
        }
        start_prefetch(root);
        c.copy_dir_contents(&mut t, FS_TREE_OBJECTID, FIRST_FREE_OBJECTID, root)?;
        let md = std::fs::symlink_metadata(root)?;
        set_times(&mut t, FS_TREE_OBJECTID, FIRST_FREE_OBJECTID, &md)?;
        c.finish();
        // Made read-only and default once filled, as mkfs.btrfs does.
        for (p, kind) in &kinds {
            let id = *c
                .made_subvols
                .get(p)
                .with_context(|| format!("--subvol {}: not created", p.display()))?;
            if kind.read_only {
                t.set_subvolume_readonly(id, true, false, now())?;
            }
            if kind.default {
                t.set_default_subvolume(id)?;
            }
        }
        t.commit()?;
        if quota {
            t.quota_enable(simple_quota)?;
            t.commit()?;
            quota = false;
        }
        if a.shrink {
            let end = t.shrink_to_fit()?;
            t.commit()?;
            drop(t);
            let f = std::fs::OpenOptions::new().write(true).open(&a.image)?;
            if f.metadata()?.file_type().is_file() {
                f.set_len(end)
                    .with_context(|| format!("shrinking {}", a.image.display()))?;
            }
            if !a.quiet {
                println!("Shrunk to:          {end}");
            }
            return Ok(());
        }
    }
    if quota {
        t.quota_enable(simple_quota)?;
        t.commit()?;
    }
    if !a.quiet {
        let sb = &t.fs.info.sb;
        println!(
            "Label:              {}",
            if a.label.is_empty() {
                "(null)"
            } else {
                &a.label
            }
        );
        println!(
            "UUID:               {}",
            ubtrfs_core::format::bytes::uuid_string(&sb.fsid)
        );
        println!("Node size:          {}", sb.nodesize);
        println!("Sector size:        {}", sb.sectorsize);
        println!("Filesystem size:    {}", sb.total_bytes);
        println!("Checksum:           {}", opts.csum.name());
        // mkfs.btrfs's closing table of devices.
        println!("Number of devices:  {}", all.len());
        println!("Devices:");
        println!("   ID        SIZE  PATH");
        for (i, path) in all.iter().enumerate() {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            println!(
                "{:>5} {:>11}  {}",
                i + 1,
                crate::fmt::progs_size(size, false),
                path.display()
            );
        }
    }
    Ok(())
}

/// What a source tree holds, from one walk (symlinks not followed).
struct TreeSizes {
    /// Entries below the top directory, of every type.
    entries: u64,
    /// Regular files' sizes, each rounded up to the sector size.
    file_bytes: u64,
    /// Every non-directory's size plus 4 KiB (the --shrink working estimate).
    rough_bytes: u64,
}

fn tree_sizes(src: &Path, ss: u64) -> Result<TreeSizes> {
    let mut z = TreeSizes {
        entries: 0,
        file_bytes: 0,
        rough_bytes: 0,
    };
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| d.display().to_string())? {
            let path = e?.path();
            let m = path.symlink_metadata()?;
            z.entries += 1;
            if m.is_dir() {
                stack.push(path);
                continue;
            }
            z.rough_bytes = z.rough_bytes.saturating_add(m.len() + 4096);
            if m.is_file() {
                z.file_bytes = z.file_bytes.saturating_add(m.len().next_multiple_of(ss));
            }
        }
    }
    Ok(z)
}

/// How large an image `mkfs -r SRC` makes when not told (the file is new or too
/// small): the smallest filesystem of these profiles, plus the tree's data and a
/// metadata estimate (per entry its inode, name items and an inline sector, and an
/// eighth of the data, as the kernel's old 8:1 data:metadata ratio), each doubled
/// under DUP; sparse, so the room is cheap.
fn rootdir_bytes(src: &Path, opts: &MkfsOptions) -> Result<u64> {
    let ss = opts.sectorsize as u64;
    let z = tree_sizes(src, ss)?;
    let copies = |p: u64| if p == BLOCK_GROUP_DUP { 2 } else { 1 };
    let meta = z
        .entries
        .saturating_mul(3 * 4096 + ss)
        .saturating_add(z.file_bytes / 8);
    let need = ubtrfs_core::tools::mkfs::min_size(opts)
        .saturating_add(z.file_bytes.saturating_mul(copies(opts.data_profile)))
        .saturating_add(meta.saturating_mul(copies(opts.metadata_profile)));
    Ok(need.next_multiple_of(1 << 20))
}

fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec {
        sec,
        nsec: nsec as u32,
    }
}

fn set_times(t: &mut Trans, root: u64, ino: u64, md: &std::fs::Metadata) -> Result<()> {
    let mut i = t.read_inode(root, ino)?;
    i.atime = ts(md.atime(), md.atime_nsec());
    i.mtime = ts(md.mtime(), md.mtime_nsec());
    i.ctime = ts(md.ctime(), md.ctime_nsec());
    t.write_inode(root, ino, &i)?;
    Ok(())
}

/// Warms the page cache for a source tree while the copier works through it: a few
/// threads walk the tree (lstat, which is most of a cold copy's latency) and ask the
/// kernel to read files ahead (POSIX_FADV_WILLNEED, asynchronous). The copy itself
/// stays single-threaded and in order.
pub fn start_prefetch(root: &Path) {
    let queue = Arc::new(std::sync::Mutex::new(vec![root.to_path_buf()]));
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..4 {
        let queue = queue.clone();
        let busy = busy.clone();
        std::thread::spawn(move || loop {
            let next = queue.lock().ok().and_then(|mut q| {
                let d = q.pop();
                if d.is_some() {
                    busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                d
            });
            let Some(dir) = next else {
                if busy.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
                continue;
            };
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    let Ok(ft) = e.file_type() else { continue };
                    let p = e.path();
                    if ft.is_dir() {
                        if let Ok(mut q) = queue.lock() {
                            q.push(p);
                        }
                    } else if ft.is_file() {
                        let _ = std::fs::symlink_metadata(&p);
                        if let Ok(f) = std::fs::File::open(&p) {
                            let _ = nix::fcntl::posix_fadvise(
                                std::os::fd::AsRawFd::as_raw_fd(&f),
                                0,
                                0,
                                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
                            );
                        }
                    } else {
                        let _ = std::fs::symlink_metadata(&p);
                    }
                }
            }
            busy.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        });
    }
}

/// Device numbers as the kernel stores them in INODE_ITEM.rdev (MKDEV: major << 20).
fn disk_rdev(rdev: u64) -> u64 {
    let major = nix::sys::stat::major(rdev);
    let minor = nix::sys::stat::minor(rdev);
    (major << 20) | (minor & 0xfffff)
}

/// Copies host files into a subvolume: contents (holes kept), modes, owners, times,
/// xattrs, hard links, symlinks and special files.
pub struct Copier {
    /// Host (dev, ino) of multiply-linked files -> (tree, inode) made for them.
    links: HashMap<(u64, u64), (u64, u64)>,
    /// Directories (canonical host paths) to create as subvolumes.
    pub subvols: Vec<PathBuf>,
    /// The subvolumes made for them, by path.
    pub made_subvols: HashMap<PathBuf, u64>,
    /// Share file data with the source (mkfs --reflink).
    pub reflink: bool,
    bar: Option<ProgressBar>,
    pub files: u64,
    pub bytes: u64,
}

impl Copier {
    pub fn new(progress: bool) -> Copier {
        let bar = progress.then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b
        });
        Copier {
            links: HashMap::new(),
            subvols: Vec::new(),
            made_subvols: HashMap::new(),
            reflink: false,
            bar,
            files: 0,
            bytes: 0,
        }
    }

    /// `src`'s canonical path when it is to become a subvolume.
    fn subvol_path(&self, src: &Path) -> Result<Option<PathBuf>> {
        if self.subvols.is_empty() {
            return Ok(None);
        }
        let p = std::fs::canonicalize(src)?;
        Ok(self.subvols.contains(&p).then_some(p))
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    pub fn copy_dir_contents(
        &mut self,
        t: &mut Trans,
        root: u64,
        dir: u64,
        src: &Path,
    ) -> Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(src)
            .with_context(|| src.display().to_string())?
            .collect::<std::io::Result<Vec<_>>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            self.copy_one(t, root, dir, &e.path(), e.file_name().as_encoded_bytes())?;
        }
        Ok(())
    }

    pub fn copy_one(
        &mut self,
        t: &mut Trans,
        root: u64,
        dir: u64,
        src: &Path,
        name: &[u8],
    ) -> Result<u64> {
        use std::os::unix::ffi::OsStrExt;
        let md = std::fs::symlink_metadata(src).with_context(|| src.display().to_string())?;
        let time = ts(md.mtime(), md.mtime_nsec());
        let attr = NewInode {
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            rdev: disk_rdev(md.rdev()),
            time,
        };
        let ft = md.file_type();
        self.files += 1;
        if let Some(b) = &self.bar {
            if self.files.is_multiple_of(256) {
                b.set_message(format!("{} files, {} MiB", self.files, self.bytes >> 20));
                b.tick();
            }
        }
        if !ft.is_dir() && md.nlink() > 1 {
            // Hard links cannot cross subvolumes: such a name becomes a copy.
            if let Some(&(r, ino)) = self.links.get(&(md.dev(), md.ino())) {
                if r == root {
                    t.link(root, ino, dir, name, time)?;
                    return Ok(ino);
                }
            }
        }
        let ino = if ft.is_symlink() {
            let target = std::fs::read_link(src)?;
            t.symlink(root, dir, name, target.as_os_str().as_bytes(), attr)?
        } else if let Some(canonical) = ft
            .is_dir()
            .then(|| self.subvol_path(src))
            .transpose()?
            .flatten()
        {
            let id = t.create_subvolume(root, dir, name, md.mode(), md.uid(), md.gid(), time)?;
            self.made_subvols.insert(canonical, id);
            self.copy_dir_contents(t, id, FIRST_FREE_OBJECTID, src)?;
            if let Ok(names) = xattr::list(src) {
                for n in names {
                    if let Ok(Some(v)) = xattr::get(src, &n) {
                        t.set_xattr(id, FIRST_FREE_OBJECTID, n.as_bytes(), &v, time)?;
                    }
                }
            }
            set_times(t, id, FIRST_FREE_OBJECTID, &md)?;
            return Ok(FIRST_FREE_OBJECTID);
        } else if ft.is_dir() {
            let ino = t.create(root, dir, name, attr)?;
            self.copy_dir_contents(t, root, ino, src)?;
            ino
        } else if ft.is_file() {
            let ino = t.create(root, dir, name, attr)?;
            self.copy_data(t, root, ino, src, md.len())?;
            ino
        } else if ft.is_char_device() || ft.is_block_device() || ft.is_fifo() || ft.is_socket() {
            t.create(root, dir, name, attr)?
        } else {
            bail!("{}: unsupported file type", src.display());
        };
        if let Ok(names) = xattr::list(src) {
            for n in names {
                if let Ok(Some(v)) = xattr::get(src, &n) {
                    t.set_xattr(root, ino, n.as_bytes(), &v, time)?;
                }
            }
        }
        set_times(t, root, ino, &md)?;
        if !ft.is_dir() && md.nlink() > 1 {
            self.links.insert((md.dev(), md.ino()), (root, ino));
        }
        if t.dirty_bytes() > DIRTY_BYTES_COMMIT {
            t.commit()?;
        }
        Ok(ino)
    }

    fn copy_data(
        &mut self,
        t: &mut Trans,
        root: u64,
        ino: u64,
        src: &Path,
        size: u64,
    ) -> Result<()> {
        let mut f = std::fs::File::open(src).with_context(|| src.display().to_string())?;
        if self.reflink && !t.reflink_failed {
            t.reflink_source = Some(Arc::new(f.try_clone()?));
        }
        let r = self.copy_data_from(t, root, ino, src, &mut f, size);
        t.reflink_source = None;
        r
    }

    fn copy_data_from(
        &mut self,
        t: &mut Trans,
        root: u64,
        ino: u64,
        src: &Path,
        f: &mut std::fs::File,
        size: u64,
    ) -> Result<()> {
        let mut pos = 0u64;
        let chunk = MAX_EXTENT_SIZE as usize;
        let mut buf = vec![0u8; chunk.min(size as usize)];
        while pos < size {
            // Skip holes: they stay holes.
            // ENXIO: only a hole remains up to the end (truncate below sets the size).
            let data = match nix::unistd::lseek(
                std::os::fd::AsRawFd::as_raw_fd(&*f),
                pos as i64,
                nix::unistd::Whence::SeekData,
            ) {
                Ok(o) => o as u64,
                Err(nix::errno::Errno::ENXIO) => break,
                Err(_) => pos,
            };
            if data >= size {
                break;
            }
            let hole = nix::unistd::lseek(
                std::os::fd::AsRawFd::as_raw_fd(&*f),
                data as i64,
                nix::unistd::Whence::SeekHole,
            )
            .map(|o| o as u64)
            .unwrap_or(size)
            .min(size);
            let ss = t.fs.info.sectorsize as u64;
            let mut p = data - data % ss;
            let end = hole.next_multiple_of(ss).min(size);
            while p < end {
                let n = ((end - p) as usize).min(chunk);
                f.seek(SeekFrom::Start(p))?;
                f.read_exact(&mut buf[..n])
                    .with_context(|| src.display().to_string())?;
                t.write(root, ino, p, &buf[..n], now())?;
                self.bytes += n as u64;
                p += n as u64;
            }
            pos = end.max(hole);
        }
        if t.read_inode(root, ino)?.size < size {
            t.truncate(root, ino, size, now())?;
        }
        Ok(())
    }
}

/// `IMAGE[:/path]` arguments name paths from the top-level subvolume.
fn split_path(p: &str) -> (Vec<u8>, Vec<u8>) {
    let p = p.trim_end_matches('/');
    match p.rfind('/') {
        Some(i) => (p.as_bytes()[..i].to_vec(), p.as_bytes()[i + 1..].to_vec()),
        None => (Vec::new(), p.as_bytes().to_vec()),
    }
}

#[derive(Args)]
pub struct EditImage {
    /// Image file or block device.
    pub image: PathBuf,
}

/// `ubtrfs filesystem trim`: commits (a log replayed first, as every writing
/// command), then trims ([`Trans::trim`]); the bytes trimmed, as FITRIM reports them.
pub fn trim(image: &Path, offset: u64, len: u64, minlen: u64) -> Result<u64> {
    let mut t = open_rw(image)?;
    t.commit()?;
    let r = t
        .trim(offset, len, minlen)
        .with_context(|| format!("{}: cannot trim", image.display()))?;
    Ok(r.trimmed_bytes)
}

/// `ubtrfs filesystem label`: prints the label (as btrfs-progs, one line) or sets
/// it, on an image or through a directory of a mounted filesystem.
pub fn label(target: &Path, new: Option<&str>, out: &mut dyn std::io::Write) -> Result<()> {
    use ubtrfs_fuse::subvol_ops::client;
    if let Some(l) = new {
        if l.len() >= 256 {
            bail!("label is too long (max 255)");
        }
    }
    if target.is_dir() {
        let f = std::fs::File::open(target)
            .with_context(|| format!("{}: cannot open", target.display()))?;
        match new {
            Some(l) => client::set_fslabel(&f, l.as_bytes())
                .with_context(|| format!("{}: cannot set the label", target.display()))?,
            None => {
                let l = client::get_fslabel(&f)
                    .with_context(|| format!("{}: cannot read the label", target.display()))?;
                writeln!(out, "{}", String::from_utf8_lossy(&l))?;
            }
        }
        return Ok(());
    }
    match new {
        Some(l) => {
            let mut t = open_rw(target)?;
            t.set_label(l.as_bytes())?;
            t.commit()?;
        }
        None => {
            let fs = ubtrfs_core::Filesystem::open_replayed(
                &image_paths(target),
                ubtrfs_core::OpenOptions::default(),
            )?;
            writeln!(out, "{}", fs.info.sb.label())?;
        }
    }
    Ok(())
}

pub fn open_rw(img: &Path) -> Result<Trans> {
    Ok(Trans::open_paths(&image_paths(img))?)
}

/// The devices of an image argument: `a.img,b.img` names a multi-device filesystem
/// (unless a file has that very name).
pub fn image_paths(img: &Path) -> Vec<std::path::PathBuf> {
    if img.exists() {
        return vec![img.to_path_buf()];
    }
    img.to_string_lossy()
        .split(',')
        .map(std::path::PathBuf::from)
        .collect()
}

/// Resolves a path from the top level into whichever subvolume or snapshot it leads
/// to, as a kernel mount of the top level would.
fn resolve(t: &Trans, path: &[u8]) -> Result<Node> {
    t.fs.resolve_bytes(path)
        .with_context(|| String::from_utf8_lossy(path).into_owned())
}

/// Refuses changes where the kernel would: in a read-only subvolume or snapshot
/// (EROFS), and in the placeholder directory a nested subvolume shows inside a
/// snapshot (the kernel's dummy inode: EPERM).
pub fn writable(t: &Trans, n: Node, path: &[u8]) -> Result<()> {
    let shown = String::from_utf8_lossy(path);
    if n.is_placeholder() {
        bail!("{shown}: Operation not permitted (the empty stand-in of a subvolume inside a snapshot)");
    }
    if t.fs.subvol_root_item(n.root)?.flags & ROOT_SUBVOL_RDONLY != 0 {
        bail!(
            "{shown}: Read-only file system (read-only subvolume {})",
            n.root
        );
    }
    Ok(())
}

/// The directory a new name goes into, writable.
fn parent_dir(t: &Trans, parent: &[u8]) -> Result<Node> {
    let d = resolve(t, parent)?;
    writable(t, d, parent)?;
    Ok(d)
}

fn is_dir(t: &Trans, n: Node) -> bool {
    t.fs.inode_item(n)
        .map(|i| i.mode & 0o170000 == 0o040000)
        .unwrap_or(false)
}

pub fn put(image: &Path, srcs: &[PathBuf], dest: &str) -> Result<()> {
    let mut t = open_rw(image)?;
    let mut c = Copier::new(std::io::stderr().is_terminal());
    match t.fs.resolve(dest).ok() {
        Some(d) if is_dir(&t, d) => {
            writable(&t, d, dest.as_bytes())?;
            for s in srcs {
                let name = s
                    .file_name()
                    .with_context(|| format!("{}: no file name", s.display()))?;
                c.copy_one(&mut t, d.root, d.ino, s, name.as_encoded_bytes())?;
            }
        }
        Some(_) => bail!("{dest}: exists and is not a directory"),
        None => {
            if srcs.len() != 1 {
                bail!("{dest}: no such directory");
            }
            let (parent, name) = split_path(dest);
            let p = parent_dir(&t, &parent)?;
            c.copy_one(&mut t, p.root, p.ino, &srcs[0], &name)?;
        }
    }
    c.finish();
    t.commit()?;
    Ok(())
}

pub fn mkdir(image: &Path, paths: &[String], parents: bool, mode: u32) -> Result<()> {
    let mut t = open_rw(image)?;
    let attr = NewInode {
        mode: 0o40000 | (mode & 0o7777),
        uid: 0,
        gid: 0,
        rdev: 0,
        time: now(),
    };
    for p in paths {
        if parents {
            let mut cur = t.fs.top();
            for comp in p.split('/').filter(|c| !c.is_empty() && *c != ".") {
                cur = match t.fs.lookup(cur, comp.as_bytes())? {
                    Some(e) if is_dir(&t, e.node) => e.node,
                    Some(_) => bail!("{p}: {comp} exists and is not a directory"),
                    None => {
                        writable(&t, cur, p.as_bytes())?;
                        let ino = t.create(cur.root, cur.ino, comp.as_bytes(), attr)?;
                        Node::new(cur.root, ino)
                    }
                };
            }
        } else {
            let (parent, name) = split_path(p);
            let d = parent_dir(&t, &parent)?;
            t.create(d.root, d.ino, &name, attr)?;
        }
    }
    t.commit()?;
    Ok(())
}

/// `rm -r` of one name: children first, then the name. A subvolume met on the way is
/// deleted as the kernel's rmdir deletes an emptied subvolume (its contents are
/// removed first, as `rm -r` on a kernel mount does).
fn remove_tree(t: &mut Trans, dir: Node, name: &[u8]) -> Result<()> {
    let e = t.fs.lookup(dir, name)?.with_context(|| {
        format!(
            "{}: No such file or directory",
            String::from_utf8_lossy(name)
        )
    })?;
    if e.ty == FT_DIR {
        writable(t, e.node, name)?;
        let children = t.list_dir(e.node.root, e.node.ino)?;
        for (n, _) in children {
            remove_tree(t, e.node, &n)?;
        }
        // A subvolume's rmdir deletes it (the kernel's rmdir of an empty subvolume).
        t.rmdir(dir.root, dir.ino, name, now())?;
    } else {
        t.unlink(dir.root, dir.ino, name, now())?;
    }
    Ok(())
}

pub fn rm(image: &Path, paths: &[String], recursive: bool) -> Result<()> {
    let mut t = open_rw(image)?;
    for p in paths {
        let (parent, name) = split_path(p);
        if name.is_empty() || name == b"." || name == b".." {
            bail!("{p}: refusing to remove the top directory, '.' or '..'");
        }
        let d = parent_dir(&t, &parent)?;
        if recursive {
            remove_tree(&mut t, d, &name)?;
        } else {
            match t.lookup(d.root, d.ino, &name)? {
                Some((_, FT_DIR, _)) => bail!("{p}: is a directory (use -r)"),
                Some(_) => t.unlink(d.root, d.ino, &name, now())?,
                None => bail!("{p}: No such file or directory"),
            }
        }
    }
    t.commit()?;
    Ok(())
}

pub fn mv(image: &Path, from: &str, to: &str, noreplace: bool) -> Result<()> {
    let mut t = open_rw(image)?;
    let (op, on) = split_path(from);
    let od = parent_dir(&t, &op)?;
    let (nd, nn) = match t.fs.resolve(to) {
        Ok(n) if is_dir(&t, n) => (n, on.clone()),
        _ => {
            let (np, nn) = split_path(to);
            (resolve(&t, &np)?, nn)
        }
    };
    writable(&t, nd, to.as_bytes())?;
    if od.root != nd.root {
        bail!("{from} -> {to}: Invalid cross-device link (a rename between subvolumes, EXDEV as on the kernel)");
    }
    t.rename(od.root, od.ino, &on, nd.ino, &nn, noreplace, now())?;
    t.commit()?;
    Ok(())
}

pub fn ln(image: &Path, target: &str, link: &str, symbolic: bool) -> Result<()> {
    let mut t = open_rw(image)?;
    let (lp, ln) = split_path(link);
    let d = parent_dir(&t, &lp)?;
    if symbolic {
        let attr = NewInode {
            mode: 0o120777,
            uid: 0,
            gid: 0,
            rdev: 0,
            time: now(),
        };
        t.symlink(d.root, d.ino, &ln, target.as_bytes(), attr)?;
    } else {
        let n = resolve(&t, target.as_bytes())?;
        if n.root != d.root {
            bail!("{target} -> {link}: Invalid cross-device link (a hard link between subvolumes, EXDEV as on the kernel)");
        }
        if n.ino == FIRST_FREE_OBJECTID || is_dir(&t, n) {
            bail!("{target}: hard link not allowed for directory");
        }
        t.link(d.root, n.ino, d.ino, &ln, now())?;
    }
    t.commit()?;
    Ok(())
}

pub fn setfattr(
    image: &Path,
    path: &str,
    name: &str,
    value: Option<&str>,
    remove: bool,
) -> Result<()> {
    let mut t = open_rw(image)?;
    let n = resolve(&t, path.as_bytes())?;
    writable(&t, n, path.as_bytes())?;
    if remove {
        t.remove_xattr(n.root, n.ino, name.as_bytes(), now())?;
    } else {
        t.set_xattr(
            n.root,
            n.ino,
            name.as_bytes(),
            value.unwrap_or("").as_bytes(),
            now(),
        )?;
    }
    t.commit()?;
    Ok(())
}

pub fn truncate(image: &Path, path: &str, size: u64) -> Result<()> {
    let mut t = open_rw(image)?;
    let n = resolve(&t, path.as_bytes())?;
    writable(&t, n, path.as_bytes())?;
    t.truncate(n.root, n.ino, size, now())?;
    t.commit()?;
    Ok(())
}
