"""Benchmark of the MXFP4 kernels at gpt-oss-120b decode shapes: `python -m kernels.tools.bench [--out F.json] [--quick]`.

Method (why each step):
* Copy bandwidth is MEASURED in the same run (1 GiB device-to-device copies, bytes read + written;
  best of cudaMemcpy and an SM copy kernel, see copy_bandwidth) and is the yardstick for achieved
  GB/s; datasheet numbers are not what this card does today.
* Every timed call reads a different weight buffer, rotating over enough buffers that their total
  is > 2x L2 (or 3x for small layers), so no call finds its weights in L2.
* Calls are captured in a CUDA graph (as vLLM runs decode) and timed with CUDA events around graph
  replays; time per call = replay time / calls per graph; median over replays after warm-up.
  Graphs take Python launch overhead out, which would otherwise dominate 5-us kernels.
* Baseline: torch.matmul (F.linear) with BF16 weights, same M, same rotation, same run.
* MoE layer (M=1, top-4 of 128 experts, gpt-oss-120b sizes from kernels/cases.py): each call routes to a
  different random set of 4 experts; floor = bytes of those 4 experts' packed weights + scales
  at the measured copy bandwidth. Beside it, a plain read of the same bytes (kernels/tools/read_floor.py) in one
  launch and in two dependent launches (gate_up's bytes, then down's): what a read that short achieves here.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

import torch

from ..cases import HIDDEN, LINEAR_SHAPES, MOE, MoeLayer
from .read_floor import plain_read_us
from .timing import copy_bandwidth, n_buffers, time_calls

MS = [1, 2, 4, 8, 16]
TARGETS = {"lm_head_m1_speedup": 3.0, "lm_head_m1_pct_copy": 85.0, "moe_us_h200": 15.0, "moe_pct_floor": 75.0}
SMALL_SHAPES_SPEEDUP = 1.5  # qkv / o_proj / expert shapes at M=1 vs BF16
M8_OVER_M1 = 1.3  # every shape: time(M=8) <= 1.3 x time(M=1)


def _nvidia_smi() -> dict:
    q = "name,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu,driver_version"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
        return dict(zip(q.split(","), [v.strip() for v in out[0].split(",")])) if out else {}
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}


GEMV_VARIANTS = {  # name -> overrides; "auto" is what mxfp4_linear runs on packed weights (the default)
    "auto": {"packed": {}},
    "packed_cuda": {"packed": {"impl": "cuda"}},
    "packed_cuda_xprep_cta": {"packed": {"impl": "cuda", "xprep": "cta"}},  # activation prepared in every CTA
    "packed_cuda_xprep_kernel": {"packed": {"impl": "cuda", "xprep": "kernel"}},  # once per call, own kernel
    "packed_fma": {"packed": {"impl": "packed_fma"}},
    "rows": {"rows_max_m": 1 << 30},  # the old fma16 path on checkpoint-layout weights (before)
    "mma_dot_scaled": {"rows_max_m": 0, "impl": "dot_scaled"},
    "mma_dequant_dot": {"rows_max_m": 0, "impl": "dequant_dot"},
}


MOE_CUDA_SRC: dict[str, str] = {}  # MoE impl name -> CUDA source of an earlier version (--cuda-src-before)
MOE_CFG: dict[str, dict] = {}  # MoE impl name -> overrides of tuning.yaml's moe.packed (--moe-variants)


def parse_moe_variants(text: str | None) -> dict[str, dict]:
    """--moe-variants 'NAME=JSON;...' -> {name: overrides of tuning.yaml's moe.packed} (also kernels.tools.phase_timing's).
    ValueError names the entry that is not NAME=<JSON object>."""
    out: dict[str, dict] = {}
    for spec in filter(None, (v.strip() for v in (text or "").split(";"))):
        name, _, js = spec.partition("=")
        try:
            over = json.loads(js)
        except json.JSONDecodeError as ex:
            raise ValueError(f"--moe-variants: {name.strip()!r} is not NAME=JSON ({ex})") from None
        if not isinstance(over, dict) or not name.strip():
            raise ValueError(f"--moe-variants: {spec!r} is not NAME=<JSON object>")
        out[name.strip()] = over
    return out


def _packed_moe_cfg(impl: str) -> dict | None:
    """Config of a packed-MoE impl: None (tuning.yaml) for "packed", its CUDA source for an earlier version,
    tuning.yaml's moe.packed with the impl's overrides for a --moe-variants one."""
    if impl not in MOE_CUDA_SRC and impl not in MOE_CFG:
        return None
    from ..tuning import get_config

    over = {"cuda_src": MOE_CUDA_SRC[impl]} if impl in MOE_CUDA_SRC else MOE_CFG[impl]
    return {**get_config("moe").get("packed", {}), **over}


def bench_linear(name: str, n: int, k: int, ms: list[int], l2: int, copy_gbps: float, reps: int,
                 impls: list[str]) -> list[dict]:
    from ..gemv import mxfp4_gemv, mxfp4_gemv_packed
    from ..packed import pack_mxfp4
    from ..testing import generator, random_mxfp4
    from ..tuning import get_config

    g = generator(1234, "cuda")
    q_bytes = n * k // 2 + n * k // 32
    nq = n_buffers(q_bytes, l2)
    weights = [random_mxfp4((n, k), g) for _ in range(nq)]
    packed = [pack_mxfp4(w, s) for w, s in weights]  # once, at "load"
    bf_bytes = n * k * 2
    nb = n_buffers(bf_bytes, l2)
    wbf = [torch.randn(n, k, generator=g, device="cuda").to(torch.bfloat16) * 0.02 for _ in range(nb)]
    rows = []
    for m in ms:
        x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        inner = max(nq, nb, 8 if n > 100000 else 40)
        out_q = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(nq)]
        res = {"shape": name, "N": n, "K": k, "M": m, "weight_bytes": q_bytes, "buffers": nq}
        for impl in impls:
            over = GEMV_VARIANTS.get(impl, {"impl": impl})
            if "packed" in over:
                base = get_config("gemv")
                cfg = {**base, **base.get("packed", {}), **over["packed"]}
                calls = [lambda i=i, cfg=cfg: mxfp4_gemv_packed(x, packed[i], out=out_q[i], config=cfg)
                         for i in range(nq)]
            else:
                cfg = {**get_config("gemv"), **over}
                calls = [lambda i=i, cfg=cfg: mxfp4_gemv(x, weights[i][0], weights[i][1], out=out_q[i], config=cfg)
                         for i in range(nq)]
            try:
                us = time_calls(calls, reps, inner)
            except Exception as ex:  # noqa: BLE001 - one path failing must not lose the others
                print(f"  {name} M={m} {impl}: FAILED {type(ex).__name__}: {str(ex)[:300]}", file=sys.stderr, flush=True)
                us = float("nan")
            gbps = (q_bytes + x.numel() * 2 + m * n * 2) / (us * 1e-6) / 1e9
            res[f"us_{impl}"] = round(us, 2)
            res[f"gbps_{impl}"] = round(gbps, 1)
            res[f"pct_copy_{impl}"] = round(100 * gbps / copy_gbps, 1)
        out_b = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(nb)]
        calls = [lambda i=i: torch.matmul(x, wbf[i].T, out=out_b[i]) for i in range(nb)]
        res["us_bf16_matmul"] = round(time_calls(calls, reps, inner), 2)
        best = min(impls, key=lambda i: res[f"us_{i}"] if res[f"us_{i}"] == res[f"us_{i}"] else float("inf"))
        res["best_impl"] = best
        res["speedup_vs_bf16"] = round(res["us_bf16_matmul"] / res[f"us_{impls[0]}"], 2)
        res["speedup_best_vs_bf16"] = round(res["us_bf16_matmul"] / res[f"us_{best}"], 2)
        rows.append(res)
        print(f"  {name:15s} M={m:2d} " + " ".join(f"{i}={res[f'us_{i}']:.1f}us({res[f'pct_copy_{i}']:.0f}%)"
                                               for i in impls) + f" bf16={res['us_bf16_matmul']:.1f}us", flush=True)
    del weights, wbf, packed
    torch.cuda.empty_cache()
    return rows


def random_moe_layer(seed: int, layer: MoeLayer = MOE) -> tuple:
    """A MoE layer (default the gpt-oss-120b one, kernels/cases.py MOE) of random MXFP4 experts on the GPU: checkpoint
    layout and biases (gate_up / down) plus our packed copies -> (gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, generator)."""
    from ..moe import pack_moe_experts
    from ..testing import generator, random_mxfp4

    e, h, inter = layer.experts, layer.hidden, layer.inter
    g = generator(seed, "cuda")
    gu_p, gu_s = random_mxfp4((e, 2 * inter, h), g)
    d_p, d_s = random_mxfp4((e, h, inter), g)
    gu_b = torch.randn(e, 2 * inter, generator=g, device="cuda") * 0.1
    d_b = torch.randn(e, h, generator=g, device="cuda") * 0.1
    gu_q, d_q = pack_moe_experts(gu_p, gu_s, d_p, d_s)
    return gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, g


# The routing spread of the served shape models (valid random weights; vLLM 0.26, H100, 2026-11-27, median layer over a
# decode window of 2048 slots): 120b entropy 0.915 of uniform's, busiest expert 4.0% of the slots, 78 experts carry 90%;
# 20b 0.952, 7.6%, 24. Router logits N(0, 1) plus a per-expert offset N(0, SERVED_SKEW**2) route with that spread
# (tests/unit/test_routing_spread.py checks it). Uniform routing (skew 0) gives the 120b's 2048-token prefill one
# 128-row block per expert; this spread gives it ~13% more blocks (the served 120b ran that layer 12% slower than the
# uniformly routed bench did, H100, 2026-12-07).
SERVED_SKEW = 0.4


def random_routing(m: int, g: torch.Generator, layer: MoeLayer = MOE,
                   skew: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits of m tokens over the layer's experts from random numbers (bf16, as vLLM's router GEMM gives
    them), and their top-k ids (int32) and softmax weights, on g's device. skew: the spread of a per-expert offset
    added to every token's logits: 0 routes uniformly (every expert hit at prefill sizes), SERVED_SKEW as the served
    shape models do (some experts take several times their share)."""
    logits = torch.randn(m, layer.experts, generator=g, device=g.device)
    if skew:  # drawn after the logits: skew 0 leaves the generator's sequence, and every earlier result, as it was
        logits += skew * torch.randn(layer.experts, generator=g, device=g.device)
    logits = logits.to(torch.bfloat16)
    top = torch.topk(logits.float(), layer.top_k, dim=-1)
    return logits, top.indices.to(torch.int32), torch.softmax(top.values, -1)


