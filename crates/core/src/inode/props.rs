//! Properties: xattrs in the `btrfs.` namespace that btrfs itself interprets
//! (fs/btrfs/props.c). The only one is `btrfs.compression`: zlib, lzo or zstd
//! (optionally with `:LEVEL`, or any text after the name, as the kernel matches a
//! prefix) compress the inode's new data with that algorithm, `no`/`none` forbids
//! compression, and an empty value removes the property. New files and directories
//! inherit a directory's algorithm.

use crate::error::{Error, Result};
use crate::fs::Node;
use crate::transaction::Trans;
use ubtrfs_compress::Compression;
use ubtrfs_format::consts::*;
use ubtrfs_format::items::{InodeItem, Timespec};

/// The xattr name of the compression property.
pub const XATTR_BTRFS_COMPRESSION: &[u8] = b"btrfs.compression";

/// The xattr namespace of properties.
pub const XATTR_BTRFS_PREFIX: &[u8] = b"btrfs.";

/// The algorithm a property value names (the kernel's btrfs_compress_is_valid_type,
/// which accepts any value that starts with an algorithm's name).
pub fn compression_of(value: &[u8]) -> Option<Compression> {
    [Compression::Zlib, Compression::Lzo, Compression::Zstd]
        .into_iter()
        .find(|c| value.starts_with(c.name().as_bytes()))
}

/// `no` or `none`: compression forbidden.
fn is_no_compression(value: &[u8]) -> bool {
    value == b"no" || value == b"none"
}

/// Data COW and checksums are on, so the inode's data may be compressed
/// (btrfs_inode_can_compress).
pub(crate) fn can_compress(i: &InodeItem) -> bool {
    i.flags & (INODE_NODATACOW | INODE_NODATASUM) == 0
}

/// Neither a regular file nor a directory: the property means nothing there and
/// is silently not stored (prop_compression_ignore).
fn ignored(i: &InodeItem) -> bool {
    !matches!(i.mode & 0o170000, 0o100000 | 0o040000)
}

/// The property's checks (btrfs_validate_prop): EINVAL for an unknown property,
/// a bad value, or an inode whose data cannot be compressed.
fn validate(name: &[u8], value: &[u8], i: &InodeItem) -> Result<()> {
    if name != XATTR_BTRFS_COMPRESSION {
        return Err(Error::Invalid(format!(
            "{}: no such property",
            String::from_utf8_lossy(name)
        )));
    }
    if value.is_empty() {
        return Ok(());
    }
    if !can_compress(i) {
        return Err(Error::Invalid(
            "btrfs.compression on a nodatacow/nodatasum inode".into(),
        ));
    }
    if compression_of(value).is_some() || is_no_compression(value) {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "btrfs.compression value {:?}",
        String::from_utf8_lossy(value)
    )))
}

/// What the property does to the inode flags (prop_compression_apply).
fn apply(flags: &mut u64, value: &[u8]) {
    if value.is_empty() {
        *flags &= !(INODE_COMPRESS | INODE_NOCOMPRESS);
    } else if is_no_compression(value) {
        *flags |= INODE_NOCOMPRESS;
        *flags &= !INODE_COMPRESS;
    } else {
        *flags &= !INODE_NOCOMPRESS;
        *flags |= INODE_COMPRESS;
    }
}

impl crate::fs::Filesystem {
    /// The algorithm of the inode's `btrfs.compression` property, if it names one
    /// (the kernel's in-memory `prop_compress`).
    pub fn prop_compress(&self, node: Node) -> Result<Option<Compression>> {
        Ok(self
            .getxattr(node, XATTR_BTRFS_COMPRESSION)?
            .and_then(|v| compression_of(&v)))
    }
}

