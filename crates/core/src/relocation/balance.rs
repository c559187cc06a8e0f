//! Balance (the kernel's btrfs_balance and __btrfs_balance in volumes.c): which
//! chunks the filters select, the BALANCE item that records a running balance
//! in the root tree (so the kernel, or `balance resume`, continues an
//! interrupted one), and the loop relocating the selected chunks, highest
//! logical address first, one commit each.

use super::relocate::RelocStats;
use crate::error::{Error, Result};
use crate::io::volumes::MapEntry;
use crate::transaction::Trans;
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

/// Balance item flags and the type bits of a request (BTRFS_BALANCE_*).
pub mod flags {
    /// Data chunks.
    pub const DATA: u64 = 1 << 0;
    /// System chunks.
    pub const SYSTEM: u64 = 1 << 1;
    /// Metadata chunks.
    pub const METADATA: u64 = 1 << 2;
    /// Allow reducing metadata redundancy.
    pub const FORCE: u64 = 1 << 3;
    /// Set in memory on resume.
    pub const RESUME: u64 = 1 << 4;
}

/// Filter flags of one type's arguments (BTRFS_BALANCE_ARGS_*).
pub mod args {
    /// `profiles=`.
    pub const PROFILES: u64 = 1 << 0;
    /// `usage=N`.
    pub const USAGE: u64 = 1 << 1;
    /// `devid=`.
    pub const DEVID: u64 = 1 << 2;
    /// `drange=`.
    pub const DRANGE: u64 = 1 << 3;
    /// `vrange=`.
    pub const VRANGE: u64 = 1 << 4;
    /// `limit=N`.
    pub const LIMIT: u64 = 1 << 5;
    /// `limit=MIN..MAX`.
    pub const LIMIT_RANGE: u64 = 1 << 6;
    /// `stripes=MIN..MAX`.
    pub const STRIPES_RANGE: u64 = 1 << 7;
    /// `convert=`.
    pub const CONVERT: u64 = 1 << 8;
    /// `soft`.
    pub const SOFT: u64 = 1 << 9;
    /// `usage=MIN..MAX`.
    pub const USAGE_RANGE: u64 = 1 << 10;
}

/// The profile bit balance uses for SINGLE (BTRFS_AVAIL_ALLOC_BIT_SINGLE).
pub const AVAIL_ALLOC_BIT_SINGLE: u64 = 1 << 48;

/// Size of struct btrfs_disk_balance_args.
pub const BALANCE_ARGS_SIZE: usize = 136;
/// Size of struct btrfs_balance_item.
pub const BALANCE_ITEM_SIZE: usize = 448;

/// One chunk type's filters (struct btrfs_balance_args). `usage` and `limit`
/// are unions: one u64, or a u32 minimum (low half) and maximum (high half).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BalanceArgs {
    /// Profiles to select (SINGLE as [`AVAIL_ALLOC_BIT_SINGLE`]).
    pub profiles: u64,
    /// `usage` percent, or usage_min | usage_max << 32.
    pub usage: u64,
    /// Device a stripe must be on.
    pub devid: u64,
    /// Physical range start on `devid`.
    pub pstart: u64,
    /// Physical range end (exclusive).
    pub pend: u64,
    /// Logical range start.
    pub vstart: u64,
    /// Logical range end (exclusive).
    pub vend: u64,
    /// Profile to convert to (SINGLE as [`AVAIL_ALLOC_BIT_SINGLE`]).
    pub target: u64,
    /// Which filters apply ([`args`]).
    pub flags: u64,
    /// `limit`, or limit_min | limit_max << 32.
    pub limit: u64,
    /// Fewest stripes.
    pub stripes_min: u32,
    /// Most stripes.
    pub stripes_max: u32,
}

fn le64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

