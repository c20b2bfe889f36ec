"""The large-M path on the packed layout (kernels/packed_mm.py) against the fp32 references.

It is what serves prefill and batches above 16 tokens once the engine keeps only our packed copy of the
weights, so it must agree with the reference wherever the decode kernels do.

Tolerances (kernels/cases.py, derived in test_kernel_gemv.py and test_kernel_moe.py): dense GEMM_NMSE-class
bound GEMV_NMSE = 2e-5 (a value times its power-of-two scale is exact in bf16, products exact in fp32,
fp32 accumulation, one BF16 output rounding <= 1.53e-5); MoE MOE_NMSE = 5e-5 (plus the BF16 h between
the GEMMs). A wrong row order, scale, expert or slot moves NMSE to 1e-3 .. 1.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from kernels import reference
from kernels.cases import GEMV_NMSE, LINEAR_SHAPES, MOE, MOE_MARLIN_PADDED, MOE_NMSE
from kernels.cuda_ext import FORM_WG, PF_VARIANTS
from kernels.moe import pack_moe_experts
from kernels.packed import pack_mxfp4
from kernels.mxfp4 import dequantize_mxfp4
from kernels.packed_mm import align_by_expert, dequantize_packed, large_m_path, mxfp4_mm_packed, mxfp4_moe_packed_mm
from kernels.tuning import get_config
from kernels.testing import DEV, assert_close_nmse, fresh_seed, generator, poisoned, random_mxfp4

from .test_kernel_moe import BIAS_DTYPES, _packed_case

pytestmark = pytest.mark.level1_5



def _dense_case(m: int, n: int, k: int, seed: int, dev: str = DEV):
    g = generator(seed, dev)
    w, s = random_mxfp4((n, k), g)
    x = torch.randn(m, k, generator=g, device=dev).to(torch.bfloat16)
    bias = torch.randn(n, generator=g, device=dev)
    ref = reference.mxfp4_linear_ref(x, w, s, bias)
    return x, pack_mxfp4(w, s), bias, ref


def test_the_gpu_run_runs_the_served_kernels_tests():
    """kernels/gpu_run.sh is the one GPU run of the kernels: it must run this file (the served prefill and its CUDA
    kernel) with the decode kernels' files. On CPU the interpreter runs a Python emulation of the inline PTX, so the
    PTX itself and the CUDA kernels are checked only there."""
    script = (Path(__file__).resolve().parents[2] / "kernels" / "gpu_run.sh").read_text()
    run = script[script.index("$PY -m pytest"):script.index("--junitxml")]
    for name in ("test_kernel_gemv.py", "test_kernel_moe.py", "test_kernel_packed_mm.py"):
        assert f"tests/level1_5_kernels/{name}" in run, f"kernels/gpu_run.sh does not run {name}"


def test_dense_refuses_a_bias_that_is_not_n_long():
    """The kernels (and the bf16-copy path's addmm, which broadcasts a [1] bias) read N elements of the bias."""
    x, p, bias, _ = _dense_case(17, 40, 96, 0)
    for bad in (bias[:39], torch.cat([bias, bias[:1]]), bias[:1]):
        with pytest.raises(ValueError, match=rf"bias must be \[40\], got \[{bad.numel()}\]"):
            mxfp4_mm_packed(x, p, bad)


@pytest.mark.parametrize("m,n,k", [(37, 48, 192), (17, 40, 96), (5, 16, 64)])
def test_dense_matches_reference(m, n, k):
    """Ragged token blocks (37 = 2x16 + 5), a ragged row tile (40) and a padded K chunk (96)."""
    seed = fresh_seed()
    x, p, bias, ref = _dense_case(m, n, k, seed)
    out = poisoned((m, n), torch.bfloat16, DEV)
    mxfp4_mm_packed(x, p, bias, out=out)
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"packed mm M={m} N={n} K={k}")


def _assert_dequantize_is_exact(n: int, k: int, dev: str) -> None:
    seed = fresh_seed()
    g = generator(seed, dev)
    w, s = random_mxfp4((n, k), g, 2, 255)
    s[3, 1] = 255
    got = dequantize_packed(pack_mxfp4(w, s))
    want = dequantize_mxfp4(w, s, torch.float32)
    assert got.dtype == torch.bfloat16 and got.shape == (n, k)
    assert torch.equal(got.float().isnan(), want.isnan()), f"NaN blocks differ (seed={seed})"
    assert torch.equal(got.float().nan_to_num(), want.nan_to_num()), f"dequantized values differ (seed={seed})"


@pytest.mark.parametrize("n,k", [(40, 96), (48, 192)])
def test_dequantize_packed_is_the_checkpoint_dequantization(n, k):
    """The large-M dense path's bf16 copy from the packed bytes: bit for bit the checkpoint's dequantization (every
    E2M1 value times its power-of-two scale is exact in bf16), a ragged row tile (40) and a padded K chunk (96)
    included, over scale bytes 2..254 (from 2 every product is an fp32 normal; bytes 0 and 1 make weights below
    2**-126, which may flush to zero, as the fast kernels read byte 0 as 0; 254 overflows to inf as in the
    reference); a NaN scale (255) poisons exactly its block, as in the reference."""
    _assert_dequantize_is_exact(n, k, DEV)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qkv", "o_proj"])
def test_dequantize_packed_compiled_is_the_checkpoint_dequantization(name):
    """The same, as the compiled kernel the served model runs, at the dense shapes it serves."""
    _assert_dequantize_is_exact(*LINEAR_SHAPES[name], "cuda")


def test_dense_above_dequant_min_m_takes_the_blas_path_and_matches_reference(monkeypatch):
    """From `dequant_min_m` tokens the dense layer multiplies a bf16 copy with the BLAS; below it, with the
    copy over `dequant_max_mib`, or with the knob at 0 it stays on the packed kernels. Both paths meet the dense bound
    (the bias is added in bf16 there, as vLLM's BF16 layers do: NMSE ~4e-6 of the 2e-5)."""
    from kernels import packed_mm

    seed = fresh_seed()
    x, p, bias, ref = _dense_case(37, 40, 96, seed)
    taken = []
    real = packed_mm.dequantize_packed
    monkeypatch.setattr(packed_mm, "dequantize_packed", lambda *a: taken.append(1) or real(*a))
    base = {**get_config("packed_mm"), "impl": "triton"}
    for cfg, expect in (({"dequant_min_m": 37}, True), ({"dequant_min_m": 38}, False), ({"dequant_min_m": 0}, False),
                        ({"dequant_min_m": 1, "dequant_max_mib": 48 * 128 * 2 / 2**20}, True),  # padded 48 x 128
                        ({"dequant_min_m": 1, "dequant_max_mib": (48 * 128 * 2 - 1) / 2**20}, False)):
        for b, want in ((bias, ref), (None, ref - bias.float())):
            taken.clear()
            out = poisoned((37, 40), torch.bfloat16, DEV)
            y = mxfp4_mm_packed(x, p, b, out=out, config={**base, **cfg})
            assert bool(taken) == expect, f"{cfg}: dequantize path {'not ' if expect else ''}taken"
            assert y.data_ptr() == out.data_ptr(), "the result must be written into `out`"
            assert_close_nmse(y, want, GEMV_NMSE, seed, f"packed mm {cfg}, bias {b is not None}")


def test_the_dense_layers_share_one_scratch_copy(monkeypatch):
    """Every dense layer's bf16 copy goes into one buffer per device (vLLM sizes its KV cache from the memory a CUDA
    graph capture holds, and a copy per call was held once per graph piece): a second layer reuses it, a larger one
    replaces it while the old buffer stays allocated (a graph captured earlier still writes it), and every result
    is its own layer's."""
    from kernels import packed_mm

    monkeypatch.setattr(packed_mm, "_SCRATCH", {})
    monkeypatch.setattr(packed_mm, "_RETIRED", [])
    seed = fresh_seed()
    cfg = {**get_config("packed_mm"), "impl": "triton", "dequant_min_m": 1}
    seen, results = [], []
    for n, k in ((40, 96), (16, 64), (48, 192), (40, 96)):
        x, p, bias, ref = _dense_case(9, n, k, seed + n + k)
        results.append((mxfp4_mm_packed(x, p, bias, config=cfg), ref, f"N={n} K={k}"))
        seen.append(packed_mm._SCRATCH[x.device].data_ptr())
    for y, ref, what in results:  # checked after every call: no result may alias the buffer the next one rewrites
        assert_close_nmse(y, ref, GEMV_NMSE, seed, what)
    assert seen[0] == seen[1] and seen[2] == seen[3] and seen[1] != seen[2], seen
    assert [b.data_ptr() for b in packed_mm._RETIRED] == [seen[0]], "the smaller buffer must stay allocated"


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("bias_dtype", BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("m,e,h,inter,k,x_scale,skip", [(20, 6, 64, 96, 3, 40.0, True), (33, 4, 64, 64, 2, 1.0, False)])
def test_moe_matches_reference(m, e, h, inter, k, x_scale, skip, bias_dtype):
    """Grouped path: clamps (x * 40), a skipped slot (-1), ragged I, k not a power of two; fp32 and bf16 biases."""
    seed = fresh_seed()
    x, ids, wts, gu, dn, p, ref = _packed_case(m, e, h, inter, k, seed, x_scale, skip, bias_dtype=bias_dtype)
    out = poisoned((m, h), torch.bfloat16, DEV)
    mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out)
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"packed mm MoE M={m} E={e} k={k} bias {bias_dtype}")


