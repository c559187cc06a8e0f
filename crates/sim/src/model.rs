//! A model filesystem and a random workload for differential testing of the write
//! engine.
//!
//! * [`Model`]: an in-memory filesystem (directories, regular files, symlinks, special
//!   files; hard links share one node; modes, xattrs) with the semantics the engine's
//!   `Trans` API promises, including the errno each invalid call fails with.
//! * [`gen_op`]: a random [`Op`] for the current model state, driven by [`Rng`]: creates
//!   (files, directories, special files, symlinks), writes at aligned/unaligned offsets
//!   and past EOF, truncates, punch hole, zero range, fallocate, unlink, rmdir, renames
//!   (replacing, noreplace, exchange), hard links (up to INODE_EXTREF overflow), xattrs,
//!   chmod, bulk creates/unlinks that grow and shrink trees by levels, names with equal
//!   hashes, and a share of calls that must fail with a given errno.
//! * [`FsConfig`]: the features a run uses (node size, dup metadata, NO_HOLES, checksum
//!   algorithm, block group tree, compression), drawn from the seed.
//! * [`Harness`]: applies each op to a `Trans` and to the model, checks the touched paths
//!   through the engine's read API after every op, and the whole tree after commits
//!   ([`compare_tree`]), also on a freshly opened copy of the device ([`SparseMem`]
//!   makes copies cheap).
//! * [`run_seed`] runs one seeded workload; [`replay`] reruns recorded [`Step`]s and
//!   [`minimize`] shrinks a failing sequence to a short reproduction.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::sync::Arc;

use ubtrfs_compress::Compression;
use ubtrfs_core::dev::Device;
use ubtrfs_core::format::csum::CsumType;
use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::fs::{Filesystem, Node, S_IFDIR, S_IFMT, S_IFREG};
use ubtrfs_core::inode::kernel_rdev_to_user;
use ubtrfs_core::inode_ops::NewInode;
use ubtrfs_core::mkfs::{make_filesystem, MkfsOptions};
use ubtrfs_core::{Error, FsInfo, OpenOptions, Trans};

use crate::host::btrfs_check_image;
use crate::rng::Rng;

/// The top-level subvolume and its root directory.
pub const FS_TREE: u64 = 5;
pub const TOP_DIR: u64 = 256;

pub const ENOENT: i32 = 2;
pub const EEXIST: i32 = 17;
pub const ENOTDIR: i32 = 20;
pub const EISDIR: i32 = 21;
pub const EINVAL: i32 = 22;
pub const ENOSPC: i32 = 28;
pub const ENOTEMPTY: i32 = 39;
pub const EOPNOTSUPP: i32 = 95;

/// Identity of a model node (survives renames; shared by hard links).
pub type Id = u64;
/// The model's root directory.
pub const ROOT: Id = 0;

/// Largest file the workload grows (keeps data well inside a small device).
pub const FILE_SIZE_MAX: u64 = 768 << 10;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir(BTreeMap<Vec<u8>, Id>),
    File(Vec<u8>),
    Symlink(Vec<u8>),
    /// fifo, socket, character or block device (mode says which); kernel rdev.
    Special(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MNode {
    pub kind: Kind,
    /// Full mode, type bits included.
    pub mode: u32,
    /// Number of names (directories: always 1, as btrfs keeps them).
    pub nlink: u32,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl MNode {
    fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Dir(_))
    }
    fn entries(&self) -> Option<&BTreeMap<Vec<u8>, Id>> {
        match &self.kind {
            Kind::Dir(e) => Some(e),
            _ => None,
        }
    }
}

/// The model filesystem: nodes by identity, directories map names to identities.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub nodes: BTreeMap<Id, MNode>,
    next_id: Id,
    /// Largest item a leaf holds (nodesize - header - item header): bounds xattrs and
    /// symlink targets.
    pub max_item: usize,
}

impl Default for Model {
    fn default() -> Self {
        Model::new(0o40755, 16384)
    }
}

/// Shows a path with non-UTF-8 bytes escaped.
pub fn show(p: &[u8]) -> String {
    format!("/{}", p.escape_ascii())
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        let mut p = dir.to_vec();
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

/// (parent path, last component); the root has no parent.
fn split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.is_empty() {
        return None;
    }
    Some(match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&path[..0], path),
    })
}

