//! Human-readable dumps of the superblock and tree blocks, laid out like btrfs-progs'
//! `inspect-internal dump-super` / `dump-tree` (v6.14), so the two tools' outputs can be
//! compared with `diff`.
//!
//! Written from scratch to reproduce progs' text layout (no progs code is used). The
//! printers work on raw bytes with zero-filled, bounds-checked reads: a damaged item
//! prints what can be read instead of aborting the dump.
//!
//! Entry points: [`dump_super`] / [`dump_super_with`] for the superblock, [`dump_tree`] /
//! [`dump_tree_with`] for trees, [`print_block`] for one tree block already in memory,
//! [`print_item`] for one leaf item, [`parse_tree_name`] for `-t NAME`.

use crate::error::{Error, Result};
use crate::io::disk_io::FsInfo;
use crate::tree::ctree::walk_items;
use crate::tree::tree_checker::Expect;
use crate::tree::TreeBlock;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;
use ubtrfs_format::bytes::uuid_string;
use ubtrfs_format::consts::*;
use ubtrfs_format::csum::{extent_data_ref_hash, CsumType};
use ubtrfs_format::items::{
    InodeItem, RootItem, Timespec, CHUNK_BASE_SIZE, DIR_ITEM_HEADER_SIZE,
    FILE_EXTENT_INLINE_DATA_START, STRIPE_SIZE,
};
use ubtrfs_format::key::Key;
use ubtrfs_format::superblock::SuperBlock;
use ubtrfs_format::tree::BlockView;

/// Appends formatted text to a `String` (writing to a `String` cannot fail).
macro_rules! out {
    ($s:expr, $($arg:tt)*) => {{
        let _ = write!($s, $($arg)*);
    }};
}

// Ids and types the format crate does not name (old or rare ones progs still prints).
const CSUM_CHANGE_OBJECTID: u64 = (-13i64) as u64;
const CSUM_ITEM_KEY: u8 = 120;
const EXTENT_REF_V0_KEY: u8 = 180;

const SUPER_FLAG_CHANGING_BG_TREE: u64 = 1 << 38;
const SUPER_FLAG_CHANGING_DATA_CSUM: u64 = 1 << 39;
const SUPER_FLAG_CHANGING_META_CSUM: u64 = 1 << 40;

const QGROUP_STATUS_FLAG_ON: u64 = 1 << 0;
const QGROUP_STATUS_FLAG_RESCAN: u64 = 1 << 1;
const QGROUP_STATUS_FLAG_INCONSISTENT: u64 = 1 << 2;
const QGROUP_STATUS_FLAG_SIMPLE_MODE: u64 = 1 << 3;
const QGROUP_STATUS_FLAGS_MASK: u64 = 0xf;

const DEV_STAT_VALUES_MAX: usize = 5;
/// Names and values longer than this are cut when printed (progs' name buffer).
const PRINT_NAME_MAX: usize = NAME_LEN_MAX;
const DISK_BALANCE_ARGS_SIZE: usize = 136;

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// Bytes `off..off+N` of `b`, zero-filled where `b` ends early.
fn bytes_at<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if off < b.len() {
        let n = (b.len() - off).min(N);
        a[..n].copy_from_slice(&b[off..off + n]);
    }
    a
}

fn rd_u8(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}
fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(bytes_at(b, off))
}
fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(bytes_at(b, off))
}
fn rd_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(bytes_at(b, off))
}
fn rd_key(b: &[u8], off: usize) -> Key {
    Key::new(rd_u64(b, off), rd_u8(b, off + 8), rd_u64(b, off + 9))
}
fn rd_uuid(b: &[u8], off: usize) -> String {
    uuid_string(&bytes_at::<16>(b, off))
}
/// `len` bytes at `off` (as many as exist).
fn slice_at(b: &[u8], off: usize, len: usize) -> &[u8] {
    let start = off.min(b.len());
    let end = off.saturating_add(len).min(b.len());
    &b[start..end]
}
/// A copy of `b` zero-padded (or cut) to exactly `n` bytes.
fn padded(b: &[u8], n: usize) -> Vec<u8> {
    let mut v = b[..b.len().min(n)].to_vec();
    v.resize(n, 0);
    v
}

/// `isprint` of the C locale.
fn is_print(c: u8) -> bool {
    (0x20..0x7f).contains(&c)
}

