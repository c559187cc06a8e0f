#!/usr/bin/env bash
# `ubtrfs extract` vs `btrfs restore -i -s -x -m -S` (the same work: every subvolume
# and snapshot, xattrs, owners/modes/times, symlinks) of the same kernel-made image in
# the same run. The image is made as bench/check.sh makes it: mkfs.btrfs on a sparse
# file (NODESIZE, default 16384), a kernel loop mount, `cp -a $SRC` (default
# /usr/share) into subvolume `src`, then SNAPS (default 4) snapshots of it, each with
# 3 files changed after it was taken; unmounted. Each tool then extracts the whole
# image RUNS times (default 1; the two alternate) into an empty tmpfs (OUT_TMPFS=0:
# a new directory under WORK on its disk for every run, all deleted at the end;
# needs RUNS x 2 x the image's data free), with `sync` before every run;
# COLD=1 drops the page cache before every run (default: warm, the image was just
# read). Prints the wall times, the entries each
# saved (they must be equal) and the ratio ubtrfs / btrfs restore (goal <= 1.0x).
# Needs root. Run: bench/extract.sh   (SRC=/usr/share SNAPS=4 RUNS=1)
# UBTRFS=path uses a prebuilt binary; WORK=dir holds the image (made once per SRC,
# SNAPS and NODESIZE and reused; FRESH=1 remakes it).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SRC=${SRC:-/usr/share}
SNAPS=${SNAPS:-4}
RUNS=${RUNS:-1}
NODESIZE=${NODESIZE:-16384}
COLD=${COLD:-0}
OUT_TMPFS=${OUT_TMPFS:-1}
FRESH=${FRESH:-0}
WORK=${WORK:-/var/tmp/ubtrfs-extract-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
U=$UBTRFS
MNT=$WORK/mnt
OUT=$WORK/out
mkdir -p "$WORK" "$MNT"
LOOP=
cleanup() {
    if mountpoint -q "$MNT"; then umount "$MNT" || umount -l "$MNT" || true; fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP" 2>/dev/null || true; LOOP=; fi
    if mountpoint -q "$OUT"; then umount "$OUT" || umount -l "$OUT" || true; fi
    rm -rf "$OUT"
}
trap cleanup EXIT
cleanup

src_bytes=$(du -sb "$SRC" 2>/dev/null | cut -f1)
img_bytes=$(( (src_bytes * 2 + (1 << 30)) >> 20 << 20 ))
img=$WORK/extract-$NODESIZE$(echo "$SRC" | tr / _)-$SNAPS.img

if [ "$FRESH" = 1 ] || [ ! -e "$img.made" ]; then
    s=$(date +%s)
    rm -f "$img" "$img.made"
    truncate -s "$img_bytes" "$img"
    LOOP=$(losetup -f --show "$img")
    mkfs.btrfs -q -f -n "$NODESIZE" "$LOOP"
    mount "$LOOP" "$MNT"
    btrfs -q subvolume create "$MNT/src"
    cp -a "$SRC/." "$MNT/src/" || echo "warning: cp -a $SRC reported errors" >&2
    sync
    mapfile -t files < <(find "$MNT/src" -type f -size +1k | sort | awk 'NR % 97 == 0' | head -n $((SNAPS * 2)))
    for ((i = 0; i < SNAPS; i++)); do
        btrfs -q subvolume snapshot "$MNT/src" "$MNT/snap$i"
        f=${files[$((i * 2))]#"$MNT"/src/}
        echo "snap$i" >>"$MNT/snap$i/$f"
        f=${files[$((i * 2 + 1))]#"$MNT"/src/}
        dd if=/dev/urandom of="$MNT/snap$i/$f" bs=1k count=1 conv=notrunc status=none
        echo "new file in snap$i" >"$MNT/snap$i/ubtrfs-bench-$i"
    done
    umount "$MNT"
    losetup -d "$LOOP"; LOOP=
    touch "$img.made"
    echo "image made in $(( $(date +%s) - s )) s: $img"
fi

# fresh_out: an empty $OUT (a new tmpfs with OUT_TMPFS=1).
fresh_out() {
    if mountpoint -q "$OUT"; then umount "$OUT"; fi
    rm -rf "$OUT"
    mkdir -p "$OUT"
    if [ "$OUT_TMPFS" = 1 ]; then
        mount -t tmpfs -o size=$(( src_bytes * (SNAPS + 1) * 3 / 2 + (1 << 30) )) ubtrfs-bench "$OUT"
    fi
}

# run TOOL K: one timed extract of the whole image into a new directory; prints its
# ms. On the disk nothing is deleted until the end: ext4 skips inodes deleted in the
# last seconds when it allocates (recently_deleted), so a tool writing 250,000 files
# right after the other's were deleted spends most of its time there (76.7 s against
# 27.6 s for the same ubtrfs run, profiled).
run() {
    local tool=$1 k=$2 rc=0 ms_ dir
    if [ "$OUT_TMPFS" = 1 ]; then
        fresh_out
        dir=$OUT/$tool
    else
        dir=$OUT/run$k-$tool
    fi
    mkdir -p "$dir"
    sync
    [ "$COLD" = 1 ] && drop
    local s e
    s=$(date +%s%N)
    case $tool in
    restore) btrfs restore -i -s -x -m -S "$img" "$dir" >"$WORK/$tool.out" 2>&1 || rc=$? ;;
    ubtrfs) "$U" extract "$img" "$dir" >"$WORK/$tool.out" 2>&1 || rc=$? ;;
    esac
    e=$(date +%s%N)
    ms_=$(( (e - s) / 1000000 ))
    [ "$rc" = 0 ] || echo "  $tool exited $rc (see $WORK/$tool.out)" >&2
    find "$dir" -mindepth 1 | wc -l >"$WORK/$tool.entries"
    echo "$ms_"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "src: $SRC ($(( src_bytes >> 20 )) MiB), $SNAPS snapshots, nodesize $NODESIZE, $RUNS run(s)" \
    "each, median; $([ "$COLD" = 1 ] && echo cold || echo warm) cache;" \
    "into $([ "$OUT_TMPFS" = 1 ] && echo tmpfs || echo "$OUT"); ubtrfs: $U"
R=() T=()
for ((k = 0; k < RUNS; k++)); do
    r=$(run restore "$k"); R+=("$r"); re=$(cat "$WORK/restore.entries")
    t=$(run ubtrfs "$k"); T+=("$t"); te=$(cat "$WORK/ubtrfs.entries")
    echo "  run $((k + 1)): btrfs restore $r ms ($re entries), ubtrfs extract $t ms ($te entries)"
done
[ "$OUT_TMPFS" = 1 ] && fresh_out
r=$(printf '%s\n' "${R[@]}" | median)
t=$(printf '%s\n' "${T[@]}" | median)
echo "btrfs restore -i -s -x -m -S: $r ms, $re entries"
echo "ubtrfs extract:               $t ms, $te entries"
echo "ratio ubtrfs / btrfs restore: $(ratio "$t" "$r")x (goal <= 1.0x)"
if [ "$re" != "$te" ]; then
    echo "ENTRIES DIFFER: btrfs restore $re, ubtrfs $te" >&2
    exit 1
fi