impl Model {
    pub fn new(root_mode: u32, nodesize: u32) -> Model {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            ROOT,
            MNode {
                kind: Kind::Dir(BTreeMap::new()),
                mode: root_mode,
                nlink: 1,
                xattrs: BTreeMap::new(),
            },
        );
        Model {
            nodes,
            next_id: 1,
            max_item: nodesize as usize - 101 - 25,
        }
    }

    pub fn node(&self, id: Id) -> &MNode {
        &self.nodes[&id]
    }

    /// Resolves a path ("" is the root; no symlinks followed).
    pub fn resolve(&self, path: &[u8]) -> Option<Id> {
        let mut cur = ROOT;
        for comp in path.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            cur = *self.nodes[&cur].entries()?.get(comp)?;
        }
        Some(cur)
    }

    /// Every path, parents before children (the root is "").
    pub fn paths(&self) -> BTreeMap<Vec<u8>, Id> {
        let mut out = BTreeMap::new();
        let mut stack = vec![(Vec::new(), ROOT)];
        while let Some((p, id)) = stack.pop() {
            if let Some(e) = self.nodes[&id].entries() {
                for (name, &c) in e {
                    stack.push((join(&p, name), c));
                }
            }
            out.insert(p, id);
        }
        out
    }

    fn is_ancestor_or_self(&self, anc: Id, mut id: Id) -> bool {
        // Directories have one name, so walking up by search is unambiguous.
        loop {
            if id == anc {
                return true;
            }
            if id == ROOT {
                return false;
            }
            id = self
                .parent_of_dir(id)
                .expect("every directory but the root has a parent");
        }
    }

    fn parent_of_dir(&self, id: Id) -> Option<Id> {
        self.nodes
            .iter()
            .find(|(_, n)| n.entries().is_some_and(|e| e.values().any(|&c| c == id)))
            .map(|(&p, _)| p)
    }

    fn dir_mut(&mut self, id: Id) -> &mut BTreeMap<Vec<u8>, Id> {
        match &mut self.nodes.get_mut(&id).expect("dir exists").kind {
            Kind::Dir(e) => e,
            _ => panic!("model: {id} is not a directory"),
        }
    }

    fn lookup(&self, dir: &[u8], name: &[u8]) -> Result<(Id, Option<Id>), i32> {
        let d = self.resolve(dir).ok_or(ENOENT)?;
        let e = self.nodes[&d].entries().ok_or(ENOTDIR)?;
        Ok((d, e.get(name).copied()))
    }

    fn add(&mut self, dir: Id, name: &[u8], n: MNode) -> Id {
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, n);
        self.dir_mut(dir).insert(name.to_vec(), id);
        id
    }

    fn drop_name(&mut self, dir: Id, name: &[u8]) {
        let id = self.dir_mut(dir).remove(name).expect("name exists");
        let n = self.nodes.get_mut(&id).expect("node exists");
        n.nlink -= 1;
        if n.nlink == 0 || n.is_dir() {
            self.nodes.remove(&id);
        }
    }

    fn file_mut(&mut self, path: &[u8]) -> Result<&mut Vec<u8>, i32> {
        let id = self.resolve(path).ok_or(ENOENT)?;
        match &mut self.nodes.get_mut(&id).expect("resolved").kind {
            Kind::File(d) => Ok(d),
            _ => Err(EINVAL),
        }
    }

    /// Applies an operation; returns the new node's identity for creating ops, or
    /// the errno the engine must fail with (the model is then unchanged).
    pub fn apply(&mut self, op: &Op) -> Result<Option<Id>, i32> {
        match op {
            Op::Create {
                dir,
                name,
                mode,
                rdev,
            } => {
                let (d, existing) = self.lookup(dir, name)?;
                if existing.is_some() {
                    return Err(EEXIST);
                }
                let kind = match mode & S_IFMT {
                    S_IFDIR => Kind::Dir(BTreeMap::new()),
                    S_IFREG => Kind::File(Vec::new()),
                    0o020000 | 0o060000 => Kind::Special(*rdev),
                    _ => Kind::Special(0),
                };
                let n = MNode {
                    kind,
                    mode: *mode,
                    nlink: 1,
                    xattrs: BTreeMap::new(),
                };
                Ok(Some(self.add(d, name, n)))
            }
            Op::Symlink { dir, name, target } => {
                // Targets live in one inline extent of less than a sector.
                if target.len() >= 4096 || target.len() > self.max_item - 21 {
                    return Err(EINVAL);
                }
                let (d, existing) = self.lookup(dir, name)?;
                if existing.is_some() {
                    return Err(EEXIST);
                }
                let n = MNode {
                    kind: Kind::Symlink(target.clone()),
                    mode: 0o120777,
                    nlink: 1,
                    xattrs: BTreeMap::new(),
                };
                Ok(Some(self.add(d, name, n)))
            }
            Op::Write {
                path,
                offset,
                len,
                seed,
            } => {
                let data = write_data(*len, *seed);
                let f = self.file_mut(path)?;
                let off = *offset as usize;
                if f.len() < off + data.len() {
                    f.resize(off + data.len(), 0);
                }
                f[off..off + data.len()].copy_from_slice(&data);
                Ok(None)
            }
            Op::Truncate { path, size } => {
                self.file_mut(path)?.resize(*size as usize, 0);
                Ok(None)
            }
            Op::Fallocate {
                path,
                offset,
                len,
                keep_size,
            } => {
                let f = self.file_mut(path)?;
                let end = (offset + len) as usize;
                if !keep_size && end > f.len() {
                    f.resize(end, 0);
                }
                Ok(None)
            }
            Op::Unlink { dir, name } => {
                let (d, existing) = self.lookup(dir, name)?;
                let id = existing.ok_or(ENOENT)?;
                if self.nodes[&id].is_dir() {
                    return Err(EISDIR);
                }
                self.drop_name(d, name);
                Ok(None)
            }
            Op::Rmdir { dir, name } => {
                let (d, existing) = self.lookup(dir, name)?;
                let id = existing.ok_or(ENOENT)?;
                match self.nodes[&id].entries() {
                    None => return Err(ENOTDIR),
                    Some(e) if !e.is_empty() => return Err(ENOTEMPTY),
                    Some(_) => {}
                }
                self.drop_name(d, name);
                Ok(None)
            }
            Op::Rename {
                odir,
                oname,
                ndir,
                nname,
                noreplace,
            } => {
                let (od, src) = self.lookup(odir, oname)?;
                let src = src.ok_or(ENOENT)?;
                let (nd, dst) = self.lookup(ndir, nname)?;
                if od == nd && oname == nname {
                    return Ok(None);
                }
                let src_dir = self.nodes[&src].is_dir();
                if src_dir && self.is_ancestor_or_self(src, nd) {
                    return Err(EINVAL);
                }
                if let Some(dst) = dst {
                    if *noreplace {
                        return Err(EEXIST);
                    }
                    if dst == src {
                        return Ok(None);
                    }
                    match (src_dir, self.nodes[&dst].entries()) {
                        (true, Some(e)) if !e.is_empty() => return Err(ENOTEMPTY),
                        (true, Some(_)) | (false, None) => self.drop_name(nd, nname),
                        (true, None) => return Err(ENOTDIR),
                        (false, Some(_)) => return Err(EISDIR),
                    }
                }
                self.dir_mut(od).remove(oname.as_slice());
                self.dir_mut(nd).insert(nname.clone(), src);
                Ok(None)
            }
            Op::Link { src, dir, name } => {
                let id = self.resolve(src).ok_or(ENOENT)?;
                if self.nodes[&id].is_dir() {
                    return Err(EISDIR);
                }
                let (d, existing) = self.lookup(dir, name)?;
                if existing.is_some() {
                    return Err(EEXIST);
                }
                self.dir_mut(d).insert(name.clone(), id);
                self.nodes.get_mut(&id).expect("resolved").nlink += 1;
                Ok(None)
            }
            Op::SetXattr { path, name, value } => {
                let id = self.resolve(path).ok_or(ENOENT)?;
                if 30 + name.len() + value.len() > self.max_item {
                    return Err(ENOSPC);
                }
                self.nodes
                    .get_mut(&id)
                    .expect("resolved")
                    .xattrs
                    .insert(name.clone(), value.clone());
                Ok(None)
            }
            Op::RemoveXattr { path, name } => {
                let id = self.resolve(path).ok_or(ENOENT)?;
                match self
                    .nodes
                    .get_mut(&id)
                    .expect("resolved")
                    .xattrs
                    .remove(name)
                {
                    Some(_) => Ok(None),
                    None => Err(ENOENT),
                }
            }
            Op::Chmod { path, perm } => {
                let id = self.resolve(path).ok_or(ENOENT)?;
                let n = self.nodes.get_mut(&id).expect("resolved");
                n.mode = (n.mode & S_IFMT) | (perm & 0o7777);
                Ok(None)
            }
            Op::PunchHole { path, offset, len } => {
                let f = self.file_mut(path)?;
                let end = (offset + len).min(f.len() as u64) as usize;
                if (*offset as usize) < end {
                    f[*offset as usize..end].fill(0);
                }
                Ok(None)
            }
            Op::ZeroRange {
                path,
                offset,
                len,
                keep_size,
            } => {
                let f = self.file_mut(path)?;
                let end = (offset + len).min(f.len() as u64) as usize;
                if (*offset as usize) < end {
                    f[*offset as usize..end].fill(0);
                }
                if !keep_size && (offset + len) as usize > f.len() {
                    f.resize((offset + len) as usize, 0);
                }
                Ok(None)
            }
            Op::RenameExchange {
                adir,
                aname,
                bdir,
                bname,
            } => {
                let (ad, a) = self.lookup(adir, aname)?;
                let a = a.ok_or(ENOENT)?;
                let (bd, b) = self.lookup(bdir, bname)?;
                let b = b.ok_or(ENOENT)?;
                if a == b {
                    return Ok(None);
                }
                if self.nodes[&a].is_dir() && self.is_ancestor_or_self(a, bd)
                    || self.nodes[&b].is_dir() && self.is_ancestor_or_self(b, ad)
                {
                    return Err(EINVAL);
                }
                self.dir_mut(ad).insert(aname.clone(), b);
                self.dir_mut(bd).insert(bname.clone(), a);
                Ok(None)
            }
            Op::BulkCreate { dir, first, count } => {
                let d = self.resolve(dir).ok_or(ENOENT)?;
                for i in *first..first + count {
                    if self.nodes[&d]
                        .entries()
                        .ok_or(ENOTDIR)?
                        .contains_key(&bulk_name(i))
                    {
                        return Err(EEXIST);
                    }
                }
                for i in *first..first + count {
                    let mut xattrs = BTreeMap::new();
                    if i % 5 == 0 {
                        xattrs.insert(b"user.bulk".to_vec(), i.to_le_bytes().to_vec());
                    }
                    let n = MNode {
                        kind: Kind::File(bulk_data(i)),
                        mode: S_IFREG | 0o644,
                        nlink: 1,
                        xattrs,
                    };
                    self.add(d, &bulk_name(i), n);
                }
                Ok(None)
            }
            Op::BulkLink {
                src,
                dir,
                first,
                count,
            } => {
                let id = self.resolve(src).ok_or(ENOENT)?;
                if self.nodes[&id].is_dir() {
                    return Err(EISDIR);
                }
                let d = self.resolve(dir).ok_or(ENOENT)?;
                let e = self.nodes[&d].entries().ok_or(ENOTDIR)?;
                if (*first..first + count).any(|i| e.contains_key(&link_name(i))) {
                    return Err(EEXIST);
                }
                for i in *first..first + count {
                    self.dir_mut(d).insert(link_name(i), id);
                }
                self.nodes.get_mut(&id).expect("resolved").nlink += *count as u32;
                Ok(None)
            }
            Op::BulkUnlink { dir, keep_every } => {
                let d = self.resolve(dir).ok_or(ENOENT)?;
                let victims =
                    bulk_victims(self.nodes[&d].entries().ok_or(ENOTDIR)?, self, *keep_every);
                for v in victims {
                    self.drop_name(d, &v);
                }
                Ok(None)
            }
        }
    }
}

/// The bytes of a write: deterministic from (len, seed), so ops print compactly.
pub fn write_data(len: u64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; len as usize];
    match seed % 4 {
        // A repeated short pattern (zeros included now and then).
        0 => {
            let b = (r.next_u64() % 3) as u8 * 0x55;
            v.fill(b);
        }
        _ => r.fill_bytes(&mut v),
    }
    v
}

