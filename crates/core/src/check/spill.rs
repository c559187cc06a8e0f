//! Lists of fixed-size records that grow with the data (the references the extent
//! tree must hold, data ranges): kept in memory up to a limit, then sorted and
//! written out as runs to an unlinked temporary file, and read back merged in key
//! order by every phase that needs them. A filesystem with more data extents than
//! fit in the limit is then checked in bounded memory (the runs are streamed; one
//! buffer per run is held), as the issue of a 10-TB filesystem asks.

use crate::error::{Error, Result};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Mutex;

/// A record of a [`Spill`]: its sort key and its bytes on disk.
pub(super) trait Record: Copy {
    /// Bytes of one record on disk.
    const BYTES: usize;
    /// The order the records are read back in (the whole record, so that equal
    /// records come out alike whether or not they were spilled).
    type Key: Ord + Copy;
    fn key(&self) -> Self::Key;
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(b: &[u8]) -> Self;
}

/// Records read from a run at a time.
const READ_RECORDS: usize = 4096;

/// Records in key order once [`Spill::finish`] has run.
pub(super) struct Spill<T: Record> {
    mem: Vec<T>,
    /// Records held in memory before a spill.
    mem_max: usize,
    spill: Option<File>,
    /// (start record, records) of each sorted run in the file.
    runs: Vec<(u64, u64)>,
    spilled: u64,
    /// The first I/O error of a spill; reported by `finish`.
    error: Option<String>,
    /// The first I/O error reading a run back; see [`Spill::read_error`].
    read_error: Mutex<Option<String>>,
}

impl<T: Record> Spill<T> {
    /// A store that keeps at most `mem_bytes` of records in memory.
    pub(super) fn new(mem_bytes: usize) -> Spill<T> {
        Spill {
            mem: Vec::new(),
            mem_max: (mem_bytes / std::mem::size_of::<T>().max(1)).max(16),
            spill: None,
            runs: Vec::new(),
            spilled: 0,
            error: None,
            read_error: Mutex::new(None),
        }
    }

    pub(super) fn push(&mut self, r: T) {
        self.mem.push(r);
        // After a failed spill (a full $TMPDIR) no other is tried: `finish` fails
        // the check, and retrying a sort of the whole buffer per push would not end.
        if self.mem.len() >= self.mem_max && self.error.is_none() {
            if let Err(e) = self.spill_run() {
                self.error = Some(e.to_string());
            }
        }
    }

    /// Records written to the temporary file.
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
        self.mem.sort_unstable_by_key(T::key);
        let start = self.runs.last().map_or(0, |r| r.0 + r.1);
        let mut buf = Vec::with_capacity(READ_RECORDS * T::BYTES);
        let mut at = start;
        for chunk in self.mem.chunks(READ_RECORDS) {
            buf.clear();
            for r in chunk {
                r.encode(&mut buf);
            }
            file.write_all_at(&buf, at * T::BYTES as u64)?;
            at += chunk.len() as u64;
        }
        self.runs.push((start, self.mem.len() as u64));
        self.spilled += self.mem.len() as u64;
        self.mem.clear();
        Ok(())
    }

    /// Sorts what is in memory; after this the store is read with [`Spill::iter`].
    pub(super) fn finish(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(Error::corrupt(format!(
                "check: writing to a temporary file: {e}"
            )));
        }
        self.mem.sort_unstable_by_key(T::key);
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

    /// Every record in key order. A read error of the temporary file ends that run
    /// early (the others go on, with a gap); [`Spill::read_error`] tells, and the
    /// check then fails rather than report what the gap implies.
    pub(super) fn iter(&self) -> SpillIter<'_, T> {
        let mut it = SpillIter {
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

struct RunReader<T> {
    /// Next record of the file to read, and the run's end.
    next: u64,
    end: u64,
    buf: Vec<T>,
    pos: usize,
}

/// The merge of the runs and the records in memory.
pub(super) struct SpillIter<'a, T: Record> {
    store: &'a Spill<T>,
    mem_next: usize,
    runs: Vec<RunReader<T>>,
    /// The head of each run: (key, run).
    heap: BinaryHeap<Reverse<(T::Key, usize)>>,
}

impl<T: Record> SpillIter<'_, T> {
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
            let mut bytes = vec![0u8; n * T::BYTES];
            if let Err(e) = file.read_exact_at(&mut bytes, r.next * T::BYTES as u64) {
                let mut err = self
                    .store
                    .read_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                err.get_or_insert(format!("check: reading back a temporary file: {e}"));
                r.next = r.end;
                return;
            }
            r.next += n as u64;
            r.buf.extend(bytes.chunks_exact(T::BYTES).map(T::decode));
        }
        if let Some(x) = r.buf.get(r.pos) {
            self.heap.push(Reverse((x.key(), i)));
        }
    }
}

impl<T: Record> Iterator for SpillIter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        let mem = self.store.mem.get(self.mem_next);
        let run = self.heap.peek().map(|Reverse((k, i))| (*k, *i));
        match (mem, run) {
            (Some(m), Some((k, _))) if m.key() <= k => {
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
        let p = dir.join(format!(".ubtrfs-check-{pid}-{n}"));
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
