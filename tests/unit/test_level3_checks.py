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
from harness.engine.client import Client, StreamResult
from harness.engine.server import flag_value, free_port
from harness.stress.burst import Burst, bursts_until_together
from harness.stress.workload import (
    Limits,
    Outcome,
    Prompts,
    Sacrificial,
    SequentialRun,
    Shape,
    bitwise_deterministic,
    check_completion,
    check_stream,
    idle_kv_usage,
    run_one,
    run_sequential,
    serves_normally,
    server_limits,
    shapes,
)
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


def _bursts(overlaps: list[float]):
    """A burst source whose k-th burst has overlap overlaps[k] (two requests, 1 s of wall time)."""
    it = iter(overlaps)
    return lambda: Burst(results=[None, None], latencies_s=[0.5, 0.5], wall_s=1.0, queued_s=0.0,
                         running_s=next(it), prefix_hits=None)


@pytest.mark.parametrize("overlaps, tried, together", [
    ([1.8], 1, True),  # the usual burst: no retry
    ([0.9, 1.8], 2, True),  # the CI burst whose second request reached the engine late, then a normal one
    ([0.9, 0.95, 1.7], 3, True),
    ([0.99, 0.98, 0.97, 1.9], 3, False),  # a one-at-a-time server never passes: the fourth burst is never tried
])
def test_bursts_are_retried_until_one_runs_its_requests_together_at_most_three_times(overlaps, tried, together):
    bursts = bursts_until_together(_bursts(overlaps), 1.3, 3)
    assert len(bursts) == tried
    assert (bursts[-1].overlap >= 1.3) is together


def test_a_single_attempt_is_one_burst_whatever_its_overlap():
    assert len(bursts_until_together(_bursts([0.5, 1.9]), 1.3, 1)) == 1
    with pytest.raises(ValueError):
        bursts_until_together(_bursts([1.9]), 1.3, 0)


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


