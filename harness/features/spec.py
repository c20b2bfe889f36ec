"""The users' porting protocol as data (configs/features.yaml): one feature at a time, each with a one-sentence
hypothesis, a candidate config, the baseline config it is judged against, hard success criteria, the levels
that must pass, and the phase gates it requires.

Criteria are one line each, as the users write them in their review files:
  relative to the baseline:  `tg32 >= +10%`, `ttft_p50 <= +3%`, `used_memory <= +1 GB`, `kv_capacity >= -5%`
  absolute:                  `boot_s <= 60`, `ttft_p50_ms <= 500`, `spec_acceptance_length >= 2`
Metric names are level 4's (`tgN`, `tgN_gpu`, `ppN`, `ppN_gpu`, `ttft_ms`, `tpot_ms`, `itl_ms`, `e2e_ms`, with `@dD` / `@cC`
suffixes; `<x>_p50` is an alias of `<x>_ms`), plus `used_memory` (GiB, vLLM's accounting), `kv_capacity` (tokens),
`boot_s` (seconds to /health) and the speculative-decoding counters `spec_acceptance_length` (mean tokens per
draft step: 1 + accepted / drafts) and `spec_acceptance_rate` (accepted / drafted tokens).
Every problem in the file is one line naming the entry and the fix (pydantic models, `extra="forbid"`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.config.catalog import Catalog
from harness.core.errors import SuiteError
from harness.core.paths import CONFIG_DIR
from harness.core.platform import best_selector, is_valid_selector
from harness.core.yamlfile import load_mapping
from harness.perf.metrics import higher_is_better, parse_metric_name

FEATURES_FILE = CONFIG_DIR / "features.yaml"
LEVELS = ("level1", "level1_5", "level2", "level3", "level4", "level5")
MEMORY_METRICS = {"used_memory": "GiB", "kv_capacity": "tokens"}
ABSOLUTE_ONLY = {"boot_s": ("s", False)}  # metric -> (unit, higher is better)
SPEC_METRICS = {"spec_acceptance_length": "tokens/step", "spec_acceptance_rate": "fraction"}
_CRITERION = re.compile(r"^\s*(?P<metric>[A-Za-z0-9_@]+)\s*(?P<op>>=|<=)\s*(?P<value>[+-]?\d+(?:\.\d+)?)\s*"
                        r"(?P<unit>%|GB)?\s*$")


@dataclass(frozen=True)
class Criterion:
    """One success criterion. `relative`: the candidate's value against the baseline's (`value` is a fraction for
    %, or GB for used memory); else an absolute bound on the candidate's own value."""

    text: str  # as written, e.g. "tg32 >= +10%"
    metric: str  # the name the measurement uses (ttft_p50 -> ttft_ms)
    op: str  # ">=" or "<="
    value: float  # 0.10 for +10%; 1.0 for +1 GB; 60 for boot_s <= 60
    relative: bool
    unit: str  # %, GB, or the metric's own unit for absolute bounds

    @property
    def higher_is_better(self) -> bool:
        if self.metric in MEMORY_METRICS:
            return self.metric == "kv_capacity"
        if self.metric in ABSOLUTE_ONLY:
            return ABSOLUTE_ONLY[self.metric][1]
        if self.metric in SPEC_METRICS:
            return True
        return higher_is_better(self.metric)

    @property
    def kind(self) -> str:
        """What measures it: "timing" (level 4 samples), "memory" (one number per boot), "boot", "spec"."""
        if self.metric in MEMORY_METRICS:
            return "memory"
        if self.metric in ABSOLUTE_ONLY:
            return "boot"
        if self.metric in SPEC_METRICS:
            return "spec"
        return "timing"


def _metric_name(raw: str) -> str:
    """`ttft_p50` / `ttft_p50_ms` -> `ttft_ms` (the users' words for the median of TTFT)."""
    return re.sub(r"^(ttft|tpot|itl|e2e)_p50(_ms)?", r"\1_ms", raw)


_PLAIN_SUFFIX = re.compile(r"@d0(?!\d)|@c1(?!\d)")


