//! Quotas kept at every commit (issue 14), against the kernel:
//! - after every ubtrfs operation with quotas on (put, rm, truncate, snapshot of a
//!   subvolume and into itself, reflink copy across subvolumes, dedupe, subvolume
//!   create and delete with its drop, qgroup create/assign/remove/limit, quota
//!   enable after disable), every qgroup's referenced and exclusive bytes equal what
//!   the kernel's `btrfs quota rescan -w` computes on a copy of the image, and
//!   `btrfs check --readonly --qgroup-report` is clean with no INCONSISTENT flag;
//! - `ubtrfs qgroup show` prints what `btrfs qgroup show` prints on the kernel's mount
//!   of the same image (text with -pcre --raw and human sizes, and JSON);
//! - the kernel then writes to the image (its own accounting going on from ours) and
//!   the numbers stay equal to a rescan; a read-write ubtrfs mount keeps them too;
//! - a limit gives EDQUOT (Disk quota exceeded) to `ubtrfs put` and on the mount;
//! - numbers the kernel left inconsistent (`qgroup assign --no-rescan`) are recounted
//!   at ubtrfs's first commit.
//!
//! Needs root (loop devices, /dev/fuse); skipped with a line outside CI.

use std::path::Path;
use ubtrfs_sim::host::{btrfs_check, require_fuse, require_root, serial, sh, ubtrfs_check, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount};

fn bin() -> Ubtrfs {
    Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs")).with_limit(120)
}

fn ubtrfs(args: &[&str]) -> String {
    bin().stdout(args)
}

/// `btrfs qgroup show --raw -pc` after the kernel's own rescan of a copy of `img`.
fn kernel_rescan(img: &Path) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("copy.img");
    std::fs::copy(img, &copy).expect("copy image");
    let k = KernelMount::new(&copy, "rw");
    sh(&format!("btrfs quota rescan -w {} >/dev/null", k.q()));
    let out = sh(&format!("btrfs qgroup show --raw -pc {}", k.q()));
    k.umount();
    out
}

/// The numbers ubtrfs keeps equal a kernel rescan, and btrfs check agrees.
fn assert_exact(img: &Path, after: &str) {
    let p = img.display().to_string();
    let ours = ubtrfs(&["qgroup", "show", &p, "--raw", "-p", "-c"]);
    let theirs = kernel_rescan(img);
    assert_eq!(
        ours, theirs,
        "after {after}: ubtrfs's qgroup numbers (left) differ from a kernel rescan (right)"
    );
    let out = std::process::Command::new("btrfs")
        .args(["check", "--readonly", "--qgroup-report", &p])
        .output()
        .expect("btrfs check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success()
            && !text.contains("are different")
            && !text.to_lowercase().contains("inconsistent"),
        "after {after}: btrfs check --qgroup-report:\n{text}"
    );
    btrfs_check(img, None).unwrap_or_else(|e| panic!("after {after}: {e}"));
    ubtrfs_check(img).unwrap_or_else(|e| panic!("after {after}: {e}"));
    let status = ubtrfs(&["quota", "status", &p]);
    assert!(
        status.contains("Inconsistent:            no"),
        "after {after}: {status}"
    );
}

