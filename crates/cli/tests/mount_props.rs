//! Subvolume properties on a mounted filesystem: `ubtrfs property get|set MNT PATH
//! ro` and `ubtrfs subvolume set-default|get-default MNT` ask the mount's process
//! (never a second writer), with the kernel's rules: the flag only on a subvolume's
//! root, set by its owner or CAP_FOWNER, the default by CAP_SYS_ADMIN; a read-only
//! subvolume refuses writes at once, and writable again takes them. After the
//! unmount the kernel's btrfs-progs see the same flag and the same default line.
//! `ubtrfs subvolume show MNT PATH` prints what the offline command prints after
//! the unmount, a snapshot list longer than one answer included.
//!
//! Needs root (/dev/fuse, loop devices); skipped with a line outside CI.

use std::path::Path;
use ubtrfs_sim::host::{bash_in, btrfs_check, require_fuse, serial, shell_quote, Ubtrfs};
use ubtrfs_sim::mount::{mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

#[test]
fn subvolume_properties_through_the_mount_as_btrfs_progs_sees_them() {
    if !require_fuse("subvolume_properties_through_the_mount_as_btrfs_progs_sees_them") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    // allow_other: the other user's steps reach the server (and its checks).
    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw,allow_other"]);
    let m = shell_quote(&fm.mnt);
    let script = format!(
        r#"set +e
        U={u}
        M={m}
        as() {{ setpriv --reuid=1234 --regid=1234 --clear-groups -- "$@"; }}
        step() {{
            local name=$1; shift
            if out=$("$@" 2>&1); then echo "$name: ok $out"; else
                echo "$name: $(echo "$out" | grep -o 'Permission denied\|Operation not permitted\|Read-only file system\|Invalid argument\|not a subvolume\|No such file or directory' | head -1)"
            fi
        }}
        $U subvolume create $M a >/dev/null && $U subvolume create $M b >/dev/null || echo setup failed
        mkdir $M/d; echo x > $M/a/f
        step get-a $U property get $M a ro
        step set-a $U property set $M a ro true
        step write-ro sh -c "echo y > $M/a/g"
        step get-a-ro $U property get $M a ro
        step get-dir $U property get $M d ro
        step get-top $U property get $M / ro
        step user-set as $U property set $M b ro true
        step user-default as $U subvolume set-default $M b
        step default-missing $U subvolume set-default $M 999
        step get-default-top $U subvolume get-default $M
        step set-default $U subvolume set-default $M b
        step get-default $U subvolume get-default $M
        step set-a-rw $U property set $M a ro false
        step write-rw sh -c "echo y > $M/a/g"
        step set-a-ro-again $U property set $M a ro true
        $U subvolume create $M c >/dev/null
        python3 -c "
import os
for i in range(3000):
    open('$M/c/f%d' % i, 'w').write('x' * 3000)
"
        $U subvolume delete $M c >/dev/null
        step sync $U subvolume sync $M
        "#,
        u = env!("CARGO_BIN_EXE_ubtrfs"),
    );
    let (out, err) = bash_in(Path::new("/"), &script);
    let st = fm.unmount();
    assert!(st.success(), "server exit {st}: {}", fm.log());
    let want = "get-a: ok ro=false\n\
                set-a: ok \n\
                write-ro: Read-only file system\n\
                get-a-ro: ok ro=true\n\
                get-dir: not a subvolume\n\
                get-top: ok ro=false\n\
                user-set: Operation not permitted\n\
                user-default: Operation not permitted\n\
                default-missing: No such file or directory\n\
                get-default-top: ok ID 5 (FS_TREE)\n\
                set-default: ok \n";
    assert!(
        out.starts_with(want),
        "outcomes on the ubtrfs mount:\n{out}\nwanted first:\n{want}\n{err}"
    );
    let default_line = out
        .lines()
        .find_map(|l| l.strip_prefix("get-default: ok "))
        .unwrap_or_else(|| panic!("no get-default line: {out}"))
        .to_string();
    assert!(
        default_line.starts_with("ID 257 gen ") && default_line.ends_with(" top level 5 path b"),
        "get-default: {default_line}"
    );
    assert!(
        out.contains("set-a-rw: ok \nwrite-rw: ok \nset-a-ro-again: ok \n"),
        "after making it writable again:\n{out}"
    );
    // `subvolume sync` waited for the mount's cleaner (or it had finished already):
    // no dead root is left after the unmount.
    assert!(out.contains("sync: ok"), "subvolume sync: {out}");
    let roots = ubtrfs_sim::host::sh(&format!(
        "btrfs inspect-internal dump-tree -t root {}",
        shell_quote(&img)
    ));
    assert!(
        !roots.contains("ORPHAN_ITEM"),
        "a deleted subvolume left after subvolume sync:\n{roots}"
    );

    // btrfs-progs on the kernel's mount of the image see the same.
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("{e}"));
    let k = KernelMount::new(&img, "ro,subvolid=5");
    let (kout, kerr) = bash_in(
        &k.mnt,
        "btrfs property get a ro; btrfs subvolume get-default .; cat a/f a/g",
    );
    k.umount();
    assert_eq!(
        kout,
        format!("ro=true\n{default_line}\nx\ny\n"),
        "the kernel's view: {kerr}"
    );
    // A plain kernel mount opens the default subvolume, b (empty).
    let k = KernelMount::new(&img, "ro");
    let listed = std::fs::read_dir(&k.mnt)
        .map(|d| d.count())
        .unwrap_or(usize::MAX);
    k.umount();
    assert_eq!(listed, 0, "a plain mount opens the default subvolume b");
}

