//! Replays the fuzz harness (`ubtrfs_core::fuzzing::harness`) over every input that once
//! crashed, hung or exhausted memory (crates/core/tests/fuzz_inputs/) and over every
//! fuzz seed (fuzz/corpus/image/), on stable `cargo test` and without root. Also builds
//! a few hostile images by hand and checks that each is refused with an error that
//! says what is wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use ubtrfs_core::format::consts::*;
use ubtrfs_core::format::key::Key;
use ubtrfs_core::fuzzing::harness::{self, fix_checksums, run, seed_from_image, FLAG_FIX_CSUMS};
use ubtrfs_core::fuzzing::sparse_dev::{decode, encode, SparseDevice};
use ubtrfs_core::Device;
use ubtrfs_core::{Filesystem, FsInfo, OpenOptions};

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn seeds_dir() -> PathBuf {
    manifest_dir().join("../../fuzz/corpus/image")
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn regression_inputs_do_not_crash() {
    let dir = manifest_dir().join("tests/fuzz_inputs");
    let files = files_in(&dir);
    assert!(!files.is_empty(), "no inputs in {}", dir.display());
    for f in files {
        let data = std::fs::read(&f).expect("read input");
        let out = run(&data);
        eprintln!(
            "{}: open {:?}, {} entries, {} errors",
            f.display(),
            out.open_error,
            out.entries,
            out.errors.len()
        );
    }
}

/// Every seed is a kernel-made image: it must open and walk, take the write phase's
/// changes and commit them, and walk again, without a single error.
#[test]
fn seeds_open_and_walk_cleanly() {
    let files = files_in(&seeds_dir());
    assert!(files.len() >= 5, "seeds missing");
    for f in files {
        let data = std::fs::read(&f).expect("read seed");
        assert!(data.len() < 300 << 10, "{}: seed too big", f.display());
        let out = run(&data);
        assert!(out.decoded, "{}", f.display());
        assert_eq!(out.open_error, None, "{}", f.display());
        assert!(out.errors.is_empty(), "{}: {:?}", f.display(), out.errors);
        assert!(out.dumped, "{}", f.display());
        assert!(out.entries > 3, "{}: {} entries", f.display(), out.entries);
        assert!(
            out.write_committed,
            "{}: the write phase did not commit",
            f.display()
        );
        // The same input without checksum repair must behave the same.
        let mut raw = data.clone();
        raw[0] &= !FLAG_FIX_CSUMS;
        let out2 = run(&raw);
        assert_eq!(out2.open_error, None, "{}", f.display());
        assert_eq!(out2.entries, out.entries, "{}", f.display());
    }
}

/// A kernel image (from the seeds) as plain bytes.
fn seed_image(name: &str) -> Vec<u8> {
    let data = std::fs::read(seeds_dir().join(name)).expect("seed");
    let dev = decode(&data[1..]).expect("decodes");
    let mut img = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut img).expect("read");
    img
}

fn open_image(img: &[u8]) -> ubtrfs_core::Result<FsInfo> {
    let dev: Arc<dyn Device> = Arc::new(SparseDevice::from_image(img, "test image"));
    FsInfo::open(vec![dev], OpenOptions::default())
}

/// Opens and walks everything the harness walks; the first error.
fn open_and_walk(img: &[u8]) -> Result<(), String> {
    let info = open_image(img).map_err(|e| e.to_string())?;
    let fs = Filesystem::from_info(info);
    for id in [ROOT_TREE_OBJECTID, EXTENT_TREE_OBJECTID, FS_TREE_OBJECTID] {
        let root = fs.info.tree_ptr(id).expect("tree");
        let mut n = 0;
        ubtrfs_core::walk_items(&fs.info, &root, Key::MIN, |_, _| {
            n += 1;
            Ok(n < 1_000_000)
        })
        .map_err(|e| e.to_string())?;
    }
    fs.subvolumes().map_err(|e| e.to_string())?;
    let mut stack = vec![fs.top()];
    let mut n = 0;
    while let Some(node) = stack.pop() {
        n += 1;
        assert!(n < 100_000, "walk does not end");
        let st = fs.stat(node).map_err(|e| e.to_string())?;
        if st.mode & ubtrfs_core::mode::S_IFMT == ubtrfs_core::mode::S_IFDIR {
            for e in fs.readdir(node).map_err(|e| e.to_string())? {
                stack.push(e.node);
            }
        }
    }
    Ok(())
}

/// Physical offsets of every copy of a logical address on the (single) device.
fn physicals(info: &FsInfo, logical: u64) -> Vec<usize> {
    let e = info.chunk_map.lookup(logical).expect("mapped");
    (0..e.num_mirrors())
        .map(|m| e.map(logical, m).expect("maps").offset as usize)
        .collect()
}

