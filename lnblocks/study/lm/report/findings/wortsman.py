"""Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities" (arXiv 2309.14322):
claims W1-W4 of docs/study-claims.md on a study of Pre-LN arms with and without qk-layernorm (and z-loss) over a
wide log-spaced LR grid at several model sizes (``configs/wortsman2023_quick.yaml``).

A *size* is a (depth, width) pair; a *unit* is one (size, seed), over which every per-LR curve is summarised (a slope
on log LR, the LR sensitivity, the largest stable LR). Units of different sizes are independent models, so claims
about "small models" pool them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lnblocks.study.core.claims import Claim, judged
from lnblocks.study.core.stats import agreement, largest_stable_lr, mean_interval, ols_slope
from lnblocks.study.lm.report.analysis import lr_label, lr_sensitivity
from lnblocks.study.lm.report.findings.common import (
    SHARE_RULE,
    discordant,
    discordant_text,
    fmt,
    lr_text,
    show,
    trained,
)

PAPER = "Wortsman et al. 2023 (2309.14322)"
SCALE_LOGZ = "z-loss 1e-4 moves log Z slowly: the paper's runs are 1e5 steps; a GPU config with 10k+ steps"
SCALE_DEPTH = "a trend over model sizes from about 1e7 parameters; several sizes per axis"

Unit = tuple[int, int, int, int]  # (depth, dim, warmup, seed)
Arm = tuple[bool, bool]  # (qk-norm, z-loss) of a Pre-LN LayerNorm run


def _arm(r: dict[str, Any]) -> Arm | None:
    if r["placement"] != "pre" or r.get("norm") != "layernorm" or r.get("rezero") or r.get("depth_scaled_norm"):
        return None
    return bool(r.get("qk_norm")), bool(r.get("z_loss"))


def arms(rows: list[dict[str, Any]]) -> dict[str, Arm] | None:
    """``{"noqk": arm, "qk": arm[, "qk_z": arm]}``: Pre-LN runs without and with qk-norm at the same z-loss
    (without z-loss when the study has that pair), and with qk-norm and z-loss; None without such a pair."""
    found = {a for r in rows if (a := _arm(r)) is not None}
    z = not {(False, False), (True, False)} <= found  # prefer the pair without z-loss
    if not {(False, z), (True, z)} <= found:
        return None
    out = {"noqk": (False, z), "qk": (True, z)}
    if not z and (True, True) in found:
        out["qk_z"] = (True, True)
    return out


def curves(rows: list[dict[str, Any]], arm: Arm) -> dict[Unit, dict[float, dict[str, Any]]]:
    """``{(depth, dim, warmup, seed): {lr: row}}`` of one arm."""
    out: dict[Unit, dict[float, dict[str, Any]]] = {}
    for r in rows:
        if _arm(r) == arm:
            out.setdefault((r["depth"], r["dim"], r["warmup"], r["seed"]), {})[r["lr"]] = r
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def _unit(u: Unit) -> str:
    return f"L={u[0]} d={u[1]} s={u[3]}"


def logit_slope(curve: dict[float, dict[str, Any]]) -> float | None:
    """Least-squares slope of log(max attention logit at the end) on log LR, over the LRs where it is finite."""
    pts = [
        (math.log(lr), math.log(r["final_attn_max_logit"]))
        for lr, r in curve.items()
        if r.get("final_attn_max_logit") is not None and r["final_attn_max_logit"] > 0
    ]
    if len(pts) < 3:
        return None
    return ols_slope([p[0] for p in pts], [p[1] for p in pts]).value


def sensitivity(curve: dict[float, dict[str, Any]]) -> float:
    """Wortsman's LR sensitivity ``E_lr[min(l, l0) - l*]`` of one unit."""
    initial = [r["initial_loss"] for r in curve.values() if r["initial_loss"] is not None]
    init = float(np.mean(initial)) if initial else math.nan  # non-finite from the first step: no initial loss
    return lr_sensitivity({lr: r["final_loss"] for lr, r in curve.items()}, init)


def _logits_text(c: dict[Unit, dict[float, dict[str, Any]]], unit: Unit) -> str:
    return ", ".join(
        f"{lr_label(lr)}: {fmt(r.get('final_attn_max_logit'))}{'' if trained(r) else ' (failed)'}"
        for lr, r in c[unit].items()
    )


