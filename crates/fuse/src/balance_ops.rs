//! The btrfs balance ioctls on a read-write mount, with the kernel's argument
//! struct (`struct btrfs_ioctl_balance_args`, 1024 bytes): BALANCE_V2 runs a
//! balance (or, with the RESUME flag, continues a paused one) inside its request,
//! a chunk at a time with the writer released in between, and answers with its
//! counters; meanwhile, from other requests, BALANCE_PROGRESS reports it and
//! BALANCE_CTL pauses or cancels it before its next chunk (the BALANCE_V2 request
//! then fails with ECANCELED, as on the kernel). With no balance running,
//! BALANCE_CTL cancel drops a paused one, and both answer ENOTCONN otherwise.
//!
//! btrfs-progs' own `btrfs balance` does not reach here (it checks statfs's
//! f_type first); `ubtrfs balance start|resume|status|cancel MNT` sends these
//! ([`client`]).

use crate::abi::InHeader;
use crate::ops::{admin_only, errno, Ops};
use crate::writer::Engine;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use ubtrfs_core::{
    balance_flags, BalanceArgs, BalanceEnd, BalanceRequest, BalanceStep, BALANCE_ARGS_SIZE,
};

const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | (0x94 << 8) | nr
}
const WRITE: u32 = 1;
const READ: u32 = 2;
/// Size of `struct btrfs_ioctl_balance_args`.
pub const BALANCE_ARGS_IOCTL_SIZE: usize = 1024;
/// `_IOWR(0x94, 32, struct btrfs_ioctl_balance_args)`.
pub(crate) const BTRFS_IOC_BALANCE_V2: u32 = ioc(WRITE | READ, 32, 1024);
/// `_IOW(0x94, 33, int)`: 1 pause, 2 cancel.
pub(crate) const BTRFS_IOC_BALANCE_CTL: u32 = ioc(WRITE, 33, 4);
/// `_IOR(0x94, 34, struct btrfs_ioctl_balance_args)`.
pub(crate) const BTRFS_IOC_BALANCE_PROGRESS: u32 = ioc(READ, 34, 1024);

/// Offsets in `struct btrfs_ioctl_balance_args`: flags, state, the data,
/// metadata and system args, then stat {expected, considered, completed}.
const DATA_AT: usize = 16;
const META_AT: usize = DATA_AT + BALANCE_ARGS_SIZE;
const SYS_AT: usize = META_AT + BALANCE_ARGS_SIZE;
const STAT_AT: usize = SYS_AT + BALANCE_ARGS_SIZE;

/// True for the commands this module answers.
pub(crate) fn is_balance_ioctl(cmd: u32) -> bool {
    matches!(
        cmd,
        BTRFS_IOC_BALANCE_V2 | BTRFS_IOC_BALANCE_CTL | BTRFS_IOC_BALANCE_PROGRESS
    )
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, i32> {
    let s = b.get(at..at + 8).ok_or(errno::EINVAL)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_ne_bytes(a))
}

/// The request in an ioctl argument.
pub fn request_from_ioctl(b: &[u8]) -> Result<BalanceRequest, i32> {
    let args = |at: usize| -> Result<BalanceArgs, i32> {
        let s = b.get(at..at + BALANCE_ARGS_SIZE).ok_or(errno::EINVAL)?;
        BalanceArgs::parse(s).map_err(|_| errno::EINVAL)
    };
    Ok(BalanceRequest {
        flags: u64_at(b, 0)?,
        data: args(DATA_AT)?,
        meta: args(META_AT)?,
        sys: args(SYS_AT)?,
    })
}

