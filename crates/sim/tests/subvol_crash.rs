//! Crash safety of snapshot creation and subvolume deletion (issue 13). On a
//! `RecordingDevice`: a subvolume `sv` with enough files for a multi-level tree at 4 KiB
//! nodes; a snapshot `snap` of it; changes on both sides; the deletion of `snap`; then
//! the cleaner's drop in small steps (a commit each). For every flush point, the image
//! a power cut leaves right after it and a few cut inside the next batch (prefix,
//! reordered subset, torn write) must:
//! - open at a committed generation, with `sv` holding exactly what that commit had,
//!   and `snap` either absent or complete (every file as at that commit);
//! - let the cleaner resume on it and finish: the dead tree's ROOT_ITEM and
//!   ORPHAN_ITEM gone, `sv` intact, and (a sample, with root) `btrfs check` clean,
//!   which proves every reference the half-done drop left was consistent;
//! - with quotas on from the start: every qgroup equal to a recount once the drop
//!   finished (the snapshot's accounting and each drop step's, cut anywhere).
//!
//! `UBTRFS_CI`/`CI`: the `btrfs check` sample may not be skipped.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::{Device, Filesystem, FsInfo, MemDevice, NewInode, OpenOptions, Trans};
use ubtrfs_sim::fault_dev::{allowed_points, RecordingDevice};
use ubtrfs_sim::host::{
    bash_ok, btrfs_check, btrfs_check_image, panic_message, require_root, write_sparse,
};
use ubtrfs_sim::model::{compare_quotas, write_data, FsConfig, Harness};
use ubtrfs_sim::mount::KernelMount;

/// Files: name -> contents.
type Files = BTreeMap<String, Vec<u8>>;

struct Commit {
    generation: u64,
    flushes: usize,
    sv: Files,
    snap: Option<Files>,
}

const FILES: usize = 1200;

fn t0(n: i64) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + n,
        nsec: 0,
    }
}

fn read_files(fs: &Filesystem, dir: &str) -> Result<Option<Files>, String> {
    let Ok(d) = fs.resolve(dir) else {
        return Ok(None);
    };
    let mut out = Files::new();
    for e in fs.readdir(d).map_err(|e| format!("{dir}: {e}"))? {
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let size = fs
            .stat(e.node)
            .map_err(|e| format!("{dir}/{name}: {e}"))?
            .size;
        let data = fs
            .read(e.node, 0, size as usize)
            .map_err(|e| format!("{dir}/{name}: {e}"))?;
        out.insert(name, data);
    }
    Ok(Some(out))
}

fn write_file(t: &mut Trans, root: u64, dir: u64, name: &str, data: &[u8], n: i64) {
    let a = NewInode {
        mode: 0o100644,
        uid: 0,
        gid: 0,
        rdev: 0,
        time: t0(n),
    };
    let ino = match t.lookup(root, dir, name.as_bytes()).expect("lookup") {
        Some((ino, _, _)) => {
            t.truncate(root, ino, 0, t0(n)).expect("truncate");
            ino
        }
        None => t.create(root, dir, name.as_bytes(), a).expect("create"),
    };
    t.write(root, ino, 0, data, t0(n)).expect("write");
}

