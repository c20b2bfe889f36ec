"""How fast the host's CPU ran while level 4 measured: a fixed loop timed on the engine core's CPU after each round.

Why: on a Hopper host (H200, 2026-12-03) the plugin's batch-1 decode step followed the engine core's CPU time per token.
The same loop, pinned to the engine's CPU while the engine idled, took ~1.0 ms in some spells and ~1.7 ms in others.
There was no steal, no wait for a CPU and no change of SM clock. A decode that slowed because this host's CPU did is
not the change's fault, and a verdict must be able to say which it was. The loop tells "a slower CPU" apart from "more
host work per step", which the engine's CPU time alone cannot.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from harness.core import stats

LOOPS = 20000  # ~0.5-2 ms of pure Python (0.76 ms on a 2-core EPYC VM): long enough to time, short beside a round
# The loop's best of three varies ~2-3% between rounds on an idle CPU, so 10% is a slower CPU. The spells seen on an
# H200 host were ~40-70%.
SLOWER = 1.10


def loop_us(cpu: int | None) -> float | None:
    """The best of three timings of a fixed pure-Python loop on `cpu` (None: wherever this thread runs), in us; None
    where the CPU cannot be chosen. Pins the calling thread only (Linux affinity is per thread) and gives its
    affinity back."""
    if cpu is not None and not hasattr(os, "sched_setaffinity"):
        return None
    saved = os.sched_getaffinity(0) if cpu is not None else None
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            x = 0
            for i in range(LOOPS):
                x += i * i % 7
            best = min(best, (time.perf_counter() - t0) * 1e6)
        return best
    except OSError:  # a CPU outside this process's cpuset
        return None
    finally:
        if saved is not None:
            os.sched_setaffinity(0, saved)


def engine_core(pids: list[int]) -> int | None:
    """The engine core among a vLLM server's processes: vLLM titles it `VLLM::EngineCore`."""
    for pid in pids:
        try:
            p = psutil.Process(pid)
            title = " ".join(p.cmdline()) + " " + p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "EngineCor" in title:
            return pid
    return None


class HostCpuProbe:
    """`after_round()` times the loop on the CPU the engine core last ran on; `describe()` is the results section."""

    def __init__(self, pids: Callable[[], list[int]]):
        self._pids = pids
        self.samples: list[float] = []
        self.cpus: set[int] = set()
        self.reason: str | None = None

    def after_round(self) -> None:
        pid = engine_core(self._pids())
        if pid is None:
            self.reason = "no engine core process found (an external server, or a vLLM without one)"
            return
        try:
            cpu = psutil.Process(pid).cpu_num()
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            self.reason = "the engine core's CPU cannot be read on this OS"
            return
        us = loop_us(cpu)
        if us is None:
            self.reason = f"CPU {cpu} cannot be chosen from this process"
            return
        self.samples.append(round(us, 1))
        self.cpus.add(cpu)

    def describe(self) -> dict[str, Any]:
        if not self.samples:
            return {"available": False, "reason": self.reason or "no measured round"}
        return {"available": True, "loop_us": self.samples, "median_us": round(stats.median(self.samples), 1),
                "cv": round(stats.cv(self.samples), 4) if len(self.samples) > 1 else None,
                "cpus": sorted(self.cpus), "loops": LOOPS,
                "what": "best of three timings of a fixed Python loop on the engine core's CPU after each round"}


def _median(section: object) -> float | None:
    if not isinstance(section, Mapping) or section.get("loops") != LOOPS:
        return None  # absent, unavailable, or another loop: not comparable
    value = section.get("median_us")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def compare(baseline: Mapping, current: Mapping) -> str | None:
    """One sentence on this run's host CPU speed against the baseline's, for a decode that slowed on the host side;
    None when either side did not record it."""
    b, c = _median(baseline.get("host_cpu")), _median(current.get("host_cpu"))
    if b is None or c is None:
        return None
    ratio = c / b
    said = f"the fixed loop on the engine core's CPU took {c:.0f} us against the baseline's {b:.0f} ({ratio - 1:+.0%})"
    if ratio > SLOWER:
        return f"{said}: this host's CPU ran slower, not the change's host work"
    if ratio < 1 / SLOWER:
        return f"{said}: this host's CPU ran faster, so the host work per step grew (the change, or vLLM)"
    return f"{said}: the CPU ran at the baseline's speed, so the host work per step grew (the change, or vLLM)"
