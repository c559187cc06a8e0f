//! The btrfs subvolume ioctls on a read-write mount: SUBVOL_CREATE(_V2),
//! SNAP_CREATE(_V2) and SNAP_DESTROY(_V2), with the kernel's argument structs
//! (`btrfs_ioctl_vol_args`, `_v2`), issued on the parent directory. FUSE carries them
//! because their size is in the command number (a "restricted" ioctl); the snapshot
//! source is a file descriptor of the caller, found through /proc/PID/fd.
//!
//! btrfs-progs' own commands do not reach here: they check statfs's f_type for the
//! btrfs magic first, and a FUSE mount's f_type is FUSE's, set by the kernel. `ubtrfs
//! subvolume create|snapshot|delete` on a mounted directory issue these ioctls (on a
//! kernel btrfs mount too).
//!
//! INO_LOOKUP (`btrfs inspect-internal rootid`, and how `ubtrfs subvolume
//! create|snapshot -i` on a ubtrfs mount finds the new subvolume's id) answers the
//! subvolume of a descriptor and the path of an inode in a tree. QGROUP_INHERIT
//! is refused (its qgroup list is behind a pointer FUSE does not carry): the
//! ubtrfs client assigns the new subvolume's qgroup after creating it instead.
//!
//! The changed directory's cached names and attributes are invalidated with FUSE
//! notifications after the reply (the kernel did not see the change happen).

use crate::abi::InHeader;
use crate::acl::{self, Acl};
use crate::channel::Channel;
use crate::creds::{Caller, CAP_FOWNER, CAP_SYS_ADMIN, MAY_EXEC, MAY_WRITE};
use crate::ops::{errno, Ops};
use crate::reply::{inval_inode, notify, NOTIFY_INVAL_ENTRY};
use crate::writer::Engine;
use std::path::{Path, PathBuf};
use ubtrfs_core::{now, Node, Stat};
use ubtrfs_format::consts::{FIRST_FREE_OBJECTID, INODE_APPEND, INODE_IMMUTABLE};

/// Who may do what the kernel's subvolume ioctls leave to CAP_SYS_ADMIN: a caller
/// with it, or the user who mounted the image (an unprivileged mount's owner).
pub(crate) fn subvol_admin(h: &InHeader, caller: &Caller) -> bool {
    caller.capable(CAP_SYS_ADMIN) || (h.uid != 0 && h.uid == nix::unistd::getuid().as_raw())
}

/// `_IOW(0x94, nr, 4096)`: the commands taking `btrfs_ioctl_vol_args(_v2)`.
const fn vol_ioctl(nr: u32) -> u32 {
    (1 << 30) | (4096 << 16) | (0x94 << 8) | nr
}
pub(crate) const BTRFS_IOC_SNAP_CREATE: u32 = vol_ioctl(1);
pub(crate) const BTRFS_IOC_SUBVOL_CREATE: u32 = vol_ioctl(14);
pub(crate) const BTRFS_IOC_SNAP_DESTROY: u32 = vol_ioctl(15);
pub(crate) const BTRFS_IOC_SNAP_CREATE_V2: u32 = vol_ioctl(23);
pub(crate) const BTRFS_IOC_SUBVOL_CREATE_V2: u32 = vol_ioctl(24);
pub(crate) const BTRFS_IOC_SNAP_DESTROY_V2: u32 = vol_ioctl(63);
/// `_IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)` (4096 bytes: treeid,
/// objectid, name).
pub(crate) const BTRFS_IOC_INO_LOOKUP: u32 = (3 << 30) | (4096 << 16) | (0x94 << 8) | 18;
/// Bytes of INO_LOOKUP's name field.
const INO_LOOKUP_PATH_MAX: usize = 4080;

/// True for the commands this module answers.
pub(crate) fn is_subvol_ioctl(cmd: u32) -> bool {
    matches!(
        cmd,
        BTRFS_IOC_SNAP_CREATE
            | BTRFS_IOC_SUBVOL_CREATE
            | BTRFS_IOC_SNAP_DESTROY
            | BTRFS_IOC_SNAP_CREATE_V2
            | BTRFS_IOC_SUBVOL_CREATE_V2
            | BTRFS_IOC_SNAP_DESTROY_V2
    )
}

