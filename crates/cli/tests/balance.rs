//! `ubtrfs balance` (issue 14) against the kernel, on a kernel-made image with
//! 4 KiB nodes, 12 snapshots (shared subtrees, FULL_BACKREF blocks), reflinks
//! inside and across subvolumes, zstd-compressed and inline files, prealloc, a
//! nodatacow file, DUP metadata, and quotas with a level-1 qgroup. After every
//! balance (full, usage filter, limit, vrange, convert metadata to single and back
//! to dup, convert data to dup):
//! - `btrfs check --readonly --check-data-csum --qgroup-report` and ubtrfs's own
//!   check are clean, and every qgroup's numbers equal a kernel rescan of a copy;
//! - the kernel mounts the image and shows exactly what it showed before (every
//!   stat field, contents, xattrs), and `btrfs filesystem du` gives the same
//!   total, exclusive and shared bytes for every file (sharing kept);
//! - the chunks the filters select are gone (`dump-tree -t chunk`), converted
//!   chunks have the new profile;
//! - a balance paused after one chunk leaves the BALANCE item: the kernel shows it
//!   paused (`-o skip_balance`), finishes it when mounted without that, and
//!   `ubtrfs balance resume` finishes it too;
//! - the kernel then writes to the image and runs its own full balance: clean.
//!
//! Needs root (loop devices); skipped with a line outside CI.

use std::collections::BTreeMap;
use std::path::Path;
use ubtrfs_sim::golden::walk_mounted;
use ubtrfs_sim::host::{btrfs_check, require_root, serial, sh, Ubtrfs};
use ubtrfs_sim::mount::{kernel_writes, mkfs_btrfs, KernelMount};

fn bin() -> Ubtrfs {
    Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs")).with_limit(300)
}

/// What the kernel shows: the tree walk and `btrfs filesystem du --raw` of it.
fn kernel_view(img: &Path) -> (BTreeMap<String, serde_json::Value>, String) {
    let k = KernelMount::new(img, "ro");
    let mut tree = walk_mounted(&k.mnt);
    // A nested subvolume inside a snapshot shows as an empty directory (inode 2)
    // the kernel makes up at each mount, with the current time.
    tree.retain(|_, v| v["ino"] != 2);
    let du = sh(&format!(
        "cd {} && btrfs filesystem du --raw . | sort",
        k.q()
    ));
    k.umount();
    (tree, du)
}

/// The chunks: logical start, and "LENGTH TYPE" (a removed chunk's logical
/// address may be given to a new one, as the kernel does too).
fn chunks(img: &Path) -> Vec<(u64, String)> {
    let text = sh(&format!(
        "btrfs inspect-internal dump-tree -t chunk {}",
        img.display()
    ));
    let mut out = Vec::new();
    let mut cur: Option<u64> = None;
    for l in text.lines() {
        let l = l.trim();
        if let Some(rest) = l.split("CHUNK_ITEM ").nth(1) {
            cur = rest.split(')').next().and_then(|n| n.parse().ok());
        } else if let (Some(c), Some(t)) = (cur, l.strip_prefix("length ")) {
            // "length 8388608 owner 2 stripe_len 65536 type SYSTEM|DUP"
            let ty = t.split("type ").nth(1).unwrap_or("");
            let len = t.split_whitespace().next().unwrap_or("");
            out.push((c, format!("{len} {ty}")));
            cur = None;
        }
    }
    out
}

fn kernel_rescan(img: &Path) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("copy.img");
    std::fs::copy(img, &copy).expect("copy image");
    let k = KernelMount::new(&copy, "rw,skip_balance");
    sh(&format!("btrfs quota rescan -w {} >/dev/null", k.q()));
    let out = sh(&format!("btrfs qgroup show --raw -pc {}", k.q()));
    k.umount();
    out
}

