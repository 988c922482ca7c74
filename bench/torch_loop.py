#!/usr/bin/env python3
"""PyTorch start-up + matmul loop, for bench/gpu-host-bench.py (end-to-end cost of tracing).

    MATMULS=200 python3 bench/torch_loop.py

Prints one line: import, CUDA initialisation (context, first allocation), the matmul loop and the
total, in seconds, measured from before `import torch` to the last synchronize.
"""
import os
import time

t0 = time.perf_counter()
import torch  # noqa: E402  (timed on purpose)

t1 = time.perf_counter()
torch.cuda.init()
x = torch.randn(2048, 2048, device="cuda")
torch.cuda.synchronize()
t2 = time.perf_counter()
n = int(os.environ.get("MATMULS", "200"))
for _ in range(n):
    y = x @ x
torch.cuda.synchronize()
t3 = time.perf_counter()
print(
    f"torch_loop: pid={os.getpid()} import_s={t1 - t0:.4f} cuda_init_s={t2 - t1:.4f} "
    f"matmul_s={t3 - t2:.4f} total_s={t3 - t0:.4f} matmuls={n}",
    flush=True,
)
