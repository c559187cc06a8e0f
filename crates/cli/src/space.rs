//! `filesystem df` and `filesystem usage`: the kernel's space answers for a fresh
//! mount (core tools/space_info.rs, statfs.rs, usage.rs) in btrfs-progs' words.

use crate::{fmt, json, Format};
use anyhow::Result;
use std::io::Write;
use ubtrfs_core::Filesystem;

/// `btrfs filesystem df` of the filesystem as the kernel would answer it mounted.
pub fn cmd_fs_df(fs: &Filesystem, raw: bool, format: Format, out: &mut dyn Write) -> Result<()> {
    use ubtrfs_core::tools::space_info::{names, space_infos};
    let spaces = space_infos(fs)?;
    let several = ubtrfs_core::tools::usage::multiple_profiles(&spaces);
    if !several.is_empty() {
        // After the table, as btrfs-progs warns (on stderr, which is not buffered).
        let mut text =
            "WARNING: Multiple block group profiles detected, see 'man btrfs(5)'\n".to_string();
        for (ty, profiles) in &several {
            let (name, _) = names(*ty, 0);
            text.push_str(&format!("WARNING:    {name}: {profiles}\n"));
        }
        let r = cmd_fs_df_rows(fs, &spaces, raw, format, out);
        out.flush()?;
        eprint!("{text}");
        return r;
    }
    cmd_fs_df_rows(fs, &spaces, raw, format, out)
}

fn cmd_fs_df_rows(
    fs: &Filesystem,
    spaces: &[ubtrfs_core::tools::space_info::SpaceInfo],
    raw: bool,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    use ubtrfs_core::tools::space_info::{global_reserve, names};
    let mut rows: Vec<(&str, &str, u64, u64)> = spaces
        .iter()
        .map(|s| {
            let (t, p) = names(s.ty, s.profile);
            (t, p, s.total_bytes, s.used_bytes)
        })
        .collect();
    let g = global_reserve(fs)?;
    rows.push(("GlobalReserve", "single", g.total_bytes, g.used_bytes));
    if format == Format::Json {
        return json::write(out, &json::filesystem_df(&rows));
    }
    for (t, p, total, used) in rows {
        let size = |b: u64| fmt::progs_size(b, raw);
        writeln!(out, "{t}, {p}: total={}, used={}", size(total), size(used))?;
    }
    Ok(())
}

