#!/usr/bin/env python3
"""Measure what the level 2 tolerances must separate: runs that must agree vs faults that must fail.

Boots the first config as the reference (its own greedy streams and scorings, as a golden would hold),
then each further config (the first again = the same config across boots; other backends computing the
same math) and each mutated checkpoint (harness/engine/mutations.py), scores the reference's sequences on each,
and prints per run: max and mean |delta logprob| (teacher-forced, every position), the perplexity change,
whether the greedy streams are identical, and the verdict under the current tolerances. The tolerances in
tests/level2_correctness/prompts.yaml are chosen from these numbers (docs/evidence/level2-tolerances.md).

    python scripts/measure_level2_tolerances.py --configs cpu-bf16,cpu-bf16,cpu-bf16-eager --mutations all --out runs/tol
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.config.catalog import Catalog  # noqa: E402
from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.correctness.level2 import Level2Result, judge, load_workload, run_level2  # noqa: E402
from harness.correctness.logprobs import compare_scored, compare_streams  # noqa: E402
from harness.engine.mutations import LEVEL2, mutated_copy, sinks_raised  # noqa: E402
from harness.session.suite import Suite  # noqa: E402


def compare(ref: dict, result: Level2Result, tol) -> dict:
    gold = Level2Result.from_golden(ref)
    diffs = {name: compare_scored(gold.scored[name], result.scored[name], tol, name) for name in gold.scored}
    streams_identical = all(compare_streams(gold.streams[n], result.streams[n], tol).identical for n in gold.streams)
    verdict = judge(result, ref, tol)
    return {"max_abs": max(d.max_abs for d in diffs.values()),
            "mean_abs": max(d.mean_abs for d in diffs.values()),  # the worst sequence's mean
            "ppl_rel": abs(result.perplexity / gold.perplexity - 1), "streams_identical": streams_identical,
            "passes_current_tolerance": verdict.ok, "first_problem": next(iter("\n".join(verdict.problems).splitlines()), "")[:160]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", required=True, help="comma separated; the first is the reference (repeat it for an A/A)")
    ap.add_argument("--mutations", default="", help="'all' or comma separated names from harness/engine/mutations.py LEVEL2")
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default="runs/level2-tolerances")
    ap.add_argument("--resume", action="store_true", help="reuse OUT/reference.json instead of booting the reference again")
    args = ap.parse_args(argv)
    try:
        return _run(args, ap)
    except SuiteError as e:
        print(f"measure_level2_tolerances: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not names:
        raise SuiteError("--configs names no config: pass the reference first, e.g. --configs cpu-bf16,cpu-bf16")
    # every name before the reference boots (a typo in the last one used to cost that boot), under this script's
    # option name: Suite.create's own check says --config
    catalog = Catalog()
    for name in names:
        catalog.parse(name, "--configs")
    out = writable_dir(Path(args.out), "--out")
    suite = Suite.create(names[0], args.model, None, None, str(out), 900.0)
    wl = load_workload()
    tol = wl.tolerance(suite.platform.name)
    rows, ref = [], None
    # sinks-raised: the fault level 1.5's sinks check must see (its SINKS_MIN_MEAN_SHIFT comes from this row)
    candidates = {**LEVEL2, "sinks-raised": sinks_raised}
    mutations = list(candidates) if args.mutations == "all" else [m for m in args.mutations.split(",") if m]
    unknown = [m for m in mutations if m not in candidates]
    if unknown:
        ap.error(f"unknown mutation(s) {', '.join(unknown)}; valid: {', '.join(candidates)}")
    runs = [(n, None) for n in names] + [(names[0], m) for m in mutations]
    # every config resolved before the first boot: one that cannot run here is one line now, not after the boots
    # before it (a 120b boot each on a GB10)
    targets = {n: suite.target(suite.catalog.parse(n)) for n in dict.fromkeys(names)}
    for n, t in targets.items():
        if not t.runnable:
            raise SuiteError(f"--configs: {n} cannot run here: {t.reason}")
    if args.resume and (out / "reference.json").is_file():
        try:
            ref = json.loads((out / "reference.json").read_text())
        except ValueError as e:
            raise SuiteError(f"--resume: {out / 'reference.json'} is corrupt ({e}); delete it to boot the reference "
                             "again") from None
        rows.append({"run": f"{names[0]} (reference, from {out / 'reference.json'})"})
        runs = runs[1:]
    for i, (name, mutation) in enumerate(runs, start=len(rows)):
        target = targets[name]
        model_path = None
        if mutation:
            model_path = str(out / f"mutant-{mutation}")
            if not Path(model_path).exists():
                mutated_copy(Path(suite.model.path), Path(model_path), candidates[mutation])
        t0 = time.monotonic()
        with suite.boot(target, tag=f"__tol{i}", model_path=model_path) as running:
            result = run_level2(running.client(), wl, ref)
        label = f"{name}" + (f" + {mutation}" if mutation else "") + (" (reference)" if ref is None else "")
        if ref is None:
            ref = result.to_golden()
            (out / "reference.json").write_text(json.dumps(ref))
            rows.append({"run": label, "seconds": round(time.monotonic() - t0)})
        else:
            rows.append({"run": label, **compare(ref, result, tol), "seconds": round(time.monotonic() - t0)})
        print(json.dumps(rows[-1]), flush=True)
        (out / "tolerances.json").write_text(json.dumps(rows, indent=1))  # kept if a later boot dies
    lines = [f"# Level 2 tolerance measurements: {suite.model.alias} on {suite.platform.name} ({suite.platform.device})", "",
             f"Current tolerance ({tol.source}): max_abs {tol.max_abs}, mean_abs {tol.mean_abs}, ppl_rel {tol.ppl_rel}, "
             f"margin {tol.margin}.", "",
             "| run vs reference | max abs delta logprob | worst mean abs delta | ppl rel change | streams identical | passes current tolerance |",
             "|---|---|---|---|---|---|"]
    for r in rows[1:]:
        lines.append(f"| {r['run']} | {r['max_abs']:.4f} | {r['mean_abs']:.5f} | {r['ppl_rel'] * 100:.3f}% | "
                     f"{r['streams_identical']} | {r['passes_current_tolerance']} |")
    (out / "tolerances.md").write_text("\n".join(lines) + "\n")
    (out / "tolerances.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
