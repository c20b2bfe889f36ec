"""The review file the users keep per feature (`docs/porting/FEATURE_<name>.md`, their plan's template), written
from a FeatureResult; plus the verdicts as JSON and one comparison matrix over every feature of a run.

The measured sections (hypothesis, success criteria with Baseline / Target / Actual, their evaluation, test
results, benchmark results, where decode time goes, platform and metadata) are regenerated on every run. Every
other section (Source Files Changed, Environment Variables Added, Implementation Notes, Areas for Improvement, and
any section the user adds) is kept exactly as written, byte for byte, in its place.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Sequence

from harness.core import stats
from harness.core.errors import SuiteError
from harness.core.paths import REPO, writable_dir
from harness.features.judge import GIB, CriterionVerdict, Status
from harness.features.run import FeatureResult
from harness.features.spec import load_features, parse_criterion
from harness.kernelpath.breakdown import tokens_note

MEASURED = ("REQUIRED: Hypothesis (1 sentence)", "REQUIRED: Success Criteria (hard numbers)",
            "Success Criteria Evaluation", "Test Results", "Benchmark Results", "Where decode time goes",
            "Platform and metadata")
HAND_WRITTEN = {  # the template's own words, until the user replaces them
    "Source Files Changed": "- `path/to/file.py` - what changed (written by hand)",
    "Environment Variables Added": "- `VAR_NAME` - description, default, options (written by hand)",
    "Implementation Notes": "- Key decisions made\n- Tradeoffs considered\n(written by hand)",
    "REQUIRED: Areas for Improvement": "1. <Specific improvement opportunity> (written by hand)",
}
TEMPLATE_ORDER = ("REQUIRED: Hypothesis (1 sentence)", "REQUIRED: Success Criteria (hard numbers)",
                  "Source Files Changed", "Environment Variables Added", "Implementation Notes",
                  "REQUIRED: Areas for Improvement", "Success Criteria Evaluation", "Test Results",
                  "Benchmark Results", "Where decode time goes", "Platform and metadata")
LEVEL_TITLES = {"level1": "Level 1 (Smoke)", "level1_5": "Level 1.5 (Kernel Validation)", "level2": "Level 2 (Correctness)",
                "level3": "Level 3 (Stress)", "level4": "Level 4 (Benchmark)", "level5": "Level 5 (Regression)"}
_MARK = {Status.PASS: "✅ PASS", Status.FAIL: "❌ FAIL", Status.INCONCLUSIVE: "⚠️ INCONCLUSIVE",
         Status.ERROR: "❌ ERROR", Status.BLOCKED: "⛔ BLOCKED"}


def review_path(name: str, review_dir: Path) -> Path:
    return review_dir / f"FEATURE_{name}.md"


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(preamble, [(heading, section text with its heading line)]); joining them gives `text` back exactly."""
    parts = re.split(r"(?m)^(?=## )", text)
    preamble, sections = parts[0], []
    for part in parts[1:]:
        heading = part.split("\n", 1)[0][3:].strip()
        sections.append((heading, part))
    return preamble, sections


def render(result: FeatureResult, existing: str | None, rel: Path) -> str:
    """The review's text: measured sections from `result`, the others kept from `existing` (or the template)."""
    measured = _measured(result, rel)
    title = f"# Feature: {result.feature.name}\n"
    if existing is None:
        body = [(h, measured[h] if h in measured else f"## {h}\n{HAND_WRITTEN[h]}\n\n") for h in TEMPLATE_ORDER]
        return title + "\n" + "".join(text for _, text in body).rstrip("\n") + "\n"
    preamble, sections = split_sections(existing)
    first, _, rest = preamble.partition("\n")
    out = [title + rest if first.startswith("# ") else title + "\n" + preamble]
    seen = set()
    for heading, text in sections:
        seen.add(heading)
        out.append(_keep_spacing(measured[heading], text) if heading in measured else text)
    for h in (h for h in TEMPLATE_ORDER if h in measured and h not in seen):  # e.g. a section added since
        out[-1] = out[-1] if out[-1].endswith("\n\n") else out[-1].rstrip("\n") + "\n\n"
        out.append(measured[h])
    return "".join(out)


def _keep_spacing(new: str, old: str) -> str:
    """A regenerated section keeps the blank lines the old one ended with (the next section starts unchanged)."""
    trailing = len(old) - len(old.rstrip("\n"))
    return new.rstrip("\n") + "\n" * max(trailing, 1)


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    s = f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"
    return f"{s} {unit}".strip()


