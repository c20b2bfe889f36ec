"""Feature verdicts without a server: the criteria grammar, the CI-clears-target rule on synthetic samples (just
clear, just miss, straddle), strict memory, errors for what was not measured, and features.yaml validation."""
from pathlib import Path

import numpy as np
import pytest

from harness.core.errors import SuiteError
from harness.features.judge import Status, judge_number, judge_samples, overall
from harness.features.spec import load_features, parse_criterion

REPO = Path(__file__).resolve().parents[2]


def around(median, n=12, cv=0.002, seed=0):
    return list(median * (1 + cv * np.random.default_rng(seed).standard_normal(n)))


@pytest.mark.parametrize("text, metric, op, value, relative, unit", [
    ("tg32 >= +10%", "tg32", ">=", 0.10, True, "%"),
    ("ttft_p50 <= +3%", "ttft_ms", "<=", 0.03, True, "%"),
    ("used_memory <= +1 GB", "used_memory", "<=", 1.0, True, "GB"),
    ("kv_capacity >= -5%", "kv_capacity", ">=", -0.05, True, "%"),
    ("boot_s <= 60", "boot_s", "<=", 60.0, False, "s"),
    ("ttft_p50_ms <= 500", "ttft_ms", "<=", 500.0, False, "ms"),
    ("pp2048_gpu >= -3%", "pp2048_gpu", ">=", -0.03, True, "%"),
    ("tg32@c4 >= -3%", "tg32@c4", ">=", -0.03, True, "%"),
])
def test_criteria_are_read_as_the_users_write_them(text, metric, op, value, relative, unit):
    c = parse_criterion(text)
    assert (c.metric, c.op, c.relative, c.unit) == (metric, op, relative, unit) and c.value == pytest.approx(value)


