//! Subvolume trees, item by item: every inode against its names (nlink), its directory
//! entries (size, DIR_ITEM and DIR_INDEX for each INODE_REF/INODE_EXTREF and back),
//! its file extents (order, overlap, holes without NO_HOLES, nbytes) and orphan items.
//! Names are matched after the tree is read, from compact facts sorted by (parent,
//! child, name), so no inode's items are held.

use super::blocks::{tree_kind, TreeKind, Walk};
use super::{Findings, Progress};
use crate::error::Result;
use crate::fs::{
    Filesystem, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
use crate::io::root_tree::root_ptr_of;
use crate::tree::ctree::TreeIter;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::{extref_hash, name_hash};
use ubtrfs_format::items::{
    parse_dir_items, parse_inode_extrefs, parse_inode_refs, FileExtentBody, FileExtentItem,
    InodeItem, RootItem,
};
use ubtrfs_format::key::Key;

/// A directory entry that names a subvolume (location is a ROOT_ITEM key).
#[derive(Clone, Debug)]
pub(super) struct SubvolEntry {
    pub tree: u64,
    pub dirid: u64,
    pub child: u64,
    /// DIR_INDEX: its index; DIR_ITEM: `None`.
    pub index: Option<u64>,
    pub name: Vec<u8>,
}

/// What the fs-roots phase leaves for the checksum and root-ref phases.
#[derive(Default)]
pub(super) struct FsRoots {
    /// Data ranges file extents need checksums for, sorted and merged.
    pub csum_need: Vec<(u64, u64)>,
    /// Data ranges that must have no checksums (nodatasum files, prealloc), with the
    /// tree and inode that say so; sorted.
    pub csum_forbid: Vec<(u64, u64, u64, u64)>,
    /// Directory entries naming subvolumes.
    pub subvol_entries: Vec<SubvolEntry>,
    /// Subvolume trees read to the end.
    pub checked: BTreeSet<u64>,
}

const FACT_REF: u8 = 0;
const FACT_ITEM: u8 = 1;
const FACT_INDEX: u8 = 2;

/// One side of a name: an inode's ref, or a directory's DIR_ITEM or DIR_INDEX.
#[derive(Clone, Copy, Debug)]
struct Fact {
    parent: u64,
    child: u64,
    name_h: u64,
    kind: u8,
    index: u64,
    ty: u8,
    /// The leaf holding it, for reports.
    block: u64,
}

#[derive(Default)]
struct Ino {
    ino: u64,
    item: Option<InodeItem>,
    block: u64,
    names: u32,
    dir_size: u64,
    nbytes: u64,
    ext_end: u64,
    has_extents: bool,
    has_items: bool,
}

struct TreeCheck<'a> {
    tree: u64,
    root_dirid: u64,
    no_holes: bool,
    sectorsize: u64,
    facts: Vec<Fact>,
    /// (inode, file type) of every inode, in inode order.
    types: Vec<(u64, u8)>,
    /// Inodes with no name and nlink 0: they need an orphan item.
    unlinked: Vec<(u64, u64)>,
    orphans: BTreeSet<u64>,
    out: &'a mut FsRoots,
}

/// A 64-bit hash of a name, to match the three sides of a name without keeping it
/// (xxhash64: several times faster than the std hasher on short names).
fn hash_name(name: &[u8]) -> u64 {
    ubtrfs_format::csum::xxh64(name)
}

pub(super) fn file_type(mode: u32) -> u8 {
    match mode & S_IFMT {
        S_IFREG => FT_REG_FILE,
        S_IFDIR => FT_DIR,
        S_IFLNK => FT_SYMLINK,
        S_IFCHR => FT_CHRDEV,
        S_IFBLK => FT_BLKDEV,
        S_IFIFO => FT_FIFO,
        S_IFSOCK => FT_SOCK,
        _ => FT_UNKNOWN,
    }
}

