"""Level 4 (the users' plan): throughput and latency with full reproducibility metadata.

Numbers are measured and recorded here; level 5 decides whether they regressed. A run whose level 1.5
kernel-path check failed is INVALID (the users' plan: "if validation fails, benchmark results are INVALID") and is never compared or stored as a baseline.
"""
import math

import pytest

from harness.core import stats

pytestmark = [pytest.mark.level4, pytest.mark.server]

PHASE7_KEYS = ("git_shas", "engine", "docker_image", "pip_freeze", "cuda", "gpu", "env_vars", "vllm_flags",
               "vllm_flags_source", "packages", "platform", "device")


def test_benchmark_ran_on_the_kernel_path_it_claims(perf_results):
    assert perf_results["valid"], f"results INVALID (a failed kernel-path check invalidates benchmarks): {perf_results['invalid_reason']}"


def test_every_metric_has_finite_positive_samples(perf_results):
    metrics = perf_results["metrics"]
    assert any(n.startswith("pp") for n in metrics) and any(n.startswith("tg") for n in metrics), list(metrics)
    for name, entry in metrics.items():
        bad = [s for s in entry["samples"] if not (math.isfinite(s) and s > 0)]
        assert not bad, f"{name}: bad samples {bad}"
    print(f"\n[{perf_results['config']} on {perf_results['platform']} ({perf_results['device']})]")
    for name, entry in sorted(metrics.items()):
        s = entry["samples"]
        m, sd = stats.mean_std(s)
        print(f"  {name:18s} {m:10.2f} ± {sd:7.2f} {entry['unit']:6s} cv {stats.cv(s) * 100:5.2f}%  n={len(s)}")
    mem = perf_results["memory"]
    print(f"  used memory {perf_results['memory_used_gib']} GiB ({mem.get('used_source')}); KV capacity "
          f"{perf_results['kv_capacity_tokens']} tokens; peak {perf_results['memory_peak_gb']} GB "
          f"({perf_results['memory_kind']}); cross-check: {(mem.get('cross_check') or {}).get('message')}")
    print(f"  results: {perf_results['results_file']}")


def test_results_record_the_phase7_metadata(perf_results):
    """Phase 7 fields are filled, not only present (a null says why next to it)."""
    meta = perf_results["metadata"]
    missing = [k for k in PHASE7_KEYS if k not in meta]
    assert not missing, f"results lack Phase 7 metadata {missing}"
    assert perf_results["workload"]["items"] and perf_results["startup_time_s"] is not None
    assert perf_results["kernel_summary"], "results do not point at their level 1.5 kernel summary"
    assert any(k.startswith("VLLM_") for k in meta["env_vars"]) or perf_results["platform"] != "cpu"
    assert meta["git_shas"]["suite"], "the suite's git SHA (or 'not a git checkout') is missing"
    engine = meta["engine"]
    assert engine["version"] and (engine["sha"] or engine["reason"]), f"engine identity unexplained: {engine}"
    assert meta["docker_image"] or meta["docker_image_reason"], "docker_image is null without a reason"
    if perf_results["platform"] != "cpu":
        nvml = meta["gpu"].get("nvml") or {}
        # the GPU the benchmark ran on (the first CUDA_VISIBLE_DEVICES entry: under xdist each worker has its own)
        index = int(meta["gpu"].get("index", 0))
        gpu = next((g for g in nvml.get("gpus") or [] if g.get("index") == index), {})
        assert nvml.get("driver") and meta["cuda"].get("driver_cuda"), f"driver / CUDA missing: {nvml}"
        for key in ("sm_mhz", "max_sm_mhz", "mem_mhz", "power_limit_w"):
            assert key in gpu, f"GPU {index}'s state lacks {key}: {gpu}"


def test_used_memory_and_kv_capacity_were_measured(perf_results, booted):
    """The gated memory numbers exist and say where they came from; the process agrees with vLLM."""
    mem = perf_results["memory"]
    assert perf_results["memory_used_gib"] and perf_results["memory_used_gib"] > 0.05, mem
    assert mem["used_source"], mem
    assert perf_results["kv_capacity_tokens"] and perf_results["kv_capacity_tokens"] > 0, mem.get("engine_log_lines")
    assert (mem.get("cross_check") or {}).get("ok") is not False, mem["cross_check"]["message"]
    assert perf_results["memory_peak_gb"] and perf_results["memory_peak_gb"] > 0.05, perf_results["memory_peak_gb"]


def test_gpu_rounds_carry_their_clocks(perf_results):
    """Every GPU sample says which SM / memory clock and power it ran at; rounds below load are set aside."""
    if perf_results["platform"] == "cpu":
        pytest.skip("cpu: no GPU clocks to record")
    if not (perf_results.get("clocks") or {}).get("available"):
        pytest.skip(f"no NVML clocks here: {(perf_results.get('clocks') or {}).get('reason')}")
    for name, entry in perf_results["metrics"].items():
        rounds = entry.get("rounds")
        assert rounds and len(rounds) == len(entry["samples"]), f"{name}: samples without clocks"
        assert all(r.get("sm_mhz") for r in rounds), f"{name}: a round without an SM clock reading"
        assert not any(r.get("flagged") for r in rounds), f"{name}: a flagged round was counted"


def test_the_hosts_cpu_speed_was_timed_after_every_measured_round(perf_results, booted):
    """A fixed loop on the engine core's CPU after each round: a decode that fails on the host side says from it
    whether this host's CPU ran slower than at the baseline (an H200 host's CPU ran ~40% slower in spells)."""
    section = perf_results["host_cpu"]
    if not section["available"] and section["reason"].startswith(("no engine core", "the engine core's CPU cannot")):
        pytest.skip(f"host CPU not timed: {section['reason']}")
    assert section["available"], f"host CPU not timed: {section.get('reason')}"
    meta = perf_results["metadata"]  # what timed the loop: a verdict compares timings of one Python and CPU model only
    assert meta["python"] and meta["cpu"], {k: meta.get(k) for k in ("python", "cpu")}
    work = perf_results["workload"]
    least = len(work["items"]) * work["runs"]  # every workload measures at least `runs` rounds
    samples = section["loop_us"]
    assert len(samples) >= least, f"{len(samples)} loop timings for at least {least} measured rounds"
    assert all(math.isfinite(x) and x > 0 for x in samples) and section["cpus"], section
