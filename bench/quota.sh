#!/usr/bin/env bash
# Quota accounting, ubtrfs vs the kernel, on the same image in the same run:
#  1. full recount: `btrfs quota rescan -w` on a kernel loop mount against
#     `ubtrfs quota rescan` of the unmounted image (both start from the same copy);
#  2. a commit with quotas on: copying DIR (default /usr/share/doc) into a snapshot
#     with `ubtrfs put` (accounting at its commit) against `cp -a` + `sync` on the
#     kernel mount; and the same put with quotas off, for ubtrfs's own overhead.
# The image: mkfs.btrfs, `cp -a $SRC` (default /usr/share) into subvolume src, SNAPS
# (default 4) snapshots of it, quotas enabled and rescanned by the kernel. Every
# result is checked against a kernel rescan (numbers must be equal).
# Needs root. Run: bench/quota.sh   (SRC=/usr/share/doc SNAPS=2 for a quick one;
# COLD=1 for the rescans from a dropped page cache)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SRC=${SRC:-/usr/share}
DIR=${DIR:-/usr/share/doc}
SNAPS=${SNAPS:-4}
WORK=${WORK:-/var/tmp/ubtrfs-quota-bench}
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
img=$WORK/base.img
src_bytes=$(du -sb "$SRC" | cut -f1)
rm -f "$img"; truncate -s $(( (src_bytes * 3 + (1 << 30)) >> 20 << 20 )) "$img"
mkfs.btrfs -q -f "$img"
mount -o loop "$img" "$MNT"
btrfs -q subvolume create "$MNT/src"
cp -a "$SRC/." "$MNT/src/" 2>/dev/null || true
for ((i = 0; i < SNAPS; i++)); do btrfs -q subvolume snapshot "$MNT/src" "$MNT/snap$i"; done
btrfs quota enable "$MNT"; btrfs quota rescan -w "$MNT" >/dev/null
umount "$MNT"
show() { btrfs qgroup show --raw "$1" | awk 'NR > 2 { print $1, $2, $3 }'; }
# 1. rescan
cp --sparse=always "$img" "$WORK/k.img"; cp --sparse=always "$img" "$WORK/u.img"
# The copies' dirty pages are written back now: otherwise a commit's flush (an
# fdatasync of the image file) waits for hundreds of MB of cp's data, and the
# figure measures the host's write-back of the copy, not the rescan.
# Both then read warm; COLD=1 drops the page cache before each of them too.
sync
cold() { if [ "${COLD:-0}" = 1 ]; then echo 3 >/proc/sys/vm/drop_caches; fi; }
cold
mount -o loop "$WORK/k.img" "$MNT"
k_ms=$(ms btrfs quota rescan -w "$MNT")
umount "$MNT"
cold
u_ms=$(ms "$U" quota rescan "$WORK/u.img")
report "quota rescan ($SRC, $SNAPS snapshots)" "$u_ms" "$k_ms"
# 2. a copy with accounting at commit
mount -o loop "$WORK/k.img" "$MNT"
k_ms=$(ms sh -c "cp -a '$DIR' '$MNT/snap0/added' && sync")
show "$MNT" >"$WORK/kernel.txt"
umount "$MNT"
u_ms=$(ms "$U" put "$WORK/u.img" "$DIR" /snap0/added)
report "copy $DIR into a snapshot, quotas on" "$u_ms" "$k_ms"
cp --sparse=always "$img" "$WORK/off.img"
"$U" quota disable "$WORK/off.img"
off_ms=$(ms "$U" put "$WORK/off.img" "$DIR" /snap0/added)
echo "ubtrfs put with quotas off: $off_ms ms (accounting costs $(ratio "$u_ms" "$off_ms")x)"
# The numbers ubtrfs kept equal a kernel rescan of its image.
mount -o loop "$WORK/u.img" "$MNT"
btrfs quota rescan -w "$MNT" >/dev/null
show "$MNT" >"$WORK/rescan.txt"
umount "$MNT"
"$U" qgroup show "$WORK/u.img" --raw | awk 'NR > 2 { print $1, $2, $3 }' >"$WORK/ours.txt"
if diff "$WORK/ours.txt" "$WORK/rescan.txt" >/dev/null; then
    echo "ubtrfs's numbers equal a kernel rescan: yes"
else
    echo "ubtrfs's numbers equal a kernel rescan: NO"; diff "$WORK/ours.txt" "$WORK/rescan.txt" | head; exit 1
fi
rm -f "$WORK"/*.img
