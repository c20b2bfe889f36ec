"""Level 4 benchmark runner for any OpenAI-compatible `/v1/completions` server.

Prompts are token ids of exact length, fresh random ids for every run so prefix caching cannot
flatter prefill; `ignore_eos` makes every run generate exactly its tokens; token counts come from the
server's `usage`. Context depth follows llama-bench's "pp2048 @ d4096": a unique context of `depth`
tokens is sent first (and cached by prefix caching), then the measured request extends it.
"""
from __future__ import annotations

import math
import random
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from harness.core import stats
from harness.core.errors import SuiteError
from harness.core.paths import REPO
from harness.core.yamlfile import load_mapping
from harness.engine.client import Client
from harness.engine.server_metrics import SPEC_COUNTERS, EngineRound, ScrapeFailed, scrape
from harness.perf import metrics as perf
from harness.perf.clocks import RoundClocks
from harness.perf.host_cpu import HostCpuProbe

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
    prefill -> ppN (@dD); decode -> tgN (@dD); latency -> ttft/tpot/itl/e2e (the users' plan's metrics);
    concurrent -> ppN@cC and tgN@cC."""

    kind: str
    pp: int  # prompt tokens measured (after the depth context)
    tg: int  # tokens generated
    depth: int = 0  # context already in the KV cache
    concurrency: int = 1
    runs: int = 5
    warmup: int = 2
    max_runs: int | None = None  # more rounds (up to this) where the run-to-run CV needs them

    @property
    def label(self) -> str:
        conc = f" c{self.concurrency}" if self.concurrency > 1 else ""
        return f"{self.kind} pp{self.pp}/tg{self.tg}" + (f" @ d{self.depth}" if self.depth else "") + conc

    @property
    def tokens(self) -> int:
        return self.depth + self.pp + self.tg


def load_workloads(platform_name: str, max_model_len: int, path: Path = WORKLOADS_FILE) -> tuple[list[Workload], list[str]]:
    """The platform's workloads (cpu / gpu sections), minus those over the model's context (listed).

    Every key and value is checked here, before any server time is spent: a misspelled section would drop its
    workloads without a word (level 5 then reports their metrics only as "not measured"), a value that cannot be
    measured would crash mid-benchmark or record one sample as resolved, and two workloads yielding one metric name
    would overwrite each other's numbers."""
    raw = load_mapping(path)  # a YAML error: one line with its line number
    _keys(path, "the top level", raw, (), ("cpu", "gpu"))
    name = "cpu" if platform_name == "cpu" else "gpu"
    if name not in raw:
        raise SuiteError(f"{path}: malformed workloads (no {name} section, the {platform_name} platform's); "
                         "fix the file")
    sec = _keys(path, name, raw[name], ("runs", "warmup", "decode"), ("max_runs", "prefill", "latency", "concurrent"))
    runs = _count(path, f"{name}.runs", sec["runs"], 2, "one round has no run-to-run spread for the gate to judge")
    warmup = _count(path, f"{name}.warmup", sec["warmup"], 0, "rounds run and discarded before measuring")
    mx = runs if sec.get("max_runs") is None else _count(path, f"{name}.max_runs", sec["max_runs"], runs,
                                                         "the most rounds, so at least runs")
    items: list[Workload] = []
    # decode is every set's core; prefill and latency may be left out by a set made to fit a short call
    if sec.get("prefill") is not None:
        pre = _keys(path, f"{name}.prefill", sec["prefill"], ("pp", "depths"))
        items += [Workload("prefill", pp, 2, d, 1, runs, warmup, mx)
                  for pp in _counts(path, f"{name}.prefill.pp", pre["pp"], 1, _PROMPT)
                  for d in _counts(path, f"{name}.prefill.depths", pre["depths"], 0, _DEPTH)]
    dec = _keys(path, f"{name}.decode", sec["decode"], ("prompt", "tg", "depths"))
    short = _count(path, f"{name}.decode.prompt", dec["prompt"], 1, _PROMPT)
    items += [Workload("decode", short, tg, d, 1, runs, warmup, mx)
              for tg in _counts(path, f"{name}.decode.tg", dec["tg"], 2, _TG)
              for d in _counts(path, f"{name}.decode.depths", dec["depths"], 0, _DEPTH)]
    if sec.get("latency") is not None:
        lat = _keys(path, f"{name}.latency", sec["latency"], ("pp", "tg"))
        items.append(Workload("latency", _count(path, f"{name}.latency.pp", lat["pp"], 1, _PROMPT),
                              _count(path, f"{name}.latency.tg", lat["tg"], 2, _TG), 0, 1, runs, warmup, mx))
    conc = [] if sec.get("concurrent") is None else sec["concurrent"]
    if not isinstance(conc, list):
        raise SuiteError(f"{path}: {name}.concurrent is {_shown(conc)}; it must be a list of {{c, pp, tg}} mappings; "
                         "fix the file")
    for i, c in enumerate(conc):
        at = f"{name}.concurrent[{i}]"
        c = _keys(path, at, c, ("c", "pp", "tg"))
        batch = _count(path, f"{at}.c", c["c"], 2, "c: 1 is batch-1, which the prefill and decode workloads measure")
        items.append(Workload("concurrent", _count(path, f"{at}.pp", c["pp"], 1, _PROMPT),
                              _count(path, f"{at}.tg", c["tg"], 2, _TG), 0, batch, runs, warmup, mx))
    owners: dict[str, Workload] = {}
    for w in items:
        claim_metrics(owners, w, metric_names(w), path)
    fit = [w for w in items if w.tokens <= max_model_len]
    dropped = [f"{w.label}: needs {w.tokens} tokens > max_model_len {max_model_len}" for w in items if w.tokens > max_model_len]
    return fit, dropped


