//! Subvolume properties on a mounted ubtrfs filesystem: the read-only flag and the
//! default subvolume, asked of the mount's own process so `ubtrfs property` and
//! `ubtrfs subvolume set-default|get-default|sync|show` work on a mounted directory as on
//! an image (never a second writer). One private ioctl, UBTRFS_IOC_SUBVOL_PROP, whose
//! argument says which of six things to do; the changes are the engine's offline
//! ones (`Trans::set_subvolume_readonly`, `Trans::set_default_subvolume`), each
//! committed at once as the kernel's SUBVOL_SETFLAGS and DEFAULT_SUBVOL commit.
//!
//! Rules, the kernel's: the read-only flag is read and set on a subvolume's root
//! directory only (EINVAL elsewhere); setting it needs the owner of that directory
//! or CAP_FOWNER (inode_owner_or_capable); the default subvolume needs
//! CAP_SYS_ADMIN; a read-only mount is EROFS for both changes. btrfs-progs' own
//! rule for a received subvolume (making it writable clears received_uuid, only
//! when forced) is applied by the client, which reads the flag first.

use crate::abi::InHeader;
use crate::creds::Caller;
use crate::ops::{errno, Ops};
use crate::writer::Engine;
use ubtrfs_core::now;
use ubtrfs_core::tools::subvol_show::SubvolShow;
use ubtrfs_format::consts::{FIRST_FREE_OBJECTID, FS_TREE_OBJECTID, ROOT_SUBVOL_RDONLY};

/// Size of the argument: a 64-byte header, then a path (NUL-terminated).
pub(crate) const PROP_ARG_BYTES: usize = 4096;

/// `_IOWR('u', 3, 4096)`.
pub(crate) const UBTRFS_IOC_SUBVOL_PROP: u32 =
    (3 << 30) | ((PROP_ARG_BYTES as u32) << 16) | ((b'u' as u32) << 8) | 3;

/// Reads the read-only flag of the subvolume whose root the ioctl is issued on;
/// answers it in `value`, and [`PROP_RECEIVED`] in `flags` when the subvolume has
/// a received_uuid.
const OP_GET_RO: u32 = 1;
/// Sets the read-only flag to `value` (0 or 1); [`PROP_FORCE`]: a received
/// subvolume made writable loses its received_uuid.
const OP_SET_RO: u32 = 2;
/// Makes subvolume `value` the default (0: the subvolume of the directory the
/// ioctl is issued on).
const OP_SET_DEFAULT: u32 = 3;
/// Answers the default subvolume: id in `value`, then its generation and top
/// level, its path at byte 64 (empty for the top level).
const OP_GET_DEFAULT: u32 = 4;

/// Runs the cleaner until every deleted subvolume's tree is dropped (`subvolume
/// sync`); answers how many went in `value` and their ids as words from byte 64.
const OP_SYNC: u32 = 5;

/// What `subvolume show` prints of the subvolume whose root the ioctl is issued
/// on, its snapshots from number `value` on (as many as fit; the client asks again
/// for the rest): the layout of [`show_answer`].
const OP_SHOW: u32 = 6;

/// In `flags` of [`OP_SET_RO`]: clear received_uuid when making it writable.
const PROP_FORCE: u32 = 1;
/// In `flags` answered by [`OP_GET_RO`]: the subvolume was received.
const PROP_RECEIVED: u32 = 2;

fn word(b: &[u8], at: usize) -> Result<u64, i32> {
    let s = b.get(at..at + 8).ok_or(errno::EINVAL)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_ne_bytes(a))
}

fn half(b: &[u8], at: usize) -> Result<u32, i32> {
    let s = b.get(at..at + 4).ok_or(errno::EINVAL)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Ok(u32::from_ne_bytes(a))
}

/// The answer: the argument's layout, `op` and `flags`, then three words, then a
/// path at byte 64.
fn answer(op: u32, flags: u32, words: [u64; 3], path: &[u8]) -> Result<Vec<u8>, i32> {
    if 64 + path.len() >= PROP_ARG_BYTES {
        return Err(errno::ENAMETOOLONG);
    }
    let mut o = vec![0u8; PROP_ARG_BYTES];
    o[..4].copy_from_slice(&op.to_ne_bytes());
    o[4..8].copy_from_slice(&flags.to_ne_bytes());
    for (i, w) in words.iter().enumerate() {
        o[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_ne_bytes());
    }
    o[64..64 + path.len()].copy_from_slice(path);
    Ok(o)
}

