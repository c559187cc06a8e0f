//! The superblock (4 KiB at 64 KiB, 64 MiB and 256 GiB on every device).
//!
//! Byte layout (offsets in hex): 00 csum\[32\] | 20 fsid | 30 bytenr | 38 flags | 40 magic |
//! 48 generation | 50 root | 58 chunk_root | 60 log_root | 70 total_bytes | 78 bytes_used |
//! 80 root_dir_objectid | 88 num_devices | 90 sectorsize | 94 nodesize | 9c stripesize |
//! a0 sys_chunk_array_size | a4 chunk_root_generation | ac compat | b4 compat_ro |
//! bc incompat | c4 csum_type u16 | c6 root_level | c7 chunk_root_level | c8 log_root_level |
//! c9 dev_item\[98\] | 12b label\[256\] | 22b cache_generation | 233 uuid_tree_generation |
//! 23b metadata_uuid | 24b nr_global_roots | 32b sys_chunk_array\[2048\] |
//! b2b super_roots[4 x 168]. The checksum covers bytes 0x20..0x1000.

use crate::bytes::{push16, push32, push64, put64, Cursor};
use crate::consts::*;
use crate::csum::CsumType;
use crate::items::{Chunk, DevItem};
use crate::key::Key;
use crate::{FormatError, Result};

/// Offset of sys_chunk_array in the superblock.
pub const SYS_CHUNK_ARRAY_OFFSET: usize = 0x32b;
/// Offset of the backup roots (super_roots) in the superblock.
pub const SUPER_ROOTS_OFFSET: usize = 0xb2b;
/// Size of one backup root (struct btrfs_root_backup).
pub const ROOT_BACKUP_SIZE: usize = 168;
/// Number of backup roots in the superblock (BTRFS_NUM_BACKUP_ROOTS).
pub const NUM_BACKUP_ROOTS: usize = 4;

/// One backup of the main tree roots (struct btrfs_root_backup), kept in the superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootBackup {
    /// Logical address of the root tree root.
    pub tree_root: u64,
    /// Generation of the root tree root.
    pub tree_root_gen: u64,
    /// Logical address of the chunk tree root.
    pub chunk_root: u64,
    /// Generation of the chunk tree root.
    pub chunk_root_gen: u64,
    /// Logical address of the extent tree root.
    pub extent_root: u64,
    /// Generation of the extent tree root.
    pub extent_root_gen: u64,
    /// Logical address of the FS tree root.
    pub fs_root: u64,
    /// Generation of the FS tree root.
    pub fs_root_gen: u64,
    /// Logical address of the device tree root.
    pub dev_root: u64,
    /// Generation of the device tree root.
    pub dev_root_gen: u64,
    /// Logical address of the checksum tree root.
    pub csum_root: u64,
    /// Generation of the checksum tree root.
    pub csum_root_gen: u64,
    /// Total bytes of all devices at that commit.
    pub total_bytes: u64,
    /// Bytes used at that commit.
    pub bytes_used: u64,
    /// Number of devices at that commit.
    pub num_devices: u64,
    /// Level of the root tree root.
    pub tree_root_level: u8,
    /// Level of the chunk tree root.
    pub chunk_root_level: u8,
    /// Level of the extent tree root.
    pub extent_root_level: u8,
    /// Level of the FS tree root.
    pub fs_root_level: u8,
    /// Level of the device tree root.
    pub dev_root_level: u8,
    /// Level of the checksum tree root.
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

impl RootBackup {
    /// Writes the modelled fields into `out[..168]` at their offsets (15 u64 at 0, the six
    /// levels at 0x98), leaving the unused bytes (4 u64 at 0x78, 10 at 0x9e) untouched.
    /// Panics if `out` is shorter than [`ROOT_BACKUP_SIZE`].
    pub fn write(&self, out: &mut [u8]) {
        let words = [
            self.tree_root,
            self.tree_root_gen,
            self.chunk_root,
            self.chunk_root_gen,
            self.extent_root,
            self.extent_root_gen,
            self.fs_root,
            self.fs_root_gen,
            self.dev_root,
            self.dev_root_gen,
            self.csum_root,
            self.csum_root_gen,
            self.total_bytes,
            self.bytes_used,
            self.num_devices,
        ];
        for (i, w) in words.into_iter().enumerate() {
            put64(out, i * 8, w);
        }
        out[0x98..0x9e].copy_from_slice(&[
            self.tree_root_level,
            self.chunk_root_level,
            self.extent_root_level,
            self.fs_root_level,
            self.dev_root_level,
            self.csum_root_level,
        ]);
    }
    /// The 168-byte backup root, unused bytes zero.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; ROOT_BACKUP_SIZE];
        self.write(&mut out);
        out
    }
}

