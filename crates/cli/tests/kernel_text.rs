//! Output text compared with the kernel tools on a fresh kernel-made image (root):
//! `ubtrfs inspect fiemap -v` vs `filefrag -v`, `ubtrfs filesystem du` vs
//! `btrfs filesystem du`, `ubtrfs inspect dump-super` vs `btrfs inspect-internal
//! dump-super`, `ubtrfs filesystem show` vs `btrfs filesystem show`, `ubtrfs
//! filesystem df` of the image vs `btrfs filesystem df` of its kernel mount, `ubtrfs
//! filesystem usage` of the image vs `btrfs filesystem usage` of its kernel mount, and
//! statfs(2) of ubtrfs mounts vs the kernel's. The loop mount is undone on drop, also
//! when an assertion fails. Needs
//! root (`ubtrfs_sim::host::require_root`).

use std::path::PathBuf;
use ubtrfs_sim::host::{require_root, sh, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// A fresh 1 GiB kernel-made image (in the returned directory), mounted with
/// compress=zstd and filled: compressed, reflinked, preallocated and inline files,
/// a subvolume and a snapshot.
fn make_image() -> (tempfile::TempDir, PathBuf, KernelMount) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    let m = KernelMount::new(&img, "compress=zstd");
    let d = m.mnt.display().to_string();
    sh(&format!(
        "set -e; cd {d}
         head -c 3000000 /dev/urandom > rand
         yes hello | head -c 5000000 > text
         cp --reflink=always rand rand2
         echo tiny > tiny
         mkdir -p dir/sub && head -c 70000 /dev/urandom > dir/sub/f
         fallocate -l 1M dir/prealloc
         btrfs -q subvolume create sv && cp --reflink=always text sv/text
         sync
         xfs_io -c 'pwrite -S 0x11 8192 4096' rand2 >/dev/null
         btrfs -q subvolume snapshot sv snap
         xfs_io -c 'pwrite -S 0x22 0 4096' snap/text >/dev/null
         sync"
    ));
    (dir, img, m)
}

/// `btrfs filesystem df` of a fresh read-only kernel mount of `img`: text, `-b`,
/// and `--format json`, concatenated.
fn df_on_kernel_mount(img: &std::path::Path) -> String {
    let m = KernelMount::new(img, "ro");
    let d = m.mnt.display().to_string();
    let out = sh(&format!(
        "btrfs filesystem df {d}; btrfs filesystem df -b {d}; btrfs --format json filesystem df {d}"
    ));
    m.umount();
    out
}

/// `ubtrfs filesystem df` of the image in the same three forms.
fn df_of_image(img: &str) -> String {
    [
        UBTRFS.stdout(&["filesystem", "df", img]),
        UBTRFS.stdout(&["filesystem", "df", "-b", img]),
        UBTRFS.stdout(&["filesystem", "df", "--format", "json", img]),
    ]
    .concat()
}

/// `filesystem df` where the kernel sizes its global reserve by the extent,
/// checksum and free-space trees (20,000 small files, 4 KiB nodes), not by its
/// minimum; and where ubtrfs wrote the filesystem.
#[test]
fn filesystem_df_matches_the_kernel() {
    if !require_root("filesystem_df_matches_the_kernel") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    mkfs_btrfs(&img, 2 << 30, &["-n", "4096"]);
    let m = KernelMount::new(&img, "");
    sh(&format!(
        "cd {}; python3 -c \"
for i in range(20000):
    open('f%d' % i, 'wb').write(b'x' * 5000)
\"; sync",
        m.mnt.display()
    ));
    m.umount();
    let want = df_on_kernel_mount(&img);
    let reserve: u64 = want
        .lines()
        .find(|l| l.starts_with("GlobalReserve") && !l.contains("MiB"))
        .and_then(|l| l.split("total=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no raw GlobalReserve line:\n{want}"));
    assert!(reserve > 1_441_792, "the reserve is its minimum: {want}");
    let s = img.to_str().unwrap();
    assert_eq!(df_of_image(s), want);
    // After ubtrfs writes: more data, a subvolume.
    UBTRFS.stdout(&["subvolume", "create", s, "/sv"]);
    UBTRFS.stdout(&["mkdir", s, "/sv/d"]);
    assert_eq!(
        df_of_image(s),
        df_on_kernel_mount(&img),
        "after ubtrfs wrote"
    );
}

