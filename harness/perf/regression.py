"""Level 5 regression gate: per-run samples of a baseline vs the current run -> one verdict per metric.

A metric FAILS only when all three hold:
  1. the median moved beyond the threshold in the bad direction (throughput -3%, latency +3% by default);
  2. Mann-Whitney U (two-sided) gives p < alpha;
  3. the bootstrap CI (level 1 - alpha) of median(current)/median(baseline) lies entirely beyond 1.0.
When either side's run-to-run CV exceeds max_cv, the 3% threshold is not resolvable from "no change", so
condition 3 tightens: the CI must lie beyond the threshold itself (a 20% drop on noisy runs still fails);
short of that the verdict is "inconclusive" (never "pass": at that noise a real 3% regression could hide).
Beyond the threshold but not significant -> "inconclusive" (rerun with more runs); beyond the threshold in
the good direction and significant -> "improved" (record a new baseline). "pass" needs more than "no
significant change": the CI must also rule out a change as large as the gate (for a throughput, its lower
end must stay above 1 - threshold); when it does not, the metric could not resolve the gate and the verdict
is "inconclusive" with the CI, never "pass". Samples the benchmark marked `unresolved` (too many rounds
ran below the GPU's loaded clock) are inconclusive too, whatever their change, and so is a metric measured
with another clock than the baseline's (engine vs client: `metric_clock`).

Memory (one number per run, from vLLM's own accounting, harness.perf.memory): used memory (weights + peak
activation + non-torch + CUDA graph on GPUs; process-group RSS at boot on CPU) fails when it grows by more
than memory_growth_gb (GB = 1e9 bytes; the numbers are GiB), and the KV-cache capacity (tokens) fails
when it drops by more than kv_capacity_drop. Memory verdicts are strict on every platform: `advisory`
(noisy CPU runners) covers timing verdicts only. Whether "inconclusive" fails the gate is
`Thresholds.inconclusive_is_failure` (strict nightly GPU runs vs. warnings on noisy shared CPU CI).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from harness.core import stats
from harness.core.errors import SuiteError
from harness.core.paths import BASELINE_ROOT
from harness.core.platform import broadest_first, is_valid_selector
from harness.perf import host_cpu, metadata
from harness.perf import metrics as perf
from harness.core.store import identity_problem, regen_command
from harness.core.yamlfile import load_mapping
from harness.perf.baselines import is_finite_number, platform_key

STATUSES = ("pass", "fail", "inconclusive", "improved")
MEMORY_METRIC = "memory_peak_gb"  # informational since schema 2 (on GPUs it is vLLM's reservation)
THRESHOLDS_FILE = BASELINE_ROOT / "thresholds.yaml"
USED_MEMORY = "memory_used_gib"
KV_CAPACITY = "kv_capacity_tokens"
GIB = 1024 ** 3


# A batch-1 decode step over 1.05x its kernels' time is host-bound. Measured with vLLM 0.26: stock's step was 1.01x its
# kernels (H200, gpt-oss-20b shape: 3.07 ms against 3.04; H100: 3.30 against 3.27). The plugin's was 1.18-1.26x on
# the 20b shape. On the 120b shape (H200, one quiet host, 2026-11-29) `gemv-bf16` reached 1.06x on tg32 and 1.10x on
# tg128 in its baseline boot, and 1.00x and 1.21x in the A/A boot after it. `gemv-bf16-mxfp4-all` reached 1.13x and
# 1.33x. So the ratio of one metric can sit at 1.00 in a host-bound boot, and the witness takes any tgN of the
# baseline. A stock baseline that crosses 1.05 by chance loses strictness on its engine decode; it is never failed
# for it, and its kernels are still gated at 3% by tgN_gpu.
HOST_BOUND_RATIO = 1.05


@dataclass(frozen=True)
class Thresholds:
    throughput_drop: float = 0.03  # relative drop of pp*/tg* medians that counts as a regression
    latency_rise: float = 0.03  # relative rise of ttft/tpot/itl/e2e medians that counts as a regression
    memory_growth_gb: float = 1.0  # absolute peak-memory growth that counts as a regression
    alpha: float = 0.05  # significance level of the Mann-Whitney test; the CI level is 1 - alpha
    max_cv: float = 0.05  # above this run-to-run CV on either side the 3% gate cannot be resolved
    bootstrap_n: int = 2000  # bootstrap resamples for the ratio CI
    inconclusive_is_failure: bool = False  # True: an inconclusive metric fails the gate too
    advisory: bool = False  # True: timing failures are reported as warnings (platforms too noisy to gate)
    kv_capacity_drop: float = 0.05  # relative drop of KV-cache capacity (tokens) that counts as a regression
    loaded_clock_floor: float = 0.90  # rounds whose SM clock fell below this x the GPU's max clock are set aside
    sensitivity_fail: float = 0.05  # injected slowdown (fraction of step time) the gate must fail
    sensitivity_pass: float = 0.02  # injected slowdown the gate must pass
    # metric glob -> measured boot-to-boot spread of its median (A/A boots): between two boots such a metric
    # moves by this much with nothing changed, which no number of rounds within one boot can average away
    boot_spread: tuple[tuple[str, float], ...] = ()
    # a timing change against the stored baseline beyond this (either way: ratio above 1 + x or below 1 / (1 + x))
    # is far outside anything the platform's A/A runs showed: the baseline is out of family (another machine
    # class, a stale recording), so the verdict says re-record it, never "improved". None: off.
    out_of_family: float | None = None
    # Batch-1 decode is host-bound when the kernels of a step take less than the step: its tgN_gpu (tokens per
    # second of kernel time) exceeds its engine-clock tgN by more than this factor in the baseline. Then tgN follows
    # vLLM's host side, whose speed moved by host_bound_spread between and within boots with nothing changed, and
    # tgN_gpu gates the kernels. The same factor names a config host-bound in scripts/plugin_e2e.py.
    host_bound_ratio: float = HOST_BOUND_RATIO
    host_bound_spread: float = 0.5

    def __post_init__(self) -> None:
        for name in ("throughput_drop", "latency_rise", "memory_growth_gb", "max_cv", "kv_capacity_drop",
                     "loaded_clock_floor", "sensitivity_fail"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise SuiteError(f"threshold {name} must be a positive finite number (got {value!r})")
        # Relative gates are fractions: `latency_rise: 5` meant as 5% is a 500% gate that passes any slowdown.
        # (sensitivity_fail is a slowdown of the step time, which may exceed 1: CPU's is 1.0, twice as slow.)
        for name in ("throughput_drop", "latency_rise", "max_cv", "kv_capacity_drop", "loaded_clock_floor"):
            value = getattr(self, name)
            if value > 1 or (value == 1 and name != "loaded_clock_floor"):
                raise SuiteError(f"threshold {name} is a fraction (0.03 means 3%), below 1; got {value!r}")
        if isinstance(self.sensitivity_pass, bool) or not isinstance(self.sensitivity_pass, (int, float)) \
                or not 0 <= self.sensitivity_pass < self.sensitivity_fail:
            raise SuiteError(f"threshold sensitivity_pass must be >= 0 and below sensitivity_fail "
                             f"(got {self.sensitivity_pass!r} / {self.sensitivity_fail!r})")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < 1:
            raise SuiteError(f"threshold alpha must be within (0, 1) (got {self.alpha!r})")
        if self.out_of_family is not None and (isinstance(self.out_of_family, bool)
                                               or not isinstance(self.out_of_family, (int, float))
                                               or not 0 < self.out_of_family < math.inf):
            raise SuiteError(f"threshold out_of_family must be a positive fraction (1.0 means twice or half as fast) "
                             f"or null (got {self.out_of_family!r})")
        # above ~100,000 resamples the CI's ends move by less than its rounding, and memory grows with n x samples
        if isinstance(self.bootstrap_n, bool) or not isinstance(self.bootstrap_n, int) \
                or not 100 <= self.bootstrap_n <= 100_000:
            raise SuiteError(f"threshold bootstrap_n must be an integer in [100, 100000] (got {self.bootstrap_n!r})")
        if isinstance(self.host_bound_ratio, bool) or not isinstance(self.host_bound_ratio, (int, float)) \
                or not self.host_bound_ratio >= 1:
            raise SuiteError(f"threshold host_bound_ratio must be a factor >= 1 (1.05: the kernels' rate 5% above the "
                             f"step's; got {self.host_bound_ratio!r})")
        if isinstance(self.host_bound_spread, bool) or not isinstance(self.host_bound_spread, (int, float)) \
                or not 0 <= self.host_bound_spread < 1:
            raise SuiteError(f"threshold host_bound_spread must be a fraction in [0, 1) (got {self.host_bound_spread!r})")
        for name in ("inconclusive_is_failure", "advisory"):
            if not isinstance(getattr(self, name), bool):
                raise SuiteError(f"threshold {name} must be true or false")
        for glob, spread in self.boot_spread:
            if not isinstance(glob, str) or isinstance(spread, bool) or not isinstance(spread, (int, float)) \
                    or not 0 <= spread < 1:
                raise SuiteError(f"threshold boot_spread must map metric globs to fractions in [0, 1) (0.03 means 3%; "
                                 f"got {glob!r}: {spread!r})")

    def spread_of(self, metric: str) -> float:
        """The largest measured boot-to-boot spread among the globs matching `metric` (0 when none)."""
        import fnmatch

        return max((s for g, s in self.boot_spread if fnmatch.fnmatchcase(metric, g)), default=0.0)


def load_thresholds(path: str | os.PathLike, platform: str | None = None) -> Thresholds:
    """Thresholds from YAML: `defaults:` plus optional `platforms: {selector: overrides}`, every selector (`cpu`,
    `sm_121`, `sm_12x`, `>=sm_90`) that matches `platform` applied broadest first, so the most specific one's values
    win whatever the file's order.

    Every section is checked whatever `platform` is (its selector, and its values over the defaults): CI runs
    on CPU, and a typo such as `sm121:` would otherwise silently drop the nightly's strict settings."""
    if not Path(path).is_file():
        raise SuiteError(f"no thresholds file at {path}; restore it from git (baselines/thresholds.yaml)")
    data = load_mapping(Path(path), fix="fix it or restore it from git (baselines/thresholds.yaml)", empty_ok=True)
    if not set(data) <= {"defaults", "platforms"}:  # load_mapping gave a mapping
        raise SuiteError(f"thresholds file {path} must be a mapping with 'defaults' and optional 'platforms'")
    thresholds = _with(Thresholds(), data.get("defaults") or {}, f"{path}: defaults")
    overrides = data.get("platforms") or {}
    if not isinstance(overrides, Mapping):
        raise SuiteError(f"thresholds file {path}: 'platforms' must map a platform selector to overrides")

    defaults = thresholds
    for selector, values in overrides.items():
        where = f"{path}: platforms.{selector}"
        if not is_valid_selector(str(selector)):
            raise SuiteError(f"{path}: platforms: '{selector}' is not a platform selector (cpu, sm_90, sm_121, "
                             "sm_12x, >=sm_90); fix its name")
        _with(defaults, values or {}, where)  # checked whether or not it applies here
    if platform is not None:
        for selector in broadest_first([str(s) for s in overrides], platform):
            thresholds = _with(thresholds, overrides[selector] or {}, f"{path}: platforms.{selector}")
    return thresholds


