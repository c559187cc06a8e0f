//! A mounted session: the INIT handshake, the serving threads, and unmounting on
//! SIGINT/SIGTERM/SIGHUP.

use crate::abi::{self, init, op, Args, Out};
use crate::channel::Channel;
use crate::ops::Ops;
use crate::reply::Reply;
use nix::sys::signal::{SigSet, Signal};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

/// Kernel-side tuning negotiated at INIT.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Largest READ request (bytes; the kernel caps it at 256 pages).
    pub max_read: u32,
    /// Readahead window for the mount's backing device info, in KiB; None leaves
    /// the kernel's default (128 KiB for FUSE). Needs root (sysfs).
    pub readahead_kb: Option<u32>,
    /// Threads reading /dev/fuse; each answers the requests it reads.
    pub threads: usize,
    /// Serve through FUSE over io_uring when the kernel offers it (module `uring`):
    /// this many threads per CPU queue, 0 for /dev/fuse only.
    pub uring_threads_per_cpu: usize,
}

/// Largest write request we accept: 1 MiB (max_pages 256), so a large write becomes
/// few, large extents.
const MAX_WRITE: u32 = 1 << 20;
/// Request buffer: the largest request is a WRITE (header + write_in + data) or a
/// SETXATTR with a 64 KiB value.
const BUF_SIZE: usize = MAX_WRITE as usize + (64 << 10) + 4096;

/// A mounted FUSE connection and the threads that serve it.
pub struct Session {
    ch: Arc<Channel>,
    ops: Arc<Ops>,
    tuning: Tuning,
    /// The kernel took FUSE_OVER_IO_URING: requests come through per-CPU rings.
    uring: bool,
    /// Set once a ring has served a request: the kernel sends requests to the rings
    /// now, and /dev/fuse only FORGET and INTERRUPT ([`serve`]).
    rings_serving: Arc<AtomicBool>,
}

impl Session {
    /// Takes a freshly mounted channel through the INIT handshake. Once this
    /// returns, the mount is usable (requests queue until `run`).
    pub fn new(ch: Channel, ops: Ops, tuning: Tuning) -> io::Result<Session> {
        let mut s = Session {
            ch: Arc::new(ch),
            ops: Arc::new(ops),
            tuning,
            uring: false,
            rings_serving: Arc::new(AtomicBool::new(false)),
        };
        match s.handshake() {
            Ok(uring) => s.uring = uring,
            Err(e) => {
                let _ = s.ch.unmount();
                return Err(e);
            }
        }
        s.tune_readahead();
        Ok(s)
    }

