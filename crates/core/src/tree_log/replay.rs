//! Log replay (the kernel's btrfs_recover_log_trees and replay_one_buffer).
//!
//! The order is the kernel's, because later steps depend on earlier ones:
//! 1. pin: every block of the log root tree and of the log trees is taken out of the
//!    free space (they are in no extent tree: the log was written in a transaction
//!    that never committed) until the replay's commit is durable, and so is every data
//!    extent a logged file extent points at that the extent tree does not know yet;
//!    all items are checked here, so an unsupported one refuses the replay before
//!    anything changes;
//! 2. inodes: INODE_ITEMs are copied in (directories first drop the names the log's
//!    DIR_LOG_INDEX ranges say are gone, files drop extents past their logged size);
//! 3. DIR_INDEX names of logged directories whose inodes exist are added;
//! 4. everything else: xattrs, INODE_REF/INODE_EXTREF (adding the names they imply and
//!    removing the names they no longer have), file extents (with their data
//!    references and checksums);
//! 5. link counts of every inode touched are recounted from its back references; an
//!    inode left with none gets an ORPHAN item (deleted by the orphan cleanup that
//!    follows every replay, `Trans::orphan_cleanup`, as the kernel's mount does).
//!
//! The kernel keeps the set of inodes to recount as TREE_LOG_FIXUP items inside the
//! subvolume during the replay; here it is a set in memory (the items never outlive
//! the replay's transaction there either).

use crate::error::{Error, Result};
use crate::inode::inode::now;
use crate::transaction::Trans;
use crate::tree::ctree::{lookup_exact, TreeIter};
use crate::tree::tree_checker::Expect;
use crate::tree::RootPtr;
use std::collections::{BTreeMap, BTreeSet};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::{extref_hash, name_hash};
use ubtrfs_format::items::{
    dir_item_bytes, parse_dir_items, parse_inode_extrefs, parse_inode_refs, FileExtentBody,
    FileExtentItem, InodeItem, InodeRef, RootItem,
};
use ubtrfs_format::key::Key;

/// Counts of one replay.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReplayStats {
    /// Log trees replayed (one per subvolume that had fsyncs).
    pub log_trees: u64,
    /// Items read from the log trees.
    pub items: u64,
    /// Log tree blocks (log root tree included) freed by the replay's commit.
    pub log_blocks: u64,
}

/// One subvolume's log tree, read into memory (log trees hold what fsyncs since the
/// last commit changed: small next to the subvolume).
struct LogTree {
    subvol: u64,
    items: BTreeMap<Key, Vec<u8>>,
}

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

fn is_dir(mode: u32) -> bool {
    mode & S_IFMT == S_IFDIR
}

fn is_reg(mode: u32) -> bool {
    mode & S_IFMT == S_IFREG
}

fn bad(what: &str, key: &Key, e: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("tree log {what} {key}: {e}"))
}