/// Where [`OP_SHOW`]'s answer has its words (13 from byte 8), the three uuids
/// (byte 112), and the NUL-terminated paths: the subvolume's own (empty for the
/// top level), then its snapshots' (byte 160 on).
const SHOW_UUIDS_AT: usize = 112;
const SHOW_PATHS_AT: usize = 160;

/// [`OP_SHOW`]'s answer: words id, generation, otransid, top level, root flags,
/// stransid, rtransid, otime, rtime, quotas on, snapshots in all, snapshots here,
/// has a path; the uuid, parent uuid and received uuid; the paths.
fn show_answer(s: &SubvolShow, first: usize) -> Result<Vec<u8>, i32> {
    let i = &s.item;
    let mut o = vec![0u8; PROP_ARG_BYTES];
    o[..4].copy_from_slice(&OP_SHOW.to_ne_bytes());
    for (k, u) in [i.uuid, i.parent_uuid, i.received_uuid].iter().enumerate() {
        o[SHOW_UUIDS_AT + 16 * k..SHOW_UUIDS_AT + 16 * k + 16].copy_from_slice(u);
    }
    let own = s.path.as_deref().unwrap_or("").as_bytes();
    let mut at = SHOW_PATHS_AT;
    if at + own.len() + 1 > o.len() {
        return Err(errno::ENAMETOOLONG);
    }
    o[at..at + own.len()].copy_from_slice(own);
    at += own.len() + 1;
    let mut here = 0u64;
    for p in s.snapshots.iter().skip(first) {
        let p = p.as_bytes();
        if at + p.len() + 1 > o.len() {
            break;
        }
        o[at..at + p.len()].copy_from_slice(p);
        at += p.len() + 1;
        here += 1;
    }
    if here == 0 && first < s.snapshots.len() {
        // One path longer than the whole answer.
        return Err(errno::ENAMETOOLONG);
    }
    let words = [
        s.id,
        i.generation,
        i.otransid,
        s.top_level,
        i.flags,
        i.stransid,
        i.rtransid,
        i.otime.sec as u64,
        i.rtime.sec as u64,
        u64::from(s.quota_enabled),
        s.snapshots.len() as u64,
        here,
        u64::from(s.path.is_some()),
    ];
    for (k, w) in words.iter().enumerate() {
        o[8 + 8 * k..16 + 8 * k].copy_from_slice(&w.to_ne_bytes());
    }
    Ok(o)
}