def _with(base: Thresholds, values: object, where: str) -> Thresholds:
    known = {f.name for f in fields(Thresholds)}
    if not isinstance(values, Mapping):
        raise SuiteError(f"{where} must be a mapping of threshold name -> value")
    unknown = sorted(set(values) - known)
    if unknown:
        raise SuiteError(f"{where}: unknown threshold(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}")
    values = dict(values)
    if "boot_spread" in values:  # YAML mapping -> hashable pairs (Thresholds is frozen)
        spread = values["boot_spread"] or {}
        if not isinstance(spread, Mapping):
            raise SuiteError(f"{where}: boot_spread must map metric globs (pp*, ttft_ms, *@c2) to measured fractions")
        values["boot_spread"] = tuple((str(k), v) for k, v in spread.items())
    try:
        return replace(base, **values)
    except SuiteError as e:
        raise SuiteError(f"{where}: {e}") from None


class Reason(str, Enum):
    """Why a verdict is what it is. Code branches on this, never on a verdict's text."""

    WITHIN_GATE = "within_gate"  # pass: the CI rules out a change as large as the gate
    REGRESSION = "regression"  # fail: beyond the gate, significant, the CI beyond 1.0 (or the noise margin)
    IMPROVEMENT = "improvement"  # improved: the same, in the good direction
    UNRESOLVED_CLOCKS = "unresolved_clocks"  # samples ran below the GPU's loaded clock: not judged
    TOO_FEW_SAMPLES = "too_few_samples"  # one sample on a side: a CI of zero width
    BOOT_SPREAD = "boot_spread"  # the metric's measured A/A spread between boots exceeds the gate
    NOISY = "noisy"  # run-to-run CV above max_cv on a side
    NOT_SIGNIFICANT = "not_significant"  # beyond the gate but not significant
    CI_TOO_WIDE = "ci_too_wide"  # within the gate, but the CI reaches beyond it
    CLOCK_MISMATCH = "clock_mismatch"  # baseline and run measured with different clocks
    REQUEST_MISMATCH = "request_mismatch"  # baseline and run streamed different requests (logprobs or not)
    NOT_MEASURED = "not_measured"  # in the baseline, not measured by this run
    NOT_IN_BASELINE = "not_in_baseline"  # measured now, not by the baseline (memory: schema 1)
    SOURCE_MISMATCH = "source_mismatch"  # used memory read from different sources
    OUT_OF_FAMILY = "out_of_family"  # a change far beyond the platform's measured A/A spread: a stale baseline
    HOST_BOUND = "host_bound"  # engine-clock decode of a host-bound config: it follows the host; tgN_gpu gates it
    HOST_SIDE = "host_side"  # fail: engine-clock decode slower while its kernel time held and its step grew against
    # those kernels beyond the baseline's ratio: the host side slowed (per-step host work, or another load on the host)


