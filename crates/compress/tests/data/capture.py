#!/usr/bin/env python3
"""Regenerate the kernel-written fixtures in this directory.

Needs root, a kernel with btrfs, btrfs-progs and free loop devices. For each
of lzo, zlib and zstd it makes a small btrfs image, mounts it with
compress-force=ALG, writes a few deterministic files, unmounts, finds their
EXTENT_DATA items with `btrfs inspect-internal dump-tree`, and copies the
raw bytes of the compressed extents (regular: disk_num_bytes at disk_bytenr;
inline: the inline payload inside the leaf) into NAME.bin. manifest.txt
lists, per fixture: name, kind, ram_bytes, length of the file data covered,
sha256 of that data.

For lzo it also writes many files and keeps one extent in which a segment
header had to be moved to the next sector (the 1..3 zero-padding case).
"""
import hashlib
import os
import random
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MNT = "/mnt/ubtrfs-compress-capture"
IMG = "/tmp/ubtrfs-compress-capture.img"
SECTOR = 4096
MAX_FIXTURE = 64 * 1024


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def words_text(seed, n):
    r = random.Random(seed)
    w = ["alpha", "beta", "gamma", "delta", "btrfs", "extent", "sector", "kernel",
         "zstd", "lzo", "zlib", "the", "a", "of", "and", "segment", "padding"]
    out = []
    size = 0
    while size < n:
        s = r.choice(w)
        out.append(s)
        size += len(s) + 1
    return (" ".join(out))[:n].encode()


def mixed_data(seed, n):
    """Moderately compressible bytes: words plus random numbers."""
    r = random.Random(seed)
    vocab = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9)))
             for _ in range(200)]
    out = bytearray()
    while len(out) < n:
        if r.random() < 0.1:
            out += str(r.getrandbits(40)).encode()
        else:
            out += r.choice(vocab).encode()
        out += b" "
    return bytes(out[:n])


def physical(logical):
    """Map a logical address with the chunk tree (first stripe)."""
    out = run("btrfs", "inspect-internal", "dump-tree", "-t", "chunk", IMG)
    chunk = None
    for line in out.splitlines():
        m = re.search(r"key \(FIRST_CHUNK_TREE CHUNK_ITEM (\d+)\)", line)
        if m:
            chunk = {"start": int(m.group(1))}
            continue
        m = re.search(r"^\s*length (\d+) owner", line)
        if m and chunk is not None:
            chunk["length"] = int(m.group(1))
            continue
        m = re.search(r"stripe 0 devid \d+ offset (\d+)", line)
        if m and chunk is not None and "length" in chunk:
            if chunk["start"] <= logical < chunk["start"] + chunk["length"]:
                return int(m.group(1)) + logical - chunk["start"]
            chunk = None
    sys.exit("cannot map logical %d" % logical)


def read_at(off, n):
    with open(IMG, "rb") as f:
        f.seek(off)
        return f.read(n)


def parse_fs_tree():
    """Return {name: [extent dicts]} for files in the top-level subvolume."""
    out = run("btrfs", "inspect-internal", "dump-tree", "-t", "5", IMG)
    names = {}
    extents = {}
    leaf = None
    cur = None
    for line in out.splitlines():
        m = re.match(r"\s*leaf (\d+) items", line)
        if m:
            leaf = int(m.group(1))
            continue
        m = re.match(r"\s*item \d+ key \((\d+) (\w+) (\d+)\) itemoff (\d+) itemsize (\d+)", line)
        if m:
            ino, typ, off, ioff, isz = m.groups()
            cur = {"ino": int(ino), "type": typ, "key_off": int(off), "leaf": leaf,
                   "itemoff": int(ioff), "itemsize": int(isz)}
            if typ == "EXTENT_DATA":
                extents.setdefault(int(ino), []).append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"index \d+ namelen \d+ name: (\S+)", line)
        if m and cur["type"] == "INODE_REF":
            names[m.group(1)] = cur["ino"]
        m = re.search(r"inline extent data size (\d+) ram_bytes (\d+) compression (\d+)", line)
        if m:
            cur.update(kind="inline", size=int(m.group(1)), ram=int(m.group(2)),
                       comp=int(m.group(3)))
        m = re.search(r"extent data disk byte (\d+) nr (\d+)", line)
        if m:
            cur.update(kind="regular", disk=int(m.group(1)), disk_nr=int(m.group(2)))
        m = re.search(r"extent data offset (\d+) nr (\d+) ram (\d+)", line)
        if m:
            cur.update(offset=int(m.group(1)), nr=int(m.group(2)), ram=int(m.group(3)))
        m = re.search(r"extent compression (\d+)", line)
        if m:
            cur.update(comp=int(m.group(1)))
    return {n: extents.get(i, []) for n, i in names.items()}


