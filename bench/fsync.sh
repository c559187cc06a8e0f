#!/usr/bin/env bash
# Issue 12 benchmark: fsync through the tree log, the read-write `ubtrfs mount` vs the
# kernel's btrfs, each on a fresh mkfs.btrfs image attached to a loop device (so the
# bytes each writes are read the same way, from /sys/block/loopN/stat), same run:
#   wal: append 4 KiB + fdatasync, COUNT times (default 10,000), in a file of a fresh
#        filesystem: mean and p99 latency of each append+fdatasync, on the kernel,
#        on ubtrfs (tree log), on ubtrfs -o notreelog and on the kernel -o notreelog
#        (a commit per fdatasync on each side); device bytes written per fdatasync.
#        Free memory is touched once first (bench/lib.sh touch_memory: a VM's first
#        touch of a page skews whichever side reaches it).
#   busy: the same four, while another process makes BUSY_RATE (1000) small files a
#        second elsewhere, unsynced (SKIP_BUSY=1 skips it): the transaction then
#        holds other changes, which a commit per fsync must write and the log not.
#   dir: seed 004 (shared/kernel-bench/dir-fsync.sh): N empty files (default
#        100,000) made in one directory, then `xfs_io -c fsync` of the directory;
#        then a commit (`btrfs filesystem sync`), 1,000 of them deleted, and the
#        directory fsynced again: the time of each fsync, and its device bytes.
# Prints times and the ratio ubtrfs/kernel (> 1 is slower). Needs root.
# UBTRFS=path uses a prebuilt binary; LEAF=16K sets the node size.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
COUNT=${COUNT:-10000}
N=${N:-100000}
LEAF=${LEAF:-16K}
WORK=${WORK:-/var/tmp/ubtrfs-fsync-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
U=$UBTRFS
MNT=$WORK/mnt
mkdir -p "$WORK" "$MNT"
LOOP=
cleanup() {
    if mountpoint -q "$MNT"; then umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" || true; fi
    # The ubtrfs server commits and exits after the unmount.
    for _ in $(seq 600); do pgrep -f "mount $LOOP " >/dev/null 2>&1 || break; sleep 0.1; done
    # The kernel may hold the device a moment after the unmount: try for a while.
    if [ -n "$LOOP" ]; then
        for _ in $(seq 50); do losetup -d "$LOOP" 2>/dev/null && break; sleep 0.1; done
        losetup -l -n -O NAME | grep -qx "$LOOP" && echo "warning: $LOOP still attached" >&2
        LOOP=
    fi
}
trap cleanup EXIT
cleanup
rm -f "$WORK/server.log"

# fresh kernel|ubtrfs [OPTS]: a new 8 GiB image on a loop device, mounted.
fresh() {
    cleanup
    rm -f "$WORK/img"; truncate -s 8G "$WORK/img"
    LOOP=$(losetup -f --show "$WORK/img")
    mkfs.btrfs -q -f -n "$LEAF" "$LOOP"
    if [ "$1" = kernel ]; then
        mount -o "commit=300${2:+,$2}" "$LOOP" "$MNT"
    else
        UBTRFS_TREE_LOG_STATS=1 "$U" mount "$LOOP" "$MNT" -o "rw,commit=300,log=$WORK/server.log${2:+,$2}"
    fi
}
# Sectors written to the loop device so far, in bytes.
written() { echo $(( $(awk '{print $7}' "/sys/block/$(basename "$LOOP")/stat") * 512 )); }

WAL_PY='
import os, sys, time
path, count = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
buf = b"w" * 4096
lat = []
t0 = time.perf_counter_ns()
for _ in range(count):
    s = time.perf_counter_ns()
    os.write(fd, buf)
    os.fdatasync(fd)
    lat.append(time.perf_counter_ns() - s)
total = time.perf_counter_ns() - t0
lat.sort()
print("%.1f %.1f %.3f" % (sum(lat) / len(lat) / 1000, lat[int(len(lat) * 0.99)] / 1000, total / 1e9))
'

wal() {
    fresh "$@"
    local b0 out b1
    btrfs filesystem sync "$MNT" >/dev/null 2>&1 || true
    b0=$(written)
    out=$(python3 -c "$WAL_PY" "$MNT/wal" "$COUNT")
    b1=$(written)
    # This runs in a command substitution: unmount and detach here, where LOOP is set.
    cleanup >&2
    echo "$out $(( (b1 - b0) / COUNT ))"
}

# wal_busy kernel|ubtrfs [OPTS]: the same, while another process makes BUSY_RATE small
# files a second (4 KiB each, never synced) in another directory, so the running
# transaction holds other changes, as on a filesystem in use: a commit per fsync must
# write them all, the tree log only the fsynced file's.
BUSY_PY='
import os, sys, time
d, rate, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(d, exist_ok=True)
buf = b"b" * 4096
t0 = time.monotonic(); n = 0
while not os.path.exists(stop):
    with open(os.path.join(d, "f%d" % n), "wb") as f:
        f.write(buf)
    n += 1
    ahead = n / rate - (time.monotonic() - t0)
    if ahead > 0:
        time.sleep(ahead)
print(n)
'
wal_busy() {
    fresh "$@"
    local b0 out b1 pid stop="$WORK/busy.stop"
    rm -f "$stop"
    btrfs filesystem sync "$MNT" >/dev/null 2>&1 || true
    python3 -c "$BUSY_PY" "$MNT/busy" "${BUSY_RATE:-1000}" "$stop" >"$WORK/busy.count" &
    pid=$!
    sleep 0.5
    b0=$(written)
    out=$(python3 -c "$WAL_PY" "$MNT/wal" "$COUNT")
    b1=$(written)
    touch "$stop"; wait "$pid" || true
    cleanup >&2
    echo "$out $(( (b1 - b0) / COUNT ))"
}

# wal_table FN LABEL: FN (wal or wal_busy) on the kernel, ubtrfs, and both with
# -o notreelog (the kernel's own cost of a commit per fsync, for the same comparison
# on this device); a table and the ratios.
wal_table() {
    local fn=$1 label=$2 k u c kc
    read -r -a k <<<"$($fn kernel)"
    read -r -a u <<<"$($fn ubtrfs)"
    grep 'tree log:' "$WORK/server.log" | tail -1 || true
    read -r -a c <<<"$($fn ubtrfs notreelog)"
    read -r -a kc <<<"$($fn kernel notreelog)"
    cleanup
    printf '%-24s %10s %10s %9s %14s\n' "" "mean us" "p99 us" "total s" "bytes/fsync"
    printf '%-24s %10s %10s %9s %14s\n' kernel "${k[@]}"
    printf '%-24s %10s %10s %9s %14s\n' "ubtrfs (tree log)" "${u[@]}"
    printf '%-24s %10s %10s %9s %14s\n' "ubtrfs -o notreelog" "${c[@]}"
    printf '%-24s %10s %10s %9s %14s\n' "kernel -o notreelog" "${kc[@]}"
    echo "$label mean: ubtrfs/kernel $(ratio "${u[0]}" "${k[0]}")x, p99 $(ratio "${u[1]}" "${k[1]}")x;" \
        "commit per fsync / tree log: ubtrfs $(ratio "${c[0]}" "${u[0]}")x, kernel $(ratio "${kc[0]}" "${k[0]}")x"
}

touch_memory
echo "== wal: append 4 KiB + fdatasync x $COUNT (node size $LEAF) =="
wal_table wal wal

dirfsync() {
    fresh "$@"
    mkdir "$MNT/testdir"
    # Made by one process (xargs touch), as fast as each side allows.
    seq -f "$MNT/testdir/file_%.0f" 1 "$N" | xargs touch
    local b0 s e b1 t1 w1 t2 w2
    b0=$(written); s=$(date +%s%N)
    xfs_io -c fsync "$MNT/testdir"
    e=$(date +%s%N); b1=$(written)
    t1=$(( (e - s) / 1000000 )); w1=$(( b1 - b0 ))
    btrfs filesystem sync "$MNT" >/dev/null
    seq -f "$MNT/testdir/file_%.0f" 1 $(( N / 1000 )) "$N" | xargs rm -f
    b0=$(written); s=$(date +%s%N)
    xfs_io -c fsync "$MNT/testdir"
    e=$(date +%s%N); b1=$(written)
    t2=$(( (e - s) / 1000000 )); w2=$(( b1 - b0 ))
    cleanup >&2
    echo "$t1 $w1 $t2 $w2"
}

if [ "${SKIP_BUSY:-0}" != 1 ]; then
    echo "== wal while another process makes ${BUSY_RATE:-1000} small files a second =="
    wal_table wal_busy "busy wal"
fi

[ "${SKIP_DIR:-0}" = 1 ] && exit 0
echo "== dir: seed 004, $N files in one directory, fsync; 1,000 deleted, fsync =="
read -r k1 kw1 k2 kw2 <<<"$(dirfsync kernel)"
read -r u1 uw1 u2 uw2 <<<"$(dirfsync ubtrfs)"
cleanup
# The server's tree-log counters at unmount (seed 004: searches and leaf copies for
# the items logged; the kernel before the seed inserted item by item).
grep 'tree log:' "$WORK/server.log" | tail -1 || true
report "dir fsync after adding $N files" "$u1" "$k1"
echo "  device bytes: ubtrfs $uw1, kernel $kw1"
report "dir fsync after deleting 1000" "$u2" "$k2"
echo "  device bytes: ubtrfs $uw2, kernel $kw2"
