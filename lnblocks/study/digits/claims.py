"""What each paper claims about batch-size dependence, tested on the digits study's runs with 95% t-intervals over
seeds and a three-valued verdict: REPRODUCED, DID NOT REPRODUCE, or INCONCLUSIVE (the interval straddles the
claim's threshold).

The claims, each with its threshold (``margin`` = ``MARGIN_PP``, 1 pp = 3.6 of the 360 test images):

- Wu & He (2018, arXiv 1803.08494, Fig. 1): BatchNorm loses accuracy as the batch shrinks (mean accuracy at the
  smallest batch minus the largest below ``-margin``) while GroupNorm stays flat (every batch size within
  ``+-margin`` of the largest). REPRODUCED needs both parts, DID NOT REPRODUCE needs one part refuted.
- Singh & Krishnan (2019, arXiv 1911.09737): FRN + TLU is batch-independent -- flat as above.
- Liu et al. (2020, arXiv 2004.02967): EvoNorm-S0 is batch-independent -- flat as above.
- Luo et al. (2018, arXiv 1806.10779, Fig. 1/8): SwitchableNorm learns its mix and small batches move weight away
  from BN: the learned BN weight (mean of the mean- and variance-weights over layers, per run) is lower at the
  smallest batch than at the largest (threshold 0).
- Brock et al. (2021, arXiv 2101.08692 / 2102.06171): a network without normalization layers, with scaled weight
  standardization and adaptive gradient clipping, trains to batch-normalized accuracy: NF's accuracy at the largest
  batch is not below BatchNorm's by more than ``margin``.

"Flat" is tested against the largest batch, one interval per smaller batch size: REPRODUCED when every interval
lies inside ``(-margin, margin)``, DID NOT REPRODUCE when one lies wholly outside, INCONCLUSIVE otherwise. Intervals
of a difference of two means are Welch's (``lnblocks.study.core.stats.welch_difference``); the verdicts follow the
study's one set of rules (``lnblocks.study.core.claims``: ``verdict``, ``within``, ``all_of``), and each claim is a
``core.claims.Claim`` (ids C1-C5), NOT TESTED when the study lacks the arms it needs.
"""

from __future__ import annotations

import json
import math

from lnblocks.study.core.claims import Claim, Verdict, all_of, not_tested, verdict, within
from lnblocks.study.core.stats import Estimate, welch_difference

MARGIN_PP = 1.0  # smallest accuracy change (pp) a claim about batch dependence counts
SOURCES = ("in", "ln", "bn")
PAPERS = {
    "C1": "Wu & He 2018 (1803.08494)",
    "C2": "Singh & Krishnan 2019 (1911.09737)",
    "C3": "Liu et al. 2020 (2004.02967)",
    "C4": "Luo et al. 2018 (1806.10779)",
    "C5": "Brock et al. 2021 (2101.08692, 2102.06171)",
}


def signed(est: Estimate, digits: int = 1, unit: str = "") -> str:
    """``"+0.5 pp [-0.5, +1.4]"``: an estimate with its interval, signed (``"(n=1, no interval)"`` without one)."""
    if not math.isfinite(est.half_width):
        return f"{est.value:+.{digits}f}{unit} (n={est.n}, no interval)"
    return f"{est.value:+.{digits}f}{unit} [{est.low:+.{digits}f}, {est.high:+.{digits}f}]"


def claim_line(claim: Claim) -> str:
    """The report's line for a claim: ``- **<title>: <verdict>.** <text>``."""
    return f"- **{claim.title}: {claim.status}.** {claim.text}"


def _values(rows: list[dict], norm: str, key: str = "test_acc") -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in rows:
        if r["norm"] == norm and r.get(key) not in (None, ""):
            out.setdefault(int(r["batch_size"]), []).append(float(r[key]))
    return dict(sorted(out.items()))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _missing(cid: str, title: str, what: str) -> Claim:
    return not_tested(cid, title, PAPERS[cid], f"the study needs {what}")


def flat(rows: list[dict], norm: str, label: str, margin: float = MARGIN_PP) -> tuple[Verdict, str] | None:
    """``(verdict, numbers)`` of "accuracy is flat across batch sizes" for ``norm``: every smaller batch size's
    change from the largest lies within ``margin``. None with fewer than 2 batch sizes."""
    accs = _values(rows, norm)
    if len(accs) < 2:
        return None
    sizes = list(accs)
    ref = sizes[-1]
    diffs = {b: welch_difference(accs[b], accs[ref]) for b in sizes[:-1]}
    flatness = all_of([within(d, margin) for d in diffs.values()], f"|difference| < {margin:g} at every batch size")
    n = min(len(v) for v in accs.values())
    text = (
        f"{label} {_mean(accs[ref]):.1f}% at batch {ref}; change at batch "
        + ", ".join(f"{b}: {signed(d, 1, ' pp')}" for b, d in diffs.items())
        + f" (95% intervals, n={n} seed{'s' if n != 1 else ''}; flat needs every interval inside ±{margin:g} pp)"
    )
    return flatness, text


def _flat_claim(rows: list[dict], cid: str, title: str, norm: str, label: str) -> Claim:
    result = flat(rows, norm, label)
    if result is None:
        return _missing(cid, title, f"{label} at two or more batch sizes")
    return Claim(cid, title, PAPERS[cid], result[0], result[1] + ".")


