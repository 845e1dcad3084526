"""The 2025-26 claims about norms, optimizers and placements (docs/study-claims.md): Derf against LayerNorm, DyT
and RMSNorm and its generalization gap (DF1-DF4), the norm x optimizer interaction under Muon (NO1-NO3), HybridNorm
(HN1, HN2), SiameseNorm (SN1, SN2) and nGPT's steps to a target loss (NG1, NG2).

Trained-run claims pool the (depth, LR, warmup, seed) cells they cover, as the placement claims do; a cell pairs
runs of one seed, one LR, one depth and one warmup.
"""

from __future__ import annotations

import math
from typing import Any

from lnblocks.study.core.claims import Claim, judged
from lnblocks.study.core.stats import agreement
from lnblocks.study.lm.report.findings.common import (
    SHARE_RULE,
    cells,
    discordant,
    discordant_text,
    fmt,
    paired_cells,
    show,
    threshold_text,
    trained,
)
from lnblocks.study.lm.report.findings.frontier_arms import interval, loss_claim, missing, paired

DERF = "Chen et al. 2025 (2512.10938)"
NORM_OPT = "Abouzeid 2026 (2604.01563)"
HYBRID = "Zhuo et al. 2025 (2503.04598)"
SIAMESE = "Li et al. 2026 (2602.08064)"
NGPT = "Loshchilov et al. 2024 (2410.01131)"
MARGIN = 0.05  # nats: "no such penalty", as "matches LayerNorm" (Y1)
SCALE_DERF = "the paper's language models are GPT-2 124M on OpenWebText (val 2.94): 100M+ parameters, 1B+ tokens"
SCALE_MUON = "the paper's gaps are at 1B parameters and 1,000 steps"
SCALE_HYBRID = "the paper's dense and MoE models are 550M-7B"
SCALE_SIAMESE = "the paper's stable-LR and perplexity results are 350M-1.3B (lr up to 2e-3)"
SCALE_NGPT = "the paper's 4-20x is at 0.5B-1B parameters over 10^9+ tokens"


