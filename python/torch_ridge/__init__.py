"""Ridge as a torch.distributed backend.

Importing this package registers the backend ``"ridge"``::

    import torch.distributed as dist
    import torch_ridge  # noqa: F401  (registers "ridge")
    dist.init_process_group("ridge", init_method="env://")

The communicator of every process group is bootstrapped through the store torch gives
the backend: rank 0 puts a Ridge unique id there and the others read it, so Ridge never
binds MASTER_PORT (its own root listener takes an ephemeral port).
"""

import inspect

import torch
import torch.distributed as dist

from ._C import ProcessGroupRidge, ridge_version, torch_api, cuda  # noqa: F401

__all__ = ["ProcessGroupRidge", "BACKEND_NAME", "ridge_version", "cuda"]

BACKEND_NAME = "ridge"


def _create_process_group(store, rank, size, timeout):
    return ProcessGroupRidge(store, rank, size, timeout)


def _register():
    # Importing twice (or from two packages) must not trip torch's "already exists" check.
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    kwargs = {}
    # torch >= 2.1 asks which devices the backend serves.
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        kwargs["devices"] = ["cpu", "cuda"] if cuda else ["cpu"]
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, **kwargs)


_register()
