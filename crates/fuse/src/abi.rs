//! The FUSE kernel protocol (`/dev/fuse`, ABI 7.x) as far as a read-only filesystem
//! needs it: opcodes, flags, request decoding and reply encoding.
//!
//! Structures are encoded field by field in native byte order (the protocol is
//! host-endian), so no `unsafe` transmutes are needed. Layouts follow the kernel's
//! UAPI header `linux/fuse.h`.

/// Protocol version we speak. 7.39 adds FUSE_STATX (birth time).
pub(crate) const KERNEL_VERSION: u32 = 7;
pub(crate) const KERNEL_MINOR_VERSION: u32 = 39;

/// The node id of the mount's root directory.
pub(crate) const ROOT_ID: u64 = 1;

/// Request opcodes (the whole table of `linux/fuse.h`, used or not).
#[allow(dead_code)]
pub(crate) mod op {
    pub(crate) const LOOKUP: u32 = 1;
    pub(crate) const FORGET: u32 = 2;
    pub(crate) const GETATTR: u32 = 3;
    pub(crate) const SETATTR: u32 = 4;
    pub(crate) const READLINK: u32 = 5;
    pub(crate) const SYMLINK: u32 = 6;
    pub(crate) const MKNOD: u32 = 8;
    pub(crate) const MKDIR: u32 = 9;
    pub(crate) const UNLINK: u32 = 10;
    pub(crate) const RMDIR: u32 = 11;
    pub(crate) const RENAME: u32 = 12;
    pub(crate) const LINK: u32 = 13;
    pub(crate) const OPEN: u32 = 14;
    pub(crate) const READ: u32 = 15;
    pub(crate) const WRITE: u32 = 16;
    pub(crate) const STATFS: u32 = 17;
    pub(crate) const RELEASE: u32 = 18;
    pub(crate) const FSYNC: u32 = 20;
    pub(crate) const SETXATTR: u32 = 21;
    pub(crate) const GETXATTR: u32 = 22;
    pub(crate) const LISTXATTR: u32 = 23;
    pub(crate) const REMOVEXATTR: u32 = 24;
    pub(crate) const FLUSH: u32 = 25;
    pub(crate) const INIT: u32 = 26;
    pub(crate) const OPENDIR: u32 = 27;
    pub(crate) const READDIR: u32 = 28;
    pub(crate) const RELEASEDIR: u32 = 29;
    pub(crate) const FSYNCDIR: u32 = 30;
    pub(crate) const GETLK: u32 = 31;
    pub(crate) const SETLK: u32 = 32;
    pub(crate) const SETLKW: u32 = 33;
    pub(crate) const ACCESS: u32 = 34;
    pub(crate) const CREATE: u32 = 35;
    pub(crate) const INTERRUPT: u32 = 36;
    pub(crate) const BMAP: u32 = 37;
    pub(crate) const DESTROY: u32 = 38;
    pub(crate) const IOCTL: u32 = 39;
    pub(crate) const POLL: u32 = 40;
    pub(crate) const BATCH_FORGET: u32 = 42;
    pub(crate) const FALLOCATE: u32 = 43;
    pub(crate) const READDIRPLUS: u32 = 44;
    pub(crate) const RENAME2: u32 = 45;
    pub(crate) const LSEEK: u32 = 46;
    pub(crate) const COPY_FILE_RANGE: u32 = 47;
    pub(crate) const SYNCFS: u32 = 50;
    pub(crate) const TMPFILE: u32 = 51;
    pub(crate) const STATX: u32 = 52;
}

/// INIT flags (fuse_init_in/out `flags`).
#[allow(dead_code)]
pub(crate) mod init {
    pub(crate) const ASYNC_READ: u32 = 1 << 0;
    /// LOOKUP of "." and ".." by node id: file handles outlive the kernel's inodes.
    pub(crate) const EXPORT_SUPPORT: u32 = 1 << 4;
    pub(crate) const BIG_WRITES: u32 = 1 << 5;
    pub(crate) const DONT_MASK: u32 = 1 << 6;
    pub(crate) const DO_READDIRPLUS: u32 = 1 << 13;
    pub(crate) const READDIRPLUS_AUTO: u32 = 1 << 14;
    pub(crate) const NO_OPEN_SUPPORT: u32 = 1 << 17;
    pub(crate) const PARALLEL_DIROPS: u32 = 1 << 18;
    pub(crate) const POSIX_ACL: u32 = 1 << 20;
    pub(crate) const MAX_PAGES: u32 = 1 << 22;
    pub(crate) const CACHE_SYMLINKS: u32 = 1 << 23;
    pub(crate) const NO_OPENDIR_SUPPORT: u32 = 1 << 24;
    /// The server clears setuid/setgid on write, truncate and chown (killpriv.rs).
    pub(crate) const HANDLE_KILLPRIV_V2: u32 = 1 << 28;
    /// SETXATTR carries flags of its own (FUSE_SETXATTR_ACL_KILL_SGID).
    pub(crate) const SETXATTR_EXT: u32 = 1 << 29;
    /// A second word of flags follows (fuse_init_in/out `flags2`).
    pub(crate) const INIT_EXT: u32 = 1 << 30;
    /// In `flags2`: FUSE over io_uring (FUSE_OVER_IO_URING, bit 41 of the whole).
    pub(crate) const FLAGS2_OVER_IO_URING: u32 = 1 << (41 - 32);
    /// In `flags2`: shared mmap of a file opened with FOPEN_DIRECT_IO
    /// (FUSE_DIRECT_IO_ALLOW_MMAP, bit 36 of the whole).
    pub(crate) const FLAGS2_DIRECT_IO_ALLOW_MMAP: u32 = 1 << (36 - 32);
}

