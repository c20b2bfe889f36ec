"""The gate's measured sensitivity curve: one server, slowed by known fractions through the suite_testhooks
plugin (no reboot), each fraction measured interleaved with 0% and judged by the level 5 gate.

Per fraction f: the delay a + b x tokens is planned from the step times measured at 0% (a decode step of
1 token and a prefill of N tokens each get f of their own time, `harness.engine.hooks.plan_delay`); then rounds
alternate 0% / f% in ABBA order (drift between them cancels), each round = one decode request and one
prefill request, each right after its own warm-up request. The gate
(`harness.perf.regression.compare_metric`, the platform's thresholds) then compares the f% samples with the 0%
ones. Throughput at f is expected at 1 / (1 + f) of the 0% one; the measured ratio is reported beside it.

Prefill is measured the way level 5 gates it on the platform: on CPU on the engine clock (`ppN`); on a GPU
server the suite booted, by the GPU kernel time of one profiled prefill (`ppN_gpu`, `bench.gpu_prefill`),
because the engine-clock prefill of the gpt-oss-120b shape moved up to 58% between H200 boots with nothing
changed (host time) and is gated there only beyond its recorded boot spread. The plugin's spin is a GPU kernel, so
it is inside the summed kernel time, and the delay is planned from that kernel time.

Decode on a GPU is judged on both clocks level 5 gates: the engine's (`tgN`) and the kernels' (`tgN_gpu`,
`bench.gpu_decode`, level 5's witness for decode that follows the host). Where the server's decode is host-bound,
its kernels' rate above the engine's by more than thresholds.yaml's host_bound_ratio at 0% (the rule level 5
applies to a baseline, `regression.host_bound_decode`), level 5 gates its engine clock only beyond host_bound_spread;
the curve then plans the delay from the kernels' time per token and measures the engine clock without judging it:
with the GPU waiting for the host every step, a spin of f x the kernels' time can vanish into that wait. On CPU
decode is the engine clock alone.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from harness.core import stats
from harness.core.errors import SuiteError
from harness.engine import hooks
from harness.engine.client import Client
from harness.engine.server_metrics import EngineRound, scrape
from harness.perf import bench
from harness.perf.bench import PromptMaker, Workload, rounds_needed
from harness.perf.regression import Reason, Thresholds, Verdict, compare_metric


@dataclass(frozen=True)
class CurveSpec:
    decode: Workload  # kind "decode": tg metric
    prefill: Workload  # kind "prefill": pp metric
    rounds: int  # rounds per side (0% and f%) per fraction
    calibration_rounds: int = 5
    # profiled rounds per side (ppN_gpu, tgN_gpu): their round-to-round CV was ~0.1-0.3% on an H200, and each
    # profiled round costs ~3 s of trace writing, so fewer rounds than the engine clock's resolve them
    kernel_rounds: int = 8
    # Adaptive rounds, as level 4's RoundPolicy: after the planned rounds a judged metric whose CV is too high for the
    # 95% CI of its median ratio to be within +-(gate / 3) gets more ABBA rounds, up to these caps (None: exactly the
    # planned rounds). Decided from the CV, never from the verdict, so stopping early cannot favour a pass. Why: on
    # the 120b shape's gemv-bf16 (H200, 2026-12-02) 5 of 16 slowed 2% rounds dipped with the host and left tg128
    # inconclusive (CI [0.950, 0.986]) at CV 2.1%, which asks for ~53 rounds per side.
    max_rounds: int | None = None
    max_kernel_rounds: int | None = None


def spec_for(platform_name: str) -> CurveSpec:
    """GPU: the 120b shape's headline shapes (tg128, pp2048); CPU: shapes the 2-core box runs in seconds."""
    if platform_name == "cpu":
        return CurveSpec(Workload("decode", 16, 64, runs=1, warmup=1), Workload("prefill", 512, 2, runs=1, warmup=1), 12)
    # GPU: up to 3x the planned engine-clock rounds (~40 s more per point on the 120b shape; resampled from that
    # curve's 2% rounds, 32 per side resolved 24 of 40 draws and 48 resolved 32) and 2x the profiled ones (~50 s).
    # CPU keeps its fixed rounds: its CVs of a few % would ask for the cap on every point and double the CI's level 5
    # time, and its smaller slowdown may be inconclusive there (thresholds.advisory)
    return CurveSpec(Workload("decode", 16, 128, runs=1, warmup=2), Workload("prefill", 2048, 2, runs=1, warmup=2), 16,
                     max_rounds=48, max_kernel_rounds=16)


