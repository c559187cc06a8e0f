//! The ubtrfs engine. Modules follow the kernel's fs/btrfs names so a btrfs developer
//! finds their way: `dev` (device trait), `volumes` (chunk map), `disk_io` (superblock,
//! tree-block reads), `tree_checker`, `ctree` (search/iterate), `inode`, `dir`, `xattr`,
//! `file` (data reads), `file_item` (data checksums), `subvol`.

pub mod backref;
pub mod block_group;
pub mod ctree;
pub mod ctree_write;
pub mod delayed_ref;
pub mod dev;
pub mod dir;
pub mod disk_io;
pub mod du;
pub mod error;
pub mod extent_io;
pub mod extent_tree;
pub mod fiemap;
pub mod file;
pub mod file_item;
pub mod free_space_cache;
pub mod free_space_tree;
pub mod fs;
pub mod fuzz_harness;
pub mod inode;
pub mod inode_ops;
pub mod mkfs;
pub mod print_tree;
pub mod qgroup;
pub mod sparse_dev;
pub mod subvol;
pub mod subvol_write;
pub mod transaction;
pub mod tree_checker;
pub mod volumes;
pub mod xattr;

pub use disk_io::{FsInfo, OpenOptions, RootPtr};
pub use error::{Error, Result};
pub use fs::{Filesystem, Node};
pub use transaction::Trans;
pub use ubtrfs_format as format;
