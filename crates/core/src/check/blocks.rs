//! Every tree block, once, every copy: checksum, header, the tree checker, the owner,
//! and keys inside the range the parent gives. While walking, the references each
//! block and each file extent item implies are collected in the form the extent tree
//! must hold them (btrfs check's rule: a child of a FULL_BACKREF block is referenced
//! by the block's address, any other by the tree owning the parent).

use super::refstore::RefStore;
use super::{Findings, Progress};
use crate::error::Result;
use crate::io::disk_io::{hex, FsInfo};
use crate::tree::ctree::TreeIter;
use crate::tree::tree_checker::{check_block, check_header, Expect};
use std::collections::{BTreeSet, HashMap, HashSet};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{ExtentItem, FileExtentBody, FileExtentItem, RootItem, RootRef};
use ubtrfs_format::key::Key;
use ubtrfs_format::tree::{leaf_data_size, node_ptrs_max, BlockView};

/// A reference the extent tree must hold, in the order extent items list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum RefKind {
    /// TREE_BLOCK_REF: a tree block referenced by a tree.
    Tree(u64),
    /// SHARED_BLOCK_REF: a tree block referenced by its parent's address.
    Shared(u64),
    /// EXTENT_DATA_REF (root, inode, file offset of the extent's start).
    Data(u64, u64, u64),
    /// SHARED_DATA_REF: data referenced by a leaf's address.
    SharedData(u64),
}

impl RefKind {
    pub(super) fn is_data(&self) -> bool {
        matches!(self, RefKind::Data(..) | RefKind::SharedData(_))
    }
}

impl std::fmt::Display for RefKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefKind::Tree(r) => write!(f, "tree block ref (root {})", *r as i64),
            RefKind::Shared(p) => write!(f, "shared block ref (parent {p})"),
            RefKind::Data(r, i, o) => {
                write!(f, "data ref (root {} inode {i} offset {o})", *r as i64)
            }
            RefKind::SharedData(p) => write!(f, "shared data ref (parent {p})"),
        }
    }
}

/// One expected reference of the extent at `bytenr`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ExpRef {
    pub bytenr: u64,
    pub kind: RefKind,
    pub count: u32,
    /// Size of the extent: nodesize, or the file extent's disk_num_bytes.
    pub len: u64,
    /// Level of the tree block (data: [`DATA_LEVEL`]).
    pub level: u8,
    /// Where the reference was found (the parent block or leaf), for reports.
    pub from: u64,
}

pub(super) const DATA_LEVEL: u8 = u8::MAX;

/// What a tree holds, for the rules about its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TreeKind {
    Root,
    /// A subvolume, the data relocation tree or a relocation tree.
    Fs,
    Log,
    Other,
}

pub(super) fn tree_kind(id: u64) -> TreeKind {
    match id {
        ROOT_TREE_OBJECTID => TreeKind::Root,
        TREE_LOG_OBJECTID => TreeKind::Log,
        FS_TREE_OBJECTID | DATA_RELOC_TREE_OBJECTID | TREE_RELOC_OBJECTID => TreeKind::Fs,
        id if (FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&id) => TreeKind::Fs,
        _ => TreeKind::Other,
    }
}

/// What the walk of every tree leaves for the later phases.
#[derive(Default)]
pub(super) struct Walk {
    /// Expected references, read in (bytenr, kind) order once the walk is done
    /// (spilled to a temporary file above a memory limit).
    pub refs: RefStore,
    /// Every ROOT_ITEM of the root tree.
    pub roots: Vec<(Key, RootItem)>,
    /// Every ROOT_REF and ROOT_BACKREF of the root tree.
    pub root_refs: Vec<(Key, RootRef)>,
    /// ORPHAN_ITEMs of the root tree: subvolumes being deleted.
    pub root_orphans: BTreeSet<u64>,
    /// Tree blocks no copy of which could be used.
    pub unreadable: u64,
    /// Tree blocks whose extent item has FULL_BACKREF.
    full_backref: HashSet<u64>,
}