fn run_workload() -> (Arc<RecordingDevice>, Vec<Commit>) {
    let fsc = FsConfig {
        nodesize: 4096,
        ..FsConfig::default()
    };
    let rec = RecordingDevice::new(vec![0u8; 160 << 20], "subvol-crash");
    let dev: Arc<dyn Device> = rec.clone();
    let mut h = Harness::mkfs(dev, &fsc).unwrap_or_else(|e| panic!("mkfs: {e}"));
    let t = &mut h.t;
    // Quotas on: every commit accounts the snapshot and the drop's steps.
    t.quota_enable(false).expect("quota enable");
    t.commit().expect("commit");
    let mut commits = Vec::new();
    let mut sv = Files::new();
    let mut snap: Option<Files> = None;
    let mut record = |t: &Trans, sv: &Files, snap: &Option<Files>| {
        commits.push(Commit {
            generation: t.fs.info.sb.generation,
            flushes: rec.flushes(),
            sv: sv.clone(),
            snap: snap.clone(),
        })
    };
    record(t, &sv, &snap);
    let id = t
        .create_subvolume(5, 256, b"sv", 0o755, 0, 0, t0(0))
        .expect("subvolume");
    for i in 0..FILES {
        let name = format!("f{i:04}");
        let data = write_data(if i % 5 == 0 { 6000 } else { 200 }, i as u64);
        write_file(t, id, 256, &name, &data, 1);
        sv.insert(name, data);
    }
    t.commit().expect("commit");
    record(t, &sv, &snap);

    let sid = t
        .create_snapshot(id, 5, 256, b"snap", false, t0(2))
        .expect("snapshot");
    snap = Some(sv.clone());
    t.commit().expect("commit");
    record(t, &sv, &snap);

    for i in (0..FILES).step_by(3) {
        let name = format!("f{i:04}");
        let a = write_data(300, 1000 + i as u64);
        write_file(t, id, 256, &name, &a, 3);
        sv.insert(name, a);
        let name = format!("f{:04}", (i + 3) % FILES);
        let b = write_data(5000, 2000 + i as u64);
        write_file(t, sid, 256, &name, &b, 3);
        if let Some(s) = snap.as_mut() {
            s.insert(name, b);
        }
    }
    t.commit().expect("commit");
    record(t, &sv, &snap);

    t.delete_subvolume(5, 256, b"snap", t0(4)).expect("delete");
    snap = None;
    t.commit().expect("commit");
    record(t, &sv, &snap);
    loop {
        let (done, _) = t.drop_dead_root_step(sid, 8).expect("drop step");
        t.commit().expect("commit");
        record(t, &sv, &snap);
        if done {
            break;
        }
    }
    (rec, commits)
}

fn allowed(commits: &[Commit], n: usize, inside: bool) -> Vec<usize> {
    let at: Vec<usize> = commits.iter().map(|c| c.flushes).collect();
    allowed_points(&at, n, inside)
}

