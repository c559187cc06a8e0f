//! FITRIM: telling the devices which space holds nothing (the kernel's btrfs_trim_fs
//! in extent-tree.c). On an image file that punches holes, so a sparse image gives
//! the host its space back; on a block device it is a discard.
//!
//! Two kinds of space are trimmed, as on the kernel: the free extents of the block
//! groups that overlap the asked logical range (each copy of a DUP or RAID1* group),
//! and the device space no chunk holds (always all of it, whatever the range and
//! the minimum length; the first MiB and the superblock copies excluded).
//!
//! Safe only for space nothing durable points at: the free-space index of a block
//! group never holds what the running or a committing transaction freed (that stays
//! pinned until its commit is durable), and the caller commits first anyway, so
//! what the last transaction deleted is trimmed too. RAID0 and RAID10 groups are
//! trimmed stripe by stripe; RAID5/6 groups (which this engine does not write) are
//! left alone.

use super::Trans;
use crate::alloc::block_group::super_offset;
use crate::error::{Error, Result};
use std::io::ErrorKind;
use ubtrfs_format::consts::*;

/// What a trim did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrimReport {
    /// Device bytes trimmed, as the kernel counts them: each copy of a free extent
    /// of a block group (a DUP group's free space twice), plus unallocated bytes.
    pub trimmed_bytes: u64,
}

/// At each superblock copy in unallocated space, what is never trimmed: the copy
/// itself, as the kernel's btrfs_issue_discard skips it. (Inside a block group the
/// whole 64 KiB stripe around a copy is never free.)
const SUPER_KEEP_BYTES: u64 = 4096;

impl Trans {
    /// Trims the free space of the block groups overlapping `[start, start + len)`
    /// (logical; `len` u64::MAX for all) in pieces of at least `minlen_bytes`, and
    /// every device's unallocated space. Error `Unsupported` when no device can
    /// discard, `Invalid` for a range that wraps. Changes nothing in the trees.
    pub fn trim(&mut self, start: u64, len: u64, minlen_bytes: u64) -> Result<TrimReport> {
        // btrfs_ioctl_fitrim and btrfs_trim_fs: a range shorter than a sector, one
        // starting at the last byte, or one that wraps is refused. (Any other start
        // is fine: block groups live in a logical space that may lie beyond the
        // devices' size, and device space is trimmed whatever the range.)
        let sector = self.fs.info.sectorsize as u64;
        if len < sector
            || start == u64::MAX
            || (len != u64::MAX && start.checked_add(len).is_none())
        {
            return Err(Error::Invalid(format!("trim range {start}+{len}")));
        }
        let end = start.saturating_add(len);
        let minlen = minlen_bytes.max(1);
        let mut report = TrimReport::default();
        let mut any_supported = false;
        let mut any_unsupported = false;
        let mut discard = |this: &Trans, devid: u64, offset: u64, n: u64| -> Result<bool> {
            // A missing device is skipped, as the kernel skips it.
            let Some(dev) = this.fs.info.devices.get(&devid) else {
                return Ok(false);
            };
            match dev.discard(offset, n) {
                Ok(()) => {
                    any_supported = true;
                    Ok(true)
                }
                Err(e) if e.kind() == ErrorKind::Unsupported => {
                    any_unsupported = true;
                    Ok(false)
                }
                Err(e) => Err(Error::io(
                    format!("discarding {n} bytes at {offset} on {}", dev.name()),
                    e,
                )),
            }
        };

        let groups: Vec<u64> = self
            .alloc
            .bgs
            .range(..end)
            .filter(|(_, b)| b.end() > start)
            .map(|(s, _)| *s)
            .collect();
        for s in groups {
            self.alloc.ensure_loaded(&self.fs.info, s)?;
            let Some(bg) = self.alloc.bgs.get(&s) else {
                continue;
            };
            if bg.flags & PARITY != 0 || bg.ro {
                continue;
            }
            let free: Vec<(u64, u64)> = bg
                .free
                .iter()
                .filter_map(|(o, l)| {
                    let (a, b) = (o.max(start), o.saturating_add(l).min(end));
                    (b > a && b - a >= minlen).then_some((a, b - a))
                })
                .collect();
            let entry = self.fs.info.chunk_map.lookup(s)?.clone();
            for (o, l) in free {
                for (devid, offset, n) in copies(&entry, o, o + l) {
                    if discard(self, devid, offset, n)? {
                        report.trimmed_bytes += n;
                    }
                }
            }
        }

        // Device space no chunk holds: the holes between device extents, less every
        // stripe the chunk map knows (on a consistent image the same; on a damaged
        // one, a chunk without its device extent must not lose its data). As the
        // kernel's btrfs_trim_free_extents: minlen does not apply here.
        let mut in_chunks: std::collections::HashMap<u64, Vec<(u64, u64)>> =
            std::collections::HashMap::new();
        for e in self.fs.info.chunk_map.iter() {
            let len = device_extent_bytes(e);
            for st in &e.stripes {
                in_chunks
                    .entry(st.devid)
                    .or_default()
                    .push((st.physical, st.physical.saturating_add(len)));
            }
        }
        let holes: Vec<(u64, u64, u64)> = self
            .alloc
            .dev_space
            .iter()
            .flat_map(|(&devid, ds)| ds.holes().into_iter().map(move |(o, l)| (devid, o, l)))
            .collect();
        for (devid, o, l) in holes {
            let used = in_chunks.get(&devid).map(Vec::as_slice).unwrap_or(&[]);
            for (a, n) in without(o, l, used) {
                for (a, n) in without_supers(a, n) {
                    if discard(self, devid, a, n)? {
                        report.trimmed_bytes += n;
                    }
                }
            }
        }
        if any_unsupported && !any_supported {
            return Err(Error::Unsupported("no device can discard".into()));
        }
        Ok(report)
    }
}

