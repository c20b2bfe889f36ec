"""Level 6: which configuration combinations to run, and whether one axis changes only its own kernels.

Combinations come from data (`tests/level6_matrix/matrix.yaml`): per platform, a base configuration
and the axes (and values) to vary around it. The full product is used while it is small; otherwise a
pairwise covering set, seeded with the base and its one-factor-at-a-time neighbours so that every
varied value has a partner that differs from it in exactly one axis (the orthogonality check needs
such pairs). Combinations the flavour cannot run (`Flavour.runnable`) are excluded, each with its reason.

Orthogonal gating (the users' plan: "ensure orthogonal gating works, no feature interference"): for two
combinations that differ in exactly one axis, every kernel (or CPU op) that ran on one side only must
be explained by a kernel pattern the flavour declares for that axis (a `must` of the side it ran on or
a `must_not` of the side it is missing from); and the kernels the *other* axes declare (`must`) must
run equally often on both sides. Everything else is a feature interfering with another: reported as
a readable diff.
"""
from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.config.catalog import Catalog, Config, Flavour, KernelExpectation
from harness.core.errors import SuiteError
from harness.core.paths import REPO
from harness.core.platform import best_selector, is_valid_selector
from harness.kernelpath.traces import KernelSummary

MATRIX_FILE = REPO / "tests" / "level6_matrix" / "matrix.yaml"


# -- the data ---------------------------------------------------------------------------------
@dataclass
class PlatformMatrix:
    selector: str
    base: str  # config name
    vary: dict[str, list[str] | None]  # axis -> values (None: every value of the axis)
    max_full: int  # full product up to this many combinations, pairwise above
    neutral: list[str]  # axes that must not change the model's outputs (beyond near ties)
    why: str


@dataclass
class OrthogonalityRules:
    min_share: float = 0.0  # one-sided ops below this share of op time are listed, not judged
    ignore: dict[str, str] = field(default_factory=dict)  # glob -> why it may differ between any two runs
    anchor_tolerance: float = 0.0  # relative difference allowed in the call counts of other axes' kernels


@dataclass
class MatrixData:
    platforms: list[PlatformMatrix]
    rules: OrthogonalityRules
    path: Path

    def for_platform(self, platform_name: str) -> PlatformMatrix | None:
        selector = best_selector([m.selector for m in self.platforms], platform_name)
        return next((m for m in self.platforms if m.selector == selector), None)


def load_matrix(path: Path = MATRIX_FILE) -> MatrixData:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SuiteError(f"{path}: cannot read ({e.strerror}); restore it from git") from None
    except yaml.YAMLError as e:
        raise SuiteError(f"{path}: malformed YAML ({str(e).splitlines()[0]}); fix the file") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("platforms"), dict):
        raise SuiteError(f"{path}: needs a `platforms:` mapping of platform selector -> matrix")
    platforms = []
    for selector, spec in raw["platforms"].items():
        where = f"{path}: platforms.{selector}"
        if not is_valid_selector(str(selector)):
            raise SuiteError(f"{where}: '{selector}' is not a platform selector (cpu, sm_90, sm_12x, >=sm_80)")
        if not isinstance(spec, dict) or "base" not in spec or not spec.get("vary"):
            raise SuiteError(f"{where}: needs `base:` (a config name) and `vary:` (axis: [values] or axis: all)")
        vary_raw = spec["vary"]
        if isinstance(vary_raw, list):
            vary_raw = {a: None for a in vary_raw}
        vary = {str(a): (None if v in (None, "all") else [str(x) for x in v]) for a, v in vary_raw.items()}
        platforms.append(PlatformMatrix(
            str(selector), str(spec["base"]), vary, int(spec.get("max_full", 8)),
            [str(a) for a in spec.get("neutral") or []], str(spec.get("why", "")).strip(),
        ))
    o = raw.get("orthogonality") or {}
    rules = OrthogonalityRules(float(o.get("min_share", 0.0)), {str(k): str(v) for k, v in (o.get("ignore") or {}).items()},
                               float(o.get("anchor_tolerance", 0.0)))
    return MatrixData(platforms, rules, path)


