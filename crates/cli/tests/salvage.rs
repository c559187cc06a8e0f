//! `ubtrfs extract` on damaged images, against `btrfs restore -i -s -x -m -S` and a
//! kernel mount (`-o ro,rescue=all`) of the same image, in the same run. The kernel
//! makes the image (4 KiB nodes, so the trees have several levels; a subvolume;
//! two commits, so a backup root holds nearly everything); then each case damages a
//! copy of it in every metadata copy (both DUP copies zeroed) or in its data:
//! - a leaf holding a directory's DIR_INDEX items;
//! - a leaf holding a big file's extent items;
//! - a level-1 node of the subvolume tree (the last commit rewrote it: its older
//!   version, under a backup root, gives back all of the undamaged image's entries);
//! - the root tree root (a backup root in the superblock is intact);
//! - a data sector (its checksum no longer matches);
//! - a stale leaf (a lost write): after a later commit added entries to /, the
//!   rewritten leaf holding them is replaced by its older version, checksum valid,
//!   in both copies ("parent transid verify failed"; btrfs restore reads the older
//!   copy, the kernel gives EIO) and in one copy (the other copy is read: nothing
//!   lost).
//!
//! For each: ubtrfs restores every file, directory and symlink that btrfs restore
//! restores, at the same path with the same bytes, and every file the kernel mount
//! reads in full; it reports each loss on stderr and exits 3. `ubtrfs mount -o ro`
//! of the damaged image lists and reads only what extract saved, the same bytes,
//! and every file the kernel reads (a file whose extent items or data are lost
//! gives EIO, as on the kernel without rescue=ignoredatacsums); it logs the loss. The undamaged image
//! extracts with exit 0 and no report. Files whose directory entries were lost are
//! counted: ubtrfs finds them through their back references.
//!
//! Needs root (loop devices); skipped with a line outside CI.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use ubtrfs_sim::host::{bash_in, require_root, serial, sh, shell_quote, Ubtrfs};
use ubtrfs_sim::mount::{kernel_writes, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

const WORKLOAD: &str = r#"
python3 - <<'PY'
import os, random
random.seed(3)
for d in ['a', 'b', 'c/deep']:
    os.makedirs(d, exist_ok=True)
    for i in range(250):
        open(f'{d}/file{i}', 'w').write(f'{d} {i} ' + 'x' * random.randrange(10, 3000))
open('big', 'wb').write(random.randbytes(3 << 20))
os.symlink('big', 'link')
PY
btrfs -q subvolume create sv
cp -r a sv/
sync
touch a/file1
sync
"#;

/// Every regular file, directory and symlink below `dir`: relative path -> what it
/// holds ("d", "l:TARGET", or the file's bytes as "f:SHA256").
fn tree(dir: &Path) -> BTreeMap<String, String> {
    // A damaged mount makes find fail on some entries: take what it lists.
    let (out, _) = bash_in(
        dir,
        "find . -mindepth 1 \\( -type d -printf 'd %P\\n' \\) -o \\( -type l -printf 'l %P\\n' \\) \
         -o \\( -type f -printf 'f %P\\n' \\)",
    );
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let (kind, p) = line.split_at(2);
        let v = match kind.trim() {
            "d" => "d".to_string(),
            "l" => match std::fs::read_link(dir.join(p)) {
                Ok(t) => format!("l:{}", t.display()),
                Err(_) => continue,
            },
            _ => match std::fs::read(dir.join(p)) {
                Ok(b) => format!("f:{}", sha(&b)),
                Err(_) => continue,
            },
        };
        m.insert(p.to_string(), v);
    }
    m
}

fn sha(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(b))
}

/// Zeroes both copies of tree block `logical` (DUP metadata).
fn wipe_block(img: &Path, logical: u64) {
    let map = sh(&format!(
        "btrfs-map-logical -l {logical} {}",
        shell_quote(img)
    ));
    let mut n = 0;
    for line in map.lines() {
        let Some(p) = line
            .split_whitespace()
            .skip_while(|w| *w != "physical")
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        sh(&format!(
            "dd if=/dev/zero of={} bs=4096 seek={} count=1 conv=notrunc status=none",
            shell_quote(img),
            p / 4096
        ));
        n += 1;
    }
    assert_eq!(n, 2, "two copies of {logical}: {map}");
}

