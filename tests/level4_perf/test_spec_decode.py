"""Speculative decoding is judged by acceptance too: for a config with a speculator, level 4 records vLLM's
spec-decode counters (drafts, drafted and accepted tokens, mean acceptance length) next to each decode workload's
tg, so a kernel change that loses precision shows as falling acceptance before tg moves. Exercised with vLLM's
n-gram (prompt lookup) speculator, which needs no draft weights: this config with `spec=ngram`, booted beside the
shared server. Eagle3 configs need the nvidia draft checkpoints and stay skipped with that reason elsewhere."""
import json

import pytest

from harness.config.catalog import Config
from harness.perf.benchmark import run_benchmark

pytestmark = [pytest.mark.level4, pytest.mark.server]
DRAFT_TOKENS = 3  # num_speculative_tokens of the flavours' ngram entry


def test_level4_records_the_speculators_acceptance_next_to_tg(suite, server):
    if server.external:
        pytest.skip("--server-url: the suite cannot boot the speculative variant of a server it did not boot")
    ok, why = suite.can_boot_secondary()
    if not ok:
        pytest.skip(f"the n-gram variant boots beside the shared server, and {why}")
    config = suite.catalog.parse(server.target.name)
    ngram = Config(tuple((axis, "ngram" if axis == "spec" else value) for axis, value in config.axes))
    target = suite.target(ngram)
    if not target.runnable:
        pytest.skip(target.reason)
    with suite.boot(target, tag="__ngram", beside_shared=True) as running:
        results = run_benchmark(suite, running, None, tag="__ngram", kinds={"decode"})
    spec = results["spec_decode"]
    print(f"\n  {target.name}: " + json.dumps(spec))
    assert spec, f"{target.name} ran with a speculator but level 4 recorded no spec-decode counters"
    for workload, counters in spec.items():
        assert counters["drafts"] > 0 and counters["draft_tokens"] >= counters["drafts"], (workload, counters)
        assert 1.0 <= counters["mean_acceptance_length"] <= 1.0 + DRAFT_TOKENS, (workload, counters)
        assert 0.0 <= counters["acceptance_rate"] <= 1.0, (workload, counters)
    assert any(name.startswith("tg") for name in results["metrics"]), "no tg beside the acceptance counters"
