"""Fused BF16 -> MXFP8 (E4M3 + E8M0 per 32) activation quantization in Triton.

One pass: each program loads BLOCK_G groups of 32 elements of one row, finds each group's amax and
non-finite elements, derives the shared exponent from the float32 exponent bits (exactly as
mxfp8.quantize_mxfp8: floor(log2(amax)) - 8, clamped to [-127, 127]), scales by an exact power of
two, saturates to +-448 and casts with round-to-nearest-even. Bit-identical to the PyTorch
reference, including the edge cases (zero block -> scale 0; NaN/Inf in a block -> scale 255 and
zero elements).
"""

from __future__ import annotations

import torch

from ._triton import INTERPRET, check_device, tl, triton
from .tuning import get_config


@triton.jit
def _e4m3_bits_rne(v):
    """float32 in [-448, 448] -> float8_e4m3fn bit pattern (uint8), round-to-nearest-even, in
    integer arithmetic. Used under TRITON_INTERPRET, whose fp32 -> fp8 cast (Triton 3.9) rounds
    wrongly (e.g. 136 -> 144); on the GPU the hardware cvt (RNE) is used instead."""
    b = v.to(tl.uint32, bitcast=True)
    sign = (b >> 31).to(tl.int32)
    a = b & 0x7FFFFFFF
    # normal range (|v| >= 2**-6): keep 3 mantissa bits with RNE on the dropped 20, rebias 127 -> 7
    r = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20).to(tl.int32) - ((127 - 7) << 3)
    # subnormal range: multiples of 2**-9, RNE to an integer with the 2**23 trick
    y = tl.abs(v) * 512.0
    k = ((y + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(tl.abs(v) >= 0.015625, r, k)
    return ((sign << 7) | code).to(tl.uint8)


@triton.jit
def _mxfp8_quant_kernel(
    x_ptr, q_ptr, s_ptr,
    K,
    stride_xm, stride_qm, stride_sm,
    BLOCK_G: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    pid_g = tl.program_id(1)
    offs_g = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    g_mask = offs_g < K // 32
    offs = offs_g[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = tl.load(x_ptr + row * stride_xm + offs, mask=g_mask[:, None], other=0.0).to(tl.float32)
    bits = x.to(tl.uint32, bitcast=True)
    nonfinite = ((bits >> 23) & 0xFF) == 0xFF
    bad = tl.max(nonfinite.to(tl.int32), axis=1) > 0
    ax = tl.where(nonfinite, 0.0, tl.abs(x))
    amax = tl.max(ax, axis=1)
    ebits = ((amax.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32)
    exp = tl.minimum(tl.maximum(ebits - 127 - 8, -127), 127)
    inv = ((127 - exp) << 23).to(tl.float32, bitcast=True)  # 2**-exp, a normal float32
    v = x * inv[:, None]
    v = tl.minimum(tl.maximum(v, -448.0), 448.0)
    v = tl.where(bad[:, None], 0.0, v)
    if INTERPRETED:
        q = _e4m3_bits_rne(v)  # q_ptr is then the uint8 view of the output
    else:
        q = v.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    tl.store(q_ptr + row * stride_qm + offs, q, mask=g_mask[:, None])
    scale = tl.where(bad, 255, exp + 127)
    tl.store(s_ptr + row * stride_sm + offs_g, scale.to(tl.uint8), mask=g_mask)


def quantize_mxfp8_triton(x: torch.Tensor, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] (bf16/fp16/fp32) -> (float8_e4m3fn [..., K], uint8 scales [..., K//32])."""
    k = x.shape[-1]
    if k % 32:
        raise ValueError(f"MX quantization needs K to be a multiple of 32, got K={k}")
    check_device(x)
    cfg = config or get_config("quant")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, k // 32), dtype=torch.uint8, device=x.device)
    block_g = min(int(cfg["block_g"]), triton.next_power_of_2(k // 32))
    grid = (m, triton.cdiv(k // 32, block_g))
    if m:
        _mxfp8_quant_kernel[grid](x2, q.view(torch.uint8) if INTERPRET else q, s, k,
                                  x2.stride(0), q.stride(0), s.stride(0),
                                  BLOCK_G=block_g, INTERPRETED=INTERPRET, num_warps=int(cfg.get("num_warps", 4)))
    return q.reshape(x.shape), s.reshape(*x.shape[:-1], k // 32)
