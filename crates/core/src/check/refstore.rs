//! The references the extent tree must hold, as the block walk finds them: kept in
//! memory up to a limit, then sorted and written out as runs to an unlinked
//! temporary file, and read back merged in (bytenr, kind) order by every phase that
//! needs them. A filesystem with more data extents than fit in the limit is then
//! checked in bounded memory (the runs are streamed; only one buffer per run is
//! held), as the issue of a 10-TB filesystem asks.

use super::blocks::{ExpRef, RefKind};
use crate::error::{Error, Result};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Mutex;

/// Bytes of one reference on disk.
const RECORD_BYTES: usize = 56;
/// References read from a run at a time.
const READ_RECORDS: usize = 4096;
/// Default in-memory limit: above it the references spill to a temporary file.
pub(crate) const REFS_MEM_BYTES_DEFAULT: usize = 256 << 20;

/// Every expected reference; sorted once [`RefStore::finish`] has run.
pub(super) struct RefStore {
    mem: Vec<ExpRef>,
    /// References held in memory before a spill.
    mem_max: usize,
    spill: Option<File>,
    /// (start record, records) of each sorted run in the file.
    runs: Vec<(u64, u64)>,
    spilled: u64,
    /// The first I/O error of a spill; reported by `finish`.
    error: Option<String>,
    /// The first I/O error reading a run back; see [`RefStore::read_error`].
    read_error: Mutex<Option<String>>,
}

impl Default for RefStore {
    fn default() -> RefStore {
        RefStore::new(REFS_MEM_BYTES_DEFAULT)
    }
}

/// The whole record: equal (bytenr, kind) pairs come out in the same order whether
/// or not they were spilled (the reports name the first one's parent).
type SortKey = (u64, RefKind, u8, u64, u64, u32);

fn sort_key(r: &ExpRef) -> SortKey {
    (r.bytenr, r.kind, r.level, r.len, r.from, r.count)
}

impl RefStore {
    /// A store that keeps at most `mem_bytes` of references in memory.
    pub(super) fn new(mem_bytes: usize) -> RefStore {
        RefStore {
            mem: Vec::new(),
            mem_max: (mem_bytes / std::mem::size_of::<ExpRef>()).max(16),
            spill: None,
            runs: Vec::new(),
            spilled: 0,
            error: None,
            read_error: Mutex::new(None),
        }
    }

    pub(super) fn push(&mut self, r: ExpRef) {
        self.mem.push(r);
        // After a failed spill (a full $TMPDIR) no other is tried: `finish` fails
        // the check, and retrying a sort of the whole buffer per push would not end.
        if self.mem.len() >= self.mem_max && self.error.is_none() {
            if let Err(e) = self.spill_run() {
                self.error = Some(e.to_string());
            }
        }
    }

    /// References written to the temporary file.
    pub(super) fn spilled(&self) -> u64 {
        self.spilled
    }

    fn spill_run(&mut self) -> std::io::Result<()> {
        if self.spill.is_none() {
            self.spill = Some(temp_file()?);
        }
        let Some(file) = &self.spill else {
            return Ok(());
        };
        self.mem.sort_unstable_by_key(sort_key);
        let start = self.runs.last().map_or(0, |r| r.0 + r.1);
        let mut buf = Vec::with_capacity(READ_RECORDS * RECORD_BYTES);
        let mut at = start;
        for chunk in self.mem.chunks(READ_RECORDS) {
            buf.clear();
            for r in chunk {
                encode(r, &mut buf);
            }
            file.write_all_at(&buf, at * RECORD_BYTES as u64)?;
            at += chunk.len() as u64;
        }
        self.runs.push((start, self.mem.len() as u64));
        self.spilled += self.mem.len() as u64;
        self.mem.clear();
        Ok(())
    }

    /// Sorts what is in memory; after this the store is read with [`RefStore::iter`].
    pub(super) fn finish(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(Error::corrupt(format!(
                "check: writing references to a temporary file: {e}"
            )));
        }
        self.mem.sort_unstable_by_key(sort_key);
        Ok(())
    }

    /// A read error of the temporary file that ended an iteration early: the
    /// phases that read the references are then not to be trusted.
    pub(super) fn read_error(&self) -> Result<()> {
        let e = self.read_error.lock().unwrap_or_else(|p| p.into_inner());
        match &*e {
            Some(m) => Err(Error::corrupt(m.clone())),
            None => Ok(()),
        }
    }

    /// Every reference in (bytenr, kind) order. A read error of the temporary file
    /// ends that run early (the others go on, with a gap); [`RefStore::read_error`]
    /// tells, and the check then fails rather than report what the gap implies.
    pub(super) fn iter(&self) -> RefIter<'_> {
        let mut it = RefIter {
            store: self,
            mem_next: 0,
            runs: self
                .runs
                .iter()
                .map(|&(start, n)| RunReader {
                    next: start,
                    end: start + n,
                    buf: Vec::new(),
                    pos: 0,
                })
                .collect(),
            heap: BinaryHeap::new(),
        };
        for i in 0..it.runs.len() {
            it.refill(i);
        }
        it
    }
}

struct RunReader {
    /// Next record of the file to read, and the run's end.
    next: u64,
    end: u64,
    buf: Vec<ExpRef>,
    pos: usize,
}

