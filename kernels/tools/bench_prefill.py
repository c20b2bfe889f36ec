"""Prefill-size GEMMs on the packed layout against what stock vLLM runs there, in one process:
`python -m kernels.tools.bench_prefill [--m 2048] [--out F.json] [--env-out best.env]`.

Why: the served model's prefill (pp2048) ran at ~0.5x stock with `kernels.packed_mm`, and a change to that kernel
counts only when it closes that gap against stock measured in the same run. Stock's paths at these shapes:
BF16 dense layers through cuBLAS (`torch.matmul`), the MoE through vLLM's Triton MoE (OpenAI triton_kernels
`matmul_ogs` on its swizzled MXFP4), imported from the installed vLLM.

Method: gpt-oss-120b shapes (kernels/cases.py) at M tokens; the MoE routes each token to 4 of 128 experts from
random router logits (uniform routing: every expert's weights are read, as in a real prefill; `--routing-skew served`
routes with the spread the served shape models route with instead, some experts taking several times their share,
which changes how many token blocks a tiling runs: kernels/tools/bench.py SERVED_SKEW). Calls are captured
in CUDA graphs and timed with CUDA events after warm-up, median of `--reps` replays (`timing.time_calls`). Every
packed_mm tiling of the grid (block_m x block_tiles x num_warps x num_stages) is timed; the best MoE tiling is
written as KERNELS_PACKED_MM_* lines (`--env-out`) so that a served run can take it; those apply to every packed_mm
kernel launch of the server, the dense layers' below `dequant_min_m` tokens too (which may prefer another tiling: see
the dense rows). From `dequant_min_m` the dense layers multiply a bf16 copy with cuBLAS instead: the dense rows time
that path beside the kernels, and `--dense-m` sweeps M to place the switch. Stock's MoE time
includes its routing from the logits; ours gets the ids precomputed, and the routing the plugin runs before it
(`cuda_ext.topk_from_logits`) is timed on its own, at M and at 1. Where vLLM's Triton MoE is not offered (sm_121)
its time is NaN with the reason printed, and no ratio is given. The CUDA prefill kernel (`impl: cuda`, every
`cuda_ext.PF_VARIANTS` tiling) is timed in the same process as the Triton tilings; where it cannot be built its
entries are NaN with the reason.

`--ab SPEC,SPEC,...` instead times the MoE layer of each SPEC against the first, for a kernel change's verdict: every
SPEC in one process on the same layer and routing, `--rounds` rounds in alternating order (each round a median of
`--reps` graph replays), stock's `matmul_ogs` and Marlin in every round as the yardstick, and each SPEC's output
compared bit for bit with the first's. A SPEC is `served` (this tree's source and the tiling tuning.yaml serves),
`@V` (variant V of cuda_ext.PF_VARIANTS; `@V/W`: V for gate_up, W for down), or `PATH` / `PATH@V` (another
csrc/mxfp4_mma.cu with the same PF_TABLE: add a new tiling to the tree's table first). The verdict (`ab_verdict`)
calls a SPEC faster or slower only when all its rounds lie beyond all of the first's. `--expect faster,identical`
(or `not-slower`) makes it a gate: exit 1, with one line per spec and M that missed, when the A/B did not show it.
`--model gpt-oss-20b` takes that model's MoE layer (32 experts) for the A/B: at a given M it has the 120b's h
and 4x its slots per expert, and the 120b's layer predicted neither of two served 20b results (kernels/NOTES.md).
An older PATH without the down kernel's f16 rows serves fp32 rows (`cuda_ext.down_f16_supported`): PATH against
`served` is then that change's A/B.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

from ..cases import LINEAR_SHAPES, MODELS, MOE, MoeLayer
from .. import cuda_ext
from ..cuda_ext import PF_VARIANTS
from .bench import SERVED_SKEW, random_moe_layer, random_routing, vllm_marlin_moe_fn, vllm_triton_moe_fn
from .timing import time_calls

# Triton: ("triton", block_m, block_tiles, num_warps, num_stages); block_m caps the MoE's per-expert block
# (pick_block_m). The first is tuning.yaml's default entry; the others the static counts' best per token
# (kernels/NOTES.md). CUDA: ("cuda", variant) for each (NT, RT, CTAS, FORM) of cuda_ext.PF_VARIANTS.
GRID = [("triton", bm, bt, w, st) for (bm, bt, w), st in itertools.product([(64, 4, 4), (64, 8, 4), (128, 8, 8)], (3,))]
GRID += [("cuda", v) for v in range(len(PF_VARIANTS))]


def _cfg(c: tuple) -> dict:
    from ..tuning import get_config

    base = get_config("packed_mm")
    if c[0] == "cuda":
        return {**base, "impl": "cuda", "cuda_variant": c[1]}
    _, bm, bt, w, st = c
    return {**base, "impl": "triton", "block_m": bm, "block_tiles": bt, "num_warps": w, "num_stages": st}


def _name(c: tuple) -> str:
    if c[0] == "cuda":
        nt, rt, ctas, form = PF_VARIANTS[c[1]]
        return f"cuda_nt{nt}_rt{rt}_ctas{ctas}_{('f16', 'bf16', 'bf16_wgmma')[form]}"
    return "bm{}_bt{}_w{}_s{}".format(*c[1:])


def env_lines(c: tuple) -> str:
    """The KERNELS_PACKED_MM_* overrides that make a served run use grid entry c."""
    if c[0] == "cuda":
        return f"export KERNELS_PACKED_MM_IMPL=cuda KERNELS_PACKED_MM_CUDA_VARIANT={c[1]}\n"
    _, bm, bt, w, st = c
    return (f"export KERNELS_PACKED_MM_IMPL=triton KERNELS_PACKED_MM_BLOCK_M={bm} KERNELS_PACKED_MM_BLOCK_TILES={bt} "
            f"KERNELS_PACKED_MM_NUM_WARPS={w} KERNELS_PACKED_MM_NUM_STAGES={st}\n")


def _timed(what: str, calls, reps: int, inner: int) -> float:
    try:
        return round(time_calls(calls, reps, inner), 1)
    except Exception as ex:  # noqa: BLE001 - one configuration failing (shared memory, registers) must not lose the rest
        print(f"  {what}: FAILED {type(ex).__name__}: {str(ex)[:200]}", file=sys.stderr, flush=True)
        return float("nan")


def _time_entry(c: tuple, call, reps: int, inner: int) -> float:
    """call(cfg) timed for grid entry c; a CUDA entry where the prefill kernel cannot be built is NaN (with the
    reason), never the Triton fallback under a CUDA name."""
    if c[0] == "cuda":
        from ..cuda_ext import prefill_available, variant_problem

        ok, why = prefill_available()
        if not ok:
            print(f"  {_name(c)}: not built ({why[:200]})", file=sys.stderr, flush=True)
            return float("nan")
        if variant_problem(c[1]):  # a wgmma tiling off Hopper: not this device's, not a failure
            print(f"  {_name(c)}: not run ({variant_problem(c[1])})", file=sys.stderr, flush=True)
            return float("nan")
    cfg = _cfg(c)
    return _timed(_name(c), [lambda: call(cfg)], reps, inner)


def _best(res: dict, stock_key: str, label: str) -> tuple | None:
    """Fastest grid entry that ran (NaN: it failed) into res["best"], its speed over stock's (when stock ran) into
    res["best_over_stock"]; prints the section's line. -> the entry, or None."""
    best = min((c for c in GRID if res[f"us_{_name(c)}"] == res[f"us_{_name(c)}"]),
               key=lambda c: res[f"us_{_name(c)}"], default=None)
    res["best"] = _name(best) if best else None
    if best and res[stock_key] == res[stock_key]:  # stock measured (not NaN)
        res["best_over_stock"] = round(res[stock_key] / res[f"us_{_name(best)}"], 3)
    print(f"  {label} {res[stock_key]} us; " + ", ".join(f"{_name(c)} {res[f'us_{_name(c)}']}" for c in GRID) +
          f"; best {res['best']} = {res.get('best_over_stock')}x stock's speed", flush=True)
    return best


