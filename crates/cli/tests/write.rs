//! The write path (`ubtrfs mkfs -r`, `put`, `mkdir`, `rm`, `mv`, `ln`, `setfattr`,
//! `truncate`) against the kernel as oracle: every image ubtrfs writes must pass
//! `btrfs check --readonly --check-data-csum`, mount in the kernel and show exactly
//! what was written; images the kernel wrote (snapshots, reflinks) must stay clean
//! while ubtrfs edits them, and ubtrfs must read what the kernel wrote afterwards.
//!
//! Needs root (loop devices, mount, mknod, chown); without root the tests are skipped
//! with a line on stderr, except in CI, where that fails them
//! (`ubtrfs_sim::host::require_root`). Every kernel mount and loop device is undone
//! by a Drop guard (`ubtrfs_sim::mount::KernelMount`), also when an assertion fails. Every ubtrfs command runs under a
//! time limit, so an engine hang is a failure and not a stuck test run.
//!
//! Tests: mkfs_matrix (mkfs -r over node sizes, checksums, profiles, features; kernel
//! compare, kernel writes, ubtrfs edits, extract compare), edit_kernel_image_with_
//! snapshots_and_reflinks (every edit command on a kernel image sharing blocks with a
//! snapshot, btrfs check after each, host mirror compare), many_files_one_directory,
//! enospc_then_delete, refuse_mounted_image, edit_image_with_quotas.
//!
//! Run: cargo test -p ubtrfs-cli --test write -- --test-threads=1 --nocapture

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Output;
use ubtrfs_sim::golden::{file_type_name, hex, sha256_file};
use ubtrfs_sim::host::{
    btrfs_check, head, output_text as text, panic_message, require_root, serial, sh, shell_quote,
    show_args, Ubtrfs,
};
use ubtrfs_sim::mount::{mkfs_btrfs, KernelMount};

/// Seconds one ubtrfs command may take before it counts as hung (the big mkfs of
/// many_files_one_directory sets a longer limit for itself).
static CMD_LIMIT_SECS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(60);

fn limit() -> u32 {
    CMD_LIMIT_SECS.load(std::sync::atomic::Ordering::Relaxed)
}

fn set_limit(secs: u32) {
    CMD_LIMIT_SECS.store(secs, std::sync::atomic::Ordering::Relaxed)
}

fn tmpdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ubtrfs-write-{tag}."))
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// The ubtrfs binary under the current time limit.
fn bin() -> Ubtrfs {
    Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs")).with_limit(limit())
}

/// The ubtrfs binary with ARGS, under a time limit (exit 124 when it ran out).
fn ubtrfs_raw<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    bin().output(args)
}

/// The ubtrfs binary with ARGS, which must succeed; its stdout.
fn ubtrfs<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    bin().stdout(args)
}

/// `btrfs check --readonly --check-data-csum` must exit 0 and say "no error found".
fn check(img: &Path, after: &str) {
    match btrfs_check(img, None) {
        Ok(t) if t.contains("no error found") => {}
        Ok(t) | Err(t) => panic!(
            "btrfs check --readonly --check-data-csum {} after {after}:\n{}",
            img.display(),
            head(&t, 120)
        ),
    }
}

type Entry = BTreeMap<&'static str, String>;
type Tree = BTreeMap<String, Entry>;

#[derive(Clone, Copy)]
struct WalkOpts {
    /// Compare mtimes (to the nanosecond).
    mtime: bool,
}

/// Everything comparable between two file systems under ROOT, keyed by path ("/" is
/// ROOT). Directory nlink and size are not comparable (btrfs counts differently
/// from the host file system), and atime/ctime/ino are not either. Paths in SKIP
/// (relative, like "/snap") are left out with everything under them.
fn walk(root: &Path, o: WalkOpts, skip: &[&str]) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![("/".to_string(), root.to_path_buf())];
    while let Some((path, host)) = stack.pop() {
        if skip.contains(&path.as_str()) {
            continue;
        }
        let md = fs::symlink_metadata(&host).unwrap_or_else(|e| panic!("lstat {path}: {e}"));
        let ty = file_type_name(md.file_type());
        let mut e = Entry::new();
        e.insert("type", ty.into());
        e.insert("mode", format!("{:o}", md.mode()));
        e.insert("uid", md.uid().to_string());
        e.insert("gid", md.gid().to_string());
        // Inode 2 is the kernel's placeholder for a subvolume inside a snapshot:
        // its times are made up at each mount.
        let placeholder = ty == "dir" && md.ino() == 2;
        if o.mtime && !placeholder {
            e.insert("mtime", format!("{}.{:09}", md.mtime(), md.mtime_nsec()));
        }
        if ty != "dir" {
            e.insert("size", md.size().to_string());
            e.insert("nlink", md.nlink().to_string());
        }
        if ty == "chr" || ty == "blk" {
            e.insert("rdev", format!("{:x}", md.rdev()));
        }
        let mut x = Vec::new();
        for n in xattr::list(&host).unwrap_or_else(|err| panic!("listxattr {path}: {err}")) {
            // A listed name that cannot be read is a finding, not a test crash.
            let v = match xattr::get(&host, &n) {
                Ok(v) => hex(&v.unwrap_or_default()),
                Err(err) => format!("<getxattr error: {err}>"),
            };
            x.push(format!("{}={v}", n.to_string_lossy()));
        }
        x.sort();
        e.insert("xattrs", x.join(","));
        match ty {
            "symlink" => {
                let t = fs::read_link(&host).unwrap_or_else(|err| panic!("readlink {path}: {err}"));
                e.insert("target", t.to_string_lossy().into_owned());
            }
            "file" => {
                e.insert("sha256", sha256_file(&host));
            }
            "dir" => {
                for d in fs::read_dir(&host).unwrap_or_else(|err| panic!("readdir {path}: {err}")) {
                    let d = d.unwrap_or_else(|err| panic!("readdir {path}: {err}"));
                    let name = d.file_name().to_string_lossy().into_owned();
                    let child = if path == "/" {
                        format!("/{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    stack.push((child, d.path()));
                }
            }
            _ => {}
        }
        out.insert(path, e);
    }
    out
}

/// Differences between two walks, one line each.
fn diff(a_name: &str, a: &Tree, b_name: &str, b: &Tree) -> Vec<String> {
    let mut d = Vec::new();
    for (p, ea) in a {
        match b.get(p) {
            None => d.push(format!("{p}: in {a_name}, missing in {b_name}")),
            Some(eb) => {
                for (k, va) in ea {
                    let vb = eb.get(k).map(String::as_str).unwrap_or("<none>");
                    if va != vb {
                        let (sa, sb) = if va.len() > 80 || vb.len() > 80 {
                            (
                                format!("{}..({} chars)", &va[..va.len().min(64)], va.len()),
                                format!("{}..({} chars)", &vb[..vb.len().min(64)], vb.len()),
                            )
                        } else {
                            (va.clone(), vb.to_string())
                        };
                        d.push(format!("{p}: {k}: {a_name} {sa} != {b_name} {sb}"));
                    }
                }
            }
        }
    }
    for p in b.keys() {
        if !a.contains_key(p) {
            d.push(format!("{p}: in {b_name}, missing in {a_name}"));
        }
    }
    d
}

fn assert_same(what: &str, a_name: &str, a: &Tree, b_name: &str, b: &Tree) {
    let d = diff(a_name, a, b_name, b);
    assert!(
        d.is_empty(),
        "{what}: {} differences ({} vs {} entries):\n{}",
        d.len(),
        a.len(),
        b.len(),
        d.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// `du -ab --apparent-size -l` per non-directory path (directory sizes differ
/// between btrfs and the host file system by design).
fn du_files(root: &Path, tree: &Tree) -> BTreeMap<String, u64> {
    let out = sh(&format!(
        "cd {} && du -ab --apparent-size -l .",
        shell_quote(root)
    ));
    let mut m = BTreeMap::new();
    for l in out.lines() {
        let (n, p) = l.split_once('\t').expect("du line");
        let p = p.strip_prefix('.').unwrap_or(p);
        let p = if p.is_empty() { "/" } else { p };
        if tree.get(p).is_some_and(|e| e["type"] != "dir") {
            m.insert(p.to_string(), n.parse().expect("du size"));
        }
    }
    m
}

/// Deterministic pseudo-random bytes (xorshift), so sizes and contents repeat.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

fn write_file(p: &Path, data: &[u8]) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).expect("mkdir -p");
    }
    let mut f = fs::File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data).expect("write");
}

