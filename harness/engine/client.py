"""Client for any OpenAI-compatible server (vLLM, llama.cpp server, SGLang): completions and chat.

Every call has a timeout; before each call (and after a connection error) the optional `alive`
hook runs, so a dead server fails the test at once with its log tail instead of hanging.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import time
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any, Callable

import requests
import urllib3

from harness.core.errors import SuiteError


class NotAnOpenAIServer(SuiteError):
    """Something answered at the client's address, but not as an OpenAI-compatible server (no HTTP at all, or no
    JSON): the fix is the address, not starting a server."""


@dataclass
class StreamResult:
    """One streamed completion, timed on the client (time.perf_counter seconds)."""

    text: str
    chunk_times: list[float]  # arrival time of each chunk that carried tokens
    chunk_tokens: int  # tokens counted chunk by chunk (each chunk's logprobs token list, or its usage's growth)
    usage: dict[str, int]
    t_sent: float
    t_end: float
    finish_reason: str | None = None

    @property
    def t_first(self) -> float:
        return self.chunk_times[0] if self.chunk_times else self.t_end

    @property
    def t_last(self) -> float:
        return self.chunk_times[-1] if self.chunk_times else self.t_end


LOOPBACK = ("127.0.0.1", "localhost")


def loopback_without_proxy() -> None:
    """Requests to the suite's servers never go through a proxy: requests honours http_proxy for 127.0.0.1 too,
    and a proxy's 502 read as 'not healthy after 900 s' on every boot. NO_PROXY gains the loopback names."""
    for name in ("NO_PROXY", "no_proxy"):
        have = [h.strip() for h in os.environ.get(name, "").split(",") if h.strip()]
        if not all(h in have for h in LOOPBACK):
            os.environ[name] = ",".join(dict.fromkeys([*have, *LOOPBACK]))


