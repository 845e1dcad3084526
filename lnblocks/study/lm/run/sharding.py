"""``train.parallel``: an ``lm`` run sharded with FSDP2 and tensor/sequence parallelism under ``torchrun``
(``lnblocks.models.parallel``; docs/long-runs.md, "Sharded runs").

The study-file section is the library's own ``ParallelConfig`` (``{dp_shard: 2, tp: 1}``), checked against the run
where the run config is built (``RunConfig._check_layout``) and against the number of processes before any process
group exists (``RunConfig.check_world``); null keeps DDP under torchrun and a plain process otherwise. ``Sharded`` is
what the training loop holds: the sharded model, its mesh, and on rank 0 an unsharded copy of the model (``full``)
that the per-layer diagnostics, the probe and the layer ablation read after ``gather`` copies the full parameters
(``gather_grads`` the gradients) into it; the loss, the gradient norm, clipping, the optimizer and the eval run on the
sharded model itself.

How a run is sharded never changes what it computes (up to float reduction order), so ``train.parallel`` is an
execution key: not part of the run's id, and a checkpoint written under one layout resumes under another.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from lnblocks.models.parallel.config import ParallelConfig


def data_parallel_degree(run: Any, world_size: int) -> int:
    """How many ways the global batch is split: ``train.parallel.dp_shard``, or the world size (DDP)."""
    p = run.train.parallel
    return world_size if p is None else p.dp_shard


class Sharded:
    """``raw`` (a ``GPT``, built the same on every rank) sharded in place over the mesh of ``config`` (its ``compile``
    is ``train.compile``); with ``keep_full`` (rank 0, when the run has diagnostics that read whole weights and
    gradients) also an unsharded copy (``full``) for them."""

    def __init__(self, raw: nn.Module, config: ParallelConfig, device: torch.device, keep_full: bool):
        from lnblocks.models.parallel import build_mesh, parallelize

        self.parallel = config
        self.full = copy.deepcopy(raw) if keep_full else None
        self.mesh = build_mesh(self.parallel, device.type)
        self.model = parallelize(raw, self.mesh, self.parallel)

    def loss_scope(self) -> contextlib.AbstractContextManager[None]:
        """Where the loss's forward and backward run: PyTorch's ``loss_parallel()`` with ``loss_parallel``."""
        from lnblocks.models.parallel import loss_context

        return loss_context(self.parallel)

    def split(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        """This rank's rows of the global batch (every tp rank of a data-parallel group gets the same ones)."""
        from lnblocks.models.parallel import split_batch

        return split_batch(self.mesh, *tensors)

    def gather(self) -> nn.Module | None:
        """Copy the full parameters into ``full``, which is returned on rank 0 (None elsewhere). A collective: every
        rank calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # only rank 0 keeps the values
        state = get_model_state_dict(self.model, options=options)
        if self.full is not None:
            self.full.load_state_dict(state)
        return self.full

    def gather_grads(self) -> None:
        """Copy the full gradients into ``full``'s parameters (rank 0; the parameters are unchanged since the last
        ``gather``, so they are not fetched again). A collective: every rank calls it."""
        from torch.distributed.tensor import DTensor

        mine = dict(self.full.named_parameters()) if self.full is not None else {}
        for name, p in self.model.named_parameters():
            g = p.grad
            if isinstance(g, DTensor):
                g = g.full_tensor()
            if name in mine:
                mine[name].grad = None if g is None else g.detach().clone()
            del g

    def drop_grads(self) -> None:
        """Free the full gradients ``gather_grads`` put into ``full`` (rank 0 holds one full copy of the
        parameters between logging steps, not of the gradients too)."""
        if self.full is not None:
            for p in self.full.parameters():
                p.grad = None


def total_grad_norm(grads: list[Tensor]) -> Tensor:
    """The global gradient norm (what ``clip_grad_norm_`` computes), a plain 0-dim fp32 tensor also when the
    gradients are DTensors (their norm is reduced over the mesh)."""
    import torch

    norm = torch.nn.utils.get_total_norm(grads)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.float()


@contextlib.contextmanager
def no_grad_sync(model: nn.Module) -> Iterator[None]:
    """Gradients of the block accumulate without being reduced: DDP's ``no_sync``, FSDP2's
    ``set_requires_gradient_sync(False)``; nothing for a plain module."""
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
