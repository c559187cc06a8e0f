//! Reading file data: inline, regular, prealloc (zeros), holes (explicit or implied
//! by NO_HOLES), compressed extents (zlib, lzo, zstd; possibly referenced only in
//! part), with data checksums verified against the csum tree.

use crate::error::{Error, Result};
use crate::fs::{DecompressedExtent, Filesystem, Node, DECOMPRESSED_CACHE_ENTRIES_MAX};
use crate::transaction::Trans;
use crate::tree::ctree::{
    lookup_exact, lookup_prev, next_item, search_forward, search_prev, Path, TreeIter,
};
use std::sync::Arc;
use ubtrfs_compress::Compression;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{FileExtentBody, FileExtentItem, InodeItem, Timespec};
use ubtrfs_format::key::Key;

/// Largest piece of an uncompressed extent read in one device request.
const READ_CHUNK_BYTES_MAX: u64 = 8 << 20;

/// One EXTENT_DATA item of a file with its position.
#[derive(Clone, Debug)]
pub struct FileExtent {
    pub file_offset: u64,
    pub item: FileExtentItem,
    /// The leaf the item was read from (a hint for back-reference walks).
    pub leaf: u64,
}

impl FileExtent {
    /// Bytes of the file this item covers.
    pub fn len(&self) -> u64 {
        match &self.item.body {
            FileExtentBody::Inline { data } => {
                if self.item.compression == 0 {
                    data.len() as u64
                } else {
                    self.item.ram_bytes
                }
            }
            FileExtentBody::Regular { num_bytes, .. } => *num_bytes,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// File offset just past this item (saturating: a hostile key offset near 2^64
    /// must not wrap).
    pub fn end(&self) -> u64 {
        self.file_offset.saturating_add(self.len())
    }
    /// True when the range reads as zeros without touching the disk.
    pub fn is_hole_or_prealloc(&self) -> bool {
        match &self.item.body {
            FileExtentBody::Inline { .. } => false,
            FileExtentBody::Regular { disk_bytenr, .. } => {
                *disk_bytenr == 0 || self.item.ty == FILE_EXTENT_PREALLOC
            }
        }
    }
}

/// Compressed extents a read must span before it is decoded on two threads.
const PARALLEL_DECODE_EXTENTS_MIN: usize = 4;

impl Filesystem {
    /// Positions a path at the extent item covering `offset` (or the first after it).
    fn extent_path(&self, node: Node, offset: u64) -> Result<Option<Path>> {
        let root = self.root(node.root)?;
        let key = Key::new(node.ino, EXTENT_DATA_KEY, offset);
        if let Some(p) = search_prev(&self.info, &root, &key)? {
            let k = p.key()?;
            if k.objectid == node.ino && k.ty == EXTENT_DATA_KEY {
                return Ok(Some(p));
            }
        }
        search_forward(&self.info, &root, &Key::new(node.ino, EXTENT_DATA_KEY, 0))
    }

    /// Calls `f` for every extent item overlapping [from, to), in file order.
    pub fn for_each_extent(
        &self,
        node: Node,
        from: u64,
        to: u64,
        mut f: impl FnMut(&FileExtent) -> Result<bool>,
    ) -> Result<()> {
        let Some(mut p) = self.extent_path(node, from)? else {
            return Ok(());
        };
        loop {
            let k = p.key()?;
            if k.objectid != node.ino || k.ty != EXTENT_DATA_KEY || k.offset >= to {
                // Items before our inode (the search stepped back) are skipped.
                if k.objectid < node.ino || k.objectid == node.ino && k.ty < EXTENT_DATA_KEY {
                    if !next_item(&self.info, &mut p)? {
                        return Ok(());
                    }
                    continue;
                }
                return Ok(());
            }
            let item = FileExtentItem::parse(p.data()?)
                .map_err(|e| Error::corrupt(format!("subvolume {} {k}: {e}", node.root)))?;
            let fe = FileExtent {
                file_offset: k.offset,
                item,
                leaf: p.leaf().bytenr,
            };
            if fe.end() > from && !f(&fe)? {
                return Ok(());
            }
            if !next_item(&self.info, &mut p)? {
                return Ok(());
            }
        }
    }

    /// Every file extent item of a file, in file offset order.
    pub fn file_extents(&self, node: Node) -> Result<Vec<FileExtent>> {
        let mut v = Vec::new();
        self.for_each_extent(node, 0, u64::MAX, |e| {
            v.push(e.clone());
            Ok(true)
        })?;
        Ok(v)
    }

    /// Reads up to `len` bytes at `offset` (fewer at end of file).
    pub fn read(&self, node: Node, offset: u64, len: usize) -> Result<Vec<u8>> {
        let inode = self.inode_item(node)?;
        self.read_inode(node, &inode, offset, len)
    }

    /// [`Filesystem::read`] with the inode item already read.
    pub fn read_inode(
        &self,
        node: Node,
        inode: &InodeItem,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        if offset >= inode.size {
            return Ok(Vec::new());
        }
        let end = inode.size.min(offset.saturating_add(len as u64));
        let mut out = vec![0u8; (end - offset) as usize];
        let verify = self.info.opts.verify_data_csum && inode.flags & INODE_NODATASUM == 0;
        let mut extents = Vec::new();
        self.for_each_extent(node, offset, end, |fe| {
            extents.push(fe.clone());
            Ok(true)
        })?;
        // Fills `out` (file bytes from `base`) from extents that all lie in it.
        let fill = |fes: &[FileExtent], out: &mut [u8], base: u64| -> Result<()> {
            for fe in fes {
                let s = fe.file_offset.max(base);
                let e = fe.end().min(base + out.len() as u64);
                if s < e {
                    let dst = &mut out[(s - base) as usize..(e - base) as usize];
                    self.read_extent_part(node, fe, s, dst, verify)?;
                }
            }
            Ok(())
        };
        // Decoding is CPU-bound: a large read over several compressed extents is split
        // in two at an extent boundary and decoded on two threads.
        let compressed = extents
            .iter()
            .filter(|fe| fe.item.compression != 0 && fe.item.ty != FILE_EXTENT_INLINE)
            .count();
        if compressed >= PARALLEL_DECODE_EXTENTS_MIN && extents.len() >= 2 {
            let mid = extents.len() / 2;
            let split = extents[mid].file_offset.clamp(offset, end);
            let (a, b) = out.split_at_mut((split - offset) as usize);
            let (first, second) = extents.split_at(mid);
            std::thread::scope(|sc| {
                let h = sc.spawn(|| fill(second, b, split));
                let r1 = fill(first, a, offset);
                let r2 = h
                    .join()
                    .unwrap_or_else(|_| Err(Error::corrupt("decoder thread panicked")));
                r1.and(r2)
            })?;
        } else {
            fill(&extents, &mut out, offset)?;
        }
        Ok(out)
    }

    /// Fills `dst` with the file bytes from `pos` on, all inside extent `fe`.
    fn read_extent_part(
        &self,
        node: Node,
        fe: &FileExtent,
        pos: u64,
        dst: &mut [u8],
        verify: bool,
    ) -> Result<()> {
        let rel = pos - fe.file_offset;
        let alg = Compression::try_from(fe.item.compression).map_err(|_| {
            Error::Unsupported(format!(
                "subvolume {} inode {} offset {}: compression type {}",
                node.root, node.ino, fe.file_offset, fe.item.compression
            ))
        })?;
        match &fe.item.body {
            FileExtentBody::Inline { data } => {
                let plain;
                let src: &[u8] = if alg == Compression::None {
                    data
                } else {
                    plain = ubtrfs_compress::decompress_inline(
                        alg,
                        data,
                        fe.item.ram_bytes as usize,
                        self.info.sectorsize,
                    )
                    .map_err(|e| {
                        Error::corrupt(format!(
                            "subvolume {} inode {}: inline extent: {e}",
                            node.root, node.ino
                        ))
                    })?;
                    &plain
                };
                copy_from(src, rel as usize, dst);
            }
            FileExtentBody::Regular {
                disk_bytenr,
                disk_num_bytes,
                offset,
                ..
            } => {
                if *disk_bytenr == 0 || fe.item.ty == FILE_EXTENT_PREALLOC {
                    dst.fill(0);
                    return Ok(());
                }
                let what = |at: u64| {
                    format!(
                        "subvolume {} inode {} extent at file offset {} (disk {}+{}, sector {at})",
                        node.root, node.ino, fe.file_offset, disk_bytenr, disk_num_bytes
                    )
                };
                if alg == Compression::None {
                    let ss = self.info.sectorsize as u64;
                    let mut done = 0usize;
                    while done < dst.len() {
                        let want = ((dst.len() - done) as u64).min(READ_CHUNK_BYTES_MAX);
                        // Hostile offsets must not wrap around to other data.
                        let logical = disk_bytenr
                            .checked_add(*offset)
                            .and_then(|l| l.checked_add(rel + done as u64))
                            .filter(|l| l.checked_add(want + ss).is_some())
                            .ok_or_else(|| {
                                Error::corrupt(format!("{}: offset overflows", what(*disk_bytenr)))
                            })?;
                        let a = logical / ss * ss;
                        let b = (logical + want).div_ceil(ss) * ss;
                        let buf =
                            self.info
                                .read_data_verified(a, (b - a) as usize, verify, &what)?;
                        let from = (logical - a) as usize;
                        dst[done..done + want as usize]
                            .copy_from_slice(&buf[from..from + want as usize]);
                        done += want as usize;
                    }
                } else {
                    let plain = self.decompressed_extent(
                        *disk_bytenr,
                        *disk_num_bytes,
                        fe.item.ram_bytes,
                        alg,
                        verify,
                        &what,
                    )?;
                    let from = usize::try_from(offset.saturating_add(rel)).unwrap_or(usize::MAX);
                    copy_from(&plain, from, dst);
                }
            }
        }
        Ok(())
    }

    fn decompressed_extent(
        &self,
        disk_bytenr: u64,
        disk_num_bytes: u64,
        ram_bytes: u64,
        alg: Compression,
        verify: bool,
        what: &dyn Fn(u64) -> String,
    ) -> Result<Arc<Vec<u8>>> {
        if let Ok(c) = self.decompressed.lock() {
            if let Some(e) = c.iter().find(|e| e.disk_bytenr == disk_bytenr) {
                return Ok(e.data.clone());
            }
        }
        // The kernel never writes a compressed extent larger than 128 KiB on disk or
        // in memory; anything bigger is a hostile item, not a slow read.
        if disk_num_bytes > ubtrfs_compress::MAX_COMPRESSED as u64
            || ram_bytes > ubtrfs_compress::MAX_UNCOMPRESSED as u64
        {
            return Err(Error::corrupt(format!(
                "{}: compressed extent of {disk_num_bytes} bytes ({ram_bytes} uncompressed) exceeds 128 KiB",
                what(disk_bytenr)
            )));
        }
        let raw =
            self.info
                .read_data_verified(disk_bytenr, disk_num_bytes as usize, verify, what)?;
        let plain =
            ubtrfs_compress::decompress(alg, &raw, ram_bytes as usize, self.info.sectorsize)
                .map_err(|e| Error::corrupt(format!("{}: {alg}: {e}", what(disk_bytenr))))?;
        let data = Arc::new(plain);
        if let Ok(mut c) = self.decompressed.lock() {
            if c.len() >= DECOMPRESSED_CACHE_ENTRIES_MAX {
                c.remove(0);
            }
            c.push(DecompressedExtent {
                disk_bytenr,
                data: data.clone(),
            });
        }
        Ok(data)
    }

    /// A symlink's target.
    pub fn readlink(&self, node: Node) -> Result<Vec<u8>> {
        let inode = self.inode_item(node)?;
        if inode.mode & crate::fs::S_IFMT != crate::fs::S_IFLNK {
            return Err(Error::Invalid(format!(
                "subvolume {} inode {} is not a symlink",
                node.root, node.ino
            )));
        }
        // The kernel reads a link target through one page; never allocate what a
        // hostile i_size says.
        const LINK_TARGET_MAX: u64 = 4096;
        self.read_inode(node, &inode, 0, inode.size.min(LINK_TARGET_MAX) as usize)
    }

    /// Ranges [start, end) of the file that hold data (not holes or prealloc), merged;
    /// used to keep extracted files sparse.
    pub fn data_ranges(&self, node: Node, size: u64) -> Result<Vec<(u64, u64)>> {
        let mut v: Vec<(u64, u64)> = Vec::new();
        self.for_each_extent(node, 0, size, |fe| {
            if !fe.is_hole_or_prealloc() {
                let s = fe.file_offset;
                let e = fe.end().min(size);
                if s < e {
                    match v.last_mut() {
                        Some(last) if last.1 >= s => last.1 = last.1.max(e),
                        _ => v.push((s, e)),
                    }
                }
            }
            Ok(true)
        })?;
        Ok(v)
    }
}

fn copy_from(src: &[u8], from: usize, dst: &mut [u8]) {
    // Bytes past the end of the decoded data read as zeros, as the kernel does.
    let avail = src.len().saturating_sub(from);
    let n = avail.min(dst.len());
    if n > 0 {
        dst[..n].copy_from_slice(&src[from..from + n]);
    }
    dst[n..].fill(0);
}

/// Largest data extent the kernel writes.
pub const MAX_EXTENT_SIZE: u64 = 128 << 20;

impl Trans {
    /// The kernel's `max_inline=BYTES` mount option: files up to this size are
    /// written inline (0: never), capped at the sector size as the kernel caps it.
    pub fn set_max_inline(&mut self, bytes: u64) {
        self.max_inline_bytes = bytes.min(self.fs.info.sectorsize as u64);
    }
}

pub(crate) fn file_extent_bytes(
    generation: u64,
    ram_bytes: u64,
    compression: u8,
    ty: u8,
    body: &FileExtentBody,
) -> Vec<u8> {
    FileExtentItem {
        generation,
        ram_bytes,
        compression,
        encryption: 0,
        other_encoding: 0,
        ty,
        body: body.clone(),
    }
    .to_bytes()
}

impl Trans {
    pub(crate) fn no_holes(&self) -> bool {
        self.fs.info.sb.incompat_flags & FEATURE_INCOMPAT_NO_HOLES != 0
    }

    pub(crate) fn max_inline_size(&self) -> usize {
        // BTRFS_MAX_INLINE_DATA_SIZE: a leaf's item space minus the file extent header.
        self.max_item_size() - ubtrfs_format::items::FILE_EXTENT_INLINE_DATA_START
    }

    pub(crate) fn insert_inline(&mut self, root: u64, ino: u64, data: &[u8]) -> Result<()> {
        let v = file_extent_bytes(
            self.transid,
            data.len() as u64,
            0,
            FILE_EXTENT_INLINE,
            &FileExtentBody::Inline {
                data: data.to_vec(),
            },
        );
        self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, 0), &v)
    }

