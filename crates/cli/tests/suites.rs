//! Third-party suites on the read-write mount, against the kernel in the same run.
//! The tests install what they run (`cargo install pjdfstest fsx` from crates.io)
//! when it is not on PATH or in ~/.cargo/bin.
//!
//! - pjdfstest (the POSIX suite's Rust rewrite) runs on a kernel btrfs loop mount and
//!   on a ubtrfs mount of images made the same way: every test that passes on the
//!   kernel must pass on ubtrfs (`-o allow_other`, as the suite switches users; a
//!   kernel mount needs no such option).
//! - fsx (the File System eXerciser, Rust port) runs `UBTRFS_FSX_OPS` operations
//!   (default 25,000) per seed on four seeds, two on plain and two on zstd-compressed
//!   files, with reads, writes, mmap reads and writes, truncate, fallocate, punch
//!   hole, copy_file_range, sendfile, fsync and close/reopen; every image checks clean
//!   afterwards.
//!
//! Needs root (/dev/fuse, loop devices, other users); skipped with a line outside CI.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use ubtrfs_sim::host::{btrfs_check, env_u64, output_text, require_fuse, serial, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// The path of a crates.io tool, installed with `cargo install --locked` if needed.
fn tool(name: &str) -> PathBuf {
    if let Ok(o) = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
    {
        let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if o.status.success() && !p.is_empty() {
            return PathBuf::from(p);
        }
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let bin = home.join("bin").join(name);
    if !bin.exists() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        eprintln!("installing {name} from crates.io (cargo install --locked {name})");
        let o = Command::new(cargo)
            .args(["install", "--locked", name])
            .output()
            .expect("cargo install");
        assert!(
            o.status.success(),
            "cargo install {name}: {}",
            output_text(&o)
        );
    }
    bin
}

fn fresh_image(dir: &Path, name: &str) -> PathBuf {
    let img = dir.join(name);
    mkfs_btrfs(&img, 2 << 30, &[]);
    img
}

/// `name ... ok|FAILED` lines of a pjdfstest run.
fn pjdfstest_results(out: &str) -> BTreeMap<String, bool> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, res) = (w.next()?, w.next()?);
            (name.contains("::") && w.next().is_none() && (res == "ok" || res == "FAILED"))
                .then(|| (name.to_string(), res == "ok"))
        })
        .collect()
}

const PJDFSTEST_CONFIG: &str = r#"
[features]
posix_fallocate = {}
[settings]
naptime = 0.001
allow_remount = false
[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
"#;

fn run_pjdfstest(bin: &Path, config: &Path, at: &Path) -> BTreeMap<String, bool> {
    let o = Command::new(bin)
        .arg("-c")
        .arg(config)
        .arg("-p")
        .arg(at)
        .output()
        .expect("pjdfstest");
    let text = output_text(&o);
    let r = pjdfstest_results(&text);
    assert!(r.len() > 300, "pjdfstest ran {} tests: {text}", r.len());
    r
}

#[test]
fn pjdfstest_passes_what_the_kernel_passes() {
    if !require_fuse("pjdfstest_passes_what_the_kernel_passes") {
        return;
    }
    let bin = tool("pjdfstest");
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("pjdfstest.toml");
    std::fs::write(&config, PJDFSTEST_CONFIG).expect("config");

    let kimg = fresh_image(dir.path(), "kernel.img");
    let k = KernelMount::new(&kimg, "rw");
    let kernel = run_pjdfstest(&bin, &config, &k.path(""));
    k.umount();

    let img = fresh_image(dir.path(), "ubtrfs.img");
    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw,allow_other"]);
    let ours = run_pjdfstest(&bin, &config, &fm.mnt);
    let st = fm.unmount();
    assert!(st.success(), "server: {}", fm.log());
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("btrfs check after pjdfstest: {e}"));

    let lost: Vec<&String> = kernel
        .iter()
        .filter(|(t, ok)| **ok && ours.get(*t) != Some(&true))
        .map(|(t, _)| t)
        .collect();
    eprintln!(
        "pjdfstest: kernel passes {} of {}, ubtrfs {} of {}",
        kernel.values().filter(|v| **v).count(),
        kernel.len(),
        ours.values().filter(|v| **v).count(),
        ours.len()
    );
    assert!(
        lost.is_empty(),
        "pass on the kernel, fail on ubtrfs: {lost:?}\nserver log: {}",
        fm.log()
    );
}

