#!/usr/bin/env python3
"""End-to-end decode speed of this repository's kernels inside vLLM (the suite_kernels plugin) against stock vLLM.

    python3 scripts/plugin_e2e.py --model gpt-oss-120b-shape --configs triton-bf16,gemv-bf16,gemv-bf16-mxfp4-all \
        --out DIR [--gpu-memory-utilization gemv-bf16=0.93]

Without --configs: upstream vLLM's stock MoE on this platform (configs/features.yaml `baselines:`: triton-bf16 on
Hopper, marlin-bf16 on GB10, where vLLM refuses the Triton MoE), gemv-bf16, gemv-bf16-mxfp4-all.

Boots each config in turn the way the suite does (one GPU holds one gpt-oss-120b shape at a time), measures
the same workloads on each (engine clock, warm-up first, median of the rounds), stops it, and writes
`e2e.json`, `e2e.md` and `breakdown.png` under --out after every config, so a call cut off by its time limit
keeps what it measured and a second call with the same --out measures only the configs still missing.
The kernel-time breakdown (MoE / dense / attention / other, GPU idle, launches per token) of a window of batch-1
decode steps is the feature verdicts' (`decode_breakdown`: the profiler starts after the stream's first token, so no
prefill is inside), its categories the flavour files' data.

A config entry may carry extra server environment or vLLM server arguments,
`CONFIG+VAR=VALUE[+--flag=value...]`, to compare a plugin option or a serving setting against the same config without
it in one run (e.g. `gemv-bf16-mxfp4-all,gemv-bf16-mxfp4-all+SUITE_KERNELS_ROUTE=fused`, or
`triton-bf16,triton-bf16+--stream-interval=8`).
`--decode-only` measures batch-1 decode alone, with more rounds (tg32 x24, tg128 x8) and the decode breakdown: the
spread of a host-bound decode needs rounds, and a boot spends no time on the other workloads. `--batch-only` measures
tg32 at 4 and 32 concurrent requests alone (x8 rounds, no profiling): a kernel path for M > 16 against stock, a boot each.
`--warm` first boots the first entry and runs each workload once, discarded. On a fresh H200 (2026-11-30) the first
boot compiled, and it ran engine-clock pp2048 26% slower than the next boot, whose prefill ran the same kernels
(`pp2048_gpu` within 0.2%): whichever config comes first would be judged on the host.

Workloads: tg32 and tg128 at batch 1 (16-token prompt, the seed's headline decode), tg32 at 4 concurrent
requests (M=4: still the plugin's decode kernels), tg32 at 32 concurrent requests (above the plugin's
threshold: kernels/packed_mm.py on the same packed weights) and pp2048 (prefill: packed_mm too). Every boot, in
every mode, admits 32 sequences (`--max-num-seqs=32` after the flavour's flags; an entry's own `+--max-num-seqs=N`
wins, and e2e.md says what each boot admitted and the most requests /metrics showed running at once in each
concurrent workload): the users' flags admit 2, which would time tg32@c32 as batch-2 decode behind a queue. Ratios
are against the first config; used memory and KV capacity are vLLM's own accounting from the server log (at those
32 sequences).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.config.catalog import Catalog  # noqa: E402
from harness.core import stats  # noqa: E402
from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.core.platform import detect_platform  # noqa: E402
from harness.plugin.options import positive_number  # noqa: E402
from harness.kernelpath.breakdown import Breakdown, busy_us_per_token, plot_breakdowns, tokens_note  # noqa: E402
from harness.perf.regression import HOST_BOUND_RATIO  # noqa: E402
from harness.engine.hooks import RANDOM_MXFP4_ENV  # noqa: E402
from harness.engine.server import max_num_seqs  # noqa: E402
from harness.engine.server_metrics import metric_value  # noqa: E402
from harness.features.run import BREAKDOWN_TOKENS, decode_breakdown, prefill_breakdown  # noqa: E402
from harness.features.spec import flavour_baseline  # noqa: E402
from harness.perf import bench  # noqa: E402
from harness.perf import metrics as perf  # noqa: E402
from harness.perf.benchmark import kernel_time_probe  # noqa: E402
from harness.perf.memory import server_memory  # noqa: E402
from harness.session.suite import Suite  # noqa: E402
from harness.stress.burst import SchedulerWatch  # noqa: E402

WORKLOADS = (
    bench.Workload("decode", 16, 32, runs=8, warmup=3),
    bench.Workload("decode", 16, 128, runs=6, warmup=2),
    bench.Workload("concurrent", 16, 32, concurrency=4, runs=6, warmup=2),
    bench.Workload("concurrent", 16, 32, concurrency=32, runs=4, warmup=2),
    bench.Workload("prefill", 2048, 2, runs=6, warmup=2),
)
# batch-1 decode alone (--decode-only): a host-bound decode moves in runs of several rounds at one speed (the 20b shape on
# an H200, 2026-12-02: 640, 634, then 452, 452, then 641 tok/s), so its spread needs more rounds than the full set gives
DECODE_ONLY = (
    bench.Workload("decode", 16, 32, runs=24, warmup=3),
    bench.Workload("decode", 16, 128, runs=8, warmup=2),
)
# the batches alone (--batch-only): tg32 at 4 and 32 concurrent requests with more rounds than the full set, for candidate
# kernel paths of M > 16 against stock; no prefill and no profiled window, so a boot costs little beyond its start
BATCH_ONLY = (
    bench.Workload("concurrent", 16, 32, concurrency=4, runs=8, warmup=2),
    bench.Workload("concurrent", 16, 32, concurrency=32, runs=8, warmup=2),
)
PREFILL_GPU = bench.Workload("prefill", 2048, 1, runs=3, warmup=0)  # pp2048_gpu: GPU kernel time of one prefill
SHOWN = ("tg32", "tg128", "tg32@c4", "tg32@c32", "pp2048", "pp2048_gpu")
PLUGIN_CONFIGS = ("gemv-bf16", "gemv-bf16-mxfp4-all")  # measured after the platform's stock by default
PLOT_NAME = "breakdown.png"  # one stacked bar per config, the first config first


def parse_entry(entry: str) -> tuple[str, dict[str, str], list[str]]:
    """`CONFIG` or `CONFIG+VAR=VALUE[+--flag=value...]` -> (config, extra server environment, extra server arguments)."""
    config, *pairs = entry.split("+")
    env, args = {}, []
    for pair in pairs:
        if pair.startswith("--"):
            flag, sep, value = pair.partition("=")
            if len(flag) < 3 or not flag[2:].replace("-", "").isalnum() or (sep and not value):
                raise SuiteError(f"--configs entry {entry!r}: {pair!r} is not a server argument --flag or --flag=value "
                                 f"(e.g. {config}+--stream-interval=8; a value without + or ,)")
            args.append(pair)
            continue
        var, sep, value = pair.partition("=")
        if not sep or not var.isidentifier() or not var.isupper() or not value:
            raise SuiteError(f"--configs entry {entry!r}: {pair!r} is not VAR=VALUE or --flag=value (e.g. "
                             f"{config}+SUITE_KERNELS_ROUTE=fused; an upper-case variable, a value without + or ,)")
        env[var] = value
    return config, env, args


def memory_overrides(pairs: list[str]) -> dict[str, str]:
    """`--gpu-memory-utilization CONFIG=FRACTION` values -> {config or entry: fraction}."""
    util = {}
    for kv in pairs:
        name, sep, frac = kv.partition("=")
        try:
            ok = bool(sep and name.strip()) and 0 < float(frac) <= 1
        except ValueError:
            ok = False
        if not ok:  # a bare fraction names no config: it would apply to none of them
            raise SuiteError(f"--gpu-memory-utilization {kv!r}: use the form --gpu-memory-utilization CONFIG=FRACTION "
                             f"(e.g. gemv-bf16=0.93), once per config")
        util[name.strip()] = frac.strip()
    return util


def load_results(res_file: Path) -> dict[str, dict]:
    """The results an earlier call wrote to `res_file` (none if it is absent), so a resumed --out measures only the
    configs still missing."""
    if not res_file.exists():
        return {}
    try:
        results = json.loads(res_file.read_text())["results"]
        if not isinstance(results, dict) or not all(isinstance(r, dict) for r in results.values()):
            raise TypeError("'results' is not a mapping of config to result")
    except (OSError, ValueError, KeyError, TypeError) as e:  # ValueError: not JSON; KeyError: no 'results'
        why = e.strerror if isinstance(e, OSError) else f"no {e}" if isinstance(e, KeyError) else str(e)
        raise SuiteError(f"{res_file} is not the e2e.json of an earlier call ({why}): delete it to measure every "
                         f"config again, or choose another --out") from None
    return results


def _summary(entry: dict) -> dict:
    # the samples and their GPU clocks too: a decode CV of 10-15% (plugin) against 0.1-3% (stock) needs its shape
    # (one slow round, a drift, two modes) before a cause can be named
    return {"median": stats.median(entry["samples"]), "cv": stats.cv(entry["samples"]), "n": len(entry["samples"]),
            "samples": [round(v, 2) for v in entry["samples"]], "rounds": entry.get("rounds")}


GAPS_KEPT = 4  # requests per decode workload whose token gaps are kept


def token_gaps(requests: list) -> list[list[float]]:
    """The client's gaps between consecutive streamed tokens (ms) of the first GAPS_KEPT requests of a batch-1 decode
    workload: whether a slow decode pays once per request (one long gap) or in every step (a higher median). The
    plugin's 20b read tg32 at 262 and tg128 at 406-566 tok/s in one H100 run (2026-12-07), where the run before read
    585; the rates alone cannot say which."""
    return [[round(g, 2) for g in perf.itl_ms(r)] for r in requests[:GAPS_KEPT]]


def gaps_lines(config: str, gaps: dict[str, list[list[float]]]) -> list[str]:
    """One line per workload: per request, its median gap, its longest gap and that gap's place (1 = the gap after
    the first token)."""
    lines = []
    for label, per_request in gaps.items():
        cells = [f"median {stats.median(g):.2f}, longest {max(g):.2f} (gap {g.index(max(g)) + 1} of {len(g)})"
                 for g in per_request if g]
        if cells:
            lines.append(f"- {config}, {label}: " + "; ".join(cells))
    return lines


def _tag(env_extra: dict[str, str] | None, warm: bool = False, args: list[str] | None = None) -> str:
    """The boot's tag: its server log and hook directory apart from every other entry's."""
    suffix = "".join(f"_{k.lower()}-{v}" for k, v in sorted((env_extra or {}).items()))
    suffix += "".join(f"_{a.lstrip('-')}" for a in args or [])
    return "__e2e" + ("_warm" if warm else "") + "".join(c if c.isalnum() or c in "-_." else "_" for c in suffix)


# what a boot measures
ALL, PREFILL_GPU_ONLY, DECODE_ONLY_MODE, BATCH_ONLY_MODE = ("all", "pp2048_gpu only", "batch-1 decode only",
                                                            "concurrent decode only")


def _workloads(mode: str) -> tuple[bench.Workload, ...]:
    return {ALL: WORKLOADS, PREFILL_GPU_ONLY: (), DECODE_ONLY_MODE: DECODE_ONLY, BATCH_ONLY_MODE: BATCH_ONLY}[mode]


def _profiles_prefill(mode: str) -> bool:
    return mode in (ALL, PREFILL_GPU_ONLY)


def _profiles_decode(mode: str) -> bool:
    return mode in (ALL, DECODE_ONLY_MODE)


# The sequences every boot admits, whatever the mode (one server setting, so a --decode-only tg32 compares with the full
# set's): the full set's largest concurrency. The users' flags cap a server at `--max-num-seqs 2` (configs/flavours),
# under which tg32@c4 and tg32@c32 time batch-2 decode behind a queue and never reach the plugin's M > 16 path: an
# H100 run of 2026-12-07 did (its server log: 2 running, 24 waiting; docs/evidence/sm_90-2026-12-07-h100-sparse-moe-tokens),
# as every earlier run of this script had.
SERVER_SEQS = max(w.concurrency for w in WORKLOADS)


def boot_args(gpu_memory_utilization: str | None, seqs: int | None, entry_args: list[str]) -> list[str]:
    """A boot's server arguments beyond the flavour's: they come after its flags (the later flag wins), and the entry's
    own come last, so `CONFIG+--max-num-seqs=N` still wins over the mode's sequences."""
    return ((["--gpu-memory-utilization", gpu_memory_utilization] if gpu_memory_utilization else [])
            + ([f"--max-num-seqs={seqs}"] if seqs else []) + entry_args)


