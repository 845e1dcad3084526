"""The 2025-26 claims about residual streams and attention (docs/study-claims.md): hyper-connections' mixing gain
and mHC's bound (HC1-HC3), the gated attention output (GA1-GA3), OLMo 2's recipe against Pre-LN's gradient spikes
(OL1) and QK-norm in place of soft-capping (GM1, GM2).

The diagnostics they read are the last diagnostics step's, from the eager-attention probe of a fixed batch: the
first-token attention mass (the attention sink) averaged over layers, the largest ratio of max to median |h| of a
block's output (massive activations), the max attention logit, and the composite mixing gain of the
hyper-connections (``lnblocks.blocks.composite_gain``).
"""

from __future__ import annotations

import math
from typing import Any

from lnblocks.study.core.claims import Claim, judged
from lnblocks.study.lm.report.findings.common import (
    SHARE_RULE,
    discordant,
    discordant_text,
    paired_cells,
    show,
    threshold_text,
    trained,
)
from lnblocks.study.lm.report.findings.frontier_arms import interval, log_of, missing, paired
from lnblocks.study.lm.report.findings.wortsman import sensitivity

HC = "Zhu et al. 2024 (2409.19606); Xie et al. 2025 (2512.24880)"
GATED = "Qiu et al. 2025 (2505.06708)"
OLMO2 = "OLMo et al. 2025 (2501.00656)"
GEMMA = "Gemma Team 2024, 2025 (2408.00118, 2503.19786)"
MHC_BOUND = 2.0  # mHC reports a composite gain near 1.6 (27B); "bounded" is judged below 2
MARGIN = 0.05  # nats of LR sensitivity: "no worse than soft-capping"
SCALE_HC = "the gain reached about 3000 at 27B parameters; at width 64 over 300 steps it can only start to grow"
SCALE_GATED = "the sink and massive activations were measured at 1.7B-15B over 3.5T tokens"
SCALE_OLMO2 = "OLMo-0424's gradient spikes were at 7B over trillions of tokens"
SCALE_GEMMA = "Gemma 3's switch was made at 1B-27B parameters"


def _growth(row: dict[str, Any]) -> float | None:
    a, b = row.get("init_mixing_gain"), row.get("final_mixing_gain")
    return math.log(b / a) if a and b and a > 0 and b > 0 else None