/// One filesystem operation, with paths relative to the top directory ("" = itself).
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    Create {
        dir: Vec<u8>,
        name: Vec<u8>,
        mode: u32,
        rdev: u64,
    },
    Symlink {
        dir: Vec<u8>,
        name: Vec<u8>,
        target: Vec<u8>,
    },
    Write {
        path: Vec<u8>,
        offset: u64,
        len: u64,
        seed: u64,
    },
    Truncate {
        path: Vec<u8>,
        size: u64,
    },
    Fallocate {
        path: Vec<u8>,
        offset: u64,
        len: u64,
        keep_size: bool,
    },
    Unlink {
        dir: Vec<u8>,
        name: Vec<u8>,
    },
    Rmdir {
        dir: Vec<u8>,
        name: Vec<u8>,
    },
    Rename {
        odir: Vec<u8>,
        oname: Vec<u8>,
        ndir: Vec<u8>,
        nname: Vec<u8>,
        noreplace: bool,
    },
    Link {
        src: Vec<u8>,
        dir: Vec<u8>,
        name: Vec<u8>,
    },
    SetXattr {
        path: Vec<u8>,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        path: Vec<u8>,
        name: Vec<u8>,
    },
    Chmod {
        path: Vec<u8>,
        perm: u32,
    },
    /// FALLOC_FL_PUNCH_HOLE.
    PunchHole {
        path: Vec<u8>,
        offset: u64,
        len: u64,
    },
    /// FALLOC_FL_ZERO_RANGE (with or without FALLOC_FL_KEEP_SIZE).
    ZeroRange {
        path: Vec<u8>,
        offset: u64,
        len: u64,
        keep_size: bool,
    },
    /// RENAME_EXCHANGE.
    RenameExchange {
        adir: Vec<u8>,
        aname: Vec<u8>,
        bdir: Vec<u8>,
        bname: Vec<u8>,
    },
    /// Creates files `bulk<first>`.. `bulk<first + count - 1>` in `dir`, file i with
    /// `i % 300` bytes of data and every fifth with an xattr (grows trees quickly).
    BulkCreate {
        dir: Vec<u8>,
        first: u64,
        count: u64,
    },
    /// Unlinks every non-directory entry of `dir` except every `keep_every`-th one.
    BulkUnlink {
        dir: Vec<u8>,
        keep_every: u64,
    },
    /// Adds `count` long names (`link_name`) for the non-directory `src` in `dir`:
    /// enough to overflow the INODE_REF item into INODE_EXTREFs on small nodes.
    BulkLink {
        src: Vec<u8>,
        dir: Vec<u8>,
        first: u64,
        count: u64,
    },
}

fn link_name(i: u64) -> Vec<u8> {
    let mut n = b"hardlink-".to_vec();
    n.resize(200, b'x');
    n.extend_from_slice(i.to_string().as_bytes());
    n
}

fn bulk_name(i: u64) -> Vec<u8> {
    format!("bulk{i}").into_bytes()
}

fn bulk_data(i: u64) -> Vec<u8> {
    (0..i % 300).map(|j| (i + j * 7) as u8).collect()
}

/// Names `BulkUnlink` removes from a directory listing (sorted).
fn bulk_victims(entries: &BTreeMap<Vec<u8>, Id>, m: &Model, keep_every: u64) -> Vec<Vec<u8>> {
    entries
        .iter()
        .filter(|(_, id)| !m.node(**id).is_dir())
        .enumerate()
        .filter(|(i, _)| !(*i as u64).is_multiple_of(keep_every))
        .map(|(_, (n, _))| n.clone())
        .collect()
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = |d: &[u8], n: &[u8]| show(&join(d, n));
        match self {
            Op::Create {
                dir,
                name,
                mode,
                rdev,
            } => write!(f, "create {} mode {mode:o} rdev {rdev}", p(dir, name)),
            Op::Symlink { dir, name, target } => {
                write!(
                    f,
                    "symlink {} -> {} ({} bytes)",
                    p(dir, name),
                    show(&target[..target.len().min(40)]),
                    target.len()
                )
            }
            Op::Write {
                path,
                offset,
                len,
                seed,
            } => write!(
                f,
                "write {} offset {offset} len {len} seed {seed}",
                show(path)
            ),
            Op::Truncate { path, size } => write!(f, "truncate {} to {size}", show(path)),
            Op::Fallocate {
                path,
                offset,
                len,
                keep_size,
            } => {
                write!(
                    f,
                    "fallocate {} offset {offset} len {len} keep_size {keep_size}",
                    show(path)
                )
            }
            Op::Unlink { dir, name } => write!(f, "unlink {}", p(dir, name)),
            Op::Rmdir { dir, name } => write!(f, "rmdir {}", p(dir, name)),
            Op::Rename {
                odir,
                oname,
                ndir,
                nname,
                noreplace,
            } => {
                write!(
                    f,
                    "rename {} -> {} noreplace {noreplace}",
                    p(odir, oname),
                    p(ndir, nname)
                )
            }
            Op::Link { src, dir, name } => write!(f, "link {} -> {}", show(src), p(dir, name)),
            Op::SetXattr { path, name, value } => {
                write!(
                    f,
                    "setxattr {} {} ({} bytes)",
                    show(path),
                    name.escape_ascii(),
                    value.len()
                )
            }
            Op::RemoveXattr { path, name } => {
                write!(f, "removexattr {} {}", show(path), name.escape_ascii())
            }
            Op::Chmod { path, perm } => write!(f, "chmod {} {perm:o}", show(path)),
            Op::BulkCreate { dir, first, count } => write!(
                f,
                "bulk create {count} files from {}",
                p(dir, &bulk_name(*first))
            ),
            Op::PunchHole { path, offset, len } => {
                write!(f, "punch hole {} offset {offset} len {len}", show(path))
            }
            Op::ZeroRange {
                path,
                offset,
                len,
                keep_size,
            } => write!(
                f,
                "zero range {} offset {offset} len {len} keep_size {keep_size}",
                show(path)
            ),
            Op::RenameExchange {
                adir,
                aname,
                bdir,
                bname,
            } => {
                write!(
                    f,
                    "rename exchange {} <-> {}",
                    p(adir, aname),
                    p(bdir, bname)
                )
            }
            Op::BulkLink {
                src,
                dir,
                first,
                count,
            } => write!(
                f,
                "bulk link {} as {count} names from {}",
                show(src),
                p(dir, &link_name(*first))
            ),
            Op::BulkUnlink { dir, keep_every } => write!(
                f,
                "bulk unlink in {} keeping every {keep_every}th",
                show(dir)
            ),
        }
    }
}

impl Op {
    /// Paths whose state the op may change (for the cheap check after it).
    pub fn touched(&self) -> Vec<Vec<u8>> {
        match self {
            Op::Create { dir, name, .. } | Op::Symlink { dir, name, .. } => {
                vec![dir.clone(), join(dir, name)]
            }
            Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
                vec![dir.clone(), join(dir, name)]
            }
            Op::Write { path, .. }
            | Op::Truncate { path, .. }
            | Op::Fallocate { path, .. }
            | Op::SetXattr { path, .. }
            | Op::RemoveXattr { path, .. }
            | Op::Chmod { path, .. } => vec![path.clone()],
            Op::Rename {
                odir,
                oname,
                ndir,
                nname,
                ..
            } => {
                vec![
                    odir.clone(),
                    ndir.clone(),
                    join(odir, oname),
                    join(ndir, nname),
                ]
            }
            Op::Link { src, dir, name } => vec![src.clone(), dir.clone(), join(dir, name)],
            Op::PunchHole { path, .. } | Op::ZeroRange { path, .. } => vec![path.clone()],
            Op::RenameExchange {
                adir,
                aname,
                bdir,
                bname,
            } => {
                vec![
                    adir.clone(),
                    bdir.clone(),
                    join(adir, aname),
                    join(bdir, bname),
                ]
            }
            Op::BulkCreate { dir, .. } | Op::BulkUnlink { dir, .. } => vec![dir.clone()],
            Op::BulkLink { src, dir, .. } => vec![src.clone(), dir.clone()],
        }
    }
}

const NAMES: [&[u8]; 10] = [
    b"a", b"b", b"c", b"d", b"e", b"file", b"dir", b"x.txt", b"y", b"zz",
];
/// Two pairs of names with the same crc32c name hash (any common prefix keeps them
/// equal, so "user." + a pair collides as xattr names too).
const HASH_TWINS: [&[u8]; 4] = [b"zxuofdkm", b"gmovlxir", b"azdqmtuq", b"laomblew"];

const XATTR_NAMES: [&[u8]; 7] = [
    b"user.zxuofdkm",
    b"user.gmovlxir",
    b"user.a",
    b"user.b",
    b"user.comment",
    b"security.x",
    b"trusted.t",
];

