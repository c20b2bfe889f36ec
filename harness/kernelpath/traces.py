"""Kernel paths from torch-profiler traces of a running vLLM server.

The server is started with `--profiler-config` (see `profiler_args`); `profile()` wraps a workload in
POST /start_profile and /stop_profile and parses the worker's gzipped Chrome-trace JSON into a kernel
summary: GPU `kernel` events on CUDA, `cpu_op` events on CPU (vLLM's CPU kernels are ops such as
`_C::cpu_fused_moe`). The summary is kept as a run artifact; the perf levels refuse results from a
run whose kernel-path check failed.
"""
from __future__ import annotations

import fnmatch
import gzip
import json
import math
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import requests

from harness.config.catalog import KernelExpectation
from harness.engine.server import LOG_HEADER
from harness.core.errors import SuiteError


@dataclass
class KernelStat:
    name: str
    calls: int
    total_us: float
    share: float  # of the summed time of all events counted


@dataclass
class KernelSummary:
    source: str  # trace file
    event_kind: str  # "kernel" (GPU) or "cpu_op" (CPU)
    kernels: list[KernelStat]
    attention_calls: list[dict] = field(default_factory=list)  # CPU attention op arguments (sinks check)

    def names(self) -> list[str]:
        return [k.name for k in self.kernels]

    def matching(self, pattern: str) -> list[KernelStat]:
        return [k for k in self.kernels if fnmatch.fnmatchcase(k.name, pattern)]

    def top(self, n: int = 15) -> str:
        rows = [f"{k.share * 100:6.2f}% {k.calls:6d}x  {k.name[:150]}" for k in self.kernels[:n]]
        return "\n".join(rows)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "KernelSummary":
        return cls(data["source"], data["event_kind"], [KernelStat(**k) for k in data["kernels"]], data.get("attention_calls", []))


