//! The references the extent tree must hold, as the block walk finds them, in a
//! [`Spill`]: sorted runs in a temporary file beyond a memory limit, read back
//! merged in (bytenr, kind) order. And data ranges, in a [`Spill`] of their own.

use super::blocks::{ExpRef, RefKind};
use super::spill::{Record, Spill};

/// Default memory for the references: above it they spill to a temporary file.
pub(crate) const REFS_MEM_BYTES_DEFAULT: usize = 256 << 20;
/// Default memory for each list of data ranges.
pub(crate) const RANGES_MEM_BYTES_DEFAULT: usize = 64 << 20;

/// Every expected reference.
pub(super) type RefStore = Spill<ExpRef>;

impl Default for RefStore {
    fn default() -> RefStore {
        RefStore::new(REFS_MEM_BYTES_DEFAULT)
    }
}

impl Record for ExpRef {
    const BYTES: usize = 56;
    /// The whole record: equal (bytenr, kind) pairs come out in the same order
    /// whether or not they were spilled (the reports name the first one's parent).
    type Key = (u64, RefKind, u8, u64, u64, u32);

    fn key(&self) -> Self::Key {
        (
            self.bytenr,
            self.kind,
            self.level,
            self.len,
            self.from,
            self.count,
        )
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let (tag, a, b, c) = match self.kind {
            RefKind::Tree(x) => (0u8, x, 0, 0),
            RefKind::Shared(x) => (1, x, 0, 0),
            RefKind::Data(x, y, z) => (2, x, y, z),
            RefKind::SharedData(x) => (3, x, 0, 0),
        };
        for v in [self.bytenr, a, b, c, self.len, self.from] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&[tag, self.level, 0, 0]);
    }

    fn decode(b: &[u8]) -> ExpRef {
        let (a, bb, c) = (le64(b, 8), le64(b, 16), le64(b, 24));
        let kind = match b[52] {
            0 => RefKind::Tree(a),
            1 => RefKind::Shared(a),
            2 => RefKind::Data(a, bb, c),
            _ => RefKind::SharedData(a),
        };
        let mut cnt = [0u8; 4];
        cnt.copy_from_slice(&b[48..52]);
        ExpRef {
            bytenr: le64(b, 0),
            kind,
            count: u32::from_le_bytes(cnt),
            len: le64(b, 32),
            level: b[53],
            from: le64(b, 40),
        }
    }
}

/// Data ranges (start, length), read back sorted; [`merged`] joins those that
/// overlap or touch.
pub(super) type Ranges = Spill<(u64, u64)>;

impl Default for Ranges {
    fn default() -> Ranges {
        Ranges::new(RANGES_MEM_BYTES_DEFAULT)
    }
}

impl Record for (u64, u64) {
    const BYTES: usize = 16;
    type Key = (u64, u64);

    fn key(&self) -> (u64, u64) {
        *self
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_le_bytes());
        out.extend_from_slice(&self.1.to_le_bytes());
    }

    fn decode(b: &[u8]) -> (u64, u64) {
        (le64(b, 0), le64(b, 8))
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Sorted ranges with those that overlap or touch joined (the streaming form of
/// `fs_roots::merge`).
pub(super) fn merged(mut it: impl Iterator<Item = (u64, u64)>) -> impl Iterator<Item = (u64, u64)> {
    let mut cur = it.next();
    std::iter::from_fn(move || {
        let mut c = cur?;
        loop {
            match it.next() {
                Some((s, l)) if s <= c.0.saturating_add(c.1) => {
                    c.1 = c.1.max(s.saturating_add(l) - c.0);
                }
                next => {
                    cur = next;
                    return Some(c);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(bytenr: u64, kind: RefKind) -> ExpRef {
        ExpRef {
            bytenr,
            kind,
            count: 1,
            len: 4096,
            level: 0,
            from: bytenr ^ 7,
        }
    }

    #[test]
    fn spilled_runs_merge_in_order_with_memory() {
        // A limit of 16 references: many runs and a remainder in memory.
        let mut s = RefStore::new(0);
        let mut want = Vec::new();
        for i in 0..1000u64 {
            let b = (i * 7919) % 613;
            let k = match i % 4 {
                0 => RefKind::Tree(i),
                1 => RefKind::Shared(i + 1),
                2 => RefKind::Data(5, i, i * 4096),
                _ => RefKind::SharedData(i * 3),
            };
            s.push(r(b, k));
            want.push(r(b, k));
        }
        s.finish().expect("finish");
        assert!(s.spilled() > 900, "spilled {}", s.spilled());
        want.sort_unstable_by_key(ExpRef::key);
        for _ in 0..2 {
            let got: Vec<ExpRef> = s.iter().collect();
            s.read_error().expect("no read error");
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.key(), w.key());
            }
        }
    }

    #[test]
    fn ranges_spill_and_merge_like_the_slice_merge() {
        let mut s = Ranges::new(0);
        let mut v = Vec::new();
        for i in 0..500u64 {
            let r = ((i * 104_729) % 9973 * 16, 8 + i % 40);
            s.push(r);
            v.push(r);
        }
        s.finish().expect("finish");
        assert!(s.spilled() > 400);
        let got: Vec<(u64, u64)> = merged(s.iter()).collect();
        assert_eq!(got, super::super::fs_roots::merge(v));
    }
}