fn pick<'a, T>(r: &mut Rng, v: &'a [T]) -> &'a T {
    &v[r.below(v.len() as u64) as usize]
}

fn gen_name(r: &mut Rng) -> Vec<u8> {
    match r.below(40) {
        0 => {
            // The longest name allowed, with a varying last byte.
            let mut n = vec![b'L'; 254];
            n.push(b'a' + r.below(3) as u8);
            n
        }
        1 => vec![0xff, b' ', 0xc3, 0xa9, b'.', b'a' + r.below(3) as u8],
        2 => format!("n{}", r.below(1000)).into_bytes(),
        // Pairs with equal name hashes: they share one DIR_ITEM.
        3..=5 => pick(r, &HASH_TWINS).to_vec(),
        _ => pick(r, &NAMES).to_vec(),
    }
}

fn gen_size(r: &mut Rng, cur: u64) -> u64 {
    let v = match r.below(8) {
        0 => 0,
        1 => r.below(200),
        2 => r.below(4096) + 1,
        3 => 4096 * r.range(1, 40),
        4 => cur.saturating_sub(r.below(cur.min(9000) + 1)),
        5 => cur + r.below(9000),
        6 => r.below(300_000),
        _ => r.below(cur + 1),
    };
    v.min(FILE_SIZE_MAX)
}

fn gen_perm(r: &mut Rng) -> u32 {
    match r.below(4) {
        0 => 0o644,
        1 => 0o755,
        2 => 0o600,
        _ => r.below(0o10000) as u32,
    }
}

/// A random operation for the model's current state. Most are valid; some target
/// existing names, non-empty directories and so on, and must fail the same way.
pub fn gen_op(m: &Model, r: &mut Rng) -> Op {
    let paths = m.paths();
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut nondirs = Vec::new();
    let mut all = Vec::new();
    for (p, &id) in &paths {
        let n = m.node(id);
        match n.kind {
            Kind::Dir(_) => dirs.push(p.clone()),
            Kind::File(_) => files.push(p.clone()),
            _ => {}
        }
        if !n.is_dir() {
            nondirs.push(p.clone());
        }
        if !p.is_empty() {
            all.push(p.clone());
        }
    }
    loop {
        let w = r.below(100);
        let op = match w {
            0..=13 => Op::Create {
                dir: pick(r, &dirs).clone(),
                name: gen_name(r),
                mode: S_IFREG | gen_perm(r),
                rdev: 0,
            },
            14..=21 => Op::Create {
                dir: pick(r, &dirs).clone(),
                name: gen_name(r),
                mode: S_IFDIR | gen_perm(r),
                rdev: 0,
            },
            22..=23 => {
                let (ty, rdev) = *pick(
                    r,
                    &[
                        (0o010000u32, 0u64),
                        (0o140000, 0),
                        (0o020000, (1 << 20) | 3),
                        (0o060000, (8 << 20) | 17),
                    ],
                );
                Op::Create {
                    dir: pick(r, &dirs).clone(),
                    name: gen_name(r),
                    mode: ty | gen_perm(r),
                    rdev,
                }
            }
            40..=43 => {
                if files.is_empty() {
                    continue;
                }
                let path = pick(r, &files).clone();
                let cur = match &m.node(m.resolve(&path).expect("listed")).kind {
                    Kind::File(d) => d.len() as u64,
                    _ => 0,
                };
                let offset = match r.below(3) {
                    0 => r.below(cur + 1),
                    1 => r.below(cur / 4096 + 1) * 4096,
                    _ => cur.saturating_sub(r.below(5000)),
                }
                .min(FILE_SIZE_MAX - 1);
                let len = match r.below(3) {
                    0 => r.range(1, 5000),
                    1 => 4096 * r.range(1, 20),
                    _ => r.range(1, 200_000),
                }
                .min(FILE_SIZE_MAX - offset);
                if w == 43 {
                    Op::ZeroRange {
                        path,
                        offset,
                        len,
                        keep_size: r.chance(1, 2),
                    }
                } else {
                    Op::PunchHole { path, offset, len }
                }
            }
            24..=39 => {
                if files.is_empty() {
                    continue;
                }
                let path = pick(r, &files).clone();
                let cur = m.resolve(&path).map_or(0, |id| match &m.node(id).kind {
                    Kind::File(d) => d.len() as u64,
                    _ => 0,
                });
                let offset = match r.below(7) {
                    0 => 0,
                    1 => cur,
                    2 => r.below(cur + 1),
                    3 => r.below(cur / 4096 + 1) * 4096,
                    4 => cur + r.below(20_000),
                    5 => (cur + r.below(200_000)).next_multiple_of(4096),
                    _ => r.below(cur + 5000),
                };
                let len = match r.below(10) {
                    0..=3 => r.range(1, 120),
                    4..=6 => r.range(1, 9000),
                    7..=8 => 4096 * r.range(1, 8),
                    _ => r.range(1, 300_000),
                };
                let offset = offset.min(FILE_SIZE_MAX - 1);
                let len = len.min(FILE_SIZE_MAX - offset);
                Op::Write {
                    path,
                    offset,
                    len,
                    seed: r.next_u64(),
                }
            }
            44..=51 => {
                if files.is_empty() {
                    continue;
                }
                let path = pick(r, &files).clone();
                let cur = match &m.node(m.resolve(&path).expect("listed")).kind {
                    Kind::File(d) => d.len() as u64,
                    _ => 0,
                };
                Op::Truncate {
                    path,
                    size: gen_size(r, cur),
                }
            }
            52..=57 => {
                // Mostly existing non-directories; sometimes a directory or a missing name.
                if r.chance(1, 6) || nondirs.is_empty() {
                    Op::Unlink {
                        dir: pick(r, &dirs).clone(),
                        name: gen_name(r),
                    }
                } else {
                    let (d, n) = split(pick::<Vec<u8>>(r, &nondirs)).expect("not the root");
                    Op::Unlink {
                        dir: d.to_vec(),
                        name: n.to_vec(),
                    }
                }
            }
            58..=61 => {
                if r.chance(1, 5) || dirs.len() < 2 {
                    Op::Rmdir {
                        dir: pick(r, &dirs).clone(),
                        name: gen_name(r),
                    }
                } else {
                    // Prefer empty directories.
                    let empty: Vec<&Vec<u8>> = dirs
                        .iter()
                        .filter(|p| {
                            !p.is_empty()
                                && m.node(paths[*p]).entries().is_some_and(|e| e.is_empty())
                        })
                        .collect();
                    let p = if !empty.is_empty() && r.chance(3, 4) {
                        (*pick(r, &empty)).clone()
                    } else {
                        pick(r, &dirs[1..]).clone()
                    };
                    let (d, n) = split(&p).expect("not the root");
                    Op::Rmdir {
                        dir: d.to_vec(),
                        name: n.to_vec(),
                    }
                }
            }
            69..=71 => {
                if all.is_empty() {
                    continue;
                }
                let (ad, an) = split(pick::<Vec<u8>>(r, &all)).expect("not the root");
                let (bd, bn) = split(pick::<Vec<u8>>(r, &all)).expect("not the root");
                Op::RenameExchange {
                    adir: ad.to_vec(),
                    aname: an.to_vec(),
                    bdir: bd.to_vec(),
                    bname: bn.to_vec(),
                }
            }
            62..=68 => {
                if all.is_empty() {
                    continue;
                }
                let (od, on) = split(pick::<Vec<u8>>(r, &all)).expect("not the root");
                let (ndir, nname) = if r.chance(1, 3) {
                    // Onto an existing name (replace, or a type/emptiness error).
                    let (d, n) = split(pick::<Vec<u8>>(r, &all)).expect("not the root");
                    (d.to_vec(), n.to_vec())
                } else {
                    (pick(r, &dirs).clone(), gen_name(r))
                };
                Op::Rename {
                    odir: od.to_vec(),
                    oname: on.to_vec(),
                    ndir,
                    nname,
                    noreplace: r.chance(1, 5),
                }
            }
            72..=76 => {
                if nondirs.is_empty() {
                    continue;
                }
                Op::Link {
                    src: pick(r, &nondirs).clone(),
                    dir: pick(r, &dirs).clone(),
                    name: gen_name(r),
                }
            }
            77..=81 => {
                let len = match r.below(6) {
                    0 => r.range(1000, 4096),
                    _ => r.range(1, 120),
                };
                let mut target = vec![0u8; len as usize];
                for b in target.iter_mut() {
                    *b = b"abcdefgh/._-XYZ"[r.below(15) as usize];
                }
                Op::Symlink {
                    dir: pick(r, &dirs).clone(),
                    name: gen_name(r),
                    target,
                }
            }
            82..=88 => {
                let len = match r.below(10) {
                    0 => 0,
                    1 => r.range(2000, 8000),
                    _ => r.range(1, 200),
                };
                let mut value = vec![0u8; len as usize];
                r.fill_bytes(&mut value);
                let path = if r.chance(1, 8) {
                    Vec::new()
                } else {
                    pick(r, &all.iter().chain(&dirs).cloned().collect::<Vec<_>>()).clone()
                };
                Op::SetXattr {
                    path,
                    name: pick(r, &XATTR_NAMES).to_vec(),
                    value,
                }
            }
            89..=91 => {
                let path = pick(r, &dirs.iter().chain(&all).cloned().collect::<Vec<_>>()).clone();
                Op::RemoveXattr {
                    path,
                    name: pick(r, &XATTR_NAMES).to_vec(),
                }
            }
            92..=97 => {
                if files.is_empty() {
                    continue;
                }
                let path = pick(r, &files).clone();
                let cur = match &m.node(m.resolve(&path).expect("listed")).kind {
                    Kind::File(d) => d.len() as u64,
                    _ => 0,
                };
                let offset = match r.below(3) {
                    0 => r.below(cur + 1),
                    1 => cur + r.below(50_000),
                    _ => r.below(cur / 4096 + 2) * 4096,
                }
                .min(FILE_SIZE_MAX - 1);
                let len = r.range(1, 200_000).min(FILE_SIZE_MAX - offset);
                Op::Fallocate {
                    path,
                    offset,
                    len,
                    keep_size: r.chance(1, 2),
                }
            }
            98 => {
                if all.is_empty() {
                    continue;
                }
                Op::Chmod {
                    path: pick(r, &all).clone(),
                    perm: gen_perm(r),
                }
            }
            _ => {
                if r.chance(1, 3) && !nondirs.is_empty() {
                    Op::BulkLink {
                        src: pick(r, &nondirs).clone(),
                        dir: pick(r, &dirs).clone(),
                        first: r.below(100) * 100,
                        count: r.range(5, 80),
                    }
                } else if r.chance(1, 2) {
                    let (first, count) = (r.below(1000) * 1000, r.range(20, 400));
                    Op::BulkCreate {
                        dir: pick(r, &dirs).clone(),
                        first,
                        count,
                    }
                } else {
                    Op::BulkUnlink {
                        dir: pick(r, &dirs).clone(),
                        keep_every: r.range(1, 6),
                    }
                }
            }
        };
        return op;
    }
}

