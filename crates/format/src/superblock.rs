//! The superblock (4 KiB at 64 KiB, 64 MiB and 256 GiB on every device).
//!
//! Byte layout (offsets in hex): 00 csum[32] | 20 fsid | 30 bytenr | 38 flags | 40 magic |
//! 48 generation | 50 root | 58 chunk_root | 60 log_root | 70 total_bytes | 78 bytes_used |
//! 80 root_dir_objectid | 88 num_devices | 90 sectorsize | 94 nodesize | 9c stripesize |
//! a0 sys_chunk_array_size | a4 chunk_root_generation | ac compat | b4 compat_ro |
//! bc incompat | c4 csum_type u16 | c6 root_level | c7 chunk_root_level | c8 log_root_level |
//! c9 dev_item[98] | 12b label[256] | 22b cache_generation | 233 uuid_tree_generation |
//! 23b metadata_uuid | 24b nr_global_roots | 32b sys_chunk_array[2048] |
//! b2b super_roots[4 x 168]. The checksum covers bytes 0x20..0x1000.

use crate::bytes::Cursor;
use crate::consts::*;
use crate::csum::CsumType;
use crate::items::{Chunk, DevItem};
use crate::key::Key;
use crate::{FormatError, Result};
use serde::Serialize;

pub const SYS_CHUNK_ARRAY_OFFSET: usize = 0x32b;
pub const SUPER_ROOTS_OFFSET: usize = 0xb2b;
pub const ROOT_BACKUP_SIZE: usize = 168;
pub const NUM_BACKUP_ROOTS: usize = 4;

#[derive(Clone, Debug, Default, Serialize)]
pub struct RootBackup {
    pub tree_root: u64,
    pub tree_root_gen: u64,
    pub chunk_root: u64,
    pub chunk_root_gen: u64,
    pub extent_root: u64,
    pub extent_root_gen: u64,
    pub fs_root: u64,
    pub fs_root_gen: u64,
    pub dev_root: u64,
    pub dev_root_gen: u64,
    pub csum_root: u64,
    pub csum_root_gen: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub num_devices: u64,
    pub tree_root_level: u8,
    pub chunk_root_level: u8,
    pub extent_root_level: u8,
    pub fs_root_level: u8,
    pub dev_root_level: u8,
    pub csum_root_level: u8,
}

