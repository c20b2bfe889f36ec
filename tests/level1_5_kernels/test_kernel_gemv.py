"""Triton low-M MXFP4 GEMV (W4A16) and the `mxfp4_linear` dispatcher against the fp32 reference.

Small awkward shapes run everywhere: on CPU through Triton's interpreter (TRITON_INTERPRET=1, set by
kernels._triton when no GPU is visible), on a GPU compiled. gpt-oss-120b shapes are `gpu`-marked.
The repacked weights (kernels/packed.py) have two paths: `packed_fma` (Triton, every device, the one
the interpreter runs) and `cuda` (tensor cores, csrc/mxfp4_mma.cu, GPU only: its tests are `gpu`).

Tolerance (GEMV_NMSE = 2e-5, kernels/cases.py): the kernel reads exact BF16 activations and exact MXFP4 weights,
accumulates in fp32 and rounds once to BF16. Rounding to BF16 (8 significant bits) changes each
element by at most 2**-8 of its magnitude, so that rounding alone gives NMSE <= 2**-16 = 1.53e-5
(typically ~3e-6); fp32 accumulation-order differences add ~1e-13. 2e-5 = that hard bound plus a
small margin: any extra rounding step (e.g. BF16 accumulation, a truncating cast, a wrong scale)
shows up far above it.
"""

from __future__ import annotations

import pytest
import torch

from kernels import reference
from kernels._triton import INTERPRET
from kernels.cases import GEMV_NMSE, HIDDEN, LINEAR_SHAPES, MATMUL_NMSE
from kernels.gemv import mxfp4_gemv, mxfp4_linear
from kernels.packed_mm import mxfp4_mm_packed
from kernels.testing import (
    DEV,
    assert_close_nmse,
    fresh_seed,
    generator,
    poisoned,
    random_mxfp4,
)
from kernels.tuning import get_config

pytestmark = pytest.mark.level1_5

# MATMUL_NMSE (kernels/cases.py), for dequantize + torch.matmul (large M): cuBLAS may reduce BF16 partial sums
# in reduced precision (torch's allow_bf16_reduced_precision_reduction defaults to True), i.e. a few extra BF16
# roundings of partial sums over K: ~6x the single-rounding bound.

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


# --- repacked weights ---------------------------------------------------------------------------
# Tolerance: GEMV_NMSE as above. Both packed paths multiply exact operands: the activation is
# scaled per token by a power of two into fp16 (exact: bf16 has 8 significand bits, fp16 11, and
# |x| * 2**(14-L) < 2**15), decoded weights are exact fp16 (value * 2**-14), so every product is
# exact. `cuda` accumulates in fp32 (tensor cores), i.e. the same error budget as the fp32 paths.
# `packed_fma` sums 4 products per fp16 lane before going to fp32: 3 fp16 roundings of partial sums
# per lane and block, relative 2**-11 each on random-sign terms, expected NMSE ~1e-7 (measured
# total 2-3e-6 on these shapes, dominated by the final BF16 rounding), far inside 2e-5.

PACKED_SHAPES = [(1, 16, 32), (3, 50, 96), (2, 33, 128), (1, 40, 320), (5, 9, 64)]


def _packed_cfg(impl: str) -> dict:
    cfg = get_config("gemv")
    return {**cfg, **cfg.get("packed", {}), "impl": impl}


def _run_packed(m, n, k, impl, bias, seed, scale_range=(118, 124), bias_dtype=torch.float32, extra=None):
    from kernels.gemv import mxfp4_gemv_packed
    from kernels.packed import pack_mxfp4

    g = generator(seed, DEV)
    packed, scales = random_mxfp4((n, k), g, *scale_range)
    x = torch.randn(m, k, generator=g, device=DEV).to(torch.bfloat16)
    b = torch.randn(n, generator=g, device=DEV).to(bias_dtype) if bias else None
    out = poisoned((m, n), torch.bfloat16, DEV)
    mxfp4_gemv_packed(x, pack_mxfp4(packed, scales), b, out=out, config={**_packed_cfg(impl), **(extra or {})})
    return out, reference.mxfp4_linear_ref(x, packed, scales, b)


