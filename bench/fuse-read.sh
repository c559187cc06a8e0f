#!/usr/bin/env bash
# Issue 3 benchmark: reading through `ubtrfs mount` (FUSE) vs the kernel's btrfs
# (`mount -o loop,ro`) on the same image, page cache dropped before every timed run.
#   seq plain:  dd of a SIZE file of random data (not compressible)
#   seq zstd:   dd of a SIZE file stored zstd-compressed (base64 text, ~4:3)
#   find -ls:   over a tree (a copy of $SRC)
#   tar:        `tar c` of that tree (contents read), piped to /dev/null
# Prints each time, throughput and the ratio ubtrfs/kernel (> 1: ubtrfs is slower).
# Needs root. SIZE=4G by default; WORK=dir keeps the image between runs (made once
# per SIZE and SRC); SRC=/usr/share by default; UBTRFS=path uses a prebuilt binary.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-4G}
SRC=${SRC:-/usr/share}
WORK=${WORK:-/var/tmp/ubtrfs-fuse-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
U=$UBTRFS
bytes=$(numfmt --from=iec "$SIZE")
IMG=$WORK/fuse-bench-$SIZE-$(echo "$SRC" | tr / _).img
KM=$WORK/kernel
UM=$WORK/ubtrfs
mkdir -p "$WORK" "$KM" "$UM"

cleanup() {
    mountpoint -q "$KM" && umount "$KM" || true
    mountpoint -q "$UM" && fusermount3 -u "$UM" || true
}
trap cleanup EXIT
cleanup

if [ ! -s "$IMG" ]; then
    tree_bytes=$(du -sb "$SRC" | cut -f1)
    rm -f "$IMG" "$IMG.tmp"
    truncate -s $(( bytes * 3 + tree_bytes * 2 + (2 << 30) )) "$IMG.tmp"
    mkfs.btrfs -q -f "$IMG.tmp"
    mount -o loop "$IMG.tmp" "$KM"
    echo "making $IMG: $SIZE random, $SIZE compressible (zstd), copy of $SRC" >&2
    head -c "$bytes" /dev/urandom > "$KM/plain"
    mkdir "$KM/z"
    btrfs property set "$KM/z" compression zstd
    { base64 -w 76 /dev/urandom || true; } | head -c "$bytes" > "$KM/z/text"
    cp -a "$SRC" "$KM/tree"
    sync
    umount "$KM"
    mv "$IMG.tmp" "$IMG"
fi

# shellcheck source=bench/lib.sh
. "$PWD/bench/lib.sh"
now() { date +%s%N; }
kmount() { mount -o loop,ro "$IMG" "$KM"; }
kumount() { umount "$KM"; }
umount_u() { fusermount3 -u "$UM"; }
umount_k() { umount "$KM"; }
mbps() { awk -v n="$1" -v ms="$2" 'BEGIN { printf "%.0f", (ms > 0 ? n / 1048576 / (ms / 1000) : 0) }'; }

# time_cmd SIDE CMD...: mounts SIDE after dropping caches, times CMD (ms).
time_cmd() {
    local side=$1 s e
    shift
    drop
    if [ "$side" = kernel ]; then kmount; cd "$KM"; else "$U" mount "$IMG" "$UM"; cd "$UM"; fi
    s=$(now)
    "$@" >/dev/null
    e=$(now)
    cd /
    if [ "$side" = kernel ]; then umount_k; else umount_u; fi
    echo $(( (e - s) / 1000000 ))
}

files=$(kmount && find "$KM/tree" | wc -l; kumount)
echo "image: $IMG ($SIZE files, $files entries from $SRC); ubtrfs: $U"
for f in plain z/text; do
    k=$(time_cmd kernel dd if="$f" of=/dev/null bs=1M status=none)
    u=$(time_cmd ubtrfs dd if="$f" of=/dev/null bs=1M status=none)
    echo "seq read $f ($SIZE, cold): ubtrfs $u ms ($(mbps "$bytes" "$u") MiB/s), kernel $k ms ($(mbps "$bytes" "$k") MiB/s), ratio $(ratio "$u" "$k")x"
done
k=$(time_cmd kernel find tree -ls)
u=$(time_cmd ubtrfs find tree -ls)
echo "find -ls ($files entries, cold): ubtrfs $u ms, kernel $k ms, ratio $(ratio "$u" "$k")x"
tarpipe() { tar c tree | cat >/dev/null; }
k=$(time_cmd kernel tarpipe)
u=$(time_cmd ubtrfs tarpipe)
echo "tar c ($files entries, cold): ubtrfs $u ms, kernel $k ms, ratio $(ratio "$u" "$k")x"
