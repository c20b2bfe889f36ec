"""The run dir the suite names itself (runs/<time>, no --run-dir): kept when something was written there, removed
when the run left it empty. Every pytest run (`--list-configs`, a unit test, a refused option) used to leave an empty
one behind; a CI run left hundreds."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.session import suite as suite_module
from harness.session.suite import Suite

REPO = Path(__file__).resolve().parents[2]

# Loaded with -p: records the run dir of every Suite the run creates and, when the process exits (after every hook of
# the root conftest), whether it is still there. With PROBE_WRITE set it writes an artifact there at session finish,
# as a level's results would be.
PROBE = '''
import atexit, json, os
from harness.session.suite import SUITE_KEY, Suite

made = []
create = Suite.create.__func__

def recording_create(cls, *args, **kwargs):
    suite = create(cls, *args, **kwargs)
    made.append(suite)
    return suite

Suite.create = classmethod(recording_create)

def pytest_sessionfinish(session):
    suite = session.config.stash.get(SUITE_KEY, None)
    if suite is not None and os.environ.get("PROBE_WRITE"):
        (suite.run_dir / "artifact.txt").write_text("kept")

@atexit.register
def report():
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump([{"run_dir": str(s.run_dir), "default": s.run_dir_default, "exists": s.run_dir.exists()} for s in made], f)
'''


def _probe_run(tmp_path: Path, argv: list[str], write: bool, refused: bool = False) -> dict:
    (tmp_path / "run_dir_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")]),
               PROBE_OUT=str(tmp_path / "probe.json"), **({"PROBE_WRITE": "1"} if write else {}))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "run_dir_probe", *argv],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert (r.returncode != 0) == refused, r.stdout[-2000:] + r.stderr[-2000:]
    made = json.loads((tmp_path / "probe.json").read_text())
    assert len(made) == 1, made  # one Suite per pytest run
    return made[0]


@pytest.mark.parametrize("argv", [["--list-configs"], ["tests/unit/test_configs.py::test_names_are_built_from_the_axes"]],
                         ids=["list-configs", "a-unit-test"])
def test_a_run_that_wrote_nothing_leaves_no_run_dir(tmp_path, argv):
    seen = _probe_run(tmp_path, argv, write=False)
    assert seen["default"] and Path(seen["run_dir"]).parent == REPO / "runs", seen
    assert not seen["exists"], f"{seen['run_dir']} was left behind, empty"


def test_an_option_refused_after_the_suite_exists_leaves_no_run_dir(tmp_path):
    """--workloads is checked once the Suite (and its run dir) exists, before conftest stashes it: pytest_unconfigure
    found no suite to drop the dir of, and the CI's refused-option test left one empty run dir per run."""
    seen = _probe_run(tmp_path, ["--workloads=/no/such/workloads.yaml", "tests/unit/test_stats.py"], write=False,
                      refused=True)
    assert seen["default"] and not seen["exists"], f"{seen['run_dir']} was left behind, empty"


def test_a_run_that_wrote_artifacts_keeps_its_run_dir(tmp_path):
    seen = _probe_run(tmp_path, ["tests/unit/test_configs.py::test_names_are_built_from_the_axes"], write=True)
    run_dir = Path(seen["run_dir"])
    try:
        assert seen["exists"] and (run_dir / "artifact.txt").read_text() == "kept", seen
    finally:
        if (run_dir / "artifact.txt").exists():
            (run_dir / "artifact.txt").unlink()
            run_dir.rmdir()


def test_a_run_dir_named_by_the_user_stays_even_empty(tmp_path):
    seen = _probe_run(tmp_path, ["--list-configs", f"--run-dir={tmp_path / 'mine'}"], write=False)
    assert not seen["default"] and seen["exists"] and (tmp_path / "mine").is_dir(), seen


def test_a_refused_option_leaves_no_run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(suite_module, "REPO", tmp_path)  # the default run dir lands in tmp_path/runs
    with pytest.raises(SuiteError, match="unknown config 'nonexistent'"):
        Suite.create("nonexistent", None, None, None, None, 900.0)
    assert (tmp_path / "runs").is_dir() and not any((tmp_path / "runs").iterdir())
    # the same options without the fault: the run dir is made, and stays until the run ends
    suite = Suite.create(None, None, None, None, None, 900.0)
    assert suite.run_dir_default and suite.run_dir.parent == tmp_path / "runs" and suite.run_dir.is_dir()


@pytest.mark.parametrize("default, wrote, shown", [(True, False, "none written"), (True, True, "{run_dir}"),
                                                   (False, False, "{run_dir}")])
def test_the_summary_names_the_run_dir_only_where_it_will_stay(tmp_path, default, wrote, shown):
    from types import SimpleNamespace

    from harness.config.catalog import Catalog
    from harness.core.platform import Platform
    from harness.report.listing import run_summary

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if wrote:
        (run_dir / "results").mkdir()
    suite = SimpleNamespace(catalog=Catalog(), platform=Platform("cpu", "test cpu", None), flavour=SimpleNamespace(name="cpu"),
                            model_or_error=SimpleNamespace(alias="tiny-gpt-oss"), boots=[], run_dir=run_dir,
                            run_dir_default=default)
    rep = SimpleNamespace(when="call", keywords={"level1": 1}, param_id="cpu-bf16", nodeid="t.py::t[cpu-bf16]")
    last = run_summary(suite, {"passed": [rep]}).splitlines()[-1]
    assert last.endswith("artifacts: " + shown.format(run_dir=run_dir)), last
