//! A kernel balance cut short (power loss, crash) leaves relocation trees in the
//! root tree: ROOT_ITEMs `(TREE_RELOC -8, ROOT_ITEM, subvolume)` naming copies of
//! the subvolumes' paths to the blocks being moved. The kernel's recovery
//! (btrfs_recover_relocation) merges those in the merge stage (refs 1) and drops
//! the others, then its balance resume relocates the interrupted chunk again.
//!
//! ubtrfs drops every relocation tree, merged or not: at every committed state
//! both the subvolume tree and its relocation tree are complete trees with
//! consistent back references (each merge step swaps subtrees inside a
//! transaction), so dropping the relocation tree leaves the subvolume whole, with
//! some of its blocks already moved and the rest where they were. The BALANCE item
//! stays: `balance resume` (ubtrfs's or the kernel's) relocates the chunk again.
//! Relocation-tree blocks are FULL_BACKREF (children referenced by address) and the
//! root block's own reference names itself as parent (btrfs_alloc_tree_block with
//! no parent); a block still referenced elsewhere loses only this reference.
//! The data relocation tree's orphan inode (the chunk's data in flight) is left to
//! the kernel's orphan cleanup at its next mount; its extents stay referenced.

use crate::alloc::delayed_ref::RefKey;
use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::block_edit as eb;
use crate::tree::tree_checker::Expect;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::RootItem;
use ubtrfs_format::key::Key;

impl Trans {
    /// Drops every relocation tree and its ROOT_ITEM, and commits; returns how
    /// many there were (0: nothing written).
    pub(crate) fn recover_relocation(&mut self) -> Result<usize> {
        let rt = self.fs.info.root_tree_ptr();
        let mut found: Vec<(Key, RootItem)> = Vec::new();
        for item in crate::tree::ctree::TreeIter::new(
            &self.fs.info,
            &rt,
            Key::new(TREE_RELOC_OBJECTID, ROOT_ITEM_KEY, 0),
            Key::new(TREE_RELOC_OBJECTID, ROOT_ITEM_KEY, u64::MAX),
        )? {
            let item = item?;
            let k = item.key();
            let r = RootItem::parse(item.data())
                .map_err(|e| Error::corrupt(format!("root tree item {k}: {e}")))?;
            found.push((k, r));
        }
        if found.is_empty() {
            return Ok(0);
        }
        self.commit()?;
        for (k, r) in &found {
            self.drop_reloc_block(r.bytenr, r.level, RefKey::TreeShared(r.bytenr), None)?;
            self.delete_item(ROOT_TREE_OBJECTID, k)?;
        }
        self.commit()?;
        Ok(found.len())
    }

    /// Drops reference `r` to block `b`; when it was the last, the block's own
    /// references to its children (or data) go too, depth first.
    fn drop_reloc_block(
        &mut self,
        b: u64,
        level: u8,
        r: RefKey,
        generation: Option<u64>,
    ) -> Result<()> {
        let ns = self.fs.info.nodesize as u64;
        let (refs, flags) = self.lookup_extent_info(b, level)?;
        if refs == 0 {
            return Err(Error::corrupt(format!(
                "relocation tree block {b} has no references"
            )));
        }
        self.delayed.add(b, ns, false, r, -1);
        if refs > 1 {
            return Ok(());
        }
        let expect = Expect {
            level: Some(level),
            generation,
            first_key: None,
        };
        let blk = self.fs.info.read_tree_block(b, &expect)?;
        let full = flags & BLOCK_FLAG_FULL_BACKREF != 0;
        if level == 0 {
            return self.mod_refs(b, &blk.data, full, -1);
        }
        for i in 0..eb::nritems(&blk.data) {
            let c = eb::node_blockptr(&blk.data, i);
            let g = eb::node_ptr_gen(&blk.data, i);
            let cr = if full {
                RefKey::TreeShared(b)
            } else {
                RefKey::TreeRoot(blk.owner())
            };
            self.drop_reloc_block(c, level - 1, cr, Some(g))?;
        }
        Ok(())
    }
}
