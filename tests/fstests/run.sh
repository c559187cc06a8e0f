#!/usr/bin/env bash
# fstests (xfstests), the Linux filesystem regression suite, on a kernel btrfs loop
# mount and on `ubtrfs mount` (read-write FUSE) in the same run, then one table:
# test | kernel | ubtrfs | reason.
#
#   tests/fstests/run.sh --quick        the generic tests of the `quick` group
#   tests/fstests/run.sh --subset       the fast tests listed in tests/fstests/subset.txt
#   tests/fstests/run.sh generic/001 generic/013 ...
#   tests/fstests/run.sh --build-only   install and build fstests, print its directory
#
# Exit status: non-zero when a test passes on the kernel but not on ubtrfs and is not
# listed in tests/fstests/known-failures.txt (or when the run itself breaks).
#
# Environment:
#   UBTRFS_BIN            the ubtrfs binary (default: target/release/ubtrfs, built here)
#   FSTESTS_TARBALL       fstests source (default ../shared/third-party/fstests-63a2972.tar.xz
#                         next to the repository; without it: git clone at the pinned commit)
#   FSTESTS_CACHE         where fstests is built (default /var/tmp/ubtrfs-fstests)
#   FSTESTS_WORK          images, mountpoints and results (default $FSTESTS_CACHE/run)
#   FSTESTS_TEST_TIMEOUT  seconds before a hung test is killed (default 600)
#   FSTESTS_IMG_GB        size of each (sparse) image (default 8)
#   FSTESTS_SERIAL=1      run the kernel side first, then ubtrfs (default: both at once)
#   FSTESTS_REPORT        also write the table as markdown to this file
#   FSTESTS_UBTRFS_LOOP=1 ubtrfs mounts loop devices of its images, not the image files
#                         (tests that want a block device or a "local device" then run)
#
# Both sides are made the same way: two sparse images, mkfs.btrfs. The kernel side
# runs FSTYP=btrfs on loop devices; the ubtrfs side runs FSTYP=fuse with
# FUSE_SUBTYP=.ubtrfs on the image files, mounted by mount(8) through the helper
# /sbin/mount.fuse.ubtrfs (a link to UBTRFS_BIN; ubtrfs acts as the helper when
# called by that name). fstests cannot re-make a FUSE filesystem: for FSTYP=fuse its
# _scratch_mkfs empties the scratch mount instead, and tests that need a given mkfs
# (sizes, features) report "not run". After the run, `btrfs check` reads both ubtrfs
# images: fstests has no consistency check for FUSE, so this is ours.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/tests/fstests
commit=63a29724a85f1999e49bf0a9bf0d22643b6116e5
tarball=${FSTESTS_TARBALL:-$repo/../shared/third-party/fstests-63a2972.tar.xz}
cache=${FSTESTS_CACHE:-/var/tmp/ubtrfs-fstests}
work=${FSTESTS_WORK:-$cache/run}
timeout=${FSTESTS_TEST_TIMEOUT:-600}
img_gb=${FSTESTS_IMG_GB:-8}
helper=/sbin/mount.fuse.ubtrfs

usage() {
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

tests=()
build_only=
case "${1:-}" in
--build-only) build_only=1 ;;
--quick) tests=(-g generic/quick) ;;
--subset) mapfile -t tests < <(sed 's/#.*//; /^[[:space:]]*$/d' "$here/subset.txt" | awk '{print $1}') ;;
-h | --help | "") usage ;;
*) tests=("$@") ;;
esac

[ "$(id -u)" = 0 ] || { echo "fstests: needs root (loop devices, mount)" >&2; exit 1; }
log() { echo "fstests: $*" >&2; }

# --- dependencies: fstests' Debian build and run packages, its users ----------------
deps=(acl attr automake bc dbench dump e2fsprogs fio gawk gcc git indent libacl1-dev
    libaio-dev libcap-dev libgdbm-dev libtool libtool-bin liburing-dev make psmisc
    python3 quota sed uuid-dev uuid-runtime xfsprogs xfslibs-dev sqlite3
    libgdbm-compat-dev btrfs-progs fuse3 util-linux libbtrfsutil-dev)
