"""The decode-only profile window of level 1.5 (harness/kernelpath/check.py), against a fake server.

The fake streams one token every few milliseconds and writes a trace at /stop_profile holding a kernel
per step it saw while profiling, marked prefill for the first step and decode after it. What it proves is
the harness's timing logic (the profiler starts only after the first token, closes after the window, the
stream is closed, and a stream too short for the window is an error); that vLLM's steps behave the same
is shown by the GPU runs of tests/level1_5_kernels/test_kernel_paths.py.
"""
from __future__ import annotations

import gzip
import http.server
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config.catalog import Catalog
from harness.core.errors import SuiteError
from harness.core.platform import Platform
from harness.engine.models import Model
from harness.kernelpath import check as kernel_path
from harness.kernelpath.check import profile_decode_window
from harness.kernelpath.traces import KernelStat, KernelSummary
from harness.session.suite import RunningServer, Suite, Target


class FakeEngine:
    def __init__(self, trace_dir: Path, tokens: int, step_s: float = 0.004, start_delay_s: float = 0.05) -> None:
        self.trace_dir, self.tokens, self.step_s, self.start_delay_s = trace_dir, tokens, step_s, start_delay_s
        self.profiling = False
        self.steps: list[str] = []
        self.closed_early = threading.Event()
        self.requested_tokens = 0
        self.body: dict = {}