impl Trans {
    /// setxattr / removexattr of a `btrfs.` name (the kernel's property xattr
    /// handler): validated, not stored on inodes it means nothing for, applied to
    /// the inode flags; ctime is updated. `value` None or empty removes it;
    /// `must_exist` (removexattr, XATTR_REPLACE) makes a missing one ENODATA.
    pub fn set_prop(
        &mut self,
        root: u64,
        ino: u64,
        name: &[u8],
        value: Option<&[u8]>,
        must_exist: bool,
        t: Timespec,
    ) -> Result<()> {
        let mut i = self.read_inode(root, ino)?;
        let v = value.unwrap_or_default();
        validate(name, v, &i)?;
        if ignored(&i) {
            return Ok(());
        }
        if v.is_empty() {
            let had = self.remove_xattr_entry(root, ino, name)?;
            if !had && must_exist {
                return Err(Error::NotFound(format!(
                    "xattr {}",
                    String::from_utf8_lossy(name)
                )));
            }
        } else {
            if must_exist && self.fs.getxattr(Node::new(root, ino), name)?.is_none() {
                return Err(Error::NotFound(format!(
                    "xattr {}",
                    String::from_utf8_lossy(name)
                )));
            }
            self.set_xattr_raw(root, ino, name, v)?;
            if let Some(alg) = compression_of(v) {
                self.note_compression_feature(alg);
            }
            i = self.read_inode(root, ino)?;
        }
        apply(&mut i.flags, v);
        self.touch(&mut i, t, false);
        self.write_inode(root, ino, &i)
    }

    /// A new inode takes over what its directory passes on (btrfs_inherit_iflags):
    /// the compression flags and NODATACOW (with NODATASUM for regular files).
    pub(crate) fn inherit_iflags(i: &mut InodeItem, dir: &InodeItem) {
        if dir.flags & INODE_NOCOMPRESS != 0 {
            i.flags &= !INODE_COMPRESS;
            i.flags |= INODE_NOCOMPRESS;
        } else if dir.flags & INODE_COMPRESS != 0 {
            i.flags &= !INODE_NOCOMPRESS;
            i.flags |= INODE_COMPRESS;
        }
        if dir.flags & INODE_NODATACOW != 0 {
            i.flags |= INODE_NODATACOW;
            if i.mode & 0o170000 == 0o100000 {
                i.flags |= INODE_NODATASUM;
            }
        }
    }

    /// A new regular file or directory gets its directory's compression algorithm
    /// as its own property (btrfs_inode_inherit_props); `no`/`none` is not passed on
    /// (the flags carry it), nor is it given to an inode that cannot compress.
    pub(crate) fn inherit_props(&mut self, root: u64, dir: u64, ino: u64) -> Result<()> {
        let Some(alg) = self.fs.prop_compress(Node::new(root, dir))? else {
            return Ok(());
        };
        let mut i = self.read_inode(root, ino)?;
        if ignored(&i) || !can_compress(&i) {
            return Ok(());
        }
        self.set_xattr_raw(root, ino, XATTR_BTRFS_COMPRESSION, alg.name().as_bytes())?;
        apply(&mut i.flags, alg.name().as_bytes());
        self.write_inode(root, ino, &i)
    }

    /// Marks the filesystem as using lzo or zstd once a property names it, as the
    /// kernel's property handler does.
    pub(crate) fn note_compression_feature(&mut self, alg: Compression) {
        self.fs.info.sb.incompat_flags |= match alg {
            Compression::Lzo => FEATURE_INCOMPAT_COMPRESS_LZO,
            Compression::Zstd => FEATURE_INCOMPAT_COMPRESS_ZSTD,
            _ => 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(compression_of(b"zstd"), Some(Compression::Zstd));
        assert_eq!(compression_of(b"zstd:3"), Some(Compression::Zstd));
        assert_eq!(compression_of(b"lzo"), Some(Compression::Lzo));
        assert_eq!(compression_of(b"zli"), None);
        assert_eq!(compression_of(b"none"), None);
        let reg = InodeItem {
            mode: 0o100644,
            ..Default::default()
        };
        assert!(validate(XATTR_BTRFS_COMPRESSION, b"none", &reg).is_ok());
        assert!(validate(XATTR_BTRFS_COMPRESSION, b"no", &reg).is_ok());
        assert!(validate(XATTR_BTRFS_COMPRESSION, b"", &reg).is_ok());
        assert!(validate(XATTR_BTRFS_COMPRESSION, b"gzip", &reg).is_err());
        assert!(validate(b"btrfs.foo", b"zlib", &reg).is_err());
        let nocow = InodeItem {
            mode: 0o100644,
            flags: INODE_NODATACOW | INODE_NODATASUM,
            ..Default::default()
        };
        assert!(validate(XATTR_BTRFS_COMPRESSION, b"zlib", &nocow).is_err());
        let mut f = INODE_NOCOMPRESS;
        apply(&mut f, b"zstd");
        assert_eq!(f, INODE_COMPRESS);
        apply(&mut f, b"none");
        assert_eq!(f, INODE_NOCOMPRESS);
        apply(&mut f, b"");
        assert_eq!(f, 0);
    }
}