# Two test binaries (fstests, mount_fsstress) may run this at once on a fresh
# machine: one installs while the other waits (dpkg takes one apt-get at a time, and
# a second one fails at once on its lock unless told to wait).
mkdir -p "$cache"
exec 8>"$cache/.deps.lock"
flock 8
missing=()
for p in "${deps[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt=(apt-get -o DPkg::Lock::Timeout=600)
    "${apt[@]}" install -y -qq "${missing[@]}" >/dev/null ||
        { "${apt[@]}" update -qq && "${apt[@]}" install -y -qq "${missing[@]}" >/dev/null; }
fi
exec 8>&-
getent group fsgqa >/dev/null || groupadd fsgqa
for u in fsgqa fsgqa2 123456-fsgqa; do
    # useradd refuses a name that starts with a digit unless told --badname.
    id "$u" >/dev/null 2>&1 || useradd -m -g fsgqa "$u" 2>/dev/null ||
        useradd --badname -m -g fsgqa "$u"
done

# --- fstests, built once into the cache ---------------------------------------------
src=$cache/fstests-${commit:0:7}
# Tests may ask for the build at the same time (crates/cli/tests): one builds.
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9
# The marker names the build recipe: a changed recipe rebuilds.
built=$src/.ubtrfs-built-2
if [ ! -f "$built" ]; then
    rm -rf "$src" "$src.tmp"
    mkdir -p "$src.tmp"
    if [ -f "$tarball" ]; then
        log "unpacking $tarball"
        tar -xJf "$tarball" -C "$src.tmp"
        mv "$src.tmp/fstests" "$src"
        rmdir "$src.tmp"
    else
        log "no $tarball: cloning xfstests-dev at $commit"
        git clone -q https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git "$src.tmp/fstests"
        git -C "$src.tmp/fstests" checkout -q "$commit"
        mv "$src.tmp/fstests" "$src"
        rmdir "$src.tmp"
    fi
    # fsstress turns its snapshot and subvolume operations off unless statfs says
    # btrfs; a FUSE mount reports FUSE's magic whatever the filesystem, so
    # FSSTRESS_FORCE_BTRFS=1 (set by crates/cli/tests/mount_fsstress.rs only) keeps
    # them. Without the variable fsstress behaves as upstream's.
    sed -i 's|^\(\s*\)e = btrfs_util_is_subvolume(path);|\1if (getenv("FSSTRESS_FORCE_BTRFS"))\n\1\treturn;\n&|' \
        "$src/ltp/fsstress.c"
    grep -q FSSTRESS_FORCE_BTRFS "$src/ltp/fsstress.c" ||
        { log "could not patch ltp/fsstress.c"; exit 1; }
    log "building fstests in $src"
    start=$(date +%s)
    (cd "$src" && nice make -j"$(nproc)" >build.log 2>&1) ||
        { tail -30 "$src/build.log" >&2; log "fstests build failed"; exit 1; }
    log "fstests built in $(($(date +%s) - start)) s"
    touch "$built"
fi
flock -u 9
if [ -n "$build_only" ]; then
    echo "$src"
    exit 0
fi

# --- ubtrfs -------------------------------------------------------------------------
if [ -z "${UBTRFS_BIN:-}" ]; then
    (cd "$repo" && cargo build --release -q -p ubtrfs-cli)
    UBTRFS_BIN=${CARGO_TARGET_DIR:-$repo/target}/release/ubtrfs
fi
UBTRFS_BIN=$(realpath "$UBTRFS_BIN")
[ -x "$UBTRFS_BIN" ] || { log "no ubtrfs binary at $UBTRFS_BIN"; exit 1; }