def _handler(engine: FakeEngine):
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _json(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._json({"data": [{"id": "fake", "max_model_len": 4096}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/start_profile":
                engine.profiling = True  # from the request on (a step may already be in flight) ...
                time.sleep(engine.start_delay_s)  # ... while the answer takes a moment, as a real profiler's does
                return self._json({})
            if self.path == "/stop_profile":
                engine.profiling = False
                events = [{"cat": "kernel", "name": k, "dur": 1.0} for k in engine.steps]
                with gzip.open(engine.trace_dir / "worker.pt.trace.json.gz", "wt") as f:
                    json.dump({"traceEvents": events}, f)
                return self._json({})
            engine.requested_tokens, engine.body = body["max_tokens"], body
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")  # as vLLM streams: the client reads chunk by chunk
            self.end_headers()

            def send(text: str) -> None:
                data = text.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            for i in range(engine.tokens):
                time.sleep(engine.step_s)
                if engine.profiling:
                    engine.steps.append("prefill_kernel" if i == 0 else "decode_kernel")
                chunk = {"choices": [{"text": "a", "finish_reason": None}]}
                if (body.get("stream_options") or {}).get("continuous_usage_stats"):  # vLLM's running usage
                    chunk["usage"] = {"prompt_tokens": 4, "completion_tokens": i + 1}
                if body.get("logprobs"):
                    chunk["choices"][0]["logprobs"] = {"tokens": ["a"]}
                try:
                    send(f"data: {json.dumps(chunk)}\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    engine.closed_early.set()
                    return
            usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": engine.tokens}}
            send(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

    return H


@pytest.fixture
def fake(tmp_path):
    def start(tokens: int, step_s: float = 0.004) -> tuple[RunningServer, FakeEngine]:
        engine = FakeEngine(tmp_path, tokens, step_s)
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        return RunningServer(url, "fake", target=None, trace_dir=tmp_path), engine

    servers: list = []
    yield start
    for s in servers:
        s.shutdown()


def test_the_window_holds_decode_steps_only_and_closes_the_stream(fake):
    server, engine = fake(tokens=2000)
    window = profile_decode_window(server, "kernel", window=16, timeout_s=20)
    assert window.before >= 1 and window.inside >= 16
    names = window.summary.names()
    assert names == ["decode_kernel"], names
    assert window.summary.kernels[0].calls >= 16
    assert engine.closed_early.wait(5), "the stream was not closed after the window: the request would decode to the end"
    assert engine.requested_tokens == 4096 - 64  # the served context, less room for the prompt
    # streamed as the benchmarks stream: no logprobs work in the window's steps
    assert "logprobs" not in engine.body and engine.body["stream_options"]["continuous_usage_stats"] is True


def test_a_stream_that_ends_inside_the_window_is_an_error(fake):
    server, _ = fake(tokens=20)  # ends a few tokens after the profiler starts
    with pytest.raises(SuiteError, match="tokens arrived while profiling"):
        profile_decode_window(server, "kernel", window=400, timeout_s=20)


def test_a_window_that_caught_some_decode_steps_but_not_all_is_still_an_error(fake):
    """A window is the `window` decode steps it asks for: one that caught a few hundred steps before the stream
    ended is as short as one that caught none, and a trace of it would be judged on fewer steps than the rule says."""
    # the profiler starts early in the stream, which ends before 400 tokens more; 10 ms a token (3.9 s) so that a
    # starved client still starts the profiler before the stream's end, the case this test is not about
    server, _ = fake(tokens=390, step_s=0.01)
    with pytest.raises(SuiteError, match=r"only [1-9]\d* of 400 tokens arrived while profiling"):
        profile_decode_window(server, "kernel", window=400, timeout_s=20)


def test_a_decode_window_on_the_logged_fallback_marks_the_run_excused(tmp_path, monkeypatch):
    """The fork's GEMV MoE ran in the full trace (say, for the first request) but every step of the decode window
    ran the GEMM it falls back to, and the fallback line is in the log: the kernel path passes, excused, and
    --force-regen refuses to record goldens or baselines from the run."""
    catalog = Catalog()
    fork, cfg = catalog.flavour("fork"), catalog.parse("gemv-bf16")
    spec = fork.resolve(cfg, "sm_121")
    gemv, gemm = fork.seen(cfg, "sm_121"), fork.seen(cfg, "sm_121", replace={"moe": "gemm"})
    summary = lambda names: KernelSummary("synthetic", "kernel", [KernelStat(n, 16, 1.0, 0.1) for n in dict.fromkeys(names)])  # noqa: E731
    monkeypatch.setattr(kernel_path, "profile", lambda *args, **kw: summary(gemv + gemm))
    monkeypatch.setattr(kernel_path, "profile_decode_window", lambda *args, **kw: kernel_path.DecodeWindow(summary(gemm), 1, 16))
    log = tmp_path / "server.log"
    log.write_text("INFO loading\nWARNING [mxfp4.py] GEMV MoE falling back to grouped GEMM for M=8192\nINFO ready\n")
    server = RunningServer("http://127.0.0.1:9", "fake", Target("gemv-bf16", cfg, spec, True, ""), log_path=log,
                           process=object(), trace_dir=tmp_path)
    suite = Suite(catalog, Platform("sm_121", "NVIDIA GB10", (12, 1)), fork, Model("tiny-gpt-oss-mxfp4", "unused"), tmp_path, None)
    kp = kernel_path.profile_kernel_path(suite, server)
    assert kp.verdict.ok and not kp.decode.problems
    assert kp.verdict.excused and all(x.startswith("decode steps: ") for x in kp.verdict.excused), kp.verdict.excused
    refusal = suite.record_refusal(server, SimpleNamespace(getfixturevalue=lambda name: kp))
    assert refusal and "logged fallback" in refusal, refusal


def test_a_backend_that_ran_only_in_the_prefill_fails_by_the_decode_window(tmp_path, monkeypatch):
    """marlin-bf16 on an H200 (no `also_runs`): Marlin's GEMM once, in a prefill, and vLLM's Triton MoE in every decode
    step passed the full trace (one matching call is enough there). Every config's decode steps are now profiled alone
    and must show its required kernels; the same decode window with Marlin's kernels passes (A/A)."""
    catalog = Catalog()
    upstream, cfg = catalog.flavour("upstream"), catalog.parse("marlin-bf16")
    spec = upstream.resolve(cfg, "sm_90")
    assert not spec.kernels.prefill_only  # the premise: nothing asked for a decode window before
    marlin = upstream.seen(cfg, "sm_90")
    triton_moe = [n for n in marlin if "marlin" not in n.lower()] + ["fused_moe_kernel"]
    summary = lambda names, calls=16: KernelSummary("synthetic", "kernel", [KernelStat(n, calls, 1.0, 0.1) for n in dict.fromkeys(names)])  # noqa: E731
    monkeypatch.setattr(kernel_path, "profile", lambda *args, **kw: summary(marlin + ["fused_moe_kernel"]))
    server = RunningServer("http://127.0.0.1:9", "fake", Target("marlin-bf16", cfg, spec, True, ""),
                           log_path=None, process=object(), trace_dir=tmp_path)
    suite = Suite(catalog, Platform("sm_90", "NVIDIA H200", (9, 0)), upstream, Model("tiny-gpt-oss-mxfp4", "unused"), tmp_path, None)
    for window, ok in ((triton_moe, False), (marlin, True)):
        monkeypatch.setattr(kernel_path, "profile_decode_window",
                            lambda *args, names=window, **kw: kernel_path.DecodeWindow(summary(names), 1, 16))
        kp = kernel_path.profile_kernel_path(suite, server)
        assert kp.decode is not None and kp.verdict.ok is ok, kp.verdict.problems
        if not ok:
            assert any(p.startswith("decode steps: no kernel matches required") and "marlin" in p.lower()
                       for p in kp.verdict.problems), kp.verdict.problems


@pytest.mark.parametrize("tokens, ok", [(16, True), (15, False)])
def test_a_window_holds_exactly_its_tokens_or_is_an_error(monkeypatch, tmp_path, tokens, ok):
    """The boundary of the window rule, without timing: a stream that delivers exactly `window` tokens after the
    profiler started is a window; one that ends a token short is not (its trace shows fewer steps than the rule says)."""
    counting = threading.Event()  # set when the window has read its start count and waits for tokens

    def sleep(seconds: float) -> None:
        counting.set()
        time.sleep(seconds)

    monkeypatch.setattr(kernel_path, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))

    class Client:
        def get(self, path):
            return SimpleNamespace(json=lambda: {"data": [{"max_model_len": 4096}]})

        def stream(self, prompt, max_tokens, until, per_chunk_usage):
            until(1)  # the prefill step's token
            assert counting.wait(5)  # no race: the window counts from here
            for n in range(2, 2 + tokens):
                if until(n):
                    return None
            while ok and not until(1 + tokens):  # a long stream: it waits to be closed
                time.sleep(0.01)
            return None

    def profile(url, trace_dir, workload, kind, timeout_s):
        workload()
        return KernelSummary("synthetic", kind, [KernelStat("decode_kernel", tokens, 1.0, 1.0)])

    monkeypatch.setattr(kernel_path, "profile", profile)
    server = SimpleNamespace(url="http://127.0.0.1:9", trace_dir=tmp_path, client=lambda timeout_s=None: Client())
    if ok:
        window = profile_decode_window(server, "kernel", window=16, timeout_s=10)
        assert (window.before, window.inside) == (1, 16)
    else:
        with pytest.raises(SuiteError, match="only 15 of 16 tokens arrived while profiling"):
            profile_decode_window(server, "kernel", window=16, timeout_s=10)


def test_the_full_trace_is_excused_by_the_log_and_the_artifacts_say_what_the_verdict_says(tmp_path, monkeypatch):
    """gemv-bf16 whose GEMV MoE fell back everywhere, the fallback line in the log: the full trace lacks the GEMV
    kernel too, and is excused as the decode window is (the log is read for both). The saved summaries are what the
    perf levels and reports read: each says valid exactly when the verdict passed, with its excuses; a failed run's
    (the same traces, no log line) says invalid."""
    catalog = Catalog()
    fork, cfg = catalog.flavour("fork"), catalog.parse("gemv-bf16")
    spec = fork.resolve(cfg, "sm_121")
    gemm = fork.seen(cfg, "sm_121", replace={"moe": "gemm"})
    summary = KernelSummary("synthetic", "kernel", [KernelStat(n, 16, 1.0, 0.1) for n in dict.fromkeys(gemm)])
    monkeypatch.setattr(kernel_path, "profile", lambda *args, **kw: summary)
    monkeypatch.setattr(kernel_path, "profile_decode_window", lambda *args, **kw: kernel_path.DecodeWindow(summary, 1, 16))
    suite = Suite(catalog, Platform("sm_121", "NVIDIA GB10", (12, 1)), fork, Model("tiny-gpt-oss-mxfp4", "unused"), tmp_path, None)
    for line, ok in (("WARNING [mxfp4.py] GEMV MoE falling back to grouped GEMM for M=8192\n", True), ("", False)):
        log = tmp_path / "server.log"
        log.write_text("INFO loading\n" + line + "INFO ready\n")
        server = RunningServer("http://127.0.0.1:9", "fake", Target("gemv-bf16", cfg, spec, True, ""), log_path=log,
                               process=object(), trace_dir=tmp_path)
        kp = kernel_path.profile_kernel_path(suite, server)
        assert kp.verdict.ok is ok, kp.verdict.problems
        excused_full = [x for x in kp.verdict.excused if not x.startswith("decode steps: ")]
        assert bool(excused_full) is ok, kp.verdict.excused  # the full trace's own excuse, not only the window's
        full = json.loads(kp.artifact.read_text())
        decode = json.loads(kp.artifact.with_name(kp.artifact.stem + "__decode.json").read_text())
        assert full["valid"] is ok and decode["valid"] is ok and full["excused"] == kp.verdict.excused
        assert bool(full["problems"]) is not ok
