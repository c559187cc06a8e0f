//! Opening a filesystem: superblocks, device matching, the chunk-tree bootstrap, tree
//! block reads (checksum, tree checker, mirror retry) and the tree-block cache.

use crate::error::{Error, Result};
use crate::io::dev::{Device, FileDevice};
use crate::io::salvage::{LostBlock, Salvage};
use crate::io::volumes::ChunkMap;
use crate::tree::tree_checker::{check_block, check_header, CheckCtx, Expect};
use crate::tree::{BlockSource, TreeBlock};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use ubtrfs_format::bytes::uuid_string;
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::CsumType;
use ubtrfs_format::items::RootItem;
use ubtrfs_format::superblock::SuperBlock;

#[derive(Clone, Debug)]
/// How to open a filesystem.
pub struct OpenOptions {
    /// Verify data checksums on every read (`--no-csum` turns this off).
    pub verify_data_csum: bool,
    /// Upper bound of the tree-block cache.
    pub cache_bytes_max: usize,
    /// Open devices read-write (the write engine; see `transaction`).
    pub writable: bool,
    /// Go on past tree blocks no copy gives intact: they read as empty and are
    /// logged ([`FsInfo::lost_blocks`]). For rescuing readers only; never writable.
    /// A root tree root no copy gives intact is replaced by the newest intact backup
    /// root of the superblock.
    pub salvage: bool,
    /// Read the root tree from this block instead of the superblock's (an older
    /// generation, as `btrfs restore -t` and `btrfs-find-root` use). Read-only.
    pub tree_root: Option<u64>,
    /// With `salvage`: file data failing its checksums in every copy is given out
    /// as found (and logged), as `extract` wants; false: an error (EIO), as the
    /// kernel and the read-only mount give.
    pub data_as_found: bool,
    /// What a writing open does with the free-space tree (the kernel's
    /// `space_cache=v2` and `clear_cache` mount options).
    pub free_space_tree: FreeSpaceTreeAction,
    /// A writing open checks the UUID tree against the subvolumes even when the
    /// superblock says it is current (the kernel's `rescan_uuid_tree`).
    pub rescan_uuid_tree: bool,
}

/// What a writing open does with the free-space tree. Both non-default actions work
/// the free space of every block group out from the extent tree when the filesystem
/// is opened and write it as the free-space tree at the first commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FreeSpaceTreeAction {
    /// Use the free-space tree as it is; a filesystem without one (the v1 space
    /// cache) is refused.
    #[default]
    Keep,
    /// Create it when the filesystem has none, removing the v1 space cache (the
    /// kernel's `space_cache=v2` on such a filesystem, `btrfstune
    /// --convert-to-free-space-tree`); a filesystem that has one keeps it.
    Create,
    /// Rebuild it when the filesystem has one (the kernel's `clear_cache`); one
    /// without is refused as with `Keep` (the kernel would clear its v1 cache).
    Rebuild,
    /// Both: create it when missing, else rebuild it (`clear_cache,space_cache=v2`).
    CreateOrRebuild,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            verify_data_csum: true,
            cache_bytes_max: 256 << 20,
            writable: false,
            salvage: false,
            tree_root: None,
            data_as_found: true,
            free_space_tree: FreeSpaceTreeAction::Keep,
            rescan_uuid_tree: false,
        }
    }
}

/// Bounded tree-block cache with FIFO eviction: cheap, and good enough for the
/// mostly-sequential walks the CLI does. (A FUSE mount will want sharding.)
#[derive(Debug, Default)]
struct BlockCache {
    map: HashMap<u64, Arc<TreeBlock>>,
    order: VecDeque<u64>,
    bytes: usize,
}

