//! The `/dev/fuse` connection: mounting (mount(2) as root, `fusermount3` otherwise),
//! reading requests, writing replies, unmounting.

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Shown as the mount's source in /proc/mounts (`fsname`).
    pub fsname: String,
    /// Mount type becomes `fuse.<subtype>`; empty: plain `fuse` (what fstests'
    /// FSTYP=fuse expects to find in /proc/mounts).
    pub subtype: String,
    /// Let other users in (`allow_other`; permissions are still checked).
    pub allow_other: bool,
    /// Keep setuid bits working (FUSE defaults to nosuid).
    pub suid: bool,
    /// Keep device nodes working (FUSE defaults to nodev).
    pub dev: bool,
    /// Mount read-only (MS_RDONLY), as `-o ro`.
    pub read_only: bool,
    /// Shown in /proc/mounts as the kernel shows them (MS_NOATIME, MS_STRICTATIME,
    /// MS_NODIRATIME); the server applies them itself (module `atime`).
    pub atime: crate::AtimeOptions,
    /// The VFS's own flags (noexec, sync, dirsync, nosymfollow): the kernel applies
    /// them to the FUSE mount as to any other.
    pub vfs: VfsFlags,
}

/// Mount flags that the VFS enforces by itself, whatever the filesystem: the
/// server only passes them to mount(2) (or fusermount3) and remount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VfsFlags {
    /// `noexec` (MS_NOEXEC): nothing on the mount may be executed.
    pub noexec: bool,
    /// `sync` (MS_SYNCHRONOUS): every write is synchronous; the kernel follows each
    /// write with an FSYNC request.
    pub synchronous: bool,
    /// `dirsync` (MS_DIRSYNC).
    pub dirsync: bool,
    /// `nosymfollow` (MS_NOSYMFOLLOW): path walks do not follow symlinks.
    pub nosymfollow: bool,
}

/// MS_NOSYMFOLLOW (Linux 5.10), which nix's MsFlags lacks.
const MS_NOSYMFOLLOW: MsFlags = MsFlags::from_bits_retain(256);

impl VfsFlags {
    /// Takes a mount option word that names one of these flags (or its opposite:
    /// exec, async, symfollow); false if `word` is not one.
    pub fn parse_word(&mut self, word: &str) -> bool {
        match word {
            "noexec" | "exec" => self.noexec = word == "noexec",
            "sync" | "async" => self.synchronous = word == "sync",
            "dirsync" => self.dirsync = true,
            "nosymfollow" | "symfollow" => self.nosymfollow = word == "nosymfollow",
            _ => return false,
        }
        true
    }

    /// The mount(2) flags.
    pub fn ms_flags(self) -> MsFlags {
        let mut f = MsFlags::empty();
        for (set, flag) in [
            (self.noexec, MsFlags::MS_NOEXEC),
            (self.synchronous, MsFlags::MS_SYNCHRONOUS),
            (self.dirsync, MsFlags::MS_DIRSYNC),
            (self.nosymfollow, MS_NOSYMFOLLOW),
        ] {
            if set {
                f |= flag;
            }
        }
        f
    }

    /// The words fusermount3 takes for them.
    fn words(self) -> impl Iterator<Item = &'static str> {
        [
            (self.noexec, "noexec"),
            (self.synchronous, "sync"),
            (self.dirsync, "dirsync"),
            (self.nosymfollow, "nosymfollow"),
        ]
        .into_iter()
        .filter_map(|(set, w)| set.then_some(w))
    }
}

/// A mounted FUSE connection.
#[derive(Debug)]
pub struct Channel {
    dev: File,
    mountpoint: PathBuf,
    /// Mounted by fusermount3 (unmount through it too).
    via_fusermount: bool,
}

impl Channel {
    /// Mounts a FUSE filesystem at `mountpoint` and returns the connection. Nothing is
    /// served until the caller answers the kernel's INIT request.
    pub fn mount(mountpoint: &Path, o: &MountOptions) -> io::Result<Channel> {
        if nix::unistd::geteuid().is_root() {
            match mount_direct(mountpoint, o) {
                Ok(dev) => {
                    return Ok(Channel {
                        dev,
                        mountpoint: mountpoint.to_path_buf(),
                        via_fusermount: false,
                    })
                }
                // In a user namespace without the capability: fall back.
                Err(e) if e.raw_os_error() == Some(libc_eperm()) => {}
                Err(e) => return Err(e),
            }
        }
        let dev = mount_fusermount(mountpoint, o)?;
        Ok(Channel {
            dev,
            mountpoint: mountpoint.to_path_buf(),
            via_fusermount: true,
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Reads one request. Ok(None): the filesystem was unmounted (ENODEV), or its
    /// connection aborted (ECONNABORTED: the kernel says so instead of ENODEV when
    /// `fc->aborted` is set, e.g. through /sys/fs/fuse/connections/N/abort; CI saw
    /// it once at an ordinary unmount). Either way no request comes any more, and
    /// the server ends as at an unmount: it commits and releases the image.
    /// Another handle on the same connection (a dup of the descriptor), for a
    /// thread that sends notifications on its own.
    pub(crate) fn try_clone(&self) -> io::Result<Channel> {
        Ok(Channel {
            dev: self.dev.try_clone()?,
            mountpoint: self.mountpoint.clone(),
            via_fusermount: self.via_fusermount,
        })
    }

    /// The /dev/fuse descriptor (FUSE over io_uring names it in its commands).
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.dev.as_raw_fd()
    }

    pub fn receive(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match (&self.dev).read(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) => match Errno::from_raw(e.raw_os_error().unwrap_or(0)) {
                    // ENOENT: the request was interrupted before we read it.
                    Errno::EINTR | Errno::EAGAIN | Errno::ENOENT => continue,
                    Errno::ENODEV | Errno::ECONNABORTED => return Ok(None),
                    _ => return Err(e),
                },
            }
        }
    }

