//! Encodes a btrfs image file into a fuzz seed (flags byte + sparse encoding of its
//! non-zero 4 KiB blocks), or decodes a seed back into an image.
//!
//! ```text
//! cargo run -p ubtrfs-core --example encode_seed -- IMAGE SEED
//! cargo run -p ubtrfs-core --example encode_seed -- --decode SEED IMAGE
//! ```

use std::process::ExitCode;
use ubtrfs_core::fuzz_harness::seed_from_image;
use ubtrfs_core::sparse_dev::decode;
use ubtrfs_core::dev::Device;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.as_slice() {
        [flag, seed, image] if flag == "--decode" => decode_seed(seed, image),
        [image, seed] => encode_image(image, seed),
        _ => Err("usage: encode_seed IMAGE SEED | encode_seed --decode SEED IMAGE".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("encode_seed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn encode_image(image: &str, seed: &str) -> Result<(), String> {
    let img = std::fs::read(image).map_err(|e| format!("{image}: {e}"))?;
    let out = seed_from_image(&img);
    std::fs::write(seed, &out).map_err(|e| format!("{seed}: {e}"))?;
    println!("{seed}: {} bytes from {} bytes of image", out.len(), img.len());
    Ok(())
}

fn decode_seed(seed: &str, image: &str) -> Result<(), String> {
    let bytes = std::fs::read(seed).map_err(|e| format!("{seed}: {e}"))?;
    let body = bytes.get(1..).ok_or("empty seed")?;
    let dev = decode(body).ok_or("not a sparse encoding")?;
    let mut img = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut img).map_err(|e| e.to_string())?;
    std::fs::write(image, &img).map_err(|e| format!("{image}: {e}"))?;
    Ok(())
}
