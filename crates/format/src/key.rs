//! Btree keys: (objectid, type, offset), ordered as unsigned integers field by field.

use crate::bytes::{put64, Cursor};
use crate::consts::*;
use crate::Result;
use std::fmt;

/// A btree key (struct btrfs_disk_key): object id, item type, offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    /// Object id: inode number, tree id, logical address... by item type.
    pub objectid: u64,
    /// Item type (`*_KEY` constants).
    pub ty: u8,
    /// Type-specific offset.
    pub offset: u64,
}

impl Key {
    /// The smallest key.
    pub const MIN: Key = Key {
        objectid: 0,
        ty: 0,
        offset: 0,
    };
    /// The largest key.
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        ty: u8::MAX,
        offset: u64::MAX,
    };
    /// A key from its three fields.
    pub const fn new(objectid: u64, ty: u8, offset: u64) -> Self {
        Key {
            objectid,
            ty,
            offset,
        }
    }
    /// Decodes a 17-byte little-endian disk key.
    #[inline]
    pub fn parse(c: &mut Cursor<'_>) -> Result<Key> {
        let objectid = c.u64()?;
        let ty = c.u8()?;
        let offset = c.u64()?;
        Ok(Key {
            objectid,
            ty,
            offset,
        })
    }
    /// Decodes a 17-byte disk key from the start of `b`.
    #[inline]
    pub fn from_bytes(b: &[u8]) -> Result<Key> {
        Key::parse(&mut Cursor::new(b, "disk key"))
    }
    /// Encodes the 17-byte disk key into `buf[..17]` (panics if `buf` is shorter).
    pub fn write(&self, buf: &mut [u8]) {
        put64(buf, 0, self.objectid);
        buf[8] = self.ty;
        put64(buf, 9, self.offset);
    }
    /// The 17-byte little-endian disk key.
    pub fn to_bytes(&self) -> [u8; DISK_KEY_SIZE] {
        let mut b = [0u8; DISK_KEY_SIZE];
        self.write(&mut b);
        b
    }
    /// The smallest key strictly greater than this one, if any.
    pub fn successor(&self) -> Option<Key> {
        if self.offset < u64::MAX {
            Some(Key::new(self.objectid, self.ty, self.offset + 1))
        } else if self.ty < u8::MAX {
            Some(Key::new(self.objectid, self.ty + 1, 0))
        } else if self.objectid < u64::MAX {
            Some(Key::new(self.objectid + 1, 0, 0))
        } else {
            None
        }
    }
}

/// Prints an object id the way btrfs-progs does: names for well-known ids,
/// "-1" for u64::MAX, and the plain number otherwise.
pub fn fmt_objectid(id: u64, ty: u8) -> String {
    if ty == DEV_EXTENT_KEY || ty == DEV_ITEM_KEY && id == DEV_ITEMS_OBJECTID {
        if ty == DEV_ITEM_KEY {
            return "DEV_ITEMS".into();
        }
        return id.to_string();
    }
    if ty == QGROUP_RELATION_KEY || ty == QGROUP_INFO_KEY || ty == QGROUP_LIMIT_KEY {
        return fmt_qgroupid(id);
    }
    if ty == UUID_KEY_SUBVOL || ty == UUID_KEY_RECEIVED_SUBVOL {
        return format!("0x{id:016x}");
    }
    if id == FIRST_CHUNK_TREE_OBJECTID && ty == CHUNK_ITEM_KEY {
        return "FIRST_CHUNK_TREE".into();
    }
    if id == u64::MAX {
        return "-1".into();
    }
    match objectid_name(id) {
        Some(n) if id < FIRST_FREE_OBJECTID && id > 0 || id > LAST_FREE_OBJECTID => n.into(),
        _ => id.to_string(),
    }
}

/// Formats a qgroup id as level/id.
pub fn fmt_qgroupid(id: u64) -> String {
    format!("{}/{}", id >> 48, id & ((1u64 << 48) - 1))
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = match key_type_name(self.ty) {
            Some(n) => n.to_string(),
            None => format!("UNKNOWN.{}", self.ty),
        };
        let off = match self.ty {
            QGROUP_RELATION_KEY | QGROUP_INFO_KEY | QGROUP_LIMIT_KEY => fmt_qgroupid(self.offset),
            UUID_KEY_SUBVOL | UUID_KEY_RECEIVED_SUBVOL => format!("0x{:016x}", self.offset),
            _ => self.offset.to_string(),
        };
        write!(
            f,
            "({} {} {})",
            fmt_objectid(self.objectid, self.ty),
            ty,
            off
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn order_is_numeric_not_bytewise() {
        let a = Key::new(256, 1, 0);
        let b = Key::new(1, 200, 5);
        assert!(b < a);
        assert!(Key::new(256, 1, 1) < Key::new(256, 2, 0));
    }
    #[test]
    fn roundtrip_and_display() {
        let k = Key::new(FS_TREE_OBJECTID, ROOT_ITEM_KEY, u64::MAX);
        let mut b = [0u8; 17];
        k.write(&mut b);
        assert_eq!(Key::from_bytes(&b).unwrap(), k);
        assert_eq!(k.to_string(), "(FS_TREE ROOT_ITEM 18446744073709551615)");
        assert_eq!(Key::new(257, 1, 0).to_string(), "(257 INODE_ITEM 0)");
    }
    #[test]
    fn to_bytes_layout() {
        let k = Key::new(FS_TREE_OBJECTID, ROOT_ITEM_KEY, u64::MAX);
        let mut b = [0u8; 17];
        k.write(&mut b);
        assert_eq!(k.to_bytes(), b);
        let k = Key::new(0x0102_0304_0506_0708, 0x54, 0x1112_1314_1516_1718);
        let b = k.to_bytes();
        assert_eq!(
            b,
            [8, 7, 6, 5, 4, 3, 2, 1, 0x54, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]
        );
        assert_eq!(Key::from_bytes(&b).unwrap(), k);
    }
    #[test]
    fn successor() {
        assert_eq!(
            Key::new(1, 2, u64::MAX).successor(),
            Some(Key::new(1, 3, 0))
        );
        assert_eq!(Key::MAX.successor(), None);
    }
}
