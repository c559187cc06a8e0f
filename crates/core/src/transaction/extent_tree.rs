//! The extent tree, written: allocation of tree blocks and data extents from the block
//! groups' free-space indexes, the kernel's backref rules on CoW of shared blocks
//! (update_ref_for_cow with FULL_BACKREF), and running delayed refs into EXTENT_ITEM /
//! METADATA_ITEM items with inline refs (type ascending, then by offset or hash
//! descending, as the tree checker demands) and keyed refs when inline space runs out.

use crate::alloc::delayed_ref::{Head, NewTreeBlock, RefKey};
use crate::error::{Error, Result};
use crate::tree::block_edit as eb;
use crate::tree::TreeBlock;

use crate::transaction::Trans;
use ubtrfs_format::bytes::{le32, le64};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::extent_data_ref_hash;
use ubtrfs_format::items::{FileExtentBody, FileExtentItem};
use ubtrfs_format::key::Key;

/// The extent item and all backrefs of one extent, as stored.
#[derive(Clone, Debug)]
struct ExtentRec {
    key: Key,
    refs: u64,
    generation: u64,
    flags: u64,
    tree_info: Option<Vec<u8>>,
    /// The inline EXTENT_OWNER_REF of a data extent (simple quotas): the subvolume
    /// it is charged to. Always the first inline ref (its type sorts lowest).
    owner: Option<u64>,
    inline: Vec<(RefKey, u64)>,
    /// Keyed backref items: (item key, ref, count).
    keyed: Vec<(Key, RefKey, u64)>,
}

/// A committed extent item, read: flags, generation, owner (simple quotas) and
/// every back reference with its count.
#[derive(Clone, Debug)]
pub(crate) struct CommittedExtent {
    pub flags: u64,
    pub generation: u64,
    pub owner: Option<u64>,
    pub refs: Vec<(RefKey, u64)>,
}

/// Size of an inline EXTENT_OWNER_REF: type byte and root id.
const OWNER_REF_SIZE: usize = 9;

fn ref_type(r: &RefKey) -> u8 {
    match r {
        RefKey::TreeRoot(_) => TREE_BLOCK_REF_KEY,
        RefKey::Data { .. } => EXTENT_DATA_REF_KEY,
        RefKey::TreeShared(_) => SHARED_BLOCK_REF_KEY,
        RefKey::DataShared(_) => SHARED_DATA_REF_KEY,
    }
}
fn ref_seq(r: &RefKey) -> u64 {
    match *r {
        RefKey::TreeRoot(x) | RefKey::TreeShared(x) | RefKey::DataShared(x) => x,
        RefKey::Data { root, ino, offset } => extent_data_ref_hash(root, ino, offset),
    }
}
fn inline_size(r: &RefKey) -> usize {
    match r {
        RefKey::TreeRoot(_) | RefKey::TreeShared(_) => 9,
        RefKey::Data { .. } => 29,
        RefKey::DataShared(_) => 13,
    }
}

impl ExtentRec {
    fn item_size(&self) -> usize {
        24 + self.tree_info.as_ref().map_or(0, |t| t.len())
            + self.owner.map_or(0, |_| OWNER_REF_SIZE)
            + self
                .inline
                .iter()
                .map(|(r, _)| inline_size(r))
                .sum::<usize>()
    }
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.item_size());
        out.extend_from_slice(&self.refs.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        if let Some(t) = &self.tree_info {
            out.extend_from_slice(t);
        }
        if let Some(root) = self.owner {
            out.push(EXTENT_OWNER_REF_KEY);
            out.extend_from_slice(&root.to_le_bytes());
        }
        let mut refs = self.inline.clone();
        refs.sort_by(|a, b| {
            ref_type(&a.0)
                .cmp(&ref_type(&b.0))
                .then(ref_seq(&b.0).cmp(&ref_seq(&a.0)))
        });
        for (r, count) in refs {
            out.push(ref_type(&r));
            match r {
                RefKey::TreeRoot(x) | RefKey::TreeShared(x) => {
                    out.extend_from_slice(&x.to_le_bytes())
                }
                RefKey::DataShared(p) => {
                    out.extend_from_slice(&p.to_le_bytes());
                    out.extend_from_slice(&(count as u32).to_le_bytes());
                }
                RefKey::Data { root, ino, offset } => {
                    out.extend_from_slice(&root.to_le_bytes());
                    out.extend_from_slice(&ino.to_le_bytes());
                    out.extend_from_slice(&offset.to_le_bytes());
                    out.extend_from_slice(&(count as u32).to_le_bytes());
                }
            }
        }
        out
    }
}

