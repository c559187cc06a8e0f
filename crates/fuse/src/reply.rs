//! Answers to one request. Every request but FORGET, BATCH_FORGET and INTERRUPT gets
//! exactly one; a Reply dropped unanswered sends EIO so the caller never hangs.
//!
//! An answer goes to /dev/fuse (write), or, for a request that came through FUSE
//! over io_uring, into that ring entry's buffers ([`RingAnswer`]), which the ring's
//! thread commits after the handler returns.

use crate::abi::OUT_HEADER_SIZE;
use crate::channel::Channel;
use std::cell::RefCell;
use std::io::IoSlice;

pub struct Reply<'a> {
    ch: &'a Channel,
    unique: u64,
    sent: bool,
    ring: Option<&'a RingAnswer>,
}

/// Where the answer to a ring request is kept until its thread commits it: the out
/// header followed by the body. Not Sync: a ring request is answered on the thread
/// that took it.
#[derive(Default)]
pub(crate) struct RingAnswer {
    bytes: RefCell<Vec<u8>>,
    /// A check to make once the answer has reached the kernel (`Ops::attrs_sent`):
    /// the change count its attributes were read at, the request's own changes, and
    /// the node ids it described.
    after: RefCell<Option<AttrsCheck>>,
}

/// See [`RingAnswer::after`].
#[derive(Debug)]
pub(crate) struct AttrsCheck {
    pub(crate) seq: u64,
    pub(crate) own: u64,
    pub(crate) ids: Vec<u64>,
}

impl RingAnswer {
    /// Empties it for the next request (keeping its capacity).
    pub(crate) fn clear(&self) {
        self.bytes.borrow_mut().clear();
        self.after.borrow_mut().take();
    }

    /// Keeps `c` for after the commit.
    pub(crate) fn defer(&self, c: AttrsCheck) {
        *self.after.borrow_mut() = Some(c);
    }

    /// The check kept for after the commit, if any.
    pub(crate) fn take_deferred(&self) -> Option<AttrsCheck> {
        self.after.borrow_mut().take()
    }

    /// The out header and the body, as one buffer (empty if nothing was answered).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.bytes.borrow())
    }
}

pub(crate) const EIO: i32 = 5;

impl<'a> Reply<'a> {
    pub fn new(ch: &'a Channel, unique: u64) -> Reply<'a> {
        Reply {
            ch,
            unique,
            sent: false,
            ring: None,
        }
    }

    /// Where the answer goes when the request came through FUSE over io_uring.
    pub(crate) fn ring(&self) -> Option<&'a RingAnswer> {
        self.ring
    }

    /// The answer to a request that came through FUSE over io_uring.
    pub(crate) fn to_ring(ch: &'a Channel, unique: u64, ring: &'a RingAnswer) -> Reply<'a> {
        Reply {
            ch,
            unique,
            sent: false,
            ring: Some(ring),
        }
    }

    fn send(&mut self, error: i32, parts: &[&[u8]]) {
        self.sent = true;
        let len = OUT_HEADER_SIZE + parts.iter().map(|p| p.len()).sum::<usize>();
        let mut hdr = [0u8; OUT_HEADER_SIZE];
        hdr[..4].copy_from_slice(&(len as u32).to_ne_bytes());
        hdr[4..8].copy_from_slice(&(-error).to_ne_bytes());
        hdr[8..].copy_from_slice(&self.unique.to_ne_bytes());
        if let Some(r) = self.ring {
            let mut b = r.bytes.borrow_mut();
            b.clear();
            b.extend_from_slice(&hdr);
            for p in parts {
                b.extend_from_slice(p);
            }
            return;
        }
        let mut iov = Vec::with_capacity(parts.len() + 1);
        iov.push(IoSlice::new(&hdr));
        iov.extend(
            parts
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| IoSlice::new(p)),
        );
        if let Err(e) = self.ch.send(&iov) {
            eprintln!("ubtrfs: writing a reply to /dev/fuse failed: {e}");
        }
    }

    /// The channel the reply goes to (for notifications after it).
    pub fn channel(&self) -> &'a Channel {
        self.ch
    }

    /// Success with a body (possibly empty).
    pub fn ok(mut self, body: &[u8]) {
        self.send(0, &[body]);
    }

    pub fn ok_parts(mut self, parts: &[&[u8]]) {
        self.send(0, parts);
    }

    /// Failure with a positive errno.
    pub fn error(mut self, errno: i32) {
        self.send(errno.max(1), &[]);
    }

    /// For requests the kernel expects no answer to.
    pub fn none(mut self) {
        self.sent = true;
    }
}

/// FUSE notification codes (the server's messages to the kernel, unasked).
pub(crate) const NOTIFY_INVAL_INODE: i32 = 2;
pub(crate) const NOTIFY_INVAL_ENTRY: i32 = 3;

/// Sends a notification: an answer with `unique` 0 and the code where the errno goes.
pub(crate) fn notify(ch: &Channel, code: i32, parts: &[&[u8]]) {
    let len = OUT_HEADER_SIZE + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut hdr = [0u8; OUT_HEADER_SIZE];
    hdr[..4].copy_from_slice(&(len as u32).to_ne_bytes());
    hdr[4..8].copy_from_slice(&code.to_ne_bytes());
    let mut iov = vec![IoSlice::new(&hdr)];
    iov.extend(
        parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| IoSlice::new(p)),
    );
    if let Err(e) = ch.send(&iov) {
        eprintln!("ubtrfs: writing a notification to /dev/fuse failed: {e}");
    }
}

/// Tells the kernel to drop its cached attributes of `nodeid` and, from byte
/// `offset` on, its cached data (a negative offset keeps the data: attributes only,
/// which takes no inode lock in the kernel, so it is safe while a request of that
/// inode is being answered).
pub(crate) fn inval_inode(ch: &Channel, nodeid: u64, offset: i64) {
    inval_inode_range(ch, nodeid, offset, 0);
}

/// [`inval_inode`] of the cached data in `offset..offset + len` only (`len` 0: to
/// the end).
fn inval_inode_range(ch: &Channel, nodeid: u64, offset: i64, len: i64) {
    let mut i = Vec::with_capacity(24);
    i.extend_from_slice(&nodeid.to_ne_bytes());
    i.extend_from_slice(&offset.to_ne_bytes());
    i.extend_from_slice(&len.to_ne_bytes());
    notify(ch, NOTIFY_INVAL_INODE, &[&i]);
}

/// Tells the kernel, from a thread of its own, to drop its cached data of `nodeid`
/// in `offset..offset + len`. The kernel locks those pages and waits for their
/// write-back to end, which may be the very WRITE being answered: through io_uring
/// an answer is committed only after its handler returns, so the handler must not
/// wait for this.
pub(crate) fn inval_data_later(ch: &Channel, nodeid: u64, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    let Ok(own) = ch.try_clone() else {
        eprintln!("ubtrfs: cannot drop the kernel's cached data of node {nodeid}");
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("ubtrfs-notify".into())
        .spawn(move || inval_inode_range(&own, nodeid, offset, len));
    if let Err(e) = spawned {
        eprintln!("ubtrfs: cannot drop the kernel's cached data of node {nodeid}: {e}");
    }
}

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        if !self.sent {
            self.send(EIO, &[]);
        }
    }
}
