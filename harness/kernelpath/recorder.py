"""Platform bring-up: record which kernels a configuration really runs, and compare with the data.

`scripts/record_kernels.py` boots a config, profiles it exactly like level 1.5
(`harness.kernelpath.check.profile_kernel_path`) and hands the kernel summary here, where
- kernel names are normalised into **families** (`void `, template arguments, argument lists, hashes and
  numeric suffixes stripped, tile shapes such as `64x128` turned into `*`);
- the config's declared expectation (its flavour's `must` / `must_not`, sibling backends included) is
  compared with what ran: declared patterns that matched nothing, forbidden ones that ran, observed
  families no declared pattern covers;
- with a sibling run (a config differing in one or more axes), the families only one side ran are
  attributed to the varied axes;
- a **proposed** expectation is written next to the declared one.

Accepting (`--accept`, after a person reviewed the report) records, per axis value of the config whose
entry declares `must` patterns on this platform, `verified: <device, vLLM version, date>`, the real kernel
names those patterns matched (`seen`) and the patterns that were verified, in `configs/verified/<flavour>.yaml`.
The catalog merges that file over the hand-written flavour (harness.config.catalog), which is never rewritten; a
recorded entry whose patterns have since changed no longer counts as verified.
"""
from __future__ import annotations

import fnmatch
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.config.catalog import (
    Catalog,
    Config,
    Flavour,
    KernelExpectation,
    entry_rules,
    load_verified,
)
from harness.core.errors import SuiteError
from harness.kernelpath.traces import KernelStat, KernelSummary, PathVerdict, check_path

# families below this share of the profiled time are listed but never proposed as `must`
PROPOSE_MIN_SHARE = 0.001
PROPOSE_MAX = 4  # new `must` patterns proposed per varied axis value (one family each)

_TEMPLATE = re.compile(r"<[^<>]*>")
_DIMS = re.compile(r"(?<![A-Za-z0-9])\d+(?:x\d+)+(?![A-Za-z0-9])")
_TRAILING_NUM = re.compile(r"(?:_\d+|_0x[0-9a-fA-F]+|_[0-9a-fA-F]{8,})+$")


# Launchers whose own name says nothing: the family is the launcher plus the first meaningful type of
# its template arguments (FA3 and CUTLASS GEMMs are all `cutlass::device_kernel<...>`).
GENERIC_LAUNCHERS = {"cutlass::device_kernel", "cutlass::Kernel", "cutlass::Kernel2",
                     "at::native::elementwise_kernel", "at::native::vectorized_elementwise_kernel",
                     "at::native::unrolled_elementwise_kernel", "at::native::anon::elementwise_kernel"}
