//! Bounds-checked little-endian reading.

use crate::{FormatError, Result};

/// A forward cursor over a byte slice; every read is bounds-checked.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`; `what` names the structure in errors.
    #[inline]
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Cursor { buf, pos: 0, what }
    }
    /// A cursor at offset `pos` of `buf`.
    #[inline]
    pub fn at(buf: &'a [u8], pos: usize, what: &'static str) -> Self {
        Cursor { buf, pos, what }
    }
    /// Current offset.
    #[inline]
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// Bytes left after the current offset.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
    /// Whether no bytes are left.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
    /// The next `n` bytes.
    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(FormatError::Truncated {
                what: self.what,
                offset: self.pos,
                need: n,
                have: self.remaining(),
            }),
        }
    }
    /// Skips `n` bytes.
    #[inline]
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.bytes(n).map(|_| ())
    }
    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    /// Reads a u8.
    #[inline]
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    /// Reads a little-endian u16.
    #[inline]
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// Reads a little-endian u32.
    #[inline]
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// Reads a little-endian u64.
    #[inline]
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Reads a little-endian u64 at `off`, or a truncation error.
#[inline]
pub fn le64(buf: &[u8], off: usize, what: &'static str) -> Result<u64> {
    Cursor::at(buf, off, what).u64()
}
/// Reads a little-endian u32 at `off`, or a truncation error.
#[inline]
pub fn le32(buf: &[u8], off: usize, what: &'static str) -> Result<u32> {
    Cursor::at(buf, off, what).u32()
}
/// Reads a little-endian u16 at `off`, or a truncation error.
#[inline]
pub fn le16(buf: &[u8], off: usize, what: &'static str) -> Result<u16> {
    Cursor::at(buf, off, what).u16()
}

/// Writes little-endian integers into a buffer (used by writers and tests).
pub fn put64(buf: &mut [u8], off: usize, v: u64) {
    buf[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
/// Writes a little-endian u32 at `off` (panics if out of bounds).
pub fn put32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
/// Writes a little-endian u16 at `off` (panics if out of bounds).
pub fn put16(buf: &mut [u8], off: usize, v: u16) {
    buf[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// Appends little-endian integers to a growing buffer (used by the serializers).
pub fn push64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
/// Appends a little-endian u32.
pub fn push32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
/// Appends a little-endian u16.
pub fn push16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Formats a 16-byte UUID the usual 8-4-4-4-12 way.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn cursor_bounds() {
        let b = [1u8, 0, 0, 0, 2];
        let mut c = Cursor::new(&b, "t");
        assert_eq!(c.u32().unwrap(), 1);
        assert!(c.u32().is_err());
        assert_eq!(c.u8().unwrap(), 2);
        assert!(c.u8().is_err());
        assert!(Cursor::at(&b, usize::MAX, "t").u8().is_err());
    }
    #[test]
    fn uuid_fmt() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0, 1, 2, 3, 4, 5, 6, 7,
        ];
        assert_eq!(uuid_string(&u), "12345678-9abc-def0-0001-020304050607");
    }
}
