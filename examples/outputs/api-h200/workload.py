import os, time, torch
x = torch.randn(64, 64, device="cuda"); a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
time.sleep(1.5)  # gpu-trace's rescan attaches the runtimes dlopened at start (docs/api.md)
for _ in range(1000): y = x + x
for _ in range(1000): z = a @ a
torch.cuda.synchronize()
print(f"pid={os.getpid()} done", flush=True)