@pytest.mark.parametrize("text, why", [
    ("tg32 >= 10%", "needs a sign"), ("tg32 > +10%", "not understood"), ("tgx >= +5%", "unknown metric"),
    ("used_memory <= 1", "judged against the baseline"), ("boot_s <= +5%", "absolute bound"),
    ("tg32 >= +1 GB", "GB bounds the change of used_memory"),
    # refused before any boot: the workloads never measure these
    ("tg32@c1 >= -3%", "write tg32"), ("pp512@d0 >= -3%", "write pp512"),
    ("tg32_gpu@c4 >= -3%", "measured at batch 1"), ("pp2048_gpu@d4096 >= -3%", "depth 0 only"),
    ("tg1 >= -3%", "at least 2 generated tokens"), ("pp0 >= -3%", "a prefill needs a token"),
    ("tg32@c4 >= -150%", "can never fail"),
])
def test_a_bad_criterion_is_one_line_naming_the_grammar(text, why):
    with pytest.raises(SuiteError, match=why) as e:
        parse_criterion(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("ratio, status", [
    (1.13, Status.PASS),          # the whole CI above 1.10: clears the target
    (1.07, Status.FAIL),          # the whole CI below 1.10: misses it
    (1.10, Status.INCONCLUSIVE),  # the CI straddles the target: the run cannot tell
])
def test_a_relative_criterion_passes_only_when_its_ci_clears_the_target(ratio, status):
    v = judge_samples(parse_criterion("tg32 >= +10%"), around(50.0), around(50.0 * ratio, seed=1))
    assert v.status is status, v.why
    assert v.ci[0] <= v.ratio <= v.ci[1] and "\n" not in v.why


@pytest.mark.parametrize("ratio, status", [(1.00, Status.PASS), (1.06, Status.FAIL), (1.03, Status.INCONCLUSIVE)])
def test_a_latency_criterion_is_held_from_above(ratio, status):
    v = judge_samples(parse_criterion("ttft_p50 <= +3%"), around(500.0), around(500.0 * ratio, seed=2))
    assert v.status is status, v.why


def test_a_a_never_passes_an_improvement_and_never_fails_no_regression():
    """Candidate = baseline, noisy samples: 'tg32 >= +10%' is never PASS, 'tg32 >= -3%' is never FAIL."""
    for seed in range(20):
        a, b = around(50.0, cv=0.05, seed=seed), around(50.0, cv=0.05, seed=seed + 100)
        assert judge_samples(parse_criterion("tg32 >= +10%"), a, b).status is not Status.PASS
        assert judge_samples(parse_criterion("tg32 >= -3%"), a, b).status is not Status.FAIL


def test_noise_makes_it_inconclusive_not_a_guess():
    wide = judge_samples(parse_criterion("tg32 >= +10%"), around(50, cv=0.3), around(56, cv=0.3, seed=3))
    assert wide.status is Status.INCONCLUSIVE


def test_memory_is_strict_and_in_decimal_gb():
    crit = parse_criterion("used_memory <= +1 GB")
    assert judge_number(crit, 60.0, 60.0 + 1.5).status is Status.FAIL  # +1.5 GiB held = +1.61 GB
    assert judge_number(crit, 60.0, 60.9).status is Status.PASS  # +0.97 GB
    assert judge_number(crit, 60.0, 61.0).status is Status.FAIL  # +1 GiB = +1.07 GB: over the 1 GB gate
    kv = parse_criterion("kv_capacity >= -5%")
    assert judge_number(kv, 958_000, 138_000).status is Status.FAIL  # the plugin's second copy of the experts
    assert judge_number(kv, 958_000, 950_000).status is Status.PASS


def test_memory_within_the_baselines_own_boot_to_boot_range_of_the_bound_is_inconclusive():
    """Stock's two boots of the 120b shape on an H100 at 0.92 (2026-12-06): 62.88 / 63.42 GiB used, 146,584 / 138,724
    KV tokens, nothing changed. Judged strictly against one of them, a third stock boot could fail `kv_capacity >= -5%`
    (138,724 against 146,584 is -5.4%): an A/A the memory criterion lost."""
    from harness.features.measure import Side
    from harness.features.run import judge_all

    kv, used = parse_criterion("kv_capacity >= -5%"), parse_criterion("used_memory <= +1 GB")
    base = Side("baseline", "triton-bf16", numbers={"kv_capacity": [146_584, 138_724], "used_memory": [62.88, 63.42]})

    def judged(kv_tokens: float, used_gib: float) -> tuple[Status, Status]:
        cand = Side("candidate", "gemv-bf16", numbers={"kv_capacity": [kv_tokens], "used_memory": [used_gib]})
        got = judge_all((kv, used), base, cand)
        return got[0].status, got[1].status

    # the plugin's boot that day: -1.0% of the baseline's mean, within the baseline's 5.5% of the -5% bound
    assert judged(141_243, 63.09) == (Status.INCONCLUSIVE, Status.PASS)
    assert judged(138_724, 63.15) == (Status.INCONCLUSIVE, Status.PASS)  # A/A: stock's own low boot is not a FAIL
    assert judged(100_000, 65.0) == (Status.FAIL, Status.FAIL)  # beyond the bound by more than the boots differ
    assert judged(178_176, 60.55) == (Status.PASS, Status.PASS)  # the MXFP4 config: more KV, less memory
    assert judged(141_243, 64.40)[1] is Status.INCONCLUSIVE  # +1.34 GB, within the boots' 0.58 GB of +1 GB
    why = judge_all((kv,), base, Side("candidate", "x", numbers={"kv_capacity": [141_243]}))[0].why
    assert "the baseline's boots differ by 7860 (5.5%)" in why and "not judged" in why, why
    one = Side("baseline", "triton-bf16", numbers={"kv_capacity": [146_584]})  # one boot: no range, strict as before
    assert judge_all((kv,), one, Side("candidate", "x", numbers={"kv_capacity": [138_724]}))[0].status is Status.FAIL


def test_an_unmeasured_metric_is_an_error_not_a_pass():
    assert judge_samples(parse_criterion("pp2048_gpu >= -3%"), around(100.0), []).status is Status.ERROR
    assert judge_number(parse_criterion("used_memory <= +1 GB"), 60.0, None).status is Status.ERROR
    assert overall([Status.PASS, Status.ERROR]) is Status.ERROR
    assert overall([Status.PASS, Status.INCONCLUSIVE, Status.FAIL]) is Status.FAIL
    assert overall([Status.PASS, Status.PASS]) is Status.PASS and overall([]) is Status.ERROR


def test_an_undecided_criterion_leaves_the_feature_undecided_not_passed():
    """A feature whose criteria passed but one that the run could not decide read PASS when INCONCLUSIVE was not
    among the statuses that outrank PASS."""
    assert overall([Status.PASS, Status.INCONCLUSIVE]) is Status.INCONCLUSIVE
    assert overall([Status.INCONCLUSIVE, Status.PASS, Status.PASS]) is Status.INCONCLUSIVE


def test_one_round_on_a_side_gives_no_ci_and_no_verdict():
    """One sample per side has no spread to bootstrap: a ratio of two single numbers, however far off, is no
    verdict; two rounds per side are the least that is judged."""
    c = parse_criterion("tg32 >= +10%")
    for base, cand in (([50.0], [80.0]), ([50.0], [20.0]), (around(50.0), [80.0]), ([50.0], around(80.0))):
        v = judge_samples(c, base, cand)
        assert v.status is Status.INCONCLUSIVE and "at least 2 rounds" in v.why, v.why
    assert judge_samples(c, around(50.0, n=2), around(80.0, n=2, seed=1)).status is Status.PASS
    assert judge_samples(parse_criterion("ttft_p50_ms <= 500"), None, [900.0]).status is Status.INCONCLUSIVE


def test_absolute_bounds_use_the_candidates_median_ci():
    assert judge_samples(parse_criterion("ttft_p50_ms <= 500"), None, around(420.0)).status is Status.PASS
    assert judge_samples(parse_criterion("ttft_p50_ms <= 500"), None, around(560.0)).status is Status.FAIL
    assert judge_number(parse_criterion("boot_s <= 60"), None, 75.0).status is Status.FAIL


def test_the_shipped_features_load():
    features = load_features()
    fork = [f for f in features.values() if f.flavour == "fork"]
    assert [f.phase for f in fork] == ["P1", "P2", "P3", "P4", "P5", "P6"]
    assert {f.name for f in features.values() if f.flavour == "upstream"} >= {"kernels-moe", "kernels-mxfp4-all"}
    p1 = features["cutlass-gemm"]
    assert p1.baseline == "marlin-bf16-attn-flashinfer-nosinks" and "tg32 >= +10%" in [c.text for c in p1.criteria]
    assert features["runner-caching"].requires == ("cutlass-gemm",)


def test_the_kernel_features_judge_the_kernels_time_in_the_served_model_beside_what_users_see():
    """A host-bound decode hides a kernel gain or loss in tg32; tg32_gpu (a profiled batch-1 decode of 32 tokens,
    the same workload shape) carries it."""
    from harness.features.measure import workloads_for
    features = load_features()
    for name in ("kernels-moe", "kernels-mxfp4-all"):
        texts = [c.text for c in features[name].criteria]
        assert any(t.startswith("tg32 >=") for t in texts) and any(t.startswith("tg32_gpu >=") for t in texts)
        plan = dict(workloads_for(list(features[name].criteria), "sm_90"))
        assert plan["tg32_gpu"].kind == "decode" and plan["tg32_gpu"].tg == 32
        assert (plan["tg32_gpu"].pp, plan["tg32_gpu"].tg) == (plan["tg32"].pp, plan["tg32"].tg)


def test_the_kernel_features_judge_against_the_stock_moe_of_each_platform():
    """Stock is what vLLM serves gpt-oss with: Triton's matmul_ogs MoE on Hopper, Marlin on GB10, where vLLM refuses
    the Triton MoE. Against a fixed `triton-bf16` the users' first GB10 run could not judge our kernels at all."""
    from harness.config.catalog import Catalog
    catalog = Catalog()
    upstream = catalog.flavours["upstream"]
    for platform, stock in (("sm_90", "triton-bf16"), ("sm_121", "marlin-bf16")):
        features = load_features(catalog=catalog, platform=platform)
        for name in ("kernels-moe", "kernels-mxfp4-all"):
            f = features[name]
            assert (f.baseline, f.baseline_why) == (stock, None), (platform, f)
            assert upstream.runnable(catalog.parse(f.baseline), platform)[0], (platform, f.baseline)
    assert not upstream.runnable(catalog.parse("triton-bf16"), "sm_121")[0]  # why GB10 needs its own entry


def test_a_platform_without_a_baseline_entry_is_a_reason_not_a_guess():
    from types import SimpleNamespace

    from harness.features.run import require_runnable
    f = load_features(platform="sm_100")["kernels-moe"]  # stock there is not known to us: no entry, no guess
    assert f.baseline == "" and "has no entry for sm_100" in f.baseline_why and "add the config" in f.baseline_why
    on = SimpleNamespace(flavour=SimpleNamespace(name="upstream"), platform=SimpleNamespace(name="sm_100"))
    assert require_runnable(on, f) == f.baseline_why  # before any config is looked up or booted
    unknown = load_features()["kernels-moe"]  # no platform: none is picked
    assert unknown.baseline == "" and "depends on the platform" in unknown.baseline_why
    assert load_features()["cutlass-gemm"].baseline == "marlin-bf16-attn-flashinfer-nosinks"  # a plain one needs none


@pytest.mark.parametrize("baselines", ['{">=sm_80": triton-bf16, sm_12x: marlin-bf16}',
                                       '{sm_12x: marlin-bf16, ">=sm_80": triton-bf16}'])
def test_the_most_specific_selector_wins_in_any_order(tmp_path, baselines):
    """A catch-all written first must not shadow GB10's own entry (it would judge GB10 against a backend vLLM refuses)."""
    bad = tmp_path / "features.yaml"
    text = (REPO / "configs" / "features.yaml").read_text()
    bad.write_text(text.replace("upstream: {sm_12x: marlin-bf16, sm_90: triton-bf16}", "upstream: " + baselines))
    assert load_features(bad, platform="sm_121")["kernels-moe"].baseline == "marlin-bf16"
    assert load_features(bad, platform="sm_90")["kernels-moe"].baseline == "triton-bf16"


@pytest.mark.parametrize("baselines, why", [
    ('{sm_12x: marlin-bf16, "sm90": triton-bf16}', "unknown platform selector"),
    ("{}", "has none for flavour upstream"),
    ("{sm_12x: marlin-bf17, sm_90: triton-bf16}", "marlin-bf17"),  # checked on every platform, not only its own
])
def test_a_malformed_by_platform_baseline_is_one_line(tmp_path, baselines, why):
    text = (REPO / "configs" / "features.yaml").read_text()
    old = "upstream: {sm_12x: marlin-bf16, sm_90: triton-bf16}"
    assert old in text
    bad = tmp_path / "features.yaml"
    bad.write_text(text.replace(old, "upstream: " + baselines))
    with pytest.raises(SuiteError, match=why) as e:
        load_features(bad, platform="sm_90")
    assert "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("mutate, why", [
    (lambda t: t.replace("hypothesis:", "hypotesis:", 1), "unknown key"),
    (lambda t: t.replace("[tg32 >= +10%, ttft_p50", "[tg32 >= 10%, ttft_p50", 1), "needs a sign"),
    (lambda t: t.replace("candidate: gemm-bf16", "candidate: gemm-bf17", 1), "candidate"),
    (lambda t: t.replace("requires: [cutlass-gemm]", "requires: [nothing-here]", 1), "not features of this file"),
    (lambda t: t + "\n  broken: [\n", "YAML"),
    # two sentences however they end; a gate level the feature never runs (found only after the run, before)
    (lambda t: t.replace("over Marlin because", "over Marlin! Because", 1), "one sentence"),
    (lambda t: t.replace("gate: [levels level1_5]", "gate: [levels level1_5 level5]", 1), "never run"),
])
def test_a_malformed_features_file_is_one_line(tmp_path, mutate, why):
    bad = tmp_path / "features.yaml"
    bad.write_text(mutate((REPO / "configs" / "features.yaml").read_text()))
    with pytest.raises(SuiteError, match=why) as e:
        load_features(bad)
    assert "\n" not in str(e.value), str(e.value)