    /// Writes one reply (all parts in one writev, as the protocol requires).
    pub fn send(&self, parts: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        match (&self.dev).write_vectored(parts) {
            Ok(n) if n == total => Ok(()),
            Ok(n) => Err(io::Error::other(format!(
                "short write to /dev/fuse ({n} of {total} bytes)"
            ))),
            Err(e) => match Errno::from_raw(e.raw_os_error().unwrap_or(0)) {
                // The request was interrupted or the fs is going away: nobody waits.
                Errno::ENOENT | Errno::ENODEV => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// Unmounts (lazily if busy). The serving threads then see ENODEV and stop.
    pub fn unmount(&self) -> io::Result<()> {
        unmount(&self.mountpoint, self.via_fusermount)
    }
}

fn libc_eperm() -> i32 {
    Errno::EPERM as i32
}

/// Unmounts a FUSE mountpoint: umount(2) as root, `fusermount3 -u` otherwise; a busy
/// mount is detached lazily (it goes away when its last user does).
pub(crate) fn unmount(mountpoint: &Path, via_fusermount: bool) -> io::Result<()> {
    if !via_fusermount && nix::unistd::geteuid().is_root() {
        return match nix::mount::umount2(mountpoint, MntFlags::empty()) {
            Ok(()) => Ok(()),
            Err(Errno::EBUSY) => {
                nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH).map_err(io::Error::from)
            }
            Err(e) => Err(e.into()),
        };
    }
    let ok = Command::new("fusermount3")
        .arg("-u")
        .arg("-q")
        .arg(mountpoint)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        return Ok(());
    }
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u {} failed ({st})",
            mountpoint.display()
        )))
    }
}

fn flags(o: &MountOptions) -> MsFlags {
    let mut f = if o.read_only {
        MsFlags::MS_RDONLY
    } else {
        MsFlags::empty()
    };
    if !o.suid {
        f |= MsFlags::MS_NOSUID;
    }
    if !o.dev {
        f |= MsFlags::MS_NODEV;
    }
    f | atime_ms_flags(o.atime) | o.vfs.ms_flags()
}

/// The mount(2) flags of these atime options.
pub fn atime_ms_flags(a: crate::AtimeOptions) -> MsFlags {
    let mut f = match a.mode {
        crate::AtimeMode::NoAtime => MsFlags::MS_NOATIME,
        crate::AtimeMode::Relatime => MsFlags::MS_RELATIME,
        crate::AtimeMode::StrictAtime => MsFlags::MS_STRICTATIME,
    };
    if a.nodiratime {
        f |= MsFlags::MS_NODIRATIME;
    }
    f
}

fn mount_direct(mountpoint: &Path, o: &MountOptions) -> io::Result<File> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| io::Error::new(e.kind(), format!("/dev/fuse: {e}")))?;
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        dev.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if o.allow_other {
        data.push_str(",allow_other");
    }
    let fstype = if o.subtype.is_empty() {
        "fuse".to_string()
    } else {
        format!("fuse.{}", o.subtype)
    };
    nix::mount::mount(
        Some(o.fsname.as_str()),
        mountpoint,
        Some(fstype.as_str()),
        flags(o),
        Some(data.as_str()),
    )
    .map_err(io::Error::from)?;
    Ok(dev)
}

/// Unprivileged mount: `fusermount3` (setuid root) mounts and passes the /dev/fuse
/// descriptor back over a socket (SCM_RIGHTS), named by `_FUSE_COMMFD`.
fn mount_fusermount(mountpoint: &Path, o: &MountOptions) -> io::Result<File> {
    use nix::sys::socket::{
        recvmsg, socketpair, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    };
    let (ours, theirs): (OwnedFd, OwnedFd) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::empty(),
    )?;
    // Only `theirs` may reach fusermount3.
    nix::fcntl::fcntl(
        ours.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    let mut opts = format!(
        "{},default_permissions,fsname={}",
        if o.read_only { "ro" } else { "rw" },
        o.fsname.replace(',', "\\,"),
    );
    if !o.subtype.is_empty() {
        opts.push_str(&format!(",subtype={}", o.subtype));
    }
    if !o.suid {
        opts.push_str(",nosuid");
    }
    if !o.dev {
        opts.push_str(",nodev");
    }
    if o.allow_other {
        opts.push_str(",allow_other");
    }
    for w in o.vfs.words() {
        opts.push(',');
        opts.push_str(w);
    }
    // fusermount3 (3.14) knows noatime but not strictatime or nodiratime: those the
    // server applies all the same; /proc/mounts then shows relatime.
    if o.atime.mode == crate::AtimeMode::NoAtime {
        opts.push_str(",noatime");
    }
    let mut mp = OsString::new();
    mp.push(mountpoint.as_os_str());
    let mut child = Command::new("fusermount3")
        .arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(&mp)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("fusermount3: {e}")))?;
    drop(theirs);
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let fd = {
        let msg = recvmsg::<()>(
            ours.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        );
        let mut got = None;
        if let Ok(msg) = msg {
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        got = fds.first().copied();
                    }
                }
            }
        }
        got
    };
    let status = child.wait()?;
    match fd {
        Some(fd) if status.success() => {
            use std::os::fd::FromRawFd;
            // SAFETY: `fd` was just received over SCM_RIGHTS: the kernel installed it
            // in our table for us alone, it is open, and nothing else owns it.
            Ok(unsafe { File::from_raw_fd(fd) })
        }
        _ => Err(io::Error::other(format!(
            "fusermount3 could not mount {} ({status})",
            Path::new(&mp).display()
        ))),
    }
}