    /// Answers INIT; returns whether FUSE over io_uring was agreed.
    fn handshake(&self) -> io::Result<bool> {
        let mut buf = vec![0u8; BUF_SIZE];
        loop {
            let Some(n) = self.ch.receive(&mut buf)? else {
                return Err(io::Error::other("unmounted before the FUSE handshake"));
            };
            let Some((h, body)) = abi::parse_header(&buf[..n]) else {
                return Err(io::Error::other("malformed request from /dev/fuse"));
            };
            let reply = Reply::new(&self.ch, h.unique);
            if h.opcode != op::INIT {
                reply.error(crate::ops::errno::EIO);
                return Err(io::Error::other(format!(
                    "FUSE request {} before INIT",
                    h.opcode
                )));
            }
            let mut a = Args::new(body);
            let (Some(major), Some(minor), Some(max_readahead), Some(flags)) =
                (a.u32(), a.u32(), a.u32(), a.u32())
            else {
                reply.error(crate::ops::errno::EIO);
                return Err(io::Error::other("short FUSE INIT request"));
            };
            let flags2 = if flags & init::INIT_EXT != 0 {
                a.u32().unwrap_or(0)
            } else {
                0
            };
            let mut o = Out::with_capacity(64);
            if major > abi::KERNEL_VERSION {
                // Newer major: state ours, the kernel retries INIT with it.
                o.u32(abi::KERNEL_VERSION)
                    .u32(abi::KERNEL_MINOR_VERSION)
                    .zeros(56);
                reply.ok(&o.buf);
                continue;
            }
            if major < abi::KERNEL_VERSION || minor < 12 {
                reply.error(71); // EPROTO
                return Err(io::Error::other(format!(
                    "kernel FUSE protocol {major}.{minor} is too old"
                )));
            }
            // Always READDIRPLUS (not READDIRPLUS_AUTO): attributes come with the
            // names, so `ls -l`, `find -ls`, tar, cp -a and du need no LOOKUP per
            // entry; the kernel's adaptive mode fell back to plain READDIR after
            // the first 4 KiB of a directory and then looked every entry up.
            let want = init::ASYNC_READ
                | init::BIG_WRITES
                | init::DO_READDIRPLUS
                | init::PARALLEL_DIROPS
                | init::POSIX_ACL
                // The umask comes with each create for us to apply, or not when the
                // directory has a default ACL (write_ops.rs new_inode).
                | init::DONT_MASK
                | init::MAX_PAGES
                // No GETXATTR of security.capability before every write and no
                // GETATTR before every chown: the server clears setuid/setgid.
                | init::HANDLE_KILLPRIV_V2
                // An access ACL set by a caller outside the file's group and
                // without CAP_FSETID drops setgid: the kernel says so in the request.
                | init::SETXATTR_EXT
                | init::EXPORT_SUPPORT;
            // Read-only, link targets stay in the kernel's page cache. Read-write,
            // every readlink and link followed comes to us: it may update the link's
            // atime (module `atime`), which a cached target would skip.
            let want = if self.ops.engine.writable() {
                want
            } else {
                want | init::CACHE_SYMLINKS
            };
            let page = 4096u32;
            let max_pages = (self.tuning.max_read.div_ceil(page)).clamp(1, 256) as u16;
            // The kernel offers io_uring only with its enable_uring parameter set.
            let uring = self.tuning.uring_threads_per_cpu > 0
                && flags2 & init::FLAGS2_OVER_IO_URING != 0
                && crate::uring::possible_cpus().is_some();
            let mut flags2_out = flags2 & init::FLAGS2_DIRECT_IO_ALLOW_MMAP;
            if uring {
                flags2_out |= init::FLAGS2_OVER_IO_URING;
            }
            let ext = if flags2_out != 0 { init::INIT_EXT } else { 0 };
            o.u32(abi::KERNEL_VERSION)
                .u32(minor.min(abi::KERNEL_MINOR_VERSION))
                .u32(max_readahead.max(self.tuning.max_read))
                .u32(flags & (want | ext))
                .u16(64) // max_background: outstanding readahead requests
                .u16(48) // congestion_threshold
                .u32(MAX_WRITE)
                .u32(1) // time_gran: nanoseconds
                .u16(max_pages)
                .u16(0) // map_alignment
                .u32(flags2_out)
                .u32(0) // max_stack_depth
                .zeros(24);
            self.ops.set_kernel_flags(flags, flags2_out);
            let body = if minor < 23 { &o.buf[..24] } else { &o.buf[..] };
            reply.ok(body);
            return Ok(uring);
        }
    }

    /// Widens the kernel's readahead for this mount (FUSE starts at 128 KiB; the
    /// kernel's btrfs uses 4 MiB). Best effort: needs write access to sysfs.
    fn tune_readahead(&self) {
        let Some(kb) = self.tuning.readahead_kb else {
            return;
        };
        // Not stat(2) on the mountpoint: nobody serves it yet.
        let Some(dev) = crate::mount_dev(self.ch.mountpoint()) else {
            return;
        };
        let p = format!("/sys/class/bdi/{dev}/read_ahead_kb");
        if std::fs::write(&p, kb.to_string()).is_err() && nix::unistd::geteuid().is_root() {
            eprintln!("ubtrfs: warning: could not set {p} to {kb}");
        }
    }

