#!/usr/bin/env python3
"""Where a host-bound decode's slow rounds spend the host: batch-1 tg32 rounds on one boot, each with the engine clock
and what Linux says the server's processes did meanwhile.

    python3 scripts/host_spells.py [--config gemv-bf16-mxfp4-all] [--model ALIAS] [--rounds 40] [--server-arg=--flag=v]

Per round: engine-clock tok/s, and for the engine core and the API server the CPU time they ran, the time they waited
on a run queue for a CPU (/proc/PID/task/*/schedstat, all threads), their context switches and the CPU they last ran on.
Then the slow rounds (below 97% of the fastest quarter's median) against the fast ones, per generated token:
- slow rounds that *ran* longer per token with the same work point at a slower CPU (frequency, a busy SMT sibling, a
  migration across sockets);
- slow rounds that *waited* longer on a run queue point at contention for the host's CPUs;
- neither: the engine slept (waited on the GPU, a lock or I/O), which the profiler's host ranges must then show.
Beside them, per round, the GPU's SM clock (NVML, `harness.perf.clocks`: a GPU that clocks down between a host-bound
decode's short kernels makes the slow rounds GPU-bound, not host-bound) and how many of the host's CPUs were busy.
On a GPU, CUDA's default wait for the device spins before it yields, so an engine core waiting on slower kernels can
read as running longer: the reading names a lower SM clock first.

Why: the plugin's 20b decode on an H200 ran in spells of ~1.56 and ~2.5 ms per step with stock steady, and vLLM's
--stream-interval=8 did not change it (docs/evidence/sm_90-2026-12-02-h200-curve-stream-interval/).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.engine.server_metrics import EngineRound, scrape  # noqa: E402
from harness.perf import bench, host_cpu  # noqa: E402
from harness.perf.clocks import ClockSampler  # noqa: E402
from harness.session.suite import Suite  # noqa: E402

TOKENS = 32
SLOW = 0.97  # a round below this share of the fast quarter's median is slow: the 20b plugin's spells were 30% apart
ROLES = ("engine", "api")
CLOCK_DIP = 0.95  # an SM clock 5% below the fast rounds' is a clock change, not sampling jitter (NVML steps are ~15 MHz)


def schedstat(pid: int, proc_root: Path = Path("/proc")) -> tuple[int, int, int]:
    """(ns on a CPU, ns waiting on a run queue, timeslices) summed over the process's threads; zeros where the kernel
    keeps no schedstat (a thread gone between listing and reading counts for nothing)."""
    run = wait = slices = 0
    for f in (proc_root / str(pid) / "task").glob("*/schedstat"):
        try:
            a, b, c = (int(x) for x in f.read_text().split()[:3])
        except (OSError, ValueError):
            continue
        run, wait, slices = run + a, wait + b, slices + c
    return run, wait, slices


def roles(pids: list[int], leader: int) -> dict[str, int]:
    """The engine core and the API server among the server's processes (the API server is the process group's leader,
    the process the suite started)."""
    found = {}
    engine = host_cpu.engine_core(pids)
    if engine is not None:
        found["engine"] = engine
    if leader in pids:
        found["api"] = leader
    return found


def sample(pids: dict[str, int]) -> dict[str, dict]:
    out = {}
    for role, pid in pids.items():
        try:
            p = psutil.Process(pid)
            ctx, cpu = p.num_ctx_switches(), p.cpu_num()
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            ctx, cpu = None, None
        run, wait, slices = schedstat(pid)
        out[role] = {"run_ns": run, "wait_ns": wait, "slices": slices, "cpu": cpu,
                     "vol": ctx.voluntary if ctx else None, "invol": ctx.involuntary if ctx else None,
                     "threads": thread_run(pid)}
    return out


def busy_cpus(before: tuple[float, float, float], after: tuple[float, float, float]) -> tuple[float | None, float | None]:
    """(CPUs busy, CPUs stolen) on average between two host_busy() readings. Steal is the time a virtual machine's CPUs
    were ready and the hypervisor ran something else: a neighbour on a shared host."""
    wall = after[2] - before[2]
    if wall <= 0:
        return None, None
    return (after[0] - before[0]) / wall, (after[1] - before[1]) / wall


def host_busy() -> tuple[float, float, float]:
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return busy, getattr(t, "steal", 0.0), time.monotonic()


def thread_run(pid: int, proc_root: Path = Path("/proc")) -> dict[str, int]:
    """ns on a CPU per thread name (threads of one name summed): which of the engine's threads the time went to."""
    out: dict[str, int] = {}
    for task in (proc_root / str(pid) / "task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            run = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[name] = out.get(name, 0) + run
    return out


def delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    d = {}
    for role, a in after.items():
        b = before.get(role, {})
        d[role] = {k: (a[k] - b[k] if isinstance(a.get(k), int) and isinstance(b.get(k), int) else None)
                   for k in ("run_ns", "wait_ns", "slices", "vol", "invol")}
        d[role]["cpu"] = a.get("cpu")
        d[role]["threads"] = {n: v - b.get("threads", {}).get(n, 0) for n, v in a.get("threads", {}).items()}
    return d


def compare(rounds: list[dict]) -> list[str]:
    """Slow rounds against fast ones, per generated token (us), for each role: the lines the script prints."""
    speeds = sorted(r["tok_s"] for r in rounds)
    top = speeds[-max(1, len(speeds) // 4):]
    line = SLOW * statistics.median(top)
    slow = [r for r in rounds if r["tok_s"] < line]
    fast = [r for r in rounds if r["tok_s"] >= line]
    lines = [f"{len(slow)} slow rounds (< {line:.1f} tok/s, {SLOW:.0%} of the fastest quarter's median) and "
             f"{len(fast)} fast"]
    if not slow or not fast:
        return lines + ["no split: every round is at one speed"]

    def per_token(group: list[dict], role: str, key: str) -> float | None:
        v = [r["host"][role][key] for r in group if r["host"].get(role, {}).get(key) is not None]
        return statistics.median(v) / 1000 / (TOKENS - 1) if v else None

    step = {name: statistics.median(1e6 / r["tok_s"] for r in g) for name, g in (("slow", slow), ("fast", fast))}
    extra = step["slow"] - step["fast"]
    lines.append(f"step: slow {step['slow']:.0f} us per token, fast {step['fast']:.0f} (+{extra:.0f})")
    extra_engine = {key: (per_token(slow, "engine", key) or 0.0) - (per_token(fast, "engine", key) or 0.0)
                    for key in ("run_ns", "wait_ns")}
    for role in ROLES:
        cells = []
        for key, what in (("run_ns", "on a CPU"), ("wait_ns", "waiting for a CPU")):
            s, f = per_token(slow, role, key), per_token(fast, role, key)
            if s is not None and f is not None:
                cells.append(f"{what} {s:.0f} against {f:.0f} us ({s - f:+.0f})")
        cpus = sorted({r["host"].get(role, {}).get("cpu") for r in slow} - {None})
        cpus_fast = sorted({r["host"].get(role, {}).get("cpu") for r in fast} - {None})
        if cells:
            lines.append(f"{role}: slow against fast per token: " + "; ".join(cells)
                         + f"; last CPUs slow {cpus}, fast {cpus_fast}")

    def median_of(group: list[dict], key: str) -> float | None:
        v = [r[key] for r in group if r.get(key) is not None]
        return statistics.median(v) if v else None

    sm_s, sm_f = median_of(slow, "sm_mhz"), median_of(fast, "sm_mhz")
    if sm_s is not None and sm_f is not None:
        low_s, low_f = median_of(slow, "sm_min_mhz"), median_of(fast, "sm_min_mhz")
        lines.append(f"GPU SM clock (median of the round's samples): slow {sm_s:.0f} MHz against fast {sm_f:.0f} "
                     f"({sm_s - sm_f:+.0f}); lowest sample slow {low_s:.0f}, fast {low_f:.0f}")
    b_s, b_f = median_of(slow, "busy_cpus"), median_of(fast, "busy_cpus")
    if b_s is not None and b_f is not None:
        lines.append(f"host CPUs busy (all processes): slow {b_s:.2f} against fast {b_f:.2f} ({b_s - b_f:+.2f})")
    st_s, st_f = median_of(slow, "steal_cpus"), median_of(fast, "steal_cpus")
    if st_s is not None and st_f is not None:
        lines.append(f"CPUs stolen by the hypervisor: slow {st_s:.3f} against fast {st_f:.3f} ({st_s - st_f:+.3f})")
    threads = {}
    for r in slow + fast:
        for name in r["host"].get("engine", {}).get("threads", {}):
            threads[name] = None

    def thread_per_token(group: list[dict], name: str) -> float:
        return statistics.median(r["host"]["engine"].get("threads", {}).get(name, 0) for r in group) / 1000 / (TOKENS - 1)

    moved = []
    for name in threads:
        s_, f_ = thread_per_token(slow, name), thread_per_token(fast, name)
        moved.append((s_ - f_, s_, f_, name))
    if moved:
        top = sorted(moved, reverse=True)[:3]
        lines.append("engine threads, slow against fast per token: "
                     + "; ".join(f"{n} {s_:.0f} against {f_:.0f} us ({d:+.0f})" for d, s_, f_, n in top))
    p_s, p_f = median_of(slow, "probe_us"), median_of(fast, "probe_us")
    slower_cpu = None
    if p_s is not None and p_f is not None and p_f > 0:
        slower_cpu = p_s / p_f
        lines.append(f"fixed loop on the engine's CPU after each round: slow {p_s:.0f} us against fast {p_f:.0f} "
                     f"({slower_cpu - 1:+.1%})")
    # a lower SM clock first: CUDA's spin while it waits for slower kernels reads as the engine running longer.
    # Otherwise the account that holds at least half of the slow rounds' extra time per token.
    if sm_s is not None and sm_f is not None and sm_s < CLOCK_DIP * sm_f:
        why = "the GPU ran at a lower SM clock (its kernels took longer; the host waited for them)"
    elif extra_engine["run_ns"] >= extra / 2:
        if slower_cpu is not None and slower_cpu > host_cpu.SLOWER:
            why = (f"the engine core ran longer on a CPU, and the CPU itself was slower (the same loop took "
                   f"{slower_cpu - 1:+.0%}): the host's CPU speed (its clock, an SMT sibling, a neighbour), not vLLM or the kernels")
        elif slower_cpu is not None:
            why = ("the engine core ran longer on a CPU at the CPU's usual speed (the same loop took "
                   f"{slower_cpu - 1:+.0%}): more work per step; the threads line says whose")
        else:
            why = "the engine core ran longer on a CPU (same work, slower CPU: frequency, an SMT sibling, a migration)"
    elif extra_engine["wait_ns"] >= extra / 2:
        why = "the engine core waited on a run queue (contention for the host's CPUs)"
    else:
        why = "neither ran nor waited: the engine core slept (on the GPU, a lock or I/O); read the profiler's host ranges"
    lines.append(f"reading: {why}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="default: this platform's default config")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--server-arg", action="append", default=[], help="a vLLM server argument, e.g. --server-arg=--stream-interval=8")
    ap.add_argument("--out", default=str(REPO / "runs" / "host-spells"))
    a = ap.parse_args(argv)
    if a.rounds < 4:
        print("host_spells: --rounds must be at least 4 (a fastest quarter of one round or more)")
        return 2
    try:
        out = writable_dir(Path(a.out), "--out")  # under its own name: Suite.create's check says --run-dir
        suite = Suite.create(a.config, a.model, None, None, str(out), 900)
        target = suite.targets()[0]
        if not target.runnable:
            raise SuiteError(f"{target.name} cannot run here: {target.reason}")
        rounds: list[dict] = []
        clocks = ClockSampler(interval_s=0.005, floor=None)
        with suite.boot(target, tag="__host_spells", args_extra=a.server_arg) as running:
            client = running.client(timeout_s=600)
            maker = bench.PromptMaker(client, seed=7)
            if running.process is None or running.process.proc is None:
                raise SuiteError("the server has no process of this script's to read; boot it here")
            pids = roles(running.process.pids(), running.process.proc.pid)
            if "engine" not in pids:
                raise SuiteError(f"no VLLM::EngineCore among the server's processes {pids}: is this vLLM's V1 engine?")
            for i in range(a.rounds + 3):
                client.complete(maker.make(16), 2, ignore_eos=True)  # warm, as the bench's rounds are
                before, host0, cpu0 = scrape(client), sample(pids), host_busy()
                with clocks.round() as rc:
                    r = client.stream(maker.make(16), TOKENS, ignore_eos=True, per_chunk_usage=True)
                host1, cpu1, after = sample(pids), host_busy(), scrape(client)
                if before is None or after is None:
                    raise SuiteError("the server has no engine timings on /metrics; run this on vLLM")
                e = EngineRound.between(before, after)
                if e.requests != 1 or r.usage.get("completion_tokens") != TOKENS:
                    raise SuiteError(f"a round finished {e.requests} requests, {r.usage} tokens: is another client on it?")
                if i >= 3:  # the first three warm up
                    busy, steal = busy_cpus(cpu0, cpu1)
                    rounds.append({"tok_s": (TOKENS - 1) / e.decode_s, "host": delta(host0, host1),
                                   "busy_cpus": busy, "steal_cpus": steal,
                                   "probe_us": host_cpu.loop_us(host1.get("engine", {}).get("cpu")), "sm_mhz": rc.sm_mhz,
                                   "sm_min_mhz": rc.sm_min_mhz, "clock_reasons": rc.reasons})
    except SuiteError as e:
        print(f"host_spells: {e}", file=sys.stderr)
        return 2
    lines = compare(rounds)
    (out / "host-spells.json").write_text(json.dumps({"config": target.name, "server_args": a.server_arg,
                                                      "clocks": clocks.describe(), "rounds": rounds,
                                                      "summary": lines}, indent=1))
    clocks.close()
    print(f"tok/s per round: {[round(r['tok_s'], 1) for r in rounds]}")
    print("\n".join(lines))
    print(f"rounds: {out / 'host-spells.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