    /// An inline extent of `ram_bytes` of file data stored compressed as `packed`.
    fn insert_inline_compressed(
        &mut self,
        root: u64,
        ino: u64,
        alg: ubtrfs_compress::Compression,
        ram_bytes: u64,
        packed: Vec<u8>,
    ) -> Result<()> {
        // The filesystem now uses the algorithm (incompat COMPRESS_LZO / _ZSTD).
        self.note_compression_feature(alg);
        let v = file_extent_bytes(
            self.transid,
            ram_bytes,
            u8::from(alg),
            FILE_EXTENT_INLINE,
            &FileExtentBody::Inline { data: packed },
        );
        self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, 0), &v)
    }

    /// File extent items of `ino` overlapping [start, end) (the one covering `start`
    /// may begin before it), in file order.
    pub(crate) fn extent_items(
        &self,
        root: u64,
        ino: u64,
        start: u64,
        end: u64,
    ) -> Result<Vec<(Key, FileExtentItem)>> {
        let ptr = self.root_ptr(root)?;
        let first = match lookup_prev(&self.fs.info, &ptr, Key::new(ino, EXTENT_DATA_KEY, start))? {
            Some((k, _)) if k.objectid == ino && k.ty == EXTENT_DATA_KEY => k.offset,
            _ => start,
        };
        let mut items = Vec::new();
        for item in TreeIter::new(
            &self.fs.info,
            &ptr,
            Key::new(ino, EXTENT_DATA_KEY, first),
            Key::new(ino, EXTENT_DATA_KEY, end.saturating_sub(1)),
        )? {
            let item = item?;
            let fe = FileExtentItem::parse(item.data())
                .map_err(|e| Error::corrupt(format!("inode {ino} extent {}: {e}", item.key())))?;
            items.push((item.key(), fe));
        }
        Ok(items)
    }

    /// Removes or trims file extent items covering [start, end) and drops the data
    /// references they held; returns the bytes of `nbytes` released.
    pub(crate) fn drop_extents(
        &mut self,
        root: u64,
        ino: u64,
        start: u64,
        end: u64,
    ) -> Result<u64> {
        let items = self.extent_items(root, ino, start, end)?;
        let mut released = 0u64;
        for (k, fe) in items {
            let (len, reg) = match &fe.body {
                FileExtentBody::Inline { .. } => (fe.ram_bytes, None),
                FileExtentBody::Regular {
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    num_bytes,
                } => (*num_bytes, Some((*disk_bytenr, *disk_num_bytes, *offset))),
            };
            let (es, ee) = (k.offset, k.offset.saturating_add(len));
            if ee <= start || es >= end {
                continue;
            }
            let counts = fe.ty != FILE_EXTENT_INLINE;
            match reg {
                None => {
                    // Inline extents sit at offset 0 and cover a sector at most.
                    self.delete_item(root, &k)?;
                    released += fe.ram_bytes.min(len);
                    if start > es {
                        return Err(Error::Unsupported(
                            "partial truncation of an inline extent".into(),
                        ));
                    }
                }
                Some((db, dnb, off)) => {
                    self.delete_item(root, &k)?;
                    let has_ref = db != 0;
                    if has_ref {
                        self.add_data_ref(db, dnb, root, ino, es.wrapping_sub(off), -1);
                    }
                    let keep = |s: u64, e: u64, this: &mut Trans| -> Result<()> {
                        let nb = e - s;
                        let body = FileExtentBody::Regular {
                            disk_bytenr: db,
                            disk_num_bytes: dnb,
                            offset: off + (s - es),
                            num_bytes: nb,
                        };
                        let v = file_extent_bytes(
                            fe.generation,
                            fe.ram_bytes,
                            fe.compression,
                            fe.ty,
                            &body,
                        );
                        this.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, s), &v)?;
                        if has_ref {
                            this.add_data_ref(db, dnb, root, ino, es.wrapping_sub(off), 1);
                        }
                        Ok(())
                    };
                    if es < start {
                        keep(es, start, self)?;
                    }
                    if ee > end {
                        keep(end, ee, self)?;
                    }
                    if counts && has_ref {
                        released += ee.min(end) - es.max(start);
                    }
                }
            }
        }
        Ok(released)
    }

    /// Writes `data` at `offset` of a regular file (CoW: new extents, old ones dropped).
    /// `offset` must be sector aligned or at/after the end of file rounded up.
    pub fn write(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        data: &[u8],
        t: Timespec,
    ) -> Result<()> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        // Quota limits: new data is charged before anything changes (EDQUOT).
        if !self.quota_reserved_by_caller {
            self.qgroup_reserve(root, data.len() as u64)?;
        }
        if data.is_empty() {
            return Ok(());
        }
        let ss = self.fs.info.sectorsize as u64;
        let end = offset + data.len() as u64;
        let new_size = inode.size.max(end);
        // Small whole files are stored inline, as the kernel does; never a NODATACOW
        // one (the kernel's nocow write-back falls back to CoW without inlining).
        // The kernel's can_cow_file_range_inline: the file at most a sector, what is
        // stored (compressed or not) less than a sector and within max_inline.
        let whole_small = offset == 0
            && inode.flags & INODE_NODATACOW == 0
            && new_size == end
            && inode.size <= end
            && end <= ss;
        // A small file whose compressed form could not be stored inline is written
        // plain, the inode left unmarked (compress_file_range bails out uncompressed:
        // the data did compress, only not by a sector).
        let mut compressed_not_inline = false;
        if whole_small {
            // Compressing first, as compress_file_range: zlib and zstd give up when
            // the output is not smaller (the inode is then marked NOCOMPRESS, the
            // give-up rule, unless forced or chosen by a property); lzo keeps any
            // output under a sector (its compressor checks only after two sectors).
            let mut packed = None;
            let try_compress = match self.need_compress(root, ino, &inode)? {
                // The kernel's heuristic looks at the page first (compress-force
                // skips it); data it rejects is written plain, nothing marked.
                Some(c) if self.compress_forced() || heuristic_says_compress(data) => Some(c),
                _ => None,
            };
            if let Some((alg, level, prop)) = try_compress {
                let c = ubtrfs_compress::compress_raw(alg, data, level, ss as u32)
                    .map_err(|e| Error::Invalid(format!("compression: {e}")))?;
                let kept = c.len() < data.len()
                    || (alg == ubtrfs_compress::Compression::Lzo && (c.len() as u64) < ss);
                if kept {
                    packed = Some((alg, c));
                } else if !self.compress_force && !prop {
                    inode.flags |= INODE_NOCOMPRESS;
                }
            }
            let stored = packed.as_ref().map_or(data.len(), |p| p.1.len());
            if (stored as u64) < ss
                && stored as u64 <= self.max_inline_bytes
                && stored <= self.max_inline_size()
            {
                let released = self.drop_extents(root, ino, 0, u64::MAX)?;
                inode.nbytes = inode.nbytes.saturating_sub(released);
                match packed {
                    Some((alg, c)) => self.insert_inline_compressed(root, ino, alg, end, c)?,
                    None => self.insert_inline(root, ino, data)?,
                }
                inode.nbytes = inode.nbytes.saturating_add(end);
                inode.size = end;
                self.touch(&mut inode, t, true);
                return self.write_inode(root, ino, &inode);
            }
            compressed_not_inline = packed.is_some();
        }
        // An inline extent cannot be followed by others: make it a regular one first.
        if self.has_inline(root, ino)? {
            self.convert_inline(root, ino, &mut inode)?;
        }
        let mut buf_start = offset;
        // Whole sectors are written from the caller's bytes as they are (the
        // mount's runs of delayed data are up to 8 MiB: a copy is not free).
        let buf: std::borrow::Cow<'_, [u8]> = if offset.is_multiple_of(ss)
            && (data.len() as u64).is_multiple_of(ss)
        {
            std::borrow::Cow::Borrowed(data)
        } else {
            let mut buf: Vec<u8>;
            if !offset.is_multiple_of(ss) {
                // Read-modify-write of the first sector.
                let s = offset - offset % ss;
                let mut head = self.read_file_range(root, ino, s, (offset - s) as usize, &inode)?;
                head.extend_from_slice(data);
                buf = head;
                buf_start = s;
            } else {
                buf = data.to_vec();
            }
            let buf_end = buf_start + buf.len() as u64;
            if !buf_end.is_multiple_of(ss) && buf_end < inode.size {
                let e = buf_end.next_multiple_of(ss).min(inode.size);
                let tail =
                    self.read_file_range(root, ino, buf_end, (e - buf_end) as usize, &inode)?;
                buf.extend_from_slice(&tail);
            }
            buf.resize((buf.len() as u64).next_multiple_of(ss) as usize, 0);
            std::borrow::Cow::Owned(buf)
        };
        let aligned_len = buf.len() as u64;
        if inode.flags & INODE_NODATACOW != 0
            && self.reflink_source.is_none()
            && self.nocow_write(root, ino, buf_start, &buf)?
        {
            inode.size = new_size;
            self.touch(&mut inode, t, true);
            return self.write_inode(root, ino, &inode);
        }
        let released = self.drop_extents(root, ino, buf_start, buf_start + aligned_len)?;
        inode.nbytes = inode.nbytes.saturating_sub(released);
        if !self.no_holes() && buf_start > inode.size.next_multiple_of(ss) {
            let hs = inode.size.next_multiple_of(ss);
            self.fill_holes(root, ino, hs, buf_start)?;
        }
        let mut pos = 0u64;
        let compress = if compressed_not_inline {
            None
        } else {
            self.need_compress(root, ino, &inode)?
        };
        if let Some((alg, level, prop)) = compress {
            pos =
                self.write_compressed(root, ino, &mut inode, buf_start, &buf, alg, level, prop)?;
        }
        let nodatasum = inode.flags & INODE_NODATASUM != 0;
        while pos < aligned_len {
            let want = (aligned_len - pos).min(MAX_EXTENT_SIZE);
            let (bytenr, got) = self.alloc.alloc_data(&mut self.fs.info, want)?;
            let chunk = &buf[pos as usize..(pos + got) as usize];
            let fo = buf_start + pos;
            // Bytes of this piece that came from the caller (the rest is padding).
            let valid = (offset + data.len() as u64).saturating_sub(fo).min(got);
            let cloned = match self.reflink_source.clone() {
                Some(src) if buf_start == offset => self.clone_data(bytenr, &src, fo, valid)?,
                _ => 0,
            };
            self.write_logical(bytenr + cloned, &chunk[cloned as usize..])?;
            if !nodatasum {
                self.csum_data(bytenr, chunk)?;
            }
            let body = FileExtentBody::Regular {
                disk_bytenr: bytenr,
                disk_num_bytes: got,
                offset: 0,
                num_bytes: got,
            };
            let v = file_extent_bytes(self.transid, got, 0, FILE_EXTENT_REG, &body);
            self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, fo), &v)?;
            self.add_new_data_extent(bytenr, got, root, ino, fo);
            inode.nbytes = inode.nbytes.saturating_add(got);
            pos += got;
        }
        inode.size = new_size;
        self.touch(&mut inode, t, true);
        self.write_inode(root, ino, &inode)
    }

    /// The parts of [start, end) that have no data extent (holes, explicit hole items,
    /// an inline extent), in file order: where preallocation puts extents.
    fn unallocated_ranges(
        &self,
        root: u64,
        ino: u64,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let mut covered = Vec::new();
        for (k, fe) in self.extent_items(root, ino, start, end)? {
            if let FileExtentBody::Regular {
                disk_bytenr,
                num_bytes,
                ..
            } = fe.body
            {
                if disk_bytenr != 0 {
                    covered.push((k.offset, k.offset + num_bytes));
                }
            }
        }
        let mut holes = Vec::new();
        let mut pos = start;
        for (s, e) in covered {
            if s > pos {
                holes.push((pos, s.min(end)));
            }
            pos = pos.max(e);
        }
        if pos < end {
            holes.push((pos, end));
        }
        Ok(holes)
    }

    /// The data bytes [`Trans::fallocate`] (or a zeroed range) of [offset,
    /// offset + len) would allocate: the range's sectors that have no data extent.
    /// What quota limits are checked against before it runs.
    pub fn fallocate_new_bytes(&self, root: u64, ino: u64, offset: u64, len: u64) -> Result<u64> {
        let ss = self.fs.info.sectorsize as u64;
        let start = offset - offset % ss;
        let end = offset.saturating_add(len).next_multiple_of(ss);
        Ok(self
            .unallocated_ranges(root, ino, start, end)?
            .iter()
            .map(|(s, e)| e.saturating_sub(*s))
            .sum())
    }

    /// Preallocates [offset, offset + len) (sector aligned outward) as PREALLOC extents
    /// where the file has no data; `keep_size` leaves i_size alone (FALLOC_FL_KEEP_SIZE).
    /// Returns the extents allocated, as (disk bytenr, length).
    pub fn fallocate(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        len: u64,
        keep_size: bool,
        t: Timespec,
    ) -> Result<Vec<(u64, u64)>> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let ss = self.fs.info.sectorsize as u64;
        let start = offset - offset % ss;
        let end = (offset + len).next_multiple_of(ss);
        // Quota limits: the bytes that get extents are charged before anything
        // changes (EDQUOT), as the kernel's btrfs_qgroup_reserve_data for each hole.
        if !self.quota_reserved_by_caller {
            let bytes = self.fallocate_new_bytes(root, ino, offset, len)?;
            self.qgroup_reserve(root, bytes)?;
        }
        if self.has_inline(root, ino)? {
            self.convert_inline(root, ino, &mut inode)?;
        }
        if !keep_size && !self.no_holes() && start > inode.size.next_multiple_of(ss) {
            let hs = inode.size.next_multiple_of(ss);
            self.fill_holes(root, ino, hs, start)?;
        }
        let holes = self.unallocated_ranges(root, ino, start, end)?;
        let mut out = Vec::new();
        for (hs, he) in holes {
            if he <= hs {
                continue;
            }
            // Explicit hole items (no NO_HOLES) in the range are replaced.
            self.drop_extents(root, ino, hs, he)?;
            let mut p = hs;
            while p < he {
                let want = (he - p).min(MAX_EXTENT_SIZE);
                let (bytenr, got) = match self.alloc.alloc_data(&mut self.fs.info, want) {
                    Ok(x) => x,
                    Err(e) => {
                        // Keep the inode consistent with what was allocated so far.
                        inode.flags |= INODE_PREALLOC;
                        self.write_inode(root, ino, &inode)?;
                        return Err(e);
                    }
                };
                let body = FileExtentBody::Regular {
                    disk_bytenr: bytenr,
                    disk_num_bytes: got,
                    offset: 0,
                    num_bytes: got,
                };
                let v = file_extent_bytes(self.transid, got, 0, FILE_EXTENT_PREALLOC, &body);
                self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, p), &v)?;
                self.add_new_data_extent(bytenr, got, root, ino, p);
                inode.nbytes = inode.nbytes.saturating_add(got);
                out.push((bytenr, got));
                p += got;
            }
        }
        if !keep_size && offset + len > inode.size {
            inode.size = offset + len;
        }
        if !out.is_empty() {
            inode.flags |= INODE_PREALLOC;
        }
        self.touch(&mut inode, t, false);
        self.write_inode(root, ino, &inode)?;
        Ok(out)
    }

    /// A NODATACOW write over data the file alone owns: `data` (sector aligned, at
    /// `start`) goes into the existing extents in place, as the kernel's nocow path
    /// does, when every sector of the range lies in a plain (uncompressed, not
    /// preallocated) extent written after the subvolume's last snapshot with a
    /// single reference. Returns false, having written nothing, when any part does
    /// not qualify (then the whole write is copy-on-write; the kernel would split
    /// it). The file extent items do not change.
    fn nocow_write(&mut self, root: u64, ino: u64, start: u64, data: &[u8]) -> Result<bool> {
        let end = start + data.len() as u64;
        let last_snapshot = self.last_snapshot(root)?;
        let mut plan = Vec::new();
        let mut pos = start;
        for (k, fe) in self.extent_items(root, ino, start, end)? {
            let FileExtentBody::Regular {
                disk_bytenr,
                offset,
                num_bytes,
                ..
            } = fe.body
            else {
                return Ok(false);
            };
            let extent_end = k.offset + num_bytes;
            if extent_end <= pos {
                continue;
            }
            let plain = fe.ty == FILE_EXTENT_REG
                && fe.compression == 0
                && fe.encryption == 0
                && fe.other_encoding == 0
                && disk_bytenr != 0;
            if !plain || k.offset > pos || fe.generation <= last_snapshot {
                return Ok(false);
            }
            if self.lookup_extent_info(disk_bytenr, 0)?.0 != 1 {
                return Ok(false);
            }
            let piece_end = extent_end.min(end);
            plan.push((
                pos - start,
                disk_bytenr + offset + (pos - k.offset),
                piece_end - pos,
            ));
            pos = piece_end;
            if pos >= end {
                break;
            }
        }
        if pos < end {
            return Ok(false);
        }
        for (from, disk, len) in plan {
            self.write_logical(disk, &data[from as usize..(from + len) as usize])?;
        }
        Ok(true)
    }

    /// compress-force is on (the heuristic is skipped, nothing is marked NOCOMPRESS).
    fn compress_forced(&self) -> bool {
        self.compress_force && self.compress.is_some()
    }

    /// Whether new data of the inode is compressed, and how (the kernel's
    /// inode_need_compress and compress_file_range's choice): never with NODATACOW
    /// or NODATASUM; always with compress-force; never once NOCOMPRESS (`chattr +m`,
    /// `btrfs.compression=none`, or data that did not compress); otherwise with
    /// `-o compress`, the COMPRESS flag (`chattr +c`) or a `btrfs.compression`
    /// property. The property's algorithm wins over the mount's, which wins over
    /// zlib. The third value says a property chose it (no give-up marking then).
    /// The data itself is judged after, by the kernel's heuristic
    /// ([`ubtrfs_compress::compress_heuristic`]), unless compress-force.
    #[allow(clippy::type_complexity)]
    pub(crate) fn need_compress(
        &self,
        root: u64,
        ino: u64,
        inode: &InodeItem,
    ) -> Result<Option<(ubtrfs_compress::Compression, Option<i32>, bool)>> {
        if !crate::inode::props::can_compress(inode) {
            return Ok(None);
        }
        let force = self.compress_force && self.compress.is_some();
        if !force
            && (inode.flags & INODE_NOCOMPRESS != 0
                || (self.compress.is_none() && inode.flags & INODE_COMPRESS == 0))
        {
            // The property sets COMPRESS whenever it names an algorithm, so without
            // either flag or mount option there is nothing to look up.
            return Ok(None);
        }
        let prop = self.fs.prop_compress(Node::new(root, ino))?;
        let (mount_alg, level) = match self.compress {
            Some((a, l)) if a != ubtrfs_compress::Compression::None => (Some(a), l),
            _ => (None, None),
        };
        let alg = prop
            .or(mount_alg)
            .unwrap_or(ubtrfs_compress::Compression::Zlib);
        Ok(Some((alg, level, prop.is_some())))
    }

    /// Writes 128 KiB compressed extents from the start of `buf` for as long as they
    /// save space; on the first chunk that does not, marks the inode NOCOMPRESS (the
    /// kernel's give-up rule, skipped with compress-force or a compression property)
    /// and returns how far it got.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_compressed(
        &mut self,
        root: u64,
        ino: u64,
        inode: &mut InodeItem,
        buf_start: u64,
        buf: &[u8],
        alg: ubtrfs_compress::Compression,
        level: Option<i32>,
        prop: bool,
    ) -> Result<u64> {
        let ss = self.fs.info.sectorsize as u64;
        let forced = self.compress_forced();
        let inputs: Vec<&[u8]> = buf.chunks(ubtrfs_compress::MAX_UNCOMPRESSED).collect();
        // The first extent alone, then the rest together on every CPU (the
        // kernel's compression workers run on all CPUs too): data that does not
        // compress usually shows it at once, and nothing more is tried then.
        let mut packed = pack_extents(&inputs[..inputs.len().min(1)], alg, level, ss, forced)?;
        if matches!(packed.first(), Some(Packed::Data(_))) && inputs.len() > 1 {
            packed.extend(pack_extents(&inputs[1..], alg, level, ss, forced)?);
        }
        let mut pos = 0usize;
        for (input, p) in inputs.iter().zip(packed) {
            let n = input.len();
            let mut c = match p {
                // Data the kernel's heuristic would not try to compress is written
                // plain from here on, the inode not marked (compress-force skips
                // the heuristic).
                Packed::Skipped => break,
                Packed::NoGain => {
                    // A piece of one sector can never save one: the kernel writes it
                    // plain without marking the inode (checked against it: 4 KiB
                    // that compress to half stay unmarked, 8 KiB that save no sector
                    // mark).
                    if !self.compress_force && !prop && n as u64 > ss {
                        inode.flags |= INODE_NOCOMPRESS;
                    }
                    break;
                }
                Packed::Data(c) => c,
            };
            let disk_len = (c.len() as u64).next_multiple_of(ss);
            c.resize(disk_len as usize, 0);
            let (bytenr, got) = self.alloc.alloc_data(&mut self.fs.info, disk_len)?;
            if got != disk_len {
                self.alloc.release_unused(bytenr, got)?;
                break;
            }
            self.write_logical(bytenr, &c)?;
            self.csum_data(bytenr, &c)?;
            let fo = buf_start + pos as u64;
            let body = FileExtentBody::Regular {
                disk_bytenr: bytenr,
                disk_num_bytes: disk_len,
                offset: 0,
                num_bytes: n as u64,
            };
            let v = file_extent_bytes(self.transid, n as u64, alg as u8, FILE_EXTENT_REG, &body);
            self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, fo), &v)?;
            self.add_new_data_extent(bytenr, disk_len, root, ino, fo);
            inode.nbytes = inode.nbytes.saturating_add(n as u64);
            pos += n;
        }
        let flag = match alg {
            ubtrfs_compress::Compression::Lzo => FEATURE_INCOMPAT_COMPRESS_LZO,
            ubtrfs_compress::Compression::Zstd => FEATURE_INCOMPAT_COMPRESS_ZSTD,
            _ => 0,
        };
        if pos > 0 {
            self.fs.info.sb.incompat_flags |= flag;
        }
        Ok(pos as u64)
    }

    /// FALLOC_FL_PUNCH_HOLE: the range reads as zeroes afterwards and whole sectors in
    /// it hold no data; the size does not change. As the kernel's btrfs_punch_hole,
    /// whole sectors are those of the range itself, not clipped to the size: a punch
    /// reaching past the end of file drops the sector holding it (an inline extent
    /// included) and preallocated extents beyond it; only partial sectors inside the
    /// file get zeroes written.
    pub fn punch_hole(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        len: u64,
        t: Timespec,
    ) -> Result<()> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let req_end = offset.saturating_add(len);
        if offset >= req_end {
            return Ok(());
        }
        let ss = self.fs.info.sectorsize as u64;
        let size = inode.size;
        let size_up = size.next_multiple_of(ss);
        let (inner_s, inner_e) = (offset.next_multiple_of(ss), req_end - req_end % ss);
        if offset < size_up && self.has_inline(root, ino)? {
            self.convert_inline(root, ino, &mut inode)?;
        }
        if inner_s < inner_e {
            let released = self.drop_extents(root, ino, inner_s, inner_e)?;
            inode.nbytes = inode.nbytes.saturating_sub(released);
            if !self.no_holes() && inner_s < inner_e.min(size_up) {
                self.fill_holes(root, ino, inner_s, inner_e.min(size_up))?;
            }
            if released > 0 || inner_s < size_up {
                self.touch(&mut inode, t, true);
            }
            self.write_inode(root, ino, &inode)?;
        }
        // Partial sectors at either end get zeroes written (read-modify-write), up to
        // the end of file only: nothing past it is visible.
        let head_e = inner_s.min(req_end).min(size);
        if offset < head_e {
            self.write(root, ino, offset, &vec![0u8; (head_e - offset) as usize], t)?;
        }
        let tail_s = inner_e.max(offset);
        let tail_e = req_end.min(size);
        if inner_s <= inner_e && tail_s < tail_e {
            self.write(root, ino, tail_s, &vec![0u8; (tail_e - tail_s) as usize], t)?;
        }
        Ok(())
    }

    /// FALLOC_FL_ZERO_RANGE: punch, then preallocate the range.
    pub fn zero_range(
        &mut self,
        root: u64,
        ino: u64,
        offset: u64,
        len: u64,
        keep_size: bool,
        t: Timespec,
    ) -> Result<()> {
        let old_size = self.read_inode(root, ino)?.size;
        self.punch_hole(root, ino, offset, len, t)?;
        // Preallocate whatever is a hole now (sector-aligned outward): the punched
        // middle and any part beyond the old end of file.
        self.fallocate(root, ino, offset, len, true, t)?;
        let mut i = self.read_inode(root, ino)?;
        if !keep_size && offset + len > i.size {
            let ss = self.fs.info.sectorsize as u64;
            if !self.no_holes() {
                let hs = old_size.next_multiple_of(ss);
                self.fill_holes(root, ino, hs, offset - offset % ss)?;
                i = self.read_inode(root, ino)?;
            }
            i.size = offset + len;
            self.write_inode(root, ino, &i)?;
        }
        Ok(())
    }

    /// Shares the whole blocks of `src` at `src_offset` (up to `len` bytes) into the
    /// data extent at `bytenr` instead of writing them (mkfs --reflink): single-copy
    /// data chunks on a host filesystem that can reflink. Returns how many bytes were
    /// shared (0 when it could not: the caller writes them).
    pub(crate) fn clone_data(
        &mut self,
        bytenr: u64,
        src: &std::sync::Arc<std::fs::File>,
        src_offset: u64,
        len: u64,
    ) -> Result<u64> {
        let ss = self.fs.info.sectorsize as u64;
        let whole = len - len % ss;
        if whole == 0 || !src_offset.is_multiple_of(4096) {
            return Ok(0);
        }
        let e = self.fs.info.chunk_map.lookup(bytenr)?;
        if e.num_mirrors() != 1 || e.ty & BLOCK_GROUP_PROFILE_MASK != 0 {
            return Ok(0);
        }
        let p = e.map(bytenr, 0)?;
        if p.len < whole || !p.offset.is_multiple_of(4096) {
            return Ok(0);
        }
        let Some(dev) = self.fs.info.devices.get(&p.devid).cloned() else {
            return Ok(0);
        };
        match dev.clone_from_file(src, src_offset, p.offset, whole) {
            Ok(()) => Ok(whole),
            Err(_) => {
                // Not this host filesystem: stop trying, copy instead.
                self.reflink_source = None;
                self.reflink_failed = true;
                Ok(0)
            }
        }
    }

    pub(crate) fn has_inline(&self, root: u64, ino: u64) -> Result<bool> {
        let ptr = self.root_ptr(root)?;
        Ok(
            match lookup_exact(&self.fs.info, &ptr, &Key::new(ino, EXTENT_DATA_KEY, 0))? {
                Some(it) => it.data().get(20) == Some(&FILE_EXTENT_INLINE),
                None => false,
            },
        )
    }

    /// Inserts hole items (filesystems without NO_HOLES) for the parts of
    /// [start, end) no extent item covers.
    pub(crate) fn fill_holes(&mut self, root: u64, ino: u64, start: u64, end: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let ss = self.fs.info.sectorsize as u64;
        let covered: Vec<(u64, u64)> = self
            .extent_items(root, ino, start, end)?
            .into_iter()
            .map(|(k, fe)| {
                let len = match fe.body {
                    // A compressed inline extent's claim is not bounded by its item.
                    FileExtentBody::Inline { .. } => fe
                        .ram_bytes
                        .min(ubtrfs_compress::MAX_UNCOMPRESSED as u64)
                        .next_multiple_of(ss),
                    FileExtentBody::Regular { num_bytes, .. } => num_bytes,
                };
                (k.offset, k.offset + len)
            })
            .collect();
        let mut pos = start;
        for (s, e) in covered {
            if s > pos {
                self.insert_hole(root, ino, pos, s.min(end) - pos)?;
            }
            pos = pos.max(e);
            if pos >= end {
                return Ok(());
            }
        }
        if pos < end {
            self.insert_hole(root, ino, pos, end - pos)?;
        }
        Ok(())
    }

    /// Turns an inline extent into a regular one (before other extents join it).
    pub(crate) fn convert_inline(
        &mut self,
        root: u64,
        ino: u64,
        inode: &mut InodeItem,
    ) -> Result<()> {
        let ptr = self.root_ptr(root)?;
        let it = lookup_exact(&self.fs.info, &ptr, &Key::new(ino, EXTENT_DATA_KEY, 0))?
            .ok_or_else(|| Error::corrupt(format!("inode {ino}: inline extent vanished")))?;
        let fe = FileExtentItem::parse(it.data())
            .map_err(|e| Error::corrupt(format!("inode {ino} inline extent: {e}")))?;
        drop(it);
        let len = fe.ram_bytes;
        // The tree checker holds uncompressed inline extents to their item's size; a
        // compressed one's claim is checked here, before it sizes a buffer.
        if len > ubtrfs_compress::MAX_UNCOMPRESSED as u64 {
            return Err(Error::corrupt(format!(
                "inode {ino}: inline extent claims {len} bytes uncompressed"
            )));
        }
        let view = InodeItem {
            size: len,
            ..inode.clone()
        };
        let data = self.read_file_range(root, ino, 0, len as usize, &view)?;
        self.delete_item(root, &Key::new(ino, EXTENT_DATA_KEY, 0))?;
        inode.nbytes = inode.nbytes.saturating_sub(len);
        let ss = self.fs.info.sectorsize as u64;
        let mut buf = data;
        buf.resize(len.next_multiple_of(ss).max(ss) as usize, 0);
        let got_len = buf.len() as u64;
        let (bytenr, got) = self.alloc.alloc_data(&mut self.fs.info, got_len)?;
        if got != got_len {
            self.alloc.release_unused(bytenr, got)?;
            return Err(Error::NoSpace("converting an inline extent".into()));
        }
        self.write_logical(bytenr, &buf)?;
        // A nocow file's data has no checksums, also where it was inline (btrfs check:
        // "odd csum item"; found by fsx on a `C` file after 220,000 operations).
        if inode.flags & INODE_NODATASUM == 0 {
            self.csum_data(bytenr, &buf)?;
        }
        let body = FileExtentBody::Regular {
            disk_bytenr: bytenr,
            disk_num_bytes: got,
            offset: 0,
            num_bytes: got,
        };
        let v = file_extent_bytes(self.transid, got, 0, FILE_EXTENT_REG, &body);
        self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, 0), &v)?;
        self.add_new_data_extent(bytenr, got, root, ino, 0);
        inode.nbytes = inode.nbytes.saturating_add(got);
        self.write_inode(root, ino, inode)
    }

    /// Whether the file's inline extent is stored compressed.
    fn inline_compressed(&self, root: u64, ino: u64) -> Result<bool> {
        let ptr = self.root_ptr(root)?;
        Ok(
            lookup_exact(&self.fs.info, &ptr, &Key::new(ino, EXTENT_DATA_KEY, 0))?
                .is_some_and(|it| it.data().get(16).is_some_and(|&c| c != 0)),
        )
    }

    pub(crate) fn inline_len(&self, root: u64, ino: u64) -> Result<Option<u64>> {
        let ptr = self.root_ptr(root)?;
        Ok(
            match lookup_exact(&self.fs.info, &ptr, &Key::new(ino, EXTENT_DATA_KEY, 0))? {
                Some(it) if it.data().get(20) == Some(&FILE_EXTENT_INLINE) => {
                    Some(ubtrfs_format::bytes::le64(it.data(), 8, "file extent").unwrap_or(0))
                }
                _ => None,
            },
        )
    }

    pub(crate) fn insert_hole(&mut self, root: u64, ino: u64, start: u64, len: u64) -> Result<()> {
        let body = FileExtentBody::Regular {
            disk_bytenr: 0,
            disk_num_bytes: 0,
            offset: 0,
            num_bytes: len,
        };
        let v = file_extent_bytes(self.transid, len, 0, FILE_EXTENT_REG, &body);
        self.insert_item(root, &Key::new(ino, EXTENT_DATA_KEY, start), &v)
    }

    /// Reads file bytes through the uncommitted state (for read-modify-write).
    pub fn read_file_range(
        &self,
        root: u64,
        ino: u64,
        start: u64,
        len: usize,
        inode: &InodeItem,
    ) -> Result<Vec<u8>> {
        let mut out = self
            .fs
            .read_inode(crate::fs::Node::new(root, ino), inode, start, len)?;
        out.resize(len, 0);
        Ok(out)
    }

    /// Sets the file size: shrinking drops extents past it (zeroing the tail of the
    /// last sector by rewriting it), growing leaves a hole.
    pub fn truncate(&mut self, root: u64, ino: u64, size: u64, t: Timespec) -> Result<()> {
        let mut inode = self.read_inode(root, ino)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(Error::Invalid(format!("inode {ino} is not a regular file")));
        }
        let ss = self.fs.info.sectorsize as u64;
        if size < inode.size {
            if let Some(l) = self.inline_len(root, ino)? {
                if size < l {
                    let data = self.read_file_range(root, ino, 0, size as usize, &inode)?;
                    let compressed = self.inline_compressed(root, ino)?;
                    let released = self.drop_extents(root, ino, 0, u64::MAX)?;
                    inode.nbytes = inode.nbytes.saturating_sub(released);
                    if compressed && size > 0 {
                        // The kernel cannot cut compressed inline data in place: it
                        // zeroes the page past the new end and writes it back, which
                        // compresses it again under the current settings.
                        inode.size = 0;
                        self.write_inode(root, ino, &inode)?;
                        self.write(root, ino, 0, &data, t)?;
                        inode = self.read_inode(root, ino)?;
                    } else if size > 0 {
                        self.insert_inline(root, ino, &data)?;
                        inode.nbytes = inode.nbytes.saturating_add(size);
                    }
                } else {
                    // The inline data stays; only what follows it (holes) goes.
                    let from = size.next_multiple_of(ss).max(ss);
                    let released = self.drop_extents(root, ino, from, u64::MAX)?;
                    inode.nbytes = inode.nbytes.saturating_sub(released);
                }
            } else {
                let keep_end = size.next_multiple_of(ss);
                let tail = if !size.is_multiple_of(ss) {
                    Some(self.read_file_range(
                        root,
                        ino,
                        size - size % ss,
                        (size % ss) as usize,
                        &inode,
                    )?)
                } else {
                    None
                };
                let released = self.drop_extents(root, ino, keep_end, u64::MAX)?;
                inode.nbytes = inode.nbytes.saturating_sub(released);
                inode.size = size;
                self.write_inode(root, ino, &inode)?;
                if let Some(tail) = tail {
                    // Rewrite the last sector with zeroes past the new end.
                    self.write(root, ino, size - size % ss, &tail, t)?;
                    inode = self.read_inode(root, ino)?;
                }
            }
        } else if size > inode.size && !self.no_holes() {
            let hs = inode.size.next_multiple_of(ss);
            let he = size.next_multiple_of(ss);
            self.fill_holes(root, ino, hs, he)?;
        }
        inode.size = size;
        self.touch(&mut inode, t, true);
        self.write_inode(root, ino, &inode)?;
        self.touch_root(root, t)
    }
}