impl BalanceArgs {
    /// The low half of `usage` (usage_min).
    pub fn usage_min(&self) -> u32 {
        self.usage as u32
    }
    /// The high half of `usage` (usage_max).
    pub fn usage_max(&self) -> u32 {
        (self.usage >> 32) as u32
    }
    /// The low half of `limit` (limit_min).
    pub fn limit_min(&self) -> u32 {
        self.limit as u32
    }
    /// The high half of `limit` (limit_max).
    pub fn limit_max(&self) -> u32 {
        (self.limit >> 32) as u32
    }

    /// The 136 on-disk bytes.
    pub fn to_bytes(&self) -> [u8; BALANCE_ARGS_SIZE] {
        let mut b = [0u8; BALANCE_ARGS_SIZE];
        for (off, v) in [
            (0, self.profiles),
            (8, self.usage),
            (16, self.devid),
            (24, self.pstart),
            (32, self.pend),
            (40, self.vstart),
            (48, self.vend),
            (56, self.target),
            (64, self.flags),
            (72, self.limit),
        ] {
            b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[80..84].copy_from_slice(&self.stripes_min.to_le_bytes());
        b[84..88].copy_from_slice(&self.stripes_max.to_le_bytes());
        b
    }

    /// Decodes 136 on-disk bytes.
    pub fn parse(b: &[u8]) -> Result<BalanceArgs> {
        if b.len() < BALANCE_ARGS_SIZE {
            return Err(Error::corrupt(format!(
                "balance args: {} bytes, {BALANCE_ARGS_SIZE} expected",
                b.len()
            )));
        }
        let u32_at = |off: usize| u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
        Ok(BalanceArgs {
            profiles: le64_at(b, 0),
            usage: le64_at(b, 8),
            devid: le64_at(b, 16),
            pstart: le64_at(b, 24),
            pend: le64_at(b, 32),
            vstart: le64_at(b, 40),
            vend: le64_at(b, 48),
            target: le64_at(b, 56),
            flags: le64_at(b, 64),
            limit: le64_at(b, 72),
            stripes_min: u32_at(80),
            stripes_max: u32_at(84),
        })
    }

    /// Parses btrfs-progs' filter syntax (`usage=50,limit=2..4,convert=dup,soft`,
    /// the text after `-d`, `-m` or `-s`), setting the flags as progs does
    /// (cmds/balance.c parse_filters). Errors name the bad filter.
    pub fn parse_filters<'a>(text: &'a str) -> std::result::Result<BalanceArgs, String> {
        let mut a = BalanceArgs::default();
        for f in text.split(',').filter(|f| !f.is_empty()) {
            let (name, value) = match f.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (f, None),
            };
            let missing = || format!("the {name} filter requires an argument");
            let need = |v: Option<&'a str>| -> std::result::Result<&'a str, String> {
                v.ok_or_else(missing)
            };
            match name {
                "profiles" => {
                    for p in need(value)?.split('|') {
                        a.profiles |= parse_profile(p)?;
                    }
                    a.flags |= args::PROFILES;
                }
                "usage" => {
                    let v = need(value)?;
                    if let Ok(n) = v.parse::<u64>() {
                        if n > 100 {
                            return Err(format!("invalid usage argument: {v}"));
                        }
                        a.usage = n;
                        a.flags &= !args::USAGE_RANGE;
                    } else {
                        let (lo, hi) = parse_range_u32(v)?;
                        a.usage = lo as u64 | (hi as u64) << 32;
                        a.flags &= !args::USAGE;
                        a.flags |= args::USAGE_RANGE;
                    }
                    // progs sets USAGE for a range too (the kernel then applies
                    // the single-value test to the union first).
                    a.flags |= args::USAGE;
                }
                "devid" => {
                    let v = need(value)?;
                    a.devid = v
                        .parse::<u64>()
                        .ok()
                        .filter(|d| *d != 0)
                        .ok_or_else(|| format!("invalid devid argument: {v}"))?;
                    a.flags |= args::DEVID;
                }
                "drange" => {
                    (a.pstart, a.pend) = parse_range_strict(need(value)?)?;
                    a.flags |= args::DRANGE;
                }
                "vrange" => {
                    (a.vstart, a.vend) = parse_range_strict(need(value)?)?;
                    a.flags |= args::VRANGE;
                }
                "convert" => {
                    a.target = parse_profile(need(value)?)?;
                    a.flags |= args::CONVERT;
                }
                "soft" => a.flags |= args::SOFT,
                "limit" => {
                    let v = need(value)?;
                    if let Ok(n) = v.parse::<u64>() {
                        a.limit = n;
                        a.flags &= !args::LIMIT_RANGE;
                        a.flags |= args::LIMIT;
                    } else {
                        let (lo, hi) = parse_range_u32(v)?;
                        a.limit = lo as u64 | (hi as u64) << 32;
                        a.flags &= !args::LIMIT;
                        a.flags |= args::LIMIT_RANGE;
                    }
                }
                "stripes" => {
                    (a.stripes_min, a.stripes_max) = parse_range_u32(need(value)?)?;
                    a.flags |= args::STRIPES_RANGE;
                }
                _ => return Err(format!("unrecognized filter: {name}")),
            }
        }
        if a.flags & args::SOFT != 0 && a.flags & args::CONVERT == 0 {
            return Err("'soft' option can be used only when converting profiles".into());
        }
        if a.flags & args::DRANGE != 0 && a.flags & args::DEVID == 0 {
            return Err("drange filter must be used with devid filter".into());
        }
        Ok(a)
    }
}