struct Walker<'a> {
    fs: &'a FsInfo,
    /// Level and generation of every block seen (a block reached twice, through a
    /// snapshot, must look the same both times).
    visited: HashMap<u64, (u8, u64)>,
    collect_refs: bool,
}

struct Pending {
    bytenr: u64,
    expect: Expect,
    /// Keys of the block must be below this (the parent's next key).
    upper: Option<Key>,
    /// The reference the pointer to it implies.
    by: RefKind,
    from: u64,
}

/// Walks the log tree root and the log trees for structure (their blocks have no
/// extent items). False when there is no log.
pub(super) fn walk_log(fs: &FsInfo, f: &mut Findings) -> bool {
    if fs.sb.log_root == 0 {
        return false;
    }
    let mut w = Walker {
        fs,
        visited: HashMap::new(),
        collect_refs: false,
    };
    let mut walk = Walk::default();
    let root = Expect {
        level: Some(fs.sb.log_root_level),
        generation: None,
        first_key: None,
    };
    let mut logs = Vec::new();
    w.walk_tree(
        &mut walk,
        f,
        TREE_LOG_OBJECTID,
        fs.sb.log_root,
        root,
        None,
        &mut |k, r| logs.push((*k, r.clone())),
        &mut |_, _| {},
    );
    for (k, r) in logs {
        let e = Expect {
            level: Some(r.level),
            generation: Some(r.generation),
            first_key: None,
        };
        w.walk_tree(
            &mut walk,
            f,
            TREE_LOG_OBJECTID,
            r.bytenr,
            e,
            None,
            &mut |_, _| {},
            &mut |_, _| {},
        );
        let _ = k;
    }
    true
}

/// Walks every tree reachable from the superblock and the root tree.
pub(super) fn walk_all(
    fs: &FsInfo,
    refs_mem_bytes: usize,
    f: &mut Findings,
    progress: Progress<'_>,
) -> Result<Walk> {
    let mut walk = Walk {
        full_backref: full_backref_blocks(fs, f),
        refs: RefStore::new(refs_mem_bytes),
        ..Walk::default()
    };
    let mut w = Walker {
        fs,
        visited: HashMap::new(),
        collect_refs: true,
    };
    let chunk = Expect {
        level: Some(fs.sb.chunk_root_level),
        generation: Some(fs.sb.chunk_root_generation),
        first_key: None,
    };
    let mut blocks = 0u64;
    let mut tick = |w: &Walker<'_>| {
        let n = w.visited.len() as u64;
        if n >= blocks + 1024 {
            blocks = n;
            progress(1, n);
        }
    };
    w.walk_tree(
        &mut walk,
        f,
        CHUNK_TREE_OBJECTID,
        fs.sb.chunk_root,
        chunk,
        None,
        &mut |_, _| {},
        &mut |_, _| {},
    );
    let root = Expect {
        level: Some(fs.sb.root_level),
        generation: Some(fs.sb.generation),
        first_key: None,
    };
    let mut roots = Vec::new();
    let mut refs = Vec::new();
    let mut orphans = BTreeSet::new();
    w.walk_tree(
        &mut walk,
        f,
        ROOT_TREE_OBJECTID,
        fs.sb.root,
        root,
        None,
        &mut |k, r| roots.push((*k, r.clone())),
        &mut |k, data| {
            if k.ty == ROOT_REF_KEY || k.ty == ROOT_BACKREF_KEY {
                if let Ok(r) = RootRef::parse(data) {
                    refs.push((*k, r));
                }
            } else if k.ty == ORPHAN_ITEM_KEY && k.objectid == ORPHAN_OBJECTID {
                orphans.insert(k.offset);
            }
        },
    );
    tick(&w);
    for (k, r) in &roots {
        let id = k.objectid;
        let e = Expect {
            level: Some(r.level),
            generation: Some(r.generation),
            first_key: None,
        };
        let drop = (r.drop_progress.objectid != 0).then_some(r.drop_progress);
        w.walk_tree(
            &mut walk,
            f,
            id,
            r.bytenr,
            e,
            drop,
            &mut |_, _| {},
            &mut |_, _| {},
        );
        tick(&w);
    }
    walk.roots = roots;
    walk.root_refs = refs;
    walk.root_orphans = orphans;
    walk.refs.finish()?;
    f.stats().tree_blocks = w.visited.len() as u64;
    Ok(walk)
}