# -- combinations ----------------------------------------------------------------------------
@dataclass
class Combo:
    name: str
    config: Config
    differs: dict[str, str]  # axis -> value where it differs from the base


@dataclass
class Plan:
    platform: str
    flavour: str
    base: Combo
    axes: dict[str, list[str]]
    strategy: str  # "full" or "pairwise"
    combos: list[Combo]
    excluded: list[tuple[str, str]]  # (config name, reason) of the grid the flavour cannot run
    uncovered: list[str]  # value pairs no runnable combination has (pairwise only)
    why: str
    grid_size: int
    neutral: list[str] = field(default_factory=list)  # axes that must not change outputs

    def names(self) -> list[str]:
        return [c.name for c in self.combos]

    def combo(self, name: str) -> Combo:
        for c in self.combos:
            if c.name == name:
                return c
        raise SuiteError(f"level 6: '{name}' is not a combination of this plan ({', '.join(self.names())})")

    def pairs(self) -> list[tuple[Combo, Combo, str]]:
        """Every two combinations that differ in exactly one axis, with that axis."""
        return one_axis_pairs(self.combos)

    def report(self) -> str:
        lines = [f"# Level 6 matrix on {self.platform} (flavour {self.flavour})", "",
                 f"base: {self.base.name}; varied: " + "; ".join(f"{a} {{{', '.join(v)}}}" for a, v in self.axes.items()),
                 f"grid: {self.grid_size} combinations; strategy: {self.strategy}; running {len(self.combos)}",
                 f"why: {self.why}" if self.why else "", "", "## combinations"]
        for c in self.combos:
            diff = ", ".join(f"{a}={v}" for a, v in c.differs.items()) or "(the base)"
            lines.append(f"- {c.name}: {diff}")
        lines += ["", f"## excluded ({len(self.excluded)})"]
        lines += [f"- {name}: {why}" for name, why in self.excluded] or ["- none: the flavour runs every combination of the grid here"]
        if self.strategy == "pairwise":
            lines += ["", f"## value pairs no runnable combination covers ({len(self.uncovered)})"]
            lines += [f"- {p}" for p in self.uncovered] or ["- none"]
        lines += ["", "## one-axis pairs (orthogonality checks)"]
        lines += [f"- {a.name} vs {b.name}: {axis}" for a, b, axis in self.pairs()] or ["- none"]
        return "\n".join(line for line in lines if line is not None) + "\n"


def make_plan(catalog: Catalog, flavour: Flavour, platform_name: str, spec: PlatformMatrix, model: str | None = None) -> Plan:
    base_cfg = catalog.parse(spec.base, f"level 6 matrix base for {spec.selector}")
    ok, why = flavour.runnable(base_cfg, platform_name, model)
    if not ok:
        raise SuiteError(f"level 6: the base {spec.base} cannot run on {platform_name} with flavour {flavour.name}: {why}")
    axes: dict[str, list[str]] = {}
    for axis, values in spec.vary.items():
        if axis not in catalog.axes:
            raise SuiteError(f"level 6 matrix {spec.selector}: unknown axis '{axis}'; valid axes: {', '.join(catalog.axes)}")
        all_values = list(catalog.axes[axis].tokens)
        values = values or all_values
        bad = [v for v in values if v not in all_values]
        if bad:
            raise SuiteError(f"level 6 matrix {spec.selector}: {axis} values {bad} are not among {all_values}")
        base_value = base_cfg[axis]
        axes[axis] = [base_value] + [v for v in values if v != base_value]  # the base value first
    grid = [catalog.make({**base_cfg.values, **dict(zip(axes, values))}, f"level 6 matrix {spec.selector}")
            for values in itertools.product(*axes.values())]
    runnable, excluded = [], []
    for cfg in grid:
        ok, why = flavour.runnable(cfg, platform_name, model)
        (runnable if ok else excluded).append(cfg if ok else (catalog.name(cfg), why))

    def combo(cfg: Config) -> Combo:
        return Combo(catalog.name(cfg), cfg, {a: cfg[a] for a in axes if cfg[a] != base_cfg[a]})

    if len(grid) <= spec.max_full:
        chosen, strategy, uncovered = runnable, "full", []
    else:
        chosen, uncovered = pairwise(base_cfg, list(axes), runnable, grid)
        strategy = "pairwise"
    order = list(axes)

    def key(cfg: Config) -> tuple:  # the base, then one-axis neighbours in `vary` order, ...
        differs = combo(cfg).differs
        return len(differs), [order.index(a) for a in differs], [axes[a].index(v) for a, v in differs.items()]

    chosen = sorted(chosen, key=key)
    return Plan(platform_name, flavour.name, combo(base_cfg), axes, strategy, [combo(c) for c in chosen],
                excluded, uncovered, spec.why, len(grid), list(spec.neutral))