impl LogTree {
    /// The names of an INODE_REF / INODE_EXTREF item of the log, if it has one.
    fn has_ref(&self, ino: u64, dir: u64, name: &[u8]) -> Result<bool> {
        let k = Key::new(ino, INODE_REF_KEY, dir);
        if let Some(d) = self.items.get(&k) {
            let refs = parse_inode_refs(dir, d).map_err(|e| bad("inode ref", &k, e))?;
            if refs.iter().any(|r| r.name == name) {
                return Ok(true);
            }
        }
        let k = Key::new(ino, INODE_EXTREF_KEY, extref_hash(dir, name));
        if let Some(d) = self.items.get(&k) {
            let refs = parse_inode_extrefs(d).map_err(|e| bad("inode extref", &k, e))?;
            if refs.iter().any(|r| r.name == name && r.parent == dir) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the log has this directory entry name under this key.
    fn has_dir_entry(&self, key: &Key, name: &[u8]) -> Result<bool> {
        match self.items.get(key) {
            None => Ok(false),
            Some(d) => Ok(parse_dir_items(d)
                .map_err(|e| bad("dir item", key, e))?
                .iter()
                .any(|e| e.name == name)),
        }
    }

    /// The ranges [start, end] of `ty` (DIR_LOG_INDEX or DIR_LOG_ITEM) the log is
    /// authoritative for in directory `dir`.
    fn dir_ranges(&self, dir: u64, ty: u8) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for (k, d) in self
            .items
            .range(Key::new(dir, ty, 0)..=Key::new(dir, ty, u64::MAX))
        {
            let end = ubtrfs_format::bytes::le64(d, 0, "dir log item")
                .map_err(|e| bad("dir log item", k, e))?;
            out.push((k.offset, end));
        }
        Ok(out)
    }
}

/// The replay's state across stages.
struct Replay {
    /// Inodes whose link count is recounted at the end, per subvolume.
    fixup: BTreeSet<u64>,
    /// Inodes whose log INODE_ITEM has nlink 0 (an O_TMPFILE logged by an older
    /// kernel): their items are skipped, as the kernel skips them.
    ignore: BTreeSet<u64>,
}

impl Trans {
    /// Reads the log root tree and every log tree, pins their blocks, then replays
    /// each log tree into its subvolume (see the module comment). The caller commits;
    /// the commit writes a superblock without log_root and unpins the log's blocks.
    pub(crate) fn replay_log(&mut self) -> Result<ReplayStats> {
        let sb = &self.fs.info.sb;
        let (bytenr, level) = (sb.log_root, sb.log_root_level);
        let mut stats = ReplayStats::default();
        let top = self.fs.info.read_tree_block(
            bytenr,
            &Expect {
                level: Some(level),
                ..Default::default()
            },
        )?;
        let log_root = RootPtr {
            id: TREE_LOG_OBJECTID,
            bytenr,
            level,
            generation: top.generation(),
        };
        drop(top);
        let mut blocks = Vec::new();
        blocks.extend(crate::tree::ctree::tree_block_addrs(
            &self.fs.info,
            &log_root,
        )?);
        let mut logs = Vec::new();
        let mut roots = Vec::new();
        for item in TreeIter::new(&self.fs.info, &log_root, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            if k.objectid != TREE_LOG_OBJECTID || k.ty != ROOT_ITEM_KEY {
                return Err(Error::Unsupported(format!(
                    "tree log replay: item {k} in the log root tree"
                )));
            }
            let r = RootItem::parse(item.data()).map_err(|e| bad("root item", &k, e))?;
            roots.push((k.offset, r));
        }
        for (subvol, r) in roots {
            let ptr = RootPtr {
                id: TREE_LOG_OBJECTID,
                bytenr: r.bytenr,
                level: r.level,
                generation: r.generation,
            };
            blocks.extend(crate::tree::ctree::tree_block_addrs(&self.fs.info, &ptr)?);
            let mut items = BTreeMap::new();
            for item in TreeIter::new(&self.fs.info, &ptr, Key::MIN, Key::MAX)? {
                let item = item?;
                items.insert(item.key(), item.data().to_vec());
            }
            stats.items += items.len() as u64;
            logs.push(LogTree { subvol, items });
        }
        // Stage 1: check every item, then pin the log and the new data extents.
        for log in &logs {
            for (k, d) in &log.items {
                self.check_log_item(k, d)?;
            }
        }
        let nodesize = self.fs.info.nodesize as u64;
        blocks.sort_unstable();
        blocks.dedup();
        for &b in &blocks {
            self.alloc.pin_for_log_replay(&self.fs.info, b, nodesize)?;
        }
        stats.log_blocks = blocks.len() as u64;
        let mut excluded = BTreeSet::new();
        for log in &logs {
            for (k, d) in &log.items {
                if k.ty != EXTENT_DATA_KEY {
                    continue;
                }
                let fe = FileExtentItem::parse(d).map_err(|e| bad("file extent", k, e))?;
                if let FileExtentBody::Regular {
                    disk_bytenr,
                    disk_num_bytes,
                    ..
                } = fe.body
                {
                    if disk_bytenr != 0
                        && excluded.insert(disk_bytenr)
                        && !self.data_extent_exists(disk_bytenr, disk_num_bytes)?
                    {
                        self.alloc.exclude_logged_extent(
                            &self.fs.info,
                            disk_bytenr,
                            disk_num_bytes,
                        )?;
                    }
                }
            }
        }
        // A log for a subvolume deleted since is skipped (its blocks stay pinned).
        let mut live = Vec::new();
        for log in logs {
            if self.fs.info.subvol_ptr(log.subvol)?.is_some()
                || self.fs.info.tree_ptr(log.subvol).is_some()
            {
                live.push(log);
            }
        }
        for log in &live {
            let mut st = Replay {
                fixup: BTreeSet::new(),
                ignore: BTreeSet::new(),
            };
            self.replay_inodes(log, &mut st)?;
            self.replay_dir_indexes(log, &mut st)?;
            self.replay_all(log, &mut st)?;
            self.fixup_link_counts(log.subvol, &mut st)?;
            stats.log_trees += 1;
        }
        self.next_ino.clear();
        Ok(stats)
    }