/// A name or value with C escapes for characters that could break the line: the
/// usual backslash letters, `\ ` for space, `\\`, and octal `\NNN` for the rest of the
/// unprintable bytes.
pub fn escape_name(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        match c {
            0x07 => s.push_str("\\a"),
            0x08 => s.push_str("\\b"),
            0x1b => s.push_str("\\e"),
            0x0c => s.push_str("\\f"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0x0b => s.push_str("\\v"),
            b' ' => s.push_str("\\ "),
            b'\\' => s.push_str("\\\\"),
            c if is_print(c) => s.push(c as char),
            c => out!(s, "\\{}{}{}", c >> 6, (c >> 3) & 7, c & 7),
        }
    }
    s
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(days: i128) -> (i128, u32, u32) {
    // Shift to a calendar whose years start on March 1st of year 0, so the leap day
    // is the last day of a year; count in 400-year cycles of 146097 days.
    let z = days + 719_468;
    let cycle = z.div_euclid(146_097);
    let day_of_cycle = z.rem_euclid(146_097);
    let year_of_cycle =
        (day_of_cycle - day_of_cycle / 1460 + day_of_cycle / 36_524 - day_of_cycle / 146_096) / 365;
    let day_of_year =
        day_of_cycle - (365 * year_of_cycle + year_of_cycle / 4 - year_of_cycle / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_cycle + cycle * 400 + i128::from(month <= 2);
    (year, month, day)
}

/// "YYYY-MM-DD HH:MM:SS" of a time_t. Progs uses local time; this machine's (and CI's)
/// zone is UTC, and this is the single place to change if that ever matters.
pub fn format_date(sec: i64) -> String {
    let sec = i128::from(sec);
    let days = sec.div_euclid(86_400);
    let rem = sec.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// "SEC.NSEC (YYYY-MM-DD HH:MM:SS)" as dump-tree prints inode and root times.
pub fn format_timespec(sec: u64, nsec: u32) -> String {
    format!("{sec}.{nsec} ({})", format_date(sec as i64))
}

fn ts(t: &Timespec) -> String {
    format_timespec(t.sec as u64, t.nsec)
}

// ---------------------------------------------------------------------------
// Keys and object ids
// ---------------------------------------------------------------------------

fn qgroup_str(id: u64) -> String {
    format!("{}/{}", id >> 48, id & ((1u64 << 48) - 1))
}

/// An object id as dump-tree prints it in keys, header owners and back references:
/// names for the well-known ids (whatever the range), `-1` for u64::MAX, and special
/// forms for the key types whose objectid is not an object (qgroup relations, uuid
/// halves, device ids, dev stats).
pub fn objectid_str(id: u64, ty: u8) -> String {
    match ty {
        PERSISTENT_ITEM_KEY => {
            return if id == DEV_STATS_OBJECTID {
                "DEV_STATS".into()
            } else {
                id.to_string()
            }
        }
        DEV_EXTENT_KEY => return id.to_string(),
        QGROUP_RELATION_KEY => return qgroup_str(id),
        UUID_KEY_SUBVOL | UUID_KEY_RECEIVED_SUBVOL => return format!("0x{id:016x}"),
        _ => {}
    }
    let name = match id {
        ROOT_TREE_OBJECTID if ty == DEV_ITEM_KEY => "DEV_ITEMS",
        ROOT_TREE_OBJECTID => "ROOT_TREE",
        EXTENT_TREE_OBJECTID => "EXTENT_TREE",
        CHUNK_TREE_OBJECTID => "CHUNK_TREE",
        DEV_TREE_OBJECTID => "DEV_TREE",
        FS_TREE_OBJECTID => "FS_TREE",
        ROOT_TREE_DIR_OBJECTID => "ROOT_TREE_DIR",
        CSUM_TREE_OBJECTID => "CSUM_TREE",
        BALANCE_OBJECTID => "BALANCE",
        ORPHAN_OBJECTID => "ORPHAN",
        TREE_LOG_OBJECTID => "TREE_LOG",
        TREE_LOG_FIXUP_OBJECTID => "LOG_FIXUP",
        TREE_RELOC_OBJECTID => "TREE_RELOC",
        DATA_RELOC_TREE_OBJECTID => "DATA_RELOC_TREE",
        EXTENT_CSUM_OBJECTID => "EXTENT_CSUM",
        FREE_SPACE_OBJECTID => "FREE_SPACE",
        FREE_INO_OBJECTID => "FREE_INO",
        QUOTA_TREE_OBJECTID => "QUOTA_TREE",
        UUID_TREE_OBJECTID => "UUID_TREE",
        FREE_SPACE_TREE_OBJECTID => "FREE_SPACE_TREE",
        MULTIPLE_OBJECTIDS => "MULTIPLE",
        BLOCK_GROUP_TREE_OBJECTID => "BLOCK_GROUP_TREE",
        CSUM_CHANGE_OBJECTID => "CSUM_CHANGE",
        RAID_STRIPE_TREE_OBJECTID => "RAID_STRIPE_TREE",
        u64::MAX => "-1",
        FIRST_CHUNK_TREE_OBJECTID if ty == CHUNK_ITEM_KEY => "FIRST_CHUNK_TREE",
        _ => return id.to_string(),
    };
    name.to_string()
}

/// A key type's name, `UNTYPED` for the free-space-cache header, `UNKNOWN.N` otherwise.
pub fn key_type_str(objectid: u64, ty: u8) -> String {
    if ty == 0 && objectid == FREE_SPACE_OBJECTID {
        return "UNTYPED".into();
    }
    let name = match ty {
        CSUM_ITEM_KEY => Some("CSUM_ITEM"),
        EXTENT_REF_V0_KEY => Some("EXTENT_REF_V0"),
        t => key_type_name(t),
    };
    match name {
        Some(n) => n.to_string(),
        None => format!("UNKNOWN.{ty}"),
    }
}

/// `key (OBJECTID TYPE OFFSET)` exactly as dump-tree prints a key. Differs from
/// `Key`'s Display: ROOT_ITEM offsets are plain numbers (so -1 prints as
/// 18446744073709551615), QGROUP_INFO/LIMIT objectids are plain numbers, dev stats print
/// as DEV_STATS, and TREE_LOG_FIXUP is LOG_FIXUP.
pub fn key_str(k: &Key) -> String {
    let off = match k.ty {
        QGROUP_RELATION_KEY | QGROUP_INFO_KEY | QGROUP_LIMIT_KEY => qgroup_str(k.offset),
        UUID_KEY_SUBVOL | UUID_KEY_RECEIVED_SUBVOL => format!("0x{:016x}", k.offset),
        ROOT_ITEM_KEY if k.objectid == TREE_RELOC_OBJECTID => objectid_str(k.offset, k.ty),
        ROOT_ITEM_KEY => k.offset.to_string(),
        _ if k.offset == u64::MAX => "-1".into(),
        _ => k.offset.to_string(),
    };
    format!(
        "key ({} {} {})",
        objectid_str(k.objectid, k.ty),
        key_type_str(k.objectid, k.ty),
        off
    )
}

// ---------------------------------------------------------------------------
// Flag strings
// ---------------------------------------------------------------------------

/// Profile name used in block group and chunk type strings; the first matching bit wins
/// in this order.
fn raid_name(flags: u64) -> &'static str {
    const ORDER: &[(u64, &str)] = &[
        (BLOCK_GROUP_RAID10, "RAID10"),
        (BLOCK_GROUP_RAID1, "RAID1"),
        (BLOCK_GROUP_RAID1C3, "RAID1C3"),
        (BLOCK_GROUP_RAID1C4, "RAID1C4"),
        (BLOCK_GROUP_DUP, "DUP"),
        (BLOCK_GROUP_RAID0, "RAID0"),
        (BLOCK_GROUP_RAID5, "RAID5"),
        (BLOCK_GROUP_RAID6, "RAID6"),
    ];
    ORDER
        .iter()
        .find(|(b, _)| flags & b != 0)
        .map(|(_, n)| *n)
        .unwrap_or("single")
}

/// Block group / chunk type, e.g. `DATA|single`, `METADATA|DUP`. Reproduces progs'
/// quirk of putting a `|` between the type names only after DATA.
pub fn bg_flags_str(flags: u64) -> String {
    let mut s = String::new();
    let data = flags & BLOCK_GROUP_DATA != 0;
    if data {
        s.push_str("DATA");
    }
    if flags & BLOCK_GROUP_METADATA != 0 {
        if data {
            s.push('|');
        }
        s.push_str("METADATA");
    }
    if flags & BLOCK_GROUP_SYSTEM != 0 {
        if data {
            s.push('|');
        }
        s.push_str("SYSTEM");
    }
    s.push('|');
    s.push_str(raid_name(flags));
    s
}

fn extent_flags_str(flags: u64) -> String {
    let mut s = String::new();
    if flags & EXTENT_FLAG_DATA != 0 {
        s.push_str("DATA");
    }
    if flags & EXTENT_FLAG_TREE_BLOCK != 0 {
        if !s.is_empty() {
            s.push('|');
        }
        s.push_str("TREE_BLOCK");
    }
    if flags & BLOCK_FLAG_FULL_BACKREF != 0 {
        s.push_str("|FULL_BACKREF");
    }
    s
}

/// `A|B|UNKNOWN: 0x..` from a table of named bits (empty when nothing is set).
fn named_bits(flags: u64, table: &[(u64, &str)]) -> String {
    let known: u64 = table.iter().fold(0, |a, (b, _)| a | b);
    let mut parts: Vec<String> = table
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    if flags & !known != 0 {
        parts.push(format!("UNKNOWN: 0x{:x}", flags & !known));
    }
    parts.join("|")
}

fn inode_flags_str(flags: u64) -> String {
    const T: &[(u64, &str)] = &[
        (INODE_NODATASUM, "NODATASUM"),
        (INODE_NODATACOW, "NODATACOW"),
        (INODE_READONLY, "READONLY"),
        (INODE_NOCOMPRESS, "NOCOMPRESS"),
        (INODE_PREALLOC, "PREALLOC"),
        (INODE_SYNC, "SYNC"),
        (INODE_IMMUTABLE, "IMMUTABLE"),
        (INODE_APPEND, "APPEND"),
        (INODE_NODUMP, "NODUMP"),
        (INODE_NOATIME, "NOATIME"),
        (INODE_DIRSYNC, "DIRSYNC"),
        (INODE_COMPRESS, "COMPRESS"),
        (INODE_ROOT_ITEM_INIT, "ROOT_ITEM_INIT"),
    ];
    let s = named_bits(flags, T);
    if s.is_empty() {
        "none".into()
    } else {
        s
    }
}

fn qgroup_status_flags_str(flags: u64) -> String {
    let mut s = String::from(if flags & QGROUP_STATUS_FLAG_ON != 0 {
        "ON"
    } else {
        "OFF"
    });
    if flags & QGROUP_STATUS_FLAG_SIMPLE_MODE != 0 {
        s.push_str("|SIMPLE_MODE");
    }
    if flags & QGROUP_STATUS_FLAG_RESCAN != 0 {
        s.push_str("|SCANNING");
    }
    if flags & QGROUP_STATUS_FLAG_INCONSISTENT != 0 {
        s.push_str("|INCONSISTENT");
    }
    if flags & !QGROUP_STATUS_FLAGS_MASK != 0 {
        out!(s, "|UNKNOWN(0x{:x})", flags & !QGROUP_STATUS_FLAGS_MASK);
    }
    s
}

fn compress_str(c: u8) -> String {
    match c {
        0 => "none".into(),
        1 => "zlib".into(),
        2 => "lzo".into(),
        3 => "zstd".into(),
        c => format!("UNKNOWN.{c}"),
    }
}

fn file_extent_type_str(t: u8) -> &'static str {
    match t {
        FILE_EXTENT_INLINE => "inline",
        FILE_EXTENT_PREALLOC => "prealloc",
        FILE_EXTENT_REG => "regular",
        _ => "unknown",
    }
}

fn dir_type_str(t: u8) -> String {
    let n = match t {
        FT_REG_FILE => "FILE",
        FT_DIR => "DIR",
        FT_CHRDEV => "CHRDEV",
        FT_BLKDEV => "BLKDEV",
        FT_FIFO => "FIFO",
        FT_SOCK => "SOCK",
        FT_SYMLINK => "SYMLINK",
        FT_XATTR => "XATTR",
        t => return format!("DIR_ITEM.{t}"),
    };
    n.into()
}

// ---------------------------------------------------------------------------
// Items
// ---------------------------------------------------------------------------

/// What the item printers need to know about the filesystem, and the output switches.
#[derive(Clone, Debug)]
pub struct PrintCtx {
    /// Tree block size.
    pub nodesize: u32,
    /// Data sector size.
    pub sectorsize: u32,
    /// Checksum algorithm.
    pub csum_type: CsumType,
    /// The superblock's incompat flags (SIMPLE_QUOTA adds `enable_gen` to the qgroup
    /// status line).
    pub incompat_flags: u64,
    /// `--hide-names`: print HIDDEN instead of names and xattr values.
    pub hide_names: bool,
    /// `--csum-headers`: append each block's stored checksum to its header line.
    pub csum_headers: bool,
    /// `--csum-items`: print the checksums held in EXTENT_CSUM items.
    pub csum_items: bool,
}

impl Default for PrintCtx {
    fn default() -> Self {
        PrintCtx {
            nodesize: 16384,
            sectorsize: 4096,
            csum_type: CsumType::Crc32c,
            incompat_flags: 0,
            hide_names: false,
            csum_headers: false,
            csum_items: false,
        }
    }
}

impl PrintCtx {
    /// The context of an opened filesystem.
    pub fn new(fs: &FsInfo) -> PrintCtx {
        PrintCtx {
            nodesize: fs.nodesize,
            sectorsize: fs.sectorsize,
            csum_type: fs.csum_type,
            incompat_flags: fs.sb.incompat_flags,
            ..Default::default()
        }
    }
    fn with_opts(fs: &FsInfo, o: &DumpTreeOptions) -> PrintCtx {
        PrintCtx {
            hide_names: o.hide_names,
            csum_headers: o.csum_headers,
            csum_items: o.csum_items,
            ..PrintCtx::new(fs)
        }
    }
}

fn print_inode_item(s: &mut String, d: &[u8]) {
    let Ok(ii) = InodeItem::parse(&padded(d, InodeItem::SIZE)) else {
        return;
    };
    out!(
        s,
        "\t\tgeneration {} transid {} size {} nbytes {}\n\
         \t\tblock group {} mode {:o} links {} uid {} gid {} rdev {}\n\
         \t\tsequence {} flags 0x{:x}({})\n",
        ii.generation,
        ii.transid,
        ii.size,
        ii.nbytes,
        ii.block_group,
        ii.mode,
        ii.nlink,
        ii.uid,
        ii.gid,
        ii.rdev,
        ii.sequence,
        ii.flags,
        inode_flags_str(ii.flags)
    );
    out!(s, "\t\tatime {}\n", ts(&ii.atime));
    out!(s, "\t\tctime {}\n", ts(&ii.ctime));
    out!(s, "\t\tmtime {}\n", ts(&ii.mtime));
    out!(s, "\t\totime {}\n", ts(&ii.otime));
}

fn name_field(ctx: &PrintCtx, name: &[u8]) -> String {
    if ctx.hide_names {
        "HIDDEN".into()
    } else {
        escape_name(&name[..name.len().min(PRINT_NAME_MAX)])
    }
}

fn print_inode_ref(s: &mut String, ctx: &PrintCtx, d: &[u8]) {
    let mut cur = 0usize;
    while cur < d.len() {
        let index = rd_u64(d, cur);
        let len = rd_u16(d, cur + 8) as usize;
        let name = slice_at(d, cur + 10, len);
        out!(
            s,
            "\t\tindex {index} namelen {len} name: {}\n",
            name_field(ctx, name)
        );
        cur += 10 + len;
    }
}

fn print_inode_extref(s: &mut String, ctx: &PrintCtx, d: &[u8]) {
    let mut cur = 0usize;
    while cur < d.len() {
        let parent = rd_u64(d, cur);
        let index = rd_u64(d, cur + 8);
        let len = rd_u16(d, cur + 16) as usize;
        let name = slice_at(d, cur + 18, len);
        out!(
            s,
            "\t\tindex {index} parent {parent} namelen {len} name: {}\n",
            name_field(ctx, name)
        );
        cur += 18 + len;
    }
}

fn print_dir_item(s: &mut String, ctx: &PrintCtx, d: &[u8]) {
    let size = d.len();
    let mut cur = 0usize;
    while cur < size {
        let location = rd_key(d, cur);
        let transid = rd_u64(d, cur + 17);
        let data_len = rd_u16(d, cur + 25) as usize;
        let name_len = rd_u16(d, cur + 27) as usize;
        let ty = rd_u8(d, cur + 29);
        out!(
            s,
            "\t\tlocation {} type {}\n",
            key_str(&location),
            dir_type_str(ty)
        );
        if data_len + name_len + cur > size {
            out!(
                s,
                "ERROR: invalid length, cur={cur} name_len={name_len} data_len={data_len} size={size}\n"
            );
            break;
        }
        out!(
            s,
            "\t\ttransid {transid} data_len {data_len} name_len {name_len}\n"
        );
        let name_off = cur + DIR_ITEM_HEADER_SIZE;
        out!(
            s,
            "\t\tname: {}\n",
            name_field(ctx, slice_at(d, name_off, name_len))
        );
        if data_len > 0 {
            if ctx.hide_names {
                s.push_str("\t\tdata HIDDEN\n");
            } else {
                let data = slice_at(d, name_off + name_len, data_len.min(PRINT_NAME_MAX));
                out!(s, "\t\tdata {}\n", escape_name(data));
            }
        }
        cur += DIR_ITEM_HEADER_SIZE + name_len + data_len;
    }
}

fn print_file_extent(s: &mut String, d: &[u8]) {
    let generation = rd_u64(d, 0);
    let ram_bytes = rd_u64(d, 8);
    let compression = rd_u8(d, 16);
    let ty = rd_u8(d, 20);
    out!(
        s,
        "\t\tgeneration {generation} type {ty} ({})\n",
        file_extent_type_str(ty)
    );
    let disk_bytenr = rd_u64(d, 21);
    let disk_num_bytes = rd_u64(d, 29);
    let offset = rd_u64(d, 37);
    let num_bytes = rd_u64(d, 45);
    match ty {
        FILE_EXTENT_INLINE => out!(
            s,
            "\t\tinline extent data size {} ram_bytes {ram_bytes} compression {compression} ({})\n",
            (d.len() as u32).wrapping_sub(FILE_EXTENT_INLINE_DATA_START as u32),
            compress_str(compression)
        ),
        FILE_EXTENT_PREALLOC => {
            out!(
                s,
                "\t\tprealloc data disk byte {disk_bytenr} nr {disk_num_bytes}\n"
            );
            out!(s, "\t\tprealloc data offset {offset} nr {num_bytes}\n");
        }
        _ => {
            out!(
                s,
                "\t\textent data disk byte {disk_bytenr} nr {disk_num_bytes}\n"
            );
            out!(
                s,
                "\t\textent data offset {offset} nr {num_bytes} ram {ram_bytes}\n"
            );
            out!(
                s,
                "\t\textent compression {compression} ({})\n",
                compress_str(compression)
            );
        }
    }
}

fn print_extent_item(s: &mut String, key: &Key, d: &[u8]) {
    if d.len() < 24 {
        return;
    }
    let refs = rd_u64(d, 0);
    let generation = rd_u64(d, 8);
    let flags = rd_u64(d, 16);
    out!(
        s,
        "\t\trefs {refs} gen {generation} flags {}\n",
        extent_flags_str(flags)
    );
    let mut ptr = 24usize;
    if key.ty == METADATA_ITEM_KEY {
        out!(s, "\t\ttree block skinny level {}\n", key.offset as i32);
    } else if flags & EXTENT_FLAG_TREE_BLOCK != 0 {
        out!(
            s,
            "\t\ttree block {} level {}\n",
            key_str(&rd_key(d, ptr)),
            rd_u8(d, ptr + 17)
        );
        ptr += 18;
    }
    while ptr < d.len() {
        let ty = rd_u8(d, ptr);
        let offset = rd_u64(d, ptr + 1);
        match ty {
            TREE_BLOCK_REF_KEY => {
                out!(
                    s,
                    "\t\t({ty} 0x{offset:x}) tree block backref root {}\n",
                    objectid_str(offset, 0)
                );
                ptr += 9;
            }
            SHARED_BLOCK_REF_KEY => {
                out!(
                    s,
                    "\t\t({ty} 0x{offset:x}) shared block backref parent {offset}\n"
                );
                ptr += 9;
            }
            EXTENT_DATA_REF_KEY => {
                let root = rd_u64(d, ptr + 1);
                let objectid = rd_u64(d, ptr + 9);
                let off = rd_u64(d, ptr + 17);
                let count = rd_u32(d, ptr + 25);
                out!(
                    s,
                    "\t\t({ty} 0x{:x}) extent data backref root {} objectid {objectid} offset {off} count {count}\n",
                    extent_data_ref_hash(root, objectid, off),
                    objectid_str(root, 0)
                );
                ptr += 29;
            }
            SHARED_DATA_REF_KEY => {
                out!(
                    s,
                    "\t\t({ty} 0x{offset:x}) shared data backref parent {offset} count {}\n",
                    rd_u32(d, ptr + 9)
                );
                ptr += 13;
            }
            EXTENT_OWNER_REF_KEY => {
                // Progs' format string has a stray backslash here: one tab, and the
                // "t" of the second escape ends up in front of "extent".
                out!(s, "\t({ty} 0x{offset:x}) textent owner root {offset}\n");
                ptr += 9;
            }
            _ => return,
        }
    }
}

fn print_root_item(s: &mut String, d: &[u8]) {
    let Ok(ri) = RootItem::parse(&padded(d, RootItem::SIZE)) else {
        return;
    };
    out!(
        s,
        "\t\tgeneration {} root_dirid {} bytenr {} byte_limit {} bytes_used {}\n",
        ri.generation,
        ri.root_dirid,
        ri.bytenr,
        ri.byte_limit,
        ri.bytes_used
    );
    out!(
        s,
        "\t\tlast_snapshot {} flags 0x{:x}({}) refs {}\n",
        ri.last_snapshot,
        ri.flags,
        if ri.flags & ROOT_SUBVOL_RDONLY != 0 {
            "RDONLY"
        } else {
            "none"
        },
        ri.refs
    );
    out!(
        s,
        "\t\tdrop_progress {} drop_level {}\n",
        key_str(&ri.drop_progress),
        ri.drop_level
    );
    out!(
        s,
        "\t\tlevel {} generation_v2 {}\n",
        ri.level,
        ri.generation_v2
    );
    if ri.generation == ri.generation_v2 {
        out!(s, "\t\tuuid {}\n", uuid_string(&ri.uuid));
        out!(s, "\t\tparent_uuid {}\n", uuid_string(&ri.parent_uuid));
        out!(s, "\t\treceived_uuid {}\n", uuid_string(&ri.received_uuid));
        out!(
            s,
            "\t\tctransid {} otransid {} stransid {} rtransid {}\n",
            ri.ctransid,
            ri.otransid,
            ri.stransid,
            ri.rtransid
        );
        out!(s, "\t\tctime {}\n", ts(&ri.ctime));
        out!(s, "\t\totime {}\n", ts(&ri.otime));
        out!(s, "\t\tstime {}\n", ts(&ri.stime));
        out!(s, "\t\trtime {}\n", ts(&ri.rtime));
    }
}

fn print_root_ref(s: &mut String, tag: &str, d: &[u8]) {
    let dirid = rd_u64(d, 0);
    let sequence = rd_u64(d, 8);
    let len = rd_u16(d, 16) as usize;
    let name = slice_at(d, 18, len);
    // Printed raw with %.*s: stops at a NUL.
    let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
    out!(
        s,
        "\t\troot {tag} key dirid {dirid} sequence {sequence} name {}\n",
        String::from_utf8_lossy(name)
    );
}

/// Chunk item body (also used for the superblock's sys_chunk_array).
fn print_chunk(s: &mut String, d: &[u8]) {
    let num_stripes = rd_u16(d, 44);
    if num_stripes < 1 {
        out!(s, "invalid num_stripes: {num_stripes}\n");
        return;
    }
    if CHUNK_BASE_SIZE + STRIPE_SIZE * num_stripes as usize > d.len() {
        s.push_str("\t\tchunk item invalid\n");
        return;
    }
    out!(
        s,
        "\t\tlength {} owner {} stripe_len {} type {}\n",
        rd_u64(d, 0),
        rd_u64(d, 8),
        rd_u64(d, 16),
        bg_flags_str(rd_u64(d, 24))
    );
    out!(
        s,
        "\t\tio_align {} io_width {} sector_size {}\n",
        rd_u32(d, 32),
        rd_u32(d, 36),
        rd_u32(d, 40)
    );
    out!(
        s,
        "\t\tnum_stripes {num_stripes} sub_stripes {}\n",
        rd_u16(d, 46)
    );
    for i in 0..num_stripes as usize {
        let o = CHUNK_BASE_SIZE + i * STRIPE_SIZE;
        out!(
            s,
            "\t\t\tstripe {i} devid {} offset {}\n",
            rd_u64(d, o),
            rd_u64(d, o + 8)
        );
        out!(s, "\t\t\tdev_uuid {}\n", rd_uuid(d, o + 16));
    }
}

fn print_dev_item(s: &mut String, d: &[u8]) {
    out!(
        s,
        "\t\tdevid {} total_bytes {} bytes_used {}\n\
         \t\tio_align {} io_width {} sector_size {} type {}\n\
         \t\tgeneration {} start_offset {} dev_group {}\n\
         \t\tseek_speed {} bandwidth {}\n\
         \t\tuuid {}\n\
         \t\tfsid {}\n",
        rd_u64(d, 0),
        rd_u64(d, 8),
        rd_u64(d, 16),
        rd_u32(d, 24),
        rd_u32(d, 28),
        rd_u32(d, 32),
        rd_u64(d, 36),
        rd_u64(d, 44),
        rd_u64(d, 52),
        rd_u32(d, 60),
        rd_u8(d, 64),
        rd_u8(d, 65),
        rd_uuid(d, 66),
        rd_uuid(d, 82)
    );
}

fn print_dev_extent(s: &mut String, d: &[u8]) {
    out!(
        s,
        "\t\tdev extent chunk_tree {}\n\
         \t\tchunk_objectid {} chunk_offset {} length {}\n\
         \t\tchunk_tree_uuid {}\n",
        rd_u64(d, 0),
        rd_u64(d, 8),
        rd_u64(d, 16),
        rd_u64(d, 24),
        rd_uuid(d, 32)
    );
}

fn print_extent_csum(s: &mut String, ctx: &PrintCtx, key: &Key, d: &[u8]) {
    let csum_size = ctx.csum_type.size();
    let size = ((d.len() / csum_size) as u32).wrapping_mul(ctx.sectorsize);
    out!(
        s,
        "\t\trange start {} end {} length {size}\n",
        key.offset,
        key.offset.wrapping_add(size as u64)
    );
    if !ctx.csum_items {
        return;
    }
    let per_line = (CSUM_SIZE_MAX / csum_size / 2).max(1);
    let mut offset = key.offset;
    for (i, c) in d.chunks_exact(csum_size).enumerate() {
        if i == 0 {
            s.push_str("\t\t");
        } else if i % per_line == 0 {
            s.push_str("\n\t\t");
        } else {
            s.push(' ');
        }
        out!(s, "[{offset}] 0x");
        for b in c {
            out!(s, "{b:02x}");
        }
        offset = offset.wrapping_add(ctx.sectorsize as u64);
    }
    s.push('\n');
}

fn print_qgroup_status(s: &mut String, ctx: &PrintCtx, d: &[u8]) {
    out!(
        s,
        "\t\tversion {} generation {} flags {} scan {}",
        rd_u64(d, 0),
        rd_u64(d, 8),
        qgroup_status_flags_str(rd_u64(d, 16)),
        rd_u64(d, 24)
    );
    if ctx.incompat_flags & FEATURE_INCOMPAT_SIMPLE_QUOTA != 0 {
        out!(s, " enable_gen {}\n", rd_u64(d, 32));
    } else {
        s.push('\n');
    }
}

fn print_dev_stats(s: &mut String, d: &[u8]) {
    let v = |i: usize| rd_u64(d, i * 8);
    s.push_str("\t\tdevice stats\n");
    out!(
        s,
        "\t\twrite_errs {} read_errs {} flush_errs {} corruption_errs {} generation {}\n",
        v(0),
        v(1),
        v(2),
        v(3),
        v(4)
    );
    let known = DEV_STAT_VALUES_MAX * 8;
    if known < d.len() {
        // Progs prints no newline after the byte count.
        out!(s, "\t\tunknown stats item bytes {}", d.len() - known);
        let mut i = DEV_STAT_VALUES_MAX;
        while i * 8 < d.len() {
            out!(s, "\t\tunknown item {i} offset {} value {}\n", i * 8, v(i));
            i += 1;
        }
    }
}

fn print_balance_args(s: &mut String, a: &[u8]) {
    out!(
        s,
        "\t\tprofiles {} devid {} target {} flags {}\n",
        rd_u64(a, 0),
        rd_u64(a, 16),
        rd_u64(a, 56),
        rd_u64(a, 64)
    );
    out!(
        s,
        "\t\tusage_min {} usage_max {} pstart {} pend {}\n",
        rd_u32(a, 8),
        rd_u32(a, 12),
        rd_u64(a, 24),
        rd_u64(a, 32)
    );
    out!(
        s,
        "\t\tvstart {} vend {} limit_min {} limit_max {}\n",
        rd_u64(a, 40),
        rd_u64(a, 48),
        rd_u32(a, 72),
        rd_u32(a, 76)
    );
    out!(
        s,
        "\t\tstripes_min {} stripes_max {}\n",
        rd_u32(a, 80),
        rd_u32(a, 84)
    );
}

fn print_balance_item(s: &mut String, d: &[u8]) {
    out!(s, "\t\tbalance status flags {}\n", rd_u64(d, 0));
    for (i, name) in ["DATA", "METADATA", "SYSTEM"].iter().enumerate() {
        out!(s, "\t\t{name}\n");
        let a = padded(
            slice_at(d, 8 + i * DISK_BALANCE_ARGS_SIZE, DISK_BALANCE_ARGS_SIZE),
            DISK_BALANCE_ARGS_SIZE,
        );
        print_balance_args(s, &a);
    }
}

fn print_dev_replace(s: &mut String, d: &[u8]) {
    let mode = match rd_u64(d, 24) {
        0 => "ALWAYS".to_string(),
        1 => "AVOID".to_string(),
        m => format!("unknown({m})"),
    };
    let state = match rd_u64(d, 32) {
        0 => "NEVER_STARTED".to_string(),
        1 => "STARTED".to_string(),
        2 => "FINISHED".to_string(),
        3 => "CANCELED".to_string(),
        4 => "SUSPENDED".to_string(),
        m => format!("unknown({m})"),
    };
    out!(
        s,
        "\t\tsrc devid {} cursor left {} cursor right {} mode {mode}\n",
        rd_u64(d, 0) as i64,
        rd_u64(d, 8),
        rd_u64(d, 16)
    );
    out!(
        s,
        "\t\tstate {state} write errors {} uncorrectable read errors {}\n",
        rd_u64(d, 56),
        rd_u64(d, 64)
    );
    let started = rd_u64(d, 40);
    out!(
        s,
        "\t\tstart time {started} ({})\n",
        format_date(started as i64)
    );
    // Progs prints the start time again as the stop time; kept for identical output.
    out!(
        s,
        "\t\tstop time {started} ({})\n",
        format_date(started as i64)
    );
}

fn print_free_space_header(s: &mut String, d: &[u8]) {
    out!(s, "\t\tlocation {}\n", key_str(&rd_key(d, 0)));
    out!(
        s,
        "\t\tcache generation {} entries {} bitmaps {}\n",
        rd_u64(d, 17),
        rd_u64(d, 25),
        rd_u64(d, 33)
    );
}

/// The body lines of one leaf item (everything after its `item N key ...` line).
pub fn print_item(ctx: &PrintCtx, key: &Key, d: &[u8]) -> String {
    let mut s = String::new();
    if key.ty == 0 && key.objectid == FREE_SPACE_OBJECTID {
        print_free_space_header(&mut s, d);
    }
    match key.ty {
        INODE_ITEM_KEY => print_inode_item(&mut s, d),
        INODE_REF_KEY => print_inode_ref(&mut s, ctx, d),
        INODE_EXTREF_KEY => print_inode_extref(&mut s, ctx, d),
        DIR_ITEM_KEY | DIR_INDEX_KEY | XATTR_ITEM_KEY => print_dir_item(&mut s, ctx, d),
        DIR_LOG_INDEX_KEY | DIR_LOG_ITEM_KEY => {
            out!(s, "\t\tdir log end {}\n", rd_u64(d, 0))
        }
        ORPHAN_ITEM_KEY => s.push_str("\t\torphan item\n"),
        ROOT_ITEM_KEY => print_root_item(&mut s, d),
        ROOT_REF_KEY => print_root_ref(&mut s, "ref", d),
        ROOT_BACKREF_KEY => print_root_ref(&mut s, "backref", d),
        EXTENT_ITEM_KEY | METADATA_ITEM_KEY => print_extent_item(&mut s, key, d),
        TREE_BLOCK_REF_KEY => s.push_str("\t\ttree block backref\n"),
        SHARED_BLOCK_REF_KEY => s.push_str("\t\tshared block backref\n"),
        EXTENT_DATA_REF_KEY => out!(
            s,
            "\t\textent data backref root {} objectid {} offset {} count {}\n",
            objectid_str(rd_u64(d, 0), 0),
            rd_u64(d, 8),
            rd_u64(d, 16),
            rd_u32(d, 24)
        ),
        SHARED_DATA_REF_KEY => out!(s, "\t\tshared data backref count {}\n", rd_u32(d, 0)),
        EXTENT_OWNER_REF_KEY => out!(s, "\t\textent owner root {}\n", rd_u64(d, 0)),
        EXTENT_REF_V0_KEY => s.push_str("\t\textent ref v0 (deprecated)\n"),
        CSUM_ITEM_KEY => s.push_str("\t\tcsum item\n"),
        EXTENT_CSUM_KEY => print_extent_csum(&mut s, ctx, key, d),
        EXTENT_DATA_KEY => print_file_extent(&mut s, d),
        BLOCK_GROUP_ITEM_KEY => out!(
            s,
            "\t\tblock group used {} chunk_objectid {} flags {}\n",
            rd_u64(d, 0),
            rd_u64(d, 8),
            bg_flags_str(rd_u64(d, 16))
        ),
        FREE_SPACE_INFO_KEY => out!(
            s,
            "\t\tfree space info extent count {} flags {}\n",
            rd_u32(d, 0),
            rd_u32(d, 4)
        ),
        FREE_SPACE_EXTENT_KEY => s.push_str("\t\tfree space extent\n"),
        FREE_SPACE_BITMAP_KEY => s.push_str("\t\tfree space bitmap\n"),
        CHUNK_ITEM_KEY => print_chunk(&mut s, d),
        DEV_ITEM_KEY => print_dev_item(&mut s, d),
        DEV_EXTENT_KEY => print_dev_extent(&mut s, d),
        QGROUP_STATUS_KEY => print_qgroup_status(&mut s, ctx, d),
        QGROUP_RELATION_KEY => {}
        QGROUP_INFO_KEY => out!(
            s,
            "\t\tgeneration {}\n\
             \t\treferenced {} referenced_compressed {}\n\
             \t\texclusive {} exclusive_compressed {}\n",
            rd_u64(d, 0),
            rd_u64(d, 8),
            rd_u64(d, 16),
            rd_u64(d, 24),
            rd_u64(d, 32)
        ),
        QGROUP_LIMIT_KEY => out!(
            s,
            "\t\tflags {:x}\n\
             \t\tmax_referenced {} max_exclusive {}\n\
             \t\trsv_referenced {} rsv_exclusive {}\n",
            rd_u64(d, 0),
            rd_u64(d, 8) as i64,
            rd_u64(d, 16) as i64,
            rd_u64(d, 24) as i64,
            rd_u64(d, 32) as i64
        ),
        UUID_KEY_SUBVOL | UUID_KEY_RECEIVED_SUBVOL => {
            if !d.chunks_exact(8).remainder().is_empty() {
                out!(s, "btrfs: uuid item with illegal size {}!\n", d.len());
            } else {
                for c in d.chunks_exact(8) {
                    out!(s, "\t\tsubvol_id {}\n", rd_u64(c, 0));
                }
            }
        }
        STRING_ITEM_KEY => {
            let end = d.iter().position(|&c| c == 0).unwrap_or(d.len());
            out!(s, "\t\titem data {}\n", String::from_utf8_lossy(&d[..end]));
        }
        PERSISTENT_ITEM_KEY => {
            out!(
                s,
                "\t\tpersistent item objectid {} offset {}\n",
                objectid_str(key.objectid, PERSISTENT_ITEM_KEY),
                key.offset
            );
            if key.objectid == DEV_STATS_OBJECTID {
                print_dev_stats(&mut s, d);
            } else {
                out!(s, "\t\tunknown persistent item objectid {}\n", key.objectid);
            }
        }
        TEMPORARY_ITEM_KEY => {
            out!(
                s,
                "\t\ttemporary item objectid {} offset {}\n",
                objectid_str(key.objectid, TEMPORARY_ITEM_KEY),
                key.offset
            );
            match key.objectid {
                BALANCE_OBJECTID => print_balance_item(&mut s, d),
                CSUM_CHANGE_OBJECTID => {
                    match u16::try_from(key.offset).ok().and_then(CsumType::from_u16) {
                        Some(t) => out!(s, "\t\ttarget csum type {} ({})\n", t.name(), key.offset),
                        None => out!(s, "\t\tunknown csum type {}\n", key.offset),
                    }
                }
                o => out!(s, "\t\tunknown temporary item objectid {o}\n"),
            }
        }
        RAID_STRIPE_KEY => {
            for (i, c) in d.chunks_exact(16).enumerate() {
                out!(
                    s,
                    "\t\t\tstripe {i} devid {} physical {}\n",
                    rd_u64(c, 0),
                    rd_u64(c, 8)
                );
            }
        }
        DEV_REPLACE_KEY => print_dev_replace(&mut s, d),
        _ => {}
    }
    s
}

// ---------------------------------------------------------------------------
// Blocks
// ---------------------------------------------------------------------------

fn header_flags_str(flags: u64) -> String {
    let mut s = String::new();
    if flags & HEADER_FLAG_WRITTEN != 0 {
        s.push_str("WRITTEN");
    }
    if flags & HEADER_FLAG_RELOC != 0 {
        if !s.is_empty() {
            s.push('|');
        }
        s.push_str("RELOC");
    }
    s
}

fn node_ptrs_max(nodesize: u32) -> u32 {
    (nodesize as usize).saturating_sub(HEADER_SIZE) as u32 / KEY_PTR_SIZE as u32
}

/// Free bytes of a leaf as progs computes them: data size minus the span from the first
/// item's data end to the last item's data start, minus the item headers.
fn leaf_free_space(v: &BlockView<'_>, nodesize: u32) -> i64 {
    let nr = v.nritems() as usize;
    let data_size = nodesize as i64 - HEADER_SIZE as i64;
    if nr == 0 {
        return data_size;
    }
    let off = |i: usize| i64::from(rd_u32(v.buf, HEADER_SIZE + i * ITEM_SIZE + 17));
    let size = |i: usize| i64::from(rd_u32(v.buf, HEADER_SIZE + i * ITEM_SIZE + 21));
    let used = (off(0) + size(0)) - off(nr - 1) + (nr * ITEM_SIZE) as i64;
    // Progs does this in C int arithmetic.
    (data_size - used) as i32 as i64
}

fn print_header(s: &mut String, ctx: &PrintCtx, bytenr: u64, v: &BlockView<'_>) {
    let hdr_bytenr = v.bytenr();
    let level = v.level();
    let nr = v.nritems();
    let raw_flags = rd_u64(v.buf, 0x38);
    let flags = raw_flags & ((1u64 << BACKREF_REV_SHIFT) - 1);
    let rev = raw_flags >> BACKREF_REV_SHIFT;
    if level > 0 {
        out!(
            s,
            "node {bytenr} level {level} items {nr} free space {} generation {} owner {}\n",
            node_ptrs_max(ctx.nodesize).wrapping_sub(nr),
            v.generation(),
            objectid_str(v.owner(), 0)
        );
    } else {
        out!(
            s,
            "leaf {hdr_bytenr} items {nr} free space {} generation {} owner {}\n",
            leaf_free_space(v, ctx.nodesize),
            v.generation(),
            objectid_str(v.owner(), 0)
        );
    }
    let mut csum = String::new();
    if ctx.csum_headers {
        csum.push_str(" csum 0x");
        for b in slice_at(v.buf, 0, ctx.csum_type.size()) {
            out!(csum, "{b:02x}");
        }
    }
    out!(
        s,
        "{} {hdr_bytenr} flags 0x{flags:x}({}) backref revision {rev}{csum}\n",
        if level > 0 { "node" } else { "leaf" },
        header_flags_str(flags)
    );
    out!(
        s,
        "fs uuid {}\nchunk uuid {}\n",
        rd_uuid(v.buf, 0x20),
        rd_uuid(v.buf, 0x40)
    );
}

/// One tree block as dump-tree prints it: the header lines, then either every item with
/// its body (leaf) or every key pointer (node). `bytenr` is where the block was read.
pub fn print_block(ctx: &PrintCtx, bytenr: u64, buf: &[u8]) -> String {
    let v = BlockView::new(buf);
    let mut s = String::new();
    let nr = v.nritems();
    if v.level() > 0 {
        let max = node_ptrs_max(ctx.nodesize);
        if nr > max {
            out!(
                s,
                "WARNING: node nr_items corrupted, has {nr} limit {max}, continue anyway\n"
            );
        }
        print_header(&mut s, ctx, bytenr, &v);
        for i in 0..nr.min(max) as usize {
            let Ok(p) = v.key_ptr(i) else { break };
            out!(
                s,
                "\t{} block {} gen {}\n",
                key_str(&p.key),
                p.blockptr,
                p.generation
            );
        }
        return s;
    }
    print_header(&mut s, ctx, bytenr, &v);
    let data_size = (ctx.nodesize as usize).saturating_sub(HEADER_SIZE) as u64;
    for i in 0..nr as usize {
        let Ok(it) = v.item(i) else {
            out!(
                s,
                "ERROR: leaf {} slot {i} item header outside the block\n",
                v.bytenr()
            );
            break;
        };
        let (off, size) = (u64::from(it.offset), u64::from(it.size));
        if off > data_size || off + size > data_size {
            out!(
                s,
                "ERROR: leaf {} slot {i} pointer invalid, offset {off} size {size} leaf data limit {data_size}\n\
                 ERROR: skip remaining slots\n",
                v.bytenr()
            );
            break;
        }
        out!(
            s,
            "\titem {i} {} itemoff {off} itemsize {size}\n",
            key_str(&it.key)
        );
        let start = HEADER_SIZE + off as usize;
        let data = slice_at(buf, start, size as usize);
        s.push_str(&print_item(ctx, &it.key, data));
    }
    s
}

// ---------------------------------------------------------------------------
// dump-tree
// ---------------------------------------------------------------------------

/// Options of `dump-tree` beyond the tree / block selection.
#[derive(Clone, Debug, Default)]
pub struct DumpTreeOptions {
    /// `-t`: only this tree (None: every tree).
    pub tree: Option<u64>,
    /// `-b`: only these blocks (printed in ascending order, duplicates once).
    pub blocks: Vec<u64>,
    /// `--follow`: with `-b`, also print the children of a node.
    pub follow: bool,
    /// `--dfs`: print children depth-first instead of level by level (progs' default).
    pub dfs: bool,
    /// Print names as progs' `--hide-names` does.
    pub hide_names: bool,
    /// Print each block's header checksum (`--csum-headers`).
    pub csum_headers: bool,
    /// Print checksum items' values (`--csum-items`).
    pub csum_items: bool,
    /// `-e`: only the leaves of the extent and device trees.
    pub extents_only: bool,
    /// `-d`: only the root, chunk and device trees.
    pub device_only: bool,
    /// `-u`: only the uuid tree.
    pub uuid_only: bool,
    /// `-r`: one line per tree root instead of the trees.
    pub roots_only: bool,
    /// `-R`: like `-r`, plus the superblock's backup roots.
    pub backups: bool,
}

/// `dump-tree`: every tree (`tree` and `bytenr` None), one tree by id (`-t`), or one
/// block (`-b`, without its children). Output follows btrfs-progs v6.14 except for the
/// leading "btrfs-progs vX" banner line, which the caller may print.
///
/// Unreadable blocks are reported as `ERROR: ...` lines in the output and skipped. Only
/// an unreadable root tree (or, with `-b`, an unreadable requested block) is an error.
pub fn dump_tree(
    fs: &FsInfo,
    tree: Option<u64>,
    bytenr: Option<u64>,
    out: &mut dyn Write,
) -> Result<()> {
    let opts = DumpTreeOptions {
        tree,
        blocks: bytenr.into_iter().collect(),
        ..Default::default()
    };
    dump_tree_with(fs, &opts, out)
}

fn werr(e: std::io::Error) -> Error {
    Error::io("writing the tree dump", e)
}

struct Dumper<'a> {
    fs: &'a FsInfo,
    ctx: PrintCtx,
    dfs: bool,
    out: &'a mut dyn Write,
    /// Blocks printed in the current tree. A well-formed tree reaches each block
    /// once; a hostile one can point many nodes at one subtree and make the dump
    /// exponentially long, so a block is printed only the first time.
    seen: std::collections::HashSet<u64>,
}