class _Running:
    """A stand-in server for the ordering logic only (fakes never stand for vLLM's behaviour here)."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __enter__(self):
        self.log.append(("boot", self.name))
        return self

    def __exit__(self, *exc):
        self.log.append(("stop", self.name))

    def ensure_alive(self):
        pass


class _Measurer:
    def __init__(self, log):
        self.log, self.sampler = log, None

    def record_boot(self, side, running):
        self.log.append(("boot-numbers", side.role))
        side.number("used_memory", 63.42)

    def warm(self, running):
        pass

    def measure_round(self, side, running, profiled=False):
        self.log.append(("profiled" if profiled else "round", side.role))


def test_a_b_a_brackets_the_candidate_and_profiles_after_the_unprofiled_rounds():
    from harness.features.measure import Side, bracketed, interleaved

    log = []
    base, cand = Side("baseline", "a"), Side("candidate", "b")
    bracketed(_Measurer(log), lambda config, tag: _Running(tag, log), base, cand, 4,
              profile=lambda side, running: log.append(("breakdown", side.role)))
    boots = [e[1] for e in log if e[0] == "boot"]
    assert boots == ["__featureA1", "__featureB", "__featureA2"]
    first_boot = log[:log.index(("stop", "__featureA1"))]
    kinds = [e[0] for e in first_boot if e[0] in ("round", "profiled")]
    assert kinds == ["round", "round", "profiled", "profiled"]  # every profiled round after the unprofiled ones
    assert [e for e in log if e[0] == "breakdown"] == [("breakdown", "baseline"), ("breakdown", "candidate")]
    assert sum(1 for e in log if e == ("round", "candidate")) == 4 and sum(1 for e in log if e == ("round", "baseline")) == 4
    assert len(base.boot_ends) == 2 and len(cand.boot_ends) == 1  # each boot's end marked: the baseline's drift

    log.clear()
    interleaved(_Measurer(log), (base, _Running("A", log)), (cand, _Running("B", log)), 4)
    rounds = [e[1][0] for e in log if e[0] == "round"]
    assert "".join(rounds) == "bccbbccb"  # ABBA: drift hits both sides alike
    assert log.index(("profiled", "baseline")) > max(i for i, e in enumerate(log) if e[0] == "round")


def test_a_candidate_that_cannot_load_fails_every_criterion_and_still_gets_its_review(tmp_path, monkeypatch):
    """The kernels plugin on the gpt-oss-120b shape dies with CUDA out of memory at load where stock serves: that is
    the feature's FAIL, said in each criterion with the cause, and a review is written, not a traceback. The
    baseline dying instead leaves nothing to judge: ERROR."""
    from types import SimpleNamespace

    from harness.engine.server import ServerDied
    from harness.features import run as feature_run
    from harness.features.review import render

    feature = load_features(platform="sm_90")["kernels-moe"]
    suite = SimpleNamespace(run_dir=tmp_path, platform=SimpleNamespace(name="sm_90", device="H100", is_cuda=False),
                            flavour=SimpleNamespace(name="upstream"), model=SimpleNamespace(alias="gpt-oss-120b-shape"),
                            can_boot_secondary=lambda: (False, "one GPU model at a time"))
    log = []
    monkeypatch.setattr(feature_run, "Measurer", lambda *a: _Measurer(log))
    cause = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.98 GiB"

    def boot(dies):
        def one(config, tag, env=None, beside=False):
            if config == dies:
                raise ServerDied(f"vLLM server exited with code 1 during boot ({cause}); log x.log:\nline\nline")
            return _Running(tag, log)
        return one

    for dies, status in ((feature.candidate, Status.FAIL), (feature.baseline, Status.ERROR)):
        r = feature_run.run_feature(suite, feature, 2, False, {}, boot(dies), [], 60.0,
                                    run_levels_fn=lambda *a: {})
        assert r.status is status and r.criteria, r
        assert all(v.status is status and dies in v.why and "CUDA out of memory" in v.why for v in r.criteria), r.criteria
        if dies == feature.candidate:  # what stock measured before the candidate's boot stays in the review
            assert {v.metric: v.baseline for v in r.criteria}["used_memory"] == 63.42
        assert not any(e[0] == "boot" and e[1] != "__featureA1" for e in log if dies == feature.candidate)
        text = render(r, None, tmp_path / "FEATURE_kernels-moe.md")
        assert "did not boot" in text and status.value in text
        log.clear()


def test_both_servers_up_with_breakdowns_gives_a_verdict_and_a_plot(tmp_path, monkeypatch):
    """ABBA with the decode-time breakdown of both sides (a GPU with a small model): the breakdowns gain the
    unprofiled step's busy fraction and are plotted side by side (this path once raised TypeError on an H100)."""
    from types import SimpleNamespace

    from harness.features import run as feature_run
    from harness.config.catalog import Catalog
    from harness.features.spec import ad_hoc
    from harness.features.review import render
    from harness.kernelpath.breakdown import Breakdown, HostRange, TopKernel

    class Measuring(_Measurer):
        def measure_round(self, side, running, profiled=False):
            side.add("tg32", [400.0 if side.role == "candidate" else 300.0])

    suite = SimpleNamespace(run_dir=tmp_path, platform=SimpleNamespace(name="sm_90", device="H100", is_cuda=False),
                            flavour=SimpleNamespace(name="upstream"), model=SimpleNamespace(alias="tiny"),
                            can_boot_secondary=lambda: (True, ""))
    feature = ad_hoc("triton-bf16-ngram", "triton-bf16", "tg32 >= +10%", Catalog(), "upstream")
    monkeypatch.setattr(feature_run, "Measurer", lambda *a: Measuring([]))
    b = Breakdown("t.json", 64, {"moe": 1000.0, "dense": 1000.0, "attention": 300.0, "other": 200.0}, 2500.0, 3000.0,
                  2500.0, 0.83, 900.0, None, None, [TopKernel("k", 64, 1000.0, "moe")], 412.0,
                  [HostRange("gpu_model_runner: sample", "user_annotation", 1.0, 321.0)]).to_json()
    r = feature_run.run_feature(suite, feature, 4, False, {}, lambda c, t, e=None, beside=False: _Running(t, []),
                                [], 60.0, profile=lambda running: dict(b), run_levels_fn=lambda *a: {})
    assert {round(x["busy_fraction_unprofiled"], 2) for x in r.breakdown.values()} == {0.75, 1.0}
    # the baseline's GPU waited for the host a quarter of its step: +33% is within the host's spread, not a verdict
    assert r.criteria[0].status is Status.INCONCLUSIVE, r.criteria
    assert "host-bound decode's spread of 50% (baseline triton-bf16: GPU busy 75% of its decode step" in r.criteria[0].why
    assert (tmp_path / "features" / feature.name / "breakdown.png").is_file()
    # the review says how long the GPU waited for the host and where the host's step time went
    text = render(r, None, tmp_path / "FEATURE_x.md")
    assert "waiting for the host us/token" in text and "| 412.0 |" in text, text
    assert "- gpu_model_runner: sample (user_annotation): 321.0 us/token, 1.00 calls/token" in text, text