/// fuse_open_out `open_flags`.
pub(crate) const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub(crate) const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub(crate) const FOPEN_CACHE_DIR: u32 = 1 << 3;

pub(crate) const IN_HEADER_SIZE: usize = 40;
pub(crate) const OUT_HEADER_SIZE: usize = 16;
/// fuse_attr
pub(crate) const ATTR_SIZE: usize = 88;
/// fuse_entry_out
pub(crate) const ENTRY_OUT_SIZE: usize = 40 + ATTR_SIZE;
/// fuse_dirent without its name
pub(crate) const DIRENT_SIZE: usize = 24;

/// STATX_* mask bits (statx(2)).
pub(crate) const STATX_BASIC_STATS: u32 = 0x7ff;
pub(crate) const STATX_BTIME: u32 = 0x800;

/// The request header every message from the kernel starts with.
#[derive(Clone, Copy, Debug)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// Reads little fixed-size fields off a request body; every read is bounds checked
/// (a short body yields None, answered with EIO by the caller).
#[derive(Clone, Copy)]
pub(crate) struct Args<'a> {
    b: &'a [u8],
}

impl<'a> Args<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Args<'a> {
        Args { b }
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.take(2)?.try_into().ok().map(u16::from_ne_bytes)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_ne_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_ne_bytes)
    }
    pub(crate) fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    /// A NUL-terminated name (without the NUL).
    pub(crate) fn cstr(&mut self) -> Option<&'a [u8]> {
        let n = self.b.iter().position(|&c| c == 0)?;
        let s = self.take(n)?;
        self.take(1)?;
        Some(s)
    }
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.b
    }
}

pub(crate) fn parse_header(buf: &[u8]) -> Option<(InHeader, &[u8])> {
    let mut a = Args::new(buf);
    let h = InHeader {
        len: a.u32()?,
        opcode: a.u32()?,
        unique: a.u64()?,
        nodeid: a.u64()?,
        uid: a.u32()?,
        gid: a.u32()?,
        pid: a.u32()?,
    };
    a.u16()?; // total_extlen
    a.u16()?; // padding
    let end = (h.len as usize).min(buf.len());
    Some((h, buf.get(IN_HEADER_SIZE..end)?))
}

/// Appends native-endian fields to a reply body.
#[derive(Default)]
pub(crate) struct Out {
    pub buf: Vec<u8>,
}

