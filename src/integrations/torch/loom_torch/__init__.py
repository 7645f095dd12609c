"""loom as a torch.distributed backend for CPU tensors.

    import loom_torch                      # registers the "loom" backend
    torch.distributed.init_process_group("loom")
    torch.distributed.init_process_group("cpu:loom,cuda:nccl")

Every collective of torch.distributed runs on loom's host-memory
communicators; the group's timeout is loom's operation timeout
(LOOM_TIMEOUT_S); loom's errors raise torch.distributed.DistBackendError
with loom's message. See the README's "PyTorch" section.
"""
import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND", "LoomBackend", "loom_version"]

BACKEND = "loom"
LoomBackend = _C.LoomBackend


def loom_version() -> int:
    """loom's NCCL_VERSION_CODE-style version (ncclGetVersion)."""
    return _C.version()


def _create(dist_opts, pg_options):
    # Extended API: the group's store, rank, size, timeout and, when torch
    # splits an eagerly bound default group, the backend to split.
    return _C.create_backend(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        dist_opts.timeout,
        list(dist_opts.global_ranks_in_group),
        getattr(dist_opts, "split_from", None),
    )


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
