"""Tensor-core GEMMs for any M from the packed MXFP4 layout (`packed.pack_mxfp4`): the path for the
batches the decode kernels (M <= 16) do not take, so one copy of the weights serves every batch.

Why: keeping the checkpoint's or the engine's layout beside ours for large batches doubles the
weights (gpt-oss-120b's experts: ~61 GB twice does not fit an 80 GB GPU, nor a GB10 at 0.70).
vLLM's own MXFP4 backends keep one copy too: they replace `w13_weight` / `w2_weight` with their
repacked tensor after load (`replace_parameter`); Marlin and triton_kernels' `matmul_ogs` serve every
M from one offline layout. This module does the same for ours.

How (one Triton kernel, `_packed_mm_kernel`): a program computes a [BM tokens, BT*16 rows] tile.
Per 64-wide K chunk it loads its row tiles' words (each 32-bit word one lane's m16n8k16 A fragment,
see packed.py), decodes them with the same 8 integer instructions as the CUDA kernels (4 shift/rotate
+ 4 mask: fp16 = value * 2**-14), moves the fragments into row-major [rows, 64] order, applies the
E8M0 scales in fp32 and feeds bf16 to `tl.dot` against the bf16 activations (fp32 accumulation). The
value times its power-of-two scale is exact in bf16, so the product is the reference's dequantized
matmul up to fp32 summation order.

On a GPU with the CUDA extension the same computation runs as `csrc/mxfp4_mma.cu`'s prefill kernel (`impl: cuda`,
the default there; `impl: triton` keeps this one): the decoded words stay in registers as mma.sync operands and only
the activations go through shared memory, where the Triton kernel is bound by moving every decoded fragment through
shared memory. Here, on CPU (interpreter) and where nvcc is missing, the Triton kernel is the path.

Dense layers from `dequant_min_m` tokens (kernels/tuning.yaml) take another way: `dequantize_packed` writes the
packed bytes as bf16 into one scratch buffer per device and cuBLAS multiplies it (as vLLM's AWQ layers do from 256
tokens), which beat the kernels at every M from 64 to 2048 on an H200 (kernels/NOTES.md). The MoE has no such way:
its bf16 experts (6.4 GB per gpt-oss-120b layer) would cost more to write than the kernels take.

MoE (`mxfp4_moe_packed_mm`): the token slots are sorted by expert and padded per expert to BM
(`align_by_expert`, torch ops only: no host sync, so CUDA graphs can capture it, as vLLM's
`moe_align_block_size` does for its fused MoE); a program reads its block's expert id and gathers its
BM token rows. gate_up applies gpt-oss's clamped SwiGLU in the epilogue (rows are gate/up-paired per
tile at pack time); down multiplies by the routing weight and writes one row per slot, and the k
slots of a token are summed in a fixed order afterwards (deterministic, no atomics).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import check_bias, check_routes
from ._triton import INTERPRET, StaticCountCase, _dot_bf16, _round_bf16, check_device, tl, triton
from .packed import PackedMXFP4
from .reference import SWIGLU_ALPHA, SWIGLU_LIMIT
from .tuning import get_config


@triton.jit
def _decode_chunk(w_ptr, s_ptr, tiles, c, KC):
    """Row tiles `tiles` [BT] (int64) x K chunk c of a packed matrix -> float32 W [BT*16, 64],
    row 16*tile + 8*g8 + g, column 16*j + 8*kh8 + 2*t + pair (packed.py's fragment order undone)."""
    BT: tl.constexpr = tiles.shape[0]
    g = tl.arange(0, 8)[None, :, None, None]
    t = tl.arange(0, 4)[None, None, :, None]
    j = tl.arange(0, 4)[None, None, None, :]
    base = (tiles[:, None, None, None] * KC + c) * 32
    w = tl.load(w_ptr + (base + 4 * g + t) * 4 + j).to(tl.uint32, bitcast=True)  # [BT, g, t, j]
    m = 0x8E008E00
    o0 = (w << 2) & m  # row g,   k0 + 2t (+1)
    o1 = (w ^ (w << 6)) & m  # row g+8, k0 + 2t
    o2 = (w ^ (w << 9)) & m  # row g,   k0 + 8 + 2t
    o3 = (w ^ ((w << 13) | (w >> 19))) & m  # row g+8, k0 + 8 + 2t
    v = tl.join(tl.join(o0, o2), tl.join(o1, o3))  # [BT, g, t, j, kh8, g8]
    v = tl.reshape(tl.permute(v, (0, 5, 1, 3, 4, 2)), (BT * 16, 32))  # [row, pair column 8j + 4kh8 + t]
    lo = (v & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (v >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    vals = tl.reshape(tl.join(lo, hi), (BT * 16, 64)) * 16384.0  # value (fp16 held value * 2**-14)
    # scales [tile, chunk, g, (row g blk 0, row g+8 blk 0, row g blk 1, row g+8 blk 1)]
    gs = tl.arange(0, 8)[None, :, None, None]
    bh = tl.arange(0, 2)[None, None, :, None]
    rh = tl.arange(0, 2)[None, None, None, :]
    sb = tl.load(s_ptr + ((tiles[:, None, None, None] * KC + c) * 8 + gs) * 4 + 2 * bh + rh)  # [BT, g, blk, g8]
    sb = tl.reshape(tl.permute(sb, (0, 3, 1, 2)), (BT * 16, 2)).to(tl.int32)
    scale = (sb << 23).to(tl.float32, bitcast=True)  # 2**(s-127); byte 0 reads 0 as in the CUDA kernels
    return tl.reshape(tl.reshape(vals, (BT * 16, 2, 32)) * scale[:, :, None], (BT * 16, 64))


@triton.jit
def _packed_mm_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, wt_ptr, rows_ptr, bexp_ptr, out_ptr,
    n_rows_x, N, K, n_tiles, KC, stride_xm, stride_om, stride_we, stride_se, stride_be,
    X_DIV: tl.constexpr, GROUPED: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, BM: tl.constexpr, BT: tl.constexpr, alpha, limit, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """out[row] = epilogue(x[row // X_DIV] @ W[e]^T) for the BM rows of block pid_m.

    GROUPED: rows_ptr holds each block's rows (sorted slots; n_rows_x = padding sentinel) and
    bexp_ptr its expert (-1: an unused block). Otherwise rows are pid_m*BM + i and e = 0."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    if GROUPED:
        e = tl.load(bexp_ptr + pid_m)
        rows = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
    else:
        e = 0
        rows = pid_m * BM + tl.arange(0, BM)
    if e >= 0:
        row_ok = rows < n_rows_x
        xrows = tl.where(row_ok, rows // X_DIV, 0).to(tl.int64)
        tiles = pid_n * BT + tl.arange(0, BT)
        tiles_c = tl.where(tiles < n_tiles, tiles, 0).to(tl.int64)
        we = w_ptr + e.to(tl.int64) * stride_we
        se = s_ptr + e.to(tl.int64) * stride_se
        kk = tl.arange(0, 64)
        acc = tl.zeros((BM, BT * 16), dtype=tl.float32)
        for c in range(0, KC):
            kcol = c * 64 + kk
            xt = tl.load(x_ptr + xrows[:, None] * stride_xm + kcol[None, :],
                         mask=row_ok[:, None] & (kcol < K)[None, :], other=0.0)
            wt = _decode_chunk(we, se, tiles_c, c, KC).to(tl.bfloat16)
            acc = _dot_bf16(xt, tl.trans(wt), acc, INTERPRETED)
        cols = pid_n * BT * 16 + tl.arange(0, BT * 16)  # packed row order
        if SWIGLU:
            # packed row 16r + 8*g8 + g is original row 2*(8r + g) + g8: gate (g8 = 0) / up (g8 = 1)
            orig = 2 * (8 * (cols // 16) + cols % 8) + (cols % 16) // 8
        else:
            orig = cols
        if HAS_BIAS:
            acc += tl.load(b_ptr + e.to(tl.int64) * stride_be + orig, mask=orig < N, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:
            gu = tl.permute(tl.reshape(acc, (BM, BT, 2, 8)), (0, 1, 3, 2))
            gate, up = tl.split(gu)  # [BM, BT, 8]
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            h = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
            res = tl.reshape(h, (BM, BT * 8))
            ocols = pid_n * BT * 8 + tl.arange(0, BT * 8)
            n_out = N // 2
        else:
            res = acc
            ocols = cols
            n_out = N
        if HAS_WEIGHT:
            res = res * tl.load(wt_ptr + rows, mask=row_ok, other=0.0)[:, None]
        optr = out_ptr + tl.where(row_ok, rows, 0).to(tl.int64)[:, None] * stride_om + ocols[None, :]
        omask = row_ok[:, None] & (ocols < n_out)[None, :]
        if HAS_WEIGHT:
            tl.store(optr, res, mask=omask)  # fp32 partial per slot, summed by the caller
        else:
            tl.store(optr, _round_bf16(res, INTERPRETED), mask=omask)


_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "b_ptr": "*fp32", "wt_ptr": "*fp32", "rows_ptr": "*i32",
              "bexp_ptr": "*i32", "out_ptr": "*bf16", "n_rows_x": "i32", "N": "i32", "K": "i32", "n_tiles": "i32",
              "KC": "i32", "stride_xm": "i32", "stride_om": "i32", "stride_we": "i32", "stride_se": "i32",
              "stride_be": "i32", "X_DIV": "constexpr", "GROUPED": "constexpr", "HAS_BIAS": "constexpr",
              "SWIGLU": "constexpr", "HAS_WEIGHT": "constexpr", "BM": "constexpr", "BT": "constexpr", "alpha": "fp32",
              "limit": "fp32", "INTERPRETED": "constexpr"}
# what the JIT sees as multiples of 16 when it serves gpt-oss (hidden and intermediate 2880, qkv 5120, o_proj K 4096,
# torch's 16-byte-aligned allocations); n_tiles (N / 16), KC (K / 64) and the row count are not
_DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "b_ptr", "wt_ptr", "rows_ptr", "bexp_ptr", "out_ptr", "N", "K", "stride_xm",
              "stride_om", "stride_we", "stride_se", "stride_be")


def static_count_cases(arch: str) -> list[StaticCountCase]:
    """For kernels.tools.sass_count: the three launches prefill runs (dense layers, MoE gate_up, MoE down) at this
    arch's tuned config (tuning.yaml packed_mm), BM at its largest (prefill's tokens per expert reach it)."""
    cfg = get_config("packed_mm", arch)
    bm, bt, warps = int(cfg.get("block_m", 64)), int(cfg.get("block_tiles", 4)), int(cfg.get("num_warps", 4))
    words = bt * 16 * 64 / 8 / (warps * 32)
    base = {"X_DIV": 1, "GROUPED": False, "HAS_BIAS": False, "SWIGLU": False, "HAS_WEIGHT": False, "BM": bm, "BT": bt,
            "INTERPRETED": False}
    variants = [(f"packed_mm dense BM={bm} BT={bt}", {"HAS_BIAS": True}),
                (f"packed_mm moe gate_up BM={bm} BT={bt}", {"X_DIV": 4, "GROUPED": True, "HAS_BIAS": True, "SWIGLU": True}),
                (f"packed_mm moe down BM={bm} BT={bt}", {"GROUPED": True, "HAS_BIAS": True, "HAS_WEIGHT": True})]
    # down writes one fp32 row per slot (summed over the k slots afterwards); the others write bf16
    sigs = [dict(_SIGNATURE, out_ptr="*fp32" if extra.get("HAS_WEIGHT") else "*bf16") for _, extra in variants]
    return [StaticCountCase(name, _packed_mm_kernel, sig, {**base, **extra}, warps, words, "MMA", _DIVISIBLE,
                            int(cfg.get("num_stages", 2))) for (name, extra), sig in zip(variants, sigs)]


def dequant_static_case(arch: str) -> StaticCountCase:
    """The dense layers' dequantize kernel at this arch's tuned tiles per program, for a compile without a GPU
    (tests/level1_5_kernels/test_kernel_build.py: it must build for every shipped arch, with 16-byte accesses)."""
    bt = int(get_config("packed_mm", arch).get("dequant_block_tiles", 4))
    sig = {"w_ptr": "*i32", "s_ptr": "*u8", "out_ptr": "*bf16", "n_tiles": "i32", "KC": "i32", "stride_o": "i32",
           "BT": "constexpr"}
    return StaticCountCase(f"packed_mm dequantize BT={bt}", _dequant_kernel, sig, {"BT": bt}, DEQUANT_WARPS,
                           bt * 16 * 64 / 8 / (32 * DEQUANT_WARPS),
                           "STG", ("w_ptr", "s_ptr", "out_ptr", "stride_o"))


def _cfg(config: dict | None) -> dict:
    return config or get_config("packed_mm")


DEQUANT_WARPS = 4


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, n_tiles, KC, stride_o, BT: tl.constexpr):
    """Row tiles [BT] x one K chunk of a packed matrix -> bf16 rows [BT*16, 64] of out (padded shape [n_tiles*16,
    KC*64]). The value times its power-of-two scale is exact in bf16, so this is the checkpoint's dequantization."""
    tiles = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(1)
    w = _decode_chunk(w_ptr, s_ptr, tl.minimum(tiles, n_tiles - 1).to(tl.int64), c, KC)
    rows = (tiles[:, None] * 16 + tl.arange(0, 16)[None, :]).reshape(BT * 16).to(tl.int64)
    cols = c * 64 + tl.arange(0, 64)
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], w.to(tl.bfloat16), mask=(rows < n_tiles * 16)[:, None])


