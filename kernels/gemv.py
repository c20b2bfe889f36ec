"""Low-M MXFP4 GEMM/GEMV (W4A16) in Triton, and the `mxfp4_linear` dispatcher.

Decode-time dense layers (M = 1..16 tokens) are bound by reading the weights, so the kernels read
them packed (0.53 bytes/element incl. scales, vs 2 for BF16) and dequantize in registers.

Two paths, chosen per call by M (tuning.yaml gemv.rows_max_m):
* rows / fma16 (M <= rows_max_m, decode): no tensor cores. Weights are read as 32-bit words
  (8 codes, 16-byte loads) with a one-tile register prefetch; each word is decoded two codes per
  instruction straight into f16x2 and multiplied with x in f16x2 by a short inline-PTX sequence
  (plain shifts / logic / fma.f16x2: sm_53+, identical on sm_90 and sm_12x); fp32 accumulation
  per 32-element group, times the E8M0 scale. Its cost grows with M (decode per token row).
* MMA (larger M): swap-AB, out^T [N, M] = W [N, K] @ x^T [K, M], weights on the MMA's M side,
  tokens padded to 16. `impl: dot_scaled` uses Triton's tl.dot_scaled (its own e2m1 upcast);
  `impl: dequant_dot` our bit-trick upcast to bf16 + two tl.dot (even / odd K elements).

Semantics: out[m, n] = bf16( sum_k x[m, k] * W[n, k] + bias[n] ), fp32 accumulation (the fma16
path multiplies in fp16 with per-word rescaling, 11-bit products), as reference.mxfp4_linear_ref
up to summation order and the final BF16 rounding. Under TRITON_INTERPRET the inline PTX is
replaced by an instruction-by-instruction emulation in Triton integer/float ops.
"""

from __future__ import annotations

import functools

import torch

from ._checks import check_bias
from ._triton import INTERPRET, StaticCountCase, _dot_bf16, _round_bf16, check_device, tl, triton
from .mxfp4 import as_packed, dequantize_mxfp4
from .packed import PackedMXFP4, pack_mxfp4, prepare_activation
from .cuda_ext import CUDA_MAX_M
from .packed_mm import large_m_path, mxfp4_mm_packed
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


# E2M1 x 8 (one 32-bit word) . x (8 fp16 in 4 f16x2 words) -> fp32, in 27 PTX instructions.
# Nibble t of the word is element 8j+t. We pair nibbles (t, t+4): they sit 16 bits apart, so one
# shift+mask moves both into the two fp16 halves at once. An E2M1 code's exponent+mantissa bits
# land on fp16 bits 9..11 and its sign on bit 15: that fp16 equals value * 2**-14 (code 1, 0.5,
# becomes the subnormal 2**-15 -- exact). x is pre-scaled per word by 2**e into [2**14, 2**15), so
# products are value * x * 2**(e-14) <= 12 and the 4-term fp16 sums <= 48 (fp16 keeps 11 bits);
# the caller multiplies by 2**(14-e). The two fp16 lanes are summed in fp32.
_E2M1X8_DOT_F16 = tl.constexpr("""
{
.reg .b32 t, u, p0, p1, p2, p3, a;
.reg .b16 lo, hi;
.reg .f32 f0, f1;
shl.b32 t, $1, 9;
and.b32 t, t, 0x0E000E00;
shl.b32 u, $1, 12;
and.b32 u, u, 0x80008000;
or.b32 p0, t, u;
shl.b32 t, $1, 5;
and.b32 t, t, 0x0E000E00;
shl.b32 u, $1, 8;
and.b32 u, u, 0x80008000;
or.b32 p1, t, u;
shl.b32 t, $1, 1;
and.b32 t, t, 0x0E000E00;
shl.b32 u, $1, 4;
and.b32 u, u, 0x80008000;
or.b32 p2, t, u;
shr.b32 t, $1, 3;
and.b32 t, t, 0x0E000E00;
and.b32 u, $1, 0x80008000;
or.b32 p3, t, u;
mul.rn.f16x2 a, p0, $2;
fma.rn.f16x2 a, p1, $3, a;
fma.rn.f16x2 a, p2, $4, a;
fma.rn.f16x2 a, p3, $5, a;
mov.b32 {lo, hi}, a;
cvt.f32.f16 f0, lo;
cvt.f32.f16 f1, hi;
add.f32 $0, f0, f1;
}
""")


