//! Transactions: the write handle and the commit protocol.
//!
//! A [`Trans`] owns the filesystem while it is modified. Changed tree blocks are CoWed
//! into `FsInfo::dirty`; reference changes are delayed refs; freed space is pinned.
//! `commit()`:
//! 1. loop until nothing changes: insert items of new chunks, run delayed refs, write
//!    block group items, rewrite the free-space tree of dirty block groups, write the
//!    ROOT_ITEMs of trees whose root moved (each step may CoW more blocks);
//! 2. write every dirty block (checksummed, tree-checked first) to every copy;
//! 3. flush all devices;
//! 4. write the superblock (generation, roots, bytes_used, rotated backup roots) to every
//!    copy that fits on each device; flush again.
//!
//! Until step 4 completes the previous superblock describes an intact filesystem: no
//! block it references was overwritten, because freed space stays pinned until then.

pub(crate) mod block_group;
pub(crate) mod commit_io;
pub(crate) mod cow;
pub(crate) mod extent_tree;
pub(crate) mod free_space_tree;
pub(crate) mod quota;
pub(crate) mod space_info;
pub(crate) mod trim;

use crate::alloc::block_group::{super_offset, DevSpace};
use crate::alloc::delayed_ref::DelayedRefs;
use crate::alloc::free_space_cache::SearchMode;
use crate::alloc::{AllocStats, Allocator};
use crate::error::{Error, Result};
use crate::io::disk_io::{FsInfo, OpenOptions};
use crate::tree::ctree::TreeIter;
use crate::tree::tree_checker::Expect;
use crate::tree::RootPtr;
pub use commit_io::CommitIo;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{DevExtent, DevItem, RootItem};
use ubtrfs_format::key::Key;
use ubtrfs_format::superblock::RootBackup;

/// Default of `Trans::reloc_batch_bytes`: a group's address range is relocated in
/// pieces of at most 256 MiB, one commit each (relocation/relocate.rs). A metadata
/// piece rewrites at least its own blocks (256 MiB of copies) plus their ancestors
/// before its commit.
pub(crate) const RELOC_BATCH_BYTES_DEFAULT: u64 = 256 << 20;

/// Most changed DIR_INDEX keys kept per directory; past it the directory's changes
/// are only known to exist (the tree log then compares the directory's leaves).
pub(crate) const DIR_INDEX_CHANGES_MAX: usize = 1 << 16;

/// Size of the superblock's label field (BTRFS_LABEL_SIZE), its NUL included.
const SUPER_LABEL_BYTES: usize = 256;

/// The DIR_INDEX keys inserted, changed or deleted in the running transaction, per
/// (tree, directory): what a directory's fsync must log, without comparing the
/// directory with the last commit's (the kernel keeps the same per directory
/// inode in memory). Only `complete` once a whole transaction was watched: the
/// tracking starts at a tree log's first fsync, mid-transaction.
#[derive(Debug, Default)]
pub(crate) struct DirIndexChanges {
    /// Every change since the transaction started was seen.
    pub complete: bool,
    /// Changed indexes; None when more than [`DIR_INDEX_CHANGES_MAX`].
    pub dirs: HashMap<(u64, u64), Option<std::collections::BTreeSet<u64>>>,
}

