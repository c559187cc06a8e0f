//! The filesystem side of the mount: FUSE requests answered from the ubtrfs engine.
//!
//! Reading requests (lookup, getattr, statx, readdir[plus], open/read, readlink,
//! xattrs, statfs, access, lseek, the GETFLAGS ioctls) are handled here, through the
//! [`Engine`]; requests that change the filesystem (the SETFLAGS ioctls included)
//! are answered in `write_ops.rs` on a read-write mount and with EROFS on a
//! read-only one.

use crate::abi::{self, op, Args, Attr, InHeader, Out};
use crate::atime::{Atime, AtimeMode, AtimeOptions};
use crate::ino::{InoMap, InoMode};
use crate::nodes::{NodeKey, Nodes};
use crate::reply::Reply;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use ubtrfs_core::tools::statfs::{statfs, StatFs};
use ubtrfs_core::Stat;
use ubtrfs_core::{fsflags_to_xflags, inode_flags_to_fsflags};
use ubtrfs_core::{now, Error, Node};

use crate::writer::Engine;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::InodeItem;

/// errno values (Linux).
#[allow(dead_code)]
pub(crate) mod errno {
    pub(crate) const EPERM: i32 = 1;
    pub(crate) const ENOTCONN: i32 = 107;
    pub(crate) const ECANCELED: i32 = 125;
    pub(crate) const EINPROGRESS: i32 = 115;
    pub(crate) const ENOENT: i32 = 2;
    pub(crate) const EIO: i32 = 5;
    pub(crate) const ENXIO: i32 = 6;
    pub(crate) const EBADF: i32 = 9;
    pub(crate) const EACCES: i32 = 13;
    pub(crate) const EBUSY: i32 = 16;
    pub(crate) const EEXIST: i32 = 17;
    pub(crate) const EXDEV: i32 = 18;
    pub(crate) const ENOTDIR: i32 = 20;
    pub(crate) const EINVAL: i32 = 22;
    pub(crate) const ENOTTY: i32 = 25;
    pub(crate) const ENOSPC: i32 = 28;
    pub(crate) const EROFS: i32 = 30;
    pub(crate) const ERANGE: i32 = 34;
    pub(crate) const ENAMETOOLONG: i32 = 36;
    pub(crate) const ENOSYS: i32 = 38;
    pub(crate) const ENODATA: i32 = 61;
    pub(crate) const EOPNOTSUPP: i32 = 95;
    pub(crate) const ESTALE: i32 = 116;
}

#[derive(Clone, Debug)]
pub struct OpsConfig {
    /// The directory shown at the mountpoint (a subvolume root).
    pub root: Node,
    /// How long the kernel may cache attributes, names and negative lookups.
    pub ttl: Duration,
    pub ino: InoMode,
    /// When reads update atime (read-write only).
    pub atime: AtimeOptions,
    /// The kernel's `user_subvol_rm_allowed` mount option.
    pub user_subvol_rm_allowed: bool,
}

struct OpenFile {
    nodeid: u64,
    node: Node,
    inode: InodeItem,
}

pub struct Ops {
    pub(crate) engine: Engine,
    pub(crate) nodes: Nodes,
    files: RwLock<HashMap<u64, Arc<OpenFile>>>,
    pub(crate) next_fh: AtomicU64,
    statfs: StatFs,
    pub(crate) cfg: OpsConfig,
    /// (subvolume, inode) whose read errors were already logged.
    logged: Mutex<HashSet<(u64, u64)>>,
    /// The kernel can do without OPEN / OPENDIR (we answer ENOSYS once, and it then
    /// neither sends OPEN, FLUSH, RELEASE nor their dir twins, and keeps the page
    /// cache and readdir cache across opens): two or three requests less per file.
    no_open: AtomicBool,
    no_opendir: AtomicBool,
    /// The kernel took FUSE_HANDLE_KILLPRIV_V2: setuid/setgid are cleared here
    /// (module `killpriv`), also on fallocate and copy_file_range.
    pub(crate) killpriv: AtomicBool,
    /// The kernel took FUSE_SETXATTR_EXT: SETXATTR has a second pair of words.
    pub(crate) setxattr_ext: AtomicBool,
    /// st_ino of every file (module `ino`).
    ino: InoMap,
    /// When reads and listings update atime; a remount may change it.
    pub(crate) atime: Atime,
    /// The kernel maps files opened with FOPEN_DIRECT_IO shared too
    /// (FUSE_DIRECT_IO_ALLOW_MMAP): an empty file may then be opened that way.
    direct_io_mmap: AtomicBool,
    /// Remounted read-only (`mount -o remount,ro`): the kernel refuses changes
    /// itself, and atime updates, which start here, stop too.
    pub(crate) remounted_ro: AtomicBool,
    /// The kernel's `user_subvol_rm_allowed` (from the mount; a remount may change it).
    pub(crate) user_subvol_rm_allowed: AtomicBool,
    /// Read-write mount: the read-only subvolumes (`btrfs subvolume snapshot -r`,
    /// `btrfs property set ... ro true`), where every change is EROFS, as on the
    /// kernel. Grows when a read-only snapshot is made through the mount.
    ro_subvols: RwLock<HashSet<u64>>,
    /// Read-write: open directories (fh) and the DIR_INDEX their listing stops at,
    /// taken at OPENDIR and again when a listing restarts at offset 0 (rewinddir).
    dir_ends: Mutex<std::collections::HashMap<u64, u64>>,
    next_dir_fh: std::sync::atomic::AtomicU64,
    /// The balance a BALANCE_V2 request is running, for BALANCE_CTL and
    /// BALANCE_PROGRESS from other requests (balance_ops.rs).
    pub(crate) balance: Mutex<Option<Arc<crate::balance_ops::RunningBalance>>>,
}

/// Longest name btrfs stores (BTRFS_NAME_LEN).
pub(crate) const NAME_MAX: usize = 255;

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const DT_DIR: u32 = 4;

const O_ACCMODE: u32 = 0o3;
const O_TRUNC: u32 = 0o1000;
/// open(2)'s O_NOATIME: reads through this descriptor leave atime (the kernel lets
/// only the owner or CAP_FOWNER set it, checked before the flag reaches us).
const O_NOATIME: u32 = 0o1000000;

const SEEK_DATA: u32 = 3;
const SEEK_HOLE: u32 = 4;

const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
/// BTRFS_IOC_SYNC (`btrfs filesystem sync`): commits. The way to make everything
/// durable, since FUSE never passes sync(2)/syncfs(2) on to a server (only
/// virtiofs gets FUSE_SYNCFS).
const BTRFS_IOC_SYNC: u32 = 0x9408;
/// The btrfs ioctls the kernel keeps for CAP_SYS_ADMIN (balance, quotas, the
/// label, FITRIM, deleting others' subvolumes): root or the user the server runs
/// as, whose rights it has; EPERM for anyone else.
pub(crate) fn admin_only(h: &InHeader) -> Result<(), i32> {
    if h.uid != 0 && h.uid != nix::unistd::getuid().as_raw() {
        return Err(errno::EPERM);
    }
    Ok(())
}

