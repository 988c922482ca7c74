#!/usr/bin/env python3
"""A busy GPU process: 4096x4096 matmuls on GPU 0 in batches of 10 for SECONDS, then one line
`pid=P [KEY=VALUE ...] matmuls=N seconds=S` (the GPU-host share scripts read the pid from it).

    python3 matmul_loop.py SECONDS [KEY=VALUE ...]
"""
import os
import sys
import time

import torch

secs = float(sys.argv[1])
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
t0 = time.time()
n = 0
while time.time() - t0 < secs:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    n += 10
tags = "".join(f" {t}" for t in sys.argv[2:])
print(f"pid={os.getpid()}{tags} matmuls={n} seconds={time.time() - t0:.2f}", flush=True)
