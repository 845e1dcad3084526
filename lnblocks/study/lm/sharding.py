"""``train.parallel``: an ``lm`` run sharded with FSDP2 and tensor/sequence parallelism under ``torchrun``
(``lnblocks.models.parallel``; docs/long-runs.md, "Sharded runs").

``ShardingConfig`` is the study-file section (``{fsdp: 2, tp: 1}``); null keeps DDP under torchrun and a plain
process otherwise. ``check_sharding`` refuses, before any process group exists, a layout that does not match the
number of processes or cannot split the model or the batch (the parallel package's own checks, under the key
``train.parallel``). ``Sharded`` is what the training loop holds: the sharded model, its mesh, and on rank 0 an
unsharded copy of the model (``full``) that the per-layer diagnostics, the probe and the layer ablation read after
``gather`` copies the full parameters (``gather_grads`` the gradients) into it; the loss, the gradient norm,
clipping, the optimizer and the eval run on the sharded model itself.

How a run is sharded never changes what it computes (up to float reduction order), so ``train.parallel`` is an
execution key: not part of the run's id, and a checkpoint written under one layout resumes under another.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lnblocks.config import Config, ConfigValueError, check_bool, check_int

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from lnblocks.models.parallel import ParallelConfig


@dataclass(frozen=True, kw_only=True)
class ShardingConfig(Config):
    """``train.parallel``: a ``(fsdp, tp)`` mesh over the ``torchrun`` processes (``fsdp * tp`` of them).

    ``fsdp``: FSDP2 degree (parameters, gradients and optimizer state split ``fsdp`` ways; each data-parallel rank
    trains on ``data.batch_size / fsdp`` rows of the global batch). ``tp``: tensor-parallel degree (attention heads,
    KV heads, MLP units and the vocabulary split ``tp`` ways; Shoeybi et al. 2019, arXiv 1909.08053).
    ``sequence_parallel`` (tp > 1): norms and the residual stream hold ``T / tp`` positions per rank (Korthikanti et
    al. 2022, arXiv 2205.05198). ``loss_parallel`` (tp > 1): the logits stay split over the vocabulary and the
    cross-entropy (and z-loss) run on the shards, so no rank holds the ``(B, T, V)`` logits (PyTorch's
    ``loss_parallel``); off, every tp rank gathers the whole logits for the loss."""

    fsdp: int = 1
    tp: int = 1
    sequence_parallel: bool = True
    loss_parallel: bool = False

    def __post_init__(self) -> None:
        self._set("fsdp", check_int("fsdp", self.fsdp))
        self._set("tp", check_int("tp", self.tp))
        check_bool("sequence_parallel", self.sequence_parallel)
        check_bool("loss_parallel", self.loss_parallel)
        if self.loss_parallel and self.tp == 1:
            raise ConfigValueError("loss_parallel", "splits the logits over tensor-parallel ranks: it needs tp > 1")

    @property
    def world_size(self) -> int:
        return self.fsdp * self.tp

    def parallel_config(self, compile: bool = False) -> ParallelConfig:
        """The ``lnblocks.models.parallel.ParallelConfig`` of this layout (``compile``: each block, after TP)."""
        from lnblocks.models.parallel import ParallelConfig

        return ParallelConfig(
            dp_shard=self.fsdp,
            tp=self.tp,
            sequence_parallel=self.sequence_parallel,
            loss_parallel=self.loss_parallel,
            compile=compile,
        )


def data_parallel_degree(run: Any, world_size: int) -> int:
    """How many ways the global batch is split: ``train.parallel.fsdp``, or the world size (DDP)."""
    p = run.train.parallel
    return world_size if p is None else p.fsdp


def check_sharding(run: Any, world_size: int, vocab_size: int | None = None) -> None:
    """``ValueError`` naming ``train.parallel`` when its mesh is not ``world_size`` processes, or cannot split the
    model (tp must divide heads, KV heads, MLP width, the vocabulary and, with sequence parallelism, the sequence) or
    the batch. A pure function of the config: every rank raises the same error, before any collective. With
    ``vocab_size`` None (a corpus not prepared yet) the vocabulary is checked when the run starts."""
    p = run.train.parallel
    if p is None:
        return
    if p.world_size != world_size:
        raise ConfigValueError(
            "train.parallel",
            f"needs fsdp={p.fsdp} * tp={p.tp} = {p.world_size} processes, but this run has {world_size} (torchrun "
            f"--nproc_per_node {p.world_size}, or a train.parallel whose fsdp * tp is {world_size}; null: DDP under "
            "torchrun)",
        )
    if run.train.dtype == "fp16":
        raise ConfigValueError("train.dtype", "'fp16' (a GradScaler) is not supported with train.parallel; use bf16")
    dp, accum, batch = p.fsdp, run.train.grad_accum, run.data.batch_size
    if batch % (dp * accum):
        raise ConfigValueError(
            "train.parallel",
            f"splits data.batch_size ({batch}) over fsdp={p.fsdp} ranks times train.grad_accum ({accum}) "
            "micro-batches: it must divide evenly",
        )
    if vocab_size is None:
        vocab_size = run.data.vocab if run.data.source in ("shakespeare", "markov") else run.data.vocab_size
    config = p.parallel_config()
    try:
        config.check_model(run.model.gpt_config(vocab_size or p.tp, run.data.seq_len))
        config.check_sequence(run.data.seq_len)
    except ValueError as err:
        raise ConfigValueError("train.parallel", f"(tp={p.tp}) cannot split this model: {err}") from None


class Sharded:
    """``raw`` (a ``GPT``, built the same on every rank) sharded in place over the mesh of ``config``; with
    ``keep_full`` (rank 0, when the run has diagnostics that read whole weights and gradients) also an unsharded copy
    (``full``) for them."""

    def __init__(self, raw: nn.Module, config: ShardingConfig, device: torch.device, keep_full: bool, compile: bool):
        from lnblocks.models.parallel import build_mesh, parallelize

        self.parallel = config.parallel_config(compile)
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
