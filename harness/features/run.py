"""One feature, end to end: gates of the features it requires, its levels on the candidate, its criteria measured
on baseline and candidate in one run, a verdict per criterion and per feature, and what it needs for its review."""
from __future__ import annotations

import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from harness.core import stats
from harness.core.errors import SuiteError
from harness.engine.server import ServerDied
from harness.features.judge import (CriterionVerdict, Status, blocked, did_not_boot, judge_number, judge_samples,
                                    overall)
from harness.features.levels import LevelOutcome, run_levels
from harness.features.measure import Measurer, Side, bracketed, interleaved, save_sides
from harness.features.spec import Criterion, Feature
from harness.kernelpath.breakdown import Breakdown, breakdown, busy_us_per_token, plot_breakdowns
from harness.kernelpath.check import profile_decode_window
from harness.kernelpath.traces import profile
from harness.perf import host_cpu
from harness.perf.clocks import ClockSampler
from harness.perf.metrics import metric_concurrency
from harness.perf.regression import HOST_BOUND_DECODE, THRESHOLDS_FILE, Thresholds, load_thresholds
from harness.session.suite import RunningServer, Suite


@dataclass
class FeatureResult:
    feature: Feature
    status: Status
    criteria: list[CriterionVerdict]
    levels: dict[str, LevelOutcome]
    gate: list[CriterionVerdict]  # this feature's gate for the next phase (criteria, then its levels)
    gate_status: Status
    sides: list[Side]
    platform: str
    device: str
    flavour: str
    model: str
    order: str  # "ABBA (both up)" / "A, B, A"
    rounds: int
    strict: bool
    artifacts: str
    blocked_by: str | None = None
    breakdown: dict[str, dict] = field(default_factory=dict)  # config -> decode-time breakdown (kernelpath)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether the pytest test fails: FAIL, ERROR, BLOCKED; INCONCLUSIVE too in strict mode (nightly)."""
        bad = {Status.FAIL, Status.ERROR, Status.BLOCKED} | ({Status.INCONCLUSIVE} if self.strict else set())
        return self.status in bad

    @classmethod
    def from_json(cls, data: dict, feature: Feature) -> "FeatureResult":
        """A result read back from its verdict.json (to re-render a review without re-measuring)."""
        def verdict(v: dict) -> CriterionVerdict:
            return CriterionVerdict(**{**v, "status": Status(v["status"]), "ci": tuple(v["ci"]) if v.get("ci") else None,
                                       "n": tuple(v["n"]) if v.get("n") else None})

        levels = {k: LevelOutcome(**{x: y for x, y in v.items() if x != "status"}) for k, v in data["levels"].items()}
        sides = []
        for s in data.get("sides", []):
            side = Side(s["role"], s["config"], s["samples"], s["numbers"], s["boots"], s["clocks"], s["unresolved"],
                        s.get("boot_ends") or [], s.get("host_loop_us") or [], s.get("host_cpus") or [],
                        s.get("host_reason"), s.get("max_num_seqs"))
            sides.append(side)
        for side in sides:  # results written before the unprofiled busy fraction was kept
            _busy_unprofiled((data.get("breakdown") or {}).get(side.config), side)
        return cls(feature, Status(data["status"]), [verdict(v) for v in data["criteria"]], levels,
                   [verdict(v) for v in data["gate"]], Status(data["gate_status"]), sides, data["platform"],
                   data["device"], data.get("flavour", feature.flavour), data["model"], data["order"], data["rounds"],
                   data["strict"], data["artifacts"], data.get("blocked_by"), data.get("breakdown") or {},
                   data.get("seconds", 0.0), list(data.get("notes") or []))

    def to_json(self) -> dict:
        f = self.feature
        return {"feature": f.name, "phase": f.phase, "flavour": f.flavour, "hypothesis": f.hypothesis,
                "candidate": f.candidate, "baseline": f.baseline, "status": self.status.value,
                "blocked_by": self.blocked_by, "criteria": [c.to_json() for c in self.criteria],
                "levels": {k: v.to_json() for k, v in self.levels.items()},
                "gate": [c.to_json() for c in self.gate], "gate_status": self.gate_status.value,
                "platform": self.platform, "device": self.device, "model": self.model, "order": self.order,
                "rounds": self.rounds, "strict": self.strict, "artifacts": self.artifacts,
                "sides": [s.to_json() for s in self.sides], "breakdown": self.breakdown,
                "seconds": round(self.seconds, 1), "notes": self.notes}


