"""A verdict per criterion, from statistics (never from one number against another).

Relative criteria on timing samples: the bootstrap CI (95%, of medians, as level 5 uses) of the
candidate/baseline ratio is compared with the target `1 + value`:
  `>=` (e.g. tg32 >= +10%): PASS when the whole CI lies at or above 1.10, FAIL when it lies below it;
  `<=` (e.g. ttft_p50 <= +3%): PASS when the whole CI lies at or below 1.03, FAIL when it lies above it;
  otherwise INCONCLUSIVE: the run cannot tell (more rounds, a quieter machine), never PASS.
Absolute criteria on timing samples use the bootstrap CI of the candidate's median the same way.
Memory criteria (vLLM's own accounting, one number per boot, deterministic: A/A boots move it by < 0.05 GiB)
are strict: the difference itself is compared, on every platform. `boot_s` likewise (one boot is one number).
A criterion whose metric the run did not measure is an ERROR, never a pass; a feature whose required gate
failed is BLOCKED by it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Sequence

import numpy as np

from harness.core import stats
from harness.features.spec import Criterion

GIB = 1024 ** 3
CI_LEVEL = 0.95
BOOTSTRAP_N = 2000


class Status(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    ERROR = "ERROR"  # the metric was not measured: a criterion that did not run is never a pass
    BLOCKED = "BLOCKED"  # a required feature's gate failed


@dataclass(frozen=True)
class CriterionVerdict:
    criterion: str  # as written
    metric: str
    status: Status
    why: str  # one line: the numbers and the rule that decided
    baseline: float | None = None  # median (timing) or the number (memory)
    candidate: float | None = None
    ratio: float | None = None  # candidate / baseline (medians)
    ci: tuple[float, float] | None = None  # CI of the ratio (relative) or of the candidate's median (absolute)
    target: float | None = None  # the bound the CI is held to (1.10, 500 ms, +1 GB)
    n: tuple[int, int] | None = None  # samples (baseline, candidate)

    def to_json(self) -> dict:
        return {**asdict(self), "status": self.status.value}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else stats.fmt(x)


def _clears(ci: tuple[float, float], op: str, target: float) -> Status:
    lo, hi = ci
    if op == ">=":
        return Status.PASS if lo >= target else Status.FAIL if hi < target else Status.INCONCLUSIVE
    return Status.PASS if hi <= target else Status.FAIL if lo > target else Status.INCONCLUSIVE


def judge_samples(c: Criterion, baseline: Sequence[float] | None, candidate: Sequence[float] | None,
                  seed: int = 0, drift: float | None = None, boot_spread: float = 0.0,
                  spread_why: str | None = None) -> CriterionVerdict:
    """A timing (or speculative-decoding) criterion from per-round samples of both sides.

    Baseline and candidate always come from different boots, and a boot moves some metrics by more than any
    number of rounds within it averages away. The ratio's CI is widened on both ends by the larger of:
    `drift`: how far the baseline's two boots of an A, B, A run disagree (|A2 / A1 - 1|): the candidate ran between
      them, so its true reference lies anywhere in that range (an H100 showed stock's tg32 move 15% between its
      two boots, nothing changed);
    `boot_spread`: this metric's recorded A/A spread between boots on this platform (baselines/thresholds.yaml,
      the same numbers level 5 uses), which an ABBA run of two servers cannot measure: on the 2-core CPU CI two
      boots of one config measured interleaved came out at tg32 ratios 0.84 and 1.27, each with a tight CI.
    `spread_why` names where a `boot_spread` other than the thresholds file's comes from (a host-bound decode).
    Samples that are not finite, or a relative criterion on a baseline whose median is not positive, are an ERROR
    with the reason: a broken measurement is never judged."""
    if not candidate or (c.relative and not baseline):
        side = "candidate" if not candidate else "baseline"
        return CriterionVerdict(c.text, c.metric, Status.ERROR, f"{c.metric} was not measured on the {side}: a "
                                f"criterion that did not run is not a pass (is the workload in this platform's set?)")
    if min(len(candidate), len(baseline or candidate)) < 2:
        return CriterionVerdict(c.text, c.metric, Status.INCONCLUSIVE, f"{c.metric}: one sample cannot give a CI; "
                                f"measure at least 2 rounds per side", n=(len(baseline or []), len(candidate)))
    broken = next((x for x in list(candidate) + list(baseline or []) if not math.isfinite(x)), None)
    if broken is not None:
        return CriterionVerdict(c.text, c.metric, Status.ERROR, f"{c.metric}: a sample is {broken}: a broken "
                                "measurement is not judged (see samples.json)", n=(len(baseline or []), len(candidate)))
    level = CI_LEVEL
    spread_why = spread_why or (f"this platform's A/A boot spread of {boot_spread * 100:.0f}% "
                                "(baselines/thresholds.yaml)")
    if c.relative:
        b, k = stats.median(baseline), stats.median(candidate)
        if b <= 0:
            return CriterionVerdict(c.text, c.metric, Status.ERROR, f"{c.metric}: the baseline's median is {_fmt(b)}, "
                                    f"so a ratio to it means nothing; bound it absolutely ({c.metric} {c.op} N)",
                                    b, k, n=(len(baseline), len(candidate)))
        try:
            lo, hi = stats.bootstrap_ratio_ci(baseline, candidate, stat=np.median, n=BOOTSTRAP_N, seed=seed,
                                              level=level)
        except ValueError as e:  # some resample of the baseline has a zero median: the ratio is undefined there
            return CriterionVerdict(c.text, c.metric, Status.ERROR, f"{c.metric}: {e}; a relative criterion cannot be "
                                    f"judged on these samples ({_fmt(b)} -> {_fmt(k)} median)", b, k,
                                    n=(len(baseline), len(candidate)))
        target = 1.0 + c.value
        widened = ""
        widen = max(drift or 0.0, boot_spread)
        if widen:
            lo, hi = lo / (1.0 + widen), hi * (1.0 + widen)
            widened = (f", widened by the baseline boots' drift of {widen * 100:.1f}%" if widen == drift else
                       f", widened by {spread_why}")
        status = _clears((lo, hi), c.op, target)
        why = (f"{c.metric} {b and (k / b - 1) * 100:+.1f}% ({_fmt(b)} -> {_fmt(k)} median; {round(level * 100)}% CI of "
               f"the ratio [{lo:.3f}, {hi:.3f}]{widened} vs target {c.op} {target:.3f}; n={len(baseline)}/{len(candidate)})")
        return CriterionVerdict(c.text, c.metric, status, why, b, k, k / b if b else None, (lo, hi), target,
                                (len(baseline), len(candidate)))
    lo, hi = _median_ci(candidate, seed, level)
    k = stats.median(candidate)
    widened = ""
    if boot_spread:  # one boot's median lands anywhere within the platform's A/A spread of the next boot's
        lo, hi = lo / (1.0 + boot_spread), hi * (1.0 + boot_spread)
        widened = f", widened by {spread_why}"
    status = _clears((lo, hi), c.op, c.value)
    why = (f"{c.metric} {_fmt(k)} {c.unit} median ({round(level * 100)}% CI [{_fmt(lo)}, {_fmt(hi)}]{widened} vs "
           f"{c.op} {_fmt(c.value)}; n={len(candidate)})")
    return CriterionVerdict(c.text, c.metric, status, why, None, k, None, (lo, hi), c.value, (0, len(candidate)))


def _median_ci(samples: Sequence[float], seed: int, level: float) -> tuple[float, float]:
    a = np.asarray(samples, dtype=float)
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, a.size, size=(BOOTSTRAP_N, a.size))], axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(meds, tail)), float(np.quantile(meds, 1 - tail))


def judge_number(c: Criterion, baseline: float | None, candidate: float | None,
                 baseline_range: float = 0.0) -> CriterionVerdict:
    """Memory (used GiB, KV tokens) and boot time: one number per boot, compared strictly, unless the baseline's own
    boots disagree. `baseline_range`: their max - min (in the metric's unit). vLLM's accounting moves from boot to boot
    with nothing changed (the 120b shape on an H100 at 0.92: 0.54 GiB used, 5.7% of KV capacity, whose pool is ~10
    GiB there), so a candidate that lies within that range of the bound could land on either side of it when booted
    again: INCONCLUSIVE, not a verdict the boots cannot carry."""
    if candidate is None or (c.relative and baseline is None):
        side = "candidate" if candidate is None else "baseline"
        return CriterionVerdict(c.text, c.metric, Status.ERROR, f"{c.metric} was not measured on the {side} (vLLM's "
                                f"startup log lacked its accounting lines?): not a pass")
    if not all(math.isfinite(x) for x in (candidate, baseline if c.relative else 0.0)):
        return CriterionVerdict(c.text, c.metric, Status.ERROR, f"{c.metric}: {_fmt(baseline)} -> {_fmt(candidate)} is "
                                "not a measurement (see samples.json); not judged", baseline, candidate)
    if c.relative and c.unit == "%" and baseline <= 0:
        return CriterionVerdict(c.text, c.metric, Status.ERROR, f"{c.metric}: the baseline measured {_fmt(baseline)}, "
                                "so a ratio to it means nothing; not judged", baseline, candidate)
    if not c.relative:
        ok = candidate >= c.value if c.op == ">=" else candidate <= c.value
        return CriterionVerdict(c.text, c.metric, Status.PASS if ok else Status.FAIL,
                                f"{c.metric} {_fmt(candidate)} vs {c.op} {_fmt(c.value)}", None, candidate, None, None,
                                c.value)
    spread = max(baseline_range, 0.0)
    if c.unit == "GB":  # used memory: GiB numbers, the bound in decimal GB (the users' plan: "memory increase <= 2GB")
        growth_gb = (candidate - baseline) * GIB / 1e9
        reach = (growth_gb - spread * GIB / 1e9, growth_gb + spread * GIB / 1e9)
        status = _clears(reach, c.op, c.value)
        why = (f"{c.metric} {baseline:.2f} -> {candidate:.2f} GiB ({growth_gb:+.2f} GB vs {c.op} {c.value:+g} GB; "
               f"vLLM's accounting, one number per boot)")
        if spread:
            why += _spread_note(status, f"{spread:.2f} GiB")
        return CriterionVerdict(c.text, c.metric, status, why, baseline, candidate,
                                candidate / baseline if baseline else None, None, c.value)
    ratio = candidate / baseline if baseline else math.inf
    reach = ((candidate - spread) / baseline, (candidate + spread) / baseline) if baseline else (ratio, ratio)
    target = 1.0 + c.value
    status = _clears(reach, c.op, target)
    why = f"{c.metric} {_fmt(baseline)} -> {_fmt(candidate)} ({(ratio - 1) * 100:+.2f}% vs {c.op} {c.value * 100:+g}%)"
    if spread:
        why += _spread_note(status, f"{_fmt(spread)} ({spread / baseline * 100:.1f}%)" if baseline else _fmt(spread))
    return CriterionVerdict(c.text, c.metric, status, why, baseline, candidate, ratio, None, target)


def _spread_note(status: Status, spread: str) -> str:
    if status is Status.INCONCLUSIVE:
        return (f"; the baseline's boots differ by {spread} with nothing changed, and the candidate lies within that of "
                "the bound: another boot could land on either side of it, not judged")
    verb = "passes" if status is Status.PASS else "misses"
    return f"; {verb} the bound by more than the baseline's boots differ ({spread})"


def blocked(c: Criterion, by: str) -> CriterionVerdict:
    return CriterionVerdict(c.text, c.metric, Status.BLOCKED, f"not measured: blocked by {by}")


def did_not_boot(c: Criterion, who: str, config: str, cause: str, baseline: float | None = None) -> CriterionVerdict:
    """A criterion of a feature whose server died at boot: the candidate's death is the feature's FAIL (a config
    that cannot load where the baseline serves fails every criterion); the baseline's leaves nothing to judge.
    `baseline`: what the baseline measured before the candidate's boot, for the review's table."""
    status = Status.FAIL if who == "candidate" else Status.ERROR
    return CriterionVerdict(c.text, c.metric, status, f"not measured: the {who} {config} did not boot ({cause})",
                            baseline=baseline)


def overall(statuses: Sequence[Status]) -> Status:
    """A feature's verdict from its criteria and levels: any FAIL fails, any ERROR errs, any INCONCLUSIVE (with no
    FAIL) is inconclusive, BLOCKED when blocked; PASS only when everything passed."""
    for s in (Status.BLOCKED, Status.FAIL, Status.ERROR, Status.INCONCLUSIVE):
        if s in statuses:
            return s
    return Status.PASS if statuses else Status.ERROR
