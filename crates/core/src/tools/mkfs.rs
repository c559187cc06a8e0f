//! Making a filesystem: lays out the first chunks (system, metadata, data), creates
//! empty trees with the engine itself and commits. Everything after the bootstrap
//! (extent items, block group items, free-space tree, device extents, chunk items, the
//! superblock's sys_chunk_array) comes out of the ordinary commit path, so a fresh
//! filesystem is built by exactly the code that later modifies it.
//!
//! Layout on one device (physical): 0-1 MiB reserved (superblock at 64 KiB), then the
//! system chunk's copies, the metadata chunk's copies, the data chunk.

use crate::alloc::block_group::DevSpace;
use crate::error::{Error, Result};
use crate::inode::inode::{now, NewInode};
use crate::io::dev::Device;
use crate::io::disk_io::{FsInfo, OpenOptions};
use crate::io::volumes::{ChunkMap, MapEntry, MapStripe};
use crate::transaction::Trans;
use std::collections::BTreeMap;
use std::sync::Arc;
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::CsumType;
use ubtrfs_format::items::{DevItem, InodeItem, RootItem, Timespec};
use ubtrfs_format::key::Key;
use ubtrfs_format::superblock::SuperBlock;

#[derive(Clone, Debug)]
/// What mkfs makes (the defaults are mkfs.btrfs 6.14's).
pub struct MkfsOptions {
    /// Tree block size.
    pub nodesize: u32,
    /// Data sector size.
    pub sectorsize: u32,
    /// Checksum algorithm.
    pub csum: CsumType,
    /// Filesystem label.
    pub label: String,
    /// Filesystem UUID (random if `None`).
    pub fsid: Option<[u8; 16]>,
    /// Profile bits (0 = single) for data and metadata (system follows metadata).
    pub data_profile: u64,
    /// Metadata block group profile (BLOCK_GROUP_* bits, 0 for single).
    pub metadata_profile: u64,
    /// Use a block-group tree.
    pub block_group_tree: bool,
    /// NO_HOLES: no explicit hole extents.
    pub no_holes: bool,
    /// Owner and time of the top-level directory.
    pub root_uid: u32,
    /// Group of the top-level directory.
    pub root_gid: u32,
    /// Mode of the top-level directory.
    pub root_mode: u32,
    /// Timestamps of what mkfs creates (now if `None`).
    pub time: Option<Timespec>,
    /// Small first chunks and capped new ones (for `shrink_to_fit` afterwards).
    pub shrink: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            nodesize: 16384,
            sectorsize: 4096,
            csum: CsumType::Crc32c,
            label: String::new(),
            fsid: None,
            data_profile: 0,
            metadata_profile: BLOCK_GROUP_DUP,
            block_group_tree: false,
            no_holes: true,
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o40755,
            time: None,
            shrink: false,
        }
    }
}

fn mib(x: u64) -> u64 {
    x << 20
}

/// The smallest device mkfs accepts for these options.
pub fn min_size(opts: &MkfsOptions) -> u64 {
    let copies = |p: u64| if p == BLOCK_GROUP_DUP { 2 } else { 1 };
    mib(1) + copies(opts.metadata_profile) * (mib(8) + mib(32)) + mib(64)
}

