"""Stability monitoring for long runs, after OLMo-core's ``StabilityMonitorCallback`` (allenai/OLMo-core,
``train/callbacks/stability_monitor.py``): loss and gradient-norm spikes, the RMS of the optimizer's update per
weight group, and how often a norm's variance falls under its eps.

- Spikes (``SpikeMonitor``): a step's value is a spike when it exceeds the mean + ``SIGMAS`` (6) standard deviations
  of the previous ``WINDOW`` (128) finite values; scoring starts once the window is full. The *spike score* is the
  share of scored steps that spiked. It is run on the training loss and on the global gradient norm (over all
  parameters, before clipping), both read from the device with the losses every ``train.log_every`` steps (no extra
  host sync). Its window is the last ``WINDOW`` values of those series, which a checkpoint holds, so a resumed run
  scores the same.
- ``update_rms``: per weight group and layer, ``rms(W_after - W_before) / lr`` of a diagnostics step: the size of the
  optimizer's (Adam's) normalised update, about 1 early in training and falling as the second moment grows; weight
  decay is included.
- ``small_variance``: the share of the probe batch's rows whose variance (LayerNorm; the mean square for RMSNorm)
  is below the norm's eps, per block, at each diagnostics step: where eps, not the input, sets the output scale.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

WINDOW = 128
SIGMAS = 6.0


class SpikeMonitor:
    """Streaming spike detection over one series (see the module docstring); ``update(step, value)`` says whether
    ``value`` is a spike; ``summary()`` is what a record keeps."""

    def __init__(self, window: int = WINDOW, sigmas: float = SIGMAS) -> None:
        self.window, self.sigmas = window, sigmas
        self.values: deque[float] = deque(maxlen=window)
        self.scored = 0
        self.spikes: list[int] = []

    def update(self, step: int, value: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False  # a non-finite value is the divergence test's business, not a spike
        spike = False
        if len(self.values) == self.window:
            n = len(self.values)
            mean = math.fsum(self.values) / n
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in self.values) / n)
            spike = std > 0 and value > mean + self.sigmas * std
            self.scored += 1
            if spike:
                self.spikes.append(step)
        self.values.append(value)
        return spike

    @property
    def score(self) -> float | None:
        return len(self.spikes) / self.scored if self.scored else None

    @classmethod
    def over(cls, values: Iterable[float | None]) -> SpikeMonitor:
        mon = cls()
        for step, v in enumerate(values):
            mon.update(step, v)
        return mon

    def summary(self) -> dict[str, Any]:
        return {"score": self.score, "spikes": list(self.spikes), "scored": self.scored}


def summary(loss: Sequence[float | None], grad_norm: Sequence[float | None], diagnostics: Sequence[dict]) -> dict:
    """A run's ``result.stability``: spike scores of its loss and gradient-norm series, the largest update RMS and
    the mean share of rows with variance under eps over its diagnostics steps."""
    rms = [v for e in diagnostics for vs in (e.get("update_rms") or {}).values() for v in vs if v is not None]
    small = [v for e in diagnostics for v in (e.get("var_below_eps") or []) if v is not None]
    return {
        "window": WINDOW,
        "sigmas": SIGMAS,
        "loss": SpikeMonitor.over(loss).summary(),
        "grad_norm": SpikeMonitor.over(grad_norm).summary(),
        "max_update_rms": max(rms) if rms else None,
        "var_below_eps": sum(small) / len(small) if small else None,
    }


def grad_norm(model: nn.Module) -> Tensor:
    """The global gradient norm over all parameters, on the device (0-dim fp32; what ``clip_grad_norm_`` computes)."""
    from lnblocks.study.lm.run.sharding import total_grad_norm

    return total_grad_norm([p.grad for p in model.parameters() if p.grad is not None])


def update_rms(before: dict[str, list[Tensor]], after: dict[str, list[Tensor]], lr: float) -> dict[str, list[float]]:
    """``rms(W_after - W_before) / lr`` per group and layer (``diagnostics.snapshot`` / ``weight_groups``), in one
    device->host transfer."""
    keys = list(before)
    flat = [(a - b).float().pow(2).mean().sqrt() / lr for k in keys for a, b in zip(after[k], before[k])]
    if not flat:
        return {}
    host = torch.stack(flat).cpu().tolist()
    out, i = {}, 0
    for k in keys:
        n = len(before[k])
        out[k] = [float(f"{v:.6g}") for v in host[i : i + n]]
        i += n
    return out


@contextlib.contextmanager
def small_variance(model: nn.Module) -> Iterator[list[float | None]]:
    """Inside the block, every LayerNorm / RMSNorm of ``model.blocks`` counts the rows of its input whose variance
    (mean square for RMSNorm) is under its eps; on exit the yielded list holds one share per block (None for a block
    without such norms)."""
    from lnblocks.norms.modules import LayerNorm, RMSNorm

    counts: list[list[Tensor]] = [[] for _ in model.blocks]
    hooks = []

    def hook(i: int, norm: nn.Module) -> Any:
        def count(_: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0].detach().float()
            residual = kwargs.get("residual", args[1] if len(args) > 1 else None)
            if residual is not None:  # a fused add + norm normalises x + residual
                x = x + residual.detach().float()
            stat = x.var(dim=-1, unbiased=False) if isinstance(norm, LayerNorm) else x.pow(2).mean(dim=-1)
            eps = norm.eps if norm.eps is not None else torch.finfo(args[0].dtype).eps
            counts[i].append(torch.stack([(stat < eps).sum().float(), torch.tensor(float(stat.numel()))]))

        return count

    for i, block in enumerate(model.blocks):
        for m in block.modules():
            if isinstance(m, (LayerNorm, RMSNorm)):
                hooks.append(m.register_forward_pre_hook(hook(i, m), with_kwargs=True))
    shares: list[float | None] = []
    try:
        yield shares
    finally:
        for h in hooks:
            h.remove()
    totals = [torch.stack(c).sum(0) if c else None for c in counts]
    present = [t for t in totals if t is not None]
    host = iter(torch.stack(present).cpu().tolist()) if present else iter(())
    for t in totals:
        if t is None:
            shares.append(None)
        else:
            below, rows = next(host)
            shares.append(float(f"{below / rows:.6g}") if rows else None)
