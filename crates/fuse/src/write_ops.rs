//! Requests that change the filesystem, on a read-write mount: each is one change to
//! the running transaction ([`Writer::change`]), answered with the kernel's errno
//! values. Permission checks are the kernel's own (the mount uses
//! `default_permissions`), as on a kernel btrfs mount.

use crate::abi::{self, op, Args, InHeader, Out};
use crate::nodes::NodeKey;
use crate::ops::{errno, Ops, NAME_MAX};
use crate::reply::Reply;
use crate::writer::Writer;
use std::sync::atomic::Ordering;
use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::mode::{S_IFDIR, S_IFLNK, S_IFMT};
use ubtrfs_core::{now, Error, NewInode, Node};

const S_ISGID: u32 = 0o2000;

// fuse_setattr_in.valid
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
const FATTR_CTIME: u32 = 1 << 10;

// fallocate(2) modes
const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

// renameat2(2) flags
const RENAME_NOREPLACE: u32 = 1;
const RENAME_EXCHANGE: u32 = 2;

// setxattr(2) flags
const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;

// POSIX ACLs in their xattr form (what the kernel hands over in SETXATTR): a
// little-endian u32 version, then 8-byte entries {u16 tag, u16 perm, u32 id}.
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// An xattr to set: name and value.
type Xattr = (&'static [u8], Vec<u8>);
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

/// The entries (tag, perm) of an access ACL in xattr form; None if malformed.
fn acl_entries(value: &[u8]) -> Option<Vec<(usize, u16, u16)>> {
    let body = value.get(4..)?;
    if body.len() % 8 != 0 {
        return None;
    }
    Some(
        body.chunks_exact(8)
            .enumerate()
            .map(|(n, e)| {
                (
                    4 + n * 8,
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                )
            })
            .collect(),
    )
}

/// The permission bits an access ACL gives the file (owner from USER_OBJ, group
/// from MASK if there is one, else GROUP_OBJ, other from OTHER), and whether the
/// ACL says no more than those bits (only the three base entries): then the kernel
/// keeps no ACL at all, only the mode (posix_acl_update_mode).
fn acl_mode(value: &[u8]) -> Option<(u32, bool)> {
    let (mut u, mut g, mut m, mut o) = (None, None, None, None);
    let mut named = false;
    for (_, tag, perm) in acl_entries(value)? {
        let p = Some(u32::from(perm) & 0o7);
        match tag {
            ACL_USER_OBJ => u = p,
            ACL_GROUP_OBJ => g = p,
            ACL_MASK => m = p,
            ACL_OTHER => o = p,
            ACL_USER | ACL_GROUP => named = true,
            _ => return None,
        }
    }
    let (u, g, o) = (u?, m.or(g)?, o?);
    Some((u << 6 | g << 3 | o, m.is_none() && !named))
}

/// An access ACL after chmod to `mode` (posix_acl_chmod): USER_OBJ, MASK (or
/// GROUP_OBJ without a mask) and OTHER take the new permission bits.
fn acl_chmod(value: &[u8], mode: u32) -> Option<Vec<u8>> {
    let entries = acl_entries(value)?;
    let has_mask = entries.iter().any(|e| e.1 == ACL_MASK);
    let mut out = value.to_vec();
    for (at, tag, _) in entries {
        let bits = match tag {
            ACL_USER_OBJ => mode >> 6,
            ACL_MASK => mode >> 3,
            ACL_GROUP_OBJ if !has_mask => mode >> 3,
            ACL_OTHER => mode,
            _ => continue,
        };
        out[at + 2..at + 4].copy_from_slice(&((bits & 0o7) as u16).to_le_bytes());
    }
    Some(out)
}

/// A new inode's access ACL and mode from its directory's default ACL
/// (posix_acl_create): the default ACL's owner, other and mask (or group) entries
/// limited by the mode asked for, and the mode limited by them. The ACL is None
/// when it says no more than the mode.
fn acl_create(default: &[u8], mode: u32) -> Option<(Option<Vec<u8>>, u32)> {
    let mut acl = default.to_vec();
    let mut m = mode & 0o777;
    let mut equiv = true;
    let mut group = None;
    let set = |acl: &mut Vec<u8>, at: usize, p: u32| {
        acl[at + 2..at + 4].copy_from_slice(&(p as u16).to_le_bytes());
    };
    for (at, tag, perm) in acl_entries(default)? {
        let p = u32::from(perm) & 0o7;
        match tag {
            ACL_USER_OBJ => {
                let p = p & (m >> 6);
                set(&mut acl, at, p);
                m = (m & !0o700) | p << 6;
            }
            ACL_OTHER => {
                let p = p & m & 0o7;
                set(&mut acl, at, p);
                m = (m & !0o7) | p;
            }
            ACL_GROUP_OBJ if group.is_none() => group = Some((at, p)),
            ACL_GROUP_OBJ => {}
            ACL_MASK => {
                group = Some((at, p));
                equiv = false;
            }
            ACL_USER | ACL_GROUP => equiv = false,
            _ => return None,
        }
    }
    let (at, p) = group?;
    let p = p & (m >> 3) & 0o7;
    set(&mut acl, at, p);
    m = (m & !0o70) | p << 3;
    Some(((!equiv).then_some(acl), (mode & !0o777) | m))
}

/// A name from a request: ENAMETOOLONG past btrfs' 255 bytes, as the kernel answers.
fn name<'a>(a: &mut Args<'a>) -> Result<&'a [u8], i32> {
    let n = a.cstr().ok_or(errno::EINVAL)?;
    if n.len() > NAME_MAX {
        return Err(errno::ENAMETOOLONG);
    }
    Ok(n)
}

