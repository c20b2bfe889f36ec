"""Triton low-M MXFP4 GEMV (W4A16) and the `mxfp4_linear` dispatcher against the fp32 reference.

Small awkward shapes run everywhere: on CPU through Triton's interpreter (TRITON_INTERPRET=1, set by
kernels._triton when no GPU is visible), on a GPU compiled. gpt-oss-120b shapes are `gpu`-marked.

Tolerance (GEMV_NMSE = 2e-5): the kernel reads exact BF16 activations and exact MXFP4 weights,
accumulates in fp32 and rounds once to BF16. Rounding to BF16 (8 significant bits) changes each
element by at most 2**-8 of its magnitude, so that rounding alone gives NMSE <= 2**-16 = 1.53e-5
(typically ~3e-6); fp32 accumulation-order differences add ~1e-13. 2e-5 = that hard bound plus a
small margin: any extra rounding step (e.g. BF16 accumulation, a truncating cast, a wrong scale)
shows up far above it.
"""

from __future__ import annotations

import pytest
import torch

from kernels import mxfp4, reference
from kernels._triton import INTERPRET
from kernels.gemv import mxfp4_gemv, mxfp4_linear
from kernels.testing import assert_close_nmse, fresh_seed, generator, poisoned, random_mxfp4
from kernels.tuning import get_config

pytestmark = pytest.mark.level1_5

DEV = "cpu" if INTERPRET else "cuda"
GEMV_NMSE = 2e-5
# dequantize + torch.matmul (large M): cuBLAS may reduce BF16 partial sums in reduced precision
# (torch's allow_bf16_reduced_precision_reduction defaults to True), i.e. a few extra BF16
# roundings of partial sums over K: allow ~6x the single-rounding bound.
MATMUL_NMSE = 1e-4

# rows = CUDA-core fma16 path (inline PTX on GPU, the same math in fp32 under the interpreter);
# dot_scaled / dequant_dot = the tensor-core path. Each is forced for every M here.
IMPLS = ["rows", "dot_scaled", "dequant_dot"]
# (M, N, K): K = 32 (one scale block), N not a multiple of any block size, M = 1, 3, 16, K not a
# power of two (96, 320) so the K loop has a masked tail.
SMALL_SHAPES = [(1, 16, 32), (1, 40, 32), (3, 50, 96), (16, 33, 128), (5, 70, 320), (2, 17, 64), (1, 9, 544)]


def _cfg(impl: str) -> dict:
    cfg = get_config("gemv")
    if impl == "rows":
        cfg["rows_max_m"] = 1 << 30
    else:
        cfg["impl"] = impl
        cfg["rows_max_m"] = 0
    return cfg


def _run_case(m: int, n: int, k: int, impl: str, bias: bool, seed: int, scale_range=(118, 124)):
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((n, k), g, *scale_range)
    x = torch.randn(m, k, generator=g, device=DEV).to(torch.bfloat16)
    b = torch.randn(n, generator=g, device=DEV) if bias else None
    out = poisoned((m, n), torch.bfloat16, DEV)
    mxfp4_gemv(x, packed, scales, b, out=out, config=_cfg(impl))
    ref = reference.mxfp4_linear_ref(x, packed, scales, b)
    return out, ref


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m,n,k", SMALL_SHAPES)
def test_gemv_small_shapes(m, n, k, impl):
    seed = fresh_seed()
    out, ref = _run_case(m, n, k, impl, bias=(n % 2 == 0), seed=seed)
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"gemv {impl} M={m} N={n} K={k}")


@pytest.mark.parametrize("impl", IMPLS)
def test_gemv_wide_scale_range(impl):
    # Scales 2**-27 .. 2**13 in one matrix: exponent handling, not just the typical weight range.
    seed = fresh_seed()
    out, ref = _run_case(2, 24, 256, impl, bias=False, seed=seed, scale_range=(100, 141))
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"gemv {impl} wide scales")


@pytest.mark.parametrize("impl", IMPLS)
def test_gemv_nan_scale_poisons_exactly_its_row(impl):
    """E8M0 255 is NaN: the output column of that weight row must be NaN, every other one finite."""
    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((20, 64), g)
    scales[7, 1] = 255
    x = torch.randn(3, 64, generator=g, device=DEV).to(torch.bfloat16)
    out = mxfp4_gemv(x, packed, scales, config=_cfg(impl))
    assert out[:, 7].isnan().all(), f"seed={seed}"
    others = torch.cat((out[:, :7], out[:, 8:]), dim=1)
    assert torch.isfinite(others).all(), f"seed={seed}"


def test_gemv_accepts_checkpoint_blocks_layout():
    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((24, 96), g)
    x = torch.randn(2, 96, generator=g, device=DEV).to(torch.bfloat16)
    a = mxfp4_gemv(x, packed, scales)
    b = mxfp4_gemv(x, packed.view(24, 3, 16), scales)
    assert torch.equal(a, b), f"seed={seed}"


def test_gemv_rejects_bad_shapes():
    g = generator(0, DEV)
    packed, scales = random_mxfp4((8, 64), g)
    with pytest.raises(ValueError, match="shape mismatch"):
        mxfp4_gemv(torch.zeros(1, 96, dtype=torch.bfloat16, device=DEV), packed, scales)


def test_linear_dispatcher_small_and_large_m():
    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((40, 64), g)
    b = torch.randn(40, generator=g, device=DEV)
    for m, bound in ((2, GEMV_NMSE), (9, MATMUL_NMSE)):  # threshold 4: M=2 kernel, M=9 matmul
        x = torch.randn(1, m, 64, generator=g, device=DEV).to(torch.bfloat16)
        out = mxfp4_linear(x, packed, scales, b, small_m_threshold=4)
        assert out.shape == (1, m, 40) and out.dtype == torch.bfloat16
        ref = reference.mxfp4_linear_ref(x[0], packed, scales, b)
        assert_close_nmse(out[0], ref, bound, seed, f"mxfp4_linear M={m}")


# --- gpt-oss-120b shapes on the GPU ---------------------------------------------------------------

GPT_OSS_SHAPES = {  # name: (N, K)
    "qkv": (5120, 2880),
    "o_proj": (2880, 4096),
    "lm_head": (201088, 2880),
    "expert_gate_up": (5760, 2880),
    "expert_down": (2880, 2880),
}


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("name", list(GPT_OSS_SHAPES))
def test_gemv_gpt_oss_shapes(name, m, impl):
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA (compiled Triton); the interpreter covers the small shapes")
    n, k = GPT_OSS_SHAPES[name]
    seed = fresh_seed()
    out, ref = _run_case(m, n, k, impl, bias=name != "lm_head", seed=seed)
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"{name} M={m} {impl}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64])
def test_linear_dispatcher_gpt_oss_qkv(m):
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA (compiled Triton)")
    seed = fresh_seed()
    g = generator(seed, "cuda")
    packed, scales = random_mxfp4((5120, 2880), g)
    x = torch.randn(m, 2880, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(5120, generator=g, device="cuda")
    out = mxfp4_linear(x, packed, scales, b)
    ref = reference.mxfp4_linear_ref(x, packed, scales, b)
    assert_close_nmse(out, ref, GEMV_NMSE if m <= 16 else MATMUL_NMSE, seed, f"mxfp4_linear M={m}")