def warm_up(suite: Suite, name: str, args_extra: list[str], env_extra: dict[str, str] | None,
            mode: str) -> None:
    """One boot and one round of each workload, discarded (see --warm)."""
    target = next(t for t in suite.targets() if t.name == name)
    if not target.runnable:
        return
    with suite.boot(target, tag=_tag(env_extra, True, args_extra), args_extra=args_extra, env_extra=env_extra) as running:
        client = running.client(timeout_s=600)
        maker = bench.PromptMaker(client, seed=7)
        for w in _workloads(mode) or (PREFILL_GPU,):
            bench.run_workload(client, maker, dataclasses.replace(w, runs=1, warmup=0))


# A concurrent workload's /metrics poll (seconds): a few light requests a second beside its streams, for the most
# requests the engine ran at once. The boot's --max-num-seqs says what it admitted; this says what the workload reached
# (every tg32@c32 before 2026-12-07 ran at batch 2, seen only in a server log).
PEAK_POLL_S = 0.25
T = TypeVar("T")


def run_watched(read_metric: Callable[[str], float], run: Callable[[], T]) -> tuple[T, int | None]:
    """run() while /metrics is polled: (its result, the most requests seen running at once; None where no reading saw
    a request running or waiting, e.g. /metrics unreadable)."""
    with SchedulerWatch(read_metric, interval_s=PEAK_POLL_S) as watch:
        result = run()
    return result, (int(watch.max_running) if watch.busy_samples else None)