/// A profile name as progs reads it (case-insensitive); `single` is
/// [`AVAIL_ALLOC_BIT_SINGLE`].
pub fn parse_profile(p: &str) -> std::result::Result<u64, String> {
    Ok(match p.to_ascii_lowercase().as_str() {
        "single" => AVAIL_ALLOC_BIT_SINGLE,
        "dup" => BLOCK_GROUP_DUP,
        "raid0" => BLOCK_GROUP_RAID0,
        "raid1" => BLOCK_GROUP_RAID1,
        "raid1c3" => BLOCK_GROUP_RAID1C3,
        "raid1c4" => BLOCK_GROUP_RAID1C4,
        "raid10" => BLOCK_GROUP_RAID10,
        "raid5" => BLOCK_GROUP_RAID5,
        "raid6" => BLOCK_GROUP_RAID6,
        _ => return Err(format!("unknown profile: {p}")),
    })
}

/// `a..b`, `a..` (to `open_end`) or `..b` (from 0), as progs' parse_range_*
/// read them; `strict` also wants a < b (progs' parse_range_strict, for drange and
/// vrange), else a <= b.
fn parse_range<T: std::str::FromStr + PartialOrd + Default>(
    v: &str,
    open_end: T,
    strict: bool,
) -> std::result::Result<(T, T), String> {
    let bad = || format!("invalid range: {v}");
    let (lo, hi) = v.split_once("..").ok_or_else(bad)?;
    if lo.is_empty() && hi.is_empty() {
        return Err(bad());
    }
    let lo: T = if lo.is_empty() {
        T::default()
    } else {
        lo.parse().map_err(|_| bad())?
    };
    let hi: T = if hi.is_empty() {
        open_end
    } else {
        hi.parse().map_err(|_| bad())?
    };
    if lo > hi || (strict && lo >= hi) {
        return Err(bad());
    }
    Ok((lo, hi))
}

fn parse_range_u32(v: &str) -> std::result::Result<(u32, u32), String> {
    parse_range(v, u32::MAX, false)
}

fn parse_range_strict(v: &str) -> std::result::Result<(u64, u64), String> {
    parse_range(v, u64::MAX, true)
}

/// A balance: which types, and each type's filters (struct btrfs_balance_item).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BalanceRequest {
    /// [`flags`]: types and FORCE.
    pub flags: u64,
    /// Data chunk filters.
    pub data: BalanceArgs,
    /// Metadata chunk filters.
    pub meta: BalanceArgs,
    /// System chunk filters.
    pub sys: BalanceArgs,
}

