//! The extent tree against the references the trees imply (streamed in address
//! order, merged with the sorted references), block groups against chunks and what
//! their extents use, and the free-space tree against the extent tree.

use super::blocks::{ExpRef, RefKind, Walk, DATA_LEVEL};
use super::refstore::{merged, Ranges};
use super::spill::SpillIter;
use super::{Findings, Progress};
use crate::alloc::block_group::super_stripes;
use crate::alloc::free_space_tree::{fst_items, read_fst_ranges};
use crate::error::Result;
use crate::io::disk_io::FsInfo;
use crate::tree::ctree::TreeIter;
use std::collections::BTreeMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::extent_data_ref_hash;
use ubtrfs_format::items::{BlockGroupItem, ExtentDataRef, ExtentItem, InlineRef};
use ubtrfs_format::key::Key;

/// What the extent phase leaves for the later phases.
#[derive(Default)]
pub(super) struct Extents {
    /// Data extents (start, length), in address order.
    pub data: Ranges,
    /// Every extent (start, length), in address order (read with `merged`).
    pub used: Ranges,
    /// Chunks (start, length, type flags), in address order.
    pub chunks: Vec<(u64, u64, u64)>,
    /// Whether the extent tree could be read to its end.
    pub complete: bool,
}

struct Cur {
    key: Key,
    item: ExtentItem,
    found: Vec<(RefKind, u64)>,
}

struct State<'a> {
    fs: &'a FsInfo,
    /// The expected references, in (bytenr, kind) order.
    refs: std::iter::Peekable<SpillIter<'a, ExpRef>>,
    prev_end: u64,
    chunk_idx: usize,
    chunk_used: Vec<u64>,
    /// Bytes of extents outside every chunk.
    outside: u64,
    out: Extents,
}

pub(super) fn check_extents(
    fs: &FsInfo,
    walk: &Walk,
    ranges_mem_bytes: usize,
    f: &mut Findings,
    progress: Progress<'_>,
) -> Result<Extents> {
    let refs = walk.refs.iter().peekable();
    let chunks: Vec<(u64, u64, u64)> = fs
        .chunk_map
        .iter()
        .map(|e| (e.start, e.length, e.ty))
        .collect();
    let mut st = State {
        fs,
        refs,
        prev_end: 0,
        chunk_idx: 0,
        chunk_used: vec![0; chunks.len()],
        outside: 0,
        out: Extents {
            chunks,
            data: Ranges::new(ranges_mem_bytes),
            used: Ranges::new(ranges_mem_bytes),
            complete: false,
        },
    };
    let mut bgs: BTreeMap<u64, (u64, BlockGroupItem)> = BTreeMap::new();
    let res = stream(fs, &mut st, &mut bgs, f, progress);
    st.out.complete = res.is_ok();
    if let Err(e) = res {
        f.add(
            "block-structure",
            Some(EXTENT_TREE_OBJECTID),
            None,
            None,
            format!("the extent tree cannot be read to its end: {e}"),
        );
    } else {
        st.missing_before(u64::MAX, f);
    }
    if fs.sb.compat_ro_flags & FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        if let Err(e) = read_bg_tree(fs, &mut bgs) {
            f.add(
                "bg-chunk",
                Some(BLOCK_GROUP_TREE_OBJECTID),
                None,
                None,
                format!("the block group tree cannot be read: {e}"),
            );
        }
    }
    check_block_groups(&st, &bgs, f);
    f.stats().bytes_used = st.bytes_used();
    if st.out.complete && st.bytes_used() != fs.sb.bytes_used {
        f.add(
            "super-bytes-used",
            None,
            None,
            None,
            format!(
                "superblock says {} bytes used, the extent tree holds {}",
                fs.sb.bytes_used,
                st.bytes_used()
            ),
        );
    }
    st.out.data.finish()?;
    st.out.used.finish()?;
    Ok(st.out)
}