@triton.jit
def _f16_bits(x):
    return x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _bc(v, RANK3: tl.constexpr):
    """Per-word vector -> broadcastable against the weight tile ([R, W] or [R, G, 4])."""
    if RANK3:
        r = v[None, :, :]
    else:
        r = v[None, :]
    return r


@triton.jit
def _f16_lanes(p):
    """int32 holding f16x2 -> (low lane, high lane) as float32."""
    lo = (p & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = ((p >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _f16x2_dot(p, q):
    p_lo, p_hi = _f16_lanes(p)
    q_lo, q_hi = _f16_lanes(q)
    return p_lo * q_lo + p_hi * q_hi


@triton.jit
def _word_dots(w, x_row, offs_w, w_mask, INTERPRETED: tl.constexpr, RANK3: tl.constexpr = False):
    """w int32 [R, W] (8 E2M1 codes per word) . x -> fp32 [R, W]: per word, sum_t code_t * x[8j+t]
    (block scales NOT applied). x_row points at one bf16 activation row."""
    xb = x_row + 8 * offs_w
    x0 = tl.load(xb + 0, mask=w_mask, other=0.0).to(tl.float32)
    x1 = tl.load(xb + 1, mask=w_mask, other=0.0).to(tl.float32)
    x2 = tl.load(xb + 2, mask=w_mask, other=0.0).to(tl.float32)
    x3 = tl.load(xb + 3, mask=w_mask, other=0.0).to(tl.float32)
    x4 = tl.load(xb + 4, mask=w_mask, other=0.0).to(tl.float32)
    x5 = tl.load(xb + 5, mask=w_mask, other=0.0).to(tl.float32)
    x6 = tl.load(xb + 6, mask=w_mask, other=0.0).to(tl.float32)
    x7 = tl.load(xb + 7, mask=w_mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3))),
                      tl.maximum(tl.maximum(tl.abs(x4), tl.abs(x5)), tl.maximum(tl.abs(x6), tl.abs(x7))))
    eb = ((amax.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32)
    # Scale x by 2**e so the word's max lands in [2**14, 2**15) (fp16 range, 11 bits kept); undo
    # it and the decode's 2**-14 with 2**(14-e) at the end. e in [-113, 126] keeps both factors
    # normal float32 (-113 only for non-finite x, which then yields inf/NaN as it should).
    e = tl.minimum(tl.maximum(141 - eb, -113), 126)
    up = ((e + 127) << 23).to(tl.float32, bitcast=True)
    down = ((141 - e) << 23).to(tl.float32, bitcast=True)
    xp0 = _f16_bits(x0 * up) | (_f16_bits(x4 * up) << 16)
    xp1 = _f16_bits(x1 * up) | (_f16_bits(x5 * up) << 16)
    xp2 = _f16_bits(x2 * up) | (_f16_bits(x6 * up) << 16)
    xp3 = _f16_bits(x3 * up) | (_f16_bits(x7 * up) << 16)
    zero = tl.zeros_like(w)  # broadcast the per-word x pairs to the weight tile's shape
    xp0 = _bc(xp0, RANK3) + zero
    xp1 = _bc(xp1, RANK3) + zero
    xp2 = _bc(xp2, RANK3) + zero
    xp3 = _bc(xp3, RANK3) + zero
    if INTERPRETED:
        # Instruction-by-instruction emulation of _E2M1X8_DOT_F16 (inline PTX cannot run in the
        # interpreter): same shifts / masks / lane pairing / f16 operands, fp32 arithmetic.
        r = _f16x2_dot(((w << 9) & 0x0E000E00) | ((w << 12) & -2147450880), xp0)  # -2147450880 == 0x80008000
        r += _f16x2_dot(((w << 5) & 0x0E000E00) | ((w << 8) & -2147450880), xp1)
        r += _f16x2_dot(((w << 1) & 0x0E000E00) | ((w << 4) & -2147450880), xp2)
        r += _f16x2_dot((((w >> 3) & 0x1FFFFFFF) & 0x0E000E00) | (w & -2147450880), xp3)
    else:
        r = tl.inline_asm_elementwise(
            _E2M1X8_DOT_F16, "=r,r,r,r,r,r", [w, xp0, xp1, xp2, xp3],
            dtype=tl.float32, is_pure=True, pack=1,
        )
    r = r * _bc(down, RANK3)
    return r


@triton.jit
def _row_dot_words(x_row, k_len, w_base, s_base, rows, stride_wn, stride_sn,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    """sum_k x[k] * W[rows, k] for ONE activation row -> fp32 [BLOCK_N], no tensor cores.

    Weights are read as 32-bit words (8 codes), tiled [rows, scale group, 4 words] so one thread
    holds a whole 32-element group (16-byte loads; the group sum stays in registers), with a
    one-tile register prefetch (the next tile's loads are issued before this tile's math) so each
    program keeps two tiles in flight. The row stride is in bytes (a multiple of 16 for gpt-oss
    shapes, so the loads vectorize).
    """
    ks = k_len // 32
    row_ptr = (w_base + rows[:, None, None] * stride_wn).to(tl.pointer_type(tl.int32))
    s_row = s_base + rows[:, None] * stride_sn
    offs_g = tl.arange(0, BLOCK_K // 32)
    offs_j = tl.arange(0, 4)
    offs_w = offs_g[:, None] * 4 + offs_j[None, :]  # [G, 4] word index within the tile
    # Masks at scale-group granularity (K % 32 == 0, so a group is all-in or all-out): constant
    # over each 4-word vector, which lets the compiler keep the loads 16 bytes wide.
    w = tl.load(row_ptr + offs_w[None, :, :], mask=(offs_g < ks)[None, :, None], other=0)
    s = tl.load(s_row + offs_g[None, :], mask=(offs_g < ks)[None, :], other=0)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 32), dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        nw = (k0 + BLOCK_K) // 8 + offs_w
        ns = (k0 + BLOCK_K) // 32 + offs_g
        w_next = tl.load(row_ptr + nw[None, :, :], mask=(ns < ks)[None, :, None], other=0)
        s_next = tl.load(s_row + ns[None, :], mask=(ns < ks)[None, :], other=0)
        cw = k0 // 8 + offs_w
        d = _word_dots(w, x_row, cw, ((k0 // 32 + offs_g) < ks)[:, None], INTERPRETED, True)  # [BLOCK_N, G, 4]
        acc += tl.sum(d, axis=2) * _e8m0_to_f32(s.to(tl.int32))
        w = w_next
        s = s_next
    return tl.sum(acc, axis=1)


@triton.jit
def _mxfp4_gemv_rows_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_om,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """CUDA-core path for the smallest M: program (m, n-tile). m is the fast grid axis so the
    programs of one weight tile run back to back and rows m > 0 find it in L2."""
    m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = tl.where(n_mask, offs_n, 0).to(tl.int64)
    acc = _row_dot_words(x_ptr + m * stride_xm, K, w_ptr, s_ptr, rows, stride_wn, stride_sn,
                         BLOCK_N, BLOCK_K, INTERPRETED)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs_n, _round_bf16(acc, INTERPRETED), mask=n_mask)


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


# --- packed layout (kernels/packed.py): portable CUDA-core path ------------------------------------
# Two words (the same lane's k-steps j and j+1 = one 32-element block of rows g and g+8) per asm
# call: 2 x 8 decode instructions, 8 fma.f16x2 (products value * x * 2**(-L) are exact in fp16,
# 4 terms per lane summed in fp16), then each row's f16x2 lanes are summed in fp32.
_PACKED_BLOCK_DOT = tl.constexpr("""
{
.reg .b32 a0, a1, a2, a3, t, ag, ah;
.reg .b16 lo, hi;
.reg .f32 f0, f1, f2, f3;
shl.b32 t, $2, 2;
and.b32 a0, t, 0x8E008E00;
shl.b32 t, $2, 6;
xor.b32 t, t, $2;
and.b32 a1, t, 0x8E008E00;
shl.b32 t, $2, 9;
xor.b32 t, t, $2;
and.b32 a2, t, 0x8E008E00;
shf.l.wrap.b32 t, $2, $2, 13;
xor.b32 t, t, $2;
and.b32 a3, t, 0x8E008E00;
mul.rn.f16x2 ag, a0, $4;
fma.rn.f16x2 ag, a2, $5, ag;
mul.rn.f16x2 ah, a1, $4;
fma.rn.f16x2 ah, a3, $5, ah;
shl.b32 t, $3, 2;
and.b32 a0, t, 0x8E008E00;
shl.b32 t, $3, 6;
xor.b32 t, t, $3;
and.b32 a1, t, 0x8E008E00;
shl.b32 t, $3, 9;
xor.b32 t, t, $3;
and.b32 a2, t, 0x8E008E00;
shf.l.wrap.b32 t, $3, $3, 13;
xor.b32 t, t, $3;
and.b32 a3, t, 0x8E008E00;
fma.rn.f16x2 ag, a0, $6, ag;
fma.rn.f16x2 ag, a2, $7, ag;
fma.rn.f16x2 ah, a1, $6, ah;
fma.rn.f16x2 ah, a3, $7, ah;
mov.b32 {lo, hi}, ag;
cvt.f32.f16 f0, lo;
cvt.f32.f16 f1, hi;
add.f32 $0, f0, f1;
mov.b32 {lo, hi}, ah;
cvt.f32.f16 f2, lo;
cvt.f32.f16 f3, hi;
add.f32 $1, f2, f3;
}
""")


@triton.jit
def _emu_decode(w):
    """The 8-instruction decode of packed.py in Triton integer ops (interpreter path)."""
    u = w.to(tl.uint32, bitcast=True)
    m = 0x8E008E00
    a0 = (u << 2) & m
    a1 = (u ^ (u << 6)) & m
    a2 = (u ^ (u << 9)) & m
    a3 = (u ^ ((u << 13) | (u >> 19))) & m
    return a0, a1, a2, a3


@triton.jit
def _emu_h2(a):
    """uint32 f16x2 -> (low, high) as float64."""
    lo = (a & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float64)
    hi = (a >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float64)
    return lo, hi


@triton.jit
def _emu_hfma(a, x, c_lo, c_hi):
    """fma.rn.f16x2 a * x + c, one rounding to fp16 per lane (exact product and sum in fp64)."""
    a_lo, a_hi = _emu_h2(a)
    x_lo, x_hi = _emu_h2(x.to(tl.uint32, bitcast=True))
    r_lo = (a_lo * x_lo + c_lo).to(tl.float16).to(tl.float64)
    r_hi = (a_hi * x_hi + c_hi).to(tl.float16).to(tl.float64)
    return r_lo, r_hi


@triton.jit
def _packed_block_dot(w0, w1, xa0, xb0, xa1, xb1, INTERPRETED: tl.constexpr):
    if INTERPRETED:
        a0, a1, a2, a3 = _emu_decode(w0)
        z = tl.zeros(w0.shape, dtype=tl.float64)
        g_lo, g_hi = _emu_hfma(a0, xa0, z, z)
        g_lo, g_hi = _emu_hfma(a2, xb0, g_lo, g_hi)
        h_lo, h_hi = _emu_hfma(a1, xa0, z, z)
        h_lo, h_hi = _emu_hfma(a3, xb0, h_lo, h_hi)
        a0, a1, a2, a3 = _emu_decode(w1)
        g_lo, g_hi = _emu_hfma(a0, xa1, g_lo, g_hi)
        g_lo, g_hi = _emu_hfma(a2, xb1, g_lo, g_hi)
        h_lo, h_hi = _emu_hfma(a1, xa1, h_lo, h_hi)
        h_lo, h_hi = _emu_hfma(a3, xb1, h_lo, h_hi)
        sg = (g_lo.to(tl.float32) + g_hi.to(tl.float32))
        sh = (h_lo.to(tl.float32) + h_hi.to(tl.float32))
    else:
        sg, sh = tl.inline_asm_elementwise(
            _PACKED_BLOCK_DOT, "=r,=r,r,r,r,r,r,r", [w0, w1, xa0, xb0, xa1, xb1],
            dtype=(tl.float32, tl.float32), is_pure=True, pack=1,
        )
    return sg, sh


@triton.jit
def _e8m0_bits_f32(s):
    """E8M0 byte -> fp32 by moving it into the exponent field (0 -> 0, 255 -> inf), as the CUDA kernel."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_packed_fma_kernel(
    xq_ptr, xdown_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    N, n_tiles, KC, stride_om,
    HAS_BIAS: tl.constexpr, BT: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """Program (BT row tiles, token m): y[m, rows] over the packed layout, no tensor cores. Each
    thread holds one lane's 4 words of a chunk (16-byte load), i.e. 2 blocks x rows (g, g+8)."""
    pid = tl.program_id(0)
    m = tl.program_id(1)
    tiles = pid * BT + tl.arange(0, BT)
    tiles_c = tl.where(tiles < n_tiles, tiles, 0).to(tl.int64)
    lanes = tl.arange(0, 32)
    tl_base = tiles_c[:, None, None, None] * KC
    l4 = lanes[None, :, None, None]
    bh = tl.arange(0, 2)[None, None, :, None]  # block half: words j = 2 bh + jj
    jj = tl.arange(0, 2)[None, None, None, :]
    xj = (2 * tl.arange(0, 2)[None, :, None] + tl.arange(0, 2)[None, None, :]) * 2  # word j -> x offset
    acc_g = tl.zeros((BT, 32, 2), dtype=tl.float32)
    acc_h = tl.zeros((BT, 32, 2), dtype=tl.float32)
    zero = tl.zeros((BT, 32, 2), dtype=tl.int32)
    for c in range(0, KC):
        # loaded straight as [.., 2, 2] so the split below stays inside each thread's registers
        w = tl.load(w_ptr + ((tl_base + c) * 32 + l4) * 4 + 2 * bh + jj)  # [BT, 32, bh, jj]
        sc = tl.load(s_ptr + ((tl_base + c) * 8 + l4 // 4) * 4 + 2 * bh + jj)  # (g b0, g+8 b0, g b1, g+8 b1)
        xofs = ((m * KC + c) * 4 + (lanes % 4)[:, None, None]) * 8 + xj
        xa = tl.load(xq_ptr + xofs)  # [32, bh, jj]: pair (k0+2t) of k-step j
        xb = tl.load(xq_ptr + xofs + 1)  # pair (k0+2t+8)
        w0, w1 = tl.split(w)  # [BT, 32, bh]: j = 2bh, 2bh+1
        xa0, xa1 = tl.split(xa)
        xb0, xb1 = tl.split(xb)
        s_g, s_h = tl.split(sc)  # [BT, 32, bh]: rows g, g+8
        sg, sh = _packed_block_dot(w0, w1, xa0[None, :, :] + zero, xb0[None, :, :] + zero,
                                   xa1[None, :, :] + zero, xb1[None, :, :] + zero, INTERPRETED)
        acc_g += sg * _e8m0_bits_f32(s_g)
        acc_h += sh * _e8m0_bits_f32(s_h)
    rg = tl.sum(tl.reshape(tl.sum(acc_g, axis=2), (BT, 8, 4)), axis=2)  # rows 16 r + g
    rh = tl.sum(tl.reshape(tl.sum(acc_h, axis=2), (BT, 8, 4)), axis=2)  # rows 16 r + 8 + g
    res = tl.reshape(tl.permute(tl.join(rg, rh), (0, 2, 1)), (BT, 16))
    res = res * tl.load(xdown_ptr + m)
    rows = tiles[:, None] * 16 + tl.arange(0, 16)[None, :]
    rmask = (tiles[:, None] < n_tiles) & (rows < N)
    if HAS_BIAS:
        res += tl.load(b_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + rows, _round_bf16(res, INTERPRETED), mask=rmask)


def _packed_fma(x: torch.Tensor, p: PackedMXFP4, bias, out, cfg: dict) -> torch.Tensor:
    xq, down = prepare_activation(x, p.k_chunks * 64)
    bt = int(cfg.get("block_tiles", 4))
    m = x.shape[0]
    _mxfp4_packed_fma_kernel[(triton.cdiv(p.n_tiles, bt), m)](
        xq, down, p.words, p.scales, bias if bias is not None else down, out,
        p.n, p.n_tiles, p.k_chunks, out.stride(0),
        HAS_BIAS=bias is not None, BT=bt, INTERPRETED=INTERPRET, num_warps=int(cfg.get("num_warps", 4)),
        num_stages=int(cfg.get("num_stages", 2)),
    )  # fmt: skip
    return out


def _use_cuda(x: torch.Tensor, cfg: dict) -> bool:
    if INTERPRET or not x.is_cuda or x.shape[0] > CUDA_MAX_M or cfg.get("impl", "cuda") != "cuda":
        return False
    from . import cuda_ext

    ok, _ = cuda_ext.available()
    return ok


def mxfp4_gemv_packed(x: torch.Tensor, p: PackedMXFP4, bias: torch.Tensor | None = None,
                      out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) with W repacked by `pack_mxfp4`: x [M, K] bf16 -> [M, N] bf16.

    impl (tuning.yaml gemv.packed.impl): cuda = tensor cores from registers (csrc/mxfp4_mma.cu,
    M <= 16, GPU); packed_fma = the Triton CUDA-core path (any M, also the CPU interpreter's).
    `cuda` falls back to packed_fma where the extension cannot be built or M > 16."""
    if p.words.dim() != 4:
        raise ValueError("mxfp4_gemv_packed takes one matrix (use the MoE functions for stacked experts)")
    if x.dim() != 2 or x.shape[1] != p.k:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)} for packed weights of K={p.k}")
    check_bias(bias, (p.n,), "the layer's")
    check_device(x, p.words, p.scales, bias)
    cfg = config
    if not cfg:  # one lookup: this runs on every eager lm_head call
        base = get_config("gemv")
        cfg = {**base, **base.get("packed", {})}
    x = x.to(torch.bfloat16).contiguous()
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, p.n), dtype=torch.bfloat16, device=x.device)
    if _use_cuda(x, cfg):
        from . import cuda_ext

        return cuda_ext.gemv(x, p, bias, out, cfg)
    return _packed_fma(x, p, bias, out, cfg)


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
    check_bias(bias, (n,), "the layer's")
    check_device(x, w, scales, bias)
    cfg = config or get_config("gemv")
    x = x.to(torch.bfloat16).contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    if scales.stride(1) != 1:
        scales = scales.contiguous()
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    sms = _sm_count(x.device.index or 0) if x.is_cuda else 0
    nw, ns = int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 3))
    if m <= int(cfg.get("rows_max_m", 0)):
        # CUDA-core path (fma16): decode once per (row, token) -- cheapest for M = 1..few.
        rcfg = {**cfg, **cfg.get("rows", {})}
        block_n = _pick_block_n(n, rcfg["block_n"], int(rcfg.get("min_programs_per_sm", 0)) * sms)
        block_k = max(32, min(int(rcfg["block_k"]), triton.next_power_of_2(k)))
        _mxfp4_gemv_rows_kernel[(m, triton.cdiv(n, block_n))](
            x, w, scales, bias if bias is not None else x, out,
            m, n, k,
            x.stride(0), w.stride(0), scales.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, INTERPRETED=INTERPRET,
            num_warps=int(rcfg.get("num_warps", nw)), num_stages=int(rcfg.get("num_stages", 1)),
        )  # fmt: skip
        return out
    block_n = _pick_block_n(n, cfg["block_n"], int(cfg.get("min_programs_per_sm", 0)) * sms)
    block_m = int(cfg.get("block_m", 16))
    block_k = min(int(cfg["block_k"]), triton.next_power_of_2(k))
    block_k = max(block_k, 64)  # tl.dot needs K >= 16 per operand half; dot_scaled >= 2 scale groups
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _mxfp4_gemv_kernel[grid](
        x, w, scales, bias if bias is not None else x, out,
        m, n, k,
        x.stride(0), w.stride(0), scales.stride(0), out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        IMPL=_IMPLS[cfg.get("impl", "dot_scaled")], INTERPRETED=INTERPRET,
        num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return out


class PackedLinear:
    """One packed MXFP4 weight served many times (a model's layer): x [..., K] -> [..., N] bf16. The decode
    kernels up to `threshold` tokens (tensor cores on a GPU), `packed_mm.mxfp4_mm_packed` above, on the same
    packed bytes. The tuning config is read once and each M's launch plan made on its first call: vLLM computes
    the logits outside its CUDA graphs, so the lm_head runs this on the host every decode step, and a config
    lookup plus launch sizing per call cost more host time than the kernel's GPU time (H100 host: 119 us for the
    lm_head at M=1 against ~95 of GPU time; 47 us with the config and plans held).

    `gemv.packed.decode_chunks_max_m` (0: off): batches above the threshold up to this many tokens run as calls of
    the decode kernels on `threshold` rows each, for weights of at most `decode_chunks_max_mib` packed MiB. Why: a
    decode batch of 17-63 tokens (tg32 at concurrency 32 runs M = 32) otherwise takes the prefill kernel, whose grid
    is one CTA per 256 output rows and token block: 20 CTAs for qkv, 12 for o_proj, on 132 SMs (H200, bench_prefill:
    ~44 / ~59 us from 64 to 256 tokens, cuBLAS on BF16 weights 8.6 / 10.1). The decode kernels spread K over every SM,
    and after the first chunk a weight this small (qkv 7.5 MiB packed) may be read again from L2, not DRAM; a large one
    (the lm_head, ~293 MiB) would be read from DRAM once per chunk, hence the size limit."""

    def __init__(self, packed: PackedMXFP4, threshold: int | None = None):
        if packed.words.dim() != 4 or packed.paired:
            raise ValueError("PackedLinear takes one dense matrix (use the MoE functions for stacked or paired experts)")
        base = get_config("gemv")
        self.p = packed
        self.threshold = int(base["small_m_threshold"]) if threshold is None else int(threshold)
        self.cfg = {**base, **base.get("packed", {})}
        mib = (packed.words.nbytes + packed.scales.nbytes) / 2**20
        self.chunks_max_m = (int(self.cfg.get("decode_chunks_max_m", 0))
                             if mib <= float(self.cfg.get("decode_chunks_max_mib", 0)) else 0)
        self._plans: dict[int, object] = {}

    def path(self, m: int) -> str:
        """Which kernels serve M tokens (the plugin logs it once per shape and M)."""
        if m <= self.threshold:
            return "decode kernels"
        if m <= self.chunks_max_m:
            return f"decode kernels, {-(-m // self.threshold)} calls of <= {self.threshold} tokens"
        return large_m_path(m, self.p)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        p = self.p
        check_bias(bias, (p.n,), "the layer's")  # every branch below reads p.n elements of it
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        m = x2.shape[0]
        if m <= self.threshold:
            y = self._decode(x2, bias)
        elif m <= self.chunks_max_m:
            y = torch.empty((m, p.n), dtype=torch.bfloat16, device=x2.device)
            for i in range(0, m, self.threshold):  # rows of a contiguous [M, N] are contiguous slices
                self._decode(x2[i:i + self.threshold], bias, y[i:i + self.threshold])
        else:  # from the same packed bytes: no second resident copy of the weights for large M
            y = mxfp4_mm_packed(x2, p, bias)
        return y.reshape(*lead, p.n)

    def _decode(self, x2: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The decode kernels on x2 [M <= threshold, K] into `out` (new if None)."""
        p = self.p
        m = x2.shape[0]
        plan = self._plans.get(m)  # made only where the CUDA path applied once, so it applies now
        if x2.shape[1] != p.k or (plan is None and not _use_cuda(x2, self.cfg)):
            return mxfp4_gemv_packed(x2, p, bias, out=out, config=self.cfg)  # portable; raises on a shape mismatch
        from . import cuda_ext

        for t in (x2, bias):  # a pointer from another device would be an illegal address in the kernel
            if t is not None and t.device != p.words.device:
                raise ValueError(f"a tensor on {t.device} for packed weights on {p.words.device}")
        if plan is None:
            plan = self._plans[m] = cuda_ext.gemv_plan(m, p, self.cfg)
        x2 = x2.to(torch.bfloat16).contiguous()
        if out is None:
            out = torch.empty((m, p.n), dtype=torch.bfloat16, device=x2.device)
        return cuda_ext.gemv(x2, p, bias, out, self.cfg, plan)


def mxfp4_linear(
    x: torch.Tensor,
    packed: torch.Tensor | PackedMXFP4,
    scales: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    small_m_threshold: int | None = None,
) -> torch.Tensor:
    """Dispatcher: x [..., K] bf16 -> [..., N] bf16.

    `packed` is either checkpoint-layout weights (+ `scales`) or a PackedMXFP4 from `pack_mxfp4`
    (scales ignored): the latter runs `PackedLinear` (the repacked kernels up to the threshold, packed_mm above;
    hold a PackedLinear instead to call one weight many times). Checkpoint layout: M (tokens) <= threshold ->
    low-M kernel; larger M -> dequantize to BF16 + torch.matmul. Threshold from tuning.yaml
    (gemv.small_m_threshold, env KERNELS_GEMV_SMALL_M_THRESHOLD) unless given.
    """
    if isinstance(packed, PackedMXFP4):
        return PackedLinear(packed, small_m_threshold)(x, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    thr = small_m_threshold if small_m_threshold is not None else int(get_config("gemv")["small_m_threshold"])
    if x2.shape[0] <= thr:
        y = mxfp4_gemv(x2, packed, scales, bias)
    else:
        wb = dequantize_mxfp4(as_packed(packed, scales), scales, torch.bfloat16)
        y = torch.nn.functional.linear(x2.to(torch.bfloat16), wb, None if bias is None else bias.to(torch.bfloat16))
    return y.reshape(*lead, y.shape[-1])


def static_count_cases() -> list[StaticCountCase]:
    """For kernels.tools.sass_count: the old fma16 rows kernel at its tuned lm_head config and the packed one."""
    rows_sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*fp32", "out_ptr": "*bf16",
                "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32",
                "stride_om": "i32", "HAS_BIAS": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                "INTERPRETED": "constexpr"}
    packed_sig = {"xq_ptr": "*i32", "xdown_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*u8", "b_ptr": "*fp32",
                  "out_ptr": "*bf16", "N": "i32", "n_tiles": "i32", "KC": "i32", "stride_om": "i32",
                  "HAS_BIAS": "constexpr", "BT": "constexpr", "INTERPRETED": "constexpr"}
    def ptrs(sig: dict[str, str]) -> tuple[str, ...]:
        return tuple(a for a, t in sig.items() if t.startswith("*"))

    return [
        StaticCountCase("fma16 rows (before) 16x512, 2 warps", _mxfp4_gemv_rows_kernel, rows_sig,
                        {"HAS_BIAS": False, "BLOCK_N": 16, "BLOCK_K": 512, "INTERPRETED": False}, 2, 16 * 512 / 8 / 64,
                        "HFMA2", ptrs(rows_sig) + ("K", "stride_xm", "stride_wn", "stride_om")),
        StaticCountCase("packed_fma BT=4, 4 warps", _mxfp4_packed_fma_kernel, packed_sig,
                        {"HAS_BIAS": False, "BT": 4, "INTERPRETED": False}, 4, 4 * 32 * 4 / 128, "HFMA2",
                        ptrs(packed_sig) + ("N", "stride_om")),
    ]