impl Trans {
    /// Discards `[logical, logical + len)` on every copy, for the `discard` mount
    /// option: space a durable commit freed (the kernel's discard at unpin,
    /// btrfs_discard_extent). Best effort, as in the kernel: a device that cannot
    /// discard, a RAID5/6 group (not written here) or an error leaves
    /// the bytes as they are. Returns the bytes discarded (every copy counted).
    pub(crate) fn discard_freed(&self, logical: u64, len: u64) -> u64 {
        let Ok(entry) = self.fs.info.chunk_map.lookup(logical) else {
            return 0;
        };
        if entry.ty & PARITY != 0 {
            return 0;
        }
        let end = logical.saturating_add(len).min(entry.start + entry.length);
        let mut done = 0;
        for (devid, offset, n) in copies(entry, logical, end) {
            if let Some(dev) = self.fs.info.devices.get(&devid) {
                if dev.discard(offset, n).is_ok() {
                    done += n;
                }
            }
        }
        done
    }
}

/// Profiles with parity (not trimmed or discarded here: ubtrfs does not write them,
/// and a range's parity is not free while other data of its stripe is used).
const PARITY: u64 = BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6;

/// The device ranges `(devid, offset, bytes)` holding `[logical, end)` of a chunk
/// without parity, copy by copy (one per DUP, RAID1* or RAID10 mirror); a range the
/// map cannot place ends that copy's list. The 64 KiB pieces a RAID0 or RAID10
/// chunk spreads over its devices are joined where they meet on a device, so a
/// large free range is one discard per device (the kernel's btrfs_map_discard).
fn copies(entry: &crate::io::volumes::MapEntry, logical: u64, end: u64) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    let mut last_on: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for m in 0..entry.num_mirrors() {
        let mut pos = logical;
        while pos < end {
            let Ok(p) = entry.map(pos, m) else {
                break;
            };
            let n = p.len.min(end - pos);
            if n == 0 {
                break;
            }
            match last_on.get(&p.devid).and_then(|&i| out.get_mut(i)) {
                Some(prev) if prev.1 + prev.2 == p.offset => prev.2 += n,
                _ => {
                    last_on.insert(p.devid, out.len());
                    out.push((p.devid, p.offset, n));
                }
            }
            pos += n;
        }
    }
    out
}