impl Ops {
    /// UBTRFS_IOC_SUBVOL_PROP on node `h.nodeid`.
    pub(crate) fn subvol_prop_ioctl(&self, h: &InHeader, input: &[u8]) -> Result<Vec<u8>, i32> {
        let (op, flags, value) = (half(input, 0)?, half(input, 4)?, word(input, 8)?);
        let node = self.node(h.nodeid)?.node;
        let subvol_root = || {
            if node.ino == FIRST_FREE_OBJECTID && !node.is_placeholder() {
                Ok(node)
            } else {
                Err(errno::EINVAL)
            }
        };
        match op {
            OP_GET_RO => {
                let n = subvol_root()?;
                let item = self
                    .engine
                    .read(|fs| fs.subvol_root_item(n.root))
                    .map_err(|e| e.errno())?;
                let received = if item.received_uuid != [0; 16] {
                    PROP_RECEIVED
                } else {
                    0
                };
                let ro = u64::from(item.flags & ROOT_SUBVOL_RDONLY != 0);
                answer(op, received, [ro, 0, 0], &[])
            }
            OP_SET_RO => {
                let n = subvol_root()?;
                let Engine::ReadWrite(w) = &self.engine else {
                    return Err(errno::EROFS);
                };
                let st = w.read(|fs| fs.stat(n)).map_err(|e| e.errno())?;
                if !Caller::new(h).owner_or_capable(st.uid) {
                    return Err(errno::EPERM);
                }
                let ro = match value {
                    0 => false,
                    1 => true,
                    _ => return Err(errno::EINVAL),
                };
                let force = flags & PROP_FORCE != 0;
                w.change("property set ro", |t| {
                    t.set_subvolume_readonly(n.root, ro, force, now())
                })?;
                w.commit()?;
                if ro {
                    self.add_read_only_subvol(n.root);
                } else {
                    self.remove_read_only_subvol(n.root);
                }
                answer(op, 0, [u64::from(ro), 0, 0], &[])
            }
            OP_SET_DEFAULT => {
                let Engine::ReadWrite(w) = &self.engine else {
                    return Err(errno::EROFS);
                };
                if !crate::subvol_ops::subvol_admin(h, &Caller::new(h)) {
                    return Err(errno::EPERM);
                }
                let id = if value == 0 { node.root } else { value };
                w.change("subvolume set-default", |t| t.set_default_subvolume(id))?;
                w.commit()?;
                answer(op, 0, [id, 0, 0], &[])
            }
            OP_GET_DEFAULT => {
                let (id, gen, top, path) = self
                    .engine
                    .read(|fs| -> ubtrfs_core::Result<(u64, u64, u64, Vec<u8>)> {
                        let id = fs.default_subvolume()?;
                        if id == FS_TREE_OBJECTID {
                            return Ok((id, 0, 0, Vec::new()));
                        }
                        let s = fs
                            .subvolumes()?
                            .into_iter()
                            .find(|s| s.id == id)
                            .ok_or_else(|| {
                                ubtrfs_core::Error::NotFound(format!(
                                    "default subvolume {id} is not linked anywhere"
                                ))
                            })?;
                        Ok((id, s.gen, s.top_level, s.path.into_bytes()))
                    })
                    .map_err(|e| e.errno())?;
                answer(op, 0, [id, gen, top], &path)
            }
            OP_SYNC => {
                let Engine::ReadWrite(w) = &self.engine else {
                    // Nothing is dropped on a read-only mount (as the kernel's).
                    return answer(op, 0, [0, 0, 0], &[]);
                };
                let before = w.dead_roots()?;
                w.clean();
                let after = w.dead_roots()?;
                if w.is_aborted() {
                    return Err(errno::EIO);
                }
                let gone: Vec<u64> = before
                    .into_iter()
                    .filter(|id| !after.contains(id))
                    .collect();
                let ids: Vec<u8> = gone
                    .iter()
                    .take(400)
                    .flat_map(|id| id.to_ne_bytes())
                    .collect();
                answer(op, 0, [gone.len() as u64, 0, 0], &ids)
            }
            OP_SHOW => {
                let n = subvol_root()?;
                let s = self
                    .engine
                    .read(|fs| ubtrfs_core::tools::subvol_show::subvol_show(fs, n.root))
                    .map_err(|e| e.errno())?;
                show_answer(&s, usize::try_from(value).map_err(|_| errno::EINVAL)?)
            }
            _ => Err(errno::EINVAL),
        }
    }
}

/// The client side, for `ubtrfs` commands given a mounted directory.
pub mod client {
    use std::fs::File;
    use std::io;