def _dense_inputs(name: str, m: int, g: torch.Generator) -> tuple:
    from ..packed import pack_mxfp4
    from ..testing import random_mxfp4

    n, k = LINEAR_SHAPES[name]
    w, s = random_mxfp4((n, k), g)
    wbf = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    return n, k, pack_mxfp4(w, s), wbf, x, torch.empty(m, n, dtype=torch.bfloat16, device="cuda")


def bench_dense(m: int, reps: int) -> list[dict]:
    """Each tiling of the kernels, the dequantize + BLAS path (and its dequantize alone) against cuBLAS on BF16
    weights (stock's dense layers), at M tokens."""
    from ..packed_mm import dequantize_packed, mxfp4_mm_packed
    from ..testing import generator
    from ..tuning import get_config

    g = generator(7, "cuda")
    rows = []
    blas = {**get_config("packed_mm"), "dequant_min_m": 1}
    for name in ("qkv", "o_proj"):
        n, k, p, wbf, x, out = _dense_inputs(name, m, g)
        res = {"shape": name, "M": m, "N": n, "K": k,
               "us_bf16_cublas": _timed("cublas", [lambda x=x, wbf=wbf, out=out: torch.matmul(x, wbf.T, out=out)],
                                        reps, 4),
               "us_dequant": _timed("dequant", [lambda p=p: dequantize_packed(p)], reps, 4),
               "us_dequant_blas": _timed("dequant + cuBLAS", [lambda x=x, p=p, out=out: mxfp4_mm_packed(
                   x, p, out=out, config=blas)], reps, 4)}
        for c in GRID:  # dequant_min_m 0: each tiling timed, not the copy path that would serve this M
            res[f"us_{_name(c)}"] = _time_entry(c, lambda cfg, x=x, p=p, out=out: mxfp4_mm_packed(
                x, p, out=out, config={**cfg, "dequant_min_m": 0}), reps, 4)
        rows.append(res)
        _best(res, "us_bf16_cublas", f"{name} M={m}: cuBLAS bf16")
        print(f"  {name} M={m}: dequantize {res['us_dequant']} us, dequantize + cuBLAS {res['us_dequant_blas']} us = "
              f"{_ratio(res['us_bf16_cublas'], res['us_dequant_blas'])}x stock's speed", flush=True)
    torch.cuda.empty_cache()
    return rows


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if a == a and b == b and b > 0 else float("nan")


