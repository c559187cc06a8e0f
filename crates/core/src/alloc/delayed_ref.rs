//! Delayed references: every reference change of a transaction is recorded here as a
//! signed count per (extent, backref) and applied to the extent tree at commit, as the
//! kernel does. Adding and dropping the same ref in one transaction cancels out, so a
//! block allocated and freed before commit never touches the extent tree.

use std::collections::BTreeMap;
use ubtrfs_format::key::Key;

/// One backref of an extent, in the extent tree's sort order (TREE_BLOCK_REF 176 <
/// EXTENT_DATA_REF 178 < SHARED_BLOCK_REF 182 < SHARED_DATA_REF 184).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum RefKey {
    /// TREE_BLOCK_REF: referenced by tree `root` (the owner's implicit ref).
    TreeRoot(u64),
    /// EXTENT_DATA_REF: file extent of (root, inode, file offset - extent offset).
    Data { root: u64, ino: u64, offset: u64 },
    /// SHARED_BLOCK_REF: referenced by the parent block at this address.
    TreeShared(u64),
    /// SHARED_DATA_REF: file extent item in the leaf at this address.
    DataShared(u64),
}

/// The first key and level of a new tree block (non-skinny items store them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewTreeBlock {
    pub level: u8,
    pub key: Key,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Head {
    pub num_bytes: u64,
    pub is_data: bool,
    pub refs: BTreeMap<RefKey, i64>,
    /// Allocated in this transaction: no extent item yet.
    pub new_extent: bool,
    pub tree: Option<NewTreeBlock>,
    /// Extent flags to set (FULL_BACKREF).
    pub set_flags: u64,
    /// Generation of a new extent's item when not the transaction's (relocation
    /// renames an extent and keeps its generation).
    pub generation: Option<u64>,
    /// The subvolume a new extent is charged to under simple quotas (its
    /// EXTENT_OWNER_REF for data): the tree of its first reference unless set
    /// (relocation keeps the old extent's owner).
    pub owner: Option<u64>,
}

impl Head {
    pub(crate) fn ref_mod(&self) -> i64 {
        self.refs.values().sum()
    }
}

#[derive(Debug, Default)]
pub(crate) struct DelayedRefs {
    pub heads: BTreeMap<u64, Head>,
    /// With quotas on: every extent whose references changed since the last commit,
    /// (length, is data) by bytenr, plus those traced under a dropped shared block
    /// (the kernel's qgroup extent records). The commit accounts them (qgroup/).
    pub touched: Option<BTreeMap<u64, (u64, bool)>>,
}

impl DelayedRefs {
    pub(crate) fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }
    /// Records an extent for quota accounting (when quotas are on).
    pub(crate) fn trace(&mut self, bytenr: u64, num_bytes: u64, is_data: bool) {
        if let Some(t) = self.touched.as_mut() {
            t.entry(bytenr).or_insert((num_bytes, is_data));
        }
    }
    fn head(&mut self, bytenr: u64, num_bytes: u64, is_data: bool) -> &mut Head {
        self.trace(bytenr, num_bytes, is_data);
        let h = self.heads.entry(bytenr).or_default();
        if h.num_bytes == 0 {
            h.num_bytes = num_bytes;
            h.is_data = is_data;
        }
        h
    }
    pub(crate) fn add(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        is_data: bool,
        r: RefKey,
        delta: i64,
    ) {
        let h = self.head(bytenr, num_bytes, is_data);
        let e = h.refs.entry(r).or_insert(0);
        *e += delta;
        if *e == 0 {
            h.refs.remove(&r);
        }
    }
    /// Records a newly allocated extent with its first reference.
    pub(crate) fn add_new(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        is_data: bool,
        tree: Option<NewTreeBlock>,
        r: RefKey,
    ) {
        let h = self.head(bytenr, num_bytes, is_data);
        h.new_extent = true;
        h.tree = tree;
        if h.owner.is_none() {
            h.owner = match r {
                RefKey::TreeRoot(root) | RefKey::Data { root, .. } => Some(root),
                RefKey::TreeShared(_) | RefKey::DataShared(_) => None,
            };
        }
        self.add(bytenr, num_bytes, is_data, r, 1);
    }
    /// Charges a new extent to another subvolume than its first reference's.
    pub(crate) fn set_owner(&mut self, bytenr: u64, owner: Option<u64>) {
        if let Some(h) = self.heads.get_mut(&bytenr) {
            h.owner = owner;
        }
    }
    /// The header owner of a tree block freed before it was ever written (for
    /// simple quotas: it cannot be read back when the ref runs).
    pub(crate) fn note_owner(&mut self, bytenr: u64, owner: u64) {
        if let Some(h) = self.heads.get_mut(&bytenr) {
            h.owner.get_or_insert(owner);
        }
    }
    /// Gives a new extent's item another generation than the transaction's.
    pub(crate) fn set_generation(&mut self, bytenr: u64, generation: u64) {
        if let Some(h) = self.heads.get_mut(&bytenr) {
            h.generation = Some(generation);
        }
    }
    pub(crate) fn set_flags(&mut self, bytenr: u64, num_bytes: u64, flags: u64) {
        self.head(bytenr, num_bytes, false).set_flags |= flags;
    }
    pub(crate) fn get(&self, bytenr: u64) -> Option<&Head> {
        self.heads.get(&bytenr)
    }
    pub(crate) fn pop_first(&mut self) -> Option<(u64, Head)> {
        self.heads.pop_first()
    }
}
