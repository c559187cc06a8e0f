//! Salvage reads ([`crate::OpenOptions::salvage`], for `ubtrfs extract` and other
//! readers rescuing what they can): a tree block that no copy gives intact — wrong
//! checksum, all zeroes, stale generation (the kernel's "parent transid verify
//! failed"), wrong level, owner or first key, an address outside every chunk — is
//! logged once ([`LostBlock`]) and replaced by a stand-in, so every walk goes on past
//! it. A lost leaf becomes an empty leaf; a lost node becomes a chain of one-pointer
//! nodes, keyed as its parent said, ending in an empty leaf. To the tree code the
//! lost part of the key space is simply empty: a directory lists the entries it still
//! has, a file reads holes where its extent items were lost. File data whose
//! checksum fails in every copy is given out as found (zeros where no copy could be
//! read at all) and logged too.
//!
//! A block whose copies are all intact but older than its parent expects (a lost
//! write left the previous contents) is read as that older copy, as btrfs-progs
//! does when it ignores a transid failure, and logged as lost all the same: its
//! key range shows an older state.
//!
//! Stand-ins exist only in memory, at addresses no chunk maps (from
//! [`STAND_IN_BASE`] up). A salvage open is never written to: the transaction
//! refuses it.

use crate::tree::block_edit as eb;
use crate::tree::tree_checker::Expect;
use crate::tree::TreeBlock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use ubtrfs_format::key::Key;

/// Stand-in blocks get addresses from here up, above any logical address a
/// filesystem uses in practice (2^62 bytes = 4 EiB).
pub(crate) const STAND_IN_BASE: u64 = 1 << 62;

/// Most distinct lost blocks recorded (a wiped device loses every block; the log
/// keeps the first ones, the count goes on).
const LOST_BLOCKS_MAX: usize = 100_000;

thread_local! {
    /// Lost blocks (their stand-ins or stale copies) this thread has read, and
    /// data it was refused: see [`losses_met_by_this_thread`].
    static TOUCHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts a lost block or refused data met by this thread.
pub(crate) fn touched() {
    TOUCHED.with(|t| t.set(t.get() + 1));
}

/// How many times this thread has read a lost block's stand-in (or its stale copy)
/// or been refused damaged data in a salvage open. A reader compares the number
/// before and after a request to tell whether the answer rests on lost metadata:
/// the read-only mount answers a file read that met one with EIO, as the kernel
/// would, while listings go on with what is left.
pub fn losses_met_by_this_thread() -> u64 {
    TOUCHED.with(|t| t.get())
}

/// A tree block that could not be read from any copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostBlock {
    /// Its logical address.
    pub bytenr: u64,
    /// The level its parent expected.
    pub level: Option<u8>,
    /// The first key its parent expected (the start of the key range lost with it).
    pub first_key: Option<Key>,
    /// Why each copy failed.
    pub error: String,
}

#[derive(Default)]
struct State {
    lost: Vec<LostBlock>,
    lost_count: u64,
    /// Stand-ins given out, by the address asked for (a lost block) or made up (a
    /// node's child in a chain).
    stand_ins: HashMap<u64, Arc<TreeBlock>>,
    next_stand_in: u64,
    /// Data that failed its checksums in every copy (given out as found).
    bad_data: Vec<String>,
    bad_data_count: u64,
}

/// The lost-block log and the stand-ins of one salvage open.
#[derive(Default)]
pub(crate) struct Salvage {
    state: Mutex<State>,
    /// Whether any stand-in exists: every block read asks, most opens never lose
    /// one, and the answer then needs no lock.
    any: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Salvage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Salvage")
    }
}

impl Salvage {
    /// A stand-in made earlier for `bytenr` (a lost block read again, or a made-up
    /// child address).
    pub(crate) fn stand_in(&self, bytenr: u64) -> Option<Arc<TreeBlock>> {
        if !self.any.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let b = self.state.lock().ok()?.stand_ins.get(&bytenr).cloned();
        if b.is_some() {
            touched();
        }
        b
    }

