//! Block groups, written (the write half of the kernel's block-group.c and volumes.c):
//! the chunk, device-extent and device items of chunks the allocator created in this
//! transaction, the superblock's sys_chunk_array, and BLOCK_GROUP_ITEMs of dirty groups.

use crate::alloc::block_group::bg_tree_id;
use crate::error::{Error, Result};
use crate::transaction::Trans;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{BlockGroupItem, CHUNK_BASE_SIZE, STRIPE_SIZE};
use ubtrfs_format::key::Key;

impl Trans {
    /// Shrinks the (single) device to the end of its last device extent (mkfs
    /// --shrink); returns the new size. Commit afterwards.
    pub fn shrink_to_fit(&mut self) -> Result<u64> {
        if self.alloc.dev_space.len() != 1 {
            return Err(Error::Unsupported(
                "shrinking a multi-device filesystem".into(),
            ));
        }
        let Some((&devid, _)) = self.alloc.dev_space.iter().next() else {
            return Err(Error::corrupt("no device"));
        };
        let end = self.device_used_end(devid)?.max(1 << 20);
        self.resize_device(devid, end)
    }

    /// Where device `devid`'s last device extent ends.
    pub fn device_used_end(&self, devid: u64) -> Result<u64> {
        let ds = self
            .alloc
            .dev_space
            .get(&devid)
            .ok_or_else(|| Error::NotFound(format!("device {devid}")))?;
        Ok(ds.used.iter().map(|(s, l)| s + l).max().unwrap_or(0))
    }

    /// Size of device `devid` as the filesystem records it.
    pub fn device_size(&self, devid: u64) -> Result<u64> {
        self.alloc
            .dev_space
            .get(&devid)
            .map(|d| d.total_bytes)
            .ok_or_else(|| Error::NotFound(format!("device {devid}")))
    }

