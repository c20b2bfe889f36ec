"""Kernel-path checks, trace parsing, logprob-aware stream rules and engine-clock metrics (no vLLM)."""
import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config.catalog import KernelExpectation
from harness.core.errors import SuiteError
from harness.engine import server as server_mod
from harness.correctness.goldens import golden_text, load_golden
from harness.correctness.logprobs import MIN_MEAN_POSITIONS, Stream, Tolerance, compare_streams
from harness.engine.server_metrics import EngineRound
from harness.kernelpath.traces import check_path, cpu_attention_sinks, parse_trace
from harness.perf import bench
from harness.perf import metrics as perf


def _trace(tmp_path, events):
    p = tmp_path / "w.pt.trace.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return p


def test_parse_trace_counts_kernels_and_shares(tmp_path):
    p = _trace(tmp_path, [
        {"cat": "kernel", "name": "marlin_moe_wna16::Marlin<1>", "dur": 30},
        {"cat": "kernel", "name": "marlin_moe_wna16::Marlin<1>", "dur": 30},
        {"cat": "kernel", "name": "void flash::FlashAttnFwdSm90<x>", "dur": 40},
        {"cat": "cpu_op", "name": "aten::mm", "dur": 999},
    ])
    s = parse_trace(p, "kernel")
    assert [k.name for k in s.kernels] == ["marlin_moe_wna16::Marlin<1>", "void flash::FlashAttnFwdSm90<x>"]
    assert s.kernels[0].calls == 2 and s.kernels[0].share == pytest.approx(0.6)


def test_check_path_flags_missing_and_forbidden_kernels(tmp_path):
    s = parse_trace(_trace(tmp_path, [{"cat": "kernel", "name": "marlin_moe_wna16::Marlin<1>", "dur": 1}]), "kernel")
    ok = check_path(s, KernelExpectation(must=["*marlin_moe_wna16*"], must_not=["_matmul_ogs_*"]))
    assert ok.ok
    bad = check_path(s, KernelExpectation(must=["_matmul_ogs_*mxfp4*"], must_not=["*marlin*"]))
    assert not bad.ok and len(bad.problems) == 2
    assert "no kernel matches required '_matmul_ogs_*mxfp4*'" in bad.problems[0]


def test_a_logged_fallback_excuses_only_its_own_pattern(tmp_path):
    s = parse_trace(_trace(tmp_path, [{"cat": "kernel", "name": "cutlass_gemm", "dur": 1}]), "kernel")
    exp = KernelExpectation(must=["*gemv_fp4*", "*BatchPrefillWithPagedKVCacheKernel*"],
                            excuses={"*gemv_fp4*": "(?i)gemv.*fall(ing)? ?back"})
    assert not check_path(s, exp, "").ok
    v = check_path(s, exp, "INFO x\nWARNING gemv path falling back to GEMM for M=2\nINFO y")
    # the GEMV pattern is excused (and says by which line); the attention pattern is still missing
    assert not v.ok and len(v.problems) == 1 and "BatchPrefill" in v.problems[0]
    assert v.excused == ["*gemv_fp4* (logged fallback: 'WARNING gemv path falling back to GEMM for M=2')"]
    exp.must.pop()
    assert check_path(s, exp, "WARNING gemv path falling back to GEMM for M=2").ok


def test_a_logged_fallback_in_decode_excuses_only_its_own_kernel_another_missing_one_still_fails():
    """The decode-window check with the GEMV's fallback logged: the GEMV kernel missing and the GEMM it falls back to
    running are excused, but a decode kernel with no excuse of its own (attention here) missing is still a failure,
    whatever else was excused."""
    from harness.kernelpath.traces import KernelStat, KernelSummary, check_decode

    exp = KernelExpectation(must=["*gemv_fp4*", "*FlashAttnFwd*"], excuses={"*gemv_fp4*": "(?i)gemv.*fall(ing)? ?back"},
                            prefill_only=["*cutlass_gemm*"])
    log = "WARNING gemv path falling back to GEMM for M=2"
    decode = lambda *names: KernelSummary("t", "kernel", [KernelStat(n, 16, 1.0, 0.5) for n in names])  # noqa: E731
    with_attention = check_decode(decode("cutlass_gemm_fp4", "void flash::FlashAttnFwdSm90<x>"), exp, log)
    assert with_attention.ok and len(with_attention.excused) == 2, with_attention
    without = check_decode(decode("cutlass_gemm_fp4"), exp, log)
    assert len(without.excused) == 2  # the same two excuses ...
    assert not without.ok and len(without.problems) == 1 and "*FlashAttnFwd*" in without.problems[0], without  # ... and a miss


