"""Level 3 (the users' plan): concurrent requests (2, 4, and more than --max-num-seqs, so some must queue).

Every concurrent greedy output must equal the sequential one: bitwise where the platform is
deterministic (CPU, measured), else within the level 2 stream rule (harness/correctness/logprobs.py compare_streams,
with the level 2 tolerance of this platform).
"""
import uuid

import pytest

from harness.core.errors import SuiteError
from harness.correctness.level2 import load_workload
from harness.correctness.logprobs import Stream, compare_streams
from harness.stress.burst import Burst, bursts_until_together, run_burst

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
# Bursts tried until one runs its requests together (harness/stress/burst.py bursts_until_together): a one-at-a-time
# server fails all of them; a burst whose requests reached the engine one after the other on a starved machine
# (once, in CI) gets two more chances. Every burst tried is held to the other checks.
BURSTS = 3
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
    seqs = limits.max_num_seqs
    must_overlap = seqs is None or seqs >= 2

    def burst() -> Burst:
        salt = f"concurrent-{level}-{uuid.uuid4()}"
        b = run_burst(lambda i: _greedy(client, prompts, i, salt), n, read_metric, prefix_cache, live_server.ensure_alive)
        print(f"\n{b.line(seqs)}")
        return b

    bursts = bursts_until_together(burst, MIN_OVERLAP, BURSTS if must_overlap else 1)
    if must_overlap:
        assert bursts[-1].overlap >= MIN_OVERLAP, (
            f"the engine ran these {n} requests for {', '.join(f'{b.overlap:.2f}' for b in bursts)}x the burst's wall "
            f"time in {len(bursts)} bursts, below {MIN_OVERLAP}: it did not run them together")
    for b in bursts:
        _assert_burst(b, n, seqs, sequential_streams, deterministic, tolerance, suite.platform.name)


def _assert_burst(b: Burst, n: int, seqs: int | None, sequential_streams, deterministic: bool, tolerance,
                  platform: str) -> None:
    """What every burst must show, whether or not it was the one that ran its requests together."""
    hits, overlap, queued = b.prefix_hits, b.overlap, b.queued_s
    assert not hits, f"{hits:.0f} prompt tokens of the burst came from the prefix cache: its prefill was not exercised"
    if seqs:
        assert overlap <= seqs + OVERLAP_SLACK, (f"the engine ran these {n} requests for {overlap:.2f}x the burst's wall "
                                                 f"time: more than --max-num-seqs {seqs} ran at once")
        assert b.max_running <= seqs, f"{b.max_running:.0f} requests ran at once, above --max-num-seqs {seqs}"
        if n > seqs:
            # Over the limit, requests beyond it usually wait in the scheduler's queue (0.5-2 s measured
            # on a busy machine), but on an idle one the API process can hand them to the engine so
            # staggered that none waits (0.000 s seen in a full CI-like run): reported, not asserted.
            # What must hold is asserted above (never more than max-num-seqs running) and below (all
            # requests complete with the sequential outputs).
            print(f"  over max-num-seqs: engine queue time {queued:.3f} s, {b.max_waiting:.0f} seen waiting")
        else:
            assert queued < QUEUED_MIN_S, f"{n} requests within max-num-seqs {seqs} spent {queued:.3f} s queued"
    for i, (seq, conc) in enumerate(zip(sequential_streams, b.results)):
        assert len(conc.tokens) == MAX_TOKENS
        if deterministic:
            assert conc.tokens == seq.tokens and conc.logprobs == seq.logprobs, (
                f"request {i} of {n} differs from its sequential run on {platform}, where greedy decoding "
                f"is deterministic: {compare_streams(seq, conc, tolerance).message}")
        else:
            v = compare_streams(seq, conc, tolerance)
            assert v.ok, f"request {i} of {n} differs from its sequential run beyond a near tie: {v.message}"
