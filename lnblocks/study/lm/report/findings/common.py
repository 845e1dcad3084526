"""What every claim check of the ``lm`` task shares (the ``Claim`` a check returns is ``core.claims``'s): which arm
of a study plays which role, per-cell run tables, threshold comparisons, and how numbers and rules are written.

Units. A *cell* is one run's coordinates besides its arm: (depth, LR, warmup, seed). Trained-run claims pool the
cells a claim covers (e.g. every LR and warmup at every depth) because a config has few seeds; cells of one seed
share its init, so the pooled n is an optimistic count of independent draws, and each claim's text says what it
pooled. Init-profile claims use fresh seeds, which are independent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from lnblocks.study.core.stats import Estimate, agreement, largest_stable_lr
from lnblocks.study.lm.report.analysis import lr_label

SHARE_RULE = "share rule: REPRODUCED when the 95% Clopper-Pearson lower bound is above 1/2 (>= 6/6, 8/9, 10/12, 13/16)"
INTERVAL_RULE = "REPRODUCED when the 95% interval lies wholly on the claimed side"


# ---- arms -----------------------------------------------------------------------------------------------------


def kind_of(row: dict[str, Any]) -> str:
    """The placement family a run belongs to: its placement, or ``dyt`` (DyT in place of LayerNorm), ``rezero``
    (no norm with ReZero gates) or ``lns`` (Pre-LN with LayerNorm Scaling); ``+qk`` with qk-norm."""
    p = row["placement"]
    if p == "none" and row.get("rezero"):
        p = "rezero"
    elif p == "pre" and row.get("depth_scaled_norm"):
        p = "lns"
    elif p == "pre" and row.get("norm") == "dyt":
        p = "dyt"
    return f"{p}+qk" if row.get("qk_norm") else p


def roles(rows: list[dict[str, Any]]) -> dict[str, str]:
    """``{kind: arch label}`` for every kind exactly one arch of the study has (an ambiguous kind, e.g. two
    Pre-LN arms with and without qk-norm, plays no role: the placement claims cannot tell which one is meant)."""
    by_kind: dict[str, set[str]] = {}
    for r in rows:
        by_kind.setdefault(kind_of(r), set()).add(r["arch"])
    return {k: next(iter(a)) for k, a in by_kind.items() if len(a) == 1}


def cells(rows: list[dict[str, Any]], arch: str) -> dict[tuple[int, float, int, int], dict[str, Any]]:
    """``{(depth, lr, warmup, seed): row}`` of one arch."""
    return {(r["depth"], r["lr"], r["warmup"], r["seed"]): r for r in rows if r["arch"] == arch}


def trained(row: dict[str, Any]) -> bool:
    return row["outcome"] == "trained"


def thresholds(rows: list[dict[str, Any]], arch: str) -> dict[tuple[int, int, int], float]:
    """``{(depth, warmup, seed): largest stable LR}`` of one arch on the grid it has (``stats.largest_stable_lr``)."""
    by: dict[tuple[int, int, int], dict[float, bool]] = {}
    for (d, lr, w, s), r in cells(rows, arch).items():
        by.setdefault((d, w, s), {})[lr] = trained(r)
    return {k: largest_stable_lr(v) for k, v in sorted(by.items())}


def lr_text(m: float) -> str:
    if m == math.inf:
        return "> grid"
    if m == -math.inf:
        return "< grid"
    return lr_label(m)


def discordant(
    pairs: Iterable[tuple[dict[str, Any], dict[str, Any]]],
) -> tuple[Estimate | None, int, int]:
    """Threshold comparison pooled over cells: among the ``(low, high)`` run pairs (same cell, two arms) where
    exactly one trained, the share where ``high`` trained. Under failure monotone in LR this share is 1 when
    ``high``'s largest stable LR lies above ``low``'s and 0 when below, and a wider grid only adds pairs of the
    same sign. Returns the share (None when no pair is discordant), how many pairs were ties, and all pairs."""
    flags, ties, total = [], 0, 0
    for low, high in pairs:
        total += 1
        if trained(low) == trained(high):
            ties += 1
        else:
            flags.append(trained(high))
    return (agreement(flags) if flags else None), ties, total


def paired_cells(
    rows: list[dict[str, Any]], a: str, b: str, keep: Callable[[tuple[int, float, int, int]], bool] = lambda c: True
) -> list[tuple[tuple[int, float, int, int], dict[str, Any], dict[str, Any]]]:
    """``(cell, row of a, row of b)`` for every cell both arches ran that ``keep`` accepts, sorted."""
    ca, cb = cells(rows, a), cells(rows, b)
    return [(c, ca[c], cb[c]) for c in sorted(set(ca) & set(cb)) if keep(c)]


def threshold_text(
    rows: list[dict[str, Any]], arches: list[str], keep: Callable[[tuple], bool] = lambda k: True
) -> str:
    """``"largest stable LR per (depth, warmup, seed): post ..., pre ..."``."""
    parts = []
    for arch in arches:
        m = {k: v for k, v in thresholds(rows, arch).items() if keep(k)}
        parts.append(f"{arch}: " + ", ".join(f"L={d} w={w} s={s} {lr_text(v)}" for (d, w, s), v in m.items()))
    return "largest stable LR per (depth, warmup, seed) cell: " + "; ".join(parts)


def discordant_text(est: Estimate | None, ties: int, total: int, what: str) -> str:
    if est is None:
        return f"{what}: none of the {total} run pairs is discordant ({ties} ties)"
    return f"{what}: {format(est)} of the discordant run pairs ({ties} of {total} pairs tie and are left out)"


def show(est: Estimate | None) -> str:
    """An estimate as ``"mean 0.52 [0.41, 0.63] (n=16)"``, or ``"n/a"``."""
    return "n/a" if est is None else format(est)


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:.{digits}g}"


def positive(profiles: Iterable[Iterable[float]]) -> bool:
    """Whether every value of every profile is a finite number > 0 (what a log-scale slope needs)."""
    return all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for p in profiles for v in p)


def finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and isinstance(v, int | float) and math.isfinite(v)]
