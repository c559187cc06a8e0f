//! POSIX ACL semantics a FUSE server owes the kernel. With FUSE_POSIX_ACL the kernel
//! checks permissions against the ACLs, but what a local filesystem's VFS calls do
//! around them is the server's job: an access ACL sets the mode's permission bits
//! (and is not stored when the mode alone says the same), chmod rewrites the access
//! ACL, and a new inode in a directory with a default ACL inherits it instead of
//! having the umask applied (the kernel then passes the umask along: FUSE_DONT_MASK).
//!
//! The value is the kernel's xattr form: a little-endian u32 version (2), then
//! entries of u16 tag, u16 permissions, u32 id, sorted by tag.

/// The access ACL's xattr name.
pub(crate) const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's xattr name (directories).
pub(crate) const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A parsed ACL (None: not an ACL in the kernel's xattr form).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Acl(Vec<Entry>);

impl Acl {
    pub(crate) fn parse(v: &[u8]) -> Option<Acl> {
        if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
            return None;
        }
        if u32::from_le_bytes(v[..4].try_into().ok()?) != VERSION {
            return None;
        }
        let entries = v[4..]
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Some(Acl(entries))
    }

    /// Whether the ACL grants `want` (r = 4, w = 2, x = 1) to a caller that is not
    /// the owner, has uid `uid`, and whose groups `in_group` tells, on an inode of
    /// group `file_gid`: the kernel's posix_acl_permission past its owner entry. A
    /// named user entry, or else any matching group entry (the owning group's
    /// included), decides, limited by the mask; no match: the other entry.
    pub(crate) fn permits(
        &self,
        uid: u32,
        file_gid: u32,
        in_group: impl Fn(u32) -> bool,
        want: u16,
    ) -> bool {
        let mask = self.0.iter().find(|e| e.tag == MASK).map_or(7, |e| e.perm);
        let masked = |perm: u16| perm & mask & want == want;
        if let Some(e) = self.0.iter().find(|e| e.tag == USER && e.id == uid) {
            return masked(e.perm);
        }
        let mut found = false;
        for e in &self.0 {
            let member = match e.tag {
                GROUP_OBJ => in_group(file_gid),
                GROUP => in_group(e.id),
                _ => false,
            };
            if member {
                found = true;
                if masked(e.perm) {
                    return true;
                }
            }
        }
        if found {
            return false;
        }
        self.0
            .iter()
            .find(|e| e.tag == OTHER)
            .is_some_and(|e| e.perm & want == want)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    /// The permission bits the ACL stands for (owner, mask or owning group, other),
    /// and whether the mode says all of it (no named entries, no mask): then the
    /// kernel stores no ACL, only the mode.
    pub(crate) fn equiv_mode(&self) -> (u32, bool) {
        let mut mode = 0u32;
        let mut equiv = true;
        for e in &self.0 {
            let p = u32::from(e.perm & 7);
            match e.tag {
                USER_OBJ => mode |= p << 6,
                GROUP_OBJ => mode |= p << 3,
                OTHER => mode |= p,
                // Entries are sorted by tag: the mask comes after the owning group
                // and replaces its bits in the mode.
                MASK => {
                    mode = (mode & !0o070) | (p << 3);
                    equiv = false;
                }
                _ => equiv = false,
            }
        }
        (mode, equiv)
    }

    /// chmod: the owner, mask (or owning group, without a mask) and other entries
    /// take the new permission bits; named entries keep theirs.
    pub(crate) fn chmod(&mut self, mode: u32) {
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
    }

    /// A new inode's access ACL from its directory's default ACL and the mode
    /// asked for (umask not applied): each of owner, mask (or owning group) and
    /// other keeps what both allow, and `mode` is narrowed the same way. Returns
    /// whether the ACL says more than the mode (else it need not be stored).
    pub(crate) fn create_masq(&mut self, mode: &mut u32) -> bool {
        let mut equiv = true;
        let mut group = None;
        let mut mask = None;
        for (i, e) in self.0.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((*mode >> 6) & 7) as u16;
                    *mode &= (u32::from(e.perm) << 6) | !0o700;
                }
                OTHER => {
                    e.perm &= (*mode & 7) as u16;
                    *mode &= u32::from(e.perm) | !0o007;
                }
                GROUP_OBJ => group = Some(i),
                MASK => {
                    mask = Some(i);
                    equiv = false;
                }
                USER | GROUP => equiv = false,
                _ => {}
            }
        }
        if let Some(i) = mask.or(group) {
            let e = &mut self.0[i];
            e.perm &= ((*mode >> 3) & 7) as u16;
            *mode &= (u32::from(e.perm) << 3) | !0o070;
        }
        !equiv
    }
}

/// An ACL from (tag, perm, id) entries, for tests.
#[cfg(test)]
pub(crate) fn acl(entries: &[(u16, u16, u32)]) -> Acl {
    Acl(entries
        .iter()
        .map(|&(tag, perm, id)| Entry { tag, perm, id })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_from_acls_as_the_kernel() {
        // u::r--,g::rwx,o::rw-: equivalent to mode 0476 (fstests generic/099).
        let a = acl(&[(USER_OBJ, 4, 0), (GROUP_OBJ, 7, 0), (OTHER, 6, 0)]);
        assert_eq!(Acl::parse(&a.encode()), Some(a.clone()));
        assert_eq!(a.equiv_mode(), (0o476, true));
        // A named user and a mask: the mask gives the group bits.
        let mut b = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 6, 0),
            (OTHER, 4, 0),
        ]);
        assert_eq!(b.equiv_mode(), (0o764, false));
        b.chmod(0o751);
        assert_eq!(b.equiv_mode(), (0o751, false));
        assert_eq!(b.0[1].perm, 7, "named entries keep their permissions");
        assert_eq!(b.0[2].perm, 5, "the owning group keeps its own with a mask");
        // Inherited: mode 0666 asked, default u::rwx,g::r-x,o::---.
        let mut c = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 0, 0)]);
        let mut mode = 0o100666;
        assert!(!c.create_masq(&mut mode));
        assert_eq!(mode, 0o100640);
        assert_eq!(c.equiv_mode(), (0o640, true));
        assert_eq!(Acl::parse(b"\x01\0\0\0"), None, "version 1");
        assert_eq!(Acl::parse(b"\x02\0\0\0\x01"), None, "a partial entry");
    }
}
