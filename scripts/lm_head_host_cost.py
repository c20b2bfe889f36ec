#!/usr/bin/env python3
"""Host cost of one eager lm_head call: our MXFP4 op against stock's BF16 linear (CUDA GPU).

vLLM computes the logits outside its CUDA graphs, so with `SUITE_KERNELS=moe,dense` the plugin's lm_head op runs
its Python and its launch on the host every decode step. This times that host work per call (the time the call
takes to return, the GPU queue never full) and the GPU time per call (CUDA events around the loop), for the
plugin's custom op (what torch.compile puts in the CUDA graphs), the plugin's eager path (what vLLM's logits call
runs) and `torch.nn.functional.linear` on the BF16 weight:

    python3 scripts/lm_head_host_cost.py [--calls 300] [--out FILE.json]

A host time above the GPU time means the GPU waits for the host on every step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "plugins" / "site"))

from harness.plugin.options import positive_number  # noqa: E402

SHAPES = {"lm_head": (201088, 2880), "qkv_proj": (5120, 2880)}


def time_calls(fn, calls: int) -> dict:
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    host = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    stop.record()
    torch.cuda.synchronize()
    return {"host_us_median": round(statistics.median(host), 1), "host_us_p90": round(sorted(host)[int(0.9 * calls)], 1),
            "gpu_us_per_call": round(start.elapsed_time(stop) * 1000 / calls, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=positive_number(int), default=300)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("lm_head_host_cost: needs a CUDA GPU (it times our CUDA kernels' host path); run it on the GPU machine")
        return 2
    import suite_kernels
    from kernels.gemv import PackedLinear
    from kernels.mxfp4 import quantize_mxfp4
    from kernels.packed import pack_mxfp4

    threshold = suite_kernels.max_m()
    op = suite_kernels._linear_op()
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "threshold": threshold, "calls": a.calls, "rows": []}
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
        linear = PackedLinear(pack_mxfp4(*quantize_mxfp4(w.float())), threshold)
        p = linear.p
        suite_kernels._linears[p.words.data_ptr()] = linear  # as dense_method registers a layer's at load
        for m in (1, 4):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            variants = {
                "plugin op (torch.ops.suite_kernels.mxfp4_linear)": lambda: op(x, p.words, p.scales, None, n, k, threshold),
                "plugin eager path (suite_kernels.dense_forward)": lambda: suite_kernels.dense_forward(linear, x),
                "stock F.linear BF16": lambda: torch.nn.functional.linear(x, w),
            }
            for variant, fn in variants.items():
                row = {"layer": name, "m": m, "variant": variant, **time_calls(fn, a.calls)}
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
