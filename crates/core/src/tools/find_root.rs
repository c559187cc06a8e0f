//! Finding older tree roots on the devices, as `btrfs-find-root` does: every
//! nodesize step of every metadata chunk is read; a block whose checksum, address
//! and fsid are right, owned by the tree asked for and not newer than the
//! superblock, is a candidate. Per generation the highest-level candidate is kept
//! (the first found, lowest address, among equals): a tree's root is its
//! highest block of the commit that wrote it. Used by `ubtrfs rescue find-root` and
//! by `extract --generation`.

use crate::error::Result;
use crate::io::disk_io::FsInfo;
use std::collections::BTreeMap;
use ubtrfs_format::consts::BLOCK_GROUP_METADATA;
use ubtrfs_format::tree::BlockView;

/// Checksums are stored from here (the header's checksum field is 32 bytes).
const CSUM_FIELD_BYTES: usize = 32;

/// Bytes read per request while scanning a chunk.
const SCAN_READ_BYTES: u64 = 1 << 20;

/// A block that may be the root of the tree asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootCandidate {
    /// Its logical address.
    pub bytenr: u64,
    /// The generation (transaction) that wrote it.
    pub generation: u64,
    /// Its level.
    pub level: u8,
}

/// The candidates for the root of tree `objectid` of generation at most
/// `max_generation`, newest generation first, one per generation. With `stop_at`
/// (a generation and level), the scan ends at the first block of exactly that
/// generation and level, as btrfs-find-root's does without -a.
pub fn find_roots(
    info: &FsInfo,
    objectid: u64,
    max_generation: u64,
    stop_at: Option<(u64, u8)>,
) -> Result<Vec<RootCandidate>> {
    let nodesize = info.nodesize as u64;
    let fsid = info.sb.metadata_fsid();
    // Per generation: the highest level seen and the blocks of that level.
    let mut best: BTreeMap<u64, (u8, Vec<u64>)> = BTreeMap::new();
    let chunks: Vec<(u64, u64)> = info
        .chunk_map
        .iter()
        .filter(|e| e.ty & BLOCK_GROUP_METADATA != 0)
        .map(|e| (e.start, e.length))
        .collect();
    let step = SCAN_READ_BYTES.max(nodesize) / nodesize * nodesize;
    let mut buf = vec![0u8; step as usize];
    let mut other = vec![0u8; nodesize as usize];
    for (start, length) in chunks {
        let mut at = start;
        while at < start + length {
            let n = step.min(start + length - at) as usize;
            // A device error: every block of the piece is read on its own below.
            let piece_ok = info.read_logical(at, &mut buf[..n], 0).is_ok();
            if !piece_ok {
                buf[..n].fill(0);
            }
            for off in (0..n).step_by(nodesize as usize) {
                let bytenr = at + off as u64;
                let here = &buf[off..off + nodesize as usize];
                let block: &[u8] = if good(info, here, bytenr, &fsid) {
                    here
                } else if other_copy(info, bytenr, &fsid, &mut other, usize::from(piece_ok)) {
                    &other
                } else {
                    continue;
                };
                let v = BlockView::new(block);
                if v.owner() != objectid || v.generation() > max_generation {
                    continue;
                }
                let c = RootCandidate {
                    bytenr,
                    generation: v.generation(),
                    level: v.level(),
                };
                let e = best.entry(c.generation).or_insert((c.level, Vec::new()));
                if c.level > e.0 {
                    *e = (c.level, Vec::new());
                }
                if c.level == e.0 {
                    e.1.push(c.bytenr);
                }
                if stop_at == Some((c.generation, c.level)) {
                    return Ok(listed(best));
                }
            }
            at += n as u64;
        }
    }
    Ok(listed(best))
}

/// Newest generation first; in one generation, highest address first.
fn listed(best: BTreeMap<u64, (u8, Vec<u64>)>) -> Vec<RootCandidate> {
    let mut v = Vec::new();
    for (generation, (level, blocks)) in best.into_iter().rev() {
        for &bytenr in blocks.iter().rev() {
            v.push(RootCandidate {
                bytenr,
                generation,
                level,
            });
        }
    }
    v
}

/// Reads into `buf` the first intact copy of `bytenr` from copy `from` on.
fn other_copy(info: &FsInfo, bytenr: u64, fsid: &[u8; 16], buf: &mut [u8], from: usize) -> bool {
    let mirrors = info.num_mirrors(bytenr).unwrap_or(1);
    (from..mirrors)
        .any(|m| info.read_logical(bytenr, buf, m).is_ok() && good(info, buf, bytenr, fsid))
}

/// Whether `block` read at `bytenr` is an intact tree block of this filesystem.
fn good(info: &FsInfo, block: &[u8], bytenr: u64, fsid: &[u8; 16]) -> bool {
    let v = BlockView::new(block);
    let Ok(h) = v.header() else {
        return false;
    };
    if h.bytenr != bytenr || &h.fsid != fsid {
        return false;
    }
    let n = info.csum_type.size();
    let c = info.csum_type.compute(&block[CSUM_FIELD_BYTES..]);
    c[..n] == block[..n]
}
