//! The btrfs balance ioctls on a read-write mount, with the kernel's argument
//! struct (`struct btrfs_ioctl_balance_args`, 1024 bytes): BALANCE_V2 runs a
//! balance (or, with the RESUME flag, continues a paused one) and answers with its
//! counters; BALANCE_CTL (pause, cancel) and BALANCE_PROGRESS answer "not
//! running" (ENOTCONN), because the balance runs inside the BALANCE_V2 request,
//! holding the writer, and is finished when another request is served. A paused
//! balance of the image (its BALANCE item) is resumed with RESUME or cancelled
//! offline.
//!
//! btrfs-progs' own `btrfs balance` does not reach here (it checks statfs's
//! f_type first); `ubtrfs balance start|resume|status|cancel MNT` sends these
//! ([`client`]).

use crate::abi::InHeader;
use crate::ops::{errno, Ops};
use crate::writer::Engine;
use ubtrfs_core::{balance_flags, BalanceArgs, BalanceEnd, BalanceRequest, BALANCE_ARGS_SIZE};

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

impl Ops {
    /// One balance ioctl; returns the bytes to copy back.
    pub(crate) fn balance_ioctl(
        &self,
        h: &InHeader,
        cmd: u32,
        input: &[u8],
    ) -> Result<Vec<u8>, i32> {
        // The kernel asks CAP_SYS_ADMIN; this server runs with its owner's rights.
        if h.uid != 0 && h.uid != nix::unistd::getuid().as_raw() {
            return Err(errno::EPERM);
        }
        if cmd != BTRFS_IOC_BALANCE_V2 {
            return Err(errno::ENOTCONN);
        }
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        let asked = request_from_ioctl(input)?;
        let (end, p, req) = w.change("balance", |t| {
            let req = if asked.flags & balance_flags::RESUME != 0 {
                match t.balance_item()? {
                    Some(r) => r.for_resume(),
                    None => return Err(ubtrfs_core::Error::NotFound("a paused balance".into())),
                }
            } else {
                if t.balance_item()?.is_some() {
                    return Err(ubtrfs_core::Error::Busy(
                        "a balance is paused: resume or cancel it".into(),
                    ));
                }
                asked
            };
            let (end, p) = t.balance(&req, &mut |_, _| {}, &|| false)?;
            Ok((end, p, req))
        })?;
        match end {
            BalanceEnd::Finished => {}
            BalanceEnd::NoSpace(_) => return Err(errno::ENOSPC),
            BalanceEnd::Paused => return Err(errno::ECANCELED),
        }
        Ok(request_to_ioctl(
            &req,
            [p.expected, p.considered, p.completed],
        ))
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

    /// BALANCE_PROGRESS: Ok(None) when no balance runs (ENOTCONN).
    pub fn progress(mnt: &File) -> io::Result<Option<Vec<u8>>> {
        let mut b = vec![0u8; super::BALANCE_ARGS_IOCTL_SIZE];
        match ioctl(mnt, super::BTRFS_IOC_BALANCE_PROGRESS, &mut b) {
            Ok(()) => Ok(Some(b)),
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