impl BalanceRequest {
    /// The 448-byte BALANCE item.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; BALANCE_ITEM_SIZE];
        b[0..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..144].copy_from_slice(&self.data.to_bytes());
        b[144..280].copy_from_slice(&self.meta.to_bytes());
        b[280..416].copy_from_slice(&self.sys.to_bytes());
        b
    }

    /// Decodes a BALANCE item.
    pub fn parse(b: &[u8]) -> Result<BalanceRequest> {
        if b.len() < BALANCE_ITEM_SIZE {
            return Err(Error::corrupt(format!(
                "balance item: {} bytes, {BALANCE_ITEM_SIZE} expected",
                b.len()
            )));
        }
        Ok(BalanceRequest {
            flags: le64_at(b, 0),
            data: BalanceArgs::parse(&b[8..144])?,
            meta: BalanceArgs::parse(&b[144..280])?,
            sys: BalanceArgs::parse(&b[280..416])?,
        })
    }

    /// The request a resume runs (the kernel's update_balance_args): converting
    /// types become soft (chunks already converted are skipped); types without a
    /// usage filter and not converting get usage=90 (chunks already balanced are
    /// presumably full).
    pub fn for_resume(&self) -> BalanceRequest {
        let mut r = *self;
        for (bit, a) in [
            (flags::DATA, &mut r.data),
            (flags::METADATA, &mut r.meta),
            (flags::SYSTEM, &mut r.sys),
        ] {
            if self.flags & bit == 0 {
                continue;
            }
            if a.flags & args::CONVERT != 0 {
                a.flags |= args::SOFT;
            } else if a.flags & (args::USAGE | args::USAGE_RANGE) == 0 {
                a.flags |= args::USAGE;
                a.usage = 90;
            }
        }
        r.flags |= flags::RESUME;
        r
    }

    fn args_for(&mut self, ty: u64) -> &mut BalanceArgs {
        if ty & BLOCK_GROUP_DATA != 0 {
            &mut self.data
        } else if ty & BLOCK_GROUP_SYSTEM != 0 {
            &mut self.sys
        } else {
            &mut self.meta
        }
    }

    /// The request bit of a chunk type (a mixed group counts as data).
    fn type_bit(ty: u64) -> u64 {
        if ty & BLOCK_GROUP_DATA != 0 {
            flags::DATA
        } else if ty & BLOCK_GROUP_SYSTEM != 0 {
            flags::SYSTEM
        } else {
            flags::METADATA
        }
    }
}

/// Counters of a balance (struct btrfs_balance_progress).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BalanceProgress {
    /// Chunks the filters select (the counting pass).
    pub expected: u64,
    /// Chunks looked at by the relocating pass (every chunk, selected or not).
    pub considered: u64,
    /// Chunks relocated.
    pub completed: u64,
}

/// How a balance ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BalanceEnd {
    /// Every selected chunk was relocated; the BALANCE item is gone.
    Finished,
    /// Stopped on request between chunks; the BALANCE item stays (resume or
    /// cancel later; the kernel resumes it at mount).
    Paused,
    /// Every selected chunk was looked at, this many could not be moved for lack
    /// of room elsewhere (the kernel's "N enospc errors during balance"); the
    /// others were relocated, and the BALANCE item is gone.
    NoSpace(u64),
}

/// Chunk profile as balance filters see it (SINGLE has its own bit).
fn extended_profile(ty: u64) -> u64 {
    let p = ty & BLOCK_GROUP_PROFILE_MASK;
    if p == 0 {
        AVAIL_ALLOC_BIT_SINGLE
    } else {
        p
    }
}

/// Stripes holding distinct data (the kernel's calc_data_stripes).
fn data_stripes(ty: u64, num_stripes: u64) -> u64 {
    let n = match ty & BLOCK_GROUP_PROFILE_MASK {
        BLOCK_GROUP_DUP | BLOCK_GROUP_RAID1 | BLOCK_GROUP_RAID10 => num_stripes / 2,
        BLOCK_GROUP_RAID1C3 => num_stripes / 3,
        BLOCK_GROUP_RAID1C4 => num_stripes / 4,
        BLOCK_GROUP_RAID5 => num_stripes.saturating_sub(1),
        BLOCK_GROUP_RAID6 => num_stripes.saturating_sub(2),
        _ => num_stripes,
    };
    n.max(1)
}

