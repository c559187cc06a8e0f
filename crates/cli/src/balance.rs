//! `ubtrfs balance start|resume|cancel|status IMAGE`, like `btrfs balance`: the
//! same filter syntax (`-dusage=50,limit=2`, `-mconvert=dup,soft`), the same
//! messages, on an image or block device.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use ubtrfs_core::{balance_flags, BalanceArgs, BalanceEnd, BalanceProgress, BalanceRequest, Trans};

#[derive(Subcommand)]
pub enum BalanceCmd {
    /// Relocate chunks: all of them, or those the filters select.
    /// `-d[FILTERS]`, `-m[FILTERS]`, `-s[FILTERS]` as btrfs-progs takes them
    /// (usage=, devid=, drange=, vrange=, convert=, soft, limit=, stripes=,
    /// profiles=); `-m` alone also selects system chunks, with the same filters.
    Start {
        /// The image file or block device (IMAGE,DEV2,... for several devices), or
        /// a directory of a read-write ubtrfs mount.
        image: PathBuf,
        /// Data chunks (with filters: -dusage=50).
        #[arg(short = 'd', long = "data", num_args = 0..=1, require_equals = true, default_missing_value = "")]
        data: Option<String>,
        /// Metadata chunks (with filters: -mconvert=dup).
        #[arg(short = 'm', long = "metadata", num_args = 0..=1, require_equals = true, default_missing_value = "")]
        metadata: Option<String>,
        /// System chunks (needs --force, as in btrfs-progs).
        #[arg(short = 's', long = "system", num_args = 0..=1, require_equals = true, default_missing_value = "")]
        system: Option<String>,
        /// Allow reducing metadata redundancy and explicit system chunks.
        #[arg(short = 'f', long = "force")]
        force: bool,
        /// No filters: balance everything without the 10-second warning.
        #[arg(long = "full-balance")]
        full_balance: bool,
        /// Print what each relocated chunk moved (to stderr).
        #[arg(short = 'v', long = "verbose")]
        verbose: bool,
    },
    /// Continue a paused or interrupted balance (the kernel's resume rules: soft
    /// convert, usage=90 where no filter was given).
    Resume {
        /// The image file or block device.
        image: PathBuf,
    },
    /// Drop a paused balance, or stop a balance running on a ubtrfs mount (before
    /// its next chunk) and drop it.
    Cancel {
        /// The image file or block device, or a directory of a ubtrfs mount.
        image: PathBuf,
    },
    /// Pause a balance running on a ubtrfs mount before its next chunk; `resume`
    /// continues it (an image has no running balance to pause).
    Pause {
        /// A directory of a read-write ubtrfs mount.
        image: PathBuf,
    },
    /// Show whether a balance is paused, and its filters.
    Status {
        /// The image file or block device.
        image: PathBuf,
    },
}

/// btrfs-progs takes filters glued to the option (`-dusage=50`); clap takes
/// them after `=` of the long form. Rewrites `balance start`'s arguments so.
pub fn rewrite_args(args: Vec<OsString>) -> Vec<OsString> {
    let is_start = args
        .iter()
        .skip(1)
        .map(|a| a.to_str().unwrap_or(""))
        .filter(|a| !a.starts_with('-'))
        .take(2)
        .eq(["balance", "start"]);
    if !is_start {
        return args;
    }
    args.into_iter()
        .map(|a| {
            let Some(s) = a.to_str() else { return a };
            for (short, long) in [
                ("-d", "--data="),
                ("-m", "--metadata="),
                ("-s", "--system="),
            ] {
                if let Some(rest) = s.strip_prefix(short) {
                    if !rest.is_empty() && !s.starts_with("--") {
                        return OsString::from(format!("{long}{rest}"));
                    }
                }
            }
            a
        })
        .collect()
}

fn parse(kind: &str, text: &str) -> Result<BalanceArgs> {
    BalanceArgs::parse_filters(text).map_err(|e| anyhow::anyhow!("{kind} filters: {e}"))
}

/// The devices of IMAGE[,DEV2...] (a multi-device filesystem).
fn devices(image: &Path) -> Vec<PathBuf> {
    crate::edit::image_paths(image)
}

