#!/usr/bin/env python3
"""Check that the Linux kernel reads what ubtrfs-compress writes.

Needs root and a kernel with btrfs encoded writes (5.18+). For each of lzo,
zlib and zstd: compress several inputs with `cargo run --example encode`,
store the bytes as-is with BTRFS_IOC_ENCODED_WRITE into a fresh btrfs image,
drop the page cache, read the files back through the kernel and compare.
Small inputs become compressed inline extents, larger ones regular extents.

Run from the workspace root:  python3 crates/compress/tests/data/kernel_accepts.py
"""
import ctypes
import fcntl
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

IMG = "/tmp/ubtrfs-compress-accepts.img"
MNT = "/mnt/ubtrfs-compress-accepts"
# BTRFS_ENCODED_IO_COMPRESSION_*
ENC = {"zlib": 1, "zstd": 2, "lzo": 3}  # lzo = LZO_4K
# _IOW(0x94, 64, struct btrfs_ioctl_encoded_io_args) with sizeof == 128
ENCODED_WRITE = (1 << 30) | (128 << 16) | (0x94 << 8) | 64


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, **kw).stdout


def inputs():
    r = random.Random(5)
    words = [("".join(r.choice("abcdefghij klmnop") for _ in range(r.randint(1, 12)))).encode()
             for _ in range(400)]

    def text(n):
        out = bytearray()
        while len(out) < n:
            out += r.choice(words) + b" "
            if r.random() < 0.05:
                out += str(r.getrandbits(30)).encode()
        return bytes(out[:n])

    yield "inline_small", text(700)
    yield "inline_1500", text(1500)
    yield "one_sector_plus", text(4097 + 3000)
    yield "text_20000", text(20000)
    yield "text_128k", text(128 * 1024)
    yield "zeros_64k", bytes(64 * 1024)
    yield "mixed_100k", text(50000) + bytes(r.getrandbits(8) for _ in range(20000)) + text(30000)
    yield "odd_len", text(77777)


def encoded_write(path, data, comp_bytes, comp):
    buf = ctypes.create_string_buffer(comp_bytes, len(comp_bytes))
    iov = struct.pack("QQ", ctypes.addressof(buf), len(comp_bytes))
    iov_buf = ctypes.create_string_buffer(iov, len(iov))
    args = struct.pack("QQqQQQQII64x", ctypes.addressof(iov_buf), 1, 0, 0,
                       len(data), len(data), 0, comp, 0)
    assert len(args) == 128
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fcntl.ioctl(fd, ENCODED_WRITE, bytearray(args))
    finally:
        os.close(fd)


def main():
    run("cargo", "build", "-q", "-p", "ubtrfs-compress", "--example", "encode")
    encode = os.path.join("target", "debug", "examples", "encode")
    os.makedirs(MNT, exist_ok=True)
    failures = 0
    checked = 0
    for alg in ["lzo", "zlib", "zstd"]:
        run("truncate", "-s", "0", IMG)
        run("truncate", "-s", "256M", IMG)
        run("mkfs.btrfs", "-f", "-q", IMG)
        run("mount", "-o", "loop", IMG, MNT)
        try:
            written = {}
            with tempfile.TemporaryDirectory() as tmp:
                for name, data in inputs():
                    src = os.path.join(tmp, name)
                    with open(src, "wb") as f:
                        f.write(data)
                    comp = run(encode, alg, src)
                    if len(comp) >= len(data):
                        print("%s %s: not compressible, skipped" % (alg, name))
                        continue
                    encoded_write(os.path.join(MNT, name), data, comp, ENC[alg])
                    written[name] = data
            run("sync")
            # Remount so that every read goes through the decompressor.
            run("umount", MNT)
            run("mount", "-o", "loop", IMG, MNT)
            for name, data in written.items():
                checked += 1
                try:
                    with open(os.path.join(MNT, name), "rb") as f:
                        got = f.read()
                except OSError as e:
                    print("FAIL %s %s: read error %s" % (alg, name, e))
                    failures += 1
                    continue
                if got != data:
                    print("FAIL %s %s: content differs (%d vs %d bytes)" % (alg, name, len(got),
                                                                          len(data)))
                    failures += 1
                else:
                    print("ok   %s %s" % (alg, name))
        finally:
            run("umount", MNT)
        tree = run("btrfs", "inspect-internal", "dump-tree", "-t", "5", IMG, text=True)
        kinds = re.findall(r"type \d \((inline|regular)\)", tree)
        print("%s: extent kinds %s" % (alg, sorted(set(kinds))))
    os.remove(IMG)
    print("%d checked, %d failed" % (checked, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
