//! A sparse in-memory device and a compact encoding of mostly-zero images.
//!
//! Real btrfs images are at least ~114 MiB, yet a fresh one holds only a few dozen
//! non-zero 4 KiB blocks. [`SparseDevice`] keeps just those blocks (everything else
//! reads as zeros), and [`encode`] / [`decode`] turn an image into a few hundred KiB
//! and back, which is what the fuzz corpus and the regression inputs are made of.
//!
//! Encoding (all little-endian):
//!
//! ```text
//! u64 device size in bytes                 (at most SPARSE_SIZE_MAX)
//! repeated: u32 block index, 4096 bytes    (block index * 4096 < device size)
//! ```
//!
//! Decoding is lenient where a fuzzer's mutations make it cheap to be: a trailing
//! partial record is zero-padded, and a block given twice keeps its last copy. It
//! refuses (returns None) sizes over [`SPARSE_SIZE_MAX`], more than
//! [`SPARSE_BLOCKS_MAX`] records, and blocks at or past the declared size.

use crate::io::dev::Device;
use std::collections::BTreeMap;
use std::io;
use std::sync::RwLock;

/// Granularity of a [`SparseDevice`] and of the encoding.
pub const SPARSE_BLOCK_SIZE: usize = 4096;
/// Largest device size [`decode`] accepts (1 GiB).
pub const SPARSE_SIZE_MAX: u64 = 1 << 30;
/// Most records [`decode`] accepts (64 MiB of non-zero data).
pub const SPARSE_BLOCKS_MAX: usize = 16384;
/// Bytes of one record: block index and the block.
const RECORD_SIZE: usize = 4 + SPARSE_BLOCK_SIZE;

type Block = Box<[u8; SPARSE_BLOCK_SIZE]>;

fn zero_block() -> Block {
    Box::new([0u8; SPARSE_BLOCK_SIZE])
}

/// A device of a declared size whose bytes are zero except in the blocks it stores.
#[derive(Debug)]
pub struct SparseDevice {
    size: u64,
    blocks: RwLock<BTreeMap<u64, Block>>,
    name: String,
}

impl SparseDevice {
    /// An all-zero device of `size` bytes.
    pub fn new(size: u64, name: &str) -> SparseDevice {
        SparseDevice {
            size,
            blocks: RwLock::new(BTreeMap::new()),
            name: name.to_string(),
        }
    }

    /// A device holding `image` (only its non-zero blocks are stored).
    pub fn from_image(image: &[u8], name: &str) -> SparseDevice {
        let mut map = BTreeMap::new();
        for (i, chunk) in image.chunks(SPARSE_BLOCK_SIZE).enumerate() {
            if chunk.iter().any(|&b| b != 0) {
                let mut b = zero_block();
                b[..chunk.len()].copy_from_slice(chunk);
                map.insert(i as u64, b);
            }
        }
        SparseDevice {
            size: image.len() as u64,
            blocks: RwLock::new(map),
            name: name.to_string(),
        }
    }

    /// Indexes of the stored (possibly non-zero) blocks, ascending.
    pub fn block_indexes(&self) -> Vec<u64> {
        self.blocks
            .read()
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Number of stored blocks.
    pub fn stored_blocks(&self) -> usize {
        self.blocks.read().map(|m| m.len()).unwrap_or(0)
    }

    /// This device in the compact encoding (all-zero blocks are left out).
    pub fn encode(&self) -> Vec<u8> {
        let Ok(m) = self.blocks.read() else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(8 + m.len() * RECORD_SIZE);
        out.extend_from_slice(&self.size.to_le_bytes());
        for (&idx, b) in m.iter() {
            if b.iter().all(|&x| x == 0) {
                continue;
            }
            // Indexes of devices up to 16 TiB fit; larger ones are not encodable.
            let Ok(i) = u32::try_from(idx) else { continue };
            out.extend_from_slice(&i.to_le_bytes());
            out.extend_from_slice(&b[..]);
        }
        out
    }

    fn check_range(&self, offset: u64, len: usize, op: &str) -> io::Result<()> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.size)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{op} of {len} bytes at {offset} beyond the end of {} ({} bytes)",
                    self.name, self.size
                ),
            ));
        }
        Ok(())
    }
}

