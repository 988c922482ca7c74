#!/bin/bash
# Issue 29's last experiment on the GPU host: does a process's timeslice show in what it got?
# Three identical PyTorch 4096² matmul loops compete on GPU 0. The first starts under the
# driver's default compute time-slice policy, the second after `nvidia-smi compute-policy
# --set-timeslice` = long, the third after = short; the policy is put back to default at the end
# (also on interruption). gpu-trace traces them with share sampling: each process's SCHEDULE lines
# carry the timeslice the driver gave its TSGs, GPU_SHARE_STATS what each got while all ran.
#
#   examples/gpu-host-timeslice-share.sh [OUT]     (OUT defaults to $OUT; writes OUT/timeslice/)
#
# Needs root (compute-policy), ./target/release/gpu-trace, python3 with torch, nvidia-smi.
# If this driver has no compute-policy timeslice control, the script says so and stops.
set -u
B=./target/release/gpu-trace
O=${1:-${OUT:?give OUT}}/timeslice
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
[ -x "$B" ] || { echo "no $B"; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
nvidia-smi compute-policy -l 2>&1
set_ts() { # 0 default, 1 short, 2 medium, 3 long (nvidia-smi compute-policy --help)
    nvidia-smi compute-policy -i 0 --set-timeslice="$1" 2>&1 && nvidia-smi compute-policy -l 2>&1 | grep -E '^\|\s+0 '
}
trap 'set_ts 0 >/dev/null 2>&1' EXIT
if ! set_ts 3 > "$O/set.txt" || ! grep -qi long "$O/set.txt"; then
    echo "compute-policy --set-timeslice is refused here:"; cat "$O/set.txt"
    nvidia-smi compute-policy -h 2>&1 | head -40
    exit 0
fi
cat "$O/set.txt"; set_ts 0
LOOP="$(dirname "$0")/matmul_loop.py"
timeout -s INT 60 "$B" --format json -o "$O/trace.jsonl" --duration 30 --share-interval 0.2 \
    --record "$O/timeslice.gtrace" 2> "$O/trace.stderr" &
TRACER=$!
sleep 3
: > "$O/workloads.log"
set_ts 0; timeout 50 python3 "$LOOP" 20 policy=default >> "$O/workloads.log" 2>&1 &
W1=$!; sleep 3
set_ts 3; timeout 50 python3 "$LOOP" 17 policy=long >> "$O/workloads.log" 2>&1 &
W2=$!; sleep 3
set_ts 1; timeout 50 python3 "$LOOP" 14 policy=short >> "$O/workloads.log" 2>&1 &
W3=$!; sleep 3
set_ts 0
wait $W1 $W2 $W3
wait $TRACER; echo "gpu-trace exit $?"
timeout 60 "$B" replay "$O/timeslice.gtrace" > "$O/replay.txt" 2>&1
echo "replay exit $?"; rm -f "$O/timeslice.gtrace"
# Per process: the policy it started under, the timeslices its SCHEDULE lines carried and
# its SCHED_UPDATE changes (old->new), its
# share while all three ran (from the GPU_SHARE lines) and over the run (GPU_SHARE_STATS).
python3 - "$O" <<'PY' | tee "$O/summary.txt"
import collections, json, sys
d = sys.argv[1]
runs = {}
for l in open(f"{d}/workloads.log"):
    if l.startswith("pid="):
        f = dict(x.split("=", 1) for x in l.split())
        runs[int(f["pid"])] = f
ts = collections.defaultdict(collections.Counter)
samples, stats = [], None
for line in open(f"{d}/trace.jsonl"):
    try: v = json.loads(line)
    except ValueError: continue
    e = v.get("event")
    if e == "SCHEDULE" and v.get("pid") in runs:
        ts[v["pid"]][v.get("timeslice_us")] += 1
    elif e == "SCHED_UPDATE" and v.get("pid") in runs and v["change"].get("what") == "timeslice":
        c = v["change"]
        ts[v["pid"]][f'{c["old_us"]}->{c["new_us"]}'] += 1
    elif e == "GPU_SHARE" and v.get("gpu") == 0:
        samples.append(v)
    elif e == "GPU_SHARE_STATS":
        stats = v
# The window where all three had samples: from the third's first sample to the first's last.
first = {p: min((s["ts_us"] for s in samples if s["pid"] == p), default=None) for p in runs}
last = {p: max((s["ts_us"] for s in samples if s["pid"] == p), default=None) for p in runs}
if all(first.values()):
    lo, hi = max(first.values()), min(last.values())
    pts = {s["ts_us"] for s in samples if lo <= s["ts_us"] <= hi}
    sm = collections.Counter()
    for s in samples:
        if lo <= s["ts_us"] <= hi and s["pid"] in runs:
            sm[s["pid"]] += min(s["sm"], 100)
    print(f"all three running: {(hi - lo) / 1e6:.1f} s, {len(pts)} sampling points")
else:
    pts, sm = set(), collections.Counter()
    print("not every process had a sample")
byp = {p["pid"]: p for p in (stats or {}).get("processes", []) if p.get("gpu") == 0}
print(f"{'pid':>8} {'policy':8} {'timeslices (us: count)':34} {'share together':>14} {'share run':>9} matmuls")
for p, f in runs.items():
    t = ", ".join(f"{k}:{n}" for k, n in sorted(ts[p].items(), key=lambda x: str(x[0])))
    tog = f"{sm[p] / len(pts):.1f} %" if pts else "-"
    run = byp.get(p, {}).get("share_mean")
    run = f"{100 * run:.1f} %" if run is not None else "-"
    print(f"{p:>8} {f['policy']:8} {t:34} {tog:>14} {run:>9} {f['matmuls']}")
PY
date -u
