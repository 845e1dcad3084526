"""Tensor-parallel styles for the parts of an lnblocks ``GPT`` that PyTorch's own styles do not cover.

- ``NormParallel``: a row-wise module (every lnblocks norm) on inputs split along a row dimension (the sequence for
  sequence parallelism, the heads for QK-norm), called as ``norm(x)`` or ``norm(x, residual=r)``. PyTorch's
  ``SequenceParallel`` converts only the first positional input and passes a plain ``residual`` on, which a DTensor
  op then refuses; here both become DTensors. The weight is a replicated DTensor, so its gradient (a sum over rows
  that each rank holds part of) comes back ``Partial`` and is reduced (FSDP2 does it before its reduce-scatter).
- ``FusedColwiseParallel``: a column-parallel ``nn.Linear`` whose output rows are several blocks fused into one
  matrix (attention's ``[q; k; v]``, a gated MLP's ``[gate; up]``). Each rank needs the r-th chunk of *every*
  block, which no DTensor placement describes, so the weight stays a plain ``Shard(0)`` DTensor of the fused
  matrix (state dicts, DCP checkpoints and optimizer states keep the unsharded layout and reshard freely) and the
  projection gathers it and takes this rank's rows: per step two all-gathers of the weight (forward, and backward
  instead of keeping the rows) and one reduce-scatter of its gradient, the price of keeping the HF-compatible fused
  layout (Megatron-LM stores q, k, v interleaved per head group instead). With sequence parallelism it also gathers
  the sequence itself and keeps only its shard for backward.
- ``GatherInput``: the head's input gathered to ``Replicate()``, its gradient reduced (Megatron-LM's ``f``).
- ``ReplicateParallel``: replicated parameters, plain tensor inputs read as replicated, the output redistributed to
  a given placement (learned positions under sequence parallelism: each rank adds its slice of the table).

All parameters become DTensors through ``distribute_tensor``, which copies rank 0's values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle


def replicate_parameters(module: nn.Module, mesh: DeviceMesh, *, recurse: bool = True) -> None:
    """Every parameter of ``module`` (its own only unless ``recurse``) as a replicated DTensor on ``mesh``."""
    owners = module.named_modules() if recurse else [("", module)]
    for _, owner in owners:
        for name, param in list(owner.named_parameters(recurse=False)):
            if not isinstance(param, DTensor):
                dt = distribute_tensor(param.detach(), mesh, [Replicate()])
                owner.register_parameter(name, nn.Parameter(dt, requires_grad=param.requires_grad))


def as_dtensor(x: Any, mesh: DeviceMesh, placement: Placement) -> Any:
    """A plain tensor read as this rank's part of a DTensor with ``placement``; a DTensor redistributed to it."""
    if isinstance(x, DTensor):
        return x if x.placements == (placement,) else x.redistribute(mesh, [placement])
    if isinstance(x, Tensor):
        return DTensor.from_local(x, mesh, [placement], run_check=False)
    return x


def _local(out: Any) -> Any:
    if isinstance(out, DTensor):
        return out.to_local()
    if isinstance(out, tuple):
        return tuple(_local(o) for o in out)
    return out


