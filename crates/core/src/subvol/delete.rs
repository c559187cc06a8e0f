//! Subvolume deletion, in the kernel's two halves:
//!
//! 1. [`Trans::delete_subvolume`] (the kernel's btrfs_delete_subvolume): the entry in
//!    the parent directory, ROOT_REF/ROOT_BACKREF and the UUID tree entries go; the
//!    ROOT_ITEM gets refs 0 and the DEAD flag, and an ORPHAN_ITEM in the root tree
//!    marks the tree for the cleaner. This commits like any edit.
//! 2. The cleaner, [`Trans::drop_dead_root_step`] (btrfs_drop_snapshot): walks the dead
//!    tree top-down, dropping its references. A block only it references (refs 1) is
//!    entered and freed after its children; a shared block is not entered — its
//!    reference from the dead tree is dropped — except that a shared block the dead
//!    tree itself created after its own origin has its children's references turned
//!    into by-address (FULL_BACKREF) ones first, because the tree that owned them is
//!    going away (the kernel's UPDATE_BACKREF stage). After each step the position is
//!    saved in the ROOT_ITEM's drop_progress/drop_level, so a deletion interrupted at
//!    any commit resumes — here or in the kernel — where it stopped.

use crate::alloc::delayed_ref::RefKey;
use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::block_edit as eb;
use crate::tree::ctree::{lookup_exact, TreeIter};
use crate::tree::tree_checker::Expect;
use crate::tree::TreeBlock;
use std::sync::Arc;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{parse_dir_items, RootRef, Timespec};
use ubtrfs_format::key::Key;

/// Tree blocks the cleaner visits between two saves of its position (and commits,
/// when driven by [`Trans::drop_dead_roots`]).
pub(crate) const DROP_BLOCKS_PER_COMMIT: u64 = 4096;

/// One block on the cleaner's path, root first.
struct Frame {
    block: Arc<TreeBlock>,
    refs: u64,
    flags: u64,
    /// Next child (nodes) to look at.
    slot: usize,
}

