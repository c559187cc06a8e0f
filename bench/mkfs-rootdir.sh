#!/usr/bin/env bash
# Filling a new filesystem from a directory tree (a host copy of /usr, 100k+ files):
#   (a) `ubtrfs mkfs -r SRC`             (userspace, release build)
#   (b) `mkfs.btrfs --rootdir SRC`       (btrfs-progs, same nodesize/sectorsize/csum/profiles)
#   (c) the kernel: mkfs.btrfs an empty image, loop mount (untimed), then timed
#       `cp -a SRC/. MNT/ && sync && umount`.
# Every timed step ends with `sync` so all three have their image written out.
# Same source, same image size, same run. Cold = page cache dropped right before the
# timed command; warm = repeated right after (source cached). After (a) the image must
# pass `btrfs check --readonly` (the script fails otherwise).
# Images go to a tmpfs by default (IMGDIR=dir to put them elsewhere) so what is timed is
# the tools, not the host disk's writeback.
# Needs root. WORK=dir keeps the source copy between runs (made once); SRC=dir uses an
# existing tree instead of copying /usr.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
WORK=${WORK:-/var/tmp/ubtrfs-bench}
SRC=${SRC:-$WORK/usr-src}
MNT=$WORK/mkfs-mnt
U=$PWD/target/release/ubtrfs
OPTS=(-n 16384 -s 4096 --csum crc32c -d single -m dup)
mkdir -p "$WORK" "$MNT"
cargo build --release -q -p ubtrfs-cli

if [ -z "${IMGDIR:-}" ]; then
    IMGDIR=$WORK/mkfs-img
    mkdir -p "$IMGDIR"
    mountpoint -q "$IMGDIR" || mount -t tmpfs -o size=14G ubtrfs-mkfs-bench "$IMGDIR"
    OWN_TMPFS=1
fi
IMG1=$IMGDIR/ubtrfs.img IMG2=$IMGDIR/progs.img IMG3=$IMGDIR/kernel.img
cleanup() {
    mountpoint -q "$MNT" && umount "$MNT" || true
    rm -f "$IMG1" "$IMG2" "$IMG3"
    [ -n "${OWN_TMPFS:-}" ] && umount "$IMGDIR" 2>/dev/null || true
}
trap cleanup EXIT

# shellcheck source=bench/lib.sh
. "$PWD/bench/lib.sh"

if [ ! -e "$SRC/.ubtrfs-bench-complete" ] && [ "$SRC" = "$WORK/usr-src" ]; then
    rm -rf "$SRC"
    cp -a /usr "$SRC"
    touch "$SRC/.ubtrfs-bench-complete"
fi
bytes=$(du -sb "$SRC" | cut -f1)
files=$(find "$SRC" | wc -l)
SIZE=$(( (bytes * 2 + (1 << 30)) / 4096 * 4096 ))
echo "source: $SRC, $(( bytes >> 20 )) MiB, $files entries; image size $(( SIZE >> 20 )) MiB in $IMGDIR"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"

run_ubtrfs() { "$U" mkfs -f -q "${OPTS[@]}" --size "$SIZE" "$IMG1" -r "$SRC"; sync; }
run_progs() { mkfs.btrfs -q -f "${OPTS[@]}" --rootdir "$SRC" "$IMG2"; sync; }
prep_progs() { rm -f "$IMG2"; truncate -s "$SIZE" "$IMG2"; sync; }
prep_kernel() {
    rm -f "$IMG3"; truncate -s "$SIZE" "$IMG3"
    mkfs.btrfs -q -f "${OPTS[@]}" "$IMG3"
    mount -o loop "$IMG3" "$MNT"
}
run_kernel() { cp -a "$SRC/." "$MNT/"; sync; umount "$MNT"; sync; }

# (a) ubtrfs
rm -f "$IMG1"; drop
u_cold=$(ms run_ubtrfs)
if ! btrfs check --readonly "$IMG1" >"$WORK/mkfs-check.log" 2>&1; then
    echo "FAIL: btrfs check --readonly on the ubtrfs mkfs -r image failed:" >&2
    tail -n 40 "$WORK/mkfs-check.log" >&2
    echo "reproduce: $U mkfs -f -q ${OPTS[*]} --size $SIZE IMG -r $SRC && btrfs check --readonly IMG" >&2
    exit 1
fi
echo "btrfs check --readonly on the ubtrfs image: ok ($(grep -m1 'bytes used' "$WORK/mkfs-check.log"))"
rm -f "$IMG1"; sync
u_warm=$(ms run_ubtrfs)
rm -f "$IMG1"

# (b) mkfs.btrfs --rootdir
prep_progs; drop
p_cold=$(ms run_progs)
prep_progs
p_warm=$(ms run_progs)
rm -f "$IMG2"

# (c) kernel
prep_kernel; drop
k_cold=$(ms run_kernel)
prep_kernel
k_warm=$(ms run_kernel)
rm -f "$IMG3"

echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
for w in cold warm; do
    eval "u=\$u_$w p=\$p_$w k=\$k_$w"
    echo "$w: ubtrfs $u ms, mkfs.btrfs --rootdir $p ms, kernel cp -a $k ms;" \
        "ubtrfs/mkfs.btrfs $(ratio "$u" "$p")x (goal <= 0.5), ubtrfs/kernel $(ratio "$u" "$k")x"
done