/// Wall-clock-free time stamps: deterministic runs.
pub fn time_of(step: u64) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + step as i64,
        nsec: (step * 7919 % 1_000_000_000) as u32,
    }
}

/// Applies `op` to the engine. `ino_of` maps model identities to inode numbers;
/// `dir_ino` resolves a model path to its inode through it.
pub fn apply_engine(
    t: &mut Trans,
    m: &Model,
    ino_of: &HashMap<Id, u64>,
    op: &Op,
    step: u64,
) -> Result<Option<u64>, Error> {
    let tm = time_of(step);
    let ino = |p: &[u8]| -> Result<u64, Error> {
        let id = m.resolve(p).ok_or_else(|| Error::NotFound(show(p)))?;
        ino_of
            .get(&id)
            .copied()
            .ok_or_else(|| Error::NotFound(format!("{} (no inode mapped)", show(p))))
    };
    match op {
        Op::Create {
            dir,
            name,
            mode,
            rdev,
        } => {
            let d = ino(dir)?;
            t.create(
                FS_TREE,
                d,
                name,
                NewInode {
                    mode: *mode,
                    uid: 1000,
                    gid: 100,
                    rdev: *rdev,
                    time: tm,
                },
            )
            .map(Some)
        }
        Op::Symlink { dir, name, target } => {
            let d = ino(dir)?;
            t.symlink(
                FS_TREE,
                d,
                name,
                target,
                NewInode {
                    mode: 0o120777,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    time: tm,
                },
            )
            .map(Some)
        }
        Op::Write {
            path,
            offset,
            len,
            seed,
        } => {
            let i = ino(path)?;
            t.write(FS_TREE, i, *offset, &write_data(*len, *seed), tm)
                .map(|_| None)
        }
        Op::Truncate { path, size } => {
            let i = ino(path)?;
            t.truncate(FS_TREE, i, *size, tm).map(|_| None)
        }
        Op::Fallocate {
            path,
            offset,
            len,
            keep_size,
        } => {
            let i = ino(path)?;
            t.fallocate(FS_TREE, i, *offset, *len, *keep_size, tm)
                .map(|_| None)
        }
        Op::Unlink { dir, name } => {
            let d = ino(dir)?;
            t.unlink(FS_TREE, d, name, tm).map(|_| None)
        }
        Op::Rmdir { dir, name } => {
            let d = ino(dir)?;
            t.rmdir(FS_TREE, d, name, tm).map(|_| None)
        }
        Op::Rename {
            odir,
            oname,
            ndir,
            nname,
            noreplace,
        } => {
            let od = ino(odir)?;
            let nd = ino(ndir)?;
            t.rename(FS_TREE, od, oname, nd, nname, *noreplace, tm)
                .map(|_| None)
        }
        Op::Link { src, dir, name } => {
            let s = ino(src)?;
            let d = ino(dir)?;
            t.link(FS_TREE, s, d, name, tm).map(|_| None)
        }
        Op::SetXattr { path, name, value } => {
            let i = ino(path)?;
            t.set_xattr(FS_TREE, i, name, value, tm).map(|_| None)
        }
        Op::RemoveXattr { path, name } => {
            let i = ino(path)?;
            t.remove_xattr(FS_TREE, i, name, tm).map(|_| None)
        }
        Op::Chmod { path, perm } => {
            let i = ino(path)?;
            t.setattr(FS_TREE, i, Some(*perm), None, None, None, None, tm)
                .map(|_| None)
        }
        Op::BulkCreate { dir, first, count } => {
            let d = ino(dir)?;
            for i in *first..first + count {
                if t.lookup(FS_TREE, d, &bulk_name(i))?.is_some() {
                    return Err(Error::Exists(show(&bulk_name(i))));
                }
            }
            for i in *first..first + count {
                let attr = NewInode {
                    mode: S_IFREG | 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    time: tm,
                };
                let f = t.create(FS_TREE, d, &bulk_name(i), attr)?;
                t.write(FS_TREE, f, 0, &bulk_data(i), tm)?;
                if i % 5 == 0 {
                    t.set_xattr(FS_TREE, f, b"user.bulk", &i.to_le_bytes(), tm)?;
                }
            }
            Ok(None)
        }
        Op::PunchHole { path, offset, len } => {
            let i = ino(path)?;
            t.punch_hole(FS_TREE, i, *offset, *len, tm).map(|_| None)
        }
        Op::ZeroRange {
            path,
            offset,
            len,
            keep_size,
        } => {
            let i = ino(path)?;
            t.zero_range(FS_TREE, i, *offset, *len, *keep_size, tm)
                .map(|_| None)
        }
        Op::RenameExchange {
            adir,
            aname,
            bdir,
            bname,
        } => {
            let a = ino(adir)?;
            let b = ino(bdir)?;
            t.rename_exchange(FS_TREE, a, aname, b, bname, tm)
                .map(|_| None)
        }
        Op::BulkLink {
            src,
            dir,
            first,
            count,
        } => {
            let s = ino(src)?;
            let d = ino(dir)?;
            for i in *first..first + count {
                t.link(FS_TREE, s, d, &link_name(i), tm)?;
            }
            Ok(None)
        }
        Op::BulkUnlink { dir, keep_every } => {
            let d = ino(dir)?;
            let id = m.resolve(dir).ok_or_else(|| Error::NotFound(show(dir)))?;
            let entries = m
                .node(id)
                .entries()
                .ok_or_else(|| Error::NotDir(show(dir)))?;
            for v in bulk_victims(entries, m, *keep_every) {
                t.unlink(FS_TREE, d, &v, tm)?;
            }
            Ok(None)
        }
    }
}

fn ftype_of_mode(mode: u32) -> u8 {
    ubtrfs_core::inode_ops::file_type_of(mode)
}

