"""Loopholes found by an adversarial review of the verdict logic, each a synthetic input that the suite judged
green (or crashed on) before its fix. No server: the harness functions are called directly."""
import json
import re
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
    (tmp_path / "upstream.yaml").write_text(re.sub(r"verified: NVIDIA H200 \(sm_90\)[^\n]*", "verified: no", src, count=1))
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
    assert v.status == "inconclusive" and "current sample(s) cannot resolve" in v.message, v.message
    assert v.reason is regression.Reason.TOO_FEW_SAMPLES and v in regression.gate_failures([v], STRICT)
    two = {"samples": [97.5, 97.6], "unit": "tok/s", "higher_is_better": True}  # 10 against 2 reach p 0.03: judged
    (v2,) = [v for v in regression.compare_run(run(metrics={"tg32": base}), run(metrics={"tg32": two}), STRICT)
             if v.name == "tg32"]
    assert v2.reason is not regression.Reason.TOO_FEW_SAMPLES, v2.message


def test_rounds_too_few_for_the_rank_test_to_ever_fail_are_inconclusive_not_a_pass():
    """Three rounds a side: the rank test's smallest p is 2 / C(6, 3) = 0.1, so a 50% drop of tg32_gpu came out
    "not significant", a green gate on sm_90. It is TOO_FEW_SAMPLES now, naming the rounds needed; four a side
    (smallest p 0.029) fail it as before."""
    sm90 = regression.load_thresholds(REPO / "baselines" / "thresholds.yaml", "sm_90")
    three = regression.compare_metric("tg32_gpu", [341.0, 341.3, 340.8], [170.5, 170.6, 170.4], True, sm90)
    assert three.reason is regression.Reason.TOO_FEW_SAMPLES and "smallest p with these counts is 0.1" in three.message
    assert "at least 4 rounds a side" in three.message
    four = regression.compare_metric("tg32_gpu", [341.0, 341.3, 340.8, 341.1], [170.5, 170.6, 170.4, 170.5], True,
                                     sm90)
    assert four.status == "fail" and four.reason is regression.Reason.REGRESSION, four.message


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


# -- found by an adversarial review of level 5 (2026-12-03) -----------------------------------------------------
SM90 = regression.load_thresholds(REPO / "baselines" / "thresholds.yaml", "sm_90")
UNSTEADY_AA = REPO / "docs" / "evidence" / "sm_90-2026-12-03-h200-mxfp4all-rebaseline"


def _recorded_pair() -> tuple[dict, dict]:
    return tuple(json.loads((UNSTEADY_AA / f"{n}-results.json").read_text()) for n in ("baseline", "aa1"))


def test_results_of_another_model_or_config_are_refused_not_judged_an_improvement():
    """Every shape model loads the same valid random weights (one fingerprint). The 20b shape's results 1.8x faster
    against the 120b shape's baseline read as 18 IMPROVED verdicts and a green gate; they are another workload."""
    base, a_a = _recorded_pair()
    other_model = {**a_a, "model": "gpt-oss-20b-shape",
                   "metrics": {n: {**m, "samples": [x * (1.8 if m["higher_is_better"] else 1 / 1.8)
                                                    for x in m["samples"]]} for n, m in a_a["metrics"].items()}}
    with pytest.raises(SuiteError, match="model gpt-oss-120b-shape but results are of gpt-oss-20b-shape") as e:
        regression.compare_run(base, other_model, SM90)
    assert "\n" not in str(e.value)
    with pytest.raises(SuiteError, match="config gemv-bf16-mxfp4-all but results are of triton-bf16"):
        regression.compare_run(base, {**a_a, "config": "triton-bf16"}, SM90)
    assert not regression.gate_failures(regression.compare_run(base, a_a, SM90), SM90)  # the A/A itself is judged


def test_used_memory_from_another_source_fails_the_strict_memory_gate_whatever_the_growth():
    """vLLM's log breakdown on one side and a process reading on the other (a new vLLM log format does that) made
    +10 GiB an inconclusive that passed sm_90's gate. Memory is strict on every platform: the unjudged gate fails."""
    base, a_a = _recorded_pair()
    grown = {**a_a, "memory_used_gib": base["memory_used_gib"] + 10,
             "memory": {**a_a["memory"], "used_source": "nvml per-process at boot - KV cache"}}
    (used,) = [v for v in regression.compare_run(base, grown, SM90) if v.name == "memory_used_gib"]
    assert used.reason is regression.Reason.SOURCE_MISMATCH and used in regression.gate_failures([used], SM90)
    same = [v for v in regression.compare_run(base, a_a, SM90) if v.kind in ("memory", "capacity")]
    assert [v.status for v in same] == ["pass", "pass"] and not regression.gate_failures(same, SM90)


@pytest.mark.parametrize("key, bad", [("kv_capacity_tokens", float("nan")), ("memory_used_gib", "90.0"),
                                      ("kv_capacity_tokens", "lots"), ("kv_capacity_tokens", True),
                                      ("memory_used_gib", float("inf")), ("metrics", {"tg32": [1.0, 2.0]}),
                                      ("metrics", {"tg32": None})])
