//! The full recount (a quota rescan): referenced / exclusive bytes per subvolume and
//! per higher qgroup, from one pass over every live subvolume tree. `quota enable`,
//! `quota rescan` and the commits that cannot account incrementally write its numbers;
//! `ubtrfs subvolume du` prints them without a quota tree.
//!
//! One top-down pass over every live subvolume tree reads each tree block once (a
//! block shared by many snapshots is reached from several parents but read only the
//! first time) and records the set of subvolumes that reach it; leaves pass their set
//! on to the data extents their file extent items point at. Bytes (nodesize per tree
//! block, the on-disk length per data extent) are then summed per distinct set of
//! subvolumes. From those sums:
//!   referenced(q) = bytes of every set meeting q's subvolumes,
//!   exclusive(q)  = bytes of every set inside q's subvolumes,
//!   freed(S)      = bytes of every set contained in S (what deleting S would free).
//!
//! Memory: one entry per tree block and per data extent (~40 bytes each) plus the
//! interned sets.

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::io::root_tree::root_ptr_of;
use crate::tree::ctree::{read_root, read_tree_blocks, TreeIter};
use crate::tree::tree_checker::Expect;
use std::collections::{BTreeMap, HashMap};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{FileExtentBody, FileExtentItem, RootItem};
use ubtrfs_format::key::Key;

/// An interned set of subvolumes.
pub(crate) type SetId = u32;

/// Sets of subvolumes, interned: snapshots make most blocks share the same few
/// sets, so a block holds one small id, and unions are memoised.
#[derive(Default)]
pub(crate) struct Sets {
    pub(crate) sets: Vec<Vec<u64>>,
    ids: HashMap<Vec<u64>, SetId>,
    unions: HashMap<(SetId, SetId), SetId>,
}

impl Sets {
    pub(crate) fn intern(&mut self, s: Vec<u64>) -> SetId {
        if let Some(&id) = self.ids.get(&s) {
            return id;
        }
        let id = self.sets.len() as SetId;
        self.sets.push(s.clone());
        self.ids.insert(s, id);
        id
    }
    pub(crate) fn union(&mut self, a: SetId, b: SetId) -> SetId {
        if a == b {
            return a;
        }
        let key = (a.min(b), a.max(b));
        if let Some(&u) = self.unions.get(&key) {
            return u;
        }
        let mut v: Vec<u64> = self.sets[a as usize]
            .iter()
            .chain(self.sets[b as usize].iter())
            .copied()
            .collect();
        v.sort_unstable();
        v.dedup();
        let u = self.intern(v);
        self.unions.insert(key, u);
        u
    }
}

/// Bytes per distinct set of subvolumes that reach them.
#[derive(Debug, Default)]
pub struct Sharing {
    /// (subvolumes, bytes), subvolume lists sorted.
    pub by_set: Vec<(Vec<u64>, u64)>,
    /// The data part of `by_set`: (subvolumes, bytes of data extents).
    pub data_by_set: Vec<(Vec<u64>, u64)>,
    /// The live subvolumes, by id.
    pub subvolumes: Vec<u64>,
    /// Tree blocks read.
    pub tree_blocks: u64,
    /// Data extents seen.
    pub data_extents: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
/// One subvolume's numbers, as `btrfs qgroup show --raw` gives them after a rescan.
pub struct QgroupNumbers {
    /// Subvolume id (its level-0 qgroup 0/id).
    pub subvol: u64,
    /// Bytes reachable from the subvolume.
    pub referenced: u64,
    /// Bytes reachable only from it.
    pub exclusive: u64,
}

impl Sharing {
    /// Referenced and exclusive bytes of every subvolume.
    pub fn numbers(&self) -> Vec<QgroupNumbers> {
        let mut out: BTreeMap<u64, QgroupNumbers> = self
            .subvolumes
            .iter()
            .map(|&s| {
                (
                    s,
                    QgroupNumbers {
                        subvol: s,
                        referenced: 0,
                        exclusive: 0,
                    },
                )
            })
            .collect();
        for (set, bytes) in &self.by_set {
            for r in set {
                if let Some(q) = out.get_mut(r) {
                    q.referenced += bytes;
                    if set.len() == 1 {
                        q.exclusive += bytes;
                    }
                }
            }
        }
        out.into_values().collect()
    }