/// Opens a cut image, checks it against the commits it may show, then runs the
/// cleaner to the end on it; returns the finished image.
fn verify(img: Vec<u8>, commits: &[Commit], ok: &[usize]) -> Result<Vec<u8>, String> {
    let dev = MemDevice::new(img, "cut");
    let fs = Filesystem::from_info(
        FsInfo::open(vec![dev.clone() as Arc<dyn Device>], OpenOptions::default())
            .map_err(|e| format!("does not open: {e}"))?,
    );
    let generation = fs.info.sb.generation;
    let Some(&k) = ok.iter().find(|&&k| commits[k].generation == generation) else {
        return Err(format!("generation {generation} is not an allowed commit"));
    };
    let c = &commits[k];
    let sv = read_files(&fs, "/sv")?.unwrap_or_default();
    if sv != c.sv {
        return Err(format!(
            "generation {generation}: sv differs from its commit"
        ));
    }
    match (read_files(&fs, "/snap")?, &c.snap) {
        (None, None) => {}
        (Some(got), Some(want)) if got == *want => {}
        (got, _) => {
            return Err(format!(
                "generation {generation}: snap is {} (want {})",
                got.map_or("absent".to_string(), |g| format!("{} files", g.len())),
                c.snap
                    .as_ref()
                    .map_or("absent".to_string(), |w| format!("{} files", w.len()))
            ))
        }
    }
    drop(fs);
    let info = FsInfo::open(
        vec![dev.clone() as Arc<dyn Device>],
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .map_err(|e| format!("reopen for writing: {e}"))?;
    let mut t = Trans::from_fs(info).map_err(|e| format!("write handle: {e}"))?;
    let left = t.dead_roots().map_err(|e| e.to_string())?;
    t.drop_dead_roots(Some(64), None, &mut |_| {})
        .map_err(|e| format!("generation {generation}: resuming the drop of {left:?}: {e}"))?;
    t.commit().map_err(|e| e.to_string())?;
    if !t.dead_roots().map_err(|e| e.to_string())?.is_empty() {
        return Err("dead roots left after the cleaner finished".into());
    }
    let sv = read_files(&t.fs, "/sv")?.unwrap_or_default();
    if sv != c.sv {
        return Err(format!(
            "generation {generation}: sv changed by the cleaner"
        ));
    }
    // The drop, resumed from wherever the cut left it, ends at exact numbers.
    compare_quotas(&t.fs).map_err(|e| format!("generation {generation}: after the drop: {e}"))?;
    drop(t);
    let mut out = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// `btrfs check` of a cut image as it is, where a drop may be half done. Everything
/// must be clean but progs' qgroup counts: its verifier walks every pointer of the
/// dead tree's nodes, also those before drop_progress whose references the drop
/// already gave up (the drop never rewrites the dead tree), so it counts the dead
/// subvolume's qgroup too high and the others' exclusive too low against exact
/// numbers, whoever wrote them. The counts are checked once the drop has finished
/// (after the kernel's cleaner below, and after ubtrfs's in `verify`).
fn check_half_dropped(path: &std::path::Path) -> Result<(), String> {
    let e = match btrfs_check(path, None) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let qgroup_line = |l: &str| {
        l.starts_with("Counts for qgroup id:")
            || l.starts_with("our:")
            || l.starts_with("disk:")
            || l.starts_with("diff:")
    };
    let other: Vec<&str> = e
        .lines()
        .skip(1)
        .filter(|l| !qgroup_line(l))
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            (low.contains("error") || low.contains("mismatch") || low.contains("wrong"))
                && !(l.starts_with("found ") && l.ends_with("bytes used, error(s) found"))
        })
        .collect();
    if e.contains("Counts for qgroup id:") && other.is_empty() {
        return Ok(());
    }
    Err(format!("the cut image itself: {e}"))
}

/// The kernel, given a cut image as it is (a drop possibly half done by ubtrfs):
/// `btrfs check` is clean on it, the kernel's mount finishes the drop (its cleaner,
/// waited for with `btrfs subvolume sync`), shows `sv` as the commit had it, and
/// the image is clean for `btrfs check` again with no dead root left.
fn kernel_finishes(img: &[u8], want_sv: &Files) -> Result<(), String> {
    let f = ubtrfs_sim::host::ScratchFile::create("subvol-crash-cut", img.len() as u64, |f| {
        write_sparse(f, img)
    })?;
    check_half_dropped(&f.path)?;
    let k = KernelMount::try_new(&[&f.path], "")?;
    let synced = bash_ok(
        std::path::Path::new("/"),
        &format!("btrfs subvolume sync {} >/dev/null", k.q()),
    );
    let mut got = Files::new();
    if let Ok(rd) = std::fs::read_dir(k.path("sv")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            got.insert(name, std::fs::read(e.path()).unwrap_or_default());
        }
    }
    k.try_umount()?;
    synced.map_err(|e| format!("btrfs subvolume sync: {e}"))?;
    if got != *want_sv {
        return Err("the kernel shows another sv than the commit had".into());
    }
    btrfs_check(&f.path, None).map_err(|e| format!("after the kernel's cleaner: {e}"))?;
    // A writing handle on a copy in memory (nothing is written): the dead roots.
    let bytes = std::fs::read(&f.path).map_err(|e| e.to_string())?;
    let info = FsInfo::open(
        vec![MemDevice::new(bytes, "after-kernel") as Arc<dyn Device>],
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .map_err(|e| format!("after the kernel's cleaner: {e}"))?;
    let dead = Trans::from_fs(info)
        .map_err(|e| e.to_string())?
        .dead_roots()
        .map_err(|e| e.to_string())?;
    if !dead.is_empty() {
        return Err(format!(
            "dead roots {dead:?} left after the kernel's cleaner"
        ));
    }
    Ok(())
}