/// Compares one engine node with a model node: type, mode, nlink, size, content or
/// target, xattrs; for directories the entry names and types (not recursively) and
/// the i_size btrfs keeps (twice the sum of the name lengths).
pub fn compare_node(
    fs: &Filesystem,
    node: Node,
    m: &Model,
    id: Id,
    path: &[u8],
) -> Result<(), String> {
    let p = show(path);
    let n = m.node(id);
    let st = fs.stat(node).map_err(|e| format!("{p}: stat: {e}"))?;
    if st.mode != n.mode {
        return Err(format!("{p}: mode {:o}, model {:o}", st.mode, n.mode));
    }
    if st.nlink != n.nlink {
        return Err(format!("{p}: nlink {}, model {}", st.nlink, n.nlink));
    }
    match &n.kind {
        Kind::Dir(entries) => {
            let want: u64 = entries.keys().map(|k| 2 * k.len() as u64).sum();
            if st.size != want {
                return Err(format!(
                    "{p}: directory i_size {}, expected {want}",
                    st.size
                ));
            }
            let got = fs.readdir(node).map_err(|e| format!("{p}: readdir: {e}"))?;
            let got_names: BTreeMap<Vec<u8>, u8> =
                got.iter().map(|e| (e.name.clone(), e.ty)).collect();
            if got_names.len() != got.len() {
                return Err(format!("{p}: readdir returns a name twice: {got:?}"));
            }
            let want_names: BTreeMap<Vec<u8>, u8> = entries
                .iter()
                .map(|(k, c)| (k.clone(), ftype_of_mode(m.node(*c).mode)))
                .collect();
            if got_names != want_names {
                let show_set = |s: &BTreeMap<Vec<u8>, u8>| {
                    s.iter()
                        .map(|(k, t)| format!("{}:{t}", k.escape_ascii()))
                        .collect::<Vec<_>>()
                };
                return Err(format!(
                    "{p}: entries {:?}, model {:?}",
                    show_set(&got_names),
                    show_set(&want_names)
                ));
            }
            for e in &got {
                let l = fs
                    .lookup(node, &e.name)
                    .map_err(|err| format!("{p}: lookup {}: {err}", e.name.escape_ascii()))?;
                match l {
                    Some(l) if l.node == e.node => {}
                    other => {
                        return Err(format!(
                            "{p}: readdir has {} -> {:?}, lookup gives {other:?}",
                            e.name.escape_ascii(),
                            e.node
                        ))
                    }
                }
            }
        }
        Kind::File(data) => {
            if st.size != data.len() as u64 {
                return Err(format!("{p}: size {}, model {}", st.size, data.len()));
            }
            let got = fs
                .read(node, 0, data.len() + 1)
                .map_err(|e| format!("{p}: read: {e}"))?;
            if got != *data {
                let first = got
                    .iter()
                    .zip(data)
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(data.len()));
                return Err(format!(
                    "{p}: content differs from byte {first} (read {} bytes, model {}; got {:02x?}, want {:02x?})",
                    got.len(),
                    data.len(),
                    &got[first.min(got.len())..(first + 8).min(got.len())],
                    &data[first.min(data.len())..(first + 8).min(data.len())]
                ));
            }
        }
        Kind::Symlink(target) => {
            let got = fs
                .readlink(node)
                .map_err(|e| format!("{p}: readlink: {e}"))?;
            if got != *target || st.size != target.len() as u64 {
                return Err(format!(
                    "{p}: symlink target {} (size {}), model {}",
                    show(&got),
                    st.size,
                    show(target)
                ));
            }
        }
        Kind::Special(rdev) => {
            if st.size != 0 || st.rdev != kernel_rdev_to_user(*rdev) {
                return Err(format!(
                    "{p}: size {} rdev {:#x}, model rdev {:#x}",
                    st.size,
                    st.rdev,
                    kernel_rdev_to_user(*rdev)
                ));
            }
        }
    }
    let xs = fs.xattrs(node).map_err(|e| format!("{p}: xattrs: {e}"))?;
    let xmap: BTreeMap<Vec<u8>, Vec<u8>> = xs.iter().cloned().collect();
    if xmap.len() != xs.len() || xmap != n.xattrs {
        let names = |v: &mut dyn Iterator<Item = (&Vec<u8>, usize)>| {
            v.map(|(k, l)| format!("{}={l}B", k.escape_ascii()))
                .collect::<Vec<_>>()
        };
        return Err(format!(
            "{p}: xattrs {:?}, model {:?}",
            names(&mut xs.iter().map(|(k, v)| (k, v.len()))),
            names(&mut n.xattrs.iter().map(|(k, v)| (k, v.len())))
        ));
    }
    for (k, v) in &n.xattrs {
        let g = fs
            .getxattr(node, k)
            .map_err(|e| format!("{p}: getxattr: {e}"))?;
        if g.as_ref() != Some(v) {
            return Err(format!(
                "{p}: getxattr {} differs from listing",
                k.escape_ascii()
            ));
        }
    }
    Ok(())
}

/// Checks the given paths (the cheap per-op check): present ones match the model,
/// absent ones do not resolve.
pub fn compare_paths(fs: &Filesystem, m: &Model, paths: &[Vec<u8>]) -> Result<(), String> {
    for p in paths {
        match (m.resolve(p), fs.resolve_bytes(p)) {
            (Some(id), Ok(node)) => compare_node(fs, node, m, id, p)?,
            (None, Err(Error::NotFound(_) | Error::NotDir(_))) => {}
            (None, Ok(node)) => {
                return Err(format!(
                    "{}: exists (inode {}), the model has no such path",
                    show(p),
                    node.ino
                ))
            }
            (_, Err(e)) => return Err(format!("{}: resolve: {e}", show(p))),
        }
    }
    Ok(())
}

/// Walks the whole tree and compares it with the model: every name, type, mode, nlink,
/// size, content, symlink target, xattr; hard links must be one inode, distinct model
/// nodes distinct inodes.
pub fn compare_tree(fs: &Filesystem, m: &Model) -> Result<(), String> {
    let mut ino_of: HashMap<Id, u64> = HashMap::new();
    let mut id_of: HashMap<u64, Id> = HashMap::new();
    let mut stack = vec![(Vec::new(), fs.top(), ROOT)];
    let mut seen = BTreeSet::new();
    while let Some((p, node, id)) = stack.pop() {
        if node.root != FS_TREE {
            return Err(format!("{}: in subvolume {}", show(&p), node.root));
        }
        match (ino_of.insert(id, node.ino), id_of.insert(node.ino, id)) {
            (Some(a), _) if a != node.ino => {
                return Err(format!(
                    "{}: hard links of one model node are inodes {a} and {}",
                    show(&p),
                    node.ino
                ))
            }
            (_, Some(b)) if b != id => {
                return Err(format!(
                    "{}: inode {} also stands for another model node",
                    show(&p),
                    node.ino
                ))
            }
            _ => {}
        }
        if !seen.insert(id) && m.node(id).is_dir() {
            return Err(format!("{}: directory reached twice", show(&p)));
        }
        compare_node(fs, node, m, id, &p)?;
        if let Some(e) = m.node(id).entries() {
            for (name, &c) in e {
                let child = fs
                    .lookup(node, name)
                    .map_err(|err| format!("{}: lookup: {err}", show(&join(&p, name))))?
                    .ok_or_else(|| format!("{}: missing", show(&join(&p, name))))?;
                stack.push((join(&p, name), child.node, c));
            }
        }
    }
    if ino_of.len() != m.nodes.len() {
        return Err(format!(
            "walk reached {} nodes, the model has {}",
            ino_of.len(),
            m.nodes.len()
        ));
    }
    Ok(())
}

/// Granularity of [`SparseMem`].
const SPARSE_CHUNK: usize = 64 << 10;

/// An in-memory device storing only the 64 KiB chunks ever written (the rest reads as
/// zeros), so a copy of a mostly empty 128 MiB image costs a few MiB.
#[derive(Debug)]
pub struct SparseMem {
    size: u64,
    chunks: std::sync::RwLock<Vec<Option<Box<[u8]>>>>,
    name: String,
}

impl SparseMem {
    pub fn new(size: u64, name: &str) -> Arc<SparseMem> {
        let n = (size as usize).div_ceil(SPARSE_CHUNK);
        Arc::new(SparseMem {
            size,
            chunks: std::sync::RwLock::new(vec![None; n]),
            name: name.to_string(),
        })
    }

    /// An independent copy of the current bytes.
    pub fn copy(&self, name: &str) -> Arc<SparseMem> {
        let c = self
            .chunks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Arc::new(SparseMem {
            size: self.size,
            chunks: std::sync::RwLock::new(c),
            name: name.to_string(),
        })
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at {offset} beyond the end of {}", self.name),
            )),
        }
    }
}

