//! st_ino (and readdir's d_ino) of every file on a mount that spans subvolumes.
//!
//! The kernel gives each btrfs subvolume its own st_dev (an anonymous block device),
//! so (st_dev, st_ino) names one file although inode numbers repeat across
//! subvolumes (every subvolume root is 256, a snapshot repeats all of its source's
//! numbers). A FUSE connection has one superblock, hence one st_dev: the kernel's
//! fuse module fills st_dev from the superblock, and the only way out, automatic
//! submounts (FUSE_ATTR_SUBMOUNT), is enabled by virtiofs alone (`fc->auto_submounts`
//! is set in fs/fuse/virtio_fs.c only). Tools that identify files by (st_dev, st_ino)
//! (find and du's directory-cycle checks, hard-link detection in du, tar, cp -a,
//! rsync -H, git's index) would take a snapshot's files for hard links of their
//! sources, and a nested subvolume root for a loop.
//!
//! So [`InoMode::Unique`] (the default) keeps the btrfs inode number for every file
//! of the subvolume at the mountpoint, which is what the kernel shows there, and
//! numbers the files of every other subvolume `(subvolume id << 40) | inode`:
//!
//! * the mounted subvolume's numbers are below 2^40 (checked at mount: its highest
//!   inode number; reaching 2^40 would take a trillion creations);
//! * subvolume ids are 5 or at least 256, so packed numbers are at least 5 * 2^40:
//!   they never meet the mounted subvolume's, and two of them are equal only for
//!   the same (subvolume, inode) when the subvolume id is below 2^24 and the inode
//!   number below 2^40;
//! * the rare rest (subvolume ids from 2^24, inode numbers from 2^40) get numbers
//!   from a table filled as they are met, counting up from 2^40, below 5 * 2^40:
//!   again disjoint from both. These are stable for the life of the mount only.
//!
//! Packed numbers are stable across mounts. The ino-2 placeholder directory of a
//! subvolume inside a snapshot belongs to the snapshot, like on the kernel: it is
//! inode 2 of the snapshot's number space (2 if the snapshot is mounted).
//!
//! If the mounted subvolume has inode numbers from 2^40 (a crafted image), every
//! other subvolume's files use the table, counting down from 2^64 - 1: the first 255
//! of those are above the largest inode number btrfs allows (2^64 - 256); `mount`
//! warns that more may collide.

use std::collections::HashMap;
use std::sync::Mutex;
use ubtrfs_core::Node;

/// What st_ino shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InoMode {
    /// The btrfs inode number, as the kernel shows it (every subvolume root is 256),
    /// and the kernel's d_ino (a subvolume's id for its entry). With one st_dev for
    /// the whole mount, tools that detect directory cycles or hard links by
    /// (st_dev, st_ino) see nested subvolume roots as loops and a snapshot's files
    /// as hard links of their source.
    Kernel,
    /// Files of the subvolume at the mountpoint keep their inode numbers; those of
    /// other subvolumes get numbers unique on the mount (module `ino`). The default.
    Unique,
}

/// Bits of a packed number given to the inode number.
const INO_BITS: u32 = 40;
/// Subvolume ids that fit the 24 bits above them.
const SUBVOL_LIMIT: u64 = 1 << (64 - INO_BITS);
/// First number of the table when packing is in use: above every inode number of the
/// mounted subvolume.
const TABLE_FIRST: u64 = 1 << INO_BITS;
/// First packed number (the smallest subvolume id, the top level, is 5).
const TABLE_END: u64 = 5 << INO_BITS;

#[derive(Debug, Default)]
struct Table {
    by_node: HashMap<(u64, u64), u64>,
    /// Numbers handed out so far.
    used: u64,
}

/// The st_ino of every (subvolume, inode) on one mount.
#[derive(Debug)]
pub(crate) struct InoMap {
    mode: InoMode,
    /// The subvolume at the mountpoint.
    root: u64,
    /// The mounted subvolume's inode numbers are below 2^40: packing is safe.
    packed: bool,
    table: Mutex<Table>,
}

impl InoMap {
    /// `root` is the subvolume at the mountpoint, `highest` its highest inode number.
    pub(crate) fn new(mode: InoMode, root: u64, highest: u64) -> InoMap {
        InoMap {
            mode,
            root,
            packed: highest < TABLE_FIRST,
            table: Mutex::new(Table::default()),
        }
    }

