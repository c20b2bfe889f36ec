"""Level 5 fixtures: thresholds, the baseline file, and a server with the test-only suite_testhooks hooks."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.core.paths import BASELINE_ROOT
from harness.engine import hooks
from harness.core.store import Store
from harness.perf.baselines import BaselineStore, baseline_path, platform_key
from harness.perf.regression import THRESHOLDS_FILE, load_thresholds
from harness.session.suite import RunningServer, StopAfterFolder, Suite

DEFAULT_HOLD_GIB = 1.5


@pytest.fixture(scope="session")
def thresholds(suite):
    return load_thresholds(THRESHOLDS_FILE, suite.platform.name)


@pytest.fixture(scope="session")
def baseline_file(suite, target):
    platform = suite.keyed_platform()  # the flavour's own folder beside the device's where it keeps its records apart
    return baseline_path(BASELINE_ROOT, platform_key(platform.name, platform.device) + suite.flavour.records_suffix,
                         suite.model.alias, target.name)


@pytest.fixture(scope="session")
def baselines(request: pytest.FixtureRequest, suite: Suite, server: RunningServer, baseline_file) -> BaselineStore:
    """This config's baseline through the record/compare store: --force-regen records it (only from a run whose
    kernel path is known good, the rule goldens follow), every run keeps its would-be baseline in the run dir."""
    regen = bool(request.config.getoption("force_regen"))
    return BaselineStore(baseline_file, Store(suite.run_dir, regen, lambda: suite.record_refusal(server, request)))


@dataclass
class HookedServer:
    running: RunningServer
    hook_dir: Path
    hold_gib: float
    shared: bool  # True: the session's shared server (booted with the hooks from pytest's environment)


@pytest.fixture(scope="session")
def hooked(request: pytest.FixtureRequest, suite: Suite, target) -> HookedServer:
    """A server holding `SUITE_HOOK_HOLD_GIB` (1.5) GiB and carrying the slowdown hook.

    When pytest's own environment asks for both hooks (`SUITE_HOOK_HOLD_GIB=1.5 SUITE_HOOK_SLOWDOWN=1`), the
    shared server has them (it inherits the environment): that is how the gpt-oss-120b shape runs, where a
    second server does not fit beside the shared one. Otherwise a second server is booted with them."""
    if suite.server_url:
        pytest.skip("--server-url: the suite cannot load its test hooks into a server it did not boot")
    wanted = hooks.hooks_requested()
    if wanted["hold"] and wanted["slowdown"]:
        running = request.getfixturevalue("server")
        yield HookedServer(running, hooks.server_hook_dir(suite, running),
                           float(os.environ[hooks.HOLD_ENV]), True)
        return
    if any(wanted.values()):
        pytest.skip(f"set both {hooks.HOLD_ENV} and {hooks.SLOWDOWN_ENV}=1 (hooks in the shared server) or neither "
                    "(a second server gets them)")
    ok, why = suite.can_boot_secondary()
    if not ok:
        pytest.skip(f"{why}; to run this check on the shared server instead: {hooks.HOLD_ENV}={DEFAULT_HOLD_GIB} "
                    f"{hooks.SLOWDOWN_ENV}=1 pytest -m level5 -k 'sensitivity or held' ...")
    env = {hooks.HOLD_ENV: str(DEFAULT_HOLD_GIB), hooks.SLOWDOWN_ENV: "1"}
    with suite.boot(target, tag="__hooked", env_extra=env, beside_shared=True) as running:
        _EXTRA.add(running.stop)
        yield HookedServer(running, hooks.server_hook_dir(suite, running), DEFAULT_HOLD_GIB, False)


_EXTRA = StopAfterFolder(Path(__file__).parent)  # the hooked server (holding 1.5 GiB) stops after level 5's last test


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _EXTRA.after_test(nextitem)
