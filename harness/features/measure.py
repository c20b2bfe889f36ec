"""Measure a feature's criteria on its baseline and its candidate, in one pytest run, on one machine, with
level 4's machinery (harness.perf.bench: warm-up right before each round, engine-clock pp/tg, client latencies,
ppN_gpu from profiled kernel time, clock-flagged rounds measured again).

Drift must cancel, so the order is fixed by what fits:
- both servers up at once (CPU, the tiny model on a GPU): rounds interleaved ABBA, one round of every workload
  per side per turn, so a machine that slows down mid-run slows both sides alike;
- one at a time (the gpt-oss shapes fill a GPU): A, B, A: the candidate bracketed by two baseline boots, each
  boot measured for its share of the rounds, so drift over the run shows as the two baseline boots disagreeing
  rather than as a difference.
Memory (used GiB, KV tokens) is vLLM's own accounting of each boot; boot_s is each boot's time to /health.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Callable

from harness.core import stats
from harness.core.errors import SuiteError
from harness.engine.server import max_num_seqs
from harness.engine.server_metrics import scrape, spec_decode_between
from harness.features.spec import Criterion
from harness.perf import bench, host_cpu
from harness.perf.benchmark import kernel_time_probe
from harness.perf.memory import server_memory
from harness.perf.metrics import metric_concurrency, parse_metric_name
from harness.session.suite import RunningServer

@dataclass
class Side:
    """One side of the comparison (baseline or candidate): its samples over every boot measured."""

    role: str  # "baseline" / "candidate"
    config: str
    samples: dict[str, list[float]] = field(default_factory=dict)  # timing and spec metrics, one per round
    numbers: dict[str, list[float]] = field(default_factory=dict)  # used_memory, kv_capacity, boot_s: one per boot
    boots: list[dict] = field(default_factory=list)  # per boot: log, boot seconds, memory section
    clocks: dict[str, str] = field(default_factory=dict)  # metric -> clock it was measured with
    unresolved: dict[str, str] = field(default_factory=dict)  # metric -> why its samples cannot be judged
    boot_ends: list[dict[str, int]] = field(default_factory=list)  # per boot (A, B, A): sample counts at its end
    # level 4's host CPU loop after each unprofiled round, on this side's engine core (harness.perf.host_cpu)
    host_loop_us: list[float] = field(default_factory=list)
    host_cpus: list[int] = field(default_factory=list)
    host_reason: str | None = None  # why the loop could not be timed
    # the sequences its server admitted (--max-num-seqs; None: not known): a criterion at more concurrent requests
    # timed them that many at a time behind a queue (the users' flags admit 2)
    max_num_seqs: int | None = None

    def end_boot(self) -> None:
        self.boot_ends.append({m: len(v) for m, v in self.samples.items()})

    def drift(self, metric: str) -> float | None:
        """How far the medians of this side's first two boots differ (|second / first - 1|): the machine's drift
        over an A, B, A run, which no number of rounds within a boot averages away. None: fewer than two boots."""
        if len(self.boot_ends) < 2:
            return None
        e1, e2 = self.boot_ends[0].get(metric, 0), self.boot_ends[1].get(metric, 0)
        first, second = self.samples.get(metric, [])[:e1], self.samples.get(metric, [])[e1:e2]
        if not first or not second or not stats.median(first):
            return None
        return abs(stats.median(second) / stats.median(first) - 1.0)

    def add(self, metric: str, values: list[float]) -> None:
        self.samples.setdefault(metric, []).extend(values)

    def number(self, metric: str, value: float | None) -> None:
        if value is not None:
            self.numbers.setdefault(metric, []).append(float(value))

    def value(self, metric: str) -> list[float]:
        return self.samples.get(metric) or self.numbers.get(metric) or []

    def host_cpu(self) -> dict:
        """This side's `host_cpu` section over all its boots, as level 4's results carry it."""
        return host_cpu.section(self.host_loop_us, set(self.host_cpus), self.host_reason)

    def to_json(self) -> dict:
        return {"role": self.role, "config": self.config, "samples": self.samples, "numbers": self.numbers,
                "boots": self.boots, "clocks": self.clocks, "unresolved": self.unresolved, "boot_ends": self.boot_ends,
                "host_loop_us": self.host_loop_us, "host_cpus": self.host_cpus, "host_reason": self.host_reason,
                "max_num_seqs": self.max_num_seqs}


def workloads_for(criteria: list[Criterion], platform_name: str) -> list[tuple[str, bench.Workload]]:
    """(metric, one-round workload) for every timing criterion, shaped like level 4's workloads of this
    platform (the latency shape of tests/level4_perf/workloads.yaml for TTFT / TPOT / ITL / e2e)."""
    all_w, _ = bench.load_workloads(platform_name, 10 ** 9)
    latency = next(w for w in all_w if w.kind == "latency")
    short = next(w for w in all_w if w.kind == "decode").pp
    out: dict[str, bench.Workload] = {}
    for c in criteria:
        if c.kind not in ("timing", "spec"):
            continue
        if c.kind == "spec":
            decode = next((w for m, w in out.items() if m.startswith("tg")), None)
            out.setdefault("spec", decode or bench.Workload("decode", short, 128))
            continue
        base, depth = parse_metric_name(c.metric)
        conc = metric_concurrency(c.metric)
        n = int("".join(ch for ch in base if ch.isdigit()) or 0)
        if base.startswith("tg"):
            w = bench.Workload("concurrent" if conc > 1 else "decode", latency.pp if conc > 1 else short, n, depth, conc)
        elif base.startswith("pp"):
            w = bench.Workload("concurrent" if conc > 1 else "prefill", n, 32 if conc > 1 else 2, depth, conc)
        else:  # ttft_ms, tpot_ms, itl_ms, e2e_ms
            w = replace(latency, depth=depth)
        out[c.metric] = replace(w, runs=1, warmup=0, max_runs=1)
    return list(out.items())


def profiled_metric(metric: str) -> bool:
    """Kernel-time metrics (ppN_gpu, tgN_gpu, tgN_gpu@dD) run under the profiler, in rounds of their own."""
    return metric.split("@")[0].endswith("_gpu")


class Measurer:
    """Rounds of every criterion's workload on running servers (`measure_round`), boot numbers (`record_boot`)."""

    def __init__(self, criteria: list[Criterion], platform_name: str, on_gpu: bool, sampler=None) -> None:
        self.criteria, self.on_gpu, self.sampler = criteria, on_gpu, sampler
        self.workloads = workloads_for(criteria, platform_name)
        self.makers: dict[str, bench.PromptMaker] = {}

    def _maker(self, running: RunningServer) -> bench.PromptMaker:
        if running.url not in self.makers:
            self.makers[running.url] = bench.PromptMaker(running.client(), seed=7)
        return self.makers[running.url]

    def warm(self, running: RunningServer) -> None:
        """Every workload once, discarded: compile caches and CUDA graphs are hot before the first round."""
        client, maker = running.client(), self._maker(running)
        for _, w in self.workloads:
            bench.run_workload(client, maker, replace(w, runs=1, warmup=1, max_runs=1), self.sampler)

    def record_boot(self, side: Side, running: RunningServer) -> None:
        mem = server_memory(running, self.on_gpu)
        side.number("used_memory", mem.get("used_gib"))
        side.number("kv_capacity", mem.get("kv_capacity_tokens"))
        side.number("boot_s", running.boot_seconds)
        if running.process:
            side.max_num_seqs = max_num_seqs(running.process.argv_extra)
        side.boots.append({"log": str(running.log_path), "boot_seconds": running.boot_seconds,
                           "memory": {k: mem.get(k) for k in ("used_gib", "used_source", "kv_capacity_tokens")}})

    def measure_round(self, side: Side, running: RunningServer, profiled: bool = False) -> None:
        """One round of the unprofiled workloads (`profiled=False`) or of the profiled ones (ppN_gpu, tgN_gpu). Kept apart:
        on an H100 (20b shape) stock tg32 rounds that followed a profiled prefill in the same round ranged 180-304
        tok/s, where rounds without the profiler in between vary by about 0.1%."""
        client, maker = running.client(), self._maker(running)
        probe = host_cpu.HostCpuProbe(running.process.pids if running.process else (lambda: []))
        for metric, w in self.workloads:
            kernel_time = profiled_metric(metric)
            if kernel_time != profiled:
                continue
            if metric == "spec":
                self._spec_round(side, running, w)
            elif kernel_time:
                if not self.on_gpu or running.trace_dir is None:
                    continue  # not measurable here: the criterion is judged an ERROR, never a pass
                entry = bench.gpu_rate(client, maker, w, kernel_time_probe(running), self.sampler)
                self._take(side, metric, entry)
            else:
                entries = bench.metrics_for(w, bench.run_workload(client, maker, w, self.sampler, host_probe=probe))
                if metric in entries:
                    self._take(side, metric, entries[metric])
        side.host_loop_us.extend(probe.samples)
        side.host_cpus = sorted(set(side.host_cpus) | probe.cpus)
        side.host_reason = probe.reason if not side.host_loop_us else None

    @staticmethod
    def _take(side: Side, metric: str, entry: dict) -> None:
        side.add(metric, [float(x) for x in entry["samples"]])
        # each round picks its clock from its own first /metrics scrape: one failed scrape puts a round on the client
        # clock, ~30% below the engine's, and pooled with engine rounds it would read as a change
        clock = str(entry.get("clock") or "")
        first = side.clocks.setdefault(metric, clock)
        if clock != first:
            side.unresolved[metric] = (f"its rounds were measured on two clocks ({first} and {clock}: a /metrics "
                                       "scrape failed in some), which level 5 never compares")
        if entry.get("unresolved"):
            side.unresolved[metric] = str(entry["unresolved"])

    def _spec_round(self, side: Side, running: RunningServer, w: bench.Workload) -> None:
        """vLLM's speculative-decoding counters over one decode round: acceptance length and rate."""
        client, maker = running.client(), self._maker(running)
        before = scrape(client)
        bench.run_workload(client, maker, w, self.sampler)
        counters = spec_decode_between(before, scrape(client))
        if counters:  # nothing drafted: the criteria on it are ERRORs (not measured), never passes
            side.add("spec_acceptance_length", [counters["mean_acceptance_length"]])
            side.add("spec_acceptance_rate", [counters["acceptance_rate"]])


