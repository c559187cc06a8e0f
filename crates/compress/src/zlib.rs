//! zlib extents: one RFC 1950 stream, followed on disk by zero padding.
//!
//! Like the kernel, the 2-byte zlib header is validated and skipped and the
//! body is inflated as raw deflate, so the trailing Adler-32 is never
//! checked; decoding stops as soon as the requested number of bytes has
//! been produced or the deflate stream ends.

use flate2::{Compress, Decompress, FlushCompress, FlushDecompress, Status};

use crate::{CompressError, Compression};

fn corrupt(detail: String) -> CompressError {
    CompressError::corrupt(Compression::Zlib, detail)
}

/// Inflate into `out`; returns the number of bytes produced.
pub(crate) fn decompress(input: &[u8], out: &mut [u8]) -> Result<usize, CompressError> {
    if input.len() < 3 {
        return Err(corrupt(format!(
            "stream of {} bytes is too short for a zlib header",
            input.len()
        )));
    }
    let (cmf, flg) = (input[0], input[1]);
    if cmf & 0x0f != 8 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
        return Err(corrupt(format!(
            "invalid zlib header {cmf:02x} {flg:02x} at byte 0"
        )));
    }
    if cmf >> 4 > 7 {
        return Err(corrupt(format!(
            "zlib header at byte 0 declares an invalid window size (CINFO {})",
            cmf >> 4
        )));
    }
    if flg & 0x20 != 0 {
        return Err(corrupt(
            "zlib header at byte 0 requires a preset dictionary".to_string(),
        ));
    }

    let body = &input[2..];
    let mut d = Decompress::new(false);
    let mut in_pos = 0usize;
    let mut out_pos = 0usize;
    while out_pos < out.len() {
        let before_in = d.total_in();
        let before_out = d.total_out();
        let status = d
            .decompress(&body[in_pos..], &mut out[out_pos..], FlushDecompress::None)
            .map_err(|e| {
                corrupt(format!(
                    "deflate error near byte {}: {e}",
                    2 + d.total_in() as usize
                ))
            })?;
        let read = (d.total_in() - before_in) as usize;
        let written = (d.total_out() - before_out) as usize;
        in_pos += read;
        out_pos += written;
        if status == Status::StreamEnd {
            break;
        }
        if read == 0 && written == 0 {
            return Err(corrupt(format!(
                "stream truncated: input ended at byte {} after {} of {} bytes were produced",
                input.len(),
                out_pos,
                out.len()
            )));
        }
    }
    Ok(out_pos)
}

/// Compress into one zlib stream (default window, like the kernel).
pub(crate) fn compress(input: &[u8], level: u32) -> Result<Vec<u8>, CompressError> {
    let mut c = Compress::new(flate2::Compression::new(level), true);
    let mut out = Vec::with_capacity(input.len() + input.len() / 1000 + 64);
    loop {
        let in_pos = c.total_in() as usize;
        let status = c
            .compress_vec(&input[in_pos..], &mut out, FlushCompress::Finish)
            .map_err(|e| CompressError::Compressor {
                alg: Compression::Zlib,
                detail: e.to_string(),
            })?;
        if status == Status::StreamEnd {
            return Ok(out);
        }
        out.reserve(out.capacity().max(64));
    }
}
