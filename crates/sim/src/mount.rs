//! Mounts for the integration tests that always clean up: every guard here unmounts
//! (lazily if it must) and frees its loop devices in `Drop`, so also when the test
//! panics.
//!
//! * [`KernelMount`]: image files mounted by the kernel through loop devices;
//! * [`ScratchBtrfs`]: a fresh btrfs mounted read-write, to copy or extract into
//!   ([`mkfs_btrfs`] makes such images);
//! * [`FuseMount`]: a `ubtrfs mount -f` server, and [`FuseUnmount`] for a mount the
//!   server made detached.
//!
//! Kernel mounts need root: check [`crate::host::require_root`] first. Images with one
//! fsid must not be mounted at once: hold [`crate::host::serial`] where tests share
//! images.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use std::collections::BTreeMap;

use crate::golden::{compare_walks, report, walk_mounted, STAT_FIELDS};
use crate::host::{
    bash_ok, btrfs_check, dmesg_tail, forget_devices, output_text, run_text, shell_quote, Ubtrfs,
};

/// Whether something is mounted at `p`.
pub fn is_mounted(p: &Path) -> bool {
    std::fs::canonicalize(p)
        .map(|c| ubtrfs_fuse::is_mountpoint(&c))
        .unwrap_or(false)
}

fn tempdir(prefix: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))
}

/// `umount MNT`, and `umount -l MNT` if that fails (busy): nothing stays mounted.
fn umount_or_lazy(mnt: &Path) {
    let ok = Command::new("umount")
        .arg(mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let _ = Command::new("umount").arg("-l").arg(mnt).status();
    }
}

/// A kernel btrfs mount of image files through loop devices (read-only loop devices
/// when the options say `ro`). Unmounted and its loop devices detached (and their
/// btrfs registrations forgotten) on drop, also when the test panics.
#[derive(Debug)]
pub struct KernelMount {
    /// The mountpoint.
    pub mnt: PathBuf,
    loops: Vec<String>,
    mounted: bool,
    _dir: tempfile::TempDir,
}