impl Out {
    pub(crate) fn with_capacity(n: usize) -> Out {
        Out {
            buf: Vec::with_capacity(n),
        }
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub(crate) fn zeros(&mut self, n: usize) -> &mut Self {
        self.buf.resize(self.buf.len() + n, 0);
        self
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// What a file looks like to the kernel (fuse_attr / fuse_statx contents).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// (seconds, nanoseconds); seconds may be negative (before 1970).
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub btime: Option<(i64, u32)>,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub blksize: u32,
    /// statx attributes (STATX_ATTR_*) and the mask of those the fs supports.
    pub attributes: u64,
    pub attributes_mask: u64,
}

impl Attr {
    /// The kernel's 32-bit dev_t encoding (new_encode_dev), as fuse_attr.rdev carries it.
    pub(crate) fn rdev32(&self) -> u32 {
        let (ma, mi) = (self.rdev_major, self.rdev_minor);
        (mi & 0xff) | ((ma & 0xfff) << 8) | ((mi & !0xff) << 12)
    }

    /// fuse_attr
    pub(crate) fn encode(&self, o: &mut Out) {
        o.u64(self.ino)
            .u64(self.size)
            .u64(self.blocks)
            .i64(self.atime.0)
            .i64(self.mtime.0)
            .i64(self.ctime.0)
            .u32(self.atime.1)
            .u32(self.mtime.1)
            .u32(self.ctime.1)
            .u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u32(self.rdev32())
            .u32(self.blksize)
            .u32(0);
    }

    /// fuse_statx (256 bytes)
    pub(crate) fn encode_statx(&self, o: &mut Out) {
        let start = o.len();
        let mask = STATX_BASIC_STATS | if self.btime.is_some() { STATX_BTIME } else { 0 };
        let t = |o: &mut Out, (s, ns): (i64, u32)| {
            o.i64(s).u32(ns).u32(0);
        };
        o.u32(mask)
            .u32(self.blksize)
            .u64(self.attributes)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u16(self.mode as u16)
            .u16(0)
            .u64(self.ino)
            .u64(self.size)
            .u64(self.blocks)
            .u64(self.attributes_mask);
        t(o, self.atime);
        t(o, self.btime.unwrap_or((0, 0)));
        t(o, self.ctime);
        t(o, self.mtime);
        o.u32(self.rdev_major).u32(self.rdev_minor).u32(0).u32(0);
        o.zeros(14 * 8);
        debug_assert_eq!(o.len() - start, 256);
    }
}

/// Splits a TTL into the (seconds, nanoseconds) pair the protocol uses.
pub(crate) fn ttl_parts(d: std::time::Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// fuse_entry_out: `nodeid` (the kernel's handle) and `attr.ino` (st_ino) are separate.
pub(crate) fn encode_entry(
    o: &mut Out,
    nodeid: u64,
    generation: u64,
    ttl: std::time::Duration,
    attr: &Attr,
) {
    let (s, ns) = ttl_parts(ttl);
    o.u64(nodeid).u64(generation).u64(s).u64(s).u32(ns).u32(ns);
    attr.encode(o);
}

/// A negative entry: the name does not exist, and the kernel may remember that.
pub(crate) fn encode_negative_entry(o: &mut Out, ttl: std::time::Duration) {
    let (s, ns) = ttl_parts(ttl);
    o.u64(0).u64(0).u64(s).u64(0).u32(ns).u32(0);
    o.zeros(ATTR_SIZE);
}

/// One fuse_dirent, padded to 8 bytes. `off` is where the next readdir resumes.
pub(crate) fn encode_dirent(o: &mut Out, ino: u64, off: u64, dtype: u32, name: &[u8]) {
    o.u64(ino)
        .u64(off)
        .u32(name.len() as u32)
        .u32(dtype)
        .bytes(name);
    o.zeros(dirent_padding(name.len()));
}

pub(crate) fn dirent_padding(namelen: usize) -> usize {
    (8 - (DIRENT_SIZE + namelen) % 8) % 8
}

pub(crate) fn dirent_size(namelen: usize) -> usize {
    DIRENT_SIZE + namelen + dirent_padding(namelen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let a = Attr::default();
        let mut o = Out::default();
        a.encode(&mut o);
        assert_eq!(o.len(), ATTR_SIZE);
        let mut o = Out::default();
        a.encode_statx(&mut o);
        assert_eq!(o.len(), 256);
        let mut o = Out::default();
        encode_entry(&mut o, 1, 0, std::time::Duration::from_secs(1), &a);
        assert_eq!(o.len(), ENTRY_OUT_SIZE);
        let mut o = Out::default();
        encode_negative_entry(&mut o, std::time::Duration::from_secs(1));
        assert_eq!(o.len(), ENTRY_OUT_SIZE);
        for n in 1..20 {
            let mut o = Out::default();
            encode_dirent(&mut o, 1, 2, 3, &vec![b'x'; n]);
            assert_eq!(o.len(), dirent_size(n));
            assert_eq!(o.len() % 8, 0);
        }
    }

    #[test]
    fn rdev_encoding_matches_glibc_low_bits() {
        // chr 300:70000 and blk 259:1048575 from the golden images.
        for (ma, mi) in [(1u32, 3u32), (300, 70000), (7, 200), (259, 1048575)] {
            let a = Attr {
                rdev_major: ma,
                rdev_minor: mi,
                ..Default::default()
            };
            let glibc = ((ma as u64 & 0xfff) << 8)
                | ((ma as u64 & !0xfff) << 32)
                | (mi as u64 & 0xff)
                | ((mi as u64 & !0xff) << 12);
            assert_eq!(a.rdev32() as u64, glibc);
        }
    }

    #[test]
    fn header_roundtrip() {
        let mut o = Out::default();
        o.u32(45)
            .u32(op::LOOKUP)
            .u64(7)
            .u64(1)
            .u32(0)
            .u32(0)
            .u32(9)
            .u16(0)
            .u16(0);
        o.bytes(b"abc\0");
        let (h, body) = parse_header(&o.buf).expect("header");
        assert_eq!(h.opcode, op::LOOKUP);
        assert_eq!(h.unique, 7);
        assert_eq!(body, b"abc\0");
        assert_eq!(Args::new(body).cstr(), Some(&b"abc"[..]));
        assert!(parse_header(&o.buf[..10]).is_none());
    }
}
