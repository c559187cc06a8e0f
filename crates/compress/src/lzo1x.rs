//! A small, safe, from-scratch implementation of the LZO1X bitstream
//! (the format produced by `lzo1x_1_compress` and read by
//! `lzo1x_decompress_safe`).
//!
//! # The bitstream, in short
//!
//! An LZO1X stream is a sequence of byte-aligned instructions. Each one is
//! either a run of *literals* (bytes copied verbatim from the input) or a
//! *match* (a copy of `len` bytes starting `dist` bytes back in the output
//! produced so far; source and destination may overlap, which is how runs
//! are encoded). Literal counts of 0..=3 that directly follow a match are not
//! encoded as a separate instruction but in the two low bits ("S") of the
//! match instruction (in the opcode itself for short matches, in the low bits
//! of the 16-bit distance field otherwise). The decoder therefore carries a
//! small *state*: how many literals the previous instruction copied
//! (0, 1..=3, or "4 or more"). The meaning of opcodes 0..=15 depends on it.
//!
//! Lengths that do not fit in their opcode field use a *length extension*:
//! the field is 0 and is followed by N zero bytes and one non-zero byte `b`;
//! the extension's value is `255 * N + b`.
//!
//! **First byte.** If the stream is at least 5 bytes long and starts with 17,
//! the second byte is a bitstream version (nonzero = "LZO-RLE", used by zram,
//! never by btrfs) and instructions start at byte 2. Then, if the first
//! instruction byte is greater than 17, it stands for `byte - 17` literals
//! (1..=238), and the state becomes that count (or "4+" when it is ≥ 4).
//! Otherwise decoding starts with state 0 at that byte.
//!
//! **Instructions** (`L` = length bits, `D`/`H` = distance bits, `S` = literal
//! count that follows the match and becomes the next state):
//!
//! | opcode bits  | meaning |
//! |--------------|---------|
//! | `0000LLLL`, state 0 | literal run of `3 + L` bytes, or `18 + ext` when `L == 0`; state becomes "4+" |
//! | `0000DDSS`, state 1..=3 | 2-byte match, one more byte `H`; `dist = (H << 2) + D + 1` |
//! | `0000DDSS`, state 4+ | 3-byte match, one more byte `H`; `dist = (H << 2) + D + 2049` |
//! | `0001HLLL` | match of `2 + L` bytes (`9 + ext` when `L == 0`), then a little-endian u16 `DDDDDDDDDDDDDDSS`; `dist = 16384 + (H << 14) + D`. `dist == 16384` (H = 0, D = 0) is the **end-of-stream marker**, always written as `11 00 00`. |
//! | `001LLLLL` | match of `2 + L` bytes (`33 + ext` when `L == 0`), then a LE u16 `DDDDDDDDDDDDDDSS`; `dist = D + 1` (up to 16 KiB) |
//! | `01LDDDSS` | match of `3 + L` bytes, one more byte `H`; `dist = (H << 3) + D + 1` (up to 2 KiB) |
//! | `1LLDDDSS` | match of `5 + L` bytes, one more byte `H`; `dist = (H << 3) + D + 1` |
//!
//! After every match, `S` (0..=3) literal bytes follow immediately.
//!
//! LZO-RLE (version ≥ 1 only): a `00011LLL` opcode whose u16 has all 14 `D`
//! bits set is a run of zeros instead of a match; it is followed by one more
//! byte `X` and the run is `((X << 3) | L) + 4` bytes long.
//!
//! A well formed stream ends exactly after the end-of-stream marker; the
//! Linux decoder rejects trailing bytes, a marker with a different length
//! field, truncated input, output overflow and back-references that reach
//! before the start of the output. This decoder rejects the same things.

use std::fmt;