def test_the_baseline_boots_drift_widens_the_ci_before_it_is_held_to_the_target():
    """A, B, A: the candidate ran between the baseline's two boots, so a machine that drifted between them
    (an H100: stock tg32 283.8 then 247.2 tok/s) cannot back a PASS that the drift could explain; a verdict beyond
    the drift stands. Without drift (ABBA, or boots that agree) nothing changes."""
    from harness.features.measure import Side

    c = parse_criterion("tg32 >= +10%")
    base, faster, slower = around(100.0, cv=0.001), around(112.0, cv=0.001, seed=1), around(80.0, cv=0.001, seed=2)
    assert judge_samples(c, base, faster).status is Status.PASS
    assert judge_samples(c, base, faster, drift=0.0).status is Status.PASS
    widened = judge_samples(c, base, faster, drift=0.15)
    assert widened.status is Status.INCONCLUSIVE and "drift of 15.0%" in widened.why, widened.why
    assert judge_samples(c, base, slower, drift=0.15).status is Status.FAIL  # beyond any drift: still a FAIL

    side = Side("baseline", "triton-bf16", {"tg32": [292.6, 274.9, 242.9, 251.4]},
                boot_ends=[{"tg32": 2}, {"tg32": 4}])  # this session's stock rounds, A1 then A2
    assert round(side.drift("tg32"), 3) == 0.129
    assert Side("baseline", "x", {"tg32": [1.0, 2.0]}, boot_ends=[{"tg32": 2}]).drift("tg32") is None  # one boot


