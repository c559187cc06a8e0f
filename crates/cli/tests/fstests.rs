//! fstests (xfstests), the Linux filesystem test suite: the fast subset listed in
//! tests/fstests/subset.txt, run by tests/fstests/run.sh on a kernel btrfs loop mount
//! and on this build's `ubtrfs mount` in the same run. It fails when a test passes on
//! the kernel but fails on ubtrfs (and tests/fstests/known-failures.txt does not say
//! why), or when `btrfs check` finds an error in an image ubtrfs wrote. The first run
//! on a machine installs fstests' build packages and builds it (a few minutes) into
//! FSTESTS_CACHE (default /var/tmp/ubtrfs-fstests); later runs reuse it.
//!
//! Needs root (/dev/fuse, loop devices, users); skipped with a line outside CI.

use std::path::Path;
use std::process::Command;
use ubtrfs_sim::host::require_fuse;

#[test]
fn fstests_subset_kernel_and_ubtrfs() {
    if !require_fuse("fstests_subset_kernel_and_ubtrfs") {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let work = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(repo.join("tests/fstests/run.sh"))
        .arg("--subset")
        .env("UBTRFS_BIN", env!("CARGO_BIN_EXE_ubtrfs"))
        .env("FSTESTS_WORK", work.path())
        .output()
        .expect("running tests/fstests/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tests/fstests/run.sh --subset failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The table lists every test of the subset, each run on both sides: a run that
    // silently ran nothing must not pass.
    let subset = std::fs::read_to_string(repo.join("tests/fstests/subset.txt")).expect("subset");
    for t in subset
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|t| !t.starts_with('#'))
    {
        assert!(
            stdout.contains(&format!("| {t} | pass | pass |")),
            "{t} did not pass on both sides:\n{stdout}"
        );
    }
}