/// `btrfs filesystem usage` of the filesystem as a fresh read-write mount of it would
/// print it (cmds/filesystem-usage.c's linear layout).
pub fn cmd_fs_usage(
    fs: &Filesystem,
    raw: bool,
    format: Format,
    tabular: bool,
    out: &mut dyn Write,
) -> Result<()> {
    use ubtrfs_core::tools::space_info::names;
    use ubtrfs_core::tools::usage::{usage, used_percent};
    let u = usage(fs)?;
    let path = |p: &Option<String>| match p {
        Some(name) => std::fs::canonicalize(name)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| name.clone()),
        None => "missing".to_string(),
    };
    let paths: Vec<String> = u.devices.iter().map(|d| path(&d.path)).collect();
    if format == Format::Json {
        return json::write(out, &json::filesystem_usage(&u, &paths));
    }
    let size = |b: u64| fmt::progs_size(b, raw);
    let signed = |b: i64| fmt::progs_size_signed(b, raw);
    let w = if raw { 18 } else { 10 };
    writeln!(out, "Overall:")?;
    writeln!(out, "    Device size:\t\t{:>w$}", size(u.device_size_bytes))?;
    writeln!(
        out,
        "    Device allocated:\t\t{:>w$}",
        size(u.device_allocated_bytes)
    )?;
    writeln!(
        out,
        "    Device unallocated:\t\t{:>w$}",
        signed(u.device_unallocated_bytes)
    )?;
    writeln!(
        out,
        "    Device missing:\t\t{:>w$}",
        size(u.device_missing_bytes)
    )?;
    writeln!(
        out,
        "    Device slack:\t\t{:>w$}",
        size(u.device_slack_bytes)
    )?;
    writeln!(out, "    Used:\t\t\t{:>w$}", size(u.used_bytes))?;
    writeln!(
        out,
        "    Free (estimated):\t\t{:>w$}\t(min: {})",
        size(u.free_estimated_bytes),
        size(u.free_min_bytes)
    )?;
    writeln!(
        out,
        "    Free (statfs, df):\t\t{:>w$}",
        size(u.free_statfs_bytes)
    )?;
    writeln!(out, "    Data ratio:\t\t\t{:>w$.2}", u.data_ratio)?;
    writeln!(out, "    Metadata ratio:\t\t{:>w$.2}", u.metadata_ratio)?;
    writeln!(
        out,
        "    Global reserve:\t\t{:>w$}\t(used: {})",
        size(u.global_reserve.total_bytes),
        size(u.global_reserve.used_bytes)
    )?;
    if u.multiple_profiles.is_empty() {
        writeln!(out, "    Multiple profiles:\t\t{:>w$}", "no")?;
    } else {
        writeln!(
            out,
            "    Multiple profiles:\t\t{:>w$}\t({})",
            "yes", u.multiple_profiles
        )?;
    }
    writeln!(out)?;
    if tabular {
        return usage_table(&u, &paths, raw, out);
    }
    for s in &u.spaces {
        let (t, p) = names(s.ty, s.profile);
        writeln!(
            out,
            "{t},{p}: Size:{}, Used:{} ({:.2}%)",
            size(s.total_bytes),
            size(s.used_bytes),
            used_percent(s) as f64
        )?;
        let kind = s.ty | s.profile;
        for (d, p) in u.devices.iter().zip(&paths) {
            for &(k, bytes) in &d.allocated {
                if k == kind && bytes > 0 {
                    writeln!(out, "   {p}\t{:>10}", size(bytes))?;
                }
            }
        }
        writeln!(out)?;
    }
    if !u.devices.is_empty() {
        writeln!(out, "Unallocated:")?;
        for (d, p) in u.devices.iter().zip(&paths) {
            writeln!(out, "   {p}\t{:>10}", signed(d.unallocated_bytes))?;
        }
    }
    Ok(())
}

/// A table as btrfs-progs' string-table.c prints it: each cell's text starts with
/// `<` (left-aligned), `>` (right-aligned) or `*` (the next character repeated
/// across the column); columns are as wide as their widest text (rules excluded),
/// one space apart; empty cells are spaces.
struct Table {
    cols: usize,
    cells: Vec<Option<String>>,
}

impl Table {
    fn new(cols: usize, rows: usize) -> Table {
        Table {
            cols,
            cells: vec![None; cols * rows],
        }
    }

    /// Sets a cell; btrfs-progs keeps at most 98 bytes of it.
    fn set(&mut self, col: usize, row: usize, text: String) {
        let mut end = text.len().min(98);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if let Some(c) = self.cells.get_mut(row * self.cols + col) {
            *c = Some(text[..end].to_string());
        }
    }

