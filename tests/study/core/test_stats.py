"""The study's statistics against scipy.stats (t and beta quantiles, linregress, exact binomial intervals, paired t)
and on synthetic seeds with known answers: a clear effect, a null effect and a noisy one."""

from __future__ import annotations

import math

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")
scipy_special = pytest.importorskip("scipy.special")

from lnblocks.study.core.claims import Outcome, Verdict, all_of, verdict, within  # noqa: E402
from lnblocks.study.core.stats import (  # noqa: E402
    Estimate,
    agreement,
    beta_ppf,
    betainc,
    bootstrap_interval,
    clopper_pearson,
    largest_stable_lr,
    log_log_slope,
    mean_interval,
    ols_slope,
    ordered_share,
    paired_difference,
    seeds_needed,
    share,
    slope_over_seeds,
    t_ppf,
    welch_difference,
)


def with_moments(n: int, mean: float, sd: float, seed: int = 0) -> np.ndarray:
    """n values whose sample mean and SD (ddof=1) are exactly ``mean`` and ``sd``."""
    z = np.random.default_rng(seed).standard_normal(n)
    z = (z - z.mean()) / z.std(ddof=1)
    return mean + sd * z


def t_half_width(values: np.ndarray, level: float = 0.95) -> float:
    n = len(values)
    return scipy_stats.t.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)