def _name(w: Workload, gpu: bool = False) -> str:
    return bench.kernel_metric_name(w) if gpu else f"tg{w.tg}" if w.kind == "decode" else f"pp{w.pp}"


def measure_once(client: Client, maker: PromptMaker, w: Workload, sampler=None) -> tuple[float, dict]:
    """One round on the engine clock: warm-up request, scrape, the measured request, scrape."""
    sampler = sampler or bench._NoClocks()
    prompt = maker.make(w.pp)
    client.complete(maker.make(w.pp), 2, ignore_eos=True)  # warm-up right before: no idle gap
    before = scrape(client)
    with sampler.round() as rc:
        bench._measure(client, w, prompt)
    after = scrape(client)
    if before is None or after is None:
        raise SuiteError("the sensitivity curve needs vLLM's engine-clock metrics (/metrics request_*_time)")
    r = EngineRound.between(before, after)
    if r.requests != 1:
        raise SuiteError(f"{r.requests} requests finished during one curve round; another client is using the server")
    value = (r.generated_tokens - 1) / r.decode_s if w.kind == "decode" else r.computed_prompt_tokens / r.prefill_s
    return value, rc.record()


def measure_interleaved(base: Client, other: Client, w: Workload, rounds: int, sampler=None) -> tuple[list[float], list[float]]:
    """`rounds` samples of `w` on each of two servers, alternating in ABBA order, so that drift of the
    machine (other jobs, thermal state) hits both sides alike instead of reading as a difference."""
    sides = [(base, PromptMaker(base, seed=7), []), (other, PromptMaker(other, seed=7), [])]
    for client, maker, _ in sides:
        for _ in range(w.warmup):
            client.complete(maker.make(w.pp), w.tg, ignore_eos=True)
    for i in range(rounds):
        for client, maker, samples in (sides if i % 2 == 0 else sides[::-1]):
            samples.append(measure_once(client, maker, w, sampler)[0])
    return sides[0][2], sides[1][2]


@dataclass
class Point:
    fraction: float
    delay: hooks.Delay
    base: dict[str, list[float]] = field(default_factory=dict)
    slow: dict[str, list[float]] = field(default_factory=dict)
    clocks: dict[str, list[dict]] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    acks: list[dict] = field(default_factory=list)
    extra_rounds: dict[str, int] = field(default_factory=dict)  # rounds per side added for a CV too high (max_rounds)

    def ratio(self, name: str) -> float:
        return stats.median(self.slow[name]) / stats.median(self.base[name])

    def summary(self) -> dict[str, Any]:
        # `status` holds the judged metrics only; a measured one without a status is an observation (the engine
        # clock of a host-bound decode)
        return {"fraction": self.fraction, "delay": {"a_us": round(self.delay.a_us, 2),
                                                     "b_us_per_token": round(self.delay.b_us_per_token, 5)},
                "expected_ratio": round(1 / (1 + self.fraction), 4),
                "measured_ratio": {n: round(self.ratio(n), 4) for n in self.base},
                "status": {n: v.status for n, v in self.verdicts.items()},
                "reasons": {n: v.reason.value for n, v in self.verdicts.items() if v.reason is not None},
                "messages": {n: v.message for n, v in self.verdicts.items()},
                "rounds_per_side": {n: len(v) for n, v in self.base.items()}, "extra_rounds": self.extra_rounds,
                "samples": {"base": self.base, "slow": self.slow}, "clocks": self.clocks}