class NormParallel(ParallelStyle):
    """Row-wise module whose inputs ``x`` and ``residual=`` have ``placement`` (``Shard(1)``: the sequence of
    ``(B, T, C)`` or the heads of ``(B, H, T, hd)``; ``Replicate()``: tensor parallelism without sequence
    parallelism): plain tensors are read as this rank's part, DTensors redistributed to it. Outputs stay DTensors
    unless ``use_local_output``."""

    def __init__(self, placement: Placement | None = None, *, use_local_output: bool = False) -> None:
        super().__init__()
        self.placement = placement or Shard(1)
        self.use_local_output = use_local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        replicate_parameters(module, device_mesh)
        placement = self.placement

        def inputs(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            args = (as_dtensor(args[0], device_mesh, placement), *args[1:])
            if kwargs.get("residual") is not None:
                kwargs = {**kwargs, "residual": as_dtensor(kwargs["residual"], device_mesh, placement)}
            return args, kwargs

        module.register_forward_pre_hook(inputs, with_kwargs=True)
        if self.use_local_output:
            module.register_forward_hook(lambda mod, args, out: _local(out))
        return module

    def __repr__(self) -> str:
        return f"NormParallel({self.placement}, use_local_output={self.use_local_output})"


class ReplicateParallel(ParallelStyle):
    """Replicated parameters; plain tensor inputs read as replicated; the output redistributed to ``output``."""

    def __init__(self, *, output: Placement | None = None) -> None:
        super().__init__()
        self.output = output or Replicate()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        replicate_parameters(module, device_mesh)
        output = self.output
        module.register_forward_pre_hook(lambda mod, args: tuple(as_dtensor(a, device_mesh, Replicate()) for a in args))
        module.register_forward_hook(lambda mod, args, out: as_dtensor(out, device_mesh, output))
        return module

    def __repr__(self) -> str:
        return f"ReplicateParallel(output={self.output})"


class GatherInput(ParallelStyle):
    """The module's first input, a DTensor (a plain tensor is read as ``layout``), made ``Replicate()``: the LM head
    sees the whole sequence (the fused projections gather for themselves). Backward, the input's gradient (a sum of
    every rank's part) is reduced: reduce-scattered back to ``Shard(1)``, or all-reduced for a replicated stream
    (Megatron-LM's ``f`` operator), so no ``Partial`` gradient travels up the residual stream."""

    def __init__(self, layout: Any) -> None:
        super().__init__()
        self.layout = layout

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        layout = self.layout

        def gather(mod: nn.Module, args: tuple) -> tuple:
            x = as_dtensor(args[0], device_mesh, layout)
            if x.placements == (Replicate(),):  # identity forward; from_local's backward all-reduces a Partial grad
                x = DTensor.from_local(x.to_local(), device_mesh, [Replicate()], run_check=False)
            else:
                x = x.redistribute(device_mesh, [Replicate()])
            return (x, *args[1:])

        module.register_forward_pre_hook(gather, prepend=True)  # before any other style's input hook
        return module


class FusedColwiseParallel(ParallelStyle):
    """Column parallelism for an ``nn.Linear`` whose output rows are blocks of sizes ``blocks`` (each divisible by
    the mesh size): rank r computes the r-th chunk of every block, concatenated, as a plain local tensor. The input
    may be a replicated DTensor or a plain tensor holding the full input on every rank."""

    def __init__(self, blocks: tuple[int, ...]) -> None:
        super().__init__()
        self.blocks = tuple(blocks)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise TypeError(f"FusedColwiseParallel shards an nn.Linear, got {type(module).__name__}")
        if sum(self.blocks) != module.out_features or any(b % device_mesh.size() for b in self.blocks):
            raise ValueError(
                f"blocks {self.blocks} must sum to out_features={module.out_features} and each be divisible by "
                f"the mesh size {device_mesh.size()}"
            )
        for name, param in list(module.named_parameters(recurse=False)):
            dt = distribute_tensor(param.detach(), device_mesh, [Shard(0)])
            module.register_parameter(name, nn.Parameter(dt, requires_grad=param.requires_grad))
        module.__class__ = FusedColwiseLinear
        module.blocks = self.blocks
        return module

    def __repr__(self) -> str:
        return f"FusedColwiseParallel(blocks={self.blocks})"


def _redistribute(x: Tensor, mesh: DeviceMesh, src: Placement, dst: Placement) -> Tensor:
    """The collective between two placements of a plain local tensor (DTensor's, so gloo, NCCL and compile agree)."""
    return DTensor.from_local(x, mesh, [src], run_check=False).redistribute(mesh, [dst]).to_local()


def _rows(shard: Tensor, mesh: DeviceMesh, blocks: tuple[int, ...]) -> Tensor:
    """This rank's ``Shard(0)`` chunk of the fused matrix -> this rank's rows of every block (gathers the matrix)."""
    if len(blocks) == 1:
        return shard  # one block: the chunk is already the rows this rank needs
    full = _redistribute(shard, mesh, Shard(0), Replicate())
    rank, n = mesh.get_local_rank(), mesh.size()
    return torch.cat([block.chunk(n)[rank] for block in full.split(blocks)])


def _unrows(rows: Tensor, mesh: DeviceMesh, blocks: tuple[int, ...]) -> Tensor:
    """The gradient of ``_rows``: every rank's rows placed in the fused matrix, summed and scattered to chunks."""
    if len(blocks) == 1:
        return rows
    rank, n = mesh.get_local_rank(), mesh.size()
    full = rows.new_zeros((sum(blocks), *rows.shape[1:]))
    for start, size, part in zip(_starts(blocks), blocks, rows.split([b // n for b in blocks])):
        full[start + rank * (size // n) : start + (rank + 1) * (size // n)] = part
    return _redistribute(full, mesh, Partial(), Shard(0))


def _starts(blocks: tuple[int, ...]) -> list[int]:
    return [sum(blocks[:i]) for i in range(len(blocks))]


class _ColwiseLinear(torch.autograd.Function):
    """``F.linear(x, w, b)`` with ``w``, ``b`` this rank's rows of every block of a fused, column-parallel
    projection, and ``x`` the whole input or (``seq_dim`` set) this rank's positions of a sequence-parallel input.

    Only what the rank already holds is saved for backward: its chunk of the weight (not the gathered rows) and its
    shard of the input (not the gathered sequence; Korthikanti et al. 2022, arXiv 2205.05198, sec. 4.2.2); backward
    gathers both again. The input gradient leaves reduced over the ranks: reduce-scattered to the sequence shards,
    or all-reduced for a whole input (Megatron-LM's ``f`` operator), never as a ``Partial`` sum.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, mesh: DeviceMesh, blocks: tuple, seq_dim: Any):
        ctx.save_for_backward(x, w)
        ctx.mesh, ctx.blocks, ctx.seq_dim, ctx.has_bias = mesh, blocks, seq_dim, b is not None
        if seq_dim is not None:
            x = _redistribute(x, mesh, Shard(seq_dim), Replicate())
        return F.linear(x, _rows(w, mesh, blocks), None if b is None else _rows(b, mesh, blocks))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        x, w = ctx.saved_tensors
        mesh, blocks, seq_dim = ctx.mesh, ctx.blocks, ctx.seq_dim
        if seq_dim is not None:
            x = _redistribute(x, mesh, Shard(seq_dim), Replicate())
        grad_x = grad @ _rows(w, mesh, blocks)  # this rank's part of the sum over all rows
        grad_x = _redistribute(grad_x, mesh, Partial(), Replicate() if seq_dim is None else Shard(seq_dim))
        g = grad.flatten(0, -2)  # (tokens, out_features / tp)
        grad_w = _unrows(g.T @ x.flatten(0, -2), mesh, blocks)
        grad_b = _unrows(g.sum(0), mesh, blocks) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None, None


class FusedColwiseLinear(nn.Linear):
    """An ``nn.Linear`` after ``FusedColwiseParallel`` (same parameters and state-dict keys; see there).

    Input: a ``Shard(dim)`` DTensor (sequence parallelism), a replicated DTensor or a plain tensor holding the whole
    input on every rank. Output: this rank's rows of every block, as a plain tensor ``(..., out_features / tp)``.
    """

    blocks: tuple[int, ...]

    def forward(self, x: Tensor) -> Tensor:
        seq_dim = None
        if isinstance(x, DTensor):
            if isinstance(x.placements[0], Shard):
                seq_dim = x.placements[0].dim
            x = x.to_local()
        bias = None if self.bias is None else self.bias.to_local()
        return _ColwiseLinear.apply(x, self.weight.to_local(), bias, self.weight.device_mesh, self.blocks, seq_dim)