def _target(v: CriterionVerdict, c_text: str) -> str:
    return c_text.split(None, 1)[1] if " " in c_text else c_text


def _measured(result: FeatureResult, rel: Path) -> dict[str, str]:
    f = result.feature
    units = {c.metric: (c.unit if not c.relative else "") for c in f.criteria}
    in_gb = {c.metric for c in f.criteria if c.relative and c.unit == "GB"}  # used_memory <= +1 GB: growth in GB
    rows = ["| Metric | Baseline | Target | Actual |", "|--------|----------|--------|--------|"]
    evals = ["| Criterion | Pass/Fail | Notes |", "|-----------|-----------|-------|"]
    for v in result.criteria:
        unit = units.get(v.metric, "")
        if v.metric in in_gb and v.candidate is not None and v.baseline is not None:  # GiB numbers, GB criterion
            unit = "GiB"
            change = f" ({(v.candidate - v.baseline) * GIB / 1e9:+.2f} GB)"
        else:
            change = f" ({(v.ratio - 1) * 100:+.1f}%)" if v.ratio else ""
        actual = _fmt(v.candidate, unit) + change
        rows.append(f"| {v.metric} | {_fmt(v.baseline, unit)} ({f.baseline}) | {_target(v, v.criterion)} | {actual} |")
        evals.append(f"| {v.criterion} | {_MARK[v.status]} | {v.why} |")
    for g in result.gate:
        evals.append(f"| gate for the next phase: {g.criterion} | {_MARK[g.status]} | {g.why} |")
    levels = []
    for lv in ("level1", "level1_5", "level2", "level3", "level4", "level5"):
        o = result.levels.get(lv)
        if o is None:
            continue
        detail = f" ({o.passed} passed, {o.failed} failed, {o.skipped} skipped)" + (
            f": {o.skip_reason}" if o.status == "NOT RUN" and o.skip_reason else "")
        levels.append(f"- {LEVEL_TITLES[lv]}: {o.status}{detail}"
                      + "".join(f"\n  - {x}" for x in o.first_failures))
    if not levels:
        levels.append("- no level required by the feature" if result.status is not Status.BLOCKED
                      else f"- not run: blocked by {result.blocked_by}")
    verdict = f"**Verdict: {_MARK[result.status]}**" + (f" (blocked by {result.blocked_by})" if result.blocked_by else "")
    bench = [f"Measured {result.order}, {result.rounds} rounds per side; samples and per-boot numbers: "
             f"`{_shown(Path(result.artifacts))}/samples.json`, verdicts: `{_shown(Path(result.artifacts))}/verdict.json`.",
             "", "| config | role | " + " | ".join(v.metric for v in result.criteria) + " |",
             "|---|---|" + "---|" * len(result.criteria)]
    for side in result.sides:
        cells = []
        for v in result.criteria:
            vals = side.value(v.metric)
            cells.append(_fmt(stats.median(vals)) + f" (n={len(vals)})" if vals else "n/a")
        bench.append(f"| {side.config} | {side.role} | " + " | ".join(cells) + " |")
    out = {
        "REQUIRED: Hypothesis (1 sentence)": f"## REQUIRED: Hypothesis (1 sentence)\n\"{f.hypothesis}\"\n\n"
                                             + (f"Phase {f.phase}. " if f.phase else "")
                                             + f"Candidate `{f.candidate}` against baseline `{f.baseline}` "
                                             f"(flavour {f.flavour}).{' ' + f.about if f.about else ''}\n\n",
        "REQUIRED: Success Criteria (hard numbers)": "## REQUIRED: Success Criteria (hard numbers)\n" + "\n".join(rows)
                                                     + "\n\n",
        "Success Criteria Evaluation": "## Success Criteria Evaluation\n" + verdict + "\n\n" + "\n".join(evals) + "\n\n"
                                       + "PASS: the 95% CI of the candidate/baseline ratio clears the target; FAIL: it lies "
                                       "on the wrong side; INCONCLUSIVE: it straddles the target (a failure with "
                                       "--strict-verdicts); memory from vLLM's own accounting, strict.\n\n",
        "Test Results": "## Test Results\n" + "\n".join(levels) + "\n\n",
        "Benchmark Results": "## Benchmark Results\n" + "\n".join(bench) + "\n\n",
        "Where decode time goes": "## Where decode time goes\n" + _breakdown(result, rel) + "\n\n",
        "Platform and metadata": "## Platform and metadata\n" + "\n".join([
            f"- platform: {result.platform} ({result.device}); flavour {result.flavour}; model {result.model}",
            f"- verdicts {'strict (INCONCLUSIVE fails)' if result.strict else 'INCONCLUSIVE is a warning'}; "
            f"run took {result.seconds:.0f} s",
            f"- artifacts: `{_shown(Path(result.artifacts))}` (levels/junit.xml and pytest.log of the candidate's "
            f"levels, samples.json, verdict.json, server logs under the run's servers/)"]
            + [f"- note: {n}" for n in result.notes]) + "\n\n",
    }
    return out