/// Why an LZO1X stream could not be decoded. Offsets are relative to the
/// start of the LZO1X stream that was passed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lzo1xError {
    /// The stream ended in the middle of an instruction.
    InputOverrun {
        /// Offset of the instruction being decoded.
        at: usize,
    },
    /// Decoding would produce more bytes than the output buffer holds.
    OutputOverrun {
        /// Offset of the instruction being decoded.
        at: usize,
        /// Output capacity.
        capacity: usize,
    },
    /// A match refers to data before the start of the output.
    LookBehindOverrun {
        /// Offset of the instruction being decoded.
        at: usize,
        /// Match distance.
        dist: usize,
        /// Bytes produced so far.
        produced: usize,
    },
    /// The end-of-stream marker was malformed.
    BadEndMarker {
        /// Offset of the marker.
        at: usize,
    },
    /// Bytes follow the end-of-stream marker.
    TrailingData {
        /// Offset just after the marker.
        end: usize,
        /// Stream length.
        len: usize,
    },
}

impl fmt::Display for Lzo1xError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lzo1xError::InputOverrun { at } => {
                write!(f, "stream truncated in instruction at offset {at}")
            }
            Lzo1xError::OutputOverrun { at, capacity } => write!(
                f,
                "instruction at offset {at} would exceed the output size of {capacity} bytes"
            ),
            Lzo1xError::LookBehindOverrun { at, dist, produced } => write!(
                f,
                "match at offset {at} has distance {dist} but only {produced} bytes were produced"
            ),
            Lzo1xError::BadEndMarker { at } => {
                write!(f, "malformed end-of-stream marker at offset {at}")
            }
            Lzo1xError::TrailingData { end, len } => write!(
                f,
                "end-of-stream marker ends at offset {end} but the stream is {len} bytes long"
            ),
        }
    }
}

impl std::error::Error for Lzo1xError {}

/// Bounds-checked reader over the compressed stream.
struct Input<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Start of the instruction being decoded (for error messages).
    insn: usize,
}

impl<'a> Input<'a> {
    fn byte(&mut self) -> Result<u8, Lzo1xError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or(Lzo1xError::InputOverrun { at: self.insn })?;
        self.pos += 1;
        Ok(b)
    }

    fn peek_u16(&self) -> Result<u16, Lzo1xError> {
        match self.buf.get(self.pos..self.pos + 2) {
            Some(b) => Ok(u16::from_le_bytes([b[0], b[1]])),
            None => Err(Lzo1xError::InputOverrun { at: self.insn }),
        }
    }

    fn u16(&mut self) -> Result<u16, Lzo1xError> {
        let v = self.peek_u16()?;
        self.pos += 2;
        Ok(v)
    }

    fn slice(&mut self, n: usize) -> Result<&'a [u8], Lzo1xError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(Lzo1xError::InputOverrun { at: self.insn })?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(Lzo1xError::InputOverrun { at: self.insn })?;
        self.pos = end;
        Ok(s)
    }

    /// Length extension: N zero bytes then one non-zero byte; 255*N + last.
    fn extension(&mut self) -> Result<usize, Lzo1xError> {
        let mut zeros = 0usize;
        loop {
            let b = self.byte()?;
            if b != 0 {
                // `zeros` is bounded by the input length, so this cannot
                // overflow on 64-bit; stay checked for 32-bit targets.
                return zeros
                    .checked_mul(255)
                    .and_then(|v| v.checked_add(usize::from(b)))
                    .ok_or(Lzo1xError::InputOverrun { at: self.insn });
            }
            zeros += 1;
        }
    }
}