/// Physical offsets of every copy of tree block `logical`.
fn copies(img: &Path, logical: u64) -> Vec<u64> {
    let map = sh(&format!(
        "btrfs-map-logical -l {logical} {}",
        shell_quote(img)
    ));
    let v: Vec<u64> = map
        .lines()
        .filter_map(|line| {
            line.split_whitespace()
                .skip_while(|w| *w != "physical")
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .collect();
    assert!(!v.is_empty(), "no copy of {logical}: {map}");
    v
}

/// A lost write: the older block `old_logical` of image `old` (an earlier state of
/// the same filesystem) is written over the first `n` copies of block `logical` of
/// `img`, with its header's address changed to `logical` and its checksum (crc32c)
/// recomputed: the block is intact but older than its parent expects ("parent
/// transid verify failed").
fn write_stale(old: &Path, old_logical: u64, img: &Path, logical: u64, n: usize) {
    use std::os::unix::fs::FileExt;
    let mut data = vec![0u8; 4096];
    let from = std::fs::File::open(old).expect("open old image");
    from.read_exact_at(&mut data, copies(old, old_logical)[0])
        .expect("read old block");
    data[48..56].copy_from_slice(&logical.to_le_bytes());
    let c = ubtrfs_format::csum::CsumType::Crc32c.compute(&data[32..]);
    data[..32].copy_from_slice(&c);
    let to = std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .expect("open image");
    for p in copies(img, logical).into_iter().take(n) {
        to.write_all_at(&data, p).expect("write stale block");
    }
}

/// The leaves of the fs tree: (address, generation, first key, the leaf's dump).
fn leaves(img: &Path) -> Vec<(u64, u64, String, String)> {
    let dump = sh(&format!(
        "btrfs inspect-internal dump-tree -t 5 {}",
        shell_quote(img)
    ));
    let mut v: Vec<(u64, u64, String, String)> = Vec::new();
    let mut in_leaf = false;
    for line in dump.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() == Some(&"leaf") && w.get(2) == Some(&"items") {
            let gen = w
                .iter()
                .skip_while(|x| **x != "generation")
                .nth(1)
                .and_then(|g| g.parse().ok())
                .unwrap_or(0);
            v.push((w[1].parse().unwrap_or(0), gen, String::new(), String::new()));
            in_leaf = true;
        } else if w.first() == Some(&"node") {
            in_leaf = false;
        } else if in_leaf {
            if let Some(l) = v.last_mut() {
                if l.2.is_empty() && line.contains("item 0 key ") {
                    l.2 = line
                        .split("key ")
                        .nth(1)
                        .and_then(|k| k.split(')').next())
                        .unwrap_or("")
                        .to_string();
                }
                l.3.push_str(line);
                l.3.push('\n');
            }
        }
    }
    v
}

/// A leaf of `newer` (written in a later commit than `older`'s) holding `needle`
/// whose first key is that of a leaf of `older` with other contents: (its address,
/// the older leaf's address).
fn rewritten_leaf(older: &Path, newer: &Path, needles: &[&str]) -> (u64, u64) {
    let old = leaves(older);
    let new = leaves(newer);
    let old_gen = old.iter().map(|l| l.1).max().unwrap_or(0);
    for n in &new {
        if n.1 <= old_gen || !needles.iter().all(|x| n.3.contains(x)) {
            continue;
        }
        if let Some(o) = old.iter().find(|o| o.2 == n.2 && o.3 != n.3) {
            return (n.0, o.0);
        }
    }
    panic!("no leaf holding {needles:?} was rewritten between the two images");
}

/// The first leaf of tree `tree` holding a key (`objectid` `ty` ...), and the first
/// level-1 node.
fn find_blocks(img: &Path, objectid: u64, ty: &str) -> (u64, u64) {
    let dump = sh(&format!(
        "btrfs inspect-internal dump-tree -t 5 {}",
        shell_quote(img)
    ));
    let (mut leaf, mut node, mut cur) = (None, None, 0u64);
    for line in dump.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first() {
            Some(&"leaf") => cur = w[1].parse().unwrap_or(0),
            Some(&"node") if w.get(2) == Some(&"level") && w.get(3) == Some(&"1") => {
                node.get_or_insert(w[1].parse::<u64>().unwrap_or(0));
            }
            _ => {}
        }
        if leaf.is_none()
            && line.contains(&format!("key ({objectid} {ty} "))
            && line.contains("item ")
        {
            leaf = Some(cur);
        }
    }
    (
        leaf.expect("a leaf with the key"),
        node.expect("a level-1 node"),
    )
}