/// Creates a new filesystem on several devices (device ids 1, 2, ... in the order
/// given), as mkfs.btrfs given several devices: the first system, metadata and data
/// chunks are made by the allocator with the profiles asked for (any profile the
/// devices allow: single, DUP, RAID0, RAID1, RAID1C3, RAID1C4, RAID10, RAID5,
/// RAID6), every device gets its DEV_ITEM and superblocks. One device is
/// [`make_filesystem`].
pub fn make_filesystem_devices(devs: Vec<Arc<dyn Device>>, opts: &MkfsOptions) -> Result<Trans> {
    if devs.len() == 1 {
        return make_filesystem(devs[0].clone(), opts);
    }
    if devs.is_empty() {
        return Err(Error::Invalid("mkfs: no device".into()));
    }
    check_sizes(opts)?;
    if opts.shrink {
        return Err(Error::Unsupported("--shrink on several devices".into()));
    }
    let n = devs.len();
    for p in [opts.data_profile, opts.metadata_profile] {
        if crate::alloc::block_group::profile_copies(p).is_none()
            || crate::alloc::block_group::raid(p).devs_min > n
        {
            return Err(Error::Invalid(format!(
                "profile {} on {n} devices",
                profile_name(p)
            )));
        }
    }
    // Each device holds its superblock's megabyte and a share of the first chunks.
    let sizes: Vec<u64> = devs
        .iter()
        .map(|d| d.size() & !(opts.sectorsize as u64 - 1))
        .collect();
    for (i, &size) in sizes.iter().enumerate() {
        if size < mib(64) {
            return Err(Error::Invalid(format!(
                "device {} ({}) of {size} bytes is too small: at least {} needed",
                i + 1,
                devs[i].name(),
                mib(64)
            )));
        }
    }
    let fsid = opts.fsid.unwrap_or_else(crate::io::dev::random_uuid);
    let chunk_tree_uuid = crate::io::dev::random_uuid();
    let uuids: Vec<[u8; 16]> = (0..n).map(|_| crate::io::dev::random_uuid()).collect();
    let total: u64 = sizes.iter().sum();
    let mut sb = new_superblock(opts, fsid, total, n as u64, uuids[0])?;
    sb.dev_item.total_bytes = sizes[0];
    let devices: BTreeMap<u64, Arc<dyn Device>> = devs
        .into_iter()
        .enumerate()
        .map(|(i, d)| (i as u64 + 1, d))
        .collect();
    let info = FsInfo::new_raw(
        sb,
        devices,
        ChunkMap::default(),
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    );
    let mut t = Trans::bare(crate::fs::Filesystem::from_info(info), chunk_tree_uuid);
    t.alloc.profiles.insert(BLOCK_GROUP_DATA, opts.data_profile);
    for ty in [BLOCK_GROUP_METADATA, BLOCK_GROUP_SYSTEM] {
        t.alloc.profiles.insert(ty, opts.metadata_profile);
    }
    for (i, &size) in sizes.iter().enumerate() {
        let devid = i as u64 + 1;
        t.alloc.dev_space.insert(
            devid,
            DevSpace {
                total_bytes: size,
                bytes_used: 0,
                used: BTreeMap::new(),
                alloc_end: None,
            },
        );
        t.alloc.dev_uuids.insert(devid, uuids[i]);
    }
    let ns = opts.nodesize as u64;
    t.alloc
        .alloc_chunk(&mut t.fs.info, BLOCK_GROUP_SYSTEM, ns)?;
    t.alloc
        .alloc_chunk(&mut t.fs.info, BLOCK_GROUP_METADATA, ns)?;
    t.alloc
        .alloc_chunk(&mut t.fs.info, BLOCK_GROUP_DATA, opts.sectorsize as u64)?;
    let time = opts.time.unwrap_or_else(now);
    t.bootstrap_trees(opts, time)?;
    t.commit()?;
    Ok(t)
}

/// Sector and node sizes mkfs accepts.
fn check_sizes(opts: &MkfsOptions) -> Result<()> {
    if !opts.sectorsize.is_power_of_two() || !(4096..=65536).contains(&opts.sectorsize) {
        return Err(Error::Invalid(format!("sectorsize {}", opts.sectorsize)));
    }
    if !opts.nodesize.is_power_of_two() || opts.nodesize < opts.sectorsize || opts.nodesize > 65536
    {
        return Err(Error::Invalid(format!(
            "nodesize {} (power of two, sectorsize..=64K)",
            opts.nodesize
        )));
    }
    Ok(())
}