def test_the_suites_own_log_header_is_never_read_as_a_logged_fallback(tmp_path, monkeypatch):
    """A run folder named `gemv-fallback-check` sits in the argv line the suite writes above vLLM's output: it once
    excused a GEMV config whose trace held no GEMV kernel at all."""
    monkeypatch.setattr(server_mod.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(OSError("no boot")))
    run = tmp_path / "runs" / "gemv-fallback-check"
    srv = server_mod.VllmServer(model="m", log_path=run / "server.log", env_extra={"SUITE_X": str(run)},
                                argv_extra=["--profiler-config", json.dumps({"torch_profiler_dir": str(run / "traces" / "gemv-bf16")})])
    with pytest.raises(OSError):
        srv.start()
    header = srv.log_path.read_text()
    assert "gemv-fallback" in header  # the header does hold the words the excuse looks for
    s = parse_trace(_trace(tmp_path, [{"cat": "kernel", "name": "cutlass_gemm", "dur": 1}]), "kernel")
    exp = KernelExpectation(must=["*gemv_fp4*"], excuses={"*gemv_fp4*": "(?i)gemv.*fall(ing)? ?back"})
    v = check_path(s, exp, header + "INFO 12-03 17:00:00 [api_server.py:1] serving\n")
    assert not v.ok and not v.excused
    # nor is vLLM's echo of the run folder (its profiler says where the traces go)
    echo = f"(EngineCore_DP0 pid=1) INFO 12-03 17:00:01 [gpu_worker.py:1] Torch profiling enabled. Traces will be saved to: {run}/traces/gemv-bf16\n"
    v = check_path(s, exp, header + echo)
    assert not v.ok and not v.excused, v
    # vLLM's own line still excuses it
    assert check_path(s, exp, header + "WARNING gemv path falling back to GEMM for M=2\n").ok


def test_the_suites_argv_and_env_header_lines_never_excuse_even_without_a_path(tmp_path, monkeypatch):
    """The header's words need not sit in a path: a served model name or an env value of `gemv-fallback-check` is the
    suite's own text, not vLLM logging a fallback."""
    monkeypatch.setattr(server_mod.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(OSError("no boot")))
    srv = server_mod.VllmServer(model="m", log_path=tmp_path / "server.log",
                                env_extra={"SUITE_RUN": "gemv-fallback-check"},
                                argv_extra=["--served-model-name", "gemv-fallback-check"])
    with pytest.raises(OSError):
        srv.start()
    header = srv.log_path.read_text()
    s = parse_trace(_trace(tmp_path, [{"cat": "kernel", "name": "cutlass_gemm", "dur": 1}]), "kernel")
    exp = KernelExpectation(must=["*gemv_fp4*"], excuses={"*gemv_fp4*": "(?i)gemv.*fall(ing)? ?back"})
    v = check_path(s, exp, header)
    assert not v.ok and not v.excused, (header, v)
    assert check_path(s, exp, header + "WARNING gemv path falling back to GEMM for M=2\n").ok


def test_a_sibling_pattern_names_the_backend_it_comes_from(tmp_path):
    s = parse_trace(_trace(tmp_path, [{"cat": "kernel", "name": "marlin_moe_wna16::Marlin<1>", "dur": 1}]), "kernel")
    exp = KernelExpectation(must=["*marlin*"], must_not=["*marlin_moe_wna16*"], derived={"*marlin_moe_wna16*": "moe=marlin's kernel"},
                            source={"*marlin_moe_wna16*": ["moe=triton"]})
    v = check_path(s, exp)
    assert not v.ok and "moe=marlin's kernel" in v.problems[0]


