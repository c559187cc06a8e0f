//! Mount options a remount may change on a read-write mount, as the kernel's btrfs
//! reconfigures them: compression, the commit interval, discard, the tree log, the
//! flags of new files, max_inline and user_subvol_rm_allowed. FUSE tells a server
//! nothing of a remount, so `ubtrfs mount -o remount,...` (mount(8)'s helper) sends
//! the options it was given with UBTRFS_IOC_SET_OPTIONS; an option not named keeps
//! its value, as on the kernel.

use std::time::Duration;
use ubtrfs_compress::Compression;
use ubtrfs_format::consts::{INODE_NODATACOW, INODE_NODATASUM};

/// `_IOW('u', 2, 16 bytes)`: [`Settings`], encoded.
pub(crate) const UBTRFS_IOC_SET_OPTIONS: u32 = 0x4010_7502;

/// The changeable options a remount named (None: keep the current value).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// `compress=ALG[:LEVEL]`, `compress-force=...` (the bool), `compress=no`.
    pub compress: Option<Option<(Compression, Option<i32>, bool)>>,
    /// `commit=SECS`.
    pub commit_secs: Option<u32>,
    /// `discard` / `nodiscard`.
    pub discard: Option<bool>,
    /// `treelog` / `notreelog`.
    pub tree_log: Option<bool>,
    /// Inode flags of new regular files set and cleared (`nodatacow`, `nodatasum`,
    /// `datacow`, `datasum`, and `compress`, which clears both): the new flags are
    /// `(old & !clear) | set`.
    pub new_file_flags: Option<(u64, u64)>,
    /// `max_inline=BYTES`.
    pub max_inline: Option<u16>,
    /// `user_subvol_rm_allowed`.
    pub user_subvol_rm_allowed: Option<bool>,
}

const HAS_COMPRESS: u8 = 1;
const HAS_COMMIT: u8 = 2;
const HAS_DISCARD: u8 = 4;
const HAS_TREE_LOG: u8 = 8;
const HAS_FLAGS: u8 = 16;
const HAS_MAX_INLINE: u8 = 32;
const HAS_RM_ALLOWED: u8 = 64;
const FORCE: u8 = 0x80;
/// Level byte for "the algorithm's default".
const LEVEL_DEFAULT: i8 = i8::MIN;

fn alg_code(c: Compression) -> u8 {
    match c {
        Compression::Zlib => 1,
        Compression::Lzo => 2,
        Compression::Zstd => 3,
        _ => 0,
    }
}

impl Settings {
    /// Whether the remount named any of them.
    pub fn any(&self) -> bool {
        *self != Settings::default()
    }

    pub(crate) fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        if let Some(c) = self.compress {
            b[0] |= HAS_COMPRESS;
            if let Some((alg, level, force)) = c {
                b[1] = alg_code(alg) | if force { FORCE } else { 0 };
                b[2] = level.map_or(LEVEL_DEFAULT, |l| l.clamp(-100, 100) as i8) as u8;
            }
        }
        if let Some(s) = self.commit_secs {
            b[0] |= HAS_COMMIT;
            b[10..14].copy_from_slice(&s.to_le_bytes());
        }
        let mut bits = 0u8;
        if let Some(d) = self.discard {
            b[0] |= HAS_DISCARD;
            bits |= d as u8;
        }
        if let Some(l) = self.tree_log {
            b[0] |= HAS_TREE_LOG;
            bits |= (l as u8) << 1;
        }
        if let Some(r) = self.user_subvol_rm_allowed {
            b[0] |= HAS_RM_ALLOWED;
            bits |= (r as u8) << 2;
        }
        b[5] = bits;
        if let Some((set, clear)) = self.new_file_flags {
            b[0] |= HAS_FLAGS;
            b[6] = (set & 0xff) as u8;
            b[9] = (clear & 0xff) as u8;
        }
        if let Some(m) = self.max_inline {
            b[0] |= HAS_MAX_INLINE;
            b[7..9].copy_from_slice(&m.to_le_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Settings> {
        let b: &[u8; 16] = b.get(..16)?.try_into().ok()?;
        let has = |f: u8| b[0] & f != 0;
        let compress = if has(HAS_COMPRESS) {
            let alg = match b[1] & !FORCE {
                0 => None,
                1 => Some(Compression::Zlib),
                2 => Some(Compression::Lzo),
                3 => Some(Compression::Zstd),
                _ => return None, // not an algorithm: refused (EINVAL)
            };
            let level = (b[2] as i8 != LEVEL_DEFAULT).then_some(b[2] as i8 as i32);
            Some(alg.map(|a| (a, level, b[1] & FORCE != 0)))
        } else {
            None
        };
        // Only the flags the mount options can set.
        let flags = (INODE_NODATASUM | INODE_NODATACOW) as u8;
        Some(Settings {
            compress,
            commit_secs: has(HAS_COMMIT).then(|| u32::from_le_bytes([b[10], b[11], b[12], b[13]])),
            discard: has(HAS_DISCARD).then_some(b[5] & 1 != 0),
            tree_log: has(HAS_TREE_LOG).then_some(b[5] & 2 != 0),
            user_subvol_rm_allowed: has(HAS_RM_ALLOWED).then_some(b[5] & 4 != 0),
            new_file_flags: has(HAS_FLAGS)
                .then_some(((b[6] & flags) as u64, (b[9] & flags) as u64)),
            max_inline: has(HAS_MAX_INLINE).then(|| u16::from_le_bytes([b[7], b[8]])),
        })
    }

    /// The commit interval it names (0: the default 30 s, as the kernel).
    pub(crate) fn commit_interval(&self) -> Option<Duration> {
        self.commit_secs
            .map(|s| Duration::from_secs(if s == 0 { 30 } else { s as u64 }))
    }
}

/// The client side, for `ubtrfs mount -o remount,...`.
pub mod client {
    use super::Settings;
    use std::fs::File;
    use std::io;

    /// Sends the options a remount named to the server of the mount at `dir`.
    pub fn set_options(dir: &File, s: &Settings) -> io::Result<()> {
        let mut b = s.encode();
        crate::subvol_ops::client::ioctl(dir, super::UBTRFS_IOC_SET_OPTIONS, &mut b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip() {
        let all = Settings {
            compress: Some(Some((Compression::Zstd, Some(-3), true))),
            commit_secs: Some(120),
            discard: Some(true),
            tree_log: Some(false),
            new_file_flags: Some((1, 3)),
            max_inline: Some(0),
            user_subvol_rm_allowed: Some(true),
        };
        for s in [
            all.clone(),
            Settings::default(),
            Settings {
                compress: Some(None),
                discard: Some(false),
                ..Default::default()
            },
            Settings {
                compress: Some(Some((Compression::Lzo, None, false))),
                tree_log: Some(true),
                ..Default::default()
            },
        ] {
            assert_eq!(Settings::decode(&s.encode()), Some(s));
        }
        assert_eq!(Settings::decode(&[0u8; 3]), None);
        // Hostile input: an unknown algorithm is refused, other flags are masked.
        let mut b = Settings::default().encode();
        b[0] = HAS_COMPRESS;
        b[1] = 9;
        assert_eq!(Settings::decode(&b), None);
        b[0] = HAS_FLAGS;
        b[6] = 0xff;
        assert_eq!(
            Settings::decode(&b).and_then(|s| s.new_file_flags),
            Some((3, 0))
        );
    }
}