/// A write transaction (the kernel's transaction handle and running transaction in
/// one): changes made through it are visible to its own reads at once and become
/// durable at [`Trans::commit`]. Dropping it without committing writes nothing.
pub struct Trans {
    /// The filesystem being written; its read API sees the uncommitted state.
    pub fs: crate::fs::Filesystem,
    /// The free-space tree is being created or rebuilt from the extent tree
    /// (`FreeSpaceTreeAction`): [`Trans::finish_free_space_tree`] completes it.
    pub(crate) fst_rebuild_pending: bool,
    /// The UUID tree may be stale or missing as the filesystem was opened (its
    /// superblock stamp behind the generation, no tree, or `rescan_uuid_tree`):
    /// decided before anything commits, and until [`Trans::finish_uuid_tree`]
    /// has checked it no commit stamps `uuid_tree_generation`.
    pub(crate) uuid_tree_unchecked: bool,
    /// Generation being written.
    pub transid: u64,
    pub(crate) delayed: DelayedRefs,
    /// Free space, block groups, device space and pinned extents.
    pub(crate) alloc: Allocator,
    pub(crate) chunk_tree_uuid: [u8; 16],
    /// ROOT_ITEM keys and current items of trees touched (subvolumes included).
    pub(crate) root_keys: HashMap<u64, Key>,
    pub(crate) dirty_roots: BTreeSet<u64>,
    pub(crate) root_bytes_delta: HashMap<u64, i64>,
    /// Inode numbers handed out per tree in this transaction.
    pub(crate) next_ino: HashMap<u64, u64>,
    /// The lowest id a new tree may take while this handle lives: above every tree
    /// id handed out or dropped since it opened. The next id is otherwise the root
    /// tree's highest + 1, which goes back down once a deleted subvolume's last
    /// items go: its id would come again, and on a mount a descriptor still open in
    /// the deleted subvolume (FUSE node ids are built from tree ids) would then name
    /// a file of the new one. The kernel's free_objectid of the root tree likewise
    /// only grows during a mount.
    pub(crate) root_id_floor: u64,
    /// Per (tree, directory): the lowest index a new name may take in this
    /// transaction (inode/dir_item.rs `next_dir_index`); emptied at commit.
    pub(crate) dir_index_next: HashMap<(u64, u64), u64>,
    /// Set by a change no tree log can carry (a subvolume's entry renamed or
    /// removed: its name lives in another tree than its inode): every fsync of this
    /// transaction commits instead, as the kernel's btrfs_set_log_full_commit makes
    /// it. Cleared at commit.
    pub(crate) log_full_commit: Option<&'static str>,
    /// Keep inodes whose last link goes as orphans (a mount: they may still be open)
    /// instead of deleting them at once; see [`Trans::evict_orphan`].
    pub defer_eviction: bool,
    /// Inodes orphaned since the last [`Trans::take_orphans`]: (tree, inode).
    pub(crate) orphans: Vec<(u64, u64)>,
    /// File extent changes, once a tree log asked for them: (tree, inode) -> the
    /// lowest file offset whose EXTENT_DATA item was inserted, changed or deleted
    /// since the log last took it (the kernel's per-inode modified extents list; the
    /// log's fast path copies a file's extents from there on). Emptied at commit.
    pub(crate) file_extent_changes: Option<HashMap<(u64, u64), u64>>,
    /// DIR_INDEX changes, once a tree log asked for them (see [`DirIndexChanges`]).
    pub(crate) dir_index_changes: Option<DirIndexChanges>,
    _lock: Vec<std::fs::File>,
    /// Commits done so far.
    pub commits: u64,
    /// Compress file data on write (mkfs --compress, mount -o compress).
    pub compress: Option<(ubtrfs_compress::Compression, Option<i32>)>,
    /// compress-force: compress even inodes marked NOCOMPRESS, and never mark one
    /// NOCOMPRESS when data does not compress.
    pub compress_force: bool,
    /// Inode flags every new regular file gets (the kernel's `nodatasum` mount
    /// option: INODE_NODATASUM; `nodatacow`: INODE_NODATACOW | INODE_NODATASUM).
    pub new_file_flags: u64,
    /// Discard the space each commit freed once it is durable (the kernel's
    /// `discard` mount option; an image file gets holes punched).
    pub discard_on_commit: bool,
    /// Bytes discarded that way so far (every copy counted).
    pub discarded_bytes: u64,
    /// Largest file written inline, in bytes (the kernel's `max_inline` mount
    /// option; [`Trans::set_max_inline`]).
    pub(crate) max_inline_bytes: u64,
    /// While set, `write` shares the data from this file (same offsets) instead of
    /// writing it, where it can (mkfs --reflink).
    pub reflink_source: Option<Arc<std::fs::File>>,
    /// A reflink was refused by the host filesystem (data was copied instead).
    pub reflink_failed: bool,
    /// The last commit's root tree and extent tree roots: the state quota
    /// accounting compares with (its blocks stay intact until the next commit).
    pub(crate) commit_view: (RootPtr, RootPtr),
    /// Quota work waiting for the commit beyond the recorded extents.
    pub(crate) quota_pending: quota::QuotaPending,
    /// Bytes reserved against qgroup limits per subvolume in this transaction.
    pub(crate) quota_reserved: HashMap<u64, u64>,
    /// The quota tree as `qgroup_reserve` last read it (None when it has not, or
    /// when an item of the quota tree changed since): every WRITE on a mount asks.
    pub(crate) quota_limits: Option<Arc<crate::qgroup::QgroupTable>>,
    /// What the last commit's quota accounting did.
    pub qgroup_stats: quota::QgroupStats,
    /// The caller charges writes to qgroup limits itself, when it accepts them (a
    /// mount with delayed allocation: EDQUOT must come at WRITE, not at the flush).
    pub quota_reserved_by_caller: bool,
    /// Relocation moves a block group in pieces of at most this many bytes of its
    /// address range, one commit each, so the new copies held in memory until a
    /// commit stay bounded (relocation/relocate.rs).
    pub reloc_batch_bytes: u64,
    /// Simple quotas' charges, when they are on (transaction/quota.rs).
    pub(crate) squota: Option<quota::Squota>,
    /// The previous transaction's commit, started and not yet finished
    /// (transaction/commit_io.rs).
    pub(crate) inflight: Option<commit_io::Inflight>,
}

