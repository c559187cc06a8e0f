#!/usr/bin/env bash
# Issue 2 benchmarks: reading a kernel-made image holding a copy of /usr (100k+ files).
#   extract:  `ubtrfs extract IMG DEST --path /usr`  vs  `cp -a MNT/usr DEST` from the
#             kernel's loop mount; page cache dropped before the cold runs, then warm.
#   ls:       `ubtrfs ls -R -l IMG /usr`  vs  `find MNT/usr -ls`.
# Same image, same run; prints each time and the ratio ubtrfs/kernel (< 1 is faster).
# Needs root. WORK=dir keeps the image between runs (made once); SRC=/usr by default.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${SRC:-/usr}
WORK=${WORK:-/var/tmp/ubtrfs-bench}
IMG=$WORK/usr.img
MNT=$WORK/mnt
DEST=$WORK/dest
U=$PWD/target/release/ubtrfs
mkdir -p "$WORK" "$MNT"
cargo build --release -q -p ubtrfs-cli

# The destination is a tmpfs so that what is timed is reading the image, not the
# writeback of 5 GB to the host disk (which made repeated runs meaningless).
mkdir -p "$DEST"
mountpoint -q "$DEST" || mount -t tmpfs -o size=16G ubtrfs-bench "$DEST"
cleanup() { mountpoint -q "$MNT" && umount "$MNT" || true; umount "$DEST" 2>/dev/null || true; }
trap cleanup EXIT

if [ ! -s "$IMG" ]; then
    bytes=$(du -sb "$SRC" | cut -f1)
    truncate -s $(( bytes * 2 + (1 << 30) )) "$IMG"
    mkfs.btrfs -q -f "$IMG"
    mount -o loop "$IMG" "$MNT"
    cp -a "$SRC" "$MNT/usr"
    umount "$MNT"
fi
files=$(mount -o loop,ro "$IMG" "$MNT" && find "$MNT/usr" | wc -l; umount "$MNT")
echo "image: $IMG ($files entries from $SRC)"

# shellcheck source=bench/lib.sh
. "$PWD/bench/lib.sh"


clean() { rm -rf "${DEST:?}/usr"; sync; }
# Cold: caches dropped right before the timed command (the kernel mount is made
# after the drop and is not timed).
clean; drop; mount -o loop,ro "$IMG" "$MNT"
k_cold=$(ms cp -a "$MNT/usr" "$DEST/usr"); umount "$MNT"
clean; drop
u_cold=$(ms "$U" extract "$IMG" "$DEST/usr" --path /usr)
# Warm: each side once untimed to fill its caches, then timed.
mount -o loop,ro "$IMG" "$MNT"
clean; cp -a "$MNT/usr" "$DEST/usr"; clean
k_warm=$(ms cp -a "$MNT/usr" "$DEST/usr")
clean; "$U" extract "$IMG" "$DEST/usr" --path /usr; clean
u_warm=$(ms "$U" extract "$IMG" "$DEST/usr" --path /usr)
clean
report "extract cold" "$u_cold" "$k_cold"
report "extract warm" "$u_warm" "$k_warm"

umount "$MNT"; drop; mount -o loop,ro "$IMG" "$MNT"
k_ls_cold=$(ms find "$MNT/usr" -ls); umount "$MNT"; drop
u_ls_cold=$(ms "$U" ls -R -l "$IMG" /usr)
mount -o loop,ro "$IMG" "$MNT"
find "$MNT/usr" -ls >/dev/null; "$U" ls -R -l "$IMG" /usr >/dev/null
k_ls_warm=$(ms find "$MNT/usr" -ls)
u_ls_warm=$(ms "$U" ls -R -l "$IMG" /usr)
report "ls -R -l vs find -ls cold" "$u_ls_cold" "$k_ls_cold"
report "ls -R -l vs find -ls warm" "$u_ls_warm" "$k_ls_warm"
