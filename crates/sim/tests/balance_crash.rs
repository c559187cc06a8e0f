//! Crash safety of balance (issue 14). On a `RecordingDevice`: quotas on, a
//! subvolume `sv` with a multi-level tree at 4 KiB nodes and data extents, a
//! snapshot `snap` of it, changes on both sides (shared and FULL_BACKREF
//! blocks), then a full balance (data, metadata, system) with DUP metadata:
//! the BALANCE item's commit, commits per 4 MiB piece of each relocated chunk
//! (`Trans::reloc_batch_bytes`), the item's removal. For every flush point, the image a power cut leaves right after it
//! and a few cut inside the next batch (prefix, reordered subset, torn write)
//! must:
//! - open at a committed generation with exactly the files written before the
//!   balance (a balance never changes contents), qgroups equal to a recount;
//! - let `balance resume` (the kernel's resume rules) finish what the BALANCE
//!   item says is left: files the same, qgroups exact, no item left;
//! - (a sample, with root) pass `btrfs check --readonly --check-data-csum`
//!   after the resume, and, cut mid-balance, be finished by the kernel itself:
//!   it resumes the BALANCE item at mount, and `btrfs check` is clean after.
//!
//! `UBTRFS_CI`/`CI`: the root-only sample may not be skipped.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ubtrfs_core::format::items::Timespec;
use ubtrfs_core::{
    balance_flags, BalanceEnd, BalanceRequest, Device, Filesystem, FsInfo, MemDevice, NewInode,
    OpenOptions, Trans,
};
use ubtrfs_sim::fault_dev::{allowed_points, RecordingDevice};
use ubtrfs_sim::host::{btrfs_check, panic_message, require_root, sh, write_sparse};
use ubtrfs_sim::model::{compare_quotas, write_data, FsConfig, Harness};

/// Files: path -> contents.
type Files = BTreeMap<String, Vec<u8>>;

const FILES: usize = 700;

fn t0(n: i64) -> Timespec {
    Timespec {
        sec: 1_700_000_000 + n,
        nsec: 0,
    }
}

fn read_all(fs: &Filesystem) -> Result<Files, String> {
    let mut out = Files::new();
    for dir in ["/sv", "/snap"] {
        let Ok(d) = fs.resolve(dir) else { continue };
        for e in fs.readdir(d).map_err(|e| format!("{dir}: {e}"))? {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let size = fs
                .stat(e.node)
                .map_err(|e| format!("{dir}/{name}: {e}"))?
                .size;
            let data = fs
                .read(e.node, 0, size as usize)
                .map_err(|e| format!("{dir}/{name}: {e}"))?;
            out.insert(format!("{dir}/{name}"), data);
        }
    }
    Ok(out)
}

fn write_file(t: &mut Trans, root: u64, name: &str, data: &[u8]) {
    let a = NewInode {
        mode: 0o100644,
        uid: 0,
        gid: 0,
        rdev: 0,
        time: t0(1),
    };
    let ino = match t.lookup(root, 256, name.as_bytes()).expect("lookup") {
        Some((ino, _, _)) => {
            t.truncate(root, ino, 0, t0(1)).expect("truncate");
            ino
        }
        None => t.create(root, 256, name.as_bytes(), a).expect("create"),
    };
    t.write(root, ino, 0, data, t0(1)).expect("write");
}

/// The workload; returns the device, the files, and the flush count at which
/// each commit from the one before the balance on became durable, with its
/// generation.
fn run_workload() -> (Arc<RecordingDevice>, Files, Vec<(u64, usize)>) {
    let fsc = FsConfig {
        nodesize: 4096,
        dup: true,
        ..FsConfig::default()
    };
    let rec = RecordingDevice::new(vec![0u8; 160 << 20], "balance-crash");
    let dev: Arc<dyn Device> = rec.clone();
    let mut h = Harness::mkfs(dev, &fsc).unwrap_or_else(|e| panic!("mkfs: {e}"));
    let t = &mut h.t;
    t.quota_enable(false).expect("quota enable");
    let id = t
        .create_subvolume(5, 256, b"sv", 0o755, 0, 0, t0(0))
        .expect("subvolume");
    for i in 0..FILES {
        let data = write_data(if i % 4 == 0 { 9000 } else { 300 }, i as u64);
        write_file(t, id, &format!("f{i:04}"), &data);
    }
    // Enough data for several data chunks (16 MiB each on this device).
    for i in 0..40 {
        write_file(t, id, &format!("big{i:02}"), &write_data(1 << 20, 5000 + i));
    }
    t.commit().expect("commit");
    let sid = t
        .create_snapshot(id, 5, 256, b"snap", false, t0(2))
        .expect("snapshot");
    t.commit().expect("commit");
    for i in (0..FILES).step_by(5) {
        write_file(
            t,
            id,
            &format!("f{i:04}"),
            &write_data(7000, 1000 + i as u64),
        );
        write_file(
            t,
            sid,
            &format!("f{:04}", (i + 2) % FILES),
            &write_data(400, 2000 + i as u64),
        );
    }
    t.commit().expect("commit");
    let files = read_all(&t.fs).expect("read back");
    let g0 = t.fs.info.sb.generation;
    let f0 = rec.flushes();
    let req = BalanceRequest {
        flags: balance_flags::DATA | balance_flags::METADATA | balance_flags::SYSTEM,
        ..Default::default()
    };
    // Groups moved in pieces of 4 MiB: several commits per group, cut between.
    t.reloc_batch_bytes = 4 << 20;
    let (end, p) = t.balance(&req, &mut |_, _| {}, &|| false).expect("balance");
    assert_eq!(end, BalanceEnd::Finished);
    assert!(p.completed >= 5, "{p:?}");
    // Every commit flushes twice (blocks, then superblocks) and nothing else
    // flushes: commit k after g0 is durable at flush f0 + 2k.
    let g1 = t.fs.info.sb.generation;
    assert_eq!(
        rec.flushes(),
        f0 + 2 * (g1 - g0) as usize,
        "two flushes per commit"
    );
    let commits = (0..=g1 - g0)
        .map(|k| (g0 + k, f0 + 2 * k as usize))
        .collect();
    (rec, files, commits)
}

