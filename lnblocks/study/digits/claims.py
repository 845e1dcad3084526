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
of a difference of two means are Welch's; the t quantile comes from scipy (installed with scikit-learn).

The t-interval here is local to the digits study; once ``lnblocks.study.stats`` (t-intervals and verdict helpers
for every study) exists, ``mean_interval``/``diff_interval``/the verdict rules should move to it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

MARGIN_PP = 1.0  # smallest accuracy change (pp) a claim about batch dependence counts
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "REPRODUCED", "DID NOT REPRODUCE", "INCONCLUSIVE"
SOURCES = ("in", "ln", "bn")


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile ``p`` with ``df`` (possibly fractional, Welch) degrees of freedom."""
    from scipy.stats import t  # scikit-learn's dependency, so there wherever the digits data is

    return float(t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """A mean (or a difference of means) and its 95% t-interval; ``n`` the number of seeds (of each side)."""

    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half(self) -> float:
        return (self.hi - self.lo) / 2

    def text(self, digits: int = 1, unit: str = "") -> str:
        if not math.isfinite(self.half):
            return f"{self.mean:+.{digits}f}{unit} (n={self.n}, no interval)"
        return f"{self.mean:+.{digits}f}{unit} [{self.lo:+.{digits}f}, {self.hi:+.{digits}f}]"


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval (``n - 1`` df); with one value the interval is infinite."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return Interval(mean, -math.inf, math.inf, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n) if sd > 0 else 0.0
    return Interval(mean, mean - half, mean + half, n)


def diff_interval(a: Sequence[float], b: Sequence[float]) -> Interval:
    """``mean(a) - mean(b)`` and its 95% Welch interval (Welch-Satterthwaite df); infinite if a side has n < 2."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    n = min(len(a), len(b))
    if n < 2:
        return Interval(ma - mb, -math.inf, math.inf, n)
    va = sum((v - ma) ** 2 for v in a) / (len(a) - 1) / len(a)
    vb = sum((v - mb) ** 2 for v in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(ma - mb, ma - mb, ma - mb, n)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(0.975, df) * se
    return Interval(ma - mb, ma - mb - half, ma - mb + half, n)


def within(iv: Interval, margin: float) -> str:
    """Claim ``|effect| < margin``."""
    if -margin < iv.lo and iv.hi < margin:
        return REPRODUCED
    if iv.lo >= margin or iv.hi <= -margin:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def below(iv: Interval, threshold: float) -> str:
    """Claim ``effect < threshold``."""
    if iv.hi < threshold:
        return REPRODUCED
    if iv.lo >= threshold:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def above(iv: Interval, threshold: float) -> str:
    """Claim ``effect > threshold``."""
    return below(Interval(-iv.mean, -iv.hi, -iv.lo, iv.n), -threshold)


def combine(verdicts: Sequence[str]) -> str:
    """All parts reproduced: REPRODUCED; one part refuted: DID NOT REPRODUCE; else INCONCLUSIVE."""
    if any(v == NOT_REPRODUCED for v in verdicts):
        return NOT_REPRODUCED
    return REPRODUCED if verdicts and all(v == REPRODUCED for v in verdicts) else INCONCLUSIVE


# ---- the study's claims ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """One paper's claim: ``verdict`` and the sentence with the numbers it rests on."""

    name: str
    verdict: str
    text: str

    def line(self) -> str:
        return f"- **{self.name}: {self.verdict}.** {self.text}"


def _values(rows: list[dict], norm: str, key: str = "test_acc") -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in rows:
        if r["norm"] == norm and r.get(key) not in (None, ""):
            out.setdefault(int(r["batch_size"]), []).append(float(r[key]))
    return dict(sorted(out.items()))


def _missing(name: str, what: str) -> Claim:
    return Claim(name, INCONCLUSIVE, f"Not assessed: the study needs {what}.")


def flat(rows: list[dict], norm: str, label: str, margin: float = MARGIN_PP) -> tuple[str, str] | None:
    """``(verdict, numbers)`` of "accuracy is flat across batch sizes" for ``norm``, or None with < 2 sizes."""
    accs = _values(rows, norm)
    if len(accs) < 2:
        return None
    sizes = list(accs)
    ref = sizes[-1]
    diffs = {b: diff_interval(accs[b], accs[ref]) for b in sizes[:-1]}
    verdict = combine([within(iv, margin) for iv in diffs.values()])
    n = min(len(v) for v in accs.values())
    text = (
        f"{label} {mean_interval(accs[ref]).mean:.1f}% at batch {ref}; change at batch "
        + ", ".join(f"{b}: {iv.text(1, ' pp')}" for b, iv in diffs.items())
        + f" (95% intervals, n={n} seed{'s' if n != 1 else ''}; flat needs every interval inside ±{margin:g} pp)"
    )
    return verdict, text


def _flat_claim(rows: list[dict], name: str, norm: str, label: str) -> Claim:
    result = flat(rows, norm, label)
    if result is None:
        return _missing(name, f"{label} at two or more batch sizes")
    return Claim(name, result[0], result[1] + ".")


def wu_he(rows: list[dict], margin: float = MARGIN_PP) -> Claim:
    name = "Wu & He (2018): BatchNorm falls at small batches, GroupNorm does not"
    bn = _values(rows, "batch")
    gn_flat = flat(rows, "group", "GroupNorm", margin)
    if len(bn) < 2 or gn_flat is None:
        return _missing(name, "BatchNorm and GroupNorm at two or more batch sizes")
    small, large = min(bn), max(bn)
    fall = diff_interval(bn[small], bn[large])
    bn_verdict = below(fall, -margin)
    text = (
        f"BatchNorm {mean_interval(bn[large]).mean:.1f}% at batch {large} -> {mean_interval(bn[small]).mean:.1f}% at "
        f"batch {small}: {fall.text(1, ' pp')} (a fall needs the interval below -{margin:g} pp: {bn_verdict}); "
        f"{gn_flat[1]}: {gn_flat[0]}."
    )
    return Claim(name, combine([bn_verdict, gn_flat[0]]), text)


def sn_bn_weight(row: dict) -> float | None:
    """A SwitchableNorm run's learned BN weight: the mean of its mean- and variance-weights over layers."""
    weights = row.get("switch_weights")
    if isinstance(weights, str):
        weights = json.loads(weights) if weights else None
    if not weights:
        return None
    return sum(layer[kind]["bn"] for layer in weights for kind in ("mean", "var")) / (2 * len(weights))


def switchable(rows: list[dict]) -> Claim:
    name = "Luo et al. (2018): SwitchableNorm moves weight away from BN at small batches"
    per_batch: dict[int, list[float]] = {}
    for r in rows:
        w = sn_bn_weight(r) if r["norm"] == "switchable" else None
        if w is not None:
            per_batch.setdefault(int(r["batch_size"]), []).append(w)
    if len(per_batch) < 2:
        return _missing(name, "SwitchableNorm runs with recorded switch weights at two or more batch sizes")
    small, large = min(per_batch), max(per_batch)
    d = diff_interval(per_batch[small], per_batch[large])
    means = ", ".join(f"batch {b}: {mean_interval(v).mean:.2f}" for b, v in sorted(per_batch.items()))
    text = (
        f"learned BN weight (mean over layers of the mean and variance weights; 1/3 at init) {means}; "
        f"batch {small} minus batch {large}: {d.text(2)} (95% interval, n={d.n}; the claim needs it below 0)."
    )
    return Claim(name, below(d, 0.0), text)


def normalizer_free(rows: list[dict], margin: float = MARGIN_PP) -> Claim:
    name = "Brock et al. (2021): no norm, scaled WS + AGC, trains to BatchNorm's accuracy"
    nf, bn = _values(rows, "nf"), _values(rows, "batch")
    common = sorted(set(nf) & set(bn))
    if not common:
        return _missing(name, "the NF and BatchNorm arms at a common batch size")
    large, small = common[-1], common[0]
    d = diff_interval(nf[large], bn[large])
    ratios = _values(rows, "nf", "agc_grad_ratio")
    agc = ", ".join(f"batch {b}: {mean_interval(v).mean:.2f}" for b, v in ratios.items())
    text = (
        f"at batch {large}, NF {mean_interval(nf[large]).mean:.1f}% vs BatchNorm {mean_interval(bn[large]).mean:.1f}%: "
        f"{d.text(1, ' pp')} (the claim needs the interval above -{margin:g} pp); at batch {small}, NF "
        f"{mean_interval(nf[small]).mean:.1f}% vs BatchNorm {mean_interval(bn[small]).mean:.1f}%."
    )
    if agc:
        text += f" AGC kept this fraction of the blocks' gradient norm, mean over steps: {agc}."
    return Claim(name, above(d, -margin), text)


def claims(rows: list[dict]) -> list[Claim]:
    """Every claim the study tests, in the report's order."""
    return [
        wu_he(rows),
        _flat_claim(rows, "Singh & Krishnan (2019): FRN + TLU is batch-independent", "frn", "FRN + TLU"),
        _flat_claim(rows, "Liu et al. (2020): EvoNorm-S0 is batch-independent", "evonorm_s0", "EvoNorm-S0"),
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
