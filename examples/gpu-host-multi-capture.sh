#!/usr/bin/env bash
# Captures on a host with several GPUs (issue 18): which RM deviceId, device minor, PCI bus id,
# UUID and nvidia-smi index belong together, and recordings of work on each GPU.
#   bash examples/gpu-host-multi-capture.sh BIN OUTDIR
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. examples/run_traced.sh
{ uname -r; cat /proc/driver/nvidia/version
  nvidia-smi --query-gpu=index,uuid,pci.bus_id,name --format=csv
  nvidia-smi -q | grep -E 'Minor Number|Bus Id|GPU UUID' 
  for f in /proc/driver/nvidia/gpus/*/information; do echo "== $f"; cat "$f"; done
  ls -l /dev/nvidia*
  python3 -c 'import torch; [print(i, torch.cuda.get_device_properties(i)) for i in range(torch.cuda.device_count())]'
} >"$OUT/facts.txt" 2>&1
run_traced each -v --record "$OUT/each.gtrace" -- env MODE=each python3 examples/multi_gpu.py
run_traced gpu1_only -v --record "$OUT/gpu1_only.gtrace" -- env CUDA_VISIBLE_DEVICES=1 MODE=each python3 examples/multi_gpu.py
run_traced allreduce -v --record "$OUT/allreduce.gtrace" -- env MODE=allreduce python3 examples/multi_gpu.py
cat "$OUT/workloads.log"