    /// Sets the size of device `devid` (the kernel's btrfs_grow_device and, where
    /// nothing lies beyond the new end, btrfs_shrink_device): the DEV_ITEM, the
    /// superblock's total and the device's own superblock item; returns the size,
    /// rounded down to the sector size. A shrink over device extents is refused
    /// (it needs relocation). Growing a file or block device to the size, and
    /// cutting a file after the commit, are the caller's. Commit afterwards.
    pub fn resize_device(&mut self, devid: u64, new_bytes: u64) -> Result<u64> {
        let new = new_bytes / self.fs.info.sectorsize as u64 * self.fs.info.sectorsize as u64;
        // The kernel's floor: room for the first superblock's reserved megabyte.
        if new < 1 << 20 {
            return Err(Error::Invalid(format!("new size {new} is too small")));
        }
        let used_end = self.device_used_end(devid)?;
        if new < used_end {
            return Err(Error::Invalid(format!(
                "shrinking device {devid} to {new} bytes: chunks are allocated up to \
                 {used_end} (Trans::shrink_device relocates them first)"
            )));
        }
        let dev = self
            .fs
            .info
            .devices
            .get(&devid)
            .ok_or_else(|| Error::NotFound(format!("device {devid} is not open")))?;
        if new > dev.size() {
            return Err(Error::Invalid(format!(
                "device {devid} ({}) has {} bytes, fewer than {new}",
                dev.name(),
                dev.size()
            )));
        }
        let old = self.device_size(devid)?;
        if let Some(ds) = self.alloc.dev_space.get_mut(&devid) {
            ds.total_bytes = new;
        }
        let sb = &mut self.fs.info.sb;
        sb.total_bytes = sb.total_bytes.saturating_sub(old).saturating_add(new);
        if sb.dev_item.devid == devid {
            sb.dev_item.total_bytes = new;
        }
        let key = Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, devid);
        self.update_item(CHUNK_TREE_OBJECTID, &key, |d| {
            if d.len() >= 16 {
                d[8..16].copy_from_slice(&new.to_le_bytes());
            }
        })?;
        Ok(new)
    }

    /// Inserts the items of chunks allocated in this transaction.
    pub(crate) fn create_pending_chunks(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.alloc.pending_chunks);
        if pending.is_empty() {
            return Ok(());
        }
        let chunk_uuid = self.chunk_tree_uuid;
        for p in &pending {
            let key = Key::new(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, p.logical);
            let bytes = p.chunk.to_bytes();
            self.insert_item(CHUNK_TREE_OBJECTID, &key, &bytes)?;
            for st in &p.chunk.stripes {
                let de = ubtrfs_format::items::DevExtent {
                    chunk_tree: CHUNK_TREE_OBJECTID,
                    chunk_objectid: FIRST_CHUNK_TREE_OBJECTID,
                    chunk_offset: p.logical,
                    length: p.stripe_bytes(),
                    chunk_tree_uuid: chunk_uuid,
                };
                let k = Key::new(st.devid, DEV_EXTENT_KEY, st.offset);
                self.insert_item(DEV_TREE_OBJECTID, &k, &de.to_bytes())?;
            }
            if p.chunk.ty & BLOCK_GROUP_SYSTEM != 0 {
                self.append_sys_chunk(&key, &bytes)?;
            }
        }
        self.update_dev_items()?;
        Ok(())
    }

    fn append_sys_chunk(&mut self, key: &Key, chunk: &[u8]) -> Result<()> {
        let sb = &mut self.fs.info.sb;
        let need = DISK_KEY_SIZE + chunk.len();
        if sb.sys_chunk_array_size as usize + need > SYSTEM_CHUNK_ARRAY_SIZE {
            return Err(Error::NoSpace(
                "superblock sys_chunk_array is full (too many system chunks)".into(),
            ));
        }
        let mut arr = sb.sys_chunk_array[..sb.sys_chunk_array_size as usize].to_vec();
        arr.extend_from_slice(&key.to_bytes());
        arr.extend_from_slice(chunk);
        sb.sys_chunk_array_size = arr.len() as u32;
        arr.resize(SYSTEM_CHUNK_ARRAY_SIZE, 0);
        sb.sys_chunk_array = arr;
        Ok(())
    }

    /// Removes the block groups relocation emptied (the kernel's btrfs_remove_chunk
    /// and btrfs_remove_block_group): the BLOCK_GROUP_ITEM, the group's free-space
    /// tree items, each stripe's DEV_EXTENT (the device's bytes_used drops), the
    /// CHUNK_ITEM and, for a SYSTEM chunk, its copy in the superblock's
    /// sys_chunk_array. Runs in the commit after delayed refs, when the group's
    /// last extents are freed; a group still in use is an internal error and
    /// nothing is written. The mapping and the device ranges stay until the commit
    /// is durable ([`Trans::forget_removed_block_groups`]).
    pub(crate) fn remove_emptied_block_groups(&mut self) -> Result<()> {
        let starts = std::mem::take(&mut self.alloc.remove_at_commit);
        for start in starts {
            let (length, flags, used) = match self.alloc.bgs.get(&start) {
                Some(b) => (b.length, b.flags, b.used),
                None => return Err(Error::corrupt(format!("no block group at {start}"))),
            };
            if used != 0 {
                return Err(Error::corrupt(format!(
                    "internal: block group {start} still holds {used} bytes after relocation"
                )));
            }
            let end = start + length;
            let tree = bg_tree_id(&self.fs.info);
            self.delete_item(tree, &Key::new(start, BLOCK_GROUP_ITEM_KEY, length))?;
            let fst = self.root_ptr(FREE_SPACE_TREE_OBJECTID)?;
            let mut keys = Vec::new();
            for item in crate::tree::ctree::TreeIter::new(
                &self.fs.info,
                &fst,
                Key::new(start, 0, 0),
                Key::new(end - 1, u8::MAX, u64::MAX),
            )? {
                let k = item?.key();
                if (FREE_SPACE_INFO_KEY..=FREE_SPACE_BITMAP_KEY).contains(&k.ty) {
                    keys.push(k);
                }
            }
            for k in keys {
                self.delete_item(FREE_SPACE_TREE_OBJECTID, &k)?;
            }
            let entry = self.fs.info.chunk_map.lookup(start)?.clone();
            let mut stripes = Vec::new();
            for st in &entry.stripes {
                self.delete_item(
                    DEV_TREE_OBJECTID,
                    &Key::new(st.devid, DEV_EXTENT_KEY, st.physical),
                )?;
                let ds = self.alloc.dev_space.get_mut(&st.devid).ok_or_else(|| {
                    Error::corrupt(format!(
                        "chunk {start}: stripe on unknown device {}",
                        st.devid
                    ))
                })?;
                let len = ds.used.get(&st.physical).copied().unwrap_or(0);
                ds.bytes_used = ds.bytes_used.saturating_sub(len);
                stripes.push((st.devid, st.physical));
            }
            let chunk_key = Key::new(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, start);
            self.delete_item(CHUNK_TREE_OBJECTID, &chunk_key)?;
            if flags & BLOCK_GROUP_SYSTEM != 0 {
                self.remove_sys_chunk(start)?;
            }
            self.alloc.bgs.remove(&start);
            self.alloc
                .removed
                .push(crate::alloc::block_group::RemovedGroup {
                    start,
                    length,
                    stripes,
                });
            self.update_dev_items()?;
        }
        Ok(())
    }

    /// After the commit that removed them is durable: the removed groups' logical
    /// ranges leave the chunk map and their device ranges become free.
    pub(crate) fn forget_removed_block_groups(
        &mut self,
        removed: Vec<crate::alloc::block_group::RemovedGroup>,
    ) {
        for r in removed {
            self.fs.info.chunk_map.remove(r.start);
            for (devid, physical) in r.stripes {
                if let Some(ds) = self.alloc.dev_space.get_mut(&devid) {
                    ds.used.remove(&physical);
                }
            }
            self.fs.info.cache_forget_range(r.start, r.length);
        }
    }

    /// Drops the chunk at logical `start` from the superblock's sys_chunk_array
    /// (the kernel's btrfs_del_sys_chunk): entries are a disk key and a chunk item
    /// with its stripes.
    fn remove_sys_chunk(&mut self, start: u64) -> Result<()> {
        let sb = &mut self.fs.info.sb;
        let arr = sb.sys_chunk_array[..sb.sys_chunk_array_size as usize].to_vec();
        let mut out = Vec::with_capacity(arr.len());
        let mut pos = 0;
        while pos < arr.len() {
            let bad = || Error::corrupt("superblock sys_chunk_array is truncated".to_string());
            let key = Key::from_bytes(arr.get(pos..pos + DISK_KEY_SIZE).ok_or_else(bad)?)
                .map_err(|_| bad())?;
            let chunk_at = pos + DISK_KEY_SIZE;
            let num_stripes = ubtrfs_format::bytes::le16(&arr, chunk_at + 44, "chunk")
                .map_err(|_| bad())? as usize;
            let len = CHUNK_BASE_SIZE + num_stripes * STRIPE_SIZE;
            let entry = arr.get(pos..chunk_at + len).ok_or_else(bad)?;
            if !(key.ty == CHUNK_ITEM_KEY && key.offset == start) {
                out.extend_from_slice(entry);
            }
            pos = chunk_at + len;
        }
        sb.sys_chunk_array_size = out.len() as u32;
        out.resize(SYSTEM_CHUNK_ARRAY_SIZE, 0);
        sb.sys_chunk_array = out;
        Ok(())
    }

    /// Writes bytes_used of every device into its DEV_ITEM and the superblock copy.
    pub(crate) fn update_dev_items(&mut self) -> Result<()> {
        let devs: Vec<(u64, u64)> = self
            .alloc
            .dev_space
            .iter()
            .map(|(d, s)| (*d, s.bytes_used))
            .collect();
        for (devid, used) in devs {
            let key = Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, devid);
            self.update_item(CHUNK_TREE_OBJECTID, &key, |d| {
                // bytes_used follows devid and total_bytes.
                if d.len() >= 24 {
                    d[16..24].copy_from_slice(&used.to_le_bytes());
                }
            })?;
            if self.fs.info.sb.dev_item.devid == devid {
                self.fs.info.sb.dev_item.bytes_used = used;
            }
        }
        Ok(())
    }

    /// Writes the BLOCK_GROUP_ITEM of every dirty block group.
    pub(crate) fn write_dirty_block_groups(&mut self) -> Result<bool> {
        let tree = bg_tree_id(&self.fs.info);
        let dirty: Vec<(u64, u64, u64, u64, bool)> = self
            .alloc
            .bgs
            .values()
            .filter(|b| b.dirty)
            .map(|b| (b.start, b.length, b.flags, b.used, b.new))
            .collect();
        let mut changed = false;
        for (start, length, flags, used, new) in dirty {
            let key = Key::new(start, BLOCK_GROUP_ITEM_KEY, length);
            let item = BlockGroupItem {
                used,
                chunk_objectid: FIRST_CHUNK_TREE_OBJECTID,
                flags,
            }
            .to_bytes();
            if new {
                self.insert_item(tree, &key, &item)?;
                changed = true;
            } else {
                let mut same = true;
                self.update_item(tree, &key, |d| {
                    if d[..] != item[..] {
                        same = false;
                        d.copy_from_slice(&item);
                    }
                })?;
                changed |= !same;
            }
            if let Some(b) = self.alloc.bgs.get_mut(&start) {
                b.new = false;
            }
        }
        Ok(changed)
    }
}