def bench_dense_sweep(ms: list[int], reps: int) -> dict:
    """Where the dense layers' dequantize + BLAS path starts to beat the kernels: per M, cuBLAS on BF16 weights (stock),
    the kernels as served below `dequant_min_m` (tuning.yaml's tiling) and dequantize + cuBLAS, same process. The
    crossover is the smallest M from which dequantize + BLAS is faster on every shape, at every larger M too. Above
    the decode kernels' threshold, also the decode kernels in calls of threshold rows (gemv.packed.decode_chunks_max_m:
    a decode batch of 17-63 tokens), as PackedLinear serves them."""
    from ..gemv import PackedLinear
    from ..packed_mm import mxfp4_mm_packed
    from ..testing import generator
    from ..tuning import get_config

    g = generator(9, "cuda")
    kern = {**get_config("packed_mm"), "dequant_min_m": 0}
    blas = {**get_config("packed_mm"), "dequant_min_m": 1}
    rows = []
    for name in ("qkv", "o_proj"):
        n, k, p, wbf, x_max, out_max = _dense_inputs(name, max(ms), g)
        chunked = PackedLinear(p)
        chunked.chunks_max_m = max(ms)  # whatever the tuning says: this column times the chunks wherever M allows
        for m in ms:
            x, out = x_max[:m], out_max[:m]
            r = {"shape": name, "M": m,
                 "us_bf16_cublas": _timed("cublas", [lambda: torch.matmul(x, wbf.T, out=out)], reps, 4),
                 "us_kernels": _timed("kernels", [lambda: mxfp4_mm_packed(x, p, out=out, config=kern)], reps, 4),
                 "us_dequant_blas": _timed("dequant + cuBLAS", [lambda: mxfp4_mm_packed(x, p, out=out, config=blas)],
                                           reps, 4)}
            r["dequant_blas_over_kernels"] = _ratio(r["us_kernels"], r["us_dequant_blas"])
            chunks = ""
            if m > chunked.threshold:
                r["us_decode_chunks"] = _timed("decode chunks", [lambda: chunked(x)], reps, 4)
                r["decode_chunks_over_kernels"] = _ratio(r["us_kernels"], r["us_decode_chunks"])
                chunks = (f", {chunked.path(m)} {r['us_decode_chunks']} "
                          f"({r['decode_chunks_over_kernels']}x the kernels' speed, "
                          f"{_ratio(r['us_bf16_cublas'], r['us_decode_chunks'])}x stock's)")
            print(f"  {name} M={m}: cuBLAS bf16 {r['us_bf16_cublas']} us, kernels {r['us_kernels']}, dequantize + "
                  f"cuBLAS {r['us_dequant_blas']} ({r['dequant_blas_over_kernels']}x the kernels' speed, "
                  f"{_ratio(r['us_bf16_cublas'], r['us_dequant_blas'])}x stock's){chunks}", flush=True)
            rows.append(r)
    wins = {m: all(r["dequant_blas_over_kernels"] > 1 for r in rows if r["M"] == m) for m in ms}
    cross = next((m for m in sorted(ms) if all(wins[q] for q in ms if q >= m)), None)
    print(f"  dequantize + BLAS beats the kernels on every shape from M = {cross} (tuning.yaml dequant_min_m: "
          f"{get_config('packed_mm').get('dequant_min_m')})", flush=True)
    torch.cuda.empty_cache()
    return {"rows": rows, "crossover_m": cross}