/// A directory: the mount's root (or any directory of it), asked through the
/// balance ioctls ([`ubtrfs_fuse::balance_ops`]).
fn mounted(p: &Path) -> Result<Option<std::fs::File>> {
    if !p.is_dir() {
        return Ok(None);
    }
    Ok(Some(
        std::fs::File::open(p).with_context(|| p.display().to_string())?,
    ))
}

fn balance_on_mount(
    f: &std::fs::File,
    mnt: &Path,
    req: &BalanceRequest,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    match ubtrfs_fuse::balance_ops::client::balance(f, req) {
        Ok([_, considered, completed]) => print_done(out, completed, considered),
        // Stopped by `balance pause` or `cancel`: which one, the image says.
        Err(e) if e.raw_os_error() == Some(nix::libc::ECANCELED) => {
            if paused_on_mount(mnt)?.is_some() {
                eprintln!("balance paused by user");
            } else {
                eprintln!("balance canceled by user");
            }
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("error during balancing '{}'", mnt.display())),
    }
}

/// The paused balance of an image (its BALANCE item).
fn paused(devices: &[PathBuf]) -> Result<Option<BalanceRequest>> {
    let fs = ubtrfs_core::Filesystem::open_paths(devices, Default::default())?;
    let rt = fs.info.root_tree_ptr();
    let key = ubtrfs_core::format::key::Key::new(
        ubtrfs_core::format::consts::BALANCE_OBJECTID,
        ubtrfs_core::format::consts::TEMPORARY_ITEM_KEY,
        0,
    );
    match ubtrfs_core::lookup_exact(&fs.info, &rt, &key)? {
        None => Ok(None),
        Some(item) => Ok(Some(BalanceRequest::parse(item.data())?)),
    }
}

/// The paused balance of a mounted filesystem, read from its image after a
/// commit.
fn paused_on_mount(mnt: &Path) -> Result<Option<BalanceRequest>> {
    let image = crate::quota::image_of_mount(mnt)?;
    paused(&devices(&image))
}

/// btrfs-progs' closing line of a balance.
fn print_done(out: &mut dyn std::io::Write, completed: u64, considered: u64) -> Result<()> {
    writeln!(
        out,
        "Done, had to relocate {completed} out of {considered} chunks"
    )?;
    Ok(())
}