/// Who may tell the server of a remount: whoever may remount, CAP_SYS_ADMIN (in the
/// server's user namespace), or the user the server runs as when that is not root
/// (fusermount3 lets a user remount their own mount).
fn remount_allowed(h: &InHeader) -> Result<(), i32> {
    let me = nix::unistd::geteuid().as_raw();
    if (me != 0 && h.uid == me) || crate::creds::Caller::new(h).capable(crate::creds::CAP_SYS_ADMIN)
    {
        Ok(())
    } else {
        Err(errno::EPERM)
    }
}

/// FITRIM: _IOWR('X', 121, struct fstrim_range { start, len, minlen: u64 }).
const FITRIM: u32 = 0xc018_5879;
/// FS_IOC_GETFSLABEL (= BTRFS_IOC_GET_FSLABEL): _IOR(0x94, 49, char[256]).
pub(crate) const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
/// FS_IOC_SETFSLABEL (= BTRFS_IOC_SET_FSLABEL): _IOW(0x94, 50, char[256]).
pub(crate) const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;
pub(crate) const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
pub(crate) const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
pub(crate) const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

impl Ops {
    pub fn new(engine: Engine, cfg: OpsConfig) -> Ops {
        let statfs = engine.read(|fs| statfs(fs, 0)).unwrap_or_else(|e| {
            eprintln!("ubtrfs: warning: statfs numbers unavailable: {e}");
            let sectorsize = engine.read(|fs| fs.info.sectorsize);
            StatFs {
                bsize: sectorsize,
                frsize: sectorsize,
                namelen: 255,
                ..Default::default()
            }
        });
        let highest = engine.read(|fs| fs.highest_ino(cfg.root.root)).unwrap_or(0);
        let ino = InoMap::new(cfg.ino, cfg.root.root, highest);
        if !ino.collision_free() {
            eprintln!(
                "ubtrfs: warning: subvolume {} has inode number {highest} (2^40 or more): \
                 st_ino of files in other subvolumes may equal one of its own",
                cfg.root.root
            );
        }
        let ro_subvols = if engine.writable() {
            read_only_subvolumes(&engine).unwrap_or_else(|e| {
                eprintln!("ubtrfs: warning: cannot list read-only subvolumes: {e}");
                HashSet::new()
            })
        } else {
            HashSet::new()
        };
        Ops {
            nodes: Nodes::new(cfg.root),
            ino,
            atime: Atime::new(cfg.atime),
            remounted_ro: AtomicBool::new(false),
            user_subvol_rm_allowed: AtomicBool::new(cfg.user_subvol_rm_allowed),
            direct_io_mmap: AtomicBool::new(false),
            ro_subvols: RwLock::new(ro_subvols),
            engine,
            files: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            statfs,
            cfg,
            logged: Mutex::new(HashSet::new()),
            no_open: AtomicBool::new(false),
            no_opendir: AtomicBool::new(false),
            killpriv: AtomicBool::new(false),
            setxattr_ext: AtomicBool::new(false),
            dir_ends: Mutex::new(std::collections::HashMap::new()),
            next_dir_fh: std::sync::atomic::AtomicU64::new(1),
            balance: Mutex::new(None),
        }
    }

    /// Called with the kernel's INIT flags, before any other request.
    pub fn set_kernel_flags(&self, flags: u32, flags2: u32) {
        self.direct_io_mmap.store(
            flags2 & abi::init::FLAGS2_DIRECT_IO_ALLOW_MMAP != 0,
            Ordering::Relaxed,
        );
        // Without OPEN requests, opening a file for writing cannot be refused; a
        // read-only subvolume needs that (EROFS at open, as the kernel answers).
        self.no_open.store(
            flags & abi::init::NO_OPEN_SUPPORT != 0
                && self
                    .ro_subvols
                    .read()
                    .map(|s| s.is_empty())
                    .unwrap_or(false),
            Ordering::Relaxed,
        );
        self.no_opendir.store(
            flags & abi::init::NO_OPENDIR_SUPPORT != 0,
            Ordering::Relaxed,
        );
        self.killpriv.store(
            flags & abi::init::HANDLE_KILLPRIV_V2 != 0,
            Ordering::Relaxed,
        );
        self.setxattr_ext
            .store(flags & abi::init::SETXATTR_EXT != 0, Ordering::Relaxed);
    }