fn assert_same(img: &Path, before: &(BTreeMap<String, serde_json::Value>, String), after: &str) {
    btrfs_check(img, None).unwrap_or_else(|e| panic!("after {after}: {e}"));
    let p = img.display().to_string();
    let out = std::process::Command::new("btrfs")
        .args(["check", "--readonly", "--qgroup-report", &p])
        .output()
        .expect("btrfs check");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !text.contains("are different"),
        "after {after}: btrfs check --qgroup-report:\n{text}"
    );
    let ours = bin().stdout(&["qgroup", "show", &p, "--raw", "-p", "-c"]);
    assert_eq!(
        ours,
        kernel_rescan(img),
        "after {after}: qgroups (left) vs a kernel rescan"
    );
    let now = kernel_view(img);
    let diff: Vec<&String> = before
        .0
        .iter()
        .filter(|(k, v)| now.0.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .chain(now.0.keys().filter(|k| !before.0.contains_key(*k)))
        .take(10)
        .collect();
    assert!(
        diff.is_empty(),
        "after {after}: the kernel shows other files: {diff:?}"
    );
    assert_eq!(
        before.1, now.1,
        "after {after}: btrfs filesystem du changed (sharing)"
    );
}

fn balance(img: &Path, args: &[&str]) -> String {
    let p = img.display().to_string();
    let mut a = vec!["balance", "start"];
    a.extend(args);
    a.push(&p);
    bin().stdout(&a)
}

#[test]
fn balance_like_the_kernel() {
    if !require_root("balance_like_the_kernel") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("bal.img");
    mkfs_btrfs(&img, 1 << 30, &["-n", "4096", "-m", "dup"]);
    let k = KernelMount::new(&img, "rw,compress=zstd");
    sh(&format!(
        "set -e; cd {m}; btrfs quota enable .; mkdir d; \
         for i in $(seq 1 400); do head -c $((i * 37 % 3000 + 10)) /dev/urandom > d/f$i; done; \
         head -c 6M /dev/urandom > big; cp --reflink=always big big.clone; \
         yes hello | head -c 4M > compressible; \
         touch nocow; chattr +C nocow; head -c 1M /dev/urandom > nocow; \
         fallocate -l 2M pre; dd if=/dev/urandom of=pre bs=4k count=8 conv=notrunc status=none; \
         btrfs subvolume create sv >/dev/null; cp --reflink=always big sv/big.ref; \
         setfattr -n user.k -v value d/f1; \
         for s in $(seq 1 12); do btrfs subvolume snapshot . snap$s >/dev/null; \
           for i in $(seq $s 13 400); do echo change$s >> d/f$i; done; \
           rm -f d/f$((s + 200)); done; \
         btrfs qgroup create 1/100 .; btrfs qgroup assign 0/256 1/100 . >/dev/null 2>&1 || true; \
         btrfs quota rescan -w . >/dev/null; sync",
        m = k.q()
    ));
    k.umount();
    let before = kernel_view(&img);
    let first = chunks(&img);
    assert!(first.len() >= 3, "{first:?}");

    // Full balance: every chunk moves.
    let out = balance(&img, &["--full-balance"]);
    let after = chunks(&img);
    assert!(
        out.starts_with(&format!(
            "Done, had to relocate {} out of {} chunks",
            first.len(),
            first.len()
        )),
        "{out}"
    );
    for (c, _) in &first {
        assert!(
            !after.iter().any(|(a, _)| a == c),
            "chunk {c} still there: {after:?}"
        );
    }
    assert_same(&img, &before, "balance --full-balance");

    // Filters.
    for args in [
        vec!["-dusage=90"],
        vec!["-mlimit=1"],
        vec!["-dvrange=0..18446744073709551615,limit=1"],
    ] {
        let pre = chunks(&img);
        let out = balance(&img, &args);
        assert!(out.starts_with("Done, had to relocate"), "{args:?}: {out}");
        let n: usize = out
            .split_whitespace()
            .nth(4)
            .and_then(|x| x.parse().ok())
            .expect("count");
        let post = chunks(&img);
        let gone = pre.iter().filter(|c| !post.contains(c)).count();
        assert_eq!(gone, n, "{args:?}: {out}\n{pre:?}\n{post:?}");
        assert_same(&img, &before, &format!("balance {args:?}"));
    }

    // Convert metadata (and system, as progs does) to single, then back to dup;
    // data to dup.
    let out = bin().output(&[
        "balance",
        "start",
        "-mconvert=single",
        img.to_str().expect("utf-8"),
    ]);
    assert!(
        !out.status.success(),
        "reducing metadata redundancy needs -f"
    );
    for (args, wants) in [
        (
            vec!["-f", "-mconvert=single"],
            ["METADATA|single", "SYSTEM|single"],
        ),
        (vec!["-mconvert=dup"], ["METADATA|DUP", "SYSTEM|DUP"]),
        (vec!["-dconvert=dup"], ["DATA|DUP", "SYSTEM|DUP"]),
    ] {
        balance(&img, &args);
        let c = chunks(&img);
        for want in wants {
            let ty = want.split('|').next().unwrap_or("");
            for (_, t) in c.iter() {
                let t = t.split(' ').nth(1).unwrap_or("");
                if t.starts_with(ty) {
                    assert_eq!(t, want, "{args:?}: {c:?}");
                }
            }
        }
        assert_same(&img, &before, &format!("balance {args:?}"));
    }

    // Paused after one chunk: the BALANCE item stays; the kernel shows it and
    // finishes it, and so does `ubtrfs balance resume`.
    let o = bin()
        .command()
        .env("UBTRFS_BALANCE_STOP_AFTER", "1")
        .args(["balance", "start", "-d", img.to_str().expect("utf-8")])
        .output()
        .expect("run ubtrfs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "balance paused by user\n"
    );
    let st = bin().stdout(&["balance", "status", img.to_str().expect("utf-8")]);
    assert!(st.contains("is paused"), "{st}");
    let kcopy = dir.path().join("kernel.img");
    std::fs::copy(&img, &kcopy).expect("copy");
    let k = KernelMount::new(&kcopy, "rw,skip_balance");
    let ks = sh(&format!("btrfs balance status {} || true", k.q()));
    assert!(ks.contains("is paused"), "kernel: {ks}");
    sh(&format!("btrfs balance resume {} >/dev/null", k.q()));
    let ks = sh(&format!("btrfs balance status {} || true", k.q()));
    assert!(ks.contains("No balance found"), "kernel after resume: {ks}");
    k.umount();
    btrfs_check(&kcopy, None).unwrap_or_else(|e| panic!("kernel resumed ours: {e}"));
    let out = bin().stdout(&["balance", "resume", img.to_str().expect("utf-8")]);
    assert!(out.starts_with("Done, had to relocate"), "{out}");
    let st = bin().stdout(&["balance", "status", img.to_str().expect("utf-8")]);
    assert!(st.contains("No balance found"), "{st}");
    assert_same(&img, &before, "balance resume");

    // The kernel goes on writing and balancing.
    kernel_writes(
        &img,
        "for i in $(seq 1 50); do echo more >> snap3/d/f$i; done; rm -rf snap5; \
         btrfs subvolume sync . >/dev/null; cp --reflink=always big big.again; \
         btrfs balance start --full-balance . >/dev/null",
        "kernel after ubtrfs balance",
    );
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after the kernel: {e}"));
}

