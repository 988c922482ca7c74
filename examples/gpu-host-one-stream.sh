#!/bin/bash
# Issue 38 on the GPU host: the main trace's outputs as one fan-out (the lines, --perfetto and
# --metrics added by the caller, NVML share samples through the same Sink path) on a real
# PyTorch workload: text -v with a GPU_SHARE line per NVML sample, the Perfetto timeline with
# its share counter track, the metrics scraped while the job runs, and the JSON run's
# GPU_SHARE/GPU_SHARE_STATS lines.
#   examples/gpu-host-one-stream.sh BIN OUT
set -u
B=$1; O=$2/one-stream
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L
cat > "$O/mm.py" <<'PY'
import time, torch
x = torch.randn(4096, 4096, device="cuda")
t = time.time()
while time.time() - t < 6:
    y = x @ x
torch.cuda.synchronize()
print("done", flush=True)
PY
scrape() {  # the metrics while the job runs: the first scrape that has the share gauge
  python3 - "$1" <<'PY'
import sys, time, urllib.request
for _ in range(120):
    try:
        body = urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=1).read().decode()
        if "gpu_trace_gpu_share" in body:
            open(sys.argv[1], "w").write(body); print("scraped"); break
    except OSError:
        pass
    time.sleep(0.1)
PY
}
echo "== text -v, --perfetto, --metrics $(date -u +%T)"
"$B" -v --perfetto "$O/trace.json" --metrics 127.0.0.1:9464 -- python3 "$O/mm.py" > "$O/text.txt" 2> "$O/text.stderr" &
P=$!
scrape "$O/metrics.txt"
wait $P; echo "exit $?"
python3 - "$O" "$P" <<'PY'
import collections, json, re, sys
o, tracer = sys.argv[1], sys.argv[2]
own = [l for l in open(o + "/text.txt") if re.search(rf"PID={tracer}\b", l)]
print(f"lines of gpu-trace's own process (pid {tracer}): {len(own)}", *own[:3])
print("own_process in the statistics:", [l.strip() for l in open(o + "/text.txt") if "own_process" in l])
kinds = collections.Counter()
sm = []
for l in open(o + "/text.txt"):
    m = re.match(r"\S+ \[CPU..\] (\S+)", l)
    if m: kinds[m.group(1)] += 1
    m = re.search(r"GPU_SHARE .* sm=(\d+)%", l)
    if m: sm.append(int(m.group(1)))
print("text lines by kind:", dict(kinds))
print("GPU_SHARE lines:", len(sm), "mean sm %:", round(sum(sm) / max(len(sm), 1), 1))
print("statistics share lines:", [l.strip() for l in open(o + "/text.txt") if "share mean" in l])
t = json.load(open(o + "/trace.json"))
ev = t["traceEvents"] if isinstance(t, dict) else t
share = [e for e in ev if e.get("ph") == "C" and "share" in e.get("name", "").lower()]
print("perfetto events:", len(ev), "share counter points:", len(share))
m = [l for l in open(o + "/metrics.txt") if l.startswith(("gpu_trace_gpu_share", "gpu_trace_events_total"))]
print("metrics (mid-run):", len(m), "series;", *m[:6], sep="\n  ")
PY
echo "== system-wide (no -- CMD, no --pid): gpu-trace's own NVML thread is never traced $(date -u +%T)"
"$B" -v --duration 12 > "$O/system.txt" 2> "$O/system.stderr" &
P=$!
grep -q "tracing NVIDIA" <(tail -f "$O/system.stderr" --pid=$P) 2>/dev/null
python3 "$O/mm.py" > /dev/null
wait $P; echo "exit $?"
python3 - "$O/system.txt" "$P" <<'PY'
import collections, re, sys
path, tracer = sys.argv[1], sys.argv[2]
lines = open(path).read().splitlines()
kinds = collections.Counter(m.group(1) for l in lines if (m := re.match(r"\S+ \[CPU..\] (\S+)", l)))
print("lines by kind:", dict(kinds))
own = [l for l in lines if re.search(rf"PID={tracer}\b", l)]
print(f"lines of gpu-trace's own process (pid {tracer}): {len(own)}", *own[:3], sep="\n  ")
print("own_process in the statistics:", [l.strip() for l in lines if "own_process" in l])
PY
echo "== JSON $(date -u +%T)"
"$B" --format json -- python3 "$O/mm.py" > "$O/json.jsonl" 2> "$O/json.stderr"; echo "exit $?"
python3 - "$O/json.jsonl" <<'PY'
import collections, json, sys
k = collections.Counter()
for l in open(sys.argv[1]):
    try: k[json.loads(l)["event"]] += 1
    except (ValueError, KeyError): pass
print("JSON lines by kind:", dict(k))
PY
date -u