    /// Refuses log items this replay does not handle, before anything changes.
    fn check_log_item(&self, k: &Key, d: &[u8]) -> Result<()> {
        match k.ty {
            INODE_ITEM_KEY => {
                InodeItem::parse(d).map_err(|e| bad("inode item", k, e))?;
            }
            INODE_REF_KEY => {
                parse_inode_refs(k.offset, d).map_err(|e| bad("inode ref", k, e))?;
            }
            INODE_EXTREF_KEY => {
                parse_inode_extrefs(d).map_err(|e| bad("inode extref", k, e))?;
            }
            XATTR_ITEM_KEY | DIR_LOG_ITEM_KEY | DIR_LOG_INDEX_KEY => {}
            DIR_ITEM_KEY | DIR_INDEX_KEY => {
                for e in parse_dir_items(d).map_err(|e| bad("dir item", k, e))? {
                    if e.location.ty != INODE_ITEM_KEY {
                        return Err(Error::Unsupported(format!(
                            "tree log replay: directory entry {k} {:?} names a subvolume",
                            String::from_utf8_lossy(&e.name)
                        )));
                    }
                }
            }
            EXTENT_DATA_KEY => {
                let fe = FileExtentItem::parse(d).map_err(|e| bad("file extent", k, e))?;
                if fe.encryption != 0 || fe.other_encoding != 0 {
                    return Err(Error::Unsupported(format!(
                        "tree log replay: encoded file extent {k}"
                    )));
                }
            }
            EXTENT_CSUM_KEY if k.objectid == EXTENT_CSUM_OBJECTID => {
                let csize = self.fs.info.csum_type.size();
                if !d.len().is_multiple_of(csize) {
                    return Err(bad("csum item", k, "size not a multiple of the csum size"));
                }
            }
            _ => {
                return Err(Error::Unsupported(format!(
                    "tree log replay: log item {k} (type {})",
                    k.ty
                )))
            }
        }
        Ok(())
    }

    fn data_extent_exists(&self, bytenr: u64, num_bytes: u64) -> Result<bool> {
        let ext = self.root_ptr(EXTENT_TREE_OBJECTID)?;
        Ok(lookup_exact(
            &self.fs.info,
            &ext,
            &Key::new(bytenr, EXTENT_ITEM_KEY, num_bytes),
        )?
        .is_some())
    }

    fn inode_exists(&self, root: u64, ino: u64) -> Result<bool> {
        let ptr = self.root_ptr(root)?;
        Ok(lookup_exact(&self.fs.info, &ptr, &Key::new(ino, INODE_ITEM_KEY, 0))?.is_some())
    }

    fn item(&self, root: u64, key: &Key) -> Result<Option<Vec<u8>>> {
        let ptr = self.root_ptr(root)?;
        Ok(lookup_exact(&self.fs.info, &ptr, key)?.map(|i| i.data().to_vec()))
    }

    /// Copies an item from the log: inserted, or replaced when different (the
    /// kernel's overwrite_item for items other than inodes).
    fn overwrite_item(&mut self, root: u64, key: &Key, data: &[u8]) -> Result<()> {
        match self.item(root, key)? {
            Some(old) if old == data => Ok(()),
            Some(_) => self.replace_item(root, key, data),
            None => self.insert_item(root, key, data),
        }
    }

    // ---- stage 2: inodes ----

    fn replay_inodes(&mut self, log: &LogTree, st: &mut Replay) -> Result<()> {
        let root = log.subvol;
        for (k, d) in &log.items {
            if k.ty != INODE_ITEM_KEY {
                continue;
            }
            let li = InodeItem::parse(d).map_err(|e| bad("inode item", k, e))?;
            let ino = k.objectid;
            if li.nlink == 0 {
                st.ignore.insert(ino);
                continue;
            }
            self.replay_xattr_deletes(log, ino)?;
            if is_dir(li.mode) {
                self.replay_dir_deletes(root, Some(log), ino, st)?;
            }
            self.overwrite_inode(root, ino, &li)?;
            if is_reg(li.mode) {
                // Extents past the logged size go now, before the logged extents come
                // in: prealloc extents past EOF may be among those.
                let i = self.read_inode(root, ino)?;
                let ss = self.fs.info.sectorsize as u64;
                let from = i.size.div_ceil(ss) * ss;
                let released = self.drop_extents(root, ino, from, u64::MAX)?;
                if released != 0 {
                    let mut i = self.read_inode(root, ino)?;
                    i.nbytes = i.nbytes.saturating_sub(released);
                    self.write_inode(root, ino, &i)?;
                }
            }
            st.fixup.insert(ino);
        }
        Ok(())
    }

