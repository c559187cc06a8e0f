//! Output text compared with the kernel tools on a fresh kernel-made image (root):
//! `ubtrfs inspect fiemap -v` vs `filefrag -v`, `ubtrfs filesystem du` vs
//! `btrfs filesystem du`, `ubtrfs inspect dump-super` vs `btrfs inspect-internal
//! dump-super`. The loop mount is undone on drop, also when an assertion fails.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Mounted {
    _dir: tempfile::TempDir,
    img: PathBuf,
    mnt: PathBuf,
    mounted: bool,
}

impl Mounted {
    fn umount(&mut self) {
        if self.mounted {
            sh(&format!("umount {}", self.mnt.display()));
            self.mounted = false;
        }
    }
    fn mount(&mut self, opts: &str) {
        sh(&format!(
            "mount -o loop,{opts} {} {}",
            self.img.display(),
            self.mnt.display()
        ));
        self.mounted = true;
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
    }
}

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        o.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ubtrfs(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_ubtrfs"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn make_image() -> Mounted {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    sh(&format!(
        "truncate -s 1G {} && mkfs.btrfs -q -f {}",
        img.display(),
        img.display()
    ));
    let mut m = Mounted {
        _dir: dir,
        img,
        mnt,
        mounted: false,
    };
    m.mount("compress=zstd");
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
    m
}

#[test]
fn text_output_matches_kernel_tools() {
    let mut m = make_image();
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
    let img = m.img.display().to_string();
    let kernel_super = sh(&format!("btrfs inspect-internal dump-super {img}"));
    for (f, want) in files.iter().zip(kernel_fiemap) {
        let got = ubtrfs(&["inspect", "fiemap", "-v", &img, &format!("/{f}")])
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
        to_kernel_paths(ubtrfs(&["filesystem", "du", &img, "/"])),
        kernel_du
    );
    assert_eq!(
        to_kernel_paths(ubtrfs(&[
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
    assert_eq!(ubtrfs(&["inspect", "dump-super", &img]), kernel_super);
    let _ = Path::new(&img);
}