def test_corrupt_trace_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.pt.trace.json.gz"
    p.write_bytes(b"not gzip")
    with pytest.raises(SuiteError, match="unreadable"):
        parse_trace(p, "kernel")
    deep = tmp_path / "deep.pt.trace.json.gz"  # nested past json's recursion limit: a RecursionError escaped once
    with gzip.open(deep, "wt") as f:
        f.write("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SuiteError, match="unreadable"):
        parse_trace(deep, "kernel")


def test_cpu_sinks_are_read_from_attention_arguments(tmp_path):
    args = {"Input Dims": [[1, 4, 64]] + [[]] * 12 + [[4]], "Concrete Inputs": [""] * 9 + ["128"]}
    s = parse_trace(_trace(tmp_path, [{"cat": "cpu_op", "name": "_C::cpu_attention_with_kv_cache", "dur": 1, "args": args}]), "cpu_op")
    assert cpu_attention_sinks(s) == ({(4,)}, {"128"})


TOL = Tolerance(max_abs=0.25, mean_abs=0.01, ppl_rel=0.002, margin=0.125)


def _stream(tokens, tops):
    return Stream(tokens, [t[tok] for tok, t in zip(tokens, tops)], tops, "")


def test_identical_streams_pass():
    g = _stream([1, 2], [{1: -0.1, 5: -3.0}, {2: -0.1, 6: -3.0}])
    assert compare_streams(g, g, TOL).identical


def test_a_near_tie_flip_on_both_sides_is_accepted():
    g = _stream([1, 2, 3], [{1: -0.1}, {2: -0.70, 7: -0.75}, {3: -0.1}])
    n = _stream([1, 7, 9], [{1: -0.1}, {7: -0.70, 2: -0.72}, {9: -0.1}])
    v = compare_streams(g, n, TOL)
    assert v.ok and not v.identical and v.position == 1 and "teacher forcing" in v.message


def test_a_swap_the_new_run_is_confident_about_fails_even_if_the_golden_had_a_tie():
    """The old rule looked only at the golden's top-1/top-2 margin: golden g=-0.70, x=-0.75, t=-3.0 and a
    new run choosing t with a 4.6-nat lead was 'accepted near tie (margin 0.05)'."""
    g = _stream([1, 2], [{1: -0.1}, {2: -0.70, 7: -0.75, 9: -3.0}])
    n = _stream([1, 9], [{1: -0.1}, {9: -0.01, 2: -4.61, 7: -5.0}])
    v = compare_streams(g, n, TOL)
    assert not v.ok and "golden prefers its token by 2.3000" in v.message and "new run prefers its token by 4.6000" in v.message


def test_a_confident_flip_fails():
    g = _stream([1, 2], [{1: -0.1}, {2: -0.05, 7: -3.0}])
    n = _stream([1, 7], [{1: -0.1}, {7: -0.05, 2: -3.0}])
    assert not compare_streams(g, n, TOL).ok


def test_a_token_outside_the_golden_top_k_fails():
    g = _stream([1, 2], [{1: -0.1}, {2: -0.70, 7: -0.72}])
    n = _stream([1, 9], [{1: -0.1}, {9: -0.70, 2: -0.71}])
    assert not compare_streams(g, n, TOL).ok


def test_matching_tokens_with_drifted_logprobs_fail():
    g = _stream([1, 2], [{1: -0.1}, {2: -0.5}])
    n = _stream([1, 2], [{1: -0.1}, {2: -1.5}])
    v = compare_streams(g, n, TOL)
    assert not v.ok and "same token 2" in v.message


def test_a_small_systematic_shift_of_the_decoded_logprobs_fails():
    """A fault only in the decode path (a kernel that serves small batches, a 2% logit scale): every position
    stays within max_abs and the tokens do not change, so only the mean over the decoded positions sees it.
    Teacher forcing scores prefill and cannot."""
    tops = [{10 + i: -0.5, 50 + i: -3.0} for i in range(24)]
    g = _stream([10 + i for i in range(24)], tops)
    shifted = _stream(g.tokens, [{10 + i: -0.5 - 0.05, 50 + i: -3.0} for i in range(24)])
    v = compare_streams(g, shifted, TOL)  # 0.05 per position: < max_abs 0.25, > mean_abs 0.01
    assert not v.ok and "mean |delta logprob| 0.0500 over the 24 matching decoded positions" in v.message
    within = _stream(g.tokens, [{10 + i: -0.5 - 0.005, 50 + i: -3.0} for i in range(24)])
    assert compare_streams(g, within, TOL).ok  # 0.005: inside mean_abs
    few = _stream(g.tokens[:4], [{10 + i: -0.55, 50 + i: -3.0} for i in range(4)])
    assert compare_streams(_stream(g.tokens[:4], tops[:4]), few, TOL).ok  # 4 positions: too few for a mean


def test_a_decode_shift_before_an_accepted_near_tie_still_fails_by_the_mean():
    """A near tie ends the stream comparison at the swap; the positions decoded before it are the only sight of a
    decode-only shift, so their mean is judged before the tie is accepted."""
    n = 3 * MIN_MEAN_POSITIONS
    tops = [{10 + i: -0.5, 50 + i: -3.0} for i in range(n)]
    tie = {2: -0.70, 7: -0.70 - TOL.margin / 2}
    g = _stream([10 + i for i in range(n)] + [2], tops + [tie])
    shift = 5 * TOL.mean_abs  # every position within max_abs, their mean far beyond mean_abs
    assert shift < TOL.max_abs
    flip = {7: -0.70 - shift, 2: -0.70 - shift - TOL.margin / 2}
    shifted = _stream(g.tokens[:n] + [7], [{10 + i: -0.5 - shift, 50 + i: -3.0} for i in range(n)] + [flip])
    v = compare_streams(g, shifted, TOL)
    assert not v.ok and v.position == n and v.message.startswith(f"before position {n}: mean |delta logprob|"), v
    unshifted = _stream(g.tokens[:n] + [7], tops + [{7: -0.70, 2: -0.70 - TOL.margin / 2}])
    assert compare_streams(g, unshifted, TOL).ok  # the same tie without the shift is accepted


def test_a_stream_that_stopped_early_or_ran_on_is_not_identical():
    """Every token both streams hold can agree while one of them is shorter: an EOS the golden never chose (or one it
    did that the run ran past) is a different completion."""
    g = _stream([1, 2, 3], [{1: -0.1, 5: -3.0}, {2: -0.1, 6: -3.0}, {3: -0.1, 8: -3.0}])
    for shorter, longer in ((g, _stream(g.tokens[:2], g.top[:2])), (_stream(g.tokens[:2], g.top[:2]), g)):
        v = compare_streams(shorter, longer, TOL)
        assert not v.ok and not v.identical and v.position == 2 and "lengths differ" in v.message, v


@pytest.mark.parametrize("times, ok", [(0.9, True), (1.1, False)])
def test_the_chosen_tokens_logprob_is_held_to_max_abs(times, ok):
    """The same greedy token with its logprob moved: just inside max_abs is the same model, just beyond it is not,
    and the failure names the chosen token's logprob."""
    g = _stream([1, 2], [{1: -0.1}, {2: -0.5}])
    n = _stream([1, 2], [{1: -0.1}, {2: -0.5 - times * TOL.max_abs}])
    v = compare_streams(g, n, TOL)
    assert v.ok is ok, v.message
    assert ok or v.message.startswith("position 1: same token 2, logprob"), v.message


@pytest.mark.parametrize("times, ok", [(0.9, True), (1.1, False)])
def test_a_swap_is_a_near_tie_only_within_the_margin_on_the_golden_side(times, ok):
    """The golden's preference for its own token decides a swap as much as the new run's does: just inside the
    margin is a near tie, just beyond it is a changed model."""
    g = _stream([1, 2], [{1: -0.1}, {2: -0.70, 7: -0.70 - times * TOL.margin}])
    n = _stream([1, 7], [{1: -0.1}, {7: -0.70, 2: -0.70}])
    v = compare_streams(g, n, TOL)
    assert v.ok is ok and (ok or "golden prefers its token" in v.message), v.message


@pytest.mark.parametrize("times, ok", [(0.9, True), (1.1, False)])
def test_the_decoded_positions_mean_is_held_to_mean_abs(times, ok):
    """A decode-only shift just inside mean_abs over the decoded positions is noise, just beyond it a fault."""
    n = 3 * MIN_MEAN_POSITIONS
    g = _stream([10 + i for i in range(n)], [{10 + i: -0.5, 50 + i: -3.0} for i in range(n)])
    shifted = _stream(g.tokens, [{10 + i: -0.5 - times * TOL.mean_abs, 50 + i: -3.0} for i in range(n)])
    v = compare_streams(g, shifted, TOL)
    assert v.ok is ok and (ok or "mean |delta logprob|" in v.message), v.message


def test_golden_files_missing_or_corrupt_name_the_fix(tmp_path):
    with pytest.raises(SuiteError, match="create it with: pytest -m level2"):
        load_golden(tmp_path / "none.json", "pytest -m level2 --config=x --force-regen")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SuiteError, match="corrupt"):
        load_golden(bad, "cmd")
    ok = tmp_path / "ok.json"
    ok.write_text(golden_text({"a": 1}, {"model": "m"}))
    assert load_golden(ok, "cmd")["data"] == {"a": 1}
    old = tmp_path / "old.json"
    old.write_text('{"schema": 1, "meta": {}, "data": {}}')
    with pytest.raises(SuiteError, match="lacks schema 2"):
        load_golden(old, "cmd")
    # a hand-edited meta that is not a mapping once ended in an AttributeError where the identity is checked
    meta_string = tmp_path / "meta-string.json"
    meta_string.write_text('{"schema": 2, "meta": "x", "data": {}}')
    with pytest.raises(SuiteError, match="lacks schema 2 / meta / data; restore it from git"):
        load_golden(meta_string, "cmd")


