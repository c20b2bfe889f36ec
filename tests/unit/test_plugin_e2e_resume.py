"""scripts/plugin_e2e.py: entries, warm-up and the report. It resumes an --out a time limit cut off, and must never
put results measured with other weights (the shape models' valid random ones, or vLLM's dummy ones) or other kernel
settings in the same table."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import plugin_e2e  # noqa: E402

NOW = {"weights": "model default (random-valid-1)", "kernel_env": {}}


def test_results_of_the_same_setting_resume():
    results = {"triton-bf16": {"metrics": {"tg32": {}}, **NOW}, "gemv-bf16": {"error": "boot failed"}}
    assert plugin_e2e.mixed_setting(results, NOW) is None


def test_results_of_other_weights_or_kernel_settings_are_refused():
    dummy = {"triton-bf16": {"metrics": {}, **NOW, "weights": "vllm dummy"}}
    assert "vllm dummy" in plugin_e2e.mixed_setting(dummy, NOW)
    tiled = {"triton-bf16": {"metrics": {}, **NOW, "kernel_env": {"KERNELS_PACKED_MM_BLOCK_M": "128"}}}
    assert "BLOCK_M" in plugin_e2e.mixed_setting(tiled, NOW)
    older = {"triton-bf16": {"metrics": {}}}  # written before results said what they were measured with
    assert plugin_e2e.mixed_setting(older, NOW) is not None
    window = {**NOW, "workloads": "all", "breakdown": "decode window"}
    request = {"triton-bf16": {"metrics": {}, **NOW, "workloads": "all"}}  # its breakdown held two prefills
    assert "breakdown" in plugin_e2e.mixed_setting(request, window)
    assert plugin_e2e.mixed_setting({"t": {"metrics": {}, **window}}, window) is None
    streamed = {**window, "stream": "per-chunk usage, no logprobs"}
    assert "stream" in plugin_e2e.mixed_setting({"t": {"metrics": {}, **window}}, streamed)  # its tg had logprobs
    assert plugin_e2e.mixed_setting({"t": {"metrics": {}, **streamed}}, streamed) is None


def test_the_report_shows_the_wait_for_the_host_the_exclusive_moe_time_and_the_host_ranges(tmp_path):
    """e2e.md from a breakdown of a synthetic trace (PDL-style overlap, two launches, one host range): every row has
    the header's number of cells; an older result without the new numbers shows '-' instead of failing."""
    import gzip
    import json

    from harness.config.catalog import Catalog
    from harness.kernelpath.breakdown import breakdown

    trace = tmp_path / "t.pt.trace.json.gz"
    moe = "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu"
    events = [{"ph": "X", "cat": "kernel", "name": moe, "ts": ts, "dur": d, "args": {"correlation": c}}
              for ts, d, c in ((0, 10, 1), (5, 10, 1), (40, 10, 2))]
    events.append({"ph": "X", "cat": "user_annotation", "name": "gpu_model_runner: sample", "ts": 16, "dur": 20})
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    b = breakdown(trace, Catalog().kernel_categories(), 1).to_json()
    old = {k: v for k, v in b.items() if k not in ("host_wait_us_per_token", "exclusive_us_per_token", "host_top")}
    old["top"] = [{k: v for k, v in t.items() if k != "exclusive_us_per_token"} for t in b["top"]]
    results = {"triton-bf16": {"boot_s": 1.0, "metrics": {"tg32": {"median": 200.0}}, "kernel_breakdown": b},
               "gemv-bf16": {"boot_s": 1.0, "metrics": {"tg32": {"median": 250.0}}, "kernel_breakdown": old}}
    md = plugin_e2e.markdown(results, ["triton-bf16", "gemv-bf16"], "x")
    rows = [ln for ln in md if ln.startswith("| triton-bf16 | 5.00") or ln.startswith("| gemv-bf16 | 4.00")]
    head = next(ln for ln in md if ln.startswith("| config | ms/token"))
    assert len(rows) == 2 and all(r.count("|") == head.count("|") for r in rows), (head, rows)
    assert rows[0] == "| triton-bf16 | 5.00 | 30 | 25 | 0 | 0 | 0 | 30 | 25 | 25 | 3 |", rows[0]
    assert " - | 0 | 0 | 0 | 30 | 25 | - | 3 |" in rows[1], rows[1]
    assert "- gpu_model_runner: sample (user_annotation): 20 us, 1.00 calls" in md
    # per call (one per layer at batch 1): 30 us recorded over 3 calls, 25 own (the second call waits 5-10 inside)
    assert f"| triton-bf16 | {moe} | 3.00 | 10.0 | 8.3 |" in md
    assert f"| gemv-bf16 | {moe} | 3.00 | 10.0 | - |" in md


