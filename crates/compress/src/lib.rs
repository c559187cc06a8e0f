//! Extent codecs for btrfs: zlib, LZO and zstd, bit-compatible with the
//! Linux kernel.
//!
//! # Reading
//!
//! * **Regular extents** (`BTRFS_FILE_EXTENT_REG` with a non-zero
//!   compression byte): read exactly `disk_num_bytes` bytes at
//!   `disk_bytenr` and call [`decompress`] with `out_len = ram_bytes`. The
//!   file's bytes are then `result[offset .. offset + num_bytes]` (the
//!   extent item's `offset` and `num_bytes`, both relative to the
//!   *uncompressed* data).
//! * **Inline extents** (`BTRFS_FILE_EXTENT_INLINE`): pass the whole inline
//!   payload (item size minus the 21-byte fixed part of the file extent
//!   item) to [`decompress_inline`] with `out_len = ram_bytes`.
//!
//! In both cases, when the stream yields fewer than `out_len` bytes the rest
//! of the output is zero-filled (as the kernel does for regular extents), and
//! decoding stops once `out_len` bytes have been produced. The output is
//! never larger than `out_len`.
//!
//! # Writing
//!
//! [`compress`] produces bytes the kernel can read and applies the kernel's
//! "must save at least one sector" rule; [`compress_raw`] skips that rule.
//! The result is not padded: the caller writes it to a sector-aligned
//! allocation of `round_up(len, sectorsize)` bytes with zero padding and
//! records that rounded length as `disk_num_bytes`. For an inline extent the
//! unpadded bytes are the inline payload.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(unreachable_pub)]

mod error;
mod heuristic;
mod lzo;
pub mod lzo1x;
mod zlib;
mod zstd_codec;

use std::fmt;

pub use error::CompressError;
pub use heuristic::compress_heuristic;
pub use lzo::LZO_LEN;
pub use zstd_codec::MAX_WINDOW_LOG as ZSTD_MAX_WINDOW_LOG;

/// Largest on-disk size of a compressed extent (`BTRFS_MAX_COMPRESSED`).
pub const MAX_COMPRESSED: usize = 128 * 1024;

/// Largest uncompressed size of a compressed extent
/// (`BTRFS_MAX_UNCOMPRESSED`); also the largest `out_len` accepted.
pub const MAX_UNCOMPRESSED: usize = 128 * 1024;

/// Default zlib level used by the kernel (`compress=zlib`).
pub const ZLIB_DEFAULT_LEVEL: i32 = 3;
/// Default zstd level used by the kernel (`compress=zstd`).
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// Compression type byte of a file extent item.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Compression {
    /// Not compressed.
    None = 0,
    /// zlib (RFC 1950).
    Zlib = 1,
    /// LZO1X in btrfs's segment framing.
    Lzo = 2,
    /// zstd.
    Zstd = 3,
}

impl Compression {
    /// Lower-case name as used in mount options (`none`, `zlib`, `lzo`, `zstd`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zlib => "zlib",
            Compression::Lzo => "lzo",
            Compression::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<u8> for Compression {
    type Error = CompressError;

    fn try_from(v: u8) -> Result<Self, Self::Error> {
        match v {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Zlib),
            2 => Ok(Compression::Lzo),
            3 => Ok(Compression::Zstd),
            other => Err(CompressError::Unsupported(other)),
        }
    }
}

impl From<Compression> for u8 {
    fn from(c: Compression) -> u8 {
        c as u8
    }
}

fn check_sectorsize(sectorsize: u32) -> Result<usize, CompressError> {
    if !sectorsize.is_power_of_two() || !(512..=65536).contains(&sectorsize) {
        return Err(CompressError::InvalidArgument(format!(
            "sectorsize {sectorsize} is not a power of two between 512 and 65536"
        )));
    }
    Ok(sectorsize as usize)
}

