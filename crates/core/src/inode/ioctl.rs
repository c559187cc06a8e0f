//! The inode attribute flags of lsattr/chattr (FS_IOC_GETFLAGS / FS_IOC_SETFLAGS and
//! FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR): their mapping to the btrfs inode item
//! flags and the kernel's rules for changing them (fs/btrfs/ioctl.c,
//! btrfs_fileattr_get / btrfs_fileattr_set).
//!
//! Permission checks (owner or root; CAP_LINUX_IMMUTABLE for `i` and `a`) belong to
//! the VFS and are the caller's; what btrfs itself decides is here.

use crate::error::{Error, Result};
use crate::inode::props::XATTR_BTRFS_COMPRESSION;
use crate::transaction::Trans;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::Timespec;

/// FS_*_FL: the flags of FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (include/uapi/linux/fs.h).
pub mod fsflags {
    /// `S`: synchronous updates.
    pub const FS_SYNC_FL: u32 = 0x0000_0008;
    /// `c`: compress.
    pub const FS_COMPR_FL: u32 = 0x0000_0004;
    /// `i`: immutable.
    pub const FS_IMMUTABLE_FL: u32 = 0x0000_0010;
    /// `a`: append only.
    pub const FS_APPEND_FL: u32 = 0x0000_0020;
    /// `d`: no dump.
    pub const FS_NODUMP_FL: u32 = 0x0000_0040;
    /// `A`: no atime updates.
    pub const FS_NOATIME_FL: u32 = 0x0000_0080;
    /// `m`: do not compress.
    pub const FS_NOCOMP_FL: u32 = 0x0000_0400;
    /// `D`: synchronous directory updates.
    pub const FS_DIRSYNC_FL: u32 = 0x0001_0000;
    /// `V`: fs-verity.
    pub const FS_VERITY_FL: u32 = 0x0010_0000;
    /// `C`: no copy-on-write.
    pub const FS_NOCOW_FL: u32 = 0x0080_0000;
    /// `x`: DAX.
    pub const FS_DAX_FL: u32 = 0x0200_0000;
    /// `P`: project id inheritance.
    pub const FS_PROJINHERIT_FL: u32 = 0x2000_0000;
    /// The flags every filesystem's FS_IOC_FSSETXATTR can express (the VFS's
    /// FS_COMMON_FL).
    pub const FS_COMMON_FL: u32 = FS_SYNC_FL
        | FS_IMMUTABLE_FL
        | FS_APPEND_FL
        | FS_NODUMP_FL
        | FS_NOATIME_FL
        | FS_DAX_FL
        | FS_PROJINHERIT_FL;

    /// FS_XFLAG_*: struct fsxattr's fsx_xflags.
    pub const FS_XFLAG_IMMUTABLE: u32 = 0x8;
    /// FS_XFLAG_APPEND.
    pub const FS_XFLAG_APPEND: u32 = 0x10;
    /// FS_XFLAG_SYNC.
    pub const FS_XFLAG_SYNC: u32 = 0x20;
    /// FS_XFLAG_NOATIME.
    pub const FS_XFLAG_NOATIME: u32 = 0x40;
    /// FS_XFLAG_NODUMP.
    pub const FS_XFLAG_NODUMP: u32 = 0x80;
    /// FS_XFLAG_PROJINHERIT.
    pub const FS_XFLAG_PROJINHERIT: u32 = 0x200;
    /// FS_XFLAG_DAX.
    pub const FS_XFLAG_DAX: u32 = 0x8000;
    /// The xflags that have an FS_*_FL twin (the VFS's FS_XFLAG_COMMON).
    pub const FS_XFLAG_COMMON: u32 = FS_XFLAG_SYNC
        | FS_XFLAG_IMMUTABLE
        | FS_XFLAG_APPEND
        | FS_XFLAG_NODUMP
        | FS_XFLAG_NOATIME
        | FS_XFLAG_DAX
        | FS_XFLAG_PROJINHERIT;
}

use fsflags::*;

/// The fields of struct fsxattr that FS_IOC_FSSETXATTR may change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsXattr {
    /// fsx_xflags: FS_XFLAG_*.
    pub xflags: u32,
    /// fsx_extsize: extent size hint (btrfs has none: must be 0).
    pub extsize: u32,
    /// fsx_projid: project id (btrfs has none: must be 0).
    pub projid: u32,
    /// fsx_cowextsize: CoW extent size hint (must be 0).
    pub cowextsize: u32,
}

/// Pairs of (FS_*_FL, FS_XFLAG_*) for the flags both can express.
const FL_XFLAG: [(u32, u32); 7] = [
    (FS_IMMUTABLE_FL, FS_XFLAG_IMMUTABLE),
    (FS_APPEND_FL, FS_XFLAG_APPEND),
    (FS_SYNC_FL, FS_XFLAG_SYNC),
    (FS_NOATIME_FL, FS_XFLAG_NOATIME),
    (FS_NODUMP_FL, FS_XFLAG_NODUMP),
    (FS_DAX_FL, FS_XFLAG_DAX),
    (FS_PROJINHERIT_FL, FS_XFLAG_PROJINHERIT),
];

