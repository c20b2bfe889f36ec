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

LOOP = "sum(i * i % 7 for i < LOOPS), best of 3"  # changing the loop's body makes older timings incomparable
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
        try:  # informational: nothing here may stop a level 4 run
            self._time_engine_cpu()
        except Exception as e:  # noqa: BLE001
            self.reason = f"the loop could not be timed ({type(e).__name__}: {e})"

    def _time_engine_cpu(self) -> None:
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
        return section(self.samples, self.cpus, self.reason)


def section(samples: list[float], cpus: set[int], reason: str | None) -> dict[str, Any]:
    """The results' `host_cpu` section from the loop's timings and the CPUs they ran on."""
    if not samples:
        return {"available": False, "reason": reason or "no measured round"}
    return {"available": True, "loop_us": samples, "median_us": round(stats.median(samples), 1),
            "cv": round(stats.cv(samples), 4) if len(samples) > 1 else None,
            "cpus": sorted(cpus), "loops": LOOPS, "loop": LOOP,
            "what": "best of three timings of a fixed Python loop on the engine core's CPU after each round"}


def summary(section: object) -> str | None:
    """`section` (a results' `host_cpu`) in words for the run report and the gates summary; None where not timed."""
    if not isinstance(section, Mapping) or not section.get("available"):
        return None
    median = section.get("median_us")
    if isinstance(median, bool) or not isinstance(median, (int, float)) or not math.isfinite(median):
        return None  # not timed, or a section without a usable median (a hand-edited file)
    cv = f", CV {section['cv'] * 100:.1f}%" if isinstance(section.get("cv"), (int, float)) else ""
    varied = loop_cv(section)
    if varied is not None and varied > UNSTEADY:
        cv += f" (the CPU changed speed or load: a steady one stays under {UNSTEADY:.0%})"
    return (f"{section['median_us']:.0f} us median over {len(section.get('loop_us') or [])} rounds{cv}, on CPUs "
            f"{', '.join(map(str, section.get('cpus') or []))}")


def _what_ran_it(run: Mapping) -> dict[str, str | None]:
    """The interpreter (major.minor: a pure-Python loop's speed changes between versions) and CPU model that timed the
    loop, from the results' own metadata (harness.perf.metadata, written by the same process)."""
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    python = meta.get("python")
    return {"Python": ".".join(str(python).split(".")[:2]) if python else None, "CPU model": meta.get("cpu")}


def _median(section: object) -> float | None:
    if not isinstance(section, Mapping) or section.get("loops") != LOOPS or section.get("loop") != LOOP:
        return None  # absent, unavailable, or another loop: not comparable
    value = section.get("median_us")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


_IDLE_HOST = "rerun on an idle host, or run scripts/host_spells.py --config <config> --model <model>, to tell them apart"


def compare(baseline: Mapping, current: Mapping, step_growth: float) -> str | None:
    """What the host CPU's speed says about a decode step that grew by `step_growth` (current step over the
    baseline's, > 1) while its kernels held; None when either side did not time the loop. A CPU slower by at least
    the step's growth explains it: the step is host work plus GPU time, and only the host part can grow with the CPU.
    The loop cannot see another process taking the CPU between its ~1 ms timings, nor a neighbour on the cache or
    memory bus, so a CPU at its baseline speed does not clear the host."""
    b, c = _median(baseline.get("host_cpu")), _median(current.get("host_cpu"))
    if b is None or c is None:
        return None
    b_ran, c_ran = _what_ran_it(baseline), _what_ran_it(current)
    for what, ran in b_ran.items():
        if ran is None or ran != c_ran[what]:
            return (f"the host CPU timings cannot be compared ({what} {ran} at the baseline, {c_ran[what]} now); "
                    f"{_IDLE_HOST}")
    ratio = c / b
    said = f"the fixed loop on the engine core's CPU took {c:.0f} us against the baseline's {b:.0f} us ({ratio - 1:+.0%})"
    if ratio > SLOWER and ratio >= step_growth:
        return f"{said}, so this host's CPU ran slower, enough to explain the step's x{step_growth:.2f}"
    if ratio > SLOWER:
        return (f"{said}, so this host's CPU ran slower, which explains part of the step's x{step_growth:.2f}; the rest "
                f"is host work the change added or another load ({_IDLE_HOST})")
    speed = "faster than" if ratio < 1 / SLOWER else "at"
    return (f"{said}, so the CPU itself ran {speed} the baseline's speed: the host work per step grew, or another load "
            f"competed for the host ({_IDLE_HOST})")


# Above this CV of the loop over a boot the host's CPU changed speed (or load) under the engine: a steady CPU gave
# 2.8% (an H200 host's fast spell, 7 rounds) and 6.8% (a 2-core VM, 60 timings with nothing else running); boots with
# speed spells gave 21.6-24.8% (H200 hosts, 2026-12-03), the CPU platform's boots 22-25% (the engine's threads share
# its two cores).
UNSTEADY = 0.15


# At or below this CV over a boot, an engine-clock decode held its speed: beside a loop that varied beyond UNSTEADY, it
# did not follow the host's CPU. On H200 hosts whose loop varied by CV 22.6-27.1% (2026-12-03), stock marlin-bf16's
# decode (120b shape) held tg32 at 0.26% and tg128 at 0.04%, while the plugin's host-bound decode varied by 7-17%.
STEADY = 0.01


def held_steady(run: Mapping, samples: object) -> bool:
    """Whether a decode metric's `samples` of `run` held within STEADY over a boot in which the host's CPU changed speed
    (`run`'s loop CV above UNSTEADY): that decode did not follow the host. False where the loop was steady or not
    timed (nothing was shown) or the samples are too few to say."""
    cv = loop_cv(run.get("host_cpu"))
    if cv is None or cv <= UNSTEADY or not isinstance(samples, list) or len(samples) < 3:
        return False
    try:
        return stats.cv(samples) <= STEADY
    except (TypeError, ValueError):
        return False


def loop_cv(section: object) -> float | None:
    """The loop's CV over a boot from a results' `host_cpu` section; None where it was not timed or is not a number."""
    if not isinstance(section, Mapping) or not section.get("available"):
        return None
    value = section.get("cv")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def unsteady(baseline: Mapping, current: Mapping, names: tuple[str, str] = ("the baseline", "this run")) -> str | None:
    """Why a run-to-run noisy engine- or client-clock metric is noisy, where the loop says the host's CPU changed speed
    during a side's boots (`names`: the two sides in words); None where neither side's loop varied beyond UNSTEADY (or
    neither timed it). The loop is timed after each round, not during it, so it tells the host's state over a boot,
    not which rounds ran slow: on an H200 host the loop after a round and that round's decode speed (tg32, tg128)
    correlated at |r| <= 0.6 (2026-12-03)."""
    cvs = dict(zip(names, (loop_cv(baseline.get("host_cpu")), loop_cv(current.get("host_cpu")))))
    unsteady_sides = [name for name, cv in cvs.items() if cv is not None and cv > UNSTEADY]
    if not unsteady_sides:
        return None
    which = "both sides' boots" if len(unsteady_sides) == 2 else f"{unsteady_sides[0]}'s boot"
    timed = ", ".join(f"{name} {cv:.1%}" for name, cv in cvs.items() if cv is not None)
    return (f"the host's CPU changed speed or load during {which} (the fixed loop on the engine core's CPU varied by "
            f"CV: {timed}; a steady CPU's: 3-7%), so more rounds or locked GPU clocks will not remove this noise; "
            f"rerun on an idle host (scripts/host_spells.py --config <config> --model <model> shows a host's speed "
            f"spells)")
