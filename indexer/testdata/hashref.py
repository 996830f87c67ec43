#!/usr/bin/python3
"""Reference block hashes computed with python3-xxhash (the C reference XXH3).

Independent of prefixd's Go code. Reads JSON cases on stdin, one per line:
  {"tokens": [...], "block_size": N, "lora": "", "namespace": ""}
and writes one JSON line per case: {"seed": S, "local": [...], "seq": [...]}.
Used to generate testdata/hash_vectors.jsonl and by TestHashMatchesReference.
"""
import json
import struct
import sys

import xxhash

BASE = 1337
MASK = (1 << 64) - 1


def seed(lora, ns):
    s = BASE
    if lora:
        s = (s + xxhash.xxh3_64_intdigest(lora.encode(), seed=0)) & MASK
    if ns:
        s = (s + xxhash.xxh3_64_intdigest(ns.encode(), seed=1)) & MASK
    return s


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    c = json.loads(line)
    bs = c["block_size"]
    toks = c["tokens"]
    s = seed(c.get("lora", ""), c.get("namespace", ""))
    local = []
    if bs > 0:
        for i in range(len(toks) // bs):
            blk = toks[i * bs:(i + 1) * bs]
            local.append(xxhash.xxh3_64_intdigest(struct.pack("<%dI" % bs, *blk), seed=s))
    seq = []
    for i, h in enumerate(local):
        if i == 0:
            seq.append(h)
        else:
            seq.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", seq[-1], h), seed=BASE))
    print(json.dumps({"seed": s, "local": local, "seq": seq}))
    sys.stdout.flush()
