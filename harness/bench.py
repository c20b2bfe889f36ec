"""Level 4 benchmark runner for any OpenAI-compatible `/v1/completions` server.

Prompts are token ids of exact length, fresh random ids for every run so prefix caching cannot
flatter prefill; `ignore_eos` makes every run generate exactly its tokens; token counts come from the
server's `usage`. Context depth follows llama-bench's "pp2048 @ d4096": a unique context of `depth`
tokens is sent first (and cached by prefix caching), then the measured request extends it.
"""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from harness import perf
from harness.client import Client
from harness.errors import SuiteError
from harness.server_metrics import EngineRound, scrape

REPO = Path(__file__).resolve().parent.parent
WORKLOADS_FILE = REPO / "tests" / "level4_perf" / "workloads.yaml"
# Any text the tokenizer splits into many distinct ids: the ids random prompts are drawn from.
_VOCAB_TEXT = (
    "import os, sys, json, math, time, random; from collections import defaultdict, OrderedDict\n"
    "class Parser(object):\n    def __init__(self, source, encoding='utf-8'):\n        self.tokens = []\n"
    "def main(argv=None):\n    for index, value in enumerate(sorted(items, key=lambda x: x[1])):\n"
    "        raise ValueError('unexpected %r at line %d' % (value, index))\n"
    "Return the number of elements; the queue is empty when the producer thread exits.\n"
)


@dataclass
class Workload:
    """One measured request shape. `kind` says which metrics it yields (llama-bench style):
    prefill -> ppN (@dD); decode -> tgN (@dD); latency -> ttft/tpot/itl/e2e (seed 000 Phase 7);
    concurrent -> ppN@cC and tgN@cC."""

    kind: str
    pp: int  # prompt tokens measured (after the depth context)
    tg: int  # tokens generated
    depth: int = 0  # context already in the KV cache
    concurrency: int = 1
    runs: int = 5
    warmup: int = 2

    @property
    def label(self) -> str:
        conc = f" c{self.concurrency}" if self.concurrency > 1 else ""
        return f"{self.kind} pp{self.pp}/tg{self.tg}" + (f" @ d{self.depth}" if self.depth else "") + conc

    @property
    def tokens(self) -> int:
        return self.depth + self.pp + self.tg


def load_workloads(platform_name: str, max_model_len: int, path: Path = WORKLOADS_FILE) -> tuple[list[Workload], list[str]]:
    """The platform's workloads (cpu / gpu sections), minus those over the model's context (listed)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        sec = raw["cpu" if platform_name == "cpu" else "gpu"]
        runs, warmup = int(sec["runs"]), int(sec["warmup"])
        short = int(sec["decode"]["prompt"])
        items = [Workload("prefill", int(pp), 2, int(d), 1, runs, warmup) for pp in sec["prefill"]["pp"] for d in sec["prefill"]["depths"]]
        items += [Workload("decode", short, int(tg), int(d), 1, runs, warmup) for tg in sec["decode"]["tg"] for d in sec["decode"]["depths"]]
        lat = sec["latency"]
        items.append(Workload("latency", int(lat["pp"]), int(lat["tg"]), 0, 1, runs, warmup))
        for c in sec.get("concurrent") or []:
            items.append(Workload("concurrent", int(c["pp"]), int(c["tg"]), 0, int(c["c"]), runs, warmup))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        raise SuiteError(f"{path}: malformed workloads ({type(e).__name__}: {e}); fix the file") from None
    fit = [w for w in items if w.tokens <= max_model_len]
    dropped = [f"{w.label}: needs {w.tokens} tokens > max_model_len {max_model_len}" for w in items if w.tokens > max_model_len]
    return fit, dropped


class PromptMaker:
    """Unique token-id prompts of exact length, drawn from ids the server's tokenizer produces."""

    def __init__(self, client: Client, seed: int = 42) -> None:
        try:
            ids = sorted(set(client.tokenize(_VOCAB_TEXT * 4)))
        except SuiteError:
            ids = list(range(100, 1000))  # servers without /tokenize (llama.cpp names it differently)
        if len(ids) < 20:
            raise SuiteError(f"the server's tokenizer gave only {len(ids)} distinct ids for the prompt text")
        self.ids = ids
        self.rng = random.Random(seed)

    def make(self, n: int) -> list[int]:
        return [self.rng.choice(self.ids) for _ in range(n)]


def _prompt(client: Client, maker: PromptMaker, w: Workload) -> list[int]:
    """A fresh prompt; with depth, its context is sent (and cached by prefix caching) first."""
    context = maker.make(w.depth) if w.depth else []
    if context:
        client.complete(context, 1)
    return context + maker.make(w.pp)


