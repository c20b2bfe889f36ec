"""Feature verdicts at their edges, each test guarding one fault a mutation audit (2026-12-06) found no test held:
bounds that are inclusive as the users write them, the baseline boots' range widening a memory verdict on both sides
and in the bound's unit, a baseline that measured nothing being an ERROR (not a traceback), an absolute timing bound's
CI widened downwards too, the CI's level, BLOCKED and FAIL outranking what they should, criteria the grammar must refuse
rather than half-read, a requires cycle, and level 1.5 asking the profiler for the events its platform records."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.core.errors import SuiteError
from harness.features.judge import GIB, Status, judge_number, judge_samples, overall
from harness.features.spec import load_features, parse_criterion

REPO = Path(__file__).resolve().parents[2]
ONE_GB_IN_GIB = 1e9 / GIB  # exact in binary: a growth of this many GiB is exactly +1 GB


def around(median, n=12, cv=0.002, seed=0):
    return list(median * (1 + cv * np.random.default_rng(seed).standard_normal(n)))


# -- bounds are inclusive: "at or above", "at or below" (harness/features/judge.py) --

def test_a_number_exactly_on_its_bound_meets_it():
    """`kv_capacity >= -5%` with exactly -5%, `used_memory <= +1 GB` with exactly +1 GB, `boot_s <= 60` booting in
    60 s: each meets its bound (PASS), not INCONCLUSIVE or FAIL, as the users' `>=` / `<=` say."""
    assert judge_number(parse_criterion("kv_capacity >= -5%"), 1000.0, 950.0).status is Status.PASS
    assert judge_number(parse_criterion("used_memory <= +1 GB"), 60.0, 60.0 + ONE_GB_IN_GIB).status is Status.PASS
    assert judge_number(parse_criterion("boot_s <= 60"), None, 60.0).status is Status.PASS
    assert judge_number(parse_criterion("spec_acceptance_length >= 2"), None, 2.0).status is Status.PASS


def test_a_boots_range_that_just_reaches_the_bound_is_inconclusive_not_a_fail():
    """A candidate beyond the bound by exactly the baseline boots' range could land on the bound when booted again:
    it has not missed it by more than the boots differ, so it is not a FAIL (kv: 900 +/- 50 against 1000 reaches
    0.95; memory: +2 GB, boots 1 GB apart, reaches +1 GB)."""
    kv = judge_number(parse_criterion("kv_capacity >= -5%"), 1000.0, 900.0, baseline_range=50.0)
    assert kv.status is Status.INCONCLUSIVE, kv.why
    used = judge_number(parse_criterion("used_memory <= +1 GB"), 60.0, 60.0 + 2 * ONE_GB_IN_GIB,
                        baseline_range=ONE_GB_IN_GIB)
    assert used.status is Status.INCONCLUSIVE, used.why


# -- memory judged per boot with the baseline boots' range --

def test_a_kv_capacity_below_the_bound_by_less_than_the_boots_differ_is_not_a_fail():
    """Stock's two boots (146,584 / 138,724 KV tokens, 7,860 apart, nothing changed): a candidate at 133,000 is -6.8%
    of their mean, below -5% by less than that range, so another boot could clear the bound: INCONCLUSIVE. Widening
    only the low end would FAIL it, an A/A-sized difference read as a regression. Beyond the range it FAILs."""
    kv = parse_criterion("kv_capacity >= -5%")
    mean, spread = (146_584 + 138_724) / 2, 146_584 - 138_724
    assert judge_number(kv, mean, 133_000, baseline_range=spread).status is Status.INCONCLUSIVE
    assert judge_number(kv, mean, 125_000, baseline_range=spread).status is Status.FAIL


def test_the_memory_boots_range_is_converted_to_decimal_gb_like_the_growth():
    """Used memory is in GiB, the bound in decimal GB: the boots' range (1 GiB = 1.074 GB) must be converted as the
    growth is. A +2.05 GB candidate is within 1.074 GB of +1 GB (INCONCLUSIVE); read as 1.0 GB, it would FAIL."""
    used = parse_criterion("used_memory <= +1 GB")
    near = judge_number(used, 60.0, 60.0 + 2.05 * ONE_GB_IN_GIB, baseline_range=1.0)
    assert near.status is Status.INCONCLUSIVE, near.why
    assert judge_number(used, 60.0, 60.0 + 2.2 * ONE_GB_IN_GIB, baseline_range=1.0).status is Status.FAIL


def test_a_relative_memory_criterion_without_a_baseline_number_is_an_error_not_a_traceback():
    """vLLM's startup log of the baseline lacked its accounting line: the criterion did not run, an ERROR naming the
    baseline (never a TypeError from comparing None)."""
    v = judge_number(parse_criterion("kv_capacity >= -5%"), None, 140_000.0)
    assert v.status is Status.ERROR and "baseline" in v.why, v


# -- timing criteria: the CI --

@pytest.mark.parametrize("baseline", [[], None])
def test_a_relative_timing_criterion_the_baseline_did_not_measure_is_an_error_not_a_traceback(baseline):
    """The candidate measured tg32, the baseline did not (its workload failed, or was not in its set): the criterion
    did not run, an ERROR naming the baseline, never a ValueError from a median of nothing that loses the feature's
    whole verdict."""
    v = judge_samples(parse_criterion("tg32 >= -3%"), baseline, around(50.0))
    assert v.status is Status.ERROR and "not measured on the baseline" in v.why, v


