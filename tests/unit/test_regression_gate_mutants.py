"""Level 5 gate verdicts at the edges a mutation audit of harness.perf.regression / harness.core.stats found unguarded
in the unit tier: each test names the fault it keeps out (a regression passing, an A/A failing, an inconclusive
verdict turning into a pass, or a statistic drifting from its definition)."""
import math

import numpy as np
import pytest
from scipy.stats import norm

from harness.core import stats
from harness.perf import regression
from harness.perf.regression import GIB, Reason, Thresholds, compare_metric

T = Thresholds()


def spread(median: float, cv: float, n: int) -> list[float]:
    """n samples at evenly spaced normal quantiles: median exactly `median` (odd n), CV about `cv`, no seed luck."""
    z = norm.ppf((np.arange(n) + 0.5) / n)
    return list(median * (1 + cv * z))


# -- statistics -----------------------------------------------------------------------------------------------------
def test_worst_cv_is_the_largest_defined_cv_not_the_smallest():
    """Rounds are sized for the noisiest metric: reporting the quietest CV would run too few rounds for the rest."""
    quiet, noisy = [10.0, 10.0, 10.0], [9.0, 11.0]
    assert stats.worst_cv([quiet, noisy]) == stats.worst_cv([noisy, quiet]) == stats.cv(noisy) > stats.cv(quiet)


def test_bootstrap_resamples_have_the_runs_own_sample_count():
    """A resample of a run has as many samples as the run: the median of two samples is their mean, so the central
    ratios of [1, 3] against a constant 1 sit at 2. Resampling one sample fewer (the median of one draw: 1 or 3)
    would misplace and widen every CI the gate judges by."""
    lo, hi = stats.bootstrap_ratio_ci([1.0] * 5, [1.0, 3.0], level=0.05)
    assert lo == hi == pytest.approx(np.median([1.0, 3.0]))
    lo, hi = stats.bootstrap_ratio_ci([1.0, 3.0], [1.0] * 5, level=0.05)
    assert lo == hi == pytest.approx(1.0 / np.median([1.0, 3.0]))


# -- the gate edges -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, higher_is_better, factor", [("tg32", True, 1 - T.throughput_drop),
                                                            ("ttft_ms", False, 1 + T.latency_rise)])
def test_a_change_of_exactly_the_gate_is_not_a_regression(name, higher_is_better, factor):
    """The gate fails on MORE than 3%: 97 of 100 (a ratio whose float is -3.0000000000000027%) must not fail on the
    rounding, however significant and tight the CI."""
    v = compare_metric(name, [100.0] * 8, [100.0 * factor] * 8, higher_is_better, T)
    assert v.p_value < T.alpha  # tight and significant: only the threshold's edge keeps it from failing
    assert v.status == "pass", v.message


def test_a_kv_capacity_drop_or_memory_growth_of_exactly_the_gate_is_not_a_regression():
    """950,000 of 1,000,000 KV tokens is exactly the 5% gate (a float of 5.0000000000000044%); a growth of exactly
    1 GB is the memory gate: neither fails."""
    kv = regression.compare_kv_capacity(1_000_000, 1_000_000 * (1 - T.kv_capacity_drop), T)
    assert kv.status == "pass", kv.detail
    mem = regression.compare_used_memory(62.0, 62.0 + T.memory_growth_gb * 1e9 / GIB, T)
    assert mem.status == "pass", mem.detail


def test_a_latency_is_judged_by_latency_rise_and_a_rate_by_throughput_drop():
    """With a loose latency gate (10%) and the default 3% throughput gate, a 5% slower rate fails and a 5% longer
    latency does not: swapping the two thresholds would pass the rate and fail the latency."""
    th = Thresholds(latency_rise=0.10)
    rate = compare_metric("tg32", spread(100.0, 0.003, 9), spread(95.0, 0.003, 9), True, th)
    latency = compare_metric("ttft_ms", spread(100.0, 0.003, 9), spread(105.0, 0.003, 9), False, th)
    assert rate.status == "fail", rate.message
    assert latency.status != "fail", latency.message


