"""The optimizer step of an ``lm`` run: the learning-rate schedule (``lr_at``; ``set_lrs`` sets every parameter
group's from its own peak), the optimizer (``build_optimizer``, with independent weight decay: ``decay_coefficient``;
Muon's pair of optimizers is checkpointed as both: ``checkpointed``), the precision of ``train.dtype``
(``Precision``: autocast and, for fp16, the ``GradScaler``), the forward and backward passes of one step's batch as
``train.grad_accum`` micro-batches with the z-loss (``forward_backward``), and deterministic GPU kernels
(``deterministic_kernels``).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lnblocks.models.optim import OptimizerPair, build_muon
from lnblocks.study.lm.config import TrainConfig
from lnblocks.study.lm.run.sharding import no_grad_sync


def lr_at(
    step: int, lr: float, warmup: int, steps: int, schedule: str = "constant", min_lr_ratio: float = 0.0
) -> float:
    """Learning rate of 0-based ``step``: linear warmup ``lr * (step + 1) / warmup`` (Xiong et al. 2020, §3.2), then
    ``"constant"``, ``"cosine"``/``"linear"`` decay from ``lr`` to ``min_lr_ratio * lr`` at ``steps - 1``, or
    ``"inv_sqrt"`` ``lr * sqrt(max(warmup, 1) / (step + 1))`` (Vaswani et al. 2017)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    if schedule == "inv_sqrt":
        return lr * math.sqrt(max(warmup, 1) / (step + 1))
    span = max(steps - 1 - warmup, 1)
    frac = min(max((step - warmup) / span, 0.0), 1.0)
    lo = min_lr_ratio * lr
    if schedule == "cosine":
        return lo + 0.5 * (lr - lo) * (1.0 + math.cos(math.pi * frac))
    if schedule == "linear":
        return lr - (lr - lo) * frac
    raise ValueError(f"schedule must be one of ['constant', 'cosine', 'linear', 'inv_sqrt'], got {schedule!r}")


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer | OptimizerPair:
    """AdamW / Adam / SGD / Muon (with AdamW for the non-matrix parameters: ``lnblocks.models.build_muon``) from
    ``train.optimizer``; weight decay on matrices only (nanoGPT), never on norms, biases or DyT's alpha."""
    o = cfg.optimizer
    if o.name == "muon":
        decay = decay_coefficient(cfg)
        return build_muon(model, lr=cfg.lr, adamw_lr=o.adamw_lr, weight_decay=decay, adamw_weight_decay=decay,
                          momentum=o.muon_momentum, nesterov=o.nesterov, ns_steps=o.ns_steps,
                          adjust_lr_fn=o.muon_adjust_lr, betas=(o.beta1, o.beta2), eps=o.eps)  # fmt: skip
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": decay_coefficient(cfg)}, {"params": rest, "weight_decay": 0.0}]
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=o.momentum, foreach=True)
    cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
    return cls(groups, lr=cfg.lr, betas=(o.beta1, o.beta2), eps=o.eps, foreach=True)


def set_lrs(opt: torch.optim.Optimizer | OptimizerPair, cfg: TrainConfig, step: int) -> float:
    """Set every parameter group's LR at 0-based ``step``: the schedule (``lr_at``) from the group's own peak,
    ``initial_lr`` (Muon's and its AdamW's differ), or ``train.lr`` for a group without one; returns the schedule's
    LR of ``train.lr`` (what the diagnostics record)."""
    lr = lr_at(step, cfg.lr, cfg.warmup, cfg.steps, cfg.schedule, cfg.min_lr_ratio)
    for group in opt.param_groups:
        peak = group.get("initial_lr", cfg.lr)
        group["lr"] = lr if peak == cfg.lr else lr_at(step, peak, cfg.warmup, cfg.steps, cfg.schedule, cfg.min_lr_ratio)
    return lr


def checkpointed(opt: torch.optim.Optimizer | OptimizerPair) -> Any:
    """What a checkpoint saves and loads for ``opt``: the optimizer, or both optimizers of an ``OptimizerPair`` (the
    state-dict API of ``torch.distributed.checkpoint`` takes an iterable of optimizers)."""
    return opt.optimizers if isinstance(opt, OptimizerPair) else opt


def decay_coefficient(cfg: TrainConfig) -> float:
    """The ``weight_decay`` to give torch's AdamW, which decays by ``lr_t * weight_decay`` per step. With
    ``optimizer.independent_wd`` that is ``weight_decay / lr``, so the decay per step is ``weight_decay * lr_t / lr``:
    the schedule's factor times ``weight_decay``, independent of the peak LR (Wortsman et al. 2023, sec. 3.2.2)."""
    o = cfg.optimizer
    return o.weight_decay / cfg.lr if o.independent_wd else o.weight_decay