impl Frame {
    fn level(&self) -> u8 {
        eb::level(&self.block.data)
    }
    fn nritems(&self) -> usize {
        eb::nritems(&self.block.data)
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Stage {
    /// Dropping the dead tree's references.
    DropReference,
    /// Converting the references below a shared block at `shared_level` to
    /// by-address ones before dropping the dead tree's reference to it.
    UpdateBackref { shared_level: u8 },
}

struct Walk {
    id: u64,
    /// Generation the tree was created in (its ROOT_ITEM key offset; 0 for a
    /// subvolume): blocks no newer than that were shared by its source and need no
    /// conversion.
    origin: u64,
    frames: Vec<Frame>,
    stage: Stage,
    update_ref: bool,
    /// Shared blocks before this key were converted already.
    update_progress: Key,
}

impl Trans {
    /// Deletes the subvolume entry `name` in directory `dir` of tree `parent` and marks
    /// the subvolume's tree for the cleaner; returns its id. Refused as the kernel
    /// refuses: the default subvolume (EPERM), one that holds other subvolumes
    /// (ENOTEMPTY). The entry of a nested subvolume seen inside a snapshot (no
    /// ROOT_REF: the kernel's empty stand-in directory) is just removed, as the
    /// kernel's rmdir does.
    pub fn delete_subvolume(
        &mut self,
        parent: u64,
        dir: u64,
        name: &[u8],
        t: Timespec,
    ) -> Result<u64> {
        let shown = || String::from_utf8_lossy(name).into_owned();
        self.require_dir(parent, dir)?;
        let (id, _, loc) = self
            .lookup(parent, dir, name)?
            .ok_or_else(|| Error::NotFound(shown()))?;
        if loc.ty != ROOT_ITEM_KEY {
            return Err(Error::Invalid(format!("{}: not a subvolume", shown())));
        }
        let rt = self.fs.info.root_tree_ptr();
        let linked = lookup_exact(&self.fs.info, &rt, &Key::new(parent, ROOT_REF_KEY, id))?
            .map(|it| RootRef::parse(it.data()))
            .transpose()
            .map_err(|e| Error::corrupt(format!("root ref {parent} -> {id}: {e}")))?
            .filter(|r| r.dirid == dir && r.name == name);
        let Some(rr) = linked else {
            self.remove_subvol_entry(parent, dir, name, None, t)?;
            return Ok(id);
        };
        if self.default_subvolume()? == id {
            return Err(Error::NotPermitted(format!(
                "{}: subvolume {id} is the default subvolume (set another default first)",
                shown()
            )));
        }
        let children = TreeIter::new(
            &self.fs.info,
            &rt,
            Key::new(id, ROOT_REF_KEY, 0),
            Key::new(id, ROOT_REF_KEY, u64::MAX),
        )?
        .next()
        .transpose()?;
        if let Some(c) = children {
            return Err(Error::NotEmpty(format!(
                "{}: subvolume {id} holds subvolume {} (delete that first)",
                shown(),
                c.key().offset
            )));
        }
        self.remove_subvol_entry(parent, dir, name, Some(rr.sequence), t)?;
        self.delete_item(ROOT_TREE_OBJECTID, &Key::new(parent, ROOT_REF_KEY, id))?;
        self.delete_item(ROOT_TREE_OBJECTID, &Key::new(id, ROOT_BACKREF_KEY, parent))?;
        let item = self.root_item(id)?;
        self.uuid_tree_remove(&item.uuid, UUID_KEY_SUBVOL, id)?;
        if item.received_uuid != [0; 16] {
            self.uuid_tree_remove(&item.received_uuid, UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        self.modify_root_item(id, |r| {
            r.refs = 0;
            r.flags |= ROOT_SUBVOL_DEAD;
            r.drop_progress = Key::new(0, 0, 0);
            r.drop_level = 0;
        })?;
        self.insert_item(
            ROOT_TREE_OBJECTID,
            &Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id),
            &[],
        )?;
        self.touch_root(parent, t)?;
        Ok(id)
    }

    /// Moves the entry of subvolume `oname` (in `odir` of tree `parent`) to `nname` in
    /// `ndir` of the same tree, as the kernel's rename does for a subvolume: the
    /// entries move and ROOT_REF/ROOT_BACKREF are rewritten with the new directory,
    /// index and name. An existing target must be an empty directory (it is removed)
    /// unless `noreplace`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rename_subvolume(
        &mut self,
        parent: u64,
        odir: u64,
        oname: &[u8],
        ndir: u64,
        nname: &[u8],
        noreplace: bool,
        t: Timespec,
    ) -> Result<()> {
        crate::inode::inode::check_name(nname)?;
        let (id, _, _) = self
            .lookup(parent, odir, oname)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(oname).into_owned()))?;
        let rt = self.fs.info.root_tree_ptr();
        let Some(rr) = lookup_exact(&self.fs.info, &rt, &Key::new(parent, ROOT_REF_KEY, id))?
            .map(|it| RootRef::parse(it.data()))
            .transpose()
            .map_err(|e| Error::corrupt(format!("root ref {parent} -> {id}: {e}")))?
        else {
            return Err(Error::Invalid(format!(
                "{}: the stand-in of a subvolume inside a snapshot cannot move",
                String::from_utf8_lossy(oname)
            )));
        };
        if let Some((tino, tty, tloc)) = self.lookup(parent, ndir, nname)? {
            let shown = String::from_utf8_lossy(nname).into_owned();
            if noreplace {
                return Err(Error::Exists(shown));
            }
            if tloc.ty == ROOT_ITEM_KEY {
                // As the kernel: ENOTEMPTY over a subvolume, empty or not.
                return Err(Error::NotEmpty(shown));
            }
            if tty != FT_DIR {
                return Err(Error::NotDir(shown));
            }
            // (A plain directory: `tino` is an inode number, never this subvolume.
            // Comparing it with the subvolume's tree id once took a directory whose
            // inode number equalled that id for the subvolume itself: found by the
            // model test.)
            let _ = tino;
            self.rmdir(parent, ndir, nname, t)?;
        }
        self.remove_subvol_entry(parent, odir, oname, Some(rr.sequence), t)?;
        let index = self.add_subvol_entry(parent, ndir, nname, id, t)?;
        self.put_root_refs(parent, id, ndir, index, nname, true)?;
        self.touch_root(parent, t)
    }

