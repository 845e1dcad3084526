"""Analysis of the digits study (Wu & He 2018, arXiv 1803.08494): mean +- std table (markdown, CSV),
accuracy-vs-batch-size plot, and the verdict on
Wu & He (2018), Fig. 1: BatchNorm's accuracy falls as the batch shrinks, GroupNorm's does not.

Verdict rule, per norm, between the largest and the smallest batch size: the change in mean test accuracy counts
as a fall when it is below ``-max(1 pp, 2 standard errors of the difference of the two means)``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from lnblocks._optional import require
from lnblocks.study.digits.config import NORM_LABELS

MIN_EFFECT_PP = 1.0  # 3.6 of the 360 test images: smaller changes are not called a fall even with tight seeds


@dataclass(frozen=True)
class Cell:
    """Test accuracy of one norm at one batch size over seeds (percent)."""

    norm: str
    batch_size: int
    mean: float
    std: float
    n: int
    steps: int
    epochs: int


def summarize(rows: list[dict], metric: str = "test_acc") -> list[Cell]:
    """One ``Cell`` of ``metric`` per (norm, batch size), in first-seen norm order and increasing batch size."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["norm"], int(r["batch_size"])), []).append(r)
    norms = list(dict.fromkeys(r["norm"] for r in rows))
    cells = []
    for (norm, b), rs in sorted(groups.items(), key=lambda kv: (norms.index(kv[0][0]), kv[0][1])):
        accs = [float(r[metric]) for r in rs]
        mean = sum(accs) / len(accs)
        std = math.sqrt(sum((a - mean) ** 2 for a in accs) / (len(accs) - 1)) if len(accs) > 1 else 0.0
        cells.append(Cell(norm, b, mean, std, len(accs), int(rs[0]["steps"]), int(rs[0]["epochs"])))
    return cells


def _cell(cells: list[Cell], norm: str, b: int) -> Cell | None:
    return next((c for c in cells if c.norm == norm and c.batch_size == b), None)


def change(cells: list[Cell], norm: str) -> tuple[float, float, Cell, Cell] | None:
    """``(accuracy change large -> small batch in pp, noise threshold in pp, large cell, small cell)``."""
    sizes = sorted({c.batch_size for c in cells if c.norm == norm})
    if len(sizes) < 2:
        return None
    large, small = _cell(cells, norm, sizes[-1]), _cell(cells, norm, sizes[0])
    se = math.sqrt(large.std**2 / large.n + small.std**2 / small.n)
    return small.mean - large.mean, max(MIN_EFFECT_PP, 2 * se), large, small


def verdict(cells: list[Cell]) -> str:
    """The sentence on whether Wu & He (2018) reproduces, with the numbers it rests on."""
    bn, gn = change(cells, "batch"), change(cells, "group")
    if bn is None or gn is None:
        return "Wu & He (2018) cannot be assessed: the study needs BatchNorm and GroupNorm at two or more batch sizes."
    (d_bn, t_bn, bn_large, bn_small), (d_gn, t_gn, gn_large, gn_small) = bn, gn
    bn_falls, gn_falls = d_bn < -t_bn, d_gn < -t_gn
    bn_text = (
        f"BatchNorm's test accuracy goes from {bn_large.mean:.1f}% at batch {bn_large.batch_size} to "
        f"{bn_small.mean:.1f}% at batch {bn_small.batch_size} ({d_bn:+.1f} pp; noise threshold {t_bn:.1f} pp)"
    )
    gn_text = f"GroupNorm's from {gn_large.mean:.1f}% to {gn_small.mean:.1f}% ({d_gn:+.1f} pp; threshold {t_gn:.1f} pp)"
    if bn_falls and not gn_falls:
        head = "Wu & He (2018) reproduces at this scale"
    elif bn_falls:
        head = "Wu & He (2018) reproduces only in part at this scale (GroupNorm falls too)"
    elif not gn_falls:
        head = "Wu & He (2018) does not reproduce at this scale (BatchNorm does not fall beyond noise)"
    else:
        head = "Wu & He (2018) does not reproduce at this scale (GroupNorm falls, BatchNorm does not)"
    text = f"{head}: {bn_text}, {gn_text}."
    brn = _cell(cells, "batchrenorm", bn_small.batch_size)
    if brn is not None:
        text += (
            f" At batch {bn_small.batch_size}, BatchRenorm (Ioffe 2017) scores {brn.mean:.1f}% vs BatchNorm's "
            f"{bn_small.mean:.1f}% and GroupNorm's {gn_small.mean:.1f}%."
        )
    return text


def markdown_table(cells: list[Cell], what: str = "test acc. %", digits: int = 1) -> str:
    """Rows: norms; columns: batch sizes; entries ``mean +- std`` over seeds (default: test accuracy, percent)."""
    sizes = sorted({c.batch_size for c in cells})
    norms = list(dict.fromkeys(c.norm for c in cells))
    n = max(c.n for c in cells)
    lines = [
        f"| norm ({what}, mean ± std over {n} seeds) | " + " | ".join(f"batch {b}" for b in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for norm in norms:
        row = [_cell(cells, norm, b) for b in sizes]
        entries = [f"{c.mean:.{digits}f} ± {c.std:.{digits}f}" if c else "" for c in row]
        lines.append(f"| {NORM_LABELS.get(norm, norm)} | " + " | ".join(entries) + " |")
    steps = [_cell(cells, norms[0], b) for b in sizes]
    lines.append("| *SGD steps (epochs)* | " + " | ".join(f"{c.steps} ({c.epochs})" if c else "" for c in steps) + " |")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    """All rows (one per run or per cell) as CSV, columns in the first row's order."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(cells: list[Cell], path: Path, title: str = "") -> None:
    """Test accuracy vs batch size (log2 axis), one line per norm, error bars = std over seeds."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for norm in dict.fromkeys(c.norm for c in cells):
        cs = [c for c in cells if c.norm == norm]
        ax.errorbar(
            [c.batch_size for c in cs], [c.mean for c in cs], yerr=[c.std for c in cs],
            marker="o", capsize=3, label=NORM_LABELS.get(norm, norm),
        )  # fmt: skip
    sizes = sorted({c.batch_size for c in cells})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size (images per step)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title or "sklearn digits: test accuracy vs batch size")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
