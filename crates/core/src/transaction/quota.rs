//! The quota tree written by a transaction: accounting at commit (the kernel's
//! btrfs_qgroup_account_extents and btrfs_run_qgroups) and the quota commands
//! (enable, disable, rescan, qgroup create/destroy/assign/remove/limit). The numbers
//! and the rule come from qgroup/; this file reads the two states and writes items.
//!
//! At every commit with quotas on, each extent whose references changed in the
//! transaction (recorded in `DelayedRefs::touched`) is looked up twice: the
//! subvolumes reaching it in the last commit (its blocks are intact until this commit
//! ends) and now, after the delayed refs ran; the difference updates every affected
//! qgroup. Two changes move an extent's subvolumes without changing its references,
//! and are handled as the kernel handles them:
//! - a snapshot (always the first thing in its transaction: `create_snapshot`
//!   commits first): the old state is taken as if the snapshot had existed in it,
//!   sharing everything with its source, whose numbers it starts from (the kernel's
//!   quick inherit); when the source is in a higher qgroup the commit recounts;
//! - the cleaner dropping a deleted subvolume's reference to a shared block: every
//!   extent below it is traced (`Trans::qgroup_trace_subtree`), as the kernel's
//!   btrfs_qgroup_trace_subtree.
//!
//! Simple quotas (squota, kernel 6.7+; the status item's SIMPLE_MODE flag) keep
//! no sets of roots: every extent is charged to one subvolume, its owner, while it
//! exists. [`Squota`] collects the charges as delayed refs create and free extent
//! items (transaction/extent_tree.rs), and the commit adds them to the owner's qgroup
//! and every qgroup above it (the kernel's btrfs_record_squota_delta). Data names
//! its owner in an inline EXTENT_OWNER_REF; a tree block's owner is its header's.
//! Extents of transactions before quotas were enabled (`enable_gen`) are never
//! charged, so nothing is ever recounted.
//!
//! Where the incremental rule cannot be exact (quotas just enabled, a relation added
//! or removed, a rescan asked for), the commit recounts everything instead (the
//! kernel would mark the numbers inconsistent and need a rescan). Either way the
//! status item's generation follows every commit, so the kernel trusts the numbers.

use super::Trans;
use crate::backref::FsRefGraph;
use crate::error::{Error, Result};
use crate::qgroup::roots::RootFinder;
use crate::qgroup::{
    is_fs_tree, level_of, rescan, rescan::leaf_data_extents, QgroupTable, LIMIT_MAX_EXCL,
    LIMIT_MAX_RFER, STATUS_FLAG_INCONSISTENT, STATUS_FLAG_ON, STATUS_FLAG_RESCAN,
    STATUS_FLAG_SIMPLE_MODE, STATUS_VERSION,
};
use crate::tree::ctree::{tree_block_addrs, TreeIter};
use crate::tree::tree_checker::Expect;
use std::collections::BTreeMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{QgroupInfo, QgroupStatus};
use ubtrfs_format::key::{fmt_qgroupid, Key};

/// What the commit must do for quotas beyond the recorded extents.
#[derive(Debug, Default)]
pub(crate) struct QuotaPending {
    /// Recount everything at commit.
    pub rescan: bool,
    /// A snapshot made in this transaction: (source, snapshot).
    pub snapshot: Option<(u64, u64)>,
    /// Subvolumes whose drop finished in this transaction: their qgroups are
    /// removed at commit once their numbers are zero.
    pub dropped: Vec<u64>,
}

/// Simple quotas' bookkeeping for the running transaction.
#[derive(Debug, Clone, Default)]
pub(crate) struct Squota {
    /// The first transaction whose extents are charged (the status item's
    /// `enable_gen`).
    pub enable_gen: u64,
    /// Bytes charged (+) and released (-) per subvolume since the last commit.
    pub deltas: BTreeMap<u64, i64>,
}

impl Squota {
    /// Charges (`bytes` > 0) or releases an extent of transaction `generation` to
    /// subvolume `owner`; other trees and older extents are not counted.
    pub(crate) fn charge(&mut self, owner: u64, generation: u64, bytes: i64) {
        if generation >= self.enable_gen && is_fs_tree(owner) {
            *self.deltas.entry(owner).or_insert(0) += bytes;
        }
    }
}