    /// The kernel's overwrite_item for an INODE_ITEM: the subvolume keeps its nbytes
    /// (extents replayed later adjust it) and a directory keeps its size (names added
    /// and removed adjust it); a new inode starts from 0 for both. A logged
    /// generation of 0 means "the inode exists" only: an existing inode is left alone
    /// (but a regular file takes a nonzero logged size).
    fn overwrite_inode(&mut self, root: u64, ino: u64, li: &InodeItem) -> Result<()> {
        let key = Key::new(ino, INODE_ITEM_KEY, 0);
        match self.item(root, &key)? {
            Some(old) => {
                let ex = InodeItem::parse(&old).map_err(|e| bad("subvolume inode", &key, e))?;
                if li.generation == 0 {
                    if is_reg(li.mode) && is_reg(ex.mode) && li.size != 0 && ex.size != li.size {
                        let mut n = ex;
                        n.size = li.size;
                        self.write_inode(root, ino, &n)?;
                    }
                    return Ok(());
                }
                if old == li.to_bytes() {
                    return Ok(());
                }
                let mut n = li.clone();
                n.nbytes = ex.nbytes;
                if is_dir(li.mode) {
                    n.size = if is_dir(ex.mode) { ex.size } else { 0 };
                }
                self.write_inode(root, ino, &n)
            }
            None => {
                let mut n = li.clone();
                n.nbytes = 0;
                if is_dir(n.mode) {
                    n.size = 0;
                }
                if n.generation == 0 {
                    n.generation = self.transid;
                }
                self.insert_item(root, &key, &n.to_bytes())
            }
        }
    }

    /// Removes the inode's xattrs the log does not have.
    fn replay_xattr_deletes(&mut self, log: &LogTree, ino: u64) -> Result<()> {
        let root = log.subvol;
        let ptr = self.root_ptr(root)?;
        let mut gone = Vec::new();
        for item in TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(ino, XATTR_ITEM_KEY, 0),
            Key::new(ino, XATTR_ITEM_KEY, u64::MAX),
        )? {
            let item = item?;
            let k = item.key();
            for e in parse_dir_items(item.data()).map_err(|e| bad("xattr", &k, e))? {
                if !log.has_dir_entry(&k, &e.name)? {
                    gone.push(e.name);
                }
            }
        }
        for name in gone {
            self.remove_xattr_entry(root, ino, &name)?;
        }
        Ok(())
    }

