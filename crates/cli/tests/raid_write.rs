//! Writing striped profiles (RAID0, RAID10) on multi-device filesystems the kernel
//! made, against the kernel: new chunks of those profiles made offline (`put`), by
//! `balance -dconvert/-mconvert`, and through the read-write mount, on equal and on
//! unequal devices, up to ENOSPC. After each step:
//! - `btrfs check --readonly --check-data-csum` (on loop devices of every image)
//!   and ubtrfs's own check are clean;
//! - btrfs-progs' dump of the chunk tree shows every chunk with the profile asked
//!   for, and more chunks than mkfs.btrfs made (new ones were allocated);
//! - the kernel mounts the devices and shows the files written, byte for byte, and
//!   what it showed before (every stat field);
//! - the kernel then writes and balances the chunks ubtrfs made: clean again.
//!
//! Needs root (loop devices); skipped with a line outside CI.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use ubtrfs_sim::golden::walk_mounted;
use ubtrfs_sim::host::{
    bash_ok, fstrim_bytes, progs_errors, require_fuse, require_root, serial, sh, Ubtrfs,
};
use ubtrfs_sim::mount::{FuseMount, KernelMount};

fn bin() -> Ubtrfs {
    Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs")).with_limit(300)
}

/// `n` sparse image files of the given sizes in `dir`, made one filesystem by
/// `mkfs.btrfs -n 4096 ARGS`.
fn mkfs_multi(dir: &Path, sizes_mib: &[u64], args: &[&str]) -> Vec<PathBuf> {
    let imgs: Vec<PathBuf> = (0..sizes_mib.len())
        .map(|i| dir.join(format!("d{i}.img")))
        .collect();
    for (p, &mib) in imgs.iter().zip(sizes_mib) {
        std::fs::File::create(p)
            .and_then(|f| f.set_len(mib << 20))
            .expect("image file");
    }
    let names: Vec<String> = imgs.iter().map(|p| p.display().to_string()).collect();
    sh(&format!(
        "mkfs.btrfs -q -f -n 4096 {} {}",
        args.join(" "),
        names.join(" ")
    ));
    imgs
}

fn joined(imgs: &[PathBuf]) -> String {
    let v: Vec<String> = imgs.iter().map(|p| p.display().to_string()).collect();
    v.join(",")
}

/// Sparse copies of `imgs`, named NAME.TAG.img beside them.
fn copy_images(imgs: &[PathBuf], tag: &str) -> Vec<PathBuf> {
    imgs.iter()
        .map(|p| {
            let to = p.with_extension(format!("{tag}.img"));
            sh(&format!(
                "cp --sparse=always {} {}",
                p.display(),
                to.display()
            ));
            to
        })
        .collect()
}

/// Chunks as (length, stripes), without their order.
fn chunk_shapes(v: &[(String, u64, u64, u64)]) -> std::collections::BTreeSet<(u64, u64)> {
    v.iter().map(|c| (c.3, c.1)).collect()
}

/// Runs `workload` (bash, in the mount) on a kernel mount of `kimgs` (copies of the
/// images before ubtrfs wrote `ours`, its data chunks) and asserts that the kernel
/// made data chunks of the same lengths and stripe counts; removes the copies.
fn same_chunks_as_the_kernel(
    ours: &[(String, u64, u64, u64)],
    kimgs: Vec<PathBuf>,
    workload: &str,
    what: &str,
) {
    let k = KernelMount::try_new(&kimgs, "rw").unwrap_or_else(|e| panic!("{e}"));
    bash_ok(&k.mnt, workload).unwrap_or_else(|e| panic!("the kernel's workload: {e}"));
    k.try_umount().expect("umount");
    let theirs = data_chunks(&kimgs);
    assert_eq!(
        chunk_shapes(ours),
        chunk_shapes(&theirs),
        "data chunks (length, stripes): {what} {ours:?}, the kernel's {theirs:?}"
    );
    for p in &kimgs {
        std::fs::remove_file(p).expect("rm");
    }
}

/// Runs `script` with `$A` the first of loop devices attached to `imgs` (all of
/// them, so btrfs-progs finds the filesystem's other devices by scanning); they are
/// detached afterwards, whatever happens. Its stdout.
fn on_loops(imgs: &[PathBuf], script: &str) -> String {
    let mut s = String::from("set -e\nL=()\ntrap 'losetup -d \"${L[@]}\"' EXIT\n");
    for p in imgs {
        s.push_str(&format!("L+=($(losetup -f --show {}))\n", p.display()));
    }
    s.push_str("A=${L[0]}\n");
    s.push_str(script);
    let o = std::process::Command::new("bash")
        .arg("-c")
        .arg(&s)
        .output()
        .expect("bash");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{script}\nfailed: {out}\n{err}");
    out
}

