//! `ubtrfs check` against btrfs-progs' `btrfs check`, on the same images in the same
//! run.
//!
//! The kernel makes an image with every item type (directories and many files,
//! inline files, regular, prealloc, nodatacow and compressed extents, reflinked
//! copies whose extents carry keyed back references, a file with over a hundred
//! names in one directory so INODE_EXTREF items exist, xattrs, a symlink, a fifo, a
//! subvolume and a snapshot, the subvolume changed after it (so the blocks the
//! snapshot still shares have full back references: shared block and data
//! references), quotas, an open unlinked file so an orphan item is
//! there), once with 16 KiB nodes and once with 4 KiB nodes (trees of several
//! levels). Then each case of the corpus damages a fresh copy in one precise place
//! ([`ubtrfs_sim::damage`]: an item patched, deleted or re-keyed with every copy's
//! checksum made right again, a tree block or data byte changed, a superblock copy
//! edited) and both checkers run on it:
//!
//! * `btrfs check --readonly --check-data-csum IMG`; its verdict is its exit
//!   status. (Not with `--qgroup-report`: with it btrfs check only counts quota
//!   groups and exits 0 on any other damage. Without it, it still checks the quota
//!   groups of an image with quotas on, as its step 8.)
//! * `ubtrfs check --check-data-csum --qgroup-report --format json IMG`.
//!
//! For each case: the verdicts agree (unless the case is in [`KNOWN_DIFFERENCES`],
//! with the reason); when ubtrfs finds problems, one of them names the damaged
//! place (the block, or a number the case gives: inode, extent, tree, ...); ubtrfs
//! never panics; and the same check run the plain way (`--item-by-item
//! --refs-mem-max 4096`: each subvolume tree read in key order instead of
//! bottom-up with shared subtrees worked out once, and the expected references and
//! data ranges spilled to a temporary file and merged back) lists the same
//! problems. Every
//! failing case is reported at the end, in one table.
//!
//! A second test: the undamaged images and every golden image are clean for both.
//!
//! Needs root (loop devices, kernel mounts); skipped with a line outside CI.
//! `UBTRFS_CHECK_CASES=name,name` runs only the cases whose names contain one of
//! those words; `UBTRFS_CHECK_KEEP=DIR` keeps a copy of each damaged image there.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use ubtrfs_core::format::consts::*;
use ubtrfs_core::format::csum::name_hash;
use ubtrfs_core::format::items::FileExtentBody;
use ubtrfs_core::format::key::Key;
use ubtrfs_sim::damage::{
    add_u32, add_u64, get_u64, item_header_offset, key_ptr_offset, put_u32, put_u64, root_ptr,
    Found, Image,
};
use ubtrfs_sim::golden::{manifests, unpack_set};
use ubtrfs_sim::host::{
    bash_ok, forget_devices, head, output_text, panic_message, require_root, run_text, serial,
    shell_quote, Ubtrfs,
};
use ubtrfs_sim::mount::{mkfs_btrfs, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs")).with_limit(120);

/// Cases where ubtrfs check's verdict may differ from btrfs check's, and why.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    (
        "xattr-name",
        "an xattr name that does not hash to its key: the kernel's tree-checker rejects \
         the leaf (so would every read of it); btrfs check does not hash xattr names",
    ),
    (
        "file-extent-bad-compression",
        "compression type 9: the kernel's tree-checker rejects the leaf; btrfs check \
         lets it through",
    ),
    (
        "chunk-length",
        "btrfs check prints the chunk/block group/dev extent mismatch but still exits 0 \
         and says no error found; ubtrfs counts it",
    ),
    (
        "dev-extent-chunk-offset",
        "btrfs check prints the stripe/dev extent mismatch but exits 0; ubtrfs counts it",
    ),
    (
        "qgroup-info-deleted",
        "a subvolume with quotas on but no level-0 qgroup: its bytes go unaccounted; \
         btrfs check only compares the qgroups that exist",
    ),
    (
        "block-csum-one-copy",
        "one copy of a DUP block is bad: btrfs check reads the good copy silently, \
         ubtrfs checks every copy (issue 15: checksums of every copy)",
    ),
    (
        "root-tree-leaf-csum-one-copy",
        "one copy bad: ubtrfs checks every copy, btrfs check the first good one",
    ),
    (
        "n4-node-csum-one-copy",
        "one copy bad: ubtrfs checks every copy, btrfs check the first good one",
    ),
    (
        "n4-top-node-csum-one-copy",
        "one copy bad: ubtrfs checks every copy, btrfs check the first good one",
    ),
];

/// The kernel's workload: every item type. The last step keeps a file open after
/// unlinking it and copies the image while the filesystem is frozen: the copy has
/// that inode's orphan item (an unmount would have removed it).
const WORKLOAD: &str = r#"
python3 - <<'PY'
import os, random
random.seed(7)
os.makedirs('d/sub', exist_ok=True)
for i in range(300):
    open(f'd/f{i:03}', 'wb').write(bytes([65 + i % 26]) * random.randrange(1, 1800))
for i in range(40):
    open(f'd/sub/big{i}', 'wb').write(random.randbytes(random.randrange(5000, 70000)))
open('reg', 'wb').write(random.randbytes(1 << 20))
open('inline', 'w').write('small inline file\n')
os.symlink('reg', 'link')
os.makedirs('links', exist_ok=True)
open('links/target', 'w').write('many names\n')
for i in range(120):
    os.link('links/target', 'links/' + ('n%03d' % i) + 'x' * 200)
open('shared', 'wb').write(random.randbytes(64 << 10))
PY
mkdir clones
for i in $(seq 60); do cp --reflink=always shared clones/c$i; done
setfattr -n user.one -v first reg
setfattr -n user.two -v "$(head -c 300 /dev/zero | tr '\0' y)" d
fallocate -l 1M prealloc
fallocate -l 512K halfwritten
dd if=/dev/urandom of=halfwritten bs=4K count=16 conv=notrunc status=none
touch nocow
chattr +C nocow
head -c 256K /dev/urandom > nocow
mkdir zdir
chattr +c zdir
python3 -c "open('zdir/comp', 'w').write('compress me please ' * 20000)"
mkfifo fifo
btrfs -q subvolume create sv
cp -a d sv/
cp -a d sv/d2
echo in-subvol > sv/file
btrfs -q subvolume snapshot sv snap
echo more >> sv/d/f002
echo more >> sv/d/sub/big5
echo changed > sv/file
sync
btrfs quota enable .
btrfs quota rescan -w . > /dev/null
exec 3> orphaned
echo 'open, then unlinked' >&3
rm orphaned
sync
trap 'fsfreeze -u . 2> /dev/null || true' EXIT
fsfreeze -f .
cp --sparse=always "$IMG" "$OUT"
fsfreeze -u .
exec 3>&-
"#;

/// A kernel-made image with `mkfs_args`, copied (frozen) to `dir/name.img`.
fn make_image(dir: &Path, name: &str, mkfs_args: &[&str]) -> PathBuf {
    let work = dir.join(format!("{name}.work.img"));
    let out = dir.join(format!("{name}.img"));
    mkfs_btrfs(&work, 256 << 20, mkfs_args);
    let k = KernelMount::new(&work, "rw");
    let script = format!(
        "IMG={}\nOUT={}\n{WORKLOAD}",
        shell_quote(&work),
        shell_quote(&out)
    );
    bash_ok(&k.mnt, &script).unwrap_or_else(|e| panic!("workload ({name}): {e}"));
    k.umount();
    let _ = std::fs::remove_file(&work);
    out
}

// ---------------------------------------------------------------------------------
// The two checkers

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Clean,
    Errors,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Clean => "clean",
            Verdict::Errors => "errors",
        })
    }
}

/// `btrfs check --readonly --check-data-csum` of `devices` (the first; the others
/// are found by a device scan), started.
fn btrfs_check_start(devices: &[PathBuf]) -> std::process::Child {
    Command::new("btrfs")
        .args(["check", "--readonly", "--check-data-csum"])
        .arg(&devices[0])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running btrfs check")
}

/// btrfs check's verdict (its exit status) and the lines that say what it found.
fn btrfs_check_end(child: std::process::Child) -> (Verdict, Vec<String>) {
    let out = child.wait_with_output().expect("btrfs check");
    let text = output_text(&out);
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("ERROR: cannot scan") && !l.starts_with("found "))
        .filter(|l| l.contains("ERROR") || l.contains("error") || l.contains("mismatch"))
        .map(str::to_string)
        .collect();
    lines.dedup();
    if out.status.success() {
        (Verdict::Clean, lines)
    } else {
        if lines.is_empty() {
            lines = text.lines().rev().take(5).map(str::to_string).collect();
        }
        (Verdict::Errors, lines)
    }
}