fn check_out_len(out_len: usize) -> Result<(), CompressError> {
    if out_len > MAX_UNCOMPRESSED {
        return Err(CompressError::InvalidArgument(format!(
            "decompressed length {out_len} exceeds the btrfs maximum of {MAX_UNCOMPRESSED} \
             bytes for a compressed extent"
        )));
    }
    Ok(())
}

/// Decompress a regular extent's on-disk bytes into exactly `out_len`
/// bytes.
///
/// `input` should be exactly the extent's `disk_num_bytes` bytes (trailing
/// zero padding included); for LZO the kernel's consistency check between
/// the header length and the extent size relies on that. If the stream
/// yields fewer than `out_len` bytes, the rest is zero; decoding stops once
/// `out_len` bytes exist. `out_len` may not exceed [`MAX_UNCOMPRESSED`].
///
/// [`Compression::None`] copies `input` (truncated / zero-extended).
pub fn decompress(
    alg: Compression,
    input: &[u8],
    out_len: usize,
    sectorsize: u32,
) -> Result<Vec<u8>, CompressError> {
    decode(alg, input, out_len, sectorsize, false)
}

/// Decompress an inline extent's payload into exactly `out_len` bytes.
///
/// For LZO the payload must be the 4-byte total length (equal to
/// `input.len()`), a 4-byte segment length (equal to `input.len() - 8`) and
/// one LZO1X segment that decodes to at most one sector. zlib and zstd
/// payloads are single streams, decoded as for regular extents. A short
/// result is zero-filled (recent kernels additionally report `EIO` in
/// that case; older ones did not).
pub fn decompress_inline(
    alg: Compression,
    input: &[u8],
    out_len: usize,
    sectorsize: u32,
) -> Result<Vec<u8>, CompressError> {
    decode(alg, input, out_len, sectorsize, true)
}

/// Shared body of the two entry points: only LZO frames inline data differently.
fn decode(
    alg: Compression,
    input: &[u8],
    out_len: usize,
    sectorsize: u32,
    inline: bool,
) -> Result<Vec<u8>, CompressError> {
    let ss = check_sectorsize(sectorsize)?;
    check_out_len(out_len)?;
    let mut out = vec![0u8; out_len];
    let produced = match alg {
        Compression::None => copy_plain(input, &mut out),
        Compression::Zlib => zlib::decompress(input, &mut out)?,
        Compression::Lzo if inline => lzo::decompress_inline(input, &mut out, ss)?,
        Compression::Lzo => lzo::decompress_regular(input, &mut out, ss)?,
        Compression::Zstd => zstd_codec::decompress(input, &mut out)?,
    };
    zero_tail(&mut out, produced);
    Ok(out)
}

fn copy_plain(input: &[u8], out: &mut [u8]) -> usize {
    let n = input.len().min(out.len());
    out[..n].copy_from_slice(&input[..n]);
    n
}

/// Zero everything after the bytes a decoder produced. Needed because
/// decoders may use the unused tail of the output as scratch space (zstd
/// keeps literals there).
fn zero_tail(out: &mut [u8], produced: usize) {
    if let Some(tail) = out.get_mut(produced..) {
        tail.fill(0);
    }
}

/// True if storing `compressed_len` bytes instead of `input_len` bytes saves
/// at least one sector, the kernel's condition for keeping a compressed
/// regular extent: `round_up(compressed, ss) + ss <= round_up(input, ss)`.
pub fn saves_a_sector(compressed_len: usize, input_len: usize, sectorsize: u32) -> bool {
    let ss = sectorsize.max(1) as usize;
    compressed_len.next_multiple_of(ss) + ss <= input_len.next_multiple_of(ss)
}

fn check_compress_input(input: &[u8]) -> Result<(), CompressError> {
    if input.len() > MAX_UNCOMPRESSED {
        return Err(CompressError::InvalidArgument(format!(
            "input of {} bytes exceeds the btrfs maximum of {MAX_UNCOMPRESSED} bytes per \
             compressed extent",
            input.len()
        )));
    }
    Ok(())
}

