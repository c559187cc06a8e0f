# Helpers shared by the bench scripts (sourced, not run).
# ms CMD...: run CMD with stdout discarded, print its wall time in milliseconds.
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
# drop: write back and drop the page cache (cold runs).
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# ratio A B: A / B with two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
# report LABEL UBTRFS_MS KERNEL_MS
report() { echo "$1: ubtrfs $2 ms, kernel $3 ms, ratio $(ratio "$2" "$3")x"; }
# use_uring: FUSE over io_uring (Linux 6.14 on) is used by the mount when the fuse
# module's enable_uring parameter is set: set it (URING=0: clear it, to measure
# /dev/fuse); restore_uring puts the old value back (call it on exit).
URING_PARAM=/sys/module/fuse/parameters/enable_uring
use_uring() {
    uring_old=$(cat "$URING_PARAM" 2>/dev/null || true)
    if [ -n "$uring_old" ]; then
        if [ "${URING:-1}" = 1 ]; then echo Y > "$URING_PARAM"; else echo N > "$URING_PARAM"; fi
        echo "fuse enable_uring=$(cat "$URING_PARAM") (FUSE over io_uring $([ "$(cat "$URING_PARAM")" = Y ] && echo on || echo off))"
    else
        echo "this kernel has no FUSE over io_uring: /dev/fuse"
    fi
}
restore_uring() { [ -n "${uring_old:-}" ] && echo "$uring_old" > "$URING_PARAM" || true; }
# touch_memory: has every free page of this (virtual) machine touched once, then given
# back. On a VM the first write to a guest page the host has not backed yet costs a
# host fault; a run that grows the page cache into such pages (ubtrfs's block-device
# cache, the kernel's metadata cache, the loop device's backing file) is slowed by
# it, at whichever side happens to reach them first. Measured on the WAL benchmark:
# a stretch of ~600 fdatasyncs at 1.5x the usual latency, with
# copy_folio_from_iter_atomic taking 44% of the server's samples there (0.8% after).
touch_memory() {
    python3 - <<'PY'
import os
free = 0
for line in open("/proc/meminfo"):
    if line.startswith("MemAvailable:"):
        free = int(line.split()[1]) * 1024
n = max(0, free - (2 << 30))
if n:
    a = bytearray(b"x") * n
    del a
print("touched %.1f GiB of free memory once" % (n / (1 << 30)))
PY
}
