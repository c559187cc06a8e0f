//! Access times on a read-write mount: the server keeps them, as the kernel's VFS
//! does for btrfs (`touch_atime`), because the FUSE module marks every inode
//! S_NOATIME and leaves atime to the server. A READ or READDIR that reaches the
//! server updates the inode's atime when the mount's rule says so:
//!
//! * `relatime` (the default, as on the kernel): when atime is not newer than
//!   mtime or ctime, or is a day old;
//! * `strictatime`: on every access;
//! * `noatime`: never; `nodiratime`: never for directories.
//!
//! Never on a read-only mount, in a read-only subvolume (the kernel's
//! btrfs_update_time refuses there), or for an inode with the `A` flag
//! (BTRFS_INODE_NOATIME). Reads served from the kernel's page cache never reach
//! the server, so OPEN drops the cache when the next read must update atime
//! (`Atime::wants_read`): then that read arrives. A read at the end of file is
//! answered by the kernel without a request too, so an empty file is opened for
//! direct reads. Left as a difference: a read through a descriptor opened before
//! the file's last change may be served from the cache and update nothing.

use std::sync::atomic::{AtomicU8, Ordering};
use ubtrfs_format::consts::INODE_NOATIME;
use ubtrfs_format::items::{InodeItem, Timespec};

/// When reads update the access time (the mount options of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtimeMode {
    /// `noatime`: never.
    NoAtime,
    /// `relatime` (default): when atime <= mtime or ctime, or atime is a day old.
    Relatime,
    /// `strictatime`: on every read.
    StrictAtime,
}

/// The atime options of a mount: a mode and `nodiratime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtimeOptions {
    /// When files (and directories, unless `nodiratime`) get a new atime.
    pub mode: AtimeMode,
    /// Directories keep their atime (`nodiratime`).
    pub nodiratime: bool,
}

impl Default for AtimeOptions {
    fn default() -> AtimeOptions {
        AtimeOptions {
            mode: AtimeMode::Relatime,
            nodiratime: false,
        }
    }
}

/// The atime words of a mount option list, as mount(8) turns them into mount(2)
/// flags: each word sets or clears its flag (`atime` clears `noatime`, `norelatime`
/// clears `relatime`, ...), later words win. A remount from mount(8) lists the
/// mount's current options first, then the new ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtimeFlags {
    /// MS_NOATIME.
    pub noatime: bool,
    /// MS_RELATIME.
    pub relatime: bool,
    /// MS_STRICTATIME.
    pub strictatime: bool,
    /// MS_NODIRATIME.
    pub nodiratime: bool,
}

impl AtimeFlags {
    /// Reads one mount option word; false when it is not an atime option.
    pub fn parse_word(&mut self, word: &str) -> bool {
        match word {
            "noatime" => self.noatime = true,
            "atime" => self.noatime = false,
            "relatime" => self.relatime = true,
            "norelatime" => self.relatime = false,
            "strictatime" => self.strictatime = true,
            "nostrictatime" => self.strictatime = false,
            "nodiratime" => self.nodiratime = true,
            "diratime" => self.nodiratime = false,
            // lazytime only delays writing the inode; the transaction does that here.
            "lazytime" | "nolazytime" => {}
            _ => return false,
        }
        true
    }

    /// Whether any of the four flags is set: a remount without one keeps the
    /// mount's atime options, as the kernel's.
    pub fn any(self) -> bool {
        self.noatime || self.relatime || self.strictatime || self.nodiratime
    }

    /// What the kernel makes of the flags (path_mount): relatime unless noatime,
    /// and strictatime overrides both.
    pub fn options(self) -> AtimeOptions {
        AtimeOptions {
            mode: if self.strictatime {
                AtimeMode::StrictAtime
            } else if self.noatime {
                AtimeMode::NoAtime
            } else {
                AtimeMode::Relatime
            },
            nodiratime: self.nodiratime,
        }
    }
}

impl AtimeOptions {
    fn encode(self) -> u8 {
        let m = match self.mode {
            AtimeMode::NoAtime => 0,
            AtimeMode::Relatime => 1,
            AtimeMode::StrictAtime => 2,
        };
        m | if self.nodiratime { 4 } else { 0 }
    }

    fn decode(b: u8) -> AtimeOptions {
        AtimeOptions {
            mode: match b & 3 {
                0 => AtimeMode::NoAtime,
                2 => AtimeMode::StrictAtime,
                _ => AtimeMode::Relatime,
            },
            nodiratime: b & 4 != 0,
        }
    }
}

/// A day, relatime's longest wait between updates.
const RELATIME_MAX_AGE_SECS: i64 = 24 * 60 * 60;

/// The mount's atime rule; changed by a remount while serving.
#[derive(Debug)]
pub(crate) struct Atime {
    options: AtomicU8,
}

fn key(t: Timespec) -> (i64, u32) {
    (t.sec, t.nsec)
}

impl Atime {
    pub(crate) fn new(o: AtimeOptions) -> Atime {
        Atime {
            options: AtomicU8::new(o.encode()),
        }
    }