/// The FS_*_FL flags lsattr shows for the inode item's flags
/// (btrfs_inode_flags_to_fsflags): NOCOMPRESS wins over COMPRESS.
pub fn inode_flags_to_fsflags(flags: u64) -> u32 {
    let mut o = 0u32;
    for (bit, fl) in [
        (INODE_SYNC, FS_SYNC_FL),
        (INODE_IMMUTABLE, FS_IMMUTABLE_FL),
        (INODE_APPEND, FS_APPEND_FL),
        (INODE_NODUMP, FS_NODUMP_FL),
        (INODE_NOATIME, FS_NOATIME_FL),
        (INODE_DIRSYNC, FS_DIRSYNC_FL),
        (INODE_NODATACOW, FS_NOCOW_FL),
    ] {
        if flags & bit != 0 {
            o |= fl;
        }
    }
    if flags & INODE_NOCOMPRESS != 0 {
        o |= FS_NOCOMP_FL;
    } else if flags & INODE_COMPRESS != 0 {
        o |= FS_COMPR_FL;
    }
    // The read-only compat flags live in the upper half; bit 0 is fs-verity.
    if (flags >> 32) & 1 != 0 {
        o |= FS_VERITY_FL;
    }
    o
}

/// FS_*_FL to FS_XFLAG_* (struct fsxattr), for the flags both can express.
pub fn fsflags_to_xflags(fl: u32) -> u32 {
    FL_XFLAG
        .iter()
        .filter(|(f, _)| fl & f != 0)
        .fold(0, |x, (_, xf)| x | xf)
}

/// FS_XFLAG_* to FS_*_FL, for the flags both can express.
pub fn xflags_to_fsflags(x: u32) -> u32 {
    FL_XFLAG
        .iter()
        .filter(|(_, xf)| x & xf != 0)
        .fold(0, |f, (fl, _)| f | fl)
}

/// The flags that mean something for this type of inode
/// (btrfs_mask_fsflags_for_type): all for directories, all but DIRSYNC for
/// regular files, only NODUMP and NOATIME for the rest.
fn mask_fsflags_for_type(mode: u32, flags: u32) -> u32 {
    match mode & 0o170000 {
        0o040000 => flags,
        0o100000 => flags & !FS_DIRSYNC_FL,
        _ => flags & (FS_NODUMP_FL | FS_NOATIME_FL),
    }
}

/// The kernel's check_fsflags: EOPNOTSUPP for flags btrfs does not have, EINVAL
/// for contradictions (c with m, c with C, C against an existing c or m).
fn check_fsflags(old: u32, new: u32) -> Result<()> {
    let supported = FS_IMMUTABLE_FL
        | FS_APPEND_FL
        | FS_NOATIME_FL
        | FS_NODUMP_FL
        | FS_SYNC_FL
        | FS_DIRSYNC_FL
        | FS_NOCOMP_FL
        | FS_COMPR_FL
        | FS_NOCOW_FL;
    if new & !supported != 0 {
        return Err(Error::Unsupported(format!(
            "inode flags {:#x}",
            new & !supported
        )));
    }
    let compression = FS_COMPR_FL | FS_NOCOMP_FL;
    let bad = new & compression == compression
        || (new & FS_COMPR_FL != 0 && new & FS_NOCOW_FL != 0)
        || (old & FS_NOCOW_FL != 0 && new & compression != 0)
        || (new & FS_NOCOW_FL != 0 && old & compression != 0);
    if bad {
        return Err(Error::Invalid(format!(
            "inode flags {new:#x}: nocow and compression exclude each other"
        )));
    }
    Ok(())
}

/// Sets or clears `bit` in `flags`.
fn set_bit(flags: &mut u64, bit: u64, on: bool) {
    if on {
        *flags |= bit;
    } else {
        *flags &= !bit;
    }
}

