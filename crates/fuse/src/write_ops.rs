//! Requests that change the filesystem, on a read-write mount: each is one change to
//! the running transaction ([`Writer::change`]), answered with the kernel's errno
//! values. Permission checks are the kernel's own (the mount uses
//! `default_permissions`), as on a kernel btrfs mount.

use crate::abi::{self, op, Args, InHeader, Out};
use crate::acl;
use crate::channel::Channel;
use crate::killpriv::{killed_mode, Cause};
use crate::nodes::NodeKey;
use crate::ops::{errno, Ops, NAME_MAX};
use crate::reply::{inval_data_later, inval_inode};
use crate::reply::{AttrsCheck, Reply, RingAnswer};
use crate::writer::Writer;
use crate::writer::DEFAULT_ITEMS;
use std::sync::atomic::Ordering;
use ubtrfs_core::format::consts::{INODE_APPEND, INODE_DIRSYNC, INODE_IMMUTABLE, INODE_SYNC};
use ubtrfs_core::format::items::{InodeItem, Timespec};
use ubtrfs_core::fsflags::{FS_APPEND_FL, FS_IMMUTABLE_FL};
use ubtrfs_core::mode::{S_IFDIR, S_IFLNK, S_IFMT};
use ubtrfs_core::{
    inode_flags_to_fsflags, now, Error, FilePos, NewInode, Node, Reservation, Trans,
};

const S_ISGID: u32 = 0o2000;

/// Tree items a new inode adds, as the kernel's btrfs_new_inode_prepare counts them
/// for its transaction (the inode item with its ref, the dir item, the dir index,
/// the parent's inode item): charged to quotas at a node each.
const NEW_INODE_ITEMS: u64 = 4;
/// Items charged for a rename (two names out and two in, the inodes, the parents).
const RENAME_ITEMS: u64 = 11;

// fuse_setattr_in.valid
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_FH: u32 = 1 << 6;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
const FATTR_CTIME: u32 = 1 << 10;
const FATTR_KILL_SUIDGID: u32 = 1 << 11;

// fuse_write_in.write_flags
const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// The (offset, length) of a write-back from the page cache that failed.
type FailedWriteBack = Option<(u64, u64)>;

/// WRITE flag: the data comes from the page cache (delayed write-back of a shared
/// mmap; this mount keeps no writeback cache for write(2)).
const FUSE_WRITE_CACHE: u32 = 1;

// fallocate(2) modes
const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

// renameat2(2) flags
const RENAME_NOREPLACE: u32 = 1;
const RENAME_EXCHANGE: u32 = 2;
/// renameat2's RENAME_WHITEOUT: the old name becomes a whiteout (a character
/// device 0:0 with no permission bits), in the same change, as btrfs does for
/// overlayfs's upper layer.
const RENAME_WHITEOUT: u32 = 4;

// setxattr(2) flags
const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;
// fuse_setxattr_in.setxattr_flags (FUSE_SETXATTR_EXT)
const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// A name from a request: ENAMETOOLONG past btrfs' 255 bytes, as the kernel answers.
fn name<'a>(a: &mut Args<'a>) -> Result<&'a [u8], i32> {
    let n = a.cstr().ok_or(errno::EINVAL)?;
    if n.len() > NAME_MAX {
        return Err(errno::ENAMETOOLONG);
    }
    Ok(n)
}

// open(2) flags
const O_ACCMODE: u32 = 0o3;
const O_TRUNC: u32 = 0o1000;
const O_APPEND: u32 = 0o2000;

/// Immutable or append-only: no changes to the inode itself (EPERM).
const NO_CHANGE: u64 = INODE_IMMUTABLE | INODE_APPEND;

/// The VFS's may_open for a file with these inode flags: no writer of an immutable
/// file, and only appending writers (no O_TRUNC) of an append-only one.
pub(crate) fn may_open(iflags: u64, open_flags: u32) -> Result<(), i32> {
    let writes = open_flags & O_ACCMODE != 0;
    if iflags & INODE_IMMUTABLE != 0 && (writes || open_flags & O_TRUNC != 0) {
        return Err(errno::EPERM);
    }
    if iflags & INODE_APPEND != 0
        && ((writes && open_flags & O_APPEND == 0) || open_flags & O_TRUNC != 0)
    {
        return Err(errno::EPERM);
    }
    Ok(())
}

/// EPERM if any of `bits` is set in `flags`.
fn refuse(flags: u64, bits: u64) -> Result<(), i32> {
    if flags & bits != 0 {
        Err(errno::EPERM)
    } else {
        Ok(())
    }
}

/// The ACLs a new inode inherits from its directory's default ACL.
#[derive(Default)]
struct Inherited {
    /// Its access ACL, when the mode cannot say it all.
    access: Option<Vec<u8>>,
    /// A directory's own default ACL.
    default: Option<Vec<u8>>,
}

impl Inherited {
    /// Stores them on the new inode, in the transaction that creates it.
    fn store(&self, t: &mut ubtrfs_core::Trans, root: u64, ino: u64) -> ubtrfs_core::Result<()> {
        let t0 = now();
        if let Some(a) = &self.access {
            t.set_xattr(root, ino, acl::ACCESS, a, t0)?;
        }
        if let Some(d) = &self.default {
            t.set_xattr(root, ino, acl::DEFAULT, d, t0)?;
        }
        Ok(())
    }
}