/// Creates a new filesystem on one device; returns the open write handle after the
/// first commit.
pub fn make_filesystem(dev: Arc<dyn Device>, opts: &MkfsOptions) -> Result<Trans> {
    let size = dev.size() & !(opts.sectorsize as u64 - 1);
    check_sizes(opts)?;
    for p in [opts.data_profile, opts.metadata_profile] {
        if p != 0 && p != BLOCK_GROUP_DUP {
            return Err(Error::Unsupported(format!(
                "profile {} on one device",
                profile_name(p)
            )));
        }
    }
    if size < min_size(opts) {
        return Err(Error::Invalid(format!(
            "device of {size} bytes is too small: at least {} needed",
            min_size(opts)
        )));
    }
    let fsid = opts.fsid.unwrap_or_else(crate::io::dev::random_uuid);
    let dev_uuid = crate::io::dev::random_uuid();
    let chunk_tree_uuid = crate::io::dev::random_uuid();
    let copies = |p: u64| if p == BLOCK_GROUP_DUP { 2u64 } else { 1 };
    let sys_len = mib(8);
    let meta_len = if opts.shrink {
        mib(32)
    } else {
        (size / 10).clamp(mib(32), mib(256)) & !(mib(1) - 1)
    };
    let used_meta = mib(1) + copies(opts.metadata_profile) * (sys_len + meta_len);
    let data_len = if opts.shrink {
        mib(8)
    } else {
        ((size - used_meta) / 10).clamp(mib(8).min(size - used_meta), mib(1024)) & !(mib(1) - 1)
    };
    if data_len == 0 || used_meta + copies(opts.data_profile) * data_len > size {
        return Err(Error::Invalid(format!(
            "device of {size} bytes is too small"
        )));
    }
    let sys_ty = BLOCK_GROUP_SYSTEM | opts.metadata_profile;
    let meta_ty = BLOCK_GROUP_METADATA | opts.metadata_profile;
    let data_ty = BLOCK_GROUP_DATA | opts.data_profile;
    let mut phys = mib(1);
    let mut logical = mib(1);
    let mut entries = Vec::new();
    for (ty, len) in [(sys_ty, sys_len), (meta_ty, meta_len), (data_ty, data_len)] {
        let n = copies(ty & BLOCK_GROUP_PROFILE_MASK);
        let stripes = (0..n)
            .map(|i| MapStripe {
                devid: 1,
                physical: phys + i * len,
            })
            .collect();
        entries.push(MapEntry {
            start: logical,
            length: len,
            ty,
            stripe_len: STRIPE_LEN,
            sub_stripes: 1,
            stripes,
        });
        phys += n * len;
        logical += len;
    }
    let sb = new_superblock(opts, fsid, size, 1, dev_uuid)?;
    let mut chunk_map = ChunkMap::default();
    for e in &entries {
        chunk_map.insert(e.clone())?;
    }
    let mut devices: BTreeMap<u64, Arc<dyn Device>> = BTreeMap::new();
    devices.insert(1, dev);
    let info = FsInfo::new_raw(
        sb,
        devices,
        chunk_map,
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    );
    let mut t = Trans::bare(crate::fs::Filesystem::from_info(info), chunk_tree_uuid);
    t.alloc.profiles.insert(BLOCK_GROUP_DATA, opts.data_profile);
    t.alloc
        .profiles
        .insert(BLOCK_GROUP_METADATA, opts.metadata_profile);
    t.alloc
        .profiles
        .insert(BLOCK_GROUP_SYSTEM, opts.metadata_profile);
    if opts.shrink {
        t.alloc.chunk_size_max = Some(mib(64));
    }
    let mut ds = DevSpace {
        total_bytes: size,
        bytes_used: 0,
        used: BTreeMap::new(),
        alloc_end: None,
    };
    for e in &entries {
        for s in &e.stripes {
            ds.used.insert(s.physical, e.length);
            ds.bytes_used += e.length;
        }
    }
    t.alloc.dev_space.insert(1, ds);
    t.alloc.dev_uuids.insert(1, dev_uuid);
    for e in &entries {
        t.alloc.add_new_block_group(e)?;
        t.alloc
            .pending_chunks
            .push(crate::alloc::block_group::PendingChunk {
                logical: e.start,
                chunk: chunk_of(e, dev_uuid, opts.sectorsize),
            });
    }
    let time = opts.time.unwrap_or_else(now);
    t.bootstrap_trees(opts, time)?;
    t.commit()?;
    Ok(t)
}

