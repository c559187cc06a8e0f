//! Output text compared with the kernel tools on a fresh kernel-made image (root):
//! `ubtrfs inspect fiemap -v` vs `filefrag -v`, `ubtrfs filesystem du` vs
//! `btrfs filesystem du`, `ubtrfs inspect dump-super` vs `btrfs inspect-internal
//! dump-super`, `ubtrfs filesystem show` vs `btrfs filesystem show`, `ubtrfs
//! filesystem df` of the image vs `btrfs filesystem df` of its kernel mount. The loop mount is undone on drop, also when an assertion fails. Needs
//! root (`ubtrfs_sim::host::require_root`).

use std::path::PathBuf;
use ubtrfs_sim::host::{require_root, sh, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, KernelMount};

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
