"""MXFP4 MoE for decode (gpt-oss experts), in Triton: two launches, reading only the selected experts.

  1. gate_up + SwiGLU: one program per (token, top-k slot, block of I): reads the expert's gate rows
     (2i) and up rows (2i+1) packed, dots them with x[token], adds the biases, applies gpt-oss's
     clamped SwiGLU and writes h [M*k, I] in BF16 (what an inference engine keeps between the two
     GEMMs; its rounding is part of the tolerance).
  2. down + combine: one program per (token, block of H): for each of the token's k experts,
     h[token, slot] @ W_down[e].T + bias, times the routing weight, summed in fp32 in registers
     (no atomics: deterministic), one BF16 store.

Routing (router GEMM, top-k, softmax) is left to the caller (`route` in reference.py or the
engine's own), as in vLLM's fused-MoE interface. Expert id -1 marks a slot to skip (expert
parallelism: not on this rank).

impl dot_scaled: swap-AB `tl.dot_scaled` with the token in column 0 of a 16-wide operand (the MMA
minimum); the other 15 columns are zeros, and a row sum extracts column 0 exactly.
impl fma16 (default): no MMA; weights read as 32-bit words and decoded 2 codes per instruction
into f16x2 by inline PTX (plain sm_53+ instructions, nothing Hopper-specific), see gemv.py.
impl fma: no MMA, our own fp32 bit-trick upcast and an fp32 multiply-reduce (portable fallback).
"""

from __future__ import annotations

import torch

from ._checks import check_bias, check_routes
from ._triton import INTERPRET, check_device, tl, triton
from .cuda_ext import CUDA_MAX_M
from .gemv import _e2m1_to_f32, _e8m0_to_f32, _round_bf16, _row_dot_words
from .mxfp4 import as_packed
from .packed_mm import mxfp4_moe_packed_mm
from .reference import SWIGLU_ALPHA, SWIGLU_LIMIT, route
from .tuning import get_config


