//! Quota groups (the kernel's qgroup.c, minus its I/O): the numbers of the quota tree
//! and how a change of an extent's roots changes them.
//!
//! Owns: [`QgroupTable`] (every qgroup's QGROUP_INFO/LIMIT, the relations, the status
//! item, read from a quota tree), the accounting rule for one extent whose set of
//! referencing subvolumes went from `old` to `new` ([`QgroupTable::account`]), the
//! roots of an extent in one state of the filesystem ([`roots::RootFinder`], bottom-up
//! through the back references as the kernel's btrfs_find_all_roots), and the full
//! recount ([`rescan`]). May use: error, tree, io, backref. Writing the quota tree is
//! the transaction's (transaction/quota.rs): this module never writes. Simple
//! quotas' recount from the extent tree is [`squota::owned_bytes`].
//!
//! Names: a qgroup id is `level << 48 | id` ("1/100"); level-0 qgroup `0/N` belongs to
//! subvolume N. referenced (rfer) = bytes reachable from any of the qgroup's
//! subvolumes, exclusive (excl) = bytes reachable from its subvolumes only. Tree
//! blocks count nodesize, data extents their on-disk length; the compressed variants
//! are kept equal to them, as the kernel keeps them.

pub(crate) mod rescan;
pub(crate) mod roots;
pub(crate) mod squota;

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::tree::ctree::TreeIter;
use crate::tree::RootPtr;
use std::collections::{BTreeMap, BTreeSet};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{parse_item, Item, QgroupInfo, QgroupLimit, QgroupStatus};
use ubtrfs_format::key::Key;

/// Quotas are on.
pub(crate) const STATUS_FLAG_ON: u64 = 1 << 0;
/// A rescan is running (its progress in the status item's `rescan`).
pub(crate) const STATUS_FLAG_RESCAN: u64 = 1 << 1;
/// The numbers are known to be wrong until a rescan.
pub(crate) const STATUS_FLAG_INCONSISTENT: u64 = 1 << 2;
/// Simple quotas (squota): owner-based accounting, kernel 6.7+.
pub(crate) const STATUS_FLAG_SIMPLE_MODE: u64 = 1 << 3;
/// The status item's format version.
pub(crate) const STATUS_VERSION: u64 = 1;
/// QGROUP_LIMIT flags: which limits are set.
pub(crate) const LIMIT_MAX_RFER: u64 = 1 << 0;
/// Limit on exclusive bytes.
pub(crate) const LIMIT_MAX_EXCL: u64 = 1 << 1;
/// Qgroup levels are 16 bits of the id; a hierarchy deeper than this is refused.
pub(crate) const LEVELS_MAX: usize = 8;

/// The level of a qgroup id.
pub(crate) fn level_of(qgroupid: u64) -> u64 {
    qgroupid >> 48
}

/// Is tree `id` a subvolume (the top level, a subvolume or a snapshot)? Only those
/// have qgroups.
pub(crate) fn is_fs_tree(id: u64) -> bool {
    id == FS_TREE_OBJECTID || (FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&id)
}

/// One qgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Qgroup {
    pub info: QgroupInfo,
    pub limit: QgroupLimit,
    /// Qgroups this one is a member of.
    pub parents: BTreeSet<u64>,
    /// Members of this one.
    pub children: BTreeSet<u64>,
}

impl Qgroup {
    pub(crate) fn new() -> Qgroup {
        Qgroup {
            info: QgroupInfo {
                generation: 0,
                rfer: 0,
                rfer_cmpr: 0,
                excl: 0,
                excl_cmpr: 0,
            },
            limit: QgroupLimit {
                flags: 0,
                max_rfer: 0,
                max_excl: 0,
                rsv_rfer: 0,
                rsv_excl: 0,
            },
            parents: BTreeSet::new(),
            children: BTreeSet::new(),
        }
    }
}

/// The quota tree's contents.
#[derive(Clone, Debug)]
pub(crate) struct QgroupTable {
    pub status: QgroupStatus,
    pub groups: BTreeMap<u64, Qgroup>,
    /// Qgroups whose QGROUP_INFO changed since loaded.
    pub dirty: BTreeSet<u64>,
}