/// btrfs check (btrfs-progs and ubtrfs) is clean.
fn checks_clean(imgs: &[PathBuf], what: &str) {
    let text = on_loops(
        imgs,
        "btrfs check --readonly --check-data-csum $A 2>&1 || { echo FAILED; exit 0; }",
    );
    assert!(
        !text.contains("FAILED") && progs_errors(&text).is_empty(),
        "btrfs check after {what}:\n{text}"
    );
    let c = bin().output(&["check", "--check-data-csum", &joined(imgs)]);
    assert!(c.status.success(), "ubtrfs check after {what}: {c:?}");
}

/// Every chunk as ("TYPE|PROFILE", num_stripes, sub_stripes, length), from
/// btrfs-progs' dump of the chunk tree.
fn chunks_detail(imgs: &[PathBuf]) -> Vec<(String, u64, u64, u64)> {
    let text = on_loops(imgs, "btrfs inspect-internal dump-tree -t chunk $A");
    let mut out: Vec<(String, u64, u64, u64)> = Vec::new();
    for l in text.lines().map(str::trim) {
        if let Some(rest) = l.strip_prefix("length ") {
            let len = rest
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let ty = rest.split(" type ").nth(1).unwrap_or("").trim().to_string();
            out.push((ty, 0, 0, len));
        } else if let (Some(c), Some(rest)) = (out.last_mut(), l.strip_prefix("num_stripes ")) {
            let mut w = rest.split_whitespace();
            c.1 = w.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            c.2 = w.nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        }
    }
    out
}

/// The data chunks of [`chunks_detail`].
fn data_chunks(imgs: &[PathBuf]) -> Vec<(String, u64, u64, u64)> {
    chunks_detail(imgs)
        .into_iter()
        .filter(|c| c.0.starts_with("DATA"))
        .collect()
}

/// Every chunk as "TYPE|PROFILE".
fn chunk_types(imgs: &[PathBuf]) -> Vec<String> {
    chunks_detail(imgs).into_iter().map(|c| c.0).collect()
}

/// Every chunk has the profile `want` gives its type ("DATA" -> "RAID0", ...).
fn assert_profiles(imgs: &[PathBuf], want: &[(&str, &str)], what: &str) -> usize {
    let types = chunk_types(imgs);
    for t in &types {
        let (ty, profile) = t.split_once('|').unwrap_or((t.as_str(), "single"));
        let wanted = want.iter().find(|w| w.0 == ty).map(|w| w.1);
        assert_eq!(Some(profile), wanted, "{what}: a {t} chunk among {types:?}");
    }
    types.len()
}

/// What the kernel shows (read-only), and `diff -r` of `dir` in it against `src`.
fn kernel_view(imgs: &[PathBuf], src: &Path, dir: &str) -> BTreeMap<String, serde_json::Value> {
    let k = KernelMount::try_new(imgs, "ro").unwrap_or_else(|e| panic!("{e}"));
    sh(&format!(
        "diff -r {} {}",
        src.display(),
        k.path(dir).display()
    ));
    let mut t = walk_mounted(&k.mnt);
    t.retain(|_, v| v["ino"] != 2);
    k.try_umount().expect("umount");
    t
}

/// `count` files of `mib` MiB of random data (and a few hundred small ones), in `dir`.
fn make_source(dir: &Path, count: usize, mib: usize) {
    std::fs::create_dir_all(dir).expect("mkdir");
    sh(&format!(
        "cd {d} && for i in $(seq 1 {count}); do head -c {mib}M /dev/urandom > big$i; done && \
         mkdir small && for i in $(seq 1 400); do head -c $((i * 37)) /dev/urandom > small/s$i; done",
        d = dir.display()
    ));
}

