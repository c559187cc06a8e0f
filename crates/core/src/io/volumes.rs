//! The chunk map: logical addresses to (device, physical offset) for every profile.
//!
//! A chunk covers [start, start + length) of the logical address space and is laid out
//! over `stripes` by its profile: SINGLE/DUP/RAID1/RAID1C3/RAID1C4 place whole copies,
//! RAID0 and RAID10 interleave `stripe_len` pieces, RAID5/6 interleave data pieces with
//! parity rotating one device per full stripe.

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::tree::RootPtr;
use std::collections::BTreeMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::Chunk;
use ubtrfs_format::key::Key;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapStripe {
    pub devid: u64,
    pub physical: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub length: u64,
    pub ty: u64,
    pub stripe_len: u64,
    pub sub_stripes: u16,
    pub stripes: Vec<MapStripe>,
}

/// Where one piece of a logical range lives on one mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Physical {
    pub devid: u64,
    pub offset: u64,
    /// Bytes that are contiguous on this device from `offset` (to the stripe end).
    pub len: u64,
}

impl MapEntry {
    pub fn from_chunk(start: u64, c: &Chunk, sectorsize: u32) -> Result<MapEntry> {
        let bad = |d: String| Err(Error::corrupt(format!("chunk at logical {start}: {d}")));
        if c.length == 0 || !c.length.is_multiple_of(sectorsize as u64) {
            return bad(format!(
                "length {} not a multiple of the sector size",
                c.length
            ));
        }
        if start.checked_add(c.length).is_none() {
            return bad("range overflows".into());
        }
        if !c.stripe_len.is_power_of_two() || c.stripe_len < sectorsize as u64 {
            return bad(format!("invalid stripe_len {}", c.stripe_len));
        }
        let n = c.stripes.len();
        let profile = c.ty & BLOCK_GROUP_PROFILE_MASK;
        if profile.count_ones() > 1 {
            return bad(format!("several profiles in type {:#x}", c.ty));
        }
        // Since Linux 5.15 RAID0 may have one stripe and RAID10 two (one mirrored
        // pair): the kernel makes such chunks on one or two (or, for RAID10, three)
        // devices, and its tree checker asks RAID10 only for sub_stripes 2.
        let min = match profile {
            BLOCK_GROUP_DUP | BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID10 => 2,
            BLOCK_GROUP_RAID1C3 | BLOCK_GROUP_RAID6 => 3,
            BLOCK_GROUP_RAID1C4 => 4,
            _ => 1,
        };
        if n < min {
            return bad(format!("{} stripes for profile {}", n, profile_name(c.ty)));
        }
        match profile {
            BLOCK_GROUP_DUP if n != 2 => return bad(format!("DUP with {n} stripes")),
            BLOCK_GROUP_RAID1 if n != 2 => return bad(format!("RAID1 with {n} stripes")),
            BLOCK_GROUP_RAID1C3 if n != 3 => return bad(format!("RAID1C3 with {n} stripes")),
            BLOCK_GROUP_RAID1C4 if n != 4 => return bad(format!("RAID1C4 with {n} stripes")),
            BLOCK_GROUP_RAID10 if c.sub_stripes != 2 || !n.is_multiple_of(2) => {
                return bad(format!(
                    "RAID10 with {n} stripes and sub_stripes {}",
                    c.sub_stripes
                ))
            }
            _ => {}
        }
        Ok(MapEntry {
            start,
            length: c.length,
            ty: c.ty,
            stripe_len: c.stripe_len,
            sub_stripes: c.sub_stripes,
            stripes: c
                .stripes
                .iter()
                .map(|s| MapStripe {
                    devid: s.devid,
                    physical: s.offset,
                })
                .collect(),
        })
    }

    fn profile(&self) -> u64 {
        self.ty & BLOCK_GROUP_PROFILE_MASK
    }

    /// How many independent copies of each byte there are to read from.
    pub fn num_mirrors(&self) -> usize {
        match self.profile() {
            BLOCK_GROUP_DUP | BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID1C3 | BLOCK_GROUP_RAID1C4 => {
                self.stripes.len()
            }
            BLOCK_GROUP_RAID10 => self.sub_stripes as usize,
            _ => 1,
        }
    }

