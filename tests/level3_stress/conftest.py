"""Level 3 fixtures: the server's limits, exact-length prompts, the 100-request run, and the crash-prone
cases' own server. The workloads and checks themselves are harness/stress/workload.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.engine.server import EngineCrashed
from harness.engine.server_metrics import metric_value
from harness.session.suite import RunningServer, StopAfterFolder, Suite
from harness.stress.workload import (
    SOURCE_TEXT,
    Limits,
    Prompts,
    Sacrificial,
    SequentialRun,
    run_sequential,
    bitwise_deterministic,
    server_limits,
    serves_normally,
)


@pytest.fixture(scope="session")
def limits(server: RunningServer, suite: Suite) -> Limits:
    return server_limits(server, suite)


@pytest.fixture(scope="session")
def prompts(server: RunningServer) -> Prompts:
    ids = server.client().tokenize(SOURCE_TEXT)
    if len(ids) < 50:
        raise SuiteError(f"the server tokenized the level 3 source text into only {len(ids)} tokens")
    return Prompts(ids)


@pytest.fixture(scope="session")
def sequential_run(server: RunningServer, suite: Suite, limits: Limits, prompts: Prompts) -> SequentialRun:
    """One warm-up cycle of the ten shapes, then 100 requests (the ten shapes, ten times, in order)."""
    return run_sequential(server, suite.platform.is_cuda, limits, prompts)


@pytest.fixture(scope="session")
def read_metric(server: RunningServer):
    """read_metric(name) -> the summed value of a Prometheus metric of the shared server."""
    return lambda name: metric_value(server.url, name)


@pytest.fixture(scope="session")
def deterministic(suite: Suite) -> bool:
    return bitwise_deterministic(suite.platform.name, suite.platform.device)


@pytest.fixture
def still_serves(live_server: RunningServer, prompts: Prompts):
    """still_serves(after) asserts the shared server's /health is 200 and a normal greedy request succeeds."""
    return lambda after: serves_normally(live_server, prompts, after)


@pytest.fixture(scope="session")
def sacrificial(suite: Suite, server: RunningServer):
    """The crash-prone tests' own server for this config (booted on first use, stopped after level 3's last test)."""
    if server.external:
        pytest.skip("--server-url: abusive requests would be sent to a server the suite cannot restart")
    ok, why = suite.can_boot_secondary()
    if not ok:
        pytest.skip(f"abusive requests need their own server beside the shared one, and {why}")
    s = Sacrificial(suite, server.target)
    _EXTRA.add(s.close)
    yield s
    s.close()


_EXTRA = StopAfterFolder(Path(__file__).parent)  # the crash-prone tests' server stops after level 3's last test


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _EXTRA.after_test(nextitem)


def assert_4xx_with_message(case: str, r) -> str:
    """The answer to an abusive request: a 4xx carrying an error message (returned)."""
    assert 400 <= r.status_code < 500, f"{case}: HTTP {r.status_code} (want 4xx): {r.text[:300]}"
    body = r.json()  # OpenAI-style {"error": {"message"}} or, for unparsable bodies, FastAPI's {"detail"}
    message = (body.get("error") or {}).get("message") or body.get("detail")
    assert message, f"{case}: a {r.status_code} without an error message: {r.text[:300]}"
    print(f"\n{case}: HTTP {r.status_code} {str(message)[:100]!r}")
    return str(message)


@pytest.fixture
def expect_4xx():
    """expect_4xx(case, response): the response is a 4xx with an error message (returned)."""
    return assert_4xx_with_message


@pytest.fixture
def abuse_server(sacrificial: Sacrificial, prompts: Prompts):
    """(server, after(case, status)): after fails once with EngineCrashed ("engine crashed on <case>") if the case
    killed the engine, else asserts the server still serves normally."""
    running = sacrificial.server()

    def after(case: str, status: int | None = None) -> None:
        crash = sacrificial.crash_report(case, answered_5xx=status is not None and status >= 500)
        if crash:
            raise EngineCrashed(crash)
        serves_normally(running, prompts, case)

    return running, after
