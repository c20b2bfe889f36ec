"""MXFP4 / MXFP8 formats against OCP MX v1.0: value tables, rounding, edge cases, and
bit-exact agreement with transformers' gpt-oss MXFP4 dequantization. CPU, always runs."""

from __future__ import annotations

import math

import pytest
import torch

from kernels import mxfp4, mxfp8
from kernels._mx import e8m0_to_f32
from kernels.testing import fresh_seed, generator

pytestmark = pytest.mark.level1_5

# Spec table: E2M1 code -> value.
SPEC_E2M1 = {
    0b0000: 0.0, 0b0001: 0.5, 0b0010: 1.0, 0b0011: 1.5, 0b0100: 2.0, 0b0101: 3.0, 0b0110: 4.0, 0b0111: 6.0,
    0b1000: -0.0, 0b1001: -0.5, 0b1010: -1.0, 0b1011: -1.5, 0b1100: -2.0, 0b1101: -3.0, 0b1110: -4.0, 0b1111: -6.0,
}  # fmt: skip


def _block(values: list[float]) -> torch.Tensor:
    """One 32-element block: the given values followed by zeros."""
    return torch.tensor(values + [0.0] * (32 - len(values)), dtype=torch.float32)


# --- E2M1 / E8M0 tables -------------------------------------------------------------------------


def test_e2m1_decode_table_matches_spec():
    codes = torch.arange(16, dtype=torch.uint8)
    got = mxfp4.e2m1_decode(codes)
    for c, v in SPEC_E2M1.items():
        assert got[c].item() == v and math.copysign(1, got[c].item()) == math.copysign(1, v), f"code {c:04b}"


def test_e8m0_decode_all_256():
    s = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = e8m0_to_f32(s).double()
    for i in range(255):
        assert got[i].item() == 2.0 ** (i - 127), f"E8M0 {i}"
    assert math.isnan(got[255].item()), "E8M0 255 must be NaN"


def test_every_e2m1_value_round_trips_exactly():
    # A block whose max is 6 (scale 2**0) holds every representable value unchanged.
    vals = [v for v in SPEC_E2M1.values()]
    x = _block(vals + [6.0])
    packed, scales = mxfp4.quantize_mxfp4(x)
    assert scales.item() == 127
    assert torch.equal(mxfp4.unpack_nibbles(packed)[:16], torch.arange(16, dtype=torch.uint8))
    assert torch.equal(mxfp4.dequantize_mxfp4(packed, scales), x)


def test_shared_exponent_is_floor_log2_amax_minus_2():
    for amax, exp in [(6.0, 0), (4.0, 0), (7.9, 0), (8.0, 1), (1.0, -2), (0.75, -3), (1e-3, -12), (3e4, 12)]:
        _, s = mxfp4.quantize_mxfp4(_block([amax]))
        assert s.item() - 127 == math.floor(math.log2(amax)) - 2 == exp, amax


def test_round_to_nearest_even_at_every_midpoint():
    # Scale 2**0 (amax 6). Midpoints tie to the even code; just above/below go to the nearest.
    cases = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0,
             0.2501: 0.5, 0.7499: 0.5, 1.2501: 1.5, 1.7499: 1.5, 2.5001: 3.0, 3.4999: 3.0, 5.0001: 6.0}
    xs = list(cases)
    for sign in (1.0, -1.0):
        x = _block([sign * v for v in xs] + [6.0])
        d = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(x))
        for i, v in enumerate(xs):
            assert d[i].item() == sign * cases[v], f"{sign * v} -> {d[i].item()}"


def test_saturates_to_6_inside_the_top_binade():
    # amax 7.5: exp = floor(log2 7.5) - 2 = 0, 7.5 is above the largest element 6 -> saturates.
    x = _block([7.5, -7.9, 6.9])
    d = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(x))
    assert d[:3].tolist() == [6.0, -6.0, 6.0]


