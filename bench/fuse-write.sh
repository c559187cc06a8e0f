#!/usr/bin/env bash
# Issue 11 benchmark: writing through the read-write `ubtrfs mount` (FUSE) vs the
# kernel's btrfs (`mount -o loop`), each on a fresh image of the same size made by
# mkfs.btrfs, in the same run:
#   dd:       sequential write of SIZE (`dd bs=1M conv=fsync`), random data (made once
#             in /dev/shm) and zeros with -o compress=zstd, medians of three rounds
#   tar x:    unpack a tar of $SRC, then `sync`
#   files:    create NFILES empty files in one directory, then remove them (+ sync)
#   fio:      4 KiB random writes for 30 s (IOPS)
# Prints each time, throughput and the ratio ubtrfs/kernel (times: > 1 is slower;
# throughput: < 1 is slower), and the server's peak RSS.
# Needs root. SIZE=1G by default; SRC=/usr/share/doc; NFILES=100000;
# UBTRFS=path uses a prebuilt binary; URING=0 measures /dev/fuse, not FUSE over io_uring;
# ROWS="tar files" runs only those rows (of dd zstd tar files fio).
# Free memory is touched once first (bench/lib.sh touch_memory: on a VM the first touch
# of a page costs a host fault, which skewed whichever side reached new pages first).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SIZE=${SIZE:-1G}
SRC=${SRC:-/usr/share/doc}
NFILES=${NFILES:-100000}
ROWS=${ROWS:-dd zstd tar files fio}
row() { case " $ROWS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
WORK=${WORK:-/var/tmp/ubtrfs-write-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
U=$UBTRFS
bytes=$(numfmt --from=iec "$SIZE")
KM=$WORK/kernel
UM=$WORK/ubtrfs
mkdir -p "$WORK" "$KM" "$UM"
cleanup() {
    mountpoint -q "$KM" && umount "$KM" || true
    mountpoint -q "$UM" && fusermount3 -u "$UM" || true
    sleep 0.5
}
use_uring
touch_memory
trap 'cleanup; restore_uring; rm -f "${RAND:-}"' EXIT
cleanup
TAR=$WORK/src.tar
[ -s "$TAR" ] || tar cf "$TAR" -C "$(dirname "$SRC")" "$(basename "$SRC")" 2>/dev/null || true
img_bytes=$(( bytes * 2 + $(stat -c %s "$TAR") * 3 + (2 << 30) ))

# fresh NAME [OPTS]: a new image, mounted by the kernel (K) or ubtrfs (U).
fresh_kernel() {
    cleanup
    rm -f "$WORK/k.img"; truncate -s "$img_bytes" "$WORK/k.img"; mkfs.btrfs -q -f "$WORK/k.img"
    mount -o "loop${1:+,$1}" "$WORK/k.img" "$KM"
}
fresh_ubtrfs() {
    cleanup
    rm -f "$WORK/u.img"; truncate -s "$img_bytes" "$WORK/u.img"; mkfs.btrfs -q -f "$WORK/u.img"
    "$U" mount "$WORK/u.img" "$UM" -o "rw${1:+,$1}"
}
# Peak RSS (VmHWM) of the newest ubtrfs server, in KiB.
rss_kb() { local p; p=$(pgrep -n -x ubtrfs) || return 1; awk '/^VmHWM/ {print $2}' "/proc/$p/status"; }

dd_ms() { ms dd if=/dev/zero of="$1/big" bs=1M count=$(( bytes >> 20 )) conv=fsync status=none; }
# Incompressible data for the plain run (zeros would be compressed by zstd runs only),
# made once into tmpfs: generating it while measuring took a core from both sides.
RAND=/dev/shm/ubtrfs-bench-rand-$SIZE
[ -s "$RAND" ] || head -c "$bytes" /dev/urandom > "$RAND"
dd_rand_ms() { ms dd if="$RAND" of="$1/big" bs=1M conv=fsync status=none; }
# median A B C
median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }

peak=0
note_rss() { local r; r=$(rss_kb || echo 0); [ "${r:-0}" -gt "$peak" ] && peak=$r; true; }

# The dd rows vary run to run with the host's disk: three rounds, medians.
if row dd; then
ks=(); us=()
for _ in 1 2 3; do
    fresh_kernel; drop; ks+=("$(dd_rand_ms "$KM")")
    fresh_ubtrfs; drop; us+=("$(dd_rand_ms "$UM")"); note_rss
done
k=$(median "${ks[@]}"); u=$(median "${us[@]}")
mbk=$(awk -v b="$bytes" -v t="$k" 'BEGIN{printf "%.0f", b/1048576/(t/1000)}')
mbu=$(awk -v b="$bytes" -v t="$u" 'BEGIN{printf "%.0f", b/1048576/(t/1000)}')
echo "dd $SIZE random, conv=fsync (median of 3; ubtrfs ${us[*]} ms, kernel ${ks[*]} ms): ubtrfs $mbu MiB/s, kernel $mbk MiB/s, throughput ratio $(ratio "$mbu" "$mbk")x"
fi

if row zstd; then
ks=(); us=()
for _ in 1 2 3; do
    fresh_kernel compress=zstd; drop; ks+=("$(dd_ms "$KM")")
    fresh_ubtrfs compress=zstd; drop; us+=("$(dd_ms "$UM")"); note_rss
done
k=$(median "${ks[@]}"); u=$(median "${us[@]}")
mbk=$(awk -v b="$bytes" -v t="$k" 'BEGIN{printf "%.0f", b/1048576/(t/1000)}')
mbu=$(awk -v b="$bytes" -v t="$u" 'BEGIN{printf "%.0f", b/1048576/(t/1000)}')
echo "dd $SIZE zeros, compress=zstd, conv=fsync (median of 3; ubtrfs ${us[*]} ms, kernel ${ks[*]} ms): ubtrfs $mbu MiB/s, kernel $mbk MiB/s, throughput ratio $(ratio "$mbu" "$mbk")x"
fi

# syncfs (sync -f) makes the kernel's mount durable but never reaches a FUSE server;
# fsync of the directory (sync DIR) commits ubtrfs and is cheap on the kernel.
untar() { tar xf "$TAR" -C "$1" && sync -f "$1" && sync "$1"; }
if row tar; then
fresh_kernel; drop; k=$(ms untar "$KM")
fresh_ubtrfs; drop; u=$(ms untar "$UM"); note_rss
report "tar x of $SRC ($(stat -c %s "$TAR") bytes) + sync" "$u" "$k"
fi

files() {
    mkdir "$1/many"
    (cd "$1/many" && seq -f 'f%.0f' 1 "$NFILES" | xargs touch && seq -f 'f%.0f' 1 "$NFILES" | xargs rm)
    sync -f "$1" && sync "$1"
}
if row files; then
fresh_kernel; k=$(ms files "$KM")
fresh_ubtrfs; u=$(ms files "$UM"); note_rss
report "$NFILES empty files created then removed, one directory" "$u" "$k"
fi
# fio: 4 KiB random writes for FIO_SECS (30) seconds into a 1 GiB file, buffered,
# one job, fsync at the end (on ubtrfs a commit).
command -v fio >/dev/null || apt-get install -y -qq fio >/dev/null
fio_iops() {
    fio --name=randw --directory="$1" --rw=randwrite --bs=4k --size=1G \
        --runtime="${FIO_SECS:-30}" --time_based --ioengine=psync --end_fsync=1 \
        --output-format=json |
        python3 -c 'import json, sys; print(int(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'
}
if row fio; then
fresh_kernel; k=$(fio_iops "$KM")
fresh_ubtrfs; u=$(fio_iops "$UM"); note_rss
echo "fio 4 KiB random writes, ${FIO_SECS:-30} s: ubtrfs $u IOPS, kernel $k IOPS, ratio $(ratio "$u" "$k")x"
fi
echo "ubtrfs server peak RSS (VmHWM) seen: $(( peak / 1024 )) MiB"
