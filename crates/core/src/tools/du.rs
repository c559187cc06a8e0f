//! `btrfs filesystem du` semantics, computed from the image: per file the bytes of
//! its extents (inline, delalloc and unknown ones skipped), split into exclusive and
//! shared by fiemap's SHARED flag; per top-level argument the "set shared" bytes are
//! the union of the shared extents' physical ranges. Hard links are counted once per
//! argument, keyed by (subvolume, inode).

use crate::backref::ShareCtx;
use crate::error::Result;
use crate::fs::{Filesystem, Node, S_IFDIR, S_IFMT, S_IFREG};
use crate::tools::fiemap::*;
use std::collections::HashSet;
use ubtrfs_format::consts::*;

#[derive(Clone, Debug, PartialEq, Eq)]
/// One line of `btrfs filesystem du`.
pub struct DuLine {
    /// Bytes of the extents of all files below the path.
    pub total: u64,
    /// Of those, bytes not shared with anything else.
    pub exclusive: u64,
    /// Only for top-level arguments (progs prints "-" otherwise).
    pub set_shared: Option<u64>,
    /// The path as given.
    pub path: String,
}

struct DuRun<'s, 'f> {
    share: &'s mut ShareCtx<'f>,
    seen: HashSet<(u64, u64)>,
    shared_ranges: Vec<(u64, u64)>,
    summarize: bool,
    lines: Vec<DuLine>,
    ancestors: Vec<Node>,
}