/// `ubtrfs subvolume show MNT PATH` asks the mount's process (its snapshot list in
/// several answers when it is long) and prints what the offline command prints of
/// the same image after the unmount; btrfs-progs on the kernel's mount lists as
/// many snapshots; a plain directory is "Not a Btrfs subvolume".
#[test]
fn subvolume_show_through_the_mount_as_offline() {
    if !require_fuse("subvolume_show_through_the_mount_as_offline") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("img");
    mkfs_btrfs(&img, 1 << 30, &[]);
    let mut fm = FuseMount::start(&UBTRFS, std::slice::from_ref(&img), &["rw"]);
    let m = shell_quote(&fm.mnt);
    // 120 snapshots with long names: more than one answer's worth of paths.
    let setup = format!(
        r#"set -e
        U={u}; M={m}
        $U subvolume create $M a >/dev/null
        echo data > $M/a/f; mkdir $M/d
        $U subvolume create $M a/inner >/dev/null
        for i in $(seq 1 120); do
            ro=; [ $((i % 2)) = 0 ] && ro=-r
            $U subvolume snapshot $ro $M a d/snapshot-with-a-long-name-to-page-through-$i >/dev/null
        done
        echo setup done
        "#,
        u = env!("CARGO_BIN_EXE_ubtrfs"),
    );
    let (out, err) = bash_in(Path::new("/"), &setup);
    assert!(
        out.contains("setup done"),
        "setup through the mount: {out}{err}"
    );
    let paths = [
        "a",
        "/",
        "a/inner",
        "d/snapshot-with-a-long-name-to-page-through-7",
        "d/snapshot-with-a-long-name-to-page-through-8",
    ];
    let mnt = fm.mnt.to_str().expect("utf-8").to_string();
    let mounted: Vec<String> = paths
        .iter()
        .map(|p| UBTRFS.stdout(&["subvolume", "show", &mnt, p]))
        .collect();
    let (ok, _, not_sub) = UBTRFS.run(&["subvolume", "show", &mnt, "d"]);
    assert!(
        !ok && not_sub.contains("d: Not a Btrfs subvolume"),
        "{not_sub}"
    );
    let st = fm.unmount();
    assert!(st.success(), "server exit {st}: {} {err}", fm.log());
    let img_s = img.to_str().expect("utf-8");
    for (p, on) in paths.iter().zip(&mounted) {
        let off = UBTRFS.stdout(&["subvolume", "show", img_s, p]);
        assert_eq!(
            on, &off,
            "subvolume show {p}: through the mount, then offline"
        );
    }
    assert_eq!(
        mounted[0].matches("snapshot-with-a-long-name").count(),
        120,
        "{}",
        mounted[0]
    );
    btrfs_check(&img, None).unwrap_or_else(|e| panic!("{e}"));
    let k = KernelMount::new(&img, "ro");
    let (kout, kerr) = bash_in(&k.mnt, "btrfs subvolume show a | grep -c snapshot-with");
    k.umount();
    assert_eq!(kout.trim(), "120", "btrfs-progs' snapshot list: {kerr}");
}
