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
from tests.unit.recordings import verified_dir_without, write_verified_everywhere

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


@pytest.mark.parametrize("argv, said", [
    (["summary"], "nightly: summary needs --dir"), (["merge", "--set", "cpu"], "nightly: merge needs --dir"),
    (["pytest-args", "--set", "cpu", "--group", "smoke"], "nightly: pytest-args needs --dir"),
    (["merge", "--set", "cpu", "--dir", "/proc/nope"], "nightly: --dir (SUITE_NIGHTLY_DIR) /proc/nope: cannot write"),
    (["pytest-args", "--set", "cpu", "--group", "smoke", "--dir", "/proc/nope"], "nightly: --dir (SUITE_NIGHTLY_DIR)"),
], ids=["summary-without-dir", "merge-without-dir", "pytest-args-without-dir", "merge-unwritable", "args-unwritable"])
def test_a_missing_or_unwritable_dir_is_one_line(capsys, argv, said):
    """Without --dir, Path(None) was a TypeError traceback; a folder it cannot write, an OSError one."""
    assert nightly.main(argv) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(said) and not out.strip(), (out, err)


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
    # a group refused by its preflight leaves no results either (its folder is empty): not "the job died"
    assert "no results: not run, e.g. its preflight failed, or the job died before uploading" in text
    assert "`c::t0` boom" in text
    merged = nightly.junit_counts(tmp_path / "merged" / "junit.xml")
    assert (merged.tests, merged.failures) == (9, 1)
    _junit(tmp_path / "nightly-cutlass" / "junit.xml", 4, 0)
    _junit(tmp_path / "nightly-matrix" / "junit.xml", 3, 0)
    ok, text = nightly.merge(cs, tmp_path)
    assert ok and text.startswith("# Nightly gb10 (sm_121, flavour fork): PASS")
    assert json.loads((tmp_path / "merged" / "boots.json").read_text())[0]["group"] == "marlin"


@pytest.mark.parametrize("case, why", [
    ("killed", "no junit.xml (the job stopped before pytest finished"),
    ("truncated", "its junit.xml holds no test (unreadable, or pytest collected nothing)"),
    ("collected-nothing", "its junit.xml holds no test"),
    ("all-skipped", "all 2 tests skipped"),
])
def test_a_group_that_tested_nothing_fails_the_night_though_the_others_passed(tmp_path, case, why):
    """The totals over groups once hid a group killed before its junit.xml (its results still uploaded), a truncated
    junit.xml, pytest's "no tests collected" and a group whose every test skipped: the night read PASS, exit 0."""
    cs = nightly.load_set("gb10")
    for g in ("marlin", "matrix"):
        _junit(tmp_path / f"nightly-{g}" / "junit.xml", 3, 0)
    group = tmp_path / "nightly-cutlass"
    group.mkdir()
    if case == "killed":
        (group / "results").mkdir()
        (group / "results" / "partial.json").write_text("{}")
    elif case == "truncated":
        _junit(group / "junit.xml", 3, 0)
        (group / "junit.xml").write_text((group / "junit.xml").read_text()[:90])
    elif case == "collected-nothing":
        _junit(group / "junit.xml", 0, 0)
    else:
        (group / "junit.xml").write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="2" failures="0" '
                                         'errors="0" skipped="2"><testcase classname="c" name="a"><skipped message="x"/>'
                                         '</testcase><testcase classname="c" name="b"><skipped message="y"/></testcase>'
                                         '</testsuite></testsuites>')
    ok, text = nightly.merge(cs, tmp_path)
    assert not ok and text.startswith("# Nightly gb10 (sm_121, flavour fork): FAIL"), text
    assert f"- cutlass: {why}" in text, text
    _junit(group / "junit.xml", 2, 0)  # the same group when it ran: the night passes
    assert nightly.merge(cs, tmp_path)[0]