#[test]
fn qgroups_kept_exact_at_every_commit() {
    if !require_root("qgroups_kept_exact_at_every_commit") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("q.img");
    let p = img.display().to_string();
    let file = dir.path().join("file");
    std::fs::write(
        &file,
        (0..3_000_000u32)
            .map(|i| (i * 7 + i / 4093) as u8)
            .collect::<Vec<u8>>(),
    )
    .expect("write file");
    let f = file.display().to_string();
    mkfs_btrfs(&img, 512 << 20, &[]);
    {
        let k = KernelMount::new(&img, "rw");
        sh(&format!(
            "set -e; cd {m}
            head -c 2000000 /dev/urandom > top
            btrfs -q subvolume create sv
            mkdir -p sv/d; for i in $(seq 1 300); do echo $i > sv/d/f$i; done
            head -c 4000000 /dev/urandom > sv/big
            cp --reflink=always sv/big sv/big2
            btrfs -q subvolume snapshot sv snap
            echo changed >> snap/big2
            sync",
            m = k.q()
        ));
        k.umount();
    }
    // mkfs -O quota with --rootdir and a subvolume: counted at mkfs.
    {
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("sv/d")).expect("mkdir");
        std::fs::copy(&file, src.join("a")).expect("copy");
        std::fs::copy(&file, src.join("sv/d/b")).expect("copy");
        let mk = dir.path().join("mkfs.img");
        let (mks, srcs) = (mk.display().to_string(), src.display().to_string());
        ubtrfs(&[
            "mkfs", "-q", "--size", "256M", "-O", "quota", "-r", &srcs, "--subvol", "sv", &mks,
        ]);
        assert_exact(&mk, "mkfs -O quota --rootdir");
    }
    // Quotas enabled by ubtrfs on a kernel-made image.
    ubtrfs(&["quota", "enable", &p]);
    assert_exact(&img, "quota enable");
    let steps: Vec<(&str, Vec<&str>)> = vec![
        ("put", vec!["put", &p, &f, "/sv/new"]),
        (
            "rm of a file shared with a snapshot",
            vec!["rm", &p, "/sv/big"],
        ),
        (
            "truncate",
            vec!["truncate", &p, "/snap/big2", "-s", "100000"],
        ),
        (
            "snapshot",
            vec!["subvolume", "snapshot", &p, "/sv", "/snap2"],
        ),
        (
            "snapshot into itself",
            vec!["subvolume", "snapshot", &p, "/snap2", "/snap2/inner"],
        ),
        (
            "reflink across subvolumes",
            vec!["cp", &p, "/sv/new", "/snap2/new-copy", "--reflink=always"],
        ),
        ("rm in a snapshot", vec!["rm", &p, "/snap2/d/f7"]),
        ("dedupe", vec!["dedupe", &p, "-q"]),
        ("qgroup create", vec!["qgroup", "create", &p, "1/100"]),
        (
            "qgroup assign",
            vec!["qgroup", "assign", &p, "0/256", "1/100"],
        ),
        (
            "qgroup assign 2",
            vec!["qgroup", "assign", &p, "0/257", "1/100"],
        ),
        ("put under a level-1 qgroup", vec!["put", &p, &f, "/snap/x"]),
        (
            "snapshot of a subvolume in a level-1 qgroup",
            vec!["subvolume", "snapshot", &p, "/snap", "/snap3"],
        ),
        (
            "qgroup remove",
            vec!["qgroup", "remove", &p, "0/257", "1/100"],
        ),
        (
            "subvolume delete (dropped to the end)",
            vec!["subvolume", "delete", &p, "/snap2/inner", "/snap2"],
        ),
        (
            "subvolume create",
            vec!["subvolume", "create", &p, "/fresh"],
        ),
        ("put into it", vec!["put", &p, &f, "/fresh/f"]),
        ("quota rescan", vec!["quota", "rescan", &p]),
    ];
    for (what, args) in &steps {
        ubtrfs(args);
        assert_exact(&img, what);
    }
    ubtrfs(&["quota", "disable", &p]);
    assert!(ubtrfs(&["quota", "status", &p]).contains("Enabled:                 no"));
    ubtrfs(&["quota", "enable", &p]);
    assert_exact(&img, "quota enable after disable");

    // The table and JSON as btrfs-progs prints them on the kernel's mount.
    ubtrfs(&["qgroup", "create", &p, "2/7"]);
    ubtrfs(&["qgroup", "assign", &p, "0/256", "2/7"]);
    ubtrfs(&["qgroup", "limit", &p, "10M", "0/257"]);
    ubtrfs(&["qgroup", "limit", &p, "-e", "5G", "2/7"]);
    let k = KernelMount::new(&img, "ro");
    for args in [
        vec!["-pcre", "--raw"],
        vec!["-pcre"],
        vec![],
        vec!["-p"],
        vec!["--sort=-rfer", "--raw"],
    ] {
        let want = sh(&format!("btrfs qgroup show {} {}", args.join(" "), k.q()));
        let mut ua = vec!["qgroup", "show", &p];
        ua.extend(args.iter().copied());
        assert_eq!(ubtrfs(&ua), want, "qgroup show {args:?}");
    }
    let want = sh(&format!("btrfs --format json qgroup show -pcre {}", k.q()));
    let got = ubtrfs(&["qgroup", "show", &p, "--format", "json"]);
    let w: serde_json::Value = serde_json::from_str(&want).expect("progs json");
    let g: serde_json::Value = serde_json::from_str(&got).expect("our json");
    assert_eq!(g, w, "qgroup show --format json");
    k.umount();

    // The kernel goes on from our numbers, then ubtrfs from the kernel's.
    {
        let k = KernelMount::new(&img, "rw");
        sh(&format!(
            "set -e; cd {m}; rm -f sv/new; head -c 1000000 /dev/urandom > snap/k; btrfs -q subvolume snapshot snap ksnap; sync",
            m = k.q()
        ));
        k.umount();
    }
    assert_exact(&img, "the kernel's writes after ubtrfs's");
    ubtrfs(&["put", &p, &f, "/sv/after-kernel"]);
    assert_exact(&img, "ubtrfs after the kernel");
    // The kernel's snapshot inherited its source's limit (10M), as ubtrfs's do.
    let o = bin().output(&["put", &p, &f, "/ksnap/after-kernel"]);
    assert!(
        !o.status.success(),
        "a put past an inherited limit succeeded"
    );
    ubtrfs(&["subvolume", "snapshot", &p, "/snap", "/usnap"]);
    let o = bin().output(&["put", &p, &f, "/usnap/after-kernel"]);
    assert!(
        !o.status.success(),
        "a put past a limit inherited from ubtrfs's snapshot succeeded"
    );
    assert_exact(&img, "ubtrfs's snapshot of a subvolume with a limit");

    // Limits: EDQUOT.
    ubtrfs(&["qgroup", "limit", &p, "1M", "0/256"]);
    let o = bin().output(&["put", &p, &f, "/sv/too-big"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success() && err.contains("Disk quota exceeded"),
        "put past a limit: {} {err}",
        o.status
    );
    ubtrfs(&["qgroup", "limit", &p, "none", "0/256"]);
    assert_exact(&img, "a refused put");
}