/// Re-checksums every tree block and superblock of an edited image.
fn fixed(img: &[u8]) -> Vec<u8> {
    let dev = SparseDevice::from_image(img, "x");
    fix_checksums(&dev);
    let mut out = vec![0u8; img.len()];
    dev.read_at(0, &mut out).expect("read");
    out
}

fn expect_err(r: Result<(), String>, words: &[&str]) -> String {
    let e = r.expect_err("hostile image accepted");
    for w in words {
        assert!(e.contains(w), "error {e:?} does not mention {w:?}");
    }
    e
}

#[test]
fn truncated_image_is_refused() {
    let img = seed_image("kernel-n4k-basic.seed");
    assert_eq!(open_and_walk(&img), Ok(()));
    // Superblock kept, everything the chunk tree and root tree need cut off.
    let e = expect_err(open_and_walk(&img[..1 << 20]), &["beyond the end"]);
    eprintln!("{e}");
    let e = expect_err(open_and_walk(&img[..4096]), &["too small"]);
    eprintln!("{e}");
    assert!(run(&seed_from_image(&img[..1 << 20])).open_error.is_some());
}

#[test]
fn zero_filled_image_is_refused() {
    let img = vec![0u8; 120 << 20];
    let e = expect_err(open_and_walk(&img), &["no valid superblock"]);
    eprintln!("{e}");
    let out = run(&seed_from_image(&img));
    assert!(out.decoded);
    assert!(out.open_error.is_some());
}

#[test]
fn superblock_with_bad_checksum_is_refused() {
    let mut img = seed_image("kernel-n4k-basic.seed");
    // A byte of the label: covered by the checksum, checked by nothing else. With the
    // copy at 64 MiB intact the filesystem still opens (from that copy).
    let label = SUPER_INFO_OFFSET as usize + 0x12b;
    img[label] ^= 0x55;
    let info = open_image(&img).expect("opens from the mirror");
    let w = info.take_warnings().join("\n");
    assert!(w.contains("checksum mismatch"), "{w}");
    let mirror = super_mirror_offset(1) as usize + 0x12b;
    img[mirror] ^= 0x55;
    let e = expect_err(open_and_walk(&img), &["superblock", "checksum mismatch"]);
    eprintln!("{e}");
    // The harness repairs checksums when asked: then the image opens.
    let out = run(&seed_from_image(&img));
    assert_eq!(out.open_error, None);
}

#[test]
fn tree_block_checksum_mismatch_is_refused() {
    let mut img = seed_image("kernel-n4k-basic.seed");
    let info = open_image(&img).expect("opens");
    let copies = physicals(&info, info.sb.root);
    assert_eq!(copies.len(), 2, "DUP metadata");
    // One bad copy: the other is used, with a warning naming the bad one.
    img[copies[0] + 2000] ^= 1;
    let info = open_image(&img).expect("opens from copy 2");
    let w = info.take_warnings().join("\n");
    assert!(
        w.contains("checksum mismatch") && w.contains("used copy 2"),
        "{w}"
    );
    assert_eq!(open_and_walk(&img), Ok(()));
    // Both bad: refused.
    img[copies[1] + 2000] ^= 1;
    let e = expect_err(
        open_and_walk(&img),
        &[
            "copy 1 of tree block",
            "copy 2 of tree block",
            "checksum mismatch",
            "root of tree 1",
        ],
    );
    eprintln!("{e}");
}

#[test]
fn item_pointing_outside_its_leaf_is_refused() {
    let mut img = seed_image("kernel-n4k-basic.seed");
    let info = open_image(&img).expect("opens");
    // The chunk tree of a fresh filesystem is one leaf.
    let root = info.sb.chunk_root;
    assert_eq!(
        info.sb.chunk_root_level, 0,
        "chunk tree is a leaf in this seed"
    );
    for at in physicals(&info, root) {
        // Item 0's data offset (after its 17-byte key) points past the block's end.
        let item0 = at + HEADER_SIZE + 17;
        img[item0..item0 + 4].copy_from_slice(&60000u32.to_le_bytes());
    }
    let img = fixed(&img);
    let e = expect_err(open_and_walk(&img), &[&format!("tree block {root}")]);
    eprintln!("{e}");
    let out = run(&seed_from_image(&img));
    assert!(out.open_error.is_some());
}

