//! The filesystem façade: subvolume-aware nodes, path resolution, and caches shared by
//! the inode, dir, xattr and file-read modules (each adds its own `impl Filesystem`).

use crate::error::{Error, Result};
use crate::io::disk_io::{FsInfo, OpenOptions};
use crate::tree::RootPtr;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use ubtrfs_format::consts::*;

/// A file as the kernel shows it: an inode in a subvolume. Subvolume roots are
/// (subvol, 256). A subvolume seen inside a snapshot of its parent is a placeholder
/// directory with inode 2 (`parent_dir` names the directory it was found in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The subvolume (tree id) holding the inode.
    pub root: u64,
    /// The inode number inside that subvolume.
    pub ino: u64,
    /// For a placeholder: the directory inode it was found in (else 0).
    pub parent_dir: u64,
}

impl Node {
    /// The inode `ino` of subvolume `root`.
    pub fn new(root: u64, ino: u64) -> Node {
        Node {
            root,
            ino,
            parent_dir: 0,
        }
    }
    /// True for the empty directory (inode 2) the kernel shows for a subvolume seen
    /// inside a snapshot of its parent.
    pub fn is_placeholder(&self) -> bool {
        self.ino == EMPTY_SUBVOL_DIR_OBJECTID
    }
}

/// A decompressed extent kept for the next read of the same file.
#[derive(Debug)]
pub(crate) struct DecompressedExtent {
    pub disk_bytenr: u64,
    pub data: Arc<Vec<u8>>,
}

#[derive(Debug)]
/// An opened filesystem, read side: path resolution, stat, directories, xattrs and
/// file data, as a kernel mount shows them. The write side is [`crate::Trans`], which
/// owns one of these and sees its own uncommitted changes through it.
pub struct Filesystem {
    /// The opened devices, superblock, chunk map and tree-block cache.
    pub info: FsInfo,
    roots: Mutex<HashMap<u64, Option<RootPtr>>>,
    pub(crate) decompressed: Mutex<Vec<DecompressedExtent>>,
}

/// How many decompressed extents (each ≤ 128 KiB) are kept.
pub(crate) const DECOMPRESSED_CACHE_ENTRIES_MAX: usize = 16;

impl Filesystem {
    /// Opens image files or block devices (all devices of a multi-device filesystem).
    pub fn open_paths(paths: &[impl AsRef<Path>], opts: OpenOptions) -> Result<Filesystem> {
        Ok(Filesystem::from_info(FsInfo::open_paths(paths, opts)?))
    }

    /// Wraps an already opened [`FsInfo`].
    pub fn from_info(info: FsInfo) -> Filesystem {
        Filesystem {
            info,
            roots: Mutex::new(HashMap::new()),
            decompressed: Mutex::new(Vec::new()),
        }
    }

    /// Forgets a cached root pointer (the write engine moved the root).
    pub(crate) fn forget_root(&self, id: u64) {
        if let Ok(mut m) = self.roots.lock() {
            m.remove(&id);
        }
    }

    /// Drops caches keyed by data addresses (space may be reused after a commit).
    pub(crate) fn clear_data_caches(&self) {
        if let Ok(mut d) = self.decompressed.lock() {
            d.clear();
        }
    }

    /// The top-level subvolume's root directory.
    pub fn top(&self) -> Node {
        Node::new(FS_TREE_OBJECTID, FIRST_FREE_OBJECTID)
    }

    /// Root pointer of a subvolume (cached).
    pub fn root(&self, id: u64) -> Result<RootPtr> {
        self.try_root(id)?
            .ok_or_else(|| Error::NotFound(format!("subvolume {id}")))
    }

    /// Root pointer of a subvolume or tree, `None` if it does not exist (cached).
    pub fn try_root(&self, id: u64) -> Result<Option<RootPtr>> {
        if let Some(r) = self.roots.lock().ok().and_then(|m| m.get(&id).copied()) {
            return Ok(r);
        }
        let r = self.info.subvol_ptr(id)?;
        if let Ok(mut m) = self.roots.lock() {
            m.insert(id, r);
        }
        Ok(r)
    }

    /// Resolves an absolute path (from the top-level subvolume) without following
    /// symlinks, entering subvolumes the way a kernel mount shows them.
    pub fn resolve(&self, path: &str) -> Result<Node> {
        self.resolve_bytes(path.as_bytes())
    }

    /// [`Filesystem::resolve`] for a path that need not be UTF-8.
    pub fn resolve_bytes(&self, path: &[u8]) -> Result<Node> {
        let mut cur = self.top();
        let mut stack: Vec<Node> = Vec::new();
        for comp in path.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => continue,
                b".." => {
                    if let Some(p) = stack.pop() {
                        cur = p;
                    }
                    continue;
                }
                _ => {}
            }
            let st = self.stat(cur)?;
            if st.mode & S_IFMT != S_IFDIR {
                return Err(Error::NotDir(String::from_utf8_lossy(path).into_owned()));
            }
            match self.lookup(cur, comp)? {
                Some(e) => {
                    stack.push(cur);
                    cur = e.node;
                }
                None => return Err(Error::NotFound(String::from_utf8_lossy(path).into_owned())),
            }
        }
        Ok(cur)
    }
}

/// Mask of the file type bits.
pub const S_IFMT: u32 = 0o170000;
/// Directory.
pub const S_IFDIR: u32 = 0o040000;
/// Regular file.
pub const S_IFREG: u32 = 0o100000;
/// Symbolic link.
pub const S_IFLNK: u32 = 0o120000;
/// Character device.
pub const S_IFCHR: u32 = 0o020000;
/// Block device.
pub const S_IFBLK: u32 = 0o060000;
/// FIFO.
pub const S_IFIFO: u32 = 0o010000;
/// Socket.
pub const S_IFSOCK: u32 = 0o140000;