fn keyed_bytes(r: &RefKey, count: u64) -> Vec<u8> {
    match *r {
        RefKey::TreeRoot(_) | RefKey::TreeShared(_) => Vec::new(),
        RefKey::DataShared(_) => (count as u32).to_le_bytes().to_vec(),
        RefKey::Data { root, ino, offset } => {
            let mut v = Vec::with_capacity(28);
            v.extend_from_slice(&root.to_le_bytes());
            v.extend_from_slice(&ino.to_le_bytes());
            v.extend_from_slice(&offset.to_le_bytes());
            v.extend_from_slice(&(count as u32).to_le_bytes());
            v
        }
    }
}

impl Trans {
    pub(crate) fn alloc_tree_block(
        &mut self,
        root_id: u64,
        level: u8,
        key: Option<Key>,
        _hint: u64,
    ) -> Result<u64> {
        let ty = if root_id == CHUNK_TREE_OBJECTID {
            BLOCK_GROUP_SYSTEM
        } else {
            BLOCK_GROUP_METADATA
        };
        let hint = self.alloc.last_alloc.get(&ty).copied().unwrap_or(0);
        let ns = self.fs.info.nodesize as u64;
        let bytenr = self.alloc.alloc_extent(&mut self.fs.info, ty, ns, hint)?;
        self.fs.info.cache_forget(bytenr);
        self.delayed.add_new(
            bytenr,
            ns,
            false,
            Some(NewTreeBlock {
                level,
                key: key.unwrap_or(Key::MIN),
            }),
            RefKey::TreeRoot(root_id),
        );
        *self.root_bytes_delta.entry(root_id).or_insert(0) += ns as i64;
        Ok(bytenr)
    }

    /// Drops tree `root_id`'s reference to a tree block it no longer uses.
    pub(crate) fn free_tree_block(&mut self, root_id: u64, bytenr: u64, _level: u8) -> Result<()> {
        let ns = self.fs.info.nodesize as u64;
        self.delayed
            .add(bytenr, ns, false, RefKey::TreeRoot(root_id), -1);
        // A dirty block was allocated in this transaction (CoW never re-dirties a
        // committed block in place) and no committed tree points at it, so it must
        // not be written. Its delayed ref may already have run: the commit runs
        // them in rounds while the extent tree it edits shrinks, so whether the
        // head is still a new extent says nothing here. Written anyway, an emptied
        // node would fail the tree checker (a node without pointers).
        if let Some(blk) = self.fs.info.dirty_get(bytenr) {
            // Simple quotas release the block from its header owner's charge when
            // the ref runs, and the block will not be readable then.
            self.delayed.note_owner(bytenr, blk.owner());
            self.drop_dirty(bytenr);
        }
        *self.root_bytes_delta.entry(root_id).or_insert(0) -= ns as i64;
        Ok(())
    }

    /// Subvolume-like trees (fs trees, the data relocation tree).
    pub(crate) fn is_shareable(root_id: u64) -> bool {
        root_id == FS_TREE_OBJECTID
            || root_id == DATA_RELOC_TREE_OBJECTID
            || (FIRST_FREE_OBJECTID..=LAST_FREE_OBJECTID).contains(&root_id)
    }

