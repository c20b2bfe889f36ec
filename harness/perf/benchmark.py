"""Run the level 4 benchmark on a server and write the results file (metadata, validity, memory, clocks)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from harness.core.store import write_atomic
from harness.engine.process_memory import MemorySampler
from harness.engine.server_metrics import SPEC_COUNTERS, spec_decode_between
from harness.kernelpath.traces import profile
from harness.perf import bench, memory, metadata
from harness.perf.clocks import ClockSampler
from harness.perf.host_cpu import HostCpuProbe
from harness.perf.regression import THRESHOLDS_FILE, load_thresholds
from harness.perf.results import RESULTS_DIR, results_name
from harness.session.suite import RunningServer, Suite


def round_policy(platform_name: str) -> tuple[bench.RoundPolicy, float | None]:
    """Rounds and clock floor from the gate's thresholds: the CI of a median ratio should be about a
    third of the gate wide (+-1% at the 3% gate), so a 3% change is resolved, not guessed."""
    t = load_thresholds(THRESHOLDS_FILE, platform_name)
    return bench.RoundPolicy(half_width=min(t.throughput_drop, t.latency_rise) / 3), t.loaded_clock_floor


def kernel_time_probe(server: RunningServer) -> Callable[[Callable[[], None]], float]:
    """A request run under the server's torch profiler -> the summed GPU kernel microseconds of its trace."""
    def one(request) -> float:
        summary = profile(server.url, server.trace_dir, request, "kernel")
        # only the sum is kept: a trace per round would bloat the run's artifacts (level 1.5 keeps its own)
        Path(summary.source).unlink(missing_ok=True)
        return sum(k.total_us for k in summary.kernels)

    return one


def server_flags(server: RunningServer) -> tuple[list[str], dict[str, str], str]:
    """The vLLM flags and environment a server runs with, and where they were read. A booted server's are its own
    (the config's, then --server-arg values and the suite's additions such as a side server's
    --gpu-memory-utilization): level 5 names a flag change between a baseline and a run from them. An external
    server's are unknown to the suite: the config's are recorded, and said to be."""
    if server.process is not None:
        return list(server.process.argv_extra), dict(server.process.env_extra), "the booted server's argv and env"
    spec = server.target.spec
    return (list(spec.args) if spec else [], dict(spec.env) if spec else {}, "config (external server)")