fn read_bg_tree(fs: &FsInfo, bgs: &mut BTreeMap<u64, (u64, BlockGroupItem)>) -> Result<()> {
    let Some(ptr) = fs.tree_ptr(BLOCK_GROUP_TREE_OBJECTID) else {
        return Ok(());
    };
    for item in TreeIter::new(fs, &ptr, Key::MIN, Key::MAX)? {
        let item = item?;
        let k = item.key();
        if k.ty == BLOCK_GROUP_ITEM_KEY {
            if let Ok(b) = BlockGroupItem::parse(item.data()) {
                bgs.insert(k.objectid, (k.offset, b));
            }
        }
    }
    Ok(())
}

fn stream(
    fs: &FsInfo,
    st: &mut State<'_>,
    bgs: &mut BTreeMap<u64, (u64, BlockGroupItem)>,
    f: &mut Findings,
    progress: Progress<'_>,
) -> Result<()> {
    let Some(ptr) = fs.tree_ptr(EXTENT_TREE_OBJECTID) else {
        return Ok(());
    };
    let mut cur: Option<Cur> = None;
    let mut items = 0u64;
    for item in TreeIter::new(fs, &ptr, Key::MIN, Key::MAX)? {
        let item = item?;
        let k = item.key();
        let data = item.data();
        items += 1;
        if items.is_multiple_of(65536) {
            progress(2, items);
        }
        let bad = |f: &mut Findings, rule, msg: String| {
            f.add(
                rule,
                Some(EXTENT_TREE_OBJECTID),
                Some(k.objectid),
                Some(k),
                msg,
            )
        };
        match k.ty {
            EXTENT_ITEM_KEY | METADATA_ITEM_KEY => {
                if let Some(c) = cur.take() {
                    st.finish(c, f);
                }
                match ExtentItem::parse(k.ty, data) {
                    Ok(e) => {
                        let found = e
                            .inline_refs
                            .iter()
                            .filter_map(|r| inline_kind(r).map(|kind| (kind, r.count())))
                            .collect();
                        cur = Some(Cur {
                            key: k,
                            item: e,
                            found,
                        });
                    }
                    Err(e) => bad(f, "block-structure", format!("undecodable: {e}")),
                }
                continue;
            }
            BLOCK_GROUP_ITEM_KEY => {
                match BlockGroupItem::parse(data) {
                    Ok(b) => {
                        bgs.insert(k.objectid, (k.offset, b));
                    }
                    Err(e) => bad(f, "bg-chunk", format!("undecodable: {e}")),
                }
                continue;
            }
            TREE_BLOCK_REF_KEY | SHARED_BLOCK_REF_KEY | EXTENT_DATA_REF_KEY
            | SHARED_DATA_REF_KEY | EXTENT_OWNER_REF_KEY => {}
            _ => continue,
        }
        let Some(c) = cur.as_mut().filter(|c| c.key.objectid == k.objectid) else {
            bad(
                f,
                "extent-backref-orphan",
                "back reference without an extent item".into(),
            );
            continue;
        };
        let r = match k.ty {
            TREE_BLOCK_REF_KEY => Some((RefKind::Tree(k.offset), 1)),
            SHARED_BLOCK_REF_KEY => Some((RefKind::Shared(k.offset), 1)),
            EXTENT_DATA_REF_KEY => match ExtentDataRef::parse(data) {
                Ok(d) => {
                    if extent_data_ref_hash(d.root, d.objectid, d.offset) != k.offset {
                        bad(
                            f,
                            "extent-backref-orphan",
                            "data ref's key offset is not the hash of its root, inode and offset"
                                .into(),
                        );
                    }
                    Some((RefKind::Data(d.root, d.objectid, d.offset), d.count as u64))
                }
                Err(e) => {
                    bad(f, "block-structure", format!("undecodable: {e}"));
                    None
                }
            },
            SHARED_DATA_REF_KEY => data.get(..4).map(|b| {
                (
                    RefKind::SharedData(k.offset),
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64,
                )
            }),
            _ => None,
        };
        if let Some(r) = r {
            c.found.push(r);
        }
    }
    if let Some(c) = cur.take() {
        st.finish(c, f);
    }
    Ok(())
}

fn inline_kind(r: &InlineRef) -> Option<RefKind> {
    Some(match *r {
        InlineRef::TreeBlock { root } => RefKind::Tree(root),
        InlineRef::SharedBlock { parent } => RefKind::Shared(parent),
        InlineRef::ExtentData {
            root,
            objectid,
            offset,
            ..
        } => RefKind::Data(root, objectid, offset),
        InlineRef::SharedData { parent, .. } => RefKind::SharedData(parent),
        InlineRef::Owner { .. } => return None,
    })
}

