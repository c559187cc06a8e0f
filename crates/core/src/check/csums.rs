//! The checksum tree against file extents: every data range a checksummed file extent
//! points to has checksums, no range of a nodatasum file or of prealloc space has any,
//! no checksum lies outside a data extent, items do not overlap; with
//! `check_data_csum`, every copy of every checksummed sector is read and compared.

use super::extents::Extents;
use super::fs_roots::FsRoots;
use super::refstore::{merged, Ranges};
use super::{CheckOptions, Findings, Progress};
use crate::error::Result;
use crate::io::disk_io::{hex, FsInfo};
use crate::tree::ctree::TreeIter;
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

/// Data read per request while verifying (bounded memory).
const VERIFY_CHUNK_BYTES_MAX: usize = 4 << 20;
/// Data checksum mismatches reported one by one; more are counted in one line.
const DATA_CSUM_REPORTS_MAX: u64 = 1000;

pub(super) fn check_csums(
    fs: &FsInfo,
    opts: &CheckOptions,
    ext: &Extents,
    fsr: &FsRoots,
    ranges_mem_bytes: usize,
    f: &mut Findings,
    progress: Progress<'_>,
) -> Result<()> {
    let tree = Some(CSUM_TREE_OBJECTID);
    // What the checksum items cover (read back with `merged`).
    let mut covered = Ranges::new(ranges_mem_bytes);
    let mut bad_sectors = 0u64;
    let res = (|| -> Result<()> {
        let Some(ptr) = fs.tree_ptr(CSUM_TREE_OBJECTID) else {
            return Ok(());
        };
        let cs = fs.csum_type.size();
        let ss = fs.sectorsize as u64;
        let mut prev_end = 0u64;
        let mut verified = 0u64;
        for item in TreeIter::new(fs, &ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            if k.objectid != EXTENT_CSUM_OBJECTID || k.ty != EXTENT_CSUM_KEY {
                continue;
            }
            let data = item.data();
            let n = (data.len() / cs) as u64;
            f.stats().csum_bytes += data.len() as u64;
            let len = n * ss;
            if k.offset < prev_end {
                f.add(
                    "csum-item",
                    tree,
                    Some(item.block.bytenr),
                    Some(k),
                    format!("overlaps the previous checksum item (ends at {prev_end})"),
                );
            }
            prev_end = prev_end.max(k.offset.saturating_add(len));
            covered.push((k.offset, len));
            if opts.check_data_csum {
                verify(fs, k.offset, data, f, &mut bad_sectors);
                verified = verified.saturating_add(len);
                f.stats().data_bytes_verified = verified;
                progress(5, verified);
            }
        }
        Ok(())
    })();
    if let Err(e) = res {
        f.add(
            "block-structure",
            tree,
            None,
            None,
            format!("the checksum tree cannot be read to its end: {e}"),
        );
        return Ok(());
    }
    covered.finish()?;
    if bad_sectors > DATA_CSUM_REPORTS_MAX {
        f.add(
            "data-csum",
            tree,
            None,
            None,
            format!(
                "{} more sectors fail their checksums",
                bad_sectors - DATA_CSUM_REPORTS_MAX
            ),
        );
    }
    // Needed ranges not covered.
    subtract_each(
        merged(fsr.csum_need.iter()),
        merged(covered.iter()),
        |s, l| {
            f.add(
                "csum-missing",
                tree,
                Some(s),
                None,
                format!(
                    "data {s}..{} of a checksummed file has no checksums",
                    s.saturating_add(l)
                ),
            );
        },
    );
    // Forbidden ranges covered (both sorted by start: a covered range that ends
    // before one forbidden range starts ends before every later one does).
    let mut cov = merged(covered.iter()).peekable();
    for &(s, l, root, ino) in &fsr.csum_forbid {
        while cov.next_if(|c| c.0.saturating_add(c.1) <= s).is_some() {}
        let hit = cov.peek().and_then(|&(cs, cl)| {
            let a = cs.max(s);
            let b = cs.saturating_add(cl).min(s.saturating_add(l));
            // (not then_some: its argument is computed even when a >= b)
            if a < b {
                Some((a, b - a))
            } else {
                None
            }
        });
        if let Some((hs, hl)) = hit {
            f.add(
                "csum-unexpected",
                tree,
                Some(hs),
                None,
                format!(
                    "data {hs}..{} has checksums but inode {ino} of tree {} is nodatasum or prealloc there",
                    hs.saturating_add(hl),
                    root as i64
                ),
            );
        }
    }
    // Checksums outside every data extent.
    if ext.complete {
        subtract_each(merged(covered.iter()), merged(ext.data.iter()), |s, l| {
            f.add(
                "csum-orphan",
                tree,
                Some(s),
                None,
                format!(
                    "checksums for {s}..{} where no data extent is",
                    s.saturating_add(l)
                ),
            );
        });
    }
    covered.read_error()?;
    fsr.csum_need.read_error()?;
    ext.data.read_error()
}

