"""Low-M MXFP4 GEMM/GEMV (W4A16) in Triton, and the `mxfp4_linear` dispatcher.

Decode-time dense layers (M = 1..16 tokens) are bound by reading the weights, so the kernel reads
them packed (0.53 bytes/element incl. scales, vs 2 for BF16) and dequantizes in registers.

Swap-AB: out^T [N, M] = W [N, K] @ x^T [K, M]. The weights are the MMA's M side (tiles of 64-128
rows) and the few tokens its N side (padded to 16), so no tensor-core work is wasted on a padded
weight dimension, and with `impl: dot_scaled` the e2m1 upcast is Triton's own (`tl.dot_scaled`,
native on targets that have MX MMA, emulated with an efficient upcast elsewhere).
`impl: dequant_dot` is a plain-Triton fallback: our bit-trick e2m1 -> float, times the scale, bf16,
then two tl.dot (even / odd K elements), for Triton versions or targets where dot_scaled misbehaves.

Semantics: out[m, n] = bf16( sum_k x[m, k] * W[n, k] + bias[n] ), fp32 accumulation, exactly as
reference.mxfp4_linear_ref up to summation order and the final BF16 rounding.
"""

from __future__ import annotations

import functools

import torch

from ._triton import INTERPRET, check_device, tl, triton
from .mxfp4 import as_packed, dequantize_mxfp4
from .tuning import get_config

@triton.jit
def _e2m1_to_f32(codes):
    """4-bit codes (int32) -> exact float32 values. Sign to bit 31, exponent+mantissa (3 bits) to
    bits 22..24: that float is value * 2**-126 (the zero-exponent code lands on the subnormal 2**-127
    = 0.5 * 2**-126, which is why this works for code 1), so multiply by 2**126."""
    bits = ((codes & 8) << 28) | ((codes & 7) << 22)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37