#[test]
fn qgroups_kept_on_the_mount() {
    if !require_fuse("qgroups_kept_on_the_mount") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("m.img");
    mkfs_btrfs(&img, 512 << 20, &[]);
    // snap refers to sv/a's 3 MB from the start: its 6M limit leaves room for the
    // reflinked copy and new names but not for too-big (a qgroup past its limit
    // refuses even a new name, on the kernel as here).
    {
        let k = KernelMount::new(&img, "rw");
        sh(&format!(
            "set -e; cd {m}; btrfs quota enable .; btrfs -q subvolume create sv
            head -c 3000000 /dev/urandom > sv/a; btrfs -q subvolume snapshot sv snap
            btrfs quota rescan -w . >/dev/null; btrfs qgroup limit 6M 0/257 .
            btrfs qgroup create 1/100 .; btrfs qgroup assign --no-rescan 0/256 1/100 .
            btrfs quota status . 2>/dev/null | grep -q 'Inconsistent: *yes' || btrfs qgroup show . >/dev/null
            sync",
            m = k.q()
        ));
        k.umount();
    }
    let fm = FuseMount::start(&bin(), &[&img], &["rw"]);
    fm.run(
        "set -e
        head -c 1500000 /dev/urandom > sv/b
        cp --reflink=auto sv/b snap/b-copy
        rm sv/a
        mkdir sv/d; for i in $(seq 1 200); do echo $i > sv/d/f$i; done
        btrfs filesystem sync .
        ! head -c 3000000 /dev/urandom > snap/too-big 2>err
        grep -q 'Disk quota exceeded' err
        rm -f snap/too-big err",
        "a workload with quotas on the mount",
    );
    let mut fm = fm;
    fm.unmount();
    assert_exact(&img, "a ubtrfs mount's writes");
}

/// Runs `script` (bash, at the root) on a kernel btrfs loop mount and on a ubtrfs
/// mount of fresh twin images in `dir`; after each, the image's qgroup numbers must
/// equal a kernel rescan. Returns the two outputs, the kernel's first.
fn on_twin_mounts(dir: &Path, script: &str, what: &str) -> Vec<String> {
    let mut shown = Vec::new();
    for side in ["kernel", "ubtrfs"] {
        let img = dir.join(format!("{side}.img"));
        mkfs_btrfs(&img, 512 << 20, &[]);
        let out = if side == "kernel" {
            let k = KernelMount::new(&img, "rw");
            let o = sh(&format!("cd {} && {}", k.q(), script));
            k.umount();
            o
        } else {
            let mut fm = FuseMount::start(&bin(), &[&img], &["rw"]);
            let o = fm.run(script, &format!("{what} on the ubtrfs mount"));
            fm.unmount();
            o
        };
        assert_exact(&img, &format!("{what} on the {side} mount"));
        shown.push(out);
    }
    shown
}

