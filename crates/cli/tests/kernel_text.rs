//! Output text compared with the kernel tools on a fresh kernel-made image (root):
//! `ubtrfs inspect fiemap -v` vs `filefrag -v`, `ubtrfs filesystem du` vs
//! `btrfs filesystem du`, `ubtrfs inspect dump-super` vs `btrfs inspect-internal
//! dump-super`, `ubtrfs filesystem show` vs `btrfs filesystem show`. The loop mount is undone on drop, also when an assertion fails. Needs
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
