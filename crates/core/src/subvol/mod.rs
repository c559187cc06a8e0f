//! Subvolumes and snapshots: listing them, their paths, creating, snapshotting and
//! deleting them (the unlink, and the cleaner that drops a dead tree).
//!
//! Owns: ROOT_ITEM / ROOT_REF / ROOT_BACKREF of subvolumes and the UUID tree. May use:
//! `tree`, `io`, `fs`, `qgroup` (the live subvolumes, `live_fs_roots`), `inode`,
//! `transaction`.

pub(crate) mod create;
pub(crate) mod delete;
pub(crate) mod flags;
pub(crate) mod snapshot;
#[allow(clippy::module_inception)]
pub(crate) mod subvol;
pub(crate) mod uuid_tree;