/// Four equal devices, RAID0 data and RAID10 metadata from mkfs.btrfs: `ubtrfs
/// put` of more data than mkfs's chunks hold makes RAID0 data chunks; a balance
/// converts data to RAID10 and metadata and system to RAID0 (new chunks of those),
/// and back; the kernel reads every step and then writes and balances itself.
#[test]
fn raid0_and_raid10_chunks_made_offline() {
    if !require_root("raid0_and_raid10_chunks_made_offline") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let imgs = mkfs_multi(
        dir.path(),
        &[768, 768, 768, 768],
        &["-d raid0", "-m raid10"],
    );
    let devs = joined(&imgs);
    let made = assert_profiles(
        &imgs,
        &[
            ("DATA", "RAID0"),
            ("METADATA", "RAID10"),
            ("SYSTEM", "RAID10"),
        ],
        "mkfs",
    );
    {
        let k = KernelMount::try_new(&imgs, "rw").unwrap_or_else(|e| panic!("{e}"));
        sh(&format!(
            "cd {m} && head -c 3M /dev/urandom > kfile && mkdir kdir && echo hi > kdir/x && \
             btrfs subvolume snapshot . snap >/dev/null",
            m = k.q()
        ));
        k.try_umount().expect("umount");
    }
    let _ = made;
    let before = data_chunks(&imgs);
    let mkfs_data = before.len();
    // The kernel's mount above sometimes allocates a second data chunk; then the
    // 450 MiB may fit in what is there, and no new chunk is owed.
    let room: u64 = before.iter().map(|c| c.3).sum();
    // A copy written by the kernel instead: its data chunks are the oracle for ours.
    let kimgs = copy_images(&imgs, "kernel");
    let src = dir.path().join("src");
    make_source(&src, 9, 50);
    bin().stdout(&["put", &devs, &src.display().to_string(), "/"]);
    checks_clean(&imgs, "put");
    assert_profiles(
        &imgs,
        &[
            ("DATA", "RAID0"),
            ("METADATA", "RAID10"),
            ("SYSTEM", "RAID10"),
        ],
        "put",
    );
    let ours = data_chunks(&imgs);
    assert!(
        ours.len() > mkfs_data || room >= 460 << 20,
        "put of 450 MiB made no new RAID0 data chunk: {ours:?}"
    );
    for c in &ours {
        assert_eq!(c.1, 4, "a RAID0 data chunk on four equal devices: {c:?}");
    }
    same_chunks_as_the_kernel(
        &ours,
        kimgs,
        &format!("cp -a {} . && sync", src.display()),
        "ubtrfs's put",
    );
    let before = kernel_view(&imgs, &src, "src");

    for (args, want, what) in [
        (
            ["-dconvert=raid10", "-mconvert=raid0", "-sconvert=raid0"],
            [
                ("DATA", "RAID10"),
                ("METADATA", "RAID0"),
                ("SYSTEM", "RAID0"),
            ],
            "convert to data raid10, metadata raid0",
        ),
        (
            ["-dconvert=raid0", "-mconvert=raid10", "-sconvert=raid10"],
            [
                ("DATA", "RAID0"),
                ("METADATA", "RAID10"),
                ("SYSTEM", "RAID10"),
            ],
            "convert back",
        ),
    ] {
        let mut full = vec!["balance", "start", "-f"];
        full.extend(args);
        full.push(&devs);
        let out = bin().stdout(&full);
        assert!(out.starts_with("Done, had to relocate"), "{what}: {out}");
        checks_clean(&imgs, what);
        assert_profiles(&imgs, &want, what);
        assert_eq!(
            kernel_view(&imgs, &src, "src"),
            before,
            "files after {what}"
        );
    }

    // The kernel writes and moves the chunks ubtrfs made.
    {
        let k = KernelMount::try_new(&imgs, "rw").unwrap_or_else(|e| panic!("{e}"));
        sh(&format!(
            "cd {m} && head -c 20M /dev/urandom > kernel-after && cp src/big1 big1-copy && \
             btrfs balance start -dusage=100 -musage=100 . >/dev/null && sync",
            m = k.q()
        ));
        k.try_umount().expect("umount");
    }
    checks_clean(&imgs, "the kernel's writes and balance");
    let cat = bin().output(&["cat", &devs, "/big1-copy"]);
    assert!(cat.status.success(), "cat: {cat:?}");
    assert_eq!(
        cat.stdout,
        std::fs::read(src.join("big1")).expect("read src"),
        "a file the kernel wrote after ubtrfs's chunks, read by ubtrfs"
    );

    // fstrim: the kernel's FITRIM and `ubtrfs filesystem trim` of copies of the
    // images trim the same bytes (free space of RAID0 and RAID10 groups on every
    // stripe and mirror, and the unallocated space), and the trimmed copy is clean.
    bin().stdout(&["rm", "-r", &devs, "/src/small", "/big1-copy"]);
    let (kimgs, oimgs) = (copy_images(&imgs, "k"), copy_images(&imgs, "o"));
    let k = KernelMount::try_new(&kimgs, "rw").unwrap_or_else(|e| panic!("{e}"));
    let kernel = fstrim_bytes(&sh(&format!("fstrim -v {}", k.q())));
    k.try_umount().expect("umount");
    let out = bin().stdout(&["filesystem", "trim", "-v", &joined(&oimgs)]);
    assert_eq!(fstrim_bytes(&out), kernel, "bytes trimmed: ubtrfs {out}");
    checks_clean(&oimgs, "trim");
    assert_eq!(
        bin().output(&["cat", &joined(&oimgs), "/src/big3"]).stdout,
        std::fs::read(src.join("big3")).expect("read src"),
        "a file after the trim"
    );
}