@pytest.mark.parametrize("m,e,k,bm", [(1, 4, 2, 16), (37, 8, 4, 4), (64, 128, 4, 64), (9, 3, 3, 2)])
def test_align_by_expert_places_every_slot_once(m, e, k, bm):
    """Each valid slot appears once, in a block of its own expert; padding is the sentinel; skipped slots
    (-1) appear nowhere; blocks past the last carry expert -1."""
    seed = fresh_seed()
    g = generator(seed, "cpu")
    ids = torch.randint(-1, e, (m, k), generator=g)
    rows, bexp, n_blocks = align_by_expert(ids, e, bm)
    s = m * k
    flat = ids.reshape(-1)
    assert rows.shape == (n_blocks * bm,) and bexp.shape == (n_blocks,), f"seed={seed}"
    real = rows[rows < s].long()
    assert sorted(real.tolist()) == sorted(torch.nonzero(flat >= 0).flatten().tolist()), f"seed={seed}"
    block_of = torch.arange(n_blocks * bm) // bm
    for pos in torch.nonzero(rows < s).flatten().tolist():
        assert int(bexp[block_of[pos]]) == int(flat[rows[pos]]), f"slot {int(rows[pos])} in a block of another expert (seed={seed})"
    used = torch.zeros(n_blocks, dtype=torch.bool).index_fill_(0, block_of[rows < s], True)
    assert torch.equal(used, bexp >= 0), f"a block without slots has an expert, or one with slots none (seed={seed})"
    counts = torch.bincount(flat[flat >= 0], minlength=e)
    assert int((bexp >= 0).sum()) == int(((counts + bm - 1) // bm).sum()), f"blocks per expert (seed={seed})"


@pytest.mark.gpu
@pytest.mark.parametrize("m,e,k,bm", [(2048, 128, 4, 64), (1000, 32, 4, 64), (37, 8, 4, 16), (300, 3, 3, 64), (1, 128, 4, 64)])
def test_cuda_align_by_expert_is_the_torch_sort(m, e, k, bm):
    """The one-launch sort the CUDA MoE prefill runs (cuda_ext.align_by_expert) gives torch's align_by_expert result
    element for element: the same padded runs, slots in the same (stable) order, the same block experts. Rounds of
    1024 slots (2048 x 4), a partial last warp (300 x 3), skipped slots (-1), skewed routing (the first slot of half
    the tokens on expert 0)."""
    from kernels import cuda_ext

    ok, why = cuda_ext.available()
    if not ok:
        pytest.skip(f"CUDA kernels not built: {why}")
    seed = fresh_seed()
    g = generator(seed, "cuda")
    ids = torch.randint(-1, e, (m, k), generator=g, device="cuda")
    ids[: m // 2, 0] = 0
    want = align_by_expert(ids, e, bm)
    got = cuda_ext.align_by_expert(ids, e, bm)
    assert got[2] == want[2], f"n_blocks (seed={seed})"
    assert torch.equal(got[0], want[0]), f"rows differ from torch's stable sort (seed={seed})"
    assert torch.equal(got[1], want[1]), f"block experts differ (seed={seed})"


def test_the_cuda_sort_refuses_what_its_shared_tables_cannot_hold():
    """CPU: cuda_ext.ALIGN_MAX_EXPERTS is the .cu's ALIGN_MAX_E (its shared-memory tables); a model with more experts
    must take torch's sort, not a launch the C API refuses."""
    import re

    from kernels import cuda_ext

    found = re.search(r"ALIGN_MAX_E = (\d+);", cuda_ext.SRC.read_text())
    assert found and int(found.group(1)) == cuda_ext.ALIGN_MAX_EXPERTS


@pytest.mark.gpu
def test_moe_output_the_combine_cannot_write_takes_the_zeroed_sum():
    """An fp32 output (not the one-pass combine's bf16) is served by torch's sum over zeroed rows: a skipped slot
    (-1) must still add nothing."""
    cfg = _impl_cfg("cuda")
    seed = fresh_seed()
    x, ids, wts, gu, dn, p, ref = _packed_case(40, 6, 64, 96, 3, seed, 1.0, True, dev="cuda")
    out = poisoned((40, 64), torch.float32, "cuda")
    mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out, config=cfg)
    assert_close_nmse(out, ref, MOE_NMSE, seed, "CUDA prefill MoE into an fp32 output")


def _impl_cfg(impl: str, variant: int | None = None) -> dict:
    """packed_mm's config with the implementation forced; `cuda` skips (with the reason) where it cannot be built,
    so a CUDA test never passes on the Triton fallback."""
    if impl == "dequant":  # the dense layers' path from dequant_min_m tokens: their bf16 copy times cuBLAS
        return {**get_config("packed_mm"), "dequant_min_m": 1}
    cfg = {**get_config("packed_mm"), "impl": impl, "dequant_min_m": 0}
    if impl == "cuda":
        from kernels import cuda_ext

        ok, why = cuda_ext.prefill_available()
        if not ok:
            pytest.skip(f"CUDA prefill kernel not available: {why}")
        if variant is not None:
            if cuda_ext.variant_problem(variant):
                pytest.skip(cuda_ext.variant_problem(variant))
            cfg["cuda_variant"] = variant
    return cfg


def test_sm_90_serves_the_moe_prefill_on_wgmma_and_gb10_on_mma_sync(monkeypatch):
    """The tiling each architecture's tuning serves: on sm_90 the MoE on wgmma (128 token rows, one row tile per warp,
    two CTAs per SM) and the dense layers on mma.sync; on sm_121 (no wgmma) both on mma.sync; weights with scale bytes
    above 128 on the f16 form everywhere. A wgmma tiling asked of a device without wgmma is one line naming the fix."""
    from kernels import cuda_ext
    from kernels.cuda_ext import BF16_MAX_SCALE, FORM_BF16, FORM_F16, FORM_WG
    from kernels.packed import PackedMXFP4
    from kernels.packed_mm import _cuda_variant

    g = generator(fresh_seed(), "cpu")

    def packed(top: int) -> PackedMXFP4:
        w, s = random_mxfp4((16, 64), g, top - 3, top + 1)
        s[0, 0] = top
        return pack_mxfp4(w, s)

    ok, big = packed(BF16_MAX_SCALE), packed(BF16_MAX_SCALE + 1)

    def tiling(arch: str, moe: bool, *ws: PackedMXFP4, **over) -> tuple[int, int, int, int]:
        cfg = {**{k: v for k, v in get_config("packed_mm", arch).items() if k != "cuda_variant"}, **over}
        return PF_VARIANTS[_cuda_variant(cfg, moe, *ws)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert tiling("sm_90", True, ok, ok) == (16, 1, 2, FORM_WG)
    assert tiling("sm_90", False, ok) == (8, 2, 1, FORM_BF16), "the dense layers stay on mma.sync"
    assert tiling("sm_90", True, ok, big)[3] == FORM_F16, "wgmma is a bf16 form: a scale byte of 129 overflows it"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (12, 1))
    assert tiling("sm_121", True, ok, ok) == (8, 2, 2, FORM_BF16)
    assert tiling("sm_121", False, ok) == (8, 2, 1, FORM_BF16)
    wg = PF_VARIANTS.index((16, 1, 2, FORM_WG))
    assert "only sm_90" in cuda_ext.variant_problem(wg)
    with pytest.raises(ValueError, match="cuda_moe_form wgmma: .*only sm_90.*; set it to bf16"):
        tiling("sm_121", True, ok, ok, cuda_moe_form="wgmma", cuda_moe_tokens=128, cuda_moe_row_tiles=1)
    with pytest.raises(ValueError, match="cuda_variant .*only sm_90"):
        tiling("sm_121", True, ok, ok, cuda_variant=wg)
    with pytest.raises(ValueError, match="cuda_moe_form must be one of bf16, f16, wgmma"):
        tiling("sm_90", True, ok, ok, cuda_moe_form="wmma")


def test_the_moe_down_half_takes_its_own_tiling_only_over_gate_ups_token_blocks(monkeypatch):
    """Down may have its own row tiles and CTAs per SM (`cuda_moe_down_*`, or `cuda_down_variant`), and without them
    takes gate_up's; a down tiling with other token rows per CTA or another form could not read gate_up's h (other
    blocks, other layout) and is refused in one line naming the keys."""
    from kernels.cuda_ext import FORM_BF16, FORM_WG
    from kernels.packed_mm import _moe_variants

    g = generator(fresh_seed(), "cpu")
    w, s = random_mxfp4((16, 64), g, 120, 127)
    p = pack_mxfp4(w, s)
    _on_hopper(monkeypatch)
    base = {k: v for k, v in get_config("packed_mm", "sm_90").items() if not k.startswith("cuda_moe_down_")}

    def tilings(**over) -> tuple[tuple, tuple]:
        v, vd = _moe_variants({**base, **over}, p, p)
        return PF_VARIANTS[v], PF_VARIANTS[vd]

    assert tilings() == ((16, 1, 2, FORM_WG), (16, 1, 2, FORM_WG)), "no down keys: down runs gate_up's tiling"
    assert tilings(cuda_moe_down_row_tiles=2, cuda_moe_down_ctas_per_sm=1) == ((16, 1, 2, FORM_WG), (16, 2, 1, FORM_WG))
    wide = PF_VARIANTS.index((16, 2, 1, FORM_WG))
    assert tilings(cuda_variant=PF_VARIANTS.index((16, 1, 2, FORM_WG)), cuda_down_variant=wide)[1] == (16, 2, 1, FORM_WG)
    with pytest.raises(ValueError, match="cannot read the h of gate_up's .*cuda_moe_down_"):
        tilings(cuda_moe_down_tokens=64, cuda_moe_down_row_tiles=1)  # NT 8: other token blocks
    with pytest.raises(ValueError, match="cannot read the h of gate_up's"):
        tilings(cuda_variant=PF_VARIANTS.index((8, 2, 1, FORM_BF16)), cuda_down_variant=PF_VARIANTS.index((8, 2, 1, 0)))


def test_the_moe_down_half_takes_its_own_tiling_only_where_experts_hold_enough_slots(monkeypatch):
    """`cuda_moe_down_min_slots`: down's own tiling serves a call only where its mean slots per expert (tokens x top_k
    / experts) reach it, gate_up's below; a misconfigured down tiling is still refused at every size."""
    from kernels.cuda_ext import FORM_WG
    from kernels.packed_mm import _moe_variants

    g = generator(fresh_seed(), "cpu")
    w, s = random_mxfp4((3, 16, 64), g, 120, 127)
    p = pack_mxfp4(w, s)  # 3 experts
    _on_hopper(monkeypatch)
    # the sparse calls' own tiling off: this is the down threshold's test (the next test is the sparse rule's)
    cfg = {**get_config("packed_mm", "sm_90"), "cuda_moe_down_row_tiles": 2, "cuda_moe_down_ctas_per_sm": 1,
           "cuda_moe_down_min_slots": 192, "cuda_moe_sparse_tokens": 0}

    def down_tiling(slots: int | None, **over) -> tuple:
        return PF_VARIANTS[_moe_variants({**cfg, **over}, p, p, slots)[1]]

    own, gate_ups = (16, 2, 1, FORM_WG), (16, 1, 2, FORM_WG)
    assert down_tiling(3 * 192) == own, "192 slots per expert: down's own tiling"
    assert down_tiling(3 * 192 - 1) == gate_ups, "just under 192 per expert: gate_up's"
    assert down_tiling(None) == own, "no call size (a tiling report): the tiling the keys name"
    assert down_tiling(1, cuda_moe_down_min_slots=0) == own, "unset threshold: always its own"
    with pytest.raises(ValueError, match="cannot read the h of gate_up's"):
        down_tiling(1, cuda_moe_down_tokens=64, cuda_moe_down_row_tiles=1, cuda_moe_down_ctas_per_sm=2)  # NT 8


def test_the_moe_takes_64_token_rows_per_cta_where_experts_are_sparse(monkeypatch):
    """`cuda_moe_sparse_tokens` / `_max_slots` (sm_90: 64 / 64): a call whose mean slots per expert, rounded down as
    triton_kernels' routing rounds it, is at most 64 runs both halves at 64 token rows per CTA, down's own tiling
    aside (it could not read 64-row blocks); a denser call, a tiling report (no call size) and explicit variants keep
    the keys' tiling; a sparse size with no such tiling, or sparse rows with no threshold, are refused in one line
    naming the key. The served 120b's 2048-token prefill (64 per expert) is the sparse case, also with a decode
    request beside it (2049 tokens); the 20b's (256) is not."""
    from kernels.cuda_ext import FORM_WG
    from kernels.packed_mm import _moe_variants

    g = generator(fresh_seed(), "cpu")
    w, s = random_mxfp4((4, 16, 64), g, 120, 127)
    p = pack_mxfp4(w, s)  # 4 experts
    _on_hopper(monkeypatch)
    cfg = get_config("packed_mm", "sm_90")

    def tilings(slots: int | None, **over) -> tuple[tuple, tuple]:
        v, vd = _moe_variants({**cfg, **over}, p, p, slots)
        return PF_VARIANTS[v], PF_VARIANTS[vd]

    sparse, dense = (8, 1, 2, FORM_WG), (16, 1, 2, FORM_WG)
    assert tilings(4 * 64) == (sparse, sparse), "64 slots per expert: 64 token rows, both halves"
    assert tilings(4 * 64 + 3) == (sparse, sparse), "64.75 per expert rounds down to 64 (a prefill + one decode)"
    assert tilings(1) == (sparse, sparse), "a fraction of a slot per expert is sparse too"
    assert tilings(4 * 65) == (dense, dense), "65 per expert: the 128-row tiling"
    assert tilings(None) == (dense, dense), "no call size (a tiling report): the tiling the keys name"
    assert tilings(4 * 64, cuda_moe_sparse_tokens=0) == (dense, dense), "unset: one tiling at every size"
    own = {"cuda_moe_down_row_tiles": 2, "cuda_moe_down_ctas_per_sm": 1}
    assert tilings(4 * 64, **own) == (sparse, sparse), "down's own 128-row tiling does not serve a sparse call"
    assert tilings(4 * 256, **own) == (dense, (16, 2, 1, FORM_WG)), "nor is it lost on a dense one"
    forced = PF_VARIANTS.index(dense)
    assert tilings(4 * 64, cuda_variant=forced) == (dense, dense), "an explicit variant is served as given"
    wide = (16, 2, 1, FORM_WG)
    assert tilings(4 * 64, cuda_down_variant=PF_VARIANTS.index(wide)) == (dense, wide), "explicit down: as given"
    with pytest.raises(ValueError, match="cuda_moe_sparse_tokens 32: no CUDA prefill tiling"):
        tilings(4 * 64, cuda_moe_sparse_tokens=32)
    with pytest.raises(ValueError, match="cuda_moe_sparse_tokens 64 needs cuda_moe_sparse_max_slots"):
        tilings(4 * 256, cuda_moe_sparse_max_slots=0)
    with pytest.raises(ValueError, match="cannot read the h of gate_up's"):  # a misconfigured down: refused at any size
        tilings(4 * 64, cuda_moe_down_tokens=64, cuda_moe_down_row_tiles=1)


def test_live_row_staging_serves_only_calls_with_few_slots_per_expert():
    """`cuda_moe_live_rows_max_slots`: a MoE call whose mean slots per expert, rounded down, is at most the key stages
    padding rows as zeros (both halves); a denser call, the key at 0 (the served tuning until a GPU run) or a source
    without those kernels (an earlier build in an A/B) does not; the source is asked only when the rule applies (it is
    loaded per call); a negative key is refused in one line naming it."""
    from kernels.packed_mm import _moe_live_rows

    asked = []

    def has(answer: bool):
        return lambda: asked.append(answer) or answer

    on = {"cuda_moe_live_rows_max_slots": 16}
    assert _moe_live_rows(on, 32 * 4, 32, has(True)), "4 slots per expert (the 20b at 32 tokens): live rows"
    assert _moe_live_rows(on, 16 * 128 + 127, 128, has(True)), "16.99 per expert rounds down to 16"
    assert not _moe_live_rows(on, 17 * 128, 128, has(True)), "17 per expert: padding rows copied as before"
    assert not _moe_live_rows(on, 4, 32, has(False)), "a source without the live kernels runs as it always did"
    assert asked == [True, True, False], asked
    asked.clear()
    assert not _moe_live_rows({}, 4, 32, has(True)) and not _moe_live_rows(on, 2048 * 4, 32, has(True))
    assert asked == [], "the source is not asked where the rule does not apply"
    assert get_config("packed_mm", "sm_90")["cuda_moe_live_rows_max_slots"] == 0, "not served before a GPU run"
    with pytest.raises(ValueError, match="cuda_moe_live_rows_max_slots must be >= 0"):
        _moe_live_rows({"cuda_moe_live_rows_max_slots": -1}, 4, 32, has(True))


def _on_hopper(monkeypatch) -> None:
    """This process as an sm_90 device (wgmma available) for the host-side checks; no kernel runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))


def test_the_bf16_and_wgmma_forms_read_the_activation_rows_as_they_are(monkeypatch):
    """Both bf16 forms (mma.sync and wgmma) take the bf16 activation rows as they are and only the f16 form takes
    xprep's fragments: a wgmma tiling handed fragments (or an f16 tiling handed bf16 rows) would read int32 words as
    bf16 activations (CPU: the fragment prep is faked, nothing is launched)."""
    from kernels import cuda_ext
    from kernels.cuda_ext import FORM_BF16, FORM_F16, FORM_WG, reads_bf16_rows
    from kernels.packed_mm import _activation

    assert {v[3] for v in PF_VARIANTS} == {FORM_F16, FORM_BF16, FORM_WG}, "a form this test does not know"
    x = torch.randn(24, 64, generator=generator(fresh_seed(), "cpu")).to(torch.bfloat16)
    frags, scale = torch.zeros(24, 64, dtype=torch.int32), torch.ones(24)
    prepped = []
    monkeypatch.setattr(cuda_ext, "activation_frags", lambda x, kc, src="": prepped.append(kc) or (frags, scale))
    for v, (_, _, _, form) in enumerate(PF_VARIANTS):
        rows = form in (FORM_BF16, FORM_WG)
        assert reads_bf16_rows(v) is rows, f"variant {v} (form {form})"
        prepped.clear()
        frag, xdown = _activation(x, 2, v)
        if rows:
            assert not prepped and frag.data_ptr() == x.data_ptr() and xdown is None, f"variant {v}: not x's own rows"
        else:
            assert prepped == [2] and frag is frags and xdown is scale, f"variant {v}: not xprep's fragments"


def test_a_forced_wgmma_variant_refuses_scale_bytes_its_bf16_multiply_overflows(monkeypatch):
    """cuda_variant (KERNELS_PACKED_MM_CUDA_VARIANT) set to a wgmma tiling on Hopper: wgmma multiplies the decoded
    weights by their scale in bf16 like the mma.sync bf16 form, so weights with a scale byte above 128 are refused
    with the fix named, not served wrong; below that the forced variant is served."""
    from kernels.cuda_ext import BF16_MAX_SCALE, FORM_WG
    from kernels.packed_mm import _cuda_variant

    _on_hopper(monkeypatch)
    g = generator(fresh_seed(), "cpu")

    def packed(top: int):
        w, s = random_mxfp4((16, 64), g, top - 3, top + 1)
        s[0, 0] = top
        return pack_mxfp4(w, s)

    ok, big = packed(BF16_MAX_SCALE), packed(BF16_MAX_SCALE + 1)
    cfg = {k: v for k, v in get_config("packed_mm", "sm_90").items() if k != "cuda_variant"}
    for wg in [i for i, v in enumerate(PF_VARIANTS) if v[3] == FORM_WG]:
        assert _cuda_variant({**cfg, "cuda_variant": wg}, True, ok, ok) == wg
        for ws in ((ok, big), (big, ok)):
            with pytest.raises(ValueError, match=f"cuda_variant {wg} .*cannot multiply scale bytes above 128"):
                _cuda_variant({**cfg, "cuda_variant": wg}, True, *ws)


def test_the_moe_tiling_keys_fall_back_to_the_dense_layers_keys(monkeypatch):
    """The MoE reads cuda_moe_<key> where the tuning gives one, else the dense layers' cuda_<key> (form, token rows,
    row tiles, CTAs per SM): a section or an override (KERNELS_PACKED_MM_CUDA_FORM=f16) that sets only cuda_<key>
    must reach the MoE too, and a cuda_moe_<key> must not reach the dense layers."""
    from kernels.cuda_ext import FORM_BF16, FORM_F16, FORM_WG
    from kernels.packed_mm import _cuda_variant

    _on_hopper(monkeypatch)
    w, s = random_mxfp4((16, 64), generator(fresh_seed(), "cpu"))
    p = pack_mxfp4(w, s)

    def tiling(moe: bool, **cfg) -> tuple[int, int, int, int]:
        return PF_VARIANTS[_cuda_variant(cfg, moe, *((p, p) if moe else (p,)))]

    two = {"cuda_row_tiles": 2, "cuda_ctas_per_sm": 2}
    assert tiling(True, **two) == tiling(False, **two) == (8, 2, 2, FORM_BF16)
    assert tiling(True, **two, cuda_form="f16")[3] == FORM_F16
    wg = {"cuda_form": "wgmma", "cuda_tokens": 128, "cuda_row_tiles": 1, "cuda_ctas_per_sm": 2}
    assert tiling(True, **wg) == (16, 1, 2, FORM_WG)
    moe_only = {"cuda_moe_" + k.removeprefix("cuda_"): v for k, v in wg.items()}
    assert tiling(True, cuda_ctas_per_sm=1, **moe_only) == (16, 1, 2, FORM_WG)
    assert tiling(False, cuda_ctas_per_sm=1, **moe_only) == (8, 2, 1, FORM_BF16)
    assert tiling(True, cuda_form="f16", cuda_moe_form="bf16", **two)[3] == FORM_BF16
    assert tiling(False, cuda_form="f16", cuda_moe_form="bf16", **two)[3] == FORM_F16


def test_the_moe_on_each_tiling_hands_its_kernels_their_own_rows_and_blocks(monkeypatch):
    """_moe_cuda for every prefill variant, the launches recorded instead of run (CPU): the slots are sorted into
    blocks of the variant's 8 * NT token rows, each block one expert's (a tiling of 128 rows fed 64-row blocks reads
    the next expert's slots as its own); the bf16 forms (mma.sync, wgmma) read x's bf16 rows and hand down bf16 h rows,
    the f16 form xprep's fragments and int32 h fragments."""
    from kernels import cuda_ext
    from kernels.cuda_ext import FORM_BF16, FORM_WG, MODE_DOWN, MODE_GATEUP
    from kernels.packed_mm import _moe_cuda

    _on_hopper(monkeypatch)
    seed = fresh_seed()
    x, ids, wts, gu, dn, pm, _ = _packed_case(40, 6, 64, 96, 3, seed, 1.0, True, dev="cpu")
    frags = torch.zeros(40, gu.k_chunks * 32, dtype=torch.int32)
    launches = []
    monkeypatch.setattr(cuda_ext, "align_supported", lambda *a: False)  # packed_mm.align_by_expert: torch, on CPU
    monkeypatch.setattr(cuda_ext, "combine_supported", lambda *a: False)
    monkeypatch.setattr(cuda_ext, "activation_frags", lambda x, kc, src="": (frags, torch.ones(x.shape[0])))
    monkeypatch.setattr(cuda_ext, "prefill_launch", lambda mode, v, frag, xdown, xmul, p, bias, out, **kw:
                        launches.append(dict(mode=mode, v=v, frag=frag, xdown=xdown, p=p, out=out, **kw)))
    for v, (nt, _, _, form) in enumerate(PF_VARIANTS):
        launches.clear()
        _moe_cuda(x, ids, wts, gu, pm["gate_up_bias"], dn, pm["down_bias"], None, {"cuda_variant": v}, 1.702, 7.0)
        up, down = launches
        assert (up["mode"], up["p"], down["mode"], down["p"]) == (MODE_GATEUP, gu, MODE_DOWN, dn)
        assert up["v"] == down["v"] == v
        bm, n_blocks = 8 * nt, up["n_blocks"]
        for launch in (up, down):
            assert launch["rows"].numel() == n_blocks * bm, f"variant {v}: blocks are not {bm} rows"
            assert torch.equal(launch["rows"], up["rows"]) and launch["n_blocks"] == n_blocks
        flat = ids.reshape(-1)
        for b, e in enumerate(up["bexp"].tolist()):
            slots = up["rows"][b * bm:(b + 1) * bm].long()
            slots = slots[slots < flat.numel()]  # padding rows hold S
            assert (flat[slots] == e).all(), f"variant {v} (seed={seed}): block {b} mixes experts"
        if form in (FORM_BF16, FORM_WG):
            assert up["frag"].data_ptr() == x.data_ptr() and up["xdown"] is None, f"variant {v}: not x's bf16 rows"
            assert up["out"].dtype == torch.bfloat16 and up["out"].shape == (ids.numel(), gu.n // 2), \
                f"variant {v}: gate_up does not write bf16 h rows"
        else:
            assert up["frag"] is frags and up["out"].dtype == torch.int32, f"variant {v}: not xprep's fragments"
        assert down["frag"] is up["out"], f"variant {v}: down does not read gate_up's h"


def test_another_kernel_source_reaches_every_prefill_launch(monkeypatch):
    """packed_mm's `cuda_src` (a copy of the kernel source: a same-process A/B, or KERNELS_PACKED_MM_CUDA_SRC in a
    served entry) must reach the dense launches as well as the MoE's, activation prep included: a dense layer that ran
    the served build under another build's name would make the A/B of a dense change an A/A (CPU: launches recorded)."""
    from kernels import cuda_ext, packed_mm
    from kernels.cuda_ext import FORM_F16

    _on_hopper(monkeypatch)
    seen = []
    monkeypatch.setattr(packed_mm, "_cuda_prefill", lambda x, cfg: True)
    monkeypatch.setattr(cuda_ext, "align_supported", lambda *a: False)
    monkeypatch.setattr(cuda_ext, "combine_supported", lambda *a: False)
    monkeypatch.setattr(cuda_ext, "activation_frags", lambda x, kc, src="": seen.append(("xprep", src)) or (
        torch.zeros(x.shape[0], kc * 32, dtype=torch.int32), torch.ones(x.shape[0])))
    monkeypatch.setattr(cuda_ext, "prefill_launch", lambda mode, *a, src="", **kw: seen.append((mode, src)))
    f16 = next(v for v, t in enumerate(PF_VARIANTS) if t[3] == FORM_F16)
    cfg = {"impl": "cuda", "dequant_min_m": 0, "cuda_variant": f16, "cuda_src": "/copies/live.cu"}
    x, p, bias, _ = _dense_case(20, 32, 64, fresh_seed(), "cpu")
    mxfp4_mm_packed(x, p, bias, config=cfg)
    xm, ids, wts, gu, dn, pm, _ = _packed_case(40, 6, 64, 96, 3, fresh_seed(), 1.0, True, dev="cpu")
    packed_mm._moe_cuda(xm, ids, wts, gu, pm["gate_up_bias"], dn, pm["down_bias"], None, cfg, 1.702, 7.0)
    assert [what for what, _ in seen] == ["xprep", cuda_ext.MODE_DENSE, "xprep", cuda_ext.MODE_GATEUP,
                                          cuda_ext.MODE_DOWN], seen
    assert all(src == "/copies/live.cu" for _, src in seen), seen


@pytest.mark.parametrize("rows, combine_ok, f16_ok, want", [
    ("f16", True, True, torch.float16), ("f32", True, True, torch.float32),
    ("f16", False, True, torch.float32),  # torch's zeroed sum: fp32 rows
    ("f16", True, False, torch.float32),  # a source without f16 rows (an A/B against an older build)
])
def test_the_moe_down_kernel_writes_f16_rows_where_the_combine_reads_them(monkeypatch, rows, combine_ok, f16_ok, want):
    """Down's per-slot rows are f16 (half the bytes of fp32) when the one-pass combine sums them and the source has
    them, fp32 otherwise or when the tuning's `cuda_moe_down_rows` says f32; any other value is refused in one line."""
    from kernels import cuda_ext
    from kernels.packed_mm import _moe_cuda

    _on_hopper(monkeypatch)
    x, ids, wts, gu, dn, pm, _ = _packed_case(40, 6, 64, 96, 3, fresh_seed(), 1.0, True, dev="cpu")
    rows_out = []
    monkeypatch.setattr(cuda_ext, "align_supported", lambda *a: False)
    monkeypatch.setattr(cuda_ext, "combine_supported", lambda *a: combine_ok)
    monkeypatch.setattr(cuda_ext, "down_f16_supported", lambda *a: f16_ok)
    monkeypatch.setattr(cuda_ext, "combine", lambda y, ids, e, out, src="": out)
    monkeypatch.setattr(cuda_ext, "prefill_launch", lambda mode, v, frag, xdown, xmul, p, bias, out, **kw:
                        rows_out.append(out) if mode == cuda_ext.MODE_DOWN else None)
    cfg = {**get_config("packed_mm", "sm_90"), "cuda_moe_down_rows": rows}
    _moe_cuda(x, ids, wts, gu, pm["gate_up_bias"], dn, pm["down_bias"], None, cfg, 1.702, 7.0)
    assert [r.dtype for r in rows_out] == [want]
    with pytest.raises(ValueError, match="cuda_moe_down_rows must be f16 or f32"):
        _moe_cuda(x, ids, wts, gu, pm["gate_up_bias"], dn, pm["down_bias"], None, {**cfg, "cuda_moe_down_rows": "bf16"},
                  1.702, 7.0)


def test_the_f16_rows_scale_is_the_kernels():
    """CPU: cuda_ext.DOWN_F16_SHIFT (the tests' reference) is the .cu's, which its down epilogue and combine share."""
    import re

    from kernels import cuda_ext

    found = re.search(r"DOWN_F16_SHIFT = (\d+);", cuda_ext.SRC.read_text())
    assert found and int(found.group(1)) == cuda_ext.DOWN_F16_SHIFT


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("variant", range(len(PF_VARIANTS)))
def test_cuda_prefill_tilings_match_reference(variant):
    """Every tiling of the CUDA prefill kernel (cuda_ext.PF_VARIANTS, both activation forms): dense with ragged token
    blocks (100), a ragged row tile (40), a padded K chunk (96), more row tiles than one CTA takes (N 600); MoE with
    clamps (x * 40), a skipped slot, a ragged I (96), k = 3, and ~35 slots per expert (blocks of 64 whose last token
    tiles are skipped)."""
    seed = fresh_seed()
    cfg = _impl_cfg("cuda", variant)
    for m, n, k in ((100, 40, 96), (70, 600, 192)):
        x, p, bias, ref = _dense_case(m, n, k, seed, "cuda")
        out = poisoned((m, n), torch.bfloat16, "cuda")
        mxfp4_mm_packed(x, p, bias, out=out, config=cfg)
        assert_close_nmse(out, ref, GEMV_NMSE, seed, f"CUDA prefill variant {variant} dense M={m} N={n} K={k}")
    x, ids, wts, gu, dn, pm, ref = _packed_case(70, 6, 64, 96, 3, seed, 40.0, True, dev="cuda")
    out = poisoned((70, 64), torch.bfloat16, "cuda")
    mxfp4_moe_packed_mm(x, ids, wts, gu, pm["gate_up_bias"], dn, pm["down_bias"], out=out, config=cfg)
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"CUDA prefill variant {variant} MoE")


# Slots per expert whose blocks (8 * NT rows) have every live token-tile count, 1..NT, once or more, for NT up to 16,
# even after the test's one skipped slot (the prefill kernel runs a loop unrolled for 2, 4, 6, ... tiles, chosen per
# block): at NT 8, 3 -> 1 tile, 12 -> 2, ... 60 -> 8, 73 -> 8 + 2, 140 -> 8 + 8 + 2; one expert gets none.
LIVE_TILE_COUNTS = [3, 12, 20, 30, 37, 44, 52, 60, 64, 70, 73, 78, 86, 91, 100, 110, 118, 128, 140, 0]


def live_tiles_per_block(slots_per_expert: list[int], nt: int) -> set[int]:
    """The live token-tile counts of the blocks align_by_expert makes from these runs (blocks of 8 * nt rows)."""
    out = set()
    for s in slots_per_expert:
        for b0 in range(0, s, 8 * nt):
            out.add(-(-min(8 * nt, s - b0) // 8))
    return out


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("variant", range(len(PF_VARIANTS)))
@pytest.mark.parametrize("rows", ["f32", "f16"])
def test_cuda_prefill_moe_at_every_live_tile_count(variant, rows):
    """Blocks with 1..NT live token tiles of 8 rows (and an empty expert, a skipped slot, the result allocated by the
    call) against the fp32 reference, with down's per-slot rows in fp32 and in f16 (`cuda_moe_down_rows`: its lanes
    trade halves to store column pairs): a tile count served by the wrong unrolled loop drops or mixes token rows."""
    from .test_kernel_moe import _random_experts

    nt = PF_VARIANTS[variant][0]
    seed = fresh_seed()
    cfg = {**_impl_cfg("cuda", variant), "cuda_moe_down_rows": rows}
    g = generator(seed, "cuda")
    e, h, inter, k = len(LIVE_TILE_COUNTS), 64, 96, 2
    experts = torch.repeat_interleave(torch.arange(e, device="cuda"), torch.tensor(LIVE_TILE_COUNTS, device="cuda"))
    ids = experts[torch.randperm(experts.numel(), generator=g, device="cuda")].view(-1, k)
    ids[5, 1] = -1
    routed = torch.bincount(ids[ids >= 0], minlength=e).tolist()
    assert live_tiles_per_block(routed, nt) == set(range(1, nt + 1)), f"the routing misses a live-tile count at NT {nt}"
    m = ids.shape[0]
    wts = torch.softmax(torch.randn(m, k, generator=g, device="cuda"), dim=-1)
    p = _random_experts(g, e, h, inter)
    x = torch.randn(m, h, generator=g, device="cuda").to(torch.bfloat16)
    gu, dn = pack_moe_experts(p["gate_up_blocks"], p["gate_up_scales"], p["down_blocks"], p["down_scales"])
    keep = ids >= 0
    ref = reference.moe_experts_ref(x, torch.where(keep, ids, 0), wts * keep, **p)
    out = mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], config=cfg)
    assert out.dtype == torch.bfloat16 and out.shape == (m, h)
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"CUDA prefill variant {variant} MoE, live tiles 1..{nt}")


def panel_macro(variant: int) -> str:
    """The macro that orders the down CTAs of the variant's kernel (csrc/mxfp4_mma.cu pf_cta_tile): the wgmma
    kernel's (served at 16 on sm_90a) or the mma.sync kernel's (GB10's MoE prefill; 0 until a GB10 run measures one)."""
    return "MXFP4_DOWN_PANEL" if PF_VARIANTS[variant][3] == FORM_WG else "MXFP4_MMA_DOWN_PANEL"


# Routing for the panel test: per expert 129 or 257 slots (one more than a multiple of 64 and of 128, the token rows
# per CTA of every prefill tiling), so every expert's last block holds one slot and all but the last of the grid's
# ceil(S / bm) + E blocks are live: the last, narrower panel of 4 or 16 has live blocks too (with uniform routing
# about E / 2 empty blocks end the grid, and the narrower panel held none of the real output).
PANEL_EXPERT_SLOTS = (257,) + (129,) * 7
PANEL_TOP_K = 4
PANEL_MAPPING = "grp = q / w;"  # pf_cta_tile's row-group line, which the broken copy changes
LIVE_ROWS_MACRO = "MXFP4_STAGE_LIVE_ROWS"
LIVE_ROWS_LINE = "xrow[u] = srow[r] >= 0 ? srow[r] / a.x_div : -1;"  # pf_stage_rows' live-row staging


def _panel_moe_case(g: torch.Generator) -> tuple:
    """A MoE layer routed by PANEL_EXPERT_SLOTS (every expert's last token block holds one slot), on the GPU: ids [m, k]
    int32, x [m, h] bf16, routing weights, the experts' tensors and their packed gate_up / down."""
    from .test_kernel_moe import _random_experts

    e, h, inter, k = len(PANEL_EXPERT_SLOTS), 1024, 512, PANEL_TOP_K
    m = sum(PANEL_EXPERT_SLOTS) // k
    # slot i goes to token i % m: each expert's run (<= m) lands on distinct tokens, so no token repeats an expert
    order = torch.randperm(e, generator=g, device="cuda")
    flat = torch.repeat_interleave(order, torch.tensor(PANEL_EXPERT_SLOTS, device="cuda"))
    ids = flat.view(k, m).t()[torch.randperm(m, generator=g, device="cuda")].to(torch.int32).contiguous()
    p = _random_experts(g, e, h, inter)
    gu, dn = pack_moe_experts(p["gate_up_blocks"], p["gate_up_scales"], p["down_blocks"], p["down_scales"])
    x = torch.randn(m, h, generator=g, device="cuda").to(torch.bfloat16)
    wts = torch.softmax(torch.randn(m, k, generator=g, device="cuda"), dim=-1)
    return ids, x, wts, p, gu, dn


@pytest.fixture(scope="module")
def macro_copies(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Copies of the kernel source with a macro defined, for the tests that compare them with the served build bit for
    bit: {(macro, value or "broken"): path} (the panels at 0 / 4 / 16, the live-row staging at 1, and a broken copy of
    each), all built at once: ten nvcc builds of ~70 s each one after another would outlast the GPU job's kernel-test
    phase."""
    from concurrent.futures import ThreadPoolExecutor

    from kernels import cuda_ext

    ok, why = cuda_ext.prefill_available()
    if not ok:
        pytest.skip(f"CUDA prefill kernel not available: {why}")
    src = cuda_ext.SRC.read_text()
    assert src.count(PANEL_MAPPING) == 1, f"pf_cta_tile's row-group line {PANEL_MAPPING!r} moved: update the mutation"
    assert src.count(LIVE_ROWS_LINE) == 1, f"pf_stage_rows' live-row line {LIVE_ROWS_LINE!r} moved: update the mutation"
    folder = tmp_path_factory.mktemp("macro_copies")
    copies = {}
    for macro in ("MXFP4_DOWN_PANEL", "MXFP4_MMA_DOWN_PANEL"):
        for panel in ("0", "4", "16"):
            copies[macro, panel] = f"#define {macro} {panel}\n" + src
        copies[macro, "broken"] = f"#define {macro} 16\n" + src.replace(PANEL_MAPPING, "grp = (q / w) & ~1;")
    copies[LIVE_ROWS_MACRO, "1"] = f"#define {LIVE_ROWS_MACRO} 1\n" + src
    # zeroes every staged row but each block's first: real rows lost, which the comparison must see
    copies[LIVE_ROWS_MACRO, "broken"] = f"#define {LIVE_ROWS_MACRO} 1\n" + src.replace(
        LIVE_ROWS_LINE, "xrow[u] = r == 0 ? srow[r] / a.x_div : -1;")
    paths = {}
    for key, text in copies.items():
        paths[key] = folder / f"mxfp4_mma_{key[0].lower()}_{key[1]}.cu"
        paths[key].write_text(text)
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        list(pool.map(cuda_ext.build_shared, paths.values()))
    return paths


@pytest.mark.gpu
@pytest.mark.parametrize("variant", range(len(PF_VARIANTS)))
def test_down_panels_change_only_the_launch_order(variant, macro_copies):
    """The panel macros launch down's CTAs in panels of token blocks: every (token block, row group) must still be
    computed once, so the served build's output is bit for bit that of copies built with panels of 0 (the order of
    before), 4 and 16, in both prefill kernels, the last, narrower panel holding live blocks. The output is fp32, so
    down's rows start zeroed in every build: a tile one build skips cannot read another build's rows from reused
    memory. A copy whose mapping skips the odd row groups must differ (the comparison can fail)."""
    from kernels import cuda_ext

    cfg = {**_impl_cfg("cuda", variant), "cuda_down_variant": variant}  # skips, with the reason, where it cannot run
    macro = panel_macro(variant)
    src = cuda_ext.SRC.read_text()
    served = int(re.search(rf"#define {macro} (\d+)", src).group(1))
    seed = fresh_seed()
    ids, x, wts, p, gu, dn = _panel_moe_case(generator(seed, "cuda"))
    (m, h), bm = x.shape, 8 * PF_VARIANTS[variant][0]
    _, bexp, grid_blocks = align_by_expert(ids, len(PANEL_EXPERT_SLOTS), bm)
    for panel in (4, 16):
        last = grid_blocks // panel * panel
        assert grid_blocks > panel and grid_blocks % panel and (bexp[last:] >= 0).any(), (
            f"{grid_blocks} token blocks of {bm}: a panel of {panel} leaves no narrower last panel with a live block")

    def run(copy: str | None) -> torch.Tensor:
        c = cfg if copy is None else {**cfg, "cuda_src": str(macro_copies[macro, copy])}
        out = poisoned((m, h), torch.float32, "cuda")
        return mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out, config=c)

    base = run(None)
    assert torch.isfinite(base).all(), f"seed {seed}: the served build left rows unwritten"
    for panel in sorted({0, 4, 16} - {served}):
        other = run(str(panel))
        assert torch.equal(base, other), (f"seed {seed}: {macro} {served} (served) and {panel} differ in "
                                          f"{(base != other).any(dim=1).sum().item()} of {m} output rows")
    broken = run("broken")
    assert not torch.equal(base, broken), f"seed {seed}: a mapping that skips odd row groups went unseen"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", range(len(PF_VARIANTS)))
def test_live_row_staging_changes_no_output_bit(variant, macro_copies):
    """MXFP4_STAGE_LIVE_ROWS 1 stages a block's padding rows as zeros instead of copies of its first row: their columns
    are never stored, so the MoE (every expert's last block holding one slot, the panel test's routing) and a dense
    call whose last token block is mostly padding must come out bit for bit as the served build's; a copy that also
    zeroes real rows must differ (the comparison can fail). The served build's live kernels, which
    `cuda_moe_live_rows_max_slots` picks per MoE call, give the same bits too and are seen launched."""
    cfg = {**_impl_cfg("cuda", variant), "cuda_down_variant": variant}  # skips, with the reason, where it cannot run
    seed = fresh_seed()
    ids, x, wts, p, gu, dn = _panel_moe_case(generator(seed, "cuda"))
    (m, h), bm = x.shape, 8 * PF_VARIANTS[variant][0]
    xd, pd, bias, _ = _dense_case(bm + 3, 256, 512, seed + 1, "cuda")  # the last block: 3 real rows of bm

    def run(copy: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        c = cfg if copy is None else {**cfg, "cuda_src": str(macro_copies[LIVE_ROWS_MACRO, copy])}
        moe = mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"],
                                  out=poisoned((m, h), torch.float32, "cuda"), config=c)
        dense = mxfp4_mm_packed(xd, pd, bias, out=poisoned((bm + 3, 256), torch.bfloat16, "cuda"),
                                config=c)
        return moe, dense

    base = run(None)
    assert all(torch.isfinite(t).all() for t in base), f"seed {seed}: the served build left rows unwritten"
    for name, a, b in zip(("MoE", "dense"), base, run("1")):
        assert torch.equal(a, b), (f"seed {seed}: {LIVE_ROWS_MACRO} 1 changed {(a != b).any(dim=1).sum().item()} "
                                   f"of {a.shape[0]} {name} output rows")
    assert not any(torch.equal(a, b) for a, b in zip(base, run("broken"))), \
        f"seed {seed}: a copy that zeroes real rows went unseen"
    # the served build's own live kernels, chosen per call by cuda_moe_live_rows_max_slots: the same bits, and the
    # profiler sees them launched (both halves) where the rule applies and never where it is off
    for most in (0, 10**6):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            moe = mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"],
                                      out=poisoned((m, h), torch.float32, "cuda"),
                                      config={**cfg, "cuda_moe_live_rows_max_slots": most})
            torch.cuda.synchronize()
        live = [e.name for e in prof.events() if "_live_kernel" in e.name]
        assert torch.equal(base[0], moe), f"seed {seed}: cuda_moe_live_rows_max_slots {most} changed the MoE's output"
        assert len(live) == (2 if most else 0), f"cuda_moe_live_rows_max_slots {most}: live kernels launched {live}"


@pytest.mark.gpu
def test_cuda_combine_sums_the_slots_in_order_and_skips_unrouted_ones():
    """The MoE prefill's one-pass combine: each token's k fp32 rows summed in slot order, then rounded to bf16 once,
    bit for bit; rows of slots whose id is outside [0, E) are never written by the down kernel, so they hold anything
    (NaN here) and must not be read; a strided output row is honoured; an output it cannot write is refused."""
    from kernels import cuda_ext
    from kernels.cuda_ext import available, combine, combine_supported

    ok, why = available()
    if not ok:
        pytest.skip(f"CUDA kernels not built: {why}")
    seed = fresh_seed()
    g = generator(seed, "cuda")
    m, k, h = 37, 4, 2880
    ids = torch.randint(0, 128, (m, k), generator=g, device="cuda", dtype=torch.int32)
    ids[3, 0] = ids[7, 2] = ids[7, 3] = -1
    ids[9, 1] = 128  # == E: not an expert of this layer
    y = torch.randn(m * k, h, generator=g, device="cuda") * 3
    routed = (ids >= 0) & (ids < 128)
    y.view(m, k, h)[~routed] = float("nan")
    want = torch.zeros(m, h, device="cuda")
    for j in range(k):  # fp32 adds in slot order: the kernel's order
        want = want + torch.where(routed[:, j, None], y.view(m, k, h)[:, j], 0.0)
    wide = poisoned((m, h + 64), torch.bfloat16, "cuda")
    out = wide[:, 32:32 + h]
    assert combine_supported(out, h)
    combine(y, ids.long(), 128, out)
    assert torch.equal(out, want.to(torch.bfloat16)), f"combine differs from the in-order fp32 sum (seed={seed})"
    assert torch.isnan(wide[:, :32].float()).all() and torch.isnan(wide[:, 32 + h:].float()).all(), \
        f"combine wrote outside its columns (seed={seed})"
    with pytest.raises(ValueError, match="combine_supported"):
        combine(y, ids, 128, out[:-1])  # one row short: it would write past the end
    with pytest.raises(ValueError, match="combine_supported"):
        combine(y, ids, 128, want)  # fp32

    # f16 rows (the down kernel's, value * 2**-DOWN_F16_SHIFT): summed in fp32 in slot order, scaled back, then bf16
    scale = 2.0 ** cuda_ext.DOWN_F16_SHIFT
    y16 = (y / scale).half()
    want16 = torch.zeros(m, h, device="cuda")
    for j in range(k):
        want16 = want16 + torch.where(routed[:, j, None], y16.view(m, k, h)[:, j].float(), 0.0)
    combine(y16, ids, 128, out)
    assert torch.equal(out, (want16 * scale).to(torch.bfloat16)), f"f16 combine differs (seed={seed})"


def test_bf16_form_serves_only_scale_bytes_it_multiplies_exactly():
    """The bf16 form multiplies the decoded weight by 2**(b - 1) in bf16, exact up to b = 128: a weight with a larger
    scale byte must go to the f16 form, for the dense layers and for the MoE (both halves), whether `pack_mxfp4`
    recorded the largest byte or it is read from the tensor."""
    from kernels.cuda_ext import BF16_MAX_SCALE, FORM_BF16, FORM_F16
    from kernels.packed import PackedMXFP4
    from kernels.packed_mm import _cuda_variant

    cfg = {k: v for k, v in get_config("packed_mm").items() if k != "cuda_variant"}
    g = generator(fresh_seed(), "cpu")

    def packed(top: int, record: bool) -> PackedMXFP4:
        w, s = random_mxfp4((16, 64), g, top - 3, top + 1)
        s[0, 0] = top
        p = pack_mxfp4(w, s)
        assert p.max_scale == top
        return p if record else PackedMXFP4(p.words, p.scales, p.n, p.k, p.paired)

    def form(moe: bool, *ws: PackedMXFP4, **over) -> int:
        return PF_VARIANTS[_cuda_variant({**cfg, "cuda_form": "bf16", **over}, moe, *ws)][3]

    for record in (True, False):
        ok, big = packed(BF16_MAX_SCALE, record), packed(BF16_MAX_SCALE + 1, record)
        assert form(False, ok) == FORM_BF16 and form(True, ok, ok) == FORM_BF16
        assert form(False, big) == FORM_F16, "a scale byte of 129 would overflow the bf16 multiply"
        assert form(True, ok, big) == FORM_F16 and form(True, big, ok) == FORM_F16
        assert form(False, ok, cuda_form="f16") == FORM_F16
        forced = next(i for i, v in enumerate(PF_VARIANTS) if v[3] == FORM_BF16)
        with pytest.raises(ValueError, match="cannot multiply scale bytes above 128"):
            _cuda_variant({**cfg, "cuda_variant": forced}, False, big)
        assert _cuda_variant({**cfg, "cuda_variant": forced}, False, ok) == forced


@pytest.mark.gpu
@pytest.mark.parametrize("top", [128, 129])
def test_cuda_prefill_at_the_bf16_scale_edge(top):
    """Scale bytes up to `top` (the largest one in row 0): 128 is the bf16 form's largest (its multiplier 2**127 is
    bf16's largest power of two), 129 must be served by the f16 form. Both agree with the fp32 reference."""
    seed = fresh_seed()
    cfg = _impl_cfg("cuda")
    g = generator(seed, "cuda")
    m, n, k = 70, 48, 128
    w, s = random_mxfp4((n, k), g, top - 4, top + 1)
    s[0, 0] = top
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    ref = reference.mxfp4_linear_ref(x, w, s, None)
    out = poisoned((m, n), torch.bfloat16, "cuda")
    mxfp4_mm_packed(x, pack_mxfp4(w, s), None, out=out, config=cfg)
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"CUDA prefill, scale bytes up to {top}")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["cuda", "triton", "dequant"])
@pytest.mark.parametrize("name", ["qkv", "o_proj", "lm_head"])
@pytest.mark.parametrize("m", [17, 256, 2048])
def test_dense_gpt_oss_shapes(name, m, impl):
    if name == "lm_head" and m > 256:
        pytest.skip("lm_head runs on the sampled positions only (M <= batch size); 2048 would only time the reference")
    if name == "lm_head" and impl == "dequant":
        pytest.skip("the lm_head's bf16 copy (1.1 GiB) is over dequant_max_mib: it stays on the kernels (cuda above)")
    cfg = _impl_cfg(impl)
    n, k = LINEAR_SHAPES[name]
    seed = fresh_seed()
    x, p, bias, ref = _dense_case(m, n, k, seed, "cuda")
    if impl == "dequant":
        assert large_m_path(m, p, cfg) == "bf16 copy + BLAS", f"{name} M={m} does not take the path under test"
    out = poisoned((m, n), torch.bfloat16, "cuda")
    mxfp4_mm_packed(x, p, bias, out=out, config=cfg)
    assert_close_nmse(out, ref, GEMV_NMSE, seed, f"packed mm ({impl}) {name} M={m}")


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("bias_dtype", BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("impl", ["cuda", "triton"])
@pytest.mark.parametrize("m", [17, 32, 512, 2048])
def test_moe_gpt_oss_120b_shapes(m, impl, bias_dtype):
    cfg = _impl_cfg(impl)
    seed = fresh_seed()
    x, ids, wts, gu, dn, p, ref = _packed_case(m, MOE.experts, MOE.hidden, MOE.inter, MOE.top_k, seed, 1.0, True,
                                               dev="cuda", bias_dtype=bias_dtype)
    out = poisoned((m, MOE.hidden), torch.bfloat16, "cuda")
    mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out, config=cfg)
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"packed mm ({impl}) MoE 120b M={m} bias {bias_dtype}")


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("m", [17, 512])
def test_moe_as_marlin_pads_it(m):
    """The 120b layer as vLLM allocates it for its Marlin backend, GB10's default (H 3072, I 2944): the sizes the
    plugin's prefill runs there where vLLM's MoE config does not give the model's own."""
    layer = MOE_MARLIN_PADDED
    seed = fresh_seed()
    x, ids, wts, gu, dn, p, ref = _packed_case(m, layer.experts, layer.hidden, layer.inter, layer.top_k, seed, 1.0,
                                               True, dev="cuda")
    out = poisoned((m, layer.hidden), torch.bfloat16, "cuda")
    mxfp4_moe_packed_mm(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out, config=_impl_cfg("cuda"))
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"packed mm MoE padded as Marlin M={m}")


