//! `ubtrfs cp` on a mounted ubtrfs filesystem: the mount's own process runs the
//! engine's copy (`ubtrfs_core::tools::cp`, the offline command's) on its running
//! transaction and commits, so the command works on a mounted directory as on an
//! image, `--reflink=always` included (FICLONE never reaches a FUSE server: the
//! kernel's FUSE module has no remap_file_range; copy_file_range does, and shares,
//! but cannot say "share or fail"). A private ioctl, UBTRFS_IOC_CP, issued on a
//! directory of the mount with both paths relative to it.
//!
//! Rules: CAP_SYS_ADMIN or the user who mounted (the copy is made as cp run by
//! root makes it); EROFS on a read-only mount or into a read-only snapshot. An
//! existing destination is overwritten as GNU cp does (a file in place, a directory
//! merged into). The kernel caches what the copy changes behind its back, so before
//! answering the server has it forget every name the copy made or replaced in a
//! directory that existed, and the pages and attributes of every file overwritten
//! in place (NOTIFY_INVAL_ENTRY, NOTIFY_INVAL_INODE). The client writes back the
//! kernel's dirty pages of the filesystem first (syncfs): a page of a shared
//! mapping still dirty in the kernel would otherwise be written over the copy when
//! it is dropped.

use crate::abi::InHeader;
use crate::channel::Channel;
use crate::creds::Caller;
use crate::nodes::NodeKey;
use crate::ops::{errno, Ops};
use crate::writer::Engine;
use ubtrfs_core::tools::cp::{cp_paths, CpOptions, CpReport, ReflinkMode};
use ubtrfs_core::{Filesystem, Node};

/// Size of the argument: a 64-byte header, then the source and the destination
/// paths, each NUL-terminated.
pub(crate) const CP_ARG_BYTES: usize = 4096;

/// `_IOWR('u', 5, 4096)`.
pub(crate) const UBTRFS_IOC_CP: u32 =
    (3 << 30) | ((CP_ARG_BYTES as u32) << 16) | ((b'u' as u32) << 8) | 5;

/// In the header's flags: copy directories.
const CP_RECURSIVE: u32 = 1;
/// In the header's flags: keep owner, mode, times, xattrs.
const CP_ARCHIVE: u32 = 2;

/// Where the answer's warnings start (NUL-terminated, as many as fit).
const WARNINGS_AT: usize = 64;

/// Resolves `rel` below `from`: no `..` (a path stays below the directory the ioctl
/// is issued on).
pub(crate) fn resolve_below(fs: &Filesystem, from: Node, rel: &[u8]) -> ubtrfs_core::Result<Node> {
    let shown = || String::from_utf8_lossy(rel).into_owned();
    let mut cur = from;
    for comp in rel.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => continue,
            b".." => {
                return Err(ubtrfs_core::Error::Invalid(format!(
                    "{}: `..` leaves the directory",
                    shown()
                )))
            }
            _ => {}
        }
        cur = fs
            .lookup(cur, comp)?
            .ok_or_else(|| ubtrfs_core::Error::NotFound(shown()))?
            .node;
    }
    Ok(cur)
}

fn half(b: &[u8], at: usize) -> Result<u32, i32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(errno::EINVAL)
}