def dequantize_packed(p: PackedMXFP4, cfg: dict | None = None, buf: torch.Tensor | None = None) -> torch.Tensor:
    """One packed dense matrix -> bf16 W [N, K] (a view of a padded [N16, K64] buffer: `buf`'s first elements when
    given, else a new one), from the same bytes the kernels read."""
    if p.words.dim() != 4 or p.paired:
        raise ValueError("dequantize_packed takes one unpaired matrix (not stacked or gate/up-paired experts)")
    check_device(p.words, p.scales)
    bt = int(_cfg(cfg).get("dequant_block_tiles", 4))
    shape = (p.n_tiles * 16, p.k_chunks * 64)
    if buf is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=p.words.device)
    else:
        out = buf[: _copy_numel(p)].view(shape)
    _dequant_kernel[(triton.cdiv(p.n_tiles, bt), p.k_chunks)](p.words, p.scales, out, p.n_tiles, p.k_chunks,
                                                              out.stride(0), BT=bt, num_warps=DEQUANT_WARPS)
    return out[: p.n, : p.k]


def _copy_numel(p: PackedMXFP4) -> int:
    """Elements of a dense matrix's bf16 copy at its padded shape [N16, K64] (what the dequantize kernel writes)."""
    return p.n_tiles * 16 * p.k_chunks * 64