def test_an_absolute_bound_is_widened_downwards_by_the_boot_spread_too():
    """`ttft_p50_ms <= 500` on a platform whose TTFT moves 65% between boots (baselines/thresholds.yaml): a 600 ms
    median could be 364 ms on the next boot, so one boot cannot FAIL it (INCONCLUSIVE); without the spread it FAILs,
    and a median beyond the spread still FAILs."""
    c = parse_criterion("ttft_p50_ms <= 500")
    assert judge_samples(c, None, around(600.0, n=8)).status is Status.FAIL
    widened = judge_samples(c, None, around(600.0, n=8), boot_spread=0.65)
    assert widened.status is Status.INCONCLUSIVE and "boot spread of 65%" in widened.why, widened.why
    assert judge_samples(c, None, around(900.0, n=8), boot_spread=0.65).status is Status.FAIL


def test_an_absolute_bound_at_the_true_median_is_rarely_decided():
    """The CI of the candidate's median is a 95% one: with the true median exactly on the bound, a verdict either
    way is a false one, and over 400 runs of 20 rounds it comes out decided at most 7.5% of the time (the
    bootstrap's percentile CI of a median covers a little less than it says; a 90% CI decides ~9%)."""
    c = parse_criterion("ttft_p50_ms <= 500")
    runs = 400
    decided = sum(judge_samples(c, None, list(500 + 25 * np.random.default_rng(s).standard_normal(20)), seed=s).status
                  is not Status.INCONCLUSIVE for s in range(runs))
    assert decided / runs <= 0.075, decided / runs


# -- a feature's verdict --

def test_a_blocked_criterion_blocks_the_feature_and_a_fail_outranks_an_error():
    """A criterion blocked by a failed required gate did not run: the feature is BLOCKED, never PASS on the
    criteria that did. A FAIL beside an ERROR is the feature's FAIL (the docstring's order: any FAIL fails)."""
    assert overall([Status.PASS, Status.BLOCKED]) is Status.BLOCKED
    assert overall([Status.ERROR, Status.FAIL]) is Status.FAIL
    assert overall([Status.INCONCLUSIVE, Status.ERROR]) is Status.ERROR


# -- the criteria grammar refuses what it would half-read (harness/features/spec.py) --

@pytest.mark.parametrize("text, why", [
    # two criteria on one line: the second would be dropped in silence
    ("tg32 >= +10%, ttft_p50 <= +3%", "not understood"),
    ("tg32 >= +10% per boot", "not understood"),
    # a bound that a ratio (never below 0) always clears
    ("tg32 >= -100%", "can never fail"),
    # unsigned GB: the direction of the change is never guessed
    ("used_memory <= 1 GB", "signed"),
    # a signed number without % is not an absolute bound: `tpot_ms <= +5` meant +5%?
    ("tpot_ms <= +5", "ambiguous"),
    ("boot_s <= +60", "ambiguous"),
])
def test_a_criterion_the_grammar_cannot_read_whole_is_refused(text, why):
    with pytest.raises(SuiteError, match=why) as e:
        parse_criterion(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["tg32@c16 >= -3%", "tg32@c12 >= -3%"])
def test_only_concurrency_1_itself_is_the_plain_metric(text):
    """`@c1` is refused as the plain metric; `@c16` and `@c12` are other concurrencies, measured, and must parse."""
    assert parse_criterion(text).metric == text.split()[0]


def test_a_requires_cycle_is_one_line(tmp_path):
    """cutlass-gemm requiring runner-caching, which requires cutlass-gemm: neither gate could ever open first; the file
    is refused with the cycle named, not a RecursionError."""
    text = (REPO / "configs" / "features.yaml").read_text()
    old = "    candidate: gemm-bf16\n    criteria: [tg32 >= +10%"
    assert text.count(old) == 1
    bad = tmp_path / "features.yaml"
    bad.write_text(text.replace(old, "    requires: [runner-caching]\n" + old))
    with pytest.raises(SuiteError, match="cycle: .*cutlass-gemm -> runner-caching -> cutlass-gemm") as e:
        load_features(bad)
    assert "\n" not in str(e.value)


# -- level 1.5 (harness/kernelpath/check.py) --

@pytest.mark.parametrize("capability, kind", [((12, 1), "kernel"), (None, "cpu_op")])
def test_the_kernel_path_profiles_the_events_its_platform_records(tmp_path, monkeypatch, capability, kind):
    """A GPU's trace holds its kernels as `kernel` events, a CPU's its ops as `cpu_op`: level 1.5 asks for those, for
    the full trace and the decode window alike (the other kind holds nothing to match)."""
    from harness.config.catalog import Catalog
    from harness.kernelpath import check as kernel_path
    from harness.kernelpath.traces import KernelStat, KernelSummary

    catalog = Catalog()
    fork, cfg = catalog.flavour("fork"), catalog.parse("gemv-bf16")
    spec = fork.resolve(cfg, "sm_121")
    asked = []
    summary = KernelSummary("synthetic", kind, [KernelStat(n, 16, 1.0, 0.1) for n in fork.seen(cfg, "sm_121")])

    def profile(url, trace_dir, workload, event_kind, *args):
        asked.append(("full", event_kind))
        return summary

    def window(server, event_kind, *args, **kw):
        asked.append(("decode", event_kind))
        return kernel_path.DecodeWindow(summary, 1, 16)

    monkeypatch.setattr(kernel_path, "profile", profile)
    monkeypatch.setattr(kernel_path, "profile_decode_window", window)
    server = SimpleNamespace(url="http://127.0.0.1:9", trace_dir=tmp_path, client=lambda **kw: None,
                             target=SimpleNamespace(name="gemv-bf16", spec=spec), log_text=lambda: "")
    suite = SimpleNamespace(platform=SimpleNamespace(is_cuda=capability is not None, name="p", device="d"),
                            model=SimpleNamespace(alias="m"), artifact=lambda *parts: tmp_path / parts[-1])
    kernel_path.profile_kernel_path(suite, server)
    assert asked == [("full", kind), ("decode", kind)], asked