    /// What the mount answered.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct PropAnswer {
        /// The flag or id asked for.
        pub value: u64,
        /// Generation (get-default).
        pub gen: u64,
        /// Top level (get-default).
        pub top_level: u64,
        /// Path (get-default).
        pub path: String,
        /// The subvolume was received (read-only flag asked).
        pub received: bool,
    }

    /// One UBTRFS_IOC_SUBVOL_PROP: the argument as the mount answered it.
    fn raw(f: &File, op: u32, flags: u32, value: u64) -> io::Result<Vec<u8>> {
        let mut a = vec![0u8; super::PROP_ARG_BYTES];
        a[..4].copy_from_slice(&op.to_ne_bytes());
        a[4..8].copy_from_slice(&flags.to_ne_bytes());
        a[8..16].copy_from_slice(&value.to_ne_bytes());
        crate::subvol_ops::client::ubtrfs_ioctl(
            f,
            super::UBTRFS_IOC_SUBVOL_PROP,
            &mut a,
            "btrfs-progs",
        )?;
        Ok(a)
    }

    /// Word `i` of an answer: 0 to 2 the three after the header, 7 on the ids a
    /// sync answers (from byte 64).
    fn word(a: &[u8], i: usize) -> u64 {
        crate::subvol_ops::client::answer_word(a, i + 1)
    }

    fn call(f: &File, op: u32, flags: u32, value: u64) -> io::Result<PropAnswer> {
        let a = raw(f, op, flags, value)?;
        let w = |i: usize| word(&a, i);
        let mut fl = [0u8; 4];
        fl.copy_from_slice(&a[4..8]);
        let end = a[64..]
            .iter()
            .position(|&c| c == 0)
            .map_or(a.len(), |p| 64 + p);
        Ok(PropAnswer {
            value: w(0),
            gen: w(1),
            top_level: w(2),
            path: String::from_utf8_lossy(&a[64..end]).into_owned(),
            received: u32::from_ne_bytes(fl) & super::PROP_RECEIVED != 0,
        })
    }

    /// The read-only flag of the subvolume whose root directory `f` is.
    pub fn get_readonly(f: &File) -> io::Result<PropAnswer> {
        call(f, super::OP_GET_RO, 0, 0)
    }

    /// Sets the read-only flag of the subvolume whose root directory `f` is;
    /// `force`: a received subvolume made writable loses its received_uuid.
    pub fn set_readonly(f: &File, ro: bool, force: bool) -> io::Result<()> {
        let flags = if force { super::PROP_FORCE } else { 0 };
        call(f, super::OP_SET_RO, flags, u64::from(ro)).map(|_| ())
    }

    /// Makes subvolume `id` the default (0: the subvolume `f` is in).
    pub fn set_default(f: &File, id: u64) -> io::Result<()> {
        call(f, super::OP_SET_DEFAULT, 0, id).map(|_| ())
    }

    /// The default subvolume of the mount `f` is in.
    pub fn get_default(f: &File) -> io::Result<PropAnswer> {
        call(f, super::OP_GET_DEFAULT, 0, 0)
    }

    /// What `subvolume show` prints of the subvolume whose root directory `f` is
    /// (EINVAL for anything else), asked of the mount's process.
    pub fn show(f: &File) -> io::Result<super::SubvolShow> {
        use super::{SHOW_PATHS_AT, SHOW_UUIDS_AT};
        let mut s = super::SubvolShow::default();
        loop {
            let a = raw(f, super::OP_SHOW, 0, s.snapshots.len() as u64)?;
            let w = |i: usize| word(&a, i);
            let uuid = |k: usize| {
                let mut u = [0u8; 16];
                u.copy_from_slice(&a[SHOW_UUIDS_AT + 16 * k..SHOW_UUIDS_AT + 16 * k + 16]);
                u
            };
            s.id = w(0);
            s.item.generation = w(1);
            s.item.otransid = w(2);
            s.top_level = w(3);
            s.item.flags = w(4);
            s.item.stransid = w(5);
            s.item.rtransid = w(6);
            s.item.otime.sec = w(7) as i64;
            s.item.rtime.sec = w(8) as i64;
            s.quota_enabled = w(9) != 0;
            let (total, here) = (w(10) as usize, w(11) as usize);
            (s.item.uuid, s.item.parent_uuid, s.item.received_uuid) = (uuid(0), uuid(1), uuid(2));
            let mut paths = a[SHOW_PATHS_AT..]
                .split(|&b| b == 0)
                .map(|p| String::from_utf8_lossy(p).into_owned());
            let own = paths.next().unwrap_or_default();
            s.path = (w(12) != 0).then_some(own);
            s.snapshots.extend(paths.take(here));
            if here == 0 || s.snapshots.len() >= total {
                return Ok(s);
            }
        }
    }

    /// Has the mount's cleaner drop every deleted subvolume now; the ids dropped.
    pub fn sync(f: &File) -> io::Result<Vec<u64>> {
        let a = raw(f, super::OP_SYNC, 0, 0)?;
        // The ids start at byte 64: word 7 on.
        let n = (word(&a, 0) as usize).min(400);
        Ok((0..n).map(|i| word(&a, 7 + i)).collect())
    }
}
