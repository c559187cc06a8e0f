#!/usr/bin/env bash
# Allocator benchmark after kernel commit 59c7b566a3b6 "btrfs: index free space entries
# on size" (seed 001), at this machine's scale:
#   1. once: the kernel fills a SIZE sparse image with preallocated files of random size
#      FILL_MIN..FILL_MAX until ENOSPC, deletes every other one, unmounts (kept as the
#      fragmented image, reused by later runs with the same parameters);
#   2. on fresh copies of that image, ROUNDS times, interleaved:
#      ubtrfs engine, SearchMode::OffsetOnly (pre-patch) and SearchMode::SizeIndex
#      (post-patch): fallocate 64 MiB files until NoSpace, commit; latency of every
#      allocator search recorded (AllocStats::latencies_ns);
#      kernel: loop mount, fallocate 64 MiB files until ENOSPC, syncfs (mount untimed).
#   Page cache dropped before every run. Total = fallocate loop + commit (ubtrfs) or
#   fallocate loop + syncfs (kernel); the image open / mount is not timed.
#   Both run under `nice -n $NICE` (default -10). Each ubtrfs image must then pass `btrfs check --readonly` (exit 1 otherwise, after
#   the figures are printed).
# Prints the first round's histograms, then medians over the rounds and the ratios
# SizeIndex/OffsetOnly average search latency (goal <= 0.5) and ubtrfs/kernel total
# time (goal <= 1.0). Needs root.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
WORK=${WORK:-/var/tmp/ubtrfs-bench/alloc}
SIZE=${SIZE:-8G}
FILL_MIN=${FILL_MIN:-4K}
FILL_MAX=${FILL_MAX:-256K}
SEED=${SEED:-1}
ROUNDS=${ROUNDS:-5}
# Both tools run at this nice level (the kernel's fallocate work happens in the calling
# process); -10 keeps a concurrent compile from preempting sub-microsecond searches.
NICE=${NICE:--10}
MNT=$WORK/mnt
FRAG=$WORK/frag-$SIZE-$FILL_MIN-$FILL_MAX-$SEED.img
RUN=$WORK/run.img
B=$PWD/target/release/alloc_bench
mkdir -p "$WORK" "$MNT"
cargo build --release -q -p ubtrfs-alloc-bench
cleanup() { mountpoint -q "$MNT" && umount "$MNT" || true; rm -f "$RUN"; }
trap cleanup EXIT

# shellcheck source=bench/lib.sh
. "$PWD/bench/lib.sh"

if [ ! -s "$FRAG" ]; then
    rm -f "$FRAG.tmp"
    truncate -s "$SIZE" "$FRAG.tmp"
    mkfs.btrfs -q -f "$FRAG.tmp"
    mount -o loop "$FRAG.tmp" "$MNT"
    "$B" fill "$MNT" "$FILL_MIN" "$FILL_MAX" "$SEED" | grep -v '^RESULT' | tee "$FRAG.info"
    btrfs filesystem df "$MNT" | grep -E '^Data' | tee -a "$FRAG.info"
    umount "$MNT"
    mv "$FRAG.tmp" "$FRAG"
fi
echo "fragmented image: $FRAG ($SIZE, made by the kernel; sizes $FILL_MIN..$FILL_MAX, seed $SEED)"
sed 's/^/  /' "$FRAG.info"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores); both tools at nice $NICE"

fresh() { rm -f "$RUN"; cp --sparse=always "$FRAG" "$RUN"; drop; }
# field KEY LINE: the value of KEY=... in a RESULT line.
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<" $2"; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

failed=0
declare -A avg p50 total files visited searches check_failed
for r in $(seq 1 "$ROUNDS"); do
    for m in offset size; do
        fresh
        if ! out=$(nice -n "$NICE" "$B" ubtrfs "$RUN" "$m" 2>&1); then
            echo "FAIL: ubtrfs ($m) errored; reproduce: cp --sparse=always $FRAG IMG && $B ubtrfs IMG $m" >&2
            echo "$out" >&2
            exit 1
        fi
        [ "$r" = 1 ] && grep -v '^RESULT' <<<"$out"
        res=$(grep '^RESULT' <<<"$out")
        avg[$m]+="$(field avg_ns "$res") "
        p50[$m]+="$(field p50_ns "$res") "
        visited[$m]=$(field visited "$res") searches[$m]=$(field searches "$res")
        total[$m]+="$(field total_ns "$res") "
        files[$m]=$(field files "$res")
        if ! btrfs check --readonly "$RUN" >"$WORK/check-$m.log" 2>&1; then
            if [ -z "${check_failed[$m]:-}" ]; then
                echo "FAIL: btrfs check --readonly after ubtrfs ($m) (full log: $WORK/check-$m.log):" >&2
                grep -vE '^\[|^Opening|^Checking|^UUID|^total|^btree|^file data|^ referenced' "$WORK/check-$m.log" | head -20 >&2
                echo "reproduce: cp --sparse=always $FRAG IMG && $B ubtrfs IMG $m && btrfs check --readonly IMG" >&2
            fi
            check_failed[$m]+="$r "
            failed=1
        fi
    done
    fresh
    mount -o loop "$RUN" "$MNT"
    out=$(nice -n "$NICE" "$B" kernel "$MNT")
    umount "$MNT"
    [ "$r" = 1 ] && grep -v '^RESULT' <<<"$out"
    res=$(grep '^RESULT' <<<"$out")
    total[kernel]+="$(field total_ns "$res") "
    files[kernel]=$(field files "$res")
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

med() { tr ' ' '\n' <<<"$1" | grep . | median; }
ao=$(med "${avg[offset]}") as=$(med "${avg[size]}")
to=$(med "${total[offset]}") ts=$(med "${total[size]}") tk=$(med "${total[kernel]}")
echo "medians of $ROUNDS rounds (64 MiB fallocates until full: ubtrfs ${files[size]} files, kernel ${files[kernel]} files):"
echo "  avg search latency: OffsetOnly $ao ns, SizeIndex $as ns; SizeIndex/OffsetOnly $(ratio "$as" "$ao")x (goal <= 0.5)"
echo "    per round avg OffsetOnly: ${avg[offset]}ns; SizeIndex: ${avg[size]}ns"
echo "    median p50: OffsetOnly $(med "${p50[offset]}") ns, SizeIndex $(med "${p50[size]}") ns;" \
    "entries visited: OffsetOnly ${visited[offset]} in ${searches[offset]} searches, SizeIndex ${visited[size]} in ${searches[size]}"
echo "  total (loop + commit/syncfs): ubtrfs OffsetOnly $(( to / 1000000 )) ms, SizeIndex $(( ts / 1000000 )) ms, kernel $(( tk / 1000000 )) ms;" \
    "ubtrfs(SizeIndex)/kernel $(ratio "$ts" "$tk")x (goal <= 1.0)"
if [ "$failed" != 0 ]; then
    echo "FAIL: btrfs check --readonly failed on ubtrfs-written images: OffsetOnly rounds ${check_failed[offset]:-none}, SizeIndex rounds ${check_failed[size]:-none} (see above)" >&2
    exit 1
fi
