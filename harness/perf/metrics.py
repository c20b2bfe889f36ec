"""Workload metrics from timed streaming requests, defined as llama-bench / llama-benchy define them.

Per request (times in seconds, from one monotonic clock):

    pp   = prompt_tokens / (t_first_token - t_sent)                    tok/s  (prefill throughput)
    tg   = (completion_tokens - 1) / (t_last_token - t_first_token)    tok/s  (decode throughput; the first
                                                                              token belongs to prefill)
    ttft = t_first_token - t_sent                                      ms
    tpot = (t_last_token - t_first_token) / (completion_tokens - 1)    ms     (= 1000 / tg)
    itl  = differences of consecutive content-chunk arrival times      ms     (per chunk, not per token:
                                                                              speculative decoding may put
                                                                              several tokens in a chunk)
    e2e  = t_end - t_sent                                              ms

Token counts always come from the server's `usage`, never from counting chunks (a chunk may carry several
tokens, or none); `check_token_accounting` flags when the two disagree in a way that means a broken stream.

Metric names in results files: `pp<N>` / `tg<N>` (N = nominal prompt / generated length of the workload)
and `ttft_ms`, `tpot_ms`, `itl_ms`, `e2e_ms`; any of them may carry a context-depth suffix `@d<D>`
(llama-bench's "pp2048 @ d4096"), e.g. `tg32@d4096`, and then a concurrency suffix `@c<C>` for requests
run C at a time (e.g. `tg32@c2`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from harness.core import stats
from harness.core.errors import SuiteError

LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
_NAME = re.compile(
    r"^(?P<base>pp(?P<pp>\d+)(?:_gpu)?|tg(?P<tg>\d+)(?:_gpu)?|ttft_ms|tpot_ms|itl_ms|e2e_ms)(?:@d(?P<depth>\d+))?(?:@c(?P<conc>\d+))?$"
)


@dataclass
class TimedRequest:
    """One streamed request as the client saw it."""

    prompt_tokens: int  # from usage
    completion_tokens: int  # from usage
    t_sent: float
    t_first_token: float  # arrival of the first content chunk
    t_last_token: float  # arrival of the last content chunk
    token_times: list[float] = field(default_factory=list)  # arrival of every content chunk
    t_end: float | None = None  # response fully received (end of stream); None means t_last_token

    def __post_init__(self) -> None:
        if self.t_end is None:
            self.t_end = self.t_last_token
        if not self.t_sent <= self.t_first_token <= self.t_last_token <= self.t_end:
            raise SuiteError(
                "timed request has out-of-order timestamps (need t_sent <= t_first_token <= t_last_token"
                f" <= t_end, got {self.t_sent}, {self.t_first_token}, {self.t_last_token}, {self.t_end});"
                " the client must take every timestamp from time.perf_counter()"
            )
        if any(b < a for a, b in zip(self.token_times, self.token_times[1:])):
            raise SuiteError("timed request token_times are not sorted; record chunk arrivals in order")


def metric_name(base: str, depth: int = 0) -> str:
    """`metric_name("tg32", 4096) == "tg32@d4096"`; depth 0 carries no suffix, as in llama-bench."""
    return base if depth == 0 else f"{base}@d{depth}"


def parse_metric_name(name: str) -> tuple[str, int]:
    """Split a metric name into (base, depth): `"pp2048@d4096" -> ("pp2048", 4096)`."""
    m = _NAME.match(name)
    if not m:
        raise SuiteError(
            f"unknown metric name {name!r}; expected ppN, ppN_gpu, tgN, tgN_gpu, ttft_ms, tpot_ms, itl_ms or e2e_ms,"
            " optionally with a depth suffix @dD and a concurrency suffix @cC"
        )
    return m.group("base"), int(m.group("depth") or 0)


def metric_concurrency(name: str) -> int:
    """The concurrent requests a metric name's `@cC` suffix asks for, 1 without one: `"tg32@c4" -> 4`."""
    m = _NAME.match(name)
    return int(m.group("conc")) if m and m.group("conc") else 1


def higher_is_better(name: str) -> bool:
    """Throughputs (pp*, tg*) are better higher; latencies (ttft/tpot/itl/e2e) are better lower."""
    base, _ = parse_metric_name(name)
    return base.startswith(("pp", "tg"))


def _span(start: float, end: float, what: str) -> float:
    if end <= start:
        raise SuiteError(f"{what} is {end - start:.6f} s (must be > 0); the timestamps cannot give a rate")
    return end - start


def _decode_tokens(r: TimedRequest) -> int:
    if r.completion_tokens < 2:
        raise SuiteError(
            f"request generated {r.completion_tokens} token(s); decode metrics need >= 2"
            " (set max_tokens >= 2 and ignore_eos=true in the workload)"
        )
    return r.completion_tokens - 1


def pp_tps(r: TimedRequest) -> float:
    return r.prompt_tokens / _span(r.t_sent, r.t_first_token, "time to first token")


def tg_tps(r: TimedRequest) -> float:
    return _decode_tokens(r) / _span(r.t_first_token, r.t_last_token, "decode time (last - first token)")