    /// Logs block `bytenr` as lost (once) and returns its stand-in.
    pub(crate) fn lose(
        &self,
        bytenr: u64,
        expect: &Expect,
        error: String,
        nodesize: usize,
        fsid: &[u8; 16],
    ) -> Arc<TreeBlock> {
        touched();
        let Ok(mut s) = self.state.lock() else {
            return Arc::new(empty_leaf(bytenr, 0, nodesize, fsid));
        };
        if let Some(b) = s.stand_ins.get(&bytenr) {
            return b.clone();
        }
        s.lost_count += 1;
        self.any.store(true, std::sync::atomic::Ordering::Release);
        if s.lost.len() < LOST_BLOCKS_MAX {
            s.lost.push(LostBlock {
                bytenr,
                level: expect.level,
                first_key: expect.first_key,
                error,
            });
        }
        let generation = expect.generation.unwrap_or(0);
        let key = expect.first_key.unwrap_or_default();
        // From the bottom up: the empty leaf, then one node per level above it.
        let level = expect.level.unwrap_or(0);
        let mut child = STAND_IN_BASE + s.next_stand_in;
        s.next_stand_in += 1;
        let leaf_at = if level == 0 { bytenr } else { child };
        let leaf = Arc::new(empty_leaf(leaf_at, generation, nodesize, fsid));
        s.stand_ins.insert(leaf_at, leaf.clone());
        let mut top = leaf;
        for l in 1..=level {
            let at = if l == level {
                bytenr
            } else {
                let a = STAND_IN_BASE + s.next_stand_in;
                s.next_stand_in += 1;
                a
            };
            let mut data = vec![0u8; nodesize];
            eb::set_header(&mut data, at, generation, 0, l, fsid, &[0; 16]);
            eb::node_insert_ptr(&mut data, 0, &key, child, generation);
            let b = Arc::new(TreeBlock { bytenr: at, data });
            s.stand_ins.insert(at, b.clone());
            child = at;
            top = b;
        }
        top
    }

    /// Logs block `b` as lost (once) although an older intact copy of it is read
    /// in its place (a stale block: the write of its newer contents was lost), and
    /// returns that copy. Its address stays mapped to it for the whole open.
    pub(crate) fn keep_stale(
        &self,
        b: TreeBlock,
        expect: &Expect,
        error: String,
    ) -> Arc<TreeBlock> {
        touched();
        let b = Arc::new(b);
        let Ok(mut s) = self.state.lock() else {
            return b;
        };
        if let Some(old) = s.stand_ins.get(&b.bytenr) {
            return old.clone();
        }
        s.lost_count += 1;
        self.any.store(true, std::sync::atomic::Ordering::Release);
        if s.lost.len() < LOST_BLOCKS_MAX {
            s.lost.push(LostBlock {
                bytenr: b.bytenr,
                level: expect.level,
                first_key: expect.first_key,
                error,
            });
        }
        s.stand_ins.insert(b.bytenr, b.clone());
        b
    }

    /// Logs file data no copy gives intact; the reader gets the bytes as found.
    pub(crate) fn bad_data(&self, msg: String) {
        if let Ok(mut s) = self.state.lock() {
            s.bad_data_count += 1;
            if s.bad_data.len() < LOST_BLOCKS_MAX {
                s.bad_data.push(msg);
            }
        }
    }

    /// The data failures logged so far (the first [`LOST_BLOCKS_MAX`]) and how many.
    pub(crate) fn bad_data_log(&self) -> (Vec<String>, u64) {
        self.state
            .lock()
            .map(|s| (s.bad_data.clone(), s.bad_data_count))
            .unwrap_or_default()
    }

    /// The blocks lost so far (the first [`LOST_BLOCKS_MAX`]) and how many in all.
    pub(crate) fn lost(&self) -> (Vec<LostBlock>, u64) {
        self.state
            .lock()
            .map(|s| (s.lost.clone(), s.lost_count))
            .unwrap_or_default()
    }
}

fn empty_leaf(bytenr: u64, generation: u64, nodesize: usize, fsid: &[u8; 16]) -> TreeBlock {
    let mut data = vec![0u8; nodesize];
    eb::set_header(&mut data, bytenr, generation, 0, 0, fsid, &[0; 16]);
    TreeBlock { bytenr, data }
}
