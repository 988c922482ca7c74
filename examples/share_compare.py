#!/usr/bin/env python3
"""Side by side: per-process GPU shares from gpu-trace's JSON (GPU_SHARE lines, GPU_SHARE_STATS)
and `nvidia-smi pmon -s u -o T` of the same run (examples/gpu-host-share.sh).

    python3 share_compare.py DIR     (DIR holds trace.jsonl, pmon.txt, workloads.log)

Per second (the host's local time, as pmon prints it) and over the run: gpu-trace's share (the
SM-weighted fraction of NVML's sampling points naming the process in that second) against
pmon's `sm` column for the process ("-" read as 0).
"""
import collections, datetime, json, sys

d = sys.argv[1]
# The workloads print their own pid (the pids file holds the `timeout` wrappers' pids).
pids = [int(l.split()[0].split("=")[1]) for l in open(f"{d}/workloads.log") if l.startswith("pid=")]
samples, stats = [], None
for line in open(f"{d}/trace.jsonl"):
    try:
        v = json.loads(line)
    except ValueError:
        continue
    if v.get("event") == "GPU_SHARE":
        samples.append(v)
    elif v.get("event") == "GPU_SHARE_STATS":
        stats = v

# gpu-trace per second: points = distinct sample timestamps in that second (GPU 0).
def second(ts_us):
    return datetime.datetime.fromtimestamp(ts_us / 1e6).strftime("%H:%M:%S")

points = collections.defaultdict(set)
sm = collections.defaultdict(float)
for s in samples:
    if s["gpu"] != 0:
        continue
    k = second(s["ts_us"])
    points[k].add(s["ts_us"])
    sm[(k, s["pid"])] += min(s["sm"], 100)

pmon = {}
for line in open(f"{d}/pmon.txt"):
    f = line.split()
    if not f or f[0].startswith("#") or len(f) < 5:
        continue
    try:
        t, gpu, pid = f[0], int(f[1]), int(f[2])
    except ValueError:
        continue
    if gpu == 0:
        pmon[(t, pid)] = 0.0 if f[4] == "-" else float(f[4])

secs = sorted(set(points) | {t for t, _ in pmon})
print("per second (gpu-trace share % / pmon sm %), GPU 0")
print("time      " + "".join(f"  pid {p:<12}" for p in pids))
for t in secs:
    row = []
    for p in pids:
        n = len(points.get(t, ()))
        g = f"{sm.get((t, p), 0) / n:5.1f}" if n else "    -"
        m = pmon.get((t, p))
        row.append(f"  {g} / {'  -  ' if m is None else f'{m:5.1f}'}")
    print(t + "  " + "".join(row))

print("\nover the run")
print("pid      gpu-trace mean share   pmon mean sm (seconds it listed the pid)")
for p in pids:
    g = next((x for x in (stats or {}).get("processes", []) if x["pid"] == p and x["gpu"] == 0), None)
    m = [v for (t, q), v in pmon.items() if q == p]
    gs = f"{100 * g['share_mean']:5.1f} % ({g['samples']} of {g['points']} points)" if g else "  -  "
    ms = f"{sum(m) / len(m):5.1f} % ({len(m)} s)" if m else "  -  "
    print(f"{p:<8} {gs:<22} {ms}")
print("\nNote: the run mean of gpu-trace counts the whole sampled span (before the third process")
print("started and after the loops ended too); compare the per-second rows for the overlap.")