@pytest.mark.parametrize("m,n,k", PACKED_SHAPES)
def test_packed_fma_small_shapes(m, n, k):
    seed = fresh_seed()
    out, ref = _run_packed(m, n, k, "packed_fma", bias=(n % 2 == 0), seed=seed)
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"packed_fma M={m} N={n} K={k}")


def test_packed_fma_wide_scales_and_activation_range():
    """Scales 2**-27 .. 2**13 and activations spanning 2**-20 .. 2**12 in one row (per-token scaling)."""
    from kernels.gemv import mxfp4_gemv_packed
    from kernels.packed import pack_mxfp4

    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((24, 256), g, 100, 141)
    x = (torch.randn(2, 256, generator=g, device=DEV) * 2.0 ** torch.randint(-20, 12, (2, 256), generator=g,
                                                                             device=DEV)).to(torch.bfloat16)
    out = mxfp4_gemv_packed(x, pack_mxfp4(packed, scales), config=_packed_cfg("packed_fma"))
    assert_close_nmse(out, reference.mxfp4_linear_ref(x, packed, scales), GEMV_NMSE, seed, "packed_fma wide ranges")


@pytest.mark.parametrize("impl", ["packed_fma", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_packed_nan_scale_poisons_exactly_its_row(impl):
    from kernels.gemv import mxfp4_gemv_packed
    from kernels.packed import pack_mxfp4

    if impl == "cuda" and (INTERPRET or not torch.cuda.is_available()):
        pytest.skip("needs CUDA")
    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((20, 64), g)
    scales[7, 1] = 255
    x = torch.randn(3, 64, generator=g, device=DEV).to(torch.bfloat16)
    out = mxfp4_gemv_packed(x, pack_mxfp4(packed, scales), config=_packed_cfg(impl))
    assert out[:, 7].isnan().all(), f"seed={seed}"
    assert torch.isfinite(torch.cat((out[:, :7], out[:, 8:]), dim=1)).all(), f"seed={seed}"


def test_linear_dispatcher_takes_packed_weights():
    from kernels.packed import pack_mxfp4

    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((40, 64), g)
    b = torch.randn(40, generator=g, device=DEV)
    q = pack_mxfp4(packed, scales)
    for m, bound in ((2, GEMV_NMSE), (9, MATMUL_NMSE)):
        x = torch.randn(1, m, 64, generator=g, device=DEV).to(torch.bfloat16)
        out = mxfp4_linear(x, q, None, b, small_m_threshold=4)
        assert out.shape == (1, m, 40) and out.dtype == torch.bfloat16
        assert_close_nmse(out[0], reference.mxfp4_linear_ref(x[0], packed, scales, b), bound, seed, f"packed M={m}")


def test_a_held_packed_linear_serves_every_m_and_reuses_its_plans():
    """PackedLinear (a served layer: config and launch plans made once) against the fp32 reference, each M twice so a
    second call runs the plan the first one made; stacked experts are refused, not served as expert 0."""
    from kernels.gemv import PackedLinear
    from kernels.packed import pack_mxfp4

    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((40, 64), g)
    b = torch.randn(40, generator=g, device=DEV)
    lin = PackedLinear(pack_mxfp4(packed, scales), 4)
    for m, bound in ((1, GEMV_NMSE), (3, GEMV_NMSE), (9, MATMUL_NMSE), (1, GEMV_NMSE), (3, GEMV_NMSE)):
        x = torch.randn(1, m, 64, generator=g, device=DEV).to(torch.bfloat16)
        out = lin(x, b)
        assert out.shape == (1, m, 40) and out.dtype == torch.bfloat16
        assert_close_nmse(out[0], reference.mxfp4_linear_ref(x[0], packed, scales, b), bound, seed, f"held M={m}")
    stacked, stacked_scales = random_mxfp4((2, 40, 64), g)
    with pytest.raises(ValueError, match="one dense matrix"):
        PackedLinear(pack_mxfp4(stacked, stacked_scales))


def test_a_decode_batch_above_the_threshold_runs_as_decode_kernel_calls_where_configured(monkeypatch):
    """gemv.packed.decode_chunks_max_m: a batch above the decode threshold (a tg32@c32 step's M = 32 on a GPU) runs as
    calls of the decode kernels on threshold rows each, written in place into one output: bit for bit what those
    calls give alone, within the decode kernels' tolerance of the fp32 reference. Past the limit, or for a weight
    larger than decode_chunks_max_mib, the packed GEMM serves as before; unset (the served tuning), nothing changes."""
    from kernels.gemv import PackedLinear
    from kernels.packed import pack_mxfp4

    seed = fresh_seed()
    g = generator(seed, DEV)
    packed, scales = random_mxfp4((40, 64), g)
    p = pack_mxfp4(packed, scales)
    b = torch.randn(40, generator=g, device=DEV)
    for var in ("KERNELS_GEMV_PACKED__DECODE_CHUNKS_MAX_M", "KERNELS_GEMV_PACKED__DECODE_CHUNKS_MAX_MIB"):
        monkeypatch.delenv(var, raising=False)
    assert PackedLinear(p, 4).path(9) == "packed_mm", "the served tuning must leave decode chunks off (unmeasured)"
    monkeypatch.setenv("KERNELS_GEMV_PACKED__DECODE_CHUNKS_MAX_M", "12")
    lin = PackedLinear(p, 4)
    decode, seen = lin._decode, []
    monkeypatch.setattr(lin, "_decode", lambda x2, bias, out=None: seen.append((x2.shape[0], out)) or decode(x2, bias, out))
    for m, calls in ((5, 2), (9, 3), (12, 3)):
        x = torch.randn(m, 64, generator=g, device=DEV).to(torch.bfloat16)
        assert lin.path(m) == f"decode kernels, {calls} calls of <= 4 tokens"
        seen.clear()
        out = lin(x, b)
        # threshold rows per call, each written in place into its rows of the one output (no copy after)
        assert [rows for rows, _ in seen] == [min(4, m - i) for i in range(0, m, 4)], seen
        assert [o.data_ptr() for _, o in seen] == [out[i].data_ptr() for i in range(0, m, 4)]
        alone = torch.cat([lin(x[i:i + 4], b) for i in range(0, m, 4)])
        assert torch.equal(out, alone), f"seed={seed} M={m}: the chunked batch differs from its chunks run alone"
        assert_close_nmse(out, reference.mxfp4_linear_ref(x, packed, scales, b), GEMV_NMSE, seed, f"chunked M={m}")
    x = torch.randn(13, 64, generator=g, device=DEV).to(torch.bfloat16)
    assert lin.path(13) == "packed_mm"
    assert torch.equal(lin(x, b), mxfp4_mm_packed(x, p, b)), "past decode_chunks_max_m the packed GEMM serves"
    monkeypatch.setenv("KERNELS_GEMV_PACKED__DECODE_CHUNKS_MAX_MIB", "0.001")  # this weight: 1,632 packed bytes
    assert PackedLinear(p, 4).path(9) == "packed_mm", "a weight above decode_chunks_max_mib must not be chunked"


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


@pytest.mark.parametrize("length", [39, 41])
def test_every_dense_entry_point_refuses_a_bias_that_is_not_n_long(length):
    """A bias of another length than N: the kernels read bias[n] for n < N, past the end of a shorter one (and
    ignored a longer one's tail). The CUDA launcher is called directly too (PackedLinear's CUDA branch calls it):
    it checks before it builds or launches anything, so this runs on CPU."""
    from kernels import cuda_ext
    from kernels.gemv import PackedLinear, mxfp4_gemv_packed
    from kernels.packed import pack_mxfp4

    packed, scales = random_mxfp4((40, 64), generator(0, DEV))
    p = pack_mxfp4(packed, scales)
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=DEV)
    bias = torch.zeros(length, device=DEV)
    out = torch.empty(2, 40, dtype=torch.bfloat16, device=DEV)
    for name, run in [("mxfp4_gemv", lambda: mxfp4_gemv(x, packed, scales, bias)),
                      ("mxfp4_gemv_packed", lambda: mxfp4_gemv_packed(x, p, bias)),
                      ("PackedLinear", lambda: PackedLinear(p, 16)(x, bias)),
                      ("PackedLinear above its threshold", lambda: PackedLinear(p, 1)(x, bias)),
                      ("cuda_ext.gemv", lambda: cuda_ext.gemv(x, p, bias, out, {}))]:
        with pytest.raises(ValueError, match=rf"bias must be \[40\], got \[{length}\]"):
            run()
            pytest.fail(f"{name} took a bias of {length} for N = 40")


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

@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("name", list(LINEAR_SHAPES))
def test_gemv_gpt_oss_shapes(name, m, impl):
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA (compiled Triton); the interpreter covers the small shapes")
    n, k = LINEAR_SHAPES[name]
    seed = fresh_seed()
    out, ref = _run_case(m, n, k, impl, bias=name != "lm_head", seed=seed)
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"{name} M={m} {impl}")


