"""Level 1.5: profile a short prefill + decode on a running server and check its kernel path.

Every config then gets a second profile of decode steps alone, which must show each of its required kernels: one
call of a required kernel (say, in a prefill) was enough for the full trace while every decode step ran another
backend. A config that hands its large batches to another backend (`prefill_only` kernels, e.g. a GEMV MoE over
vLLM's Triton MoE) must also show none of those in decode, so a decode step falling back cannot hide behind the
prefill kernels the full trace allows.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import SuiteError
from harness.kernelpath.traces import (
    KernelSummary,
    PathVerdict,
    check_decode,
    check_path,
    profile,
    save_summary,
)
from harness.session.suite import RunningServer, Suite

# ~300 prompt tokens then 24 decode steps: enough for every prefill and decode kernel to appear.
WORKLOAD_PROMPT = "import os\nimport sys\n\n" + "def handler(event, context):\n    return {'status': 200, 'body': event}\n\n" * 12


# Tokens decoded between the profiler's start and its stop request: every decode kernel shows many times.
DECODE_WINDOW_TOKENS = 16


@dataclass
class DecodeWindow:
    summary: KernelSummary
    before: int  # tokens the client had when the profiler was asked to start (>= 1: the prefill step was over)
    inside: int  # tokens that arrived between the profiler's start and the stop request
    problems: list[str] = field(default_factory=list)  # check_decode's, also in the kernel-path verdict


@dataclass
class KernelPath:
    summary: KernelSummary
    verdict: PathVerdict
    artifact: Path
    decode: DecodeWindow | None = None


def profile_kernel_path(suite: Suite, server: RunningServer) -> KernelPath:
    client = server.client()

    def workload() -> None:
        client.complete(WORKLOAD_PROMPT, max_tokens=24)
        client.complete("class Config:\n", max_tokens=8)

    kind = "kernel" if suite.platform.is_cuda else "cpu_op"
    summary = profile(server.url, server.trace_dir, workload, kind)
    spec = server.target.spec
    verdict = check_path(summary, spec.kernels, server.log_text())
    decode = None
    if spec.kernels.must:  # nothing declared: the full check has already failed, and says why
        decode = profile_decode_window(server, kind)
        # the log is read again: a fallback line may have been logged during the decode window
        checked = check_decode(decode.summary, spec.kernels, server.log_text())
        decode.problems = checked.problems
        # what a logged fallback excused in decode marks the run excused, as a missing `must` kernel does
        verdict = PathVerdict(verdict.ok and checked.ok, verdict.problems + checked.problems, verdict.excused + checked.excused)
    meta = dict(config=server.target.name, model=suite.model.alias, platform=suite.platform.name,
                device=suite.platform.device, verification=spec.kernels.verification)
    artifact = suite.artifact("kernels", f"{suite.model.alias}__{server.target.name}.json")
    save_summary(summary, verdict, artifact, **meta, excused=verdict.excused,
                 expected={"must": spec.kernels.must, "must_not": spec.kernels.must_not, "excuses": spec.kernels.excuses,
                           "decode_must": spec.kernels.decode_must, "prefill_only": spec.kernels.prefill_only})
    if decode is not None:
        save_summary(decode.summary, verdict, suite.artifact("kernels", f"{suite.model.alias}__{server.target.name}__decode.json"),
                     **meta, window={"tokens_before": decode.before, "tokens_inside": decode.inside})
    return KernelPath(summary, verdict, artifact, decode)


def profile_decode_window(server: RunningServer, kind: str, window: int = DECODE_WINDOW_TOKENS,
                          timeout_s: float = 180) -> DecodeWindow:
    """Profile only decode steps: one long greedy stream, the profiler started after its first token (the
    prefill step's) arrived and stopped `window` tokens later; the stream is then closed (vLLM aborts it).
    With one request in flight, every step inside the window is a decode step."""
    client = server.client(timeout_s=timeout_s)
    max_tokens = _decode_room(client)
    seen, first, stop = [0], threading.Event(), threading.Event()
    outcome: dict = {}

    def until(tokens: int) -> bool:
        seen[0] = tokens
        first.set()
        return stop.is_set()

    def run() -> None:
        try:
            # as the benchmarks stream (no logprobs), so the window's steps are the steps tgN times
            outcome["stream"] = client.stream("Once upon a time", max_tokens, until=until, per_chunk_usage=True)
        except Exception as e:  # re-raised below, in the test's thread
            outcome["error"] = e
        finally:
            first.set()

    thread = threading.Thread(target=run, name="decode-window", daemon=True)
    thread.start()
    counts = {}

    def wait_for_window() -> None:
        counts["before"] = seen[0]
        deadline = time.monotonic() + timeout_s
        while seen[0] < counts["before"] + window and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        counts["inside"] = seen[0] - counts["before"]

    try:
        if not first.wait(timeout_s) or "error" in outcome or not seen[0]:
            raise SuiteError(f"decode window: no streamed token within {timeout_s:.0f} s "
                             f"({outcome.get('error', 'the stream ended without tokens')})")
        summary = profile(server.url, server.trace_dir, wait_for_window, kind, timeout_s)
    finally:
        stop.set()
        thread.join(timeout_s)
    if "error" in outcome:
        raise SuiteError(f"decode window: the stream failed: {outcome['error']}")
    if counts.get("inside", 0) < window:
        raise SuiteError(f"decode window: only {counts.get('inside', 0)} of {window} tokens arrived while profiling "
                         f"(the stream of {max_tokens} tokens ended or stalled); the trace cannot show decode steps")
    return DecodeWindow(summary, counts["before"], counts["inside"])


def _decode_room(client) -> int:
    """Tokens one short prompt may decode: the served context (vLLM lists it in /v1/models), capped."""
    r = client.get("/v1/models")
    try:
        context = int(r.json()["data"][0]["max_model_len"])
    except (ValueError, KeyError, IndexError, TypeError):
        context = 2048
    return max(64, min(context - 64, 8192))