/// A decoded superblock (struct btrfs_super_block).
#[derive(Clone, Debug)]
pub struct SuperBlock {
    /// Checksum of bytes 0x20..0x1000 (left-aligned).
    pub csum: [u8; 32],
    /// Filesystem UUID (fsid).
    pub fsid: [u8; 16],
    /// Physical address of this copy.
    pub bytenr: u64,
    /// Superblock flags (`SUPER_FLAG_*`).
    pub flags: u64,
    /// Magic number ([`BTRFS_MAGIC`]).
    pub magic: u64,
    /// Transaction id of the last commit.
    pub generation: u64,
    /// Logical address of the root tree root.
    pub root: u64,
    /// Logical address of the chunk tree root.
    pub chunk_root: u64,
    /// Logical address of the log tree root (0: no log).
    pub log_root: u64,
    /// Unused by current kernels (log_root_transid).
    pub log_root_transid: u64,
    /// Total bytes of all devices.
    pub total_bytes: u64,
    /// Bytes used.
    pub bytes_used: u64,
    /// Object id of the root tree directory ([`ROOT_TREE_DIR_OBJECTID`]).
    pub root_dir_objectid: u64,
    /// Number of devices.
    pub num_devices: u64,
    /// Sector size: the unit of data allocation.
    pub sectorsize: u32,
    /// Tree block size.
    pub nodesize: u32,
    /// Legacy leaf size (equals nodesize).
    pub leafsize: u32,
    /// Stripe size (unused; equals sectorsize).
    pub stripesize: u32,
    /// Bytes of sys_chunk_array in use.
    pub sys_chunk_array_size: u32,
    /// Generation of the chunk tree root.
    pub chunk_root_generation: u64,
    /// compat feature flags (none defined).
    pub compat_flags: u64,
    /// compat_ro feature flags (`FEATURE_COMPAT_RO_*`).
    pub compat_ro_flags: u64,
    /// incompat feature flags (`FEATURE_INCOMPAT_*`).
    pub incompat_flags: u64,
    /// Checksum type as stored (see [`SuperBlock::csum_type`]).
    pub csum_type_raw: u16,
    /// Level of the root tree root.
    pub root_level: u8,
    /// Level of the chunk tree root.
    pub chunk_root_level: u8,
    /// Level of the log tree root.
    pub log_root_level: u8,
    /// The device this copy belongs to.
    pub dev_item: DevItem,
    /// Label, NUL-padded.
    pub label_raw: [u8; 256],
    /// Generation of the v1 free space cache (invalid if it differs from generation).
    pub cache_generation: u64,
    /// Generation at which the UUID tree was last checked.
    pub uuid_tree_generation: u64,
    /// UUID that tree block headers carry when METADATA_UUID is set.
    pub metadata_uuid: [u8; 16],
    /// Number of global roots (extent-tree-v2).
    pub nr_global_roots: u64,
    /// The 2048-byte sys_chunk_array: (key, chunk) pairs of the SYSTEM chunks.
    pub sys_chunk_array: Vec<u8>,
    /// The four backup roots.
    pub backup_roots: Vec<RootBackup>,
    /// The whole 4096 bytes as read, so a writer can update fields in place.
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