def derf(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    out = [
        loss_claim(rows, r, "DF1", "Derf beats LayerNorm", DERF, "derf", "pre", SCALE_DERF),
        loss_claim(rows, r, "DF2", "Derf beats DyT", DERF, "derf", "dyt", SCALE_DERF),
        loss_claim(rows, r, "DF3", "Derf beats RMSNorm", DERF, "derf", "pre_rms", SCALE_DERF),
    ]
    title = "Derf's gain is generalization: a smaller train-val gap than LayerNorm's"
    absent = missing("DF4", title, DERF, r, ["derf", "pre"])
    if absent is not None:
        return [*out, absent]
    gaps, total = paired(rows, r["derf"], r["pre"], lambda row: row.get("gen_gap"))
    train_side, _ = paired(rows, r["derf"], r["pre"], lambda row: row.get("train_eval_loss"))
    est = interval(gaps)
    text = (
        "Train-val gap in eval mode (held-out eval loss minus the eval-mode loss on fixed training windows), Derf "
        f"minus LayerNorm, paired over the {len(gaps)} cells where both trained (of {total}): {show(est)} nats, "
        f"claim < 0. The eval-mode training loss itself, Derf minus LayerNorm: {show(interval(train_side))} (the "
        "paper: higher for Derf)."
    )
    out.append(judged("DF4", title, DERF, est, "<", 0.0, text, SCALE_DERF, none_why="no cell where both trained"))
    return out


def _interaction(rows: list[dict[str, Any]], r: dict[str, str], norm: str, base: str = "pre_rms") -> list[float]:
    """Per cell where all four trained: ``(norm - base)`` under Muon minus ``(norm - base)`` under AdamW/Adam."""
    arms = [r[norm], r[base], r[f"{norm}+muon"], r[f"{base}+muon"]]
    tables = [cells(rows, a) for a in arms]
    out = []
    for c in sorted(set.intersection(*(set(t) for t in tables))):
        a, b, am, bm = (t[c] for t in tables)
        if all(trained(x) for x in (a, b, am, bm)):
            out.append((am["final_loss"] - bm["final_loss"]) - (a["final_loss"] - b["final_loss"]))
    return out


def norm_optimizer(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    out = []
    title = "Muon widens Derf's gap to RMSNorm (norm x optimizer interaction)"
    needs = ["derf", "pre_rms", "derf+muon", "pre_rms+muon"]
    absent = missing("NO1", title, NORM_OPT, r, needs)
    inter = _interaction(rows, r, "derf") if absent is None else []
    if absent is not None:
        out.append(absent)
    else:
        adam, _ = paired(rows, r["derf"], r["pre_rms"], lambda row: row["final_loss"])
        muon, _ = paired(rows, r["derf+muon"], r["pre_rms+muon"], lambda row: row["final_loss"])
        est = interval(inter, "interaction")
        text = (
            "Interaction term per (depth, LR, warmup, seed) cell where all four runs trained: (Derf - RMSNorm) under "
            f"Muon minus (Derf - RMSNorm) under Adam(W): {show(est)} nats, claim > 0. The gaps themselves: Adam(W) "
            f"{show(interval(adam))}, Muon {show(interval(muon))} (paper at 1B, 1,000 steps: 0.31 and 0.97 nats)."
        )
        out.append(
            judged("NO1", title, NORM_OPT, est, ">", 0.0, text, SCALE_MUON, none_why="no cell where all trained")
        )
    title = "DyT shows no such penalty under Muon"
    absent = missing("NO2", title, NORM_OPT, r, ["dyt", "pre_rms", "dyt+muon", "pre_rms+muon"])
    if absent is not None:
        out.append(absent)
    else:
        est = interval(_interaction(rows, r, "dyt"), "interaction")
        text = (
            "The same interaction term for DyT in place of Derf: "
            f"{show(est)} nats, claim < +{MARGIN} (no penalty beyond the margin)."
        )
        out.append(
            judged("NO2", title, NORM_OPT, est, "<", MARGIN, text, SCALE_MUON, none_why="no cell where all trained")
        )
    out.append(_alpha_recovery(rows, r, inter))
    return out


def _alpha_recovery(rows: list[dict[str, Any]], r: dict[str, str], inter: list[float]) -> Claim:
    title = "alpha_0 0.3 recovers most of Derf's Muon penalty"
    low = next((k.removesuffix("+muon") for k in r if k.startswith("derf_a") and k.endswith("+muon")), None)
    if low is None or low not in r:
        return judged("NO3", title, NORM_OPT, None, ">", 0.0, "", none_why="the study has no Derf arm with another "
                      "alpha_0 under both optimizers")  # fmt: skip
    absent = missing("NO3", title, NORM_OPT, r, ["derf", "pre_rms", "derf+muon", "pre_rms+muon"])
    if absent is not None:
        return absent
    default = dict(zip(_interaction_cells(rows, r, "derf"), _interaction(rows, r, "derf")))
    other = dict(zip(_interaction_cells(rows, r, low), _interaction(rows, r, low)))
    both = sorted(set(default) & set(other))
    values = [default[c] / 2 - other[c] for c in both]  # > 0: the other alpha_0 keeps less than half the penalty
    est = interval(values)
    at_default, at_other = interval([default[c] for c in both]), interval([other[c] for c in both])
    text = (
        f"Per cell where all six runs trained: half the interaction at alpha_0 = 0.5 minus the interaction at "
        f"{low.removeprefix('derf_a')} ({len(values)} cells; interaction at 0.5: {show(at_default)}, at the other: "
        f"{show(at_other)}): {show(est)}, claim > 0 (at least half the penalty recovered; the paper: about 80%)."
    )
    return judged("NO3", title, NORM_OPT, est, ">", 0.0, text, SCALE_MUON, none_why="no cell where all trained")


def _interaction_cells(rows: list[dict[str, Any]], r: dict[str, str], norm: str, base: str = "pre_rms") -> list:
    """The cells ``_interaction`` reads, in its order."""
    tables = [cells(rows, a) for a in (r[norm], r[base], r[f"{norm}+muon"], r[f"{base}+muon"])]
    common = sorted(set.intersection(*(set(t) for t in tables)))
    return [c for c in common if all(trained(t[c]) for t in tables)]


def hybridnorm(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    out = [
        loss_claim(rows, r, "HN1", "HybridNorm beats Pre-LN", HYBRID, "hybridnorm", "pre", SCALE_HYBRID),
        loss_claim(rows, r, "HN2", "HybridNorm beats Post-LN", HYBRID, "hybridnorm", "post", SCALE_HYBRID),
    ]
    if "post" in r:
        pairs = paired_cells(rows, r["post"], r["hybridnorm"])
        est, ties, total = discordant((a, b) for _, a, b in pairs)
        note = " Where only one trained: " + discordant_text(
            est, ties, total, "HybridNorm trained where Post-LN did not"
        )
        last = out[-1]
        out[-1] = Claim(last.id, last.title, last.paper, last.verdict, last.text + note, last.scale)
    return out


def siamese(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    title = "SiameseNorm trains at LRs where Post-LN fails"
    absent = missing("SN1", title, SIAMESE, r, ["siamese", "post"])
    if absent is not None:
        out = [absent]
    else:
        pairs = paired_cells(rows, r["post"], r["siamese"])
        est, ties, total = discordant((a, b) for _, a, b in pairs)
        text = (
            "Threshold claim pooled over the (depth, LR, warmup, seed) cells: "
            + discordant_text(est, ties, total, "SiameseNorm trained where Post-LN did not")
            + f". {SHARE_RULE}. "
            + threshold_text(rows, [r["post"], r["siamese"]])
            + "."
        )
        out = [judged("SN1", title, SIAMESE, est, ">", None, text, SCALE_SIAMESE)]
    out.append(loss_claim(rows, r, "SN2", "SiameseNorm reaches a lower loss than Pre-LN", SIAMESE, "siamese", "pre",
                          SCALE_SIAMESE))  # fmt: skip
    return out


def _steps(row: dict[str, Any]) -> float:
    """Steps to the target loss; a run that never reached it: infinity (it needs more than it ran)."""
    s = row.get("steps_to_target")
    return math.inf if s is None else float(s)


def ngpt(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    titles = ("nGPT reaches Pre-LN's loss in fewer steps", "nGPT reaches Pre-LN's loss in 4x fewer steps or less")
    absent = missing("NG1", titles[0], NGPT, r, ["ngpt", "pre"])
    target = next((row.get("target_loss") for row in rows if row.get("target_loss") is not None), None)
    if absent is not None or target is None:
        why = "analysis.target_loss is not set" if absent is None else None
        if why:
            return [judged(c, t, NGPT, None, ">", None, "", none_why=why) for c, t in zip(("NG1", "NG2"), titles)]
        return [absent, missing("NG2", titles[1], NGPT, r, ["ngpt", "pre"])]  # type: ignore[list-item]
    pairs = [(a, b) for _, a, b in paired_cells(rows, r["pre"], r["ngpt"]) if min(_steps(a), _steps(b)) < math.inf]
    reached = [(_steps(a), _steps(b)) for a, b in pairs]
    fewer = [b < a for a, b in reached if a != b]
    # 4x: decidable where nGPT reached it and Pre-LN did too, or Pre-LN's lower bound (its steps + 1) already is 4x
    four = [4 * sb <= (sa if sa < math.inf else a["steps_done"] + 1) for (a, _), (sa, sb) in zip(pairs, reached)
            if sb < math.inf and (sa < math.inf or 4 * sb <= a["steps_done"] + 1)]  # fmt: skip
    ratios = sorted(a / b for a, b in reached if a < math.inf and b < math.inf)
    median = ratios[len(ratios) // 2] if ratios else None
    steps = ", ".join(f"{fmt(a, 4)}/{fmt(b, 4)}" for a, b in reached) or "none"
    common = (
        f"Steps until the mean training loss over the last train.final_window steps is at or below "
        f"{target:g} nats (never: more than the run's steps), Pre-LN/nGPT per cell where one reached it: {steps}; "
        f"median ratio where both did {fmt(median)}. "
    )
    one = agreement(fewer) if fewer else None
    text1 = (
        common + f"Share of the {len(fewer)} cells (ties left out) where nGPT needed fewer: {show(one)}. {SHARE_RULE}."
    )
    est4 = agreement(four) if four else None
    text4 = (
        common + f"Share of the {len(four)} decidable cells where nGPT needed at most 1/4: {show(est4)}. {SHARE_RULE}."
    )
    return [
        judged("NG1", titles[0], NGPT, one, ">", None, text1, SCALE_NGPT, none_why="no cell where one reached it"),
        judged("NG2", titles[1], NGPT, est4, ">", None, text4, SCALE_NGPT, none_why="no decidable cell"),
    ]
