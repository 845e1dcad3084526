"""The ``lm`` report's numbers over run records: how a run is classified (trained / stuck / diverged), Wortsman et
al. 2023's learning-rate sensitivity and the max stable LR (pure functions, tested on hand-made tables), one flat row
per run (``summary.csv``, which ``read_summary`` reads back with its types), Xiong et al. 2020's gradient profile by
layer, and the LR and warmup sensitivity tables. The published claims checked on these rows are in
``lnblocks.study.lm.report.findings``."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lnblocks.study.core.records import RunRecord
from lnblocks.study.lm.config import AnalysisConfig

# ---- the numbers of one run and of an LR grid (no torch: tested on hand-made tables) -----------------------


def classify(final_loss: float | None, diverged: bool, plateau: float, stuck_margin: float) -> str:
    """``"diverged"``, ``"stuck"`` (final loss within ``stuck_margin`` of the context-free ``plateau``, or above
    it) or ``"trained"``."""
    if diverged or final_loss is None or not math.isfinite(final_loss):
        return "diverged"
    return "stuck" if final_loss > plateau - stuck_margin else "trained"


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def capped(loss: float | None, initial: float | None) -> float:
    """``min(loss, initial)``, with a diverged (None / non-finite) loss counted as no progress (Wortsman et al.);
    without a finite initial loss (non-finite from the first step) the loss itself, NaN when neither is finite."""
    if not _finite(initial):
        return loss if _finite(loss) else math.nan  # type: ignore[return-value]
    if not _finite(loss):
        return initial  # type: ignore[return-value]
    return min(loss, initial)  # type: ignore[type-var]


def lr_sensitivity(losses: Mapping[float, float | None], initial: float) -> float:
    """Wortsman et al. 2023's LR sensitivity: ``E_lr[min(l(lr), l0) - l*]`` with ``l* = min_lr min(l(lr), l0)``,
    the mean over the (log-spaced) LR grid. 0 means insensitive -- or that no LR trained at all (check ``l*``)."""
    if not losses:
        raise ValueError("lr_sensitivity needs at least one (lr, loss) pair")
    vals = [v for v in (capped(v, initial) for v in losses.values()) if math.isfinite(v)]
    if not vals:  # no loss and no initial loss is finite: nothing to measure
        return math.nan
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


def steps_to_target(losses: Sequence[float | None], target: float, window: int) -> int | None:
    """The number of steps after which the mean training loss over the last ``window`` steps is first at or below
    ``target`` (the steps-to-target of nGPT's claim, arXiv 2410.01131), or None when it never is (a non-finite
    loss in a window makes that window not count)."""
    window = max(1, min(window, len(losses)))
    for end in range(window, len(losses) + 1):
        chunk = losses[end - window : end]
        if all(v is not None and math.isfinite(v) for v in chunk) and math.fsum(chunk) / window <= target:
            return end
    return None


def lr_label(lr: float) -> str:
    """``1e-3`` style label for tables and plots."""
    exp = math.floor(math.log10(lr))
    mant = lr / 10**exp
    return f"{mant:g}e{exp}"


# ---- the rows and tables of the report -------------------------------------------------------------------------


SWEEP_AXES = {"model.depth": "depth", "train.lr": "lr", "train.warmup": "warmup", "train.seed": "seed"}


def arm_label(labels: Mapping[str, str]) -> str | None:
    """The arm a run's grid labels name: its labels on axes other than depth / lr / warmup / seed, joined by ``/``
    (``"post"``, ``"pre/rmsnorm"``); None when it has none."""
    other = [str(v) for k, v in labels.items() if k not in SWEEP_AXES]
    return "/".join(other) if other else None


def check_arm_labels(points: Sequence[Mapping[str, str]]) -> None:
    """Refuse grid points whose labels differ but name the same arm in the report (``x/y`` + ``z`` and ``x`` +
    ``y/z`` are both ``x/y/z``): the report would average them into one row."""
    seen: dict[str, dict[str, str]] = {}
    for labels in points:
        arm = arm_label(labels)
        other = {k: v for k, v in labels.items() if k not in SWEEP_AXES}
        if arm is not None and seen.setdefault(arm, other) != other:
            raise ValueError(
                f"grid: the points {seen[arm]} and {other} would share the arm {arm!r} in the report; rename a label"
            )


def arch_of(rec: RunRecord) -> str:
    """What a run compares: the labels of its grid axes other than depth / lr / warmup / seed (e.g. ``"post"``),
    or its placement (plus the norm kind when it is not LayerNorm)."""
    arm = arm_label(rec.labels)
    if arm is not None:
        return arm
    m = rec.config["model"]
    kind = m["norm"]["kind"]
    return m["placement"] if kind == "layernorm" else f"{m['placement']}+{kind}"


def mix_post_layers(model: Mapping[str, Any]) -> int | None:
    """How many of a Mix-LN run's layers are Post-LN (``lnblocks.models.mix_ln``: ``floor(fraction * depth)``);
    None for other placements. 0 (or all of them) makes the arm plain Pre-LN (Post-LN)."""
    if model.get("placement") != "mix_ln":
        return None
    fraction = model.get("mix_post_fraction", 0.25)
    fraction = fraction if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) else 0.25
    return math.floor(fraction * model["depth"])


def _last(values: list[float | None] | None) -> float | None:
    return values[-1] if values else None


def _top(values: list[float | None] | None) -> float | None:
    finite = [v for v in values or [] if v is not None]
    return max(finite) if finite else None


def _log_layer_slope(values: list[float | None] | None) -> float | None:
    """Least-squares slope of log(value) on the layer index (None unless every value is positive)."""
    if not values or len(values) < 2 or any(v is None or v <= 0 for v in values):
        return None
    xs = range(len(values))
    mx, ys = (len(values) - 1) / 2, [math.log(v) for v in values]  # type: ignore[arg-type]
    my = sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _deep_half_ablation(ablation: dict[str, Any] | None) -> float | None:
    """Mean eval-loss increase when one of the deeper half of the blocks (index >= L // 2) is skipped."""
    if not ablation or ablation.get("base") is None:
        return None
    skip = ablation["skip"]
    deep = [v - ablation["base"] for v in skip[len(skip) // 2 :] if v is not None]
    return sum(deep) / len(deep) if deep and len(deep) == len(skip) - len(skip) // 2 else None


def run_row(rec: RunRecord, analysis: AnalysisConfig) -> dict[str, Any]:
    """One flat row of ``summary.csv``: the grid coordinates, outcome, losses and headline diagnostics."""
    cfg, ref = rec.config, rec.result.reference
    use_eval = analysis.final_loss == "eval"
    final = rec.result.eval["final"] if use_eval else rec.result.final_train_loss
    initial = rec.result.eval["init"] if use_eval else rec.result.initial_loss
    diverged = rec.status == "diverged"
    w2 = (rec.result.init_grad or {}).get("expected", {}).get("W_2")
    diags = rec.result.diagnostics
    first, last = (diags[0], diags[-1]) if diags else ({}, {})
    return {
        "id": rec.id,
        "arch": arch_of(rec),
        "placement": cfg["model"]["placement"],
        "norm": cfg["model"]["norm"]["kind"],
        "depth": cfg["model"]["depth"],
        "dim": cfg["model"]["dim"],
        "lr": cfg["train"]["lr"],
        "warmup": cfg["train"]["warmup"],
        "schedule": cfg["train"]["schedule"],
        "seed": cfg["train"]["seed"],
        "status": rec.status,
        "outcome": classify(final, diverged, ref["unigram"], analysis.stuck_margin),
        "diverged_step": rec.result.diverged_step,
        "steps_done": rec.result.steps_done,
        "initial_loss": initial,
        "final_loss": final,
        "final_train_loss": rec.result.final_train_loss,
        "eval_loss": rec.result.eval["final"],
        "unigram_loss": ref["unigram"],
        "uniform_loss": ref["uniform"],
        "floor_loss": ref.get("floor"),
        "init_gradW2_first": w2[0] if w2 else None,
        "init_gradW2_last": w2[-1] if w2 else None,
        "init_gradW2_ratio": w2[-1] / w2[0] if w2 and w2[0] and w2[-1] is not None and w2[0] > 0 else None,
        "init_residual_rms_last": _last(first.get("residual_rms")),
        "final_residual_rms_last": _last(last.get("residual_rms")),
        "final_grad_norm_total": last.get("grad_norm_total"),
        "final_attn_max_logit": _top(last.get("attn_max_logit")),
        "final_max_output_logit": last.get("max_output_logit"),
        "final_log_z": last.get("log_z"),
        "final_gradW2_slope": _log_layer_slope((last.get("grad_norm") or {}).get("W_2")),
        "ablation_deep_half": _deep_half_ablation(getattr(rec.result, "layer_ablation", None)),
        "qk_norm": cfg["model"].get("qk_norm") is not None,
        "z_loss": cfg["train"].get("z_loss", 0.0),
        "rezero": bool(cfg["model"].get("rezero", False)),
        "depth_scaled_norm": bool(cfg["model"].get("depth_scaled_norm", False)),
        "mix_post_layers": mix_post_layers(cfg["model"]),
        **stability_columns(rec.result.stability),
        **frontier_columns(rec, analysis),
        "wall_s": rec.time["wall_s"],
        "cpu_s": rec.time["cpu_s"],
        "step_ms": rec.time["step_ms"],
    }


def _option(value: Any) -> str:
    """A model option's value as a summary cell: its text, or "" when unset."""
    return "" if value in (None, False) else str(value)


def frontier_columns(rec: RunRecord, analysis: AnalysisConfig) -> dict[str, Any]:
    """The columns the 2025-26 claims read (``lm.report.findings.frontier``): the options that make an arm (the
    optimizer, per-sublayer placement, V-norm, hyper-connections, the attention output gate, soft-caps), the
    train-val gap in eval mode, the attention sink, massive activations and the mixing gain at the last diagnostics
    step, and the steps to ``analysis.target_loss``. Empty or None for records written before them."""
    cfg, res = rec.config, rec.result
    model, attention = cfg["model"], cfg["model"].get("attention") or {}
    hyper = model.get("hyper_connections") or {}
    diags = res.diagnostics
    last = diags[-1] if diags else {}
    gains = [e["mixing_gain"] for e in diags if e.get("mixing_gain") is not None]
    train_eval, final = getattr(res, "train_eval", None), res.eval["final"]
    hidden_max, hidden_median = (last.get("residual_max") or [])[1:], (last.get("residual_median") or [])[1:]
    ratios = [m / d for m, d in zip(hidden_max, hidden_median) if m is not None and d]
    sink = [v for v in last.get("attn_sink") or [] if v is not None]
    target = analysis.target_loss
    return {
        "optimizer": (cfg["train"].get("optimizer") or {}).get("name", ""),
        "norm_alpha": (model.get("norm") or {}).get("alpha_init"),
        "mlp_placement": _option(model.get("mlp_placement")),
        "v_norm": model.get("v_norm") is not None,
        "hyper": _option(hyper.get("kind")),
        "output_gate": _option(attention.get("output_gate")),
        "attn_softcap": attention.get("softcap"),
        "final_softcap": model.get("final_softcap"),
        "train_eval_loss": train_eval,
        "gen_gap": final - train_eval if final is not None and train_eval is not None else None,
        "final_attn_sink": sum(sink) / len(sink) if sink else None,
        "final_residual_max": _top(hidden_max),
        "final_massive_ratio": max(ratios) if ratios else None,
        "init_mixing_gain": gains[0] if gains else None,
        "final_mixing_gain": gains[-1] if gains else None,
        "max_mixing_gain": max(gains) if gains else None,
        "target_loss": target,
        "steps_to_target": steps_to_target(res.loss, target, cfg["train"].get("final_window", 30)) if target else None,
    }


STABILITY_COLUMNS = ("loss_spike_score", "grad_norm_spike_score", "max_update_rms", "var_below_eps")


def stability_columns(stability: dict[str, Any] | None) -> dict[str, Any]:
    """The ``result.stability`` of a record as ``summary.csv`` columns (None for records written before it)."""
    s = stability or {}
    return {
        "loss_spike_score": (s.get("loss") or {}).get("score"),
        "grad_norm_spike_score": (s.get("grad_norm") or {}).get("score"),
        "max_update_rms": s.get("max_update_rms"),
        "var_below_eps": s.get("var_below_eps"),
    }


def gradient_profile(records: list[RunRecord], group: str = "W_2") -> dict[tuple[str, int], dict[str, Any]]:
    """Per (arch, depth): the init expected-gradient norm of ``group`` by layer, averaged over runs (seeds etc.:
    init does not depend on LR or warmup), and its last/first ratio (Xiong et al. 2020, Fig. 3; ``None`` where the
    first layer has no gradient at init)."""
    acc: dict[tuple[str, int], list[list[float]]] = defaultdict(list)
    seen: set[tuple[str, int, int]] = set()
    for rec in records:
        prof = (rec.result.init_grad or {}).get("expected", {}).get(group)
        if not prof:
            continue
        key = (arch_of(rec), rec.config["model"]["depth"])
        seed = rec.config["train"]["seed"]
        if (*key, seed) in seen:  # the same init appears once per (lr, warmup): count it once
            continue
        seen.add((*key, seed))
        acc[key].append(prof)
    out = {}
    for key, profs in sorted(acc.items()):
        layers = [mean([p[i] for p in profs]) for i in range(len(profs[0]))]
        ratio = layers[-1] / layers[0] if layers[0] > 0 else None  # None: no gradient at init (ReZero's zero gates)
        out[key] = {"layers": layers, "ratio": ratio, "last": layers[-1], "n": len(profs)}
    return out


def grouped(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int], dict[float, list[dict[str, Any]]]]:
    """``{(arch, depth, warmup): {lr: [rows over seeds]}}``."""
    out: dict[tuple[str, int, int], dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        out[(r["arch"], r["depth"], r["warmup"])][r["lr"]].append(r)
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def sensitivity_table(rows: list[dict[str, Any]], analysis: AnalysisConfig) -> list[dict[str, Any]]:
    """Per (arch, depth, warmup): Wortsman's LR sensitivity (mean over seeds of ``E_lr[min(l, l0) - l*]``), the
    best loss, the excess over the best loss of *any* config at that depth (does not collapse to 0 when every LR
    fails), the max stable LR, and how many runs failed (stuck or diverged)."""
    groups = grouped(rows)
    best_at_depth: dict[int, float] = defaultdict(lambda: math.inf)
    for (_, depth, _), by_lr in groups.items():
        for runs in by_lr.values():
            best_at_depth[depth] = min(
                best_at_depth[depth], mean([capped(r["final_loss"], r["initial_loss"]) for r in runs])
            )
    table = []
    for (arch, depth, warmup), by_lr in groups.items():
        seeds = sorted({r["seed"] for runs in by_lr.values() for r in runs})
        sens = []
        for s in seeds:
            per = {lr: next((r for r in runs if r["seed"] == s), None) for lr, runs in by_lr.items()}
            if all(r is not None for r in per.values()):
                init = mean([r["initial_loss"] for r in per.values()])
                sens.append(lr_sensitivity({lr: r["final_loss"] for lr, r in per.items()}, init))
        curve = {lr: mean([capped(r["final_loss"], r["initial_loss"]) for r in runs]) for lr, runs in by_lr.items()}
        all_runs = [r for runs in by_lr.values() for r in runs]
        table.append(
            {
                "arch": arch,
                "depth": depth,
                "warmup": warmup,
                "lr_sensitivity": mean(sens),
                "best_loss": min((v for v in curve.values() if math.isfinite(v)), default=math.nan),
                "excess_over_depth_best": mean(list(curve.values())) - best_at_depth[depth],
                "max_stable_lr": max_stable_lr(curve, best_at_depth[depth], analysis.stable_tol),
                "failed": sum(r["outcome"] != "trained" for r in all_runs),
                "runs": len(all_runs),
            }
        )
    return table


def warmup_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (arch, depth, warmup w > 0): warmup sensitivity = mean over LRs and seeds of the capped final loss
    without warmup minus with warmup ``w``, and the failure (stuck or diverged) and divergence rates without and
    with it."""
    groups = grouped(rows)
    table = []
    for (arch, depth, warmup), by_lr in groups.items():
        base = groups.get((arch, depth, 0))
        if warmup == 0 or base is None:
            continue
        deltas, fail0, fail1, div0, div1 = [], [], [], [], []
        for lr, runs in by_lr.items():
            for r in runs:
                twin = next((b for b in base.get(lr, []) if b["seed"] == r["seed"]), None)
                if twin is None:
                    continue
                deltas.append(
                    capped(twin["final_loss"], twin["initial_loss"]) - capped(r["final_loss"], r["initial_loss"])
                )
                fail0.append(twin["outcome"] != "trained")
                fail1.append(r["outcome"] != "trained")
                div0.append(twin["outcome"] == "diverged")
                div1.append(r["outcome"] == "diverged")
        if deltas:
            table.append(
                {
                    "arch": arch,
                    "depth": depth,
                    "warmup": warmup,
                    "loss_change": mean(deltas),
                    "fail_rate_no_warmup": sum(fail0) / len(fail0),
                    "fail_rate_warmup": sum(fail1) / len(fail1),
                    "div_rate_no_warmup": sum(div0) / len(div0),
                    "div_rate_warmup": sum(div1) / len(div1),
                    "pairs": len(deltas),
                }
            )
    return table


TEXT_COLUMNS = ("id", "arch", "placement", "norm", "schedule", "status", "outcome", "optimizer", "mlp_placement",
                "hyper", "output_gate")  # fmt: skip
BOOL_COLUMNS = ("qk_norm", "rezero", "depth_scaled_norm", "v_norm")


def read_summary(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``summary.csv`` with the types ``run_row`` gave them: text columns as text, flags as bools,
    numbers as int or float, empty cells as None (so findings can be recomputed from a committed summary)."""
    out = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if k in TEXT_COLUMNS:
                    row[k] = v
                elif k in BOOL_COLUMNS:
                    row[k] = v == "True"
                elif v == "":
                    row[k] = None
                else:
                    try:
                        row[k] = int(v)
                    except ValueError:
                        row[k] = float(v)
            out.append(row)
    return out