def read_trace(path: Path) -> dict:
    """The Chrome-trace JSON of a gzipped torch-profiler trace (`traceEvents` and metadata)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, EOFError, RecursionError) as e:  # ValueError: bad JSON and bytes that are not UTF-8
        raise SuiteError(f"trace {path} is unreadable ({type(e).__name__}: {str(e)[:160]}); re-run the level 1.5 "
                         "profile") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list) \
            or not all(isinstance(ev, dict) for ev in data["traceEvents"]):
        # a missing traceEvents read as "no kernel ran", naming a required kernel instead of the broken file
        raise SuiteError(f"trace {path} is not a Chrome trace (a JSON object whose traceEvents is a list of events); "
                         "re-run the level 1.5 profile")
    return data


def parse_trace(path: Path, event_kind: str) -> KernelSummary:
    data = read_trace(path)
    calls: dict[str, int] = defaultdict(int)
    dur: dict[str, float] = defaultdict(float)
    attention = []
    for ev in data["traceEvents"]:
        if ev.get("cat") != event_kind or "name" not in ev:
            continue
        name, us = ev["name"], ev.get("dur", 0.0)
        if not isinstance(name, str) or isinstance(us, bool) or not isinstance(us, (int, float)) \
                or not math.isfinite(us) or us < 0:
            raise SuiteError(f"trace {path}: a {event_kind} event with name {str(name)[:60]!r} and duration {us!r} "
                             "(a name must be text, a duration a finite number); re-run the level 1.5 profile")
        calls[name] += 1
        dur[name] += float(us)
        if ev["name"] == "_C::cpu_attention_with_kv_cache" and len(attention) < 64:
            args = ev.get("args", {})
            attention.append({"dims": args.get("Input Dims"), "concrete": args.get("Concrete Inputs")})
    total = sum(dur.values()) or 1.0
    stats = sorted((KernelStat(n, calls[n], dur[n], dur[n] / total) for n in calls), key=lambda k: -k.total_us)
    return KernelSummary(str(path), event_kind, stats, attention)


def profile(base_url: str, trace_dir: Path, workload: Callable[[], None], event_kind: str, timeout_s: float = 180) -> KernelSummary:
    """Profile `workload` on a server started with `profiler_args(trace_dir)`."""
    before = set(trace_dir.glob("*.pt.trace.json.gz")) if trace_dir.exists() else set()
    r = _profiler_post(base_url, "/start_profile", 60)
    if r.status_code != 200:
        raise SuiteError(f"/start_profile answered HTTP {r.status_code}; the server must be started with --profiler-config")
    try:
        workload()
    except BaseException:
        try:  # leave the profiler off; the workload's own error is the one to report
            requests.post(base_url + "/stop_profile", timeout=timeout_s)
        except requests.RequestException:
            pass
        raise
    r = _profiler_post(base_url, "/stop_profile", timeout_s)
    if r.status_code != 200:
        raise SuiteError(f"/stop_profile answered HTTP {r.status_code}: {r.text[:200]}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # the worker writes its trace after stop returns
        new = [p for p in trace_dir.glob("*.pt.trace.json.gz") if p not in before and "async_llm" not in p.name]
        if new:
            newest = max(new, key=lambda p: p.stat().st_mtime)
            size = newest.stat().st_size
            time.sleep(1.0)
            if newest.stat().st_size == size:
                return parse_trace(newest, event_kind)
        time.sleep(1.0)
    raise SuiteError(f"no worker trace appeared in {trace_dir} within {timeout_s:.0f} s after /stop_profile")


def _profiler_post(base_url: str, path: str, timeout_s: float) -> requests.Response:
    try:
        return requests.post(base_url + path, timeout=timeout_s)
    except requests.RequestException as e:
        raise SuiteError(f"{path} failed ({type(e).__name__}, waited up to {timeout_s:.0f} s): the server died or hung "
                         "while profiling; its log (runs/<run>/servers/) says why") from None


@dataclass
class PathVerdict:
    ok: bool
    problems: list[str]
    excused: list[str]  # `must` patterns missing or decode steps on the prefill backend, each with its logged fallback

    def explain(self, summary: KernelSummary, expectation: KernelExpectation) -> str:
        lines = [f"kernel-path check failed ({len(self.problems)} problem(s)):"]
        lines += [f"  - {p}" for p in self.problems]
        lines.append(f"expected must={expectation.must} must_not={expectation.must_not}")
        lines.append(f"kernels that ran (top by time, from {Path(summary.source).name}):")
        lines.append(summary.top(20))
        return "\n".join(lines)


def check_path(summary: KernelSummary, expectation: KernelExpectation, server_log: str = "",
               declared: bool = True) -> PathVerdict:
    """Every `must` glob matches some kernel, unless that pattern's own fallback line is in the log;
    no `must_not` glob matches any kernel. `declared`: the expectation must name at least one kernel (the full
    check). A platform the flavour allows but declares no kernels for (sm_100 today) passed any trace, even an
    empty one, and a passed level 1.5 lets --force-regen record goldens and baselines and marks results valid."""
    problems, excused = [], []
    if not summary.kernels and expectation.must:
        # every required pattern would read "no kernel matches": name the profiler, not the patterns
        problems.append(f"the trace holds no '{summary.event_kind}' events: the profiler recorded no device activity "
                        "(on a GPU: CUPTI unavailable, e.g. a container without it), so no kernel can be checked; "
                        "fix the profiler and run again")
    if declared and not expectation.must:
        problems.append("no kernel is declared for this config on this platform (configs/flavours/<flavour>.yaml), so "
                        "nothing says which backend ran; record its kernel patterns with scripts/record_kernels.py")
    for pat in expectation.must:
        if summary.matching(pat):
            continue
        why = ", ".join(expectation.source.get(pat, []))
        excuse = expectation.excuses.get(pat)
        line = _fallback_line(excuse, server_log)
        if line is not None:
            excused.append(f"{pat} (logged fallback: {line[:160]!r})")
        else:
            problems.append(f"no kernel matches required '{pat}' ({why})"
                            + (f"; its fallback line /{excuse}/ is not in the log either" if excuse else ""))
    for pat in expectation.must_not:
        hits = summary.matching(pat)
        if hits:
            why = ", ".join(expectation.source.get(pat, []))
            sibling = f"; {expectation.derived[pat]}" if pat in expectation.derived else ""
            problems.append(f"forbidden '{pat}' ({why}{sibling}) ran: {hits[0].name[:120]} ({hits[0].calls} calls)")
    return PathVerdict(not problems, problems, excused)


def check_decode(summary: KernelSummary, expectation: KernelExpectation, server_log: str = "") -> PathVerdict:
    """A trace of decode steps alone: each `decode_must` kernel ran, no `prefill_only` one did.

    When a decode kernel's documented fallback is in the log (its `excuses` line, e.g. the fork's GEMV MoE
    falling back to the GEMM for some shapes), the fallback backend's kernels may run in decode too, and a
    decode kernel missing altogether is excused as in the full check. Both are listed in `excused`: the full
    trace may have shown the decode kernel (e.g. for the first request), so only this says that decode fell back."""
    source = {**expectation.source, **{p: ["prefill only (also_runs)"] for p in expectation.prefill_only}}
    lines = [_fallback_line(expectation.excuses.get(p), server_log) for p in expectation.decode_must]
    logged = next((line for line in lines if line is not None), None)
    own = KernelExpectation(must=list(expectation.decode_must), excuses=dict(expectation.excuses), source=source,
                            must_not=[] if logged is not None else list(expectation.prefill_only))
    verdict = check_path(summary, own, server_log, declared=False)  # decode_must may be empty: the full check asked
    excused = [f"decode steps: {x}" for x in verdict.excused]
    if logged is not None:
        for pat in expectation.prefill_only:
            hits = summary.matching(pat)
            if hits:
                excused.append(f"decode steps: prefill-only {pat} ran ({sum(k.calls for k in hits)} calls; "
                               f"logged fallback: {logged[:160]!r})")
    return PathVerdict(verdict.ok, [f"decode steps: {p}" for p in verdict.problems], excused)


def _fallback_line(excuse: str | None, server_log: str) -> str | None:
    """The server's log line in which a documented fallback's regex matches; None when none does (or there is none).
    Matched line by line, never against the suite's own header lines nor against paths: a run folder named
    `gemv-fallback-check` once read as vLLM logging the GEMV MoE's fallback, first in the suite's argv line, then in
    vLLM's own "Traces will be saved to: <run dir>/traces" line."""
    if not excuse:
        return None
    for line in server_log.splitlines():
        if not line.startswith(LOG_HEADER) and re.search(excuse, _PATHS.sub(" ", line)):
            return line.strip()
    return None


