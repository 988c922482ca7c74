#!/usr/bin/env python3
"""Two PyTorch processes contending for one GPU: a "big" one issuing large matmuls on a
low-priority stream and a "small" one issuing small matmuls on a high-priority stream. Each
reports its own throughput and per-iteration latency, so the contention the driver arbitrates
(time-slicing between the two processes' channel groups) is visible next to the trace.

    sudo gpu-trace -v --perfetto contention.json &
    python3 examples/contention.py              # both workers, 5 s each (DURATION=...)
    python3 examples/contention.py worker big   # one worker (what the default mode starts)

Stream priorities order kernels *within* a process; between processes the driver time-slices
their TSGs (timeslice and interleave level as the trace shows them). Environment:
    DURATION  seconds each worker runs (default 5)
    BIG_N     matrix size of the big worker (default 4096), SMALL_N of the small one (256)
    WAIT_FILE if set, a worker waits for this file to exist before touching CUDA (used by
              examples/admission_control.sh, so that gpu-trace can start in between)
"""
import os
import subprocess
import sys
import time


def worker(role: str) -> int:
    wait_file = os.environ.get("WAIT_FILE")
    if wait_file:
        print(f"contention[{role}]: pid={os.getpid()} waiting for {wait_file}", flush=True)
        while not os.path.exists(wait_file):
            time.sleep(0.05)
    import torch

    if not torch.cuda.is_available():
        print(f"contention[{role}]: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    big = role == "big"
    n = int(os.environ.get("BIG_N" if big else "SMALL_N", "4096" if big else "256"))
    # Lower number = higher priority; (0, -1) on current GPUs: "big" gets the lowest.
    least, greatest = torch.cuda.Stream.priority_range()
    priority = least if big else greatest
    duration = float(os.environ.get("DURATION", "5"))
    try:
        stream = torch.cuda.Stream(priority=priority)
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        torch.cuda.synchronize()
    except RuntimeError as err:  # e.g. scheduling refused by gpu-trace --deny-pid
        print(f"contention[{role}]: pid={os.getpid()} CUDA setup failed: {err}", file=sys.stderr, flush=True)
        return 2
    latencies = []
    started = time.perf_counter()
    with torch.cuda.stream(stream):
        while time.perf_counter() - started < duration:
            t0 = time.perf_counter()
            c = a @ b
            stream.synchronize()
            latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3  # noqa: E731
    print(
        f"contention[{role}]: pid={os.getpid()} n={n} stream_priority={priority} "
        f"iterations={len(latencies)} in {elapsed:.2f} s ({len(latencies) / elapsed:.1f}/s, "
        f"{2 * n**3 * len(latencies) / elapsed / 1e12:.2f} TFLOP/s) "
        f"latency p50={p(0.5):.3f} ms p99={p(0.99):.3f} ms checksum={float(c[0, 0]):.3e}",
        flush=True,
    )
    return 0


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "worker":
        return worker(sys.argv[2])
    procs = [subprocess.Popen([sys.executable, __file__, "worker", role]) for role in ("big", "small")]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