const FSX_CONFIG: &str = r#"
flen = 1048576
[opsize]
max = 131072
[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 5
fsync = 0.2
fdatasync = 0.2
posix_fallocate = 3
punch_hole = 3
sendfile = 1
posix_fadvise = 1
copy_file_range = 3
"#;

/// The operation number when fsx stopped on its own zero-length posix_fallocate (the
/// last operation of its log dump, answered EINVAL by the VFS before any filesystem
/// sees it), else None.
fn fsx_zero_length_fallocate(text: &str) -> Option<u64> {
    if !text.contains("Test file system does not support posix_fallocate.") {
        return None;
    }
    let last = text.lines().rev().find(|l| l.starts_with("[ERROR fsx] "))?;
    let mut words = last.trim_start_matches("[ERROR fsx] ").split_whitespace();
    let at = words.next()?.parse().ok()?;
    (words.next() == Some("POSIX_FALLOCATE") && last.ends_with("(    0x0 bytes)")).then_some(at)
}

#[test]
fn fsx_zero_length_fallocate_is_recognised() {
    let dump = "Test file system does not support posix_fallocate.\n\
                [ERROR fsx] 154648 MAPWRITE  0x9c733 =>  0x9ed5c ( 0x2629 bytes)\n\
                [ERROR fsx] 154649 POSIX_FALLOCATE  0x3dbf1 =>  0x3dbf0 (    0x0 bytes)\n";
    assert_eq!(fsx_zero_length_fallocate(dump), Some(154_649));
    let real = dump.replace("(    0x0 bytes)", "( 0x6f1f bytes)");
    assert_eq!(fsx_zero_length_fallocate(&real), None);
    assert_eq!(
        fsx_zero_length_fallocate("[ERROR fsx] 12 READ bad data"),
        None
    );
}

#[test]
fn fsx_on_the_rw_mount() {
    if !require_fuse("fsx_on_the_rw_mount") {
        return;
    }
    let bin = tool("fsx");
    let ops = env_u64("UBTRFS_FSX_OPS").unwrap_or(25_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("fsx.toml");
    std::fs::write(&config, FSX_CONFIG).expect("config");
    // Seed 5: the file inherits `C` from the mount's root, so writes go in place.
    for (seed, opts, nocow) in [
        (1u64, "rw", false),
        (2, "rw", false),
        (3, "rw,compress=zstd", false),
        (4, "rw,compress=zstd", false),
        (5, "rw", true),
    ] {
        let img = fresh_image(dir.path(), &format!("fsx-{seed}.img"));
        let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &[opts]);
        if nocow {
            let o = Command::new("chattr")
                .arg("+C")
                .arg(&fm.mnt)
                .output()
                .expect("chattr");
            assert!(o.status.success(), "chattr +C: {}", output_text(&o));
        }
        let art = dir.path().join(format!("artifacts-{seed}"));
        std::fs::create_dir_all(&art).expect("artifacts dir");
        let o = Command::new(&bin)
            .arg("-f")
            .arg(&config)
            .args(["-N", &ops.to_string(), "-S", &seed.to_string(), "-q"])
            .arg("-P")
            .arg(&art)
            .arg(fm.mnt.join("fsx-file"))
            .output()
            .expect("fsx");
        let text = output_text(&o);
        if let Some(at) = fsx_zero_length_fallocate(&text) {
            // fsx 0.3.2 draws a length of 0 now and then; posix_fallocate(2) of 0
            // bytes is EINVAL from the VFS on every filesystem, and fsx stops. The
            // kernel's btrfs stops at the same operation (seed 3 at 154,649 with
            // compress=zstd, checked in session 15); what came before was verified.
            eprintln!(
                "fsx seed {seed} ({opts}): stopped by fsx at operation {at} (a zero-length \
                 posix_fallocate, EINVAL on every filesystem); the {} operations before it passed",
                at - 1
            );
        } else {
            assert!(
                o.status.success(),
                "fsx seed {seed} ({opts}), {ops} ops: {text}\nserver: {}",
                fm.log()
            );
        }
        if nocow {
            let o = Command::new("lsattr")
                .arg(fm.mnt.join("fsx-file"))
                .output()
                .expect("lsattr");
            let flags = output_text(&o);
            assert!(flags.contains('C'), "fsx-file is not nocow: {flags}");
        }
        let st = fm.unmount();
        assert!(st.success(), "server: {}", fm.log());
        btrfs_check(&img, None)
            .unwrap_or_else(|e| panic!("btrfs check after fsx seed {seed} ({opts}): {e}"));
    }
}
