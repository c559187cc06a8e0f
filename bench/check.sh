#!/usr/bin/env bash
# `ubtrfs check` (read-only fsck) vs btrfs-progs' `btrfs check --readonly`, in its
# original mode and in --mode=lowmem, on the same kernel-made images in the same run:
# for each node size in NODESIZES (default "4096 16384"), mkfs.btrfs -n on a sparse
# image, a loop mount by the kernel, `cp -a $SRC` (default /usr) into subvolume `src`,
# then SNAPS (default 16) snapshots of it, each with 3 files changed after it was
# taken (an append, an overwrite, a new file) so that no two are identical; unmounted.
# Each checker is then run RUNS times (default 3) with the page cache warm (after
# one untimed run of the same checker; COLD=1 drops the cache before every run
# instead), timed by /usr/bin/time: the median wall seconds and median peak RSS.
# Every run must exit 0 (the images are clean); a failing run's first 20 lines are
# printed and the failure counted. Prints a table and the ratios ubtrfs/btrfs check
# for time and memory (goal: time <= 0.5x, memory <= 1x, against both modes).
# Needs root. Run: bench/check.sh   (SRC=/usr/share SNAPS=4 RUNS=1 for a quick one)
# UBTRFS=path uses a prebuilt binary; WORK=dir holds the images (made once per
# node size, SRC and SNAPS and reused; FRESH=1 remakes them); IMG_MAX caps the image
# size (default 64G, sparse).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SRC=${SRC:-/usr}
SNAPS=${SNAPS:-16}
RUNS=${RUNS:-3}
NODESIZES=${NODESIZES:-"4096 16384"}
COLD=${COLD:-0}
FRESH=${FRESH:-0}
IMG_MAX=${IMG_MAX:-64G}
WORK=${WORK:-/var/tmp/ubtrfs-check-bench}
if [ -z "${UBTRFS:-}" ]; then
    cargo build --release -q -p ubtrfs-cli
    UBTRFS=${CARGO_TARGET_DIR:-$PWD/target}/release/ubtrfs
fi
U=$UBTRFS
[ -x /usr/bin/time ] || { apt-get install -y -qq time >/dev/null; }
MNT=$WORK/mnt
mkdir -p "$WORK" "$MNT"
LOOP=
cleanup() {
    if mountpoint -q "$MNT"; then umount "$MNT" || umount -l "$MNT" || true; fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP" 2>/dev/null || true; LOOP=; fi
}
trap cleanup EXIT
cleanup

src_bytes=$(du -sb "$SRC" 2>/dev/null | cut -f1)
max_bytes=$(numfmt --from=iec "$IMG_MAX")
img_bytes=$(( src_bytes * 2 + (1 << 30) ))
[ "$img_bytes" -le "$max_bytes" ] || img_bytes=$max_bytes
img_bytes=$(( img_bytes >> 20 << 20 ))
tag=$(echo "$SRC" | tr / _)-$SNAPS