/// A missing xattr is ENODATA, not ENOENT.
fn xattr_errno(e: i32) -> i32 {
    if e == errno::ENOENT {
        errno::ENODATA
    } else {
        e
    }
}

/// The FUSE device number (the kernel's `new_encode_dev`) as btrfs stores it in the
/// inode item (the kernel's MKDEV: major << 20 | minor).
fn rdev_from_fuse(rdev: u32) -> u64 {
    let major = (rdev >> 8) & 0xfff;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    (u64::from(major) << 20) | u64::from(minor)
}

impl Ops {
    /// Answers a request that changes the filesystem.
    pub(crate) fn write_op(&self, w: &Writer, h: &InHeader, body: &[u8], reply: Reply<'_>) {
        let a = Args::new(body);
        let r = match h.opcode {
            op::MKNOD => self.mknod(w, h, a, false),
            op::MKDIR => self.mknod(w, h, a, true),
            op::CREATE => return self.create(w, h, a, reply),
            op::SYMLINK => self.symlink(w, h, a),
            op::LINK => self.link(w, h, a),
            op::UNLINK | op::RMDIR => self.remove(w, h, a, h.opcode == op::RMDIR),
            op::RENAME => self.rename(w, h, a, false),
            op::RENAME2 => self.rename(w, h, a, true),
            op::WRITE => self.write(w, h, a),
            op::SETATTR => self.setattr(w, h, a),
            op::SETXATTR => self.setxattr(w, h, a),
            op::REMOVEXATTR => self.removexattr(w, h, a),
            op::FALLOCATE => self.fallocate(w, h, a),
            // Not yet: the kernel falls back to reading and writing for
            // copy_file_range, and O_TMPFILE gets errno::EOPNOTSUPP.
            op::COPY_FILE_RANGE => Err(errno::ENOSYS),
            op::TMPFILE => Err(errno::EOPNOTSUPP),
            _ => Err(errno::ENOSYS),
        };
        match r {
            Ok(body) => reply.ok(&body),
            Err(e) => reply.error(e),
        }
    }

