//! Subvolumes and snapshots: listing them, their paths, and creating them.
//!
//! Owns: ROOT_ITEM / ROOT_REF / ROOT_BACKREF of subvolumes and the UUID tree. May use:
//! `tree`, `io`, `fs`, `inode`, `transaction`.

pub(crate) mod create;
#[allow(clippy::module_inception)]
pub(crate) mod subvol;
