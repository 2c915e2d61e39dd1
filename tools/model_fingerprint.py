#!/usr/bin/env python3
"""Model fingerprints of a checkpoint directory, computed from their description in
docs/coli-kv.md ("Model fingerprint") with nothing but the Python standard library.

An implementation independent of model/fingerprint.cc: the golden values that
model/fingerprint_test.cc pins for committed fixtures come from this script.

Usage: python3 tools/model_fingerprint.py DIR [DIR ...]
Prints, per directory: version 2 (sampled), the model digest (every byte) and version 1.
"""

import json
import os
import struct
import sys

MASK = (1 << 64) - 1
MUL1 = 0x87C37B91114253D5
MUL2 = 0x4CF5AD432745937F
FULL_TENSOR_BYTES = 32 * 1024
WINDOW_BYTES = 4 * 1024
WINDOWS = 8


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK


class Fingerprint64:
    """The streaming hash: 8-byte little-endian words, tail and length, splitmix64 finaliser."""

    def __init__(self):
        self.h = 0x9E3779B97F4A7C15
        self.total = 0
        self.pending = b""

    def _word(self, w):
        self.h ^= (rotl((w * MUL1) & MASK, 31) * MUL2) & MASK
        self.h = (rotl(self.h, 27) * 5 + 0x52DCE729) & MASK

    def update(self, data):
        self.total += len(data)
        buf = self.pending + bytes(data)
        whole = len(buf) - len(buf) % 8
        for (w,) in struct.iter_unpack("<Q", buf[:whole]):
            self._word(w)
        self.pending = buf[whole:]

    def update_field(self, data):
        self.update(struct.pack("<Q", len(data)))
        self.update(data)

    def finish(self):
        h = self.h
        t = int.from_bytes(self.pending, "little")
        h ^= (rotl((t * MUL1) & MASK, 31) * MUL2) & MASK
        h ^= self.total & MASK
        h ^= h >> 30
        h = (h * 0xBF58476D1CE4E5B9) & MASK
        h ^= h >> 27
        h = (h * 0x94D049BB133111EB) & MASK
        h ^= h >> 31
        return h


def shards(model_dir):
    """(file name, header bytes, data start, {tensor: (begin, end)}) per shard, by file name;
    and the tensor -> shard map (the index's weight_map when there is one)."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        names = sorted(set(weight_map.values()))
    else:
        names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors") and not n.startswith("."))
        weight_map = None
    out = []
    owner = {}
    for name in names:
        with open(os.path.join(model_dir, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = f.read(n)
        entries = {k: tuple(v["data_offsets"]) for k, v in json.loads(header).items() if k != "__metadata__"}
        out.append((name, header, 8 + n, entries))
        for tensor in entries:
            if weight_map is None or weight_map.get(tensor) == name:
                owner[tensor] = name
    return out, owner


def tensor_bytes(model_dir, shard, tensor):
    name, _, start, entries = shard
    begin, end = entries[tensor]
    with open(os.path.join(model_dir, name), "rb") as f:
        f.seek(start + begin)
        return f.read(end - begin)


def sample(data, full):
    fp = Fingerprint64()
    n = len(data)
    if full or n <= FULL_TENSOR_BYTES:
        fp.update_field(data)
    else:
        for i in range(WINDOWS):
            at = i * (n - WINDOW_BYTES) // (WINDOWS - 1)
            fp.update_field(data[at:at + WINDOW_BYTES])
    return fp.finish()


def every_tensor(model_dir, full):
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        config = f.read()
    shard_list, owner = shards(model_dir)
    by_name = {s[0]: s for s in shard_list}
    fp = Fingerprint64()
    fp.update_field(b"strata model digest v2" if full else b"strata model fingerprint v2")
    fp.update_field(config)
    for s in shard_list:
        fp.update_field(s[1])
    for tensor in sorted(owner, key=lambda t: t.encode()):
        fp.update_field(tensor.encode())
        fp.update_field(struct.pack("<Q", sample(tensor_bytes(model_dir, by_name[owner[tensor]], tensor), full)))
    return fp.finish()


def legacy(model_dir):
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        config = f.read()
    shard_list, owner = shards(model_dir)
    by_name = {s[0]: s for s in shard_list}
    fp = Fingerprint64()
    fp.update_field(config)
    for s in shard_list:
        fp.update_field(s[1])
    for tensor in ("model.embed_tokens.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"):
        fp.update_field(tensor_bytes(model_dir, by_name[owner[tensor]], tensor))
    return fp.finish()


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for d in sys.argv[1:]:
        print(f"{d}: v2 {every_tensor(d, False):016x} digest {every_tensor(d, True):016x} v1 {legacy(d):016x}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
