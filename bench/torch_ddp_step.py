#!/usr/bin/env python3
"""Times a DDP training step on Ridge's torch backend beside Gloo, at several bucket sizes.

    PYTHONPATH=build/python RIDGE_SOCKET_IFNAME=lo /usr/bin/python3 bench/torch_ddp_step.py \
        --nprocs 2 --buckets 1,5,25 --rounds 5 --steps 5

Starts --nprocs ranks on this host (env:// on loopback, a port the kernel picks). Every
rank holds one Ridge group (the default) and one Gloo group over the same ranks, and a
model of --layers Linear(width, width) layers (--width 1024: 4 MiB of float32 gradients
per layer), or with --model embedding an Embedding with as many parameters and next to no
arithmetic (the step is then mostly the gradient allreduce). For each bucket_cap_mb, each backend gets its own DDP wrapper of the same
model; the backends then take turns, --rounds times (the first of each pair alternates),
each turn timing --steps training steps after a barrier. Reported per bucket size and
backend: the median over rounds of the mean step time on rank 0 (which waits for its
gradients' allreduce in backward(), as every rank does), and gloo/ridge.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_ridge  # noqa: F401

    torch.set_num_threads(args.threads)
    dist.init_process_group("ridge", init_method="env://")
    rank = dist.get_rank()
    gloo = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    groups = {"ridge": None, "gloo": gloo}

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(rank)
    if args.model == "mlp":
        layers = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers)
        x = torch.randn(args.batch, args.width, generator=g)
        y = torch.randn(args.batch, args.width, generator=g)
    else:
        # As many parameters as the MLP, almost no arithmetic: the step is the gradients'
        # allreduce (dense embedding gradients, as DDP sends them) plus memory traffic.
        rows = args.layers * args.width * args.width // 64
        model = torch.nn.Sequential(torch.nn.Embedding(rows, 64), torch.nn.Linear(64, 64))
        x = torch.randint(0, rows, (args.batch,), generator=g)
        y = torch.randn(args.batch, 64, generator=g)
    params = sum(p.numel() for p in model.parameters())

    def timed_steps(ddp, opt, steps):
        dist.barrier(group=gloo)
        start = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        return (time.perf_counter() - start) / steps

    rows = []
    for bucket in args.buckets:
        wrapped = {}
        for name, group in groups.items():
            ddp = DDP(model, process_group=group, bucket_cap_mb=bucket)
            wrapped[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-6))
            timed_steps(*wrapped[name], args.warmup)
        times = {name: [] for name in groups}
        for r in range(args.rounds):
            order = ["ridge", "gloo"] if r % 2 == 0 else ["gloo", "ridge"]
            for name in order:
                times[name].append(timed_steps(*wrapped[name], args.steps))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        rows.append((bucket, med["ridge"], med["gloo"]))
        del wrapped
    if rank == 0:
        print(f"# DDP step, {args.model}, {dist.get_world_size()} ranks, {params / 1e6:.1f} M float32 parameters "
              f"({params * 4 / 2**20:.0f} MiB of gradients), batch {args.batch}, {args.threads} torch thread(s) "
              f"per rank, median of {args.rounds} rounds x {args.steps} steps")
        print(f"{'bucket_cap_mb':>13} {'ridge ms':>10} {'gloo ms':>10} {'gloo/ridge':>11}")
        for bucket, ridge, gloo_t in rows:
            print(f"{bucket:>13g} {ridge * 1e3:>10.2f} {gloo_t * 1e3:>10.2f} {gloo_t / ridge:>11.2f}")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--buckets", default="1,5,25", help="bucket_cap_mb values, comma-separated")
    p.add_argument("--model", choices=["mlp", "embedding"], default="mlp",
                   help="mlp: Linear layers (compute and communication); embedding: the same parameter "
                        "count in an Embedding (communication-bound)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    args = p.parse_args()
    args.buckets = [float(b) for b in args.buckets.split(",")]
    if "RANK" in os.environ:
        worker(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(args.nprocs),
               OMP_NUM_THREADS=str(args.threads))
    env.setdefault("RIDGE_SOCKET_IFNAME", "lo")
    procs = [subprocess.Popen([sys.executable, *sys.argv], env=dict(env, RANK=str(r))) for r in range(args.nprocs)]
    deadline = time.monotonic() + args.timeout
    rc = 0
    for proc in procs:
        try:
            rc |= proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("timed out", file=sys.stderr)
            rc = 1
    sys.exit(1 if rc else 0)


if __name__ == "__main__":
    main()
