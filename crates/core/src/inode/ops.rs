//! File operations on a subvolume, written (the kernel's inode.c, dir-item.c,
//! inode-item.c, file.c, xattr.c): create, mkdir, mknod, symlink, link, unlink, rmdir,
//! rename, write, truncate, setattr, set/remove xattr. Each keeps INODE_ITEM, INODE_REF
//! (or INODE_EXTREF), DIR_ITEM, DIR_INDEX, nlink, i_size and nbytes as the kernel does,
//! and drops data references of file extents it removes.

use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::ctree::{lookup_exact, lookup_prev, TreeIter};
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::{extref_hash, name_hash};
use ubtrfs_format::items::{
    parse_dir_items, parse_inode_extrefs, parse_inode_refs, FileExtentBody, FileExtentItem,
    InodeItem, Timespec,
};
use ubtrfs_format::key::Key;

/// Largest data extent the kernel writes.
pub const MAX_EXTENT_SIZE: u64 = 128 << 20;
/// Default max_inline mount option.
pub(crate) const MAX_INLINE: u64 = 2048;

#[derive(Clone, Copy, Debug, Default)]
/// Attributes of an inode to create.
pub struct NewInode {
    /// st_mode: file type and permissions.
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Device number of a device node (userspace encoding), else 0.
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

fn check_name(name: &[u8]) -> Result<()> {
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

pub(crate) fn file_extent_bytes(
    generation: u64,
    ram_bytes: u64,
    compression: u8,
    ty: u8,
    body: &FileExtentBody,
) -> Vec<u8> {
    FileExtentItem {
        generation,
        ram_bytes,
        compression,
        encryption: 0,
        other_encoding: 0,
        ty,
        body: body.clone(),
    }
    .to_bytes()
}

/// Byte range of the entry named `name` among the packed dir_item entries of a
/// DIR_ITEM or XATTR_ITEM (30-byte header, name, data).
fn dir_entry_span(d: &[u8], name: &[u8]) -> Option<(usize, usize)> {
    let mut pos = 0;
    while pos + 30 <= d.len() {
        let dl = u16::from_le_bytes([d[pos + 25], d[pos + 26]]) as usize;
        let nl = u16::from_le_bytes([d[pos + 27], d[pos + 28]]) as usize;
        let end = pos + 30 + nl + dl;
        if d.get(pos + 30..pos + 30 + nl) == Some(name) {
            return Some((pos, end));
        }
        pos = end;
    }
    None
}

impl Trans {
    fn no_holes(&self) -> bool {
        self.fs.info.sb.incompat_flags & FEATURE_INCOMPAT_NO_HOLES != 0
    }

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

    fn touch(&mut self, i: &mut InodeItem, t: Timespec, mtime: bool) {
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

    fn alloc_ino(&mut self, root: u64) -> Result<u64> {
        if let Some(n) = self.next_ino.get_mut(&root) {
            *n += 1;
            return Ok(*n - 1);
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
        if n > LAST_FREE_OBJECTID {
            return Err(Error::NoSpace("inode numbers exhausted".into()));
        }
        self.next_ino.insert(root, n + 1);
        Ok(n)
    }

    fn next_dir_index(&mut self, root: u64, dir: u64) -> Result<u64> {
        let ptr = self.root_ptr(root)?;
        Ok(
            match lookup_prev(&self.fs.info, &ptr, Key::new(dir, DIR_INDEX_KEY, u64::MAX))? {
                Some((k, _)) if k.objectid == dir && k.ty == DIR_INDEX_KEY => k.offset + 1,
                _ => 2,
            },
        )
    }

    /// Adds the directory entries (DIR_ITEM, DIR_INDEX) and the inode's back reference
    /// for `name` in `dir`; updates the directory's size and times.
    fn add_link(
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
        d.size += name.len() as u64 * 2;
        self.touch(&mut d, t, true);
        self.write_inode(root, dir, &d)?;
        Ok(index)
    }

    pub(crate) fn next_dir_index_pub(&mut self, root: u64, dir: u64) -> Result<u64> {
        self.next_dir_index(root, dir)
    }
    pub(crate) fn append_to_item_pub(&mut self, root: u64, key: &Key, bytes: &[u8]) -> Result<()> {
        self.append_to_item(root, key, bytes)
    }

    /// Appends bytes to an item, creating it if missing.
    fn append_to_item(&mut self, root: u64, key: &Key, bytes: &[u8]) -> Result<()> {
        let ptr = self.root_ptr(root)?;
        match lookup_exact(&self.fs.info, &ptr, key)? {
            None => self.insert_item(root, key, bytes),
            Some(it) => {
                let old = it.data().len();
                if old + bytes.len() > self.max_item_size() {
                    return Err(Error::NoSpace(format!("item {key} is full")));
                }
                self.resize_item(root, key, old + bytes.len(), |d| {
                    d[old..].copy_from_slice(bytes)
                })
            }
        }
    }

    fn add_inode_ref(
        &mut self,
        root: u64,
        ino: u64,
        dir: u64,
        index: u64,
        name: &[u8],
    ) -> Result<()> {
        let key = Key::new(ino, INODE_REF_KEY, dir);
        let r = ubtrfs_format::items::inode_ref_bytes(index, name);
        match self.append_to_item(root, &key, &r) {
            Err(Error::NoSpace(_))
                if self.fs.info.sb.incompat_flags & FEATURE_INCOMPAT_EXTENDED_IREF != 0 =>
            {
                let k = Key::new(ino, INODE_EXTREF_KEY, extref_hash(dir, name));
                let e = ubtrfs_format::items::inode_extref_bytes(dir, index, name);
                self.append_to_item(root, &k, &e)
            }
            other => other,
        }
    }

    /// Removes one entry from an item holding several packed entries; `find` returns
    /// the byte range of the entry to remove.
    fn remove_from_item(
        &mut self,
        root: u64,
        key: &Key,
        find: impl Fn(&[u8]) -> Option<(usize, usize)>,
    ) -> Result<bool> {
        let ptr = self.root_ptr(root)?;
        let Some(it) = lookup_exact(&self.fs.info, &ptr, key)? else {
            return Ok(false);
        };
        let data = it.data().to_vec();
        drop(it);
        let Some((s, e)) = find(&data) else {
            return Ok(false);
        };
        if s == 0 && e == data.len() {
            self.delete_item(root, key)?;
        } else {
            let mut nd = data[..s].to_vec();
            nd.extend_from_slice(&data[e..]);
            self.replace_item(root, key, &nd)?;
        }
        Ok(true)
    }

    fn del_inode_ref(&mut self, root: u64, ino: u64, dir: u64, name: &[u8]) -> Result<u64> {
        let key = Key::new(ino, INODE_REF_KEY, dir);
        let ptr = self.root_ptr(root)?;
        if let Some(it) = lookup_exact(&self.fs.info, &ptr, &key)? {
            let refs = parse_inode_refs(dir, it.data())
                .map_err(|e| Error::corrupt(format!("inode ref {key}: {e}")))?;
            drop(it);
            if let Some(r) = refs.iter().find(|r| r.name == name) {
                let index = r.index;
                self.remove_from_item(root, &key, |d| {
                    let mut pos = 0;
                    while pos + 10 <= d.len() {
                        let nl = u16::from_le_bytes([d[pos + 8], d[pos + 9]]) as usize;
                        let end = pos + 10 + nl;
                        if d.get(pos + 10..end) == Some(name) {
                            return Some((pos, end));
                        }
                        pos = end;
                    }
                    None
                })?;
                return Ok(index);
            }
        }
        let key = Key::new(ino, INODE_EXTREF_KEY, extref_hash(dir, name));
        let ptr = self.root_ptr(root)?;
        if let Some(it) = lookup_exact(&self.fs.info, &ptr, &key)? {
            let refs = parse_inode_extrefs(it.data())
                .map_err(|e| Error::corrupt(format!("inode extref {key}: {e}")))?;
            drop(it);
            if let Some(r) = refs.iter().find(|r| r.name == name && r.parent == dir) {
                let index = r.index;
                self.remove_from_item(root, &key, |d| {
                    let mut pos = 0;
                    while pos + 18 <= d.len() {
                        let parent =
                            u64::from_le_bytes(d[pos..pos + 8].try_into().unwrap_or([0; 8]));
                        let nl = u16::from_le_bytes([d[pos + 16], d[pos + 17]]) as usize;
                        let end = pos + 18 + nl;
                        if parent == dir && d.get(pos + 18..end) == Some(name) {
                            return Some((pos, end));
                        }
                        pos = end;
                    }
                    None
                })?;
                return Ok(index);
            }
        }
        Err(Error::corrupt(format!(
            "inode {ino} has no reference named {:?} in {dir}",
            String::from_utf8_lossy(name)
        )))
    }

    /// Removes `name` from `dir` (entries and the inode's back reference), without
    /// touching the inode's link count. Returns the inode.
    fn remove_link(&mut self, root: u64, dir: u64, name: &[u8], t: Timespec) -> Result<u64> {
        let (ino, _, loc) = self
            .lookup(root, dir, name)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        if loc.ty == ROOT_ITEM_KEY {
            return Err(Error::Unsupported(
                "removing a subvolume entry (use subvolume delete)".into(),
            ));
        }
        let index = self.del_inode_ref(root, ino, dir, name)?;
        let dkey = Key::new(dir, DIR_ITEM_KEY, name_hash(name));
        self.remove_from_item(root, &dkey, |d| dir_entry_span(d, name))?;
        self.delete_item(root, &Key::new(dir, DIR_INDEX_KEY, index))?;
        let mut d = self.read_inode(root, dir)?;
        d.size = d.size.saturating_sub(name.len() as u64 * 2);
        self.touch(&mut d, t, true);
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

    fn create_raw(
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
        let ino = self.alloc_ino(root)?;
        let item = InodeItem {
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
            ..Default::default()
        };
        self.insert_item(root, &Key::new(ino, INODE_ITEM_KEY, 0), &item.to_bytes())?;
        self.add_link(root, dir, name, ino, ty, attr.time)?;
        self.touch_root(root, attr.time)?;
        Ok(ino)
    }

    /// Records a change in a subvolume (ctransid / ctime of its root item).
    fn touch_root(&mut self, root: u64, t: Timespec) -> Result<()> {
        let transid = self.transid;
        self.modify_root_item(root, |r| {
            r.ctransid = transid;
            r.ctime = t;
        })
    }

    fn max_inline_size(&self) -> usize {
        // BTRFS_MAX_INLINE_DATA_SIZE: a leaf's item space minus the file extent header.
        self.max_item_size() - ubtrfs_format::items::FILE_EXTENT_INLINE_DATA_START
    }

    fn insert_inline(&mut self, root: u64, ino: u64, data: &[u8]) -> Result<()> {
        let v = file_extent_bytes(
            self.transid,
            data.len() as u64,
            0,
            FILE_EXTENT_INLINE,
            &FileExtentBody::Inline {
                data: data.to_vec(),
            },
        );
        self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, 0), &v)
    }

    /// Adds another name for an existing inode.
    pub fn link(&mut self, root: u64, ino: u64, dir: u64, name: &[u8], t: Timespec) -> Result<()> {
        let mut i = self.read_inode(root, ino)?;
        if i.mode & 0o170000 == 0o040000 {
            return Err(Error::IsDir(format!("inode {ino}")));
        }
        self.add_link(root, dir, name, ino, file_type_of(i.mode), t)?;
        let mut i2 = self.read_inode(root, ino)?;
        i2.nlink = i.nlink + 1;
        i = i2;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)?;
        self.touch_root(root, t)
    }

    /// Removes a non-directory name; the inode goes when its last link does.
    pub fn unlink(&mut self, root: u64, dir: u64, name: &[u8], t: Timespec) -> Result<()> {
        let (ino, ty, _) = self
            .lookup(root, dir, name)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        if ty == FT_DIR {
            return Err(Error::IsDir(String::from_utf8_lossy(name).into_owned()));
        }
        self.remove_link(root, dir, name, t)?;
        let mut i = self.read_inode(root, ino)?;
        i.nlink = i.nlink.saturating_sub(1);
        if i.nlink == 0 {
            self.evict_inode(root, ino)?;
        } else {
            self.touch(&mut i, t, false);
            self.write_inode(root, ino, &i)?;
        }
        self.touch_root(root, t)
    }

    /// Removes the empty directory `name` from `dir` (ENOTEMPTY otherwise).
    pub fn rmdir(&mut self, root: u64, dir: u64, name: &[u8], t: Timespec) -> Result<()> {
        let (ino, ty, _) = self
            .lookup(root, dir, name)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        if ty != FT_DIR {
            return Err(Error::NotDir(String::from_utf8_lossy(name).into_owned()));
        }
        if self.read_inode(root, ino)?.size != 0 {
            return Err(Error::NotEmpty(String::from_utf8_lossy(name).into_owned()));
        }
        self.remove_link(root, dir, name, t)?;
        self.evict_inode(root, ino)?;
        self.touch_root(root, t)
    }

    /// Deletes every item of an inode, dropping its data references.
    fn evict_inode(&mut self, root: u64, ino: u64) -> Result<()> {
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
        let (ino, ty, _) = self
            .lookup(root, odir, oname)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(oname).into_owned()))?;
        if odir == ndir && oname == nname {
            return Ok(());
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
        if let Some((tino, tty, _)) = self.lookup(root, ndir, nname)? {
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
        let (a, aty, _) = self
            .lookup(root, adir, aname)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(aname).into_owned()))?;
        let (b, bty, _) = self
            .lookup(root, bdir, bname)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(bname).into_owned()))?;
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

    fn parent_of(&self, root: u64, dir: u64) -> Result<u64> {
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

    /// File extent items of `ino` overlapping [start, end) (the one covering `start`
    /// may begin before it), in file order.
    fn extent_items(
        &self,
        root: u64,
        ino: u64,
        start: u64,
        end: u64,
    ) -> Result<Vec<(Key, FileExtentItem)>> {
        let ptr = self.root_ptr(root)?;
        let first = match lookup_prev(&self.fs.info, &ptr, Key::new(ino, EXTENT_DATA_KEY, start))? {
            Some((k, _)) if k.objectid == ino && k.ty == EXTENT_DATA_KEY => k.offset,
            _ => start,
        };
        let mut items = Vec::new();
        for item in TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(ino, EXTENT_DATA_KEY, first),
            Key::new(ino, EXTENT_DATA_KEY, end.saturating_sub(1)),
        )? {
            let item = item?;
            let fe = FileExtentItem::parse(item.data())
                .map_err(|e| Error::corrupt(format!("inode {ino} extent {}: {e}", item.key())))?;
            items.push((item.key(), fe));
        }
        Ok(items)
    }

    /// Removes or trims file extent items covering [start, end) and drops the data
    /// references they held; returns the bytes of `nbytes` released.
    pub(crate) fn drop_extents(
        &mut self,
        root: u64,
        ino: u64,
        start: u64,
        end: u64,
    ) -> Result<u64> {
        let items = self.extent_items(root, ino, start, end)?;
        let mut released = 0u64;
        for (k, fe) in items {
            let (len, reg) = match &fe.body {
                FileExtentBody::Inline { .. } => (fe.ram_bytes, None),
                FileExtentBody::Regular {
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    num_bytes,
                } => (*num_bytes, Some((*disk_bytenr, *disk_num_bytes, *offset))),
            };
            let (es, ee) = (k.offset, k.offset.saturating_add(len));
            if ee <= start || es >= end {
                continue;
            }
            let counts = fe.ty != FILE_EXTENT_INLINE;
            match reg {
                None => {
                    // Inline extents sit at offset 0 and cover a sector at most.
                    self.delete_item(root, &k)?;
                    released += fe.ram_bytes.min(len);
                    if start > es {
                        return Err(Error::Unsupported(
                            "partial truncation of an inline extent".into(),
                        ));
                    }
                }
                Some((db, dnb, off)) => {
                    self.delete_item(root, &k)?;
                    let has_ref = db != 0;
                    if has_ref {
                        self.add_data_ref(db, dnb, root, ino, es.wrapping_sub(off), -1);
                    }
                    let keep = |s: u64, e: u64, this: &mut Trans| -> Result<()> {
                        let nb = e - s;
                        let body = FileExtentBody::Regular {
                            disk_bytenr: db,
                            disk_num_bytes: dnb,
                            offset: off + (s - es),
                            num_bytes: nb,
                        };
                        let v = file_extent_bytes(
                            fe.generation,
                            fe.ram_bytes,
                            fe.compression,
                            fe.ty,
                            &body,
                        );
                        this.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, s), &v)?;
                        if has_ref {
                            this.add_data_ref(db, dnb, root, ino, es.wrapping_sub(off), 1);
                        }
                        Ok(())
                    };
                    if es < start {
                        keep(es, start, self)?;
                    }
                    if ee > end {
                        keep(end, ee, self)?;
                    }
                    if counts && has_ref {
                        released += ee.min(end) - es.max(start);
                    }
                }
            }
        }
        Ok(released)
    }

    /// Writes `data` at `offset` of a regular file (CoW: new extents, old ones dropped).
    /// `offset` must be sector aligned or at/after the end of file rounded up.
    pub fn write(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        data: &[u8],
        t: Timespec,
    ) -> Result<()> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        if data.is_empty() {
            return Ok(());
        }
        let ss = self.fs.info.sectorsize as u64;
        let end = offset + data.len() as u64;
        let new_size = inode.size.max(end);
        // Small whole files are stored inline, as the kernel does.
        if offset == 0
            && new_size == end
            && inode.size <= end
            && end < ss
            && end <= MAX_INLINE
            && (end as usize) <= self.max_inline_size()
        {
            let released = self.drop_extents(root, ino, 0, u64::MAX)?;
            inode.nbytes = inode.nbytes.saturating_sub(released);
            self.insert_inline(root, ino, data)?;
            inode.nbytes += end;
            inode.size = end;
            self.touch(&mut inode, t, true);
            return self.write_inode(root, ino, &inode);
        }
        // An inline extent cannot be followed by others: make it a regular one first.
        if self.has_inline(root, ino)? {
            self.convert_inline(root, ino, &mut inode)?;
        }
        let mut buf_start = offset;
        let mut buf: Vec<u8>;
        if !offset.is_multiple_of(ss) {
            // Read-modify-write of the first sector.
            let s = offset - offset % ss;
            let mut head = self.read_file_range(root, ino, s, (offset - s) as usize, &inode)?;
            head.extend_from_slice(data);
            buf = head;
            buf_start = s;
        } else {
            buf = data.to_vec();
        }
        let buf_end = buf_start + buf.len() as u64;
        if !buf_end.is_multiple_of(ss) && buf_end < inode.size {
            let e = buf_end.next_multiple_of(ss).min(inode.size);
            let tail = self.read_file_range(root, ino, buf_end, (e - buf_end) as usize, &inode)?;
            buf.extend_from_slice(&tail);
        }
        let aligned_len = (buf.len() as u64).next_multiple_of(ss);
        let released = self.drop_extents(root, ino, buf_start, buf_start + aligned_len)?;
        inode.nbytes = inode.nbytes.saturating_sub(released);
        if !self.no_holes() && buf_start > inode.size.next_multiple_of(ss) {
            let hs = inode.size.next_multiple_of(ss);
            self.fill_holes(root, ino, hs, buf_start)?;
        }
        buf.resize(aligned_len as usize, 0);
        let mut pos = 0u64;
        if let Some((alg, level)) = self.compress {
            if inode.flags & (INODE_NOCOMPRESS | INODE_NODATASUM) == 0 {
                pos = self.write_compressed(root, ino, &mut inode, buf_start, &buf, alg, level)?;
            }
        }
        while pos < aligned_len {
            let want = (aligned_len - pos).min(MAX_EXTENT_SIZE);
            let (bytenr, got) = self.alloc.alloc_data(&mut self.fs.info, want)?;
            let chunk = &buf[pos as usize..(pos + got) as usize];
            let fo = buf_start + pos;
            // Bytes of this piece that came from the caller (the rest is padding).
            let valid = (offset + data.len() as u64).saturating_sub(fo).min(got);
            let cloned = match self.reflink_source.clone() {
                Some(src) if buf_start == offset => self.clone_data(bytenr, &src, fo, valid)?,
                _ => 0,
            };
            self.write_logical(bytenr + cloned, &chunk[cloned as usize..])?;
            self.csum_data(bytenr, chunk)?;
            let body = FileExtentBody::Regular {
                disk_bytenr: bytenr,
                disk_num_bytes: got,
                offset: 0,
                num_bytes: got,
            };
            let v = file_extent_bytes(self.transid, got, 0, FILE_EXTENT_REG, &body);
            self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, fo), &v)?;
            self.add_new_data_extent(bytenr, got, root, ino, fo);
            inode.nbytes += got;
            pos += got;
        }
        inode.size = new_size;
        self.touch(&mut inode, t, true);
        self.write_inode(root, ino, &inode)
    }

    /// Preallocates [offset, offset + len) (sector aligned outward) as PREALLOC extents
    /// where the file has no data; `keep_size` leaves i_size alone (FALLOC_FL_KEEP_SIZE).
    /// Returns the extents allocated, as (disk bytenr, length).
    pub fn fallocate(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        len: u64,
        keep_size: bool,
        t: Timespec,
    ) -> Result<Vec<(u64, u64)>> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let ss = self.fs.info.sectorsize as u64;
        let start = offset - offset % ss;
        let end = (offset + len).next_multiple_of(ss);
        if self.has_inline(root, ino)? {
            self.convert_inline(root, ino, &mut inode)?;
        }
        if !keep_size && !self.no_holes() && start > inode.size.next_multiple_of(ss) {
            let hs = inode.size.next_multiple_of(ss);
            self.fill_holes(root, ino, hs, start)?;
        }
        // Only the holes get extents: collect the covered ranges first.
        let mut covered = Vec::new();
        for (k, fe) in self.extent_items(root, ino, start, end)? {
            if let FileExtentBody::Regular {
                disk_bytenr,
                num_bytes,
                ..
            } = fe.body
            {
                if disk_bytenr != 0 {
                    covered.push((k.offset, k.offset + num_bytes));
                }
            }
        }
        let mut holes = Vec::new();
        let mut pos = start;
        for (s, e) in covered {
            if s > pos {
                holes.push((pos, s.min(end)));
            }
            pos = pos.max(e);
        }
        if pos < end {
            holes.push((pos, end));
        }
        let mut out = Vec::new();
        for (hs, he) in holes {
            if he <= hs {
                continue;
            }
            // Explicit hole items (no NO_HOLES) in the range are replaced.
            self.drop_extents(root, ino, hs, he)?;
            let mut p = hs;
            while p < he {
                let want = (he - p).min(MAX_EXTENT_SIZE);
                let (bytenr, got) = match self.alloc.alloc_data(&mut self.fs.info, want) {
                    Ok(x) => x,
                    Err(e) => {
                        // Keep the inode consistent with what was allocated so far.
                        inode.flags |= INODE_PREALLOC;
                        self.write_inode(root, ino, &inode)?;
                        return Err(e);
                    }
                };
                let body = FileExtentBody::Regular {
                    disk_bytenr: bytenr,
                    disk_num_bytes: got,
                    offset: 0,
                    num_bytes: got,
                };
                let v = file_extent_bytes(self.transid, got, 0, FILE_EXTENT_PREALLOC, &body);
                self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, p), &v)?;
                self.add_new_data_extent(bytenr, got, root, ino, p);
                inode.nbytes += got;
                out.push((bytenr, got));
                p += got;
            }
        }
        if !keep_size && offset + len > inode.size {
            inode.size = offset + len;
        }
        if !out.is_empty() {
            inode.flags |= INODE_PREALLOC;
        }
        self.touch(&mut inode, t, false);
        self.write_inode(root, ino, &inode)?;
        Ok(out)
    }

    /// Writes 128 KiB compressed extents from the start of `buf` for as long as they
    /// save space; on the first chunk that does not, marks the inode NOCOMPRESS (the
    /// kernel's give-up rule) and returns how far it got.
    #[allow(clippy::too_many_arguments)]
    fn write_compressed(
        &mut self,
        root: u64,
        ino: u64,
        inode: &mut InodeItem,
        buf_start: u64,
        buf: &[u8],
        alg: ubtrfs_compress::Compression,
        level: Option<i32>,
    ) -> Result<u64> {
        let ss = self.fs.info.sectorsize as u64;
        let mut pos = 0usize;
        while pos < buf.len() {
            let n = (buf.len() - pos).min(ubtrfs_compress::MAX_UNCOMPRESSED);
            let input = &buf[pos..pos + n];
            let packed = ubtrfs_compress::compress(alg, input, level, ss as u32)
                .map_err(|e| Error::Invalid(format!("compression: {e}")))?;
            let Some(mut c) = packed else {
                inode.flags |= INODE_NOCOMPRESS;
                break;
            };
            let disk_len = (c.len() as u64).next_multiple_of(ss);
            c.resize(disk_len as usize, 0);
            let (bytenr, got) = self.alloc.alloc_data(&mut self.fs.info, disk_len)?;
            if got != disk_len {
                self.alloc.release_unused(bytenr, got)?;
                break;
            }
            self.write_logical(bytenr, &c)?;
            self.csum_data(bytenr, &c)?;
            let fo = buf_start + pos as u64;
            let body = FileExtentBody::Regular {
                disk_bytenr: bytenr,
                disk_num_bytes: disk_len,
                offset: 0,
                num_bytes: n as u64,
            };
            let v = file_extent_bytes(self.transid, n as u64, alg as u8, FILE_EXTENT_REG, &body);
            self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, fo), &v)?;
            self.add_new_data_extent(bytenr, disk_len, root, ino, fo);
            inode.nbytes += n as u64;
            pos += n;
        }
        let flag = match alg {
            ubtrfs_compress::Compression::Lzo => FEATURE_INCOMPAT_COMPRESS_LZO,
            ubtrfs_compress::Compression::Zstd => FEATURE_INCOMPAT_COMPRESS_ZSTD,
            _ => 0,
        };
        if pos > 0 {
            self.fs.info.sb.incompat_flags |= flag;
        }
        Ok(pos as u64)
    }

    /// FALLOC_FL_PUNCH_HOLE: the range reads as zeroes afterwards and whole sectors in
    /// it hold no data; the size does not change.
    pub fn punch_hole(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        len: u64,
        t: Timespec,
    ) -> Result<()> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let end = offset.saturating_add(len).min(inode.size);
        if offset >= end {
            return Ok(());
        }
        let ss = self.fs.info.sectorsize as u64;
        if self.has_inline(root, ino)? {
            self.convert_inline(root, ino, &mut inode)?;
        }
        let (inner_s, inner_e) = (offset.next_multiple_of(ss), end - end % ss);
        if inner_s < inner_e {
            let released = self.drop_extents(root, ino, inner_s, inner_e)?;
            inode.nbytes = inode.nbytes.saturating_sub(released);
            if !self.no_holes() {
                self.fill_holes(root, ino, inner_s, inner_e)?;
            }
            self.touch(&mut inode, t, true);
            self.write_inode(root, ino, &inode)?;
        }
        // Partial sectors at either end get zeroes written (read-modify-write).
        let head_e = inner_s.min(end);
        if offset < head_e {
            self.write(root, ino, offset, &vec![0u8; (head_e - offset) as usize], t)?;
        }
        let tail_s = inner_e.max(offset);
        if inner_s <= inner_e && tail_s < end {
            self.write(root, ino, tail_s, &vec![0u8; (end - tail_s) as usize], t)?;
        }
        Ok(())
    }

    /// FALLOC_FL_ZERO_RANGE: punch, then preallocate the range.
    pub fn zero_range(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        len: u64,
        keep_size: bool,
        t: Timespec,
    ) -> Result<()> {
        let old_size = self.read_inode(root, ino)?.size;
        self.punch_hole(root, ino, offset, len, t)?;
        // Preallocate whatever is a hole now (sector-aligned outward): the punched
        // middle and any part beyond the old end of file.
        self.fallocate(root, ino, offset, len, true, t)?;
        let mut i = self.read_inode(root, ino)?;
        if !keep_size && offset + len > i.size {
            let ss = self.fs.info.sectorsize as u64;
            if !self.no_holes() {
                let hs = old_size.next_multiple_of(ss);
                self.fill_holes(root, ino, hs, offset - offset % ss)?;
                i = self.read_inode(root, ino)?;
            }
            i.size = offset + len;
            self.write_inode(root, ino, &i)?;
        }
        Ok(())
    }

    /// Shares the whole blocks of `src` at `src_offset` (up to `len` bytes) into the
    /// data extent at `bytenr` instead of writing them (mkfs --reflink): single-copy
    /// data chunks on a host filesystem that can reflink. Returns how many bytes were
    /// shared (0 when it could not: the caller writes them).
    fn clone_data(
        &mut self,
        bytenr: u64,
        src: &std::sync::Arc<std::fs::File>,
        src_offset: u64,
        len: u64,
    ) -> Result<u64> {
        let ss = self.fs.info.sectorsize as u64;
        let whole = len - len % ss;
        if whole == 0 || !src_offset.is_multiple_of(4096) {
            return Ok(0);
        }
        let e = self.fs.info.chunk_map.lookup(bytenr)?;
        if e.num_mirrors() != 1 || e.ty & BLOCK_GROUP_PROFILE_MASK != 0 {
            return Ok(0);
        }
        let p = e.map(bytenr, 0)?;
        if p.len < whole || !p.offset.is_multiple_of(4096) {
            return Ok(0);
        }
        let Some(dev) = self.fs.info.devices.get(&p.devid).cloned() else {
            return Ok(0);
        };
        match dev.clone_from_file(src, src_offset, p.offset, whole) {
            Ok(()) => Ok(whole),
            Err(_) => {
                // Not this host filesystem: stop trying, copy instead.
                self.reflink_source = None;
                self.reflink_failed = true;
                Ok(0)
            }
        }
    }

    fn has_inline(&self, root: u64, ino: u64) -> Result<bool> {
        let ptr = self.root_ptr(root)?;
        Ok(
            match lookup_exact(&self.fs.info, &ptr, &Key::new(ino, EXTENT_DATA_KEY, 0))? {
                Some(it) => it.data().get(20) == Some(&FILE_EXTENT_INLINE),
                None => false,
            },
        )
    }

    /// Inserts hole items (filesystems without NO_HOLES) for the parts of
    /// [start, end) no extent item covers.
    fn fill_holes(&mut self, root: u64, ino: u64, start: u64, end: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let ss = self.fs.info.sectorsize as u64;
        let covered: Vec<(u64, u64)> = self
            .extent_items(root, ino, start, end)?
            .into_iter()
            .map(|(k, fe)| {
                let len = match fe.body {
                    FileExtentBody::Inline { .. } => fe.ram_bytes.next_multiple_of(ss),
                    FileExtentBody::Regular { num_bytes, .. } => num_bytes,
                };
                (k.offset, k.offset + len)
            })
            .collect();
        let mut pos = start;
        for (s, e) in covered {
            if s > pos {
                self.insert_hole(root, ino, pos, s.min(end) - pos)?;
            }
            pos = pos.max(e);
            if pos >= end {
                return Ok(());
            }
        }
        if pos < end {
            self.insert_hole(root, ino, pos, end - pos)?;
        }
        Ok(())
    }

    /// Turns an inline extent into a regular one (before other extents join it).
    fn convert_inline(&mut self, root: u64, ino: u64, inode: &mut InodeItem) -> Result<()> {
        let ptr = self.root_ptr(root)?;
        let it = lookup_exact(&self.fs.info, &ptr, &Key::new(ino, EXTENT_DATA_KEY, 0))?
            .ok_or_else(|| Error::corrupt(format!("inode {ino}: inline extent vanished")))?;
        let fe = FileExtentItem::parse(it.data())
            .map_err(|e| Error::corrupt(format!("inode {ino} inline extent: {e}")))?;
        drop(it);
        let len = fe.ram_bytes;
        let view = InodeItem {
            size: len,
            ..inode.clone()
        };
        let data = self.read_file_range(root, ino, 0, len as usize, &view)?;
        self.delete_item(root, &Key::new(ino, EXTENT_DATA_KEY, 0))?;
        inode.nbytes = inode.nbytes.saturating_sub(len);
        let ss = self.fs.info.sectorsize as u64;
        let mut buf = data;
        buf.resize(len.next_multiple_of(ss).max(ss) as usize, 0);
        let got_len = buf.len() as u64;
        let (bytenr, got) = self.alloc.alloc_data(&mut self.fs.info, got_len)?;
        if got != got_len {
            self.alloc.release_unused(bytenr, got)?;
            return Err(Error::NoSpace("converting an inline extent".into()));
        }
        self.write_logical(bytenr, &buf)?;
        self.csum_data(bytenr, &buf)?;
        let body = FileExtentBody::Regular {
            disk_bytenr: bytenr,
            disk_num_bytes: got,
            offset: 0,
            num_bytes: got,
        };
        let v = file_extent_bytes(self.transid, got, 0, FILE_EXTENT_REG, &body);
        self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, 0), &v)?;
        self.add_new_data_extent(bytenr, got, root, ino, 0);
        inode.nbytes += got;
        self.write_inode(root, ino, inode)
    }

    fn inline_len(&self, root: u64, ino: u64) -> Result<Option<u64>> {
        let ptr = self.root_ptr(root)?;
        Ok(
            match lookup_exact(&self.fs.info, &ptr, &Key::new(ino, EXTENT_DATA_KEY, 0))? {
                Some(it) if it.data().get(20) == Some(&FILE_EXTENT_INLINE) => {
                    Some(ubtrfs_format::bytes::le64(it.data(), 8, "file extent").unwrap_or(0))
                }
                _ => None,
            },
        )
    }

    fn insert_hole(&mut self, root: u64, ino: u64, start: u64, len: u64) -> Result<()> {
        let body = FileExtentBody::Regular {
            disk_bytenr: 0,
            disk_num_bytes: 0,
            offset: 0,
            num_bytes: len,
        };
        let v = file_extent_bytes(self.transid, len, 0, FILE_EXTENT_REG, &body);
        self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, start), &v)
    }

    /// Reads file bytes through the uncommitted state (for read-modify-write).
    pub fn read_file_range(
        &self,
        root: u64,
        ino: u64,
        start: u64,
        len: usize,
        inode: &InodeItem,
    ) -> Result<Vec<u8>> {
        let mut out = self
            .fs
            .read_inode(crate::fs::Node::new(root, ino), inode, start, len)?;
        out.resize(len, 0);
        Ok(out)
    }

    /// Sets the file size: shrinking drops extents past it (zeroing the tail of the
    /// last sector by rewriting it), growing leaves a hole.
    pub fn truncate(&mut self, root: u64, ino: u64, size: u64, t: Timespec) -> Result<()> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let ss = self.fs.info.sectorsize as u64;
        if size < inode.size {
            if let Some(l) = self.inline_len(root, ino)? {
                if size < l {
                    let data = self.read_file_range(root, ino, 0, size as usize, &inode)?;
                    let released = self.drop_extents(root, ino, 0, u64::MAX)?;
                    inode.nbytes = inode.nbytes.saturating_sub(released);
                    if size > 0 {
                        self.insert_inline(root, ino, &data)?;
                        inode.nbytes += size;
                    }
                } else {
                    // The inline data stays; only what follows it (holes) goes.
                    let from = size.next_multiple_of(ss).max(ss);
                    let released = self.drop_extents(root, ino, from, u64::MAX)?;
                    inode.nbytes = inode.nbytes.saturating_sub(released);
                }
            } else {
                let keep_end = size.next_multiple_of(ss);
                let tail = if !size.is_multiple_of(ss) {
                    Some(self.read_file_range(
                        root,
                        ino,
                        size - size % ss,
                        (size % ss) as usize,
                        &inode,
                    )?)
                } else {
                    None
                };
                let released = self.drop_extents(root, ino, keep_end, u64::MAX)?;
                inode.nbytes = inode.nbytes.saturating_sub(released);
                inode.size = size;
                self.write_inode(root, ino, &inode)?;
                if let Some(tail) = tail {
                    // Rewrite the last sector with zeroes past the new end.
                    self.write(root, ino, size - size % ss, &tail, t)?;
                    inode = self.read_inode(root, ino)?;
                }
            }
        } else if size > inode.size && !self.no_holes() {
            let hs = inode.size.next_multiple_of(ss);
            let he = size.next_multiple_of(ss);
            self.fill_holes(root, ino, hs, he)?;
        }
        inode.size = size;
        self.touch(&mut inode, t, true);
        self.write_inode(root, ino, &inode)?;
        self.touch_root(root, t)
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

    /// Sets an extended attribute (replacing a previous value).
    pub fn set_xattr(
        &mut self,
        root: u64,
        ino: u64,
        name: &[u8],
        value: &[u8],
        t: Timespec,
    ) -> Result<()> {
        if name.is_empty() || name.len() > NAME_LEN_MAX {
            return Err(Error::Invalid("xattr name".into()));
        }
        // The kernel accepts only these namespaces.
        let known = [&b"user."[..], b"trusted.", b"security.", b"btrfs."];
        let acl = name == b"system.posix_acl_access" || name == b"system.posix_acl_default";
        if !acl
            && !known
                .iter()
                .any(|p| name.starts_with(p) && name.len() > p.len())
        {
            return Err(Error::Unsupported(format!(
                "xattr name {:?} (namespaces: user., trusted., security., system.posix_acl_*)",
                String::from_utf8_lossy(name)
            )));
        }
        let entry_len = 30 + name.len() + value.len();
        if entry_len > self.max_item_size() {
            return Err(Error::NoSpace(format!(
                "xattr value of {} bytes exceeds the item size limit",
                value.len()
            )));
        }
        self.remove_xattr_entry(root, ino, name)?;
        let key = Key::new(ino, XATTR_ITEM_KEY, name_hash(name));
        let e = ubtrfs_format::items::dir_item_bytes(
            &Key::new(0, 0, 0),
            self.transid,
            value,
            name,
            FT_XATTR,
        );
        self.append_to_item(root, &key, &e)?;
        let mut i = self.read_inode(root, ino)?;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)
    }

    /// Removes an extended attribute (ENODATA as [`Error::NotFound`] if absent).
    pub fn remove_xattr(&mut self, root: u64, ino: u64, name: &[u8], t: Timespec) -> Result<()> {
        if !self.remove_xattr_entry(root, ino, name)? {
            return Err(Error::NotFound(format!(
                "xattr {}",
                String::from_utf8_lossy(name)
            )));
        }
        let mut i = self.read_inode(root, ino)?;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)
    }

    fn remove_xattr_entry(&mut self, root: u64, ino: u64, name: &[u8]) -> Result<bool> {
        let key = Key::new(ino, XATTR_ITEM_KEY, name_hash(name));
        self.remove_from_item(root, &key, |d| dir_entry_span(d, name))
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

    /// Resolves a path inside a subvolume to an inode (no symlinks followed).
    pub fn resolve_path(&self, root: u64, path: &[u8]) -> Result<u64> {
        let mut ino = FIRST_FREE_OBJECTID;
        for comp in path
            .split(|&c| c == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            if comp == b".." {
                ino = self.parent_of(root, ino)?;
                continue;
            }
            let (i, _, loc) = self
                .lookup(root, ino, comp)?
                .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(path).into_owned()))?;
            if loc.ty == ROOT_ITEM_KEY {
                return Err(Error::Unsupported(
                    "paths crossing into another subvolume".into(),
                ));
            }
            ino = i;
        }
        Ok(ino)
    }
}
