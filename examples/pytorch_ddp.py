#!/usr/bin/env python3
"""DistributedDataParallel training on Ridge's torch backend.

Build Ridge (torch_ridge is built when CMake finds torch), then, from the build folder's
parent:

  With torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for each process):

    PYTHONPATH=build/python torchrun --nproc_per_node 2 examples/pytorch_ddp.py

  With plain env:// (one command per rank, on one or several hosts):

    export PYTHONPATH=build/python MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 WORLD_SIZE=2
    RANK=0 /usr/bin/python3 examples/pytorch_ddp.py &
    RANK=1 /usr/bin/python3 examples/pytorch_ddp.py

Each rank trains the same small model on its own data; DDP averages the gradients over
Ridge, so every rank ends with the same weights (printed as a checksum). --backend gloo
runs the same on Gloo for comparison.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ridge  # noqa: F401  registers the "ridge" backend


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="ridge", help="ridge (default) or gloo")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    args = p.parse_args()

    # MASTER_ADDR/MASTER_PORT serve torch's TCPStore only; Ridge bootstraps through that
    # store and opens its own listener on a port the kernel picks.
    dist.init_process_group(args.backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    for step in range(args.steps):
        x = torch.randn(32, 64, generator=data)
        y = torch.randint(0, 10, (32,), generator=data)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d} loss {loss.item():.4f}", flush=True)

    # Replicas must agree: compare a checksum of the weights across ranks.
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    lo, hi = checksum.clone(), checksum.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if rank == 0:
        same = bool(torch.equal(lo, hi))
        print(f"{args.backend}: {world} ranks, weights checksum {checksum.item():.10f}, "
              f"replicas identical: {same}")
    dist.destroy_process_group()
    if not torch.equal(lo, hi):
        raise SystemExit("replicas differ")


if __name__ == "__main__":
    main()
