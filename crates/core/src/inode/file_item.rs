//! Data checksums: the csum tree holds, per data sector, the checksum of its on-disk
//! bytes, in items keyed (EXTENT_CSUM, EXTENT_CSUM, first bytenr).

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::tree::ctree::{next_item, search_forward, search_prev};
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

impl FsInfo {
    /// Checksums for the `nsectors` sectors starting at logical `start` (sector
    /// aligned); None for sectors the csum tree has nothing for.
    pub fn lookup_csums(&self, start: u64, nsectors: usize) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out = vec![None; nsectors];
        let Some(root) = self.tree_ptr(CSUM_TREE_OBJECTID) else {
            return Ok(out);
        };
        let ss = self.sectorsize as u64;
        let csize = self.csum_type.size();
        let end = start.saturating_add(nsectors as u64 * ss);
        let key = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, start);
        let path = match search_prev(self, &root, &key)? {
            Some(p) => Some(p),
            None => search_forward(self, &root, &key)?,
        };
        let Some(mut p) = path else { return Ok(out) };
        loop {
            let k = p.key()?;
            if k.objectid != EXTENT_CSUM_OBJECTID || k.ty != EXTENT_CSUM_KEY {
                if k > key {
                    break;
                }
            } else {
                if k.offset >= end {
                    break;
                }
                let data = p.data()?;
                let n = data.len() / csize;
                let item_end = k.offset.saturating_add(n as u64 * ss);
                if item_end > start {
                    let from = k.offset.max(start);
                    let to = item_end.min(end);
                    let mut b = from;
                    while b < to {
                        let i = ((b - k.offset) / ss) as usize;
                        let o = ((b - start) / ss) as usize;
                        let c = data.get(i * csize..(i + 1) * csize).ok_or_else(|| {
                            Error::corrupt(format!("csum item {k} shorter than its range"))
                        })?;
                        out[o] = Some(c.to_vec());
                        let Some(next) = b.checked_add(ss) else { break };
                        b = next;
                    }
                }
            }
            if !next_item(self, &mut p)? {
                break;
            }
        }
        Ok(out)
    }

    /// Reads sector-aligned data at `logical`, verifying checksums when asked; tries
    /// each copy in turn. On failure the error says which sector and what was found.
    pub fn read_data_verified(
        &self,
        logical: u64,
        len: usize,
        verify: bool,
        what: &dyn Fn(u64) -> String,
    ) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let ss = self.sectorsize as usize;
        let csums = if verify && len.is_multiple_of(ss) && logical.is_multiple_of(ss as u64) {
            Some(self.lookup_csums(logical, len / ss)?)
        } else {
            None
        };
        let mirrors = self.num_mirrors(logical)?;
        let mut first_err: Option<Error> = None;
        // A salvage open gives out the first copy read when none verifies.
        let mut as_found: Option<Vec<u8>> = None;
        for m in 0..mirrors {
            if let Err(e) = self.read_logical(logical, &mut buf, m) {
                first_err.get_or_insert(e);
                continue;
            }
            if as_found.is_none() && self.opts.salvage {
                as_found = Some(buf.clone());
            }
            let Some(csums) = &csums else { return Ok(buf) };
            match self.verify_sectors(logical, &buf, csums, what) {
                Ok(()) => {
                    if m > 0 {
                        self.warn(format!(
                            "data at logical {logical}: copy 1 failed, used copy {}",
                            m + 1
                        ));
                    }
                    return Ok(buf);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let e = first_err.unwrap_or_else(|| Error::corrupt("no copy readable"));
        let msg = match &e {
            Error::DataCsum(m) | Error::Corrupt(m) => m.clone(),
            e => format!("{} (logical {logical}): {e}", what(logical)),
        };
        let found_what = if as_found.is_some() {
            "written as found"
        } else {
            "no copy readable, zeros written"
        };
        if self.salvage_bad_data(format!("{msg}: {found_what}")) {
            return Ok(as_found.unwrap_or_else(|| vec![0u8; len]));
        }
        Err(e)
    }

    fn verify_sectors(
        &self,
        logical: u64,
        buf: &[u8],
        csums: &[Option<Vec<u8>>],
        what: &dyn Fn(u64) -> String,
    ) -> Result<()> {
        let ss = self.sectorsize as usize;
        let n = self.csum_type.size();
        for (i, c) in csums.iter().enumerate() {
            let Some(expected) = c else { continue };
            let found = self.csum_type.compute(&buf[i * ss..(i + 1) * ss]);
            if found[..n] != expected[..] {
                let at = logical + (i * ss) as u64;
                return Err(Error::DataCsum(format!(
                    "{} (logical {at}): expected {} found {}",
                    what(at),
                    crate::io::disk_io::hex(expected),
                    crate::io::disk_io::hex(&found[..n])
                )));
            }
        }
        Ok(())
    }
}

impl crate::transaction::Trans {
    /// Sectors of checksums per csum item (the kernel's MAX_CSUM_ITEMS bound).
    pub(crate) fn csums_per_item(&self) -> usize {
        let csize = self.fs.info.csum_type.size();
        (self.max_item_size() - ubtrfs_format::consts::ITEM_SIZE) / csize - 1
    }

    /// Checksums newly written data at logical `bytenr` into the csum tree.
    pub(crate) fn csum_data(&mut self, bytenr: u64, data: &[u8]) -> Result<()> {
        let ss = self.fs.info.sectorsize as usize;
        let ct = self.fs.info.csum_type;
        let csize = ct.size();
        let mut sums = Vec::with_capacity(data.len() / ss * csize);
        for sector in data.chunks(ss) {
            sums.extend_from_slice(&ct.compute(sector)[..csize]);
        }
        self.insert_csum_run(bytenr, &sums)
    }

    /// Inserts the checksums of consecutive sectors from logical `start` (`sums`:
    /// one checksum after the other) as csum items of at most `csums_per_item`
    /// sectors each. The range must hold no csum item yet.
    pub(crate) fn insert_csum_run(&mut self, start: u64, sums: &[u8]) -> Result<()> {
        let ss = self.fs.info.sectorsize as u64;
        let csize = self.fs.info.csum_type.size();
        let per = self.csums_per_item();
        let items: Vec<(Key, Vec<u8>)> = sums
            .chunks(per * csize)
            .enumerate()
            .map(|(ci, chunk)| {
                let at = start + (ci * per) as u64 * ss;
                (
                    Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, at),
                    chunk.to_vec(),
                )
            })
            .collect();
        if items.is_empty() {
            return Ok(());
        }
        self.insert_items(CSUM_TREE_OBJECTID, &items)
    }

    /// Removes the checksums of [bytenr, bytenr + len), splitting items that straddle it.
    pub(crate) fn del_csums(&mut self, bytenr: u64, len: u64) -> Result<()> {
        let ss = self.fs.info.sectorsize as u64;
        let csize = self.fs.info.csum_type.size() as u64;
        let end = bytenr + len;
        let root = self.root_ptr(CSUM_TREE_OBJECTID)?;
        let mut found: Vec<(Key, Vec<u8>)> = Vec::new();
        let key = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, bytenr);
        let start_key = match crate::tree::ctree::lookup_prev(&self.fs.info, &root, key)? {
            Some((k, _)) if k.objectid == EXTENT_CSUM_OBJECTID && k.ty == EXTENT_CSUM_KEY => k,
            _ => key,
        };
        for item in crate::tree::ctree::TreeIter::new(
            &self.fs.info,
            &root,
            start_key,
            Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end.saturating_sub(1)),
        )? {
            let item = item?;
            let k = item.key();
            let item_end = k.offset + item.data().len() as u64 / csize * ss;
            if item_end > bytenr && k.offset < end {
                found.push((k, item.data().to_vec()));
            }
        }
        for (k, data) in found {
            self.delete_item(CSUM_TREE_OBJECTID, &k)?;
            let item_end = k.offset + data.len() as u64 / csize * ss;
            let mut keep = Vec::new();
            if k.offset < bytenr {
                let n = ((bytenr - k.offset) / ss * csize) as usize;
                keep.push((k, data[..n].to_vec()));
            }
            if item_end > end {
                let skip = ((end - k.offset) / ss * csize) as usize;
                keep.push((
                    Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end),
                    data[skip..].to_vec(),
                ));
            }
            if !keep.is_empty() {
                self.insert_items(CSUM_TREE_OBJECTID, &keep)?;
            }
        }
        Ok(())
    }
}