@triton.jit
def _e8m0_to_f32(s):
    """E8M0 byte (int32) -> 2**(s-127) exactly; 0 -> 2**-127 (subnormal bits), 255 -> NaN."""
    bits = tl.where(s == 0, 0x00400000, s << 23)
    bits = tl.where(s == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dot_bf16(a, b, acc, INTERPRETED: tl.constexpr):
    """acc + a @ b for bf16 a, b. Triton's interpreter (3.9) multiplies the raw uint16 bit patterns
    of bf16 operands in tl.dot, so there we upcast to fp32 first (exact, ieee precision)."""
    if INTERPRETED:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        r = tl.dot(a, b, acc)
    return r


@triton.jit
def _round_bf16(x, INTERPRETED: tl.constexpr):
    """float32 -> bf16, round-to-nearest-even. The GPU cast already does RNE; Triton's interpreter
    (3.9) truncates, so there we round the bit pattern ourselves first (the cast is then exact)."""
    if INTERPRETED:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        r = b.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        r = x.to(tl.bfloat16)
    return r


@triton.jit
def _mxfp4_gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    IMPL: tl.constexpr,  # 0 = dot_scaled, 1 = dequant_dot
    INTERPRETED: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    # Clamp out-of-range rows to a valid row instead of masking the big weight loads: the loads stay
    # unpredicated and vectorized; those rows' results are simply not stored.
    rows = tl.where(n_mask, offs_n, 0).to(tl.int64)
    KH = K // 2
    KS = K // 32
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kb_mask = offs_kb < KH
        if IMPL == 0:
            offs_ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            offs_k = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + offs_kb[None, :], mask=kb_mask[None, :], other=0)
            s = tl.load(s_ptr + rows[:, None] * stride_sn + offs_ks[None, :], mask=(offs_ks < KS)[None, :], other=0)
            xt = tl.load(
                x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None],
                mask=m_mask[None, :] & (offs_k < K)[:, None], other=0.0,
            )
            acc = tl.dot_scaled(w, s, "e2m1", xt, None, "bf16", acc)
        else:
            w = tl.load(w_ptr + rows[:, None] * stride_wn + offs_kb[None, :], mask=kb_mask[None, :], other=0)
            # scale of packed byte j is that of elements 2j, 2j+1 -> block (j // 16); gather-load (L1 hits)
            s = tl.load(s_ptr + rows[:, None] * stride_sn + (offs_kb // 16)[None, :], mask=kb_mask[None, :], other=0)
            scale = _e8m0_to_f32(s.to(tl.int32))
            wi = w.to(tl.int32)
            w_lo = (_e2m1_to_f32(wi & 15) * scale).to(tl.bfloat16)
            w_hi = (_e2m1_to_f32(wi >> 4) * scale).to(tl.bfloat16)
            xm = m_mask[None, :] & kb_mask[:, None]
            x_even = tl.load(x_ptr + offs_m[None, :] * stride_xm + 2 * offs_kb[:, None], mask=xm, other=0.0)
            x_odd = tl.load(x_ptr + offs_m[None, :] * stride_xm + 2 * offs_kb[:, None] + 1, mask=xm, other=0.0)
            acc = _dot_bf16(w_lo, x_even, acc, INTERPRETED)
            acc = _dot_bf16(w_hi, x_odd, acc, INTERPRETED)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out_ptrs, _round_bf16(acc, INTERPRETED), mask=n_mask[:, None] & m_mask[None, :])


_IMPLS = {"dot_scaled": 0, "dequant_dot": 1}


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _pick_block_n(n: int, candidates, min_programs: int) -> int:
    cands = sorted(candidates if isinstance(candidates, (list, tuple)) else [candidates], reverse=True)
    for bn in cands:
        if triton.cdiv(n, bn) >= min_programs:
            return bn
    return cands[-1]


def mxfp4_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Triton low-M W4A16 linear: x [M, K] bf16, W packed [N, K//2] (or blocks [N, K//32, 16]),
    scales [N, K//32] -> [M, N] bf16 (written into `out` if given)."""
    w = as_packed(w, scales)
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"expected x [M, K] and weights [N, K//2], got {tuple(x.shape)}, {tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[0]
    if k % 32 or w.shape[1] * 2 != k or scales.shape != (n, k // 32):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, packed {tuple(w.shape)}, scales {tuple(scales.shape)}")
    check_device(x, w, scales, bias)
    cfg = config or get_config("gemv")
    x = x.to(torch.bfloat16).contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    if scales.stride(1) != 1:
        scales = scales.contiguous()
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    min_prog = int(cfg.get("min_programs_per_sm", 0)) * (_sm_count(x.device.index or 0) if x.is_cuda else 0)
    block_n = _pick_block_n(n, cfg["block_n"], min_prog)
    block_m = int(cfg.get("block_m", 16))
    block_k = min(int(cfg["block_k"]), triton.next_power_of_2(k))
    block_k = max(block_k, 64)  # dot_scaled wants >= 32 scale groups... and tl.dot K >= 16 per half
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _mxfp4_gemv_kernel[grid](
        x, w, scales, bias if bias is not None else x, out,
        m, n, k,
        x.stride(0), w.stride(0), scales.stride(0), out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        IMPL=_IMPLS[cfg.get("impl", "dot_scaled")], INTERPRETED=INTERPRET,
        num_warps=int(cfg.get("num_warps", 4)), num_stages=int(cfg.get("num_stages", 3)),
    )  # fmt: skip
    return out


def mxfp4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    small_m_threshold: int | None = None,
) -> torch.Tensor:
    """Dispatcher: x [..., K] bf16 -> [..., N] bf16.

    M (tokens) <= threshold -> Triton low-M kernel (weights stay packed); larger M -> dequantize to
    BF16 + torch.matmul (compute-bound there, where cuBLAS wins). Threshold from tuning.yaml
    (gemv.small_m_threshold, env KERNELS_GEMV_SMALL_M_THRESHOLD) unless given.
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    thr = small_m_threshold if small_m_threshold is not None else int(get_config("gemv")["small_m_threshold"])
    if x2.shape[0] <= thr:
        y = mxfp4_gemv(x2, packed, scales, bias)
    else:
        wb = dequantize_mxfp4(as_packed(packed, scales), scales, torch.bfloat16)
        y = torch.nn.functional.linear(x2.to(torch.bfloat16), wb, None if bias is None else bias.to(torch.bfloat16))
    return y.reshape(*lead, y.shape[-1])