    /// Encodes the 4096-byte superblock. Starts from [`SuperBlock::raw`] when it holds
    /// 4096 bytes (keeping the bytes not modelled here: reserved words, padding, the
    /// unused words of the backup roots) and from zeros otherwise, overwrites every
    /// modelled field, writes `sys_chunk_array[..sys_chunk_array_size]` and zeroes the
    /// rest of that 2048-byte area, writes the first four `backup_roots` (slots beyond
    /// `backup_roots.len()` keep the base bytes), then checksums bytes 0x20..0x1000 with
    /// the csum type of `csum_type_raw` into bytes 0..0x20. With an unknown csum type
    /// the `csum` field is written as is.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = if self.raw.len() == SUPER_INFO_SIZE {
            self.raw.clone()
        } else {
            vec![0u8; SUPER_INFO_SIZE]
        };

        // 0x20..0x253: the fixed fields, in parse order.
        let mut f = Vec::with_capacity(0x253 - CSUM_SIZE_MAX);
        f.extend_from_slice(&self.fsid);
        for v in [
            self.bytenr,
            self.flags,
            self.magic,
            self.generation,
            self.root,
            self.chunk_root,
            self.log_root,
            self.log_root_transid,
            self.total_bytes,
            self.bytes_used,
            self.root_dir_objectid,
            self.num_devices,
        ] {
            push64(&mut f, v);
        }
        for v in [
            self.sectorsize,
            self.nodesize,
            self.leafsize,
            self.stripesize,
            self.sys_chunk_array_size,
        ] {
            push32(&mut f, v);
        }
        for v in [
            self.chunk_root_generation,
            self.compat_flags,
            self.compat_ro_flags,
            self.incompat_flags,
        ] {
            push64(&mut f, v);
        }
        push16(&mut f, self.csum_type_raw);
        f.push(self.root_level);
        f.push(self.chunk_root_level);
        f.push(self.log_root_level);
        self.dev_item.write(&mut f);
        f.extend_from_slice(&self.label_raw);
        push64(&mut f, self.cache_generation);
        push64(&mut f, self.uuid_tree_generation);
        f.extend_from_slice(&self.metadata_uuid);
        push64(&mut f, self.nr_global_roots);
        debug_assert_eq!(f.len(), 0x253 - CSUM_SIZE_MAX);
        out[CSUM_SIZE_MAX..CSUM_SIZE_MAX + f.len()].copy_from_slice(&f);

        let area =
            &mut out[SYS_CHUNK_ARRAY_OFFSET..SYS_CHUNK_ARRAY_OFFSET + SYSTEM_CHUNK_ARRAY_SIZE];
        let n = (self.sys_chunk_array_size as usize)
            .min(SYSTEM_CHUNK_ARRAY_SIZE)
            .min(self.sys_chunk_array.len());
        area[..n].copy_from_slice(&self.sys_chunk_array[..n]);
        area[n..].fill(0);

        for (i, b) in self.backup_roots.iter().take(NUM_BACKUP_ROOTS).enumerate() {
            let off = SUPER_ROOTS_OFFSET + i * ROOT_BACKUP_SIZE;
            b.write(&mut out[off..off + ROOT_BACKUP_SIZE]);
        }

        let csum = match self.csum_type() {
            Some(t) => t.compute(&out[CSUM_SIZE_MAX..]),
            None => self.csum,
        };
        out[..CSUM_SIZE_MAX].copy_from_slice(&csum);
        out
    }

    /// The checksum type, if known.
    pub fn csum_type(&self) -> Option<CsumType> {
        CsumType::from_u16(self.csum_type_raw)
    }

    /// The label up to its first NUL, lossily decoded as UTF-8.
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

    const FIXTURES: [(&str, &[u8]); 4] = [
        (
            "crc32c",
            include_bytes!("../tests/data/nodesize4k-super.bin"),
        ),
        (
            "xxhash64",
            include_bytes!("../tests/data/csum-xxhash-super.bin"),
        ),
        (
            "sha256",
            include_bytes!("../tests/data/csum-sha256-super.bin"),
        ),
        (
            "blake2b",
            include_bytes!("../tests/data/csum-blake2-super.bin"),
        ),
    ];

    /// Every decoded field (not `raw`), for comparing two superblocks.
    fn fields(sb: &SuperBlock) -> String {
        let mut sb = sb.clone();
        sb.raw.clear();
        format!("{sb:?}")
    }

    #[test]
    fn root_backup_roundtrip() {
        let b = RootBackup {
            tree_root: 1,
            tree_root_gen: 2,
            chunk_root: 3,
            chunk_root_gen: 4,
            extent_root: 5,
            extent_root_gen: 6,
            fs_root: 7,
            fs_root_gen: 8,
            dev_root: 9,
            dev_root_gen: 10,
            csum_root: 11,
            csum_root_gen: 12,
            total_bytes: 13,
            bytes_used: 14,
            num_devices: 15,
            tree_root_level: 16,
            chunk_root_level: 17,
            extent_root_level: 18,
            fs_root_level: 19,
            dev_root_level: 20,
            csum_root_level: 21,
        };
        let bytes = b.to_bytes();
        assert_eq!(bytes.len(), ROOT_BACKUP_SIZE);
        assert!(bytes[0x78..0x98].iter().all(|&x| x == 0));
        assert_eq!(&bytes[0x98..0x9e], &[16, 17, 18, 19, 20, 21]);
        assert!(bytes[0x9e..].iter().all(|&x| x == 0));
        let mut c = Cursor::new(&bytes, "backup");
        assert_eq!(RootBackup::parse(&mut c).unwrap(), b);
        assert!(c.is_empty());
    }

    /// First offset where two buffers differ (or where one ends), for short messages.
    fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
        (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
    }

    /// Kernel-written superblocks of all four checksum types come back byte for byte,
    /// both from `raw` and from the decoded fields alone (the bytes not modelled are
    /// zero in what the kernel writes). One exception: nothing clears the sys_chunk_array
    /// past sys_chunk_array_size when a system chunk is removed (all four fixtures keep a
    /// stale chunk there), and `to_bytes` zeroes that tail, which changes the csum.
    #[test]
    fn kernel_superblocks_reencode_exactly() {
        let mut stale_tails = 0;
        for (name, bytes) in FIXTURES {
            let sb = SuperBlock::parse(bytes).unwrap();
            let t = sb.csum_type().unwrap();
            assert_eq!(t.name(), name);
            sb.verify_csum().unwrap();
            sb.check(SUPER_INFO_OFFSET).unwrap();
            let mut expect = bytes.to_vec();
            let tail = SYS_CHUNK_ARRAY_OFFSET + sb.sys_chunk_array_size as usize;
            if expect[tail..SUPER_ROOTS_OFFSET].iter().any(|&b| b != 0) {
                stale_tails += 1;
                expect[tail..SUPER_ROOTS_OFFSET].fill(0);
                let c = t.compute(&expect[CSUM_SIZE_MAX..]);
                expect[..CSUM_SIZE_MAX].copy_from_slice(&c);
            }
            let out = sb.to_bytes();
            assert_eq!(first_diff(&out, &expect), None, "{name}");
            assert_eq!(
                first_diff(&out[CSUM_SIZE_MAX..tail], &bytes[CSUM_SIZE_MAX..tail]),
                None
            );
            assert_eq!(
                first_diff(&out[SUPER_ROOTS_OFFSET..], &bytes[SUPER_ROOTS_OFFSET..]),
                None
            );
            let bare = SuperBlock {
                raw: Vec::new(),
                ..sb.clone()
            };
            assert_eq!(
                first_diff(&bare.to_bytes(), &expect),
                None,
                "{name} without raw"
            );
            let again = SuperBlock::parse(&out).unwrap();
            again.verify_csum().unwrap();
            assert_eq!(again.to_bytes(), out);
            assert_eq!(again.backup_roots, sb.backup_roots);
            assert_eq!(again.sys_chunks().unwrap(), sb.sys_chunks().unwrap());
            assert!(!sb.sys_chunks().unwrap().is_empty());
        }
        // mkfs.btrfs adds and then removes a temporary system chunk, so every fixture
        // has one.
        assert_eq!(stale_tails, FIXTURES.len());
    }

    #[test]
    fn edited_superblock_reparses_with_valid_csum() {
        let (_, bytes) = FIXTURES[0];
        let mut sb = SuperBlock::parse(bytes).unwrap();
        sb.generation += 5;
        sb.root = 0x1234_5000;
        sb.root_level = 2;
        sb.bytes_used = 0x0102_0304_0506;
        sb.label_raw = [0; 256];
        sb.label_raw[..4].copy_from_slice(b"new!");
        sb.dev_item.bytes_used = 77 << 20;
        sb.backup_roots[2].fs_root_level = 3;
        sb.backup_roots[3].csum_root = 0xabcd_0000;
        // A byte we do not model survives from `raw`.
        sb.raw[0x300] = 0x5a;
        let out = sb.to_bytes();
        assert_eq!(out.len(), SUPER_INFO_SIZE);
        assert_eq!(out[0x300], 0x5a);
        let back = SuperBlock::parse(&out).unwrap();
        back.verify_csum().unwrap();
        assert_eq!(back.generation, sb.generation);
        assert_eq!(back.label(), "new!");
        assert_eq!(back.dev_item, sb.dev_item);
        assert_eq!(back.backup_roots, sb.backup_roots);
        let n = sb.sys_chunk_array_size as usize;
        sb.sys_chunk_array[n..].fill(0);
        assert_eq!(
            fields(&back),
            fields(&SuperBlock {
                csum: back.csum,
                ..sb
            })
        );
        assert_eq!(SuperBlock::parse(&back.to_bytes()).unwrap().to_bytes(), out);
    }

    /// A superblock built from nothing: every field set, parse(to_bytes(x)) == x.
    #[test]
    fn built_superblock_roundtrip() {
        let chunk = Chunk {
            length: 8 << 20,
            owner: 2,
            stripe_len: 65536,
            ty: 0x22,
            io_align: 65536,
            io_width: 65536,
            sector_size: 4096,
            num_stripes: 2,
            sub_stripes: 1,
            stripes: vec![
                crate::items::Stripe {
                    devid: 1,
                    offset: 22_020_096,
                    dev_uuid: [7; 16],
                },
                crate::items::Stripe {
                    devid: 1,
                    offset: 30_408_704,
                    dev_uuid: [7; 16],
                },
            ],
        };
        let key = Key::new(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, 22_020_096);
        let mut arr = key.to_bytes().to_vec();
        arr.extend(chunk.to_bytes());
        let used = arr.len();
        // Bytes past sys_chunk_array_size are not written.
        arr.resize(SYSTEM_CHUNK_ARRAY_SIZE, 0xee);
        let backups: Vec<RootBackup> = (0..4u64)
            .map(|i| RootBackup {
                tree_root: 100 + i,
                tree_root_gen: 200 + i,
                chunk_root: 300 + i,
                chunk_root_gen: 400 + i,
                extent_root: 500 + i,
                extent_root_gen: 600 + i,
                fs_root: 700 + i,
                fs_root_gen: 800 + i,
                dev_root: 900 + i,
                dev_root_gen: 1000 + i,
                csum_root: 1100 + i,
                csum_root_gen: 1200 + i,
                total_bytes: 1300 + i,
                bytes_used: 1400 + i,
                num_devices: 1500 + i,
                tree_root_level: i as u8,
                chunk_root_level: i as u8 + 1,
                extent_root_level: i as u8 + 2,
                fs_root_level: i as u8 + 3,
                dev_root_level: i as u8 + 4,
                csum_root_level: i as u8 + 5,
            })
            .collect();
        let mut label_raw = [0u8; 256];
        label_raw[..5].copy_from_slice(b"label");
        for t in [
            CsumType::Crc32c,
            CsumType::Xxhash64,
            CsumType::Sha256,
            CsumType::Blake2b,
        ] {
            let sb = SuperBlock {
                csum: [0; 32],
                fsid: [1; 16],
                bytenr: SUPER_INFO_OFFSET,
                flags: 1,
                magic: BTRFS_MAGIC,
                generation: 9,
                root: 0x40_0000,
                chunk_root: 0x50_0000,
                log_root: 0x60_0000,
                log_root_transid: 8,
                total_bytes: 1 << 30,
                bytes_used: 1 << 20,
                root_dir_objectid: 6,
                num_devices: 1,
                sectorsize: 4096,
                nodesize: 16384,
                leafsize: 16384,
                stripesize: 4096,
                sys_chunk_array_size: used as u32,
                chunk_root_generation: 7,
                compat_flags: 0x11,
                compat_ro_flags: 0x3,
                incompat_flags: 0x341,
                csum_type_raw: t.as_u16(),
                root_level: 1,
                chunk_root_level: 2,
                log_root_level: 3,
                dev_item: DevItem {
                    devid: 1,
                    total_bytes: 1 << 30,
                    bytes_used: 1 << 24,
                    io_align: 4096,
                    io_width: 4096,
                    sector_size: 4096,
                    ty: 2,
                    generation: 3,
                    start_offset: 4,
                    dev_group: 5,
                    seek_speed: 6,
                    bandwidth: 7,
                    uuid: [8; 16],
                    fsid: [1; 16],
                },
                label_raw,
                cache_generation: 10,
                uuid_tree_generation: 11,
                metadata_uuid: [12; 16],
                nr_global_roots: 13,
                sys_chunk_array: arr.clone(),
                backup_roots: backups.clone(),
                raw: Vec::new(),
            };
            let bytes = sb.to_bytes();
            assert_eq!(bytes.len(), SUPER_INFO_SIZE);
            assert!(bytes[SYS_CHUNK_ARRAY_OFFSET + used..SUPER_ROOTS_OFFSET]
                .iter()
                .all(|&b| b == 0));
            let back = SuperBlock::parse(&bytes).unwrap();
            back.verify_csum().unwrap();
            back.check(SUPER_INFO_OFFSET).unwrap();
            assert_eq!(back.csum_type(), Some(t));
            assert_eq!(back.label(), "label");
            assert_eq!(back.backup_roots, backups);
            assert_eq!(back.sys_chunks().unwrap(), vec![(key, chunk.clone())]);
            let mut want = sb.clone();
            want.csum = back.csum;
            want.sys_chunk_array[used..].fill(0);
            assert_eq!(fields(&back), fields(&want));
            assert_eq!(back.to_bytes(), bytes);
            // Corrupting a byte is caught.
            let mut bad = bytes.clone();
            bad[0x1000 - 1] ^= 1;
            assert!(SuperBlock::parse(&bad).unwrap().verify_csum().is_err());
        }
    }
}