impl std::fmt::Debug for Trans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Trans(transid {})", self.transid)
    }
}

impl Trans {
    /// Opens image files or block devices for writing: refuses mounted devices, takes
    /// an exclusive lock, validates what a write depends on. A tree log is left as it
    /// is: `Trans::open_paths` (tree_log/) replays it.
    pub(crate) fn open_paths_no_replay(
        paths: &[impl AsRef<Path>],
        base: OpenOptions,
    ) -> Result<Trans> {
        let mut locks = Vec::new();
        for p in paths {
            let p = p.as_ref();
            let busy = |e: std::io::Error| match e.kind() {
                std::io::ErrorKind::ResourceBusy => Error::Busy(e.to_string()),
                _ => Error::io(p.display().to_string(), e),
            };
            crate::io::dev::refuse_if_mounted(p).map_err(busy)?;
            locks.push(crate::io::dev::lock_exclusive(p).map_err(busy)?);
        }
        let opts = OpenOptions {
            writable: true,
            ..base
        };
        let fs = FsInfo::open_paths(paths, opts)?;
        let mut t = Trans::from_fs_no_replay(fs)?;
        t._lock = locks;
        Ok(t)
    }

    /// Starts writing an opened filesystem (devices must be writable). A tree log is
    /// left as it is: the caller replays it (tree_log/) before anything is allocated,
    /// because the log's blocks are not in the extent tree and look free.
    pub(crate) fn from_fs_no_replay(fs: FsInfo) -> Result<Trans> {
        if fs.opts.salvage {
            return Err(Error::Unsupported(
                "writing a filesystem opened to salvage (its lost blocks read as empty)".into(),
            ));
        }
        let fs = crate::fs::Filesystem::from_info(fs);
        let sb = &fs.info.sb;
        if sb.flags & (SUPER_FLAG_SEEDING | SUPER_FLAG_METADUMP | SUPER_FLAG_METADUMP_V2) != 0 {
            return Err(Error::Unsupported(
                "writing a seed device or metadump image".into(),
            ));
        }
        if sb.flags & (SUPER_FLAG_CHANGING_FSID | SUPER_FLAG_CHANGING_FSID_V2) != 0 {
            return Err(Error::Unsupported("an interrupted fsid change".into()));
        }
        use crate::io::disk_io::FreeSpaceTreeAction as Fst;
        let has_fst = sb.compat_ro_flags & FEATURE_COMPAT_RO_FREE_SPACE_TREE != 0;
        let valid = sb.compat_ro_flags & FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID != 0;
        // A tree without its VALID flag (a creation cut short) is rebuilt, as the
        // kernel's read-write mount rebuilds it.
        let rebuild_fst = (has_fst && !valid)
            || match fs.info.opts.free_space_tree {
                Fst::Keep => false,
                Fst::Create => !has_fst,
                Fst::Rebuild => has_fst,
                Fst::CreateOrRebuild => true,
            };
        if !has_fst && !rebuild_fst {
            return Err(Error::Unsupported(
                crate::alloc::free_space_tree::NO_FREE_SPACE_TREE.into(),
            ));
        }
        let bad_incompat = FEATURE_INCOMPAT_ZONED
            | FEATURE_INCOMPAT_EXTENT_TREE_V2
            | FEATURE_INCOMPAT_RAID_STRIPE_TREE
            | FEATURE_INCOMPAT_REMAP_TREE;
        if sb.incompat_flags & bad_incompat != 0 {
            return Err(Error::Unsupported(format!(
                "writing with features {}",
                incompat_names(sb.incompat_flags & bad_incompat).join(", ")
            )));
        }
        if sb.compat_ro_flags & FEATURE_COMPAT_RO_VERITY != 0 {
            return Err(Error::Unsupported(
                "writing a filesystem with verity files".into(),
            ));
        }
        let unknown_ro = sb.compat_ro_flags & !FEATURE_COMPAT_RO_SUPP;
        if unknown_ro != 0 {
            return Err(Error::Unsupported(format!(
                "compat_ro features {unknown_ro:#x}"
            )));
        }
        if fs.info.devices.len() as u64 != sb.num_devices {
            return Err(Error::Invalid(format!(
                "the filesystem has {} devices, {} given: writing needs all of them",
                sb.num_devices,
                fs.info.devices.len()
            )));
        }
        let chunk_root = fs.info.read_tree_block(sb.chunk_root, &Expect::default())?;
        let mut chunk_tree_uuid = [0u8; 16];
        chunk_tree_uuid.copy_from_slice(&chunk_root.data[0x40..0x50]);
        drop(chunk_root);
        let mut t = Trans::bare(fs, chunk_tree_uuid);
        // Work a kernel left half done: a paused balance (BALANCE item) is
        // continued by `balance resume` or the kernel; relocation trees are
        // dropped by Trans::open_paths/from_fs after a log replay
        // (relocation/recover.rs).
        t.start_quota_records()?;
        t.load_devices()?;
        t.alloc.load_block_groups(&t.fs.info)?;
        if rebuild_fst {
            // Now, before a log replay or anything else allocates: the extent tree
            // is still exactly the committed one.
            t.alloc.load_all_from_extent_tree(&t.fs.info)?;
            t.fst_rebuild_pending = true;
        }
        let sb = &t.fs.info.sb;
        t.uuid_tree_unchecked = sb.uuid_tree_generation != sb.generation
            || t.fs.info.opts.rescan_uuid_tree
            || t.fs.info.tree_ptr(UUID_TREE_OBJECTID).is_none();
        Ok(t)
    }

