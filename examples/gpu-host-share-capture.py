#!/usr/bin/env python3
"""Capture NVML per-process utilization samples (the raw figures gpu-trace's GPU share will read)
beside `nvidia-smi pmon -s u`, while PyTorch matmul loops compete on GPU 0.

    python3 nvml_share_capture.py OUTDIR [SECONDS] [PERIOD_S]

Writes OUTDIR/nvml.jsonl (one line per poll: the raw samples nvmlDeviceGetProcessUtilization
returned since the previous poll, with the call's return code), OUTDIR/pmon.txt, OUTDIR/pids.
Workloads: two matmul loops from t=0, a third from t=SECONDS/3, all for SECONDS.
"""
import ctypes, json, os, subprocess, sys, time

out = sys.argv[1]
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 12.0
period = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
os.makedirs(out, exist_ok=True)

class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]

nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0

LOOP = r'''
import sys, time, torch
secs = float(sys.argv[1]); a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize(); t0 = time.time(); n = 0
while time.time() - t0 < secs:
    for _ in range(10): c = a @ b
    torch.cuda.synchronize(); n += 10
print(f"pid={__import__('os').getpid()} matmuls={n} seconds={time.time()-t0:.2f}", flush=True)
'''
pmon = subprocess.Popen(["nvidia-smi", "pmon", "-s", "u", "-d", "1"], stdout=open(f"{out}/pmon.txt", "w"),
                        stderr=subprocess.STDOUT)
log = open(f"{out}/workloads.log", "w")
procs = [subprocess.Popen([sys.executable, "-c", LOOP, str(secs)], stdout=log, stderr=log) for _ in range(2)]
third = None
t0 = time.monotonic()
last = ctypes.c_ulonglong(0)
with open(f"{out}/nvml.jsonl", "w") as f:
    while True:
        now = time.monotonic() - t0
        if third is None and now >= secs / 3:
            third = subprocess.Popen([sys.executable, "-c", LOOP, str(secs)], stdout=log, stderr=log)
            procs.append(third)
        count = ctypes.c_uint(0)
        rc0 = nvml.nvmlDeviceGetProcessUtilization(dev, None, ctypes.byref(count), last)
        n = max(count.value, 1) + 8
        buf = (Sample * n)()
        count = ctypes.c_uint(n)
        rc = nvml.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(count), last)
        samples = [dict(pid=s.pid, ts_us=s.timeStamp, sm=s.smUtil, mem=s.memUtil, enc=s.encUtil, dec=s.decUtil)
                   for s in buf[: count.value]] if rc == 0 else []
        f.write(json.dumps(dict(t=round(now, 3), wall_us=int(time.time() * 1e6), since_us=last.value,
                                rc_size=rc0, rc=rc, samples=samples)) + "\n")
        f.flush()
        if samples:
            last = ctypes.c_ulonglong(max(s["ts_us"] for s in samples))
        if all(p.poll() is not None for p in procs) and third is not None:
            break
        time.sleep(period)
pmon.terminate(); pmon.wait()
open(f"{out}/pids", "w").write("\n".join(str(p.pid) for p in procs) + "\n")
print("done", [p.returncode for p in procs])
