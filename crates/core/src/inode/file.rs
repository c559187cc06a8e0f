//! Reading file data: inline, regular, prealloc (zeros), holes (explicit or implied
//! by NO_HOLES), compressed extents (zlib, lzo, zstd; possibly referenced only in
//! part), with data checksums verified against the csum tree.

use crate::error::{Error, Result};
use crate::fs::{DecompressedExtent, Filesystem, Node, DECOMPRESSED_CACHE_ENTRIES_MAX};
use crate::tree::ctree::{next_item, search_forward, search_prev, Path};
use std::sync::Arc;
use ubtrfs_compress::Compression;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{FileExtentBody, FileExtentItem, InodeItem};
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