/// Checks every live subvolume tree. The trees are independent, so they are
/// checked on up to [`FS_ROOT_THREADS_MAX`] threads (the calling one included,
/// which alone reports progress); each tree's findings are kept apart and merged in
/// tree order, so the report is the same however the work was shared.
pub(super) fn check_fs_roots(
    fs: &Filesystem,
    walk: &Walk,
    f: &mut Findings,
    progress: Progress<'_>,
) -> FsRoots {
    let trees: Vec<(u64, &RootItem)> = walk
        .roots
        .iter()
        .filter(|(k, r)| {
            tree_kind(k.objectid) == TreeKind::Fs
                && k.objectid != TREE_RELOC_OBJECTID
                && r.refs != 0
        })
        .map(|(k, r)| (k.objectid, r))
        .collect();
    let items = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    // Snapshots are about the size of the tree they were taken of: the last
    // tree's counts size the next one's lists, instead of growth by doubling
    // (which can leave half of the largest lists unused, in two trees at once).
    let sizes = (AtomicUsize::new(0), AtomicUsize::new(0));
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, FS_ROOT_THREADS_MAX);
    // Each worker takes the next tree until none is left.
    let work = |report: &mut dyn FnMut(u64)| {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(id, r)) = trees.get(i) else {
                return done;
            };
            done.push((i, check_tree(fs, id, r, &items, &sizes, report)));
        }
    };
    let mut results = std::thread::scope(|sc| {
        let helpers: Vec<_> = (1..threads)
            .map(|_| sc.spawn(|| work(&mut |_| {})))
            .collect();
        let mut all = work(&mut |n| progress(4, n));
        for h in helpers {
            // A worker only panics on a bug; its trees are then reported unread.
            if let Ok(v) = h.join() {
                all.extend(v);
            }
        }
        all
    });
    results.sort_unstable_by_key(|(i, _)| *i);
    let mut out = FsRoots::default();
    let mut seen = BTreeSet::new();
    for (i, (part, findings)) in results {
        seen.insert(i);
        f.absorb(findings);
        out.csum_need.extend(part.csum_need);
        out.csum_forbid.extend(part.csum_forbid);
        out.subvol_entries.extend(part.subvol_entries);
        out.checked.extend(part.checked);
    }
    for (i, &(id, _)) in trees.iter().enumerate() {
        if !seen.contains(&i) {
            f.add(
                "block-structure",
                Some(id),
                None,
                None,
                "internal: the tree's check did not finish".into(),
            );
        }
    }
    out.csum_need = merge(std::mem::take(&mut out.csum_need));
    out.csum_forbid.sort_unstable();
    out.csum_forbid.dedup();
    out
}

/// Most threads the subvolume trees are checked on.
const FS_ROOT_THREADS_MAX: usize = 4;

/// One subvolume tree, item by item, with findings of its own.
fn check_tree(
    fs: &Filesystem,
    id: u64,
    r: &RootItem,
    items: &AtomicU64,
    sizes: &(AtomicUsize, AtomicUsize),
    report: &mut dyn FnMut(u64),
) -> (FsRoots, Findings) {
    let hint = |n: &AtomicUsize| {
        let n = n.load(Ordering::Relaxed);
        n + n / 32
    };
    let mut f = Findings::new();
    let mut out = FsRoots::default();
    let mut t = TreeCheck {
        tree: id,
        root_dirid: r.root_dirid,
        no_holes: fs.info.sb.incompat_flags & FEATURE_INCOMPAT_NO_HOLES != 0,
        sectorsize: fs.info.sectorsize as u64,
        facts: Vec::with_capacity(hint(&sizes.0)),
        types: Vec::with_capacity(hint(&sizes.1)),
        unlinked: Vec::new(),
        orphans: BTreeSet::new(),
        out: &mut out,
    };
    let ptr = root_ptr_of(id, r);
    match t.stream(fs, &ptr, &mut f, items, report) {
        Ok(()) => {
            sizes.0.store(t.facts.len(), Ordering::Relaxed);
            sizes.1.store(t.types.len(), Ordering::Relaxed);
            t.match_names(&mut f);
            t.check_orphans(&mut f);
            t.out.checked.insert(id);
        }
        Err(e) => f.add(
            "block-structure",
            Some(id),
            None,
            None,
            format!("the tree cannot be read to its end: {e}"),
        ),
    }
    // Bounded before the merge too (snapshots repeat the same extents).
    out.csum_need = merge(std::mem::take(&mut out.csum_need));
    (out, f)
}

/// Sorts and merges overlapping or touching ranges.
pub(super) fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, l) in v {
        match out.last_mut() {
            Some(p) if s <= p.0.saturating_add(p.1) => p.1 = p.1.max(s.saturating_add(l) - p.0),
            _ => out.push((s, l)),
        }
    }
    out
}

