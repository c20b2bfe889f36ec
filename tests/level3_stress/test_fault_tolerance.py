"""Level 3: the suite itself survives a server crash.

A dedicated server's EngineCore is killed. Requests through the suite's client must then fail fast
(seconds, not the client's 300 s timeout) with a SuiteError, ending in ServerDied carrying the log
tail; stopping it must leave no process of its group; the shared server must not notice.
"""
import time

import psutil
import pytest

from harness.core.errors import SuiteError
from harness.engine.server import ServerDied, group_pids

pytestmark = [pytest.mark.level3, pytest.mark.server]

FAST_S = 10.0  # each failing request must return within this (the client's timeout is 300 s)
MAX_ATTEMPTS, MAX_WAIT_S = 30, 90.0  # bounds of the wait for ServerDied


def _engine_core(api_pid: int) -> psutil.Process:
    children = psutil.Process(api_pid).children(recursive=True)
    engines = [p for p in children if "EngineCore" in p.name() or any("EngineCore" in a for a in p.cmdline()[:1])]
    if not engines:
        names = [(p.pid, p.name()) for p in children]
        raise SuiteError(f"no EngineCore among the API server's children {names}; vLLM renamed its processes?")
    return engines[0]


def test_killed_engine_fails_requests_fast_and_teardown_leaves_nothing(suite, target, booted, record_property):
    ok, why = suite.can_boot_secondary()
    if not ok:
        pytest.skip(why)
    shared_pids = set(booted.process.pids())
    with suite.boot(target, tag="__fault", beside_shared=True) as running:
        pgid = running.process.proc.pid
        client = running.client()  # the default 300 s timeout: failing fast must not rely on it
        assert client.complete("def main():\n", 4)["usage"]["completion_tokens"] >= 1
        engine = _engine_core(pgid)
        engine.kill()
        engine.wait(timeout=10)
        killed_at = time.monotonic()
        errors: list[tuple[float, SuiteError]] = []
        for _ in range(MAX_ATTEMPTS):
            if time.monotonic() - killed_at > MAX_WAIT_S:
                break
            t0 = time.monotonic()
            with pytest.raises(SuiteError) as caught:
                client.complete("def main():\n", 4)
            errors.append((time.monotonic() - t0, caught.value))
            if isinstance(caught.value, ServerDied):
                break
            time.sleep(0.5)
        died_after = time.monotonic() - killed_at
    seen = "\n  ".join(f"{s:.2f} s {type(e).__name__}: {str(e).splitlines()[0][:150]}" for s, e in errors)
    print(f"\nafter killing EngineCore: {len(errors)} failing request(s), ServerDied {died_after:.1f} s after the kill:\n  {seen}")
    record_property("server_died_after_s", round(died_after, 2))
    slow = [s for s, _ in errors if s > FAST_S]
    assert not slow, f"requests to a dead engine took {slow} s (> {FAST_S} s): the suite would hang on a crashed server"
    assert errors and isinstance(errors[-1][1], ServerDied), (
        f"no ServerDied within {MAX_ATTEMPTS} requests / {MAX_WAIT_S:.0f} s of killing EngineCore; saw:\n  {seen}")
    message = str(errors[-1][1])
    quoted = message.splitlines()[1:]
    log_text = running.log_text()
    assert str(running.log_path) in message, f"ServerDied does not name the log: {message[:200]}"
    assert len(quoted) >= 5 and all(line in log_text for line in quoted), "ServerDied does not carry the log's tail"
    assert group_pids(pgid) == [], f"processes of the killed server's group {pgid} survive its stop()"
    # the shared server of this config never noticed
    booted.ensure_alive()
    assert set(booted.process.pids()) == shared_pids
    shared = booted.client()
    assert shared.health() == 200
    assert shared.complete("def main():\n", 4)["usage"]["completion_tokens"] >= 1