fn mult_perc(num: u64, percent: u64) -> u64 {
    (num as u128 * percent as u128 / 100) as u64
}

/// The kernel's should_balance_chunk after the type check, in its order;
/// counts `limit` down for a selected chunk.
fn chunk_selected(a: &mut BalanceArgs, e: &MapEntry, used: u64) -> bool {
    let f = a.flags;
    if f & args::PROFILES != 0 && a.profiles & extended_profile(e.ty) == 0 {
        return false;
    }
    if f & args::USAGE != 0 {
        let thresh = if a.usage_min() == 0 {
            1
        } else if a.usage > 100 {
            e.length
        } else {
            mult_perc(e.length, a.usage)
        };
        if used >= thresh {
            return false;
        }
    }
    if f & args::USAGE_RANGE != 0 {
        let lo = if a.usage_min() == 0 {
            0
        } else {
            mult_perc(e.length, a.usage_min() as u64)
        };
        let hi = match a.usage_max() {
            0 => 1,
            m if m > 100 => e.length,
            m => mult_perc(e.length, m as u64),
        };
        if !(lo <= used && used < hi) {
            return false;
        }
    }
    if f & args::DEVID != 0 && !e.stripes.iter().any(|s| s.devid == a.devid) {
        return false;
    }
    if f & args::DRANGE != 0 && f & args::DEVID != 0 {
        let stripe_len = e.length / data_stripes(e.ty, e.stripes.len() as u64);
        let hit = e.stripes.iter().any(|s| {
            s.devid == a.devid && s.physical < a.pend && s.physical + stripe_len > a.pstart
        });
        if !hit {
            return false;
        }
    }
    if f & args::VRANGE != 0 && !(e.start < a.vend && e.start + e.length > a.vstart) {
        return false;
    }
    if f & args::STRIPES_RANGE != 0 {
        let n = e.stripes.len() as u64;
        if n < a.stripes_min as u64 || n > a.stripes_max as u64 {
            return false;
        }
    }
    if f & args::SOFT != 0 && f & args::CONVERT != 0 && extended_profile(e.ty) == a.target {
        return false;
    }
    if f & args::LIMIT != 0 {
        if a.limit == 0 {
            return false;
        }
        a.limit -= 1;
    } else if f & args::LIMIT_RANGE != 0 {
        let max = a.limit_max();
        if max == 0 {
            return false;
        }
        a.limit = (a.limit & 0xffff_ffff) | ((max as u64 - 1) << 32);
    }
    true
}

/// The BALANCE item's key in the root tree.
fn balance_key() -> Key {
    Key::new(BALANCE_OBJECTID, TEMPORARY_ITEM_KEY, 0)
}

impl Trans {
    /// The paused or interrupted balance recorded in the root tree, if any.
    pub fn balance_item(&self) -> Result<Option<BalanceRequest>> {
        let rt = self.fs.info.root_tree_ptr();
        match crate::tree::ctree::lookup_exact(&self.fs.info, &rt, &balance_key())? {
            Some(item) => Ok(Some(BalanceRequest::parse(item.data())?)),
            None => Ok(None),
        }
    }

    /// Cancels a paused balance: removes its BALANCE item and commits.
    pub fn balance_cancel(&mut self) -> Result<()> {
        if self.balance_item()?.is_none() {
            return Err(Error::NotFound("a paused balance".into()));
        }
        self.delete_item(ROOT_TREE_OBJECTID, &balance_key())?;
        self.commit()
    }

