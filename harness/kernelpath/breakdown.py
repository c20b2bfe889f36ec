"""Where decode time goes: the GPU kernels of a torch-profiler trace by category, per generated token.

The users' plan asks every feature review for a baseline analysis: kernel time by MoE / dense / attention /
other, launches per token, and how long the GPU waits for the CPU. The categories are data
(`Catalog.kernel_categories()`: the kernels each axis declares, then the flavours' `categories:`), so a
backend added to a flavour file is categorised without touching this module.

    decode = profile_decode_window(server, "kernel")          # harness/kernelpath/check.py
    b = breakdown(decode.summary.source, catalog.kernel_categories(), decode.inside)
    plot_breakdowns({"baseline": b0, "feature": b}, run_dir / "breakdown.png")
"""
from __future__ import annotations

import fnmatch
import os
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.config.catalog import KERNEL_CATEGORIES
from harness.core.errors import SuiteError
from harness.kernelpath.traces import read_trace

Categories = Sequence[tuple[str, Sequence[str]]]
# CUDA runtime calls that launch one kernel from the host; kernels replayed from a CUDA graph have none
HOST_LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                           "cudaLaunchCooperativeKernel"})
NAME_WIDTH = 120  # template-heavy names (FA3, CUTLASS) run to thousands of characters
# vLLM's range around each engine step: requests(scheduled tokens) with context (prefill) and generation (decode)
# work. The client's token count of a profiled window is a step or two off (the profiler starts and stops between
# steps the client does not see): in the feature verdicts of docs/evidence/sm_90-2026-11-26-features/ the 20b shape's
# per-layer kernels ran 24.7 times per counted token on 24 layers, ~3% more steps than tokens
STEP_RANGE = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


@dataclass
class TopKernel:
    name: str  # truncated to NAME_WIDTH
    calls: int
    us_per_token: float
    category: str
    # the same with overlaps counted once (see Breakdown.exclusive_us_per_token): a kernel launched early by
    # programmatic dependent launch holds its predecessor's tail in `us_per_token`, not here. None: written before
    exclusive_us_per_token: float | None = None


# host-side events: vLLM's own phase ranges (user_annotation: "gpu_model_runner: forward", "...: sample"), the
# operators and the CUDA runtime calls; their time says where a step's host time goes when the GPU waits for it
HOST_CATEGORIES = ("user_annotation", "cpu_op", "cuda_runtime", "python_function")


@dataclass
class HostRange:
    name: str  # digits folded to N ("execute_context_N(N)..."), truncated to NAME_WIDTH
    category: str  # the trace's cat
    calls_per_token: float
    us_per_token: float  # inclusive: a range's time includes what runs inside it