/// Counters of the last commit's accounting (for tests and the benchmark).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QgroupStats {
    /// Extents accounted incrementally.
    pub extents: u64,
    /// Extent items looked up to find their subvolumes, both states.
    pub lookups: u64,
    /// The commit recounted everything instead.
    pub rescanned: bool,
}

/// A limit of a qgroup, as `btrfs qgroup limit` sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QgroupLimitKind {
    /// Referenced bytes.
    Referenced,
    /// Exclusive bytes.
    Exclusive,
}

impl Trans {
    /// Are quotas on (a quota tree exists)?
    pub fn quotas_enabled(&self) -> bool {
        self.fs.info.tree_ptr(QUOTA_TREE_OBJECTID).is_some()
    }

    /// Are simple quotas (squota) on?
    pub fn simple_quotas(&self) -> bool {
        self.squota.is_some()
    }

    /// Starts recording extents for the commit's accounting when (full) quotas
    /// are on, or the owners' charges with simple quotas.
    pub(crate) fn start_quota_records(&mut self) -> Result<()> {
        if !self.quotas_enabled() {
            return Ok(());
        }
        let status = self.quota_table()?.status;
        if status.flags & STATUS_FLAG_SIMPLE_MODE != 0 {
            if self.fs.info.sb.incompat_flags & FEATURE_INCOMPAT_SIMPLE_QUOTA == 0 {
                return Err(Error::corrupt(
                    "the quota status item says simple quotas, the superblock has no SIMPLE_QUOTA feature",
                ));
            }
            self.squota = Some(Squota {
                enable_gen: status.enable_gen.unwrap_or(0),
                deltas: BTreeMap::new(),
            });
        } else if self.delayed.touched.is_none() {
            self.delayed.touched = Some(BTreeMap::new());
        }
        Ok(())
    }

    /// Are charges of simple quotas waiting for the commit?
    pub(crate) fn squota_pending(&self) -> bool {
        self.squota.as_ref().is_some_and(|s| !s.deltas.is_empty())
    }

