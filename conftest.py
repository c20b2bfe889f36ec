"""Suite plumbing: options, platform skips, one real vLLM server per configuration, summaries.

Tests that take the `server` (or `target`) fixture are parametrized by the selected configurations;
pytest groups them so each configuration's server boots once and serves every level.
"""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.core.paths import TESTS_DIR, shown, writable_dir
from harness.core.platform import UNKNOWN_PLATFORM, detect_platform, forced_platform_problem
from harness.core.store import regen_command
from harness.correctness.goldens import GoldenStore, golden_path, recorded_kinds
from harness.engine.devices import check_slot_settings, gpus_needed, set_wait_notice
from harness.engine.server import install_cleanup, tail
from harness.features.measure import check_rounds
from harness.features.spec import selected_features
from harness.kernelpath.check import profile_kernel_path
from harness.perf.bench import check_workloads_option
from harness.perf.benchmark import run_benchmark
from harness.plugin import known_issues, parallel
from harness.plugin.parallel import configure_worker
from harness.report.listing import list_configs, run_summary
from harness.report.run_report import write_run_report
from harness.session.suite import SUITE_KEY, RunningServer, Suite, Target, merge_boots, refuse_empty

# The suite's command-line options live in a plugin that an editable install (scripts/setup.sh) also
# registers as a pytest entry point, so `--run-dir /some/dir` parses before pytest picks its rootdir.
# harness.plugin.parallel: xdist (`-n N`): one worker per config, one GPU per worker, one shared run dir.
pytest_plugins = ["harness.plugin.options", "harness.plugin.parallel"]
GPU_ONLY_NOT_RUN = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("syrupy"):
        # the listing snapshot's test is deselected by any -m level run; with a -k expression syrupy then counted
        # its snapshot as unused and ended a run of green tests with exit code 1 (seen on an H200: 46 passed, rc 1).
        # A changed listing still fails its own test.
        config.option.warn_unused_snapshots = True
    configure_worker(config)  # an xdist worker: pin its GPU and join the run dir before anything else
    # SIGTERM / SIGHUP stop the run like Ctrl-C (KeyboardInterrupt): an xdist controller then shuts its workers down
    # and they stop their servers (a SIGTERM'd controller's workers used to exit without their cleanup; each
    # server's reaper is the last resort)
    install_cleanup()
    set_wait_notice(lambda text: _tell_now(config, text))
    try:
        if config.getoption("--allow-unverified") and not config.getoption("force_regen"):
            raise SuiteError("--allow-unverified only widens what --force-regen may record; add --force-regen, or drop it")
        check_slot_settings()
        config.stash[SUITE_KEY] = suite = _create_suite(config)
        of = goldens_of(config, suite)  # a wrong --goldens-of stops the run before any server boots
        if of and _selects_level(config, "level2", TESTS_DIR / "level2_correctness"):
            check_goldens_recorded(suite, of)
        if config.getoption("--review-dir"):  # written after a feature's measurements: an unwritable one is found now
            writable_dir(Path(config.getoption("--review-dir")), "--review-dir")
        if config.getoption("--feature-rounds"):
            check_rounds(config.getoption("--feature-rounds"))
        if any(config.getoption(o) for o in ("--feature", "--against", "--criteria")):  # a bad name: one line now
            selected_features(suite.catalog, suite.platform.name, suite.flavour.name, config.getoption("--feature"),
                              config.getoption("--against"), config.getoption("--config"), config.getoption("--criteria"))
    except SuiteError as e:
        raise pytest.UsageError(str(e)) from None


def _tell_now(config: pytest.Config, text: str) -> None:
    """A line on the terminal now, past pytest's capture (a wait for another run's server slot)."""
    capture, reporter = (config.pluginmanager.get_plugin(n) for n in ("capturemanager", "terminalreporter"))
    # a server booted ahead waits on its own thread: suspending the capture there would race the running test's
    if capture is None or reporter is None or threading.current_thread() is not threading.main_thread():
        print(text, file=sys.stderr, flush=True)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(text)


def goldens_of(config: pytest.Config, suite: Suite) -> str | None:
    """The configuration whose goldens level 2 judges against (--goldens-of), checked; None: each its own."""
    of = config.getoption("goldens_of")
    if not of:
        return None
    if config.getoption("force_regen"):
        raise SuiteError(f"--goldens-of={of} judges against another configuration's goldens and never writes them; "
                         f"drop --force-regen, or drop --goldens-of to record a configuration's own")
    return suite.catalog.name(suite.catalog.parse(of, "--goldens-of"))


def check_goldens_recorded(suite: Suite, of: str) -> None:
    """--goldens-of a config with no level 2 goldens for this model and platform: one line now, not a failed test per
    golden after the boot."""
    model = suite.model_or_error
    # not checked: a model that did not resolve (its own error comes at the boot), a shape model (no goldens by
    # design: level 2 skips), --server-url without --platform (the goldens fixture names that)
    if isinstance(model, SuiteError) or not model.has_real_weights or suite.platform.name == UNKNOWN_PLATFORM:
        return
    folder = suite.golden_folder()
    if not recorded_kinds(model.alias, folder, of):
        where = shown(golden_path(model.alias, folder, of, "level2").parent)
        raise SuiteError(f"--goldens-of={of}: no level 2 goldens of {of} for {model.alias} on {folder} (in {where}/); "
                         f"record them first: {regen_command('level2', of, model.alias)}")