impl QgroupTable {
    /// Reads the quota tree rooted at `root`.
    pub(crate) fn load(fs: &FsInfo, root: &RootPtr) -> Result<QgroupTable> {
        let mut status = None;
        let mut groups: BTreeMap<u64, Qgroup> = BTreeMap::new();
        for item in TreeIter::new(fs, root, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            let bad = |e| Error::corrupt(format!("quota tree item {k}: {e}"));
            match parse_item(&k, item.data()).map_err(bad)? {
                Item::QgroupStatus(s) => status = Some(s),
                Item::QgroupInfo(i) => groups.entry(k.offset).or_insert_with(Qgroup::new).info = i,
                Item::QgroupLimit(l) => {
                    groups.entry(k.offset).or_insert_with(Qgroup::new).limit = l
                }
                // Stored both ways; (child, RELATION, parent) has child < parent.
                Item::QgroupRelation if k.objectid < k.offset => {
                    groups
                        .entry(k.objectid)
                        .or_insert_with(Qgroup::new)
                        .parents
                        .insert(k.offset);
                    groups
                        .entry(k.offset)
                        .or_insert_with(Qgroup::new)
                        .children
                        .insert(k.objectid);
                }
                _ => {}
            }
        }
        let status = status.ok_or_else(|| Error::corrupt("quota tree: no QGROUP_STATUS item"))?;
        Ok(QgroupTable {
            status,
            groups,
            dirty: BTreeSet::new(),
        })
    }

    /// `q` and every qgroup above it.
    pub(crate) fn ancestors(&self, q: u64) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        if !self.groups.contains_key(&q) {
            return out;
        }
        let mut todo = vec![(q, 0usize)];
        while let Some((g, depth)) = todo.pop() {
            if !out.insert(g) || depth > LEVELS_MAX {
                continue;
            }
            if let Some(x) = self.groups.get(&g) {
                todo.extend(x.parents.iter().map(|&p| (p, depth + 1)));
            }
        }
        out
    }

    /// The level-0 qgroups (subvolumes) under `q`, `q` itself when it is one.
    pub(crate) fn subvolumes_under(&self, q: u64) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut todo = vec![(q, 0usize)];
        while let Some((g, depth)) = todo.pop() {
            if !seen.insert(g) || depth > LEVELS_MAX {
                continue;
            }
            if level_of(g) == 0 {
                out.insert(g);
            }
            if let Some(x) = self.groups.get(&g) {
                todo.extend(x.children.iter().map(|&c| (c, depth + 1)));
            }
        }
        out
    }

    /// Accounts one extent of `bytes` whose referencing subvolumes went from `old` to
    /// `new` (the kernel's qgroup_update_refcnt and qgroup_update_counters): a qgroup
    /// gains referenced bytes when none of its subvolumes referenced the extent and
    /// one does now, and exclusive bytes when its subvolumes went from not being all
    /// of the extent's referrers to being all of them; and the reverse.
    pub(crate) fn account(&mut self, old: &[u64], new: &[u64], bytes: u64) {
        if old == new || bytes == 0 {
            return;
        }
        // For each qgroup: how many of the old and new roots it covers.
        let mut counts: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        for &r in old {
            for q in self.ancestors(r) {
                counts.entry(q).or_default().0 += 1;
            }
        }
        for &r in new {
            for q in self.ancestors(r) {
                counts.entry(q).or_default().1 += 1;
            }
        }
        for (q, (oc, nc)) in counts {
            let Some(g) = self.groups.get_mut(&q) else {
                continue;
            };
            let mut d_rfer = 0i128;
            let mut d_excl = 0i128;
            if oc == 0 && nc > 0 {
                d_rfer += bytes as i128;
            } else if oc > 0 && nc == 0 {
                d_rfer -= bytes as i128;
            }
            let old_excl = oc > 0 && oc == old.len();
            let new_excl = nc > 0 && nc == new.len();
            if !old_excl && new_excl {
                d_excl += bytes as i128;
            } else if old_excl && !new_excl {
                d_excl -= bytes as i128;
            }
            if d_rfer == 0 && d_excl == 0 {
                continue;
            }
            let add = |v: u64, d: i128| (v as i128 + d).clamp(0, u64::MAX as i128) as u64;
            g.info.rfer = add(g.info.rfer, d_rfer);
            g.info.rfer_cmpr = add(g.info.rfer_cmpr, d_rfer);
            g.info.excl = add(g.info.excl, d_excl);
            g.info.excl_cmpr = add(g.info.excl_cmpr, d_excl);
            self.dirty.insert(q);
        }
    }

    /// Simple quotas: adds `bytes` (< 0: removes) to subvolume `root`'s qgroup and
    /// every qgroup above it (the kernel's btrfs_record_squota_delta). A subvolume
    /// without a qgroup is skipped, as the kernel skips it.
    pub(crate) fn charge(&mut self, root: u64, bytes: i64) {
        for q in self.ancestors(root) {
            self.charge_one(q, bytes);
        }
    }

    /// Simple quotas: adds `bytes` to one qgroup's referenced and exclusive
    /// numbers; a release larger than what is held empties it (the kernel's clamp).
    pub(crate) fn charge_one(&mut self, q: u64, bytes: i64) {
        let Some(g) = self.groups.get_mut(&q) else {
            return;
        };
        if bytes == 0 {
            return;
        }
        let i = &mut g.info;
        if bytes < 0 && i.excl < bytes.unsigned_abs() {
            i.excl = 0;
            i.rfer = 0;
        } else {
            i.excl = i.excl.saturating_add_signed(bytes);
            i.rfer = i.rfer.saturating_add_signed(bytes);
        }
        self.dirty.insert(q);
    }

    /// Sets every qgroup's numbers from a full recount.
    pub(crate) fn set_from(&mut self, sharing: &rescan::Sharing) {
        let ids: Vec<u64> = self.groups.keys().copied().collect();
        for q in ids {
            let members = self.subvolumes_under(q);
            let (mut rfer, mut excl) = (0u64, 0u64);
            for (set, bytes) in &sharing.by_set {
                let inside = set.iter().filter(|r| members.contains(r)).count();
                if inside > 0 {
                    rfer += bytes;
                    if inside == set.len() {
                        excl += bytes;
                    }
                }
            }
            if let Some(g) = self.groups.get_mut(&q) {
                let i = &mut g.info;
                if (i.rfer, i.rfer_cmpr, i.excl, i.excl_cmpr) != (rfer, rfer, excl, excl) {
                    (i.rfer, i.rfer_cmpr, i.excl, i.excl_cmpr) = (rfer, rfer, excl, excl);
                    self.dirty.insert(q);
                }
            }
        }
    }

    /// Would adding `rfer` referenced and `excl` exclusive bytes to subvolume
    /// `subvol` pass a limit of it or of a qgroup above it? The qgroup over its limit
    /// when not.
    /// The most bytes subvolume `subvol` may still add before one of its qgroups
    /// passes a limit, given `pending` bytes already charged; None without limits.
    pub(crate) fn headroom(&self, subvol: u64, pending: u64) -> Option<u64> {
        let mut room: Option<u64> = None;
        for q in self.ancestors(subvol) {
            let Some(g) = self.groups.get(&q) else {
                continue;
            };
            let l = &g.limit;
            for (flag, max, have) in [
                (LIMIT_MAX_RFER, l.max_rfer, g.info.rfer),
                (LIMIT_MAX_EXCL, l.max_excl, g.info.excl),
            ] {
                if l.flags & flag != 0 {
                    let left = max.saturating_sub(have.saturating_add(pending));
                    room = Some(room.map_or(left, |r| r.min(left)));
                }
            }
        }
        room
    }

    pub(crate) fn over_limit(&self, subvol: u64, rfer: u64, excl: u64) -> Option<u64> {
        for q in self.ancestors(subvol) {
            let Some(g) = self.groups.get(&q) else {
                continue;
            };
            let l = &g.limit;
            if l.flags & LIMIT_MAX_RFER != 0 && g.info.rfer.saturating_add(rfer) > l.max_rfer {
                return Some(q);
            }
            if l.flags & LIMIT_MAX_EXCL != 0 && g.info.excl.saturating_add(excl) > l.max_excl {
                return Some(q);
            }
        }
        None
    }
}