class Curve:
    def __init__(self, client: Client, hook_dir: Path, spec: CurveSpec, sampler=None, alive=None,
                 profile_one: Callable[[Callable[[], None]], float] | None = None) -> None:
        self.client, self.hook_dir, self.spec, self.sampler, self.alive = client, Path(hook_dir), spec, sampler, alive
        self.profile_one = profile_one  # given: prefill is ppN_gpu and decode is also tgN_gpu (GPU kernel time)
        gpu = profile_one is not None
        self.engine_decode_name, self.prefill_name = _name(spec.decode), _name(spec.prefill, gpu)
        self.kernel_decode_name = _name(spec.decode, True) if gpu else None
        self.host_bound: str | None = None  # why the engine-clock decode is measured, not judged (calibrate)
        self.calibration: dict[str, Any] = {}
        self.kernel_rounds = min(spec.rounds, spec.kernel_rounds) if gpu else spec.rounds
        self.prefill_rounds = self.kernel_rounds
        self.maker = PromptMaker(client, seed=7)
        self.acks: list[dict] = []

    @property
    def judged(self) -> list[str]:
        """The metrics whose verdicts decide the curve, as level 5 gates them on this server."""
        names = [] if self.host_bound else [self.engine_decode_name]
        return names + ([self.kernel_decode_name] if self.kernel_decode_name else []) + [self.prefill_name]

    def _kernel_once(self, w: Workload) -> tuple[float, dict]:
        entry = bench.gpu_rate(self.client, self.maker, replace(w, runs=1), self.profile_one, self.sampler)
        rounds = entry.get("rounds") or entry.get("flagged") or [{}]
        return entry["samples"][0], {**rounds[0], **({"unresolved": entry["unresolved"]} if "unresolved" in entry else {})}

    def measure_prefill(self) -> tuple[float, dict]:
        if self.profile_one is None:
            return measure_once(self.client, self.maker, self.spec.prefill, self.sampler)
        return self._kernel_once(self.spec.prefill)

    def measure_decode(self, kernel: bool) -> tuple[float, dict]:
        return self._kernel_once(self.spec.decode) if kernel else measure_once(self.client, self.maker,
                                                                                 self.spec.decode, self.sampler)

    def set(self, delay: hooks.Delay) -> dict:
        ack = hooks.set_slowdown(self.hook_dir, delay, alive=self.alive)
        self.acks.append(ack["slowdown"])
        return ack

    def calibrate(self, host_bound_ratio: float | None = None) -> tuple[float, float]:
        """(decode step seconds, prefill seconds for the spec's N tokens) at 0%, medians. On a GPU decode's kernel
        rate is measured too; with `host_bound_ratio`, a kernel rate above the engine's by more than that (level 5's
        rule) makes the decode host-bound: its step is then the kernels' time per token, and its engine clock is
        measured, not judged."""
        self.set(hooks.Delay(0.0, 0.0))
        for w in (self.spec.decode, self.spec.prefill):
            for _ in range(w.warmup):
                self.client.complete(self.maker.make(w.pp), w.tg, ignore_eos=True)
        tg = [self.measure_decode(False)[0] for _ in range(self.spec.calibration_rounds)]
        pp = [self.measure_prefill()[0] for _ in range(self.spec.calibration_rounds)]
        self.decode_step_s = 1.0 / stats.median(tg)
        self.prefill_s = self.spec.prefill.pp / stats.median(pp)
        self.calibration = {self.engine_decode_name: [round(v, 2) for v in tg], self.prefill_name: [round(v, 2) for v in pp]}
        if self.kernel_decode_name:
            kernel = [self.measure_decode(True)[0] for _ in range(self.spec.calibration_rounds)]
            self.calibration[self.kernel_decode_name] = [round(v, 2) for v in kernel]
            ratio = stats.median(kernel) * self.decode_step_s
            self.calibration["kernel_over_engine"] = round(ratio, 4)
            if host_bound_ratio is not None and ratio > host_bound_ratio:
                self.host_bound = (f"at 0% {self.kernel_decode_name} ran {ratio:.2f}x {self.engine_decode_name}, above "
                                   f"host_bound_ratio {host_bound_ratio:g}: level 5 gates this decode by kernel time")
                self.decode_step_s = 1.0 / stats.median(kernel)
        return self.decode_step_s, self.prefill_s

    def rounds_wanted(self, p: Point, thresholds: Thresholds) -> dict[str, int]:
        """Rounds per side each judged metric should have, from its worse side's CV (CurveSpec.max_rounds)."""
        want = {}
        for n in self.judged:
            kernel_time = n in (self.kernel_decode_name, self.prefill_name) and self.profile_one is not None
            cap = self.spec.max_kernel_rounds if kernel_time else self.spec.max_rounds
            have = len(p.base[n])
            if cap is None or cap <= have or have < 2:
                continue
            want[n] = rounds_needed(stats.worst_cv((p.base[n], p.slow[n])), thresholds.throughput_drop / 3, have, cap)
        return want

    def point(self, fraction: float, thresholds: Thresholds) -> Point:
        delay = hooks.plan_delay(fraction, self.decode_step_s, self.spec.prefill.pp, self.prefill_s)
        p = Point(fraction, delay)
        zero = hooks.Delay(0.0, 0.0)
        engine, kernel, prefill = self.engine_decode_name, self.kernel_decode_name, self.prefill_name
        for n in (engine, kernel, prefill):
            if n:
                p.base[n], p.slow[n], p.clocks[n] = [], [], []

        def measure_round(i: int, wanted: set[str]) -> None:
            for slow in ((False, True) if i % 2 == 0 else (True, False)):  # ABBA: drift cancels
                p.acks.append(self.set(delay if slow else zero)["slowdown"])
                measured = [(n, self.measure_decode(n == kernel) if n != prefill else self.measure_prefill())
                            for n in (engine, kernel, prefill) if n in wanted]
                for n, (value, rc) in measured:
                    (p.slow if slow else p.base)[n].append(value)
                    p.clocks[n].append({**rc, "slowed": slow})

        for i in range(self.spec.rounds):
            measure_round(i, {engine} | ({kernel} if kernel and i < self.kernel_rounds else set())
                          | ({prefill} if i < self.prefill_rounds else set()))
        want = self.rounds_wanted(p, thresholds)
        p.extra_rounds = {n: w - len(p.base[n]) for n, w in want.items() if w > len(p.base[n])}
        i = self.spec.rounds
        while short := {n for n, w in want.items() if len(p.base[n]) < w}:
            measure_round(i, short)
            i += 1
        self.set(zero)
        for n in self.judged:  # a host-bound decode's engine clock is measured, not judged
            # a profiled round that ran below the loaded clock makes its metric unresolved, as in level 5
            low = sorted({c["unresolved"] for c in p.clocks[n] if c.get("unresolved")})
            v = compare_metric(n, p.base[n], p.slow[n], True, thresholds, unit="tok/s",
                               unresolved="; ".join(low) or None)
            # the baseline here is this server at 0%: "re-record a baseline" advice does not apply
            p.verdicts[n] = replace(v, fix=None)
        return p


