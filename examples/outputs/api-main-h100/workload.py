import os, sys, time, torch
x = torch.randn(64, 64, device="cuda"); a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
time.sleep(2)  # the rescan attaches the runtimes PyTorch dlopened at start (docs/api.md)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
for _ in range(n): y = x + x
for _ in range(n): z = a @ a
torch.cuda.synchronize()
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)  # metrics: the next read
print(f"pid={os.getpid()} done", flush=True)