/// Bytes covered by the union of [start, start + len) ranges.
pub fn union_bytes(ranges: &mut [(u64, u64)]) -> u64 {
    ranges.sort_unstable();
    let mut total = 0u64;
    let mut cur: Option<(u64, u64)> = None;
    for &(s, len) in ranges.iter() {
        let e = s.saturating_add(len);
        match cur.as_mut() {
            Some((_, ce)) if s <= *ce => *ce = (*ce).max(e),
            _ => {
                if let Some((cs, ce)) = cur {
                    total += ce - cs;
                }
                cur = Some((s, e));
            }
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

impl Filesystem {
    /// Lines of `btrfs filesystem du [-s] PATH` for one argument, in progs' order.
    pub fn filesystem_du(
        &self,
        share: &mut ShareCtx<'_>,
        path: &str,
        summarize: bool,
    ) -> Result<Vec<DuLine>> {
        let node = self.resolve(path)?;
        let mut run = DuRun {
            share,
            seen: HashSet::new(),
            shared_ranges: Vec::new(),
            summarize,
            lines: Vec::new(),
            ancestors: Vec::new(),
        };
        self.du_add(&mut run, node, path.to_string(), true)?;
        Ok(run.lines)
    }

    /// Returns (total, shared) of `node`.
    fn du_add(
        &self,
        run: &mut DuRun<'_, '_>,
        node: Node,
        path: String,
        top: bool,
    ) -> Result<(u64, u64)> {
        let st = self.stat(node)?;
        let kind = st.mode & S_IFMT;
        if kind != S_IFREG && kind != S_IFDIR {
            return Ok((0, 0));
        }
        if node.ino != EMPTY_SUBVOL_DIR_OBJECTID && !run.seen.insert((node.root, node.ino)) {
            return Ok((0, 0));
        }
        let (total, shared) = if kind == S_IFREG {
            self.du_file(run, node)?
        } else {
            if run.ancestors.contains(&node) {
                return Err(crate::error::Error::corrupt(format!(
                    "{path}: directory loop"
                )));
            }
            run.ancestors.push(node);
            let mut t = 0u64;
            let mut s = 0u64;
            for e in self.readdir(node)? {
                if e.ty != FT_REG_FILE && e.ty != FT_DIR {
                    continue;
                }
                let name = String::from_utf8_lossy(&e.name);
                let p = if path.ends_with('/') {
                    format!("{path}{name}")
                } else {
                    format!("{path}/{name}")
                };
                let (ct, cs) = self.du_add(run, e.node, p, false)?;
                t += ct;
                s += cs;
            }
            run.ancestors.pop();
            (t, s)
        };
        if !run.summarize || top {
            let set_shared = if !top {
                None
            } else if kind == S_IFDIR {
                Some(union_bytes(&mut run.shared_ranges))
            } else {
                Some(shared)
            };
            run.lines.push(DuLine {
                total,
                exclusive: total - shared,
                set_shared,
                path,
            });
        }
        Ok((total, shared))
    }

    fn du_file(&self, run: &mut DuRun<'_, '_>, node: Node) -> Result<(u64, u64)> {
        let mut total = 0u64;
        let mut shared = 0u64;
        for e in self.fiemap(node, run.share)? {
            if e.flags
                & (FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC | FIEMAP_EXTENT_DATA_INLINE)
                != 0
                || e.length == 0
            {
                continue;
            }
            total += e.length;
            if e.flags & FIEMAP_EXTENT_SHARED != 0 {
                shared += e.length;
                run.shared_ranges.push((e.physical, e.length));
            }
        }
        Ok((total, shared))
    }
}

/// progs' human-readable size: binary units, two decimals ("296.00KiB", "0.00B").
pub fn pretty_size(size: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut divs = 0usize;
    let mut last = size;
    let mut s = size;
    while s >= 1024 && divs < UNITS.len() - 1 {
        last = s;
        s /= 1024;
        divs += 1;
    }
    let v = if divs == 0 {
        size as f64
    } else {
        last as f64 / 1024.0
    };
    format!("{v:.2}{}", UNITS[divs])
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes_like_progs() {
        assert_eq!(pretty_size(0), "0.00B");
        assert_eq!(pretty_size(303104), "296.00KiB");
        assert_eq!(pretty_size(614400), "600.00KiB");
        assert_eq!(pretty_size(8192), "8.00KiB");
        assert_eq!(pretty_size(1023), "1023.00B");
        assert_eq!(pretty_size(3 << 30), "3.00GiB");
    }
    #[test]
    fn union() {
        let mut r = vec![(0, 10), (5, 10), (20, 5), (24, 1)];
        assert_eq!(union_bytes(&mut r), 15 + 5);
    }
}

/// Per compression type: bytes on disk, uncompressed size of those extents, and
/// bytes the files reference (compsize's columns).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FootprintRow {
    /// Bytes on disk (compressed size).
    pub disk: u64,
    /// Bytes the extents hold uncompressed.
    pub uncompressed: u64,
    /// Bytes the files reference.
    pub referenced: u64,
}

/// What a set of paths occupies on disk: every data extent counted once, at its
/// on-disk (compressed) size; inline data at its stored size.
#[derive(Clone, Debug, Default)]
pub struct Footprint {
    /// Regular files seen.
    pub files: u64,
    /// Distinct regular extents.
    pub regular_extents: u64,
    /// File extent items pointing at them.
    pub refs: u64,
    /// Inline extents.
    pub inline_extents: u64,
    /// Index = compression type (0 none, 1 zlib, 2 lzo, 3 zstd).
    pub by_type: [FootprintRow; 4],
}

impl Footprint {
    /// The sum of all rows.
    pub fn total(&self) -> FootprintRow {
        let mut t = FootprintRow::default();
        for r in &self.by_type {
            t.disk += r.disk;
            t.uncompressed += r.uncompressed;
            t.referenced += r.referenced;
        }
        t
    }
}

impl Filesystem {
    /// Footprint of everything under `paths` (hard links and shared extents once).
    pub fn footprint(&self, paths: &[&str]) -> Result<Footprint> {
        let mut fp = Footprint::default();
        let mut seen_inodes = HashSet::new();
        let mut seen_extents = HashSet::new();
        let mut stack: Vec<Node> = Vec::new();
        for p in paths {
            stack.push(self.resolve(p)?);
        }
        let mut dirs_seen = HashSet::new();
        while let Some(node) = stack.pop() {
            let st = self.stat(node)?;
            match st.mode & S_IFMT {
                S_IFDIR => {
                    if node.is_placeholder() || !dirs_seen.insert(node) {
                        continue;
                    }
                    for e in self.readdir(node)? {
                        stack.push(e.node);
                    }
                }
                S_IFREG => {
                    if !seen_inodes.insert((node.root, node.ino)) {
                        continue;
                    }
                    fp.files += 1;
                    self.for_each_extent(node, 0, u64::MAX, |fe| {
                        let t = (fe.item.compression as usize).min(3);
                        match &fe.item.body {
                            ubtrfs_format::items::FileExtentBody::Inline { data } => {
                                fp.inline_extents += 1;
                                let row = &mut fp.by_type[t];
                                row.disk += data.len() as u64;
                                row.uncompressed += fe.item.ram_bytes;
                                row.referenced += fe.item.ram_bytes;
                            }
                            ubtrfs_format::items::FileExtentBody::Regular {
                                disk_bytenr,
                                disk_num_bytes,
                                num_bytes,
                                ..
                            } => {
                                if *disk_bytenr == 0 {
                                    return Ok(true);
                                }
                                fp.refs += 1;
                                let row = &mut fp.by_type[t];
                                row.referenced += num_bytes;
                                if seen_extents.insert(*disk_bytenr) {
                                    fp.regular_extents += 1;
                                    row.disk += disk_num_bytes;
                                    row.uncompressed += fe.item.ram_bytes;
                                }
                            }
                        }
                        Ok(true)
                    })?;
                }
                _ => {}
            }
        }
        Ok(fp)
    }
}