impl Dumper<'_> {
    fn write(&mut self, s: &str) -> Result<()> {
        self.out.write_all(s.as_bytes()).map_err(werr)
    }

    /// Reads a block for printing. A block the tree checker rejects but whose checksum
    /// and address are right is still printed (after a warning line): a debugging dump
    /// should show damaged blocks, as progs does (it skips the item checks).
    fn read(&mut self, bytenr: u64, expect: &Expect) -> Result<Option<Arc<TreeBlock>>> {
        match self.fs.read_tree_block(bytenr, expect) {
            Ok(b) => Ok(Some(b)),
            Err(e) => {
                let e = match e {
                    Error::Corrupt(m) => m,
                    e => e.to_string(),
                };
                if let Some(data) = self.read_raw(bytenr) {
                    self.write(&format!(
                        "WARNING: tree block {bytenr} fails validation, printed anyway: {e}\n"
                    ))?;
                    return Ok(Some(Arc::new(TreeBlock { bytenr, data })));
                }
                self.write(&format!("ERROR: failed to read tree block {bytenr}: {e}\n"))?;
                Ok(None)
            }
        }
    }

    /// Some copy of the block whose checksum, address and fsid are right.
    fn read_raw(&self, bytenr: u64) -> Option<Vec<u8>> {
        let fs = self.fs;
        let mirrors = fs.num_mirrors(bytenr).ok()?;
        let n = fs.csum_type.size();
        for m in 0..mirrors {
            let mut data = vec![0u8; fs.nodesize as usize];
            if fs.read_logical(bytenr, &mut data, m).is_err() {
                continue;
            }
            let c = fs.csum_type.compute(&data[CSUM_SIZE_MAX..]);
            let v = BlockView::new(&data);
            if c[..n] == data[..n]
                && v.bytenr() == bytenr
                && data[0x20..0x30] == fs.sb.metadata_fsid()[..]
                && v.level() < MAX_LEVEL
            {
                return Some(data);
            }
        }
        None
    }

    /// Prints a block and, when `follow` and it is a node, everything below it.
    fn tree(&mut self, root: &TreeBlock, follow: bool) -> Result<()> {
        let s = print_block(&self.ctx, root.bytenr, &root.data);
        self.write(&s)?;
        if !follow || root.level() == 0 {
            return Ok(());
        }
        if self.dfs {
            self.dfs_children(root)
        } else {
            self.bfs_children(root)
        }
    }

    /// Reads child `i` of a node. None (after an error or warning line) when it cannot
    /// be read or is not one level below its parent.
    fn child(&mut self, parent: &TreeBlock, i: usize) -> Result<Option<Arc<TreeBlock>>> {
        let Ok(p) = parent.view().key_ptr(i) else {
            return Ok(None);
        };
        let want = parent.level() - 1;
        if !self.seen.insert(p.blockptr) {
            self.write(&format!(
                "WARNING: tree block {} (parent {} slot {i}) was already printed in this tree, not repeated\n",
                p.blockptr, parent.bytenr
            ))?;
            return Ok(None);
        }
        let expect = Expect {
            level: Some(want),
            generation: Some(p.generation),
            first_key: Some(p.key),
        };
        let Some(b) = self.read(p.blockptr, &expect)? else {
            return Ok(None);
        };
        if b.level() != want {
            self.write(&format!(
                "WARNING: eb corrupted: parent bytenr {} slot {i} level {} child bytenr {} level has {} expect {want}, skipping the slot\n",
                parent.bytenr,
                parent.level(),
                b.bytenr,
                b.level()
            ))?;
            return Ok(None);
        }
        Ok(Some(b))
    }

    /// Pointers of a node that are printed and followed.
    fn nptrs(&self, node: &TreeBlock) -> usize {
        node.view().nritems().min(node_ptrs_max(self.ctx.nodesize)) as usize
    }

    /// Level by level, left to right: all blocks of one level, then the next.
    fn bfs_children(&mut self, root: &TreeBlock) -> Result<()> {
        let mut parents: Vec<Arc<TreeBlock>>;
        let mut level: Vec<&TreeBlock> = vec![root];
        loop {
            let mut next = Vec::new();
            for p in level {
                for i in 0..self.nptrs(p) {
                    let Some(kid) = self.child(p, i)? else {
                        continue;
                    };
                    self.write(&print_block(&self.ctx, kid.bytenr, &kid.data))?;
                    if kid.level() > 0 {
                        next.push(kid);
                    }
                }
            }
            if next.is_empty() {
                return Ok(());
            }
            parents = next;
            level = parents.iter().map(|b| b.as_ref()).collect();
        }
    }

    /// Each child fully (its own children included) before the next one.
    fn dfs_children(&mut self, node: &TreeBlock) -> Result<()> {
        for i in 0..self.nptrs(node) {
            if let Some(b) = self.child(node, i)? {
                self.tree(&b, true)?;
            }
        }
        Ok(())
    }

    /// Reads a tree's root block and prints the whole tree.
    fn whole_tree(&mut self, bytenr: u64, level: Option<u8>) -> Result<()> {
        self.seen.clear();
        self.seen.insert(bytenr);
        let expect = Expect {
            level,
            ..Default::default()
        };
        if let Some(b) = self.read(bytenr, &expect)? {
            self.tree(&b, true)?;
        }
        Ok(())
    }

    /// Every ROOT_ITEM of the tree rooted at `root` (the root tree or the log root
    /// tree), in key order: (key, bytenr, level).
    fn root_items(&mut self, root: &crate::tree::RootPtr) -> Result<Vec<(Key, u64, u8)>> {
        let mut v = Vec::new();
        walk_items(self.fs, root, Key::new(0, ROOT_ITEM_KEY, 0), |k, d| {
            if k.ty == ROOT_ITEM_KEY {
                let d = padded(d, RootItem::SIZE);
                if let Ok(ri) = RootItem::parse(&d) {
                    v.push((*k, ri.bytenr, ri.level));
                }
            }
            Ok(true)
        })?;
        Ok(v)
    }

    fn scan_roots(&mut self, root: &crate::tree::RootPtr, o: &DumpTreeOptions) -> Result<()> {
        let items = match self.root_items(root) {
            Ok(v) => v,
            Err(e) if root.id != ROOT_TREE_OBJECTID => {
                self.write(&format!(
                    "ERROR: cannot read ROOT_ITEM from tree {}: {e}\n",
                    root.id as i64
                ))?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let roots_only = o.roots_only || o.backups;
        for (k, bytenr, level) in items {
            if o.tree.is_some_and(|t| t != k.objectid) {
                continue;
            }
            // Which trees -e / -d / -u keep.
            let only = o.extents_only || o.device_only || o.uuid_only;
            let skip = match k.objectid {
                EXTENT_TREE_OBJECTID => o.device_only || o.uuid_only,
                DEV_TREE_OBJECTID => o.uuid_only,
                ROOT_TREE_DIR_OBJECTID => false,
                UUID_TREE_OBJECTID => o.extents_only || o.device_only,
                _ => only,
            };
            if skip {
                continue;
            }
            let expect = Expect {
                level: Some(level),
                ..Default::default()
            };
            let Some(b) = self.read(bytenr, &expect)? else {
                continue;
            };
            let head = format!("{} tree {}", tree_label(k.objectid), key_str(&k));
            if o.extents_only {
                self.write(&format!("{head}\n"))?;
                self.extents(&b)?;
            } else if roots_only {
                self.write(&format!("{head} {} level {}\n", b.bytenr, b.level()))?;
            } else {
                self.write(&format!("{head} \n"))?;
                self.tree(&b, true)?;
            }
        }
        Ok(())
    }

    /// `-e`: the leaves below a block, depth-first, without node headers or checksums.
    fn extents(&mut self, b: &TreeBlock) -> Result<()> {
        if b.level() == 0 {
            let ctx = PrintCtx {
                csum_headers: false,
                csum_items: false,
                ..self.ctx.clone()
            };
            return self.write(&print_block(&ctx, b.bytenr, &b.data));
        }
        for i in 0..self.nptrs(b) {
            let Ok(p) = b.view().key_ptr(i) else { break };
            let expect = Expect {
                level: Some(b.level() - 1),
                generation: Some(p.generation),
                first_key: Some(p.key),
            };
            let Some(next) = self.read(p.blockptr, &expect)? else {
                continue;
            };
            if u16::from(next.level()) + 1 != u16::from(b.level()) {
                return self.write(&format!(
                    "WARNING: eb corrupted: item {i} eb level {} next level {}, skipping the rest\n",
                    next.level(),
                    b.level()
                ));
            }
            self.extents(&next)?;
        }
        Ok(())
    }

    /// `-R`: the superblock's four backup root slots.
    fn old_roots(&mut self) -> Result<()> {
        let sb = &self.fs.sb;
        let extent = if sb.incompat_flags & FEATURE_INCOMPAT_EXTENT_TREE_V2 != 0 {
            "block group root"
        } else {
            "extent root"
        };
        let mut s = String::new();
        for (i, b) in sb.backup_roots.iter().enumerate() {
            out!(s, "btrfs root backup slot {i}\n");
            out!(
                s,
                "\ttree root gen {} block {}\n",
                b.tree_root_gen,
                b.tree_root
            );
            out!(
                s,
                "\t\t{extent} gen {} block {}\n",
                b.extent_root_gen,
                b.extent_root
            );
            out!(
                s,
                "\t\tchunk root gen {} block {}\n",
                b.chunk_root_gen,
                b.chunk_root
            );
            out!(
                s,
                "\t\tdevice root gen {} block {}\n",
                b.dev_root_gen,
                b.dev_root
            );
            out!(
                s,
                "\t\tcsum root gen {} block {}\n",
                b.csum_root_gen,
                b.csum_root
            );
            out!(s, "\t\tfs root gen {} block {}\n", b.fs_root_gen, b.fs_root);
            out!(
                s,
                "\t\t{} used {} total {} devices\n",
                b.bytes_used,
                b.total_bytes,
                b.num_devices
            );
        }
        self.write(&s)
    }

    /// `-r`: "NAME tree: BYTENR level L" for a tree not in the root tree.
    fn root_line(&mut self, name: &str, bytenr: u64, level: Option<u8>) -> Result<()> {
        let expect = Expect {
            level,
            ..Default::default()
        };
        if let Some(b) = self.read(bytenr, &expect)? {
            self.write(&format!("{name} tree: {} level {}\n", b.bytenr, b.level()))?;
        }
        Ok(())
    }

    fn footer(&mut self) -> Result<()> {
        let sb = &self.fs.sb;
        let s = format!(
            "total bytes {}\nbytes used {}\nuuid {}\n",
            sb.total_bytes,
            sb.bytes_used,
            uuid_string(&sb.fsid)
        );
        self.write(&s)
    }

    fn log_root(&self) -> Option<crate::tree::RootPtr> {
        let sb = &self.fs.sb;
        (sb.log_root != 0).then_some(crate::tree::RootPtr {
            id: TREE_LOG_OBJECTID,
            bytenr: sb.log_root,
            level: sb.log_root_level,
            generation: sb.generation.saturating_add(1),
        })
    }
}

/// The word(s) before " tree key (...)" in dump-tree's per-tree headers.
fn tree_label(id: u64) -> &'static str {
    match id {
        ROOT_TREE_OBJECTID => "root",
        EXTENT_TREE_OBJECTID => "extent",
        CHUNK_TREE_OBJECTID => "chunk",
        DEV_TREE_OBJECTID => "device",
        FS_TREE_OBJECTID => "fs",
        ROOT_TREE_DIR_OBJECTID => "directory",
        CSUM_TREE_OBJECTID => "checksum",
        ORPHAN_OBJECTID => "orphan",
        TREE_LOG_OBJECTID => "log",
        TREE_LOG_FIXUP_OBJECTID => "log fixup",
        TREE_RELOC_OBJECTID => "reloc",
        DATA_RELOC_TREE_OBJECTID => "data reloc",
        EXTENT_CSUM_OBJECTID => "extent checksum",
        QUOTA_TREE_OBJECTID => "quota",
        UUID_TREE_OBJECTID => "uuid",
        FREE_SPACE_TREE_OBJECTID => "free space",
        MULTIPLE_OBJECTIDS => "multiple",
        BLOCK_GROUP_TREE_OBJECTID => "block group",
        RAID_STRIPE_TREE_OBJECTID => "raid stripe",
        _ => "file",
    }
}