pub fn run(cmd: BalanceCmd, out: &mut dyn std::io::Write) -> Result<()> {
    match cmd {
        BalanceCmd::Start {
            image,
            data,
            metadata,
            system,
            force,
            full_balance,
            verbose,
        } => {
            let mut req = BalanceRequest::default();
            if let Some(d) = &data {
                req.flags |= balance_flags::DATA;
                req.data = parse("data", d)?;
            }
            if let Some(m) = &metadata {
                req.flags |= balance_flags::METADATA;
                req.meta = parse("metadata", m)?;
            }
            if let Some(s) = &system {
                if !force {
                    bail!(
                        "Refusing to explicitly operate on system chunks. \
                         Pass --force if you really want to do that."
                    );
                }
                req.flags |= balance_flags::SYSTEM;
                req.sys = parse("system", s)?;
            } else if metadata.is_some() {
                // progs: metadata filters apply to system chunks too.
                req.flags |= balance_flags::SYSTEM;
                req.sys = req.meta;
            }
            if data.is_none() && metadata.is_none() && system.is_none() {
                req.flags |= balance_flags::DATA | balance_flags::METADATA | balance_flags::SYSTEM;
                if !full_balance {
                    eprintln!(
                        "WARNING:\n\n\tFull balance without filters requested. This operation is very\n\
                         \tintense and takes potentially very long. It is recommended to\n\
                         \tuse the balance filters to narrow down the scope of balance.\n\
                         \tUse 'ubtrfs balance start --full-balance' option to skip this\n\
                         \twarning. The operation will start in 10 seconds.\n\
                         \tUse Ctrl-C to stop it."
                    );
                    for i in (1..=10).rev() {
                        eprint!("{i}");
                        std::thread::sleep(std::time::Duration::from_secs(1));
                        eprint!(" ");
                    }
                    eprintln!("\nStarting balance without any filters.");
                }
            }
            if force {
                req.flags |= balance_flags::FORCE;
            }
            if let Some(f) = mounted(&image)? {
                return balance_on_mount(&f, &image, &req, out);
            }
            let mut t = Trans::open_paths(&devices(&image))?;
            if t.balance_item()?.is_some() {
                bail!(
                    "{}: a balance is paused; resume or cancel it first",
                    image.display()
                );
            }
            run_balance(&mut t, &image, &req, verbose, out)
        }
        BalanceCmd::Resume { image } => {
            if let Some(f) = mounted(&image)? {
                let req = BalanceRequest {
                    flags: balance_flags::RESUME,
                    ..Default::default()
                };
                return balance_on_mount(&f, &image, &req, out);
            }
            let mut t = Trans::open_paths(&devices(&image))?;
            let Some(req) = t.balance_item()? else {
                bail!("{}: no balance to resume (not paused)", image.display());
            };
            let req = req.for_resume();
            run_balance(&mut t, &image, &req, false, out)
        }
        BalanceCmd::Pause { image } => {
            let Some(f) = mounted(&image)? else {
                bail!(
                    "balance pause on '{}' failed: Not in progress (only a mount runs one)",
                    image.display()
                );
            };
            match ubtrfs_fuse::balance_ops::client::ctl(&f, 1) {
                Ok(()) => Ok(()),
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOTCONN) => {
                    bail!("balance pause on '{}' failed: Not running", image.display())
                }
                Err(e) => Err(e).context("balance pause"),
            }
        }
        BalanceCmd::Cancel { image } => {
            if let Some(f) = mounted(&image)? {
                // A running balance stops before its next chunk; a paused one is
                // dropped.
                return match ubtrfs_fuse::balance_ops::client::ctl(&f, 2) {
                    Ok(()) => Ok(()),
                    Err(e) if e.raw_os_error() == Some(nix::libc::ENOTCONN) => bail!(
                        "balance cancel on '{}' failed: Not in progress",
                        image.display()
                    ),
                    Err(e) => Err(e).context("balance cancel"),
                };
            }
            let mut t = Trans::open_paths(&devices(&image))?;
            if t.balance_item()?.is_none() {
                bail!(
                    "balance cancel on '{}' failed: Not in progress",
                    image.display()
                );
            }
            t.balance_cancel()?;
            Ok(())
        }
        BalanceCmd::Status { image } => {
            let found = match mounted(&image)? {
                Some(f) => {
                    if let Some(r) = ubtrfs_fuse::balance_ops::client::progress(&f)? {
                        let asked = if r.cancel_requested {
                            ", cancel requested"
                        } else if r.pause_requested {
                            ", pause requested"
                        } else {
                            ""
                        };
                        writeln!(out, "Balance on '{}' is running{asked}", image.display())?;
                        let left = if r.expected == 0 {
                            0.0
                        } else {
                            100.0 * (1.0 - r.completed as f64 / r.expected as f64)
                        };
                        writeln!(
                            out,
                            "{} out of about {} chunks balanced ({} considered), {left:3.0}% left",
                            r.completed, r.expected, r.considered
                        )?;
                        return Ok(());
                    }
                    paused_on_mount(&image)?
                }
                None => paused(&devices(&image))?,
            };
            match found {
                None => writeln!(out, "No balance found on '{}'", image.display())?,
                Some(req) => {
                    writeln!(out, "Balance on '{}' is paused", image.display())?;
                    for (bit, name, a) in [
                        (balance_flags::DATA, "DATA", &req.data),
                        (balance_flags::METADATA, "METADATA", &req.meta),
                        (balance_flags::SYSTEM, "SYSTEM", &req.sys),
                    ] {
                        if req.flags & bit != 0 {
                            writeln!(out, "  {name} (flags {:#x})", a.flags)?;
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

/// Ctrl-C (SIGINT, or SIGTERM) during an offline balance pauses it before the
/// next chunk, keeping the BALANCE item for `balance resume` (or the kernel, at
/// mount); a second one ends the program at once (what is committed stays). The
/// signals are taken by a thread that waits for them, so nothing runs inside a
/// signal handler.
fn pause_on_interrupt() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use nix::sys::signal::{SigSet, Signal};
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut sigs = SigSet::empty();
    sigs.add(Signal::SIGINT);
    sigs.add(Signal::SIGTERM);
    if sigs.thread_block().is_err() {
        return flag;
    }
    let f = flag.clone();
    let spawned = std::thread::Builder::new()
        .name("ubtrfs-balance-signal".into())
        .spawn(move || {
            while let Ok(sig) = sigs.wait() {
                if f.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    std::process::exit(128 + sig as i32);
                }
                eprintln!(
                    "{sig}: pausing the balance after the chunk being moved (again to stop now)"
                );
            }
        });
    if spawned.is_err() {
        let _ = sigs.thread_unblock();
    }
    flag
}

fn run_balance(
    t: &mut Trans,
    image: &Path,
    req: &BalanceRequest,
    verbose: bool,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    let bar = crate::fmt::spinner(true, "{spinner} {msg} [{elapsed}]");
    // Tests pause a balance after N chunks (what `btrfs balance pause` does on a
    // mount), to prove the kernel and `balance resume` finish it.
    let stop_after: Option<u64> = std::env::var("UBTRFS_BALANCE_STOP_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let done = std::cell::Cell::new(0u64);
    let mut total = ubtrfs_core::RelocStats::default();
    let mut progress = |p: &BalanceProgress, s: Option<&ubtrfs_core::RelocStats>| {
        done.set(p.completed);
        if let Some(s) = s {
            total.blocks_rewritten += s.blocks_rewritten;
            total.blocks_in_group += s.blocks_in_group;
            total.data_extents += s.data_extents;
            total.data_bytes += s.data_bytes;
            total.nodes_visited += s.nodes_visited;
            total.trace_full_extents += s.trace_full_extents;
            total.qgroup_extents += s.qgroup_extents;
            if verbose {
                bar.suspend(|| {
                    eprintln!(
                        "relocated chunk {}: {} tree blocks in it, {} rewritten; {} data extents ({} bytes)",
                        p.completed, s.blocks_in_group, s.blocks_rewritten, s.data_extents, s.data_bytes
                    )
                });
            }
        }
        bar.set_message(format!(
            "{} of about {} chunks relocated ({} considered)",
            p.completed, p.expected, p.considered
        ));
        bar.tick();
    };
    let interrupted = pause_on_interrupt();
    // Tests: time to interrupt between chunks (as on a mount, balance_ops.rs).
    let delay = std::env::var("UBTRFS_BALANCE_STEP_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(std::time::Duration::from_millis);
    let stop = || {
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        stop_after.is_some_and(|n| done.get() >= n)
            || interrupted.load(std::sync::atomic::Ordering::Acquire)
    };
    let (end, p) = t
        .balance(req, &mut progress, &stop)
        .with_context(|| format!("error during balancing '{}'", image.display()))?;
    bar.finish_and_clear();
    if verbose {
        eprintln!(
            "total: {} tree blocks rewritten ({} in the chunks), {} data extents ({} bytes), \
             {} nodes read; quota: {} extents accounted, {} a whole-subtree trace would record",
            total.blocks_rewritten,
            total.blocks_in_group,
            total.data_extents,
            total.data_bytes,
            total.nodes_visited,
            total.qgroup_extents,
            total.trace_full_extents
        );
    }
    match end {
        BalanceEnd::Finished => print_done(out, p.completed, p.considered)?,
        // On stderr, as btrfs-progs prints it.
        BalanceEnd::Paused => eprintln!("balance paused by user"),
        // btrfs-progs prints no "Done" line when the ioctl fails; the count the
        // kernel logs (there is no syslog here) goes in the error line.
        BalanceEnd::NoSpace(n) => {
            bail!(
                "error during balancing '{}': No space left on device ({n} enospc errors during balance)",
                image.display()
            );
        }
    }
    Ok(())
}