# Where the CUDA path prepares the activation: "cta" = every persistent CTA converts x itself,
# "kernel" = one small kernel per call writes the fragments the GEMV copies (tuning key gemv.packed.xprep).
XPREP = ["cta", "kernel"]


@pytest.mark.gpu
@pytest.mark.parametrize("xprep", XPREP)
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 16])
@pytest.mark.parametrize("name", list(LINEAR_SHAPES))
def test_packed_cuda_gpt_oss_shapes(name, m, xprep):
    """The tensor-core path at every decode M class (NT=1: M<=8, NT=2: 9..16) and both K-split modes
    (lm_head: one warp per K; the others: 8 warps split K), bias in bf16 as a model stores it."""
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from kernels import cuda_ext

    ok, why = cuda_ext.available()
    assert ok, f"CUDA extension unavailable on a GPU machine: {why}"
    n, k = LINEAR_SHAPES[name]
    seed = fresh_seed()
    out, ref = _run_packed(m, n, k, "cuda", bias=name != "lm_head", seed=seed, bias_dtype=torch.bfloat16,
                           extra={"xprep": xprep})
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"cuda {name} M={m} xprep={xprep}")


@pytest.mark.gpu
@pytest.mark.parametrize("xprep", XPREP)
@pytest.mark.parametrize("m", [1, 5, 8, 16])
def test_packed_cuda_rows_of_very_different_magnitude(m, xprep):
    """Each token row gets its own power-of-two activation scale from its own max |x|. Neighbouring rows
    here differ by 2**60 or 2**120, and K = HIDDEN (360 16-byte pieces per row) makes warps straddle two
    rows in the max pass: a row scaled by a neighbour's max flushes to zero in fp16 (NMSE 1). With
    rows 2**30 apart that mutation (the warp's first row takes the whole warp's max) only blurred the
    small row to an NMSE of ~2e-5, at the bound: it passed some seeds (H200 run)."""
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from kernels.gemv import mxfp4_gemv_packed
    from kernels.packed import pack_mxfp4

    seed = fresh_seed()
    g = generator(seed, "cuda")
    n, k = 520, HIDDEN
    packed, scales = random_mxfp4((n, k), g)
    row_scale = 2.0 ** ((torch.arange(m, device="cuda") % 3 - 1) * 60).float()  # 2**-60, 1, 2**60, ...
    x = (torch.randn(m, k, generator=g, device="cuda") * row_scale[:, None]).to(torch.bfloat16)
    out = poisoned((m, n), torch.bfloat16, "cuda")
    mxfp4_gemv_packed(x, pack_mxfp4(packed, scales), out=out, config={**_packed_cfg("cuda"), "xprep": xprep})
    ref = reference.mxfp4_linear_ref(x, packed, scales)
    for r in range(m):  # per row: the NMSE of all rows together would hide a small row's error
        assert_close_nmse(out[r:r + 1], ref[r:r + 1], GEMV_NMSE, seed, f"row {r} (x scale {row_scale[r].item():g}) M={m} xprep={xprep}")


