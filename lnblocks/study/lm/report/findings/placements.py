"""Each norm placement's own published claim, checked at the scale of the study (docs/study-claims.md): DeepNorm
(D1), Sandwich / Peri-LN (P1), ResiDual (R1), Mix-LN (M1), DyT (Y1), no norm and ReZero (Z1), LayerNorm Scaling (S1).

Trained-run claims pool the (depth, LR, warmup, seed) cells they cover (``configs/placements.yaml`` has one seed);
init-gradient claims use the fresh seeds of the init profile, paired by seed at the deepest depth.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lnblocks.study.core.claims import Claim, judged, not_tested
from lnblocks.study.core.stats import Estimate, agreement, mean_interval, ols_slope
from lnblocks.study.lm.report.findings.common import (
    SHARE_RULE,
    discordant,
    discordant_text,
    fmt,
    paired_cells,
    positive,
    roles,
    show,
    threshold_text,
    trained,
)
from lnblocks.study.lm.report.init_profile import InitProfile

DEEPNORM = "Wang et al. 2022 (2203.00555)"
PERI = "Ding et al. 2021 (2105.13290); Kim et al. 2025 (2502.02732)"
RESIDUAL = "Xie et al. 2023 (2304.14802)"
MIXLN = "Li et al. 2024 (2412.13795)"
DYT = "Zhu et al. 2025 (2503.10622)"
REZERO = "Bachlechner et al. 2020 (2003.04887)"
LNS = "Sun et al. 2025 (2502.05795)"
DYT_MARGIN = 0.05  # nats: "matches LayerNorm"


def _threshold_claim(rows, cid, title, paper, low, high, keep, what, scale="") -> Claim:
    pairs = paired_cells(rows, low, high, keep)
    est, ties, total = discordant((a, b) for _, a, b in pairs)
    text = (
        f"Threshold claim pooled over the {what} cells: "
        + discordant_text(est, ties, total, f"{high} trained where {low} did not")
        + f". {SHARE_RULE}. "
        + threshold_text(rows, [low, high], lambda k: keep((k[0], 0.0, k[1], k[2])))
        + "."
    )
    return judged(cid, title, paper, est, ">", None, text, scale)


def _paired(
    rows,
    a,
    b,
    value: Callable[[dict], float | None],
    label="difference",
    keep: Callable[[tuple], bool] = lambda c: True,
) -> tuple[Estimate | None, int]:
    """Mean over cells (that ``keep`` accepts) where both trained of ``value(a) - value(b)``, and how many cells."""
    diffs = []
    for _, ra, rb in paired_cells(rows, a, b, keep):
        va, vb = value(ra), value(rb)
        if trained(ra) and trained(rb) and va is not None and vb is not None:
            diffs.append(va - vb)
    return (mean_interval(diffs, label=label) if diffs else None), len(diffs)


def _deepest(profiles: list[InitProfile], arches: list[str], allowed: set[int] | None = None) -> int | None:
    """The deepest depth (>= 2: a slope over layers needs two; among ``allowed`` if given) at which every arch has
    an init profile with a gradient in every layer (the slopes take its log)."""
    depths = [set(p.depth for p in profiles if p.arch == a and p.w2 and positive(p.w2)) for a in arches]
    common = {d for d in set.intersection(*depths) if d >= 2} if depths else set()
    if allowed is not None:
        common &= allowed
    return max(common) if common else None


def _mixed_depths(rows: list[dict[str, Any]], arch: str) -> tuple[set[int] | None, list[int]]:
    """The depths at which the Mix-LN arm ``arch`` has both Post-LN and Pre-LN layers, and the depths at which it
    has one kind only (plain Pre-LN or Post-LN there); (None, []) when the rows do not say (a summary written
    before ``mix_post_layers``)."""
    known = [(r["depth"], r.get("mix_post_layers")) for r in rows if r["arch"] == arch]
    if not known or any(n is None for _, n in known):
        return None, []
    mixed = {d for d, n in known if 0 < n < d}
    return mixed, sorted({d for d, n in known if not 0 < n < d})


def _slopes(profiles: list[InitProfile], arch: str, depth: int, absolute: bool = False) -> dict[int, float]:
    """Per seed: the least-squares slope of log ||grad W_2|| on the layer index (its absolute value)."""
    p = next(p for p in profiles if p.arch == arch and p.depth == depth)
    x = list(range(1, depth + 1))
    out = {}
    for s, w in zip(p.seeds, p.w2):
        v = ols_slope(x, [math.log(g) for g in w]).value
        out[s] = abs(v) if absolute else v
    return out


def _paired_seeds(a: dict[int, float], b: dict[int, float]) -> Estimate | None:
    common = sorted(set(a) & set(b))
    return mean_interval([a[s] - b[s] for s in common], label="difference") if len(common) > 1 else None


def deepnorm(rows: list[dict[str, Any]], r: dict[str, str]) -> Claim:
    return _threshold_claim(
        rows,
        "D1",
        "DeepNorm trains deep Post-LN-style stacks without warmup",
        DEEPNORM,
        r["post"],
        r["deepnorm"],
        lambda c: c[2] == 0,
        "no-warmup (depth, LR, seed)",
        "the 'performance of Post-LN' half needs long training; the 1,000-layer claim far more depth",
    )


def peri(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    def log_rms(row: dict) -> float | None:
        v = row.get("final_residual_rms_last")
        return math.log(v) if v else None

    est, n = _paired(rows, r["pre"], r["sandwich"], log_rms)
    text = (
        "log(RMS of the last residual stream after training), Pre-LN minus Sandwich/Peri-LN, paired over the "
        f"{n} (depth, LR, warmup, seed) cells where both trained: {show(est)}, "
        f"claim > 0 (Peri-LN's output norms tame hidden-state growth)."
    )
    growth = judged(
        "P1",
        "Sandwich/Peri-LN keeps the residual stream smaller than Pre-LN",
        PERI,
        est,
        ">",
        0.0,
        text,
        "CogView's fp16 overflow and the loss gains (400M+ parameters) need GPU scale",
    )
    stab = _threshold_claim(
        rows,
        "P1b",
        "Sandwich/Peri-LN trains where Pre-LN does",
        PERI,
        r["pre"],
        r["sandwich"],
        lambda c: True,
        "(depth, LR, warmup, seed)",
    )
    return [growth, stab]


def residual(rows: list[dict[str, Any]], r: dict[str, str], profiles: list[InitProfile]) -> list[Claim]:
    out = []
    d = _deepest(profiles, [r["post"], r["resi_dual"]])
    if d is None:
        out.append(
            not_tested(
                "R1", "ResiDual avoids Post-LN's gradient vanishing at init", RESIDUAL, NO_PROFILE.format("both arms")
            )
        )
    else:
        post, resi = _slopes(profiles, r["post"], d), _slopes(profiles, r["resi_dual"], d)
        est = _paired_seeds(post, resi)
        text = (
            f"Per seed at L={d}, the slope of log ||grad W_2|| on the layer index (Post-LN "
            f"{mean_interval(list(post.values()))}; ResiDual {mean_interval(list(resi.values()))}), "
            f"Post-LN minus ResiDual paired by seed: {show(est)}, claim > 0 "
            f"(ResiDual's early layers keep their gradient)."
        )
        out.append(
            judged(
                "R1",
                "ResiDual avoids Post-LN's gradient vanishing at init",
                RESIDUAL,
                est,
                ">",
                0.0,
                text,
                "the representation-collapse and BLEU claims need translation-scale training",
                none_why="one seed: no pairs to compare",
            )
        )
    out.append(
        _threshold_claim(
            rows,
            "R1b",
            "ResiDual trains deep without warmup where Post-LN does not",
            RESIDUAL,
            r["post"],
            r["resi_dual"],
            lambda c: c[2] == 0,
            "no-warmup (depth, LR, seed)",
        )
    )
    return out


NO_PROFILE = "no init profile of {} at a depth >= 2 with a gradient in every layer (a slope over layers needs two)"


def mix_ln(rows: list[dict[str, Any]], r: dict[str, str], profiles: list[InitProfile]) -> list[Claim]:
    out = []
    title = "Mix-LN's gradient norms are more uniform across layers than {}'s"
    mixed, pure = _mixed_depths(rows, r["mix_ln"])
    one_kind = (
        f"at L = {', '.join(map(str, pure))} floor(mix_post_fraction * L) leaves Mix-LN with one kind of layer "
        "(plain Pre-LN or Post-LN)"
    )
    note = f" Left out: {one_kind}." if pure else ""
    keep: Callable[[tuple], bool] = (lambda c: True) if mixed is None else (lambda c: c[0] in mixed)
    d = _deepest(profiles, [r["pre"], r["post"], r["mix_ln"]], mixed)
    for cid, other in (("M1", "pre"), ("M1b", "post")):
        name = "Pre-LN" if other == "pre" else "Post-LN"
        if d is None:
            if mixed is not None and not mixed:
                why = f"Mix-LN mixes at no depth of the grid: {one_kind}."
            else:
                why = NO_PROFILE.format(f"{name} and Mix-LN") + (" where Mix-LN mixes." if pure else ".") + note
            out.append(Claim(cid, title.format(name), MIXLN, None, f"Not tested: {why}"))
            continue
        a, m = _slopes(profiles, r[other], d, absolute=True), _slopes(profiles, r["mix_ln"], d, absolute=True)
        est = _paired_seeds(a, m)
        text = (
            f"At init, L={d}: |slope| of log ||grad W_2|| on the layer index per seed ({name} "
            f"{mean_interval(list(a.values()))}; Mix-LN {mean_interval(list(m.values()))}), {name} minus "
            f"Mix-LN paired by seed: {show(est)}, claim > 0."
        )
        after, n = _paired(
            rows,
            r[other],
            r["mix_ln"],
            lambda row: abs(row["final_gradW2_slope"]) if row.get("final_gradW2_slope") is not None else None,
            keep=keep,
        )
        text += (
            f" After training (last logged step), the same difference over the {n} cells where both trained: "
            f"{show(after)} (reported, not the verdict).{note}"
        )
        out.append(
            judged(
                cid, title.format(name), MIXLN, est, ">", 0.0, text, "the perplexity claims start at 70M",
                none_why="one seed: no pairs to compare",
            )
        )  # fmt: skip
    return out


def dyt(rows: list[dict[str, Any]], r: dict[str, str]) -> Claim:
    est, n = _paired(rows, r["dyt"], r["pre"], lambda row: row["final_loss"])
    text = (
        f"Final eval loss, DyT minus LayerNorm (both Pre-LN), paired over the {n} (depth, LR, warmup, seed) cells "
        f"where both trained: {show(est)} nats, claim < +{DYT_MARGIN} (matches or "
        f"beats LayerNorm). docs/study-claims.md checks alpha_0 = 0.2-4: none closes the gap at 300 "
        "steps, which shrinks with training (a convergence-speed gap)."
    )
    return judged(
        "Y1",
        "DyT matches LayerNorm",
        DYT,
        est,
        "<",
        DYT_MARGIN,
        text,
        "longer runs (1,000+ steps) and the paper's per-position alpha_0 (LLaMA recipe)",
    )


def rezero(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    out = []
    none = [row for row in rows if row["arch"] == r["none"]]
    deepest = max((row["depth"] for row in none), default=None)
    runs = [row for row in none if row["depth"] == deepest]
    est = agreement([not trained(row) for row in runs]) if runs else None
    text = (
        f"Share of the no-norm runs at the deepest depth L={deepest} (every LR, warmup and seed) that failed "
        f"(stuck or diverged): {show(est)}; final losses "
        + ", ".join(fmt(row["final_loss"]) for row in sorted(runs, key=lambda x: (x["lr"], x["warmup"])))
        + f". {SHARE_RULE}."
    )
    out.append(judged("Z1", "With no normalization, deep stacks fail", REZERO, est, ">", None, text))
    if "rezero" in r:
        out.append(
            _threshold_claim(
                rows,
                "Z1b",
                "ReZero trains the no-norm stack",
                REZERO,
                r["none"],
                r["rezero"],
                lambda c: True,
                "(depth, LR, warmup, seed)",
                "the 56%-faster claim (enwik8) needs longer runs",
            )
        )
    return out


def layer_scaling(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    def deep_half(row: dict) -> float | None:
        return row.get("ablation_deep_half")

    est, n = _paired(rows, r["lns"], r["pre"], deep_half)
    text = (
        "Eval-loss increase when one block is skipped, mean over the deeper half of the layers, LayerNorm Scaling "
        f"minus Pre-LN, paired over the {n} cells where both trained: {show(est)} "
        f"nats, claim > 0 (deeper layers contribute more)."
    )
    scale = "the paper's variance growth is a 130M+ / billions-of-tokens effect"
    out = [
        judged(
            "S1",
            "LayerNorm Scaling makes the deeper layers contribute more",
            LNS,
            est,
            ">",
            0.0,
            text,
            scale,
            none_why="no layer-ablation data (diagnostics.layer_ablation)",
        )
    ]

    def log_rms(row: dict) -> float | None:
        v = row.get("final_residual_rms_last")
        return math.log(v) if v else None

    est, n = _paired(rows, r["pre"], r["lns"], log_rms)
    text = (
        f"log RMS of the last residual stream after training, Pre-LN minus LNS, over the {n} cells where both "
        f"trained: {show(est)}, claim > 0 (LNS curbs Pre-LN's output-variance "
        f"growth)."
    )
    out.append(judged("S1b", "LayerNorm Scaling curbs Pre-LN's residual growth", LNS, est, ">", 0.0, text, scale))
    return out


def placement_claims(rows: list[dict[str, Any]], profiles: list[InitProfile]) -> list[Claim]:
    """Every placement claim whose arms the study has (by placement family, ``common.roles``)."""
    r = roles(rows)
    out: list[Claim] = []
    if {"post", "deepnorm"} <= set(r):
        out.append(deepnorm(rows, r))
    if {"pre", "sandwich"} <= set(r):
        out += peri(rows, r)
    if {"post", "resi_dual"} <= set(r):
        out += residual(rows, r, profiles)
    if {"pre", "post", "mix_ln"} <= set(r):
        out += mix_ln(rows, r, profiles)
    if {"pre", "dyt"} <= set(r):
        out.append(dyt(rows, r))
    if "none" in r:
        out += rezero(rows, r)
    if {"pre", "lns"} <= set(r):
        out += layer_scaling(rows, r)
    return out
