"""A rank that dies turns the others' pending collective into a RuntimeError that names
the Ridge error (ridgeRemoteError or ridgeTimeout), within RIDGE_TIMEOUT, not a hang.

The last rank exits abruptly (os._exit) after one good allreduce; the others start a
second allreduce and must see it fail, through Work.wait() and through the future.

    tests/python/peer_death_test.py --nprocs 2
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch  # noqa: E402

DEAD_EXIT = 0  # the dying rank exits "successfully": its death is the test's point


def worker(args):
    import torch
    import torch.distributed as dist

    rank, world = launch.init_child("ridge", 30)
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), float(world))), t
    if rank == world - 1:
        sys.stdout.flush()
        os._exit(DEAD_EXIT)
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    fut = work.get_future()
    try:
        work.wait()
    except RuntimeError as e:
        text = str(e)
        elapsed = time.monotonic() - start
        print(f"rank {rank}: after {elapsed:.1f} s: {text}")
        names_error = "ridgeRemoteError" in text or "ridgeTimeout" in text
        # The future is done by the time wait() returns (or raises), and holds the error.
        future_failed = fut.done()
        try:
            fut.wait()
            future_failed = False
        except RuntimeError:
            pass
        if not names_error or not future_failed:
            print(f"FAIL: message names a Ridge error: {names_error}; future failed too: {future_failed}")
            os._exit(1)
        # The group is broken: later calls fail at once with a Ridge error as well.
        try:
            dist.all_reduce(torch.ones(4))
            print("FAIL: an allreduce after the failure succeeded")
            os._exit(1)
        except RuntimeError as e2:
            print(f"rank {rank}: next call: {e2}")
        sys.stdout.flush()
        os._exit(0)  # without destroy_process_group: the peer is gone
    print("FAIL: the allreduce with a dead peer succeeded")
    sys.stdout.flush()
    os._exit(1)


if __name__ == "__main__":
    launch.main(worker, __doc__)
