//! zstd extents: one zstd frame, followed on disk by zero padding.
//!
//! The kernel writes frames with a window of at most 128 KiB (window log
//! 17) and the content size recorded, and reads with a decoder limited to
//! that window; this module does the same.

use zstd::stream::raw::{CParameter, DParameter, Decoder, Encoder, InBuffer, Operation, OutBuffer};

use crate::{CompressError, Compression};

/// Largest window the kernel accepts when reading btrfs zstd extents.
pub const MAX_WINDOW_LOG: u32 = 17;

fn corrupt(detail: String) -> CompressError {
    CompressError::corrupt(Compression::Zstd, detail)
}

fn internal(e: std::io::Error) -> CompressError {
    CompressError::Compressor {
        alg: Compression::Zstd,
        detail: e.to_string(),
    }
}

/// Decode the first frame of `input` into `out`; returns the number of
/// bytes produced. zstd may scribble on the unused tail of `out` (it keeps
/// literals there), so the caller must clear `out[produced..]`.
pub(crate) fn decompress(input: &[u8], out: &mut [u8]) -> Result<usize, CompressError> {
    let mut d = Decoder::new().map_err(internal)?;
    d.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))
        .map_err(internal)?;
    let mut inb = InBuffer::around(input);
    let mut outb = OutBuffer::around(out);
    loop {
        if outb.pos() == outb.capacity() {
            // Everything requested has been produced.
            return Ok(outb.pos());
        }
        let (in_before, out_before) = (inb.pos(), outb.pos());
        let hint = d
            .run(&mut inb, &mut outb)
            .map_err(|e| corrupt(format!("frame error near byte {}: {e}", inb.pos())))?;
        if hint == 0 {
            // Frame fully decoded; anything after it is padding.
            return Ok(outb.pos());
        }
        if inb.pos() == input.len() && inb.pos() == in_before && outb.pos() == out_before {
            return Err(corrupt(format!(
                "frame truncated: input ended at byte {} after {} of {} bytes were produced",
                input.len(),
                outb.pos(),
                outb.capacity()
            )));
        }
    }
}

/// Compress into one frame with the content size set and window log <= 17.
pub(crate) fn compress(input: &[u8], level: i32) -> Result<Vec<u8>, CompressError> {
    let mut e = Encoder::new(level).map_err(internal)?;
    e.set_parameter(CParameter::WindowLog(MAX_WINDOW_LOG))
        .map_err(internal)?;
    e.set_parameter(CParameter::ContentSizeFlag(true))
        .map_err(internal)?;
    e.set_parameter(CParameter::ChecksumFlag(false))
        .map_err(internal)?;
    e.set_pledged_src_size(Some(input.len() as u64))
        .map_err(internal)?;

    let bound = zstd::zstd_safe::compress_bound(input.len());
    let mut out = vec![0u8; bound];
    let mut inb = InBuffer::around(input);
    let mut outb = OutBuffer::around(&mut out[..]);
    while inb.pos() < input.len() {
        let before = (inb.pos(), outb.pos());
        e.run(&mut inb, &mut outb).map_err(internal)?;
        if (inb.pos(), outb.pos()) == before {
            return Err(CompressError::Compressor {
                alg: Compression::Zstd,
                detail: "encoder made no progress".to_string(),
            });
        }
    }
    loop {
        let remaining = e.finish(&mut outb, true).map_err(internal)?;
        if remaining == 0 {
            break;
        }
        if outb.pos() == outb.capacity() {
            return Err(CompressError::Compressor {
                alg: Compression::Zstd,
                detail: "output exceeded ZSTD_compressBound".to_string(),
            });
        }
    }
    let n = outb.pos();
    out.truncate(n);
    Ok(out)
}
