"""Fused Triton BF16 -> MXFP8 activation quantization: bit-exact against kernels.mxfp8 (the
reference is exact, the kernel performs the same integer/power-of-two steps and an RNE cast, so
any difference is a bug: the tolerance is zero)."""

from __future__ import annotations

import pytest
import torch

from kernels import mxfp8
from kernels._triton import INTERPRET
from kernels.cases import HIDDEN, LINEAR_SHAPES
from kernels.quant import quantize_mxfp8_triton
from kernels.testing import DEV, fresh_seed, generator

pytestmark = pytest.mark.level1_5



def _assert_bit_exact(x: torch.Tensor, seed: int, what: str):
    q, s = quantize_mxfp8_triton(x)
    q_ref, s_ref = mxfp8.quantize_mxfp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8
    assert torch.equal(s, s_ref), f"{what}: {(s != s_ref).sum()} scales differ (seed={seed})"
    diff = q.view(torch.uint8) != q_ref.view(torch.uint8)
    assert not diff.any(), (
        f"{what}: {int(diff.sum())} elements differ, first at {diff.nonzero()[0].tolist()} (seed={seed})"
    )


@pytest.mark.parametrize("shape", [(1, 32), (3, 96), (16, 320), (2, 3, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quant_small_shapes_bit_exact(shape, dtype):
    seed = fresh_seed()
    g = generator(seed, DEV)
    spread = torch.exp2(torch.randint(-30, 30, (*shape[:-1], 1), generator=g, device=DEV).float())
    x = (torch.randn(shape, generator=g, device=DEV) * spread).to(dtype)
    _assert_bit_exact(x, seed, f"shape {shape} {dtype}")


def test_quant_every_rounding_midpoint():
    """All finite E4M3 magnitudes and the midpoints between neighbours (ties to even), at scale 2**0
    (every 32-block carries 448 so the shared exponent is 0), normal and subnormal range."""
    grid = torch.arange(0, 0x7F, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (grid[1:] + grid[:-1]) / 2
    vals = torch.cat((grid, mids, mids + 2.0**-12, mids - 2.0**-12, -grid, -mids))
    pad = (-len(vals)) % 31
    vals = torch.cat((vals, torch.zeros(pad))).reshape(-1, 31)
    x = torch.cat((vals, torch.full((vals.shape[0], 1), 448.0)), dim=1).reshape(1, -1).to(DEV)
    _assert_bit_exact(x, 0, "midpoints")


def test_quant_edge_cases():
    x = torch.randn(4, 128, device=DEV)
    x[0, :32] = 0.0  # zero block -> scale 0
    x[1, 40] = float("nan")  # NaN -> scale 255
    x[2, 70] = float("inf")
    x[3, 96:] = torch.linspace(-500, 500, 32)  # 448 < |x| < 512 saturates
    x[3, 0:32] = 2.0**-140  # below the E8M0 range
    _assert_bit_exact(x.to(torch.bfloat16), 0, "edge cases bf16")
    _assert_bit_exact(x, 0, "edge cases fp32")
    q, s = quantize_mxfp8_triton(x)
    assert s[0, 0] == 0 and s[1, 1] == 255 and s[2, 2] == 255
    assert q[3, 96].float().item() == -448.0


def test_quant_rejects_ragged_k():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp8_triton(torch.zeros(2, 48, device=DEV))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("k", [HIDDEN, LINEAR_SHAPES["o_proj"][1], LINEAR_SHAPES["expert_gate_up"][0]])  # 2880, 4096, 5760
def test_quant_gpt_oss_shapes_bit_exact(m, k):
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA (compiled Triton); the interpreter covers the small shapes")
    seed = fresh_seed()
    g = generator(seed, "cuda")
    x = (torch.randn(m, k, generator=g, device="cuda") * 3).to(torch.bfloat16)
    _assert_bit_exact(x, seed, f"[{m}, {k}]")
