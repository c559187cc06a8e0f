#!/usr/bin/env bash
# Issue 4: `ubtrfs subvolume du` (referenced/exclusive per subvolume in one pass over
# the image) vs the kernel's `btrfs quota rescan -w` on the same image, in the setup
# of seed 003: nodesize 4K, a subvolume with a copy of /usr/lib and /usr/share,
# NSNAP snapshots each with 3 files modified. The kernel's numbers are also checked
# against ubtrfs's (they must be equal). Prints times and the ratio. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
NSNAP=${NSNAP:-16}
WORK=${WORK:-/var/tmp/ubtrfs-bench-qgroup}
IMG=$WORK/qgroup.img
MNT=$WORK/mnt
U=$PWD/target/release/ubtrfs
mkdir -p "$MNT"
cargo build --release -q -p ubtrfs-cli
cleanup() { mountpoint -q "$MNT" && umount "$MNT" || true; }
trap cleanup EXIT
# shellcheck source=bench/lib.sh
. "$PWD/bench/lib.sh"

if [ ! -s "$IMG.made" ]; then
    rm -f "$IMG"; truncate -s 16G "$IMG"
    mkfs.btrfs -q -f --nodesize 4K "$IMG"
    mount -o loop "$IMG" "$MNT"
    btrfs -q subvolume create "$MNT/src"
    cp -a /usr/lib /usr/share "$MNT/src/" 2>/dev/null || true
    sync
    mapfile -t files < <(find "$MNT/src" -type f -size +1k | sort | awk 'NR % 97 == 0' | head -n $((NSNAP * 3)))
    for ((i = 0; i < NSNAP; i++)); do
        btrfs -q subvolume snapshot "$MNT/src" "$MNT/snap$i"
        for j in 0 1 2; do
            f=${files[$((i * 3 + j))]#"$MNT"/src/}
            dd if=/dev/urandom of="$MNT/snap$i/$f" bs=4k count=1 conv=notrunc status=none
        done
    done
    umount "$MNT"
    touch "$IMG.made"
fi
echo "image: $IMG, $NSNAP snapshots of a /usr/lib + /usr/share copy, nodesize 4K"

# ubtrfs first (the kernel's quota enable adds a quota tree to the image).
drop; u_cold=$(ms "$U" subvolume du --raw "$IMG")
u_warm=$(ms "$U" subvolume du --raw "$IMG")
"$U" subvolume du --raw "$IMG" | awk 'NR > 2 { print $1, $2, $3 }' | sort > "$WORK/ubtrfs.txt"

cp --sparse=always "$IMG" "$IMG.q"
mount -o loop "$IMG.q" "$MNT"
btrfs quota enable "$MNT"
btrfs quota rescan -w "$MNT" >/dev/null
drop
k=$(ms btrfs quota rescan -w "$MNT")
btrfs qgroup show --raw "$MNT" | awk '$1 ~ /^0\// { print $1, $2, $3 }' | sort > "$WORK/kernel.txt"
umount "$MNT"; rm -f "$IMG.q"
echo "subvolume du cold: ubtrfs $u_cold ms vs btrfs quota rescan -w $k ms, ratio $(ratio "$u_cold" "$k")x"
echo "subvolume du warm: ubtrfs $u_warm ms vs btrfs quota rescan -w $k ms, ratio $(ratio "$u_warm" "$k")x"
if diff "$WORK/kernel.txt" "$WORK/ubtrfs.txt" >/dev/null; then
    echo "numbers: identical to the kernel's qgroups for all $(wc -l < "$WORK/kernel.txt") subvolumes"
else
    echo "numbers DIFFER from the kernel's qgroups:"; diff "$WORK/kernel.txt" "$WORK/ubtrfs.txt" | head
fi