def test_engine_clock_metrics_replace_client_pp_and_tg():
    w = bench.Workload("decode", 16, 32, 0, 1, 2, 0)
    reqs = [perf.TimedRequest(16, 32, 0.0, 0.1, 0.2, [0.1, 0.2], 0.2) for _ in range(2)]
    rounds = [EngineRound(1, 0.01, 0.31, 16, 32), EngineRound(1, 0.01, 0.62, 16, 32)]
    m = bench.metrics_for(w, bench.Measured(reqs, rounds))
    assert list(m) == ["tg32"] and m["tg32"]["samples"] == pytest.approx([100.0, 50.0])
    p = bench.metrics_for(bench.Workload("prefill", 512, 2, 0, 1, 1, 0), bench.Measured(
        [perf.TimedRequest(512, 2, 0.0, 0.1, 0.2, [0.1, 0.2], 0.2)], [EngineRound(1, 0.05, 0.01, 512, 2)]))
    assert p["pp512"]["samples"] == pytest.approx([512 / 0.05])


def test_client_clock_is_the_fallback_without_engine_metrics():
    w = bench.Workload("decode", 16, 32, 0, 1, 1, 0)
    m = bench.metrics_for(w, bench.Measured([perf.TimedRequest(16, 32, 0.0, 0.1, 0.41, [0.1, 0.41], 0.41)], None))
    assert m["tg32"]["samples"] == pytest.approx([31 / 0.31])


