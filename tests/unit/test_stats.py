"""harness.core.stats on hand-computed examples."""
import math

import numpy as np
import pytest

from harness.core import stats


def test_percentile_interpolates_linearly():
    assert stats.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert stats.percentile(range(1, 101), 99) == pytest.approx(99.01)
    assert stats.percentile([7.0], 99) == 7.0


def test_percentile_rejects_bad_q_and_empty_or_nan_samples():
    with pytest.raises(ValueError):
        stats.percentile([1, 2], 101)
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.median([1.0, float("nan")])


def test_mean_std_uses_sample_std():
    mean, std = stats.mean_std([2, 4, 4, 4, 5, 5, 7, 9])
    assert mean == pytest.approx(5.0)
    assert std == pytest.approx(math.sqrt(32 / 7))  # ddof=1, as llama-bench's "±"
    assert stats.mean_std([3.0]) == (3.0, 0.0)


def test_cv():
    assert stats.cv([10, 10, 10]) == 0.0
    assert stats.cv([9, 11]) == pytest.approx(math.sqrt(2) / 10)
    assert math.isnan(stats.cv([5.0]))


def test_worst_cv_skips_undefined_cvs_wherever_they_stand():
    noisy = [9, 11]
    assert stats.worst_cv([[1.0, -1.0], noisy]) == stats.worst_cv([noisy, [1.0, -1.0]]) == stats.cv(noisy)
    assert stats.worst_cv([[5.0], [], [10, 10]]) == 0.0  # one sample or none: no CV, not an error
    assert math.isnan(stats.worst_cv([[5.0], [1.0, -1.0]]))


def test_mann_whitney_identical_and_separated():
    assert stats.mann_whitney_u([5, 5, 5], [5, 5, 5]) == 1.0
    # complete separation of 5 vs 5: exact two-sided p = 2 / C(10, 5)
    assert stats.mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert stats.mann_whitney_u([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) > 0.5
    # each side constant at its own value (a deterministic count that moved): a shift, not a tie
    assert stats.mann_whitney_u([5, 5, 5, 5, 5], [4, 4, 4, 4, 4]) < 0.05


def test_bootstrap_ratio_ci_brackets_true_ratio_and_is_reproducible():
    rng = np.random.default_rng(1)
    base = 100 * (1 + 0.01 * rng.standard_normal(20))
    cur = base * 1.10
    lo, hi = stats.bootstrap_ratio_ci(base, cur)
    assert lo < 1.10 < hi or lo == pytest.approx(1.10) or hi == pytest.approx(1.10)
    assert lo > 1.0
    assert (lo, hi) == stats.bootstrap_ratio_ci(base, cur)  # seeded
    lo90, hi90 = stats.bootstrap_ratio_ci(base, cur, level=0.90)
    assert lo90 >= lo and hi90 <= hi


def test_bootstrap_ratio_ci_level_is_two_sided():
    """A 95% CI leaves 2.5% of the resampled ratios out on each side: for the mean of 1000 evenly spread samples
    against a constant 1.0 it spans +-1.96 standard errors (a 90% one, +-1.645, would let a gate fail or pass on less)."""
    cur = np.linspace(0.5, 1.5, 1000)
    se = cur.std() / np.sqrt(cur.size)
    lo, hi = stats.bootstrap_ratio_ci([1.0] * 10, cur, stat=np.mean, level=0.95)
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.08)


def test_bootstrap_of_constant_samples_is_a_point():
    assert stats.bootstrap_ratio_ci([2.0] * 5, [3.0] * 5) == pytest.approx((1.5, 1.5))


def test_bootstrap_rejects_bad_level():
    with pytest.raises(ValueError):
        stats.bootstrap_ratio_ci([1.0], [1.0], level=1.0)


def test_fmt_significant_digits():
    assert stats.fmt(30) == "30.00"
    assert stats.fmt(4341.2) == "4341"
    assert stats.fmt(0.012345) == "0.01235"
    assert stats.fmt(0) == "0"
