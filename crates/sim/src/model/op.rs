//! The operations of a workload: [`Op`] (paths relative to the top directory), how
//! each prints, which paths it may change, and the data its writes carry. The model
//! ([`super::Model::apply`]) and the engine ([`super::apply_engine`]) give them their
//! meaning.

use std::collections::BTreeMap;
use std::fmt;

use super::{join, show, Id, Model};
use crate::rng::Rng;

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
    /// Creates a node of any type (`mknod`/`mkdir`/`creat`).
    Create {
        /// Parent directory.
        dir: Vec<u8>,
        /// New name.
        name: Vec<u8>,
        /// Full mode, type bits included.
        mode: u32,
        /// Device number (character and block devices).
        rdev: u64,
    },
    /// Creates a symbolic link.
    Symlink {
        /// Parent directory.
        dir: Vec<u8>,
        /// New name.
        name: Vec<u8>,
        /// Link target.
        target: Vec<u8>,
    },
    /// Writes `write_data(len, seed)` at `offset`.
    Write {
        /// The file.
        path: Vec<u8>,
        /// File offset.
        offset: u64,
        /// Bytes to write.
        len: u64,
        /// Seed of the data ([`write_data`]).
        seed: u64,
    },
    /// Sets the file size.
    Truncate {
        /// The file.
        path: Vec<u8>,
        /// New size.
        size: u64,
    },
    /// Preallocates a range (fallocate mode 0 or FALLOC_FL_KEEP_SIZE).
    Fallocate {
        /// The file.
        path: Vec<u8>,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// FALLOC_FL_KEEP_SIZE: the file size does not grow.
        keep_size: bool,
    },
    /// Removes a non-directory name.
    Unlink {
        /// Parent directory.
        dir: Vec<u8>,
        /// Name to remove.
        name: Vec<u8>,
    },
    /// Removes an empty directory.
    Rmdir {
        /// Parent directory.
        dir: Vec<u8>,
        /// Name to remove.
        name: Vec<u8>,
    },
    /// Renames `odir/oname` to `ndir/nname`, replacing a compatible target.
    Rename {
        /// Old parent directory.
        odir: Vec<u8>,
        /// Old name.
        oname: Vec<u8>,
        /// New parent directory.
        ndir: Vec<u8>,
        /// New name.
        nname: Vec<u8>,
        /// RENAME_NOREPLACE: fail with EEXIST if the new name exists.
        noreplace: bool,
    },
    /// Adds a hard link to a non-directory.
    Link {
        /// The existing file.
        src: Vec<u8>,
        /// Directory of the new name.
        dir: Vec<u8>,
        /// New name.
        name: Vec<u8>,
    },
    /// Sets an extended attribute.
    SetXattr {
        /// The node.
        path: Vec<u8>,
        /// Attribute name.
        name: Vec<u8>,
        /// Attribute value.
        value: Vec<u8>,
    },
    /// Removes an extended attribute.
    RemoveXattr {
        /// The node.
        path: Vec<u8>,
        /// Attribute name.
        name: Vec<u8>,
    },
    /// Changes the permission bits.
    Chmod {
        /// The node.
        path: Vec<u8>,
        /// New permission bits.
        perm: u32,
    },
    /// FALLOC_FL_PUNCH_HOLE.
    PunchHole {
        /// The file.
        path: Vec<u8>,
        /// Start of the hole.
        offset: u64,
        /// Length of the hole.
        len: u64,
    },
    /// FALLOC_FL_ZERO_RANGE (with or without FALLOC_FL_KEEP_SIZE).
    ZeroRange {
        /// The file.
        path: Vec<u8>,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// FALLOC_FL_KEEP_SIZE: the file size does not grow.
        keep_size: bool,
    },
    /// RENAME_EXCHANGE.
    RenameExchange {
        /// Directory of the first name.
        adir: Vec<u8>,
        /// First name.
        aname: Vec<u8>,
        /// Directory of the second name.
        bdir: Vec<u8>,
        /// Second name.
        bname: Vec<u8>,
    },
    /// copy_file_range(2) of `len` bytes (fewer at the source's end; none from at
    /// or past it): on btrfs whole sectors are shared, the rest copied. Never two
    /// overlapping ranges of one file (the VFS refuses those before btrfs sees them).
    CopyRange {
        /// Source file.
        src: Vec<u8>,
        /// Offset in the source.
        src_off: u64,
        /// Destination file.
        dst: Vec<u8>,
        /// Offset in the destination.
        dst_off: u64,
        /// Bytes asked for.
        len: u64,
    },
    /// FIDEDUPERANGE of one range ([`ubtrfs_core::Trans::dedupe_range`]): shares
    /// equal data, changes no contents. The engine only: it never reaches a FUSE
    /// server.
    Dedupe {
        /// Source file.
        src: Vec<u8>,
        /// Offset in the source.
        src_off: u64,
        /// Destination file.
        dst: Vec<u8>,
        /// Offset in the destination.
        dst_off: u64,
        /// Bytes.
        len: u64,
    },
    /// Creates files `bulk<first>`.. `bulk<first + count - 1>` in `dir`, file i with
    /// `i % 300` bytes of data and every fifth with an xattr (grows trees quickly).
    BulkCreate {
        /// Directory to create the files in.
        dir: Vec<u8>,
        /// Number of the first file.
        first: u64,
        /// Number of files.
        count: u64,
    },
    /// Unlinks every non-directory entry of `dir` except every `keep_every`-th one.
    BulkUnlink {
        /// Directory to thin out.
        dir: Vec<u8>,
        /// Keep every `keep_every`-th entry.
        keep_every: u64,
    },
    /// Adds `count` long names (`link_name`) for the non-directory `src` in `dir`:
    /// enough to overflow the INODE_REF item into INODE_EXTREFs on small nodes.
    BulkLink {
        /// The existing non-directory.
        src: Vec<u8>,
        /// Directory of the new names.
        dir: Vec<u8>,
        /// Number of the first name.
        first: u64,
        /// Number of names.
        count: u64,
    },
    /// Creates an empty subvolume `name` in `dir` ([`ubtrfs_core::Trans::create_subvolume`]).
    SubvolCreate {
        /// Parent directory.
        dir: Vec<u8>,
        /// New name.
        name: Vec<u8>,
    },
    /// Snapshots the subvolume whose root directory is `src` ("" = the top level) as
    /// `name` in `dir` ([`ubtrfs_core::Trans::create_snapshot`]); nested subvolumes
    /// show in the snapshot as the kernel's empty stand-in directories.
    Snapshot {
        /// Root directory of the source subvolume.
        src: Vec<u8>,
        /// Parent directory of the snapshot.
        dir: Vec<u8>,
        /// Snapshot name.
        name: Vec<u8>,
        /// A read-only snapshot (changes inside it fail with EROFS).
        readonly: bool,
    },
    /// Deletes the subvolume (or stand-in) entry `name` of `dir` and drops the tree to
    /// the end, as an offline `subvolume delete` does.
    SubvolDelete {
        /// Parent directory.
        dir: Vec<u8>,
        /// Name of the subvolume.
        name: Vec<u8>,
    },
}