def extent_bytes(e):
    if e["kind"] == "inline":
        # Leaf header is 101 bytes; the file extent item's fixed part is 21.
        start = physical(e["leaf"]) + 101 + e["itemoff"] + 21
        return read_at(start, e["itemsize"] - 21)
    return read_at(physical(e["disk"]), e["disk_nr"])


def lzo_has_padding(buf):
    total = int.from_bytes(buf[:4], "little")
    cur = 4
    while cur < total and cur + 4 <= len(buf):
        seg = int.from_bytes(buf[cur:cur + 4], "little")
        cur += 4 + seg
        left = SECTOR - cur % SECTOR
        if 0 < left < 4 and cur < total:
            return True
        if left < 4:
            cur += left
    return False


def main():
    os.makedirs(MNT, exist_ok=True)
    manifest = []
    for alg in ["lzo", "zlib", "zstd"]:
        run("truncate", "-s", "0", IMG)
        run("truncate", "-s", "512M", IMG)
        run("mkfs.btrfs", "-f", "-q", "-s", str(SECTOR), IMG)
        run("mount", "-o", "loop,compress-force=" + alg, IMG, MNT)
        files = {
            "small.txt": words_text(1, 1500),
            "text.txt": words_text(2, 20000),
        }
        if alg == "lzo":
            for i in range(600):
                files["mix%03d.bin" % i] = mixed_data(100 + i, 36 * 1024 + 123 * i % 4096)
        try:
            for name, data in files.items():
                with open(os.path.join(MNT, name), "wb") as f:
                    f.write(data)
            run("sync")
        finally:
            run("umount", MNT)
        tree = parse_fs_tree()
        picks = [("small.txt", alg + "_inline"), ("text.txt", alg + "_regular")]
        if alg == "lzo":
            cands = 0
            for name in sorted(n for n in tree if n.startswith("mix")):
                exts = tree[name]
                if len(exts) != 1 or exts[0].get("kind") != "regular" or exts[0].get("comp") != 2:
                    continue
                cands += 1
                if exts[0]["disk_nr"] <= MAX_FIXTURE and lzo_has_padding(extent_bytes(exts[0])):
                    picks.append((name, "lzo_padded"))
                    break
            else:
                print("warning: no lzo extent with segment padding among %d" % cands,
                      file=sys.stderr)
        for name, fixture in picks:
            (e,) = tree[name]
            raw = extent_bytes(e)
            assert len(raw) <= MAX_FIXTURE
            data = files[name]
            covered = data[e.get("offset", 0):e.get("offset", 0) + e["ram"]]
            with open(os.path.join(HERE, fixture + ".bin"), "wb") as f:
                f.write(raw)
            manifest.append("%s %s %d %d %s" % (fixture, e["kind"], e["ram"], len(covered),
                                                hashlib.sha256(covered).hexdigest()))
            print(fixture, e)
    os.remove(IMG)
    with open(os.path.join(HERE, "manifest.txt"), "w") as f:
        f.write("# name kind ram_bytes data_len sha256(data) -- see capture.py\n")
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
