#!/bin/bash
# gpu-trace top on the GPU host with a PyTorch job, screen captured with tmux.
B=$1; OUT=$2; mkdir -p $OUT
command -v tmux || { echo "no tmux"; exit 0; }
tmux new-session -d -s top -x 180 -y 30 "$B top; echo EXIT=\$? > $OUT/top.exit; sleep 30"
sleep 3
python3 - > $OUT/job.log 2>&1 <<'PY' &
import torch, time
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
x = torch.randn(4096, 4096, device="cuda")
t0 = time.time()
while time.time() - t0 < 8:
    with torch.cuda.stream(s1):
        y = x @ x
    with torch.cuda.stream(s2):
        z = x @ x
torch.cuda.synchronize()
print("done")
PY
JOB=$!
sleep 5
tmux capture-pane -p -t top > $OUT/screen-during.txt
wait $JOB
sleep 2
tmux capture-pane -p -t top > $OUT/screen-after.txt
tmux send-keys -t top s; sleep 1.5
tmux capture-pane -p -t top > $OUT/screen-sorted.txt
tmux send-keys -t top q; sleep 2
cat $OUT/top.exit
tmux capture-pane -p -t top > $OUT/screen-quit.txt
tmux kill-server