/// One qgroup as `btrfs qgroup show` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QgroupEntry {
    /// `level << 48 | id`.
    pub qgroupid: u64,
    /// Referenced bytes.
    pub referenced: u64,
    /// Exclusive bytes.
    pub exclusive: u64,
    /// Limit on referenced bytes, when set.
    pub max_referenced: Option<u64>,
    /// Limit on exclusive bytes, when set.
    pub max_exclusive: Option<u64>,
    /// Qgroups it is a member of.
    pub parents: Vec<u64>,
    /// Its members.
    pub children: Vec<u64>,
}

/// The quota tree of a filesystem, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaReport {
    /// The status item's flags (1 on, 2 rescanning, 4 inconsistent, 8 simple).
    pub flags: u64,
    /// Transaction the numbers were last written in.
    pub generation: u64,
    /// Simple quotas: the first transaction whose extents are charged.
    pub enable_gen: Option<u64>,
    /// Every qgroup, by id.
    pub qgroups: Vec<QgroupEntry>,
}

impl QuotaReport {
    /// Are the numbers marked inconsistent (a rescan is needed)?
    pub fn inconsistent(&self) -> bool {
        self.flags & STATUS_FLAG_INCONSISTENT != 0
    }
    /// Simple quotas (squota)?
    pub fn simple(&self) -> bool {
        self.flags & STATUS_FLAG_SIMPLE_MODE != 0
    }
}

