//! An ordinary user, without root, makes an image, mounts it read-write through the
//! setuid `fusermount3` (as fuse2fs users do for ext4), writes, and unmounts with
//! `fusermount3 -u`; root then finds the image clean for `btrfs check` and the
//! kernel shows the user's files. A mount the helper refuses (`allow_other`
//! without `user_allow_other` in /etc/fuse.conf) is reported by the exit status,
//! with nothing mounted.
//!
//! Runs as root and drops to `nobody` for the user's steps. Distributions make
//! /dev/fuse 0666; where it is not (some containers), it is for the test's length.
//! Needs root; skipped with a line outside CI.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use ubtrfs_sim::host::{bash_in, btrfs_check, require_fuse, serial, shell_quote};
use ubtrfs_sim::mount::{is_mounted, KernelMount};

/// /dev/fuse usable by everyone while it lives; the old mode back on drop.
struct OpenFuse(Option<u32>);

impl OpenFuse {
    fn new() -> OpenFuse {
        let p = Path::new("/dev/fuse");
        let mode = std::fs::metadata(p)
            .expect("/dev/fuse")
            .permissions()
            .mode()
            & 0o7777;
        if mode & 0o006 == 0o006 {
            return OpenFuse(None);
        }
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        OpenFuse(Some(mode))
    }
}

impl Drop for OpenFuse {
    fn drop(&mut self) {
        if let Some(m) = self.0 {
            let _ = std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(m));
        }
    }
}

#[test]
fn an_ordinary_user_mounts_writes_and_unmounts_an_image_they_own() {
    if !require_fuse("an_ordinary_user_mounts_writes_and_unmounts_an_image_they_own") {
        return;
    }
    let _serial = serial();
    let _fuse = OpenFuse::new();
    // Everything the user touches is theirs: a directory only they write, and a
    // copy of the binary (the build directory may sit below one they cannot enter).
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::copy(env!("CARGO_BIN_EXE_ubtrfs"), home.join("ubtrfs")).expect("copy the binary");
    let h = shell_quote(&home);
    let (out, err) = bash_in(
        dir.path(),
        &format!(
            r#"set -e
            chown -R nobody:nogroup {h}
            as() {{ setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"; }}
            as bash -c 'set -e
                cd {h}
                mkdir src mnt
                echo seed > src/seed
                ./ubtrfs mkfs -q -b 512M -r src disk.img
                ./ubtrfs mount disk.img mnt -o commit=5
                grep -q " $PWD/mnt fuse.ubtrfs rw," /proc/mounts
                head -c 300K /dev/urandom > mnt/data
                sha256sum mnt/data | cut -d" " -f1 > data.sum
                mkdir mnt/d; echo hi > mnt/d/f; ln -s d/f mnt/l; ln mnt/d/f mnt/hard
                setfattr -n user.note -v yes mnt/d/f
                rm mnt/seed
                ./ubtrfs mkfs -q -b 256M other.img; mkdir mnt2
                if ./ubtrfs mount other.img mnt2 -o allow_other 2>err.txt; then
                    echo "allow_other was let through"; exit 1
                fi
                ls -A mnt > ls.txt
                fusermount3 -u mnt
                flock disk.img true
                echo user-done'
            "#
        ),
    );
    assert!(out.contains("user-done"), "the user's steps: {out}\n{err}");
    let refused = std::fs::read_to_string(home.join("err.txt")).unwrap_or_default();
    assert!(
        refused.contains("allow_other") || refused.contains("fusermount3"),
        "the refused mount says why: {refused}"
    );
    assert!(!is_mounted(&home.join("mnt2")), "mnt2 stayed unmounted");
    assert_eq!(
        std::fs::read_to_string(home.join("ls.txt")).unwrap_or_default(),
        "d\ndata\nhard\nl\n",
        "what the user's mount listed"
    );

    // Root's side: clean, and the kernel shows the user's files as theirs.
    let img = home.join("disk.img");
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("{e}"));
    let k = KernelMount::new(&img, "ro");
    let sum = std::fs::read_to_string(home.join("data.sum")).unwrap_or_default();
    let (out, err) = bash_in(
        &k.mnt,
        &format!(
            "set -e
             test \"$(sha256sum data | cut -d' ' -f1)\" = {sum}
             stat -c '%n %u:%g %h' . d d/f hard l
             readlink l; cat d/f; getfattr --only-values -n user.note d/f; echo
             ls -A",
            sum = sum.trim()
        ),
    );
    k.umount();
    assert_eq!(
        out,
        ". 65534:65534 1\nd 65534:65534 1\nd/f 65534:65534 2\nhard 65534:65534 2\n\
         l 65534:65534 1\nd/f\nhi\nyes\nd\ndata\nhard\nl\n",
        "the kernel's view: {err}"
    );
}