@pytest.mark.gpu
@pytest.mark.parametrize("xprep", XPREP)
@pytest.mark.parametrize("variant", range(16))
def test_packed_cuda_every_variant(variant, xprep):
    """Every compiled (NT, RW, RT, PF) variant on an awkward shape: ragged N, K not a multiple of 64
    (padded chunk), K split counts that leave some warps a chunk short, M at the NT edge."""
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from kernels.gemv import mxfp4_gemv_packed
    from kernels.packed import pack_mxfp4

    seed = fresh_seed()
    g = generator(seed, "cuda")
    m = 8 if variant < 8 else 16
    n, k = 1000, 2912
    packed, scales = random_mxfp4((n, k), g)
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, generator=g, device="cuda")
    out = poisoned((m, n), torch.bfloat16, "cuda")
    mxfp4_gemv_packed(x, pack_mxfp4(packed, scales), b, out=out,
                      config={**_packed_cfg("cuda"), "variant": variant % 8, "xprep": xprep})
    assert_close_nmse(out, reference.mxfp4_linear_ref(x, packed, scales, b), GEMV_NMSE, seed,
                      f"variant {variant} xprep={xprep}")


@pytest.mark.gpu
@pytest.mark.parametrize("xprep", XPREP)
@pytest.mark.parametrize("m", [1, 5])
def test_packed_cuda_unaligned_activation(m, xprep):
    """An activation that starts 2 bytes past a 16-byte boundary (a contiguous view into a larger
    buffer) takes the element-wise activation preparation, not the 16-byte loads: same result."""
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from kernels.gemv import mxfp4_gemv_packed
    from kernels.packed import pack_mxfp4

    seed = fresh_seed()
    g = generator(seed, "cuda")
    n, k = 640, HIDDEN
    packed, scales = random_mxfp4((n, k), g)
    flat = torch.randn(m * k + 1, generator=g, device="cuda").to(torch.bfloat16)
    x = flat[1:].view(m, k)
    assert x.is_contiguous() and x.data_ptr() % 16 == 2
    b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16)
    out = poisoned((m, n), torch.bfloat16, "cuda")
    mxfp4_gemv_packed(x, pack_mxfp4(packed, scales), b, out=out, config={**_packed_cfg("cuda"), "xprep": xprep})
    assert_close_nmse(out, reference.mxfp4_linear_ref(x, packed, scales, b), GEMV_NMSE, seed,
                      f"unaligned x M={m} xprep={xprep}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64])
def test_linear_dispatcher_gpt_oss_qkv(m):
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA (compiled Triton)")
    seed = fresh_seed()
    g = generator(seed, "cuda")
    n, k = LINEAR_SHAPES["qkv"]
    packed, scales = random_mxfp4((n, k), g)
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, generator=g, device="cuda")
    out = mxfp4_linear(x, packed, scales, b)
    ref = reference.mxfp4_linear_ref(x, packed, scales, b)
    assert_close_nmse(out, ref, GEMV_NMSE if m <= 16 else MATMUL_NMSE, seed, f"mxfp4_linear M={m}")