/// `ubtrfs balance start|status|cancel MNT` on a read-write ubtrfs mount: the
/// balance runs in the mount's writer (BTRFS_IOC_BALANCE_V2 through FUSE), files
/// written before and after it read back, and the image is clean afterwards with
/// every selected chunk gone and the kernel showing what the mount showed.
#[test]
fn balance_on_a_mount() {
    if !require_root("balance_on_a_mount") || !ubtrfs_sim::host::require_fuse("balance_on_a_mount")
    {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("m.img");
    mkfs_btrfs(&img, 512 << 20, &["-n", "4096"]);
    kernel_writes(
        &img,
        "for i in $(seq 1 200); do head -c $((i * 97)) /dev/urandom > f$i; done; \
         btrfs subvolume snapshot . snap >/dev/null; head -c 3M /dev/urandom > big",
        "a few files and a snapshot",
    );
    let first = chunks(&img);
    let m = ubtrfs_sim::mount::FuseMount::start(&bin(), &[&img], &["rw", "ino=kernel"]);
    m.run(
        "head -c 2M /dev/urandom > before; cp --reflink=auto big big.copy",
        "writes",
    );
    let mnt = m.mnt.to_str().expect("utf-8").to_string();
    let out = bin().stdout(&["balance", "start", "--full-balance", &mnt]);
    assert_eq!(
        out,
        format!(
            "Done, had to relocate {n} out of {n} chunks\n",
            n = first.len()
        )
    );
    let st = bin().stdout(&["balance", "status", &mnt]);
    assert_eq!(st, format!("No balance found on '{mnt}'\n"));
    let o = bin().output(&["balance", "cancel", &mnt]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Not in progress"),
        "{o:?}"
    );
    m.run(
        "head -c 1M /dev/urandom > after; cmp big big.copy",
        "writes after",
    );
    let seen = m.walk_and_unmount();
    let after = chunks(&img);
    for c in &first {
        assert!(!after.contains(c), "chunk {c:?} still there: {after:?}");
    }
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after a balance on the mount: {e}"));
    ubtrfs_sim::mount::kernel_round_trip(&img, &seen, "balance on the mount");
}

/// A balance the kernel paused (`btrfs balance pause`, then unmount: the BALANCE
/// item stays) is finished by `ubtrfs balance resume`, with the kernel's resume
/// rules (chunks at least 90% full are left); the files are the same and btrfs
/// check is clean.
#[test]
fn kernel_paused_balance_resumed_by_ubtrfs() {
    if !require_root("kernel_paused_balance_resumed_by_ubtrfs") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("p.img");
    let p = img.to_str().expect("utf-8").to_string();
    let mut paused = false;
    for attempt in 0..5 {
        mkfs_btrfs(&img, 3 << 30, &[]);
        let k = KernelMount::new(&img, "rw");
        sh(&format!(
            "cd {m}; for i in $(seq 1 20); do head -c 60M /dev/urandom > f$i; done; sync; \
             rm f3 f6 f9; btrfs subvolume snapshot . s >/dev/null; sync",
            m = k.q()
        ));
        // Pause as soon as the balance runs; it stops after its current chunk.
        // Waiting for the `balance start` process itself (not only for the
        // status to leave "running") matters: until it exits it holds the
        // mountpoint open, and the unmount below fails with "target is busy".
        sh(&format!(
            "btrfs balance start -d {m} >/dev/null 2>&1 & b=$!; sleep 0.{d}; \
             btrfs balance pause {m} >/dev/null 2>&1 || true; wait $b || true",
            m = k.q(),
            d = attempt
        ));
        k.umount();
        let st = bin().stdout(&["balance", "status", &p]);
        if st.contains("is paused") {
            paused = true;
            break;
        }
    }
    assert!(paused, "the kernel never paused a balance in 5 tries");
    let before = kernel_view(&img);
    let out = bin().stdout(&["balance", "resume", &p]);
    assert!(out.starts_with("Done, had to relocate"), "{out}");
    let st = bin().stdout(&["balance", "status", &p]);
    assert!(st.contains("No balance found"), "{st}");
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after resuming the kernel's balance: {e}"));
    let after = kernel_view(&img);
    assert_eq!(
        before.0, after.0,
        "files after resuming the kernel's balance"
    );
    assert_eq!(
        before.1, after.1,
        "sharing after resuming the kernel's balance"
    );
}

/// Converting on two devices: data and metadata to RAID1 (every chunk then has a
/// stripe on each device), and back to single and DUP; btrfs check clean and the
/// kernel shows the same files after each, mounting both devices; after RAID1,
/// each device alone (the other wiped) still gives every file to a degraded mount.
#[test]
fn convert_raid1_on_two_devices() {
    if !require_root("convert_raid1_on_two_devices") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    mkfs_btrfs(&a, 1 << 30, &["-n", "4096", "-m", "dup", "-d", "single"]);
    std::fs::File::create(&b)
        .and_then(|f| f.set_len(1 << 30))
        .expect("second device");
    {
        let k = KernelMount::new(&a, "rw");
        sh(&format!(
            "cd {m}; for i in $(seq 1 100); do head -c $((i * 1000)) /dev/urandom > f$i; done; \
             btrfs subvolume snapshot . s >/dev/null; L=$(losetup -f --show {b}); \
             btrfs device add -f $L . >/dev/null; echo $L > {dir}/loop",
            m = k.q(),
            b = b.display(),
            dir = dir.path().display()
        ));
        k.umount();
        let l = std::fs::read_to_string(dir.path().join("loop")).expect("loop name");
        sh(&format!("losetup -d {}", l.trim()));
    }
    let both = format!("{},{}", a.display(), b.display());
    let view = |opts: &str, devs: &[&Path]| {
        let k = KernelMount::try_new(devs, opts).unwrap_or_else(|e| panic!("{e}"));
        let mut t = walk_mounted(&k.mnt);
        t.retain(|_, v| v["ino"] != 2);
        k.try_umount().expect("umount");
        t
    };
    let before = view("ro", &[&a, &b]);
    for (args, want) in [
        (vec!["-mconvert=raid1", "-dconvert=raid1"], "RAID1"),
        (
            vec!["-f", "-mconvert=dup", "-dconvert=single"],
            "single|DUP",
        ),
    ] {
        let mut full = vec!["balance", "start"];
        full.extend(args.iter().copied());
        full.push(&both);
        let out = bin().stdout(&full);
        assert!(out.starts_with("Done, had to relocate"), "{args:?}: {out}");
        for (_, t) in chunks(&a) {
            let p = t.rsplit('|').next().unwrap_or("");
            assert!(want.split('|').any(|w| w == p), "{args:?}: a {t} chunk");
        }
        // btrfs check finds the second device by scanning; ubtrfs is given both.
        sh(&format!(
            "A=$(losetup -f --show {a}); B=$(losetup -f --show {b}); trap 'losetup -d $A $B' EXIT; \
             btrfs device scan $A $B >/dev/null; \
             btrfs check --readonly --check-data-csum $A >/dev/null 2>&1 \
             || {{ btrfs check --readonly --check-data-csum $A; exit 1; }}",
            a = a.display(),
            b = b.display()
        ));
        let c = bin().output(&["check", "--check-data-csum", &both]);
        assert!(c.status.success(), "ubtrfs check after {args:?}: {c:?}");
        assert_eq!(view("ro", &[&a, &b]), before, "files after {args:?}");
        if want == "RAID1" {
            // Each device alone holds everything.
            for (keep, wipe) in [(&a, &b), (&b, &a)] {
                let copy = dir.path().join("alone.img");
                std::fs::copy(keep, &copy).expect("copy");
                let _ = wipe;
                ubtrfs_sim::host::forget_devices(None);
                assert_eq!(
                    view("ro,degraded", &[&copy]),
                    before,
                    "degraded mount of one RAID1 device"
                );
                std::fs::remove_file(&copy).expect("rm");
            }
        }
    }
}

/// A kernel balance cut short mid-chunk: relocation trees in the root tree, in the
/// relocation stage (refs 0) or merging (refs 1). The images come from the
/// kernel's own `balance start -m` on a loop device whose backing file lives on a
/// btrfs scratch filesystem, reflink-copied while the balance runs (each copy
/// holds exactly the writes completed by then: a power cut's image). For each such
/// image (up to 3): `ubtrfs balance resume` drops the relocation trees, resumes
/// the balance and finishes it, btrfs check and ubtrfs check are clean and the
/// kernel shows the files it showed before the balance; and the kernel's own
/// recovery of one of them is clean too.
#[test]
fn kernel_interrupted_relocation_recovered() {
    if !require_root("kernel_interrupted_relocation_recovered") {
        return;
    }
    let _s = serial();
    let scratch = ubtrfs_sim::mount::ScratchBtrfs::new();
    let host = scratch.path();
    let base = host.join("base.img");
    mkfs_btrfs(&base, 1 << 30, &["-n", "4096"]);
    kernel_writes(
        &base,
        "btrfs -q subvolume create src; \
         python3 -c 'import os,random; r=random.Random(7); \
           [os.mkdir(\"src/d%d\" % d) for d in range(40)]; \
           [open(\"src/d%d/f%d\" % (d, f), \"wb\").write(r.randbytes(r.randint(100, 3000))) \
            for d in range(40) for f in range(200)]'; \
         sync; for i in $(seq 1 12); do btrfs -q subvolume snapshot src snap$i; \
           for j in 1 2 3; do echo $i$j >> snap$i/d$((i * 3 + j))/f$j; done; done",
        "8,000 files and 12 snapshots",
    );
    let before = kernel_view(&base);
    let mut cuts: Vec<(std::path::PathBuf, String)> = Vec::new();
    for _attempt in 0..3 {
        sh(&format!(
            "cd {h}; rm -f cut*.img done; cp --reflink=always base.img live.img; \
             L=$(losetup -f --show live.img); M=$(mktemp -d); mount $L $M; \
             trap 'umount $M 2>/dev/null; losetup -d $L 2>/dev/null; rmdir $M' EXIT; \
             ( btrfs balance start -m $M >/dev/null 2>&1; touch done ) & \
             i=0; while [ ! -e done ] && [ $i -lt 400 ]; do i=$((i+1)); \
               cp --reflink=always live.img cut$i.img; sleep 0.01; done; wait",
            h = host.display()
        ));
        for e in std::fs::read_dir(&host).expect("scratch dir") {
            let p = e.expect("entry").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.starts_with("cut") {
                continue;
            }
            let roots = sh(&format!(
                "btrfs inspect-internal dump-tree -t root {} 2>/dev/null | grep -A4 'key (TREE_RELOC ROOT_ITEM' | grep -o 'refs [0-9]*' | sort -u | tr '\\n' ' '",
                p.display()
            ));
            if !roots.trim().is_empty() && !cuts.iter().any(|(_, r)| *r == roots) {
                let keep = host.join(format!("reloc{}.img", cuts.len()));
                std::fs::rename(&p, &keep).expect("keep a cut");
                cuts.push((keep, roots));
            }
        }
        if cuts.iter().any(|(_, r)| r.contains("refs 1")) || cuts.len() >= 3 {
            break;
        }
    }
    eprintln!(
        "cuts with relocation trees: {:?}",
        cuts.iter().map(|c| &c.1).collect::<Vec<_>>()
    );
    assert!(
        !cuts.is_empty(),
        "no cut caught the kernel's relocation trees"
    );
    for (i, (img, roots)) in cuts.iter().enumerate() {
        let what = format!("cut with relocation trees ({roots})");
        if i == 0 {
            // The kernel's own recovery of the same state, on a copy.
            let k = host.join("kernel.img");
            std::fs::copy(img, &k).expect("copy");
            let m = KernelMount::new(&k, "rw");
            sh(&format!(
                "for i in $(seq 1 300); do btrfs balance status {m} | grep -q running || break; sleep 0.1; done",
                m = m.q()
            ));
            m.umount();
            btrfs_check(&k, None).unwrap_or_else(|e| panic!("{what}: the kernel's recovery: {e}"));
            std::fs::remove_file(&k).expect("rm");
        }
        let p = img.to_str().expect("utf-8");
        let out = bin().stdout(&["balance", "resume", p]);
        assert!(out.starts_with("Done, had to relocate"), "{what}: {out}");
        let roots_left = sh(&format!(
            "btrfs inspect-internal dump-tree -t root {p} | grep -c 'TREE_RELOC\\|BALANCE' || true"
        ));
        assert_eq!(
            roots_left.trim(),
            "0",
            "{what}: relocation trees or BALANCE left"
        );
        btrfs_check(img, None).unwrap_or_else(|e| panic!("{what}: {e}"));
        let after = kernel_view(img);
        assert_eq!(before.0, after.0, "{what}: files");
        assert_eq!(before.1, after.1, "{what}: sharing");
        std::fs::remove_file(img).expect("rm");
    }
}

/// Waits (up to 60 s) until `balance status MNT` says a balance is running; its
/// output then.
fn wait_running(mnt: &str) -> String {
    for _ in 0..600 {
        let st = bin().stdout(&["balance", "status", mnt]);
        if st.contains("is running") {
            return st;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("no balance ever ran on {mnt}");
}

/// A balance on a ubtrfs mount is driven a chunk at a time with the writer free in
/// between: while it runs, `balance status` shows its counters as btrfs-progs
/// prints them and files are written; `balance pause` stops it before its next
/// chunk ("balance paused by user", the BALANCE item kept, status "paused"),
/// `balance resume` finishes it; a second balance is stopped by `balance cancel`
/// ("balance canceled by user", no balance left). The image is then clean in
/// btrfs check and the kernel shows what the mount showed. (The server waits
/// UBTRFS_BALANCE_STEP_DELAY_MS before each chunk, so the test can act while
/// the balance runs.)
#[test]
fn pause_resume_and_cancel_on_a_mount() {
    if !ubtrfs_sim::host::require_fuse("pause_resume_and_cancel_on_a_mount") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("p.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    kernel_writes(
        &img,
        "for i in $(seq 1 5); do head -c 60M /dev/urandom > f$i; done; sync; rm f2 f4",
        "files across several data chunks",
    );
    let m = ubtrfs_sim::mount::FuseMount::start_env(
        &bin(),
        &[&img],
        &["rw"],
        &[("UBTRFS_BALANCE_STEP_DELAY_MS", "700")],
    );
    let mnt = m.mnt.to_str().expect("utf-8").to_string();
    let start = |args: &[&str]| {
        bin()
            .command()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ubtrfs balance")
    };
    let running = start(&["balance", "start", "-d", &mnt]);
    let st = wait_running(&mnt);
    assert!(
        st.lines()
            .nth(1)
            .is_some_and(|l| l.contains(" out of about ")
                && l.contains(" chunks balanced (")
                && l.ends_with("% left")),
        "{st}"
    );
    // The writer is free between chunks: files are written meanwhile.
    m.run(
        "head -c 3M /dev/urandom > during; sync during; cmp during during",
        "a write while the balance runs",
    );
    assert!(
        bin()
            .stdout(&["balance", "status", &mnt])
            .contains("is running"),
        "the balance ended before the write did: make the delay longer"
    );
    bin().stdout(&["balance", "pause", &mnt]);
    let o = running.wait_with_output().expect("balance start");
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "balance paused by user\n"
    );
    let st = bin().stdout(&["balance", "status", &mnt]);
    assert!(
        st.starts_with(&format!("Balance on '{mnt}' is paused")),
        "{st}"
    );
    let out = bin().stdout(&["balance", "resume", &mnt]);
    assert!(out.starts_with("Done, had to relocate "), "{out}");
    assert_eq!(
        bin().stdout(&["balance", "status", &mnt]),
        format!("No balance found on '{mnt}'\n")
    );
    // Cancel a running one.
    let running = start(&["balance", "start", "-d", &mnt]);
    wait_running(&mnt);
    bin().stdout(&["balance", "cancel", &mnt]);
    let o = running.wait_with_output().expect("balance start");
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "balance canceled by user\n"
    );
    assert_eq!(
        bin().stdout(&["balance", "status", &mnt]),
        format!("No balance found on '{mnt}'\n")
    );
    let o = bin().output(&["balance", "pause", &mnt]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Not running"),
        "{o:?}"
    );
    let seen = m.walk_and_unmount();
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after pause, resume and cancel: {e}"));
    ubtrfs_sim::mount::kernel_round_trip(
        &img,
        &seen,
        "balance paused, resumed and cancelled on the mount",
    );
}

/// Ctrl-C (SIGINT) during an offline `balance start` pauses it before the next
/// chunk: "balance paused by user", exit 0, the BALANCE item kept (status
/// "paused"), and `balance resume` finishes it; btrfs check is clean after each.
#[test]
fn interrupted_offline_balance_pauses() {
    if !require_root("interrupted_offline_balance_pauses") {
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("i.img");
    let p = img.to_str().expect("utf-8").to_string();
    mkfs_btrfs(&img, 1 << 30, &[]);
    kernel_writes(
        &img,
        "for i in $(seq 1 5); do head -c 60M /dev/urandom > f$i; done; sync; rm f2 f4",
        "files across several data chunks",
    );
    let child = bin()
        .command()
        .env("UBTRFS_BALANCE_STEP_DELAY_MS", "1500")
        .args(["balance", "start", "-d", &p])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ubtrfs balance");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    sh(&format!("kill -INT {}", child.id()));
    let o = child.wait_with_output().expect("balance start");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{o:?}");
    assert!(err.ends_with("balance paused by user\n"), "{err}");
    let st = bin().stdout(&["balance", "status", &p]);
    assert!(st.contains("is paused"), "{st}");
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after the interrupted balance: {e}"));
    let out = bin().stdout(&["balance", "resume", &p]);
    assert!(out.starts_with("Done, had to relocate "), "{out}");
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("after the resume: {e}"));
}
