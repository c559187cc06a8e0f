//! Relocation and balance: moving every extent out of a block group and removing
//! the group (the kernel's relocation.c), and balance's chunk selection, BALANCE
//! item and loop (volumes.c).
//!
//! Owns: relocating one block group (`relocate.rs`), balance (`balance.rs`) and
//! shrinking a device over its chunks (`shrink.rs`).
//! May use: `transaction` (allocation, delayed refs, commit), `subvol` (dead
//! subvolumes are dropped before a relocation walks the trees), `tree`, `io`,
//! `alloc`. Unlike the kernel it never creates relocation trees: one commit per
//! group rewrites every block above what moves (docs/relocation.md, design (b)).
//! A balance the kernel left half done (relocation trees in the root tree) is
//! recovered when a writer opens the filesystem (`recover.rs`): the relocation
//! trees are dropped and the BALANCE item kept for a resume.

pub(crate) mod balance;
pub(crate) mod recover;
pub(crate) mod relocate;
pub(crate) mod shrink;