# Reasons whose `detail` does not already show the bootstrap CI (the report adds it beside a failure).
DETAIL_WITHOUT_CI = frozenset({Reason.TOO_FEW_SAMPLES, Reason.CLOCK_MISMATCH, Reason.REQUEST_MISMATCH,
                               Reason.NOT_MEASURED, Reason.NOT_IN_BASELINE, Reason.SOURCE_MISMATCH})
_WORD = {"pass": "pass", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "improved": "IMPROVED"}


@dataclass(frozen=True)
class Verdict:
    """One metric's verdict as data: `status` and `reason` decide; `detail` (what was measured, in words) and
    `fix` (what to do about a baseline: re-record, investigate) explain. `message` renders the three."""

    name: str
    status: str  # one of STATUSES
    delta: float  # relative change of medians: current / baseline - 1 (NaN if the baseline is 0)
    delta_abs: float  # current - baseline median, in `unit`
    baseline: float  # median of the baseline samples
    current: float  # median of the current samples
    unit: str
    higher_is_better: bool
    p_value: float | None  # Mann-Whitney U; None where a single number was compared (memory)
    cv_baseline: float | None
    cv_current: float | None
    ci: tuple[float, float] | None  # bootstrap CI of current/baseline median ratio
    reason: Reason
    detail: str  # the measurement in words, e.g. "tg32 -4.1% (50 -> 48 tok/s median; gate 3.0%; ...)"
    kind: str = "timing"  # "timing" (pp/tg/latency), "memory" (used GiB, peak), "capacity" (KV tokens)
    advisory: bool = False  # a timing verdict on a platform whose timing gate is advisory: never fails the run
    advisory_reason: str | None = None
    # inconclusive only because the metric's measured boot-to-boot spread exceeds the gate (boot_spread):
    # reported, but not a strict-gate failure, or a metric known to move between boots turns every night red
    within_boot_spread: bool = False
    fix: str | None = None  # the baseline remedy ("re-record with: ..."); None where no baseline is involved

    @property
    def message(self) -> str:
        """One line for people: STATUS detail; fix (ADVISORY first where the timing gate is advisory)."""
        text = f"{_WORD[self.status]} {self.detail}" + (f"; {self.fix}" if self.fix else "")
        return f"ADVISORY {text}" if self.advisory and self.status != "pass" else text

    def to_json(self) -> dict:
        """Fields plus the rendered message (for people reading the run's verdicts/ files)."""
        return {**asdict(self), "reason": self.reason.value, "message": self.message}

    @classmethod
    def from_json(cls, data: Mapping) -> "Verdict":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["reason"] = Reason(values["reason"])
        values["ci"] = tuple(values["ci"]) if values.get("ci") else None
        return cls(**values)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    @property
    def worse(self) -> bool:
        """Whether the median moved the bad way (slower, more memory), however it was judged."""
        return self.delta < 0 if self.higher_is_better else self.delta > 0

    @property
    def gating_failure(self) -> bool:
        return self.status == "fail" and not self.advisory


def _beyond(change: float, limit: float) -> bool:
    """`change` lies beyond the gate `limit`. A change of exactly the gate is within it: the gates fail on more than
    3% (or 1 GB, or the KV drop), and a ratio's rounding (0.97 / 1.0 - 1 is -0.030000000000000027, 950,000 of
    1,000,000 KV tokens a 5.0000000000000044% drop) must not push an exact 3% over it."""
    return change > limit and not math.isclose(change, limit, rel_tol=1e-9)


def _pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x * 100:.1f}%"