def _measure(client: Client, w: Workload, prompt: list[int]) -> perf.TimedRequest:
    r = client.stream(prompt, w.tg, ignore_eos=True)
    usage = r.usage
    if usage.get("prompt_tokens") != len(prompt):
        raise SuiteError(f"server counted {usage.get('prompt_tokens')} prompt tokens for {len(prompt)} token ids sent")
    if usage.get("completion_tokens") != w.tg:
        raise SuiteError(f"server generated {usage.get('completion_tokens')} tokens, asked for {w.tg} with ignore_eos")
    perf.check_token_accounting(r.chunk_tokens, usage["completion_tokens"], allow_multi_token_chunks=False)
    # pp counts the newly prefilled tokens only: the depth context was cached beforehand
    return perf.TimedRequest(w.pp, usage["completion_tokens"], r.t_sent, r.t_first, r.t_last, r.chunk_times, r.t_end)


@dataclass
class Measured:
    requests: list[perf.TimedRequest]  # client clock, every request
    engine: list[EngineRound] | None  # engine clock, one per round; None for servers without it


def run_workload(client: Client, maker: PromptMaker, w: Workload) -> Measured:
    """Warm-up rounds, then `runs` measured rounds of `concurrency` simultaneous requests."""
    with ThreadPoolExecutor(max_workers=w.concurrency) as pool:
        def round_(prompts: list[list[int]]) -> list[perf.TimedRequest]:
            return list(pool.map(lambda p: _measure(client, w, p), prompts))

        def prompts() -> list[list[int]]:
            return [_prompt(client, maker, w) for _ in range(w.concurrency)]

        for _ in range(w.warmup):
            round_(prompts())
        measured: list[perf.TimedRequest] = []
        engine: list[EngineRound] | None = []
        for _ in range(w.runs):
            ready = prompts()  # depth contexts are cached before the engine clock is read
            before = scrape(client) if engine is not None else None
            measured.extend(round_(ready))
            after = scrape(client) if before is not None else None
            if before is None or after is None:
                engine = None
                continue
            rnd = EngineRound.between(before, after)
            if rnd.requests != w.concurrency:
                raise SuiteError(f"{w.label}: {rnd.requests} requests finished during a round of {w.concurrency}; "
                                 "another client is using the server, so engine timings cannot be attributed")
            engine.append(rnd)
    return Measured(measured, engine)


def metrics_for(w: Workload, m: Measured) -> dict[str, dict]:
    """The metrics this workload's kind yields, with per-run samples (harness.reports format).

    pp and tg come from the engine's clock where the server exposes it (vLLM), else from the client's;
    latencies (TTFT, TPOT, ITL, e2e) are always the client's: they are what a user waits for. Each kind
    computes only its own metrics (a 2-token prefill probe has no meaningful client-side decode rate).
    """
    suffix = f"@d{w.depth}" if w.depth else ""
    conc = f"@c{w.concurrency}" if w.concurrency > 1 else ""
    pp, tg = f"pp{w.pp}{suffix}", f"tg{w.tg}{suffix}"

    def entry(name: str, samples: list[float], unit: str = "tok/s") -> dict:
        return {"samples": samples, "unit": unit, "higher_is_better": perf.higher_is_better(name)}

    def pp_samples() -> list[float]:
        # prompt tokens the engine computed (prefix-cache hits excluded) per second of prefill
        return [r.computed_prompt_tokens / r.prefill_s for r in m.engine] if m.engine else [perf.pp_tps(r) for r in m.requests]

    def tg_samples() -> list[float]:
        # tokens after each request's first (which belongs to prefill) per second of decode
        return [(r.generated_tokens - r.requests) / r.decode_s for r in m.engine] if m.engine else [perf.tg_tps(r) for r in m.requests]

    if w.kind == "prefill":
        return {pp: entry(pp, pp_samples())}
    if w.kind == "decode":
        return {tg: entry(tg, tg_samples())}
    if w.kind == "concurrent":
        return {pp + conc: entry(pp, pp_samples()), tg + conc: entry(tg, tg_samples())}
    lat = perf.to_metrics(m.requests, w.pp, w.tg, w.depth)
    return {n: lat[n] for n in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms") if n in lat}


def workload_record(workloads: list[Workload], dropped: list[str]) -> dict[str, Any]:
    return {"items": [asdict(w) for w in workloads], "dropped": dropped, "temperature": 0.0,
            "ignore_eos": True, "prompts": "random token ids, unique per run", "seed": 42}
