//! Chunks, device extents and devices: every stripe of every chunk has its DEV_EXTENT
//! (same chunk, same length), device extents do not overlap and stay on their device,
//! each DEV_ITEM's bytes_used is the sum of its extents, the superblocks agree, and the
//! superblock's SYSTEM chunks are the chunk tree's.

use super::extents::Extents;
use super::Findings;
use crate::error::Result;
use crate::io::disk_io::FsInfo;
use crate::io::volumes::MapEntry;
use crate::tree::ctree::TreeIter;
use std::collections::BTreeMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{Chunk, DevExtent, DevItem};
use ubtrfs_format::key::Key;

pub(super) fn check_chunks(fs: &FsInfo, _ext: &Extents, f: &mut Findings) {
    let mut chunks: Vec<(Key, Chunk)> = Vec::new();
    let mut devs: BTreeMap<u64, (Key, DevItem)> = BTreeMap::new();
    let chunk_root = fs.tree_ptr(CHUNK_TREE_OBJECTID);
    let res = (|| -> Result<()> {
        let Some(ptr) = chunk_root else { return Ok(()) };
        for item in TreeIter::new(fs, &ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            match k.ty {
                CHUNK_ITEM_KEY => {
                    if let Ok(c) = Chunk::parse(item.data()) {
                        chunks.push((k, c));
                    }
                }
                DEV_ITEM_KEY => {
                    if let Ok(d) = DevItem::parse(item.data()) {
                        devs.insert(d.devid, (k, d));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    })();
    if let Err(e) = res {
        f.add(
            "block-structure",
            Some(CHUNK_TREE_OBJECTID),
            None,
            None,
            format!("the chunk tree cannot be read: {e}"),
        );
        return;
    }
    // Device extents, by device and offset.
    let mut dev_ext: BTreeMap<(u64, u64), (Key, DevExtent)> = BTreeMap::new();
    let res = (|| -> Result<()> {
        let Some(ptr) = fs.tree_ptr(DEV_TREE_OBJECTID) else {
            return Ok(());
        };
        for item in TreeIter::new(fs, &ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            if k.ty == DEV_EXTENT_KEY {
                if let Ok(d) = DevExtent::parse(item.data()) {
                    dev_ext.insert((k.objectid, k.offset), (k, d));
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = res {
        f.add(
            "block-structure",
            Some(DEV_TREE_OBJECTID),
            None,
            None,
            format!("the device tree cannot be read: {e}"),
        );
        return;
    }
    let dev_tree = Some(DEV_TREE_OBJECTID);
    let chunk_tree = Some(CHUNK_TREE_OBJECTID);
    // Every stripe of every chunk has its device extent.
    let mut claimed: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for (k, c) in &chunks {
        let e = match MapEntry::from_chunk(k.offset, c, fs.sectorsize) {
            Ok(e) => e,
            Err(e) => {
                f.add(
                    "bg-chunk",
                    chunk_tree,
                    Some(k.offset),
                    Some(*k),
                    e.to_string(),
                );
                continue;
            }
        };
        let stripe_len = e.stripe_size();
        for s in &c.stripes {
            claimed.insert((s.devid, s.offset), k.offset);
            match dev_ext.get(&(s.devid, s.offset)) {
                None => f.add(
                    "dev-extent",
                    dev_tree,
                    Some(k.offset),
                    Some(Key::new(s.devid, DEV_EXTENT_KEY, s.offset)),
                    format!(
                        "chunk {} has a stripe at device {} offset {} without a device extent",
                        k.offset, s.devid, s.offset
                    ),
                ),
                Some((dk, d)) => {
                    if d.chunk_offset != k.offset || d.length != stripe_len {
                        f.add(
                            "dev-extent",
                            dev_tree,
                            Some(k.offset),
                            Some(*dk),
                            format!(
                                "device extent says chunk {} length {}, the chunk at {} has stripes of {stripe_len}",
                                d.chunk_offset, d.length, k.offset
                            ),
                        );
                    }
                }
            }
            if !devs.contains_key(&s.devid) {
                f.add(
                    "bg-chunk",
                    chunk_tree,
                    Some(k.offset),
                    Some(*k),
                    format!("stripe on device {} which has no DEV_ITEM", s.devid),
                );
            }
        }
        if c.ty & BLOCK_GROUP_SYSTEM != 0 {
            let in_sb = fs
                .sb
                .sys_chunks()
                .map(|v| v.iter().any(|(sk, sc)| sk == k && sc == c))
                .unwrap_or(false);
            if !in_sb {
                f.add(
                    "super-mirror",
                    chunk_tree,
                    Some(k.offset),
                    Some(*k),
                    "SYSTEM chunk differs from the superblock's sys_chunk_array copy".into(),
                );
            }
        }
    }
    // Device extents: each backs a chunk, none overlaps the next, each fits its device.
    let mut used: BTreeMap<u64, u64> = BTreeMap::new();
    let mut prev: Option<(u64, u64)> = None;
    for (&(devid, off), (dk, d)) in &dev_ext {
        let u = used.entry(devid).or_default();
        *u = u.saturating_add(d.length);
        if !claimed.contains_key(&(devid, off)) {
            f.add(
                "dev-extent",
                dev_tree,
                Some(d.chunk_offset),
                Some(*dk),
                format!(
                    "device extent for chunk {} which has no stripe here",
                    d.chunk_offset
                ),
            );
        }
        if let Some((pd, pend)) = prev {
            if pd == devid && off < pend {
                f.add(
                    "dev-extent",
                    dev_tree,
                    Some(d.chunk_offset),
                    Some(*dk),
                    format!("overlaps the previous device extent (ends at {pend})"),
                );
            }
        }
        prev = Some((devid, off.saturating_add(d.length)));
        if let Some((_, di)) = devs.get(&devid) {
            if off.saturating_add(d.length) > di.total_bytes {
                f.add(
                    "dev-extent",
                    dev_tree,
                    Some(d.chunk_offset),
                    Some(*dk),
                    format!("ends beyond the device's {} bytes", di.total_bytes),
                );
            }
        }
    }
    let mut total = 0u64;
    for (devid, (dk, d)) in &devs {
        total = total.saturating_add(d.total_bytes);
        let u = used.get(devid).copied().unwrap_or(0);
        if d.bytes_used != u {
            f.add(
                "dev-bytes-used",
                chunk_tree,
                None,
                Some(*dk),
                format!(
                    "device {devid} says {} bytes used, its device extents add up to {u}",
                    d.bytes_used
                ),
            );
        }
        if fs.sb.dev_item.devid == *devid
            && (fs.sb.dev_item.bytes_used != d.bytes_used
                || fs.sb.dev_item.total_bytes != d.total_bytes)
        {
            f.add(
                "dev-bytes-used",
                chunk_tree,
                None,
                Some(*dk),
                format!(
                    "the superblock's copy of device {devid} says {} used of {}, the DEV_ITEM {} of {}",
                    fs.sb.dev_item.bytes_used,
                    fs.sb.dev_item.total_bytes,
                    d.bytes_used,
                    d.total_bytes
                ),
            );
        }
    }
    if total != fs.sb.total_bytes && !devs.is_empty() {
        f.add(
            "super-mirror",
            None,
            None,
            None,
            format!(
                "superblock total_bytes {} but the devices add up to {total}",
                fs.sb.total_bytes
            ),
        );
    }
}