/// vol_args_v2 flags.
const SUBVOL_RDONLY: u64 = 1 << 1;
const SUBVOL_QGROUP_INHERIT: u64 = 1 << 2;
const SUBVOL_SPEC_BY_ID: u64 = 1 << 4;

/// The parsed arguments: the caller's fd, the v2 flags, the name.
struct VolArgs {
    fd: i64,
    flags: u64,
    name: Vec<u8>,
}

fn parse(cmd: u32, input: &[u8]) -> Result<VolArgs, i32> {
    let v2 = matches!(
        cmd,
        BTRFS_IOC_SNAP_CREATE_V2 | BTRFS_IOC_SUBVOL_CREATE_V2 | BTRFS_IOC_SNAP_DESTROY_V2
    );
    let word = |o: usize| -> Result<u64, i32> {
        let b = input.get(o..o + 8).ok_or(errno::EINVAL)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_ne_bytes(a))
    };
    let fd = word(0)? as i64;
    let (flags, name_at) = if v2 { (word(16)?, 56) } else { (0, 8) };
    if flags & SUBVOL_SPEC_BY_ID != 0 {
        // Deleting by id: the name field holds the id; ubtrfs asks by name.
        return Err(errno::EOPNOTSUPP);
    }
    if flags & SUBVOL_QGROUP_INHERIT != 0 {
        // The qgroup list is behind a pointer into the caller's memory.
        return Err(errno::EOPNOTSUPP);
    }
    let raw = input.get(name_at..).ok_or(errno::EINVAL)?;
    let len = raw
        .iter()
        .position(|&b| b == 0)
        .ok_or(errno::ENAMETOOLONG)?;
    let name = raw[..len].to_vec();
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(errno::EINVAL);
    }
    if name.len() > crate::ops::NAME_MAX {
        return Err(errno::ENAMETOOLONG);
    }
    Ok(VolArgs { fd, flags, name })
}

