#!/usr/bin/env python3
"""Record what the kernel shows for a mounted btrfs filesystem (stdlib only).

    walk.py MOUNTPOINT OUT.json --name NAME --devices a,b --mkfs "..."
            [--mount-opts OPTS] [--dev /dev/loopN] [--notes FILE]

Walks MOUNTPOINT top-down (never following symlinks, descending into
subvolumes and snapshots, which appear as directories), and writes the
manifest described in README.md.  Run it on a read-only mount so that atime
cannot change while reading.
"""
import argparse
import ctypes
import ctypes.util
import fcntl
import hashlib
import json
import os
import platform
import stat
import struct
import subprocess
import sys

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
STATX_BTIME = 0x800
STATX_ALL = 0xFFF
FS_IOC_GETFLAGS = 0x80086601

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_statx = getattr(_libc, "statx", None)


def ts(sec, nsec):
    """Format a timestamp as 'SEC.NSEC9' with SEC = floor, 0 <= NSEC < 1e9."""
    return "%d.%09d" % (sec, nsec)


def ns_ts(ns):
    return ts(ns // 1_000_000_000, ns % 1_000_000_000)


def statx_info(path):
    """Return (crtime string or None, stx_attributes, stx_attributes_mask)."""
    if _statx is None:
        return None, None, None
    buf = ctypes.create_string_buffer(256)
    r = _statx(AT_FDCWD, os.fsencode(path), AT_SYMLINK_NOFOLLOW, STATX_ALL | STATX_BTIME, buf)
    if r != 0:
        return None, None, None
    raw = buf.raw
    mask = struct.unpack_from("<I", raw, 0)[0]
    attrs = struct.unpack_from("<Q", raw, 8)[0]
    attrs_mask = struct.unpack_from("<Q", raw, 56)[0]
    crtime = None
    if mask & STATX_BTIME:
        sec, nsec = struct.unpack_from("<qI", raw, 80)
        crtime = ts(sec, nsec)
    return crtime, attrs, attrs_mask


def fsflags(path, st):
    """FS_IOC_GETFLAGS (lsattr flags) for regular files and directories."""
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOATIME)
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return None
    try:
        out = fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 8)
        return struct.unpack_from("<I", out, 0)[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def ftype(mode):
    for test, name in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "dir"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "sock"),
        (stat.S_ISCHR, "chr"),
        (stat.S_ISBLK, "blk"),
    ):
        if test(mode):
            return name
    return "unknown"


FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_LAST = 0x1


def fiemap(path):
    """The kernel's FS_IOC_FIEMAP for the whole file, as filefrag asks for it:
    [[logical, physical, length, flags], ...]."""
    out = []
    start = 0
    count = 64
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while True:
            hdr = struct.pack("<QQIIII", start, 0xFFFFFFFFFFFFFFFF, 0, 0, count, 0)
            buf = bytearray(hdr + b"\0" * (56 * count))
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
            mapped = struct.unpack_from("<I", buf, 20)[0]
            if mapped == 0:
                break
            last = False
            for i in range(mapped):
                lo, ph, ln = struct.unpack_from("<QQQ", buf, 32 + 56 * i)
                fl = struct.unpack_from("<I", buf, 32 + 56 * i + 40)[0]
                out.append([lo, ph, ln, fl])
                last = last or bool(fl & FIEMAP_EXTENT_LAST)
            if last:
                break
            start = out[-1][0] + out[-1][2]
    finally:
        os.close(fd)
    return out


def fi_du(path):
    """`btrfs filesystem du --raw -s PATH` -> [total, exclusive, set_shared]."""
    text = run(["btrfs", "filesystem", "du", "--raw", "-s", path], quiet=True)
    line = text.strip().splitlines()[-1].split()
    return [int(line[0]), int(line[1]), int(line[2])]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def xattrs(path):
    out = {}
    for name in sorted(os.listxattr(path, follow_symlinks=False)):
        out[name] = os.getxattr(path, name, follow_symlinks=False).hex()
    return out


def run(cmd, quiet=False):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL if quiet else None).stdout.decode()


