"""The ``cnn_digits`` task's report, from its run records alone: ``results.csv`` (one row per run), ``summary.csv``
and ``table.md`` (per norm and batch size, the mean over seeds with its 95% t-interval), ``accuracy_vs_batch.png``
and ``report.md`` with the papers' claims and their verdicts (``lnblocks.study.digits.claims``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnblocks._optional import require
from lnblocks.study.core.atomic import write_json_atomic, write_text_atomic
from lnblocks.study.core.records import RunRecord
from lnblocks.study.core.stats import mean_interval
from lnblocks.study.digits.claims import claim_line, claims, switch_weight_table
from lnblocks.study.digits.config import NORM_LABELS, DigitsSettings


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
        est = mean_interval(accs)
        std = math.sqrt(sum((a - est.value) ** 2 for a in accs) / (len(accs) - 1)) if len(accs) > 1 else 0.0
        cells.append(
            Cell(norm, b, est.value, std, est.half_width, len(accs), int(rs[0]["steps"]), int(rs[0]["epochs"]))
        )
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
    """All rows (one per run or per cell) as CSV, columns in the first row's order (atomically)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue())


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


# ---- the report files ------------------------------------------------------------------------------------------


def row(record: RunRecord) -> dict[str, Any]:
    """The flat row of ``results.csv`` (the columns of the digits study before the runner; SwitchableNorm's
    ``switch_weights`` as a JSON string, empty for the other arms)."""
    c, r = record.config, record.result
    result = dataclasses.asdict(r)
    result["switch_weights"] = json.dumps(r.switch_weights) if r.switch_weights is not None else ""
    result["agc_grad_ratio"] = "" if r.agc_grad_ratio is None else r.agc_grad_ratio
    return {"run_id": record.id, "norm": c["norm"], "batch_size": c["batch_size"], "seed": c["seed"],
            **result, "seconds": record.time["wall_s"], "cpu_s": record.time.get("cpu_s", "")}  # fmt: skip


def build_digits_report(
    out: Path,
    records: list[RunRecord],
    manifest: dict[str, Any],
    problems: list[str],
    *,
    plots: bool,
    echo: bool,
    show_progress: bool = False,
    open_executor: Any = None,
) -> int:
    """Write the report files of a ``cnn_digits`` study into ``out`` from its records (the training settings are
    every run's; the ``manifest`` is not needed); print the table and the claims. Nothing here is long enough for
    a progress bar or an executor (``show_progress`` and ``open_executor`` are the task interface's)."""
    first = records[0].config
    cfg = DigitsSettings.from_dict({k: first[k] for k in DigitsSettings.field_names() if k in first})
    seeds = sorted({int(r.config["seed"]) for r in records})
    rows = [row(r) for r in records]
    cells = summarize(rows)
    verdicts = "\n".join(claim_line(c) for c in claims(rows))
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", [dataclasses.asdict(c) for c in cells])
    table = markdown_table(cells)
    write_text_atomic(out / "table.md", table + "\n")
    if plots:
        plot(cells, out / "accuracy_vs_batch.png")
    grid = {"norms": list(dict.fromkeys(r["norm"] for r in rows)), "batch_sizes": sorted({c.batch_size for c in cells}),
            "seeds": seeds}  # fmt: skip
    write_json_atomic(out / "config.json", {**cfg.to_dict(), **grid})  # the keys of DigitsStudyConfig
    loss_table = markdown_table(summarize(rows, "final_train_loss"), "training loss, last epoch, train mode", 3)
    topped_up = sorted({c.batch_size for c in cells if c.epochs > cfg.epochs})
    if topped_up:
        table += (
            f"\n\nProtocol note: batch size(s) {topped_up} trained for more than {cfg.epochs} epochs to reach "
            f"min_steps={cfg.min_steps}, so they had more SGD time (lr x steps) than the others; differences between "
            "those columns and the rest partly reflect the training budget, not the normalization."
        )
    if problems:
        table += f"\n\n{len(problems)} runs have no valid record and are not in the table:\n" + "\n".join(
            f"- {p}" for p in problems
        )
    cpu_s = sum(float(r["cpu_s"] or r["seconds"]) for r in rows)
    sn_table = switch_weight_table(rows)
    write_text_atomic(out / "report.md", _report(cfg, seeds, table, loss_table, sn_table, verdicts, cpu_s, len(rows)))
    if echo:
        print(table.split("\n\n")[0])
        print(verdicts)
        print(f"report: {out / 'report.md'}")
    return 0


def _report(
    cfg: DigitsSettings,
    seeds: list[int],
    table: str,
    loss_table: str,
    sn_table: str,
    verdicts: str,
    cpu_s: float,
    runs: int,
) -> str:
    sn = (
        f"""
SwitchableNorm's learned importance weights at the end of training (softmax of the logits; 1/3 each at init),
per layer, mean over seeds:

{sn_table}
"""
        if sn_table
        else ""
    )
    return f"""# Small-batch study on sklearn digits (lnblocks.cnn norms)

What the papers claim about batch-size dependence, tested with 95% t-intervals over seeds (REPRODUCED, DID NOT
REPRODUCE, or INCONCLUSIVE when an interval straddles the claim's threshold; rules in `lnblocks.study.digits.claims`):

{verdicts}

{table}

![test accuracy vs batch size](accuracy_vs_batch.png)
{sn}
The mean training loss of the last epoch, measured in train mode (BatchNorm and BatchRenorm normalise with the
batch's own statistics there, so their noise at small batches shows here even where eval accuracy does not move):

{loss_table}

Setup: sklearn's bundled 8x8 digits, stratified split ({1 - cfg.test_fraction:.0%} train / {cfg.test_fraction:.0%}
test, split seed {cfg.split_seed}); CNN with conv widths {list(cfg.widths)}, one block per width (a 3x3 conv and the
arm's norm and activation, `lnblocks.study.digits.arms`), 2x2 max-pool after the second block, global average pool,
linear head. SGD, momentum {cfg.sgd_momentum}, weight decay {cfg.weight_decay}, linear warm-up over
{cfg.warmup_frac:.0%} of the steps then cosine, lr = {cfg.base_lr} x batch/32 (linear scaling, Wu & He 2018),
{cfg.epochs} epochs (at least {cfg.min_steps} steps); test accuracy in eval mode (batch-statistics norms use their
running statistics, momentum {cfg.bn_momentum}). GroupNorm (with and without WS) and EvoNorm-S0: {cfg.gn_groups}
groups. BatchRenorm: r_max {cfg.renorm_r_max}, d_max {cfg.renorm_d_max}, warm-up {cfg.renorm_warmup_frac:.0%} of the
steps, then a linear ramp over {cfg.renorm_ramp_frac:.0%}. NF: AGC clipping {cfg.agc_clipping} on the blocks, not
the head. WeightNorm: data-dependent init on {cfg.wn_init_images} training images. Seeds {seeds} set the
initialisation and the batch order. {runs} runs; training CPU time over all runs: {cpu_s / 60:.1f} min.
"""