    /// The inode a request changes, which must be a real one (not the empty,
    /// read-only placeholder of a subvolume seen inside a snapshot).
    fn changeable(&self, nodeid: u64) -> Result<Node, i32> {
        let n = self.node_key(nodeid)?.node;
        if n.is_placeholder() {
            return Err(errno::EPERM);
        }
        Ok(n)
    }

    /// Owner and group of a new inode: the caller's, or the directory's group when
    /// it is setgid (directories then inherit setgid), as the kernel's inode_init_owner.
    /// Its permissions and ACLs as posix_acl_create gives them: with a default ACL
    /// on the directory, the mode limited by it (the umask is not used), an access
    /// ACL unless the mode says it all, and for a directory the default ACL again;
    /// without one, the mode less the umask. (The server applies the umask: it asks
    /// for DONT_MASK at INIT, because the kernel cannot know about default ACLs.)
    /// Returns the xattrs to set on the new inode, too.
    fn new_inode(
        &self,
        w: &Writer,
        h: &InHeader,
        dir: Node,
        mode: u32,
        umask: u32,
    ) -> Result<(NewInode, Vec<Xattr>), i32> {
        let parent = w.read(|fs| fs.stat(dir)).map_err(|e| e.errno())?;
        let mut xattrs = Vec::new();
        let mut mode = mode;
        if mode & S_IFMT != S_IFLNK {
            let default = w
                .read(|fs| fs.getxattr(dir, ACL_DEFAULT))
                .map_err(|e| e.errno())?;
            match default
                .as_deref()
                .and_then(|d| acl_create(d, mode).map(|r| (d, r)))
            {
                Some((d, (access, m))) => {
                    mode = m;
                    if let Some(a) = access {
                        xattrs.push((ACL_ACCESS, a));
                    }
                    if mode & S_IFMT == S_IFDIR {
                        xattrs.push((ACL_DEFAULT, d.to_vec()));
                    }
                }
                None => mode &= !(umask & 0o777),
            }
        }
        let mut gid = h.gid;
        if parent.mode & S_ISGID != 0 {
            gid = parent.gid;
            if mode & S_IFMT == S_IFDIR {
                mode |= S_ISGID;
            }
        }
        let attr = NewInode {
            mode,
            uid: h.uid,
            gid,
            rdev: 0,
            time: now(),
        };
        Ok((attr, xattrs))
    }

    /// An entry reply for `node`, found as `name` in the directory `parent`.
    fn entry(&self, w: &Writer, parent: u64, node: Node, name: &[u8]) -> Result<Vec<u8>, i32> {
        let st = w.read(|fs| fs.stat(node)).map_err(|e| e.errno())?;
        let attr = self.attr_of(node, &st);
        let id = self.node_ids().intern(NodeKey::new(node, 0), parent, name);
        let mut o = Out::with_capacity(abi::ENTRY_OUT_SIZE);
        abi::encode_entry(&mut o, id, 0, self.ttl(), &attr);
        Ok(o.buf)
    }

    fn mknod(&self, w: &Writer, h: &InHeader, mut a: Args<'_>, dir: bool) -> Result<Vec<u8>, i32> {
        let (mode, rdev, umask) = if dir {
            let mode = a.u32().ok_or(errno::EINVAL)?;
            let umask = a.u32().ok_or(errno::EINVAL)?;
            (mode & 0o7777 | S_IFDIR, 0, umask)
        } else {
            let mode = a.u32().ok_or(errno::EINVAL)?;
            let rdev = a.u32().ok_or(errno::EINVAL)?;
            let umask = a.u32().ok_or(errno::EINVAL)?;
            a.skip(4).ok_or(errno::EINVAL)?; // padding
            (mode, rdev_from_fuse(rdev), umask)
        };
        let name = name(&mut a)?;
        let parent = self.changeable(h.nodeid)?;
        let (mut attr, xattrs) = self.new_inode(w, h, parent, mode, umask)?;
        attr.rdev = rdev;
        let ino = w.change("mknod", |t| {
            let ino = t.create(parent.root, parent.ino, name, attr)?;
            for (n, v) in &xattrs {
                t.set_xattr(parent.root, ino, n, v, attr.time)?;
            }
            Ok(ino)
        })?;
        self.entry(w, h.nodeid, Node::new(parent.root, ino), name)
    }