def _selects_level(config: pytest.Config, marker: str, folder: Path) -> bool:
    """Whether this run's paths and -m expression can select the tests of `folder`, which carry `marker` and
    `server` (-k is not known before collection: a -k that deselects them all still counts)."""
    base = config.invocation_params.dir
    paths = [(base / str(a).split("::", 1)[0]).resolve() for a in config.args]
    if not any(folder.is_relative_to(p) or p.is_relative_to(folder) for p in paths):
        return False
    expr = config.option.markexpr
    if not expr:
        return True
    from _pytest.mark.expression import Expression  # how pytest itself evaluates -m

    try:
        return Expression.compile(expr).evaluate(lambda name, **kwargs: name in (marker, "server"))
    except SyntaxError:
        return False  # pytest names a malformed -m itself
    except Exception:  # noqa: BLE001 - a private API of pytest that changed: check, as a run of every level would
        return True


# Options whose empty value (an unset shell variable) was taken for no option: the default ran in silence, or nothing
# at all (`--feature=` under -m feature). Suite.create refuses its own (--model, --flavour, --server-url, --run-dir,
# --platform, --device) for the scripts too; --config has its own line (select).
_NAMED_OPTIONS = ("--workloads", "--goldens-of", "--feature", "--against", "--criteria", "--review-dir")


def _create_suite(config: pytest.Config) -> Suite:
    problem = forced_platform_problem()
    if problem:
        raise SuiteError(problem)
    refuse_empty({option: config.getoption(option) for option in _NAMED_OPTIONS})
    suite = Suite.create(
        config.getoption("--config"), config.getoption("--model"), config.getoption("--flavour"),
        config.getoption("--server-url"), config.getoption("--run-dir"), config.getoption("--boot-timeout"),
        platform_option=config.getoption("--platform"), device_option=config.getoption("--device"),
        server_args=config.getoption("--server-arg"), allow_unverified=config.getoption("--allow-unverified"),
    )
    try:
        check_workloads_option(config.getoption("--workloads"), suite.platform.name)
    except SuiteError:
        suite.drop_run_dir_if_empty()  # refused before the suite is stashed, so unconfigure cannot drop it
        raise
    return suite


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """`--list-configs` prints and exits before any collection (it boots nothing)."""
    if not config.getoption("--list-configs"):
        return None

    try:
        suite = _create_suite(config)
    except SuiteError as e:
        print(f"ERROR: {e}")
        return 4
    print(list_configs(suite))
    suite.drop_run_dir_if_empty()  # configure and unconfigure do not run after a cmdline_main that answered
    return 0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        suite = metafunc.config.stash[SUITE_KEY]
        targets = suite.targets()
        metafunc.parametrize("target", targets, ids=[t.name for t in targets], indirect=True, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite = config.stash[SUITE_KEY]
    try:
        issues = known_issues.load()
        engine, version = suite.engine_version()  # a --server-url server that died since its probe: one line
    except SuiteError as e:
        raise pytest.UsageError(str(e)) from None
    live = [i for i in issues if i.applies(engine, version, suite.platform.name)]
    here = detect_platform()  # this machine, where kernel tests run (an external server may be elsewhere)
    if not here.is_cuda:
        # one line for all of them at the end of the run, not one skip line per test (200+ on a CPU main job)
        gpu_only = [item for item in items if "gpu" in item.keywords]
        if gpu_only:
            items[:] = [item for item in items if "gpu" not in item.keywords]
            config.hook.pytest_deselected(items=gpu_only)
            config.stash[GPU_ONLY_NOT_RUN] = (f"{len(gpu_only)} GPU-only tests not run: they need a CUDA GPU and this "
                                              f"machine is cpu ({here.device}); run them on a GPU machine (-m gpu)")
    for item in items:
        for issue in live:
            if issue.matches(item.nodeid):
                item.add_marker(pytest.mark.xfail(strict=True, raises=issue.raises, reason=issue.reason()))


@pytest.fixture(scope="session")
def suite(request: pytest.FixtureRequest) -> Suite:
    return request.config.stash[SUITE_KEY]


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest, suite: Suite) -> Target:
    t: Target = request.param
    if not t.runnable:
        pytest.skip(t.reason)
    return t


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest, suite: Suite, target: Target):
    """One real vLLM server per (model, config), shared by every level, torn down at the end."""
    if suite.server_url:
        yield suite.external(target)
        return
    worker, cuda = parallel.worker_id(request.config), suite.platform.is_cuda
    need = gpus_needed(target.spec.args)
    gpus = parallel.all_gpus(request.config) if cuda else []
    if cuda and need > len(gpus):
        pytest.skip(f"{target.name}: its server needs {need} GPUs (parallel sizes in its flags), {len(gpus)} visible")
    # under xdist: wait for this worker's GPU(s) (CPU: the machine's one server slot) before booting
    with parallel.server_slot(worker, gpus, need, cuda) as env:
        with suite.boot(target, env_extra=env or None) as running:  # records the boot (per worker under xdist)
            yield running