#[derive(Debug)]
/// An opened filesystem's devices and metadata (the kernel's btrfs_fs_info): the
/// superblock, the chunk map, and validated, cached tree-block reads.
pub struct FsInfo {
    /// The newest valid superblock (kept current by the write engine).
    pub sb: SuperBlock,
    /// The devices by devid.
    pub devices: BTreeMap<u64, Arc<dyn Device>>,
    /// Logical to physical mapping of every chunk.
    pub chunk_map: ChunkMap,
    /// Checksum algorithm of the filesystem.
    pub csum_type: CsumType,
    /// Tree block size in bytes.
    pub nodesize: u32,
    /// Data sector size in bytes.
    pub sectorsize: u32,
    /// The options it was opened with.
    pub opts: OpenOptions,
    cache: Mutex<BlockCache>,
    warnings: Mutex<Vec<String>>,
    /// ROOT_ITEMs of the well-known trees, read once at open (kept current by the
    /// write engine).
    pub tree_roots: BTreeMap<u64, RootItem>,
    /// Tree blocks written by the running transaction and not yet committed. Reads see
    /// them first, so every read path works on the uncommitted state too.
    pub(crate) dirty: Mutex<HashMap<u64, Arc<TreeBlock>>>,
    /// Tree blocks of a commit being written (transaction/commit_io.rs) while the
    /// next transaction runs: committed in the next transaction's eyes (CoWed before
    /// any change, never written in place), but maybe not on disk yet, so reads
    /// take them from here until the commit is durable.
    pub(crate) committing: Mutex<HashMap<u64, Arc<TreeBlock>>>,
    /// With [`OpenOptions::salvage`]: the lost blocks and their stand-ins.
    salvage: Option<Salvage>,
    /// The superblock's generation as found on disk, before an older root tree
    /// was chosen to be read: no intact block is newer than it.
    generation_on_disk: u64,
}