def wu_he(rows: list[dict], margin: float = MARGIN_PP) -> Claim:
    title = "Wu & He (2018): BatchNorm falls at small batches, GroupNorm does not"
    bn = _values(rows, "batch")
    gn_flat = flat(rows, "group", "GroupNorm", margin)
    if len(bn) < 2 or gn_flat is None:
        return _missing("C1", title, "BatchNorm and GroupNorm at two or more batch sizes")
    small, large = min(bn), max(bn)
    fall = welch_difference(bn[small], bn[large])
    bn_verdict = verdict(fall, "<", -margin)
    text = (
        f"BatchNorm {_mean(bn[large]):.1f}% at batch {large} -> {_mean(bn[small]):.1f}% at batch {small}: "
        f"{signed(fall, 1, ' pp')} (a fall needs the interval below -{margin:g} pp: {bn_verdict.outcome}); "
        f"{gn_flat[1]}: {gn_flat[0].outcome}."
    )
    both = all_of([bn_verdict, gn_flat[0]], f"BatchNorm's difference < -{margin:g} and GroupNorm flat")
    return Claim("C1", title, PAPERS["C1"], both, text)


def sn_bn_weight(row: dict) -> float | None:
    """A SwitchableNorm run's learned BN weight: the mean of its mean- and variance-weights over layers."""
    weights = row.get("switch_weights")
    if isinstance(weights, str):
        weights = json.loads(weights) if weights else None
    if not weights:
        return None
    return sum(layer[kind]["bn"] for layer in weights for kind in ("mean", "var")) / (2 * len(weights))


def switchable(rows: list[dict]) -> Claim:
    title = "Luo et al. (2018): SwitchableNorm moves weight away from BN at small batches"
    per_batch: dict[int, list[float]] = {}
    for r in rows:
        w = sn_bn_weight(r) if r["norm"] == "switchable" else None
        if w is not None:
            per_batch.setdefault(int(r["batch_size"]), []).append(w)
    if len(per_batch) < 2:
        return _missing("C4", title, "SwitchableNorm runs with recorded switch weights at two or more batch sizes")
    small, large = min(per_batch), max(per_batch)
    d = welch_difference(per_batch[small], per_batch[large])
    means = ", ".join(f"batch {b}: {_mean(v):.2f}" for b, v in sorted(per_batch.items()))
    text = (
        f"learned BN weight (mean over layers of the mean and variance weights; 1/3 at init) {means}; "
        f"batch {small} minus batch {large}: {signed(d, 2)} (95% interval, n={d.n}; the claim needs it below 0)."
    )
    return Claim("C4", title, PAPERS["C4"], verdict(d, "<", 0.0), text)


def normalizer_free(rows: list[dict], margin: float = MARGIN_PP) -> Claim:
    title = "Brock et al. (2021): no norm, scaled WS + AGC, trains to BatchNorm's accuracy"
    nf, bn = _values(rows, "nf"), _values(rows, "batch")
    common = sorted(set(nf) & set(bn))
    if not common:
        return _missing("C5", title, "the NF and BatchNorm arms at a common batch size")
    large, small = common[-1], common[0]
    d = welch_difference(nf[large], bn[large])
    ratios = _values(rows, "nf", "agc_grad_ratio")
    agc = ", ".join(f"batch {b}: {_mean(v):.2f}" for b, v in ratios.items())
    text = (
        f"at batch {large}, NF {_mean(nf[large]):.1f}% vs BatchNorm {_mean(bn[large]):.1f}%: "
        f"{signed(d, 1, ' pp')} (the claim needs the interval above -{margin:g} pp); at batch {small}, NF "
        f"{_mean(nf[small]):.1f}% vs BatchNorm {_mean(bn[small]):.1f}%."
    )
    if agc:
        text += f" AGC kept this fraction of the blocks' gradient norm, mean over steps: {agc}."
    return Claim("C5", title, PAPERS["C5"], verdict(d, ">", -margin), text)


def claims(rows: list[dict]) -> list[Claim]:
    """Every claim the study tests, in the report's order."""
    return [
        wu_he(rows),
        _flat_claim(rows, "C2", "Singh & Krishnan (2019): FRN + TLU is batch-independent", "frn", "FRN + TLU"),
        _flat_claim(rows, "C3", "Liu et al. (2020): EvoNorm-S0 is batch-independent", "evonorm_s0", "EvoNorm-S0"),
        switchable(rows),
        normalizer_free(rows),
    ]


def switch_weight_table(rows: list[dict]) -> str:
    """Markdown: per batch size and layer, SwitchableNorm's learned mean and variance weights (mean over seeds)."""
    cells: dict[tuple[int, int], list[list]] = {}
    for r in rows:
        weights = r.get("switch_weights") if r["norm"] == "switchable" else None
        if isinstance(weights, str):
            weights = json.loads(weights) if weights else None
        for i, layer in enumerate(weights or []):
            cells.setdefault((int(r["batch_size"]), i), []).append(layer)
    if not cells:
        return ""
    lines = [
        "| batch | layer | mean: IN | mean: LN | mean: BN | var: IN | var: LN | var: BN | seeds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (b, i), layers in sorted(cells.items()):
        avg = [sum(layer[kind][s] for layer in layers) / len(layers) for kind in ("mean", "var") for s in SOURCES]
        lines.append(f"| {b} | {i + 1} | " + " | ".join(f"{w:.2f}" for w in avg) + f" | {len(layers)} |")
    return "\n".join(lines)
