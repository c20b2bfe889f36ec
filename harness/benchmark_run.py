"""Run the level 4 benchmark on a server and write the results file (metadata, validity, memory)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness import bench, metadata
from harness.memory import MemorySampler
from harness.suite import RunningServer, Suite


def run_benchmark(suite: Suite, server: RunningServer, kernel_path, workloads_file: Path | None = None,
                  tag: str = "", kinds: set[str] | None = None) -> dict[str, Any]:
    """The level 4 results dict (harness.reports format), also written under the run directory.

    `kinds` keeps only some workload kinds (prefill / decode / latency / concurrent)."""
    client = server.client()
    models = client.get("/v1/models").json()["data"]
    max_len = int(models[0].get("max_model_len") or 4096)
    workloads, dropped = bench.load_workloads(suite.platform.name, max_len, workloads_file or bench.WORKLOADS_FILE)
    if kinds is not None:
        workloads = [w for w in workloads if w.kind in kinds]
    maker = bench.PromptMaker(client)
    metrics: dict[str, dict] = {}
    clocks: set[str] = set()
    started = time.time()
    pids = server.process.pids if server.process else (lambda: [])
    with MemorySampler(pids) as mem:
        for w in workloads:
            measured = bench.run_workload(client, maker, w)
            clocks.add("engine" if measured.engine else "client")
            metrics.update(bench.metrics_for(w, measured))
    verdict_ok = bool(kernel_path is not None and kernel_path.verdict.ok)
    spec = server.target.spec
    results = {
        "config": server.target.name,
        "model": suite.model.alias,
        "platform": suite.platform.name,
        "device": suite.platform.device,
        "valid": verdict_ok,
        "invalid_reason": None if verdict_ok else (
            "; ".join(kernel_path.verdict.problems) if kernel_path is not None else "no kernel-path check (external server)"),
        "kernel_summary": str(kernel_path.artifact) if kernel_path is not None else None,
        "metrics": metrics,
        "memory_peak_gb": round(mem.peak_gb, 3) if server.process else None,
        "memory_kind": ("gpu" if mem.peak_gpu is not None else "cpu_rss") if server.process else None,
        "workload": {**bench.workload_record(workloads, dropped), "runs": workloads[0].runs if workloads else 0,
                     "warmup": workloads[0].warmup if workloads else 0, "max_model_len": max_len,
                     "pp_tg_clock": " + ".join(sorted(clocks)) or None},
        "startup_time_s": round(server.boot_seconds, 1) if server.boot_seconds else None,
        "benchmark_seconds": round(time.time() - started, 1),
        "metadata": metadata.collect(suite.platform, suite.run_dir, spec.env if spec else {}, spec.args if spec else [],
                                     client.version()),
    }
    out = suite.artifact("results", f"{suite.model.alias}__{server.target.name}{tag}.json")
    out.write_text(json.dumps(results, indent=1))
    results["results_file"] = str(out)
    return results
