#!/usr/bin/env python3
"""Writes the seed inputs of kvstore/fuzz/coli_kv3_reader_fuzz: small `.coli_kv` v3 files
assembled from the byte layout of docs/coli-kv.md ("Version 3") alone — not from the C++
code, so the fuzzer's replay of them also checks that the reader accepts files written from
the spec.

Usage: tools/make_coli_kv3_corpus.py [OUT_DIR]   (default kvstore/fuzz/corpus/coli_kv3_reader)
"""

import os
import struct
import sys


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def roundup(x, a):
    return (x + a - 1) // a * a


def sealed(body):
    return body + struct.pack("<I", crc32c(body))


class Layout:
    """d, dr, di, W, vocab, fmt (0 f32, 1 fp8) and [(kind, rate)] per layer (0 sliding, 1 CSA, 2 HCA)."""

    def __init__(self, d, dr, di, w, vocab, fmt, layers):
        self.d, self.dr, self.di, self.w, self.vocab, self.fmt, self.layers = d, dr, di, w, vocab, fmt, layers
        nope = d - dr
        self.row = 4 * d if fmt == 0 else roundup(nope + 2 * dr + (nope + 63) // 64, 8)
        self.live = w - 1
        self.token = 12
        self.block = []
        for kind, m in layers:
            if w > 1:
                self.token += self.row
            if kind == 1:
                self.token += 16 * d + 16 * di
                self.live = max(self.live, 2 * m - 1)
                self.block.append(12 + self.row + 4 * di)
            elif kind == 2:
                self.token += 8 * d
                self.live = max(self.live, m - 1)
                self.block.append(12 + self.row)
            else:
                self.block.append(0)
        self.header_bytes = 44 + 8 * len(layers)
        self.commit_bytes = 32 + 4 * self.live
        self.ring = roundup(self.header_bytes, 4096) + 2 * roundup(self.commit_bytes, 4096)
        self.log = self.ring + 2 * self.live * self.token

    def header(self):
        h = b"COLIKV3\0" + struct.pack("<8i", 2, len(self.layers), self.d, self.dr, self.di, self.w, self.vocab,
                                       self.fmt)
        for kind, m in self.layers:
            h += struct.pack("<2i", kind, m)
        return sealed(h)

    def closes(self, t0, t1):
        return [(l, c // m - 1) for c in range(t0 + 1, t1 + 1) for l, (_, m) in enumerate(self.layers)
                if m and c % m == 0]

    def log_bytes(self, t):
        return sum(self.block[l] for l, _ in self.closes(0, t))

    def commit(self, seq, t, slots):
        body = struct.pack("<QQQi", seq, t, self.log_bytes(t), len(slots))
        body += b"".join(struct.pack("<i", s) for s in slots) + struct.pack("<i", -1) * (self.live - len(slots))
        return sealed(body)

    def token_record(self, p, tok):
        payload = bytes((p * 7 + i) % 251 for i in range(self.token - 12))
        return sealed(struct.pack("<2i", p, tok) + payload)

    def block_record(self, l, w):
        return sealed(struct.pack("<2i", l, w) + bytes((w + i) % 13 for i in range(self.block[l] - 12)))


def build(lay, t, seq=2, older=None):
    """A file committing t tokens, their live records in slots 0..n-1, `older` = (seq, t, slots)."""
    buf = bytearray(lay.log + lay.log_bytes(t))
    h = lay.header()
    buf[0:len(h)] = h
    n = min(t, lay.live)
    slots = list(range(n))
    c0 = roundup(lay.header_bytes, 4096)
    c1 = c0 + roundup(lay.commit_bytes, 4096)
    cur, other = (c1, c0) if seq % 2 == 0 else (c0, c1)
    buf[cur:cur + lay.commit_bytes] = lay.commit(seq, t, slots)
    if older is not None:
        buf[other:other + lay.commit_bytes] = lay.commit(*older)
    for i, s in enumerate(slots):
        off = lay.ring + s * lay.token
        buf[off:off + lay.token] = lay.token_record(t - n + i, (t - n + i) % lay.vocab)
    at = lay.log
    for l, w in lay.closes(0, t):
        r = lay.block_record(l, w)
        buf[at:at + len(r)] = r
        at += len(r)
    return bytes(buf)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "kvstore/fuzz/corpus/coli_kv3_reader"
    os.makedirs(out, exist_ok=True)
    small = Layout(4, 2, 2, 3, 50, 0, [(1, 2), (2, 3), (0, 0)])
    fp8 = Layout(8, 2, 1, 2, 9, 1, [(2, 2), (1, 1)])
    files = {
        "v3_empty": build(small, 0, seq=1),
        "v3_five_tokens": build(small, 5, seq=3, older=(2, 2, [3, 4])),
        "v3_fp8_four_tokens": build(fp8, 4, seq=2),
        "v3_no_ring": build(Layout(3, 0, 0, 1, 5, 0, [(0, 0)]), 0, seq=1),
    }
    c0 = roundup(small.header_bytes, 4096)
    c1 = c0 + roundup(small.commit_bytes, 4096)
    torn = bytearray(files["v3_five_tokens"])
    torn[c1 + 10] ^= 0xFF  # the older commit record damaged: the newer is current
    files["v3_older_commit_torn"] = bytes(torn)
    torn = bytearray(files["v3_five_tokens"])
    torn[c0 + 10] ^= 0xFF  # the newer damaged: the older is current, its slots hold nothing
    files["v3_newer_commit_torn"] = bytes(torn)
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
