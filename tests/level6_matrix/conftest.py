"""Level 6 plumbing: the plan of combinations, and one dedicated server per combination.

Each combination boots once (suite.boot, always stopped), and while it is up the suite records its
evidence: a smoke completion, a profiled kernel path (level 1.5) and a short level 2 run. Tests then
judge that evidence, so a combination's tests and the orthogonality pairs that need it share one boot.

Parallel runs (pytest-xdist, `-n N`): each worker boots its own servers. Workers share evidence through
files in a directory keyed by xdist's test-run id, so a combination is booted by one worker only (a
lock per combination), and at most one server runs per slot, the slots every level's servers share
(harness/plugin/parallel.py `server_slot`): on CPU one slot (the cores are shared, so servers take turns whatever
`-n` says), on CUDA one per visible GPU, each worker pinned to its GPU by the root conftest before it
boots anything. Without xdist (`-n 0` or no `-n`) evidence lives in memory.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from harness.core.errors import SuiteError
from harness.correctness.level2 import load_workload
from harness.matrix.combinations import Plan, load_matrix, make_plan, pair_id
from harness.matrix.runner import WORKLOAD, Runner
from harness.plugin import parallel
from harness.session.suite import SUITE_KEY, Suite

NO_PLAN = "no-plan"


def _root_suite(config: pytest.Config) -> Suite:
    """The Suite the root conftest created."""
    if SUITE_KEY not in config.stash:
        raise SuiteError("level 6: the root conftest's Suite is not in the pytest stash; run pytest from the repository root")
    return config.stash[SUITE_KEY]


def _plan(config: pytest.Config) -> Plan | SuiteError:
    """The platform's plan, computed once per process (collection and fixtures share it)."""
    cached = getattr(config, "_level6_plan", None)
    if cached is not None:
        return cached
    try:
        suite = _root_suite(config)
        data = load_matrix()
        spec = data.for_platform(suite.platform.name)
        if spec is None:
            raise SuiteError(f"no level 6 matrix for platform {suite.platform.name} in {data.path}; add one under `platforms:`")
        model = getattr(suite.model_or_error, "path", None)
        plan: Plan | SuiteError = make_plan(suite.catalog, suite.flavour, suite.platform.name, spec, model)
    except SuiteError as e:
        plan = e
    config._level6_plan = plan
    return plan


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    wanted = [f for f in ("combo", "variant", "pair") if f in metafunc.fixturenames]
    if not wanted:
        return
    plan = _plan(metafunc.config)
    if isinstance(plan, SuiteError):
        ids = [NO_PLAN]  # the fixture raises the plan's error, so the run shows why
    elif wanted[0] == "combo":
        ids = plan.names()
    elif wanted[0] == "variant":
        ids = plan.names()[1:]
    else:
        ids = [pair_id(a.name, b.name) for a, b, _ in plan.pairs()]
    metafunc.parametrize(wanted[0], ids, ids=ids)


# -- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def plan(request: pytest.FixtureRequest, suite: Suite) -> Plan:
    p = _plan(request.config)
    if isinstance(p, SuiteError):
        raise p
    return p


@pytest.fixture(scope="session")
def level6_dir(request: pytest.FixtureRequest, suite: Suite) -> Path:
    """Reports, and under xdist the evidence workers share (keyed by the run's id, never reused).

    xdist workers share the controller's run dir (harness.plugin.parallel hands it to them)."""
    path = suite.run_dir / "level6"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def workload():
    """The short level 2 workload, or the SuiteError explaining why it cannot load (e.g. no heldout text)."""
    try:
        return load_workload(WORKLOAD)
    except SuiteError as e:
        return e


@pytest.fixture(scope="session")
def runner(request: pytest.FixtureRequest, suite: Suite, plan: Plan, level6_dir: Path, workload) -> Iterator[Runner]:
    if suite.server_url:
        pytest.skip("--server-url: level 6 boots a server per combination, which an external server cannot be")
    config = request.config
    worker = os.environ.get("PYTEST_XDIST_WORKER")

    def slot(timeout_s: float):
        return parallel.server_slot(worker, parallel.all_gpus(config), 1, suite.platform.is_cuda,
                                    timeout_s=timeout_s)

    run = Runner(suite, plan, level6_dir, workload, slot, bool(config.getoption("force_regen")))
    yield run
    run.close()  # a combination booted ahead and never taken (deselected tests) is stopped