    /// The kernel's update_ref_for_cow: when the block being CoWed may be shared with
    /// a snapshot, move its children's references so both trees stay correct.
    pub(crate) fn update_ref_for_cow(
        &mut self,
        root_id: u64,
        old: &TreeBlock,
        cow: u64,
        cow_data: &[u8],
    ) -> Result<()> {
        let hdr_flags = eb::flags(&old.data);
        let backref_rev = hdr_flags >> BACKREF_REV_SHIFT;
        let (root_bytenr, _) = self.root_node(root_id)?;
        let last_snapshot = self.last_snapshot(root_id)?;
        let can_share = Self::is_shareable(root_id)
            && old.bytenr != root_bytenr
            && (old.generation() <= last_snapshot || hdr_flags & HEADER_FLAG_RELOC != 0);
        let (refs, flags) = if can_share {
            self.lookup_extent_info(old.bytenr, old.level())?
        } else {
            (
                1,
                if backref_rev < MIXED_BACKREF_REV {
                    BLOCK_FLAG_FULL_BACKREF
                } else {
                    0
                },
            )
        };
        if refs == 0 {
            return Err(Error::corrupt(format!(
                "tree block {} has no references",
                old.bytenr
            )));
        }
        let owner = old.owner();
        if refs > 1 {
            if owner == root_id && flags & BLOCK_FLAG_FULL_BACKREF == 0 {
                self.mod_refs(old.bytenr, &old.data, true, 1)?;
                self.delayed.set_flags(
                    old.bytenr,
                    self.fs.info.nodesize as u64,
                    BLOCK_FLAG_FULL_BACKREF,
                );
            } else {
                self.mod_refs(cow, cow_data, false, 1)?;
            }
        } else if flags & BLOCK_FLAG_FULL_BACKREF != 0 {
            self.mod_refs(cow, cow_data, false, 1)?;
            self.mod_refs(old.bytenr, &old.data, true, -1)?;
        }
        Ok(())
    }