    /// The commit's work with simple quotas: each subvolume's charges go to its
    /// qgroup and every qgroup above it (rfer and excl alike; the compressed
    /// numbers are not kept, as in the kernel).
    fn squota_commit(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.quota_pending);
        self.delayed.touched = None;
        let deltas = match self.squota.as_mut() {
            Some(sq) => std::mem::take(&mut sq.deltas),
            None => return Ok(()),
        };
        let mut table = self.quota_table()?;
        for (root, d) in deltas {
            table.charge(root, d);
        }
        self.qgroup_stats = QgroupStats::default();
        self.write_qgroup_table(&table)?;
        self.remove_dropped_qgroups(&table, &pending.dropped)
    }

    /// Removes the qgroups of subvolumes dropped in this transaction, with their
    /// relations, when they hold nothing: with simple quotas a qgroup still
    /// charged for extents its subvolume made stays (btrfs-progs shows it as a
    /// "squota space holder"); with full accounting the drop's tracing has
    /// brought it to zero.
    fn remove_dropped_qgroups(&mut self, table: &QgroupTable, dropped: &[u64]) -> Result<()> {
        for &id in dropped {
            let Some(g) = table.groups.get(&id) else {
                continue;
            };
            let i = &g.info;
            if (i.rfer, i.excl, i.rfer_cmpr, i.excl_cmpr) != (0, 0, 0, 0) || !g.children.is_empty()
            {
                continue;
            }
            for &p in &g.parents {
                self.delete_item(QUOTA_TREE_OBJECTID, &Key::new(id, QGROUP_RELATION_KEY, p))?;
                self.delete_item(QUOTA_TREE_OBJECTID, &Key::new(p, QGROUP_RELATION_KEY, id))?;
            }
            for ty in [QGROUP_INFO_KEY, QGROUP_LIMIT_KEY] {
                match self.delete_item(QUOTA_TREE_OBJECTID, &Key::new(0, ty, id)) {
                    Ok(()) | Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    fn quota_table(&self) -> Result<QgroupTable> {
        let root = self.root_ptr(QUOTA_TREE_OBJECTID)?;
        QgroupTable::load(&self.fs.info, &root)
    }

    /// The commit's quota work: account the recorded extents (or recount), write
    /// changed QGROUP_INFO items and the status item. Runs after the subvolume trees'
    /// delayed refs are in the extent tree and before the trees are written.
    pub(crate) fn qgroup_commit(&mut self) -> Result<()> {
        if self.squota.is_some() {
            return self.squota_commit();
        }
        let records = self.delayed.touched.take().unwrap_or_default();
        let pending = std::mem::take(&mut self.quota_pending);
        if !self.quotas_enabled() {
            self.delayed.touched = None;
            return Ok(());
        }
        self.delayed.touched = Some(BTreeMap::new());
        let mut table = self.quota_table()?;
        let mut stats = QgroupStats::default();
        // A rescan the kernel left running (its numbers half rebuilt), or numbers
        // marked inconsistent: the recount replaces them (the kernel would wait for
        // a `quota rescan`).
        let mut rescan = pending.rescan
            || table.status.flags & (STATUS_FLAG_RESCAN | STATUS_FLAG_INCONSISTENT) != 0;
        if let Some((src, _)) = pending.snapshot {
            // The quick inherit is exact only for level 0.
            if table.ancestors(src).len() > 1 {
                rescan = true;
            }
        }
        if rescan {
            let sharing = rescan::compute_sharing(&self.fs.info)?;
            table.set_from(&sharing);
            table.status.flags &= !(STATUS_FLAG_INCONSISTENT | STATUS_FLAG_RESCAN);
            table.status.rescan = u64::MAX;
            stats.rescanned = true;
        } else {
            if let Some((src, dst)) = pending.snapshot {
                // The old state as if the snapshot had been there, sharing all.
                if let Some(s) = table.groups.get(&src).map(|g| g.info.clone()) {
                    if let Some(d) = table.groups.get_mut(&dst) {
                        d.info.rfer = s.rfer;
                        d.info.rfer_cmpr = s.rfer_cmpr;
                        d.info.excl = 0;
                        d.info.excl_cmpr = 0;
                        table.dirty.insert(dst);
                    }
                    if let Some(g) = table.groups.get_mut(&src) {
                        g.info.excl = 0;
                        g.info.excl_cmpr = 0;
                        table.dirty.insert(src);
                    }
                }
            }
            let (old_rt, old_et) = self.commit_view;
            let mut old = RootFinder::new(FsRefGraph::at(&self.fs.info, old_et, old_rt));
            let mut new = RootFinder::new(FsRefGraph::current(&self.fs.info)?);
            for (&bytenr, &(num_bytes, is_data)) in &records {
                let mut o = old.roots(bytenr, is_data)?;
                let n = new.roots(bytenr, is_data)?;
                if let Some((src, dst)) = pending.snapshot {
                    if o.contains(&src) && !o.contains(&dst) {
                        o.push(dst);
                        o.sort_unstable();
                    }
                }
                if o != n {
                    table.account(&o, &n, num_bytes);
                }
                stats.extents += 1;
            }
            stats.lookups = old.lookups + new.lookups;
        }
        self.qgroup_stats = stats;
        self.write_qgroup_table(&table)?;
        self.remove_dropped_qgroups(&table, &pending.dropped)
    }

    fn write_qgroup_table(&mut self, table: &QgroupTable) -> Result<()> {
        let transid = self.transid;
        for &q in &table.dirty {
            let Some(g) = table.groups.get(&q) else {
                continue;
            };
            let info = QgroupInfo {
                generation: transid,
                ..g.info.clone()
            };
            self.replace_item(
                QUOTA_TREE_OBJECTID,
                &Key::new(0, QGROUP_INFO_KEY, q),
                &info.to_bytes(),
            )?;
        }
        let status = QgroupStatus {
            generation: transid,
            ..table.status.clone()
        };
        self.replace_item(
            QUOTA_TREE_OBJECTID,
            &Key::new(0, QGROUP_STATUS_KEY, 0),
            &status.to_bytes(),
        )
    }

    /// Records every extent below tree block `bytenr` (itself included) for the
    /// commit's accounting: their subvolumes change without their references (a
    /// deleted subvolume's reference to a shared block is dropped above them).
    pub(crate) fn qgroup_trace_subtree(&mut self, bytenr: u64, level: u8) -> Result<()> {
        if self.delayed.touched.is_none() {
            return Ok(());
        }
        let ns = self.fs.info.nodesize as u64;
        let mut todo = vec![(bytenr, level)];
        let mut seen = 0u64;
        while let Some((b, l)) = todo.pop() {
            seen += 1;
            if seen > 1 << 32 {
                return Err(Error::corrupt(format!(
                    "tree block {bytenr}: subtree loops"
                )));
            }
            self.delayed.trace(b, ns, false);
            let blk = self.fs.info.read_tree_block(
                b,
                &Expect {
                    level: Some(l),
                    ..Default::default()
                },
            )?;
            if l > 0 {
                let v = blk.view();
                for i in 0..blk.nritems() {
                    let p = v
                        .key_ptr(i)
                        .map_err(|e| Error::corrupt(format!("tree block {b}: {e}")))?;
                    todo.push((p.blockptr, l - 1));
                }
                continue;
            }
            for (disk_bytenr, disk_num_bytes) in leaf_data_extents(&blk)? {
                self.delayed.trace(disk_bytenr, disk_num_bytes, true);
            }
        }
        Ok(())
    }

    /// Turns quotas on (`btrfs quota enable [-s]`): the quota tree with a qgroup
    /// per subvolume, counted at commit (full accounting), or, `simple`, charging
    /// only extents made from the next transaction on (squota: the kernel's
    /// enable_gen is the enabling transaction + 1, so what this transaction
    /// allocated is never charged; its changes are committed first). Nothing
    /// happens when quotas are on already.
    pub fn quota_enable(&mut self, simple: bool) -> Result<()> {
        if self.quotas_enabled() {
            return Ok(());
        }
        if simple && (self.dirty_bytes() > 0 || self.has_pending_work()) {
            self.commit()?;
        }
        self.create_tree(QUOTA_TREE_OBJECTID)?;
        let status = QgroupStatus {
            version: STATUS_VERSION,
            generation: self.transid,
            flags: if simple {
                STATUS_FLAG_ON | STATUS_FLAG_SIMPLE_MODE
            } else {
                STATUS_FLAG_ON
            },
            rescan: if simple { 0 } else { u64::MAX },
            enable_gen: Some(if simple { self.transid + 1 } else { 0 }),
        };
        let mut items = vec![(Key::new(0, QGROUP_STATUS_KEY, 0), status.to_bytes())];
        // The top level and every subvolume that has a name (a ROOT_REF), as the
        // kernel's enable does.
        let mut ids = vec![FS_TREE_OBJECTID];
        let rt = self.fs.info.root_tree_ptr();
        for item in TreeIter::new(
            &self.fs.info,
            &rt,
            Key::new(FS_TREE_OBJECTID, ROOT_REF_KEY, 0),
            Key::new(LAST_FREE_OBJECTID, ROOT_REF_KEY, u64::MAX),
        )? {
            let item = item?;
            let k = item.key();
            if k.ty == ROOT_REF_KEY && is_fs_tree(k.offset) {
                ids.push(k.offset);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        items.extend(self.qgroup_items(&ids));
        items.sort_by_key(|a| a.0);
        self.insert_items(QUOTA_TREE_OBJECTID, &items)?;
        if simple {
            self.fs.info.sb.incompat_flags |= FEATURE_INCOMPAT_SIMPLE_QUOTA;
        } else {
            self.quota_pending.rescan = true;
        }
        self.start_quota_records()
    }

    fn qgroup_items(&self, ids: &[u64]) -> Vec<(Key, Vec<u8>)> {
        let mut out = Vec::new();
        let g = crate::qgroup::Qgroup::new();
        for &id in ids {
            let info = QgroupInfo {
                generation: self.transid,
                ..g.info.clone()
            };
            out.push((Key::new(0, QGROUP_INFO_KEY, id), info.to_bytes()));
            out.push((Key::new(0, QGROUP_LIMIT_KEY, id), g.limit.to_bytes()));
        }
        out
    }

    /// Turns quotas off (`btrfs quota disable`): the quota tree goes.
    pub fn quota_disable(&mut self) -> Result<()> {
        if !self.quotas_enabled() {
            return Ok(());
        }
        self.delete_tree(QUOTA_TREE_OBJECTID)?;
        self.quota_limits = None;
        self.delayed.touched = None;
        // The SIMPLE_QUOTA feature and the extents' owner refs stay, as in the
        // kernel.
        self.squota = None;
        self.quota_pending = QuotaPending::default();
        Ok(())
    }

    /// Recounts every qgroup at the next commit (`btrfs quota rescan`).
    pub fn quota_rescan(&mut self) -> Result<()> {
        self.require_quotas()?;
        if self.squota.is_some() {
            // The kernel's EINVAL: simple quotas are exact by construction.
            return Err(Error::Invalid(
                "a rescan is not possible with simple quotas".into(),
            ));
        }
        self.quota_pending.rescan = true;
        // Something must be committed for the recount to run.
        self.touch_quota_status()
    }

    fn touch_quota_status(&mut self) -> Result<()> {
        self.update_item(
            QUOTA_TREE_OBJECTID,
            &Key::new(0, QGROUP_STATUS_KEY, 0),
            |_| {},
        )
    }

    fn require_quotas(&self) -> Result<()> {
        if self.quotas_enabled() {
            Ok(())
        } else {
            Err(Error::NotFound("quotas are not enabled".into()))
        }
    }

    /// Adds the qgroup of a subvolume made in this transaction in a directory of
    /// subvolume `dir_root` (the kernel's btrfs_qgroup_inherit without an inherit
    /// list); `snapshot_of` names the source of a snapshot, whose numbers and
    /// limits it starts from at commit. With simple quotas it starts empty (it owns
    /// nothing yet) and joins every qgroup `dir_root` is a member of (the kernel's
    /// qgroup_auto_inherit).
    pub(crate) fn qgroup_new_subvolume(
        &mut self,
        id: u64,
        snapshot_of: Option<u64>,
        dir_root: u64,
    ) -> Result<()> {
        if !self.quotas_enabled() {
            return Ok(());
        }
        let mut items = self.qgroup_items(&[id]);
        if self.squota.is_some() {
            let table = self.quota_table()?;
            let Some(g) = table.groups.get(&dir_root) else {
                return Err(Error::NotFound(format!(
                    "qgroup {} (simple quotas inherit its parents)",
                    fmt_qgroupid(dir_root)
                )));
            };
            for &p in &g.parents {
                items.push((Key::new(id, QGROUP_RELATION_KEY, p), Vec::new()));
                items.push((Key::new(p, QGROUP_RELATION_KEY, id), Vec::new()));
            }
            items.sort_by_key(|a| a.0);
            return self.insert_items(QUOTA_TREE_OBJECTID, &items);
        }
        if let Some(src) = snapshot_of {
            // A snapshot starts with its source's limits, as the kernel's inherit.
            let key = Key::new(0, QGROUP_LIMIT_KEY, src);
            let ptr = self.root_ptr(QUOTA_TREE_OBJECTID)?;
            if let Some(item) = crate::tree::ctree::lookup_exact(&self.fs.info, &ptr, &key)? {
                let lim = item.data().to_vec();
                for (k, d) in items.iter_mut() {
                    if k.ty == QGROUP_LIMIT_KEY {
                        *d = lim.clone();
                    }
                }
            }
        }
        for (k, d) in items {
            // A qgroup left by a deleted subvolume of the same id is reused.
            self.delete_item(QUOTA_TREE_OBJECTID, &k)
                .or_else(|e| match e {
                    Error::NotFound(_) => Ok(()),
                    e => Err(e),
                })?;
            self.insert_item(QUOTA_TREE_OBJECTID, &k, &d)?;
        }
        if let Some(src) = snapshot_of {
            if self.quota_pending.snapshot.is_some() {
                self.quota_pending.rescan = true;
            }
            self.quota_pending.snapshot = Some((src, id));
        }
        Ok(())
    }

    /// `btrfs qgroup create`: a new, empty qgroup (usually level > 0).
    pub fn qgroup_create(&mut self, qgroupid: u64) -> Result<()> {
        self.require_quotas()?;
        if self.quota_table()?.groups.contains_key(&qgroupid) {
            return Err(Error::Exists(fmt_qgroupid(qgroupid)));
        }
        let mut items = self.qgroup_items(&[qgroupid]);
        items.sort_by_key(|a| a.0);
        self.insert_items(QUOTA_TREE_OBJECTID, &items)
    }

    /// `btrfs qgroup destroy`: refused while it has members, and for the qgroup of
    /// an existing subvolume (as the kernel refuses, EBUSY).
    pub fn qgroup_destroy(&mut self, qgroupid: u64) -> Result<()> {
        self.require_quotas()?;
        let table = self.quota_table()?;
        let Some(g) = table.groups.get(&qgroupid) else {
            return Err(Error::NotFound(fmt_qgroupid(qgroupid)));
        };
        if !g.children.is_empty() {
            return Err(Error::Busy(format!(
                "qgroup {} has members",
                fmt_qgroupid(qgroupid)
            )));
        }
        if level_of(qgroupid) == 0 && self.fs.info.read_root_item(qgroupid)?.is_some() {
            return Err(Error::Busy(format!(
                "qgroup {} belongs to an existing subvolume",
                fmt_qgroupid(qgroupid)
            )));
        }
        let i = &g.info;
        if self.squota.is_some()
            && level_of(qgroupid) == 0
            && (i.rfer, i.excl, i.rfer_cmpr, i.excl_cmpr) != (0, 0, 0, 0)
        {
            // It still holds the space of extents its deleted subvolume made.
            return Err(Error::Busy(format!(
                "qgroup {} still holds space (simple quotas)",
                fmt_qgroupid(qgroupid)
            )));
        }
        for p in g.parents.clone() {
            self.qgroup_relation(qgroupid, p, false)?;
        }
        for ty in [QGROUP_INFO_KEY, QGROUP_LIMIT_KEY] {
            self.delete_item(QUOTA_TREE_OBJECTID, &Key::new(0, ty, qgroupid))
                .or_else(|e| match e {
                    Error::NotFound(_) => Ok(()),
                    e => Err(e),
                })?;
        }
        Ok(())
    }

    /// `btrfs qgroup assign|remove SRC DST`: makes `child` a member of `parent` (or
    /// no longer); the numbers of the parents are recounted at commit.
    pub fn qgroup_relation(&mut self, child: u64, parent: u64, add: bool) -> Result<()> {
        self.require_quotas()?;
        if level_of(child) >= level_of(parent) {
            return Err(Error::Invalid(format!(
                "qgroup {} must be of a lower level than {}",
                fmt_qgroupid(child),
                fmt_qgroupid(parent)
            )));
        }
        let table = self.quota_table()?;
        for q in [child, parent] {
            if !table.groups.contains_key(&q) {
                return Err(Error::NotFound(format!("qgroup {}", fmt_qgroupid(q))));
            }
        }
        let member = table.groups[&child].parents.contains(&parent);
        if add {
            if member {
                return Err(Error::Exists(format!(
                    "relation {} -> {}",
                    fmt_qgroupid(child),
                    fmt_qgroupid(parent)
                )));
            }
            if table.ancestors(parent).contains(&child) {
                return Err(Error::Invalid("a qgroup cannot contain itself".into()));
            }
            let mut items = vec![
                (Key::new(child, QGROUP_RELATION_KEY, parent), Vec::new()),
                (Key::new(parent, QGROUP_RELATION_KEY, child), Vec::new()),
            ];
            items.sort_by_key(|a| a.0);
            self.insert_items(QUOTA_TREE_OBJECTID, &items)?;
        } else {
            if !member {
                return Err(Error::NotFound(format!(
                    "relation {} -> {}",
                    fmt_qgroupid(child),
                    fmt_qgroupid(parent)
                )));
            }
            self.delete_item(
                QUOTA_TREE_OBJECTID,
                &Key::new(child, QGROUP_RELATION_KEY, parent),
            )?;
            self.delete_item(
                QUOTA_TREE_OBJECTID,
                &Key::new(parent, QGROUP_RELATION_KEY, child),
            )?;
        }
        if self.squota.is_none() {
            self.quota_pending.rescan = true;
            return Ok(());
        }
        // Simple quotas: rfer equals excl everywhere, so the member's bytes simply
        // move in or out of the parent and every qgroup above it (the kernel's
        // quick_update_accounting).
        let mut table = table;
        let bytes = table.groups[&child].info.excl as i64;
        for q in table.ancestors(parent) {
            table.charge_one(q, if add { bytes } else { -bytes });
        }
        self.write_qgroup_table(&table)
    }

    /// `btrfs qgroup limit`: sets (Some) or clears (None) a limit of a qgroup.
    pub fn qgroup_limit(
        &mut self,
        qgroupid: u64,
        kind: QgroupLimitKind,
        bytes: Option<u64>,
    ) -> Result<()> {
        self.require_quotas()?;
        if !self.quota_table()?.groups.contains_key(&qgroupid) {
            return Err(Error::NotFound(format!(
                "qgroup {}",
                fmt_qgroupid(qgroupid)
            )));
        }
        let key = Key::new(0, QGROUP_LIMIT_KEY, qgroupid);
        let ptr = self.root_ptr(QUOTA_TREE_OBJECTID)?;
        let mut l = match crate::tree::ctree::lookup_exact(&self.fs.info, &ptr, &key)? {
            Some(item) => match ubtrfs_format::items::parse_item(&key, item.data()) {
                Ok(ubtrfs_format::items::Item::QgroupLimit(l)) => l,
                _ => return Err(Error::corrupt(format!("quota tree item {key}: bad limit"))),
            },
            None => crate::qgroup::Qgroup::new().limit,
        };
        let (flag, field) = match kind {
            QgroupLimitKind::Referenced => (LIMIT_MAX_RFER, &mut l.max_rfer),
            QgroupLimitKind::Exclusive => (LIMIT_MAX_EXCL, &mut l.max_excl),
        };
        match bytes {
            Some(b) => {
                *field = b;
                l.flags |= flag;
            }
            None => {
                *field = 0;
                l.flags &= !flag;
            }
        }
        match self.delete_item(QUOTA_TREE_OBJECTID, &key) {
            Ok(()) | Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        self.insert_item(QUOTA_TREE_OBJECTID, &key, &l.to_bytes())
    }

    /// True when quotas are on and some qgroup has a limit: only then can
    /// [`Trans::qgroup_reserve`] refuse.
    pub fn quota_limits_set(&mut self) -> Result<bool> {
        Ok(self.limits_table()?.is_some())
    }

    /// The quota table (read once, kept until the quota tree changes) when quotas
    /// are on and some qgroup has a limit.
    fn limits_table(&mut self) -> Result<Option<std::sync::Arc<crate::qgroup::QgroupTable>>> {
        if !self.quotas_enabled() {
            return Ok(None);
        }
        let table = match &self.quota_limits {
            Some(t) => t.clone(),
            None => {
                let t = std::sync::Arc::new(self.quota_table()?);
                self.quota_limits = Some(t.clone());
                t
            }
        };
        Ok(table
            .groups
            .values()
            .any(|g| g.limit.flags != 0)
            .then_some(table))
    }

    /// The data bytes subvolume `subvol` may still add in this transaction before a
    /// limit of its qgroups is passed (what a short write may take), or None
    /// without limits.
    pub fn qgroup_headroom(&mut self, subvol: u64) -> Result<Option<u64>> {
        let Some(table) = self.limits_table()? else {
            return Ok(None);
        };
        let pending = self.quota_reserved.get(&subvol).copied().unwrap_or(0);
        Ok(table.headroom(subvol, pending))
    }

    /// EDQUOT when adding `bytes` to subvolume `subvol` (referenced and exclusive
    /// alike: new data is exclusive) would pass a limit of its qgroups, counting what
    /// this transaction already added (the kernel's qgroup reservation).
    pub fn qgroup_reserve(&mut self, subvol: u64, bytes: u64) -> Result<()> {
        let Some(table) = self.limits_table()? else {
            return Ok(());
        };
        let pending = self.quota_reserved.get(&subvol).copied().unwrap_or(0);
        let want = pending.saturating_add(bytes);
        if let Some(q) = table.over_limit(subvol, want, want) {
            return Err(Error::QuotaExceeded(fmt_qgroupid(q)));
        }
        self.quota_reserved.insert(subvol, want);
        Ok(())
    }

    /// Deletes a tree that is not a subvolume (every block, then its ROOT_ITEM), as
    /// the kernel's btrfs_del_root after emptying it.
    pub(crate) fn delete_tree(&mut self, id: u64) -> Result<()> {
        let ptr = self.root_ptr(id)?;
        let blocks = tree_block_addrs(&self.fs.info, &ptr)?;
        for b in blocks {
            self.free_tree_block(id, b, 0)?;
        }
        let key = match self.root_keys.get(&id) {
            Some(k) => *k,
            None => {
                self.root_item(id)?;
                *self
                    .root_keys
                    .get(&id)
                    .ok_or_else(|| Error::corrupt(format!("root item of tree {id} not found")))?
            }
        };
        self.delete_item(ROOT_TREE_OBJECTID, &key)?;
        self.root_keys.remove(&id);
        self.dirty_roots.remove(&id);
        self.root_bytes_delta.remove(&id);
        self.fs.forget_root(id);
        self.fs.info.tree_roots.remove(&id);
        Ok(())
    }
}