/// (tree, exit code, stderr) of `ubtrfs extract IMG DEST`.
fn ubtrfs_extract(img: &Path, dest: &Path) -> (BTreeMap<String, String>, Option<i32>, String) {
    let o = UBTRFS.output(&[
        "extract",
        img.to_str().expect("utf-8"),
        dest.to_str().expect("utf-8"),
    ]);
    (
        tree(dest),
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// What `btrfs restore -i -s -x -m -S` saves.
fn btrfs_restore(img: &Path, dest: &Path) -> BTreeMap<String, String> {
    std::fs::create_dir_all(dest).expect("mkdir");
    let _ = Command::new("btrfs")
        .args(["restore", "-i", "-s", "-x", "-m", "-S"])
        .arg(img)
        .arg(dest)
        .output();
    tree(dest)
}

/// What the kernel reads of the image (`-o ro,rescue=all`), if it mounts it.
fn kernel_reads(img: &Path) -> BTreeMap<String, String> {
    match KernelMount::try_new(&[img], "ro,rescue=all") {
        Ok(k) => {
            let t = tree(&k.path(""));
            k.umount();
            t
        }
        Err(_) => BTreeMap::new(),
    }
}

/// What `ubtrfs mount -o ro` of the image shows and reads (the tree as [`tree`]
/// gives it), how many regular files it lists that cannot be read, and the
/// server's stderr. The server must exit 0 after the unmount.
fn mount_reads(img: &Path) -> (BTreeMap<String, String>, usize, String) {
    let mut m = FuseMount::start(&UBTRFS, &[img], &[]);
    let t = tree(&m.mnt);
    let (files, _) = bash_in(&m.mnt, "find . -type f | wc -l");
    let files: usize = files.trim().parse().unwrap_or(0);
    let unreadable = files
        - t.values()
            .filter(|v| v.starts_with("f:"))
            .count()
            .min(files);
    let st = m.unmount();
    let log = m.log();
    assert!(st.success(), "ubtrfs mount exited with {st}: {log}");
    (t, unreadable, log)
}

/// Every entry of `oracle` is in `ours` with the same contents; returns how many
/// `ours` has beyond it.
/// [`tree`]'s value for an empty file.
const EMPTY_FILE: &str = "f:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn covers(what: &str, oracle: &BTreeMap<String, String>, ours: &BTreeMap<String, String>) -> usize {
    let mut missing = Vec::new();
    for (p, v) in oracle {
        match ours.get(p) {
            Some(o) if o == v => {}
            // btrfs restore gives up on a file whose extent items (or inode item)
            // it cannot read and leaves it empty; ubtrfs writes what is left (the
            // readable extents, holes of the inode's size) and reports the loss.
            Some(o) if v == EMPTY_FILE && o.starts_with("f:") => {}
            Some(o) => missing.push(format!("{p}: {what} {v}, ubtrfs {o}")),
            None => missing.push(format!("{p}: only {what} has it")),
        }
    }
    assert!(
        missing.is_empty(),
        "{} entries {what} saved that ubtrfs did not:\n{}",
        missing.len(),
        missing
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    ours.len() - oracle.len().min(ours.len())
}

#[test]
fn extract_salvages_past_damage() {
    if !require_root("extract_salvages_past_damage") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.img");
    mkfs_btrfs(&base, 512 << 20, &["-n", "4096"]);
    kernel_writes(&base, WORKLOAD, "workload");
    let (a_ino, big_ino): (u64, u64) = {
        let k = KernelMount::new(&base, "ro");
        let ino = |p: &str| {
            std::fs::metadata(k.path(p))
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .expect("stat")
        };
        let i = (ino("a"), ino("big"));
        k.umount();
        i
    };

    // Undamaged: everything, exit 0, nothing reported.
    let (full, code, err) = ubtrfs_extract(&base, &dir.path().join("full"));
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("lost"), "{err}");
    assert!(full.len() > 1000, "{}", full.len());

    let (dir_leaf, node) = find_blocks(&base, a_ino, "DIR_INDEX");
    let (extent_leaf, _) = find_blocks(&base, big_ino, "EXTENT_DATA");
    let root_tree = sh(&format!(
        "btrfs inspect-internal dump-super {} | awk '$1 == \"root\" {{print $2}}'",
        shell_quote(&base)
    ))
    .trim()
    .parse::<u64>()
    .expect("root tree root");
    let big_logical: u64 = {
        let k = KernelMount::new(&base, "ro");
        let out = sh(&format!(
            "filefrag -v {} | awk '$1 == \"0:\" {{print $4}}'",
            shell_quote(&k.path("big"))
        ));
        k.umount();
        out.trim()
            .trim_end_matches("..")
            .parse::<u64>()
            .expect("filefrag")
            * 4096
    };

    // Later commits of the same filesystem (five: older generations are in no
    // backup root): new entries in /. The last rewritten leaf
    // holding them, replaced by the older leaf, is a lost write.
    let newer = dir.path().join("newer.img");
    std::fs::copy(&base, &newer).expect("copy");
    kernel_writes(
        &newer,
        "for i in 0 1 2 3 4; do echo new $i > new$i; sync; done",
        "newer",
    );
    let (full_newer, code, err) = ubtrfs_extract(&newer, &dir.path().join("full-newer"));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(full_newer.len(), full.len() + 5);
    // The leaf holding the new entries' DIR_INDEX items.
    let (stale_at, older_leaf) = rewritten_leaf(&base, &newer, &["(256 DIR_INDEX ", "name: new0"]);
    let (base2, base3) = (base.clone(), base.clone());

    older_generations(&newer, &dir.path().join("generations"));

    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, &Path, Damage)> = vec![
        (
            "stale leaf",
            &newer,
            Box::new(move |img| write_stale(&base2, older_leaf, img, stale_at, 2)),
        ),
        (
            "stale leaf in one copy",
            &newer,
            Box::new(move |img| write_stale(&base3, older_leaf, img, stale_at, 1)),
        ),
        (
            "directory index leaf",
            &base,
            Box::new(move |img| wipe_block(img, dir_leaf)),
        ),
        (
            "extent leaf",
            &base,
            Box::new(move |img| wipe_block(img, extent_leaf)),
        ),
        (
            "level-1 node",
            &base,
            Box::new(move |img| wipe_block(img, node)),
        ),
        (
            "root tree root",
            &base,
            Box::new(move |img| wipe_block(img, root_tree)),
        ),
        (
            "data sector",
            &base,
            Box::new(move |img| {
                let map = sh(&format!(
                    "btrfs-map-logical -l {} {} 2>&1",
                    big_logical,
                    shell_quote(img)
                ));
                let p: u64 = map
                    .split_whitespace()
                    .skip_while(|w| *w != "physical")
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("physical of big at {big_logical}: {map}"));
                sh(&format!(
                    "printf 'XXXX' | dd of={} bs=1 seek={} conv=notrunc status=none",
                    shell_quote(img),
                    p + 8192 + 100
                ));
            }),
        ),
    ];
    for (name, source, damage) in cases {
        let case = dir.path().join(name.replace(' ', "-"));
        std::fs::create_dir_all(&case).expect("mkdir");
        let img = case.join("img");
        std::fs::copy(source, &img).expect("copy");
        damage(&img);
        let (ours, code, err) = ubtrfs_extract(&img, &case.join("ubtrfs"));
        if name == "stale leaf in one copy" {
            // The other DUP copy is intact: nothing lost, the bad copy named.
            assert_eq!(code, Some(0), "{name}: exit status\n{err}");
            assert!(
                err.contains("stale block") && err.contains("used copy 2"),
                "{err}"
            );
            assert_eq!(ours, full_newer, "{name}");
            let restore = btrfs_restore(&img, &case.join("restore"));
            covers(&format!("{name}: btrfs restore"), &restore, &ours);
            eprintln!(
                "{name}: ubtrfs {} entries, btrfs restore {}, undamaged {}",
                ours.len(),
                restore.len(),
                full_newer.len()
            );
            continue;
        }
        assert_eq!(code, Some(3), "{name}: exit status\n{err}");
        assert!(
            err.contains("ubtrfs: lost:") || err.contains("ubtrfs: damaged:"),
            "{name}: no loss reported\n{err}"
        );
        let restore = btrfs_restore(&img, &case.join("restore"));
        let kernel = kernel_reads(&img);
        let beyond_restore = covers(&format!("{name}: btrfs restore"), &restore, &ours);
        covers(&format!("{name}: the kernel"), &kernel, &ours);
        // The read-only mount: what it lists and reads is what extract saved, and
        // it reads every file the kernel reads; the loss is in its log.
        let (mounted, unreadable, log) = mount_reads(&img);
        let mut kernel_strict = kernel.clone();
        if name == "data sector" {
            // rescue=all ignores data checksums; the mount, as a plain kernel mount,
            // answers EIO.
            assert!(kernel_strict.remove("big").is_some());
            assert!(
                !mounted.contains_key("big") && unreadable == 1,
                "{name}: {log}"
            );
        }
        if name == "extent leaf" {
            // Its stat or read needs the lost leaf: EIO, not zeros.
            assert!(!mounted.contains_key("big"), "{name}: {log}");
        }
        covers(
            &format!("{name}: the kernel (vs the mount)"),
            &kernel_strict,
            &mounted,
        );
        let missing: Vec<String> = mounted
            .iter()
            .filter(|(p, v)| ours.get(*p) != Some(v))
            .map(|(p, v)| format!("{p}: mount {v}, extract {:?}", ours.get(p)))
            .take(10)
            .collect();
        assert!(
            missing.is_empty(),
            "{name}: the mount shows what extract did not save: {missing:?}"
        );
        if name != "data sector" {
            assert!(log.contains("ubtrfs: lost: tree block"), "{name}: {log}");
        }
        eprintln!(
            "{name}: ubtrfs {} entries, btrfs restore {} (+{beyond_restore} for ubtrfs), \
             kernel {}, undamaged {}; ubtrfs mount -o ro {} ({unreadable} files EIO)",
            ours.len(),
            restore.len(),
            kernel.len(),
            full.len(),
            mounted.len()
        );
        if name == "data sector" {
            // Written as found: everything but those bytes equals the original.
            assert_eq!(ours.len(), full.len(), "{name}");
            assert!(err.contains("written as found"), "{err}");
            // cat salvages the same way (exit 3); --strict stops (exit 1).
            let i = img.to_str().expect("utf-8");
            let o = UBTRFS.output(&["cat", i, "/big"]);
            assert_eq!(
                o.status.code(),
                Some(3),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(Some(&format!("f:{}", sha(&o.stdout))), ours.get("big"));
            assert!(String::from_utf8_lossy(&o.stderr).contains("ubtrfs: damaged:"));
            let o = UBTRFS.output(&["cat", i, "/big", "--strict"]);
            assert_eq!(o.status.code(), Some(1));
        }
        if name == "level-1 node" {
            // The node's older version (the last commit rewrote it) is intact:
            // the older generation of a backup root gives back what it held.
            assert!(err.contains("from generation"), "{err}");
            covers(&format!("{name}: the undamaged image"), &full, &ours);
        }
        if name == "stale leaf" {
            // The older copy is read; the entries it lacks come back through their
            // back references.
            assert!(err.contains("read the copy of generation"), "{err}");
            for i in 0..5 {
                assert!(ours.contains_key(&format!("new{i}")), "new{i}\n{err}");
            }
            assert_eq!(ours, full_newer, "{name}");
        }
        if name == "directory index leaf" {
            assert!(err.contains("recovered"), "{err}");
            let a_files = ours.keys().filter(|p| p.starts_with("a/file")).count();
            assert_eq!(
                a_files, 250,
                "every file of /a found through its back reference"
            );
        }
    }
}

