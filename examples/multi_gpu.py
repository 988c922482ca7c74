#!/usr/bin/env python3
"""Work on several GPUs (issue 18): MODE=each (one matmul per GPU from one process),
MODE=allreduce (torch.distributed NCCL all-reduce, one process per GPU).

    MODE=each python3 examples/multi_gpu.py
    MODE=allreduce python3 examples/multi_gpu.py

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends): it can take shared GPUs out of
service.
"""
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402


def each() -> int:
    n = torch.cuda.device_count()
    outs = []
    for i in range(n):
        with torch.cuda.device(i):
            a = torch.randn(1024, 1024, device=f"cuda:{i}")
            s = torch.cuda.Stream(device=i)
            with torch.cuda.stream(s):
                outs.append(a @ a)
    for i in range(n):
        torch.cuda.synchronize(i)
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    for i, p in enumerate(props):
        print(f"multi_gpu: pid={os.getpid()} cuda:{i} {p.name} uuid={getattr(p, 'uuid', '?')} "
              f"pci_bus_id={getattr(p, 'pci_bus_id', '?')}", flush=True)
    return 0


def worker(rank: int, world: int) -> None:
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29517"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    t = torch.full((1 << 20,), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = world * (world + 1) / 2
    ok = bool((t == want).all())
    print(f"multi_gpu: allreduce rank={rank} pid={os.getpid()} sum={t[0].item()} ok={ok}", flush=True)
    dist.destroy_process_group()


def allreduce() -> int:
    import torch.multiprocessing as mp
    world = torch.cuda.device_count()
    mp.spawn(worker, args=(world,), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("multi_gpu: no CUDA device", file=sys.stderr)
        sys.exit(1)
    sys.exit(allreduce() if os.environ.get("MODE") == "allreduce" else each())
