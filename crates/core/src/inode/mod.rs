//! Inodes, directories, extended attributes and file data, read (on [`crate::Filesystem`])
//! and written (on [`crate::Trans`]).
//!
//! Owns: the items of one subvolume tree that describe files. May use: `tree`, `io`,
//! `fs`, `transaction` (writes), `format`, `compress`, `error`.

pub(crate) mod dir;
pub(crate) mod file;
pub(crate) mod file_item;
#[allow(clippy::module_inception)]
pub(crate) mod inode;
pub(crate) mod ops;
pub(crate) mod xattr;
