//! zstd extents: one zstd frame, followed on disk by zero padding.
//!
//! The kernel writes frames with a window of at most 128 KiB (window log
//! 17) and the content size recorded, and reads with a decoder limited to
//! that window; this module does the same.

use std::cell::RefCell;

use zstd::stream::raw::{CParameter, DParameter, Decoder, InBuffer, Operation, OutBuffer};
use zstd::zstd_safe::CCtx;

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

thread_local! {
    /// One compression context per thread, kept between extents: creating one
    /// and clearing its match tables for every 128 KiB extent cost more than
    /// compressing a run of zeros (a fifth of a `compress=zstd` write's time).
    /// zstd reuses a context's tables without clearing them when the parameters
    /// stay the same.
    static CCTX: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
}

/// A fresh context with the frame parameters every extent uses.
fn new_cctx() -> Result<CCtx<'static>, CompressError> {
    let mut c = CCtx::try_create().ok_or_else(|| CompressError::Compressor {
        alg: Compression::Zstd,
        detail: "no memory for a compression context".to_string(),
    })?;
    for p in [
        CParameter::WindowLog(MAX_WINDOW_LOG),
        CParameter::ContentSizeFlag(true),
        CParameter::ChecksumFlag(false),
    ] {
        c.set_parameter(p).map_err(code_error)?;
    }
    Ok(c)
}

fn code_error(code: usize) -> CompressError {
    CompressError::Compressor {
        alg: Compression::Zstd,
        detail: zstd::zstd_safe::get_error_name(code).to_string(),
    }
}

/// Compress into one frame with the content size set and window log <= 17.
/// One call (ZSTD_compress2), so the input is read in place rather than
/// copied through the streaming buffer.
pub(crate) fn compress(input: &[u8], level: i32) -> Result<Vec<u8>, CompressError> {
    CCTX.with(|cell| {
        // A nested call (none today) gets a context of its own.
        let mut own = None;
        let mut borrowed = cell.try_borrow_mut().ok();
        let slot = match borrowed.as_deref_mut() {
            Some(s) => s,
            None => &mut own,
        };
        let c = match slot {
            Some(c) => c,
            None => slot.insert(new_cctx()?),
        };
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(input.len()));
        let done = c
            .set_parameter(CParameter::CompressionLevel(level))
            .and_then(|_| c.compress2(&mut out, input));
        match done {
            Ok(_) => Ok(out),
            Err(code) => {
                // A failed call leaves the context mid-frame: start the next afresh.
                *slot = None;
                Err(code_error(code))
            }
        }
    })
}
