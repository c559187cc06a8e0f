//! Allocator benchmark driver for bench/alloc.sh (kernel commit 59c7b566a3b6,
//! "btrfs: index free space entries on size"): fill a filesystem with random-size
//! preallocated files, delete every other one, then fallocate 64 MiB files until full.
//!
//!   alloc_bench fill DIR MIN MAX SEED     on a kernel mount: fragment it
//!   alloc_bench kernel DIR [LEN]          on a kernel mount: fallocate LEN files until ENOSPC
//!   alloc_bench ubtrfs IMG offset|size [LEN]
//!                                         the ubtrfs engine on an unmounted image, with the
//!                                         given free-space search mode, until NoSpace
//!
//! Each run ends with a `RESULT key=value ...` line that the script parses.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;
use ubtrfs_core::SearchMode;
use ubtrfs_core::{now, NewInode};
use ubtrfs_core::{Error, Trans};

const ROOT: u64 = 5;
const TOP_DIR: u64 = 256;

fn usage() -> ! {
    eprintln!("usage: alloc_bench fill DIR MIN MAX SEED | kernel DIR [LEN] | ubtrfs IMG offset|size [LEN]");
    std::process::exit(2)
}

fn parse_size(s: &str) -> u64 {
    let (n, m) = match s.as_bytes().last().map(|c| c.to_ascii_uppercase()) {
        Some(b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().unwrap_or_else(|_| usage()) * m
}

/// splitmix64: reproducible sizes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in paths")
}

/// Creates `path` and preallocates `len` bytes; Ok(false) on ENOSPC (file removed).
fn falloc_file(path: &Path, len: u64) -> std::io::Result<bool> {
    let c = cpath(path);
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            0o644,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOSPC) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    let r = unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) };
    let e = std::io::Error::last_os_error();
    unsafe { libc::close(fd) };
    if r == 0 {
        return Ok(true);
    }
    if e.raw_os_error() == Some(libc::ENOSPC) {
        let _ = std::fs::remove_file(path);
        return Ok(false);
    }
    Err(e)
}

fn syncfs(dir: &Path) {
    let f = std::fs::File::open(dir).expect("open dir");
    use std::os::fd::AsRawFd;
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        panic!("syncfs: {}", std::io::Error::last_os_error());
    }
}

fn fill(dir: &Path, min: u64, max: u64, seed: u64) {
    let mut rng = Rng(seed);
    let (min_s, max_s) = (min / 4096, max / 4096);
    let mut n = 0u64;
    let mut bytes = 0u64;
    let t = Instant::now();
    loop {
        let len = (min_s + rng.next() % (max_s - min_s + 1)) * 4096;
        match falloc_file(&dir.join(format!("f{n:07}")), len) {
            Ok(true) => {
                n += 1;
                bytes += len;
            }
            Ok(false) => break,
            Err(e) => panic!("fill: file {n}: {e}"),
        }
    }
    syncfs(dir);
    let mut freed = 0u64;
    let mut deleted = 0u64;
    for i in (1..n).step_by(2) {
        let p = dir.join(format!("f{i:07}"));
        freed += std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(&p).unwrap_or_else(|e| panic!("rm {}: {e}", p.display()));
        deleted += 1;
    }
    syncfs(dir);
    println!(
        "fill: {n} files, {} MiB preallocated (sizes {min}..{max}), deleted {deleted} odd files ({} MiB), {} ms",
        bytes >> 20,
        freed >> 20,
        t.elapsed().as_millis()
    );
    println!("RESULT files={n} bytes={bytes} deleted={deleted} freed={freed}");
}

/// funclatency-style log2 histogram.
fn histogram(unit: &str, v: &[u64]) {
    let mut buckets = [0u64; 64];
    for &x in v {
        let b = if x == 0 {
            0
        } else {
            63 - x.leading_zeros() as usize
        };
        buckets[b] += 1;
    }
    let top = buckets.iter().rposition(|&c| c > 0).unwrap_or(0);
    let maxc = *buckets.iter().max().unwrap_or(&1).max(&1);
    let w = ((1u64 << (top + 1)) - 1).to_string().len().max(10);
    println!("{unit:>w$}{:w2$} : count     distribution", "", w2 = w + 4);
    for (b, &c) in buckets.iter().enumerate().take(top + 1) {
        let lo = if b == 0 { 0 } else { 1u64 << b };
        let hi = (1u64 << (b + 1)) - 1;
        let stars = (c * 40 / maxc) as usize;
        println!("{lo:>w$} -> {hi:<w$} : {c:<8} |{:<40}|", "*".repeat(stars));
    }
    let total: u64 = v.iter().sum();
    let avg = if v.is_empty() {
        0
    } else {
        total / v.len() as u64
    };
    println!(
        "\navg = {avg} {unit}, total: {total} {unit}, count: {}\n",
        v.len()
    );
}

