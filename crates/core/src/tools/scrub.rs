//! Offline scrub (the kernel's scrub.c, for an unmounted filesystem): every copy of
//! every allocated tree block and of every checksummed data sector is read and
//! verified (tree blocks: checksum and header; data: the checksum tree), and RAID5/6
//! parity of every full stripe that holds them is recomputed and compared. Unless
//! read-only, what is bad is repaired as the kernel repairs it: a bad copy is
//! rewritten from a good one (DUP, RAID1*, RAID10), a bad RAID5/6 data sector is
//! rebuilt from the other strips and P and written back with its parity, and stale
//! parity is rewritten.
//!
//! Safe only on a filesystem nothing else writes: the caller holds the write lock
//! (`Trans::open_paths`); repairs write whole sectors of a copy at the place
//! `MapEntry::map` gives, never anything the checksums do not vouch for.

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::io::raid56;
use crate::io::volumes::{data_stripes, nparity};
use crate::tree::ctree::TreeIter;
use crate::tree::tree_checker::{check_header, Expect};
use std::collections::{BTreeMap, BTreeSet};
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

/// What a scrub found and did (the counters of btrfs-progs' `scrub -B` summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Bytes of tree blocks scrubbed (every copy counted, as the kernel's "Total to
    /// scrub").
    pub tree_bytes: u64,
    /// Bytes of checksummed data scrubbed (every copy counted).
    pub data_bytes: u64,
    /// Copies of data sectors whose checksum was wrong.
    pub csum_errors: u64,
    /// Copies of tree blocks whose checksum or header was wrong.
    pub verify_errors: u64,
    /// Copies that could not be read.
    pub read_errors: u64,
    /// RAID5/6 full stripes whose parity disagreed with their data.
    pub parity_errors: u64,
    /// Errors repaired (read-only: that a good copy could repair).
    pub corrected: u64,
    /// Errors no good copy or parity can repair.
    pub uncorrectable: u64,
}

impl ScrubReport {
    /// Whether anything was wrong.
    pub fn errors(&self) -> bool {
        self.csum_errors + self.verify_errors + self.read_errors + self.parity_errors > 0
    }
}

/// What a RAID5/6 row holds that was scrubbed: the in-strip offsets of its sectors,
/// and whether any of them is left bad (its parity is then left alone: it may be
/// what can still rebuild it).
#[derive(Default)]
struct RowUse {
    sectors: BTreeSet<u64>,
    unfixed: bool,
}