_SCRATCH: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def _dequant_scratch(p: PackedMXFP4) -> torch.Tensor:
    """One bf16 buffer per device that every dense layer's copy reuses, in stream order (a layer's GEMM has
    read it before the next layer's dequantize writes it). Why not a fresh tensor per call: vLLM captures batches up to
    1024 tokens as one CUDA graph per piece between attention layers and sizes its KV cache from the memory one
    capture of the largest batch takes; a per-call copy made each of the 37 pieces of the gpt-oss-120b shape hold
    its own (H200, vLLM 0.26: estimated graph memory 2.89 GiB instead of 0.98, KV capacity -3.2%). The buffer is
    made by the first large call, which is vLLM's eager profiling run, before any capture. One buffer per device
    assumes one compute stream per device, as vLLM runs its forward; layers on two streams at once would race on it."""
    need = _copy_numel(p)
    dev = p.words.device
    buf = _SCRATCH.get(dev)
    if buf is None or buf.numel() < need:
        if buf is not None:  # a graph captured earlier may still write the smaller one: it must stay allocated
            _RETIRED.append(buf)
        buf = _SCRATCH[dev] = torch.empty(need, dtype=torch.bfloat16, device=dev)
    return buf


def _dequant_serves(m: int, p: PackedMXFP4, cfg: dict) -> bool:
    """Dense M >= dequant_min_m (0: never): dequantize into the scratch buffer and multiply with the BLAS, as vLLM's
    AWQ layers do from 256 tokens (awq_dequantize + torch.matmul). Only weights whose copy fits dequant_max_mib (the
    qkv and o_proj layers; not the 1.1 GiB lm_head), so the buffer stays small next to the one copy of the
    weights."""
    lo = int(cfg.get("dequant_min_m", 0))
    return 0 < lo <= m and _copy_numel(p) * 2 <= float(cfg.get("dequant_max_mib", 64)) * 2**20