def parse_super(text):
    sup = {}
    for line in text.splitlines():
        if not line or line[0].isspace() or "\t" not in line:
            continue
        key, _, val = line.partition("\t")
        key = key.strip()
        val = val.strip()
        if key and key not in sup and " " not in key:
            sup[key] = val
    return sup


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mountpoint")
    ap.add_argument("out")
    ap.add_argument("--name", required=True)
    ap.add_argument("--devices", required=True, help="comma-separated image names in mkfs order")
    ap.add_argument("--mkfs", required=True)
    ap.add_argument("--mount-opts", default="")
    ap.add_argument("--dev", help="block device for dump-super (default: from /proc/self/mounts)")
    ap.add_argument("--notes", help="file whose lines become the 'notes' list")
    args = ap.parse_args()

    mnt = os.path.realpath(args.mountpoint)
    dev = args.dev
    if dev is None:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if parts[1] == mnt:
                    dev = parts[0]
    if dev is None:
        sys.exit("walk.py: %s is not a mount point" % mnt)

    super_text = run(["btrfs", "inspect-internal", "dump-super", dev])
    sup = parse_super(super_text)
    csum = sup.get("csum_type", "")
    # "0 (crc32c)" -> "crc32c"
    csum_name = csum[csum.find("(") + 1 : csum.find(")")] if "(" in csum else csum

    progs = run(["btrfs", "--version"]).strip()

    entries = []
    dev_root = {}  # st_dev -> subvolume id
    for dirpath, dirnames, filenames in os.walk(mnt, topdown=True, followlinks=False):
        dirnames.sort(key=os.fsencode)
        todo = [dirpath] + [os.path.join(dirpath, n) for n in sorted(dirnames + filenames, key=os.fsencode)]
        # record the directory itself, then its children except real directories,
        # which are recorded when os.walk visits them (symlinks to directories are
        # in dirnames but are not followed, so they are recorded here).
        for i, p in enumerate(todo):
            st = os.lstat(p)
            if i > 0 and stat.S_ISDIR(st.st_mode):
                continue
            rel = os.path.relpath(p, mnt)
            path = "/" if rel == "." else "/" + rel
            if st.st_dev not in dev_root:
                try:
                    dev_root[st.st_dev] = int(run(["btrfs", "inspect-internal", "rootid", p], quiet=True).strip())
                except (subprocess.CalledProcessError, ValueError):
                    dev_root[st.st_dev] = None
            crtime, sx_attrs, _ = statx_info(p)
            e = {
                "path": path,
                "type": ftype(st.st_mode),
                "ino": st.st_ino,
                "mode": st.st_mode,
                "nlink": st.st_nlink,
                "uid": st.st_uid,
                "gid": st.st_gid,
                "rdev": st.st_rdev,
                "rdev_major": os.major(st.st_rdev),
                "rdev_minor": os.minor(st.st_rdev),
                "size": st.st_size,
                "blocks": st.st_blocks,
                "atime": ns_ts(st.st_atime_ns),
                "mtime": ns_ts(st.st_mtime_ns),
                "ctime": ns_ts(st.st_ctime_ns),
                "crtime": crtime,
                "subvol": dev_root[st.st_dev],
                "fsflags": fsflags(p, st),
                # STATX_ATTR_MOUNT_ROOT (0x2000) describes the mount, not the fs
                "statx_attributes": None if sx_attrs is None else sx_attrs & ~0x2000,
            }
            if stat.S_ISREG(st.st_mode):
                e["sha256"] = sha256_file(p)
                e["fiemap"] = fiemap(p)
            if stat.S_ISLNK(st.st_mode):
                e["target_hex"] = os.fsencode(os.readlink(p)).hex()
            e["xattrs"] = xattrs(p)
            entries.append(e)

    entries.sort(key=lambda e: os.fsencode(e["path"]))

    # `btrfs filesystem du -s` of the top, every top-level directory, and every
    # subvolume root (what deleting it would free is about these).
    du = {}
    for e in entries:
        p = e["path"]
        if e["type"] != "dir" or e["ino"] == 2:
            continue
        if p == "/" or p.count("/") == 1 or e["ino"] == 256:
            du[p] = fi_du(os.path.join(mnt, p.lstrip("/")) if p != "/" else mnt)

    notes = []
    if args.notes and os.path.exists(args.notes):
        with open(args.notes) as f:
            notes = [l.rstrip("\n") for l in f if l.strip()]

    manifest = {
        "name": args.name,
        "kernel": platform.release(),
        "progs": progs,
        "mkfs": args.mkfs,
        "mount_opts": args.mount_opts,
        "devices": [d for d in args.devices.split(",") if d],
        "label": sup.get("label", ""),
        "fsid": sup.get("fsid"),
        "metadata_uuid": sup.get("metadata_uuid"),
        "nodesize": int(sup["nodesize"]),
        "sectorsize": int(sup["sectorsize"]),
        "csum_type": csum_name,
        "num_devices": int(sup["num_devices"]),
        "generation": int(sup["generation"]),
        "total_bytes": int(sup["total_bytes"]),
        "bytes_used": int(sup["bytes_used"]),
        "compat_flags": sup.get("compat_flags"),
        "compat_ro_flags": sup.get("compat_ro_flags"),
        "incompat_flags": sup.get("incompat_flags"),
        "subvolume_list": run(["btrfs", "subvolume", "list", mnt]),
        "subvolume_list_a": run(["btrfs", "subvolume", "list", "-a", mnt]),
        "notes": notes,
        "fi_du": du,
        "entries": entries,
    }
    # Pretty top level, one compact line per entry (keeps big manifests small
    # and diffs readable).
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write("{\n")
        for k, v in manifest.items():
            if k == "entries":
                continue
            f.write(" %s: %s,\n" % (json.dumps(k), json.dumps(v, ensure_ascii=False)))
        f.write(' "entries": [\n')
        for i, e in enumerate(entries):
            f.write("  " + json.dumps(e, ensure_ascii=False, separators=(",", ":")))
            f.write(",\n" if i + 1 < len(entries) else "\n")
        f.write(" ]\n}\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
