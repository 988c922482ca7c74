#!/bin/bash
# Round 14 on the GPU host, against the real driver, libcuda and PyTorch: what a run leaves out
# is served while it traces (`gpu_trace_unreported_total{reason}`), and equals the statistics at
# its end.
#   1. `gpu-trace --format json --metrics ADDR` (the whole system) beside `python3 held.py`:
#      PyTorch launches 500 kernels, then waits on a FIFO; meanwhile the metrics are scraped
#      until the tracer's own NVML thread's records (`own_process`) show, then the FIFO lets
#      PyTorch end and gpu-trace is stopped; the last scrape against the final JSON
#      statistics' `unreported`;
#   2. `-- python3 held.py` with `--api --api-sums 2`: PyTorch's calls the kernel's 2 sums cannot hold
#      (`api_uncounted`), scraped while tracing and in the final statistics;
#   (1. needs NVML, which the static musl build cannot load (docs/install.md): GLIBC_BIN, a
#   `cargo build --release` of the same tree, runs it.)
#   examples/gpu-host-round14.sh BIN OUT GLIBC_BIN
set -u
B=$1; O=$2/round14; BG=${3:-$1}
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L; ldd --version | head -1; "$BG" --version
cat > "$O/held.py" <<'PY'
import sys, torch
x = torch.randn(64, 64, device="cuda")
for _ in range(500): y = x + x
torch.cuda.synchronize()
print("launched; waiting for the FIFO", flush=True)
open(sys.argv[1]).read()
print("child done", flush=True)
PY
cat > "$O/scrape.py" <<'PY'
# Scrapes ADDR until REASON's series shows (at most 60 s), prints the unreported series, then
# writes the FIFO.
import sys, time, urllib.request
addr, reason, fifo, out = sys.argv[1:5]
want = 'gpu_trace_unreported_total{reason="%s"}' % reason
t0 = time.time(); body = ""; scrapes = 0
while time.time() - t0 < 60:
    try:
        body = urllib.request.urlopen("http://%s/metrics" % addr, timeout=5).read().decode()
        scrapes += 1
    except Exception:
        body = ""
    if any(l.startswith(want + " ") for l in body.splitlines()):
        break
    time.sleep(0.2)
lines = [l for l in body.splitlines() if l.startswith("gpu_trace_unreported_total")]
open(out, "w").write("\n".join(lines) + "\n")
print(f"  scraped {scrapes} times in {time.time() - t0:.1f} s; while tracing:")
for l in lines: print("   ", l)
open(fifo, "w").write("go\n")
PY
compare() {
python3 - "$1" "$2" <<'PY'
import json, re, sys
final = None
for l in open(sys.argv[1]):
    if l.startswith("{") and '"STATS"' in l: final = json.loads(l)
live = {}
for l in open(sys.argv[2]):
    m = re.match(r'gpu_trace_unreported_total\{reason="([a-z_]+)"\} (\S+)', l)
    if m: live[m.group(1)] = float(m.group(2))
end = final["unreported"] if final else None
print(f"  final JSON unreported: {end}")
for r, v in sorted(live.items()):
    e = (end or {}).get(r)
    print(f"  {r}: while tracing {v:.0f}, at the end {e} ({'ok: not above the end' if e is not None and v <= e else 'MISMATCH'})")
PY
}
# 1. The whole system traced (with `-- CMD` the kernel programs send only the command's
#    records, and gpu-trace's own never reach it); PyTorch started beside it.
echo "== 1. main trace --metrics (whole system), python3 held.py beside it (waiting for own_process) $(date -u +%T)"
rm -f "$O/fifo1"; mkfifo "$O/fifo1"
"$BG" --format json --metrics 127.0.0.1:9461 > "$O/main1.jsonl" 2> "$O/main1.stderr" &
tracer=$!
python3 "$O/held.py" "$O/fifo1" > "$O/py1.out" 2>&1 &
py=$!
python3 "$O/scrape.py" 127.0.0.1:9461 own_process "$O/fifo1" "$O/live1.txt"
wait $py; echo "  python exit $?: $(tr '\n' ' ' < "$O/py1.out")"
kill -INT $tracer; wait $tracer; echo "  gpu-trace exit $?"
grep -iE "warning" "$O/main1.stderr" | cut -c1-200 | sed 's/^/  stderr: /'
compare "$O/main1.jsonl" "$O/live1.txt"
# 2. `-- CMD` with --api and 2 sums.
echo "== 2. main trace --api --api-sums 2 --metrics -- python3 held.py (waiting for api_uncounted) $(date -u +%T)"
rm -f "$O/fifo2"; mkfifo "$O/fifo2"
"$B" --format json --api --api-sums 2 --metrics 127.0.0.1:9462 -- python3 "$O/held.py" "$O/fifo2" > "$O/main2.jsonl" 2> "$O/main2.stderr" &
tracer=$!
python3 "$O/scrape.py" 127.0.0.1:9462 api_uncounted "$O/fifo2" "$O/live2.txt"
wait $tracer; echo "  exit $?"
grep -E "child done|launched" "$O/main2.jsonl" | head -2 | sed 's/^/  stdout: /'
grep -iE "warning" "$O/main2.stderr" | cut -c1-200 | sed 's/^/  stderr: /'
compare "$O/main2.jsonl" "$O/live2.txt"
echo "== end $(date -u +%T)"