@dataclass
class Breakdown:
    """Per generated token, in microseconds unless said otherwise."""

    source: str  # the trace file
    tokens: int  # the divisor of every per-token number: the decode tokens vLLM's step ranges show, else the caller's
    us_per_token: dict[str, float]  # kernel time by category: moe, dense, attention, other
    total_us_per_token: float  # summed kernel time; more than busy when kernels overlap on several streams
    wall_us_per_token: float  # first kernel start to last kernel end
    busy_us_per_token: float  # union of the kernel intervals
    busy_fraction: float  # busy / wall
    launches_per_token: float  # kernel events
    host_launches_per_token: float | None  # cudaLaunchKernel & co (None: the trace has no CUDA runtime events)
    graph_launches_per_token: float | None  # cudaGraphLaunch (None: as above)
    top: list[TopKernel]
    # GPU idle between two kernels of different host launches (a graph replay, an eager kernel): the GPU waiting for
    # the host to launch the next thing; the rest of the idle lies inside one launch (a graph's node-to-node gaps).
    # None: the trace's kernels carry no correlation ids
    host_wait_us_per_token: float | None = None
    host_top: list[HostRange] | None = None  # the host events with the most time (None: a trace without any)
    # kernel time by category with overlaps counted once: while kernels overlap, the time goes to the one that started
    # first. A kernel launched early by programmatic dependent launch waits for its predecessor, so its duration
    # holds part of the predecessor's: the summed `us_per_token` counts that twice. These sum to busy_us_per_token.
    exclusive_us_per_token: dict[str, float] | None = None
    # where `tokens` came from: "trace" (vLLM's step ranges, `execute_context_C(c)_generation_G(g)`, in a whole
    # trace whose decode steps schedule one token per request) or "caller" (no ranges, a `window`, or speculative
    # decoding, whose ranges count scheduled draft tokens, not generated ones). None: written before ranges were read
    tokens_source: str | None = None
    caller_tokens: int | None = None  # what the caller counted (client-side, so a step or two off at the window's edges)
    prefill_steps: int | None = None  # steps with context tokens inside (a decode window has none); None: no ranges

    @property
    def idle_us_per_token(self) -> float:
        """GPU idle inside the window: the time no kernel ran (the CPU scheduling, launching, sampling)."""
        return self.wall_us_per_token - self.busy_us_per_token

    def to_json(self) -> dict:
        return {**asdict(self), "idle_us_per_token": self.idle_us_per_token}

    @classmethod
    def from_json(cls, data: dict) -> "Breakdown":
        # idle is derived; the feature verdicts add the unprofiled step's numbers beside these fields
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k not in ("top", "host_top")}
        host = data.get("host_top")
        return cls(**fields, top=[TopKernel(**t) for t in data["top"]],
                   host_top=None if host is None else [HostRange(**h) for h in host])


def busy_us_per_token(b: Mapping) -> float:
    """The GPU's busy time per token of a breakdown's JSON: the union of the kernels' intervals, not their summed
    durations (a kernel started early by programmatic dependent launch waits inside its duration, and the sum counts
    that wait twice; the plugin on the 120b shape, H200: 3,210 us summed against 2,600 busy per token). Results
    written before the union was recorded have the sum only."""
    return b.get("busy_us_per_token") or b["total_us_per_token"]


def tokens_note(b: Mapping) -> str | None:
    """One line on what a breakdown's JSON divided by, where a reader needs it: the step ranges disagreeing with the
    caller's count, or prefill steps inside what should be a decode window. None where there is nothing to say."""
    parts = []
    if b.get("tokens_source") == "trace" and b.get("caller_tokens") not in (None, b["tokens"]):
        parts.append(f"per token over the {b['tokens']} decode tokens of vLLM's step ranges in the trace "
                     f"(the client counted {b['caller_tokens']})")
    if b.get("prefill_steps"):
        parts.append(f"the trace holds {b['prefill_steps']} prefill step(s), whose kernel time is in these numbers")
    return "; ".join(parts) or None


def categorise(name: str, categories: Categories) -> str:
    """The category of the first entry with a glob matching `name` (case-sensitive, as every pattern of the
    suite); "other" when none does."""
    for category, patterns in categories:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return category
    return "other"