def _breakdown(result: FeatureResult, rel: Path) -> str:
    if not result.breakdown:
        return "Not measured in this run (no profiled decode window)."
    lines = ["Kernel time per generated token at batch 1 in a profiled decode window, by category (categories from the "
             "flavours' kernel families); **GPU busy** = the window's busy time per token (the union of kernel intervals, "
             "overlapping kernels counted once) over the decode step of the unprofiled rounds (1 / tg, engine clock); "
             "the profiled window's own busy share (union of kernel intervals over its wall "
             "time) also holds the profiler's host cost between steps; **waiting for the host** = the window's GPU idle "
             "between kernels of different host launches (graph replays, eager kernels), per token; kernel launches per "
             "token.", "",
             "| config | " + " | ".join(("moe", "dense", "attention", "other")) + " | kernels us/token | step us "
             "(unprofiled) | GPU busy | busy in the profiled window | waiting for the host us/token | launches/token |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for config, b in result.breakdown.items():
        if not b:
            lines.append(f"| {config} | n/a | | | | | | | | | |")
            continue
        cat = b.get("us_per_token", {})
        busy = b.get("busy_fraction_unprofiled")
        lines.append(f"| {config} | " + " | ".join(_fmt(cat.get(k)) for k in ("moe", "dense", "attention", "other"))
                     + f" | {_fmt(b.get('total_us_per_token'))} | {_fmt(b.get('step_us_unprofiled'))} | "
                     f"{_fmt(busy * 100) + '%' if busy is not None else 'n/a'} | "
                     f"{_fmt((b.get('busy_fraction') or 0) * 100)}% | {_fmt(b.get('host_wait_us_per_token'))} | "
                     f"{_fmt(b.get('launches_per_token'))} |")
    for config, b in result.breakdown.items():
        note = tokens_note(b) if b else None
        if note:
            lines += ["", f"{config}: {note}."]
        top = (b or {}).get("top") or []
        if top:
            lines += ["", f"Top kernels, {config}:", ""]
            lines += [f"- {t.get('name', '')[:100]} ({t.get('category', '')}): {_fmt(t.get('us_per_token'))} us/token, "
                      f"{t.get('calls', '')} calls" for t in top[:8]]
        excl = (b or {}).get("exclusive_us_per_token")
        if excl:  # a kernel started early by programmatic dependent launch holds its wait in its duration
            lines += ["", f"Kernel time with overlaps counted once (for the earlier kernel), {config}: "
                      + ", ".join(f"{k} {_fmt(v)}" for k, v in excl.items()) + " us/token"]
        host = (b or {}).get("host_top") or []
        if host:  # where the host's step time goes (vLLM's phase ranges, operators, runtime calls; ranges nest)
            lines += ["", f"Host time per token, {config} (inclusive; vLLM's phase ranges hold the calls inside them):", ""]
            lines += [f"- {h.get('name', '')[:100]} ({h.get('category', '')}): {_fmt(h.get('us_per_token'))} us/token, "
                      f"{_fmt(h.get('calls_per_token'))} calls/token" for h in host[:10]]
    plot = Path(result.artifacts) / "breakdown.png"
    if plot.is_file():
        lines += ["", f"![decode time per token]({_rel_link(plot, rel)})"]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _rel_link(path: Path, review: Path) -> str:
    """A link that works from the review's folder (a run beside it, or docs/evidence from docs/porting); an
    absolute path for artifacts outside the repository."""
    target, here = Path(path).resolve(), review.parent.resolve()
    if target.is_relative_to(here) or (target.is_relative_to(REPO) and here.is_relative_to(REPO)):
        return os.path.relpath(target, here)
    return str(target)


def write_review(result: FeatureResult, review_dir: Path) -> Path:
    path = review_path(result.feature.name, review_dir)
    existing = path.read_text(encoding="utf-8") if path.is_file() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(result, existing, path), encoding="utf-8")
    return path