    pub(crate) fn set(&self, o: AtimeOptions) {
        self.options.store(o.encode(), Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> AtimeOptions {
        AtimeOptions::decode(self.options.load(Ordering::Relaxed))
    }

    /// Whether an access at `now` gives `inode` a new atime (the VFS's
    /// atime_needs_update with relatime_need_update, for this mount's options).
    pub(crate) fn needs_update(&self, inode: &InodeItem, is_dir: bool, now: Timespec) -> bool {
        let o = self.get();
        if inode.flags & INODE_NOATIME != 0 || (is_dir && o.nodiratime) {
            return false;
        }
        let due = match o.mode {
            AtimeMode::NoAtime => false,
            AtimeMode::StrictAtime => true,
            AtimeMode::Relatime => {
                key(inode.mtime) >= key(inode.atime)
                    || key(inode.ctime) >= key(inode.atime)
                    || now.sec - inode.atime.sec >= RELATIME_MAX_AGE_SECS
            }
        };
        due && key(inode.atime) != key(now)
    }

    /// Whether the next read of this file will update its atime: then OPEN must not
    /// let the kernel keep its cached pages, or that read never reaches us.
    pub(crate) fn wants_read(&self, inode: &InodeItem, now: Timespec) -> bool {
        self.needs_update(inode, false, now)
    }
}

/// ubtrfs's own ioctl, sent by `mount -o remount` (through `ubtrfs mount`) after
/// the kernel switched the mount's flags: the server learns what it must know
/// itself (read-only: no more atime updates, and a commit; the atime options).
/// `_IOW('u', 1, [u8; 8])`: byte 0 read-only, byte 1 whether atime options
/// follow, byte 2 them.
pub(crate) const UBTRFS_IOC_REMOUNT: u32 = 0x4008_7501;

/// What a remount ioctl says.
pub(crate) struct Remount {
    pub(crate) read_only: bool,
    pub(crate) atime: Option<AtimeOptions>,
}

pub(crate) fn parse_remount(b: &[u8]) -> Option<Remount> {
    let b = b.get(..3)?;
    Some(Remount {
        read_only: b[0] != 0,
        atime: (b[1] != 0).then(|| AtimeOptions::decode(b[2])),
    })
}

/// The client side, for `ubtrfs mount -o remount`.
pub mod client {
    use super::AtimeOptions;
    use std::fs::File;
    use std::io;

    /// Tells the server of the mount at `dir` (open) that it was remounted: read-only
    /// or not, and the atime options if the remount named any.
    pub fn remounted(dir: &File, read_only: bool, atime: Option<AtimeOptions>) -> io::Result<()> {
        let mut b = [0u8; 8];
        b[0] = read_only as u8;
        if let Some(a) = atime {
            b[1] = 1;
            b[2] = a.encode();
        }
        crate::subvol_ops::client::ioctl(dir, super::UBTRFS_IOC_REMOUNT, &mut b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(sec: i64) -> Timespec {
        Timespec { sec, nsec: 0 }
    }

    fn inode(atime: i64, mtime: i64, ctime: i64) -> InodeItem {
        InodeItem {
            atime: ts(atime),
            mtime: ts(mtime),
            ctime: ts(ctime),
            ..Default::default()
        }
    }

    #[test]
    fn relatime_updates_once_after_a_change_then_daily() {
        let a = Atime::new(AtimeOptions::default());
        // Written after its last access: the next read updates.
        assert!(a.needs_update(&inode(100, 100, 100), false, ts(200)));
        assert!(a.needs_update(&inode(100, 50, 150), false, ts(200)));
        // Read since: no update until a day has passed.
        assert!(!a.needs_update(&inode(200, 100, 100), false, ts(300)));
        assert!(a.needs_update(&inode(200, 100, 100), false, ts(200 + 86_400)));
        // Same time as now: nothing to change.
        assert!(!a.needs_update(&inode(200, 200, 200), false, ts(200)));
    }

    #[test]
    fn options_words_and_flags() {
        let mut w = AtimeFlags::default();
        assert!(w.parse_word("strictatime") && w.parse_word("nodiratime"));
        assert!(!w.parse_word("compress"));
        let o = w.options();
        assert_eq!(o.mode, AtimeMode::StrictAtime);
        let a = Atime::new(o);
        assert_eq!(a.get(), o);
        assert!(a.needs_update(&inode(300, 100, 100), false, ts(301)));
        assert!(!a.needs_update(&inode(300, 100, 100), true, ts(301)));
        let mut noatime = inode(100, 100, 100);
        noatime.flags = INODE_NOATIME;
        assert!(!a.needs_update(&noatime, false, ts(301)));
        // mount(8)'s remount of a noatime mount with relatime: the current options
        // come first, so noatime stays, as on the kernel.
        let mut w = AtimeFlags::default();
        for word in ["rw", "noatime", "relatime"] {
            w.parse_word(word);
        }
        assert_eq!(w.options().mode, AtimeMode::NoAtime);
        a.set(w.options());
        assert!(!a.needs_update(&inode(100, 100, 100), false, ts(301)));
        assert!(w.parse_word("atime"));
        assert_eq!(w.options().mode, AtimeMode::Relatime);
        assert!(!AtimeFlags::default().any());
    }
}
