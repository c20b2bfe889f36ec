"""Level 4 (seed 000): throughput and latency with full reproducibility metadata.

Numbers are measured and recorded here; level 5 decides whether they regressed. A run whose level 1.5
kernel-path check failed is INVALID (seed 000) and is never compared or stored as a baseline.
"""
import math

import pytest

from harness import stats

pytestmark = [pytest.mark.level4, pytest.mark.server]

PHASE7_KEYS = ("git_shas", "docker_image", "pip_freeze", "cuda", "gpu", "env_vars", "vllm_flags", "packages", "platform", "device")


def test_benchmark_ran_on_the_kernel_path_it_claims(perf_results):
    assert perf_results["valid"], f"results INVALID (seed 000): {perf_results['invalid_reason']}"


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
    print(f"  peak memory {perf_results['memory_peak_gb']} GB ({perf_results['memory_kind']}); results: {perf_results['results_file']}")


def test_results_record_the_phase7_metadata(perf_results):
    meta = perf_results["metadata"]
    missing = [k for k in PHASE7_KEYS if k not in meta]
    assert not missing, f"results lack Phase 7 metadata {missing}"
    assert perf_results["workload"]["items"] and perf_results["startup_time_s"] is not None
    assert perf_results["kernel_summary"], "results do not point at their level 1.5 kernel summary"
    assert any(k.startswith("VLLM_") for k in meta["env_vars"]) or perf_results["platform"] != "cpu"


def test_peak_memory_was_measured(perf_results, booted):
    assert perf_results["memory_peak_gb"] and perf_results["memory_peak_gb"] > 0.05, perf_results["memory_peak_gb"]