/// The superblock of a new filesystem of `num_devices` devices and `total_bytes`,
/// whose dev_item is device 1's (`dev1_uuid`; the commit writes each device's own).
fn new_superblock(
    opts: &MkfsOptions,
    fsid: [u8; 16],
    total_bytes: u64,
    num_devices: u64,
    dev1_uuid: [u8; 16],
) -> Result<SuperBlock> {
    let dev1_bytes = total_bytes;
    let dev_uuid = dev1_uuid;
    let mut incompat = FEATURE_INCOMPAT_MIXED_BACKREF
        | FEATURE_INCOMPAT_BIG_METADATA
        | FEATURE_INCOMPAT_EXTENDED_IREF
        | FEATURE_INCOMPAT_SKINNY_METADATA;
    if opts.no_holes {
        incompat |= FEATURE_INCOMPAT_NO_HOLES;
    }
    let mut compat_ro = FEATURE_COMPAT_RO_FREE_SPACE_TREE | FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID;
    if opts.block_group_tree {
        compat_ro |= FEATURE_COMPAT_RO_BLOCK_GROUP_TREE;
    }
    let mut label_raw = [0u8; 256];
    let lb = opts.label.as_bytes();
    if lb.len() >= 256 {
        return Err(Error::Invalid("label longer than 255 bytes".into()));
    }
    label_raw[..lb.len()].copy_from_slice(lb);
    let dev_item = DevItem {
        devid: 1,
        total_bytes: dev1_bytes,
        bytes_used: 0,
        io_align: opts.sectorsize,
        io_width: opts.sectorsize,
        sector_size: opts.sectorsize,
        ty: 0,
        generation: 0,
        start_offset: 0,
        dev_group: 0,
        seek_speed: 0,
        bandwidth: 0,
        uuid: dev_uuid,
        fsid,
    };
    let sb = SuperBlock {
        csum: [0; 32],
        fsid,
        bytenr: SUPER_INFO_OFFSET,
        flags: 0,
        magic: BTRFS_MAGIC,
        generation: 0,
        root: 0,
        chunk_root: 0,
        log_root: 0,
        log_root_transid: 0,
        total_bytes,
        bytes_used: 0,
        root_dir_objectid: ROOT_TREE_DIR_OBJECTID,
        num_devices,
        sectorsize: opts.sectorsize,
        nodesize: opts.nodesize,
        leafsize: opts.nodesize,
        stripesize: opts.sectorsize,
        sys_chunk_array_size: 0,
        chunk_root_generation: 0,
        compat_flags: 0,
        compat_ro_flags: compat_ro,
        incompat_flags: incompat,
        csum_type_raw: opts.csum.as_u16(),
        root_level: 0,
        chunk_root_level: 0,
        log_root_level: 0,
        dev_item,
        label_raw,
        cache_generation: 0,
        uuid_tree_generation: 0,
        metadata_uuid: [0; 16],
        nr_global_roots: 0,
        sys_chunk_array: vec![0; SYSTEM_CHUNK_ARRAY_SIZE],
        backup_roots: Vec::new(),
        raw: Vec::new(),
    };
    Ok(sb)
}

fn chunk_of(e: &MapEntry, dev_uuid: [u8; 16], sectorsize: u32) -> ubtrfs_format::items::Chunk {
    ubtrfs_format::items::Chunk {
        length: e.length,
        owner: EXTENT_TREE_OBJECTID,
        stripe_len: STRIPE_LEN,
        ty: e.ty,
        io_align: STRIPE_LEN as u32,
        io_width: STRIPE_LEN as u32,
        sector_size: sectorsize,
        num_stripes: e.stripes.len() as u16,
        sub_stripes: 1,
        stripes: e
            .stripes
            .iter()
            .map(|s| ubtrfs_format::items::Stripe {
                devid: s.devid,
                offset: s.physical,
                dev_uuid,
            })
            .collect(),
    }
}

fn tree_root_item(bytenr: u64, transid: u64, nodesize: u32, root_dirid: u64) -> RootItem {
    RootItem {
        inode: InodeItem {
            generation: 1,
            size: 3,
            nlink: 1,
            nbytes: nodesize as u64,
            mode: 0o40755,
            ..Default::default()
        },
        generation: transid,
        generation_v2: transid,
        root_dirid,
        bytenr,
        bytes_used: nodesize as u64,
        refs: 1,
        level: 0,
        ..Default::default()
    }
}

fn dir_inode(transid: u64, nodesize: u32, mode: u32, uid: u32, gid: u32, t: Timespec) -> InodeItem {
    InodeItem {
        generation: transid,
        transid,
        size: 0,
        nbytes: nodesize as u64,
        nlink: 1,
        uid,
        gid,
        mode,
        atime: t,
        ctime: t,
        mtime: t,
        otime: t,
        ..Default::default()
    }
}