/// Bounds-checked writer into the caller's output buffer.
struct Output<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Output<'_> {
    fn room(&self, n: usize, at: usize) -> Result<(), Lzo1xError> {
        if n > self.buf.len() - self.pos {
            return Err(Lzo1xError::OutputOverrun {
                at,
                capacity: self.buf.len(),
            });
        }
        Ok(())
    }

    fn literals(&mut self, src: &[u8], at: usize) -> Result<(), Lzo1xError> {
        self.room(src.len(), at)?;
        self.buf[self.pos..self.pos + src.len()].copy_from_slice(src);
        self.pos += src.len();
        Ok(())
    }

    fn zeros(&mut self, n: usize, at: usize) -> Result<(), Lzo1xError> {
        self.room(n, at)?;
        self.buf[self.pos..self.pos + n].fill(0);
        self.pos += n;
        Ok(())
    }

    fn copy_match(&mut self, dist: usize, len: usize, at: usize) -> Result<(), Lzo1xError> {
        if dist == 0 || dist > self.pos {
            return Err(Lzo1xError::LookBehindOverrun {
                at,
                dist,
                produced: self.pos,
            });
        }
        self.room(len, at)?;
        let start = self.pos - dist;
        if dist >= len {
            self.buf.copy_within(start..start + len, self.pos);
        } else {
            // Overlapping copy: each output byte may depend on one written
            // by this same match, so go byte by byte.
            for i in 0..len {
                self.buf[self.pos + i] = self.buf[start + i];
            }
        }
        self.pos += len;
        Ok(())
    }
}

/// State value meaning "the last instruction copied 4 or more literals".
const STATE_LONG: usize = 4;

/// Decompress one LZO1X stream (`src`, exactly one stream, no trailing
/// bytes) into `dst`. Returns the number of bytes written.
///
/// Never panics and never writes outside `dst`; any malformed input yields
/// an [`Lzo1xError`]. Accepts exactly what the Linux kernel's
/// `lzo1x_decompress_safe` accepts (including the LZO-RLE variant).
pub fn decompress_safe(src: &[u8], dst: &mut [u8]) -> Result<usize, Lzo1xError> {
    let mut inp = Input {
        buf: src,
        pos: 0,
        insn: 0,
    };
    let mut out = Output { buf: dst, pos: 0 };

    let mut rle = false;
    if src.len() >= 5 && src[0] == 17 {
        rle = src[1] != 0;
        inp.pos = 2;
    }

    let mut state = 0usize;
    inp.insn = inp.pos;
    let first = *src
        .get(inp.pos)
        .ok_or(Lzo1xError::InputOverrun { at: inp.pos })?;
    if first > 17 {
        inp.pos += 1;
        let n = usize::from(first - 17);
        let lits = inp.slice(n)?;
        out.literals(lits, inp.insn)?;
        state = n.min(STATE_LONG);
    }

    loop {
        inp.insn = inp.pos;
        let at = inp.insn;
        let op = inp.byte()?;
        let (dist, len, next_state);
        match op {
            0..=15 => match state {
                0 => {
                    let n = if op == 0 {
                        18 + inp.extension()?
                    } else {
                        3 + usize::from(op)
                    };
                    let lits = inp.slice(n)?;
                    out.literals(lits, at)?;
                    state = STATE_LONG;
                    continue;
                }
                1..=3 => {
                    let h = usize::from(inp.byte()?);
                    dist = (h << 2) + usize::from((op >> 2) & 3) + 1;
                    len = 2;
                    next_state = usize::from(op & 3);
                }
                _ => {
                    let h = usize::from(inp.byte()?);
                    dist = (h << 2) + usize::from((op >> 2) & 3) + 2049;
                    len = 3;
                    next_state = usize::from(op & 3);
                }
            },
            16..=31 => {
                // The RLE form is recognised on the two bytes right after
                // the opcode, before any length extension is read.
                if rle && op & 0xf8 == 0x18 && inp.peek_u16()? & 0xfffc == 0xfffc {
                    let ds = inp.u16()?;
                    let x = usize::from(inp.byte()?);
                    let run = ((x << 3) | usize::from(op & 7)) + 4;
                    out.zeros(run, at)?;
                    let s = usize::from(ds & 3);
                    let lits = inp.slice(s)?;
                    out.literals(lits, at)?;
                    state = s;
                    continue;
                }
                let l = usize::from(op & 7);
                len = if l == 0 { 9 + inp.extension()? } else { l + 2 };
                let ds = inp.u16()?;
                let d = usize::from(ds >> 2) + (usize::from(op & 8) << 11);
                if d == 0 {
                    // End of stream.
                    if len != 3 {
                        return Err(Lzo1xError::BadEndMarker { at });
                    }
                    if inp.pos != src.len() {
                        return Err(Lzo1xError::TrailingData {
                            end: inp.pos,
                            len: src.len(),
                        });
                    }
                    return Ok(out.pos);
                }
                dist = d + 16384;
                next_state = usize::from(ds & 3);
            }
            32..=63 => {
                let l = usize::from(op & 31);
                len = if l == 0 { 33 + inp.extension()? } else { l + 2 };
                let ds = inp.u16()?;
                dist = usize::from(ds >> 2) + 1;
                next_state = usize::from(ds & 3);
            }
            64..=255 => {
                let h = usize::from(inp.byte()?);
                len = usize::from(op >> 5) + 1;
                dist = (h << 3) + usize::from((op >> 2) & 7) + 1;
                next_state = usize::from(op & 3);
            }
        }
        out.copy_match(dist, len, at)?;
        let lits = inp.slice(next_state)?;
        out.literals(lits, at)?;
        state = next_state;
    }
}