    /// Serves requests until the filesystem is unmounted (by `fusermount3 -u`,
    /// `umount`, or a SIGINT/SIGTERM/SIGHUP, which unmount it).
    pub fn run(self) -> io::Result<()> {
        let mut sigs = SigSet::empty();
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            sigs.add(s);
        }
        // Blocked here, inherited by every thread spawned below; only the signal
        // thread receives them.
        sigs.thread_block().map_err(io::Error::from)?;
        let ch = self.ch.clone();
        thread::Builder::new()
            .name("ubtrfs-signal".into())
            .spawn(move || {
                if let Ok(sig) = sigs.wait() {
                    if let Err(e) = ch.unmount() {
                        eprintln!(
                            "ubtrfs: {sig}: unmounting {} failed: {e}",
                            ch.mountpoint().display()
                        );
                        std::process::exit(1);
                    }
                }
            })?;
        let mut workers = Vec::new();
        for i in 0..self.tuning.threads.max(1) {
            let ch = self.ch.clone();
            let ops = self.ops.clone();
            let rings = self.rings_serving.clone();
            workers.push(
                thread::Builder::new()
                    .name(format!("ubtrfs-fuse-{i}"))
                    .spawn(move || serve(&ch, &ops, i == 0, &rings))?,
            );
        }
        let rings = if self.uring {
            // Not fatal: without every queue the rings never start, and /dev/fuse
            // serves (stopping here would end a mount that is serving).
            self.spawn_rings().unwrap_or_else(|(started, e)| {
                eprintln!("ubtrfs: FUSE over io_uring not started: {e}; serving through /dev/fuse");
                started
            })
        } else {
            Vec::new()
        };
        let mut result = Ok(());
        let stats = std::env::var_os("UBTRFS_FUSE_STATS").is_some();
        for w in workers {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(io::Error::other("a FUSE worker thread panicked")),
            }
        }
        // /dev/fuse is gone: the kernel ends every ring command as it tears the
        // connection down. Wait for that, but not forever.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for r in rings {
            while !r.is_finished() && std::time::Instant::now() < deadline {
                thread::sleep(std::time::Duration::from_millis(10));
            }
            if r.is_finished() {
                if let Ok(Err(e)) = r.join() {
                    eprintln!("ubtrfs: FUSE over io_uring: {e}");
                }
            }
        }
        if stats {
            print_counts();
        }
        result
    }
}

impl Session {
    /// Starts the threads of every CPU queue of FUSE over io_uring. A queue whose
    /// ring cannot be set up leaves the rings unready, and /dev/fuse keeps serving.
    fn spawn_rings(&self) -> Result<Vec<RingThread>, (Vec<RingThread>, io::Error)> {
        let cpus = crate::uring::possible_cpus().unwrap_or(1);
        // The kernel's largest request: max_write, or max_pages pages of data.
        let page = page_size();
        let max_pages = self.tuning.max_read.div_ceil(4096).clamp(1, 256) as usize;
        let payload = (MAX_WRITE as usize).max(max_pages * page).max(8192);
        let mut v = Vec::new();
        for qid in 0..cpus {
            let threads = if crate::uring::cpu_online(qid) {
                self.tuning.uring_threads_per_cpu
            } else {
                1
            };
            for i in 0..threads {
                let ch = self.ch.clone();
                let ops = self.ops.clone();
                let serving = self.rings_serving.clone();
                let Ok(qid16) = u16::try_from(qid) else {
                    return Err((v, io::Error::other("too many CPUs")));
                };
                let spawned = thread::Builder::new()
                    .name(format!("ubtrfs-ring-{qid}.{i}"))
                    .spawn(move || {
                        let counted = |h: &abi::InHeader, took: std::time::Duration| {
                            serving.store(true, Ordering::Relaxed);
                            count_ring(h, took);
                        };
                        let r = crate::uring::serve_queue(&ch, &ops, qid16, payload, &counted);
                        if let Err(e) = &r {
                            eprintln!("ubtrfs: FUSE over io_uring queue {qid}: {e}");
                        }
                        r
                    });
                match spawned {
                    Ok(t) => v.push(t),
                    Err(e) => return Err((v, e)),
                }
            }
        }
        URING_ACTIVE.store(true, Ordering::Relaxed);
        Ok(v)
    }
}

