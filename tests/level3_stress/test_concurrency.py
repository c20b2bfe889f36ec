"""Level 3 (the users' plan): concurrent requests (2, 4, and more than --max-num-seqs, so some must queue).

Every concurrent greedy output must equal the sequential one: bitwise where the platform is
deterministic (CPU, measured), else within the level 2 stream rule (harness/correctness/logprobs.py compare_streams,
with the level 2 tolerance of this platform).
"""
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.core.errors import SuiteError
from harness.correctness.level2 import load_workload
from harness.correctness.logprobs import Stream, compare_streams

pytestmark = [pytest.mark.level3, pytest.mark.server]

MAX_TOKENS = 128  # long enough (seconds on CPU) for /metrics polling to see the queue
TOP_K = 5
QUEUED_MIN_S = 0.05  # summed engine queue time that counts as "requests waited for a slot"
# Engine running time summed over a burst's requests, over the burst's wall time. A server that runs one request at a
# time cannot exceed 1 (its requests' running intervals are disjoint); two requests run together give ~2 less the
# HTTP and tokenization time around them (1.74-1.96 on the CPU server, 2 to 6 requests). Nor can it exceed the most
# requests running at once, which bounds --max-num-seqs whatever /metrics polling saw: on a loaded 2-core machine one
# /metrics read outlasted a 1.3 s burst. The slack covers a preempted request, whose running time counts its wait.
MIN_OVERLAP = 1.3
OVERLAP_SLACK = 0.25
LEVELS = ["2", "4", "max-num-seqs+4"]


def _count(level: str, limits) -> int:
    return int(level) if level.isdigit() else (limits.max_num_seqs or 2) + 4


def _greedy(client, prompts, i: int, salt: str) -> Stream:
    """Request i's greedy stream. `salt` and i scope vLLM's prefix cache (cache_salt): each request computes its prompt
    itself, or a burst would read most of its KV from the reference run's cache (65% of its prompt tokens on the CPU
    server) and never exercise concurrent prefill; per request, because with many requests (a large --max-num-seqs)
    two prompts can start at the same offset of the source text."""
    ids = prompts.ids(40 + 50 * i, variant=100 + i)  # different lengths and contents
    out = client.complete(ids, MAX_TOKENS, logprobs=TOP_K, return_tokens_as_token_ids=True, ignore_eos=True,
                          cache_salt=f"{salt}-{i}")
    return Stream.from_completion(out, ids)


@pytest.fixture(scope="module")
def sequential_streams(server, prompts, limits):
    client = server.client(timeout_s=120)
    n = max(_count(level, limits) for level in LEVELS)
    return [_greedy(client, prompts, i, f"sequential-{uuid.uuid4()}") for i in range(n)]


class SchedulerWatch:
    """Polls /metrics while a burst runs: the most requests seen running and waiting at once, and how many readings
    saw the burst (some request running or waiting): with none, "never more than --max-num-seqs" was not observed."""

    def __init__(self, read_metric, interval_s: float = 0.05):
        self.read, self.interval = read_metric, interval_s
        self.max_running = self.max_waiting = 0.0
        self.samples = self.busy_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                running, waiting = self.read("vllm:num_requests_running"), self.read("vllm:num_requests_waiting")
                self.max_running, self.max_waiting = max(self.max_running, running), max(self.max_waiting, waiting)
                self.samples += 1
                self.busy_samples += running + waiting > 0
            except Exception:  # a slow /metrics answer must not kill the watcher; the burst is the test
                pass
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)


@pytest.fixture(scope="module")
def prefix_cache(read_metric) -> bool:
    """Whether the server counts prefix-cache hits (vLLM with prefix caching on)."""
    try:
        read_metric("vllm:prefix_cache_hits_total")
    except SuiteError:
        return False
    return True


