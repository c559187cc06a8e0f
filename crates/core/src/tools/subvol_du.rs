//! Referenced / exclusive bytes per subvolume, as a full qgroup rescan computes them,
//! without a quota tree: the engine's recount (`qgroup/rescan.rs`, which a quota
//! rescan writes into the quota tree) offered to `ubtrfs subvolume du`.

pub use crate::qgroup::rescan::{compute_sharing, live_fs_roots, QgroupNumbers, Sharing};
pub use crate::qgroup::squota::owned_bytes;
