#!/usr/bin/env python3
"""Seed corpora for the fuzz targets from the real GPU-host recordings (gpu-trace/tests/fixtures):
corpus/record/ the recordings themselves, corpus/wire/ each of their records, corpus/pipeline/
each recording as the pipeline target's stream (u16 LE length, then the record)."""
import glob, hashlib, os, struct

here = os.path.dirname(os.path.abspath(__file__))
fixtures = sorted(glob.glob(os.path.join(here, "..", "gpu-trace", "tests", "fixtures", "**", "*.gtrace"), recursive=True))


def put(target, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


for path in fixtures:
    data = open(path, "rb").read()
    put("record", data)
    off = 16 + struct.unpack_from("<I", data, 12)[0]
    stream = b""
    while off + 4 <= len(data):
        n = struct.unpack_from("<I", data, off)[0]
        off += 4
        if n == 0:
            break
        rec = data[off:off + n]
        off += n
        put("wire", rec)
        stream += struct.pack("<H", len(rec)) + rec
    put("pipeline", stream)
print(len(fixtures), "recordings")
