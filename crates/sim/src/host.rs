//! The host side of the integration tests: whether a root-only test runs (and the
//! rule that CI never skips one), running commands and the `ubtrfs` binary, the kernel
//! log, btrfs-progs (`btrfs check`, device registrations), scratch image files, and
//! small things every test binary wants (environment numbers, panic messages).
//!
//! The kernel mounts themselves are in [`crate::mount`].

use std::any::Any;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

// ---------------------------------------------------------------------------------
// Root, CI and skipping

/// True inside CI: `CI` or `UBTRFS_CI` is set to a non-empty value (.ci/run and a
/// root run of tests/run-all.sh set `UBTRFS_CI=1`). There no test may skip.
pub fn in_ci() -> bool {
    ["CI", "UBTRFS_CI"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// Leaves out `what` because of `why`: outside CI with one line on stderr, inside CI
/// ([`in_ci`]) never: there it panics. The line goes to the real stderr, past the test
/// harness's output capture, so that a skipped test does not pass unnoticed.
pub fn skip(what: &str, why: &str) {
    assert!(
        !in_ci(),
        "{what} cannot run: {why}; CI or UBTRFS_CI is set, and CI never skips a test"
    );
    let _ = writeln!(io::stderr(), "SKIPPED {what}: {why}");
}

/// Whether the root-only `test` may run: true as root. Without root it is skipped
/// ([`skip`]: false after one line on stderr), except in CI, where it panics.
pub fn require_root(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        skip(test, "needs root (loop devices, kernel mounts)");
    }
    root
}

/// Sets the fuse module's `enable_uring` parameter (FUSE over io_uring, offered to
/// mounts made while it is set) for the life of the guard, then puts back what it
/// was. A host-wide setting: test binaries that use it never run at once
/// (tests/run-tests.py's groups).
pub struct EnableUring(Option<String>);

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

impl EnableUring {
    /// Turns FUSE over io_uring on; None where the kernel has no such parameter.
    pub fn on() -> Option<EnableUring> {
        let old = std::fs::read_to_string(ENABLE_URING).ok()?;
        std::fs::write(ENABLE_URING, "Y").ok()?;
        Some(EnableUring(Some(old.trim().to_string())))
    }

    /// [`EnableUring::on`], or `test` is skipped ([`skip`]: None, after one line
    /// on stderr; in CI a panic) where the kernel has no FUSE over io_uring.
    pub fn on_or_skip(test: &str) -> Option<EnableUring> {
        let on = EnableUring::on();
        if on.is_none() {
            skip(
                test,
                "the kernel has no FUSE over io_uring (fuse module parameter enable_uring)",
            );
        }
        on
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            let _ = std::fs::write(ENABLE_URING, old);
        }
    }
}

/// [`require_root`], and /dev/fuse for `ubtrfs mount`.
pub fn require_fuse(test: &str) -> bool {
    if !require_root(test) {
        return false;
    }
    let fuse = Path::new("/dev/fuse").exists();
    if !fuse {
        skip(test, "needs /dev/fuse (FUSE mounts)");
    }
    fuse
}

/// One kernel-using test (or kernel mount) at a time in this test process: loop
/// mounts of images with one fsid would clash, and the heavy tests would starve each
/// other's time limits when the harness runs them in parallel. Not re-entrant.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------
// Small things

/// The number in environment variable `name`, if set; panics on a non-number.
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

/// The message of a caught panic (`catch_unwind`'s error).
pub fn panic_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

/// A name unique in this machine for now: `PREFIX-PID-N`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

// ---------------------------------------------------------------------------------
// Commands

/// A command's stdout followed by its stderr, as text.
pub fn output_text(o: &Output) -> String {
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    s
}

/// The first `lines` lines of `s`, and how many more there were.
pub fn head(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    if v.len() <= lines {
        return s.to_string();
    }
    format!(
        "{}\n... ({} more lines)",
        v[..lines].join("\n"),
        v.len() - lines
    )
}