/// Tree blocks whose extent item carries FULL_BACKREF (read first: the form of every
/// reference below such a block depends on it).
fn full_backref_blocks(fs: &FsInfo, f: &mut Findings) -> HashSet<u64> {
    let mut out = HashSet::new();
    let Some(ptr) = fs.tree_ptr(EXTENT_TREE_OBJECTID) else {
        return out;
    };
    let res = (|| -> Result<()> {
        for item in TreeIter::new(fs, &ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            if k.ty != METADATA_ITEM_KEY && k.ty != EXTENT_ITEM_KEY {
                continue;
            }
            if let Ok(e) = ExtentItem::parse(k.ty, item.data()) {
                if e.flags & BLOCK_FLAG_FULL_BACKREF != 0 {
                    out.insert(k.objectid);
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = res {
        f.add(
            "block-structure",
            Some(EXTENT_TREE_OBJECTID),
            None,
            None,
            format!("the extent tree cannot be read through: {e}"),
        );
    }
    out
}

impl Walker<'_> {
    #[allow(clippy::too_many_arguments)]
    fn walk_tree(
        &mut self,
        walk: &mut Walk,
        f: &mut Findings,
        tree: u64,
        bytenr: u64,
        expect: Expect,
        drop: Option<Key>,
        on_root: &mut dyn FnMut(&Key, &RootItem),
        on_item: &mut dyn FnMut(&Key, &[u8]),
    ) {
        let kind = tree_kind(tree);
        let mut stack = vec![Pending {
            bytenr,
            expect,
            upper: None,
            by: RefKind::Tree(tree),
            from: 0,
        }];
        while let Some(p) = stack.pop() {
            let level = p.expect.level.unwrap_or(0);
            if self.collect_refs && kind != TreeKind::Log {
                walk.refs.push(ExpRef {
                    bytenr: p.bytenr,
                    kind: p.by,
                    count: 1,
                    len: self.fs.nodesize as u64,
                    level,
                    from: p.from,
                });
            }
            if let Some(&(l, g)) = self.visited.get(&p.bytenr) {
                if Some(l) != p.expect.level || p.expect.generation.is_some_and(|eg| eg != g) {
                    f.add(
                        "block-header",
                        Some(tree),
                        Some(p.bytenr),
                        None,
                        format!(
                            "reached again with level {:?} generation {:?}, but it has level {l} generation {g}",
                            p.expect.level, p.expect.generation
                        ),
                    );
                }
                continue;
            }
            let Some(data) = self.read_copies(f, tree, p.bytenr, &p.expect) else {
                self.visited
                    .insert(p.bytenr, (level, p.expect.generation.unwrap_or(0)));
                walk.unreadable += 1;
                continue;
            };
            let v = BlockView::new(&data);
            self.visited.insert(p.bytenr, (v.level(), v.generation()));
            self.check_owner(f, tree, kind, p.bytenr, v.owner());
            let ns = self.fs.nodesize;
            // A block whose header claims more items than fit (reported when it
            // was read) is walked only as far as its bytes go: never 2^32 loop
            // turns or a child list that size.
            let fit = if v.level() > 0 {
                node_ptrs_max(ns)
            } else {
                (ns as usize).saturating_sub(HEADER_SIZE) / ITEM_SIZE
            };
            let n = (v.nritems() as usize).min(fit);
            if kind != TreeKind::Log {
                let st = f.stats();
                st.tree_bytes += ns as u64;
                if kind == TreeKind::Fs {
                    st.fs_tree_bytes += ns as u64;
                }
                if tree == EXTENT_TREE_OBJECTID {
                    st.extent_tree_bytes += ns as u64;
                }
            }
            if n > 0 {
                if let (Some(u), Ok(last)) = (p.upper, v.key_at(n - 1)) {
                    if last >= u {
                        f.add(
                            "block-structure",
                            Some(tree),
                            Some(p.bytenr),
                            Some(last),
                            format!("last key {last} is not below the parent's next key {u}"),
                        );
                    }
                }
            }
            if v.level() > 0 {
                f.stats().btree_space_waste +=
                    ((node_ptrs_max(ns) - n.min(node_ptrs_max(ns))) * KEY_PTR_SIZE) as u64;
                let by = if walk.full_backref.contains(&p.bytenr) {
                    RefKind::Shared(p.bytenr)
                } else {
                    RefKind::Tree(v.owner())
                };
                let mut children = Vec::with_capacity(n);
                for i in 0..n {
                    let Ok(ptr) = v.key_ptr(i) else { continue };
                    let next = if i + 1 < n {
                        v.key_ptr(i + 1).ok().map(|q| q.key)
                    } else {
                        p.upper
                    };
                    // A half-dropped subvolume: everything left of drop_progress is
                    // gone already (its references dropped with it).
                    if let (Some(d), Some(nk)) = (drop, next) {
                        if nk <= d {
                            continue;
                        }
                    }
                    children.push(Pending {
                        bytenr: ptr.blockptr,
                        expect: Expect {
                            level: Some(v.level() - 1),
                            generation: Some(ptr.generation),
                            first_key: Some(ptr.key),
                        },
                        upper: next,
                        by,
                        from: p.bytenr,
                    });
                }
                stack.extend(children.into_iter().rev());
            } else {
                self.leaf(walk, f, tree, kind, p.bytenr, &v, n, on_root, on_item);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn leaf(
        &self,
        walk: &mut Walk,
        f: &mut Findings,
        tree: u64,
        kind: TreeKind,
        bytenr: u64,
        v: &BlockView<'_>,
        n: usize,
        on_root: &mut dyn FnMut(&Key, &RootItem),
        on_item: &mut dyn FnMut(&Key, &[u8]),
    ) {
        let mut used = 0usize;
        let shared = walk.full_backref.contains(&bytenr);
        for i in 0..n {
            let (Ok(it), Ok(data)) = (v.item(i), v.item_data(i)) else {
                continue;
            };
            used += it.size as usize + ITEM_SIZE;
            let k = it.key;
            match (kind, k.ty) {
                (TreeKind::Root | TreeKind::Log, ROOT_ITEM_KEY) => match RootItem::parse(data) {
                    Ok(r) => on_root(&k, &r),
                    Err(e) => f.add(
                        "root-item",
                        Some(tree),
                        Some(bytenr),
                        Some(k),
                        format!("undecodable: {e}"),
                    ),
                },
                (TreeKind::Fs, EXTENT_DATA_KEY) if self.collect_refs => {
                    let Ok(fe) = FileExtentItem::parse(data) else {
                        continue;
                    };
                    let FileExtentBody::Regular {
                        disk_bytenr,
                        disk_num_bytes,
                        offset,
                        num_bytes,
                    } = fe.body
                    else {
                        continue;
                    };
                    if disk_bytenr == 0 {
                        continue;
                    }
                    let st = f.stats();
                    st.data_bytes_allocated =
                        st.data_bytes_allocated.saturating_add(disk_num_bytes);
                    st.data_bytes_referenced = st.data_bytes_referenced.saturating_add(num_bytes);
                    let ref_kind = if shared {
                        RefKind::SharedData(bytenr)
                    } else {
                        RefKind::Data(v.owner(), k.objectid, k.offset.wrapping_sub(offset))
                    };
                    walk.refs.push(ExpRef {
                        bytenr: disk_bytenr,
                        kind: ref_kind,
                        count: 1,
                        len: disk_num_bytes,
                        level: DATA_LEVEL,
                        from: bytenr,
                    });
                }
                _ => {}
            }
            on_item(&k, data);
        }
        f.stats().btree_space_waste += leaf_data_size(self.fs.nodesize).saturating_sub(used) as u64;
    }

    fn check_owner(&self, f: &mut Findings, tree: u64, kind: TreeKind, bytenr: u64, owner: u64) {
        let ok = match kind {
            TreeKind::Fs => matches!(tree_kind(owner), TreeKind::Fs),
            TreeKind::Log => owner == TREE_LOG_OBJECTID,
            _ => owner == tree,
        };
        if !ok {
            f.add(
                "block-header",
                Some(tree),
                Some(bytenr),
                None,
                format!(
                    "owner {} does not belong in tree {}",
                    owner as i64, tree as i64
                ),
            );
        }
    }

    /// Reads and verifies every copy; reports each bad one; returns a good one.
    fn read_copies(
        &self,
        f: &mut Findings,
        tree: u64,
        bytenr: u64,
        expect: &Expect,
    ) -> Option<Vec<u8>> {
        let fs = self.fs;
        if bytenr == 0 || !bytenr.is_multiple_of(fs.sectorsize as u64) {
            f.add(
                "block-header",
                Some(tree),
                Some(bytenr),
                None,
                "pointer to an unaligned address".into(),
            );
            return None;
        }
        let mirrors = match fs.num_mirrors(bytenr) {
            Ok(m) => m,
            Err(e) => {
                f.add(
                    "block-header",
                    Some(tree),
                    Some(bytenr),
                    None,
                    e.to_string(),
                );
                return None;
            }
        };
        let ctx = fs.check_ctx();
        let mut good = None;
        // A copy whose checksum and header are right but whose items break a rule is
        // still walked (BlockView is bounds-checked), so one bad item does not hide
        // the rest of the leaf; a fully good copy is preferred.
        let mut usable = None;
        for m in 0..mirrors {
            let copy = if mirrors > 1 {
                format!("copy {}: ", m + 1)
            } else {
                String::new()
            };
            let mut data = vec![0u8; fs.nodesize as usize];
            if let Err(e) = fs.read_logical(bytenr, &mut data, m) {
                f.add(
                    "block-csum",
                    Some(tree),
                    Some(bytenr),
                    None,
                    format!("{copy}{e}"),
                );
                continue;
            }
            let n = fs.csum_type.size();
            let found = fs.csum_type.compute(&data[CSUM_SIZE_MAX..]);
            if found[..n] != data[..n] {
                f.add(
                    "block-csum",
                    Some(tree),
                    Some(bytenr),
                    None,
                    format!(
                        "{copy}checksum mismatch (stored {}, computed {})",
                        hex(&data[..n]),
                        hex(&found[..n])
                    ),
                );
                continue;
            }
            if let Err(e) = check_header(&ctx, bytenr, &data, expect) {
                f.add(
                    "block-header",
                    Some(tree),
                    Some(bytenr),
                    None,
                    format!("{copy}{e}"),
                );
                continue;
            }
            if let Err(e) = check_block(&ctx, bytenr, &data, expect) {
                let msg = e.to_string();
                let rule = if msg.contains("parent expects") {
                    "first-key"
                } else {
                    "block-structure"
                };
                f.add(rule, Some(tree), Some(bytenr), None, format!("{copy}{msg}"));
                usable.get_or_insert(data);
                continue;
            }
            if good.is_none() {
                good = Some(data);
            }
        }
        good.or(usable)
    }
}