impl Ops {
    /// UBTRFS_IOC_CP on directory `h.nodeid`.
    pub(crate) fn cp_ioctl(
        &self,
        h: &InHeader,
        input: &[u8],
        ch: &Channel,
    ) -> Result<Vec<u8>, i32> {
        if !crate::subvol_ops::subvol_admin(h, &Caller::new(h)) {
            return Err(errno::EPERM);
        }
        let (flags, mode) = (half(input, 0)?, half(input, 4)?);
        let reflink = match mode {
            0 => ReflinkMode::Auto,
            1 => ReflinkMode::Always,
            2 => ReflinkMode::Never,
            _ => return Err(errno::EINVAL),
        };
        let mut parts = input.get(64..).ok_or(errno::EINVAL)?.splitn(3, |&b| b == 0);
        let (Some(src), Some(dest), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(errno::EINVAL);
        };
        let (src, dest) = (
            std::str::from_utf8(src).map_err(|_| errno::EINVAL)?,
            std::str::from_utf8(dest).map_err(|_| errno::EINVAL)?,
        );
        let opts = CpOptions {
            reflink,
            archive: flags & CP_ARCHIVE != 0,
            recursive: flags & CP_RECURSIVE != 0,
        };
        let from = self.node(h.nodeid)?.node;
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        let report = w.exclusive("cp", true, |t| {
            let resolve = |fs: &Filesystem, p: &str| resolve_below(fs, from, p.as_bytes());
            cp_paths(t, &resolve, src, dest, &opts)
        })?;
        // The kernel may hold "no such name" or the old inode for a name, the old
        // size and times of a directory, the old pages of an overwritten file.
        let id = |n: &Node| self.nodes.lasting_id(NodeKey::new(*n, 0));
        let names = report
            .changed_names
            .iter()
            .filter_map(|(dir, name)| Some((id(dir)?, name.clone())))
            .collect();
        let inodes = report.rewritten.iter().filter_map(id).collect();
        crate::subvol_ops::invalidate_soon(ch, names, inodes);
        Ok(encode(&report))
    }
}

fn encode(r: &CpReport) -> Vec<u8> {
    let mut o = vec![0u8; CP_ARG_BYTES];
    o[..8].copy_from_slice(&r.shared_bytes.to_ne_bytes());
    o[8..16].copy_from_slice(&r.copied_bytes.to_ne_bytes());
    let mut at = WARNINGS_AT;
    let mut n = 0u64;
    for w in &r.warnings {
        if at + w.len() + 1 > o.len() {
            break;
        }
        o[at..at + w.len()].copy_from_slice(w.as_bytes());
        at += w.len() + 1;
        n += 1;
    }
    o[16..24].copy_from_slice(&n.to_ne_bytes());
    o
}

/// The client side, for `ubtrfs cp` given a mounted directory.
pub mod client {
    use super::*;
    use std::fs::File;
    use std::io;

    /// Copies `src` to `dest` (both relative to the directory `dir`) through the
    /// mount holding `dir`; what it did (the changed names and inodes are not
    /// answered).
    pub fn cp(dir: &File, src: &str, dest: &str, opts: &CpOptions) -> io::Result<CpReport> {
        let mut a = vec![0u8; CP_ARG_BYTES];
        let mut flags = 0;
        if opts.recursive {
            flags |= CP_RECURSIVE;
        }
        if opts.archive {
            flags |= CP_ARCHIVE;
        }
        let mode: u32 = match opts.reflink {
            ReflinkMode::Auto => 0,
            ReflinkMode::Always => 1,
            ReflinkMode::Never => 2,
        };
        a[..4].copy_from_slice(&flags.to_ne_bytes());
        a[4..8].copy_from_slice(&mode.to_ne_bytes());
        let (s, d) = (src.trim_start_matches('/'), dest.trim_start_matches('/'));
        if s.contains('\0') || d.contains('\0') || 64 + s.len() + d.len() + 3 > a.len() {
            return Err(io::Error::from_raw_os_error(errno::ENAMETOOLONG));
        }
        a[64..64 + s.len()].copy_from_slice(s.as_bytes());
        let at = 64 + s.len() + 1;
        a[at..at + d.len()].copy_from_slice(d.as_bytes());
        crate::subvol_ops::client::syncfs(dir)?;
        crate::subvol_ops::client::ubtrfs_ioctl(dir, UBTRFS_IOC_CP, &mut a, "cp --reflink")?;
        let w = |i: usize| crate::subvol_ops::client::answer_word(&a, i);
        let n = w(2) as usize;
        let warnings = a[WARNINGS_AT..]
            .split(|&b| b == 0)
            .take(n)
            .map(|x| String::from_utf8_lossy(x).into_owned())
            .collect();
        Ok(CpReport {
            shared_bytes: w(0),
            copied_bytes: w(1),
            warnings,
            changed_names: Vec::new(),
            rewritten: Vec::new(),
        })
    }
}