/// `p` quoted for a shell command line.
pub fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// `sh -c CMD`, which must succeed; its stdout.
pub fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        o.status.success(),
        "shell command failed ({}): {cmd}\n{}",
        o.status,
        head(&output_text(&o), 60)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `bash -c SCRIPT` in `dir`, whatever its exit status: (stdout, stderr).
pub fn bash_in(dir: &Path, script: &str) -> (String, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("bash");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `bash -c 'set -e' SCRIPT` in `dir`: its stdout when it exits 0, else an error
/// with the exit status, stdout and stderr (cut to their last lines).
pub fn bash_ok(dir: &Path, script: &str) -> Result<String, String> {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -e\n{script}"))
        .current_dir(dir)
        .output()
        .map_err(|e| format!("running bash: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    let tail = |s: &str| {
        let v: Vec<&str> = s.lines().collect();
        v[v.len().saturating_sub(40)..].join("\n")
    };
    Err(format!(
        "script failed ({}) in {}:\n{script}\n--- stdout (end):\n{}\n--- stderr (end):\n{}",
        out.status,
        dir.display(),
        tail(&stdout),
        tail(&String::from_utf8_lossy(&out.stderr))
    ))
}

/// Runs `cmd`: its stdout and stderr when it exits 0, else an error naming it.
pub fn run_text(cmd: &mut Command) -> Result<String, String> {
    let o = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    let t = output_text(&o);
    if o.status.success() {
        Ok(t)
    } else {
        Err(format!("{cmd:?}: {}: {}", o.status, t.trim()))
    }
}

/// `ubtrfs ARGS` as a failure message shows it (long lists cut).
pub fn show_args<S: AsRef<OsStr>>(args: &[S]) -> String {
    let v: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let mut s = v.join(" ");
    if s.len() > 300 {
        s.truncate(300);
        s.push_str(&format!(" ... ({} args)", v.len()));
    }
    format!("ubtrfs {s}")
}

/// The `ubtrfs` binary under test. Only the tests of ubtrfs-cli know its path
/// (`Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"))`).
#[derive(Clone, Copy, Debug)]
pub struct Ubtrfs {
    /// Path of the binary.
    pub bin: &'static str,
    /// Seconds a run may take before it counts as hung (killed by `timeout`, exit
    /// 124 or 137); none: no limit.
    pub limit_secs: Option<u32>,
}

impl Ubtrfs {
    /// The binary at `bin`, with no time limit.
    pub const fn new(bin: &'static str) -> Ubtrfs {
        Ubtrfs {
            bin,
            limit_secs: None,
        }
    }

    /// The same binary, each run under a time limit.
    pub const fn with_limit(self, secs: u32) -> Ubtrfs {
        Ubtrfs {
            limit_secs: Some(secs),
            ..self
        }
    }

    /// A command for the binary (no time limit), to add arguments and stdio to.
    pub fn command(&self) -> Command {
        Command::new(self.bin)
    }

    /// Runs it with ARGS (stdin empty, under the time limit if any).
    pub fn output<S: AsRef<OsStr>>(&self, args: &[S]) -> Output {
        let mut cmd = match self.limit_secs {
            Some(secs) => {
                let mut c = Command::new("timeout");
                c.arg("--kill-after=5").arg(secs.to_string()).arg(self.bin);
                c
            }
            None => self.command(),
        };
        cmd.args(args)
            .stdin(Stdio::null())
            .output()
            .expect("spawn ubtrfs")
    }

    /// Runs it with ARGS: (exited 0, stdout, stderr).
    pub fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> (bool, String, String) {
        let o = self.output(args);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// Runs it with ARGS, which must succeed; its stdout.
    pub fn stdout<S: AsRef<OsStr>>(&self, args: &[S]) -> String {
        let o = self.output(args);
        let hung = match (self.limit_secs, o.status.code()) {
            (Some(secs), Some(124 | 137)) => format!(" (no exit after {secs}s: hung)"),
            _ => String::new(),
        };
        assert!(
            o.status.success(),
            "{} failed ({}){hung}:\n{}",
            show_args(args),
            o.status,
            head(&output_text(&o), 40)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

// ---------------------------------------------------------------------------------
// The kernel log

/// The last `lines` lines of the kernel log (for a failed mount's message).
pub fn dmesg_tail(lines: usize) -> String {
    Command::new("sh")
        .arg("-c")
        .arg(format!("dmesg | tail -n {lines}"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Writes a marker line into the kernel log (to find the lines one mount produced).
pub fn kmsg_marker(tag: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        let _ = writeln!(f, "{tag}");
    }
}

/// The kernel log lines after the last `tag` marker.
pub fn dmesg_since(tag: &str) -> Vec<String> {
    let out = Command::new("dmesg")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = out.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.ends_with(tag))
        .map_or(0, |i| i + 1);
    lines[start..].iter().map(|l| l.to_string()).collect()
}

// ---------------------------------------------------------------------------------
// btrfs-progs

/// Whether `btrfs` (btrfs-progs) can be run.
pub fn have_btrfs() -> bool {
    Command::new("btrfs")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A host-wide lock (flock on a file in /tmp) held while the kernel registers
/// devices for a mount: `btrfs device scan --forget` of every device in another
/// test process, between a multi-device mount's scan of its devices and its open,
/// made that mount find one missing (failed a CI run: "devid 2 ... is missing").
/// Held by [`forget_devices`] for all devices and by `KernelMount` around its mount.
pub fn device_registry_lock() -> Option<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/ubtrfs-test-btrfs-devices.lock")
        .ok()?;
    f.lock().ok()?;
    Some(f)
}

/// Unregisters btrfs devices that are not mounted (`dev`, or all): test images reuse
/// fsids, across runs and within one. Forgetting all takes [`device_registry_lock`].
pub fn forget_devices(dev: Option<&str>) {
    let _lock = if dev.is_none() {
        device_registry_lock()
    } else {
        None
    };
    forget_devices_unlocked(dev);
}

/// [`forget_devices`] for a caller that holds [`device_registry_lock`].
pub fn forget_devices_unlocked(dev: Option<&str>) {
    let _ = Command::new("btrfs")
        .args(["device", "scan", "--forget"])
        .args(dev)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `btrfs check --readonly --check-data-csum [--super N] PATH`: its output when it
/// exits 0 and prints no `ERROR:` line, else `btrfs check failed (STATUS):\nOUTPUT`.
/// `super_copy` selects a superblock copy other than the primary (then the primary's
/// bad checksum, which btrfs check still reports, is no failure).
pub fn btrfs_check(path: &Path, super_copy: Option<usize>) -> Result<String, String> {
    let mut cmd = Command::new("btrfs");
    cmd.args(["check", "--readonly", "--check-data-csum"]);
    if let Some(i) = super_copy {
        cmd.args(["--super", &i.to_string()]);
    }
    let out = cmd
        .arg(path)
        .output()
        .map_err(|e| format!("running btrfs: {e}"))?;
    let text = output_text(&out);
    let bad = |l: &&str| !(super_copy.is_some() && *l == "ERROR: superblock checksum mismatch");
    if !out.status.success() || progs_errors(&text).iter().any(bad) {
        return Err(format!("btrfs check failed ({}):\n{text}", out.status));
    }
    // Whatever btrfs check passes, ubtrfs's own check must pass too (when the
    // primary superblock is good; `super_copy` cases damaged it on purpose). It reads
    // every copy of every block, which btrfs check does not: that is how it found
    // tree blocks allocated over superblock copies (fixed in alloc/block_group.rs).
    if super_copy.is_none() {
        ubtrfs_check(path)?;
    }
    Ok(text)
}

/// The bytes `fstrim -v` (or `ubtrfs filesystem trim -v`) says it trimmed: "MNT: 4 GiB
/// (4261806080 bytes) trimmed". Panics on other text.
pub fn fstrim_bytes(out: &str) -> u64 {
    out.split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("trim said {out:?}"))
}

/// The "ERROR:" lines of btrfs-progs' output, but for "ERROR: cannot scan DEV": progs
/// scan every block device for the filesystem's other devices, and a loop device
/// another test is attaching or detaching at that moment answers EIO. That concerns
/// no device of the checked filesystem (a missing one fails the command otherwise).
pub fn progs_errors(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("ERROR:") && !l.starts_with("ERROR: cannot scan "))
        .collect()
}

/// `ubtrfs check --check-data-csum` of an image through the library: `Err` with the
/// problems when it is not clean.
pub fn ubtrfs_check(path: &Path) -> Result<(), String> {
    let info = ubtrfs_core::FsInfo::open_paths(&[path], ubtrfs_core::OpenOptions::default())
        .map_err(|e| format!("ubtrfs check: {}: {e}", path.display()))?;
    let fs = ubtrfs_core::Filesystem::from_info(info);
    let opts = ubtrfs_core::CheckOptions {
        check_data_csum: true,
        qgroup_report: false,
        ..Default::default()
    };
    let r = ubtrfs_core::check_filesystem(&fs, &opts, &mut |_, _| {})
        .map_err(|e| format!("ubtrfs check: {}: {e}", path.display()))?;
    if r.is_clean() {
        return Ok(());
    }
    let lines: Vec<String> = r.problems.iter().take(30).map(|p| p.to_string()).collect();
    Err(format!(
        "ubtrfs check found {} problem(s) that btrfs check did not in {}:\n{}",
        r.problem_count,
        path.display(),
        lines.join("\n")
    ))
}

/// [`btrfs_check`] of an image of `size` bytes that `fill` writes into a fresh
/// [`ScratchFile`].
pub fn btrfs_check_image(
    size: u64,
    fill: impl FnOnce(&File) -> io::Result<()>,
    super_copy: Option<usize>,
) -> Result<(), String> {
    let f = ScratchFile::create("ubtrfs-sim", size, fill)?;
    btrfs_check(&f.path, super_copy).map(drop)
}

// ---------------------------------------------------------------------------------
// Scratch image files

/// A sparse image file on tmpfs (/dev/shm) when there is one, else in the temporary
/// directory; removed on drop.
#[derive(Debug)]
pub struct ScratchFile {
    /// Path of the file.
    pub path: PathBuf,
}

impl ScratchFile {
    /// A file of `size` bytes (zeros) that `fill` then writes into.
    pub fn create(
        prefix: &str,
        size: u64,
        fill: impl FnOnce(&File) -> io::Result<()>,
    ) -> Result<ScratchFile, String> {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let s = ScratchFile {
            path: dir.join(format!("{}.img", unique_name(prefix))),
        };
        let err = |e: io::Error| format!("{}: {e}", s.path.display());
        let f = File::create(&s.path).map_err(err)?;
        f.set_len(size).map_err(err)?;
        fill(&f).map_err(|e| format!("writing {}: {e}", s.path.display()))?;
        Ok(s)
    }

    /// A crash image `img` as a sparse file (the openers take paths).
    pub fn of_image(prefix: &str, img: &[u8]) -> Result<ScratchFile, String> {
        ScratchFile::create(prefix, img.len() as u64, |f| write_sparse(f, img))
    }
}

/// Fails the test with the count and the first 30 of `failures`, if there are any:
/// a crash test collects every bad cut before it reports.
pub fn assert_no_failures(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n")
    );
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes the 4 KiB blocks of `img` that are not all zeros into `f` (which reads as
/// zeros elsewhere, e.g. fresh from `set_len`).
pub fn write_sparse(f: &File, img: &[u8]) -> io::Result<()> {
    for (i, block) in img.chunks(4096).enumerate() {
        if block.iter().any(|&b| b != 0) {
            f.write_all_at(block, (i * 4096) as u64)?;
        }
    }
    Ok(())
}
