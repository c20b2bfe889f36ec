"""Loopholes found by an adversarial review of the verdict logic, each a synthetic input that the suite judged
green (or crashed on) before its fix. No server: the harness functions are called directly."""
import json
from pathlib import Path

import numpy as np
import pytest

from harness.core.errors import SuiteError
from harness.correctness.level2 import Level2Result, check_golden_data
from harness.correctness.logprobs import Scored, Stream
from harness.perf import regression
from harness.perf.regression import Thresholds

STRICT = Thresholds(inconclusive_is_failure=True)  # the nightly GB10's gate (sm_121)
REPO = Path(__file__).resolve().parents[2]


def samples(median, n=10, seed=0, cv=0.003):
    return list(median * (1 + cv * np.random.default_rng(seed).standard_normal(n)))


def run(used=62.0, kv=1_000_000, metrics=None, **extra):
    return {"config": "cutlass", "platform": "sm_121", "device": "NVIDIA GB10", "valid": True,
            "metrics": metrics or {"tg32": {"samples": samples(31.6), "unit": "tok/s", "higher_is_better": True}},
            "memory_peak_gb": 80.0, "memory_used_gib": used, "kv_capacity_tokens": kv, **extra}


# -- level 5 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lost", ["memory_used_gib", "kv_capacity_tokens"])
def test_a_gated_memory_number_the_results_lack_is_an_error_not_a_silent_pass(lost):
    """The baseline gates used memory / KV capacity, the run's server log had no vLLM line to read them from (a new
    log format): the memory gate used to vanish without a word and level 5 passed on timing alone."""
    current = run(**{lost: None})
    with pytest.raises(SuiteError, match=f"lack {lost}.*--force-regen") as e:
        regression.compare_run(run(), current, STRICT)
    assert "\n" not in str(e.value)


def test_memory_measured_on_neither_side_is_still_skipped():
    verdicts = regression.compare_run(run(used=None, kv=None), run(used=None, kv=None), STRICT)
    assert [v.name for v in verdicts] == ["tg32"]


def test_a_baseline_metric_the_run_did_not_measure_is_inconclusive_not_dropped():
    """pp2048_gpu (the strict prefill gate) in the baseline, not in the results (its workload dropped, another
    --workloads file): the strict nightly passed with no prefill verdict at all."""
    base = run(metrics={"tg32": {"samples": samples(31.6), "unit": "tok/s", "higher_is_better": True},
                        "pp2048_gpu": {"samples": samples(4000.0), "unit": "tok/s", "higher_is_better": True}})
    verdicts = {v.name: v for v in regression.compare_run(base, run(), STRICT)}
    missing = verdicts.get("pp2048_gpu")
    assert missing is not None and missing.status == "inconclusive", missing
    assert "not measured by this run" in missing.message and "\n" not in missing.message
    assert missing in regression.gate_failures(list(verdicts.values()), STRICT)


def test_a_baseline_without_the_weights_fingerprint_is_refused_for_an_embedded_model():
    """Goldens refuse a file that does not record the weights' fingerprint; a baseline without one was judged."""
    with pytest.raises(SuiteError, match="other weights.*not recorded.*--force-regen"):
        regression.compare_run(run(), run(model_fingerprint="163c8eae3f65"), STRICT)
    # a model without a fingerprint (shape-only, dummy weights) on both sides is judged as before
    assert regression.compare_run(run(model_fingerprint=None), run(), STRICT)


# -- level 2 -----------------------------------------------------------------------------------------
def test_null_prompt_logprobs_after_position_0_are_an_error_not_skipped_positions():
    """vLLM gives no distribution only at position 0; a null elsewhere made compare_scored skip that position, so
    a scoring of nulls judged nothing and passed."""
    ids = [5, 6, 7]
    with pytest.raises(SuiteError, match="position 2"):
        Scored.from_prompt_logprobs(ids, [None, {"6": {"logprob": -0.5, "rank": 1}}, None], k=1)


def _golden():
    stream = Stream([10, 11, 12], [-0.2] * 3, [{10: -0.2}, {11: -0.2}, {12: -0.2}], "abc", [1, 2])
    ids = [1, 2, 10, 11, 12]
    sc = Scored(ids, [None] + [-0.2] * 4, [{}] + [{t: -0.2, 50: -2.0} for t in ids[1:]])
    return json.loads(json.dumps(Level2Result({"p": stream}, {"p": sc, "perplexity_text": sc}, "self").to_golden()))


@pytest.mark.parametrize("truncate", [
    lambda g: g["scored"]["p"].update(ids=[1], actual=[None], top=[[]]),  # teacher forcing of 'p' judges nothing
    lambda g: g["scored"]["p"].update(ids=g["scored"]["p"]["ids"][:3], actual=g["scored"]["p"]["actual"][:3],
                                      top=g["scored"]["p"]["top"][:3]),  # the continuation is not scored
    lambda g: g["scored"]["perplexity_text"].update(ids=[1, 2], actual=[None, -0.2], top=[[], [[2, -0.2]]]),
])
def test_a_golden_scoring_that_does_not_cover_what_the_golden_recorded_is_malformed(truncate):
    gold = _golden()
    check_golden_data(gold, "golden g.json", prompts={"p": "text"})  # the intact one is fine
    truncate(gold)
    with pytest.raises(SuiteError, match=r"g.json is malformed.*--force-regen") as e:
        check_golden_data(gold, "golden g.json", prompts={"p": "text"})
    assert "\n" not in str(e.value)