def measure(suite: Suite, name: str, args_extra: list[str], env_extra: dict[str, str] | None = None,
            mode: str = ALL) -> dict:
    target = next(t for t in suite.targets() if t.name == name)
    if not target.runnable:
        return {"skipped": target.reason}
    t0 = time.monotonic()
    with suite.boot(target, tag=_tag(env_extra, args=args_extra), args_extra=args_extra, env_extra=env_extra) as running:
        client = running.client(timeout_s=600)
        maker = bench.PromptMaker(client, seed=7)
        metrics: dict[str, dict] = {}
        gaps: dict[str, list[list[float]]] = {}
        peaks: dict[str, int | None] = {}
        for w in _workloads(mode):
            if w.concurrency > 1:
                m, peaks[bench.metric_names(w)[-1]] = run_watched(lambda n: metric_value(running.url, n),
                                                                  lambda w=w: bench.run_workload(client, maker, w))
            else:
                m = bench.run_workload(client, maker, w)
            for metric, entry in bench.metrics_for(w, m).items():
                metrics[metric] = _summary(entry)
            if w.kind == "decode":
                gaps[f"tg{w.tg}"] = token_gaps(m.requests)
        if running.trace_dir is not None and _profiles_prefill(mode):
            # the engine-clock pp2048 holds host time (scheduling, launches) that moved stock's median by 24% between
            # boots; the kernels' own time is what a prefill kernel changes (the gate's ppN_gpu)
            try:
                entry = bench.gpu_prefill(client, maker, PREFILL_GPU, kernel_time_probe(running))
                metrics["pp2048_gpu"] = {**_summary(entry),
                                         **{k: entry[k] for k in ("unresolved", "flagged") if k in entry}}
            except SuiteError as e:  # the decode metrics above stay measured
                metrics["pp2048_gpu"] = {"error": str(e).splitlines()[0][:300]}
        kernels, notes, prefill = None, [], None
        if running.trace_dir is not None and _profiles_prefill(mode):
            prefill = prefill_breakdown(suite, running, maker.make(PREFILL_GPU.pp), notes)
        if _profiles_decode(mode):
            # decode steps only: a profiled request would hold its prompt's prefill and its warm-up request's, which
            # at 16 tokens read ~50 of 128 experts per layer (the plugin on the 120b shape, H200: 342 us per token of GPU
            # busy time that decode does not spend, 13% of it; 288 us of MoE, 8 us per layer)
            kernels = decode_breakdown(suite, running, notes)
        log = running.log_path.read_text(errors="replace") if running.log_path else ""
        mem = server_memory(running, suite.platform.is_cuda)
        return {"boot_s": round(running.boot_seconds, 1), "total_s": round(time.monotonic() - t0, 1),
                "args_extra": args_extra, "metrics": metrics, "token_gaps_ms": gaps, "peak_running": peaks,
                "kernel_breakdown": kernels, "breakdown_notes": notes,
                "prefill_breakdown": prefill,
                "memory": {k: mem.get(k) for k in ("used_gib", "used_source", "kv_capacity_tokens")},
                "plugin_lines": [ln.strip()[-220:] for ln in log.splitlines() if "suite_kernels" in ln][:40],
                # whether vLLM overlapped the host's next step with the GPU's current one: the first thing to know
                # when the GPU waits for the host
                "scheduling_lines": [ln.strip()[-160:] for ln in log.splitlines() if "sync scheduling" in ln][:4]}


