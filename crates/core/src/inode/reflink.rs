//! Sharing file data instead of copying it: the kernel's reflink.c (FICLONE,
//! FICLONERANGE, and copy_file_range, which the VFS turns into a clone on btrfs).
//!
//! A clone writes no data. For every file extent item of the source range it inserts
//! an item in the destination that points at the same disk extent (the same
//! disk_bytenr and disk_num_bytes, the offset moved to the part used) and adds one
//! EXTENT_DATA_REF for (destination root, inode, key offset − extent offset), so the
//! extent is freed only when the last file lets go of it. Checksums live in the csum
//! tree by disk address, so they are shared too. Holes stay holes; an inline extent
//! cannot be shared (it lives in the leaf), so its bytes are written as new data.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Node};
use crate::transaction::space_info::Reservation;
use crate::transaction::Trans;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{FileExtentBody, InodeItem, Timespec};
use ubtrfs_format::key::Key;

use super::file::file_extent_bytes;

/// Most bytes one clone call shares: bounds the items one transaction step adds
/// (copy_file_range callers loop on a short count). FUSE answers in 32 bits, too.
pub(crate) const CLONE_CHUNK_BYTES_MAX: u64 = 1 << 30;

/// Most bytes the copying fallback of [`Trans::copy_file_range`] moves per call: they
/// pass through memory.
pub(crate) const COPY_CHUNK_BYTES_MAX: u64 = 8 << 20;

/// Items a clone call reserves: the destination's dropped and new file extent
/// items. A source range of more extents than this is cloned anyway (each item is a
/// fraction of the per-item reservation in practice).
const CLONE_RESERVED_ITEMS: u64 = 64;

/// Source pieces (extents, holes) one copy_file_range call shares: half the items
/// reserved, as each may split a destination item too.
const CLONE_PIECES_MAX: usize = CLONE_RESERVED_ITEMS as usize / 2;

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;

/// One piece of the source range, in source file order.
enum Piece {
    /// Share this disk extent: (disk_bytenr, disk_num_bytes, extent offset of the
    /// piece's first byte, file extent type, compression, ram_bytes, generation).
    Share {
        disk_bytenr: u64,
        disk_num_bytes: u64,
        offset: u64,
        ty: u8,
        compression: u8,
        ram_bytes: u64,
        generation: u64,
    },
    /// Reads as zeros and has no extent.
    Hole,
    /// Inline data (always at file offset 0): written anew.
    Inline(Vec<u8>),
}

/// A byte position in a file: the tree (subvolume id), the inode number, the offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilePos {
    /// The subvolume tree holding the inode.
    pub root: u64,
    /// The inode number.
    pub ino: u64,
    /// Byte offset in the file.
    pub offset: u64,
}

impl FilePos {
    /// The position `offset` bytes into file (`root`, `ino`).
    pub fn new(root: u64, ino: u64, offset: u64) -> FilePos {
        FilePos { root, ino, offset }
    }

    fn same_file(&self, other: &FilePos) -> bool {
        self.root == other.root && self.ino == other.ino
    }
}

/// A source range split into pieces (file offset, length, what), read once and shared
/// by the checks and the clone.
type Pieces = Vec<(u64, u64, Piece)>;

impl Trans {
    /// Makes [`dst.offset`, `dst.offset` + `len`) of the destination share the data of
    /// [`src.offset`, `src.offset` + `len`) of the source (FICLONERANGE), with the
    /// kernel's rules: both regular files; offsets sector aligned; `len` sector
    /// aligned unless the range ends at the source's end of file and reaches the
    /// destination's end; no overlap within one file; both files with or without data
    /// checksums. A violation is [`Error::Invalid`] and changes nothing. The roots may
    /// differ (a clone between subvolumes of one filesystem).
    pub fn clone_range(&mut self, src: FilePos, dst: FilePos, len: u64, t: Timespec) -> Result<()> {
        let (src_i, dst_i) = self.clone_inodes(src, dst)?;
        self.check_clone(src, &src_i, dst, &dst_i, len)?;
        if len == 0 {
            return Ok(());
        }
        let aligned = len.next_multiple_of(self.fs.info.sectorsize as u64);
        let pieces = self.clone_pieces(src, src.offset + aligned)?;
        self.clone_pieces_into(pieces, src, dst, dst_i, len, Some(t))
    }

