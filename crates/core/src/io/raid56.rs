//! RAID5/6 parity on write (the write half of the kernel's raid56.c). A RAID5/6 chunk
//! is a sequence of full stripes ("rows"): `n - nparity` data strips of `stripe_len`
//! bytes in logical order, then P (their XOR) and for RAID6 Q (the Reed-Solomon
//! syndrome over GF(2^8): Q = sum of g^i * D_i, g = 2, polynomial x^8 + x^4 + x^3 +
//! x^2 + 1, as Linux's lib/raid6), the row's strips rotated over the chunk's devices
//! by the row number (`MapEntry::map`).
//!
//! How a write keeps parity right: the data goes to its strip, then the parity of the
//! byte range it changed (the same offsets in every strip of the row) is worked out
//! again from what the row's data strips hold on the devices now, and written. Parity
//! is byte-wise, so only that range is read and written. One process-wide lock covers
//! data write plus parity update, so two writers into one row (a commit's write-out
//! beside the next transaction's data) cannot each leave parity computed without the
//! other's data. Reading back what the devices hold, rather than trusting memory, is
//! what the kernel's read-modify-write does too: parity then also covers strips no
//! extent uses (whatever a device held before mkfs).
//!
//! Not handled here, as in the kernel's RAID5/6: the write hole. A crash between a
//! data write and its parity write leaves that row's parity stale until it is
//! written again; reads are unaffected (they use the data strips), a rebuild of a
//! lost device would not be.
//!
//! Owns: parity math and the row layout of writes. May use: `io` (devices,
//! volumes), `error`.

use crate::error::{Error, Result};
use crate::io::dev::Device;
use crate::io::volumes::MapEntry;
use std::sync::{Arc, Mutex};

/// One row's strips on their devices: where each begins.
#[derive(Debug)]
pub(crate) struct ParityRow {
    /// The data strips, in the row's (logical) order.
    pub data: Vec<(Arc<dyn Device>, u64)>,
    /// P.
    pub p: (Arc<dyn Device>, u64),
    /// Q (RAID6 only).
    pub q: Option<(Arc<dyn Device>, u64)>,
    /// Bytes per strip.
    pub strip_bytes: u64,
}

/// A write into a RAID5/6 chunk: its row, and where in the strip it starts.
#[derive(Debug, Clone)]
pub(crate) struct ParityFix {
    pub row: Arc<ParityRow>,
    pub in_strip: u64,
}

/// Serialises every RAID5/6 data write with its parity update (see the module doc).
static ROW_LOCK: Mutex<()> = Mutex::new(());

/// The row of a RAID5/6 chunk holding `logical`, with the offset of `logical` in its
/// strip; `None` for other profiles. `device` finds a device by id.
pub(crate) fn row_of(
    e: &MapEntry,
    logical: u64,
    device: &dyn Fn(u64) -> Option<Arc<dyn Device>>,
) -> Result<Option<ParityFix>> {
    let nparity = crate::io::volumes::nparity(e.ty);
    if nparity == 0 {
        return Ok(None);
    }
    let n = e.stripes.len() as u64;
    let sl = e.stripe_len;
    if n <= nparity || sl == 0 || logical < e.start {
        return Err(Error::corrupt(format!(
            "RAID5/6 chunk at logical {}: {n} stripes of {sl} bytes",
            e.start
        )));
    }
    let data = n - nparity;
    let off = logical - e.start;
    let row = off / sl / data;
    let in_strip = off % sl;
    let at = |i: u64| -> Result<(Arc<dyn Device>, u64)> {
        let s = &e.stripes[((i + row) % n) as usize];
        let dev =
            device(s.devid).ok_or_else(|| Error::Invalid(format!("devid {} missing", s.devid)))?;
        let physical = row
            .checked_mul(sl)
            .and_then(|r| s.physical.checked_add(r))
            .ok_or_else(|| Error::corrupt(format!("chunk at logical {}: overflow", e.start)))?;
        Ok((dev, physical))
    };
    let strips = (0..data).map(at).collect::<Result<Vec<_>>>()?;
    let p = at(data)?;
    let q = if nparity == 2 {
        Some(at(data + 1)?)
    } else {
        None
    };
    Ok(Some(ParityFix {
        row: Arc::new(ParityRow {
            data: strips,
            p,
            q,
            strip_bytes: sl,
        }),
        in_strip,
    }))
}

/// Multiplies by g = 2 in GF(2^8) (polynomial 0x11d).
fn times2(b: u8) -> u8 {
    (b << 1) ^ if b & 0x80 != 0 { 0x1d } else { 0 }
}

/// P and Q of equally long data strips (Q empty unless `want_q`), by Horner's rule
/// from the last strip down: Q = ((D_last * g + D_last-1) * g + ...) + D_0.
pub(crate) fn syndromes(strips: &[Vec<u8>], want_q: bool) -> (Vec<u8>, Vec<u8>) {
    let len = strips.first().map_or(0, Vec::len);
    let mut p = vec![0u8; len];
    let mut q = if want_q { vec![0u8; len] } else { Vec::new() };
    for d in strips.iter().rev() {
        for (x, y) in p.iter_mut().zip(d) {
            *x ^= y;
        }
        if want_q {
            for (x, y) in q.iter_mut().zip(d) {
                *x = times2(*x) ^ y;
            }
        }
    }
    (p, q)
}

/// Writes `data` at `physical` on `dev` (a piece of one data strip of `fix`'s row),
/// then the row's parity for the bytes it covers, under the row lock.
pub(crate) fn write_with_parity(
    dev: &dyn Device,
    physical: u64,
    data: &[u8],
    fix: &ParityFix,
) -> std::io::Result<()> {
    let len = data.len() as u64;
    if fix.in_strip + len > fix.row.strip_bytes {
        return Err(std::io::Error::other(format!(
            "a RAID5/6 write of {len} bytes at {} crosses its {}-byte strip",
            fix.in_strip, fix.row.strip_bytes
        )));
    }
    let _row = ROW_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    dev.write_at(physical, data)?;
    let mut strips = Vec::with_capacity(fix.row.data.len());
    for (d, start) in &fix.row.data {
        let mut buf = vec![0u8; data.len()];
        d.read_at(start + fix.in_strip, &mut buf)?;
        strips.push(buf);
    }
    let (p, q) = syndromes(&strips, fix.row.q.is_some());
    fix.row.p.0.write_at(fix.row.p.1 + fix.in_strip, &p)?;
    if let Some((d, start)) = &fix.row.q {
        d.write_at(start + fix.in_strip, &q)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q by the definition (sum of g^i * D_i), against Horner's rule.
    #[test]
    fn q_is_the_sum_of_powers() {
        let strips: Vec<Vec<u8>> = (0..5u8)
            .map(|i| {
                (0..64u32)
                    .map(|j| (j as u8).wrapping_mul(31) ^ i.wrapping_mul(97))
                    .collect()
            })
            .collect();
        let (p, q) = syndromes(&strips, true);
        for j in 0..64 {
            let mut want_p = 0u8;
            let mut want_q = 0u8;
            for (i, d) in strips.iter().enumerate() {
                let mut term = d[j];
                for _ in 0..i {
                    term = times2(term);
                }
                want_p ^= d[j];
                want_q ^= term;
            }
            assert_eq!((p[j], q[j]), (want_p, want_q), "byte {j}");
        }
        // g^8 = 0x1d (the polynomial's low bits): 0x80 * 2.
        assert_eq!(times2(0x80), 0x1d);
    }
}
