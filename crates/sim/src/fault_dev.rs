//! [`RecordingDevice`]: an in-memory [`Device`] that logs every write, grouped into
//! batches separated by `flush()`, so a test can rebuild the image a power cut would
//! leave behind:
//!
//! * right after flush `n` completed ([`RecordingDevice::image_after_flush`]): the base
//!   image plus every write issued before that flush;
//! * in the middle of the batch of writes between flush `n` and flush `n + 1`
//!   ([`RecordingDevice::crash_images`]): a prefix of the batch, any subset of it (the
//!   disk may reorder writes between flushes) or a subset with one write torn at a
//!   512-byte sector boundary.
//!
//! Reads see every write issued so far, like a page cache. The device has the fixed
//! size of the base image; writes past its end fail with
//! [`io::ErrorKind::InvalidInput`].

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ubtrfs_core::Device;

use crate::rng::Rng;

/// Granularity of torn writes: a disk writes whole sectors atomically, nothing larger.
pub const SECTOR_SIZE: u64 = 512;

/// At most this many write indices are spelled out in a crash image's description.
const MAX_LISTED: usize = 12;

#[derive(Clone)]
struct Write {
    offset: u64,
    data: Vec<u8>,
}

struct State {
    /// Base image with every write applied: what reads see.
    current: Vec<u8>,
    /// `batches[i]`: writes issued after flush `i` (0 = creation) and before flush
    /// `i + 1`. The last batch is the unflushed tail, so `batches.len() == flushes + 1`.
    batches: Vec<Vec<Write>>,
}

/// Records writes between flushes; see the module documentation.
pub struct RecordingDevice {
    base: Vec<u8>,
    name: String,
    state: Mutex<State>,
}

impl fmt::Debug for RecordingDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("RecordingDevice")
            .field("name", &self.name)
            .field("size", &self.base.len())
            .field("flushes", &(st.batches.len() - 1))
            .field("writes_since_flush", &st.batches.last().map_or(0, Vec::len))
            .finish()
    }
}

/// Copies `w` into `img`; the range was checked when the write was accepted.
fn apply(img: &mut [u8], offset: u64, data: &[u8]) {
    let start = offset as usize;
    img[start..start + data.len()].copy_from_slice(data);
}

/// Byte offsets at which `w` may be torn: its start (no sector reached the disk) and
/// every absolute sector boundary strictly inside it. Index `k` keeps `k` sectors.
fn tear_points(w: &Write) -> Vec<u64> {
    let end = w.offset + w.data.len() as u64;
    let mut points = vec![w.offset];
    let mut b = (w.offset / SECTOR_SIZE + 1) * SECTOR_SIZE;
    while b < end {
        points.push(b);
        b += SECTOR_SIZE;
    }
    points
}

/// Number of sectors `w` touches.
fn sectors_spanned(w: &Write) -> usize {
    tear_points(w).len()
}

fn list_indices(idx: &[usize]) -> String {
    if idx.len() > MAX_LISTED {
        return String::new();
    }
    let parts: Vec<String> = idx.iter().map(usize::to_string).collect();
    format!(" [{}]", parts.join(","))
}

impl RecordingDevice {
    /// A device holding `base` (the image before the workload); its size is
    /// `base.len()` and never changes.
    pub fn new(base: Vec<u8>, name: &str) -> Arc<RecordingDevice> {
        let current = base.clone();
        Arc::new(RecordingDevice {
            base,
            name: name.to_string(),
            state: Mutex::new(State {
                current,
                batches: vec![Vec::new()],
            }),
        })
    }

    /// The state is only mutated after all checks passed, so a poisoned lock still
    /// guards consistent data.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes issued since the last `flush()` (or since creation).
    pub fn writes_since_flush(&self) -> usize {
        self.lock().batches.last().map_or(0, Vec::len)
    }

    /// Number of `flush()` calls so far.
    pub fn flushes(&self) -> usize {
        self.lock().batches.len() - 1
    }

    /// Number of writes between flush `n` and flush `n + 1` (the unflushed tail if
    /// `n == flushes()`); 0 if there is no such batch.
    pub fn batch_len(&self, n: usize) -> usize {
        self.lock().batches.get(n).map_or(0, Vec::len)
    }

    /// The image as it would be on disk if power were cut right after flush number
    /// `n` completed (0 = the base image): the base plus every write issued before
    /// that flush.
    ///
    /// # Panics
    /// If `n > flushes()`.
    pub fn image_after_flush(&self, n: usize) -> Vec<u8> {
        let st = self.lock();
        Self::image_after(&self.base, &st, n)
    }

