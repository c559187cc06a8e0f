//! Test support: the one crate every integration test of ubtrfs takes its helpers
//! from.
//!
//! * [`fault_dev`]: a [`ubtrfs_core::Device`] that records every write, grouped in
//!   batches separated by `flush()`, and can produce the images a power cut would leave
//!   (after a flush, or inside a batch: prefix, reordered subset, torn write).
//! * [`rng`]: a tiny deterministic RNG (xorshift64*) for reproducible workloads.
//! * [`model`]: a model filesystem, a random workload and comparisons against the
//!   engine's read API (differential testing of the write engine).
//! * [`host`]: root detection (and CI's rule that no test skips), running commands and
//!   the `ubtrfs` binary, the kernel log, `btrfs check`, scratch image files.
//! * [`mount`]: kernel loop mounts, scratch btrfs mounts and `ubtrfs mount` (FUSE)
//!   servers whose guards always unmount and free their loop devices.
//! * [`golden`]: the kernel-made golden images and their manifests.
//! * [`damage`]: precise damage to an image (an item patched, deleted or re-keyed
//!   with the checksums made right again, a block or data byte changed, a
//!   superblock copy edited), for the tests of `ubtrfs check` against `btrfs check`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(unreachable_pub)]

pub mod damage;
pub mod fault_dev;
pub mod golden;
pub mod host;
pub mod model;
pub mod mount;
pub mod rng;