# -- the checks of each answer, the prompts and the run's arithmetic, without a server ------------------------------
def _completion(n: int = 8, prompt: int = 16, finish: str = "length") -> dict:
    return {"choices": [{"text": "x" * n, "finish_reason": finish, "logprobs": {"token_logprobs": [-0.5] * n}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": n}}


def _edit(out: dict, **changes) -> dict:
    choice, usage = out["choices"][0], out["usage"]
    for key, value in changes.items():
        (usage if key in usage else choice["logprobs"] if key == "token_logprobs" else choice)[key] = value
    return out


def test_a_well_formed_completion_passes():
    assert check_completion(_completion(), Shape(16, 8, False)) is None
    assert check_completion(_completion(3, finish="stop"), Shape(16, 8, False)) is None  # EOS before max_tokens


@pytest.mark.parametrize("changes, said", [
    ({"prompt_tokens": 15}, "usage.prompt_tokens 15 != 16 sent"),
    ({"completion_tokens": 0, "token_logprobs": [], "finish_reason": "stop"}, "completion_tokens 0 outside 1..8"),
    ({"completion_tokens": 9, "token_logprobs": [-0.5] * 9}, "completion_tokens 9 outside 1..8"),
    ({"completion_tokens": 5, "token_logprobs": [-0.5] * 5}, "finish_reason length after 5 of 8 tokens"),
    ({"token_logprobs": [-0.5] * 7}, "7 logprobs for 8 tokens"),
    ({"token_logprobs": [-0.5] * 7 + [float("nan")]}, "finite: False"),
    ({"finish_reason": "abort"}, "finish_reason 'abort'"),
])
def test_a_malformed_completion_is_named(changes, said):
    problem = check_completion(_edit(_completion(), **changes), Shape(16, 8, False))
    assert problem is not None and said in problem, problem


def _stream(n: int = 8, prompt: int = 16, finish: str | None = "length", chunks: int = 8) -> StreamResult:
    return StreamResult("x" * n, [0.1 * i for i in range(chunks)], chunks, {"prompt_tokens": prompt, "completion_tokens": n},
                        0.0, 1.0, finish)


@pytest.mark.parametrize("stream, said", [
    (_stream(prompt=17), "usage.prompt_tokens 17 != 16 sent"),
    (_stream(n=7), "streamed 7 tokens with ignore_eos, asked 8"),  # ignore_eos: exactly max_tokens, never fewer
    (_stream(finish="stop"), "stream finish_reason 'stop'"),
    (_stream(chunks=0), "no text chunks"),
])
def test_a_stream_is_held_to_exactly_max_tokens_ending_at_length(stream, said):
    assert check_stream(_stream(), Shape(16, 8, True)) is None
    problem = check_stream(stream, Shape(16, 8, True))
    assert problem is not None and said in problem, problem


def test_prompts_have_the_exact_length_asked_and_variants_differ():
    prompts = Prompts(list(range(50)))
    for n in (1, 49, 50, 51, 2048):
        assert len(prompts.ids(n)) == n and len(prompts.ids(n, variant=3)) == n
    assert prompts.ids(0) == [] and prompts.ids(20, 1) != prompts.ids(20, 2)


def test_every_request_shape_fits_the_context_and_the_longest_prompt_is_half_of_it():
    mix = shapes(4096)
    assert len(mix) == 10 and max(s.prompt_tokens for s in mix) == 2048
    assert all(s.prompt_tokens + s.max_tokens <= 4096 for s in mix)
    assert max(s.prompt_tokens for s in shapes(131072)) == 8192  # a long context keeps the listed lengths


def _run(seconds) -> SequentialRun:
    return SequentialRun([Outcome(Shape(16, 1, False), s, None) for s in seconds], 1, 1, 1, "RSS", sum(seconds))


def test_drift_compares_each_shapes_fastest_of_the_last_three_cycles_with_the_first_three():
    # cycles 7, 8 and 9 (the last three of ten) twice as slow: their minima doubled
    run = _run([1.0] * 70 + [2.0] * 30)
    assert run.floor_drift() == pytest.approx(2.0)
    assert run.decile_seconds(0) == pytest.approx(10.0) and run.decile_seconds(9) == pytest.approx(20.0)
    # one slow request per shape (contention) leaves the minima alone
    assert _run([1.0] * 90 + [5.0] * 10).floor_drift() == pytest.approx(1.0)


def test_a_request_that_raises_is_a_failed_outcome_not_a_pass():
    def refuse(*args, **kwargs):
        raise SuiteError("HTTP 500 from the server")

    client = SimpleNamespace(complete=refuse, stream=refuse)
    for shape in (Shape(16, 8, False), Shape(16, 8, True)):
        out = run_one(client, Prompts(list(range(50))), shape, 0)
        assert out.problem == "request failed: HTTP 500 from the server"
        assert SequentialRun([out] + _run([1.0] * 99).outcomes, 1, 1, 1, "RSS", 1.0).failed == [out]


def test_greedy_outputs_are_held_bitwise_only_on_the_machines_measured_deterministic():
    assert bitwise_deterministic("cpu", "AMD EPYC 7763 64-Core Processor")
    assert not bitwise_deterministic("cpu", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz")
    assert not bitwise_deterministic("sm_90", "AMD EPYC 7763 64-Core Processor")


def _sacrificial(alive: bool, health: int) -> Sacrificial:
    s = Sacrificial(suite=None, target=None)
    s.running = SimpleNamespace(process=SimpleNamespace(alive=lambda: alive), client=lambda timeout_s: SimpleNamespace(
        health=lambda: health), log_text=lambda: "INFO start\nERROR EngineCore died: CUDA error\nINFO bye", log_path="x.log")
    return s


def test_an_engine_that_answers_no_more_is_a_crash_even_while_its_api_process_lingers():
    assert _sacrificial(alive=True, health=200).crash_report("case") is None
    for alive, health in ((True, 503), (False, 200)):
        report = _sacrificial(alive, health).crash_report("case")
        assert report and report.startswith("engine crashed on case: ERROR EngineCore died: CUDA error"), report


def test_a_server_whose_health_is_not_200_does_not_serve_normally():
    client = SimpleNamespace(health=lambda: 503, complete=lambda *a, **k: _completion(8, 32))
    server = SimpleNamespace(client=lambda timeout_s: client, ensure_alive=lambda: None)
    with pytest.raises(AssertionError, match="/health answered 503 after the case"):
        serves_normally(server, Prompts(list(range(50))), "the case")


def test_the_kv_cache_is_read_once_nothing_runs_or_waits(monkeypatch):
    """Read while the last request still held its blocks, the level after warm-up would be high and hide a leak."""
    monkeypatch.setattr("harness.stress.workload.time.sleep", lambda s: None)
    pages = iter(["vllm:kv_cache_usage_perc 0.05\nvllm:num_requests_running 1\nvllm:num_requests_waiting 0\n",
                  "vllm:kv_cache_usage_perc 0.04\nvllm:num_requests_running 0\nvllm:num_requests_waiting 1\n",
                  "vllm:kv_cache_usage_perc 0.0\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"])
    client = SimpleNamespace(get=lambda path, timeout_s: SimpleNamespace(text=next(pages)))
    assert idle_kv_usage(SimpleNamespace(client=lambda: client)) == 0.0


def test_a_failed_warm_up_request_stops_the_run(monkeypatch):
    """Every request counts: one that fails in the warm-up cycle is not dropped before the 100 are judged."""
    monkeypatch.setattr("harness.stress.workload.time.sleep", lambda s: None)
    answers = iter([{"choices": []}])  # the first warm-up request gets a malformed answer
    client = SimpleNamespace(complete=lambda *a, **k: next(answers, _completion(1, 16)))
    server = SimpleNamespace(client=lambda **k: client, external=True)
    with pytest.raises(SuiteError, match="warm-up request .* failed: malformed answer"):
        run_sequential(server, False, Limits(4096, None, None), Prompts(list(range(50))))


class _Answer(SimpleNamespace):
    def json(self) -> dict:
        return self.body


@pytest.mark.parametrize("status, body, ok", [
    (400, {"error": {"message": "max_tokens must be at least 1"}}, True),
    (422, {"detail": "body is not JSON"}, True),  # FastAPI's own answer to an unparsable body
    (499, {"error": {"message": "client closed"}}, True),
    (500, {"error": {"message": "internal error"}}, False),  # the engine failed on it: never a well-handled refusal
    (399, {"error": {"message": "odd"}}, False),
    (200, {"choices": []}, False),  # answered the abusive request as if it were fine
    (400, {"error": {}}, False),  # refused without saying why
])
def test_an_abusive_request_must_get_a_4xx_that_says_why(status, body, ok):
    from tests.level3_stress.conftest import assert_4xx_with_message

    answer = _Answer(status_code=status, body=body, text=str(body))
    if ok:
        assert assert_4xx_with_message("case", answer)
    else:
        with pytest.raises(AssertionError, match=f"case: .*{status}"):
            assert_4xx_with_message("case", answer)
