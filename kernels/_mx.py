"""Shared pieces of the OCP MX v1.0 formats: the E8M0 scale and the shared-exponent rule.

Everything is done with integer bit manipulation on float32 so results are exact and identical on
CPU and GPU (no exp2/log2 rounding questions):

* E8M0 byte s encodes 2**(s - 127); s = 255 is NaN (spec 5.4). s = 0 is 2**-127, a float32
  subnormal, built from its bit pattern 0x00400000.
* floor(log2(amax)) is read from the float32 exponent field. Any amax below 2**-126 (subnormal or
  zero) gives a shared exponent that the clamp sends to the minimum, -127, so an all-zero block gets
  scale byte 0 -- the natural result of the formula with clamping, as in the microxscaling
  reference library.
"""

from __future__ import annotations

import torch

BLOCK = 32  # elements per shared scale (MX v1.0, all concrete formats)
E8M0_BIAS = 127
E8M0_NAN = 255
SCALE_EXP_MIN = -127
SCALE_EXP_MAX = 127


def check_k(k: int, what: str = "last dimension") -> None:
    """MX blocks are 32 consecutive elements along K; a ragged tail would need padding nobody agreed on."""
    if k % BLOCK != 0:
        raise ValueError(
            f"MX quantization needs the {what} (K) to be a multiple of {BLOCK}, got K={k}; "
            f"pad K to {((k + BLOCK - 1) // BLOCK) * BLOCK} (with zeros) before quantizing"
        )


def e8m0_to_f32(scales: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 -> exact float32 2**(s-127); 255 -> NaN."""
    s = scales.to(torch.int32)
    bits = torch.where(s == 0, torch.full_like(s, 0x00400000), s << 23)
    bits = torch.where(s == E8M0_NAN, torch.full_like(s, 0x7FC00000), bits)
    return bits.view(torch.float32)


def pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """Exact float32 2**e for integer e in [-126, 127] (normal range)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def shared_exponent(blocks_f32: torch.Tensor, elem_emax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared exponent per block (last dim = 32 elements).

    Returns (exp int32 [..., nblocks], finite bool [..., nblocks]).
    exp = clamp(floor(log2(amax)) - elem_emax, -127, 127) (spec 6.3). Blocks with a NaN or Inf are
    reported as not finite; callers give them the NaN scale.
    """
    amax = blocks_f32.abs().amax(dim=-1)
    finite = torch.isfinite(blocks_f32).all(dim=-1)
    amax = torch.where(finite, amax, torch.zeros_like(amax))
    biased = (amax.view(torch.int32) >> 23) & 0xFF  # 0 for zero / subnormal amax
    exp = (biased - 127 - elem_emax).clamp(SCALE_EXP_MIN, SCALE_EXP_MAX)
    return exp, finite


def scaled_elements(blocks_f32: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """x / 2**exp, exactly (a power-of-two multiply; exp in [-127, 125] so 2**-exp is normal)."""
    return blocks_f32 * pow2_f32(-exp).unsqueeze(-1)
