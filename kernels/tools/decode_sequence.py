"""The MoE of a batch-1 decode step as the served model runs it, in one process without vLLM: how much of the
in-model MoE's extra time per layer the launch sequence itself explains.

    python -m kernels.tools.decode_sequence [--layers 12] [--rounds 5] [--out F.json]

In the served model's decode steps (plugin_e2e's decode window, gpt-oss-120b shape, H200) the plugin's MoE takes
28.4 us per layer with vLLM's router GEMM, against 28.0 for `served` below; with the fused route 24.3 (20b shape,
same expert sizes), against 24.2 for `route+experts` (kernels/NOTES.md, 2026-12-01). The
sequences below differ by one step each. Each is captured as one CUDA graph over `--layers` layers with their own
weights (a layer's ~1.7 GB of packed experts keeps its reads cold, as they are in the model) and replayed; every
round times every sequence, in alternating order, so the spread between rounds is an A/A of the method:

  experts        gate_up + down with the ids precomputed (the bench's `us_packed`, over distinct layers)
  route+experts  our route kernel (router GEMV + top-k in one launch) then the experts (the bench's router path)
  served         the router as vLLM runs it (torch.nn.functional.linear on the bf16 weights: cuBLAS, which does not
                 trigger programmatic dependent launch), then topk_from_logits, then the experts: what the plugin's
                 apply_monolithic launches
  served+dense   `served` after a stand-in of the layer's other decode work (qkv and o_proj as bf16 F.linear)
  dense          that stand-in alone; served+dense - dense is the MoE's time in that company

Per layer, microseconds: median over rounds, and each round. Compare `served+dense - dense` with the served model's
MoE kernels plus its router GEMM (plugin_e2e's breakdown counts the router GEMM as dense): what is left costs in the
model but not here (the L2 left by attention, clocks, the host).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch

from ..cases import LINEAR_SHAPES, MOE
from .timing import time_calls

SEQUENCES = ("experts", "route+experts", "served", "served+dense", "dense")


def build_layers(n: int, seed: int = 7) -> list[dict]:
    """n MoE layers of random MXFP4 experts (packed copies only), bf16 router weights and bias, a token x, the ids
    and weights the served routing gives it (so `experts` runs the same experts as `served`), and bf16 qkv / o_proj
    weights for the dense stand-in."""
    from .bench import random_moe_layer

    layers = []
    for i in range(n):
        gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, g = random_moe_layer(seed + i)
        del gu_p, gu_s, d_p, d_s  # the checkpoint layout: the plugin frees it after packing
        router_w = (torch.randn(MOE.experts, MOE.hidden, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        router_b = (torch.randn(MOE.experts, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
        x = torch.randn(1, MOE.hidden, generator=g, device="cuda").to(torch.bfloat16)
        ids, wts = served_routing(x, router_w, router_b)
        (qn, qk), (on, ok) = LINEAR_SHAPES["qkv"], LINEAR_SHAPES["o_proj"]
        layers.append({
            "gu": gu_q, "gu_b": gu_b, "d": d_q, "d_b": d_b, "rw": router_w, "rb": router_b, "x": x, "ids": ids,
            "wts": wts, "out": torch.empty_like(x),
            "qkv_w": (torch.randn(qn, qk, generator=g, device="cuda") * 0.02).to(torch.bfloat16),
            "o_w": (torch.randn(on, ok, generator=g, device="cuda") * 0.02).to(torch.bfloat16),
            "xo": torch.randn(1, ok, generator=g, device="cuda").to(torch.bfloat16),
        })
        torch.cuda.empty_cache()
    return layers


def served_routing(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor):
    """vLLM's router GEMM (bf16 logits) then the plugin's top-k: (ids int32, weights float32)."""
    from .. import cuda_ext

    return cuda_ext.topk_from_logits(torch.nn.functional.linear(x, router_w, router_b), MOE.top_k)


def sequence(name: str, layers: list[dict]) -> Callable[[], None]:
    """One call = the named sequence over every layer, in order."""
    from ..moe import moe_forward_packed, mxfp4_moe_packed

    def experts(ly, ids, wts):
        mxfp4_moe_packed(ly["x"], ids, wts, ly["gu"], ly["gu_b"], ly["d"], ly["d_b"], out=ly["out"])

    def served(ly):
        experts(ly, *served_routing(ly["x"], ly["rw"], ly["rb"]))

    def dense(ly):
        torch.nn.functional.linear(ly["x"], ly["qkv_w"])
        torch.nn.functional.linear(ly["xo"], ly["o_w"])

    steps: dict[str, Callable[[dict], None]] = {
        "experts": lambda ly: experts(ly, ly["ids"], ly["wts"]),
        "route+experts": lambda ly: moe_forward_packed(ly["x"], ly["rw"], ly["rb"], ly["gu"], ly["gu_b"], ly["d"],
                                                       ly["d_b"], MOE.top_k, out=ly["out"]),
        "served": served,
        "served+dense": lambda ly: (dense(ly), served(ly)),
        "dense": dense,
    }
    step = steps[name]

    def run() -> None:
        for ly in layers:
            step(ly)
    return run


def summarize(rounds: dict[str, list[float]]) -> dict:
    """Per sequence: median and rounds (us per layer), and the ratio of the median to `experts`'; the MoE's share
    beside the dense stand-in (served+dense - dense)."""
    med = {k: statistics.median(v) for k, v in rounds.items() if v}
    res = {k: {"us_per_layer": round(med[k], 2), "rounds": [round(t, 2) for t in rounds[k]],
               "spread_pct": round(100 * (max(rounds[k]) - min(rounds[k])) / med[k], 2)} for k in med}
    if "experts" in med:
        for k in med:
            res[k]["vs_experts"] = round(med[k] / med["experts"], 3)
    if "served+dense" in med and "dense" in med:
        res["moe_beside_dense"] = {"us_per_layer": round(med["served+dense"] - med["dense"], 2)}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12, help="distinct layers per sequence (each ~1.7 GB of experts)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each times every sequence, alternating the order")
    ap.add_argument("--reps", type=int, default=30, help="graph replays per sequence and round (median)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    if a.layers < 1 or a.rounds < 1 or a.reps < 1:
        print("decode_sequence: --layers, --rounds and --reps must be at least 1")
        return 2
    if not torch.cuda.is_available():
        print("kernels.tools.decode_sequence needs CUDA: no CUDA GPU is visible to torch (torch.cuda.is_available() "
              "is False)")
        return 2
    layers = build_layers(a.layers)
    runs = {name: sequence(name, layers) for name in SEQUENCES}
    rounds: dict[str, list[float]] = {name: [] for name in SEQUENCES}
    for r in range(a.rounds):
        for name in (SEQUENCES if r % 2 == 0 else SEQUENCES[::-1]):
            try:
                rounds[name].append(time_calls([runs[name]], a.reps, 1) / a.layers)
            except Exception as ex:  # noqa: BLE001 - one sequence failing must not hide the others
                print(f"  {name}: FAILED {type(ex).__name__}: {str(ex)[:300]}", file=sys.stderr, flush=True)
    res = {"device": torch.cuda.get_device_name(), "layers": a.layers, "rounds": a.rounds, "reps": a.reps,
           "sequences": summarize(rounds)}
    for name, v in res["sequences"].items():
        extra = f"  ({v['vs_experts']:.3f}x experts, spread {v['spread_pct']:.1f}%)" if "vs_experts" in v else ""
        print(f"{name:16s} {v['us_per_layer']:8.2f} us per layer{extra}", flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    failed = [name for name, r in rounds.items() if not r]
    if failed:
        print(f"decode_sequence: {', '.join(failed)} failed in every round (the reason is above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