/// Unequal devices (256, 256 and 1024 MiB), RAID0 data: files are put one at a
/// time until ENOSPC. New RAID0 chunks span all three devices, then (once the small
/// ones are full) the big one alone, as the kernel's allocator does; the refused
/// put leaves the last commit, clean, and the kernel shows every file put before.
#[test]
fn raid0_on_unequal_devices_until_full() {
    if !require_root("raid0_on_unequal_devices_until_full") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let imgs = mkfs_multi(dir.path(), &[256, 256, 1024], &["-d raid0", "-m raid1"]);
    let devs = joined(&imgs);
    // The kernel fills a copy the same way: how many files fit is the oracle.
    let kimgs = copy_images(&imgs, "kernel");
    let kernel_fit: usize = {
        let k = KernelMount::try_new(&kimgs, "rw").unwrap_or_else(|e| panic!("{e}"));
        let n = sh(&format!(
            "cd {m} && mkdir in && n=0 && for i in $(seq 0 39); do \
               head -c 40M /dev/urandom > in/f$i && sync && n=$((n + 1)) || {{ rm -f in/f$i; break; }}; \
             done; echo $n",
            m = k.q()
        ));
        k.try_umount().expect("umount");
        n.trim().parse().expect("count")
    };
    for p in &kimgs {
        std::fs::remove_file(p).expect("rm");
    }
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("in")).expect("mkdir");
    bin().stdout(&["mkdir", &devs, "/in"]);
    let mut put = 0;
    let mut refused = None;
    for i in 0..40 {
        let f = src.join(format!("in/f{i}"));
        sh(&format!("head -c 40M /dev/urandom > {}", f.display()));
        let (ok, _, err) = bin().run(&["put", &devs, &f.display().to_string(), "/in/"]);
        if !ok {
            // Not in the image: not compared.
            std::fs::remove_file(&f).expect("rm");
            refused = Some(err);
            break;
        }
        put += 1;
    }
    let err = refused.expect("40 x 40 MiB fit on 1.5 GiB of devices");
    assert!(
        err.contains("No space left") || err.contains("space"),
        "the put that did not fit: {err}"
    );
    eprintln!("40 MiB files that fit: ubtrfs {put}, the kernel {kernel_fit}");
    assert!(
        put + 1 >= kernel_fit,
        "{put} files of 40 MiB fit, {kernel_fit} on the kernel"
    );
    checks_clean(&imgs, "ENOSPC");
    assert_profiles(
        &imgs,
        &[
            ("DATA", "RAID0"),
            ("METADATA", "RAID1"),
            ("SYSTEM", "RAID1"),
        ],
        "ENOSPC",
    );
    // Chunks on the big device alone were made once the small ones were full.
    let data = chunks_detail(&imgs);
    let widths: Vec<u64> = data
        .iter()
        .filter(|c| c.0 == "DATA|RAID0")
        .map(|c| c.1)
        .collect();
    assert!(
        widths.contains(&3) && widths.contains(&1),
        "RAID0 data chunks over three devices, then over the big one alone: {data:?}"
    );
    kernel_view(&imgs, &src.join("in"), "in");
}

