//! Inodes: reading INODE_ITEMs and presenting them as stat(2) does on a kernel mount.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node, S_IFDIR};
use crate::transaction::Trans;
use crate::tree::ctree::{lookup_exact, lookup_prev, TreeIter};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::{parse_dir_items, InodeItem, Timespec};
use ubtrfs_format::key::Key;

/// The most links an inode may have (the kernel's BTRFS_LINK_MAX): a further
/// link(2) gives EMLINK. The inode item's nlink field is 32 bits wide; the limit
/// is the kernel's choice, which an image ubtrfs writes keeps.
pub(crate) const BTRFS_LINK_MAX: u32 = 65535;

/// What stat(2)/statx(2) return for a file on a kernel btrfs mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Subvolume the inode lives in (st_dev differs per subvolume on the kernel).
    pub subvol: u64,
    /// Inode number.
    pub ino: u64,
    /// st_mode: file type and permission bits.
    pub mode: u32,
    /// Hard link count.
    pub nlink: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Userspace dev_t encoding (glibc makedev), as st_rdev shows it.
    pub rdev: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated (from the inode's nbytes, as the kernel computes st_blocks).
    pub blocks: u64,
    /// Preferred I/O size (the sector size).
    pub blksize: u32,
    /// Last access.
    pub atime: Timespec,
    /// Last modification of the contents.
    pub mtime: Timespec,
    /// Last change of the inode.
    pub ctime: Timespec,
    /// Birth time (statx stx_btime).
    pub crtime: Timespec,
    /// Inode generation (FS_IOC_GETVERSION).
    pub generation: u64,
    /// btrfs inode flags (NODATACOW, COMPRESS, IMMUTABLE, ...).
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

/// Moving or deleting a subvolume's entry (its location is a ROOT_ITEM, not an
/// inode) changes ROOT_REF/ROOT_BACKREF items and, for rmdir, deletes the subvolume:
/// not done here yet, so refused before anything is changed.
fn not_a_subvolume(loc: &Key, name: &[u8]) -> Result<()> {
    if loc.ty == ROOT_ITEM_KEY {
        return Err(Error::Unsupported(format!(
            "{}: replacing or exchanging a subvolume's entry",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

impl Filesystem {
    /// The highest object id in a subvolume's tree that can be an inode number (the
    /// kernel's btrfs_find_highest_objectid; 256, the root directory, when there is
    /// nothing above it). New inodes of the subvolume are numbered above it.
    pub fn highest_ino(&self, subvol: u64) -> Result<u64> {
        let root = self.root(subvol)?;
        Ok(
            match lookup_prev(
                &self.info,
                &root,
                Key::new(LAST_FREE_OBJECTID, u8::MAX, u64::MAX),
            )? {
                Some((k, _)) if k.objectid >= FIRST_FREE_OBJECTID => k.objectid,
                _ => FIRST_FREE_OBJECTID,
            },
        )
    }

    /// Whether the file's data is an inline extent (in its first item, the only
    /// place one can be).
    pub fn has_inline_extent(&self, node: Node) -> Result<bool> {
        let root = self.root(node.root)?;
        let key = Key::new(node.ino, EXTENT_DATA_KEY, 0);
        Ok(lookup_exact(&self.info, &root, &key)?
            .is_some_and(|it| it.data().get(20) == Some(&FILE_EXTENT_INLINE)))
    }

    /// The raw INODE_ITEM of a file.
    pub fn inode_item(&self, node: Node) -> Result<InodeItem> {
        let root = self.root(node.root)?;
        let key = Key::new(node.ino, INODE_ITEM_KEY, 0);
        let it = lookup_exact(&self.info, &root, &key)?.ok_or_else(|| {
            Error::NotFound(format!("inode {} in subvolume {}", node.ino, node.root))
        })?;
        InodeItem::parse(it.data())
            .map_err(|e| Error::corrupt(format!("subvolume {} inode {}: {e}", node.root, node.ino)))
    }

    /// stat(2) of a file as a kernel mount answers it.
    pub fn stat(&self, node: Node) -> Result<Stat> {
        if node.is_placeholder() {
            return self.placeholder_stat(node);
        }
        let i = self.inode_item(node)?;
        Ok(self.stat_of(node, &i))
    }

    /// [`Filesystem::stat`] from an inode item already read.
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

/// Attributes of an inode to create.
#[derive(Clone, Copy, Debug, Default)]
pub struct NewInode {
    /// st_mode: file type and permissions.
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Device number of a device node as the inode item stores it (the kernel's
    /// MKDEV: major << 20 | minor), else 0.
    pub rdev: u64,
    /// Its atime, mtime, ctime and birth time.
    pub time: Timespec,
}

/// The DIR_ITEM file type (BTRFS_FT_*) of an st_mode.
pub fn file_type_of(mode: u32) -> u8 {
    match mode & 0o170000 {
        0o040000 => FT_DIR,
        0o100000 => FT_REG_FILE,
        0o120000 => FT_SYMLINK,
        0o020000 => FT_CHRDEV,
        0o060000 => FT_BLKDEV,
        0o010000 => FT_FIFO,
        0o140000 => FT_SOCK,
        _ => FT_UNKNOWN,
    }
}

/// The current time, as the kernel stamps inodes.
pub fn now() -> Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty()
        || name.len() > NAME_LEN_MAX
        || name.contains(&b'/')
        || name.contains(&0)
        || name == b"."
        || name == b".."
    {
        return Err(Error::Invalid(format!(
            "invalid name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

impl Trans {
    /// Reads an INODE_ITEM (seeing this transaction's changes).
    pub fn read_inode(&self, root: u64, ino: u64) -> Result<InodeItem> {
        let ptr = self.root_ptr(root)?;
        let it = lookup_exact(&self.fs.info, &ptr, &Key::new(ino, INODE_ITEM_KEY, 0))?
            .ok_or_else(|| Error::NotFound(format!("inode {ino} in tree {root}")))?;
        InodeItem::parse(it.data())
            .map_err(|e| Error::corrupt(format!("inode {ino} in tree {root}: {e}")))
    }

    /// Replaces an INODE_ITEM.
    pub fn write_inode(&mut self, root: u64, ino: u64, i: &InodeItem) -> Result<()> {
        let bytes = i.to_bytes();
        self.update_item(root, &Key::new(ino, INODE_ITEM_KEY, 0), |d| {
            d.copy_from_slice(&bytes)
        })
    }

    /// Sets an inode's access time and nothing else, as the kernel's atime update
    /// (btrfs_update_time with S_ATIME): ctime and the sequence (i_version) stay,
    /// the item's transid becomes this transaction's. The mount decides when
    /// (relatime, strictatime); this only writes.
    pub fn set_atime(&mut self, root: u64, ino: u64, atime: Timespec) -> Result<()> {
        let mut i = self.read_inode(root, ino)?;
        i.atime = atime;
        i.transid = self.transid;
        self.write_inode(root, ino, &i)
    }

    pub(crate) fn touch(&mut self, i: &mut InodeItem, t: Timespec, mtime: bool) {
        i.ctime = t;
        if mtime {
            i.mtime = t;
        }
        i.transid = self.transid;
        i.sequence += 1;
    }

    /// Looks a name up in a directory: (inode, file type, location key).
    pub fn lookup(&self, root: u64, dir: u64, name: &[u8]) -> Result<Option<(u64, u8, Key)>> {
        let ptr = self.root_ptr(root)?;
        let Some(it) = lookup_exact(
            &self.fs.info,
            &ptr,
            &Key::new(dir, DIR_ITEM_KEY, name_hash(name)),
        )?
        else {
            return Ok(None);
        };
        let items = parse_dir_items(it.data())
            .map_err(|e| Error::corrupt(format!("dir item in {dir}: {e}")))?;
        Ok(items
            .into_iter()
            .find(|d| d.name == name)
            .map(|d| (d.location.objectid, d.ty, d.location)))
    }

    pub(crate) fn alloc_ino(&mut self, root: u64) -> Result<u64> {
        let n = self.next_ino_of(root)?;
        if n > LAST_FREE_OBJECTID {
            return Err(Error::NoSpace("inode numbers exhausted".into()));
        }
        self.next_ino.insert(root, n + 1);
        Ok(n)
    }

    /// The number the next new inode of tree `root` takes: above every inode the
    /// tree had when this handle first asked, and above every one given since.
    fn next_ino_of(&mut self, root: u64) -> Result<u64> {
        if let Some(&n) = self.next_ino.get(&root) {
            return Ok(n);
        }
        let ptr = self.root_ptr(root)?;
        let highest = match lookup_prev(
            &self.fs.info,
            &ptr,
            Key::new(LAST_FREE_OBJECTID, u8::MAX, u64::MAX),
        )? {
            Some((k, _)) if k.objectid >= FIRST_FREE_OBJECTID => k.objectid,
            _ => FIRST_FREE_OBJECTID,
        };
        let n = (highest + 1).max(FIRST_FREE_OBJECTID + 1);
        self.next_ino.insert(root, n);
        Ok(n)
    }

    /// Adds the directory entries (DIR_ITEM, DIR_INDEX) and the inode's back reference
    /// for `name` in `dir`; updates the directory's size and times.
    pub(crate) fn add_link(
        &mut self,
        root: u64,
        dir: u64,
        name: &[u8],
        ino: u64,
        ty: u8,
        t: Timespec,
    ) -> Result<u64> {
        check_name(name)?;
        let mut d = self.read_inode(root, dir)?;
        if d.mode & 0o170000 != 0o040000 {
            return Err(Error::NotDir(format!("inode {dir}")));
        }
        if self.lookup(root, dir, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        let index = self.next_dir_index(root, dir)?;
        let loc = Key::new(ino, INODE_ITEM_KEY, 0);
        let entry = ubtrfs_format::items::dir_item_bytes(&loc, self.transid, &[], name, ty);
        // DIR_ITEM: hash collisions share one item.
        let dkey = Key::new(dir, DIR_ITEM_KEY, name_hash(name));
        self.append_to_item(root, &dkey, &entry)?;
        self.insert_item(root, &Key::new(dir, DIR_INDEX_KEY, index), &entry)?;
        self.add_inode_ref(root, ino, dir, index, name)?;
        d.size = d.size.saturating_add(name.len() as u64 * 2);
        self.touch(&mut d, t, true);
        self.write_inode(root, dir, &d)?;
        Ok(index)
    }

    /// Removes `name` from `dir` (entries and the inode's back reference), without
    /// touching the inode's link count. Returns the inode.
    pub(crate) fn remove_link(
        &mut self,
        root: u64,
        dir: u64,
        name: &[u8],
        t: Timespec,
    ) -> Result<u64> {
        self.remove_link_at(root, dir, name, Some(t))
    }

    /// [`Trans::remove_link`], setting the directory's mtime and ctime to `dir_time`,
    /// or leaving them when `None` (a log replay: the kernel's btrfs_unlink_inode
    /// keeps a directory's times while BTRFS_FS_LOG_RECOVERING, since the replay
    /// sets them to what they were at the fsync).
    pub(crate) fn remove_link_at(
        &mut self,
        root: u64,
        dir: u64,
        name: &[u8],
        dir_time: Option<Timespec>,
    ) -> Result<u64> {
        let (ino, _, loc) = self
            .lookup(root, dir, name)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        if loc.ty == ROOT_ITEM_KEY {
            return Err(Error::Unsupported(
                "removing a subvolume entry (use subvolume delete)".into(),
            ));
        }
        let index = self.del_inode_ref(root, ino, dir, name)?;
        let mut d = self.remove_dir_entry(root, dir, name, index)?;
        match dir_time {
            Some(t) => self.touch(&mut d, t, true),
            None => {
                d.transid = self.transid;
                d.sequence += 1;
            }
        }
        self.write_inode(root, dir, &d)?;
        Ok(ino)
    }

    /// Creates an inode of any type (regular, directory, device, fifo, socket) named
    /// `name` in `dir`. Symlinks use [`Trans::symlink`].
    pub fn create(&mut self, root: u64, dir: u64, name: &[u8], attr: NewInode) -> Result<u64> {
        let ty = file_type_of(attr.mode);
        if ty == FT_UNKNOWN || ty == FT_SYMLINK {
            return Err(Error::Invalid(format!("mode {:o}", attr.mode)));
        }
        self.create_raw(root, dir, name, attr, ty)
    }

    /// Creates a regular file with no name (open(2) with O_TMPFILE in directory
    /// `dir`): nlink 0 and an ORPHAN item, as the kernel's btrfs_tmpfile, so a crash
    /// before it is linked (or after it is closed) deletes it at the next mount. It
    /// joins [`Trans::take_orphans`]; [`Trans::link`] gives it a name.
    pub fn create_tmpfile(&mut self, root: u64, dir: u64, attr: NewInode) -> Result<u64> {
        if file_type_of(attr.mode) != FT_REG_FILE {
            return Err(Error::Invalid(format!("O_TMPFILE mode {:o}", attr.mode)));
        }
        let d = self.read_inode(root, dir)?;
        if d.mode & 0o170000 != 0o040000 {
            return Err(Error::NotDir(format!("inode {dir}")));
        }
        let ino = self.alloc_ino(root)?;
        let mut item = InodeItem {
            nlink: 0,
            ..self.new_inode_item(&attr, FT_REG_FILE)
        };
        Trans::inherit_iflags(&mut item, &d);
        self.insert_item(root, &Key::new(ino, INODE_ITEM_KEY, 0), &item.to_bytes())?;
        self.inherit_props(root, dir, ino)?;
        self.insert_item(root, &Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino), &[])?;
        self.orphans.push((root, ino));
        self.touch_root(root, attr.time)?;
        Ok(ino)
    }

    /// Creates symlink `name` in directory `dir` pointing at `target` (an inline extent).
    pub fn symlink(
        &mut self,
        root: u64,
        dir: u64,
        name: &[u8],
        target: &[u8],
        attr: NewInode,
    ) -> Result<u64> {
        if target.is_empty()
            || target.len() as u64 >= self.fs.info.sectorsize as u64
            || target.len() > self.max_inline_size()
        {
            return Err(Error::Invalid(format!(
                "symlink target of {} bytes",
                target.len()
            )));
        }
        let mut a = attr;
        a.mode = 0o120777;
        let ino = self.create_raw(root, dir, name, a, FT_SYMLINK)?;
        self.insert_inline(root, ino, target)?;
        let mut i = self.read_inode(root, ino)?;
        i.size = target.len() as u64;
        i.nbytes = target.len() as u64;
        self.write_inode(root, ino, &i)?;
        Ok(ino)
    }

    pub(crate) fn create_raw(
        &mut self,
        root: u64,
        dir: u64,
        name: &[u8],
        attr: NewInode,
        ty: u8,
    ) -> Result<u64> {
        check_name(name)?;
        if self.lookup(root, dir, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        let parent = self.read_inode(root, dir)?;
        let ino = self.alloc_ino(root)?;
        let mut item = self.new_inode_item(&attr, ty);
        Trans::inherit_iflags(&mut item, &parent);
        self.insert_item(root, &Key::new(ino, INODE_ITEM_KEY, 0), &item.to_bytes())?;
        self.add_link(root, dir, name, ino, ty, attr.time)?;
        self.inherit_props(root, dir, ino)?;
        self.touch_root(root, attr.time)?;
        Ok(ino)
    }

    /// The inode item of a new inode with one link.
    fn new_inode_item(&self, attr: &NewInode, ty: u8) -> InodeItem {
        InodeItem {
            generation: self.transid,
            transid: self.transid,
            nlink: 1,
            uid: attr.uid,
            gid: attr.gid,
            mode: attr.mode,
            rdev: if ty == FT_CHRDEV || ty == FT_BLKDEV {
                attr.rdev
            } else {
                0
            },
            atime: attr.time,
            ctime: attr.time,
            mtime: attr.time,
            otime: attr.time,
            // Before the directory's flags are inherited, as btrfs_new_inode.
            flags: if ty == FT_REG_FILE {
                self.new_file_flags & (INODE_NODATACOW | INODE_NODATASUM)
            } else {
                0
            },
            ..Default::default()
        }
    }

    /// Records a change in a subvolume (ctransid / ctime of its root item).
    pub(crate) fn touch_root(&mut self, root: u64, t: Timespec) -> Result<()> {
        let transid = self.transid;
        self.modify_root_item(root, |r| {
            r.ctransid = transid;
            r.ctime = t;
        })
    }

    /// Adds another name for an existing inode; EMLINK once it has
    /// 65,535 (BTRFS_LINK_MAX, as the kernel's btrfs_link).
    pub fn link(&mut self, root: u64, ino: u64, dir: u64, name: &[u8], t: Timespec) -> Result<()> {
        let mut i = self.read_inode(root, ino)?;
        if i.mode & 0o170000 == 0o040000 {
            return Err(Error::IsDir(format!("inode {ino}")));
        }
        if i.nlink >= BTRFS_LINK_MAX {
            return Err(Error::TooManyLinks(format!(
                "inode {ino} of subvolume {root} has {} links",
                i.nlink
            )));
        }
        self.add_link(root, dir, name, ino, file_type_of(i.mode), t)?;
        if i.nlink == 0 {
            // An O_TMPFILE file (or an open unlinked one) gets a name: no longer an
            // orphan, a crash must keep it.
            match self.delete_item(root, &Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino)) {
                Err(Error::NotFound(_)) | Ok(()) => {}
                Err(e) => return Err(e),
            }
        }
        let mut i2 = self.read_inode(root, ino)?;
        i2.nlink = i.nlink + 1;
        i = i2;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)?;
        self.touch_root(root, t)
    }

    /// Removes a non-directory name; the inode goes when its last link does.
    pub fn unlink(&mut self, root: u64, dir: u64, name: &[u8], t: Timespec) -> Result<()> {
        let (ino, ty, loc) = self
            .lookup(root, dir, name)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        if loc.ty == ROOT_ITEM_KEY {
            // A subvolume's entry is a directory (the kernel's unlink: EISDIR).
            return Err(Error::IsDir(String::from_utf8_lossy(name).into_owned()));
        }
        if ty == FT_DIR {
            return Err(Error::IsDir(String::from_utf8_lossy(name).into_owned()));
        }
        self.remove_link(root, dir, name, t)?;
        let mut i = self.read_inode(root, ino)?;
        i.nlink = i.nlink.saturating_sub(1);
        if i.nlink == 0 && self.defer_eviction {
            self.orphan_inode(root, ino, &mut i, t)?;
        } else if i.nlink == 0 {
            self.evict_inode(root, ino)?;
        } else {
            self.touch(&mut i, t, false);
            self.write_inode(root, ino, &i)?;
        }
        self.touch_root(root, t)
    }

    /// Removes the empty directory `name` from `dir` (ENOTEMPTY otherwise).
    pub fn rmdir(&mut self, root: u64, dir: u64, name: &[u8], t: Timespec) -> Result<()> {
        let (ino, ty, loc) = self
            .lookup(root, dir, name)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        if loc.ty == ROOT_ITEM_KEY {
            // The kernel's rmdir of a subvolume: deleted when its root directory is
            // empty (the stand-in entry of a subvolume inside a snapshot just goes).
            if self.fs.has_root_ref(root, ino)?
                && self.read_inode(ino, FIRST_FREE_OBJECTID)?.size != 0
            {
                return Err(Error::NotEmpty(String::from_utf8_lossy(name).into_owned()));
            }
            self.delete_subvolume(root, dir, name, t)?;
            return Ok(());
        }
        if ty != FT_DIR {
            return Err(Error::NotDir(String::from_utf8_lossy(name).into_owned()));
        }
        if self.read_inode(root, ino)?.size != 0 {
            return Err(Error::NotEmpty(String::from_utf8_lossy(name).into_owned()));
        }
        self.remove_link(root, dir, name, t)?;
        if self.defer_eviction {
            // A removed directory can still be open (an fd, a cwd) and fstat() must
            // find it, nlink 0, as the kernel's btrfs_rmdir orphans it too: fstests
            // generic/035 fstat()s a directory that a rename replaced.
            let mut i = self.read_inode(root, ino)?;
            i.nlink = 0;
            self.orphan_inode(root, ino, &mut i, t)?;
        } else {
            self.evict_inode(root, ino)?;
        }
        self.touch_root(root, t)
    }

    /// Keeps an inode whose last link is gone (nlink 0, written) as an orphan until its
    /// last user goes (the kernel's btrfs_orphan_add); a mount after a crash deletes it.
    fn orphan_inode(&mut self, root: u64, ino: u64, i: &mut InodeItem, t: Timespec) -> Result<()> {
        self.touch(i, t, false);
        self.write_inode(root, ino, i)?;
        self.insert_item(root, &Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino), &[])?;
        self.orphans.push((root, ino));
        Ok(())
    }

    /// Deletes every item of an inode, dropping its data references.
    /// Inodes orphaned (last link removed while [`Trans::defer_eviction`] is set) since
    /// the last call: (tree, inode).
    pub fn take_orphans(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.orphans)
    }

    /// Deletes an orphaned inode and its ORPHAN item (its last user is gone).
    /// An orphan linked again since ([`Trans::link`] of an O_TMPFILE file) stays.
    pub fn evict_orphan(&mut self, root: u64, ino: u64) -> Result<()> {
        if self.read_inode(root, ino)?.nlink > 0 {
            return Ok(());
        }
        self.evict_inode(root, ino)?;
        match self.delete_item(root, &Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino)) {
            Err(Error::NotFound(_)) => Ok(()),
            r => r,
        }
    }

    /// The kernel's btrfs_orphan_cleanup for subvolume `root` at a read-write
    /// mount: every ORPHAN item names an inode whose last link went while it was
    /// open (or that a log replay left without names); one still without links is
    /// deleted with its data, one linked again (an O_TMPFILE given a name) keeps
    /// its inode, and the item goes. Returns how many inodes were deleted. Nothing
    /// is committed here.
    pub(crate) fn orphan_cleanup_root(&mut self, root: u64) -> Result<u64> {
        let ptr = self.root_ptr(root)?;
        let mut orphans = Vec::new();
        for it in TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, 0),
            Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, u64::MAX),
        )? {
            orphans.push(it?.key().offset);
        }
        let mut evicted = 0;
        for ino in orphans {
            let now = self.root_ptr(root)?;
            let exists =
                lookup_exact(&self.fs.info, &now, &Key::new(ino, INODE_ITEM_KEY, 0))?.is_some();
            if exists && self.read_inode(root, ino)?.nlink == 0 {
                self.evict_orphan(root, ino)?;
                evicted += 1;
            } else {
                self.delete_item(root, &Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, ino))?;
            }
        }
        Ok(evicted)
    }

    pub(crate) fn evict_inode(&mut self, root: u64, ino: u64) -> Result<()> {
        // The number is not given to a new inode while this handle lives (the
        // kernel's free_objectid only grows): a tree log replayed over the last
        // commit, where the inode may still exist, would merge the two.
        self.next_ino_of(root)?;
        self.drop_extents(root, ino, 0, u64::MAX)?;
        self.delete_range(
            root,
            &Key::new(ino, 0, 0),
            &Key::new(ino, u8::MAX, u64::MAX),
        )?;
        Ok(())
    }

    /// Moves `oname` in `odir` to `nname` in `ndir`, replacing a compatible target.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &mut self,
        root: u64,
        odir: u64,
        oname: &[u8],
        ndir: u64,
        nname: &[u8],
        noreplace: bool,
        t: Timespec,
    ) -> Result<()> {
        let (ino, ty, loc) = self
            .lookup(root, odir, oname)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(oname).into_owned()))?;
        if odir == ndir && oname == nname {
            return Ok(());
        }
        if loc.ty == ROOT_ITEM_KEY {
            return self.rename_subvolume(root, odir, oname, ndir, nname, noreplace, t);
        }
        if ty == FT_DIR {
            // Refuse moving a directory into itself or its descendants.
            let mut p = ndir;
            let mut depth = 0;
            while p != FIRST_FREE_OBJECTID && depth < 4096 {
                if p == ino {
                    return Err(Error::Invalid("cannot move a directory into itself".into()));
                }
                p = self.parent_of(root, p)?;
                depth += 1;
            }
        }
        if let Some((tino, tty, tloc)) = self.lookup(root, ndir, nname)? {
            if !noreplace && tloc.ty == ROOT_ITEM_KEY {
                // Over a subvolume's entry: the kernel says ENOTEMPTY, empty or not.
                return Err(Error::NotEmpty(String::from_utf8_lossy(nname).into_owned()));
            }
            if noreplace {
                return Err(Error::Exists(String::from_utf8_lossy(nname).into_owned()));
            }
            if tino == ino {
                // Two names of one inode: rename is a no-op (POSIX).
                return Ok(());
            }
            match (ty == FT_DIR, tty == FT_DIR) {
                (true, true) => self.rmdir(root, ndir, nname, t)?,
                (false, false) => self.unlink(root, ndir, nname, t)?,
                (true, false) => {
                    return Err(Error::NotDir(String::from_utf8_lossy(nname).into_owned()))
                }
                (false, true) => {
                    return Err(Error::IsDir(String::from_utf8_lossy(nname).into_owned()))
                }
            }
        }
        self.remove_link(root, odir, oname, t)?;
        self.add_link(root, ndir, nname, ino, ty, t)?;
        let mut i = self.read_inode(root, ino)?;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)?;
        self.touch_root(root, t)
    }

    /// RENAME_EXCHANGE: atomically swaps two names (either may be a directory).
    #[allow(clippy::too_many_arguments)]
    pub fn rename_exchange(
        &mut self,
        root: u64,
        adir: u64,
        aname: &[u8],
        bdir: u64,
        bname: &[u8],
        t: Timespec,
    ) -> Result<()> {
        let (a, aty, aloc) = self
            .lookup(root, adir, aname)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(aname).into_owned()))?;
        let (b, bty, bloc) = self
            .lookup(root, bdir, bname)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(bname).into_owned()))?;
        not_a_subvolume(&aloc, aname)?;
        not_a_subvolume(&bloc, bname)?;
        if a == b {
            return Ok(());
        }
        for (ino, ty, into) in [(a, aty, bdir), (b, bty, adir)] {
            if ty == FT_DIR {
                let mut p = into;
                let mut depth = 0;
                while p != FIRST_FREE_OBJECTID && depth < 4096 {
                    if p == ino {
                        return Err(Error::Invalid("cannot move a directory into itself".into()));
                    }
                    p = self.parent_of(root, p)?;
                    depth += 1;
                }
            }
        }
        self.remove_link(root, adir, aname, t)?;
        self.remove_link(root, bdir, bname, t)?;
        self.add_link(root, bdir, bname, a, aty, t)?;
        self.add_link(root, adir, aname, b, bty, t)?;
        for ino in [a, b] {
            let mut i = self.read_inode(root, ino)?;
            self.touch(&mut i, t, false);
            self.write_inode(root, ino, &i)?;
        }
        self.touch_root(root, t)
    }

    pub(crate) fn parent_of(&self, root: u64, dir: u64) -> Result<u64> {
        let ptr = self.root_ptr(root)?;
        let it = TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(dir, INODE_REF_KEY, 0),
            Key::new(dir, INODE_REF_KEY, u64::MAX),
        )?;
        match it.into_iter().next() {
            Some(item) => Ok(item?.key().offset),
            None => Ok(FIRST_FREE_OBJECTID),
        }
    }

    /// Changes mode, owner and times (None leaves a field alone).
    #[allow(clippy::too_many_arguments)]
    pub fn setattr(
        &mut self,
        root: u64,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<Timespec>,
        mtime: Option<Timespec>,
        t: Timespec,
    ) -> Result<()> {
        let mut i = self.read_inode(root, ino)?;
        if let Some(m) = mode {
            i.mode = (i.mode & 0o170000) | (m & 0o7777);
        }
        if let Some(u) = uid {
            i.uid = u;
        }
        if let Some(g) = gid {
            i.gid = g;
        }
        if let Some(a) = atime {
            i.atime = a;
        }
        self.touch(&mut i, t, false);
        if let Some(m) = mtime {
            i.mtime = m;
        }
        self.write_inode(root, ino, &i)
    }

    /// Names in a directory (DIR_INDEX order) with their inodes.
    pub fn list_dir(&self, root: u64, dir: u64) -> Result<Vec<(Vec<u8>, u64)>> {
        let ptr = self.root_ptr(root)?;
        let mut out = Vec::new();
        for item in TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(dir, DIR_INDEX_KEY, 0),
            Key::new(dir, DIR_INDEX_KEY, u64::MAX),
        )? {
            let item = item?;
            for d in parse_dir_items(item.data())
                .map_err(|e| Error::corrupt(format!("dir index {}: {e}", item.key())))?
            {
                out.push((d.name, d.location.objectid));
            }
        }
        Ok(out)
    }
}