def test_workloads_over_the_context_are_dropped_and_listed():
    fit, dropped = bench.load_workloads("sm_90", 4096)
    assert all(w.tokens <= 4096 for w in fit) and dropped
    assert any("d8192" in d for d in dropped)


def test_a_decode_only_workload_set_loads_and_a_set_without_decode_names_its_file(tmp_path):
    """The decode-only GPU set (made to fit one call) measures batch-1 decode at both depths and the batch of two;
    decode stays required, so a set that lost it is a one-line error naming the file, not a silent empty level 4."""
    fit, _ = bench.load_workloads("sm_90", 131072, Path(__file__).resolve().parents[2] / "tests/level4_perf/workloads-gpu-decode.yaml")
    assert {w.kind for w in fit} == {"decode", "concurrent"}
    assert sorted((w.tg, w.depth) for w in fit if w.kind == "decode") == [(32, 0), (32, 8192), (128, 0), (128, 8192)]
    broken = tmp_path / "w.yaml"
    broken.write_text("gpu: {runs: 6, warmup: 3, prefill: {pp: [512], depths: [0]}}\n")
    with pytest.raises(SuiteError, match=r"w\.yaml: malformed workloads.*fix the file"):
        bench.load_workloads("sm_90", 131072, broken)
    # a YAML syntax error: one line with where it is (pyyaml's own text spans 8 lines with a caret drawing)
    broken.write_text("gpu: {runs: 6, warmup: 3\nprefill: [\n")
    with pytest.raises(SuiteError, match=r"w\.yaml: line \d+: malformed YAML \(.*\); fix the file$") as e:
        bench.load_workloads("sm_90", 131072, broken)
    assert "\n" not in str(e.value)