@pytest.mark.gpu
def test_moe_is_captured_by_a_cuda_graph():
    """vLLM captures batches up to 512 tokens in CUDA graphs: the path must not read anything on the host.
    A replay on new inputs written into the captured buffers must give the eager result of those inputs."""
    from kernels.moe import mxfp4_moe_packed

    seed = fresh_seed()
    m = 32
    x, ids, wts, gu, dn, p, _ = _packed_case(m, MOE.experts, MOE.hidden, MOE.inter, MOE.top_k, seed, dev="cuda")
    x2, ids2, wts2, *_ = _packed_case(m, MOE.experts, MOE.hidden, MOE.inter, MOE.top_k, seed + 1, dev="cuda")
    ids, ids2 = ids.to(torch.int32), ids2.to(torch.int32)
    run = lambda a, i, w: mxfp4_moe_packed(a, i, w, gu, p["gate_up_bias"], dn, p["down_bias"])  # noqa: E731
    run(x, ids, wts)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(x, ids, wts)
    x.copy_(x2), ids.copy_(ids2), wts.copy_(wts2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run(x2, ids2, wts2)), f"graph replay differs from eager (seed={seed})"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qkv", "o_proj"])
@pytest.mark.parametrize("m", [17, 32, 63])
def test_dense_decode_chunks_on_gpt_oss_shapes(name, m, monkeypatch):
    """gemv.packed.decode_chunks_max_m on the GPU: a decode batch of 17-63 tokens through the CUDA decode kernels in
    16-row calls, against the fp32 reference (the decode kernels' tolerance), and replayed by a CUDA graph (vLLM
    captures decode batches) on new activations as eager gives them."""
    from kernels.gemv import PackedLinear

    monkeypatch.setenv("KERNELS_GEMV_PACKED__DECODE_CHUNKS_MAX_M", "63")
    n, k = LINEAR_SHAPES[name]
    seed = fresh_seed()
    x, p, bias, ref = _dense_case(m, n, k, seed, "cuda")
    lin = PackedLinear(p, 16)
    assert lin.path(m) == f"decode kernels, {-(-m // 16)} calls of <= 16 tokens", lin.path(m)
    assert_close_nmse(lin(x, bias), ref, GEMV_NMSE, seed, f"decode chunks {name} M={m}")
    x2 = _dense_case(m, n, k, seed + 1, "cuda")[0]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = lin(x, bias)
    x.copy_(x2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, lin(x2, bias)), f"graph replay differs from eager (seed={seed})"