impl KernelMount {
    /// Mounts the image file `img` with mount options `opts`; panics on failure (with
    /// the kernel log).
    pub fn new(img: &Path, opts: &str) -> KernelMount {
        KernelMount::try_new(&[img], opts).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Mounts a filesystem of one or more image files (`device=` options name all of
    /// them). Unregisters unmounted btrfs devices first: images reuse fsids.
    pub fn try_new<P: AsRef<Path>>(devices: &[P], opts: &str) -> Result<KernelMount, String> {
        assert!(!devices.is_empty(), "KernelMount of no device");
        // Until the mount has opened its devices, no other test forgets them.
        let _registry = crate::host::device_registry_lock();
        crate::host::forget_devices_unlocked(None);
        let dir = tempdir("ubtrfs-mnt.")?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
        let mut k = KernelMount {
            mnt,
            loops: Vec::new(),
            mounted: false,
            _dir: dir,
        };
        let ro = opts.split(',').any(|o| o == "ro");
        for d in devices {
            let mut cmd = Command::new("losetup");
            if ro {
                cmd.arg("-r");
            }
            let dev = run_text(cmd.args(["-f", "--show"]).arg(d.as_ref()))?;
            k.loops.push(dev.trim().to_string());
        }
        let mut all = opts.to_string();
        if k.loops.len() > 1 {
            for l in &k.loops {
                all.push_str(",device=");
                all.push_str(l);
            }
        }
        let o = Command::new("mount")
            .args(["-t", "btrfs", "-o", &all, &k.loops[0]])
            .arg(&k.mnt)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !o.status.success() {
            let names: Vec<_> = devices.iter().map(|d| d.as_ref().display()).collect();
            return Err(format!(
                "kernel mount -o {opts} of {names:?} failed: {}\nkernel log:\n{}",
                output_text(&o),
                dmesg_tail(20)
            ));
        }
        k.mounted = true;
        Ok(k)
    }

    /// `rel` under the mountpoint.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel.trim_start_matches('/'))
    }

    /// The mountpoint, quoted for a shell command.
    pub fn q(&self) -> String {
        shell_quote(&self.mnt)
    }

    /// The (first) loop device.
    pub fn dev(&self) -> &str {
        &self.loops[0]
    }

    /// Every loop device, in the order of the images given.
    pub fn devs(&self) -> &[String] {
        &self.loops
    }

    /// Unmounts now, which must succeed (panics otherwise), and detaches the loop
    /// devices.
    pub fn umount(self) {
        self.try_umount()
            .unwrap_or_else(|e| panic!("umount failed: {e}"));
    }

    /// Unmounts now and detaches the loop devices; an error if umount fails (the
    /// drop then still unmounts lazily).
    pub fn try_umount(mut self) -> Result<(), String> {
        // A process the test started may still be exiting and hold the
        // mountpoint for a moment after its work is done ("target is busy");
        // a few short retries cover that, a real leak still fails.
        let mut tries_left = 20;
        loop {
            match run_text(Command::new("umount").arg(&self.mnt)) {
                Ok(_) => break,
                Err(e) if e.contains("busy") && tries_left > 0 => {
                    tries_left -= 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
        self.mounted = false;
        self.detach();
        Ok(())
    }

    fn detach(&mut self) {
        for l in self.loops.drain(..) {
            forget_devices(Some(&l));
            let _ = Command::new("losetup").args(["-d", &l]).status();
        }
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if self.mounted {
            umount_or_lazy(&self.mnt);
            self.mounted = false;
        }
        self.detach();
    }
}

/// Makes `img` a fresh sparse btrfs image of `size` bytes: `mkfs.btrfs -q -f ARGS IMG`.
pub fn mkfs_btrfs(img: &Path, size: u64, args: &[&str]) {
    File::create(img)
        .and_then(|f| f.set_len(size))
        .unwrap_or_else(|e| panic!("{}: {e}", img.display()));
    let o = Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .args(args)
        .arg(img)
        .output()
        .unwrap_or_else(|e| panic!("mkfs.btrfs (install btrfs-progs): {e}"));
    assert!(
        o.status.success(),
        "mkfs.btrfs {args:?} {} failed: {}",
        img.display(),
        output_text(&o)
    );
}

/// A fresh 2 GiB btrfs (64 KiB nodes: the golden images' 16 KiB xattrs fit; tmpfs
/// and ext4 cannot hold them) loop-mounted read-write, to copy or extract into.
/// Unmounted and freed on drop, also when the test panics.
#[derive(Debug)]
pub struct ScratchBtrfs {
    // Declared first: unmounted before the directory holding the image goes.
    mount: KernelMount,
    _dir: tempfile::TempDir,
}

impl ScratchBtrfs {
    /// Makes and loop-mounts the filesystem (panics on failure).
    pub fn new() -> ScratchBtrfs {
        let dir = tempdir("ubtrfs-scratch.").unwrap_or_else(|e| panic!("{e}"));
        let img = dir.path().join("scratch.img");
        mkfs_btrfs(&img, 2 << 30, &["-n", "65536"]);
        ScratchBtrfs {
            mount: KernelMount::new(&img, "rw"),
            _dir: dir,
        }
    }

    /// The mountpoint.
    pub fn path(&self) -> PathBuf {
        self.mount.mnt.clone()
    }
}

impl Default for ScratchBtrfs {
    fn default() -> Self {
        ScratchBtrfs::new()
    }
}

/// The mount helper `/sbin/mount.fuse.ubtrfs` (for `mount -t fuse.ubtrfs`), linked to
/// `bin` for a test if missing and removed again on drop; an existing one is kept.
#[derive(Debug)]
pub struct HelperLink(Option<PathBuf>);

impl HelperLink {
    /// Makes the link unless it is there.
    pub fn ensure(bin: &Path) -> HelperLink {
        let helper = Path::new("/sbin/mount.fuse.ubtrfs");
        if helper.exists() {
            return HelperLink(None);
        }
        std::os::unix::fs::symlink(bin, helper).expect("mount helper link");
        HelperLink(Some(helper.to_path_buf()))
    }
}

impl Drop for HelperLink {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Unmounts a FUSE mount like a user would (`fusermount3 -u`, else `umount -l`).
pub fn fuse_unmount(mnt: &Path) {
    if is_mounted(mnt) {
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(mnt).status();
        }
    }
}

/// Unmounts the FUSE mount at the path on drop ([`fuse_unmount`]): for a mount that
/// `ubtrfs mount` made detached.
#[derive(Debug)]
pub struct FuseUnmount<'a>(pub &'a Path);

impl Drop for FuseUnmount<'_> {
    fn drop(&mut self) {
        fuse_unmount(self.0);
    }
}

/// `devices` as one `ubtrfs` image argument: `a.img,b.img`.
pub fn image_arg<P: AsRef<Path>>(devices: &[P]) -> std::ffi::OsString {
    let parts: Vec<_> = devices
        .iter()
        .map(|d| d.as_ref().as_os_str().to_owned())
        .collect();
    parts.join(std::ffi::OsStr::new(","))
}

/// A `ubtrfs mount -f` server in the background; unmounted and reaped on drop, also
/// when the test panics.
#[derive(Debug)]
pub struct FuseMount {
    /// The mountpoint.
    pub mnt: PathBuf,
    /// The `ubtrfs mount -f` process.
    pub child: Child,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl FuseMount {
    /// Starts `ubtrfs mount -f DEVICES MNT -o OPT...` (read-only unless `opts` say
    /// `rw`) and waits until the mount is there (panics if the server exits first or
    /// it takes 30 s).
    pub fn start<P: AsRef<Path>>(ubtrfs: &Ubtrfs, devices: &[P], opts: &[&str]) -> FuseMount {
        Self::start_env(ubtrfs, devices, opts, &[])
    }

    /// [`FuseMount::start`] with environment variables for the server (test
    /// knobs such as `UBTRFS_BALANCE_STEP_DELAY_MS`).
    pub fn start_env<P: AsRef<Path>>(
        ubtrfs: &Ubtrfs,
        devices: &[P],
        opts: &[&str],
        env: &[(&str, &str)],
    ) -> FuseMount {
        let dir = tempdir("ubtrfs-fuse.").unwrap_or_else(|e| panic!("{e}"));
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir");
        let stderr = dir.path().join("stderr");
        let mut cmd = ubtrfs.command();
        cmd.arg("mount").arg(image_arg(devices)).arg(&mnt).arg("-f");
        // The read-side tests compare with the kernel's `ro` mount: read-only unless
        // the caller asks for rw.
        let mode_given = opts
            .iter()
            .flat_map(|o| o.split(','))
            .any(|o| o == "rw" || o == "ro");
        if !mode_given {
            cmd.arg("-o").arg("ro");
        }
        for o in opts {
            cmd.arg("-o").arg(o);
        }
        cmd.envs(env.iter().copied());
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("spawn ubtrfs mount -f");
        let mut m = FuseMount {
            mnt,
            child,
            stderr,
            _dir: dir,
        };
        let t0 = Instant::now();
        while !is_mounted(&m.mnt) {
            if let Ok(Some(st)) = m.child.try_wait() {
                panic!("ubtrfs mount -f exited early ({st}): {}", m.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "mount did not appear"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    /// What the server wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Unmounts like a user would and waits for the server to exit.
    pub fn unmount(&mut self) -> ExitStatus {
        fuse_unmount(&self.mnt);
        self.wait(Duration::from_secs(20))
    }

    /// What the mount shows now ([`walk_mounted`]: names, every stat field, contents,
    /// xattrs), then unmounts; panics unless the server exits 0.
    pub fn walk_and_unmount(mut self) -> BTreeMap<String, Value> {
        let seen = walk_mounted(&self.mnt);
        let st = self.unmount();
        assert!(
            st.success(),
            "ubtrfs mount exited with {st}: {}",
            self.log()
        );
        seen
    }

    /// Runs `script` with bash (`set -e`) in the mount: its stdout. Panics naming
    /// `what`, with the server's log, if the script fails.
    pub fn run(&self, script: &str, what: &str) -> String {
        bash_ok(&self.mnt, script)
            .unwrap_or_else(|e| panic!("{what} on the ubtrfs mount: {e}\nserver: {}", self.log()))
    }

    /// Waits for the server to exit; kills it after `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            if t0.elapsed() > limit {
                let _ = self.child.kill();
                return self.child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// The kernel round trip of an image that a read-write `ubtrfs mount` wrote and
/// unmounted: `btrfs check --readonly --check-data-csum` is clean and a kernel
/// mount shows exactly `seen` (what the FUSE mount showed: every field of
/// [`STAT_FIELDS`], st_ino and times included). Panics naming `what` otherwise.
pub fn kernel_round_trip(img: &Path, seen: &BTreeMap<String, Value>, what: &str) {
    btrfs_check(img, None).unwrap_or_else(|e| panic!("{what}: {e}"));
    let k = KernelMount::new(img, "ro");
    let kernel = walk_mounted(&k.mnt);
    k.umount();
    report(compare_walks(
        &format!("{what}: kernel view of the ubtrfs-written image"),
        seen,
        &kernel,
        STAT_FIELDS,
    ));
}

/// The kernel mounts `img` with `opts`, runs `script` there with bash (`set -e`),
/// and returns what the mount shows then ([`walk_mounted`]), before unmounting: the
/// kernel's side of a workload run on both. Panics naming `what` if the script fails.
pub fn kernel_workload(
    img: &Path,
    opts: &str,
    script: &str,
    what: &str,
) -> BTreeMap<String, Value> {
    let k = KernelMount::new(img, opts);
    bash_ok(&k.mnt, script).unwrap_or_else(|e| panic!("{what} on the kernel: {e}"));
    let tree = walk_mounted(&k.mnt);
    k.umount();
    tree
}

/// The exclusive bytes of some files of a kernel mount, as `btrfs filesystem du
/// --raw` counts them (by name relative to `mnt`).
pub fn kernel_exclusive_bytes(mnt: &Path, files: &[&str]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for f in files {
        let text = run_text(
            Command::new("btrfs")
                .args(["filesystem", "du", "--raw"])
                .arg(mnt.join(f)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let excl = text
            .lines()
            .last()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("btrfs filesystem du {f}: {text}"));
        out.insert(f.to_string(), excl);
    }
    out
}

/// The kernel mounts `img` read-write, runs `script` there with bash (`set -e`) and
/// unmounts: the kernel writing to an image ubtrfs wrote, before ubtrfs mounts it
/// again. Its stdout; panics naming `what` if the script fails.
pub fn kernel_writes(img: &Path, script: &str, what: &str) -> String {
    let k = KernelMount::new(img, "rw");
    let out = bash_ok(&k.mnt, script).unwrap_or_else(|e| panic!("{what}: kernel writes: {e}"));
    k.umount();
    out
}