@dataclass
class Client:
    base_url: str
    model: str
    timeout_s: float = 300.0
    alive: Callable[[], None] | None = None  # raises when the server is dead
    session: requests.Session = field(default_factory=requests.Session)

    def __post_init__(self) -> None:
        if any(f"//{h}:" in self.base_url or self.base_url.endswith(f"//{h}") for h in LOOPBACK):
            loopback_without_proxy()

    def _check(self) -> None:
        if self.alive is not None:
            self.alive()

    def _post(self, path: str, body: dict[str, Any], stream: bool = False) -> requests.Response:
        self._check()
        deadline = time.monotonic() + self.timeout_s
        try:
            r = self.session.post(self.base_url + path, json=body, timeout=self.timeout_s, stream=True)
            return r if stream else _read_by(r, deadline, self.timeout_s)
        except requests.RequestException as e:
            self._check()  # a dead server explains itself better than the socket error
            raise _failed(f"POST {self.base_url}{path}", e) from None

    def get(self, path: str, timeout_s: float | None = None) -> requests.Response:
        """GET within `timeout_s` in all (unless given: 30 s, or the client's own timeout where shorter)."""
        timeout_s = min(self.timeout_s, 30.0) if timeout_s is None else timeout_s
        self._check()
        deadline = time.monotonic() + timeout_s
        try:
            return _read_by(self.session.get(self.base_url + path, timeout=timeout_s, stream=True), deadline, timeout_s)
        except requests.RequestException as e:
            self._check()
            raise _failed(f"GET {self.base_url}{path}", e) from None

    def health(self) -> int:
        return self.get("/health", timeout_s=10).status_code

    def models(self) -> list[str]:
        r = self.get("/v1/models")
        if r.status_code == 404:  # a web server of something else (every OpenAI-compatible server has the listing)
            raise NotAnOpenAIServer(f"/v1/models of {self.base_url} answered HTTP 404 ({r.text[:80]!r}): not an "
                                    "OpenAI-compatible server at that address")
        _raise_for(r, "/v1/models")
        listing = self._json(r, "/v1/models")
        try:
            return [m["id"] for m in listing["data"]]
        except (KeyError, TypeError):
            raise NotAnOpenAIServer(f"/v1/models of {self.base_url} answered without a model list "
                                    f"({str(listing)[:80]}): not an OpenAI-compatible server at that address") from None

    def tokenize(self, text: str) -> list[int]:
        """Token ids as the server's own tokenizer sees them (vLLM's /tokenize)."""
        r = self._post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        _raise_for(r, "/tokenize")
        return list(self._json(r, "/tokenize")["tokens"])

    def version(self) -> str:
        r = self.get("/version")
        try:  # a server without vLLM's /version (llama.cpp, a proxy's HTML page) is of unknown version
            body = r.json() if r.status_code == 200 else {}
        except ValueError:
            body = {}
        return str(body.get("version", "unknown")) if isinstance(body, dict) else "unknown"

    def complete(self, prompt: str | list[int], max_tokens: int, **params: Any) -> dict:
        """Non-streamed completion; greedy unless `temperature` is given."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, **params}
        return self._answer("/v1/completions", body)

    def chat(self, messages: list[dict], max_tokens: int, **params: Any) -> dict:
        """Non-streamed /v1/chat/completions; greedy unless `temperature` is given. gpt-oss chat goes through
        vLLM's harmony renderer and parser, so this is the path every gpt-oss client takes."""
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, **params}
        return self._answer("/v1/chat/completions", body)

    def _answer(self, path: str, body: dict) -> dict:
        r = self._post(path, body)
        if r.status_code >= 500:
            self._await_death()
        _raise_for(r, path)
        return self._json(r, path)

    def _json(self, r: requests.Response, path: str) -> Any:
        """The answer's JSON; an answer that is not JSON (an HTML page, a proxy) is one line naming the URL."""
        try:
            return r.json()
        except ValueError:
            raise NotAnOpenAIServer(f"{path} of {self.base_url} answered HTTP {r.status_code} with no JSON "
                                    f"({r.text[:80]!r}): not an OpenAI-compatible server at that address") from None

    def _await_death(self, grace_s: float = 3.0) -> None:
        """A crashed engine answers 500 just before the API process exits: give it a moment, so the
        error is ServerDied with the log tail rather than a bare 500."""
        if self.alive is None:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self._check()
            time.sleep(0.1)

    def raw_post(self, path: str, data: bytes | str, headers: dict | None = None) -> requests.Response:
        """POST arbitrary bytes (abuse tests: malformed JSON)."""
        self._check()
        return self.session.post(self.base_url + path, data=data, headers=headers or {}, timeout=self.timeout_s)

    def _stream_lines(self, r: requests.Response, due: Callable[[], float]) -> Iterator[bytes]:
        """The answer's lines as they arrive, each one before `due()` (time.monotonic). requests' timeout bounds
        each socket read, not the stream: a server that keeps sending bytes (a line a byte at a time, or lines
        without tokens) and no token would hang the caller for ever. So the clock is checked at every received
        piece; the caller moves `due` on at every token, so a slow stream that makes progress is never cut.
        A connection that breaks mid-stream (a server that died answering) is ServerDied with the log tail where
        the suite booted the server, else one line, never a requests traceback."""
        pending = b""
        try:
            for piece in r.iter_content(chunk_size=None):  # as it arrives: fixed-size reads would batch tokens
                *lines, pending = (pending + piece).split(b"\n")
                for line in lines:
                    yield line.rstrip(b"\r")
                if time.monotonic() > due():
                    r.close()
                    raise SuiteError(f"the stream from {self.base_url} sent no token for {self.timeout_s:g} s "
                                     "while its connection stayed open (the server is stalled or not vLLM); "
                                     "see the server's log")
        except requests.RequestException as e:
            self._await_death()
            raise SuiteError(f"the stream from {self.base_url} broke mid-answer ({type(e).__name__}: "
                             f"{str(e)[:160]}); see the server's log") from None
        if pending:
            yield pending.rstrip(b"\r")

    def stream(self, prompt: str | list[int], max_tokens: int, ignore_eos: bool = True,
               until: Callable[[int], bool] | None = None, per_chunk_usage: bool = False,
               **params: Any) -> StreamResult:
        """Streamed completion with usage; token counts come from the server's `usage`.

        vLLM merges several tokens into one chunk when its API process lags the engine, so chunks are never
        counted as tokens. By default each chunk lists its tokens (logprobs=1). With `per_chunk_usage` each
        chunk carries the running usage instead (stream_options.continuous_usage_stats; a server without it
        gets one token per text chunk, and the callers' accounting against the final usage catches merged
        ones) and no logprobs are asked for. That is the benchmarks' way: logprobs make the engine compute a
        log-softmax and a top-k over the whole vocabulary every step (the tiny model's batch-1 decode ran
        1.12-1.14x faster without them on a 2-core CPU).

        `until(tokens_so_far)` runs after every chunk that carried tokens; when it returns True the stream is
        closed there (vLLM aborts a request whose client disconnects), and the result has no `usage`."""
        if per_chunk_usage and (params.get("n", 1) != 1 or params.get("best_of", 1) != 1):
            raise SuiteError("per_chunk_usage counts one sequence's tokens: vLLM's running usage sums every choice")
        options = {"include_usage": True, **({"continuous_usage_stats": True} if per_chunk_usage else {})}
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": options, **({} if per_chunk_usage else {"logprobs": 1}), **params,
        }
        if ignore_eos:
            body["ignore_eos"] = True  # vLLM / SGLang extension; llama.cpp ignores unknown fields
        t_sent = time.perf_counter()
        r = self._post("/v1/completions", body, stream=True)
        _raise_for(r, "/v1/completions (stream)")
        text, times, usage, finish, counted = [], [], {}, None, 0
        progress = [time.monotonic()]  # when the last token (or the request) came: the next is due timeout_s later
        for line in self._stream_lines(r, lambda: progress[0] + self.timeout_s):
            if not line or not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            now = time.perf_counter()
            counted_before = counted
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                running = (event.get("usage") or {}).get("completion_tokens")
                if per_chunk_usage and type(running) is int:
                    n = running - counted
                    if n < 0:
                        raise SuiteError(f"the server's running usage went back from {counted} to {running} "
                                         "completion tokens; its usage is broken")
                else:  # each chunk's logprobs tokens; without them (a server without continuous_usage_stats, such
                    # as llama.cpp) one per text chunk, which the callers' token accounting checks against usage
                    lp = choice.get("logprobs") or {}
                    n = len(lp.get("tokens") or []) if lp else int(bool(choice.get("text")))
                if n:
                    counted += n
                    times.append(now)
                    progress[0] = time.monotonic()
                text.append(choice.get("text") or "")
                finish = choice.get("finish_reason") or finish
            if until is not None and counted > counted_before and until(counted):
                r.close()
                return StreamResult("".join(text), times, counted, {}, t_sent, time.perf_counter(), "closed by client")
        t_end = time.perf_counter()
        if not usage:
            raise SuiteError(
                "the server's stream carried no `usage`; token counts are never taken from chunk counts "
                "(use a server that honours stream_options.include_usage)"
            )
        return StreamResult("".join(text), times, counted, usage, t_sent, t_end, finish)