def judge_all(criteria: tuple[Criterion, ...], baseline: Side, candidate: Side,
              spread_of: Callable[[str], float] = lambda metric: 0.0, host_bound: str | None = None,
              host_bound_spread: float = 0.0) -> list[CriterionVerdict]:
    """`spread_of(metric)`: the platform's recorded boot-to-boot spread (`Thresholds.spread_of`). `host_bound`: why a
    side's batch-1 decode waited for vLLM's host side (`host_bound_sides`); its depth-0 decode criteria on the engine
    or client clock are then widened by `host_bound_spread`, as level 5 widens them: a side measured on one boot
    (the candidate of A, B, A) lands wherever the host's speed was during that boot (the plugin's tg32 moved 15%
    between boots on an H100, stock's 0.35%), and its kernel time (tgN_gpu) is what can judge it strictly."""
    out = []
    for c in criteria:
        if c.kind in ("memory", "boot"):
            b, k = baseline.numbers.get(c.metric), candidate.numbers.get(c.metric)
            worst = min if c.higher_is_better else max  # the candidate's worst boot: the least KV, the most memory
            out.append(judge_number(c, sum(b) / len(b) if b else None, worst(k) if k else None,
                                    max(b) - min(b) if b else 0.0))
        else:
            spread, spread_why = (spread_of(c.metric) if c.kind == "timing" else 0.0), None
            if host_bound and c.kind == "timing" and HOST_BOUND_DECODE.fullmatch(c.metric) and "@d" not in c.metric \
                    and host_bound_spread > spread:
                spread = host_bound_spread
                spread_why = (f"the host-bound decode's spread of {spread * 100:.0f}% ({host_bound}; "
                              "baselines/thresholds.yaml host_bound_spread)")
            v = judge_samples(c, baseline.value(c.metric) if c.relative else None, candidate.value(c.metric),
                              drift=baseline.drift(c.metric) if c.relative else None,
                              boot_spread=spread, spread_why=spread_why)
            unresolved = "; ".join(f"{s.role}: {s.unresolved[c.metric]}" for s in (baseline, candidate)
                                   if c.metric in s.unresolved)
            clocks = baseline.clocks.get(c.metric), candidate.clocks.get(c.metric)
            if c.relative and all(clocks) and clocks[0] != clocks[1]:
                unresolved = "; ".join(filter(None, [unresolved, f"baseline on the {clocks[0]} clock, candidate on "
                                                     f"the {clocks[1]} clock, which level 5 never compares"]))
            if unresolved and v.status is not Status.ERROR:  # rounds below the GPU's loaded clock: never judged
                v = CriterionVerdict(v.criterion, v.metric, Status.INCONCLUSIVE, f"{unresolved}; not judged ({v.why})",
                                     v.baseline, v.candidate, v.ratio, v.ci, v.target, v.n)
            queued = queued_note(c.metric, (baseline, candidate))
            if queued:
                v = replace(v, why=f"{v.why}; {queued}")
            out.append(_unsteady_host(v, baseline, candidate))
    return out


def queued_note(metric: str, sides: tuple[Side, ...]) -> str | None:
    """Why a criterion at C concurrent requests did not time a batch of C (None: it did, or no side's limit is
    known): a side's server admitted fewer sequences (--max-num-seqs), so the requests ran that many at a time behind
    a queue. The users' flags admit 2: their tg32@c4 compares two servers each decoding 2 of 4 clients at a time."""
    conc = metric_concurrency(metric)
    capped = [s for s in sides if s.max_num_seqs is not None and s.max_num_seqs < conc]
    if not capped:
        return None
    limits = ", ".join(f"{s.role} {s.max_num_seqs}" for s in capped)
    return (f"its {conc} requests ran at most {min(s.max_num_seqs for s in capped)} at a time (--max-num-seqs: "
            f"{limits}), so no batch of {conc} was timed")


