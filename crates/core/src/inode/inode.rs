//! Inodes: reading INODE_ITEMs and presenting them as stat(2) does on a kernel mount.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node, S_IFDIR};
use crate::tree::ctree::lookup_exact;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{InodeItem, Timespec};
use ubtrfs_format::key::Key;

/// What stat(2)/statx(2) return for a file on a kernel btrfs mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Subvolume the inode lives in (st_dev differs per subvolume on the kernel).
    pub subvol: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Userspace dev_t encoding (glibc makedev), as st_rdev shows it.
    pub rdev: u64,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub generation: u64,
    pub flags: u64,
}

/// The kernel keeps i_rdev as (major << 20 | minor) on disk; userspace sees glibc's
/// makedev encoding.
pub fn kernel_rdev_to_user(rdev: u64) -> u64 {
    let major = (rdev >> 20) & 0xfff;
    let minor = rdev & 0xfffff;
    ((major & 0xfffff000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffffff00) << 12)
        | (minor & 0xff)
}

impl Filesystem {
    pub fn inode_item(&self, node: Node) -> Result<InodeItem> {
        let root = self.root(node.root)?;
        let key = Key::new(node.ino, INODE_ITEM_KEY, 0);
        let it = lookup_exact(&self.info, &root, &key)?.ok_or_else(|| {
            Error::NotFound(format!("inode {} in subvolume {}", node.ino, node.root))
        })?;
        InodeItem::parse(it.data())
            .map_err(|e| Error::corrupt(format!("subvolume {} inode {}: {e}", node.root, node.ino)))
    }

    pub fn stat(&self, node: Node) -> Result<Stat> {
        if node.is_placeholder() {
            return self.placeholder_stat(node);
        }
        let i = self.inode_item(node)?;
        Ok(self.stat_of(node, &i))
    }

    pub fn stat_of(&self, node: Node, i: &InodeItem) -> Stat {
        let ss = self.info.sectorsize as u64;
        Stat {
            subvol: node.root,
            ino: node.ino,
            mode: i.mode,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: kernel_rdev_to_user(i.rdev),
            size: i.size,
            // The kernel reports the byte count rounded up to the sector, in 512s.
            blocks: i.nbytes.div_ceil(ss).saturating_mul(ss) / 512,
            blksize: self.info.sectorsize,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.otime,
            generation: i.generation,
            flags: i.flags,
        }
    }

    /// The kernel invents this directory (mode 0755, owned like its parent) when a
    /// snapshot contains the entry of a subvolume that lives elsewhere. Its times are
    /// made up at lookup; we use the parent's.
    fn placeholder_stat(&self, node: Node) -> Result<Stat> {
        let parent = self.inode_item(Node::new(node.root, node.parent_dir))?;
        Ok(Stat {
            subvol: node.root,
            ino: EMPTY_SUBVOL_DIR_OBJECTID,
            mode: S_IFDIR | 0o755,
            nlink: 1,
            uid: parent.uid,
            gid: parent.gid,
            rdev: 0,
            size: 0,
            blocks: 0,
            blksize: self.info.sectorsize,
            atime: parent.atime,
            mtime: parent.mtime,
            ctime: parent.ctime,
            crtime: parent.otime,
            generation: 0,
            flags: 0,
        })
    }
}