/// Parts of `a` (sorted, merged) not in `b` (sorted, merged).
pub(super) fn subtract(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    subtract_each(a.iter().copied(), b.iter().copied(), |s, l| {
        out.push((s, l))
    });
    out
}

/// Calls `out` with each part of `a` not in `b`, in order; both are sorted and
/// merged (disjoint, so a range of `b` that reaches past one of `a` is the last
/// that can touch it, and is kept for the next).
fn subtract_each(
    a: impl Iterator<Item = (u64, u64)>,
    b: impl Iterator<Item = (u64, u64)>,
    mut out: impl FnMut(u64, u64),
) {
    let mut b = b.peekable();
    for (s, l) in a {
        let end = s.saturating_add(l);
        let mut pos = s;
        while b.next_if(|r| r.0.saturating_add(r.1) <= pos).is_some() {}
        while pos < end {
            match b.peek().copied() {
                Some((bs, bl)) if bs < end => {
                    if bs > pos {
                        out(pos, bs - pos);
                    }
                    pos = pos.max(bs.saturating_add(bl));
                    if bs.saturating_add(bl) <= end {
                        b.next();
                    }
                }
                _ => {
                    out(pos, end - pos);
                    pos = end;
                }
            }
        }
    }
}

/// Reads every copy of the sectors one checksum item covers and compares.
fn verify(fs: &FsInfo, start: u64, sums: &[u8], f: &mut Findings, bad: &mut u64) {
    let cs = fs.csum_type.size();
    let ss = fs.sectorsize as usize;
    let n = sums.len() / cs;
    let per = (VERIFY_CHUNK_BYTES_MAX / ss).max(1);
    let mirrors = fs.num_mirrors(start).unwrap_or(1);
    let mut buf = Vec::new();
    let mut i = 0;
    while i < n {
        let m_n = per.min(n - i);
        let logical = start.saturating_add((i * ss) as u64);
        buf.resize(m_n * ss, 0);
        for m in 0..mirrors {
            let copy = if mirrors > 1 {
                format!(" copy {}", m + 1)
            } else {
                String::new()
            };
            if let Err(e) = fs.read_logical(logical, &mut buf, m) {
                *bad += 1;
                if *bad <= DATA_CSUM_REPORTS_MAX {
                    f.add(
                        "data-csum",
                        None,
                        Some(logical),
                        None,
                        format!("{copy}: {e}"),
                    );
                }
                continue;
            }
            for s in 0..m_n {
                let got = fs.csum_type.compute(&buf[s * ss..(s + 1) * ss]);
                let want = &sums[(i + s) * cs..(i + s + 1) * cs];
                if &got[..cs] != want {
                    *bad += 1;
                    if *bad <= DATA_CSUM_REPORTS_MAX {
                        let at = logical.saturating_add((s * ss) as u64);
                        f.add(
                            "data-csum",
                            Some(CSUM_TREE_OBJECTID),
                            Some(at),
                            None,
                            format!(
                                "data at {at}{copy}: checksum {} but the csum tree says {}",
                                hex(&got[..cs]),
                                hex(want)
                            ),
                        );
                    }
                }
            }
        }
        i += m_n;
    }
}