def run_curve(client: Client, hook_dir: Path, spec: CurveSpec, fractions: list[float], thresholds: Thresholds,
              sampler=None, alive=None, profile_one: Callable[[Callable[[], None]], float] | None = None) -> dict[str, Any]:
    """`profile_one` (a GPU server the suite booted, `benchmark_run.kernel_time_probe`): prefill is ppN_gpu, decode
    tgN_gpu and, unless the decode is host-bound, tgN (module docstring). `problems` and `notes` are
    `curve_problems`'."""
    started = time.time()
    curve = Curve(client, hook_dir, spec, sampler, alive, profile_one)
    t_d, t_p = curve.calibrate(None if thresholds.advisory else thresholds.host_bound_ratio)
    points = [curve.point(f, thresholds) for f in fractions]
    problems, notes = curve_problems(points, thresholds, curve.judged, curve.host_bound)
    return {"problems": problems, "notes": notes,
            "decode_step_ms": round(t_d * 1000, 4), "prefill_ms": round(t_p * 1000, 4),
            "decode_metrics": [n for n in curve.judged if n != curve.prefill_name],
            "decode_step_from": curve.kernel_decode_name if curve.host_bound else curve.engine_decode_name,
            "decode_host_bound": curve.host_bound, "calibration": curve.calibration,
            "decode_kernel_rounds_per_side": curve.kernel_rounds if curve.kernel_decode_name else None,
            "prefill_tokens": spec.prefill.pp, "rounds_per_side": spec.rounds,
            "max_rounds_per_side": {"engine": spec.max_rounds, "kernel": spec.max_kernel_rounds},
            "prefill_metric": curve.prefill_name, "prefill_rounds_per_side": curve.prefill_rounds,
            "thresholds": {"throughput_drop": thresholds.throughput_drop, "max_cv": thresholds.max_cv,
                           "alpha": thresholds.alpha},
            "points": points, "seconds": round(time.time() - started, 1)}


