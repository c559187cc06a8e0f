//! On-disk format of btrfs: superblock, tree blocks, keys, every item type a current
//! kernel writes, and the checksum/hash functions. Pure parsing: no I/O, no unsafe.
//!
//! Every parser takes a byte slice and returns either a typed value or a [`FormatError`]
//! saying what was being read and why it failed; nothing here panics on hostile input.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(unreachable_pub)]

pub mod bytes;
pub mod consts;
pub mod csum;
pub mod items;
pub mod key;
pub mod superblock;
pub mod tree;

pub use bytes::Cursor;
pub use consts::*;
pub use csum::{name_hash, CsumType};
pub use key::Key;

/// A parse failure. `what` names the structure being decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The input ended before the structure did.
    #[error("{what}: truncated (needs {need} bytes at offset {offset}, have {have})")]
    Truncated {
        /// The structure being decoded.
        what: &'static str,
        /// Offset of the read that failed.
        offset: usize,
        /// Bytes the read needed.
        need: usize,
        /// Bytes left at that offset.
        have: usize,
    },
    /// The bytes are present but break a rule of the format.
    #[error("{what}: {detail}")]
    Invalid {
        /// The structure being decoded.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

impl FormatError {
    /// A [`FormatError::Invalid`] for `what` with the given detail.
    pub fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            what,
            detail: detail.into(),
        }
    }
}

/// Result of every parser in this crate.
pub type Result<T> = std::result::Result<T, FormatError>;
