//! The ubtrfs engine: btrfs read and written in userspace, bit-compatible with the
//! Linux kernel.
//!
//! Start here:
//! - [`Filesystem::open_paths`] opens an image (or several devices) for reading; paths
//!   resolve to a [`Node`] (subvolume, inode), and `stat`, `read_dir`, `read`,
//!   `xattrs` answer as a kernel mount would.
//! - [`Trans::open_paths`] opens an image for writing; file operations (`create`,
//!   `write`, `rename`, ...) run on the transaction, and [`Trans::commit`] makes them
//!   durable with the kernel's commit protocol.
//! - [`tools`] holds what is built on the engine: mkfs, the dump-tree printer, fiemap,
//!   `filesystem du` and `subvolume du`.
//!
//! Every byte goes through a [`Device`]; [`MemDevice`] and test devices substitute for
//! files. The module map, the layering and the invariants are in ARCHITECTURE.md at the
//! repository's root.

#![deny(missing_docs)]
#![deny(unreachable_pub)]

mod alloc;
mod backref;
mod check;
mod error;
mod fs;
mod inode;
mod io;
mod qgroup;
mod relocation;
mod subvol;
mod transaction;
mod tree;
mod tree_log;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod tools;

pub use alloc::free_space_cache::SearchMode;
pub use alloc::AllocStats;
pub use backref::ShareCtx;
pub use check::{
    check as check_filesystem, CheckOptions, CheckReport, CheckStats, Problem,
    Progress as CheckProgress, PHASES as CHECK_PHASES, PROBLEMS_KEPT_MAX,
};
pub use error::{Error, Result};
pub use fs::{Filesystem, Node};
pub use inode::dir_item::DirEntry;
pub use inode::file::MAX_EXTENT_SIZE;
pub use inode::inode::{file_type_of, now, NewInode};
pub use inode::inode::{kernel_rdev_to_user, Stat};
pub use inode::ioctl::{
    fsflags, fsflags_to_xflags, inode_flags_to_fsflags, xflags_to_fsflags, FsXattr,
};
pub use inode::props::{compression_of, XATTR_BTRFS_COMPRESSION, XATTR_BTRFS_PREFIX};
pub use inode::reflink::FilePos;
pub use io::dev::{lock_exclusive, refuse_if_mounted, Device, FileDevice, MemDevice};
pub use io::disk_io::{read_best_super, FreeSpaceTreeAction, FsInfo, OpenOptions};
pub use io::salvage::{losses_met_by_this_thread, LostBlock};
pub use qgroup::{QgroupEntry, QuotaReport};
pub use relocation::balance::{
    args as balance_args, flags as balance_flags, parse_profile as parse_balance_profile,
    BalanceArgs, BalanceEnd, BalanceProgress, BalanceRequest, BalanceRun, BalanceStep,
    AVAIL_ALLOC_BIT_SINGLE, BALANCE_ARGS_SIZE, BALANCE_ITEM_SIZE,
};
pub use relocation::relocate::RelocStats;
pub use subvol::subvol::SubvolInfo;
pub use transaction::quota::{QgroupLimitKind, QgroupStats};
pub use transaction::space_info::Reservation;
pub use transaction::trim::TrimReport;
pub use transaction::{CommitIo, Trans};
pub use tree::ctree::{lookup_exact, search_slot, walk_items, ItemRef, Path as TreePath, TreeIter};
pub use tree::{RootPtr, TreeBlock};
pub use tree_log::{zero_log, LogStats, ReplayStats, Synced, TreeLog, ZeroLog, LOG_ITEMS_MAX};
pub use ubtrfs_format as format;

/// File type bits of `st_mode`, as Linux defines them (btrfs stores them in the inode
/// item's mode).
pub mod mode {
    pub use crate::fs::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK};
}
