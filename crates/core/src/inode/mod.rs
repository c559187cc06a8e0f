//! Inodes, directories, extended attributes and file data, read (on [`crate::Filesystem`])
//! and written (on [`crate::Trans`]). Each file holds both halves of one kernel file:
//!
//! | file | kernel | what |
//! |---|---|---|
//! | `inode.rs` | inode.c, namei | stat, create, link, unlink, rename, setattr, path lookup |
//! | `dir_item.rs` | dir-item.c | DIR_ITEM / DIR_INDEX: lookup, readdir, insert, remove |
//! | `inode_item.rs` | inode-item.c | INODE_REF / INODE_EXTREF |
//! | `file.rs` | file.c, inode.c (btrfs_get_extent) | file data read and write, truncate, fallocate, holes, inline |
//! | `reflink.rs` | reflink.c | clone ranges (shared extents), copy_file_range |
//! | `file_item.rs` | file-item.c | data checksums |
//! | `xattr.rs` | xattr.c | extended attributes |
//! | `props.rs` | props.c | the `btrfs.compression` property: checks, effect on flags, inheritance |
//! | `ioctl.rs` | ioctl.c (btrfs_fileattr_get/set) | lsattr/chattr flags |
//!
//! Owns: the items of one subvolume tree that describe files. May use: `tree`, `io`,
//! `fs`, `alloc`, `transaction` (writes), `format`, `compress`, `error`.

pub(crate) mod dir_item;
pub(crate) mod file;
pub(crate) mod file_item;
#[allow(clippy::module_inception)]
pub(crate) mod inode;
pub(crate) mod inode_item;
pub(crate) mod ioctl;
pub(crate) mod props;
pub(crate) mod reflink;
pub(crate) mod xattr;