impl State<'_> {
    fn bytes_used(&self) -> u64 {
        self.chunk_used
            .iter()
            .fold(self.outside, |a, b| a.saturating_add(*b))
    }

    /// Expected references to extents below `bytenr` that had no extent item.
    fn missing_before(&mut self, bytenr: u64, f: &mut Findings) {
        while let Some(first) = self.refs.next_if(|r| r.bytenr < bytenr) {
            let b = first.bytenr;
            let mut n = 1;
            while self.refs.next_if(|r| r.bytenr == b).is_some() {
                n += 1;
            }
            let what = if first.level == DATA_LEVEL {
                "data extent".to_string()
            } else {
                format!("tree block (level {})", first.level)
            };
            f.add(
                "extent-missing",
                Some(EXTENT_TREE_OBJECTID),
                Some(b),
                None,
                format!(
                    "{what} referenced {n} time(s) (first by {} from block {}) has no extent item",
                    first.kind, first.from
                ),
            );
        }
    }

    fn finish(&mut self, c: Cur, f: &mut Findings) {
        let k = c.key;
        let bytenr = k.objectid;
        let len = if k.ty == METADATA_ITEM_KEY {
            self.fs.nodesize as u64
        } else {
            k.offset
        };
        let bad = |f: &mut Findings, rule, msg: String| {
            f.add(rule, Some(EXTENT_TREE_OBJECTID), Some(bytenr), Some(k), msg)
        };
        self.missing_before(bytenr, f);
        // The references the trees imply, merged by kind.
        let mut exp: Vec<(RefKind, u64)> = Vec::new();
        let mut shape: Option<ExpRef> = None;
        while let Some(r) = self.refs.next_if(|r| r.bytenr == bytenr) {
            shape.get_or_insert(r);
            match exp.last_mut() {
                Some(l) if l.0 == r.kind => l.1 += r.count as u64,
                _ => exp.push((r.kind, r.count as u64)),
            }
        }
        let is_data = c.item.flags & EXTENT_FLAG_DATA != 0;
        let is_tree = c.item.flags & EXTENT_FLAG_TREE_BLOCK != 0;
        if is_data == is_tree {
            bad(
                f,
                "extent-flags",
                format!(
                    "flags {:#x}: neither data nor tree block, or both",
                    c.item.flags
                ),
            );
        }
        if let Some(s) = shape {
            if s.kind.is_data() {
                if !is_data {
                    bad(
                        f,
                        "extent-flags",
                        "data is referenced as a tree block is".into(),
                    );
                }
                if k.ty != EXTENT_ITEM_KEY || k.offset != s.len {
                    bad(
                        f,
                        "extent-size",
                        format!("file extents say {} bytes, the extent item {len}", s.len),
                    );
                }
            } else {
                if !is_tree {
                    bad(f, "extent-flags", "a tree block is marked as data".into());
                }
                let level = match (k.ty, &c.item.tree_block_info) {
                    (METADATA_ITEM_KEY, _) => Some(k.offset),
                    (_, Some((_, l))) => Some(*l as u64),
                    _ => None,
                };
                if level != Some(s.level as u64) || len != self.fs.nodesize as u64 {
                    bad(
                        f,
                        "extent-size",
                        format!(
                            "the tree block has level {}, the extent item says {level:?} (length {len})",
                            s.level
                        ),
                    );
                }
            }
        }
        let mut found = c.found;
        found.sort_unstable_by_key(|r| r.0);
        let total: u64 = found.iter().map(|r| r.1).sum();
        if exp.is_empty() {
            bad(
                f,
                "extent-orphan",
                format!(
                    "extent item with {} references, but nothing references it",
                    c.item.refs
                ),
            );
        } else {
            let (mut i, mut j) = (0, 0);
            while i < exp.len() || j < found.len() {
                let e = exp.get(i);
                let g = found.get(j);
                match (e, g) {
                    (Some(e), Some(g)) if e.0 == g.0 => {
                        if e.1 != g.1 {
                            bad(
                                f,
                                "extent-backref-count",
                                format!("{} counts {} but the trees hold {}", e.0, g.1, e.1),
                            );
                        }
                        i += 1;
                        j += 1;
                    }
                    (Some(e), g) if g.is_none_or(|g| e.0 < g.0) => {
                        bad(
                            f,
                            "extent-backref-missing",
                            format!("no back reference for {} ({} in the trees)", e.0, e.1),
                        );
                        i += 1;
                    }
                    (_, Some(g)) => {
                        bad(
                            f,
                            "extent-backref-orphan",
                            format!("back reference {} (count {}) that no tree holds", g.0, g.1),
                        );
                        j += 1;
                    }
                    _ => break,
                }
            }
        }
        if total != c.item.refs {
            bad(
                f,
                "extent-refs",
                format!("refs {} but its back references count {total}", c.item.refs),
            );
        }
        if c.item.generation > self.fs.sb.generation {
            bad(
                f,
                "extent-flags",
                format!(
                    "generation {} is newer than the filesystem's",
                    c.item.generation
                ),
            );
        }
        if bytenr < self.prev_end {
            bad(
                f,
                "extent-overlap",
                format!("starts before the previous extent ends ({})", self.prev_end),
            );
        }
        self.prev_end = self.prev_end.max(bytenr.saturating_add(len));
        self.account(bytenr, len, is_data, f, k);
    }

    fn account(&mut self, bytenr: u64, len: u64, is_data: bool, f: &mut Findings, k: Key) {
        let chunks = &self.out.chunks;
        while self.chunk_idx < chunks.len()
            && chunks[self.chunk_idx]
                .0
                .saturating_add(chunks[self.chunk_idx].1)
                <= bytenr
        {
            self.chunk_idx += 1;
        }
        match chunks.get(self.chunk_idx) {
            Some(&(s, l, ty))
                if s <= bytenr && bytenr.saturating_add(len) <= s.saturating_add(l) =>
            {
                self.chunk_used[self.chunk_idx] =
                    self.chunk_used[self.chunk_idx].saturating_add(len);
                let ok = if is_data {
                    ty & BLOCK_GROUP_DATA != 0
                } else {
                    ty & (BLOCK_GROUP_METADATA | BLOCK_GROUP_SYSTEM) != 0
                };
                if !ok {
                    f.add(
                        "extent-bg",
                        Some(EXTENT_TREE_OBJECTID),
                        Some(bytenr),
                        Some(k),
                        format!("lies in a block group of type {ty:#x}"),
                    );
                }
            }
            _ => {
                self.outside = self.outside.saturating_add(len);
                f.add(
                    "extent-bg",
                    Some(EXTENT_TREE_OBJECTID),
                    Some(bytenr),
                    Some(k),
                    "is not inside one chunk".into(),
                );
            }
        }
        if is_data {
            self.out.data.push((bytenr, len));
        }
        self.out.used.push((bytenr, len));
    }
}