def _launch(x, p: PackedMXFP4, bias, out, *, rows=None, bexp=None, n_blocks=None, x_div=1, weights=None,
            swiglu=False, bm: int, cfg: dict, alpha=SWIGLU_ALPHA, limit=SWIGLU_LIMIT):
    bt = int(cfg.get("block_tiles", 4))
    grouped = rows is not None
    n_rows = x.shape[0] * x_div  # grouped: the padding sentinel S = M*k is one past the last slot
    grid = (triton.cdiv(p.n_tiles, bt), n_blocks if grouped else triton.cdiv(x.shape[0], bm))
    per_e = p.words.dim() == 5
    dummy = out
    _packed_mm_kernel[grid](
        x, p.words, p.scales, bias if bias is not None else dummy, weights if weights is not None else dummy,
        rows if grouped else dummy, bexp if grouped else dummy, out,
        n_rows, p.n, p.k, p.n_tiles, p.k_chunks, x.stride(0), out.stride(0),
        p.words.stride(0) if per_e else 0, p.scales.stride(0) if per_e else 0,
        bias.stride(0) if (bias is not None and bias.dim() == 2) else 0,
        X_DIV=x_div, GROUPED=grouped, HAS_BIAS=bias is not None, SWIGLU=swiglu, HAS_WEIGHT=weights is not None,
        BM=bm, BT=bt, alpha=float(alpha), limit=float(limit), INTERPRETED=INTERPRET,
        num_warps=int(cfg.get("num_warps", 4)), num_stages=int(cfg.get("num_stages", 2)),
    )  # fmt: skip
    return out


def _cuda_prefill(x: torch.Tensor, cfg: dict) -> bool:
    """The CUDA prefill kernel serves this call: a GPU tensor, `impl` cuda (the default) and an extension that
    builds. Otherwise the Triton kernel (the CPU interpreter's path, and the fallback where nvcc is missing)."""
    impl = cfg.get("impl", "cuda")
    if impl not in ("cuda", "triton"):
        raise ValueError(f"packed_mm.impl must be cuda or triton (kernels/tuning.yaml), got {impl!r}")
    if INTERPRET or not x.is_cuda or impl != "cuda":
        return False
    from .cuda_ext import prefill_available

    return prefill_available()[0]


