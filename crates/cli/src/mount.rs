//! `ubtrfs mount IMAGE[,DEV2...] MOUNTPOINT [-o OPTIONS] [-f]`: a read-only FUSE
//! mount (crate ubtrfs-fuse). Without -f the command returns once the mount is
//! ready, leaving a detached server process behind; errors (bad image, busy
//! mountpoint, bad options) are reported before it returns, and nothing is mounted.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use ubtrfs_core::format::consts::{INODE_NODATACOW, INODE_NODATASUM};
use ubtrfs_core::{
    lock_exclusive, refuse_if_mounted, Filesystem, FreeSpaceTreeAction, FsInfo, OpenOptions, Trans,
};
use ubtrfs_fuse::{Engine, InoMode, Writer};

pub const OPTIONS_HELP: &str = "\
Mount options (-o, comma separated, repeatable):
  rw                    read-write (the default): changes accumulate in a transaction that
                        is committed every commit= seconds, on sync and at unmount; fsync
                        writes the tree log (only that file's changes; the kernel replays it)
  remount               with ro or rw, from mount(8): switch a mounted filesystem (the
                        kernel then refuses writes itself); other options stay as they were
  ro                    read-only; without an explicit rw, an image the write engine cannot
                        write (e.g. no free-space tree, an interrupted balance) is mounted
                        read-only with a warning, as mount(8) does for write-protected media.
                        A tree log (fsyncs before a crash) is replayed: into the image
                        read-write, in memory only read-only (the kernel writes it even
                        on an ro mount unless nologreplay). Read-only, a damaged tree
                        block does not stop the mount: listings show what is left,
                        reads that need the block get EIO, each loss is logged once
  commit=SECS           interval of periodic commits (default 30, as the kernel)
  notreelog             fsync commits the transaction instead of writing the tree log
  compress=ALG[:LEVEL]  compress new data: zlib, lzo, zstd (the kernel's give-up rule);
                        compress alone: zlib; compress=no: off. compress-force=ALG: even
                        data that does not compress
  nodatacow, nodatasum  new regular files get NODATACOW (and NODATASUM) / NODATASUM, as
                        on the kernel (nodatacow also turns compression off); datacow,
                        datasum undo them
  max_inline=BYTES      files up to this size are stored in the leaf (default 2048; capped
                        at the sector size; 0: never)
  space_cache=v2        a filesystem that keeps the v1 space cache (mkfs.btrfs before
                        btrfs-progs 5.15) gets the free-space tree, the v1 cache removed,
                        as the kernel does with this option (ubtrfs writes only such
                        filesystems; `ubtrfs tune --convert-to-free-space-tree` does it
                        offline). space_cache, space_cache=v1, nospace_cache: read-only
  clear_cache           rebuild the free-space tree from the extent tree (read-write)
  rescan_uuid_tree      check the UUID tree against the subvolumes and mend it (read-write;
                        done anyway when the tree is missing or a writer that does not
                        keep it wrote since, as the kernel does)
  device=PATH           another device of a multi-device filesystem (as IMAGE,PATH)
  user_subvol_rm_allowed  users without CAP_SYS_ADMIN may delete a subvolume
                        (BTRFS_IOC_SNAP_DESTROY, `ubtrfs subvolume delete` on the mount)
                        whose root they may write, as on the kernel; without it only
                        root and the user who mounted may. Creating subvolumes needs
                        only write permission on the directory, snapshots also that
                        the caller own the source, as on the kernel
  thread_pool=N         as threads=N
  discard[=sync|async]  once a commit is on disk, discard the space it freed (an image
                        file gets holes punched, a device BLKDISCARD); async is done as
                        sync. nodiscard (the default here; the kernel's default is
                        discard=async on devices that can): only fstrim discards
  ssd, ssd_spread, nossd, autodefrag, barrier, flushoncommit, skip_balance,
  enospc_debug, fatal_errors=bug, metadata_ratio=N, acl,
  degraded              accepted so that a kernel's fstab line mounts; they tune what
                        ubtrfs does not have (allocator hints, background defrag and
                        balance, debug output). Every commit writes all data first
                        (flushoncommit). nobarrier, noacl, fatal_errors=panic: refused
  subvol=PATH           show this subvolume (path from the top level) at the mountpoint
  subvolid=N            show subvolume N (5 = top level); default: the default subvolume
  allow_other           let other users in (permissions are still checked, like the kernel)
  suid, dev             honour setuid bits / device nodes (default nosuid,nodev)
  noexec, sync, dirsync, nosymfollow
                        the VFS's flags, which it enforces on this mount as on any
                        (exec, async, symfollow: their opposites, the defaults)
  ino=unique|kernel     st_ino: unique (default): files of the mounted subvolume show their
                        btrfs inode numbers, those of other subvolumes (subvolid << 40) | ino,
                        because FUSE has one st_dev for the whole mount (the kernel has one
                        per subvolume); kernel: btrfs inode numbers everywhere, so find/du
                        see nested subvolume roots (all 256) as loops and tar/du/cp -a take
                        a snapshot's files for hard links of their source
  cache_mb=N            tree-block cache size in MiB (default 256)
  threads=N             threads serving requests (default 8; read-write: the CPU count, 2..8)
  io_uring_threads=N    FUSE over io_uring (Linux 6.14 on, with the fuse module's parameter
                        enable_uring=Y): threads per CPU queue (default 2; 0 = /dev/fuse
                        only). Requests are served on the CPU that made them: tar x runs
                        about twice as fast
  attr_timeout=SECS     how long the kernel caches attributes and names (default 86400)
  readahead_kb=N        kernel readahead for the mount (default 4096, like btrfs; 0 = FUSE's 128)
  max_read=BYTES        largest read request (default 1048576, the kernel's limit)
  rescue=ignoredatacsums  do not verify data checksums
  rescue=nologreplay    (or nologreplay, norecovery) with ro only: show the last commit,
                        a tree log left unreplayed (the kernel's meaning)
  rescue=usebackuproot  (or usebackuproot) mount read-only; a root tree that cannot be read
                        gives way to the newest backup root that can (every ro mount does)
  generation=N          read-only: show the filesystem as commit N left it (a backup root,
                        else found by scanning the metadata, as `extract --generation`)
  tree_root=BYTENR      read-only: show the filesystem from this root tree block
                        (`ubtrfs rescue find-root` lists candidates)
  log=FILE              append error messages (checksum failures...) to FILE; without it
                        a detached mount discards them (-f prints them on stderr)
  fsname=NAME           mount source shown in /proc/mounts (default: the image path)
  subtype=NAME          mount type shown in /proc/mounts: fuse.NAME (default ubtrfs); empty
                        (subtype=): plain fuse, as fstests' FSTYP=fuse expects
  relatime              (the default, as the kernel) a read or listing gives a new atime
                        when atime is not newer than mtime or ctime, or is a day old
  strictatime           every read or listing gives a new atime
  noatime, nodiratime   never a new atime; never for directories (atime, diratime,
                        norelatime, nostrictatime, lazytime, nolazytime: the kernel's meaning)
  default_permissions   accepted (permissions are always checked by the kernel)";

#[derive(Args)]
#[command(after_help = OPTIONS_HELP)]
pub struct MountArgs {
    /// Image file or block device; all devices of a multi-device filesystem: a,b,c.
    image: String,
    /// An existing empty directory.
    mountpoint: PathBuf,
    /// Mount options, comma separated.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Stay in the foreground (serve until unmounted or interrupted).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Internal: the detached server started by `ubtrfs mount` without -f.
    #[arg(long, hide = true)]
    daemon_child: bool,
}

#[derive(Debug)]
struct Opts {
    subvol: Option<String>,
    subvolid: Option<u64>,
    allow_other: bool,
    suid: bool,
    dev: bool,
    vfs: ubtrfs_fuse::VfsFlags,
    ino: InoMode,
    cache_mb: Option<usize>,
    threads: Option<usize>,
    uring_threads: Option<usize>,
    ttl: Option<u64>,
    readahead_kb: Option<u32>,
    max_read: Option<u32>,
    verify_csum: bool,
    /// `rescan_uuid_tree`: check the UUID tree at the writing open.
    rescan_uuid_tree: bool,
    log: Option<PathBuf>,
    fsname: Option<String>,
    subtype: Option<String>,
    /// Some(true): rw asked for; Some(false): ro; None: rw, falling back to ro.
    rw: Option<bool>,
    commit_secs: u64,
    compress: Option<String>,
    compress_force: bool,
    /// `-o notreelog`: fsync commits instead of writing the tree log.
    notreelog: bool,
    /// `-o remount,...` (from mount(8)): change the mounted filesystem's flags.
    remount: bool,
    /// `-o tree_root=BYTENR`: show the filesystem from this root tree block.
    tree_root: Option<u64>,
    /// `-o generation=N`: show the filesystem as generation N committed it.
    generation: Option<u64>,
    /// `-o rescue=usebackuproot`: accepted, and read-only (see `open_read_only`).
    usebackuproot: bool,
    /// `-o rescue=nologreplay` (or the older `nologreplay`, `norecovery`): a tree
    /// log is not replayed; read-only only, as on the kernel.
    nologreplay: bool,
    /// The atime words (relatime, noatime, strictatime, nodiratime, ...) as flags.
    atime: ubtrfs_fuse::AtimeFlags,
    /// `space_cache=v2` (create the free-space tree if missing) or `clear_cache`
    /// (rebuild it).
    free_space_tree: FreeSpaceTreeAction,
    /// `space_cache`, `space_cache=v1` or `nospace_cache` was given (refused on a
    /// writable mount: ubtrfs writes only the free-space tree).
    v1_cache: Option<String>,
    /// `device=PATH`: more devices of a multi-device filesystem.
    devices: Vec<PathBuf>,
    /// Inode flags of new regular files (`nodatacow`, `nodatasum`).
    new_file_flags: u64,
    /// `max_inline=BYTES` (the kernel caps it at the sector size).
    max_inline: Option<u64>,
    /// `discard`: each commit discards the space it freed.
    discard: bool,
    /// `user_subvol_rm_allowed`: subvolume deletion for owners, not only root.
    user_subvol_rm_allowed: bool,
    /// The changeable options named, for a remount (settings.rs).
    settings: ubtrfs_fuse::Settings,
}

impl Opts {
    /// A `nodatacow`-like option: flags of new files set and cleared, in order.
    fn flag_op(&mut self, set: u64, clear: u64) {
        self.new_file_flags = (self.new_file_flags & !clear) | set;
        let (s, c) = self.settings.new_file_flags.unwrap_or((0, 0));
        self.settings.new_file_flags = Some(((s & !clear) | set, (c & !set) | clear));
    }
}

/// A size as the kernel's memparse reads it: a number with an optional k, m, g, t
/// suffix (either case, powers of 1024).
fn memparse(k: &str, v: &str) -> Result<u64> {
    let (digits, shift) = match v.as_bytes().last().map(u8::to_ascii_lowercase) {
        Some(b'k') => (&v[..v.len() - 1], 10),
        Some(b'm') => (&v[..v.len() - 1], 20),
        Some(b'g') => (&v[..v.len() - 1], 30),
        Some(b't') => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    let n: u64 = num(k, digits)?;
    n.checked_mul(1 << shift)
        .with_context(|| format!("mount option {k}={v}: too large"))
}

fn num<T: std::str::FromStr>(k: &str, v: &str) -> Result<T> {
    v.parse()
        .ok()
        .with_context(|| format!("mount option {k}={v}: not a number"))
}

fn parse_options(list: &[String]) -> Result<Opts> {
    let mut o = Opts {
        subvol: None,
        subvolid: None,
        allow_other: false,
        suid: false,
        dev: false,
        vfs: Default::default(),
        ino: InoMode::Unique,
        cache_mb: None,
        threads: None,
        uring_threads: None,
        ttl: None,
        readahead_kb: None,
        max_read: None,
        verify_csum: true,
        rescan_uuid_tree: false,
        log: None,
        fsname: None,
        subtype: None,
        rw: None,
        commit_secs: 30,
        compress: None,
        compress_force: false,
        notreelog: false,
        remount: false,
        tree_root: None,
        generation: None,
        usebackuproot: false,
        nologreplay: false,
        atime: Default::default(),
        free_space_tree: FreeSpaceTreeAction::Keep,
        v1_cache: None,
        devices: Vec::new(),
        new_file_flags: 0,
        max_inline: None,
        discard: false,
        user_subvol_rm_allowed: false,
        settings: Default::default(),
    };
    for item in list.iter().flat_map(|s| s.split(',')) {
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        match (k, v) {
            ("", None) => {}
            ("ro", None) => o.rw = Some(false),
            ("remount", None) => o.remount = true,
            // The FUSE options the kernel shows in /proc/mounts, which mount(8) hands
            // back on remount: ubtrfs sets them itself.
            ("user_id" | "group_id" | "rootmode" | "fd" | "blksize", Some(_)) => {}
            ("rw", None) => o.rw = Some(true),
            ("notreelog" | "treelog", None) => {
                o.notreelog = k == "notreelog";
                o.settings.tree_log = Some(k == "treelog");
            }
            ("commit", Some(n)) => {
                // 0: the default, as the kernel (which only warns above 300 s).
                let secs = num::<u32>(k, n)?;
                o.commit_secs = if secs == 0 { 30 } else { secs as u64 };
                o.settings.commit_secs = Some(secs);
            }
            ("compress" | "compress-force", Some("no" | "none")) => {
                o.compress = None;
                o.compress_force = false;
                o.settings.compress = Some(None);
            }
            ("compress" | "compress-force", c) => {
                // Without a value: zlib, as the kernel. Compressing turns nodatacow
                // and nodatasum off (the kernel's option parser).
                let c = c.unwrap_or("zlib");
                let (alg, level) = crate::edit::parse_compress(c)?;
                o.compress = Some(c.to_string());
                o.compress_force = k == "compress-force";
                o.settings.compress = Some(Some((alg, level, o.compress_force)));
                o.flag_op(0, INODE_NODATACOW | INODE_NODATASUM);
            }
            ("nodatacow", None) => {
                o.flag_op(INODE_NODATACOW | INODE_NODATASUM, 0);
                o.compress = None;
                o.compress_force = false;
                o.settings.compress = Some(None);
            }
            ("nodatasum", None) => o.flag_op(INODE_NODATASUM, 0),
            ("datacow", None) => o.flag_op(0, INODE_NODATACOW),
            ("datasum", None) => o.flag_op(0, INODE_NODATACOW | INODE_NODATASUM),
            ("max_inline", Some(n)) => {
                let n = memparse(k, n)?;
                o.max_inline = Some(n);
                o.settings.max_inline = Some(n.min(u16::MAX as u64) as u16);
            }
            ("space_cache", Some("v2")) => {
                o.free_space_tree = match o.free_space_tree {
                    FreeSpaceTreeAction::Rebuild => FreeSpaceTreeAction::CreateOrRebuild,
                    f @ FreeSpaceTreeAction::CreateOrRebuild => f,
                    _ => FreeSpaceTreeAction::Create,
                };
                o.v1_cache = None;
            }
            ("rescan_uuid_tree", None) => o.rescan_uuid_tree = true,
            ("clear_cache", None) => {
                o.free_space_tree = match o.free_space_tree {
                    FreeSpaceTreeAction::Create | FreeSpaceTreeAction::CreateOrRebuild => {
                        FreeSpaceTreeAction::CreateOrRebuild
                    }
                    _ => FreeSpaceTreeAction::Rebuild,
                };
            }
            ("space_cache", None | Some("v1")) | ("nospace_cache", None) => {
                o.v1_cache = Some(item.to_string())
            }
            ("device", Some(p)) => o.devices.push(PathBuf::from(p)),
            ("thread_pool", Some(n)) => o.threads = Some(num::<usize>(k, n)?.clamp(1, 256)),
            // The kernel's options that tune its own allocator, background work,
            // debugging output or discards, where ubtrfs has nothing to tune: accepted
            // so that a kernel's fstab line mounts (see OPTIONS_HELP).
            (
                "ssd" | "ssd_spread" | "nossd" | "nossd_spread" | "autodefrag" | "noautodefrag"
                | "barrier" | "enospc_debug" | "noenospc_debug" | "skip_balance" | "flushoncommit"
                | "noflushoncommit" | "acl" | "degraded",
                None,
            )
            | ("fatal_errors", Some("bug")) => {}
            ("discard", None | Some("sync" | "async")) | ("nodiscard", None) => {
                o.discard = k == "discard";
                o.settings.discard = Some(o.discard);
            }
            ("user_subvol_rm_allowed", None) => {
                o.user_subvol_rm_allowed = true;
                o.settings.user_subvol_rm_allowed = Some(true);
            }
            ("metadata_ratio", Some(n)) => {
                num::<u32>(k, n)?;
            }
            ("nobarrier", None) => bail!("mount option nobarrier: ubtrfs always flushes"),
            ("noacl", None) => bail!("mount option noacl: ubtrfs always enforces POSIX ACLs"),
            ("fatal_errors", Some(v)) => {
                bail!(
                    "mount option fatal_errors={v}: ubtrfs turns read-only on a fatal error (bug)"
                )
            }
            ("default_permissions" | "nosuid" | "nodev", None) => {}
            (w, None) if o.atime.parse_word(w) => {}
            (w, None) if o.vfs.parse_word(w) => {}
            ("subvol", Some(p)) => o.subvol = Some(p.to_string()),
            ("subvolid", Some(n)) => o.subvolid = Some(num(k, n)?),
            ("allow_other", None) => o.allow_other = true,
            ("suid", None) => o.suid = true,
            ("dev", None) => o.dev = true,
            ("ino", Some("kernel")) => o.ino = InoMode::Kernel,
            ("ino", Some("unique")) => o.ino = InoMode::Unique,
            ("cache_mb", Some(n)) => o.cache_mb = Some(num(k, n)?),
            ("threads", Some(n)) => o.threads = Some(num::<usize>(k, n)?.clamp(1, 256)),
            ("io_uring_threads", Some(n)) => {
                o.uring_threads = Some(num::<usize>(k, n)?.min(64));
            }
            ("attr_timeout", Some(n)) => o.ttl = Some(num(k, n)?),
            ("readahead_kb", Some(n)) => o.readahead_kb = Some(num(k, n)?),
            ("max_read", Some(n)) => o.max_read = Some(num::<u32>(k, n)?.clamp(4096, 1 << 20)),
            ("rescue", Some("ignoredatacsums")) => o.verify_csum = false,
            ("rescue", Some("nologreplay")) | ("nologreplay" | "norecovery", None) => {
                o.nologreplay = true
            }
            ("rescue", Some("usebackuproot")) | ("usebackuproot", None) => o.usebackuproot = true,
            ("tree_root", Some(v)) => o.tree_root = Some(num(k, v)?),
            ("generation", Some(v)) => o.generation = Some(num(k, v)?),
            ("log", Some(f)) => o.log = Some(PathBuf::from(f)),
            ("fsname", Some(n)) => o.fsname = Some(n.to_string()),
            ("subtype", Some(n)) => o.subtype = Some(n.to_string()),
            _ => bail!("unknown mount option {item:?} (see ubtrfs mount --help)"),
        }
    }
    if o.tree_root.is_some() || o.generation.is_some() || o.usebackuproot {
        // An older generation is a view: writing there would fork the filesystem.
        if o.rw == Some(true) {
            bail!("mount options tree_root, generation and usebackuproot are read-only (-o ro)");
        }
        if o.tree_root.is_some() && o.generation.is_some() {
            bail!("mount options tree_root and generation exclude each other");
        }
        o.rw = Some(false);
    }
    // btrfs_check_options: the log left unreplayed would be lost by a writer. (After
    // the options above that imply read-only.)
    if o.nologreplay && o.rw != Some(false) {
        bail!("nologreplay must be used with ro mount option");
    }
    if let Some(v1) = &o.v1_cache {
        if o.rw == Some(true) {
            bail!(
                "mount option {v1}: ubtrfs writes only the free-space tree \
                 (space_cache=v2); mount with -o ro, or without it"
            );
        }
        // Without rw: a filesystem that has the v1 cache mounts read-only (it cannot
        // be written without converting), one with the free-space tree too.
        o.rw = Some(false);
    }
    Ok(o)
}

/// Opens the filesystem read-only as the mount options ask: at an older root tree
/// (`tree_root=`, `generation=`). (A read-only open salvages: a root tree that
/// cannot be read already gives way to the newest backup root that can, which is
/// what the kernel's rescue=usebackuproot asks for.)
fn open_read_only(
    image: &str,
    paths: &[PathBuf],
    o: &Opts,
    opts: OpenOptions,
) -> Result<Filesystem> {
    let tree_root = match o.generation {
        Some(g) => Some(crate::root_of_generation(
            &crate::Image::of(image, o.verify_csum),
            g,
        )?),
        None => o.tree_root,
    };
    let opts = OpenOptions { tree_root, ..opts };
    if o.nologreplay {
        // The last commit as it is, a tree log left aside (the kernel's nologreplay).
        return ubtrfs_core::FsInfo::open_paths(paths, opts)
            .map(Filesystem::from_info)
            .with_context(|| format!("cannot open {image}"));
    }
    Filesystem::open_replayed(paths, opts).with_context(|| format!("cannot open {image}"))
}

pub fn run(args: MountArgs) -> Result<()> {
    let o = parse_options(&args.options)?;
    if o.remount {
        return remount(&args.mountpoint, &o);
    }
    if !args.foreground && !args.daemon_child {
        return spawn_detached(&args);
    }
    if args.daemon_child {
        // A process group of our own: the terminal's ^C goes to the foreground
        // group, not to us. Not a session of our own (setsid, as daemons usually
        // do): with the scheduler's autogroups (sched_autogroup_enabled) a new
        // session is a new task group, and every request then waits for the
        // scheduler to switch groups: tar x of 5,400 files took 3.4 s instead of
        // 1.7 s.
        let _ = nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0));
    }
    let mut paths: Vec<PathBuf> = args.image.split(',').map(PathBuf::from).collect();
    for d in &o.devices {
        if !paths.contains(d) {
            paths.push(d.clone());
        }
    }
    let mut opts = OpenOptions {
        verify_data_csum: o.verify_csum,
        free_space_tree: o.free_space_tree,
        rescan_uuid_tree: o.rescan_uuid_tree,
        ..Default::default()
    };
    if let Some(mb) = o.cache_mb {
        opts.cache_bytes_max = mb.max(1) << 20;
    }
    let mnt = ubtrfs_fuse::check_mountpoint(&args.mountpoint).map_err(anyhow::Error::msg)?;
    let writer = match o.rw {
        Some(false) => None,
        want => match open_writable(&paths, &opts) {
            Ok(t) => Some(t),
            // Only what the write engine cannot do yet falls back; a busy image is
            // an error either way.
            Err(e)
                if want.is_none()
                    && (matches!(
                        e.downcast_ref::<ubtrfs_core::Error>(),
                        Some(ubtrfs_core::Error::Unsupported(_))
                    ) || write_protected(&e)) =>
            {
                eprintln!(
                    "ubtrfs: warning: {} cannot be written ({e:#}); mounting read-only",
                    args.image
                );
                None
            }
            Err(e) => return Err(e),
        },
    };
    // Read-only: a shared lock for the mount's life, so ubtrfs writers (which take it
    // exclusively) refuse the image while it is mounted.
    let mut _locks = Vec::new();
    let engine = match writer {
        Some(mut t) => {
            if let Some(c) = &o.compress {
                t.compress = Some(crate::edit::parse_compress(c)?);
                t.compress_force = o.compress_force;
            }
            t.new_file_flags = o.new_file_flags;
            t.discard_on_commit = o.discard;
            if let Some(n) = o.max_inline {
                t.set_max_inline(n);
            }
            let w = Writer::new(t);
            if o.notreelog {
                w.disable_tree_log();
            }
            Engine::ReadWrite(w)
        }
        None => {
            _locks = lock_shared(&paths)?;
            // Salvaging (see loss_logger): a damaged tree block reads as empty, so
            // listings go on; a file read that needs one gets EIO (ops.rs), and
            // so does data failing its checksums in every copy, as on the kernel.
            let opts = OpenOptions {
                salvage: true,
                data_as_found: false,
                ..opts
            };
            // A tree log is replayed in memory only: a read-only mount never writes.
            let fs = open_read_only(&args.image, &paths, &o, opts)?;
            Engine::ReadOnly(Arc::new(fs))
        }
    };
    engine.read(|fs| {
        for w in fs.info.take_warnings() {
            eprintln!("ubtrfs: warning: {w}");
        }
    });
    let root = engine
        .read(|fs| ubtrfs_fuse::resolve_root(fs, o.subvol.as_deref(), o.subvolid))
        .map_err(anyhow::Error::msg)?;
    let fsname = o.fsname.clone().unwrap_or_else(|| {
        std::fs::canonicalize(&paths[0])
            .unwrap_or_else(|_| paths[0].clone())
            .display()
            .to_string()
    });
    let mut cfg = ubtrfs_fuse::Config::new(&fsname, root);
    cfg.mount.allow_other = o.allow_other;
    if let Some(s) = &o.subtype {
        cfg.mount.subtype = s.clone();
    }
    cfg.mount.suid = o.suid;
    cfg.mount.dev = o.dev;
    cfg.mount.vfs = o.vfs;
    cfg.ino = o.ino;
    cfg.user_subvol_rm_allowed = o.user_subvol_rm_allowed;
    cfg.atime = o.atime.options();
    cfg.mount.atime = o.atime.options();
    if let Some(s) = o.ttl {
        cfg.ttl = std::time::Duration::from_secs(s);
    }
    if engine.writable() {
        // Changes take the transaction's lock one at a time: more server threads than
        // cores only add context switches (20,000 creates: 2.0 s with 2 threads, 3.2 s
        // with 8 on a 2-core machine).
        cfg.tuning.threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(2, 8);
    }
    if let Some(t) = o.threads {
        cfg.tuning.threads = t;
    }
    if let Some(t) = o.uring_threads {
        // At least two per queue: a thread that waits for the kernel (invalidating
        // a name takes the directory's lock) must not be the queue's only one.
        cfg.tuning.uring_threads_per_cpu = if t == 0 { 0 } else { t.max(2) };
    }
    if let Some(kb) = o.readahead_kb {
        cfg.tuning.readahead_kb = (kb > 0).then_some(kb);
    }
    if let Some(m) = o.max_read {
        cfg.tuning.max_read = m;
    }
    let log = match &o.log {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("log file {}", p.display()))?,
        ),
        None => None,
    };
    let writer = match &engine {
        Engine::ReadWrite(w) => Some(Arc::clone(w)),
        Engine::ReadOnly(_) => None,
    };
    let losses = match &engine {
        Engine::ReadOnly(fs) => Some(LossLog::start(Arc::clone(fs))),
        Engine::ReadWrite(_) => None,
    };
    let session = ubtrfs_fuse::mount(engine, &mnt, &cfg)
        .with_context(|| format!("cannot mount on {}", args.mountpoint.display()))?;
    let committer = writer
        .as_ref()
        .map(|w| w.spawn_committer(std::time::Duration::from_secs(o.commit_secs)));
    if args.daemon_child {
        // Tell the waiting parent, then let go of its stdout/stderr.
        let mut out = std::io::stdout();
        let _ = out.write_all(b"ready\n");
        let _ = out.flush();
        redirect_stdio(log.as_ref())?;
    } else if let Some(f) = &log {
        redirect_fd(f, 2)?;
    }
    let served = session
        .run()
        .with_context(|| format!("serving {}", args.mountpoint.display()));
    if let Some(l) = &losses {
        l.flush();
    }
    if let Some(w) = writer {
        // Unmounted (fusermount3 -u, umount, a signal): the last commit.
        w.stop();
        if let Some(c) = committer {
            let _ = c.join();
        }
        // The tree log's counters, for bench/fsync.sh (seed 004's searches and leaf
        // copies): asked for with UBTRFS_TREE_LOG_STATS=1.
        if std::env::var_os("UBTRFS_TREE_LOG_STATS").is_some() {
            if let Some(s) = w.log_stats() {
                eprintln!(
                    "ubtrfs: tree log: {} fsyncs, {} logged, {} full commits {:?}, {} inodes \
                     logged ({} through the fast path), {} items logged, {} searches, {} leaf copies, {} blocks written, \
                     {} bytes written",
                    s.fsyncs,
                    s.logged,
                    s.full_commits,
                    s.commit_reasons,
                    s.inodes_logged,
                    s.fast_path,
                    s.items_logged,
                    s.searches,
                    s.leaf_copies,
                    s.blocks_written,
                    s.bytes_written
                );
            }
        }
        if w.finish().is_err() || w.is_aborted() {
            bail!(
                "{}: the last changes were not committed (see the error above); the image \
                 is at its last good commit",
                args.image
            );
        }
    }
    served
}

/// `mount -o remount,ro|rw DIR`: the kernel switches the FUSE mount's flags itself
/// (writes then fail with EROFS before they reach the server), as for any
/// filesystem; mount(8) passes the mount's whole option list, so flags not given
/// are cleared. Other options cannot change on a running server and are ignored.
fn remount(dir: &std::path::Path, o: &Opts) -> Result<()> {
    use nix::mount::MsFlags;
    let mut flags = MsFlags::MS_REMOUNT;
    if o.rw == Some(false) {
        flags |= MsFlags::MS_RDONLY;
    }
    if !o.suid {
        flags |= MsFlags::MS_NOSUID;
    }
    if !o.dev {
        flags |= MsFlags::MS_NODEV;
    }
    flags |= o.vfs.ms_flags();
    for (set, f) in [
        (o.atime.noatime, MsFlags::MS_NOATIME),
        (o.atime.relatime, MsFlags::MS_RELATIME),
        (o.atime.strictatime, MsFlags::MS_STRICTATIME),
        (o.atime.nodiratime, MsFlags::MS_NODIRATIME),
    ] {
        if set {
            flags |= f;
        }
    }
    nix::mount::mount(None::<&str>, dir, None::<&str>, flags, None::<&str>)
        .with_context(|| format!("remounting {}", dir.display()))?;
    // The server learns the outcome from us: FUSE tells it nothing of a remount.
    // It matters for what starts there: atime updates, and the commit before
    // read-only. The atime options are the kernel's result (it keeps the old ones
    // when none is given, and strictatime overrides noatime), read back.
    let st =
        nix::sys::statvfs::statvfs(dir).with_context(|| format!("statvfs of {}", dir.display()))?;
    let f = st.flags();
    use nix::sys::statvfs::FsFlags;
    let atime = ubtrfs_fuse::AtimeOptions {
        mode: if f.contains(FsFlags::ST_NOATIME) {
            ubtrfs_fuse::AtimeMode::NoAtime
        } else if f.contains(FsFlags::ST_RELATIME) {
            ubtrfs_fuse::AtimeMode::Relatime
        } else {
            ubtrfs_fuse::AtimeMode::StrictAtime
        },
        nodiratime: f.contains(FsFlags::ST_NODIRATIME),
    };
    let d = std::fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    ubtrfs_fuse::atime::client::remounted(&d, f.contains(FsFlags::ST_RDONLY), Some(atime))
        .with_context(|| format!("telling the server of {} about the remount", dir.display()))?;
    // The options a remount may change (compress, commit, discard, ...): those
    // named, the rest kept, as the kernel's btrfs reconfigures.
    if o.settings.any() {
        ubtrfs_fuse::settings::client::set_options(&d, &o.settings).with_context(|| {
            format!(
                "telling the server of {} the remount's options",
                dir.display()
            )
        })?;
    }
    Ok(())
}

/// The image cannot be opened for writing (a read-only file, medium or mount), as
/// mount(8) falls back to read-only for write-protected media.
fn write_protected(e: &anyhow::Error) -> bool {
    let kind = match e.downcast_ref::<ubtrfs_core::Error>() {
        Some(ubtrfs_core::Error::Io { err, .. }) => err.kind(),
        _ => match e.downcast_ref::<std::io::Error>() {
            Some(err) => err.kind(),
            None => return false,
        },
    };
    matches!(
        kind,
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
    )
}

/// Opens the devices for the write engine: refuses devices the kernel has mounted,
/// takes exclusive locks, validates what writing needs.
/// Reports each tree block the read-only mount finds lost, once, on stderr (the
/// log file with log=, the terminal with -f): checked once a second for the life
/// of the server, and when it ends.
struct LossLog {
    fs: Arc<Filesystem>,
    said: std::sync::Mutex<usize>,
}

impl LossLog {
    fn start(fs: Arc<Filesystem>) -> Arc<LossLog> {
        let l = Arc::new(LossLog {
            fs,
            said: std::sync::Mutex::new(0),
        });
        let t = Arc::clone(&l);
        let _ = std::thread::Builder::new()
            .name("ubtrfs-losses".into())
            .spawn(move || {
                // The session's signal thread alone takes SIGINT/SIGTERM/SIGHUP.
                use nix::sys::signal::{SigSet, Signal};
                let mut sigs = SigSet::empty();
                for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
                    sigs.add(s);
                }
                let _ = sigs.thread_block();
                loop {
                    t.flush();
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            });
        l
    }

    fn flush(&self) {
        let Ok(mut said) = self.said.lock() else {
            return;
        };
        let (lost, _) = self.fs.info.lost_blocks();
        for b in lost.iter().skip(*said) {
            let from = b
                .first_key
                .map_or(String::new(), |k| format!(", keys from {k}"));
            eprintln!(
                "ubtrfs: lost: tree block {}{from}: {} (listings show what is left; reads \
                 that need it get EIO)",
                b.bytenr, b.error
            );
        }
        *said = lost.len().max(*said);
    }
}

fn open_writable(paths: &[PathBuf], opts: &OpenOptions) -> Result<Trans> {
    let mut locks = Vec::new();
    for p in paths {
        refuse_if_mounted(p).with_context(|| format!("cannot open {}", p.display()))?;
        locks.push(wait_for_lock(p, lock_exclusive)?);
    }
    let opts = OpenOptions {
        writable: true,
        ..opts.clone()
    };
    let what = || {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        format!("cannot open {}", names.join(","))
    };
    let fs = FsInfo::open_paths(paths, opts).with_context(what)?;
    let mut t = Trans::from_fs(fs).with_context(what)?;
    t.hold_locks(locks);
    Ok(t)
}

/// Shared locks on the devices of a read-only mount.
fn lock_shared(paths: &[PathBuf]) -> Result<Vec<std::fs::File>> {
    let mut locks = Vec::new();
    for p in paths {
        let f = wait_for_lock(p, |p| {
            let f = std::fs::File::open(p)?;
            match f.try_lock_shared() {
                Ok(()) => Ok(f),
                Err(std::fs::TryLockError::WouldBlock) => Err(std::io::Error::new(
                    std::io::ErrorKind::ResourceBusy,
                    format!("{} is being written by another ubtrfs process", p.display()),
                )),
                Err(std::fs::TryLockError::Error(e)) => Err(e),
            }
        })?;
        locks.push(f);
    }
    Ok(locks)
}

/// How long a mount waits for an image another ubtrfs process holds.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Takes a lock with `lock`, waiting up to LOCK_WAIT while the image is busy: umount(8)
/// of a FUSE mount returns before the server has committed its last transaction and
/// let go of the image (the kernel waits for no reply to a plain `fuse` unmount), so
/// `umount; mount` -- fstests' cycle mounts, scripts -- would find it busy for a moment.
fn wait_for_lock(
    p: &std::path::Path,
    lock: impl Fn(&std::path::Path) -> std::io::Result<std::fs::File>,
) -> Result<std::fs::File> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match lock(p) {
            Err(e)
                if e.kind() == std::io::ErrorKind::ResourceBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r.with_context(|| format!("cannot open {}", p.display())),
        }
    }
}

fn redirect_fd(f: &std::fs::File, to: i32) -> Result<()> {
    use std::os::fd::AsRawFd;
    nix::unistd::dup2(f.as_raw_fd(), to).context("dup2")?;
    Ok(())
}

fn redirect_stdio(log: Option<&std::fs::File>) -> Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .context("/dev/null")?;
    redirect_fd(&null, 0)?;
    redirect_fd(&null, 1)?;
    redirect_fd(log.unwrap_or(&null), 2)
}