# Why each workload value has its floor (named in the one-line error)
_PROMPT = "a prompt of at least one token"
_TG = "tgN's rate counts the tokens after the first, so it needs two"
_DEPTH = "tokens of cached context before the measured request; 0 for none"


def _shown(value: object) -> str:
    return repr(value)[:60]


def _keys(path: Path, where: str, value: object, required: tuple[str, ...],
          optional: tuple[str, ...] = ()) -> dict:
    """`value` as a mapping that has every required key and no other than the optional ones."""
    if not isinstance(value, dict):
        raise SuiteError(f"{path}: malformed workloads ({where} is {_shown(value)}, not a mapping); fix the file")
    valid = required + optional
    unknown = [str(k) for k in value if k not in valid]
    if unknown:
        raise SuiteError(f"{path}: {where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(valid)}; "
                         "fix the file")
    missing = [k for k in required if k not in value]
    if missing:
        raise SuiteError(f"{path}: malformed workloads ({where}: missing {', '.join(missing)}); fix the file")
    return value


def _count(path: Path, where: str, value: object, least: int, why: str) -> int:
    """An integer of at least `least`. A YAML boolean is refused: `runs: yes` would read as one round."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SuiteError(f"{path}: {where} is {_shown(value)}; it must be an integer >= {least} ({why}); fix the file")
    return value


def _counts(path: Path, where: str, value: object, least: int, why: str) -> list[int]:
    # an empty list measured nothing of its section without a word (`tg: []` dropped every decode metric)
    if not isinstance(value, list) or not value:
        raise SuiteError(f"{path}: {where} is {_shown(value)}; it must be a list of integers >= {least}, at least one; "
                         "fix the file")
    return [_count(path, f"{where}[{i}]", v, least, why) for i, v in enumerate(value)]


def metric_names(w: Workload) -> tuple[str, ...]:
    """The names of the metrics a workload yields (metrics_for's), llama-bench style: ppN / tgN with @dD at a depth;
    a concurrent workload's always carry @cC, so they never take a batch-1 workload's name."""
    if w.kind == "latency":
        return tuple(perf.metric_name(n, w.depth) for n in perf.LATENCY_METRICS)
    pp, tg = perf.metric_name(f"pp{w.pp}", w.depth), perf.metric_name(f"tg{w.tg}", w.depth)
    if w.kind == "concurrent":
        return f"{pp}@c{w.concurrency}", f"{tg}@c{w.concurrency}"
    return (pp,) if w.kind == "prefill" else (tg,)


def claim_metrics(owners: dict[str, Workload], w: Workload, names: Iterable[str], path: Path) -> None:
    """Record in `owners` that `w` yields `names`. A name another workload already yields is refused: its numbers
    would replace that workload's under the same gated name (`tg: [32, 32]`, or two batches sharing a prompt length)."""
    for n in names:
        if n in owners:
            raise SuiteError(f"workloads {owners[n].label} and {w.label} both yield metric {n}; remove the duplicate "
                             f"from {path}")
        owners[n] = w


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
    r = client.stream(prompt, w.tg, ignore_eos=True, per_chunk_usage=True)
    usage = r.usage
    if usage.get("prompt_tokens") != len(prompt):
        raise SuiteError(f"server counted {usage.get('prompt_tokens')} prompt tokens for {len(prompt)} token ids sent")
    if usage.get("completion_tokens") != w.tg:
        raise SuiteError(f"server generated {usage.get('completion_tokens')} tokens, asked for {w.tg} with ignore_eos")
    perf.check_token_accounting(r.chunk_tokens, usage["completion_tokens"], allow_multi_token_chunks=False)
    # pp counts the newly prefilled tokens only: the depth context was cached beforehand
    return perf.TimedRequest(w.pp, usage["completion_tokens"], r.t_sent, r.t_first, r.t_last, r.chunk_times, r.t_end)


@dataclass
class RoundPolicy:
    """How many measured rounds a workload gets (harness.perf.benchmark derives it from the gate's thresholds).

    At least `runs` rounds that ran at the loaded clock; then, while the run-to-run CV of any of the
    workload's metrics is too high for the 95% CI of a median ratio to be narrower than +-half_width,
    more rounds, up to `max_runs`. A round flagged by the clock sampler (it ran below the loaded clock)
    is kept apart and measured again, at most `max_flagged` times."""

    half_width: float = 0.01
    max_runs: int | None = None  # None: exactly `runs`
    max_flagged: int | None = None  # None: `runs`


def rounds_needed(cv: float, half_width: float, runs: int, max_runs: int) -> int:
    """Rounds per side for a 95% CI of a median ratio of about +-half_width at this CV.

    SE(median) ~ 1.2533 x sd / sqrt(n), and a ratio of two independent medians has sqrt(2) times that:
    n = 2 x (1.96 x 1.2533 x CV / half_width)^2, clamped to [runs, max_runs]."""
    if not math.isfinite(cv) or half_width <= 0:
        return runs
    n = math.ceil(2 * (1.96 * 1.2533 * cv / half_width) ** 2)
    return int(min(max_runs, max(runs, n)))


@dataclass
class Measured:
    """The rounds of one workload that count (clean), and those set aside (flagged: below the loaded clock)."""

    requests: list[perf.TimedRequest]  # client clock, every request of the counted rounds
    engine: list[EngineRound] | None  # engine clock, one per counted round; None for servers without it
    clocks: list[RoundClocks] | None = None  # one per counted round (None: not sampled)
    round_of_request: list[int] | None = None  # the counted round each request belongs to
    flagged: "Measured | None" = None
    unresolved: str | None = None  # why these numbers cannot be gated (the gate says inconclusive)
    # vLLM's speculative-decoding counters (SPEC_COUNTERS) summed over the counted rounds; None off the engine clock
    spec_counters: dict[str, float] | None = None

    @property
    def rounds(self) -> int:
        if self.clocks is not None:
            return len(self.clocks)
        return len(self.engine) if self.engine is not None else len(self.requests)


class _NoClocks:
    available = False
    floor = None

    @contextmanager
    def round(self):
        yield RoundClocks()

    def describe(self) -> dict:
        return {"available": False, "reason": "not sampled"}


def _warm(client: Client, maker: PromptMaker, w: Workload, pool: ThreadPoolExecutor) -> None:
    """A request of the measured prompt length right before the round: the GPU is at its loaded clock
    when the measured request arrives (the gap is one /metrics scrape), not ramping up from idle."""
    prompts = [maker.make(w.pp) for _ in range(w.concurrency)]
    list(pool.map(lambda p: client.complete(p, min(w.tg, 2), ignore_eos=True), prompts))


def run_workload(client: Client, maker: PromptMaker, w: Workload, sampler=None,
                 policy: RoundPolicy | None = None, host_probe: HostCpuProbe | None = None) -> Measured:
    """Warm-up rounds, then measured rounds of `concurrency` simultaneous requests, each right after its
    own warm-up request; clocks sampled per round; more rounds where the noise needs them (policy). `host_probe`
    (harness.perf.host_cpu.HostCpuProbe) times the host's CPU after each measured round, outside the round."""
    sampler = sampler or _NoClocks()
    policy = policy or RoundPolicy()
    max_runs = max(w.runs, policy.max_runs or w.max_runs or w.runs)
    max_flagged = w.runs if policy.max_flagged is None else policy.max_flagged
    clean = Measured([], [], [], [])
    flagged = Measured([], [], [], [])
    # Which clock ppN / tgN use is decided by the workload's first scrape and then kept: samples of one
    # metric from two clocks (engine vs client differ by ~30% on an H200) would fake a regression.
    use_engine: bool | None = None

    def engine_totals() -> dict[str, float] | None:
        nonlocal use_engine
        if use_engine is False:
            return None
        try:
            totals, why = scrape(client), "it no longer lists vLLM's engine timings"
        except ScrapeFailed as e:
            totals, why = None, str(e)
        if use_engine is None:  # the first scrape: a server without engine timings uses the client clock
            use_engine = totals is not None
        elif totals is None:
            raise SuiteError(f"{w.label}: /metrics failed after this workload's rounds used the engine clock ({why}); "
                             "its samples cannot switch to the client clock mid-workload, so rerun (check the server)")
        return totals

    with ThreadPoolExecutor(max_workers=w.concurrency) as pool:
        def round_(prompts: list[list[int]]) -> list[perf.TimedRequest]:
            return list(pool.map(lambda p: _measure(client, w, p), prompts))

        def prompts() -> list[list[int]]:
            return [_prompt(client, maker, w) for _ in range(w.concurrency)]

        for _ in range(w.warmup):
            round_(prompts())
        while True:
            ready = prompts()  # depth contexts are cached before the engine clock is read
            _warm(client, maker, w, pool)
            before = engine_totals()
            with sampler.round() as rc:
                reqs = round_(ready)
            after = engine_totals() if before is not None else None  # None only when not on the engine clock
            if host_probe is not None:
                host_probe.after_round()
            rnd = None
            if before is not None and after is not None:
                rnd = EngineRound.between(before, after)
                if rnd.requests != w.concurrency:
                    raise SuiteError(f"{w.label}: {rnd.requests} requests finished during a round of {w.concurrency}; "
                                     "another client is using the server, so engine timings cannot be attributed")
            side = flagged if rc.flagged else clean
            side.round_of_request.extend([len(side.clocks)] * len(reqs))
            side.requests.extend(reqs)
            side.clocks.append(rc)
            if rnd is not None:
                side.engine.append(rnd)
                side.spec_counters = _add_spec_counters(side.spec_counters, before, after)
            n_clean, n_flagged = len(clean.clocks), len(flagged.clocks)
            if n_flagged > max_flagged or n_clean >= max_runs:
                break
            if n_clean >= w.runs:
                probe = Measured(clean.requests, clean.engine if use_engine else None, clean.clocks,
                                 clean.round_of_request)
                worst = stats.worst_cv(e["samples"] for e in metrics_for(w, probe).values())
                if n_clean >= rounds_needed(worst, policy.half_width, w.runs, max_runs):
                    break
    if not use_engine:
        clean.engine = flagged.engine = None
    if not any(c.n for c in clean.clocks + flagged.clocks):
        clean.clocks = flagged.clocks = None
    n_clean, n_flagged = clean.rounds, flagged.rounds
    if n_flagged:
        clean.flagged = flagged
    if n_clean < w.runs:
        clean.unresolved = (f"only {n_clean} of {n_clean + n_flagged} rounds ran at the loaded clock "
                            f"({'; '.join(sorted({c.why for c in flagged.clocks or [] if c.why}))[:300]})")
        if n_clean == 0:  # nothing clean: report the flagged numbers, gated as inconclusive
            flagged.unresolved = clean.unresolved
            return flagged
    return clean


def _add_spec_counters(totals: dict[str, float] | None, before: dict[str, float],
                       after: dict[str, float]) -> dict[str, float]:
    """`totals` plus one measured round's speculative-decoding counters. Read around the measured requests only:
    warm-up rounds, the 2-token warm request before each round and depth contexts accept few or no drafts and
    would pull the acceptance recorded next to tg below that of the requests tg was measured on."""
    out = dict(totals or dict.fromkeys(SPEC_COUNTERS, 0.0))
    for k in SPEC_COUNTERS:
        out[k] += after.get(k, 0.0) - before.get(k, 0.0)
    return out


def _clocks_for(m: Measured, n: int, per: str, mask: list[bool] | None = None) -> list[dict] | None:
    """Clock records aligned with `n` samples taken per round or per request (mask: requests kept)."""
    if not m.clocks:
        return None
    if per == "round":
        recs = [c.record() for c in m.clocks]
    else:
        idx = m.round_of_request or []
        if mask is not None:
            idx = [i for i, keep in zip(idx, mask) if keep]
        recs = [m.clocks[i].record() for i in idx]
    return recs if len(recs) == n else None


def metrics_for(w: Workload, m: Measured) -> dict[str, dict]:
    """The metrics this workload's kind yields, with per-run samples (harness.report.run_report format).

    pp and tg come from the engine's clock where the server exposes it (vLLM), else from the client's;
    latencies (TTFT, TPOT, ITL, e2e) are always the client's: they are what a user waits for. Each kind
    computes only its own metrics (a 2-token prefill probe has no meaningful client-side decode rate).
    Entries carry `clock` (engine or client: the gate never compares samples of two clocks), `rounds`
    (the GPU clocks each sample ran at), `flagged` (samples of rounds set aside for running below the
    loaded clock) and `unresolved` (why the gate cannot judge them) where known.
    """
    names = metric_names(w)
    timer = "engine" if m.engine else "client"  # the clock of pp / tg (flagged rounds share it)

    def values(mm: Measured) -> dict[str, tuple[list[float], list[dict] | None]]:
        def pp_samples():
            # prompt tokens the engine computed (prefix-cache hits excluded) per second of prefill
            if mm.engine:
                v = [r.computed_prompt_tokens / r.prefill_s for r in mm.engine]
                return v, _clocks_for(mm, len(v), "round")
            v = [perf.pp_tps(r) for r in mm.requests]
            return v, _clocks_for(mm, len(v), "request")

        def tg_samples():
            # tokens after each request's first (which belongs to prefill) per second of decode
            if mm.engine:
                v = [(r.generated_tokens - r.requests) / r.decode_s for r in mm.engine]
                return v, _clocks_for(mm, len(v), "round")
            v = [perf.tg_tps(r) for r in mm.requests]
            return v, _clocks_for(mm, len(v), "request")

        if w.kind == "prefill":
            return {names[0]: pp_samples()}
        if w.kind == "decode":
            return {names[0]: tg_samples()}
        if w.kind == "concurrent":
            return {names[0]: pp_samples(), names[1]: tg_samples()}
        lat = perf.to_metrics(mm.requests, w.pp, w.tg, w.depth)
        out = {}
        for n, base in zip(names, perf.LATENCY_METRICS):
            if n in lat:
                v = lat[n]["samples"]
                mask = [bool(perf.itl_ms(r)) for r in mm.requests] if base == "itl_ms" else None
                out[n] = (v, _clocks_for(mm, len(v), "request", mask))
        return out

    out: dict[str, dict] = {}
    flagged = values(m.flagged) if m.flagged is not None and m.flagged.requests else {}
    for name, (samples, clocks) in values(m).items():
        base = re.sub(r"@c\d+$", "", name)
        latency = name.split("@")[0].endswith("_ms")
        entry: dict[str, Any] = {"samples": samples, "unit": "ms" if latency else "tok/s",
                                 "higher_is_better": perf.higher_is_better(base), "clock": "client" if latency else timer}
        if clocks is not None:
            entry["rounds"] = clocks
        if name in flagged:
            fv, fc = flagged[name]
            entry["flagged"] = [{"value": v, **(c or {})} for v, c in zip(fv, fc or [None] * len(fv))]
        if m.unresolved:
            entry["unresolved"] = m.unresolved
        out[name] = entry
    return out


def gpu_prefill(client: Client, maker: PromptMaker, w: Workload,
                profile_one: Callable[[Callable[[], None]], float], sampler=None) -> dict[str, Any]:
    """`ppN_gpu`: prompt tokens per second of GPU kernel time, one profiled prefill per round.

    Why: on the gpt-oss-120b shape an H200 spends 51 ms in kernels on a 2048-token prefill while the engine's
    prefill time is 72-115 ms: the rest is host work (launches, scheduling), whose jitter moved pp2048's
    median by up to 24% between boots with nothing changed. The kernels' own time varied by about 0.1%
    round to round, so this metric resolves the 3% gate for what a kernel change does to prefill; the
    engine-clock ppN stays next to it for what the user waits for. `profile_one(request)` runs `request`
    under the server's profiler and returns the summed kernel microseconds of the trace; the request asks
    for one token, so no decode step is in it. Rounds that ran below the loaded clock are set aside and
    measured again (at most `w.runs` times), as in `run_workload`."""
    if w.depth:
        raise SuiteError(f"{w.label}: ppN_gpu is measured at depth 0 only (the profiled prefill sends no context)")
    return _kernel_rate(client, maker, w, profile_one, sampler, kernel_metric_name(w), lambda: maker.make(w.pp), 1,
                        w.pp, "GPU kernel time of one profiled prefill per round (torch profiler trace)")


def gpu_decode(client: Client, maker: PromptMaker, w: Workload,
               profile_one: Callable[[Callable[[], None]], float], sampler=None) -> dict[str, Any]:
    """`tgN_gpu`: generated tokens per second of GPU kernel time, one profiled batch-1 request of N tokens per round.

    Why: a config whose kernels finish a decode step before vLLM's host side has the next one ready is
    host-bound, and its engine-clock tgN then follows the host. On an H200 the plugin's gpt-oss-20b decode took
    2.17 ms of kernels per token while its tg32 samples of one boot ranged 314.6-470.6 tok/s, and an A/A boot of
    `gemv-bf16` on the 120b shape came out 15% slower on tg32 with nothing changed; stock's kernel-bound tg32
    moved by 0.35% in the same run. The kernels' time per token does not follow the host, so this metric gates
    what a kernel change does to decode. The request's kernel time includes its short prompt's prefill (one
    step of N + 1): a fixed share, the same in the baseline and the run. It dilutes a slowdown of the decode kernels
    alone: on the 120b shape with the plugin, the 16-token prompt's prefill reads ~50 of 128 experts per layer,
    ~9 ms against ~73 ms of decode steps (H200, 2026-12-01), ~12% of tg32_gpu, so the 3% gate catches decode-only
    slowdowns from ~3.4% (tg128_gpu: ~3%, from ~3.1%). Measuring decode steps alone would change the metric that
    every recorded baseline holds.

    At a depth (`tgN_gpu@dD`) the context is sent and cached before the profiler starts, as for the engine-clock
    `tgN@dD`, so the trace holds the decode steps over that context: the attention kernels at depth, which a
    depth-0 kernel rate cannot see and a host-bound `tgN@dD` hides."""
    at = f" after a cached context of {w.depth} tokens" if w.depth else ""
    return _kernel_rate(client, maker, w, profile_one, sampler, kernel_metric_name(w),
                        lambda: _prompt(client, maker, w), w.tg, w.tg,
                        f"GPU kernel time of one profiled batch-1 request of {w.pp} prompt + {w.tg} generated tokens"
                        f"{at} per round, its prompt's prefill included (torch profiler trace)")


def kernel_metric_name(w: Workload) -> str:
    """`ppN_gpu` for a prefill workload, `tgN_gpu` (`tgN_gpu@dD` at a depth) for a batch-1 decode one."""
    return f"pp{w.pp}_gpu" if w.kind == "prefill" else perf.metric_name(f"tg{w.tg}_gpu", w.depth)


def has_kernel_metric(w: Workload) -> bool:
    """The workloads level 4 also measures in kernel time on a GPU: prefill at depth 0, batch-1 decode at every
    depth (kernel time at depth is the witness that tells a host-bound tgN@dD from an attention slowdown)."""
    return (w.kind == "prefill" and w.depth == 0) or w.kind == "decode"


def gpu_rate(client: Client, maker: PromptMaker, w: Workload,
             profile_one: Callable[[Callable[[], None]], float], sampler=None) -> dict[str, Any]:
    """The kernel-time metric of a prefill (`ppN_gpu`) or batch-1 decode (`tgN_gpu`) workload."""
    if w.kind == "prefill":
        return gpu_prefill(client, maker, w, profile_one, sampler)
    if w.kind == "decode":
        return gpu_decode(client, maker, w, profile_one, sampler)
    raise SuiteError(f"a {w.kind} workload has no kernel-time metric (ppN_gpu and tgN_gpu are prefill and batch-1 decode)")


def _kernel_rate(client: Client, maker: PromptMaker, w: Workload, profile_one: Callable[[Callable[[], None]], float],
                 sampler, name: str, make_prompt: Callable[[], list[int]], max_tokens: int, tokens: int,
                 source: str) -> dict[str, Any]:
    """`tokens` per second of the summed kernel time of one profiled request (`make_prompt()`, called before the
    profiler starts; `max_tokens` generated) per round, with the clocks of each round."""
    sampler = sampler or _NoClocks()
    samples: list[float] = []
    rounds: list[dict] = []
    flagged: list[dict] = []
    while len(samples) < w.runs and len(flagged) < w.runs:
        client.complete(maker.make(w.pp), 1, ignore_eos=True)  # warm, as the engine-clock rounds are
        prompt = make_prompt()
        box = {}

        def request() -> None:
            with sampler.round() as rc:
                client.complete(prompt, max_tokens, ignore_eos=True)
            box["clocks"] = rc

        kernel_us = profile_one(request)
        if kernel_us <= 0:
            raise SuiteError(f"{name}: the profiled request recorded no GPU kernel time; is this a GPU server "
                             "started with the suite's --profiler-config?")
        value, rc = tokens / (kernel_us / 1e6), box["clocks"]
        if rc.flagged:
            flagged.append({"value": value, **rc.record()})
            continue
        samples.append(value)
        rounds.append(rc.record())
    n_clean, n_all = len(samples), len(samples) + len(flagged)
    if not samples:  # nothing at the loaded clock: report the flagged rounds, gated as inconclusive below
        samples = [f.pop("value") for f in flagged]
        rounds, flagged = flagged, []
    entry: dict[str, Any] = {"samples": samples, "unit": "tok/s", "higher_is_better": True, "clock": "kernel",
                             "source": source}
    if sampler.available:
        entry["rounds"] = rounds
    if flagged:
        entry["flagged"] = flagged
    if n_clean < w.runs:
        entry["unresolved"] = f"only {n_clean} of {n_all} profiled rounds ran at the loaded clock"
    return entry


def workload_record(workloads: list[Workload], dropped: list[str]) -> dict[str, Any]:
    return {"items": [asdict(w) for w in workloads], "dropped": dropped, "temperature": 0.0,
            "ignore_eos": True, "prompts": "random token ids, unique per run", "seed": 42,
            "stream_request": perf.STREAM_REQUEST}


def check_workloads_option(option: str | None, platform_name: str) -> None:
    """--workloads: a missing or malformed file fails the run at collection time, in one line."""
    if not option:
        return
    if not Path(option).is_file():
        raise SuiteError(f"--workloads {option}: no such file; pass a level 4 workloads YAML "
                         "(e.g. tests/level4_perf/workloads-gpu-quick.yaml)")
    load_workloads(platform_name, 10 ** 9, Path(option))