def _causes(e: BaseException) -> Iterator[BaseException]:
    """`e` and every exception inside it: requests wraps urllib3's, which wraps http.client's or the socket's (in
    args, `reason` or the exception chain)."""
    seen: list[BaseException] = []
    todo = [e]
    while todo and len(seen) < 20:
        x = todo.pop(0)
        if any(x is y for y in seen):
            continue
        seen.append(x)
        yield x
        inner = [*x.args, getattr(x, "reason", None), x.__cause__, x.__context__]
        todo += [i for i in inner if isinstance(i, BaseException)]


def _failed(call: str, e: requests.RequestException) -> SuiteError:
    """A failed request as one line that says whether anything listens there: "is the server up?" is the wrong
    question when something answered that is not an HTTP server (another service's port, a TLS or SSH port)."""
    causes = list(_causes(e))
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return SuiteError(f"{call} failed: nothing listens there (connection refused)")
    # RemoteDisconnected is a BadStatusLine: both are answers without an HTTP status line
    bad = next((c for c in causes if isinstance(c, http.client.BadStatusLine)), None)
    if isinstance(bad, http.client.RemoteDisconnected):
        return NotAnOpenAIServer(f"{call} failed: something there accepted the connection and closed it without an "
                                 "HTTP answer: not an HTTP server (or one that crashed)")
    if bad is not None:
        said = str(bad.args[0]) if bad.args else ""
        return NotAnOpenAIServer(f"{call} failed: something there answered {said[:60]!r}, which is not HTTP: not an "
                                 "HTTP server, let alone vLLM")
    return SuiteError(f"{call} failed: {type(e).__name__}: {e}")


def _read_by(r: requests.Response, deadline: float, timeout_s: float) -> requests.Response:
    """`r` with its whole body read before `deadline` (time.monotonic). requests' timeout bounds each socket read,
    not the answer: a server that sends its headers and then a byte every few seconds would hang the caller for
    ever. The body is read one socket read at a time (urllib3's read1), so the clock is checked between reads.
    urllib3 before 2.1 has no read1: there the body is read whole, bounded per read only, as before."""
    if not hasattr(r.raw, "read1"):
        r.content  # noqa: B018 - reads the body into r._content, which r.text / r.json() use
        return r
    body = []
    try:
        while chunk := r.raw.read1(65536, decode_content=True):
            body.append(chunk)
            if time.monotonic() > deadline:
                raise requests.Timeout(f"the answer was not complete after {timeout_s:g} s (it trickles in)")
    except requests.RequestException:
        r.close()
        raise
    except (OSError, urllib3.exceptions.HTTPError) as e:  # what requests' own body read wraps
        r.close()
        raise requests.ConnectionError(e) from None
    r._content = b"".join(body)  # r.text / r.json() read this; nothing left on the socket
    r._content_consumed = True
    r.raw.release_conn()  # read to the end: the connection goes back to the pool for the next request
    return r


def _raise_for(r: requests.Response, what: str) -> None:
    if r.status_code != 200:
        raise SuiteError(f"{what} answered HTTP {r.status_code}: {r.text[:300]}")


def token_logprobs(completion: dict) -> list[float]:
    return list(completion["choices"][0]["logprobs"]["token_logprobs"])


def all_finite(values: list[float | None]) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)
