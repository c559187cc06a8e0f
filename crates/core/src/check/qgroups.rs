//! Quota groups against a recount: which subvolumes reach each extent (tree blocks
//! through their parents, data through the leaves that point to it), then referenced
//! and exclusive bytes per level-0 qgroup and per higher qgroup through the relations,
//! compared with the QGROUP_INFO items.
//!
//! Sets of subvolumes are interned: snapshots make most blocks share the same few sets,
//! so a block holds one small id, and unions are memoised.

use super::blocks::{ExpRef, RefKind, Walk, DATA_LEVEL};
use super::Findings;
use crate::error::Result;
use crate::fs::Filesystem;
use crate::qgroup::is_fs_tree;
use crate::qgroup::rescan::Sets;
use crate::tree::ctree::TreeIter;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{parse_item, Item};
use ubtrfs_format::key::{fmt_qgroupid, Key};

const QGROUP_STATUS_FLAG_RESCAN: u64 = 1 << 1;
const QGROUP_STATUS_FLAG_INCONSISTENT: u64 = 1 << 2;
const QGROUP_STATUS_FLAG_SIMPLE_MODE: u64 = 1 << 3;

pub(super) fn check_qgroups(fs: &Filesystem, walk: &Walk, f: &mut Findings) -> Option<String> {
    let Some(ptr) = fs.info.tree_ptr(QUOTA_TREE_OBJECTID) else {
        return Some("not enabled on this filesystem".into());
    };
    let mut status = None;
    let mut info: BTreeMap<u64, (Key, u64, u64)> = BTreeMap::new();
    let mut parents: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let res = (|| -> Result<()> {
        for item in TreeIter::new(&fs.info, &ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            match parse_item(&k, item.data()) {
                Ok(Item::QgroupStatus(s)) => status = Some(s),
                Ok(Item::QgroupInfo(i)) => {
                    info.insert(k.offset, (k, i.rfer, i.excl));
                }
                Ok(Item::QgroupRelation) if k.objectid < k.offset => {
                    parents.entry(k.objectid).or_default().insert(k.offset);
                }
                _ => {}
            }
        }
        Ok(())
    })();
    if let Err(e) = res {
        f.add(
            "qgroup",
            Some(QUOTA_TREE_OBJECTID),
            None,
            None,
            format!("the quota tree cannot be read: {e}"),
        );
        return None;
    }
    let Some(status) = status else {
        f.add(
            "qgroup",
            Some(QUOTA_TREE_OBJECTID),
            None,
            None,
            "the quota tree has no status item".into(),
        );
        return None;
    };
    if status.flags & QGROUP_STATUS_FLAG_SIMPLE_MODE != 0 {
        return check_simple(fs, &status, &info, &parents, f);
    }
    if status.flags & (QGROUP_STATUS_FLAG_INCONSISTENT | QGROUP_STATUS_FLAG_RESCAN) != 0 {
        // As btrfs check: numbers of an inconsistent or rescanning qgroup tree are
        // expected to differ; not an error.
        return Some("marked inconsistent or being rescanned; a difference is expected".into());
    }
    // Which subvolumes reach each tree block: parents first (higher levels first).
    let mut sets = Sets::default();
    let empty = sets.intern(Vec::new());
    // Tree block references only (the data ones are streamed below).
    let mut order: Vec<ExpRef> = walk.refs.iter().filter(|r| r.level != DATA_LEVEL).collect();
    order.sort_by_key(|r| std::cmp::Reverse(r.level));
    let mut block_set: HashMap<u64, u32> = HashMap::new();
    for &r in &order {
        let from = if r.from == 0 {
            match r.kind {
                RefKind::Tree(id) if is_fs_tree(id) => sets.intern(vec![id]),
                _ => empty,
            }
        } else {
            block_set.get(&r.from).copied().unwrap_or(empty)
        };
        let cur = block_set.get(&r.bytenr).copied().unwrap_or(empty);
        let u = sets.union(cur, from);
        block_set.insert(r.bytenr, u);
    }
    drop(order);
    let nodesize = fs.info.nodesize as u64;
    let mut counted: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    // Ancestors of each qgroup, transitively.
    let ancestors = |q: u64| -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        let mut todo = vec![q];
        while let Some(x) = todo.pop() {
            for &p in parents.get(&x).into_iter().flatten() {
                if out.insert(p) {
                    todo.push(p);
                }
            }
        }
        out
    };
    let mut anc_cache: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    let mut account = |set: &[u64], len: u64, counted: &mut BTreeMap<u64, (u64, u64)>| {
        if set.is_empty() {
            return;
        }
        for &id in set {
            let c = counted.entry(id).or_default();
            c.0 = c.0.saturating_add(len);
            if set.len() == 1 {
                c.1 = c.1.saturating_add(len);
            }
        }
        // Higher qgroups: referenced if any member reaches it, exclusive if all do.
        let mut hits: BTreeMap<u64, usize> = BTreeMap::new();
        for &id in set {
            let a = anc_cache.entry(id).or_insert_with(|| ancestors(id));
            for &q in a.iter() {
                *hits.entry(q).or_default() += 1;
            }
        }
        for (q, n) in hits {
            let c = counted.entry(q).or_default();
            c.0 = c.0.saturating_add(len);
            if n == set.len() {
                c.1 = c.1.saturating_add(len);
            }
        }
    };
    // Each block once, however many parents point to it.
    for (_, &s) in block_set.iter() {
        let set = sets.sets[s as usize].clone();
        account(&set, nodesize, &mut counted);
    }
    // Data extents: the union over the leaves pointing to them, one extent at a
    // time (the references come in address order).
    let mut cur: Option<(u64, u64, u32)> = None;
    for r in walk.refs.iter().filter(|r| r.level == DATA_LEVEL) {
        let from = block_set.get(&r.from).copied().unwrap_or(empty);
        match &mut cur {
            Some((b, _, s)) if *b == r.bytenr => *s = sets.union(*s, from),
            _ => {
                if let Some((_, len, s)) = cur.take() {
                    let set = sets.sets[s as usize].clone();
                    account(&set, len, &mut counted);
                }
                cur = Some((r.bytenr, r.len, sets.union(empty, from)));
            }
        }
    }
    if let Some((_, len, s)) = cur {
        let set = sets.sets[s as usize].clone();
        account(&set, len, &mut counted);
    }
    compare(&info, &counted, f);
    None
}