impl crate::fs::Filesystem {
    /// The quota tree's qgroups and status; None when quotas are off.
    pub fn quotas(&self) -> Result<Option<QuotaReport>> {
        let Some(root) = self.info.tree_ptr(QUOTA_TREE_OBJECTID) else {
            return Ok(None);
        };
        let t = QgroupTable::load(&self.info, &root)?;
        let qgroups = t
            .groups
            .iter()
            .map(|(&q, g)| QgroupEntry {
                qgroupid: q,
                referenced: g.info.rfer,
                exclusive: g.info.excl,
                max_referenced: (g.limit.flags & LIMIT_MAX_RFER != 0).then_some(g.limit.max_rfer),
                max_exclusive: (g.limit.flags & LIMIT_MAX_EXCL != 0).then_some(g.limit.max_excl),
                parents: g.parents.iter().copied().collect(),
                children: g.children.iter().copied().collect(),
            })
            .collect();
        Ok(Some(QuotaReport {
            flags: t.status.flags,
            generation: t.status.generation,
            enable_gen: t.status.enable_gen,
            qgroups,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ids: &[u64], rel: &[(u64, u64)]) -> QgroupTable {
        let mut t = QgroupTable {
            status: QgroupStatus {
                version: 1,
                generation: 1,
                flags: STATUS_FLAG_ON,
                rescan: u64::MAX,
                enable_gen: None,
            },
            groups: BTreeMap::new(),
            dirty: BTreeSet::new(),
        };
        for &i in ids {
            t.groups.insert(i, Qgroup::new());
        }
        for &(c, p) in rel {
            t.groups.get_mut(&c).unwrap().parents.insert(p);
            t.groups.get_mut(&p).unwrap().children.insert(c);
        }
        t
    }

    fn nums(t: &QgroupTable, q: u64) -> (u64, u64) {
        let i = &t.groups[&q].info;
        (i.rfer, i.excl)
    }

    const P: u64 = 1 << 48 | 100;

    #[test]
    fn new_shared_and_freed_extent() {
        let mut t = table(&[5, 256, 257, P], &[(256, P), (257, P)]);
        t.account(&[], &[256], 4096);
        assert_eq!(nums(&t, 256), (4096, 4096));
        assert_eq!(nums(&t, P), (4096, 4096));
        // Shared by a snapshot: 256 loses exclusive, the parent keeps it (both inside).
        t.account(&[256], &[256, 257], 4096);
        assert_eq!(nums(&t, 256), (4096, 0));
        assert_eq!(nums(&t, 257), (4096, 0));
        assert_eq!(nums(&t, P), (4096, 4096));
        // Also referenced from outside the parent.
        t.account(&[256, 257], &[5, 256, 257], 4096);
        assert_eq!(nums(&t, P), (4096, 0));
        assert_eq!(nums(&t, 5), (4096, 0));
        // Freed everywhere.
        t.account(&[5, 256, 257], &[], 4096);
        for q in [5, 256, 257, P] {
            assert_eq!(nums(&t, q), (0, 0), "{q}");
        }
    }

    #[test]
    fn roots_without_qgroup_still_count_for_exclusive() {
        let mut t = table(&[256], &[]);
        t.account(&[], &[256, 300], 8192);
        assert_eq!(nums(&t, 256), (8192, 0));
        t.account(&[256, 300], &[256], 8192);
        assert_eq!(nums(&t, 256), (8192, 8192));
    }

    #[test]
    fn recount_by_sets() {
        let mut t = table(&[256, 257, P], &[(256, P), (257, P)]);
        let s = rescan::Sharing {
            by_set: vec![
                (vec![5], 10),
                (vec![256], 1),
                (vec![256, 257], 2),
                (vec![5, 257], 4),
            ],
            data_by_set: Vec::new(),
            subvolumes: vec![5, 256, 257],
            tree_blocks: 0,
            data_extents: 0,
        };
        t.set_from(&s);
        assert_eq!(nums(&t, 256), (3, 1));
        assert_eq!(nums(&t, 257), (6, 0));
        assert_eq!(nums(&t, P), (7, 3));
    }

    #[test]
    fn limits_of_ancestors_apply() {
        let mut t = table(&[256, P], &[(256, P)]);
        t.groups.get_mut(&P).unwrap().limit.flags = LIMIT_MAX_RFER;
        t.groups.get_mut(&P).unwrap().limit.max_rfer = 10_000;
        assert_eq!(t.over_limit(256, 4096, 4096), None);
        assert_eq!(t.over_limit(256, 20_000, 0), Some(P));
    }
}