/// One problem ubtrfs check reported.
#[derive(Clone, Debug)]
struct Problem {
    block: Option<u64>,
    line: String,
    /// Every number in the key and the message.
    numbers: Vec<u64>,
    /// The rule, the key and the message.
    text: String,
}

/// ubtrfs check's answer: its verdict and problems, or why the run itself failed
/// (a panic, a usage error, no JSON).
struct UbtrfsRun {
    verdict: Result<Verdict, String>,
    problems: Vec<Problem>,
    /// Expected references that went to the temporary file.
    spilled: u64,
}

fn numbers_in(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// `plain`: each subvolume tree item by item, and the expected references spilled to
/// a temporary file after 4 KiB: the straightforward paths the default ones must
/// agree with.
fn ubtrfs_check(devices: &[PathBuf], plain: bool) -> UbtrfsRun {
    let mut args: Vec<std::ffi::OsString> = [
        "check",
        "--check-data-csum",
        "--qgroup-report",
        "--format",
        "json",
    ]
    .iter()
    .map(Into::into)
    .collect();
    if plain {
        args.extend(["--item-by-item", "--refs-mem-max", "4096"].map(Into::into));
    }
    args.extend(devices.iter().map(|d| d.as_os_str().to_owned()));
    let started = Instant::now();
    let out = UBTRFS.output(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code();
    if stderr.contains("panicked") || code == Some(101) {
        return UbtrfsRun {
            verdict: Err(format!("PANIC: {}", head(stderr.trim(), 6))),
            problems: Vec::new(),
            spilled: 0,
        };
    }
    let verdict = match code {
        Some(0) => Verdict::Clean,
        Some(1) => Verdict::Errors,
        Some(124 | 137) => {
            return UbtrfsRun {
                verdict: Err(format!("hung: killed after {:?}", started.elapsed())),
                problems: Vec::new(),
                spilled: 0,
            }
        }
        _ => {
            return UbtrfsRun {
                verdict: Err(format!(
                    "exit {}: {}",
                    out.status,
                    head(format!("{stdout}{stderr}").trim(), 6)
                )),
                problems: Vec::new(),
                spilled: 0,
            }
        }
    };
    let mut problems = Vec::new();
    let mut spilled = 0;
    match serde_json::from_str::<Value>(&stdout) {
        Ok(v) => {
            spilled = v["refs_spilled"].as_u64().unwrap_or(0);
            for p in v["problems"].as_array().into_iter().flatten() {
                let s = |k: &str| match &p[k] {
                    Value::Null => "-".to_string(),
                    Value::String(s) => s.clone(),
                    x => x.to_string(),
                };
                let mut numbers = numbers_in(&s("key"));
                numbers.extend(numbers_in(&s("message")));
                numbers.extend(p["tree"].as_u64());
                problems.push(Problem {
                    text: format!("{} {} {}", s("rule"), s("key"), s("message")),
                    block: p["block"].as_u64(),
                    line: format!(
                        "{} tree={} block={} key={}: {}",
                        s("rule"),
                        s("tree"),
                        s("block"),
                        s("key"),
                        s("message")
                    ),
                    numbers,
                });
            }
        }
        // An image it cannot open at all: exit 1 with a message, perhaps no JSON.
        Err(_) if verdict == Verdict::Errors && !stderr.trim().is_empty() => {}
        Err(e) => {
            return UbtrfsRun {
                verdict: Err(format!("no JSON on stdout ({e}): {}", head(&stdout, 6))),
                problems: Vec::new(),
                spilled: 0,
            };
        }
    }
    if verdict == Verdict::Errors && problems.is_empty() && !stderr.trim().is_empty() {
        problems.push(Problem {
            text: stderr.clone(),
            block: None,
            line: format!("(stderr) {}", stderr.trim()),
            numbers: numbers_in(&stderr),
        });
    }
    if verdict == Verdict::Errors && problems.is_empty() {
        return UbtrfsRun {
            verdict: Err("exit 1 with no problem listed".into()),
            problems,
            spilled,
        };
    }
    if verdict == Verdict::Clean && !problems.is_empty() {
        return UbtrfsRun {
            verdict: Err(format!(
                "exit 0 with {} problems listed: {}",
                problems.len(),
                problems[0].line
            )),
            problems,
            spilled,
        };
    }
    UbtrfsRun {
        verdict: Ok(verdict),
        problems,
        spilled,
    }
}

// ---------------------------------------------------------------------------------
// Finding places in the undamaged image

/// What names the damaged place: a problem whose block is one of these numbers or
/// whose key or message holds one, or whose rule, key or message holds the text
/// (in any case).
#[derive(Clone, Debug)]
enum Place {
    N(u64),
    Text(&'static str),
}

type Where = Vec<Place>;

/// The places given by numbers.
fn n(v: &[u64]) -> Where {
    v.iter().map(|&x| Place::N(x)).collect()
}

type Damage = fn(&Image) -> Result<Where, String>;

/// (subvolume, inode number) of `path`.
fn ino(img: &Image, path: &str) -> Result<(u64, u64), String> {
    let fs = img.open()?;
    let n = fs.resolve(path).map_err(|e| format!("{path}: {e}"))?;
    Ok((n.root, n.ino))
}

fn key(objectid: u64, ty: u8, offset: u64) -> Key {
    Key::new(objectid, ty, offset)
}

/// The INODE_ITEM of `path`.
fn inode(img: &Image, path: &str) -> Result<Found, String> {
    let (root, ino) = ino(img, path)?;
    img.item(root, key(ino, INODE_ITEM_KEY, 0))
}

fn parent_and_name(path: &str) -> (&str, &str) {
    let (dir, name) = path.rsplit_once('/').expect("absolute path");
    (if dir.is_empty() { "/" } else { dir }, name)
}

/// The DIR_ITEM of `path` in its parent directory.
fn dir_item(img: &Image, path: &str) -> Result<Found, String> {
    let (dir, name) = parent_and_name(path);
    let (root, dino) = ino(img, dir)?;
    img.item(root, key(dino, DIR_ITEM_KEY, name_hash(name.as_bytes())))
}

/// The DIR_INDEX of `path` in its parent directory.
fn dir_index(img: &Image, path: &str) -> Result<Found, String> {
    let (dir, name) = parent_and_name(path);
    let (root, dino) = ino(img, dir)?;
    img.items(
        root,
        key(dino, DIR_INDEX_KEY, 0),
        key(dino, DIR_INDEX_KEY, u64::MAX),
    )?
    .into_iter()
    .find(|f| {
        f.body
            .get(30..)
            .is_some_and(|n| n.starts_with(name.as_bytes()) && n.len() == name.len())
    })
    .ok_or_else(|| format!("no DIR_INDEX for {path}"))
}

/// The INODE_REF of `path` (key (ino, INODE_REF, parent)).
fn inode_ref(img: &Image, path: &str) -> Result<Found, String> {
    let (dir, _) = parent_and_name(path);
    let (_, dino) = ino(img, dir)?;
    let (root, ino) = ino(img, path)?;
    img.item(root, key(ino, INODE_REF_KEY, dino))
}

/// The `n`th EXTENT_DATA item of `path`.
fn file_extent(img: &Image, path: &str, n: usize) -> Result<Found, String> {
    let (root, ino) = ino(img, path)?;
    img.items(
        root,
        key(ino, EXTENT_DATA_KEY, 0),
        key(ino, EXTENT_DATA_KEY, u64::MAX),
    )?
    .into_iter()
    .nth(n)
    .ok_or_else(|| format!("{path} has no extent #{n}"))
}

/// (disk_bytenr, disk_num_bytes, offset) of the `n`th extent of `path` (regular or
/// prealloc).
fn disk_extent(img: &Image, path: &str, n: usize) -> Result<(u64, u64, u64), String> {
    let fs = img.open()?;
    let node = fs.resolve(path).map_err(|e| format!("{path}: {e}"))?;
    let ext = fs.file_extents(node).map_err(|e| format!("{path}: {e}"))?;
    match ext.get(n).map(|e| &e.item.body) {
        Some(FileExtentBody::Regular {
            disk_bytenr,
            disk_num_bytes,
            offset,
            ..
        }) => Ok((*disk_bytenr, *disk_num_bytes, *offset)),
        x => Err(format!("{path} extent #{n}: not on disk: {x:?}")),
    }
}

/// The EXTENT_ITEM (or METADATA_ITEM) of the extent at `bytenr`.
fn extent_item(img: &Image, bytenr: u64) -> Result<Found, String> {
    img.items(
        EXTENT_TREE_OBJECTID,
        key(bytenr, EXTENT_ITEM_KEY, 0),
        key(bytenr, METADATA_ITEM_KEY, u64::MAX),
    )?
    .into_iter()
    .next()
    .ok_or_else(|| format!("no extent item at {bytenr}"))
}

/// Offset in an EXTENT_ITEM / METADATA_ITEM body of its first inline reference of
/// type `ty`.
fn inline_ref(f: &Found, ty: u8) -> Option<usize> {
    let mut at = EXTENT_INLINE;
    if f.key.ty == EXTENT_ITEM_KEY && get_u64(&f.body, EXTENT_FLAGS) & EXTENT_FLAG_TREE_BLOCK != 0 {
        at += 18; // struct btrfs_tree_block_info
    }
    while at < f.body.len() {
        let t = f.body[at];
        if t == ty {
            return Some(at);
        }
        at += 1 + match t {
            EXTENT_DATA_REF_KEY => 28,
            SHARED_DATA_REF_KEY => 12,
            _ => 8,
        };
    }
    None
}

/// The first extent item (in the extent tree) with two references or more, one of
/// them inline of type `ty`, and that reference's offset in its body.
fn with_inline_ref(img: &Image, ty: u8) -> Result<(Found, usize), String> {
    let f = img.find(EXTENT_TREE_OBJECTID, |k, b| {
        if k.ty != EXTENT_ITEM_KEY && k.ty != METADATA_ITEM_KEY || get_u64(b, EXTENT_REFS) < 2 {
            return false;
        }
        let f = Found {
            tree: EXTENT_TREE_OBJECTID,
            key: *k,
            leaf: 0,
            slot: 0,
            body_offset: 0,
            body: b.to_vec(),
            parents: Vec::new(),
        };
        inline_ref(&f, ty).is_some()
    })?;
    let at = inline_ref(&f, ty).ok_or("inline ref gone")?;
    Ok((f, at))
}

/// The first item of `tree` with type `ty`.
fn first_of(img: &Image, tree: u64, ty: u8) -> Result<Found, String> {
    img.find(tree, |k, _| k.ty == ty)
}

/// The BLOCK_GROUP_ITEM of the first block group with `flags` among its type bits.
fn block_group(img: &Image, flags: u64) -> Result<Found, String> {
    img.find(EXTENT_TREE_OBJECTID, |k, b| {
        k.ty == BLOCK_GROUP_ITEM_KEY && get_u64(b, 16) & flags != 0
    })
}

/// The leaf holding `path`'s inode item.
fn leaf_of(img: &Image, path: &str) -> Result<u64, String> {
    Ok(inode(img, path)?.leaf)
}

/// The tree block pointed to by key pointer `slot` of node `node`.
fn child_of(img: &Image, node: u64, slot: usize) -> Result<u64, String> {
    let b = img.read_block(node, 0)?;
    Ok(get_u64(&b, key_ptr_offset(slot) + 17))
}

// Field offsets in item bodies (the on-disk structs, little-endian).
const INODE_SIZE: usize = 16;
const INODE_NBYTES: usize = 24;
const INODE_NLINK: usize = 40;
const INODE_MODE: usize = 52;
const DIR_LOCATION: usize = 0;
const DIR_TYPE: usize = 29;
const DIR_NAME: usize = 30;
const REF_INDEX: usize = 0;
const REF_NAME: usize = 10;
const EXTREF_PARENT: usize = 0;
const EXTREF_NAME: usize = 18;
const FE_RAM_BYTES: usize = 8;
const FE_COMPRESSION: usize = 16;
const FE_TYPE: usize = 20;
const FE_DISK_BYTENR: usize = 21;
const FE_OFFSET: usize = 37;
const FE_NUM_BYTES: usize = 45;
const ROOT_BYTENR: usize = 176;
const ROOT_REFS: usize = 216;
const ROOT_LEVEL: usize = 238;
const ROOTREF_DIRID: usize = 0;
const ROOTREF_SEQUENCE: usize = 8;
const ROOTREF_NAME: usize = 18;
const EXTENT_REFS: usize = 0;
const EXTENT_FLAGS: usize = 16;
/// First inline reference of an EXTENT_ITEM of data, or of a METADATA_ITEM: type
/// byte, then the reference (a data ref: root, objectid, offset, count).
const EXTENT_INLINE: usize = 24;
const DATA_REF_COUNT: usize = 24;
const BG_USED: usize = 0;
const BG_FLAGS: usize = 16;
const CHUNK_LENGTH: usize = 0;
const CHUNK_STRIPE0_OFFSET: usize = 56;
const DEV_ITEM_BYTES_USED: usize = 16;
const DEV_EXTENT_CHUNK_OFFSET: usize = 16;
const DEV_EXTENT_LENGTH: usize = 24;
const QGROUP_RFER: usize = 8;
const QGROUP_EXCL: usize = 24;
const QGROUP_STATUS_VERSION: usize = 0;
const QGROUP_STATUS_FLAGS: usize = 16;
const SUPER_BYTES_USED: usize = 0x78;

fn le64(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// Changes byte `at` of `f`'s body (XOR 0x20: a letter changes case).
fn flip_body(img: &Image, f: &Found, at: usize) -> Result<(), String> {
    if at >= f.body.len() {
        return Err(format!(
            "{}: byte {at} is past its {} bytes",
            f.key,
            f.body.len()
        ));
    }
    img.edit_item(f, |b| b[at] ^= 0x20)
}

/// Adds `delta` to the u64 at `at` in `f`'s body.
fn add_body_u64(img: &Image, f: &Found, at: usize, delta: i64) -> Result<(), String> {
    img.edit_item(f, |b| add_u64(b, at, delta))
}

fn here(f: &Found) -> Where {
    n(&[f.leaf, f.key.objectid])
}

// ---------------------------------------------------------------------------------
// The corpus

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    /// 16 KiB nodes.
    N16,
    /// 4 KiB nodes: trees of several levels.
    N4,
}

struct Case {
    name: &'static str,
    base: Base,
    damage: Damage,
}

const fn case(name: &'static str, damage: Damage) -> Case {
    Case {
        name,
        base: Base::N16,
        damage,
    }
}

const fn case4(name: &'static str, damage: Damage) -> Case {
    Case {
        name,
        base: Base::N4,
        damage,
    }
}

fn corpus() -> Vec<Case> {
    vec![
        // --- inode items
        case("inode-nlink-plus-one", |img| {
            let f = inode(img, "/d/f010")?;
            img.edit_item(&f, |b| add_u32(b, INODE_NLINK, 1))?;
            Ok(here(&f))
        }),
        case("inode-nlink-zero-no-orphan", |img| {
            let f = inode(img, "/inline")?;
            img.edit_item(&f, |b| put_u32(b, INODE_NLINK, 0))?;
            Ok(here(&f))
        }),
        case("inode-nlink-extref-minus-one", |img| {
            let f = inode(img, "/links/target")?;
            img.edit_item(&f, |b| add_u32(b, INODE_NLINK, -1))?;
            Ok(here(&f))
        }),
        case("inode-dir-isize", |img| {
            let f = inode(img, "/d")?;
            add_body_u64(img, &f, INODE_SIZE, 2)?;
            Ok(here(&f))
        }),
        case("inode-nbytes", |img| {
            let f = inode(img, "/reg")?;
            add_body_u64(img, &f, INODE_NBYTES, 4096)?;
            Ok(here(&f))
        }),
        case("inode-nbytes-inline", |img| {
            let f = inode(img, "/inline")?;
            add_body_u64(img, &f, INODE_NBYTES, 1)?;
            Ok(here(&f))
        }),
        case("inode-file-size-short", |img| {
            let f = inode(img, "/reg")?;
            img.patch(&f, INODE_SIZE, &le64(4096))?;
            Ok(here(&f))
        }),
        case("inode-mode-reg-to-dir", |img| {
            let f = inode(img, "/d/f020")?;
            img.edit_item(&f, |b| put_u32(b, INODE_MODE, 0o40755))?;
            Ok(here(&f))
        }),
        case("inode-mode-symlink-to-reg", |img| {
            let f = inode(img, "/link")?;
            img.edit_item(&f, |b| put_u32(b, INODE_MODE, 0o100644))?;
            Ok(n(&[f.leaf, f.key.objectid, FIRST_FREE_OBJECTID]))
        }),
        case("inode-item-deleted", |img| {
            let f = inode(img, "/d/f030")?;
            img.delete(&f)?;
            Ok(here(&f))
        }),
        // --- inode refs
        case("inode-ref-index", |img| {
            let f = inode_ref(img, "/d/f040")?;
            add_body_u64(img, &f, REF_INDEX, 1000)?;
            Ok(n(&[f.leaf, f.key.objectid, f.key.offset]))
        }),
        case("inode-ref-name", |img| {
            let f = inode_ref(img, "/d/f041")?;
            flip_body(img, &f, REF_NAME + 1)?;
            Ok(n(&[f.leaf, f.key.objectid, f.key.offset]))
        }),
        case("inode-ref-deleted", |img| {
            let f = inode_ref(img, "/d/f042")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.objectid, f.key.offset]))
        }),
        case("inode-extref-name", |img| {
            let (root, ino) = ino(img, "/links/target")?;
            let f = img.find(root, |k, _| k.objectid == ino && k.ty == INODE_EXTREF_KEY)?;
            flip_body(img, &f, EXTREF_NAME + 2)?;
            Ok(n(&[
                f.leaf,
                f.key.objectid,
                get_u64(&f.body, EXTREF_PARENT),
            ]))
        }),
        case("inode-extref-parent", |img| {
            let (root, ino) = ino(img, "/links/target")?;
            let f = img.find(root, |k, _| k.objectid == ino && k.ty == INODE_EXTREF_KEY)?;
            img.patch(&f, EXTREF_PARENT, &le64(FIRST_FREE_OBJECTID))?;
            Ok(n(&[
                f.leaf,
                f.key.objectid,
                get_u64(&f.body, EXTREF_PARENT),
                FIRST_FREE_OBJECTID,
            ]))
        }),
        case("inode-extref-deleted", |img| {
            let (root, ino) = ino(img, "/links/target")?;
            let f = img.find(root, |k, _| k.objectid == ino && k.ty == INODE_EXTREF_KEY)?;
            img.delete(&f)?;
            Ok(n(&[
                f.leaf,
                f.key.objectid,
                get_u64(&f.body, EXTREF_PARENT),
            ]))
        }),
        // --- directory entries
        case("dir-item-location", |img| {
            let f = dir_item(img, "/d/f050")?;
            let (_, other) = ino(img, "/d/f051")?;
            img.patch(&f, DIR_LOCATION, &le64(other))?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0), other]))
        }),
        case("dir-item-type", |img| {
            let f = dir_item(img, "/d/f052")?;
            img.patch(&f, DIR_TYPE, &[FT_DIR])?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        case("dir-item-name", |img| {
            let f = dir_item(img, "/d/f053")?;
            flip_body(img, &f, DIR_NAME)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        case("dir-item-deleted", |img| {
            let f = dir_item(img, "/d/f054")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        case("dir-index-location", |img| {
            let f = dir_index(img, "/d/f055")?;
            let (_, other) = ino(img, "/d/f056")?;
            img.patch(&f, DIR_LOCATION, &le64(other))?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0), other]))
        }),
        case("dir-index-type", |img| {
            let f = dir_index(img, "/d/f057")?;
            img.patch(&f, DIR_TYPE, &[FT_SYMLINK])?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        case("dir-index-name", |img| {
            let f = dir_index(img, "/d/f058")?;
            flip_body(img, &f, DIR_NAME)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        case("dir-index-deleted", |img| {
            let f = dir_index(img, "/d/f059")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        case("dir-item-and-index-deleted", |img| {
            let a = dir_item(img, "/d/f061")?;
            let b = dir_index(img, "/d/f061")?;
            img.delete(&a)?;
            let b = img.item(b.tree, b.key)?;
            img.delete(&b)?;
            Ok(n(&[a.leaf, b.leaf, a.key.objectid, get_u64(&a.body, 0)]))
        }),
        // --- xattrs
        case("xattr-name", |img| {
            let (root, ino) = ino(img, "/reg")?;
            let f = img.find(root, |k, _| k.objectid == ino && k.ty == XATTR_ITEM_KEY)?;
            flip_body(img, &f, DIR_NAME + 5)?;
            Ok(here(&f))
        }),
        case("xattr-value", |img| {
            let (root, ino) = ino(img, "/reg")?;
            let f = img.find(root, |k, _| k.objectid == ino && k.ty == XATTR_ITEM_KEY)?;
            let last = f.body.len() - 1;
            flip_body(img, &f, last)?;
            Ok(here(&f))
        }),
        case("xattr-deleted", |img| {
            let (root, ino) = ino(img, "/d")?;
            let f = img.find(root, |k, _| k.objectid == ino && k.ty == XATTR_ITEM_KEY)?;
            img.delete(&f)?;
            Ok(here(&f))
        }),
        // --- file extents
        case("file-extent-disk-bytenr", |img| {
            let f = file_extent(img, "/reg", 0)?;
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            add_body_u64(img, &f, FE_DISK_BYTENR, 4096)?;
            Ok(n(&[f.leaf, f.key.objectid, bytenr, bytenr + 4096]))
        }),
        case("file-extent-num-bytes-overlap", |img| {
            let f = file_extent(img, "/halfwritten", 0)?;
            add_body_u64(img, &f, FE_NUM_BYTES, 4096)?;
            Ok(here(&f))
        }),
        case("file-extent-offset", |img| {
            let f = file_extent(img, "/reg", 0)?;
            img.patch(&f, FE_OFFSET, &le64(8192))?;
            Ok(here(&f))
        }),
        case("file-extent-reg-to-prealloc", |img| {
            let f = file_extent(img, "/reg", 0)?;
            img.patch(&f, FE_TYPE, &[FILE_EXTENT_PREALLOC])?;
            Ok(here(&f))
        }),
        case("file-extent-bad-compression", |img| {
            let f = file_extent(img, "/zdir/comp", 0)?;
            img.patch(&f, FE_COMPRESSION, &[9])?;
            Ok(here(&f))
        }),
        case("file-extent-inline-ram-bytes", |img| {
            let f = file_extent(img, "/inline", 0)?;
            add_body_u64(img, &f, FE_RAM_BYTES, 10)?;
            Ok(here(&f))
        }),
        case("file-extent-deleted", |img| {
            let f = file_extent(img, "/reg", 0)?;
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.objectid, bytenr]))
        }),
        case("file-extent-prealloc-num-bytes", |img| {
            let f = file_extent(img, "/prealloc", 0)?;
            add_body_u64(img, &f, FE_NUM_BYTES, -4096)?;
            Ok(here(&f))
        }),
        // --- checksums
        case("csum-item-bytes", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = img.items(
                CSUM_TREE_OBJECTID,
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0),
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, bytenr),
            )?;
            let f = f.last().ok_or("no csum item")?.clone();
            // The checksum of the extent's 8th sector.
            let sector = img.sectorsize as u64;
            let at = ((bytenr - f.key.offset) / sector + 7) as usize * img.csum_type.size();
            flip_body(img, &f, at)?;
            Ok(n(&[f.leaf, f.key.offset, bytenr, bytenr + 7 * sector]))
        }),
        case("csum-item-orphan", |img| {
            // The last checksum item moved past every chunk: checksums of nothing,
            // and the data they covered without any.
            let all = img.items(
                CSUM_TREE_OBJECTID,
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0),
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, u64::MAX),
            )?;
            let f = all.last().ok_or("no csum item")?;
            let to = f.key.offset + (1 << 40);
            img.rekey(f, key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, to))?;
            Ok(n(&[f.leaf, f.key.offset, to]))
        }),
        case("csum-item-deleted", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = img.items(
                CSUM_TREE_OBJECTID,
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0),
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, bytenr),
            )?;
            let f = f.last().ok_or("no csum item")?.clone();
            let (_, i) = ino(img, "/reg")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.offset, bytenr, i]))
        }),
        // --- subvolumes: ROOT_ITEM, ROOT_REF, ROOT_BACKREF
        case("root-item-bytenr", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(256, ROOT_ITEM_KEY, 0))?;
            add_body_u64(img, &f, ROOT_BYTENR, img.nodesize as i64)?;
            Ok(n(&[f.leaf, 256, get_u64(&f.body, ROOT_BYTENR)]))
        }),
        case("root-item-refs-zero", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(256, ROOT_ITEM_KEY, 0))?;
            img.edit_item(&f, |b| put_u32(b, ROOT_REFS, 0))?;
            Ok(n(&[f.leaf, 256]))
        }),
        case("root-item-level", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(256, ROOT_ITEM_KEY, 0))?;
            img.edit_item(&f, |b| b[ROOT_LEVEL] += 1)?;
            Ok(n(&[f.leaf, 256, get_u64(&f.body, ROOT_BYTENR)]))
        }),
        case("root-ref-deleted", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(5, ROOT_REF_KEY, 256))?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, 256]))
        }),
        case("root-backref-deleted", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(256, ROOT_BACKREF_KEY, 5))?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, 256]))
        }),
        case("root-ref-dirid", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(5, ROOT_REF_KEY, 257))?;
            let (_, d) = ino(img, "/d")?;
            img.patch(&f, ROOTREF_DIRID, &le64(d))?;
            Ok(n(&[f.leaf, 257]))
        }),
        case("root-ref-name", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(5, ROOT_REF_KEY, 256))?;
            flip_body(img, &f, ROOTREF_NAME)?;
            Ok(n(&[f.leaf, 256]))
        }),
        case("root-ref-sequence", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(5, ROOT_REF_KEY, 256))?;
            add_body_u64(img, &f, ROOTREF_SEQUENCE, 100)?;
            Ok(n(&[f.leaf, 256]))
        }),
        case("root-backref-name", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(257, ROOT_BACKREF_KEY, 5))?;
            flip_body(img, &f, ROOTREF_NAME + 1)?;
            Ok(n(&[f.leaf, 257]))
        }),
        case("root-ref-dangling", |img| {
            let f = img.item(ROOT_TREE_OBJECTID, key(5, ROOT_REF_KEY, 257))?;
            img.rekey(&f, key(5, ROOT_REF_KEY, 300))?;
            Ok(n(&[f.leaf, 257, 300]))
        }),
        case("subvol-dir-item-deleted", |img| {
            let f = dir_item(img, "/sv")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, 256, f.key.objectid]))
        }),
        // --- extent items and back references
        case("extent-refs-plus-one", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = extent_item(img, bytenr)?;
            add_body_u64(img, &f, EXTENT_REFS, 1)?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        case("extent-refs-minus-one-shared", |img| {
            let (bytenr, _, _) = disk_extent(img, "/shared", 0)?;
            let f = extent_item(img, bytenr)?;
            add_body_u64(img, &f, EXTENT_REFS, -1)?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        case("extent-flags-data-to-tree", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = extent_item(img, bytenr)?;
            img.patch(&f, EXTENT_FLAGS, &le64(EXTENT_FLAG_TREE_BLOCK))?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        case("extent-item-deleted", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = extent_item(img, bytenr)?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        case("extent-inline-data-ref-count", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = extent_item(img, bytenr)?;
            if f.body[EXTENT_INLINE] != EXTENT_DATA_REF_KEY {
                return Err(format!("{}: first inline ref is not a data ref", f.key));
            }
            img.edit_item(&f, |b| add_u32(b, EXTENT_INLINE + 1 + DATA_REF_COUNT, 1))?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        case("extent-inline-data-ref-objectid", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = extent_item(img, bytenr)?;
            if f.body[EXTENT_INLINE] != EXTENT_DATA_REF_KEY {
                return Err(format!("{}: first inline ref is not a data ref", f.key));
            }
            add_body_u64(img, &f, EXTENT_INLINE + 1 + 8, 1)?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        case("extent-keyed-data-ref-count", |img| {
            let (bytenr, _, _) = disk_extent(img, "/shared", 0)?;
            let f = img.find(EXTENT_TREE_OBJECTID, |k, _| {
                k.objectid == bytenr && k.ty == EXTENT_DATA_REF_KEY
            })?;
            img.edit_item(&f, |b| add_u32(b, DATA_REF_COUNT, 1))?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        case("extent-keyed-data-ref-deleted", |img| {
            let (bytenr, _, _) = disk_extent(img, "/shared", 0)?;
            let f = img.find(EXTENT_TREE_OBJECTID, |k, _| {
                k.objectid == bytenr && k.ty == EXTENT_DATA_REF_KEY
            })?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, bytenr, get_u64(&f.body, 8)]))
        }),
        case("extent-shared-data-ref-count", |img| {
            let (f, at) = with_inline_ref(img, SHARED_DATA_REF_KEY)?;
            img.edit_item(&f, |b| add_u32(b, at + 9, 1))?;
            Ok(n(&[f.leaf, f.key.objectid]))
        }),
        case4("extent-shared-block-ref-parent", |img| {
            let (f, at) = with_inline_ref(img, SHARED_BLOCK_REF_KEY)?;
            add_body_u64(img, &f, at + 1, img.nodesize as i64)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, at + 1)]))
        }),
        case4("extent-inline-shared-block-ref-dropped", |img| {
            let (f, at) = with_inline_ref(img, SHARED_BLOCK_REF_KEY)?;
            let mut body = f.body.clone();
            body.drain(at..at + 9);
            add_u64(&mut body, EXTENT_REFS, -1);
            img.replace_body(&f, &body)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, at + 1)]))
        }),
        case("extent-inline-shared-data-ref-dropped", |img| {
            let (f, at) = with_inline_ref(img, SHARED_DATA_REF_KEY)?;
            let mut body = f.body.clone();
            body.drain(at..at + 13);
            add_u64(&mut body, EXTENT_REFS, -1);
            img.replace_body(&f, &body)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, at + 1)]))
        }),
        case("extent-inline-data-ref-grown", |img| {
            // A second inline data reference, for a file extent that does not exist.
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = extent_item(img, bytenr)?;
            let mut body = f.body.clone();
            let mut extra = vec![EXTENT_DATA_REF_KEY];
            extra.extend_from_slice(&le64(FS_TREE_OBJECTID));
            extra.extend_from_slice(&le64(100_000));
            extra.extend_from_slice(&le64(0));
            extra.extend_from_slice(&1u32.to_le_bytes());
            body.extend_from_slice(&extra);
            add_u64(&mut body, EXTENT_REFS, 1);
            img.replace_body(&f, &body)?;
            Ok(n(&[f.leaf, bytenr, 100_000]))
        }),
        case("metadata-item-refs", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            let f = extent_item(img, leaf)?;
            add_body_u64(img, &f, EXTENT_REFS, 1)?;
            Ok(n(&[f.leaf, leaf]))
        }),
        case("metadata-item-tree-ref-root", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            let f = extent_item(img, leaf)?;
            if f.body[EXTENT_INLINE] != TREE_BLOCK_REF_KEY {
                return Err(format!("{}: first inline ref is not a tree ref", f.key));
            }
            img.patch(&f, EXTENT_INLINE + 1, &le64(CSUM_TREE_OBJECTID))?;
            Ok(n(&[f.leaf, leaf]))
        }),
        case("metadata-item-deleted", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            let f = extent_item(img, leaf)?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, leaf]))
        }),
        case("extent-item-length", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = extent_item(img, bytenr)?;
            img.rekey(&f, key(bytenr, EXTENT_ITEM_KEY, f.key.offset + 4096))?;
            Ok(n(&[f.leaf, bytenr]))
        }),
        // --- block groups, chunks, devices
        case("bg-used", |img| {
            let f = block_group(img, BLOCK_GROUP_DATA)?;
            add_body_u64(img, &f, BG_USED, 4096)?;
            Ok(n(&[f.leaf, f.key.objectid]))
        }),
        case("bg-flags", |img| {
            let f = block_group(img, BLOCK_GROUP_METADATA)?;
            img.edit_item(&f, |b| {
                let fl = get_u64(b, BG_FLAGS);
                put_u64(b, BG_FLAGS, fl & !BLOCK_GROUP_METADATA | BLOCK_GROUP_DATA);
            })?;
            Ok(n(&[f.leaf, f.key.objectid]))
        }),
        case("bg-deleted", |img| {
            let f = block_group(img, BLOCK_GROUP_DATA)?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.objectid]))
        }),
        case("chunk-stripe-offset", |img| {
            let bg = block_group(img, BLOCK_GROUP_DATA)?;
            let f = img.item(
                CHUNK_TREE_OBJECTID,
                key(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, bg.key.objectid),
            )?;
            add_body_u64(img, &f, CHUNK_STRIPE0_OFFSET, 1 << 20)?;
            Ok(n(&[f.leaf, bg.key.objectid]))
        }),
        case("chunk-length", |img| {
            let bg = block_group(img, BLOCK_GROUP_DATA)?;
            let f = img.item(
                CHUNK_TREE_OBJECTID,
                key(FIRST_CHUNK_TREE_OBJECTID, CHUNK_ITEM_KEY, bg.key.objectid),
            )?;
            add_body_u64(img, &f, CHUNK_LENGTH, -(1 << 20))?;
            Ok(n(&[f.leaf, bg.key.objectid]))
        }),
        case("dev-item-bytes-used", |img| {
            let f = img.item(
                CHUNK_TREE_OBJECTID,
                key(DEV_ITEMS_OBJECTID, DEV_ITEM_KEY, 1),
            )?;
            add_body_u64(img, &f, DEV_ITEM_BYTES_USED, 1 << 20)?;
            Ok(n(&[f.leaf, 1]))
        }),
        case("dev-extent-length", |img| {
            let f = img.find(DEV_TREE_OBJECTID, |k, b| {
                k.ty == DEV_EXTENT_KEY && get_u64(b, 24) >= 8 << 20
            })?;
            add_body_u64(img, &f, DEV_EXTENT_LENGTH, 1 << 20)?;
            Ok(n(&[
                f.leaf,
                f.key.offset,
                get_u64(&f.body, DEV_EXTENT_CHUNK_OFFSET),
                f.key.offset + get_u64(&f.body, DEV_EXTENT_LENGTH),
            ]))
        }),
        case("dev-extent-chunk-offset", |img| {
            let f = first_of(img, DEV_TREE_OBJECTID, DEV_EXTENT_KEY)?;
            add_body_u64(img, &f, DEV_EXTENT_CHUNK_OFFSET, 1 << 20)?;
            Ok(n(&[
                f.leaf,
                f.key.offset,
                get_u64(&f.body, DEV_EXTENT_CHUNK_OFFSET),
            ]))
        }),
        case("dev-extent-deleted", |img| {
            let bg = block_group(img, BLOCK_GROUP_DATA)?;
            let f = img.find(DEV_TREE_OBJECTID, |k, b| {
                k.ty == DEV_EXTENT_KEY && get_u64(b, DEV_EXTENT_CHUNK_OFFSET) == bg.key.objectid
            })?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.offset, bg.key.objectid]))
        }),
        // --- free-space tree
        case("fst-info-count", |img| {
            let bg = block_group(img, BLOCK_GROUP_DATA)?;
            let f = img.item(
                FREE_SPACE_TREE_OBJECTID,
                key(bg.key.objectid, FREE_SPACE_INFO_KEY, bg.key.offset),
            )?;
            img.edit_item(&f, |b| add_u32(b, 0, 1))?;
            Ok(n(&[f.leaf, bg.key.objectid]))
        }),
        case("fst-extent-deleted", |img| {
            let bg = block_group(img, BLOCK_GROUP_DATA)?;
            let f = img.find(FREE_SPACE_TREE_OBJECTID, |k, _| {
                k.ty == FREE_SPACE_EXTENT_KEY && k.objectid >= bg.key.objectid
            })?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, bg.key.objectid, f.key.objectid]))
        }),
        case("fst-extent-shorter", |img| {
            let bg = block_group(img, BLOCK_GROUP_DATA)?;
            let f = img.find(FREE_SPACE_TREE_OBJECTID, |k, _| {
                k.ty == FREE_SPACE_EXTENT_KEY && k.objectid >= bg.key.objectid
            })?;
            img.rekey(
                &f,
                key(f.key.objectid, FREE_SPACE_EXTENT_KEY, f.key.offset - 4096),
            )?;
            Ok(n(&[f.leaf, bg.key.objectid, f.key.objectid]))
        }),
        // --- quota groups
        case("qgroup-info-rfer", |img| {
            let f = img.item(QUOTA_TREE_OBJECTID, key(0, QGROUP_INFO_KEY, 5))?;
            add_body_u64(img, &f, QGROUP_RFER, 4096)?;
            Ok(n(&[f.leaf, 5]))
        }),
        case("qgroup-info-excl", |img| {
            let f = img.item(QUOTA_TREE_OBJECTID, key(0, QGROUP_INFO_KEY, 256))?;
            add_body_u64(img, &f, QGROUP_EXCL, -4096)?;
            Ok(n(&[f.leaf, 256]))
        }),
        case("qgroup-info-deleted", |img| {
            let f = img.item(QUOTA_TREE_OBJECTID, key(0, QGROUP_INFO_KEY, 257))?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, 257]))
        }),
        case("qgroup-status-inconsistent", |img| {
            let f = img.item(QUOTA_TREE_OBJECTID, key(0, QGROUP_STATUS_KEY, 0))?;
            img.edit_item(&f, |b| b[QGROUP_STATUS_FLAGS] |= 4)?;
            Ok(vec![Place::N(f.leaf), Place::Text("status")])
        }),
        case("qgroup-status-version", |img| {
            let f = img.item(QUOTA_TREE_OBJECTID, key(0, QGROUP_STATUS_KEY, 0))?;
            add_body_u64(img, &f, QGROUP_STATUS_VERSION, 1)?;
            Ok(vec![Place::N(f.leaf), Place::Text("status")])
        }),
        // --- UUID tree
        case("uuid-subvol-id", |img| {
            let f = first_of(img, UUID_TREE_OBJECTID, UUID_KEY_SUBVOL)?;
            img.patch(&f, 0, &le64(999))?;
            Ok(n(&[f.leaf, 999, get_u64(&f.body, 0)]))
        }),
        case("uuid-item-deleted", |img| {
            let f = first_of(img, UUID_TREE_OBJECTID, UUID_KEY_SUBVOL)?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, get_u64(&f.body, 0)]))
        }),
        // --- orphans
        case("orphan-item-deleted", |img| {
            let f = img.find(FS_TREE_OBJECTID, |k, _| {
                k.objectid == ORPHAN_OBJECTID && k.ty == ORPHAN_ITEM_KEY
            })?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.offset]))
        }),
        case("orphan-item-dangling", |img| {
            let f = img.find(FS_TREE_OBJECTID, |k, _| {
                k.objectid == ORPHAN_OBJECTID && k.ty == ORPHAN_ITEM_KEY
            })?;
            img.rekey(&f, key(ORPHAN_OBJECTID, ORPHAN_ITEM_KEY, 100_000))?;
            Ok(n(&[f.leaf, f.key.offset, 100_000]))
        }),
        // --- tree blocks
        case("block-csum-one-copy", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.poke_block(leaf, Some(0), 300)?;
            Ok(n(&[leaf]))
        }),
        case("block-csum-both-copies", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.poke_block(leaf, None, 300)?;
            Ok(n(&[leaf]))
        }),
        case("block-header-bytenr", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.edit_block(leaf, |b| add_u64(b, 0x30, img.nodesize as i64))?;
            Ok(n(&[leaf]))
        }),
        case("block-header-fsid", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.edit_block(leaf, |b| b[0x20] ^= 1)?;
            Ok(n(&[leaf]))
        }),
        case("block-header-generation", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.edit_block(leaf, |b| add_u64(b, 0x50, 100))?;
            Ok(n(&[leaf]))
        }),
        case("block-header-owner", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.edit_block(leaf, |b| put_u64(b, 0x58, CSUM_TREE_OBJECTID))?;
            Ok(n(&[leaf]))
        }),
        case("block-header-level", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.edit_block(leaf, |b| b[0x64] = 1)?;
            Ok(n(&[leaf]))
        }),
        case("block-key-order", |img| {
            let f = inode(img, "/d/f010")?;
            let next = img.read_block(f.leaf, 0)?;
            let items = ubtrfs_core::format::tree::BlockView::new(&next).nritems() as usize;
            if f.slot + 2 >= items {
                return Err("inode item too near the leaf's end".into());
            }
            // Past the key two slots on: out of order with the next item.
            let k2 = ubtrfs_core::format::tree::BlockView::new(&next)
                .item_key(f.slot + 2)
                .map_err(|e| e.to_string())?;
            img.rekey(&f, key(k2.objectid, k2.ty, k2.offset + 1))?;
            Ok(n(&[f.leaf, f.key.objectid]))
        }),
        case("block-item-offset", |img| {
            let f = inode(img, "/d/f010")?;
            img.edit_block(f.leaf, |b| {
                let h = item_header_offset(f.slot) + 17;
                add_u32(b, h, 8);
            })?;
            Ok(n(&[f.leaf, f.key.objectid]))
        }),
        case("block-item-size", |img| {
            let f = inode(img, "/d/f010")?;
            img.edit_block(f.leaf, |b| {
                let h = item_header_offset(f.slot) + 21;
                add_u32(b, h, 1);
            })?;
            Ok(n(&[f.leaf, f.key.objectid]))
        }),
        case("block-nritems", |img| {
            let leaf = leaf_of(img, "/d/f010")?;
            img.edit_block(leaf, |b| add_u32(b, 0x60, 1))?;
            Ok(n(&[leaf]))
        }),
        case("extent-tree-leaf-csum", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let leaf = extent_item(img, bytenr)?.leaf;
            img.poke_block(leaf, None, 1000)?;
            Ok(n(&[leaf]))
        }),
        case("csum-tree-leaf-csum", |img| {
            let (bytenr, _, _) = disk_extent(img, "/reg", 0)?;
            let f = img.items(
                CSUM_TREE_OBJECTID,
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, 0),
                key(EXTENT_CSUM_OBJECTID, EXTENT_CSUM_KEY, bytenr),
            )?;
            let leaf = f.last().ok_or("no csum item")?.leaf;
            img.poke_block(leaf, None, 1000)?;
            Ok(n(&[leaf]))
        }),
        case("root-tree-leaf-csum-one-copy", |img| {
            let leaf = img
                .item(ROOT_TREE_OBJECTID, key(256, ROOT_ITEM_KEY, 0))?
                .leaf;
            img.poke_block(leaf, Some(1), 2000)?;
            Ok(n(&[leaf]))
        }),
        // --- superblocks
        case("super-primary-csum", |img| {
            img.edit_super(0, false, |b| b[0x100] ^= 0x5a)?;
            Ok(vec![Place::N(SUPER_INFO_OFFSET), Place::Text("super")])
        }),
        case("super-mirror-csum", |img| {
            img.edit_super(1, false, |b| b[0x100] ^= 0x5a)?;
            Ok(vec![Place::N(super_mirror_offset(1)), Place::Text("super")])
        }),
        case("super-bytes-used", |img| {
            img.edit_super(0, true, |b| add_u64(b, SUPER_BYTES_USED, 4096))?;
            Ok(vec![Place::N(SUPER_INFO_OFFSET), Place::Text("super")])
        }),
        case("super-mirror-bytes-used", |img| {
            img.edit_super(1, true, |b| add_u64(b, SUPER_BYTES_USED, 4096))?;
            Ok(vec![Place::N(super_mirror_offset(1)), Place::Text("super")])
        }),
        // --- data
        case("data-sector-flipped", |img| {
            let (bytenr, _, offset) = disk_extent(img, "/reg", 0)?;
            let at = bytenr + offset + 5 * 4096 + 17;
            img.poke_data(at, None)?;
            let (_, i) = ino(img, "/reg")?;
            Ok(n(&[bytenr, at - 17, i]))
        }),
        case("data-compressed-flipped", |img| {
            let (bytenr, _, _) = disk_extent(img, "/zdir/comp", 0)?;
            img.poke_data(bytenr + 100, None)?;
            let (_, i) = ino(img, "/zdir/comp")?;
            Ok(n(&[bytenr, i]))
        }),
        case("data-prealloc-flipped", |img| {
            let (bytenr, _, _) = disk_extent(img, "/prealloc", 0)?;
            img.poke_data(bytenr + 8192, None)?;
            Ok(n(&[bytenr]))
        }),
        case("data-nocow-flipped", |img| {
            let (bytenr, _, _) = disk_extent(img, "/nocow", 0)?;
            img.poke_data(bytenr + 8192, None)?;
            Ok(n(&[bytenr]))
        }),
        case("data-snapshot-shared-flipped", |img| {
            let (bytenr, _, _) = disk_extent(img, "/snap/d/sub/big3", 0)?;
            img.poke_data(bytenr + 4096 + 9, None)?;
            Ok(n(&[bytenr, bytenr + 4096]))
        }),
        // --- the subvolume and snapshot trees
        case("subvol-inode-nlink", |img| {
            let f = inode(img, "/sv/d/f100")?;
            img.edit_item(&f, |b| add_u32(b, INODE_NLINK, 1))?;
            Ok(here(&f))
        }),
        case("snapshot-dir-index-deleted", |img| {
            let f = dir_index(img, "/snap/d/f100")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        // --- 4 KiB nodes: several levels
        // In blocks the snapshot shares with the subvolume: found in both trees.
        case4("n4-snapshot-shared-nlink", |img| {
            let f = inode(img, "/snap/d/f200")?;
            img.edit_item(&f, |b| add_u32(b, INODE_NLINK, 1))?;
            Ok(here(&f))
        }),
        case4("n4-snapshot-shared-dir-index-deleted", |img| {
            let f = dir_index(img, "/snap/d2/f150")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, f.key.objectid, get_u64(&f.body, 0)]))
        }),
        case4("n4-snapshot-shared-dir-isize", |img| {
            let f = inode(img, "/snap/d2")?;
            add_body_u64(img, &f, INODE_SIZE, 2)?;
            Ok(here(&f))
        }),
        case4("n4-node-csum-both-copies", |img| {
            let f = inode(img, "/d/f150")?;
            let (node, _) = *f.parents.first().ok_or("fs tree is one leaf")?;
            img.poke_block(node, None, 200)?;
            Ok(n(&[node]))
        }),
        case4("n4-node-csum-one-copy", |img| {
            let f = inode(img, "/d/f150")?;
            let (node, _) = *f.parents.first().ok_or("fs tree is one leaf")?;
            img.poke_block(node, Some(0), 200)?;
            Ok(n(&[node]))
        }),
        case4("n4-node-first-key", |img| {
            let f = inode(img, "/d/f150")?;
            let (node, slot) = *f.parents.first().ok_or("fs tree is one leaf")?;
            let slot = if slot == 0 { 1 } else { slot };
            let child = child_of(img, node, slot)?;
            img.edit_block(node, |b| add_u64(b, key_ptr_offset(slot) + 9, 1))?;
            Ok(n(&[node, child]))
        }),
        case4("n4-node-ptr-generation", |img| {
            let f = inode(img, "/d/f150")?;
            let (node, slot) = *f.parents.first().ok_or("fs tree is one leaf")?;
            img.edit_block(node, |b| add_u64(b, key_ptr_offset(slot) + 25, 1))?;
            Ok(n(&[node, f.leaf]))
        }),
        case4("n4-node-ptr-blockptr", |img| {
            let f = inode(img, "/d/f150")?;
            let (node, slot) = *f.parents.first().ok_or("fs tree is one leaf")?;
            img.edit_block(node, |b| add_u64(b, key_ptr_offset(slot) + 17, 4096))?;
            Ok(n(&[node, f.leaf, f.leaf + 4096]))
        }),
        case4("n4-top-node-csum-one-copy", |img| {
            let fs = img.open()?;
            let root = root_ptr(&fs, FS_TREE_OBJECTID)?;
            drop(fs);
            if root.level < 2 {
                return Err(format!("fs tree has {} levels", root.level + 1));
            }
            img.poke_block(root.bytenr, Some(1), 500)?;
            Ok(n(&[root.bytenr]))
        }),
        case4("n4-leaf-first-item-deleted", |img| {
            // A directory entry that is its leaf's first item: the key pointers
            // above it follow the new first key.
            let (root, d) = ino(img, "/d")?;
            let f = img
                .items(
                    root,
                    key(d, DIR_INDEX_KEY, 0),
                    key(d, DIR_INDEX_KEY, u64::MAX),
                )?
                .into_iter()
                .find(|f| f.slot == 0)
                .ok_or("no DIR_INDEX of /d first in a leaf")?;
            img.delete(&f)?;
            Ok(n(&[f.leaf, d, get_u64(&f.body, 0)]))
        }),
        case4("n4-extent-tree-node-csum", |img| {
            let fs = img.open()?;
            let root = root_ptr(&fs, EXTENT_TREE_OBJECTID)?;
            drop(fs);
            if root.level < 1 {
                return Err("extent tree is one leaf".into());
            }
            img.poke_block(root.bytenr, None, 300)?;
            Ok(n(&[root.bytenr]))
        }),
        case4("n4-inode-nbytes", |img| {
            let f = inode(img, "/d/sub/big7")?;
            add_body_u64(img, &f, INODE_NBYTES, -4096)?;
            Ok(here(&f))
        }),
        case4("n4-extref-deleted", |img| {
            let (root, ino) = ino(img, "/links/target")?;
            let f = img.find(root, |k, _| k.objectid == ino && k.ty == INODE_EXTREF_KEY)?;
            img.delete(&f)?;
            Ok(n(&[
                f.leaf,
                f.key.objectid,
                get_u64(&f.body, EXTREF_PARENT),
            ]))
        }),
        case4("n4-metadata-item-refs", |img| {
            let f = inode(img, "/d/f150")?;
            let (node, _) = *f.parents.first().ok_or("fs tree is one leaf")?;
            let e = extent_item(img, node)?;
            add_body_u64(img, &e, EXTENT_REFS, 1)?;
            Ok(n(&[e.leaf, node]))
        }),
    ]
}