def test_a_boot_offset_the_platform_has_shown_is_not_a_regression_but_one_beyond_it_is():
    """Two boots of one config up at once on the 2-core CPU CI, 8 ABBA rounds each: tg32 67.57 -> 56.74 tok/s, 95% CI
    of the ratio [0.765, 0.947], nothing changed. Within one run's rounds that is a FAIL of 'tg32 >= -3%'; the CPU's
    recorded boot spread (50%, baselines/thresholds.yaml) widens it to INCONCLUSIVE. A candidate 4.5x slower per
    step (what the A/A check injects on CPU) still FAILs through the same widening, and the GPUs' decode (no spread
    recorded) is judged exactly as before."""
    from harness.features.run import judge_all
    from harness.features.measure import Side
    from harness.perf.regression import THRESHOLDS_FILE, load_thresholds

    cpu, sm_90 = load_thresholds(THRESHOLDS_FILE, "cpu"), load_thresholds(THRESHOLDS_FILE, "sm_90")
    assert cpu.spread_of("tg32") == 0.5 and sm_90.spread_of("tg32") == 0.0 and sm_90.spread_of("pp2048_gpu") == 0.0
    c = parse_criterion("tg32 >= -3%")
    base = around(67.57, n=8, cv=0.05, seed=3)
    offset = around(56.74, n=8, cv=0.05, seed=4)
    raw = judge_samples(c, base, offset)
    assert raw.status is Status.FAIL and raw.ci[1] < 0.95, raw.why  # what CI saw
    widened = judge_samples(c, base, offset, boot_spread=cpu.spread_of("tg32"))
    assert widened.status is Status.INCONCLUSIVE and "boot spread of 50%" in widened.why, widened.why
    slowed = around(67.57 / 4.5, n=8, cv=0.05, seed=5)
    assert judge_samples(c, base, slowed, boot_spread=cpu.spread_of("tg32")).status is Status.FAIL
    # the larger of drift and spread, never both stacked; drift alone is named as drift
    assert "drift of 60.0%" in judge_samples(c, base, offset, drift=0.6, boot_spread=0.5).why
    # judge_all hands the spread to relative timing criteria only (memory stays strict)
    sides = Side("baseline", "a", {"tg32": base}, {"used_memory": [5.0]}), Side("candidate", "b", {"tg32": offset}, {"used_memory": [6.5]})
    tg, mem = judge_all((c, parse_criterion("used_memory <= +1 GB")), *sides, cpu.spread_of)
    assert tg.status is Status.INCONCLUSIVE and mem.status is Status.FAIL
    assert judge_all((c,), *sides, sm_90.spread_of)[0].status is Status.FAIL


def test_a_kernel_time_criterion_at_depth_is_measured_in_the_profiled_rounds_over_its_context():
    from harness.features.measure import profiled_metric, workloads_for
    from harness.features.spec import parse_criterion

    assert [profiled_metric(m) for m in ("tg32_gpu@d8192", "pp2048_gpu", "tg32", "tg32@c4", "spec")] == \
        [True, True, False, False, False]
    plan = dict(workloads_for([parse_criterion("tg32_gpu@d8192 >= -3%")], "sm_90"))
    w = plan["tg32_gpu@d8192"]
    assert (w.kind, w.tg, w.depth) == ("decode", 32, 8192)


def test_the_unprofiled_busy_fraction_counts_overlapping_kernels_once():
    """Kernels started early by programmatic dependent launch overlap the one before; summing their durations counts
    the wait twice and reads a GPU that waits for its host as busy. The plugin's first H200 boot: 3,210 us summed,
    2,600 busy per token, a 3,531 us step: 74% busy, not 91%."""
    from types import SimpleNamespace

    from harness.features.run import _busy_unprofiled

    side = SimpleNamespace(samples={"tg32": [1e6 / 3531.0], "tg32@c4": [1.0]})
    b = {"total_us_per_token": 3210.0, "busy_us_per_token": 2600.0}
    _busy_unprofiled(b, side)
    assert b["busy_fraction_unprofiled"] == round(2600.0 / 3531.0, 4) and b["step_metric"] == "tg32"
    older = {"total_us_per_token": 3210.0}  # recorded before the union was kept: the sum is all there is
    _busy_unprofiled(older, side)
    assert older["busy_fraction_unprofiled"] == round(3210.0 / 3531.0, 4)


def test_an_empty_by_platform_baseline_of_a_feature_is_refused_not_replaced_by_the_default(tmp_path):
    text = (REPO / "configs" / "features.yaml").read_text()
    old = "    candidate: gemv-bf16\n"
    assert text.count(old) == 1
    bad = tmp_path / "features.yaml"
    bad.write_text(text.replace(old, old + "    baseline: {}\n"))
    with pytest.raises(SuiteError, match="kernels-moe.baseline: an empty by-platform baseline") as e:
        load_features(bad, platform="sm_90")
    assert "\n" not in str(e.value)