/// Worst-case size of the LZO1X encoding of `n` input bytes
/// (same bound as the kernel's `lzo1x_worst_compress`).
pub const fn worst_compress(n: usize) -> usize {
    n + n / 16 + 64 + 3
}

/// Longest distance any LZO1X match can encode.
const MAX_DIST: usize = 0xbfff;
/// Shortest match the compressor looks for.
const MIN_MATCH: usize = 4;
const HASH_BITS: u32 = 14;

/// Compress `src` into a single plain (version 0) LZO1X stream that
/// [`decompress_safe`] and the kernel's `lzo1x_decompress_safe` accept.
///
/// Greedy parser with a single-entry hash table; good enough for btrfs's
/// sector-sized segments. The result never starts with the byte 17, so it
/// is never mistaken for an LZO-RLE stream. Output size is at most
/// [`worst_compress`]`(src.len())`.
pub fn compress(src: &[u8]) -> Vec<u8> {
    let mut enc = Encoder {
        out: Vec::with_capacity(worst_compress(src.len())),
        s_pos: None,
    };
    let mut table = vec![u32::MAX; 1 << HASH_BITS];
    let mut lit_start = 0usize;
    let mut ip = 0usize;

    while ip + MIN_MATCH <= src.len() {
        let key = read_u32(src, ip);
        let h = hash(key);
        let cand = table[h];
        // Positions are < 2^32 because btrfs inputs are at most 128 KiB;
        // larger inputs simply stop finding matches past 4 GiB.
        table[h] = u32::try_from(ip).unwrap_or(u32::MAX);
        let cand = cand as usize;
        if cand < ip && ip - cand <= MAX_DIST && read_u32(src, cand) == key {
            let mut len = MIN_MATCH;
            while ip + len < src.len() && src[cand + len] == src[ip + len] {
                len += 1;
            }
            enc.literals(&src[lit_start..ip]);
            enc.matched(ip - cand, len);
            // Index a few positions inside the match so later data can
            // refer to it; cheap and noticeably better on text.
            let end = ip + len;
            let mut p = ip + 1;
            while p + MIN_MATCH <= src.len() && p < end {
                table[hash(read_u32(src, p))] = u32::try_from(p).unwrap_or(u32::MAX);
                p += 1;
            }
            ip = end;
            lit_start = ip;
        } else {
            ip += 1;
        }
    }
    enc.literals(&src[lit_start..]);
    enc.out.extend_from_slice(&[0x11, 0x00, 0x00]);
    enc.out
}