def host_bound_sides(breakdowns: dict[str, dict], sides: tuple[Side, ...], host_bound_ratio: float) -> str | None:
    """Why some side's batch-1 decode is host-bound (None: no side is, or no breakdown can say): the GPU was busy for
    less than 1 / host_bound_ratio of its unprofiled decode step (`_busy_unprofiled`), level 5's witness of a decode
    that follows vLLM's host side (its kernels' rate more than host_bound_ratio above the step's)."""
    whys = []
    for side in sides:
        busy = (breakdowns.get(side.config) or {}).get("busy_fraction_unprofiled")
        if busy is not None and busy * host_bound_ratio < 1.0:
            whys.append(f"{side.role} {side.config}: GPU busy {busy * 100:.0f}% of its decode step")
    return "; ".join(whys) or None


def _unsteady_host(v: CriterionVerdict, baseline: Side, candidate: Side) -> CriterionVerdict:
    """`v` with level 5's sentence on a host whose CPU changed speed, where an engine- or client-clock criterion could
    not be decided: kernel time does not wait for the host."""
    clock = baseline.clocks.get(v.metric) or candidate.clocks.get(v.metric)
    if v.status is not Status.INCONCLUSIVE or clock not in ("engine", "client"):
        return v
    why = host_cpu.unsteady({"host_cpu": baseline.host_cpu()}, {"host_cpu": candidate.host_cpu()},
                            (f"the baseline ({baseline.config})", f"the candidate ({candidate.config})"))
    return replace(v, why=f"{v.why}. Host CPU: {why}") if why else v


def gate_verdicts(f: Feature, judged: list[CriterionVerdict], levels: dict[str, LevelOutcome],
                  feature_status: Status) -> tuple[list[CriterionVerdict], Status]:
    """This feature's gate for the next phase: `judged` (its gate criteria, judged), then its gate levels. A feature
    without a gate gates by its own verdict (`feature_status`): one whose every criterion failed opened the next phase
    when an empty gate passed."""
    gate = list(judged)
    for lv in f.gate_levels:
        o = levels.get(lv)
        status = Status.PASS if o and o.status == "PASS" else Status.FAIL if o and o.status == "FAIL" else Status.ERROR
        why = f"{lv} on {f.candidate}: {o.status if o else 'not run (add it to the feature levels)'}"
        gate.append(CriterionVerdict(f"levels {lv}", lv, status, why))
    return gate, overall([g.status for g in gate]) if gate else feature_status