/// The name of the `i`-th link [`Op::BulkLink`] adds (200 bytes and more).
pub fn link_name(i: u64) -> Vec<u8> {
    let mut n = b"hardlink-".to_vec();
    n.resize(200, b'x');
    n.extend_from_slice(i.to_string().as_bytes());
    n
}

/// The name of file `i` of [`Op::BulkCreate`].
pub fn bulk_name(i: u64) -> Vec<u8> {
    format!("bulk{i}").into_bytes()
}

/// The data of file `i` of [`Op::BulkCreate`].
pub fn bulk_data(i: u64) -> Vec<u8> {
    (0..i % 300).map(|j| (i + j * 7) as u8).collect()
}

/// Names `BulkUnlink` removes from a directory listing (sorted).
pub fn bulk_victims(entries: &BTreeMap<Vec<u8>, Id>, m: &Model, keep_every: u64) -> Vec<Vec<u8>> {
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
            Op::CopyRange {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => write!(
                f,
                "copy_file_range {} @{src_off} -> {} @{dst_off} len {len}",
                show(src),
                show(dst)
            ),
            Op::Dedupe {
                src,
                src_off,
                dst,
                dst_off,
                len,
            } => write!(
                f,
                "dedupe {} @{src_off} -> {} @{dst_off} len {len}",
                show(src),
                show(dst)
            ),
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
            Op::SubvolCreate { dir, name } => write!(f, "subvolume create {}", p(dir, name)),
            Op::Snapshot {
                src,
                dir,
                name,
                readonly,
            } => write!(
                f,
                "subvolume snapshot {} {} readonly {readonly}",
                show(src),
                p(dir, name)
            ),
            Op::SubvolDelete { dir, name } => write!(f, "subvolume delete {}", p(dir, name)),
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
            Op::CopyRange { src, dst, .. } | Op::Dedupe { src, dst, .. } => {
                vec![src.clone(), dst.clone()]
            }
            Op::SubvolCreate { dir, name }
            | Op::Snapshot { dir, name, .. }
            | Op::SubvolDelete { dir, name } => vec![dir.clone(), join(dir, name)],
        }
    }

    /// Paths the op changes (directories for the entry ops): a change inside a
    /// read-only subvolume fails with EROFS. The source of a copy or snapshot is
    /// only read.
    pub fn written(&self) -> Vec<&[u8]> {
        match self {
            Op::Create { dir, .. }
            | Op::Symlink { dir, .. }
            | Op::Unlink { dir, .. }
            | Op::Rmdir { dir, .. }
            | Op::Link { dir, .. }
            | Op::BulkCreate { dir, .. }
            | Op::BulkUnlink { dir, .. }
            | Op::BulkLink { dir, .. }
            | Op::SubvolCreate { dir, .. }
            | Op::Snapshot { dir, .. }
            | Op::SubvolDelete { dir, .. } => vec![dir],
            Op::Write { path, .. }
            | Op::Truncate { path, .. }
            | Op::Fallocate { path, .. }
            | Op::SetXattr { path, .. }
            | Op::RemoveXattr { path, .. }
            | Op::Chmod { path, .. }
            | Op::PunchHole { path, .. }
            | Op::ZeroRange { path, .. } => vec![path],
            Op::Rename { odir, ndir, .. } => vec![odir, ndir],
            Op::RenameExchange { adir, bdir, .. } => vec![adir, bdir],
            Op::CopyRange { dst, .. } | Op::Dedupe { dst, .. } => vec![dst],
        }
    }

    /// For ops that move or link names between two directories: the two. Across
    /// subvolumes they fail with EXDEV (on a mount the VFS refuses them before the
    /// filesystem sees them: every subvolume is its own FUSE connection).
    pub fn linked_dirs(&self) -> Option<(&[u8], &[u8])> {
        match self {
            Op::Rename { odir, ndir, .. } => Some((odir, ndir)),
            Op::RenameExchange { adir, bdir, .. } => Some((adir, bdir)),
            Op::Link { src, dir, .. } | Op::BulkLink { src, dir, .. } => Some((src, dir)),
            _ => None,
        }
    }
}