impl Device for SparseMem {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let chunks = self.chunks.read().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (ci, co) = (pos / SPARSE_CHUNK, pos % SPARSE_CHUNK);
            let n = (SPARSE_CHUNK - co).min(buf.len() - done);
            match &chunks[ci] {
                Some(c) => buf[done..done + n].copy_from_slice(&c[co..co + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut chunks = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (ci, co) = (pos / SPARSE_CHUNK, pos % SPARSE_CHUNK);
            let n = (SPARSE_CHUNK - co).min(buf.len() - done);
            let c = chunks[ci].get_or_insert_with(|| vec![0u8; SPARSE_CHUNK].into_boxed_slice());
            c[co..co + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn name(&self) -> String {
        self.name.clone()
    }
}

impl SparseMem {
    /// Writes the stored chunks into `f` (which must be `size` bytes long and read as
    /// zeros elsewhere, e.g. fresh from `set_len`).
    pub fn write_to(&self, f: &std::fs::File) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let chunks = self.chunks.read().unwrap_or_else(|e| e.into_inner());
        for (i, c) in chunks.iter().enumerate() {
            if let Some(c) = c {
                f.write_all_at(c, (i * SPARSE_CHUNK) as u64)?;
            }
        }
        Ok(())
    }
}

/// Opens a device image read-only from scratch (no caches shared with a writer).
pub fn open_ro(dev: Arc<dyn Device>) -> Result<Filesystem, Error> {
    Ok(Filesystem::from_info(FsInfo::open(
        vec![dev],
        OpenOptions::default(),
    )?))
}

/// The filesystem features a run uses (varied by seed).
#[derive(Clone, Debug)]
pub struct FsConfig {
    pub nodesize: u32,
    /// Dup metadata (two copies of every tree block) instead of single.
    pub dup: bool,
    pub no_holes: bool,
    pub csum: CsumType,
    pub block_group_tree: bool,
    /// Compress file data on write.
    pub compress: Option<Compression>,
}

impl Default for FsConfig {
    /// The mkfs defaults.
    fn default() -> Self {
        FsConfig {
            nodesize: 16384,
            dup: true,
            no_holes: true,
            csum: CsumType::Crc32c,
            block_group_tree: false,
            compress: None,
        }
    }
}

impl FsConfig {
    /// A configuration drawn from the seed (independently of the workload).
    pub fn for_seed(seed: u64) -> FsConfig {
        let mut r = Rng::new(seed ^ 0x5EED_C0F1_6000_0000);
        // Small nodes give deep trees (splits, merges, multi-level paths) in few ops.
        let nodesize = *pick(&mut r, &[4096, 4096, 16384, 16384, 65536]);
        let dup = r.chance(1, 6);
        let no_holes = r.chance(3, 4);
        FsConfig {
            nodesize,
            dup,
            no_holes,
            csum: *pick(
                &mut r,
                &[
                    CsumType::Crc32c,
                    CsumType::Crc32c,
                    CsumType::Xxhash64,
                    CsumType::Sha256,
                    CsumType::Blake2b,
                ],
            ),
            // The kernel mounts a block group tree only with NO_HOLES.
            block_group_tree: r.chance(1, 4) && no_holes,
            compress: if r.chance(1, 3) {
                Some(*pick(
                    &mut r,
                    &[Compression::Zlib, Compression::Lzo, Compression::Zstd],
                ))
            } else {
                None
            },
        }
    }

    /// Device size: comfortably above the mkfs minimum.
    pub fn dev_size(&self, at_least: u64) -> u64 {
        at_least.max(if self.dup { 160 << 20 } else { 128 << 20 })
    }

    /// The mkfs options: these features, deterministic fsid and times.
    pub fn mkfs_options(&self) -> MkfsOptions {
        MkfsOptions {
            nodesize: self.nodesize,
            metadata_profile: if self.dup {
                MkfsOptions::default().metadata_profile
            } else {
                0
            },
            no_holes: self.no_holes,
            csum: self.csum,
            block_group_tree: self.block_group_tree,
            fsid: Some(*b"ubtrfs-model-fs!"),
            time: Some(time_of(0)),
            ..Default::default()
        }
    }
}

/// Runs operations on an engine handle and the model side by side.
pub struct Harness {
    pub t: Trans,
    pub model: Model,
    pub ino_of: HashMap<Id, u64>,
    /// Operations applied so far (for failure reports).
    pub log: Vec<String>,
    /// The same, replayable.
    pub steps: Vec<Step>,
    pub step: u64,
    /// Calls the engine refused as unsupported where the model expected success
    /// (fallocate on an inline file).
    pub unsupported: u64,
    /// Calls that failed as the model predicted.
    pub expected_errors: u64,
    /// Compression set on every handle.
    pub compress: Option<Compression>,
}

impl Harness {
    /// mkfs on `dev`; the model starts as the empty top directory.
    pub fn mkfs(dev: Arc<dyn Device>, cfg: &FsConfig) -> Result<Harness, String> {
        let opts = cfg.mkfs_options();
        let mut t = make_filesystem(dev, &opts).map_err(|e| format!("mkfs: {e}"))?;
        t.compress = cfg.compress.map(|c| (c, None));
        let mut ino_of = HashMap::new();
        ino_of.insert(ROOT, TOP_DIR);
        Ok(Harness {
            t,
            model: Model::new(opts.root_mode, opts.nodesize),
            ino_of,
            log: Vec::new(),
            steps: Vec::new(),
            step: 1,
            unsupported: 0,
            expected_errors: 0,
            compress: cfg.compress,
        })
    }

    /// Replaces the handle by one opened from `dev` (which must hold the last commit).
    pub fn reopen(&mut self, dev: Arc<dyn Device>) -> Result<(), String> {
        let info = FsInfo::open(
            vec![dev],
            OpenOptions {
                writable: true,
                ..Default::default()
            },
        )
        .map_err(|e| format!("reopen for writing: {e}"))?;
        self.t = Trans::from_fs(info).map_err(|e| format!("Trans::from_fs: {e}"))?;
        self.t.compress = self.compress.map(|c| (c, None));
        self.log.push("reopen for writing".into());
        self.steps.push(Step::Reopen);
        compare_tree(&self.t.fs, &self.model).map_err(|e| format!("reopened for writing: {e}"))
    }

    /// Applies one op to both sides and checks the touched paths.
    pub fn step(&mut self, op: &Op) -> Result<(), String> {
        self.step += 1;
        self.log.push(format!("{op:?}"));
        self.steps.push(Step::Op(op.clone()));
        let before = self.model.clone();
        let got = apply_engine(&mut self.t, &self.model, &self.ino_of, op, self.step);
        let want = self.model.apply(op);
        match (&got, &want) {
            (Ok(ino), Ok(id)) => {
                if let (Some(ino), Some(id)) = (ino, id) {
                    self.ino_of.insert(*id, *ino);
                }
            }
            (Err(e), Err(errno)) if e.errno() == *errno => self.expected_errors += 1,
            (Err(e @ Error::Unsupported(_)), Ok(None)) if matches!(op, Op::Fallocate { .. }) => {
                // fallocate of a file with an inline extent: the engine refuses it (the
                // kernel would convert the extent). The file must be untouched (checked
                // below against the restored model).
                let inline = match op {
                    Op::Fallocate { path, .. } => self
                        .t
                        .fs
                        .resolve_bytes(path)
                        .and_then(|n| self.t.fs.file_extents(n))
                        .is_ok_and(|x| {
                            x.first().is_some_and(|e| {
                                matches!(
                                    e.item.body,
                                    ubtrfs_core::format::items::FileExtentBody::Inline { .. }
                                )
                            })
                        }),
                    _ => false,
                };
                if !inline {
                    return Err(format!(
                        "{op:?}: engine error `{e}` on a file without an inline extent"
                    ));
                }
                self.model = before;
                self.unsupported += 1;
            }
            (Err(e), Err(errno)) => {
                return Err(format!(
                    "{op:?}: engine error `{e}` (errno {}), model expects errno {errno}",
                    e.errno()
                ))
            }
            (Err(e), Ok(_)) => {
                return Err(format!(
                    "{op:?}: engine error `{e}`, the model expects success"
                ))
            }
            (Ok(_), Err(errno)) => {
                return Err(format!(
                    "{op:?}: engine succeeded, the model expects errno {errno}"
                ))
            }
        }
        if let (Op::BulkCreate { dir, first, count }, Ok(_)) = (op, &want) {
            // The new inodes, by name (the engine has them all by now).
            let d = self.ino_of[&self.model.resolve(dir).expect("bulk dir")];
            for i in *first..first + count {
                let id = self
                    .model
                    .resolve(&join(dir, &bulk_name(i)))
                    .expect("just created");
                let (ino, _, _) = self
                    .t
                    .lookup(FS_TREE, d, &bulk_name(i))
                    .map_err(|e| format!("{op:?}: lookup: {e}"))?
                    .ok_or_else(|| format!("{op:?}: {} missing", show(&bulk_name(i))))?;
                self.ino_of.insert(id, ino);
            }
        }
        // Forget inodes of nodes that are gone.
        self.ino_of
            .retain(|id, _| self.model.nodes.contains_key(id));
        compare_paths(&self.t.fs, &self.model, &op.touched())
            .map_err(|e| format!("after {op:?}: {e}"))
    }

    pub fn commit(&mut self) -> Result<(), String> {
        self.log.push("commit".into());
        self.steps.push(Step::Commit);
        self.t.commit().map_err(|e| format!("commit: {e}"))?;
        compare_tree(&self.t.fs, &self.model)
            .map_err(|e| format!("after commit (uncommitted view): {e}"))
    }

    /// The last lines of the log, for a failure message.
    pub fn tail(&self, n: usize) -> String {
        let s = self.log.len().saturating_sub(n);
        self.log[s..]
            .iter()
            .enumerate()
            .map(|(i, l)| format!("  #{}: {l}\n", s + i))
            .collect()
    }
}

/// Parameters of one model run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub ops: usize,
    /// Device size (at least what the seed's configuration needs).
    pub dev_size: u64,
    /// Run `btrfs check` on the final image.
    pub btrfs_check: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            ops: 60,
            dev_size: 0,
            btrfs_check: false,
        }
    }
}