    /// Bytes that deleting all of `subvols` together would free.
    pub fn freed_by(&self, subvols: &[u64]) -> u64 {
        freed_in(&self.by_set, subvols)
    }

    /// Data bytes that deleting all of `subvols` together would free: what the data
    /// block groups' used bytes drop by once their trees are dropped.
    pub fn data_freed_by(&self, subvols: &[u64]) -> u64 {
        freed_in(&self.data_by_set, subvols)
    }

    /// Data bytes reachable from subvolume `subvol`.
    pub fn data_referenced(&self, subvol: u64) -> u64 {
        self.data_by_set
            .iter()
            .filter(|(set, _)| set.contains(&subvol))
            .map(|(_, b)| b)
            .sum()
    }
}

fn freed_in(by_set: &[(Vec<u64>, u64)], subvols: &[u64]) -> u64 {
    by_set
        .iter()
        .filter(|(set, _)| set.iter().all(|r| subvols.contains(r)))
        .map(|(_, b)| b)
        .sum()
}

/// Subvolume trees that count: the top level and every live subvolume/snapshot.
pub fn live_fs_roots(fs: &FsInfo) -> Result<Vec<(u64, RootItem)>> {
    let mut out = Vec::new();
    let rt = fs.root_tree_ptr();
    let iter = TreeIter::new(
        fs,
        &rt,
        Key::new(FS_TREE_OBJECTID, ROOT_ITEM_KEY, 0),
        Key::new(LAST_FREE_OBJECTID, ROOT_ITEM_KEY, u64::MAX),
    )?;
    for it in iter {
        let it = it?;
        let k = it.key();
        if k.ty != ROOT_ITEM_KEY
            || !(k.objectid == FS_TREE_OBJECTID || k.objectid >= FIRST_FREE_OBJECTID)
        {
            continue;
        }
        let r = RootItem::parse(it.data())
            .map_err(|e| Error::corrupt(format!("root tree {k}: {e}")))?;
        // Inside a commit the ROOT_ITEMs are written last: a tree moved in this
        // transaction has its current root in the cache.
        let r = fs.tree_roots.get(&k.objectid).cloned().unwrap_or(r);
        // Deleted subvolumes (refs 0, being dropped) no longer count.
        if r.refs == 0 || r.flags & ROOT_SUBVOL_DEAD != 0 {
            continue;
        }
        out.push((k.objectid, r));
    }
    Ok(out)
}

/// Tree blocks read ahead at once by the recount (at most this many held).
const READ_BATCH: usize = 4096;
/// Threads reading them.
const READ_THREADS: usize = 8;

/// One pass over all live subvolume trees.
pub fn compute_sharing(fs: &FsInfo) -> Result<Sharing> {
    let roots = live_fs_roots(fs)?;
    let mut sets = Sets::default();
    // Blocks waiting to be read, by level: bytenr -> (set, expectation).
    let mut levels: BTreeMap<u8, HashMap<u64, (SetId, Expect)>> = BTreeMap::new();
    for (id, item) in &roots {
        let ptr = root_ptr_of(*id, item);
        let s = sets.intern(vec![*id]);
        let top = read_root(fs, &ptr)?;
        levels.entry(top.level()).or_default().insert(
            ptr.bytenr,
            (
                s,
                Expect {
                    level: Some(ptr.level),
                    generation: Some(ptr.generation),
                    first_key: None,
                },
            ),
        );
    }
    let mut block_bytes: HashMap<SetId, u64> = HashMap::new();
    let mut data: HashMap<u64, (u64, SetId)> = HashMap::new();
    let mut tree_blocks = 0u64;
    // Highest level first: every parent of a level-L block is at level L+1, so its
    // set is final before the block is read.
    while let Some((&level, _)) = levels.iter().next_back() {
        // In address order, a batch at a time read on several threads: a cold
        // device serves many requests at once, and nearby blocks in turn.
        let mut blocks: Vec<(u64, (SetId, Expect))> = levels
            .remove(&level)
            .unwrap_or_default()
            .into_iter()
            .collect();
        blocks.sort_unstable_by_key(|(b, _)| *b);
        let mut read = Vec::new();
        for (i, &(bytenr, (set, _))) in blocks.iter().enumerate() {
            if i % READ_BATCH == 0 {
                let end = (i + READ_BATCH).min(blocks.len());
                let want: Vec<(u64, Expect)> =
                    blocks[i..end].iter().map(|&(b, (_, e))| (b, e)).collect();
                read = read_tree_blocks(fs, &want, READ_THREADS);
                read.reverse();
            }
            *block_bytes.entry(set).or_default() += fs.nodesize as u64;
            tree_blocks += 1;
            let b = read
                .pop()
                .ok_or_else(|| Error::corrupt("internal: a batch read came back short"))??;
            let v = b.view();
            if level > 0 {
                let children = levels.entry(level - 1).or_default();
                for i in 0..b.nritems() {
                    let p = v
                        .key_ptr(i)
                        .map_err(|e| Error::corrupt(format!("tree block {bytenr}: {e}")))?;
                    let e = Expect {
                        level: Some(level - 1),
                        generation: Some(p.generation),
                        first_key: Some(p.key),
                    };
                    match children.get_mut(&p.blockptr) {
                        Some(c) => c.0 = sets.union(c.0, set),
                        None => {
                            children.insert(p.blockptr, (set, e));
                        }
                    }
                }
                continue;
            }
            for (disk_bytenr, disk_num_bytes) in leaf_data_extents(&b)? {
                match data.get_mut(&disk_bytenr) {
                    Some(x) => x.1 = sets.union(x.1, set),
                    None => {
                        data.insert(disk_bytenr, (disk_num_bytes, set));
                    }
                }
            }
        }
    }
    let mut bytes: HashMap<SetId, u64> = block_bytes;
    let mut data_bytes: HashMap<SetId, u64> = HashMap::new();
    let data_extents = data.len() as u64;
    for (_, (len, set)) in data {
        *bytes.entry(set).or_default() += len;
        *data_bytes.entry(set).or_default() += len;
    }
    let listed = |m: HashMap<SetId, u64>| {
        let mut v: Vec<(Vec<u64>, u64)> = m
            .into_iter()
            .map(|(s, b)| (sets.sets[s as usize].clone(), b))
            .collect();
        v.sort();
        v
    };
    let by_set = listed(bytes);
    let data_by_set = listed(data_bytes);
    Ok(Sharing {
        by_set,
        data_by_set,
        subvolumes: roots.iter().map(|(id, _)| *id).collect(),
        tree_blocks,
        data_extents,
    })
}

/// The data extents a leaf's file extent items point at: (disk bytenr, on-disk
/// length), holes and inline extents left out.
pub(crate) fn leaf_data_extents(b: &crate::tree::TreeBlock) -> Result<Vec<(u64, u64)>> {
    Ok(leaf_file_extents(b)?
        .into_iter()
        .map(|(_, x, len)| (x, len))
        .collect())
}

/// [`leaf_data_extents`] with the slot of each item: (slot, disk bytenr, on-disk
/// length).
pub(crate) fn leaf_file_extents(b: &crate::tree::TreeBlock) -> Result<Vec<(usize, u64, u64)>> {
    let v = b.view();
    let bytenr = b.bytenr;
    let mut out = Vec::new();
    for i in 0..b.nritems() {
        let k = v
            .item_key(i)
            .map_err(|e| Error::corrupt(format!("tree block {bytenr}: {e}")))?;
        if k.ty != EXTENT_DATA_KEY {
            continue;
        }
        let d = v
            .item_data(i)
            .map_err(|e| Error::corrupt(format!("tree block {bytenr}: {e}")))?;
        let fe = FileExtentItem::parse(d)
            .map_err(|e| Error::corrupt(format!("tree block {bytenr} {k}: {e}")))?;
        if let FileExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            ..
        } = fe.body
        {
            if disk_bytenr != 0 {
                out.push((i, disk_bytenr, disk_num_bytes));
            }
        }
    }
    Ok(out)
}