impl RootBackup {
    fn parse(c: &mut Cursor<'_>) -> Result<RootBackup> {
        let mut r = RootBackup {
            tree_root: c.u64()?,
            tree_root_gen: c.u64()?,
            chunk_root: c.u64()?,
            chunk_root_gen: c.u64()?,
            extent_root: c.u64()?,
            extent_root_gen: c.u64()?,
            fs_root: c.u64()?,
            fs_root_gen: c.u64()?,
            dev_root: c.u64()?,
            dev_root_gen: c.u64()?,
            csum_root: c.u64()?,
            csum_root_gen: c.u64()?,
            total_bytes: c.u64()?,
            bytes_used: c.u64()?,
            num_devices: c.u64()?,
            ..Default::default()
        };
        c.skip(32)?;
        r.tree_root_level = c.u8()?;
        r.chunk_root_level = c.u8()?;
        r.extent_root_level = c.u8()?;
        r.fs_root_level = c.u8()?;
        r.dev_root_level = c.u8()?;
        r.csum_root_level = c.u8()?;
        c.skip(10)?;
        Ok(r)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SuperBlock {
    pub csum: [u8; 32],
    pub fsid: [u8; 16],
    pub bytenr: u64,
    pub flags: u64,
    pub magic: u64,
    pub generation: u64,
    pub root: u64,
    pub chunk_root: u64,
    pub log_root: u64,
    pub log_root_transid: u64,
    pub total_bytes: u64,
    pub bytes_used: u64,
    pub root_dir_objectid: u64,
    pub num_devices: u64,
    pub sectorsize: u32,
    pub nodesize: u32,
    pub leafsize: u32,
    pub stripesize: u32,
    pub sys_chunk_array_size: u32,
    pub chunk_root_generation: u64,
    pub compat_flags: u64,
    pub compat_ro_flags: u64,
    pub incompat_flags: u64,
    pub csum_type_raw: u16,
    pub root_level: u8,
    pub chunk_root_level: u8,
    pub log_root_level: u8,
    pub dev_item: DevItem,
    #[serde(skip)]
    pub label_raw: [u8; 256],
    pub cache_generation: u64,
    pub uuid_tree_generation: u64,
    pub metadata_uuid: [u8; 16],
    pub nr_global_roots: u64,
    #[serde(skip)]
    pub sys_chunk_array: Vec<u8>,
    pub backup_roots: Vec<RootBackup>,
    /// The whole 4096 bytes as read, so a writer can update fields in place.
    #[serde(skip)]
    pub raw: Vec<u8>,
}

impl SuperBlock {
    /// Parses a 4096-byte superblock. Checks only that the bytes are decodable; use
    /// [`SuperBlock::check`] for the sanity rules and [`SuperBlock::verify_csum`].
    pub fn parse(buf: &[u8]) -> Result<SuperBlock> {
        if buf.len() < SUPER_INFO_SIZE {
            return Err(FormatError::Truncated {
                what: "superblock",
                offset: 0,
                need: SUPER_INFO_SIZE,
                have: buf.len(),
            });
        }
        let mut c = Cursor::new(&buf[..SUPER_INFO_SIZE], "superblock");
        let csum = c.array()?;
        let fsid = c.array()?;
        let bytenr = c.u64()?;
        let flags = c.u64()?;
        let magic = c.u64()?;
        let generation = c.u64()?;
        let root = c.u64()?;
        let chunk_root = c.u64()?;
        let log_root = c.u64()?;
        let log_root_transid = c.u64()?;
        let total_bytes = c.u64()?;
        let bytes_used = c.u64()?;
        let root_dir_objectid = c.u64()?;
        let num_devices = c.u64()?;
        let sectorsize = c.u32()?;
        let nodesize = c.u32()?;
        let leafsize = c.u32()?;
        let stripesize = c.u32()?;
        let sys_chunk_array_size = c.u32()?;
        let chunk_root_generation = c.u64()?;
        let compat_flags = c.u64()?;
        let compat_ro_flags = c.u64()?;
        let incompat_flags = c.u64()?;
        let csum_type_raw = c.u16()?;
        let root_level = c.u8()?;
        let chunk_root_level = c.u8()?;
        let log_root_level = c.u8()?;
        let dev_item = DevItem::parse(c.bytes(DevItem::SIZE)?)?;
        let label_raw = c.array()?;
        let cache_generation = c.u64()?;
        let uuid_tree_generation = c.u64()?;
        let metadata_uuid = c.array()?;
        let nr_global_roots = c.u64()?;
        debug_assert_eq!(c.pos(), 0x253);
        let mut c = Cursor::at(
            &buf[..SUPER_INFO_SIZE],
            SYS_CHUNK_ARRAY_OFFSET,
            "superblock",
        );
        let sys_chunk_array = c.bytes(SYSTEM_CHUNK_ARRAY_SIZE)?.to_vec();
        let mut backup_roots = Vec::with_capacity(NUM_BACKUP_ROOTS);
        for _ in 0..NUM_BACKUP_ROOTS {
            backup_roots.push(RootBackup::parse(&mut c)?);
        }
        Ok(SuperBlock {
            csum,
            fsid,
            bytenr,
            flags,
            magic,
            generation,
            root,
            chunk_root,
            log_root,
            log_root_transid,
            total_bytes,
            bytes_used,
            root_dir_objectid,
            num_devices,
            sectorsize,
            nodesize,
            leafsize,
            stripesize,
            sys_chunk_array_size,
            chunk_root_generation,
            compat_flags,
            compat_ro_flags,
            incompat_flags,
            csum_type_raw,
            root_level,
            chunk_root_level,
            log_root_level,
            dev_item,
            label_raw,
            cache_generation,
            uuid_tree_generation,
            metadata_uuid,
            nr_global_roots,
            sys_chunk_array,
            backup_roots,
            raw: buf[..SUPER_INFO_SIZE].to_vec(),
        })
    }

    pub fn csum_type(&self) -> Option<CsumType> {
        CsumType::from_u16(self.csum_type_raw)
    }

    pub fn label(&self) -> String {
        let end = self
            .label_raw
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(LABEL_SIZE);
        String::from_utf8_lossy(&self.label_raw[..end]).into_owned()
    }

    /// The fsid that tree block headers carry (metadata_uuid when that feature is on).
    pub fn metadata_fsid(&self) -> [u8; 16] {
        if self.incompat_flags & FEATURE_INCOMPAT_METADATA_UUID != 0 {
            self.metadata_uuid
        } else {
            self.fsid
        }
    }

    /// Verifies the checksum over bytes 0x20..0x1000. Returns (expected, found) on mismatch.
    pub fn verify_csum(&self) -> std::result::Result<(), (Vec<u8>, Vec<u8>)> {
        let Some(t) = self.csum_type() else {
            return Err((vec![], vec![]));
        };
        let found = t.compute(&self.raw[CSUM_SIZE_MAX..SUPER_INFO_SIZE]);
        let n = t.size();
        if found[..n] == self.csum[..n] {
            Ok(())
        } else {
            Err((self.csum[..n].to_vec(), found[..n].to_vec()))
        }
    }

    /// The sanity rules a superblock must pass before anything is read through it
    /// (mirrors the kernel's validate_super). `expected_bytenr` is where it was read.
    pub fn check(&self, expected_bytenr: u64) -> Result<()> {
        let bad = |d: String| Err(FormatError::invalid("superblock", d));
        if self.magic != BTRFS_MAGIC {
            return bad("bad magic (not a btrfs filesystem)".into());
        }
        if self.csum_type().is_none() {
            return bad(format!("unknown checksum type {}", self.csum_type_raw));
        }
        if self.bytenr != expected_bytenr {
            return bad(format!(
                "bytenr {} does not match its location {}",
                self.bytenr, expected_bytenr
            ));
        }
        let ss = self.sectorsize;
        if !ss.is_power_of_two() || !(4096..=65536).contains(&ss) {
            return bad(format!("invalid sectorsize {ss}"));
        }
        let ns = self.nodesize;
        if !ns.is_power_of_two() || ns < ss || !(4096..=65536).contains(&ns) {
            return bad(format!("invalid nodesize {ns}"));
        }
        if self.root_level >= MAX_LEVEL
            || self.chunk_root_level >= MAX_LEVEL
            || self.log_root_level >= MAX_LEVEL
        {
            return bad("tree level out of range".into());
        }
        for (name, v) in [("root", self.root), ("chunk_root", self.chunk_root)] {
            if v == 0 || !v.is_multiple_of(ss as u64) {
                return bad(format!("{name} {v} is not sector aligned"));
            }
        }
        if !self.log_root.is_multiple_of(ss as u64) {
            return bad(format!("log_root {} is not sector aligned", self.log_root));
        }
        if self.sys_chunk_array_size as usize > SYSTEM_CHUNK_ARRAY_SIZE {
            return bad(format!(
                "sys_chunk_array_size {} exceeds {}",
                self.sys_chunk_array_size, SYSTEM_CHUNK_ARRAY_SIZE
            ));
        }
        if self.num_devices == 0 {
            return bad("num_devices is 0".into());
        }
        if self.generation == 0 {
            return bad("generation is 0".into());
        }
        if self.chunk_root_generation > self.generation {
            return bad(format!(
                "chunk_root_generation {} newer than generation {}",
                self.chunk_root_generation, self.generation
            ));
        }
        if self.dev_item.fsid != self.metadata_fsid() && self.dev_item.fsid != self.fsid {
            return bad("dev_item fsid does not match the filesystem".into());
        }
        Ok(())
    }

    /// The SYSTEM chunks stored in the superblock, needed to read the chunk tree.
    pub fn sys_chunks(&self) -> Result<Vec<(Key, Chunk)>> {
        let n = self.sys_chunk_array_size as usize;
        let arr = self
            .sys_chunk_array
            .get(..n)
            .ok_or_else(|| FormatError::invalid("sys_chunk_array", "size out of range"))?;
        let mut c = Cursor::new(arr, "sys_chunk_array");
        let mut out = Vec::new();
        while !c.is_empty() {
            let key = Key::parse(&mut c)?;
            if key.ty != CHUNK_ITEM_KEY {
                return Err(FormatError::invalid(
                    "sys_chunk_array",
                    format!("unexpected key type {} at offset {}", key.ty, c.pos() - 17),
                ));
            }
            let start = c.pos();
            let chunk = Chunk::parse(&arr[start..])?;
            c.skip(chunk.item_size())?;
            out.push((key, chunk));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn short_buffer_is_error() {
        assert!(SuperBlock::parse(&[0u8; 100]).is_err());
    }
    #[test]
    fn zeroed_superblock_fails_check() {
        let sb = SuperBlock::parse(&[0u8; 4096]).unwrap();
        let e = sb.check(SUPER_INFO_OFFSET).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
    }
}
