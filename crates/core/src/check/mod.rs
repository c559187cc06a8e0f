//! `check`: a read-only consistency check of a whole filesystem, covering what
//! btrfs-progs' `btrfs check --readonly` covers (the kernel has no counterpart; the
//! names follow btrfs-progs' check/ directory).
//!
//! Owns: the rules a healthy filesystem obeys across trees, and the report of every
//! rule broken. May use: `format`, `tree` (block checks, iteration), `io` (raw copies,
//! the chunk map), `alloc` (the free-space tree reader). Nothing in the engine imports
//! it; it never writes.
//!
//! The phases, in btrfs check's order:
//! 1. superblocks: every copy on every device ([`supers`]);
//! 2. every tree block once, every copy of it ([`blocks`]): checksum, header, the tree
//!    checker, keys against the parent's range; the references each block and each
//!    file extent implies are collected as they would appear in the extent tree;
//! 3. the extent tree against those references, block group usage, the free-space tree
//!    ([`extents`]);
//! 4. chunks, device extents and devices ([`chunks`]);
//! 5. every subvolume tree, bottom-up, a subtree snapshots share worked out once:
//!    inodes against their names, directory sizes, nbytes, file extents, orphans
//!    ([`fs_roots`]);
//! 6. checksum items against file extents, and with `check_data_csum` the data itself
//!    ([`csums`]);
//! 7. ROOT_REF / ROOT_BACKREF / subvolume directory entries ([`roots`]);
//! 8. quota groups against a recount ([`qgroups`]).
//!
//! Memory: a few dozen bytes per tree block, per data extent reference and per name,
//! never the items themselves (see docs/design.md, "ubtrfs check").

mod blocks;
mod chunks;
mod csums;
mod extents;
mod fs_roots;
mod qgroups;
mod refstore;
mod roots;
mod spill;
mod supers;

use crate::error::Result;
use crate::fs::Filesystem;
use std::fmt;
use ubtrfs_format::key::Key;

/// What to check beyond the default (as btrfs check's options).
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Read every data sector and compare it with its checksum (every copy).
    pub check_data_csum: bool,
    /// Print the recounted quota groups (they are checked whenever quotas are on).
    pub qgroup_report: bool,
    /// Check each subvolume tree by reading its items in order, one tree after the
    /// other, instead of bottom-up with the subtrees snapshots share worked out once.
    /// Slower; the plain algorithm the default must agree with (tests compare them).
    pub item_by_item: bool,
    /// Memory for the references the extent tree must hold (0: 256 MiB) and for
    /// each list of data ranges (0: 64 MiB); beyond it they are sorted in runs in
    /// an unlinked temporary file ($TMPDIR) and merged back, so memory stays
    /// bounded however many extents there are.
    pub refs_mem_bytes_max: usize,
}