def z_loss_term(logits: Tensor, coefficient: float) -> Tensor:
    """``coefficient * mean(log(Z)^2)`` over positions, ``log Z = logsumexp(logits)`` in fp32 (PaLM's auxiliary
    z-loss, Chowdhery et al. 2022, arXiv 2204.02311): pulls the softmax normaliser towards 1."""
    return coefficient * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


_AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Precision:
    """``train.dtype`` on one device: ``autocast()`` for forward passes, and for fp16 a ``GradScaler`` (the loss is
    scaled for backward, the grads unscaled before clipping and diagnostics, and a step with inf/NaN grads skipped)."""

    device_type: str
    dtype: torch.dtype | None = None
    scaler: Any = None

    @classmethod
    def of(cls, name: str, device: torch.device) -> Precision:
        dtype = _AUTOCAST[name]
        scaler = torch.amp.GradScaler(device.type) if dtype is torch.float16 else None
        return cls(device.type, dtype, scaler)

    def autocast(self) -> Any:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, opt: torch.optim.Optimizer | OptimizerPair) -> None:
        if self.scaler is not None:
            for o in _each(opt):
                self.scaler.unscale_(o)

    def step(self, opt: torch.optim.Optimizer | OptimizerPair) -> None:
        if self.scaler is None:
            opt.step()
        else:
            for o in _each(opt):  # each optimizer skips the step when its grads hold inf/NaN
                self.scaler.step(o)
            self.scaler.update()


def _each(opt: torch.optim.Optimizer | OptimizerPair) -> tuple[torch.optim.Optimizer, ...]:
    return opt.optimizers if isinstance(opt, OptimizerPair) else (opt,)


def forward_backward(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    accum: int,
    precision: Precision,
    z_loss: float = 0.0,
    full_logits: bool = False,
) -> Tensor:
    """Forward and backward passes of one optimizer step's batch ``x``, ``y`` ``(B, T)`` as ``accum`` micro-batches
    (gradients accumulate; DDP all-reduces on the last one only); returns the batch's mean cross-entropy, detached,
    in fp32 (``z_loss`` > 0 adds the z-loss, ``z_loss * mean(logsumexp(logits)^2)``, to what is back-propagated,
    not to what is returned). With ``accum == 1`` and no z-loss this is the plain ``loss.backward()``.

    The LM head, the loss and the z-loss come in chunks of rows (``GPT.forward(..., return_logits=False)``,
    ``lnblocks.models.loss``): no ``(B, T, V)`` logits. ``full_logits=True``: the route before it (the logits, then
    ``z_loss_term``), kept for the benchmarks and tests that compare the two."""
    total: Tensor | None = None
    micro = list(zip(x.chunk(accum), y.chunk(accum)))  # accum x ((B / accum, T), (B / accum, T))
    for i, (xi, yi) in enumerate(micro):
        last = i == accum - 1
        with contextlib.nullcontext() if last else no_grad_sync(model):
            with precision.autocast():
                if full_logits:
                    logits, loss = model(xi, yi)  # (B, T, V), ()
                else:
                    stats, loss = model(xi, yi, return_logits=False, z_loss=z_loss)
            objective = loss
            if z_loss:
                objective = loss + (z_loss_term(logits, z_loss) if full_logits else stats.z_loss)
            precision.backward(objective if accum == 1 else objective / accum)
        value = loss.detach().float()
        if hasattr(value, "full_tensor"):  # a loss-parallel loss: a replicated DTensor scalar
            value = value.full_tensor()
        total = value if total is None else total + value
    assert total is not None
    return total if accum == 1 else total / accum


@contextlib.contextmanager
def deterministic_kernels(on: bool) -> Any:
    """``train.deterministic``: inside the block, PyTorch picks deterministic kernels or raises
    (``use_deterministic_algorithms``), cuDNN runs deterministic algorithms without autotuning, cuBLAS gets the fixed
    workspace it needs (``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless set; it takes effect in a process that has not used
    cuBLAS yet, as the executors' workers) and flash-attn its deterministic backward; restored afterwards."""
    if not on:
        yield
        return
    cudnn = torch.backends.cudnn
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.deterministic, cudnn.benchmark)  # fmt: skip
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.deterministic, cudnn.benchmark = saved[2], saved[3]
