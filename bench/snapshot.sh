#!/usr/bin/env bash
# Issue 13 benchmarks, on twin copies of one kernel-made image in the same run:
#  1. snapshot of a subvolume holding a copy of $SRC: `ubtrfs subvolume snapshot`
#     (offline, open + snapshot + commit) vs the kernel's `btrfs subvolume snapshot`
#     + sync on a loop mount;
#  2. deleting a snapshot of it after half its files were changed, until its space is
#     free: `ubtrfs subvolume delete` (unlink + the whole drop, committed) vs the
#     kernel's `btrfs subvolume delete` + `btrfs filesystem sync` + `btrfs subvolume
#     sync` (the cleaner done).
# Cold runs (page cache dropped). Prints times and ratios (ubtrfs / kernel: < 1 is
# faster) and checks the results with `btrfs check`. Needs root. SRC=/usr by
# default; UBTRFS=path uses a prebuilt binary.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SRC=${SRC:-/usr}
WORK=${WORK:-/var/tmp/ubtrfs-snapshot-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
M=$WORK/mnt
mkdir -p "$M"
cleanup() { mountpoint -q "$M" && umount "$M" || true; }
trap cleanup EXIT
cleanup
src_bytes=$(du -sb "$SRC" 2>/dev/null | cut -f1)
img_bytes=$(( src_bytes * 2 + (2 << 30) ))
# The pristine image (subvolume `src` with the copy, and `old`, a snapshot of it with
# every second file changed) is made once per SRC and reused by later runs.
P=$WORK/pristine-$(echo "$SRC" | tr / _).img
if [ ! -s "$P" ]; then
    rm -f "$P.tmp"
    truncate -s "$img_bytes" "$P.tmp"
    mkfs.btrfs -q -f "$P.tmp"
    mount -o loop "$P.tmp" "$M"
    btrfs -q subvolume create "$M/src"
    cp -a "$SRC/." "$M/src/" 2>/dev/null || true
    btrfs -q subvolume snapshot "$M/src" "$M/old"
    python3 - "$M/old" <<'PY'
import os, sys
n = 0
for dirpath, dirs, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(dirpath, f)
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        n += 1
        if n % 2 == 0:
            with open(p, 'ab') as fh:
                fh.write(b'x')
PY
    umount "$M"
    mv "$P.tmp" "$P"
fi
mount -o loop,ro "$P" "$M"; files=$(find "$M/src" | wc -l); umount "$M"
cp --sparse=always "$P" "$WORK/u.img"
cp --sparse=always "$P" "$WORK/k.img"
echo "tree: $SRC in a subvolume ($files entries, $(( src_bytes >> 20 )) MiB); snapshot 'old' has every second file changed"

drop
mount -o loop "$WORK/k.img" "$M"
kms=$(ms bash -c "btrfs -q subvolume snapshot '$M/src' '$M/snap'; sync")
umount "$M"
drop
ums=$(ms "$UBTRFS" subvolume snapshot "$WORK/u.img" /src /snap)
report "snapshot, cold" "$ums" "$kms"

drop
mount -o loop "$WORK/k.img" "$M"
kms=$(ms bash -c "btrfs -q subvolume delete '$M/old'; btrfs filesystem sync '$M'; btrfs subvolume sync '$M' >/dev/null")
umount "$M"
drop
ums=$(ms "$UBTRFS" subvolume delete -q "$WORK/u.img" /old)
report "delete until free, cold" "$ums" "$kms"
for i in u k; do
    btrfs check --readonly "$WORK/$i.img" >/dev/null 2>&1 || { echo "btrfs check failed on $i.img" >&2; exit 1; }
done
used() { btrfs inspect-internal dump-super "$1" | awk '/^bytes_used/ {print $2}'; }
echo "bytes used after: ubtrfs $(used "$WORK/u.img"), kernel $(used "$WORK/k.img")"
