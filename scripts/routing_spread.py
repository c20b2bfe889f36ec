#!/usr/bin/env python3
"""How widely a served gpt-oss model routes its tokens over the experts, over a decode window.

    python3 scripts/routing_spread.py --model gpt-oss-120b-shape --config triton-bf16 --out DIR [--tokens 64] \
        [--gpu-memory-utilization 0.92]

Boots the config eagerly (`--enforce-eager`: the counting hook is Python, CUDA graph replays skip it) with the
suite's routes hook (plugins/site/suite_testhooks/routes.py), reads the per-layer counts after boot, runs one
batch-1 request of --tokens tokens and one of --concurrency requests at once, reads them again and reports the
difference: per MoE layer the experts hit, the busiest expert's share, the normalised entropy and how many
experts carry 90% of the slots; beside it the same numbers for uniform random routing of the same number of
tokens (what a load-balanced model approaches). Dummy weights that send every token to the same few experts
show up as a low entropy and a high top share. Writes `routes.json` and `routes.md` under --out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.engine.hooks import RANDOM_MXFP4_ENV, ROUTES_ENV  # noqa: E402
from harness.perf import bench  # noqa: E402
from harness.plugin.options import positive_number  # noqa: E402
from harness.session.suite import Suite  # noqa: E402


def spread(counts: list[int]) -> dict:
    """Spread of one layer's routed slots over its experts."""
    total = sum(counts)
    e = len(counts)
    if total == 0:
        return {"slots": 0, "experts": e, "hit": 0, "top_share": None, "entropy": None, "experts_for_90pct": None}
    p = [c / total for c in counts if c]
    ent = -sum(q * math.log(q) for q in p) / math.log(e) if e > 1 else 1.0
    acc, n90 = 0, 0
    for c in sorted(counts, reverse=True):
        acc += c
        n90 += 1
        if acc >= 0.9 * total:
            break
    return {"slots": total, "experts": e, "hit": len(p), "top_share": round(max(counts) / total, 4),
            "entropy": round(ent, 4), "experts_for_90pct": n90}


def uniform_reference(tokens: int, top_k: int, experts: int, seed: int = 0) -> dict:
    """The same statistics for `tokens` tokens each routed to top_k distinct experts uniformly at random."""
    import random

    rng = random.Random(seed)
    counts = [0] * experts
    for _ in range(tokens):
        for i in rng.sample(range(experts), top_k):
            counts[i] += 1
    return spread(counts)


def window(before: dict, after: dict) -> dict[str, list[int]]:
    """Per-layer counts between two snapshots of the hook's file."""
    out = {}
    for name, now in after.get("layers", {}).items():
        was = before.get("layers", {}).get(name, [0] * len(now))
        out[name] = [a - b for a, b in zip(now, was)]
    return out


