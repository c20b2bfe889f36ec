"""Statistics the perf and regression modules share: percentiles, mean/std/CV, Mann-Whitney U, bootstrap.

All functions take plain sequences of numbers (lists, tuples, numpy arrays) and return Python floats,
so results can go straight into YAML / JSON.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy import stats as _scipy_stats

Samples = Sequence[float]


def _array(samples: Samples, what: str = "samples") -> np.ndarray:
    a = np.asarray(samples, dtype=float)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{what} must be a non-empty 1-D sequence of numbers")
    if not np.all(np.isfinite(a)):
        # A NaN/inf sample means a broken measurement; silently dropping it would bias every statistic.
        raise ValueError(f"{what} contain NaN or infinity")
    return a


def percentile(samples: Samples, q: float) -> float:
    """q-th percentile (0..100), linear interpolation: the convention numpy, vLLM bench and llama-benchy use."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    return float(np.percentile(_array(samples), q))


def median(samples: Samples) -> float:
    return float(np.median(_array(samples)))


def mean_std(samples: Samples) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1, as llama-bench reports `mean ± std`); std is 0 for one sample."""
    a = _array(samples)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def cv(samples: Samples) -> float:
    """Coefficient of variation std/|mean|; NaN when undefined (one sample, or mean 0 with spread)."""
    a = _array(samples)
    if a.size < 2:
        return math.nan
    mean, std = mean_std(a)
    if mean == 0.0:
        return 0.0 if std == 0.0 else math.nan
    return std / abs(mean)


def worst_cv(sample_sets: Iterable[Samples]) -> float:
    """The largest CV among the sets whose CV is defined (two or more samples, mean not 0); NaN when none is.
    Filtered first because max() with a NaN first returns the NaN."""
    cvs = (cv(s) for s in sample_sets if len(s) > 1)
    return max((c for c in cvs if math.isfinite(c)), default=math.nan)


def mann_whitney_u(a: Samples, b: Samples) -> float:
    """Two-sided Mann-Whitney U p-value: a rank test, so one outlier run cannot fake (or hide) a shift."""
    x, y = _array(a, "first samples"), _array(b, "second samples")
    if np.all(x == x[0]) and np.all(y == x[0]):
        # Every value tied (e.g. a deterministic counter): no evidence of any shift; answer without scipy,
        # whose handling of the degenerate case has changed between versions.
        return 1.0
    return float(_scipy_stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)


def bootstrap_ratio_ci(
    baseline: Samples,
    current: Samples,
    stat: Callable[..., float] = np.median,
    n: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of stat(current) / stat(baseline).

    Both sides are resampled independently (they are separate runs). Seeded, so a verdict is reproducible
    from the same samples. `stat` must accept `axis=` (numpy reductions do).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be within (0, 1), got {level}")
    if n < 1:
        raise ValueError(f"bootstrap resample count must be positive, got {n}")
    base, cur = _array(baseline, "baseline samples"), _array(current, "current samples")
    rng = np.random.default_rng(seed)
    base_stats = stat(rng.choice(base, size=(n, base.size), replace=True), axis=1)
    cur_stats = stat(rng.choice(cur, size=(n, cur.size), replace=True), axis=1)
    if np.any(base_stats == 0.0):
        raise ValueError("baseline statistic is 0 in some resample; a ratio against it is undefined")
    ratios = cur_stats / base_stats
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return float(lo), float(hi)


def fmt(x: float, digits: int = 4) -> str:
    """`digits` significant digits without exponent or trailing-dot surprises: 30 -> '30.00', 4341.2 -> '4341'."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"