def test_the_speed_table_shows_the_spread_of_a_noisy_median():
    """A median of bimodal samples (a shared host: half at 1.0x stock, half at 1.33x) must not read as a clean ratio;
    a tight one stays uncluttered."""
    results = {"triton-bf16": {"boot_s": 1.0, "metrics": {"tg32": {"median": 325.2, "cv": 0.0069}}},
               "gemv-bf16": {"boot_s": 1.0, "metrics": {"tg32": {"median": 375.0, "cv": 0.1513}}}}
    rows = plugin_e2e.table(results, ["triton-bf16", "gemv-bf16"])
    assert "| 325.2 (1.00x) |" in rows[2], rows[2]
    assert "| 375.0 (1.15x, CV 15.1%) |" in rows[3], rows[3]


def _decode(samples: list[float], kernels_us: float) -> dict:
    return {"metrics": {"tg32": plugin_e2e._summary({"samples": samples})},
            "kernel_breakdown": {"total_us_per_token": kernels_us}}


def test_decode_is_called_host_bound_when_its_step_outlasts_its_kernels():
    """The 20b shape alone on an H200 (docs/evidence/sm_90-2026-11-28-h200-second/): stock's step is its kernels, the
    plugin's step follows the host (samples from stock's speed to the kernels' bound). A/A: stock stays kernel-bound;
    a plugin whose step is its kernels is kernel-bound too, so the rule reads the step, not the config."""
    results = {"triton-bf16": _decode([326.1, 325.9, 326.3, 324.8, 324.6, 324.8, 325.7, 322.8], 3043),
               "gemv-bf16-mxfp4-all": _decode([392.0, 314.6, 318.6, 322.6, 392.6, 470.6, 452.5, 448.2], 2170),
               "fast-and-steady": _decode([455.0, 456.0, 454.0], 2170)}
    lines = plugin_e2e.decode_bounds(results, list(results))
    assert len(lines) == 3
    stock, plugin, steady = lines
    assert "kernel-bound" in stock and "host-bound" not in stock
    assert "host-bound" in plugin and "samples 2.12-3.18" in plugin and "460.8 tok/s" in plugin
    assert "kernel-bound" in steady and "samples" not in steady  # CV under SPREAD_SHOWN: no sample range
    # the kernels' share of the tg32 step (the busy fraction of tg32's own steps), in points against the first config:
    # stock 3.043 ms of a 3.075 ms step (median 325.25 tok/s), the plugin 2.170 of 2.549 (392.3 tok/s)
    assert "(99.0% of the step)" in stock
    assert "(85.1% of the step, -13.8 points against triton-bf16)" in plugin, plugin
    assert "(98.7% of the step, -0.2 points against triton-bf16)" in steady, steady
    assert plugin_e2e.decode_bounds({"x": {"error": "boot failed"}}, ["x"]) == []
    # kernels overlapping through programmatic dependent launch count once: the fused route's first H200 boot summed
    # 3,210 us per token with 2,600 busy, and stepped 3,531 us; its kernels allowed 384.6 tok/s, not the sum's 311.5
    first = _decode([283.2] * 3, 3210)
    first["kernel_breakdown"]["busy_us_per_token"] = 2600
    line, = plugin_e2e.decode_bounds({"fused": first}, ["fused"])
    assert "host-bound" in line and "kernels 2.60 ms" in line and "384.6 tok/s" in line, line