# --- the run: images, loop devices, mounts; all undone by cleanup --------------------
loops=()
pids=()
servers=()
namespaces=()
saved_helper=
cleanup() {
    local p m l
    set +e
    for p in "${pids[@]}"; do
        kill_tree "$p"
    done
    finish_namespaces
    for m in "$work"/kernel/{test,scratch} "$work"/ubtrfs/{test,scratch}; do
        unmount "$m"
    done
    for p in "${servers[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    for l in "${loops[@]}"; do
        losetup -d "$l"
    done
    # Put back whatever helper was there before, unless someone has replaced ours.
    if [ -L "$helper" ] && [ "$(readlink "$helper")" = "$UBTRFS_BIN" ]; then
        if [ -n "$saved_helper" ]; then
            ln -sfn "$saved_helper" "$helper"
        else
            rm -f "$helper"
        fi
    fi
}
# kill_tree PID: PID and everything it started (processes this script started).
kill_tree() {
    local c
    for c in $(pgrep -P "$1"); do
        kill_tree "$c"
    done
    kill -KILL "$1" 2>/dev/null
}
# finish_namespaces: ends what the checks left in their mount namespaces, which live
# as long as a process is in them (and their mounts with them): first the processes
# tests left behind (a background writer), then the ubtrfs mounts, unmounted from
# inside so that their servers commit and exit, then whatever still remains.
finish_namespaces() {
    local ns p srv rest i alive
    for ns in "${namespaces[@]}"; do
        srv=() rest=()
        for p in /proc/[0-9]*; do
            [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] || continue
            case "$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" in
            *" mount $work/ubtrfs/"*) srv+=("${p#/proc/}") ;;
            *) rest+=("${p#/proc/}") ;;
            esac
        done
        for p in "${rest[@]}"; do
            kill -KILL "$p" 2>/dev/null
        done
        [ ${#srv[@]} -gt 0 ] || continue
        for m in "$work/ubtrfs/test" "$work/ubtrfs/scratch"; do
            # Through any server still there (one may be exiting).
            for p in "${srv[@]}"; do
                [ -n "$(mnt_dev "$m" "$p")" ] || continue
                nsenter -t "$p" -m umount -l "$m" && break
            done
        done
        for i in $(seq 1200); do
            alive=
            for p in "${srv[@]}"; do
                kill -0 "$p" 2>/dev/null && alive=1
            done
            [ -n "$alive" ] || break
            sleep 0.1
        done
        for p in "${srv[@]}"; do
            kill -KILL "$p" 2>/dev/null
        done
    done
    namespaces=()
    return 0
}
# mnt_dev DIR [PID]: major:minor of what is mounted on DIR in PID's mount namespace,
# from the mount table: never stat() a FUSE mount whose server may hang.
mnt_dev() {
    awk -v m="$1" '$5 == m { d = $3 } END { if (d) print d }' "/proc/${2:-self}/mountinfo" 2>/dev/null
}
# abort_fuse DIR [PID]: break the FUSE connection of a mount whose server hangs, so
# the processes waiting on it (and umount) can go on. The server is noted in
# $servers, to be killed: its threads may stay blocked on each other.
abort_fuse() {
    local dev p
    dev=$(mnt_dev "$1" "${2:-self}")
    [ -n "$dev" ] || return 0
    for p in $(pgrep -f -x ".*ubtrfs.* mount $work/ubtrfs/[a-z]*\.img $1 .*"); do
        servers+=("$p")
    done
    [ -w "/sys/fs/fuse/connections/${dev#*:}/abort" ] &&
        echo 1 >"/sys/fs/fuse/connections/${dev#*:}/abort"
    return 0
}
# unmount DIR: umount; if that fails or hangs, abort the connection and detach lazily.
unmount() {
    [ -n "$(mnt_dev "$1")" ] || return 0
    timeout 60 umount "$1" 2>/dev/null || { abort_fuse "$1"; umount -l "$1"; }
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The FUSE control filesystem: abort_fuse needs it.
if [ -d /sys/fs/fuse/connections ] && [ -z "$(mnt_dev /sys/fs/fuse/connections)" ]; then
    mount -t fusectl none /sys/fs/fuse/connections || true
fi
for m in "$work"/kernel/{test,scratch} "$work"/ubtrfs/{test,scratch}; do
    unmount "$m"
done
# A previous run's loop devices on these images (if it was killed with -9).
for f in "$work"/{kernel,ubtrfs}/{test,scratch}.img; do
    [ -f "$f" ] && losetup -j "$f" | cut -d: -f1 | while read -r l; do losetup -d "$l"; done
done
rm -rf "$work"
mkdir -p "$work"
for side in kernel ubtrfs; do
    mkdir -p "$work/$side"/{test,scratch,results}
    for d in test scratch; do
        truncate -s "${img_gb}G" "$work/$side/$d.img"
    done
    # Each side gets its own copy of the built tree: tests write next to themselves.
    cp -a "$src" "$work/$side/fstests"
done
for d in test scratch; do
    loops+=("$(losetup -f --show "$work/kernel/$d.img")")
done
mkfs.btrfs -f -q "${loops[0]}" >/dev/null
# fstests re-makes the kernel's scratch itself; for FUSE it only empties it.
mkfs.btrfs -f -q "$work/ubtrfs/test.img" >/dev/null
mkfs.btrfs -f -q "$work/ubtrfs/scratch.img" >/dev/null
udev_test=$work/ubtrfs/test.img
udev_scratch=$work/ubtrfs/scratch.img
if [ "${FSTESTS_UBTRFS_LOOP:-0}" = 1 ]; then
    loops+=("$(losetup -f --show "$udev_test")")
    udev_test=${loops[-1]}
    loops+=("$(losetup -f --show "$udev_scratch")")
    udev_scratch=${loops[-1]}
fi

if [ -e "$helper" ] || [ -L "$helper" ]; then
    saved_helper=$(readlink "$helper" || true)
fi
ln -sfn "$UBTRFS_BIN" "$helper"

excl=$work/exclude.list
{ [ -f "$here/exclude.txt" ] && sed 's/#.*//' "$here/exclude.txt" | awk 'NF {print $1}'; } >"$excl" || true

cat >"$work/kernel/local.config" <<EOF
export FSTYP=btrfs
export TEST_DEV=${loops[0]}
export TEST_DIR=$work/kernel/test
export SCRATCH_DEV=${loops[1]}
export SCRATCH_MNT=$work/kernel/scratch
export RESULT_BASE=$work/kernel/results
EOF
# subtype=: the mount's type is plain "fuse", which fstests checks /proc/mounts for.
# allow_other: tests run commands as the fsgqa users. (suid and dev, the kernel's
# defaults, the helper adds itself: mount(8) passes neither.)
fuse_opts=subtype=,allow_other,log=$work/ubtrfs/ubtrfs.log
cat >"$work/ubtrfs/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.ubtrfs
export TEST_DEV=$udev_test
export TEST_DIR=$work/ubtrfs/test
export SCRATCH_DEV=$udev_scratch
export SCRATCH_MNT=$work/ubtrfs/scratch
export RESULT_BASE=$work/ubtrfs/results
export MOUNT_OPTIONS="-o $fuse_opts"
export TEST_FS_MOUNT_OPTS="-o $fuse_opts"
EOF

# watchdog SIDE CHECKPID: kills a test that runs longer than $timeout seconds (fstests
# has no per-test limit), noting it in SIDE/timeouts.
watchdog() {
    local side=$1 check=$2 seen= since=0 t p cmd now
    while kill -0 "$check" 2>/dev/null; do
        sleep 5
        t=
        for p in $(pgrep -P "$check"); do
            cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
            # check runs each test as `bash .../tests/DIR/NNN`.
            case "$cmd" in *bash\ */tests/*/[0-9][0-9][0-9]*) t=$p ;; esac
        done
        now=$(date +%s)
        if [ -z "$t" ] || [ "$t" != "$seen" ]; then
            seen=$t since=$now
            continue
        fi
        if [ $((now - since)) -ge "$timeout" ]; then
            cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$t/cmdline" | awk '{print $2}')
            echo "${cmd##*/tests/} killed after $timeout s" >>"$work/$side/timeouts"
            if [ "$side" = ubtrfs ]; then
                # A hung server blocks every process that touches its mount: break
                # the connections, and give check a fresh test mount (in its mount
                # namespace) to go on with.
                for m in "$work/ubtrfs/test" "$work/ubtrfs/scratch"; do
                    abort_fuse "$m" "$check"
                done
                kill_tree "$t"
                for m in "$work/ubtrfs/test" "$work/ubtrfs/scratch"; do
                    [ -n "$(mnt_dev "$m" "$check")" ] && nsenter -t "$check" -m umount -l "$m"
                done
                for p in "${servers[@]}"; do
                    kill -KILL "$p" 2>/dev/null
                done
                servers=()
                nsenter -t "$check" -m mount -t fuse.ubtrfs "$udev_test" \
                    "$work/ubtrfs/test" -o "$fuse_opts" || true
            else
                kill_tree "$t"
            fi
            seen= since=$now
        fi
    done
}

# run_side SIDE: fstests' check for one side, in a private mount namespace of its
# own. The two sides run at once, and fstests' tools look at every mount (xfs_io
# statfs()es each one at start): a statfs in flight on the other side's FUSE mount
# made its umount fail with EBUSY. The namespace also dies with check, taking its
# mounts along, and keeps out whatever else runs on the machine. Inside it, the
# copies of other FUSE and loop-device mounts are detached first, so that they
# cannot keep someone else's filesystem alive after its owner unmounts it.
run_side() {
    local side=$1
    (
        cd "$work/$side/fstests"
        export HOST_OPTIONS=$work/$side/local.config
        # shellcheck disable=SC2016
        exec unshare --mount --propagation private bash -c '
            awk "{ split(\$0, a, \" - \"); split(a[2], b, \" \") }
                 b[1] ~ /^fuse/ || b[2] ~ /^\/dev\/loop/ { print \$5 }" /proc/self/mountinfo |
                sort -r | while read -r m; do umount -l "$(printf %b "$m")" 2>/dev/null; done
            exec ./check "$@"' check -E "$excl" "${tests[@]}"
    ) >"$work/$side/check.log" 2>&1 &
    local check=$! i
    pids+=("$check")
    for i in $(seq 50); do
        [ "$(readlink "/proc/$check/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] && break
        sleep 0.1
    done
    namespaces+=("$(readlink "/proc/$check/ns/mnt")")
    watchdog "$side" "$check" &
    pids+=("$!")
    log "$side: check running (pid $check), log $work/$side/check.log"
}

start=$(date +%s)
run_side kernel
[ "${FSTESTS_SERIAL:-}" = 1 ] && { wait "${pids[0]}" || true; }
run_side ubtrfs
for p in "${pids[@]}"; do
    wait "$p" || true
done
pids=()
finish_namespaces
log "both sides done in $(($(date +%s) - start)) s"

# fstests checks no FUSE filesystem afterwards: check what ubtrfs wrote.
for m in "$work/ubtrfs/test" "$work/ubtrfs/scratch"; do
    unmount "$m"
done
fsck_note=
fsck_failed=
for d in test scratch; do
    # The server commits its last transaction after its mount goes: wait for its lock
    # (taken on what it mounted: the image, or its loop device).
    dev=$udev_test
    [ "$d" = scratch ] && dev=$udev_scratch
    flock -w 120 "$dev" true || true
    if btrfs check --readonly --check-data-csum "$work/ubtrfs/$d.img" >"$work/ubtrfs/check-$d.log" 2>&1; then
        fsck_note+="btrfs check of the ubtrfs $d image: clean. "
    else
        fsck_note+="btrfs check of the ubtrfs $d image: ERRORS (see $work/ubtrfs/check-$d.log). "
        fsck_failed=--fsck-failed
    fi
done

python3 "$here/report.py" --work "$work" --known "$here/known-failures.txt" \
    --exclude "$here/exclude.txt" --note "$fsck_note" $fsck_failed ${FSTESTS_REPORT:+--out "$FSTESTS_REPORT"}