fn encode(
    alg: Compression,
    input: &[u8],
    level: Option<i32>,
    ss: usize,
    early_abort: bool,
) -> Result<Option<Vec<u8>>, CompressError> {
    Ok(match alg {
        Compression::None => Some(input.to_vec()),
        Compression::Zlib => {
            let lvl = match level {
                None | Some(0) => ZLIB_DEFAULT_LEVEL,
                Some(l) => l.clamp(1, 9),
            };
            Some(zlib::compress(input, lvl as u32)?)
        }
        Compression::Lzo => lzo::compress(input, ss, early_abort),
        Compression::Zstd => {
            let lvl = match level {
                None | Some(0) => ZSTD_DEFAULT_LEVEL,
                Some(l) => l.clamp(-15, 15),
            };
            Some(zstd_codec::compress(input, lvl)?)
        }
    })
}

/// Compress one extent's worth of data (at most [`MAX_UNCOMPRESSED`] bytes,
/// starting at a sector-aligned file offset) the way the kernel would.
///
/// Returns `Ok(None)` when compression does not pay off: when the result
/// would not save at least one sector (see [`saves_a_sector`]), when the
/// kernel's LZO early-abort heuristic triggers, for empty input, and for
/// [`Compression::None`]. `level`: zlib 1..=9 (default 3), zstd -15..=15
/// (default 3), ignored for LZO; `None` or `Some(0)` selects the default and
/// out-of-range values are clamped.
///
/// The result is unpadded; see the crate documentation.
pub fn compress(
    alg: Compression,
    input: &[u8],
    level: Option<i32>,
    sectorsize: u32,
) -> Result<Option<Vec<u8>>, CompressError> {
    let ss = check_sectorsize(sectorsize)?;
    check_compress_input(input)?;
    if input.is_empty() || alg == Compression::None {
        return Ok(None);
    }
    let Some(out) = encode(alg, input, level, ss, true)? else {
        return Ok(None);
    };
    if !saves_a_sector(out.len(), input.len(), sectorsize) {
        return Ok(None);
    }
    Ok(Some(out))
}

/// Like [`compress`] but always returns the encoded bytes, whatever their
/// size (useful for inline extents, where the caller applies its own size
/// limit, and for tests). [`Compression::None`] returns a copy of the input.
pub fn compress_raw(
    alg: Compression,
    input: &[u8],
    level: Option<i32>,
    sectorsize: u32,
) -> Result<Vec<u8>, CompressError> {
    let ss = check_sectorsize(sectorsize)?;
    check_compress_input(input)?;
    let out = encode(alg, input, level, ss, false)?;
    Ok(out.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_byte_conversions() {
        for v in 0u8..=3 {
            let c = Compression::try_from(v).expect("known");
            assert_eq!(u8::from(c), v);
        }
        for v in [4u8, 5, 17, 255] {
            let e = Compression::try_from(v).expect_err("unknown");
            assert!(e.is_unsupported());
            assert!(!e.is_corrupt());
        }
        assert_eq!(Compression::Zstd.to_string(), "zstd");
    }

    #[test]
    fn sector_rule() {
        assert!(saves_a_sector(4096, 8192, 4096));
        assert!(!saves_a_sector(4097, 8192, 4096));
        assert!(!saves_a_sector(1, 4096, 4096));
        assert!(saves_a_sector(100, 4097, 4096));
    }

    #[test]
    fn bad_arguments() {
        for ss in [0u32, 1000, 256, 131072] {
            assert!(matches!(
                decompress(Compression::Zlib, &[], 0, ss),
                Err(CompressError::InvalidArgument(_))
            ));
        }
        assert!(matches!(
            decompress(Compression::Lzo, &[], MAX_UNCOMPRESSED + 1, 4096),
            Err(CompressError::InvalidArgument(_))
        ));
        assert!(matches!(
            compress(
                Compression::Lzo,
                &vec![0u8; MAX_UNCOMPRESSED + 1],
                None,
                4096
            ),
            Err(CompressError::InvalidArgument(_))
        ));
    }
}
