//! `cp` inside a filesystem, with GNU cp's `--reflink` modes: `always` shares every
//! extent (the kernel's FICLONE rules: `Trans::clone_range`), `auto` shares whole
//! sectors and copies the rest (copy_file_range on btrfs), `never` copies the bytes.
//! Directories recursively, symlinks, special files; `archive` keeps owner, mode,
//! times and xattrs (cp -a), else the copy is as cp run by root makes it. An existing
//! destination is overwritten as GNU cp overwrites it: a regular file in place (same
//! inode, its data replaced), a directory merged into, anything else unlinked and
//! made anew. Nothing is committed here. `ubtrfs cp` runs it on an image; a mount's
//! process runs it for `ubtrfs cp MNT ...` and then tells the kernel what the report
//! lists as changed.

use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::inode::inode::NewInode;
use crate::transaction::Trans;
use crate::{now, FilePos, Node};
use ubtrfs_format::consts::*;
use ubtrfs_format::items::InodeItem;

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;
const S_IFREG: u32 = 0o100000;

/// Bytes one clone call shares at most.
const CLONE_CALL_BYTES_MAX: u64 = 1 << 30;
/// Bytes one copy of `never` reads and writes at a time.
const COPY_CHUNK_BYTES: u64 = 8 << 20;

/// How file data is copied (GNU cp's `--reflink`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReflinkMode {
    /// Share every extent; fail where the kernel's clone would.
    Always,
    /// Share what can be shared, copy the rest.
    Auto,
    /// Copy the bytes.
    Never,
}

/// What to copy how.
#[derive(Clone, Debug)]
pub struct CpOptions {
    /// File data.
    pub reflink: ReflinkMode,
    /// Keep owner, mode, times and xattrs.
    pub archive: bool,
    /// Copy directories (with everything below them).
    pub recursive: bool,
}

/// What a copy did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpReport {
    /// File bytes that share the source's extents.
    pub shared_bytes: u64,
    /// File bytes written anew.
    pub copied_bytes: u64,
    /// Things a user should know (a nested subvolume copied as a directory).
    pub warnings: Vec<String>,
    /// Every name the copy made or replaced in a directory that existed before it
    /// (directory, name): what a cache of names (a mount's kernel) must forget.
    pub changed_names: Vec<(Node, Vec<u8>)>,
    /// Inodes that existed before the copy and whose data or attributes it changed
    /// (a file overwritten in place, a directory merged into with `archive`): what
    /// a cache of pages and attributes must forget.
    pub rewritten: Vec<Node>,
}

/// The parent path and last name of `path` (no `.`/`..` as the name).
fn name_of(path: &str) -> Result<(String, Vec<u8>)> {
    let trimmed = path.trim_end_matches('/');
    let (parent, name) = match trimmed.rfind('/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => ("", trimmed),
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(Error::Invalid(format!("{path}: not a name to create")));
    }
    Ok((parent.to_string(), name.as_bytes().to_vec()))
}

/// Copies `src` to `dest`, paths that `resolve` turns into nodes: into `dest` under
/// the source's name when `dest` is a directory, else as `dest`.
pub fn cp_paths(
    t: &mut Trans,
    resolve: &dyn Fn(&Filesystem, &str) -> Result<Node>,
    src: &str,
    dest: &str,
    opts: &CpOptions,
) -> Result<CpReport> {
    let s = resolve(&t.fs, src)?;
    let si = t.fs.inode_item(s)?;
    if si.mode & S_IFMT == S_IFDIR && !opts.recursive {
        return Err(Error::IsDir(format!("{src} (use -r)")));
    }
    let (dir, name) = match resolve(&t.fs, dest) {
        Ok(d) if t.fs.inode_item(d)?.mode & S_IFMT == S_IFDIR => (d, name_of(src)?.1),
        _ => {
            let (parent, name) = name_of(dest)?;
            (resolve(&t.fs, &parent)?, name)
        }
    };
    if t.fs.subvol_root_item(dir.root)?.flags & ROOT_SUBVOL_RDONLY != 0 {
        return Err(Error::ReadOnly(dest.to_string()));
    }
    let mut c = Copy {
        opts,
        report: CpReport::default(),
    };
    c.copy(t, s, dir, true, &name, src)?;
    Ok(c.report)
}

