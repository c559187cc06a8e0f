//! Fuzzing support (only with the `fuzzing` feature): a sparse in-memory device with a
//! compact encoding of images, and the harness shared by the cargo-fuzz target and the
//! regression test.

pub mod harness;
pub mod sparse_dev;