impl Ops {
    /// One of the subvolume ioctls on directory `h.nodeid`. Returns the name it
    /// made or removed: the caller answers, then has the kernel forget that name
    /// ([`invalidate`]).
    pub(crate) fn subvol_ioctl(
        &self,
        h: &InHeader,
        cmd: u32,
        input: &[u8],
        ch: &Channel,
    ) -> Result<Vec<u8>, i32> {
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        // The kernel passes these on unchecked: its rules are applied here
        // (btrfs_ioctl_snap_create_transid, btrfs_ioctl_snap_destroy). Creating
        // needs write and search permission on the directory; a snapshot, that the
        // caller own its source; deleting, CAP_SYS_ADMIN or `user_subvol_rm_allowed`
        // and write permission on the subvolume's root, then rmdir's rules.
        let caller = Caller::new(h);
        let admin = subvol_admin(h, &caller);
        let a = parse(cmd, input)?;
        let dir = self.changeable(h.nodeid)?;
        let may = |node: Node, want: u32| -> Result<Stat, i32> {
            let (st, acl) = w
                .read(|fs| Ok((fs.stat(node)?, fs.getxattr(node, acl::ACCESS)?)))
                .map_err(|e: ubtrfs_core::Error| e.errno())?;
            // inode_permission: an immutable inode is written by nobody.
            if want & MAY_WRITE != 0 && st.flags & INODE_IMMUTABLE != 0 {
                return Err(errno::EPERM);
            }
            let acl = acl.as_deref().and_then(Acl::parse);
            if caller.permits(st.uid, st.gid, st.mode, acl.as_ref(), want) {
                Ok(st)
            } else {
                Err(errno::EACCES)
            }
        };
        // btrfs_may_create: an existing name is EEXIST before the write check (the
        // lookup itself needs search permission on the directory).
        let exists = || -> Result<(), i32> {
            may(dir, MAY_EXEC)?;
            match w
                .read(|fs| fs.lookup(dir, &a.name))
                .map_err(|e| e.errno())?
            {
                Some(_) => Err(errno::EEXIST),
                None => Ok(()),
            }
        };
        let t0 = now();
        match cmd {
            BTRFS_IOC_SUBVOL_CREATE | BTRFS_IOC_SUBVOL_CREATE_V2 => {
                exists()?;
                may(dir, MAY_WRITE | MAY_EXEC)?;
                // inode_init_owner without a directory: the caller's ids, no setgid
                // inheritance, the umask applied. The directory's default ACL is not
                // inherited (the kernel's subvolume root gets none; tested).
                let mode = 0o777 & !caller.umask();
                w.change("subvolume create", |t| {
                    t.create_subvolume(dir.root, dir.ino, &a.name, mode, h.uid, h.gid, t0)
                })?;
            }
            BTRFS_IOC_SNAP_CREATE | BTRFS_IOC_SNAP_CREATE_V2 => {
                let src = self.caller_subvolume(h.pid, a.fd, ch.mountpoint())?;
                let src_root = Node::new(src, FIRST_FREE_OBJECTID);
                let owner = w.read(|fs| fs.stat(src_root)).map_err(|e| e.errno())?.uid;
                // "Subvolume creation is not restricted, but snapshots are limited to
                // own subvolumes only."
                if !caller.owner_or_capable(owner) {
                    return Err(errno::EPERM);
                }
                exists()?;
                may(dir, MAY_WRITE | MAY_EXEC)?;
                let ro = a.flags & SUBVOL_RDONLY != 0;
                let id = w.change("snapshot", |t| {
                    t.create_snapshot(src, dir.root, dir.ino, &a.name, ro, t0)
                })?;
                if ro {
                    self.add_read_only_subvol(id);
                }
            }
            _ => {
                let target = w
                    .read(|fs| fs.lookup(dir, &a.name))
                    .map_err(|e| e.errno())?
                    .ok_or(errno::ENOENT)?;
                let victim = if admin {
                    w.read(|fs| fs.stat(target.node)).map_err(|e| e.errno())?
                } else {
                    if !self
                        .user_subvol_rm_allowed
                        .load(std::sync::atomic::Ordering::Relaxed)
                    {
                        return Err(errno::EPERM);
                    }
                    if target.node.root == dir.root {
                        return Err(errno::EINVAL);
                    }
                    if self.read_only_subvol(target.node.root) {
                        return Err(errno::EROFS);
                    }
                    may(target.node, MAY_WRITE | MAY_EXEC)?
                };
                // rmdir's rules on the parent (btrfs_may_delete): write and search
                // permission, not append-only, the sticky bit's owners, a victim
                // neither append-only nor immutable.
                let parent = may(dir, MAY_WRITE | MAY_EXEC)?;
                let sticky_blocks = parent.mode & 0o1000 != 0
                    && h.uid != parent.uid
                    && h.uid != victim.uid
                    && !caller.capable(CAP_FOWNER);
                if parent.flags & INODE_APPEND != 0
                    || sticky_blocks
                    || victim.flags & (INODE_APPEND | INODE_IMMUTABLE) != 0
                {
                    return Err(errno::EPERM);
                }
                if target.node.root == dir.root {
                    return Err(errno::EINVAL); // not a subvolume
                }
                if target.node.root == self.cfg.root.root {
                    return Err(errno::EBUSY);
                }
                w.change("subvolume delete", |t| {
                    t.delete_subvolume(dir.root, dir.ino, &a.name, t0)
                })?;
            }
        }
        Ok(a.name)
    }