def test_a_feature_criterion_left_inconclusive_on_a_host_whose_cpu_changed_speed_says_so_and_only_then():
    """Level 5's host sentence on the feature verdicts: each side's host CPU loop is timed after its unprofiled rounds
    (harness/features/measure.py). An engine-clock criterion the CI cannot decide names the side whose loop varied
    beyond CV 15% (the H200 boot of 2026-12-03: 24.8%). A steady loop, a decided criterion, or a kernel-time one stay
    as they were. The loop survives the verdict file."""
    from harness.features.measure import Side
    from harness.features.run import judge_all

    noisy_b, noisy_c = around(300.0, n=8, cv=0.10, seed=1), around(305.0, n=8, cv=0.10, seed=2)
    jumpy = [1250.0, 2250.0, 1200.0, 2300.0, 1300.0, 2100.0]  # CV ~30%, the H200 host's flips between rounds
    steady = [1000.0, 1020.0, 990.0, 1010.0, 1005.0, 995.0]
    criteria = tuple(parse_criterion(c) for c in ("tg32 >= +10%", "tg32_gpu >= +10%", "used_memory <= +1 GB"))

    def sides(loop_b: list[float], loop_c: list[float], clock: str = "engine") -> tuple[Side, Side]:
        b = Side("baseline", "triton-bf16", {"tg32": noisy_b, "tg32_gpu": noisy_b}, {"used_memory": [60.0]},
                 clocks={"tg32": clock, "tg32_gpu": "kernel"}, host_loop_us=loop_b, host_cpus=[3])
        c = Side("candidate", "gemv-bf16", {"tg32": noisy_c, "tg32_gpu": noisy_c}, {"used_memory": [60.5]},
                 clocks={"tg32": clock, "tg32_gpu": "kernel"}, host_loop_us=loop_c, host_cpus=[5])
        return b, c

    tg, gpu, mem = judge_all(criteria, *sides(steady, jumpy))
    assert tg.status is Status.INCONCLUSIVE and gpu.status is Status.INCONCLUSIVE and mem.status is Status.PASS
    assert "Host CPU: the host's CPU changed speed or load during the candidate (gemv-bf16)'s boot" in tg.why, tg.why
    assert "Host CPU" not in gpu.why and "Host CPU" not in mem.why
    both = judge_all(criteria[:1], *sides(jumpy, jumpy, clock="client"))[0]
    assert "during both sides' boots" in both.why
    for quiet in (sides(steady, steady), sides([], [])):
        assert "Host CPU" not in judge_all(criteria[:1], *quiet)[0].why
    decided = judge_all((parse_criterion("tg32 >= -50%"),), *sides(jumpy, jumpy))[0]
    assert decided.status is Status.PASS and "Host CPU" not in decided.why


def test_review_findings_of_the_feature_verdicts_each_fail_the_way_they_should(tmp_path):
    """An adversarial review (2026-12-03) of the porting protocol found, and each now holds:
    a feature without a gate opened the next phase with every criterion failed; an absolute timing bound passed on one
    boot that the platform's A/A spread could move past it; a second entry of one feature name silently replaced the
    first; a bound on the wrong side of its metric (`ttft_p50 >= -3%`) passed a 50% slower TTFT; a latency at
    concurrency N loaded but could never be measured."""
    import dataclasses

    from harness.features.measure import Side
    from harness.features.run import gate_verdicts, judge_all
    from harness.perf.regression import THRESHOLDS_FILE, load_thresholds

    f = dataclasses.replace(load_features()["cpu-compiled-decode"], gate=(), gate_levels=())
    assert gate_verdicts(f, [], {}, Status.FAIL)[1] is Status.FAIL
    assert gate_verdicts(f, [], {}, Status.PASS)[1] is Status.PASS

    sm90 = load_thresholds(THRESHOLDS_FILE, "sm_90")
    bound = parse_criterion("ttft_p50_ms <= 500")
    base = Side("baseline", "a", {"ttft_ms": around(470.0, n=8)}, clocks={"ttft_ms": "client"})

    def ttft(median: float, spread_of=sm90.spread_of):
        cand = Side("candidate", "b", {"ttft_ms": around(median, n=8, seed=3)}, clocks={"ttft_ms": "client"})
        return judge_all((bound,), base, cand, spread_of)[0]

    near = ttft(470.0)
    assert near.status is Status.INCONCLUSIVE and "boot spread of 65%" in near.why, near.why
    assert ttft(470.0, lambda metric: 0.0).status is Status.PASS  # a platform that records no spread for it
    assert ttft(250.0).status is Status.PASS and ttft(900.0).status is Status.FAIL

    text = (REPO / "configs" / "features.yaml").read_text()
    first = text.index("\n  cutlass-gemm:")
    doubled = tmp_path / "features.yaml"
    doubled.write_text(text + text[first:text.index("\n  ", first + 5) + 1])  # the entry again, at the end
    with pytest.raises(SuiteError, match="key 'cutlass-gemm' appears twice") as e:
        load_features(doubled)
    assert "\n" not in str(e.value)

    for wrong, fix in (("ttft_p50 >= -3%", "ttft_ms <= ..."), ("tg32 <= +10%", "tg32 >= ..."),
                       ("boot_s >= 60", "boot_s <= ..."), ("used_memory >= +1 GB", "used_memory <= ...")):
        with pytest.raises(SuiteError, match="better (lower|higher)") as e:
            parse_criterion(wrong)
        assert fix in str(e.value), str(e.value)
    for right in ("ttft_p50 <= +3%", "tg32 >= +10%", "kv_capacity >= -5%", "spec_acceptance_rate >= 0.5"):
        parse_criterion(right)
    with pytest.raises(SuiteError, match="drop the @c suffix"):
        parse_criterion("ttft_p50@c4 <= 500")
    assert parse_criterion("tpot_ms@d8192 <= 30").unit == "ms"


def test_a_gate_level_that_did_not_run_closes_the_gate():
    """A level the gate requires that never ran (not in the junit, or every test skipped) is no evidence that it
    passes: the gate must not open on it, whatever the criteria say."""
    import dataclasses

    from harness.features.levels import LevelOutcome
    from harness.features.run import gate_verdicts

    f = dataclasses.replace(load_features()["cpu-compiled-decode"], gate=(), gate_levels=("level2",))
    for levels in ({}, {"level2": LevelOutcome(skipped=3)}):
        gate, status = gate_verdicts(f, [], levels, Status.PASS)
        assert [g.status for g in gate] == [Status.ERROR] and status is Status.ERROR, gate
    assert gate_verdicts(f, [], {"level2": LevelOutcome(passed=3)}, Status.PASS)[1] is Status.PASS
    assert gate_verdicts(f, [], {"level2": LevelOutcome(passed=3, failed=1)}, Status.PASS)[1] is Status.FAIL


