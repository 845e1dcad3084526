"""Tables and plot of the digits study: per norm and batch size, the mean over seeds with its 95% t-interval
(markdown, CSV) and accuracy vs batch size; the papers' claims and their verdicts are in
``lnblocks.study.digits.claims``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from lnblocks._optional import require
from lnblocks.study.digits.claims import mean_interval
from lnblocks.study.digits.config import NORM_LABELS


@dataclass(frozen=True)
class Cell:
    """A metric (default: test accuracy, percent) of one norm at one batch size over seeds: mean, standard
    deviation and the half-width of the 95% t-interval of the mean (inf with one seed)."""

    norm: str
    batch_size: int
    mean: float
    std: float
    ci95: float
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
        iv = mean_interval(accs)
        std = math.sqrt(sum((a - iv.mean) ** 2 for a in accs) / (len(accs) - 1)) if len(accs) > 1 else 0.0
        cells.append(Cell(norm, b, iv.mean, std, iv.half, len(accs), int(rs[0]["steps"]), int(rs[0]["epochs"])))
    return cells


def _cell(cells: list[Cell], norm: str, b: int) -> Cell | None:
    return next((c for c in cells if c.norm == norm and c.batch_size == b), None)


def _entry(cell: Cell | None, digits: int) -> str:
    if cell is None:
        return ""
    if not math.isfinite(cell.ci95):  # one seed: no interval
        return f"{cell.mean:.{digits}f}"
    return f"{cell.mean:.{digits}f} ± {cell.ci95:.{digits}f}"


def markdown_table(cells: list[Cell], what: str = "test acc. %", digits: int = 1) -> str:
    """Rows: norms; columns: batch sizes; entries ``mean ± half-width of the 95% t-interval`` over seeds (default:
    test accuracy, percent)."""
    sizes = sorted({c.batch_size for c in cells})
    norms = list(dict.fromkeys(c.norm for c in cells))
    n = max(c.n for c in cells)
    lines = [
        f"| norm ({what}, mean ± 95% CI, {n} seed{'s' if n != 1 else ''}) | "
        + " | ".join(f"batch {b}" for b in sizes)
        + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for norm in norms:
        row = [_cell(cells, norm, b) for b in sizes]
        entries = [_entry(c, digits) for c in row]
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
    """Test accuracy vs batch size (log2 axis), one line per norm, error bars = 95% t-interval over seeds."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 5.0), dpi=120)
    for norm in dict.fromkeys(c.norm for c in cells):
        cs = [c for c in cells if c.norm == norm]
        ax.errorbar(
            [c.batch_size for c in cs], [c.mean for c in cs],
            yerr=[c.ci95 if math.isfinite(c.ci95) else 0.0 for c in cs],
            marker="o", capsize=3, label=NORM_LABELS.get(norm, norm),
        )  # fmt: skip
    sizes = sorted({c.batch_size for c in cells})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size (images per step)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title or "sklearn digits: test accuracy vs batch size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
