//! Subvolume links: every ROOT_REF has its ROOT_BACKREF with the same directory,
//! index and name, and the parent subvolume has the DIR_ITEM and DIR_INDEX naming the
//! child; every such entry has its refs; a subvolume with refs 0 has its orphan item,
//! one with refs has a ROOT_BACKREF.

use super::blocks::{tree_kind, TreeKind, Walk};
use super::fs_roots::FsRoots;
use super::Findings;
use std::collections::{BTreeMap, BTreeSet};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::RootRef;
use ubtrfs_format::key::Key;

pub(super) fn check_root_refs(walk: &Walk, fsr: &FsRoots, f: &mut Findings) {
    let tree = Some(ROOT_TREE_OBJECTID);
    // (parent, child) -> ref, from both sides.
    let mut fwd: BTreeMap<(u64, u64), (Key, &RootRef)> = BTreeMap::new();
    let mut back: BTreeMap<(u64, u64), (Key, &RootRef)> = BTreeMap::new();
    for (k, r) in &walk.root_refs {
        if k.ty == ROOT_REF_KEY {
            fwd.insert((k.objectid, k.offset), (*k, r));
        } else {
            back.insert((k.offset, k.objectid), (*k, r));
        }
    }
    let subvols: BTreeMap<u64, u32> = walk
        .roots
        .iter()
        .filter(|(k, _)| tree_kind(k.objectid) == TreeKind::Fs && k.objectid >= FIRST_FREE_OBJECTID)
        .filter(|(k, _)| {
            k.objectid != TREE_RELOC_OBJECTID && k.objectid != DATA_RELOC_TREE_OBJECTID
        })
        .map(|(k, r)| (k.objectid, r.refs))
        .collect();
    for (&(p, c), (k, r)) in &fwd {
        match back.get(&(p, c)) {
            None => f.add(
                "root-ref",
                tree,
                None,
                Some(*k),
                format!("ROOT_REF of subvolume {c} in {p} has no ROOT_BACKREF"),
            ),
            Some((_, b)) if b != r => f.add(
                "root-ref",
                tree,
                None,
                Some(*k),
                format!("ROOT_REF and ROOT_BACKREF of subvolume {c} in {p} differ"),
            ),
            _ => {}
        }
        if !subvols.contains_key(&c) {
            f.add(
                "root-ref",
                tree,
                None,
                Some(*k),
                format!("ROOT_REF names subvolume {c}, which has no ROOT_ITEM"),
            );
        }
        if fsr.checked.contains(&p) {
            let has = |index: Option<u64>| {
                fsr.subvol_entries.iter().any(|e| {
                    e.tree == p
                        && e.child == c
                        && e.dirid == r.dirid
                        && e.name == r.name
                        && (index.is_none() && e.index.is_none() || index == e.index)
                })
            };
            if !has(Some(r.sequence)) {
                f.add(
                    "root-ref",
                    tree,
                    None,
                    Some(*k),
                    format!(
                        "subvolume {c}: no DIR_INDEX {} in directory {} of {p} for its ROOT_REF",
                        r.sequence, r.dirid
                    ),
                );
            }
            if !has(None) {
                f.add(
                    "root-ref",
                    tree,
                    None,
                    Some(*k),
                    format!(
                        "subvolume {c}: no DIR_ITEM in directory {} of {p} for its ROOT_REF",
                        r.dirid
                    ),
                );
            }
        }
    }
    for (&(p, c), (k, _)) in &back {
        if !fwd.contains_key(&(p, c)) {
            f.add(
                "root-ref",
                tree,
                None,
                Some(*k),
                format!("ROOT_BACKREF of subvolume {c} in {p} has no ROOT_REF"),
            );
        }
    }
    // Entries naming subvolumes must have their refs.
    let mut seen: BTreeSet<(u64, u64, u64)> = BTreeSet::new();
    for e in &fsr.subvol_entries {
        // A snapshot keeps the entry of a subvolume nested in its source, with no
        // ROOT_REF (the kernel shows it as an empty directory): only an entry whose
        // subvolume is linked from this tree must match that link.
        let ok = fwd.get(&(e.tree, e.child)).is_none_or(|(_, r)| {
            r.dirid == e.dirid && r.name == e.name && e.index.is_none_or(|i| i == r.sequence)
        });
        if !ok && seen.insert((e.tree, e.dirid, e.child)) {
            f.add(
                "root-ref",
                Some(e.tree),
                None,
                Some(Key::new(e.dirid, DIR_INDEX_KEY, e.index.unwrap_or(0))),
                format!(
                    "directory {} names subvolume {} without a matching ROOT_REF",
                    e.dirid, e.child
                ),
            );
        }
    }
    for (&id, &refs) in &subvols {
        let has_back = back.keys().any(|&(_, c)| c == id);
        if refs == 0 && !walk.root_orphans.contains(&id) {
            f.add(
                "root-item",
                tree,
                None,
                Some(Key::new(id, ROOT_ITEM_KEY, 0)),
                format!("subvolume {id} has refs 0 but no orphan item"),
            );
        }
        if refs > 0 && !has_back {
            f.add(
                "root-item",
                tree,
                None,
                Some(Key::new(id, ROOT_ITEM_KEY, 0)),
                format!("subvolume {id} has refs {refs} but no ROOT_BACKREF"),
            );
        }
    }
}
