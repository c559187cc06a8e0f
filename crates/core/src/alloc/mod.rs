//! Space allocation: block groups and their free-space indexes, device space for new
//! chunks, and the queue of delayed reference changes.
//!
//! Owns: which bytes are free, used or pinned, in memory. May use: `io`, `tree` (to
//! read block groups and the free-space tree), `format`, `error`. It never edits a tree:
//! the transaction writes what the allocator decided at commit.

pub(crate) mod block_group;
pub(crate) mod delayed_ref;
pub(crate) mod free_space_cache;