def test_rne_against_independent_float64_oracle():
    seed = fresh_seed()
    g = generator(seed)
    x = torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-20, 20, (64, 1), generator=g).float())
    packed, scales = mxfp4.quantize_mxfp4(x)
    got = mxfp4.dequantize_mxfp4(packed, scales).double()
    # Oracle: for each element, the nearest of the 16 grid points * 2**exp, ties to the even code.
    xb = x.double().reshape(64, 8, 32)
    exp = torch.floor(torch.log2(xb.abs().amax(-1))) - 2
    grid = torch.tensor([SPEC_E2M1[c] for c in range(8)], dtype=torch.float64)
    v = (xb.abs() / torch.exp2(exp).unsqueeze(-1)).unsqueeze(-1)
    dist = (v - grid).abs()
    best = dist.min(-1, keepdim=True).values
    is_best = dist == best
    # Among tied candidates prefer the even code.
    even_pref = torch.where(is_best, torch.tensor([0, 1, 0, 1, 0, 1, 0, 1]) * 1.0, torch.tensor(9.0))
    idx = even_pref.argmin(-1)
    oracle = (grid[idx] * torch.sign(xb) * torch.exp2(exp).unsqueeze(-1)).reshape(64, 256)
    assert torch.equal(scales.long() - 127, exp.long()), f"seed={seed}"
    assert torch.equal(got, oracle), f"seed={seed}: {(got != oracle).sum()} elements differ"


# --- edge cases ---------------------------------------------------------------------------------


def test_all_zero_block_gives_min_scale_and_exact_zeros():
    packed, scales = mxfp4.quantize_mxfp4(torch.zeros(3, 64))
    assert (scales == 0).all() and (packed == 0).all()
    assert torch.equal(mxfp4.dequantize_mxfp4(packed, scales), torch.zeros(3, 64))


def test_negative_zero_keeps_its_sign():
    x = _block([-0.0, -1e-9, 6.0])
    d = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(x))
    assert d[0].item() == 0.0 and math.copysign(1, d[0].item()) == -1.0
    assert math.copysign(1, d[1].item()) == -1.0


@pytest.mark.parametrize("v", [1.0, 3.0, -5.0, 0.1, 1e-20, 2.0**-140])
def test_all_equal_block(v):
    x = torch.full((32,), v, dtype=torch.float32)
    packed, scales = mxfp4.quantize_mxfp4(x)
    codes = mxfp4.unpack_nibbles(packed)
    assert (codes == codes[0]).all(), "all-equal input must give one code"
    d = mxfp4.dequantize_mxfp4(packed, scales)
    # |v| / 2**(floor(log2|v|) - 2) lies in [4, 8): rounds to 4 or 6 (or saturates), so the error is
    # at most 2**floor(log2|v|) * 2 / 4, i.e. <= 25% of |v| (the E2M1 gap at the top binade).
    if abs(v) >= 2.0**-125:
        assert abs(d[0].item() - v) <= 0.25 * abs(v) + 1e-45
    else:  # below the range the minimum scale (2**-127) can express: 2**-140 rounds to 0
        assert d[0].item() == 0.0 and scales.item() == 0


def test_max_scale():
    big = torch.finfo(torch.float32).max  # floor(log2) = 127 -> exp 125, byte 252
    x = _block([big, -big / 2])
    packed, scales = mxfp4.quantize_mxfp4(x)
    assert scales.item() == 252
    d = mxfp4.dequantize_mxfp4(packed, scales)
    assert d[0].item() == 6.0 * 2.0**125 and d[1].item() == -4.0 * 2.0**125 * 1.0  # 1.7e38 -> 4 * 2**125
    # The largest finite E8M0 (254 = 2**127) decodes exactly; 6 * 2**127 overflows float32 to inf.
    p = torch.tensor([[0x21] + [0] * 15], dtype=torch.uint8)  # codes 1 (0.5) and 2 (1.0)
    d = mxfp4.dequantize_mxfp4(p, torch.tensor([[254]], dtype=torch.uint8))
    assert d[0, 0].item() == 2.0**126 and d[0, 1].item() == 2.0**127
    d = mxfp4.dequantize_mxfp4(torch.tensor([[0x07] + [0] * 15], dtype=torch.uint8), torch.tensor([[254]], dtype=torch.uint8))
    assert d[0, 0].item() == float("inf")