    /// Size of the logical range each device stripe holds (dev extent length).
    pub fn stripe_size(&self) -> u64 {
        self.length / data_stripes(self.ty, self.stripes.len() as u64, self.sub_stripes)
    }

    /// Maps `logical` (inside this chunk) for mirror `mirror` (0-based).
    pub fn map(&self, logical: u64, mirror: usize) -> Result<Physical> {
        if logical < self.start || logical >= self.start + self.length {
            return Err(Error::corrupt(format!(
                "logical {logical} outside chunk {}+{}",
                self.start, self.length
            )));
        }
        if mirror >= self.num_mirrors() {
            return Err(Error::Invalid(format!("mirror {mirror}")));
        }
        let off = logical - self.start;
        let sl = self.stripe_len;
        let n = self.stripes.len() as u64;
        let in_stripe = off % sl;
        let stripe_nr = off / sl;
        let (idx, row) = match self.profile() {
            BLOCK_GROUP_RAID0 => (stripe_nr % n, stripe_nr / n),
            BLOCK_GROUP_RAID10 => {
                let sub = self.sub_stripes as u64;
                let factor = n / sub;
                (
                    (stripe_nr % factor) * sub + mirror as u64,
                    stripe_nr / factor,
                )
            }
            BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6 => {
                let parity = if self.profile() == BLOCK_GROUP_RAID5 {
                    1
                } else {
                    2
                };
                let data = n - parity;
                let full = stripe_nr / data;
                ((stripe_nr % data + full) % n, full)
            }
            _ => {
                // Whole copies: contiguous to the chunk end.
                let s = &self.stripes[mirror];
                return Ok(Physical {
                    devid: s.devid,
                    offset: self.physical(s, off)?,
                    len: self.length - off,
                });
            }
        };
        let s = &self.stripes[idx as usize];
        let rel = row
            .checked_mul(sl)
            .and_then(|r| r.checked_add(in_stripe))
            .ok_or_else(|| Error::corrupt(format!("chunk at logical {}: overflow", self.start)))?;
        Ok(Physical {
            devid: s.devid,
            offset: self.physical(s, rel)?,
            len: sl - in_stripe,
        })
    }

    /// `rel` bytes into stripe `s`; a stripe offset near 2^64 is an error, not a wrap.
    fn physical(&self, s: &MapStripe, rel: u64) -> Result<u64> {
        s.physical.checked_add(rel).ok_or_else(|| {
            Error::corrupt(format!(
                "chunk at logical {}: stripe offset {} on devid {} overflows",
                self.start, s.physical, s.devid
            ))
        })
    }
}

/// Parity strips per full stripe of a chunk of type `ty`: RAID5 1, RAID6 2, else 0.
pub(crate) fn nparity(ty: u64) -> u64 {
    match ty & BLOCK_GROUP_PROFILE_MASK {
        BLOCK_GROUP_RAID5 => 1,
        BLOCK_GROUP_RAID6 => 2,
        _ => 0,
    }
}

/// Over how many device stripes a chunk of type `ty` with `num_stripes` stripes
/// spreads its logical bytes (RAID0 all, RAID10 one per mirrored pair, RAID5/6 all
/// but parity, whole copies 1); at least 1, so a malformed chunk counts its whole
/// length on each stripe.
pub(crate) fn data_stripes(ty: u64, num_stripes: u64, sub_stripes: u16) -> u64 {
    match ty & BLOCK_GROUP_PROFILE_MASK {
        BLOCK_GROUP_RAID0 => num_stripes,
        BLOCK_GROUP_RAID10 => num_stripes / u64::from(sub_stripes.max(1)),
        BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6 => num_stripes.saturating_sub(nparity(ty)),
        _ => 1,
    }
    .max(1)
}

/// All chunks, keyed by logical start.
#[derive(Clone, Debug, Default)]
pub struct ChunkMap {
    chunks: BTreeMap<u64, MapEntry>,
}

