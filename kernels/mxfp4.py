"""MXFP4 per OCP Microscaling Formats (MX) v1.0: E2M1 elements, one E8M0 scale per 32 elements.

Encoding (bit-exact, pure PyTorch, CPU or GPU):

* Element E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; no Inf/NaN. Codes 0..7 are
  +{0, 0.5, 1, 1.5, 2, 3, 4, 6}, codes 8..15 the same with the sign bit set (spec table 5).
* Scale E8M0: byte s is 2**(s-127); 255 is NaN, and a NaN scale makes the whole block NaN.
* Packing: two elements per byte, element 2i in the LOW nibble, 2i+1 in the high nibble
  (the order gpt-oss checkpoints, transformers and Triton's `dot_scaled` use).
* Quantize (spec 6.3): shared exponent = floor(log2(amax)) - 2 (2 = emax of E2M1), clamped to
  [-127, 127]; elements x / 2**exp rounded to nearest, ties to even, saturating to +-6.
  The sign of values that round to zero is kept (-0 is code 8).

Edge cases (documented behaviour, tested):
* all-zero block: scale byte 0 (2**-127), all codes 0 -> dequantizes to exact zeros.
* block containing NaN or +-Inf: scale byte 255 (NaN) and codes 0; dequantize returns NaN for the
  whole block. E2M1 cannot hold Inf/NaN, so the block is marked invalid rather than saturated.
* K not a multiple of 32: ValueError.
* very large blocks: amax up to float32 max gives exp 125; 6 * 2**127 overflows float32 on
  dequantize (inf) exactly as it does in transformers.

gpt-oss checkpoint layout (`*_blocks`, `*_scales` tensors of the MoE experts):
* `gate_up_proj_blocks` uint8 [E, 2*I, H/32, 16], `gate_up_proj_scales` uint8 [E, 2*I, H/32];
  `down_proj_blocks` [E, H, I/32, 16], `down_proj_scales` [E, H, I/32]: i.e. [E, N(out), K(in)]
  weights, each row a run of 32-element blocks of 16 bytes. `quantize_gpt_oss_experts` /
  `dequantize_gpt_oss_experts` work in this [E, N, K] orientation.
* gate/up are INTERLEAVED along N: row 2j is gate_j and row 2j+1 is up_j (the SwiGLU takes
  gate_up[..., ::2] and gate_up[..., 1::2]); the biases `gate_up_proj_bias` [E, 2I] likewise.
* transformers' `convert_moe_packed_tensors(blocks, scales)` dequantizes to [E, N, K] and then
  TRANSPOSES to [E, K, N], because `GptOssExperts.gate_up_proj` is stored [E, H, 2I] (in, out) and
  used as `x @ W`. So `dequantize_gpt_oss_experts(b, s).transpose(1, 2)` equals
  `convert_moe_packed_tensors(b, s)` exactly (tested in tests/level1_5_kernels).
"""

from __future__ import annotations

import torch

from ._mx import BLOCK, E8M0_BIAS, E8M0_NAN, check_k, e8m0_to_f32, scaled_elements, shared_exponent

E2M1_EMAX = 2
E2M1_MAX = 6.0
# Code -> value for the 16 codes (spec table 5); index with the 4-bit code.
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip

# Rounding boundaries between consecutive magnitudes 0,.5,1,1.5,2,3,4,6 and whether a tie goes
# UP (the upper neighbour has the even code). Ties to even: 0.25->0, 0.75->1, 1.25->1, 1.75->2,
# 2.5->2, 3.5->4, 5->4.
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """float32 (already divided by the block scale) -> 4-bit E2M1 codes (uint8), RNE, saturating."""
    mag = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for mid, tie_up in _MIDPOINTS:
        code += (mag >= mid if tie_up else mag > mid).to(torch.uint8)
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    lut = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    return lut[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K//2] bytes, element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K//2] bytes -> [..., K] codes."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] float -> (packed uint8 [..., K//2], scales uint8 E8M0 [..., K//32])."""
    if not x.is_floating_point():
        raise TypeError(f"quantize_mxfp4 expects a floating-point tensor, got {x.dtype}")
    k = x.shape[-1]
    check_k(k)
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    exp, finite = shared_exponent(blocks, E2M1_EMAX)
    v = scaled_elements(torch.where(finite.unsqueeze(-1), blocks, torch.zeros_like(blocks)), exp)
    codes = e2m1_encode(v).reshape(*x.shape[:-1], k)
    scales = torch.where(finite, exp + E8M0_BIAS, torch.full_like(exp, E8M0_NAN)).to(torch.uint8)
    return pack_nibbles(codes), scales


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(packed uint8 [..., K//2], scales uint8 [..., K//32]) -> [..., K] in `dtype`.

    Computed in float32 (exact: every E2M1 value times 2**(s-127) is representable unless it
    overflows), then cast, so bf16/fp16 results are the correctly rounded float32 values.
    """
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"packed and scales must be uint8, got {packed.dtype} and {scales.dtype}")
    k = packed.shape[-1] * 2
    if packed.shape[:-1] != scales.shape[:-1] or scales.shape[-1] * BLOCK != k:
        raise ValueError(
            f"shape mismatch: packed {tuple(packed.shape)} holds K={k} elements per row, which needs "
            f"scales [..., {k // BLOCK}] with the same leading dims, got {tuple(scales.shape)}"
        )
    vals = e2m1_decode(unpack_nibbles(packed)).reshape(*scales.shape, BLOCK)
    out = vals * e8m0_to_f32(scales).unsqueeze(-1)
    return out.reshape(*packed.shape[:-1], k).to(dtype)


def quantize_gpt_oss_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, N, K] (out, in) -> (blocks uint8 [E, N, K//32, 16], scales uint8 [E, N, K//32])."""
    if w.dim() != 3:
        raise ValueError(f"expected expert weights [E, N, K], got shape {tuple(w.shape)}")
    packed, scales = quantize_mxfp4(w)
    e, n, k = w.shape
    return packed.reshape(e, n, k // BLOCK, BLOCK // 2), scales


def dequantize_gpt_oss_experts(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(blocks [E, N, K//32, 16], scales [E, N, K//32]) -> [E, N, K] (NOT transposed; see module doc)."""
    if blocks.dim() != 4 or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"expected blocks [E, N, K//32, 16], got shape {tuple(blocks.shape)}")
    packed = blocks.reshape(*blocks.shape[:-2], blocks.shape[-2] * blocks.shape[-1])
    return dequantize_mxfp4(packed, scales, dtype)


def as_packed(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Accept packed [..., K//2] or checkpoint blocks [..., K//32, 16] (told apart by the scales'
    rank: blocks have one more dim than scales); return packed [..., K//2] (a view when possible)."""
    if w.dim() == scales.dim() + 1:
        if w.shape[-1] != BLOCK // 2:
            raise ValueError(f"blocks must end in 16 bytes, got shape {tuple(w.shape)}")
        return w.reshape(*w.shape[:-2], w.shape[-2] * w.shape[-1])
    if w.dim() != scales.dim():
        raise ValueError(f"weights {tuple(w.shape)} and scales {tuple(scales.shape)} ranks do not match")
    return w