fn open_rw(dev: &Arc<MemDevice>) -> Result<Trans, String> {
    let info = FsInfo::open(
        vec![dev.clone() as Arc<dyn Device>],
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .map_err(|e| format!("open for writing: {e}"))?;
    Trans::from_fs(info).map_err(|e| format!("write handle: {e}"))
}

/// Checks a cut image and resumes its balance; returns the finished image and
/// whether a balance was left to resume.
fn verify(img: Vec<u8>, files: &Files, ok: &[u64]) -> Result<(Vec<u8>, bool), String> {
    let dev = MemDevice::new(img, "cut");
    let fs = Filesystem::from_info(
        FsInfo::open(vec![dev.clone() as Arc<dyn Device>], OpenOptions::default())
            .map_err(|e| format!("does not open: {e}"))?,
    );
    let generation = fs.info.sb.generation;
    if !ok.contains(&generation) {
        return Err(format!(
            "generation {generation} is not an allowed commit {ok:?}"
        ));
    }
    if read_all(&fs)? != *files {
        return Err(format!("generation {generation}: files differ"));
    }
    compare_quotas(&fs).map_err(|e| format!("generation {generation}: {e}"))?;
    drop(fs);
    let mut t = open_rw(&dev)?;
    let left = t.balance_item().map_err(|e| e.to_string())?;
    if let Some(req) = left {
        let (end, _) = t
            .balance(&req.for_resume(), &mut |_, _| {}, &|| false)
            .map_err(|e| format!("generation {generation}: resume: {e}"))?;
        if end != BalanceEnd::Finished {
            return Err("resume did not finish".into());
        }
    }
    if t.balance_item().map_err(|e| e.to_string())?.is_some() {
        return Err("a BALANCE item is left after the resume".into());
    }
    if read_all(&t.fs)? != *files {
        return Err(format!(
            "generation {generation}: files differ after the resume"
        ));
    }
    compare_quotas(&t.fs).map_err(|e| format!("generation {generation}: after the resume: {e}"))?;
    drop(t);
    let mut out = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut out).map_err(|e| e.to_string())?;
    Ok((out, left.is_some()))
}

/// The kernel mounts a cut image holding a BALANCE item, resumes the balance
/// itself and finishes it; then btrfs check.
fn kernel_finishes(img: &[u8]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("cut.img");
    let f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
    f.set_len(img.len() as u64).map_err(|e| e.to_string())?;
    write_sparse(&f, img).map_err(|e| e.to_string())?;
    drop(f);
    let k = ubtrfs_sim::mount::KernelMount::try_new(&[&path], "rw")?;
    // The resume runs in a kernel thread; `balance resume` waits for a running
    // one or says there is none.
    let _ = sh(&format!(
        "btrfs balance resume {} >/dev/null 2>&1 || true",
        k.q()
    ));
    let mut status = String::new();
    for _ in 0..600 {
        status = sh(&format!("btrfs balance status {} || true", k.q()));
        if status.contains("No balance found") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    k.try_umount()?;
    if !status.contains("No balance found") {
        return Err(format!("the kernel did not finish the balance: {status}"));
    }
    btrfs_check(&path, None).map(|_| ())
}

#[test]
fn balance_survives_every_cut() {
    let (rec, files, commits) = run_workload();
    let flushes = rec.flushes();
    let root = require_root("balance_survives_every_cut: the btrfs check and kernel sample");
    let at: Vec<usize> = commits.iter().map(|c| c.1).collect();
    let first = at[0];
    let mut failures = Vec::new();
    let (mut checked, mut kernel) = (0, 0);
    for n in first..=flushes {
        for (what, img, inside) in rec.cut_images(n, 3) {
            let ok: Vec<u64> = allowed_points(&at, n, inside)
                .into_iter()
                .map(|k| commits[k].0)
                .collect();
            let sample = root && !inside && (n - first).is_multiple_of(4);
            let mid_balance = commits.first().is_some_and(|c| c.1 < n) && n < flushes;
            if sample && mid_balance {
                kernel += 1;
                if let Err(e) = kernel_finishes(&img) {
                    failures.push(format!("{what}: the kernel's resume: {e}"));
                }
            }
            match catch_unwind(AssertUnwindSafe(|| verify(img, &files, &ok))) {
                Ok(Ok((done, _))) => {
                    if sample {
                        checked += 1;
                        let r = ubtrfs_sim::host::btrfs_check_image(
                            done.len() as u64,
                            |f| write_sparse(f, &done),
                            None,
                        );
                        if let Err(e) = r {
                            failures.push(format!("{what}: btrfs check after the resume: {e}"));
                        }
                    }
                }
                Ok(Err(e)) => failures.push(format!("{what}: {e}")),
                Err(p) => failures.push(format!("{what}: PANIC {}", panic_message(&*p))),
            }
        }
    }
    eprintln!(
        "balance crash: {} commits, {flushes} flush points, {checked} btrfs checks, {kernel} kernel resumes",
        commits.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