/// statfs(2) of a mount as `stat -f` prints it: blocks, free, available, block
/// size, name length (type and id are the mount's own).
fn statfs_of(mnt: &std::path::Path) -> String {
    sh(&format!("stat -f -c '%b %f %a %S %s %l' {}", mnt.display()))
}

/// One layout of devices for `filesystem_usage_and_statfs_match_the_kernel`.
struct Layout {
    what: &'static str,
    devices: usize,
    size: u64,
    mkfs: &'static [&'static str],
    /// Run in the kernel's mount (as `cd MNT; ...`).
    workload: &'static str,
    /// ubtrfs mounts it (RAID5/6 are not written by ubtrfs).
    mount: bool,
}

/// `ubtrfs filesystem usage` (text and `-b`) against `btrfs filesystem usage` on a
/// fresh read-write kernel mount of a copy of the same images, with the image paths
/// where the kernel names its loop devices; and statfs of a read-write and a
/// read-only ubtrfs mount against the kernel's read-write and read-only loop
/// mounts: free space inside data block groups counts on a read-write mount only.
/// Layouts: one device with free space left inside data chunks, two devices
/// (RAID0 data, RAID1 metadata), four (RAID5 data, RAID10 metadata), mixed block
/// groups, and data in two profiles.
#[test]
fn filesystem_usage_and_statfs_match_the_kernel() {
    if !require_root("filesystem_usage_and_statfs_match_the_kernel") {
        return;
    }
    let layouts = [
        Layout {
            what: "one device, a freed 700 MB file",
            devices: 1,
            size: 2 << 30,
            mkfs: &[],
            workload: "dd if=/dev/urandom of=big bs=1M count=700 status=none; mkdir d
                       for i in $(seq 200); do head -c 10000 /dev/urandom > d/f$i; done
                       sync; rm big",
            mount: true,
        },
        Layout {
            what: "RAID0 data, RAID1 metadata",
            devices: 2,
            size: 1 << 30,
            mkfs: &["-d", "raid0", "-m", "raid1"],
            workload: "head -c 50000000 /dev/urandom > f; echo small > s",
            mount: true,
        },
        Layout {
            what: "RAID5 data, RAID10 metadata",
            devices: 4,
            size: 1 << 30,
            mkfs: &["-d", "raid5", "-m", "raid10"],
            workload: "head -c 30000000 /dev/urandom > f",
            mount: false,
        },
        Layout {
            what: "mixed block groups",
            devices: 1,
            size: 512 << 20,
            mkfs: &["--mixed"],
            workload: "head -c 20000000 /dev/urandom > f; mkdir d; echo x > d/x",
            mount: true,
        },
        Layout {
            what: "data single and DUP",
            devices: 1,
            size: 1 << 30,
            mkfs: &[],
            workload: "head -c 150000000 /dev/urandom > f; sync
                       btrfs -q balance start -dconvert=dup,limit=1 . >/dev/null",
            mount: true,
        },
    ];
    for l in &layouts {
        let dir = tempfile::tempdir().unwrap();
        let imgs: Vec<PathBuf> = (0..l.devices)
            .map(|i| dir.path().join(format!("k{i}.img")))
            .collect();
        for i in &imgs {
            std::fs::File::create(i)
                .and_then(|f| f.set_len(l.size))
                .unwrap();
        }
        let names: Vec<String> = imgs.iter().map(|p| p.display().to_string()).collect();
        sh(&format!(
            "mkfs.btrfs -q -f {} {}",
            l.mkfs.join(" "),
            names.join(" ")
        ));
        let m = KernelMount::try_new(&imgs, "").unwrap_or_else(|e| panic!("{}: {e}", l.what));
        sh(&format!("set -e; cd {}; {}; sync", m.q(), l.workload));
        m.umount();
        // ubtrfs reads copies: the kernel's mount below may write to its images.
        let copies: Vec<PathBuf> = (0..l.devices)
            .map(|i| dir.path().join(format!("u{i}.img")))
            .collect();
        for (k, u) in imgs.iter().zip(&copies) {
            sh(&format!(
                "cp --sparse=always {} {}",
                k.display(),
                u.display()
            ));
        }
        let ulist: Vec<String> = copies.iter().map(|p| p.display().to_string()).collect();
        let arg = ulist.join(",");

        let m = KernelMount::try_new(&imgs, "").unwrap_or_else(|e| panic!("{}: {e}", l.what));
        let d = m.q();
        let mut want = sh(&format!(
            "btrfs filesystem usage {d}; btrfs filesystem usage -b {d}"
        ));
        let want_table = sh(&format!(
            "btrfs filesystem usage -T {d}; btrfs filesystem usage -T -b {d}"
        ));
        let want_statfs = statfs_of(&m.mnt);
        // `filesystem df` too (profiles in the kernel's order), with btrfs-progs's
        // warning on stderr when a type has block groups of several profiles.
        let want_df = sh(&format!(
            "btrfs filesystem df {d} 2>{e}; cat {e}; btrfs filesystem df -b {d} 2>/dev/null",
            e = dir.path().join("err").display()
        ));
        // The kernel names loop devices; ubtrfs the images (the same device order).
        for (loopdev, img) in m.devs().iter().zip(&ulist) {
            want = want.replace(&format!("   {loopdev}\t"), &format!("   {img}\t"));
        }
        // The table pads the path column to its longest path: compare it cell by
        // cell with the paths mapped (the linear form above is compared exactly).
        let mut want_table = want_table;
        for (loopdev, img) in m.devs().iter().zip(&ulist) {
            want_table = want_table.replace(&format!(" {loopdev} "), &format!(" {img} "));
        }
        m.umount();
        let cells = |t: &str| -> Vec<Vec<String>> {
            t.lines()
                .map(|l| {
                    // Rules are as wide as their column: one dash stands for each.
                    l.split_whitespace()
                        .map(|c| {
                            if c.chars().all(|ch| ch == '-') {
                                "-"
                            } else {
                                c
                            }
                        })
                        .map(str::to_string)
                        .collect()
                })
                .collect()
        };
        let got_table = [
            UBTRFS.stdout(&["filesystem", "usage", "-T", &arg]),
            UBTRFS.stdout(&["filesystem", "usage", "-T", "-b", &arg]),
        ]
        .concat();
        let (g, w) = (cells(&got_table), cells(&want_table));
        let first = (0..g.len().max(w.len())).find(|&i| g.get(i) != w.get(i));
        assert!(
            first.is_none(),
            "filesystem usage -T, {}: line {first:?} differs:\n{got_table}\n{want_table}",
            l.what
        );
        let got = [
            UBTRFS.stdout(&["filesystem", "usage", &arg]),
            UBTRFS.stdout(&["filesystem", "usage", "-b", &arg]),
        ]
        .concat();
        assert_eq!(got, want, "filesystem usage, {}", l.what);
        let got_df = sh(&format!(
            "{u} filesystem df {arg} 2>{e}; cat {e}; {u} filesystem df -b {arg} 2>/dev/null",
            u = env!("CARGO_BIN_EXE_ubtrfs"),
            e = dir.path().join("err").display()
        ));
        assert_eq!(got_df, want_df, "filesystem df, {}", l.what);
        let json: serde_json::Value = serde_json::from_str(&UBTRFS.stdout(&[
            "filesystem",
            "usage",
            "--format",
            "json",
            &arg,
        ]))
        .unwrap();
        assert_eq!(
            json["devices"].as_array().map(|d| d.len()),
            Some(l.devices),
            "{}: {json}",
            l.what
        );
        if !l.mount {
            continue;
        }
        let mut u = FuseMount::start(&UBTRFS, &copies, &["rw"]);
        let got_statfs = statfs_of(&u.mnt);
        assert!(u.unmount().success(), "{}", u.log());
        assert_eq!(got_statfs, want_statfs, "statfs, read-write, {}", l.what);
        let m = KernelMount::try_new(&imgs, "ro").unwrap_or_else(|e| panic!("{}: {e}", l.what));
        let want_ro = statfs_of(&m.mnt);
        m.umount();
        let mut u = FuseMount::start(&UBTRFS, &copies, &["ro"]);
        let got_ro = statfs_of(&u.mnt);
        assert!(u.unmount().success(), "{}", u.log());
        assert_eq!(got_ro, want_ro, "statfs, read-only, {}", l.what);
    }
}