def test_a_broken_memory_number_or_metric_entry_in_the_results_is_one_line_not_a_pass_or_a_traceback(key, bad):
    """NaN KV capacity passed the KV gate (NaN fails every comparison); a string or a list gave a bare traceback."""
    with pytest.raises(SuiteError, match="rerun level 4") as e:
        regression.compare_run(run(), run(**{key: bad}), STRICT)
    assert "\n" not in str(e.value)


def test_a_slowdown_beyond_the_cpu_family_still_warns_and_says_to_investigate_before_re_recording():
    """On CPU (timing advisory) a 2.2x or 3.3x slower tg32 was out of family: no warning at all, and the only advice
    was to re-record, which would bake the regression in. It stays unjudged (the baseline may be another machine
    state's) but reaches the warnings; an out-of-family speed-up does not."""
    cpu = regression.load_thresholds(REPO / "baselines" / "thresholds.yaml", "cpu")
    base = run(metrics={"tg32": {"samples": [50.0, 51.0, 49.0, 50.5, 50.2, 49.8], "unit": "tok/s",
                                 "higher_is_better": True}}, model_fingerprint=None)

    def tg(factor: float) -> regression.Verdict:
        cur = run(metrics={"tg32": {"samples": [x * factor for x in base["metrics"]["tg32"]["samples"]],
                                    "unit": "tok/s", "higher_is_better": True}}, model_fingerprint=None)
        return {v.name: v for v in regression.compare_run(base, cur, cpu)}["tg32"]

    for factor in (0.45, 0.3):
        slow = tg(factor)
        assert slow.reason is regression.Reason.OUT_OF_FAMILY and slow in regression.advisory_failures([slow], cpu)
        assert "investigate first" in slow.message and not regression.gate_failures([slow], cpu)
    fast = tg(3.0)
    assert fast.reason is regression.Reason.OUT_OF_FAMILY and not regression.advisory_failures([fast], cpu)
    assert tg(0.6) in regression.advisory_failures([tg(0.6)], cpu)  # within the family: an ordinary warning


@pytest.mark.parametrize("bad", [{"memory_growth_gb": float("inf")}, {"throughput_drop": float("inf")},
                                 {"bootstrap_n": 50_000_000}, {"out_of_family": float("inf")}])
def test_a_threshold_that_switches_a_gate_off_or_exhausts_memory_is_refused(bad):
    """`memory_growth_gb: .inf` passed 60 -> 500 GiB; `bootstrap_n: 50000000` would allocate ~6 GB per metric."""
    with pytest.raises(SuiteError, match="threshold") as e:
        Thresholds(**bad)
    assert "\n" not in str(e.value)


def test_a_verdict_that_moved_names_what_of_the_stack_changed_since_the_baseline_and_an_a_a_names_nothing():
    """The same recorded A/A, with its kernels 10% slower: tg32_gpu fails. When this run's vLLM, a server flag and a
    VLLM_ variable also changed since the baseline, the failure says so (a slowdown after an upgrade is not the kernel
    change's); with the stack as recorded it says nothing more, and the unchanged A/A's verdicts never do."""
    from harness.perf import metadata

    base, a_a = _recorded_pair()
    slower = {**a_a, "metrics": {**a_a["metrics"], "tg32_gpu": {
        **a_a["metrics"]["tg32_gpu"], "samples": [x * 0.9 for x in a_a["metrics"]["tg32_gpu"]["samples"]]}}}
    meta = a_a["metadata"]
    upgraded = {**slower, "metadata": {
        **meta, "packages": {**meta["packages"], "vllm": "0.27.0"},
        "vllm_flags": meta["vllm_flags"] + ["--async-scheduling"],
        "env_vars": {**meta["env_vars"], "VLLM_USE_FLASHINFER_MOE_MXFP4": "1", "SUITE_GIT_SHA": "another"}}}

    def tg32_gpu(run: dict) -> regression.Verdict:
        return {v.name: v for v in regression.compare_run(base, run, SM90)}["tg32_gpu"]

    moved = tg32_gpu(upgraded)
    assert moved.status == "fail", moved.message
    said = moved.message.split("Changed since the baseline besides the suite: ")[1]
    assert "vllm 0.26.0 -> 0.27.0" in said and "--async-scheduling (unset) -> on" in said
    assert "VLLM_USE_FLASHINFER_MOE_MXFP4=(unset) -> 1" in said and "SUITE_GIT_SHA" not in said  # the suite's own commit
    assert "Changed since the baseline" not in tg32_gpu(slower).message
    assert not any("Changed since" in v.message for v in regression.compare_run(base, a_a, SM90))
    for broken in (None, "text", {"packages": "x", "vllm_flags": "y", "env_vars": None, "gpu": 3}):
        assert metadata.stack_changes(broken, meta) == [] and metadata.stack_changes(meta, broken) == []


