//! Creating subvolumes (the kernel's ioctl.c create_subvol): a new tree with its root
//! directory, the ROOT_ITEM, ROOT_REF/ROOT_BACKREF, the directory entry in the parent
//! (location = the new tree's ROOT_ITEM, no INODE_REF) and the UUID tree entry.

use crate::error::{Error, Result};
use crate::transaction::Trans;
use crate::tree::ctree::lookup_prev;
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::name_hash;
use ubtrfs_format::items::{InodeItem, RootItem, RootRef, Timespec};
use ubtrfs_format::key::Key;

impl Trans {
    pub(crate) fn free_root_id(&mut self) -> Result<u64> {
        let root = self.fs.info.root_tree_ptr();
        let highest = match lookup_prev(
            &self.fs.info,
            &root,
            Key::new(LAST_FREE_OBJECTID, u8::MAX, u64::MAX),
        )? {
            Some((k, _)) if k.objectid >= FIRST_FREE_OBJECTID => k.objectid,
            _ => FIRST_FREE_OBJECTID - 1,
        };
        // Never below an id this handle gave out or dropped (`root_id_floor`).
        let mut id = (highest + 1).max(self.root_id_floor);
        // Trees made in this transaction are already in tree_roots.
        while self.fs.info.tree_roots.contains_key(&id) {
            id += 1;
        }
        if id > LAST_FREE_OBJECTID {
            return Err(Error::NoSpace("subvolume ids exhausted".into()));
        }
        self.root_id_floor = id + 1;
        Ok(id)
    }

    /// ENOTDIR unless inode `dir` of tree `root` is a directory: a subvolume's
    /// entry goes into one (the ioctls take a directory's fd).
    pub(crate) fn require_dir(&self, root: u64, dir: u64) -> Result<()> {
        if self.read_inode(root, dir)?.mode & 0o170000 != 0o040000 {
            return Err(Error::NotDir(format!("inode {dir} of tree {root}")));
        }
        Ok(())
    }

    /// Creates an empty subvolume named `name` in directory `dir` of tree `parent`;
    /// returns its tree id (its root directory is inode 256).
    #[allow(clippy::too_many_arguments)]
    pub fn create_subvolume(
        &mut self,
        parent: u64,
        dir: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        t: Timespec,
    ) -> Result<u64> {
        self.require_dir(parent, dir)?;
        if self.lookup(parent, dir, name)?.is_some() {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        let id = self.free_root_id()?;
        let transid = self.transid;
        let ns = self.fs.info.nodesize as u64;
        let (b, d) = self.new_block(id, 0, None, 0)?;
        self.put_dirty(b, d)?;
        let uuid = crate::io::dev::random_uuid();
        let item = RootItem {
            inode: InodeItem {
                generation: 1,
                size: 3,
                nlink: 1,
                nbytes: ns,
                mode: 0o40755,
                // As the kernel's create_subvol: flags and byte_limit are valid.
                flags: INODE_ROOT_ITEM_INIT,
                ..Default::default()
            },
            generation: transid,
            generation_v2: transid,
            root_dirid: FIRST_FREE_OBJECTID,
            bytenr: b,
            bytes_used: ns,
            refs: 1,
            uuid,
            otransid: transid,
            ctransid: transid,
            ctime: t,
            otime: t,
            ..Default::default()
        };
        self.create_root_item(id, Key::new(id, ROOT_ITEM_KEY, 0), item)?;
        *self.root_bytes_delta.entry(id).or_insert(0) -= ns as i64;
        self.qgroup_new_subvolume(id, None, parent)?;
        let ino = InodeItem {
            generation: transid,
            transid,
            nlink: 1,
            uid,
            gid,
            mode: 0o40000 | (mode & 0o7777),
            nbytes: 0,
            atime: t,
            ctime: t,
            mtime: t,
            otime: t,
            ..Default::default()
        };
        self.insert_root_dir(id, &ino)?;
        self.link_new_subvol(parent, dir, name, id, &uuid, t)?;
        Ok(id)
    }

    /// Names the new tree `id` as `name` in directory `dir` of tree `parent`: the
    /// directory entry (pointing at the tree, not an inode), ROOT_REF and
    /// ROOT_BACKREF, and the UUID tree's entry for `uuid`. Subvolume creation and
    /// snapshots alike.
    pub(crate) fn link_new_subvol(
        &mut self,
        parent: u64,
        dir: u64,
        name: &[u8],
        id: u64,
        uuid: &[u8; 16],
        t: Timespec,
    ) -> Result<()> {
        let index = self.add_subvol_entry(parent, dir, name, id, t)?;
        self.put_root_refs(parent, id, dir, index, name, false)?;
        self.uuid_tree_add(uuid, UUID_KEY_SUBVOL, id)
    }

    /// Writes ROOT_REF (parent to child) and ROOT_BACKREF (child to parent), one
    /// body for both: the child `id` is `name` at DIR_INDEX `index` of directory
    /// `dir` in tree `parent`. `replace` overwrites existing ones (a rename).
    pub(crate) fn put_root_refs(
        &mut self,
        parent: u64,
        id: u64,
        dir: u64,
        index: u64,
        name: &[u8],
        replace: bool,
    ) -> Result<()> {
        let rr = RootRef {
            dirid: dir,
            sequence: index,
            name: name.to_vec(),
        }
        .to_bytes();
        for key in [
            Key::new(parent, ROOT_REF_KEY, id),
            Key::new(id, ROOT_BACKREF_KEY, parent),
        ] {
            if replace {
                self.replace_item(ROOT_TREE_OBJECTID, &key, &rr)?;
            } else {
                self.insert_item(ROOT_TREE_OBJECTID, &key, &rr)?;
            }
        }
        Ok(())
    }

    pub(crate) fn add_subvol_entry(
        &mut self,
        parent: u64,
        dir: u64,
        name: &[u8],
        id: u64,
        t: Timespec,
    ) -> Result<u64> {
        let index = self.next_dir_index(parent, dir)?;
        let loc = Key::new(id, ROOT_ITEM_KEY, u64::MAX);
        let entry = ubtrfs_format::items::dir_item_bytes(&loc, self.transid, &[], name, FT_DIR);
        let dkey = Key::new(dir, DIR_ITEM_KEY, name_hash(name));
        self.append_to_item(parent, &dkey, &entry)?;
        self.insert_item(parent, &Key::new(dir, DIR_INDEX_KEY, index), &entry)?;
        let mut d = self.read_inode(parent, dir)?;
        d.size = d.size.saturating_add(name.len() as u64 * 2);
        d.ctime = t;
        d.mtime = t;
        d.transid = self.transid;
        d.sequence += 1;
        self.write_inode(parent, dir, &d)?;
        Ok(index)
    }

    /// Writes the root directory of a new tree: inode 256 and its ".." INODE_REF
    /// pointing at itself, as the kernel and mkfs make it.
    pub(crate) fn insert_root_dir(&mut self, id: u64, inode: &InodeItem) -> Result<()> {
        self.insert_item(
            id,
            &Key::new(FIRST_FREE_OBJECTID, INODE_ITEM_KEY, 0),
            &inode.to_bytes(),
        )?;
        self.insert_item(
            id,
            &Key::new(FIRST_FREE_OBJECTID, INODE_REF_KEY, FIRST_FREE_OBJECTID),
            &ubtrfs_format::items::inode_ref_bytes(0, b".."),
        )
    }
}