def _check_measurable(text: str, metric: str, base: str) -> None:
    """A criterion the feature workloads would never measure is refused now, not found an ERROR after every boot."""
    if _PLAIN_SUFFIX.search(metric):
        plain = _PLAIN_SUFFIX.sub("", metric)
        raise SuiteError(f"criterion {text!r}: depth 0 and concurrency 1 are the plain metric; write {plain}")
    if base.endswith("_gpu") and "@c" in metric:
        raise SuiteError(f"criterion {text!r}: kernel-time metrics (ppN_gpu, tgN_gpu) are measured at batch 1; "
                         f"drop the @c suffix, or bound the engine-clock rate ({metric.replace('_gpu', '')})")
    if base.startswith("pp") and base.endswith("_gpu") and "@d" in metric:
        raise SuiteError(f"criterion {text!r}: ppN_gpu is measured at depth 0 only; drop the @d suffix, or bound "
                         f"the engine-clock prefill at depth ({metric.replace('_gpu', '')})")
    tokens = re.match(r"(tg|pp)(\d+)", base)
    if tokens and int(tokens[2]) < (2 if tokens[1] == "tg" else 1):
        need = "a decode rate needs at least 2 generated tokens" if tokens[1] == "tg" else "a prefill needs a token"
        raise SuiteError(f"criterion {text!r}: {need} (e.g. tg32, pp512)")


def parse_criterion(text: str) -> Criterion:
    """`"tg32 >= +10%"` -> Criterion; SuiteError (one line, with the grammar) for anything else, and for a bound on
    the wrong side of its metric (`ttft_p50 >= -3%` would pass a 50% slower TTFT: a latency is better lower)."""
    c = _parse_criterion(text)
    if c.op != (">=" if c.higher_is_better else "<="):
        better, op = ("higher", ">=") if c.higher_is_better else ("lower", "<=")
        raise SuiteError(f"criterion {text!r}: {c.metric} is better {better}, so a bound on it is written "
                         f"'{c.metric} {op} ...' (a {c.op} bound would pass the change it should catch)")
    return c