def breakdown(trace_path: str | os.PathLike, categories: Categories, tokens: int,
              window: tuple[float, float] | None = None, top: int = 12) -> Breakdown:
    """Kernel time by category, busy fraction and launches of a trace, per token.

    `tokens`: the decode steps the trace (or `window`) holds, as the caller counted them (profile_decode_window's
    `inside`). Where a whole trace (no `window`) has vLLM's step ranges and each decode step schedules one token per
    request, the generated tokens they show are the divisor instead. Not inside a `window`: ranges carry host times,
    kernels GPU times, and the host runs a step ahead, so the two would disagree at the window's edges.

    `window`: (start, end) on the trace's clock in us; only events starting inside count (None: the whole trace).
    Wall time is first kernel start to last kernel end, so idle before the first kernel (the profiler starting) is
    not counted."""
    if not isinstance(tokens, int) or tokens < 1:
        raise SuiteError(f"breakdown: tokens is {tokens!r}; pass the number of decode steps in the profiled window (>= 1)")
    lo, hi = window if window is not None else (float("-inf"), float("inf"))
    kernels, runtime = [], []
    decode_tokens, prefill_steps, one_per_request = 0, 0, True
    host_calls: dict[tuple[str, str], int] = defaultdict(int)
    host_dur: dict[tuple[str, str], float] = defaultdict(float)
    for ev in read_trace(Path(trace_path)).get("traceEvents", []):
        if "ts" not in ev or not lo <= float(ev["ts"]) < hi:
            continue
        if ev.get("cat") == "kernel" and "name" in ev:
            kernels.append(ev)
            continue
        if ev.get("cat") == "cuda_runtime":
            runtime.append(ev.get("name", ""))
        if ev.get("cat") == "user_annotation" and (step := STEP_RANGE.fullmatch(ev.get("name", ""))):
            if int(step[2]):  # a step with prefill work; its decode tokens (chunked prefill beside decodes) count too
                prefill_steps += 1
            decode_tokens += int(step[4])
            one_per_request = one_per_request and int(step[3]) == int(step[4])
        if ev.get("cat") in HOST_CATEGORIES and ev.get("ph") == "X":
            key = (re.sub(r"\d+", "N", ev.get("name", ""))[:NAME_WIDTH], ev["cat"])
            host_calls[key] += 1
            host_dur[key] += float(ev.get("dur", 0.0))
    if not kernels:
        where = f" between {lo} and {hi} us" if window is not None else ""
        raise SuiteError(f"breakdown: no GPU kernel events in {trace_path}{where}; profile a CUDA server "
                         "(kernel events come from CUPTI; a CPU trace has cpu_op events only)")

    caller_tokens, from_trace = tokens, bool(decode_tokens or prefill_steps)
    use_ranges = bool(decode_tokens) and one_per_request and window is None
    if use_ranges:
        tokens = decode_tokens
    calls: dict[str, int] = defaultdict(int)
    dur: dict[str, float] = defaultdict(float)
    spans = []
    for ev in kernels:
        start, d = float(ev["ts"]), float(ev.get("dur", 0.0))
        calls[ev["name"]] += 1
        dur[ev["name"]] += d
        spans.append((start, start + d, (ev.get("args") or {}).get("correlation"), ev["name"]))
    spans.sort(key=lambda s: (s[0], s[1]))
    has_correlation = all(c is not None for _, _, c, _ in spans)
    busy, host_wait, (run_start, run_end, run_corr, _) = 0.0, 0.0, spans[0]
    for start, end, corr, _ in spans[1:]:  # merge overlapping intervals: kernels on several streams count once
        if start > run_end:
            busy += run_end - run_start
            if corr != run_corr:  # the kernel that ended the busy run and the next one came from different launches
                host_wait += start - run_end
            run_start, run_end, run_corr = start, end, corr
        elif end > run_end:
            run_end, run_corr = end, corr
    busy += run_end - run_start
    wall = max(end for _, end, _, _ in spans) - spans[0][0]

    category = {name: categorise(name, categories) for name in calls}
    by_category = dict.fromkeys(KERNEL_CATEGORIES, 0.0)
    for name, d in dur.items():
        by_category[category[name]] = by_category.get(category[name], 0.0) + d / tokens
    by_name = _exclusive_time([(start, end, name) for start, end, _, name in spans])
    exclusive = dict.fromkeys(by_category, 0.0)
    for name, us in by_name.items():
        exclusive[category[name]] += us / tokens
    ranked = sorted(calls, key=lambda n: -dur[n])[:top]
    has_runtime = bool(runtime)
    return Breakdown(
        source=str(trace_path), tokens=tokens, us_per_token=by_category,
        total_us_per_token=sum(dur.values()) / tokens, wall_us_per_token=wall / tokens,
        busy_us_per_token=busy / tokens, busy_fraction=busy / wall if wall > 0 else 1.0,
        launches_per_token=len(kernels) / tokens,
        host_launches_per_token=sum(n in HOST_LAUNCHES for n in runtime) / tokens if has_runtime else None,
        graph_launches_per_token=runtime.count("cudaGraphLaunch") / tokens if has_runtime else None,
        top=[TopKernel(n[:NAME_WIDTH], calls[n], dur[n] / tokens, category[n], by_name.get(n, 0.0) / tokens)
             for n in ranked],
        host_wait_us_per_token=host_wait / tokens if has_correlation else None,
        host_top=[HostRange(n, c, host_calls[(n, c)] / tokens, host_dur[(n, c)] / tokens)
                  for n, c in sorted(host_dur, key=lambda key: -host_dur[key])[:top]] if host_dur else None,
        exclusive_us_per_token=exclusive, tokens_source="trace" if use_ranges else "caller",
        caller_tokens=caller_tokens, prefill_steps=prefill_steps if from_trace else None)