def compare_metric(
    name: str,
    baseline_samples: Sequence[float],
    current_samples: Sequence[float],
    higher_is_better: bool,
    thresholds: Thresholds,
    unit: str = "",
    config: str = "NAME",
    unresolved: str | None = None,
    boot_spread: float = 0.0,
    host_bound: str | None = None,
) -> Verdict:
    """One timing metric. `unresolved` (from the results' entries) makes the verdict "inconclusive" whatever the
    change: the samples ran in conditions that make them unfit to judge (clocks below load).

    `boot_spread` (baseline and current from different boots): the measured A/A spread of this metric
    between boots. When it exceeds the threshold, one boot cannot resolve the threshold: the CI of the ratio must
    lie beyond 1 + threshold + spread, or below its inverse, to fail (or improve), and short of that the verdict is
    "inconclusive", never "pass". `host_bound` (why the run's decode is host-bound) says the spread is the host's, not
    the metric's A/A."""
    base_med, cur_med = stats.median(baseline_samples), stats.median(current_samples)
    if base_med <= 0:
        raise SuiteError(f"baseline median of {name} is {base_med:g}; a rate or latency must be > 0, re-record "
                         f"with: {regen_command('level5', config)}")
    ratio_med = cur_med / base_med
    delta = ratio_med - 1.0
    threshold = thresholds.throughput_drop if higher_is_better else thresholds.latency_rise
    worse = -delta if higher_is_better else delta  # > 0 means the metric got worse
    p = stats.mann_whitney_u(baseline_samples, current_samples)
    lo, hi = stats.bootstrap_ratio_ci(baseline_samples, current_samples, stat=np.median,
                                      n=thresholds.bootstrap_n, seed=0, level=1.0 - thresholds.alpha)
    cv_b, cv_c = stats.cv(baseline_samples), stats.cv(current_samples)
    noisy = [side for side, c in (("baseline", cv_b), ("current", cv_c)) if not math.isnan(c) and c > thresholds.max_cv]
    # The CI must lie beyond "no change" (ratio 1.0). On runs noisier than max_cv it must lie beyond the
    # threshold itself: only then is the threshold resolved despite the noise (a 20% drop still fails).
    margin = threshold if noisy else 0.0
    worse_edge, better_edge = (1.0 - margin, 1.0 + margin) if higher_is_better else (1.0 + margin, 1.0 - margin)
    boot_bound = boot_spread > threshold
    if boot_bound:
        # A spread is max/min - 1 of boot medians: boots land anywhere in [1/(1+s), 1+s] of each other, whichever
        # way the metric points (the feature verdicts widen their CIs the same way). Subtracting it from 1.0 would
        # let a throughput fall to 1-(t+s) (0.47 at 3% + 50%) while its latency twin fails at 1+(t+s) (1.53).
        edge = 1.0 + threshold + boot_spread
        worse_edge, better_edge = (1.0 / edge, edge) if higher_is_better else (edge, 1.0 / edge)
    ci_worse = hi < worse_edge if higher_is_better else lo > worse_edge
    ci_better = lo > better_edge if higher_is_better else hi < better_edge
    # Within the spread: a quiet run's CI must rule out the edge (a short run whose median sits just inside it cannot
    # tell the spread from a slowdown beyond it, and a strict nightly must not shrug at that). A noisy run (CV above
    # max_cv) is placed by its median: the spreads were measured on the medians of such runs (host-bound decode at CV
    # 10-20%), whose CIs reach past the edge with nothing changed. Its latency twin (TPOT) and tgN_gpu still gate it.
    judged_lo, judged_hi = (ratio_med, ratio_med) if noisy else (lo, hi)
    within_edge = judged_lo >= worse_edge if higher_is_better else judged_hi <= worse_edge
    # resolved: the CI rules out a change as bad as the gate itself (else a pass would be a guess)
    resolved = lo >= 1.0 - threshold if higher_is_better else hi <= 1.0 + threshold
    significant = p < thresholds.alpha

    change = (f"{name} {delta * 100:+.1f}% ({stats.fmt(base_med)} -> {stats.fmt(cur_med)} {unit} median"
              f"; gate {threshold * 100:.1f}%; p={p:.3g}; {round((1 - thresholds.alpha) * 100)}% CI of ratio "
              f"[{lo:.3f}, {hi:.3f}]; CV {_pct(cv_b)} / {_pct(cv_c)})").replace("  ", " ")
    within_spread = False  # inconclusive only because of the recorded boot spread (not noise, not clocks)
    few = min(len(baseline_samples), len(current_samples))
    smallest_p = 2.0 / math.comb(len(baseline_samples) + len(current_samples), len(baseline_samples))
    fix = None
    if unresolved:
        status, reason = "inconclusive", Reason.UNRESOLVED_CLOCKS
        detail = (f"{name}: {unresolved}; not judged (median change {delta * 100:+.1f}%, p={p:.3g}, "
                  f"CI [{lo:.3f}, {hi:.3f}]); rerun on an idle GPU at its loaded clock")
    elif few < 2 or smallest_p >= thresholds.alpha:
        # One sample gives a CI of zero width; and the rank test's smallest p is 2 / C(n_b + n_c, n_b) (0.1 at 3
        # against 3, 0.057 at 3 against 4): below alpha no slowdown, however large, could ever fail (a workloads
        # file with runs: 3). A pass would be a guess and a fail impossible.
        status, reason = "inconclusive", Reason.TOO_FEW_SAMPLES
        detail = (f"{name}: {len(baseline_samples)} baseline / {len(current_samples)} current sample(s) cannot "
                  f"resolve a {threshold * 100:.1f}% change (median change {delta * 100:+.1f}%; the rank test's "
                  f"smallest p with these counts is {min(1.0, smallest_p):.3g}, the gate needs p < {thresholds.alpha:g}); "
                  f"run at least 4 rounds a side (workloads `runs`)")
    elif _beyond(worse, threshold) and significant and ci_worse:
        status, reason, detail = "fail", Reason.REGRESSION, change
        fix = f"investigate, or if intended re-record with: {regen_command('level5', config)}"
    elif _beyond(-worse, threshold) and significant and ci_better:
        status, reason, detail = "improved", Reason.IMPROVEMENT, change
        fix = f"record a new baseline with: {regen_command('level5', config)}"
    elif boot_bound and within_edge:
        status, within_spread = "inconclusive", True
        if host_bound:
            reason = Reason.HOST_BOUND
            why = (f"host-bound ({host_bound}), so it follows the speed of vLLM's host side, which moves by up to "
                   f"{boot_spread * 100:.0f}% with nothing changed (baselines/thresholds.yaml host_bound_spread); the "
                   f"decode kernels are gated by tgN_gpu")
        else:
            reason = Reason.BOOT_SPREAD
            why = (f"between boots this metric moves by up to {boot_spread * 100:.0f}% with nothing changed (measured "
                   f"A/A spread, baselines/thresholds.yaml boot_spread), more than the {threshold * 100:.1f}% gate, so "
                   f"one boot cannot resolve it")
        detail = (f"{name}: {why} (median change {delta * 100:+.1f}%, p={p:.3g}, CI [{lo:.3f}, {hi:.3f}]); a "
                  f"{'drop' if higher_is_better else 'rise'} beyond {abs(worse_edge - 1) * 100:.1f}% (ratio "
                  f"{'below' if higher_is_better else 'above'} {worse_edge:.3f}) would fail")
    elif noisy:
        status, reason = "inconclusive", Reason.NOISY
        sides = "both sides" if len(noisy) == 2 else f"the {noisy[0]} side"
        detail = (f"{name}: run-to-run CV {_pct(cv_b)} (baseline) / {_pct(cv_c)} (current) exceeds "
                  f"max_cv {_pct(thresholds.max_cv)} on {sides}, so a {threshold * 100:.1f}% change is not "
                  f"resolvable (median change {delta * 100:+.1f}%, p={p:.3g}, CI [{lo:.3f}, {hi:.3f}]); reduce "
                  f"noise (idle machine, locked clocks, more warmup/runs)")
    elif _beyond(worse, threshold):
        status, reason = "inconclusive", Reason.NOT_SIGNIFICANT
        need = "a CI excluding 1.0" if worse_edge == 1.0 else f"a CI beyond {worse_edge:.3f}, this metric's spread"
        detail = (f"{change}: beyond the gate but not significant (need p < {thresholds.alpha:g} and {need}); rerun "
                  f"with more runs")
    elif not resolved:
        status, reason = "inconclusive", Reason.CI_TOO_WIDE
        bound = f"{(1 - threshold):.3f}" if higher_is_better else f"{(1 + threshold):.3f}"
        detail = (f"{change}: the CI reaches beyond {bound}, so a {threshold * 100:.1f}% regression "
                  f"cannot be ruled out with n={len(baseline_samples)}/{len(current_samples)} runs; more runs or "
                  f"less noise")
    else:
        status, reason, detail = "pass", Reason.WITHIN_GATE, change
    return Verdict(name, status, delta, cur_med - base_med, base_med, cur_med, unit, higher_is_better,
                   p, cv_b, cv_c, (lo, hi), reason, detail, within_boot_spread=within_spread, fix=fix)


