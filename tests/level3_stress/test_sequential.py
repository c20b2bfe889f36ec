"""Level 3 (the users' plan): 100 sequential requests of mixed lengths, no crash, no leak, no slowdown.

One run (the `sequential_run` fixture: a warm-up cycle, then the ten request shapes ten times in the
same order) is judged three ways. Because every tenth of the run holds the same ten shapes, the
first and last deciles are directly comparable.
"""
import pytest

from harness.engine.process_memory import GIB

pytestmark = [pytest.mark.level3, pytest.mark.server]

# Latency drift gate. Reported: the last decile over the first (each holds the same ten shapes).
# Gated: the same ratio of per-shape minima over the first and last three cycles (`floor_drift`),
# because on the shared 2-core CI machine contention from other servers and a training job moved
# a decile sum by up to 1.8x (drift 0.56 in one of our runs, 1.01 in the next) while the minima
# stayed within 12% (0.98, 1.01, 1.11 in four runs). A leak-like degradation (scheduler, prefix-cache or detokenizer
# state growing per request) raises the minima too. KV blocks never freed do not: the run's ~75k tokens fill ~7% of
# the CPU server's 1.03M-token cache, so nothing is preempted (a server patched to never free them passed this gate at
# 1.14); the KV test below catches that.
MAX_DRIFT = 1.5

# KV-cache blocks still in use once every request has finished, over the level after warm-up (vLLM's gauge, a fraction
# of the cache). A healthy vLLM frees a finished request's blocks at once (blocks kept for the prefix cache count as
# free): 0.0% before and after on CPU. The patched server above ended at 5.0% of its cache with nothing running.
# 0.1% of the cache is ~1,000 tokens on that CPU server.
KV_LEAK_BOUND = 0.001

# Memory growth gate after 100 requests, relative to the level after warm-up (RSS of the server's
# process group on CPU, NVML memory on GPUs). Weights and the KV cache are allocated at boot and the
# warm-up cycle has run every request shape once, so a healthy server only moves by allocator slack:
# +0.3 MiB over 100 requests on CPU in our runs. 128 MiB catches a leak of ~1.3 MiB per request (a
# retained prompt's hidden states or logits) while leaving glibc arena slack far behind.
GROWTH_BOUND_BYTES = 128 * 1024 * 1024


def test_100_sequential_requests_all_succeed_and_are_well_formed(sequential_run, live_server):
    outcomes = sequential_run.outcomes
    assert len(outcomes) == 100
    bad = [f"#{i} {o.shape}: {o.problem}" for i, o in enumerate(outcomes) if o.problem]
    assert not bad, f"{len(bad)} of 100 requests failed or were malformed:\n  " + "\n  ".join(bad[:10])
    live_server.ensure_alive()
    print(f"\n100 requests in {sequential_run.wall_s:.1f} s, {sum(o.tokens for o in outcomes)} tokens generated")


def _judgeable(run) -> None:
    """A run with failed requests has nothing comparable to judge: failures answer fast and hold no memory."""
    assert not run.failed, (f"{len(run.failed)} of 100 requests failed or were malformed (first: {run.failed[0].problem}), "
                            "so this cannot be judged; see test_100_sequential_requests_all_succeed_and_are_well_formed")


def test_latency_does_not_drift_over_100_requests(sequential_run, record_property):
    _judgeable(sequential_run)
    first, last = sequential_run.decile_seconds(0), sequential_run.decile_seconds(9)
    drift, floor = last / first, sequential_run.floor_drift()
    deciles = [round(sequential_run.decile_seconds(i), 2) for i in range(10)]
    record_property("latency_drift", round(drift, 3))
    record_property("latency_floor_drift", round(floor, 3))
    print(f"\nlatency drift (last / first decile, same ten shapes each): {drift:.3f} ({first:.2f} s -> {last:.2f} s); "
          f"deciles: {deciles}; per-shape minima, last 3 / first 3 cycles: {floor:.3f}")
    assert floor <= MAX_DRIFT, (f"the fastest of each shape's last three requests took {floor:.2f}x the fastest of its first "
                                f"three (deciles {deciles}): the server slows down as requests accumulate")


def test_memory_after_100_requests_stays_near_the_warm_level(sequential_run, record_property):
    run = sequential_run
    if run.mem_warm is None:
        pytest.skip("--server-url: the memory of a server the suite did not boot cannot be read")
    _judgeable(run)
    growth = run.mem_end - run.mem_warm
    bound = GROWTH_BOUND_BYTES
    record_property("memory_growth_mib", round(growth / 2**20, 1))
    print(f"\n{run.memory_kind}: warm {run.mem_warm / GIB:.3f} GiB, after 100 requests {run.mem_end / GIB:.3f} GiB "
          f"(growth {growth / 2**20:+.1f} MiB, bound {bound / 2**20:.0f} MiB), peak {run.mem_peak / GIB:.3f} GiB")
    assert run.mem_warm > 0, "could not read the server's memory"
    assert growth <= bound, (f"{run.memory_kind} grew by {growth / 2**20:.1f} MiB over 100 requests "
                             f"(bound {bound / 2**20:.0f} MiB): a leak")


def test_kv_cache_blocks_are_freed_after_100_requests(sequential_run, record_property):
    run = sequential_run
    if run.kv_warm is None or run.kv_end is None:
        pytest.skip("the server's /metrics has no KV-cache usage gauge (vllm:kv_cache_usage_perc): not a vLLM server")
    _judgeable(run)
    record_property("kv_usage_growth", round(run.kv_end - run.kv_warm, 5))
    print(f"\nKV cache in use with nothing running: {run.kv_warm:.2%} after warm-up, {run.kv_end:.2%} after 100 requests "
          f"(bound +{KV_LEAK_BOUND:.1%} of the cache)")
    assert run.kv_end - run.kv_warm <= KV_LEAK_BOUND, (
        f"{run.kv_end:.2%} of the KV cache is still in use with nothing running after 100 requests ({run.kv_warm:.2%} "
        "after warm-up): finished requests' KV blocks were not freed")
