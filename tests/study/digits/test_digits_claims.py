"""The digits report's statistics and verdicts on synthetic results with known answers: the study's t-intervals
(``core.stats``) against published t-table values and a hand computation of Welch's interval, and each claim on
flat, batch-dependent and noisy numbers."""

from __future__ import annotations

import json
import math

import pytest

from lnblocks.study.core.claims import Outcome
from lnblocks.study.core.stats import mean_interval, t_ppf, welch_difference
from lnblocks.study.digits.claims import claims, flat, normalizer_free, switch_weight_table, switchable, wu_he
from lnblocks.study.digits.report import markdown_table, summarize

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = Outcome.REPRODUCED, Outcome.DID_NOT_REPRODUCE, Outcome.INCONCLUSIVE
SIZES = (2, 4, 8, 16, 32)
TIGHT = (-0.1, 0.0, 0.1)  # seed offsets: a 95% interval of a difference of about +-0.2 pp
NOISY = (-3.0, 0.0, 3.0)


def _rows(norm: str, means: dict[int, float], offsets=TIGHT, **extra) -> list[dict]:
    return [
        {"norm": norm, "batch_size": b, "seed": s, "test_acc": m + o, "steps": 100, "epochs": 5, **extra}
        for b, m in means.items()
        for s, o in enumerate(offsets)
    ]


def _flat(norm: str, level: float = 99.0, offsets=TIGHT) -> list[dict]:
    return _rows(norm, dict.fromkeys(SIZES, level), offsets)


def _falling(norm: str) -> list[dict]:  # 5 pp lower at batch 2, 2 pp lower at batch 4
    return _rows(norm, {2: 94.0, 4: 97.0, 8: 99.0, 16: 99.0, 32: 99.0})


def test_t_quantile_and_intervals_match_the_table_and_a_hand_computation() -> None:
    # closed forms: df=1 (Cauchy) tan(pi (p - 1/2)); df=2 (2p - 1) / sqrt(2 p (1 - p)); the t table for 4, 10, 30
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert math.isclose(t_ppf(0.975, 1), math.tan(math.pi * 0.475), rel_tol=1e-12)
    assert math.isclose(t_ppf(0.975, 2), t2, rel_tol=1e-12)
    for df, value in ((4, 2.776445), (10, 2.228139), (30, 2.042272)):
        assert math.isclose(t_ppf(0.975, df), value, rel_tol=1e-6)
    est = mean_interval([97.0, 98.0, 99.0])  # mean 98, sd 1, n 3: half = t2 / sqrt(3)
    assert est.value == 98.0 and math.isclose(est.half_width, t2 / math.sqrt(3), rel_tol=1e-12)
    d = welch_difference([1.0, 2.0, 3.0], [0.0, 0.0, 3.0, 5.0])  # Welch by hand: var of the means 1/3, 6/4
    va, vb = 1.0 / 3, 6.0 / 4
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)  # 4.33...: a fractional df
    half = t_ppf(0.975, df) * math.sqrt(va + vb)
    assert math.isclose(d.value, 0.0, abs_tol=1e-15) and math.isclose(d.high, half, rel_tol=1e-12) and d.n == 3
    assert math.isinf(mean_interval([5.0]).half_width) and math.isinf(welch_difference([1.0], [2.0, 3.0]).half_width)
    assert welch_difference([1.0, 1.0], [0.0, 0.0]).half_width == 0.0  # no spread: the point itself


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (_flat("frn"), REPRODUCED),  # flat within +-0.2 pp
        (_falling("frn"), NOT_REPRODUCED),  # 5 pp lower at batch 2: wholly outside +-1 pp
        (_flat("frn", offsets=NOISY), INCONCLUSIVE),  # flat means, but intervals of +-7 pp straddle +-1 pp
        (_rows("frn", {2: 99.0, 4: 99.0, 8: 99.0, 16: 99.0, 32: 97.0}), NOT_REPRODUCED),  # higher at small batch
    ],
)
def test_flat_verdict(rows: list[dict], expected: str) -> None:
    verdict, text = flat(rows, "frn", "FRN + TLU")
    assert verdict.outcome == expected
    assert "n=3 seeds" in text and "batch 2:" in text


def test_flat_needs_two_batch_sizes() -> None:
    assert flat(_rows("frn", {8: 99.0}), "frn", "FRN") is None
    (claim,) = [c for c in claims(_rows("batch", {8: 99.0})) if "FRN" in c.title]
    assert claim.verdict is None and claim.status == "NOT TESTED" and "Not tested: the study needs" in claim.text