    /// A write handle over a filesystem being created (mkfs fills in the rest).
    pub(crate) fn bare(fs: crate::fs::Filesystem, chunk_tree_uuid: [u8; 16]) -> Trans {
        let transid = fs.info.sb.generation + 1;
        let commit_view = Self::view_of(&fs.info);
        Trans {
            fs,
            transid,
            delayed: DelayedRefs::default(),
            alloc: Allocator::new(),
            chunk_tree_uuid,
            root_keys: HashMap::new(),
            dirty_roots: BTreeSet::new(),
            root_bytes_delta: HashMap::new(),
            next_ino: HashMap::new(),
            root_id_floor: 0,
            dir_index_next: HashMap::new(),
            log_full_commit: None,
            defer_eviction: false,
            orphans: Vec::new(),
            file_extent_changes: None,
            dir_index_changes: None,
            _lock: Vec::new(),
            commits: 0,
            compress: None,
            compress_force: false,
            new_file_flags: 0,
            discard_on_commit: false,
            discarded_bytes: 0,
            max_inline_bytes: MAX_INLINE_DATA_SIZE_DEFAULT,
            reflink_source: None,
            reflink_failed: false,
            commit_view,
            quota_pending: quota::QuotaPending::default(),
            quota_reserved: HashMap::new(),
            quota_limits: None,
            qgroup_stats: quota::QgroupStats::default(),
            quota_reserved_by_caller: false,
            reloc_batch_bytes: RELOC_BATCH_BYTES_DEFAULT,
            squota: None,
            inflight: None,
            fst_rebuild_pending: false,
            uuid_tree_unchecked: false,
        }
    }

    /// The root tree and extent tree roots of a state.
    fn view_of(info: &FsInfo) -> (RootPtr, RootPtr) {
        let rt = info.root_tree_ptr();
        let et = info.tree_ptr(EXTENT_TREE_OBJECTID).unwrap_or(RootPtr {
            id: EXTENT_TREE_OBJECTID,
            bytenr: 0,
            level: 0,
            generation: 0,
        });
        (rt, et)
    }

    /// The read side, once the transaction is done with (a read-only open that
    /// replayed a log into memory keeps reading through it).
    pub(crate) fn into_fs(self) -> crate::fs::Filesystem {
        self.fs
    }

    /// Bytes of tree blocks waiting for the commit.
    pub fn dirty_bytes(&self) -> usize {
        self.fs.info.dirty.lock().map(|d| d.len()).unwrap_or(0) * self.fs.info.nodesize as usize
    }

    /// Keeps the lock files (held for the handle's life).
    pub fn hold_locks(&mut self, locks: Vec<std::fs::File>) {
        self._lock.extend(locks);
    }