/// A change that may clear setuid/setgid: who asks, for which inode, and why.
#[derive(Clone, Copy)]
struct Killing<'a> {
    h: &'a InHeader,
    ch: &'a Channel,
    /// The kernel's name for the inode (to drop its cached mode).
    nodeid: u64,
    node: Node,
    cause: Cause,
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

/// What [`Ops::accessed`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Accessed {
    /// No change begun (the rule wanted no new atime, or the mount is read-only).
    Untouched,
    /// A change begun, which found atime current under the lock.
    Checked,
    /// atime was set.
    Updated,
}

impl Accessed {
    /// Changes the access began (see [`Ops::attrs_sent`]).
    pub(crate) fn changes(self) -> u64 {
        u64::from(self != Accessed::Untouched)
    }
}

impl Ops {
    /// Answers a request that changes the filesystem.
    pub(crate) fn write_op(&self, w: &Writer, h: &InHeader, body: &[u8], reply: Reply<'_>) {
        let a = Args::new(body);
        let r = match h.opcode {
            op::MKNOD => self.mknod(w, h, a, false),
            op::MKDIR => self.mknod(w, h, a, true),
            op::CREATE => return self.create(w, h, a, reply, false),
            op::SYMLINK => self.symlink(w, h, a),
            // Answers with the attributes of an inode others may change meanwhile
            // (a new inode's cannot be: nobody else has its name yet).
            op::LINK | op::SETATTR => {
                let r = if h.opcode == op::LINK {
                    self.link(w, h, a)
                } else {
                    self.setattr(w, h, a)
                };
                return match r {
                    Ok((body, seq, id)) => self.reply_attrs(reply, &body, seq, 0, &[id]),
                    Err(e) => reply.error(e),
                };
            }
            op::UNLINK | op::RMDIR => self.remove(w, h, a, h.opcode == op::RMDIR),
            op::RENAME => self.rename(w, h, a, false),
            op::RENAME2 => self.rename(w, h, a, true),
            op::WRITE => {
                let ch = reply.channel();
                return match self.write(w, h, a, ch) {
                    Ok(body) => reply.ok(&body),
                    Err((e, failed_write_back)) => {
                        reply.error(e);
                        // The pages stay in the kernel's cache, clean, showing data
                        // the filesystem does not have (the program that stored
                        // them learns of it at msync or fsync): drop them, so that
                        // reads show what is on disk.
                        if let Some((offset, len)) = failed_write_back {
                            inval_data_later(ch, h.nodeid, offset, len);
                        }
                    }
                };
            }
            op::SETXATTR => self.setxattr(w, h, a),
            op::REMOVEXATTR => self.removexattr(w, h, a),
            op::FALLOCATE => self.fallocate(w, h, a, reply.channel()),
            op::COPY_FILE_RANGE => self.copy_file_range(w, h, a, reply.channel()),
            op::TMPFILE => return self.create(w, h, a, reply, true),
            _ => Err(errno::ENOSYS),
        };
        match r {
            Ok(body) => reply.ok(&body),
            Err(e) => reply.error(e),
        }
    }

    /// The btrfs inode flags of `node` (immutable, append-only, sync, ...): the
    /// kernel keeps them in the VFS inode; here they are read with each change.
    fn iflags(&self, w: &Writer, node: Node) -> Result<u64, i32> {
        self.inode_item(w, node).map(|i| i.flags)
    }

    fn inode_item(&self, w: &Writer, node: Node) -> Result<InodeItem, i32> {
        // Flags and mode do not depend on data waiting for extents: flush nothing.
        w.read_flushing(None, |fs| fs.inode_item(node))
            .map_err(|e| e.errno())
    }

    /// Clears setuid/setgid of `nodeid` (inode item `i`) as the VFS does for this
    /// change (module `killpriv`), in a change of its own before the data change.
    /// The kernel keeps the old mode cached (it refreshes only size and times after
    /// a write or fallocate), so it is told to drop it before the answer goes out.
    fn kill_suidgid(&self, w: &Writer, k: Killing<'_>, i: &InodeItem) -> Result<(), i32> {
        let node = k.node;
        if let Some(mode) = killed_mode(i.mode, i.gid, k.cause, k.h) {
            w.change("clear setuid/setgid", |t| {
                t.setattr(
                    node.root,
                    node.ino,
                    Some(mode),
                    None,
                    None,
                    None,
                    None,
                    now(),
                )
            })?;
            inval_inode(k.ch, k.nodeid, -1);
        }
        Ok(())
    }

    /// fallocate and copy_file_range: the kernel leaves the clearing to the server
    /// when it took FUSE_HANDLE_KILLPRIV_V2 (otherwise it has done it already).
    fn kill_suidgid_unmarked(&self, w: &Writer, k: Killing<'_>) -> Result<(), i32> {
        if !self.killpriv.load(Ordering::Relaxed) {
            return Ok(());
        }
        let i = self.inode_item(w, k.node)?;
        self.kill_suidgid(w, k, &i)
    }

    /// The flags of the inode `name` names in `dir`, if it exists.
    fn child_iflags(&self, w: &Writer, dir: Node, name: &[u8]) -> Result<Option<u64>, i32> {
        let e = w.read(|fs| fs.lookup(dir, name)).map_err(|e| e.errno())?;
        match e {
            Some(e) if !e.node.is_placeholder() => self.iflags(w, e.node).map(Some),
            _ => Ok(None),
        }
    }

