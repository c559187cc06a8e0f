//! The random workload and the configuration of a run, both drawn from seeds:
//! [`gen_op`] gives a random [`Op`] for the current model state, driven by [`Rng`]:
//! creates (files, directories, special files, symlinks), writes at aligned/unaligned
//! offsets and past EOF, truncates, punch hole, zero range, fallocate, unlink, rmdir,
//! renames (replacing, noreplace, exchange), hard links (up to INODE_EXTREF overflow),
//! xattrs, chmod, bulk creates/unlinks that grow and shrink trees by levels, names with
//! equal hashes, and a share of calls that must fail with a given errno; with
//! [`gen_op_with`], subvolume create, snapshot and delete too. [`FsConfig`]
//! is the features a run uses (node size, dup metadata, NO_HOLES, checksum algorithm,
//! block group tree, compression).

use ubtrfs_compress::Compression;
use ubtrfs_core::format::csum::CsumType;
use ubtrfs_core::mode::{S_IFDIR, S_IFREG};
use ubtrfs_core::tools::mkfs::MkfsOptions;

use super::{split, time_of, Kind, Model, Op, FILE_SIZE_MAX};
use crate::rng::Rng;

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

/// The size of the file at `path` (0 for anything else).
fn file_len(m: &Model, path: &[u8]) -> u64 {
    m.resolve(path).map_or(0, |id| match &m.node(id).kind {
        Kind::File(d) => d.len() as u64,
        _ => 0,
    })
}

/// How many bytes from `a`@`a_off` equal those from `b`@`b_off`, in whole sectors
/// (or up to both files' ends).
fn equal_prefix(m: &Model, a: &[u8], a_off: u64, b: &[u8], b_off: u64) -> u64 {
    let data = |p: &[u8]| {
        m.resolve(p).and_then(|id| match &m.node(id).kind {
            Kind::File(d) => Some(d.clone()),
            _ => None,
        })
    };
    let (Some(x), Some(y)) = (data(a), data(b)) else {
        return 0;
    };
    let (xo, yo) = (a_off as usize, b_off as usize);
    if xo > x.len() || yo > y.len() {
        return 0;
    }
    let n = x[xo..]
        .iter()
        .zip(&y[yo..])
        .take_while(|(p, q)| p == q)
        .count();
    if xo + n == x.len() && yo + n == y.len() {
        n as u64
    } else {
        (n - n % 4096) as u64
    }
}

/// One of `paths` (none the root), as (parent directory, name).
fn pick_entry(r: &mut Rng, paths: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
    let (d, n) = split(pick::<Vec<u8>>(r, paths)).expect("not the root");
    (d.to_vec(), n.to_vec())
}

/// A random operation for the model's current state. Most are valid; some target
/// existing names, non-empty directories and so on, and must fail the same way.
/// No subvolume operations (see [`gen_op_with`]).
pub fn gen_op(m: &Model, r: &mut Rng) -> Op {
    gen_op_with(m, r, false)
}