    fn write(&self, out: &mut dyn Write) -> Result<()> {
        let rows = self.cells.len() / self.cols;
        let mut widths = vec![0usize; self.cols];
        for (i, c) in self.cells.iter().enumerate() {
            if let Some(t) = c {
                if t.len() > 1 && !t.starts_with('*') {
                    widths[i % self.cols] = widths[i % self.cols].max(t.len() - 1);
                }
            }
        }
        for r in 0..rows {
            let mut line = String::new();
            for (col, w) in widths.iter().enumerate() {
                let w = *w;
                match self.cells[r * self.cols + col].as_deref() {
                    None | Some("") => line.push_str(&" ".repeat(w)),
                    Some(t) if t.starts_with('*') && t.len() > 1 => {
                        line.push_str(&t[1..2].repeat(w));
                    }
                    Some(t) if t.starts_with('<') => line.push_str(&format!("{:<w$}", &t[1..])),
                    Some(t) => line.push_str(&format!("{:>w$}", &t[1..])),
                }
                if col + 1 != self.cols {
                    line.push(' ');
                }
            }
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

/// `btrfs filesystem usage -T`'s table: a column per space (type over profile),
/// then unallocated, total and slack; a row per device, then the totals per space
/// (logical bytes) and their use.
fn usage_table(
    u: &ubtrfs_core::tools::usage::Usage,
    paths: &[String],
    raw: bool,
    out: &mut dyn Write,
) -> Result<()> {
    use ubtrfs_core::tools::space_info::names;
    let size = |b: u64| fmt::progs_size(b, raw);
    let signed = |b: i64| fmt::progs_size_signed(b, raw);
    const HEAD_ROWS: usize = 3;
    let first = 2;
    let unalloc_col = first + u.spaces.len();
    let (total_col, slack_col) = (unalloc_col + 1, unalloc_col + 2);
    let ndev = u.devices.len();
    let mut t = Table::new(unalloc_col + 3, HEAD_ROWS + ndev + 3);
    for (i, s) in u.spaces.iter().enumerate() {
        let (ty, profile) = names(s.ty, s.profile);
        t.set(first + i, 0, format!("<{ty}"));
        t.set(first + i, 1, format!("<{profile}"));
    }
    t.set(0, 1, "<Id".into());
    t.set(1, 1, "<Path".into());
    t.set(unalloc_col, 1, "<Unallocated".into());
    t.set(total_col, 1, "<Total".into());
    t.set(slack_col, 1, "<Slack".into());
    let (mut total_unused, mut total_size, mut total_slack) = (0i64, 0i64, 0i64);
    for (r, (d, path)) in u.devices.iter().zip(paths).enumerate() {
        let row = HEAD_ROWS + r;
        t.set(0, row, format!(">{}", d.devid));
        t.set(1, row, format!("<{path}"));
        for (i, s) in u.spaces.iter().enumerate() {
            let kind = s.ty | s.profile;
            let bytes: u64 = d
                .allocated
                .iter()
                .filter(|&&(k, _)| k == kind)
                .map(|&(_, b)| b)
                .sum();
            let text = if bytes > 0 { size(bytes) } else { "-".into() };
            t.set(first + i, row, format!(">{text}"));
        }
        let slack = d.device_size_bytes.saturating_sub(d.size_bytes);
        t.set(
            unalloc_col,
            row,
            format!(">{}", signed(d.unallocated_bytes)),
        );
        t.set(total_col, row, format!(">{}", signed(d.size_bytes as i64)));
        let slack_text = if slack > 0 {
            signed(slack as i64)
        } else {
            "-".into()
        };
        t.set(slack_col, row, format!(">{slack_text}"));
        total_unused = total_unused.wrapping_add(d.unallocated_bytes);
        total_size = total_size.wrapping_add(d.size_bytes as i64);
        total_slack = total_slack.wrapping_add(slack as i64);
    }
    for col in 0..unalloc_col + 3 {
        t.set(col, HEAD_ROWS - 1, "*-".into());
        t.set(col, HEAD_ROWS + ndev, "*-".into());
    }
    let (total_row, used_row) = (HEAD_ROWS + ndev + 1, HEAD_ROWS + ndev + 2);
    t.set(1, total_row, "<Total".into());
    t.set(1, used_row, "<Used".into());
    for (i, s) in u.spaces.iter().enumerate() {
        t.set(first + i, total_row, format!(">{}", size(s.total_bytes)));
        t.set(first + i, used_row, format!(">{}", size(s.used_bytes)));
    }
    t.set(unalloc_col, total_row, format!(">{}", signed(total_unused)));
    t.set(total_col, total_row, format!(">{}", signed(total_size)));
    t.set(slack_col, total_row, format!(">{}", signed(total_slack)));
    t.write(out)
}
