//! Tools built on the engine, as btrfs-progs builds its commands on kernel-shared/:
//! the dump-super/dump-tree printer, fiemap, find-root, cp, dedupe, `filesystem du`, `filesystem df` (space_info), statfs (`df`, `filesystem usage`), `subvolume du`, `subvolume show`, scrub and mkfs.
//!
//! Architecture invariant: nothing outside `tools/` imports from it; the engine does not
//! know its tools exist.

pub mod cp;
pub mod dedupe;
pub mod du;
pub mod fiemap;
pub mod find_root;
pub mod mkfs;
pub mod print_tree;
pub mod scrub;
pub mod space_info;
pub mod statfs;
pub mod subvol_du;
pub mod subvol_show;
pub mod usage;
