#!/usr/bin/env python3
"""A small real CUDA workload: a 2048x2048 matmul on the default stream and on a side stream.

Run it under gpu-trace to see the channel groups (TSGs) CUDA creates, their scheduling, the
work-submit tokens of their channels, and their implicit teardown at exit:

    sudo gpu-trace -v &
    python3 examples/two_streams.py
"""
import os
import sys
import time

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print("two_streams: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    n = int(os.environ.get("N", "2048"))
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = a @ b  # default stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        d = b @ a  # side stream
    torch.cuda.synchronize()
    print(f"two_streams: pid={os.getpid()} matmul {n}x{n} on default and side stream done, "
          f"checksum={float(c.sum() + d.sum()):.3e}", flush=True)
    # Give the tracer a moment to see the process alive before it exits.
    time.sleep(float(os.environ.get("LINGER", "0.5")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
