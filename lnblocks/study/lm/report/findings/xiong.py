"""Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture" (arXiv 2002.04745): claims X1-X8 of
docs/study-claims.md, each a statistic with its interval and a three-valued verdict.

X1-X5 read the gradient profile at init over many fresh seeds (``lnblocks.study.lm.report.init_profile``); X6-X8 are
threshold claims on the trained runs, stated so that a wider LR grid cannot flip them: they compare where each arm
stops training (its largest stable LR), pooled over the cells of the grid as discordant run pairs.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from lnblocks.study.core.claims import Claim, judged
from lnblocks.study.core.stats import mean_interval, slope_over_seeds
from lnblocks.study.lm.report.findings.common import (
    SHARE_RULE,
    discordant,
    discordant_text,
    fmt,
    paired_cells,
    positive,
    roles,
    threshold_text,
)
from lnblocks.study.lm.report.init_profile import InitProfile

PAPER = "Xiong et al. 2020 (2002.04745)"
GRAD_RULE = "per-seed least-squares slope of log ||grad W_2|| on the layer index l = 1..L, mean over seeds"


def _by_depth(profiles: list[InitProfile], arch: str) -> dict[int, InitProfile]:
    """The arch's profiles by depth, those with a gradient in every layer (the claims fit its log)."""
    return {p.depth: p for p in profiles if p.arch == arch and p.w2 and positive(p.w2)}


def _ratio_text(prof: dict[int, InitProfile]) -> str:
    """Mean over seeds of last/first, and the fitted slope, per depth."""
    parts = []
    for d, p in sorted(prof.items()):
        ratio = mean_interval([w[-1] / w[0] for w in p.w2])
        slope = slope_over_seeds(p.w2) if d > 1 else None
        parts.append(f"L={d}: last/first {ratio}" + (f", {slope}" if slope is not None else ""))
    return "; ".join(parts)


def profile_claims(profiles: list[InitProfile], pre: str, post: str) -> list[Claim]:
    """X1-X5 from the init profiles of the arms ``pre`` and ``post``."""
    out = []
    pre_p, post_p = _by_depth(profiles, pre), _by_depth(profiles, post)
    source = next(iter(pre_p.values()), next(iter(post_p.values()), None))
    how = ""
    if source is not None:
        which = f"fresh seeds {source.seeds[0]}..{source.seeds[-1]}" if source.source == "init_profile" else "run seeds"
        how = f"expected gradient over {source.batches} batches, {len(source.seeds)} inits per depth ({which})"
    for cid, arch, prof, side, title in (
        ("X1", post, post_p, ">", "Post-LN's gradient grows toward the output layers at init"),
        ("X2", pre, pre_p, "<", "Pre-LN's gradient does not grow toward the output layers at init"),
    ):
        deep = [d for d in prof if d > 1]
        if not deep:
            out.append(
                judged(cid, title, PAPER, None, side, 0.0, "", none_why=f"no init profile of {arch} deeper than 1")
            )
            continue
        d = max(deep)
        est = slope_over_seeds(prof[d].w2)
        text = (
            f"{GRAD_RULE} ({how}), judged at the deepest depth L={d}: {est}, claim slope {side} 0. By depth: "
            f"{_ratio_text(prof)}."
        )
        out.append(judged(cid, title, PAPER, est, side, 0.0, text))

    out += _theorem1(pre_p, post_p, how)
    out.append(_lemma2(pre_p))
    return out


def _last_by_depth(prof: dict[int, InitProfile]) -> tuple[list[int], list[list[float]], list[int]]:
    """Depths, per-seed last-layer norms across them (seeds every depth has), and those seeds."""
    depths = sorted(prof)
    seeds = sorted(set.intersection(*(set(prof[d].seeds) for d in depths))) if depths else []
    table = [[prof[d].w2[prof[d].seeds.index(s)][-1] for d in depths] for s in seeds]
    return depths, table, seeds


def _theorem1(pre_p: dict[int, InitProfile], post_p: dict[int, InitProfile], how: str) -> list[Claim]:
    """X3 (Pre-LN's last layer shrinks with depth, Theorem 1's O(1/sqrt L)) and X4 (Post-LN's does not shrink the
    way Pre-LN's does: paired slope difference)."""
    title3 = "Pre-LN's last-layer gradient shrinks with depth, O(1/sqrt L) (Theorem 1)"
    title4 = "Post-LN's last-layer gradient does not shrink with depth as Pre-LN's does (Theorem 1)"
    depths, table, seeds = _last_by_depth(pre_p)
    if len(depths) < 2 or not seeds:
        return [
            judged("X3", title3, PAPER, None, "<", 0.0, "", none_why="the grid has one depth"),
            judged("X4", title4, PAPER, None, ">", 0.0, "", none_why="the grid has one depth"),
        ]
    x = list(np.log(depths))
    est = slope_over_seeds(table, x=x)
    means = [float(np.mean([t[i] for t in table])) for i in range(len(depths))]
    text = (
        f"Per seed, the least-squares slope of log ||grad W_2|| of the last layer on log L over L = "
        f"{', '.join(map(str, depths))} ({how}); mean norms {', '.join(fmt(m) for m in means)}: {est}, claim "
        f"slope < 0. Theorem 1's upper bound has slope -1/2, which the interval "
        f"{'contains' if est.contains(-0.5) else 'does not contain'} (a bound, not the verdict)."
    )
    out = [judged("X3", title3, PAPER, est, "<", 0.0, text)]
    post_depths, post_table, post_seeds = _last_by_depth(post_p)
    common = sorted(set(seeds) & set(post_seeds))
    if post_depths != depths or len(common) < 2:
        out.append(judged("X4", title4, PAPER, None, ">", 0.0, "", none_why="Post-LN lacks the same depths and seeds"))
        return out
    pre_s = [slope_over_seeds([table[seeds.index(s)]], x=x).value for s in common]
    post_s = [slope_over_seeds([post_table[post_seeds.index(s)]], x=x).value for s in common]
    diff = mean_interval([b - a for a, b in zip(pre_s, post_s)], label="difference")
    post_means = [float(np.mean([t[i] for t in post_table])) for i in range(len(depths))]
    text = (
        f"The same log-log slope for Post-LN (mean last-layer norms {', '.join(fmt(m) for m in post_means)}) minus "
        f"Pre-LN's, paired by seed: {diff}, claim > 0."
    )
    out.append(judged("X4", title4, PAPER, diff, ">", 0.0, text))
    return out


