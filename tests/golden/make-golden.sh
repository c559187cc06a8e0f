#!/bin/bash
# Generate "golden" btrfs images made by the running kernel, plus a manifest of
# exactly what the kernel shows for every file (see README.md).
#
#   sudo bash tests/golden/make-golden.sh OUTDIR [NAME...]
#
# (SKIP_SETS="NAME..." leaves sets out.)
#
# For every image set NAME (default: all of them) this writes
#   OUTDIR/NAME.img.zst                     (single device), or
#   OUTDIR/NAME.dev1.img.zst, .dev2, ...    (multi-device, in mkfs order)
#   OUTDIR/NAME.manifest.json
#
# Needs: root, loop devices, btrfs-progs (>= 6.3 for the "bgt" set), zstd,
# python3, attr/acl tools, xfs_io, e2fsprogs' chattr, util-linux.
# File contents are deterministic (seeded, see gendata.py); timestamps, inode
# generations, UUIDs of devices and transids are not.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

ALL_SETS=(
    empty basic manyfiles
    compress-zlib compress-lzo compress-zstd
    subvols nodesize4k nodesize64k
    csum-xxhash csum-sha256 csum-blake2
    raid1 raid10 raid0 raid5 raid6 raid1c3 raid1c4 dup-data
    bgt balance-resize
    explicit-holes mixed-bg sharing
    treelog
)

usage() {
    echo "usage: $0 OUTDIR [NAME...]" >&2
    echo "sets: ${ALL_SETS[*]}" >&2
    exit 2
}

die() { echo "make-golden: $*" >&2; exit 1; }

# Mount options naming every device of the set: the kernel scans them inside the
# mount, under the lock `btrfs device scan --forget` takes, so another test that
# forgets unmounted devices between our scan and our mount cannot make it fail
# (tests run in parallel: tests/run-tests.py).
devopts() {
    local l o=
    for l in "${LOOPS[@]}"; do o+="${o:+,}device=$l"; done
    echo "$o"
}
log() { echo "make-golden: [$(date +%T)] $*" >&2; }

# ---------------------------------------------------------------------------
# helpers for workloads

# gen MODE SEED SIZE  -> deterministic bytes on stdout (MODE: random|text|blocks)
gen() { python3 "$HERE/gendata.py" "$@"; }

# mkf MODE SEED SIZE PATH
mkf() { gen "$1" "$2" "$3" > "$4"; }

# pwrite MODE SEED SIZE PATH OFFSET  -> overwrite in place, no truncation
pwrite() {
    gen "$1" "$2" "$3" | dd of="$4" bs=65536 iflag=fullblock oflag=seek_bytes \
        seek="$5" conv=notrunc status=none
}

# setx PATH NAME MODE SEED SIZE  -> set xattr NAME to deterministic bytes
setx() {
    python3 - "$@" <<'EOF'
import os, subprocess, sys
path, name, mode, seed, size = sys.argv[1:6]
val = subprocess.run([sys.executable, os.environ["GOLDEN_GEN"], mode, seed, size],
                     check=True, stdout=subprocess.PIPE).stdout
os.setxattr(path, name, val, follow_symlinks=False)
EOF
}
export GOLDEN_GEN="$HERE/gendata.py"

# reflink_range SRC SRC_OFF DST DST_OFF LEN  (FICLONERANGE via xfs_io, which
# reports errors on stdout but exits 0, hence the output check)
reflink_range() {
    local out
    out=$(xfs_io -c "reflink $1 $2 $4 $5" "$3" 2>&1)
    case "$out" in
        *linked*) ;;
        *) echo "reflink_range $*: $out" >&2; return 1 ;;
    esac
}