def w1_w2(rows: list[dict[str, Any]], a: dict[str, Arm]) -> list[Claim]:
    noqk, qk = curves(rows, a["noqk"]), curves(rows, a["qk"])
    units = sorted(set(noqk) & set(qk))
    lrs = sorted({lr for u in units for lr in noqk[u]})
    grid = f"LR grid {', '.join(lr_label(x) for x in lrs)}; units (depth, width, seed): {len(units)}"
    out = []
    s_noqk = {u: logit_slope(noqk[u]) for u in units}
    s_qk = {u: logit_slope(qk[u]) for u in units}
    ok = [u for u in units if s_noqk[u] is not None]
    example = max(units, key=lambda u: (u[0] * u[1], -u[3])) if units else None
    est = mean_interval([s_noqk[u] for u in ok], label="slope") if ok else None
    text = (
        f"Per unit, the least-squares slope of log(max attention logit at the end of training) on log LR, without "
        f"qk-norm ({grid}): {show(est)}, claim > 0. "
        + (
            f"E.g. {_unit(example)}: {_logits_text(noqk, example)} without qk-norm; "
            f"{_logits_text(qk, example)} with it. "
            if example
            else ""
        )
    )
    out.append(
        judged("W1", "Without qk-layernorm the max attention logit grows with the LR", PAPER, est, ">", 0.0, text)
    )

    top = max(lrs) if lrs else math.nan
    flags = [largest_stable_lr({lr: trained(r) for lr, r in noqk[u].items()}) < top for u in units]
    m_noqk = {u: largest_stable_lr({lr: trained(r) for lr, r in noqk[u].items()}) for u in units}
    m_qk = {u: largest_stable_lr({lr: trained(r) for lr, r in qk[u].items()}) for u in units}
    est = agreement(flags) if flags else None
    text = (
        f"Share of units whose no-qk-norm run fails at the grid's highest LR {lr_label(top)} or below (largest "
        "stable LR per unit, without / with qk-norm: "
        + "; ".join(f"{_unit(u)} {lr_text(m_noqk[u])} / {lr_text(m_qk[u])}" for u in units)
        + f"). {SHARE_RULE}."
    )
    out.append(judged("W1b", "Without qk-layernorm the loss fails at high LR", PAPER, est, ">", None, text))

    both = [u for u in units if s_noqk[u] is not None and s_qk[u] is not None]
    est = mean_interval([s_noqk[u] - s_qk[u] for u in both], label="difference") if len(both) else None
    qk_slope = mean_interval([s_qk[u] for u in both], label="slope") if both else None
    text = (
        f"Paired by unit, the log-logit slope without qk-norm minus with it: {show(est)}"
        f", claim > 0 (with qk-norm alone: {show(qk_slope)}). "
    )
    out.append(judged("W2a", "qk-layernorm removes the attention-logit growth", PAPER, est, ">", 0.0, text))

    sens = [
        (x, y) for u in units if math.isfinite(x := sensitivity(noqk[u])) and math.isfinite(y := sensitivity(qk[u]))
    ]
    est = mean_interval([x - y for x, y in sens], label="difference") if sens else None
    text = (
        "Paired by unit, Wortsman's LR sensitivity E_lr[min(l, l0) - l*] without qk-norm minus with it "
        f"(means {fmt(float(np.mean([x for x, _ in sens])) if sens else None)} and "
        f"{fmt(float(np.mean([y for _, y in sens])) if sens else None)} nats): "
        f"{show(est)}, claim > 0 (its size depends on the grid, its sign does not)."
        " The threshold form, pooled over (unit, LR) cells: "
    )
    pairs = [(noqk[u][lr], qk[u][lr]) for u in units for lr in noqk[u] if lr in qk[u]]
    d_est, ties, total = discordant(pairs)
    text += discordant_text(d_est, ties, total, "qk-norm trained where no-qk did not") + "."
    out.append(judged("W2b", "qk-layernorm lowers the LR sensitivity", PAPER, est, ">", 0.0, text))
    return out


NEAR_ZERO = 1.0  # nats: "log Z stays near 0"