fn check_block_groups(
    st: &State<'_>,
    bgs: &BTreeMap<u64, (u64, BlockGroupItem)>,
    f: &mut Findings,
) {
    let tree = if st.fs.sb.compat_ro_flags & FEATURE_COMPAT_RO_BLOCK_GROUP_TREE != 0 {
        BLOCK_GROUP_TREE_OBJECTID
    } else {
        EXTENT_TREE_OBJECTID
    };
    for (i, &(s, l, ty)) in st.out.chunks.iter().enumerate() {
        let key = Key::new(s, BLOCK_GROUP_ITEM_KEY, l);
        let Some((bl, b)) = bgs.get(&s) else {
            f.add(
                "bg-chunk",
                Some(tree),
                Some(s),
                Some(key),
                format!("chunk of {l} bytes has no block group item"),
            );
            continue;
        };
        if *bl != l || b.flags != ty {
            f.add(
                "bg-chunk",
                Some(tree),
                Some(s),
                Some(key),
                format!(
                    "block group (length {bl}, flags {:#x}) differs from its chunk (length {l}, type {ty:#x})",
                    b.flags
                ),
            );
        }
        if st.out.complete && b.used != st.chunk_used[i] {
            f.add(
                "bg-used",
                Some(tree),
                Some(s),
                Some(key),
                format!(
                    "used {} but its extents add up to {}",
                    b.used, st.chunk_used[i]
                ),
            );
        }
    }
    for (&s, (l, _)) in bgs {
        if !st.out.chunks.iter().any(|c| c.0 == s) {
            f.add(
                "bg-chunk",
                Some(tree),
                Some(s),
                Some(Key::new(s, BLOCK_GROUP_ITEM_KEY, *l)),
                "block group item without a chunk".into(),
            );
        }
    }
}