def mixed_setting(results: dict[str, dict], setting: dict) -> str | None:
    """Why an --out's earlier results may not share a table with this run's (None: they may)."""
    for name, r in results.items():
        then = {k: r.get(k, "all" if k == "workloads" else None) for k in setting}  # before that key: all workloads
        if "metrics" in r and then != setting:
            return f"holds {name} measured with {then}, this run is {setting}"
    return None


def _cell(b: dict, key: str) -> str:
    """A breakdown number, or '-' for results written before the breakdown had it (an earlier --out)."""
    return "-" if b.get(key) is None else f"{b[key]:.0f}"


# A median whose samples spread wider than this is shown with its CV: a 20b run on a shared host had samples at 1.0x
# and 1.33x stock and a median matching neither, and the table alone read as a clean 1.15x.
SPREAD_SHOWN = 0.02


def _noisy(metric: dict) -> bool:
    cv = metric.get("cv")
    return cv is not None and not math.isnan(cv) and cv > SPREAD_SHOWN


def _spread(metric: dict) -> str:
    return f", CV {metric['cv']:.1%}" if _noisy(metric) else ""


# A batch-1 decode step this much longer than its kernels (per token, from the profiled decode window) leaves the GPU idle
# for >= 9% of the step: the step follows vLLM's host side, not the kernels. The level 5 gate uses the same factor.
HOST_BOUND = HOST_BOUND_RATIO


