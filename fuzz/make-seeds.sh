#!/bin/bash
# Regenerates the fuzz seeds in fuzz/corpus/image/ from tiny kernel-made images.
# Needs root (loop mounts), mkfs.btrfs and the btrfs tool. Each image is 120 MiB but
# mostly zeros; the seed keeps only its non-zero 4 KiB blocks (see
# crates/core/src/sparse_dev.rs and crates/core/src/fuzz_harness.rs).
#
#   sudo fuzz/make-seeds.sh [OUTDIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=${1:-$here/corpus/image}
work=$(mktemp -d)
mnt=$work/mnt
mkdir -p "$mnt" "$out"

cleanup() {
    if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

(cd "$root" && cargo build -q -p ubtrfs-core --features fuzzing --example encode_seed)
enc=$(cd "$root" && cargo metadata -q --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/examples/encode_seed

# Deterministic file contents.
pattern() { # SIZE SEED
    python3 -c "import sys
n, s = int(sys.argv[1]), int(sys.argv[2])
x = s * 2654435761 % 2**32 or 1
out = bytearray()
while len(out) < n:
    x = (x * 1103515245 + 12345) % 2**31
    out += b'line %d value %d\n' % (len(out), x % 1000)
sys.stdout.buffer.write(bytes(out[:n]))" "$1" "$2"
}

# mkseed NAME MKFS_ARGS MOUNT_OPTS POPULATE_FUNCTION
# ONLY=NAME makes just that seed (the others stay byte for byte as they are).
mkseed() {
    local name=$1 mkfs_args=$2 opts=$3 fill=$4
    [ -z "${ONLY:-}" ] || [ "$ONLY" = "$name" ] || return 0
    local img=$work/$name.img
    truncate -s 120M "$img"
    # shellcheck disable=SC2086
    mkfs.btrfs -q -f $mkfs_args "$img"
    mount -o "loop${opts:+,$opts}" "$img" "$mnt"
    "$fill" "$mnt" || { umount "$mnt"; return 1; }
    # A fill that leaves $work/crash.img (an image copied while mounted) gives
    # the seed from that copy: a filesystem with an unreplayed tree log.
    umount "$mnt"
    if [ -e "$work/crash.img" ]; then mv "$work/crash.img" "$img"; fi
    "$enc" "$img" "$out/$name.seed"
}

fill_basic() {
    local m=$1
    echo "hello, inline" >"$m/small"
    pattern 8192 1 >"$m/regular8k"
    : >"$m/empty"
    mkdir -p "$m/dir/sub"
    echo nested >"$m/dir/sub/file"
    ln -s ../small "$m/dir/link"
    ln "$m/small" "$m/hardlink"
    setfattr -n user.test -v value "$m/small"
    setfattr -n user.big -v "$(head -c 300 /dev/zero | tr '\0' x)" "$m/dir"
    mkfifo "$m/fifo"
    btrfs -q subvolume create "$m/subvol"
    echo "in subvol" >"$m/subvol/f"
    truncate -s 1M "$m/sparse"
    pattern 4096 2 | dd of="$m/sparse" bs=4096 seek=100 conv=notrunc status=none
    sync
}

fill_compressed() {
    local m=$1
    pattern 300000 3 >"$m/big"
    pattern 3000 4 >"$m/inline"
    pattern 20000 5 >"$m/mid"
    echo plain >"$m/plain"
    sync
}

fill_snapshot() {
    local m=$1
    btrfs -q subvolume create "$m/sv"
    mkdir "$m/sv/d"
    btrfs -q subvolume create "$m/sv/d/nested"
    echo a >"$m/sv/a"
    echo n >"$m/sv/d/nested/n"
    btrfs -q subvolume snapshot "$m/sv" "$m/snap"
    btrfs -q subvolume snapshot -r "$m/sv" "$m/rosnap"
    echo changed >"$m/sv/a"
    sync
}

fill_many() {
    local m=$1
    mkdir "$m/many"
    for i in $(seq 1 120); do echo "$i" >"$m/many/file-with-a-longish-name-$i"; done
    sync
}

# A tree log the kernel wrote and never replayed: no commit after the setup
# (commit=300), then fsyncs, then the image copied while still mounted (the log
# and the superblock went through the loop device into the file's page cache).
fill_log() {
    local m=$1
    mkdir "$m/d" "$m/gone"
    echo keep >"$m/d/old"
    echo bye >"$m/gone/x"
    pattern 20000 6 >"$m/d/renamed-from"
    sync
    pattern 9000 7 >"$m/d/new"
    setfattr -n user.logged -v yes "$m/d/new"
    xfs_io -c 'pwrite -S 0x62 100k 8k' -c 'fpunch 0 4k' -c fsync "$m/d/new" >/dev/null
    ln "$m/d/new" "$m/d/link"
    mv "$m/d/renamed-from" "$m/d/renamed-to"
    rm "$m/gone/x"
    xfs_io -c fsync "$m/d/renamed-to" >/dev/null
    xfs_io -c fsync "$m/d" >/dev/null
    xfs_io -c fsync "$m/gone" >/dev/null
    cp --sparse=always "$(findmnt -n -o SOURCE "$m" | xargs losetup -n -O BACK-FILE -l)" "$work/crash.img"
}

mkseed kernel-n4k-basic "-n 4096" "" fill_basic
mkseed kernel-n16k-basic "" "" fill_basic
mkseed kernel-n4k-zstd "-n 4096" "compress-force=zstd" fill_compressed
mkseed kernel-n4k-lzo "-n 4096" "compress-force=lzo" fill_compressed
mkseed kernel-n4k-zlib "-n 4096" "compress-force=zlib" fill_compressed
mkseed kernel-n4k-snapshots "-n 4096" "" fill_snapshot
mkseed kernel-n4k-many "-n 4096" "" fill_many
mkseed kernel-n4k-xxhash-bgt "-n 4096 --csum xxhash -O block-group-tree" "" fill_basic
mkseed kernel-n4k-log "-n 4096" "commit=300" fill_log
ls -l "$out"