def bench_moe(m: int, reps: int, src_before: str | None = None, skew: float = 0.0) -> dict:
    """Stock's MoE (vLLM Triton, Marlin) and every grid entry on one gpt-oss-120b layer at M tokens; with an earlier
    kernel source, each CUDA entry of that source too (`us_<entry>_before`), and `align_by_expert` alone (the sort
    every MoE prefill call runs first)."""
    from ..packed_mm import align_by_expert, mxfp4_moe_packed_mm

    e, k, h = MOE.experts, MOE.top_k, MOE.hidden
    gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, g = random_moe_layer(11)
    x = torch.randn(m, h, generator=g, device="cuda").to(torch.bfloat16)
    logits, ids, wts = random_routing(m, g, skew=skew)
    out = torch.empty(m, h, dtype=torch.bfloat16, device="cuda")
    res = {"M": m, "experts": e, "top_k": k, "routing_skew": skew, **routing_summary(ids, e)}
    try:
        fn = vllm_triton_moe_fn(gu_p, gu_s, gu_b, d_p, d_s, d_b, k)
        res["us_vllm_triton"] = _timed("vllm triton", [lambda: fn(x, logits)], reps, 2)
    except Exception as ex:  # noqa: BLE001 - vLLM absent or its API moved: say so, keep ours
        res["vllm_error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
        res["us_vllm_triton"] = float("nan")
    try:  # the stock MoE of sm_12x (GB10), timed here on the same layer
        fn_m = vllm_marlin_moe_fn(gu_p, gu_s, gu_b, d_p, d_s, d_b, k)
        res["us_vllm_marlin"] = _timed("vllm marlin", [lambda: fn_m(x, logits)], reps, 2)
    except Exception as ex:  # noqa: BLE001 - vLLM absent or its API moved: say so, keep the rest
        res["marlin_error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
        res["us_vllm_marlin"] = float("nan")
    for c in GRID:
        res[f"us_{_name(c)}"] = _time_entry(c, lambda cfg: mxfp4_moe_packed_mm(
            x, ids, wts, gu_q, gu_b, d_q, d_b, out=out, config=cfg), reps, 2)
    if src_before:
        for c in GRID:
            if c[0] == "cuda":
                cfg = {**_cfg(c), "cuda_src": src_before}
                res[f"us_{_name(c)}_before"] = _timed(f"{_name(c)} (before)", [lambda cfg=cfg: mxfp4_moe_packed_mm(
                    x, ids, wts, gu_q, gu_b, d_q, d_b, out=out, config=cfg)], reps, 2)
        print("  MoE, the earlier source: " + ", ".join(
            f"{_name(c)} {res[f'us_{_name(c)}_before']}" for c in GRID if c[0] == "cuda"), flush=True)
    bm = 8 * PF_VARIANTS[0][0]
    res["us_align_by_expert"] = _timed("align_by_expert", [lambda: align_by_expert(ids, e, bm)], reps, 8)
    line = f"  MoE M={m}: align_by_expert alone {res['us_align_by_expert']} us (torch)"
    if cuda_ext.available()[0] and cuda_ext.align_supported(e):
        res["us_align_by_expert_cuda"] = _timed("align (cuda)", [lambda: cuda_ext.align_by_expert(ids, e, bm)], reps, 8)
        line += f", {res['us_align_by_expert_cuda']} us (one launch, served)"
    print(line, flush=True)
    res["best_cfg"] = _best(res, "us_vllm_triton", f"MoE M={m} ({res['experts_hit']} experts hit): vLLM triton")
    if res["best_cfg"] and res["us_vllm_marlin"] == res["us_vllm_marlin"]:
        res["best_over_marlin"] = round(res["us_vllm_marlin"] / res[f"us_{_name(res['best_cfg'])}"], 3)
        print(f"  MoE M={m}: vLLM marlin {res['us_vllm_marlin']} us; best = {res['best_over_marlin']}x marlin's speed",
              flush=True)
    return res


def bench_topk(ms: list[int], reps: int, src_before: str | None) -> list[dict]:
    """The plugin's routing from vLLM's bf16 router logits (`cuda_ext.topk_from_logits`, top-4 of 128) at each M, and,
    with an earlier kernel source, that source's served path in the same process. Sources before the multi-CTA
    top-k took bf16 logits only up to 2048 values and the plugin converted larger ones to fp32 first, so their
    time includes that conversion (what the served model ran)."""
    from ..cuda_ext import topk_from_logits

    e, k = MOE.experts, MOE.top_k
    g = torch.Generator(device="cuda").manual_seed(13)
    rows = []
    for m in ms:
        logits = torch.randn(m, e, generator=g, device="cuda").to(torch.bfloat16)
        res = {"M": m, "experts": e, "top_k": k,
               "us_topk": _timed("top-k", [lambda lg=logits: topk_from_logits(lg, k)], reps, 16)}
        line = f"  top-{k} of {e} from bf16 logits, M={m}: {res['us_topk']} us"
        if src_before:
            def before(lg=logits):
                return topk_from_logits(lg.float() if lg.numel() > 2048 else lg, k, src=src_before)
            res["us_topk_before"] = _timed("top-k (before)", [before], reps, 16)
            line += f", before {res['us_topk_before']} us"
        print(line, flush=True)
        rows.append(res)
    return rows


def parse_ab_spec(spec: str) -> tuple[str, int | None, int | None]:
    """"served" -> ("", None, None); "@3" -> ("", 3, None); "@4/5" -> ("", 4, 5): variant 4 for gate_up, 5 for down;
    "a.cu" -> ("a.cu", None, None); "a.cu@3" -> ("a.cu", 3, None). ValueError, naming the fix, for a variant not in
    the table, a missing source, or one whose tables this tree cannot launch."""
    spec = spec.strip()
    if spec in ("", "served"):
        return "", None, None
    src, _, vs = spec.partition("@")
    v, _, vd = vs.partition("/")
    for part in (v, vd):
        if part and not part.isdigit():
            raise ValueError(f"--ab spec {spec!r}: the part after @ must be a variant index of cuda_ext.PF_VARIANTS, "
                             "or two (gate_up/down)")
        if part and int(part) >= len(PF_VARIANTS):
            raise ValueError(f"--ab spec {spec!r}: variant {part} is not in cuda_ext.PF_VARIANTS {PF_VARIANTS}")
    if vd and not v:
        raise ValueError(f"--ab spec {spec!r}: name gate_up's variant before the down one (@V/W)")
    if src:
        path = Path(src)
        if not path.is_file():
            raise ValueError(f"--ab spec {spec!r}: no kernel source at {src}")
        try:
            cuda_ext.check_source_tables(path, path.read_text())
        except RuntimeError as ex:
            raise ValueError(f"--ab spec {spec!r}: {ex} (a new tiling: add it to this tree's PF_TABLE and "
                             "cuda_ext.PF_VARIANTS, then A/B it as @V)") from None
    return src, (int(v) if v else None), (int(vd) if vd else None)


def ab_verdict(base: list[float], other: list[float]) -> str:
    """"faster" / "slower" when every round of `other` lies below / above every round of `base`, else "within the
    run's spread". With R rounds each in alternating order, a complete separation by chance (nothing changed, the
    rounds exchangeable) has probability 1 / C(2R, R) per direction: 1/252 at R = 5."""
    if max(other) < min(base):
        return "faster"
    if min(other) > max(base):
        return "slower"
    return "within the run's spread"


AB_EXPECT = ("faster", "not-slower", "identical")


def ab_unmet(ab: dict, expect: list[str]) -> list[str]:
    """What `--expect` asked of every spec after the first that the A/B (`bench_ab`'s result) did not show, one line
    each: "faster" = every round beyond every round of the first (`ab_verdict`), at every M; "not-slower" = never
    called slower; "identical" = output bit-identical to the first's."""
    unmet = []
    for m, row in ab["M"].items():
        for i, key in enumerate(ab["specs"][1:], start=1):
            verdict, same = row["verdict"][i], row["bit_identical"][i]
            if "faster" in expect and verdict != "faster":
                unmet.append(f"M={m} {key}: expected faster, measured {verdict}")
            if "not-slower" in expect and "faster" not in expect and verdict == "slower":  # "faster" said it
                unmet.append(f"M={m} {key}: expected not slower, measured slower")
            if "identical" in expect and not same:
                unmet.append(f"M={m} {key}: expected output bit-identical to {ab['specs'][0]}'s, it differs")
    return unmet


def routing_summary(ids: torch.Tensor, experts: int) -> dict:
    """What a routing (top-k ids) gives the prefill kernels: experts hit, the busiest expert's slots, and the blocks of
    64 and of 128 token rows a tiling runs (each expert's slots in blocks of its own). The kernels decode an expert's
    weights once per block, so the block count is what a routing costs a tiling."""
    hits = torch.bincount(ids.flatten().long(), minlength=experts)
    return {"experts_hit": int((hits > 0).sum()), "max_slots_per_expert": int(hits.max()),
            "token_blocks": {rows: int(((hits + rows - 1) // rows).sum()) for rows in (64, 128)}}


def bench_ab(specs: list[str], ms: list[int], rounds: int, reps: int, layer: MoeLayer = MOE,
             skew: float = 0.0) -> dict:
    """The MoE layer (default the 120b's) of each spec against the first (module docstring, `--ab`)."""
    from ..packed_mm import mxfp4_moe_packed_mm
    from ..tuning import get_config

    parsed = [parse_ab_spec(s) for s in specs]
    cfgs = [{**get_config("packed_mm"), "impl": "cuda", "cuda_src": src, **({} if v is None else {"cuda_variant": v}),
             **({} if vd is None else {"cuda_down_variant": vd})} for src, v, vd in parsed]
    gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, g = random_moe_layer(11, layer)
    stock = {}
    for name, make in (("matmul_ogs", vllm_triton_moe_fn), ("marlin", vllm_marlin_moe_fn)):
        try:
            stock[name] = make(gu_p, gu_s, gu_b, d_p, d_s, d_b, layer.top_k)
        except Exception as ex:  # noqa: BLE001 - vLLM absent or its API moved: the A/B stands without the yardstick
            print(f"  {name}: not timed ({type(ex).__name__}: {str(ex)[:200]})", file=sys.stderr, flush=True)
    keys = [f"{i}:{s or 'served'}" for i, s in enumerate(specs)]  # a spec may be given twice (an A/A)
    res = {"specs": keys, "rounds": rounds, "reps": reps, "layer": vars(layer), "routing_skew": skew, "M": {}}
    for m in ms:
        x = torch.randn(m, layer.hidden, generator=g, device="cuda").to(torch.bfloat16)
        logits, ids, wts = random_routing(m, g, layer, skew)
        outs = [mxfp4_moe_packed_mm(x, ids, wts, gu_q, gu_b, d_q, d_b, config=c) for c in cfgs]
        row = {"bit_identical": [bool(torch.equal(o, outs[0])) for o in outs]}
        out = torch.empty(m, layer.hidden, dtype=torch.bfloat16, device="cuda")
        times = {k: [] for k in keys} | {n: [] for n in stock}
        for r in range(rounds):
            for n, fn in stock.items():
                times[n].append(_timed(n, [lambda fn=fn: fn(x, logits)], reps, 2))
            for i in (range(len(keys)) if r % 2 == 0 else reversed(range(len(keys)))):
                times[keys[i]].append(_timed(keys[i], [lambda c=cfgs[i]: mxfp4_moe_packed_mm(
                    x, ids, wts, gu_q, gu_b, d_q, d_b, out=out, config=c)], reps, 2))
        med = {k: statistics.median(v) for k, v in times.items()}
        row |= {"rounds_us": times, "median_us": med, "verdict": [ab_verdict(times[keys[0]], times[k]) for k in keys]}
        res["M"][m] = row
        row |= routing_summary(ids, layer.experts)
        blocks = row["token_blocks"]
        print(f"  MoE M={m} (routing skew {skew}: {row['experts_hit']} experts hit, the busiest {row['max_slots_per_expert']} "
              f"slots; {blocks[128]} blocks of 128 token rows, {blocks[64]} of 64), {rounds} rounds of {reps} replays, "
              "us (median; rounds):", flush=True)
        for i, k in enumerate(keys):
            print(f"    {k}: {med[k]:.1f} ({med[k] / med[keys[0]]:.3f}x the first; "
                  f"{', '.join(f'{t:.1f}' for t in times[k])}) - {row['verdict'][i]}; output "
                  f"{'bit-identical to' if row['bit_identical'][i] else 'differs from'} the first's", flush=True)
        for n in stock:
            print(f"    {n} (stock): {med[n]:.1f} (the first at {med[n] / med[keys[0]]:.3f}x its speed)", flush=True)
    return res


def _save(res: dict, out: str | None) -> None:
    """The results as JSON at --out, where one was given."""
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=2048, help="tokens (prefill chunk)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--env-out", help="write the best MoE configuration as KERNELS_PACKED_MM_* lines")
    ap.add_argument("--cuda-src-before", help="an earlier csrc/mxfp4_mma.cu: its top-k and MoE prefill are timed "
                    "beside today's (its PF_TABLE must match)")
    ap.add_argument("--only-topk", action="store_true", help="time the routing only (seconds, not minutes)")
    ap.add_argument("--only-moe", action="store_true", help="time the routing and the MoE layer, not the dense layers")
    ap.add_argument("--dense-m", default="", help="comma-separated Ms: time the dense kernels against dequantize + "
                    "BLAS (and, above 16, the decode kernels in calls of 16 rows) at each, to place tuning.yaml's "
                    "dequant_min_m and gemv.packed.decode_chunks_max_m")
    ap.add_argument("--only-dense-sweep", action="store_true", help="with --dense-m: time that sweep alone")
    ap.add_argument("--ab", help="SPEC,SPEC,...: the MoE layer of each against the first, in rounds (module docstring); "
                    "SPEC = served | @V | PATH | PATH@V")
    ap.add_argument("--ab-m", default="2048,512", help="--ab: comma-separated token counts")
    ap.add_argument("--rounds", type=int, default=5, help="--ab: rounds, in alternating order")
    ap.add_argument("--model", default=MODELS[0].name, choices=[mo.name for mo in MODELS],
                    help="--ab: whose MoE layer (expert count and top-k; the served 20b's h at 2048 tokens is the "
                    "120b's at 2048, its slots per expert the 120b's at 8192: the 120b layer alone predicted neither)")
    ap.add_argument("--routing-skew", default="0",
                    help=f"the MoE layer's routing: spread of a per-expert offset in the random router logits: 0 "
                    f"routes uniformly; 'served' ({SERVED_SKEW}) as the served shape models do (kernels/tools/bench.py "
                    "SERVED_SKEW); the top-k timing keeps its own logits")
    ap.add_argument("--expect", help=f"--ab: comma-separated criteria every spec after the first must meet "
                    f"at every M, else exit 1 naming each miss: {', '.join(AB_EXPECT)}")
    a = ap.parse_args(argv)
    expect = None if a.expect is None else [e.strip() for e in a.expect.split(",")]
    if expect is not None and (a.ab is None or not all(e in AB_EXPECT for e in expect)):
        why = "applies to --ab only" if a.ab is None else f"{a.expect!r} is not a comma-separated list of {', '.join(AB_EXPECT)}"
        print(f"bench_prefill: --expect {why}", file=sys.stderr)
        return 2
    given = a.routing_skew
    try:
        a.routing_skew = SERVED_SKEW if given == "served" else float(given) + 0.0  # + 0.0: -0 is recorded as 0
    except ValueError:
        a.routing_skew = float("nan")
    if not 0 <= a.routing_skew < float("inf"):
        print(f"bench_prefill: --routing-skew {given}: 'served' or a finite spread >= 0 (0 routes uniformly, "
              f"served = {SERVED_SKEW}, as the served shape models)", file=sys.stderr)
        return 2
    if a.only_dense_sweep and (not a.dense_m or a.ab is not None or a.only_topk or a.only_moe):
        print("bench_prefill: --only-dense-sweep needs --dense-m (the Ms to sweep) and no --ab, --only-topk or "
              "--only-moe", file=sys.stderr)
        return 2
    if a.dense_m and not all(v.strip().isdigit() and int(v) > 0 for v in a.dense_m.split(",")):
        print(f"bench_prefill: --dense-m {a.dense_m!r}: comma-separated token counts above 0", file=sys.stderr)
        return 2
    if a.ab is None and a.model != MODELS[0].name:
        print("bench_prefill: --model applies to --ab only (the other benches time the 120b's layers)", file=sys.stderr)
        return 2
    if a.ab is not None:
        try:
            [parse_ab_spec(s) for s in a.ab.split(",")]
            if a.ab.count(",") < 1:
                raise ValueError("--ab needs two specs or more: the first is what the others are judged against")
            if not all(v.strip().isdigit() and int(v) > 16 for v in a.ab_m.split(",")):
                raise ValueError(f"--ab-m {a.ab_m!r}: comma-separated token counts above 16 (the prefill kernel's M)")
        except ValueError as ex:
            print(f"bench_prefill: {ex}", file=sys.stderr)
            return 2
        if a.rounds < 2:
            print("bench_prefill: --rounds must be at least 2 (a verdict needs each side's spread)", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("bench_prefill needs a CUDA GPU (it times kernels); nothing measured", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))}), "
          f"torch {torch.__version__}", flush=True)
    if a.ab is not None:
        res = {"device": torch.cuda.get_device_name(),
               "ab": bench_ab(a.ab.split(","), [int(v) for v in a.ab_m.split(",")], a.rounds, a.reps,
                              next(mo for mo in MODELS if mo.name == a.model).moe, a.routing_skew)}
        timed = [t for r in res["ab"]["M"].values() for k in res["ab"]["specs"] for t in r["rounds_us"][k]]
        failed_to_run = not all(t == t for t in timed)  # NaN: a spec failed to run (printed above)
        if expect:
            res["expect"] = {"criteria": expect, "unmet": ab_unmet(res["ab"], expect) + (
                ["a spec failed to run (NaN rounds): nothing it was expected to show is shown"] if failed_to_run else [])}
            for line in res["expect"]["unmet"]:
                print(f"bench_prefill: NOT MET {line}", file=sys.stderr)
        _save(res, a.out)
        return 1 if failed_to_run or (expect and res["expect"]["unmet"]) else 0
    if a.only_dense_sweep:
        res = {"device": torch.cuda.get_device_name(),
               "dense_sweep": bench_dense_sweep(sorted({int(v) for v in a.dense_m.split(",")}), a.reps)}
        _save(res, a.out)
        timed = [v for r in res["dense_sweep"]["rows"] for k, v in r.items() if k.startswith("us_")]
        return 0 if all(t == t for t in timed) else 1
    res = {"device": torch.cuda.get_device_name(), "topk": bench_topk(sorted({1, a.m}), a.reps, a.cuda_src_before)}
    if a.only_topk:
        _save(res, a.out)
        return 0 if all(r["us_topk"] == r["us_topk"] for r in res["topk"]) else 1
    if a.dense_m:
        res["dense_sweep"] = bench_dense_sweep(sorted({int(v) for v in a.dense_m.split(",")}), a.reps)
    res["moe"] = bench_moe(a.m, a.reps, a.cuda_src_before, a.routing_skew)
    res["dense"] = [] if a.only_moe else bench_dense(a.m, a.reps)
    _save(res, a.out)
    if not res["moe"].get("best") or not all(r.get("best") for r in res["dense"]):
        print("bench_prefill: a shape had no configuration that ran (see FAILED above)", file=sys.stderr)
        return 1
    best = res["moe"].get("best_cfg")
    if a.env_out and best:
        with open(a.env_out, "w") as f:
            f.write(env_lines(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