def bench_moe(l2: int, copy_gbps: float, reps: int, impls: list[str], with_router: bool = True) -> dict:
    """impls: "packed" = the rebuilt pipeline on packed experts (CUDA: gate_up+SwiGLU, down+combine;
    with router: + the one-launch route kernel), others = the old Triton mxfp4_moe impls."""
    from ..moe import moe_forward, moe_forward_packed, mxfp4_moe, mxfp4_moe_packed
    from ..tuning import get_config

    e, k, h, inter = MOE.experts, MOE.top_k, MOE.hidden, MOE.inter
    gu_p, gu_s, gu_b, d_p, d_s, d_b, gu_q, d_q, g = random_moe_layer(99)
    gu_per_expert = 2 * inter * (h // 2 + h // 32)  # packed codes + scales of gate_up's rows
    per_expert = gu_per_expert + h * (inter // 2 + inter // 32)
    floor_bytes = k * per_expert
    floor_us = floor_bytes / (copy_gbps * 1e9) * 1e6
    x = torch.randn(1, h, generator=g, device="cuda").to(torch.bfloat16)
    # A different expert set per call: 4 experts (~53 MB) would otherwise sit in L2 (50-60 MB).
    n_routes = max(16, n_buffers(floor_bytes, l2))
    routes = [torch.randperm(e, generator=g, device="cuda")[:k].view(1, k) for _ in range(n_routes)]
    routes32 = [r.to(torch.int32) for r in routes]
    wts = torch.softmax(torch.randn(1, k, generator=g, device="cuda"), -1)
    out = torch.empty(1, h, dtype=torch.bfloat16, device="cuda")
    res = {"experts": e, "top_k": k, "hidden": h, "inter": inter, "floor_bytes": floor_bytes,
           "floor_us": round(floor_us, 2)}
    for impl in impls:
        if impl == "packed" or impl in MOE_CUDA_SRC or impl in MOE_CFG:
            cfg = _packed_moe_cfg(impl)
            calls = [lambda r=r, cfg=cfg: mxfp4_moe_packed(x, r, wts, gu_q, gu_b, d_q, d_b, out=out, config=cfg)
                     for r in routes32]
        else:
            cfg = get_config("moe")
            cfg["impl"] = impl
            calls = [lambda r=r, cfg=cfg: mxfp4_moe(x, r, wts, gu_p, gu_s, gu_b, d_p, d_s, d_b, out=out, config=cfg)
                     for r in routes]
        try:
            us = time_calls(calls, reps, n_routes * 2)
        except Exception as ex:  # noqa: BLE001
            print(f"  moe {impl}: FAILED {type(ex).__name__}: {str(ex)[:300]}", file=sys.stderr, flush=True)
            us = float("nan")
        res[f"us_{impl}"] = round(us, 2)
        res[f"pct_floor_{impl}"] = round(100 * floor_us / us, 1)
        print(f"  moe M=1 {impl}: {us:.1f} us, floor {floor_us:.1f} us ({100 * floor_us / us:.0f}%)", flush=True)
    # The layer's bytes read by a plain read kernel: gate_up's then down's in two dependent launches (the layer's
    # structure), and all in one launch. The floor above (copy rate) is not reachable by a 53 MB read (read_floor.py).
    gu_bytes = k * gu_per_expert
    try:
        res["plain_read_us_two_passes"] = round(plain_read_us([gu_bytes, floor_bytes - gu_bytes], l2, reps), 2)
        res["plain_read_us_one_pass"] = round(plain_read_us([floor_bytes], l2, reps), 2)
        print(f"  plain read of the layer's bytes: two dependent launches {res['plain_read_us_two_passes']:.1f} us, "
              f"one launch {res['plain_read_us_one_pass']:.1f} us", flush=True)
    except Exception as ex:  # noqa: BLE001 - a reference, not the measurement
        print(f"  plain read reference: FAILED {type(ex).__name__}: {str(ex)[:300]}", file=sys.stderr, flush=True)
    if not with_router:
        return res
    # Whole block incl. routing (routing varies with x: rotate x). Router weights bf16, as stored.
    router_w = torch.randn(e, h, generator=g, device="cuda").to(torch.bfloat16) * 0.05
    router_b = (torch.randn(e, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    xs = [torch.randn(1, h, generator=g, device="cuda").to(torch.bfloat16) for _ in range(n_routes)]
    calls = [lambda xx=xx: moe_forward_packed(xx, router_w, router_b, gu_q, gu_b, d_q, d_b, k, out=out) for xx in xs]
    try:
        res["us_layer_with_router"] = round(time_calls(calls, reps, n_routes * 2), 2)
    except Exception as ex:  # noqa: BLE001
        print(f"  moe with router (packed): FAILED {type(ex).__name__}: {str(ex)[:300]}", file=sys.stderr)
        res["us_layer_with_router"] = float("nan")
    for impl in [*MOE_CUDA_SRC, *MOE_CFG]:
        cfg = _packed_moe_cfg(impl)
        calls = [lambda xx=xx, cfg=cfg: moe_forward_packed(xx, router_w, router_b, gu_q, gu_b, d_q, d_b, k, out=out,
                                                           config=cfg) for xx in xs]
        try:
            res[f"us_layer_with_router_{impl}"] = round(time_calls(calls, reps, n_routes * 2), 2)
        except Exception as ex:  # noqa: BLE001
            print(f"  moe with router ({impl}): FAILED {type(ex).__name__}: {str(ex)[:300]}", file=sys.stderr)
            res[f"us_layer_with_router_{impl}"] = float("nan")
    calls = [lambda xx=xx: moe_forward(xx, router_w, router_b, gu_p, gu_s, gu_b, d_p, d_s, d_b, k) for xx in xs]
    try:
        res["us_layer_with_router_old"] = round(time_calls(calls, reps, n_routes * 2), 2)
    except Exception as ex:  # noqa: BLE001
        res["us_layer_with_router_old"] = float("nan")
    res["vllm_triton"] = vllm_triton_moe(gu_p, gu_s, gu_b, d_p, d_s, d_b, router_w, router_b, xs, reps, n_routes, k)
    del gu_p, d_p, gu_q, d_q
    torch.cuda.empty_cache()
    return res


def vllm_triton_moe_fn(gu_p, gu_s, gu_b, d_p, d_s, d_b, k):
    """vLLM's triton MoE (OpenAI triton_kernels matmul_ogs) on these checkpoint-layout experts, imported from the
    installed vLLM: -> fn(x, router_logits) -> out. Raises ImportError / AttributeError where it is not offered."""
    try:  # vLLM 0.26 moved the module under fused_moe/experts/
        from vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe import triton_kernel_moe_forward
    except ImportError:
        from vllm.model_executor.layers.fused_moe.gpt_oss_triton_kernels_moe import triton_kernel_moe_forward
    from vllm.model_executor.layers.quantization.utils.mxfp4_utils import _swizzle_mxfp4
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig

    e = gu_p.shape[0]
    w13, w13_flex, w13_scale = _swizzle_mxfp4(gu_p, gu_s, num_warps=8)
    w2, w2_flex, w2_scale = _swizzle_mxfp4(d_p, d_s, num_warps=8)
    pc1 = PrecisionConfig(weight_scale=w13_scale, flex_ctx=FlexCtx(rhs_data=w13_flex))
    pc2 = PrecisionConfig(weight_scale=w2_scale, flex_ctx=FlexCtx(rhs_data=w2_flex))
    kwargs = {}
    try:
        from vllm.model_executor.layers.fused_moe.config import mxfp4_w4a16_moe_quant_config

        kwargs["quant_config"] = mxfp4_w4a16_moe_quant_config(w1_bias=gu_b, w2_bias=d_b, w1_scale=pc1, w2_scale=pc2)
    except ImportError:  # older vLLM: precision configs and biases as arguments
        kwargs.update(w1_precision=pc1, w2_precision=pc2, w1_bias=gu_b, w2_bias=d_b)

    def fn(xx, logits):
        return triton_kernel_moe_forward(hidden_states=xx, w1=w13, w2=w2, gating_output=logits, topk=k,
                                         renormalize=True, global_num_experts=e, expert_map=None, **kwargs)

    return fn


def vllm_marlin_moe_fn(gu_p, gu_s, gu_b, d_p, d_s, d_b, k):
    """vLLM's Marlin W4A16 MoE (the MXFP4 backend on sm_12x, GB10; `--moe-backend marlin` elsewhere) on these
    checkpoint-layout experts, prepared as vLLM 0.26's load path does: I padded to 128 and H to 256 with zeros
    (fused_moe/oracle/mxfp4.py), `prepare_moe_mxfp4_layer_for_marlin` (quantization/utils/marlin_utils_fp4.py), then
    `fused_marlin_moe` (fused_moe/experts/marlin_moe.py) with fused_topk routing and the swigluoai activation, the way
    MarlinExperts.apply calls it. -> fn(x, router_logits) -> out. Raises where it is not offered."""
    import types

    import vllm._custom_ops as ops
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk
    from vllm.model_executor.layers.quantization.utils.marlin_utils import get_marlin_input_dtype
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import prepare_moe_mxfp4_layer_for_marlin
    from vllm.scalar_type import scalar_types

    e, two_i, h_half = gu_p.shape
    inter, hid = two_i // 2, h_half * 2
    ip, hp = -(-inter // 128) * 128, -(-hid // 256) * 256

    def pad(t, shape, dtype):
        out = torch.zeros(shape, dtype=dtype, device=t.device)
        out[tuple(slice(0, n) for n in t.shape)].copy_(t)
        return out

    w13, w13_s, w13_b = pad(gu_p, (e, 2 * ip, hp // 2), torch.uint8), pad(gu_s, (e, 2 * ip, hp // 32), torch.uint8), \
        pad(gu_b, (e, 2 * ip), torch.bfloat16)
    w2, w2_s, w2_b = pad(d_p, (e, hp, ip // 2), torch.uint8), pad(d_s, (e, hp, ip // 32), torch.uint8), \
        pad(d_b, (e, hp), torch.bfloat16)
    layer = types.SimpleNamespace(params_dtype=torch.bfloat16)  # the only attribute the preparation reads
    w13, w2, w13_s, w2_s, w13_b, w2_b = prepare_moe_mxfp4_layer_for_marlin(layer, w13, w2, w13_s, w2_s, w13_b, w2_b)

    def moe_sum(inp, out, topk_ids, expert_map):  # MarlinExperts.moe_sum
        ops.moe_sum(inp, out)
        return out

    def fn(xx, logits):
        topk_weights, topk_ids, _ = fused_topk(xx, logits, k, renormalize=True)
        xp = torch.nn.functional.pad(xx, (0, hp - hid)) if hp != hid else xx.contiguous()
        out = torch.empty((xx.shape[0], hp), dtype=xx.dtype, device=xx.device)
        out = fused_marlin_moe(hidden_states=xp, w1=w13, w2=w2, bias1=w13_b, bias2=w2_b, w1_scale=w13_s, w2_scale=w2_s,
                               topk_weights=topk_weights, topk_ids=topk_ids,
                               quant_type_id=scalar_types.float4_e2m1f.id, apply_router_weight_on_input=False,
                               global_num_experts=e, activation=MoEActivation.SWIGLUOAI, moe_sum=moe_sum,
                               expert_map=None, output=out, is_k_full=True, input_dtype=get_marlin_input_dtype(),
                               clamp_limit=7.0, gemm1_alpha=1.702, gemm1_beta=1.0)
        return out[:, :hid]

    return fn


def vllm_triton_moe(gu_p, gu_s, gu_b, d_p, d_s, d_b, router_w, router_b, xs, reps, n_routes, k) -> dict:
    """The same layer through vLLM's triton MoE, router logits by torch (vLLM computes them with its own GEMM
    before the MoE)."""
    try:
        fn = vllm_triton_moe_fn(gu_p, gu_s, gu_b, d_p, d_s, d_b, k)
        calls = [lambda xx=xx: fn(xx, torch.nn.functional.linear(xx, router_w, router_b)) for xx in xs]
        us = time_calls(calls, reps, n_routes * 2)
        print(f"  moe M=1 vLLM triton (with router GEMM): {us:.1f} us", flush=True)
        return {"us_with_router": round(us, 2)}
    except Exception as ex:  # noqa: BLE001 - not installed / API moved: say so, keep the rest
        msg = f"{type(ex).__name__}: {str(ex)[:300]}"
        print(f"  moe vLLM triton: unavailable ({msg})", flush=True)
        return {"error": msg}


def bench_quant(reps: int) -> list[dict]:
    from ..quant import quantize_mxfp8_triton

    rows = []
    for m, k in [(1, HIDDEN), (16, HIDDEN), (4096, HIDDEN)]:
        xs = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(4)]
        us = time_calls([lambda x=x: quantize_mxfp8_triton(x) for x in xs], reps, 16)
        rows.append({"M": m, "K": k, "us": round(us, 2), "gbps": round(m * k * (2 + 1 + 1 / 32) / (us * 1e-6) / 1e9, 1)})
    return rows


def sweep(l2: int, copy_gbps: float, reps: int, budget_s: float) -> list[dict]:
    """Tile sweep for lm_head / qkv at M=1 and the MoE layer, within a time budget; prints the best."""
    import os

    results = []
    t0 = time.time()
    # Centered on the configs the first H200 sweep found best (tuning.yaml cites it).
    combos = [("lm_head", bn, 512, nw) for bn in (8, 16, 32) for nw in (1, 2)]
    combos += [("lm_head", 16, 256, 1), ("lm_head", 16, 1024, 2), ("qkv", 8, 512, 1), ("qkv", 8, 512, 2), ("qkv", 4, 512, 1)]
    for shape, bn, bk, nw in combos:
        if time.time() - t0 > budget_s * 0.5:
            break
        env = {"KERNELS_GEMV_ROWS__BLOCK_N": str(bn), "KERNELS_GEMV_ROWS__BLOCK_K": str(bk),
               "KERNELS_GEMV_ROWS__NUM_WARPS": str(nw), "KERNELS_GEMV_ROWS__MIN_PROGRAMS_PER_SM": "0"}
        os.environ.update(env)
        try:
            r = bench_linear(shape, *LINEAR_SHAPES[shape], [1], l2, copy_gbps, max(5, reps // 2), ["rows"])[0]
            results.append({"kernel": f"gemv_{shape}", **env, "us": r["us_rows"], "pct": r["pct_copy_rows"]})
        except Exception as ex:  # noqa: BLE001 - a config that fails to compile is a data point
            results.append({"kernel": f"gemv_{shape}", **env, "error": f"{type(ex).__name__}: {str(ex)[:200]}"})
        finally:
            for key in env:
                os.environ.pop(key, None)
    combos = [(bn, dbn, 512, nw, dnw) for bn in (8, 16) for dbn in (2, 4) for nw, dnw in ((1, 1), (2, 1))]
    combos += [(16, 4, 256, 2, 1), (16, 4, 1024, 2, 1)]
    impl = "fma16"
    for bn, dbn, bk, nw, dnw in combos:
        if time.time() - t0 > budget_s:
            break
        env = {"KERNELS_MOE_IMPL": impl, "KERNELS_MOE_BLOCK_N": str(bn), "KERNELS_MOE_DOWN_BLOCK_N": str(dbn),
               "KERNELS_MOE_BLOCK_K": str(bk), "KERNELS_MOE_NUM_WARPS": str(nw), "KERNELS_MOE_DOWN_NUM_WARPS": str(dnw)}
        os.environ.update(env)
        try:
            r = bench_moe(l2, copy_gbps, max(5, reps // 2), [impl], with_router=False)
            results.append({"kernel": "moe", **env, "us": r[f"us_{impl}"], "pct": r[f"pct_floor_{impl}"]})
        except Exception as ex:  # noqa: BLE001
            results.append({"kernel": "moe", **env, "error": f"{type(ex).__name__}: {str(ex)[:200]}"})
        finally:
            for key in env:
                os.environ.pop(key, None)
    for kern in ("gemv_lm_head", "gemv_qkv", "moe"):
        ok = [r for r in results if r["kernel"] == kern and "us" in r]
        for r in sorted(ok, key=lambda r: r["us"])[:5]:
            print(f"SWEEP best {kern}: {r['us']:.1f} us ({r['pct']:.0f}%) {dict((k, v) for k, v in r.items() if k.startswith('KERNELS'))}")
    return results


def _met(ok) -> bool | None:
    return None if ok is None else bool(ok)


def targets(rows: list[dict], mo: dict, d: str, moe_impl: str, device: str) -> dict:
    """The kernels' targets, each with its value and MET / MISSED (None = not measurable here)."""
    t: dict = {}
    by = {(r["shape"], r["M"]): r for r in rows}

    def us(shape, m):
        r = by.get((shape, m))
        return None if r is None else r[f"us_{d}"]

    lm = by.get(("lm_head", 1))
    if lm:
        t["lm_head_m1_speedup"] = {"value": lm["speedup_vs_bf16"], "target": ">= 3.0", "met": lm["speedup_vs_bf16"] >= 3.0}
        t["lm_head_m1_pct_copy"] = {"value": lm[f"pct_copy_{d}"], "target": ">= 85", "met": lm[f"pct_copy_{d}"] >= 85}
    for shape in ("qkv", "o_proj", "expert_gate_up", "expert_down"):
        r = by.get((shape, 1))
        if r:
            t[f"{shape}_m1_speedup"] = {"value": r["speedup_vs_bf16"], "target": f">= {SMALL_SHAPES_SPEEDUP}",
                                        "met": r["speedup_vs_bf16"] >= SMALL_SHAPES_SPEEDUP}
    for shape in LINEAR_SHAPES:
        for m in (2, 4, 8):
            r = by.get((shape, m))
            if r:
                t[f"{shape}_m{m}_faster_than_bf16"] = {"value": r["speedup_vs_bf16"], "target": "> 1.0",
                                                       "met": r["speedup_vs_bf16"] > 1.0}
        a, b = us(shape, 1), us(shape, 8)
        if a and b:
            t[f"{shape}_m8_over_m1"] = {"value": round(b / a, 2), "target": f"<= {M8_OVER_M1}", "met": b / a <= M8_OVER_M1}
    if mo and f"us_{moe_impl}" in mo:
        moe_us = mo[f"us_{moe_impl}"]
        t["moe_us"] = {"value": moe_us, "target": "<= 15 on H200", "met": (moe_us <= 15.0) if "H200" in device else None}
        t["moe_pct_floor"] = {"value": mo[f"pct_floor_{moe_impl}"], "target": ">= 75", "met": mo[f"pct_floor_{moe_impl}"] >= 75}
        t["moe_with_router_us"] = {"value": mo.get("us_layer_with_router"), "target": "<= 15 on H200 (router included)",
                                   "met": (mo.get("us_layer_with_router", 1e9) <= 15.0) if "H200" in device else None}
        v = mo.get("vllm_triton", {}).get("us_with_router")
        t["moe_faster_than_vllm_triton"] = {"value": v, "target": f"packed with router < vLLM triton ({v} us)",
                                            "met": _met(None if v is None else mo.get("us_layer_with_router", 1e9) < v)}
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.tools.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write results as JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, M in {1, 16}, default impl only")
    ap.add_argument("--impls", help="comma list of GEMV impls to time (default: all; --quick: auto,rows)")
    ap.add_argument("--cuda-src-before", metavar="PATH",
                    help="also time the CUDA kernels compiled from this earlier mxfp4_mma.cu, same run "
                         "(GEMV impl packed_cuda_before, MoE impl packed_before)")
    ap.add_argument("--moe-variants", metavar="NAME=JSON;...",
                    help='also time the packed MoE with these overrides of tuning.yaml moe.packed, same run, e.g. '
                         '\'gu5={"gate_up_variant": 5};pf6={"down_variant": 6}\'')
    ap.add_argument("--only", choices=["linear", "moe"], help="time only the GEMV shapes or only the MoE layer")
    ap.add_argument("--sweep", type=float, default=0.0, metavar="SECONDS",
                    help="also sweep tile configs for lm_head M=1 and the MoE layer for about this long")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels.tools.bench needs CUDA: no CUDA GPU is visible to torch (torch.cuda.is_available() is False)")
        return 2

    import triton

    from ..tuning import current_arch, get_config, verified

    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20
    reps = 10 if args.quick else 20
    ms = [1, 8] if args.quick else MS
    gemv_impls = ["auto", "rows"] if args.quick else list(GEMV_VARIANTS)
    if args.impls:
        gemv_impls = [i for i in args.impls.split(",") if i]
    moe_impls = ["packed"] if args.quick or args.impls else ["packed", "fma16", "dot_scaled"]
    if args.cuda_src_before:
        GEMV_VARIANTS["packed_cuda_before"] = {"packed": {"impl": "cuda", "cuda_src": args.cuda_src_before}}
        MOE_CUDA_SRC["packed_before"] = args.cuda_src_before
        gemv_impls.append("packed_cuda_before")
        moe_impls.append("packed_before")
    try:
        MOE_CFG.update(parse_moe_variants(args.moe_variants))
    except ValueError as ex:
        ap.error(str(ex))
    moe_impls.extend(MOE_CFG)
    meta = {
        "device": torch.cuda.get_device_name(0), "arch": current_arch(), "sm_count": props.multi_processor_count,
        "l2_bytes": l2, "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "nvidia_smi": _nvidia_smi(), "quick": args.quick,
        "gemv_config": get_config("gemv"), "moe_config": get_config("moe"), "tuning_verified": verified(current_arch()),
    }
    from .. import cuda_ext

    t0 = time.time()
    ok, why = cuda_ext.available()
    meta["cuda_ext"] = {"available": ok, "reason": why, "build_or_load_s": round(time.time() - t0, 1)}
    print(f"CUDA tensor-core kernels: {'available' if ok else 'UNAVAILABLE: ' + why} ({meta['cuda_ext']['build_or_load_s']} s)",
          flush=True)
    print(f"device {meta['device']} ({meta['arch']}, {props.multi_processor_count} SMs, L2 {l2 / 2**20:.0f} MiB), "
          f"torch {torch.__version__}, triton {triton.__version__}", flush=True)
    if meta["tuning_verified"] is False:
        print(f"tuning.yaml entries for {meta['arch']} are unverified (verified: false): once this run's tests and "
              f"numbers hold, record them in docs/evidence/ and set verified: true there", flush=True)
    copies = copy_bandwidth(reps)
    copy_gbps = copies["best"]
    meta["copy_gbps"] = copy_gbps
    meta["copy_gbps_methods"] = copies
    print(f"copy bandwidth (read+write): {copy_gbps:.0f} GB/s {copies}", flush=True)
    result: dict = {"meta": meta}
    if args.sweep:
        result["sweep"] = sweep(l2, copy_gbps, reps, args.sweep)
    rows = []
    errors = []

    def guarded(what, fn, default):
        # One failing section (a compile error on some arch, OOM) must not lose the others' numbers.
        try:
            return fn()
        except Exception as ex:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            errors.append(f"{what}: {type(ex).__name__}: {str(ex)[:300]}")
            return default

    for name, (n, k) in LINEAR_SHAPES.items() if args.only != "moe" else ():
        rows += guarded(name, lambda n=n, k=k, name=name: bench_linear(name, n, k, ms, l2, copy_gbps, reps, gemv_impls), [])
    result["linear"] = rows
    result["moe"] = guarded("moe", lambda: bench_moe(l2, copy_gbps, reps, moe_impls), {}) if args.only != "linear" else {}
    result["quant"] = guarded("quant", lambda: bench_quant(reps), []) if not args.only else []
    result["errors"] = errors
    meta["nvidia_smi_after"] = _nvidia_smi()

    d = gemv_impls[0]
    mo = result["moe"]
    result["targets"] = targets(rows, mo, d, "packed", meta["device"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    # Short table last (the part a log tail shows).
    print(f"\n== {meta['device']} | copy {copy_gbps:.0f} GB/s | default gemv impl {d}, moe impl {moe_impls[0]} ==")
    print(f"{'shape':15s} {'M':>3s} {'mxfp4 us':>9s} {'GB/s':>7s} {'%copy':>6s} {'bf16 us':>8s} {'speedup':>7s}"
          + "".join(f" {i[:12]:>12s}" for i in gemv_impls[1:]))
    for r in rows:
        alt = "".join(f" {r[f'us_{i}']:12.1f}" for i in gemv_impls[1:])
        print(f"{r['shape']:15s} {r['M']:3d} {r[f'us_{d}']:9.1f} {r[f'gbps_{d}']:7.0f} {r[f'pct_copy_{d}']:6.1f} "
              f"{r['us_bf16_matmul']:8.1f} {r['speedup_vs_bf16']:6.2f}x{alt}")
    if mo:
        print(f"moe decode layer M=1 top-{mo['top_k']}/{mo['experts']}: " + ", ".join(
            f"{i} {mo[f'us_{i}']:.1f} us ({mo[f'pct_floor_{i}']:.0f}% of floor)" for i in moe_impls)
            + f"; floor {mo['floor_us']:.1f} us ({mo['floor_bytes'] / 1e6:.1f} MB); with router: packed "
            f"{mo.get('us_layer_with_router', float('nan')):.1f} us, old {mo.get('us_layer_with_router_old', float('nan')):.1f} us"
            + "".join(f", {i} {mo.get(f'us_layer_with_router_{i}', float('nan')):.1f} us" for i in [*MOE_CUDA_SRC, *MOE_CFG])
            + f", vLLM triton {mo.get('vllm_triton', {}).get('us_with_router', float('nan')):.1f} us"
            + f"; plain read of the same bytes: two dependent launches {mo.get('plain_read_us_two_passes', float('nan')):.1f}"
            f" us, one launch {mo.get('plain_read_us_one_pass', float('nan')):.1f} us")
    print("quant bf16->mxfp8: " + ", ".join(f"[{q['M']}x{q['K']}] {q['us']:.1f} us" for q in result["quant"]))
    for e in errors:
        print(f"ERROR {e}")
    for key, t in result["targets"].items():
        print(f"target {key}: {t['value']} (want {t['target']}) -> {'MET' if t['met'] else ('n/a' if t['met'] is None else 'MISSED')}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