    /// Both inodes of a clone, regular files.
    fn clone_inodes(&self, src: FilePos, dst: FilePos) -> Result<(InodeItem, InodeItem)> {
        let s = self.read_inode(src.root, src.ino)?;
        let d = self.read_inode(dst.root, dst.ino)?;
        if s.mode & S_IFMT == S_IFDIR || d.mode & S_IFMT == S_IFDIR {
            return Err(Error::IsDir("clone".into()));
        }
        if s.mode & S_IFMT != S_IFREG || d.mode & S_IFMT != S_IFREG {
            return Err(Error::Invalid("clone: not a regular file".into()));
        }
        Ok((s, d))
    }

    /// The kernel's clone rules (see [`Trans::clone_range`]).
    fn check_clone(
        &self,
        src: FilePos,
        src_i: &InodeItem,
        dst: FilePos,
        dst_i: &InodeItem,
        len: u64,
    ) -> Result<()> {
        let ss = self.fs.info.sectorsize as u64;
        let src_end = src
            .offset
            .checked_add(len)
            .ok_or_else(|| Error::Invalid("clone: range past 2^64".into()))?;
        let dst_end = dst
            .offset
            .checked_add(len)
            .ok_or_else(|| Error::Invalid("clone: range past 2^64".into()))?;
        if !src.offset.is_multiple_of(ss) || !dst.offset.is_multiple_of(ss) {
            return Err(Error::Invalid("clone: offsets not sector aligned".into()));
        }
        if src_end > src_i.size {
            return Err(Error::Invalid("clone: range past the source's end".into()));
        }
        // An unaligned length only at the source's end of file, and only where the
        // destination ends inside the cloned range: otherwise the sector past the
        // source's end (zeros on disk) would hide destination data.
        if !len.is_multiple_of(ss) && (src_end != src_i.size || dst_end < dst_i.size) {
            return Err(Error::Invalid("clone: length not sector aligned".into()));
        }
        let aligned = len.next_multiple_of(ss);
        if src.same_file(&dst)
            && src.offset < dst.offset + aligned
            && dst.offset < src.offset + aligned
        {
            return Err(Error::Invalid(
                "clone: overlapping ranges in one file".into(),
            ));
        }
        if (src_i.flags ^ dst_i.flags) & INODE_NODATASUM != 0 {
            return Err(Error::Invalid(
                "clone: one file has data checksums, the other not".into(),
            ));
        }
        Ok(())
    }