def decode_bounds(results: dict[str, dict], order: list[str]) -> list[str]:
    """Per config: is batch-1 decode (tg32) bound by its kernels or by the host? A host-bound step hides part of a kernel
    change and spreads with the host's time per step, so its tg32 ratio and CV judge the host, not the kernels.

    Each line also gives the share of the tg32 step the kernels fill, and its distance in points from the first
    config's: the GPU's busy fraction in tg32's own steps. The profiled window's busy fraction (the breakdown table)
    is lower, because the profiler's host cost widens that window's idle."""
    lines, first_share = [], None
    for c in order:
        r = results.get(c) or {}
        b, tg = r.get("kernel_breakdown"), r.get("metrics", {}).get("tg32", {})
        if not b or not tg.get("median") or not b.get("total_us_per_token"):
            continue
        kernels_ms, step_ms = busy_us_per_token(b) / 1000, 1000 / tg["median"]
        samples = [1000 / v for v in tg.get("samples") or [] if v]
        spread = f" (samples {min(samples):.2f}-{max(samples):.2f})" if samples and _noisy(tg) else ""
        share = kernels_ms / step_ms
        if first_share is None:
            first_share = (c, share)
            busy = f"{share:.1%} of the step"
        else:
            busy = f"{share:.1%} of the step, {100 * (share - first_share[1]):+.1f} points against {first_share[0]}"
        if step_ms > HOST_BOUND * kernels_ms:
            verdict = (f"host-bound: the GPU waits for vLLM's host side, so tg32 measures the host as much as the "
                       f"kernels (they alone allow {1000 / kernels_ms:.1f} tok/s)")
        else:
            verdict = "kernel-bound: tg32 follows the kernels"
        lines.append(f"- {c}: tg32 step {step_ms:.2f} ms per token{spread}, kernels {kernels_ms:.2f} ms ({busy}): "
                     f"{verdict}.")
    return lines


def table(results: dict[str, dict], order: list[str]) -> list[str]:
    ref = next((results[c]["metrics"] for c in order if "metrics" in results.get(c, {})), None)
    head = ("| config | boot (s) | used GiB | KV tokens | " + " | ".join(f"{m} tok/s (ratio)" for m in SHOWN)
            + " |")
    lines = [head, "|" + "---|" * (len(SHOWN) + 4)]
    for c in order:
        r = results.get(c)
        if r is None:
            lines.append(f"| {c} | not measured yet (the run stopped before it, or is still going) |" + " |" * (len(SHOWN) + 2))
            continue
        if "metrics" not in r:
            lines.append(f"| {c} | {r.get('skipped') or r.get('error')} |" + " |" * (len(SHOWN) + 2))
            continue
        cells = []
        for m in SHOWN:
            v = r["metrics"].get(m, {}).get("median")
            base = (ref or {}).get(m, {}).get("median")
            cells.append("n/a" if v is None else f"{v:.1f} ({v / base:.2f}x{_spread(r['metrics'][m])})" if base
                         else f"{v:.1f}")
        mem = r.get("memory") or {}
        used, kv = mem.get("used_gib"), mem.get("kv_capacity_tokens")
        lines.append(f"| {c} | {r['boot_s']} | {'-' if used is None else f'{used:.2f}'} | "
                     f"{'-' if kv is None else f'{kv:,}'} | " + " | ".join(cells) + " |")
    return lines