    fn load_devices(&mut self) -> Result<()> {
        let chunk = self.root_ptr(CHUNK_TREE_OBJECTID)?;
        let mut devs = Vec::new();
        for item in TreeIter::new(
            &self.fs.info,
            &chunk,
            Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, 0),
            Key::new(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, u64::MAX),
        )? {
            let item = item?;
            let d = DevItem::parse(item.data())
                .map_err(|e| Error::corrupt(format!("device item {}: {e}", item.key())))?;
            devs.push(d);
        }
        let dev_root = self.root_ptr(DEV_TREE_OBJECTID)?;
        for d in devs {
            let mut ds = DevSpace {
                total_bytes: d.total_bytes,
                bytes_used: d.bytes_used,
                used: BTreeMap::new(),
                alloc_end: None,
            };
            for item in TreeIter::new(
                &self.fs.info,
                &dev_root,
                Key::new(d.devid, DEV_EXTENT_KEY, 0),
                Key::new(d.devid, DEV_EXTENT_KEY, u64::MAX),
            )? {
                let item = item?;
                let de = DevExtent::parse(item.data())
                    .map_err(|e| Error::corrupt(format!("device extent {}: {e}", item.key())))?;
                ds.used.insert(item.key().offset, de.length);
            }
            self.alloc.dev_uuids.insert(d.devid, d.uuid);
            self.alloc.dev_space.insert(d.devid, ds);
        }
        Ok(())
    }

    /// Current root pointer of any tree (reads see uncommitted changes).
    pub fn root_ptr(&self, id: u64) -> Result<RootPtr> {
        if let Some(p) = self.fs.info.tree_ptr(id) {
            return Ok(p);
        }
        self.fs
            .info
            .subvol_ptr(id)?
            .ok_or_else(|| Error::NotFound(format!("tree {id}")))
    }

    pub(crate) fn root_node(&self, id: u64) -> Result<(u64, u8)> {
        let p = self.root_ptr(id)?;
        Ok((p.bytenr, p.level))
    }

    /// The ROOT_ITEM of a tree (cached in `fs.tree_roots` once touched).
    pub(crate) fn root_item(&mut self, id: u64) -> Result<RootItem> {
        if let Some(r) = self.fs.info.tree_roots.get(&id) {
            if self.root_keys.contains_key(&id) {
                return Ok(r.clone());
            }
        }
        let root = self.fs.info.root_tree_ptr();
        match crate::tree::ctree::lookup_prev(
            &self.fs.info,
            &root,
            Key::new(id, ROOT_ITEM_KEY, u64::MAX),
        )? {
            Some((k, data)) if k.objectid == id && k.ty == ROOT_ITEM_KEY => {
                let mut r = RootItem::parse(&data)
                    .map_err(|e| Error::corrupt(format!("root tree item {k}: {e}")))?;
                // A subvolume's item as the kernel holds it once loaded
                // (btrfs_init_fs_root; not the data reloc tree's), which is what
                // it writes back.
                if id == FS_TREE_OBJECTID
                    || (FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&id)
                {
                    r.check_and_init();
                }
                self.root_keys.insert(id, k);
                self.fs.info.tree_roots.insert(id, r.clone());
                Ok(r)
            }
            _ => Err(Error::NotFound(format!("tree {id}"))),
        }
    }

    /// Records a tree's new root block. The ROOT_ITEM is written at commit; reads see
    /// the new root at once through `fs.tree_roots`.
    pub(crate) fn set_root(&mut self, id: u64, bytenr: u64, level: u8) -> Result<()> {
        match id {
            ROOT_TREE_OBJECTID => {
                self.fs.forget_root(id);
                self.fs.info.sb.root = bytenr;
                self.fs.info.sb.root_level = level;
            }
            CHUNK_TREE_OBJECTID => {
                self.fs.info.sb.chunk_root = bytenr;
                self.fs.info.sb.chunk_root_level = level;
                self.fs.info.sb.chunk_root_generation = self.transid;
            }
            _ => {
                self.fs.forget_root(id);
                let mut r = self.root_item(id)?;
                r.bytenr = bytenr;
                r.level = level;
                r.generation = self.transid;
                r.generation_v2 = self.transid;
                self.fs.info.tree_roots.insert(id, r);
                self.dirty_roots.insert(id);
            }
        }
        Ok(())
    }

    /// Mutates a tree's ROOT_ITEM (written at commit).
    pub(crate) fn modify_root_item(
        &mut self,
        id: u64,
        f: impl FnOnce(&mut RootItem),
    ) -> Result<()> {
        let mut r = self.root_item(id)?;
        f(&mut r);
        self.fs.info.tree_roots.insert(id, r);
        self.dirty_roots.insert(id);
        Ok(())
    }

    /// Registers a tree created in this transaction (its ROOT_ITEM is inserted now).
    pub(crate) fn create_root_item(&mut self, id: u64, key: Key, item: RootItem) -> Result<()> {
        self.insert_item(ROOT_TREE_OBJECTID, &key, &item.to_bytes())?;
        self.root_keys.insert(id, key);
        self.fs.info.tree_roots.insert(id, item);
        Ok(())
    }

    /// Creates an empty tree `id` and its ROOT_ITEM (the kernel's btrfs_create_tree):
    /// an empty leaf owned by `id`, written at commit. The caller picks an id that is
    /// free; items are then added with [`Trans::insert_item`].
    pub fn create_tree(&mut self, id: u64) -> Result<()> {
        let (b, d) = self.new_block(id, 0, None, 0)?;
        self.put_dirty(b, d)?;
        let item = RootItem {
            generation: self.transid,
            generation_v2: self.transid,
            bytenr: b,
            refs: 1,
            ..Default::default()
        };
        self.create_root_item(id, Key::new(id, ROOT_ITEM_KEY, 0), item)
    }

    fn update_root_items(&mut self) -> Result<()> {
        let deltas: Vec<(u64, i64)> = self.root_bytes_delta.drain().collect();
        for (id, d) in deltas {
            if id == ROOT_TREE_OBJECTID || id == CHUNK_TREE_OBJECTID || d == 0 {
                continue;
            }
            if self.root_item(id).is_err() {
                continue; // a tree deleted in this transaction
            }
            self.modify_root_item(id, |r| {
                r.bytes_used = (r.bytes_used as i64 + d).max(0) as u64
            })?;
        }
        while let Some(id) = self.dirty_roots.pop_first() {
            let r = self.root_item(id)?;
            let key = match self.root_keys.get(&id) {
                Some(k) => *k,
                None => {
                    self.root_item(id)?;
                    *self.root_keys.get(&id).ok_or_else(|| {
                        Error::corrupt(format!("root item of tree {id} not found"))
                    })?
                }
            };
            self.replace_item(ROOT_TREE_OBJECTID, &key, &r.to_bytes())?;
        }
        Ok(())
    }

    pub(crate) fn has_pending_work(&self) -> bool {
        !self.delayed.is_empty()
            || !self.alloc.pending_chunks.is_empty()
            || !self.dirty_roots.is_empty()
            || self.root_bytes_delta.values().any(|&d| d != 0)
            || self.alloc.bgs.values().any(|b| b.dirty)
            || !self.alloc.remove_at_commit.is_empty()
    }

    /// Starts keeping, at every item change, what a tree log needs to log a file
    /// or a directory without comparing it with the last commit
    /// (`file_extent_changes`, `dir_index_changes`). The directory record is whole
    /// from the start when nothing has changed yet in this transaction, else from
    /// the next one.
    pub fn track_log_changes(&mut self) {
        self.file_extent_changes.get_or_insert_with(HashMap::new);
        if self.dir_index_changes.is_none() {
            let clean = self.dirty_bytes() == 0 && !self.has_pending_work();
            self.dir_index_changes = Some(DirIndexChanges {
                complete: clean,
                dirs: HashMap::new(),
            });
        }
    }

    /// Writes the transaction durably (see the module comment) and starts the next:
    /// [`Trans::commit_start`], [`CommitIo::run`], [`Trans::commit_finish`] in one.
    pub fn commit(&mut self) -> Result<()> {
        if let Some(io) = self.commit_start()? {
            io.run()?;
        }
        self.commit_finish()
    }

    /// Ends the transaction: finishes a commit still in flight first, runs the
    /// commit's tree updates until nothing changes (step 1 of the module comment),
    /// and hands the write-out (steps 2 to 4) back as a [`CommitIo`]; None when
    /// nothing changed. The next transaction starts at once: its changes CoW the
    /// committing blocks like committed ones and its reads see them. The commit is
    /// durable once [`CommitIo::run`] returned Ok; [`Trans::commit_finish`] then
    /// frees what it unpinned (the next `commit_start`, or anything else that
    /// commits, calls it first, writing the commit itself if nobody has).
    pub fn commit_start(&mut self) -> Result<Option<Arc<CommitIo>>> {
        self.commit_finish()?;
        if !self.has_pending_work()
            && self.dirty_bytes() == 0
            && self.alloc.pinned.is_empty()
            && self.alloc.log_blocks.is_empty()
        {
            // Nothing changed: like the kernel, an empty transaction writes nothing.
            // (So no directory changed unseen: its record is whole from here on.)
            if let Some(c) = self.dir_index_changes.as_mut() {
                c.complete = true;
            }
            return Ok(None);
        }
        // The superblock's generation must be the root tree root's: make sure the
        // root tree is part of every commit.
        let root_key = Key::new(ROOT_TREE_DIR_OBJECTID, INODE_ITEM_KEY, 0);
        self.search_mut(ROOT_TREE_OBJECTID, &root_key, 0, true)?;
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > 1000 {
                return Err(Error::corrupt("internal: commit does not converge"));
            }
            self.create_pending_chunks()?;
            self.run_delayed_refs()?;
            self.remove_emptied_block_groups()?;
            if rounds == 1 || self.squota_pending() {
                // The subvolume trees' references are all in the extent tree now;
                // nothing later in the commit changes a subvolume tree (simple
                // quotas would still take a late charge).
                self.qgroup_commit()?;
            }
            self.update_root_items()?;
            self.run_delayed_refs()?;
            self.write_dirty_block_groups()?;
            self.write_free_space_tree()?;
            if !self.has_pending_work() {
                break;
            }
        }
        let io = self.prepare_write_out()?;
        // What this transaction freed stays pinned until its commit is durable; what
        // the next one frees is pinned until the next commit.
        self.inflight = Some(commit_io::Inflight {
            io: io.clone(),
            pinned: std::mem::take(&mut self.alloc.pinned),
            log_blocks: std::mem::take(&mut self.alloc.log_blocks),
            removed: std::mem::take(&mut self.alloc.removed),
        });
        self.fs.info.sb.generation = self.transid;
        self.commit_view = Self::view_of(&self.fs.info);
        self.quota_reserved.clear();
        self.dir_index_next.clear();
        self.log_full_commit = None;
        if let Some(c) = self.file_extent_changes.as_mut() {
            c.clear();
        }
        if let Some(c) = self.dir_index_changes.as_mut() {
            // Kept from the first change of the next transaction on: complete.
            c.dirs.clear();
            c.complete = true;
        }
        self.transid += 1;
        Ok(Some(io))
    }

    /// Finishes the commit in flight, if any: writes it if nobody has (or waits for
    /// the thread writing it), then, durable, returns the space it unpinned, drops
    /// the block groups it removed and moves its blocks from `FsInfo::committing`
    /// to the block cache. A failed write-out is returned again on every call, and
    /// nothing is unpinned: the mount aborts.
    pub fn commit_finish(&mut self) -> Result<()> {
        let Some(inf) = self.inflight.take() else {
            return Ok(());
        };
        if let Err(e) = inf.io.run() {
            self.inflight = Some(inf);
            return Err(e);
        }
        for b in inf.io.take_written() {
            self.fs.info.cache_insert(b);
        }
        if let Ok(mut c) = self.fs.info.committing.lock() {
            c.clear();
        }
        if self.discard_on_commit {
            // Free in the durable commit and not yet given out again: safe to discard.
            let nodesize = self.fs.info.nodesize as u64;
            let freed = inf
                .pinned
                .iter()
                .copied()
                .chain(inf.log_blocks.iter().map(|&b| (b, nodesize)));
            for (b, l) in freed {
                if !crate::alloc::block_group::RemovedGroup::any_contains(&inf.removed, b) {
                    self.discarded_bytes += self.discard_freed(b, l);
                }
            }
            // A block group the commit removed (balance) is free device space now,
            // and discarded whole, as the kernel does with its deleted groups; its
            // mapping goes just below.
            for r in &inf.removed {
                self.discarded_bytes += self.discard_freed(r.start, r.length);
            }
        }
        self.alloc.unpin(
            inf.pinned,
            inf.log_blocks,
            &inf.removed,
            self.fs.info.nodesize as u64,
        )?;
        self.forget_removed_block_groups(inf.removed);
        self.fs.clear_data_caches();
        self.commits += 1;
        Ok(())
    }

    /// True when the running transaction created a chunk (its items go in at the
    /// commit): until it commits, fsyncs commit instead of logging.
    pub fn chunks_allocated(&self) -> bool {
        !self.alloc.pending_chunks.is_empty()
    }

    /// True while a commit's write-out has not been finished
    /// ([`Trans::commit_finish`]).
    pub fn commit_in_flight(&self) -> bool {
        self.inflight.is_some()
    }

    /// Sets the filesystem's label (written with the next commit), as
    /// FS_IOC_SETFSLABEL and `btrfs filesystem label` do: at most 255 bytes, no NUL
    /// (the kernel's limit: the 256-byte field keeps a terminating NUL).
    pub fn set_label(&mut self, label: &[u8]) -> Result<()> {
        if label.len() >= SUPER_LABEL_BYTES || label.contains(&0) {
            return Err(Error::Invalid(format!(
                "label {:?}: at most {} bytes, without NUL",
                String::from_utf8_lossy(label),
                SUPER_LABEL_BYTES - 1
            )));
        }
        // The superblock alone changes: CoW the root tree's root so the next commit
        // is not skipped as empty (every commit writes the root tree, whose
        // generation the superblock's must equal). First, so a failure changes
        // nothing.
        let root_key = Key::new(ROOT_TREE_DIR_OBJECTID, INODE_ITEM_KEY, 0);
        self.search_mut(ROOT_TREE_OBJECTID, &root_key, 0, true)?;
        let raw = &mut self.fs.info.sb.label_raw;
        raw.fill(0);
        raw[..label.len()].copy_from_slice(label);
        Ok(())
    }

    /// Writes bytes at a logical address to every copy.
    pub(crate) fn write_logical(&self, logical: u64, data: &[u8]) -> Result<()> {
        commit_io::write_places(data, &self.places(logical, data.len())?, logical)
    }

    /// Brings the in-memory superblock to this generation (roots, backup roots) and
    /// returns the bytes of every copy that fits on each device, with their places.
    fn prepare_supers(&mut self) -> Result<Vec<(Vec<u8>, commit_io::Place)>> {
        let transid = self.transid;
        let backup = self.make_backup()?;
        let sb = &mut self.fs.info.sb;
        sb.generation = transid;
        sb.log_root = 0;
        sb.log_root_level = 0;
        if sb.uuid_tree_generation != 0 && !self.uuid_tree_unchecked {
            sb.uuid_tree_generation = transid;
        }
        // Rotate: the slot after the newest backup.
        let newest = sb
            .backup_roots
            .iter()
            .enumerate()
            .max_by_key(|(_, b)| b.tree_root_gen)
            .map(|(i, _)| i);
        let slot = newest.map_or(0, |i| (i + 1) % 4);
        if sb.backup_roots.len() < 4 {
            sb.backup_roots.resize(4, RootBackup::default());
        }
        sb.backup_roots[slot] = backup;
        let devs: Vec<(u64, Arc<dyn crate::io::dev::Device>)> = self
            .fs
            .info
            .devices
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let mut out = Vec::new();
        for (devid, dev) in devs {
            let mut sb = self.fs.info.sb.clone();
            if let Some(ds) = self.alloc.dev_space.get(&devid) {
                sb.dev_item.bytes_used = ds.bytes_used;
                sb.dev_item.devid = devid;
                sb.dev_item.total_bytes = ds.total_bytes;
                if let Some(u) = self.alloc.dev_uuids.get(&devid) {
                    sb.dev_item.uuid = *u;
                }
            }
            for i in 0..SUPER_MIRROR_MAX {
                let off = super_offset(i);
                if off + SUPER_INFO_SIZE as u64 > dev.size() {
                    break;
                }
                sb.bytenr = off;
                let bytes = sb.to_bytes();
                let len = bytes.len();
                out.push((
                    bytes,
                    commit_io::Place {
                        dev: dev.clone(),
                        physical: off,
                        from: 0,
                        len,
                        parity: None,
                    },
                ));
            }
        }
        Ok(out)
    }

    fn make_backup(&mut self) -> Result<RootBackup> {
        let sb = &self.fs.info.sb;
        let mut b = RootBackup {
            tree_root: sb.root,
            tree_root_gen: self.transid,
            chunk_root: sb.chunk_root,
            chunk_root_gen: sb.chunk_root_generation,
            total_bytes: sb.total_bytes,
            bytes_used: sb.bytes_used,
            num_devices: sb.num_devices,
            tree_root_level: sb.root_level,
            chunk_root_level: sb.chunk_root_level,
            ..Default::default()
        };
        for (id, slot) in [
            (EXTENT_TREE_OBJECTID, 0),
            (FS_TREE_OBJECTID, 1),
            (DEV_TREE_OBJECTID, 2),
            (CSUM_TREE_OBJECTID, 3),
        ] {
            if let Some(r) = self.fs.info.tree_roots.get(&id) {
                let (bytenr, gen, level) = (r.bytenr, r.generation, r.level);
                match slot {
                    0 => {
                        (b.extent_root, b.extent_root_gen, b.extent_root_level) =
                            (bytenr, gen, level)
                    }
                    1 => (b.fs_root, b.fs_root_gen, b.fs_root_level) = (bytenr, gen, level),
                    2 => (b.dev_root, b.dev_root_gen, b.dev_root_level) = (bytenr, gen, level),
                    _ => (b.csum_root, b.csum_root_gen, b.csum_root_level) = (bytenr, gen, level),
                }
            }
        }
        Ok(b)
    }

    /// Tree ids of the subvolume-like roots touched (for callers updating times).
    pub fn allocation_mode(&self) -> SearchMode {
        self.alloc.search_mode
    }

    /// Chooses how free space is searched (the allocator benchmark compares them).
    pub fn set_search_mode(&mut self, m: SearchMode) {
        self.alloc.search_mode = m;
    }

    /// Allocator counters (searches, entries visited, latencies).
    pub fn alloc_stats(&self) -> &AllocStats {
        &self.alloc.stats
    }

    /// Records the wall time of every free-space search in [`AllocStats`].
    pub fn record_alloc_latency(&mut self, on: bool) {
        self.alloc.stats.record_latency = on;
    }

    /// Caps the size of new chunks (mkfs --shrink).
    pub fn set_chunk_size_max(&mut self, max_bytes: Option<u64>) {
        self.alloc.chunk_size_max = max_bytes;
    }
}