    /// The clone proper, after the checks: `pieces` cover the source range rounded up
    /// to whole sectors. `touch` is the time to set as mtime and ctime (None for a
    /// dedupe, which changes no contents).
    fn clone_pieces_into(
        &mut self,
        pieces: Pieces,
        src: FilePos,
        dst: FilePos,
        mut dst_i: InodeItem,
        len: u64,
        touch: Option<Timespec>,
    ) -> Result<()> {
        let ss = self.fs.info.sectorsize as u64;
        let aligned = len.next_multiple_of(ss);
        let (root, ino, dst_off) = (dst.root, dst.ino, dst.offset);
        // The destination: no inline extent may stay in front of shared ones, and
        // what the range covered goes.
        if self.has_inline(root, ino)? {
            self.convert_inline(root, ino, &mut dst_i)?;
        }
        let released = self.drop_extents(root, ino, dst_off, dst_off + aligned)?;
        dst_i.nbytes = dst_i.nbytes.saturating_sub(released);
        if !self.no_holes() && dst_off > dst_i.size.next_multiple_of(ss) {
            let hs = dst_i.size.next_multiple_of(ss);
            self.fill_holes(root, ino, hs, dst_off)?;
        }
        let mut inline = None;
        for (pos, plen, piece) in pieces {
            let at = dst_off + (pos - src.offset);
            match piece {
                Piece::Share {
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    ty,
                    compression,
                    ram_bytes,
                    generation,
                } => {
                    let body = FileExtentBody::Regular {
                        disk_bytenr,
                        disk_num_bytes,
                        offset,
                        num_bytes: plen,
                    };
                    let v = file_extent_bytes(generation, ram_bytes, compression, ty, &body);
                    self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, at), &v)?;
                    self.add_data_ref(
                        disk_bytenr,
                        disk_num_bytes,
                        root,
                        ino,
                        at.wrapping_sub(offset),
                        1,
                    );
                    dst_i.nbytes = dst_i.nbytes.saturating_add(plen);
                }
                Piece::Hole => {
                    if !self.no_holes() {
                        self.insert_hole(root, ino, at, plen)?;
                    }
                }
                Piece::Inline(data) => inline = Some((at, data)),
            }
        }
        let dst_end = dst_off + len;
        dst_i.size = dst_i.size.max(dst_end);
        match touch {
            Some(t) => self.touch(&mut dst_i, t, true),
            // A dedupe changes no contents: times stay, but the inode changed in this
            // transaction (the kernel bumps its transid too).
            None => dst_i.transid = self.transid,
        }
        self.write_inode(root, ino, &dst_i)?;
        if let Some((at, data)) = inline {
            // The inline piece is the source's first sector; its bytes past the
            // source's size are not data.
            let n = data.len().min((dst_end - at) as usize);
            let t = touch.unwrap_or(dst_i.mtime);
            self.write(root, ino, at, &data[..n], t)?;
        }
        match touch {
            Some(t) => self.touch_root(root, t),
            None => Ok(()),
        }
    }

    /// The source range [start, end) as pieces (file offset, length, what), covering
    /// it without gaps: the parts no item covers (NO_HOLES) are holes.
    fn clone_pieces(&mut self, src: FilePos, end: u64) -> Result<Pieces> {
        let (root, ino, start) = (src.root, src.ino, src.offset);
        let ss = self.fs.info.sectorsize as u64;
        let mut out = Vec::new();
        let mut pos = start;
        for (k, fe) in self.extent_items(root, ino, start, end)? {
            let (es, piece_of) = match &fe.body {
                FileExtentBody::Inline { .. } => {
                    if start >= ss {
                        continue;
                    }
                    let inode = self.read_inode(root, ino)?;
                    let n = fe.ram_bytes.min(inode.size) as usize;
                    let data = self.read_file_range(root, ino, 0, n, &inode)?;
                    // Inline extents sit at 0 and fill the first sector at most.
                    out.push((0, ss.min(end), Piece::Inline(data)));
                    pos = pos.max(ss);
                    continue;
                }
                FileExtentBody::Regular {
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    num_bytes,
                } => (
                    k.offset,
                    (*disk_bytenr, *disk_num_bytes, *offset, *num_bytes),
                ),
            };
            let (db, dnb, off, nb) = piece_of;
            let ee = es.saturating_add(nb);
            let (s, e) = (es.max(start), ee.min(end));
            if s >= e {
                continue;
            }
            if s > pos {
                out.push((pos, s - pos, Piece::Hole));
            }
            let piece = if db == 0 {
                Piece::Hole
            } else {
                Piece::Share {
                    disk_bytenr: db,
                    disk_num_bytes: dnb,
                    offset: off + (s - es),
                    ty: fe.ty,
                    compression: fe.compression,
                    ram_bytes: fe.ram_bytes,
                    generation: fe.generation,
                }
            };
            out.push((s, e - s, piece));
            pos = e;
        }
        if pos < end {
            out.push((pos, end - pos, Piece::Hole));
        }
        Ok(out)
    }

    /// What [`Trans::copy_file_range`] from `src` to `dst` may need: whole sectors
    /// are shared (a few items per source extent, no data, as the kernel's clone:
    /// it works on a filesystem whose data space is full), the rest is copied, at
    /// most `COPY_CHUNK_BYTES_MAX` (8 MiB) at a time. An inline extent is written
    /// anew, the source's (only at offset 0) as the destination's (made regular).
    pub fn copy_file_range_reservation(
        fs: &Filesystem,
        src: FilePos,
        dst: FilePos,
        len: u64,
    ) -> Result<Reservation> {
        let ss = fs.info.sectorsize as u64;
        let (src_off, dst_off) = (src.offset, dst.offset);
        Ok(
            if src_off.is_multiple_of(ss) && dst_off.is_multiple_of(ss) {
                let inline = (src_off == 0
                    && fs.has_inline_extent(Node::new(src.root, src.ino))?)
                    || fs.has_inline_extent(Node::new(dst.root, dst.ino))?;
                Reservation {
                    data_bytes: if inline { ss } else { 0 },
                    ..Reservation::items(CLONE_RESERVED_ITEMS)
                }
            } else {
                Reservation::write(len.min(COPY_CHUNK_BYTES_MAX))
            },
        )
    }

    /// copy_file_range(2) as on a kernel btrfs mount: the whole sectors of the range
    /// are shared (as [`Trans::clone_range`]), what cannot be shared (unaligned
    /// offsets, a partial last sector, checksum mismatch) is copied. Copies at most
    /// `CLONE_CHUNK_BYTES_MAX` (1 GiB) (shared) or `COPY_CHUNK_BYTES_MAX` (8 MiB)
    /// (copied) bytes and returns how many; 0 at or past the source's end of file.
    /// Returns whether the bytes were shared, too.
    pub fn copy_file_range(
        &mut self,
        src: FilePos,
        dst: FilePos,
        len: u64,
        t: Timespec,
    ) -> Result<(u64, bool)> {
        let ss = self.fs.info.sectorsize as u64;
        let (src_i, dst_i) = self.clone_inodes(src, dst)?;
        if src.offset >= src_i.size {
            return Ok((0, false));
        }
        let len = len.min(src_i.size - src.offset);
        dst.offset
            .checked_add(len)
            .ok_or_else(|| Error::Invalid("copy_file_range: range past 2^64".into()))?;
        let overlap =
            src.same_file(&dst) && src.offset < dst.offset + len && dst.offset < src.offset + len;
        let shareable = src.offset.is_multiple_of(ss)
            && dst.offset.is_multiple_of(ss)
            && !overlap
            && (src_i.flags ^ dst_i.flags) & INODE_NODATASUM == 0;
        if shareable {
            let n = len.min(CLONE_CHUNK_BYTES_MAX);
            let mut pieces = self.clone_pieces(src, src.offset + n.next_multiple_of(ss))?;
            // No more source extents than the reservation counted on.
            pieces.truncate(CLONE_PIECES_MAX);
            let covered = pieces
                .last()
                .map_or(0, |(pos, plen, _)| pos + plen - src.offset);
            let n = n.min(covered);
            let to_eof = src.offset + n == src_i.size && dst.offset + n >= dst_i.size;
            let n = if to_eof { n } else { n - n % ss };
            if n > 0 {
                // The pieces past a shortened n are dropped by clipping them.
                let end = src.offset + n.next_multiple_of(ss);
                let pieces = clip_pieces(pieces, end);
                self.check_clone(src, &src_i, dst, &dst_i, n)?;
                self.clone_pieces_into(pieces, src, dst, dst_i, n, Some(t))?;
                return Ok((n, true));
            }
        }
        // Copy: at most up to the next sector boundary of the destination when that
        // lets the following call share again.
        let mut n = len.min(COPY_CHUNK_BYTES_MAX);
        if !dst.offset.is_multiple_of(ss) && src.offset % ss == dst.offset % ss {
            n = n.min(ss - dst.offset % ss);
        }
        let data = self.read_file_range(src.root, src.ino, src.offset, n as usize, &src_i)?;
        self.write(dst.root, dst.ino, dst.offset, &data, t)?;
        Ok((n, false))
    }

    /// FIDEDUPERANGE for one destination, as the kernel's btrfs_extent_same: when the
    /// `len` bytes at `src` and at `dst` are equal, the destination range is made to
    /// share the source's extents; returns the bytes deduplicated, 0 when the contents
    /// differ (FILE_DEDUPE_RANGE_DIFFERS). As the VFS does for a dedupe: a length of
    /// 0 does nothing; offsets must be sector aligned and the ranges inside both
    /// files; a length that is not whole sectors is shortened to whole sectors unless
    /// it ends at both files' ends; then the clone rules apply (no overlap within one
    /// file, checksum flags alike). No times change: the contents stay the same.
    pub fn dedupe_range(&mut self, src: FilePos, dst: FilePos, len: u64) -> Result<u64> {
        self.dedupe_range_checked(src, dst, len, Compare::Bytes)
    }

    /// [`Trans::dedupe_range`] for a caller that has compared the bytes itself
    /// (`Compare::Done`, e.g. several ranges on several threads before any change).
    pub(crate) fn dedupe_range_checked(
        &mut self,
        src: FilePos,
        dst: FilePos,
        len: u64,
        compare: Compare,
    ) -> Result<u64> {
        let ss = self.fs.info.sectorsize as u64;
        let (src_i, dst_i) = self.clone_inodes(src, dst)?;
        if len == 0 {
            return Ok(0);
        }
        if !src.offset.is_multiple_of(ss) || !dst.offset.is_multiple_of(ss) {
            return Err(Error::Invalid("dedupe: offsets not sector aligned".into()));
        }
        let src_end = src.offset.checked_add(len);
        let dst_end = dst.offset.checked_add(len);
        if src_end.is_none_or(|e| e > src_i.size) || dst_end.is_none_or(|e| e > dst_i.size) {
            return Err(Error::Invalid("dedupe: range past a file's end".into()));
        }
        let at_eofs = src.offset + len == src_i.size && dst.offset + len == dst_i.size;
        let len = if at_eofs { len } else { len - len % ss };
        if len == 0 {
            return Ok(0);
        }
        self.check_clone(src, &src_i, dst, &dst_i, len)?;
        if compare == Compare::Bytes && !self.ranges_equal(src, dst, len)? {
            return Ok(0);
        }
        let pieces = self.clone_pieces(src, src.offset + len.next_multiple_of(ss))?;
        if pieces.iter().any(|(_, _, p)| matches!(p, Piece::Inline(_))) {
            // An inline extent is not shared, only rewritten: nothing to gain.
            return Ok(0);
        }
        self.clone_pieces_into(pieces, src, dst, dst_i, len, None)?;
        Ok(len)
    }
}

