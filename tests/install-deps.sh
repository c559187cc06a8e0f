#!/usr/bin/env bash
# Installs what the tests need on a Debian machine that has only the Rust toolchain
# (run as root): btrfs-progs >= 6.3 (from bookworm-backports on bookworm, whose 6.2
# cannot make block-group-tree images), fuse3, zstd, attr/acl, xfsprogs, rsync,
# e2fsprogs, and for the tool workloads (crates/cli/tests/mount_tools.rs) gcc, make,
# git, sqlite3; duperemove (the dedupe oracle, crates/cli/tests/share_edit.rs). pjdfstest and fsx are installed by the tests that use them (cargo
# install). Idempotent. Used by .ci/run and tests/run-all.sh.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
src=/etc/apt/sources.list.d/debian.sources
if [ -f "$src" ] && grep -q '^Suites: bookworm bookworm-updates$' "$src"; then
    sed -i 's/^Suites: bookworm bookworm-updates$/Suites: bookworm bookworm-updates bookworm-backports/' "$src"
fi
apt-get update -qq
apt-get install -y -qq xfsprogs fuse3 zstd attr acl python3 util-linux rsync e2fsprogs \
    gcc make git sqlite3 tar diffutils duperemove >/dev/null
apt-get install -y -qq -t bookworm-backports btrfs-progs >/dev/null ||
    apt-get install -y -qq btrfs-progs >/dev/null
btrfs --version | head -1