# mksock PATH  -> leave a unix socket inode behind
mksock() { python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.close()' "$1"; }

# name_of_len PREFIX LEN -> PREFIX padded with 'n' to exactly LEN bytes
name_of_len() { python3 -c 'import sys; p=sys.argv[1]; n=int(sys.argv[2]); print(p + "n"*(n-len(p.encode())))' "$1" "$2"; }

# many_links FILE DIR COUNT NAMELEN -> COUNT hard links to FILE in DIR
many_links() {
    python3 - "$@" <<'EOF'
import os, sys
f, d, count, nlen = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for i in range(count):
    name = "link-%04d-" % i
    name += "L" * (nlen - len(name))
    os.link(f, os.path.join(d, name))
EOF
}

# small_tree DIR NDIRS NFILES SEED -> NDIRS dirs with NFILES small files each
# (sizes 0..3000 bytes; each file repeats a line naming it plus a hash tag)
small_tree() {
    python3 - "$@" <<'EOF'
import hashlib, os, sys
top, ndirs, nfiles, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for d in range(ndirs):
    dp = os.path.join(top, "d%03d" % d)
    os.makedirs(dp, exist_ok=True)
    for f in range(nfiles):
        size = (d * 131 + f * 977 + 7) % 3001
        tag = hashlib.shake_256(("%s/%d/%d" % (seed, d, f)).encode()).hexdigest(8)
        line = ("%s d%03d/f%04d %s\n" % (seed, d, f, tag)).encode()
        data = (line * (size // len(line) + 1))[:size]
        with open(os.path.join(dp, "f%04d" % f), "wb") as fh:
            fh.write(data)
EOF
}

# ---------------------------------------------------------------------------
# image set definitions.  cfg_NAME sets NDEV, DEVSIZE, MKFS_OPTS (array),
# MOUNT_OPTS; work_NAME fills the mounted fs at $M; post_NAME (optional) runs
# after the first unmount with the loop devices in LOOPS and may append lines
# to $NOTES.

cfg_empty() { :; }
work_empty() { :; }

# A moderately rich workload used by basic and (scaled) by the nodesize sets.
# $1: max xattr size that fits, $2: number of hard links in one dir,
# $3: symlink target length
common_workload() {
    local bigx=$1 nlinks=$2 symlen=$3
    local d

    # --- directories and small files of boundary sizes
    mkdir -p "$M/dir1/dir2/dir3/dir4/dir5" "$M/empty-dir"
    for n in 0 1 2047 2048 4095 4096 4097; do
        mkf random "size$n" "$n" "$M/dir1/size-$n"
    done
    mkf blocks size1m 1048576 "$M/dir1/dir2/size-1m"
    mkf blocks deep 12345 "$M/dir1/dir2/dir3/dir4/dir5/deep-file"

    # --- multi-extent file: 12 chunks of 256 KiB written back to front with
    # fsync in between (so extents are not in file order on disk), chunk 5 left
    # as a hole, then a 4 KiB overwrite in the middle of chunk 2.
    d="$M/extents"; mkdir "$d"
    : > "$d/multi"
    for i in 11 10 9 8 7 6 4 3 2 1 0; do
        pwrite blocks "multi$i" 262144 "$d/multi" $((i * 262144))
        sync "$d/multi"
    done
    pwrite random multi-ow 4096 "$d/multi" $((2 * 262144 + 8192))
    sync "$d/multi"
    # overwrite of an unaligned range in a big extent (read-modify-write)
    mkf blocks cow 524288 "$d/cow-partial"; sync "$d/cow-partial"
    pwrite random cow-ow 5000 "$d/cow-partial" 100000
    # inline file that later grows past the inline limit
    mkf text grow 100 "$d/inline-then-grown"; sync "$d/inline-then-grown"
    gen text grow2 9000 >> "$d/inline-then-grown"
    # write then grow with truncate: trailing hole
    mkf random tail 5000 "$d/tail-hole"; truncate -s 1048576 "$d/tail-hole"
    # shrink to a non-aligned size
    mkf blocks shrink 300000 "$d/shrunk"; sync "$d/shrunk"; truncate -s 123457 "$d/shrunk"

    # --- sparse files
    d="$M/sparse"; mkdir "$d"
    truncate -s 10M "$d/all-hole"
    : > "$d/holes"
    pwrite random sp1 4096 "$d/holes" 0
    pwrite random sp2 4096 "$d/holes" 1048576
    pwrite random sp3 100 "$d/holes" $((5 * 1048576 + 123))
    : > "$d/hole-first"
    pwrite blocks sp4 8192 "$d/hole-first" $((2 * 1048576))

    # --- fallocate
    d="$M/falloc"; mkdir "$d"
    fallocate -l 1M "$d/prealloc"                       # all unwritten
    fallocate -l 1M "$d/prealloc-partly"
    pwrite random pa 8192 "$d/prealloc-partly" 262144   # split unwritten extent
    mkf blocks punch 524288 "$d/punched"; sync "$d/punched"
    fallocate -p -o 65536 -l 131072 "$d/punched"        # aligned hole punch
    fallocate -p -o 300001 -l 5000 "$d/punched"         # unaligned: zeroes partial blocks
    mkf random keep 10000 "$d/keep-size"
    fallocate -n -o 10000 -l 1M "$d/keep-size"          # prealloc beyond EOF
    mkf blocks zr 262144 "$d/zero-range"; sync "$d/zero-range"
    fallocate -z -o 4096 -l 16384 "$d/zero-range"

    # --- hard links (overflowing INODE_REF into INODE_EXTREF)
    d="$M/links"; mkdir -p "$d/other1" "$d/other2/deeper"
    mkf random linked 3000 "$d/target"
    many_links "$d/target" "$d" "$nlinks" 200
    ln "$d/target" "$d/other1/link-a"
    ln "$d/target" "$d/other2/deeper/link-b"
    mkf text two 50 "$d/two-links"; ln "$d/two-links" "$d/other1/two-links-2"

    # --- names
    d="$M/names"; mkdir "$d"
    : > "$d/$(name_of_len "ascii-255-" 255)"
    : > "$d/$(python3 -c 'print("日本語" * 28 + "x")')"        # 253 bytes
    : > "$d/$(python3 -c 'print("é" * 127 + "z")')"              # 255 bytes, 2-byte chars
    : > "$d/emoji-😀🎉-ünïcödé"
    : > "$d/space name"
    : > "$d/quote'\"back\\slash"
    : > "$d/$(printf 'new\nline')"
    : > "$d/-dash"
    : > "$d/.hidden"
    mkdir "$d/目录-dir"; mkf text utf8 500 "$d/目录-dir/файл.txt"
    # renames and deletions leave gaps in dir index numbers
    for i in 0 1 2 3 4 5 6 7 8 9; do mkf text "del$i" $((i * 10)) "$d/tmp$i"; done
    rm "$d/tmp3" "$d/tmp7"
    mv "$d/tmp5" "$d/renamed5"
    mv "$d/tmp8" "$M/dir1/moved-from-names"

    # --- xattrs
    d="$M/xattr"; mkdir "$d"
    mkf text xf 1234 "$d/file"
    setx "$d/file" user.empty random x0 0
    setx "$d/file" user.one random x1 1
    setx "$d/file" user.hundred random x100 100
    setx "$d/file" user.big4000 random x4000 "$([ "$bigx" -lt 4000 ] && echo 3000 || echo 4000)"
    setx "$d/file" user.biggest random xbig "$bigx"
    setx "$d/file" trusted.golden text tr 64
    setx "$d" user.on-dir text xd 20
    ln -s file "$d/symlink-with-xattr"
    setx "$d/symlink-with-xattr" trusted.on-symlink text xs 30
    mkf random cap 100 "$d/has-capability"; chmod 755 "$d/has-capability"
    setcap cap_net_raw,cap_net_bind_service+ep "$d/has-capability"
    # many xattrs on one inode
    mkf text many 10 "$d/many-xattrs"
    for i in $(seq 0 49); do setx "$d/many-xattrs" "user.attr-$i" text "ma$i" $((i * 7)); done

    # --- ACLs
    d="$M/acl"; mkdir "$d" "$d/default-acl-dir"
    mkf text acl 100 "$d/file-acl"
    setfacl -m u:1000:rwx,u:2000:r--,g:100:r-x,m:rwx "$d/file-acl"
    setfacl -d -m u:1000:rwx,g:100:r-x "$d/default-acl-dir"
    mkf text acl2 100 "$d/default-acl-dir/inherits"
    mkdir "$d/default-acl-dir/subdir-inherits"

    # --- symlinks
    d="$M/symlinks"; mkdir "$d"
    ln -s ../dir1/size-1 "$d/short"
    ln -s /absolute/target/that/does/not/exist "$d/dangling-abs"
    ln -s ../dir1 "$d/to-dir"
    ln -s "$(python3 -c 'import sys; n=int(sys.argv[1]); s=("component-%02d/" * 400) % tuple(i % 100 for i in range(400)); print(s[:n])' "$symlen")" "$d/long"
    ln -s "日本/ファイル" "$d/utf8-target"

    # --- special files
    d="$M/special"; mkdir "$d"
    mkfifo "$d/fifo"
    mksock "$d/socket"
    mknod "$d/chr-null" c 1 3
    mknod "$d/chr-big" c 300 70000
    mknod "$d/blk-loop" b 7 200
    mknod -m 600 "$d/blk-big" b 259 1048575

    # --- attributes (chattr)
    d="$M/attrs"; mkdir "$d"
    : > "$d/nocow"; chattr +C "$d/nocow"; mkf blocks nocow 200000 "$d/nocow.tmp"
    cat "$d/nocow.tmp" >> "$d/nocow"; rm "$d/nocow.tmp"    # NODATACOW => no csums
    mkdir "$d/nocow-dir"; chattr +C "$d/nocow-dir"; mkf random ncd 70000 "$d/nocow-dir/inherited"
    : > "$d/compressed"; chattr +c "$d/compressed"; mkf text cmp 400000 "$d/compressed.tmp"
    cat "$d/compressed.tmp" >> "$d/compressed"; rm "$d/compressed.tmp"
    mkf text nd 10 "$d/nodump"; chattr +d "$d/nodump"
    mkf text ap 10 "$d/append-only"
    mkf text im 10 "$d/immutable"
    mkf text sy 10 "$d/sync"; chattr +S "$d/sync"
    mkf text na 10 "$d/noatime"; chattr +A "$d/noatime"

    # --- ownership and modes
    d="$M/owners"; mkdir "$d"
    for spec in 0:0 1000:1000 65534:65534 123456:654321 4294967294:4294967294 1:2; do
        : > "$d/owned-${spec/:/-}"; chown "$spec" "$d/owned-${spec/:/-}"
    done
    mkf text m 10 "$d/setuid";  chmod 4755 "$d/setuid"
    mkf text m 10 "$d/setgid";  chmod 2755 "$d/setgid"
    mkf text m 10 "$d/mode000"; chmod 000 "$d/mode000"
    mkf text m 10 "$d/mode777"; chmod 777 "$d/mode777"
    mkdir "$d/sticky-dir"; chmod 1777 "$d/sticky-dir"
    mkdir "$d/setgid-dir"; chmod 2775 "$d/setgid-dir"; chown 0:1000 "$d/setgid-dir"
    : > "$d/setgid-dir/inherits-gid"

    # --- a subvolume
    btrfs -q subvolume create "$M/subvol"
    mkf text sv 3000 "$M/subvol/in-subvol"
    mkdir "$M/subvol/dir"; mkf blocks sv2 20000 "$M/subvol/dir/file"

    # --- explicit timestamps: done last so nothing disturbs them
    d="$M/times"; mkdir "$d"
    mkf text t 10 "$d/y2001";   touch -d "2001-02-03 04:05:06.123456789 UTC" "$d/y2001"
    mkf text t 10 "$d/split";   touch -m -d "2010-01-01 00:00:00.5 UTC" "$d/split"
                                touch -a -d "2020-12-31 23:59:59.999999999 UTC" "$d/split"
    mkf text t 10 "$d/pre1970"; touch -d "1969-07-20 20:17:40.000000001 UTC" "$d/pre1970"
    mkf text t 10 "$d/epoch";   touch -d "@0" "$d/epoch"
    mkf text t 10 "$d/y2100";   touch -d "2100-01-01 00:00:00 UTC" "$d/y2100"
    ln -s y2001 "$d/symlink";   touch -h -d "2002-02-02 02:02:02.2 UTC" "$d/symlink"
    mkdir "$d/dir";             touch -d "2003-03-03 03:03:03 UTC" "$d/dir"
    chattr +a "$M/attrs/append-only"
    chattr +i "$M/attrs/immutable"
}

cfg_basic() { MKFS_OPTS=(-n 16384); }
work_basic() {
    # 16000-byte xattr, 220 links with 200-byte names (44 KiB of refs)
    common_workload 16000 220 4000
}

cfg_manyfiles() { :; }
work_manyfiles() {
    small_tree "$M/tree" 100 101 many
    mkdir "$M/bigdir"
    python3 -c 'import os,sys
for i in range(3000): open(os.path.join(sys.argv[1], "entry-%05d-%s" % (i, "x" * (i % 50))), "w").close()' "$M/bigdir"
    # delete every 7th file in one dir (dir index gaps, freed inode numbers)
    find "$M/tree/d050" -name 'f*[07]' -delete
}

compress_workload() {
    local d="$M/c"
    mkdir "$d"
    # small files: inline (compressed if it shrinks) up to 4096 bytes
    for n in 1 100 1000 2000 2048 3000 4000 4096 5000; do mkf text "small$n" "$n" "$d/text-$n"; done
    mkf random smallr 3000 "$d/random-3000"
    # large compressible files: several 128 KiB compressed extents
    mkf text big1 524288 "$d/text-512k"
    mkf text big2 300000 "$d/text-300000"
    mkf blocks big3 786432 "$d/blocks-768k"
    head -c 1048576 /dev/zero > "$d/zeros-1m"
    # incompressible data
    mkf random rnd 262144 "$d/random-256k"
    # mixed: text / random / text
    { gen text mx1 131072; gen random mx2 65536; gen text mx3 200000; } > "$d/mixed"
    sync
    # partial overwrites in the middle of compressed extents
    mkf text ow 524288 "$d/overwritten"; sync
    pwrite text ow-a 8192 "$d/overwritten" 200000        # unaligned, inside extent 1
    pwrite random ow-b 4096 "$d/overwritten" 327680      # aligned, inside extent 2
    pwrite text ow-c 100 "$d/overwritten" 524200         # straddles EOF
    sync
    # truncation of a compressed file to a non-aligned size
    mkf text tr 524288 "$d/truncated"; sync
    truncate -s 333333 "$d/truncated"
    mkf text tr2 400000 "$d/truncated-then-grown"; sync
    truncate -s 150001 "$d/truncated-then-grown"; truncate -s 700000 "$d/truncated-then-grown"
    # partial reflink of a compressed extent into another file
    mkf text rl 393216 "$d/reflink-src"; sync
    : > "$d/reflink-dst"
    reflink_range "$d/reflink-src" 65536 "$d/reflink-dst" 0 131072
    reflink_range "$d/reflink-src" 262144 "$d/reflink-dst" 262144 65536
    # prealloc in a compressed mount: written prealloc stays uncompressed
    fallocate -l 262144 "$d/prealloc"; pwrite text pr 100000 "$d/prealloc" 0
    # holes between compressed extents
    : > "$d/sparse"
    pwrite text sp1 150000 "$d/sparse" 0
    pwrite text sp2 150000 "$d/sparse" 1048576
    truncate -s 3000000 "$d/sparse"
    # a few xattrs so the fs tree has something else too
    setx "$d/text-512k" user.note text note 300
}
cfg_compress_zlib() { MOUNT_OPTS="compress-force=zlib:9"; }
work_compress_zlib() { compress_workload; }
cfg_compress_lzo()  { MOUNT_OPTS="compress-force=lzo"; }
work_compress_lzo()  { compress_workload; }
cfg_compress_zstd() { MOUNT_OPTS="compress=zstd:3"; }
work_compress_zstd() { compress_workload; }

cfg_subvols() { DEVSIZE=256M; SYNC_BEFORE_UMOUNT=0; }
work_subvols() {
    btrfs -q subvolume create "$M/sub1"
    btrfs -q subvolume create "$M/sub1/sub2"
    mkdir "$M/dir"
    btrfs -q subvolume create "$M/dir/sub3"
    mkf text top 5000 "$M/top-file"
    mkf blocks a 262144 "$M/sub1/a"
    mkf text b 3000 "$M/sub1/b"
    mkdir "$M/sub1/d"; mkf text d1 100 "$M/sub1/d/inside"
    mkf random c 20000 "$M/sub1/sub2/c"
    mkf blocks sub3 65536 "$M/dir/sub3/d"
    setx "$M/sub1" user.subvol-root text sr 10
    # reflinks: whole-file within a subvolume, across subvolumes, and partial
    cp --reflink=always "$M/sub1/a" "$M/sub1/a-reflink"
    cp --reflink=always "$M/sub1/a" "$M/dir/sub3/a-from-sub1"
    cp --reflink=always "$M/sub1/sub2/c" "$M/c-in-top"
    : > "$M/sub1/sub2/partial-reflink"
    reflink_range "$M/sub1/a" 65536 "$M/sub1/sub2/partial-reflink" 4096 8192
    sync
    # snapshots: sub1 contains the nested subvolume sub2, which shows up in
    # the snapshot as an empty placeholder directory (ino 2)
    btrfs -q subvolume snapshot "$M/sub1" "$M/snap1"
    btrfs -q subvolume snapshot -r "$M/sub1" "$M/snap1-ro"
    mkdir "$M/snaps"
    btrfs -q subvolume snapshot "$M" "$M/snaps/top-snap"
    btrfs -q subvolume snapshot "$M/dir/sub3" "$M/snaps/sub3-snap"
    # changes after snapshotting, in the source ...
    pwrite random a-ow 4096 "$M/sub1/a" 8192
    rm "$M/sub1/b"
    mkf text new 700 "$M/sub1/new-after-snap"
    # ... and in the writable snapshot
    rm "$M/snap1/a-reflink"
    gen text b-app 2000 >> "$M/snap1/b"
    mkf text snapnew 1500 "$M/snap1/only-in-snap"
    mv "$M/snap1/d" "$M/snap1/d-renamed"
    mkf text s3 33 "$M/snaps/sub3-snap/new"
    sync
    # a big subvolume, deleted right before unmount so that its cleanup is
    # (hopefully) still pending in the image
    btrfs -q subvolume create "$M/doomed"
    small_tree "$M/doomed" 40 200 doomed
    sync
    btrfs -q subvolume delete "$M/doomed"
}
post_subvols() {
    # record whether the deleted subvolume is still waiting for the cleaner
    btrfs inspect-internal dump-tree -t root "${LOOPS[0]}" | awk -v notes="$NOTES" '
        /^\titem [0-9]+ key \(/ { key = $0; sub(/^\t/, "", key); sub(/ itemoff.*/, "", key) }
        { line = $0; gsub(/^[ \t]+/, "", line) }
        /ROOT_ITEM/ && /^\titem/ { root = key }
        /refs 0$/ && root != "" { print "root tree: " root " has refs 0 (" line ")" >> notes }
        /drop_progress/ && root != "" && $0 !~ /key \(0 UNKNOWN.0 0\)/ { print "root tree: " root " " line >> notes }
        /ORPHAN_ITEM/ && /^\titem/ { print "root tree: " key " present" >> notes; orphan++ }
        END {
            if (orphan) print "deleted subvolume doomed: cleanup still pending at unmount (ORPHAN_ITEM and dead ROOT_ITEM present)" >> notes
            else print "deleted subvolume doomed: cleaner finished before unmount (no ORPHAN_ITEM)" >> notes
        }'
    sed -i 's/\t\+/ /g; s/  \+/ /g' "$NOTES"
}

cfg_nodesize4k() { MKFS_OPTS=(-n 4096); }
work_nodesize4k() {
    # 4 KiB leaves: xattr and symlink limits are ~3.9 KB
    common_workload 3900 60 3900
    small_tree "$M/tree" 30 100 ns4k
    python3 -c 'import os,sys
for i in range(1500): os.setxattr(os.path.join(sys.argv[1], "tree/d%03d/f%04d" % (i % 30, i // 30)), "user.x", b"v" * (i % 200))' "$M"
}

cfg_nodesize64k() { MKFS_OPTS=(-n 65536); }
work_nodesize64k() {
    common_workload 60000 400 4095
    small_tree "$M/tree" 10 100 ns64k
}

csum_workload() {
    mkdir "$M/data"
    mkf random c1 262144 "$M/data/random-256k"
    mkf blocks c2 2097152 "$M/data/blocks-2m"
    mkf text c3 1500 "$M/data/inline"
    mkf text c4 5000 "$M/data/small"
    : > "$M/data/sparse"; pwrite random c5 8192 "$M/data/sparse" 1048576
    mkf blocks c6 100000 "$M/data/nocow-src"
    : > "$M/data/nocow"; chattr +C "$M/data/nocow"; cat "$M/data/nocow-src" >> "$M/data/nocow"
    setx "$M/data/inline" user.a text x 50
    btrfs -q subvolume create "$M/sv"
    cp --reflink=always "$M/data/blocks-2m" "$M/sv/reflinked"
}
cfg_csum_xxhash() { MKFS_OPTS=(--csum xxhash); }
work_csum_xxhash() { csum_workload; }
cfg_csum_sha256() { MKFS_OPTS=(--csum sha256); }
work_csum_sha256() { csum_workload; }
cfg_csum_blake2() { MKFS_OPTS=(--csum blake2); }
work_csum_blake2() { csum_workload; }

raid_workload() {
    mkdir "$M/r"
    # labelled 4 KiB blocks: every block is distinct, so a wrong stripe
    # mapping changes the sha256, but the image still compresses well
    mkf blocks r1 6291456 "$M/r/blocks-6m"
    mkf blocks r2 1000000 "$M/r/blocks-unaligned"
    mkf random r3 393216 "$M/r/random-384k"
    mkf text r4 1000 "$M/r/inline"
    mkf text r5 70000 "$M/r/text-70000"
    : > "$M/r/sparse"; pwrite blocks r6 200000 "$M/r/sparse" 3000000
    small_tree "$M/tree" 10 30 raid
}
cfg_raid1()   { NDEV=2; DEVSIZE=160M; MKFS_OPTS=(-d raid1 -m raid1); }
cfg_raid10()  { NDEV=4; DEVSIZE=160M; MKFS_OPTS=(-d raid10 -m raid10); }
cfg_raid0()   { NDEV=2; DEVSIZE=160M; MKFS_OPTS=(-d raid0 -m raid1); }
cfg_raid5()   { NDEV=3; DEVSIZE=160M; MKFS_OPTS=(-d raid5 -m raid1); }
cfg_raid6()   { NDEV=4; DEVSIZE=160M; MKFS_OPTS=(-d raid6 -m raid1c3); }
cfg_raid1c3() { NDEV=3; DEVSIZE=160M; MKFS_OPTS=(-d raid1c3 -m raid1c3); }
cfg_raid1c4() { NDEV=4; DEVSIZE=160M; MKFS_OPTS=(-d raid1c4 -m raid1c4); }
cfg_dup_data() { MKFS_OPTS=(-d dup -m dup); }
work_raid1()   { raid_workload; }
work_raid10()  { raid_workload; }
work_raid0()   { raid_workload; }
work_raid5()   { raid_workload; }
work_raid6()   { raid_workload; }
work_raid1c3() { raid_workload; }
work_raid1c4() { raid_workload; }
work_dup_data() { raid_workload; }

cfg_bgt() { MKFS_OPTS=(-O block-group-tree); }
work_bgt() { csum_workload; small_tree "$M/tree" 5 20 bgt; }

cfg_balance_resize() { DEVSIZE=300M; }
work_balance_resize() {
    local i
    mkdir "$M/b"
    for i in $(seq 0 19); do mkf blocks "bal$i" 1048576 "$M/b/file$i"; done
    mkf random balr 262144 "$M/b/random"
    mkf text bali 1000 "$M/b/inline"
    small_tree "$M/tree" 5 40 bal
    sync
    for i in $(seq 0 2 19); do rm "$M/b/file$i"; done
    sync
    btrfs balance start --full-balance "$M" >/dev/null
    btrfs filesystem resize -32m "$M" >/dev/null
    for i in $(seq 20 24); do mkf blocks "bal$i" 524288 "$M/b/after-$i"; done
    pwrite random balow 4096 "$M/b/file1" 4096
}

# explicit hole extents (no-holes disabled)
# Sharedness cases for fiemap / du / qgroups: snapshots of snapshots modified at
# different depths, dedupe, reflinks within a file and across files, reflink then
# partial overwrite, compressed extents referenced in part, prealloc, a deleted
# snapshot.
cfg_sharing() { MOUNT_OPTS="compress=zstd"; SYNC_BEFORE_UMOUNT=1; }
work_sharing() {
    btrfs -q subvolume create "$M/base"
    mkdir -p "$M/base/d1/d2"
    mkf random r1 600000 "$M/base/rand"
    mkf text t1 900000 "$M/base/text"
    mkf blocks b1 393216 "$M/base/d1/blocks"
    mkf random r2 200000 "$M/base/d1/d2/deep"
    mkf text tiny 100 "$M/base/tiny"
    fallocate -l 1M "$M/base/prealloc"
    pwrite random pa 8192 "$M/base/prealloc" 65536
    # reflink within one file and across files, then overwrite part of a clone
    : > "$M/base/self-reflink"
    mkf random s1 262144 "$M/base/self-reflink"
    reflink_range "$M/base/self-reflink" 0 "$M/base/self-reflink" 262144 131072
    cp --reflink=always "$M/base/text" "$M/base/text-clone"
    pwrite random ow 12288 "$M/base/text-clone" 20480
    # dedupe two identical files
    mkf random dd 196608 "$M/base/dup-a"
    mkf random dd 196608 "$M/base/dup-b"
    sync
    xfs_io -c "dedupe $M/base/dup-a 0 0 196608" "$M/base/dup-b" >/dev/null
    sync
    # snapshot chain, modified at different depths
    btrfs -q subvolume snapshot "$M/base" "$M/s1"
    pwrite random m1 4096 "$M/s1/rand" 4096
    btrfs -q subvolume snapshot "$M/s1" "$M/s2"
    pwrite random m2 4096 "$M/s2/d1/d2/deep" 8192
    rm "$M/s2/text"
    btrfs -q subvolume snapshot -r "$M/s2" "$M/s3-ro"
    pwrite random m3 8192 "$M/base/d1/blocks" 0
    gen text app 3000 >> "$M/s1/text"
    # a snapshot made and deleted again
    btrfs -q subvolume snapshot "$M/base" "$M/gone"
    sync
    btrfs -q subvolume delete "$M/gone"
    btrfs subvolume sync "$M" >/dev/null 2>&1 || true
}

cfg_explicit_holes() { MKFS_OPTS=(-O ^no-holes); }
work_explicit_holes() {
    local d="$M/h"
    mkdir "$d"
    truncate -s 10M "$d/all-hole"
    : > "$d/holes"
    pwrite random h1 4096 "$d/holes" 0
    pwrite random h2 4096 "$d/holes" 1048576
    pwrite random h3 100 "$d/holes" $((5 * 1048576 + 123))
    : > "$d/hole-first"; pwrite blocks h4 8192 "$d/hole-first" $((2 * 1048576))
    mkf blocks h5 524288 "$d/punched"; sync "$d/punched"
    fallocate -p -o 65536 -l 131072 "$d/punched"
    mkf random h6 5000 "$d/tail-hole"; truncate -s 1048576 "$d/tail-hole"
    fallocate -l 1M "$d/prealloc"
    mkf text h7 1000 "$d/inline"
    mkf text h8 1000 "$d/inline-then-extended"; truncate -s 100000 "$d/inline-then-extended"
}

# mixed block groups (data and metadata share block groups; nodesize = sectorsize)
cfg_mixed_bg() { MKFS_OPTS=(-M); DEVSIZE=128M; }
work_mixed_bg() { csum_workload; small_tree "$M/tree" 5 20 mixed; }

# a tree log the kernel wrote and did not replay: files and directories changed
# after the last commit and fsynced, the device copied while still mounted (as
# after a power cut). The manifest is what the kernel shows once its mount has
# replayed the log; the committed image keeps the log unreplayed.
cfg_treelog() { DEVSIZE=160M; SYNC_BEFORE_UMOUNT=0; }
work_treelog() {
    mkdir d keep moved-from
    mkf random t1 300000 d/overwritten
    mkf random t2 100000 d/appended
    mkf random t3 200000 d/truncated
    mkf text t4 500 d/small
    mkf random t5 50000 keep/unchanged
    mkf random t6 40000 d/unlinked
    mkf random t7 40000 moved-from/renamed
    for i in $(seq 1 300); do echo "entry $i" > "keep/e$i"; done
    sync
    # The kernel commits instead of logging a file moved to another directory.
    mv moved-from/renamed d/renamed
    xfs_io -c fsync d/renamed
    # From here: only the fsyncs below reach the log.
    pwrite random t8 4096 d/overwritten 8192
    pwrite random t9 70000 d/appended 100000
    truncate -s 5000 d/truncated
    truncate -s 900000 d/small
    mkdir -p new/deeper
    mkf random t10 123456 new/deeper/made
    ln d/appended new/deeper/link
    setfattr -n user.golden -v logged d/overwritten
    rm d/unlinked
    for i in $(seq 1 100); do rm "keep/e$i"; done
    for i in $(seq 301 350); do echo "entry $i" > "keep/e$i"; done
    fallocate -p -o 65536 -l 65536 d/overwritten
    for f in d/overwritten d/appended d/truncated d/small new/deeper/made d keep; do
        xfs_io -c fsync "$f"
    done
    # Not fsynced: lost at the cut.
    mkf random t11 10000 d/never-synced
    cp --sparse=always "$WORK/dev1.img" "$WORK/cut.img"
}
post_treelog() {
    # The device becomes the copy taken before the unmount (a fresh loop device,
    # so no cached block of the unmounted filesystem is read).
    btrfs device scan --forget "${LOOPS[0]}" >/dev/null 2>&1 || true
    losetup -d "${LOOPS[0]}"
    cp --sparse=always "$WORK/cut.img" "$WORK/dev1.img"
    LOOPS[0]=$(losetup -f --show "$WORK/dev1.img")
    btrfs inspect-internal dump-super "${LOOPS[0]}" | awk -v notes="$NOTES" \
        '$1 == "log_root" && $2 != 0 { print "superblock log_root " $2 " (unreplayed tree log)" >> notes }'
    grep -q "unreplayed tree log" "$NOTES" || die "treelog: the copy has no tree log"
}
pre_pack_treelog() {
    # The read-only mount replayed the log into the device: keep the copy instead.
    cp --sparse=always "$WORK/cut.img" "$WORK/dev1.img"
}

# ---------------------------------------------------------------------------

build_set() {
    local name=$1 fn=${1//-/_}
    declare -F "cfg_$fn" >/dev/null || die "unknown image set '$name'"

    NDEV=1 DEVSIZE=256M MKFS_OPTS=() MOUNT_OPTS="" SYNC_BEFORE_UMOUNT=1
    "cfg_$fn"

    WORK=$(mktemp -d "/tmp/golden-$name.XXXXXX")
    MNT=$WORK/mnt
    NOTES=$WORK/notes.txt
    LOOPS=()
    mkdir "$MNT"
    : > "$NOTES"

    cleanup_set() {
        set +e
        if mountpoint -q "$MNT" 2>/dev/null; then
            umount "$MNT" 2>/dev/null || { sleep 1; umount "$MNT"; } || umount -l "$MNT"
        fi
        local l
        for l in "${LOOPS[@]}"; do
            btrfs device scan --forget "$l" >/dev/null 2>&1
            losetup -d "$l" 2>/dev/null
        done
        LOOPS=()
        rm -rf "$WORK"
    }
    trap cleanup_set EXIT
    trap 'exit 130' INT TERM HUP
    set -o errtrace
    trap 'echo "make-golden: $name: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

    local i l uuid imgs=() names=()
    btrfs device scan --forget >/dev/null 2>&1 || true
    for i in $(seq 1 "$NDEV"); do
        truncate -s "$DEVSIZE" "$WORK/dev$i.img"
        l=$(losetup -f --show "$WORK/dev$i.img")
        LOOPS+=("$l")
        imgs+=("$WORK/dev$i.img")
        if [ "$NDEV" -eq 1 ]; then names+=("$name.img.zst"); else names+=("$name.dev$i.img.zst"); fi
    done

    # deterministic fsid per set name
    uuid=$(python3 -c 'import sys,uuid; print(uuid.uuid5(uuid.NAMESPACE_URL, "ubtrfs-golden/" + sys.argv[1]))' "$name")
    local mkfs_cmd=(mkfs.btrfs -f -L "golden-$name" -U "$uuid" "${MKFS_OPTS[@]}")
    log "$name: ${mkfs_cmd[*]} (${NDEV} x $DEVSIZE)${MOUNT_OPTS:+ mount -o $MOUNT_OPTS}"
    "${mkfs_cmd[@]}" "${LOOPS[@]}" > "$WORK/mkfs.log" 2>&1 || { cat "$WORK/mkfs.log" >&2; die "$name: mkfs failed"; }
    btrfs device scan "${LOOPS[@]}" >/dev/null

    mount -t btrfs -o "$(devopts)${MOUNT_OPTS:+,$MOUNT_OPTS}" "${LOOPS[0]}" "$MNT"
    M=$MNT
    ( cd "$MNT"; "work_$fn" )
    if [ "$SYNC_BEFORE_UMOUNT" = 1 ]; then sync; fi
    umount "$MNT"

    if declare -F "post_$fn" >/dev/null; then "post_$fn"; fi

    mount -t btrfs -o "ro,$(devopts)${MOUNT_OPTS:+,$MOUNT_OPTS}" "${LOOPS[0]}" "$MNT"
    local devlist
    devlist=$(IFS=,; echo "${names[*]}")
    python3 "$HERE/walk.py" "$MNT" "$WORK/manifest.json" --name "$name" \
        --devices "$devlist" --mkfs "${mkfs_cmd[*]}" --mount-opts "$MOUNT_OPTS" \
        --dev "${LOOPS[0]}" --notes "$NOTES"
    umount "$MNT"

    for l in "${LOOPS[@]}"; do
        btrfs device scan --forget "$l" >/dev/null 2>&1 || true
        losetup -d "$l"
    done
    LOOPS=()

    if declare -F "pre_pack_$fn" >/dev/null; then "pre_pack_$fn"; fi
    for i in $(seq 1 "$NDEV"); do
        zstd -19 -q -f "${imgs[$((i - 1))]}" -o "$OUTDIR/${names[$((i - 1))]}"
    done

    # The kernel's qgroup numbers after a full rescan, taken on the working copy
    # (the committed image was compressed above and is not touched by this).
    # Golden sets have fixed fsids: drop stale registrations of unmounted devices
    # (e.g. a test's read-only loop of the committed image) before mounting.
    btrfs device scan --forget >/dev/null 2>&1 || true
    for img in "${imgs[@]}"; do LOOPS+=("$(losetup -f --show "$img")"); done
    if [ "$NDEV" -gt 1 ]; then
        for l in "${LOOPS[@]}"; do btrfs device scan "$l" >/dev/null; done
    fi
    mount -t btrfs -o "$(devopts)${MOUNT_OPTS:+,$MOUNT_OPTS}" "${LOOPS[0]}" "$MNT"
    btrfs quota enable "$MNT"
    btrfs quota rescan -w "$MNT" >/dev/null
    btrfs qgroup show --raw "$MNT" > "$WORK/qgroups.txt"
    umount "$MNT"
    for l in "${LOOPS[@]}"; do
        btrfs device scan --forget "$l" >/dev/null 2>&1 || true
        losetup -d "$l"
    done
    LOOPS=()
    python3 - "$WORK/manifest.json" "$WORK/qgroups.txt" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
q = {}
for line in open(sys.argv[2]):
    f = line.split()
    if f and f[0][0].isdigit() and "/" in f[0]:
        q[f[0]] = [int(f[1]), int(f[2])]
m["qgroups"] = q
with open(sys.argv[1], "w") as out:
    out.write("{\n")
    items = [(k, v) for k, v in m.items() if k != "entries"]
    for k, v in items:
        out.write(" %s: %s,\n" % (json.dumps(k), json.dumps(v, ensure_ascii=False)))
    out.write(' "entries": [\n')
    es = m["entries"]
    for i, e in enumerate(es):
        out.write("  " + json.dumps(e, ensure_ascii=False, separators=(",", ":")))
        out.write(",\n" if i + 1 < len(es) else "\n")
    out.write(" ]\n}\n")
PY
    mv "$WORK/manifest.json" "$OUTDIR/$name.manifest.json"
    log "$name: done ($(cd "$OUTDIR" && du -ch "${names[@]}" "$name.manifest.json" | tail -n 1 | cut -f1))"
}

# ---------------------------------------------------------------------------

[ $# -ge 1 ] || usage
[ "$(id -u)" -eq 0 ] || die "must run as root"
for tool in mkfs.btrfs btrfs losetup zstd python3 setfattr setfacl setcap xfs_io chattr fallocate; do
    command -v "$tool" >/dev/null || die "missing tool: $tool"
done

OUTDIR=$1; shift
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
if [ $# -gt 0 ]; then SETS=("$@"); else SETS=("${ALL_SETS[@]}"); fi
# SKIP_SETS="a b": leave those out (tests/run-tests.py makes `treelog` apart).
if [ -n "${SKIP_SETS:-}" ]; then
    kept=()
    for s in "${SETS[@]}"; do
        [[ " $SKIP_SETS " == *" $s "* ]] || kept+=("$s")
    done
    SETS=("${kept[@]}")
fi

failed=()
start=$SECONDS
for s in "${SETS[@]}"; do
    # each set runs in its own subshell with its own EXIT trap for cleanup
    set +e
    ( set -e; build_set "$s" )
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
        log "$s: FAILED (exit $rc)"
        failed+=("$s")
    fi
done
log "finished in $((SECONDS - start))s"
if [ ${#failed[@]} -gt 0 ]; then
    die "failed sets: ${failed[*]}"
fi
