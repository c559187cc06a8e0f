//! Error type shared by all codecs.

use crate::Compression;

/// Everything that can go wrong while (de)compressing an extent.
///
/// The variants separate *bad data* ([`CompressError::Corrupt`]) from an
/// *unknown algorithm* ([`CompressError::Unsupported`]) and from *caller
/// mistakes* ([`CompressError::InvalidArgument`]), so that a filesystem
/// reader can map them to different errno values / repair advice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    /// The compression type byte is not one that btrfs defines
    /// (0 = none, 1 = zlib, 2 = lzo, 3 = zstd).
    #[error("unsupported compression type {0} (known: 0=none, 1=zlib, 2=lzo, 3=zstd)")]
    Unsupported(u8),

    /// The compressed bytes are malformed: bad framing, a corrupt bitstream,
    /// truncated input, a back-reference before the start of the output...
    #[error("{alg}: {detail}")]
    Corrupt {
        /// Algorithm whose data was being decoded.
        alg: Compression,
        /// Human readable description, including byte offsets where known.
        detail: String,
    },

    /// The caller passed parameters that cannot be valid
    /// (e.g. a sector size that is not a power of two, an input larger
    /// than the btrfs maximum extent size).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The underlying compression library reported an internal failure
    /// while *compressing* (should not happen with valid arguments).
    #[error("{alg}: compressor failure: {detail}")]
    Compressor {
        /// Algorithm that failed.
        alg: Compression,
        /// Library message.
        detail: String,
    },
}

impl CompressError {
    /// True if the error means the on-disk data is damaged.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, CompressError::Corrupt { .. })
    }

    /// True if the error means the compression type is unknown.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, CompressError::Unsupported(_))
    }

    pub(crate) fn corrupt(alg: Compression, detail: impl Into<String>) -> Self {
        CompressError::Corrupt {
            alg,
            detail: detail.into(),
        }
    }
}