    /// A directory change in `dir` is made durable at once when the directory is
    /// `S` or `D` (IS_DIRSYNC), a file change when the file is `S` (IS_SYNC).
    fn sync_if(&self, w: &Writer, flags: u64, bits: u64) -> Result<(), i32> {
        if flags & bits != 0 {
            w.commit()?;
        }
        Ok(())
    }

    /// FS_IOC_SETFLAGS / FS_IOC_FSSETXATTR (chattr). The VFS has already refused
    /// callers that neither own the inode nor are root, and changes of `i` or `a`
    /// without CAP_LINUX_IMMUTABLE; the same rules are applied here by uid.
    pub(crate) fn setflags(
        &self,
        w: &Writer,
        h: &InHeader,
        node: Node,
        cmd: u32,
        input: &[u8],
    ) -> Result<(), i32> {
        let st = w.read(|fs| fs.stat(node)).map_err(|e| e.errno())?;
        if h.uid != 0 && h.uid != st.uid {
            return Err(errno::EPERM);
        }
        let word = |i: usize| -> Result<u32, i32> {
            input
                .get(i..i + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
                .ok_or(errno::EINVAL)
        };
        let old = inode_flags_to_fsflags(st.flags);
        let t0 = now();
        if cmd == crate::ops::FS_IOC_FSSETXATTR {
            let fsx = ubtrfs_core::FsXattr {
                xflags: word(0)?,
                extsize: word(4)?,
                projid: word(12)?,
                cowextsize: word(16)?,
            };
            let new = ubtrfs_core::xflags_to_fsflags(fsx.xflags);
            if h.uid != 0 && (new ^ old) & (FS_APPEND_FL | FS_IMMUTABLE_FL) != 0 {
                return Err(errno::EPERM);
            }
            w.change("fssetxattr", |t| {
                t.fileattr_set_xflags(node.root, node.ino, &fsx, t0)
            })?;
        } else {
            let new = word(0)?;
            if h.uid != 0 && (new ^ old) & (FS_APPEND_FL | FS_IMMUTABLE_FL) != 0 {
                return Err(errno::EPERM);
            }
            w.change("setflags", |t| t.fileattr_set(node.root, node.ino, new, t0))?;
        }
        self.sync_if(w, st.flags, INODE_SYNC)
    }

    /// After a read or a listing of `node` (whose inode item was `inode`): a new
    /// atime when the mount's rule asks for one (module `atime`). Best effort, as
    /// the kernel's touch_atime: without space, or on an aborted mount, atime stays.
    /// When atime changed, the kernel is told to drop the attributes it holds for
    /// `nodeid` (through `ch`). Its own mark after a read (fuse_invalidate_atime) is
    /// not enough: the mark does not outdate an attribute reply already on its way
    /// (one built before the update would be taken and kept for the whole cache
    /// time), and a mount remounted read-only but not yet told so sets no mark at
    /// all. Attributes only (offset -1): no lock a reader holds is taken, so it may
    /// go before the answer.
    pub(crate) fn accessed(
        &self,
        ch: &Channel,
        nodeid: u64,
        node: Node,
        inode: &InodeItem,
        is_dir: bool,
    ) -> Accessed {
        let crate::writer::Engine::ReadWrite(w) = &self.engine else {
            return Accessed::Untouched;
        };
        if !self.atime_applies(node) || !self.atime.needs_update(inode, is_dir, now()) {
            return Accessed::Untouched;
        }
        let r = w.change_inode_only("atime", |t| {
            // Again under the lock, and the time taken there: another reader may
            // have just done it, and atime must not go back.
            let i = t.read_inode(node.root, node.ino)?;
            let t1 = now();
            if self.atime.needs_update(&i, is_dir, t1) {
                t.set_atime(node.root, node.ino, t1)?;
                return Ok(true);
            }
            Ok(false)
        });
        match r {
            Ok(true) => {
                inval_inode(ch, nodeid, -1);
                Accessed::Updated
            }
            _ => Accessed::Checked,
        }
    }

    /// The count of changes begun so far ([`Writer::change_seq`]; 0 read-only).
    pub(crate) fn change_seq(&self) -> u64 {
        match &self.engine {
            crate::writer::Engine::ReadWrite(w) => w.change_seq(),
            _ => 0,
        }
    }

    /// Answers `body`, which carries the attributes of nodes `ids`, read when the
    /// change count was `seq` (and `own` changes since were the request's own, which changed
    /// none of those attributes): if another change began meanwhile, the kernel is
    /// told to drop what it holds for them. A change the kernel saw happen (a create
    /// in a directory, an unlink of one of a file's names) only marks its cached
    /// attributes stale; that mark does not outdate a reply of ours built before the
    /// change and arriving after, which the kernel would take and keep for the whole
    /// cache time (24 h). The notification does outdate it (it raises the inode's
    /// attr_version). Concurrent requests only: alone, the count does not move.
    ///
    /// The count must be compared once the answer has reached the kernel
    /// ([`Ops::attrs_sent`]): a /dev/fuse answer has when `reply.ok` returns; a ring
    /// answer only when its thread commits it, so the check is kept for then.
    pub(crate) fn reply_attrs(
        &self,
        reply: Reply<'_>,
        body: &[u8],
        seq: u64,
        own: u64,
        ids: &[u64],
    ) {
        let (ch, ring) = (reply.channel(), reply.ring());
        reply.ok(body);
        self.attrs_sent(ch, ring, seq, own, ids);
    }

    /// See [`Ops::reply_attrs`].
    pub(crate) fn attrs_sent(
        &self,
        ch: &Channel,
        ring: Option<&RingAnswer>,
        seq: u64,
        own: u64,
        ids: &[u64],
    ) {
        if let Some(r) = ring {
            if self.change_seq() != 0 {
                r.defer(AttrsCheck {
                    seq,
                    own,
                    ids: ids.to_vec(),
                });
            }
            return;
        }
        if self.change_seq() > seq + own {
            for &id in ids.iter().filter(|&&id| id != 0) {
                inval_inode(ch, id, -1);
            }
        }
    }

    /// The node a change applies to (the inode, or the directory whose entries
    /// change): EROFS in a read-only subvolume (as the kernel's btrfs_permission and
    /// btrfs_setattr answer), EPERM for the empty placeholder of a subvolume inside
    /// a snapshot.
    pub(crate) fn changeable(&self, nodeid: u64) -> Result<Node, i32> {
        let n = self.node_key(nodeid)?.node;
        if self.read_only_subvol(n.root) {
            return Err(errno::EROFS);
        }
        if n.is_placeholder() {
            return Err(errno::EPERM);
        }
        Ok(n)
    }

    /// Owner and group of a new inode: the caller's, or the directory's group when
    /// it is setgid (directories then inherit setgid), as the kernel's inode_init_owner.
    /// Its permissions: the directory's default ACL if it has one (also returned, as
    /// the ACLs to store), else the mode without the `umask` bits (FUSE_DONT_MASK: the
    /// kernel leaves both to us), as the kernel's posix_acl_create.
    fn new_inode(
        &self,
        w: &Writer,
        h: &InHeader,
        dir: Node,
        mode: u32,
        umask: u32,
    ) -> Result<(NewInode, Inherited), i32> {
        let parent = w.read(|fs| fs.stat(dir)).map_err(|e| e.errno())?;
        let mut mode = mode;
        let mut inherited = Inherited::default();
        let default = if mode & S_IFMT == S_IFLNK {
            None
        } else {
            w.read(|fs| fs.getxattr(dir, acl::DEFAULT))
                .map_err(|e| e.errno())?
                .and_then(|v| acl::Acl::parse(&v))
        };
        match default {
            Some(d) => {
                let mut access = d.clone();
                if access.create_masq(&mut mode) {
                    inherited.access = Some(access.encode());
                }
                if mode & S_IFMT == S_IFDIR {
                    inherited.default = Some(d.encode());
                }
            }
            None => mode &= !(umask & 0o777),
        }
        let mut gid = h.gid;
        if parent.mode & S_ISGID != 0 {
            gid = parent.gid;
            if mode & S_IFMT == S_IFDIR {
                mode |= S_ISGID;
            }
        }
        let new = NewInode {
            mode,
            uid: h.uid,
            gid,
            rdev: 0,
            time: now(),
        };
        Ok((new, inherited))
    }

    /// An entry reply for `node`, found as `name` in the directory `parent`.
    fn entry(&self, w: &Writer, parent: u64, node: Node, name: &[u8]) -> Result<Vec<u8>, i32> {
        let st = w.read(|fs| fs.stat(node)).map_err(|e| e.errno())?;
        let attr = self.attr_of(node, &st);
        let id = self.node_ids().intern(NodeKey::new(node, 0), parent, name);
        let mut o = Out::with_capacity(abi::ENTRY_OUT_SIZE);
        let g = crate::ops::entry_generation(id, &st);
        abi::encode_entry(&mut o, id, g, self.ttl(), &attr);
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
        // may_create: nothing new in an immutable directory.
        let pflags = self.iflags(w, parent)?;
        refuse(pflags, INODE_IMMUTABLE)?;
        let (mut attr, acls) = self.new_inode(w, h, parent, mode, umask)?;
        attr.rdev = rdev;
        w.charge_quota(parent.root, NEW_INODE_ITEMS, |_| Ok(0))?;
        let ino = w.change("mknod", |t| {
            let ino = t.create(parent.root, parent.ino, name, attr)?;
            acls.store(t, parent.root, ino)?;
            Ok(ino)
        })?;
        self.sync_if(w, pflags, INODE_SYNC | INODE_DIRSYNC)?;
        self.entry(w, h.nodeid, Node::new(parent.root, ino), name)
    }

    /// CREATE, and TMPFILE (O_TMPFILE: a file without a name, an orphan until
    /// linkat(2) names it; the kernel sends "/" as its name).
    fn create(&self, w: &Writer, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>, tmp: bool) {
        let r = (|| {
            let _flags = a.u32().ok_or(errno::EINVAL)?;
            let mode = a.u32().ok_or(errno::EINVAL)?;
            let umask = a.u32().ok_or(errno::EINVAL)?;
            a.skip(4).ok_or(errno::EINVAL)?; // open_flags
            let name = name(&mut a)?;
            let parent = self.changeable(h.nodeid)?;
            let pflags = self.iflags(w, parent)?;
            refuse(pflags, INODE_IMMUTABLE)?;
            let (attr, acls) = self.new_inode(w, h, parent, mode, umask)?;
            w.charge_quota(parent.root, NEW_INODE_ITEMS, |_| Ok(0))?;
            let ino = w.change(if tmp { "tmpfile" } else { "create" }, |t| {
                let ino = if tmp {
                    t.create_tmpfile(parent.root, parent.ino, attr)?
                } else {
                    t.create(parent.root, parent.ino, name, attr)?
                };
                acls.store(t, parent.root, ino)?;
                Ok(ino)
            })?;
            self.sync_if(w, pflags, INODE_SYNC | INODE_DIRSYNC)?;
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
        let pflags = self.iflags(w, parent)?;
        refuse(pflags, INODE_IMMUTABLE)?;
        let (attr, _) = self.new_inode(w, h, parent, S_IFLNK | 0o777, 0)?;
        // One more item than a create: the inline extent holding the target.
        w.charge_quota(parent.root, NEW_INODE_ITEMS + 1, |_| Ok(0))?;
        let ino = w
            .change("symlink", |t| {
                t.symlink(parent.root, parent.ino, name, target, attr)
            })
            // A target too long for an inline extent: the kernel's btrfs_symlink
            // answers ENAMETOOLONG.
            .map_err(|e| {
                if e == errno::EINVAL {
                    errno::ENAMETOOLONG
                } else {
                    e
                }
            })?;
        self.sync_if(w, pflags, INODE_SYNC | INODE_DIRSYNC)?;
        self.entry(w, h.nodeid, Node::new(parent.root, ino), name)
    }

    /// LINK: the entry, the change count it was read at, and its node id.
    fn link(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<(Vec<u8>, u64, u64), i32> {
        let old = a.u64().ok_or(errno::EINVAL)?;
        let name = name(&mut a)?;
        let node = self.node_key(old)?.node;
        let parent = self.changeable(h.nodeid)?;
        if node.root != parent.root {
            return Err(errno::EXDEV);
        }
        // may_create in the directory; vfs_link: no new names for an immutable or
        // append-only inode.
        let pflags = self.iflags(w, parent)?;
        refuse(pflags, INODE_IMMUTABLE)?;
        refuse(self.iflags(w, node)?, NO_CHANGE)?;
        // btrfs_link: the inode item and its ref, the two dir items, the parent.
        w.charge_quota(parent.root, 5, |_| Ok(0))?;
        w.change("link", |t| {
            t.link(parent.root, node.ino, parent.ino, name, now())
        })?;
        self.sync_if(w, pflags, INODE_SYNC | INODE_DIRSYNC)?;
        let seq = self.change_seq();
        Ok((self.entry(w, h.nodeid, node, name)?, seq, old))
    }

    fn remove(&self, w: &Writer, h: &InHeader, mut a: Args<'_>, dir: bool) -> Result<Vec<u8>, i32> {
        let name = name(&mut a)?;
        let parent = self.changeable(h.nodeid)?;
        // may_delete: nothing leaves an immutable or append-only directory, and an
        // immutable or append-only inode keeps its names.
        let pflags = self.iflags(w, parent)?;
        refuse(pflags, NO_CHANGE)?;
        if let Some(f) = self.child_iflags(w, parent, name)? {
            refuse(f, NO_CHANGE)?;
        }
        if dir {
            // The subvolume this mount shows cannot go (the kernel's EBUSY for a
            // mounted subvolume).
            let target = w
                .read(|fs| fs.lookup(parent, name))
                .map_err(|e| e.errno())?;
            if target
                .is_some_and(|e| e.node.root != parent.root && e.node.root == self.cfg.root.root)
            {
                return Err(errno::EBUSY);
            }
        }
        let t0 = now();
        if dir {
            w.change_reserved("rmdir", Reservation::freeing(DEFAULT_ITEMS), |t| {
                t.rmdir(parent.root, parent.ino, name, t0)
            })?;
        } else {
            w.change_reserved("unlink", Reservation::freeing(DEFAULT_ITEMS), |t| {
                t.unlink(parent.root, parent.ino, name, t0)
            })?;
        }
        self.sync_if(w, pflags, INODE_SYNC | INODE_DIRSYNC)?;
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
        // The VFS refuses the combinations too; a malformed request gets EINVAL.
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || (flags & RENAME_EXCHANGE != 0 && flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0)
        {
            return Err(errno::EINVAL);
        }
        let od = self.changeable(h.nodeid)?;
        let nd = self.changeable(newdir)?;
        if od.root != nd.root {
            return Err(errno::EXDEV);
        }
        // may_delete for the source and an existing target, may_create for a new
        // name (an append-only directory takes new names but gives none up).
        let oflags = self.iflags(w, od)?;
        let nflags = self.iflags(w, nd)?;
        refuse(oflags, NO_CHANGE)?;
        if let Some(f) = self.child_iflags(w, od, oname)? {
            refuse(f, NO_CHANGE)?;
        }
        refuse(nflags, INODE_IMMUTABLE)?;
        if let Some(f) = self.child_iflags(w, nd, nname)? {
            refuse(nflags, INODE_APPEND)?;
            refuse(f, NO_CHANGE)?;
        }
        let t0 = now();
        // btrfs_rename's items (names out and in, refs, the inodes and parents).
        w.charge_quota(nd.root, RENAME_ITEMS, |_| Ok(0))?;
        if flags & RENAME_EXCHANGE != 0 {
            w.change("rename", |t| {
                t.rename_exchange(od.root, od.ino, oname, nd.ino, nname, t0)
            })?;
        } else if flags & RENAME_WHITEOUT != 0 {
            // S_IFCHR, no permission bits. Owned as any new inode of the old directory (btrfs_whiteout_for_rename
            // makes it through the same path as mknod).
            let (mut attr, acls) = self.new_inode(w, h, od, 0o020000, 0)?;
            attr.rdev = 0;
            attr.time = t0;
            let noreplace = flags & RENAME_NOREPLACE != 0;
            let need = Reservation::items(2 * crate::writer::DEFAULT_ITEMS);
            w.change_reserved("rename", need, |t| {
                t.rename(od.root, od.ino, oname, nd.ino, nname, noreplace, t0)?;
                // The rename is done: a whiteout that cannot follow it would leave
                // half the operation, which the kernel answers by aborting the
                // transaction, and so does this (a fatal error: read-only, nothing
                // of it committed).
                t.create(od.root, od.ino, oname, attr)
                    .and_then(|ino| acls.store(t, od.root, ino))
                    .map_err(|e| {
                        ubtrfs_core::Error::corrupt(format!(
                            "rename with whiteout: the whiteout failed after the rename: {e}"
                        ))
                    })
            })?;
        } else {
            let noreplace = flags & RENAME_NOREPLACE != 0;
            w.change("rename", |t| {
                t.rename(od.root, od.ino, oname, nd.ino, nname, noreplace, t0)
            })?;
        }
        // The names now in place, for `..` of moved directories.
        let mut names = vec![(newdir, nd, nname)];
        if flags & RENAME_EXCHANGE != 0 {
            names.push((h.nodeid, od, oname));
        }
        for (dir_id, dir, name) in names {
            if let Ok(Some(e)) = w.read(|fs| fs.lookup(dir, name)) {
                self.node_ids()
                    .moved(NodeKey::new(e.node, e.location), dir_id, name);
            }
        }
        self.sync_if(w, oflags | nflags, INODE_SYNC | INODE_DIRSYNC)?;
        Ok(Vec::new())
    }

    /// WRITE. Its error comes with the range when the data came from the kernel's
    /// page cache (FUSE_WRITE_CACHE: a shared mmap written back) and was not taken.
    fn write(
        &self,
        w: &Writer,
        h: &InHeader,
        mut a: Args<'_>,
        ch: &Channel,
    ) -> Result<Vec<u8>, (i32, FailedWriteBack)> {
        let bad = (errno::EINVAL, None);
        let _fh = a.u64().ok_or(bad)?;
        let offset = a.u64().ok_or(bad)?;
        let size = a.u32().ok_or(bad)?;
        let write_flags = a.u32().ok_or(bad)?;
        a.skip(8 + 4 + 4).ok_or(bad)?; // lock_owner, flags, padding
        let data = a.rest();
        let data = data.get(..size as usize).ok_or(bad)?;
        let page_cache = write_flags & FUSE_WRITE_CACHE != 0;
        let range = page_cache.then_some((offset, size as u64));
        let node = self.changeable(h.nodeid).map_err(|e| (e, range))?;
        // Writers were checked at OPEN; as on the kernel, a file made immutable or
        // append-only while open can still be written through that descriptor.
        let i = self.inode_item(w, node).map_err(|e| (e, range))?;
        let iflags = i.flags;
        if write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
            let k = Killing {
                h,
                ch,
                nodeid: h.nodeid,
                node,
                cause: Cause::Marked,
            };
            self.kill_suidgid(w, k, &i).map_err(|e| (e, range))?;
        }
        let written = w
            .write_data(node.root, node.ino, offset, data, page_cache)
            .map_err(|e| (e, range))?;
        // The data is in; a failed sync after it does not make it unwritten.
        self.sync_if(w, iflags, INODE_SYNC).map_err(|e| (e, None))?;
        let mut o = Out::with_capacity(8);
        o.u32(written as u32).u32(0);
        Ok(o.buf)
    }

    /// SETATTR: the answer, the change count its attributes were read at, and the
    /// node id.
    fn setattr(
        &self,
        w: &Writer,
        h: &InHeader,
        mut a: Args<'_>,
    ) -> Result<(Vec<u8>, u64, u64), i32> {
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
        // notify_change: an immutable or append-only inode keeps its mode, owner
        // and explicitly given times; setting them to now only the immutable one
        // refuses.
        let iflags = self.iflags(w, node)?;
        let explicit_times = (valid & FATTR_ATIME != 0 && valid & FATTR_ATIME_NOW == 0)
            || (valid & FATTR_MTIME != 0 && valid & FATTR_MTIME_NOW == 0);
        if valid & (FATTR_MODE | FATTR_UID | FATTR_GID) != 0 || explicit_times {
            refuse(iflags, NO_CHANGE)?;
        }
        if valid & (FATTR_ATIME | FATTR_MTIME) != 0 {
            refuse(iflags, INODE_IMMUTABLE)?;
        }
        // truncate(2) (and open's O_TRUNC) needs write access, which an immutable
        // file refuses; ftruncate(2) on a descriptor opened earlier is only refused
        // on an append-only file.
        if valid & FATTR_SIZE != 0 {
            refuse(
                iflags,
                if valid & FATTR_FH != 0 {
                    INODE_APPEND
                } else {
                    NO_CHANGE
                },
            )?;
        }
        // FUSE_HANDLE_KILLPRIV_V2: a chown of a non-directory, or a truncate by a
        // caller without CAP_FSETID, clears setuid/setgid (the kernel sends no mode).
        let killed = if valid & FATTR_KILL_SUIDGID != 0 && valid & FATTR_MODE == 0 {
            let i = self.inode_item(w, node)?;
            let cause = if valid & (FATTR_UID | FATTR_GID) != 0 {
                Cause::Chown
            } else {
                Cause::Marked
            };
            killed_mode(i.mode, i.gid, cause, h)
        } else {
            None
        };
        let mode = (valid & FATTR_MODE != 0).then_some(mode).or(killed);
        let uid = (valid & FATTR_UID != 0).then_some(uid);
        let gid = (valid & FATTR_GID != 0).then_some(gid);
        // A truncate frees space (it may rewrite the last sector); the rest touches
        // the inode item only.
        let need = if valid & FATTR_SIZE != 0 {
            Reservation {
                data_bytes: 1,
                ..Reservation::freeing(DEFAULT_ITEMS)
            }
        } else {
            Reservation::items(2)
        };
        // Nothing is charged to quotas: growing a file at a limit works on the
        // kernel too (tests/quota.rs), as do chmod, chown and utimes.
        w.change_reserved("setattr", need, |t| {
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
            if let (Some(m), None) = (mode, killed) {
                // chmod rewrites the access ACL, as the kernel's posix_acl_chmod.
                if let Some(mut a) =
                    t.fs.getxattr(node, acl::ACCESS)?
                        .and_then(|v| acl::Acl::parse(&v))
                {
                    a.chmod(m);
                    t.set_xattr(node.root, node.ino, acl::ACCESS, &a.encode(), t0)?;
                }
            }
            Ok(())
        })?;
        self.sync_if(w, iflags, INODE_SYNC)?;
        let seq = self.change_seq();
        let st = w.read(|fs| fs.stat(node)).map_err(|e| e.errno())?;
        let attr = self.attr_of(node, &st);
        let (s, ns) = abi::ttl_parts(self.ttl());
        let mut o = Out::with_capacity(16 + abi::ATTR_SIZE);
        o.u64(s).u32(ns).u32(0);
        attr.encode(&mut o);
        Ok((o.buf, seq, h.nodeid))
    }

    fn setxattr(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let size = a.u32().ok_or(errno::EINVAL)?;
        let flags = a.u32().ok_or(errno::EINVAL)?;
        let setxattr_flags = if self.setxattr_ext.load(Ordering::Relaxed) {
            let f = a.u32().ok_or(errno::EINVAL)?;
            a.skip(4).ok_or(errno::EINVAL)?; // padding
            f
        } else {
            0
        };
        let name = a.cstr().ok_or(errno::EINVAL)?;
        let value = a.rest().get(..size as usize).ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        // xattr_permission: no xattr changes on immutable or append-only inodes.
        let iflags = self.iflags(w, node)?;
        refuse(iflags, NO_CHANGE)?;
        // btrfs_setxattr_trans: two items.
        w.charge_quota(node.root, 2, |_| Ok(0))?;
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
            if name == acl::ACCESS {
                // The ACL sets the mode's permission bits; one the mode says in full
                // is not stored (the kernel's posix_acl_update_mode).
                let a = acl::Acl::parse(value)
                    .ok_or_else(|| Error::Invalid("malformed POSIX ACL".into()))?;
                let (bits, equiv) = a.equiv_mode();
                let t0 = now();
                let mut mode = t.read_inode(node.root, node.ino)?.mode;
                // posix_acl_update_mode: the kernel found the caller outside the
                // file's group and without CAP_FSETID.
                if setxattr_flags & SETXATTR_ACL_KILL_SGID != 0 {
                    mode &= !S_ISGID;
                }
                t.setattr(
                    node.root,
                    node.ino,
                    Some((mode & !0o777) | bits),
                    None,
                    None,
                    None,
                    None,
                    t0,
                )?;
                if equiv {
                    return match t.remove_xattr(node.root, node.ino, name, t0) {
                        Err(Error::NotFound(_)) => Ok(()),
                        r => r,
                    };
                }
                return t.set_xattr(node.root, node.ino, name, value, t0);
            }
            t.set_xattr(node.root, node.ino, name, value, now())
        })
        .map_err(xattr_errno)?;
        self.sync_if(w, iflags, INODE_SYNC)?;
        Ok(Vec::new())
    }

    fn removexattr(&self, w: &Writer, h: &InHeader, mut a: Args<'_>) -> Result<Vec<u8>, i32> {
        let name = a.cstr().ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        let iflags = self.iflags(w, node)?;
        refuse(iflags, NO_CHANGE)?;
        w.change("removexattr", |t| {
            t.remove_xattr(node.root, node.ino, name, now())
        })
        .map_err(xattr_errno)?;
        self.sync_if(w, iflags, INODE_SYNC)?;
        Ok(Vec::new())
    }

    fn fallocate(
        &self,
        w: &Writer,
        h: &InHeader,
        mut a: Args<'_>,
        ch: &Channel,
    ) -> Result<Vec<u8>, i32> {
        let _fh = a.u64().ok_or(errno::EINVAL)?;
        let offset = a.u64().ok_or(errno::EINVAL)?;
        let len = a.u64().ok_or(errno::EINVAL)?;
        let mode = a.u32().ok_or(errno::EINVAL)?;
        let node = self.changeable(h.nodeid)?;
        // vfs_fallocate: nothing on an immutable file, only plain allocation on an
        // append-only one.
        let iflags = self.iflags(w, node)?;
        refuse(iflags, INODE_IMMUTABLE)?;
        if mode & !FALLOC_FL_KEEP_SIZE != 0 {
            refuse(iflags, INODE_APPEND)?;
        }
        let k = Killing {
            h,
            ch,
            nodeid: h.nodeid,
            node,
            cause: Cause::Unmarked,
        };
        self.kill_suidgid_unmarked(w, k)?;
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        let t0 = now();
        // Preallocation and zeroing allocate the range (reserved first, as the
        // kernel does: more than is free is ENOSPC with nothing changed, fstests
        // generic/213); a punched hole frees it but may rewrite its partial first and
        // last sectors.
        let alloc = Reservation::write(len);
        let punch = Reservation {
            data_bytes: 1,
            ..Reservation::freeing(DEFAULT_ITEMS)
        };
        // The data the range gets (its sectors without extents), and the items of the
        // transaction btrfs_prealloc_file_range starts.
        if mode & FALLOC_FL_PUNCH_HOLE == 0 {
            w.charge_quota(node.root, 3, |t| {
                t.fallocate_new_bytes(node.root, node.ino, offset, len)
            })?;
        }
        match mode & !FALLOC_FL_KEEP_SIZE {
            0 => w
                .change_reserved("fallocate", alloc, |t| {
                    t.fallocate(node.root, node.ino, offset, len, keep, t0)
                })
                .map(|_| ()),
            FALLOC_FL_PUNCH_HOLE if keep => w.change_reserved("punch hole", punch, |t| {
                t.punch_hole(node.root, node.ino, offset, len, t0)
            }),
            FALLOC_FL_ZERO_RANGE => w.change_reserved("zero range", alloc, |t| {
                t.zero_range(node.root, node.ino, offset, len, keep, t0)
            }),
            _ => Err(errno::EOPNOTSUPP),
        }?;
        self.sync_if(w, iflags, INODE_SYNC)?;
        Ok(Vec::new())
    }

    /// copy_file_range(2): shares whole sectors (a reflink, as btrfs answers it
    /// through the VFS's remap_file_range), copies the rest; a short count makes the
    /// caller come back for what follows.
    fn copy_file_range(
        &self,
        w: &Writer,
        h: &InHeader,
        mut a: Args<'_>,
        ch: &Channel,
    ) -> Result<Vec<u8>, i32> {
        let _fh_in = a.u64().ok_or(errno::EINVAL)?;
        let off_in = a.u64().ok_or(errno::EINVAL)?;
        let nodeid_out = a.u64().ok_or(errno::EINVAL)?;
        let _fh_out = a.u64().ok_or(errno::EINVAL)?;
        let off_out = a.u64().ok_or(errno::EINVAL)?;
        let len = a.u64().ok_or(errno::EINVAL)?;
        let flags = a.u64().ok_or(errno::EINVAL)?;
        if flags != 0 {
            return Err(errno::EINVAL);
        }
        let src = self.changeable(h.nodeid)?;
        let dst = self.changeable(nodeid_out)?;
        // The VFS's generic_copy_file_checks: an immutable destination is EPERM (an
        // append-only one was opened O_APPEND, which the VFS refuses itself).
        if self.iflags(w, dst)? & INODE_IMMUTABLE != 0 {
            return Err(errno::EPERM);
        }
        let k = Killing {
            h,
            ch,
            nodeid: nodeid_out,
            node: dst,
            cause: Cause::Unmarked,
        };
        self.kill_suidgid_unmarked(w, k)?;
        let (from, to) = (
            FilePos::new(src.root, src.ino, off_in),
            FilePos::new(dst.root, dst.ino, off_out),
        );
        let need = w
            .read(|fs| Trans::copy_file_range_reservation(fs, from, to, len))
            .map_err(|e| e.errno())?;
        let (n, _shared) = w.change_reserved("copy_file_range", need, |t| {
            t.copy_file_range(from, to, len, now())
        })?;
        let mut o = Out::with_capacity(8);
        // At most CLONE_CHUNK_BYTES_MAX (1 GiB): fits the reply's 32 bits.
        o.u32(u32::try_from(n).map_err(|_| errno::EINVAL)?).u32(0);
        Ok(o.buf)
    }

    /// syncfs and unmount: durable when answered (a commit).
    pub(crate) fn sync(&self, w: &Writer, reply: Reply<'_>) {
        match w.commit() {
            Ok(()) => reply.ok(&[]),
            Err(e) => reply.error(e),
        }
    }

    /// fsync, fsyncdir (fsync_in: fh, fsync_flags; bit 0 is datasync): durable when
    /// answered, through the tree log ([`Writer::fsync`]).
    pub(crate) fn fsync(&self, w: &Writer, nodeid: u64, mut a: Args<'_>, reply: Reply<'_>) {
        let _fh = a.u64();
        let datasync = a.u32().is_some_and(|f| f & 1 != 0);
        let r = self
            .node_key(nodeid)
            .and_then(|k| w.fsync(k.node.root, k.node.ino, datasync));
        match r {
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
