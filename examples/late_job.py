#!/usr/bin/env python3
"""A CUDA job that is already running when the tracer starts (late attach, issue 13).

Starts PyTorch work at once, keeps the GPU busy for LATE_SECONDS (default 10), creates a new
high-priority stream at 60 % of that time and works on it, then exits. Start gpu-trace a few
seconds after this script to see what a tracer attached to a busy machine reports:

    python3 examples/late_job.py & sleep 5; sudo gpu-trace -v --duration 10
"""
import os
import sys
import time

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print("late_job: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    total = float(os.environ.get("LATE_SECONDS", "10"))
    n = 2048
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    start = time.monotonic()
    print(f"late_job: pid={os.getpid()} started", flush=True)
    hi = None
    while time.monotonic() - start < total:
        c = a @ b
        if hi is None and time.monotonic() - start > 0.6 * total:
            hi = torch.cuda.Stream(priority=-1)
            print(f"late_job: high-priority stream created at {time.monotonic() - start:.1f} s",
                  flush=True)
        if hi is not None:
            with torch.cuda.stream(hi):
                c = b @ a
        torch.cuda.synchronize()
        time.sleep(0.05)
    print(f"late_job: pid={os.getpid()} done, checksum={float(c.sum()):.3e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