fn read_u32(src: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]])
}

fn hash(v: u32) -> usize {
    (v.wrapping_mul(0x9e37_79b1) >> (32 - HASH_BITS)) as usize
}

struct Encoder {
    out: Vec<u8>,
    /// Index of the byte whose two low bits hold the "S" literal count of
    /// the most recent match, if any instruction has been emitted.
    s_pos: Option<usize>,
}

impl Encoder {
    /// Write a length extension for `v >= 1`.
    fn extension(&mut self, mut v: usize) {
        while v > 255 {
            self.out.push(0);
            v -= 255;
        }
        self.out.push(v as u8);
    }

    fn literals(&mut self, lits: &[u8]) {
        let n = lits.len();
        if n == 0 {
            return;
        }
        if self.out.is_empty() {
            // Stream start: literal count in the first byte when it fits.
            if n <= 238 {
                self.out.push((n + 17) as u8);
            } else {
                self.out.push(0);
                self.extension(n - 18);
            }
        } else if n <= 3 {
            // Short runs ride in the previous match's S bits. Every
            // instruction before a literal run is a match, so s_pos is set.
            if let Some(p) = self.s_pos {
                self.out[p] |= n as u8;
            }
        } else if n <= 18 {
            self.out.push((n - 3) as u8);
        } else {
            self.out.push(0);
            self.extension(n - 18);
        }
        self.out.extend_from_slice(lits);
    }

