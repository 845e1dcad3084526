"""The study's analyses over run records: one flat row per run, Xiong et al. 2020's gradient profile by layer,
loss against learning rate with Wortsman et al. 2023's LR sensitivity, warmup sensitivity, and the Pre-LN vs
Post-LN findings each checked against its numbers."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from lnblocks.study.config import AnalysisConfig
from lnblocks.study.metrics import capped, classify, log_slope, lr_label, lr_sensitivity, max_stable_lr, mean
from lnblocks.study.records import RunRecord

SWEEP_AXES = {"model.depth": "depth", "train.lr": "lr", "train.warmup": "warmup", "train.seed": "seed"}


def arch_of(rec: RunRecord) -> str:
    """What a run compares: the labels of its grid axes other than depth / lr / warmup / seed (e.g. ``"post"``),
    or its placement (plus the norm kind when it is not LayerNorm)."""
    other = [str(v) for k, v in rec.labels.items() if k not in SWEEP_AXES]
    if other:
        return "/".join(other)
    m = rec.config["model"]
    kind = m["norm"]["kind"]
    return m["placement"] if kind == "layernorm" else f"{m['placement']}+{kind}"


def _last(values: list[float | None] | None) -> float | None:
    return values[-1] if values else None


def _top(values: list[float | None] | None) -> float | None:
    finite = [v for v in values or [] if v is not None]
    return max(finite) if finite else None


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
        "wall_s": rec.time["wall_s"],
        "cpu_s": rec.time["cpu_s"],
        "step_ms": rec.time["step_ms"],
    }


def gradient_profile(records: list[RunRecord], group: str = "W_2") -> dict[tuple[str, int], dict[str, Any]]:
    """Per (arch, depth): the init expected-gradient norm of ``group`` by layer, averaged over runs (seeds etc.:
    init does not depend on LR or warmup), and its last/first ratio (Xiong et al. 2020, Fig. 3)."""
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
        out[key] = {"layers": layers, "ratio": layers[-1] / layers[0], "last": layers[-1], "n": len(profs)}
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
                "best_loss": min(curve.values()),
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


@dataclass(frozen=True)
class Finding:
    """One claim of the literature, checked on this study's runs: ``status`` is ``"reproduced"``,
    ``"did not reproduce"`` or ``"not tested"`` (the grid lacks what the claim needs); ``text`` has the numbers."""

    title: str
    status: str
    text: str


def _fmt_runs(runs: list[dict[str, Any]]) -> str:
    losses = ", ".join("div" if r["final_loss"] is None else f"{r['final_loss']:.2f}" for r in runs)
    return f"{losses} ({sum(r['outcome'] == 'trained' for r in runs)}/{len(runs)} trained)"


def _verdict(ok: bool) -> str:
    return "reproduced" if ok else "did not reproduce"


def xiong_findings(rows: list[dict[str, Any]], records: list[RunRecord], analysis: AnalysisConfig) -> list[Finding]:
    """The Pre-LN vs Post-LN claims of Xiong et al. 2020 and the CPU pilot (docs/study-protocol.md)."""
    archs = {r["arch"] for r in rows}
    if not {"pre", "post"} <= archs:
        return [Finding("Pre-LN vs Post-LN", "not tested", "the grid has no 'pre' and 'post' arms to compare")]
    depths = sorted({r["depth"] for r in rows if r["arch"] in ("pre", "post")})
    groups = grouped([r for r in rows if r["arch"] in ("pre", "post")])
    plateau = mean([r["unigram_loss"] for r in rows])
    out = []

    prof = gradient_profile(records)
    post = [(d, prof[("post", d)]) for d in depths if ("post", d) in prof]
    pre = [(d, prof[("pre", d)]) for d in depths if ("pre", d) in prof]
    if post and pre:
        post_r = [p["ratio"] for _, p in post]
        ok = (
            all(b > a for a, b in itertools.pairwise(post_r)) and post_r[-1] > 1 and all(p["ratio"] < 1 for _, p in pre)
        )
        slope = log_slope([d for d, _ in pre], [p["last"] for _, p in pre])
        text = (
            "Expected-gradient norm of the MLP output matrix W_2 at init, last layer / first layer. Post-LN: "
            + ", ".join(f"{p['ratio']:.2f} (L={d})" for d, p in post)
            + "; Pre-LN: "
            + ", ".join(f"{p['ratio']:.2f} (L={d})" for d, p in pre)
            + ". Claim: Post-LN's gradient grows toward the output, more with depth (ratio rising, > 1 at the deepest"
            " model); Pre-LN's does not (ratio < 1). Pre-LN last-layer norm against depth: "
            + ", ".join(f"{p['last']:.3f}" for _, p in pre)
            + (f" (log-log slope {slope:.2f}; Theorem 1 bounds it by O(1/sqrt L))" if math.isfinite(slope) else "")
            + "."
        )
        out.append(Finding("Gradient profile at init (Xiong et al. Fig. 3)", _verdict(ok), text))

    deep, shallow = depths[-1], depths[0]
    stuck_post = groups.get(("post", deep, 0))
    pre_deep = groups.get(("pre", deep, 0))
    if stuck_post and pre_deep:
        post_runs = [r for runs in stuck_post.values() for r in runs]
        pre_runs = [r for runs in pre_deep.values() for r in runs]
        ok = all(r["outcome"] != "trained" for r in post_runs) and all(r["outcome"] == "trained" for r in pre_runs)
        text = (
            f"Depth {deep}, no warmup, final {analysis.final_loss} loss per LR over seeds (context-free plateau = "
            f"unigram loss {plateau:.2f}; uniform ln V = {rows[0]['uniform_loss']:.2f}). Post-LN: "
            + "; ".join(f"lr {lr_label(lr)}: {_fmt_runs(rs)}" for lr, rs in stuck_post.items())
            + ". Pre-LN: "
            + "; ".join(f"lr {lr_label(lr)}: {_fmt_runs(rs)}" for lr, rs in pre_deep.items())
            + f". Claim: Post-LN stays at the plateau (within {analysis.stuck_margin} nats) at every LR; Pre-LN trains"
            " at every LR."
        )
        out.append(Finding(f"Deep Post-LN without warmup does not train (L={deep})", _verdict(ok), text))

    warm = sorted(w for (a, d, w) in groups if a == "post" and d == deep and w > 0)
    if warm and stuck_post and len(stuck_post) > 1:
        by_lr = groups[("post", deep, warm[-1])]
        lrs = sorted(by_lr)
        ok = all(r["outcome"] == "trained" for r in by_lr[lrs[0]]) and all(
            r["outcome"] != "trained" for lr in lrs[1:] for r in by_lr[lr]
        )
        text = (
            f"Depth {deep}, Post-LN with {warm[-1]} warmup steps: "
            + "; ".join(f"lr {lr_label(lr)}: {_fmt_runs(rs)}" for lr, rs in by_lr.items())
            + ". Claim (pilot: a 60-step warmup rescued 1e-3, not 3e-3): warmup rescues the smallest LR only."
        )
        out.append(Finding("Warmup rescues deep Post-LN at the smallest LR only", _verdict(ok), text))

    if shallow != deep:
        shallow_runs = {
            a: [r for (aa, d, _), g in groups.items() if aa == a and d == shallow for rs in g.values() for r in rs]
            for a in ("pre", "post")
        }
        ok = all(r["outcome"] == "trained" for rs in shallow_runs.values() for r in rs)
        text = (
            f"Depth {shallow}, every LR and warmup: "
            + "; ".join(f"{a}-LN: {_fmt_runs(rs)}" for a, rs in shallow_runs.items())
            + ". Claim: both placements train."
        )
        out.append(Finding(f"Shallow models train with either placement (L={shallow})", _verdict(ok), text))

    sens = {(t["arch"], t["depth"]): t for t in sensitivity_table(rows, analysis) if t["warmup"] == 0}
    gaps = [(d, sens[("post", d)], sens[("pre", d)]) for d in depths if ("post", d) in sens and ("pre", d) in sens]
    if len(gaps) > 1 and len(next(iter(groups.values()))) > 1:
        diff = [p["excess_over_depth_best"] - q["excess_over_depth_best"] for _, p, q in gaps]
        ok = all(b >= a - 1e-9 for a, b in itertools.pairwise(diff)) and diff[-1] > diff[0]
        text = (
            "No warmup; expected excess loss over the LR grid relative to the best run at that depth, Post minus "
            "Pre: " + ", ".join(f"{g:+.2f} (L={d})" for (d, _, _), g in zip(gaps, diff)) + ". Wortsman LR "
            "sensitivity (own best as l*) Post / Pre: "
            + ", ".join(f"{p['lr_sensitivity']:.2f} / {q['lr_sensitivity']:.2f} (L={d})" for d, p, q in gaps)
            + ". Claim: the Post-LN penalty grows with depth (pilot: about 0.00, 0.20, 0.75 at L = 3, 6, 12). "
            "Wortsman's metric alone reads ~0 for a Post-LN arm that fails at every LR (its l* is the plateau)."
        )
        out.append(Finding("Post-LN's LR sensitivity grows with depth", _verdict(ok), text))
    return out