def write_matrix(results: Sequence[FeatureResult], path: Path) -> Path:
    """One comparison over every feature run: configs as rows (each baseline first, then its candidates),
    criteria metrics as columns, each cell the candidate's median and its verdict."""
    metrics: list[str] = []
    for r in results:
        metrics += [v.metric for v in r.criteria if v.metric not in metrics]
    lines = ["# Feature comparison", "", "| config | role | feature | verdict | " + " | ".join(metrics) + " |",
             "|---|---|---|---|" + "---|" * len(metrics)]
    for base in dict.fromkeys(r.feature.baseline for r in results):
        group = [r for r in results if r.feature.baseline == base]
        # each metric from whichever run of this baseline measured it: features judge different metrics
        base_sides = [s for r in group for s in r.sides if s.role == "baseline"]
        cells = []
        for m in metrics:
            vals = next((s.value(m) for s in base_sides if s.value(m)), [])
            cells.append(_fmt(stats.median(vals)) if vals else "")
        lines.append(f"| {base} | baseline | | | " + " | ".join(cells) + " |")
        for r in group:
            by = {v.metric: v for v in r.criteria}
            cells = [f"{_fmt(by[m].candidate)} {_MARK[by[m].status].split()[0]}" if m in by else "" for m in metrics]
            lines.append(f"| {r.feature.candidate} | candidate | {r.feature.name} | {_MARK[r.status]} | "
                         + " | ".join(cells) + " |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_verdicts(results: Sequence[FeatureResult], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {r.feature.name: {k: v for k, v in r.to_json().items() if k != "sides"} for r in results}
    path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    return path


def _as_run(data: dict) -> dict:
    """The feature's fields as a run's verdict.json recorded them; a field it lacks stays as the file has it today."""
    out = {k: data[k] for k in ("candidate", "hypothesis", "phase") if isinstance(data.get(k), str) or
           (k == "phase" and k in data and data[k] is None)}
    try:
        criteria = tuple(parse_criterion(v["criterion"]) for v in data.get("criteria") or [])
    except (SuiteError, KeyError, TypeError):
        criteria = ()  # written under an older grammar: the file's criteria give the units
    if criteria:
        out["criteria"] = criteria
    return out


def main(argv: list[str] | None = None) -> int:
    """Re-render reviews from runs' verdict.json files (no measurement): after editing the template's hand-written
    sections, or to bring a GPU machine's results into docs/porting."""
    ap = argparse.ArgumentParser(prog="python -m harness.features.review", description=main.__doc__.splitlines()[0])
    ap.add_argument("verdicts", nargs="+", help="runs/<run>/features/<name>/verdict.json")
    ap.add_argument("--review-dir", default=str(REPO / "docs" / "porting"))
    ap.add_argument("--artifacts", default=None, help="where the run's artifacts now are (if moved)")
    a = ap.parse_args(argv)
    try:
        _rerender(a)
    except (SuiteError, OSError) as e:  # OSError: a review file it cannot write after all
        print(f"review: {e}", file=sys.stderr)
        return 2
    return 0


def _rerender(a: argparse.Namespace) -> None:
    review_dir = writable_dir(Path(a.review_dir), "--review-dir")  # before any file is read: one line, not an OSError
    features = load_features()
    for v in a.verdicts:
        try:
            data = json.loads(Path(v).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:  # missing, or not JSON: a traceback before
            raise SuiteError(f"{v}: cannot read it ({type(e).__name__}); pass a runs/<run>/features/<name>/"
                             "verdict.json") from None
        if not isinstance(data, dict) or "feature" not in data:
            raise SuiteError(f"{v}: not a feature verdict (no `feature`); pass a runs/<run>/features/<name>/verdict.json")
        if data["feature"] not in features:
            raise SuiteError(f"{v}: feature {data['feature']} is not in configs/features.yaml")
        # what that run judged (its candidate, baseline, hypothesis and criteria), whatever the file says today
        feature = dataclasses.replace(features[data["feature"]], baseline=data["baseline"], baseline_why=None,
                                      **_as_run(data))
        result = FeatureResult.from_json(data, feature)
        if a.artifacts:
            result.artifacts = str(Path(a.artifacts) / data["feature"])
        print(write_review(result, review_dir))


if __name__ == "__main__":
    raise SystemExit(main())