#[test]
fn node_pointing_to_itself_is_refused() {
    let mut img = seed_image("kernel-n4k-many.seed");
    let info = open_image(&img).expect("opens");
    let fs_root = info.tree_ptr(FS_TREE_OBJECTID).expect("fs tree");
    assert!(fs_root.level > 0, "fs tree of this seed has nodes");
    for at in physicals(&info, fs_root.bytenr) {
        // Every slot of the root node points back at the node itself.
        let n = u32::from_le_bytes(img[at + 0x60..at + 0x64].try_into().expect("4")) as usize;
        for i in 0..n {
            let p = at + HEADER_SIZE + i * KEY_PTR_SIZE + 17;
            img[p..p + 8].copy_from_slice(&fs_root.bytenr.to_le_bytes());
        }
    }
    let img = fixed(&img);
    let e = expect_err(
        open_and_walk(&img),
        &[&format!("tree block {}", fs_root.bytenr), "level"],
    );
    eprintln!("{e}");
    let out = run(&seed_from_image(&img));
    assert_eq!(out.open_error, None);
    assert!(!out.errors.is_empty());
}

#[test]
fn two_level_cycle_between_nodes_is_refused() {
    // A child pointer aimed at the root tree's own root block from a different tree:
    // the fs tree's first child becomes the root tree root (a leaf of another tree).
    let mut img = seed_image("kernel-n4k-many.seed");
    let info = open_image(&img).expect("opens");
    let fs_root = info.tree_ptr(FS_TREE_OBJECTID).expect("fs tree");
    for at in physicals(&info, fs_root.bytenr) {
        let p = at + HEADER_SIZE + 17;
        img[p..p + 8].copy_from_slice(&info.sb.root.to_le_bytes());
    }
    let img = fixed(&img);
    let e = expect_err(open_and_walk(&img), &["tree block"]);
    eprintln!("{e}");
}

#[test]
fn encoding_round_trips_a_seed() {
    let img = seed_image("kernel-n4k-basic.seed");
    let enc = encode(&img);
    let dev = decode(&enc).expect("decodes");
    assert_eq!(dev.size(), img.len() as u64);
    harness::fuzz_one(&seed_from_image(&img));
}

/// Logical addresses of `n` unused (all-zero in every copy) metadata blocks.
fn free_metadata_blocks(info: &FsInfo, img: &[u8], n: usize) -> Vec<u64> {
    let ns = info.nodesize as u64;
    let mut out = Vec::new();
    for e in info.chunk_map.iter() {
        if e.ty & BLOCK_GROUP_METADATA == 0 {
            continue;
        }
        let mut l = e.start;
        while l + ns <= e.start + e.length && out.len() < n {
            let free = physicals(info, l)
                .iter()
                .all(|&p| img[p..p + ns as usize].iter().all(|&b| b == 0));
            if free {
                out.push(l);
            }
            l += ns;
        }
    }
    assert_eq!(out.len(), n, "no room for new blocks");
    out
}

fn put_block(info: &FsInfo, img: &mut [u8], logical: u64, block: &[u8]) {
    for p in physicals(info, logical) {
        img[p..p + block.len()].copy_from_slice(block);
    }
}

