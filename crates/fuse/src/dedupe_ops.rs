//! `ubtrfs dedupe` on a mounted ubtrfs filesystem: the mount's own process runs the
//! engine's deduplication (`ubtrfs_core::tools::dedupe`) on its running transaction,
//! so the command works on a mounted directory as on an image (never a second
//! writer). FIDEDUPERANGE itself never reaches a FUSE server (the kernel's FUSE
//! module has no remap_file_range), hence a private ioctl, UBTRFS_IOC_DEDUPE, issued
//! on a directory of the mount with paths relative to it.
//!
//! Rules: CAP_SYS_ADMIN or the user who mounted (a whole-tree deduplication reads
//! every file below the paths, whoever owns them, as only root may with duperemove
//! on the kernel's mount); EROFS on a read-only mount. The transaction is held for the run: other writers wait, readers
//! of the page cache do not (contents never change).

use crate::abi::InHeader;
use crate::creds::Caller;
use crate::ops::{errno, Ops};
use crate::writer::Engine;
use ubtrfs_core::tools::dedupe::{DedupeOptions, DedupeReport};
use ubtrfs_core::Node;

/// Size of the argument: a 64-byte header, then NUL-terminated relative paths, an
/// empty one last.
pub(crate) const DEDUPE_ARG_BYTES: usize = 4096;

/// `_IOWR('u', 4, 4096)`.
pub(crate) const UBTRFS_IOC_DEDUPE: u32 =
    (3 << 30) | ((DEDUPE_ARG_BYTES as u32) << 16) | ((b'u' as u32) << 8) | 4;

/// In the header's flags: only find and compare.
const DEDUPE_DRY_RUN: u32 = 1;

/// Words of the answer (from byte 0), in [`DedupeReport`]'s field order.
const ANSWER_WORDS: usize = 9;

/// The relative paths of the argument (from byte 64 to the first empty one).
fn paths(input: &[u8]) -> Result<Vec<&[u8]>, i32> {
    let rest = input.get(64..).ok_or(errno::EINVAL)?;
    let mut out = Vec::new();
    for p in rest.split(|&b| b == 0) {
        if p.is_empty() {
            return Ok(out);
        }
        out.push(p);
    }
    // No terminating empty path: the argument was cut short.
    Err(errno::EINVAL)
}

fn encode(r: &DedupeReport) -> Vec<u8> {
    let words: [u64; ANSWER_WORDS] = [
        r.files,
        r.bytes_scanned,
        r.ranges,
        r.bytes_deduped,
        r.bytes_already_shared,
        r.bytes_differing,
        r.bytes_unreadable,
        r.data_used_before,
        r.data_used_after,
    ];
    let mut o = vec![0u8; DEDUPE_ARG_BYTES];
    for (i, w) in words.iter().enumerate() {
        o[8 * i..8 * i + 8].copy_from_slice(&w.to_ne_bytes());
    }
    o
}

impl Ops {
    /// UBTRFS_IOC_DEDUPE on directory `h.nodeid`.
    pub(crate) fn dedupe_ioctl(&self, h: &InHeader, input: &[u8]) -> Result<Vec<u8>, i32> {
        if !crate::subvol_ops::subvol_admin(h, &Caller::new(h)) {
            return Err(errno::EPERM);
        }
        let flags = input
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
            .ok_or(errno::EINVAL)?;
        let min_size_bytes = input
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
            .ok_or(errno::EINVAL)?;
        let rel = paths(input)?;
        let from = self.node(h.nodeid)?.node;
        let opts = DedupeOptions {
            min_size_bytes,
            dry_run: flags & DEDUPE_DRY_RUN != 0,
        };
        let Engine::ReadWrite(w) = &self.engine else {
            return Err(errno::EROFS);
        };
        let report = w.exclusive("dedupe", false, |t| {
            let starts = if rel.is_empty() {
                vec![from]
            } else {
                rel.iter()
                    .map(|p| crate::cp_ops::resolve_below(&t.fs, from, p))
                    .collect::<ubtrfs_core::Result<Vec<Node>>>()?
            };
            ubtrfs_core::tools::dedupe::dedupe(t, &starts, &opts, &mut |_, _| {})
        })?;
        Ok(encode(&report))
    }
}

/// The client side, for `ubtrfs dedupe` given a mounted directory.
pub mod client {
    use super::*;
    use std::fs::File;
    use std::io;

    /// Deduplicates below `paths` (relative to the directory `dir`; none: all of it)
    /// through the mount holding `dir`.
    pub fn dedupe(
        dir: &File,
        paths: &[&[u8]],
        min_size_bytes: u64,
        dry_run: bool,
    ) -> io::Result<DedupeReport> {
        let mut a = vec![0u8; DEDUPE_ARG_BYTES];
        let flags = if dry_run { DEDUPE_DRY_RUN } else { 0 };
        a[..4].copy_from_slice(&flags.to_ne_bytes());
        a[8..16].copy_from_slice(&min_size_bytes.to_ne_bytes());
        let mut at = 64;
        for p in paths {
            // Each path, its NUL, and room for the final empty one.
            if p.contains(&0) || at + p.len() + 2 > a.len() {
                return Err(io::Error::from_raw_os_error(errno::ENAMETOOLONG));
            }
            a[at..at + p.len()].copy_from_slice(p);
            at += p.len() + 1;
        }
        crate::subvol_ops::client::ubtrfs_ioctl(dir, UBTRFS_IOC_DEDUPE, &mut a, "duperemove")?;
        let w = |i: usize| crate::subvol_ops::client::answer_word(&a, i);
        Ok(DedupeReport {
            files: w(0),
            bytes_scanned: w(1),
            ranges: w(2),
            bytes_deduped: w(3),
            bytes_already_shared: w(4),
            bytes_differing: w(5),
            bytes_unreadable: w(6),
            data_used_before: w(7),
            data_used_after: w(8),
        })
    }
}
