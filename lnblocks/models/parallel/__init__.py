"""Sharded training of lnblocks ``GPT``s: FSDP2 and tensor/sequence parallelism (see ``docs/sharding.md``).

``ParallelConfig`` says the mesh ``(dp_shard, tp)`` and options; ``build_mesh`` makes the mesh, ``parallelize``
shards a model in place, ``split_batch`` gives a rank its rows, ``loss_context`` wraps a loss-parallel step.
The names load on first use: ``ParallelConfig`` alone (``lnblocks.models.parallel.config``, what a config that
holds a layout imports) does not import torch.distributed's FSDP and tensor-parallel modules; the others do.
``lnblocks.models`` does not import this package.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "ParallelConfig": "config",
    **dict.fromkeys(
        ("apply_fsdp", "apply_tensor_parallel", "build_mesh", "check_mesh", "full_grads", "loss_context",
         "parallelize", "split_batch"), "apply"),
    **dict.fromkeys(("FusedColwiseParallel", "GatherInput", "NormParallel", "ReplicateParallel"), "styles"),
}  # fmt: skip
__all__ = [
    "FusedColwiseParallel",
    "GatherInput",
    "NormParallel",
    "ParallelConfig",
    "ReplicateParallel",
    "apply_fsdp",
    "apply_tensor_parallel",
    "build_mesh",
    "check_mesh",
    "full_grads",
    "loss_context",
    "parallelize",
    "split_batch",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'lnblocks.models.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
