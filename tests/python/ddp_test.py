"""DDP training on "ridge" equals DDP training on "gloo", bit for bit.

Each rank builds the same model twice from one seed, wraps one copy in DDP over a Ridge
process group and the other over a Gloo process group (same processes, same data), and
trains both for a few steps with small buckets (several allreduces per step). On 2 ranks
every sum is a + b in both libraries, so losses and weights must be equal exactly.
The weights are also compared across ranks (DDP keeps replicas identical) and against
the initial ones (training must have moved them).

    tests/python/ddp_test.py --nprocs 2 --init env
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch  # noqa: E402


def build_model(torch, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8))


def train(torch, ddp_model, batches, lr):
    opt = torch.optim.SGD(ddp_model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp_model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses)


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    rank, world = launch.init_child("ridge", 60)
    gloo = dist.new_group(list(range(world)), backend="gloo")
    failures = []

    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    batches = [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(args.steps)]
    initial = [p.detach().clone() for p in build_model(torch, 7).parameters()]

    results = {}
    for name, group in (("ridge", None), ("gloo", gloo)):
        model = build_model(torch, 7)
        # ~16 KB buckets: the 7 K parameters go out in several allreduces per step.
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.016)
        losses = train(torch, ddp, batches, lr=0.05)
        results[name] = (losses, [p.detach().clone() for p in model.parameters()])

    (l_ridge, w_ridge), (l_gloo, w_gloo) = results["ridge"], results["gloo"]
    if not torch.equal(l_ridge, l_gloo):
        failures.append(f"losses differ: ridge {l_ridge.tolist()} gloo {l_gloo.tolist()}")
    for i, (a, b) in enumerate(zip(w_ridge, w_gloo)):
        if not torch.equal(a, b):
            failures.append(f"parameter {i} differs: max |ridge - gloo| = {(a - b).abs().max().item()}")
    if all(torch.equal(a, b) for a, b in zip(w_ridge, initial)):
        failures.append("training did not change the weights")
    # Replicas agree across ranks: gather rank 0's flat weights on every rank over gloo.
    flat = torch.cat([p.reshape(-1) for p in w_ridge])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=gloo)
    if not torch.equal(flat, ref):
        failures.append("ridge replicas differ across ranks")

    print(f"rank {rank}: losses {l_ridge.tolist()}")
    for f in failures:
        print("FAIL", f)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    launch.main(worker, __doc__, lambda p: p.add_argument("--steps", type=int, default=6))