@pytest.mark.gpu
def test_dense_dequant_path_is_captured_by_a_cuda_graph():
    """vLLM captures batches up to 1,024 tokens, one graph per piece between attention layers, so a graph holds o_proj
    and the next layer's qkv, both through the one scratch buffer. A replay with new activations and new weights
    written into the captured tensors must give the eager result of those: the copy is remade from the weights on
    every replay, not baked in, and the second layer's copy does not disturb the first layer's result."""
    seed = fresh_seed()
    cfg = _impl_cfg("dequant")
    layers = []
    for i, name in enumerate(("o_proj", "qkv")):
        n, k = LINEAR_SHAPES[name]
        x, p, bias, _ = _dense_case(256, n, k, seed + 2 * i, "cuda")
        x2, p2, *_ = _dense_case(256, n, k, seed + 2 * i + 1, "cuda")
        layers.append((x, p, bias, x2, p2))
    run = lambda: [mxfp4_mm_packed(x, p, b, config=cfg) for x, p, b, *_ in layers]  # noqa: E731
    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for x, p, _, x2, p2 in layers:
        x.copy_(x2), p.words.copy_(p2.words), p.scales.copy_(p2.scales)
    graph.replay()
    torch.cuda.synchronize()
    replayed = [y.clone() for y in captured]
    for y, want in zip(replayed, run()):
        assert torch.equal(y, want), f"graph replay differs from eager on new inputs and weights (seed={seed})"


