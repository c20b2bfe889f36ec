"""The levels a feature requires, run on its candidate by the suite itself: one `pytest -m "level1 or ..."`
child run per feature (its own run directory and junit.xml), read back per level from the test files' folders.

A child run rather than the same session: each level's fixtures, goldens and baselines stay exactly what a
user's `pytest -m level2 --config=CANDIDATE` would use, and one boot of the candidate serves every level.
Level 2 is judged against the baseline config's goldens (`--goldens-of`): "no correctness regression" against
what the baseline produces, the users' criterion.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.core.junit import read_cases
from harness.core.paths import REPO

FOLDER_LEVEL = {"level1_smoke": "level1", "level1_5_kernels": "level1_5", "level2_correctness": "level2",
                "level3_stress": "level3", "level4_perf": "level4", "level5_regression": "level5"}


@dataclass
class LevelOutcome:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    first_failures: list[str] = field(default_factory=list)
    skip_reason: str | None = None  # the first skip's reason (why a level did not run)

    @property
    def status(self) -> str:
        """PASS (something ran and nothing failed), FAIL, or NOT RUN (everything skipped: not a pass)."""
        if self.failed:
            return "FAIL"
        return "PASS" if self.passed else "NOT RUN"

    def to_json(self) -> dict:
        return {**asdict(self), "status": self.status}


def read_junit(path: Path, levels: tuple[str, ...]) -> dict[str, LevelOutcome]:
    """Per-level outcomes from a junit.xml (a test's level is its folder under tests/)."""
    out = {lv: LevelOutcome() for lv in levels}
    try:
        cases = read_cases(path)
    except (OSError, ET.ParseError) as e:
        raise SuiteError(f"the candidate's level run wrote no readable {path} ({e}); see its log beside it") from None
    for case in cases:
        folder = next((p for p in case.classname.split(".") if p in FOLDER_LEVEL), None)
        level = FOLDER_LEVEL.get(folder or "")
        if level not in out:
            continue
        o = out[level]
        if case.outcome == "failed":
            o.failed += 1
            if len(o.first_failures) < 3:
                first = case.message.strip().splitlines()[:1]  # the log tail follows
                o.first_failures.append(f"{case.name}: {(first[0] if first else '')[:200]}")
        elif case.outcome == "xfailed":
            o.xfailed += 1
        elif case.outcome == "skipped":
            o.skipped += 1
            o.skip_reason = o.skip_reason or case.message[:200]
        else:
            o.passed += 1
    return out


def run_levels(levels: tuple[str, ...], candidate: str, baseline: str, flavour: str, model: str | None,
               run_dir: Path, extra: list[str], timeout_s: float) -> dict[str, LevelOutcome]:
    """Run `levels` on `candidate` in a child pytest; outcomes per level (SuiteError when it could not run)."""
    if not levels:
        return {}
    run_dir.mkdir(parents=True, exist_ok=True)
    junit = run_dir / "junit.xml"
    # `server`: the tests that judge this config's server; the kernel conformance tests of level 1.5 do not
    # depend on the config and run in the suite's own job
    marker = f"({' or '.join(levels)}) and server"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", marker,
            f"--config={candidate}", f"--flavour={flavour}", f"--run-dir={run_dir}", f"--junitxml={junit}",
            *extra]
    if model:
        args.append(f"--model={model}")
    if "level2" in levels and candidate != baseline:
        args.append(f"--goldens-of={baseline}")
    log = run_dir / "pytest.log"
    with open(log, "w", encoding="utf-8") as f:
        # its own process group: a child stopped at the timeout takes its servers down (SIGTERM runs the suite's
        # teardown), and nothing of it outlives this run
        child = subprocess.Popen(args, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(child)
            raise SuiteError(f"the candidate's levels ({', '.join(levels)}) ran past {timeout_s:.0f} s; "
                             f"see {log}") from None
        except BaseException:
            _stop(child)
            raise
    if child.returncode == pytest.ExitCode.USAGE_ERROR and not junit.is_file():
        # refused before any test (e.g. --goldens-of a baseline with no level 2 goldens): its one line, not "no junit"
        said = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
        raise SuiteError(f"the candidate's level run refused to start: {said[-1] if said else 'no output'} (see {log})")
    return read_junit(junit, levels)


def _stop(child: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
