//! The UUID tree (the kernel's uuid-tree.c): one item per (uuid, kind) holding the
//! ids of the subvolumes with that uuid (`UUID_KEY_SUBVOL`) or that received
//! uuid (`UUID_KEY_RECEIVED_SUBVOL`), which `btrfs send`/`receive` look
//! subvolumes up by. Kept item by item as subvolumes come and go, and checked
//! whole at a writing open, as the kernel's mount does.

use crate::error::Result;
use crate::transaction::Trans;
use crate::tree::ctree::{lookup_exact, TreeIter};
use std::collections::HashMap;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::RootItem;
use ubtrfs_format::key::Key;

impl Trans {
    /// The UUID tree's key for a uuid of kind `ty` (SUBVOL or RECEIVED_SUBVOL).
    fn uuid_key(uuid: &[u8; 16], ty: u8) -> Key {
        let half = |b: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        };
        Key::new(half(&uuid[..8]), ty, half(&uuid[8..]))
    }

    /// Adds subvolume `id` under `uuid` in the UUID tree (an item holds every id with
    /// that uuid). Without a UUID tree nothing is written (a writing open creates
    /// one: [`Trans::finish_uuid_tree`]).
    pub(crate) fn uuid_tree_add(&mut self, uuid: &[u8; 16], ty: u8, id: u64) -> Result<()> {
        let Ok(ptr) = self.root_ptr(UUID_TREE_OBJECTID) else {
            return Ok(());
        };
        let k = Self::uuid_key(uuid, ty);
        if let Some(it) = lookup_exact(&self.fs.info, &ptr, &k)? {
            if it.data().chunks(8).any(|c| c == id.to_le_bytes()) {
                return Ok(());
            }
        }
        self.append_to_item(UUID_TREE_OBJECTID, &k, &id.to_le_bytes())
    }

    /// Removes subvolume `id` from `uuid`'s UUID tree item (the item goes when empty).
    pub(crate) fn uuid_tree_remove(&mut self, uuid: &[u8; 16], ty: u8, id: u64) -> Result<()> {
        if self.root_ptr(UUID_TREE_OBJECTID).is_err() {
            return Ok(());
        }
        self.uuid_tree_remove_key(&Self::uuid_key(uuid, ty), id)
    }

    fn uuid_tree_remove_key(&mut self, k: &Key, id: u64) -> Result<()> {
        let want = id.to_le_bytes();
        self.remove_from_item(UUID_TREE_OBJECTID, k, |d| {
            (0..d.len() / 8)
                .find(|i| d[i * 8..i * 8 + 8] == want)
                .map(|i| (i * 8, i * 8 + 8))
        })?;
        Ok(())
    }

    /// What the kernel's writable mount does with the UUID tree: a filesystem
    /// without one (made before Linux 3.12) gets one ("creating UUID tree"), and
    /// one that may be stale — the superblock's `uuid_tree_generation` is not its
    /// generation (a writer that does not keep the tree wrote since, or mkfs made
    /// it), or the `rescan_uuid_tree` option asks — is checked ("checking UUID
    /// tree"): ids whose subvolume is gone or has another uuid leave their entry,
    /// then every live subvolume's uuid and received uuid get theirs. Committed,
    /// with `uuid_tree_generation` stamped, as the kernel's scan ends.
    pub(crate) fn finish_uuid_tree(&mut self) -> Result<()> {
        // Decided at open (`uuid_tree_unchecked`): a commit made since (a log
        // replay, orphan cleanup) must not have hidden a stale tree.
        if !self.uuid_tree_unchecked {
            return Ok(());
        }
        if self.root_ptr(UUID_TREE_OBJECTID).is_err() {
            self.create_tree(UUID_TREE_OBJECTID)?;
        }
        let live: HashMap<u64, RootItem> = crate::qgroup::rescan::live_fs_roots(&self.fs.info)?
            .into_iter()
            .collect();
        // Ids that no longer belong under their key.
        let mut wrong: Vec<(Key, u64)> = Vec::new();
        let ptr = self.root_ptr(UUID_TREE_OBJECTID)?;
        for item in TreeIter::new(&self.fs.info, &ptr, Key::MIN, Key::MAX)? {
            let item = item?;
            let k = item.key();
            if k.ty != UUID_KEY_SUBVOL && k.ty != UUID_KEY_RECEIVED_SUBVOL {
                continue;
            }
            if item.data().len() % 8 != 0 {
                // As the kernel's iteration: the item is passed over, the
                // filesystem still mounts.
                self.fs.info.warn(format!(
                    "UUID tree item {k}: size {} is not a multiple of 8, left as it is",
                    item.data().len()
                ));
                continue;
            }
            for c in item.data().chunks_exact(8) {
                let id = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                let belongs = live.get(&id).is_some_and(|r| {
                    let uuid = if k.ty == UUID_KEY_SUBVOL {
                        &r.uuid
                    } else {
                        &r.received_uuid
                    };
                    Self::uuid_key(uuid, k.ty) == k
                });
                if !belongs {
                    wrong.push((k, id));
                }
            }
        }
        for (k, id) in wrong {
            self.uuid_tree_remove_key(&k, id)?;
        }
        let mut ids: Vec<&u64> = live.keys().collect();
        ids.sort();
        for &id in ids {
            let r = &live[&id];
            for (uuid, ty) in [
                (&r.uuid, UUID_KEY_SUBVOL),
                (&r.received_uuid, UUID_KEY_RECEIVED_SUBVOL),
            ] {
                if uuid != &[0u8; 16] {
                    self.uuid_tree_add(uuid, ty, id)?;
                }
            }
        }
        // Any non-zero value: prepare_supers writes the committing generation.
        self.uuid_tree_unchecked = false;
        self.fs.info.sb.uuid_tree_generation = self.transid;
        self.commit()
    }
}