impl TreeCheck<'_> {
    fn stream(
        &mut self,
        fs: &Filesystem,
        ptr: &crate::tree::RootPtr,
        f: &mut Findings,
        items: &AtomicU64,
        report: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let mut cur = Ino::default();
        for item in TreeIter::new(&fs.info, ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            let n = items.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(65536) {
                report(n);
            }
            if k.objectid == ORPHAN_OBJECTID && k.ty == ORPHAN_ITEM_KEY {
                self.orphans.insert(k.offset);
                continue;
            }
            if !(FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&k.objectid) {
                continue;
            }
            if k.objectid != cur.ino {
                let done = std::mem::take(&mut cur);
                self.finish(done, f);
                cur.ino = k.objectid;
                cur.block = item.block.bytenr;
            }
            self.item(&mut cur, &k, item.data(), item.block.bytenr, f);
            // Keep the outstanding work bounded: a tree with more range entries than
            // this compacts them now (snapshots repeat the same extents).
            if self.out.csum_need.len() > (1 << 22) {
                self.out.csum_need = merge(std::mem::take(&mut self.out.csum_need));
            }
        }
        self.finish(cur, f);
        Ok(())
    }

    fn item(&mut self, cur: &mut Ino, k: &Key, data: &[u8], block: u64, f: &mut Findings) {
        let tree = Some(self.tree);
        let ino = k.objectid;
        if k.ty != INODE_ITEM_KEY {
            cur.has_items = true;
        }
        match k.ty {
            INODE_ITEM_KEY => {
                if let Ok(i) = InodeItem::parse(data) {
                    cur.block = block;
                    self.types.push((ino, file_type(i.mode)));
                    cur.item = Some(i);
                }
            }
            INODE_REF_KEY | INODE_EXTREF_KEY => {
                let refs = if k.ty == INODE_REF_KEY {
                    parse_inode_refs(k.offset, data)
                } else {
                    parse_inode_extrefs(data)
                };
                let ty = cur.item.as_ref().map_or(FT_UNKNOWN, |i| file_type(i.mode));
                for r in refs.unwrap_or_default() {
                    cur.names += 1;
                    if k.ty == INODE_EXTREF_KEY && extref_hash(r.parent, &r.name) != k.offset {
                        f.add(
                            "inode-ref",
                            tree,
                            Some(block),
                            Some(*k),
                            format!("extref name hash does not match parent {} name", r.parent),
                        );
                    }
                    // The root directory's ".." names itself; it has no entry.
                    if r.parent == ino && ino == self.root_dirid {
                        continue;
                    }
                    self.facts.push(Fact {
                        parent: r.parent,
                        child: ino,
                        name_h: hash_name(&r.name),
                        kind: FACT_REF,
                        index: r.index,
                        ty,
                        block,
                    });
                }
            }
            DIR_ITEM_KEY | DIR_INDEX_KEY => {
                let entries = parse_dir_items(data).unwrap_or_default();
                if k.ty == DIR_INDEX_KEY && entries.len() != 1 {
                    f.add(
                        "dir-item",
                        tree,
                        Some(block),
                        Some(*k),
                        format!("DIR_INDEX holds {} entries", entries.len()),
                    );
                }
                for e in entries {
                    cur.dir_size += e.name.len() as u64;
                    if k.ty == DIR_ITEM_KEY && name_hash(&e.name) != k.offset {
                        f.add(
                            "dir-item",
                            tree,
                            Some(block),
                            Some(*k),
                            "name does not hash to the key offset".into(),
                        );
                    }
                    let index = (k.ty == DIR_INDEX_KEY).then_some(k.offset);
                    match e.location.ty {
                        INODE_ITEM_KEY => self.facts.push(Fact {
                            parent: ino,
                            child: e.location.objectid,
                            name_h: hash_name(&e.name),
                            kind: if index.is_some() {
                                FACT_INDEX
                            } else {
                                FACT_ITEM
                            },
                            index: index.unwrap_or(u64::MAX),
                            ty: e.ty,
                            block,
                        }),
                        ROOT_ITEM_KEY => self.out.subvol_entries.push(SubvolEntry {
                            tree: self.tree,
                            dirid: ino,
                            child: e.location.objectid,
                            index,
                            name: e.name,
                        }),
                        t => f.add(
                            "dir-item",
                            tree,
                            Some(block),
                            Some(*k),
                            format!("entry points to a key of type {t}"),
                        ),
                    }
                }
            }
            EXTENT_DATA_KEY => self.file_extent(cur, k, data, block, f),
            _ => {}
        }
    }

    fn file_extent(&mut self, cur: &mut Ino, k: &Key, data: &[u8], block: u64, f: &mut Findings) {
        let tree = Some(self.tree);
        let Ok(fe) = FileExtentItem::parse(data) else {
            return;
        };
        let (end, nbytes) = match &fe.body {
            FileExtentBody::Inline { .. } => (k.offset.saturating_add(fe.ram_bytes), fe.ram_bytes),
            FileExtentBody::Regular {
                disk_bytenr,
                num_bytes,
                ..
            } => (
                k.offset.saturating_add(*num_bytes),
                if *disk_bytenr != 0 { *num_bytes } else { 0 },
            ),
        };
        if cur.has_extents && k.offset < cur.ext_end {
            f.add(
                "file-extent",
                tree,
                Some(block),
                Some(*k),
                format!(
                    "overlaps the previous extent of inode {} (ends at {})",
                    k.objectid, cur.ext_end
                ),
            );
        } else if !self.no_holes && k.offset > cur.ext_end {
            // The kernel writes hole items without NO_HOLES, but reads a gap as a
            // hole all the same, and btrfs check passes it: a note, not a problem.
            f.note(format!(
                "tree {} block {block} {k}: inode {}: no extent for {}..{} and the \
                 filesystem has no NO_HOLES (read as a hole)",
                self.tree, k.objectid, cur.ext_end, k.offset
            ));
        }
        cur.has_extents = true;
        cur.ext_end = cur.ext_end.max(end);
        cur.nbytes = cur.nbytes.saturating_add(nbytes);
        if let FileExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } = fe.body
        {
            if disk_bytenr == 0 || num_bytes == 0 {
                return;
            }
            let flags = cur.item.as_ref().map_or(0, |i| i.flags);
            let range = if fe.compression != 0 {
                (disk_bytenr, disk_num_bytes)
            } else {
                (disk_bytenr.saturating_add(offset), num_bytes)
            };
            if fe.ty == FILE_EXTENT_PREALLOC || flags & INODE_NODATASUM != 0 {
                self.out
                    .csum_forbid
                    .push((range.0, range.1, self.tree, k.objectid));
            } else {
                self.out.csum_need.push(range);
            }
        }
        let _ = self.sectorsize;
    }

    fn finish(&mut self, cur: Ino, f: &mut Findings) {
        if cur.ino == 0 {
            return;
        }
        let tree = Some(self.tree);
        let Some(i) = cur.item else {
            if cur.has_items {
                f.add(
                    "inode-missing",
                    tree,
                    Some(cur.block),
                    Some(Key::new(cur.ino, INODE_ITEM_KEY, 0)),
                    format!("inode {} has items but no INODE_ITEM", cur.ino),
                );
            }
            return;
        };
        let key = Some(Key::new(cur.ino, INODE_ITEM_KEY, 0));
        if i.nlink != cur.names {
            if cur.names == 0 && i.nlink == 0 {
                self.unlinked.push((cur.ino, cur.block));
            } else {
                f.add(
                    "inode-nlink",
                    tree,
                    Some(cur.block),
                    key,
                    format!(
                        "inode {} has nlink {} but {} names",
                        cur.ino, i.nlink, cur.names
                    ),
                );
            }
        } else if cur.names == 0 {
            self.unlinked.push((cur.ino, cur.block));
        }
        let ft = file_type(i.mode);
        if ft == FT_DIR && i.size != cur.dir_size {
            f.add(
                "inode-isize",
                tree,
                Some(cur.block),
                key,
                format!(
                    "directory {} has size {} but its entries' names add up to {}",
                    cur.ino, i.size, cur.dir_size
                ),
            );
        }
        if ft != FT_DIR && cur.dir_size > 0 {
            f.add(
                "dir-item",
                tree,
                Some(cur.block),
                key,
                format!(
                    "inode {} is not a directory but has directory entries",
                    cur.ino
                ),
            );
        }
        // mkfs gives the root directory nbytes of one node; directories own no
        // extents, so only files and symlinks are compared (as btrfs check does).
        if ft != FT_DIR && i.nbytes != cur.nbytes {
            f.add(
                "inode-nbytes",
                tree,
                Some(cur.block),
                key,
                format!(
                    "inode {} has nbytes {} but its extents add up to {}",
                    cur.ino, i.nbytes, cur.nbytes
                ),
            );
        }
        if cur.has_extents && ft != FT_REG_FILE && ft != FT_SYMLINK {
            f.add(
                "file-extent",
                tree,
                Some(cur.block),
                key,
                format!("inode {} has file extents but is not a file", cur.ino),
            );
        }
    }

    fn child_type(&self, ino: u64) -> Option<u8> {
        self.types
            .binary_search_by_key(&ino, |t| t.0)
            .ok()
            .map(|i| self.types[i].1)
    }

    /// Every name seen from both sides: the inode's ref, the DIR_ITEM, the DIR_INDEX.
    fn match_names(&mut self, f: &mut Findings) {
        let mut facts = std::mem::take(&mut self.facts);
        facts.sort_unstable_by_key(|x| (x.parent, x.child, x.name_h, x.kind, x.index));
        let tree = Some(self.tree);
        let mut i = 0;
        while i < facts.len() {
            let a = facts[i];
            let mut j = i;
            while j < facts.len()
                && (facts[j].parent, facts[j].child, facts[j].name_h)
                    == (a.parent, a.child, a.name_h)
            {
                j += 1;
            }
            let g = &facts[i..j];
            i = j;
            let refs: Vec<&Fact> = g.iter().filter(|x| x.kind == FACT_REF).collect();
            let items: Vec<&Fact> = g.iter().filter(|x| x.kind == FACT_ITEM).collect();
            let idxs: Vec<&Fact> = g.iter().filter(|x| x.kind == FACT_INDEX).collect();
            let child_ty = self.child_type(a.child);
            if let Some(r) = refs.first() {
                let rkey = Some(Key::new(a.child, INODE_REF_KEY, a.parent));
                match self.child_type(a.parent) {
                    Some(FT_DIR) => {}
                    Some(_) => f.add(
                        "inode-ref",
                        tree,
                        Some(r.block),
                        rkey,
                        format!(
                            "inode {} is named in {}, which is not a directory",
                            a.child, a.parent
                        ),
                    ),
                    None => f.add(
                        "inode-ref",
                        tree,
                        Some(r.block),
                        rkey,
                        format!(
                            "inode {} is named in {}, which does not exist",
                            a.child, a.parent
                        ),
                    ),
                }
                for r in &refs {
                    if !idxs.iter().any(|x| x.index == r.index) {
                        f.add(
                            "inode-ref",
                            tree,
                            Some(r.block),
                            rkey,
                            format!(
                                "inode {}'s name in {} (index {}) has no DIR_INDEX",
                                a.child, a.parent, r.index
                            ),
                        );
                    }
                }
                if items.is_empty() {
                    f.add(
                        "inode-ref",
                        tree,
                        Some(r.block),
                        rkey,
                        format!("inode {}'s name in {} has no DIR_ITEM", a.child, a.parent),
                    );
                }
            }
            for d in items.iter().chain(idxs.iter()) {
                let (ty, off) = if d.kind == FACT_INDEX {
                    (DIR_INDEX_KEY, d.index)
                } else {
                    (DIR_ITEM_KEY, 0)
                };
                let dkey = Some(Key::new(a.parent, ty, off));
                let what = if d.kind == FACT_INDEX {
                    "DIR_INDEX"
                } else {
                    "DIR_ITEM"
                };
                match child_ty {
                    None => f.add(
                        "dir-item",
                        tree,
                        Some(d.block),
                        dkey,
                        format!(
                            "{what} in {} points to inode {}, which does not exist",
                            a.parent, a.child
                        ),
                    ),
                    Some(ct) => {
                        if refs.is_empty() {
                            f.add(
                                "dir-item",
                                tree,
                                Some(d.block),
                                dkey,
                                format!(
                                    "{what} in {} names inode {}, which has no INODE_REF for it",
                                    a.parent, a.child
                                ),
                            );
                        } else if d.kind == FACT_INDEX && !refs.iter().any(|r| r.index == d.index) {
                            f.add(
                                "dir-item",
                                tree,
                                Some(d.block),
                                dkey,
                                format!(
                                    "DIR_INDEX {} in {} names inode {}, whose ref says another index",
                                    d.index, a.parent, a.child
                                ),
                            );
                        }
                        if d.ty != ct {
                            f.add(
                                "dir-item",
                                tree,
                                Some(d.block),
                                dkey,
                                format!(
                                    "{what} in {} says type {} for inode {}, which is of type {ct}",
                                    a.parent, d.ty, a.child
                                ),
                            );
                        }
                    }
                }
            }
        }
    }

    fn check_orphans(&mut self, f: &mut Findings) {
        for &(ino, block) in &self.unlinked {
            if !self.orphans.contains(&ino) {
                f.add(
                    "orphan",
                    Some(self.tree),
                    Some(block),
                    Some(Key::new(ino, INODE_ITEM_KEY, 0)),
                    format!("inode {ino} has no name and no orphan item"),
                );
            }
        }
    }
}
