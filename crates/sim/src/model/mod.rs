//! A model filesystem for differential testing of the write engine: the in-memory
//! state and its semantics. Submodules hold the rest:
//!
//! * here: [`Model`], an in-memory filesystem (directories, regular files, symlinks,
//!   special files; hard links share one node; modes, xattrs) with the semantics the
//!   engine's `Trans` API promises ([`Model::apply`]), including the errno each invalid
//!   call fails with;
//! * [`op`]: the operations ([`Op`]) both sides apply, and the data they write;
//! * [`gen`]: the random workload ([`gen_op`]: a random [`Op`] for the current model
//!   state) and the filesystem features of a run ([`FsConfig`]), both from seeds;
//! * [`compare`]: the engine's read API against the model ([`compare_tree`],
//!   [`compare_paths`], [`compare_node`]) and [`open_ro`];
//! * [`run`]: the engine side ([`apply_engine`], [`Harness`], [`SparseMem`]): seeded
//!   runs ([`run_seed`]), [`replay`] of recorded [`Step`]s and [`minimize`].
//!
//! Everything public is re-exported here: `ubtrfs_sim::model::NAME` works for all.

use std::collections::{BTreeMap, BTreeSet};

use ubtrfs_core::mode::{S_IFDIR, S_IFMT, S_IFREG};

pub mod compare;
pub mod gen;
pub mod op;
pub mod run;

pub use compare::{
    compare_node, compare_paths, compare_quotas, compare_subtree, compare_tree, open_ro,
};
pub use gen::{gen_op, gen_op_with, FsConfig};
pub use op::{bulk_data, bulk_name, bulk_victims, link_name, write_data, Op};
pub use run::{
    apply_engine, check_fsync_cut, failure_signature, minimize, replay, run_seed,
    run_seed_recorded, time_of, Harness, RunConfig, RunStats, SparseMem, Step,
};

/// Tree id of the top-level subvolume.
pub const FS_TREE: u64 = 5;
/// Inode number of the top-level subvolume's root directory (the model's [`ROOT`]).
pub const TOP_DIR: u64 = 256;

/// errno ENOENT: no such file or directory.
pub const ENOENT: i32 = 2;
/// errno EEXIST: file exists.
pub const EEXIST: i32 = 17;
/// errno ENOTDIR: not a directory.
pub const ENOTDIR: i32 = 20;
/// errno EISDIR: is a directory.
pub const EISDIR: i32 = 21;
/// errno EINVAL: invalid argument.
pub const EINVAL: i32 = 22;
/// errno ENOSPC: no space left on device.
pub const ENOSPC: i32 = 28;
/// errno ENOTEMPTY: directory not empty.
pub const ENOTEMPTY: i32 = 39;
/// errno EOPNOTSUPP: operation not supported.
pub const EOPNOTSUPP: i32 = 95;
/// errno EROFS: read-only file system (a read-only snapshot).
pub const EROFS: i32 = 30;
/// errno EXDEV: cross-device link (between subvolumes).
pub const EXDEV: i32 = 18;

/// Identity of a model node (survives renames; shared by hard links).
pub type Id = u64;
/// The model's root directory.
pub const ROOT: Id = 0;

/// Largest file the workload grows (keeps data well inside a small device).
pub const FILE_SIZE_MAX: u64 = 768 << 10;

/// What a model node is, with its contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory: its entries, name to identity.
    Dir(BTreeMap<Vec<u8>, Id>),
    /// A regular file: its bytes.
    File(Vec<u8>),
    /// A symbolic link: its target.
    Symlink(Vec<u8>),
    /// fifo, socket, character or block device (mode says which); kernel rdev.
    Special(u64),
}

/// One node of the model (an inode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MNode {
    /// Type and contents.
    pub kind: Kind,
    /// Full mode, type bits included.
    pub mode: u32,
    /// Number of names (directories: always 1, as btrfs keeps them).
    pub nlink: u32,
    /// Extended attributes, name to value.
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
    /// Every node by identity.
    pub nodes: BTreeMap<Id, MNode>,
    next_id: Id,
    /// Subvolume roots: the top level ([`ROOT`]) and the root directory of every
    /// subvolume and snapshot, with its read-only flag.
    pub subvols: BTreeMap<Id, bool>,
    /// The empty stand-in directories (the kernel's inode 2) that a snapshot shows
    /// for the subvolumes nested in its source.
    pub placeholders: BTreeSet<Id>,
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