@pytest.mark.parametrize("sms", [132, 48])  # H200, GB10
@pytest.mark.parametrize("name", list(LINEAR_SHAPES))
def test_cuda_variant_choice_keeps_small_layers_to_one_wave(name, sms):
    """CPU: the tiling the tensor-core GEMV picks. Small layers (the CTA's warps split K) take the
    fewest row tiles per CTA that fit all tiles in one wave of the persistent grid: with one tile per
    CTA the qkv shape ran two waves on an H200 (320 tiles, 264 CTAs: 8.5 us; two per CTA: 8.0 us).
    lm_head keeps whole-K warps over many tiles."""
    from kernels.cuda_ext import VARIANTS, WARPS, pick_variant
    from kernels.packed import CHUNK_K

    n, k = LINEAR_SHAPES[name]
    cfg = {**_packed_cfg("cuda"), "ctas_per_sm": 2, "big_tiles_per_sm": 16}
    n_tiles, kc = -(-n // 16), -(-k // CHUNK_K)
    nt, rw, rt, pf = VARIANTS[pick_variant(1, n_tiles, kc, cfg, sms)]
    assert nt == 1
    if n_tiles >= 16 * sms:
        assert (rw, rt) == (WARPS, 2), f"{name}: lm_head-like layers keep K in one warp"
    else:
        items = -(-n_tiles // (rw * rt))
        assert items <= 2 * sms, f"{name} on {sms} SMs: {items} items for {2 * sms} CTAs (more than one wave)"
        smaller = [v for v in VARIANTS if v[0] == 1 and v[2] == 1 and v[1] < rw]
        assert all(-(-n_tiles // v[1]) > 2 * sms for v in smaller), f"{name}: a smaller RW also fits in one wave"
    assert VARIANTS[pick_variant(9, n_tiles, kc, cfg, sms)][0] == 2, "M > 8 needs the two-n-tile variant"


def test_cuda_variant_table_matches_the_kernel_source():
    """CPU: the host sizes items, K split and shared memory from cuda_ext.VARIANTS[v]; the .cu's NT1 / NT2
    macros must compile the same (NT, RW, RT, PF) tilings in the same order."""
    from kernels.cuda_ext import SRC, VARIANTS, source_variants

    assert source_variants(SRC.read_text()) == VARIANTS


def test_cuda_ext_refuses_a_source_with_another_variant_table(tmp_path):
    """CPU: an A/B source (bench --cuda-src-before) whose table differs would run tilings the host did not size
    for (measured: an older source timed 23.9 us where its own tiling runs 22.0); loading it fails and names the fix."""
    from kernels import cuda_ext

    older = tmp_path / "older.cu"
    older.write_text(cuda_ext.SRC.read_text().replace("launch<MODE, 1, 4, 1, 4>", "launch<MODE, 1, 8, 1, 6>"))
    with pytest.raises(RuntimeError, match=r"variant table .* NT1/NT2 macros"):
        cuda_ext._load(str(older))


def test_cuda_ext_refuses_a_source_with_another_prefill_table(tmp_path):
    """CPU: the same for the prefill table, including a source from before the activation form was a template
    argument (three numbers per entry): read as no table, it would run variant 0 as f16 on bf16 rows."""
    from kernels import cuda_ext

    src = cuda_ext.SRC.read_text()
    table = src[src.index("#define PF_TABLE(MODE, LIVE)"):].splitlines()[0]
    three = table.replace(", 1, LIVE>", ", LIVE>").replace(", 0, LIVE>", ", LIVE>")
    for other in (table.replace("pf_launch<MODE, 8, 2, 2, 1, LIVE>", "pf_launch<MODE, 8, 2, 1, 1, LIVE>"), three):
        older = tmp_path / "older_pf.cu"
        older.write_text(src.replace(table, other))
        assert cuda_ext.source_pf_variants(older.read_text()), "a table must be read, whatever its arity"
        with pytest.raises(RuntimeError, match=r"prefill table .* PF_TABLE macro"):
            cuda_ext._load(str(older))


def test_cuda_library_load_is_cached_per_source():
    """CPU: the kernels call cuda_ext._load on every launch, and a load runs `nvcc --version`, hashes the source
    and opens the library; it must be cached per source (a misplaced decorator once left it uncached)."""
    from kernels import cuda_ext

    assert callable(getattr(cuda_ext._load, "cache_info", None)), "cuda_ext._load is not cached"


def test_cuda_path_rejects_an_unknown_activation_prep_mode():
    """A typo in gemv.packed.xprep must not silently pick a path (CPU: the check runs before any launch)."""
    from kernels import cuda_ext

    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="xprep must be auto, kernel or cta"):
        cuda_ext.gemv(x, None, None, x, {"xprep": "kernal"})