def test_prometheus_text_is_summed_over_label_sets():
    from harness.engine.server_metrics import parse_prometheus

    text = ('# HELP vllm:x help\n# TYPE vllm:x histogram\n'
            'vllm:x_sum{engine="0",model_name="m"} 1.5\nvllm:x_sum{engine="1",model_name="m"} 2.0\n'
            'vllm:x_count{engine="0"} 3.0\nvllm:num_requests_running 1.0\n')
    assert parse_prometheus(text) == {"vllm:x_sum": 3.5, "vllm:x_count": 3.0, "vllm:num_requests_running": 1.0}


def test_a_golden_of_other_embedded_weights_is_refused_by_name(tmp_path):
    """A golden recorded with an older embedded model must not be judged as a regression of this one."""
    from harness.core.store import Regenerated
    from harness.correctness.goldens import GoldenStore

    def store(fingerprint, regen=False):
        return GoldenStore("tiny", "cpu", "cfg", {"model": "tiny"}, regen, root=tmp_path, model_fingerprint=fingerprint)

    with pytest.raises(Regenerated):
        store("aaaaaaaaaaaa", regen=True).save("level2", {"x": 1})
    assert store("aaaaaaaaaaaa").load("level2", "level2") == {"x": 1}  # A/A: same weights
    with pytest.raises(SuiteError, match=r"other weights of tiny \(fingerprint aaaaaaaaaaaa, this run: bbbbbbbbbbbb\).*--force-regen"):
        store("bbbbbbbbbbbb").load("level2", "level2")
    # a model without a fingerprint (a checkpoint folder of the same name) cannot be these weights: refused too
    with pytest.raises(SuiteError, match=r"fingerprinted aaaaaaaaaaaa; this run's model tiny has no fingerprint"):
        store(None).load("level2", "level2")


def test_spec_decode_counters_give_acceptance_length_and_rate():
    """vLLM's counters over a decode round: 10 draft steps of 3 tokens, 18 accepted -> 2.8 tokens per target step."""
    from harness.engine.server_metrics import SPEC_COUNTERS, spec_decode_between

    before = dict.fromkeys(SPEC_COUNTERS, 5.0)
    after = dict(zip(SPEC_COUNTERS, (15.0, 35.0, 23.0)))
    got = spec_decode_between(before, after)
    assert got["mean_acceptance_length"] == pytest.approx(2.8) and got["acceptance_rate"] == pytest.approx(0.6)
    assert spec_decode_between(before, before) is None  # nothing drafted: no speculator at work
    assert spec_decode_between(None, after) is None


def test_a_trace_without_device_activity_names_the_profiler_not_the_patterns():
    from harness.kernelpath.traces import KernelSummary

    v = check_path(KernelSummary("t", "kernel", []), KernelExpectation(must=["*marlin_moe_wna16*", "*FlashAttnFwdSm90*"]))
    assert not v.ok and v.problems[0].startswith("the trace holds no 'kernel' events: the profiler recorded no device")


@pytest.mark.parametrize("dies_at", ["/start_profile", "/stop_profile"])
def test_a_server_dying_while_profiling_is_one_line(monkeypatch, tmp_path, dies_at):
    import requests

    from harness.kernelpath import traces

    def post(url, timeout):
        if url.endswith(dies_at):
            raise requests.ConnectionError("connection reset")
        return SimpleNamespace(status_code=200, text="")
    monkeypatch.setattr(traces.requests, "post", post)
    with pytest.raises(SuiteError, match=f"{dies_at} failed \\(ConnectionError.*the server died or hung") as e:
        traces.profile("http://127.0.0.1:1", tmp_path, lambda: None, "kernel", timeout_s=1)
    assert "\n" not in str(e.value)