@pytest.fixture
def live_server(server: RunningServer) -> RunningServer:
    """The shared server, checked alive first: a dead server fails the test at once with its log."""
    server.ensure_alive()
    return server


@pytest.fixture
def client(live_server: RunningServer):
    return live_server.client()


@pytest.fixture
def booted(live_server: RunningServer) -> RunningServer:
    """For checks that need the server's own log or process (skipped with --server-url)."""
    if live_server.external:
        pytest.skip("--server-url: the server was not booted by the suite, so its log, flags and processes cannot be checked")
    return live_server


@pytest.fixture(scope="session")
def kernel_path(suite: Suite, server: RunningServer):
    """Level 1.5 evidence for this config: kernels seen in a profiled prefill + decode, checked.

    Session-scoped, so level 4 gets it too: a perf result always carries the path check it ran under.
    """
    if server.external:
        pytest.skip("--server-url: the suite cannot enable the profiler of a server it did not boot")

    return profile_kernel_path(suite, server)


@pytest.fixture(scope="session")
def perf_results(request: pytest.FixtureRequest, suite: Suite, server: RunningServer):
    """Level 4 results of this config (session-scoped: level 5 gates the same run)."""
    path = None
    if not server.external:
        path = request.getfixturevalue("kernel_path")
    workloads = request.config.getoption("--workloads")
    return run_benchmark(suite, server, path, Path(workloads) if workloads else None)


@pytest.fixture(scope="session")
def goldens(request: pytest.FixtureRequest, suite: Suite, server: RunningServer):
    """This config's goldens (or, with --goldens-of, another config's): `load(kind, level)` (None under
    --force-regen) and `save(kind, fresh)`.

    A run may only write goldens when its kernel path is known good: level 1.5 passed with nothing
    excused (or the config allows excuses), so a golden never records a silent fallback.
    """
    def refusal() -> str | None:
        return suite.record_refusal(server, request)

    regen = bool(request.config.getoption("force_regen"))
    golden_config = goldens_of(request.config, suite) or server.target.name
    platform = suite.keyed_platform()
    meta = {"model": suite.model.alias, "config": server.target.name, "platform": platform.name,
            "device": platform.device, "flavour": suite.flavour.name,
            "vllm": server.client().version() if regen else None,
            "kernel_path": suite.kernel_path_note(server),
            # --server-arg changes what runs: a golden recorded with it must not judge the plain config
            "server_args": list(request.config.getoption("--server-arg") or [])}
    return GoldenStore(suite.model.alias, platform.name, golden_config, meta, regen, refusal,
                       model_fingerprint=suite.model.fingerprint, run_dir=suite.run_dir,
                       folder=suite.golden_folder())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    callspec = getattr(item, "callspec", None)
    if callspec is not None:  # the summary table's config column (xdist carries report attributes to the controller)
        report.param_id = callspec.id
    if call.excinfo is not None and call.excinfo.errisinstance(SuiteError):
        # A SuiteError already says what is wrong and how to fix it: no traceback.
        report.longrepr = f"{call.excinfo.typename}: {call.excinfo.value}"
    running = getattr(item, "funcargs", {}).get("server")
    if report.failed and isinstance(running, RunningServer) and running.log_path:
        report.sections.append(("vLLM server log (tail)", f"{running.log_path}\n{tail(running.log_path, 30)}"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    suite = session.config.stash.get(SUITE_KEY, None)
    if suite is None:
        return
    worker = parallel.worker_id(session.config)
    if worker:  # an xdist worker: its boots are in its own file already; the controller reports for everyone
        return
    if parallel.is_controller(session.config):
        suite.boots = merge_boots(suite.run_dir)
    if not (suite.run_dir / "results").is_dir():
        return

    try:
        suite.report_files = write_run_report(suite.run_dir)
    except SuiteError as e:  # a report problem must not hide the test outcome
        suite.report_files = [f"(report not written: {e})"]


def pytest_unconfigure(config: pytest.Config) -> None:
    suite = config.stash.get(SUITE_KEY, None)
    # the controller's, after every worker ended: a worker joins the controller's run dir through --run-dir
    if suite is not None and not parallel.worker_id(config):
        suite.drop_run_dir_if_empty()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    suite = config.stash.get(SUITE_KEY, None)
    if suite is None or config.getoption("--list-configs"):
        return

    not_run = config.stash.get(GPU_ONLY_NOT_RUN, None)
    if not_run:
        terminalreporter.write_line(not_run)
    text = run_summary(suite, terminalreporter.stats)
    if text:
        terminalreporter.write_sep("=", "gpt-oss suite summary")
        terminalreporter.write_line(text)
    for f in getattr(suite, "report_files", []):
        terminalreporter.write_line(f"report: {f}")