impl Trans {
    /// FS_IOC_SETFLAGS (chattr): btrfs_fileattr_set with the FS_*_FL word. Flags
    /// that do not apply to the inode's type are dropped; `C` turns data COW and
    /// checksums off only on an empty regular file (any directory); `c` stores the
    /// `btrfs.compression` property (the mount's algorithm, else zlib) and any
    /// other word removes it, as the kernel does. ctime is updated.
    pub fn fileattr_set(&mut self, root: u64, ino: u64, fsflags: u32, t: Timespec) -> Result<()> {
        let i = self.read_inode(root, ino)?;
        let new = mask_fsflags_for_type(i.mode, fsflags);
        let old = inode_flags_to_fsflags(i.flags);
        check_fsflags(old, new)?;
        let mut flags = i.flags;
        self.set_common_flags(&mut flags, new);
        set_bit(&mut flags, INODE_DIRSYNC, new & FS_DIRSYNC_FL != 0);
        let regular = i.mode & 0o170000 == 0o100000;
        if regular {
            // With no data yet, checksums can go with COW; otherwise the flag would
            // not describe the file's extents, so it is left alone.
            if i.size == 0 {
                set_bit(
                    &mut flags,
                    INODE_NODATACOW | INODE_NODATASUM,
                    new & FS_NOCOW_FL != 0,
                );
            }
        } else {
            set_bit(&mut flags, INODE_NODATACOW, new & FS_NOCOW_FL != 0);
        }
        let mut comp: Option<&str> = None;
        if new & FS_NOCOMP_FL != 0 {
            flags &= !INODE_COMPRESS;
            flags |= INODE_NOCOMPRESS;
        } else if new & FS_COMPR_FL != 0 {
            flags |= INODE_COMPRESS;
            flags &= !INODE_NOCOMPRESS;
            comp = Some(match self.compress {
                Some((alg, _)) if alg != ubtrfs_compress::Compression::None => alg.name(),
                _ => "zlib",
            });
        } else {
            flags &= !(INODE_COMPRESS | INODE_NOCOMPRESS);
        }
        // The property is written first; its own flag changes are then overridden
        // by the word asked for, as in the kernel.
        match comp {
            Some(c) => {
                self.set_xattr_raw(root, ino, XATTR_BTRFS_COMPRESSION, c.as_bytes())?;
            }
            None => {
                self.remove_xattr_entry(root, ino, XATTR_BTRFS_COMPRESSION)?;
            }
        }
        if let Some(c) = comp {
            if let Some(alg) = crate::inode::props::compression_of(c.as_bytes()) {
                self.note_compression_feature(alg);
            }
        }
        let mut i = self.read_inode(root, ino)?;
        i.flags = flags;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)
    }

    /// FS_IOC_FSSETXATTR: btrfs_fileattr_set with a struct fsxattr. Only the flags
    /// the VFS maps (sync, immutable, append, nodump, noatime) change; extent size
    /// hints, project ids and other xflags are EOPNOTSUPP.
    pub fn fileattr_set_xflags(
        &mut self,
        root: u64,
        ino: u64,
        fsx: &FsXattr,
        t: Timespec,
    ) -> Result<()> {
        if fsx.xflags & !FS_XFLAG_COMMON != 0
            || fsx.extsize != 0
            || fsx.projid != 0
            || fsx.cowextsize != 0
        {
            return Err(Error::Unsupported(
                "fsxattr fields beyond the common flags".into(),
            ));
        }
        let xflags = fsx.xflags;
        let i = self.read_inode(root, ino)?;
        let old = inode_flags_to_fsflags(i.flags);
        // The VFS keeps the flags fsxattr cannot express from the old word.
        let word = xflags_to_fsflags(xflags) | (old & !FS_COMMON_FL);
        let new = mask_fsflags_for_type(i.mode, word);
        check_fsflags(old, new)?;
        let mut i = i;
        let mut flags = i.flags;
        self.set_common_flags(&mut flags, new);
        i.flags = flags;
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)
    }

    /// The five flags both ioctls set.
    fn set_common_flags(&self, flags: &mut u64, new: u32) {
        set_bit(flags, INODE_SYNC, new & FS_SYNC_FL != 0);
        set_bit(flags, INODE_IMMUTABLE, new & FS_IMMUTABLE_FL != 0);
        set_bit(flags, INODE_APPEND, new & FS_APPEND_FL != 0);
        set_bit(flags, INODE_NODUMP, new & FS_NODUMP_FL != 0);
        set_bit(flags, INODE_NOATIME, new & FS_NOATIME_FL != 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_conversion() {
        assert_eq!(
            inode_flags_to_fsflags(INODE_NODATACOW | INODE_NODATASUM),
            FS_NOCOW_FL
        );
        assert_eq!(
            inode_flags_to_fsflags(INODE_COMPRESS | INODE_NOCOMPRESS),
            FS_NOCOMP_FL
        );
        assert_eq!(inode_flags_to_fsflags(INODE_COMPRESS), FS_COMPR_FL);
        assert_eq!(inode_flags_to_fsflags(INODE_IMMUTABLE | INODE_APPEND), 0x30);
        assert_eq!(fsflags_to_xflags(0x30), 0x18);
        assert_eq!(xflags_to_fsflags(0x18), 0x30);
    }

    #[test]
    fn fsflags_rules() {
        assert!(matches!(check_fsflags(0, 0x1), Err(Error::Unsupported(_))));
        assert!(matches!(
            check_fsflags(0, FS_COMPR_FL | FS_NOCOMP_FL),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            check_fsflags(FS_NOCOW_FL, FS_NOCOW_FL | FS_COMPR_FL),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            check_fsflags(FS_NOCOMP_FL, FS_NOCOMP_FL | FS_NOCOW_FL),
            Err(Error::Invalid(_))
        ));
        assert!(check_fsflags(0, FS_IMMUTABLE_FL | FS_NOCOW_FL).is_ok());
        assert_eq!(
            mask_fsflags_for_type(0o100644, FS_DIRSYNC_FL | FS_SYNC_FL),
            FS_SYNC_FL
        );
        assert_eq!(
            mask_fsflags_for_type(0o120777, FS_SYNC_FL | FS_NODUMP_FL),
            FS_NODUMP_FL
        );
    }
}