def test_the_bound_catches_a_wrong_fragment_order():
    """Test of the test: the same weights with two lanes' words swapped (a layout bug the decode would not notice)
    must fail the dense bound, and the gate_up rows of every tile rotated by four (row g read as g + 4) must fail
    the MoE bound."""
    from kernels.packed import PackedMXFP4

    seed = fresh_seed()
    x, p, bias, ref = _dense_case(17, 48, 128, seed)
    words = p.words.clone()
    words[..., [0, 5], :] = words[..., [5, 0], :]
    with pytest.raises(AssertionError, match="NMSE"):
        assert_close_nmse(mxfp4_mm_packed(x, PackedMXFP4(words, p.scales, p.n, p.k), bias), ref, GEMV_NMSE, seed, "mutant")
    x, ids, wts, gu, dn, pm, ref = _packed_case(20, 4, 64, 64, 2, seed)
    w = gu.words.clone().reshape(*gu.words.shape[:-2], 8, 4, 4)
    swapped = PackedMXFP4(w.roll(4, dims=-3).reshape(gu.words.shape), gu.scales, gu.n, gu.k, gu.paired)
    with pytest.raises(AssertionError, match="NMSE"):
        assert_close_nmse(mxfp4_moe_packed_mm(x, ids, wts, swapped, pm["gate_up_bias"], dn, pm["down_bias"]), ref,
                          MOE_NMSE, seed, "mutant")