# -- the second review of the feature verdicts (2026-12-03): each rule fails on its fault, and holds on an A/A --

def _sides(base: list[float], cand: list[float], metric: str = "tg32", clocks=("engine", "engine")):
    from harness.features.measure import Side

    b, c = Side("baseline", "triton-bf16"), Side("candidate", "gemv-bf16")
    b.add(metric, base)
    c.add(metric, cand)
    b.clocks[metric], c.clocks[metric] = clocks
    return b, c


def test_a_host_bound_decode_measured_on_one_boot_is_widened_by_the_hosts_spread():
    """A, B, A measures the candidate on one boot. Where a side's GPU waited for vLLM's host (the plugin on a Hopper
    host: tg32 moved 15% between boots, nothing changed), one boot's +15% is within the host's spread: inconclusive,
    as level 5 judges it. Kernel time (tg32_gpu) and decode at depth keep their strict rule; a kernel-bound pair
    (A/A of the rule) is judged as before."""
    from harness.features.measure import Side
    from harness.features.run import host_bound_sides, judge_all

    busy = {"triton-bf16": {"busy_fraction_unprofiled": 0.97}, "gemv-bf16": {"busy_fraction_unprofiled": 0.80}}
    sides = (Side("baseline", "triton-bf16"), Side("candidate", "gemv-bf16"))
    why = host_bound_sides(busy, sides, 1.05)
    assert why == "candidate gemv-bf16: GPU busy 80% of its decode step", why
    assert host_bound_sides({**busy, "gemv-bf16": {"busy_fraction_unprofiled": 0.96}}, sides, 1.05) is None
    assert host_bound_sides({}, sides, 1.05) is None  # no breakdown (CPU): nothing to say
    crits = tuple(parse_criterion(t) for t in ("tg32 >= +10%", "tg32_gpu >= +10%", "tg32@d8192 >= +10%"))
    base, cand = around(300.0, seed=1), around(345.0, seed=2)  # +15% on one boot
    for metric in ("tg32", "tg32_gpu", "tg32@d8192"):
        sides[0].add(metric, base)
        sides[1].add(metric, cand)
    plain = judge_all(crits, *sides, host_bound=None, host_bound_spread=0.5)
    assert [v.status for v in plain] == [Status.PASS] * 3, plain
    widened = judge_all(crits, *sides, host_bound=why, host_bound_spread=0.5)
    assert [v.status for v in widened] == [Status.INCONCLUSIVE, Status.PASS, Status.PASS], widened
    assert "host-bound decode's spread of 50% (candidate gemv-bf16: GPU busy 80%" in widened[0].why


def test_rounds_on_two_clocks_are_not_compared():
    """Each round picks its clock from its own first /metrics scrape. Baseline on the client clock (~30% below the
    engine's) against a candidate on the engine clock read as +43% and passed 'tg32 >= +10%' with nothing changed;
    one side's rounds pooled across clocks were judged as one set."""
    from harness.features.measure import Measurer, Side
    from harness.features.run import judge_all

    crit = (parse_criterion("tg32 >= +10%"),)
    assert judge_all(crit, *_sides(around(140.0), around(200.0), clocks=("engine", "engine")))[0].status is Status.PASS
    mixed = judge_all(crit, *_sides(around(140.0), around(200.0), clocks=("client", "engine")))[0]
    assert mixed.status is Status.INCONCLUSIVE and "baseline on the client clock, candidate on the engine clock" in mixed.why
    side = Side("baseline", "triton-bf16")
    for clock, value in (("engine", 200.0), ("engine", 201.0), ("client", 140.0)):
        Measurer._take(side, "tg32", {"samples": [value], "clock": clock})
    assert "two clocks (engine and client" in side.unresolved["tg32"], side.unresolved
    same = Side("candidate", "gemv-bf16")
    for value in (200.0, 201.0):
        Measurer._take(same, "tg32", {"samples": [value], "clock": "engine"})
    assert not same.unresolved and same.clocks == {"tg32": "engine"}


@pytest.mark.parametrize("base, cand, why", [
    ([300.0, float("nan"), 301.0], around(330.0), "a sample is nan"),
    (around(300.0), [330.0, float("inf"), 331.0], "a sample is inf"),
    ([0.0, 0.0, 0.0, 0.0], around(0.5), "baseline's median is 0"),
    ([0.0, 0.0, 1.0, 1.0, 1.0], around(1.0), "cannot be judged on these samples"),
], ids=["nan-baseline", "inf-candidate", "zero-baseline", "zero-resamples"])
def test_broken_samples_are_an_error_with_the_reason_not_a_traceback(base, cand, why):
    v = judge_samples(parse_criterion("tg32 >= -3%"), base, cand)
    assert v.status is Status.ERROR and why in v.why and "\n" not in v.why, v


def test_a_relative_memory_criterion_on_a_zero_baseline_is_an_error_and_a_zero_growth_passes():
    v = judge_number(parse_criterion("kv_capacity >= -5%"), 0.0, 0.0)
    assert v.status is Status.ERROR and "ratio to it means nothing" in v.why, v
    assert judge_number(parse_criterion("used_memory <= +1 GB"), 0.0, 0.0).status is Status.PASS
    assert judge_number(parse_criterion("used_memory <= +1 GB"), 60.0, float("nan")).status is Status.ERROR


def test_criteria_that_hold_nothing_or_would_be_ignored_are_one_line():
    from harness.config.catalog import Catalog
    from harness.features.measure import check_rounds
    from harness.features.spec import ad_hoc, selected_features

    cat = Catalog()
    with pytest.raises(SuiteError, match="holds no criterion"):
        ad_hoc("gemv-bf16", "triton-bf16", " ; ", cat, "upstream")
    with pytest.raises(SuiteError, match="use it with --config=CANDIDATE --against=BASELINE"):
        selected_features(cat, "sm_90", "upstream", "kernels-moe", None, None, "tg32 >= +50%")
    with pytest.raises(SuiteError, match="at least 5 rounds per side"):
        check_rounds(4)
    assert check_rounds(5) == 5