/// Every qgroup's numbers against the recount.
fn compare(
    info: &BTreeMap<u64, (Key, u64, u64)>,
    counted: &BTreeMap<u64, (u64, u64)>,
    f: &mut Findings,
) {
    for (&q, &(k, rfer, excl)) in info {
        let (cr, ce) = counted.get(&q).copied().unwrap_or((0, 0));
        if cr != rfer || ce != excl {
            f.add(
                "qgroup",
                Some(QUOTA_TREE_OBJECTID),
                None,
                Some(k),
                format!(
                    "qgroup {} says referenced {rfer} exclusive {excl}, a recount gives {cr} and {ce}",
                    fmt_qgroupid(q)
                ),
            );
        }
    }
    for (&q, &(cr, _)) in counted {
        if q >> 48 == 0 && cr > 0 && !info.contains_key(&q) {
            f.add(
                "qgroup",
                Some(QUOTA_TREE_OBJECTID),
                None,
                Some(Key::new(0, QGROUP_INFO_KEY, q)),
                format!("subvolume {q} references {cr} bytes but has no qgroup"),
            );
        }
    }
}

/// Simple quotas: each subvolume's owned bytes (qgroup/squota.rs) added to its
/// qgroup and every qgroup above it, referenced and exclusive alike, as btrfs
/// check's simple mode counts them. A subvolume without a qgroup counts nowhere
/// (the kernel skips it too).
fn check_simple(
    fs: &Filesystem,
    status: &ubtrfs_format::items::QgroupStatus,
    info: &BTreeMap<u64, (Key, u64, u64)>,
    parents: &BTreeMap<u64, BTreeSet<u64>>,
    f: &mut Findings,
) -> Option<String> {
    let enable_gen = status.enable_gen.unwrap_or(0);
    let owned = match crate::qgroup::squota::owned_bytes(&fs.info, enable_gen) {
        Ok(o) => o,
        Err(e) => {
            f.add(
                "qgroup",
                Some(EXTENT_TREE_OBJECTID),
                None,
                None,
                format!("simple quotas cannot be recounted: {e}"),
            );
            return None;
        }
    };
    let mut counted: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (&root, &bytes) in &owned {
        if !info.contains_key(&root) {
            continue;
        }
        let mut seen = BTreeSet::new();
        let mut todo = vec![root];
        while let Some(q) = todo.pop() {
            if !seen.insert(q) {
                continue;
            }
            let c = counted.entry(q).or_default();
            c.0 = c.0.saturating_add(bytes);
            c.1 = c.1.saturating_add(bytes);
            todo.extend(parents.get(&q).into_iter().flatten().copied());
        }
    }
    compare(info, &counted, f);
    None
}