def _read(path: Path, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise SuiteError(f"routes hook wrote nothing to {path} in {timeout_s:.0f} s: is plugins/site on the "
                             f"server's PYTHONPATH and the model a gpt-oss MXFP4 one?")
        time.sleep(0.5)
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-120b-shape")
    ap.add_argument("--config", default="triton-bf16")
    ap.add_argument("--tokens", type=positive_number(int), default=64)
    ap.add_argument("--concurrency", type=positive_number(int), default=4)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu-memory-utilization", type=positive_number(float, most=1), default=None, help="override the flavour's fraction (0.70 cannot hold "
                    "the gpt-oss-120b shape on an 80 GB GPU)")
    ap.add_argument("--vllm-dummy-weights", action="store_true", help="a shape model with vLLM's own dummy weights "
                    "(SUITE_HOOK_RANDOM_MXFP4=0) instead of the valid random ones the shape aliases get: reproduces the "
                    "collapsed routing (the router bias picks the same top-4 for every token)")
    ap.add_argument("--boot-timeout", type=positive_number(float), default=900.0)
    a = ap.parse_args(argv)
    try:
        out = writable_dir(Path(a.out), "--out")  # before the boot: a folder it cannot write was a traceback
        routes = out / f"routes-{a.model}-{a.config}.hook.json"
        suite = Suite.create(a.config, a.model, None, None, str(out / "suite-run"), a.boot_timeout)
        target = next(t for t in suite.targets() if t.name == a.config)
        env = {ROUTES_ENV: str(routes), **({RANDOM_MXFP4_ENV: "0"} if a.vllm_dummy_weights else {})}
        with suite.boot(target, tag="__routes", env_extra=env,
                        args_extra=["--enforce-eager"] + (["--gpu-memory-utilization", str(a.gpu_memory_utilization)]
                                                          if a.gpu_memory_utilization else [])) as running:
            client = running.client(timeout_s=600)
            maker = bench.PromptMaker(client, seed=7)
            bench.run_workload(client, maker, bench.Workload("decode", 16, 1, runs=1, warmup=0))
            before = _read(routes)
            bench.run_workload(client, maker, bench.Workload("decode", 16, a.tokens, runs=1, warmup=0))
            bench.run_workload(client, maker, bench.Workload("concurrent", 16, a.tokens, concurrency=a.concurrency,
                                                             runs=1, warmup=0))
            bench.run_workload(client, maker, bench.Workload("decode", 16, 1, runs=1, warmup=0))  # flushes the last step
            after = _read(routes)
    except SuiteError as e:
        print(f"routing_spread: {e}", file=sys.stderr)
        return 2
    per_layer = {name: spread(c) for name, c in window(before, after).items()}
    if not per_layer:
        print("routing_spread: no MoE layer was counted")
        return 1
    first = next(iter(per_layer.values()))
    cfg_file = Path(suite.model.path) / "config.json"
    top_k = int(json.loads(cfg_file.read_text()).get("num_experts_per_tok", 4)) if cfg_file.is_file() else 4
    ref = uniform_reference(first["slots"] // top_k, top_k, first["experts"])
    ents = sorted(v["entropy"] for v in per_layer.values() if v["entropy"] is not None)
    tops = sorted(v["top_share"] for v in per_layer.values() if v["top_share"] is not None)
    summary = {"model": a.model, "config": a.config, "weights": "vllm dummy" if a.vllm_dummy_weights else "model default", "platform": suite.platform.name, "device": suite.platform.device,
               "eager": after.get("eager"), "layers": len(per_layer), "slots_per_layer": first["slots"],
               "entropy_median": ents[len(ents) // 2], "entropy_min": ents[0],
               "top_share_median": tops[len(tops) // 2], "top_share_max": tops[-1], "uniform_reference": ref}
    (out / "routes.json").write_text(json.dumps({"summary": summary, "per_layer": per_layer}, indent=1))
    md = [f"# Routing spread: {a.model}, {a.config} on {suite.platform.device}"
          f"{' (vLLM dummy weights, SUITE_HOOK_RANDOM_MXFP4=0)' if a.vllm_dummy_weights else ''}", "",
          f"{first['slots']} routed slots per layer over a window of one batch-1 request and {a.concurrency} "
          f"concurrent ones ({a.tokens} tokens each; eager: {after.get('eager')}).", "",
          "| | experts hit | busiest expert's share | normalised entropy | experts for 90% |", "|---|---|---|---|---|",
          f"| median layer | {sorted(v['hit'] for v in per_layer.values())[len(per_layer) // 2]} / {first['experts']} "
          f"| {summary['top_share_median']} | {summary['entropy_median']} | "
          f"{sorted(v['experts_for_90pct'] for v in per_layer.values())[len(per_layer) // 2]} |",
          f"| worst layer | {min(v['hit'] for v in per_layer.values())} | {summary['top_share_max']} | "
          f"{summary['entropy_min']} | {min(v['experts_for_90pct'] for v in per_layer.values())} |",
          f"| uniform routing, same tokens | {ref['hit']} | {ref['top_share']} | {ref['entropy']} | "
          f"{ref['experts_for_90pct']} |"]
    (out / "routes.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
