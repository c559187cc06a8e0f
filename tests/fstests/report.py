#!/usr/bin/env python3
"""The table of an fstests run made by run.sh: test | kernel | ubtrfs | reason.

Reads each side's check output (WORK/{kernel,ubtrfs}/check.log) and the tests the
watchdog killed (WORK/SIDE/timeouts). Exits 1 when a test passes on the kernel but
fails on ubtrfs and known-failures.txt does not list it, or when --fsck-failed.
"""
import argparse
import datetime
import os
import platform
import re
import sys

TEST = re.compile(r"^((?:generic|btrfs|shared|fuse)/\d+)\b(.*)$")
FAIL_MARKS = ("output mismatch", "[failed", "something found", "inconsistent",
              "[dumped core]", "no qualified output")


def listing(path):
    """`test reason...` lines (# comments) as {test: reason}."""
    out = {}
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, _, reason = line.partition(" ")
                out[name] = reason.strip()
    return out


def parse_side(side_dir):
    """{test: (status, reason)} from one side's check.log."""
    res = {}
    path = os.path.join(side_dir, "check.log")
    if not os.path.exists(path):
        return res
    blocks = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = TEST.match(line)
            if m:
                blocks.append([m.group(1), m.group(2)])
            elif line.startswith(("Ran:", "Not run:", "Failures:", "Passed all", "SECTION")):
                blocks.append([None, ""])
            elif blocks and blocks[-1][0]:
                blocks[-1].append(line)
    for b in blocks:
        name, lines = b[0], b[1:]
        if not name:
            continue
        text = "\n".join(lines)
        if "[not run]" in text:
            reason = text.split("[not run]", 1)[1].strip().splitlines()
            res[name] = ("notrun", reason[0] if reason else "")
        elif "[expunged]" in text:
            res[name] = ("excluded", "")
        elif any(k in text for k in FAIL_MARKS):
            res[name] = ("fail", fail_reason(lines))
        elif re.search(r"\d+s\s*$", lines[0]):
            res[name] = ("pass", "")
        else:
            res[name] = ("incomplete", "interrupted")
    tpath = os.path.join(side_dir, "timeouts")
    if os.path.exists(tpath):
        with open(tpath, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    name = line.split()[0]
                    res[name] = ("timeout", line.strip())
    return res


def fail_reason(lines):
    """The first line that says what went wrong: an added diff line, else the mark."""
    for line in lines[1:]:
        s = line.strip()
        if s.startswith("+") and not s.startswith("+++"):
            return "diff: " + s[1:].strip()[:150]
    for line in lines:
        for k in FAIL_MARKS:
            if k in line:
                return line.strip()[:150]
    return "failed"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True, action="append",
                    help="a run's work directory; several: their tables merged")
    ap.add_argument("--known", required=True)
    ap.add_argument("--exclude")
    ap.add_argument("--note", default="")
    ap.add_argument("--out")
    ap.add_argument("--fsck-failed", action="store_true")
    a = ap.parse_args()

    known = listing(a.known)
    excluded = listing(a.exclude)
    kern, ub = {}, {}
    for w in a.work:
        kern.update(parse_side(os.path.join(w, "kernel")))
        ub.update(parse_side(os.path.join(w, "ubtrfs")))
    names = sorted(set(kern) | set(ub) | (set(excluded) & (set(kern) | set(ub))),
                   key=lambda n: (n.split("/")[0], int(n.split("/")[1])))

    rows, regress, stale = [], [], []
    for n in names:
        k = kern.get(n, ("-", ""))
        u = ub.get(n, ("-", ""))
        if n in excluded and k[0] in ("-", "excluded"):
            rows.append((n, "excluded", "excluded", excluded[n]))
            continue
        bad_u = u[0] in ("fail", "timeout", "incomplete")
        if k[0] == "pass" and bad_u:
            if n in known:
                reason = "known: " + known[n]
            else:
                reason = "REGRESSION: " + u[1]
                regress.append(n)
        elif bad_u and n in known:
            reason = "known: " + known[n]
        elif bad_u:
            reason = u[1]
            if k[0] == "fail":
                reason = "fails on the kernel too; ubtrfs: " + u[1]
        elif k[0] == "fail":
            reason = "kernel: " + k[1]
        elif u[0] == "notrun":
            reason = u[1] if k[0] != "notrun" or k[1] == u[1] else u[1] + " (kernel: " + k[1] + ")"
        elif k[0] == "notrun":
            reason = "kernel: " + k[1]
        else:
            reason = ""
        if n in known and u[0] == "pass":
            stale.append(n)
        rows.append((n, k[0], u[0], reason.replace("|", "\\|")))

    def count(side, st):
        return sum(1 for r in rows if r[side] == st)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = []
    out.append(f"fstests run of {now}, kernel {platform.release()}, {len(rows)} tests.")
    out.append("")
    out.append("| | pass | fail | timeout | not run | excluded |")
    out.append("|---|---|---|---|---|---|")
    for i, side in ((1, "kernel btrfs"), (2, "ubtrfs (FUSE)")):
        out.append(f"| {side} | {count(i, 'pass')} | {count(i, 'fail')} | "
                   f"{count(i, 'timeout') + count(i, 'incomplete')} | {count(i, 'notrun')} | "
                   f"{count(i, 'excluded')} |")
    both = sum(1 for r in rows if r[1] == "pass" and r[2] == "pass")
    kpass_ufail = sum(1 for r in rows if r[1] == "pass" and r[2] in ("fail", "timeout", "incomplete"))
    out.append("")
    out.append(f"Pass on both: {both}. Pass on the kernel, fail on ubtrfs: {kpass_ufail} "
               f"({kpass_ufail - len(regress)} listed in known-failures.txt, "
               f"{len(regress)} not listed).")
    if a.note:
        out.append("")
        out.append(a.note.strip())
    out.append("")
    out.append("| test | kernel | ubtrfs | reason |")
    out.append("|---|---|---|---|")
    for r in rows:
        out.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)
    if stale:
        print(f"\nnote: listed in known-failures.txt but passing now: {' '.join(stale)}",
              file=sys.stderr)
    if regress:
        print(f"\nfstests: pass on the kernel, fail on ubtrfs, not in known-failures.txt: "
              f"{' '.join(regress)}", file=sys.stderr)
        # The run's directory is removed after it: what the tests printed goes to
        # the log, so a failure in CI can be read there.
        for n in regress:
            for w in a.work:
                for suffix in (".out.bad", ".full"):
                    path = os.path.join(w, "ubtrfs", "results", n + suffix)
                    if os.path.exists(path):
                        with open(path, encoding="utf-8", errors="replace") as f:
                            tail = f.read().splitlines()[-40:]
                        print(f"----- {n}{suffix} (last {len(tail)} lines) -----\n"
                              + "\n".join(tail), file=sys.stderr)
    if regress or a.fsck_failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
