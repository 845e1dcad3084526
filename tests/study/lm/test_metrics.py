"""The study's metrics on hand-made tables: LR schedule, divergence detection, classification, LR sensitivity."""

from __future__ import annotations

import math

import pytest

from lnblocks.study.lm.report.analysis import capped, classify, log_slope, lr_sensitivity, max_stable_lr
from lnblocks.study.lm.run.loop_state import DivergenceMonitor, detect_divergence
from lnblocks.study.lm.run.optim import lr_at


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        ("constant", 0, 0.25),  # warmup: lr * (t + 1) / warmup
        ("constant", 3, 1.0),
        ("constant", 9, 1.0),
        ("cosine", 4, 1.0),  # first step after warmup: full lr
        ("cosine", 9, 0.1),  # last step: min_lr_ratio * lr
        ("cosine", 6, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 5))),
        ("linear", 9, 0.1),
        ("linear", 6, 1.0 - 0.9 * 2 / 5),
        ("inv_sqrt", 3, 1.0),
        ("inv_sqrt", 15, math.sqrt(4 / 16)),
    ],
)
def test_lr_schedule_table(schedule: str, step: int, expected: float) -> None:
    assert lr_at(step, 1.0, warmup=4, steps=10, schedule=schedule, min_lr_ratio=0.1) == pytest.approx(expected)


def test_lr_no_warmup_starts_at_full_lr() -> None:
    assert lr_at(0, 3e-3, warmup=0, steps=300) == 3e-3


def test_unknown_schedule_is_an_error() -> None:
    with pytest.raises(ValueError, match="schedule must be one of"):
        lr_at(5, 1.0, warmup=0, steps=10, schedule="step")


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        ([5.0, 4.0, 3.0, 2.5, 2.0], None),  # trains
        ([5.0, 4.0, float("nan"), 2.0], 2),  # non-finite: diverged at once
        ([5.0, 4.0, float("inf")], 2),
        ([5.0, 9.0, 4.0, 9.0, 4.0, 9.0], None),  # spikes above 5 + 3, never 3 in a row
        ([5.0, 4.0, 9.0, 9.5, 10.0, 11.0], 4),  # three steps in a row above 8: fires at the third
        ([5.0, 7.9, 7.9, 7.9, 7.9], None),  # just under the margin
    ],
)
def test_divergence_table(losses: list[float], expected: int | None) -> None:
    assert detect_divergence(losses, margin=3.0, patience=3) == expected


def test_divergence_monitor_stays_fired() -> None:
    mon = DivergenceMonitor(margin=1.0, patience=1)
    assert not mon.update(0, 2.0)
    assert mon.update(1, 3.5)
    assert mon.update(2, 1.0) and mon.step == 1


@pytest.mark.parametrize(
    ("final", "diverged", "expected"),
    [
        (2.4, False, "trained"),
        (3.2, False, "stuck"),
        (3.4, False, "stuck"),
        (None, False, "diverged"),
        (2.4, True, "diverged"),
        (float("nan"), False, "diverged"),
    ],
)
def test_classify(final: float | None, diverged: bool, expected: str) -> None:
    assert classify(final, diverged, plateau=3.33, stuck_margin=0.3) == expected


def test_lr_sensitivity_hand_table() -> None:
    # Wortsman et al. 2023: E_lr[min(l, l0) - l*]. Diverged (NaN) and worse-than-init losses count as l0 = 5.
    losses = {1e-3: 3.0, 3e-3: 2.5, 1e-2: float("nan"), 3e-2: 7.0}
    # capped: 3.0, 2.5, 5.0, 5.0; best 2.5 -> (0.5 + 0 + 2.5 + 2.5) / 4
    assert lr_sensitivity(losses, initial=5.0) == pytest.approx(1.375)
    assert lr_sensitivity({1e-3: 2.0, 1e-2: 2.0}, initial=5.0) == 0.0
    # Every LR failed: the plain metric reads 0, which is why the report also gives the excess over the depth best.
    assert lr_sensitivity({1e-3: None, 1e-2: None}, initial=5.0) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        lr_sensitivity({}, initial=5.0)


def test_capped_and_max_stable_lr() -> None:
    assert capped(None, 4.0) == 4.0 and capped(6.0, 4.0) == 4.0 and capped(3.0, 4.0) == 3.0
    table = {1e-3: 2.60, 3e-3: 2.55, 1e-2: 3.35}
    assert max_stable_lr(table, reference=2.55, tol=0.1) == 3e-3
    assert max_stable_lr(table, reference=2.0, tol=0.1) is None


def test_log_slope() -> None:
    xs = [3, 6, 12, 24]
    assert log_slope(xs, [x**-0.5 for x in xs]) == pytest.approx(-0.5)
    assert math.isnan(log_slope([3], [1.0]))