def moe_per_call(results: dict[str, dict], order: list[str]) -> list[str]:
    """The MoE kernels of the profiled decode window, us per call: at batch 1 one call is one layer's, the number the
    kernel benches give (`kernels.tools.decode_sequence`). Own time counts overlaps once: a kernel started early by
    programmatic dependent launch waits inside its recorded duration."""
    rows = []
    for c in order:
        b = (results.get(c) or {}).get("kernel_breakdown") or {}
        for t in b.get("top") or []:
            if t["category"] == "moe" and t["calls"]:
                per_call = b["tokens"] / t["calls"]
                own = t.get("exclusive_us_per_token")
                rows.append(f"| {c} | {t['name'][:90]} | {t['calls'] / b['tokens']:.2f} | {t['us_per_token'] * per_call:.1f} | "
                            f"{'-' if own is None else f'{own * per_call:.1f}'} |")
    if not rows:
        return []
    return ["", "MoE kernels among the breakdown's top kernels, us per call (batch 1: one call per layer and token), "
            "recorded and own (overlaps counted once, for the earlier kernel):", "", "| config | kernel | calls per token | recorded | own |",
            "|---|---|---|---|---|"] + rows


def prefill_table(results: dict[str, dict], order: list[str]) -> list[str]:
    """Where one profiled 2048-token prefill's kernel time goes, per config (ms), and each config's costliest kernels:
    `pp2048_gpu` says how far a config's prefill is from the first config's, this says in which kernels."""
    drawn = [(c, b) for c in order if (b := (results.get(c) or {}).get("prefill_breakdown"))]
    if not drawn:
        return []
    first = drawn[0][1]
    md = ["", f"Kernel time of one profiled {PREFILL_GPU.pp}-token prefill (ms, overlaps counted once; in brackets the "
          f"difference from {drawn[0][0]}):", "",
          "| config | MoE | dense | attention | other | busy | launches |", "|---|---|---|---|---|---|---|"]

    def cell(b: dict, us_of) -> str:  # ms, and after the first config its difference from the first's
        ms, ms0 = us_of(b) / 1e3, us_of(first) / 1e3
        return f"{ms:.2f}" if b is first else f"{ms:.2f} ({ms - ms0:+.2f})"
    for c, b in drawn:
        cells = [cell(b, lambda x, cat=cat: x["exclusive_us_per_token"][cat])
                 for cat in ("moe", "dense", "attention", "other")]
        cells.append(cell(b, lambda x: x["busy_us_per_token"]))
        md.append(f"| {c} | " + " | ".join(cells) + f" | {b['launches_per_token']:.0f} |")
    md += ["", "Costliest kernels of that prefill (us, summed over its calls; overlaps counted once):", "",
           "| config | kernel | category | calls | us |", "|---|---|---|---|---|"]
    for c, b in drawn:
        md += [f"| {c} | {t['name'][:90]} | {t['category']} | {t['calls']} | "
               f"{t['exclusive_us_per_token'] if t.get('exclusive_us_per_token') is not None else t['us_per_token']:.0f} |"
               for t in b["top"][:6]]
    return md


def seqs_line(results: dict[str, dict], order: list[str]) -> str:
    """What batch the concurrent workloads reached: the sequences each boot admitted (`--max-num-seqs`), and the most
    requests /metrics showed running at once in each concurrent workload (results written before it lack them)."""
    flavours = "the flavour's (the users' flags: 2)"  # results written before each boot said

    def cell(c: str) -> str:
        peaks = results[c].get("peak_running") or {}
        seen = ", ".join(f"{w} {'not seen' if n is None else n}" for w, n in peaks.items())
        return f"{c} {results[c].get('admitted_seqs') or flavours}" + (f" (most running at once: {seen})" if seen else "")

    cells = [cell(c) for c in order if "metrics" in results.get(c, {})]
    return ("Sequences each boot admitted (`--max-num-seqs`; a tg32@cN above it ran that many at a time behind a "
            "queue): " + ", ".join(cells) + ".") if cells else ""