    /// Checks a request as btrfs_balance does: convert targets must be one
    /// profile new chunks can be made in with this many devices; lowering
    /// metadata or system redundancy needs FORCE.
    fn validate_balance(&self, req: &BalanceRequest) -> Result<()> {
        let ndev = self.alloc.dev_space.len() as u64;
        for (bit, a, what) in [
            (flags::DATA, &req.data, "data"),
            (flags::METADATA, &req.meta, "metadata"),
            (flags::SYSTEM, &req.sys, "system"),
        ] {
            if req.flags & bit == 0 || a.flags & args::CONVERT == 0 {
                continue;
            }
            let t = a.target;
            let profile = if t == AVAIL_ALLOC_BIT_SINGLE { 0 } else { t };
            if t.count_ones() != 1 || profile & !BLOCK_GROUP_PROFILE_MASK != 0 {
                return Err(Error::Invalid(format!(
                    "balance: invalid convert {what} profile"
                )));
            }
            crate::alloc::block_group::profile_copies(profile).ok_or_else(|| {
                Error::Unsupported(format!(
                    "converting {what} to {} (ubtrfs makes single, dup, raid0, raid1, raid10, raid1c3 and raid1c4 chunks)",
                    profile_name(profile)
                ))
            })?;
            if crate::alloc::block_group::raid(profile).devs_min as u64 > ndev {
                return Err(Error::Invalid(format!(
                    "balance: invalid convert {what} profile {}: {ndev} device(s)",
                    profile_name(profile)
                )));
            }
        }
        let redundant = |p: u64| {
            crate::alloc::block_group::profile_copies(p).unwrap_or(1) > 1
                || p & (BLOCK_GROUP_RAID5 | BLOCK_GROUP_RAID6 | BLOCK_GROUP_RAID10) != 0
        };
        let current_redundant = self
            .alloc
            .bgs
            .values()
            .filter(|b| b.flags & (BLOCK_GROUP_METADATA | BLOCK_GROUP_SYSTEM) != 0)
            .any(|b| redundant(b.flags & BLOCK_GROUP_PROFILE_MASK));
        for (bit, a) in [(flags::METADATA, &req.meta), (flags::SYSTEM, &req.sys)] {
            if req.flags & bit != 0
                && a.flags & args::CONVERT != 0
                && current_redundant
                && !redundant(a.target & BLOCK_GROUP_PROFILE_MASK)
                && req.flags & flags::FORCE == 0
            {
                return Err(Error::Invalid(
                    "balance: reduces metadata redundancy, use --force if you want this".into(),
                ));
            }
        }
        Ok(())
    }

    /// Runs a balance to the end (or until `stop` says so between chunks): the
    /// BALANCE item is written and committed first, then every selected chunk is
    /// relocated, highest logical address first, each in its own commit, then the
    /// item is deleted. `progress` hears after every chunk looked at.
    pub fn balance(
        &mut self,
        req: &BalanceRequest,
        progress: &mut dyn FnMut(&BalanceProgress, Option<&RelocStats>),
        stop: &dyn Fn() -> bool,
    ) -> Result<(BalanceEnd, BalanceProgress)> {
        let mut run = self.balance_start(req)?;
        let res = (|| loop {
            if stop() {
                return Ok(BalanceEnd::Paused);
            }
            match self.balance_step(&mut run)? {
                BalanceStep::Looked(stats) => progress(&run.progress, stats.as_ref()),
                BalanceStep::Done(end) => return Ok(end),
            }
        })();
        let end = self.balance_finish(&run, res)?;
        Ok((end, run.progress))
    }