@pytest.mark.parametrize("noisy_side", ["baseline", "current"])
def test_a_noisy_side_is_never_a_pass_whichever_side_it_is(noisy_side):
    """Above max_cv on EITHER side a 3% change is not resolvable: "inconclusive", never "pass", even when many
    rounds make the CI of the median ratio narrow. A noisy baseline must not be overlooked."""
    noisy, quiet = spread(100.0, 0.06, 401), spread(100.0, 0.003, 401)
    base, cur = (noisy, quiet) if noisy_side == "baseline" else (quiet, noisy)
    v = compare_metric("tg32", base, cur, True, T)
    assert max(v.cv_baseline, v.cv_current) > T.max_cv
    assert v.ci[0] >= 1 - T.throughput_drop  # the CI alone would resolve the gate: only the noise rule stops a pass
    assert v.status == "inconclusive" and v.reason is Reason.NOISY, v.message


def test_on_noisy_runs_the_ci_must_clear_the_threshold_itself_to_fail():
    """Noisy runs (CV above max_cv): a median 3.5% lower whose CI lies below 1.0 but not below 0.97 cannot tell a
    3% regression from noise; it is inconclusive, not a fail (the widening of the CI's edge by the threshold)."""
    v = compare_metric("tg32", spread(100.0, 0.06, 401), spread(96.5, 0.06, 401), True, T)
    assert min(v.cv_baseline, v.cv_current) > T.max_cv and v.p_value < T.alpha
    assert v.ci[1] < 1.0 and v.ci[1] >= 1 - T.throughput_drop  # beyond "no change", not beyond the gate
    assert v.status == "inconclusive" and v.reason is Reason.NOISY, v.message
    # the same runs 20% slower clear the threshold: a real regression still fails on noisy runs
    assert compare_metric("tg32", spread(100.0, 0.06, 401), spread(80.0, 0.06, 401), True, T).status == "fail"


def test_a_boot_spread_equal_to_the_gate_does_not_loosen_it():
    """The gate loosens only for a boot spread that EXCEEDS the threshold; a spread of exactly 3% leaves a quiet,
    significant 5% drop a failure (else it would be a within-boot-spread inconclusive that no gate fails on)."""
    v = compare_metric("tg32", spread(100.0, 0.003, 9), spread(95.0, 0.003, 9), True, T,
                       boot_spread=T.throughput_drop)
    assert v.status == "fail" and not v.within_boot_spread, v.message
    assert v in regression.gate_failures([v], T)


@pytest.mark.parametrize("name, higher_is_better", [("tg32", True), ("ttft_ms", False)])
def test_a_boot_spread_widens_the_gate_by_threshold_plus_spread(name, higher_is_better):
    """With a 10% boot spread the edge is 1 + 3% + 10%: a quiet 11% change (beyond the spread alone, inside the
    spread plus the gate) is an A/A between boots, within the spread, not a fail."""
    th = Thresholds(boot_spread=(("*", 0.10),), inconclusive_is_failure=True)  # strict: still not a failure
    factor = 1 / 1.11 if higher_is_better else 1.11
    v = compare_metric(name, spread(100.0, 0.003, 9), spread(100.0 * factor, 0.003, 9), higher_is_better, th,
                       boot_spread=0.10)
    assert v.status == "inconclusive" and v.within_boot_spread and v.reason is Reason.BOOT_SPREAD, v.message
    assert v not in regression.gate_failures([v], th)
    # beyond 1 + 3% + 10% it fails
    far = 1 / 1.20 if higher_is_better else 1.20
    assert compare_metric(name, spread(100.0, 0.003, 9), spread(100.0 * far, 0.003, 9), higher_is_better, th,
                          boot_spread=0.10).status == "fail"


@pytest.mark.parametrize("name, higher_is_better, factor", [("pp2048", True, 0.985), ("ttft_ms", False, 1.015)])
def test_a_pass_needs_the_ci_end_on_the_bad_side_to_rule_out_the_gate(name, higher_is_better, factor):
    """A pass needs the CI's BAD end within the gate: for a rate its lower end above 0.97, for a latency its upper
    end below 1.03. Five rounds at 2% CV, 1.5% worse: the CI reaches past the gate, so inconclusive, never pass."""
    v = compare_metric(name, spread(100.0, 0.02, 5), spread(100.0 * factor, 0.02, 5), higher_is_better, T)
    lo, hi = v.ci
    assert (lo < 1 - T.throughput_drop) if higher_is_better else (hi > 1 + T.latency_rise)
    assert v.status == "inconclusive" and v.reason is Reason.CI_TOO_WIDE, v.message
    assert v in regression.gate_failures([v], Thresholds(inconclusive_is_failure=True))


