#!/bin/bash
# gpu-trace top on the GPU host while two PyTorch 4096² matmul loops compete (issue 29: the GPU%
# column per process and SHARE% per GPU), screens captured with tmux during and after the loops.
#   examples/gpu-host-top-share.sh BIN OUT
B=$1; OUT=$2; mkdir -p "$OUT"
command -v tmux >/dev/null || { echo "no tmux"; exit 0; }
tmux new-session -d -s top -x 160 -y 32 "$B top 2> $OUT/top.stderr; echo EXIT=\$? > $OUT/top.exit; sleep 60"
LOOP="$(dirname "$0")/matmul_loop.py"
timeout 60 python3 "$LOOP" 15 >> "$OUT/workloads.log" 2>&1 &
timeout 60 python3 "$LOOP" 15 >> "$OUT/workloads.log" 2>&1 &
for t in 8 14 20; do
  sleep 6
  tmux capture-pane -p -t top > "$OUT/screen-${t}s.txt"
done
wait
sleep 2
tmux capture-pane -p -t top > "$OUT/screen-after.txt"
tmux send-keys -t top q; sleep 2
cat "$OUT/top.exit" 2>/dev/null
tmux kill-server