/// One broken rule: where (tree, block, key) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Short kebab-case name of the rule (stable: tests and scripts match on it).
    pub rule: &'static str,
    /// The tree concerned, if one is.
    pub tree: Option<u64>,
    /// The tree block (or extent, for extent rules) concerned, if one is.
    pub block: Option<u64>,
    /// The item key concerned, if one is.
    pub key: Option<Key>,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.rule)?;
        if let Some(t) = self.tree {
            write!(f, " tree {}", t as i64)?;
        }
        if let Some(b) = self.block {
            write!(f, " block {b}")?;
        }
        if let Some(k) = &self.key {
            write!(f, " key {k}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Totals, as btrfs check prints them at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckStats {
    /// Bytes of every extent in the extent tree (data and metadata).
    pub bytes_used: u64,
    /// Data bytes that have checksums.
    pub csum_bytes: u64,
    /// Bytes of tree blocks of every tree (log trees excepted).
    pub tree_bytes: u64,
    /// Bytes of tree blocks of subvolume trees.
    pub fs_tree_bytes: u64,
    /// Bytes of tree blocks of the extent tree.
    pub extent_tree_bytes: u64,
    /// Unused bytes inside tree blocks.
    pub btree_space_waste: u64,
    /// Sum of the on-disk sizes of the extents file extent items point to.
    pub data_bytes_allocated: u64,
    /// Sum of the file bytes file extent items cover.
    pub data_bytes_referenced: u64,
    /// Tree blocks visited.
    pub tree_blocks: u64,
    /// Data bytes read and compared with their checksums.
    pub data_bytes_verified: u64,
    /// Expected references that went to the temporary file (0: all fit in memory).
    pub refs_spilled: u64,
}

/// The outcome of a check.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// The problems found (at most [`PROBLEMS_KEPT_MAX`]; `problem_count` counts all).
    pub problems: Vec<Problem>,
    /// How many problems were found in all.
    pub problem_count: u64,
    /// Totals.
    pub stats: CheckStats,
    /// Phases that did not run, with why (e.g. quotas not enabled).
    pub skipped: Vec<(&'static str, String)>,
    /// Found, but not a problem: what a power cut during a commit leaves and the
    /// kernel rewrites at its next commit (a superblock copy stale or torn). btrfs
    /// check does not look at them at all.
    pub notes: Vec<String>,
}

impl CheckReport {
    /// No problem found.
    pub fn is_clean(&self) -> bool {
        self.problem_count == 0
    }
}

/// Problems kept in the report; more are counted only.
pub const PROBLEMS_KEPT_MAX: usize = 100_000;

/// The phases, in order, as [`check`] reports them to its progress callback.
pub const PHASES: [&str; 8] = [
    "checking log",
    "checking root items",
    "checking extents",
    "checking free space tree",
    "checking fs roots",
    "checking csums",
    "checking root refs",
    "checking quota groups",
];

/// Where a check is: the phase (index into [`PHASES`]) and a count of work done in it
/// (tree blocks, items or bytes, by phase).
pub type Progress<'a> = &'a mut dyn FnMut(usize, u64);

/// Gathers problems as the phases find them.
pub(crate) struct Findings {
    report: CheckReport,
}

impl Findings {
    pub(crate) fn new() -> Findings {
        Findings {
            report: CheckReport::default(),
        }
    }

    /// Takes in what another part of the check found (problems and notes; its
    /// statistics and skipped phases are not kept).
    pub(crate) fn absorb(&mut self, other: Findings) {
        let r = other.report;
        let dropped = r.problem_count - r.problems.len() as u64;
        for p in r.problems {
            self.add(p.rule, p.tree, p.block, p.key, p.message);
        }
        self.report.problem_count += dropped;
        self.report.notes.extend(r.notes);
    }

    /// Records a problem.
    pub(crate) fn add(
        &mut self,
        rule: &'static str,
        tree: Option<u64>,
        block: Option<u64>,
        key: Option<Key>,
        message: String,
    ) {
        self.report.problem_count += 1;
        if self.report.problems.len() < PROBLEMS_KEPT_MAX {
            self.report.problems.push(Problem {
                rule,
                tree,
                block,
                key,
                message,
            });
        }
    }

    pub(crate) fn stats(&mut self) -> &mut CheckStats {
        &mut self.report.stats
    }

    /// Records something found that is not a problem (see [`CheckReport::notes`]).
    pub(crate) fn note(&mut self, message: String) {
        self.report.notes.push(message);
    }

    fn skip(&mut self, phase: &'static str, why: String) {
        self.report.skipped.push((phase, why));
    }
}

/// Checks the whole filesystem, read-only. `Err` only when the check could not run at
/// all; everything wrong with the image is a [`Problem`] in the report.
pub fn check(fs: &Filesystem, opts: &CheckOptions, progress: Progress<'_>) -> Result<CheckReport> {
    let mut f = Findings::new();
    supers::check_supers(&fs.info, &mut f);
    // Phase 1: the log, structure only (its blocks have no extent items).
    progress(0, 0);
    let log = blocks::walk_log(&fs.info, &mut f);
    if !log {
        f.skip(PHASES[0], "none written".into());
    }
    // Phase 2: every tree block; the references the extent tree must hold.
    progress(1, 0);
    let (refs_mem, ranges_mem) = match opts.refs_mem_bytes_max {
        0 => (
            refstore::REFS_MEM_BYTES_DEFAULT,
            refstore::RANGES_MEM_BYTES_DEFAULT,
        ),
        n => (n, n),
    };
    let walk = blocks::walk_all(&fs.info, refs_mem, &mut f, progress)?;
    // Phase 3: the extent tree against them; block groups; then chunks and devices.
    progress(2, 0);
    let ext = extents::check_extents(&fs.info, &walk, ranges_mem, &mut f, progress)?;
    walk.refs.read_error()?;
    chunks::check_chunks(&fs.info, &ext, &mut f);
    progress(3, 0);
    extents::check_free_space(&fs.info, &ext, &mut f);
    // Phase 5: subvolume trees, bottom-up.
    progress(4, 0);
    let fsr = fs_roots::check_fs_roots(fs, &walk, opts.item_by_item, ranges_mem, &mut f, progress)?;
    // Phase 6: checksums.
    progress(5, 0);
    csums::check_csums(&fs.info, opts, &ext, &fsr, ranges_mem, &mut f, progress)?;
    // Phase 7: subvolume links.
    progress(6, 0);
    roots::check_root_refs(&walk, &fsr, &mut f);
    // Phase 8: quotas.
    progress(7, 0);
    // As btrfs check, quotas are checked whenever they are enabled.
    if let Some(why) = qgroups::check_qgroups(fs, &walk, &mut f) {
        f.skip(PHASES[7], why);
    }
    walk.refs.read_error()?;
    f.stats().refs_spilled = walk.refs.spilled();
    Ok(f.report)
}
