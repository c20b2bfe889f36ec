"""Level 6: which configuration combinations to run, and whether one axis changes only its own kernels.

Combinations come from data (`tests/level6_matrix/matrix.yaml`): per platform, a base configuration
and the axes (and values) to vary around it. The full product is used while it is small; otherwise a
pairwise covering set, seeded with the base and its one-factor-at-a-time neighbours. Every varied value
that runs gets a partner that differs from it in exactly one axis (the orthogonality check needs such
pairs): where the base's neighbour in that axis is excluded, another runnable pair is added; where
none exists, the plan lists the value as unpaired with the reasons (`Plan.unpaired`, in its report).
Combinations the flavour cannot run (`Flavour.runnable`) are excluded, each with its reason.

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

from harness.config.catalog import Catalog, Config, Flavour, KernelExpectation
from harness.core.errors import SuiteError
from harness.core.paths import REPO
from harness.core.platform import best_selector, is_valid_selector
from harness.core.yamlfile import load_mapping
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


# the keys each part of the file may have: a misspelled optional key (`nuetral:`) would otherwise be ignored silently
PLATFORM_KEYS = ("base", "vary", "max_full", "neutral", "why")
ORTHOGONALITY_KEYS = ("min_share", "anchor_tolerance", "ignore")
TOP_KEYS = ("platforms", "orthogonality")
# YAML 1.1 reads unquoted on/off/yes/no as booleans: axis values such as graphs' "on"/"off" must be quoted
QUOTE_HINT = 'YAML read an unquoted on/off/yes/no as a boolean: quote the value ("on", "off")'


def load_matrix(path: Path = MATRIX_FILE) -> MatrixData:
    """Read and validate the matrix file: every shape or type problem is one SuiteError naming the file and the key."""
    # the suite's one YAML reader: binary junk was a UnicodeDecodeError traceback at collection, a repeated key silent
    raw = load_mapping(path)
    if not isinstance(raw.get("platforms"), dict):
        raise SuiteError(f"{path}: needs a `platforms:` mapping of platform selector -> matrix")
    _known_keys(raw, TOP_KEYS, f"{path}")
    platforms = [_platform_matrix(selector, spec, f"{path}: platforms.{selector}") for selector, spec in raw["platforms"].items()]
    rules = _orthogonality_rules(raw.get("orthogonality"), f"{path}: orthogonality")
    return MatrixData(platforms, rules, path)


def _platform_matrix(selector: object, spec: object, where: str) -> PlatformMatrix:
    if not is_valid_selector(str(selector)):
        raise SuiteError(f"{where}: '{selector}' is not a platform selector (cpu, sm_90, sm_12x, >=sm_80)")
    if not isinstance(spec, dict) or "base" not in spec or not spec.get("vary"):
        raise SuiteError(f"{where}: needs `base:` (a config name) and `vary:` (axis: [values] or axis: all)")
    _known_keys(spec, PLATFORM_KEYS, where)
    return PlatformMatrix(
        str(selector),
        _text(spec["base"], f"{where}.base", "a config name, e.g. `base: marlin-bf16`"),
        _vary(spec["vary"], f"{where}.vary"),
        _whole_number(spec.get("max_full", 8), f"{where}.max_full", 1, "max_full: 8"),
        _names(spec.get("neutral"), f"{where}.neutral", "write a list of axis names, e.g. `neutral: [graphs]`"),
        _text(spec.get("why", ""), f"{where}.why", "a sentence", may_be_empty=True).strip(),
    )


def _vary(raw: object, where: str) -> dict[str, list[str] | None]:
    """`vary:` as a list of axes (each with all its values) or a mapping axis -> [values] | all."""
    fix = "write `vary: [axis, ...]` or `vary: {axis: [values], axis: all}`"
    if isinstance(raw, list):
        return {a: None for a in _names(raw, where, fix)}
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: {_shown(raw)} is neither a list of axes nor a mapping axis -> values; {fix}")
    vary: dict[str, list[str] | None] = {}
    for axis, values in raw.items():
        axis = _text(axis, f"{where}: axis {axis!r}", "an axis name")
        if values is None or values == "all":
            vary[axis] = None
        elif isinstance(values, list):
            vary[axis] = _names(values, f"{where}.{axis}", f"write a list of {axis} values or `all`")
        else:
            raise SuiteError(f"{where}.{axis}: {_shown(values)} is not a list of values or `all`; "
                             + (QUOTE_HINT + f' in a list, e.g. `{axis}: ["on", "off"]`' if isinstance(values, bool)
                                else f"write `{axis}: [{values}]` or `{axis}: all`"))
    return vary


def _orthogonality_rules(raw: object, where: str) -> OrthogonalityRules:
    if raw is None:
        return OrthogonalityRules()
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: {_shown(raw)} is not a mapping; write `orthogonality: {{min_share: 0.002, "
                         f"anchor_tolerance: 0.15, ignore: {{glob: why}}}}`")
    _known_keys(raw, ORTHOGONALITY_KEYS, where)
    ignore = raw.get("ignore") or {}
    if not isinstance(ignore, dict):
        raise SuiteError(f"{where}.ignore: {_shown(ignore)} is not a mapping; write `ignore: {{\"op glob\": why it may differ}}`")
    return OrthogonalityRules(
        _fraction(raw.get("min_share", 0.0), f"{where}.min_share", "min_share: 0.002"),
        {_text(g, f"{where}.ignore: glob {g!r}", "an op glob"): _text(why, f"{where}.ignore.{g}", "why the op may differ")
         for g, why in ignore.items()},
        _fraction(raw.get("anchor_tolerance", 0.0), f"{where}.anchor_tolerance", "anchor_tolerance: 0.15"),
    )


# -- value checks: each names the key and the fix in one line --------------------------------------
def _shown(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _known_keys(raw: dict, known: tuple[str, ...], where: str) -> None:
    unknown = [str(k) for k in raw if k not in known]
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {', '.join(unknown)}; the known ones are {', '.join(known)}")


def _text(value: object, where: str, what: str, may_be_empty: bool = False) -> str:
    if isinstance(value, bool):
        raise SuiteError(f"{where}: {_shown(value)} is not {what}; {QUOTE_HINT}")
    if not isinstance(value, str) or not (value.strip() or may_be_empty):
        raise SuiteError(f"{where}: {_shown(value)} is not {what}")
    return value


def _names(raw: object, where: str, fix: str) -> list[str]:
    """A list of strings (axis names or values); None is the empty list."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SuiteError(f"{where}: {_shown(raw)} is not a list; {fix}")
    bools = [v for v in raw if isinstance(v, bool)]
    if bools:
        raise SuiteError(f"{where}: {bools} are booleans, not names; {QUOTE_HINT}")
    bad = [v for v in raw if not isinstance(v, (str, int))]  # an int such as a tile size is a name too
    if bad:
        raise SuiteError(f"{where}: {bad} are not names; {fix}")
    return [str(v) for v in raw]