@triton.jit
def _row_dot(x_ptr, k_len, w_base, s_base, rows, stride_wn, stride_sn,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IMPL: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    """sum_k x[k] * W[rows, k] for one token -> fp32 [BLOCK_N]. x_ptr points at the token's row."""
    if IMPL == 2:
        r = _row_dot_words(x_ptr, k_len, w_base, s_base, rows, stride_wn, stride_sn, BLOCK_N, BLOCK_K, INTERPRETED)
    elif IMPL == 0:
        r = _row_dot_mma(x_ptr, k_len, w_base, s_base, rows, stride_wn, stride_sn, BLOCK_N, BLOCK_K)
    else:
        r = _row_dot_fma(x_ptr, k_len, w_base, s_base, rows, stride_wn, stride_sn, BLOCK_N, BLOCK_K)
    return r


@triton.jit
def _row_dot_mma(x_ptr, k_len, w_base, s_base, rows, stride_wn, stride_sn,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    cols = tl.arange(0, 16)
    for k0 in range(0, k_len, BLOCK_K):
        offs_kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kb_mask = offs_kb < k_len // 2
        w = tl.load(w_base + rows[:, None] * stride_wn + offs_kb[None, :], mask=kb_mask[None, :], other=0)
        offs_ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        s = tl.load(s_base + rows[:, None] * stride_sn + offs_ks[None, :],
                    mask=(offs_ks < k_len // 32)[None, :], other=0)
        xt = tl.load(x_ptr + offs_k[:, None] + cols[None, :] * 0,
                     mask=(offs_k < k_len)[:, None] & (cols == 0)[None, :], other=0.0)
        acc = tl.dot_scaled(w, s, "e2m1", xt, None, "bf16", acc)
    return tl.sum(acc, axis=1)


@triton.jit
def _row_dot_fma(x_ptr, k_len, w_base, s_base, rows, stride_wn, stride_sn,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    acc = tl.zeros((BLOCK_N, BLOCK_K // 32), dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        offs_kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kb_mask = offs_kb < k_len // 2
        w = tl.load(w_base + rows[:, None] * stride_wn + offs_kb[None, :], mask=kb_mask[None, :], other=0)
        x_even = tl.load(x_ptr + 2 * offs_kb, mask=kb_mask, other=0.0).to(tl.float32)
        x_odd = tl.load(x_ptr + 2 * offs_kb + 1, mask=kb_mask, other=0.0).to(tl.float32)
        wi = w.to(tl.int32)
        part = _e2m1_to_f32(wi & 15) * x_even[None, :] + _e2m1_to_f32(wi >> 4) * x_odd[None, :]
        part = tl.sum(tl.reshape(part, (BLOCK_N, BLOCK_K // 32, 16)), axis=2)
        offs_ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        s = tl.load(s_base + rows[:, None] * stride_sn + offs_ks[None, :],
                    mask=(offs_ks < k_len // 32)[None, :], other=0)
        acc += part * _e8m0_to_f32(s.to(tl.int32))
    return tl.sum(acc, axis=1)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, h_ptr,
    H, I,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_hm,
    TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IMPL: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)  # flattened (token, slot)
    tok = pid_t // TOP_K
    e = tl.load(ids_ptr + pid_t).to(tl.int64)
    offs_i = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    i_mask = offs_i < I
    if e >= 0:
        ii = tl.where(i_mask, offs_i, 0).to(tl.int64)
        w_base = w_ptr + e * stride_we
        s_base = s_ptr + e * stride_se
        x_row = x_ptr + tok * stride_xm
        gate = _row_dot(x_row, H, w_base, s_base, 2 * ii, stride_wn, stride_sn, BLOCK_N, BLOCK_K, IMPL, INTERPRETED)
        up = _row_dot(x_row, H, w_base, s_base, 2 * ii + 1, stride_wn, stride_sn, BLOCK_N, BLOCK_K, IMPL, INTERPRETED)
        if HAS_BIAS:
            gate += tl.load(b_ptr + e * stride_be + 2 * ii).to(tl.float32)
            up += tl.load(b_ptr + e * stride_be + 2 * ii + 1).to(tl.float32)
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        h = (up + 1.0) * (gate * tl.sigmoid(gate * ALPHA))
    else:
        h = tl.zeros((BLOCK_N,), dtype=tl.float32)
    tl.store(h_ptr + pid_t * stride_hm + offs_i, _round_bf16(h, INTERPRETED), mask=i_mask)


@triton.jit
def _moe_down_kernel(
    h_ptr, ids_ptr, wts_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    H, I,
    stride_hm, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_om,
    TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IMPL: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    tok = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < H
    rows = tl.where(n_mask, offs_n, 0).to(tl.int64)
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(0, TOP_K):
        slot = tok * TOP_K + j
        e = tl.load(ids_ptr + slot).to(tl.int64)
        if e >= 0:
            wt = tl.load(wts_ptr + slot).to(tl.float32)
            y = _row_dot(h_ptr + slot * stride_hm, I, w_ptr + e * stride_we, s_ptr + e * stride_se, rows,
                         stride_wn, stride_sn, BLOCK_N, BLOCK_K, IMPL, INTERPRETED)
            if HAS_BIAS:
                y += tl.load(b_ptr + e * stride_be + rows).to(tl.float32)
            total += wt * y
    tl.store(out_ptr + tok * stride_om + offs_n, _round_bf16(total, INTERPRETED), mask=n_mask)


_IMPLS = {"dot_scaled": 0, "fma": 1, "fma16": 2}


def mxfp4_moe(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    down_bias: torch.Tensor | None,
    out: torch.Tensor | None = None,
    config: dict | None = None,
    alpha: float = SWIGLU_ALPHA,
    limit: float = SWIGLU_LIMIT,
) -> torch.Tensor:
    """Experts of the gpt-oss MoE block for decode.

    x [M, H] bf16; expert_ids [M, k] int (-1 = skip); expert_weights [M, k] float;
    gate_up_blocks [E, 2I, H//32, 16] (or packed [E, 2I, H//2]), rows interleaved gate/up;
    gate_up_scales [E, 2I, H//32]; gate_up_bias [E, 2I]; down_blocks [E, H, I//32, 16];
    down_scales [E, H, I//32]; down_bias [E, H]. Returns [M, H] bf16.
    """
    w1 = as_packed(gate_up_blocks, gate_up_scales)
    w2 = as_packed(down_blocks, down_scales)
    m, hdim = x.shape
    e_count, two_i, _ = w1.shape
    inter = two_i // 2
    if w1.shape[2] * 2 != hdim or w2.shape[:2] != (e_count, hdim) or w2.shape[2] * 2 != inter:
        raise ValueError(f"MoE shapes disagree: x {tuple(x.shape)}, gate_up {tuple(w1.shape)}, down {tuple(w2.shape)}")
    if hdim % 32 or inter % 32:
        raise ValueError(f"hidden ({hdim}) and intermediate ({inter}) sizes must be multiples of 32")
    top_k = check_routes(m, expert_ids, expert_weights)
    check_bias(gate_up_bias, (e_count, two_i), "gate_up")
    check_bias(down_bias, (e_count, hdim), "down")
    check_device(x, w1, w2, gate_up_scales, down_scales)
    cfg = config or get_config("moe")
    impl = _IMPLS[cfg.get("impl", "dot_scaled")]
    block_n = int(cfg["block_n"])
    down_block_n = int(cfg.get("down_block_n", block_n))
    nw, ns = int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 3))
    down_nw = int(cfg.get("down_num_warps", nw))
    x = x.to(torch.bfloat16).contiguous()
    ids = expert_ids.to(torch.int32).contiguous()
    wts = expert_weights.to(torch.float32).contiguous()
    for t in (w1, w2, gate_up_scales, down_scales):
        if t.stride(-1) != 1:
            raise ValueError("expert weights and scales must be contiguous in their last dim")
    h = torch.empty((m * top_k, inter), dtype=torch.bfloat16, device=x.device)
    if out is None:
        out = torch.empty((m, hdim), dtype=torch.bfloat16, device=x.device)
    bk1 = max(64, min(int(cfg["block_k"]), triton.next_power_of_2(hdim)))
    bk2 = max(64, min(int(cfg["block_k"]), triton.next_power_of_2(inter)))
    b1 = gate_up_bias if gate_up_bias is not None else x
    b2 = down_bias if down_bias is not None else x
    _moe_gate_up_kernel[(triton.cdiv(inter, block_n), m * top_k)](
        x, ids, w1, gate_up_scales, b1, h,
        hdim, inter,
        x.stride(0), w1.stride(0), w1.stride(1), gate_up_scales.stride(0), gate_up_scales.stride(1),
        b1.stride(0) if gate_up_bias is not None else 0, h.stride(0),
        TOP_K=top_k, HAS_BIAS=gate_up_bias is not None, ALPHA=alpha, LIMIT=limit,
        BLOCK_N=block_n, BLOCK_K=bk1, IMPL=impl, INTERPRETED=INTERPRET, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    _moe_down_kernel[(triton.cdiv(hdim, down_block_n), m)](
        h, ids, wts, w2, down_scales, b2, out,
        hdim, inter,
        h.stride(0), w2.stride(0), w2.stride(1), down_scales.stride(0), down_scales.stride(1),
        b2.stride(0) if down_bias is not None else 0, out.stride(0),
        TOP_K=top_k, HAS_BIAS=down_bias is not None,
        BLOCK_N=down_block_n, BLOCK_K=bk2, IMPL=impl, INTERPRETED=INTERPRET, num_warps=down_nw, num_stages=ns,
    )  # fmt: skip
    return out


def moe_forward(
    x: torch.Tensor,
    router_w: torch.Tensor,
    router_b: torch.Tensor | None,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    down_bias: torch.Tensor | None,
    top_k: int,
) -> torch.Tensor:
    """Whole gpt-oss MoE block: torch routing (fp32 logits, top-k, softmax) + `mxfp4_moe`."""
    ids, weights = route(x, router_w, router_b, top_k)
    return mxfp4_moe(x, ids, weights, gate_up_blocks, gate_up_scales, gate_up_bias,
                     down_blocks, down_scales, down_bias)


# --- packed experts (kernels/packed.py): the rebuilt decode path ----------------------------------
# Three launches on a GPU (csrc/mxfp4_mma.cu via cuda_ext): route (router GEMV in the stored dtype +
# top-k + softmax, int32 ids), gate_up for all k experts with SwiGLU in the epilogue, down + weighted
# combine in a fixed order (deterministic). gate_up and down use programmatic dependent launch where
# the GPU has it: down prefetches its expert weights while gate_up finishes. Elsewhere (M > 16, CPU
# interpreter, no nvcc, impl: portable) the same packed bytes go through kernels/packed_mm.py's grouped
# tensor-core GEMMs (slots sorted by expert, no host sync): one copy of the weights serves every M.


def pack_moe_experts(gate_up_blocks: torch.Tensor, gate_up_scales: torch.Tensor, down_blocks: torch.Tensor,
                     down_scales: torch.Tensor):
    """Checkpoint experts -> (gate_up PackedMXFP4 [E, ...] with gate/up rows paired per tile, down
    PackedMXFP4 [E, ...]). Once at load."""
    from .packed import pack_mxfp4

    return pack_mxfp4(gate_up_blocks, gate_up_scales, paired=True), pack_mxfp4(down_blocks, down_scales)


def mxfp4_moe_packed(x: torch.Tensor, expert_ids: torch.Tensor, expert_weights: torch.Tensor, gate_up, gate_up_bias,
                     down, down_bias, out: torch.Tensor | None = None, config: dict | None = None,
                     alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """Experts of the gpt-oss MoE block on packed weights (`pack_moe_experts`). x [M, H] bf16,
    expert_ids [M, k] (-1 = skip), expert_weights [M, k] -> [M, H] bf16. M <= 16 on a GPU: the CUDA decode
    kernels; otherwise `packed_mm.mxfp4_moe_packed_mm` (any M, the same packed experts)."""
    m, hdim = x.shape
    if gate_up.k != hdim or down.n != hdim or down.k * 2 != gate_up.n or not gate_up.paired:
        raise ValueError(f"MoE shapes disagree: x {tuple(x.shape)}, gate_up {gate_up.n}x{gate_up.k} "
                         f"(paired={gate_up.paired}), down {down.n}x{down.k}")
    check_routes(m, expert_ids, expert_weights)
    check_bias(gate_up_bias, (gate_up.experts, gate_up.n), "gate_up")
    check_bias(down_bias, (down.experts, down.n), "down")
    check_device(x, gate_up.words, down.words)
    cfg = config or get_config("moe").get("packed", {})
    x = x.to(torch.bfloat16).contiguous()
    if out is None:
        out = torch.empty((m, hdim), dtype=torch.bfloat16, device=x.device)
    if not INTERPRET and x.is_cuda and m <= CUDA_MAX_M and expert_ids.shape[1] <= 8 and cfg.get("impl", "cuda") == "cuda":
        from . import cuda_ext

        if cuda_ext.available()[0]:
            return cuda_ext.moe(x, expert_ids, expert_weights, gate_up, gate_up_bias, down, down_bias, out, cfg,
                                alpha, limit)
    return mxfp4_moe_packed_mm(x, expert_ids, expert_weights, gate_up, gate_up_bias, down, down_bias, out=out,
                               alpha=alpha, limit=limit)


def route_packed(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None, top_k: int,
                 config: dict | None = None):
    """(ids int32 [M, k], weights float32 [M, k]). GPU: one CUDA launch reading the router weights in
    their stored dtype; elsewhere the fp32 reference routing."""
    cfg = config or get_config("moe").get("packed", {})
    if not INTERPRET and x.is_cuda and cfg.get("impl", "cuda") == "cuda":
        from . import cuda_ext

        if cuda_ext.topk_supported(router_w.shape[0], top_k) and cuda_ext.available()[0]:
            xb = x.to(torch.bfloat16)
            # rows may be strided (a column slice of a padded x): the kernel takes the row stride, no copy needed
            return cuda_ext.route(xb if xb.stride(-1) == 1 else xb.contiguous(), router_w, router_b, top_k,
                                  cfg.get("cuda_src", ""))
    ids, wts = route(x, router_w, router_b, top_k)
    return ids.to(torch.int32), wts


def moe_forward_packed(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None, gate_up, gate_up_bias,
                       down, down_bias, top_k: int, out: torch.Tensor | None = None,
                       config: dict | None = None) -> torch.Tensor:
    """Whole gpt-oss MoE block on packed experts: route + experts (3 launches on a GPU)."""
    ids, wts = route_packed(x, router_w, router_b, top_k, config=config)
    return mxfp4_moe_packed(x, ids, wts, gate_up, gate_up_bias, down, down_bias, out=out, config=config)
