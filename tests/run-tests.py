#!/usr/bin/env python3
"""Runs the workspace's test binaries several at a time (tests/run-all.sh calls it).

`cargo test` runs one test binary after another; most of ubtrfs's binaries spend
their time waiting on the kernel (loop mounts, btrfs check, sync, FUSE round trips),
so on a 2-core machine running a few of them at once takes far less wall time.

Binaries that touch the same host-wide thing never overlap: they share a group.
  golden-images  the golden images (and the fresh set made by make-golden.sh) have
                 fixed filesystem UUIDs: two kernel mounts of one fsid clash;
  mount-helper   /sbin/mount.fuse.ubtrfs is linked for a test and removed after it
                 (HelperLink, fstests/run.sh), and mount_rw and mount_enospc flip
                 the fuse module's enable_uring parameter.
Inside one binary, `ubtrfs_sim::host::serial()` keeps serialising the kernel tests.

Some jobs race the kernel and run first, alone (EXCLUSIVE): they copy an image
while the kernel has it mounted, between an fsync and the next commit (a tree log
the kernel has not replayed), or in the middle of its cleaner's work; any sync(2)
elsewhere on the machine commits every mounted btrfs and closes that window.

Usage: run-tests.py [--jobs N] [--fresh-golden] -- CARGO_TEST_ARGS...
The cargo arguments select what is built (e.g. --workspace --features F). Each
binary's output goes to a log. When it finishes, its libtest lines ("running N
tests", "test NAME ... ok", "test result: ...") are printed in one block under a
"Running NAME" header, as `cargo test` prints them, so whoever reads the CI log
(a person or a parser counting tests) sees every test that ran; a failing binary's
whole log is printed. Exit status 1 if any binary failed.

A hung binary must not eat CI's whole time limit without a word: each binary runs
in a session of its own and is stopped after UBTRFS_TEST_TIMEOUT seconds (default
900, five times the longest binary's usual time), and the whole run after
UBTRFS_TEST_DEADLINE seconds (default 3600). Before a stop, the kernel stack of
every thread of the binary's processes (/proc/PID/task/TID/stack: a FUSE request,
a mount, a lock) and, when gdb is installed, their user stacks are printed, with
the tests libtest reported as still running; then the session is killed and the
binary counts as failed.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import shutil
import threading
import time

# Wall seconds in CI (2 cores), to start the longest first; others count as 5 s.
EXPECTED_S = {
    "balance": 172, "mount_enospc": 220, "suites": 115, "log_crash": 93,
    "balance_crash": 78, "fuzz_regress": 68, "fstests": 66, "quota": 64,
    "subvol_edit": 130, "log_replay": 57, "write": 53, "mount_fsstress": 65,
    "model": 42, "mount_tools": 41, "golden": 41, "squota": 40, "subvol_crash": 55, "log_names_crash": 100,
    "resize": 24, "mount": 23, "check": 19, "salvage": 18, "ctree_model": 14,
    "crash": 12, "mount_options": 10, "snapshot_scale": 60, "raid_write": 170, "kernel_text": 10, "fresh-golden": 150,
    "mount_crash": 90,
}

EXCLUSIVE = ["fresh-golden-treelog", "log_replay", "subvol_edit"]

GROUPS = {
    "golden-images": {"golden", "mount", "check", "corrupt", "mount_tools", "fresh-golden",
                      "fresh-golden-treelog"},
    "mount-helper": {"mount_rw", "mount_atime", "fstests", "mount_enospc"},
}


TIMEOUT_S = float(os.environ.get("UBTRFS_TEST_TIMEOUT", "900"))
DEADLINE_S = float(os.environ.get("UBTRFS_TEST_DEADLINE", "3600"))


def session_pids(sid):
    """Every process whose session is `sid` (the hung binary and what it started)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return sorted(out)


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError as e:
        return f"({e.strerror})"


def stacks(sid):
    """The kernel (and, with gdb, user) stacks of every thread of session `sid`."""
    parts = []
    for pid in session_pids(sid):
        cmd = read_text(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
        parts.append(f"=== pid {pid}: {cmd}")
        try:
            tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
        except OSError:
            continue
        for tid in tids:
            name = read_text(f"/proc/{pid}/task/{tid}/comm").strip()
            parts.append(f"--- thread {tid} ({name}), kernel stack:")
            parts.append(read_text(f"/proc/{pid}/task/{tid}/stack").rstrip())
        if shutil.which("gdb"):
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx",
                                "-ex", "thread apply all bt 30"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=120)
            bt = [l for l in r.stdout.splitlines() if l.startswith(("Thread ", "#"))]
            parts.append("--- user stacks (gdb):\n" + "\n".join(bt))
    return "\n".join(parts)


# What libtest prints on stdout for a run: the count, one line per test, the result.
LIBTEST_LINE = re.compile(r"^(running \d+ tests?$|test .+ \.\.\. |test result: )")


def group_of(name):
    for g, members in GROUPS.items():
        if name in members:
            return g
    return None


def build(cargo_args):
    """Builds the test binaries; returns [(name, argv, cwd, env, header)]."""
    cmd = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics"]
    cmd += cargo_args
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"run-tests: {' '.join(cmd)} failed")
    out = []
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{target['name']} ({kind} unit tests)"
        cwd = os.path.dirname(msg["manifest_path"])
        # cargo test's header: "Running unittests src/lib.rs (target/.../deps/x-hash)".
        src = os.path.relpath(target["src_path"], cwd)
        what = src if kind == "test" else f"unittests {src}"
        header = f"{what} ({os.path.relpath(msg['executable'], os.getcwd())})"
        out.append((name, [msg["executable"]], cwd, {}, header))
    return out