def run_feature(suite: Suite, f: Feature, rounds: int, strict: bool, gates: dict[str, Status],
                boot: Callable[..., RunningServer], level_args: list[str],
                level_timeout_s: float, profile: Callable[[RunningServer], dict | None] | None = None,
                hooks: dict[str, dict] | None = None, run_levels_fn=run_levels) -> FeatureResult:
    """`gates`: the gate status of every feature judged before this one (a required feature's gate must be PASS);
    `boot(config, tag, env, beside=False)`: a booted server of `config`, used as a `with` context; `profile(running)`: the decode-time
    breakdown of a running server (None where it cannot be taken); `hooks`: extra server env per role (tests of
    the test: the candidate slowed or holding memory)."""
    started = time.monotonic()
    out_dir = suite.run_dir / "features" / f.name
    out_dir.mkdir(parents=True, exist_ok=True)
    base_side, cand_side = Side("baseline", f.baseline), Side("candidate", f.candidate)
    common = dict(platform=suite.platform.name, device=suite.platform.device, flavour=suite.flavour.name,
                  model=suite.model.alias, rounds=rounds, strict=strict, artifacts=str(out_dir))
    missing = [r for r in f.requires if gates.get(r) is not Status.PASS]
    if missing:
        why = ", ".join(f"{r} (gate {gates[r].value})" if r in gates else f"{r} (not judged yet)" for r in missing)
        verdicts = [blocked(c, why) for c in f.criteria]
        return FeatureResult(f, Status.BLOCKED, verdicts, {}, [], Status.BLOCKED, [base_side, cand_side],
                             order="-", blocked_by=why, seconds=time.monotonic() - started, **common)
    levels = run_levels_fn(f.levels, f.candidate, f.baseline, suite.flavour.name, suite.model.alias,
                           out_dir / "levels", level_args, level_timeout_s)
    thresholds = load_thresholds(THRESHOLDS_FILE, suite.platform.name)  # the clock floor now, the spreads when judged
    measurer = Measurer(list(f.criteria) + list(f.gate), suite.platform.name, suite.platform.is_cuda,
                        _sampler(suite, thresholds))
    hooks = hooks or {}
    breakdown: dict[str, dict] = {}
    together = suite.can_boot_secondary()[0]
    booting: list[str] = []  # the config whose boot is under way, to name the side that died
    plain_boot = boot

    def boot(config: str, tag: str, env: dict | None = None, beside: bool = False) -> RunningServer:
        booting[:] = [config]
        return plain_boot(config, tag, env, beside)

    order = "ABBA, both servers up" if together else "A, B, A (one server at a time)"
    try:
        if together:
            with ExitStack() as stack:
                a = stack.enter_context(boot(f.baseline, "__featureA", hooks.get("baseline")))
                b = stack.enter_context(boot(f.candidate, "__featureB", hooks.get("candidate"), beside=True))
                interleaved(measurer, (base_side, a), (cand_side, b), rounds)
                if profile is not None:
                    breakdown = {side.config: profile(r) for side, r in ((base_side, a), (cand_side, b))}
        else:
            def one(config: str, tag: str):
                return boot(config, tag, hooks.get("baseline" if config == f.baseline else "candidate"))

            def take(side: Side, running: RunningServer) -> None:
                breakdown[side.config] = profile(running)

            bracketed(measurer, one, base_side, cand_side, rounds, take if profile is not None else None)
    except ServerDied as e:
        # e.g. the kernels plugin on the gpt-oss-120b shape: CUDA out of memory at load where stock serves
        who = "candidate" if booting and booting[0] == f.candidate else "baseline"
        cause = str(e).splitlines()[0]
        config = booting[0] if booting else "?"

        def measured(c: Criterion) -> float | None:
            values = base_side.value(c.metric)
            return stats.median(values) if values else None

        verdicts = [did_not_boot(c, who, config, cause, measured(c)) for c in f.criteria]
        status = overall([v.status for v in verdicts])
        gate, _ = gate_verdicts(f, [did_not_boot(c, who, config, cause, measured(c)) for c in f.gate], levels, status)
        # whatever its gate levels say, a feature that was not measured cannot open the next phase
        result = FeatureResult(f, status, verdicts, levels, gate, status if f.gate else Status.FAIL,
                               [base_side, cand_side], order=order, notes=[f"the {who} did not boot: {cause}"],
                               seconds=time.monotonic() - started, **common)
        (out_dir / "verdict.json").write_text(json.dumps(result.to_json(), indent=1, default=str))
        return result
    finally:
        if measurer.sampler is not None:
            measurer.sampler.close()
    for side in (base_side, cand_side):
        _busy_unprofiled(breakdown.get(side.config), side)
    if len([b for b in breakdown.values() if b]) == 2:
        plot_breakdowns({c: Breakdown.from_json(b) for c, b in breakdown.items()}, out_dir / "breakdown.png")
    save_sides(out_dir / "samples.json", [base_side, cand_side])
    host_bound = host_bound_sides(breakdown, (base_side, cand_side), thresholds.host_bound_ratio)
    spread_of = thresholds.spread_of

    def judged(criteria: tuple[Criterion, ...]) -> list[CriterionVerdict]:
        return judge_all(criteria, base_side, cand_side, spread_of, host_bound, thresholds.host_bound_spread)

    verdicts = judged(f.criteria)
    # a required level that ran nothing (every test skipped, e.g. level 2 on dummy weights) cannot say: inconclusive
    level_status = [Status.PASS if o.status == "PASS" else Status.FAIL if o.status == "FAIL" else Status.INCONCLUSIVE
                    for o in levels.values()]
    status = overall([v.status for v in verdicts] + level_status)
    gate, gate_status = gate_verdicts(f, judged(f.gate) if f.gate else [], levels, status)
    result = FeatureResult(f, status, verdicts, levels, gate,
                           gate_status, [base_side, cand_side], order=order, breakdown=breakdown,
                           seconds=time.monotonic() - started, **common)
    (out_dir / "verdict.json").write_text(json.dumps(result.to_json(), indent=1, default=str))
    return result


BREAKDOWN_TOKENS = 64  # decode steps profiled at batch 1 for "where decode time goes"