impl ChunkMap {
    pub fn insert(&mut self, e: MapEntry) -> Result<()> {
        // Overlap with the previous or next chunk means a corrupt chunk tree.
        if let Some((_, prev)) = self.chunks.range(..=e.start).next_back() {
            if prev.start == e.start {
                if prev == &e {
                    return Ok(());
                }
                return Err(Error::corrupt(format!(
                    "two different chunks at logical {}",
                    e.start
                )));
            }
            if prev.start + prev.length > e.start {
                return Err(Error::corrupt(format!(
                    "chunk {} overlaps chunk {}",
                    e.start, prev.start
                )));
            }
        }
        if let Some((_, next)) = self.chunks.range(e.start + 1..).next() {
            if e.start + e.length > next.start {
                return Err(Error::corrupt(format!(
                    "chunk {} overlaps chunk {}",
                    e.start, next.start
                )));
            }
        }
        self.chunks.insert(e.start, e);
        Ok(())
    }

    pub fn lookup(&self, logical: u64) -> Result<&MapEntry> {
        match self.chunks.range(..=logical).next_back() {
            Some((_, e)) if logical < e.start + e.length => Ok(e),
            _ => Err(Error::corrupt(format!(
                "logical address {logical} is not in any chunk"
            ))),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &MapEntry> {
        self.chunks.values()
    }

    /// Forgets the chunk at `start` (removed, and the commit that removed it is
    /// durable).
    pub(crate) fn remove(&mut self, start: u64) -> Option<MapEntry> {
        self.chunks.remove(&start)
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

impl FsInfo {
    /// The chunk tree's DEV_ITEMs (one per device of the filesystem, open or not),
    /// by devid; an item that does not parse is left out.
    pub fn dev_items(&self) -> Result<Vec<ubtrfs_format::items::DevItem>> {
        let mut devs = Vec::new();
        let Some(chunk_root) = self.tree_ptr(CHUNK_TREE_OBJECTID) else {
            return Ok(devs);
        };
        crate::tree::ctree::walk_items(
            self,
            &chunk_root,
            Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, 0),
            |k, data| {
                if k.objectid != DEV_ITEMS_OBJECTID || k.ty != DEV_ITEM_KEY {
                    return Ok(false);
                }
                if let Ok(d) = ubtrfs_format::items::DevItem::parse(data) {
                    devs.push(d);
                }
                Ok(true)
            },
        )?;
        Ok(devs)
    }

    fn add_chunk(&mut self, key: &Key, chunk: &Chunk) -> Result<()> {
        if key.objectid != FIRST_CHUNK_TREE_OBJECTID {
            return Err(Error::corrupt(format!(
                "chunk item with objectid {}",
                key.objectid
            )));
        }
        let e = MapEntry::from_chunk(key.offset, chunk, self.sectorsize)?;
        self.chunk_map.insert(e)
    }

    /// Builds the chunk map: the superblock's sys_chunk_array first (it maps the chunk
    /// tree itself), then every CHUNK_ITEM of the chunk tree (the kernel's
    /// btrfs_read_sys_array and btrfs_read_chunk_tree). Warns about missing devices.
    pub(crate) fn read_chunk_tree(&mut self) -> Result<()> {
        let sys = self
            .sb
            .sys_chunks()
            .map_err(|e| Error::corrupt(format!("superblock sys_chunk_array: {e}")))?;
        if sys.is_empty() {
            return Err(Error::corrupt("superblock sys_chunk_array holds no chunk"));
        }
        for (k, c) in &sys {
            self.add_chunk(k, c)?;
        }
        let chunk_root = RootPtr {
            id: CHUNK_TREE_OBJECTID,
            bytenr: self.sb.chunk_root,
            level: self.sb.chunk_root_level,
            generation: self.sb.chunk_root_generation,
        };
        let mut chunks = Vec::new();
        let mut dev_items = Vec::new();
        crate::tree::ctree::walk_items(self, &chunk_root, Key::MIN, |k, data| {
            match k.ty {
                CHUNK_ITEM_KEY => {
                    let c = Chunk::parse(data)
                        .map_err(|e| Error::corrupt(format!("chunk tree item {k}: {e}")))?;
                    chunks.push((*k, c));
                }
                DEV_ITEM_KEY => {
                    let d = ubtrfs_format::items::DevItem::parse(data)
                        .map_err(|e| Error::corrupt(format!("chunk tree item {k}: {e}")))?;
                    dev_items.push(d);
                }
                _ => {}
            }
            Ok(true)
        })?;
        for (k, c) in &chunks {
            self.add_chunk(k, c)?;
        }
        let missing: Vec<u64> = dev_items
            .iter()
            .map(|d| d.devid)
            .filter(|id| !self.devices.contains_key(id))
            .collect();
        if !missing.is_empty() {
            self.warn(format!(
                "devices missing: devid {} (reads that need them will fail)",
                missing
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ubtrfs_format::items::Stripe;

    fn chunk(ty: u64, devs: &[(u64, u64)], sub: u16) -> Chunk {
        Chunk {
            length: 0,
            owner: 2,
            stripe_len: STRIPE_LEN,
            ty,
            io_align: 65536,
            io_width: 65536,
            sector_size: 4096,
            num_stripes: devs.len() as u16,
            sub_stripes: sub,
            stripes: devs
                .iter()
                .map(|&(d, o)| Stripe {
                    devid: d,
                    offset: o,
                    dev_uuid: [0; 16],
                })
                .collect(),
        }
    }

    #[test]
    fn raid0_interleaves() {
        let mut c = chunk(
            BLOCK_GROUP_DATA | BLOCK_GROUP_RAID0,
            &[(1, 1 << 20), (2, 2 << 20)],
            1,
        );
        c.length = 4 * STRIPE_LEN;
        let e = MapEntry::from_chunk(1 << 30, &c, 4096).unwrap();
        let p = e.map((1 << 30) + STRIPE_LEN + 5, 0).unwrap();
        assert_eq!(
            (p.devid, p.offset, p.len),
            (2, (2 << 20) + 5, STRIPE_LEN - 5)
        );
        let p = e.map((1 << 30) + 2 * STRIPE_LEN, 0).unwrap();
        assert_eq!((p.devid, p.offset), (1, (1 << 20) + STRIPE_LEN));
    }

    #[test]
    fn raid10_mirrors() {
        let mut c = chunk(
            BLOCK_GROUP_DATA | BLOCK_GROUP_RAID10,
            &[(1, 0), (2, 0), (3, 0), (4, 0)],
            2,
        );
        c.length = 8 * STRIPE_LEN;
        let e = MapEntry::from_chunk(0, &c, 4096).unwrap();
        assert_eq!(e.num_mirrors(), 2);
        assert_eq!(e.map(STRIPE_LEN, 0).unwrap().devid, 3);
        assert_eq!(e.map(STRIPE_LEN, 1).unwrap().devid, 4);
        assert_eq!(e.map(2 * STRIPE_LEN, 1).unwrap().offset, STRIPE_LEN);
    }

    #[test]
    fn raid5_rotates_parity() {
        let mut c = chunk(
            BLOCK_GROUP_DATA | BLOCK_GROUP_RAID5,
            &[(1, 0), (2, 0), (3, 0)],
            1,
        );
        c.length = 6 * STRIPE_LEN;
        let e = MapEntry::from_chunk(0, &c, 4096).unwrap();
        // full stripe 0: data on devs 1,2; full stripe 1: data on devs 2,3.
        assert_eq!(e.map(0, 0).unwrap().devid, 1);
        assert_eq!(e.map(STRIPE_LEN, 0).unwrap().devid, 2);
        assert_eq!(e.map(2 * STRIPE_LEN, 0).unwrap().devid, 2);
        assert_eq!(e.map(3 * STRIPE_LEN, 0).unwrap().devid, 3);
        assert_eq!(e.map(3 * STRIPE_LEN, 0).unwrap().offset, STRIPE_LEN);
    }

    #[test]
    fn overlap_rejected() {
        let mut m = ChunkMap::default();
        let mut c = chunk(BLOCK_GROUP_DATA, &[(1, 0)], 1);
        c.length = 1 << 20;
        m.insert(MapEntry::from_chunk(0, &c, 4096).unwrap())
            .unwrap();
        assert!(m
            .insert(MapEntry::from_chunk(4096, &c, 4096).unwrap())
            .is_err());
        assert!(m.lookup(2 << 20).is_err());
    }
}
