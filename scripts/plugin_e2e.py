#!/usr/bin/env python3
"""End-to-end decode speed of this repository's kernels inside vLLM (the suite_kernels plugin) against stock vLLM.

    python3 scripts/plugin_e2e.py --model gpt-oss-120b-shape --configs triton-bf16,gemv-bf16,gemv-bf16-mxfp4-all \
        --out DIR [--gpu-memory-utilization gemv-bf16=0.93]

Boots each config in turn the way the suite does (one GPU holds one gpt-oss-120b shape at a time), measures
the same workloads on each (engine clock, warm-up first, median of the rounds), stops it, and writes
`e2e.json` and `e2e.md` under --out after every config, so a call cut off by its time limit keeps what it
measured and a second call with the same --out measures only the configs still missing.

Workloads: tg32 and tg128 at batch 1 (16-token prompt, the seed's headline decode), tg32 at 4 concurrent
requests (M=4: still the plugin's small-batch path), tg32 at 32 concurrent requests (above the plugin's
threshold: vLLM's own MoE) and pp2048 (prefill: vLLM's own MoE). Ratios are against the first config.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.perf import bench

from harness.core import stats  # noqa: E402
from harness.core.errors import SuiteError  # noqa: E402
from harness.session.suite import Suite  # noqa: E402

WORKLOADS = (
    bench.Workload("decode", 16, 32, runs=8, warmup=3),
    bench.Workload("decode", 16, 128, runs=6, warmup=2),
    bench.Workload("concurrent", 16, 32, concurrency=4, runs=6, warmup=2),
    bench.Workload("concurrent", 16, 32, concurrency=32, runs=4, warmup=2),
    bench.Workload("prefill", 2048, 2, runs=6, warmup=2),
)
SHOWN = ("tg32", "tg128", "tg32@c4", "tg32@c32", "pp2048")
BREAKDOWN_TOKENS = 64  # one batch-1 request profiled for the kernel-time breakdown
CATEGORIES = (  # first match wins; our kernels: mxfp4_kernel<MODE,...> with MODE 0 dense, 1 gate_up, 2 down
    ("moe", re.compile(r"mxfp4_kernel<\s*[12]\b|route_kernel|matmul_ogs|moe|topk|marlin|swiglu|routing|expert", re.I)),
    ("attention", re.compile(r"flash|attn|attention|reshape_and_cache|paged", re.I)),
    ("dense", re.compile(r"mxfp4_kernel<\s*0\b|nvjet|gemm|gemv|cutlass|cublas|xmma|splitk", re.I)),
)


def kernel_breakdown(summary, tokens: int) -> dict:
    """GPU kernel time of one profiled batch-1 request, per generated token, by category."""
    us = {"moe": 0.0, "attention": 0.0, "dense": 0.0, "other": 0.0}
    for k in summary.kernels:
        cat = next((c for c, rx in CATEGORIES if rx.search(k.name)), "other")
        us[cat] += k.total_us
    total = sum(us.values())
    return {"tokens": tokens, "us_per_token": {c: round(v / tokens, 1) for c, v in us.items()},
            "total_us_per_token": round(total / tokens, 1),
            "top": [(k.name[:120], k.calls, round(k.total_us / tokens, 1)) for k in summary.kernels[:12]]}


def measure(suite: Suite, name: str, args_extra: list[str]) -> dict:
    target = next(t for t in suite.targets() if t.name == name)
    if not target.runnable:
        return {"skipped": target.reason}
    t0 = time.monotonic()
    with suite.boot(target, tag="__e2e", args_extra=args_extra) as running:
        client = running.client(timeout_s=600)
        maker = bench.PromptMaker(client, seed=7)
        metrics: dict[str, dict] = {}
        for w in WORKLOADS:
            m = bench.run_workload(client, maker, w)
            for metric, entry in bench.metrics_for(w, m).items():
                metrics[metric] = {"median": stats.median(entry["samples"]), "cv": stats.cv(entry["samples"]),
                                   "n": len(entry["samples"])}
        breakdown = None
        if running.trace_dir is not None:  # the prefill of the 16-token prompt is included (one step)
            from harness.kernelpath.traces import profile

            w = bench.Workload("decode", 16, BREAKDOWN_TOKENS, runs=1, warmup=0)
            summary = profile(running.url, running.trace_dir, lambda: bench.run_workload(client, maker, w), "kernel")
            breakdown = kernel_breakdown(summary, BREAKDOWN_TOKENS)
        log = running.log_path.read_text(errors="replace") if running.log_path else ""
        return {"boot_s": round(running.boot_seconds, 1), "total_s": round(time.monotonic() - t0, 1),
                "args_extra": args_extra, "metrics": metrics, "kernel_breakdown": breakdown,
                "plugin_lines": [ln.strip()[-220:] for ln in log.splitlines() if "suite_kernels" in ln][:40]}


def table(results: dict[str, dict], order: list[str]) -> list[str]:
    ref = next((results[c]["metrics"] for c in order if "metrics" in results.get(c, {})), None)
    head = "| config | boot (s) | " + " | ".join(f"{m} tok/s (ratio)" for m in SHOWN) + " |"
    lines = [head, "|" + "---|" * (len(SHOWN) + 2)]
    for c in order:
        r = results.get(c)
        if r is None:
            lines.append(f"| {c} | not measured (time limit) |" + " |" * len(SHOWN))
            continue
        if "metrics" not in r:
            lines.append(f"| {c} | {r.get('skipped') or r.get('error')} |" + " |" * len(SHOWN))
            continue
        cells = []
        for m in SHOWN:
            v = r["metrics"].get(m, {}).get("median")
            base = (ref or {}).get(m, {}).get("median")
            cells.append("n/a" if v is None else f"{v:.1f} ({v / base:.2f}x)" if base else f"{v:.1f}")
        lines.append(f"| {c} | {r['boot_s']} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-120b-shape")
    ap.add_argument("--configs", default="triton-bf16,gemv-bf16,gemv-bf16-mxfp4-all")
    ap.add_argument("--gpu-memory-utilization", action="append", default=[], metavar="CONFIG=FRACTION",
                    help="per-config override (the plugin keeps a second copy of the experts)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--boot-timeout", type=float, default=900)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    order = [c.strip() for c in a.configs.split(",") if c.strip()]
    util = dict(kv.split("=", 1) for kv in a.gpu_memory_utilization)
    res_file = out / "e2e.json"
    results: dict[str, dict] = json.loads(res_file.read_text())["results"] if res_file.is_file() else {}
    try:
        suite = Suite.create(",".join(order), a.model, None, None, str(out / "suite-run"), a.boot_timeout)
    except SuiteError as e:
        print(f"plugin_e2e: {e}")
        return 2
    for name in order:
        if "metrics" in results.get(name, {}):
            continue
        extra = ["--gpu-memory-utilization", util[name]] if name in util else []
        print(f"plugin_e2e: {name} {' '.join(extra)}", flush=True)
        try:
            results[name] = measure(suite, name, extra)
        except SuiteError as e:
            results[name] = {"error": str(e).splitlines()[0][:300]}
        res_file.write_text(json.dumps({"model": a.model, "platform": suite.platform.name,
                                        "device": suite.platform.device, "results": results}, indent=1))
        md = [f"# Kernels plugin end to end: {a.model} on {suite.platform.device} ({suite.platform.name})", "",
              "Engine clock, medians after warm-up; ratio against the first config.", ""] + table(results, order)
        md += ["", "Kernel time per generated token (us), one profiled batch-1 request of "
               f"{BREAKDOWN_TOKENS} tokens:", "", "| config | ms/token (tg32) | MoE | dense | attention | other | kernels total |",
               "|---|---|---|---|---|---|---|"]
        for c in order:
            r = results.get(c, {})
            b, tg = r.get("kernel_breakdown"), r.get("metrics", {}).get("tg32", {}).get("median")
            if b:
                u = b["us_per_token"]
                md.append(f"| {c} | {1000 / tg:.2f} | {u['moe']} | {u['dense']} | {u['attention']} | {u['other']} | "
                          f"{b['total_us_per_token']} |" if tg else f"| {c} | n/a | | | | | |")
        (out / "e2e.md").write_text("\n".join(md) + "\n")
        print("\n".join(md[4:]), flush=True)
    return 0 if all("metrics" in results.get(c, {}) or "skipped" in results.get(c, {}) for c in order) else 1


if __name__ == "__main__":
    raise SystemExit(main())
