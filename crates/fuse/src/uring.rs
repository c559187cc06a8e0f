//! FUSE over io_uring (Linux 6.14 on, when the fuse module's `enable_uring`
//! parameter is set): requests reach the server as completions of io_uring commands
//! on per-CPU queues instead of read(2) on /dev/fuse, and each answer goes back with
//! the command that fetches the next request.
//!
//! Why: a request made on CPU c goes to queue c, whose threads are pinned to CPU c,
//! so the kernel hands it over without waking another CPU, and the answer wakes the
//! caller where it sleeps. On /dev/fuse any server thread takes any request: on a
//! small virtual machine every round trip paid two cross-CPU wakeups, and `tar x`
//! of 5,400 files (55,000 requests) took 2.7 s where pinning the caller and the
//! server to one CPU by hand took 1.2 s.
//!
//! The protocol (include/uapi/linux/fuse.h, fs/fuse/dev_uring.c): after INIT accepts
//! FUSE_OVER_IO_URING, every queue (one per possible CPU) gets entries, each a
//! URING_CMD of /dev/fuse in a 128-byte SQE: REGISTER names two buffers (an iovec
//! pair: the 288-byte `fuse_uring_req_header` and a payload as large as the largest
//! request), and completes when a request fills them: the in header, the request's
//! first argument (its fixed op header) in `op_in`, the rest in the payload, and
//! `payload_sz` with the request's unique id as `commit_id`. The answer is the out
//! header in the same place, the body in the payload, `payload_sz` its length; the
//! COMMIT_AND_FETCH command hands it over and waits for the next request. The
//! queues start taking requests once every queue has an entry; FORGET and
//! INTERRUPT, and requests sent before that, still come through /dev/fuse, so its
//! threads keep serving until a ring has served a request; then one stays, and it
//! waits a millisecond after each FORGET so that the kernel gathers the next ones
//! into one BATCH_FORGET (`session::serve`). Unmounting ends the entries' commands
//! with an error.

use crate::abi::{self, op, IN_HEADER_SIZE, OUT_HEADER_SIZE};
use crate::channel::Channel;
use crate::ops::Ops;
use crate::reply::{Reply, RingAnswer};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;

/// Bytes of `struct fuse_uring_req_header`: the in/out header (128), the op header
/// (128) and `struct fuse_uring_ent_in_out` (32).
const HEADERS_SIZE: usize = 288;
/// Where the op header sits in it, and how long it may be.
const OP_IN: usize = 128;
const OP_IN_MAX: usize = 128;
/// `fuse_uring_ent_in_out`: commit_id at +8, payload_sz at +16.
const ENT_IN_OUT: usize = 256;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// REGISTER's iovec count (headers, payload).
const IOV_SEGS: u32 = 2;
/// Offset of `len` in an SQE (the io-uring crate has no setter for it on URING_CMD).
const SQE_LEN_OFFSET: usize = 24;

/// The number of queues the kernel makes: one per possible CPU (nr_cpu_ids), from
/// /sys/devices/system/cpu/possible ("0-1", "0-3,8-11").
pub(crate) fn possible_cpus() -> Option<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok()?;
    cpu_list(&s)?.into_iter().max().map(|m| m + 1)
}

/// Whether CPU `cpu` is online (/sys/devices/system/cpu/online); true when that
/// cannot be read. A queue of an offline CPU gets no requests but needs an entry
/// for the rings to start: it gets one thread, not `io_uring_threads`.
pub(crate) fn cpu_online(cpu: usize) -> bool {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| cpu_list(&s))
        .is_none_or(|l| l.contains(&cpu))
}

/// A kernel CPU list ("0-3,8,10-11").
fn cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        // Bounded: no machine has a million CPUs.
        if b < a || b >= 1 << 20 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// A buffer the kernel writes into while a command is in flight: owned through a
/// raw pointer, so no Rust reference to it is alive across the syscall that lets
/// the kernel fill it; slices are made only between a completion and the next
/// submission.
struct KernelBuf {
    ptr: *mut u8,
    len: usize,
}

impl KernelBuf {
    fn new(len: usize) -> KernelBuf {
        // u64 elements: the headers hold 8-byte fields, read at their offsets.
        let words = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        KernelBuf {
            ptr: Box::into_raw(words).cast::<u8>(),
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr/len come from a live allocation of at least len bytes (freed
        // only in drop); the kernel does not write to it while this borrow lives
        // (it writes only between a submission and its completion, and the caller
        // holds no slice across submit_and_wait).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for KernelBuf {
    fn drop(&mut self) {
        let words = self.len.div_ceil(8);
        // SAFETY: ptr came from Box::into_raw of a [u64] of `words` elements, and
        // is freed once, here. An Entry is dropped only after the kernel ended its
        // command (the connection is gone); on any other exit it is leaked, so the
        // kernel never writes into freed memory.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.cast::<u64>(),
                words,
            )));
        }
    }
}