def hyper(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    out = []
    title = "Hyper-connections' composite mixing gain grows in training"
    absent = missing("HC1", title, HC, r, ["hc"])
    if absent is not None:
        out.append(absent)
    else:
        values = [g for row in rows if row["arch"] == r["hc"] and trained(row) and (g := _growth(row)) is not None]
        est = interval(values, "log growth")
        text = (
            "log(composite mixing gain at the last diagnostics step / at step 0) per trained HC run (the largest "
            f"absolute row or column sum of the product of every sublayer's residual matrix, max over tokens): "
            f"{show(est)}, claim > 0."
        )
        out.append(judged("HC1", title, HC, est, ">", 0.0, text, SCALE_HC, none_why="no trained HC run with a gain"))
    title = "mHC's Sinkhorn projection keeps the gain from growing as HC's does"
    absent = missing("HC2", title, HC, r, ["hc", "mhc"])
    if absent is not None:
        out.append(absent)
    else:
        diffs, total = paired(rows, r["hc"], r["mhc"], _growth)
        est = interval(diffs)
        text = f"log growth of the gain, HC minus mHC, paired over {len(diffs)} cells both trained (of {total}): "
        text += f"{show(est)}, claim > 0."
        out.append(judged("HC2", title, HC, est, ">", 0.0, text, SCALE_HC, none_why="no cell where both trained"))
    title = "mHC's composite gain stays bounded (about 1.6 in the paper)"
    absent = missing("HC3", title, HC, r, ["mhc"])
    if absent is not None:
        out.append(absent)
    else:
        top = [row["max_mixing_gain"] for row in rows if row["arch"] == r["mhc"] and trained(row)
               and row.get("max_mixing_gain") is not None]  # fmt: skip
        est = interval(top, "mean max gain")
        text = f"Largest composite gain over the diagnostics steps per trained mHC run: {show(est)}, "
        text += f"claim < {MHC_BOUND:g}."
        out.append(judged("HC3", title, HC, est, "<", MHC_BOUND, text, SCALE_HC, none_why="no trained mHC run"))
    return out


def gated(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    specs = (
        ("GA1", "The attention output gate removes the attention sink", "final_attn_sink",
         "First-token attention mass (mean over layers and heads)"),
        ("GA2", "The attention output gate removes massive activations", "final_massive_ratio",
         "log of the largest max/median |h| ratio of a block's output"),
    )  # fmt: skip
    out = []
    for cid, title, key, what in specs:
        absent = missing(cid, title, GATED, r, ["gated", "pre"])
        if absent is not None:
            out.append(absent)
            continue
        value = log_of(key) if key == "final_massive_ratio" else (lambda row, k=key: row.get(k))
        diffs, total = paired(rows, r["pre"], r["gated"], value)
        est = interval(diffs)
        text = f"{what}, Pre-LN minus gated, paired over {len(diffs)} cells both trained (of {total}): {show(est)}, "
        text += "claim > 0."
        out.append(judged(cid, title, GATED, est, ">", 0.0, text, SCALE_GATED, none_why="no cell where both trained"))
    title = "Gated attention tolerates larger LRs"
    absent = missing("GA3", title, GATED, r, ["gated", "pre"])
    if absent is not None:
        return [*out, absent]
    est, ties, total = discordant((a, b) for _, a, b in paired_cells(rows, r["pre"], r["gated"]))
    text = (
        "Threshold claim pooled over the cells: "
        + discordant_text(est, ties, total, "the gated run trained where Pre-LN did not")
        + f". {SHARE_RULE}. {threshold_text(rows, [r['pre'], r['gated']])}."
    )
    return [*out, judged("GA3", title, GATED, est, ">", None, text, SCALE_GATED)]


def olmo2(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    title = "OLMo 2's recipe (reordered norm, QK-norm, z-loss) lowers Pre-LN's gradient-spike score"
    absent = missing("OL1", title, OLMO2, r, ["olmo2", "pre"])
    if absent is not None:
        return [absent]

    def score(key: str):
        return lambda row: row.get(key) if row["status"] == "finished" else None

    diffs, total = paired(rows, r["pre"], r["olmo2"], score("grad_norm_spike_score"), need_trained=False)
    loss, _ = paired(rows, r["pre"], r["olmo2"], score("loss_spike_score"), need_trained=False)
    est = interval(diffs)
    text = (
        "Share of the scored steps whose gradient norm spiked (above the mean + 6 sd of the previous 128), Pre-LN "
        f"minus OLMo 2, paired over {len(diffs)} cells both finished (of {total}): {show(est)}, claim > 0; the same "
        f"for the loss: {show(interval(loss))}."
    )
    return [judged("OL1", title, OLMO2, est, ">", 0.0, text, SCALE_OLMO2, none_why="no cell where both finished")]


def _units(rows: list[dict[str, Any]], arch: str) -> dict[tuple[int, int, int], dict[float, dict[str, Any]]]:
    out: dict[tuple[int, int, int], dict[float, dict[str, Any]]] = {}
    for row in rows:
        if row["arch"] == arch:
            out.setdefault((row["depth"], row["warmup"], row["seed"]), {})[row["lr"]] = row
    return out


def gemma(rows: list[dict[str, Any]], r: dict[str, str]) -> list[Claim]:
    title = "QK-norm keeps the max attention logit as low as soft-capping does"
    absent = missing("GM1", title, GEMMA, r, ["qk", "softcap"])
    if absent is not None:
        return [absent, missing("GM2", "QK-norm's LR sensitivity is no larger than soft-capping's", GEMMA, r,
                                ["qk", "softcap"])]  # type: ignore[list-item]  # fmt: skip
    diffs, total = paired(rows, r["qk"], r["softcap"], log_of("final_attn_max_logit"))
    est = interval(diffs)
    text = (
        "log max attention logit at the end (eager probe; the soft-capped arm's logits are read after its cap), "
        f"QK-norm minus soft-capping, paired over {len(diffs)} cells both trained (of {total}): {show(est)}, claim < 0."
    )
    out = [judged("GM1", title, GEMMA, est, "<", 0.0, text, SCALE_GEMMA, none_why="no cell where both trained")]
    title = "QK-norm's LR sensitivity is no larger than soft-capping's"
    qk, cap = _units(rows, r["qk"]), _units(rows, r["softcap"])
    units = [u for u in sorted(set(qk) & set(cap)) if len(qk[u]) >= 3 and set(qk[u]) == set(cap[u])]
    values = [sensitivity(qk[u]) - sensitivity(cap[u]) for u in units]
    values = [v for v in values if math.isfinite(v)]
    est = interval(values)
    text = (
        "Wortsman et al.'s LR sensitivity E_lr[min(l, l0) - l*] per (depth, warmup, seed) unit over the LR grid, "
        f"QK-norm minus soft-capping, over {len(values)} units: {show(est)} nats, claim < +{MARGIN} (no larger "
        "beyond the margin)."
    )
    none_why = "no unit with three or more LRs in both arms"
    out.append(judged("GM2", title, GEMMA, est, "<", MARGIN, text, SCALE_GEMMA, none_why=none_why))
    return out