# ---- distributions -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 15, 30, 120, 1000])
@pytest.mark.parametrize("p", [0.975, 0.995, 0.9, 0.6, 0.025, 0.3])
def test_t_ppf_matches_scipy(p: float, df: int) -> None:
    assert t_ppf(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize(("a", "b"), [(0.5, 0.5), (1.0, 3.0), (4.0, 1.0), (2.5, 7.0), (30.0, 0.5), (200.0, 150.0)])
@pytest.mark.parametrize("x", [1e-6, 0.01, 0.3, 0.5, 0.77, 0.999])
def test_betainc_matches_scipy(a: float, b: float, x: float) -> None:
    assert betainc(a, b, x) == pytest.approx(scipy_special.betainc(a, b, x), rel=1e-11, abs=1e-14)


@pytest.mark.parametrize(("a", "b"), [(1.0, 5.0), (4.0, 1.0), (3.0, 8.0), (0.5, 2.0), (40.0, 12.0)])
@pytest.mark.parametrize("q", [0.025, 0.5, 0.975])
def test_beta_ppf_matches_scipy(q: float, a: float, b: float) -> None:
    assert beta_ppf(q, a, b) == pytest.approx(scipy_stats.beta.ppf(q, a, b), rel=1e-10, abs=1e-13)


@pytest.mark.parametrize(("k", "n"), [(0, 4), (4, 4), (3, 4), (5, 5), (6, 6), (1, 10), (7, 12), (16, 16), (50, 100)])
def test_clopper_pearson_matches_scipy_binomtest(k: int, n: int) -> None:
    ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    low, high = clopper_pearson(k, n)
    assert low == pytest.approx(ci.low, abs=1e-12)
    assert high == pytest.approx(ci.high, abs=1e-12)


# ---- estimates -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_mean_interval_is_the_t_interval(level: float) -> None:
    x = np.array([1.31, 1.52, 1.18, 1.66, 1.44, 1.39, 1.27, 1.58])
    est = mean_interval(x, level)
    half = t_half_width(x, level)
    assert (est.value, est.n, est.label) == (pytest.approx(x.mean(), rel=1e-15), 8, "mean")
    assert est.low == pytest.approx(x.mean() - half, rel=1e-12)
    assert est.high == pytest.approx(x.mean() + half, rel=1e-12)
    assert est.spread == pytest.approx(x.std(ddof=1), rel=1e-12)


def test_t_interval_covers_the_true_mean_95_percent_of_the_time() -> None:
    """The interval's defining property, on 4000 draws of n=5 normal seeds: coverage 0.95 +- 3 binomial SEs."""
    rng = np.random.default_rng(1)
    hits = sum(mean_interval(rng.normal(2.0, 3.0, 5)).contains(2.0) for _ in range(4000))
    assert abs(hits / 4000 - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 4000)


@pytest.mark.parametrize("estimate", [mean_interval, bootstrap_interval])
def test_one_seed_has_no_interval(estimate) -> None:
    est = estimate([1.7])
    assert (est.low, est.high) == (-math.inf, math.inf)
    v = verdict(est, ">")
    assert v.outcome is Outcome.INCONCLUSIVE and v.seeds_needed is None
    assert str(v).endswith("would settle it: unknown (one seed has no spread)")


def test_ols_slope_matches_linregress() -> None:
    x = np.array([3.0, 3.0, 6.0, 6.0, 12.0, 12.0, 24.0, 24.0])
    y = np.array([0.9, 0.95, 0.71, 0.64, 0.61, 0.66, 0.33, 0.40])
    ref = scipy_stats.linregress(x, y)
    est = ols_slope(x, y)
    half = scipy_stats.t.ppf(0.975, len(x) - 2) * ref.stderr
    assert est.value == pytest.approx(ref.slope, rel=1e-12)
    assert est.low == pytest.approx(ref.slope - half, rel=1e-10)
    assert est.high == pytest.approx(ref.slope + half, rel=1e-10)
    assert (est.label, est.dof_lost) == ("slope", 2)


def test_log_log_slope_recovers_xiong_theorem1_power_law() -> None:
    """Pre-LN last-layer gradient ~ 1/sqrt(L) (Xiong et al. 2020, Theorem 1) with 5% multiplicative noise, 8 seeds
    at each depth: the fitted slope's interval contains -1/2, excludes 0, and equals linregress on the logs."""
    rng = np.random.default_rng(3)
    depth = np.repeat([3.0, 6.0, 12.0, 24.0], 8)
    grad = 0.3 / np.sqrt(depth) * np.exp(rng.normal(0, 0.05, depth.size))
    est = log_log_slope(depth, grad)
    ref = scipy_stats.linregress(np.log(depth), np.log(grad))
    assert est.value == pytest.approx(ref.slope, rel=1e-12)
    assert est.contains(-0.5)
    assert verdict(est, "<").outcome is Outcome.REPRODUCED


def test_slope_over_seeds_is_the_t_interval_of_per_seed_slopes() -> None:
    rng = np.random.default_rng(5)
    layers = np.arange(1, 13)
    profiles = [0.1 * np.exp(0.08 * layers + rng.normal(0, 0.1, 12)) for _ in range(16)]  # Post-LN-like: rising
    slopes = np.array([scipy_stats.linregress(layers, np.log(p)).slope for p in profiles])
    est = slope_over_seeds(profiles)
    half = t_half_width(slopes)
    assert est.n == 16
    assert est.value == pytest.approx(slopes.mean(), rel=1e-12)
    assert est.low == pytest.approx(slopes.mean() - half, rel=1e-10)
    assert verdict(est, ">").outcome is Outcome.REPRODUCED  # Post-LN: slope > 0
    falling = [p[::-1] for p in profiles]  # Pre-LN-like: falling toward the output
    assert verdict(slope_over_seeds(falling), ">").outcome is Outcome.DID_NOT_REPRODUCE
    assert verdict(slope_over_seeds(falling), "<").outcome is Outcome.REPRODUCED


def test_paired_difference_matches_scipy_ttest_rel() -> None:
    a = np.array([2.61, 2.70, 2.58, 2.66, 2.75, 2.63])
    b = np.array([2.49, 2.52, 2.51, 2.47, 2.55, 2.50])
    ci = scipy_stats.ttest_rel(a, b).confidence_interval(0.95)
    est = paired_difference(a, b)
    assert est.label == "difference"
    assert est.value == pytest.approx((a - b).mean(), rel=1e-12)
    assert (est.low, est.high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_bootstrap_is_deterministic_and_agrees_with_scipy(statistic: str) -> None:
    x = with_moments(24, 1.4, 0.3, seed=7)
    est = bootstrap_interval(x, statistic)
    assert est == bootstrap_interval(x, statistic)  # fixed seed: same numbers every call
    ref = scipy_stats.bootstrap(
        (x,), getattr(np, statistic), method="percentile", n_resamples=10_000, random_state=np.random.default_rng(0)
    ).confidence_interval
    # different random resamples: equal up to Monte Carlo error (a few % of the half-width)
    tol = 0.1 * (ref.high - ref.low) / 2
    assert est.low == pytest.approx(ref.low, abs=tol) and est.high == pytest.approx(ref.high, abs=tol)
    assert est.value == pytest.approx(float(getattr(np, statistic)(x)))


def test_bootstrap_of_the_mean_is_close_to_the_t_interval_for_normal_seeds() -> None:
    x = with_moments(40, 0.0, 1.0, seed=2)
    boot, t = bootstrap_interval(x), mean_interval(x)
    assert boot.half_width == pytest.approx(t.half_width, rel=0.1)


# ---- verdicts on synthetic seeds with known answers ----------------------------------------------------------------


def test_welch_difference_matches_scipy_ttest_ind() -> None:
    """Welch's interval (unequal variances, fractional df) equals scipy's ``ttest_ind(equal_var=False)``."""
    a, b = with_moments(5, 99.0, 0.4, seed=1), with_moments(7, 97.5, 1.5, seed=2)
    d = welch_difference(a, b)
    ci = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d.value == pytest.approx(1.5, abs=1e-12) and d.n == 5 and d.label == "difference"
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert math.isinf(welch_difference([1.0], [2.0, 3.0]).half_width)  # one seed on a side: no interval
    assert welch_difference([1.0, 1.0], [0.0, 0.0]).half_width == 0.0  # no spread: the point itself


def test_within_and_all_of() -> None:
    """``|value| < margin``: inside the margin, wholly beyond it, straddling it; a claim of parts is reproduced
    only when every part is and refuted when one part is."""
    tight = mean_interval(with_moments(16, 0.2, 0.2))  # [0.09, 0.31]
    assert within(tight, 1.0).outcome is Outcome.REPRODUCED and within(tight, 1.0).claim == "|mean| < 1"
    assert within(mean_interval(with_moments(16, -3.0, 0.2)), 1.0).outcome is Outcome.DID_NOT_REPRODUCE
    noisy = within(mean_interval(with_moments(4, 0.8, 1.0)), 1.0)  # [-0.79, 2.39]: straddles +1
    assert noisy.outcome is Outcome.INCONCLUSIVE and noisy.threshold == 1.0
    assert noisy.seeds_needed == seeds_needed(noisy.estimate, 1.0)
    yes, no = within(tight, 1.0), within(mean_interval(with_moments(16, -3.0, 0.2)), 1.0)
    assert all_of([yes, yes], "both").outcome is Outcome.REPRODUCED
    assert all_of([yes, noisy], "both").outcome is Outcome.INCONCLUSIVE
    assert all_of([yes, noisy], "both").estimate is noisy.estimate  # the part that decides it
    assert all_of([noisy, no, yes], "all").outcome is Outcome.DID_NOT_REPRODUCE
    with pytest.raises(ValueError, match="margin must be a finite number > 0"):
        within(tight, 0.0)


def test_clear_effect_is_reproduced_and_its_opposite_is_not() -> None:
    x = with_moments(16, 1.0, 0.2)  # t half-width 0.107: far from 0
    assert verdict(mean_interval(x), ">").outcome is Outcome.REPRODUCED
    assert verdict(mean_interval(x), "<").outcome is Outcome.DID_NOT_REPRODUCE
    assert verdict(mean_interval(x), ">", 0.5).outcome is Outcome.REPRODUCED
    assert verdict(mean_interval(x), ">", 1.5).outcome is Outcome.DID_NOT_REPRODUCE


def test_null_effect_is_inconclusive_for_a_direction_and_refutes_a_size() -> None:
    x = np.array([s * k / 4 for k in range(1, 9) for s in (1, -1)])  # 16 values, mean exactly 0, SD 1.30
    v = verdict(mean_interval(x), ">")
    assert v.outcome is Outcome.INCONCLUSIVE
    assert v.seeds_needed is None  # the observed effect is exactly at the threshold: no n settles it
    assert str(v).endswith("no number of seeds (the estimate sits on the threshold)")
    # a claim of a meaningful effect (> 1, about one SD) is contradicted: the interval [-0.695, 0.695] lies below it
    assert verdict(mean_interval(x), ">", 1.0).outcome is Outcome.DID_NOT_REPRODUCE


def test_noisy_effect_is_inconclusive_and_seeds_needed_follows_the_formula() -> None:
    mean, sd = 0.3, 1.0
    v = verdict(mean_interval(with_moments(4, mean, sd)), ">")
    assert v.outcome is Outcome.INCONCLUSIVE
    # the formula, with scipy's t: the smallest n with t(0.975, n-1) * sd / sqrt(n) < |effect|
    expected = next(n for n in range(2, 10_000) if scipy_stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) < mean)
    assert v.seeds_needed == expected == 46
    # and it is the right n: the same mean and SD over `expected` seeds settle it, one fewer does not
    assert verdict(mean_interval(with_moments(expected, mean, sd)), ">").outcome is Outcome.REPRODUCED
    assert verdict(mean_interval(with_moments(expected - 1, mean, sd)), ">").outcome is Outcome.INCONCLUSIVE


def test_seeds_needed_for_a_slope_spends_two_degrees_of_freedom() -> None:
    est = Estimate(0.2, -0.1, 0.5, 5, "slope", spread=0.6, dof_lost=2)
    expected = next(n for n in range(3, 10_000) if scipy_stats.t.ppf(0.975, n - 2) * 0.6 / math.sqrt(n) < 0.2)
    assert seeds_needed(est, 0.0) == expected


@pytest.mark.parametrize(
    ("k", "n", "outcome", "needed"),
    [
        (6, 6, Outcome.REPRODUCED, None),  # lower bound 0.541 > 1/2
        (5, 5, Outcome.INCONCLUSIVE, 6),  # lower bound 0.478
        (4, 4, Outcome.INCONCLUSIVE, 6),  # lower bound 0.398
        (2, 2, Outcome.INCONCLUSIVE, 6),
        (0, 6, Outcome.DID_NOT_REPRODUCE, None),  # upper bound 0.459 < 1/2
        (3, 6, Outcome.INCONCLUSIVE, None),  # exactly half: more seeds cannot settle it
    ],
)
def test_share_rule(k: int, n: int, outcome: Outcome, needed: int | None) -> None:
    v = verdict(share(k, n), ">")
    ci = scipy_stats.binomtest(k, n).proportion_ci(method="exact")
    assert v.outcome is outcome
    assert v.outcome is not Outcome.REPRODUCED or ci.low > 0.5
    assert v.outcome is not Outcome.DID_NOT_REPRODUCE or ci.high < 0.5
    assert v.seeds_needed == needed


def test_share_seeds_needed_settles_at_that_n() -> None:
    v = verdict(share(7, 9), ">")  # 0.778 [0.400, 0.972]
    assert v.outcome is Outcome.INCONCLUSIVE
    m = v.seeds_needed
    assert m is not None and m > 9
    assert scipy_stats.binomtest(round(7 / 9 * m), m).proportion_ci(method="exact").low > 0.5


def test_agreement_counts_true_flags() -> None:
    est = agreement([True, True, False, True])
    assert (est.successes, est.n, est.value) == (3, 4, 0.75)


def test_largest_stable_lr_is_censored_at_both_ends_of_the_grid() -> None:
    assert largest_stable_lr({3e-4: True, 1e-3: True, 3e-3: False}) == 1e-3
    assert largest_stable_lr({3e-4: False, 1e-3: False}) == -math.inf  # below the grid
    assert largest_stable_lr({3e-4: True, 1e-3: True}) == math.inf  # the grid does not reach the threshold


def test_ordered_share_leaves_out_what_the_grid_cannot_resolve() -> None:
    post = [1e-3, 3e-4, math.inf, 1e-3, -math.inf]
    pre = [math.inf, math.inf, math.inf, 1e-3, -math.inf]
    est, left_out = ordered_share(post, pre)
    assert left_out == 3  # both censored at the top, both below the grid, and a tie on the grid
    assert (est.successes, est.n) == (2, 2)
    # a wider grid (an extra lr 1e-2, where seed 2's Post-LN fails and its Pre-LN trains) resolves one more seed
    # and reverses none
    wider, left_out = ordered_share([1e-3, 3e-4, 3e-3, 1e-3, -math.inf], pre)
    assert (wider.successes, wider.n, left_out) == (3, 3, 2)
    assert ordered_share([math.inf], [math.inf]) == (None, 1)


# ---- rendering and errors ------------------------------------------------------------------------------------------


def test_rendering() -> None:
    assert str(Estimate(1.42, 1.20, 1.64, 16)) == "mean 1.42 [1.20, 1.64] (n=16)"
    assert format(Estimate(1.42, 1.2, 1.64, 16), ".1f") == "mean 1.4 [1.2, 1.6] (n=16)"
    assert str(share(4, 4)) == "4/4 (share 1.00 [0.398, 1.00])"
    v = verdict(share(4, 4), ">")
    assert isinstance(v, Verdict)
    assert str(v) == ("INCONCLUSIVE: 4/4 (share 1.00 [0.398, 1.00]) vs claim share > 0.5; would settle it: ~6 seeds")
    assert str(verdict(Estimate(0.3, 0.1, 0.5, 8, "slope"), ">")).startswith("REPRODUCED: slope 0.300")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: mean_interval([]), "values"),
        (lambda: mean_interval([1.0, math.nan]), "finite"),
        (lambda: mean_interval([1.0, 2.0], level=1.5), "level"),
        (lambda: paired_difference([1.0, 2.0], [1.0]), "equal lengths"),
        (lambda: ols_slope([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]), "constant"),
        (lambda: log_log_slope([1.0, 2.0], [0.0, 1.0]), "positive"),
        (lambda: slope_over_seeds([[1.0, 2.0], [1.0, 2.0, 3.0]]), "entries"),
        (lambda: bootstrap_interval([1.0, 2.0], statistic="mode"), "statistic"),
        (lambda: clopper_pearson(5, 4), "successes"),
        (lambda: agreement([1, 0]), "bools"),
        (lambda: largest_stable_lr({}), "at least one"),
        (lambda: ordered_share([1.0], [1.0, 2.0]), "equal lengths"),
        (lambda: ordered_share([math.nan], [1.0]), "lower"),
        (lambda: verdict(Estimate(1.0, 0.5, 1.5, 3), ">="), "claim"),
        (lambda: Estimate(1.0, 2.0, 0.5, 3), "low <= high"),
    ],
)
def test_bad_input_names_the_problem(call, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        call()
