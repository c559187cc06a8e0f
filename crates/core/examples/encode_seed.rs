//! Encodes a btrfs image file into a fuzz seed (flags byte + sparse encoding of its
//! non-zero 4 KiB blocks), or decodes a seed back into an image.
//!
//! ```text
//! cargo run -p ubtrfs-core --example encode_seed -- [--all] IMAGE SEED
//! cargo run -p ubtrfs-core --example encode_seed -- --decode SEED IMAGE   (checksums
//!     repaired first when the seed's flags byte asks, as the harness does)
//! ```
//!
//! By default only the blocks the fuzz harness reads (superblocks, live tree blocks,
//! file data) are kept: stale copies left by copy-on-write would only make the seed
//! bigger. `--all` keeps every non-zero block.

use std::collections::BTreeSet;
use std::io;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use ubtrfs_core::fuzzing::harness::{run_device, seed_from_image, Limits, SEED_FLAGS};
use ubtrfs_core::fuzzing::sparse_dev::{decode, SparseDevice, SPARSE_BLOCK_SIZE};
use ubtrfs_core::Device;
use ubtrfs_core::{FsInfo, OpenOptions};

/// Remembers which 4 KiB blocks were read.
#[derive(Debug)]
struct Recorder {
    inner: SparseDevice,
    read: Mutex<BTreeSet<u64>>,
}

impl Device for Recorder {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)?;
        if !buf.is_empty() {
            let bs = SPARSE_BLOCK_SIZE as u64;
            let last = (offset + buf.len() as u64 - 1) / bs;
            if let Ok(mut r) = self.read.lock() {
                r.extend(offset / bs..=last);
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

/// The image with every block the harness does not read zeroed.
fn minimize(img: &[u8]) -> Result<Vec<u8>, String> {
    let rec = Arc::new(Recorder {
        inner: SparseDevice::from_image(img, "image"),
        read: Mutex::new(BTreeSet::new()),
    });
    let limits = Limits {
        entries: usize::MAX,
        file_bytes: usize::MAX,
        total_bytes: u64::MAX,
        dump_bytes: u64::MAX,
        ..Limits::default()
    };
    let out = run_device(rec.clone(), true, limits);
    if let Some(e) = &out.open_error {
        return Err(format!("does not open: {e}"));
    }
    for e in &out.errors {
        eprintln!("warning: {e}");
    }
    let mut read = rec.read.lock().map_err(|_| "poisoned")?.clone();
    // Only the first copy of DUP metadata was read; keep the other copies too so the
    // fuzzer can exercise the fall-back to a good mirror.
    let dev: Arc<dyn Device> = Arc::new(SparseDevice::from_image(img, "image"));
    let info = FsInfo::open(vec![dev], OpenOptions::default()).map_err(|e| e.to_string())?;
    let bs = SPARSE_BLOCK_SIZE as u64;
    let mut extra = Vec::new();
    for e in info.chunk_map.iter().filter(|e| e.num_mirrors() > 1) {
        let len = e.stripe_size();
        for s in &e.stripes {
            let first = s.physical / bs;
            let last = (s.physical + len).div_ceil(bs);
            for b in read.range(first..last) {
                let rel = (b * bs).saturating_sub(s.physical);
                extra.extend(e.stripes.iter().map(|o| (o.physical + rel) / bs));
            }
        }
    }
    read.extend(extra);
    let mut min = vec![0u8; img.len()];
    for idx in read {
        let a = idx as usize * SPARSE_BLOCK_SIZE;
        let b = (a + SPARSE_BLOCK_SIZE).min(img.len());
        min[a..b].copy_from_slice(&img[a..b]);
    }
    Ok(min)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.as_slice() {
        [flag, seed, image] if flag == "--decode" => decode_seed(seed, image),
        [flag, image, seed] if flag == "--all" => encode_image(image, seed, false),
        [image, seed] => encode_image(image, seed, true),
        _ => Err("usage: encode_seed [--all] IMAGE SEED | encode_seed --decode SEED IMAGE".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("encode_seed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn encode_image(image: &str, seed: &str, min: bool) -> Result<(), String> {
    let mut img = std::fs::read(image).map_err(|e| format!("{image}: {e}"))?;
    if min {
        img = minimize(&img).map_err(|e| format!("{image}: {e}"))?;
    }
    let out = seed_from_image(&img);
    debug_assert_eq!(out.first(), Some(&SEED_FLAGS));
    std::fs::write(seed, &out).map_err(|e| format!("{seed}: {e}"))?;
    println!(
        "{seed}: {} bytes from {} bytes of image",
        out.len(),
        img.len()
    );
    Ok(())
}

fn decode_seed(seed: &str, image: &str) -> Result<(), String> {
    let bytes = std::fs::read(seed).map_err(|e| format!("{seed}: {e}"))?;
    let body = bytes.get(1..).ok_or("empty seed")?;
    let dev = decode(body).ok_or("not a sparse encoding")?;
    // What the harness opens: with the flag set, the checksums repaired first.
    if bytes[0] & ubtrfs_core::fuzzing::harness::FLAG_FIX_CSUMS != 0 {
        ubtrfs_core::fuzzing::harness::fix_checksums(&dev);
    }
    let mut img = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut img).map_err(|e| e.to_string())?;
    std::fs::write(image, &img).map_err(|e| format!("{image}: {e}"))?;
    Ok(())
}
