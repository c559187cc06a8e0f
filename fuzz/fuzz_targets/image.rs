//! Raw bytes -> sparse device -> superblock -> chunk map -> tree walk -> file reads ->
//! dump-tree. The body lives in `ubtrfs_core::fuzzing::harness` so that
//! `crates/core/tests/fuzz_regress.rs` replays the same code on stable `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ubtrfs_core::fuzzing::harness::fuzz_one(data);
});
