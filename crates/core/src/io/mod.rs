//! Devices and the bytes on them: the [`Device`] trait, the chunk map (logical to
//! physical), superblocks, validated tree-block reads with mirror retry, and opening a
//! filesystem ([`FsInfo`]).
//!
//! Owns: every byte read from or written to a device. May use: `format`, `error`,
//! `tree` (to validate blocks and to read the chunk and root trees while opening).

pub(crate) mod dev;
pub(crate) mod disk_io;
pub(crate) mod raid56;
pub(crate) mod root_tree;
pub(crate) mod salvage;
pub(crate) mod volumes;
