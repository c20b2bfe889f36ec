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
    # a clock dip under spinning: the engine also ran longer, and the clock is still what the reading names
    spun = [with_clock(_round(640, 1500, 10, 3), 1980)] * 6 + [with_clock(_round(450, 2200, 10, 3), 1410)] * 3
    assert "lower SM clock" in host_spells.compare(spun)[-1]


def test_busy_and_stolen_cpus_are_their_time_over_wall_time():
    import pytest

    assert host_spells.busy_cpus((10.0, 1.0, 100.0), (13.0, 1.3, 101.5)) == pytest.approx((2.0, 0.2))
    assert host_spells.busy_cpus((10.0, 0.0, 100.0), (10.0, 0.0, 100.0)) == (None, None)  # no time passed


def _with_probe(r: dict, probe_us: float, threads: dict[str, float]) -> dict:
    per_round = host_spells.TOKENS - 1
    engine = {**r["host"]["engine"], "threads": {n: int(us * per_round * 1000) for n, us in threads.items()}}
    return {**r, "probe_us": probe_us, "host": {**r["host"], "engine": engine}}


def test_a_probe_on_the_engines_cpu_tells_a_slower_cpu_from_more_work():
    """Both made-up runs have slow rounds that ran 700 us per token longer on a CPU. In one, a fixed loop on the same
    CPU also took 40% longer: the host's CPU was slower. In the other the loop kept its time and one thread did the
    extra work: the reading must say more work, and the threads line must name that thread first."""
    fast = _with_probe(_round(640, 1500, 10, 3), 1000, {"VLLM::EngineCor": 1400, "loop": 100})
    slower_cpu = [fast] * 6 + [_with_probe(_round(450, 2200, 10, 3), 1400, {"VLLM::EngineCor": 2000, "loop": 200})] * 3
    lines = host_spells.compare(slower_cpu)
    assert "fixed loop on the engine's CPU after each round: slow 1400 us against fast 1000 (+40.0%)" in lines, lines
    assert "the CPU itself was slower" in lines[-1], lines
    more_work = [fast] * 6 + [_with_probe(_round(450, 2200, 10, 3), 1010, {"VLLM::EngineCor": 1400, "loop": 800})] * 3
    lines = host_spells.compare(more_work)
    assert "at the CPU's usual speed" in lines[-1], lines
    threads = next(ln for ln in lines if ln.startswith("engine threads"))
    assert threads.startswith("engine threads, slow against fast per token: loop 800 against 100 us (+700)"), threads


def test_thread_run_sums_threads_by_name(tmp_path):
    for tid, name, run in (("1", "VLLM::EngineCor", 500), ("2", "pt_worker", 100), ("3", "pt_worker", 50)):
        (tmp_path / "7" / "task" / tid).mkdir(parents=True)
        (tmp_path / "7" / "task" / tid / "comm").write_text(name + "\n")
        (tmp_path / "7" / "task" / tid / "schedstat").write_text(f"{run} 0 1\n")
    assert host_spells.thread_run(7, tmp_path) == {"VLLM::EngineCor": 500, "pt_worker": 150}