/// Walks [offset, offset + len) block by block: (block index, offset in block,
/// offset in the caller's buffer, length).
fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let bs = SPARSE_BLOCK_SIZE as u64;
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let pos = offset + done as u64;
        let idx = pos / bs;
        let in_block = (pos % bs) as usize;
        let n = (SPARSE_BLOCK_SIZE - in_block).min(len - done);
        let piece = (idx, in_block, done, n);
        done += n;
        Some(piece)
    })
}

impl Device for SparseDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(offset, buf.len(), "read")?;
        let m = self
            .blocks
            .read()
            .map_err(|_| io::Error::other("poisoned"))?;
        for (idx, in_block, at, n) in pieces(offset, buf.len()) {
            let dst = &mut buf[at..at + n];
            match m.get(&idx) {
                Some(b) => dst.copy_from_slice(&b[in_block..in_block + n]),
                None => dst.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check_range(offset, buf.len(), "write")?;
        let mut m = self
            .blocks
            .write()
            .map_err(|_| io::Error::other("poisoned"))?;
        for (idx, in_block, at, n) in pieces(offset, buf.len()) {
            let src = &buf[at..at + n];
            if !m.contains_key(&idx) && src.iter().all(|&b| b == 0) {
                continue;
            }
            let b = m.entry(idx).or_insert_with(zero_block);
            b[in_block..in_block + n].copy_from_slice(src);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let n = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        self.check_range(offset, n, "discard")?;
        let mut m = self
            .blocks
            .write()
            .map_err(|_| io::Error::other("poisoned"))?;
        let bs = SPARSE_BLOCK_SIZE as u64;
        let end = offset + len;
        let stored: Vec<u64> = m
            .range(offset / bs..end.div_ceil(bs))
            .map(|(k, _)| *k)
            .collect();
        for idx in stored {
            let (b0, b1) = (idx * bs, idx * bs + bs);
            let (s, e) = (offset.max(b0), end.min(b1));
            if s == b0 && e == b1 {
                m.remove(&idx);
            } else if let Some(b) = m.get_mut(&idx) {
                b[(s - b0) as usize..(e - b0) as usize].fill(0);
            }
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Encodes a whole image: its size and its non-zero 4 KiB blocks (a partial last
/// block is zero-padded). Images over [`SPARSE_SIZE_MAX`] encode but do not decode.
pub fn encode(image: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    for (i, chunk) in image.chunks(SPARSE_BLOCK_SIZE).enumerate() {
        if chunk.iter().all(|&b| b == 0) {
            continue;
        }
        let Ok(idx) = u32::try_from(i) else { break };
        out.extend_from_slice(&idx.to_le_bytes());
        out.extend_from_slice(chunk);
        out.resize(out.len() + SPARSE_BLOCK_SIZE - chunk.len(), 0);
    }
    out
}

/// Decodes [`encode`]'s format into a device named "sparse image".
pub fn decode(bytes: &[u8]) -> Option<SparseDevice> {
    let size = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    if size > SPARSE_SIZE_MAX {
        return None;
    }
    let body = &bytes[8..];
    if body.len().div_ceil(RECORD_SIZE) > SPARSE_BLOCKS_MAX {
        return None;
    }
    let nblocks = size.div_ceil(SPARSE_BLOCK_SIZE as u64);
    let mut map = BTreeMap::new();
    for rec in body.chunks(RECORD_SIZE) {
        if rec.len() < 4 {
            // Too short to name a block: ignore the scrap.
            break;
        }
        let idx = u64::from(u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]));
        if idx >= nblocks {
            return None;
        }
        let data = &rec[4..];
        let mut b = zero_block();
        b[..data.len()].copy_from_slice(data);
        // A block past the device's end must stay zero there (size not a multiple).
        let valid = (size - idx * SPARSE_BLOCK_SIZE as u64).min(SPARSE_BLOCK_SIZE as u64);
        b[valid as usize..].fill(0);
        map.insert(idx, b);
    }
    Some(SparseDevice {
        size,
        blocks: RwLock::new(map),
        name: "sparse image".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Vec<u8> {
        let mut img = vec![0u8; 5 * SPARSE_BLOCK_SIZE + 100];
        img[10] = 1;
        img[3 * SPARSE_BLOCK_SIZE + 4095] = 2;
        img[3 * SPARSE_BLOCK_SIZE + 4096] = 3;
        img[5 * SPARSE_BLOCK_SIZE + 99] = 4;
        img
    }

    #[test]
    fn round_trip() {
        let img = image();
        let enc = encode(&img);
        // Blocks 0, 3, 4 and the partial block 5.
        assert_eq!(enc.len(), 8 + 4 * RECORD_SIZE);
        let dev = decode(&enc).expect("decodes");
        assert_eq!(dev.size(), img.len() as u64);
        assert_eq!(dev.block_indexes(), vec![0, 3, 4, 5]);
        let mut back = vec![0xffu8; img.len()];
        dev.read_at(0, &mut back).expect("read");
        assert_eq!(back, img);
        assert_eq!(dev.encode(), enc);
        assert_eq!(SparseDevice::from_image(&img, "x").encode(), enc);
    }

    #[test]
    fn reads_across_blocks_and_zeros() {
        let dev = decode(&encode(&image())).expect("decodes");
        let mut b = [9u8; 3];
        dev.read_at(3 * SPARSE_BLOCK_SIZE as u64 + 4095, &mut b)
            .expect("read");
        assert_eq!(b, [2, 3, 0]);
        let mut z = [9u8; 8192];
        dev.read_at(SPARSE_BLOCK_SIZE as u64, &mut z).expect("read");
        assert!(z.iter().all(|&x| x == 0));
    }

    #[test]
    fn out_of_range_is_error_not_panic() {
        let dev = decode(&encode(&image())).expect("decodes");
        let size = dev.size();
        let mut b = [0u8; 2];
        assert!(dev.read_at(size - 1, &mut b).is_err());
        assert!(dev.read_at(u64::MAX, &mut b).is_err());
        assert!(dev.write_at(u64::MAX - 1, &b).is_err());
        let mut one = [0u8; 1];
        dev.read_at(size - 1, &mut one).expect("last byte");
        assert_eq!(one, [4]);
    }

    #[test]
    fn writes_allocate_only_non_zero_blocks() {
        let dev = SparseDevice::new(1 << 20, "w");
        dev.write_at(8192, &[0u8; 4096]).expect("zero write");
        assert_eq!(dev.stored_blocks(), 0);
        dev.write_at(8190, &[7u8; 4]).expect("write");
        assert_eq!(dev.block_indexes(), vec![1, 2]);
        let mut b = [0u8; 6];
        dev.read_at(8189, &mut b).expect("read");
        assert_eq!(b, [0, 7, 7, 7, 7, 0]);
    }

    #[test]
    fn hostile_encodings() {
        assert!(decode(&[]).is_none());
        assert!(decode(&[1, 2, 3]).is_none());
        // Too large a device.
        assert!(decode(&(SPARSE_SIZE_MAX + 1).to_le_bytes()).is_none());
        // A block past the end.
        let mut e = 4096u64.to_le_bytes().to_vec();
        e.extend_from_slice(&1u32.to_le_bytes());
        assert!(decode(&e).is_none());
        // A truncated record is zero-padded; a scrap shorter than an index ignored.
        let mut e = 10000u64.to_le_bytes().to_vec();
        e.extend_from_slice(&2u32.to_le_bytes());
        e.extend_from_slice(&[5u8; 1000]);
        let dev = decode(&e).expect("decodes");
        let mut b = [0u8; 2];
        dev.read_at(2 * 4096 + 999, &mut b).expect("read");
        assert_eq!(b, [5, 0]);
        // The part of the last block past the device's size reads as nothing.
        let mut e = 8200u64.to_le_bytes().to_vec();
        e.extend_from_slice(&2u32.to_le_bytes());
        e.extend_from_slice(&[5u8; 4096]);
        let dev = decode(&e).expect("decodes");
        assert_eq!(dev.size(), 8200);
        let mut b = [0u8; 8];
        dev.read_at(8192, &mut b).expect("read");
        assert_eq!(b, [5; 8]);
        assert!(dev.read_at(8193, &mut b).is_err());
        // Too many records.
        let mut e = SPARSE_SIZE_MAX.to_le_bytes().to_vec();
        e.resize(8 + (SPARSE_BLOCKS_MAX + 1) * RECORD_SIZE, 0);
        assert!(decode(&e).is_none());
    }
}
