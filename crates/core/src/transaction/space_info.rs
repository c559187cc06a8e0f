//! Space reservation before an operation (the kernel's space-info.c and block-rsv.c,
//! much simplified): an operation that could not finish for lack of space must be
//! refused with ENOSPC *before* it changes anything, because a transaction left half
//! applied can only be thrown away (the mount would lose everything since the last
//! commit).
//!
//! The kernel reserves bytes per operation and gives back what was not used; here one
//! writer holds the transaction at a time, so a check at the start of each operation
//! is enough: is there room, now, for the worst this operation can allocate, plus
//! what the commit itself will need (the extent tree, free-space tree and root tree
//! updates for every block this transaction dirtied), plus a global reserve that only
//! operations freeing space (unlink, rmdir, truncate, punch hole) may dip into, so a
//! full filesystem can always be emptied again. When the check fails, the running
//! transaction is committed first (space freed by it is pinned until then) and the
//! check repeated.

use crate::error::{Error, Result};
use crate::transaction::Trans;
use ubtrfs_format::consts::*;

/// A tree's height in the worst case (BTRFS_MAX_LEVEL).
const MAX_LEVELS: u64 = 8;

/// Floor of the global reserve: tiny filesystems still keep this much metadata for
/// deletions and the commit.
const GLOBAL_RESERVE_MIN_BYTES: u64 = 1 << 20;

/// Ceiling of the global reserve (the kernel's is 512 MiB).
const GLOBAL_RESERVE_MAX_BYTES: u64 = 512 << 20;

/// Floor of the page-cache writeback reserve ([`Reservation::page_cache`]).
const WRITEBACK_RESERVE_MIN_BYTES: u64 = 1 << 20;

/// Ceiling of the page-cache writeback reserve.
const WRITEBACK_RESERVE_MAX_BYTES: u64 = 64 << 20;

/// What one operation may need, asked for before it starts (the kernel's
/// btrfs_start_transaction(root, num_items) and btrfs_check_data_free_space).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reservation {
    /// Items the operation inserts, changes or deletes (each may CoW a path of
    /// every tree it touches, and split nodes on the way).
    pub items: u64,
    /// Data bytes it may allocate (a CoW rewrite needs them all; the first and last
    /// sector, rewritten whole, are added).
    pub data_bytes: u64,
    /// The operation frees space (unlink, rmdir, truncate, punch hole): it may use
    /// the global reserve, as the kernel's deletions do.
    pub frees_space: bool,
    /// The data is already accepted by a page cache: a FUSE write-back of pages a
    /// program stored into through a shared mmap. The kernel's btrfs reserves data
    /// space when such a page is first dirtied (btrfs_page_mkwrite, SIGBUS when
    /// full); the FUSE module never asks the server then, so refusing the write-back
    /// loses data the program believes written. Such writes may use a data reserve
    /// (a 64th of the filesystem, 1-64 MiB) that every other data allocation leaves
    /// alone, so they fail only when that is gone too.
    pub page_cache: bool,
}

impl Reservation {
    /// An operation touching `items` items and no data.
    pub fn items(items: u64) -> Reservation {
        Reservation {
            items,
            ..Reservation::default()
        }
    }

    /// An operation that frees space, touching `items` items.
    pub fn freeing(items: u64) -> Reservation {
        Reservation {
            items,
            data_bytes: 0,
            frees_space: true,
            page_cache: false,
        }
    }

    /// A data write of `len` bytes: its file extent items (one per 128 MiB), the
    /// checksum items, the inode.
    pub fn write(len: u64) -> Reservation {
        Reservation {
            items: 4 + len / (1 << 20),
            data_bytes: len,
            frees_space: false,
            page_cache: false,
        }
    }

    /// [`Reservation::write`] of data a page cache already holds (see
    /// [`Reservation::page_cache`]).
    pub fn page_cache_write(len: u64) -> Reservation {
        Reservation {
            page_cache: true,
            ..Reservation::write(len)
        }
    }
}

impl Trans {
    /// Metadata bytes one item may need: a CoW of a path in each tree it touches
    /// (the kernel's btrfs_calc_insert_metadata_size).
    fn item_metadata_bytes(&self) -> u64 {
        self.fs.info.nodesize as u64 * MAX_LEVELS * 2
    }

