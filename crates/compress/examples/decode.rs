//! Decompress one btrfs extent and print the result to stdout.
//!
//! Usage: `decode <zlib|lzo|zstd> <regular|inline> <input> <ram_bytes> [sectorsize]`
//!
//! `input` holds the extent's raw bytes (`disk_num_bytes` bytes for a
//! regular extent, the inline payload for an inline one).

use std::io::Write;
use std::process::ExitCode;

use ubtrfs_compress::{decompress, decompress_inline, Compression};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!(
            "usage: decode <zlib|lzo|zstd> <regular|inline> <input> <ram_bytes> [sectorsize]"
        );
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
    let Ok(ram) = args[4].parse::<usize>() else {
        eprintln!("bad ram_bytes {}", args[4]);
        return ExitCode::from(2);
    };
    let ss = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let input = match std::fs::read(&args[3]) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{}: {e}", args[3]);
            return ExitCode::from(1);
        }
    };
    let res = if args[2] == "inline" {
        decompress_inline(alg, &input, ram, ss)
    } else {
        decompress(alg, &input, ram, ss)
    };
    match res {
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
