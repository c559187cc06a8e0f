//! The btrfs quota ioctls on a read-write mount, with the kernel's argument structs:
//! QUOTA_CTL (enable, disable), QGROUP_CREATE (create, destroy), QGROUP_ASSIGN
//! (assign, remove), QGROUP_LIMIT, QUOTA_RESCAN, QUOTA_RESCAN_STATUS and
//! QUOTA_RESCAN_WAIT. FUSE carries them: their sizes are in the command numbers.
//! Each change is committed before the reply, as the kernel's ioctls commit; a rescan
//! runs inside that commit, so RESCAN_STATUS always answers "not running".
//!
//! As for the subvolume ioctls, btrfs-progs' own commands do not reach here (they
//! check statfs's f_type first); `ubtrfs quota|qgroup ... MNT` sends them ([`client`]).

use crate::abi::InHeader;
use crate::ops::{admin_only, errno, Ops};
use crate::writer::Engine;
use ubtrfs_core::QgroupLimitKind;

const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | (0x94 << 8) | nr
}
const WRITE: u32 = 1;
const READ: u32 = 2;
/// `struct btrfs_ioctl_quota_ctl_args {u64 cmd; u64 status;}`.
pub(crate) const BTRFS_IOC_QUOTA_CTL: u32 = ioc(WRITE | READ, 40, 16);
/// `struct btrfs_ioctl_qgroup_assign_args {u64 assign; u64 src; u64 dst;}`.
pub(crate) const BTRFS_IOC_QGROUP_ASSIGN: u32 = ioc(WRITE, 41, 24);
/// `struct btrfs_ioctl_qgroup_create_args {u64 create; u64 qgroupid;}`.
pub(crate) const BTRFS_IOC_QGROUP_CREATE: u32 = ioc(WRITE, 42, 16);
/// `struct btrfs_ioctl_qgroup_limit_args {u64 qgroupid; struct btrfs_qgroup_limit}`.
pub(crate) const BTRFS_IOC_QGROUP_LIMIT: u32 = ioc(READ, 43, 48);
/// The same command declared read-write: the kernel declares QGROUP_LIMIT `_IOR`,
/// and FUSE passes no input to an ioctl that only reads, so the server would never
/// see the limit. ubtrfs mounts take this variant ([`client::qgroup_limit`] sends it
/// to a FUSE mount, the real one to a kernel mount).
pub(crate) const UBTRFS_IOC_QGROUP_LIMIT_RW: u32 = ioc(WRITE | READ, 43, 48);
/// `struct btrfs_ioctl_quota_rescan_args {u64 flags; u64 progress; u64 reserved[6];}`.
pub(crate) const BTRFS_IOC_QUOTA_RESCAN: u32 = ioc(WRITE, 44, 64);
pub(crate) const BTRFS_IOC_QUOTA_RESCAN_STATUS: u32 = ioc(READ, 45, 64);
pub(crate) const BTRFS_IOC_QUOTA_RESCAN_WAIT: u32 = ioc(0, 46, 0);

/// QUOTA_CTL commands.
const QUOTA_CTL_ENABLE: u64 = 1;
const QUOTA_CTL_DISABLE: u64 = 2;
const QUOTA_CTL_ENABLE_SIMPLE: u64 = 4;
/// btrfs_qgroup_limit flags.
const LIMIT_MAX_RFER: u64 = 1;
const LIMIT_MAX_EXCL: u64 = 2;
/// A limit of all ones clears it (the kernel's CLEAR_VALUE).
const CLEAR_VALUE: u64 = u64::MAX;

/// True for the commands this module answers.
pub(crate) fn is_quota_ioctl(cmd: u32) -> bool {
    matches!(
        cmd,
        BTRFS_IOC_QUOTA_CTL
            | BTRFS_IOC_QGROUP_ASSIGN
            | BTRFS_IOC_QGROUP_CREATE
            | BTRFS_IOC_QGROUP_LIMIT
            | UBTRFS_IOC_QGROUP_LIMIT_RW
            | BTRFS_IOC_QUOTA_RESCAN
            | BTRFS_IOC_QUOTA_RESCAN_STATUS
            | BTRFS_IOC_QUOTA_RESCAN_WAIT
    )
}

fn word(input: &[u8], i: usize) -> Result<u64, i32> {
    let b = input.get(i * 8..i * 8 + 8).ok_or(errno::EINVAL)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Ok(u64::from_ne_bytes(a))
}

