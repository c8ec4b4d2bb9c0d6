"""Starts the ranks of a torch.distributed test as processes, bounded in time.

Every test script calls run_ranks(worker, nprocs, init); `worker(rank, world_size)` runs in
each child after init_process_group. Children are plain subprocesses of this same script
(`--rank N`), so one that hangs is killed at the deadline and its output is shown.

Init methods, all on loopback with ports the kernel picks:
  file  FileStore in a fresh temporary folder
  tcp   tcp://127.0.0.1:PORT, the TCPStore served by this (parent) process, as torchrun's
        agent does (TORCHELASTIC_USE_AGENT_STORE)
  env   env://, rank 0 serving the TCPStore on MASTER_PORT (a port the kernel handed out)
"""

import argparse
import datetime
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests


def skip_unless_torch_ridge():
    try:
        import torch.distributed as dist

        if not dist.is_available():
            raise ImportError("torch.distributed is not available")
        import torch_ridge  # noqa: F401
    except ImportError as e:
        print(f"SKIP: torch_ridge cannot be imported: {e}")
        sys.exit(SKIP)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_child(backend, timeout_s):
    """In a child: init_process_group from the environment the parent set up."""
    import torch.distributed as dist
    import torch_ridge  # noqa: F401

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    method = os.environ["RIDGE_TEST_INIT"]
    timeout = datetime.timedelta(seconds=timeout_s)
    if method == "file":
        dist.init_process_group(backend, init_method="file://" + os.environ["RIDGE_TEST_FILE"], rank=rank,
                                world_size=world, timeout=timeout)
    elif method == "tcp":
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    return rank, world


def main(worker, description, extra_args=None):
    """Entry point of a test script: parent (no --rank) or child (--rank N)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--init", choices=["file", "tcp", "env"], default="file")
    p.add_argument("--deadline", type=float, default=240.0, help="seconds for the whole run")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    if extra_args:
        extra_args(p)
    args = p.parse_args()
    skip_unless_torch_ridge()
    if args.rank is not None:
        worker(args)
        return
    sys.exit(run_ranks(args))


def _print_stacks(rank, pid):
    """Native stacks of a stuck rank, when gdb is there, to show where it waits."""
    gdb = shutil.which("gdb")
    if not gdb:
        return
    try:
        out = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 25"], capture_output=True,
                             text=True, timeout=60).stdout
    except subprocess.TimeoutExpired:
        return
    frames = [line for line in out.splitlines() if line.startswith(("Thread", "#"))]
    print(f"---- rank {rank} (pid {pid}) stacks at the deadline ----")
    print("\n".join(frames))


def run_ranks(args):
    env = dict(os.environ)
    env["WORLD_SIZE"] = str(args.nprocs)
    env["RIDGE_TEST_INIT"] = args.init
    env.setdefault("RIDGE_SOCKET_IFNAME", "lo")
    # A dead or stuck peer turns into an error within this many seconds.
    env.setdefault("RIDGE_TIMEOUT", "60")
    env["OMP_NUM_THREADS"] = "1"
    server = None
    tmp = tempfile.TemporaryDirectory(prefix="ridge-torch-")
    if args.init == "file":
        env["RIDGE_TEST_FILE"] = os.path.join(tmp.name, "store")
    elif args.init == "tcp":
        import torch.distributed as dist

        server = dist.TCPStore("127.0.0.1", 0, args.nprocs, True, datetime.timedelta(seconds=args.deadline),
                               wait_for_workers=False)  # they start below
        env["MASTER_PORT"] = str(server.port)
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        env["TORCHELASTIC_RESTART_COUNT"] = "0"
    else:
        env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = str(_free_port())
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    argv = [a for a in sys.argv[1:]]
    procs = []
    for rank in range(args.nprocs):
        env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, sys.argv[0], *argv, "--rank", str(rank)], env=env_r,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + args.deadline
    outputs = [""] * len(procs)
    timed_out = False
    for i, proc in enumerate(procs):
        try:
            outputs[i], _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            for r, q in enumerate(procs):
                if q.poll() is None:
                    _print_stacks(r, q.pid)
                    q.kill()
            outputs[i], _ = proc.communicate()
    for i, proc in enumerate(procs):
        if proc.returncode is None:
            proc.wait()
    failed = timed_out or any(p.returncode != 0 for p in procs)
    for i, (proc, out) in enumerate(zip(procs, outputs)):
        print(f"---- rank {i} (exit {proc.returncode}) ----")
        print(out, end="")
    if timed_out:
        print(f"FAIL: ranks still running after {args.deadline} s; killed")
    tmp.cleanup()
    del server
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0
