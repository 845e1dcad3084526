"""``report.md`` of an ``lm`` study, one function per section (``render_markdown`` puts them in order): the header,
the runs without a valid record, the findings, the final loss against the LR, LR and warmup sensitivity, the init
gradient profile, stability, the plots. When no run trained (every one stuck on the plateau or diverged) the report
says so first, with what would change it. Labels and texts are escaped for markdown tables (``|``, newlines)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lnblocks.study.core.claims import md_cell, md_line, md_row
from lnblocks.study.core.records import RunRecord
from lnblocks.study.lm.config import AnalysisConfig
from lnblocks.study.lm.report.analysis import (
    STABILITY_COLUMNS,
    grouped,
    lr_label,
    mean,
    sensitivity_table,
    warmup_table,
)
from lnblocks.study.lm.report.init_profile import InitProfile

if TYPE_CHECKING:
    from lnblocks.study.core.claims import Claim

MARK = {"trained": "", "stuck": " ✗", "diverged": " †"}


def _num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def lr_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: one row per (arch, depth, warmup), one column per LR: mean final loss over seeds, with ✗ when a
    seed got stuck and † when one diverged."""
    groups = grouped(rows)
    lrs = sorted({r["lr"] for r in rows})
    head = ["arch", "depth", "warmup", *(f"lr {lr_label(lr)}" for lr in lrs)]
    lines = [md_row(head), "|" + "---|" * len(head)]
    for (arch, depth, warmup), by_lr in groups.items():
        cells = []
        for lr in lrs:
            runs = by_lr.get(lr, [])
            if not runs:
                cells.append("")
                continue
            v = mean([r["final_loss"] for r in runs if r["final_loss"] is not None])
            marks = "".join(sorted({MARK[r["outcome"]] for r in runs}))
            cells.append(f"{_num(v, 2) if math.isfinite(v) else 'div'}{marks}")
        lines.append(md_row([arch, depth, warmup, *cells]))
    return lines


def _cell(key: str, value: Any) -> str:
    if isinstance(value, str):
        return md_cell(value)
    if key.endswith("_lr") and value is not None:
        return lr_label(value)
    return _num(value)


def _table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> list[str]:
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(k, r[k]) for k, _ in cols) + " |")
    return lines


def profile_table(profiles: list[InitProfile]) -> list[str]:
    """Markdown: per (arm, depth) the mean over seeds of ||grad W_2|| by layer at init and of last / first."""
    head = "| arch | depth | seeds | ‖∇W_2‖ at init, layer 1 … L (mean over seeds) | last / first |"
    lines = [head, "|---|---|---|---|---|"]
    for p in sorted(profiles, key=lambda p: (p.arch, p.depth)):
        if not p.w2:
            continue
        layers = [mean([w[i] for w in p.w2]) for i in range(p.depth)]
        ratios = [w[-1] / w[0] for w in p.w2 if w[0] > 0]  # none where the arm has no gradient at init (ReZero)
        ratio = f"{mean(ratios):.2f}" if ratios else "n/a"
        profile = " ".join(f"{v:.3f}" for v in layers)
        lines.append(md_row([p.arch, p.depth, len(p.seeds), profile, ratio]))
    return lines