def test_min_scale():
    # E8M0 0 = 2**-127 (a float32 subnormal); code 1 (0.5) gives 2**-128 exactly.
    p = torch.tensor([[0x71] + [0] * 15], dtype=torch.uint8)
    d = mxfp4.dequantize_mxfp4(p, torch.zeros(1, 1, dtype=torch.uint8)).double()
    assert d[0, 0].item() == 2.0**-128 and d[0, 1].item() == 6 * 2.0**-127
    # Tiny inputs clamp to the minimum exponent instead of wrapping around.
    x = _block([2.0**-127 * 6, 2.0**-128])
    packed, scales = mxfp4.quantize_mxfp4(x)
    assert scales.item() == 0
    assert mxfp4.dequantize_mxfp4(packed, scales)[:2].double().tolist() == [6 * 2.0**-127, 2.0**-128]


def test_nan_scale_dequantizes_to_nan_block():
    p = torch.zeros(2, 16, dtype=torch.uint8)
    s = torch.tensor([[255], [127]], dtype=torch.uint8)
    d = mxfp4.dequantize_mxfp4(p, s)
    assert d[0].isnan().all() and (d[1] == 0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_marks_only_its_block_nan(bad):
    x = torch.randn(2, 96)
    x[1, 40] = bad  # second block of row 1
    packed, scales = mxfp4.quantize_mxfp4(x)
    assert scales[1, 1].item() == 255
    assert (scales[0] != 255).all() and scales[1, 0] != 255 and scales[1, 2] != 255
    d = mxfp4.dequantize_mxfp4(packed, scales)
    assert d[1, 32:64].isnan().all()
    assert torch.isfinite(d[0]).all() and torch.isfinite(d[1, :32]).all() and torch.isfinite(d[1, 64:]).all()


@pytest.mark.parametrize("k", [1, 16, 31, 33, 48, 100])
def test_k_not_multiple_of_32_is_rejected(k):
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4.quantize_mxfp4(torch.randn(2, k))
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp8.quantize_mxfp8(torch.randn(2, k))


def test_dequantize_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape mismatch"):
        mxfp4.dequantize_mxfp4(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8))


