import sys, time, torch
x = torch.randn(64, 64, device="cuda")
for _ in range(2000): y = x + x
torch.cuda.synchronize()
time.sleep(10)  # the rescan attaches libcuda and libcudart before the timed loop
n = 100000; t = time.perf_counter()
for _ in range(n): y = x + x
torch.cuda.synchronize()
print(f"us_per_step={(time.perf_counter() - t) / n * 1e6:.2f}", flush=True)
