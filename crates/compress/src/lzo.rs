//! btrfs's framing of LZO data.
//!
//! A compressed extent (regular or inline) is laid out as:
//!
//! * a little-endian u32: total length of the framed data, *including*
//!   these 4 bytes and any in-stream padding (but not the zero padding that
//!   rounds the extent up to a whole sector on disk);
//! * one or more segments, each a little-endian u32 length followed by that
//!   many bytes of an independent LZO1X stream. Each segment holds the
//!   compression of one sector-sized chunk of the file data (the last chunk
//!   may be shorter).
//!
//! A segment header never straddles a sector boundary: when fewer than 4
//! bytes are left in the current sector after a segment, those bytes are
//! zero and the next header starts at the next sector. Segment *data* may
//! cross sector boundaries freely.
//!
//! Inline extents use the same layout but hold exactly one segment, and the
//! total length equals the inline item's data size.

use crate::lzo1x::{self, worst_compress};
use crate::{CompressError, Compression};

/// Size of the total-length header and of each segment header.
pub const LZO_LEN: usize = 4;

fn corrupt(detail: String) -> CompressError {
    CompressError::corrupt(Compression::Lzo, detail)
}

fn read_le32(buf: &[u8], at: usize) -> Option<usize> {
    let b = buf.get(at..at.checked_add(LZO_LEN)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// Decode a regular (non-inline) extent. `input` is exactly the extent's
/// on-disk bytes (`disk_num_bytes`); `out` has the final size. Returns the
/// number of bytes produced.
pub(crate) fn decompress_regular(
    input: &[u8],
    out: &mut [u8],
    sectorsize: usize,
) -> Result<usize, CompressError> {
    let total = read_le32(input, 0).ok_or_else(|| {
        corrupt(format!(
            "extent of {} bytes is too short for the 4-byte length header",
            input.len()
        ))
    })?;
    let max_total = input.len().min(crate::MAX_COMPRESSED);
    if total > max_total {
        return Err(corrupt(format!(
            "header length {total} exceeds the compressed extent size {} (max {})",
            input.len(),
            crate::MAX_COMPRESSED
        )));
    }
    // Every on-disk sector of the extent must be used by the stream.
    if total.next_multiple_of(sectorsize) < input.len() {
        return Err(corrupt(format!(
            "header length {total} leaves whole unused sectors in a compressed extent of {} bytes",
            input.len()
        )));
    }
    if out.is_empty() {
        return Ok(0);
    }

    let seg_max = worst_compress(sectorsize);
    let mut scratch = vec![0u8; seg_max];
    let mut cur = LZO_LEN;
    let mut produced = 0usize;
    while cur < total {
        let hdr = cur;
        let seg_len = read_le32(input, hdr).ok_or_else(|| {
            corrupt(format!(
                "segment header at byte {hdr} runs past the end of the {}-byte extent",
                input.len()
            ))
        })?;
        cur += LZO_LEN;
        if seg_len > seg_max {
            return Err(corrupt(format!(
                "segment length {seg_len} at byte {hdr} exceeds the maximum {seg_max} \
                 for sectorsize {sectorsize}"
            )));
        }
        let data = input.get(cur..cur + seg_len).ok_or_else(|| {
            corrupt(format!(
                "segment of {seg_len} bytes at byte {hdr} runs past the end of the {}-byte extent",
                input.len()
            ))
        })?;
        let n = lzo1x::decompress_safe(data, &mut scratch)
            .map_err(|e| corrupt(format!("segment at byte {hdr}: {e}")))?;
        let take = n.min(out.len() - produced);
        out[produced..produced + take].copy_from_slice(&scratch[..take]);
        produced += take;
        cur += seg_len;
        if produced == out.len() {
            // Everything the caller asked for has been produced; like the
            // kernel, do not look at further segments.
            return Ok(produced);
        }
        let left = sectorsize - cur % sectorsize;
        if left < LZO_LEN {
            cur += left;
        }
    }
    // Fewer bytes than requested: the caller zero-fills the rest.
    Ok(produced)
}

/// Decode an inline extent: total header, one segment header, one segment.
/// Returns the number of bytes produced.
pub(crate) fn decompress_inline(
    input: &[u8],
    out: &mut [u8],
    sectorsize: usize,
) -> Result<usize, CompressError> {
    let seg_max = worst_compress(sectorsize);
    if input.len() < 2 * LZO_LEN || input.len() > seg_max + 2 * LZO_LEN {
        return Err(corrupt(format!(
            "inline extent size {} is outside the valid range {}..={}",
            input.len(),
            2 * LZO_LEN,
            seg_max + 2 * LZO_LEN
        )));
    }
    let total = read_le32(input, 0).unwrap_or(usize::MAX);
    if total != input.len() {
        return Err(corrupt(format!(
            "inline header length {total} differs from the inline data size {}",
            input.len()
        )));
    }
    let seg_len = read_le32(input, LZO_LEN).unwrap_or(usize::MAX);
    if seg_len != input.len() - 2 * LZO_LEN {
        return Err(corrupt(format!(
            "inline segment length {seg_len} at byte 4 should be {}",
            input.len() - 2 * LZO_LEN
        )));
    }
    let mut scratch = vec![0u8; sectorsize];
    let n = lzo1x::decompress_safe(&input[2 * LZO_LEN..], &mut scratch)
        .map_err(|e| corrupt(format!("inline segment at byte 4: {e}")))?;
    let take = n.min(out.len());
    out[..take].copy_from_slice(&scratch[..take]);
    Ok(take)
}

/// Compress `input` (at most 128 KiB, starting at a sector-aligned file
/// offset) into btrfs's LZO framing, exactly as the kernel lays it out.
///
/// With `early_abort`, returns `None` when the kernel would give up early
/// because the data is growing (after more than two sectors, more output
/// than input).
pub(crate) fn compress(input: &[u8], sectorsize: usize, early_abort: bool) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len() / 2 + 64);
    out.extend_from_slice(&[0u8; LZO_LEN]);
    let mut consumed = 0usize;
    for chunk in input.chunks(sectorsize) {
        let seg = lzo1x::compress(chunk);
        // A header always fits in the current sector (see padding below).
        out.extend_from_slice(&(seg.len() as u32).to_le_bytes());
        out.extend_from_slice(&seg);
        let left = out.len().next_multiple_of(sectorsize) - out.len();
        if left > 0 && left < LZO_LEN {
            out.resize(out.len() + left, 0);
        }
        consumed += chunk.len();
        if early_abort && consumed > 2 * sectorsize && consumed < out.len() {
            return None;
        }
    }
    let total = out.len() as u32;
    out[..LZO_LEN].copy_from_slice(&total.to_le_bytes());
    Some(out)
}