def ttft_ms(r: TimedRequest) -> float:
    return (r.t_first_token - r.t_sent) * 1000.0


def tpot_ms(r: TimedRequest) -> float:
    return (r.t_last_token - r.t_first_token) / _decode_tokens(r) * 1000.0


def itl_ms(r: TimedRequest) -> list[float]:
    return [(b - a) * 1000.0 for a, b in zip(r.token_times, r.token_times[1:])]


def e2e_ms(r: TimedRequest) -> float:
    return (r.t_end - r.t_sent) * 1000.0


def _p50_p99(samples: Sequence[float]) -> dict[str, float | None]:
    if not samples:
        return {"p50": None, "p99": None}
    return {"p50": stats.percentile(samples, 50), "p99": stats.percentile(samples, 99)}


def _mean_std(samples: Sequence[float]) -> dict[str, float]:
    mean, std = stats.mean_std(samples)
    return {"mean": mean, "std": std}


def summarize(requests: Sequence[TimedRequest]) -> dict[str, Any]:
    """llama-benchy-style summary: pp/tg as mean ± std over runs, latencies (ms) as p50/p99.

    ITL percentiles pool every chunk gap of every request (as vLLM's bench does); `itl_ms` is None
    when no request streamed more than one chunk.
    """
    if not requests:
        raise SuiteError("no timed requests to summarize; the benchmark recorded no runs")
    itl = [gap for r in requests for gap in itl_ms(r)]
    return {
        "requests": len(requests),
        "pp_tps": _mean_std([pp_tps(r) for r in requests]),
        "tg_tps": _mean_std([tg_tps(r) for r in requests]),
        "ttft_ms": _p50_p99([ttft_ms(r) for r in requests]),
        "tpot_ms": _p50_p99([tpot_ms(r) for r in requests]),
        "itl_ms": _p50_p99(itl),
        "e2e_ms": _p50_p99([e2e_ms(r) for r in requests]),
    }


def to_metrics(requests: Sequence[TimedRequest], pp_tokens: int, tg_tokens: int, depth: int = 0) -> dict[str, dict]:
    """Per-run samples in the results-file `metrics` format (see harness.report.run_report), for the level 5 gate.

    One sample per request for every metric; for ITL that sample is the request's median chunk gap, so
    the gate compares runs, not thousands of correlated gaps of a few runs.
    """
    if not requests:
        raise SuiteError("no timed requests to turn into metrics; the benchmark recorded no runs")

    def entry(samples: list[float], unit: str, name: str) -> dict:
        return {"samples": samples, "unit": unit, "higher_is_better": higher_is_better(name)}

    names = {k: metric_name(k, depth) for k in (f"pp{pp_tokens}", f"tg{tg_tokens}", *LATENCY_METRICS)}
    out = {
        names[f"pp{pp_tokens}"]: entry([pp_tps(r) for r in requests], "tok/s", f"pp{pp_tokens}"),
        names[f"tg{tg_tokens}"]: entry([tg_tps(r) for r in requests], "tok/s", f"tg{tg_tokens}"),
        names["ttft_ms"]: entry([ttft_ms(r) for r in requests], "ms", "ttft_ms"),
        names["tpot_ms"]: entry([tpot_ms(r) for r in requests], "ms", "tpot_ms"),
        names["e2e_ms"]: entry([e2e_ms(r) for r in requests], "ms", "e2e_ms"),
    }
    itl = [stats.median(gaps) for gaps in (itl_ms(r) for r in requests) if gaps]
    if itl:
        out[names["itl_ms"]] = entry(itl, "ms", "itl_ms")
    return out


# How the measured streams ask for their token counts. Written into every result and baseline: the engine does
# per-step work for logprobs (a log-softmax and a top-k over the vocabulary), so the engine- and client-clock
# metrics of two request kinds are not comparable (level 5 says so instead of judging them). Files without the
# field were measured with logprobs=1.
STREAM_REQUEST = "per-chunk usage, no logprobs"
STREAM_REQUEST_BEFORE = "logprobs=1"


def check_token_accounting(chunks: int, usage_tokens: int, allow_multi_token_chunks: bool) -> None:
    """Raise SuiteError when the streamed chunk count cannot match usage.completion_tokens.

    `chunks` counts the chunks that carry generated text (content or reasoning deltas; not the empty
    final chunk with finish_reason / usage).

    More chunks than tokens is always wrong (a token cannot be split across content chunks). Fewer chunks
    than tokens is expected with speculative decoding (several accepted tokens per chunk) and wrong otherwise.
    """
    if chunks < 0 or usage_tokens < 0:
        raise SuiteError(f"negative token accounting (chunks={chunks}, usage tokens={usage_tokens}); client bug")
    if chunks > usage_tokens:
        raise SuiteError(
            f"stream had {chunks} content chunks but usage.completion_tokens={usage_tokens}: more chunks than"
            " tokens means the server's usage or the client's chunk counting is wrong"
        )
    if chunks < usage_tokens and not allow_multi_token_chunks:
        raise SuiteError(
            f"stream had {chunks} content chunks but usage.completion_tokens={usage_tokens}: tokens were"
            " merged into chunks without speculative decoding (mark the config as multi-token if it speculates)"
        )