impl Ops {
    /// One quota ioctl on node `h.nodeid`; returns the bytes to copy back (the
    /// command's whole argument for the reading ones, else nothing).
    pub(crate) fn quota_ioctl(&self, h: &InHeader, cmd: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
        admin_only(h)?;
        if cmd == BTRFS_IOC_QUOTA_RESCAN_STATUS {
            // Rescans finish inside their commit: never one running.
            return Ok(vec![0u8; 64]);
        }
        if cmd == BTRFS_IOC_QUOTA_RESCAN_WAIT {
            return Ok(Vec::new());
        }
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        let node = self.node(h.nodeid)?.node;
        let mut out = Vec::new();
        match cmd {
            BTRFS_IOC_QUOTA_CTL => match word(input, 0)? {
                QUOTA_CTL_ENABLE => w.change("quota enable", |t| t.quota_enable(false))?,
                QUOTA_CTL_ENABLE_SIMPLE => {
                    w.change("quota enable --simple", |t| t.quota_enable(true))?
                }
                QUOTA_CTL_DISABLE => w.change("quota disable", |t| t.quota_disable())?,
                _ => return Err(errno::EINVAL),
            },
            BTRFS_IOC_QGROUP_ASSIGN => {
                let (assign, src, dst) = (word(input, 0)?, word(input, 1)?, word(input, 2)?);
                w.change("qgroup assign", |t| {
                    t.qgroup_relation(src, dst, assign != 0)
                })?;
            }
            BTRFS_IOC_QGROUP_CREATE => {
                let (create, q) = (word(input, 0)?, word(input, 1)?);
                if q == 0 {
                    return Err(errno::EINVAL);
                }
                if create != 0 {
                    w.change("qgroup create", |t| t.qgroup_create(q))?;
                } else {
                    w.change("qgroup destroy", |t| t.qgroup_destroy(q))?;
                }
            }
            BTRFS_IOC_QGROUP_LIMIT | UBTRFS_IOC_QGROUP_LIMIT_RW => {
                // qgroupid 0: the subvolume the descriptor is in.
                let q = match word(input, 0)? {
                    0 => node.root,
                    q => q,
                };
                let (flags, max_rfer, max_excl) =
                    (word(input, 1)?, word(input, 2)?, word(input, 3)?);
                let value = |v: u64| (v != CLEAR_VALUE).then_some(v);
                w.change("qgroup limit", |t| {
                    if flags & LIMIT_MAX_RFER != 0 {
                        t.qgroup_limit(q, QgroupLimitKind::Referenced, value(max_rfer))?;
                    }
                    if flags & LIMIT_MAX_EXCL != 0 {
                        t.qgroup_limit(q, QgroupLimitKind::Exclusive, value(max_excl))?;
                    }
                    Ok(())
                })?;
                out = input.get(..48).ok_or(errno::EINVAL)?.to_vec();
            }
            _ => {
                // QUOTA_RESCAN: flags must be 0, as the kernel insists.
                if word(input, 0)? != 0 {
                    return Err(errno::EINVAL);
                }
                w.change("quota rescan", |t| t.quota_rescan())?;
            }
        }
        w.commit()?;
        Ok(out)
    }
}

/// The client side: what `ubtrfs quota|qgroup ... MNT` send to a mounted filesystem
/// (a ubtrfs mount, or the kernel's).
pub mod client {
    use std::fs::File;
    use std::io;

    use crate::subvol_ops::client::ioctl;

    fn words(v: &[u64], size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        for (i, w) in v.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_ne_bytes());
        }
        b
    }

    /// QUOTA_CTL: quotas on (true) or off.
    pub fn quota_ctl(mnt: &File, ctl: QuotaCtl) -> io::Result<()> {
        let cmd = match ctl {
            QuotaCtl::Enable => super::QUOTA_CTL_ENABLE,
            QuotaCtl::EnableSimple => super::QUOTA_CTL_ENABLE_SIMPLE,
            QuotaCtl::Disable => super::QUOTA_CTL_DISABLE,
        };
        ioctl(mnt, super::BTRFS_IOC_QUOTA_CTL, &mut words(&[cmd, 0], 16))
    }

    /// What QUOTA_CTL asks for.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum QuotaCtl {
        /// `btrfs quota enable`: full accounting.
        Enable,
        /// `btrfs quota enable -s`: simple quotas.
        EnableSimple,
        /// `btrfs quota disable`.
        Disable,
    }

    /// QUOTA_RESCAN then QUOTA_RESCAN_WAIT (a rescan already running, as the
    /// kernel's after `quota enable`, is waited for).
    pub fn rescan(mnt: &File) -> io::Result<()> {
        match ioctl(mnt, super::BTRFS_IOC_QUOTA_RESCAN, &mut words(&[0], 64)) {
            Err(e) if e.raw_os_error() == Some(nix::libc::EINPROGRESS) => {}
            r => r?,
        }
        ioctl(mnt, super::BTRFS_IOC_QUOTA_RESCAN_WAIT, &mut [])
    }

    /// QGROUP_CREATE: create (true) or destroy a qgroup.
    pub fn qgroup_create(mnt: &File, qgroupid: u64, create: bool) -> io::Result<()> {
        let c = u64::from(create);
        ioctl(
            mnt,
            super::BTRFS_IOC_QGROUP_CREATE,
            &mut words(&[c, qgroupid], 16),
        )
    }

    /// QGROUP_ASSIGN: make `src` a member of `dst` (true) or no longer.
    pub fn qgroup_assign(mnt: &File, src: u64, dst: u64, assign: bool) -> io::Result<()> {
        let a = u64::from(assign);
        ioctl(
            mnt,
            super::BTRFS_IOC_QGROUP_ASSIGN,
            &mut words(&[a, src, dst], 24),
        )
    }

    /// QGROUP_LIMIT: sets (Some) or clears (None) the referenced (or exclusive) limit.
    /// `fuse`: the mount is a FUSE one (a ubtrfs mount), which takes the read-write
    /// variant of the command.
    pub fn qgroup_limit(
        mnt: &File,
        qgroupid: u64,
        exclusive: bool,
        bytes: Option<u64>,
        fuse: bool,
    ) -> io::Result<()> {
        let v = bytes.unwrap_or(super::CLEAR_VALUE);
        let (flags, rfer, excl) = if exclusive {
            (super::LIMIT_MAX_EXCL, 0, v)
        } else {
            (super::LIMIT_MAX_RFER, v, 0)
        };
        let cmd = if fuse {
            super::UBTRFS_IOC_QGROUP_LIMIT_RW
        } else {
            super::BTRFS_IOC_QGROUP_LIMIT
        };
        ioctl(mnt, cmd, &mut words(&[qgroupid, flags, rfer, excl], 48))
    }
}