# -- kernel-path verification markers ----------------------------------------------------------------------
def test_verified_no_in_a_recorded_verification_does_not_count_as_verified(tmp_path):
    """`verified: no` (the flavours' own way to say unverified; YAML reads it as false) in configs/verified/ became
    the status 'verified: False', which the nightly's preflight accepts as verified."""
    from harness.config.catalog import Catalog

    src = Catalog().flavours["upstream"].verified_file.read_text()
    assert "verified: NVIDIA H200" in src
    (tmp_path / "upstream.yaml").write_text(src.replace("verified: NVIDIA H200 (sm_90), vLLM 0.26.0, 2026-11-23",
                                                        "verified: no", 1))
    with pytest.raises(SuiteError, match=r"sm_90: verified is False; .*record_kernels.py --accept") as e:
        Catalog(verified_dir=tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("excuse", [".*", "(?i)falling back|", "INFO"])
def test_a_fallback_excuse_matching_ordinary_log_lines_is_refused(excuse):
    """An excuse is the server log's proof that a documented fallback happened; `.*` (or an alternation with an
    empty branch) matched any log, so a missing `must` kernel was excused in every run and level 4 counted."""
    from harness.config.catalog import _check_value_spec

    spec = {"kernels": {"sm_121": {"verified": "no", "must": ["*gemv_mxfp4_moe_dp4a*"],
                                   "excuses": {"*gemv_mxfp4_moe_dp4a*": excuse}}}}
    with pytest.raises(SuiteError, match="matches an ordinary log line") as e:
        _check_value_spec(spec, "fork.yaml: values.moe.gemv")
    assert "\n" not in str(e.value)
    # the fork's documented excuse still loads
    spec["kernels"]["sm_121"]["excuses"]["*gemv_mxfp4_moe_dp4a*"] = "(?i)gemv.*fall(ing)? ?back"
    _check_value_spec(spec, "fork.yaml: values.moe.gemv")


@pytest.mark.parametrize("n_current", [1])
def test_one_sample_is_inconclusive_not_a_pass(n_current):
    """One current sample (a workloads file with runs: 1) has a bootstrap CI of zero width and can never be
    significant: 2.5% slower passed, and no slowdown could ever fail."""
    base = {"samples": [100.0] * 5 + [100.5] * 5, "unit": "tok/s", "higher_is_better": True}
    cur = {"samples": [97.5] * n_current, "unit": "tok/s", "higher_is_better": True}
    (v,) = [v for v in regression.compare_run(run(metrics={"tg32": base}), run(metrics={"tg32": cur}), STRICT)
            if v.name == "tg32"]
    assert v.status == "inconclusive" and "one sample cannot resolve" in v.message, v.message
    assert v in regression.gate_failures([v], STRICT)
    two = {"samples": [97.5, 97.6], "unit": "tok/s", "higher_is_better": True}  # two samples are judged as before
    (v2,) = [v for v in regression.compare_run(run(metrics={"tg32": base}), run(metrics={"tg32": two}), STRICT)
             if v.name == "tg32"]
    assert "one sample" not in v2.message


@pytest.mark.parametrize("bad", [[float("nan"), 30.0], [31.0, float("inf")], [0.0, 31.0], "31.0", []])
def test_a_broken_results_sample_is_one_line_not_a_traceback(bad):
    """A NaN (or zero, or not a list) sample in the results reached the statistics and ended level 5 with a bare
    ValueError; the results file is broken and level 4 must be rerun."""
    cur = {"samples": bad, "unit": "tok/s", "higher_is_better": True}
    with pytest.raises(SuiteError, match="not positive finite numbers.*rerun level 4") as e:
        regression.compare_run(run(), run(metrics={"tg32": cur}), STRICT)
    assert "\n" not in str(e.value)


def test_a_change_far_beyond_the_platforms_a_a_spread_is_a_stale_baseline_not_an_improvement():
    """A CPU baseline recorded on a slower machine state read as tg32 +229.9% "improved" with nothing changed:
    beyond out_of_family, either way, the verdict is inconclusive "baseline out of family: re-record it"."""
    cpu = regression.load_thresholds(REPO / "baselines" / "thresholds.yaml", "cpu")
    assert cpu.out_of_family == 1.0
    base = run(metrics={"tg32": {"samples": [50.0, 51.0, 49.0, 50.5], "unit": "tok/s", "higher_is_better": True}},
               model_fingerprint=None)

    def tg(samples):
        current = run(metrics={"tg32": {"samples": samples, "unit": "tok/s", "higher_is_better": True}},
                      model_fingerprint=None)
        return {v.name: v for v in regression.compare_run(base, current, cpu)}["tg32"]

    stale = tg([149.0, 150.0, 148.0, 151.0])  # x3: the observed stale-baseline case
    assert stale.status == "inconclusive" and stale.reason is regression.Reason.OUT_OF_FAMILY
    assert "baseline out of family" in stale.message and "--force-regen" in stale.message
    assert tg([20.0, 21.0, 19.0, 20.5]).reason is regression.Reason.OUT_OF_FAMILY  # x0.4: either way
    assert tg([75.0, 76.0, 74.0, 75.5]).status == "improved"  # x1.5: within the A/A family, judged as before
    assert tg([50.0, 50.5, 49.5, 50.2]).reason is not regression.Reason.OUT_OF_FAMILY  # A/A