    /// Emit a match; `len >= 3`, `1 <= dist <= MAX_DIST`.
    fn matched(&mut self, dist: usize, len: usize) {
        if len <= 8 && dist <= 2048 {
            let d = dist - 1;
            self.s_pos = Some(self.out.len());
            self.out.push((((len - 1) << 5) | ((d & 7) << 2)) as u8);
            self.out.push((d >> 3) as u8);
        } else if dist <= 16384 {
            let d = dist - 1;
            if len <= 33 {
                self.out.push((32 | (len - 2)) as u8);
            } else {
                self.out.push(32);
                self.extension(len - 33);
            }
            self.s_pos = Some(self.out.len());
            self.out.push(((d << 2) & 0xff) as u8);
            self.out.push((d >> 6) as u8);
        } else {
            let d = dist - 16384;
            let h = ((d >> 14) & 1) << 3;
            let low = d & 0x3fff;
            if len <= 9 {
                self.out.push((16 | h | (len - 2)) as u8);
            } else {
                self.out.push((16 | h) as u8);
                self.extension(len - 9);
            }
            self.s_pos = Some(self.out.len());
            self.out.push(((low << 2) & 0xff) as u8);
            self.out.push((low >> 6) as u8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(data: &[u8]) {
        let c = compress(data);
        assert!(c.len() <= worst_compress(data.len()), "worst case exceeded");
        if c.len() >= 5 {
            assert_ne!(c[0], 17);
        }
        let mut out = vec![0u8; data.len()];
        let n = decompress_safe(&c, &mut out).expect("decode");
        assert_eq!(n, data.len());
        assert_eq!(&out[..n], data);
        // One byte too small must fail cleanly.
        if !data.is_empty() {
            let mut small = vec![0u8; data.len() - 1];
            assert!(matches!(
                decompress_safe(&c, &mut small),
                Err(Lzo1xError::OutputOverrun { .. })
            ));
        }
    }

    #[test]
    fn empty_stream() {
        assert_eq!(compress(&[]), vec![0x11, 0, 0]);
        let mut out = [0u8; 4];
        assert_eq!(decompress_safe(&[0x11, 0, 0], &mut out), Ok(0));
    }

    #[test]
    fn literal_lengths() {
        for n in [
            1usize, 2, 3, 4, 5, 17, 18, 19, 20, 237, 238, 239, 240, 255, 256, 300, 600,
        ] {
            // Incompressible-ish bytes.
            let data: Vec<u8> = (0..n)
                .map(|i| (i * 131 % 251) as u8 ^ (i >> 3) as u8)
                .collect();
            roundtrip(&data);
        }
    }

    #[test]
    fn match_kinds() {
        // Short distance, short and long lengths (M2 / M3 with extension).
        for len in [4usize, 5, 8, 9, 33, 34, 35, 288, 289, 1000] {
            let mut d = b"abcdefgh".to_vec();
            d.extend(std::iter::repeat_n(b'z', len));
            d.extend_from_slice(b"0123");
            roundtrip(&d);
        }
        // Distances around the M2/M3/M4 boundaries with various lengths.
        for dist in [
            2047usize, 2048, 2049, 16383, 16384, 16385, 32768, 32769, 49151, 49152,
        ] {
            for len in [4usize, 8, 9, 10, 40, 300] {
                let mut state = 0x1234_5678u32;
                let mut rnd = |n: usize| {
                    (0..n)
                        .map(|_| {
                            state ^= state << 13;
                            state ^= state >> 17;
                            state ^= state << 5;
                            state as u8
                        })
                        .collect::<Vec<u8>>()
                };
                let head = rnd(len);
                let mut d = head.clone();
                d.extend(rnd(dist - len));
                d.extend_from_slice(&head);
                d.extend(rnd(3));
                roundtrip(&d);
            }
        }
    }

    #[test]
    fn trailing_short_literals_after_match() {
        for tail in 0..6usize {
            let mut d = b"hello hello hello hello".to_vec();
            d.extend_from_slice(&b"XYZWV"[..tail.min(5)]);
            roundtrip(&d);
        }
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        let mut out = [0u8; 64];
        assert!(decompress_safe(&[], &mut out).is_err());
        assert!(decompress_safe(&[0x11], &mut out).is_err());
        // Bad end markers.
        assert!(matches!(
            decompress_safe(&[0x12, 0x11, 0x00, 0x00], &mut out),
            Err(Lzo1xError::InputOverrun { .. }) | Err(Lzo1xError::BadEndMarker { .. })
        ));
        assert!(matches!(
            decompress_safe(&[0x15, b'a', b'b', b'c', b'd', 0x12, 0, 0], &mut out),
            Err(Lzo1xError::BadEndMarker { .. })
        ));
        // Trailing byte after the end marker.
        assert!(matches!(
            decompress_safe(&[0x11, 0, 0, 0], &mut out),
            Err(Lzo1xError::TrailingData { .. })
        ));
        // Match reaching before the output start.
        assert!(matches!(
            decompress_safe(&[0x12, b'a', 0x40 | 0x1c, 0x00, 0x11, 0, 0], &mut out),
            Err(Lzo1xError::LookBehindOverrun { .. })
        ));
        // Long zero run of a length extension, then EOF of input.
        let mut z = vec![0x00u8];
        z.extend(std::iter::repeat_n(0u8, 1000));
        assert!(decompress_safe(&z, &mut out).is_err());
    }

    #[test]
    fn rle_zero_run() {
        // Version-1 stream: 17, 1, then 4 literals, RLE run of zeros
        // (opcode 0x18|L, u16 = 0xfffc, X), end marker.
        let mut s = vec![17u8, 1, 21, b'a', b'b', b'c', b'd'];
        s.extend_from_slice(&[0x18 | 3, 0xfc, 0xff, 2]); // run = ((2<<3)|3)+4 = 23
        s.extend_from_slice(&[0x11, 0, 0]);
        let mut out = [0xaau8; 40];
        let n = decompress_safe(&s, &mut out).expect("rle decode");
        assert_eq!(n, 27);
        assert_eq!(&out[..4], b"abcd");
        assert!(out[4..27].iter().all(|&b| b == 0));
        // The same bytes with version 0 are a normal (invalid here) match.
        s[1] = 0;
        assert!(decompress_safe(&s, &mut out).is_err());
    }
}
