"""Tests of level 3's own checks: each must fail on the fault it guards against. The fake server here is a unit-test
double of a server that misbehaves; that level 3 passes on real vLLM is shown by level 3 itself (CI runs it)."""
import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.errors import SuiteError
from harness.engine.client import Client
from harness.engine.server import flag_value, free_port
from harness.stress.workload import server_limits
from tests.unit.loopback import STREAM_HEAD, chunk, loopback_server

REPO = Path(__file__).resolve().parents[2]
SERIAL = REPO / "tests" / "unit" / "fixtures" / "serial_server.py"


@contextlib.contextmanager
def serial_server(*extra: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERIAL), str(port), *extra])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _level3(url: str, tests: str, tmp_path: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "level3", "-k", tests,
                        f"--server-url={url}", "--config=cpu-bf16", f"--run-dir={tmp_path}", "-rfs"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    return r.stdout + r.stderr


def test_a_server_that_runs_one_request_at_a_time_fails_every_concurrency_level(tmp_path):
    """Its /metrics truthfully says one running; with --server-url the suite does not know --max-num-seqs, and the
    polled "at most N running" bound had passed such a server at every level."""
    with serial_server() as url:
        out = _level3(url, "test_concurrent_requests", tmp_path)
    assert out.count("did not run them together") >= 3 and "3 failed" in out, out[-3000:]


def test_requests_that_fail_partway_leave_drift_unjudged_not_improved(tmp_path):
    """The last 40 of 100 requests refused at once: the last decile got faster (drift ~0.02 had passed as fine) and
    memory stopped growing. The drift check must say it cannot judge; the memory of an external server is skipped with
    its reason, and a server without vLLM's KV gauge skips the KV check with its reason."""
    with serial_server("70") as url:
        out = _level3(url, "test_sequential", tmp_path)
    assert "40 of 100 requests failed or were malformed (first: request failed" in out and "so this cannot be judged" in out
    assert "FAILED tests/level3_stress/test_sequential.py::test_latency_does_not_drift_over_100_requests[" in out, out[-3000:]
    assert "the memory of a server the suite did not boot cannot be read" in out
    assert "no KV-cache usage gauge" in out


@pytest.mark.parametrize("argv, want", [
    (["--max-num-seqs", "2"], "2"),
    (["--max-num-seqs", "2", "--max-num-seqs=8"], "8"),  # --server-arg comes after the config's flags and wins
    (["--max-num-seqs=8", "--max-num-seqs", "3"], "3"),
    (["--max-num-seqs-x=9"], None),
    ([], None),
])
def test_a_flag_is_read_as_argparse_reads_it(argv, want):
    assert flag_value(argv, "--max-num-seqs") == want


def test_level3_scales_to_the_max_num_seqs_the_server_was_booted_with():
    """A --server-arg=--max-num-seqs=8 once left level 3 sure of the config's 2: its "over the limit" case sent 6."""
    models = SimpleNamespace(status_code=200, json=lambda: {"data": [{"max_model_len": 4096}]})
    server = SimpleNamespace(external=False, client=lambda: SimpleNamespace(get=lambda path: models),
                             process=SimpleNamespace(argv_extra=["--max-num-seqs", "2", "--max-num-seqs=8"]))
    suite = SimpleNamespace(model=SimpleNamespace(path="/nonexistent"))
    assert server_limits(server, suite).max_num_seqs == 8


def test_a_server_that_dies_mid_stream_is_one_suite_error_not_a_requests_traceback(request):
    def answer(conn, stop) -> None:
        conn.sendall(STREAM_HEAD + chunk(b'data: {"choices":[{"text":"a","logprobs":{"tokens":["a"]}}]}\n\n'))
        conn.sendall(b"ff\r\npartial")  # the process dies mid-chunk
        conn.shutdown(socket.SHUT_RDWR)

    client = Client(loopback_server(request, answer), "model", timeout_s=10)
    with pytest.raises(SuiteError) as e:
        client.stream([1, 2, 3], 8)
    assert "broke mid-answer" in str(e.value) and "\n" not in str(e.value)