// ---------------------------------------------------------------------------------
// Running the corpus

/// One case's outcome.
struct Row {
    name: String,
    btrfs: Verdict,
    btrfs_lines: Vec<String>,
    ubtrfs: Result<Verdict, String>,
    problems: Vec<Problem>,
    failure: Option<String>,
    note: Option<String>,
}

/// A directory on tmpfs when there is one (the images are sparse; the copies are
/// made and thrown away per case).
fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let mut b = tempfile::Builder::new();
    b.prefix("ubtrfs-check.");
    if shm.is_dir() {
        b.tempdir_in(shm)
    } else {
        b.tempdir()
    }
    .expect("tempdir")
}

fn copy_sparse(from: &Path, to: &Path) {
    run_text(Command::new("cp").arg("--sparse=always").arg(from).arg(to))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Both checkers on `devices`, which `where_` names the damaged place of (none: an
/// undamaged image); `expect_clean`: btrfs check must find it clean too.
fn judge(name: &str, devices: &[PathBuf], where_: Option<&[Place]>, expect_clean: bool) -> Row {
    let child = btrfs_check_start(devices);
    let u = ubtrfs_check(devices, false);
    let plain = ubtrfs_check(devices, true);
    let (btrfs, btrfs_lines) = btrfs_check_end(child);
    let known = KNOWN_DIFFERENCES
        .iter()
        .find(|(c, _)| *c == name)
        .map(|(_, why)| *why);
    let mut failure = None;
    let mut note = None;
    if expect_clean && btrfs != Verdict::Clean {
        failure = Some("btrfs check finds the undamaged image damaged".to_string());
    }
    match &u.verdict {
        Err(e) => failure = Some(format!("ubtrfs check failed to run properly: {e}")),
        Ok(v) if *v != btrfs => match known {
            Some(why) => note = Some(format!("known difference: {why}")),
            None => {
                failure
                    .get_or_insert_with(|| format!("verdicts differ (btrfs {btrfs}, ubtrfs {v})"));
            }
        },
        Ok(_) => {
            if known.is_some() {
                note = Some("listed in KNOWN_DIFFERENCES but the verdicts agree".into());
            }
        }
    }
    // The subvolume trees are checked bottom-up, with the subtrees snapshots share
    // worked out once, and the expected references are kept in memory: the same
    // problems as reading each tree item by item with the references spilled.
    fn lines(r: &UbtrfsRun) -> Vec<&str> {
        let mut v: Vec<&str> = r.problems.iter().map(|p| p.line.as_str()).collect();
        v.sort_unstable();
        v
    }
    if u.verdict.is_ok() && (plain.verdict != u.verdict || lines(&plain) != lines(&u)) {
        let (a, b) = (lines(&u), lines(&plain));
        let only_u: Vec<&&str> = a.iter().filter(|l| !b.contains(l)).take(2).collect();
        let only_p: Vec<&&str> = b.iter().filter(|l| !a.contains(l)).take(2).collect();
        failure.get_or_insert_with(|| {
            format!(
                "checked item by item with spilled references, other problems: {} \
                 against {}; only by default: {only_u:?}; only the plain way: {only_p:?}",
                a.len(),
                b.len()
            )
        });
    }
    if expect_clean && plain.verdict.is_ok() && plain.spilled == 0 {
        failure.get_or_insert_with(|| "the spill of references was not exercised".into());
    }
    if let (Ok(Verdict::Errors), Some(w)) = (&u.verdict, where_) {
        let named = u.problems.iter().any(|p| {
            w.iter().any(|place| match place {
                Place::N(x) => p.block == Some(*x) || p.numbers.contains(x),
                Place::Text(t) => p.text.to_lowercase().contains(&t.to_lowercase()),
            })
        });
        if !named {
            failure.get_or_insert_with(|| format!("no problem names the damaged place {w:?}"));
        }
    }
    Row {
        name: name.to_string(),
        btrfs,
        btrfs_lines,
        ubtrfs: u.verdict,
        problems: u.problems,
        failure,
        note,
    }
}

fn show_rows(rows: &[Row], only_failures: bool) -> String {
    let mut s = String::new();
    for r in rows {
        if only_failures && r.failure.is_none() {
            continue;
        }
        let uv = match &r.ubtrfs {
            Ok(v) => v.to_string(),
            Err(_) => "FAILED".to_string(),
        };
        s.push_str(&format!(
            "{:<36} btrfs {:<6} ubtrfs {:<6} {}\n",
            r.name,
            r.btrfs.to_string(),
            uv,
            r.failure.as_deref().or(r.note.as_deref()).unwrap_or("")
        ));
        if only_failures || r.note.is_some() {
            for p in r.problems.iter().take(3) {
                s.push_str(&format!("    ubtrfs: {}\n", p.line));
            }
            for l in r.btrfs_lines.iter().take(4) {
                s.push_str(&format!("    btrfs:  {l}\n"));
            }
        }
    }
    s
}

#[test]
fn check_agrees_with_btrfs_check_on_damaged_images() {
    if !require_root("check_agrees_with_btrfs_check_on_damaged_images") {
        return;
    }
    let _serial = serial();
    let started = Instant::now();
    let dir = scratch_dir();
    let n16 = make_image(dir.path(), "n16", &[]);
    let n4 = make_image(dir.path(), "n4", &["-n", "4096"]);
    eprintln!("images made in {:?}", started.elapsed());

    let all = corpus();
    let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len(), "case names must be unique");
    assert!(all.len() >= 60, "the corpus has {} cases", all.len());
    for (c, _) in KNOWN_DIFFERENCES {
        assert!(names.contains(c), "KNOWN_DIFFERENCES names no case {c}");
    }
    let only: Option<Vec<String>> = std::env::var("UBTRFS_CHECK_CASES")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let cases: Vec<&Case> = all
        .iter()
        .filter(|c| {
            only.as_ref()
                .is_none_or(|o| o.iter().any(|w| c.name.contains(w.as_str())))
        })
        .collect();

    let mut rows = vec![
        judge("pristine-16k", std::slice::from_ref(&n16), None, true),
        judge("pristine-4k", std::slice::from_ref(&n4), None, true),
    ];
    for c in cases {
        let base = match c.base {
            Base::N16 => &n16,
            Base::N4 => &n4,
        };
        let img = dir.path().join(format!("{}.img", c.name));
        copy_sparse(base, &img);
        let damaged = std::panic::catch_unwind(|| {
            Image::new(std::slice::from_ref(&img)).and_then(|i| (c.damage)(&i))
        })
        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_message(&*p))));
        let row = match damaged {
            Ok(w) => judge(c.name, std::slice::from_ref(&img), Some(&w), false),
            Err(e) => Row {
                name: c.name.to_string(),
                btrfs: Verdict::Clean,
                btrfs_lines: Vec::new(),
                ubtrfs: Err("not run".into()),
                problems: Vec::new(),
                failure: Some(format!("the damage could not be made: {e}")),
                note: None,
            },
        };
        if let Some(keep) = std::env::var_os("UBTRFS_CHECK_KEEP") {
            copy_sparse(&img, &Path::new(&keep).join(format!("{}.img", c.name)));
        }
        let _ = std::fs::remove_file(&img);
        rows.push(row);
    }
    let clean: Vec<&str> = rows
        .iter()
        .skip(2)
        .filter(|r| {
            r.btrfs == Verdict::Clean
                && r.failure
                    .as_deref()
                    .is_none_or(|f| !f.starts_with("the damage"))
        })
        .map(|r| r.name.as_str())
        .collect();
    eprintln!(
        "{} cases in {:?}; btrfs check finds {} of them clean: {clean:?}\n{}",
        rows.len() - 2,
        started.elapsed(),
        clean.len(),
        show_rows(&rows, false)
    );
    let failed = rows.iter().filter(|r| r.failure.is_some()).count();
    assert!(
        failed == 0,
        "{failed} of {} cases failed:\n{}",
        rows.len(),
        show_rows(&rows, true)
    );
}