_WRAPPERS = {"flash::enable_sm90_or_later", "flash::enable_sm80_to_sm89", "cutlass::gemm::kernel::GemmUniversal",
             "cute::tuple", "cute::C", "std::array", "c10::BFloat16", "c10::Half", "float", "int", "void", "char",
             "long", "unsigned", "bool", "true", "false", "__nv_bfloat16", "cutlass::bfloat16_t", "at::native::anon"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*")


def family(name: str) -> str:
    """The kernel family of one kernel (or CPU op) name: what a one-family `must` glob should match."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    s = s.replace("(anonymous namespace)", "anon")
    head = s.split("<", 1)[0].split("(", 1)[0].strip()
    if head in GENERIC_LAUNCHERS and "<" in s:
        inner = s[len(head):]
        for ident in _IDENT.findall(inner):
            if ident not in _WRAPPERS and not ident.startswith("cute::"):
                return f"{head}<{ident}>"
    for _ in range(50):  # innermost template argument lists first, until none is left
        s, n = _TEMPLATE.subn("", s)
        if not n:
            break
    if "(" in s:
        s = s[: s.index("(")]
    s = s.strip()
    s = _DIMS.sub("*", s)
    s = _TRAILING_NUM.sub("", s)
    return s or name


def family_pattern(fam: str, example: str) -> str:
    """A glob naming one family: the name itself when normalising changed nothing, else `*family*`
    (`*launcher<*type*` for a generic launcher's family)."""
    if fam == example:
        return fam
    if fam.endswith(">") and "<" in fam:
        launcher, ident = fam[:-1].split("<", 1)
        return f"*{launcher}<*{ident}*"
    return f"*{fam}*"


@dataclass
class Family:
    name: str
    share: float
    calls: int
    kernels: list[KernelStat] = field(default_factory=list)

    @property
    def example(self) -> str:
        return self.kernels[0].name


def families(summary: KernelSummary) -> list[Family]:
    out: dict[str, Family] = {}
    for k in summary.kernels:
        f = out.setdefault(family(k.name), Family(family(k.name), 0.0, 0))
        f.share += k.share
        f.calls += k.calls
        f.kernels.append(k)
    return sorted(out.values(), key=lambda f: -f.share)


# -- the comparison ---------------------------------------------------------------------------------
@dataclass
class EntryCheck:
    """One axis value's kernel entry on this platform, against the trace."""

    tag: str  # "moe=marlin"
    axis: str
    value: str
    selector: str
    verified: str  # the flavour's current status
    must: list[str]
    matched: dict[str, list[str]]  # must pattern -> real kernel names it matched
    missing: list[str]  # must patterns that matched nothing
    rules: dict = field(default_factory=dict)  # the entry's other verdict-deciding keys (catalog.entry_rules)


@dataclass
class Recording:
    config: str
    flavour: str
    platform: str
    device: str
    vllm: str
    date: str
    summary: KernelSummary
    expectation: KernelExpectation
    verdict: PathVerdict
    families: list[Family]
    entries: list[EntryCheck]
    uncovered: list[Family]  # observed families no declared pattern (must or must_not) covers
    sibling: "SiblingDiff | None" = None
    artifact: str = ""

    @property
    def device_line(self) -> str:
        return f"{self.device} ({self.platform}), vLLM {self.vllm}, {self.date}"

    def can_accept(self) -> tuple[bool, str]:
        if not self.entries:
            return False, (f"{self.config} declares no `must` kernels for {self.platform} in flavour {self.flavour}: "
                           "nothing to verify; add patterns (see the proposal) to configs/flavours/"
                           f"{self.flavour}.yaml first")
        if not self.verdict.ok:
            return False, ("the declared expectation fails on this trace (" + "; ".join(self.verdict.problems[:3]) +
                           f"); fix the patterns in configs/flavours/{self.flavour}.yaml (see the proposal), then record again")
        if self.verdict.excused:
            return False, ("the kernel path passed only by logged fallbacks' excuses ("
                           + "; ".join(self.verdict.excused) + "): a run that fell back cannot verify its patterns")
        s = self.sibling
        if s and s.tellable and s.here_passes_there:
            # the traces differ, yet this config's patterns pass on its sibling's: level 1.5 could not see the config
            # fall back to the sibling's path, and recording them as verified would vouch for nothing. (Traces with
            # the same families are no fault of the patterns: the varied axis changed no kernel on this platform,
            # which the report says. Loose patterns of the sibling are judged when the sibling is recorded.)
            return False, (f"the traces of {self.config} and its sibling {s.name} differ, but {self.config}'s declared "
                           f"patterns pass on {s.name}'s trace too, so they cannot tell them apart; add the patterns the "
                           f"report proposes for the varied axis to configs/flavours/{self.flavour}.yaml, then record again")
        return True, ""


@dataclass
class SiblingDiff:
    name: str
    axes: dict[str, tuple[str, str]]  # axis -> (this config's value, the sibling's)
    only_here: list[Family]
    only_there: list[Family]
    sibling_passes_here: bool  # the sibling's declared expectation passes on this config's trace (bad)
    here_passes_there: bool  # this config's declared expectation passes on the sibling's trace (bad)

    @property
    def tellable(self) -> bool:
        """Whether the traces differ: a family at or above PROPOSE_MIN_SHARE of its run's time on one side only."""
        return any(f.share >= PROPOSE_MIN_SHARE for f in self.only_here + self.only_there)


def _matches(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)


def compare(catalog: Catalog, flavour: Flavour, config: Config, platform: str, device: str, vllm: str,
            summary: KernelSummary, expectation: KernelExpectation, server_log: str = "",
            date: str | None = None) -> Recording:
    """The declared expectation of `config` against its trace."""
    verdict = check_path(summary, expectation, server_log)
    entries = []
    for axis, value in config.axes:
        for selector, exp in flavour.kernel_entries(axis, value, platform):
            must = [str(p) for p in exp.get("must") or []]
            if not must:
                continue
            matched = {p: [k.name for k in summary.matching(p)] for p in must}
            entries.append(EntryCheck(f"{axis}={value}", axis, value, str(selector),
                                      expectation.verification.get(f"{axis}={value}", "unverified"), must,
                                      matched, [p for p in must if not matched[p]], entry_rules(exp)))
    fams = families(summary)
    declared = expectation.must + expectation.must_not
    uncovered = [f for f in fams if not any(_matches(p, k.name) for p in declared for k in f.kernels)]
    return Recording(catalog.name(config), flavour.name, platform, device, vllm, date or time.strftime("%Y-%m-%d"),
                     summary, expectation, verdict, fams, entries, uncovered)


def diff_sibling(rec: Recording, config: Config, sibling_name: str, sibling: Config, sibling_summary: KernelSummary,
                 sibling_expectation: KernelExpectation) -> SiblingDiff:
    axes = {a: (v, sibling[a]) for a, v in config.axes if sibling[a] != v}
    here = {f.name: f for f in rec.families}
    there = {f.name: f for f in families(sibling_summary)}
    diff = SiblingDiff(sibling_name, axes, [f for n, f in here.items() if n not in there],
                       [f for n, f in there.items() if n not in here],
                       # an empty expectation accepts any trace: the two are then indistinguishable, as it says
                       check_path(rec.summary, sibling_expectation, declared=False).ok,
                       check_path(sibling_summary, rec.expectation, declared=False).ok)
    rec.sibling = diff
    return diff


def proposal(rec: Recording) -> dict[str, dict]:
    """Per axis value (`axis=value`): a proposed `must` (declared patterns that matched, plus one glob per
    family only this config ran when a sibling varies that axis) and `must_not` (the sibling's own families)."""
    out: dict[str, dict] = {}
    for e in rec.entries:
        out[e.tag] = {"selector": e.selector, "must": [p for p in e.must if e.matched[p]],
                      "drop": list(e.missing), "seen": sorted({n for p in e.must for n in e.matched[p]})}
    if rec.sibling and len(rec.sibling.axes) == 1:
        (axis, (mine, _)), = rec.sibling.axes.items()
        tag = f"{axis}={mine}"
        entry = out.setdefault(tag, {"selector": rec.platform, "must": [], "drop": [], "seen": []})
        covered = entry["must"]
        new = [f for f in rec.sibling.only_here if f.share >= PROPOSE_MIN_SHARE
               and not any(_matches(p, k.name) for p in covered for k in f.kernels)][:PROPOSE_MAX]
        entry["must"] += [family_pattern(f.name, f.example) for f in new]
        entry["seen"] = sorted(set(entry["seen"]) | {f.example for f in new})
        forbid = [f for f in rec.sibling.only_there if f.share >= PROPOSE_MIN_SHARE][:PROPOSE_MAX]
        entry["must_not"] = [family_pattern(f.name, f.example) for f in forbid]
    return out


# -- the report -------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{x * 100:.2f}%"


def report(rec: Recording, verified_file: Path | None = None, top: int = 40) -> str:
    lines = [f"# Kernel recording: {rec.config} on {rec.device_line}, flavour {rec.flavour}", ""]
    if rec.artifact:
        lines.append(f"kernel summary: {rec.artifact}")
    status = "PASS" if rec.verdict.ok else "FAIL"
    lines.append(f"level 1.5 check of the declared expectation on this trace: **{status}**")
    lines += [f"- {p}" for p in rec.verdict.problems] + [f"- excused: {x}" for x in rec.verdict.excused]
    lines += ["", f"## Observed kernel families ({len(rec.families)}; top {min(top, len(rec.families))} by time)", "",
              "| family | share | calls | kernels | example |", "|---|---:|---:|---:|---|"]
    for f in rec.families[:top]:
        lines.append(f"| `{f.name}` | {_pct(f.share)} | {f.calls} | {len(f.kernels)} | `{f.example[:110]}` |")
    lines += ["", "## Declared expectation vs the trace", ""]
    if not rec.entries:
        lines.append(f"- {rec.config} declares no `must` kernels for {rec.platform} in flavour {rec.flavour}")
    for e in rec.entries:
        lines.append(f"- {e.tag} [{e.selector}] ({e.verified})")
        for p in e.must:
            hits = e.matched[p]
            lines.append(f"  - must `{p}`: " + (f"{len(hits)} kernel(s), {family(hits[0])}" if hits else "**matched nothing**"))
    lines.append("")
    lines.append("declared patterns that matched nothing: " + (", ".join(f"`{p}`" for e in rec.entries for p in e.missing) or "none"))
    forbidden = [p for p in rec.verdict.problems if p.startswith("forbidden")]
    lines.append("forbidden patterns that ran: " + ("; ".join(forbidden) or "none"))
    unc = [f for f in rec.uncovered if f.share >= PROPOSE_MIN_SHARE]
    lines.append(f"observed families no declared pattern covers (share >= {_pct(PROPOSE_MIN_SHARE)}): "
                 + (", ".join(f"`{f.name}` ({_pct(f.share)})" for f in unc) or "none"))
    if rec.sibling:
        s = rec.sibling
        varied = ", ".join(f"{a}: {mine} here, {theirs} in {s.name}" for a, (mine, theirs) in s.axes.items())
        lines += ["", f"## Against the sibling {s.name} ({varied or 'no axis differs'})", ""]
        lines.append(f"families only in {rec.config} (belong to " + ", ".join(f"{a}={m}" for a, (m, _) in s.axes.items()) + "): "
                     + (", ".join(f"`{f.name}` ({_pct(f.share)})" for f in s.only_here) or "none"))
        lines.append(f"families only in {s.name} (belong to " + ", ".join(f"{a}={t}" for a, (_, t) in s.axes.items()) + "): "
                     + (", ".join(f"`{f.name}` ({_pct(f.share)})" for f in s.only_there) or "none"))
        passes = "PASSES (the patterns cannot tell the traces apart)" if s.tellable else \
            "passes (the two runs launched the same kernel families: the varied axis changed no kernel here)"
        lines.append(f"{s.name}'s declared expectation on this trace: " + (passes if s.sibling_passes_here else "fails, as it must"))
        lines.append(f"{rec.config}'s declared expectation on {s.name}'s trace: " + (passes if s.here_passes_there else "fails, as it must"))
    lines += ["", "## Proposed expectation (next to the declared one)", "", "```yaml"]
    for tag, p in proposal(rec).items():
        axis, value = tag.split("=", 1)
        declared = next((e.must for e in rec.entries if e.tag == tag), [])
        block = {"must": p["must"], **({"must_not": p["must_not"]} if p.get("must_not") else {}), "seen": p["seen"]}
        lines.append(f"# values.{axis}.{value!r}.kernels.{p['selector']}   declared must: {declared}"
                     + (f"; drop (matched nothing): {p['drop']}" if p["drop"] else ""))
        lines.append(yaml.safe_dump({p["selector"]: block}, sort_keys=False, width=200).rstrip())
    lines += ["```", ""]
    ok, why = rec.can_accept()
    target = verified_file or Path(f"configs/verified/{rec.flavour}.yaml")
    if ok:
        # the trace reviewed, not a new one: without --from-summaries the same command boots both servers again
        run = str(Path(rec.artifact).parent) if rec.artifact else "<this recording's run folder>"
        lines.append(f"To accept (after review): the same command with `--from-summaries {run} --accept` (this trace; "
                     f"without `--from-summaries` it boots again and accepts a trace nobody reviewed) records "
                     f"`verified: {rec.device_line}` and the matched names as `seen` for "
                     f"{', '.join(e.tag for e in rec.entries)} in {target}.")
    else:
        lines.append(f"Cannot be accepted yet: {why}.")
    return "\n".join(lines) + "\n"


# -- accepting --------------------------------------------------------------------------------------
def verified_entry(verified: str, must: list[str], rules: dict, seen: list[str], config: str) -> dict:
    """One recorded entry of configs/verified/<flavour>.yaml: the trace it came from (`verified`), the `must`
    patterns and other rules it was checked against (the catalog counts it only while the flavour's still equal
    them), the kernel names they matched, and the config that ran."""
    return {"verified": verified, "patterns": list(must), "rules": rules, "seen": list(seen), "config": config}


def accept(rec: Recording, verified_file: Path) -> dict:
    """Record the verification of every checked entry in `verified_file` (created or merged)."""
    ok, why = rec.can_accept()
    if not ok:
        raise SuiteError(f"--accept refused: {why}")
    data = load_verified(verified_file) if verified_file.is_file() else {}
    data.setdefault("values", {})
    for e in rec.entries:
        slot = data["values"].setdefault(e.axis, {}).setdefault(e.value, {}).setdefault("kernels", {})
        slot[e.selector] = verified_entry(rec.device_line, e.must, e.rules,
                                          sorted({n for p in e.must for n in e.matched[p]}), rec.config)
    verified_file.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Kernel expectations verified on real traces, written by scripts/record_kernels.py --accept.\n"
              f"# The catalog merges this file over configs/flavours/{rec.flavour}.yaml (never edited by the recorder):\n"
              "# an entry counts as verified only while the flavour's `must` patterns equal `patterns` here, and its\n"
              "# must_not / also_runs / excuses / allow_excused equal `rules`.\n")
    verified_file.write_text(header + yaml.safe_dump(data, sort_keys=False, width=200))
    return data
