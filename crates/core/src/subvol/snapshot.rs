//! Snapshot creation, the kernel's create_pending_snapshot: the source tree's root
//! block is CoWed and copied into a new root owned by the snapshot, whose children
//! gain a reference from it (so the whole tree is shared in constant time); the
//! source's `last_snapshot` becomes this transaction, which is what later CoWs test
//! to know that a block may be shared (see `update_ref_for_cow`).

use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::block_edit as eb;
use crate::tree::tree_checker::Expect;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::Timespec;
use ubtrfs_format::key::Key;

impl Trans {
    /// Snapshots subvolume `src` as `name` in directory `dir` of tree `parent`;
    /// returns the new tree's id. Commits first when anything is pending, because a
    /// block written in this transaction is assumed private to its tree (the
    /// kernel makes snapshots inside its commit for the same reason).
    #[allow(clippy::too_many_arguments)]
    pub fn create_snapshot(
        &mut self,
        src: u64,
        parent: u64,
        dir: u64,
        name: &[u8],
        readonly: bool,
        t: Timespec,
    ) -> Result<u64> {
        crate::inode::inode::check_name(name)?;
        self.require_dir(parent, dir)?;
        if self.lookup(parent, dir, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        let src_item = self.root_item(src)?;
        if src_item.refs == 0 || src_item.flags & ROOT_SUBVOL_DEAD != 0 {
            return Err(Error::NotFound(format!("subvolume {src} (being deleted)")));
        }
        if self.dirty_bytes() > 0 || self.has_pending_work() {
            self.commit()?;
        }
        let id = self.free_root_id()?;
        let transid = self.transid;
        self.modify_root_item(src, |r| r.last_snapshot = transid)?;
        // CoW the source's root (private to it: nothing below changes), then copy it.
        let (old_root, _) = self.root_node(src)?;
        let src_root = self.cow_block(src, old_root, None, Expect::default())?;
        let mut data = self.block(src_root)?.data.clone();
        let new_root = self.alloc_tree_block(id, eb::level(&data), eb::first_key(&data), 0)?;
        eb::set_bytenr(&mut data, new_root);
        eb::set_generation(&mut data, transid);
        eb::set_owner(&mut data, id);
        let flags = eb::flags(&data)
            & ((1u64 << BACKREF_REV_SHIFT) - 1)
            & !(HEADER_FLAG_WRITTEN | HEADER_FLAG_RELOC);
        eb::set_flags(&mut data, flags | (MIXED_BACKREF_REV << BACKREF_REV_SHIFT));
        // Every child (or data extent, for a one-leaf tree) gains the snapshot's ref.
        self.mod_refs(new_root, &data, false, 1)?;
        let level = eb::level(&data);
        self.put_dirty(new_root, data)?;

        let src_item = self.root_item(src)?;
        let mut item = src_item.clone();
        // As create_pending_snapshot: the copy is made valid before its flags are
        // set, so the kernel keeps a read-only flag it finds with the mark.
        item.check_and_init();
        item.flags = if readonly {
            item.flags | ROOT_SUBVOL_RDONLY
        } else {
            item.flags & !ROOT_SUBVOL_RDONLY
        };
        item.flags &= !ROOT_SUBVOL_DEAD;
        item.bytenr = new_root;
        item.level = level;
        item.generation = transid;
        item.generation_v2 = transid;
        item.refs = 1;
        item.drop_progress = Key::new(0, 0, 0);
        item.drop_level = 0;
        item.uuid = crate::io::dev::random_uuid();
        item.parent_uuid = src_item.uuid;
        item.otime = t;
        item.otransid = transid;
        if !readonly {
            // A writable snapshot is no longer what was received.
            item.received_uuid = [0; 16];
            item.stime = Timespec::default();
            item.rtime = Timespec::default();
            item.stransid = 0;
            item.rtransid = 0;
        }
        let (uuid, received) = (item.uuid, item.received_uuid);
        // Snapshots key their ROOT_ITEM by the creating transaction.
        self.create_root_item(id, Key::new(id, ROOT_ITEM_KEY, transid), item)?;
        // bytes_used is the source's, as the kernel copies it: the root block's
        // copy is charged to neither tree.
        *self.root_bytes_delta.entry(id).or_insert(0) -= self.fs.info.nodesize as i64;
        self.qgroup_new_subvolume(id, Some(src), parent)?;
        self.link_new_subvol(parent, dir, name, id, &uuid, t)?;
        if received != [0; 16] {
            self.uuid_tree_add(&received, UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        Ok(id)
    }
}
