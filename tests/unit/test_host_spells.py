"""scripts/host_spells.py: its reading of Linux's scheduler counters and its split of slow rounds from fast ones. The
GPU run it is for needs a host-bound decode; these check the arithmetic on made-up rounds whose answer is known."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import host_spells  # noqa: E402


def test_schedstat_sums_the_threads_and_skips_a_thread_it_cannot_read(tmp_path):
    for tid, text in (("10", "1000 200 3\n"), ("11", "500 50 1\n"), ("12", "garbage\n")):
        (tmp_path / "10" / "task" / tid).mkdir(parents=True)
        (tmp_path / "10" / "task" / tid / "schedstat").write_text(text)
    assert host_spells.schedstat(10, tmp_path) == (1500, 250, 4)
    assert host_spells.schedstat(99, tmp_path) == (0, 0, 0)  # a process gone: nothing, not an error


def _round(tok_s: float, run_us: float, wait_us: float, cpu: int) -> dict:
    per_round = host_spells.TOKENS - 1
    host = {"run_ns": int(run_us * per_round * 1000), "wait_ns": int(wait_us * per_round * 1000), "cpu": cpu}
    return {"tok_s": tok_s, "host": {"engine": host, "api": {**host, "run_ns": 0, "wait_ns": 0}}}


def test_slow_rounds_that_waited_for_a_cpu_are_told_from_ones_that_ran_longer():
    """Spells like the plugin's (640 and 450 tok/s): in one made-up run the slow rounds waited 600 us per token on a
    run queue, in the other they ran 600 us longer on a CPU. The lines must name which, in us per token."""
    waited = [_round(640, 1500, 10, 3)] * 6 + [_round(450, 1500, 610, 7)] * 3
    lines = host_spells.compare(waited)
    assert lines[0].startswith("3 slow rounds") and "6 fast" in lines[0], lines
    engine = next(ln for ln in lines if ln.startswith("engine:"))
    assert "on a CPU 1500 against 1500 us (+0)" in engine and "waiting for a CPU 610 against 10 us (+600)" in engine
    assert "last CPUs slow [7], fast [3]" in engine, engine
    ran = [_round(640, 1500, 10, 3)] * 6 + [_round(450, 2100, 10, 3)] * 3
    engine = next(ln for ln in host_spells.compare(ran) if ln.startswith("engine:"))
    assert "on a CPU 2100 against 1500 us (+600)" in engine and "(+0)" in engine, engine


def test_rounds_at_one_speed_are_not_split():
    """A/A: a steady decode (stock's 0.2% CV) has no slow rounds to explain."""
    steady = [_round(342 + 0.1 * i, 1500, 10, 3) for i in range(12)]
    lines = host_spells.compare(steady)
    assert lines == [lines[0], "no split: every round is at one speed"] and lines[0].startswith("0 slow rounds")


def test_the_engine_core_is_found_by_its_process_title_and_the_api_server_is_the_leader():
    """vLLM titles its engine process `VLLM::EngineCore`; a process of that title among the group is the engine, the
    process the suite started is the API server, and a group without an engine says so by its absence."""
    import os
    import subprocess

    engine = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 30"])
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "EngineCore" not in open(f"/proc/{engine.pid}/cmdline").read():
            time.sleep(0.05)
        me = os.getpid()
        assert host_spells.roles([me, engine.pid], me) == {"engine": engine.pid, "api": me}
        assert host_spells.roles([me], me) == {"api": me}
    finally:
        engine.kill()
        engine.wait(timeout=10)


def test_the_reading_names_the_account_that_holds_the_slow_rounds_extra_time():
    """Each made-up run has one cause of its 690 us extra per token (640 against 450 tok/s); the reading must name it,
    and must not blame the CPU when the GPU clocked down with the host's counters unchanged."""
    def with_clock(r: dict, mhz: float) -> dict:
        return {**r, "sm_mhz": mhz, "sm_min_mhz": mhz - 30, "busy_cpus": 2.0}

    ran = [_round(640, 1500, 10, 3)] * 6 + [_round(450, 2200, 10, 3)] * 3
    waited = [_round(640, 1500, 10, 3)] * 6 + [_round(450, 1500, 700, 3)] * 3
    clocked = [with_clock(_round(640, 1500, 10, 3), 1980)] * 6 + [with_clock(_round(450, 1500, 10, 3), 1410)] * 3
    slept = [with_clock(_round(640, 1500, 10, 3), 1980)] * 6 + [with_clock(_round(450, 1500, 10, 3), 1980)] * 3
    assert "ran longer on a CPU" in host_spells.compare(ran)[-1]
    assert "waited on a run queue" in host_spells.compare(waited)[-1]
    lines = host_spells.compare(clocked)
    assert "lower SM clock" in lines[-1], lines
    assert "GPU SM clock (median of the round's samples): slow 1410 MHz against fast 1980 (-570)" in lines[-3], lines
    assert "host CPUs busy (all processes): slow 2.00 against fast 2.00 (+0.00)" in lines[-2], lines
    assert "slept" in host_spells.compare(slept)[-1]


def test_busy_cpus_is_busy_time_over_wall_time():
    assert host_spells.busy_cpus((10.0, 100.0), (13.0, 101.5)) == 2.0
    assert host_spells.busy_cpus((10.0, 100.0), (10.0, 100.0)) is None  # no time passed: nothing to divide