# -- found by an adversarial review of levels 1.5 and 2 (2026-12-03) ---------------------------------------------
def test_a_platform_without_declared_kernels_fails_the_kernel_path_check_instead_of_passing_any_trace():
    """upstream and fork allow >=sm_100 but declare kernels for sm_90 and sm_12x only: on sm_100 every config resolved
    to must=[] and an empty trace passed level 1.5, which let --force-regen record goldens and baselines."""
    from harness.kernelpath.traces import KernelExpectation, KernelStat, KernelSummary, check_path

    empty = KernelSummary("t", "kernel", [], [])
    verdict = check_path(empty, KernelExpectation())
    assert not verdict.ok and "no kernel is declared" in verdict.problems[0]
    ran = KernelSummary("t", "kernel", [KernelStat("marlin_moe_kernel", 3, 9.0, 1.0)], [])
    assert check_path(ran, KernelExpectation(must=["*marlin*"])).ok  # a declared kernel that ran: passes as before
    assert check_path(empty, KernelExpectation(), declared=False).ok  # decode steps may declare none


@pytest.mark.parametrize("events", ['{"traceEvents": null}', '{"traceEvents": "x"}', '{"traceEvents": ["x"]}', "{}",
                                    '{"traceEvents": [{"cat": "kernel", "name": "k", "dur": "n/a"}]}',
                                    '{"traceEvents": [{"cat": "kernel", "name": ["k"], "dur": 1}]}',
                                    '{"traceEvents": [{"cat": "kernel", "name": "k", "dur": NaN}]}', b"\xff\xfe"])
def test_a_malformed_trace_is_one_line_naming_the_rerun_not_a_traceback_or_no_kernels(tmp_path, events):
    import gzip

    from harness.kernelpath.traces import parse_trace

    path = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(events if isinstance(events, bytes) else events.encode())
    with pytest.raises(SuiteError, match="re-run the level 1.5 profile") as e:
        parse_trace(path, "kernel")
    assert "\n" not in str(e.value)


def test_nan_logprobs_from_the_server_fail_instead_of_passing_every_tolerance(tmp_path):
    """A decode path that produced NaN passed the near-tie rule (NaN compares False with every bound), and NaN among a
    prompt scoring's alternatives passed teacher forcing; a truncated chat golden passed its check, then crashed."""
    from harness.correctness.chat import check_chat_golden
    from harness.correctness.logprobs import Scored, Stream

    def completion(lp: float, alt: float) -> dict:
        return {"choices": [{"text": "ab", "logprobs": {"tokens": ["token_id:5", "token_id:6"],
                                                          "token_logprobs": [-0.1, lp],
                                                          "top_logprobs": [{"token_id:5": -0.1},
                                                                           {"token_id:6": lp, "token_id:7": alt}]}}]}

    assert Stream.from_completion(completion(-0.2, -1.5)).logprobs == [-0.1, -0.2]
    for lp, alt in ((float("nan"), -1.5), (-0.2, float("nan")), (float("-inf"), -1.5)):
        with pytest.raises(SuiteError, match="generated position 1: the model's output is not finite"):
            Stream.from_completion(completion(lp, alt))
    scoring = [None, {"6": {"logprob": -0.5, "rank": 1}, "7": {"logprob": float("nan"), "rank": 2}}]
    with pytest.raises(SuiteError, match="non-finite logprob nan for token 7 at position 1"):
        Scored.from_prompt_logprobs([5, 6], scoring, 2)
    truncated = {"q": {"stream": {"tokens": [9, 6, 7], "logprobs": [], "top": [], "text": "x"}, "content": "x",
                       "reasoning": None, "tool_calls": [], "finish_reason": "stop"}}
    with pytest.raises(SuiteError, match="malformed.*3 tokens, 0 logprobs"):
        check_chat_golden(truncated, "goldens/x/chat.json")


@pytest.mark.parametrize("spec, message", [
    ({"kernels": ["sm_12x"]}, "kernels: expected a mapping"),
    ({"kernels": "*x*"}, "kernels: expected a mapping"),
    ({"kernels": {"sm_12x": {"verified": True, "must": ["*x*"]}}}, "write `verified: no` here"),
    ({"kernels": {"sm_12x": {"verified": "no", "must": ["*x*"], "excuses": {"*x*": 42}}}}, "excuses: expected a mapping"),
    ({"no_kernels": ""}, "say in words why"),
    ({"no_kernels": True}, "say in words why"),
])
def test_malformed_kernel_data_is_one_line_naming_the_key(spec, message):
    """These once escaped as AttributeError / TypeError (an INTERNALERROR at startup), and `verified: yes` read as a
    trace that confirmed the patterns."""
    from harness.config.catalog import _check_value_spec

    with pytest.raises(SuiteError, match=message) as e:
        _check_value_spec(spec, "fork.yaml: values.moe.gemv")
    assert "\n" not in str(e.value)