def _aa_misses(rounds: int, noise: str, trials: int = 1000) -> float:
    """How often judge_samples' 95% CI of the ratio misses a true ratio of 1 over simulated A/As: both sides drawn from
    one distribution (2% log-normal, or t(3) tails), seeded so the rate is the same on every run."""
    from harness.features.judge import judge_samples
    from harness.features.spec import parse_criterion

    c = parse_criterion("tg32 >= +0%")
    rng = np.random.default_rng(1)
    draw = (lambda: np.exp(rng.normal(0, 0.02, rounds))) if noise == "normal" else \
        (lambda: np.exp(0.02 * rng.standard_t(3, rounds)))
    misses = 0
    for t in range(trials):
        v = judge_samples(c, draw().tolist(), draw().tolist(), seed=t)
        misses += not (v.ci[0] <= 1.0 <= v.ci[1])
    return misses / trials


@pytest.mark.parametrize("noise", ["normal", "t3"])
def test_the_fewest_feature_rounds_give_a_ci_that_covers_an_unchanged_ratio_as_often_as_it_says(noise):
    """At MIN_ROUNDS per side the 95% CI misses an A/A's true ratio at most 5% of the time (1,000 simulated A/As); at one
    round fewer, what the floor refuses, it misses more (the test of the floor: at 4, 7.1% / 7.6%)."""
    from harness.features.measure import MIN_ROUNDS

    assert _aa_misses(MIN_ROUNDS, noise) <= 0.05
    assert _aa_misses(MIN_ROUNDS - 1, noise) > 0.06


def test_feature_rounds_are_set_aside_below_the_thresholds_clock_floor(tmp_path, monkeypatch):
    """A feature's clock floor is level 5's (baselines/thresholds.yaml loaded_clock_floor), not ClockSampler's own
    default: it used to ignore the file, so a floor changed for a platform moved the gate and not the features."""
    from types import SimpleNamespace

    from harness.features import run as feature_run

    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text("defaults:\n  loaded_clock_floor: 0.9\nplatforms:\n  sm_90:\n    loaded_clock_floor: 0.8\n")
    monkeypatch.setattr(feature_run, "THRESHOLDS_FILE", thresholds)
    floors = {}

    def measurer(*args):  # the sampler run_feature built is what this test reads; nothing is measured
        floors["sampler"] = args[-1]
        raise KeyboardInterrupt

    monkeypatch.setattr(feature_run, "Measurer", measurer)

    def sampler_of(name: str, cuda: bool):
        suite = SimpleNamespace(platform=SimpleNamespace(name=name, is_cuda=cuda, device="d"), run_dir=tmp_path,
                                flavour=SimpleNamespace(name="upstream"), model=SimpleNamespace(alias="m"))
        feature = SimpleNamespace(name="f", baseline="a", candidate="b", requires=(), criteria=(), gate=(), levels=())
        floors.clear()
        with pytest.raises(KeyboardInterrupt):
            feature_run.run_feature(suite, feature, 1, False, {}, None, [], 1.0, run_levels_fn=lambda *args: {})
        return floors["sampler"]

    assert sampler_of("sm_90", True).floor == 0.8
    assert sampler_of("sm_121", True).floor == 0.9
    assert sampler_of("cpu", False) is None


def test_a_candidate_booted_more_than_once_is_judged_by_its_worst_boot():
    """Memory criteria took the candidate's largest number: its worst boot for used memory, but its best for KV
    capacity, so one good boot hid a bad one."""
    from harness.features.measure import Side
    from harness.features.run import judge_all

    base = Side("baseline", "a", numbers={"kv_capacity": [100_000, 100_000], "used_memory": [60.0, 60.0]})
    cand = Side("candidate", "b", numbers={"kv_capacity": [90_000, 100_000], "used_memory": [62.0, 60.0]})
    kv, used = judge_all((parse_criterion("kv_capacity >= -5%"), parse_criterion("used_memory <= +1 GB")), base, cand)
    assert (kv.status, kv.candidate) == (Status.FAIL, 90_000), kv.why
    assert (used.status, used.candidate) == (Status.FAIL, 62.0), used.why



def test_a_concurrency_criterion_above_the_servers_sequences_says_its_requests_queued(tmp_path, monkeypatch):
    """The users' flags admit 2 sequences (--max-num-seqs 2): `tg32@c4` then compares two servers each decoding 2 of
    4 clients at a time. The verdict keeps its status and says so; at or below the limit, or with no limit known, it
    says nothing. The limit is read from the boot's argv as vLLM reads it (the last flag wins)."""
    from types import SimpleNamespace

    import harness.features.measure as measure_mod
    from harness.features.measure import Measurer, Side
    from harness.features.run import judge_all

    c4, c2 = parse_criterion("tg32@c4 >= -3%"), parse_criterion("tg32@c2 >= -3%")
    samples = {"tg32@c4": around(100.0), "tg32@c2": around(100.0)}
    base = Side("baseline", "triton-bf16", samples=samples, max_num_seqs=2)
    cand = Side("candidate", "gemv-bf16", samples=samples, max_num_seqs=2)
    v4, v2 = judge_all((c4, c2), base, cand)
    assert v4.status is Status.PASS and "4 requests ran at most 2 at a time" in v4.why, v4.why
    assert "at a time" not in v2.why, "2 requests on a 2-sequence server ran as one batch"
    unknown = judge_all((c4,), Side("baseline", "a", samples=samples), Side("candidate", "b", samples=samples))
    assert "at a time" not in unknown[0].why, "no limit known: nothing claimed"
    monkeypatch.setattr(measure_mod, "server_memory", lambda running, on_gpu: {})
    measurer = Measurer.__new__(Measurer)  # record_boot reads only on_gpu
    measurer.on_gpu = False
    side = Side("candidate", "gemv-bf16")
    argv = ["--max-num-seqs", "2", "--max-num-seqs=32"]
    measurer.record_boot(side, SimpleNamespace(process=SimpleNamespace(argv_extra=argv), log_path=tmp_path / "log",
                                               boot_seconds=1.0))
    assert side.max_num_seqs == 32