/// [`dump_tree`] with every option.
pub fn dump_tree_with(fs: &FsInfo, opts: &DumpTreeOptions, out: &mut dyn Write) -> Result<()> {
    let mut d = Dumper {
        fs,
        ctx: PrintCtx::with_opts(fs, opts),
        dfs: opts.dfs,
        out,
        seen: std::collections::HashSet::new(),
    };
    if !opts.blocks.is_empty() {
        let mut blocks = opts.blocks.clone();
        blocks.sort_unstable();
        blocks.dedup();
        let mut failed = None;
        for bytenr in blocks {
            // The sector size is a power of two (checked when the superblock was read).
            if bytenr & (u64::from(fs.sectorsize) - 1) != 0 {
                d.write(&format!(
                    "ERROR: tree block bytenr {bytenr} is not aligned to sectorsize {}\n",
                    fs.sectorsize
                ))?;
                failed = Some(bytenr);
                continue;
            }
            match d.read(bytenr, &Expect::default())? {
                Some(b) => d.tree(&b, opts.follow)?,
                None => failed = Some(bytenr),
            }
        }
        return match failed {
            Some(b) => Err(Error::corrupt(format!("tree block {b} could not be read"))),
            None => Ok(()),
        };
    }

    let root_ptr = fs.root_tree_ptr();
    let root = crate::tree::ctree::read_root(fs, &root_ptr)?;
    let roots_only = opts.roots_only || opts.backups;
    if !(opts.extents_only || opts.uuid_only || opts.tree.is_some()) {
        let chunk = (fs.sb.chunk_root, Some(fs.sb.chunk_root_level));
        if roots_only {
            d.write(&format!(
                "root tree: {} level {}\n",
                root.bytenr,
                root.level()
            ))?;
            d.root_line("chunk", chunk.0, chunk.1)?;
            if let Some(log) = d.log_root() {
                d.root_line("log root", log.bytenr, Some(log.level))?;
            }
        } else {
            d.write("root tree\n")?;
            d.tree(&root, true)?;
            d.write("chunk tree\n")?;
            d.whole_tree(chunk.0, chunk.1)?;
            if let Some(log) = d.log_root() {
                d.write("log root tree\n")?;
                d.whole_tree(log.bytenr, Some(log.level))?;
            }
        }
    }
    match opts.tree {
        Some(ROOT_TREE_OBJECTID) => {
            d.write("root tree\n")?;
            return d.tree(&root, true);
        }
        Some(CHUNK_TREE_OBJECTID) => {
            d.write("chunk tree\n")?;
            return d.whole_tree(fs.sb.chunk_root, Some(fs.sb.chunk_root_level));
        }
        Some(TREE_LOG_OBJECTID) => {
            let Some(log) = d.log_root() else {
                return d.write("ERROR: cannot print log root tree, invalid pointer\n");
            };
            d.write("log root tree\n")?;
            return d.whole_tree(log.bytenr, Some(log.level));
        }
        Some(BLOCK_GROUP_TREE_OBJECTID) => {
            let Some(p) = fs.tree_ptr(BLOCK_GROUP_TREE_OBJECTID) else {
                return d.write("ERROR: cannot print block group tree, invalid pointer\n");
            };
            d.write("block group tree\n")?;
            return d.whole_tree(p.bytenr, Some(p.level));
        }
        _ => {}
    }
    d.scan_roots(&root_ptr, opts)?;
    if let Some(log) = d.log_root() {
        d.scan_roots(&log, opts)?;
    }
    if opts.extents_only || opts.device_only || opts.uuid_only {
        return Ok(());
    }
    if opts.backups {
        d.old_roots()?;
    }
    d.footer()
}

