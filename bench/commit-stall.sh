#!/usr/bin/env bash
# Issue 11 benchmark: do file operations wait for commits? On a read-write
# `ubtrfs mount` (FUSE) and on the kernel's btrfs (`mount -o loop`), each on a fresh
# image of the same size made by mkfs.btrfs, in the same run:
#   writer: unpacks a tar of $SRC again and again, each time followed by
#           `btrfs filesystem sync` (BTRFS_IOC_SYNC: a commit on both);
#   probe:  meanwhile, in another process, creates a file, writes 4 KiB, closes and
#           stats it, again and again for SECS seconds, timing each round.
# Prints the probe's rounds, median, p99 and longest round on each, and the ratios
# ubtrfs/kernel (> 1: ubtrfs waits longer), plus the commits the writer made.
# Needs root. SRC=/usr/share/doc; SECS=20; UBTRFS=path uses a prebuilt binary;
# URING=0 measures /dev/fuse, not FUSE over io_uring.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SRC=${SRC:-/usr/share/doc}
SECS=${SECS:-20}
WORK=${WORK:-/var/tmp/ubtrfs-stall-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
U=$UBTRFS
KM=$WORK/kernel
UM=$WORK/ubtrfs
mkdir -p "$WORK" "$KM" "$UM"
cleanup() {
    touch "$WORK/stop"
    mountpoint -q "$KM" && umount "$KM" || true
    mountpoint -q "$UM" && fusermount3 -u "$UM" || true
    sleep 0.5
}
use_uring
trap 'cleanup; restore_uring' EXIT
cleanup
TAR=$WORK/src.tar
[ -s "$TAR" ] || tar cf "$TAR" -C "$(dirname "$SRC")" "$(basename "$SRC")" 2>/dev/null || true
img_bytes=$(( $(stat -c %s "$TAR") * 40 + (2 << 30) ))

fresh() { # fresh NAME: a new image file
    rm -f "$WORK/$1.img"; truncate -s "$img_bytes" "$WORK/$1.img"; mkfs.btrfs -q -f "$WORK/$1.img"
}

# writer DIR: tar x + commit until killed; counts commits in DIR.commits.
writer() {
    local d=$1 i=0
    while [ ! -e "$WORK/stop" ]; do
        i=$((i + 1))
        mkdir "$d/w$i"
        tar xf "$TAR" -C "$d/w$i"
        btrfs filesystem sync "$d" >/dev/null
        echo "$i" > "$WORK/commits"
        # Keep the image from filling: the oldest copy goes.
        [ "$i" -gt 8 ] && rm -rf "$d/w$((i - 8))"
    done
}

# probe DIR: prints "rounds median_ms p99_ms max_ms".
probe() {
    python3 - "$1" "$SECS" <<'EOF'
import os, sys, time
d, secs = sys.argv[1], float(sys.argv[2])
os.makedirs(d, exist_ok=True)
lat = []
end = time.monotonic() + secs
n = 0
buf = b"x" * 4096
while time.monotonic() < end:
    p = os.path.join(d, "p%d" % (n % 1000))
    t0 = time.perf_counter()
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, buf)
    os.close(fd)
    os.stat(p)
    lat.append(time.perf_counter() - t0)
    n += 1
lat.sort()
pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000
print(len(lat), "%.3f" % pick(0.5), "%.3f" % pick(0.99), "%.3f" % (lat[-1] * 1000))
EOF
}

run() { # run MOUNTPOINT: writer in the background, probe in the foreground
    echo 0 > "$WORK/commits"
    rm -f "$WORK/stop"
    writer "$1" & wpid=$!
    sleep 2
    probe "$1/probe"
    touch "$WORK/stop"   # the writer stops after its current round
    wait "$wpid" 2>/dev/null || true
    wpid=
}

fresh k; mount -o loop "$WORK/k.img" "$KM"
run "$KM" > "$WORK/k.out"; read -r kn kmed kp99 kmax < "$WORK/k.out"; kc=$(cat "$WORK/commits")
cleanup
fresh u; "$U" mount "$WORK/u.img" "$UM"
run "$UM" > "$WORK/u.out"; read -r un umed up99 umax < "$WORK/u.out"; uc=$(cat "$WORK/commits")
cleanup
echo "probe rounds (create + 4 KiB write + close + stat) for ${SECS} s beside tar x + btrfs filesystem sync:"
echo "  kernel: $kn rounds, median $kmed ms, p99 $kp99 ms, longest $kmax ms ($kc commits)"
echo "  ubtrfs: $un rounds, median $umed ms, p99 $up99 ms, longest $umax ms ($uc commits)"
echo "longest round: ratio $(ratio "$umax" "$kmax")x; p99: ratio $(ratio "$up99" "$kp99")x"