def test_an_entry_with_server_environment_is_its_config_plus_that_environment_and_a_bad_one_says_the_form():
    """`CONFIG+VAR=VALUE` or `CONFIG+--flag=value`: an option of the plugin, or a serving setting, judged against the
    same config without it, in one run. Each entry boots under its own tag (its server log apart); a malformed pair is
    one line naming the form, not a boot."""
    assert plugin_e2e.parse_entry("gemv-bf16") == ("gemv-bf16", {}, [])
    config, env, args = plugin_e2e.parse_entry("gemv-bf16-mxfp4-all+SUITE_KERNELS_ROUTE=fused+KERNELS_X=1")
    assert (config, env, args) == ("gemv-bf16-mxfp4-all", {"SUITE_KERNELS_ROUTE": "fused", "KERNELS_X": "1"}, [])
    assert plugin_e2e._tag(None) == "__e2e" != plugin_e2e._tag(env) != plugin_e2e._tag(env, warm=True)
    assert plugin_e2e._tag({"A": "x/y"}) == "__e2e_a-x_y"
    config, env, args = plugin_e2e.parse_entry("triton-bf16+--stream-interval=8+--enforce-eager")
    assert (config, env, args) == ("triton-bf16", {}, ["--stream-interval=8", "--enforce-eager"])
    assert plugin_e2e._tag(None, args=args) == "__e2e_stream-interval_8_enforce-eager" != plugin_e2e._tag(None)
    for bad in ("gemv-bf16+route", "gemv-bf16+route=fused", "gemv-bf16+SUITE_KERNELS_ROUTE=", "gemv-bf16+=1",
                "gemv-bf16+--", "gemv-bf16+--stream-interval=", "gemv-bf16+--a;b=1"):
        with pytest.raises(plugin_e2e.SuiteError, match="is not .*--flag") as e:
            plugin_e2e.parse_entry(bad)
        assert "\n" not in str(e.value)