def decode_breakdown(suite: Suite, running: RunningServer, notes: list[str]) -> dict | None:
    """Where one batch-1 decode window's time goes on `running` (kernelpath.breakdown); None, with a note, where
    it cannot be profiled (a server the suite did not boot, a profiler that failed)."""
    if running.trace_dir is None:
        notes.append(f"{running.target.name}: no decode-time breakdown (the suite did not boot this server)")
        return None
    if not suite.platform.is_cuda:
        notes.append(f"{running.target.name}: no decode-time breakdown on {suite.platform.name} (it reads GPU kernel "
                     "intervals; a CPU trace has nested CPU ops only)")
        return None
    try:
        window = profile_decode_window(running, "kernel" if suite.platform.is_cuda else "cpu_op", BREAKDOWN_TOKENS)
        return breakdown(window.summary.source, suite.catalog.kernel_categories(), window.inside).to_json()
    except SuiteError as e:
        notes.append(f"{running.target.name}: no decode-time breakdown ({e})")
        return None


def prefill_breakdown(suite: Suite, running: RunningServer, prompt: list[int], notes: list[str]) -> dict | None:
    """Where one prefill's kernel time goes on `running`: the kernels of one profiled request of `prompt` and one
    generated token, by category, in microseconds per prefill (the breakdown's "per token" is per request here).
    `ppN_gpu` says how much slower a config's prefill is; this says which kernels hold the difference. None, with a
    note, where it cannot be profiled."""
    if running.trace_dir is None or not suite.platform.is_cuda:
        notes.append(f"{running.target.name}: no prefill breakdown (needs a GPU server the suite booted)")
        return None
    client = running.client(timeout_s=600)
    try:
        summary = profile(running.url, running.trace_dir, lambda: client.complete(prompt, 1, ignore_eos=True),
                          "kernel")
        try:
            return breakdown(summary.source, suite.catalog.kernel_categories(), 1).to_json()
        finally:  # a 2048-token prefill's trace is tens of MB; the numbers above are what is kept
            Path(summary.source).unlink(missing_ok=True)
    except SuiteError as e:
        notes.append(f"{running.target.name}: no prefill breakdown ({e})")
        return None


def _busy_unprofiled(b: dict | None, side: Side) -> None:
    """The busy fraction that holds without the profiler: the GPU's busy time per token (which the profiler barely
    moves) over the decode step time of the unprofiled rounds (1 / tg at batch 1, engine clock). The profiled window's
    own wall time also holds the profiler's host cost between steps (on an H100, the 20b shape: 77% busy in the
    window, 59% over a whole profiled request, against ~97% from the unprofiled step; scripts/decode_window_gaps.py).
    Busy time counts overlapping kernels once (`busy_us_per_token`): on the plugin's first 120b boot on an H200 the
    sum of kernel durations read 91% of a 3,531 us step, the GPU's busy time 74%."""
    tg = [m for m in side.samples if m.startswith("tg") and "@" not in m]
    if not b or not tg:
        return
    step_us = 1e6 / stats.median(side.samples[tg[0]])
    b["step_us_unprofiled"] = round(step_us, 1)
    b["step_metric"] = tg[0]
    b["busy_fraction_unprofiled"] = round(min(1.0, busy_us_per_token(b) / step_us), 4)


def _sampler(suite: Suite, thresholds: Thresholds) -> ClockSampler | None:
    """Level 4's clock check with level 5's floor: a feature's rounds are set aside below the same clock as the
    gate's, so a threshold change in baselines/thresholds.yaml moves both."""
    return ClockSampler(floor=thresholds.loaded_clock_floor) if suite.platform.is_cuda else None


def require_runnable(suite: Suite, f: Feature) -> str | None:
    """Why this feature cannot run here (None: it can): another flavour, or a config this platform cannot run."""
    if f.flavour != suite.flavour.name:
        return (f"feature {f.name} runs on the {f.flavour} flavour"
                + (" (the users' fork, on GB10)" if f.flavour == "fork" else "")
                + f"; this run's flavour is {suite.flavour.name} on {suite.platform.name}")
    if f.baseline_why:
        return f.baseline_why
    for role, name in (("candidate", f.candidate), ("baseline", f.baseline)):
        t = suite.target(suite.catalog.parse(name))
        if not t.runnable:
            return f"feature {f.name}: its {role} {name} cannot run here: {t.reason}"
    return None