/// Whether a dedupe compares the bytes of both ranges first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compare {
    /// Read both and compare (FIDEDUPERANGE).
    Bytes,
    /// The caller compared them, and nothing changed them since.
    Done,
}

impl Trans {
    /// Whether the `len` bytes at `a` and at `b` read the same (compared in bounded
    /// pieces).
    pub fn ranges_equal(&mut self, a: FilePos, b: FilePos, len: u64) -> Result<bool> {
        let ai = self.read_inode(a.root, a.ino)?;
        let bi = self.read_inode(b.root, b.ino)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(COPY_CHUNK_BYTES_MAX) as usize;
            let x = self.read_file_range(a.root, a.ino, a.offset + done, n, &ai)?;
            let y = self.read_file_range(b.root, b.ino, b.offset + done, n, &bi)?;
            if x != y {
                return Ok(false);
            }
            done += n as u64;
        }
        Ok(true)
    }

    /// Whether the `len` bytes at `a` and at `b` are already the same extents (or
    /// holes) at the same offsets in them: a dedupe would free nothing.
    pub fn shares_extents(&mut self, a: FilePos, b: FilePos, len: u64) -> Result<bool> {
        let pa = self.clone_pieces(a, a.offset + len)?;
        let pb = self.clone_pieces(b, b.offset + len)?;
        if pa.len() != pb.len() {
            return Ok(false);
        }
        Ok(pa.iter().zip(&pb).all(|((sa, la, x), (sb, lb, y))| {
            sa - a.offset == sb - b.offset
                && la == lb
                && match (x, y) {
                    (Piece::Hole, Piece::Hole) => true,
                    (
                        Piece::Share {
                            disk_bytenr: d1,
                            offset: o1,
                            ..
                        },
                        Piece::Share {
                            disk_bytenr: d2,
                            offset: o2,
                            ..
                        },
                    ) => d1 == d2 && o1 == o2,
                    _ => false,
                }
        }))
    }
}

/// The pieces that start before `end`, the last one cut at `end`.
fn clip_pieces(pieces: Pieces, end: u64) -> Pieces {
    pieces
        .into_iter()
        .filter(|(pos, _, _)| *pos < end)
        .map(|(pos, plen, p)| (pos, plen.min(end - pos), p))
        .collect()
}
