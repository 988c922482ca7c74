#!/bin/bash
# Issue 28 in the main trace on the GPU host (`gpu-trace --api`), real libcuda under PyTorch:
#   1. PyTorch under the HAMi-style LD_PRELOAD interposer (api/hami_like_shim.c), launched by
#      `gpu-trace --api --metrics … --format json -- python3 …`: the shim's own per-symbol counts
#      beside gpu-trace's final API_STATS and the last metrics scrape for the shim's copy; the
#      driver events that carry the API call they happened in.
#   2. `--api --api-calls --perfetto`: API_CALL lines per symbol against the final sums; every
#      driver event drawn on a thread track lies inside a slice of the call it names.
#   3. `-- sh -c 'python3 …; true'`: the shell's python child is traced (a target found among
#      the command's processes).
#   4. The seed's recursion on libcuda (api/recursive_cuinit_shim.c) in the main trace:
#      API_RECURSION lines, nothing malformed.
#   5. `top --api` in tmux while a PyTorch loop runs: the API/s column.
#   6. Cost: a launch-bound PyTorch loop (64x64 x + x, 100 000 steps) untraced and under
#      `gpu-trace --api -- python3 …`, interleaved, two rounds.
#
#   examples/gpu-host-api-main.sh BIN APIDIR OUT    (APIDIR: the built examples/api programs)
#   PARTS="5 6" examples/gpu-host-api-main.sh …       (only those parts)
#
# A run with --api leaves the kernel removing its probes in the background for up to half a
# minute (docs/api.md, Cost); the next run's probes go on only after that: parts 5 and 6 wait.
set -u
want() { [ -z "${PARTS:-}" ] || [[ " $PARTS " == *" $1 "* ]]; }
B=$1; A=$2; O=$3/api-main
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

W="$O/workload.py"
cat > "$W" <<'PY'
import os, sys, time, torch
x = torch.randn(64, 64, device="cuda"); a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
time.sleep(2)  # the rescan attaches the runtimes PyTorch dlopened at start (docs/api.md)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
for _ in range(n): y = x + x
for _ in range(n): z = a @ a
torch.cuda.synchronize()
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)  # metrics: the next read
print(f"pid={os.getpid()} done", flush=True)
PY

if want 1; then
echo "== 1. HAMi-style shim, --api --metrics $(date -u +%T)"
rm -f "$O/hami_counts.txt"
( while sleep 1; do curl -s -m 2 http://127.0.0.1:9490/metrics > "$O/scrape.tmp" && [ -s "$O/scrape.tmp" ] && mv "$O/scrape.tmp" "$O/scrape.txt"; done ) &
SCRAPER=$!
( export LD_PRELOAD="$A/hami_like_shim.so" HAMI_COUNTS="$O/hami_counts.txt"
  timeout -s INT 200 "$B" --api --metrics 127.0.0.1:9490 --format json -- python3 "$W" 1000 4 \
    > "$O/hami.jsonl" 2> "$O/hami.stderr" )
echo "gpu-trace exit $?"
kill $SCRAPER 2>/dev/null
grep -E "^gpu-trace: --api" "$O/hami.stderr"
cat "$O/hami_counts.txt"
python3 - "$O" > "$O/summary1.txt" <<'PY'
import json, re, sys, collections
o = sys.argv[1]
own = {}
for line in open(f"{o}/hami_counts.txt"):
    kv = dict(f.split("=", 1) for f in line.split())
    pid = int(kv.pop("pid"))
    own[pid] = {k: int(v) for k, v in kv.items()}
final = collections.defaultdict(dict)
events = collections.Counter(); tagged = collections.Counter(); malformed = None
for line in open(f"{o}/hami.jsonl"):
    if not line.startswith("{"): continue  # the command shares the standard output
    e = json.loads(line)
    if e.get("event") == "API_STATS":
        final[e["pid"]][(e["library"].rsplit("/", 1)[-1], e["symbol"])] = e["calls"]
    elif e.get("event") == "STATS" and e.get("final"):
        malformed = e.get("malformed")
    elif "api" in e:
        tagged[(e["event"], e["api"]["symbol"])] += 1
    if e.get("event") in ("TASK_INIT", "SCHEDULE", "WORK_SUBMIT", "TASK_DESTROY", "SCHED_UPDATE"):
        events[e["event"]] += 1
scrape = {}
for line in open(f"{o}/scrape.txt"):
    m = re.match(r'gpu_trace_api_calls_total\{(.*)\} (\S+)', line)
    if m:
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1)))
        scrape[(labels.get("library", ""), labels.get("symbol", ""))] = float(m.group(2))
print("driver events:", dict(events), " malformed:", malformed)
print("driver events inside an API call (event, innermost symbol):", dict(tagged))
for pid, counts in own.items():
    if pid not in final:
        print(f"pid {pid} (no API_STATS: gpu-trace itself, which the shim also loaded): {counts}")
        continue
    for sym, n in sorted(counts.items()):
        shim = final[pid].get(("hami_like_shim.so", sym), 0)
        met = scrape.get(("hami_like_shim.so", sym), 0)
        ok = "EQUAL" if shim == n == met else "DIFFERENT"
        lib = {k[0]: v for k, v in final[pid].items() if k[1] == sym and k[0] != "hami_like_shim.so"}
        print(f"pid {pid} {sym:22} shim's own {n:6}  API_STATS {shim:6}  metrics {met:8.0f}  {ok}  others {lib}")
PY
cat "$O/summary1.txt"
grep -E "^gpu_trace_api_call" "$O/scrape.txt" | head -20

