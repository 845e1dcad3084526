"""Statistics behind the study's verdicts (``core.claims``): intervals over seeds, fitted slopes, shares of agreeing
seeds, and the number of seeds that would settle an interval that straddles a threshold.

The unit of replication is the seed (an independent init and data order): every interval here is over seeds, never
over the layers or batches of one run. Quantiles of Student's t and of the beta distribution are computed from the
regularised incomplete beta function (continued fraction, fp64), so the module needs only NumPy (for the bootstrap)
and no SciPy; tests/study/core/test_stats.py checks them against ``scipy.stats``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
BOOTSTRAP_SEED = 20_231_003  # fixed: the same values always give the same bootstrap interval
MAX_SEEDS = 100_000  # seeds_needed gives up (None) beyond this


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval over ``n`` independent observations (seeds).

    ``label`` says what ``value`` is (``"mean"``, ``"slope"``, ``"difference"``, ``"share"``, ...). ``spread`` is the
    per-observation standard deviation behind a t-interval (``SE * sqrt(n)``) and ``dof_lost`` the degrees of freedom
    the fit spent (1 for a mean, 2 for a line); they let ``seeds_needed`` extrapolate the half-width to another n.
    ``successes`` is set for shares (``successes / n``). ``str()`` reads ``"mean 1.42 [1.20, 1.64] (n=16)"``;
    ``format(est, ".2f")`` picks the number format.
    """

    value: float
    low: float
    high: float
    n: int
    label: str = "mean"
    spread: float = math.nan
    dof_lost: int = 1
    successes: int | None = None
    level: float = LEVEL

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"Estimate.n must be an int >= 1, got {self.n!r}")
        if not self.low <= self.high:
            raise ValueError(f"Estimate interval must have low <= high, got [{self.low}, {self.high}]")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"Estimate.level must be in (0, 1), got {self.level!r}")

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies inside the interval (e.g. Xiong's Theorem-1 slope -1/2)."""
        return self.low <= x <= self.high

    def __format__(self, spec: str) -> str:
        spec = spec or "#.3g"
        interval = f"[{self.low:{spec}}, {self.high:{spec}}]"
        if self.successes is not None:
            return f"{self.successes}/{self.n} ({self.label} {self.value:{spec}} {interval})"
        return f"{self.label} {self.value:{spec}} {interval} (n={self.n})"

    def __str__(self) -> str:
        return format(self)


# ---- distributions (fp64, no SciPy) -------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``, the CDF of Beta(a, b) at ``x``."""
    if a <= 0 or b <= 0:
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """Quantile of Beta(a, b): the x with ``I_x(a, b) = q`` (bisection to fp64 resolution)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"beta_ppf: q must be in [0, 1], got {q!r}")
    lo, hi = 0.0, 1.0
    while hi - lo > 2e-16 * hi:  # relative fp64 resolution of the answer
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@lru_cache(maxsize=4096)
def t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom, from ``P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2)``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_ppf: p must be in (0, 1), got {p!r}")
    if not df > 0:
        raise ValueError(f"t_ppf: df must be > 0, got {df!r}")
    if p == 0.5:
        return 0.0
    tail = 2.0 * min(p, 1.0 - p)  # two-sided tail probability
    x = beta_ppf(tail, df / 2.0, 0.5)
    t = math.sqrt(df * (1.0 - x) / x)
    return t if p > 0.5 else -t


# ---- estimates ----------------------------------------------------------------------------------------------------


def _values(values: Sequence[float], name: str, minimum: int = 1) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers, got {values!r}") from None
    if arr.ndim != 1 or arr.size < minimum:
        raise ValueError(f"{name} must be a flat sequence of at least {minimum} number(s), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (cap diverged runs first), got {values!r}")
    return arr


def _check_level(level: float) -> float:
    if not isinstance(level, float | int) or not 0.0 < level < 1.0:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    return float(level)


def _t_estimate(value: float, se: float, n: int, dof_lost: int, label: str, level: float) -> Estimate:
    df = n - dof_lost
    if df < 1:  # no spread to estimate: the interval is the whole line
        return Estimate(value, -math.inf, math.inf, n, label, math.nan, dof_lost, level=level)
    half = t_ppf(0.5 + level / 2.0, df) * se
    return Estimate(value, value - half, value + half, n, label, se * math.sqrt(n), dof_lost, level=level)


def mean_interval(values: Sequence[float], level: float = LEVEL, label: str = "mean") -> Estimate:
    """Mean over seeds with its Student-t interval ``mean +- t(1 - a/2, n-1) * s / sqrt(n)``; one value gives an
    unbounded interval."""
    level = _check_level(level)
    arr = _values(values, "values")
    n = arr.size
    sd = float(arr.std(ddof=1)) if n > 1 else math.nan
    return _t_estimate(float(arr.mean()), sd / math.sqrt(n), n, 1, label, level)


def bootstrap_interval(
    values: Sequence[float],
    statistic: str = "mean",
    level: float = LEVEL,
    resamples: int = 10_000,
    seed: int = BOOTSTRAP_SEED,
) -> Estimate:
    """Percentile bootstrap interval of the ``"mean"`` or ``"median"`` over seeds (Efron 1979): resample the values
    with replacement ``resamples`` times with a fixed-seed generator, so the result is deterministic. ``spread`` is
    the sample SD (for ``seeds_needed``'s normal-theory extrapolation). With few seeds (under about 10) the
    percentile interval is narrower than it should be: prefer ``mean_interval`` there."""
    level = _check_level(level)
    funcs = {"mean": np.mean, "median": np.median}
    if statistic not in funcs:
        raise ValueError(f"statistic must be one of {list(funcs)}, got {statistic!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an int >= 100, got {resamples!r}")
    arr = _values(values, "values")
    n = arr.size
    value = float(funcs[statistic](arr))
    if n == 1:  # one seed: every resample is the same value, which says nothing about the spread
        return Estimate(value, -math.inf, math.inf, 1, statistic, math.nan, 1, level=level)
    rng = np.random.default_rng(seed)
    stats = funcs[statistic](arr[rng.integers(0, n, size=(resamples, n))], axis=1)
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(value, float(low), float(high), n, statistic, float(arr.std(ddof=1)), 1, level=level)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Estimate:
    """Mean of ``a[i] - b[i]`` over paired seeds (same seed, two arms) with its t-interval: pairing removes the
    between-seed variation both arms share."""
    xa, xb = _values(a, "a"), _values(b, "b")
    if xa.size != xb.size:
        raise ValueError(f"paired_difference needs equal lengths, got {xa.size} and {xb.size}")
    return mean_interval(xa - xb, level, label="difference")


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Estimate:
    """``mean(a) - mean(b)`` of two independent groups of seeds with Welch's t-interval (Welch-Satterthwaite degrees
    of freedom, fractional; Welch 1947): no equal-variance assumption. ``n`` is the smaller group; a group of one
    seed gives an unbounded interval, two groups without spread the point itself."""
    level = _check_level(level)
    xa, xb = _values(a, "a"), _values(b, "b")
    diff = float(xa.mean() - xb.mean())
    n = min(xa.size, xb.size)
    if n < 2:
        return Estimate(diff, -math.inf, math.inf, n, "difference", math.nan, 1, level=level)
    va, vb = float(xa.var(ddof=1)) / xa.size, float(xb.var(ddof=1)) / xb.size  # variances of the two means
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Estimate(diff, diff, diff, n, "difference", 0.0, 1, level=level)
    df = (va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1))
    half = t_ppf(0.5 + level / 2.0, df) * se
    return Estimate(diff, diff - half, diff + half, n, "difference", se * math.sqrt(n), 1, level=level)


def ols_slope(x: Sequence[float], y: Sequence[float], level: float = LEVEL) -> Estimate:
    """Least-squares slope of ``y`` on ``x`` with its t-interval (``n - 2`` degrees of freedom). The points must be
    independent draws (e.g. one per seed and depth); for a profile within one run use ``slope_over_seeds``."""
    level = _check_level(level)
    xs, ys = _values(x, "x", 2), _values(y, "y", 2)
    if xs.size != ys.size:
        raise ValueError(f"ols_slope needs equal lengths, got {xs.size} x and {ys.size} y")
    dx = xs - xs.mean()
    sxx = float(dx @ dx)
    if sxx == 0.0:
        raise ValueError("ols_slope: x must not be constant")
    slope = float(dx @ (ys - ys.mean())) / sxx
    n = xs.size
    resid = ys - ys.mean() - slope * dx
    se = math.sqrt(float(resid @ resid) / (n - 2) / sxx) if n > 2 else math.nan
    return _t_estimate(slope, se, n, 2, "slope", level)


def log_log_slope(x: Sequence[float], y: Sequence[float], level: float = LEVEL) -> Estimate:
    """``ols_slope`` of ``log y`` on ``log x``: a power law ``y ~ x^k`` has slope ``k`` (Xiong et al. 2020's
    Theorem 1 bounds Pre-LN's last-layer gradient by ``O(1/sqrt L)``, slope -1/2)."""
    xs, ys = _values(x, "x", 2), _values(y, "y", 2)
    if np.any(xs <= 0) or np.any(ys <= 0):
        raise ValueError("log_log_slope needs positive x and y")
    return ols_slope(np.log(xs), np.log(ys), level)


def slope_over_seeds(
    profiles: Sequence[Sequence[float]], x: Sequence[float] | None = None, log_y: bool = True, level: float = LEVEL
) -> Estimate:
    """One least-squares slope per seed (``log y`` against ``x``, default the 1-based layer index), then the mean
    over seeds with its t-interval: the seeds, not the layers of one run, are the independent observations.
    E.g. the slope of ``log ||grad W_2||`` against layer index is > 0 for Post-LN and < 0 for Pre-LN (Xiong Fig. 3)."""
    if not profiles:
        raise ValueError("slope_over_seeds needs at least one profile")
    rows = [_values(p, f"profiles[{i}]", 2) for i, p in enumerate(profiles)]
    width = rows[0].size
    if any(r.size != width for r in rows):
        raise ValueError(f"slope_over_seeds: every profile must have {width} entries, got {[r.size for r in rows]}")
    xs = np.arange(1, width + 1, dtype=np.float64) if x is None else _values(x, "x", 2)
    if xs.size != width:
        raise ValueError(f"slope_over_seeds: x has {xs.size} entries, profiles have {width}")
    if log_y and any(np.any(r <= 0) for r in rows):
        raise ValueError("slope_over_seeds with log_y needs positive profiles")
    slopes = [ols_slope(xs, np.log(r) if log_y else r).value for r in rows]
    return mean_interval(slopes, level, label="slope")


@lru_cache(maxsize=4096)
def clopper_pearson(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Exact binomial interval (Clopper & Pearson 1934): ``Beta(a/2; k, n-k+1)`` and ``Beta(1-a/2; k+1, n-k)``."""
    level = _check_level(level)
    for name, v in (("successes", successes), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"clopper_pearson needs n >= 1 and 0 <= successes <= n, got {successes}/{n}")
    alpha = 1.0 - level
    low = 0.0 if successes == 0 else beta_ppf(alpha / 2, successes, n - successes + 1)
    high = 1.0 if successes == n else beta_ppf(1 - alpha / 2, successes + 1, n - successes)
    return low, high


def share(successes: int, n: int, level: float = LEVEL) -> Estimate:
    """Share of ``n`` seeds that agree with a claim, with its Clopper-Pearson interval; reads ``"4/4 (share 1.00
    [0.398, 1.00])"``."""
    low, high = clopper_pearson(successes, n, level)
    return Estimate(successes / n, low, high, n, "share", successes=successes, level=level)


def agreement(flags: Sequence[bool], level: float = LEVEL) -> Estimate:
    """``share`` of the True entries (one per seed: did this seed show the claimed behaviour?)."""
    flags = list(flags)
    if not flags or not all(isinstance(f, bool | np.bool_) for f in flags):
        raise ValueError(f"agreement needs a non-empty sequence of bools, got {flags!r}")
    return share(int(sum(bool(f) for f in flags)), len(flags), level)


def largest_stable_lr(trained: Mapping[float, bool]) -> float:
    """The largest LR of one (arm, depth, seed) whose run trained, on whatever grid the config has: ``-inf`` when
    none did (the threshold is below the grid), ``+inf`` when the grid's largest LR trained (the grid does not reach
    the threshold). Xiong et al. 2020's warmup claims are threshold claims: compare these, not single cells."""
    if not trained:
        raise ValueError("largest_stable_lr needs at least one (lr, trained) pair")
    if trained[max(trained)]:
        return math.inf
    ok = [lr for lr, t in trained.items() if t]
    return max(ok) if ok else -math.inf


def ordered_share(lower: Sequence[float], higher: Sequence[float], level: float = LEVEL) -> tuple[Estimate | None, int]:
    """Share of seeds with ``lower[i] < higher[i]`` (e.g. Post-LN's largest stable LR below Pre-LN's), among the
    seeds the grid resolves; ties, both-censored pairs included, are left out and counted. Returns the share (None
    when no seed is resolved) and how many were left out. Under failure monotone in LR, a wider or finer grid only
    resolves more seeds: it never reverses a resolved one."""
    lo, hi = _pair(lower, "lower"), _pair(higher, "higher")
    if len(lo) != len(hi):
        raise ValueError(f"ordered_share needs equal lengths, got {len(lo)} and {len(hi)}")
    resolved = [a < b for a, b in zip(lo, hi) if a != b]
    left_out = len(lo) - len(resolved)
    return (agreement(resolved, level) if resolved else None), left_out


def _pair(values: Sequence[float], name: str) -> list[float]:
    vals = [float(v) for v in values]
    if not vals or any(math.isnan(v) for v in vals):
        raise ValueError(f"{name} must be a non-empty sequence of numbers (+-inf allowed), got {values!r}")
    return vals


# ---- how many seeds would settle it ----------------------------------------------------------------------------------


def _share_seeds_needed(est: Estimate, threshold: float) -> int | None:
    """About the smallest n at which the observed share, kept, gives a Clopper-Pearson interval clear of
    ``threshold``: doubling, then bisection (rounding ``share * n`` makes the condition only nearly monotone)."""
    p = est.value
    if p == threshold:
        return None

    def settles(m: int) -> bool:
        k = min(m, max(0, round(p * m)))
        low, high = clopper_pearson(k, m, est.level)
        return low > threshold if p > threshold else high < threshold

    lo, hi = est.n, est.n + 1
    while not settles(hi):
        lo, hi = hi, 2 * hi
        if hi > MAX_SEEDS:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if settles(mid) else (mid, hi)
    return hi


def seeds_needed(est: Estimate, threshold: float) -> int | None:
    """The smallest total n whose interval would exclude ``threshold`` if the observed effect and spread held:
    for t-intervals the n with ``t(1 - a/2, n - k) * spread / sqrt(n) < |value - threshold|``; for shares the n at
    which the observed share's Clopper-Pearson interval clears the threshold. None when it cannot be estimated."""
    if est.successes is not None:
        return _share_seeds_needed(est, threshold)
    effect = abs(est.value - threshold)
    if effect == 0.0 or not math.isfinite(est.spread):
        return None
    if est.spread == 0.0:
        return est.dof_lost + 1
    q = 0.5 + est.level / 2.0
    # the normal bound is a lower limit on n (t > z): start from it and step up
    z = NormalDist().inv_cdf(q)
    n = max(est.dof_lost + 1, math.ceil((z * est.spread / effect) ** 2))
    while n < MAX_SEEDS:
        if t_ppf(q, n - est.dof_lost) * est.spread / math.sqrt(n) < effect:
            return n
        n += 1
    return None