def curve_problems(points: list[Point], thresholds: Thresholds, judged: list[str],
                   host_bound: str | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes) of a two-point curve: every `judged` metric must FAIL the larger slowdown and PASS the
    smaller (on an advisory platform the smaller may be inconclusive); a judged metric without a verdict is a problem.

    One allowance, on a GPU: an engine-clock decode too noisy to resolve the gate (inconclusive because a side's CV
    exceeds max_cv; at the larger slowdown its median must still be slower) while its kernel-time twin (`tgN_gpu`)
    judged that point as required. Level 5 gates both clocks, so the regression is still caught by the twin; the
    engine clock's noise is the host's (the plugin's 20b decode on an H200 ran 318-500 tok/s at 0% in one boot,
    CV 16%, with its kernels steady), and it is reported as a note. The A/A boots show whether that noise also makes
    the nightly red.

    `host_bound` (the calibration's reason for leaving the engine clock unjudged) is checked against the curve's own
    0% rounds: 5 calibration rounds can fall in a fast or slow spell of the host, and an engine clock level 5 would
    gate must not go unjudged on their word."""
    small, large = points
    problems, notes = [], []
    for p, want in ((large, "fail"), (small, "pass")):
        for name in judged:
            v = p.verdicts.get(name)
            if v is None:
                problems.append(f"{p.fraction:.0%} slower: {name} has no verdict (not measured)")
                continue
            if v.status == want or (want == "pass" and thresholds.advisory and v.status == "inconclusive"):
                continue
            twin = p.verdicts.get(f"{name}_gpu") if re.fullmatch(r"tg\d+", name) else None
            if (v.reason is Reason.NOISY and twin is not None and twin.status == want
                    and (want == "pass" or p.ratio(name) < 1)):
                notes.append(f"{p.fraction:.0%} slower: {name} could not resolve the gate for noise ({v.message}); its "
                             f"kernel-time twin {twin.name} did ({twin.status})")
                continue
            problems.append(f"{p.fraction:.0%} slower was {v.status} on {name} (must {want}"
                            f"{' or, on this noisy platform, be inconclusive' if want == 'pass' and thresholds.advisory else ''}"
                            f"): {v.message}")
    if host_bound:
        engine = next((n for n in small.base if re.fullmatch(r"tg\d+", n)), None)
        kernel = f"{engine}_gpu"
        if engine is None or kernel not in small.base:
            problems.append(f"the decode was found host-bound ({host_bound}) but the curve measured no tgN / tgN_gpu pair")
        else:
            ratio = (stats.median(small.base[kernel] + large.base[kernel])
                     / stats.median(small.base[engine] + large.base[engine]))
            if not ratio > thresholds.host_bound_ratio:
                problems.append(f"calibration found the decode host-bound ({host_bound}), but over the curve's 0% rounds "
                                f"{kernel} ran {ratio:.2f}x {engine}, within host_bound_ratio "
                                f"{thresholds.host_bound_ratio:g}: {engine}, which level 5 would gate here, went "
                                f"unjudged; run the curve again")
            else:
                notes.append(f"host-bound confirmed over the curve's 0% rounds: {kernel} ran {ratio:.2f}x {engine}")
    return problems, notes