def _whole_number(value: object, where: str, minimum: int, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SuiteError(f"{where}: {_shown(value)} is not a whole number >= {minimum}; write e.g. `{example}`")
    return value


def _fraction(value: object, where: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise SuiteError(f"{where}: {_shown(value)} is not a number from 0 to 1; write e.g. `{example}`")
    return float(value)


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
    # (axis, value, why) of varied values that run but are in no one-axis pair: their orthogonality is unchecked
    unpaired: list[tuple[str, str, str]] = field(default_factory=list)

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
        lines += ["", f"## values in no one-axis pair: their orthogonality is unchecked ({len(self.unpaired)})"]
        lines += [f"- {axis}={value}: {why}" for axis, value, why in self.unpaired] or [
            "- none: every varied value that runs has a partner differing from it in that axis alone"]
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
    runnable, excluded, why_not = [], [], {}
    for cfg in grid:
        ok, why = flavour.runnable(cfg, platform_name, model)
        (runnable if ok else excluded).append(cfg if ok else (catalog.name(cfg), why))
        if not ok:  # without the config's name in front: an unpaired value's reasons name several configs' rules
            why_not[cfg] = why.removeprefix(f"{catalog.name(cfg)}: ")

    def combo(cfg: Config) -> Combo:
        return Combo(catalog.name(cfg), cfg, {a: cfg[a] for a in axes if cfg[a] != base_cfg[a]})

    if len(grid) <= spec.max_full:  # every runnable combination: no partner to add, only the unpaired to name
        chosen, unpaired = partner_every_value(runnable, list(axes), runnable, grid, why_not)
        strategy, uncovered = "full", []
    else:
        chosen, uncovered, unpaired = pairwise(base_cfg, list(axes), runnable, grid, why_not)
        strategy = "pairwise"
    order = list(axes)

    def key(cfg: Config) -> tuple:  # the base, then one-axis neighbours in `vary` order, ...
        differs = combo(cfg).differs
        return len(differs), [order.index(a) for a in differs], [axes[a].index(v) for a, v in differs.items()]

    chosen = sorted(chosen, key=key)
    return Plan(platform_name, flavour.name, combo(base_cfg), axes, strategy, [combo(c) for c in chosen],
                excluded, uncovered, spec.why, len(grid), list(spec.neutral), unpaired)


def _pairs_of(cfg: Config, axes: list[str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return {((a, cfg[a]), (b, cfg[b])) for a, b in itertools.combinations(axes, 2)}


def pairwise(base: Config, axes: list[str], runnable: list[Config], grid: list[Config],
             why_not: dict[Config, str]) -> tuple[list[Config], list[str], list[tuple[str, str, str]]]:
    """A greedy all-pairs covering set of `runnable`, seeded with `base` and its one-axis neighbours, then
    completed so that every value it runs has a one-axis partner (`partner_every_value`).

    Returns (chosen, uncovered, unpaired): `uncovered` names the value pairs that only excluded combinations
    of the grid have (so no runnable combination can cover them); `unpaired` the values no runnable pair
    can check, with why (`why_not`: the reason each excluded combination of the grid is excluded)."""
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
    chosen, unpaired = partner_every_value(chosen, axes, runnable, grid, why_not)
    return chosen, uncovered, unpaired


def partner_every_value(chosen: list[Config], axes: list[str], runnable: list[Config], grid: list[Config],
                        why_not: dict[Config, str]) -> tuple[list[Config], list[tuple[str, str, str]]]:
    """`chosen` plus, for every varied value it runs without a one-axis partner, the cheapest runnable pair
    that gives it one; and the values no runnable pair can give one, as (axis, value, why).

    The seed pairs each value with the base's neighbour in its axis; when that neighbour is excluded, the
    covering set pairs the value only by chance, so it could run in the plan while no orthogonality pair ever
    judged it. Cheapest: a partner of a chosen combination (one boot more) before two new ones. Where every
    one-axis neighbour is excluded (upstream's moe=gemm needs activation=mxfp8, which needs moe=gemm), the
    value stays in the plan (its own checks still run) and is named with the exclusions' reasons."""
    chosen, unpaired = list(chosen), {}
    added = True
    while added:  # an added pair may bring values of other axes with it: look again until nothing changes
        added = False
        for axis in axes:
            for value in dict.fromkeys(c[axis] for c in chosen):
                if (axis, value) in unpaired or _has_partner(chosen, axis, value):
                    continue
                pair = _cheapest_pair(chosen, runnable, axis, value)
                if pair is None:
                    unpaired[(axis, value)] = _why_no_partner(runnable, grid, axis, value, why_not)
                    continue
                chosen += [c for c in pair if c not in chosen]
                added = True
    return chosen, [(axis, value, why) for (axis, value), why in unpaired.items()]


def _differ_only_in(a: Config, b: Config, axis: str) -> bool:
    return a[axis] != b[axis] and all(va == vb for (x, va), (_, vb) in zip(a.axes, b.axes) if x != axis)


def _has_partner(chosen: list[Config], axis: str, value: str) -> bool:
    return any(_differ_only_in(a, b, axis) for a in chosen if a[axis] == value for b in chosen)


def _cheapest_pair(chosen: list[Config], runnable: list[Config], axis: str, value: str) -> tuple[Config, Config] | None:
    """Two runnable combinations differing only in `axis`, one of them with `value`, fewest not yet chosen
    (the first such in `runnable`'s order among equals); None when there are none."""
    pairs = [(a, b) for a in runnable if a[axis] == value for b in runnable if _differ_only_in(a, b, axis)]
    return min(pairs, key=lambda p: sum(c not in chosen for c in p)) if pairs else None


def _why_no_partner(runnable: list[Config], grid: list[Config], axis: str, value: str, why_not: dict[Config, str]) -> str:
    """Why no runnable pair varies `axis` at `value`: the distinct reasons its one-axis neighbours are excluded."""
    neighbours = [b for a in runnable if a[axis] == value for b in grid if _differ_only_in(a, b, axis)]
    reasons = list(dict.fromkeys(why_not[b] for b in neighbours if b in why_not))
    if not reasons:
        return f"the matrix varies no other {axis} value"
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    return f"every combination that differs from one with {axis}={value} in {axis} alone is excluded ({shown})"


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