// ---------------------------------------------------------------------------------
// Golden images

/// Read-only loop devices for image files (btrfs check of a filesystem of several
/// devices finds them by a device scan); detached and forgotten on drop.
struct Loops(Vec<String>);

impl Loops {
    fn attach(files: &[PathBuf]) -> Loops {
        forget_devices(None);
        let mut l = Loops(Vec::new());
        for f in files {
            let dev = run_text(Command::new("losetup").args(["-r", "-f", "--show"]).arg(f))
                .unwrap_or_else(|e| panic!("{e}"));
            l.0.push(dev.trim().to_string());
        }
        for d in &l.0 {
            run_text(Command::new("btrfs").args(["device", "scan", d]))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        l
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        for l in self.0.drain(..) {
            forget_devices(Some(&l));
            let _ = Command::new("losetup").args(["-d", &l]).status();
        }
    }
}

#[test]
fn golden_images_are_clean_for_both() {
    if !require_root("golden_images_are_clean_for_both") {
        return;
    }
    let _serial = serial();
    let mut rows = Vec::new();
    for (name, m) in manifests() {
        let u = unpack_set(&m);
        let (btrfs, btrfs_lines) = if u.devices.len() == 1 {
            btrfs_check_end(btrfs_check_start(&u.devices))
        } else {
            let loops = Loops::attach(&u.devices);
            let r = btrfs_check_end(btrfs_check_start(&[PathBuf::from(&loops.0[0])]));
            drop(loops);
            r
        };
        let uc = ubtrfs_check(&u.devices, false);
        let mut failure = None;
        if btrfs != Verdict::Clean {
            failure = Some("btrfs check finds damage".to_string());
        }
        match &uc.verdict {
            Ok(Verdict::Clean) => {}
            Ok(Verdict::Errors) => {
                failure.get_or_insert_with(|| "ubtrfs check finds damage".into());
            }
            Err(e) => failure = Some(format!("ubtrfs check failed to run properly: {e}")),
        }
        rows.push(Row {
            name,
            btrfs,
            btrfs_lines,
            ubtrfs: uc.verdict,
            problems: uc.problems,
            failure,
            note: None,
        });
    }
    eprintln!("{}", show_rows(&rows, false));
    let failed = rows.iter().filter(|r| r.failure.is_some()).count();
    assert!(
        failed == 0,
        "{failed} of {} golden images are not clean:\n{}",
        rows.len(),
        show_rows(&rows, true)
    );
}
