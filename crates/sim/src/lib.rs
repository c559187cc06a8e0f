//! Test support for crash-consistency testing of ubtrfs.
//!
//! * [`fault_dev`]: a [`ubtrfs_core::Device`] that records every write, grouped in
//!   batches separated by `flush()`, and can produce the images a power cut would leave
//!   (after a flush, or inside a batch: prefix, reordered subset, torn write).
//! * [`rng`]: a tiny deterministic RNG (xorshift64*) for reproducible workloads.
//! * [`model`]: a model filesystem, a random workload and comparisons against the
//!   engine's read API (differential testing of the write engine).

#![forbid(unsafe_code)]

pub mod fault_dev;
pub mod model;
pub mod rng;