def interleaved(measurer: Measurer, baseline: tuple[Side, RunningServer], candidate: tuple[Side, RunningServer],
                rounds: int) -> None:
    """Both servers up: ABBA rounds (A B, B A, A B, ...)."""
    pairs = [baseline, candidate]
    for side, running in pairs:
        measurer.record_boot(side, running)
        measurer.warm(running)
    for profiled in (False, True):  # the profiler's rounds after every unprofiled one
        for i in range(rounds):
            for side, running in (pairs if i % 2 == 0 else pairs[::-1]):
                running.ensure_alive()
                measurer.measure_round(side, running, profiled)


def bracketed(measurer: Measurer, boot: Callable[[str, str], RunningServer], baseline: Side, candidate: Side,
              rounds: int, profile: Callable[[Side, RunningServer], None] | None = None) -> None:
    """One server at a time: A, B, A; `boot(config, tag)` boots one (a `with` context: stopped after its turn).
    `profile(side, running)` runs once per side, after the rounds of its first boot (no extra boot for it)."""
    first = math.ceil(rounds / 2)
    breakdown_taken: set[str] = set()
    for side, tag, n in ((baseline, "__featureA1", first), (candidate, "__featureB", rounds),
                         (baseline, "__featureA2", rounds - first)):
        with boot(side.config, tag) as running:
            measurer.record_boot(side, running)
            measurer.warm(running)
            for profiled in (False, True):  # the profiler's rounds after every unprofiled one
                for _ in range(n):
                    running.ensure_alive()
                    measurer.measure_round(side, running, profiled)
            side.end_boot()
            if profile is not None and side.role not in breakdown_taken:
                breakdown_taken.add(side.role)
                profile(side, running)


def save_sides(path, sides: list[Side]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([s.to_json() for s in sides], indent=1))


# The percentile bootstrap of medians is far too narrow on 2-3 samples per side: simulated at a true ratio exactly on
# a +10% target (3% CV), n=2 called PASS 14% and FAIL 16% of the time where a 95% interval allows 2.5% each. At 4 per
# side its 95% CI of the ratio still missed a true ratio of 1 in 7.1% of 1,000 simulated A/As (2% log-normal noise;
# 7.6% with t(3) tails): the median of 4 is the mean of its middle two, whose resamples cluster. From 5 it misses
# 2.0-4.6% (5, 6, 8, 12 per side), within the nominal 5% (tests/unit/test_feature_verdicts.py simulates it).
MIN_ROUNDS = 5


def check_rounds(rounds: int) -> int:
    """--feature-rounds, checked when the run starts."""
    if rounds < MIN_ROUNDS:
        raise SuiteError(f"--feature-rounds {rounds}: a 95% CI of medians needs at least {MIN_ROUNDS} rounds per side "
                         f"(fewer call noise a change); pass --feature-rounds={MIN_ROUNDS} or more")
    return rounds