@pytest.mark.parametrize("level", LEVELS)
def test_concurrent_requests_all_succeed_and_match_sequential(level, live_server, prompts, limits, sequential_streams,
                                                               deterministic, read_metric, suite, prefix_cache):
    tolerance = load_workload().tolerance(suite.platform.name)
    n = _count(level, limits)
    client = live_server.client(timeout_s=120)
    start = threading.Barrier(n, timeout=30)

    def one(i: int) -> tuple[Stream, float]:
        start.wait()
        t = time.monotonic()
        return _greedy(client, prompts, i, salt), time.monotonic() - t

    salt = f"concurrent-{level}-{uuid.uuid4()}"
    queued0, count0 = read_metric("vllm:request_queue_time_seconds_sum"), read_metric("vllm:request_queue_time_seconds_count")
    running0 = read_metric("vllm:request_inference_time_seconds_sum")
    hits0 = read_metric("vllm:prefix_cache_hits_total") if prefix_cache else None
    t0 = time.monotonic()
    with SchedulerWatch(read_metric) as watch, ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        done = [f.result(timeout=300) for f in futures]  # a failed request raises here
    wall = time.monotonic() - t0
    results, latencies = [d[0] for d in done], [d[1] for d in done]
    live_server.ensure_alive()
    deadline = time.monotonic() + 10  # finished-request stats reach /metrics right after the answers
    while read_metric("vllm:request_queue_time_seconds_count") - count0 < n and time.monotonic() < deadline:
        time.sleep(0.1)
    queued = read_metric("vllm:request_queue_time_seconds_sum") - queued0
    # summed time the engine spent running these requests (prefill + decode) over the burst's wall time: at most 1 for
    # a server that runs one request at a time, ~n for n requests run together
    overlap = (read_metric("vllm:request_inference_time_seconds_sum") - running0) / wall
    hits = read_metric("vllm:prefix_cache_hits_total") - hits0 if prefix_cache else None
    print(f"\n{n} concurrent requests in {wall:.1f} s (fastest {min(latencies):.2f} s); time spent queued, summed: "
          f"{queued:.2f} s; engine running time / wall {overlap:.2f}; prefix-cache hits {hits}; /metrics polled "
          f"{watch.samples}x ({watch.busy_samples} during the burst): at most {watch.max_running:.0f} running, "
          f"{watch.max_waiting:.0f} waiting (max-num-seqs {limits.max_num_seqs})")
    seqs = limits.max_num_seqs
    if seqs is None or seqs >= 2:
        assert overlap >= MIN_OVERLAP, (f"the engine ran these {n} requests for {overlap:.2f}x the burst's wall time, "
                                        f"below {MIN_OVERLAP}: it did not run them together")
    assert not hits, f"{hits:.0f} prompt tokens of the burst came from the prefix cache: its prefill was not exercised"
    if seqs:
        assert overlap <= seqs + OVERLAP_SLACK, (f"the engine ran these {n} requests for {overlap:.2f}x the burst's wall "
                                                 f"time: more than --max-num-seqs {seqs} ran at once")
        assert watch.max_running <= seqs, f"{watch.max_running:.0f} requests ran at once, above --max-num-seqs {seqs}"
        if n > seqs:
            # Over the limit, requests beyond it usually wait in the scheduler's queue (0.5-2 s measured
            # on a busy machine), but on an idle one the API process can hand them to the engine so
            # staggered that none waits (0.000 s seen in a full CI-like run): reported, not asserted.
            # What must hold is asserted above (never more than max-num-seqs running) and below (all
            # requests complete with the sequential outputs).
            print(f"  over max-num-seqs: engine queue time {queued:.3f} s, {watch.max_waiting:.0f} seen waiting")
        else:
            assert queued < QUEUED_MIN_S, f"{n} requests within max-num-seqs {seqs} spent {queued:.3f} s queued"
    for i, (seq, conc) in enumerate(zip(sequential_streams, results)):
        assert len(conc.tokens) == MAX_TOKENS
        if deterministic:
            assert conc.tokens == seq.tokens and conc.logprobs == seq.logprobs, (
                f"request {i} of {n} differs from its sequential run on {suite.platform.name}, where greedy decoding "
                f"is deterministic: {compare_streams(seq, conc, tolerance).message}")
        else:
            v = compare_streams(seq, conc, tolerance)
            assert v.ok, f"request {i} of {n} differs from its sequential run beyond a near tie: {v.message}"