def _parse_criterion(text: str) -> Criterion:
    m = _CRITERION.match(text or "")
    grammar = ("write '<metric> >= +10%' (relative to the baseline, signed), '<metric> <= +1 GB' (used_memory) or "
               "'<metric> <= 500' (absolute)")
    if not m:
        raise SuiteError(f"criterion {text!r} is not understood; {grammar}")
    raw, op, value, unit = m["metric"], m["op"], m["value"], m["unit"]
    metric = _metric_name(raw)
    signed = value[0] in "+-"
    known = metric in MEMORY_METRICS or metric in ABSOLUTE_ONLY or metric in SPEC_METRICS
    if not known:
        try:
            parse_metric_name(metric)
        except SuiteError:
            raise SuiteError(f"criterion {text!r}: unknown metric {raw!r}; use a level 4 metric (tg32, pp2048, "
                             f"pp2048_gpu, ttft_p50, tpot_ms, tg32@c4), used_memory, kv_capacity, boot_s, "
                             f"spec_acceptance_length or spec_acceptance_rate") from None
    base = metric.split("@")[0]
    _check_measurable(text, metric, base)
    if base.endswith("_ms") and "@c" in metric:
        raise SuiteError(f"criterion {text!r}: latencies (TTFT, TPOT, ITL, e2e) are measured by the latency workload, "
                         f"one request at a time; drop the @c suffix, or bound a rate at that concurrency (tg32@c4)")
    if unit == "GB":
        if metric != "used_memory" or not signed:
            raise SuiteError(f"criterion {text!r}: GB bounds the change of used_memory, signed (used_memory <= +1 GB)")
        return Criterion(text, metric, op, float(value), True, "GB")
    if unit == "%":
        if not signed:
            raise SuiteError(f"criterion {text!r}: a relative criterion needs a sign (+10% or -3%), so its direction "
                             "is never guessed")
        if op == ">=" and float(value) <= -100:
            raise SuiteError(f"criterion {text!r}: a ratio is never below 0, so a bound of {value}% can never fail; "
                             "write the largest drop you accept (e.g. -3%)")
        if metric in ABSOLUTE_ONLY:
            raise SuiteError(f"criterion {text!r}: {metric} takes an absolute bound ({metric} <= 60)")
        return Criterion(text, metric, op, float(value) / 100.0, True, "%")
    if signed:
        raise SuiteError(f"criterion {text!r}: a signed number without % or GB is ambiguous; {grammar}")
    if metric in MEMORY_METRICS:
        raise SuiteError(f"criterion {text!r}: {metric} is judged against the baseline ({metric} <= +1 GB / >= -5%)")
    if metric.endswith("_ms") or metric in ABSOLUTE_ONLY or metric in SPEC_METRICS or parse_metric_name(metric):
        unit_of = ABSOLUTE_ONLY.get(metric, ("",))[0] or SPEC_METRICS.get(metric) or (
            "ms" if base.endswith("_ms") else "tok/s")
        return Criterion(text, metric, op, float(value), False, unit_of)
    raise SuiteError(f"criterion {text!r}: {grammar}")  # pragma: no cover - every branch above returns or raises


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FeatureEntry(_Model):
    phase: str | None = None
    flavour: Literal["fork", "upstream", "cpu"]
    hypothesis: str = Field(min_length=10)
    candidate: str
    # default: the flavour's baseline config (`baselines:`); a config, or configs by platform selector (most specific wins)
    baseline: str | dict[str, str] | None = None
    criteria: list[str] = Field(min_length=1)
    levels: list[str] = Field(default_factory=list)
    requires: list[str] = Field(default_factory=list)  # features whose `gate` must pass first
    gate: list[str] = Field(default_factory=list)  # what the next phase requires of this feature
    about: str | None = None

    @field_validator("hypothesis")
    @classmethod
    def _one_sentence(cls, v: str) -> str:
        # "... Marlin! Because ..." is two sentences as much as ". " is
        if re.search(r"[.!?]\s", v.strip()) or "\n" in v.strip():
            raise ValueError("must be one sentence (the protocol: one-sentence hypothesis)")
        return v

    @field_validator("baseline")
    @classmethod
    def _some_baseline(cls, v: str | dict[str, str] | None) -> str | dict[str, str] | None:
        if isinstance(v, dict) and not v:  # would fall back to the flavour's baseline without a word
            raise ValueError("an empty by-platform baseline; give a config, or platform selectors mapped to configs")
        return v

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in LEVELS]
        if bad:
            raise ValueError(f"unknown level(s) {bad}; known: {', '.join(LEVELS)}")
        return v

    @field_validator("criteria", "gate")
    @classmethod
    def _criteria(cls, v: list[str]) -> list[str]:
        for text in v:
            if text.strip().startswith("levels"):
                continue
            try:
                parse_criterion(text)
            except SuiteError as e:
                raise ValueError(str(e)) from None
        return v


class FeaturesFile(_Model):
    baselines: dict[Literal["fork", "upstream", "cpu"], str | dict[str, str]]
    features: dict[str, FeatureEntry]


@dataclass(frozen=True)
class Feature:
    """One feature, resolved: config names checked against the catalog, criteria parsed."""

    name: str
    phase: str | None
    flavour: str
    hypothesis: str
    candidate: str
    baseline: str  # the config this platform judges against; "" where none is given for it (`baseline_why`)
    criteria: tuple[Criterion, ...]
    levels: tuple[str, ...]
    requires: tuple[str, ...]
    gate: tuple[Criterion, ...]
    gate_levels: tuple[str, ...]  # `levels ...` entries of the gate: those levels must have passed
    about: str | None = None
    baseline_why: str | None = None  # why `baseline` is "": no entry of a by-platform baseline fits this platform


def _one_line(e: ValidationError, path: Path) -> str:
    """pydantic's report -> one line per problem, joined: `<file>: features.x.criteria.0: <why>`."""
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (typo?)"
        parts.append(f"{where}: {msg}")
    return f"{path}: " + "; ".join(parts) + "; fix the entry (configs/features.yaml documents every key)"


