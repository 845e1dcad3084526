"""Pure functions behind the study's numbers: divergence detection, run classification, and the learning-rate
sensitivity of Wortsman et al. 2023. No torch, so they are tested on hand-made tables."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


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


def classify(final_loss: float | None, diverged: bool, plateau: float, stuck_margin: float) -> str:
    """``"diverged"``, ``"stuck"`` (final loss within ``stuck_margin`` of the context-free ``plateau``, or above
    it) or ``"trained"``."""
    if diverged or final_loss is None or not math.isfinite(final_loss):
        return "diverged"
    return "stuck" if final_loss > plateau - stuck_margin else "trained"


def capped(loss: float | None, initial: float) -> float:
    """``min(loss, initial)``, with a diverged (None / non-finite) loss counted as no progress (Wortsman et al.)."""
    if loss is None or not math.isfinite(loss):
        return initial
    return min(loss, initial)


def lr_sensitivity(losses: Mapping[float, float | None], initial: float) -> float:
    """Wortsman et al. 2023's LR sensitivity: ``E_lr[min(l(lr), l0) - l*]`` with ``l* = min_lr min(l(lr), l0)``,
    the mean over the (log-spaced) LR grid. 0 means insensitive -- or that no LR trained at all (check ``l*``)."""
    if not losses:
        raise ValueError("lr_sensitivity needs at least one (lr, loss) pair")
    vals = [capped(v, initial) for v in losses.values()]
    best = min(vals)
    return sum(v - best for v in vals) / len(vals)


def max_stable_lr(losses: Mapping[float, float | None], reference: float, tol: float = 0.1) -> float | None:
    """The largest LR whose loss is within ``tol`` of ``reference`` (e.g. the best loss at that depth), or None
    (docs/study-protocol.md)."""
    ok = [lr for lr, v in losses.items() if v is not None and math.isfinite(v) and v <= reference + tol]
    return max(ok) if ok else None


def mean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.nan


def log_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (e.g. last-layer gradient norm against depth)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return math.nan
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else math.nan


def lr_label(lr: float) -> str:
    """``1e-3`` style label for tables and plots."""
    exp = math.floor(math.log10(lr))
    mant = lr / 10**exp
    return f"{mant:g}e{exp}"