def _pairs_of(cfg: Config, axes: list[str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return {((a, cfg[a]), (b, cfg[b])) for a, b in itertools.combinations(axes, 2)}


def pairwise(base: Config, axes: list[str], runnable: list[Config], grid: list[Config]) -> tuple[list[Config], list[str]]:
    """A greedy all-pairs covering set of `runnable`, seeded with `base` and its one-axis neighbours.

    Returns (chosen, uncovered): `uncovered` names the value pairs that only excluded combinations
    of the grid have (so no runnable combination can cover them)."""
    chosen: list[Config] = []
    for cfg in runnable:  # the base, then every one-factor-at-a-time neighbour (grid order)
        n_diff = sum(cfg[a] != base[a] for a in axes)
        if n_diff == 0:
            chosen.insert(0, cfg)
        elif n_diff == 1:
            chosen.append(cfg)
    needed = set().union(*(_pairs_of(c, axes) for c in runnable)) if runnable else set()
    covered = set().union(*(_pairs_of(c, axes) for c in chosen)) if chosen else set()
    todo = needed - covered
    while todo:
        best = max(runnable, key=lambda c: (len(_pairs_of(c, axes) & todo), -runnable.index(c)))
        gain = _pairs_of(best, axes) & todo
        if not gain:
            break
        chosen.append(best)
        todo -= gain
    all_pairs = set().union(*(_pairs_of(c, axes) for c in grid)) if grid else set()
    uncovered = sorted(f"{a}={va} with {b}={vb}" for (a, va), (b, vb) in all_pairs - needed)
    return chosen, uncovered


def one_axis_pairs(combos: list[Combo]) -> list[tuple[Combo, Combo, str]]:
    out = []
    for a, b in itertools.combinations(combos, 2):
        diff = [axis for (axis, va), (_, vb) in zip(a.config.axes, b.config.axes) if va != vb]
        if len(diff) == 1:
            out.append((a, b, diff[0]))
    return out


def pair_id(a: str, b: str) -> str:
    return f"{a}~{b}"


# -- orthogonality ----------------------------------------------------------------------------
@dataclass
class OpChange:
    name: str
    side: str  # "a" or "b": where it ran
    share: float
    calls: int
    explained_by: str = ""  # "pattern (axis=value must)" or ""


@dataclass
class OrthogonalityDiff:
    a: str
    b: str
    axis: str
    explained: list[OpChange]
    unexplained: list[OpChange]
    below_threshold: list[OpChange]
    ignored: list[tuple[str, str]]  # (op, why)
    count_changes: list[str]  # other axes' kernels whose call counts differ

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.count_changes

    def explain(self) -> str:
        head = f"{self.a} vs {self.b} (only {self.axis} differs)"
        lines = [f"{head}: {'orthogonal' if self.ok else 'NOT orthogonal'}"]
        name = {"a": self.a, "b": self.b}
        if self.unexplained:
            lines.append(f"  ops that ran on one side only and no {self.axis} pattern explains:")
            lines += [f"    + {o.name} only in {name[o.side]} ({o.calls} calls, {o.share * 100:.2f}% of op time)" for o in self.unexplained]
        if self.count_changes:
            lines.append("  kernels of other axes that ran a different number of times:")
            lines += [f"    ~ {c}" for c in self.count_changes]
        if self.explained:
            lines.append(f"  explained by {self.axis} patterns:")
            lines += [f"    = {o.name} only in {name[o.side]}: {o.explained_by}" for o in self.explained]
        if self.below_threshold:
            lines.append("  one-sided but below the share threshold: " + ", ".join(f"{o.name} ({name[o.side]})" for o in self.below_threshold))
        if self.ignored:
            lines.append("  ignored (listed in the matrix data): " + ", ".join(sorted({n for n, _ in self.ignored})))
        return "\n".join(lines)


def _axis_patterns(exp: KernelExpectation, axis: str, value: str, kind: str) -> list[str]:
    pats = exp.must if kind == "must" else exp.must_not
    tag = f"{axis}={value}"
    return [p for p in pats if tag in exp.source.get(p, [])]


def orthogonality_diff(
    a_name: str, a_cfg: Config, a_sum: KernelSummary, a_exp: KernelExpectation,
    b_name: str, b_cfg: Config, b_sum: KernelSummary, b_exp: KernelExpectation,
    rules: OrthogonalityRules,
) -> OrthogonalityDiff:
    diff_axes = [axis for (axis, va), (_, vb) in zip(a_cfg.axes, b_cfg.axes) if va != vb]
    if len(diff_axes) != 1:
        raise SuiteError(f"{a_name} and {b_name} differ in {diff_axes or 'no axis'}, not in exactly one")
    axis = diff_axes[0]
    va, vb = a_cfg[axis], b_cfg[axis]
    sides = {"a": ({k.name: k for k in a_sum.kernels}, a_exp, va, b_exp, vb),
             "b": ({k.name: k for k in b_sum.kernels}, b_exp, vb, a_exp, va)}
    ops_a, ops_b = sides["a"][0], sides["b"][0]
    explained, unexplained, below, ignored = [], [], [], []
    for side, other in (("a", ops_b), ("b", ops_a)):
        ops, exp, value, other_exp, other_value = sides[side]
        own_must = _axis_patterns(exp, axis, value, "must")
        other_forbids = _axis_patterns(other_exp, axis, other_value, "must_not")
        for name in sorted(set(ops) - set(other), key=lambda n: -ops[n].share):
            stat = ops[name]
            change = OpChange(name, side, stat.share, stat.calls)
            why = next((f"{p} ({axis}={value} must)" for p in own_must if fnmatch.fnmatchcase(name, p)), "")
            why = why or next((f"{p} ({axis}={other_value} must_not)" for p in other_forbids if fnmatch.fnmatchcase(name, p)), "")
            reason = next((r for g, r in rules.ignore.items() if fnmatch.fnmatchcase(name, g)), None)
            if why:
                change.explained_by = why
                explained.append(change)
            elif reason is not None:
                ignored.append((name, reason))
            elif stat.share < rules.min_share:
                below.append(change)
            else:
                unexplained.append(change)
    # kernels the other axes require must run equally often on both sides
    count_changes = []
    anchors = {p for p in a_exp.must if not any(s.startswith(f"{axis}=") for s in a_exp.source.get(p, []))}
    anchors &= {p for p in b_exp.must if not any(s.startswith(f"{axis}=") for s in b_exp.source.get(p, []))}
    for pat in sorted(anchors):
        ca = sum(k.calls for k in a_sum.matching(pat))
        cb = sum(k.calls for k in b_sum.matching(pat))
        if max(ca, cb) == 0:
            continue  # missing on both sides: the level 1.5 path check of each side reports it
        rel = abs(ca - cb) / max(ca, cb)
        if rel > rules.anchor_tolerance:
            src = ", ".join(a_exp.source.get(pat, []))
            count_changes.append(f"{pat} ({src}): {ca} calls in {a_name} vs {cb} in {b_name} "
                                 f"({rel * 100:.1f}% apart; tolerance {rules.anchor_tolerance * 100:.0f}%)")
    return OrthogonalityDiff(a_name, b_name, axis, explained, unexplained, below, ignored, count_changes)


# -- running in parallel ------------------------------------------------------------------------