#[test]
fn leaves_reached_twice_are_refused() {
    // The fs tree gets a new level-2 root R with two children: its old root N1 (slots
    // k0..kn) and a copy N2 of N1 without slot 0 (slots k1..kn). Both point at the
    // same leaves, each with the right first key, so the per-block checks all pass;
    // only the key order across leaves shows that L1..Ln come round a second time.
    // (Stacked over more levels the same trick multiplies the walk exponentially.)
    let mut img = seed_image("kernel-n4k-many.seed");
    let info = open_image(&img).expect("opens");
    let ns = info.nodesize as usize;
    let fs_root = info.tree_ptr(FS_TREE_OBJECTID).expect("fs tree");
    assert_eq!(
        fs_root.level, 1,
        "fs tree of this seed is one node over leaves"
    );
    let n1_at = physicals(&info, fs_root.bytenr)[0];
    let n1 = img[n1_at..n1_at + ns].to_vec();
    let nr = u32::from_le_bytes(n1[0x60..0x64].try_into().expect("4")) as usize;
    assert!(nr >= 3);
    let [r, n2] = free_metadata_blocks(&info, &img, 2)[..] else {
        unreachable!()
    };
    // N2: N1 minus its first slot.
    let mut b2 = n1.clone();
    b2[0x30..0x38].copy_from_slice(&n2.to_le_bytes());
    b2[0x60..0x64].copy_from_slice(&(nr as u32 - 1).to_le_bytes());
    let ptrs = HEADER_SIZE..HEADER_SIZE + nr * KEY_PTR_SIZE;
    b2.copy_within(ptrs.start + KEY_PTR_SIZE..ptrs.end, ptrs.start);
    b2[ptrs.end - KEY_PTR_SIZE..ptrs.end].fill(0);
    // R: two pointers, with N1's and N2's first keys.
    let mut br = vec![0u8; ns];
    br[..HEADER_SIZE].copy_from_slice(&n1[..HEADER_SIZE]);
    br[0x30..0x38].copy_from_slice(&r.to_le_bytes());
    br[0x60..0x64].copy_from_slice(&2u32.to_le_bytes());
    br[0x64] = 2;
    let gen = &n1[0x50..0x58];
    let slot = |i: usize| HEADER_SIZE + i * KEY_PTR_SIZE;
    br[slot(0)..slot(0) + 17].copy_from_slice(&n1[slot(0)..slot(0) + 17]);
    br[slot(0) + 17..slot(0) + 25].copy_from_slice(&fs_root.bytenr.to_le_bytes());
    br[slot(0) + 25..slot(0) + 33].copy_from_slice(gen);
    br[slot(1)..slot(1) + 17].copy_from_slice(&n1[slot(1)..slot(1) + 17]);
    br[slot(1) + 17..slot(1) + 25].copy_from_slice(&n2.to_le_bytes());
    br[slot(1) + 25..slot(1) + 33].copy_from_slice(gen);
    put_block(&info, &mut img, n2, &b2);
    put_block(&info, &mut img, r, &br);
    // The fs tree's ROOT_ITEM: bytenr at 176, level at 238.
    let rt = info.root_tree_ptr();
    let key = Key::new(FS_TREE_OBJECTID, ROOT_ITEM_KEY, 0);
    let path = ubtrfs_core::search_slot(&info, &rt, &key).expect("search");
    assert_eq!(path.key().expect("key"), key);
    let leaf = path.leaf();
    let item = leaf.view().item(path.slot()).expect("item");
    for p in physicals(&info, leaf.bytenr) {
        let at = p + HEADER_SIZE + item.offset as usize;
        img[at + 176..at + 184].copy_from_slice(&r.to_le_bytes());
        img[at + 238] = 2;
    }
    let img = fixed(&img);
    let e = expect_err(open_and_walk(&img), &["tree block", "does not follow"]);
    eprintln!("{e}");
    let out = run(&seed_from_image(&img));
    assert_eq!(out.open_error, None);
    assert!(out.errors.iter().any(|e| e.contains("does not follow")));
    // `check` says so for the fs tree in the same words whether it checks the tree
    // bottom-up (where, without the rule, the leaves would be counted twice, and
    // stacked levels would multiply them) or item by item.
    let fs_tree_problems = |item_by_item: bool| -> Vec<String> {
        let fs = Filesystem::from_info(open_image(&img).expect("opens"));
        let opts = ubtrfs_core::CheckOptions {
            item_by_item,
            ..Default::default()
        };
        let r = ubtrfs_core::check_filesystem(&fs, &opts, &mut |_, _| {}).expect("check runs");
        let mut v: Vec<String> = r
            .problems
            .iter()
            .filter(|p| p.tree == Some(FS_TREE_OBJECTID))
            .map(|p| p.to_string())
            .collect();
        v.sort();
        v
    };
    let bottom_up = fs_tree_problems(false);
    assert!(
        bottom_up.iter().any(|p| p.contains("does not follow")),
        "{bottom_up:?}"
    );
    assert_eq!(bottom_up, fs_tree_problems(true));
}

/// Random byte mutations of every seed's metadata (checksums repaired, so the damage
/// reaches the item parsers and `check`): the harness, which ends with the whole
/// check, must return for each. Deterministic; `UBTRFS_MUTATIONS` sets the count per
/// seed. An input that panics is written to the temporary directory to be committed
/// under tests/fuzz_inputs/.
#[test]
fn random_mutations_never_panic() {
    let per_seed: u64 = std::env::var("UBTRFS_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for f in files_in(&seeds_dir()) {
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        let img = seed_image(&name);
        // Pages holding anything: metadata and small files.
        let pages: Vec<usize> = (0..img.len() / 4096)
            .filter(|&p| p >= 16 && img[p * 4096..(p + 1) * 4096].iter().any(|&b| b != 0))
            .collect();
        for i in 0..per_seed {
            let mut m = img.clone();
            for _ in 0..1 + next() % 4 {
                let page = pages[(next() % pages.len() as u64) as usize];
                // Past the block header's checksum and fsid most of the time.
                let off = page * 4096 + 32 + (next() % (4096 - 32)) as usize;
                m[off] = match next() % 4 {
                    0 => 0,
                    1 => 0xff,
                    2 => m[off] ^ (1 << (next() % 8)),
                    _ => next() as u8,
                };
            }
            let input = seed_from_image(&m);
            let r = std::panic::catch_unwind(|| run(&input));
            if r.is_err() {
                let out = std::env::temp_dir().join(format!("ubtrfs-mutation-{name}-{i}"));
                std::fs::write(&out, &input).expect("write crashing input");
                panic!(
                    "{name} mutation {i} panicked; input saved in {}",
                    out.display()
                );
            }
        }
    }
}