// ---------------------------------------------------------------------------------
// 1. mkfs matrix

/// The source tree for mkfs -r: every kind of inode, size class and attribute the
/// kernel can hold that the host file system can give us.
fn make_src_tree(src: &Path) {
    fs::create_dir_all(src).expect("mkdir src");
    let long_name: String = "L".repeat(255);
    let long_target: String = "t/".repeat(500) + "end";
    let big_xattr: String = "x".repeat(3000);
    sh(&format!(
        r#"set -e
        cd {src}
        mkdir -p dir/sub/deeper empty_dir 'ünïcødé-日本語' setgid_dir
        : > zero
        for n in 1 2048 2049 4096 5000 1048579 3145728; do head -c $n /dev/urandom > f_$n; done
        printf 'line\n' > 'ünïcødé-日本語/файл с пробелом.txt'
        head -c 700 /dev/urandom > '{long_name}'
        # sparse: data at 0 and at 8 MiB, ending in data
        head -c 4096 /dev/urandom > sparse
        head -c 5000 /dev/urandom | dd of=sparse bs=1M seek=8 conv=notrunc status=none
        # sparse: small data at 0 and at 8 MiB, then a hole to 9 MiB
        head -c 100 /dev/urandom > sparse_tail
        head -c 100 /dev/urandom | dd of=sparse_tail bs=1M seek=8 conv=notrunc status=none
        truncate -s 9M sparse_tail
        # all hole
        truncate -s 5M holes_only
        # three names of one inode
        head -c 3000 /dev/urandom > dir/linked
        ln dir/linked dir/sub/link2
        ln dir/linked link3
        ln -s dir/linked symlink
        ln -s /nonexistent/target dangling
        ln -s '{long_target}' longlink
        mkfifo fifo
        mknod chardev c 1 7
        mknod blockdev b 7 200
        setfattr -n user.small -v hello f_1
        setfattr -n user.big -v '{big_xattr}' f_5000
        setfattr -n user.empty f_2048
        setfattr -n user.dir -v dirval dir/sub
        setfattr -n trusted.onlink -v lnk -h symlink
        setfattr -n user.a -v 1 zero
        setfattr -n user.b -v 2 zero
        chmod 4755 f_2048
        chmod 1777 dir/sub
        chmod 2750 setgid_dir
        chmod 0 f_4096
        chmod 640 f_1
        chown 1234:1234 f_5000 dir/sub 'ünïcødé-日本語'
        chown -h 1234:1234 symlink
        touch -d '2001-02-03 04:05:06.123456789' f_1 zero
        touch -d '1960-01-01 00:00:00.5' f_2049
        touch -d '2200-12-31 23:59:59.999999999' f_4096
        touch -h -d '2010-10-10 10:10:10.101010101' symlink dangling
        touch -d '2011-11-11 11:11:11.111111111' fifo chardev sparse
        touch -d '2012-01-01 00:00:00.000000001' dir/sub/deeper
        touch -d '2012-01-02 00:00:00.2' dir/sub
        touch -d '2012-01-03 00:00:00.3' dir empty_dir 'ünïcødé-日本語' setgid_dir
        touch -d '2012-01-04 00:00:00.4' .
        "#,
        src = shell_quote(src)
    ));
}

struct Combo {
    nodesize: u32,
    csum: &'static str,
    metadata: &'static str,
    data: &'static str,
    features: &'static str,
}

/// Together these cover every node size, checksum, profile and feature switch.
const COMBOS: &[Combo] = &[
    Combo {
        nodesize: 4096,
        csum: "crc32c",
        metadata: "dup",
        data: "single",
        features: "",
    },
    Combo {
        nodesize: 16384,
        csum: "xxhash",
        metadata: "single",
        data: "dup",
        features: "",
    },
    Combo {
        nodesize: 65536,
        csum: "sha256",
        metadata: "dup",
        data: "dup",
        features: "",
    },
    Combo {
        nodesize: 16384,
        csum: "blake2",
        metadata: "dup",
        data: "single",
        features: "block-group-tree",
    },
    Combo {
        nodesize: 4096,
        csum: "sha256",
        metadata: "single",
        data: "single",
        features: "^no-holes",
    },
    Combo {
        nodesize: 65536,
        csum: "crc32c",
        metadata: "single",
        data: "single",
        features: "block-group-tree",
    },
    Combo {
        nodesize: 4096,
        csum: "blake2",
        metadata: "dup",
        data: "dup",
        features: "block-group-tree",
    },
    Combo {
        nodesize: 65536,
        csum: "xxhash",
        metadata: "dup",
        data: "single",
        features: "^no-holes",
    },
    Combo {
        nodesize: 16384,
        csum: "crc32c",
        metadata: "dup",
        data: "single",
        features: "",
    },
];

