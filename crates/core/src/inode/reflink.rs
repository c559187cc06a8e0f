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
use crate::fs::Filesystem;
use crate::transaction::space_info::Reservation;
use crate::transaction::Trans;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{FileExtentBody, Timespec};
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

impl Trans {
    /// Makes [`dst_off`, `dst_off` + `len`) of `dst_ino` share the data of
    /// [`src_off`, `src_off` + `len`) of `src_ino` (FICLONERANGE), with the kernel's
    /// rules: both regular files; offsets sector aligned; `len` sector aligned unless
    /// the range ends at the source's end of file and reaches the destination's end;
    /// no overlap within one file; both files with or without data checksums. A
    /// violation is [`Error::Invalid`] and changes nothing. The roots may differ
    /// (a clone between subvolumes of one filesystem).
    #[allow(clippy::too_many_arguments)]
    pub fn clone_range(
        &mut self,
        src_root: u64,
        src_ino: u64,
        src_off: u64,
        dst_root: u64,
        dst_ino: u64,
        dst_off: u64,
        len: u64,
        t: Timespec,
    ) -> Result<()> {
        let ss = self.fs.info.sectorsize as u64;
        let src = self.read_inode(src_root, src_ino)?;
        let mut dst = self.read_inode(dst_root, dst_ino)?;
        if src.mode & S_IFMT != S_IFREG || dst.mode & S_IFMT != S_IFREG {
            return Err(Error::Invalid("clone: not a regular file".into()));
        }
        if len == 0 {
            return Ok(());
        }
        let src_end = src_off
            .checked_add(len)
            .ok_or_else(|| Error::Invalid("clone: range past 2^64".into()))?;
        let dst_end = dst_off
            .checked_add(len)
            .ok_or_else(|| Error::Invalid("clone: range past 2^64".into()))?;
        if !src_off.is_multiple_of(ss) || !dst_off.is_multiple_of(ss) {
            return Err(Error::Invalid("clone: offsets not sector aligned".into()));
        }
        if src_end > src.size {
            return Err(Error::Invalid("clone: range past the source's end".into()));
        }
        // An unaligned length only at the source's end of file, and only where the
        // destination ends inside the cloned range: otherwise the sector past the
        // source's end (zeros on disk) would hide destination data.
        if !len.is_multiple_of(ss) && (src_end != src.size || dst_end < dst.size) {
            return Err(Error::Invalid("clone: length not sector aligned".into()));
        }
        let aligned = len.next_multiple_of(ss);
        if src_root == dst_root
            && src_ino == dst_ino
            && src_off < dst_off + aligned
            && dst_off < src_off + aligned
        {
            return Err(Error::Invalid(
                "clone: overlapping ranges in one file".into(),
            ));
        }
        if (src.flags ^ dst.flags) & INODE_NODATASUM != 0 {
            return Err(Error::Invalid(
                "clone: one file has data checksums, the other not".into(),
            ));
        }

        let pieces = self.clone_pieces(src_root, src_ino, src_off, src_off + aligned)?;

        // The destination: no inline extent may stay in front of shared ones, and
        // what the range covered goes.
        if self.has_inline(dst_root, dst_ino)? {
            self.convert_inline(dst_root, dst_ino, &mut dst)?;
        }
        let released = self.drop_extents(dst_root, dst_ino, dst_off, dst_off + aligned)?;
        dst.nbytes = dst.nbytes.saturating_sub(released);
        if !self.no_holes() && dst_off > dst.size.next_multiple_of(ss) {
            let hs = dst.size.next_multiple_of(ss);
            self.fill_holes(dst_root, dst_ino, hs, dst_off)?;
        }
        let mut inline = None;
        for (pos, plen, piece) in pieces {
            let at = dst_off + (pos - src_off);
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
                    self.insert_item(dst_root, &Key::new(dst_ino, EXTENT_DATA_KEY, at), &v)?;
                    self.add_data_ref(
                        disk_bytenr,
                        disk_num_bytes,
                        dst_root,
                        dst_ino,
                        at.wrapping_sub(offset),
                        1,
                    );
                    dst.nbytes += plen;
                }
                Piece::Hole => {
                    if !self.no_holes() {
                        self.insert_hole(dst_root, dst_ino, at, plen)?;
                    }
                }
                Piece::Inline(data) => inline = Some((at, data)),
            }
        }
        dst.size = dst.size.max(dst_end);
        self.touch(&mut dst, t, true);
        self.write_inode(dst_root, dst_ino, &dst)?;
        if let Some((at, data)) = inline {
            // The inline piece is the source's first sector; its bytes past the
            // source's size are not data.
            let n = data.len().min((dst_end - at) as usize);
            self.write(dst_root, dst_ino, at, &data[..n], t)?;
        }
        self.touch_root(dst_root, t)
    }

    /// The source range [start, end) as pieces (file offset, length, what), covering
    /// it without gaps: the parts no item covers (NO_HOLES) are holes.
    fn clone_pieces(
        &mut self,
        root: u64,
        ino: u64,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, u64, Piece)>> {
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

    /// What [`Trans::copy_file_range`] may need: whole sectors are shared (a few
    /// items per source extent, no data), the rest is copied, at most
    /// `COPY_CHUNK_BYTES_MAX` (8 MiB) at a time.
    pub fn copy_file_range_reservation(
        fs: &Filesystem,
        src_off: u64,
        dst_off: u64,
        len: u64,
    ) -> Reservation {
        let ss = fs.info.sectorsize as u64;
        if src_off.is_multiple_of(ss) && dst_off.is_multiple_of(ss) {
            Reservation {
                // An inline source sector is written anew.
                data_bytes: 1,
                ..Reservation::items(CLONE_RESERVED_ITEMS)
            }
        } else {
            Reservation::write(len.min(COPY_CHUNK_BYTES_MAX))
        }
    }

    /// copy_file_range(2) as on a kernel btrfs mount: the whole sectors of the range
    /// are shared ([`Trans::clone_range`]), what cannot be shared (unaligned offsets,
    /// a partial last sector, checksum mismatch) is copied. Copies at most
    /// `CLONE_CHUNK_BYTES_MAX` (1 GiB) (shared) or `COPY_CHUNK_BYTES_MAX` (8 MiB) (copied) bytes
    /// and returns how many; 0 at or past the source's end of file. Returns whether
    /// the bytes were shared, too.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &mut self,
        src_root: u64,
        src_ino: u64,
        src_off: u64,
        dst_root: u64,
        dst_ino: u64,
        dst_off: u64,
        len: u64,
        t: Timespec,
    ) -> Result<(u64, bool)> {
        let ss = self.fs.info.sectorsize as u64;
        let src = self.read_inode(src_root, src_ino)?;
        let dst = self.read_inode(dst_root, dst_ino)?;
        if src.mode & S_IFMT == 0o040000 || dst.mode & S_IFMT == 0o040000 {
            return Err(Error::IsDir("copy_file_range".into()));
        }
        if src.mode & S_IFMT != S_IFREG || dst.mode & S_IFMT != S_IFREG {
            return Err(Error::Invalid("copy_file_range: not a regular file".into()));
        }
        if src_off >= src.size {
            return Ok((0, false));
        }
        let len = len.min(src.size - src_off);
        dst_off
            .checked_add(len)
            .ok_or_else(|| Error::Invalid("copy_file_range: range past 2^64".into()))?;
        let same = src_root == dst_root && src_ino == dst_ino;
        let overlap = same && src_off < dst_off + len && dst_off < src_off + len;
        let shareable = src_off.is_multiple_of(ss)
            && dst_off.is_multiple_of(ss)
            && !overlap
            && (src.flags ^ dst.flags) & INODE_NODATASUM == 0;
        if shareable {
            let mut n = len.min(CLONE_CHUNK_BYTES_MAX);
            // No more source extents than the reservation counted on.
            let pieces = self.clone_pieces(src_root, src_ino, src_off, src_off + n)?;
            if let Some((pos, plen, _)) = pieces.get(CLONE_PIECES_MAX - 1) {
                n = n.min(pos + plen - src_off);
            }
            let to_eof = src_off + n == src.size && dst_off + n >= dst.size;
            let n = if to_eof { n } else { n - n % ss };
            if n > 0 {
                self.clone_range(src_root, src_ino, src_off, dst_root, dst_ino, dst_off, n, t)?;
                return Ok((n, true));
            }
        }
        // Copy: at most up to the next sector boundary of the destination when that
        // lets the following call share again.
        let mut n = len.min(COPY_CHUNK_BYTES_MAX);
        if !dst_off.is_multiple_of(ss) && src_off % ss == dst_off % ss {
            n = n.min(ss - dst_off % ss);
        }
        let data = self.read_file_range(src_root, src_ino, src_off, n as usize, &src)?;
        self.write(dst_root, dst_ino, dst_off, &data, t)?;
        Ok((n, false))
    }
}
