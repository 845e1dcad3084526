"""Which arm of a study with the 2025-26 options a run is, and what the claims of those papers share
(``frontier_norms``, ``frontier_attention``; docs/study-claims.md, "The 2025-26 stability literature").

An arm is named by what the run's summary row says it is, never by its grid label: the placement, the norm (and
DyT's / Derf's alpha_0), qk-norm, V-norm, the MLP's own placement, hyper-connections, the attention output gate,
the soft-caps, the z-loss and the optimizer. ``frontier_arm`` gives the names the claims use (``pre``, ``pre_rms``,
``derf``, ``hybridnorm``, ``mhc``, ... with ``+muon`` for Muon); a row that is none of them has no name and plays
no role. A study that uses any option added for these papers (``uses_frontier_options``) is judged by their claims;
the canon's claims (Xiong, Wortsman, the placements) keep their own studies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lnblocks.study.core.claims import Claim, judged
from lnblocks.study.core.stats import Estimate, mean_interval
from lnblocks.study.lm.report.findings.common import paired_cells, show, trained

DEFAULT_ALPHA = 0.5  # DyT's and Derf's alpha_0 (Zhu et al. 2025; Chen et al. 2025)
PLAIN_NORMS = {"layernorm": "pre", "rmsnorm": "pre_rms", "dyt": "dyt", "derf": "derf"}
NEW_PLACEMENTS = ("siamese", "ngpt", "normed_residual")
Value = Callable[[dict[str, Any]], "float | None"]
NAMES = {"pre": "Pre-LN (LayerNorm)", "pre_rms": "Pre-LN (RMSNorm)", "post": "Post-LN", "dyt": "DyT", "derf": "Derf",
         "hybridnorm": "HybridNorm", "siamese": "SiameseNorm", "ngpt": "nGPT"}  # fmt: skip


def named(arm: str, r: dict[str, str]) -> str:
    """``"Derf (arm derf_l6)"``: the claims' name of an arm and its label in the study."""
    return f"{NAMES.get(arm, arm)} (arm {r[arm]})"


def uses_frontier_options(rows: list[dict[str, Any]]) -> bool:
    """Whether any run uses an option added for the 2025-26 papers (Muon, Derf, V-norm, per-sublayer placement,
    SiameseNorm, nGPT, hyper-connections, the attention output gate, soft-capping)."""
    return any(
        r.get("optimizer") == "muon"
        or r.get("norm") == "derf"
        or r.get("placement") in NEW_PLACEMENTS
        or any(r.get(k) for k in ("mlp_placement", "v_norm", "hyper", "output_gate"))
        or any(r.get(k) is not None for k in ("attn_softcap", "final_softcap"))
        for r in rows
    )


def _modifiers(row: dict[str, Any]) -> list[str]:
    """The options a run adds to a Pre-LN LayerNorm block, as the claims name them."""
    out = []
    if row.get("hyper"):
        out.append("mhc" if row["hyper"] == "mhc" else "hc")
    if row.get("output_gate"):
        out.append("gated")
    if row.get("attn_softcap") is not None or row.get("final_softcap") is not None:
        out.append("softcap")
    if row.get("qk_norm"):
        out.append("qk")
    return out


def _base(row: dict[str, Any]) -> str | None:
    p, norm = row["placement"], row.get("norm")
    extra = bool(row.get("mlp_placement") or row.get("v_norm"))
    if row.get("rezero") or row.get("depth_scaled_norm"):
        return None
    if p in ("ngpt", "siamese") and not extra:
        return p
    if p == "none" and row.get("mlp_placement") == "normed_residual" and row.get("qk_norm") and row.get("v_norm"):
        return "hybridnorm"
    if p == "reordered" and row.get("qk_norm") and row.get("z_loss") and not extra:
        return "olmo2"
    if extra or p not in ("pre", "post") or (p == "post" and norm != "layernorm"):
        return None
    if p == "post":
        return "post"
    name = PLAIN_NORMS.get(norm or "")
    alpha = row.get("norm_alpha")
    if name in ("dyt", "derf") and alpha is not None and alpha != DEFAULT_ALPHA:
        name = f"{name}_a{alpha:g}"
    return name


def frontier_arm(row: dict[str, Any]) -> str | None:
    """The claims' name of the arm a summary row belongs to (see the module docstring), or None."""
    base = _base(row)
    if base is None:
        return None
    mods = _modifiers(row) if base in ("pre", "post") else []
    if base == "post" and mods:
        return None
    if base == "pre" and mods:
        if len(mods) > 1 or row.get("z_loss"):
            return None
        base = mods[0]
    elif base == "pre" and row.get("z_loss"):
        return None
    return f"{base}+muon" if row.get("optimizer") == "muon" else base


def frontier_roles(rows: list[dict[str, Any]]) -> dict[str, str]:
    """``{arm name: arch label}`` for every arm name exactly one arch of the study has (an ambiguous one plays no
    role)."""
    by: dict[str, set[str]] = {}
    for r in rows:
        name = frontier_arm(r)
        if name is not None:
            by.setdefault(name, set()).add(r["arch"])
    return {k: next(iter(v)) for k, v in by.items() if len(v) == 1}


def missing(title_id: str, title: str, paper: str, r: dict[str, str], needs: list[str]) -> Claim | None:
    """NOT TESTED naming the arms the study lacks, or None when it has them all."""
    absent = [n for n in needs if n not in r]
    if not absent:
        return None
    why = f"the study has no {' / '.join(absent)} arm (by the options its runs use)"
    return judged(title_id, title, paper, None, ">", 0.0, "", none_why=why)


def paired(
    rows: list[dict[str, Any]], a: str, b: str, value: Value, need_trained: bool = True
) -> tuple[list[float], int]:
    """``value(a) - value(b)`` over the cells both arms ran (and both trained, by default) where both values exist;
    and how many cells both ran."""
    out, total = [], 0
    for _, ra, rb in paired_cells(rows, a, b):
        total += 1
        if need_trained and not (trained(ra) and trained(rb)):
            continue
        va, vb = value(ra), value(rb)
        if va is not None and vb is not None and math.isfinite(va) and math.isfinite(vb):
            out.append(va - vb)
    return out, total


def interval(values: list[float], label: str = "difference") -> Estimate | None:
    """The mean's 95% t-interval (unbounded at n = 1), or None without values."""
    return mean_interval(values, label=label) if values else None


def loss_claim(
    rows: list[dict[str, Any]], r: dict[str, str], cid: str, title: str, paper: str, a: str, b: str, scale: str
) -> Claim:
    """ "``a`` reaches a lower final loss than ``b``": the paired final-loss difference ``a - b`` over the cells
    where both trained, judged ``< 0``."""
    absent = missing(cid, title, paper, r, [a, b])
    if absent is not None:
        return absent
    diffs, total = paired(rows, r[a], r[b], lambda row: row["final_loss"])
    est = interval(diffs)
    text = (
        f"Final eval loss, {named(a, r)} minus {named(b, r)}, paired over the {len(diffs)} (depth, LR, warmup, "
        f"seed) cells where both trained (of {total} both ran): {show(est)} nats, claim < 0."
    )
    return judged(cid, title, paper, est, "<", 0.0, text, scale, none_why="no cell where both trained")


def log_of(key: str) -> Value:
    """``log(row[key])`` for a positive value, else None."""

    def value(row: dict[str, Any]) -> float | None:
        v = row.get(key)
        return math.log(v) if v is not None and v > 0 else None

    return value
