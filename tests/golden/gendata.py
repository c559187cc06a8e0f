#!/usr/bin/env python3
"""Deterministic test-data generator for make-golden.sh (python3 stdlib only).

    gendata.py MODE SEED SIZE            -> writes SIZE bytes to stdout

MODE:
  random  incompressible bytes: SHAKE-256("golden:" + SEED) expanded to SIZE
  text    compressible ASCII prose: words chosen by SHAKE-256 nibbles
  blocks  "labelled blocks": every 4096-byte block carries SEED, its block
          number and 16 pseudo-random hex digits, padded with a repeating
          pattern.  Every block is distinct (so a reader that maps a stripe or
          extent to the wrong place gets a different sha256) but the data
          compresses extremely well with zstd, which keeps images small.

The output depends only on (MODE, SEED, SIZE), never on the Python version.
"""
import hashlib
import sys

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima "
    "mike november oscar papa quebec romeo sierra tango uniform victor whiskey "
    "xray yankee zulu btrfs extent inode chunk stripe mirror parity subvolume "
    "snapshot reflink checksum superblock transaction generation leaf node "
    "key item root tree device profile balance scrub compress inline hole "
    "prealloc orphan backref the of and to in is that for"
).split()


def stream(seed, n):
    return hashlib.shake_256(("golden:" + seed).encode()).digest(n)


def gen_random(seed, size, out):
    chunk = 1 << 20
    i = 0
    while size > 0:
        n = min(size, chunk)
        out.write(stream("%s/%d" % (seed, i), n))
        size -= n
        i += 1


def gen_text(seed, size, out):
    # 16 words, one per nibble: about 0.7 bits of entropy per character, so
    # btrfs' zlib/lzo/zstd compress it well but not trivially.
    words = WORDS[:16]
    buf = bytearray()
    i = 0
    while len(buf) < size:
        r = stream("%s/t%d" % (seed, i), 2048)
        i += 1
        col = 0
        for b in r:
            for w in (words[b >> 4], words[b & 15]):
                buf += w.encode()
                col += len(w) + 1
                if col > 70:
                    buf += b".\n"
                    col = 0
                else:
                    buf += b" "
    out.write(bytes(buf[:size]))


def gen_blocks(seed, size, out):
    nblocks = (size + 4095) // 4096
    written = 0
    for blk in range(nblocks):
        tag = stream("%s/b%d" % (seed, blk), 8).hex()
        head = ("[golden %s block %08d %s]\n" % (seed, blk, tag)).encode()
        pad = ("%s:%d " % (seed, blk % 7)).encode()
        body = head + pad * ((4096 - len(head)) // len(pad) + 1)
        body = body[:4095] + b"\n"
        n = min(4096, size - written)
        out.write(body[:n])
        written += n


def main():
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        sys.exit(2)
    mode, seed, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    out = sys.stdout.buffer
    {"random": gen_random, "text": gen_text, "blocks": gen_blocks}[mode](seed, size, out)
    out.flush()


if __name__ == "__main__":
    main()
