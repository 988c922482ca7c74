#!/usr/bin/env python3
"""Create and destroy CUDA contexts in a loop (real RM traffic: TSGs allocated, scheduled and
freed by the driver API, not only at process exit).

Uses libcuda directly through ctypes: primary context retain → allocate → release → reset.
    ROUNDS=5 python3 examples/ctx_churn.py
"""
import ctypes
import os
import sys
import time


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUDA error {rc}")


def main() -> int:
    rounds = int(os.environ.get("ROUNDS", "3"))
    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    started = time.perf_counter()
    for _ in range(rounds):
        ctx = ctypes.c_void_p()
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        ptr = ctypes.c_uint64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)), "cuMemAlloc")
        check(cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(7), ctypes.c_size_t(1 << 20)), "cuMemsetD8")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        check(cuda.cuMemFree_v2(ptr), "cuMemFree")
        check(cuda.cuCtxSetCurrent(None), "cuCtxSetCurrent(NULL)")
        check(cuda.cuDevicePrimaryCtxRelease_v2(dev), "cuDevicePrimaryCtxRelease")
        check(cuda.cuDevicePrimaryCtxReset_v2(dev), "cuDevicePrimaryCtxReset")
    elapsed = time.perf_counter() - started
    print(f"ctx_churn: pid={os.getpid()} {rounds} context create/destroy rounds in {elapsed:.3f} s "
          f"({elapsed / rounds * 1e3:.1f} ms each)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