def test_beyond_the_boot_spread_edge_an_unjudged_change_is_not_excused_as_spread():
    """Only a change WITHIN threshold + spread is excused as boot spread. An 18% drop beyond that edge that noise
    keeps from failing is inconclusive for the noise, and a strict gate fails it: never "within the boot spread"."""
    th = Thresholds(inconclusive_is_failure=True)
    v = compare_metric("tg32", [100.0, 100.2, 99.8, 60.0, 100.1], [82.0, 82.2, 81.8, 101.0, 82.1], True, th,
                       boot_spread=0.10)
    assert v.current / v.baseline < 1 / (1 + th.throughput_drop + 0.10)  # beyond the widened edge
    assert v.status == "inconclusive" and not v.within_boot_spread, v.message
    assert v in regression.gate_failures([v], th)


def test_a_fail_needs_the_rank_test_as_well_as_the_ci():
    """All three conditions must hold to fail: beyond the gate and a CI below 1.0 are not enough when the
    Mann-Whitney p is not below alpha (one slow baseline round interleaves the ranks)."""
    base, cur = [100.0, 100.2, 99.9, 100.1, 94.0, 100.3], [95.0, 95.2, 94.9, 95.1, 100.4, 94.8]
    v = compare_metric("tg32", base, cur, True, T)
    assert v.p_value >= T.alpha and v.ci[1] < 1.0 and -v.delta > T.throughput_drop
    assert v.status == "inconclusive" and v.reason is Reason.NOT_SIGNIFICANT, v.message


def test_p_equal_to_alpha_is_not_significant():
    """Significance is p < alpha, strictly: with alpha set to the very p of a 5% drop whose CI lies below 1.0, the
    drop is not significant, so not a fail."""
    base, cur = spread(100.0, 0.003, 5), [95.0, 95.1, 94.9, 95.05, 99.995]
    p = stats.mann_whitney_u(base, cur)
    th = Thresholds(alpha=p)
    assert 2.0 / math.comb(10, 5) < p  # the counts could reach significance: not a too-few-rounds verdict
    v = compare_metric("tg32", base, cur, True, th)
    assert v.ci[1] < 1.0 and -v.delta > th.throughput_drop  # the other two conditions of a fail hold
    assert v.status == "inconclusive" and v.reason is Reason.NOT_SIGNIFICANT, v.message


def test_a_single_current_round_is_inconclusive_even_against_a_long_baseline():
    """One round on a side has no run-to-run spread of its own: even where 41 baseline rounds would let the rank test
    reach p < 0.05, one current sample is too few to pass (or fail) a gate."""
    base = spread(100.0, 0.003, 41)
    assert 2.0 / math.comb(42, 41) < T.alpha  # the rank test alone would not stop it
    v = compare_metric("tg32", base, [100.0], True, T)
    assert v.status == "inconclusive" and v.reason is Reason.TOO_FEW_SAMPLES, v.message


def test_rounds_whose_best_possible_p_equals_alpha_are_too_few():
    """Three against three: complete separation, the strongest evidence the rank test can see, gives p = 0.1.
    With alpha 0.1 no slowdown could ever fail, so the rounds are too few, not a pass."""
    base, cur = spread(100.0, 0.003, 3), spread(100.0, 0.003, 3)
    th = Thresholds(alpha=stats.mann_whitney_u([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]))
    v = compare_metric("tg32", base, cur, True, th)
    assert v.status == "inconclusive" and v.reason is Reason.TOO_FEW_SAMPLES, v.message