/// What compressing one extent's worth of new data gave.
enum Packed {
    /// The kernel's heuristic would not try.
    Skipped,
    /// Compressed, it would not save a sector.
    NoGain,
    /// The compressed bytes.
    Data(Vec<u8>),
}

/// The kernel's btrfs_compress_heuristic on data starting at a page boundary, as
/// the page cache holds it (the last page padded with zeros).
fn heuristic_says_compress(data: &[u8]) -> bool {
    const PAGE: usize = 4096;
    if data.len().is_multiple_of(PAGE) {
        return ubtrfs_compress::compress_heuristic(data);
    }
    let mut padded = data[..data.len().min(ubtrfs_compress::MAX_UNCOMPRESSED)].to_vec();
    padded.resize(padded.len().next_multiple_of(PAGE), 0);
    ubtrfs_compress::compress_heuristic(&padded)
}

/// Most threads one write compresses on: the CPUs, at most four.
fn compress_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4)
    })
}

/// Compresses each of `inputs` (extents of new data, in file order), in
/// contiguous shares on up to [`compress_threads`] threads. Pure work on the
/// caller's bytes: whatever it gives, nothing has changed yet.
fn pack_extents(
    inputs: &[&[u8]],
    alg: ubtrfs_compress::Compression,
    level: Option<i32>,
    ss: u64,
    forced: bool,
) -> Result<Vec<Packed>> {
    let one = |input: &[u8]| -> Result<Packed> {
        if !forced && !heuristic_says_compress(input) {
            return Ok(Packed::Skipped);
        }
        Ok(
            match ubtrfs_compress::compress(alg, input, level, ss as u32)
                .map_err(|e| Error::Invalid(format!("compression: {e}")))?
            {
                Some(c) => Packed::Data(c),
                None => Packed::NoGain,
            },
        )
    };
    let share = |part: &[&[u8]]| part.iter().map(|i| one(i)).collect::<Result<Vec<_>>>();
    let threads = compress_threads().min(inputs.len());
    if threads <= 1 {
        return share(inputs);
    }
    let per = inputs.len().div_ceil(threads);
    std::thread::scope(|sc| {
        let mut parts = inputs.chunks(per);
        let first = parts.next().unwrap_or(&[]);
        // A helper that cannot be started leaves its share to this thread.
        let helpers: Vec<_> = parts
            .map(|part| {
                std::thread::Builder::new()
                    .name("ubtrfs-compress".into())
                    .spawn_scoped(sc, move || share(part))
                    .map_err(|_| part)
            })
            .collect();
        let mut out = share(first)?;
        for h in helpers {
            out.extend(match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(Error::Invalid("compression thread panicked".into()))
                })?,
                Err(part) => share(part)?,
            });
        }
        Ok(out)
    })
}
