//! Shrinking a device over allocated chunks (the kernel's btrfs_shrink_device):
//! no new chunk may end past the new size, every chunk with a device extent
//! beyond it is relocated, highest physical offset first, then the device's
//! size is written.

use crate::error::{Error, Result};
use crate::transaction::Trans;

impl Trans {
    /// Sets device `devid` to `new_bytes`, relocating the chunks that lie beyond
    /// (each in its own commit). Returns the size set (rounded down to the sector
    /// size). Commit afterwards, as after [`Trans::resize_device`]. On failure
    /// (ENOSPC: the rest does not fit below the new size) the device keeps its
    /// size; chunks already moved stay moved, which is harmless.
    pub fn shrink_device(&mut self, devid: u64, new_bytes: u64) -> Result<u64> {
        let ss = self.fs.info.sectorsize as u64;
        let new = new_bytes / ss * ss;
        if !self.alloc.dev_space.contains_key(&devid) {
            return Err(Error::NotFound(format!("device {devid}")));
        }
        let set_limit = |t: &mut Trans, v: Option<u64>| {
            if let Some(ds) = t.alloc.dev_space.get_mut(&devid) {
                ds.alloc_end = v;
            }
        };
        set_limit(self, Some(new));
        let res = self.relocate_beyond(devid, new);
        set_limit(self, None);
        res?;
        self.resize_device(devid, new)
    }

    fn relocate_beyond(&mut self, devid: u64, new: u64) -> Result<()> {
        // A chunk moved may land beyond again only if nothing else fits; the
        // kernel retries once after ENOSPC, ubtrfs stops after two rounds.
        for _round in 0..2 {
            let mut beyond: Vec<(u64, u64)> = Vec::new();
            for e in self.fs.info.chunk_map.iter() {
                for st in e.stripes.iter().filter(|s| s.devid == devid) {
                    let len = self
                        .alloc
                        .dev_space
                        .get(&devid)
                        .and_then(|d| d.used.get(&st.physical))
                        .copied()
                        .unwrap_or(0);
                    if st.physical + len > new {
                        beyond.push((st.physical, e.start));
                    }
                }
            }
            if beyond.is_empty() {
                return Ok(());
            }
            beyond.sort_by_key(|b| std::cmp::Reverse(b.0));
            beyond.dedup_by_key(|b| b.1);
            for (_, start) in beyond {
                if self.alloc.bgs.contains_key(&start) {
                    self.relocate_block_group(start)?;
                }
            }
        }
        let end = self.device_used_end(devid)?;
        if end > new {
            return Err(Error::NoSpace(format!(
                "device {devid}: chunks still end at {end} after relocation; \
                 {new} bytes do not hold what is allocated"
            )));
        }
        Ok(())
    }
}
