#!/bin/bash
# Issue 29 on the GPU host: two competing PyTorch 4096² matmul loops (12 s) and a third started
# 4 s later (8 s), traced by gpu-trace with GPU-share sampling on (JSON + statistics + metrics +
# a recording, then a text replay and a `top` screen), with `nvidia-smi pmon -s u` in the same
# run, and a side-by-side summary of the per-process shares (examples/share_compare.py).
#
#   examples/gpu-host-share.sh [OUT]      (OUT defaults to $OUT; everything goes to OUT/share/)
#
# Self-contained: ./target/release/gpu-trace, python3 with torch, nvidia-smi on PATH. Bounded:
# every step runs under `timeout`; the whole script ends in well under 2 minutes.
set -u
B=./target/release/gpu-trace
O=${1:-${OUT:?give OUT}}/share
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
[ -x "$B" ] || { echo "no $B (cargo build --release first)"; exit 1; }
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi"; exit 1; }
python3 -c 'import torch; assert torch.cuda.is_available()' || { echo "no torch with CUDA"; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$O/gpu.txt"

LOOP="$(dirname "$0")/matmul_loop.py"

# gpu-trace first (it must see the processes start), with sampling every 0.2 s.
timeout -s INT 40 "$B" --format json -o "$O/trace.jsonl" --duration 24 --share-interval 0.2 \
    --metrics 127.0.0.1:9464 --perfetto "$O/trace.perfetto.json" --record "$O/share.gtrace" \
    2> "$O/trace.stderr" &
TRACER=$!
timeout 30 nvidia-smi pmon -s u -d 1 -o T > "$O/pmon.txt" 2>&1 &
PMON=$!
sleep 3
: > "$O/workloads.log"
timeout 40 python3 "$LOOP" 12 >> "$O/workloads.log" 2>&1 &
W1=$!
timeout 40 python3 "$LOOP" 12 >> "$O/workloads.log" 2>&1 &
W2=$!
echo "$W1 $W2" > "$O/pids"
sleep 4
timeout 40 python3 "$LOOP" 8 >> "$O/workloads.log" 2>&1 &
W3=$!
echo "$W3" >> "$O/pids"
sleep 6
curl -s --max-time 5 http://127.0.0.1:9464/metrics > "$O/metrics.txt" || echo "metrics scrape failed"
wait $W1 $W2 $W3
wait $TRACER; echo "gpu-trace exit $?"
kill $PMON 2>/dev/null; wait $PMON 2>/dev/null

# The statistics as text, from the recording (the same figures).
timeout 60 "$B" replay "$O/share.gtrace" > "$O/replay.txt" 2> "$O/replay.stderr"
echo "replay exit $?"

# A top screen while two loops compete (tmux, when present).
if command -v tmux >/dev/null; then
    tmux new-session -d -s share -x 200 -y 30 "timeout -s INT 20 $B top --share-interval 0.2; sleep 10"
    timeout 40 python3 "$LOOP" 10 > /dev/null 2>&1 &
    T1=$!
    timeout 40 python3 "$LOOP" 10 > /dev/null 2>&1 &
    T2=$!
    sleep 9
    tmux capture-pane -p -t share > "$O/top-screen.txt"
    wait $T1 $T2
    tmux kill-session -t share 2>/dev/null
fi

timeout 30 python3 "$(dirname "$0")/share_compare.py" "$O" | tee "$O/summary.txt"
date -u