/// `ubtrfs quota|qgroup ... MNT` on a ubtrfs mount send the btrfs quota ioctls (the
/// same commands on the kernel's mount of a twin image): quotas enabled, a level-1
/// qgroup with a member and a limit, EDQUOT past it, and `qgroup show MNT` (read
/// from the image after a commit) equal on both sides and to a kernel rescan.
#[test]
fn quota_commands_on_a_mount() {
    if !require_fuse("quota_commands_on_a_mount") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = |u: &str| {
        format!(
            "set -e
            {u} subvolume create . sv >/dev/null
            head -c 2000000 /dev/zero | tr '\\0' x > sv/a
            sync -f .
            {u} quota enable .
            {u} quota rescan . >/dev/null
            {u} qgroup create . 1/9
            {u} qgroup assign . 0/256 1/9
            {u} qgroup limit . 3M 1/9
            ! head -c 2000000 /dev/zero > sv/b 2>err
            grep -q 'Disk quota exceeded' err; rm -f err
            rm -f sv/b; sync sv
            {u} qgroup show . -pcre --raw"
        )
    };
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    let shown = on_twin_mounts(dir.path(), &script(u), "quota commands");
    // The limit's EDQUOT left a partial file on each side (up to the limit, as
    // sizes differ by where each stops); the shown tables hold the numbers.
    assert!(shown[1].contains("3145728"), "limit shown: {}", shown[1]);
    assert!(shown[0].contains("3145728"), "limit shown: {}", shown[0]);
}

/// A referenced limit reached on the mount behaves as on the kernel's mount of a twin
/// image: the write that crosses it is short and the next gets EDQUOT; then
/// preallocation, new names, xattrs, growing a file and overwriting are refused too
/// (the kernel charges a transaction's items to the qgroup), removing is allowed,
/// and once a file is removed a write fits again (the kernel commits and retries
/// when a reservation fails, so what was freed counts). Both outputs equal, and the
/// numbers equal a kernel rescan.
#[test]
fn quota_limit_reached_on_a_mount_as_on_the_kernel() {
    if !require_fuse("quota_limit_reached_on_a_mount_as_on_the_kernel") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    let script = format!(
        r#"set -u
        {u} subvolume create . sv >/dev/null
        {u} quota enable .
        {u} qgroup limit . 20M 0/256
        for i in $(seq 1 40); do
            dd if=/dev/urandom of=sv/f$i bs=1M count=1 conv=fsync status=none 2>/dev/null ||
                {{ echo "EDQUOT at file $i"; break; }}
        done
        size=$(stat -c %s sv/f20)
        [ "$size" -gt 0 ] && [ "$size" -lt 1048576 ] && echo "f20: a short write"
        t() {{ l=$1; shift; if "$@" >/dev/null 2>err; then echo "$l: ok"; else echo "$l: $(sed 's/.*: //' err | head -1)"; fi; }}
        t "fallocate 5M" fallocate -l 5M sv/fa
        t "fallocate 4K" fallocate -l 4K sv/fb
        t "touch" touch sv/new
        t "mkdir" mkdir sv/dnew
        t "setfattr" setfattr -n user.a -v 1 sv/f1
        t "truncate up" truncate -s 100M sv/f2
        t "overwrite 4K" dd if=/dev/zero of=sv/f1 bs=4K count=1 conv=notrunc,fsync status=none
        t "append 4K" dd if=/dev/zero of=sv/f2 bs=4K count=1 oflag=append conv=notrunc,fsync status=none
        t "chmod" chmod 600 sv/f3
        t "rm" rm sv/f4
        # The kernel may drop the removed inode only after a commit (a delayed iput,
        # which its cleaner thread runs once the commit ends); its qgroup retry
        # commits without running them, so the freed space may count only at the
        # commit after. syncfs commits the kernel's mount (and never reaches a FUSE
        # server: ubtrfs's write still relies on its own commit and retry).
        sync -f .; sleep 1; sync -f .
        t "write after rm" dd if=/dev/urandom of=sv/again bs=1M count=1 conv=fsync status=none
        rm -f err; sync sv
        "#
    );
    let shown = on_twin_mounts(dir.path(), &script, "a quota limit reached");
    assert!(
        shown[0].contains("EDQUOT at file 20") && shown[0].contains("write after rm: ok"),
        "the kernel's side: {}",
        shown[0]
    );
    assert_eq!(
        shown[1], shown[0],
        "ubtrfs (left) against the kernel (right)"
    );
}

