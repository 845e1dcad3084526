"""Sharded training of lnblocks ``GPT``s: FSDP2 and tensor/sequence parallelism (see ``docs/sharding.md``).

``ParallelConfig`` says the mesh ``(dp_shard, tp)`` and options; ``build_mesh`` makes the mesh, ``parallelize``
shards a model in place, ``split_batch`` gives a rank its rows, ``loss_context`` wraps a loss-parallel step.
Importing this package imports ``torch.distributed``; ``lnblocks.models`` does not import it.
"""

from lnblocks.models.parallel.apply import (
    apply_fsdp,
    apply_tensor_parallel,
    build_mesh,
    check_mesh,
    full_grads,
    loss_context,
    parallelize,
    split_batch,
)
from lnblocks.models.parallel.config import ParallelConfig
from lnblocks.models.parallel.styles import FusedColwiseParallel, GatherInput, NormParallel, ReplicateParallel

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
