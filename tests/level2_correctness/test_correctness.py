"""Level 2 (seed 000): output matches the reference, no NaN/Inf, token-by-token on fixed prompts.

Goldens: goldens/<model>/<platform>/<config>/level2.json (regenerate with --force-regen).
Tolerances are explained in harness/correctness.py.
"""
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.correctness import greedy_stream, load_workload, perplexity_problem, run_level2, stream_problems
from harness.goldens import compare_streams

pytestmark = [pytest.mark.level2, pytest.mark.server]


@pytest.fixture(scope="session")
def workload():
    return load_workload()


@pytest.fixture(scope="session")
def level2(server, suite, workload):
    if not suite.model.has_real_weights:
        pytest.skip(f"{suite.model.alias} has dummy weights: outputs are meaningless, so there is nothing to check")
    return run_level2(server.client(), workload)


def test_token_streams_match_golden(level2, golden, workload):
    data = golden("level2", level2.to_golden(), "level2")
    problems, notes = stream_problems(level2, data, workload)
    for n in notes:
        print("\n  near tie:", n)
    assert not problems, "token streams diverge from the golden:\n  " + "\n  ".join(problems)


def test_perplexity_matches_golden(level2, golden, workload):
    data = golden("level2", level2.to_golden(), "level2")
    problem = perplexity_problem(level2, data, workload)
    assert problem is None, problem


def test_embedded_model_is_trained(level2, suite):
    """Its perplexity must be far below the uniform-distribution value (the vocabulary size)."""
    config = Path(suite.model.path) / "config.json"
    if not suite.model.alias.startswith("tiny-gpt-oss"):
        pytest.skip("only the embedded model has a known training state")
    vocab = json.loads(config.read_text())["vocab_size"]
    assert level2.perplexity < vocab / 20, f"perplexity {level2.perplexity:.1f} is not far below uniform ({vocab})"


def test_no_nan_or_inf_in_any_logprob(level2):
    for name, stream in level2.streams.items():
        values = stream.logprobs + [v for top in stream.top for v in top.values()]
        bad = [v for v in values if not math.isfinite(v)]
        assert not bad, f"prompt '{name}': non-finite logprobs {bad[:5]}"
    assert math.isfinite(level2.perplexity)


def test_repeated_requests_give_the_same_greedy_tokens(client, workload, suite, record_property):
    """5x sequential must be identical; 5x concurrent must agree up to near ties (reported per platform)."""
    prompt = workload.prompts["code"]
    first = greedy_stream(client, prompt, workload)
    for i in range(4):
        again = greedy_stream(client, prompt, workload)
        assert again.tokens == first.tokens, f"sequential run {i + 2} differs: {compare_streams(first, again, 0.0).message}"
    with ThreadPoolExecutor(max_workers=5) as pool:
        concurrent = list(pool.map(lambda _: greedy_stream(client, prompt, workload), range(5)))
    identical = all(c.tokens == first.tokens for c in concurrent)
    record_property("concurrent_bitwise_identical", identical)
    print(f"\n[{suite.platform.name}] 5x concurrent greedy outputs bitwise identical to sequential: {identical}")
    for c in concurrent:
        v = compare_streams(first, c, workload.near_tie_nats)
        assert v.ok, f"concurrent run differs beyond a near tie: {v.message}"