# make IMG NODESIZE: the image with `src` and SNAPS changed snapshots of it; prints
# the number of entries under `src`. Made once, reused while IMG.made exists.
make_image() {
    local img=$1 ns=$2
    if [ "$FRESH" = 1 ] || [ ! -e "$img.made" ]; then
        rm -f "$img" "$img.made"
        truncate -s "$img_bytes" "$img"
        LOOP=$(losetup -f --show "$img")
        mkfs.btrfs -q -f -n "$ns" "$LOOP"
        mount "$LOOP" "$MNT"
        btrfs -q subvolume create "$MNT/src"
        cp -a "$SRC/." "$MNT/src/" || echo "warning: cp -a $SRC reported errors" >&2
        sync
        local files i f
        mapfile -t files < <(find "$MNT/src" -type f -size +1k | sort | awk 'NR % 97 == 0' | head -n $((SNAPS * 2)))
        for ((i = 0; i < SNAPS; i++)); do
            btrfs -q subvolume snapshot "$MNT/src" "$MNT/snap$i"
            f=${files[$((i * 2))]#"$MNT"/src/}
            echo "snap$i" >>"$MNT/snap$i/$f"
            f=${files[$((i * 2 + 1))]#"$MNT"/src/}
            dd if=/dev/urandom of="$MNT/snap$i/$f" bs=1k count=1 conv=notrunc status=none
            echo "new file in snap$i" >"$MNT/snap$i/ubtrfs-bench-$i"
        done
        find "$MNT/src" | wc -l >"$img.files"
        umount "$MNT"
        losetup -d "$LOOP"; LOOP=
        touch "$img.made"
    fi
    cat "$img.files"
}

# measure NAME CMD...: runs CMD RUNS times; prints "median_seconds median_KiB failures".
# The output of the first failing run (or of the first run) is kept in $WORK/NAME.out.
measure() {
    local name=$1; shift
    local i rc fails=0 secs=() kib=() t m
    # Warm: one untimed run first, so that no tool pays for the one before it.
    [ "$COLD" = 1 ] || "$@" >/dev/null 2>&1 || true
    for ((i = 0; i < RUNS; i++)); do
        [ "$COLD" = 1 ] && drop
        rc=0
        /usr/bin/time -f '%e %M' -o "$WORK/time" "$@" >"$WORK/run.out" 2>&1 || rc=$?
        if [ "$rc" != 0 ]; then
            fails=$((fails + 1))
            [ "$fails" = 1 ] && cp "$WORK/run.out" "$WORK/$name.out"
        elif [ "$i" = 0 ]; then
            cp "$WORK/run.out" "$WORK/$name.out"
        fi
        # /usr/bin/time writes "Command exited with non-zero status N" first then.
        read -r t m < <(tail -n1 "$WORK/time")
        secs+=("$t"); kib+=("$m")
    done
    t=$(printf '%s\n' "${secs[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    m=$(printf '%s\n' "${kib[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "$t $m $fails"
}

echo "src: $SRC ($(( src_bytes >> 20 )) MiB), $SNAPS snapshots, $RUNS run(s) each, median;" \
    "$([ "$COLD" = 1 ] && echo cold || echo warm) cache; ubtrfs: $U"
ROWS=()
RATIOS=()
PROBLEMS=()
for ns in $NODESIZES; do
    img=$WORK/check-$ns$tag.img
    s=$(date +%s); state=reused
    { [ "$FRESH" = 1 ] || [ ! -e "$img.made" ]; } && state=made
    files=$(make_image "$img" "$ns")
    echo "== nodesize $ns: $img, $files entries in src ($state, $(( $(date +%s) - s )) s)"
    declare -A T=() M=()
    for tool in btrfs-check lowmem ubtrfs; do
        case $tool in
        btrfs-check) cmd=(btrfs check --readonly "$img") ;;
        lowmem) cmd=(btrfs check --readonly --mode=lowmem "$img") ;;
        ubtrfs) cmd=("$U" check "$img") ;;
        esac
        read -r t m f < <(measure "$tool-$ns" "${cmd[@]}")
        T[$tool]=$t; M[$tool]=$m
        echo "  $tool: ${t}s, $(( m / 1024 )) MiB$([ "$f" = 0 ] || echo ", $f of $RUNS runs FAILED")"
        if [ "$f" != 0 ]; then
            PROBLEMS+=("nodesize $ns: $tool exited non-zero in $f of $RUNS runs")
            echo "  ---- first 20 lines of $tool's output ($WORK/$tool-$ns.out):"
            head -n 20 "$WORK/$tool-$ns.out" | sed 's/^/  | /'
        fi
        ROWS+=("$(printf '%-8s %8s %5s %-12s %9s %9s' "$ns" "$files" "$SNAPS" "$tool" "$t" "$(( m / 1024 ))")")
    done
    # What each walked (untimed): btrfs check's tree bytes, ubtrfs's tree blocks.
    tb=$(awk '/^total tree bytes:/ {print $4}' "$WORK/btrfs-check-$ns.out")
    "$U" check --format json "$img" >"$WORK/ubtrfs-$ns.json" 2>/dev/null || true
    ub=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["tree_bytes"], d["tree_blocks"], d["problem_count"])' \
        "$WORK/ubtrfs-$ns.json" 2>/dev/null || echo "? ? ?")
    echo "  btrfs check: total tree bytes ${tb:-?}; ubtrfs json: tree_bytes, tree_blocks, problem_count = $ub"
    RATIOS+=("$(printf '%-8s ubtrfs/btrfs-check: time %sx, mem %sx;  ubtrfs/lowmem: time %sx, mem %sx' "$ns" \
        "$(ratio "${T[ubtrfs]}" "${T[btrfs-check]}")" "$(ratio "${M[ubtrfs]}" "${M[btrfs-check]}")" \
        "$(ratio "${T[ubtrfs]}" "${T[lowmem]}")" "$(ratio "${M[ubtrfs]}" "${M[lowmem]}")")")
    unset T M
done

echo
printf '%-8s %8s %5s %-12s %9s %9s\n' nodesize files snaps tool seconds "peak MiB"
printf '%s\n' "${ROWS[@]}"
echo
echo "ratios (goal: time <= 0.50x, mem <= 1.00x):"
printf '%s\n' "${RATIOS[@]}"
if [ "${#PROBLEMS[@]}" -gt 0 ]; then
    echo
    echo "FAILURES (the images are kernel-made and clean):"
    printf '  %s\n' "${PROBLEMS[@]}"
    exit 1
fi