/// `ubtrfs rescue find-root` prints what `btrfs-find-root` prints (with and without
/// -a), and `extract --generation G` of the oldest generation no backup root holds
/// restores what `btrfs restore -t` of the block btrfs-find-root names for G does.
fn older_generations(img: &Path, work: &Path) {
    std::fs::create_dir_all(work).expect("mkdir");
    let i = img.to_str().expect("utf-8");
    for all in [false, true] {
        let a: &[&str] = if all { &["-a"] } else { &[] };
        let o = Command::new("btrfs-find-root")
            .args(a)
            .arg(img)
            .output()
            .expect("btrfs-find-root");
        let theirs =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        let mut args = vec!["rescue", "find-root", i];
        args.extend(a);
        let ours = UBTRFS.output(&args);
        assert_eq!(ours.status.code(), Some(0));
        assert_eq!(
            String::from_utf8_lossy(&ours.stdout),
            theirs,
            "find-root {a:?}"
        );
    }
    let o = Command::new("btrfs-find-root")
        .arg("-a")
        .arg(img)
        .output()
        .expect("btrfs-find-root");
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let backups = sh(&format!(
        "btrfs inspect-internal dump-super -f {} | awk '$1 == \"backup_tree_root:\" {{print $4}}'",
        shell_quote(img)
    ));
    let backups: Vec<u64> = backups
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    // "Well block B(gen: G level: L) seems good, ..."
    let (bytenr, generation) = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("Well block ")?;
            let (b, rest) = rest.split_once("(gen: ")?;
            let (g, _) = rest.split_once(' ')?;
            Some((b.parse::<u64>().ok()?, g.parse::<u64>().ok()?))
        })
        .filter(|(_, g)| !backups.contains(g))
        .min_by_key(|(_, g)| *g)
        .unwrap_or_else(|| panic!("a generation no backup root holds:\n{text}\n{backups:?}"));
    mount_previous_commit(img);
    let restore_dir = work.join("restore");
    std::fs::create_dir_all(&restore_dir).expect("mkdir");
    let _ = Command::new("btrfs")
        .args([
            "restore",
            "-i",
            "-s",
            "-x",
            "-m",
            "-S",
            "-t",
            &bytenr.to_string(),
        ])
        .arg(img)
        .arg(&restore_dir)
        .output();
    let restore = tree(&restore_dir);
    let dest = work.join("ubtrfs");
    let o = UBTRFS.output(&[
        "extract",
        i,
        dest.to_str().expect("utf-8"),
        "--generation",
        &generation.to_string(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0 | 3)), "{err}");
    assert!(
        err.contains(&format!("reading the root tree at {bytenr}")),
        "{err}"
    );
    let ours = tree(&dest);
    let said: Vec<&str> = err.lines().filter(|l| !l.contains("recovered:")).collect();
    eprintln!(
        "extract --generation {generation} said:\n{}",
        said.join("\n")
    );
    covers(
        &format!("generation {generation}: btrfs restore -t"),
        &restore,
        &ours,
    );
    // ls reads the same commit (or names the block of it lost since, when the
    // top directory was in it: blocks of old commits get reused).
    let o = UBTRFS.output(&["ls", i, "/", "--generation", &generation.to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    if matches!(o.status.code(), Some(0 | 3)) {
        let top: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        let mut want: Vec<String> = ours
            .keys()
            .filter(|p| !p.contains('/') && *p != "lost+found")
            .cloned()
            .collect();
        want.sort();
        assert_eq!(top, want, "ls --generation {generation}");
    } else {
        assert!(err.contains("lost: tree block"), "{err}");
    }
    eprintln!(
        "generation {generation} (root tree {bytenr}, no backup root): ubtrfs {} entries, \
         btrfs restore -t {}",
        ours.len(),
        restore.len()
    );
}

/// `ubtrfs mount -o generation=G` (and `-o tree_root=B`) of the commit before the
/// last, a backup root: the file the last commit wrote (`new4`) is not there yet,
/// the others are, with their bytes.
fn mount_previous_commit(img: &Path) {
    let dump = sh(&format!(
        "btrfs inspect-internal dump-super -f {}",
        shell_quote(img)
    ));
    let current: u64 = dump
        .lines()
        .find_map(|l| l.strip_prefix("generation").map(|v| v.trim().parse().ok()))
        .flatten()
        .expect("superblock generation");
    // backup_tree_root:	BYTENR	gen: G	level: L
    let (bytenr, generation) = dump
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.first() == Some(&"backup_tree_root:") && w.len() >= 4)
                .then(|| Some((w[1].parse::<u64>().ok()?, w[3].parse::<u64>().ok()?)))
                .flatten()
        })
        .filter(|&(_, g)| g < current)
        .max_by_key(|&(_, g)| g)
        .expect("a backup root older than the superblock's");
    for opt in [
        format!("generation={generation}"),
        format!("tree_root={bytenr}"),
    ] {
        let mut m = FuseMount::start(&UBTRFS, &[img], &[&opt]);
        let shown = tree(&m.mnt);
        assert!(m.unmount().success(), "{}", m.log());
        assert!(!shown.contains_key("new4"), "mount -o {opt}: new4 is newer");
        for i in 0..4 {
            let want = format!("f:{}", sha(format!("new {i}\n").as_bytes()));
            assert_eq!(
                shown.get(&format!("new{i}")),
                Some(&want),
                "mount -o {opt}: new{i}"
            );
        }
        eprintln!(
            "mount -o {opt} (superblock generation {current}): {} entries",
            shown.len()
        );
    }
}