/// Three devices, RAID10 data (the kernel stripes over an even number of them: two)
/// and RAID0 metadata, written through the read-write mount: new chunks of both,
/// the kernel shows what the mount showed.
#[test]
fn raid10_on_three_devices_through_the_mount() {
    if !require_root("raid10_on_three_devices_through_the_mount")
        || !require_fuse("raid10_on_three_devices_through_the_mount")
    {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let imgs = mkfs_multi(dir.path(), &[1024, 1024, 1024], &["-d raid10", "-m raid0"]);
    let made = data_chunks(&imgs).len();
    let kimgs = copy_images(&imgs, "kernel");
    let src = dir.path().join("src");
    make_source(&src, 8, 50);
    let workload = format!(
        "cp -a {}/. data && mkdir many && for i in $(seq 1 3000); do echo $i > many/f$i; done",
        src.display()
    );
    let m = FuseMount::start(&bin(), &imgs, &["rw"]);
    m.run(&workload, "copy");
    let mut seen = m.walk_and_unmount();
    seen.retain(|_, v| v["ino"] != 2);
    checks_clean(&imgs, "the mount's writes");
    let chunks = chunks_detail(&imgs);
    let ours = data_chunks(&imgs);
    assert!(ours.len() > made, "no new data chunk: {chunks:?}");
    // The kernel's chunks for the same workload on a copy are the oracle for ours.
    same_chunks_as_the_kernel(&ours, kimgs, &workload, "the mount's copy");
    assert_profiles(
        &imgs,
        &[
            ("DATA", "RAID10"),
            ("METADATA", "RAID0"),
            ("SYSTEM", "RAID0"),
        ],
        "the mount's writes",
    );
    for c in chunks.iter().filter(|c| c.0 == "DATA|RAID10") {
        assert_eq!((c.1, c.2), (2, 2), "a RAID10 chunk on three devices: {c:?}");
    }
    assert_eq!(
        kernel_view(&imgs, &src, "data"),
        seen,
        "the kernel shows what the mount showed"
    );
}

/// RAID5 on three devices and RAID6 on four (data and metadata), as mkfs.btrfs
/// makes them, after the kernel wrote some files: `ubtrfs put` past mkfs's chunks,
/// edits through the read-write mount (appending to a kernel-written file, new and
/// removed files) and a full balance, each writing new and existing full stripes,
/// whose parity (P, and Q for RAID6) ubtrfs works out again for every write. The
/// kernel's scrub, which checks every data checksum and every parity strip, finds
/// nothing; with any one device missing (RAID6: any two) the kernel's degraded
/// mount rebuilds every file from parity and shows exactly what the full mount shows.
#[test]
fn raid5_and_raid6_parity_as_the_kernel_checks_it() {
    if !require_root("raid5_and_raid6_parity_as_the_kernel_checks_it")
        || !require_fuse("raid5_and_raid6_parity_as_the_kernel_checks_it")
    {
        return;
    }
    let _s = serial();
    for (profile, ndev) in [("raid5", 3usize), ("raid6", 4)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let imgs = mkfs_multi(
            dir.path(),
            &vec![512; ndev],
            &[&format!("-d {profile}"), &format!("-m {profile}")],
        );
        let devs = joined(&imgs);
        let up = profile.to_uppercase();
        let want = [
            ("DATA", up.as_str()),
            ("METADATA", up.as_str()),
            ("SYSTEM", up.as_str()),
        ];
        {
            let k = KernelMount::try_new(&imgs, "rw").unwrap_or_else(|e| panic!("{e}"));
            sh(&format!(
                "cd {m} && head -c 300K /dev/urandom > klog && mkdir kdir && \
                 for i in $(seq 1 50); do head -c $((i * 500)) /dev/urandom > kdir/k$i; done",
                m = k.q()
            ));
            k.try_umount().expect("umount");
        }
        let made = chunks_detail(&imgs)
            .iter()
            .filter(|c| c.0.starts_with("DATA"))
            .count();
        let src = dir.path().join("src");
        make_source(&src, if profile == "raid6" { 9 } else { 6 }, 40);
        bin().stdout(&["put", &devs, &src.display().to_string(), "/"]);
        let m = FuseMount::start(&bin(), &imgs, &["rw"]);
        m.run(
            "head -c 100K /dev/urandom >> klog && rm kdir/k7 kdir/k9 && \
             for i in $(seq 1 300); do head -c $((i * 41)) /dev/urandom > kdir/u$i; done && \
             head -c 9M /dev/urandom > kdir/mid && sync -f .",
            "edits",
        );
        let mut seen = m.walk_and_unmount();
        seen.retain(|_, v| v["ino"] != 2);
        let what = format!("{profile}: put and the mount's edits");
        checks_clean(&imgs, &what);
        assert_profiles(&imgs, &want, &what);
        let data_now = chunks_detail(&imgs)
            .iter()
            .filter(|c| c.0.starts_with("DATA"))
            .count();
        assert!(data_now > made, "{what}: no new data chunk ({made} before)");
        let out = bin().stdout(&["balance", "start", "--full-balance", &devs]);
        assert!(
            out.starts_with("Done, had to relocate"),
            "{profile} balance: {out}"
        );
        let what = format!("{profile}: full balance");
        checks_clean(&imgs, &what);
        assert_profiles(&imgs, &want, &what);

        assert_eq!(
            kernel_view(&imgs, &src, "src"),
            seen,
            "{profile}: the kernel shows what the mount showed"
        );

        // fsync through the tree log, whose blocks (and the data) land in RAID5/6
        // rows too, then the server is killed before any commit: the kernel
        // replays the log.
        let logged = dir.path().join("logged");
        sh(&format!("head -c 3M /dev/urandom > {}", logged.display()));
        let mut m = FuseMount::start(&bin(), &imgs, &["rw"]);
        m.run(
            &format!(
                "dd if={} of=logged bs=64k conv=fsync status=none && \
                 head -c 5000 /dev/urandom > kdir/tail && cat kdir/tail >> klog && \
                 python3 -c 'import os; f = os.open(\"klog\", os.O_RDWR); os.fdatasync(f)'",
                logged.display()
            ),
            "fsyncs",
        );
        let klog = std::fs::read(m.mnt.join("klog")).expect("read klog");
        let _ = m.child.kill();
        let _ = m.child.wait();
        drop(m);
        let log_root = bin().stdout(&["inspect", "dump-super", &imgs[0].display().to_string()]);
        assert!(
            log_root.lines().any(|l| {
                let mut w = l.split_whitespace();
                w.next() == Some("log_root") && w.next().is_some_and(|v| v != "0")
            }),
            "{profile}: no tree log after SIGKILL (the fsyncs committed):\n{log_root}"
        );

        // The kernel replays it, and its scrub checks every checksum and every
        // parity strip.
        let k = KernelMount::try_new(&imgs, "rw").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            std::fs::read(k.path("logged")).expect("read"),
            std::fs::read(&logged).expect("read"),
            "{profile}: a file fsynced on the mount, after the kernel's log replay"
        );
        assert_eq!(
            std::fs::read(k.path("klog")).expect("read"),
            klog,
            "{profile}: a file fdatasynced after an append, after the kernel's log replay"
        );
        let scrub = sh(&format!("btrfs scrub start -B {} 2>&1 || true", k.q()));
        assert!(
            scrub.contains("no errors found"),
            "{profile}: the kernel's scrub of what ubtrfs wrote:\n{scrub}"
        );
        k.try_umount().expect("umount");
        checks_clean(&imgs, &format!("{profile}: the kernel's log replay"));
        let full = kernel_view(&imgs, &src, "src");

        // Degraded: every file rebuilt from parity.
        let nparity = if profile == "raid6" { 2 } else { 1 };
        let mut missing_sets: Vec<Vec<usize>> = (0..ndev).map(|i| vec![i]).collect();
        if nparity == 2 {
            for a in 0..ndev {
                for b in a + 1..ndev {
                    missing_sets.push(vec![a, b]);
                }
            }
        }
        for missing in missing_sets {
            let rest: Vec<PathBuf> = (0..ndev)
                .filter(|i| !missing.contains(i))
                .map(|i| imgs[i].clone())
                .collect();
            let k = KernelMount::try_new(&rest, "ro,degraded").unwrap_or_else(|e| panic!("{e}"));
            let mut t = walk_mounted(&k.mnt);
            t.retain(|_, v| v["ino"] != 2);
            k.try_umount().expect("umount");
            assert_eq!(
                t, full,
                "{profile}: the kernel's degraded mount without device(s) {missing:?}"
            );
        }
    }
}

