//! The ubtrfs engine.

pub mod alloc;
pub mod backref;
pub mod error;
pub mod fs;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod inode;
pub mod io;
pub mod subvol;
pub mod tools;
pub mod transaction;
pub mod tree;

pub use error::{Error, Result};
pub use fs::{Filesystem, Node};
pub use io::disk_io::{FsInfo, OpenOptions};
pub use tree::RootPtr;
pub use transaction::Trans;
pub use ubtrfs_format as format;