    /// INO_LOOKUP on inode `h.nodeid`: tree `treeid` (0: the inode's own
    /// subvolume) and the path of inode `objectid` in it from the subvolume's root,
    /// each name followed by '/' (empty for the root directory), as the kernel's
    /// btrfs_ioctl_ino_lookup answers; like the kernel, only root may ask for
    /// another inode than a subvolume's root.
    pub(crate) fn ino_lookup(&self, h: &InHeader, input: &[u8]) -> Result<Vec<u8>, i32> {
        let word = |o: usize| -> Result<u64, i32> {
            let b = input.get(o..o + 8).ok_or(errno::EINVAL)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(u64::from_ne_bytes(a))
        };
        let (mut treeid, objectid) = (word(0)?, word(8)?);
        if treeid == 0 {
            treeid = self.node(h.nodeid)?.node.root;
        }
        let mut path: Vec<u8> = Vec::new();
        if objectid != FIRST_FREE_OBJECTID {
            if h.uid != 0 {
                return Err(errno::EPERM);
            }
            let mut cur = objectid;
            let mut depth = 0usize;
            while cur != FIRST_FREE_OBJECTID {
                depth += 1;
                let r = self
                    .engine
                    .read(|fs| fs.inode_refs(Node::new(treeid, cur)))
                    .map_err(|e| e.errno())?;
                let first = r.first().ok_or(errno::ENOENT)?;
                let mut part = first.name.clone();
                part.push(b'/');
                part.extend_from_slice(&path);
                path = part;
                if path.len() >= INO_LOOKUP_PATH_MAX || depth > INO_LOOKUP_PATH_MAX {
                    return Err(errno::ENAMETOOLONG);
                }
                cur = first.parent;
            }
        }
        let mut out = vec![0u8; 16 + INO_LOOKUP_PATH_MAX];
        out[..8].copy_from_slice(&treeid.to_ne_bytes());
        out[8..16].copy_from_slice(&objectid.to_ne_bytes());
        out[16..16 + path.len()].copy_from_slice(&path);
        Ok(out)
    }

    /// The subvolume whose root the caller's descriptor `fd` opens, on this mount.
    fn caller_subvolume(&self, pid: u32, fd: i64, mountpoint: &Path) -> Result<u64, i32> {
        let link = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
        let target = std::fs::read_link(&link).map_err(|_| errno::EBADF)?;
        let rel = target.strip_prefix(mountpoint).map_err(|_| errno::EXDEV)?;
        let node = self
            .engine
            .read(|fs| {
                let mut cur = self.cfg.root;
                for c in rel.components() {
                    use std::os::unix::ffi::OsStrExt;
                    let name = c.as_os_str().as_bytes();
                    cur = fs
                        .lookup(cur, name)?
                        .ok_or_else(|| ubtrfs_core::Error::NotFound(rel.display().to_string()))?
                        .node;
                }
                Ok::<Node, ubtrfs_core::Error>(cur)
            })
            .map_err(|e| e.errno())?;
        if node.ino != FIRST_FREE_OBJECTID || node.is_placeholder() {
            return Err(errno::EINVAL);
        }
        Ok(node.root)
    }
}

/// Tells the kernel to forget `name` in directory `parent` and the directory's
/// attributes and listing. The kernel takes the directory's lock for it, which a
/// request of that directory may hold while it waits for us: a handler sends it
/// through [`invalidate_soon`], not from its own thread.
pub(crate) fn invalidate(ch: &Channel, parent: u64, name: &[u8]) {
    let mut e = Vec::with_capacity(16 + name.len() + 1);
    e.extend_from_slice(&parent.to_ne_bytes());
    e.extend_from_slice(&(name.len() as u32).to_ne_bytes());
    e.extend_from_slice(&0u32.to_ne_bytes());
    e.extend_from_slice(name);
    e.push(0);
    notify(ch, NOTIFY_INVAL_ENTRY, &[&e]);
    inval_inode(ch, parent, 0);
}

