#!/usr/bin/env bash
# Seed 003: metadata balance with quotas on, ubtrfs vs the kernel, on the same
# image in the same run. The image is shared/kernel-bench/qgroup-balance.sh's:
# 4 KiB nodes, subvolume src holding a copy of SRC (default /usr/share; the seed's
# is /usr/lib and /usr/share), NSNAP snapshots of it with 3 files changed in each,
# quotas enabled and rescanned by the kernel. For each NSNAP (default "16 64") a
# copy gets `btrfs balance start -m` on a kernel loop mount, another
# `ubtrfs balance start -m`; both must then pass `btrfs check --qgroup-report`,
# and ubtrfs's numbers must equal a kernel rescan.
# Printed per NSNAP: both times and the ratio; tree blocks rewritten; the quota
# extents ubtrfs accounted (0: a move changes no subvolume's extents) against
# those a whole-subtree trace of the moved blocks would record (pre-seed kernels).
# TYPE=d balances data chunks instead (`-d`: every data extent copied, its
# checksums too; the issue's second figure).
# Needs root. Run: bench/balance-qgroup.sh   (SRC=/usr/share/doc NSNAPS=16 quick)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SRC=${SRC:-/usr/share}
NSNAPS=${NSNAPS:-16 64}
TYPE=${TYPE:-m}
WORK=${WORK:-/var/tmp/ubtrfs-balance-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
U=$UBTRFS
MNT=$WORK/mnt
mkdir -p "$WORK" "$MNT"
cleanup() { if mountpoint -q "$MNT"; then umount "$MNT" || umount -l "$MNT" || true; fi; }
trap cleanup EXIT
cleanup
src_bytes=$(du -sb "$SRC" | cut -f1)
printf '%-9s %9s %9s %6s %8s %12s %12s\n' snapshots kernel_ms ubtrfs_ms ratio blocks accounted full_trace
for n in $NSNAPS; do
    img=$WORK/base.img
    rm -f "$img"; truncate -s $(( (src_bytes * 3 + (2 << 30)) >> 20 << 20 )) "$img"
    mkfs.btrfs -q -f --nodesize 4K "$img"
    mount -o loop "$img" "$MNT"
    btrfs -q subvolume create "$MNT/src"
    cp -a "$SRC/." "$MNT/src/" 2>/dev/null || true
    sync
    btrfs quota enable "$MNT"
    btrfs quota rescan -w "$MNT" >/dev/null
    mapfile -t files < <(find "$MNT/src" -type f -size +1k | sort | awk 'NR % 97 == 0' | head -n $((n * 3)))
    for ((i = 0; i < n; i++)); do
        btrfs -q subvolume snapshot "$MNT/src" "$MNT/snap$i"
        for j in 0 1 2; do
            f=${files[$((i * 3 + j)) % ${#files[@]}]#"$MNT"/src/}
            dd if=/dev/urandom of="$MNT/snap$i/$f" bs=4k count=1 conv=notrunc status=none
        done
    done
    umount "$MNT"
    cp --sparse=always "$img" "$WORK/k.img"; mv "$img" "$WORK/u.img"
    mount -o loop "$WORK/k.img" "$MNT"
    sync
    k_ms=$(ms btrfs balance start -"$TYPE" "$MNT")
    umount "$MNT"
    s=$(date +%s%N)
    "$U" balance start -"$TYPE" -v "$WORK/u.img" >/dev/null 2>"$WORK/u.log"
    e=$(date +%s%N)
    u_ms=$(( (e - s) / 1000000 ))
    total=$(grep '^total:' "$WORK/u.log")
    blocks=$(echo "$total" | awk '{print $2}')
    accounted=$(echo "$total" | sed 's/.*quota: \([0-9]*\) extents accounted, \([0-9]*\) a whole.*/\1/')
    full=$(echo "$total" | sed 's/.*quota: \([0-9]*\) extents accounted, \([0-9]*\) a whole.*/\2/')
    printf '%-9s %9s %9s %6s %8s %12s %12s\n' "$n" "$k_ms" "$u_ms" "$(ratio "$u_ms" "$k_ms")" "$blocks" "$accounted" "$full"
    for f in k u; do
        if ! btrfs check --readonly --qgroup-report "$WORK/$f.img" >"$WORK/check.txt" 2>&1 \
            || grep -q "are different" "$WORK/check.txt"; then
            echo "btrfs check of the $f image failed:"; tail -20 "$WORK/check.txt"; exit 1
        fi
    done
    mount -o loop "$WORK/u.img" "$MNT"
    btrfs qgroup show --raw "$MNT" | awk 'NR > 2 { print $1, $2, $3 }' >"$WORK/ours.txt"
    btrfs quota rescan -w "$MNT" >/dev/null
    btrfs qgroup show --raw "$MNT" | awk 'NR > 2 { print $1, $2, $3 }' >"$WORK/rescan.txt"
    umount "$MNT"
    if ! diff "$WORK/ours.txt" "$WORK/rescan.txt" >/dev/null; then
        echo "ubtrfs's numbers differ from a kernel rescan"; diff "$WORK/ours.txt" "$WORK/rescan.txt" | head; exit 1
    fi
    rm -f "$WORK"/*.img
done
echo "checks: btrfs check --qgroup-report clean for both; ubtrfs's numbers equal a kernel rescan"