class Pool:
    """Runs jobs `jobs` at a time, longest expected first, never two of one group."""

    def __init__(self, jobs, logdir):
        self.jobs = jobs
        self.logdir = logdir
        self.lock = threading.Condition()
        self.busy_groups = set()
        self.failed = []
        self.done = 0
        self.running = 0
        self.deadline = time.monotonic() + DEADLINE_S

    def run_all(self, items):
        total = len(items)
        t0 = time.monotonic()
        # The exclusive ones first, one at a time, in EXCLUSIVE's order.
        first = sorted((it for it in items if it[0] in EXCLUSIVE),
                       key=lambda it: EXCLUSIVE.index(it[0]))
        for it in first:
            self.running = 1
            self._run(it, None, total)
        pending = sorted((it for it in items if it[0] not in EXCLUSIVE),
                         key=lambda it: -EXPECTED_S.get(it[0], 5))
        with self.lock:
            while pending or self.running:
                if pending and time.monotonic() > self.deadline:
                    names = [it[0] for it in pending]
                    print(f"run-tests: past UBTRFS_TEST_DEADLINE ({DEADLINE_S:.0f} s): "
                          f"not started: {', '.join(names)}", flush=True)
                    self.failed += names
                    pending = []
                    continue
                pick = None
                if self.running < self.jobs:
                    for i, it in enumerate(pending):
                        g = group_of(it[0])
                        if g is None or g not in self.busy_groups:
                            pick = pending.pop(i)
                            break
                if pick is None:
                    self.lock.wait(timeout=10)
                    continue
                g = group_of(pick[0])
                if g:
                    self.busy_groups.add(g)
                self.running += 1
                threading.Thread(target=self._run, args=(pick, g, total), daemon=True).start()
        print(f"run-tests: {total} binaries in {time.monotonic() - t0:.0f} s, "
              f"{len(self.failed)} failed", flush=True)
        return self.failed

    def _run(self, item, group, total):
        name, argv, cwd, env, header = item
        log = os.path.join(self.logdir, name.replace(" ", "_").replace("/", "_") + ".log")
        t = time.monotonic()
        limit = max(0.0, min(TIMEOUT_S, self.deadline - t))
        hung = None
        with open(log, "w") as f:
            proc = subprocess.Popen(argv, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                hung = stacks(proc.pid)
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    for pid in session_pids(proc.pid):
                        try:
                            os.kill(pid, sig)
                        except OSError:
                            pass
                    time.sleep(2)
                rc = proc.wait()
        secs = time.monotonic() - t
        with open(log, errors="replace") as f:
            text = f.read()
        lines = text.splitlines()
        results = [l for l in lines if l.startswith("test result:")]
        libtest = [l for l in lines if LIBTEST_LINE.match(l)]
        with self.lock:
            self.done += 1
            status = "ok" if rc == 0 else f"FAILED (exit {rc})"
            if hung is not None:
                rc = rc or 1
                status = f"FAILED (stopped after {limit:.0f} s: hung?)"
            summary = results[-1] if results else ""
            print(f"     Running {header}\n" + "\n".join(libtest) + "\n", flush=True)
            print(f"[{self.done}/{total}] {name}: {status} in {secs:.0f} s  {summary}",
                  flush=True)
            if rc != 0:
                self.failed.append(name)
                print(f"----- output of {name} -----\n{text}\n----- end of {name} -----",
                      flush=True)
                if hung is not None:
                    running = [l for l in lines if "has been running for over" in l]
                    print(f"----- {name} was stopped; tests libtest saw still running:\n"
                          + "\n".join(running) + f"\n----- stacks of {name} -----\n{hung}\n"
                          f"----- end of stacks -----", flush=True)
            if group:
                self.busy_groups.discard(group)
            self.running -= 1
            self.lock.notify_all()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=int(os.environ.get("UBTRFS_TEST_JOBS", "3")))
    p.add_argument("--fresh-golden", action="store_true",
                   help="also make a golden set with this kernel (make-golden.sh) and "
                        "run the golden and mount tests on it")
    p.add_argument("cargo_args", nargs="*")
    a = p.parse_args()
    items = build(a.cargo_args)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="ubtrfs-tests.") as logdir:
        if a.fresh_golden:
            fresh = os.path.join(logdir, "fresh-golden")
            os.mkdir(fresh)
            by_name = {it[0]: it for it in items}
            make = (f'bash {root}/tests/golden/make-golden.sh {fresh} {{}} > {fresh}/{{}}.log 2>&1'
                    f' || {{{{ tail -50 {fresh}/{{}}.log; echo "make-golden.sh failed"; exit 1; }}}}')
            # The tree-log set copies its image between the kernel's fsyncs and
            # its next commit: made alone (EXCLUSIVE), before the other sets.
            items.append(("fresh-golden-treelog",
                          ["bash", "-c", "set -e\n" + make.format("treelog", "treelog", "treelog")],
                          root, {}, "tests/golden/make-golden.sh treelog"))
            steps = [f'echo "making a fresh golden set with kernel $(uname -r)"',
                     "SKIP_SETS=treelog " + make.format("", "make", "make")]
            for t in ("golden", "mount"):
                _, argv, cwd, _, _ = by_name[t]
                steps.append(f'(cd {cwd} && UBTRFS_GOLDEN_DIR={fresh} {argv[0]})')
            items.append(("fresh-golden", ["bash", "-c", "set -e\n" + "\n".join(steps)],
                          root, {}, "tests/golden/make-golden.sh, then golden and mount on it"))
        failed = Pool(max(1, a.jobs), logdir).run_all(items)
    if failed:
        print("run-tests: failed: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