/// A thread serving one io_uring queue entry.
type RingThread = thread::JoinHandle<io::Result<()>>;

/// The kernel's page size (the ring payload must hold max_pages of them).
fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(4096)
}

/// Set once ring threads run (reported with the request counts).
static URING_ACTIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Requests that came through FUSE over io_uring.
static URING_SERVED: AtomicU64 = AtomicU64::new(0);

/// Counts a request served through a ring.
fn count_ring(h: &abi::InHeader, took: std::time::Duration) {
    URING_SERVED.fetch_add(1, Ordering::Relaxed);
    count(h, took);
}

/// Counts a request served (and its time, with UBTRFS_FUSE_STATS).
fn count(h: &abi::InHeader, took: std::time::Duration) {
    if let Some(c) = COUNTS.get(h.opcode as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(t) = NANOS.get(h.opcode as usize) {
        t.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// Requests served, by opcode (printed at exit when UBTRFS_FUSE_STATS is set).
static COUNTS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
/// Time spent answering them, by opcode (nanoseconds; counted with UBTRFS_FUSE_STATS).
static NANOS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

fn print_counts() {
    let mut v: Vec<(u64, usize)> = COUNTS
        .iter()
        .enumerate()
        .map(|(i, c)| (c.load(Ordering::Relaxed), i))
        .filter(|(n, _)| *n > 0)
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    let list: Vec<String> = v
        .iter()
        .map(|(n, i)| {
            let ns = NANOS.get(*i).map_or(0, |t| t.load(Ordering::Relaxed));
            format!("op{i}:{n} ({} us each)", ns / n.max(&1) / 1000)
        })
        .collect();
    let via = if URING_ACTIVE.load(Ordering::Relaxed) {
        format!(
            " ({} through io_uring)",
            URING_SERVED.load(Ordering::Relaxed)
        )
    } else {
        String::new()
    };
    eprintln!("ubtrfs: FUSE requests served{via}: {}", list.join(" "));
}

/// One worker: read a request, answer it, repeat until the connection goes away.
fn serve(ch: &Channel, ops: &Ops, first: bool, rings_serving: &AtomicBool) -> io::Result<()> {
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        if !first && rings_serving.load(Ordering::Relaxed) {
            // The kernel hands requests to the rings now: /dev/fuse brings only
            // FORGET and INTERRUPT, for which one thread is enough. Gathering the
            // forgets there matters: an `rm` of many files makes one FORGET per
            // file, and a reader per FORGET cost a wakeup each.
            return Ok(());
        }
        let Some(n) = ch.receive(&mut buf)? else {
            return Ok(());
        };
        let Some((h, body)) = abi::parse_header(&buf[..n]) else {
            continue;
        };
        let reply = Reply::new(ch, h.unique);
        if h.opcode == op::INIT {
            reply.error(crate::ops::errno::EIO);
            continue;
        }
        let t0 = std::time::Instant::now();
        ops.dispatch(&h, body, reply);
        count(&h, t0.elapsed());
        if h.opcode == op::DESTROY {
            return Ok(());
        }
        if matches!(h.opcode, op::FORGET | op::BATCH_FORGET)
            && rings_serving.load(Ordering::Relaxed)
        {
            // Let the kernel queue the next ones: its next read answers with all of
            // them in one BATCH_FORGET. An INTERRUPT waits this long at most.
            thread::sleep(FORGET_GATHER);
        }
    }
}

/// How long the one /dev/fuse reader left under FUSE over io_uring waits after a
/// FORGET before reading again (see [`serve`]).
const FORGET_GATHER: std::time::Duration = std::time::Duration::from_millis(1);
