"""MXFP8 (E4M3) per OCP MX v1.0: float8_e4m3fn elements, one E8M0 scale per 32 elements.

* Shared exponent = floor(log2(amax)) - 8 (8 = emax of E4M3, max normal 448 = 1.75 * 2**8),
  clamped to [-127, 127]; elements x / 2**exp rounded to nearest even and saturated to +-448
  (torch's float8_e4m3fn cast would turn out-of-range values into NaN, so we clamp first;
  x / 2**exp < 512 always, so only the 448..512 band is affected).
* all-zero block -> scale byte 0, elements 0. Block with NaN/Inf -> scale 255 (NaN), elements 0;
  dequantize gives NaN for the block.
* K not a multiple of 32 -> ValueError.
"""

from __future__ import annotations

import torch

from ._mx import BLOCK, E8M0_BIAS, E8M0_NAN, check_k, e8m0_to_f32, scaled_elements, shared_exponent

E4M3_EMAX = 8
E4M3_MAX = 448.0


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] float -> (float8_e4m3fn [..., K], scales uint8 E8M0 [..., K//32])."""
    if not x.is_floating_point():
        raise TypeError(f"quantize_mxfp8 expects a floating-point tensor, got {x.dtype}")
    k = x.shape[-1]
    check_k(k)
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    exp, finite = shared_exponent(blocks, E4M3_EMAX)
    v = scaled_elements(torch.where(finite.unsqueeze(-1), blocks, torch.zeros_like(blocks)), exp)
    elems = v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(x.shape)
    scales = torch.where(finite, exp + E8M0_BIAS, torch.full_like(exp, E8M0_NAN)).to(torch.uint8)
    return elems, scales


def dequantize_mxfp8(elems: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(float8_e4m3fn [..., K] (or its uint8 bit pattern), scales uint8 [..., K//32]) -> [..., K]."""
    if elems.dtype == torch.uint8:
        elems = elems.view(torch.float8_e4m3fn)
    if elems.dtype != torch.float8_e4m3fn or scales.dtype != torch.uint8:
        raise TypeError(f"expected float8_e4m3fn elements and uint8 scales, got {elems.dtype}, {scales.dtype}")
    k = elems.shape[-1]
    if elems.shape[:-1] != scales.shape[:-1] or scales.shape[-1] * BLOCK != k:
        raise ValueError(f"shape mismatch: elements {tuple(elems.shape)} need scales [..., {k // BLOCK}], "
                         f"got {tuple(scales.shape)}")
    vals = elems.to(torch.float32).reshape(*scales.shape, BLOCK)
    return (vals * e8m0_to_f32(scales).unsqueeze(-1)).reshape(elems.shape).to(dtype)