/// One ring entry served by one thread: its io_uring and its two buffers. The
/// payload buffer has OP_IN_MAX bytes in front of what the kernel sees, so the op
/// header can be put right before the payload and the handler gets one slice.
struct Entry {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    headers: KernelBuf,
    payload: KernelBuf,
    /// REGISTER's iovec pair, kept as long as the entry (the kernel reads it while
    /// the command is issued, which may be after the submitting call returns).
    iov: Box<[libc::iovec; 2]>,
    payload_size: usize,
    qid: u16,
    fd: i32,
}

impl Entry {
    fn command(&self, commit_id: u64) -> [u8; 80] {
        // struct fuse_uring_cmd_req: flags, commit_id, qid, padding.
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        cmd
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE names only buffers owned by self (headers, payload, and
        // for REGISTER the iovec array, which the kernel copies during submission),
        // all alive as long as the ring.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))
    }

    fn register(&mut self) -> io::Result<()> {
        let sqe = opcode::UringCmd80::new(types::Fd(self.fd), CMD_REGISTER)
            .cmd(self.command(0))
            .addr(Some(self.iov.as_ptr() as u64))
            .build();
        let sqe = with_len(sqe, IOV_SEGS);
        self.push(sqe)?;
        self.submit_and_wait(0)?;
        Ok(())
    }

    fn commit(&mut self, commit_id: u64) -> io::Result<()> {
        let sqe = opcode::UringCmd80::new(types::Fd(self.fd), CMD_COMMIT_AND_FETCH)
            .cmd(self.command(commit_id))
            .build();
        self.push(sqe)
    }

    fn submit_and_wait(&mut self, want: usize) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Sets an SQE's `len` field.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is repr(C), 128 bytes (an io_uring_sqe and 64 more), and
    // every bit pattern is a valid value of it; `len` is the u32 at byte 24.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute(raw) }
}

/// Pins the calling thread to `cpu` (best effort: a CPU outside the process's
/// allowed set is left alone, the queue works unpinned, only slower).
fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Serves queue `qid` with one entry until the connection ends. Returns Ok when
/// the kernel ended it (unmount), Err when the ring could not be set up (then
/// /dev/fuse keeps serving, as the queues never all get ready) or broke.
pub(crate) fn serve_queue(
    ch: &Channel,
    ops: &Ops,
    qid: u16,
    payload_size: usize,
    count: &dyn Fn(&abi::InHeader, std::time::Duration),
) -> io::Result<()> {
    pin_to(qid as usize);
    let headers = KernelBuf::new(HEADERS_SIZE);
    let payload = KernelBuf::new(OP_IN_MAX + payload_size);
    let iov = Box::new([
        libc::iovec {
            iov_base: headers.ptr.cast(),
            iov_len: HEADERS_SIZE,
        },
        libc::iovec {
            // SAFETY: OP_IN_MAX < payload.len (the payload follows it).
            iov_base: unsafe { payload.ptr.add(OP_IN_MAX) }.cast(),
            iov_len: payload_size,
        },
    ]);
    let mut e = Entry {
        ring: IoUring::builder().build(4)?,
        headers,
        payload,
        iov,
        payload_size,
        qid,
        fd: ch.raw_fd(),
    };
    match run_entry(&mut e, ch, ops, count) {
        Ok(()) => Ok(()),
        Err(err) => {
            // A command may still be in flight: the kernel could write into the
            // buffers after they were freed. Leak them (and the ring) instead.
            std::mem::forget(e);
            Err(err)
        }
    }
}

/// The entry's loop: register, then answer and fetch until the connection ends.
fn run_entry(
    e: &mut Entry,
    ch: &Channel,
    ops: &Ops,
    count: &dyn Fn(&abi::InHeader, std::time::Duration),
) -> io::Result<()> {
    e.register()?;
    let answer = RingAnswer::default();
    loop {
        e.submit_and_wait(1)?;
        let Some(cqe) = e.ring.completion().next() else {
            continue;
        };
        let res = cqe.result();
        if res < 0 {
            let err = -res;
            // The connection is gone (unmount or abort): the kernel is done with
            // the entry's buffers.
            if [libc::ENOTCONN, libc::ECANCELED, libc::ENODEV].contains(&err) {
                return Ok(());
            }
            // Anything else lost this entry (its request, if any, was ended by
            // the kernel): register it again, so the queue keeps its threads.
            eprintln!(
                "ubtrfs: FUSE over io_uring queue {}: {}; registering again",
                e.qid,
                io::Error::from_raw_os_error(err)
            );
            e.register()?;
            continue;
        }
        let (commit_id, unique) = take_request(e, &answer, ch, ops, count);
        put_answer(e, &answer, unique);
        // After DESTROY the kernel ends this command when it tears the ring down.
        e.commit(commit_id)?;
        if let Some(c) = answer.take_deferred() {
            // The commit hands the answer over as it is submitted (the fetch then
            // waits): only after that may the change count be compared.
            e.submit_and_wait(0)?;
            ops.attrs_sent(ch, None, c.seq, c.own, &c.ids);
        }
    }
}

/// A native-endian word of `b` at `at` (0 past its end, which the fixed layout
/// never reaches).
fn ne_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

fn ne_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// Reads the request the kernel put in the entry's buffers and answers it into
/// `answer` (always: a malformed request or a handler that panics is EIO, never
/// left unanswered, which would hang its caller and take the entry from the
/// queue). Returns its commit id and unique id.
fn take_request(
    e: &mut Entry,
    answer: &RingAnswer,
    ch: &Channel,
    ops: &Ops,
    count: &dyn Fn(&abi::InHeader, std::time::Duration),
) -> (u64, u64) {
    answer.clear();
    let hdr = e.headers.bytes();
    let commit_id = ne_u64(hdr, ENT_IN_OUT + 8);
    let Some((h, _)) = abi::parse_header(&hdr[..IN_HEADER_SIZE]) else {
        Reply::to_ring(ch, commit_id, answer).error(crate::ops::errno::EIO);
        return (commit_id, commit_id);
    };
    let payload_sz = ne_u32(hdr, ENT_IN_OUT + 16) as usize;
    // The in header's len counts every argument: what the payload does not hold
    // is the op header.
    let op_len = (h.len as usize)
        .checked_sub(IN_HEADER_SIZE + payload_sz)
        .filter(|&n| n <= OP_IN_MAX);
    let mut op_in = [0u8; OP_IN_MAX];
    let op_len = match op_len {
        Some(n) if payload_sz <= e.payload_size => {
            op_in[..n].copy_from_slice(&hdr[OP_IN..OP_IN + n]);
            n
        }
        _ => {
            Reply::to_ring(ch, h.unique, answer).error(crate::ops::errno::EIO);
            return (commit_id, h.unique);
        }
    };
    let buf = e.payload.bytes();
    buf[OP_IN_MAX - op_len..OP_IN_MAX].copy_from_slice(&op_in[..op_len]);
    let body = &buf[OP_IN_MAX - op_len..OP_IN_MAX + payload_sz];
    let t0 = std::time::Instant::now();
    if h.opcode == op::INIT {
        Reply::to_ring(ch, h.unique, answer).error(crate::ops::errno::EIO);
    } else {
        // A panic in a handler (a bug) must not take the entry with it: its Reply
        // leaves EIO behind as it unwinds, and that is committed like any answer.
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ops.dispatch(&h, body, Reply::to_ring(ch, h.unique, answer))
        }));
        if served.is_err() {
            eprintln!(
                "ubtrfs: FUSE request {} failed (a bug): answered EIO",
                h.opcode
            );
        }
    }
    count(&h, t0.elapsed());
    (commit_id, h.unique)
}