def run_benchmark(suite: Suite, server: RunningServer, kernel_path, workloads_file: Path | None = None,
                  tag: str = "", kinds: set[str] | None = None) -> dict[str, Any]:
    """The level 4 results dict (harness.report.run_report format), also written under the run directory.

    `kinds` keeps only some workload kinds (prefill / decode / latency / concurrent)."""
    client = server.client()
    models = client.get("/v1/models").json()["data"]
    max_len = int(models[0].get("max_model_len") or 4096)
    workloads_file = workloads_file or bench.WORKLOADS_FILE
    workloads, dropped = bench.load_workloads(suite.platform.name, max_len, workloads_file)
    if kinds is not None:
        workloads = [w for w in workloads if w.kind in kinds]
    maker = bench.PromptMaker(client)
    metrics: dict[str, dict] = {}
    owners: dict[str, bench.Workload] = {}  # which workload yielded each metric
    clocks: set[str] = set()
    started = time.time()
    on_gpu = suite.platform.is_cuda
    mem_section = memory.server_memory(server, on_gpu)  # before any benchmark request
    policy, floor = round_policy(suite.platform.name)
    sampler = ClockSampler(floor=floor) if on_gpu else None
    pids = server.process.pids if server.process else (lambda: [])
    host_probe = HostCpuProbe(pids)
    speculative = server.target.config.values.get("spec", "off") != "off"
    spec_decode: dict[str, dict] = {}
    try:
        with MemorySampler(pids) as mem:
            for w in workloads:
                measured = bench.run_workload(client, maker, w, sampler, policy, host_probe)
                clocks.add("engine" if measured.engine else "client")
                yielded = bench.metrics_for(w, measured)
                # the loader refuses shapes that share a name; this keeps any that got through from replacing numbers
                bench.claim_metrics(owners, w, yielded, workloads_file)
                metrics.update(yielded)
                # the counters of the measured rounds, summed from zero (run_workload reads them around those only)
                counters = spec_decode_between(dict.fromkeys(SPEC_COUNTERS, 0.0), measured.spec_counters) \
                    if speculative else None
                if counters and w.kind == "decode":  # a kernel change that loses precision drops acceptance first
                    spec_decode[w.label] = {k: round(v, 4) for k, v in counters.items()}
            if on_gpu and server.trace_dir is not None:  # a server the suite booted, so it can profile
                for w in workloads:
                    if bench.has_kernel_metric(w):
                        metrics[bench.kernel_metric_name(w)] = bench.gpu_rate(client, maker, w, kernel_time_probe(server),
                                                                              sampler)
    finally:
        clock_info = sampler.describe() if sampler is not None else {
            "available": False, "reason": f"{suite.platform.name}: no GPU clocks to sample"}
        if sampler is not None:
            sampler.close()
    verdict_ok = bool(kernel_path is not None and kernel_path.verdict.ok)
    flags, env, flags_source = server_flags(server)
    results = {
        "config": server.target.name,
        "flavour": suite.flavour.name,  # the same config name runs other kernels under another flavour
        "model": suite.model.alias,
        "model_fingerprint": suite.model.fingerprint,  # embedded models: the weights' identity
        "platform": suite.platform.name,
        "device": suite.platform.device,
        "valid": verdict_ok,
        "invalid_reason": None if verdict_ok else (
            "; ".join(kernel_path.verdict.problems) if kernel_path is not None else "no kernel-path check (external server)"),
        "kernel_summary": str(kernel_path.artifact) if kernel_path is not None else None,
        # patterns that passed only by a documented fallback's log line: these numbers are the fallback backend's
        "kernel_path_excused": list(kernel_path.verdict.excused) if kernel_path is not None else [],
        # axis values no trace of this platform vouches for: a baseline from them needed --allow-unverified
        "kernel_patterns_unverified": list(server.target.spec.kernels.unverified) if server.target.spec else [],
        "metrics": metrics,
        # configs with a speculator: vLLM's draft / accepted counters over each decode workload, beside its tg
        "spec_decode": spec_decode if speculative else None,
        # gated (harness.perf.regression): what the model and engine use, and the KV capacity they leave
        "memory_used_gib": mem_section.get("used_gib"),
        "kv_capacity_tokens": mem_section.get("kv_capacity_tokens"),
        "memory": mem_section,
        # informational: the peak the process held during the benchmark (on GPUs: vLLM's reservation)
        "memory_peak_gb": round(mem.peak_gb, 3) if server.process else None,
        "memory_kind": ("gpu" if mem.peak_gpu is not None else "cpu_rss") if server.process else None,
        "clocks": clock_info,
        # informational: how fast this host's CPU ran (a host-side decode verdict compares it with the baseline's)
        "host_cpu": host_probe.describe(),
        "workload": {**bench.workload_record(workloads, dropped), "runs": workloads[0].runs if workloads else 0,
                     "max_runs": workloads[0].max_runs if workloads else 0,
                     "warmup": workloads[0].warmup if workloads else 0, "max_model_len": max_len,
                     "warmup_before_each_round": "one request of the measured prompt length (2 tokens generated)",
                     "ci_half_width_target": round(policy.half_width, 4),
                     "pp_tg_clock": " + ".join(sorted(clocks)) or None},
        "startup_time_s": round(server.boot_seconds, 1) if server.boot_seconds else None,
        "benchmark_seconds": round(time.time() - started, 1),
        "metadata": metadata.collect(suite.platform, suite.run_dir, env, flags, client.version(), flags_source),
    }
    out = suite.artifact(RESULTS_DIR, results_name(suite.model.alias, server.target.name, tag))
    write_atomic(out, json.dumps(results, indent=1))  # a run killed while writing leaves no half a results file
    results["results_file"] = str(out)
    return results