/// `subvolume snapshot -i` and `subvolume create -i`: the new subvolume's qgroup
/// joins the given level-1 qgroup; the numbers ubtrfs keeps equal what the kernel
/// shows for the same commands on a twin image after its rescan, and btrfs check's
/// qgroup report is clean. Done three ways with ubtrfs: on the image, on a ubtrfs
/// mount (create, then QGROUP_ASSIGN of the id INO_LOOKUP gives), and on the
/// kernel's mount (QGROUP_INHERIT with the create).
#[test]
fn snapshot_and_create_inherit_qgroups() {
    if !require_fuse("snapshot_and_create_inherit_qgroups") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("q.img");
    let twin = dir.path().join("k.img");
    mkfs_btrfs(&img, 512 << 20, &[]);
    let k = KernelMount::new(&img, "rw");
    sh(&format!(
        "cd {m}; btrfs -q subvolume create src; head -c 5M /dev/urandom > src/a; \
         btrfs quota enable .; btrfs qgroup create 1/100 .; btrfs quota rescan -w . >/dev/null",
        m = k.q()
    ));
    k.umount();
    std::fs::copy(&img, &twin).expect("twin");
    let on_fuse = dir.path().join("fuse.img");
    let on_kernel = dir.path().join("kmnt.img");
    std::fs::copy(&img, &on_fuse).expect("copy");
    std::fs::copy(&img, &on_kernel).expect("copy");
    let p = img.display().to_string();
    ubtrfs(&["subvolume", "snapshot", &p, "/src", "/snap", "-i", "1/100"]);
    ubtrfs(&["subvolume", "create", &p, "/nsv", "-i", "1/100"]);
    let k = KernelMount::new(&twin, "rw");
    sh(&format!(
        "cd {m}; btrfs subvolume snapshot -i 1/100 src snap >/dev/null; \
         btrfs subvolume create -i 1/100 nsv >/dev/null; btrfs quota rescan -w . >/dev/null",
        m = k.q()
    ));
    let theirs = sh(&format!("btrfs qgroup show --raw -pc {}", k.q()));
    k.umount();
    let u = env!("CARGO_BIN_EXE_ubtrfs");
    let script = format!(
        "set -e; {u} subvolume snapshot . /src /snap -i 1/100 >/dev/null
        {u} subvolume create . /nsv -i 1/100 >/dev/null
        test \"$({u} inspect rootid nsv)\" -gt 256"
    );
    let mut fm = FuseMount::start(&bin(), &[&on_fuse], &["rw"]);
    fm.run(&script, "create and snapshot -i on a ubtrfs mount");
    fm.unmount();
    let k = KernelMount::new(&on_kernel, "rw");
    sh(&format!(
        "cd {m}; {script}; btrfs quota rescan -w . >/dev/null
        test \"$({u} inspect rootid snap)\" = \"$(btrfs inspect-internal rootid snap)\"",
        m = k.q()
    ));
    k.umount();
    for (what, image) in [
        ("on the image", &img),
        ("on a ubtrfs mount", &on_fuse),
        ("on the kernel's mount", &on_kernel),
    ] {
        let ours = ubtrfs(&[
            "qgroup",
            "show",
            &image.display().to_string(),
            "--raw",
            "-p",
            "-c",
        ]);
        assert_eq!(
            ours, theirs,
            "qgroups after -i {what} (ubtrfs left, kernel right)"
        );
        assert!(ours.contains("1/100"), "{ours}");
        assert_exact(image, &format!("snapshot -i and create -i {what}"));
    }
}
