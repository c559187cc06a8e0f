#!/usr/bin/env bash
# Every test ubtrfs has, in the order CI runs them:
#  1. cargo test: unit tests, fuzz regressions, and the committed kernel-made golden
#     images (walk, `subvolume list`, `extract` into a scratch btrfs loop mount);
#  2. a fresh golden set made now by this machine's kernel (mkfs.btrfs + loop mounts),
#     compared the same way, so drift in the kernel's format is caught.
# Needs root (loop devices, mount). It never skips the kernel oracle silently:
# without root it fails, unless UBTRFS_NO_ROOT=1 asks for the root-free subset (each
# root-only test then skips itself with one line on stderr). As root it exports
# UBTRFS_CI=1, under which no test may skip (ubtrfs_sim::host::require_root).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    if [ "${UBTRFS_NO_ROOT:-}" = 1 ]; then
        if [ -n "${CI:-}${UBTRFS_CI:-}" ]; then
            echo "run-all: CI or UBTRFS_CI is set, and CI never skips a test: run as root" >&2
            exit 1
        fi
        echo "run-all: UBTRFS_NO_ROOT=1: every test that needs root skips itself (NOT a full run)" >&2
        cargo test --workspace --features ubtrfs-core/fuzzing
        exit 0
    fi
    echo "run-all: the kernel oracle tests need root (loop devices); run as root" >&2
    exit 1
fi
export UBTRFS_CI=1
# On a fresh machine, install what the tests need first (as .ci/run does).
for tool in mkfs.btrfs btrfs zstd python3 losetup fusermount3 setfattr mkfs.xfs rsync duperemove; do
    if ! command -v "$tool" >/dev/null; then
        bash tests/install-deps.sh
        break
    fi
done
for tool in mkfs.btrfs btrfs zstd python3 losetup; do
    command -v "$tool" >/dev/null || { echo "run-all: $tool is missing" >&2; exit 1; }
done

# The fuzzing feature adds the fuzz regression test (crates/core/tests/fuzz_regress.rs).
# run-tests.py builds what `cargo test` would and runs the test binaries a few at a
# time (most of their time is spent waiting on the kernel), never two that share a
# host-wide resource; --fresh-golden also makes a golden set with this kernel
# (make-golden.sh) and runs the golden and mount tests on it, so drift in the
# kernel's format is caught.
python3 tests/run-tests.py --fresh-golden -- --workspace --features ubtrfs-core/fuzzing
cargo test -q --workspace --doc --features ubtrfs-core/fuzzing