    /// Adds (`delta` 1) or drops (-1) the references a block holds on its children or
    /// data extents: by parent address when `full`, else by the block's owner tree.
    pub(crate) fn mod_refs(
        &mut self,
        bytenr: u64,
        data: &[u8],
        full: bool,
        delta: i64,
    ) -> Result<()> {
        let owner = le64(data, 0x58, "header").unwrap_or(0);
        let n = eb::nritems(data);
        let ns = self.fs.info.nodesize as u64;
        if eb::level(data) > 0 {
            for i in 0..n {
                let child = eb::node_blockptr(data, i);
                let r = if full {
                    RefKey::TreeShared(bytenr)
                } else {
                    RefKey::TreeRoot(owner)
                };
                self.delayed.add(child, ns, false, r, delta);
            }
            return Ok(());
        }
        for i in 0..n {
            let k = eb::item_key(data, i);
            if k.ty != EXTENT_DATA_KEY {
                continue;
            }
            let fe = FileExtentItem::parse(eb::item_data(data, i))
                .map_err(|e| Error::corrupt(format!("tree block {bytenr} item {k}: {e}")))?;
            if let FileExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                ..
            } = fe.body
            {
                if disk_bytenr == 0 {
                    continue;
                }
                let r = if full {
                    RefKey::DataShared(bytenr)
                } else {
                    RefKey::Data {
                        root: owner,
                        ino: k.objectid,
                        offset: k.offset.wrapping_sub(offset),
                    }
                };
                self.delayed
                    .add(disk_bytenr, disk_num_bytes, true, r, delta);
            }
        }
        Ok(())
    }

    /// The generation of the last snapshot of `root_id` (0 for unshareable trees).
    pub(crate) fn last_snapshot(&mut self, root_id: u64) -> Result<u64> {
        if !Self::is_shareable(root_id) {
            return Ok(0);
        }
        Ok(self.root_item(root_id)?.last_snapshot)
    }

    /// References and flags of a tree block, counting pending delayed refs.
    pub(crate) fn lookup_extent_info(&mut self, bytenr: u64, level: u8) -> Result<(u64, u64)> {
        let rec = self.load_extent(bytenr, level)?;
        let (mut refs, mut flags) = rec.map_or((0i64, 0u64), |r| (r.refs as i64, r.flags));
        if let Some(h) = self.delayed.get(bytenr) {
            refs += h.ref_mod();
            flags |= h.set_flags;
        }
        Ok((refs.max(0) as u64, flags))
    }

    fn load_extent(&self, bytenr: u64, _level: u8) -> Result<Option<ExtentRec>> {
        let ptr = self.root_ptr(EXTENT_TREE_OBJECTID)?;
        let it = crate::tree::ctree::TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(bytenr, EXTENT_ITEM_KEY, 0),
            Key::new(bytenr, SHARED_DATA_REF_KEY, u64::MAX),
        )?;
        let mut rec: Option<ExtentRec> = None;
        let bad = |k: &Key, m: &str| Error::corrupt(format!("extent tree item {k}: {m}"));
        for item in it {
            let item = item?;
            let k = item.key();
            let d = item.data();
            match k.ty {
                EXTENT_ITEM_KEY | METADATA_ITEM_KEY => {
                    if d.len() < 24 {
                        return Err(bad(&k, "extent item too short"));
                    }
                    let refs = le64(d, 0, "extent").unwrap_or(0);
                    let generation = le64(d, 8, "extent").unwrap_or(0);
                    let flags = le64(d, 16, "extent").unwrap_or(0);
                    let mut pos = 24;
                    let mut tree_info = None;
                    if k.ty == EXTENT_ITEM_KEY && flags & EXTENT_FLAG_TREE_BLOCK != 0 {
                        tree_info = d.get(24..42).map(|t| t.to_vec());
                        pos = 42;
                    }
                    let mut inline = Vec::new();
                    let mut owner = None;
                    while pos < d.len() {
                        let t = d[pos];
                        let off = le64(d, pos + 1, "inline ref")
                            .map_err(|_| bad(&k, "inline ref truncated"))?;
                        let (r, count, size) = match t {
                            TREE_BLOCK_REF_KEY => (RefKey::TreeRoot(off), 1, 9),
                            SHARED_BLOCK_REF_KEY => (RefKey::TreeShared(off), 1, 9),
                            SHARED_DATA_REF_KEY => {
                                let c = le32(d, pos + 9, "inline ref")
                                    .map_err(|_| bad(&k, "inline ref truncated"))?;
                                (RefKey::DataShared(off), c as u64, 13)
                            }
                            EXTENT_DATA_REF_KEY => {
                                let ino = le64(d, pos + 9, "r")
                                    .map_err(|_| bad(&k, "inline ref truncated"))?;
                                let o = le64(d, pos + 17, "r")
                                    .map_err(|_| bad(&k, "inline ref truncated"))?;
                                let c = le32(d, pos + 25, "r")
                                    .map_err(|_| bad(&k, "inline ref truncated"))?;
                                (
                                    RefKey::Data {
                                        root: off,
                                        ino,
                                        offset: o,
                                    },
                                    c as u64,
                                    29,
                                )
                            }
                            EXTENT_OWNER_REF_KEY if inline.is_empty() && owner.is_none() => {
                                owner = Some(off);
                                pos += OWNER_REF_SIZE;
                                continue;
                            }
                            _ => return Err(bad(&k, "unknown inline ref type")),
                        };
                        inline.push((r, count));
                        pos += size;
                    }
                    rec = Some(ExtentRec {
                        key: k,
                        refs,
                        generation,
                        flags,
                        tree_info,
                        owner,
                        inline,
                        keyed: Vec::new(),
                    });
                }
                TREE_BLOCK_REF_KEY | SHARED_BLOCK_REF_KEY | EXTENT_DATA_REF_KEY
                | SHARED_DATA_REF_KEY => {
                    let Some(r) = rec.as_mut() else {
                        return Err(bad(&k, "backref without extent item"));
                    };
                    let (rk, count) = match k.ty {
                        TREE_BLOCK_REF_KEY => (RefKey::TreeRoot(k.offset), 1),
                        SHARED_BLOCK_REF_KEY => (RefKey::TreeShared(k.offset), 1),
                        SHARED_DATA_REF_KEY => (
                            RefKey::DataShared(k.offset),
                            le32(d, 0, "r").map_err(|_| bad(&k, "short"))? as u64,
                        ),
                        _ => {
                            let root = le64(d, 0, "r").map_err(|_| bad(&k, "short"))?;
                            let ino = le64(d, 8, "r").map_err(|_| bad(&k, "short"))?;
                            let o = le64(d, 16, "r").map_err(|_| bad(&k, "short"))?;
                            let c = le32(d, 24, "r").map_err(|_| bad(&k, "short"))?;
                            (
                                RefKey::Data {
                                    root,
                                    ino,
                                    offset: o,
                                },
                                c as u64,
                            )
                        }
                    };
                    r.keyed.push((k, rk, count));
                }
                _ => {}
            }
        }
        Ok(rec)
    }

    /// The committed extent item of `bytenr` (inline and keyed refs), pending
    /// delayed refs not included.
    pub(crate) fn extent_refs(&self, bytenr: u64) -> Result<Option<CommittedExtent>> {
        Ok(self.load_extent(bytenr, 0)?.map(|r| {
            let mut refs = r.inline;
            refs.extend(r.keyed.into_iter().map(|(_, k, c)| (k, c)));
            CommittedExtent {
                flags: r.flags,
                generation: r.generation,
                owner: r.owner,
                refs,
            }
        }))
    }

    fn max_extent_item_size(&self) -> usize {
        ((self.fs.info.nodesize as usize - HEADER_SIZE) >> 4) - ITEM_SIZE
    }

    /// Applies every pending delayed ref to the extent tree (new refs may appear as the
    /// extent tree itself is CoWed; they are run too).
    pub(crate) fn run_delayed_refs(&mut self) -> Result<()> {
        let mut rounds = 0u64;
        while let Some((bytenr, head)) = self.delayed.pop_first() {
            rounds += 1;
            if rounds > 100_000_000 {
                return Err(Error::corrupt("internal: delayed refs do not converge"));
            }
            self.run_head(bytenr, head)?;
        }
        Ok(())
    }

    fn run_head(&mut self, bytenr: u64, head: Head) -> Result<()> {
        let skinny = self.fs.info.sb.incompat_flags & FEATURE_INCOMPAT_SKINNY_METADATA != 0;
        if head.new_extent {
            let total = head.ref_mod();
            if head.refs.values().any(|&d| d < 0) || total < 0 {
                return Err(Error::corrupt(format!(
                    "internal: new extent {bytenr} dropped below zero refs"
                )));
            }
            if total == 0 {
                // Allocated and freed within this transaction. Data stays pinned
                // until the commit is durable: a tree log an fsync wrote may point at
                // it, and must stay readable until then.
                if head.is_data {
                    self.del_csums(bytenr, head.num_bytes)?;
                    self.alloc.pinned.push((bytenr, head.num_bytes));
                    return Ok(());
                }
                return self.alloc.release_unused(bytenr, head.num_bytes);
            }
            let tree = head.tree;
            let (key, tree_info) = match (head.is_data, tree) {
                (true, _) => (Key::new(bytenr, EXTENT_ITEM_KEY, head.num_bytes), None),
                (false, Some(t)) if skinny => {
                    (Key::new(bytenr, METADATA_ITEM_KEY, t.level as u64), None)
                }
                (false, t) => {
                    let t = t.unwrap_or(NewTreeBlock {
                        level: 0,
                        key: Key::MIN,
                    });
                    let mut info = t.key.to_bytes().to_vec();
                    info.push(t.level);
                    (
                        Key::new(bytenr, EXTENT_ITEM_KEY, head.num_bytes),
                        Some(info),
                    )
                }
            };
            let generation = head.generation.unwrap_or(self.transid);
            let mut rec = ExtentRec {
                key,
                refs: 0,
                generation,
                flags: if head.is_data {
                    EXTENT_FLAG_DATA
                } else {
                    EXTENT_FLAG_TREE_BLOCK
                } | head.set_flags,
                tree_info,
                // Simple quotas: a data extent names the subvolume it is charged to.
                owner: if head.is_data && self.squota.is_some() {
                    head.owner
                } else {
                    None
                },
                inline: Vec::new(),
                keyed: Vec::new(),
            };
            if let (Some(sq), Some(owner)) = (self.squota.as_mut(), head.owner) {
                sq.charge(owner, generation, head.num_bytes as i64);
            }
            let mut keyed_new = Vec::new();
            for (r, d) in &head.refs {
                self.add_ref_to_rec(&mut rec, r, *d as u64, &mut keyed_new);
            }
            self.insert_item(EXTENT_TREE_OBJECTID, &key, &rec.to_bytes())?;
            for (k, v) in keyed_new {
                self.insert_item(EXTENT_TREE_OBJECTID, &k, &v)?;
            }
            return self.account_extent(bytenr, head.num_bytes, true);
        }
        if head.refs.is_empty() && head.set_flags == 0 {
            return Ok(());
        }
        let level = head.tree.map_or(0, |t| t.level);
        let mut rec = self.load_extent(bytenr, level)?.ok_or_else(|| {
            Error::corrupt(format!(
                "extent {bytenr}: no extent item to update its references"
            ))
        })?;
        let old_key = rec.key;
        let mut keyed_del: Vec<Key> = Vec::new();
        let mut keyed_upd: Vec<(Key, Vec<u8>)> = Vec::new();
        let mut keyed_new: Vec<(Key, Vec<u8>)> = Vec::new();
        for (r, &d) in &head.refs {
            if d > 0 {
                if let Some(e) = rec.inline.iter_mut().find(|x| x.0 == *r) {
                    e.1 += d as u64;
                } else if let Some(e) = rec.keyed.iter_mut().find(|x| x.1 == *r) {
                    e.2 += d as u64;
                    keyed_upd.push((e.0, keyed_bytes(r, e.2)));
                } else {
                    self.add_ref_to_rec(&mut rec, r, d as u64, &mut keyed_new);
                    continue;
                }
                rec.refs += d as u64;
            } else {
                let dec = d.unsigned_abs();
                if let Some(pos) = rec.inline.iter().position(|x| x.0 == *r) {
                    if rec.inline[pos].1 < dec {
                        return Err(Error::corrupt(format!(
                            "extent {bytenr}: dropping {dec} of ref {r:?} that has {}",
                            rec.inline[pos].1
                        )));
                    }
                    rec.inline[pos].1 -= dec;
                    if rec.inline[pos].1 == 0 {
                        rec.inline.remove(pos);
                    }
                } else if let Some(pos) = rec.keyed.iter().position(|x| x.1 == *r) {
                    let e = &mut rec.keyed[pos];
                    if e.2 < dec {
                        return Err(Error::corrupt(format!(
                            "extent {bytenr}: dropping {dec} of ref {r:?} that has {}",
                            e.2
                        )));
                    }
                    e.2 -= dec;
                    if e.2 == 0 {
                        keyed_del.push(e.0);
                        rec.keyed.remove(pos);
                    } else {
                        keyed_upd.push((e.0, keyed_bytes(r, e.2)));
                    }
                } else {
                    return Err(Error::corrupt(format!(
                        "extent {bytenr}: dropping ref {r:?} it does not have"
                    )));
                }
                if rec.refs < dec {
                    return Err(Error::corrupt(format!("extent {bytenr}: refs below zero")));
                }
                rec.refs -= dec;
            }
        }
        rec.flags |= head.set_flags;
        if rec.refs == 0 {
            self.delete_item(EXTENT_TREE_OBJECTID, &old_key)?;
            for (k, _, _) in &rec.keyed {
                self.delete_item(EXTENT_TREE_OBJECTID, k)?;
            }
            for k in keyed_del {
                // Already removed from rec.keyed; its item still exists.
                self.delete_item(EXTENT_TREE_OBJECTID, &k)?;
            }
            let len = if old_key.ty == METADATA_ITEM_KEY {
                self.fs.info.nodesize as u64
            } else {
                old_key.offset
            };
            let is_data = head.is_data || rec.flags & EXTENT_FLAG_DATA != 0;
            if is_data {
                self.del_csums(bytenr, len)?;
            }
            if self.squota.is_some() {
                // Charged to the owner ref (data) or the block's owner tree, as at
                // allocation; data from before simple quotas has no owner ref.
                let owner = match (is_data, head.owner) {
                    (true, _) => rec.owner,
                    // Noted when the block was freed unwritten (free_tree_block).
                    (false, Some(o)) => Some(o),
                    (false, None) => Some(self.tree_block_owner(bytenr)?),
                };
                if let (Some(sq), Some(owner)) = (self.squota.as_mut(), owner) {
                    sq.charge(owner, rec.generation, -(len as i64));
                }
            }
            self.alloc.pinned.push((bytenr, len));
            return self.account_extent(bytenr, len, false);
        }
        self.replace_item(EXTENT_TREE_OBJECTID, &old_key, &rec.to_bytes())?;
        for k in keyed_del {
            self.delete_item(EXTENT_TREE_OBJECTID, &k)?;
        }
        for (k, v) in keyed_upd {
            self.replace_item(EXTENT_TREE_OBJECTID, &k, &v)?;
        }
        for (k, v) in keyed_new {
            self.insert_item(EXTENT_TREE_OBJECTID, &k, &v)?;
        }
        Ok(())
    }

    /// Adds a new backref: inline when the item has no keyed refs and stays below the
    /// kernel's size limit, else as its own item.
    fn add_ref_to_rec(
        &self,
        rec: &mut ExtentRec,
        r: &RefKey,
        count: u64,
        keyed_new: &mut Vec<(Key, Vec<u8>)>,
    ) {
        rec.refs += count;
        let max = self.max_extent_item_size();
        if rec.keyed.is_empty() && keyed_new.is_empty() && rec.item_size() + inline_size(r) < max {
            rec.inline.push((*r, count));
            return;
        }
        let bytenr = rec.key.objectid;
        let mut key = Key::new(bytenr, ref_type(r), ref_seq(r));
        if let RefKey::Data { .. } = r {
            // Hash collisions take the next offset.
            while rec.keyed.iter().any(|x| x.0 == key) || keyed_new.iter().any(|x| x.0 == key) {
                key.offset = key.offset.wrapping_add(1);
            }
        }
        let v = keyed_bytes(r, count);
        rec.keyed.push((key, *r, count));
        keyed_new.push((key, v));
    }

    /// The tree a committed tree block belongs to (its header's owner).
    fn tree_block_owner(&self, bytenr: u64) -> Result<u64> {
        let blk = self
            .fs
            .info
            .read_tree_block(bytenr, &crate::tree::tree_checker::Expect::default())?;
        Ok(blk.owner())
    }

    /// Extent-tree view of space changes: block group `used`, superblock bytes_used,
    /// and what the free-space tree must say.
    fn account_extent(&mut self, bytenr: u64, len: u64, alloc: bool) -> Result<()> {
        let s = self.alloc.bg_of(bytenr)?;
        self.alloc.ensure_loaded(&self.fs.info, s)?;
        let bg = self
            .alloc
            .bgs
            .get_mut(&s)
            .ok_or_else(|| Error::corrupt(format!("no block group at {s}")))?;
        if alloc {
            bg.used += len;
            self.fs.info.sb.bytes_used += len;
            bg.fst_free
                .remove(bytenr, len)
                .map_err(|e| Error::corrupt(format!("extent {bytenr}: {e}")))?;
        } else {
            bg.used = bg.used.saturating_sub(len);
            self.fs.info.sb.bytes_used = self.fs.info.sb.bytes_used.saturating_sub(len);
            bg.fst_free
                .add(bytenr, len)
                .map_err(|e| Error::corrupt(format!("extent {bytenr}: {e}")))?;
        }
        bg.dirty = true;
        Ok(())
    }

    /// Adds a reference to a data extent (a new file extent item pointing at it).
    pub(crate) fn add_data_ref(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        root: u64,
        ino: u64,
        offset: u64,
        delta: i64,
    ) {
        self.delayed.add(
            bytenr,
            num_bytes,
            true,
            RefKey::Data { root, ino, offset },
            delta,
        );
    }

    pub(crate) fn add_new_data_extent(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        root: u64,
        ino: u64,
        offset: u64,
    ) {
        self.delayed.add_new(
            bytenr,
            num_bytes,
            true,
            None,
            RefKey::Data { root, ino, offset },
        );
    }
}
