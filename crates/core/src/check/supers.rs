//! Superblocks: every copy on every device has the magic, a good checksum, this
//! filesystem's fsid, the primary's generation and its own device's devid. A copy
//! other than the primary that is torn or an older generation is a note, not a
//! problem: a power cut during a commit's superblock writes leaves exactly that, the
//! kernel mounts from the primary and rewrites every copy at its next commit.

use super::Findings;
use crate::io::disk_io::{hex, FsInfo};
use ubtrfs_format::consts::*;
use ubtrfs_format::superblock::SuperBlock;

pub(super) fn check_supers(fs: &FsInfo, f: &mut Findings) {
    for (devid, dev) in &fs.devices {
        for i in 0..SUPER_MIRROR_MAX {
            let off = super_mirror_offset(i);
            if off + SUPER_INFO_SIZE as u64 > dev.size() {
                break;
            }
            let mut buf = vec![0u8; SUPER_INFO_SIZE];
            let at = format!("device {devid} superblock copy {i} at {off}");
            if let Err(e) = dev.read_at(off, &mut buf) {
                f.add(
                    "super-csum",
                    None,
                    None,
                    None,
                    format!("{at}: read failed: {e}"),
                );
                continue;
            }
            let sb = match SuperBlock::parse(&buf) {
                Ok(s) => s,
                Err(e) => {
                    f.add("super-csum", None, None, None, format!("{at}: {e}"));
                    continue;
                }
            };
            if sb.magic != BTRFS_MAGIC {
                // A mirror never written (a device grown later) has no magic; the
                // kernel ignores it too. The primary always has it.
                if i == 0 {
                    f.add("super-csum", None, None, None, format!("{at}: no magic"));
                }
                continue;
            }
            if let Err((stored, found)) = sb.verify_csum() {
                let msg = format!(
                    "{at}: checksum mismatch (stored {}, computed {})",
                    hex(&stored),
                    hex(&found)
                );
                if i == 0 {
                    f.add("super-csum", None, None, None, msg);
                } else {
                    // A copy torn by a power cut while the commit wrote it: the
                    // primary is good and the next commit rewrites every copy.
                    f.note(format!("{msg} (torn by an interrupted commit?)"));
                }
                continue;
            }
            if let Err(e) = sb.check(off) {
                f.add("super-mirror", None, None, None, format!("{at}: {e}"));
                continue;
            }
            if sb.fsid != fs.sb.fsid {
                f.add(
                    "super-mirror",
                    None,
                    None,
                    None,
                    format!("{at}: fsid differs from the filesystem's"),
                );
            }
            if i > 0 && sb.generation < fs.sb.generation {
                // Not yet rewritten when a commit was cut short.
                f.note(format!(
                    "{at}: generation {} behind the filesystem's {} (left by an interrupted commit)",
                    sb.generation, fs.sb.generation
                ));
            } else if sb.generation != fs.sb.generation {
                f.add(
                    "super-mirror",
                    None,
                    None,
                    None,
                    format!(
                        "{at}: generation {} but the filesystem is at {}",
                        sb.generation, fs.sb.generation
                    ),
                );
            }
            if sb.dev_item.devid != *devid {
                f.add(
                    "super-mirror",
                    None,
                    None,
                    None,
                    format!("{at}: says devid {}", sb.dev_item.devid),
                );
            }
        }
    }
}