def _gate(texts: list[str]) -> tuple[tuple[Criterion, ...], tuple[str, ...]]:
    crits, levels = [], []
    for t in texts:
        if t.strip().startswith("levels"):
            levels += [x for x in re.split(r"[\s,]+", t.strip()[len("levels"):]) if x]
        else:
            crits.append(parse_criterion(t))
    bad = [x for x in levels if x not in LEVELS]
    if bad:
        raise SuiteError(f"gate 'levels {' '.join(levels)}': unknown level(s) {bad}")
    return tuple(crits), tuple(levels)


def _baseline_on(spec: str | dict[str, str], platform: str | None, where: str) -> tuple[list[str], str, str | None]:
    """(every config `spec` names, the one `platform` judges against or "", why none). A by-platform baseline exists
    because stock differs: upstream vLLM serves gpt-oss's MoE with Triton's matmul_ogs on Hopper, and refuses that
    backend on sm_12x, where Marlin is its default. The most specific matching selector wins."""
    if isinstance(spec, str):
        return [spec], spec, None
    bad = [sel for sel in spec if not is_valid_selector(sel)]
    if bad:
        raise SuiteError(f"{where} has unknown platform selector(s) {bad}; use cpu, sm_90, a family like sm_12x, or "
                         ">=sm_80")
    listed = ", ".join(f"{sel}: {cfg}" for sel, cfg in spec.items())
    if platform is None:
        return list(spec.values()), "", (f"{where} depends on the platform ({listed}); judge it on a platform "
                                         "(the suite passes its own)")
    sel = best_selector(spec, platform)
    if sel is not None:
        return list(spec.values()), spec[sel], None
    return list(spec.values()), "", (f"{where} has no entry for {platform} ({listed}); add the config stock serves "
                                     f"on {platform} there")


def _read(path: Path) -> FeaturesFile:
    try:
        return FeaturesFile.model_validate(load_mapping(path, "restore it from git (configs/features.yaml)"))
    except ValidationError as e:
        raise SuiteError(_one_line(e, path)) from None


def flavour_baseline(flavour: str, platform: str, path: Path = FEATURES_FILE) -> str:
    """The flavour's baseline config on `platform` (`baselines:`), e.g. upstream's stock MoE: triton-bf16 on Hopper,
    marlin-bf16 on GB10."""
    spec = _read(path).baselines.get(flavour)
    if not spec:
        raise SuiteError(f"{path}: `baselines:` has none for flavour {flavour}; add one")
    _, config, why = _baseline_on(spec, platform, f"the {flavour} baseline ({path.name} baselines.{flavour})")
    if why:
        raise SuiteError(why)
    return config


def load_features(path: Path = FEATURES_FILE, catalog: Catalog | None = None,
                  platform: str | None = None) -> dict[str, Feature]:
    """Every feature of the file, validated against the catalog (config names) and each other (requires).
    `platform` picks each by-platform baseline (without it, such a feature's baseline is "" and `baseline_why`
    says why)."""
    data = _read(path)
    catalog = catalog or Catalog()
    out: dict[str, Feature] = {}
    for name, f in data.features.items():
        where = f"{path}: features.{name}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            raise SuiteError(f"{where}: feature names are kebab case ([a-z0-9-]); rename it")
        spec = f.baseline or data.baselines.get(f.flavour)
        if not spec:
            raise SuiteError(f"{where}: no baseline given and `baselines:` has none for flavour {f.flavour}; add one")
        named, baseline, baseline_why = _baseline_on(
            spec, platform, f"feature {name}: its baseline ({path.name} "
            + (f"features.{name}.baseline" if f.baseline else f"baselines.{f.flavour}") + ")")
        for role, cfg in [("candidate", f.candidate)] + [("baseline", b) for b in named]:
            try:
                catalog.parse(cfg, f"{where}.{role}")
            except SuiteError as e:
                raise SuiteError(f"{e}") from None
        try:
            gate, gate_levels = _gate(f.gate)
        except SuiteError as e:
            raise SuiteError(f"{where}.gate: {e}") from None
        unrun = [lv for lv in gate_levels if lv not in f.levels]
        if unrun:  # found only after the whole run, as an ERROR, before
            raise SuiteError(f"{where}.gate: levels {unrun} are not among the feature's `levels`, so they never run; "
                             f"add them to its levels or drop them from its gate")
        out[name] = Feature(name, f.phase, f.flavour, f.hypothesis.strip(), catalog.name(catalog.parse(f.candidate)),
                            catalog.name(catalog.parse(baseline)) if baseline else "",
                            tuple(parse_criterion(c) for c in f.criteria), tuple(f.levels), tuple(f.requires), gate,
                            gate_levels, f.about, baseline_why)
    for name, f in out.items():
        missing = [r for r in f.requires if r not in out]
        if missing:
            raise SuiteError(f"{path}: features.{name}.requires names {missing}, not features of this file")
        if name in f.requires:
            raise SuiteError(f"{path}: features.{name} requires itself")
    _no_cycle(out, path)
    return out