fn mkfs_combo(
    i: usize,
    c: &Combo,
    src: &Path,
    want: &Tree,
    want_du: &BTreeMap<String, u64>,
    work: &Path,
) {
    let img = work.join(format!("m{i}.img"));
    let label = format!("wtest{i}");
    let uuid = format!("5eed{i:04x}-1234-4abc-8def-0123456789ab");
    let mut args: Vec<String> = vec![
        "mkfs".into(),
        "-q".into(),
        "--size".into(),
        "512M".into(),
        "-n".into(),
        c.nodesize.to_string(),
        "--csum".into(),
        c.csum.into(),
        "-m".into(),
        c.metadata.into(),
        "-d".into(),
        c.data.into(),
        "-L".into(),
        label.clone(),
        "-U".into(),
        uuid.clone(),
        "-r".into(),
        src.display().to_string(),
    ];
    if !c.features.is_empty() {
        args.push("-O".into());
        args.push(c.features.into());
    }
    args.push(img.display().to_string());
    ubtrfs(&args);
    check(&img, &show_args(&args));

    let sup = sh(&format!(
        "btrfs inspect-internal dump-super {}",
        shell_quote(&img)
    ));
    for want_line in [
        format!("nodesize\t\t{}", c.nodesize),
        format!("label\t\t\t{label}"),
        format!("fsid\t\t\t{uuid}"),
    ] {
        assert!(
            sup.contains(&want_line),
            "dump-super lacks {want_line:?}:\n{sup}"
        );
    }
    let csum_name = match c.csum {
        "blake2" => "blake2b",
        "xxhash" => "xxhash64",
        o => o,
    };
    assert!(
        sup.lines()
            .any(|l| l.starts_with("csum_type") && l.contains(&format!("({csum_name})"))),
        "dump-super csum_type is not {csum_name}:\n{sup}"
    );

    // The kernel sees exactly the source tree.
    {
        let m = KernelMount::new(&img, "ro");
        let got = walk(&m.mnt, WalkOpts { mtime: true }, &[]);
        assert_same(
            "kernel ro mount vs mkfs -r source",
            "src",
            want,
            "kernel",
            &got,
        );
        assert_eq!(
            &du_files(&m.mnt, &got),
            want_du,
            "du --apparent-size per file"
        );
        // Profiles are what was asked for.
        let df = sh(&format!("btrfs filesystem df {}", m.q()));
        let want_prof = |kind: &str, prof: &str| {
            let p = if prof == "dup" { "DUP" } else { "single" };
            assert!(
                df.lines().any(|l| l.starts_with(&format!("{kind}, {p}:"))),
                "{kind} profile is not {p}:\n{df}"
            );
        };
        want_prof("Data", c.data);
        want_prof("Metadata", c.metadata);
        m.umount();
    }

    // The kernel writes into it: new files, an overwrite, a delete, a snapshot.
    {
        let m = KernelMount::new(&img, "rw");
        sh(&format!(
            r#"set -e
            cd {mnt}
            mkdir kdir
            head -c 200000 /dev/urandom > kdir/new1
            echo hi > kdir/new2
            for i in $(seq 1 40); do head -c $((i * 777)) /dev/urandom > kdir/many$i; done
            dd if=/dev/urandom of=f_3145728 bs=4096 seek=10 count=5 conv=notrunc status=none
            head -c 7000 /dev/urandom > f_5000
            dd if=/dev/urandom of=sparse bs=4096 seek=1000 count=1 conv=notrunc status=none
            rm f_2049 dir/sub/link2
            setfattr -n user.kernel -v yes f_1
            btrfs -q subvolume snapshot . snap
            echo snapdata > snap/innew
            dd if=/dev/urandom of=snap/f_1048579 bs=4096 seek=3 count=2 conv=notrunc status=none
            rm snap/link3 snap/f_2048
            mv snap/f_1 snap/dir/moved
            sync
            "#,
            mnt = m.q()
        ));
        m.umount();
    }
    check(&img, "kernel rw mount: writes, snapshot, umount");

    // ubtrfs edits the kernel's image in this format (node size, checksum, profiles,
    // no-holes or not): blocks shared with the snapshot are CoWed.
    let exp = work.join(format!("exp{i}"));
    fs::create_dir_all(&exp).expect("mkdir exp");
    {
        let m = KernelMount::new(&img, "ro");
        sh(&format!(
            "cp -a {}/kdir/new1 {}/f_3145728 {}/",
            m.q(),
            m.q(),
            shell_quote(&exp)
        ));
        m.umount();
    }
    let snap_big = sha256_file(&exp.join("f_3145728"));
    let imgs = img.display().to_string();
    let srcp = |n: &str| src.join(n).display().to_string();
    for args in [
        vec![
            "put",
            &imgs,
            &srcp("sparse"),
            &srcp("f_1048579"),
            &srcp("sparse_tail"),
            "/kdir",
        ],
        vec!["truncate", &imgs, "/kdir/new1", "-s", "10000000"],
        vec!["truncate", &imgs, "/f_3145728", "-s", "1234567"],
        vec!["rm", &imgs, "/kdir/new2"],
        vec!["mkdir", &imgs, "/kdir/sub"],
    ] {
        ubtrfs(&args);
        check(&img, &show_args(&args));
    }
    sh(&format!(
        "cd {e} && truncate -s 10000000 new1 && truncate -s 1234567 f_3145728",
        e = shell_quote(&exp)
    ));
    {
        let m = KernelMount::new(&img, "ro");
        for (got, want) in [
            ("kdir/sparse", src.join("sparse")),
            ("kdir/sparse_tail", src.join("sparse_tail")),
            ("kdir/f_1048579", src.join("f_1048579")),
            ("kdir/new1", exp.join("new1")),
            ("f_3145728", exp.join("f_3145728")),
        ] {
            assert_eq!(
                sha256_file(&m.path(got)),
                sha256_file(&want),
                "kernel reads {got} after the ubtrfs edits"
            );
        }
        assert_eq!(
            sha256_file(&m.path("snap/f_3145728")),
            snap_big,
            "snapshot copy of f_3145728 changed"
        );
        assert!(
            !m.path("kdir/new2").exists(),
            "kdir/new2 still there after ubtrfs rm"
        );
        assert!(
            m.path("kdir/sub").is_dir(),
            "kdir/sub missing after ubtrfs mkdir"
        );
        m.umount();
    }

    // ubtrfs reads what the kernel wrote (and its own edits).
    let dest = work.join(format!("x{i}"));
    ubtrfs(&[
        "extract".to_string(),
        img.display().to_string(),
        dest.display().to_string(),
    ]);
    {
        let m = KernelMount::new(&img, "ro");
        let kern = walk(&m.mnt, WalkOpts { mtime: true }, &[]);
        let ext = walk(&dest, WalkOpts { mtime: true }, &[]);
        assert_same(
            "ubtrfs extract vs kernel ro mount (after kernel writes)",
            "kernel",
            &kern,
            "extract",
            &ext,
        );
        m.umount();
    }
    let _ = fs::remove_dir_all(&dest);
    let _ = fs::remove_file(&img);
}

#[test]
fn mkfs_matrix() {
    if !require_root("mkfs_matrix") {
        return;
    }
    let _s = serial();
    set_limit(30);
    let work = tmpdir("mkfs");
    let src = work.path().join("src");
    make_src_tree(&src);
    let want = walk(&src, WalkOpts { mtime: true }, &[]);
    let want_du = du_files(&src, &want);
    eprintln!("mkfs_matrix: source tree of {} entries", want.len());
    let mut failures = Vec::new();
    for (i, c) in COMBOS.iter().enumerate() {
        let name = format!(
            "combo {i}: -n {} --csum {} -m {} -d {} -O {:?}",
            c.nodesize, c.csum, c.metadata, c.data, c.features
        );
        eprintln!("mkfs_matrix: {name}");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            mkfs_combo(i, c, &src, &want, &want_du, work.path())
        }));
        if let Err(e) = r {
            let msg = panic_message(&*e);
            let hung = msg.contains(": hung)");
            failures.push(format!("{name}:\n{msg}"));
            if hung {
                // Every later combination copies the same tree: it would hang too.
                failures.push(format!(
                    "combinations {}..{} not run: combo {i} hung",
                    i + 1,
                    COMBOS.len() - 1
                ));
                break;
            }
        }
    }
    // The kernel refuses block-group-tree without no-holes ("block-group-tree
    // feature requires free-space-tree and no-holes"), so mkfs must refuse it too,
    // as mkfs.btrfs does.
    let bad = work.path().join("bad.img");
    let o = ubtrfs_raw(&[
        "mkfs".to_string(),
        "-q".into(),
        "--size".into(),
        "256M".into(),
        "-O".into(),
        "block-group-tree,^no-holes".into(),
        bad.display().to_string(),
    ]);
    if o.status.success() {
        failures.push(
            "ubtrfs mkfs -O block-group-tree,^no-holes succeeded; it must fail like mkfs.btrfs \
             (the kernel refuses the result: \"block-group-tree feature requires free-space-tree and no-holes\")"
                .to_string(),
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} mkfs checks failed:\n\n{}",
        failures.len(),
        COMBOS.len() + 1,
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------------------------
// 2. editing a kernel-made image with snapshots and reflinks

/// Runs one ubtrfs edit and the same edit on the host mirror, then checks the image.
struct Editor<'a> {
    img: &'a Path,
    mirror: &'a Path,
    n: usize,
    /// Wrong answers that do not make the image unusable: reported at the end.
    problems: Vec<String>,
}

