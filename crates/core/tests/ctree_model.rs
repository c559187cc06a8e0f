//! The CoW b-tree against a BTreeMap model: random inserts (single and batched),
//! deletes, resizes and range deletes in a tree of 4 KiB nodes, so leaves and nodes
//! split, merge, grow and shrink at every level. After every commit the device is
//! reopened from its bytes and the whole tree compared with the model; every block
//! written has passed the tree checker (the commit refuses otherwise).
//! UBTRFS_CTREE_SEED=<n> replays one seed.

use std::collections::BTreeMap;
use std::sync::Arc;
use ubtrfs_core::format::consts::*;
use ubtrfs_core::format::key::Key;
use ubtrfs_core::tools::mkfs::{make_filesystem, MkfsOptions};
use ubtrfs_core::Trans;
use ubtrfs_core::TreeIter;
use ubtrfs_core::{Device, MemDevice};
use ubtrfs_core::{FsInfo, OpenOptions};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const TREE: u64 = 1000;
const TY: u8 = PERSISTENT_ITEM_KEY;

fn key(n: u64) -> Key {
    Key::new(FIRST_FREE_OBJECTID + n / 4, TY, n % 4)
}

fn contents(t: &Trans) -> BTreeMap<Key, Vec<u8>> {
    let ptr = t.root_ptr(TREE).expect("tree exists");
    let mut m = BTreeMap::new();
    for it in TreeIter::new(&t.fs.info, &ptr, Key::MIN, Key::MAX).expect("iter") {
        let it = it.expect("item");
        m.insert(it.key(), it.data().to_vec());
    }
    m
}

fn reopened(dev: &Arc<MemDevice>) -> BTreeMap<Key, Vec<u8>> {
    let copy = MemDevice::new(dev.snapshot(), "reopen");
    let info = FsInfo::open(vec![copy as Arc<dyn Device>], OpenOptions::default()).expect("reopen");
    let ptr = info.subvol_ptr(TREE).expect("root").expect("tree");
    let mut m = BTreeMap::new();
    for it in TreeIter::new(&info, &ptr, Key::MIN, Key::MAX).expect("iter") {
        let it = it.expect("item");
        m.insert(it.key(), it.data().to_vec());
    }
    m
}

fn run(seed: u64, ops: usize) {
    let dev = MemDevice::new(vec![0u8; 112 << 20], "ctree");
    let opts = MkfsOptions {
        nodesize: 4096,
        metadata_profile: 0,
        ..Default::default()
    };
    let mut t = make_filesystem(dev.clone() as Arc<dyn Device>, &opts).expect("mkfs");
    t.create_tree(TREE).expect("create tree");
    let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
    let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    let space = 20_000u64;
    let mut commits = 0u32;
    for op in 0..ops {
        let r = rng.below(100);
        let ctx = format!("seed {seed} op {op}");
        if r < 45 {
            let k = key(rng.below(space));
            let len = match rng.below(10) {
                0 => rng.below(3000) as usize,
                1 => 0,
                _ => rng.below(200) as usize,
            };
            let v: Vec<u8> = (0..len).map(|i| (i as u64 ^ k.objectid) as u8).collect();
            let res = t.insert_item(TREE, &k, &v);
            match model.entry(k) {
                std::collections::btree_map::Entry::Occupied(_) => {
                    assert!(res.is_err(), "{ctx}: duplicate insert accepted")
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    res.unwrap_or_else(|err| panic!("{ctx}: insert {k}: {err}"));
                    e.insert(v);
                }
            }
        } else if r < 55 {
            // A sorted batch of new keys.
            let base = rng.below(space);
            let mut batch = Vec::new();
            for i in 0..rng.below(300) {
                let k = key(base + i);
                if !model.contains_key(&k) {
                    batch.push((k, vec![i as u8; rng.below(64) as usize]));
                }
            }
            t.insert_items(TREE, &batch)
                .unwrap_or_else(|e| panic!("{ctx}: batch: {e}"));
            model.extend(batch);
        } else if r < 80 {
            if let Some(k) = model
                .keys()
                .nth(rng.below(model.len() as u64) as usize)
                .copied()
            {
                t.delete_item(TREE, &k)
                    .unwrap_or_else(|e| panic!("{ctx}: delete {k}: {e}"));
                model.remove(&k);
            }
        } else if r < 90 {
            if let Some(k) = model
                .keys()
                .nth(rng.below(model.len() as u64) as usize)
                .copied()
            {
                let v = vec![7u8; rng.below(1500) as usize];
                t.replace_item(TREE, &k, &v)
                    .unwrap_or_else(|e| panic!("{ctx}: replace {k}: {e}"));
                model.insert(k, v);
            }
        } else if r < 93 {
            let a = rng.below(space);
            let b = a + rng.below(2000);
            let (ka, kb) = (key(a), key(b));
            let n = t
                .delete_range(TREE, &ka, &kb)
                .unwrap_or_else(|e| panic!("{ctx}: range: {e}"));
            let gone: Vec<Key> = model.range(ka..=kb).map(|(k, _)| *k).collect();
            assert_eq!(n as usize, gone.len(), "{ctx}: range delete count");
            for k in gone {
                model.remove(&k);
            }
        } else {
            t.commit().unwrap_or_else(|e| panic!("{ctx}: commit: {e}"));
            commits += 1;
            // Reopening copies the whole device: do it every few commits.
            if commits.is_multiple_of(8) {
                assert!(
                    reopened(&dev) == model,
                    "{ctx}: reopened tree differs from the model"
                );
            }
        }
        if op % 64 == 0 {
            assert!(
                contents(&t) == model,
                "{ctx}: uncommitted tree differs from the model"
            );
        }
    }
    t.commit().expect("final commit");
    assert!(reopened(&dev) == model, "seed {seed}: final tree differs");
}

#[test]
fn cow_btree_matches_model() {
    if let Ok(s) = std::env::var("UBTRFS_CTREE_SEED") {
        run(s.parse().expect("seed"), 3000);
        return;
    }
    let seeds: u64 = std::env::var("UBTRFS_CTREE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    for seed in 1..=seeds {
        let r = std::panic::catch_unwind(|| run(seed, 3000));
        if r.is_err() {
            panic!("reproduce with UBTRFS_CTREE_SEED={seed}");
        }
    }
}
