"""The nightly job end to end on CPU: the very `run:` commands of .github/workflows/nightly-gb10.yml, in job
order, with the CPU config set (configs/nightly.yaml `cpu`: level 1 of cpu-bf16, one server boot).

The workflow's `uses:` steps are GitHub's plumbing: checkout (this checkout), and artifact upload/download,
which on one machine are the identity (the run job writes $SUITE_NIGHTLY_DIR/<group>, the report job reads
every group dir there). Everything else runs as on the GB10 runners. Plus the set data and the merge logic
without vLLM.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.core.errors import SuiteError
from harness.core.platform import detect_platform
from harness.plugin import nightly

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly-gb10.yml"


def test_every_set_loads_and_names_valid_configs():
    raw = yaml.safe_load(nightly.SETS_FILE.read_text())
    for name in raw["sets"]:
        cs = nightly.load_set(name)
        assert cs.groups and nightly.plan(cs) == [g.name for g in cs.groups]
    gb10 = nightly.load_set("gb10")
    assert gb10.platform == "sm_121" and gb10.flavour == "fork"
    assert [g.levels for g in gb10.groups if g.name == "matrix"] == ["level6"]  # level 6 runs in one group only
    assert all("level6" not in g.levels for g in gb10.groups if g.configs)


def test_the_gb10_configs_run_on_sm_121_with_their_flavour():
    from harness.config.catalog import Catalog

    cat = Catalog()
    for set_name in ("gb10", "gb10-upstream"):
        cs = nightly.load_set(set_name)
        for g in cs.groups:
            for c in g.configs:
                ok, why = cat.flavour(cs.flavour).runnable(cat.parse(c), "sm_121", cs.model)
                assert ok, f"{set_name}/{g.name}: {why}"


def test_bad_sets_are_one_line_errors(tmp_path):
    with pytest.raises(SuiteError, match="no config set 'nope'"):
        nightly.load_set("nope")
    bad = tmp_path / "n.yaml"
    bad.write_text(yaml.safe_dump({"sets": {"x": {"platform": "cpu", "flavour": "cpu", "levels": "level1",
                                                   "groups": [{"name": "a", "configs": ["cpu-bogus"]}]}}}))
    with pytest.raises(SuiteError, match="unknown config 'cpu-bogus'"):
        nightly.load_set("x", bad)


def test_pytest_args_of_a_group(tmp_path):
    cs = nightly.load_set("gb10")
    args = nightly.pytest_args(cs, cs.group("marlin"), tmp_path, workers=2)
    assert args[args.index("-m") + 1] == cs.levels
    assert "--config=marlin-bf16,marlin-bf16-attn-triton" in args and "--flavour=fork" in args
    assert f"--junitxml={tmp_path / 'junit.xml'}" in args and args[-2:] == ["-n", "2"]  # two GPUs: side by side
    assert "-n" not in nightly.pytest_args(cs, cs.group("marlin"), tmp_path, workers=1)  # one GB10: serial
    matrix = nightly.pytest_args(cs, cs.group("matrix"), tmp_path)
    assert not any(a.startswith("--config") for a in matrix) and matrix[matrix.index("-m") + 1] == "level6"


def test_preflight_refuses_another_platform():
    cs = nightly.load_set("gb10")
    problems = nightly.preflight(cs, cs.group("marlin"))
    if detect_platform().name != "sm_121":
        assert any("is for sm_121" in p for p in problems), problems


def _junit(path: Path, tests: int, failures: int, name: str = "t") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cases = "".join(f'<testcase classname="c" name="{name}{i}">' + ("<failure message=\"boom\"/>" if i < failures else "")
                    + "</testcase>" for i in range(tests))
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
                    f'errors="0" skipped="0">{cases}</testsuite></testsuites>')


def test_merge_combines_groups_and_fails_on_a_failed_or_missing_group(tmp_path):
    cs = nightly.load_set("gb10")
    _junit(tmp_path / "nightly-marlin" / "junit.xml", 5, 0)
    _junit(tmp_path / "nightly-cutlass" / "junit.xml", 4, 1)
    (tmp_path / "nightly-marlin" / "boots.json").write_text(json.dumps([{"config": "marlin-bf16", "ok": True}]))
    ok, text = nightly.merge(cs, tmp_path)
    assert not ok and "FAIL" in text.splitlines()[0]
    assert "| matrix |" in text and "no results" in text  # the matrix group never uploaded
    assert "`c::t0` boom" in text
    merged = nightly.junit_counts(tmp_path / "merged" / "junit.xml")
    assert (merged.tests, merged.failures) == (9, 1)
    _junit(tmp_path / "nightly-cutlass" / "junit.xml", 4, 0)
    _junit(tmp_path / "nightly-matrix" / "junit.xml", 3, 0)
    ok, text = nightly.merge(cs, tmp_path)
    assert ok and text.startswith("# Nightly gb10 (sm_121, flavour fork): PASS")
    assert json.loads((tmp_path / "merged" / "boots.json").read_text())[0]["group"] == "marlin"


def _workflow_steps() -> list[tuple[str, dict]]:
    wf = yaml.safe_load(WORKFLOW.read_text())
    order = ["plan", "run", "report"]
    assert list(wf["jobs"]) == order
    return [(job, step) for job in order for step in wf["jobs"][job]["steps"]]


@pytest.mark.server
def test_the_workflows_commands_run_the_cpu_set_end_to_end(tmp_path):
    """plan -> (per group) setup, run -> merge, exactly the workflow's commands, with SUITE_SET=cpu."""
    if detect_platform().name != "cpu":
        pytest.skip("the CPU config set runs on CPU machines; on a GPU the nightly runs its own set")
    out, summary, gh_out = tmp_path / "nightly", tmp_path / "summary.md", tmp_path / "github_output"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SUITE_GROUP", "SUITE_VLLM_IMAGE"))}
    env.update(SUITE_SET="cpu", SUITE_NIGHTLY_DIR=str(out), GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(gh_out),
               SUITE_VLLM_IMAGE="", PYTHONUNBUFFERED="1")
    groups: list[str] = []
    ran = []
    for job, step in _workflow_steps():
        if "uses" in step:
            continue  # checkout / artifacts: the identity on one machine
        per_group = groups if job == "run" else [None]
        for group in per_group:
            step_env = {**env, **({"SUITE_GROUP": group} if group else {})}
            r = subprocess.run(["bash", "-c", step["run"]], cwd=REPO, env=step_env, capture_output=True, text=True, timeout=1200)
            ran.append((job, group, step["run"].strip(), r.returncode))
            assert r.returncode == 0, f"{job}/{group}: `{step['run'].strip()}` exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            if step.get("id") == "plan":
                line = [ln for ln in gh_out.read_text().splitlines() if ln.startswith("groups=")][-1]
                groups = json.loads(line.split("=", 1)[1])
                assert groups == ["smoke"]
    assert [(j, c) for j, _, c, _ in ran] == [("plan", "bash scripts/nightly.sh plan"), ("run", "bash scripts/nightly.sh setup"),
                                             ("run", "bash scripts/nightly.sh run"), ("report", "bash scripts/nightly.sh merge")]
    counts = nightly.junit_counts(out / "smoke" / "junit.xml")
    assert counts.ok and counts.tests >= 5, counts
    text = summary.read_text()
    assert "## cpu/smoke: PASS" in text and "# Nightly cpu (cpu, flavour cpu): PASS" in text
    assert (out / "merged" / "junit.xml").is_file() and (out / "merged" / "nightly.md").is_file()
    assert (out / "smoke" / "servers").is_dir()  # the run dir the artifact upload takes