/// A `-t` argument: a tree id number, or a name the way progs accepts it (any case,
/// optional `BTRFS_` prefix and `_TREE` / `_OBJECTID` suffixes): root, extent, chunk,
/// dev/device, fs, csum/checksum, quota, uuid, free-space, tree-log, tree-log-fixup,
/// tree-reloc, data-reloc, block-group, raid-stripe (`-` or `_`).
pub fn parse_tree_name(s: &str) -> Option<u64> {
    if !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) {
        return s.parse::<u64>().ok().filter(|&id| id != 0);
    }
    const NAMES: &[(&str, u64)] = &[
        ("ROOT", ROOT_TREE_OBJECTID),
        ("EXTENT", EXTENT_TREE_OBJECTID),
        ("CHUNK", CHUNK_TREE_OBJECTID),
        ("DEVICE", DEV_TREE_OBJECTID),
        ("DEV", DEV_TREE_OBJECTID),
        ("FS", FS_TREE_OBJECTID),
        ("CSUM", CSUM_TREE_OBJECTID),
        ("CHECKSUM", CSUM_TREE_OBJECTID),
        ("QUOTA", QUOTA_TREE_OBJECTID),
        ("UUID", UUID_TREE_OBJECTID),
        ("FREE_SPACE", FREE_SPACE_TREE_OBJECTID),
        ("FREE-SPACE", FREE_SPACE_TREE_OBJECTID),
        ("TREE_LOG_FIXUP", TREE_LOG_FIXUP_OBJECTID),
        ("TREE-LOG-FIXUP", TREE_LOG_FIXUP_OBJECTID),
        ("TREE_LOG", TREE_LOG_OBJECTID),
        ("TREE-LOG", TREE_LOG_OBJECTID),
        ("TREE_RELOC", TREE_RELOC_OBJECTID),
        ("TREE-RELOC", TREE_RELOC_OBJECTID),
        ("DATA_RELOC", DATA_RELOC_TREE_OBJECTID),
        ("DATA-RELOC", DATA_RELOC_TREE_OBJECTID),
        ("BLOCK_GROUP", BLOCK_GROUP_TREE_OBJECTID),
        ("BLOCK-GROUP", BLOCK_GROUP_TREE_OBJECTID),
        ("RAID_STRIPE", RAID_STRIPE_TREE_OBJECTID),
        ("RAID-STRIPE", RAID_STRIPE_TREE_OBJECTID),
    ];
    fn strip<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
        let head = s.get(..prefix.len())?;
        head.eq_ignore_ascii_case(prefix)
            .then(|| &s[prefix.len()..])
    }
    let s = strip(s, "BTRFS_").unwrap_or(s);
    let (rest, id) = NAMES
        .iter()
        .find_map(|(n, id)| strip(s, n).map(|r| (r, *id)))?;
    let rest = strip(rest, "_TREE").unwrap_or(rest);
    let rest = strip(rest, "_OBJECTID").unwrap_or(rest);
    rest.is_empty().then_some(id)
}

// ---------------------------------------------------------------------------
// dump-super
// ---------------------------------------------------------------------------

/// The parenthesized, one-name-per-line flag list under a flags line (nothing when no
/// bit is set).
fn readable_flags(s: &mut String, flags: u64, table: &[(u64, &str)]) {
    if flags == 0 {
        return;
    }
    let known: u64 = table.iter().fold(0, |a, (b, _)| a | b);
    let mut names: Vec<String> = table
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    if flags & !known != 0 {
        names.push(format!("unknown flag: 0x{:x}", flags & !known));
    }
    s.push_str("\t\t\t( ");
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            s.push_str("|\n\t\t\t  ");
        }
        out!(s, "{n} ");
    }
    s.push_str(")\n");
}

const SUPER_FLAG_NAMES: &[(u64, &str)] = &[
    (HEADER_FLAG_WRITTEN, "WRITTEN"),
    (HEADER_FLAG_RELOC, "RELOC"),
    (SUPER_FLAG_CHANGING_FSID, "CHANGING_FSID"),
    (SUPER_FLAG_CHANGING_FSID_V2, "CHANGING_FSID_V2"),
    (SUPER_FLAG_SEEDING, "SEEDING"),
    (SUPER_FLAG_METADUMP, "METADUMP"),
    (SUPER_FLAG_METADUMP_V2, "METADUMP_V2"),
    (SUPER_FLAG_CHANGING_BG_TREE, "CHANGING_BG_TREE"),
    (SUPER_FLAG_CHANGING_DATA_CSUM, "CHANGING_DATA_CSUM"),
    (SUPER_FLAG_CHANGING_META_CSUM, "CHANGING_META_CSUM"),
];

/// compat_ro names progs v6.14 knows (it has no name for VERITY, which prints as an
/// unknown flag there too).
const COMPAT_RO_NAMES: &[(u64, &str)] = &[
    (FEATURE_COMPAT_RO_FREE_SPACE_TREE, "FREE_SPACE_TREE"),
    (
        FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID,
        "FREE_SPACE_TREE_VALID",
    ),
    (FEATURE_COMPAT_RO_BLOCK_GROUP_TREE, "BLOCK_GROUP_TREE"),
];

const INCOMPAT_NAMES: &[(u64, &str)] = &[
    (FEATURE_INCOMPAT_MIXED_BACKREF, "MIXED_BACKREF"),
    (FEATURE_INCOMPAT_DEFAULT_SUBVOL, "DEFAULT_SUBVOL"),
    (FEATURE_INCOMPAT_MIXED_GROUPS, "MIXED_GROUPS"),
    (FEATURE_INCOMPAT_COMPRESS_LZO, "COMPRESS_LZO"),
    (FEATURE_INCOMPAT_COMPRESS_ZSTD, "COMPRESS_ZSTD"),
    (FEATURE_INCOMPAT_BIG_METADATA, "BIG_METADATA"),
    (FEATURE_INCOMPAT_EXTENDED_IREF, "EXTENDED_IREF"),
    (FEATURE_INCOMPAT_RAID56, "RAID56"),
    (FEATURE_INCOMPAT_SKINNY_METADATA, "SKINNY_METADATA"),
    (FEATURE_INCOMPAT_NO_HOLES, "NO_HOLES"),
    (FEATURE_INCOMPAT_METADATA_UUID, "METADATA_UUID"),
    (FEATURE_INCOMPAT_RAID1C34, "RAID1C34"),
    (FEATURE_INCOMPAT_ZONED, "ZONED"),
    (FEATURE_INCOMPAT_EXTENT_TREE_V2, "EXTENT_TREE_V2"),
    (FEATURE_INCOMPAT_RAID_STRIPE_TREE, "RAID_STRIPE_TREE"),
    (FEATURE_INCOMPAT_SIMPLE_QUOTA, "SIMPLE_QUOTA"),
];

fn printable(b: &[u8]) -> String {
    b.iter()
        .map(|&c| if is_print(c) { c as char } else { '.' })
        .collect()
}

/// Text of `dump-super` (without `-f`) for one superblock read at `bytenr` of `device`:
/// the "superblock: ..." and dashes lines, every field, and the closing blank line.
pub fn dump_super(sb: &SuperBlock, bytenr: u64, device: &str) -> String {
    dump_super_with(sb, bytenr, device, false)
}