/// Statistics of a successful run.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub ops: u64,
    pub commits: u64,
    pub reopens: u64,
    pub expected_errors: u64,
    pub unsupported: u64,
    /// Deepest FS tree seen at a commit (0 = a single leaf).
    pub max_fs_tree_level: u8,
    /// Most model nodes at a commit.
    pub max_nodes: usize,
}

/// One seeded run: mkfs on a [`SparseMem`] device, `cfg.ops` random ops with random commits, a
/// full comparison after every commit (through the handle and through a fresh
/// read-only open of a copy of the device), sometimes continuing on a handle reopened from disk.
/// Returns the error and the log tail on failure.
pub fn run_seed(seed: u64, cfg: &RunConfig) -> Result<RunStats, String> {
    run_seed_recorded(seed, cfg).map_err(|(e, _)| e)
}

/// [`run_seed`], returning the steps done up to a failure with it.
pub fn run_seed_recorded(seed: u64, cfg: &RunConfig) -> Result<RunStats, (String, Vec<Step>)> {
    let mut steps = Vec::new();
    run_seed_inner(seed, cfg, &mut steps).map_err(|e| (e, steps))
}

fn run_seed_inner(
    seed: u64,
    cfg: &RunConfig,
    steps_out: &mut Vec<Step>,
) -> Result<RunStats, String> {
    let mut r = Rng::new(seed);
    let fsc = FsConfig::for_seed(seed);
    let dev_size = fsc.dev_size(cfg.dev_size);
    let mem = SparseMem::new(dev_size, &format!("model-{seed}"));
    let dev: Arc<dyn Device> = mem.clone();
    let mut h = Harness::mkfs(dev.clone(), &fsc)?;
    let mut stats = RunStats::default();
    let res = (|| -> Result<(), String> {
        for i in 0..cfg.ops {
            let op = gen_op(&h.model, &mut r);
            h.step(&op)?;
            stats.ops += 1;
            let last = i + 1 == cfg.ops;
            if last || r.chance(1, 5) {
                h.commit()?;
                stats.commits += 1;
                let level =
                    h.t.root_ptr(FS_TREE)
                        .map_err(|e| format!("FS tree root: {e}"))?
                        .level;
                stats.max_fs_tree_level = stats.max_fs_tree_level.max(level);
                stats.max_nodes = stats.max_nodes.max(h.model.nodes.len());
                // A copy of the bytes, opened from scratch.
                let fs = open_ro(mem.copy("copy"))
                    .map_err(|e| format!("open a copy after the commit: {e}"))?;
                compare_tree(&fs, &h.model)
                    .map_err(|e| format!("copy of the device after the commit: {e}"))?;
                if !last && r.chance(1, 3) {
                    // Continue on a handle opened from disk.
                    h.reopen(dev.clone())?;
                    stats.reopens += 1;
                }
            }
        }
        if cfg.btrfs_check {
            btrfs_check_image(dev_size, |f| mem.write_to(f), None)
                .map_err(|e| format!("final image: {e}"))?;
        }
        Ok(())
    })();
    *steps_out = h.steps.clone();
    res.map_err(|e| format!("{e}\n{fsc:?}; last operations:\n{}", h.tail(25)))?;
    stats.expected_errors = h.expected_errors;
    stats.unsupported = h.unsupported;
    Ok(stats)
}

/// One step of a recorded run.
#[derive(Clone, PartialEq, Eq)]
pub enum Step {
    Op(Op),
    /// Commit, then compare the whole tree, also on a fresh copy of the device.
    Commit,
    /// Continue on a handle opened from the device.
    Reopen,
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Op(op) => write!(f, "{op:?}"),
            Step::Commit => write!(f, "commit"),
            Step::Reopen => write!(f, "reopen for writing"),
        }
    }
}

/// Replays recorded steps on a fresh filesystem with the same checks as [`run_seed`];
/// ends with a commit (and `btrfs check` if asked).
pub fn replay(fsc: &FsConfig, steps: &[Step], btrfs_check: bool) -> Result<(), String> {
    let dev_size = fsc.dev_size(0);
    let mem = SparseMem::new(dev_size, "replay");
    let dev: Arc<dyn Device> = mem.clone();
    let mut h = Harness::mkfs(dev.clone(), fsc)?;
    let commit = |h: &mut Harness| -> Result<(), String> {
        h.commit()?;
        let fs =
            open_ro(mem.copy("copy")).map_err(|e| format!("open a copy after the commit: {e}"))?;
        compare_tree(&fs, &h.model).map_err(|e| format!("copy of the device after the commit: {e}"))
    };
    for s in steps {
        match s {
            Step::Op(op) => h.step(op)?,
            Step::Commit => commit(&mut h)?,
            Step::Reopen => h.reopen(dev.clone())?,
        }
    }
    commit(&mut h)?;
    if btrfs_check {
        btrfs_check_image(dev_size, |f| mem.write_to(f), None)
            .map_err(|e| format!("final image: {e}"))?;
    }
    Ok(())
}

/// What kind of failure a message reports, without numbers and paths (so a smaller
/// reproduction of the same bug still matches).
pub fn failure_signature(e: &str) -> String {
    let line = match e.find("btrfs check failed") {
        // The first complaint btrfs check printed.
        Some(_) => e
            .lines()
            .find(|l| {
                l.contains("error")
                    && !l.starts_with("found ")
                    && !l.starts_with("ERROR: errors found")
            })
            .unwrap_or("btrfs check failed"),
        None => {
            let first = e.lines().next().unwrap_or("");
            first.split_once(": ").map_or(first, |(_, rest)| rest)
        }
    };
    line.split_whitespace()
        .filter(|w| !w.starts_with('/') && !w.starts_with("`/"))
        .map(|w| {
            w.chars()
                .filter(|c| !c.is_ascii_digit())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Shrinks a failing step list to a (locally) minimal one failing with the same
/// signature (delta debugging: drop chunks, then single steps).
pub fn minimize(fsc: &FsConfig, steps: &[Step], btrfs_check: bool, signature: &str) -> Vec<Step> {
    let fails = |s: &[Step]| {
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replay(fsc, s, btrfs_check)));
        match r {
            Ok(Err(e)) => failure_signature(&e) == signature,
            Ok(Ok(())) => false,
            Err(_) => signature == "panic",
        }
    };
    let mut cur = steps.to_vec();
    if !fails(&cur) {
        return cur;
    }
    let mut chunk = cur.len().div_ceil(2).max(1);
    loop {
        let mut progress = false;
        let mut i = 0;
        while i < cur.len() {
            let mut cand = cur.clone();
            cand.drain(i..(i + chunk).min(cur.len()));
            if fails(&cand) {
                cur = cand;
                progress = true;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 && !progress {
            break;
        }
        if !progress {
            chunk = (chunk / 2).max(1);
        }
    }
    cur
}