    fn create(&self, w: &Writer, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let r = (|| {
            let _flags = a.u32().ok_or(errno::EINVAL)?;
            let mode = a.u32().ok_or(errno::EINVAL)?;
            let umask = a.u32().ok_or(errno::EINVAL)?;
            a.skip(4).ok_or(errno::EINVAL)?; // open_flags
            let name = name(&mut a)?;
            let parent = self.changeable(h.nodeid)?;
            let (attr, xattrs) = self.new_inode(w, h, parent, mode, umask)?;
            let ino = w.change("create", |t| {
                let ino = t.create(parent.root, parent.ino, name, attr)?;
                for (n, v) in &xattrs {
                    t.set_xattr(parent.root, ino, n, v, attr.time)?;
                }
                Ok(ino)
            })?;
            let node = Node::new(parent.root, ino);
            let mut body = self.entry(w, h.nodeid, node, name)?;
            let fh = self.register_open(h.nodeid, node)?;
            let mut o = Out::with_capacity(16);
            o.u64(fh).u32(abi::FOPEN_KEEP_CACHE).u32(0);
            body.extend_from_slice(&o.buf);
            Ok(body)
        })();
        match r {
            Ok(b) => reply.ok(&b),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let name = name(&mut a)?;
        let target = a.cstr().ok_or(errno::EINVAL)?;
        let parent = self.changeable(h.nodeid)?;
        let (attr, _) = self.new_inode(w, h, parent, S_IFLNK | 0o777, 0)?;
        let ino = w.change("symlink", |t| {
            t.symlink(parent.root, parent.ino, name, target, attr)
        })?;
        self.entry(w, h.nodeid, Node::new(parent.root, ino), name)
    }

    fn link(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let old = a.u64().ok_or(errno::EINVAL)?;
        let name = name(&mut a)?;
        let node = self.node_key(old)?.node;
        let parent = self.changeable(h.nodeid)?;
        if node.root != parent.root {
            return Err(errno::EXDEV);
        }
        w.change("link", |t| {
            t.link(parent.root, node.ino, parent.ino, name, now())
        })?;
        self.entry(w, h.nodeid, node, name)
    }

    fn remove(&self, w: &Writer, h: &InHeader, mut a: Args<'_>, dir: bool) -> Result<Vec<u8>, i32> {
        let name = name(&mut a)?;
        let parent = self.changeable(h.nodeid)?;
        let t0 = now();
        if dir {
            w.change("rmdir", |t| t.rmdir(parent.root, parent.ino, name, t0))?;
        } else {
            w.change("unlink", |t| t.unlink(parent.root, parent.ino, name, t0))?;
        }
        Ok(Vec::new())
    }

    fn rename(&self, w: &Writer, h: &InHeader, mut a: Args<'_>, v2: bool) -> Result<Vec<u8>, i32> {
        let newdir = a.u64().ok_or(errno::EINVAL)?;
        let flags = if v2 {
            let f = a.u32().ok_or(errno::EINVAL)?;
            a.u32().ok_or(errno::EINVAL)?;
            f
        } else {
            0
        };
        let oname = name(&mut a)?;
        let nname = name(&mut a)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            // RENAME_WHITEOUT, as on btrfs without overlayfs support here.
            return Err(errno::EINVAL);
        }
        let od = self.changeable(h.nodeid)?;
        let nd = self.changeable(newdir)?;
        if od.root != nd.root {
            return Err(errno::EXDEV);
        }
        let t0 = now();
        if flags & RENAME_EXCHANGE != 0 {
            w.change("rename", |t| {
                t.rename_exchange(od.root, od.ino, oname, nd.ino, nname, t0)
            })?;
        } else {
            let noreplace = flags & RENAME_NOREPLACE != 0;
            w.change("rename", |t| {
                t.rename(od.root, od.ino, oname, nd.ino, nname, noreplace, t0)
            })?;
        }
        Ok(Vec::new())
    }