def test_used_memory_growth_is_judged_in_decimal_gb_not_gib():
    """memory_growth_gb is decimal GB and the numbers are GiB: 0.95 GiB (1.02 GB) more memory is a regression."""
    v = regression.compare_used_memory(62.0, 62.95, T)
    assert 0.95 * GIB / 1e9 > T.memory_growth_gb and v.status == "fail", v.detail


def test_a_kv_capacity_drop_fails_and_a_rise_is_an_improvement():
    """KV capacity is higher-is-better: a 10% drop fails, a 10% rise is an improvement, never the other way."""
    assert regression.compare_kv_capacity(1_000_000, 900_000, T).status == "fail"
    assert regression.compare_kv_capacity(1_000_000, 1_100_000, T).status == "improved"


def _run(entry: dict) -> dict:
    return {"config": "cutlass", "platform": "sm_121", "device": "NVIDIA GB10", "valid": True, "metrics": {"tg32": entry}}


def test_samples_of_two_different_clocks_are_not_judged_against_each_other():
    """An engine-clock baseline against a client-clock run differs by tens of percent on an unchanged server: the
    verdict is inconclusive (clock mismatch), never a fail or an improvement."""
    base = {"samples": spread(100.0, 0.003, 9), "unit": "tok/s", "higher_is_better": True, "clock": "engine"}
    cur = {"samples": spread(70.0, 0.003, 9), "unit": "tok/s", "higher_is_better": True, "clock": "client"}
    (v,) = [v for v in regression.compare_run(_run(base), _run(cur), T) if v.name == "tg32"]
    assert v.status == "inconclusive" and v.reason is Reason.CLOCK_MISMATCH, v.message


def test_samples_streamed_with_and_without_logprobs_are_not_judged_against_each_other():
    """Logprobs add engine work every step: a baseline streamed with them against a run streamed without is not
    judged (inconclusive, request mismatch), whatever the change."""
    entry = {"unit": "tok/s", "higher_is_better": True, "clock": "engine"}
    base = {**_run({**entry, "samples": spread(100.0, 0.003, 9)}), "workload": {"stream_request": "logprobs=1"}}
    cur = {**_run({**entry, "samples": spread(120.0, 0.003, 9)}), "workload": {"stream_request": "no logprobs"}}
    (v,) = [v for v in regression.compare_run(base, cur, T) if v.name == "tg32"]
    assert v.status == "inconclusive" and v.reason is Reason.REQUEST_MISMATCH, v.message


def test_an_improvement_needs_its_ci_above_1_as_well_as_significance():
    """"improved" asks for a new baseline, so it needs what a fail needs the other way: a 5% faster median with
    p < alpha whose CI still reaches below 1.0 is not an improvement (a baseline re-recorded from a fluke would fail
    the next A/A)."""
    cur = [105.0 + 0.05 * i for i in range(6)] + [100.0 - 0.01 * i for i in range(3)]
    v = compare_metric("tg32", spread(100.0, 0.003, 9), cur, True, T)
    assert v.p_value < T.alpha and v.delta > T.throughput_drop and v.ci[0] < 1.0
    assert v.status != "improved" and v.fix is None, v.message


def test_a_slowdown_beyond_the_family_fails_a_strict_platform_that_does_not_fail_inconclusives():
    """Out of family turns a huge change into "inconclusive, re-record". On an advisory platform the slowdown still
    warns; on a strict one with inconclusive_is_failure false it was neither a failure nor a warning: a 3.3x slower
    decode passed the gate in silence."""
    strict = Thresholds(out_of_family=1.0, inconclusive_is_failure=False)
    base = [50.0, 51.0, 49.0, 50.5, 50.2, 49.8]

    def gate(samples: list[float]) -> list:
        v = compare_metric("tg32", base, samples, True, strict, "tok/s")
        v = regression._out_of_family(v, strict, "cfg") or v
        return regression.gate_failures([v], strict)

    assert [v.reason for v in gate([15.0, 15.2, 14.9, 15.1, 15.0, 15.3])] == [Reason.OUT_OF_FAMILY]
    assert gate([150.0, 151.0, 149.0, 150.5, 150.2, 149.8]) == []  # 3x faster: re-record advice, not a failure
    assert gate([50.1, 50.9, 49.2, 50.4, 50.0, 49.9]) == []  # A/A