def _no_cycle(features: dict[str, Feature], path: Path) -> None:
    state: dict[str, int] = {}

    def visit(n: str, chain: list[str]) -> None:
        if state.get(n) == 1:
            raise SuiteError(f"{path}: requires form a cycle: {' -> '.join(chain + [n])}")
        if state.get(n) == 2:
            return
        state[n] = 1
        for r in features[n].requires:
            visit(r, chain + [n])
        state[n] = 2

    for n in features:
        visit(n, [])


def ad_hoc(candidate: str, baseline: str, criteria: str | None, catalog: Catalog, flavour: str) -> Feature:
    """`--config=CANDIDATE --against=BASELINE [--criteria='tg32 >= +5%; used_memory <= +1 GB']`: a feature that
    is not in the file, judged like one (default criteria: no throughput or TTFT regression beyond 3%, memory
    within the users' review template)."""
    texts = [c.strip() for c in (criteria or DEFAULT_CRITERIA).split(";") if c.strip()]
    if not texts:  # judged on nothing, a feature is not a pass
        raise SuiteError(f"--criteria {criteria!r} holds no criterion; write one or more, ';'-separated, e.g. "
                         "--criteria='tg32 >= +5%; used_memory <= +1 GB'")
    cand, base = catalog.name(catalog.parse(candidate, "--config")), catalog.name(catalog.parse(baseline, "--against"))
    return Feature(f"{cand}-vs-{base}", None, flavour, f"{cand} is no worse than {base} on the criteria given.",
                   cand, base, tuple(parse_criterion(c) for c in texts), (), (), (), ())


# The users' review template's standing criteria, for a comparison given on the command line without its own.
DEFAULT_CRITERIA = "tg32 >= -3%; ttft_p50 <= +3%; used_memory <= +2 GB; kv_capacity >= -5%"


def selected_features(catalog: Catalog, platform: str, flavour: str, feature_option: str | None,
                      against: str | None, config_option: str | None, criteria: str | None) -> dict[str, Feature]:
    """The features a run judges, in file order (--feature, default all), or the ad-hoc one of --config X
    --against Y. Checked when the run starts (conftest.py), so a bad name or file is one line before collection."""
    known = load_features(catalog=catalog, platform=platform)
    if criteria and not against:  # a feature of the file judges its own criteria: these would be ignored in silence
        raise SuiteError("--criteria gives an ad-hoc comparison its criteria: use it with --config=CANDIDATE "
                         "--against=BASELINE (a feature of configs/features.yaml is judged by its own)")
    if against:
        if not config_option or "," in config_option:
            raise SuiteError("--against judges one candidate: pass --config=CANDIDATE (one config)")
        f = ad_hoc(config_option, against, criteria, catalog, flavour)
        return {f.name: f}
    if not feature_option or feature_option == "all":
        return known
    names = [n.strip() for n in feature_option.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SuiteError(f"--feature: unknown feature(s) {', '.join(unknown)}; known: {', '.join(known)} "
                         "(configs/features.yaml), or 'all'")
    return {n: known[n] for n in names}
