//! Devices: every byte ubtrfs reads or writes goes through [`Device`], so tests can
//! substitute a device that records, drops or tears writes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// A block device or image file: every byte the engine reads or writes goes through
/// this trait, so tests substitute devices that record, drop or tear writes.
pub trait Device: Send + Sync + std::fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`; short reads are errors.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes all of `buf` at byte `offset`; durable only after [`Device::flush`].
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// For messages.
    fn name(&self) -> String;
    /// Tells the device that `len` bytes at `offset` hold nothing (FITRIM): a hole
    /// punched in an image file, a discard on a block device. What reads there
    /// afterwards is unspecified (zeros on files). Devices that cannot say
    /// Unsupported.
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// Shares `len` bytes of `src` at `src_offset` into this device at `offset`
    /// without copying (reflink), where the host filesystem can; all offsets and
    /// `len` block aligned. Devices that cannot say Unsupported.
    fn clone_from_file(
        &self,
        _src: &File,
        _src_offset: u64,
        _offset: u64,
        _len: u64,
    ) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// A regular file or block device.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size: u64,
}

impl FileDevice {
    /// Opens an image file or block device, read-only unless `writable`. A block
    /// device opened for writing is claimed exclusively (O_EXCL), as the kernel's
    /// btrfs claims its devices: while it is held, the kernel's mount of it, a
    /// second exclusive opener (mkfs.btrfs, btrfs check) and another ubtrfs writer
    /// get EBUSY. An image file has no such claim (the advisory lock of
    /// [`lock_exclusive`] keeps other ubtrfs processes off it, nothing keeps a
    /// kernel loop mount of the same file away).
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
        let mut how = std::fs::OpenOptions::new();
        how.read(true).write(writable);
        if writable && block {
            how.custom_flags(libc::O_EXCL);
        }
        let file = how.open(path).map_err(|e| {
            if writable && block && e.raw_os_error() == Some(libc::EBUSY) {
                // The caller names the device.
                io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    "device busy: mounted, or held open exclusively by another program",
                )
            } else {
                e
            }
        })?;
        let size = device_size(&file)?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            size,
        })
    }
}

/// Writes at least this large (file data runs; tree blocks and superblocks are
/// smaller) start their write-back at once.
const WRITE_BEHIND_BYTES_MIN: usize = 1 << 20;

impl FileDevice {
    /// Starts writing `len` bytes at `offset` back to the disk without waiting
    /// (sync_file_range with SYNC_FILE_RANGE_WRITE). A hint, not a durability
    /// point: the commit's flush still waits for everything. Without it the host
    /// keeps a large data write dirty in its page cache until the commit's flush,
    /// which then writes all of it while the writer waits; started now, the disk
    /// works while more data arrives (the kernel's btrfs starts write-back of a
    /// file's dirty pages as they accumulate, and its loop device passes them on).
    fn write_behind(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: sync_file_range only reads its integer arguments; the descriptor
        // is open for the call's duration. Its result is ignored: a device that
        // cannot start write-back early (a pipe, an old kernel) writes at the flush.
        unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
}

fn device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    // Block devices report 0 in metadata; seeking to the end works for both.
    let mut f = file;
    let end = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(end)
}

impl Device for FileDevice {
    fn clone_from_file(
        &self,
        src: &File,
        src_offset: u64,
        offset: u64,
        len: u64,
    ) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        #[repr(C)]
        struct FileCloneRange {
            src_fd: i64,
            src_offset: u64,
            src_length: u64,
            dest_offset: u64,
        }
        // _IOW(0x94, 13, struct file_clone_range)
        const FICLONERANGE: libc::c_ulong = 0x4020_940d;
        let arg = FileCloneRange {
            src_fd: src.as_raw_fd() as i64,
            src_offset,
            src_length: len,
            dest_offset: offset,
        };
        // SAFETY: FICLONERANGE reads one file_clone_range from the pointer, which is
        // valid and correctly laid out (repr(C)) for the duration of the call; both
        // descriptors are open for the call's duration.
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                FICLONERANGE as _,
                &arg as *const FileCloneRange,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileTypeExt;
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        if len == 0 {
            return Ok(());
        }
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let r = if self.file.metadata()?.file_type().is_block_device() {
            // BLKDISCARD, _IO(0x12, 119): a range of two u64s.
            const BLKDISCARD: libc::c_ulong = 0x1277;
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64s from the pointer, which points at
            // `range` for the call's duration; the descriptor is open.
            unsafe { libc::ioctl(self.file.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) }
        } else {
            // SAFETY: fallocate takes only integers; the descriptor is open.
            unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    n,
                )
            }
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) => {
                Err(io::Error::new(io::ErrorKind::Unsupported, e))
            }
            _ => Err(e),
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > self.size)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at {} beyond the end of {} ({} bytes)",
                    buf.len(),
                    offset,
                    self.path.display(),
                    self.size
                ),
            ));
        }
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        if buf.len() >= WRITE_BEHIND_BYTES_MIN {
            self.write_behind(offset, buf.len() as u64);
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// An in-memory device (tests, fuzzing).
#[derive(Debug, Default)]
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
    name: String,
}

impl MemDevice {
    /// A device holding `data`, named `name` in messages.
    pub fn new(data: Vec<u8>, name: &str) -> Arc<MemDevice> {
        Arc::new(MemDevice {
            data: RwLock::new(data),
            name: name.to_string(),
        })
    }
    /// A copy of the device's bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().map(|d| d.clone()).unwrap_or_default()
    }
}

impl Device for MemDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.data.read().map_err(|_| io::Error::other("poisoned"))?;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| d.get(start..end))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read of {} bytes at {offset} beyond the end", buf.len()),
                )
            })?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut d = self
            .data
            .write()
            .map_err(|_| io::Error::other("poisoned"))?;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let end = start + buf.len();
        if end > d.len() {
            d.resize(end, 0);
        }
        d[start..end].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut d = self
            .data
            .write()
            .map_err(|_| io::Error::other("poisoned"))?;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let n = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        d.get_mut(start..start.saturating_add(n))
            .ok_or(io::ErrorKind::InvalidInput)?
            .fill(0);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.data.read().map(|d| d.len() as u64).unwrap_or(0)
    }
    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Refuses to write a device or image file the kernel has mounted (directly or
/// through a loop device).
pub fn refuse_if_mounted(path: &Path) -> io::Result<()> {
    let canon = std::fs::canonicalize(path)?;
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Ok(());
    };
    for line in info.lines() {
        let Some((_, rest)) = line.split_once(" - ") else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (Some(fstype), Some(source)) = (f.next(), f.next()) else {
            continue;
        };
        if fstype != "btrfs" {
            continue;
        }
        let src = std::fs::canonicalize(source).unwrap_or_else(|_| PathBuf::from(source));
        let mut backing = None;
        if let Some(name) = src.file_name().and_then(|n| n.to_str()) {
            if name.starts_with("loop") {
                let bf = format!("/sys/block/{name}/loop/backing_file");
                backing = std::fs::read_to_string(bf)
                    .ok()
                    .map(|s| PathBuf::from(s.trim_end()));
            }
        }
        if src == canon || backing.as_ref() == Some(&canon) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} is mounted (by the kernel, as {}); unmount it before writing",
                    path.display(),
                    source
                ),
            ));
        }
    }
    Ok(())
}

/// Takes an exclusive advisory lock so two ubtrfs writers (or a writer and a ubtrfs
/// mount, which holds a shared lock) never share an image.
pub fn lock_exclusive(path: &Path) -> io::Result<File> {
    let f = File::open(path)?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "{} is in use by another ubtrfs process (writer or mount)",
                path.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// A random (version 4) UUID from /dev/urandom, for fsids, device, chunk-tree and
/// subvolume UUIDs.
pub(crate) fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut u);
    }
    if u == [0u8; 16] {
        // No urandom: derive from the clock and pid (uniqueness, not secrecy).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        u[..8].copy_from_slice(&(t.as_nanos() as u64).to_le_bytes());
        u[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}