/// Text of `dump-super` with `full` = `-f`: the sys_chunk_array and backup roots go
/// after the fields, before the closing blank line.
pub fn dump_super_with(sb: &SuperBlock, bytenr: u64, device: &str, full: bool) -> String {
    let mut s = String::new();
    out!(s, "superblock: bytenr={bytenr}, device={device}\n");
    s.push_str("---------------------------------------------------------\n");
    super_fields(&mut s, sb);
    if full {
        s.push_str(&dump_super_full(sb));
    }
    s.push('\n');
    s
}

fn super_fields(s: &mut String, sb: &SuperBlock) {
    let ct = sb.csum_type();
    out!(
        s,
        "csum_type\t\t{} ({})\n",
        sb.csum_type_raw,
        ct.map_or("INVALID", |t| t.name())
    );
    let csum_size = ct.map_or(CSUM_SIZE_MAX, |t| t.size());
    out!(s, "csum_size\t\t{csum_size}\n");
    s.push_str("csum\t\t\t0x");
    for b in &sb.csum[..csum_size] {
        out!(s, "{b:02x}");
    }
    s.push_str(match ct {
        None => " [UNKNOWN CSUM TYPE OR SIZE]\n",
        Some(_) if sb.raw.len() >= SUPER_INFO_SIZE && sb.verify_csum().is_ok() => " [match]\n",
        Some(_) => " [DON'T MATCH]\n",
    });
    out!(s, "bytenr\t\t\t{}\n", sb.bytenr);
    out!(s, "flags\t\t\t0x{:x}\n", sb.flags);
    readable_flags(s, sb.flags, SUPER_FLAG_NAMES);
    out!(
        s,
        "magic\t\t\t{} {}\n",
        printable(&sb.magic.to_le_bytes()),
        if sb.magic == BTRFS_MAGIC {
            "[match]"
        } else {
            "[DON'T MATCH]"
        }
    );
    out!(s, "fsid\t\t\t{}\n", uuid_string(&sb.fsid));
    out!(s, "metadata_uuid\t\t{}\n", uuid_string(&sb.metadata_uuid));
    let label_end = sb
        .label_raw
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(sb.label_raw.len());
    out!(s, "label\t\t\t{}\n", printable(&sb.label_raw[..label_end]));
    out!(s, "generation\t\t{}\n", sb.generation);
    out!(s, "root\t\t\t{}\n", sb.root);
    out!(s, "sys_array_size\t\t{}\n", sb.sys_chunk_array_size);
    out!(s, "chunk_root_generation\t{}\n", sb.chunk_root_generation);
    out!(s, "root_level\t\t{}\n", sb.root_level);
    out!(s, "chunk_root\t\t{}\n", sb.chunk_root);
    out!(s, "chunk_root_level\t{}\n", sb.chunk_root_level);
    out!(s, "log_root\t\t{}\n", sb.log_root);
    out!(
        s,
        "log_root_transid (deprecated)\t{}\n",
        sb.log_root_transid
    );
    out!(s, "log_root_level\t\t{}\n", sb.log_root_level);
    out!(s, "total_bytes\t\t{}\n", sb.total_bytes);
    out!(s, "bytes_used\t\t{}\n", sb.bytes_used);
    out!(s, "sectorsize\t\t{}\n", sb.sectorsize);
    out!(s, "nodesize\t\t{}\n", sb.nodesize);
    out!(s, "leafsize (deprecated)\t{}\n", sb.leafsize);
    out!(s, "stripesize\t\t{}\n", sb.stripesize);
    out!(s, "root_dir\t\t{}\n", sb.root_dir_objectid);
    out!(s, "num_devices\t\t{}\n", sb.num_devices);
    out!(s, "compat_flags\t\t0x{:x}\n", sb.compat_flags);
    out!(s, "compat_ro_flags\t\t0x{:x}\n", sb.compat_ro_flags);
    readable_flags(s, sb.compat_ro_flags, COMPAT_RO_NAMES);
    out!(s, "incompat_flags\t\t0x{:x}\n", sb.incompat_flags);
    readable_flags(s, sb.incompat_flags, INCOMPAT_NAMES);
    out!(s, "cache_generation\t{}\n", sb.cache_generation);
    out!(s, "uuid_tree_generation\t{}\n", sb.uuid_tree_generation);
    let di = &sb.dev_item;
    out!(s, "dev_item.uuid\t\t{}\n", uuid_string(&di.uuid));
    let want = if sb.incompat_flags & FEATURE_INCOMPAT_METADATA_UUID != 0 {
        sb.metadata_uuid
    } else {
        sb.fsid
    };
    out!(
        s,
        "dev_item.fsid\t\t{} {}\n",
        uuid_string(&di.fsid),
        if di.fsid == want {
            "[match]"
        } else {
            "[DON'T MATCH]"
        }
    );
    out!(s, "dev_item.type\t\t{}\n", di.ty);
    out!(s, "dev_item.total_bytes\t{}\n", di.total_bytes);
    out!(s, "dev_item.bytes_used\t{}\n", di.bytes_used);
    out!(s, "dev_item.io_align\t{}\n", di.io_align);
    out!(s, "dev_item.io_width\t{}\n", di.io_width);
    out!(s, "dev_item.sector_size\t{}\n", di.sector_size);
    out!(s, "dev_item.devid\t\t{}\n", di.devid);
    out!(s, "dev_item.dev_group\t{}\n", di.dev_group);
    out!(s, "dev_item.seek_speed\t{}\n", di.seek_speed);
    out!(s, "dev_item.bandwidth\t{}\n", di.bandwidth);
    out!(s, "dev_item.generation\t{}\n", di.generation);
}

/// The part `dump-super -f` adds after the fields: `sys_chunk_array[2048]:` with every
/// SYSTEM chunk, then `backup_roots[4]:` with every non-empty backup slot.
pub fn dump_super_full(sb: &SuperBlock) -> String {
    let mut s = String::new();
    out!(s, "sys_chunk_array[{SYSTEM_CHUNK_ARRAY_SIZE}]:\n");
    sys_chunk_array(&mut s, sb);
    out!(
        s,
        "backup_roots[{}]:\n",
        ubtrfs_format::superblock::NUM_BACKUP_ROOTS
    );
    let etv2 = sb.incompat_flags & FEATURE_INCOMPAT_EXTENT_TREE_V2 != 0;
    for (i, b) in sb.backup_roots.iter().enumerate() {
        if b.tree_root == 0 && b.tree_root_gen == 0 {
            continue;
        }
        out!(s, "\tbackup {i}:\n");
        let line = |s: &mut String, name: &str, tabs: &str, root: u64, gen: u64, level: u8| {
            out!(s, "\t\t{name}:{tabs}{root}\tgen: {gen}\tlevel: {level}\n")
        };
        line(
            &mut s,
            "backup_tree_root",
            "\t",
            b.tree_root,
            b.tree_root_gen,
            b.tree_root_level,
        );
        line(
            &mut s,
            "backup_chunk_root",
            "\t",
            b.chunk_root,
            b.chunk_root_gen,
            b.chunk_root_level,
        );
        line(
            &mut s,
            if etv2 {
                "backup_block_group_root"
            } else {
                "backup_extent_root"
            },
            "\t",
            b.extent_root,
            b.extent_root_gen,
            b.extent_root_level,
        );
        line(
            &mut s,
            "backup_fs_root",
            "\t\t",
            b.fs_root,
            b.fs_root_gen,
            b.fs_root_level,
        );
        line(
            &mut s,
            "backup_dev_root",
            "\t",
            b.dev_root,
            b.dev_root_gen,
            b.dev_root_level,
        );
        line(
            &mut s,
            "csum_root",
            "\t",
            b.csum_root,
            b.csum_root_gen,
            b.csum_root_level,
        );
        out!(s, "\t\tbackup_total_bytes:\t{}\n", b.total_bytes);
        out!(s, "\t\tbackup_bytes_used:\t{}\n", b.bytes_used);
        out!(s, "\t\tbackup_num_devices:\t{}\n", b.num_devices);
        s.push('\n');
    }
    s
}

