"""The ``lm`` task's report, built from its run records alone (``lnblocks study report OUT``): ``summary.csv``,
``plots/*.png``, ``report.md`` and ``findings.json``, with the LR table and the findings printed. Runs without a
valid record are named in ``report.md``; the numbers come from the valid ones. When no run trained (every one stuck
on the plateau or diverged) the report says so first, with what would change it. Labels and texts are escaped for
markdown tables (``|``, newlines). The report never fails once runs have trained: a claim family or plot that
raises is named in the report and on stderr and the rest is written."""

from __future__ import annotations

import csv
import io
import math
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lnblocks.study.core.atomic import write_json_atomic, write_text_atomic
from lnblocks.study.core.claims import md_cell, md_line, md_row
from lnblocks.study.core.records import RunRecord
from lnblocks.study.lm.analysis import (
    STABILITY_COLUMNS,
    grouped,
    lr_label,
    mean,
    run_row,
    sensitivity_table,
    warmup_table,
)
from lnblocks.study.lm.config import AnalysisConfig
from lnblocks.study.lm.init_profile import InitProfile, study_profiles

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


def write_summary_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """``summary.csv``: one row per run, columns in ``run_row``'s order (atomically)."""
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(path, text.getvalue())


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
    if problems:
        lines += [f"**{len(problems)} runs of this study have no valid record** and are not in the numbers below:", ""]
        lines += [*(f"- {md_line(p)}" for p in problems), ""]
    lines += [
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
    for failure in failures or []:
        lines += [f"- **{md_line(failure)}**", ""]
    lines += [
        "## Final loss against learning rate",
        "",
        "Mean over seeds; ✗ some seed stuck, † some seed diverged.",
        "",
    ]
    lines += [*lr_table(rows), ""]
    lines += [
        "## Learning-rate and warmup sensitivity",
        "",
        "LR sensitivity (Wortsman et al. 2023): mean over the LR grid of min(loss, initial loss) − best such "
        "loss, averaged over seeds. Excess over depth best: the same mean taken against the best loss of any "
        "arm at that depth. Max stable LR: the largest LR within "
        f"{analysis.stable_tol} of that best loss.",
        "",
    ]
    lines += _table(
        sensitivity_table(rows, analysis),
        [
            ("arch", "arch"),
            ("depth", "depth"),
            ("warmup", "warmup"),
            ("lr_sensitivity", "LR sensitivity"),
            ("best_loss", "best loss"),
            ("excess_over_depth_best", "excess over depth best"),
            ("max_stable_lr", "max stable LR"),
            ("failed", "failed runs"),
            ("runs", "runs"),
        ],
    )
    lines.append("")
    wt = warmup_table(rows)
    if wt:
        lines += [
            "Warmup sensitivity: final loss without warmup minus with it (mean over LRs and seeds; capped at "
            "the initial loss), and the share of runs that failed (stuck or diverged) and that diverged.",
            "",
        ]
        lines += _table(
            wt,
            [
                ("arch", "arch"),
                ("depth", "depth"),
                ("warmup", "warmup steps"),
                ("loss_change", "loss(no warmup) − loss(warmup)"),
                ("fail_rate_no_warmup", "failed, no warmup"),
                ("fail_rate_warmup", "failed, warmup"),
                ("div_rate_no_warmup", "diverged, no warmup"),
                ("div_rate_warmup", "diverged, warmup"),
                ("pairs", "pairs"),
            ],
        )
        lines.append("")
    if profiles:
        src = profiles[0]
        how = (
            f"over {len(src.seeds)} fresh inits per row (seeds {src.seeds[0]}..{src.seeds[-1]}, no training)"
            if src.source == "init_profile"
            else "over the runs' own seeds"
        )
        lines += [
            "## Gradient profile at initialization (Xiong et al. 2020, Fig. 3)",
            "",
            f"Expected gradient: the gradient averaged over {src.batches} batches at init, then its Frobenius norm, "
            f"{how}.",
            "",
        ]
        lines += [*profile_table(profiles), ""]
    lines += stability_section(rows)
    lines += ["## Plots", ""]
    lines += [*(f"![{p.stem}](plots/{p.name})" for p in plots), ""]
    lines += ["Every number above comes from `summary.csv` and `runs/*.json` (per-step losses, per-layer diagnostics)."]
    return "\n".join(lines) + "\n"


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


def _guarded(what: str, failures: list[str], fn: Any, default: Any) -> Any:
    """``fn()``, or ``default`` with one line in ``failures`` (and the traceback on stderr) when it raises: the
    report is still written."""
    try:
        return fn()
    except Exception as err:  # a bug in one claim family or plot must not cost the whole report
        line = f"{what} could not be computed ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
        failures.append(line + "; please report it with this study's records")
        print(f"warning: {line}\n{traceback.format_exc()}", file=sys.stderr)
        return default


def build_lm_report(
    out: Path,
    records: list[RunRecord],
    manifest: dict[str, Any],
    problems: list[str],
    *,
    plots: bool = True,
    echo: bool = True,
    show_progress: bool | None = None,
    open_executor: Callable[[int], Any] | None = None,
) -> int:
    """Write ``summary.csv``, ``plots/``, ``report.md`` and ``findings.json`` of an ``lm`` study into ``out`` and
    print the summary. ``show_progress``: draw the init-profile bar (default: when stderr is a terminal).
    ``open_executor(n)``: the study's executor for the ``n`` init-profile jobs (None: here)."""
    analysis = AnalysisConfig.from_dict(manifest.get("analysis"), key="analysis")
    rows = [run_row(r, analysis) for r in records]
    write_summary_csv(rows, out / "summary.csv")
    from lnblocks._optional import require

    require("numpy")  # the statistics behind the findings
    from lnblocks.study.lm.findings import study_claims

    show = sys.stderr.isatty() if show_progress is None else show_progress
    failures: list[str] = []
    profiles = _guarded(
        "the init gradient profiles", failures,
        lambda: study_profiles(
            out, records, analysis.init_profile, show_progress=show, open_executor=open_executor
        ), [],
    )  # fmt: skip
    findings = _guarded("the claims", failures, lambda: study_claims(rows, profiles), [])
    made = []
    if plots:
        from lnblocks.study.lm.plots import all_plots

        made = _guarded("the plots", failures, lambda: all_plots(records, rows, out / "plots"), [])
    text = render_markdown(manifest, records, rows, findings, made, analysis, problems, profiles, failures)
    write_text_atomic(out / "report.md", text)
    write_json_atomic(out / "findings.json", [f.to_dict() for f in findings])
    if echo:
        if not any(r["outcome"] == "trained" for r in rows):
            print(nothing_trained(rows, analysis))
        print("\n".join(lr_table(rows)))
        for f in findings:
            settle = f"; would settle it: {f.settle()}" if f.settle() else ""
            print(f"- {f.id} {f.title}: {f.status}" + (f" ({f.estimate}{settle})" if f.estimate else ""))
        print(f"report: {out / 'report.md'}  summary: {out / 'summary.csv'}  plots: {out / 'plots'}")
    return 0