def _exclusive_time(spans: list[tuple[float, float, str]]) -> dict[str, float]:
    """Time per category with overlaps counted once, given (start, end, category) sorted by start: each stretch of
    time goes to the running kernel that started first (the one a PDL-launched successor waits for)."""
    out: dict[str, float] = defaultdict(float)
    active: list[tuple[float, float, str]] = []
    i, n = 0, len(spans)
    t = spans[0][0] if spans else 0.0
    while i < n or active:
        active = [a for a in active if a[1] > t]
        if not active:
            if i == n:
                break
            t = max(t, spans[i][0])
        while i < n and spans[i][0] <= t:
            if spans[i][1] > t:
                active.append(spans[i])
            i += 1
        if not active:
            continue
        owner = min(active)  # the earliest start
        nxt = min(min(a[1] for a in active), spans[i][0] if i < n else float("inf"))
        out[owner[2]] += nxt - t
        t = nxt
    return out


SEGMENT_COLOURS = {"moe": "tab:blue", "dense": "tab:orange", "attention": "tab:green", "other": "tab:gray",
                   "GPU idle": "white"}


def plot_breakdowns(named: Mapping[str, Breakdown], path: str | os.PathLike) -> Path:
    """One stacked bar per config, in the mapping's order (put the baseline first): kernel time per token by
    category, then GPU idle (wall - busy); the label over each bar gives wall time and busy fraction.

    Drawn on matplotlib's Agg canvas directly (no pyplot, no global backend), as harness/report does."""
    if not named:
        raise SuiteError("plot_breakdowns: no breakdowns given; pass {config name: breakdown(...)}")
    fig = Figure(figsize=(max(6.0, 1.5 * len(named) + 3), 5), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(named)))
    bottom = [0.0] * len(named)
    for segment, colour in SEGMENT_COLOURS.items():
        # overlaps counted once where the breakdown has them, so a bar's height is its wall time
        heights = [b.idle_us_per_token if segment == "GPU idle" else
                   (b.exclusive_us_per_token or b.us_per_token).get(segment, 0.0) for b in named.values()]
        ax.bar(xs, heights, 0.6, bottom=bottom, label=segment, color=colour, edgecolor="black", linewidth=0.5,
               hatch="//" if segment == "GPU idle" else None)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, height, b in zip(xs, bottom, named.values()):
        ax.text(x, height, f"wall {b.wall_us_per_token:.0f} us\nbusy {b.busy_fraction:.0%}", ha="center", va="bottom",
                fontsize=8)
    ax.set_xticks(xs, list(named), rotation=15 if len(named) > 3 else 0)
    ax.set_ylabel("us per generated token")
    ax.set_ylim(0, max(bottom) * 1.18 or 1.0)
    ax.set_title("Decode time per token: kernel time by category, then GPU idle (wall - busy)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=100)
    return path
