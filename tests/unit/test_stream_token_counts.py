"""How a benchmark stream counts its tokens without logprobs: the running usage each chunk carries.

A fake response stands in for the server (harness logic only); the real vLLM on CPU is exercised by level 4's
benchmarks, which stream this way.
"""
from __future__ import annotations

import json

import pytest

from harness.core.errors import SuiteError
from harness.engine.client import Client
from harness.perf import bench
from harness.perf import metrics as perf
from tests.unit.loopback import STREAM_HEAD, chunk, loopback_server


class _Response:
    status_code = 200

    def __init__(self, events: list[dict]) -> None:
        self.lines = [b"data: " + json.dumps(e).encode() for e in events] + [b"data: [DONE]"]

    def iter_content(self, chunk_size=None):
        for line in self.lines:
            yield line + b"\n"

    def close(self) -> None:
        pass


class _Session:
    def __init__(self, events: list[dict]) -> None:
        self.events, self.bodies = events, []

    def post(self, url, json=None, timeout=None, stream=False):
        self.bodies.append(json)
        return _Response(self.events)


def _chunks(sizes: list[int], usage_per_chunk: bool = True) -> list[dict]:
    """Chunks of `sizes` tokens each (vLLM merges tokens when its API process lags), then the usage chunk."""
    events, total = [], 0
    for n in sizes:
        total += n
        e = {"choices": [{"text": "a" * n, "finish_reason": None}]}
        if usage_per_chunk:
            e["usage"] = {"prompt_tokens": 4, "completion_tokens": total}
        events.append(e)
    events.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": total}})
    return events


def _client(events: list[dict]) -> tuple[Client, _Session]:
    session = _Session(events)
    return Client("http://127.0.0.1:1", "model", session=session), session


def test_merged_chunks_are_counted_from_the_running_usage_and_no_logprobs_are_asked():
    client, session = _client(_chunks([1, 3, 1, 2]))
    r = client.stream([1, 2, 3, 4], 7, per_chunk_usage=True)
    assert r.chunk_tokens == 7 and r.usage["completion_tokens"] == 7 and len(r.chunk_times) == 4
    body = session.bodies[0]
    assert "logprobs" not in body and body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    perf.check_token_accounting(r.chunk_tokens, r.usage["completion_tokens"], allow_multi_token_chunks=False)


def test_counting_chunks_instead_would_miss_the_merged_tokens():
    """The fault this guards against: one chunk counted as one token (4 of 7 here) fails the accounting check."""
    client, _ = _client(_chunks([1, 3, 1, 2]))
    r = client.stream([1, 2, 3, 4], 7)  # the logprobs way, on a server that sent none: one per text chunk
    assert r.chunk_tokens == 4
    with pytest.raises(SuiteError, match="merged"):
        perf.check_token_accounting(r.chunk_tokens, r.usage["completion_tokens"], allow_multi_token_chunks=False)


def test_a_server_without_running_usage_counts_text_chunks_and_its_merges_fail_the_accounting():
    """llama.cpp sends no per-chunk usage: one token per chunk holds there; a merged chunk is caught by usage."""
    client, _ = _client(_chunks([1, 1], usage_per_chunk=False))
    r = client.stream([1], 2, per_chunk_usage=True)
    assert r.chunk_tokens == 2
    perf.check_token_accounting(r.chunk_tokens, r.usage["completion_tokens"], allow_multi_token_chunks=False)
    client, _ = _client(_chunks([1, 2], usage_per_chunk=False))
    r = client.stream([1], 3, per_chunk_usage=True)
    with pytest.raises(SuiteError, match="merged") as e:
        perf.check_token_accounting(r.chunk_tokens, r.usage["completion_tokens"], allow_multi_token_chunks=False)
    assert "\n" not in str(e.value)


def test_several_choices_are_refused_with_running_usage():
    client, _ = _client(_chunks([1]))
    with pytest.raises(SuiteError, match="one sequence"):
        client.stream([1], 1, per_chunk_usage=True, n=2)


def test_usage_that_goes_back_is_refused():
    events = _chunks([2, 1])
    events[1]["usage"]["completion_tokens"] = 1
    client, _ = _client(events)
    with pytest.raises(SuiteError, match="went back"):
        client.stream([1], 3, per_chunk_usage=True)


def test_the_benchmarks_stream_this_way_and_record_it():
    client, session = _client(_chunks([1] * 4))
    w = bench.Workload("decode", 4, 4)
    bench._measure(client, w, [1, 2, 3, 4])
    assert "logprobs" not in session.bodies[0]
    assert bench.workload_record([w], [])["stream_request"] == perf.STREAM_REQUEST


def _trickling_server(request):
    """A server that sends its headers, then one body byte every 2 s: each socket read is within requests' per-read
    timeout, so only an overall deadline ends the request."""
    def answer(conn, stop) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        while not stop.wait(2.0):
            conn.sendall(b"x")

    return loopback_server(request, answer)


@pytest.mark.parametrize("call", ["get", "post"])
def test_a_trickling_answer_ends_at_the_timeout(request, call):
    import time

    client = Client(_trickling_server(request), "model", timeout_s=3)
    started = time.monotonic()
    with pytest.raises(SuiteError, match="not complete after 3 s"):
        client.get("/v1/models") if call == "get" else client.complete("hi", 1)
    assert time.monotonic() - started < 10  # the client's 3 s, plus at most one read's wait


def _streaming_server(request, pieces, every_s: float) -> str:
    """A server answering a stream in HTTP chunks: `pieces` (bytes, or a callable giving the i-th piece; an empty one
    ends the body) one every `every_s`, each within requests' per-read timeout."""
    def answer(conn, stop) -> None:
        conn.sendall(STREAM_HEAD)
        i = 0
        while not stop.wait(every_s):
            piece = pieces(i) if callable(pieces) else pieces
            i += 1
            conn.sendall(chunk(piece))
            if not piece:
                return

    return loopback_server(request, answer)


def _event(e: dict) -> bytes:
    return b"data: " + json.dumps(e).encode() + b"\n\n"


@pytest.mark.parametrize("trickle", [b"d", b": keep-alive\n\n", _event({"choices": [{"text": "", "logprobs": None}]})],
                         ids=["a-line-a-byte-at-a-time", "comment-lines", "events-without-tokens"])
def test_a_stream_that_sends_bytes_but_no_token_ends_at_the_timeout(request, trickle):
    """Each piece comes within requests' per-read timeout, so only the stream's own clock can end the request."""
    import time

    client = Client(_streaming_server(request, trickle, 0.3), "model", timeout_s=2)
    started = time.monotonic()
    with pytest.raises(SuiteError, match="sent no token for 2 s") as e:
        client.stream("hi", 4, per_chunk_usage=True)
    assert time.monotonic() - started < 8 and "\n" not in str(e.value)


def test_a_slow_stream_that_makes_progress_is_not_cut(request):
    """The A/A of the rule above: 5 tokens 0.6 s apart take longer than the 1.5 s timeout in all, and pass."""
    done = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 5}}
    events = [_event({"choices": [{"text": "a"}], "usage": {"prompt_tokens": 1, "completion_tokens": i + 1}})
              for i in range(5)] + [_event(done), b"data: [DONE]\n\n", b""]
    client = Client(_streaming_server(request, lambda i: events[i], 0.6), "model", timeout_s=1.5)
    r = client.stream("hi", 5, per_chunk_usage=True)
    assert r.chunk_tokens == 5 and r.usage["completion_tokens"] == 5 and r.t_end - r.t_sent > 3
