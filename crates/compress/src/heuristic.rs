//! Whether data is worth compressing, decided as the kernel's
//! btrfs_compress_heuristic decides it before compress_file_range tries (so data the
//! kernel would not even try is written plain, and the inode is not marked
//! NOCOMPRESS for it): a sample of 16 bytes every 256 bytes of the first 128 KiB, then
//! in order: the sample's two halves equal (repeated data: compress); fewer than 64
//! distinct byte values (compress); the bytes that make up 90% of the sample: at most
//! 64 of them compress, 200 or more do not; else the sample's Shannon entropy in the
//! kernel's integer approximation: below 80% of the maximum compress.

const SAMPLING_READ_SIZE: usize = 16;
const SAMPLING_INTERVAL: usize = 256;
const PAGE_SIZE: usize = 4096;
const BYTE_SET_THRESHOLD: usize = 64;
const BYTE_CORE_SET_LOW: usize = 64;
const BYTE_CORE_SET_HIGH: usize = 200;
const ENTROPY_LVL_ACCEPTABLE: u32 = 65;
const ENTROPY_LVL_HIGH: u32 = 80;

/// ilog2(n^4), the kernel's `ilog2_w` (finer steps than ilog2 for the entropy).
fn ilog2_w(n: u64) -> u32 {
    let n4 = n.saturating_mul(n).saturating_mul(n).saturating_mul(n);
    if n4 == 0 {
        0
    } else {
        63 - n4.leading_zeros()
    }
}

/// The kernel's heuristic for a range starting at a page boundary: `data` is the
/// range as the page cache holds it (a file's last page padded with zeros to its
/// end). True: compression should be tried.
pub fn compress_heuristic(data: &[u8]) -> bool {
    let len = data.len().min(crate::MAX_UNCOMPRESSED);
    if len < SAMPLING_READ_SIZE {
        return true;
    }
    // heuristic_collect_sample: per page, 16 bytes at each 256-byte step below
    // PAGE_SIZE - 16, none reading past the range's end.
    let mut sample = Vec::with_capacity(len / SAMPLING_INTERVAL * SAMPLING_READ_SIZE + 16);
    let mut page = 0;
    'pages: while page * PAGE_SIZE < len {
        let mut i = 0;
        while i < PAGE_SIZE - SAMPLING_READ_SIZE {
            let pos = page * PAGE_SIZE + i;
            if pos + SAMPLING_READ_SIZE > len {
                break 'pages;
            }
            sample.extend_from_slice(&data[pos..pos + SAMPLING_READ_SIZE]);
            i += SAMPLING_INTERVAL;
        }
        page += 1;
    }
    let size = sample.len();
    if size == 0 {
        return true;
    }
    let half = size / 2;
    if sample[..half] == sample[half..2 * half] {
        return true;
    }
    let mut counts = [0u32; 256];
    for &b in &sample {
        counts[b as usize] += 1;
    }
    if counts.iter().filter(|&&c| c > 0).count() < BYTE_SET_THRESHOLD {
        return true;
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    // byte_core_set_size: how many of the most frequent bytes make 90% of it.
    let threshold = (size * 90 / 100) as u64;
    let mut sum: u64 = counts[..BYTE_CORE_SET_LOW].iter().map(|&c| c as u64).sum();
    let core = if sum > threshold {
        BYTE_CORE_SET_LOW
    } else {
        let mut i = BYTE_CORE_SET_LOW;
        while i < BYTE_CORE_SET_HIGH && counts[i] > 0 {
            sum += counts[i] as u64;
            if sum > threshold {
                break;
            }
            i += 1;
        }
        i
    };
    if core <= BYTE_CORE_SET_LOW {
        return true;
    }
    if core >= BYTE_CORE_SET_HIGH {
        return false;
    }
    // shannon_entropy, in percent of the maximum.
    let entropy_max = 8 * ilog2_w(2);
    let sz_base = ilog2_w(size as u64);
    let mut entropy: u64 = 0;
    for &c in counts.iter().take_while(|&&c| c > 0) {
        entropy += c as u64 * (sz_base.saturating_sub(ilog2_w(c as u64))) as u64;
    }
    let entropy = (entropy / size as u64) as u32 * 100 / entropy_max;
    if entropy <= ENTROPY_LVL_ACCEPTABLE {
        return true;
    }
    entropy < ENTROPY_LVL_HIGH
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stand-in for random bytes (xorshift).
    fn noise(n: usize) -> Vec<u8> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn decides_as_the_kernel_on_clear_cases() {
        assert!(compress_heuristic(&vec![0u8; 4096]));
        assert!(compress_heuristic(
            &b"yyyyyyyy\n".repeat(15000)[..128 * 1024]
        ));
        let mut tiny = b"tiny\n".to_vec();
        tiny.resize(4096, 0);
        assert!(compress_heuristic(&tiny));
        assert!(!compress_heuristic(&noise(128 * 1024)));
        let mut mostly_noise = noise(126 * 1024);
        mostly_noise.resize(128 * 1024, 0);
        assert!(!compress_heuristic(&mostly_noise));
    }
}