#[test]
fn snapshot_and_deletion_survive_every_cut() {
    let (rec, commits) = run_workload();
    let flushes = rec.flushes();
    let btrfs = require_root("snapshot_and_deletion_survive_every_cut: the btrfs check sample");
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut kernel_done = 0;
    for n in 0..=flushes {
        for (what, img, inside) in rec.cut_images(n, 2) {
            let ok = allowed(&commits, n, inside);
            if ok.is_empty() {
                continue; // before mkfs finished
            }
            // A sample is finished by the kernel instead: every fourth flush point,
            // between the ones checked after ubtrfs's cleaner.
            if btrfs && n % 4 == 2 && !inside {
                let dev = MemDevice::new(img.clone(), "cut");
                let generation = FsInfo::open(vec![dev as Arc<dyn Device>], OpenOptions::default())
                    .map(|i| i.sb.generation)
                    .unwrap_or(0);
                if let Some(&k) = ok.iter().find(|&&k| commits[k].generation == generation) {
                    kernel_done += 1;
                    if let Err(e) = kernel_finishes(&img, &commits[k].sv) {
                        failures.push(format!("{what}: kernel: {e}"));
                    }
                }
            }
            let r = catch_unwind(AssertUnwindSafe(|| verify(img, &commits, &ok)));
            match r {
                Ok(Ok(done)) => {
                    // A sample goes to btrfs check: every fourth flush point.
                    if btrfs && n % 4 == 0 && !inside {
                        checked += 1;
                        if let Err(e) =
                            btrfs_check_image(done.len() as u64, |f| write_sparse(f, &done), None)
                        {
                            failures.push(format!("{what}: btrfs check after the cleaner: {e}"));
                        }
                    }
                }
                Ok(Err(e)) => failures.push(format!("{what}: {e}")),
                Err(p) => failures.push(format!("{what}: PANIC {}", panic_message(&*p))),
            }
        }
    }
    eprintln!(
        "subvol crash: {} commits, {flushes} flush points, {checked} btrfs checks after \
         ubtrfs's cleaner, {kernel_done} cuts finished by the kernel",
        commits.len()
    );
    if btrfs {
        assert!(
            kernel_done > 3,
            "the kernel finished {kernel_done} cut images"
        );
    }
    assert!(commits.len() > 8, "the drop took several commits");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A deleted subvolume's id is not given again while the handle that dropped it
/// lives (as the kernel's free_objectid only grows during a mount): on a mount a
/// descriptor still open in the deleted subvolume would otherwise name a file of the
/// new one (FUSE node ids are built from tree ids). Without the floor, the new
/// subvolume takes the dropped one's id: the root tree's highest id went back down.
#[test]
fn a_dropped_subvolume_id_is_not_reused_by_the_same_handle() {
    let rec = RecordingDevice::new(vec![0u8; 160 << 20], "subvol-ids");
    let dev: Arc<dyn Device> = rec.clone();
    let fsc = FsConfig {
        nodesize: 4096,
        ..FsConfig::default()
    };
    let mut h = Harness::mkfs(dev, &fsc).unwrap_or_else(|e| panic!("mkfs: {e}"));
    let t = &mut h.t;
    let a = t
        .create_subvolume(5, 256, b"a", 0o755, 0, 0, t0(0))
        .expect("subvolume a");
    let b = t
        .create_subvolume(5, 256, b"b", 0o755, 0, 0, t0(0))
        .expect("subvolume b");
    assert!(b > a);
    t.commit().expect("commit");
    t.delete_subvolume(5, 256, b"b", t0(1)).expect("delete b");
    t.commit().expect("commit");
    let dropped = t
        .drop_dead_roots(None, None, &mut |_| {})
        .expect("drop the deleted subvolume");
    assert_eq!(dropped, vec![b]);
    t.commit().expect("commit");
    let c = t
        .create_subvolume(5, 256, b"c", 0o755, 0, 0, t0(2))
        .expect("subvolume c");
    assert!(c > b, "subvolume id {b} was dropped and given again ({c})");
    t.commit().expect("commit");
}