/// Scrubs `fs` (see the module documentation); `readonly` only reports.
pub fn scrub(fs: &FsInfo, readonly: bool) -> Result<ScrubReport> {
    let mut r = ScrubReport::default();
    let mut rows: BTreeMap<(u64, u64), RowUse> = BTreeMap::new();
    let mut wrote = false;
    // Tree blocks, from the extent tree.
    let ext = fs
        .tree_ptr(EXTENT_TREE_OBJECTID)
        .ok_or_else(|| Error::corrupt("no extent tree"))?;
    let ctx = fs.check_ctx();
    let ns = fs.nodesize as usize;
    let mut blocks = Vec::new();
    for item in TreeIter::new(fs, &ext, Key::MIN, Key::MAX)? {
        let item = item?;
        let k = item.key();
        let tree_block = k.ty == METADATA_ITEM_KEY
            || (k.ty == EXTENT_ITEM_KEY
                && item
                    .data()
                    .get(16..24)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .is_some_and(|f| f & EXTENT_FLAG_TREE_BLOCK != 0));
        if tree_block {
            blocks.push(k.objectid);
        }
    }
    // As the kernel's scrub counts them: a tree block copy with a wrong checksum or
    // header (address, fsid, generation) is a verify error; data, a csum error.
    let block_fault = |data: &[u8], bytenr: u64| -> Option<Fault> {
        let n = fs.csum_type.size();
        let found = fs.csum_type.compute(&data[CSUM_SIZE_MAX..]);
        (found[..n] != data[..n] || check_header(&ctx, bytenr, data, &Expect::default()).is_err())
            .then_some(Fault::Verify)
    };
    for bytenr in blocks {
        r.tree_bytes += (ns * fs.num_mirrors(bytenr).unwrap_or(1)) as u64;
        let (w, unfixed) = scrub_range(fs, bytenr, ns, readonly, &mut r, &|d: &[u8]| {
            block_fault(d, bytenr)
        })?;
        wrote |= w;
        note_row(fs, bytenr, ns, unfixed, &mut rows);
    }
    // Data, from the checksum tree.
    if let Some(csum) = fs.tree_ptr(CSUM_TREE_OBJECTID) {
        let cs = fs.csum_type.size();
        let ss = fs.sectorsize as usize;
        for item in TreeIter::new(fs, &csum, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            if k.objectid != EXTENT_CSUM_OBJECTID || k.ty != EXTENT_CSUM_KEY {
                continue;
            }
            let sums = item.data();
            for (i, want) in sums.chunks_exact(cs).enumerate() {
                let logical = k.offset + (i * ss) as u64;
                r.data_bytes += (ss * fs.num_mirrors(logical).unwrap_or(1)) as u64;
                let (w, unfixed) =
                    scrub_range(fs, logical, ss, readonly, &mut r, &|d: &[u8]| {
                        (fs.csum_type.compute(d)[..cs] != *want).then_some(Fault::Csum)
                    })?;
                wrote |= w;
                note_row(fs, logical, ss, unfixed, &mut rows);
            }
        }
    }
    // RAID5/6 parity of the sectors scrubbed, row by row (as the kernel: only
    // sectors that hold extents, and not in a row with a sector left bad).
    let ss = fs.sectorsize as usize;
    for ((chunk, logical), used) in rows {
        if used.unfixed {
            continue;
        }
        let e = fs.chunk_map.lookup(chunk)?.clone();
        let Ok(Some(fix)) = raid56::row_of(&e, logical, &|d| fs.devices.get(&d).cloned()) else {
            r.read_errors += used.sectors.len() as u64;
            r.uncorrectable += used.sectors.len() as u64;
            continue;
        };
        for at in used.sectors {
            let mut strips = Vec::new();
            let mut unreadable = false;
            for (d, start) in &fix.row.data {
                let mut b = vec![0u8; ss];
                unreadable |= d.read_at(start + at, &mut b).is_err();
                strips.push(b);
            }
            let (p, q) = raid56::syndromes(&strips, fix.row.q.is_some());
            let mut stale = false;
            for (want, place) in [(&p, Some(&fix.row.p)), (&q, fix.row.q.as_ref())] {
                let Some((d, start)) = place else { continue };
                let mut got = vec![0u8; ss];
                unreadable |= d.read_at(start + at, &mut got).is_err();
                if unreadable || got == *want {
                    continue;
                }
                stale = true;
                if !readonly {
                    d.write_at(start + at, want)
                        .map_err(|err| Error::io(format!("writing parity at {logical}"), err))?;
                    wrote = true;
                }
            }
            if unreadable {
                r.read_errors += 1;
                r.uncorrectable += 1;
            } else if stale {
                r.parity_errors += 1;
                r.corrected += 1;
            }
        }
    }
    if wrote {
        for d in fs.devices.values() {
            d.flush()
                .map_err(|e| Error::io(format!("flushing {}", d.name()), e))?;
        }
    }
    Ok(r)
}

/// What is wrong with a copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Csum,
    Verify,
}

/// Records the sectors of `[logical, logical + len)` in their RAID5/6 row (chunk
/// start, first logical address of the row), and whether one is left bad.
fn note_row(
    fs: &FsInfo,
    logical: u64,
    len: usize,
    unfixed: bool,
    rows: &mut BTreeMap<(u64, u64), RowUse>,
) {
    let Ok(e) = fs.chunk_map.lookup(logical) else {
        return;
    };
    if nparity(e.ty) == 0 || e.stripe_len == 0 {
        return;
    }
    let row_bytes = e.stripe_len * data_stripes(e.ty, e.stripes.len() as u64, e.sub_stripes);
    let ss = fs.sectorsize as u64;
    let mut at = logical;
    while at < logical + len as u64 {
        let off = at - e.start;
        let row = e.start + off / row_bytes * row_bytes;
        let u = rows.entry((e.start, row)).or_default();
        u.sectors.insert(off % e.stripe_len / ss * ss);
        u.unfixed |= unfixed;
        at += ss;
    }
}

