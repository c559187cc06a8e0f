//! On-disk format of btrfs: superblock, tree blocks, keys, every item type a current
//! kernel writes, and the checksum/hash functions. Pure parsing: no I/O, no unsafe.
//!
//! Every parser takes a byte slice and returns either a typed value or a [`FormatError`]
//! saying what was being read and why it failed; nothing here panics on hostile input.
#![forbid(unsafe_code)]

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
    #[error("{what}: truncated (needs {need} bytes at offset {offset}, have {have})")]
    Truncated {
        what: &'static str,
        offset: usize,
        need: usize,
        have: usize,
    },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

impl FormatError {
    pub fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            what,
            detail: detail.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, FormatError>;
