//! The comparison of what the engine's read API shows with the model: one node
//! ([`compare_node`]), the paths an operation touched ([`compare_paths`]) and the whole
//! tree ([`compare_tree`]); and [`open_ro`], a fresh read-only open of a device.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ubtrfs_core::kernel_rdev_to_user;
use ubtrfs_core::Device;
use ubtrfs_core::{Error, FsInfo, OpenOptions};
use ubtrfs_core::{Filesystem, Node};

use super::{join, show, Id, Kind, Model, ROOT, TOP_DIR};

fn ftype_of_mode(mode: u32) -> u8 {
    ubtrfs_core::file_type_of(mode)
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
    compare_subtree(fs, fs.top(), m)
}

/// [`compare_tree`] for a model of the subtree under directory `top` (a model per
/// directory, as the concurrent mount test keeps one per thread).
pub fn compare_subtree(fs: &Filesystem, top: Node, m: &Model) -> Result<(), String> {
    let mut ino_of: HashMap<Id, (u64, u64)> = HashMap::new();
    let mut id_of: HashMap<(u64, u64), Id> = HashMap::new();
    // (path, engine node, model node, the tree of the directory holding the entry)
    let mut stack = vec![(Vec::new(), top, ROOT, top.root)];
    let mut seen = BTreeSet::new();
    while let Some((p, node, id, parent_tree)) = stack.pop() {
        // A subvolume's root is inode 256 of a tree of its own; a stand-in is the
        // kernel's inode 2; anything else is in its parent's tree.
        let placeholder = m.placeholders.contains(&id);
        let subvol = id != ROOT && m.subvols.contains_key(&id);
        let fits = if placeholder {
            node.is_placeholder()
        } else if subvol {
            node.root != parent_tree && node.ino == TOP_DIR
        } else {
            !node.is_placeholder() && node.root == parent_tree
        };
        if !fits {
            let what = match (placeholder, subvol) {
                (true, _) => "a subvolume's stand-in",
                (_, true) => "a subvolume root",
                _ => "an inode of its parent's subvolume",
            };
            return Err(format!(
                "{}: inode {} of tree {} (parent's tree {parent_tree}), the model has {what}",
                show(&p),
                node.ino,
                node.root
            ));
        }
        let key = (node.root, node.ino);
        match (ino_of.insert(id, key), id_of.insert(key, id)) {
            (Some(a), _) if a != key => {
                return Err(format!(
                    "{}: hard links of one model node are inodes {a:?} and {key:?}",
                    show(&p),
                ))
            }
            (_, Some(b)) if b != id && !placeholder => {
                return Err(format!(
                    "{}: inode {key:?} also stands for another model node",
                    show(&p),
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
                stack.push((join(&p, name), child.node, c, node.root));
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

/// Opens a device image read-only from scratch (no caches shared with a writer).
pub fn open_ro(dev: Arc<dyn Device>) -> Result<Filesystem, Error> {
    Ok(Filesystem::from_info(FsInfo::open(
        vec![dev],
        OpenOptions::default(),
    )?))
}

/// Simple quotas: every qgroup holds the bytes its subvolumes own (a recount of
/// the extent tree: owner refs of data, header owners of tree blocks), referenced
/// and exclusive alike.
fn compare_simple_quotas(fs: &Filesystem, report: &ubtrfs_core::QuotaReport) -> Result<(), String> {
    let owned =
        ubtrfs_core::tools::subvol_du::owned_bytes(&fs.info, report.enable_gen.unwrap_or(0))
            .map_err(|e| format!("simple quota recount: {e}"))?;
    let groups: BTreeMap<u64, &ubtrfs_core::QgroupEntry> =
        report.qgroups.iter().map(|g| (g.qgroupid, g)).collect();
    for g in &report.qgroups {
        let want: u64 = subvolumes_under(&groups, g.qgroupid)
            .iter()
            .filter_map(|q| owned.get(q))
            .sum();
        if (g.referenced, g.exclusive) != (want, want) {
            return Err(format!(
                "qgroup {} (simple quotas): referenced {} exclusive {}, its subvolumes own {want}",
                ubtrfs_core::format::key::fmt_qgroupid(g.qgroupid),
                g.referenced,
                g.exclusive
            ));
        }
    }
    Ok(())
}

/// The level-0 qgroups (subvolumes) under qgroup `top`, itself if it is one.
fn subvolumes_under(groups: &BTreeMap<u64, &ubtrfs_core::QgroupEntry>, top: u64) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut todo = vec![top];
    while let Some(q) = todo.pop() {
        if !seen.insert(q) {
            continue;
        }
        if q >> 48 == 0 {
            out.insert(q);
        }
        if let Some(x) = groups.get(&q) {
            todo.extend(x.children.iter().copied());
        }
    }
    out
}

/// With quotas on: every qgroup's referenced and exclusive bytes equal a full recount
/// of the filesystem (`subvolume du`'s, computed independently of the quota tree),
/// through the relations for higher levels. Only meaningful when no deleted
/// subvolume is half dropped (a recount leaves dead trees out, accounting keeps them
/// until their drop ends). Ok when quotas are off.
pub fn compare_quotas(fs: &Filesystem) -> Result<(), String> {
    let Some(report) = fs.quotas().map_err(|e| format!("quota tree: {e}"))? else {
        return Ok(());
    };
    if report.inconsistent() {
        return Err("qgroups are marked inconsistent".into());
    }
    if report.simple() {
        return compare_simple_quotas(fs, &report);
    }
    let sharing = ubtrfs_core::tools::subvol_du::compute_sharing(&fs.info)
        .map_err(|e| format!("recount: {e}"))?;
    let groups: BTreeMap<u64, &ubtrfs_core::QgroupEntry> =
        report.qgroups.iter().map(|g| (g.qgroupid, g)).collect();
    for g in &report.qgroups {
        let members = subvolumes_under(&groups, g.qgroupid);
        let (mut rfer, mut excl) = (0u64, 0u64);
        for (set, bytes) in &sharing.by_set {
            let inside = set.iter().filter(|r| members.contains(r)).count();
            if inside > 0 {
                rfer += bytes;
                if inside == set.len() {
                    excl += bytes;
                }
            }
        }
        if (g.referenced, g.exclusive) != (rfer, excl) {
            return Err(format!(
                "qgroup {}: referenced {} exclusive {}, a recount gives {rfer} {excl}",
                ubtrfs_core::format::key::fmt_qgroupid(g.qgroupid),
                g.referenced,
                g.exclusive
            ));
        }
    }
    Ok(())
}
