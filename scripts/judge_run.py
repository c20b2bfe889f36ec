#!/usr/bin/env python3
"""Judge a finished level 4 run against a baseline file, with level 5's gate, without booting anything.

    python3 scripts/judge_run.py RUN_DIR --baseline FILE [--out DIR]

RUN_DIR is a suite run directory (`--run-dir`, or `runs/<stamp>`); the baseline's config is judged, from the
`results/<model>__<config>.json` level 4 wrote there. Every verdict is `harness.perf.regression.compare_run`'s, the
function level 5 calls, with the thresholds of `baselines/thresholds.yaml` for the results' platform. Prints the verdicts as level 5 does, writes them to
`DIR/verdicts/` beside a copy of the results (so `scripts/gates_summary.py` reads DIR as one more phase), and exits
1 when a strict gate fails, as level 5 does.

Where it is for: a run that gated against the wrong file. On our lab's GPU machine the working tree is copied
again at every call, and an A/A boot that spanned a call read the committed baseline instead of the one recorded an
hour before (2026-12-02); its measurements stand, so they are judged again against the right file here. Also for a
results file kept by a nightly, against a baseline recorded after it.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import BASELINE_ROOT, shown, writable_dir  # noqa: E402
from harness.perf.baselines import load_baseline  # noqa: E402
from harness.perf.regression import (THRESHOLDS_FILE, Thresholds, Verdict, compare_run, gate_failures,  # noqa: E402
                                     load_thresholds)
from harness.perf.results import read_results, results_files  # noqa: E402

def results_of(run_dir: Path, config: str) -> Path:
    """`config`'s level 4 results in a run directory: `results/<model>__<config>.json`. Servers booted beside the
    shared one write `<model>__<config>__<tag>.json` (the n-gram speculator): other boots."""
    if not run_dir.is_dir():  # was "<path> has no results/<model>__<config>.json (results there: none)"
        said = "not a directory" if run_dir.exists() else "no such directory"
        raise SuiteError(f"RUN_DIR {run_dir}: {said}; pass the run directory of a level 4 run of {config} (its "
                         "--run-dir, or runs/<stamp>)")
    found = results_files(run_dir)
    mine = [p for p in found if p.name.endswith(f"__{config}.json")]
    if len(mine) == 1:
        return mine[0]
    if not mine:
        has = ", ".join(p.stem for p in found) or "none"
        raise SuiteError(f"{run_dir} has no results/<model>__{config}.json (results there: {has}): pass the run "
                         f"directory of a level 4 run of {config} (its --run-dir, or runs/<stamp>)")
    raise SuiteError(f"{run_dir} holds results of {config} for {len(mine)} models ({', '.join(p.stem for p in mine)}); "
                     "a baseline is one model's: copy the one you mean into a run dir of its own")


def existing_baseline(path: Path) -> Path:
    """--baseline, when it names no file: load_baseline's own hint records a baseline of a config named after the
    file's stem (`--config=<typo>`), right for level 5's computed paths but not for a mistyped one."""
    if path.is_file():
        return path
    committed = sorted(BASELINE_ROOT.glob("*/*/*.yaml"))
    folder = (path if path.is_dir() else path.parent).resolve()
    # the committed ones of the same config, else those under the folder it named, else any one as the form
    near = ([p for p in committed if p.stem == path.stem] or [p for p in committed if p.is_relative_to(folder)]
            or committed[:1])
    said = "not a file" if path.exists() else "no such file"
    example = f" (e.g. {', '.join(str(shown(p)) for p in near[:3])})" if near else ""
    raise SuiteError(f"--baseline {path}: {said}; pass a baseline YAML, "
                     f"baselines/<platform-key>/<model>/<config>.yaml{example}")


def judge(run_dir: Path, baseline_file: Path,
          thresholds_file: Path = THRESHOLDS_FILE) -> tuple[list[Verdict], Thresholds, Path, dict]:
    """Level 5's verdicts of the baseline's config in `run_dir` against the baseline; the thresholds used, the results
    file and its contents."""
    baseline = load_baseline(existing_baseline(baseline_file))
    results_file = results_of(run_dir, str(baseline.get("config") or baseline_file.stem))
    current = read_results(results_file)
    thresholds = load_thresholds(thresholds_file, current.get("platform"))
    return compare_run(baseline, current, thresholds), thresholds, results_file, current


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--baseline", type=Path, required=True, help="the baseline YAML to judge against")
    ap.add_argument("--out", type=Path, default=None,
                    help="write verdicts/ and results/ here (default: print only)")
    args = ap.parse_args(argv)
    try:
        verdicts, thresholds, results_file, current = judge(args.run_dir, args.baseline)
        out = writable_dir(args.out, "--out") if args.out is not None else None
        if out is not None and out == args.run_dir.resolve():
            raise SuiteError(f"--out {args.out} is the run directory itself, whose verdicts level 5 wrote; pass "
                             "another folder")
    except SuiteError as e:
        print(f"judge_run: {e}", file=sys.stderr)
        return 2
    print(f"[{current.get('config')} on {current.get('platform')} ({results_file}) vs {args.baseline}]")
    for v in verdicts:
        print(f"  {v.status:12s} {v.message}")
    if out is not None:
        for sub in ("verdicts", "results"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        (out / "verdicts" / results_file.name).write_text(json.dumps([v.to_json() for v in verdicts], indent=1,
                                                                      default=str))
        shutil.copy(results_file, out / "results" / results_file.name)
    failures = gate_failures(verdicts, thresholds)
    if failures:
        print(f"judge_run: {len(failures)} gate failure(s): " + "; ".join(v.message for v in failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