/// Bytes of each device extent (one stripe) of a chunk.
fn device_extent_bytes(e: &crate::io::volumes::MapEntry) -> u64 {
    // A malformed entry counts its whole length on every stripe: trims less.
    e.stripe_size()
}

/// `[offset, offset + len)` less the `[start, end)` ranges of `used`.
fn without(offset: u64, len: u64, used: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = vec![(offset, offset.saturating_add(len))];
    for &(us, ue) in used {
        let mut next = Vec::with_capacity(out.len() + 1);
        for (s, e) in out {
            if ue <= s || us >= e {
                next.push((s, e));
                continue;
            }
            if us > s {
                next.push((s, us));
            }
            if ue < e {
                next.push((ue, e));
            }
        }
        out = next;
    }
    out.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// `[offset, offset + len)` split around the superblock copies.
fn without_supers(offset: u64, len: u64) -> Vec<(u64, u64)> {
    let supers: Vec<(u64, u64)> = (0..SUPER_MIRROR_MAX)
        .map(|i| {
            let s = super_offset(i);
            (s, s.saturating_add(SUPER_KEEP_BYTES))
        })
        .collect();
    without(offset, len, &supers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::mkfs::{make_filesystem, MkfsOptions};
    use crate::{Device, MemDevice};
    use std::sync::Arc;

    #[test]
    fn supers_are_kept() {
        let m = 64 << 20;
        assert_eq!(without_supers(1 << 20, 10 << 20), vec![(1 << 20, 10 << 20)]);
        assert_eq!(
            without_supers(m - 4096, 3 * 4096),
            vec![(m - 4096, 4096), (m + 4096, 4096)]
        );
        assert!(without_supers(m, 4096).is_empty());
    }

    #[test]
    fn chunk_stripes_are_kept() {
        assert_eq!(without(0, 100, &[]), vec![(0, 100)]);
        assert_eq!(
            without(0, 100, &[(10, 20), (50, 200)]),
            vec![(0, 10), (20, 30)]
        );
        assert!(without(10, 10, &[(0, 30)]).is_empty());
    }

    /// Free space reads back as zeros after a trim, every file keeps its data, and
    /// the filesystem still opens.
    #[test]
    fn trim_zeroes_free_space_only() {
        let dev = MemDevice::new(vec![0xa5u8; 256 << 20], "trim");
        let mut t =
            make_filesystem(dev.clone() as Arc<dyn Device>, &MkfsOptions::default()).expect("mkfs");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let attr = crate::inode::inode::NewInode {
            mode: 0o100644,
            uid: 0,
            gid: 0,
            rdev: 0,
            time: Default::default(),
        };
        let ino = t
            .create(FS_TREE_OBJECTID, FIRST_FREE_OBJECTID, b"f", attr)
            .expect("create");
        t.write(FS_TREE_OBJECTID, ino, 0, &data, Default::default())
            .expect("write");
        t.commit().expect("commit");
        let r = t.trim(0, u64::MAX, 0).expect("trim");
        assert!(r.trimmed_bytes > 100 << 20, "{r:?}");
        let img = dev.snapshot();
        // The unallocated tail of the device (past every chunk) is zero now.
        assert!(img[250 << 20..].iter().all(|&b| b == 0));
        // The primary superblock and its neighbourhood are untouched.
        assert!(img[(64 << 10) + 4096..(64 << 10) + 8192].contains(&0xa5));
        let node = crate::Node::new(FS_TREE_OBJECTID, ino);
        assert!(t.fs.read(node, 0, data.len()).expect("read") == data);
        let fs = crate::Filesystem::from_info(
            crate::FsInfo::open(
                vec![dev.clone() as Arc<dyn Device>],
                crate::OpenOptions::default(),
            )
            .expect("reopen"),
        );
        assert!(fs.read(node, 0, data.len()).expect("read after reopen") == data);
    }
}