/// `dir/name` as the model spells paths (relative, no leading slash).
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        let mut p = dir.to_vec();
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

/// The kernel's stand-in for a nested subvolume inside a snapshot: an empty
/// directory, mode 0755, one link, no xattrs.
fn placeholder_node() -> MNode {
    MNode {
        kind: Kind::Dir(BTreeMap::new()),
        mode: S_IFDIR | 0o755,
        nlink: 1,
        xattrs: BTreeMap::new(),
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
    /// A model holding only the root directory (mode `root_mode`), for `nodesize` tree blocks.
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
            subvols: BTreeMap::from([(ROOT, false)]),
            placeholders: BTreeSet::new(),
            max_item: nodesize as usize - 101 - 25,
        }
    }

    /// Node `id` (panics if there is none).
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

    /// Resolves a path to (the root of the subvolume it is in, the node); a
    /// subvolume's root directory is in itself.
    pub fn resolve_sv(&self, path: &[u8]) -> Option<(Id, Id)> {
        let (mut sv, mut cur) = (ROOT, ROOT);
        for comp in path.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            cur = *self.nodes[&cur].entries()?.get(comp)?;
            if self.subvols.contains_key(&cur) {
                sv = cur;
            }
        }
        Some((sv, cur))
    }

    /// True for a subvolume's entry: its root directory or a stand-in.
    pub fn is_subvol_entry(&self, id: Id) -> bool {
        (id != ROOT && self.subvols.contains_key(&id)) || self.placeholders.contains(&id)
    }

    /// The nodes of subvolume `sv` (its root first), not descending into nested
    /// subvolumes; stand-ins are included.
    pub fn subvol_nodes(&self, sv: Id) -> Vec<Id> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        let mut stack = vec![sv];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            out.push(id);
            if let Some(e) = self.nodes[&id].entries() {
                stack.extend(
                    e.values()
                        .filter(|c| !self.subvols.contains_key(c))
                        .rev()
                        .copied(),
                );
            }
        }
        out
    }

    /// The subvolumes whose entries are in subvolume `sv` (a subvolume holding any
    /// cannot be deleted).
    fn nested_subvols(&self, sv: Id) -> Vec<Id> {
        self.subvol_nodes(sv)
            .into_iter()
            .filter_map(|id| self.nodes[&id].entries())
            .flat_map(|e| e.values().copied())
            .filter(|c| self.subvols.contains_key(c))
            .collect()
    }

    /// The checks every op passes first, as the harness makes them before the
    /// engine sees the op: a change inside a read-only subvolume (EROFS), a name
    /// moved or linked between subvolumes (EXDEV). Paths that do not resolve are
    /// left to the op (ENOENT there).
    fn subvol_rules(&self, op: &Op) -> Result<(), i32> {
        for p in op.written() {
            if let Some((sv, _)) = self.resolve_sv(p) {
                if self.subvols[&sv] {
                    return Err(EROFS);
                }
            }
        }
        if let Some((a, b)) = op.linked_dirs() {
            if let (Some((x, _)), Some((y, _))) = (self.resolve_sv(a), self.resolve_sv(b)) {
                if x != y {
                    return Err(EXDEV);
                }
            }
        }
        Ok(())
    }

    /// A snapshot of subvolume `src` named `name` in directory `dir`: a copy of its
    /// nodes (hard links stay one node; nested subvolumes become stand-ins).
    fn snapshot(&mut self, src: Id, dir: Id, name: &[u8], readonly: bool) -> Id {
        let mut copy_of: BTreeMap<Id, Id> = BTreeMap::new();
        for old in self.subvol_nodes(src) {
            let id = self.next_id;
            self.next_id += 1;
            copy_of.insert(old, id);
        }
        for (&old, &new) in &copy_of {
            if self.placeholders.contains(&old) {
                self.placeholders.insert(new);
            }
            let mut n = self.nodes[&old].clone();
            if let Kind::Dir(e) = &mut n.kind {
                for c in e.values_mut() {
                    *c = match copy_of.get(c) {
                        Some(&x) => x,
                        None => {
                            // A nested subvolume: an empty stand-in.
                            let id = self.next_id;
                            self.next_id += 1;
                            self.placeholders.insert(id);
                            id
                        }
                    };
                }
            }
            self.nodes.insert(new, n);
        }
        // The stand-ins' nodes (made while copying the entries).
        let standins: Vec<Id> = self
            .placeholders
            .iter()
            .filter(|p| !self.nodes.contains_key(p))
            .copied()
            .collect();
        for p in standins {
            self.nodes.insert(p, placeholder_node());
        }
        let root = copy_of[&src];
        self.dir_mut(dir).insert(name.to_vec(), root);
        self.subvols.insert(root, readonly);
        root
    }

    /// Removes subvolume `sv` (or a stand-in) with everything in it.
    fn remove_subvol(&mut self, sv: Id) {
        for id in self.subvol_nodes(sv) {
            self.nodes.remove(&id);
            self.placeholders.remove(&id);
        }
        self.subvols.remove(&sv);
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

    /// A new node `name` in directory `dir` (EEXIST when the name is taken).
    fn create(&mut self, dir: &[u8], name: &[u8], kind: Kind, mode: u32) -> Result<Id, i32> {
        let (d, existing) = self.lookup(dir, name)?;
        if existing.is_some() {
            return Err(EEXIST);
        }
        let n = MNode {
            kind,
            mode,
            nlink: 1,
            xattrs: BTreeMap::new(),
        };
        Ok(self.add(d, name, n))
    }

    fn drop_name(&mut self, dir: Id, name: &[u8]) {
        let id = self.dir_mut(dir).remove(name).expect("name exists");
        let n = self.nodes.get_mut(&id).expect("node exists");
        n.nlink -= 1;
        if n.nlink == 0 || n.is_dir() {
            self.nodes.remove(&id);
            // An empty subvolume (rmdir deletes it) or a stand-in.
            self.subvols.remove(&id);
            self.placeholders.remove(&id);
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
        self.subvol_rules(op)?;
        match op {
            Op::SubvolCreate { dir, name } => {
                let (d, existing) = self.lookup(dir, name)?;
                if existing.is_some() {
                    return Err(EEXIST);
                }
                let id = self.add(d, name, placeholder_node());
                self.subvols.insert(id, false);
                return Ok(Some(id));
            }
            Op::Snapshot {
                src,
                dir,
                name,
                readonly,
            } => {
                let (_, s) = self.resolve_sv(src).ok_or(ENOENT)?;
                if !self.subvols.contains_key(&s) {
                    return Err(EINVAL);
                }
                let (d, existing) = self.lookup(dir, name)?;
                if existing.is_some() {
                    return Err(EEXIST);
                }
                return Ok(Some(self.snapshot(s, d, name, *readonly)));
            }
            Op::SubvolDelete { dir, name } => {
                let (d, existing) = self.lookup(dir, name)?;
                let id = existing.ok_or(ENOENT)?;
                if !self.is_subvol_entry(id) {
                    return Err(EINVAL);
                }
                if self.subvols.contains_key(&id) && !self.nested_subvols(id).is_empty() {
                    return Err(ENOTEMPTY);
                }
                self.dir_mut(d).remove(name.as_slice());
                self.remove_subvol(id);
            }
            Op::Create {
                dir,
                name,
                mode,
                rdev,
            } => {
                let kind = match mode & S_IFMT {
                    S_IFDIR => Kind::Dir(BTreeMap::new()),
                    S_IFREG => Kind::File(Vec::new()),
                    0o020000 | 0o060000 => Kind::Special(*rdev),
                    _ => Kind::Special(0),
                };
                return self.create(dir, name, kind, *mode).map(Some);
            }
            Op::Symlink { dir, name, target } => {
                // Targets live in one inline extent of less than a sector.
                if target.len() >= 4096 || target.len() > self.max_item - 21 {
                    return Err(EINVAL);
                }
                let kind = Kind::Symlink(target.clone());
                return self.create(dir, name, kind, 0o120777).map(Some);
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
            }
            Op::Truncate { path, size } => {
                self.file_mut(path)?.resize(*size as usize, 0);
            }
            Op::CopyRange {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => {
                let data = self.file_mut(src)?;
                let so = *src_off as usize;
                if so >= data.len() {
                    return Ok(None);
                }
                let n = (*len as usize).min(data.len() - so);
                let piece = data[so..so + n].to_vec();
                let f = self.file_mut(dst)?;
                let off = *dst_off as usize;
                if f.len() < off + n {
                    f.resize(off + n, 0);
                }
                f[off..off + n].copy_from_slice(&piece);
            }
            Op::Dedupe {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => {
                // Trans::dedupe_range's rules (the VFS's for FIDEDUPERANGE); the
                // contents never change.
                const SECTOR: u64 = 4096;
                let s = self.file_mut(src)?.len() as u64;
                let d = self.file_mut(dst)?.len() as u64;
                if *len == 0 {
                    return Ok(None);
                }
                if src_off % SECTOR != 0 || dst_off % SECTOR != 0 {
                    return Err(EINVAL);
                }
                if src_off + len > s || dst_off + len > d {
                    return Err(EINVAL);
                }
                let at_eofs = src_off + len == s && dst_off + len == d;
                let len = if at_eofs { *len } else { len - len % SECTOR };
                if len == 0 {
                    return Ok(None);
                }
                let aligned = len.next_multiple_of(SECTOR);
                let same = self.resolve(src) == self.resolve(dst);
                if same && *src_off < dst_off + aligned && *dst_off < src_off + aligned {
                    return Err(EINVAL);
                }
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
            }
            Op::Unlink { dir, name } => {
                let (d, existing) = self.lookup(dir, name)?;
                let id = existing.ok_or(ENOENT)?;
                if self.nodes[&id].is_dir() {
                    return Err(EISDIR);
                }
                self.drop_name(d, name);
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
                if self.placeholders.contains(&src) {
                    // The engine's answer; the kernel's btrfs_rename: EPERM.
                    return Err(EINVAL);
                }
                if src_dir && self.is_ancestor_or_self(src, nd) {
                    return Err(EINVAL);
                }
                if let Some(dst) = dst {
                    if *noreplace {
                        return Err(EEXIST);
                    }
                    if self.is_subvol_entry(dst) {
                        // Over a subvolume's entry: ENOTEMPTY, empty or not.
                        return Err(ENOTEMPTY);
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
            }
            Op::SetXattr { path, name, value } => {
                let id = self.resolve(path).ok_or(ENOENT)?;
                // Names with the same hash share one XATTR_ITEM (btrfs_setxattr:
                // ENOSPC when the item cannot hold them all).
                let hash = ubtrfs_core::format::csum::name_hash(name);
                let in_item: usize = self.nodes[&id]
                    .xattrs
                    .iter()
                    .filter(|(n, _)| *n != name && ubtrfs_core::format::csum::name_hash(n) == hash)
                    .map(|(n, v)| 30 + n.len() + v.len())
                    .sum();
                if in_item + 30 + name.len() + value.len() > self.max_item {
                    return Err(ENOSPC);
                }
                self.nodes
                    .get_mut(&id)
                    .expect("resolved")
                    .xattrs
                    .insert(name.clone(), value.clone());
            }
            Op::RemoveXattr { path, name } => {
                let id = self.resolve(path).ok_or(ENOENT)?;
                let n = self.nodes.get_mut(&id).expect("resolved");
                n.xattrs.remove(name).ok_or(ENOENT)?;
            }
            Op::Chmod { path, perm } => {
                let id = self.resolve(path).ok_or(ENOENT)?;
                let n = self.nodes.get_mut(&id).expect("resolved");
                n.mode = (n.mode & S_IFMT) | (perm & 0o7777);
            }
            Op::PunchHole { path, offset, len }
            | Op::ZeroRange {
                path, offset, len, ..
            } => {
                let f = self.file_mut(path)?;
                let end = (offset + len).min(f.len() as u64) as usize;
                if (*offset as usize) < end {
                    f[*offset as usize..end].fill(0);
                }
                // Zero range without KEEP_SIZE also extends the file.
                let grow = matches!(
                    op,
                    Op::ZeroRange {
                        keep_size: false,
                        ..
                    }
                );
                if grow && (offset + len) as usize > f.len() {
                    f.resize((offset + len) as usize, 0);
                }
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
                if self.is_subvol_entry(a) || self.is_subvol_entry(b) {
                    // Not implemented by the engine (the kernel exchanges them).
                    return Err(EOPNOTSUPP);
                }
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
            }
            Op::BulkUnlink { dir, keep_every } => {
                let d = self.resolve(dir).ok_or(ENOENT)?;
                let victims =
                    bulk_victims(self.nodes[&d].entries().ok_or(ENOTDIR)?, self, *keep_every);
                for v in victims {
                    self.drop_name(d, &v);
                }
            }
        }
        Ok(None)
    }
}
