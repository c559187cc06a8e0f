#!/usr/bin/env bash
# The long fsx run (issue 11: at least 1,000,000 operations over several seeds, with
# fallocate, punch hole, zero range, copy_file_range, truncate and mmap reads and
# writes, on compressed and uncompressed files). Not part of CI (tens of minutes);
# root. Two parts, each on read-write `ubtrfs mount`s of fresh images, every image
# `btrfs check --readonly --check-data-csum` clean afterwards:
#   1. fsx, the Rust port (crates.io), through crates/cli/tests/suites.rs: 5 seeds
#      (2 plain, 2 with -o compress=zstd, 1 on a nocow file) x RUST_OPS (default
#      200,000) operations;
#   2. fstests' own fsx (ltp/fsx, C), which also does zero range (and tries
#      collapse/insert/clone/dedupe/exchange range, which it drops when the
#      filesystem says EOPNOTSUPP, as btrfs or FUSE do): seeds 1..C_SEEDS on plain
#      and on zstd-compressed mounts, C_OPS (default 200,000) operations each. It
#      needs the fstests build that `tests/fstests/run.sh --subset` leaves in
#      FSTESTS_CACHE (default /var/tmp/ubtrfs-fstests).
# Environment: RUST_OPS, C_OPS, C_SEEDS (default 3), FSTESTS_CACHE, SKIP_RUST=1.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rust_ops=${RUST_OPS:-200000}
c_ops=${C_OPS:-200000}
c_seeds=${C_SEEDS:-3}
cache=${FSTESTS_CACHE:-/var/tmp/ubtrfs-fstests}
cfsx=$(ls "$cache"/fstests-*/ltp/fsx 2>/dev/null | head -1 || true)
[ -x "$cfsx" ] || { echo "fsx-long: no fstests build in $cache (run tests/fstests/run.sh --subset once)" >&2; exit 1; }

cd "$repo"
cargo build --release -q -p ubtrfs-cli
ubtrfs=$repo/target/release/ubtrfs
total=0
if [ "${SKIP_RUST:-}" != 1 ]; then
    t0=$(date +%s)
    UBTRFS_FSX_OPS=$rust_ops cargo test --release -q -p ubtrfs-cli --test suites fsx_on_the_rw_mount \
        -- --nocapture 2>&1 | tee "${TMPDIR:-/tmp}/fsx-long-rust.log"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "fsx-long: Rust fsx FAILED" >&2; exit 1; }
    # A seed fsx stops itself (its zero-length posix_fallocate, see suites.rs) ran
    # only the operations before it.
    done_ops=$((5 * rust_ops))
    while read -r before; do
        done_ops=$((done_ops - rust_ops + before))
    done < <(sed -n 's/.*; the \([0-9]*\) operations before it passed/\1/p' "${TMPDIR:-/tmp}/fsx-long-rust.log")
    echo "fsx-long: Rust fsx: 5 seeds, $done_ops operations passed in $(( $(date +%s) - t0 )) s"
    total=$((total + done_ops))
fi

work=$(mktemp -d /tmp/ubtrfs-fsx-long.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
    mountpoint -q "$mnt" && fusermount3 -u "$mnt" || true
    rm -rf "$work"
}
trap cleanup EXIT
for opts in rw rw,compress=zstd; do
    for seed in $(seq 1 "$c_seeds"); do
        img=$work/fsx.img
        rm -f "$img"
        truncate -s 2G "$img"
        mkfs.btrfs -q "$img"
        "$ubtrfs" mount "$img" "$mnt" -o "$opts"
        t0=$(date +%s)
        if ! "$cfsx" -q -N "$c_ops" -S "$seed" -l 1048576 -o 131072 -P "$work" "$mnt/fsx-file" \
            >"$work/fsx.out" 2>&1; then
            tail -40 "$work/fsx.out" >&2
            echo "fsx-long: fstests fsx seed $seed (-o $opts) FAILED" >&2
            exit 1
        fi
        fusermount3 -u "$mnt"
        flock -w 60 "$img" true
        btrfs check --readonly --check-data-csum "$img" >"$work/check.out" 2>&1 || {
            cat "$work/check.out" >&2
            echo "fsx-long: btrfs check after fstests fsx seed $seed (-o $opts) FAILED" >&2
            exit 1
        }
        echo "fsx-long: fstests fsx seed $seed -o $opts: $c_ops operations, $(( $(date +%s) - t0 )) s, btrfs check clean"
        [ "$seed" = 1 ] && sed -n 's/^main: //p' "$work/fsx.out" | sed 's/^/fsx-long:   fsx says: /'
        total=$((total + c_ops))
    done
done
echo "fsx-long: $total operations in all, every image btrfs check clean"
