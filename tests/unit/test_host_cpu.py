"""harness.perf.host_cpu: the fixed loop level 4 times on the engine core's CPU after each round, and the sentence a
host-side decode verdict takes from it. On an H200 host (2026-12-03) that loop ran ~1.0 ms in some spells and ~1.7 ms
in others, and the plugin's decode followed it; these tests check the plumbing and the wording on known inputs."""
from __future__ import annotations

import os
import subprocess
import time

from harness.perf import host_cpu


def test_the_loop_is_timed_on_the_chosen_cpu_and_gives_the_cpus_back():
    before = os.sched_getaffinity(0)
    us = host_cpu.loop_us(min(before))
    assert us is not None and 0 < us < 10_000_000
    assert os.sched_getaffinity(0) == before
    assert host_cpu.loop_us(None) is not None
    # a CPU this process may not use: no number, not an error, and the affinity is back
    assert host_cpu.loop_us(max(before) + 4096) is None
    assert os.sched_getaffinity(0) == before


def _titled_engine() -> subprocess.Popen:
    engine = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 30"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "EngineCore" not in open(f"/proc/{engine.pid}/cmdline").read():
        time.sleep(0.05)
    return engine


def test_the_probe_times_the_engines_cpu_after_each_round_and_says_why_when_it_cannot():
    engine = _titled_engine()
    try:
        probe = host_cpu.HostCpuProbe(lambda: [os.getpid(), engine.pid])
        probe.after_round()
        probe.after_round()
        section = probe.describe()
        assert section["available"] and len(section["loop_us"]) == 2 and section["loops"] == host_cpu.LOOPS
        assert set(section["cpus"]) <= os.sched_getaffinity(0)
        assert section["median_us"] > 0 and section["cv"] is not None
    finally:
        engine.kill()
        engine.wait()
    lost = host_cpu.HostCpuProbe(lambda: [os.getpid()])
    lost.after_round()
    assert lost.describe() == {"available": False, "reason": lost.reason} and "no engine core" in lost.reason


def _run(median: float | None, loops: int = host_cpu.LOOPS) -> dict:
    return {} if median is None else {"host_cpu": {"available": True, "median_us": median, "loops": loops}}


def test_the_sentence_names_a_slower_cpu_only_beyond_the_loops_own_spread():
    """1,708 against 1,012 us is the H200's slow spell: a slower CPU. 3% is the loop's own spread between rounds on an
    idle CPU: the same speed, so the host work grew. Either side without the section, with another loop, or with a
    broken median says nothing rather than guess."""
    slower = host_cpu.compare(_run(1012), _run(1708))
    assert "1708 us against the baseline's 1012 (+69%)" in slower and "host's CPU ran slower" in slower
    same = host_cpu.compare(_run(1000), _run(1030))
    assert "at the baseline's speed" in same and "host work per step grew" in same
    faster = host_cpu.compare(_run(1700), _run(1000))
    assert "ran faster" in faster and "host work per step grew" in faster
    for base, cur in ((_run(None), _run(1000)), (_run(1000), _run(None)), (_run(1000, loops=5), _run(1700)),
                      ({"host_cpu": "fast"}, _run(1000)), (_run(float("nan")), _run(1000)),
                      ({"host_cpu": {"available": False, "reason": "x"}}, _run(1000))):
        assert host_cpu.compare(base, cur) is None