    /// Answers one request.
    pub fn dispatch(&self, h: &InHeader, body: &[u8], reply: Reply<'_>) {
        let a = Args::new(body);
        match h.opcode {
            op::LOOKUP => self.lookup(h, a, reply),
            op::FORGET => {
                let mut a = a;
                if let Some(n) = a.u64() {
                    self.forget(&[(h.nodeid, n)]);
                }
                reply.none();
            }
            op::BATCH_FORGET => {
                self.batch_forget(a);
                reply.none();
            }
            op::GETATTR => self.getattr(h, reply),
            op::STATX => self.statx(h, reply),
            op::READLINK => self.readlink(h, reply),
            op::OPEN => self.open(h, a, reply),
            op::READ => self.read(h, a, reply),
            op::RELEASE => self.release(a, reply),
            op::OPENDIR => self.opendir(h, reply),
            op::READDIR => self.readdir(h, a, false, reply),
            op::READDIRPLUS => self.readdir(h, a, true, reply),
            op::RELEASEDIR => {
                let mut a = a;
                if let Some(fh) = a.u64() {
                    self.dir_ends
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&fh);
                }
                reply.ok(&[])
            }
            op::STATFS => self.statfs(reply),
            op::GETXATTR => self.getxattr(h, a, reply),
            op::LISTXATTR => self.listxattr(h, a, reply),
            op::ACCESS => self.access(h, a, reply),
            // Nothing to flush: ENOSYS tells the kernel not to send FLUSH again.
            op::FLUSH => reply.error(errno::ENOSYS),
            op::FSYNC | op::FSYNCDIR => match &self.engine {
                Engine::ReadWrite(w) => self.fsync(w, h.nodeid, a, reply),
                Engine::ReadOnly(_) => reply.ok(&[]),
            },
            op::SYNCFS => match &self.engine {
                Engine::ReadWrite(w) => self.sync(w, reply),
                Engine::ReadOnly(_) => reply.ok(&[]),
            },
            op::IOCTL => self.ioctl(h, a, reply),
            op::LSEEK => self.lseek(h, a, reply),
            op::INTERRUPT => reply.none(),
            op::DESTROY => match &self.engine {
                Engine::ReadWrite(w) => self.sync(w, reply),
                Engine::ReadOnly(_) => reply.ok(&[]),
            },
            op::SETATTR
            | op::SYMLINK
            | op::MKNOD
            | op::MKDIR
            | op::UNLINK
            | op::RMDIR
            | op::RENAME
            | op::RENAME2
            | op::LINK
            | op::WRITE
            | op::SETXATTR
            | op::REMOVEXATTR
            | op::CREATE
            | op::TMPFILE
            | op::FALLOCATE
            | op::COPY_FILE_RANGE => match &self.engine {
                Engine::ReadWrite(w) => self.write_op(w, h, body, reply),
                Engine::ReadOnly(_) => reply.error(errno::EROFS),
            },
            _ => reply.error(errno::ENOSYS),
        }
    }

    pub(crate) fn node(&self, nodeid: u64) -> Result<NodeKey, i32> {
        self.nodes.get(nodeid).ok_or(errno::ESTALE)
    }

    /// True when `subvol` is a read-only subvolume on a read-write mount.
    pub(crate) fn read_only_subvol(&self, subvol: u64) -> bool {
        self.ro_subvols
            .read()
            .map(|s| s.contains(&subvol))
            .unwrap_or(true)
    }

    /// A read-only snapshot made through the mount.
    pub(crate) fn add_read_only_subvol(&self, subvol: u64) {
        if let Ok(mut s) = self.ro_subvols.write() {
            s.insert(subvol);
        }
    }

    /// A subvolume made writable through the mount.
    pub(crate) fn remove_read_only_subvol(&self, subvol: u64) {
        if let Ok(mut s) = self.ro_subvols.write() {
            s.remove(&subvol);
        }
    }

    /// The (subvolume, inode) a node id names.
    pub(crate) fn node_key(&self, nodeid: u64) -> Result<NodeKey, i32> {
        self.node(nodeid)
    }

    /// The node id table.
    pub(crate) fn node_ids(&self) -> &Nodes {
        &self.nodes
    }

    /// How long the kernel may cache attributes and names.
    pub(crate) fn ttl(&self) -> Duration {
        self.cfg.ttl
    }

    /// The FUSE attributes of a file.
    pub(crate) fn attr_of(&self, node: Node, st: &Stat) -> Attr {
        self.attr(node, st)
    }

    /// Remembers an open file handle.
    pub(crate) fn insert_open(&self, fh: u64, nodeid: u64, node: Node, inode: InodeItem) {
        if let Ok(mut m) = self.files.write() {
            m.insert(
                fh,
                Arc::new(OpenFile {
                    nodeid,
                    node,
                    inode,
                }),
            );
        }
    }

    /// st_ino of a node.
    fn st_ino(&self, node: Node) -> u64 {
        self.ino.st_ino(node)
    }

    fn attr(&self, node: Node, st: &Stat) -> Attr {
        let t = |t: &ubtrfs_format::items::Timespec| (t.sec, t.nsec);
        let f = st.flags;
        let mut attributes = 0u64;
        for (bit, sx) in [
            (INODE_COMPRESS, 0x4u64),
            (INODE_IMMUTABLE, 0x10),
            (INODE_APPEND, 0x20),
            (INODE_NODUMP, 0x40),
        ] {
            if f & bit != 0 {
                attributes |= sx;
            }
        }
        Attr {
            ino: self.st_ino(node),
            size: st.size,
            blocks: st.blocks,
            atime: t(&st.atime),
            mtime: t(&st.mtime),
            ctime: t(&st.ctime),
            // The kernel has no birth time for the made-up ino-2 directory.
            btime: (!node.is_placeholder()).then(|| t(&st.crtime)),
            mode: st.mode,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            rdev_major: nix::sys::stat::major(st.rdev) as u32,
            rdev_minor: nix::sys::stat::minor(st.rdev) as u32,
            blksize: st.blksize,
            attributes,
            attributes_mask: 0x4 | 0x10 | 0x20 | 0x40,
        }
    }

    fn stat_attr(&self, node: Node) -> Result<(Stat, Attr), Error> {
        let st = self.engine.read_node(node, |fs| stat_salvaged(fs, node))?;
        let a = self.attr(node, &st);
        Ok((st, a))
    }

    fn lookup(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let Some(name) = a.cstr() else {
            return reply.error(errno::EINVAL);
        };
        // The VFS leaves name length to the filesystem: btrfs allows 255 bytes.
        if name.len() > NAME_MAX {
            return reply.error(errno::ENAMETOOLONG);
        }
        if name == b"." || name == b".." {
            // Only the kernel's file-handle decoding asks for these (the VFS resolves
            // both itself), for an inode it may have forgotten.
            return self.lookup_handle(h, name == b"..", reply);
        }
        let dir = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        let seq = self.change_seq();
        let entry = match self.engine.read(|fs| fs.lookup(dir, name)) {
            Ok(Some(e)) => e,
            Ok(None) => {
                let mut o = Out::with_capacity(abi::ENTRY_OUT_SIZE);
                abi::encode_negative_entry(&mut o, self.cfg.ttl);
                return reply.ok(&o.buf);
            }
            Err(e) => return reply.error(e.errno()),
        };
        let (st, attr) = match self.stat_attr(entry.node) {
            Ok(x) => x,
            Err(e) => return reply.error(e.errno()),
        };
        let id = self.nodes.intern(
            NodeKey::new(entry.node, entry.location),
            h.nodeid,
            &entry.name,
        );
        let mut o = Out::with_capacity(abi::ENTRY_OUT_SIZE);
        abi::encode_entry(&mut o, id, entry_generation(id, &st), self.cfg.ttl, &attr);
        self.reply_attrs(reply, &o.buf, seq, 0, &[id]);
    }

    /// LOOKUP of "." or ".." (FUSE_EXPORT_SUPPORT): the kernel decodes a file handle
    /// (name_to_handle_at, an NFS export) whose inode it no longer has, by its node
    /// id, which lasts across forgets and remounts (module `nodes`); ".." names the
    /// directory's parent, to reconnect it. A node id that names nothing (any more)
    /// is ENOENT, which the kernel turns into ESTALE.
    fn lookup_handle(&self, h: &InHeader, parent: bool, reply: Reply<'_>) {
        let known = self.nodes.get(h.nodeid);
        let Some(node) = known
            .map(|k| k.node)
            .or_else(|| self.nodes.decode(h.nodeid))
        else {
            return reply.error(errno::ENOENT);
        };
        // The inode named, and the directory it is in (as `..` names it).
        let found = self
            .engine
            .read(|fs| -> Result<Option<(Node, Option<Node>)>, Error> {
                let up = |n: Node| -> Result<Option<Node>, Error> {
                    // Above the mounted subvolume's root there is nothing to show.
                    if n == self.cfg.root {
                        return Ok(None);
                    }
                    Ok(Some(fs.parent_dir(n)?.unwrap_or(self.cfg.root)))
                };
                let (target, above) = match (parent, up(node)?) {
                    (true, Some(p)) => (p, up(p)?),
                    (true, None) => (node, None),
                    (false, above) => (node, above),
                };
                // An unlinked inode (an orphan kept for an open file) has no handle.
                match stat_salvaged(fs, target) {
                    Ok(st) if st.nlink > 0 || target.ino == FIRST_FREE_OBJECTID => {
                        Ok(Some((target, above)))
                    }
                    Ok(_) | Err(Error::NotFound(_)) => Ok(None),
                    Err(e) => Err(e),
                }
            });
        let (target, above) = match found {
            Ok(Some(t)) => t,
            Ok(None) => return reply.error(errno::ENOENT),
            Err(e) => return reply.error(e.errno()),
        };
        let (st, attr) = match self.stat_attr(target) {
            Ok(x) => x,
            Err(e) => return reply.error(e.errno()),
        };
        // A node the table still holds keeps its key (a placeholder its location).
        let key = match known {
            Some(k) if !parent => k,
            _ => NodeKey::new(target, 0),
        };
        // Where it was found is unknown: its parent's lasting id, if it has one.
        let up = above
            .and_then(|p| self.nodes.lasting_id(NodeKey::new(p, 0)))
            .unwrap_or(abi::ROOT_ID);
        let id = self.nodes.intern(key, up, b"");
        let mut o = Out::with_capacity(abi::ENTRY_OUT_SIZE);
        abi::encode_entry(&mut o, id, entry_generation(id, &st), self.cfg.ttl, &attr);
        reply.ok(&o.buf);
    }

    fn batch_forget(&self, mut a: Args<'_>) {
        let Some(count) = a.u32() else { return };
        if a.u32().is_none() {
            return;
        }
        let mut lookups = Vec::new();
        for _ in 0..count {
            let (Some(id), Some(n)) = (a.u64(), a.u64()) else {
                break;
            };
            lookups.push((id, n));
        }
        self.forget(&lookups);
    }

    /// The kernel drops `n` lookups of each (node id, n): an unlinked inode it held
    /// goes once it forgets it.
    fn forget(&self, lookups: &[(u64, u64)]) {
        let gone: Vec<(u64, u64)> = lookups
            .iter()
            .filter_map(|&(id, n)| self.nodes.forget(id, n))
            .map(|k| (k.node.root, k.node.ino))
            .collect();
        if let Engine::ReadWrite(w) = &self.engine {
            w.forgotten(&gone);
        }
    }

    fn getattr(&self, h: &InHeader, reply: Reply<'_>) {
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        let seq = self.change_seq();
        match self.stat_attr(node) {
            Ok((_, attr)) => {
                let (s, ns) = abi::ttl_parts(self.cfg.ttl);
                let mut o = Out::with_capacity(16 + abi::ATTR_SIZE);
                o.u64(s).u32(ns).u32(0);
                attr.encode(&mut o);
                self.reply_attrs(reply, &o.buf, seq, 0, &[h.nodeid]);
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    fn statx(&self, h: &InHeader, reply: Reply<'_>) {
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        let seq = self.change_seq();
        match self.stat_attr(node) {
            Ok((_, attr)) => {
                let (s, ns) = abi::ttl_parts(self.cfg.ttl);
                let mut o = Out::with_capacity(32 + 256);
                o.u64(s).u32(ns).u32(0).u64(0).u64(0);
                attr.encode_statx(&mut o);
                self.reply_attrs(reply, &o.buf, seq, 0, &[h.nodeid]);
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    fn readlink(&self, h: &InHeader, reply: Reply<'_>) {
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        let before = ubtrfs_core::losses_met_by_this_thread();
        match self
            .engine
            .read_metadata(|fs| fs.readlink(node))
            .and_then(|t| lost_since(before, "its target").map(|()| t))
        {
            Ok(t) => {
                // Reading a link (and following one) touches its atime on the kernel.
                if self.atime_applies(node) {
                    if let Ok(i) = self.engine.read(|fs| fs.inode_item(node)) {
                        self.accessed(reply.channel(), h.nodeid, node, &i, false);
                    }
                }
                reply.ok(&t)
            }
            Err(e) => {
                self.log_error(h.nodeid, node, "readlink", &e);
                reply.error(e.errno())
            }
        }
    }

    fn open(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let Some(flags) = a.u32() else {
            return reply.error(errno::EINVAL);
        };
        if !self.engine.writable() && (flags & O_ACCMODE != 0 || flags & O_TRUNC != 0) {
            return reply.error(errno::EROFS);
        }
        // Read-write, OPEN is where immutable and append-only files refuse writers
        // (the VFS's may_open), so the kernel is not told to skip it.
        if !self.engine.writable() && self.no_open.load(Ordering::Relaxed) {
            return reply.error(errno::ENOSYS);
        }
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        let inode = match self.engine.read_node(node, |fs| fs.inode_item(node)) {
            Ok(i) => i,
            Err(e) => return reply.error(e.errno()),
        };
        // The kernel's btrfs_permission: no writing to regular files (directories,
        // symlinks) of a read-only subvolume; fifos and devices stay writable.
        let kind = inode.mode & S_IFMT;
        if (flags & O_ACCMODE != 0 || flags & O_TRUNC != 0)
            && self.read_only_subvol(node.root)
            && [S_IFREG, S_IFDIR, S_IFLNK].contains(&kind)
        {
            return reply.error(errno::EROFS);
        }
        if self.engine.writable() {
            if let Err(e) = crate::write_ops::may_open(inode.flags, flags) {
                return reply.error(e);
            }
        }
        // A read that must update atime has to reach us: the kernel then drops the
        // pages it holds (module `atime`).
        let keep = if flags & O_NOATIME == 0
            && self.atime_applies(node)
            && self.atime.wants_read(&inode, now())
        {
            // An empty file's read never reaches us otherwise (the kernel answers
            // reads at the end of file itself); read-only opens only, and only
            // where a shared mapping still works.
            if inode.size == 0
                && kind == S_IFREG
                && flags & O_ACCMODE == 0
                && self.direct_io_mmap.load(Ordering::Relaxed)
            {
                abi::FOPEN_DIRECT_IO
            } else {
                0
            }
        } else {
            abi::FOPEN_KEEP_CACHE
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let f = Arc::new(OpenFile {
            nodeid: h.nodeid,
            node,
            inode,
        });
        if let Ok(mut m) = self.files.write() {
            m.insert(fh, f);
        }
        let mut o = Out::with_capacity(16);
        o.u64(fh).u32(keep).u32(0);
        reply.ok(&o.buf);
    }

    /// The open file: from OPEN's handle, or (without OPEN, fh 0) from the node id,
    /// reading the inode item now.
    fn file(&self, h: &InHeader, fh: u64) -> Result<Arc<OpenFile>, i32> {
        // On a read-write mount the inode changes under an open file: read it anew.
        if fh != 0 && !self.engine.writable() {
            if let Some(f) = self.files.read().ok().and_then(|m| m.get(&fh).cloned()) {
                return Ok(f);
            }
        }
        let node = self.node(h.nodeid)?.node;
        let inode = self
            .engine
            .read(|fs| fs.inode_item(node))
            .map_err(|e| e.errno())?;
        Ok(Arc::new(OpenFile {
            nodeid: h.nodeid,
            node,
            inode,
        }))
    }

    fn read(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let (Some(fh), Some(offset), Some(size)) = (a.u64(), a.u64(), a.u32()) else {
            return reply.error(errno::EINVAL);
        };
        // fuse_read_in goes on with read_flags, lock_owner, and the file's open flags.
        let open_flags = a.skip(4 + 8).and_then(|()| a.u32()).unwrap_or(0);
        let f = match self.file(h, fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        // One engine call for the whole request: one extent walk, one checksum
        // lookup and one device read per extent piece, however large the request.
        let before = ubtrfs_core::losses_met_by_this_thread();
        match self
            .engine
            .read_node(f.node, |fs| {
                fs.read_inode(f.node, &f.inode, offset, size as usize)
            })
            .and_then(|d| lost_since(before, "the extent items of this range").map(|()| d))
        {
            Ok(data) => {
                // Before the answer: the kernel asks for attributes again right after
                // a read (fuse_invalidate_atime), and must see the new atime.
                if open_flags & O_NOATIME == 0 {
                    self.accessed(reply.channel(), f.nodeid, f.node, &f.inode, false);
                }
                reply.ok(&data);
            }
            Err(e) => {
                self.log_error(f.nodeid, f.node, &format!("read at offset {offset}"), &e);
                reply.error(e.errno())
            }
        }
    }

    /// Logs a failed read once per file (the error names the disk location).
    fn log_error(&self, nodeid: u64, node: Node, what: &str, e: &Error) {
        let first = self
            .logged
            .lock()
            .map(|mut s| s.len() < 100_000 && s.insert((node.root, node.ino)))
            .unwrap_or(true);
        if first {
            eprintln!(
                "ubtrfs: {} (subvolume {} inode {}): {what}: {e}; answering {} (logged once per file)",
                self.nodes.path(nodeid),
                node.root,
                node.ino,
                if e.errno() == errno::EIO { "EIO" } else { "an error" }
            );
        }
    }

    fn release(&self, mut a: Args<'_>, reply: Reply<'_>) {
        if let Some(fh) = a.u64() {
            if let Ok(mut m) = self.files.write() {
                m.remove(&fh);
            }
        }
        reply.ok(&[]);
    }

    fn opendir(&self, h: &InHeader, reply: Reply<'_>) {
        if let Err(e) = self.node(h.nodeid) {
            return reply.error(e);
        }
        // Read-write, directories are opened, to remember where their listing ends.
        if self.no_opendir.load(Ordering::Relaxed) && !self.engine.writable() {
            return reply.error(errno::ENOSYS);
        }
        let mut fh = 0;
        if self.engine.writable() {
            let node = match self.node(h.nodeid) {
                Ok(k) => k.node,
                Err(e) => return reply.error(e),
            };
            match self.engine.read(|fs| fs.dir_index_end(node)) {
                Ok(end) => {
                    fh = self.next_dir_fh.fetch_add(1, Ordering::Relaxed);
                    self.dir_ends
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(fh, end);
                }
                Err(e) => return reply.error(e.errno()),
            }
        }
        let mut o = Out::with_capacity(16);
        // Read-only, the listing never changes: let the kernel keep it in its page
        // cache.
        let flags = if self.engine.writable() {
            0
        } else {
            abi::FOPEN_KEEP_CACHE | abi::FOPEN_CACHE_DIR
        };
        o.u64(fh).u32(flags).u32(0);
        reply.ok(&o.buf);
    }

    /// READDIR / READDIRPLUS. Offsets: "." is followed by 1, ".." by 2, and an entry
    /// with DIR_INDEX sequence n by n + 1 (btrfs numbers entries from 2), so an offset
    /// stays valid across calls, as the kernel's own readdir positions do.
    fn readdir(&self, h: &InHeader, mut a: Args<'_>, plus: bool, reply: Reply<'_>) {
        let (Some(fh), Some(offset), Some(size)) = (a.u64(), a.u64(), a.u32()) else {
            return reply.error(errno::EINVAL);
        };
        // As for READ: the directory's open flags end fuse_read_in.
        let open_flags = a.skip(4 + 8).and_then(|()| a.u32()).unwrap_or(0);
        let key = match self.node(h.nodeid) {
            Ok(k) => k,
            Err(e) => return reply.error(e),
        };
        let dir = key.node;
        // Entries added after the listing began (a rename gives a new DIR_INDEX) are
        // not listed, or renaming each entry read would list them forever (fstests
        // generic/736; the kernel's btrfs does the same). Offset 0 starts anew.
        let end = {
            let mut ends = self.dir_ends.lock().unwrap_or_else(|p| p.into_inner());
            match ends.get_mut(&fh) {
                Some(end) => {
                    if offset == 0 {
                        if let Ok(e) = self.engine.read(|fs| fs.dir_index_end(dir)) {
                            *end = e;
                        }
                    }
                    *end
                }
                None => u64::MAX,
            }
        };
        let max = size as usize;
        let mut o = Out::with_capacity(max.min(1 << 16));
        let plus_extra = if plus { abi::ENTRY_OUT_SIZE } else { 0 };
        let dots: [(&[u8], u64); 2] = [
            (b".", self.st_ino(dir)),
            (b"..", {
                let p = self.nodes.parent(h.nodeid).unwrap_or(h.nodeid);
                self.nodes
                    .get(p)
                    .map(|k| self.st_ino(k.node))
                    .unwrap_or(self.st_ino(dir))
            }),
        ];
        for (i, (name, ino)) in dots.iter().enumerate() {
            let next = i as u64 + 1;
            if offset < next {
                if o.len() + plus_extra + abi::dirent_size(name.len()) > max {
                    return reply.ok(&o.buf);
                }
                if plus {
                    // No entry for the dots: the kernel links neither of them.
                    o.zeros(abi::ENTRY_OUT_SIZE);
                }
                abi::encode_dirent(&mut o, *ino, next, DT_DIR, name);
            }
        }
        // The directory's inode item for its atime, read under the listing's lock.
        let atime_wanted =
            open_flags & O_NOATIME == 0 && self.atime_applies(dir) && !self.atime.get().nodiratime;
        let mut dir_inode = None;
        // Node ids whose attributes this listing carries (READDIRPLUS).
        let mut listed = Vec::new();
        let seq = self.change_seq();
        let r = self.engine.read(|fs| {
            if atime_wanted {
                dir_inode = fs.inode_item(dir).ok();
            }
            fs.readdir_from(dir, offset.max(2), |e| {
                if e.index >= end {
                    return Ok(false);
                }
                let need = plus_extra + abi::dirent_size(e.name.len());
                if o.len() + need > max {
                    return Ok(false);
                }
                let d_ino = self.ino.d_ino(e.node, e.location);
                if plus {
                    // `fs` as given, never self.stat_attr: taking the engine's read lock
                    // again here deadlocks once a writer queues between the two (the
                    // RwLock then blocks new readers), as fstests' generic/013 (fsstress)
                    // showed with readdirplus against writes and the commit timer.
                    match stat_salvaged(fs, e.node).map(|st| (self.attr(e.node, &st), st)) {
                        Ok((attr, st)) => {
                            let id = self.nodes.intern(
                                NodeKey::new(e.node, e.location),
                                h.nodeid,
                                &e.name,
                            );
                            let g = entry_generation(id, &st);
                            abi::encode_entry(&mut o, id, g, self.cfg.ttl, &attr);
                            listed.push(id);
                        }
                        // Listed without attributes; a lookup will report the error.
                        Err(_) => {
                            o.zeros(abi::ENTRY_OUT_SIZE);
                        }
                    }
                }
                abi::encode_dirent(&mut o, d_ino, e.index + 1, dtype(e.ty), &e.name);
                Ok(true)
            })
        });
        match r {
            // Entries already encoded are returned even if a later one failed.
            Err(e) if o.is_empty() => reply.error(e.errno()),
            _ => {
                let own = dir_inode.as_ref().map_or(0, |i| {
                    self.accessed(reply.channel(), h.nodeid, dir, i, true)
                        .changes()
                });
                self.reply_attrs(reply, &o.buf, seq, own, &listed);
            }
        }
    }

    /// `mount -o remount` told us the mount's new flags (module `atime`). Only root
    /// or the mount's owner may say so. Read-only, the transaction is committed, as
    /// the kernel's btrfs does when remounted read-only.
    fn remounted(&self, h: &InHeader, input: &[u8]) -> Result<(), i32> {
        remount_allowed(h)?;
        let r = crate::atime::parse_remount(input).ok_or(errno::EINVAL)?;
        if let Some(a) = r.atime {
            self.atime.set(a);
        }
        self.remounted_ro.store(r.read_only, Ordering::Relaxed);
        if let (true, Engine::ReadWrite(w)) = (r.read_only, &self.engine) {
            w.commit()?;
        }
        Ok(())
    }

    /// UBTRFS_IOC_SET_OPTIONS: the options a remount named (settings.rs), from root
    /// or the user who mounted, as the remount ioctl.
    fn set_options(&self, h: &InHeader, input: &[u8]) -> Result<(), i32> {
        remount_allowed(h)?;
        let s = crate::settings::Settings::decode(input).ok_or(errno::EINVAL)?;
        if let Some(r) = s.user_subvol_rm_allowed {
            self.user_subvol_rm_allowed.store(r, Ordering::Relaxed);
        }
        let Engine::ReadWrite(w) = &self.engine else {
            return Ok(()); // nothing is written: the rest has no effect
        };
        w.configure(|t| {
            if let Some(c) = s.compress {
                t.compress = c.map(|(alg, level, _)| (alg, level));
                t.compress_force = c.is_some_and(|c| c.2);
            }
            if let Some(d) = s.discard {
                t.discard_on_commit = d;
            }
            if let Some((set, clear)) = s.new_file_flags {
                t.new_file_flags = (t.new_file_flags & !clear) | set;
            }
            if let Some(m) = s.max_inline {
                t.set_max_inline(m as u64);
            }
        });
        if let Some(i) = s.commit_interval() {
            w.set_commit_interval(i);
        }
        match s.tree_log {
            Some(true) => w.enable_tree_log()?,
            Some(false) => w.disable_tree_log(),
            None => {}
        }
        Ok(())
    }

    /// Whether reads of `node` may update atime at all: a read-write mount (not
    /// remounted read-only), outside read-only subvolumes.
    pub(crate) fn atime_applies(&self, node: Node) -> bool {
        self.engine.writable()
            && !self.remounted_ro.load(Ordering::Relaxed)
            && !node.is_placeholder()
            && !self.read_only_subvol(node.root)
            && self.atime.get().mode != AtimeMode::NoAtime
    }

    fn statfs(&self, reply: Reply<'_>) {
        // Read-write, space changes: count it now (a few dozen items), with every
        // device writable, as the kernel's read-write mount counts (free space inside
        // data block groups too). Read-only: as a read-only loop mount, counted once.
        let s = match &self.engine {
            Engine::ReadWrite(_) => self
                .engine
                .read(|fs| statfs(fs, fs.info.devices.len()))
                .unwrap_or(self.statfs),
            Engine::ReadOnly(_) => self.statfs,
        };
        let mut o = Out::with_capacity(80);
        o.u64(s.blocks)
            .u64(s.bfree)
            .u64(s.bavail)
            .u64(s.files)
            .u64(s.ffree)
            .u32(s.bsize)
            .u32(s.namelen)
            .u32(s.frsize)
            .u32(0)
            .zeros(24);
        reply.ok(&o.buf);
    }

    fn xattr_reply(value: &[u8], size: u32, reply: Reply<'_>) {
        if size == 0 {
            let mut o = Out::with_capacity(8);
            o.u32(value.len() as u32).u32(0);
            reply.ok(&o.buf)
        } else if value.len() > size as usize {
            reply.error(errno::ERANGE)
        } else {
            reply.ok(value)
        }
    }

    fn getxattr(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let (Some(size), Some(_)) = (a.u32(), a.u32()) else {
            return reply.error(errno::EINVAL);
        };
        let Some(name) = a.cstr() else {
            return reply.error(errno::EINVAL);
        };
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        match self.engine.read_metadata(|fs| fs.getxattr(node, name)) {
            Ok(Some(v)) => Self::xattr_reply(&v, size, reply),
            Ok(None) => reply.error(errno::ENODATA),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn listxattr(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let Some(size) = a.u32() else {
            return reply.error(errno::EINVAL);
        };
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        match self.engine.read_metadata(|fs| fs.xattrs(node)) {
            Ok(list) => {
                let mut names = Vec::new();
                for (n, _) in list {
                    names.extend_from_slice(&n);
                    names.push(0);
                }
                Self::xattr_reply(&names, size, reply)
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    /// access(2) (only asked for when the kernel does not check permissions itself:
    /// the mount uses default_permissions, so this is a fallback). Supplementary
    /// groups and ACLs are not considered here.
    fn access(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let Some(mask) = a.u32() else {
            return reply.error(errno::EINVAL);
        };
        if mask & 2 != 0 {
            return reply.error(errno::EROFS);
        }
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        let st = match self.engine.read(|fs| fs.stat(node)) {
            Ok(s) => s,
            Err(e) => return reply.error(e.errno()),
        };
        let want = mask & 5;
        let ok = if h.uid == 0 {
            want & 1 == 0 || st.mode & S_IFMT == S_IFDIR || st.mode & 0o111 != 0
        } else {
            let bits = if h.uid == st.uid {
                (st.mode >> 6) & 7
            } else if h.gid == st.gid {
                (st.mode >> 3) & 7
            } else {
                st.mode & 7
            };
            bits & want == want
        };
        if ok {
            reply.ok(&[])
        } else {
            reply.error(errno::EACCES)
        }
    }

    /// FS_IOC_GETFLAGS / FS_IOC_FSGETXATTR (lsattr and statx-attribute users) and,
    /// on a read-write mount, FS_IOC_SETFLAGS / FS_IOC_FSSETXATTR (chattr). The
    /// kernel sends these through its fileattr code with the argument's size
    /// (an int for the flags, a struct fsxattr), the input after the header and
    /// room for the output in `out_size`.
    fn ioctl(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let (Some(_fh), Some(_flags), Some(cmd), Some(_arg), Some(in_size), Some(out_size)) =
            (a.u64(), a.u32(), a.u32(), a.u64(), a.u32(), a.u32())
        else {
            return reply.error(errno::EINVAL);
        };
        if cmd == BTRFS_IOC_SYNC {
            if let Engine::ReadWrite(w) = &self.engine {
                if let Err(e) = w.commit() {
                    return reply.error(e);
                }
            }
            let mut o = Out::with_capacity(16);
            o.i32(0).u32(0).u32(0).u32(0);
            return reply.ok(&o.buf);
        }
        let input = a.rest().get(..in_size as usize).unwrap_or_default();
        if cmd == crate::atime::UBTRFS_IOC_REMOUNT || cmd == crate::settings::UBTRFS_IOC_SET_OPTIONS
        {
            let r = if cmd == crate::atime::UBTRFS_IOC_REMOUNT {
                self.remounted(h, input)
            } else {
                self.set_options(h, input)
            };
            return match r {
                Ok(()) => {
                    let mut o = Out::with_capacity(16);
                    o.i32(0).u32(0).u32(0).u32(0);
                    reply.ok(&o.buf)
                }
                Err(e) => reply.error(e),
            };
        }
        // The btrfs ioctls that answer with bytes: (result, the bytes copied back,
        // at most `out_size`).
        let answered = if crate::balance_ops::is_balance_ioctl(cmd) {
            Some(self.balance_ioctl(h, cmd, input))
        } else if crate::quota_ops::is_quota_ioctl(cmd) {
            Some(self.quota_ioctl(h, cmd, input))
        } else if cmd == crate::subvol_ops::BTRFS_IOC_INO_LOOKUP {
            Some(self.ino_lookup(h, input))
        } else if cmd == crate::subvol_props::UBTRFS_IOC_SUBVOL_PROP {
            Some(self.subvol_prop_ioctl(h, input))
        } else if cmd == crate::dedupe_ops::UBTRFS_IOC_DEDUPE {
            Some(self.dedupe_ioctl(h, input))
        } else if cmd == crate::cp_ops::UBTRFS_IOC_CP {
            // The kernel is told of the new name through the channel.
            Some(self.cp_ioctl(h, input, reply.channel()))
        } else if cmd == FS_IOC_GETFSLABEL || cmd == FS_IOC_SETFSLABEL {
            Some(self.fslabel_ioctl(h, cmd, input))
        } else if cmd == FITRIM {
            Some(self.fitrim(h, input))
        } else {
            None
        };
        if let Some(r) = answered {
            return match r {
                Ok(data) => {
                    let n = data.len().min(out_size as usize);
                    let mut o = Out::with_capacity(16);
                    o.i32(0).u32(0).u32(0).u32(0);
                    reply.ok_parts(&[&o.buf, &data[..n]]);
                }
                Err(e) => reply.error(e),
            };
        }
        if crate::subvol_ops::is_subvol_ioctl(cmd) {
            let ch = reply.channel();
            match self.subvol_ioctl(h, cmd, input, ch) {
                Ok(name) => {
                    // The kernel must forget the name (a "not there" it may have
                    // cached) before the caller learns of the new subvolume: a
                    // lookup right after the ioctl (`btrfs subvolume snapshot`, then
                    // `ls`) would else be answered ENOENT from the cache. Through
                    // /dev/fuse the answer is handed over as it is written.
                    crate::subvol_ops::invalidate_soon(ch, vec![(h.nodeid, name)], Vec::new());
                    // fuse_ioctl_out: result, flags, in_iovs, out_iovs.
                    let mut o = Out::with_capacity(16);
                    o.i32(0).u32(0).u32(0).u32(0);
                    reply.ok(&o.buf);
                }
                Err(e) => reply.error(e),
            }
            return;
        }
        let node = match self.node(h.nodeid) {
            Ok(k) => k.node,
            Err(e) => return reply.error(e),
        };
        // The kernel's made-up ino-2 directory has no btrfs ioctls.
        if node.is_placeholder() {
            return reply.error(errno::ENOTTY);
        }
        let data: Vec<u8> = match cmd {
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS | FS_IOC_FSGETXATTR => {
                let st = match self.engine.read(|fs| fs.stat(node)) {
                    Ok(s) => s,
                    Err(e) => return reply.error(e.errno()),
                };
                let fl = inode_flags_to_fsflags(st.flags);
                if cmd == FS_IOC_FSGETXATTR {
                    let mut o = Out::with_capacity(28);
                    o.u32(fsflags_to_xflags(fl))
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .u32(0)
                        .zeros(8);
                    o.buf
                } else {
                    (fl as u64).to_ne_bytes().to_vec()
                }
            }
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS | FS_IOC_FSSETXATTR => {
                let Engine::ReadWrite(w) = &self.engine else {
                    return reply.error(errno::EROFS);
                };
                if let Err(e) = self.setflags(w, h, node, cmd, input) {
                    return reply.error(e);
                }
                // The change moved ctime, and the kernel does not drop the attributes
                // it caches after an ioctl: `chattr +i f; stat f` would show the old.
                crate::reply::inval_inode(reply.channel(), h.nodeid, -1);
                Vec::new()
            }
            _ => return reply.error(errno::ENOTTY),
        };
        let n = data.len().min(out_size as usize);
        let mut o = Out::with_capacity(16);
        o.i32(0).u32(0).u32(0).u32(0);
        reply.ok_parts(&[&o.buf, &data[..n]]);
    }

    /// FS_IOC_GETFSLABEL: the label's 256 bytes. FS_IOC_SETFSLABEL: a new label
    /// (NUL-terminated within the 256 bytes, else EINVAL), committed at once, as the
    /// kernel's btrfs_ioctl_set_fslabel does.
    fn fslabel_ioctl(&self, h: &InHeader, cmd: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
        if cmd == FS_IOC_GETFSLABEL {
            return Ok(self.engine.read(|fs| fs.info.sb.label_raw.to_vec()));
        }
        admin_only(h)?;
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        let raw = input.get(..256).ok_or(errno::EINVAL)?;
        let end = raw.iter().position(|&b| b == 0).ok_or(errno::EINVAL)?;
        w.change("setfslabel", |t| t.set_label(&raw[..end]))?;
        w.commit()?;
        Ok(Vec::new())
    }

    /// FITRIM (fstrim): the free space of the block groups in the range and all
    /// unallocated space is discarded (holes punched in an image file); the range
    /// comes back with `len` set to the bytes trimmed, as btrfs_ioctl_fitrim.
    fn fitrim(&self, h: &InHeader, input: &[u8]) -> Result<Vec<u8>, i32> {
        admin_only(h)?;
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        let field = |i: usize| -> Result<u64, i32> {
            input
                .get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_ne_bytes)
                .ok_or(errno::EINVAL)
        };
        let (start, len, minlen) = (field(0)?, field(1)?, field(2)?);
        let trimmed = w.trim(start, len, minlen)?;
        let mut o = Vec::with_capacity(24);
        for v in [start, trimmed, minlen] {
            o.extend_from_slice(&v.to_ne_bytes());
        }
        Ok(o)
    }

    /// SEEK_DATA / SEEK_HOLE: holes and prealloc extents read as zeros and count as
    /// holes, as on the kernel.
    fn lseek(&self, h: &InHeader, mut a: Args<'_>, reply: Reply<'_>) {
        let (Some(fh), Some(offset), Some(whence)) = (a.u64(), a.u64(), a.u32()) else {
            return reply.error(errno::EINVAL);
        };
        let f = match self.file(h, fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let size = f.inode.size;
        if offset >= size {
            return reply.error(errno::ENXIO);
        }
        let mut found: Option<u64> = None;
        let mut pos = offset;
        let r = self.engine.read(|fs| {
            fs.for_each_extent(f.node, offset, size, |fe| {
                let start = fe.file_offset;
                let end = start.saturating_add(fe.len());
                let data = !fe.is_hole_or_prealloc();
                match whence {
                    SEEK_DATA => {
                        if data && end > offset {
                            found = Some(start.max(offset));
                            return Ok(false);
                        }
                    }
                    _ => {
                        if start > pos || !data {
                            return Ok(false);
                        }
                        pos = pos.max(end);
                    }
                }
                Ok(true)
            })
        });
        if let Err(e) = r {
            return reply.error(e.errno());
        }
        let res = match whence {
            SEEK_DATA => match found {
                Some(p) if p < size => p,
                _ => return reply.error(errno::ENXIO),
            },
            SEEK_HOLE => pos.min(size),
            _ => return reply.error(errno::EINVAL),
        };
        let mut o = Out::with_capacity(8);
        o.u64(res);
        reply.ok(&o.buf);
    }
}

/// The read-only subvolumes (ROOT_SUBVOL_RDONLY) of a filesystem, the top level
/// included.
fn read_only_subvolumes(engine: &Engine) -> Result<HashSet<u64>, Error> {
    engine.read(|fs| {
        let mut set: HashSet<u64> = fs
            .subvolumes()?
            .into_iter()
            .filter(|s| s.readonly)
            .map(|s| s.id)
            .collect();
        if fs.subvol_root_item(FS_TREE_OBJECTID)?.flags & ROOT_SUBVOL_RDONLY != 0 {
            set.insert(FS_TREE_OBJECTID);
        }
        Ok(set)
    })
}

/// FT_* (directory entry type) to DT_* (readdir d_type).
fn dtype(ft: u8) -> u32 {
    match ft {
        FT_REG_FILE => 8,
        FT_DIR => 4,
        FT_CHRDEV => 2,
        FT_BLKDEV => 6,
        FT_FIFO => 1,
        FT_SOCK => 12,
        FT_SYMLINK => 10,
        _ => 0,
    }
}

/// A read-only mount opened with salvage reads a lost tree block as empty: a file
/// read (or readlink) that met one since `before` (on this thread) would return
/// holes or zeros where data was, so it fails with EIO, as the kernel's read does;
/// listings and stat go on with what is left.
fn lost_since(before: u64, what: &str) -> ubtrfs_core::Result<()> {
    if ubtrfs_core::losses_met_by_this_thread() == before {
        return Ok(());
    }
    Err(Error::corrupt(format!(
        "{what}: in a lost tree block, or damaged in every copy (see the lost-block log)"
    )))
}

/// The generation the kernel keeps for node `id` (its i_generation, which file
/// handles carry): the inode's btrfs generation, and 0 for the mountpoint's root,
/// which the kernel makes itself with generation 0 (a different value would make
/// it take its root for a stale inode).
pub(crate) fn entry_generation(id: u64, st: &Stat) -> u64 {
    if id == abi::ROOT_ID {
        0
    } else {
        st.generation
    }
}

/// `fs.stat(node)`; in a salvage open (the read-only mount), a subvolume's root
/// directory whose inode item is lost is shown as a stand-in
/// (a directory, mode 0755, owned by root, times zero) so that what is left of
/// its entries can still be listed, as `extract` restores them.
pub(crate) fn stat_salvaged(fs: &ubtrfs_core::Filesystem, node: Node) -> Result<Stat, Error> {
    match fs.stat(node) {
        Err(_) if fs.info.opts.salvage && node.ino == ubtrfs_core::format::FIRST_FREE_OBJECTID => {
            Ok(Stat {
                subvol: node.root,
                ino: node.ino,
                mode: ubtrfs_core::mode::S_IFDIR | 0o755,
                nlink: 1,
                uid: 0,
                gid: 0,
                rdev: 0,
                size: 0,
                blocks: 0,
                blksize: fs.info.sectorsize,
                atime: Default::default(),
                mtime: Default::default(),
                ctime: Default::default(),
                crtime: Default::default(),
                generation: 0,
                flags: 0,
            })
        }
        r => r,
    }
}
