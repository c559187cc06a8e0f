//! Engine errors. Io (the device failed), Corrupt (the image is wrong: says which block
//! and what), Unsupported (valid but beyond this implementation) are kept apart so a
//! caller can tell a bad disk from a bad image from a missing feature.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The message carries the cause (no `#[source]`, so chains do not repeat it).
    #[error("I/O error: {what}: {err}")]
    Io { what: String, err: io::Error },
    #[error("corrupt filesystem: {0}")]
    Corrupt(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A data checksum mismatch: an I/O error for the file that hit it.
    #[error("checksum mismatch: {0}")]
    DataCsum(String),
    #[error("{0}: No such file or directory")]
    NotFound(String),
    #[error("{0}: Not a directory")]
    NotDir(String),
    #[error("{0}: Is a directory")]
    IsDir(String),
    #[error("{0}: Invalid argument")]
    Invalid(String),
    #[error("{0}: Too many levels of symbolic links")]
    Loop(String),
    #[error("{0}: No space left on device")]
    NoSpace(String),
    #[error("{0}: File exists")]
    Exists(String),
    #[error("{0}: Directory not empty")]
    NotEmpty(String),
    #[error("{0}: Device or resource busy")]
    Busy(String),
}

impl Error {
    pub fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            err: source,
        }
    }
    /// The errno a POSIX caller (FUSE) should see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { .. } | Error::Corrupt(_) | Error::DataCsum(_) => libc_consts::EIO,
            Error::Unsupported(_) => libc_consts::EOPNOTSUPP,
            Error::NotFound(_) => libc_consts::ENOENT,
            Error::NotDir(_) => libc_consts::ENOTDIR,
            Error::IsDir(_) => libc_consts::EISDIR,
            Error::Invalid(_) => libc_consts::EINVAL,
            Error::Loop(_) => libc_consts::ELOOP,
            Error::NoSpace(_) => libc_consts::ENOSPC,
            Error::Exists(_) => libc_consts::EEXIST,
            Error::NotEmpty(_) => libc_consts::ENOTEMPTY,
            Error::Busy(_) => libc_consts::EBUSY,
        }
    }
}

/// Linux errno values (stable ABI), kept here so the engine needs no libc.
mod libc_consts {
    pub(super) const ENOENT: i32 = 2;
    pub(super) const EBUSY: i32 = 16;
    pub(super) const EEXIST: i32 = 17;
    pub(super) const ENOSPC: i32 = 28;
    pub(super) const ENOTEMPTY: i32 = 39;
    pub(super) const EIO: i32 = 5;
    pub(super) const ENOTDIR: i32 = 20;
    pub(super) const EISDIR: i32 = 21;
    pub(super) const EINVAL: i32 = 22;
    pub(super) const ELOOP: i32 = 40;
    pub(super) const EOPNOTSUPP: i32 = 95;
}

pub type Result<T> = std::result::Result<T, Error>;
