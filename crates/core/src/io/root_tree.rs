//! The root tree (the kernel's root-tree.c): where each tree's root block is, read from
//! the ROOT_ITEMs of tree 1 and the superblock.

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::tree::RootPtr;
use std::collections::BTreeMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::RootItem;
use ubtrfs_format::key::Key;

impl FsInfo {
    /// Reads the ROOT_ITEMs of the well-known trees (ids below 256 and the data
    /// relocation tree) into `tree_roots`.
    pub(crate) fn load_tree_roots(&mut self) -> Result<()> {
        let root = self.root_tree_ptr();
        let mut roots = BTreeMap::new();
        crate::tree::ctree::walk_items(self, &root, Key::MIN, |k, data| {
            if k.ty == ROOT_ITEM_KEY
                && (k.objectid < FIRST_FREE_OBJECTID || k.objectid == DATA_RELOC_TREE_OBJECTID)
            {
                let r = RootItem::parse(data)
                    .map_err(|e| Error::corrupt(format!("root tree item {k}: {e}")))?;
                roots.insert(k.objectid, r);
            }
            // Subvolume root items (>= 256) come after; stop at the first of them.
            Ok(k.objectid < FIRST_FREE_OBJECTID)
        })?;
        // The data reloc tree's item sorts last; look it up directly.
        if let Some((k, data)) = crate::tree::ctree::lookup_prev(
            self,
            &root,
            Key::new(DATA_RELOC_TREE_OBJECTID, ROOT_ITEM_KEY, u64::MAX),
        )? {
            if k.objectid == DATA_RELOC_TREE_OBJECTID && k.ty == ROOT_ITEM_KEY {
                let r = RootItem::parse(&data)
                    .map_err(|e| Error::corrupt(format!("root tree item {k}: {e}")))?;
                roots.insert(DATA_RELOC_TREE_OBJECTID, r);
            }
        }
        for id in [EXTENT_TREE_OBJECTID, DEV_TREE_OBJECTID, FS_TREE_OBJECTID] {
            if !roots.contains_key(&id) {
                return Err(Error::corrupt(format!(
                    "root tree has no ROOT_ITEM for tree {id}"
                )));
            }
        }
        self.tree_roots = roots;
        Ok(())
    }

    /// The root tree's root pointer, from the superblock.
    pub fn root_tree_ptr(&self) -> RootPtr {
        RootPtr {
            id: ROOT_TREE_OBJECTID,
            bytenr: self.sb.root,
            level: self.sb.root_level,
            generation: self.sb.generation,
        }
    }

    /// The root pointer of a well-known tree, if it exists.
    pub fn tree_ptr(&self, id: u64) -> Option<RootPtr> {
        if id == ROOT_TREE_OBJECTID {
            return Some(self.root_tree_ptr());
        }
        if id == CHUNK_TREE_OBJECTID {
            return Some(RootPtr {
                id,
                bytenr: self.sb.chunk_root,
                level: self.sb.chunk_root_level,
                generation: self.sb.chunk_root_generation,
            });
        }
        self.tree_roots.get(&id).map(|r| root_ptr_of(id, r))
    }

    /// Finds the ROOT_ITEM of any tree (subvolume ids included).
    pub fn read_root_item(&self, id: u64) -> Result<Option<RootItem>> {
        if let Some(r) = self.tree_roots.get(&id) {
            return Ok(Some(r.clone()));
        }
        let root = self.root_tree_ptr();
        // Snapshots key their ROOT_ITEM by creation transid: search (id, ROOT_ITEM, -1)
        // and step back to the last item of that id.
        match crate::tree::ctree::lookup_prev(self, &root, Key::new(id, ROOT_ITEM_KEY, u64::MAX))? {
            Some((k, data)) if k.objectid == id && k.ty == ROOT_ITEM_KEY => {
                let r = RootItem::parse(&data)
                    .map_err(|e| Error::corrupt(format!("root tree item {k}: {e}")))?;
                Ok(Some(r))
            }
            _ => Ok(None),
        }
    }

    /// Root pointer of a subvolume (or any tree) by id.
    pub fn subvol_ptr(&self, id: u64) -> Result<Option<RootPtr>> {
        Ok(self.read_root_item(id)?.map(|r| root_ptr_of(id, &r)))
    }
}

pub(crate) fn root_ptr_of(id: u64, r: &RootItem) -> RootPtr {
    RootPtr {
        id,
        bytenr: r.bytenr,
        level: r.level,
        generation: r.generation,
    }
}