impl Editor<'_> {
    fn full(&self, args: &[&str]) -> Vec<String> {
        let mut full: Vec<String> = vec![args[0].to_string(), self.img.display().to_string()];
        full.extend(args[1..].iter().map(|s| s.to_string()));
        full
    }

    /// An edit that must succeed; the same edit on the mirror; then btrfs check.
    fn edit(&mut self, args: &[&str], mirror_cmd: &str) {
        self.n += 1;
        let full = self.full(args);
        ubtrfs(&full);
        if !mirror_cmd.is_empty() {
            sh(&format!(
                "set -e; cd {}; {mirror_cmd}",
                shell_quote(self.mirror)
            ));
        }
        check(self.img, &format!("edit #{}: {}", self.n, show_args(&full)));
        eprintln!("edit #{}: {}: btrfs check clean", self.n, show_args(args));
    }

    /// An edit that must fail (and leave the image clean: each command is one
    /// transaction).
    fn refused(&mut self, args: &[&str], why: &str) {
        self.n += 1;
        let full = self.full(args);
        let o = ubtrfs_raw(&full);
        if o.status.success() {
            let p = format!(
                "edit #{}: {} exited 0 but must fail ({why})",
                self.n,
                show_args(&full)
            );
            eprintln!("PROBLEM: {p}");
            self.problems.push(p);
        } else {
            eprintln!(
                "edit #{}: {}: refused as it must be: {}",
                self.n,
                show_args(args),
                text(&o).trim()
            );
        }
        check(
            self.img,
            &format!("refused edit #{}: {}", self.n, show_args(&full)),
        );
    }
}