fn sys_chunk_array(s: &mut String, sb: &SuperBlock) {
    let size = sb.sys_chunk_array_size as usize;
    if size > SYSTEM_CHUNK_ARRAY_SIZE {
        out!(
            s,
            "ERROR: sys_array_size {size} shouldn't exceed {SYSTEM_CHUNK_ARRAY_SIZE} bytes\n"
        );
        return;
    }
    let arr = slice_at(&sb.sys_chunk_array, 0, size);
    let mut cur = 0usize;
    let mut item = 0usize;
    while cur < size {
        if cur + DISK_KEY_SIZE > size {
            out!(
                s,
                "ERROR: sys_array too short to read {DISK_KEY_SIZE} bytes at offset {cur}\n"
            );
            return;
        }
        let key = rd_key(arr, cur);
        cur += DISK_KEY_SIZE;
        out!(s, "\titem {item} {}\n", key_str(&key));
        if key.ty != CHUNK_ITEM_KEY {
            out!(
                s,
                "ERROR: unexpected item type {} in sys_array at offset {cur}\n",
                key.ty
            );
            return;
        }
        let min = CHUNK_BASE_SIZE + STRIPE_SIZE;
        if cur + min > size {
            out!(
                s,
                "ERROR: sys_array too short to read {min} bytes at offset {cur}\n"
            );
            return;
        }
        let num_stripes = rd_u16(arr, cur + 44) as usize;
        if num_stripes == 0 {
            out!(
                s,
                "ERROR: invalid number of stripes {num_stripes} in sys_array at offset {cur}\n"
            );
            return;
        }
        let len = CHUNK_BASE_SIZE + STRIPE_SIZE * num_stripes;
        if cur + len > size {
            out!(
                s,
                "ERROR: sys_array too short to read {len} bytes at offset {cur}\n"
            );
            return;
        }
        print_chunk(s, &arr[cur..cur + len]);
        cur += len;
        item += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Little-endian byte builder.
    #[derive(Default)]
    struct B(Vec<u8>);
    impl B {
        fn u8(mut self, v: u8) -> Self {
            self.0.push(v);
            self
        }
        fn u16(mut self, v: u16) -> Self {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u32(mut self, v: u32) -> Self {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u64(mut self, v: u64) -> Self {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn key(self, k: Key) -> Self {
            self.u64(k.objectid).u8(k.ty).u64(k.offset)
        }
        fn bytes(mut self, b: &[u8]) -> Self {
            self.0.extend_from_slice(b);
            self
        }
    }

    fn item(key: Key, data: &[u8]) -> String {
        print_item(&PrintCtx::default(), &key, data)
    }

    #[test]
    fn keys_like_progs() {
        let k = |o, t, off| key_str(&Key::new(o, t, off));
        assert_eq!(
            k(FS_TREE_OBJECTID, ROOT_ITEM_KEY, u64::MAX),
            "key (FS_TREE ROOT_ITEM 18446744073709551615)"
        );
        assert_eq!(k(257, DIR_ITEM_KEY, u64::MAX), "key (257 DIR_ITEM -1)");
        assert_eq!(k(0, 0, 0), "key (0 UNKNOWN.0 0)");
        assert_eq!(
            k(0, PERSISTENT_ITEM_KEY, 1),
            "key (DEV_STATS PERSISTENT_ITEM 1)"
        );
        assert_eq!(k(0, QGROUP_INFO_KEY, 5), "key (0 QGROUP_INFO 0/5)");
        assert_eq!(
            k((1 << 48) | 100, QGROUP_RELATION_KEY, 256),
            "key (1/100 QGROUP_RELATION 0/256)"
        );
        assert_eq!(
            k(0x28452e8608a81957, UUID_KEY_SUBVOL, 0x0140510f56bbe0a5),
            "key (0x28452e8608a81957 UUID_KEY_SUBVOL 0x0140510f56bbe0a5)"
        );
        assert_eq!(
            k(FREE_SPACE_OBJECTID, 0, 30408704),
            "key (FREE_SPACE UNTYPED 30408704)"
        );
        assert_eq!(
            k(256, CHUNK_ITEM_KEY, 22020096),
            "key (FIRST_CHUNK_TREE CHUNK_ITEM 22020096)"
        );
        assert_eq!(k(256, INODE_ITEM_KEY, 0), "key (256 INODE_ITEM 0)");
        assert_eq!(k(1, DEV_ITEM_KEY, 1), "key (DEV_ITEMS DEV_ITEM 1)");
        assert_eq!(k(1, DEV_EXTENT_KEY, 4096), "key (1 DEV_EXTENT 4096)");
        assert_eq!(
            k(TREE_RELOC_OBJECTID, ROOT_ITEM_KEY, 5),
            "key (TREE_RELOC ROOT_ITEM FS_TREE)"
        );
        assert_eq!(
            k(TREE_LOG_FIXUP_OBJECTID, INODE_ITEM_KEY, 0),
            "key (LOG_FIXUP INODE_ITEM 0)"
        );
        assert_eq!(k(2, 120, 0), "key (EXTENT_TREE CSUM_ITEM 0)");
        assert_eq!(k(7, 77, 0), "key (CSUM_TREE UNKNOWN.77 0)");
    }

    #[test]
    fn times() {
        assert_eq!(format_timespec(0, 0), "0.0 (1970-01-01 00:00:00)");
        assert_eq!(
            format_timespec(1795310728, 367613586),
            "1795310728.367613586 (2026-11-22 01:25:28)"
        );
        assert_eq!(format_date(951782400), "2000-02-29 00:00:00");
        assert_eq!(format_date(951868800), "2000-03-01 00:00:00");
        assert_eq!(format_date(-1), "1969-12-31 23:59:59");
        assert_eq!(format_date(4107542399), "2100-02-28 23:59:59");
        assert_eq!(format_date(4107542400), "2100-03-01 00:00:00");
    }

    #[test]
    fn inode_item() {
        let mut b = B::default()
            .u64(7) // generation
            .u64(8) // transid
            .u64(6) // size
            .u64(4096) // nbytes
            .u64(0) // block group
            .u32(2) // nlink
            .u32(1000)
            .u32(100)
            .u32(0o100644)
            .u64(0)
            .u64(INODE_NODATASUM | INODE_NODATACOW | (1 << 20))
            .u64(3)
            .bytes(&[0; 32]);
        for t in [1u64, 2, 3, 4] {
            b = b.u64(1700000000 + t).u32(t as u32 * 10);
        }
        assert_eq!(
            item(Key::new(257, INODE_ITEM_KEY, 0), &b.0),
            "\t\tgeneration 7 transid 8 size 6 nbytes 4096\n\
             \t\tblock group 0 mode 100644 links 2 uid 1000 gid 100 rdev 0\n\
             \t\tsequence 3 flags 0x100003(NODATASUM|NODATACOW|UNKNOWN: 0x100000)\n\
             \t\tatime 1700000001.10 (2023-11-14 22:13:21)\n\
             \t\tctime 1700000002.20 (2023-11-14 22:13:22)\n\
             \t\tmtime 1700000003.30 (2023-11-14 22:13:23)\n\
             \t\totime 1700000004.40 (2023-11-14 22:13:24)\n"
        );
    }

    #[test]
    fn refs_and_dir_items() {
        let r = B::default()
            .u64(2)
            .u16(5)
            .bytes(b"a b\tc")
            .u64(3)
            .u16(1)
            .bytes(&[0xe9]);
        assert_eq!(
            item(Key::new(257, INODE_REF_KEY, 256), &r.0),
            "\t\tindex 2 namelen 5 name: a\\ b\\tc\n\t\tindex 3 namelen 1 name: \\351\n"
        );
        let x = B::default().u64(256).u64(9).u16(3).bytes(b"abc");
        assert_eq!(
            item(Key::new(257, INODE_EXTREF_KEY, 1234), &x.0),
            "\t\tindex 9 parent 256 namelen 3 name: abc\n"
        );
        let long = vec![b'v'; 300];
        let d = B::default()
            .key(Key::new(0, 0, 0))
            .u64(9)
            .u16(300)
            .u16(8)
            .u8(FT_XATTR)
            .bytes(b"user.foo")
            .bytes(&long);
        let want = format!(
            "\t\tlocation key (0 UNKNOWN.0 0) type XATTR\n\
             \t\ttransid 9 data_len 300 name_len 8\n\
             \t\tname: user.foo\n\t\tdata {}\n",
            "v".repeat(255)
        );
        assert_eq!(item(Key::new(257, XATTR_ITEM_KEY, 1), &d.0), want);
        let ctx = PrintCtx {
            hide_names: true,
            ..Default::default()
        };
        assert!(print_item(&ctx, &Key::new(257, XATTR_ITEM_KEY, 1), &d.0)
            .ends_with("\t\tname: HIDDEN\n\t\tdata HIDDEN\n"));
        let e = B::default()
            .key(Key::new(258, INODE_ITEM_KEY, 0))
            .u64(5)
            .u16(0)
            .u16(40)
            .u8(FT_REG_FILE)
            .bytes(b"ab");
        assert_eq!(
            item(Key::new(256, DIR_INDEX_KEY, 2), &e.0),
            "\t\tlocation key (258 INODE_ITEM 0) type FILE\n\
             ERROR: invalid length, cur=0 name_len=40 data_len=0 size=32\n"
        );
    }

    #[test]
    fn file_extents() {
        let inline = B::default()
            .u64(6)
            .u64(5)
            .u8(3)
            .u8(0)
            .u16(0)
            .u8(FILE_EXTENT_INLINE)
            .bytes(b"hell");
        assert_eq!(
            item(Key::new(257, EXTENT_DATA_KEY, 0), &inline.0),
            "\t\tgeneration 6 type 0 (inline)\n\
             \t\tinline extent data size 4 ram_bytes 5 compression 3 (zstd)\n"
        );
        let reg = |ty: u8, comp: u8| {
            B::default()
                .u64(11)
                .u64(131072)
                .u8(comp)
                .u8(0)
                .u16(0)
                .u8(ty)
                .u64(13631488)
                .u64(4096)
                .u64(0)
                .u64(131072)
                .0
        };
        assert_eq!(
            item(Key::new(257, EXTENT_DATA_KEY, 0), &reg(FILE_EXTENT_REG, 1)),
            "\t\tgeneration 11 type 1 (regular)\n\
             \t\textent data disk byte 13631488 nr 4096\n\
             \t\textent data offset 0 nr 131072 ram 131072\n\
             \t\textent compression 1 (zlib)\n"
        );
        assert_eq!(
            item(
                Key::new(257, EXTENT_DATA_KEY, 0),
                &reg(FILE_EXTENT_PREALLOC, 0)
            ),
            "\t\tgeneration 11 type 2 (prealloc)\n\
             \t\tprealloc data disk byte 13631488 nr 4096\n\
             \t\tprealloc data offset 0 nr 131072\n"
        );
        assert!(item(Key::new(257, EXTENT_DATA_KEY, 0), &reg(9, 7))
            .contains("type 9 (unknown)\n\t\textent data disk byte"));
        assert!(item(Key::new(257, EXTENT_DATA_KEY, 0), &reg(1, 7)).ends_with("7 (UNKNOWN.7)\n"));
    }

    #[test]
    fn extent_items() {
        let d = B::default()
            .u64(3)
            .u64(11)
            .u64(EXTENT_FLAG_DATA)
            .u8(EXTENT_DATA_REF_KEY)
            .u64(5)
            .u64(265)
            .u64(0)
            .u32(1)
            .u8(SHARED_DATA_REF_KEY)
            .u64(30408704)
            .u32(1)
            .u8(EXTENT_OWNER_REF_KEY)
            .u64(5)
            .u8(99)
            .u64(1);
        assert_eq!(
            item(Key::new(13631488, EXTENT_ITEM_KEY, 1048576), &d.0),
            "\t\trefs 3 gen 11 flags DATA\n\
             \t\t(178 0xdfb591f21e8bacd) extent data backref root FS_TREE objectid 265 offset 0 count 1\n\
             \t\t(184 0x1d00000) shared data backref parent 30408704 count 1\n\
             \t(172 0x5) textent owner root 5\n"
        );
        let m = B::default()
            .u64(1)
            .u64(13)
            .u64(EXTENT_FLAG_TREE_BLOCK | BLOCK_FLAG_FULL_BACKREF)
            .u8(TREE_BLOCK_REF_KEY)
            .u64(DATA_RELOC_TREE_OBJECTID)
            .u8(SHARED_BLOCK_REF_KEY)
            .u64(30523392);
        assert_eq!(
            item(Key::new(30523392, METADATA_ITEM_KEY, 1), &m.0),
            "\t\trefs 1 gen 13 flags TREE_BLOCK|FULL_BACKREF\n\
             \t\ttree block skinny level 1\n\
             \t\t(176 0xfffffffffffffff7) tree block backref root DATA_RELOC_TREE\n\
             \t\t(182 0x1d1c000) shared block backref parent 30523392\n"
        );
        let t = B::default()
            .u64(1)
            .u64(13)
            .u64(EXTENT_FLAG_TREE_BLOCK)
            .key(Key::new(256, DIR_INDEX_KEY, 2))
            .u8(0)
            .u8(TREE_BLOCK_REF_KEY)
            .u64(257);
        assert_eq!(
            item(Key::new(30523392, EXTENT_ITEM_KEY, 4096), &t.0),
            "\t\trefs 1 gen 13 flags TREE_BLOCK\n\
             \t\ttree block key (256 DIR_INDEX 2) level 0\n\
             \t\t(176 0x101) tree block backref root 257\n"
        );
        assert_eq!(item(Key::new(1, EXTENT_ITEM_KEY, 1), &[0; 10]), "");
        assert_eq!(
            item(
                Key::new(1, EXTENT_DATA_REF_KEY, 7),
                &B::default().u64(256).u64(257).u64(4096).u32(2).0
            ),
            "\t\textent data backref root 256 objectid 257 offset 4096 count 2\n"
        );
        assert_eq!(
            item(Key::new(1, SHARED_DATA_REF_KEY, 7), &2u32.to_le_bytes()),
            "\t\tshared data backref count 2\n"
        );
        assert_eq!(
            item(Key::new(1, TREE_BLOCK_REF_KEY, 7), &[]),
            "\t\ttree block backref\n"
        );
    }

    #[test]
    fn flag_strings() {
        assert_eq!(bg_flags_str(BLOCK_GROUP_DATA), "DATA|single");
        assert_eq!(
            bg_flags_str(BLOCK_GROUP_METADATA | BLOCK_GROUP_DUP),
            "METADATA|DUP"
        );
        assert_eq!(
            bg_flags_str(BLOCK_GROUP_DATA | BLOCK_GROUP_METADATA | BLOCK_GROUP_RAID1),
            "DATA|METADATA|RAID1"
        );
        assert_eq!(
            bg_flags_str(BLOCK_GROUP_SYSTEM | BLOCK_GROUP_RAID1C3),
            "SYSTEM|RAID1C3"
        );
        assert_eq!(
            bg_flags_str(BLOCK_GROUP_METADATA | BLOCK_GROUP_SYSTEM),
            "METADATASYSTEM|single"
        );
        assert_eq!(
            qgroup_status_flags_str(0x25),
            "ON|INCONSISTENT|UNKNOWN(0x20)"
        );
        assert_eq!(qgroup_status_flags_str(0xa), "OFF|SIMPLE_MODE|SCANNING");
        assert_eq!(inode_flags_str(0), "none");
        assert_eq!(extent_flags_str(BLOCK_FLAG_FULL_BACKREF), "|FULL_BACKREF");
    }

    #[test]
    fn misc_items() {
        assert_eq!(
            item(Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, 258), &[]),
            "\t\torphan item\n"
        );
        assert_eq!(
            item(Key::new(257, DIR_LOG_INDEX_KEY, 4), &22u64.to_le_bytes()),
            "\t\tdir log end 22\n"
        );
        let rr = B::default().u64(256).u64(3).u16(4).bytes(b"sub1");
        assert_eq!(
            item(Key::new(5, ROOT_REF_KEY, 256), &rr.0),
            "\t\troot ref key dirid 256 sequence 3 name sub1\n"
        );
        assert_eq!(
            item(Key::new(256, ROOT_BACKREF_KEY, 5), &rr.0),
            "\t\troot backref key dirid 256 sequence 3 name sub1\n"
        );
        assert_eq!(
            item(
                Key::new(1, UUID_KEY_SUBVOL, 2),
                &B::default().u64(5).u64(256).0
            ),
            "\t\tsubvol_id 5\n\t\tsubvol_id 256\n"
        );
        assert_eq!(
            item(Key::new(1, UUID_KEY_RECEIVED_SUBVOL, 2), &[0; 9]),
            "btrfs: uuid item with illegal size 9!\n"
        );
        let stats = B::default().u64(1).u64(2).u64(3).u64(4).u64(5);
        assert_eq!(
            item(Key::new(0, PERSISTENT_ITEM_KEY, 1), &stats.0),
            "\t\tpersistent item objectid DEV_STATS offset 1\n\t\tdevice stats\n\
             \t\twrite_errs 1 read_errs 2 flush_errs 3 corruption_errs 4 generation 5\n"
        );
        let rep = B::default()
            .u64(u64::MAX)
            .u64(10)
            .u64(20)
            .u64(1)
            .u64(2)
            .u64(1795311348)
            .u64(1795311349)
            .u64(0)
            .u64(0);
        assert_eq!(
            item(Key::new(0, DEV_REPLACE_KEY, 0), &rep.0),
            "\t\tsrc devid -1 cursor left 10 cursor right 20 mode AVOID\n\
             \t\tstate FINISHED write errors 0 uncorrectable read errors 0\n\
             \t\tstart time 1795311348 (2026-11-22 01:35:48)\n\
             \t\tstop time 1795311348 (2026-11-22 01:35:48)\n"
        );
        let bal = item(
            Key::new(BALANCE_OBJECTID, TEMPORARY_ITEM_KEY, 0),
            &[7, 0, 0, 0, 0, 0, 0, 0],
        );
        assert!(bal.starts_with(
            "\t\ttemporary item objectid BALANCE offset 0\n\t\tbalance status flags 7\n\t\tDATA\n\
             \t\tprofiles 0 devid 0 target 0 flags 0\n"
        ));
        assert!(bal.ends_with("\t\tSYSTEM\n\t\tprofiles 0 devid 0 target 0 flags 0\n\t\tusage_min 0 usage_max 0 pstart 0 pend 0\n\t\tvstart 0 vend 0 limit_min 0 limit_max 0\n\t\tstripes_min 0 stripes_max 0\n"));
        assert_eq!(
            item(Key::new(CSUM_CHANGE_OBJECTID, TEMPORARY_ITEM_KEY, 2), &[]),
            "\t\ttemporary item objectid CSUM_CHANGE offset 2\n\t\ttarget csum type sha256 (2)\n"
        );
        let lim = B::default()
            .u64(1)
            .u64(104857600)
            .u64(u64::MAX)
            .u64(0)
            .u64(0);
        assert_eq!(
            item(Key::new(0, QGROUP_LIMIT_KEY, 256), &lim.0),
            "\t\tflags 1\n\t\tmax_referenced 104857600 max_exclusive -1\n\
             \t\trsv_referenced 0 rsv_exclusive 0\n"
        );
        let st = B::default().u64(1).u64(13).u64(9).u64(u64::MAX).u64(12);
        assert_eq!(
            item(Key::new(0, QGROUP_STATUS_KEY, 0), &st.0),
            "\t\tversion 1 generation 13 flags ON|SIMPLE_MODE scan 18446744073709551615\n"
        );
        let sq = PrintCtx {
            incompat_flags: FEATURE_INCOMPAT_SIMPLE_QUOTA,
            ..Default::default()
        };
        assert!(print_item(&sq, &Key::new(0, QGROUP_STATUS_KEY, 0), &st.0)
            .ends_with("scan 18446744073709551615 enable_gen 12\n"));
        assert_eq!(item(Key::new(0, QGROUP_RELATION_KEY, 5), &[]), "");
        assert_eq!(
            item(
                Key::new(1, RAID_STRIPE_KEY, 65536),
                &B::default().u64(1).u64(4096).0
            ),
            "\t\t\tstripe 0 devid 1 physical 4096\n"
        );
        assert_eq!(
            item(Key::new(1, STRING_ITEM_KEY, 0), b"hi\0x"),
            "\t\titem data hi\n"
        );
        let fsh = B::default().key(Key::new(256, 0, 0)).u64(7).u64(3).u64(1);
        assert_eq!(
            item(Key::new(FREE_SPACE_OBJECTID, 0, 30408704), &fsh.0),
            "\t\tlocation key (256 UNKNOWN.0 0)\n\t\tcache generation 7 entries 3 bitmaps 1\n"
        );
    }

    #[test]
    fn csum_items() {
        let d: Vec<u8> = (0u8..20).collect();
        let key = Key::new(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 4096);
        assert_eq!(
            item(key, &d),
            "\t\trange start 4096 end 24576 length 20480\n"
        );
        let ctx = PrintCtx {
            csum_items: true,
            ..Default::default()
        };
        assert_eq!(
            print_item(&ctx, &key, &d),
            "\t\trange start 4096 end 24576 length 20480\n\
             \t\t[4096] 0x00010203 [8192] 0x04050607 [12288] 0x08090a0b [16384] 0x0c0d0e0f\n\
             \t\t[20480] 0x10111213\n"
        );
        let x = PrintCtx {
            csum_items: true,
            csum_type: CsumType::Sha256,
            ..Default::default()
        };
        let d = [0xabu8; 64];
        let s = print_item(&x, &key, &d);
        assert_eq!(s.lines().count(), 3, "{s}");
    }

    #[test]
    fn chunk_and_dev_items() {
        let uuid = [0x11u8; 16];
        let c = B::default()
            .u64(8388608)
            .u64(2)
            .u64(65536)
            .u64(BLOCK_GROUP_SYSTEM | BLOCK_GROUP_DUP)
            .u32(65536)
            .u32(65536)
            .u32(4096)
            .u16(2)
            .u16(1)
            .u64(1)
            .u64(22020096)
            .bytes(&uuid)
            .u64(1)
            .u64(30408704)
            .bytes(&uuid);
        assert_eq!(
            item(Key::new(256, CHUNK_ITEM_KEY, 22020096), &c.0),
            "\t\tlength 8388608 owner 2 stripe_len 65536 type SYSTEM|DUP\n\
             \t\tio_align 65536 io_width 65536 sector_size 4096\n\
             \t\tnum_stripes 2 sub_stripes 1\n\
             \t\t\tstripe 0 devid 1 offset 22020096\n\
             \t\t\tdev_uuid 11111111-1111-1111-1111-111111111111\n\
             \t\t\tstripe 1 devid 1 offset 30408704\n\
             \t\t\tdev_uuid 11111111-1111-1111-1111-111111111111\n"
        );
        assert_eq!(
            item(Key::new(256, CHUNK_ITEM_KEY, 0), &c.0[..60]),
            "\t\tchunk item invalid\n"
        );
        let de = B::default()
            .u64(3)
            .u64(256)
            .u64(22020096)
            .u64(8388608)
            .bytes(&uuid);
        assert_eq!(
            item(Key::new(1, DEV_EXTENT_KEY, 22020096), &de.0),
            "\t\tdev extent chunk_tree 3\n\
             \t\tchunk_objectid 256 chunk_offset 22020096 length 8388608\n\
             \t\tchunk_tree_uuid 11111111-1111-1111-1111-111111111111\n"
        );
        let bg = B::default().u64(16384).u64(256).u64(BLOCK_GROUP_DATA);
        assert_eq!(
            item(Key::new(1, BLOCK_GROUP_ITEM_KEY, 2), &bg.0),
            "\t\tblock group used 16384 chunk_objectid 256 flags DATA|single\n"
        );
    }

    /// A leaf with two items, laid out the way the kernel packs them.
    fn leaf(nodesize: usize, items: &[(Key, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![0u8; nodesize];
        b[0x20..0x30].copy_from_slice(&[0x22; 16]);
        b[0x30..0x38].copy_from_slice(&30408704u64.to_le_bytes());
        let flags = HEADER_FLAG_WRITTEN | (MIXED_BACKREF_REV << BACKREF_REV_SHIFT);
        b[0x38..0x40].copy_from_slice(&flags.to_le_bytes());
        b[0x40..0x50].copy_from_slice(&[0x33; 16]);
        b[0x50..0x58].copy_from_slice(&9u64.to_le_bytes());
        b[0x58..0x60].copy_from_slice(&5u64.to_le_bytes());
        b[0x60..0x64].copy_from_slice(&(items.len() as u32).to_le_bytes());
        let mut end = nodesize - HEADER_SIZE;
        for (i, (k, d)) in items.iter().enumerate() {
            end -= d.len();
            let h = HEADER_SIZE + i * ITEM_SIZE;
            let mut kb = [0u8; 17];
            k.write(&mut kb);
            b[h..h + 17].copy_from_slice(&kb);
            b[h + 17..h + 21].copy_from_slice(&(end as u32).to_le_bytes());
            b[h + 21..h + 25].copy_from_slice(&(d.len() as u32).to_le_bytes());
            b[HEADER_SIZE + end..HEADER_SIZE + end + d.len()].copy_from_slice(d);
        }
        b
    }

    #[test]
    fn leaf_block() {
        let b = leaf(
            4096,
            &[
                (Key::new(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, 300), vec![]),
                (
                    Key::new(700, DIR_LOG_ITEM_KEY, 1),
                    5u64.to_le_bytes().to_vec(),
                ),
            ],
        );
        let ctx = PrintCtx {
            nodesize: 4096,
            ..Default::default()
        };
        assert_eq!(
            print_block(&ctx, 30408704, &b),
            "leaf 30408704 items 2 free space 3937 generation 9 owner FS_TREE\n\
             leaf 30408704 flags 0x1(WRITTEN) backref revision 1\n\
             fs uuid 22222222-2222-2222-2222-222222222222\n\
             chunk uuid 33333333-3333-3333-3333-333333333333\n\
             \titem 0 key (ORPHAN ORPHAN_ITEM 300) itemoff 3995 itemsize 0\n\
             \t\torphan item\n\
             \titem 1 key (700 DIR_LOG_ITEM 1) itemoff 3987 itemsize 8\n\
             \t\tdir log end 5\n"
        );
        let ctx = PrintCtx {
            nodesize: 4096,
            csum_headers: true,
            ..Default::default()
        };
        assert!(print_block(&ctx, 30408704, &b).contains("backref revision 1 csum 0x00000000\n"));
        // An item pointing outside the leaf stops the listing.
        let mut bad = b.clone();
        let h = HEADER_SIZE + ITEM_SIZE;
        bad[h + 17..h + 21].copy_from_slice(&5000u32.to_le_bytes());
        let s = print_block(
            &PrintCtx {
                nodesize: 4096,
                ..Default::default()
            },
            30408704,
            &bad,
        );
        assert!(s.ends_with(
            "ERROR: leaf 30408704 slot 1 pointer invalid, offset 5000 size 8 leaf data limit 3995\n\
             ERROR: skip remaining slots\n"
        ), "{s}");
    }

    #[test]
    fn node_block() {
        let mut b = leaf(4096, &[]);
        b[0x64] = 1;
        b[0x60..0x64].copy_from_slice(&2u32.to_le_bytes());
        for (i, (k, p)) in [
            (Key::new(256, 1, 0), 8192u64),
            (Key::new(300, 96, 7), 12288),
        ]
        .iter()
        .enumerate()
        {
            let o = HEADER_SIZE + i * KEY_PTR_SIZE;
            let mut kb = [0u8; 17];
            k.write(&mut kb);
            b[o..o + 17].copy_from_slice(&kb);
            b[o + 17..o + 25].copy_from_slice(&p.to_le_bytes());
            b[o + 25..o + 33].copy_from_slice(&8u64.to_le_bytes());
        }
        let ctx = PrintCtx {
            nodesize: 4096,
            ..Default::default()
        };
        assert_eq!(
            print_block(&ctx, 30408704, &b),
            "node 30408704 level 1 items 2 free space 119 generation 9 owner FS_TREE\n\
             node 30408704 flags 0x1(WRITTEN) backref revision 1\n\
             fs uuid 22222222-2222-2222-2222-222222222222\n\
             chunk uuid 33333333-3333-3333-3333-333333333333\n\
             \tkey (256 INODE_ITEM 0) block 8192 gen 8\n\
             \tkey (300 DIR_INDEX 7) block 12288 gen 8\n"
        );
    }

    #[test]
    fn tree_names() {
        for (s, id) in [
            ("5", Some(5)),
            ("256", Some(256)),
            ("0", None),
            ("root", Some(1)),
            ("EXTENT", Some(2)),
            ("chunk_tree", Some(3)),
            ("dev", Some(4)),
            ("device", Some(4)),
            ("fs", Some(5)),
            ("BTRFS_FS_TREE_OBJECTID", Some(5)),
            ("csum", Some(7)),
            ("checksum", Some(7)),
            ("quota", Some(8)),
            ("uuid", Some(9)),
            ("free-space", Some(10)),
            ("free_space_tree", Some(10)),
            ("block-group", Some(11)),
            ("raid-stripe", Some(12)),
            ("data-reloc", Some(DATA_RELOC_TREE_OBJECTID)),
            ("tree-log", Some(TREE_LOG_OBJECTID)),
            ("tree_log_fixup", Some(TREE_LOG_FIXUP_OBJECTID)),
            ("tree-reloc", Some(TREE_RELOC_OBJECTID)),
            ("fsx", None),
            ("fs-tree", None),
            ("", None),
            ("-5", None),
        ] {
            assert_eq!(parse_tree_name(s), id, "{s}");
        }
    }

    #[test]
    fn escapes() {
        assert_eq!(
            escape_name(b"a b\\c\n\x01\x7f\xff\x1b"),
            "a\\ b\\\\c\\n\\001\\177\\377\\e"
        );
    }

    /// A superblock built from scratch: fields at their offsets, valid checksum.
    fn superblock() -> Vec<u8> {
        let mut b = vec![0u8; SUPER_INFO_SIZE];
        let put = |b: &mut Vec<u8>, off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
        put(&mut b, 0x20, &[0x44; 16]);
        put(&mut b, 0x30, &SUPER_INFO_OFFSET.to_le_bytes());
        put(
            &mut b,
            0x38,
            &(HEADER_FLAG_WRITTEN | SUPER_FLAG_SEEDING | (1 << 50)).to_le_bytes(),
        );
        put(&mut b, 0x40, &BTRFS_MAGIC.to_le_bytes());
        put(&mut b, 0x48, &7u64.to_le_bytes());
        put(&mut b, 0x90, &4096u32.to_le_bytes());
        put(&mut b, 0x94, &16384u32.to_le_bytes());
        put(
            &mut b,
            0xb4,
            &(FEATURE_COMPAT_RO_FREE_SPACE_TREE | FEATURE_COMPAT_RO_VERITY).to_le_bytes(),
        );
        put(&mut b, 0xbc, &FEATURE_INCOMPAT_NO_HOLES.to_le_bytes());
        put(&mut b, 0xc9 + 66 + 16, &[0x44; 16]); // dev_item.fsid
        put(&mut b, 0x12b, b"lab\x01el");
        // One backup root slot in use.
        put(&mut b, 0xb2b, &30408704u64.to_le_bytes());
        put(&mut b, 0xb2b + 8, &7u64.to_le_bytes());
        let c = CsumType::Crc32c.compute(&b[CSUM_SIZE_MAX..]);
        put(&mut b, 0, &c[..4]);
        b
    }

    #[test]
    fn super_text() {
        let raw = superblock();
        let sb = SuperBlock::parse(&raw).unwrap_or_else(|e| panic!("{e}"));
        let s = dump_super(&sb, 65536, "img");
        assert!(s.starts_with(
            "superblock: bytenr=65536, device=img\n\
             ---------------------------------------------------------\n\
             csum_type\t\t0 (crc32c)\ncsum_size\t\t4\ncsum\t\t\t0x"
        ));
        assert!(
            s.contains(
                " [match]\nbytenr\t\t\t65536\nflags\t\t\t0x4000100000001\n\
             \t\t\t( WRITTEN |\n\t\t\t  SEEDING |\n\t\t\t  unknown flag: 0x4000000000000 )\n\
             magic\t\t\t_BHRfS_M [match]\n"
            ),
            "{s}"
        );
        assert!(s.contains("label\t\t\tlab.el\n"));
        assert!(s.contains(
            "compat_ro_flags\t\t0x5\n\t\t\t( FREE_SPACE_TREE |\n\t\t\t  unknown flag: 0x4 )\n"
        ));
        assert!(s.contains("incompat_flags\t\t0x200\n\t\t\t( NO_HOLES )\ncache_generation"));
        assert!(s.contains("compat_flags\t\t0x0\ncompat_ro"));
        assert!(s.contains("dev_item.fsid\t\t44444444-4444-4444-4444-444444444444 [match]\n"));
        assert!(s.ends_with("dev_item.generation\t0\n\n"));
        let f = dump_super_with(&sb, 65536, "img", true);
        assert!(f.ends_with(
            "dev_item.generation\t0\nsys_chunk_array[2048]:\nbackup_roots[4]:\n\tbackup 0:\n\
             \t\tbackup_tree_root:\t30408704\tgen: 7\tlevel: 0\n\
             \t\tbackup_chunk_root:\t0\tgen: 0\tlevel: 0\n\
             \t\tbackup_extent_root:\t0\tgen: 0\tlevel: 0\n\
             \t\tbackup_fs_root:\t\t0\tgen: 0\tlevel: 0\n\
             \t\tbackup_dev_root:\t0\tgen: 0\tlevel: 0\n\
             \t\tcsum_root:\t0\tgen: 0\tlevel: 0\n\
             \t\tbackup_total_bytes:\t0\n\t\tbackup_bytes_used:\t0\n\t\tbackup_num_devices:\t0\n\n\n"
        ), "{f}");
        // A flipped byte breaks the checksum; a wrong magic is flagged.
        let mut bad = raw.clone();
        bad[0x40] = b'X';
        let sb = SuperBlock::parse(&bad).unwrap_or_else(|e| panic!("{e}"));
        let s = dump_super(&sb, 65536, "img");
        assert!(s.contains(" [DON'T MATCH]\nbytenr"));
        assert!(s.contains("magic\t\t\tXBHRfS_M [DON'T MATCH]\n"));
        let mut bad = raw;
        bad[0xc4] = 9;
        let sb = SuperBlock::parse(&bad).unwrap_or_else(|e| panic!("{e}"));
        let s = dump_super(&sb, 65536, "img");
        assert!(s.contains("csum_type\t\t9 (INVALID)\ncsum_size\t\t32\n"));
        assert!(s.contains(" [UNKNOWN CSUM TYPE OR SIZE]\n"));
    }

    /// Garbage blocks and items print without panicking.
    #[test]
    fn garbage_does_not_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let ctx = PrintCtx {
            nodesize: 4096,
            csum_items: true,
            ..Default::default()
        };
        for round in 0..300 {
            let mut b: Vec<u8> = (0..4096).map(|_| next() as u8).collect();
            // Keep item counts small enough to reach the item printers often.
            b[0x60..0x64].copy_from_slice(&((next() % 40) as u32).to_le_bytes());
            b[0x64] = if round % 3 == 0 { 1 } else { 0 };
            let _ = print_block(&ctx, 4096, &b);
            let len = (next() % 600) as usize;
            for ty in 0..=255u8 {
                let key = Key::new(next(), ty, next());
                let _ = print_item(&ctx, &key, &b[..len]);
            }
        }
        let _ = print_block(&ctx, 0, &[]);
        let _ = print_block(&PrintCtx { nodesize: 0, ..ctx }, 0, &[1; 200]);
    }
}