def markdown(results: dict[str, dict], order: list[str], title: str) -> list[str]:
    """e2e.md's lines: the speed table, then each config's decode-time breakdown and host ranges."""
    md = [f"# Kernels plugin end to end: {title}", "",
          "Engine clock (pp2048_gpu: GPU kernel time of one profiled 2048-token prefill), medians after warm-up; "
          "ratio against the first config; a CV after the ratio: samples spread more than "
          f"{SPREAD_SHOWN:.0%}, so the median alone misleads.", "", seqs_line(results, order), ""] + table(results, order)
    md += ["", f"Kernel time per generated token (us), a profiled window of ~{BREAKDOWN_TOKENS} batch-1 decode steps (the "
           "profiler started after the stream's first token: no prefill inside; the profiler's host cost widens the "
           "window's idle, so GPU idle describes the profiled steps, not tg32's); GPU idle = trace wall time - union of the kernels "
           f"(`{PLOT_NAME}`); waiting for the host = the idle between kernels of different host launches "
           "(graph replays, eager kernels), the rest lies inside one graph replay; MoE, overlaps once = MoE kernel time "
           "where kernels overlap (a kernel started early by programmatic dependent launch waits inside its duration) "
           "counted once, for the earlier kernel:", "",
           "| config | ms/token (tg32) | MoE | MoE, overlaps once | dense | attention | other | kernels total | GPU idle | "
           "of which waiting for the host | launches |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in order:
        r = results.get(c, {})
        b, tg = r.get("kernel_breakdown"), r.get("metrics", {}).get("tg32", {}).get("median")
        if b:
            u = b["us_per_token"]
            excl = (b.get("exclusive_us_per_token") or {}).get("moe")
            md.append(f"| {c} | {1000 / tg:.2f} | {u['moe']:.0f} | {'-' if excl is None else f'{excl:.0f}'} | "
                      f"{u['dense']:.0f} | {u['attention']:.0f} | "
                      f"{u['other']:.0f} | {b['total_us_per_token']:.0f} | {_cell(b, 'idle_us_per_token')} | "
                      f"{_cell(b, 'host_wait_us_per_token')} | {_cell(b, 'launches_per_token')} |"
                      if tg else f"| {c} | n/a | | | | | | | | | |")
    md += moe_per_call(results, order)
    md += prefill_table(results, order)
    notes = [f"- {n}" for c in order for n in (results.get(c) or {}).get("breakdown_notes") or []]
    notes += [f"- {c}: {note}." for c in order
              if (note := tokens_note((results.get(c) or {}).get("kernel_breakdown") or {}))]
    md += [""] + notes if notes else []
    bounds = decode_bounds(results, order)
    if bounds:
        md += ["", f"What bounds batch-1 decode (host-bound: the tg32 step is over {HOST_BOUND:.2f}x the kernels' busy "
               "time per token of the profiled decode window, overlapping kernels counted once; their share of the "
               "step is the GPU's busy fraction in tg32's own steps):", ""] + bounds
    gap_lines = [line for c in order for line in gaps_lines(c, (results.get(c) or {}).get("token_gaps_ms") or {})]
    if gap_lines:
        md += ["", f"Gaps between streamed tokens at batch 1 (client clock, ms; the first {GAPS_KEPT} measured requests "
               "of each workload; a cost paid once per request shows as one long gap, a slow step as a higher median):",
               ""] + gap_lines
    for c in order:  # where each step's host time goes (the GPU waits for it): vLLM's phase ranges, ops, runtime
        host = ((results.get(c) or {}).get("kernel_breakdown") or {}).get("host_top") or []
        if host:
            md += ["", f"Host time per token, {c} (inclusive: vLLM's phase ranges hold the calls inside them):", ""]
            md += [f"- {h['name'][:100]} ({h['category']}): {h['us_per_token']:.0f} us, "
                   f"{h['calls_per_token']:.2f} calls" for h in host[:10]]
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-120b-shape")
    ap.add_argument("--configs", default=None, help="default: this platform's stock (upstream's baseline in "
                    "configs/features.yaml), gemv-bf16, gemv-bf16-mxfp4-all")
    ap.add_argument("--gpu-memory-utilization", action="append", default=[], metavar="CONFIG=FRACTION",
                    help="per-config override of the flavour's fraction")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-dummy-weights", action="store_true", help="a shape model with vLLM's own dummy weights "
                    "(SUITE_HOOK_RANDOM_MXFP4=0) instead of the valid random ones the shape aliases get: routing then "
                    "collapses onto four experts per layer and flatters every MoE kernel")
    ap.add_argument("--boot-timeout", type=positive_number(float), default=900.0)
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--prefill-gpu-only", action="store_true",
                      help="measure pp2048_gpu only (GPU kernel time of a 2048-token prefill; no decode workloads)")
    only.add_argument("--decode-only", action="store_true",
                      help="measure batch-1 decode only (tg32 x24, tg128 x8 rounds) and its kernel breakdown")
    only.add_argument("--batch-only", action="store_true",
                      help="measure tg32 at 4 and 32 concurrent requests only (x8 rounds each; no profiling)")
    ap.add_argument("--warm", action="store_true", help="first boot the first entry still to measure and run each "
                    "workload once, discarded (a fresh machine's first boot compiles and disturbs the host)")
    a = ap.parse_args(argv)
    mode = (PREFILL_GPU_ONLY if a.prefill_gpu_only else DECODE_ONLY_MODE if a.decode_only
            else BATCH_ONLY_MODE if a.batch_only else ALL)
    try:
        util = memory_overrides(a.gpu_memory_utilization)
        out = writable_dir(Path(a.out), "--out")
    except SuiteError as e:
        print(f"plugin_e2e: {e}")
        return 2
    try:
        configs = a.configs or ",".join([flavour_baseline("upstream", detect_platform().name), *PLUGIN_CONFIGS])
    except SuiteError as e:
        print(f"plugin_e2e: {e}; or name the stock config first yourself: --configs STOCK,{','.join(PLUGIN_CONFIGS)}")
        return 2
    order = list(dict.fromkeys(c.strip() for c in configs.split(",") if c.strip()))
    if not order:  # `--configs=,` measured nothing and exited 0, which read as a pass
        print(f"plugin_e2e: --configs {configs!r} names no config: pass a comma-separated list such as "
              f"--configs STOCK,{','.join(PLUGIN_CONFIGS)}, or leave --configs out for this platform's default")
        return 2
    res_file = out / "e2e.json"
    try:
        results = load_results(res_file)
        entries = {e: parse_entry(e) for e in order}
        bases = list(dict.fromkeys(config for config, _, _ in entries.values()))
        catalog = Catalog()
        for config in bases:  # Suite.create names its own option, --config, in an unknown name's error
            catalog.parse(config, "--configs")
        suite = Suite.create(",".join(bases), a.model, None, None, str(out / "suite-run"), a.boot_timeout)
    except SuiteError as e:
        print(f"plugin_e2e: {e}")
        return 2
    # what a result was measured with: kept per result, so a resumed --out never mixes weights or kernel settings
    # (e.g. KERNELS_PACKED_MM_* from kernels.tools.bench_prefill --env-out) in one table
    setting = {"weights": "vllm dummy" if a.vllm_dummy_weights else f"model default ({suite.model.fingerprint})",
               "kernel_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("KERNELS_", "SUITE_KERNELS_"))},
               "workloads": mode,
               # before the decode window, a profiled request with two prefills inside (+12.7% busy, 120b shape)
               "breakdown": "decode window" if _profiles_decode(mode) else None,
               # logprobs=1 streams before it: the engine's log-softmax and top-k every step (README)
               "stream": perf.STREAM_REQUEST,
               # the batch the concurrent workloads reach (before this key: the flavour's 2, whatever they asked)
               "max_num_seqs": SERVER_SEQS}
    mixed = mixed_setting(results, setting)
    if mixed:
        print(f"plugin_e2e: {out} {mixed}: use another --out (one table, one setting)")
        return 2

    def server(name: str) -> tuple[str, list[str], dict[str, str] | None]:
        config, env, args = entries[name]
        frac = util.get(name, util.get(config))
        env = {**({RANDOM_MXFP4_ENV: "0"} if a.vllm_dummy_weights else {}), **env}
        return config, boot_args(frac, SERVER_SEQS, args), env or None

    pending = [n for n in order if "metrics" not in results.get(n, {})]
    if a.warm and pending:
        print(f"plugin_e2e: warm-up boot of {pending[0]} (discarded)", flush=True)
        try:
            warm_up(suite, *server(pending[0]), mode)
        except SuiteError as e:
            print(f"plugin_e2e: the warm-up boot failed ({str(e).splitlines()[0][:200]}); measuring anyway", flush=True)
    for name in pending:
        config, extra, env = server(name)
        print(f"plugin_e2e: {name} {' '.join(extra)}", flush=True)
        try:
            # what this boot admitted: the entry's own +--max-num-seqs=N wins over SERVER_SEQS
            results[name] = {**measure(suite, config, extra, env, mode), **setting,
                             "admitted_seqs": max_num_seqs(extra)}
        except SuiteError as e:
            results[name] = {"error": str(e).splitlines()[0][:300]}
        res_file.write_text(json.dumps({"model": a.model, "platform": suite.platform.name,
                                        "device": suite.platform.device, "results": results}, indent=1))
        md = markdown(results, order, f"{a.model} on {suite.platform.device} ({suite.platform.name})")
        (out / "e2e.md").write_text("\n".join(md) + "\n")
        drawn = {c: Breakdown.from_json(results[c]["kernel_breakdown"]) for c in order
                 if "wall_us_per_token" in (results.get(c, {}).get("kernel_breakdown") or {})}
        if drawn:
            plot_breakdowns(drawn, out / PLOT_NAME)
        print("\n".join(md[4:]), flush=True)
    return 0 if all("metrics" in results.get(c, {}) or "skipped" in results.get(c, {}) for c in order) else 1


if __name__ == "__main__":
    raise SystemExit(main())