def test_requantizing_dequantized_values_is_identity():
    seed = fresh_seed()
    g = generator(seed)
    packed = torch.randint(0, 256, (16, 128), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(1, 255, (16, 8), generator=g, dtype=torch.int32).to(torch.uint8)
    # Idempotent only if the block max lies in the top binade (|code value| 4 or 6): force element 0 to 6.
    packed.view(16, 8, 16)[..., 0] = (packed.view(16, 8, 16)[..., 0] & 0xF0) | 0x07
    scales = scales.clamp(max=252)  # 6 * 2**(s-127) must not overflow float32
    d = mxfp4.dequantize_mxfp4(packed, scales)
    p2, s2 = mxfp4.quantize_mxfp4(d)
    assert torch.equal(s2, scales), f"seed={seed}"
    assert torch.equal(p2, packed), f"seed={seed}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_input_dtypes_and_leading_dims(dtype):
    x = torch.randn(2, 3, 64).to(dtype)
    packed, scales = mxfp4.quantize_mxfp4(x)
    assert packed.shape == (2, 3, 32) and scales.shape == (2, 3, 2)
    assert packed.dtype == scales.dtype == torch.uint8
    assert mxfp4.dequantize_mxfp4(packed, scales, torch.bfloat16).dtype == torch.bfloat16


# --- gpt-oss checkpoint layout vs transformers ---------------------------------------------------


def _transformers_convert():
    mod = pytest.importorskip("transformers.integrations.mxfp4", reason="transformers' mxfp4 integration not installed")
    fn = getattr(mod, "convert_moe_packed_tensors", None) or getattr(mod, "_convert_moe_packed_tensors", None)
    if fn is None:
        pytest.skip("transformers.integrations.mxfp4 has no convert_moe_packed_tensors in this version")
    return fn


def test_gpt_oss_layout_shapes_and_round_trip():
    w = torch.randn(3, 10, 96) * 0.02
    blocks, scales = mxfp4.quantize_gpt_oss_experts(w)
    assert blocks.shape == (3, 10, 3, 16) and scales.shape == (3, 10, 3)
    packed, s2 = mxfp4.quantize_mxfp4(w)
    assert torch.equal(blocks.reshape(3, 10, 48), packed) and torch.equal(s2, scales)
    assert torch.equal(mxfp4.dequantize_gpt_oss_experts(blocks, scales), mxfp4.dequantize_mxfp4(packed, scales))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantize_matches_transformers_exactly(dtype):
    convert = _transformers_convert()
    seed = fresh_seed()
    g = generator(seed)
    e, n, k = 4, 24, 128
    blocks = torch.randint(0, 256, (e, n, k // 32, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    # Every finite E8M0 value (0..254) appears; 255 (NaN) is excluded because transformers turns it
    # into 2**128 (inf / NaN garbage) while we return a NaN block by spec.
    scales = torch.randint(0, 255, (e, n, k // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    scales.view(-1)[:255] = torch.arange(255, dtype=torch.int32).to(torch.uint8)
    theirs = convert(blocks.clone(), scales.clone(), dtype=dtype)
    ours = mxfp4.dequantize_gpt_oss_experts(blocks, scales, dtype)
    assert theirs.shape == (e, k, n), "transformers returns [E, K, N] (transposed for x @ W)"
    ours_t = ours.transpose(1, 2)
    same = (ours_t == theirs) | (ours_t.isnan() & theirs.isnan())
    assert same.all(), f"seed={seed}: {(~same).sum()} of {same.numel()} differ"
    # Same signs of zero too (bit-exact): compare raw bits where both are finite.
    fin = torch.isfinite(theirs)
    assert torch.equal(torch.signbit(ours_t[fin]), torch.signbit(theirs[fin])), f"seed={seed}"


def test_gate_up_interleaving_matches_transformers_experts():
    """Row 2j of gate_up_proj_blocks is gate_j, row 2j+1 is up_j, as GptOssExperts._apply_gate reads them."""
    convert = _transformers_convert()
    g = generator(fresh_seed())
    e, inter, h = 2, 8, 64
    gate = torch.randn(e, inter, h, generator=g) * 0.05
    up = torch.randn(e, inter, h, generator=g) * 0.05
    gate_up = torch.stack((gate, up), dim=2).reshape(e, 2 * inter, h)  # interleave rows
    blocks, scales = mxfp4.quantize_gpt_oss_experts(gate_up)
    w_hf = convert(blocks, scales, dtype=torch.float32)  # [E, H, 2I], used as x @ W
    x = torch.randn(5, h, generator=g)
    y = x @ w_hf[0]
    gq = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(gate[0]))
    uq = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(up[0]))
    torch.testing.assert_close(y[:, ::2], x @ gq.T, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y[:, 1::2], x @ uq.T, rtol=1e-5, atol=1e-6)


# --- MXFP8 ----------------------------------------------------------------------------------------


def _e4m3_grid() -> torch.Tensor:
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    return vals


def test_mxfp8_exponent_and_table():
    for amax, exp in [(448.0, 0), (256.0, 0), (511.0, 0), (512.0, 1), (1.0, -8)]:
        _, s = mxfp8.quantize_mxfp8(_block([amax]))
        assert s.item() - 127 == exp, amax
    # Every finite positive E4M3 value survives a round trip at scale 2**0.
    grid = _e4m3_grid()
    pos = grid[torch.isfinite(grid) & (grid > 0)].unique()
    assert pos.max().item() == 448.0 and len(pos) == 126
    for chunk in pos.split(31):
        x = _block(chunk.float().tolist() + [448.0])
        e, s = mxfp8.quantize_mxfp8(x)
        assert s.item() == 127
        assert torch.equal(mxfp8.dequantize_mxfp8(e, s), x)


def test_mxfp8_rne_and_saturation_against_oracle():
    seed = fresh_seed()
    g = generator(seed)
    x = torch.randn(32, 128, generator=g) * torch.exp2(torch.randint(-30, 30, (32, 1), generator=g).float())
    x[0, :32] = 500.0 * torch.linspace(-1, 1, 32)  # amax 500 -> exp 0, 448 < |x| < 512 saturate
    elems, scales = mxfp8.quantize_mxfp8(x)
    got = mxfp8.dequantize_mxfp8(elems, scales).double()
    xb = x.double().reshape(32, 4, 32)
    exp = (torch.floor(torch.log2(xb.abs().amax(-1))) - 8).clamp(-127, 127)
    v = (xb / torch.exp2(exp).unsqueeze(-1)).clamp(-448, 448)
    grid = _e4m3_grid()
    fin = torch.isfinite(grid)
    gvals = grid[fin]
    codes = torch.arange(256)[fin]
    dist = (v.unsqueeze(-1) - gvals).abs()
    best = dist.min(-1, keepdim=True).values
    pref = torch.where(dist == best, (codes & 1).double(), torch.tensor(9.0))  # ties -> even mantissa
    oracle = (gvals[pref.argmin(-1)] * torch.exp2(exp).unsqueeze(-1)).reshape(32, 128)
    assert torch.equal(scales.long() - 127, exp.long()), f"seed={seed}"
    assert torch.equal(got.abs(), oracle.abs()), f"seed={seed}: {(got.abs() != oracle.abs()).sum()} differ"
    assert got[0, 0].item() == -448.0 and got[0, 31].item() == 448.0


def test_mxfp8_edge_cases():
    e, s = mxfp8.quantize_mxfp8(torch.zeros(2, 32))
    assert (s == 0).all() and (e.float() == 0).all()
    x = torch.randn(1, 64)
    x[0, 5] = float("nan")
    e, s = mxfp8.quantize_mxfp8(x)
    assert s[0, 0].item() == 255 and s[0, 1].item() != 255
    d = mxfp8.dequantize_mxfp8(e, s)
    assert d[0, :32].isnan().all() and torch.isfinite(d[0, 32:]).all()
    assert e.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8
    # uint8 bit patterns are accepted too
    assert torch.allclose(mxfp8.dequantize_mxfp8(e.view(torch.uint8), s), d, rtol=0, atol=0, equal_nan=True)


# --- repacked layout (kernels/packed.py) -----------------------------------------------------------


@pytest.mark.parametrize("shape,paired", [((16, 64), False), ((40, 96), False), ((3, 48, 32), True), ((2, 130, 320), False)])
def test_pack_mxfp4_round_trips_through_the_kernel_decode(shape, paired):
    """unpack_mxfp4 decodes with the kernels' 8-instruction sequence (packed.decode_words): every code
    and scale comes back, in the original row order (gate/up pairing undone), for ragged N and K."""
    from kernels.packed import pack_mxfp4, unpack_mxfp4
    from kernels.testing import random_mxfp4

    seed = fresh_seed()
    p, s = random_mxfp4(shape, generator(seed))
    q = pack_mxfp4(p, s, paired=paired)
    p2, s2 = unpack_mxfp4(q)
    assert torch.equal(p2, p) and torch.equal(s2, s), f"seed={seed}"


def test_pack_zeroes_the_codes_of_nan_scale_blocks():
    """A NaN scale (255) block keeps its scale and gets zero codes: the kernels' 0 * inf = NaN."""
    from kernels.packed import pack_mxfp4, unpack_mxfp4
    from kernels.testing import random_mxfp4

    seed = fresh_seed()
    p, s = random_mxfp4((16, 64), generator(seed))
    s[3, 1] = 255
    p2, s2 = unpack_mxfp4(pack_mxfp4(p, s))
    assert torch.equal(s2, s), f"seed={seed}"
    assert (p2[3, 16:32] == 0).all() and torch.equal(p2[3, :16], p[3, :16]), f"seed={seed}"


def test_decode_yields_fp16_value_times_2_pow_minus_14():
    """Each decoded f16 lane equals E2M1 value * 2**-14 (code 1 = 0.5 -> the subnormal 2**-15)."""
    from kernels.packed import F16_MASK, _codes_to_f16_bits

    codes = torch.arange(16)
    f16 = _codes_to_f16_bits(codes).to(torch.int16).view(torch.float16).float()
    assert torch.equal(f16 * 2**14, mxfp4.e2m1_decode(codes))
    assert int(_codes_to_f16_bits(torch.tensor(15))) & ~F16_MASK & 0xFFFF == 0