    /// Unlinks the names of directory `dir` that lie in a range the log is
    /// authoritative for but are not in the log (all names when `log` is None: a
    /// directory whose last link went).
    fn replay_dir_deletes(
        &mut self,
        root: u64,
        log: Option<&LogTree>,
        dir: u64,
        st: &mut Replay,
    ) -> Result<()> {
        if !self.inode_exists(root, dir)? {
            return Ok(());
        }
        for (log_ty, ty) in [
            (DIR_LOG_ITEM_KEY, DIR_ITEM_KEY),
            (DIR_LOG_INDEX_KEY, DIR_INDEX_KEY),
        ] {
            let ranges = match log {
                Some(l) => l.dir_ranges(dir, log_ty)?,
                None => vec![(0, u64::MAX)],
            };
            for (start, end) in ranges {
                let ptr = self.root_ptr(root)?;
                let mut gone = Vec::new();
                for item in TreeIter::new(
                    &self.fs.info,
                    &ptr,
                    Key::new(dir, ty, start),
                    Key::new(dir, ty, end),
                )? {
                    let item = item?;
                    let k = item.key();
                    for e in parse_dir_items(item.data()).map_err(|e| bad("dir item", &k, e))? {
                        // A subvolume's entry is never in a log (an fsync that would
                        // log one commits instead, and renaming or removing one makes
                        // every fsync of its transaction commit): absent from the
                        // log, it is still there.
                        let keep = e.location.ty == ROOT_ITEM_KEY
                            || match log {
                                Some(l) => l.has_dir_entry(&k, &e.name)?,
                                None => false,
                            };
                        if !keep {
                            gone.push(e.name);
                        }
                    }
                }
                for name in gone {
                    if self.lookup(root, dir, &name)?.is_some() {
                        self.unlink_name(root, dir, &name, st)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes a name (both entries and the back reference) as the kernel's
    /// btrfs_unlink_inode does during replay: the inode's ctime becomes now, the
    /// directory's times stay (the kernel leaves them while recovering a log; a
    /// logged directory gets its logged times anyway). Queues the inode for the link
    /// count recount.
    fn unlink_name(&mut self, root: u64, dir: u64, name: &[u8], st: &mut Replay) -> Result<()> {
        let t = now();
        let ino = self.remove_link_at(root, dir, name, None)?;
        let mut i = self.read_inode(root, ino)?;
        i.nlink = i.nlink.saturating_sub(1);
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)?;
        st.fixup.insert(ino);
        Ok(())
    }

    /// Adds a name at a given index (the kernel's btrfs_add_link during replay: the
    /// directory's size grows, its times are the log's). Returns false when the name
    /// or the index is taken.
    #[allow(clippy::too_many_arguments)]
    fn link_at_index(
        &mut self,
        root: u64,
        dir: u64,
        name: &[u8],
        ino: u64,
        ty: u8,
        index: u64,
        backref: bool,
    ) -> Result<bool> {
        if self.lookup(root, dir, name)?.is_some()
            || self
                .item(root, &Key::new(dir, DIR_INDEX_KEY, index))?
                .is_some()
        {
            return Ok(false);
        }
        let loc = Key::new(ino, INODE_ITEM_KEY, 0);
        let entry = dir_item_bytes(&loc, self.transid, &[], name, ty);
        self.append_to_item(root, &Key::new(dir, DIR_ITEM_KEY, name_hash(name)), &entry)?;
        self.insert_item(root, &Key::new(dir, DIR_INDEX_KEY, index), &entry)?;
        if backref {
            self.add_inode_ref(root, ino, dir, index, name)?;
        }
        let mut d = self.read_inode(root, dir)?;
        d.size = d.size.saturating_add(name.len() as u64 * 2);
        d.transid = self.transid;
        d.sequence += 1;
        self.write_inode(root, dir, &d)?;
        Ok(true)
    }

    // ---- stage 3: directory indexes ----

    fn replay_dir_indexes(&mut self, log: &LogTree, st: &mut Replay) -> Result<()> {
        let root = log.subvol;
        for (k, d) in &log.items {
            if k.ty != DIR_INDEX_KEY || st.ignore.contains(&k.objectid) {
                continue;
            }
            let dir = k.objectid;
            if !self.inode_exists(root, dir)? {
                return Err(Error::corrupt(format!(
                    "tree log: directory {dir} of {k} is in neither the log nor subvolume {root}"
                )));
            }
            for e in parse_dir_items(d).map_err(|e| bad("dir index", k, e))? {
                let target = e.location.objectid;
                let exists = self.inode_exists(root, target)?;
                let existing = self.item(root, k)?;
                if let Some(ex) = existing {
                    let ents =
                        parse_dir_items(&ex).map_err(|e| bad("subvolume dir index", k, e))?;
                    if let Some(x) = ents.iter().find(|x| x.name == e.name) {
                        if x.location == e.location && x.ty == e.ty {
                            continue;
                        }
                        if !exists {
                            return Err(Error::Unsupported(format!(
                                "tree log replay: logged entry {k} conflicts with the subvolume's and its inode {target} does not exist"
                            )));
                        }
                        self.unlink_name(root, dir, &e.name, st)?;
                    }
                }
                // The name comes with the inode's back reference, replayed later.
                if log.has_ref(target, dir, &e.name)? {
                    continue;
                }
                // A directory fsync does not log the new inodes it names: names of
                // inodes that do not exist are not replayed.
                if !exists {
                    continue;
                }
                if self.link_at_index(root, dir, &e.name, target, e.ty, k.offset, true)?
                    && e.ty != FT_DIR
                {
                    st.fixup.insert(target);
                }
            }
        }
        Ok(())
    }

    // ---- stage 4: everything else ----

    fn replay_all(&mut self, log: &LogTree, st: &mut Replay) -> Result<()> {
        let root = log.subvol;
        for (k, d) in &log.items {
            if st.ignore.contains(&k.objectid) {
                continue;
            }
            match k.ty {
                XATTR_ITEM_KEY => self.overwrite_item(root, k, d)?,
                INODE_REF_KEY | INODE_EXTREF_KEY => self.replay_inode_ref(log, k, d, st)?,
                EXTENT_DATA_KEY => self.replay_one_extent(log, k, d)?,
                DIR_ITEM_KEY => self.replay_dir_item(root, k, d)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Old kernels logged DIR_ITEMs too: they only confirm names (a name is added
    /// through its DIR_INDEX); a conflicting one is refused.
    fn replay_dir_item(&mut self, root: u64, k: &Key, d: &[u8]) -> Result<()> {
        for e in parse_dir_items(d).map_err(|e| bad("dir item", k, e))? {
            if let Some((ino, ty, _)) = self.lookup(root, k.objectid, &e.name)? {
                if ino != e.location.objectid || ty != e.ty {
                    return Err(Error::Unsupported(format!(
                        "tree log replay: logged DIR_ITEM {k} {:?} conflicts with the subvolume's",
                        String::from_utf8_lossy(&e.name)
                    )));
                }
            }
        }
        Ok(())
    }

    /// The names of a subvolume INODE_REF / INODE_EXTREF item.
    fn subvol_refs(&self, root: u64, key: &Key) -> Result<Vec<InodeRef>> {
        Ok(match self.item(root, key)? {
            None => Vec::new(),
            Some(d) if key.ty == INODE_REF_KEY => {
                parse_inode_refs(key.offset, &d).map_err(|e| bad("subvolume inode ref", key, e))?
            }
            Some(d) => {
                parse_inode_extrefs(&d).map_err(|e| bad("subvolume inode extref", key, e))?
            }
        })
    }

    /// Whether `dir` has `name` at `index`, both entries naming `ino`.
    fn inode_in_dir(&self, root: u64, dir: u64, ino: u64, index: u64, name: &[u8]) -> Result<bool> {
        let Some(d) = self.item(root, &Key::new(dir, DIR_INDEX_KEY, index))? else {
            return Ok(false);
        };
        let k = Key::new(dir, DIR_INDEX_KEY, index);
        let by_index = parse_dir_items(&d)
            .map_err(|e| bad("subvolume dir index", &k, e))?
            .iter()
            .any(|e| e.name == name && e.location.objectid == ino);
        Ok(by_index
            && self
                .lookup(root, dir, name)?
                .is_some_and(|(i, _, _)| i == ino))
    }

    /// The kernel's add_inode_ref: every name of the logged back reference item
    /// becomes a directory entry (names in the way are unlinked first), names the
    /// subvolume's item has and the log's lacks are unlinked, then the item is copied.
    fn replay_inode_ref(
        &mut self,
        log: &LogTree,
        k: &Key,
        d: &[u8],
        st: &mut Replay,
    ) -> Result<()> {
        let root = log.subvol;
        let ino = k.objectid;
        if k.ty == INODE_REF_KEY && k.offset == ino {
            // The root directory's ".." reference.
            return Ok(());
        }
        let refs = if k.ty == INODE_REF_KEY {
            parse_inode_refs(k.offset, d).map_err(|e| bad("inode ref", k, e))?
        } else {
            parse_inode_extrefs(d).map_err(|e| bad("inode extref", k, e))?
        };
        if !self.inode_exists(root, ino)? {
            return Err(Error::corrupt(format!(
                "tree log: back reference {k} of an inode in neither the log nor the subvolume"
            )));
        }
        let ty = crate::inode::inode::file_type_of(self.read_inode(root, ino)?.mode);
        let mut search_done = false;
        for r in &refs {
            // A parent directory not in the subvolume: the link count recount
            // handles the inode (the kernel skips the rest of the item too).
            if !self.inode_exists(root, r.parent)? {
                return Ok(());
            }
            if self.inode_in_dir(root, r.parent, ino, r.index, &r.name)? {
                continue;
            }
            if !search_done {
                // Names of this inode in this parent that the log does not have.
                let sk = Key::new(ino, INODE_REF_KEY, r.parent);
                for old in self.subvol_refs(root, &sk)? {
                    if !log.has_ref(ino, r.parent, &old.name)? {
                        self.unlink_name(root, r.parent, &old.name, st)?;
                    }
                }
                let ptr = self.root_ptr(root)?;
                let mut victims = Vec::new();
                for item in TreeIter::new(
                    &self.fs.info,
                    &ptr,
                    Key::new(ino, INODE_EXTREF_KEY, 0),
                    Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
                )? {
                    let item = item?;
                    let ik = item.key();
                    for old in parse_inode_extrefs(item.data())
                        .map_err(|e| bad("subvolume inode extref", &ik, e))?
                    {
                        if old.parent == r.parent && !log.has_ref(ino, r.parent, &old.name)? {
                            victims.push(old.name);
                        }
                    }
                }
                for name in victims {
                    self.unlink_name(root, r.parent, &name, st)?;
                }
                search_done = true;
                // An entry at our index, or with our name, that is someone else's.
                let ik = Key::new(r.parent, DIR_INDEX_KEY, r.index);
                if let Some(x) = self.item(root, &ik)? {
                    for e in parse_dir_items(&x).map_err(|e| bad("subvolume dir index", &ik, e))? {
                        if self.lookup(root, r.parent, &e.name)?.is_some() {
                            self.unlink_name(root, r.parent, &e.name, st)?;
                        }
                    }
                }
                if self.lookup(root, r.parent, &r.name)?.is_some() {
                    self.unlink_name(root, r.parent, &r.name, st)?;
                }
            }
            // The same name under another index.
            if self
                .subvol_refs(root, &Key::new(ino, INODE_REF_KEY, r.parent))?
                .iter()
                .any(|x| x.name == r.name)
                || self
                    .subvol_refs(
                        root,
                        &Key::new(ino, INODE_EXTREF_KEY, extref_hash(r.parent, &r.name)),
                    )?
                    .iter()
                    .any(|x| x.name == r.name && x.parent == r.parent)
            {
                self.unlink_name(root, r.parent, &r.name, st)?;
            }
            // A name in the way that belongs to another inode of the log.
            if self.lookup(root, r.parent, &r.name)?.is_some() {
                self.unlink_name(root, r.parent, &r.name, st)?;
            }
            if !self.link_at_index(root, r.parent, &r.name, ino, ty, r.index, false)? {
                return Err(Error::Unsupported(format!(
                    "tree log replay: index {} of directory {} is taken (replaying {k})",
                    r.index, r.parent
                )));
            }
        }
        // Names the subvolume's item has and the log's item lacks.
        for old in self.subvol_refs(root, k)? {
            let in_log = refs
                .iter()
                .any(|r| r.name == old.name && r.parent == old.parent);
            if !in_log && self.lookup(root, old.parent, &old.name)?.is_some() {
                self.unlink_name(root, old.parent, &old.name, st)?;
            }
        }
        self.overwrite_item(root, k, d)?;
        st.fixup.insert(ino);
        Ok(())
    }

    /// The kernel's replay_one_extent: drop what the subvolume has in the logged
    /// range, insert the logged item, reference its data extent (creating the extent
    /// item when the extent was allocated in the transaction that never committed),
    /// copy its checksums from the log, and keep nbytes right.
    fn replay_one_extent(&mut self, log: &LogTree, k: &Key, d: &[u8]) -> Result<()> {
        let root = log.subvol;
        let ino = k.objectid;
        let fe = FileExtentItem::parse(d).map_err(|e| bad("file extent", k, e))?;
        let start = k.offset;
        let ss = self.fs.info.sectorsize as u64;
        let (end, nbytes) = match &fe.body {
            FileExtentBody::Regular {
                disk_bytenr,
                num_bytes,
                ..
            } => (
                start + num_bytes,
                if *disk_bytenr == 0 { 0 } else { *num_bytes },
            ),
            FileExtentBody::Inline { .. } => {
                ((start + fe.ram_bytes).div_ceil(ss) * ss, fe.ram_bytes)
            }
        };
        if !self.inode_exists(root, ino)? {
            return Err(Error::corrupt(format!(
                "tree log: file extent {k} of an inode in neither the log nor the subvolume"
            )));
        }
        if fe.ty != FILE_EXTENT_INLINE && self.item(root, k)?.as_deref() == Some(d) {
            return Ok(());
        }
        let released = self.drop_extents(root, ino, start, end)?;
        let mut added = nbytes;
        match fe.body {
            FileExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            } => {
                if disk_bytenr == 0 && self.no_holes() {
                    added = 0;
                } else {
                    self.insert_item(root, k, d)?;
                }
                if disk_bytenr != 0 {
                    let owner_off = start.wrapping_sub(offset);
                    // A second item may point at an extent this replay created.
                    if self.data_extent_exists(disk_bytenr, disk_num_bytes)? {
                        self.add_data_ref(disk_bytenr, disk_num_bytes, root, ino, owner_off, 1);
                    } else {
                        self.add_new_data_extent(disk_bytenr, disk_num_bytes, root, ino, owner_off);
                    }
                    let (cs, ce) = if fe.compression != 0 {
                        (disk_bytenr, disk_bytenr + disk_num_bytes)
                    } else {
                        (disk_bytenr + offset, disk_bytenr + offset + num_bytes)
                    };
                    self.replay_csums(log, cs, ce)?;
                }
            }
            FileExtentBody::Inline { .. } => self.overwrite_item(root, k, d)?,
        }
        let mut i = self.read_inode(root, ino)?;
        i.nbytes = i.nbytes.saturating_sub(released).saturating_add(added);
        self.write_inode(root, ino, &i)?;
        Ok(())
    }

    /// Copies the log's checksums of [start, end) into the csum tree, replacing what
    /// is there (an extent referenced in part by one item and whole by another must
    /// not end up with overlapping csum items).
    fn replay_csums(&mut self, log: &LogTree, start: u64, end: u64) -> Result<()> {
        let ss = self.fs.info.sectorsize as u64;
        let csize = self.fs.info.csum_type.size() as u64;
        // Runs of contiguous sectors with checksums: (start, bytes).
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let lo = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0);
        let hi = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, end.saturating_sub(1));
        for (k, d) in log.items.range(lo..=hi) {
            let item_end = k.offset + d.len() as u64 / csize * ss;
            if item_end <= start {
                continue;
            }
            let s = k.offset.max(start);
            let e = item_end.min(end);
            if s >= e {
                continue;
            }
            let bytes =
                &d[((s - k.offset) / ss * csize) as usize..((e - k.offset) / ss * csize) as usize];
            match runs.last_mut() {
                Some((rs, rb)) if *rs + rb.len() as u64 / csize * ss == s => {
                    rb.extend_from_slice(bytes)
                }
                _ => runs.push((s, bytes.to_vec())),
            }
        }
        for (s, bytes) in runs {
            self.del_csums(s, bytes.len() as u64 / csize * ss)?;
            self.insert_csum_run(s, &bytes)?;
        }
        Ok(())
    }

    // ---- stage 5: link counts ----

    fn count_links(&self, root: u64, ino: u64) -> Result<u32> {
        let ptr = self.root_ptr(root)?;
        let mut n = 0u32;
        for item in TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(ino, INODE_REF_KEY, 0),
            Key::new(ino, INODE_EXTREF_KEY, u64::MAX),
        )? {
            let item = item?;
            let k = item.key();
            let refs = if k.ty == INODE_REF_KEY {
                parse_inode_refs(k.offset, item.data())
                    .map_err(|e| bad("subvolume inode ref", &k, e))?
            } else {
                parse_inode_extrefs(item.data())
                    .map_err(|e| bad("subvolume inode extref", &k, e))?
            };
            n += refs.len() as u32;
        }
        Ok(n)
    }

    /// Sets the link count of every inode the replay touched to its number of back
    /// references; one left with none becomes an orphan (a directory loses its
    /// remaining names first), as the kernel's fixup_inode_link_counts.
    fn fixup_link_counts(&mut self, root: u64, st: &mut Replay) -> Result<()> {
        while let Some(ino) = st.fixup.pop_first() {
            if !self.inode_exists(root, ino)? {
                continue;
            }
            let n = self.count_links(root, ino)?;
            let mut i = self.read_inode(root, ino)?;
            if i.nlink != n {
                i.nlink = n;
                i.transid = self.transid;
                self.write_inode(root, ino, &i)?;
            }
            if n == 0 {
                if is_dir(i.mode) {
                    self.replay_dir_deletes(root, None, ino, st)?;
                }
                let ok = Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino);
                if self.item(root, &ok)?.is_none() {
                    self.insert_item(root, &ok, &[])?;
                }
            }
        }
        Ok(())
    }
}