/// The merge of the runs and the in-memory references.
pub(super) struct RefIter<'a> {
    store: &'a RefStore,
    mem_next: usize,
    runs: Vec<RunReader>,
    /// The head of each run: (key, run).
    heap: BinaryHeap<Reverse<(SortKey, usize)>>,
}

impl RefIter<'_> {
    /// Puts run `i`'s next reference on the heap (reading a batch when needed).
    fn refill(&mut self, i: usize) {
        let r = &mut self.runs[i];
        if r.pos == r.buf.len() {
            r.buf.clear();
            r.pos = 0;
            let n = (r.end - r.next).min(READ_RECORDS as u64) as usize;
            if n == 0 {
                return;
            }
            let Some(file) = &self.store.spill else {
                return;
            };
            let mut bytes = vec![0u8; n * RECORD_BYTES];
            if let Err(e) = file.read_exact_at(&mut bytes, r.next * RECORD_BYTES as u64) {
                let mut err = self
                    .store
                    .read_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                err.get_or_insert(format!("check: reading back references: {e}"));
                r.next = r.end;
                return;
            }
            r.next += n as u64;
            r.buf.extend(bytes.chunks_exact(RECORD_BYTES).map(decode));
        }
        if let Some(x) = r.buf.get(r.pos) {
            self.heap.push(Reverse((sort_key(x), i)));
        }
    }
}

impl Iterator for RefIter<'_> {
    type Item = ExpRef;

    fn next(&mut self) -> Option<ExpRef> {
        let mem = self.store.mem.get(self.mem_next);
        let run = self.heap.peek().map(|Reverse((k, i))| (*k, *i));
        match (mem, run) {
            (Some(m), Some((k, _))) if sort_key(m) <= k => {
                self.mem_next += 1;
                Some(*m)
            }
            (_, Some((_, i))) => {
                self.heap.pop();
                let r = &mut self.runs[i];
                let x = r.buf.get(r.pos).copied();
                r.pos += 1;
                self.refill(i);
                x
            }
            (Some(m), None) => {
                self.mem_next += 1;
                Some(*m)
            }
            (None, None) => None,
        }
    }
}

/// An unlinked file in the temporary directory ($TMPDIR, else /tmp).
fn temp_file() -> std::io::Result<File> {
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    for n in 0..1000u32 {
        let p = dir.join(format!(".ubtrfs-check-refs-{pid}-{n}"));
        // Readable by its owner only, for the instant it has a name.
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
        {
            Ok(f) => {
                // Unlinked at once: the space goes back however the check ends.
                let _ = std::fs::remove_file(&p);
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free temporary file name"))
}

fn encode(r: &ExpRef, out: &mut Vec<u8>) {
    let (tag, a, b, c) = match r.kind {
        RefKind::Tree(x) => (0u8, x, 0, 0),
        RefKind::Shared(x) => (1, x, 0, 0),
        RefKind::Data(x, y, z) => (2, x, y, z),
        RefKind::SharedData(x) => (3, x, 0, 0),
    };
    out.extend_from_slice(&r.bytenr.to_le_bytes());
    out.extend_from_slice(&a.to_le_bytes());
    out.extend_from_slice(&b.to_le_bytes());
    out.extend_from_slice(&c.to_le_bytes());
    out.extend_from_slice(&r.len.to_le_bytes());
    out.extend_from_slice(&r.from.to_le_bytes());
    out.extend_from_slice(&r.count.to_le_bytes());
    out.push(tag);
    out.push(r.level);
    out.extend_from_slice(&[0, 0]);
}

fn decode(b: &[u8]) -> ExpRef {
    let u = |i: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(x)
    };
    let (a, bb, c) = (u(8), u(16), u(24));
    let kind = match b[52] {
        0 => RefKind::Tree(a),
        1 => RefKind::Shared(a),
        2 => RefKind::Data(a, bb, c),
        _ => RefKind::SharedData(a),
    };
    let mut cnt = [0u8; 4];
    cnt.copy_from_slice(&b[48..52]);
    ExpRef {
        bytenr: u(0),
        kind,
        count: u32::from_le_bytes(cnt),
        len: u(32),
        level: b[53],
        from: u(40),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(bytenr: u64, kind: RefKind) -> ExpRef {
        ExpRef {
            bytenr,
            kind,
            count: 1,
            len: 4096,
            level: 0,
            from: bytenr ^ 7,
        }
    }

    #[test]
    fn spilled_runs_merge_in_order_with_memory() {
        // A limit of 16 references: many runs and a remainder in memory.
        let mut s = RefStore::new(0);
        let mut want = Vec::new();
        for i in 0..1000u64 {
            let b = (i * 7919) % 613;
            let k = match i % 4 {
                0 => RefKind::Tree(i),
                1 => RefKind::Shared(i + 1),
                2 => RefKind::Data(5, i, i * 4096),
                _ => RefKind::SharedData(i * 3),
            };
            s.push(r(b, k));
            want.push(r(b, k));
        }
        s.finish().expect("finish");
        assert!(s.spilled() > 900, "spilled {}", s.spilled());
        want.sort_unstable_by_key(sort_key);
        for _ in 0..2 {
            let mut it = s.iter();
            let got: Vec<ExpRef> = it.by_ref().collect();
            s.read_error().expect("no read error");
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(sort_key(g), sort_key(w));
                assert_eq!(
                    (g.count, g.len, g.level, g.from),
                    (w.count, w.len, w.level, w.from)
                );
            }
        }
    }
}