def _peak(value: float | Sequence[float], side: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise SuiteError(f"{side} peak memory {value!r} GB is not a non-negative number")
        return float(value)
    return stats.median(value)


def _single_number(worse: bool, better: bool, config: str) -> tuple[str, Reason, str | None]:
    """Status, reason and fix of a gate on one number per side (memory, KV capacity: no samples, no CI)."""
    if worse:
        return "fail", Reason.REGRESSION, f"investigate, or if intended re-record with: {regen_command('level5', config)}"
    if better:
        return "improved", Reason.IMPROVEMENT, f"record a new baseline with: {regen_command('level5', config)}"
    return "pass", Reason.WITHIN_GATE, None


def compare_used_memory(baseline_gib: float, current_gib: float, thresholds: Thresholds, config: str = "NAME",
                        source: str | None = None) -> Verdict:
    """Used-memory gate: growth beyond memory_growth_gb (decimal GB) fails, on every platform."""
    base, cur = _peak(baseline_gib, "baseline"), _peak(current_gib, "current")
    growth = cur - base
    growth_gb, limit = growth * GIB / 1e9, thresholds.memory_growth_gb
    delta = cur / base - 1.0 if base > 0 else math.nan
    what = (f"used memory {base:.2f} -> {cur:.2f} GiB ({growth:+.2f} GiB = {growth_gb:+.2f} GB; gate +{limit:g} GB"
            + (f"; {source}" if source else "") + ")")
    status, reason, fix = _single_number(_beyond(growth_gb, limit), _beyond(-growth_gb, limit), config)
    return Verdict(USED_MEMORY, status, delta, growth, base, cur, "GiB", False, None, None, None, None, reason, what,
                   fix=fix,
                   kind="memory")


def compare_kv_capacity(baseline_tokens: int, current_tokens: int, thresholds: Thresholds,
                        config: str = "NAME") -> Verdict:
    """KV-cache capacity gate: a drop beyond kv_capacity_drop (relative) fails, on every platform."""
    base, cur = float(baseline_tokens), float(current_tokens)
    if base <= 0:
        raise SuiteError(f"baseline KV capacity is {base:g} tokens; re-record with: {regen_command('level5', config)}")
    delta, limit = cur / base - 1.0, thresholds.kv_capacity_drop
    what = (f"KV cache capacity {base:,.0f} -> {cur:,.0f} tokens ({delta * 100:+.2f}%; gate -{limit * 100:g}%)")
    status, reason, fix = _single_number(_beyond(-delta, limit), _beyond(delta, limit), config)
    return Verdict(KV_CAPACITY, status, delta, cur - base, base, cur, "tokens", True, None, None, None, None, reason, what,
                   fix=fix,
                   kind="capacity")


def compare_memory_section(baseline: Mapping, current: Mapping, thresholds: Thresholds,
                           config: str = "NAME") -> list[Verdict]:
    """Used memory and KV capacity, when the current side measured them. A baseline from before they were
    recorded (schema 1) gets an inconclusive verdict naming the re-record command; results lacking a number the
    baseline gates are an error (SuiteError)."""
    out = []

    def used_source(side: Mapping) -> str | None:
        return (side.get("memory") or {}).get("used_source") if isinstance(side.get("memory"), Mapping) else None

    source, base_source = used_source(current), used_source(baseline)
    for key, unit, fn in ((USED_MEMORY, "GiB", lambda b, c: compare_used_memory(b, c, thresholds, config, source)),
                          (KV_CAPACITY, "tokens", lambda b, c: compare_kv_capacity(b, c, thresholds, config))):
        b, c = baseline.get(key), current.get(key)
        if c is None and b is not None:
            # A booted server always has a log to read it from (an external one never reaches the gate: its results
            # are invalid), so a gated number the results lack is a parse that failed, e.g. a new vLLM log format;
            # skipping it would pass the memory gate, strict everywhere, on timing alone.
            why = (current.get("memory") or {}).get("why_not") if isinstance(current.get("memory"), Mapping) else None
            raise SuiteError(f"results for {config} lack {key} (the baseline has {b}): "
                             f"{why or 'vLLM startup log lines not found (harness/perf/memory.py parse_engine_memory)'}; "
                             f"fix the measurement, or if it cannot be measured here re-record with: {regen_command('level5', config)}")
        if c is None:
            continue  # measured on neither side: nothing to judge
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < math.inf:
            # NaN fails every comparison, so a broken number would pass a strict gate
            raise SuiteError(f"results for {config}: {key} is {c!r}, not a positive finite number (a broken "
                             f"measurement or a hand-edited file); rerun level 4 to write new results")
        if b is None:
            why = ("the baseline predates used-memory / KV-capacity accounting (schema 1)"
                   if key not in baseline else "the baseline did not measure it")
            out.append(Verdict(key, "inconclusive", math.nan, math.nan, math.nan, float(c), unit, key == KV_CAPACITY,
                               None, None, None, None, Reason.NOT_IN_BASELINE, f"{key}: {why}; now {c}",
                               kind="memory" if key == USED_MEMORY else "capacity",
                               fix=f"re-record with: {regen_command('level5', config)}"))
            continue
        if key == USED_MEMORY and base_source and source and base_source != source:
            # e.g. vLLM's full breakdown on one side and a process reading on the other: not the same quantity
            out.append(Verdict(key, "inconclusive", math.nan, float(c) - float(b), float(b), float(c), unit, False,
                               None, None, None, None, Reason.SOURCE_MISMATCH, f"{key}: measured from '{base_source}' in "
                               f"the baseline but '{source}' now ({b} -> {c} GiB); not comparable",
                               kind="memory", fix=f"re-record with: {regen_command('level5', config)}"))
            continue
        out.append(fn(b, c))
    return out


def advisory_reason(platform: str | None) -> str:
    return (f"timing verdicts on {platform or 'this platform'} are advisory (baselines/thresholds.yaml says why: "
            "run-to-run noise of shared CPU runners exceeds the gate); memory verdicts stay strict")


def metric_clock(side: Mapping, name: str, entry: Mapping) -> str | None:
    """The clock a metric was measured with: its entry's `clock`; in files written before metrics carried one,
    the run's `workload.pp_tg_clock` for pp / tg (e.g. "engine", or "client + engine" when its workloads
    mixed them), "client" for latencies and "kernel" for ppN_gpu. None when the file cannot say."""
    if entry.get("clock"):
        return str(entry["clock"])
    try:
        base, _ = perf.parse_metric_name(name)
    except SuiteError:
        return None
    if base.endswith("_gpu"):
        return "kernel"
    if not base.startswith(("pp", "tg")):
        return "client"
    workload = side.get("workload")
    clock = workload.get("pp_tg_clock") if isinstance(workload, Mapping) else None
    return str(clock) if clock else None


def _not_comparable(name: str, b: Mapping, c: Mapping, reason: Reason, how: str, why: str, fix: str) -> Verdict:
    """Inconclusive: the baseline's and this run's samples were not measured alike (`how`): neither pass nor fail."""
    base_med, cur_med = stats.median(b["samples"]), stats.median(c["samples"])
    change = f"{stats.fmt(base_med)} -> {stats.fmt(cur_med)} {b.get('unit') or ''}"
    detail = f"{name}: {how} ({change}); {why}, so not judged"
    return Verdict(name, "inconclusive", math.nan, cur_med - base_med, base_med, cur_med, str(b.get("unit") or ""),
                   bool(b["higher_is_better"]), None, None, None, None, reason, detail, fix=fix)


def _clock_mismatch(name: str, b: Mapping, c: Mapping, b_clock: str, c_clock: str, config: str) -> Verdict:
    return _not_comparable(name, b, c, Reason.CLOCK_MISMATCH,
                           f"the baseline measured it with the {b_clock} clock, this run with the {c_clock} clock",
                           "they differ by tens of percent on an unchanged server",
                           f"rerun (vLLM's /metrics must answer throughout) or re-record with: "
                           f"{regen_command('level5', config)}")


def stream_request(side: Mapping) -> str:
    """How a results or baseline file's measured streams asked for token counts (`workload.stream_request`);
    files written before the field existed streamed with logprobs=1."""
    workload = side.get("workload")
    request = workload.get("stream_request") if isinstance(workload, Mapping) else None
    return str(request) if request else perf.STREAM_REQUEST_BEFORE


def _request_mismatch(name: str, b: Mapping, c: Mapping, b_req: str, c_req: str, config: str) -> Verdict:
    return _not_comparable(name, b, c, Reason.REQUEST_MISMATCH,
                           f"the baseline streamed its requests with {b_req}, this run with {c_req}",
                           "logprobs add engine work every step",
                           f"re-record the baseline with: {regen_command('level5', config)}")


def _not_measured(name: str, b: Mapping, current: Mapping, config: str) -> Verdict:
    base_med = stats.median(b["samples"])
    workload = current.get("workload")
    dropped = workload.get("dropped") if isinstance(workload, Mapping) else None
    detail = (f"{name}: in the baseline ({stats.fmt(base_med)} {b.get('unit') or ''} median) but not "
              f"measured by this run" + (f" (workloads dropped here: {'; '.join(map(str, dropped[:3]))}"
                                             + (f" and {len(dropped) - 3} more" if len(dropped) > 3 else "") + ")"
                                             if dropped else "")
              + ", so its gate did not run")
    return Verdict(name, "inconclusive", math.nan, math.nan, base_med, math.nan, str(b.get("unit") or ""),
                   bool(b.get("higher_is_better")), None, None, None, None, Reason.NOT_MEASURED, detail,
                   fix=f"run the baseline's workloads, or re-record with: {regen_command('level5', config)}")


def _out_of_family(v: Verdict, thresholds: Thresholds, config: str) -> Verdict | None:
    """`v` as "baseline out of family" when its change lies beyond what this platform's A/A runs ever showed."""
    bound = thresholds.out_of_family
    if bound is None or v.reason is Reason.UNRESOLVED_CLOCKS or not math.isfinite(v.delta):
        return None
    ratio = 1.0 + v.delta
    if 1.0 / (1.0 + bound) <= ratio <= 1.0 + bound:
        return None
    detail = (f"{v.name} {v.delta * 100:+.1f}% ({stats.fmt(v.baseline)} -> {stats.fmt(v.current)} {v.unit} median): "
              f"baseline out of family, beyond the x{1 + bound:g} this platform's A/A runs never reach "
              f"(baselines/thresholds.yaml out_of_family), so neither a regression nor an improvement is judged")
    fix = (f"a slowdown this large is a regression unless the baseline came from another machine state: investigate "
           f"first, and only then re-record it on this machine class: {regen_command('level5', config)}" if v.worse else
           f"re-record it on this machine class: {regen_command('level5', config)}")
    return replace(v, status="inconclusive", reason=Reason.OUT_OF_FAMILY, detail=detail, within_boot_spread=False,
                   fix=fix)


def _host_side(v: Verdict, baseline: Mapping, current: Mapping, thresholds: Thresholds) -> Verdict | None:
    """`v`, a failed batch-1 engine-clock decode metric (tgN, TPOT, ITL at some depth), with what its kernel-time
    twins say: when every `tgN_gpu` of its depth held within the throughput gate and this run's step grew against
    those kernels by more than host_bound_ratio over the baseline's step-to-kernels ratio (each tgN against its own
    twin: the two clocks differ by a fixed amount per workload, tg32_gpu ran at 0.90x tg32 in an H200 baseline), the
    slowdown is the host side's. It still fails (a change that adds per-step host work is a regression the users
    feel), but it says so and what tells the two causes apart. Measured on an H200 (gemv-bf16, 120b shape,
    2026-11-30): an A/A boot beside a vLLM server on the host's other GPU ran tg128 at -11.0% with tg128_gpu at
    +1.6%. A batch of two (tgN@c2) is left as it is: no twin measured its kernels."""
    if v.status != "fail" or v.reason is not Reason.REGRESSION:
        return None
    decode = HOST_BOUND_DECODE.fullmatch(v.name)
    if not decode or decode.group(3):
        return None
    depth = decode.group(2) or ""
    held, waited, growth = [], [], 1.0
    for twin in sorted(current.get("metrics") or {}):
        m = re.fullmatch(rf"(tg\d+)_gpu{re.escape(depth)}", twin)
        if not m:
            continue
        b_k, c_k = _clocked_median(baseline, twin, "kernel"), _clocked_median(current, twin, "kernel")
        if b_k is None or c_k is None:
            continue
        change = c_k / b_k - 1
        if change < -thresholds.throughput_drop:
            return None  # the kernels slowed too: a regression on the GPU, whatever the host did
        held.append(f"{twin} {change * 100:+.1f}%")
        engine = m.group(1) + depth
        b_e, c_e = _clocked_median(baseline, engine, "engine"), _clocked_median(current, engine, "engine")
        if b_e is not None and c_e is not None and (c_k / c_e) / (b_k / b_e) > thresholds.host_bound_ratio:
            waited.append(f"{twin} {c_k / c_e:.2f}x its {engine}, baseline {b_k / b_e:.2f}x")
            growth = max(growth, b_e / c_e)  # the engine's step per token, this run over the baseline's
    if not waited:
        return None
    cpu = host_cpu.compare(baseline, current, growth)
    why = (f". Host CPU: {cpu}" if cpu else
           " (this run or its baseline did not time the host's CPU: rerun on an idle host to tell them apart, or run "
           "scripts/host_spells.py --config <config> --model <model>, which splits the engine core's CPU time per "
           "token into more work and a slower CPU)")
    detail = (f"{v.detail}; the kernels did not slow down ({', '.join(held)}), and this run's decode step grew against "
              f"them ({'; '.join(waited)}): the host side slowed, from per-step host work the change added or from "
              f"a slower or busier host{why}")
    return replace(v, reason=Reason.HOST_SIDE, detail=detail)


# Inconclusive for noise that a slower or busier host makes: run-to-run CV, a CI too wide, a change short of
# significance, host-bound decode. Kernel time does not wait for the host, so it never gets the host's sentence.
_HOST_NOISE = frozenset({Reason.NOISY, Reason.CI_TOO_WIDE, Reason.NOT_SIGNIFICANT, Reason.HOST_BOUND})


def _unsteady_host(v: Verdict, clock: str | None, baseline: Mapping, current: Mapping) -> Verdict | None:
    """`v`, inconclusive from noise on the engine or client clock, with what the host CPU's loop says about it."""
    if v.status != "inconclusive" or v.reason not in _HOST_NOISE or clock == "kernel":
        return None
    # a metric that held steady on both sides took none of the host's changes: its verdict is not the host's noise
    if all(cv is not None and cv <= host_cpu.STEADY for cv in (v.cv_baseline, v.cv_current)):
        return None
    why = host_cpu.unsteady(baseline, current)
    return replace(v, detail=f"{v.detail}. Host CPU: {why}") if why else None


def compare_run(baseline: Mapping, current: Mapping, thresholds: Thresholds) -> list[Verdict]:
    """Verdicts for every metric of the baseline (baseline order), then used memory and KV capacity.

    `baseline` is a loaded baseline (harness.perf.baselines), `current` a results dict (harness.report.run_report).
    A baseline metric the results lack is inconclusive (its gate did not run); metrics only the results have
    are not judged (see `unshared_metrics`).
    """
    config = str(current.get("config") or baseline.get("config") or "NAME")
    if current.get("valid") is False:
        raise SuiteError(f"results for {config} are invalid (kernel-path check failed); fix level 1.5 before "
                         "gating performance")
    if all(side.get(k) for side in (baseline, current) for k in ("platform", "device")):
        b_key = platform_key(baseline["platform"], baseline["device"])
        c_key = platform_key(current["platform"], current["device"])
        if b_key != c_key:
            raise SuiteError(f"baseline is from {b_key} but results are from {c_key}; compare against "
                             f"baselines/{c_key}/ (record it with: {regen_command('level5', config)})")
    # another embedded model, or another flavour's kernels under the same config name, is another workload, not a
    # regression; a baseline that did not record the weights cannot say it is the same model (goldens alike)
    problem = identity_problem(baseline, current, "baseline", baseline.get("model"))
    if problem:
        raise SuiteError(f"{problem}; re-record it with: {regen_command('level5', config)}")
    # every shape model loads the same valid random weights (one fingerprint): the model's name tells them apart
    for key in ("model", "config"):
        b_id, c_id = baseline.get(key), current.get(key)
        if b_id and c_id and b_id != c_id:
            raise SuiteError(f"baseline is of {key} {b_id} but results are of {c_id}: another workload, not a change; "
                             f"judge against baselines/<platform>/<model>/<config>.yaml of the results' model and "
                             f"config (record it with: {regen_command('level5', str(c_id) if key == 'config' else config)})")
    verdicts = []
    b_metrics, c_metrics = baseline.get("metrics") or {}, current.get("metrics") or {}
    if not isinstance(c_metrics, Mapping) or not all(isinstance(e, Mapping) for e in c_metrics.values()):
        raise SuiteError(f"results for {config}: metrics must map names to entries with samples (a broken or "
                         "hand-edited results file); rerun level 4 to write new results")
    decode_host_bound = {} if thresholds.advisory else host_bound_decode(baseline, current, thresholds)
    b_request, c_request = stream_request(baseline), stream_request(current)
    for name, b in b_metrics.items():
        if name not in c_metrics:  # never pass a gate that was not run: inconclusive (a failure on a strict gate)
            verdicts.append(_not_measured(name, b, current, config))
            continue
        c = c_metrics[name]
        if b.get("higher_is_better") != c.get("higher_is_better") or b.get("unit") != c.get("unit"):
            raise SuiteError(f"{name}: baseline ({b.get('unit')}, higher_is_better={b.get('higher_is_better')}) and "
                             f"results ({c.get('unit')}, higher_is_better={c.get('higher_is_better')}) measure "
                             f"different things; re-record with: {regen_command('level5', config)}")
        samples = c.get("samples")
        if not isinstance(samples, list) or not samples or not all(is_finite_number(v) and v > 0 for v in samples):
            raise SuiteError(f"results for {config}: {name} samples {samples!r} are not positive finite numbers (a "
                             "broken measurement); rerun level 4 to write new results")
        b_clock, c_clock = metric_clock(baseline, name, b), metric_clock(current, name, c)
        if b_clock and c_clock and b_clock != c_clock:  # never pass nor fail samples of two different clocks
            verdicts.append(_clock_mismatch(name, b, c, b_clock, c_clock, config))
            continue
        if b_request != c_request and "kernel" not in (b_clock, c_clock):  # kernel time: requests without logprobs
            verdicts.append(_request_mismatch(name, b, c, b_request, c_request, config))
            continue
        unresolved = "; ".join(f"{side}: {e['unresolved']}" for side, e in (("baseline", b), ("current", c))
                               if e.get("unresolved")) or None
        spread = 0.0 if thresholds.advisory else thresholds.spread_of(name)
        decode = HOST_BOUND_DECODE.fullmatch(name)
        host_bound = decode_host_bound.get(decode.group(2) or "") if decode else None
        if host_bound:
            spread = max(spread, thresholds.host_bound_spread)
        v = compare_metric(name, b["samples"], c["samples"], bool(b["higher_is_better"]), thresholds,
                           unit=str(b.get("unit") or ""), config=config, unresolved=unresolved,
                           boot_spread=spread, host_bound=host_bound)
        v = _out_of_family(v, thresholds, config) or v
        v = _host_side(v, baseline, current, thresholds) or v
        verdicts.append(_unsteady_host(v, b_clock or c_clock, baseline, current) or v)
    if thresholds.advisory:
        # A timing verdict here is a warning, never a failure, so it needs no boot spread to keep from failing an
        # unchanged run; a change beyond the threshold stays visible as a warning instead of "inconclusive".
        why = advisory_reason(current.get("platform"))
        verdicts = [replace(v, advisory=True, advisory_reason=why) for v in verdicts]
    verdicts += compare_memory_section(baseline, current, thresholds, config)
    return _with_stack_changes(verdicts, baseline, current)


def _with_stack_changes(verdicts: list[Verdict], baseline: Mapping, current: Mapping) -> list[Verdict]:
    """A verdict that moved (failed, improved, or out of the platform's family) says what of the stack under the
    suite changed since the baseline: a slowdown after a vLLM, driver or flag change is not the kernel change's."""
    changes = metadata.stack_changes(baseline.get("metadata"), current.get("metadata"))
    if not changes:
        return verdicts
    said = f". Changed since the baseline besides the suite: {'; '.join(changes)}"
    return [replace(v, detail=v.detail + said)
            if v.status in ("fail", "improved") or v.reason is Reason.OUT_OF_FAMILY else v for v in verdicts]


# Decode metrics that follow vLLM's host side when a step's kernels finish before the host has the next step ready:
# tgN at any depth, TPOT and ITL (the latency workload), and tgN@c2. A batch of two is host-bound with its batch-1
# witness. Measured on an H200 (120b shape, gemv-bf16, 2026-11-29): the A/A boot moved tg32@c2 by -15.0% (CI [0.825,
# 0.878]) while tg32_gpu moved +0.14%. Larger batches are not included, because their kernels' time per step grows
# with the experts the batch reads. The workloads measure no c above 2.
HOST_BOUND_DECODE = re.compile(r"(tg\d+|tpot_ms|itl_ms)(@d\d+)?(@c2)?")


def host_bound_decode(baseline: Mapping, current: Mapping, thresholds: Thresholds) -> dict[str, str]:
    """Per depth suffix ("" for depth 0, "@d8192", ...): why the baseline's decode at that depth is host-bound.

    A depth is host-bound when some `tgN_gpu` of it (tokens per second of the kernels' time; clock "kernel") exceeds
    the baseline's engine-clock `tgN` of the same depth (clock "engine") by more than host_bound_ratio: the GPU
    waited for vLLM's host side every step. Each depth needs its own witness: kernel time per token grows with the
    context (attention), so a depth-0 witness would hide an attention slowdown at depth behind the host's spread.
    Only the baseline witnesses: a run whose engine decode got slower while its kernels did not looks host-bound
    by that very change (a host-side regression of a kernel-bound config), so it must not relax its own gate. The
    run must have measured the same `tgN_gpu`: the loosened engine metric is traded for that strict kernel gate,
    never for nothing. Results without tgN_gpu (recorded before it existed) cannot say. A tgN that held within
    host_cpu.STEADY over a baseline boot whose host CPU changed speed (`host_cpu.held_steady`) witnesses nothing: it
    did not follow the host, so a ratio just past host_bound_ratio (a kernel-bound step's own overhead) is not taken
    for a host-bound one."""
    b_metrics, c_metrics = baseline.get("metrics") or {}, current.get("metrics") or {}
    out: dict[str, str] = {}
    for tg in sorted(b_metrics):
        m = re.fullmatch(r"(tg\d+)(@d\d+)?", tg)
        if not m:
            continue
        depth = m.group(2) or ""
        kernel_name = f"{m.group(1)}_gpu{depth}"
        if depth in out or kernel_name not in c_metrics:
            continue
        # a client-clock tgN runs ~30% below the engine's and would look host-bound by its clock alone
        engine, kernel = _clocked_median(baseline, tg, "engine"), _clocked_median(baseline, kernel_name, "kernel")
        if engine is None or kernel is None:
            continue
        ratio = kernel / engine
        # a decode that held steady while the host's CPU changed speed did not follow the host, whatever its ratio
        # (stock marlin-bf16 on an H200: tg128_gpu 1.05x its tg128 at CV 0.04%, beside a loop at CV 27.1%)
        if host_cpu.held_steady(baseline, b_metrics[tg].get("samples")):
            continue
        if math.isfinite(ratio) and ratio > thresholds.host_bound_ratio:
            out[depth] = f"baseline: {kernel_name} is {ratio:.2f}x its {tg}"
    return out


def _clocked_median(run: Mapping, name: str, clock: str) -> float | None:
    """The median of metric `name` of a results / baseline dict when it was measured on `clock` ("engine",
    "kernel", "client"), else None (absent, another clock, no positive finite median)."""
    entry = (run.get("metrics") or {}).get(name)
    if not isinstance(entry, Mapping) or metric_clock(run, name, entry) != clock:
        return None
    try:
        value = stats.median(entry["samples"])
    except (KeyError, TypeError, ValueError):
        return None
    return value if is_finite_number(value) and value > 0 else None


def unshared_metrics(baseline: Mapping, current: Mapping) -> tuple[list[str], list[str]]:
    """(metrics only the baseline has, metrics only the results have): a vanished metric deserves a warning."""
    b, c = set(baseline.get("metrics") or {}), set(current.get("metrics") or {})
    return sorted(b - c), sorted(c - b)


def gate_failures(verdicts: Sequence[Verdict], thresholds: Thresholds) -> list[Verdict]:
    """The verdicts that fail the gate: every non-advisory "fail", plus "inconclusive" when thresholds say so,
    except an inconclusive that is only the metric's recorded boot spread (its message says what would fail). A
    slowdown beyond the platform's A/A family fails too: advisory platforms warn of it, and a strict one with
    `inconclusive_is_failure: false` let a 3x slower decode through with neither a failure nor a warning."""
    bad = {"fail", "inconclusive"} if thresholds.inconclusive_is_failure else {"fail"}
    return [v for v in verdicts if (v.status in bad or _unjudged_memory(v) or _out_of_family_slowdown(v))
            and not v.advisory and not v.within_boot_spread]


def _unjudged_memory(v: Verdict) -> bool:
    """Memory is strict on every platform: used memory read from another source than the baseline's (vLLM's log
    breakdown on one side, a process reading on the other, as when a new vLLM's log changes) or a number the baseline
    lacks is a memory gate that did not run, which must not pass quietly whatever the growth."""
    return v.kind in ("memory", "capacity") and v.status == "inconclusive"


def advisory_failures(verdicts: Sequence[Verdict], thresholds: Thresholds) -> list[Verdict]:
    """Timing verdicts that would fail a strict gate, on a platform where timing is advisory (warnings)."""
    bad = {"fail", "inconclusive"} if thresholds.inconclusive_is_failure else {"fail"}
    return [v for v in verdicts if v.advisory and (v.status in bad or _out_of_family_slowdown(v))]


def _out_of_family_slowdown(v: Verdict) -> bool:
    """A slowdown beyond the platform's A/A family is not judged (the baseline may be another machine state's), but it
    is never quiet: a 3x slower decode must reach the warnings, not only a re-record advice that would bake it in."""
    return v.reason is Reason.OUT_OF_FAMILY and v.worse
