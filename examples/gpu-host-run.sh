#!/usr/bin/env bash
# What ran on the GPU host to produce the real outputs in README.md, docs/ and examples/:
#   bash examples/gpu-host-run.sh BIN OUTDIR
# BIN is a release build of gpu-trace; OUTDIR receives the outputs and recordings.
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
run_traced() { # name, gpu-trace args..., --, workload...
  local name=$1; shift; local targs=(); while [ "$1" != "--" ]; do targs+=("$1"); shift; done; shift
  "$BIN" "${targs[@]}" >"$OUT/$name.out" 2>"$OUT/$name.err" & local tp=$!
  sleep 1.5
  "$@" >>"$OUT/workloads.log" 2>&1
  sleep 1
  kill -INT $tp; wait $tp; echo "$name: gpu-trace exit $?" >>"$OUT/workloads.log"
}
{ uname -r; cat /proc/driver/nvidia/version; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } >"$OUT/host.txt" 2>&1
run_traced two_streams -v --record "$OUT/two_streams.gtrace" -- python3 examples/two_streams.py
run_traced two_streams_json -v --format json -- python3 examples/two_streams.py
run_traced ctx_churn -v --record "$OUT/ctx_churn.gtrace" -- env ROUNDS=3 python3 examples/ctx_churn.py
run_traced two_procs --comm python3 -- bash -c 'python3 examples/two_streams.py & python3 examples/two_streams.py; wait'
for hook in tp-btf tracepoint; do
  run_traced "hook_$hook" -v --syscall-hook $hook -- python3 examples/two_streams.py
done