def test_warm_boots_the_first_entry_still_to_measure_once_and_each_entry_boots_with_its_own_environment(
        tmp_path, monkeypatch):
    """main()'s plumbing with the boots recorded instead of run: --warm boots the first pending entry (discarded) before
    any measured boot; `CONFIG+VAR=VALUE` measures CONFIG with VAR in its server environment; a resumed --out measures
    (and warms) nothing it already has."""
    from types import SimpleNamespace

    made, calls = [], []
    fake = SimpleNamespace(model=SimpleNamespace(fingerprint="fp"),
                           platform=SimpleNamespace(name="sm_90", device="H200"))

    def create(configs, *args):
        made.append(configs)
        return fake

    monkeypatch.setattr(plugin_e2e.Suite, "create", staticmethod(create))
    monkeypatch.setattr(plugin_e2e, "warm_up", lambda suite, *server: calls.append(("warm", *server)))
    monkeypatch.setattr(plugin_e2e, "measure", lambda suite, *server: calls.append(("measure", *server))
                        or {"boot_s": 1.0, "metrics": {"tg32": {"median": 100.0 + len(calls)}}})
    argv = ["plugin_e2e.py", "--warm", "--configs",
            "gemv-bf16,gemv-bf16+SUITE_KERNELS_ROUTE=fused,gemv-bf16+--stream-interval=8",
            "--gpu-memory-utilization", "gemv-bf16=0.9", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    assert plugin_e2e.main() == 0
    util = ["--gpu-memory-utilization", "0.9", "--max-num-seqs=32"]  # the full set's tg32@c32 reaches batch 32
    assert made == ["gemv-bf16"]
    assert calls == [("warm", "gemv-bf16", util, None, "all"),
                     ("measure", "gemv-bf16", util, None, "all"),
                     ("measure", "gemv-bf16", util, {"SUITE_KERNELS_ROUTE": "fused"}, "all"),
                     ("measure", "gemv-bf16", util + ["--stream-interval=8"], None, "all")], calls
    import json

    results = json.loads((tmp_path / "e2e.json").read_text())["results"]
    assert list(results) == ["gemv-bf16", "gemv-bf16+SUITE_KERNELS_ROUTE=fused", "gemv-bf16+--stream-interval=8"]
    assert "| gemv-bf16+SUITE_KERNELS_ROUTE=fused | 1.0 |" in (tmp_path / "e2e.md").read_text()
    calls.clear()
    assert plugin_e2e.main() == 0 and calls == [], "a resumed --out boots again"


def test_the_prefill_table_says_in_which_category_a_slower_prefill_spends_its_time(tmp_path, monkeypatch):
    """prefill_breakdown over a synthetic trace (the profiler faked, the breakdown real): per prefill, not per token,
    and the trace is deleted; the table puts each category's difference from the first config beside it, so a
    prefill 1.1x slower in its MoE kernels reads +MoE, not a total alone."""
    import gzip
    import json
    from types import SimpleNamespace

    from harness.config.catalog import Catalog
    from harness.features import run

    def trace(moe_us: float) -> Path:
        path = tmp_path / f"{moe_us}.pt.trace.json.gz"
        events = [{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": d, "args": {"correlation": 1}}
                  for n, ts, d in (("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1_swiglu", 0, moe_us),
                                   ("sm90_xmma_gemm_bf16bf16_bf16f32", moe_us, 300.0))]
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": events}, f)
        return path

    suite = SimpleNamespace(platform=SimpleNamespace(is_cuda=True), catalog=Catalog())
    running = SimpleNamespace(trace_dir=tmp_path, url="http://127.0.0.1:1", target=SimpleNamespace(name="x"),
                              client=lambda timeout_s=None: SimpleNamespace(complete=lambda *a, **k: None))
    results = {}
    for config, moe_us in (("triton-bf16", 1000.0), ("gemv-bf16-mxfp4-all", 1100.0)):
        path = trace(moe_us)
        monkeypatch.setattr(run, "profile", lambda url, d, request, kind, path=path: request() or SimpleNamespace(source=str(path)))
        notes: list[str] = []
        results[config] = {"prefill_breakdown": run.prefill_breakdown(suite, running, [0] * 2048, notes)}
        assert not path.exists() and notes == []
    b = results["gemv-bf16-mxfp4-all"]["prefill_breakdown"]
    assert b["exclusive_us_per_token"]["moe"] == pytest.approx(1100.0) and b["busy_us_per_token"] == pytest.approx(1400.0)
    md = plugin_e2e.prefill_table(results, ["triton-bf16", "gemv-bf16-mxfp4-all"])
    row = next(ln for ln in md if ln.startswith("| gemv-bf16-mxfp4-all | 1.10"))
    assert "1.10 (+0.10)" in row and "1.40 (+0.10)" in row, row
    assert plugin_e2e.prefill_table({"triton-bf16": {"prefill_breakdown": None}}, ["triton-bf16"]) == []
    cpu = SimpleNamespace(platform=SimpleNamespace(is_cuda=False))
    notes = []
    assert run.prefill_breakdown(cpu, running, [0], notes) is None and "no prefill breakdown" in notes[0]

def test_the_breakdown_is_a_decode_window_not_a_request_with_its_prefills(monkeypatch):
    """measure()'s plumbing with the server faked: the kernel breakdown is the feature verdicts' decode window
    (`decode_breakdown`), so no prompt prefill is in the MoE's time per token (a profiled 16-token request and its
    warm-up request added 342 us per token of GPU busy time on the 120b shape, 288 of it MoE); its notes are kept; --prefill-gpu-only
    profiles no decode."""
    import contextlib
    from types import SimpleNamespace

    running = SimpleNamespace(trace_dir="/tmp/unused", log_path=None, boot_seconds=1.0,
                              client=lambda timeout_s=None: object())
    target = SimpleNamespace(name="gemv-bf16", runnable=True)
    suite = SimpleNamespace(targets=lambda: [target], boot=lambda *a, **k: contextlib.nullcontext(running),
                            platform=SimpleNamespace(is_cuda=True))
    windows = []

    def window(s, r, notes):
        windows.append(r)
        notes.append("profiled 64 decode steps")
        return {"tokens": 64}

    prefills = []
    monkeypatch.setattr(plugin_e2e, "decode_breakdown", window)
    monkeypatch.setattr(plugin_e2e, "prefill_breakdown", lambda s, r, prompt, notes: prefills.append(prompt) or {"tokens": 1})
    monkeypatch.setattr(plugin_e2e.bench, "PromptMaker", lambda client, seed: SimpleNamespace(make=lambda n: [0] * n))
    monkeypatch.setattr(plugin_e2e.bench, "run_workload", lambda *a, **k: SimpleNamespace(requests=[]))
    monkeypatch.setattr(plugin_e2e.bench, "metrics_for", lambda w, m: {})
    monkeypatch.setattr(plugin_e2e.bench, "gpu_prefill", lambda *a: {"samples": [1.0, 1.0, 1.0]})
    monkeypatch.setattr(plugin_e2e, "kernel_time_probe", lambda r: None)
    monkeypatch.setattr(plugin_e2e, "server_memory", lambda r, cuda: {})
    r = plugin_e2e.measure(suite, "gemv-bf16", [])
    assert windows == [running] and r["kernel_breakdown"] == {"tokens": 64}
    assert r["breakdown_notes"] == ["profiled 64 decode steps"]
    assert [len(p) for p in prefills] == [2048] and r["prefill_breakdown"] == {"tokens": 1}
    windows.clear()
    r = plugin_e2e.measure(suite, "gemv-bf16", [], None, plugin_e2e.PREFILL_GPU_ONLY)
    assert windows == [] and r["kernel_breakdown"] is None and "pp2048_gpu" in r["metrics"]
    assert len(prefills) == 2 and r["prefill_breakdown"] == {"tokens": 1}, "pp2048_gpu comes with where its time goes"
    ran = []
    monkeypatch.setattr(plugin_e2e.bench, "run_workload",
                        lambda client, maker, w: ran.append(w) or SimpleNamespace(requests=[]))
    r = plugin_e2e.measure(suite, "gemv-bf16", [], None, plugin_e2e.DECODE_ONLY_MODE)
    assert windows == [running] and "pp2048_gpu" not in r["metrics"]
    assert len(prefills) == 2 and r["prefill_breakdown"] is None, "a decode-only boot profiles no prefill"
    assert [(w.kind, w.concurrency, w.runs) for w in ran] == [("decode", 1, 24), ("decode", 1, 8)], ran
    assert r["token_gaps_ms"] == {"tg32": [], "tg128": []}, "each batch-1 decode workload keeps its token gaps"
    ran.clear()
    monkeypatch.setattr(plugin_e2e, "run_watched", lambda read, run: (run(), 32))
    r = plugin_e2e.measure(suite, "gemv-bf16", [], None, plugin_e2e.BATCH_ONLY_MODE)
    assert windows == [running] and "pp2048_gpu" not in r["metrics"], "a batch-only boot profiles nothing"
    assert len(prefills) == 2 and r["prefill_breakdown"] is None and r["kernel_breakdown"] is None
    assert [(w.kind, w.concurrency, w.runs) for w in ran] == [("concurrent", 4, 8), ("concurrent", 32, 8)], ran
    assert r["peak_running"] == {"tg32@c4": 32, "tg32@c32": 32}, "each batch records the most requests seen running"


@pytest.mark.parametrize("platform, stock", [("sm_90", "triton-bf16"), ("sm_121", "marlin-bf16"), ("cpu", None)])
def test_without_configs_the_stock_is_this_platforms_and_a_platform_without_one_is_one_line(
        tmp_path, monkeypatch, capsys, platform, stock):
    """The default run compares the plugin with the MoE stock vLLM serves on this platform: on GB10 vLLM refuses the
    Triton MoE, so a fixed triton-bf16 first would have been skipped and left the ratios without their stock."""
    from types import SimpleNamespace

    made = []

    def create(configs, *args):  # what main() asked for; no server is booted
        made.append(configs)
        raise plugin_e2e.SuiteError("stop")

    monkeypatch.setattr(plugin_e2e, "detect_platform", lambda: SimpleNamespace(name=platform))
    monkeypatch.setattr(plugin_e2e.Suite, "create", staticmethod(create))
    monkeypatch.setattr(sys, "argv", ["plugin_e2e.py", "--out", str(tmp_path)])
    assert plugin_e2e.main() == 2
    if stock:
        assert made == [f"{stock},gemv-bf16,gemv-bf16-mxfp4-all"]
    else:
        line = capsys.readouterr().out.strip()
        assert not made and "has no entry for cpu" in line and "--configs STOCK," in line and "\n" not in line, line