    /// Removes a subvolume's DIR_ITEM and DIR_INDEX from its parent directory.
    fn remove_subvol_entry(
        &mut self,
        parent: u64,
        dir: u64,
        name: &[u8],
        index: Option<u64>,
        t: Timespec,
    ) -> Result<()> {
        // A replay cannot move or drop a name that points at another tree.
        self.log_full_commit = Some("subvolume entry renamed or removed in this transaction");
        let index = match index {
            Some(i) => i,
            None => self.dir_index_of(parent, dir, name)?,
        };
        let mut d = self.remove_dir_entry(parent, dir, name, index)?;
        self.touch(&mut d, t, true);
        self.write_inode(parent, dir, &d)?;
        Ok(())
    }

    /// The DIR_INDEX offset of `name` in `dir` (a scan: entries of subvolumes have no
    /// INODE_REF to say it).
    fn dir_index_of(&self, root: u64, dir: u64, name: &[u8]) -> Result<u64> {
        let ptr = self.root_ptr(root)?;
        for it in TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(dir, DIR_INDEX_KEY, 0),
            Key::new(dir, DIR_INDEX_KEY, u64::MAX),
        )? {
            let it = it?;
            let items = parse_dir_items(it.data())
                .map_err(|e| Error::corrupt(format!("dir index {}: {e}", it.key())))?;
            if items.iter().any(|d| d.name == name) {
                return Ok(it.key().offset);
            }
        }
        Err(Error::corrupt(format!(
            "tree {root} directory {dir}: entry {} has no DIR_INDEX",
            String::from_utf8_lossy(name)
        )))
    }

    /// The default subvolume (see [`crate::Filesystem::default_subvolume`]).
    pub fn default_subvolume(&self) -> Result<u64> {
        self.fs.default_subvolume()
    }

    /// Trees deleted and not yet dropped: the ORPHAN_ITEMs of the root tree.
    pub fn dead_roots(&self) -> Result<Vec<u64>> {
        let rt = self.fs.info.root_tree_ptr();
        let mut out = Vec::new();
        for it in TreeIter::new(
            &self.fs.info,
            &rt,
            Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, 0),
            Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, u64::MAX),
        )? {
            out.push(it?.key().offset);
        }
        Ok(out)
    }

    /// Drops every dead tree to the end, committing after each step of
    /// `blocks_per_commit` tree blocks (None: `DROP_BLOCKS_PER_COMMIT` = 4096), so an
    /// interruption loses at most one step; stops early after `max_commits` steps
    /// (tests leave a half-dropped tree that way). `progress` gets the tree blocks
    /// visited so far. Returns the trees dropped completely.
    pub fn drop_dead_roots(
        &mut self,
        blocks_per_commit: Option<u64>,
        max_commits: Option<u64>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Vec<u64>> {
        let budget = blocks_per_commit.unwrap_or(DROP_BLOCKS_PER_COMMIT).max(1);
        let mut done = Vec::new();
        let mut visited = 0u64;
        let mut commits = 0u64;
        for id in self.dead_roots()? {
            loop {
                if max_commits.is_some_and(|m| commits >= m) {
                    return Ok(done);
                }
                let (finished, n) = self.drop_dead_root_step(id, budget)?;
                visited += n;
                progress(visited);
                self.commit()?;
                commits += 1;
                if finished {
                    break;
                }
            }
            done.push(id);
        }
        Ok(done)
    }

    /// One step of the cleaner on dead tree `id`: visits up to `budget` tree blocks
    /// from where the last step stopped, saves the position in the ROOT_ITEM, and when
    /// the whole tree is dropped removes its ROOT_ITEM and ORPHAN_ITEM. Nothing is
    /// committed here. Returns (finished, blocks visited).
    pub fn drop_dead_root_step(&mut self, id: u64, budget: u64) -> Result<(bool, u64)> {
        let item = self.root_item(id)?;
        if item.refs != 0 {
            return Err(Error::Invalid(format!(
                "tree {id} is not deleted (refs {})",
                item.refs
            )));
        }
        if self.dirty_bytes() > 0 || self.has_pending_work() {
            // The walk reads the committed tree; a block written in this
            // transaction would not be what the extent tree says yet.
            self.commit()?;
        }
        let origin = self.root_keys.get(&id).map_or(0, |k| k.offset);
        let mut w = Walk {
            id,
            origin,
            frames: Vec::new(),
            stage: Stage::DropReference,
            update_ref: true,
            update_progress: Key::new(0, 0, 0),
        };
        let root = self.fs.info.read_tree_block(
            item.bytenr,
            &Expect {
                level: Some(item.level),
                ..Default::default()
            },
        )?;
        let (refs, flags) = self.lookup_extent_info(root.bytenr, root.level())?;
        w.frames.push(Frame {
            block: root,
            refs,
            flags,
            slot: 0,
        });
        if item.drop_progress.objectid != 0 {
            self.resume_walk(&mut w, item.drop_progress, item.drop_level)?;
            w.update_progress = item.drop_progress;
        }
        let mut visited = 0u64;
        loop {
            let Some(top) = w.frames.last() else {
                self.finish_drop(id)?;
                return Ok((true, visited));
            };
            let level = top.level();
            if level == 0 || top.slot >= top.nritems() {
                self.walk_up(&mut w)?;
                continue;
            }
            if visited >= budget && w.stage == Stage::DropReference {
                let key = eb::node_key(&top.block.data, top.slot);
                self.modify_root_item(id, |r| {
                    r.drop_progress = key;
                    r.drop_level = level;
                })?;
                return Ok((false, visited));
            }
            if self.walk_down(&mut w)? {
                visited += 1;
            }
        }
    }

    /// Rebuilds the cleaner's path to `key` at `level` (each block above it is still
    /// referenced by the dead tree alone).
    fn resume_walk(&mut self, w: &mut Walk, key: Key, level: u8) -> Result<()> {
        loop {
            let Some(top) = w.frames.last_mut() else {
                return Ok(());
            };
            let l = top.level();
            if l == 0 {
                return Ok(());
            }
            let n = top.nritems();
            let mut slot = 0;
            while slot + 1 < n && eb::node_key(&top.block.data, slot + 1) <= key {
                slot += 1;
            }
            top.slot = slot;
            if l == level {
                return Ok(());
            }
            if top.refs != 1 {
                return Err(Error::corrupt(format!(
                    "tree {}: block {} above the drop position has {} references",
                    w.id, top.block.bytenr, top.refs
                )));
            }
            let child = self.read_child(&top.block, slot)?;
            let (refs, flags) = self.lookup_extent_info(child.bytenr, child.level())?;
            w.frames.push(Frame {
                block: child,
                refs,
                flags,
                slot: 0,
            });
        }
    }

    fn read_child(&self, parent: &TreeBlock, slot: usize) -> Result<Arc<TreeBlock>> {
        let d = &parent.data;
        self.fs.info.read_tree_block(
            eb::node_blockptr(d, slot),
            &Expect {
                level: Some(eb::level(d) - 1),
                generation: Some(eb::node_ptr_gen(d, slot)),
                first_key: Some(eb::node_key(d, slot)),
            },
        )
    }

    /// The reference by which the block below `frames[i]` is held: by address when
    /// that parent is FULL_BACKREF, else by the dead tree.
    fn ref_from(w: &Walk, parent: Option<&Frame>) -> RefKey {
        match parent {
            Some(p) if p.flags & BLOCK_FLAG_FULL_BACKREF != 0 => RefKey::TreeShared(p.block.bytenr),
            _ => RefKey::TreeRoot(w.id),
        }
    }

    /// Looks at the child under the top frame's slot: enters it (true) or drops the
    /// dead tree's reference to it and moves on (false).
    fn walk_down(&mut self, w: &mut Walk) -> Result<bool> {
        let ns = self.fs.info.nodesize as u64;
        let Some(top) = w.frames.last_mut() else {
            return Ok(false);
        };
        let level = top.level();
        let d = &top.block.data;
        let child = eb::node_blockptr(d, top.slot);
        let gen = eb::node_ptr_gen(d, top.slot);
        let key = eb::node_key(d, top.slot);
        if matches!(w.stage, Stage::UpdateBackref { .. }) && gen <= w.origin {
            top.slot += 1;
            return Ok(false);
        }
        let (refs, flags) = self.lookup_extent_info(child, level - 1)?;
        if refs == 0 {
            return Err(Error::corrupt(format!(
                "tree {}: block {child} (in node {}) has no references",
                w.id, top.block.bytenr
            )));
        }
        let leaf_done = level == 1 && flags & BLOCK_FLAG_FULL_BACKREF != 0;
        let enter = match w.stage {
            Stage::DropReference if refs > 1 => {
                let convert =
                    !leaf_done && w.update_ref && gen > w.origin && key >= w.update_progress;
                if convert {
                    w.stage = Stage::UpdateBackref {
                        shared_level: level - 1,
                    };
                }
                convert
            }
            Stage::DropReference => true,
            Stage::UpdateBackref { .. } => !leaf_done,
        };
        if !enter {
            if w.stage == Stage::DropReference {
                let r = Self::ref_from(w, w.frames.last());
                self.delayed.add(child, ns, false, r, -1);
                // Still shared: everything below loses the dead tree unseen.
                self.qgroup_trace_subtree(child, level - 1)?;
            }
            if let Some(top) = w.frames.last_mut() {
                top.slot += 1;
            }
            return Ok(false);
        }
        let slot = top.slot;
        let block = self.read_child(&top.block, slot)?;
        let mut f = Frame {
            block,
            refs,
            flags,
            slot: 0,
        };
        if matches!(w.stage, Stage::UpdateBackref { .. }) && f.flags & BLOCK_FLAG_FULL_BACKREF == 0
        {
            // The children now hang off this block's address, not the dead tree.
            let (b, data) = (f.block.bytenr, &f.block.data);
            self.mod_refs(b, data, true, 1)?;
            self.mod_refs(b, data, false, -1)?;
            self.delayed.set_flags(b, ns, BLOCK_FLAG_FULL_BACKREF);
            f.flags |= BLOCK_FLAG_FULL_BACKREF;
        }
        w.frames.push(f);
        Ok(true)
    }

    /// Leaves the top block: in the drop stage its references go (a leaf only the dead
    /// tree held drops its file extents' references first); the block at the end of
    /// a conversion returns the walk to the drop stage.
    fn walk_up(&mut self, w: &mut Walk) -> Result<()> {
        let ns = self.fs.info.nodesize as u64;
        let Some(f) = w.frames.pop() else {
            return Ok(());
        };
        if let Stage::UpdateBackref { shared_level } = w.stage {
            if f.level() < shared_level {
                self.advance(w);
                return Ok(());
            }
            // Back at the shared block: remember how far conversion got.
            w.stage = Stage::DropReference;
            match self.next_key_above(w) {
                Some(k) => w.update_progress = k,
                None => w.update_ref = false,
            }
        }
        if f.refs == 1 && f.level() == 0 {
            let full = f.flags & BLOCK_FLAG_FULL_BACKREF != 0;
            self.mod_refs(f.block.bytenr, &f.block.data, full, -1)?;
        }
        let r = match w.frames.last() {
            Some(p) => Self::ref_from(w, Some(p)),
            None if f.flags & BLOCK_FLAG_FULL_BACKREF != 0 => RefKey::TreeShared(f.block.bytenr),
            None => RefKey::TreeRoot(w.id),
        };
        self.delayed.add(f.block.bytenr, ns, false, r, -1);
        if f.refs > 1 {
            self.qgroup_trace_subtree(f.block.bytenr, f.level())?;
        }
        self.advance(w);
        Ok(())
    }

    fn advance(&self, w: &mut Walk) {
        if let Some(p) = w.frames.last_mut() {
            p.slot += 1;
        }
    }

    /// The key after the current path position at any level above (where the walk
    /// goes next), None at the end of the tree.
    fn next_key_above(&self, w: &Walk) -> Option<Key> {
        w.frames
            .iter()
            .rev()
            .find(|f| f.slot + 1 < f.nritems())
            .map(|f| eb::node_key(&f.block.data, f.slot + 1))
    }

    /// The dead tree is gone: its ROOT_ITEM and ORPHAN_ITEM follow.
    fn finish_drop(&mut self, id: u64) -> Result<()> {
        let key = match self.root_keys.get(&id) {
            Some(k) => *k,
            None => return Err(Error::corrupt(format!("tree {id}: ROOT_ITEM key unknown"))),
        };
        self.delete_item(ROOT_TREE_OBJECTID, &key)?;
        self.delete_item(
            ROOT_TREE_OBJECTID,
            &Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, id),
        )?;
        self.root_keys.remove(&id);
        self.dirty_roots.remove(&id);
        self.root_bytes_delta.remove(&id);
        self.fs.info.tree_roots.remove(&id);
        self.root_id_floor = self.root_id_floor.max(id + 1);
        self.fs.forget_root(id);
        // Its qgroup goes at the commit once empty (the kernel's
        // btrfs_qgroup_cleanup_dropped_subvolume).
        self.quota_pending.dropped.push(id);
        Ok(())
    }
}