struct Copy<'a> {
    opts: &'a CpOptions,
    report: CpReport,
}

impl Copy<'_> {
    /// Copies `src` as `name` in `dir`; `dir_existed`: `dir` was there before the
    /// copy began (its names may be cached by someone).
    fn copy(
        &mut self,
        t: &mut Trans,
        src: Node,
        dir: Node,
        dir_existed: bool,
        name: &[u8],
        shown: &str,
    ) -> Result<()> {
        let si = t.read_inode(src.root, src.ino)?;
        if si.mode & S_IFMT == S_IFDIR && src.root == dir.root && is_below(t, dir, src)? {
            return Err(Error::Invalid(format!(
                "{shown}: cannot copy a directory into itself"
            )));
        }
        let attr = if self.opts.archive {
            NewInode {
                mode: si.mode,
                uid: si.uid,
                gid: si.gid,
                rdev: si.rdev,
                time: now(),
            }
        } else {
            // As cp run by root without -p: owned by root, the mode less a 022
            // umask, no set-id bits when the owner changes.
            let mut perm = si.mode & 0o7777 & !0o022;
            if si.uid != 0 || si.gid != 0 {
                perm &= !0o6000;
            }
            NewInode {
                mode: (si.mode & S_IFMT) | perm,
                uid: 0,
                gid: 0,
                rdev: si.rdev,
                time: now(),
            }
        };
        // What the name holds now: a subvolume's entry resolves to its root, so a
        // directory merged into may lie in another tree.
        let existing = t.fs.lookup(dir, name)?.map(|e| (e.node, e.ty));
        if let Some((node, _)) = existing {
            if node == src {
                // GNU cp's refusal: overwriting a file in place with itself (the same
                // name, or another hard link of it) would lose its data.
                return Err(Error::Invalid(format!(
                    "{shown}: the source and the destination are the same file"
                )));
            }
        }
        let not_dir = |what: &str| {
            Error::Exists(format!("{shown}: cannot overwrite a directory with {what}"))
        };
        if dir_existed {
            self.report.changed_names.push((dir, name.to_vec()));
        }
        let dst = match si.mode & S_IFMT {
            S_IFDIR => match existing {
                Some((node, FT_DIR)) => {
                    if node.is_placeholder() {
                        // The empty stand-in of a subvolume a snapshot does not hold:
                        // nothing can be made in it, as on the kernel.
                        return Err(Error::NotPermitted(format!(
                            "{shown}: the destination is the placeholder of a subvolume"
                        )));
                    }
                    if node.root != dir.root
                        && t.fs.subvol_root_item(node.root)?.flags & ROOT_SUBVOL_RDONLY != 0
                    {
                        return Err(Error::ReadOnly(shown.to_string()));
                    }
                    node
                }
                Some(_) => {
                    return Err(Error::Exists(format!(
                        "{shown}: cannot overwrite a non-directory with a directory"
                    )))
                }
                None => Node::new(dir.root, t.create(dir.root, dir.ino, name, attr)?),
            },
            S_IFLNK => {
                match existing {
                    Some((_, FT_DIR)) => return Err(not_dir("a symlink")),
                    Some(_) => t.unlink(dir.root, dir.ino, name, now())?,
                    None => {}
                }
                let target = t.fs.readlink(src)?;
                Node::new(dir.root, t.symlink(dir.root, dir.ino, name, &target, attr)?)
            }
            S_IFREG => match existing {
                Some((node, FT_REG_FILE)) => {
                    t.truncate(node.root, node.ino, 0, now())?;
                    self.report.rewritten.push(node);
                    node
                }
                Some((_, FT_DIR)) => return Err(not_dir("a file")),
                Some(_) => {
                    return Err(Error::Exists(format!(
                        "{shown}: the destination exists and is not a regular file"
                    )))
                }
                None => Node::new(dir.root, t.create(dir.root, dir.ino, name, attr)?),
            },
            _ => {
                match existing {
                    Some((_, FT_DIR)) => return Err(not_dir("a special file")),
                    Some(_) => t.unlink(dir.root, dir.ino, name, now())?,
                    None => {}
                }
                Node::new(dir.root, t.create(dir.root, dir.ino, name, attr)?)
            }
        };
        // A directory or file that was there before: cp -a gives it the source's
        // owner and mode too (a new inode got them when it was made).
        let kept = matches!(existing, Some((n, _)) if n == dst);
        if kept && self.opts.archive && si.mode & S_IFMT == S_IFDIR {
            self.report.rewritten.push(dst);
        }
        match si.mode & S_IFMT {
            S_IFREG => self.copy_data(t, src, &si, dst, shown)?,
            S_IFDIR => {
                for e in t.fs.readdir(src)? {
                    if e.node.root != src.root {
                        // As cp -r on a kernel mount: a nested subvolume is copied as a
                        // plain directory with its contents.
                        self.report.warnings.push(format!(
                            "{shown}/{}: a subvolume, copied as a directory",
                            String::from_utf8_lossy(&e.name)
                        ));
                    }
                    let child = format!("{shown}/{}", String::from_utf8_lossy(&e.name));
                    self.copy(t, e.node, dst, kept, &e.name, &child)?;
                }
            }
            _ => {}
        }
        if self.opts.archive {
            for (n, v) in t.fs.xattrs(src)? {
                t.set_xattr(dst.root, dst.ino, &n, &v, now())?;
            }
            let mut di = t.read_inode(dst.root, dst.ino)?;
            if kept {
                di.mode = (di.mode & S_IFMT) | (si.mode & 0o7777);
                di.uid = si.uid;
                di.gid = si.gid;
            }
            di.atime = si.atime;
            di.mtime = si.mtime;
            t.write_inode(dst.root, dst.ino, &di)?;
        }
        Ok(())
    }

    fn copy_data(
        &mut self,
        t: &mut Trans,
        src: Node,
        si: &InodeItem,
        dst: Node,
        shown: &str,
    ) -> Result<()> {
        let size = si.size;
        match self.opts.reflink {
            ReflinkMode::Always => {
                let mut off = 0;
                while off < size {
                    let n = (size - off).min(CLONE_CALL_BYTES_MAX);
                    t.clone_range(
                        FilePos::new(src.root, src.ino, off),
                        FilePos::new(dst.root, dst.ino, off),
                        n,
                        now(),
                    )
                    .map_err(|e| match e {
                        Error::Invalid(m) => Error::Invalid(format!("{shown}: {m}")),
                        e => e,
                    })?;
                    off += n;
                }
                self.report.shared_bytes += size;
            }
            ReflinkMode::Auto => {
                let mut off = 0;
                while off < size {
                    let (n, shared) = t.copy_file_range(
                        FilePos::new(src.root, src.ino, off),
                        FilePos::new(dst.root, dst.ino, off),
                        size - off,
                        now(),
                    )?;
                    if n == 0 {
                        break;
                    }
                    if shared {
                        self.report.shared_bytes += n;
                    } else {
                        self.report.copied_bytes += n;
                    }
                    off += n;
                }
            }
            ReflinkMode::Never => {
                let mut off = 0;
                while off < size {
                    let n = (size - off).min(COPY_CHUNK_BYTES);
                    let data = t.read_file_range(src.root, src.ino, off, n as usize, si)?;
                    t.write(dst.root, dst.ino, off, &data, now())?;
                    off += n;
                }
                self.report.copied_bytes += size;
                t.truncate(dst.root, dst.ino, size, now())?;
            }
        }
        Ok(())
    }
}

/// Whether directory `node` is `ancestor` or below it (same subvolume).
fn is_below(t: &Trans, node: Node, ancestor: Node) -> Result<bool> {
    let mut p = t.fs.dir_path_in(node.root, node.ino)?;
    let mut a = t.fs.dir_path_in(ancestor.root, ancestor.ino)?;
    p.push(b'/');
    a.push(b'/');
    Ok(p.starts_with(&a))
}