/// A random subvolume operation: create, snapshot (of the top level, of
/// subvolumes, of snapshots, read-only or not), delete (of subvolumes, snapshots,
/// stand-ins, refused ones), rmdir of one, and changes inside a read-only snapshot
/// (EROFS). None when the state offers nothing for the drawn kind.
fn gen_subvol_op(m: &Model, r: &mut Rng, dirs: &[Vec<u8>], ro: &[Vec<u8>]) -> Option<Op> {
    let paths = m.paths();
    let roots: Vec<&Vec<u8>> = paths
        .iter()
        .filter(|(_, id)| m.subvols.contains_key(id))
        .map(|(p, _)| p)
        .collect();
    // Entries that may be deleted: in a writable parent.
    let entries: Vec<&Vec<u8>> = paths
        .iter()
        .filter(|(p, id)| {
            m.is_subvol_entry(**id)
                && split(p)
                    .is_some_and(|(d, _)| m.resolve_sv(d).is_some_and(|(sv, _)| !m.subvols[&sv]))
        })
        .map(|(p, _)| p)
        .collect();
    Some(match r.below(10) {
        0..=2 => Op::SubvolCreate {
            dir: pick(r, dirs).clone(),
            name: gen_name(r),
        },
        3..=5 => Op::Snapshot {
            src: (*pick(r, &roots)).clone(),
            dir: pick(r, dirs).clone(),
            name: gen_name(r),
            readonly: r.chance(1, 3),
        },
        6 | 7 => {
            if entries.is_empty() || r.chance(1, 8) {
                Op::SubvolDelete {
                    dir: pick(r, dirs).clone(),
                    name: gen_name(r),
                }
            } else {
                let (d, n) = split(pick::<&Vec<u8>>(r, &entries)).expect("not the root");
                Op::SubvolDelete {
                    dir: d.to_vec(),
                    name: n.to_vec(),
                }
            }
        }
        8 => {
            if entries.is_empty() {
                return None;
            }
            let (d, n) = split(pick::<&Vec<u8>>(r, &entries)).expect("not the root");
            Op::Rmdir {
                dir: d.to_vec(),
                name: n.to_vec(),
            }
        }
        _ => {
            if ro.is_empty() {
                return None;
            }
            let p = pick(r, ro).clone();
            match &m.node(m.resolve(&p)?).kind {
                Kind::File(_) if r.chance(1, 2) => Op::Write {
                    path: p,
                    offset: r.below(5000),
                    len: r.range(1, 9000),
                    seed: r.next_u64(),
                },
                Kind::Dir(_) if r.chance(1, 2) => Op::Create {
                    dir: p,
                    name: gen_name(r),
                    mode: S_IFREG | 0o644,
                    rdev: 0,
                },
                _ => Op::SetXattr {
                    path: p,
                    name: pick(r, &XATTR_NAMES).to_vec(),
                    value: b"v".to_vec(),
                },
            }
        }
    })
}

