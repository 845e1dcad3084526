"""What an ``lm`` run's training loop carries from one step to the next besides the model and the optimizer: the
state a checkpoint must hold for the resumed run to continue bit for bit (``lnblocks.study.lm.run.train``).

The next step, the losses and gradient norms read from the device so far and those not read yet (on the device
until the next ``train.log_every`` read; saved as their exact fp32 values), the diagnostics entries and eval points,
the expected gradient at init, the divergence monitor, the data sampler's generator, the GradScaler, and the time
spent by earlier attempts. ``state_dict()`` gives what ``torch.load(weights_only=True)`` reads back. And the
divergence monitor itself (``DivergenceMonitor``, ``detect_divergence``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class DivergenceMonitor:
    """Streaming divergence test: a non-finite loss diverges at once; a loss above ``initial + margin`` diverges
    after ``patience`` consecutive such steps (a single spike is not a divergence). ``step`` is where it fired."""

    margin: float = 3.0
    patience: int = 10
    initial: float | None = None
    step: int | None = None
    streak: int = field(default=0, repr=False)  # consecutive steps above initial + margin so far

    def update(self, step: int, loss: float) -> bool:
        """Feed the loss of ``step``; True once the run has diverged."""
        if self.step is not None:
            return True
        if not math.isfinite(loss):
            self.step = step
            return True
        if self.initial is None:
            self.initial = loss
        self.streak = self.streak + 1 if loss > self.initial + self.margin else 0
        if self.streak >= self.patience:
            self.step = step
        return self.step is not None


def detect_divergence(losses: Sequence[float], margin: float = 3.0, patience: int = 10) -> int | None:
    """The step at which ``DivergenceMonitor`` fires on ``losses`` (the first is the reference), or None."""
    mon = DivergenceMonitor(margin=margin, patience=patience)
    for step, loss in enumerate(losses):
        if mon.update(step, float(loss)):
            return mon.step
    return None


@dataclass
class LoopState:
    step: int = 0  # the next step to train
    losses: list[float] = field(default_factory=list)  # read from the device, one per step
    grad_norms: list[float] = field(default_factory=list)
    pending_loss: list[Tensor] = field(default_factory=list)  # (,) fp32 on the device: not read yet
    pending_gn: list[Tensor] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)  # diagnostics entries
    eval_curve: list[tuple[int, float]] = field(default_factory=list)
    init_grad: dict[str, Any] | None = None
    elapsed: dict[str, float] = field(default_factory=dict)  # wall_s, cpu_s, train_s, train_cpu_s of earlier attempts

    def state_dict(self, monitor: Any, data_gen: torch.Generator, scaler: Any, elapsed: dict[str, float]) -> dict:
        """Everything the loop needs to continue (``elapsed``: this and earlier attempts' times so far)."""
        pending = torch.stack([*self.pending_loss, *self.pending_gn]).cpu() if self.pending_loss else None
        return {
            "step": self.step,
            "losses": list(self.losses),
            "grad_norms": list(self.grad_norms),
            "pending": pending,
            "records": self.records,
            "eval_curve": [[s, v] for s, v in self.eval_curve],
            "init_grad": self.init_grad,
            "monitor": {"initial": monitor.initial, "step": monitor.step, "streak": monitor.streak},
            "data_gen": data_gen.get_state(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "elapsed": elapsed,
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], monitor: Any, data_gen: torch.Generator, scaler: Any, device: torch.device
    ) -> LoopState:
        """The loop state of a checkpoint; ``monitor``, ``data_gen`` and ``scaler`` are restored in place."""
        pending = state["pending"]
        n = 0 if pending is None else len(pending) // 2
        values = [] if pending is None else list(pending.to(device).unbind())
        monitor.initial, monitor.step, monitor.streak = (state["monitor"][k] for k in ("initial", "step", "streak"))
        data_gen.set_state(state["data_gen"])
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        return cls(
            step=state["step"],
            losses=list(state["losses"]),
            grad_norms=list(state["grad_norms"]),
            pending_loss=values[:n],
            pending_gn=values[n:],
            records=list(state["records"]),
            eval_curve=[(int(s), v) for s, v in state["eval_curve"]],
            init_grad=state["init_grad"],
            elapsed=dict(state["elapsed"]),
        )