/// Moves the answer into the entry's buffers: the out header where the in header
/// was, the body into the payload, its length as payload_sz. An answer too large
/// for the payload (a bug) becomes EIO.
fn put_answer(e: &mut Entry, answer: &RingAnswer, unique: u64) {
    let payload_size = e.payload_size;
    let mut body_len = 0usize;
    let mut out = [0u8; OUT_HEADER_SIZE];
    answer.with(|a| {
        let fits = a.len() >= OUT_HEADER_SIZE && a.len() - OUT_HEADER_SIZE <= payload_size;
        if fits {
            out.copy_from_slice(&a[..OUT_HEADER_SIZE]);
            body_len = a.len() - OUT_HEADER_SIZE;
            let buf = e.payload.bytes();
            buf[OP_IN_MAX..OP_IN_MAX + body_len].copy_from_slice(&a[OUT_HEADER_SIZE..]);
        } else {
            out[..4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
            out[4..8].copy_from_slice(&(-crate::ops::errno::EIO).to_ne_bytes());
            out[8..].copy_from_slice(&unique.to_ne_bytes());
        }
    });
    let hdr = e.headers.bytes();
    hdr[..OUT_HEADER_SIZE].copy_from_slice(&out);
    hdr[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(body_len as u32).to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn len_lands_in_the_sqe() {
        let sqe = opcode::UringCmd80::new(types::Fd(3), CMD_REGISTER)
            .addr(Some(0x1000))
            .build();
        let sqe = with_len(sqe, IOV_SEGS);
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4], 2u32.to_ne_bytes());
        assert_eq!(raw[16..24], 0x1000u64.to_ne_bytes());
        // cmd_op at byte 8, fd at 4.
        assert_eq!(raw[8..12], CMD_REGISTER.to_ne_bytes());
        assert_eq!(raw[4..8], 3i32.to_ne_bytes());
    }

    #[test]
    fn cpu_lists_parse() {
        assert!(possible_cpus().unwrap_or(1) >= 1);
        assert_eq!(cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("0"), Some(vec![0]));
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("x"), None);
    }
}