/// [`gen_op`]; with `subvols`, one op in twenty is a subvolume operation
/// (`gen_subvol_op`: create, snapshot, delete; those may commit, so never inside
/// an overlapped commit).
/// Paths inside read-only snapshots and the stand-ins of nested subvolumes are
/// left to those: every other op picks paths elsewhere.
pub fn gen_op_with(m: &Model, r: &mut Rng, subvols: bool) -> Op {
    let paths = m.paths();
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut nondirs = Vec::new();
    let mut all = Vec::new();
    let mut ro = Vec::new();
    for (p, &id) in &paths {
        if m.placeholders.contains(&id) {
            continue;
        }
        if m.resolve_sv(p).is_some_and(|(sv, _)| m.subvols[&sv]) {
            ro.push(p.clone());
            continue;
        }
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
    // A file and its size; none when there are no files.
    let some_file = |r: &mut Rng| -> Option<(Vec<u8>, u64)> {
        if files.is_empty() {
            return None;
        }
        let path = pick(r, &files).clone();
        let len = file_len(m, &path);
        Some((path, len))
    };
    loop {
        if subvols && r.chance(1, 20) {
            match gen_subvol_op(m, r, &dirs, &ro) {
                Some(op) => return op,
                None => continue,
            }
        }
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
                let Some((path, cur)) = some_file(r) else {
                    continue;
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
                let Some((path, cur)) = some_file(r) else {
                    continue;
                };
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
                let Some((path, cur)) = some_file(r) else {
                    continue;
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
                    let (dir, name) = pick_entry(r, &nondirs);
                    Op::Unlink { dir, name }
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
                // Subvolume entries: the engine does not exchange them.
                let plain: Vec<Vec<u8>> = all
                    .iter()
                    .filter(|p| m.resolve(p).is_some_and(|id| !m.is_subvol_entry(id)))
                    .cloned()
                    .collect();
                if plain.is_empty() {
                    continue;
                }
                let (adir, aname) = pick_entry(r, &plain);
                let (bdir, bname) = pick_entry(r, &plain);
                Op::RenameExchange {
                    adir,
                    aname,
                    bdir,
                    bname,
                }
            }
            62..=68 => {
                if all.is_empty() {
                    continue;
                }
                let (odir, oname) = pick_entry(r, &all);
                let (ndir, nname) = if r.chance(1, 3) {
                    // Onto an existing name (replace, or a type/emptiness error).
                    pick_entry(r, &all)
                } else {
                    (pick(r, &dirs).clone(), gen_name(r))
                };
                Op::Rename {
                    odir,
                    oname,
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
            95..=96 => {
                let (Some((src, slen)), Some((dst, dlen))) = (some_file(r), some_file(r)) else {
                    continue;
                };
                let src_off = match r.below(4) {
                    0 => 0,
                    1 => r.below(slen / 4096 + 1) * 4096,
                    2 => r.below(slen + 1),
                    _ => slen + r.below(5000),
                };
                let dst_off = match r.below(4) {
                    0 => src_off,
                    1 => r.below(dlen / 4096 + 2) * 4096,
                    2 => r.below(dlen + 5000),
                    _ => dlen.next_multiple_of(4096),
                }
                .min(FILE_SIZE_MAX - 1);
                let len = match r.below(3) {
                    0 => 4096 * r.range(1, 40),
                    1 => r.range(1, 200_000),
                    // To the source's end of file, give or take.
                    _ => slen.saturating_sub(src_off) + r.below(3),
                }
                .min(FILE_SIZE_MAX - dst_off);
                // The VFS refuses overlapping ranges of one file (EINVAL) before the
                // filesystem sees them: not worth generating.
                let n = len.min(slen.saturating_sub(src_off));
                if m.resolve(&src) == m.resolve(&dst)
                    && src_off < dst_off + n
                    && dst_off < src_off + n
                {
                    continue;
                }
                Op::CopyRange {
                    src,
                    src_off,
                    dst,
                    dst_off,
                    len,
                }
            }
            97 => {
                let (Some((src, slen)), Some((dst, dlen))) = (some_file(r), some_file(r)) else {
                    continue;
                };
                let mut src_off = r.below(slen / 4096 + 1) * 4096;
                let mut dst_off = if r.chance(1, 2) {
                    src_off
                } else {
                    r.below(dlen / 4096 + 1) * 4096
                };
                if r.chance(1, 10) {
                    src_off += r.below(4096);
                    dst_off += r.below(4096);
                }
                let mut len = match r.below(3) {
                    0 => 4096 * r.range(1, 16),
                    1 => slen.saturating_sub(src_off),
                    _ => r.range(1, 100_000),
                };
                // Mostly ranges that are equal (after copies), so data gets shared.
                let equal = equal_prefix(m, &src, src_off, &dst, dst_off);
                if equal >= 4096 && r.chance(3, 4) {
                    len = equal;
                }
                Op::Dedupe {
                    src,
                    src_off,
                    dst,
                    dst_off,
                    len,
                }
            }
            92..=94 => {
                let Some((path, cur)) = some_file(r) else {
                    continue;
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

/// The filesystem features a run uses (varied by seed).
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// Tree block size.
    pub nodesize: u32,
    /// Dup metadata (two copies of every tree block) instead of single.
    pub dup: bool,
    /// The NO_HOLES feature.
    pub no_holes: bool,
    /// Checksum type.
    pub csum: CsumType,
    /// The block-group-tree feature.
    pub block_group_tree: bool,
    /// Compress file data on write.
    pub compress: Option<Compression>,
    /// Quotas on from the start (every commit's accounting compared with a recount).
    pub quotas: bool,
    /// With `quotas`: simple quotas (squota) instead of full accounting.
    pub simple_quotas: bool,
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
            quotas: false,
            simple_quotas: false,
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
            // Not drawn from `r`: older seeds keep their configurations.
            quotas: seed % 3 == 1,
            simple_quotas: seed % 9 == 4,
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
