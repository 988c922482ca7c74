#!/usr/bin/env bash
# --metrics on the GPU host during a PyTorch job (docs/fleet.md):
#   bash examples/gpu-host-metrics.sh BIN OUTDIR
# BIN is a release build of gpu-trace (run as root). It traces with --metrics on a loopback port
# alongside the usual text output (-v -o) and a recording, runs examples/two_streams.py with the
# process kept alive a few seconds (LINGER), and saves scrapes of /metrics before, during (while
# the job's TSGs are alive) and after the job, plus a summary of the lines that matter.
#
# What must appear (two_streams on an H100/H200 makes one GR TSG and three copy-engine TSGs):
#   during.prom: gpu_trace_live_tasks{gpu="0",engine="GRAPHICS",comm="python3",...} 1
#                gpu_trace_live_tasks{gpu="0",engine="COPY",comm="python3",...} 3
#   after.prom:  gpu_trace_events_total{event="TASK_INIT",...,engine="GRAPHICS",comm="python3"} 1,
#                COPY 3; SCHEDULE 1 / 3; WORK_SUBMIT 8 / 12; TASK_DESTROY 1 / 3; live tasks 0;
#                gpu_trace_schedule_latency_seconds_count 1 (GRAPHICS) and 3 (COPY);
#                gpu_trace_dropped_records_total 0.
#   The counts must equal the statistics block at the end of run.txt (same run).
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
PORT=${PORT:-9464}
URL="http://127.0.0.1:$PORT/metrics"
cd "$(dirname "$0")/.."
log() { echo "$(date +%T.%N | cut -c1-12) $*" | tee -a "$OUT/metrics.log"; }
scrape() { curl -sS --max-time 5 "$URL" >"$OUT/$1.prom" 2>>"$OUT/metrics.log"; }

"$BIN" -v --metrics "127.0.0.1:$PORT" -o "$OUT/run.txt" --record "$OUT/metrics_run.gtrace" \
  2>"$OUT/run.err" & tp=$!
for _ in $(seq 1 60); do curl -s --max-time 1 "$URL" >/dev/null && break; sleep 0.5; done
log "tracer pid $tp, endpoint $(curl -s -o /dev/null -w '%{http_code} %{content_type}' "$URL")"
scrape before

LINGER=${LINGER:-8} python3 examples/two_streams.py >"$OUT/two_streams.out" 2>&1 & jp=$!
# During: poll until the job's TSGs are live (bounded: 120 × 0.5 s), keep that scrape.
for _ in $(seq 1 120); do
  scrape during
  grep -qE '^gpu_trace_live_tasks\{.*engine="COPY".*comm="python3".*\} [1-9]' "$OUT/during.prom" && break
  kill -0 $jp 2>/dev/null || break
  sleep 0.5
done
log "during scrape saved ($(grep -c '^gpu_trace_live_tasks{' "$OUT/during.prom") live-task series)"
wait $jp; log "job exit $?"
sleep 3   # two scrape intervals' worth: the exit's TASK_DESTROYs and the kernel counters
scrape after
kill -INT $tp; wait $tp; log "tracer exit $?"

{
  echo "== during: live TSGs by engine"
  grep -E '^gpu_trace_live_tasks\{' "$OUT/during.prom"
  echo "== after: non-zero events"
  grep -E '^gpu_trace_events_total\{' "$OUT/after.prom" | grep -v ' 0$'
  echo "== after: live tasks, refused, latency and lifetime counts"
  grep -E '^gpu_trace_(live_tasks|schedules_refused_total)\{' "$OUT/after.prom"
  grep -E '^gpu_trace_(schedule_latency|task_lifetime)_seconds_(count|sum)' "$OUT/after.prom"
  echo "== after: health"
  grep -E '^(gpu_trace_(dropped|read_failures|decode_errors|malformed|records|label_overflow)|process_)' "$OUT/after.prom"
  echo "== run.txt statistics (same run)"
  sed -n '/--- gpu-trace statistics/,$p' "$OUT/run.txt"
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