/// `ubtrfs mkfs` on several devices, as mkfs.btrfs takes them, with `--rootdir`, for
/// every profile pair a user might ask: btrfs check is clean, the chunks have the
/// profiles asked for (system following metadata) on the devices asked for, the
/// kernel mounts it and shows the source tree byte for byte, its scrub finds nothing
/// (parity included), and after the kernel writes more, ubtrfs's check is clean.
#[test]
fn mkfs_on_several_devices() {
    if !require_root("mkfs_on_several_devices") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    make_source(&src, 2, 8);
    for (data, meta, ndev) in [
        ("raid1", "raid1", 2usize),
        ("raid0", "dup", 3),
        ("raid10", "raid1c3", 4),
        ("raid5", "raid6", 4),
        ("single", "raid1c4", 4),
    ] {
        let what = format!("mkfs -d {data} -m {meta} on {ndev} devices");
        let imgs: Vec<PathBuf> = (0..ndev)
            .map(|i| dir.path().join(format!("m{i}.img")))
            .collect();
        let mut args: Vec<String> = [
            "mkfs",
            "-f",
            "-b",
            "300M",
            "-d",
            data,
            "-m",
            meta,
            "--rootdir",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(src.display().to_string());
        args.extend(imgs.iter().map(|p| p.display().to_string()));
        let out = bin().output(&args);
        assert!(out.status.success(), "{what}: {out:?}");
        checks_clean(&imgs, &what);
        let up = |p: &str| {
            if p == "single" {
                "single".to_string()
            } else {
                p.to_uppercase()
            }
        };
        assert_profiles(
            &imgs,
            &[
                ("DATA", up(data).as_str()),
                ("METADATA", up(meta).as_str()),
                ("SYSTEM", up(meta).as_str()),
            ],
            &what,
        );
        let k = KernelMount::try_new(&imgs, "rw").unwrap_or_else(|e| panic!("{what}: {e}"));
        sh(&format!("diff -r {} {}", src.display(), k.q()));
        let scrub = sh(&format!("btrfs scrub start -B {} 2>&1 || true", k.q()));
        assert!(scrub.contains("no errors found"), "{what}: scrub:\n{scrub}");
        let shown = sh(&format!("btrfs filesystem show {}", k.q()));
        assert!(
            shown.contains(&format!("Total devices {ndev} ")),
            "{what}: {shown}"
        );
        sh(&format!(
            "cd {} && head -c 20M /dev/urandom > more && sync",
            k.q()
        ));
        k.try_umount().expect("umount");
        checks_clean(&imgs, &format!("{what}, then the kernel's writes"));
        for p in &imgs {
            std::fs::remove_file(p).expect("rm");
        }
    }
}

/// Overwrites 4 KiB of the first sector-aligned place in one of `imgs` (the last
/// first) where `needle` is found, with random bytes; returns (image index, offset,
/// the bytes that were there).
fn corrupt_where(imgs: &[PathBuf], needle: &[u8], skip: u64) -> (usize, u64, Vec<u8>) {
    for (i, p) in imgs.iter().enumerate().rev() {
        let data = std::fs::read(p).expect("read image");
        let Some(at) = data.windows(needle.len()).position(|w| w == needle) else {
            continue;
        };
        let off = (at as u64 + skip) / 4096 * 4096;
        let old = data[off as usize..off as usize + 4096].to_vec();
        sh(&format!(
            "head -c 4096 /dev/urandom | dd of={} bs=4096 seek={} conv=notrunc status=none",
            p.display(),
            off / 4096
        ));
        return (i, off, old);
    }
    panic!("{:?} is in no image", String::from_utf8_lossy(needle));
}

/// Overwrites the second 4 KiB of the last copy of the top-level subvolume's root
/// block (16 KiB nodes), found where btrfs-progs' btrfs-map-logical places it;
/// returns (image index, offset, the bytes that were there).
fn corrupt_fs_root_copy(imgs: &[PathBuf]) -> (usize, u64, Vec<u8>) {
    let dump = bin().stdout(&["inspect", "dump-tree", &joined(imgs), "-t", "5"]);
    let bytenr: u64 = dump
        .lines()
        .find_map(|l| l.strip_prefix("leaf ").or_else(|| l.strip_prefix("node ")))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no root block in {dump}"));
    let out = on_loops(
        imgs,
        &format!(
            "btrfs-map-logical -l {bytenr} -b 4096 $A 2>/dev/null | grep '^mirror' | tail -1 | \
             while read -r _ _ _ _ _ phys _ dev; do \
               for i in \"${{!L[@]}}\"; do if [ \"${{L[$i]}}\" = \"$dev\" ]; then echo $i $phys; fi; done; \
             done"
        ),
    );
    let mut w = out.split_whitespace();
    let (Some(i), Some(phys)) = (
        w.next().and_then(|n| n.parse::<usize>().ok()),
        w.next().and_then(|n| n.parse::<u64>().ok()),
    ) else {
        panic!("btrfs-map-logical of {bytenr}: {out:?}");
    };
    let off = phys + 4096;
    let old = bytes_at(&imgs[i], off);
    sh(&format!(
        "head -c 4096 /dev/urandom | dd of={} bs=4096 seek={} conv=notrunc status=none",
        imgs[i].display(),
        off / 4096
    ));
    (i, off, old)
}

fn bytes_at(p: &Path, off: u64) -> Vec<u8> {
    let data = std::fs::read(p).expect("read image");
    data[off as usize..off as usize + 4096].to_vec()
}

/// The "Error summary", "Corrected" and "Uncorrectable" lines of a scrub's summary.
fn scrub_lines(out: &str) -> Vec<String> {
    out.lines()
        .map(str::trim)
        .filter(|l| {
            l.starts_with("Error summary:")
                || l.starts_with("Corrected:")
                || l.starts_with("Uncorrectable:")
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// `ubtrfs scrub` against the kernel's on RAID1, RAID5 and RAID6 (kernel-made): a
/// data sector and a tree block copy damaged on one device are found; `-r` repairs
/// nothing and fails; a scrub rewrites them from the good copy (RAID1) or rebuilds
/// them from parity (RAID5/6): the device holds the original bytes again, btrfs
/// check and the kernel's scrub are clean. On RAID1 the kernel's scrub of a copy of
/// the damaged images counts the same errors (RAID5/6: the kernel repairs data
/// sectors while it rebuilds the stripe without counting them).
#[test]
fn scrub_repairs_from_copies_and_parity() {
    if !require_root("scrub_repairs_from_copies_and_parity") {
        return;
    }
    let _s = serial();
    for (profile, ndev) in [("raid1", 2usize), ("raid5", 3), ("raid6", 4)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let imgs = mkfs_multi(
            dir.path(),
            &vec![256; ndev],
            &[
                "-n 16384",
                &format!("-d {profile}"),
                &format!("-m {profile}"),
            ],
        );
        let devs = joined(&imgs);
        let mark = b"UBTRFS-SCRUB-MARK-".repeat(1 << 16);
        {
            let k = KernelMount::try_new(&imgs, "rw").unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(k.path("marker"), &mark[..1 << 20]).expect("write");
            sh(&format!(
                "cd {} && head -c 20M /dev/urandom > rand && touch scrub-tree-block-name-here",
                k.q()
            ));
            k.try_umount().expect("umount");
        }
        let (di, doff, dold) = corrupt_where(&imgs, &mark[..4096], 8191);
        let (ti, toff, told) = corrupt_fs_root_copy(&imgs);
        let what = format!("{profile}: scrub");
        if profile == "raid1" {
            let kimgs = copy_images(&imgs, "k");
            // Read-only on both sides: a read-write mount may CoW the damaged block
            // before its scrub looks at it.
            let k = KernelMount::try_new(&kimgs, "ro").unwrap_or_else(|e| panic!("{e}"));
            let kernel = sh(&format!("btrfs scrub start -B -r {} 2>&1 || true", k.q()));
            k.try_umount().expect("umount");
            for p in &kimgs {
                std::fs::remove_file(p).expect("rm");
            }
            let ours = bin().output(&[
                "scrub",
                "start",
                "-B",
                "-r",
                &joined(&copy_images(&imgs, "o")),
            ]);
            assert_eq!(
                scrub_lines(&String::from_utf8_lossy(&ours.stdout)),
                scrub_lines(&kernel),
                "{what}: ubtrfs {ours:?}, the kernel:\n{kernel}"
            );
        }
        let ro = bin().output(&["scrub", "start", "-B", "-r", &devs]);
        assert!(
            !ro.status.success(),
            "{what} -r left errors yet succeeded: {ro:?}"
        );
        let ro_text = String::from_utf8_lossy(&ro.stdout).into_owned();
        assert!(ro_text.contains("csum="), "{what} -r: {ro_text}");
        assert!(bytes_at(&imgs[di], doff) != dold, "{what} -r wrote");
        let out = bin().output(&["scrub", "start", "-B", &devs]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{what}: {out:?}");
        assert!(text.contains("Uncorrectable:  0"), "{what}: {text}");
        assert!(
            bytes_at(&imgs[di], doff) == dold,
            "{what}: the data sector is not restored"
        );
        assert!(
            bytes_at(&imgs[ti], toff) == told,
            "{what}: the tree block is not restored"
        );
        checks_clean(&imgs, &what);
        let k = KernelMount::try_new(&imgs, "rw").unwrap_or_else(|e| panic!("{e}"));
        let kernel = sh(&format!("btrfs scrub start -B {} 2>&1 || true", k.q()));
        assert!(
            kernel.contains("no errors found"),
            "{what}, then the kernel's:\n{kernel}"
        );
        assert!(
            std::fs::read(k.path("marker")).expect("read") == mark[..1 << 20],
            "{what}: the file differs"
        );
        k.try_umount().expect("umount");
        let again = bin().stdout(&["scrub", "start", "-B", &devs]);
        assert!(again.contains("no errors found"), "{what} again: {again}");
    }
}