fi
if want 2; then
echo "== 2. --api-calls --perfetto $(date -u +%T)"
timeout -s INT 200 "$B" --api --api-calls --format json --perfetto "$O/calls.perfetto.json" \
  -- python3 "$W" 200 > "$O/calls.jsonl" 2> "$O/calls.stderr"
echo "gpu-trace exit $?"
python3 - "$O" > "$O/summary2.txt" <<'PY'
import json, sys, collections
o = sys.argv[1]
lines = collections.Counter(); final = {}; recs = 0
for line in open(f"{o}/calls.jsonl"):
    if not line.startswith("{"): continue  # the command shares the standard output
    e = json.loads(line)
    if e.get("event") == "API_CALL":
        lines[(e["library"].rsplit("/", 1)[-1], e["symbol"])] += 1
    elif e.get("event") == "API_STATS":
        final[(e["library"].rsplit("/", 1)[-1], e["symbol"])] = e["calls"]
    elif e.get("event") == "STATS" and e.get("final"):
        print("final STATS: dropped", e["kernel"]["dropped"], "malformed", e["malformed"])
same = sum(1 for k in final if lines.get(k, 0) == final[k])
print(f"(library, symbol) rows: {len(final)}; API_CALL lines equal to the final sum in {same}")
for k in sorted(final, key=lambda k: -final[k])[:12]:
    print(f"  {k[0]:28} {k[1]:30} API_CALL lines {lines.get(k, 0):7}  API_STATS {final[k]:7}")
t = json.load(open(f"{o}/calls.perfetto.json"))
ev = t["traceEvents"] if isinstance(t, dict) else t
slices = collections.defaultdict(list)
for e in ev:
    if e.get("ph") == "X" and "library" in e.get("args", {}):
        slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
inside = outside = 0
for e in ev:
    a = e.get("args", {})
    if e.get("ph") == "i" and e.get("s") == "t" and isinstance(a.get("api"), dict):
        ts = e["ts"]; sym = a["api"]["symbol"]
        hit = [s for s in slices[(e["pid"], e["tid"])] if s[0] <= ts <= s[1]]
        innermost = min(hit, key=lambda s: s[1] - s[0]) if hit else None
        if innermost and innermost[2] == sym: inside += 1
        else: outside += 1
print(f"perfetto: {sum(len(v) for v in slices.values())} API slices; driver events on thread tracks inside the slice they name: {inside}, not: {outside}")
PY
cat "$O/summary2.txt"
python3 "$(dirname "$0")/perfetto_check.py" "$O/calls.perfetto.json" "$O/calls.jsonl" 2>&1 | tail -8

fi
if want 3; then
echo "== 3. -- sh -c 'python3 …; true' $(date -u +%T)"
timeout -s INT 200 "$B" --api --format json -- sh -c "python3 $W 100; true" > "$O/sh.jsonl" 2> "$O/sh.stderr"
echo "gpu-trace exit $?"
python3 - "$O" <<'PY' | tee "$O/summary3.txt"
import json, sys, collections
c = collections.Counter()
for line in open(f"{sys.argv[1]}/sh.jsonl"):
    if not line.startswith("{"): continue  # the command shares the standard output
    e = json.loads(line)
    if e.get("event") in ("TASK_INIT", "SCHEDULE", "WORK_SUBMIT"):
        c[(e["pid"], e["comm"], e["event"], "api" in e)] += 1
for k, v in sorted(c.items()): print("pid %s %-16s %-12s with api=%s: %d" % (*k, v))
PY

fi
if want 4; then
echo "== 4. recursion in the main trace $(date -u +%T)"
( export LD_PRELOAD="$A/recursive_cuinit_shim.so"
  timeout -s INT 60 "$B" --api --format json -- "$A/cuinit_client" > "$O/recursion.jsonl" 2> "$O/recursion.stderr" )
echo "gpu-trace exit $?"
grep -E '"event":"API_RECURSION"' "$O/recursion.jsonl" | cut -c1-400
grep -E '"event":"STATS"' "$O/recursion.jsonl" | grep -o '"malformed":[0-9]*'

fi
if want 5; then
echo "== 5. top --api $(date -u +%T)"
want 4 && sleep 60  # parts 3 and 4's probe removals (none when run alone)
python3 "$W" 3000000 0 > /dev/null 2>&1 &
WL=$!
sleep 6
tmux new-session -d -s apitop -x 160 -y 30 "$B top --api --comm python3"
sleep 30  # attaching ~200 probes to a running PyTorch process takes about 10 s here
tmux capture-pane -p -t apitop > "$O/top-screen.txt"
tmux kill-session -t apitop 2>/dev/null
kill $WL 2>/dev/null; wait $WL 2>/dev/null
cat "$O/top-screen.txt"

fi
if want 6; then
echo "== 6. cost of --api on a launch-bound loop $(date -u +%T)"
C="$O/cost.py"
cat > "$C" <<'PY'
import sys, time, torch
x = torch.randn(64, 64, device="cuda")
for _ in range(2000): y = x + x
torch.cuda.synchronize()
time.sleep(10)  # the rescan attaches libcuda and libcudart before the timed loop
n = 100000; t = time.perf_counter()
for _ in range(n): y = x + x
torch.cuda.synchronize()
print(f"us_per_step={(time.perf_counter() - t) / n * 1e6:.2f}", flush=True)
PY
for round in 1 2; do
  echo "round $round untraced: $(python3 "$C")"
  echo "round $round --api:    $(timeout -s INT 120 "$B" --api --no-stats -q -- python3 "$C" 2>"$O/cost$round.stderr" | grep us_per_step)"
  grep -h "uprobes attached" "$O/cost$round.stderr"; grep -c "cannot probe" "$O/cost$round.stderr"
  sleep 45  # the previous run's probes are removed in the background
done
fi
date -u