    fn write(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let _fh = a.u64().ok_or(errno::EINVAL)?;
        let offset = a.u64().ok_or(errno::EINVAL)?;
        let size = a.u32().ok_or(errno::EINVAL)?;
        a.skip(4 + 8 + 4 + 4).ok_or(errno::EINVAL)?; // write_flags, lock_owner, flags, padding
        let data = a.rest();
        let data = data.get(..size as usize).ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        w.change("write", |t| {
            t.write(node.root, node.ino, offset, data, now())
        })?;
        let mut o = Out::with_capacity(8);
        o.u32(size).u32(0);
        Ok(o.buf)
    }

    fn setattr(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let valid = a.u32().ok_or(errno::EINVAL)?;
        a.skip(4 + 8).ok_or(errno::EINVAL)?; // padding, fh
        let size = a.u64().ok_or(errno::EINVAL)?;
        a.skip(8).ok_or(errno::EINVAL)?; // lock_owner
        let atime = a.u64().ok_or(errno::EINVAL)?;
        let mtime = a.u64().ok_or(errno::EINVAL)?;
        let ctime = a.u64().ok_or(errno::EINVAL)?;
        let atimensec = a.u32().ok_or(errno::EINVAL)?;
        let mtimensec = a.u32().ok_or(errno::EINVAL)?;
        let ctimensec = a.u32().ok_or(errno::EINVAL)?;
        let mode = a.u32().ok_or(errno::EINVAL)?;
        a.skip(4).ok_or(errno::EINVAL)?;
        let uid = a.u32().ok_or(errno::EINVAL)?;
        let gid = a.u32().ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        let at = |s: u64, ns: u32| Timespec {
            sec: s as i64,
            nsec: ns,
        };
        // The kernel may hand over ctime too (FATTR_CTIME), as with a writeback cache.
        let t0 = if valid & FATTR_CTIME != 0 {
            at(ctime, ctimensec)
        } else {
            now()
        };
        let atime = if valid & FATTR_ATIME_NOW != 0 {
            Some(t0)
        } else {
            (valid & FATTR_ATIME != 0).then(|| at(atime, atimensec))
        };
        let mtime = if valid & FATTR_MTIME_NOW != 0 {
            Some(t0)
        } else {
            (valid & FATTR_MTIME != 0).then(|| at(mtime, mtimensec))
        };
        let mode = (valid & FATTR_MODE != 0).then_some(mode);
        let uid = (valid & FATTR_UID != 0).then_some(uid);
        let gid = (valid & FATTR_GID != 0).then_some(gid);
        w.change("setattr", |t| {
            if valid & FATTR_SIZE != 0 {
                let i = t.read_inode(node.root, node.ino)?;
                if i.mode & S_IFMT == S_IFDIR {
                    return Err(Error::IsDir(format!("inode {}", node.ino)));
                }
                t.truncate(node.root, node.ino, size, t0)?;
            }
            if mode.is_some()
                || uid.is_some()
                || gid.is_some()
                || atime.is_some()
                || mtime.is_some()
            {
                t.setattr(node.root, node.ino, mode, uid, gid, atime, mtime, t0)?;
            }
            // chmod also rewrites the access ACL's owner, mask (or group) and other
            // entries (btrfs_setattr's posix_acl_chmod): with POSIX_ACL the kernel
            // leaves that to us.
            if let Some(m) = mode {
                if let Some(acl) = t.fs.getxattr(node, ACL_ACCESS)? {
                    if let Some(new) = acl_chmod(&acl, m) {
                        if new != acl {
                            t.set_xattr(node.root, node.ino, ACL_ACCESS, &new, t0)?;
                        }
                    }
                }
            }
            Ok(())
        })?;
        let st = w.read(|fs| fs.stat(node)).map_err(|e| e.errno())?;
        let attr = self.attr_of(node, &st);
        let (s, ns) = abi::ttl_parts(self.ttl());
        let mut o = Out::with_capacity(16 + abi::ATTR_SIZE);
        o.u64(s).u32(ns).u32(0);
        attr.encode(&mut o);
        Ok(o.buf)
    }