    fn image_after(base: &[u8], st: &State, n: usize) -> Vec<u8> {
        let flushes = st.batches.len() - 1;
        assert!(
            n <= flushes,
            "image_after_flush({n}): only {flushes} flushes so far"
        );
        let mut img = base.to_vec();
        for w in st.batches[..n].iter().flatten() {
            apply(&mut img, w.offset, &w.data);
        }
        img
    }

    /// Every image a test checks for flush point `n`: the one right after flush `n`
    /// (`inside` false), then, unless `n` is the last flush, `per_batch` cut inside the
    /// batch that follows it ([`RecordingDevice::crash_images`], seeded by `n`;
    /// `inside` true). Each with a description.
    pub fn cut_images(&self, n: usize, per_batch: usize) -> Vec<(String, Vec<u8>, bool)> {
        let mut images = vec![(format!("after flush {n}"), self.image_after_flush(n), false)];
        if n < self.flushes() {
            for (what, img) in self.crash_images(n, n as u64, per_batch) {
                images.push((format!("inside batch {n}: {what}"), img, true));
            }
        }
        images
    }

    /// `count` crash images from inside the batch of writes between flush `n` and
    /// flush `n + 1` (the unflushed tail if `n == flushes()`), each with a short
    /// description. Deterministic for a given `seed` and `n`. Images cycle through
    /// three kinds:
    ///
    /// * prefix: the first `k` writes of the batch (`0 <= k <= len`);
    /// * subset: any subset of the batch (writes between flushes may be reordered);
    /// * torn: a subset plus one write of which only a strict prefix of its 512-byte
    ///   sectors (cut at absolute sector boundaries) reached the disk. A write that
    ///   spans several sectors is preferred, so the tear is a real partial write.
    ///
    /// Writes that reach the disk are applied in issue order. If the batch is empty,
    /// every image is `image_after_flush(n)`.
    ///
    /// # Panics
    /// If `n > flushes()`.
    pub fn crash_images(&self, n: usize, seed: u64, count: usize) -> Vec<(String, Vec<u8>)> {
        let (start, batch) = {
            let st = self.lock();
            let start = Self::image_after(&self.base, &st, n);
            (start, st.batches[n].clone())
        };
        let len = batch.len();
        let mut rng = Rng::new(seed ^ (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut out = Vec::with_capacity(count);
        if len == 0 {
            for _ in 0..count {
                out.push((
                    format!("flush {n}: empty batch, image after flush {n}"),
                    start.clone(),
                ));
            }
            return out;
        }
        // Writes that can be torn into a genuinely partial write, if there are any.
        let multi: Vec<usize> = (0..len)
            .filter(|&i| sectors_spanned(&batch[i]) > 1)
            .collect();
        for i in 0..count {
            let mut img = start.clone();
            let desc = match i % 3 {
                0 => {
                    let k = rng.below(len as u64 + 1) as usize;
                    for w in &batch[..k] {
                        apply(&mut img, w.offset, &w.data);
                    }
                    format!("flush {n} + prefix {k}/{len} writes")
                }
                1 => {
                    // Vary the density so both sparse and nearly full subsets occur.
                    let keep = rng.range(1, 4);
                    let idx: Vec<usize> = (0..len).filter(|_| rng.chance(keep, 4)).collect();
                    for &j in &idx {
                        apply(&mut img, batch[j].offset, &batch[j].data);
                    }
                    format!(
                        "flush {n} + subset {}/{len} writes{}",
                        idx.len(),
                        list_indices(&idx)
                    )
                }
                _ => {
                    let torn = if multi.is_empty() {
                        rng.below(len as u64) as usize
                    } else {
                        multi[rng.below(multi.len() as u64) as usize]
                    };
                    let points = tear_points(&batch[torn]);
                    let kept_sectors = rng.below(points.len() as u64) as usize;
                    let cut = points[kept_sectors];
                    let keep = rng.range(1, 4);
                    let mut idx = Vec::new();
                    for (j, w) in batch.iter().enumerate() {
                        if j == torn {
                            let kept = (cut - w.offset) as usize;
                            apply(&mut img, w.offset, &w.data[..kept]);
                        } else if rng.chance(keep, 4) {
                            apply(&mut img, w.offset, &w.data);
                            idx.push(j);
                        }
                    }
                    format!(
                        "flush {n} + subset {}/{len} writes{}, write {torn} \
                         (offset {}, {} sectors) torn after {kept_sectors} sectors ({} bytes)",
                        idx.len(),
                        list_indices(&idx),
                        batch[torn].offset,
                        points.len(),
                        cut - batch[torn].offset
                    )
                }
            };
            out.push((desc, img));
        }
        out
    }

    /// The image with every write applied (what reads see).
    pub fn current_image(&self) -> Vec<u8> {
        self.lock().current.clone()
    }
}

impl Device for RecordingDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let st = self.lock();
        let src = usize::try_from(offset)
            .ok()
            .and_then(|start| Some(start..start.checked_add(buf.len())?))
            .and_then(|r| st.current.get(r))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at {offset} beyond the end of {} ({} bytes)",
                        buf.len(),
                        self.name,
                        self.base.len()
                    ),
                )
            })?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        let range = usize::try_from(offset)
            .ok()
            .and_then(|start| Some(start..start.checked_add(buf.len())?))
            .filter(|r| r.end <= st.current.len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "write of {} bytes at {offset} beyond the end of {} ({} bytes)",
                        buf.len(),
                        self.name,
                        self.base.len()
                    ),
                )
            })?;
        if buf.is_empty() {
            return Ok(());
        }
        st.current[range].copy_from_slice(buf);
        let w = Write {
            offset,
            data: buf.to_vec(),
        };
        match st.batches.last_mut() {
            Some(batch) => batch.push(w),
            None => st.batches.push(vec![w]),
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.lock().batches.push(Vec::new());
        Ok(())
    }

    fn size(&self) -> u64 {
        self.base.len() as u64
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Which durable points (commits, synced logs) an image cut by a power loss may show,
/// given the flush count at which each became durable, in order: after flush `n`, the
/// last one durable by then; cut inside the batch that follows flush `n` (`inside`),
/// also the one completed at flush `n + 1` (that batch holds its superblock writes).
pub fn allowed_points(durable_at: &[usize], n: usize, inside: bool) -> Vec<usize> {
    let mut ok: Vec<usize> = durable_at
        .iter()
        .rposition(|&f| f <= n)
        .into_iter()
        .collect();
    if inside {
        if let Some(k) = durable_at.iter().position(|&f| f == n + 1) {
            ok.push(k);
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(d: &RecordingDevice, off: u64, len: usize, byte: u8) {
        d.write_at(off, &vec![byte; len]).expect("in-bounds write");
    }

    fn expected(base: &[u8], writes: &[(u64, usize, u8)]) -> Vec<u8> {
        let mut img = base.to_vec();
        for &(off, len, b) in writes {
            img[off as usize..off as usize + len].fill(b);
        }
        img
    }

    #[test]
    fn send_sync_and_dyn() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<RecordingDevice>();
        let d: Arc<dyn Device> = RecordingDevice::new(vec![0; 1024], "x");
        assert_eq!(d.size(), 1024);
        assert_eq!(d.name(), "x");
    }

    #[test]
    fn scripted_image_after_flush() {
        let base: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let d = RecordingDevice::new(base.clone(), "scripted");
        let b0 = [(0, 512, 1), (1024, 100, 2)];
        let b1 = [(512, 512, 3), (0, 10, 4), (1030, 4, 5)];
        let b2 = [(2048, 1024, 6), (8192 - 7, 7, 7)];
        for &(o, l, b) in &b0 {
            write(&d, o, l, b);
        }
        assert_eq!(d.writes_since_flush(), 2);
        d.flush().expect("flush");
        assert_eq!(d.writes_since_flush(), 0);
        d.flush().expect("empty flush");
        for &(o, l, b) in &b1 {
            write(&d, o, l, b);
        }
        d.flush().expect("flush");
        for &(o, l, b) in &b2 {
            write(&d, o, l, b);
        }
        assert_eq!(d.flushes(), 3);
        assert_eq!(d.writes_since_flush(), 2);
        assert_eq!(d.batch_len(0), 2);
        assert_eq!(d.batch_len(1), 0);
        assert_eq!(d.batch_len(2), 3);
        assert_eq!(d.batch_len(3), 2);
        assert_eq!(d.batch_len(4), 0);

        let all0: Vec<_> = b0.to_vec();
        let all1: Vec<_> = b0.iter().chain(&b1).copied().collect();
        let all2: Vec<_> = all1.iter().chain(&b2).copied().collect();
        assert_eq!(d.image_after_flush(0), base);
        assert_eq!(d.image_after_flush(1), expected(&base, &all0));
        assert_eq!(d.image_after_flush(2), expected(&base, &all0));
        assert_eq!(d.image_after_flush(3), expected(&base, &all1));
        assert_eq!(d.current_image(), expected(&base, &all2));

        // Reads see unflushed writes.
        let mut buf = [0u8; 12];
        d.read_at(1024, &mut buf).expect("read");
        assert_eq!(buf, [2, 2, 2, 2, 2, 2, 5, 5, 5, 5, 2, 2]);
        let mut buf = [0u8; 7];
        d.read_at(8192 - 7, &mut buf).expect("read at end");
        assert_eq!(buf, [7; 7]);
    }

    #[test]
    #[should_panic(expected = "only 1 flushes")]
    fn image_after_future_flush_panics() {
        let d = RecordingDevice::new(vec![0; 1024], "p");
        d.flush().expect("flush");
        let _ = d.image_after_flush(2);
    }

    #[test]
    fn out_of_bounds() {
        let d = RecordingDevice::new(vec![0; 4096], "oob");
        let e = d.write_at(4000, &[1; 200]).expect_err("past the end");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = d.write_at(u64::MAX, &[1; 2]).expect_err("overflow");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = d.write_at(4097, &[]).expect_err("empty write past the end");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(d.writes_since_flush(), 0);
        assert_eq!(d.current_image(), vec![0; 4096]);
        assert_eq!(d.size(), 4096);

        d.write_at(4096 - 96, &[9; 96])
            .expect("write ending at the end");
        d.write_at(4096, &[]).expect("empty write at the end");
        assert_eq!(d.writes_since_flush(), 1);
        let mut buf = [0u8; 8];
        let e = d.read_at(4090, &mut buf).expect_err("read past the end");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = d.read_at(u64::MAX, &mut buf).expect_err("read overflow");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// Builds a device with three batches plus a tail; the writes of batch `k` carry
    /// bytes `0x10 * (k + 1) + j` so their origin is recognisable.
    /// (offset, length, fill byte) of each write, per batch.
    type Script = Vec<Vec<(u64, usize, u8)>>;

    fn workload(seed: u64) -> (Arc<RecordingDevice>, Script) {
        let size = 64 * 1024;
        let d = RecordingDevice::new(vec![0; size], "w");
        let mut rng = Rng::new(seed);
        let mut batches = Vec::new();
        for k in 0..4u8 {
            let mut batch = Vec::new();
            let nw = rng.range(1, 10) as u8;
            for j in 0..nw {
                let len = rng.range(1, 5000) as usize;
                let off = rng.below((size - len) as u64 + 1);
                let byte = 0x10 * (k + 1) + j;
                write(&d, off, len, byte);
                batch.push((off, len, byte));
            }
            batches.push(batch);
            if k < 3 {
                d.flush().expect("flush");
            }
        }
        (d, batches)
    }

    #[test]
    fn crash_images_only_contain_writes_of_their_batch() {
        for seed in 0..20 {
            let (d, batches) = workload(seed);
            assert_eq!(d.flushes(), 3);
            for (n, batch) in batches.iter().enumerate() {
                let start = d.image_after_flush(n);
                let images = d.crash_images(n, seed, 30);
                assert_eq!(images.len(), 30);
                for (desc, img) in &images {
                    assert!(desc.starts_with(&format!("flush {n} + ")), "{desc}");
                    assert_eq!(img.len(), start.len());
                    for (pos, (&got, &was)) in img.iter().zip(&start).enumerate() {
                        if got == was {
                            continue;
                        }
                        let from_batch = batch.iter().any(|&(o, l, b)| {
                            (o as usize..o as usize + l).contains(&pos) && b == got
                        });
                        assert!(
                            from_batch,
                            "{desc}: byte {pos} = {got:#x} not from batch {n}"
                        );
                    }
                }
                // Prefix images are exactly one of the possible prefixes.
                for (desc, img) in images.iter().step_by(3) {
                    assert!(desc.contains("prefix"), "{desc}");
                    let ok = (0..=batch.len()).any(|k| *img == expected(&start, &batch[..k]));
                    assert!(ok, "{desc}");
                }
            }
        }
    }

    #[test]
    fn crash_images_cover_all_kinds() {
        let (d, _) = workload(3);
        let images = d.crash_images(1, 99, 6);
        let descs: Vec<&str> = images.iter().map(|(s, _)| s.as_str()).collect();
        assert!(descs[0].contains("prefix"), "{descs:?}");
        assert!(descs[1].contains("subset") && !descs[1].contains("torn"));
        assert!(descs[2].contains("torn"), "{descs:?}");
        assert!(descs[5].contains("torn"), "{descs:?}");
    }

    #[test]
    fn torn_writes_are_sector_prefixes() {
        // One aligned 8-sector write and one unaligned write (offset 100, 1500 bytes:
        // sectors 0..=3, tear points 100, 512, 1024, 1536).
        let d = RecordingDevice::new(vec![0; 16384], "torn");
        d.flush().expect("flush");
        write(&d, 4096, 8 * 512, 0xAA);
        d.flush().expect("flush");
        write(&d, 100, 1500, 0xBB);
        let mut seen_aligned = std::collections::BTreeSet::new();
        let mut seen_unaligned = std::collections::BTreeSet::new();
        for seed in 0..50 {
            for (desc, img) in d.crash_images(1, seed, 9) {
                assert!(img[..4096].iter().all(|&b| b == 0), "{desc}");
                assert!(img[4096 + 4096..].iter().all(|&b| b == 0), "{desc}");
                let kept = img[4096..8192].iter().take_while(|&&b| b == 0xAA).count();
                assert!(img[4096 + kept..8192].iter().all(|&b| b == 0), "{desc}");
                if desc.contains("torn") {
                    assert_eq!(kept % 512, 0, "{desc}");
                    assert!(kept < 4096, "{desc}: tear must be a strict prefix");
                    assert!(desc.contains(&format!("torn after {} sectors", kept / 512)));
                    seen_aligned.insert(kept / 512);
                } else {
                    assert!(kept == 0 || kept == 4096, "{desc}");
                }
            }
            for (desc, img) in d.crash_images(2, seed, 9) {
                let first = img[..4096].iter().position(|&b| b == 0xBB);
                let kept = img[..4096].iter().filter(|&&b| b == 0xBB).count();
                if let Some(first) = first {
                    assert_eq!(first, 100, "{desc}");
                }
                assert!(img[100 + kept..4096].iter().all(|&b| b == 0), "{desc}");
                assert!(img[4096..8192].iter().all(|&b| b == 0xAA), "{desc}");
                if desc.contains("torn") {
                    let cut = 100 + kept;
                    assert!([100, 512, 1024, 1536].contains(&cut), "{desc}: cut {cut}");
                    seen_unaligned.insert(cut);
                } else {
                    assert!(kept == 0 || kept == 1500, "{desc}");
                }
            }
        }
        assert_eq!(seen_aligned, (0..8).collect());
        assert_eq!(seen_unaligned, [100, 512, 1024, 1536].into_iter().collect());
    }

    #[test]
    fn single_sector_writes_tear_to_nothing() {
        let d = RecordingDevice::new(vec![0; 4096], "small");
        write(&d, 512, 512, 1);
        write(&d, 1024, 100, 2);
        for (desc, img) in d.crash_images(0, 5, 30) {
            if desc.contains("torn") {
                assert!(desc.contains("torn after 0 sectors"), "{desc}");
            }
            assert_eq!(img.len(), 4096);
        }
    }

    #[test]
    fn crash_images_deterministic_for_a_seed() {
        let (d1, _) = workload(11);
        let (d2, _) = workload(11);
        for n in 0..=d1.flushes() {
            assert_eq!(d1.crash_images(n, 1234, 12), d2.crash_images(n, 1234, 12));
            assert_eq!(d1.crash_images(n, 1234, 12), d1.crash_images(n, 1234, 12));
        }
        // A different seed gives a different set somewhere.
        let differs = (0..=d1.flushes())
            .any(|n| d1.crash_images(n, 1234, 12) != d1.crash_images(n, 4321, 12));
        assert!(differs);
    }

    #[test]
    fn empty_batch_and_tail() {
        let d = RecordingDevice::new(vec![7; 2048], "e");
        write(&d, 0, 512, 1);
        d.flush().expect("flush");
        let images = d.crash_images(1, 0, 4);
        assert_eq!(images.len(), 4);
        for (desc, img) in &images {
            assert!(desc.contains("empty batch"), "{desc}");
            assert_eq!(*img, d.image_after_flush(1));
        }
        write(&d, 1024, 1024, 2);
        // Tail: prefix images are either the flushed image or the current one.
        for (desc, img) in d.crash_images(1, 0, 9).iter().step_by(3) {
            assert!(
                *img == d.image_after_flush(1) || *img == d.current_image(),
                "{desc}"
            );
        }
    }
}