    /// False when the mounted subvolume's inode numbers are so high that other
    /// subvolumes' numbers cannot be kept apart from them for sure.
    pub(crate) fn collision_free(&self) -> bool {
        self.mode == InoMode::Kernel || self.packed
    }

    /// st_ino of `node`.
    pub(crate) fn st_ino(&self, node: Node) -> u64 {
        if self.mode == InoMode::Kernel || node.root == self.root {
            return node.ino;
        }
        if self.packed && node.root < SUBVOL_LIMIT && node.ino < TABLE_FIRST {
            return (node.root << INO_BITS) | node.ino;
        }
        self.table_number(node)
    }

    /// d_ino of a directory entry for `node` whose DIR_ITEM names object `location`.
    pub(crate) fn d_ino(&self, node: Node, location: u64) -> u64 {
        match self.mode {
            // The kernel's readdir gives the entry's location: a subvolume's id for a
            // subvolume, not its root's 256.
            InoMode::Kernel => location,
            InoMode::Unique => self.st_ino(node),
        }
    }

    fn table_number(&self, node: Node) -> u64 {
        // A panic holding the lock cannot leave the map inconsistent: keep serving.
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&n) = t.by_node.get(&(node.root, node.ino)) {
            return n;
        }
        let n = if self.packed {
            // 2^42 numbers: a mount never meets that many files.
            TABLE_FIRST + t.used.min(TABLE_END - TABLE_FIRST - 1)
        } else {
            u64::MAX - t.used
        };
        t.used += 1;
        t.by_node.insert((node.root, node.ino), n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholder(root: u64) -> Node {
        Node {
            root,
            ino: 2,
            parent_dir: 256,
        }
    }

    #[test]
    fn mounted_subvolume_keeps_numbers_others_are_packed() {
        let m = InoMap::new(InoMode::Unique, 5, 1000);
        assert_eq!(m.st_ino(Node::new(5, 256)), 256);
        assert_eq!(m.st_ino(Node::new(5, 300)), 300);
        assert_eq!(m.st_ino(placeholder(5)), 2);
        assert_eq!(m.st_ino(Node::new(256, 256)), (256 << 40) | 256);
        assert_eq!(m.st_ino(Node::new(257, 256)), (257 << 40) | 256);
        assert_eq!(m.st_ino(placeholder(259)), (259 << 40) | 2);
        assert!(m.collision_free());
        // Mounted elsewhere, the top level is packed too, above every table number.
        let m = InoMap::new(InoMode::Unique, 256, 1000);
        assert_eq!(m.st_ino(Node::new(256, 256)), 256);
        assert_eq!(m.st_ino(Node::new(5, 256)), (5 << 40) | 256);
        assert!(m.st_ino(Node::new(5, 256)) >= TABLE_END);
    }

    #[test]
    fn big_ids_use_the_table_and_stay_apart() {
        let m = InoMap::new(InoMode::Unique, 5, 1000);
        let a = m.st_ino(Node::new(1 << 24, 256));
        let b = m.st_ino(Node::new(300, 1 << 40));
        let c = m.st_ino(Node::new(1 << 24, 257));
        assert_eq!(a, TABLE_FIRST);
        assert_eq!(b, TABLE_FIRST + 1);
        assert_eq!(c, TABLE_FIRST + 2);
        assert_eq!(m.st_ino(Node::new(1 << 24, 256)), a, "stable");
        for n in [a, b, c] {
            assert!((TABLE_FIRST..TABLE_END).contains(&n));
        }
    }

    #[test]
    fn crafted_high_inode_numbers_fall_back_to_the_table() {
        let m = InoMap::new(InoMode::Unique, 5, 1 << 45);
        assert!(!m.collision_free());
        assert_eq!(m.st_ino(Node::new(5, 1 << 45)), 1 << 45);
        assert_eq!(m.st_ino(Node::new(256, 256)), u64::MAX);
        assert_eq!(m.st_ino(Node::new(257, 256)), u64::MAX - 1);
    }

    #[test]
    fn kernel_mode_shows_btrfs_numbers() {
        let m = InoMap::new(InoMode::Kernel, 5, 1000);
        assert_eq!(m.st_ino(Node::new(256, 256)), 256);
        assert_eq!(m.d_ino(Node::new(256, 256), 256), 256);
        assert_eq!(m.d_ino(Node::new(257, 256), 257), 257);
        let u = InoMap::new(InoMode::Unique, 5, 1000);
        assert_eq!(u.d_ino(Node::new(257, 256), 257), (257 << 40) | 256);
    }
}