    /// The global reserve: a sixteenth of the metadata space, within bounds.
    fn global_reserve_bytes(&self) -> u64 {
        let meta_total: u64 = self
            .alloc
            .bgs
            .values()
            .filter(|b| b.flags & BLOCK_GROUP_METADATA != 0)
            .map(|b| b.length)
            .sum();
        (meta_total / 16).clamp(GLOBAL_RESERVE_MIN_BYTES, GLOBAL_RESERVE_MAX_BYTES)
    }

    /// Data space kept for page-cache write-back ([`Reservation::page_cache`]).
    fn writeback_reserve_bytes(&self) -> u64 {
        (self.fs.info.sb.total_bytes / 64)
            .clamp(WRITEBACK_RESERVE_MIN_BYTES, WRITEBACK_RESERVE_MAX_BYTES)
    }

    /// What the commit needs for the blocks dirtied so far: an extent-tree item per
    /// block (about a hundred fit a leaf), and paths of the root, extent, free-space
    /// and block-group trees.
    fn commit_reserve_bytes(&self) -> u64 {
        let ns = self.fs.info.nodesize as u64;
        let dirty = self.fs.info.dirty_blocks() as u64;
        (dirty / 64 + 4 * MAX_LEVELS) * ns
    }

    /// Whether `r` fits now: (metadata bytes short, data bytes short).
    fn shortfall(&self, r: &Reservation) -> (u64, u64) {
        let total = self.fs.info.sb.total_bytes;
        let mut meta_need = r.items * self.item_metadata_bytes() + self.commit_reserve_bytes();
        if !r.frees_space {
            meta_need += self.global_reserve_bytes();
        }
        let meta_have = self.alloc.available(total, BLOCK_GROUP_METADATA);
        let ss = self.fs.info.sectorsize as u64;
        let data_need = if r.data_bytes == 0 {
            0
        } else if r.page_cache || r.frees_space {
            // Deletions rewrite at most a partial sector: a full filesystem can
            // always be emptied.
            r.data_bytes.saturating_add(2 * ss).next_multiple_of(ss)
        } else {
            r.data_bytes.saturating_add(2 * ss).next_multiple_of(ss)
                + self.writeback_reserve_bytes()
        };
        let data_have = if data_need == 0 {
            0
        } else {
            self.alloc.available(total, BLOCK_GROUP_DATA)
        };
        (
            meta_need.saturating_sub(meta_have),
            data_need.saturating_sub(data_have),
        )
    }

    /// Data bytes allocations could take now (free in data block groups, pinned
    /// space excluded, plus what new data chunks could take).
    pub fn data_available_bytes(&self) -> u64 {
        self.alloc
            .available(self.fs.info.sb.total_bytes, BLOCK_GROUP_DATA)
    }

    /// Metadata bytes free in the metadata block groups there are now (pinned space
    /// excluded, no new chunk counted): where a tree log's blocks must come from.
    pub fn metadata_free_bytes(&self) -> u64 {
        self.alloc.free_in_groups(BLOCK_GROUP_METADATA)
    }

    /// Bytes allocated in data block groups (extents in use, as `btrfs filesystem df`
    /// counts "used" for data).
    pub fn data_used_bytes(&self) -> u64 {
        self.alloc
            .bgs
            .values()
            .filter(|bg| bg.flags & BLOCK_GROUP_DATA != 0)
            .map(|bg| bg.used)
            .sum()
    }

    /// Makes sure `r` can be carried out: commits the running transaction when that
    /// would help (it unpins what the transaction freed), and fails with
    /// [`Error::NoSpace`] — having changed nothing — when there is still not enough.
    pub fn reserve(&mut self, r: Reservation) -> Result<()> {
        let (meta, data) = self.shortfall(&r);
        if meta == 0 && data == 0 {
            return Ok(());
        }
        if !self.alloc.pinned.is_empty()
            || self.fs.info.dirty_blocks() > 0
            || self.commit_in_flight()
        {
            self.commit()?;
            let (meta, data) = self.shortfall(&r);
            if meta == 0 && data == 0 {
                return Ok(());
            }
        }
        let (meta, data) = self.shortfall(&r);
        Err(Error::NoSpace(if data > 0 {
            format!("{data} bytes of data space short")
        } else {
            format!("{meta} bytes of metadata space short")
        }))
    }
}
