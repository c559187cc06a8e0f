//! Text formatting shared by the commands: modes like ls, times like GNU stat.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use ubtrfs_core::mode::*;
use ubtrfs_format::items::Timespec;

/// "drwxr-xr-x" for a st_mode.
pub fn mode_string(mode: u32) -> String {
    let t = match mode & S_IFMT {
        S_IFDIR => 'd',
        S_IFLNK => 'l',
        S_IFCHR => 'c',
        S_IFBLK => 'b',
        S_IFIFO => 'p',
        S_IFSOCK => 's',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ];
    for (i, (b, c)) in bits.iter().enumerate() {
        let mut ch = if mode & b != 0 { *c } else { '-' };
        // setuid / setgid / sticky replace the execute letters.
        let special = match i {
            2 => Some((0o4000, 's')),
            5 => Some((0o2000, 's')),
            8 => Some((0o1000, 't')),
            _ => None,
        };
        if let Some((sb, l)) = special {
            if mode & sb != 0 {
                ch = if mode & b != 0 {
                    l
                } else {
                    l.to_ascii_uppercase()
                };
            }
        }
        s.push(ch);
    }
    s
}

pub fn type_name(mode: u32) -> &'static str {
    match mode & S_IFMT {
        S_IFDIR => "dir",
        S_IFLNK => "symlink",
        S_IFCHR => "chr",
        S_IFBLK => "blk",
        S_IFIFO => "fifo",
        S_IFSOCK => "sock",
        _ => "file",
    }
}

pub fn stat_type_text(mode: u32, size: u64) -> &'static str {
    match mode & S_IFMT {
        S_IFDIR => "directory",
        S_IFLNK => "symbolic link",
        S_IFCHR => "character special file",
        S_IFBLK => "block special file",
        S_IFIFO => "fifo",
        S_IFSOCK => "socket",
        _ if size == 0 => "regular empty file",
        _ => "regular file",
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// "YYYY-MM-DD HH:MM:SS" in UTC.
pub fn datetime(sec: i64) -> String {
    let days = sec.div_euclid(86400);
    let rem = sec.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// GNU stat style: "2026-11-22 01:24:25.708629886 +0000".
pub fn stat_time(t: &Timespec) -> String {
    format!("{}.{:09} +0000", datetime(t.sec), t.nsec)
}

/// ls --time-style=long-iso: "2026-11-22 01:24".
pub fn ls_time(t: &Timespec) -> String {
    let s = datetime(t.sec);
    s[..16].to_string()
}

pub fn ts_string(t: &Timespec) -> String {
    format!("{}.{:09}", t.sec, t.nsec)
}

/// Name bytes for display: lossless when UTF-8, escaped otherwise.
pub fn name_display(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_string(),
        Err(_) => b
            .iter()
            .map(|&c| {
                if c.is_ascii_graphic() || c == b' ' {
                    (c as char).to_string()
                } else {
                    format!("\\x{c:02x}")
                }
            })
            .collect(),
    }
}

/// A spinner on stderr with `template` (indicatif's syntax), shown only when `show`
/// and stderr is a terminal; hidden (every call a no-op) otherwise, so piped output
/// stays quiet.
pub fn spinner(show: bool, template: &str) -> ProgressBar {
    if !show || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new_spinner();
    b.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn modes() {
        assert_eq!(mode_string(0o40755), "drwxr-xr-x");
        assert_eq!(mode_string(0o104755), "-rwsr-xr-x");
        assert_eq!(mode_string(0o41777), "drwxrwxrwt");
        assert_eq!(mode_string(0o41776), "drwxrwxrwT");
    }
    #[test]
    fn dates() {
        assert_eq!(datetime(0), "1970-01-01 00:00:00");
        assert_eq!(datetime(1795310665), "2026-11-22 01:24:25");
        assert_eq!(datetime(951782400), "2000-02-29 00:00:00");
        assert_eq!(datetime(-1), "1969-12-31 23:59:59");
    }
}

/// A size as btrfs-progs prints it: in bytes with `--raw`, else "1.00GiB".
pub fn progs_size(bytes: u64, raw: bool) -> String {
    if raw {
        bytes.to_string()
    } else {
        ubtrfs_core::tools::du::pretty_size(bytes)
    }
}

/// [`progs_size`] of a number btrfs-progs prints signed (UNITS_NEGATIVE: unallocated
/// space, negative when chunks claim more than the devices hold).
pub fn progs_size_signed(bytes: i64, raw: bool) -> String {
    match (bytes < 0, raw) {
        (false, _) => progs_size(bytes as u64, raw),
        (true, true) => bytes.to_string(),
        (true, false) => format!("-{}", progs_size(bytes.unsigned_abs(), false)),
    }
}

/// A size as util-linux prints it (fstrim -v, lsblk): the largest binary unit the
/// size reaches, one decimal rounded half up and dropped when it is 0, a space,
/// then B, KiB, MiB, ... ("3.7 GiB", "4 GiB", "512 B").
pub fn size_3letter(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut exp = 0u32;
    while exp < 60 && bytes >= 1u64 << (exp + 10) {
        exp += 10;
    }
    if exp == 0 {
        return format!("{bytes} B");
    }
    let mut whole = bytes >> exp;
    let rest = bytes & ((1u64 << exp) - 1);
    // Thousandths of the unit, then tenths rounded half up.
    let thousandths = ((rest as u128 * 1000) >> exp) as u64;
    let mut tenths = (thousandths + 50) / 100;
    if tenths == 10 {
        whole += 1;
        tenths = 0;
    }
    let unit = UNITS[(exp / 10) as usize];
    if tenths == 0 {
        format!("{whole} {unit}")
    } else {
        format!("{whole}.{tenths} {unit}")
    }
}

#[cfg(test)]
mod size_tests {
    use super::size_3letter;

    /// As fstrim -v printed them for these byte counts.
    #[test]
    fn like_util_linux() {
        assert_eq!(size_3letter(4_261_806_080), "4 GiB");
        assert_eq!(size_3letter(3_995_877_376), "3.7 GiB");
        assert_eq!(size_3letter(7_168_065_536), "6.7 GiB");
        assert_eq!(size_3letter(512), "512 B");
        assert_eq!(size_3letter(1536), "1.5 KiB");
    }
}