fn kernel(dir: &Path, len: u64) {
    let mut lat = Vec::new();
    let mut n = 0u64;
    let t = Instant::now();
    loop {
        let t1 = Instant::now();
        let ok = falloc_file(&dir.join(format!("big{n:06}")), len)
            .unwrap_or_else(|e| panic!("kernel: file {n}: {e}"));
        if !ok {
            break;
        }
        lat.push(t1.elapsed().as_nanos() as u64);
        n += 1;
    }
    let loop_ns = t.elapsed().as_nanos() as u64;
    let t2 = Instant::now();
    syncfs(dir);
    let sync_ns = t2.elapsed().as_nanos() as u64;
    println!(
        "kernel: per fallocate({} MiB) call latency (whole syscall, not per allocator search):",
        len >> 20
    );
    histogram("nsecs", &lat);
    println!(
        "kernel: {n} files of {} MiB, fallocate loop {} ms, syncfs {} ms, total {} ms",
        len >> 20,
        loop_ns / 1_000_000,
        sync_ns / 1_000_000,
        (loop_ns + sync_ns) / 1_000_000
    );
    println!(
        "RESULT files={n} bytes={} loop_ns={loop_ns} commit_ns={sync_ns} total_ns={}",
        n * len,
        loop_ns + sync_ns
    );
}

fn ubtrfs(img: &Path, mode: SearchMode, len: u64) -> Result<(), Error> {
    let t0 = Instant::now();
    let mut t = Trans::open_paths(&[img])?;
    let open_ns = t0.elapsed().as_nanos() as u64;
    t.set_search_mode(mode);
    t.record_alloc_latency(true);
    let mut n = 0u64;
    let mut bytes = 0u64;
    let mut extents = 0u64;
    let mut falloc_ns = 0u64;
    let t1 = Instant::now();
    let stop = loop {
        let attr = NewInode {
            mode: 0o100644,
            uid: 0,
            gid: 0,
            rdev: 0,
            time: now(),
        };
        let ino = t.create(ROOT, TOP_DIR, format!("big{n:06}").as_bytes(), attr)?;
        let t2 = Instant::now();
        let r = t.fallocate(ROOT, ino, 0, len, false, now());
        falloc_ns += t2.elapsed().as_nanos() as u64;
        match r {
            Ok(ext) => {
                n += 1;
                extents += ext.len() as u64;
                bytes += ext.iter().map(|e| e.1).sum::<u64>();
            }
            Err(Error::NoSpace(m)) => break m,
            Err(e) => return Err(e),
        }
    };
    let loop_ns = t1.elapsed().as_nanos() as u64;
    let t3 = Instant::now();
    t.commit()?;
    let commit_ns = t3.elapsed().as_nanos() as u64;
    let s = t.alloc_stats();
    println!("ubtrfs ({mode:?}): latency per allocator search (find_free, successful searches):");
    histogram("nsecs", &s.latencies_ns);
    let lat_total: u64 = s.latencies_ns.iter().sum();
    let avg = if s.latencies_ns.is_empty() {
        0
    } else {
        lat_total / s.latencies_ns.len() as u64
    };
    let mut sorted = s.latencies_ns.clone();
    sorted.sort_unstable();
    let pct = |q: f64| {
        sorted
            .get(((sorted.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    let (p50, p99) = (pct(0.5), pct(0.99));
    println!("ubtrfs ({mode:?}): search latency p50 {p50} ns, p99 {p99} ns");
    println!(
        "ubtrfs ({mode:?}): {n} files filled + 1 stopped by NoSpace ({stop}); {} MiB in {extents} extents; \
         searches {}, entries visited {}; open {} ms, fallocate calls {} ms (create excluded), loop {} ms, commit {} ms, loop+commit {} ms",
        bytes >> 20,
        s.searches,
        s.entries_visited,
        open_ns / 1_000_000,
        falloc_ns / 1_000_000,
        loop_ns / 1_000_000,
        commit_ns / 1_000_000,
        (loop_ns + commit_ns) / 1_000_000
    );
    println!(
        "RESULT files={n} bytes={bytes} extents={extents} searches={} visited={} avg_ns={avg} p50_ns={p50} lat_total_ns={lat_total} \
         falloc_ns={falloc_ns} loop_ns={loop_ns} commit_ns={commit_ns} total_ns={}",
        s.searches,
        s.entries_visited,
        loop_ns + commit_ns
    );
    Ok(())
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let len_at = |i: usize| a.get(i).map(|s| parse_size(s)).unwrap_or(64 << 20);
    match a.first().map(String::as_str) {
        Some("fill") if a.len() == 5 => fill(
            &PathBuf::from(&a[1]),
            parse_size(&a[2]),
            parse_size(&a[3]),
            a[4].parse().unwrap_or_else(|_| usage()),
        ),
        Some("kernel") if a.len() >= 2 => kernel(&PathBuf::from(&a[1]), len_at(2)),
        Some("ubtrfs") if a.len() >= 3 => {
            let mode = match a[2].as_str() {
                "offset" => SearchMode::OffsetOnly,
                "size" => SearchMode::SizeIndex,
                _ => usage(),
            };
            if let Err(e) = ubtrfs(&PathBuf::from(&a[1]), mode, len_at(3)) {
                eprintln!("alloc_bench ubtrfs: error: {e} ({e:?})");
                std::process::exit(1);
            }
        }
        _ => usage(),
    }
}