/// [`invalidate`] of each of `names` (directory id, name), and of the pages and
/// attributes of each of `inodes`, from a thread of its own, waited for up to a
/// second; called before the answer, so the caller's next lookup sees the new name
/// (a negative entry the kernel cached before is gone) and the next read the new
/// data. Not from the handler's thread: the kernel takes a directory's lock for a
/// name and an inode's page locks for its pages, and a task holding them may be
/// waiting for a request this thread would serve next (through io_uring this
/// thread still holds its queue entry until the handler returns). Normally the
/// notifications are done within a millisecond; if not, the answer goes anyway and
/// they follow.
pub(crate) fn invalidate_soon(ch: &Channel, names: Vec<(u64, Vec<u8>)>, inodes: Vec<u64>) {
    fn all(ch: &Channel, names: &[(u64, Vec<u8>)], inodes: &[u64]) {
        for (parent, name) in names {
            invalidate(ch, *parent, name);
        }
        for id in inodes {
            crate::reply::inval_inode(ch, *id, 0);
        }
    }
    let Ok(own) = ch.try_clone() else {
        return all(ch, &names, &inodes);
    };
    let work = std::sync::Arc::new((names, inodes));
    let theirs = std::sync::Arc::clone(&work);
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("ubtrfs-notify".into())
        .spawn(move || {
            all(&own, &theirs.0, &theirs.1);
            let _ = tx.send(());
        });
    match spawned {
        Ok(_) => {
            let _ = rx.recv_timeout(std::time::Duration::from_secs(1));
        }
        Err(_) => all(ch, &work.0, &work.1),
    }
}

/// The client side: what `ubtrfs subvolume create|snapshot|delete` send when given a
/// mounted directory (a ubtrfs mount, or the kernel's btrfs mount).
pub mod client {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;

    fn vol_args_v2(fd: i64, flags: u64, name: &[u8]) -> io::Result<Vec<u8>> {
        if name.len() >= 4040 {
            return Err(io::Error::from_raw_os_error(36));
        }
        let mut b = vec![0u8; 4096];
        b[..8].copy_from_slice(&fd.to_ne_bytes());
        b[16..24].copy_from_slice(&flags.to_ne_bytes());
        b[56..56 + name.len()].copy_from_slice(name);
        Ok(b)
    }

    /// One ioctl on an open file or directory; `arg` must be as long as the size
    /// the command number declares (every client of this crate passes such a
    /// buffer).
    /// One of ubtrfs's private ioctls: [`ioctl`], ENOTTY (not a ubtrfs mount)
    /// said so, naming what to use on a kernel btrfs mount instead.
    pub(crate) fn ubtrfs_ioctl(
        dir: &File,
        cmd: u32,
        arg: &mut [u8],
        on_kernel: &str,
    ) -> io::Result<()> {
        ioctl(dir, cmd, arg).map_err(|e| {
            if e.raw_os_error() == Some(25) {
                io::Error::new(
                    e.kind(),
                    format!("not a ubtrfs mount (on a kernel btrfs mount use {on_kernel})"),
                )
            } else {
                e
            }
        })
    }