def test_the_workloads_own_error_is_reported_when_stopping_the_profiler_fails_too(monkeypatch, tmp_path):
    import requests

    from harness.kernelpath import traces

    def post(url, timeout):
        if url.endswith("/stop_profile"):
            raise requests.ConnectionError("connection reset")
        return SimpleNamespace(status_code=200, text="")
    monkeypatch.setattr(traces.requests, "post", post)

    def workload():
        raise SuiteError("request failed: the server answered 500")
    with pytest.raises(SuiteError, match="the server answered 500"):
        traces.profile("http://127.0.0.1:1", tmp_path, workload, "kernel", timeout_s=1)


def test_profile_reads_the_workers_new_trace_not_an_older_one_nor_the_front_ends(monkeypatch, tmp_path):
    """The worker writes its trace a moment after /stop_profile returns. The trace dir already holds the full run's
    trace when the decode window is profiled, and the API front end writes its own (`async_llm`, no kernels): reading
    either judged the decode steps by the wrong file (the full run's shows every prefill kernel and every decode one)."""
    import os
    import threading

    from harness.kernelpath import traces

    def write(name: str, kernel: str, mtime: float) -> None:
        path = tmp_path / name
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": [{"cat": "kernel", "name": kernel, "dur": 1}]}, f)
        os.utime(path, (mtime, mtime))

    now = __import__("time").time()
    write("worker_full_run.pt.trace.json.gz", "old_full_run_kernel", now - 60)

    def post(url, timeout):
        if url.endswith("/stop_profile"):  # the new files appear only after the answer, the front end's last
            threading.Timer(0.3, lambda: (write("worker_decode.pt.trace.json.gz", "new_decode_kernel", now),
                                          write("async_llm.pt.trace.json.gz", "front_end_op", now + 30))).start()
        return SimpleNamespace(status_code=200, text="")
    monkeypatch.setattr(traces.requests, "post", post)
    summary = traces.profile("http://127.0.0.1:1", tmp_path, lambda: None, "kernel", timeout_s=10)
    assert summary.names() == ["new_decode_kernel"] and Path(summary.source).name == "worker_decode.pt.trace.json.gz"


def test_a_server_whose_profiler_is_off_is_refused_before_the_workload_runs(monkeypatch, tmp_path):
    """/start_profile answering anything but 200 (a server booted without --profiler-config answers 404) records
    nothing: the workload would run unprofiled and the trace read afterwards would be some other run's."""
    from harness.kernelpath import traces

    ran = []
    monkeypatch.setattr(traces.requests, "post", lambda url, timeout: SimpleNamespace(
        status_code=404 if url.endswith("/start_profile") else 200, text=""))
    with pytest.raises(SuiteError, match="/start_profile answered HTTP 404.*--profiler-config"):
        traces.profile("http://127.0.0.1:1", tmp_path, lambda: ran.append("workload"), "kernel", timeout_s=1)
    assert ran == []


@pytest.mark.parametrize("dur, ok", [(0, True), (0.0, True), (-0.5, False), (-1e-9, False), (True, False)])
def test_a_kernel_duration_is_a_non_negative_number(tmp_path, dur, ok):
    """A zero duration is a kernel that ran (a short one); a negative one, or a boolean (true reads as 1 in Python),
    is a corrupt trace, not a kernel to count towards a `must` pattern."""
    path = _trace(tmp_path, [{"cat": "kernel", "name": "marlin_moe_wna16::Marlin<1>", "dur": dur}])
    if ok:
        assert parse_trace(path, "kernel").names() == ["marlin_moe_wna16::Marlin<1>"]
    else:
        with pytest.raises(SuiteError, match="a duration a finite number.*re-run the level 1.5 profile"):
            parse_trace(path, "kernel")


def test_kernel_patterns_match_names_case_sensitively():
    """Kernel names are C++ symbols: `*gemv*` must not be satisfied by a `GEMV_reference` kernel of another backend,
    nor a forbidden `*Marlin*` by vLLM's `marlin_` helpers; only the exact case matches."""
    from harness.kernelpath.traces import KernelStat, KernelSummary

    s = KernelSummary("t", "kernel", [KernelStat("GEMV_reference_kernel", 3, 1.0, 1.0)])
    assert not check_path(s, KernelExpectation(must=["*gemv*"])).ok
    assert check_path(s, KernelExpectation(must=["*GEMV*"])).ok
    assert check_path(s, KernelExpectation(must=["*GEMV*"], must_not=["*gemv_reference*"])).ok