def _lemma2(pre_p: dict[int, InitProfile]) -> Claim:
    title = "Pre-LN's residual stream grows linearly with depth at init (Lemma 2)"
    with_rms = {d: p for d, p in pre_p.items() if p.residual_rms and d > 1}
    if not with_rms:
        return judged("X5", title, PAPER, None, ">", 0.0, "", none_why="no residual-stream RMS at init")
    d = max(with_rms)
    sq = [[v * v for v in r] for r in with_rms[d].residual_rms]
    est = slope_over_seeds(sq, x=list(range(d + 1)), log_y=False)
    inside = est.low >= 0.5 and est.high <= 1.5
    text = (
        f"Per seed, the least-squares slope of RMS(x_l)^2 = ||x_l||^2/d on l = 0..{d} (the stream after the "
        f"embedding and each block; Pre-LN, L={d}): {est}, claim slope > 0. Lemma 2 bounds it by 1/2 ... 3/2 "
        f"per layer (it assumes W_Q = W_K = 0); the interval {'lies' if inside else 'does not lie'} within them."
    )
    return judged("X5", title, PAPER, est, ">", 0.0, text)


def trained_claims(rows: list[dict[str, Any]], pre: str, post: str) -> list[Claim]:
    """X6-X8: where Post-LN stops training, against Pre-LN, depth and warmup."""
    out = []
    pairs = paired_cells(rows, post, pre)
    est, ties, total = discordant((a, b) for _, a, b in pairs)
    text = (
        "Threshold claim, pooled over every (depth, LR, warmup, seed) cell of the grid: "
        + discordant_text(est, ties, total, "Pre-LN trained where Post-LN did not")
        + f". {SHARE_RULE}. A cell counts once per run pair; cells of one seed share its init. "
        + threshold_text(rows, [post, pre])
        + "."
    )
    out.append(judged("X6", "Post-LN's largest stable LR lies below Pre-LN's", PAPER, est, ">", None, text))

    depths = sorted({r["depth"] for r in rows if r["arch"] == post})
    steps = list(itertools.pairwise(depths))
    by = {(r["depth"], r["lr"], r["warmup"], r["seed"]): r for r in rows if r["arch"] == post}
    deeper = [
        (by[(d2, lr, w, s)], by[(d1, lr, w, s)])
        for d1, d2 in steps
        for (d, lr, w, s) in sorted(by)
        if d == d1 and (d2, lr, w, s) in by
    ]
    est, ties, total = discordant(deeper)
    text = (
        f"Post-LN's run pairs at consecutive depths ({', '.join(f'{a}->{b}' for a, b in steps)}), same LR, warmup "
        "and seed: "
        + discordant_text(est, ties, total, "the shallower trained where the deeper did not")
        + f". {SHARE_RULE}."
    )
    out.append(
        judged(
            "X7",
            "Post-LN's largest stable LR falls with depth",
            PAPER,
            est,
            ">",
            None,
            text,
            none_why="the grid has one depth, or no depth change changes an outcome",
        )
    )

    warm = sorted({r["warmup"] for r in rows if r["arch"] == post})
    x8 = "Warmup raises Post-LN's largest stable LR"
    if len(warm) < 2:
        out.append(judged("X8", x8, PAPER, None, ">", None, "", none_why="the grid has one warmup"))
        return out
    w0, w1 = warm[0], warm[-1]
    keyed = {(d, lr, s): r for (d, lr, w, s), r in by.items() if w == w0}
    with_warm = [(keyed[(d, lr, s)], r) for (d, lr, w, s), r in sorted(by.items()) if w == w1 and (d, lr, s) in keyed]
    est, ties, total = discordant(with_warm)
    text = (
        f"Post-LN's run pairs without warmup ({w0} steps) and with {w1} warmup steps, same depth, LR and seed, "
        "pooled over depths: "
        + discordant_text(est, ties, total, "the warmed-up run trained where the other did not")
        + f". {SHARE_RULE}."
    )
    out.append(judged("X8", x8, PAPER, est, ">", None, text))
    return out


def xiong_claims(rows: list[dict[str, Any]], profiles: list[InitProfile]) -> list[Claim]:
    """X1-X8 when the study has a Pre-LN and a Post-LN arm; [] otherwise."""
    role = roles(rows)
    if "pre" not in role or "post" not in role:
        return []
    pre, post = role["pre"], role["post"]
    out = profile_claims(profiles, pre, post) if profiles else []
    return out + trained_claims(rows, pre, post)