@pytest.mark.parametrize(
    ("bn", "gn", "expected"),
    [
        (_falling("batch"), _flat("group"), REPRODUCED),
        (_flat("batch"), _flat("group"), NOT_REPRODUCED),  # BatchNorm does not fall: refuted
        (_falling("batch"), _falling("group"), NOT_REPRODUCED),  # GroupNorm falls too
        (_rows("batch", {2: 94.0, 32: 99.0}, NOISY), _flat("group"), INCONCLUSIVE),  # a 5 pp drop within noise
    ],
)
def test_wu_he_verdict(bn: list[dict], gn: list[dict], expected: str) -> None:
    claim = wu_he(bn + gn)
    assert claim.outcome == expected
    assert "BatchNorm" in claim.text and "GroupNorm" in claim.text


def _sn_rows(bn_weight: dict[int, tuple[float, ...]]) -> list[dict]:
    rows = []
    for b, per_seed in bn_weight.items():
        for s, w in enumerate(per_seed):
            rest = (1 - w) / 2
            layer = {k: {"in": rest, "ln": rest, "bn": w} for k in ("mean", "var")}
            rows.append({"norm": "switchable", "batch_size": b, "seed": s, "test_acc": 99.0, "steps": 1, "epochs": 1,
                         "switch_weights": json.dumps([layer, layer])})  # fmt: skip
    return rows


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({2: (0.10, 0.12, 0.11), 32: (0.50, 0.52, 0.51)}, REPRODUCED),  # BN weight falls at small batch
        ({2: (0.50, 0.52, 0.51), 32: (0.10, 0.12, 0.11)}, NOT_REPRODUCED),  # it rises
        ({2: (0.10, 0.60, 0.30), 32: (0.30, 0.35, 0.40)}, INCONCLUSIVE),
    ],
)
def test_switchable_verdict_on_the_learned_bn_weight(weights: dict, expected: str) -> None:
    rows = _sn_rows(weights)
    claim = switchable(rows)
    assert claim.outcome == expected
    assert f"batch 2: {sum(weights[2]) / 3:.2f}" in claim.text
    table = switch_weight_table(rows)
    assert table.count("\n") == 2 + 2 * 2 - 1  # header, rule, a row per (batch, layer)
    assert f"| 2 | 1 | {(1 - 0.11) / 2:.2f} | {(1 - 0.11) / 2:.2f} | 0.11 |" in table or expected != REPRODUCED


def test_switchable_without_weights_is_not_assessed() -> None:
    rows = _rows("switchable", {2: 99.0, 32: 99.0}, switch_weights="")
    assert switchable(rows).verdict is None and switch_weight_table(rows) == ""


@pytest.mark.parametrize(
    ("nf_level", "offsets", "expected"),
    [(99.0, TIGHT, REPRODUCED), (95.0, TIGHT, NOT_REPRODUCED), (98.0, NOISY, INCONCLUSIVE)],
)
def test_normalizer_free_verdict(nf_level: float, offsets: tuple, expected: str) -> None:
    rows = _flat("batch", 99.0) + _rows("nf", dict.fromkeys(SIZES, nf_level), offsets, agc_grad_ratio=0.25)
    claim = normalizer_free(rows)
    assert claim.outcome == expected and "AGC kept" in claim.text and "batch 32: 0.25" in claim.text


def test_claims_and_table_on_a_whole_synthetic_study() -> None:
    rows = _falling("batch") + _flat("group") + _flat("frn") + _falling("evonorm_s0") + _flat("nf")
    rows += _sn_rows({2: (0.10, 0.12, 0.11), 32: (0.50, 0.52, 0.51)})
    verdicts = {c.title.split(":")[0]: c.outcome for c in claims(rows)}
    assert verdicts == {
        "Wu & He (2018)": REPRODUCED,
        "Singh & Krishnan (2019)": REPRODUCED,
        "Liu et al. (2020)": NOT_REPRODUCED,
        "Luo et al. (2018)": REPRODUCED,
        "Brock et al. (2021)": REPRODUCED,
    }
    table = markdown_table(summarize(rows))
    assert "| norm (test acc. %, mean ± 95% CI, 3 seeds) | batch 2 |" in table
    half = 0.95 / math.sqrt(2 * 0.975 * 0.025) * 0.1 / math.sqrt(3)  # t(0.975, 2) * sd 0.1 / sqrt(3)
    assert f"| BatchNorm | 94.0 ± {half:.1f} | 97.0 ± {half:.1f} |" in table
    assert "| FRN + TLU | 99.0 ± 0.2 |" in table and "| NF (scaled WS + AGC) |" in table
