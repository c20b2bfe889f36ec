"""The GitHub workflows (.github/workflows/*.yml) pass actionlint, and a broken one does not.

actionlint comes from requirements-lint.txt (scripts/setup.sh installs it; .ci/run and .github/workflows/ci.yml
set SUITE_REQUIRE_ACTIONLINT=1, so there a missing linter fails instead of skipping). `ACTIONLINT=/path`
picks a binary explicitly. The structural checks below need no linter.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
NIGHTLY = WORKFLOWS / "nightly-gb10.yml"
CI = WORKFLOWS / "ci.yml"


def _actionlint() -> str:
    explicit = os.environ.get("ACTIONLINT")
    if explicit:
        return explicit
    found = shutil.which("actionlint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found:
        return found
    why = "actionlint is not installed: python -m pip install -r requirements-lint.txt"
    if os.environ.get("SUITE_REQUIRE_ACTIONLINT") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _lint(project: Path, *files: Path) -> subprocess.CompletedProcess:
    """actionlint on `files` of a repository at `project` (it reads project/.github/actionlint.yaml)."""
    return subprocess.run([_actionlint(), "-no-color", "-oneline", *[str(f.relative_to(project)) for f in files]],
                          cwd=project, capture_output=True, text=True, timeout=120)


def test_both_workflows_pass_actionlint():
    r = _lint(REPO, NIGHTLY, CI)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    """A repository holding a copy of the workflows and the actionlint config."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copytree(REPO / ".github", tmp_path / ".github")
    return tmp_path


BREAKAGES = {
    "a typo'd key": ("    runs-on: [self-hosted, gb10]\n    timeout-minutes: 15\n",
                     "    runs-onn: [self-hosted, gb10]\n    timeout-minutes: 15\n"),
    "an undefined job output": ("${{ fromJSON(needs.plan.outputs.groups) }}", "${{ fromJSON(needs.plan.outputs.grups) }}"),
    "an output of an undefined step": ("${{ steps.plan.outputs.groups }}", "${{ steps.plann.outputs.groups }}"),
    "an undefined matrix key": ("name: nightly-${{ matrix.group }}", "name: nightly-${{ matrix.grop }}"),
    "an unknown runner label": ("    runs-on: [self-hosted, gb10]\n    timeout-minutes: 30\n",
                                "    runs-on: [self-hosted, gb-10]\n    timeout-minutes: 30\n"),
    "a job needing an undefined job": ("needs: [plan, run]", "needs: [plan, runs]"),
}


@pytest.mark.parametrize("what", list(BREAKAGES))
def test_a_broken_workflow_fails_the_lint(scratch_repo: Path, what: str):
    """A test of the test: each small breakage of the real nightly workflow must fail actionlint."""
    old, new = BREAKAGES[what]
    path = scratch_repo / ".github" / "workflows" / NIGHTLY.name
    text = path.read_text()
    assert text.count(old) == 1, f"the breakage for {what} no longer applies to {NIGHTLY.name}: update BREAKAGES"
    path.write_text(text.replace(old, new))
    r = _lint(scratch_repo, path)
    assert r.returncode == 1 and NIGHTLY.name in r.stdout, f"actionlint accepted {what}:\n{r.stdout}{r.stderr}"


def test_the_unbroken_copy_passes_too(scratch_repo: Path):
    r = _lint(scratch_repo, scratch_repo / ".github" / "workflows" / NIGHTLY.name)
    assert r.returncode == 0, r.stdout


# -- structure (no linter needed) --------------------------------------------------------------------
def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def test_the_nightly_runs_on_gb10_runners_and_only_calls_the_nightly_script():
    wf = _load(NIGHTLY)
    assert set(wf["jobs"]) == {"plan", "run", "report"}
    for name, job in wf["jobs"].items():
        assert job["runs-on"] == ["self-hosted", "gb10"], name
        for step in job["steps"]:
            if "run" in step:
                assert re.fullmatch(r"bash scripts/nightly\.sh (plan|setup|run|merge)", step["run"].strip()), step["run"]
            else:
                assert step["uses"].split("@")[0] in {"actions/checkout", "actions/upload-artifact", "actions/download-artifact"}
    run = wf["jobs"]["run"]
    assert run["strategy"]["matrix"]["group"] == "${{ fromJSON(needs.plan.outputs.groups) }}"
    assert run["strategy"]["fail-fast"] is False
    uploads = [s for s in run["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["if"] == "always()"  # runs/ and JUnit even when tests failed
    assert wf["jobs"]["report"]["if"].startswith("always()")
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]


def test_a_dispatch_without_a_set_runs_the_repositorys_gb10_set():
    """docs/GB10.md: with upstream vLLM, GB10_SET=gb10-upstream. A dispatch input defaulting to gb10 shadowed it (a
    first night started by hand then ran the fork's set, whose preflight refuses upstream vLLM)."""
    wf = _load(NIGHTLY)
    assert wf["on"]["workflow_dispatch"]["inputs"]["set"].get("default", "") == ""
    assert wf["env"]["SUITE_SET"] == "${{ inputs.set || vars.GB10_SET || 'gb10' }}"


def test_ci_runs_the_ci_script_on_a_cpu_runner_and_requires_the_lint():
    wf = _load(CI)
    assert "pull_request" in wf["on"]
    job = wf["jobs"]["test"]
    assert job["runs-on"] == "ubuntu-latest" and job["env"]["SUITE_REQUIRE_ACTIONLINT"] == "1"
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "bash .ci/run" in runs and "requirements-lint.txt" in runs


def test_the_linter_is_pinned():
    lines = [ln.strip() for ln in (REPO / "requirements-lint.txt").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert any(re.fullmatch(r"actionlint(-py|-kjanat)==[\d.]+", ln) for ln in lines), lines
