//! Clearing setuid and setgid when a file is changed: the server's half of
//! FUSE_HANDLE_KILLPRIV_V2.
//!
//! Without it the kernel's FUSE client does this itself, at a price: before every
//! write(2) it asks for `security.capability` (a GETXATTR round trip per write, as
//! FUSE cannot mark an inode "no security bits" for good), and before every chown
//! it refreshes the mode (a GETATTR). With it negotiated, the kernel marks the WRITE
//! and truncating SETATTR requests of callers without CAP_FSETID
//! (`FUSE_WRITE_KILL_SUIDGID`, `FATTR_KILL_SUIDGID`) and every chown of a
//! non-directory, and the server applies the VFS's rule
//! (`setattr_should_drop_suidgid`). fallocate and copy_file_range carry no mark
//! (the kernel's `file_modified` leaves the clearing to the server without
//! saying who called), so for those the server reads the caller's CAP_FSETID from
//! /proc. `security.capability` itself the kernel still removes (REMOVEXATTR).

use crate::abi::InHeader;
use crate::creds::{Caller, CAP_FSETID};

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_IXGRP: u32 = 0o010;
/// Why a file's setuid/setgid bits may have to go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// A WRITE or truncating SETATTR the kernel marked: the caller lacks CAP_FSETID.
    Marked,
    /// A change the kernel does not mark (fallocate, copy_file_range): the caller's
    /// capability is looked up.
    Unmarked,
    /// A chown of a non-directory: setuid goes even for a capable caller.
    Chown,
}

/// The mode a file of `mode` owned by group `file_gid` gets for this change, or None
/// when it keeps its mode. The VFS's rule: nothing for a caller with CAP_FSETID
/// (except setuid on chown); otherwise setuid goes, and setgid goes when the group
/// may execute (without group execute it marks mandatory locking and stays) or when
/// the caller is not in the file's group.
pub(crate) fn killed_mode(mode: u32, file_gid: u32, cause: Cause, h: &InHeader) -> Option<u32> {
    if mode & (S_ISUID | S_ISGID) == 0 {
        return None;
    }
    let caller = Caller::new(h);
    let capable = match cause {
        Cause::Marked => false,
        Cause::Unmarked | Cause::Chown => caller.capable(CAP_FSETID),
    };
    if capable && cause != Cause::Chown {
        return None;
    }
    let mut new = mode & !S_ISUID;
    if mode & S_ISGID != 0 && (mode & S_IXGRP != 0 || !(capable || caller.in_group(file_gid))) {
        new &= !S_ISGID;
    }
    (new != mode).then_some(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::creds::header;

    #[test]
    fn marked_change_clears_setuid_and_executable_setgid() {
        let h = header(1000, 1000);
        assert_eq!(killed_mode(0o4755, 1000, Cause::Marked, &h), Some(0o755));
        assert_eq!(killed_mode(0o2755, 1000, Cause::Marked, &h), Some(0o755));
        assert_eq!(killed_mode(0o6755, 1000, Cause::Marked, &h), Some(0o755));
        // setgid without group execute marks mandatory locking: kept for a member...
        assert_eq!(killed_mode(0o2745, 1000, Cause::Marked, &h), None);
        // ...cleared for a caller outside the group.
        assert_eq!(killed_mode(0o2745, 50, Cause::Marked, &h), Some(0o745));
        assert_eq!(killed_mode(0o755, 50, Cause::Marked, &h), None);
    }

    /// This test process's own credentials (root in CI: CAP_FSETID).
    fn me() -> InHeader {
        InHeader {
            pid: std::process::id(),
            ..header(0, 0)
        }
    }

    #[test]
    fn unmarked_change_spares_a_capable_caller() {
        if nix::unistd::geteuid().is_root() {
            assert_eq!(killed_mode(0o6755, 50, Cause::Unmarked, &me()), None);
        }
        // Credentials /proc cannot show (pid 0): cleared, the safe mistake.
        assert_eq!(
            killed_mode(0o4755, 50, Cause::Unmarked, &header(0, 0)),
            Some(0o755)
        );
        assert_eq!(
            killed_mode(0o6755, 50, Cause::Unmarked, &header(1000, 1000)),
            Some(0o755)
        );
    }

    #[test]
    fn chown_clears_setuid_even_for_root() {
        let root = me();
        assert_eq!(killed_mode(0o4755, 50, Cause::Chown, &root), Some(0o755));
        assert_eq!(killed_mode(0o2755, 50, Cause::Chown, &root), Some(0o755));
        // Root keeps a non-executable setgid; a non-member without the capability
        // does not.
        if nix::unistd::geteuid().is_root() {
            assert_eq!(killed_mode(0o2745, 50, Cause::Chown, &root), None);
        }
        assert_eq!(
            killed_mode(0o2745, 50, Cause::Chown, &header(1000, 1000)),
            Some(0o745)
        );
    }
}
