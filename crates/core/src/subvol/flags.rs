//! What a subvolume is marked with: the default subvolume (the root tree's "default"
//! directory entry, which a mount without subvol= opens) and the read-only flag (the
//! kernel's SUBVOL_SETFLAGS and SET_RECEIVED_SUBVOL ioctls).

use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::ctree::lookup_exact;
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::{parse_dir_items, Timespec};
use ubtrfs_format::key::Key;

impl Trans {
    /// Makes subvolume `id` (0 or 5: the top level) the default, as `btrfs subvolume
    /// set-default`: the "default" entry's location changes and the DEFAULT_SUBVOL
    /// incompat flag is set.
    pub fn set_default_subvolume(&mut self, id: u64) -> Result<()> {
        let id = if id == 0 { FS_TREE_OBJECTID } else { id };
        let item = self
            .root_item(id)
            .map_err(|_| Error::NotFound(format!("subvolume {id}")))?;
        if item.refs == 0 {
            return Err(Error::NotFound(format!("subvolume {id} (deleted)")));
        }
        let root_key = *self
            .root_keys
            .get(&id)
            .ok_or_else(|| Error::NotFound(format!("subvolume {id}")))?;
        let key = Key::new(ROOT_TREE_DIR_OBJECTID, DIR_ITEM_KEY, name_hash(b"default"));
        let rt = self.fs.info.root_tree_ptr();
        let it = lookup_exact(&self.fs.info, &rt, &key)?.ok_or_else(|| {
            Error::corrupt("root tree: no \"default\" directory entry to point elsewhere")
        })?;
        let entries = parse_dir_items(it.data())
            .map_err(|e| Error::corrupt(format!("root tree dir item {key}: {e}")))?;
        drop(it);
        let Some(pos) = entries.iter().position(|d| d.name == b"default") else {
            return Err(Error::corrupt("root tree: no \"default\" directory entry"));
        };
        // Entries before it in the item: 30-byte header + name + data each.
        let off: usize = entries[..pos]
            .iter()
            .map(|d| 30 + d.name.len() + d.data.len())
            .sum();
        let loc = root_key.to_bytes();
        self.update_item(ROOT_TREE_OBJECTID, &key, |d| {
            d[off..off + 17].copy_from_slice(&loc)
        })?;
        self.fs.info.sb.incompat_flags |= FEATURE_INCOMPAT_DEFAULT_SUBVOL;
        Ok(())
    }

    /// Sets or clears a subvolume's read-only flag. Making a received subvolume
    /// writable needs `clear_received` (its received_uuid then goes, as `btrfs
    /// property set -f` does), because send would otherwise trust a changed tree.
    pub fn set_subvolume_readonly(
        &mut self,
        id: u64,
        readonly: bool,
        clear_received: bool,
        t: Timespec,
    ) -> Result<()> {
        let item = self.root_item(id)?;
        if item.refs == 0 {
            return Err(Error::NotFound(format!("subvolume {id} (deleted)")));
        }
        let received = item.received_uuid;
        if !readonly && received != [0; 16] && item.flags & ROOT_SUBVOL_RDONLY != 0 {
            if !clear_received {
                return Err(Error::Invalid(format!(
                    "subvolume {id} was received (received_uuid set): making it writable \
                     clears that, force it to"
                )));
            }
            self.uuid_tree_remove(&received, UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        let transid = self.transid;
        self.modify_root_item(id, |r| {
            if readonly {
                r.flags |= ROOT_SUBVOL_RDONLY;
            } else {
                r.flags &= !ROOT_SUBVOL_RDONLY;
                if received != [0; 16] {
                    r.received_uuid = [0; 16];
                    r.stransid = 0;
                    r.stime = Timespec::default();
                    r.rtransid = transid;
                    r.rtime = t;
                }
            }
        })
    }
}