#[test]
fn edit_kernel_image_with_snapshots_and_reflinks() {
    if !require_root("edit_kernel_image_with_snapshots_and_reflinks") {
        return;
    }
    let _s = serial();
    set_limit(60);
    let work = tmpdir("edit");
    let img = work.path().join("k.img");
    let mirror = work.path().join("mirror");
    let host = work.path().join("host");
    mkfs_btrfs(&img, 1 << 30, &[]);

    // The mirror: ~200 files in 10 directories, some of 1-3 MiB, and a deeper tree.
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for d in 0..10 {
        for f in 0..20 {
            let size = if f % 7 == 3 {
                (1 << 20) + rng.below(2 << 20) as usize
            } else {
                match rng.below(4) {
                    0 => rng.below(100) as usize,
                    1 => rng.below(4096) as usize,
                    _ => rng.below(60000) as usize,
                }
            };
            write_file(&mirror.join(format!("d{d:02}/f{f:03}")), &rng.bytes(size));
        }
    }
    for p in [
        "tree/a/b/c/leaf1",
        "tree/a/b/leaf2",
        "tree/a/leaf3",
        "tree/x/y/leaf4",
    ] {
        let n = rng.below(10000) as usize;
        write_file(&mirror.join(p), &rng.bytes(n));
    }
    sh(&format!(
        "set -e; cd {m}
        setfattr -n user.keep -v kept d02/f004
        setfattr -n user.gone -v soon d02/f004
        setfattr -n user.gone -v soon2 d08/f003
        chmod 600 d01/f002; chown 1234:4321 d01/f002",
        m = shell_quote(&mirror)
    ));
    // Compressible data (the kernel writes it compressed), inline files, and a
    // preallocated file with one written range.
    let line = b"a compressible line of text, again and again\n";
    let mut text1 = line.repeat(3_000_000 / line.len());
    text1.truncate(3_000_000);
    write_file(&mirror.join("zdir/text1"), &text1);
    write_file(&mirror.join("zdir/text2"), &text1[..600_000]);
    write_file(&mirror.join("zdir/inline"), &rng.bytes(100));
    write_file(&mirror.join("zdir/inline2"), &rng.bytes(1000));
    let prealloc = "fallocate -l 3M zdir/pre
        cat zdir/inline2 zdir/text1 | head -c 5000 | dd of=zdir/pre bs=4096 seek=100 conv=notrunc status=none";
    {
        let m = KernelMount::new(&img, "rw,compress=zstd");
        sh(&format!(
            "set -e; cp -a {mirror}/. {mnt}/
            cd {mnt}
            {prealloc}
            mkdir refl
            for f in d06/f003 d07/f003 d07/f010 d09/f003; do
                cp -a --reflink=always $f refl/$(echo $f | tr / _)
            done
            cp -a --reflink=always d06/f010 d06/f010.clone
            btrfs -q subvolume create d09/inner_sv
            echo inner > d09/inner_sv/file
            sync
            btrfs -q subvolume snapshot . snap
            sync",
            mirror = shell_quote(&mirror),
            mnt = m.q()
        ));
        m.umount();
    }
    sh(&format!(
        "set -e; cd {m}
        mkdir refl
        for f in d06/f003 d07/f003 d07/f010 d09/f003; do cp -a $f refl/$(echo $f | tr / _); done
        cp -a d06/f010 d06/f010.clone
        mkdir d09/inner_sv; chmod 755 d09/inner_sv; echo inner > d09/inner_sv/file
        {prealloc}",
        m = shell_quote(&mirror)
    ));
    check(&img, "mkfs.btrfs + kernel writes, reflinks, snapshot");
    let fs_tree = sh(&format!(
        "btrfs inspect-internal dump-tree -t 5 {}",
        shell_quote(&img)
    ));
    for kind in [
        "compression 3 (zstd)",
        "type 2 (prealloc)",
        "inline extent data size 100 ",
    ] {
        assert!(
            fs_tree.contains(kind),
            "the kernel wrote no {kind:?} extent"
        );
    }
    let snap_before = {
        let m = KernelMount::new(&img, "ro");
        let top = walk(&m.mnt, WalkOpts { mtime: false }, &["/snap"]);
        let want = walk(&mirror, WalkOpts { mtime: false }, &[]);
        assert_same(
            "kernel-made image vs mirror before edits",
            "mirror",
            &want,
            "kernel",
            &top,
        );
        let s = walk(&m.path("snap"), WalkOpts { mtime: true }, &[]);
        m.umount();
        s
    };

    // Host files to put.
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for (p, n) in [
        ("newtree/a/one", 10usize),
        ("newtree/a/two", 3000),
        ("newtree/b/three", 70000),
        ("newtree/b/c/big", 2 * 1024 * 1024 + 17),
        ("newtree/empty", 0),
        ("refl_new/d07_f003", 123_457),
    ] {
        write_file(&host.join(p), &rng.bytes(n));
    }
    sh(&format!(
        "set -e; cd {h}; mkdir newtree/emptydir; ln -s a/one newtree/sl; ln newtree/a/two newtree/b/two_again
        setfattr -n user.put -v yes newtree/a/one; chmod 751 newtree/b; chown 77:88 newtree/a/two",
        h = shell_quote(&host)
    ));
    let hq = |p: &str| host.join(p).display().to_string();

    let mut e = Editor {
        img: &img,
        mirror: &mirror,
        n: 0,
        problems: Vec::new(),
    };
    e.edit(
        &["put", &hq("newtree"), "/"],
        &format!("cp -a {} .", shell_quote(&host.join("newtree"))),
    );
    e.edit(
        &["mkdir", "-p", "/made/x/y"],
        "mkdir -p made/x/y && chmod 755 made made/x made/x/y",
    );
    e.edit(&["rm", "-r", "/d03"], "rm -r d03");
    e.edit(&["rm", "/d05/f000", "/d05/f001"], "rm d05/f000 d05/f001");
    e.edit(&["mv", "/d01/f000", "/d02"], "mv d01/f000 d02/");
    e.edit(&["mv", "/d01/f001", "/d02/f005"], "mv -f d01/f001 d02/f005");
    e.edit(&["mv", "/d04", "/made/x"], "mv d04 made/x/");
    e.edit(
        &["mv", "/d08/f003", "/d08/renamed"],
        "mv d08/f003 d08/renamed",
    );
    e.refused(
        &["mv", "-n", "/d02/f006", "/d02/f007"],
        "-n and the target exists",
    );
    e.edit(&["ln", "/d02/f003", "/d05/hard"], "ln d02/f003 d05/hard");
    e.edit(
        &["ln", "-s", "../d02/f003", "/d05/soft"],
        "ln -s ../d02/f003 d05/soft",
    );
    e.edit(
        &["setfattr", "/d02/f003", "-n", "user.new", "-v", "value"],
        "setfattr -n user.new -v value d02/f003",
    );
    e.edit(
        &["setfattr", "/d02/f004", "-n", "user.gone", "-x"],
        "setfattr -x user.gone d02/f004",
    );
    e.edit(
        &[
            "setfattr",
            "/d08/renamed",
            "-n",
            "user.gone",
            "-v",
            &"v".repeat(3000),
        ],
        &format!("setfattr -n user.gone -v {} d08/renamed", "v".repeat(3000)),
    );
    e.edit(
        &["truncate", "/d06/f003", "-s", "1000001"],
        "truncate -s 1000001 d06/f003",
    );
    e.edit(
        &["truncate", "/refl/d07_f010", "-s", "4097"],
        "truncate -s 4097 refl/d07_f010",
    );
    e.edit(
        &["truncate", "/d06/f001", "-s", "5242883"],
        "truncate -s 5242883 d06/f001",
    );
    e.edit(
        &["truncate", "/d09/f003", "-s", "0"],
        "truncate -s 0 d09/f003",
    );
    e.edit(&["rm", "/refl/d07_f003"], "rm refl/d07_f003");
    e.edit(
        &["put", &hq("refl_new/d07_f003"), "/refl"],
        &format!(
            "cp -a {} refl/",
            shell_quote(&host.join("refl_new/d07_f003"))
        ),
    );
    e.edit(
        &["rm", "-r", "/d06/f010.clone", "/tree/a"],
        "rm -r d06/f010.clone tree/a",
    );
    for (path, size) in [
        ("/zdir/text1", "1000001"),
        ("/zdir/text2", "131073"),
        ("/zdir/inline", "10000"),
        ("/zdir/inline2", "50"),
        ("/zdir/pre", "500000"),
        ("/zdir/pre", "9000000"),
        ("/zdir/text1", "5000000"),
    ] {
        e.edit(
            &["truncate", path, "-s", size],
            &format!("truncate -s {size} .{path}"),
        );
    }
    e.edit(
        &["put", &hq("newtree/a/one"), &hq("newtree/b/three"), "/d07"],
        &format!(
            "cp -a {} {} d07/",
            shell_quote(&host.join("newtree/a/one")),
            shell_quote(&host.join("newtree/b/three"))
        ),
    );
    e.refused(
        &["put", &hq("refl_new/d07_f003"), "/refl"],
        "/refl/d07_f003 exists",
    );
    e.refused(&["mv", "/newtree", "/newtree/a"], "a directory into itself");
    e.refused(&["ln", "/d02", "/d02_hardlink"], "hard link to a directory");

    // The kernel sees the edits and an unchanged snapshot, and can write on.
    {
        let m = KernelMount::new(&img, "rw");
        let snap_after = walk(&m.path("snap"), WalkOpts { mtime: true }, &[]);
        assert_same(
            "snapshot after ubtrfs edits of the top level",
            "before",
            &snap_before,
            "after",
            &snap_after,
        );
        let top = walk(&m.mnt, WalkOpts { mtime: false }, &["/snap"]);
        let want = walk(&mirror, WalkOpts { mtime: false }, &[]);
        assert_same(
            "top level after ubtrfs edits (kernel vs host mirror)",
            "mirror",
            &want,
            "kernel",
            &top,
        );
        sh(&format!(
            "set -e; cd {mnt}
            head -c 300000 /dev/urandom >> d06/f003
            head -c 5000 /dev/urandom > newtree/b/kernel_new
            rm -r d05 made/x/d04
            cp --reflink=always newtree/b/c/big snap/big_from_top
            dd if=/dev/urandom of=d02/f003 bs=4096 seek=2 count=3 conv=notrunc status=none
            btrfs -q subvolume snapshot . snap2
            rm -r snap2/d02
            sync",
            mnt = m.q()
        ));
        m.umount();
    }
    check(&img, "kernel writes after the ubtrfs edits");
    let mut before_edge = {
        let m = KernelMount::new(&img, "ro");
        let t = walk(&m.mnt, WalkOpts { mtime: false }, &[]);
        m.umount();
        t
    };

    // Edges, last because a wrong answer here may leave the image unusable.
    // Links and renames between subvolumes: EXDEV, as on the kernel (edits inside
    // a snapshot work: crates/cli/tests/subvol_edit.rs).
    e.refused(
        &["ln", "/d02/f003", "/snap/hard"],
        "a hard link into another subvolume (EXDEV)",
    );
    e.refused(
        &["mv", "/d02/f003", "/snap/moved"],
        "a rename into another subvolume (EXDEV)",
    );
    e.refused(
        &["setfattr", "/d02/f003", "-n", "bogus", "-v", "1"],
        "no xattr namespace prefix: the kernel refuses it with EOPNOTSUPP",
    );
    e.refused(
        &["setfattr", "/d02/f003", "-n", "user.none", "-x"],
        "no such attribute (ENODATA)",
    );
    // rm -r of a subvolume, or of a directory holding one: the kernel's rm -r
    // deletes them (rmdir of a subvolume root deletes the subvolume); ubtrfs may
    // instead refuse, with an error message, but must not crash.
    for (path, gone) in [("/d09", "/d09"), ("/snap2", "/snap2")] {
        e.n += 1;
        let full = e.full(&["rm", "-r", path]);
        let o = ubtrfs_raw(&full);
        match o.status.code() {
            Some(0) => {
                eprintln!("edit #{}: rm -r {path}: done", e.n);
                let sub = format!("{gone}/");
                before_edge.retain(|p, _| p != gone && !p.starts_with(&sub));
            }
            Some(1) => eprintln!("edit #{}: rm -r {path}: refused: {}", e.n, text(&o).trim()),
            _ => {
                let t = text(&o);
                let p = format!(
                    "edit #{}: {} crashed ({}): {}",
                    e.n,
                    show_args(&full),
                    o.status,
                    head(t.trim(), 5)
                );
                eprintln!("PROBLEM: {p}");
                e.problems.push(p);
            }
        }
        check(&img, &format!("edit #{}: {}", e.n, show_args(&full)));
    }
    // No-op edits: POSIX says they succeed and change nothing.
    e.edit(&["mkdir", "-p", "/made/x/y"], "");
    e.edit(&["mv", "/d02/f007", "/d02/f007"], "");
    {
        let m = KernelMount::new(&img, "ro");
        let after = walk(&m.mnt, WalkOpts { mtime: false }, &[]);
        m.umount();
        for d in diff("before", &before_edge, "after", &after) {
            e.problems
                .push(format!("refused or no-op edits changed the tree: {d}"));
        }
    }
    assert!(
        e.problems.is_empty(),
        "{} problems:\n{}",
        e.problems.len(),
        e.problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------
// 3. one directory with 100,000 entries

#[test]
fn many_files_one_directory() {
    if !require_root("many_files_one_directory") {
        return;
    }
    let _s = serial();
    set_limit(300);
    const N: usize = 100_000;
    let work = tmpdir("many");
    let src = work.path().join("src");
    let many = src.join("many");
    fs::create_dir_all(&many).expect("mkdir");
    for i in 0..N {
        let p = many.join(format!("file-{i:06}"));
        if i % 1000 == 7 {
            write_file(&p, format!("tiny {i}\n").as_bytes());
        } else {
            fs::File::create(&p).expect("create");
        }
    }
    let img = work.path().join("many.img");
    ubtrfs(&[
        "mkfs",
        "-q",
        "--size",
        "2G",
        "-n",
        "4096",
        "-r",
        &src.display().to_string(),
        &img.display().to_string(),
    ]);
    check(&img, "mkfs -n 4096 -r (100000 files in one directory)");
    let sample = [
        0usize, 1, 7, 1007, 4242, 49_999, 50_000, 65_536, 99_007, 99_998, 99_999,
    ];
    let count = |m: &KernelMount, dir: &str| -> usize {
        sh(&format!(
            "ls -f {} | grep -c '^file-' || true",
            shell_quote(&m.path(dir))
        ))
        .trim()
        .parse()
        .expect("count")
    };
    {
        // Read-write: the kernel also snapshots it, so ubtrfs's deletes below CoW
        // a multi-level tree shared with the snapshot.
        let m = KernelMount::new(&img, "rw");
        assert_eq!(count(&m, "many"), N, "kernel ls count");
        for i in sample {
            let p = m.path(&format!("many/file-{i:06}"));
            let want: Vec<u8> = if i % 1000 == 7 {
                format!("tiny {i}\n").into_bytes()
            } else {
                Vec::new()
            };
            assert_eq!(
                fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
                want,
                "{}",
                p.display()
            );
        }
        sh(&format!(
            "btrfs -q subvolume snapshot -r {} {}/snap",
            m.q(),
            m.q()
        ));
        m.umount();
    }
    check(&img, "kernel snapshot of the 100000-file tree");
    // Every other name, in one command.
    let mut args: Vec<String> = vec!["rm".into(), img.display().to_string()];
    args.extend((0..N).step_by(2).map(|i| format!("/many/file-{i:06}")));
    ubtrfs(&args);
    check(
        &img,
        "ubtrfs rm of 50000 names (every other) in one command",
    );
    {
        let m = KernelMount::new(&img, "ro");
        assert_eq!(count(&m, "many"), N / 2, "kernel ls count after rm");
        assert_eq!(count(&m, "snap/many"), N, "snapshot ls count after rm");
        for i in sample {
            let p = m.path(&format!("many/file-{i:06}"));
            assert_eq!(
                p.exists(),
                i % 2 == 1,
                "{} exists: {}",
                p.display(),
                p.exists()
            );
        }
        m.umount();
    }
    ubtrfs(&["rm", "-r", &img.display().to_string(), "/many"]);
    check(
        &img,
        "ubtrfs rm -r of the directory's 50000 remaining files",
    );
    {
        let m = KernelMount::new(&img, "ro");
        assert!(!m.path("many").exists(), "/many still there after rm -r");
        assert_eq!(count(&m, "snap/many"), N, "snapshot ls count after rm -r");
        m.umount();
    }
}

// ---------------------------------------------------------------------------------
// 4. ENOSPC, then delete and write again

#[test]
fn enospc_then_delete() {
    if !require_root("enospc_then_delete") {
        return;
    }
    let _s = serial();
    set_limit(60);
    let work = tmpdir("enospc");
    let img = work.path().join("small.img");
    let imgs = img.display().to_string();
    ubtrfs(&["mkfs", "-q", "--size", "256M", &imgs]);
    check(&img, "mkfs --size 256M");
    let mut rng = Rng(0xfeed_f00d_1234_5678);
    let mut put: Vec<(String, String)> = Vec::new();
    let mut fail = None;
    for i in 0..40 {
        let name = format!("blob{i:02}");
        let p = work.path().join(&name);
        write_file(&p, &rng.bytes(16 << 20));
        let o = ubtrfs_raw(&[
            "put".to_string(),
            imgs.clone(),
            p.display().to_string(),
            format!("/{name}"),
        ]);
        if o.status.success() {
            put.push((name, sha256_file(&p)));
            let _ = fs::remove_file(&p);
        } else {
            fail = Some((name, o));
            break;
        }
    }
    let (failed_name, o) = fail.expect("16 MiB puts into a 256 MiB image never ran out of space");
    let msg = text(&o);
    eprintln!(
        "enospc_then_delete: {} puts succeeded, put of {failed_name} failed: {}",
        put.len(),
        msg.trim()
    );
    assert!(o.status.code() != Some(124), "put hung at ENOSPC: {msg}");
    assert!(msg.contains("No space left"), "ENOSPC message: {msg:?}");
    assert!(
        put.len() >= 8,
        "only {} of 16 MiB fitted into 256 MiB",
        put.len()
    );
    check(&img, &format!("the failed put of {failed_name} (ENOSPC)"));
    let want: BTreeMap<String, String> = put.iter().cloned().collect();
    let kernel_files = |img: &Path| -> BTreeMap<String, String> {
        let m = KernelMount::new(img, "ro");
        let mut got = BTreeMap::new();
        for d in fs::read_dir(&m.mnt).expect("readdir") {
            let d = d.expect("readdir");
            got.insert(
                d.file_name().to_string_lossy().into_owned(),
                sha256_file(&d.path()),
            );
        }
        m.umount();
        got
    };
    assert_eq!(kernel_files(&img), want, "kernel view after ENOSPC");

    let mut args = vec!["rm".to_string(), imgs.clone()];
    let mut want = want;
    for (name, _) in put.iter().step_by(2) {
        args.push(format!("/{name}"));
        want.remove(name);
    }
    ubtrfs(&args);
    check(&img, "rm of half the files after ENOSPC");
    let p = work.path().join(&failed_name);
    ubtrfs(&[
        "put".to_string(),
        imgs.clone(),
        p.display().to_string(),
        format!("/{failed_name}"),
    ]);
    want.insert(failed_name.clone(), sha256_file(&p));
    check(&img, "put after freeing space");
    assert_eq!(kernel_files(&img), want, "kernel view after rm and put");
}

// ---------------------------------------------------------------------------------
// 5. a mounted image is refused

#[test]
fn refuse_mounted_image() {
    if !require_root("refuse_mounted_image") {
        return;
    }
    let _s = serial();
    set_limit(60);
    let work = tmpdir("mounted");
    let img = work.path().join("m.img");
    let imgs = img.display().to_string();
    let file = work.path().join("file");
    write_file(&file, b"data\n");
    let files = file.display().to_string();
    ubtrfs(&["mkfs", "-q", "--size", "256M", &imgs]);
    {
        let m = KernelMount::new(&img, "rw");
        let dev = m.dev().to_string();
        for args in [
            vec!["put", &imgs, &files, "/file"],
            vec!["put", &dev, &files, "/file"],
            vec!["mkdir", &imgs, "/d"],
            vec!["mkfs", "-f", "-q", &imgs],
        ] {
            let o = ubtrfs_raw(&args);
            let msg = text(&o);
            assert!(
                !o.status.success() && o.status.code() != Some(124),
                "{} on a mounted image: {} {msg}",
                show_args(&args),
                o.status
            );
            assert!(
                msg.contains("mounted"),
                "{}: message does not say mounted: {msg:?}",
                show_args(&args)
            );
        }
        assert!(!m.path("file").exists() && !m.path("d").exists());
        m.umount();
    }
    check(&img, "refused writes to the mounted image");
}

// ---------------------------------------------------------------------------------
// 6. (beyond the five above) quotas: an edit of a filesystem with qgroups enabled
// must keep the qgroup counts right (or mark them inconsistent so that the kernel
// rescans), or be refused; never leave counts that btrfs check calls wrong.

#[test]
fn edit_image_with_quotas() {
    if !require_root("edit_image_with_quotas") {
        return;
    }
    let _s = serial();
    set_limit(60);
    let work = tmpdir("quota");
    let img = work.path().join("q.img");
    let imgs = img.display().to_string();
    let file = work.path().join("file");
    write_file(&file, &Rng(77).bytes(1 << 20));
    mkfs_btrfs(&img, 1 << 30, &[]);
    {
        let m = KernelMount::new(&img, "rw");
        sh(&format!(
            "set -e; cd {mnt}
            btrfs quota enable .
            head -c 3000000 /dev/urandom > a
            btrfs -q subvolume create sv
            head -c 1000000 /dev/urandom > sv/b
            btrfs -q subvolume snapshot . snap
            sync",
            mnt = m.q()
        ));
        m.umount();
    }
    check(&img, "kernel writes with quotas enabled");
    let o = ubtrfs_raw(&[
        "put".to_string(),
        imgs.clone(),
        file.display().to_string(),
        "/file".into(),
    ]);
    eprintln!(
        "edit_image_with_quotas: put: {} {}",
        o.status,
        text(&o).trim()
    );
    check(&img, "ubtrfs put into a filesystem with quotas enabled");
    let o = ubtrfs_raw(&["rm".to_string(), imgs.clone(), "/a".into()]);
    eprintln!(
        "edit_image_with_quotas: rm: {} {}",
        o.status,
        text(&o).trim()
    );
    check(
        &img,
        "ubtrfs rm (of a file shared with a snapshot) with quotas enabled",
    );
}

/// `mkfs --shrink -r SRC` without --size: the image is cut to its last chunk, stays
/// far smaller than a default-sized one, passes check and shows SRC in the kernel;
/// subvolumes made with --subvol appear as the kernel's subvolumes.
#[test]
fn mkfs_shrink_and_subvolumes() {
    if !require_root("mkfs_shrink_and_subvolumes") {
        return;
    }
    let _s = serial();
    set_limit(120);
    let work = tmpdir("shrink");
    let src = work.path().join("src");
    make_src_tree(&src);
    fs::create_dir_all(src.join("sv/inner")).expect("mkdir sv");
    write_file(&src.join("sv/inner/f"), b"in a subvolume\n");
    let img = work.path().join("shrunk.img");
    let imgs = img.display().to_string();
    let srcs = src.display().to_string();
    ubtrfs(&[
        "mkfs", "-q", "--shrink", "-r", &srcs, "--subvol", "sv", &imgs,
    ]);
    check(&img, "mkfs --shrink");
    let len = fs::metadata(&img).expect("stat image").len();
    assert!(len < 200 << 20, "shrunk image is {len} bytes");
    let k = KernelMount::new(&img, "ro");
    let want = walk(&src, WalkOpts { mtime: true }, &[]);
    let got = walk(&k.mnt, WalkOpts { mtime: true }, &[]);
    assert_same("mkfs --shrink", "source", &want, "kernel", &got);
    let list = sh(&format!("btrfs subvolume list {}", k.q()));
    assert!(list.contains("path sv"), "subvolume list: {list}");
    k.umount();
}

/// `mkfs -r SRC IMAGE` without a size, as one types it after mkfs.btrfs: a new
/// image file, an empty one and one too small all grow to what SRC needs (as
/// mkfs.btrfs --rootdir enlarges them), pass check and show SRC in the kernel; a
/// large enough file keeps its size.
#[test]
fn mkfs_rootdir_sizes_the_image_file_as_mkfs_btrfs() {
    if !require_root("mkfs_rootdir_sizes_the_image_file_as_mkfs_btrfs") {
        return;
    }
    let _s = serial();
    set_limit(120);
    let work = tmpdir("rootdir-size");
    let src = work.path().join("src");
    make_src_tree(&src);
    write_file(&src.join("big"), &vec![7u8; 40 << 20]);
    let srcs = src.display().to_string();
    let want = walk(&src, WalkOpts { mtime: true }, &[]);
    for (name, before) in [
        ("new", None),
        ("empty", Some(0)),
        ("small", Some(1 << 20)),
        ("large", Some(3u64 << 30)),
    ] {
        let img = work.path().join(format!("{name}.img"));
        if let Some(len) = before {
            fs::File::create(&img)
                .and_then(|f| f.set_len(len))
                .expect("image file");
        }
        let imgs = img.display().to_string();
        ubtrfs(&["mkfs", "-q", "-r", &srcs, &imgs]);
        let len = fs::metadata(&img).expect("stat image").len();
        if name == "large" {
            assert_eq!(len, 3 << 30, "{name}: a large enough file keeps its size");
        } else {
            assert!(
                len > 40 << 20,
                "{name}: the image has room for the tree ({len} bytes)"
            );
        }
        check(&img, name);
        let k = KernelMount::new(&img, "ro");
        let got = walk(&k.mnt, WalkOpts { mtime: true }, &[]);
        assert_same(name, "source", &want, "kernel", &got);
        k.umount();
    }
}

/// `mkfs --subvol TYPE:DIR` as mkfs.btrfs takes it (`ro:`, `default:`, `rw:`, a
/// plain DIR): on the kernel's mount of each image the same subvolumes are
/// read-only, the same one is the default (what a plain mount shows) and the
/// contents equal; two defaults are refused by both.
#[test]
fn mkfs_subvolume_types_as_mkfs_btrfs() {
    if !require_root("mkfs_subvolume_types_as_mkfs_btrfs") {
        return;
    }
    let _s = serial();
    set_limit(120);
    let work = tmpdir("subvol-types");
    let src = work.path().join("src");
    for d in ["a/x", "b", "c"] {
        fs::create_dir_all(src.join(d)).expect("mkdir");
    }
    write_file(&src.join("a/f"), b"in a\n");
    write_file(&src.join("b/g"), b"in b, the default\n");
    write_file(&src.join("c/h"), b"in c\n");
    let srcs = src.display().to_string();
    let progs = work.path().join("progs.img");
    let ours = work.path().join("ubtrfs.img");
    let subvols = "-u ro:a -u default:b -u rw:c -u a/x";
    mkfs_btrfs(&progs, 1 << 30, &[]);
    sh(&format!(
        "mkfs.btrfs -q -f -r {srcs} {subvols} {}",
        progs.display()
    ));
    let args: Vec<&str> = subvols.split_whitespace().collect();
    let ours_s = ours.display().to_string();
    let mut cmd = vec!["mkfs", "-q", "--size", "1G", "-r", &srcs];
    cmd.extend(args);
    cmd.push(&ours_s);
    ubtrfs(&cmd);
    check(&ours, "mkfs --subvol TYPE:DIR");
    // Times are left out: mkfs.btrfs 6.14 drops the nanoseconds of some of them
    // (mkfs_shrink_and_subvolumes checks ubtrfs's against the source).
    let seen = |img: &Path| {
        let k = KernelMount::new(img, "ro");
        let default_view = walk(&k.mnt, WalkOpts { mtime: false }, &[]);
        k.umount();
        let k = KernelMount::new(img, "ro,subvol=/");
        let flags = sh(&format!(
            "cd {}; for s in a b c a/x; do echo $s $(btrfs property get $s ro); done
             btrfs subvolume get-default . | sed 's/.* path //'",
            k.q()
        ));
        let all = walk(&k.mnt, WalkOpts { mtime: false }, &[]);
        k.umount();
        (default_view, flags, all)
    };
    let (want_default, want_flags, want_all) = seen(&progs);
    let (got_default, got_flags, got_all) = seen(&ours);
    assert_eq!(
        want_flags,
        "a ro=true\nb ro=false\nc ro=false\na/x ro=false\nb\n"
    );
    assert_eq!(got_flags, want_flags, "read-only flags and the default");
    assert_same(
        "mkfs --subvol",
        "mkfs.btrfs",
        &want_default,
        "ubtrfs",
        &got_default,
    );
    assert_same(
        "mkfs --subvol, subvol=/",
        "mkfs.btrfs",
        &want_all,
        "ubtrfs",
        &got_all,
    );
    let (ok, _, err) = bin().run(&[
        "mkfs",
        "-q",
        "-f",
        "--size",
        "1G",
        "-r",
        &srcs,
        "-u",
        "default:a",
        "-u",
        "default-ro:b",
        &ours_s,
    ]);
    let progs_err = sh(&format!(
        "mkfs.btrfs -q -f -r {srcs} -u default:a -u default-ro:b {} 2>&1 && echo accepted || true",
        progs.display()
    ));
    assert!(
        progs_err.contains("default subvolume can only be specified once"),
        "mkfs.btrfs: {progs_err}"
    );
    assert!(
        !ok && err.contains("default subvolume can only be specified once"),
        "{err}"
    );
}

/// `mkfs --reflink`: with the source and the image on one btrfs (a kernel loop mount
/// here), file data is shared with the source instead of copied: the image's extents
/// show up as shared in `btrfs filesystem du`; the image passes check and shows the
/// source. On a host without reflink (ext4 /tmp) it falls back to copying.
#[test]
fn mkfs_reflink_shares_source_data() {
    if !require_root("mkfs_reflink_shares_source_data") {
        return;
    }
    let _s = serial();
    set_limit(120);
    let work = tmpdir("reflink");
    let host_img = work.path().join("host.img");
    mkfs_btrfs(&host_img, 1 << 30, &[]);
    let host = KernelMount::new(&host_img, "rw");
    let src = host.path("src");
    make_src_tree(&src);
    write_file(&src.join("big"), &Rng(7).bytes(8 << 20));
    sh("sync");
    let img = host.path("image.img");
    let imgs = img.display().to_string();
    let srcs = src.display().to_string();
    ubtrfs(&[
        "mkfs",
        "-q",
        "--reflink",
        "--size",
        "512M",
        "-r",
        &srcs,
        &imgs,
    ]);
    sh("sync");
    check(&img, "mkfs --reflink");
    let du = sh(&format!(
        "btrfs filesystem du -s --raw {}",
        shell_quote(&img)
    ));
    let shared: u64 = du
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(
        shared >= 8 << 20,
        "image shares only {shared} bytes with the source: {du}"
    );
    let k = KernelMount::new(&img, "ro");
    let want = walk(&src, WalkOpts { mtime: true }, &[]);
    let got = walk(&k.mnt, WalkOpts { mtime: true }, &[]);
    assert_same("mkfs --reflink", "source", &want, "kernel", &got);
    k.umount();
    // Fallback: the image on a filesystem that cannot reflink from the source.
    let img2 = work.path().join("copied.img");
    let img2s = img2.display().to_string();
    ubtrfs(&[
        "mkfs",
        "-q",
        "--reflink",
        "--size",
        "512M",
        "-r",
        &srcs,
        &img2s,
    ]);
    check(&img2, "mkfs --reflink fallback");
    host.umount();
}

/// Data used in the `Data, PROFILE` line of `filesystem df -b` output.
fn df_data_used(df: &str, profile: &str) -> u64 {
    let prefix = format!("Data, {profile}: ");
    df.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.split("used=").nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Data, {profile} line in:\n{df}"))
}

/// A conversion to DUP stopped half-way leaves data in SINGLE and DUP block groups.
/// The kernel then puts new data only in DUP ones (its mount makes the SINGLE
/// groups read-only), so the redundancy asked for holds for everything new; ubtrfs
/// must too, offline and on its mount. Both write the same files into copies of
/// one image; each keeps the SINGLE groups' use as it was and grows DUP's.
#[test]
fn new_data_is_mirrored_after_a_half_done_conversion() {
    if !require_root("new_data_is_mirrored_after_a_half_done_conversion") {
        return;
    }
    let dir = tmpdir("half-convert");
    let k = dir.path().join("k.img");
    mkfs_btrfs(&k, 1 << 30, &[]);
    let m = KernelMount::new(&k, "");
    sh(&format!(
        "set -e; cd {}; head -c 150000000 /dev/urandom > f; sync
         btrfs -q balance start -dconvert=dup,limit=1 . >/dev/null",
        m.q()
    ));
    m.umount();
    let u = dir.path().join("u.img");
    let v = dir.path().join("v.img");
    for c in [&u, &v] {
        sh(&format!(
            "cp --sparse=always {} {}",
            k.display(),
            c.display()
        ));
    }
    let before = ubtrfs(&["filesystem", "df", "-b", k.to_str().unwrap()]);
    let single = df_data_used(&before, "single");
    let dup = df_data_used(&before, "DUP");
    assert!(
        single > 0,
        "the half-done conversion left data in SINGLE:\n{before}"
    );
    let src = dir.path().join("new");
    sh(&format!(
        "head -c 30000000 /dev/urandom > {}",
        src.display()
    ));

    let m = KernelMount::new(&k, "");
    sh(&format!("cp {} {}/new; sync", src.display(), m.q()));
    m.umount();
    ubtrfs(&["put", u.to_str().unwrap(), src.to_str().unwrap(), "/new"]);
    let mut fm = ubtrfs_sim::mount::FuseMount::start(&bin(), &[&v], &["rw"]);
    sh(&format!("cp {} {}/new", src.display(), fm.mnt.display()));
    assert!(fm.unmount().success(), "{}", fm.log());
    for (who, img) in [("kernel", &k), ("ubtrfs put", &u), ("ubtrfs mount", &v)] {
        let after = ubtrfs(&["filesystem", "df", "-b", img.to_str().unwrap()]);
        assert_eq!(
            df_data_used(&after, "single"),
            single,
            "{who} wrote into SINGLE block groups:\n{after}"
        );
        assert!(
            df_data_used(&after, "DUP") >= dup + 30_000_000,
            "{who}: the new data is not in DUP block groups:\n{after}"
        );
        if who != "kernel" {
            check(img, who);
        }
    }
}
