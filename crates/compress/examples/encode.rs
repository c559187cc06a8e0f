//! Compress a file with btrfs framing and print the result to stdout.
//!
//! Usage: `encode <zlib|lzo|zstd> <input> [level] [sectorsize]`
//!
//! Prints the unpadded extent bytes (what would be stored on disk before
//! the zero padding up to a sector). Used by `tests/data/kernel_accepts.py`
//! to check that the kernel reads what this crate writes.

use std::io::Write;
use std::process::ExitCode;

use ubtrfs_compress::{compress_raw, Compression};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: encode <zlib|lzo|zstd> <input> [level] [sectorsize]");
        return ExitCode::from(2);
    }
    let alg = match args[1].as_str() {
        "zlib" => Compression::Zlib,
        "lzo" => Compression::Lzo,
        "zstd" => Compression::Zstd,
        other => {
            eprintln!("unknown algorithm {other}");
            return ExitCode::from(2);
        }
    };
    let level = args.get(3).and_then(|s| s.parse().ok());
    let ss = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let input = match std::fs::read(&args[2]) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{}: {e}", args[2]);
            return ExitCode::from(1);
        }
    };
    match compress_raw(alg, &input, level, ss) {
        Ok(out) => {
            if let Err(e) = std::io::stdout().write_all(&out) {
                eprintln!("write: {e}");
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