    /// Starts a balance that the caller drives a chunk at a time with
    /// [`Trans::balance_step`] (a mount lets other requests in between), then ends
    /// with [`Trans::balance_finish`]: checks the request, writes and commits the
    /// BALANCE item, counts the chunks the filters select and, converting, makes
    /// every new allocation take the target profile.
    pub fn balance_start(&mut self, req: &BalanceRequest) -> Result<BalanceRun> {
        self.validate_balance(req)?;
        let mut item = *req;
        item.flags &= !flags::RESUME;
        match self.balance_item()? {
            Some(_) => self.replace_item(ROOT_TREE_OBJECTID, &balance_key(), &item.to_bytes())?,
            None => self.insert_item(ROOT_TREE_OBJECTID, &balance_key(), &item.to_bytes())?,
        }
        self.commit()?;
        let mut chunks: Vec<MapEntry> = self.fs.info.chunk_map.iter().cloned().collect();
        chunks.sort_by_key(|e| std::cmp::Reverse(e.start));
        // Counting pass.
        let mut counting = *req;
        let mut run = BalanceRun {
            req: *req,
            selecting: *req,
            chunks,
            next: 0,
            per_type: std::collections::HashMap::new(),
            enospc: 0,
            progress: BalanceProgress::default(),
        };
        for e in &run.chunks {
            let bit = BalanceRequest::type_bit(e.ty);
            if req.flags & bit == 0 {
                continue;
            }
            let Some(used) = self.alloc.bgs.get(&e.start).map(|b| b.used) else {
                continue;
            };
            if chunk_selected(counting.args_for(e.ty), e, used) {
                run.progress.expected += 1;
                *run.per_type.entry(bit).or_default() += 1;
            }
        }
        // Converting: new chunks and every allocation take the target profile.
        for (bit, ty, a) in [
            (flags::DATA, BLOCK_GROUP_DATA, &req.data),
            (flags::METADATA, BLOCK_GROUP_METADATA, &req.meta),
            (flags::SYSTEM, BLOCK_GROUP_SYSTEM, &req.sys),
        ] {
            if req.flags & bit != 0 && a.flags & args::CONVERT != 0 {
                let p = if a.target == AVAIL_ALLOC_BIT_SINGLE {
                    0
                } else {
                    a.target
                };
                self.alloc.convert_to.insert(ty, p);
                self.alloc.profiles.insert(ty, p);
            }
        }
        Ok(run)
    }

    /// Looks at the next chunk of a balance and relocates it when the filters
    /// select it (its own commits); a chunk that cannot move for lack of room is
    /// counted and skipped, as the kernel's __btrfs_balance does.
    pub fn balance_step(&mut self, run: &mut BalanceRun) -> Result<BalanceStep> {
        let Some(e) = run.chunks.get(run.next).cloned() else {
            return Ok(BalanceStep::Done(if run.enospc > 0 {
                BalanceEnd::NoSpace(run.enospc)
            } else {
                BalanceEnd::Finished
            }));
        };
        run.next += 1;
        run.progress.considered += 1;
        let bit = BalanceRequest::type_bit(e.ty);
        // Gone since the start (relocated by the same balance's convert, or the
        // group emptied and removed).
        let Some(used) = self.alloc.bgs.get(&e.start).map(|b| b.used) else {
            return Ok(BalanceStep::Looked(None));
        };
        let a = run.selecting.args_for(e.ty);
        let limit_min = (a.flags & args::LIMIT_RANGE != 0).then(|| a.limit_min());
        if run.req.flags & bit == 0 || !chunk_selected(a, &e, used) {
            return Ok(BalanceStep::Looked(None));
        }
        if limit_min.is_some_and(|m| run.per_type.get(&bit).copied().unwrap_or(0) < m) {
            return Ok(BalanceStep::Looked(None));
        }
        let stats = match self.relocate_block_group(e.start) {
            Ok(s) => s,
            Err(Error::NoSpace(_)) if self.dirty_bytes() == 0 => {
                run.enospc += 1;
                return Ok(BalanceStep::Looked(None));
            }
            Err(e) => return Err(e),
        };
        run.progress.completed += 1;
        Ok(BalanceStep::Looked(Some(stats)))
    }

    /// Ends a balance with how its steps went (`res`): allocation stops
    /// converting, and unless it was paused (or failed) the BALANCE item goes, in
    /// its own commit.
    pub fn balance_finish(
        &mut self,
        _run: &BalanceRun,
        res: Result<BalanceEnd>,
    ) -> Result<BalanceEnd> {
        self.alloc.convert_to.clear();
        self.alloc.profiles.clear();
        let end = res?;
        if matches!(end, BalanceEnd::Finished | BalanceEnd::NoSpace(_)) {
            self.delete_item(ROOT_TREE_OBJECTID, &balance_key())?;
            self.commit()?;
        }
        Ok(end)
    }
}