_PATHS = re.compile(r"\S*/\S*")  # any token with a slash: the run dir, trace dir, model path vLLM echoes


def cpu_attention_sinks(summary: KernelSummary) -> tuple[set, set]:
    """(sinks tensor dims seen, sliding-window values seen) in `_C::cpu_attention_with_kv_cache` calls.

    vLLM 0.32's CPU attention op takes the sinks tensor as input 13 and the sliding window as input 9
    (seen with record_shapes on this project's CI machines).
    """
    sink_dims, windows = set(), set()
    for call in summary.attention_calls:
        dims, concrete = call.get("dims") or [], call.get("concrete") or []
        if len(dims) > 13:
            sink_dims.add(tuple(dims[13]))
        if len(concrete) > 9 and concrete[9] != "":
            windows.add(concrete[9])
    return sink_dims, windows


def save_summary(summary: KernelSummary, verdict: PathVerdict | None, path: Path, **meta) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"valid": bool(verdict and verdict.ok), "problems": verdict.problems if verdict else ["not checked"], **meta}
    payload["summary"] = summary.to_json()
    path.write_text(json.dumps(payload, indent=1))


def load_summary(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SuiteError(f"no kernel summary at {path}; run level 1.5 for this config first (pytest -m level1_5 --config=...)") from None
    except json.JSONDecodeError as e:
        raise SuiteError(f"kernel summary {path} is corrupt ({e}); re-run level 1.5") from None