/// Starts the server as a detached child (`--daemon-child`) and waits until it says
/// the mount is ready; if it fails, its message is already on our stderr.
fn spawn_detached(args: &MountArgs) -> Result<()> {
    let exe = std::env::current_exe().context("finding the ubtrfs executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&args.image)
        .arg(&args.mountpoint)
        .arg("--daemon-child")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    let mut child = cmd.spawn().context("starting the mount server")?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim_end() == "ready" {
        return Ok(());
    }
    let st = child.wait().context("waiting for the mount server")?;
    // The child printed why; exit with its status without a second message.
    std::process::exit(st.code().filter(|&c| c != 0).unwrap_or(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = parse_options(&["ro,subvol=/a b,allow_other".into(), "ino=kernel".into()])
            .expect("valid");
        assert_eq!(o.subvol.as_deref(), Some("/a b"));
        assert!(o.allow_other);
        assert_eq!(o.ino, InoMode::Kernel);
        assert_eq!(o.rw, Some(false));
        let o = parse_options(&["rw,commit=5,compress=zstd:3".into()]).expect("valid");
        assert_eq!((o.rw, o.commit_secs), (Some(true), 5));
        assert_eq!(o.compress.as_deref(), Some("zstd:3"));
        let o = parse_options(&["subtype=,allow_other".into()]).expect("valid");
        assert_eq!(o.subtype.as_deref(), Some(""));
        let o = parse_options(&["io_uring_threads=0".into()]).expect("valid");
        assert_eq!(o.uring_threads, Some(0));
        assert!(parse_options(&["io_uring_threads=x".into()]).is_err());
        assert_eq!(parse_options(&[]).expect("valid").rw, None);
        assert_eq!(parse_options(&[]).expect("valid").ino, InoMode::Unique);
        assert!(parse_options(&["compress=lz4".into()]).is_err());
        assert!(parse_options(&["bogus".into()]).is_err());
        assert!(parse_options(&["subvolid=x".into()]).is_err());
    }
}

#[cfg(test)]
mod option_tests {
    use super::parse_options;

    fn opts(s: &str) -> anyhow::Result<super::Opts> {
        parse_options(&[s.to_string()])
    }

    #[test]
    fn nologreplay_is_read_only_only() {
        for o in [
            "ro,rescue=nologreplay",
            "nologreplay,ro",
            "ro,norecovery",
            "usebackuproot,nologreplay",
        ] {
            let o = opts(o).expect("valid");
            assert!(o.nologreplay && o.rw == Some(false));
        }
        for o in ["rescue=nologreplay", "rw,norecovery"] {
            let Err(e) = opts(o) else {
                panic!("{o}: accepted");
            };
            assert!(e.to_string().contains("must be used with ro"), "{e}");
        }
    }

    #[test]
    fn older_generations_mount_read_only() {
        let o = opts("generation=7").expect("generation");
        assert_eq!((o.generation, o.rw), (Some(7), Some(false)));
        let o = opts("ro,tree_root=30408704").expect("tree_root");
        assert_eq!((o.tree_root, o.rw), (Some(30408704), Some(false)));
        let o = opts("rescue=usebackuproot").expect("usebackuproot");
        assert_eq!(o.rw, Some(false));
        assert!(
            opts("rw,generation=7").is_err(),
            "an older generation is not writable"
        );
        assert!(opts("generation=7,tree_root=1").is_err());
        assert!(opts("generation=x").is_err());
    }
}
