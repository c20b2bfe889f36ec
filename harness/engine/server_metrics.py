"""Engine-side request timings from vLLM's Prometheus `/metrics` (histogram sums and counts).

Why: a client times when chunks *arrive*; on a starved host (2 shared cores) vLLM's API process can
deliver a whole reply in one burst, so client-side decode rates become fiction. vLLM stamps prefill
and decode times in the engine; diffing the histogram sums around a round of requests gives the
engine's own numbers for exactly those requests (nothing else runs on the suite's server meanwhile).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

from harness.core.errors import SuiteError
from harness.engine.client import Client
from harness.engine.server import ServerDied

NEEDED = ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
          "vllm:request_prefill_kv_computed_tokens", "vllm:request_generation_tokens")


def parse_prometheus(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, summed over its label sets: {name: value}
    (prometheus_client's parser: escaped label values, exemplars and NaN/Inf are its concern, not ours)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def metric_value(base_url: str, name: str) -> float:
    """Sum of one Prometheus metric's samples on a server's /metrics (all label sets)."""
    values = parse_prometheus(requests.get(base_url + "/metrics", timeout=10).text)
    if name not in values:
        raise SuiteError(f"/metrics of {base_url} has no {name}")
    return values[name]


# One slow or failed answer must not end the engine clock for a whole workload (its rounds would then mix
# clocks, which differ by ~30% on an unchanged H200): a failed read is retried, each try bounded.
SCRAPE_ATTEMPTS = 3
SCRAPE_TIMEOUT_S = 10.0
SCRAPE_PAUSE_S = 0.5
NO_METRICS = (404, 501)  # no /metrics at all (SGLang without --enable-metrics; llama.cpp without --metrics)


class ScrapeFailed(SuiteError):
    """/metrics could not be read in SCRAPE_ATTEMPTS tries (as opposed to a server that has no engine timings)."""


def scrape(client: Client) -> dict[str, float] | None:
    """The server's metrics summed over labels; None if it lacks the engine timings this module needs (no
    /metrics, or one without vLLM's histograms). A failed read (exception, timeout, another status) is tried
    again up to SCRAPE_ATTEMPTS times; ScrapeFailed when none succeeded."""
    why = ""
    for attempt in range(SCRAPE_ATTEMPTS):
        if attempt:
            time.sleep(SCRAPE_PAUSE_S)
        try:
            r = client.get("/metrics", timeout_s=SCRAPE_TIMEOUT_S)
        except ServerDied:
            raise  # a dead server is not a transient failure
        except Exception as e:
            why = " ".join(str(e).split())[:160] or type(e).__name__
            continue
        if r.status_code in NO_METRICS:
            return None
        if r.status_code != 200:
            why = f"HTTP {r.status_code}"
            continue
        try:
            out = parse_prometheus(r.text)
        except ValueError:  # a 200 that is not Prometheus text (another server's page): no engine timings
            return None
        return out if all(f"{n}_sum" in out for n in NEEDED) else None
    raise ScrapeFailed(f"GET /metrics failed {SCRAPE_ATTEMPTS} times ({why})")


@dataclass
class EngineRound:
    """Engine-side totals of the requests that finished between two scrapes."""

    requests: int
    prefill_s: float
    decode_s: float
    computed_prompt_tokens: float  # prompt tokens actually computed (prefix-cache hits excluded)
    generated_tokens: float

    @classmethod
    def between(cls, before: dict[str, float], after: dict[str, float]) -> "EngineRound":
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        return cls(int(round(d["vllm:request_decode_time_seconds_count"])), d["vllm:request_prefill_time_seconds_sum"],
                   d["vllm:request_decode_time_seconds_sum"], d["vllm:request_prefill_kv_computed_tokens_sum"],
                   d["vllm:request_generation_tokens_sum"])


# vLLM's speculative-decoding counters (Prometheus counters: the exposition names end in _total)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")


def spec_decode_between(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """Drafts, drafted and accepted tokens between two scrapes, the mean acceptance length (tokens a target step
    yields: 1 + accepted / drafts) and the acceptance rate (accepted / drafted); None when nothing was drafted
    (no speculator, or a server without the counters)."""
    if not before or not after:
        return None
    drafts, drafted, accepted = (after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS)
    if drafts <= 0 or drafted <= 0:
        return None
    return {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "mean_acceptance_length": 1.0 + accepted / drafts, "acceptance_rate": accepted / drafted}