#[test]
fn text_output_matches_kernel_tools() {
    if !require_root("text_output_matches_kernel_tools") {
        return;
    }
    let (_dir, img, m) = make_image();
    let d = m.mnt.display().to_string();
    let files = [
        "rand",
        "rand2",
        "text",
        "tiny",
        "dir/sub/f",
        "dir/prealloc",
        "sv/text",
        "snap/text",
    ];
    let mut kernel_fiemap = Vec::new();
    for f in files {
        kernel_fiemap.push(sh(&format!("filefrag -v {d}/{f}")));
    }
    let kernel_du = sh(&format!("btrfs filesystem du {d}"));
    let kernel_du_s = sh(&format!("btrfs filesystem du -s --raw {d} {d}/sv {d}/snap"));
    m.umount();
    let kernel_df = df_on_kernel_mount(&img);
    let img = img.display().to_string();
    let kernel_super = sh(&format!("btrfs inspect-internal dump-super {img}"));
    for (f, want) in files.iter().zip(kernel_fiemap) {
        let got = UBTRFS
            .stdout(&["inspect", "fiemap", "-v", &img, &format!("/{f}")])
            .replace(&format!(" /{f}"), &format!(" {d}/{f}"))
            .replace(&format!("/{f}: "), &format!("{d}/{f}: "));
        let got = got.replacen(&format!("{d}{d}"), &d, 2);
        assert_eq!(got, want, "filefrag -v {f}");
    }
    let to_kernel_paths = |s: String| -> String {
        s.lines()
            .map(|l| match l.rfind("  /") {
                Some(i) => {
                    let p = &l[i + 2..];
                    let host = if p == "/" {
                        d.clone()
                    } else {
                        format!("{d}{p}")
                    };
                    format!("{}  {host}\n", &l[..i])
                }
                None => format!("{l}\n"),
            })
            .collect()
    };
    assert_eq!(
        to_kernel_paths(UBTRFS.stdout(&["filesystem", "du", &img, "/"])),
        kernel_du
    );
    assert_eq!(
        to_kernel_paths(UBTRFS.stdout(&[
            "filesystem",
            "du",
            "-s",
            "--raw",
            &img,
            "/",
            "/sv",
            "/snap"
        ])),
        kernel_du_s
    );
    assert_eq!(
        UBTRFS.stdout(&["inspect", "dump-super", &img]),
        kernel_super
    );
    assert_eq!(df_of_image(&img), kernel_df, "filesystem df");
    // `filesystem show` of the unmounted image, labelled by ubtrfs, in both units.
    UBTRFS.stdout(&["filesystem", "label", &img, "shown"]);
    for raw in [&[][..], &["--raw"]] {
        let mut args = vec!["filesystem", "show"];
        args.extend_from_slice(raw);
        let kernel_show = sh(&format!("btrfs {} {img}", args.join(" ")));
        args.push(&img);
        assert_eq!(UBTRFS.stdout(&args), kernel_show, "filesystem show {raw:?}");
        assert!(kernel_show.starts_with("Label: 'shown'"), "{kernel_show}");
    }
}