/// Reads and validates every superblock copy on a device; returns the newest valid one
/// and notes about the bad ones.
pub fn read_best_super(dev: &dyn Device) -> Result<(SuperBlock, Vec<String>)> {
    let mut best: Option<SuperBlock> = None;
    let mut notes = Vec::new();
    let mut first_err: Option<String> = None;
    for i in 0..SUPER_MIRROR_MAX {
        let off = super_mirror_offset(i);
        if off + SUPER_INFO_SIZE as u64 > dev.size() {
            if i == 0 {
                return Err(Error::corrupt(format!(
                    "{}: too small ({} bytes) to hold a btrfs superblock",
                    dev.name(),
                    dev.size()
                )));
            }
            break;
        }
        let mut buf = vec![0u8; SUPER_INFO_SIZE];
        if let Err(e) = dev.read_at(off, &mut buf) {
            notes.push(format!("superblock copy {i} at {off}: read failed: {e}"));
            continue;
        }
        let sb = match SuperBlock::parse(&buf) {
            Ok(s) => s,
            Err(e) => {
                notes.push(format!("superblock copy {i} at {off}: {e}"));
                continue;
            }
        };
        if sb.magic != BTRFS_MAGIC {
            if i == 0 {
                first_err = Some("no btrfs magic in the primary superblock".into());
            }
            // A missing mirror (never written) is normal; only report a primary miss.
            continue;
        }
        if let Err((exp, found)) = sb.verify_csum() {
            let msg = format!(
                "superblock copy {i} at {off}: checksum mismatch (stored {}, computed {})",
                hex(&exp),
                hex(&found)
            );
            notes.push(msg.clone());
            first_err.get_or_insert(msg);
            continue;
        }
        if let Err(e) = sb.check(off) {
            let msg = format!("superblock copy {i} at {off}: {e}");
            notes.push(msg.clone());
            first_err.get_or_insert(msg);
            continue;
        }
        if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
            if let Some(b) = &best {
                notes.push(format!(
                    "superblock copy {i} has generation {} newer than {}; using it",
                    sb.generation, b.generation
                ));
            }
            best = Some(sb);
        } else if let Some(b) = &best {
            if sb.generation < b.generation {
                notes.push(format!(
                    "superblock copy {i} at {off} is stale (generation {} < {})",
                    sb.generation, b.generation
                ));
            }
        }
    }
    match best {
        Some(b) => Ok((b, notes)),
        None => Err(Error::corrupt(format!(
            "{}: no valid superblock ({})",
            dev.name(),
            first_err.unwrap_or_else(|| "not a btrfs filesystem".into())
        ))),
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl FsInfo {
    /// Opens image files or block devices (all devices of a multi-device filesystem).
    pub fn open_paths(paths: &[impl AsRef<Path>], opts: OpenOptions) -> Result<FsInfo> {
        let mut devs: Vec<Arc<dyn Device>> = Vec::new();
        for p in paths {
            let p = p.as_ref();
            let d = FileDevice::open(p, opts.writable)
                .map_err(|e| Error::io(p.display().to_string(), e))?;
            devs.push(Arc::new(d));
        }
        FsInfo::open(devs, opts)
    }

    /// Opens a filesystem on devices already opened: picks the newest superblock, matches
    /// devices by fsid and devid, reads the chunk tree and the well-known roots.
    pub fn open(devs: Vec<Arc<dyn Device>>, opts: OpenOptions) -> Result<FsInfo> {
        if devs.is_empty() {
            return Err(Error::Invalid("no device given".into()));
        }
        let mut warnings = Vec::new();
        let mut supers = Vec::new();
        for d in &devs {
            let (sb, notes) = read_best_super(d.as_ref())?;
            warnings.extend(notes.into_iter().map(|n| format!("{}: {n}", d.name())));
            supers.push(sb);
        }
        // The newest superblock across devices describes the filesystem.
        let best = supers
            .iter()
            .enumerate()
            .max_by_key(|(_, s)| s.generation)
            .map(|(i, _)| i)
            .unwrap_or(0);
        let sb = supers[best].clone();
        let mut devices: BTreeMap<u64, Arc<dyn Device>> = BTreeMap::new();
        for (d, s) in devs.iter().zip(&supers) {
            if s.fsid != sb.fsid {
                return Err(Error::Invalid(format!(
                    "{} belongs to filesystem {}, not {}",
                    d.name(),
                    uuid_string(&s.fsid),
                    uuid_string(&sb.fsid)
                )));
            }
            let devid = s.dev_item.devid;
            if devices.insert(devid, d.clone()).is_some() {
                return Err(Error::Invalid(format!(
                    "devid {devid} given twice ({})",
                    d.name()
                )));
            }
        }
        let unknown = sb.incompat_flags & !FEATURE_INCOMPAT_SUPP;
        if unknown != 0 {
            let names = incompat_names(unknown);
            return Err(Error::Unsupported(format!(
                "incompat features {:#x} ({}) are not supported",
                unknown,
                if names.is_empty() {
                    "unknown".to_string()
                } else {
                    names.join(", ")
                }
            )));
        }
        let csum_type = sb
            .csum_type()
            .ok_or_else(|| Error::Unsupported(format!("csum type {}", sb.csum_type_raw)))?;
        let salvage = opts.salvage.then(Salvage::default);
        let mut fs = FsInfo {
            generation_on_disk: sb.generation,
            nodesize: sb.nodesize,
            sectorsize: sb.sectorsize,
            csum_type,
            sb,
            devices,
            chunk_map: ChunkMap::default(),
            opts,
            cache: Mutex::new(BlockCache::default()),
            warnings: Mutex::new(warnings),
            salvage,
            tree_roots: BTreeMap::new(),
            dirty: Mutex::new(HashMap::new()),
            committing: Mutex::new(HashMap::new()),
        };
        fs.read_chunk_tree()?;
        fs.choose_root_tree()?;
        fs.load_tree_roots()?;
        Ok(fs)
    }

    /// The root tree to read: the superblock's, or the one asked for, or (salvaging)
    /// the newest intact backup root when the superblock's is lost. Points `sb` at
    /// it: everything read afterwards is that commit's state.
    fn choose_root_tree(&mut self) -> Result<()> {
        if let Some(b) = self.opts.tree_root {
            if self.opts.writable {
                return Err(Error::Unsupported(
                    "writing from another tree root than the superblock's".into(),
                ));
            }
            let blk = self.read_tree_block_verified(b, &Expect::default())?;
            if blk.owner() != ROOT_TREE_OBJECTID {
                return Err(Error::corrupt(format!(
                    "tree block {b}: owned by tree {}, not the root tree",
                    blk.owner() as i64
                )));
            }
            self.warn(format!(
                "reading the root tree at {b} (generation {}), not the superblock's {} \
                 (generation {})",
                blk.generation(),
                self.sb.root,
                self.sb.generation
            ));
            self.use_root_tree(b, blk.level(), blk.generation());
            return Ok(());
        }
        if !self.opts.salvage {
            return Ok(());
        }
        let current = Expect {
            level: Some(self.sb.root_level),
            generation: Some(self.sb.generation),
            first_key: None,
        };
        let err = match self.read_tree_block_verified(self.sb.root, &current) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let mut backups = self.sb.backup_roots.clone();
        backups.sort_by_key(|b| std::cmp::Reverse(b.tree_root_gen));
        for b in backups {
            if b.tree_root == 0 || b.tree_root_gen == 0 || b.tree_root_gen > self.sb.generation {
                continue;
            }
            let e = Expect {
                level: Some(b.tree_root_level),
                generation: Some(b.tree_root_gen),
                first_key: None,
            };
            if self.read_tree_block_verified(b.tree_root, &e).is_ok() {
                // The lost root counts as a loss: what came after the backup is gone.
                if let Some(s) = &self.salvage {
                    let fsid = self.sb.metadata_fsid();
                    s.lose(
                        self.sb.root,
                        &current,
                        format!("{err} (read from backup root {} instead)", b.tree_root),
                        self.nodesize as usize,
                        &fsid,
                    );
                }
                self.warn(format!(
                    "the root tree root {} (generation {}) is lost ({err}); reading the \
                     backup root {} of generation {}: later changes are not seen",
                    self.sb.root, self.sb.generation, b.tree_root, b.tree_root_gen
                ));
                self.use_root_tree(b.tree_root, b.tree_root_level, b.tree_root_gen);
                return Ok(());
            }
        }
        // No intact backup either: the walk finds the root tree empty, and says so.
        Ok(())
    }

    fn use_root_tree(&mut self, bytenr: u64, level: u8, generation: u64) {
        self.sb.root = bytenr;
        self.sb.root_level = level;
        self.sb.generation = generation;
        // A tree log continues the superblock's own commit, not an older one: it
        // is not replayed over another root tree.
        self.sb.log_root = 0;
        self.sb.log_root_level = 0;
    }

    /// A filesystem being created (mkfs): nothing is read from the devices.
    pub(crate) fn new_raw(
        sb: SuperBlock,
        devices: BTreeMap<u64, Arc<dyn Device>>,
        chunk_map: ChunkMap,
        opts: OpenOptions,
    ) -> FsInfo {
        let csum_type = sb.csum_type().unwrap_or(CsumType::Crc32c);
        FsInfo {
            generation_on_disk: sb.generation,
            nodesize: sb.nodesize,
            sectorsize: sb.sectorsize,
            csum_type,
            sb,
            devices,
            chunk_map,
            opts,
            cache: Mutex::new(BlockCache::default()),
            warnings: Mutex::new(Vec::new()),
            salvage: None,
            tree_roots: BTreeMap::new(),
            dirty: Mutex::new(HashMap::new()),
            committing: Mutex::new(HashMap::new()),
        }
    }

    /// What the tree checker needs to know of this filesystem.
    pub(crate) fn check_ctx(&self) -> CheckCtx {
        CheckCtx {
            nodesize: self.nodesize,
            sectorsize: self.sectorsize,
            csum_size: self.csum_type.size(),
            super_generation: self.sb.generation.max(self.generation_on_disk),
            fsid: self.sb.metadata_fsid(),
        }
    }

    /// Records a warning (a bad copy worked around); the CLI prints them.
    pub fn warn(&self, msg: String) {
        if let Ok(mut w) = self.warnings.lock() {
            if !w.contains(&msg) && w.len() < 1000 {
                w.push(msg);
            }
        }
    }

    /// Warnings gathered so far (bad superblock copies, bad mirrors, ...), emptied.
    pub fn take_warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default()
    }

    /// Reads `buf.len()` bytes at logical address `logical` from copy `mirror`.
    pub fn read_logical(&self, logical: u64, buf: &mut [u8], mirror: usize) -> Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let l = logical + done as u64;
            let e = self.chunk_map.lookup(l)?;
            let p = e.map(l, mirror)?;
            let n = (p.len as usize).min(buf.len() - done);
            let dev = self.devices.get(&p.devid).ok_or_else(|| {
                Error::io(
                    format!("logical {l}"),
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("device devid {} is missing", p.devid),
                    ),
                )
            })?;
            dev.read_at(p.offset, &mut buf[done..done + n])
                .map_err(|e| {
                    Error::io(
                        format!(
                            "reading {n} bytes at logical {l} (devid {} physical {})",
                            p.devid, p.offset
                        ),
                        e,
                    )
                })?;
            done += n;
        }
        Ok(())
    }

    /// Number of copies of the chunk holding `logical`.
    pub fn num_mirrors(&self, logical: u64) -> Result<usize> {
        Ok(self.chunk_map.lookup(logical)?.num_mirrors())
    }

    /// Reads, verifies and caches a tree block. Tries every copy; a bad copy that is
    /// rescued by a good one is reported as a warning naming the copy. In a salvage
    /// open, a block no copy gives intact reads as a stand-in (see `io/salvage.rs`).
    pub fn read_tree_block(&self, bytenr: u64, expect: &Expect) -> Result<Arc<TreeBlock>> {
        let Some(s) = &self.salvage else {
            return self.read_tree_block_verified(bytenr, expect);
        };
        if let Some(b) = s.stand_in(bytenr) {
            return Ok(b);
        }
        match self.read_tree_block_verified(bytenr, expect) {
            Ok(b) => Ok(b),
            Err(e) => {
                let msg = match e {
                    Error::Corrupt(m) => m,
                    e => format!("tree block {bytenr}: {e}"),
                };
                let fsid = self.sb.metadata_fsid();
                if let Some((data, found)) = self.stale_copy(bytenr, expect) {
                    // An intact older version (a lost write): read as found, as
                    // btrfs-progs does when it ignores a transid failure. Still a
                    // loss: what changed in it since generation `found` is gone.
                    // A newer one is what reading an older commit meets when a
                    // later commit reused the block: its keys still start where
                    // the parent says, so it holds that part of the tree as the
                    // later commit left it (what `btrfs restore -t` reads too).
                    let what = if expect.generation.is_some_and(|g| found < g) {
                        "what changed after it is lost"
                    } else {
                        "a later commit's version of this part of the tree"
                    };
                    let msg = format!(
                        "{msg}; read the copy of generation {found} found there instead ({what})"
                    );
                    return Ok(s.keep_stale(TreeBlock { bytenr, data }, expect, msg));
                }
                Ok(s.lose(bytenr, expect, msg, self.nodesize as usize, &fsid))
            }
        }
    }

    /// A copy of `bytenr` that fails only the generation its parent expects:
    /// checksum, header, structure, level and first key intact. An older one (a
    /// lost write left the previous contents; the newest such) is preferred; a
    /// newer one (a later commit reused the address; the oldest such) is taken
    /// only when the parent names the first key it must start with. None when
    /// there is neither.
    fn stale_copy(&self, bytenr: u64, expect: &Expect) -> Option<(Vec<u8>, u64)> {
        let want = expect.generation?;
        let any_gen = Expect {
            generation: None,
            ..*expect
        };
        let mut older: Option<(Vec<u8>, u64)> = None;
        let mut newer: Option<(Vec<u8>, u64)> = None;
        for m in 0..self.num_mirrors(bytenr).ok()? {
            let Ok(data) = self.read_tree_block_copy(bytenr, m, &any_gen) else {
                continue;
            };
            let g = ubtrfs_format::tree::BlockView::new(&data).generation();
            if g < want && older.as_ref().is_none_or(|(_, bg)| g > *bg) {
                older = Some((data, g));
            } else if g > want
                && expect.first_key.is_some()
                && newer.as_ref().is_none_or(|(_, bg)| g < *bg)
            {
                newer = Some((data, g));
            }
        }
        older.or(newer)
    }

    /// Blocks a salvage open could not read (the first 100,000) and how many in all.
    pub fn lost_blocks(&self) -> (Vec<LostBlock>, u64) {
        self.salvage.as_ref().map(|s| s.lost()).unwrap_or_default()
    }

    /// File data a salvage open gave out although no copy passed its checksums.
    pub fn damaged_data(&self) -> (Vec<String>, u64) {
        self.salvage
            .as_ref()
            .map(|s| s.bad_data_log())
            .unwrap_or_default()
    }

    /// In a salvage open, logs data no copy gives intact and returns true: the
    /// reader goes on with the bytes found.
    pub(crate) fn salvage_bad_data(&self, msg: String) -> bool {
        match &self.salvage {
            Some(s) if self.opts.data_as_found => {
                s.bad_data(msg);
                true
            }
            Some(_) => {
                crate::io::salvage::touched();
                false
            }
            None => false,
        }
    }

    fn read_tree_block_verified(&self, bytenr: u64, expect: &Expect) -> Result<Arc<TreeBlock>> {
        if let Some(b) = self.dirty_get(bytenr) {
            return Ok(b);
        }
        if let Some(b) = self.committing_get(bytenr) {
            return Ok(b);
        }
        if let Some(b) = self.cache_get(bytenr) {
            // A cached block must satisfy this parent's expectations too: a hostile
            // node could point twice at one block under different keys.
            let first_ok = expect
                .first_key
                .is_none_or(|k| b.nritems() == 0 || b.view().key_at(0).ok() == Some(k));
            if expect.generation.is_none_or(|g| g == b.generation())
                && expect.level.is_none_or(|l| l == b.level())
                && first_ok
            {
                return Ok(b);
            }
        }
        if bytenr == 0 || !bytenr.is_multiple_of(self.sectorsize as u64) {
            return Err(Error::corrupt(format!(
                "tree block {bytenr}: address not sector aligned"
            )));
        }
        let mirrors = self.num_mirrors(bytenr)?;
        let mut errors = Vec::new();
        for m in 0..mirrors {
            match self.read_tree_block_copy(bytenr, m, expect) {
                Ok(data) => {
                    for e in &errors {
                        self.warn(format!("{e}; used copy {}", m + 1));
                    }
                    let b = Arc::new(TreeBlock { bytenr, data });
                    self.cache_put(b.clone());
                    return Ok(b);
                }
                Err(e) => {
                    let msg = match &e {
                        Error::Corrupt(m) => m.clone(),
                        e => e.to_string(),
                    };
                    errors.push(if mirrors > 1 {
                        format!("copy {} of {msg}", m + 1)
                    } else {
                        msg
                    })
                }
            }
        }
        Err(Error::corrupt(errors.join("; ")))
    }

    fn read_tree_block_copy(&self, bytenr: u64, mirror: usize, expect: &Expect) -> Result<Vec<u8>> {
        let mut data = vec![0u8; self.nodesize as usize];
        self.read_logical(bytenr, &mut data, mirror)?;
        let n = self.csum_type.size();
        let found = self.csum_type.compute(&data[CSUM_SIZE_MAX..]);
        if found[..n] != data[..n] {
            if data.iter().all(|&b| b == 0) {
                return Err(Error::corrupt(format!(
                    "tree block {bytenr}: all zeroes (never written or wiped)"
                )));
            }
            return Err(Error::corrupt(format!(
                "tree block {bytenr}: checksum mismatch (stored {}, computed {})",
                hex(&data[..n]),
                hex(&found[..n])
            )));
        }
        let ctx = self.check_ctx();
        check_header(&ctx, bytenr, &data, expect)?;
        check_block(&ctx, bytenr, &data, expect)?;
        Ok(data)
    }

    /// Tree blocks changed since the last commit.
    pub(crate) fn dirty_blocks(&self) -> usize {
        self.dirty.lock().map_or(0, |d| d.len())
    }

    pub(crate) fn dirty_get(&self, bytenr: u64) -> Option<Arc<TreeBlock>> {
        let d = self.dirty.lock().ok()?;
        if d.is_empty() {
            return None;
        }
        d.get(&bytenr).cloned()
    }

    fn committing_get(&self, bytenr: u64) -> Option<Arc<TreeBlock>> {
        let d = self.committing.lock().ok()?;
        if d.is_empty() {
            return None;
        }
        d.get(&bytenr).cloned()
    }

    /// Drops a cached copy (the block's address is being reused).
    pub(crate) fn cache_forget(&self, bytenr: u64) {
        if let Ok(mut c) = self.cache.lock() {
            if let Some(o) = c.map.remove(&bytenr) {
                c.bytes -= o.data.len();
            }
        }
    }

    /// Drops every cached block in `[start, start + len)` (a removed chunk).
    pub(crate) fn cache_forget_range(&self, start: u64, len: u64) {
        if let Ok(mut c) = self.cache.lock() {
            let gone: Vec<u64> = c
                .map
                .keys()
                .copied()
                .filter(|b| *b >= start && *b < start + len)
                .collect();
            for b in gone {
                if let Some(o) = c.map.remove(&b) {
                    c.bytes -= o.data.len();
                }
            }
        }
    }

    pub(crate) fn cache_insert(&self, b: Arc<TreeBlock>) {
        self.cache_forget(b.bytenr);
        self.cache_put(b);
    }

    fn cache_get(&self, bytenr: u64) -> Option<Arc<TreeBlock>> {
        self.cache.lock().ok()?.map.get(&bytenr).cloned()
    }

    fn cache_put(&self, b: Arc<TreeBlock>) {
        let Ok(mut c) = self.cache.lock() else { return };
        let sz = b.data.len();
        while c.bytes + sz > self.opts.cache_bytes_max {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(o) = c.map.remove(&old) {
                c.bytes -= o.data.len();
            }
        }
        if c.map.insert(b.bytenr, b.clone()).is_none() {
            c.order.push_back(b.bytenr);
            c.bytes += sz;
        }
    }
}

impl BlockSource for FsInfo {
    fn read_tree_block(&self, bytenr: u64, expect: &Expect) -> Result<Arc<TreeBlock>> {
        FsInfo::read_tree_block(self, bytenr, expect)
    }
}