/// A balance under way ([`Trans::balance_start`]).
#[derive(Debug)]
pub struct BalanceRun {
    req: BalanceRequest,
    /// The request whose `limit` counters the relocating pass uses up.
    selecting: BalanceRequest,
    /// Every chunk at the start, highest address first.
    chunks: Vec<MapEntry>,
    next: usize,
    /// Chunks selected per type by the counting pass (for `limit=min..`).
    per_type: std::collections::HashMap<u64, u32>,
    enospc: u64,
    /// The counters so far.
    pub progress: BalanceProgress,
}

/// What one [`Trans::balance_step`] did.
#[derive(Debug)]
pub enum BalanceStep {
    /// Looked at a chunk; relocated it when there are stats.
    Looked(Option<RelocStats>),
    /// No chunk left: how the balance ends.
    Done(BalanceEnd),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_as_progs_sets_them() {
        let a = BalanceArgs::parse_filters("usage=50,limit=2").expect("parse");
        assert_eq!(a.flags, args::USAGE | args::LIMIT);
        assert_eq!((a.usage, a.limit), (50, 2));
        let a = BalanceArgs::parse_filters("usage=10..80").expect("parse");
        assert_eq!(a.flags, args::USAGE | args::USAGE_RANGE);
        assert_eq!((a.usage_min(), a.usage_max()), (10, 80));
        let a = BalanceArgs::parse_filters("convert=single,soft").expect("parse");
        assert_eq!(a.target, AVAIL_ALLOC_BIT_SINGLE);
        assert_eq!(a.flags, args::CONVERT | args::SOFT);
        assert!(BalanceArgs::parse_filters("soft").is_err());
        assert!(BalanceArgs::parse_filters("drange=0..10").is_err());
        assert!(BalanceArgs::parse_filters("usage=101").is_err());
        assert!(BalanceArgs::parse_filters("bogus=1").is_err());
        let a = BalanceArgs::parse_filters("devid=1,drange=0..1048576,stripes=1..2").expect("p");
        assert_eq!(a.flags, args::DEVID | args::DRANGE | args::STRIPES_RANGE);
        let r = BalanceRequest {
            flags: flags::DATA | flags::METADATA,
            data: a,
            ..Default::default()
        };
        assert_eq!(BalanceRequest::parse(&r.to_bytes()).expect("parse"), r);
    }

    #[test]
    fn usage_and_limit_select_as_the_kernel() {
        let e = MapEntry {
            start: 1 << 30,
            length: 100,
            ty: BLOCK_GROUP_DATA,
            stripe_len: 65536,
            sub_stripes: 0,
            stripes: vec![crate::io::volumes::MapStripe {
                devid: 1,
                physical: 1 << 20,
            }],
        };
        let mut a = BalanceArgs::parse_filters("usage=50").expect("p");
        assert!(chunk_selected(&mut a, &e, 49));
        assert!(!chunk_selected(&mut a, &e, 50));
        let mut a = BalanceArgs::parse_filters("usage=0").expect("p");
        assert!(chunk_selected(&mut a, &e, 0));
        assert!(!chunk_selected(&mut a, &e, 1));
        let mut a = BalanceArgs::parse_filters("limit=1").expect("p");
        assert!(chunk_selected(&mut a, &e, 99));
        assert!(!chunk_selected(&mut a, &e, 99));
        let mut a = BalanceArgs::parse_filters("vrange=0..1073741824").expect("p");
        assert!(!chunk_selected(&mut a, &e, 0));
        let mut a = BalanceArgs::parse_filters("profiles=single|dup").expect("p");
        assert!(chunk_selected(&mut a, &e, 0));
        let mut a = BalanceArgs::parse_filters("convert=single,soft").expect("p");
        assert!(!chunk_selected(&mut a, &e, 0));
    }
}
