"""Tests of the feature verdicts with known answers, on real servers of this platform's default config: the same
config as candidate and baseline (A/A) must never PASS an improvement nor FAIL "no regression"; the candidate slowed
by the test-only hook plugin must FAIL "no regression"; the candidate holding +1.5 GiB must FAIL "used memory <=
+1 GB". Both servers are up at once and measured ABBA, as a feature is (harness/features/measure.py), and judged
as a feature is: timing CIs widened by the platform's recorded boot spread (two boots differ by more than rounds
within them show)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.core import stats
from harness.engine import hooks
from harness.features.judge import Status
from harness.features.measure import Measurer, Side, interleaved
from harness.features.run import judge_all
from harness.features.spec import parse_criterion
from harness.perf import host_cpu
from harness.perf.regression import THRESHOLDS_FILE, load_thresholds
from harness.session.suite import RunningServer, Suite

pytestmark = [pytest.mark.feature, pytest.mark.server]
HOLD_GIB = 1.5
A_A = [parse_criterion(c) for c in ("tg32 >= +10%", "tg32 >= -3%")]
MEMORY = [parse_criterion(c) for c in ("used_memory <= +1 GB", "kv_capacity >= -5%")]


@dataclass
class Pair:
    plain: RunningServer
    hooked: RunningServer  # holds HOLD_GIB inside vLLM's model loader; carries the slowdown hook (0 until set)
    measurer: Measurer
    rounds: int


@pytest.fixture(scope="module")
def pair(suite: Suite):
    if suite.server_url:
        pytest.skip("--server-url: these checks boot their own servers")
    ok, why = suite.can_boot_secondary()
    if not ok:
        pytest.skip(f"two servers must be up at once for an ABBA check, and {why}")
    config = suite.selected()[0]
    target = suite.target(config)
    if not target.runnable:
        pytest.skip(target.reason)
    env = {hooks.HOLD_ENV: str(HOLD_GIB), hooks.SLOWDOWN_ENV: "1"}
    gpu = suite.platform.is_cuda
    with suite.boot(target, tag="__fvA", beside_shared=gpu) as plain, \
            suite.boot(target, tag="__fvB", env_extra=env, beside_shared=gpu) as hooked:
        rounds = 8 if suite.platform.name == "cpu" else 10
        yield Pair(plain, hooked, Measurer(A_A + MEMORY, suite.platform.name, gpu), rounds)


def _measure(pair: Pair) -> tuple[Side, Side]:
    base, cand = Side("baseline", pair.plain.target.name), Side("candidate", pair.hooked.target.name)
    interleaved(pair.measurer, (base, pair.plain), (cand, pair.hooked), pair.rounds)
    return base, cand


def _thresholds(suite: Suite):
    return load_thresholds(THRESHOLDS_FILE, suite.platform.name)


def test_a_a_never_passes_an_improvement_nor_fails_no_regression(pair, suite):
    hooks.set_slowdown(hooks.server_hook_dir(suite, pair.hooked), hooks.Delay(0.0, 0.0), alive=pair.hooked.ensure_alive)
    base, cand = _measure(pair)
    better, same = judge_all(tuple(A_A), base, cand, _thresholds(suite).spread_of)
    print(f"\n  A/A: {better.status.value} {better.criterion}: {better.why}\n       {same.status.value} {same.criterion}: {same.why}")
    assert better.status is not Status.PASS, f"A/A passed an improvement: {better.why}"
    assert same.status is not Status.FAIL, f"A/A failed 'no regression': {same.why}"
    assert better.status is not Status.ERROR and same.status is not Status.ERROR
    # level 4's host CPU loop after each measured round, on each side's own engine core, for the host's sentence
    for side, running in ((base, pair.plain), (cand, pair.hooked)):
        if host_cpu.engine_core(running.process.pids()) is not None:
            assert len(side.host_loop_us) == pair.rounds, side.host_cpu()


def test_a_slowed_candidate_fails_no_regression(pair, suite):
    """Slowed by the fraction of its decode step that this platform's noise resolves (baselines/thresholds.yaml
    sensitivity_fail: 2x the step time on CPU, 5% on GPUs), scaled twice by tg32's recorded boot spread (once for a
    boot offset that may flatter the candidate, once for the CI's widening: 4.5x the step time on CPU, still 5% on
    GPUs, which record none for decode), the candidate must FAIL 'tg32 >= -3%'."""
    t = _thresholds(suite)
    fraction = (1.0 + t.sensitivity_fail) * (1.0 + t.spread_of("tg32")) ** 2 - 1.0
    probe = Side("candidate", pair.hooked.target.name)
    hook_dir = hooks.server_hook_dir(suite, pair.hooked)
    hooks.set_slowdown(hook_dir, hooks.Delay(0.0, 0.0), alive=pair.hooked.ensure_alive)
    pair.measurer.measure_round(probe, pair.hooked)
    step_s = 1.0 / stats.median(probe.value("tg32"))
    hooks.set_slowdown(hook_dir, hooks.Delay(fraction * step_s * 1e6, 0.0), alive=pair.hooked.ensure_alive)
    try:
        base, cand = _measure(pair)
    finally:
        hooks.set_slowdown(hook_dir, hooks.Delay(0.0, 0.0), alive=pair.hooked.ensure_alive)
    v = judge_all((A_A[1],), base, cand, t.spread_of)[0]
    print(f"\n  slowed by {fraction:.0%} of a {step_s * 1e3:.1f} ms step: {v.status.value} {v.criterion}: {v.why}")
    assert v.status is Status.FAIL, f"a candidate {fraction:.0%} slower per step was not failed: {v.why}"


def test_a_candidate_holding_more_memory_fails_the_memory_criterion(pair):
    base, cand = Side("baseline", pair.plain.target.name), Side("candidate", pair.hooked.target.name)
    pair.measurer.record_boot(base, pair.plain)
    pair.measurer.record_boot(cand, pair.hooked)
    used, kv = judge_all(tuple(MEMORY), base, cand)
    print(f"\n  held {HOLD_GIB} GiB: {used.status.value} {used.why}; {kv.status.value} {kv.why}")
    assert used.status is Status.FAIL, f"+{HOLD_GIB} GiB held passed 'used memory <= +1 GB': {used.why}"
    same = judge_all((MEMORY[0],), base, base)[0]  # A/A of the accounting itself
    assert same.status is Status.PASS, same.why
