//! Engine errors. Io (the device failed), Corrupt (the image is wrong: says which block
//! and what), Unsupported (valid but beyond this implementation) are kept apart so a
//! caller can tell a bad disk from a bad image from a missing feature.

use std::io;

/// What can go wrong in the engine; each variant's message names the block, file or
/// item concerned, so one line tells the user what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A device read, write or flush failed. The message carries the cause (no
    /// `#[source]`, so chains do not repeat it).
    #[error("I/O error: {what}: {err}")]
    Io {
        /// The device or file.
        what: String,
        /// What the operating system said.
        err: io::Error,
    },
    #[error("corrupt filesystem: {0}")]
    /// The image is wrong: names the block or item and what was wrong with it.
    Corrupt(String),
    #[error("unsupported: {0}")]
    /// Valid btrfs, but beyond what ubtrfs implements (names the feature).
    Unsupported(String),
    /// A data checksum mismatch: an I/O error for the file that hit it.
    #[error("checksum mismatch: {0}")]
    DataCsum(String),
    #[error("{0}: No such file or directory")]
    /// ENOENT: a path or item that is not there.
    NotFound(String),
    #[error("{0}: Not a directory")]
    /// ENOTDIR: a path component that is not a directory.
    NotDir(String),
    #[error("{0}: Is a directory")]
    /// EISDIR: a directory where a file was expected.
    IsDir(String),
    #[error("{0}: Invalid argument")]
    /// EINVAL: an argument the operation does not accept.
    Invalid(String),
    #[error("{0}: Too many levels of symbolic links")]
    /// ELOOP: too many symlinks, or a loop in the tree structure.
    Loop(String),
    #[error("{0}: No space left on device")]
    /// ENOSPC: no data, metadata or device space left.
    NoSpace(String),
    #[error("{0}: No space left on device")]
    /// ENOSPC refused before anything changed: a value larger than one item can hold
    /// (the kernel's -ENOSPC for an oversized xattr). Unlike [`Error::NoSpace`] the
    /// transaction is intact, so a mount need not abort it.
    TooLarge(String),
    #[error("{0}: File exists")]
    /// EEXIST: the name is taken.
    Exists(String),
    #[error("{0}: Disk quota exceeded")]
    /// EDQUOT: a limit of this qgroup would be passed.
    QuotaExceeded(String),
    #[error("{0}: Directory not empty")]
    /// ENOTEMPTY: a directory that still has entries.
    NotEmpty(String),
    #[error("{0}: Operation not permitted")]
    /// EPERM: not allowed whatever the permissions (the default subvolume's deletion).
    NotPermitted(String),
    #[error("{0}: Read-only file system")]
    /// EROFS: a change inside a read-only subvolume or snapshot.
    ReadOnly(String),
    #[error("{0}: Invalid cross-device link")]
    /// EXDEV: a rename or link between subvolumes.
    CrossDevice(String),
    #[error("{0}: Device or resource busy")]
    /// EBUSY: the device is mounted or locked by another writer.
    Busy(String),
    #[error("{0}: Too many links")]
    /// EMLINK: an inode that already has the most links btrfs allows.
    TooManyLinks(String),
}

impl Error {
    /// A [`Error::Corrupt`] with this message.
    pub fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }
    /// An [`Error::Io`] on `what` (a device or file name).
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            err: source,
        }
    }
    /// The errno a POSIX caller (FUSE) should see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { .. } | Error::Corrupt(_) | Error::DataCsum(_) => libc::EIO,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NotFound(_) => libc::ENOENT,
            Error::NotDir(_) => libc::ENOTDIR,
            Error::IsDir(_) => libc::EISDIR,
            Error::Invalid(_) => libc::EINVAL,
            Error::Loop(_) => libc::ELOOP,
            Error::NoSpace(_) | Error::TooLarge(_) => libc::ENOSPC,
            Error::Exists(_) => libc::EEXIST,
            Error::QuotaExceeded(_) => libc::EDQUOT,
            Error::NotEmpty(_) => libc::ENOTEMPTY,
            Error::Busy(_) => libc::EBUSY,
            Error::NotPermitted(_) => libc::EPERM,
            Error::ReadOnly(_) => libc::EROFS,
            Error::CrossDevice(_) => libc::EXDEV,
            Error::TooManyLinks(_) => libc::EMLINK,
        }
    }
}

/// The engine's result type.
pub type Result<T> = std::result::Result<T, Error>;