def test_a_malformed_set_is_one_line(tmp_path):
    bad = tmp_path / "n.yaml"
    for spec, want in (("not a mapping", "expected a mapping with platform, flavour, levels and groups"),
                       ({"platform": "cpu", "flavour": "cpu", "levels": "level1", "groups": "a"}, "groups: expected a list"),
                       ({"platform": "cpu", "flavour": "cpu", "levels": "level1",
                         "groups": [{"name": "a", "configs": "cpu-bf16"}]}, "configs: expected a list of config names")):
        bad.write_text(yaml.safe_dump({"sets": {"x": spec}}))
        with pytest.raises(SuiteError, match=want):
            nightly.load_set("x", bad)


def test_a_group_whose_pytest_arguments_cannot_be_made_is_not_run_and_fails(tmp_path):
    """`mapfile < <(...)` hid the failure: pytest then ran with no arguments (every test path, no -m, no --config, no
    junit.xml) and the step was green. A worker count that is not a number is one such failure (nvidia-smi finding no
    GPU used to print "0" twice); a stale run folder of the group is gone, so last night's junit.xml cannot pass for
    tonight's."""
    stale = tmp_path / "smoke" / "junit.xml"
    _junit(stale, 3, 0)
    # SUITE_PLATFORM=cpu: the cpu set's preflight refuses a GPU machine first (test.sh runs this file on GPU boxes too)
    env = {**os.environ, "SUITE_SET": "cpu", "SUITE_GROUP": "smoke", "SUITE_NIGHTLY_DIR": str(tmp_path),
           "SUITE_WORKERS": "two", "SUITE_PLATFORM": "cpu"}
    r = subprocess.run(["bash", "scripts/nightly.sh", "run"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode != 0 and "NOT RUN (the pytest arguments could not be made" in r.stdout, r.stdout + r.stderr
    assert "-m pytest" not in r.stderr and not stale.exists()


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
    # its own server slots: the run this test is part of may still hold the machine's CPU slot for its last config's
    # server, and the nested nightly would wait for it (a test of the workflow's commands, not a measurement)
    env["SUITE_LOCK_DIR"] = str(tmp_path / "locks")
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


def test_preflight_of_the_level6_group_checks_its_plans_combinations(monkeypatch):
    """The matrix group lists no configs (level 6 boots its own combinations), so its preflight checked nothing and
    gated a GB10 night on kernel patterns no trace had confirmed. It now checks every combination of the plan."""
    from harness.core.platform import Platform

    monkeypatch.setattr(nightly, "detect_platform", lambda: Platform("sm_121", "NVIDIA GB10", (12, 1)))
    monkeypatch.delenv(nightly.ALLOW_UNVERIFIED, raising=False)
    monkeypatch.setenv("SUITE_VERIFIED_DIR", str(verified_dir_without("sm_121")))  # GB10 as shipped: nothing recorded
    cs = nightly.load_set("gb10")
    problems = "\n".join(nightly.preflight(cs, cs.group("matrix")))
    assert "kernel expectations not verified on a real sm_121 trace" in problems, problems
    plan = nightly.make_plan(nightly.Catalog(), nightly.Catalog().flavour("fork"), "sm_121",
                             nightly.load_matrix().for_platform("sm_121"), cs.model)
    assert plan.names() and all(f"\n  {name}: " in problems for name in plan.names()), problems


@pytest.mark.parametrize("set_name", ["gb10", "gb10-upstream"])
def test_every_group_gates_once_every_gb10_entry_is_recorded_and_none_before(set_name, monkeypatch, tmp_path):
    """docs/GB10.md's promise: once steps 3 and 4 recorded every kernel entry of what runs, the nightly gates strictly:
    no group, level 6's plan included, holds a config that no recording can verify (an entry without patterns fails
    this test). Level 6's fork plan once varied moe=gemv, which the fork's vLLM cannot select (gemv falls through to
    CUTLASS): configs/flavours/fork.yaml now rejects it on sm_12x, so the plan leaves it out."""
    from harness.core.platform import Platform

    monkeypatch.setattr(nightly, "detect_platform", lambda: Platform("sm_121", "NVIDIA GB10", (12, 1)))
    monkeypatch.delenv(nightly.ALLOW_UNVERIFIED, raising=False)
    cs = nightly.load_set(set_name)
    monkeypatch.setattr(nightly.Catalog, "default_flavour", lambda self, platform: self.flavour(cs.flavour))
    monkeypatch.setenv("SUITE_VERIFIED_DIR", str(verified_dir_without("sm_121")))
    assert all(nightly.preflight(cs, group) for group in cs.groups)  # GB10 as shipped: every group refused
    monkeypatch.setenv("SUITE_VERIFIED_DIR", str(write_verified_everywhere("sm_121", tmp_path / "verified")))
    assert {group.name: nightly.preflight(cs, group) for group in cs.groups} == {group.name: [] for group in cs.groups}


# -- mutation audit: the gate's remaining decisions, each with the fault it guards against ---------------------------
def test_a_set_with_two_groups_of_one_name_is_refused(tmp_path):
    """Guards load_set's uniqueness check: two groups named alike write one run folder (nightly-<group>), and one
    group's results silently replaced the other's."""
    bad = tmp_path / "n.yaml"
    bad.write_text(yaml.safe_dump({"sets": {"x": {"platform": "cpu", "flavour": "cpu", "levels": "level1",
                                                   "groups": [{"name": "a", "configs": ["cpu-bf16"]},
                                                              {"name": "a", "configs": ["cpu-bf16"]}]}}}))
    with pytest.raises(SuiteError, match="group names must be unique"):
        nightly.load_set("x", bad)


def test_workers_are_capped_at_the_groups_config_count(tmp_path):
    """Guards pytest_args' min(): four GPUs for a two-config group start two xdist workers, not four idle ones."""
    cs = nightly.load_set("gb10")
    args = nightly.pytest_args(cs, cs.group("marlin"), tmp_path, workers=4)
    assert args[-2:] == ["-n", "2"], f"two configs, two workers: {args}"


def _gb10_here(monkeypatch, flavour: str | None = "fork"):
    from harness.core.platform import Platform

    monkeypatch.setattr(nightly, "detect_platform", lambda: Platform("sm_121", "NVIDIA GB10", (12, 1)))
    if flavour:
        monkeypatch.setattr(nightly.Catalog, "default_flavour", lambda self, platform: self.flavour(flavour))


def test_preflight_refuses_another_flavour_and_a_config_the_platform_cannot_run(monkeypatch, tmp_path):
    """Guards preflight's flavour check (upstream vLLM installed where the set expects the fork) and its runnable check
    (a config the platform cannot run is a data error at night, never a skip)."""
    _gb10_here(monkeypatch, "upstream")
    monkeypatch.setenv("SUITE_VERIFIED_DIR", str(write_verified_everywhere("sm_121", tmp_path / "verified")))
    cs = nightly.load_set("gb10")
    problems = nightly.preflight(cs, cs.group("marlin"))
    assert any("expects the 'fork' flavour" in p and "'upstream'" in p for p in problems), problems
    _gb10_here(monkeypatch, "fork")
    problems = nightly.preflight(cs, nightly.Group("g", ["triton-bf16"], "level1"))
    assert any(p.startswith("triton-bf16 cannot run here:") for p in problems), problems


def test_preflight_refuses_a_config_that_declares_no_kernel_pattern(monkeypatch, tmp_path):
    """Guards preflight's `must` check: a config whose kernel entry is verified but names no pattern gates nothing."""
    import dataclasses

    _gb10_here(monkeypatch)
    monkeypatch.delenv(nightly.ALLOW_UNVERIFIED, raising=False)
    monkeypatch.setenv("SUITE_VERIFIED_DIR", str(write_verified_everywhere("sm_121", tmp_path / "verified")))
    cs = nightly.load_set("gb10")
    assert nightly.preflight(cs, cs.group("marlin")) == []
    resolve = nightly.Catalog().flavour("fork").resolve.__func__
    monkeypatch.setattr(type(nightly.Catalog().flavour("fork")), "resolve", lambda self, cfg, platform: dataclasses.replace(
        resolve(self, cfg, platform), kernels=dataclasses.replace(resolve(self, cfg, platform).kernels, must=[])))
    problems = "\n".join(nightly.preflight(cs, cs.group("marlin")))
    assert "marlin-bf16: declares no kernel patterns for sm_121" in problems, problems


def test_only_allow_unverified_1_lifts_the_kernel_gate(monkeypatch):
    """Guards the `== "1"` of SUITE_NIGHTLY_ALLOW_UNVERIFIED: `=0` (or any other value) keeps the strict gate."""
    _gb10_here(monkeypatch)
    monkeypatch.setenv("SUITE_VERIFIED_DIR", str(verified_dir_without("sm_121")))
    cs = nightly.load_set("gb10")
    monkeypatch.setenv(nightly.ALLOW_UNVERIFIED, "0")
    assert any("not verified on a real sm_121 trace" in p for p in nightly.preflight(cs, cs.group("marlin"))), \
        "=0 must not lift the gate"
    monkeypatch.setenv(nightly.ALLOW_UNVERIFIED, "1")
    assert not any("not verified" in p for p in nightly.preflight(cs, cs.group("marlin")))


def test_a_groups_summary_of_only_skipped_tests_is_not_a_pass(tmp_path):
    """Guards Counts.ok's `passed > 0` as the job summary uses it: a group whose every test skipped tested nothing."""
    (tmp_path / "junit.xml").write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="2" failures="0" '
                                        'errors="0" skipped="2"><testcase classname="c" name="a"><skipped message="x"/>'
                                        '</testcase><testcase classname="c" name="b"><skipped message="y"/></testcase>'
                                        '</testsuite></testsuites>')
    first = nightly.summary(tmp_path, "cpu/smoke").splitlines()[0]
    assert first == "## cpu/smoke: FAIL", first
    _junit(tmp_path / "junit.xml", 3, 0)
    assert nightly.summary(tmp_path, "cpu/smoke").splitlines()[0] == "## cpu/smoke: PASS"


def test_a_missing_group_or_one_with_errors_fails_the_night_and_the_exit_code(tmp_path, monkeypatch):
    """Guards merge's verdict: a group that uploaded nothing (the others all passed) fails the night, a group whose
    tests errored (pytest `errors=`, not failures) is not a pass, and `merge` / `preflight` exit non-zero with it."""
    cs = nightly.load_set("gb10")
    _junit(tmp_path / "nightly-marlin" / "junit.xml", 5, 0)
    _junit(tmp_path / "nightly-cutlass" / "junit.xml", 4, 0)
    ok, text = nightly.merge(cs, tmp_path)
    assert not ok and "FAIL" in text.splitlines()[0], "the matrix group is missing: the night must fail"
    assert nightly.main(["merge", "--set", "gb10", "--dir", str(tmp_path)]) == 1, "a failed night must exit 1"
    _junit(tmp_path / "nightly-matrix" / "junit.xml", 3, 0)
    assert nightly.merge(cs, tmp_path)[0]
    errored = tmp_path / "nightly-matrix" / "junit.xml"
    errored.write_text(errored.read_text().replace('errors="0"', 'errors="1"').replace(
        '<testcase classname="c" name="t0"></testcase>', '<testcase classname="c" name="t0"><error message="x"/></testcase>'))
    ok, text = nightly.merge(cs, tmp_path)
    assert not ok and "1 errors" in text, text
    monkeypatch.setattr(nightly, "preflight", lambda cs, group: ["set gb10 is for sm_121"])
    assert nightly.main(["preflight", "--set", "gb10", "--group", "marlin"]) == 1, "a refused preflight must exit 1"