def _cuda_variant(cfg: dict, moe: bool, *weights: PackedMXFP4, down: bool = False) -> int:
    """Prefill kernel variant (cuda_ext.PF_VARIANTS): `cuda_variant` from the tuning, else the tiling the tuning names:
    dense layers 64 token rows per CTA, `cuda_row_tiles` row tiles per warp, `cuda_ctas_per_sm` and `cuda_form`; the
    MoE its own `cuda_moe_*` keys where given (`cuda_moe_tokens`, `cuda_moe_row_tiles`, `cuda_moe_ctas_per_sm`,
    `cuda_moe_form`; sm_90 serves its MoE on wgmma). `down`: the MoE's down half, whose `cuda_down_variant` /
    `cuda_moe_down_*` keys come first (`_moe_variants` checks it can read gate_up's h). The bf16 forms (bf16, wgmma)
    serve weights whose scale bytes they multiply exactly (cuda_ext.BF16_MAX_SCALE); others take the f16 form at 64
    rows, one CTA per SM."""
    from .cuda_ext import BF16_MAX_SCALE, FORM_BF16, FORM_F16, FORM_WG, PF_VARIANTS, reads_bf16_rows, variant_problem

    explicit = "cuda_down_variant" if down and "cuda_down_variant" in cfg else "cuda_variant"
    if explicit in cfg:
        v = int(cfg[explicit])
        if variant_problem(v):
            raise ValueError(f"packed_mm {explicit} {v}: {variant_problem(v)}; unset {explicit} "
                             f"(KERNELS_PACKED_MM_{explicit.upper()}) or pick another")
        if reads_bf16_rows(v) and any(w.scale_max() > BF16_MAX_SCALE for w in weights):
            raise ValueError(f"packed_mm {explicit} {v} is a bf16-form tiling, which cannot multiply scale bytes above "
                             f"{BF16_MAX_SCALE} (these weights have {max(w.scale_max() for w in weights)}): unset "
                             f"{explicit} (KERNELS_PACKED_MM_{explicit.upper()}) or pick an f16-form variant")
        return v

    def key(name: str, default):
        if not moe:
            return cfg.get(f"cuda_{name}", default)
        moe_value = cfg.get(f"cuda_moe_{name}", cfg.get(f"cuda_{name}", default))
        return cfg.get(f"cuda_moe_down_{name}", moe_value) if down else moe_value

    forms = {"bf16": FORM_BF16, "f16": FORM_F16, "wgmma": FORM_WG}
    form = key("form", "bf16")
    if form not in forms:
        raise ValueError(f"packed_mm.cuda_{'moe_' if moe else ''}form must be one of {', '.join(forms)} "
                         f"(kernels/tuning.yaml), got {form!r}")
    rt = int(key("row_tiles", 2))
    if form != "f16" and all(w.scale_max() <= BF16_MAX_SCALE for w in weights):
        want = (int(key("tokens", 64)) // 8, rt, int(key("ctas_per_sm", 1)), forms[form])
    else:
        want = (8, int(cfg.get("cuda_row_tiles", 2)), 1, FORM_F16)
    if want not in PF_VARIANTS:
        raise ValueError(f"no CUDA prefill tiling (NT, RT, CTAS, FORM) = {want} in cuda_ext.PF_VARIANTS {PF_VARIANTS}; "
                         "set packed_mm's cuda_(moe_)tokens / row_tiles / ctas_per_sm / form to one of them")
    v = PF_VARIANTS.index(want)
    if variant_problem(v):
        raise ValueError(f"packed_mm cuda_{'moe_' if moe else ''}form {form}: {variant_problem(v)}; set it to bf16")
    return v


def _activation(x: torch.Tensor, k_chunks: int, variant: int, src: str = "") -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the prefill variant reads: bf16 rows as they are (16-byte aligned), or xprep_kernel's f16 fragments (of
    kernel source `src`, default the served one)."""
    from .cuda_ext import activation_frags, reads_bf16_rows

    if reads_bf16_rows(variant):
        return (x if x.data_ptr() % 16 == 0 else x.clone()), None
    return activation_frags(x, k_chunks, src)


def large_m_path(m: int, p: PackedMXFP4, config: dict | None = None) -> str:
    """What `mxfp4_mm_packed` runs for M tokens of this weight, for a server's log: the bf16 copy + BLAS or the
    packed GEMM kernels."""
    return "bf16 copy + BLAS" if m and _dequant_serves(m, p, _cfg(config)) else "packed_mm"


def mxfp4_mm_packed(x: torch.Tensor, p: PackedMXFP4, bias: torch.Tensor | None = None,
                    out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias), x [M, K] bf16, W one packed matrix -> [M, N] bf16, any M: from `dequant_min_m` tokens a
    bf16 copy in the device's scratch buffer times the BLAS, below it the tensor-core kernels on the packed bytes."""
    if p.words.dim() != 4 or p.paired:
        raise ValueError("mxfp4_mm_packed takes one unpaired matrix (the MoE function takes stacked experts)")
    if x.dim() != 2 or x.shape[1] != p.k:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)} for packed weights of K={p.k}")
    check_bias(bias, (p.n,), "the layer's")
    check_device(x, p.words, p.scales, bias)
    cfg = _cfg(config)
    x = x.to(torch.bfloat16).contiguous()
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, p.n), dtype=torch.bfloat16, device=x.device)
    cuda = bool(m) and _cuda_prefill(x, cfg)  # first: it also refuses an unknown impl, whichever path runs
    if m and _dequant_serves(m, p, cfg):
        w = dequantize_packed(p, cfg, _dequant_scratch(p))
        if bias is None:
            return torch.mm(x, w.t(), out=out)
        return torch.addmm(bias.to(torch.bfloat16), x, w.t(), out=out)
    if cuda:
        from .cuda_ext import MODE_DENSE, PF_VARIANTS, prefill_launch

        v = _cuda_variant(cfg, False, p)
        src = cfg.get("cuda_src", "")  # another kernel source, as the MoE takes it (a same-process A/B)
        frag, xdown = _activation(x, p.k_chunks, v, src)
        bm = 8 * PF_VARIANTS[v][0]
        prefill_launch(MODE_DENSE, v, frag, xdown, 1.0, p, bias, out, n_rows=m, n_blocks=-(-m // bm), src=src)
        return out
    return _launch(x, p, bias, out, bm=int(cfg.get("block_m", 64)), cfg=cfg)


def align_by_expert(ids: torch.Tensor, num_experts: int, bm: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Slots (token * k + j) sorted by expert, each expert's run padded to a multiple of bm.

    -> (rows int32 [n_blocks * bm]: slot index or S = M*k for padding, block_expert int32 [n_blocks]:
    expert of each block, -1 past the last, n_blocks). n_blocks = ceil(S / bm) + E bounds the padded
    total whatever the routing, so shapes depend on M only (CUDA-graph capture); no host sync.
    Slots with id -1 (not on this rank) are left out."""
    flat = ids.reshape(-1).to(torch.int64)
    s = flat.numel()
    dev = flat.device
    key = torch.where(flat >= 0, flat, num_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    padded = (counts + bm - 1) // bm * bm
    pend = torch.cumsum(padded, 0)
    ustart = torch.cumsum(counts, 0) - counts
    skey = key[order]
    ske = skey.clamp(max=num_experts - 1)
    pos = pend[ske] - padded[ske] + torch.arange(s, device=dev) - ustart[ske]
    n_blocks = -(-s // bm) + num_experts
    dump = n_blocks * bm
    pos = torch.where(skey < num_experts, pos, dump)
    rows = torch.full((dump + 1,), s, dtype=torch.int32, device=dev)
    rows.scatter_(0, pos, order.to(torch.int32))
    bexp = torch.searchsorted(pend, torch.arange(n_blocks, device=dev) * bm, right=True)
    bexp = torch.where(bexp < num_experts, bexp, -1).to(torch.int32)
    return rows[:dump], bexp, n_blocks


def pick_block_m(slots: int, num_experts: int, cfg: dict) -> int:
    """Tokens per block: the mean slots per expert rounded up to a power of two, within
    [block_m_min, block_m] (small batches waste less MMA width; tl.dot needs >= 16)."""
    lo, hi = int(cfg.get("block_m_min", 16)), int(cfg.get("block_m", 64))
    return max(lo, min(hi, triton.next_power_of_2(max(1, -(-slots // num_experts)))))


def mxfp4_moe_packed_mm(x: torch.Tensor, expert_ids: torch.Tensor, expert_weights: torch.Tensor, gate_up: PackedMXFP4,
                        gate_up_bias: torch.Tensor | None, down: PackedMXFP4, down_bias: torch.Tensor | None,
                        out: torch.Tensor | None = None, config: dict | None = None,
                        alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """Experts of the gpt-oss MoE block for any M on packed experts: x [M, H] bf16, ids [M, k] (-1 =
    skip), weights [M, k] -> [M, H] bf16 (as `moe.mxfp4_moe_packed`, which calls this above M = 16)."""
    m, hdim = x.shape
    if gate_up.k != hdim or down.n != hdim or down.k * 2 != gate_up.n or not gate_up.paired:
        raise ValueError(f"MoE shapes disagree: x {tuple(x.shape)}, gate_up {gate_up.n}x{gate_up.k} "
                         f"(paired={gate_up.paired}), down {down.n}x{down.k}")
    top_k = check_routes(m, expert_ids, expert_weights)
    check_bias(gate_up_bias, (gate_up.experts, gate_up.n), "gate_up")
    check_bias(down_bias, (down.experts, down.n), "down")
    check_device(x, gate_up.words, down.words)
    cfg = _cfg(config)
    x = x.to(torch.bfloat16).contiguous()
    n_exp = gate_up.words.shape[0]
    slots = m * top_k
    if slots and _cuda_prefill(x, cfg):
        return _moe_cuda(x, expert_ids, expert_weights, gate_up, gate_up_bias, down, down_bias, out, cfg, alpha, limit)
    bm = pick_block_m(slots, n_exp, cfg)
    rows, bexp, n_blocks = align_by_expert(expert_ids, n_exp, bm)
    inter = gate_up.n // 2
    h = torch.empty((slots, inter), dtype=torch.bfloat16, device=x.device)
    _launch(x, gate_up, gate_up_bias, h, rows=rows, bexp=bexp, n_blocks=n_blocks, x_div=top_k, swiglu=True,
            bm=bm, cfg=cfg, alpha=alpha, limit=limit)
    # slots of skipped experts (-1) are never written: zero weight and zero rows keep them out of the sum
    wts = torch.where(expert_ids >= 0, expert_weights.float(), 0.0).reshape(-1).contiguous()
    y = torch.zeros((slots, hdim), dtype=torch.float32, device=x.device)
    _launch(h, down, down_bias, y, rows=rows, bexp=bexp, n_blocks=n_blocks, x_div=1, weights=wts, bm=bm, cfg=cfg)
    total = y.view(m, top_k, hdim).sum(dim=1)  # fixed order over the k slots
    if out is None:
        return total.to(torch.bfloat16)
    out.copy_(total)
    return out


def _moe_variants(cfg: dict, gate_up: PackedMXFP4, down: PackedMXFP4, slots: int | None = None) -> tuple[int, int]:
    """The MoE's gate_up and down prefill variants. Down may take its own row tiles and CTAs per SM (it has half
    gate_up's output rows and re-reads its token block's h once per row group), but it walks gate_up's token blocks
    and reads gate_up's h: the same token rows per CTA, and bf16 rows or f16 fragments alike. With
    `cuda_moe_down_min_slots` it takes them only for calls of `slots` (tokens x top_k) whose mean slots per expert reach
    that many (below, gate_up's): fewer re-reads pay where experts are dense, and half the CTAs per SM cost where
    they are sparse (kernels/NOTES.md "The down half's own tiling").

    `cuda_moe_sparse_tokens` (with `cuda_moe_sparse_max_slots`): a call whose mean slots per expert, rounded down
    (slots // experts, as triton_kernels' routing sizes matmul_ogs' blocks), is at most `cuda_moe_sparse_max_slots`
    runs both halves at `cuda_moe_sparse_tokens` token rows per CTA, down's own keys aside. Where experts hold few
    slots and the routing is uneven, a 128-row block is mostly empty padding and each block decodes its expert's
    weights again (kernels/NOTES.md "64 token rows where experts are sparse"). Explicit variants (`cuda_variant`,
    `cuda_down_variant`) are served as given."""
    from .cuda_ext import PF_VARIANTS, reads_bf16_rows

    v = _cuda_variant(cfg, True, gate_up, down)
    vd = _cuda_variant(cfg, True, gate_up, down, down=True)
    if PF_VARIANTS[vd][0] != PF_VARIANTS[v][0] or reads_bf16_rows(vd) != reads_bf16_rows(v):
        raise ValueError(f"packed_mm: the MoE's down tiling {PF_VARIANTS[vd]} cannot read the h of gate_up's "
                         f"{PF_VARIANTS[v]} (token rows per CTA and form must match, (NT, RT, CTAS, FORM)): set "
                         "cuda_moe_down_* (or cuda_down_variant) to a tiling with gate_up's NT and form, or unset them")
    sparse, sparse_max = int(cfg.get("cuda_moe_sparse_tokens", 0)), int(cfg.get("cuda_moe_sparse_max_slots", 0))
    if sparse and sparse_max < 1:
        raise ValueError(f"packed_mm.cuda_moe_sparse_tokens {sparse} needs cuda_moe_sparse_max_slots (the mean slots "
                         "per expert up to which it serves; kernels/tuning.yaml), or set it to 0")
    # an explicit cuda_variant is served as given by _cuda_variant itself; an explicit down variant must keep its h
    if sparse and "cuda_down_variant" not in cfg and slots is not None:
        if slots // gate_up.words.shape[0] <= sparse_max:
            try:  # gate_up's keys at the sparse token rows, for both halves (down's own keys are read only for down)
                vs = _cuda_variant({**cfg, "cuda_moe_tokens": sparse}, True, gate_up, down)
            except ValueError as ex:
                raise ValueError(f"packed_mm.cuda_moe_sparse_tokens {sparse}: {ex}") from None
            return vs, vs
    min_slots = int(cfg.get("cuda_moe_down_min_slots", 0))
    if slots is not None and slots < min_slots * gate_up.words.shape[0]:
        return v, v
    return v, vd


def _moe_live_rows(cfg: dict, slots: int, experts: int, supported: Callable[[], bool]) -> bool:
    """`cuda_moe_live_rows_max_slots` (0: off): a call whose mean slots per expert (slots // experts) are at most this
    stages its token blocks' padding rows as zeros in both halves instead of copies of each block's first row: the same
    output for less L2 traffic where blocks are mostly padding (a decode batch), more loop instructions everywhere
    (kernels/NOTES.md "Decode batches of 32 tokens, measured"). Only where the source has those kernels (`supported`,
    asked only when the rule applies): an earlier source in an A/B runs as it always did."""
    most = int(cfg.get("cuda_moe_live_rows_max_slots", 0))
    if most < 0:
        raise ValueError(f"packed_mm.cuda_moe_live_rows_max_slots must be >= 0 (0: off; kernels/tuning.yaml), got {most}")
    return 0 < most and slots // experts <= most and supported()


def _moe_cuda(x, expert_ids, expert_weights, gate_up: PackedMXFP4, gate_up_bias, down: PackedMXFP4, down_bias, out,
              cfg: dict, alpha: float, limit: float) -> torch.Tensor:
    """mxfp4_moe_packed_mm on the CUDA prefill kernel: gate_up + SwiGLU writes h (bf16 form: bf16 rows [S, I]; f16
    form: f16 * 2**8 fragments, the decode kernels' form, |h| <= (limit + 1) * limit < 2**6 for gpt-oss), down one
    row per slot with its routing weight (fp32, or f16 * 2**-4 on request for the one-pass combine), and the k slots
    of a token are summed in fp32 in a fixed order, as the Triton path does."""
    from .cuda_ext import (MODE_DOWN, MODE_GATEUP, PF_VARIANTS, align_supported, combine, combine_supported,
                           down_f16_supported, live_rows_supported, prefill_launch, reads_bf16_rows)
    from .cuda_ext import align_by_expert as align_by_expert_cuda

    m, hdim = x.shape
    expert_ids = expert_ids.to(torch.int32).contiguous()  # once, for the sort and the combine
    top_k = expert_ids.shape[1]
    slots = m * top_k
    n_exp = gate_up.words.shape[0]
    src = cfg.get("cuda_src", "")  # an earlier kernel source, for a same-process A/B (bench_prefill --cuda-src-before)
    v, vd = _moe_variants(cfg, gate_up, down, slots)
    live = _moe_live_rows(cfg, slots, n_exp, lambda: live_rows_supported(src))
    bm = 8 * PF_VARIANTS[v][0]
    if align_supported(n_exp, src):  # one launch instead of torch's ~20 (same result)
        rows, bexp, n_blocks = align_by_expert_cuda(expert_ids, n_exp, bm, src)
    else:
        rows, bexp, n_blocks = align_by_expert(expert_ids, n_exp, bm)
    frag, xdown = _activation(x, gate_up.k_chunks, v, src)
    wts = torch.where(expert_ids >= 0, expert_weights.float(), 0.0).reshape(-1).contiguous()
    if out is None:
        out = torch.empty((m, hdim), dtype=torch.bfloat16, device=x.device)
    one_pass = combine_supported(out, hdim, src)
    rows_kind = cfg.get("cuda_moe_down_rows", "f32")
    if rows_kind not in ("f16", "f32"):
        raise ValueError(f"packed_mm.cuda_moe_down_rows must be f16 or f32 (kernels/tuning.yaml), got {rows_kind!r}")
    # f16 rows (value * 2**-4, half the bytes of fp32) on request where the one-pass combine reads them; torch's sum
    # takes fp32
    f16_rows = one_pass and rows_kind == "f16" and down_f16_supported(hdim, src)
    # the one-pass combine skips the slots the down kernel never writes (ids < 0); torch's sum needs them zero
    y = (torch.empty if one_pass else torch.zeros)((slots, hdim), dtype=torch.float16 if f16_rows else torch.float32,
                                                   device=x.device)
    if reads_bf16_rows(v):
        # rows of skipped slots (-1) are never written and are read only into columns that are never stored
        h = torch.empty((slots, gate_up.n // 2), dtype=torch.bfloat16, device=x.device)
        prefill_launch(MODE_GATEUP, v, frag, None, 1.0, gate_up, gate_up_bias, h, n_rows=slots, n_blocks=n_blocks,
                       rows=rows, bexp=bexp, x_div=top_k, alpha=alpha, limit=limit, src=src, live=live)
        prefill_launch(MODE_DOWN, vd, h, None, 1.0, down, down_bias, y, n_rows=slots, n_blocks=n_blocks, rows=rows,
                       bexp=bexp, x_div=1, wts=wts, src=src, live=live)
    else:
        kc_h = down.k_chunks
        # pairs past the intermediate size up to kc_h * 32 are never written: zero them unless there are none
        alloc = torch.empty if (gate_up.n // 2) % 64 == 0 else torch.zeros
        h = alloc((slots, kc_h * 32), dtype=torch.int32, device=x.device)
        prefill_launch(MODE_GATEUP, v, frag, xdown, 1.0, gate_up, gate_up_bias, h, n_rows=slots, n_blocks=n_blocks,
                       rows=rows, bexp=bexp, x_div=top_k, kc_h=kc_h, alpha=alpha, limit=limit, src=src, live=live)
        # h is stored * 2**8 and the decoded weights are value * 2**-14: products come out * 2**-6
        prefill_launch(MODE_DOWN, vd, h, None, 64.0, down, down_bias, y, n_rows=slots, n_blocks=n_blocks, rows=rows,
                       bexp=bexp, x_div=1, wts=wts, src=src, live=live)
    if one_pass:
        return combine(y, expert_ids, n_exp, out, src)
    out.copy_(y.view(m, top_k, hdim).sum(dim=1))  # fixed order over the k slots
    return out
