//! Who made a request, beyond the uid and gid in its header: capabilities and
//! supplementary groups from /proc/TID/status, and the VFS's permission check
//! (generic_permission with POSIX ACLs) for the few requests the kernel passes on
//! without checking them itself — the btrfs subvolume ioctls.
//!
//! Requests the kernel checks (`default_permissions`) never come here.

use crate::abi::InHeader;
use crate::acl::Acl;

/// Capability bits of /proc/PID/status's CapEff.
pub(crate) const CAP_DAC_OVERRIDE: u32 = 1;
pub(crate) const CAP_DAC_READ_SEARCH: u32 = 2;
pub(crate) const CAP_FOWNER: u32 = 3;
pub(crate) const CAP_FSETID: u32 = 4;
pub(crate) const CAP_SYS_ADMIN: u32 = 21;

/// Permission bits asked for (the VFS's MAY_READ, MAY_WRITE, MAY_EXEC).
pub(crate) const MAY_READ: u32 = 4;
pub(crate) const MAY_WRITE: u32 = 2;
pub(crate) const MAY_EXEC: u32 = 1;

/// The caller's credentials as /proc shows them, read once when first needed.
pub(crate) struct Caller<'h> {
    pub(crate) h: &'h InHeader,
    status: Option<String>,
}

impl<'h> Caller<'h> {
    pub(crate) fn new(h: &'h InHeader) -> Caller<'h> {
        // h.pid is the calling thread's id; /proc/TID/status names its credentials.
        let status = (h.pid != 0)
            .then(|| std::fs::read_to_string(format!("/proc/{}/status", h.pid)).ok())
            .flatten();
        Caller { h, status }
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.status
            .as_deref()?
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    }

    /// Capability `bit` in the caller's effective set, counted only when the caller
    /// is in the server's user namespace: CapEff is relative to the caller's own
    /// namespace, and anyone may make one (`unshare -r`) to hold every capability
    /// there, while the kernel asks about the filesystem's. When /proc cannot say,
    /// not capable: refusing what the kernel would allow is the safe mistake.
    pub(crate) fn capable(&self, bit: u32) -> bool {
        let caps = self
            .field("CapEff")
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .unwrap_or(0);
        caps & (1 << bit) != 0 && self.in_server_user_namespace()
    }

    /// The caller's user namespace is the server's (compared by the identity of
    /// /proc/TID/ns/user, which only a process allowed to trace the caller may
    /// read).
    fn in_server_user_namespace(&self) -> bool {
        // The server's own namespace does not change while it runs: read once.
        static SERVER_NS: std::sync::OnceLock<Option<std::path::PathBuf>> =
            std::sync::OnceLock::new();
        let server = SERVER_NS.get_or_init(|| std::fs::read_link("/proc/self/ns/user").ok());
        let caller = std::fs::read_link(format!("/proc/{}/ns/user", self.h.pid)).ok();
        match (caller, server) {
            (Some(a), Some(b)) => self.h.pid != 0 && &a == b,
            _ => false,
        }
    }

    /// The caller's filesystem gid or one of its supplementary groups is `gid`.
    pub(crate) fn in_group(&self, gid: u32) -> bool {
        self.h.gid == gid
            || self.field("Groups").is_some_and(|g| {
                g.split_whitespace()
                    .any(|x| x.parse::<u32>().ok() == Some(gid))
            })
    }

    /// The caller's umask (0o022 when /proc does not say).
    pub(crate) fn umask(&self) -> u32 {
        self.field("Umask")
            .and_then(|v| u32::from_str_radix(v, 8).ok())
            .unwrap_or(0o022)
    }

    /// The VFS's generic_permission for an inode owned by `uid`:`gid` with `mode`
    /// and its access ACL: the owner's bits for the owner, else the ACL's named
    /// entries and groups under its mask (or the group's bits without an ACL), else
    /// the others' bits; then CAP_DAC_OVERRIDE (reading and writing anything,
    /// executing what some x bit allows, searching directories) and
    /// CAP_DAC_READ_SEARCH (reading anything, searching directories).
    pub(crate) fn permits(
        &self,
        uid: u32,
        gid: u32,
        mode: u32,
        acl: Option<&Acl>,
        want: u32,
    ) -> bool {
        let want = want & (MAY_READ | MAY_WRITE | MAY_EXEC);
        let granted = if self.h.uid == uid {
            (mode >> 6) & want == want
        } else if let Some(a) = acl.filter(|_| mode & 0o070 != 0) {
            // (The kernel consults the ACL only when the group bits are not empty.)
            a.permits(self.h.uid, gid, |g| self.in_group(g), want as u16)
        } else if self.in_group(gid) {
            (mode >> 3) & want == want
        } else {
            mode & want == want
        };
        if granted {
            return true;
        }
        let dir = mode & 0o170000 == 0o040000;
        if self.capable(CAP_DAC_OVERRIDE) && (want & MAY_EXEC == 0 || dir || mode & 0o111 != 0) {
            return true;
        }
        let search_only = want & !(MAY_READ | if dir { MAY_EXEC } else { 0 }) == 0;
        search_only && self.capable(CAP_DAC_READ_SEARCH)
    }

    /// The caller owns an inode of `uid`, or may act as if (CAP_FOWNER): the VFS's
    /// inode_owner_or_capable.
    pub(crate) fn owner_or_capable(&self, uid: u32) -> bool {
        self.h.uid == uid || self.capable(CAP_FOWNER)
    }
}

/// A request header from `uid`:`gid` for tests. pid 0: no /proc lookup, so no
/// capabilities and no supplementary groups.
#[cfg(test)]
pub(crate) fn header(uid: u32, gid: u32) -> InHeader {
    InHeader {
        len: 0,
        opcode: 0,
        unique: 0,
        nodeid: 0,
        uid,
        gid,
        pid: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::acl;

    #[test]
    fn mode_bits_pick_owner_then_group_then_others() {
        let (owner, member, other) = (header(10, 1), header(11, 20), header(12, 3));
        for (c, want) in [(&owner, true), (&member, false), (&other, true)] {
            // rwx for the owner, r-x for the group, rwx for others: a member of the
            // group gets the group's bits even where others may more.
            let ok = Caller::new(c).permits(10, 20, 0o40757, None, MAY_WRITE | MAY_EXEC);
            assert_eq!(ok, want, "uid {}", c.uid);
        }
    }

    #[test]
    fn acl_named_entries_are_limited_by_the_mask() {
        // user::rwx user:11:rwx group::r-x group:30:rwx mask::r-x other::rwx
        let a = acl(&[
            (0x01, 7, u32::MAX),
            (0x02, 7, 11),
            (0x04, 5, u32::MAX),
            (0x08, 7, 30),
            (0x10, 5, u32::MAX),
            (0x20, 7, u32::MAX),
        ]);
        let c = |uid, gid| Caller::new(&header(uid, gid)).permits(10, 20, 0o40757, Some(&a), 3);
        // Named user 11: rwx masked to r-x.
        assert!(!Caller::new(&header(11, 1)).permits(10, 20, 0o40757, Some(&a), 3));
        assert!(Caller::new(&header(11, 1)).permits(10, 20, 0o40757, Some(&a), 1));
        // Owning group and named group 30: matched, masked, so no write.
        assert!(!c(12, 20));
        assert!(!c(12, 30));
        // No entry matches: others' rwx, unmasked.
        assert!(c(12, 99));
        // The owner: the mode's owner bits.
        assert!(c(10, 99));
    }
}