    /// Word `i` (native endian) of an ioctl's answer.
    pub(crate) fn answer_word(a: &[u8], i: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&a[8 * i..8 * i + 8]);
        u64::from_ne_bytes(b)
    }

    pub(crate) fn ioctl(dir: &File, cmd: u32, arg: &mut [u8]) -> io::Result<()> {
        // SAFETY: `arg` is a live, writable buffer; callers size it as the command
        // number declares, and the descriptor is open for the call's duration.
        let r = unsafe {
            nix::libc::ioctl(dir.as_raw_fd(), cmd as nix::libc::c_ulong, arg.as_mut_ptr())
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// FS_IOC_GETFSLABEL: the label of the filesystem holding `f` (a ubtrfs or a
    /// kernel btrfs mount), up to its NUL.
    pub fn get_fslabel(f: &File) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; 256];
        ioctl(f, crate::ops::FS_IOC_GETFSLABEL, &mut b)?;
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        b.truncate(end);
        Ok(b)
    }

    /// FS_IOC_SETFSLABEL: a new label (at most 255 bytes, no NUL).
    pub fn set_fslabel(f: &File, label: &[u8]) -> io::Result<()> {
        if label.len() >= 256 || label.contains(&0) {
            return Err(io::Error::from_raw_os_error(22));
        }
        let mut b = vec![0u8; 256];
        b[..label.len()].copy_from_slice(label);
        ioctl(f, crate::ops::FS_IOC_SETFSLABEL, &mut b)
    }

    /// BTRFS_IOC_SUBVOL_CREATE_V2: a new subvolume `name` in directory `dir`.
    pub fn create_subvolume(dir: &File, name: &[u8]) -> io::Result<()> {
        let mut a = vol_args_v2(0, 0, name)?;
        ioctl(dir, super::BTRFS_IOC_SUBVOL_CREATE_V2, &mut a)
    }

    /// BTRFS_IOC_SNAP_CREATE_V2: a snapshot of the subvolume `src` (its root
    /// directory, open) as `name` in `dir`.
    pub fn create_snapshot(dir: &File, src: &File, name: &[u8], readonly: bool) -> io::Result<()> {
        let flags = if readonly { super::SUBVOL_RDONLY } else { 0 };
        let mut a = vol_args_v2(src.as_raw_fd() as i64, flags, name)?;
        ioctl(dir, super::BTRFS_IOC_SNAP_CREATE_V2, &mut a)
    }

    /// The qgroup_inherit struct of a create or snapshot `-i` (flags, counts, a
    /// zero limit, then the qgroup ids), as the kernel reads it.
    fn qgroup_inherit(qgroups: &[u64]) -> Vec<u8> {
        let mut b = Vec::with_capacity(72 + 8 * qgroups.len());
        b.extend_from_slice(&0u64.to_ne_bytes());
        b.extend_from_slice(&(qgroups.len() as u64).to_ne_bytes());
        b.extend_from_slice(&[0u8; 16 + 40]);
        for q in qgroups {
            b.extend_from_slice(&q.to_ne_bytes());
        }
        b
    }

    /// SUBVOL_CREATE_V2 or SNAP_CREATE_V2 (`src` given) with QGROUP_INHERIT: the
    /// new subvolume joins `qgroups` at its creation. The kernel's mounts only
    /// (see the module comment).
    pub fn create_inheriting(
        dir: &File,
        src: Option<&File>,
        name: &[u8],
        readonly: bool,
        qgroups: &[u64],
    ) -> io::Result<()> {
        let mut flags = super::SUBVOL_QGROUP_INHERIT;
        if readonly {
            flags |= super::SUBVOL_RDONLY;
        }
        let fd = src.map_or(0, |s| s.as_raw_fd() as i64);
        let inherit = qgroup_inherit(qgroups);
        let mut a = vol_args_v2(fd, flags, name)?;
        a[24..32].copy_from_slice(&(inherit.len() as u64).to_ne_bytes());
        // The kernel copies the struct from this address during the call.
        a[32..40].copy_from_slice(&(inherit.as_ptr() as u64).to_ne_bytes());
        let cmd = if src.is_some() {
            super::BTRFS_IOC_SNAP_CREATE_V2
        } else {
            super::BTRFS_IOC_SUBVOL_CREATE_V2
        };
        ioctl(dir, cmd, &mut a)
    }

    /// INO_LOOKUP with tree 0 and the root directory: the id of the subvolume
    /// `f` is in (`btrfs inspect-internal rootid`).
    pub fn subvolume_id(f: &File) -> io::Result<u64> {
        let mut a = vec![0u8; 4096];
        a[8..16].copy_from_slice(&super::FIRST_FREE_OBJECTID.to_ne_bytes());
        ioctl(f, super::BTRFS_IOC_INO_LOOKUP, &mut a)?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&a[..8]);
        Ok(u64::from_ne_bytes(id))
    }

    /// BTRFS_IOC_SNAP_DESTROY_V2: deletes subvolume `name` in `dir`.
    pub fn delete_subvolume(dir: &File, name: &[u8]) -> io::Result<()> {
        let mut a = vol_args_v2(0, 0, name)?;
        ioctl(dir, super::BTRFS_IOC_SNAP_DESTROY_V2, &mut a)
    }

    /// syncfs(2) of the filesystem holding `f`: the kernel writes back the pages it
    /// holds dirty for it (a FUSE server is not asked to commit by it).
    pub(crate) fn syncfs(f: &File) -> io::Result<()> {
        nix::unistd::syncfs(f.as_raw_fd()).map_err(io::Error::from)
    }

    /// BTRFS_IOC_SYNC (`btrfs filesystem sync`): the mount commits.
    pub fn sync(f: &File) -> io::Result<()> {
        // `_IO(0x94, 8)`: no argument.
        ioctl(f, 0x9408, &mut [])
    }
}
