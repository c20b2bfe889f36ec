"""GPU timing helpers the measuring tools share (bench, read_floor, phase_timing); CUDA needed only when called.

One module so that the tools import it rather than each other: read_floor once took time_calls from bench, which
imports read_floor (an import circle hidden in a function-local import).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable

import torch


def time_calls(calls: list[Callable[[], object]], reps: int, inner: int) -> float:
    """Median microseconds per call; `calls[i % len(calls)]` is call i (rotation over buffers)."""
    for c in calls:  # compile / autotune / allocate outside timing
        c()
    torch.cuda.synchronize()
    inner = max(inner, len(calls))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(inner):
                calls[i % len(calls)]()
        run = graph.replay
    except Exception as e:  # noqa: BLE001 - fall back to eager launches, say so
        print(f"  (CUDA graph capture failed: {type(e).__name__}: {e}; timing eager launches)", file=sys.stderr)

        def run():
            for i in range(inner):
                calls[i % len(calls)]()

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(times)


def _time_eager(fn: Callable[[], object], reps: int) -> float:
    """Median microseconds of fn() timed with events, eager launches (for big, long calls)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def copy_bandwidth(reps: int) -> dict:
    """GB/s of 1 GiB device-to-device copies, counting bytes read + written, two ways: torch's
    copy_ (cudaMemcpyAsync) launched eagerly, and an SM elementwise kernel (x * 1 -> y). Inside a
    CUDA graph a D2D memcpy may go to the copy engines, which are slower than the SMs (seen here:
    ~2.7 TB/s vs ~4.3 on an H200), so neither graph replay nor a single method is the yardstick:
    the best of the two is."""
    n = 1 << 30  # bytes per buffer
    a = torch.randn(n // 4, device="cuda")
    b = torch.empty_like(a)
    res = {
        "memcpy_eager": 2 * n / (_time_eager(lambda: b.copy_(a), reps) * 1e-6) / 1e9,
        "sm_kernel": 2 * n / (_time_eager(lambda: torch.mul(a, 1.0, out=b), reps) * 1e-6) / 1e9,
    }
    del a, b
    torch.cuda.empty_cache()
    res["best"] = max(res.values())
    return {k: round(v, 1) for k, v in res.items()}


def n_buffers(bytes_each: int, l2: int, floor: int = 2) -> int:
    """Buffers to rotate over so that their total is >= 3x L2 (no call finds its bytes in L2), at least `floor`."""
    return max(floor, math.ceil(3 * l2 / bytes_each))
