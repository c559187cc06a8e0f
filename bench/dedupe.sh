#!/usr/bin/env bash
# Issue 13 benchmark: `ubtrfs dedupe` (offline, on the image) vs `duperemove -dr` on a
# kernel loop mount, on twin copies of one image made by the kernel in the same run:
# a copy of $SRC and a second copy (cp --reflink=never) with every tenth file changed.
# Prints each time, the ratio (ubtrfs / duperemove: < 1 is faster) and the data bytes
# each left used (from the kernel's `btrfs filesystem df -b` on a mount afterwards).
# Needs root and duperemove (apt-get install duperemove). SRC=/usr/share by default;
# UBTRFS=path uses a prebuilt binary.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SRC=${SRC:-/usr/share}
WORK=${WORK:-/var/tmp/ubtrfs-dedupe-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
touch_memory
command -v duperemove >/dev/null || apt-get install -y -qq duperemove >/dev/null
M=$WORK/mnt
mkdir -p "$M"
cleanup() { mountpoint -q "$M" && umount "$M" || true; }
trap cleanup EXIT
cleanup
src_bytes=$(du -sb "$SRC" | cut -f1)
img_bytes=$(( src_bytes * 3 + (1 << 30) ))
# The pristine image is made once per SRC and reused by later runs.
P=$WORK/pristine-$(echo "$SRC" | tr / _).img
if [ ! -s "$P" ]; then
    rm -f "$P.tmp"
    truncate -s "$img_bytes" "$P.tmp"
    mkfs.btrfs -q -f "$P.tmp"
    mount -o loop "$P.tmp" "$M"
    cp -a "$SRC" "$M/a" 2>/dev/null || true
    cp -a --reflink=never "$M/a" "$M/b"
    # Change every tenth regular file of the second copy (one byte in the middle).
    find "$M/b" -type f -size +0 | awk 'NR % 10 == 0' | while read -r f; do
        s=$(stat -c %s "$f"); printf 'X' | dd of="$f" bs=1 seek=$(( s / 2 )) conv=notrunc status=none
    done
    umount "$M"
    mv "$P.tmp" "$P"
fi
mount -o loop,ro "$P" "$M"; files=$(find "$M/a" -type f | wc -l); umount "$M"
cp --sparse=always "$P" "$WORK/u.img"
cp --sparse=always "$P" "$WORK/k.img"

used() { mount -o loop,ro "$1" "$M"; btrfs filesystem df -b "$M" | awk -F'used=' '/^Data,/ {print $2}'; umount "$M"; }
before=$(used "$WORK/u.img")

drop
mount -o loop "$WORK/k.img" "$M"
kms=$(ms bash -c "duperemove -dr -q '$M' >/dev/null 2>&1; sync")
umount "$M"
drop
ums=$(ms "$UBTRFS" dedupe "$WORK/u.img" -q)
kused=$(used "$WORK/k.img")
uused=$(used "$WORK/u.img")
btrfs check --readonly "$WORK/u.img" >/dev/null 2>&1 || { echo "btrfs check failed on the deduplicated image" >&2; exit 1; }
echo "tree: $SRC twice ($files files each, $(( src_bytes >> 20 )) MiB), every tenth file of the copy changed"
report "dedupe, cold" "$ums" "$kms"
echo "data used: before $before, after ubtrfs dedupe $uused, after duperemove $kused"
echo "freed: ubtrfs $(( before - uused )), duperemove $(( before - kused ))"