def w3(rows: list[dict[str, Any]], a: dict[str, Arm]) -> list[Claim]:
    """W3a: z-loss pulls |log Z| down (paired, at the highest LR where both runs of a unit trained); W3b: with
    z-loss, |log Z| ends within ``NEAR_ZERO`` nats of 0."""
    t3a, t3b = "z-loss keeps log Z closer to 0 than training without it", "With z-loss, log Z stays near 0"
    if "qk_z" not in a:
        why = "the study has no z-loss arm"
        return [judged(c, t, PAPER, None, ">", 0.0, "", none_why=why) for c, t in (("W3a", t3a), ("W3b", t3b))]
    plain, z = curves(rows, a["qk"]), curves(rows, a["qk_z"])
    diffs, with_z, picked = [], [], []
    for u in sorted(set(plain) & set(z)):
        both = [
            lr
            for lr in plain[u]
            if lr in z[u]
            and trained(plain[u][lr])
            and trained(z[u][lr])
            and plain[u][lr].get("final_log_z") is not None
            and z[u][lr].get("final_log_z") is not None
        ]
        if both:
            lr = max(both)
            p, q = plain[u][lr]["final_log_z"], z[u][lr]["final_log_z"]
            diffs.append(abs(p) - abs(q))
            with_z.append(abs(q))
            picked.append(f"{_unit(u)} lr {lr_label(lr)}: {fmt(p)} vs {fmt(q)}")
    est = mean_interval(diffs, label="difference") if diffs else None
    where = (
        "Mean log Z of the output softmax at the end of training, at the highest LR where both runs of a unit "
        "trained, without z-loss vs with z-loss 1e-4 (log V = ln 256 = 5.55 for all-equal logits): " + "; ".join(picked)
    )
    text = f"{where}. Paired |log Z| without minus with z-loss: {show(est)}, claim > 0."
    near = mean_interval(with_z, label="mean |log Z|") if with_z else None
    text_b = f"{where}. |log Z| with z-loss: {show(near)}, claim < {NEAR_ZERO:g} nat."
    return [
        judged("W3a", t3a, PAPER, est, ">", 0.0, text, SCALE_LOGZ),
        judged("W3b", t3b, PAPER, near, "<", NEAR_ZERO, text_b, SCALE_LOGZ),
    ]


def w4(rows: list[dict[str, Any]], a: dict[str, Arm]) -> Claim:
    title = "LR sensitivity grows faster with depth than with width"
    sizes = sorted({(r["depth"], r["dim"]) for r in rows if _arm(r) in (a["noqk"], a["qk"])})
    base = min(sizes) if sizes else None
    deeper = [s for s in sizes if base and s[1] == base[1] and s[0] > base[0]]
    wider = [s for s in sizes if base and s[0] == base[0] and s[1] > base[1]]
    if not deeper or not wider:
        return judged("W4", title, PAPER, None, ">", 0.0, "", none_why="the grid lacks a deeper and a wider size")
    deep, wide = max(deeper), max(wider)
    diffs, parts = [], []
    for name in ("noqk", "qk"):
        c = curves(rows, a[name])
        for w, s in sorted({(u[2], u[3]) for u in c}):
            keys = [(base[0], base[1], w, s), (deep[0], deep[1], w, s), (wide[0], wide[1], w, s)]
            if all(k in c for k in keys):
                b, dd, ww = (sensitivity(c[k]) for k in keys)
                if not all(math.isfinite(v) for v in (b, dd, ww)):
                    continue
                diffs.append((dd - b) - (ww - b))
                parts.append(f"{name} s={s}: {fmt(b)} base, {fmt(dd)} deeper, {fmt(ww)} wider")
    est = mean_interval(diffs, label="difference") if diffs else None
    text = (
        f"LR sensitivity at the base size (L={base[0]}, d={base[1]}), deeper (L={deep[0]}) and wider (d={wide[1]}), "
        f"per arm and seed: {'; '.join(parts)}. Paired increase with depth minus increase with width: "
        f"{show(est)}, claim > 0."
    )
    return judged("W4", title, PAPER, est, ">", 0.0, text, SCALE_DEPTH)


def wortsman_claims(rows: list[dict[str, Any]]) -> list[Claim]:
    """W1-W4 when the study has Pre-LN arms with and without qk-norm over at least three LRs; [] otherwise."""
    a = arms(rows)
    if a is None or len({r["lr"] for r in rows}) < 3:
        return []
    return [*w1_w2(rows, a), *w3(rows, a), w4(rows, a)]
