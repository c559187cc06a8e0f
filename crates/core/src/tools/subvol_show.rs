//! What `subvolume show` prints of one subvolume, gathered from a filesystem: its
//! ROOT_ITEM, where it is linked, the snapshots made of it (subvolumes whose
//! parent_uuid is its uuid) and whether quotas are on. The command formats it;
//! a mount's process gathers it for a command given a mounted directory.

use crate::error::Result;
use crate::fs::Filesystem;
use ubtrfs_format::consts::QUOTA_TREE_OBJECTID;
use ubtrfs_format::items::RootItem;

/// One subvolume, as `subvolume show` describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubvolShow {
    /// Subvolume id.
    pub id: u64,
    /// Its path from the top level; None for the top level itself.
    pub path: Option<String>,
    /// The subvolume holding its entry (0 for the top level).
    pub top_level: u64,
    /// Its ROOT_ITEM.
    pub item: RootItem,
    /// Paths of the snapshots made of it.
    pub snapshots: Vec<String>,
    /// A quota tree exists.
    pub quota_enabled: bool,
}

/// Gathers [`SubvolShow`] for subvolume `id`.
pub fn subvol_show(fs: &Filesystem, id: u64) -> Result<SubvolShow> {
    let item = fs.subvol_root_item(id)?;
    let subs = fs.subvolumes()?;
    let me = subs.iter().find(|s| s.id == id);
    let snapshots = if item.uuid == [0; 16] {
        Vec::new()
    } else {
        let mine = ubtrfs_format::bytes::uuid_string(&item.uuid);
        subs.iter()
            .filter(|s| s.parent_uuid == mine)
            .map(|s| s.path.clone())
            .collect()
    };
    Ok(SubvolShow {
        id,
        path: me.map(|s| s.path.clone()),
        top_level: me.map_or(0, |s| s.top_level),
        item,
        snapshots,
        quota_enabled: fs.try_root(QUOTA_TREE_OBJECTID)?.is_some(),
    })
}