def stability_section(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: per (arch, depth, warmup), the mean spike scores of the loss and the gradient norm (share of scored
    steps above the mean + 6 sigma of the previous 128; OLMo-core's StabilityMonitorCallback), the largest update
    RMS / lr and the mean share of norm inputs with variance under eps; empty for records without them."""
    scored = [r for r in rows if r.get("loss_spike_score") is not None or r.get("max_update_rms") is not None]
    if not scored:
        return []
    lines = [
        "## Stability",
        "",
        "Spike score: the share of steps whose value exceeds the mean + 6 sigma of the previous 128 (scored once "
        "128 values are in; after OLMo-core's StabilityMonitorCallback), mean over runs. Update RMS: "
        "rms(W_after - W_before) / lr per weight group and layer at the diagnostics steps, the largest. Var < eps: the "
        "mean share of norm input rows (probe batch) whose variance is under the norm's eps.",
        "",
        "| arch | depth | warmup | loss spike score | grad-norm spike score | max update RMS | var < eps | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[Any, Any, Any], list[dict[str, Any]]] = {}
    for r in scored:
        groups.setdefault((r["arch"], r["depth"], r["warmup"]), []).append(r)
    for (arch, depth, warmup), runs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        cells = []
        for col in STABILITY_COLUMNS:
            values = [r[col] for r in runs if r.get(col) is not None]
            value = max(values) if col == "max_update_rms" and values else mean(values) if values else None
            cells.append(_num(value, 4))
        lines.append(md_row([arch, depth, warmup, *cells, len(runs)]))
    return [*lines, ""]


def render_markdown(
    manifest: dict[str, Any],
    records: list[RunRecord],
    rows: list[dict[str, Any]],
    findings: list[Claim],
    plots: list[Path],
    analysis: AnalysisConfig,
    problems: list[str] | None = None,
    profiles: list[InitProfile] | None = None,
    failures: list[str] | None = None,
) -> str:
    """``report.md``: its sections in order, each a list of lines."""
    lines = [
        *header_section(manifest, records, rows, analysis),
        *problems_section(problems or []),
        *findings_section(findings, failures or []),
        *lr_section(rows),
        *sensitivity_section(rows, analysis),
        *profile_section(profiles or []),
        *stability_section(rows),
        *plots_section(plots),
    ]
    return "\n".join(lines) + "\n"


def header_section(
    manifest: dict[str, Any], records: list[RunRecord], rows: list[dict[str, Any]], analysis: AnalysisConfig
) -> list[str]:
    """The title, the description, what was run and how a run is classified; first, when no run trained, that."""
    name = manifest.get("name", "study")
    n_div = sum(r["status"] == "diverged" for r in rows)
    cfg = records[0].config
    ref = records[0].result.reference
    cpu = sum(r["cpu_s"] for r in rows)
    lines = [f"# Study `{md_line(name)}`", ""]
    if manifest.get("description"):
        lines += [str(manifest["description"]).strip(), ""]
    lines += [
        f"{len(rows)} runs ({n_div} diverged), {cfg['train']['steps']} steps each, data `{cfg['data']['source']}` "
        f"(V = {round(math.exp(ref['uniform']))}, "
        f"T = {cfg['data']['seq_len']}, batch {cfg['data']['batch_size']}), total CPU time {cpu / 60:.1f} min. "
        f"Final loss = the held-out {analysis.final_loss} loss at the end of training. Reference losses: uniform "
        f"ln V = {ref['uniform']:.3f}, context-free (unigram) plateau = {ref['unigram']:.3f}"
        + (f", entropy floor = {ref['floor']:.3f}" if ref.get("floor") else "")
        + ". A run is *stuck* when its final"
        f" loss is above plateau − {analysis.stuck_margin}, *diverged* when it stopped on a non-finite or exploding"
        " loss, *trained* otherwise.",
        "",
    ]
    if not any(r["outcome"] == "trained" for r in rows):
        lines += [f"**{nothing_trained(rows, analysis)}**", ""]
    return lines


def problems_section(problems: list[str]) -> list[str]:
    """The runs of the study without a valid record (left out of every number)."""
    if not problems:
        return []
    lines = [f"**{len(problems)} runs of this study have no valid record** and are not in the numbers below:", ""]
    return [*lines, *(f"- {md_line(p)}" for p in problems), ""]


def findings_section(findings: list[Claim], failures: list[str]) -> list[str]:
    """Every published claim the study's arms can test, with its verdict; then what could not be computed."""
    lines = [
        "## Findings",
        "",
        "Each published claim the study's arms can test (docs/study-claims.md), with n, the estimate and its 95% "
        "interval, and a verdict: REPRODUCED (the interval supports the claim), DID NOT REPRODUCE (it contradicts "
        "it) or INCONCLUSIVE (it straddles; the table says how many seeds or pooled units would settle it at the "
        "observed effect).",
        "",
    ]
    if findings:
        from lnblocks.study.core.claims import claims_table

        lines += [*claims_table(findings), ""]
        for f in findings:
            lines += [f"- **{f.id} {f.title}: {f.status}.** {md_line(f.text)}", ""]
    else:
        lines += ["No published claim applies to this study's arms.", ""]
    for failure in failures:
        lines += [f"- **{md_line(failure)}**", ""]
    return lines


def lr_section(rows: list[dict[str, Any]]) -> list[str]:
    """The final loss of every (arch, depth, warmup) against the learning rate."""
    lines = ["## Final loss against learning rate", "", "Mean over seeds; ✗ some seed stuck, † some seed diverged.", ""]
    return [*lines, *lr_table(rows), ""]


SENSITIVITY_COLUMNS = [
    ("arch", "arch"),
    ("depth", "depth"),
    ("warmup", "warmup"),
    ("lr_sensitivity", "LR sensitivity"),
    ("best_loss", "best loss"),
    ("excess_over_depth_best", "excess over depth best"),
    ("max_stable_lr", "max stable LR"),
    ("failed", "failed runs"),
    ("runs", "runs"),
]
WARMUP_COLUMNS = [
    ("arch", "arch"),
    ("depth", "depth"),
    ("warmup", "warmup steps"),
    ("loss_change", "loss(no warmup) − loss(warmup)"),
    ("fail_rate_no_warmup", "failed, no warmup"),
    ("fail_rate_warmup", "failed, warmup"),
    ("div_rate_no_warmup", "diverged, no warmup"),
    ("div_rate_warmup", "diverged, warmup"),
    ("pairs", "pairs"),
]


def sensitivity_section(rows: list[dict[str, Any]], analysis: AnalysisConfig) -> list[str]:
    """LR sensitivity and the max stable LR per arm and depth (Wortsman et al. 2023), then warmup sensitivity."""
    lines = [
        "## Learning-rate and warmup sensitivity",
        "",
        "LR sensitivity (Wortsman et al. 2023): mean over the LR grid of min(loss, initial loss) − best such "
        "loss, averaged over seeds. Excess over depth best: the same mean taken against the best loss of any "
        "arm at that depth. Max stable LR: the largest LR within "
        f"{analysis.stable_tol} of that best loss.",
        "",
        *_table(sensitivity_table(rows, analysis), SENSITIVITY_COLUMNS),
        "",
    ]
    wt = warmup_table(rows)
    if wt:
        lines += [
            "Warmup sensitivity: final loss without warmup minus with it (mean over LRs and seeds; capped at "
            "the initial loss), and the share of runs that failed (stuck or diverged) and that diverged.",
            "",
            *_table(wt, WARMUP_COLUMNS),
            "",
        ]
    return lines


def profile_section(profiles: list[InitProfile]) -> list[str]:
    """Xiong et al. 2020's gradient profile at init (Fig. 3), when it was measured."""
    if not profiles:
        return []
    src = profiles[0]
    how = (
        f"over {len(src.seeds)} fresh inits per row (seeds {src.seeds[0]}..{src.seeds[-1]}, no training)"
        if src.source == "init_profile"
        else "over the runs' own seeds"
    )
    return [
        "## Gradient profile at initialization (Xiong et al. 2020, Fig. 3)",
        "",
        f"Expected gradient: the gradient averaged over {src.batches} batches at init, then its Frobenius norm, {how}.",
        "",
        *profile_table(profiles),
        "",
    ]


def plots_section(plots: list[Path]) -> list[str]:
    """The plots, and where every number comes from."""
    return [
        "## Plots",
        "",
        *(f"![{p.stem}](plots/{p.name})" for p in plots),
        "",
        "Every number above comes from `summary.csv` and `runs/*.json` (per-step losses, per-layer diagnostics).",
    ]


def nothing_trained(rows: list[dict[str, Any]], analysis: AnalysisConfig) -> str:
    """What the report says first when no run trained: how the runs ended and what would change that."""
    stuck = sum(r["outcome"] == "stuck" for r in rows)
    diverged = len(rows) - stuck
    steps = sorted({r["steps_done"] for r in rows if r["outcome"] == "stuck"})
    lrs = sorted({r["lr"] for r in rows})
    what = []
    if stuck:
        what.append(
            f"{stuck} stuck on the unigram plateau (final loss above plateau − {analysis.stuck_margin}): more steps "
            f"(train.steps; they ran {', '.join(map(str, steps))}) or a higher learning rate (the largest tried is "
            f"{lr_label(max(lrs))})"
        )
    if diverged:
        what.append(
            f"{diverged} diverged: a lower learning rate (the smallest tried is {lr_label(min(lrs))}), warmup "
            "(train.warmup) or clipping (train.grad_clip)"
        )
    return (
        f"No run of this study trained: {'; '.join(what)} would change that. Until then the claims that compare "
        "trained runs are NOT TESTED or INCONCLUSIVE."
    )