/// The free-space tree against the extent tree: per block group, the free ranges and
/// the FREE_SPACE_INFO extent count.
pub(super) fn check_free_space(fs: &FsInfo, ext: &Extents, f: &mut Findings) {
    if fs.sb.compat_ro_flags & FEATURE_COMPAT_RO_FREE_SPACE_TREE == 0 || !ext.complete {
        return;
    }
    let tree = Some(FREE_SPACE_TREE_OBJECTID);
    // The used ranges, merged (so disjoint, ends in order too), streamed; `window`
    // holds those read that reach the current chunk (one may reach the next).
    let mut used = merged(ext.used.iter()).peekable();
    let mut window: std::collections::VecDeque<(u64, u64)> = Default::default();
    for &(s, l, _) in &ext.chunks {
        // Free = the chunk minus what extents use.
        let mut want: Vec<(u64, u64)> = Vec::new();
        let mut pos = s;
        while window.front().is_some_and(|r| r.0.saturating_add(r.1) <= s) {
            window.pop_front();
        }
        if window.is_empty() {
            while used.next_if(|r| r.0.saturating_add(r.1) <= s).is_some() {}
        }
        while let Some(r) = used.next_if(|r| r.0 < s.saturating_add(l)) {
            window.push_back(r);
        }
        // Superblock copies are neither free nor extents (exclude_super_stripes).
        // Kernel-made trees list them as free at times, ubtrfs's never: either is
        // accepted (btrfs check accepts both), so they are left out of both sides.
        let supers: Vec<(u64, u64)> = fs
            .chunk_map
            .lookup(s)
            .map(super_stripes)
            .unwrap_or_default();
        let mut taken = supers.clone();
        taken.extend(window.iter().filter(|r| r.0 < s.saturating_add(l)));
        taken.sort_unstable();
        for &(us, ul) in &taken {
            let a = us.max(s);
            if a > pos {
                want.push((pos, a - pos));
            }
            pos = pos.max(us.saturating_add(ul).min(s.saturating_add(l)));
        }
        if pos < s.saturating_add(l) {
            want.push((pos, s.saturating_add(l) - pos));
        }
        let key = Some(Key::new(s, FREE_SPACE_INFO_KEY, l));
        let stored = match read_fst_ranges(fs, s, l) {
            Ok((r, _)) => r,
            Err(e) => {
                f.add("free-space", tree, Some(s), key, e.to_string());
                continue;
            }
        };
        let have = super::csums::subtract(&stored, &supers);
        if have != want {
            let diff = have
                .iter()
                .zip(&want)
                .find(|(a, b)| a != b)
                .map(|(a, b)| {
                    format!(
                        "free {}+{} where the extent tree says {}+{}",
                        a.0, a.1, b.0, b.1
                    )
                })
                .unwrap_or_else(|| {
                    format!(
                        "{} free ranges where the extent tree says {}",
                        have.len(),
                        want.len()
                    )
                });
            f.add(
                "free-space",
                tree,
                Some(s),
                key,
                format!("block group {s}: {diff}"),
            );
            continue;
        }
        if let Ok(items) = fst_items(fs, s, l) {
            if let Some((_, info)) = items.first() {
                if info.len() >= 4 {
                    let count = u32::from_le_bytes([info[0], info[1], info[2], info[3]]) as usize;
                    if count != stored.len() {
                        f.add(
                            "free-space",
                            tree,
                            Some(s),
                            key,
                            format!(
                                "FREE_SPACE_INFO counts {count} free extents, there are {}",
                                stored.len()
                            ),
                        );
                    }
                }
            }
        }
    }
}