impl Trans {
    fn bootstrap_trees(&mut self, opts: &MkfsOptions, time: Timespec) -> Result<()> {
        let transid = self.transid;
        let ns = opts.nodesize;
        // Root and chunk trees first: everything else is registered in them.
        let (rb, rd) = self.new_block(ROOT_TREE_OBJECTID, 0, None, 0)?;
        self.put_dirty(rb, rd)?;
        self.set_root(ROOT_TREE_OBJECTID, rb, 0)?;
        let (cb, cd) = self.new_block(CHUNK_TREE_OBJECTID, 0, None, 0)?;
        self.put_dirty(cb, cd)?;
        self.set_root(CHUNK_TREE_OBJECTID, cb, 0)?;
        // A DEV_ITEM per device (bytes_used follows at the commit).
        let devs: Vec<(u64, u64)> = self
            .alloc
            .dev_space
            .iter()
            .map(|(d, ds)| (*d, ds.total_bytes))
            .collect();
        for (devid, total_bytes) in devs {
            let mut dev_item = self.fs.info.sb.dev_item.clone();
            dev_item.devid = devid;
            dev_item.total_bytes = total_bytes;
            if let Some(u) = self.alloc.dev_uuids.get(&devid) {
                dev_item.uuid = *u;
            }
            self.insert_item(
                CHUNK_TREE_OBJECTID,
                &Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, devid),
                &dev_item.to_bytes(),
            )?;
        }
        let mut trees = vec![
            EXTENT_TREE_OBJECTID,
            DEV_TREE_OBJECTID,
            FS_TREE_OBJECTID,
            CSUM_TREE_OBJECTID,
            UUID_TREE_OBJECTID,
            FREE_SPACE_TREE_OBJECTID,
        ];
        if opts.block_group_tree {
            trees.push(BLOCK_GROUP_TREE_OBJECTID);
        }
        trees.push(DATA_RELOC_TREE_OBJECTID);
        for id in trees {
            let (b, d) = self.new_block(id, 0, None, 0)?;
            self.put_dirty(b, d)?;
            let dirid = if id == FS_TREE_OBJECTID || id == DATA_RELOC_TREE_OBJECTID {
                FIRST_FREE_OBJECTID
            } else {
                0
            };
            let mut item = tree_root_item(b, transid, ns, dirid);
            if dirid != 0 {
                // The subvolume-like trees' items are marked initialised, as
                // mkfs.btrfs marks them.
                item.check_and_init();
            }
            if id == FS_TREE_OBJECTID {
                item.uuid = crate::io::dev::random_uuid();
                item.ctime = time;
                item.otime = time;
            }
            self.create_root_item(id, Key::new(id, ROOT_ITEM_KEY, 0), item)?;
            // The item above already accounts for this block.
            *self.root_bytes_delta.entry(id).or_insert(0) -= ns as i64;
        }
        // Root directories of the top-level subvolume and the data reloc tree.
        for (id, mode, uid, gid) in [
            (
                FS_TREE_OBJECTID,
                opts.root_mode,
                opts.root_uid,
                opts.root_gid,
            ),
            (DATA_RELOC_TREE_OBJECTID, 0o40755, 0, 0),
        ] {
            let ino = dir_inode(transid, ns, mode, uid, gid, time);
            self.insert_root_dir(id, &ino)?;
        }
        // The root tree's directory with the "default" subvolume entry.
        let rdi = dir_inode(transid, ns, 0o40755, 0, 0, time);
        self.insert_item(
            ROOT_TREE_OBJECTID,
            &Key::new(ROOT_TREE_DIR_OBJECTID, INODE_ITEM_KEY, 0),
            &rdi.to_bytes(),
        )?;
        self.insert_item(
            ROOT_TREE_OBJECTID,
            &Key::new(
                ROOT_TREE_DIR_OBJECTID,
                INODE_REF_KEY,
                ROOT_TREE_DIR_OBJECTID,
            ),
            &ubtrfs_format::items::inode_ref_bytes(0, b".."),
        )?;
        let loc = Key::new(FS_TREE_OBJECTID, ROOT_ITEM_KEY, u64::MAX);
        self.insert_item(
            ROOT_TREE_OBJECTID,
            &Key::new(
                ROOT_TREE_DIR_OBJECTID,
                DIR_ITEM_KEY,
                ubtrfs_format::csum::name_hash(b"default"),
            ),
            &ubtrfs_format::items::dir_item_bytes(&loc, transid, &[], b"default", FT_DIR),
        )?;
        self.insert_item(
            ROOT_TREE_OBJECTID,
            &Key::new(FS_TREE_OBJECTID, INODE_REF_KEY, ROOT_TREE_DIR_OBJECTID),
            &ubtrfs_format::items::inode_ref_bytes(0, b"default"),
        )?;
        // As mkfs.btrfs 6.14: the top level's uuid in the UUID tree, and the
        // device's statistics, all zero.
        let fs_uuid = self.root_item(FS_TREE_OBJECTID)?.uuid;
        self.uuid_tree_add(&fs_uuid, UUID_KEY_SUBVOL, FS_TREE_OBJECTID)?;
        // write, read, flush, corruption and generation errors: five u64s.
        const DEV_STAT_VALUES: usize = 5;
        let devid = self.fs.info.sb.dev_item.devid;
        self.insert_item(
            DEV_TREE_OBJECTID,
            &Key::new(DEV_STATS_OBJECTID, PERSISTENT_ITEM_KEY, devid),
            &[0u8; DEV_STAT_VALUES * 8],
        )?;
        let _ = NewInode::default();
        Ok(())
    }
}