    fn setxattr(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let size = a.u32().ok_or(errno::EINVAL)?;
        let flags = a.u32().ok_or(errno::EINVAL)?;
        let name = a.cstr().ok_or(errno::EINVAL)?;
        let value = a.rest().get(..size as usize).ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        w.change("setxattr", |t| {
            if flags & (XATTR_CREATE | XATTR_REPLACE) != 0 {
                let have = t.fs.getxattr(node, name)?.is_some();
                if flags & XATTR_CREATE != 0 && have {
                    return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
                }
                if flags & XATTR_REPLACE != 0 && !have {
                    return Err(Error::NotFound(String::from_utf8_lossy(name).into_owned()));
                }
            }
            let t0 = now();
            // With POSIX_ACL the kernel leaves what btrfs_set_acl does to us: an
            // access ACL sets the mode's permission bits, and one that says no more
            // than the mode is not stored (the kernel's posix_acl_update_mode), as
            // on a kernel btrfs mount (cp -a, setfacl --set u::rwx,g::r-x,o::r-x).
            if name == ACL_ACCESS {
                if let Some((bits, equiv)) = acl_mode(value) {
                    let i = t.read_inode(node.root, node.ino)?;
                    let mode = (i.mode & 0o7000) | bits;
                    if equiv {
                        if t.fs.getxattr(node, name)?.is_some() {
                            t.remove_xattr(node.root, node.ino, name, t0)?;
                        }
                    } else {
                        t.set_xattr(node.root, node.ino, name, value, t0)?;
                    }
                    return t.setattr(node.root, node.ino, Some(mode), None, None, None, None, t0);
                }
            }
            t.set_xattr(node.root, node.ino, name, value, t0)
        })
        .map_err(xattr_errno)?;
        Ok(Vec::new())
    }

    fn removexattr(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let name = a.cstr().ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        w.change("removexattr", |t| {
            t.remove_xattr(node.root, node.ino, name, now())
        })
        .map_err(xattr_errno)?;
        Ok(Vec::new())
    }

    fn fallocate(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let _fh = a.u64().ok_or(errno::EINVAL)?;
        let offset = a.u64().ok_or(errno::EINVAL)?;
        let len = a.u64().ok_or(errno::EINVAL)?;
        let mode = a.u32().ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        let t0 = now();
        match mode & !FALLOC_FL_KEEP_SIZE {
            0 => w
                .change("fallocate", |t| {
                    t.fallocate(node.root, node.ino, offset, len, keep, t0)
                })
                .map(|_| ()),
            FALLOC_FL_PUNCH_HOLE if keep => w.change("punch hole", |t| {
                t.punch_hole(node.root, node.ino, offset, len, t0)
            }),
            FALLOC_FL_ZERO_RANGE => w.change("zero range", |t| {
                t.zero_range(node.root, node.ino, offset, len, keep, t0)
            }),
            _ => Err(errno::EOPNOTSUPP),
        }?;
        Ok(Vec::new())
    }

    /// fsync, fsyncdir, syncfs: durable when answered (a commit; the tree log comes
    /// later).
    pub(crate) fn sync(&self, w: &Writer, reply: Reply<'_>) {
        match w.commit() {
            Ok(()) => reply.ok(&[]),
            Err(e) => reply.error(e),
        }
    }

    /// A new open file handle for `node` (CREATE).
    fn register_open(&self, nodeid: u64, node: Node) -> Result<u64, i32> {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let inode = self
            .engine
            .read(|fs| fs.inode_item(node))
            .map_err(|e| e.errno())?;
        self.insert_open(fh, nodeid, node, inode);
        Ok(fh)
    }
}
