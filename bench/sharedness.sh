#!/usr/bin/env bash
# Issue 4 benchmarks (seed 000): a file written with -o compress=lzo in 128 KiB
# compressed extents (40 GiB -> 327,680 extents), before and after a snapshot of
# its subvolume (every extent then shared through the snapshot's root).
#   fiemap:  `ubtrfs inspect fiemap IMG /foobar`  vs  `filefrag` on the kernel mount
#   du:      `ubtrfs filesystem du -s IMG / /snap` vs `btrfs filesystem du -s MNT MNT/snap`
# Cold = page cache dropped right before the timed command; warm = repeated.
# Three sizes show the scaling (SIZES, default "4G 16G 40G"). Whole processes are
# timed; each prints its ratio ubtrfs/kernel. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"4G 16G 40G"}
WORK=${WORK:-/var/tmp/ubtrfs-bench-share}
MNT=$WORK/mnt
U=$PWD/target/release/ubtrfs
mkdir -p "$MNT"
cargo build --release -q -p ubtrfs-cli
cleanup() { mountpoint -q "$MNT" && umount "$MNT" || true; }
trap cleanup EXIT

# shellcheck source=bench/lib.sh
. "$PWD/bench/lib.sh"

for SIZE in $SIZES; do
    IMG=$WORK/fiemap-$SIZE.img
    rm -f "$IMG"
    truncate -s 60G "$IMG"
    mkfs.btrfs -q -f "$IMG"
    mount -o loop,compress=lzo "$IMG" "$MNT"
    xfs_io -f -c "pwrite -S 0xab -b 1M 0 $SIZE" "$MNT/foobar" >/dev/null
    umount "$MNT"
    mount -o loop,ro "$IMG" "$MNT"
    n=$(filefrag "$MNT/foobar" | awk '{print $2}')
    umount "$MNT"
    echo "== $SIZE file, $n extents"
    for phase in "no snapshot" "with snapshot"; do
        if [ "$phase" = "with snapshot" ]; then
            mount -o loop "$IMG" "$MNT"
            btrfs -q subvolume snapshot "$MNT" "$MNT/snap"
            umount "$MNT"
        fi
        drop; mount -o loop,ro "$IMG" "$MNT"
        k_cold=$(ms filefrag "$MNT/foobar"); k_warm=$(ms filefrag "$MNT/foobar")
        umount "$MNT"
        drop; u_cold=$(ms "$U" inspect fiemap "$IMG" /foobar); u_warm=$(ms "$U" inspect fiemap "$IMG" /foobar)
        report "$SIZE $phase: fiemap cold" "$u_cold" "$k_cold"
        report "$SIZE $phase: fiemap warm" "$u_warm" "$k_warm"
        if [ "$phase" = "with snapshot" ]; then
            mount -o loop,ro "$IMG" "$MNT"
            btrfs filesystem du -s "$MNT" "$MNT/snap" >/dev/null
            k_du=$(ms btrfs filesystem du -s "$MNT" "$MNT/snap")
            umount "$MNT"
            "$U" filesystem du -s "$IMG" / /snap >/dev/null
            u_du=$(ms "$U" filesystem du -s "$IMG" / /snap)
            report "$SIZE $phase: filesystem du -s (warm)" "$u_du" "$k_du"
        fi
    done
    [ "${KEEP:-0}" = 1 ] || rm -f "$IMG"
done