/// An ioctl argument holding `req` (and, after the run, its counters).
pub fn request_to_ioctl(req: &BalanceRequest, stat: [u64; 3]) -> Vec<u8> {
    let mut b = vec![0u8; BALANCE_ARGS_IOCTL_SIZE];
    b[0..8].copy_from_slice(&req.flags.to_ne_bytes());
    b[DATA_AT..META_AT].copy_from_slice(&req.data.to_bytes());
    b[META_AT..SYS_AT].copy_from_slice(&req.meta.to_bytes());
    b[SYS_AT..STAT_AT].copy_from_slice(&req.sys.to_bytes());
    for (i, v) in stat.iter().enumerate() {
        b[STAT_AT + i * 8..STAT_AT + i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    b
}

/// `state` bits of the ioctl argument (BTRFS_BALANCE_STATE_*).
const STATE_RUNNING: u64 = 1 << 0;
const STATE_PAUSE_REQ: u64 = 1 << 1;
const STATE_CANCEL_REQ: u64 = 1 << 2;
/// BALANCE_CTL's argument.
const CTL_PAUSE: u32 = 1;
const CTL_CANCEL: u32 = 2;

/// A balance running on the mount: its request, what was asked of it since it
/// started (pause or cancel, checked between chunks), and its counters.
#[derive(Debug)]
pub(crate) struct RunningBalance {
    req: BalanceRequest,
    /// 0, or the BALANCE_CTL command asked (cancel wins over pause).
    ctl: AtomicU32,
    expected: AtomicU64,
    considered: AtomicU64,
    completed: AtomicU64,
}

impl RunningBalance {
    fn stat(&self) -> [u64; 3] {
        [
            self.expected.load(Ordering::Acquire),
            self.considered.load(Ordering::Acquire),
            self.completed.load(Ordering::Acquire),
        ]
    }
}

impl Ops {
    /// One balance ioctl; returns the bytes to copy back.
    pub(crate) fn balance_ioctl(
        &self,
        h: &InHeader,
        cmd: u32,
        input: &[u8],
    ) -> Result<Vec<u8>, i32> {
        admin_only(h)?;
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        let running = self.balance.lock().map_err(|_| errno::EIO)?.clone();
        match cmd {
            BTRFS_IOC_BALANCE_PROGRESS => {
                let Some(r) = running else {
                    return Err(errno::ENOTCONN);
                };
                let mut state = STATE_RUNNING;
                match r.ctl.load(Ordering::Acquire) {
                    CTL_PAUSE => state |= STATE_PAUSE_REQ,
                    CTL_CANCEL => state |= STATE_CANCEL_REQ,
                    _ => {}
                }
                let mut out = request_to_ioctl(&r.req, r.stat());
                out[8..16].copy_from_slice(&state.to_ne_bytes());
                Ok(out)
            }
            BTRFS_IOC_BALANCE_CTL => {
                let what = input
                    .get(..4)
                    .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or(errno::EINVAL)?;
                if what != CTL_PAUSE && what != CTL_CANCEL {
                    return Err(errno::EINVAL);
                }
                match running {
                    Some(r) => {
                        // Cancel replaces a pause asked before; a pause does not
                        // undo a cancel.
                        let _ = r.ctl.fetch_max(what, Ordering::AcqRel);
                        Ok(Vec::new())
                    }
                    // Cancelling a paused balance drops its item, as the kernel.
                    None if what == CTL_CANCEL => {
                        w.change("balance cancel", |t| t.balance_cancel())
                            .map_err(|e| {
                                if e == errno::ENOENT {
                                    errno::ENOTCONN
                                } else {
                                    e
                                }
                            })?;
                        Ok(Vec::new())
                    }
                    None => Err(errno::ENOTCONN),
                }
            }
            _ => self.run_balance(w, input),
        }
    }

    /// BALANCE_V2: starts (or resumes) a balance and drives it a chunk at a time,
    /// the writer taken for one chunk each, so other requests are served in
    /// between; a pause or cancel asked meanwhile stops it before the next chunk
    /// (ECANCELED, as the kernel answers; a paused balance keeps its item).
    fn run_balance(&self, w: &crate::writer::Writer, input: &[u8]) -> Result<Vec<u8>, i32> {
        let asked = request_from_ioctl(input)?;
        let (run, req) = {
            let mut slot = self.balance.lock().map_err(|_| errno::EIO)?;
            if slot.is_some() {
                return Err(errno::EINPROGRESS);
            }
            let (run, req) = w.change("balance", |t| {
                let req = if asked.flags & balance_flags::RESUME != 0 {
                    match t.balance_item()? {
                        Some(r) => r.for_resume(),
                        None => {
                            return Err(ubtrfs_core::Error::NotFound("a paused balance".into()))
                        }
                    }
                } else {
                    if t.balance_item()?.is_some() {
                        return Err(ubtrfs_core::Error::Busy(
                            "a balance is paused: resume or cancel it".into(),
                        ));
                    }
                    asked
                };
                Ok((t.balance_start(&req)?, req))
            })?;
            let r = Arc::new(RunningBalance {
                req,
                ctl: AtomicU32::new(0),
                expected: AtomicU64::new(run.progress.expected),
                considered: AtomicU64::new(0),
                completed: AtomicU64::new(0),
            });
            *slot = Some(r.clone());
            (run, r)
        };
        let mut run = run;
        // Tests: time to ask for progress, a pause or a cancel between chunks.
        let delay = std::env::var("UBTRFS_BALANCE_STEP_DELAY_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(std::time::Duration::from_millis);
        let res = loop {
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            if req.ctl.load(Ordering::Acquire) != 0 {
                break Ok(BalanceEnd::Paused);
            }
            match w.change("balance", |t| t.balance_step(&mut run)) {
                Ok(BalanceStep::Looked(_)) => {
                    req.considered
                        .store(run.progress.considered, Ordering::Release);
                    req.completed
                        .store(run.progress.completed, Ordering::Release);
                }
                Ok(BalanceStep::Done(end)) => break Ok(end),
                Err(e) => break Err(e),
            }
        };
        // Always finished, so allocation stops converting, whatever happened; a
        // failed step leaves the item like a pause (the kernel resumes it).
        let after = *res.as_ref().unwrap_or(&BalanceEnd::Paused);
        let finished = w.change("balance", |t| t.balance_finish(&run, Ok(after)));
        let cancelled =
            req.ctl.load(Ordering::Acquire) == CTL_CANCEL && after == BalanceEnd::Paused;
        let dropped = if cancelled && res.is_ok() && finished.is_ok() {
            w.change("balance cancel", |t| t.balance_cancel())
        } else {
            Ok(())
        };
        if let Ok(mut slot) = self.balance.lock() {
            *slot = None;
        }
        let end = res?;
        finished?;
        dropped?;
        match end {
            BalanceEnd::Finished => Ok(request_to_ioctl(&req.req, req.stat())),
            BalanceEnd::NoSpace(_) => Err(errno::ENOSPC),
            BalanceEnd::Paused => Err(errno::ECANCELED),
        }
    }
}

/// The client side: what `ubtrfs balance ... MNT` sends to a ubtrfs mount.
pub mod client {
    use std::fs::File;
    use std::io;
    use ubtrfs_core::BalanceRequest;

    use crate::subvol_ops::client::ioctl;

    /// BALANCE_V2: runs `req` on the mount; returns (expected, considered,
    /// completed).
    pub fn balance(mnt: &File, req: &BalanceRequest) -> io::Result<[u64; 3]> {
        let mut b = super::request_to_ioctl(req, [0; 3]);
        ioctl(mnt, super::BTRFS_IOC_BALANCE_V2, &mut b)?;
        let at = super::STAT_AT;
        let w = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at + i * 8..at + i * 8 + 8]);
            u64::from_ne_bytes(a)
        };
        Ok([w(0), w(1), w(2)])
    }

    /// A running balance as BALANCE_PROGRESS reports it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Running {
        /// A pause was asked (it stops before the next chunk).
        pub pause_requested: bool,
        /// A cancel was asked.
        pub cancel_requested: bool,
        /// Chunks the filters select.
        pub expected: u64,
        /// Chunks looked at so far.
        pub considered: u64,
        /// Chunks relocated so far.
        pub completed: u64,
    }

    /// BALANCE_PROGRESS: Ok(None) when no balance runs (ENOTCONN).
    pub fn progress(mnt: &File) -> io::Result<Option<Running>> {
        let mut b = vec![0u8; super::BALANCE_ARGS_IOCTL_SIZE];
        match ioctl(mnt, super::BTRFS_IOC_BALANCE_PROGRESS, &mut b) {
            Ok(()) => {
                let w = |at: usize| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(&b[at..at + 8]);
                    u64::from_ne_bytes(a)
                };
                let state = w(8);
                Ok(Some(Running {
                    pause_requested: state & super::STATE_PAUSE_REQ != 0,
                    cancel_requested: state & super::STATE_CANCEL_REQ != 0,
                    expected: w(super::STAT_AT),
                    considered: w(super::STAT_AT + 8),
                    completed: w(super::STAT_AT + 16),
                }))
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOTCONN) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// BALANCE_CTL: 1 pause, 2 cancel.
    pub fn ctl(mnt: &File, what: i32) -> io::Result<()> {
        let mut b = what.to_ne_bytes();
        ioctl(mnt, super::BTRFS_IOC_BALANCE_CTL, &mut b)
    }
}