/// Verifies every copy of `[logical, logical + len)` with `fault`; repairs bad
/// copies from a good one (or, in a RAID5/6 chunk, from parity). Errors are counted
/// per sector, as the kernel counts them. Returns whether it wrote, and whether a
/// bad copy is left that nothing could repair.
fn scrub_range(
    fs: &FsInfo,
    logical: u64,
    len: usize,
    readonly: bool,
    r: &mut ScrubReport,
    fault: &dyn Fn(&[u8]) -> Option<Fault>,
) -> Result<(bool, bool)> {
    let sectors = (len / fs.sectorsize as usize).max(1) as u64;
    let e = fs.chunk_map.lookup(logical)?.clone();
    let mirrors = e.num_mirrors();
    let mut bad = Vec::new();
    let mut ok: Option<Vec<u8>> = None;
    for m in 0..mirrors {
        let mut buf = vec![0u8; len];
        match fs.read_logical(logical, &mut buf, m) {
            Err(_) => {
                r.read_errors += sectors;
                bad.push(m);
            }
            Ok(()) => match fault(&buf) {
                None => ok = ok.or(Some(buf)),
                Some(Fault::Csum) => {
                    r.csum_errors += sectors;
                    bad.push(m);
                }
                Some(Fault::Verify) => {
                    r.verify_errors += sectors;
                    bad.push(m);
                }
            },
        }
    }
    if bad.is_empty() {
        return Ok((false, false));
    }
    let parity = nparity(e.ty) > 0;
    if ok.is_none() && parity {
        ok = rebuilt_from_p(fs, &e, logical, len)?.filter(|b| fault(b).is_none());
    }
    let Some(data) = ok else {
        r.uncorrectable += sectors * bad.len() as u64;
        return Ok((false, true));
    };
    if readonly {
        r.corrected += sectors * bad.len() as u64;
        return Ok((false, false));
    }
    for m in bad {
        let mut done = 0usize;
        while done < len {
            let l = logical + done as u64;
            let p = e.map(l, m)?;
            let n = (p.len as usize).min(len - done);
            let dev = fs
                .devices
                .get(&p.devid)
                .ok_or_else(|| Error::Invalid(format!("devid {} missing", p.devid)))?;
            let piece = &data[done..done + n];
            let res = match raid56::row_of(&e, l, &|d| fs.devices.get(&d).cloned())? {
                Some(fix) => raid56::write_with_parity(&**dev, p.offset, piece, &fix),
                None => dev.write_at(p.offset, piece),
            };
            res.map_err(|err| Error::io(format!("repairing logical {l}"), err))?;
            done += n;
        }
        r.corrected += sectors;
    }
    Ok((true, false))
}

/// A RAID5/6 data range (inside one strip) rebuilt from the row's other data strips
/// and P; `None` when a strip cannot be read.
fn rebuilt_from_p(
    fs: &FsInfo,
    e: &crate::io::volumes::MapEntry,
    logical: u64,
    len: usize,
) -> Result<Option<Vec<u8>>> {
    let Some(fix) = raid56::row_of(e, logical, &|d| fs.devices.get(&d).cloned())? else {
        return Ok(None);
    };
    let here = e.map(logical, 0)?;
    let mut out = vec![0u8; len];
    let (pd, pstart) = &fix.row.p;
    if pd.read_at(pstart + fix.in_strip, &mut out).is_err() {
        return Ok(None);
    }
    let mut buf = vec![0u8; len];
    for (d, start) in &fix.row.data {
        let at = start + fix.in_strip;
        let same_dev = fs.devices.get(&here.devid).is_some_and(|h| {
            std::ptr::addr_eq(std::sync::Arc::as_ptr(h), std::sync::Arc::as_ptr(d))
        });
        if same_dev && at == here.offset {
            continue;
        }
        if d.read_at(at, &mut buf).is_err() {
            return Ok(None);
        }
        for (o, b) in out.iter_mut().zip(&buf) {
            *o ^= b;
        }
    }
    Ok(Some(out))
}
