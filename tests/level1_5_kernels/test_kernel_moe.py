"""Triton MXFP4 MoE decode kernel against the fp32 gpt-oss MoE reference.

Tolerance (MOE_NMSE = 5e-5, kernels/cases.py): two BF16 roundings happen where the reference has none. (1) The
SwiGLU output h is stored in BF16 between the two GEMMs (as inference engines do): each element
moves by <= 2**-8 relatively, and after the down projection those independent errors average to
an expected NMSE of ~3e-6. (2) The final output rounds to BF16: NMSE <= 2**-16 = 1.53e-5 (hard
bound). 5e-5 = 1.53e-5 + 10x the expected intermediate term.

What the bound can see: a fault moves NMSE by its share of the output's energy. The biases are therefore drawn at
the scale of what each is added to (`_bias_stds`): gpt-oss-like ones (std 0.5 and 0.1) are invisible at the served
sizes, where a dropped, doubled or other expert's down bias moved NMSE only to 3e-6 .. 4e-5 (H = I = 2880), under
the bound. At these scales each of those faults, the same for the gate_up bias, and gate and up biases swapped,
moves NMSE to >= 0.15 at the served sizes and >= 0.03 at the CPU tests' small ones
(`test_bias_faults_move_nmse_far_above_the_bound`). Biases run in fp32 and in bf16 (what vLLM allocates for
w13_bias / w2_bias); the reference reads the same values upcast to fp32.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import mxfp4, reference
from kernels._triton import INTERPRET
from kernels.cases import MOE, MOE_MARLIN_PADDED, MOE_NMSE, ROUTE_WEIGHTS_TOL
from kernels.moe import moe_forward, mxfp4_moe
from kernels.testing import (
    DEV,
    assert_close_nmse,
    fresh_seed,
    generator,
    nmse,
    poisoned,
    random_mxfp4,
    random_mxfp4_rms,
)
from kernels.tuning import get_config

pytestmark = pytest.mark.level1_5

IMPLS = ["fma16", "dot_scaled", "fma"]


# the biases' dtypes: fp32, and bf16 as vLLM allocates w13_bias / w2_bias for the served model
BIAS_DTYPES = [torch.float32, torch.bfloat16]


def _bias_stds(h: int, inter: int, x_scale: float) -> tuple[float, float]:
    """(gate_up, down) bias standard deviations equal to the rms of the product each is added to, so a bias fault
    moves the output by a share of its energy (module docstring). gate_up: x @ W.T for x ~ N(0, x_scale**2), rms
    x_scale * sqrt(H) * w_rms. down: h @ W.T with h the reference SwiGLU of gate and up ~ N(0, 2 x that**2) (product
    plus bias), its rms sampled (fixed seed: a function of the sizes alone)."""
    w_rms = random_mxfp4_rms()
    gate_up = x_scale * math.sqrt(h) * w_rms
    gu = torch.randn(4096, 2, generator=generator(0)) * (math.sqrt(2) * gate_up)
    h_rms = float(reference.swiglu_ref(gu).pow(2).mean().sqrt())
    return gate_up, h_rms * math.sqrt(inter) * w_rms


def _random_experts(g: torch.Generator, e: int, h: int, inter: int, x_scale: float = 1.0,
                    bias_dtype: torch.dtype = torch.float32):
    gu_p, gu_s = random_mxfp4((e, 2 * inter, h), g)
    d_p, d_s = random_mxfp4((e, h, inter), g)
    dev = g.device
    gu_std, dn_std = _bias_stds(h, inter, x_scale)
    return dict(
        gate_up_blocks=gu_p.view(e, 2 * inter, h // 32, 16), gate_up_scales=gu_s,
        gate_up_bias=(torch.randn(e, 2 * inter, generator=g, device=dev) * gu_std).to(bias_dtype),
        down_blocks=d_p.view(e, h, inter // 32, 16), down_scales=d_s,
        down_bias=(torch.randn(e, h, generator=g, device=dev) * dn_std).to(bias_dtype),
    )


def _routing(g: torch.Generator, m: int, e: int, k: int):
    dev = g.device
    ids = torch.stack([torch.randperm(e, generator=g, device=dev)[:k] for _ in range(m)])
    wts = torch.softmax(torch.randn(m, k, generator=g, device=dev), dim=-1)
    return ids, wts


def _moe_case(m, e, h, inter, k, seed, x_scale=1.0, skip_slots=False, dev=DEV, bias_dtype=torch.float32):
    """(x, ids, weights, experts, fp32 reference) of one random case."""
    g = generator(seed, dev)
    p = _random_experts(g, e, h, inter, x_scale, bias_dtype)
    ids, wts = _routing(g, m, e, k)
    if skip_slots:
        ids[0, -1] = -1  # expert-parallel "not on this rank": contributes nothing
    x = (torch.randn(m, h, generator=g, device=dev) * x_scale).to(torch.bfloat16)
    keep = ids >= 0
    ref = reference.moe_experts_ref(x, torch.where(keep, ids, 0), wts * keep, **p)
    return x, ids, wts, p, ref


def _check(m, e, h, inter, k, impl, seed, x_scale=1.0, skip_slots=False, bias_dtype=torch.float32):
    x, ids, wts, p, ref = _moe_case(m, e, h, inter, k, seed, x_scale, skip_slots, bias_dtype=bias_dtype)
    cfg = get_config("moe")
    cfg["impl"] = impl
    out = poisoned((m, h), torch.bfloat16, DEV)
    mxfp4_moe(x, ids, wts, **p, out=out, config=cfg)
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"moe {impl} M={m} E={e} H={h} I={inter} k={k} bias {bias_dtype}")


# Small shapes (interpreter on CPU): H = I = 32 (one scale block), I not a multiple of the block,
# M = 1 and 2, top-k 2..4.
@pytest.mark.parametrize("bias_dtype", BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m,e,h,inter,k", [(1, 4, 32, 32, 2), (1, 8, 64, 96, 4), (2, 6, 96, 64, 3)])
def test_moe_small_shapes(m, e, h, inter, k, impl, bias_dtype):
    _check(m, e, h, inter, k, impl, fresh_seed(), bias_dtype=bias_dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # interpreter's numpy sigmoid(-big): exact 0
@pytest.mark.parametrize("bias_dtype", BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_moe_clamps_and_skipped_slots(impl, bias_dtype):
    # Large activations push gate/up past the +-7 SwiGLU clamp; a -1 expert id is skipped.
    _check(2, 5, 64, 32, 2, impl, fresh_seed(), x_scale=40.0, skip_slots=True, bias_dtype=bias_dtype)


# Bias faults a kernel could make, applied to the reference's inputs: each must move NMSE far above MOE_NMSE.
BIAS_FAULTS = {
    "down bias dropped": lambda p: {**p, "down_bias": None},
    "down bias of the next expert": lambda p: {**p, "down_bias": p["down_bias"].roll(1, 0)},
    "down bias added twice (e.g. by two K slices)": lambda p: {**p, "down_bias": p["down_bias"] * 2},
    "gate_up bias dropped": lambda p: {**p, "gate_up_bias": None},
    "gate_up bias of the next expert": lambda p: {**p, "gate_up_bias": p["gate_up_bias"].roll(1, 0)},
    "gate_up bias added twice": lambda p: {**p, "gate_up_bias": p["gate_up_bias"] * 2},
    "gate and up biases swapped": lambda p: {**p, "gate_up_bias": p["gate_up_bias"].view(
        p["gate_up_bias"].shape[0], -1, 2).flip(-1).reshape(p["gate_up_bias"].shape)},
}
# The lowest NMSE of any fault above: 0.03 over 200 seeds of each small case below (gate and up biases swapped, one
# token of 2 experts at H = I = 32; 0.07-0.14 at the others), 0.15 over 4 seeds at the served sizes. 100x the bound
# (5e-3) sits 6x below the first and 100x above the roundings the kernels may add (<= MOE_NMSE).
BIAS_FAULT_MIN_NMSE = 100 * MOE_NMSE


@pytest.mark.parametrize("m,e,h,inter,k,x_scale,bias_dtype", [
    # the served sizes the GPU tests run, with the bias dtype vLLM serves (4 experts: each reference call
    # dequantizes every routed expert, ~1 s a call here; the sensitivity does not depend on E)
    (1, 4, MOE.hidden, MOE.inter, MOE.top_k, 1.0, torch.bfloat16),
    # the CPU tests' sizes, clamps included
    *[(*case, dt) for case in [(1, 4, 32, 32, 2, 1.0), (2, 6, 96, 64, 3, 1.0), (2, 6, 64, 96, 3, 40.0)]
      for dt in BIAS_DTYPES],
], ids=lambda v: str(v) if isinstance(v, torch.dtype) else None)
def test_bias_faults_move_nmse_far_above_the_bound(m, e, h, inter, k, x_scale, bias_dtype):
    """Test of the tests: with the cases' biases, every fault in BIAS_FAULTS fails MOE_NMSE by far, the served
    sizes included (there, gpt-oss-like biases moved NMSE only 3e-6 .. 4e-5 on a dropped or doubled down bias)."""
    seed = fresh_seed()
    x, ids, wts, p, ref = _moe_case(m, e, h, inter, k, seed, x_scale, dev="cpu", bias_dtype=bias_dtype)
    for name, fault in BIAS_FAULTS.items():
        err = nmse(reference.moe_experts_ref(x, ids, wts, **fault(p)), ref)
        assert err > BIAS_FAULT_MIN_NMSE, f"{name}: NMSE {err:.1e} <= {BIAS_FAULT_MIN_NMSE:.0e} (seed={seed})"


def _routed_case(seed: int):
    """Two tokens, 8 random MXFP4 experts, a random router, top-4: what a whole MoE forward gets."""
    g = generator(seed, DEV)
    e, h, inter, k = 8, 64, 32, 4
    p = _random_experts(g, e, h, inter)
    router_w = torch.randn(e, h, generator=g, device=DEV) * 0.2
    router_b = torch.randn(e, generator=g, device=DEV) * 0.1
    x = torch.randn(2, h, generator=g, device=DEV).to(torch.bfloat16)
    return x, router_w, router_b, k, p


def test_moe_forward_routes_like_reference():
    seed = fresh_seed()
    x, router_w, router_b, k, p = _routed_case(seed)
    out = moe_forward(x, router_w, router_b, top_k=k, **p)
    ref = reference.moe_ref(x, router_w, router_b, top_k=k, **p)
    assert_close_nmse(out, ref, MOE_NMSE, seed, "moe_forward")


def test_moe_rejects_mismatched_shapes():
    g = generator(0, DEV)
    p = _random_experts(g, 2, 64, 32)
    with pytest.raises(ValueError, match="disagree"):
        mxfp4_moe(torch.zeros(1, 96, dtype=torch.bfloat16, device=DEV), torch.zeros(1, 1, dtype=torch.long),
                  torch.ones(1, 1), **p)


def _moe_entry_points():
    """name -> run(x, ids, weights, experts dict, gate_up bias, down bias): each MoE function callers use, on the
    same experts (checkpoint layout for mxfp4_moe, packed for the others)."""
    from kernels.moe import mxfp4_moe_packed, pack_moe_experts
    from kernels.packed_mm import mxfp4_moe_packed_mm

    def packed(fn):
        def run(x, ids, wts, p, gub, dnb):
            gu, dn = pack_moe_experts(p["gate_up_blocks"], p["gate_up_scales"], p["down_blocks"], p["down_scales"])
            return fn(x, ids, wts, gu, gub, dn, dnb)
        return run

    def checkpoint(x, ids, wts, p, gub, dnb):
        return mxfp4_moe(x, ids, wts, **{**p, "gate_up_bias": gub, "down_bias": dnb})

    return {"mxfp4_moe": checkpoint, "mxfp4_moe_packed": packed(mxfp4_moe_packed),
            "mxfp4_moe_packed_mm": packed(mxfp4_moe_packed_mm)}


# (x rows, ids shape, weights shape): routes for a token x does not have (dropped without a word before), ids and
# weights of different k (a bare torch error deep in the launcher before), ids that are not [M, k]
BAD_ROUTES = {"ids for 2 tokens, x has 1": (1, (2, 2), (2, 2)), "ids k 3, weights k 2": (2, (2, 3), (2, 2)),
              "ids 1-D": (1, (2,), (2,))}


@pytest.mark.parametrize("entry", ["mxfp4_moe", "mxfp4_moe_packed", "mxfp4_moe_packed_mm"])
@pytest.mark.parametrize("case", list(BAD_ROUTES))
def test_moe_refuses_routes_that_do_not_match_x(case, entry):
    rows, ids_shape, wts_shape = BAD_ROUTES[case]
    e, h, inter = 4, 64, 32
    p = _random_experts(generator(0, DEV), e, h, inter)
    x = torch.zeros(rows, h, dtype=torch.bfloat16, device=DEV)
    ids = torch.zeros(ids_shape, dtype=torch.int32, device=DEV)
    wts = torch.full(wts_shape, 0.5, device=DEV)
    with pytest.raises(ValueError, match=rf"must both be \[M, k\] with M = {rows}, x's rows"):
        _moe_entry_points()[entry](x, ids, wts, p, p["gate_up_bias"], p["down_bias"])


@pytest.mark.parametrize("entry", ["mxfp4_moe", "mxfp4_moe_packed", "mxfp4_moe_packed_mm"])
def test_moe_refuses_biases_of_another_shape(entry):
    """gate_up bias [E, 2I], down bias [E, H]: a shorter one was read past its end, a longer one's tail ignored."""
    e, h, inter = 4, 64, 32
    p = _random_experts(generator(0, DEV), e, h, inter)
    x = torch.zeros(1, h, dtype=torch.bfloat16, device=DEV)
    ids, wts = torch.tensor([[0, 1]], device=DEV), torch.full((1, 2), 0.5, device=DEV)
    run = _moe_entry_points()[entry]
    gub, dnb = p["gate_up_bias"], p["down_bias"]
    with pytest.raises(ValueError, match=r"gate_up bias must be \[4, 64\], got \[4, 32\]"):
        run(x, ids, wts, p, gub[:, :inter], dnb)
    with pytest.raises(ValueError, match=r"down bias must be \[4, 64\], got \[4, 72\]"):
        run(x, ids, wts, p, gub, torch.cat([dnb, dnb[:, :8]], dim=1))
    with pytest.raises(ValueError, match=r"down bias must be \[4, 64\], got \[64\]"):
        run(x, ids, wts, p, gub, dnb[0])


@pytest.mark.gpu
@pytest.mark.parametrize("bias_dtype", BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m", [1, 4, 16])
def test_moe_gpt_oss_120b_shapes(m, impl, bias_dtype):
    """kernels.cases.MOE, gpt-oss-120b's layer: 128 experts, top-4 (gate_up hidden -> 2 x inter, down inter -> hidden)."""
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA (compiled Triton); the interpreter covers the small shapes")
    _check(m, MOE.experts, MOE.hidden, MOE.inter, MOE.top_k, impl, fresh_seed(), bias_dtype=bias_dtype)


def test_checkpoint_blocks_and_packed_give_same_result():
    seed = fresh_seed()
    g = generator(seed, DEV)
    p = _random_experts(g, 3, 64, 32)
    ids, wts = _routing(g, 1, 3, 2)
    x = torch.randn(1, 64, generator=g, device=DEV).to(torch.bfloat16)
    a = mxfp4_moe(x, ids, wts, **p)
    q = dict(p)
    q["gate_up_blocks"] = mxfp4.as_packed(p["gate_up_blocks"], p["gate_up_scales"])
    q["down_blocks"] = mxfp4.as_packed(p["down_blocks"], p["down_scales"])
    assert torch.equal(a, mxfp4_moe(x, ids, wts, **q)), f"seed={seed}"


# --- packed experts: the rebuilt pipeline (kernels.moe.*_packed) -----------------------------------
# Tolerance MOE_NMSE as above. The CUDA path keeps h in fp16 * 2**8 (|h| <= 56 by the clamp, so
# 11 significand bits: finer than the BF16 h the bound was derived for); the portable path (packed_mm)
# rounds h to BF16 exactly like the derivation. Products are exact in both (see test_kernel_gemv.py).


def _packed_case(m, e, h, inter, k, seed, x_scale=1.0, skip_slots=False, dev=DEV, bias_dtype=torch.float32):
    from kernels.moe import pack_moe_experts

    x, ids, wts, p, ref = _moe_case(m, e, h, inter, k, seed, x_scale, skip_slots, dev, bias_dtype)
    gu, dn = pack_moe_experts(p["gate_up_blocks"], p["gate_up_scales"], p["down_blocks"], p["down_scales"])
    return x, ids, wts, gu, dn, p, ref


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("bias_dtype", BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("m,e,h,inter,k,x_scale,skip", [(1, 4, 32, 32, 2, 1.0, False), (2, 6, 64, 96, 3, 40.0, True)])
def test_moe_packed_portable(m, e, h, inter, k, x_scale, skip, bias_dtype):
    """Portable path (kernels/packed_mm.py's grouped GEMMs on the same packed bytes): clamps, skipped slot,
    ragged I."""
    from kernels.moe import mxfp4_moe_packed

    seed = fresh_seed()
    x, ids, wts, gu, dn, p, ref = _packed_case(m, e, h, inter, k, seed, x_scale, skip, bias_dtype=bias_dtype)
    out = poisoned((m, h), torch.bfloat16, DEV)
    mxfp4_moe_packed(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out, config={"impl": "portable"})
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"moe packed portable M={m} k={k} bias {bias_dtype}")


def test_moe_forward_packed_routes_like_reference():
    from kernels.moe import moe_forward_packed, pack_moe_experts

    seed = fresh_seed()
    x, router_w, router_b, k, p = _routed_case(seed)
    gu, dn = pack_moe_experts(p["gate_up_blocks"], p["gate_up_scales"], p["down_blocks"], p["down_scales"])
    out = moe_forward_packed(x, router_w, router_b, gu, p["gate_up_bias"], dn, p["down_bias"], top_k=k)
    ref = reference.moe_ref(x, router_w, router_b, top_k=k, **p)
    assert_close_nmse(out, ref, MOE_NMSE, seed, "moe_forward_packed")


def _need_cuda_ext():
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from kernels import cuda_ext

    ok, why = cuda_ext.available()
    assert ok, f"CUDA extension unavailable on a GPU machine: {why}"


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("bias_dtype", BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("m,e,h,inter,k,x_scale,skip", [
    (1, MOE.experts, MOE.hidden, MOE.inter, MOE.top_k, 1.0, False),  # gpt-oss-120b decode
    (4, MOE.experts, MOE.hidden, MOE.inter, MOE.top_k, 1.0, False),
    (16, MOE.experts, MOE.hidden, MOE.inter, MOE.top_k, 1.0, True),
    # the layer as vLLM's Marlin backend (GB10's default) allocates it: H 3072, I 2944
    (1, MOE.experts, MOE_MARLIN_PADDED.hidden, MOE_MARLIN_PADDED.inter, MOE.top_k, 1.0, False),
    (16, MOE.experts, MOE_MARLIN_PADDED.hidden, MOE_MARLIN_PADDED.inter, MOE.top_k, 1.0, True),
    (2, 6, 64, 96, 3, 40.0, True),  # clamps, ragged I (padded chunk), k not dividing 8 warps
    (1, 4, 32, 32, 2, 1.0, False),
])
def test_moe_packed_cuda(m, e, h, inter, k, x_scale, skip, bias_dtype):
    _need_cuda_ext()
    from kernels.moe import mxfp4_moe_packed

    seed = fresh_seed()
    x, ids, wts, gu, dn, p, ref = _packed_case(m, e, h, inter, k, seed, x_scale, skip, dev="cuda",
                                               bias_dtype=bias_dtype)
    for run in range(2):  # twice: cached scratch (h fragments) must not leak between calls
        out = poisoned((m, h), torch.bfloat16, "cuda")
        mxfp4_moe_packed(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out)
        assert_close_nmse(out, ref, MOE_NMSE, seed,
                          f"moe packed cuda M={m} E={e} I={inter} k={k} bias {bias_dtype} run {run}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3])
def test_moe_packed_cuda_back_to_back_routes(m):
    """Down launches before gate_up has finished (programmatic dependent launch) and must wait for its h. Calls with
    different routes, launched back to back with no host sync in between: a down kernel that read h before gate_up
    had written it would read the previous call's h for that slot, so that call's output would match neither its
    reference nor any other. (The calls above repeat one route, where the previous call's h is the same.)"""
    _need_cuda_ext()
    from kernels.moe import mxfp4_moe_packed, pack_moe_experts

    seed = fresh_seed()
    e, h, inter, k = MOE.experts, MOE.hidden, MOE.inter, MOE.top_k
    g = generator(seed, "cuda")
    p = _random_experts(g, e, h, inter)
    gu, dn = pack_moe_experts(p["gate_up_blocks"], p["gate_up_scales"], p["down_blocks"], p["down_scales"])
    x = torch.randn(m, h, generator=g, device="cuda").to(torch.bfloat16)
    routes = [_routing(g, m, e, k) for _ in range(6)]
    outs = [poisoned((m, h), torch.bfloat16, "cuda") for _ in routes]
    for (ids, wts), out in zip(routes, outs):
        mxfp4_moe_packed(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out)
    torch.cuda.synchronize()
    for i, ((ids, wts), out) in enumerate(zip(routes, outs)):
        ref = reference.moe_experts_ref(x, ids, wts, **p)
        assert_close_nmse(out, ref, MOE_NMSE, seed, f"back-to-back call {i} of {len(routes)}, M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("padded", [0, MOE_MARLIN_PADDED.hidden - MOE.hidden])
@pytest.mark.parametrize("router_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_route_kernel_matches_reference(m, router_dtype, padded):
    """One-launch routing: the same experts as fp32 torch routing (ties are measure-zero with random
    logits; order by value), softmax weights to fp32 rounding, ids int32. `padded`: x is the leading columns of a
    wider tensor (the plugin's view of an x vLLM padded for Marlin), read through its row stride without a copy."""
    _need_cuda_ext()
    from kernels.moe import route_packed

    seed = fresh_seed()
    g = generator(seed, "cuda")
    e, h, k = MOE.experts, MOE.hidden, MOE.top_k
    w = (torch.randn(e, h, generator=g, device="cuda") * 0.05).to(router_dtype)
    b = (torch.randn(e, generator=g, device="cuda") * 0.1).to(router_dtype)
    x = torch.randn(m, h + padded, generator=g, device="cuda").to(torch.bfloat16)[:, :h]
    for _ in range(2):  # the last-CTA ticket must reset itself
        ids, wts = route_packed(x, w, b, k)
        rid, rw = reference.route(x, w, b, k)
        assert ids.dtype == torch.int32
        assert torch.equal(ids.long(), rid), f"seed={seed}"
        torch.testing.assert_close(wts, rw, **ROUTE_WEIGHTS_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,e,k", [(1, 128, 4), (16, 128, 4), (40, 128, 4), (2048, 128, 4), (3, 32, 4),
                                   (9, 256, 8), (5, 40, 1)])
def test_topk_from_logits_matches_torch(m, e, k, dtype):
    """The plugin's routing from vLLM's router logits: the k largest logits in torch.topk's order, and
    softmax over them to fp32 rounding. Compared by value, not id: bf16 logits tie often (8-bit
    mantissa; an H200 run had a tie at the 4th place among 40 x 128), and either tied expert is a
    correct top-k. Ids must still be distinct and in range. One warp per row, 8 rows per CTA: M = 40 and
    2048 (a prefill chunk) span several CTAs, 9 ends inside one; E = 32 (gpt-oss-20b), 128 (120b), 256 (all
    8 keys of every lane) and 40 (lanes holding 1 or 2 real keys)."""
    _need_cuda_ext()
    from kernels import cuda_ext

    seed = fresh_seed()
    g = generator(seed, "cuda")
    logits = (torch.randn(m, e, generator=g, device="cuda") * 3).to(dtype)
    ids, wts = cuda_ext.topk_from_logits(logits, k)
    vals, rid = torch.topk(logits.float(), k, dim=-1)
    assert ids.dtype == torch.int32
    assert int(ids.min()) >= 0 and int(ids.max()) < e
    assert all(len(set(row)) == k for row in ids.tolist()), f"seed={seed}: repeated expert"
    assert torch.equal(logits.float().gather(1, ids.long()), vals), f"seed={seed}"
    torch.testing.assert_close(wts, torch.softmax(vals, -1), **ROUTE_WEIGHTS_TOL)


@pytest.mark.gpu
def test_topk_ties_go_to_the_lower_expert_id():
    """Equal logits: the lower expert ids win, in order (the kernel compares order-preserving integer keys, so
    -0.0 must map to +0.0's key; equal values held by one lane and across lanes)."""
    _need_cuda_ext()
    from kernels import cuda_ext

    logits = torch.zeros(4, 128, device="cuda")
    logits[0, 100:] = 1.0  # 28 equal maxima, lanes 4..31 of the last key
    logits[1, 1::2] = -0.0  # -0.0 equals +0.0
    logits[2, 5] = 2.0
    logits[2, 64:] = 1.0  # lanes 0..31 hold two equal keys each (64 + l and 96 + l)
    logits[3] = -1.0
    logits[3, 1::2] = float("nan")  # NaN counts as -inf: the four lowest finite ids
    for dtype in (torch.float32, torch.bfloat16):
        ids, _ = cuda_ext.topk_from_logits(logits.to(dtype), 4)
        assert ids.tolist() == [[100, 101, 102, 103], [0, 1, 2, 3], [5, 64, 65, 66], [0, 2, 4, 6]], dtype


def test_cuda_topk_refuses_what_it_cannot_select():
    """top_k above 8 or above the expert count, or more experts than the kernel's 8 keys per lane hold: a clear
    ValueError (the plugin then routes with torch.topk), never a launch that would leave ids unset."""
    from kernels import cuda_ext

    # the Python gate mirrors the kernel's register array: a drift would send E the kernel refuses at serving time
    assert f"constexpr int TOPK_PL = {cuda_ext.TOPK_MAX_EXPERTS // 32};" in cuda_ext.SRC.read_text()
    assert cuda_ext.topk_supported(128, 4) and cuda_ext.topk_supported(256, 8) and cuda_ext.topk_supported(2, 2)
    for e, k in [(128, 9), (3, 4), (257, 4), (128, 0)]:
        assert not cuda_ext.topk_supported(e, k)
        with pytest.raises(ValueError, match="torch.topk"):
            cuda_ext._check_topk(e, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [8, 40])
def test_topk_gives_valid_distinct_ids_for_non_finite_logits(m, dtype):
    """Rows of NaN, +inf and -inf (vLLM runs padded CUDA-graph rows whose inputs are stale memory): every id
    must still be a distinct expert in range, since the MoE kernels index expert weights with it. An id
    left at its initial 0x7fffffff crashed a served model with an illegal memory access (H200, tiny MXFP4
    model, config gemv-bf16-mxfp4-all). Finite rows must be unaffected: a NaN entry is never chosen over
    a number."""
    _need_cuda_ext()
    from kernels import cuda_ext

    seed = fresh_seed()
    g = generator(seed, "cuda")
    logits = (torch.randn(m, 128, generator=g, device="cuda") * 3).to(dtype)
    logits[1] = float("nan")
    logits[2] = float("inf")
    logits[3] = float("-inf")
    logits[4, ::3] = float("nan")  # partly NaN: the best finite experts win
    ids, _ = cuda_ext.topk_from_logits(logits, 4)
    assert int(ids.min()) >= 0 and int(ids.max()) < 128, f"seed={seed}: ids out of range {ids.min()}..{ids.max()}"
    assert all(len(set(row)) == 4 for row in ids.tolist()), f"seed={seed}: repeated expert"
    finite = torch.nan_to_num(logits[4].float(), nan=float("-inf"))
    assert torch.equal(logits[4].float()[ids[4].long()], torch.topk(finite, 4).values), f"seed={seed}"
    for r in [0] + list(range(5, m)):
        assert torch.equal(logits[r].float()[ids[r].long()], torch.topk(logits[r].float(), 4).values), f"seed={seed} row {r}"


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("down_variant", [6, 7])
@pytest.mark.parametrize("gate_up_variant", range(8))
def test_moe_packed_cuda_every_variant(gate_up_variant, down_variant):
    """Every gate_up tiling (rows per CTA, K split, prefetch depth) with both down variants, on a
    ragged case (I not a multiple of 64, k = 3 not dividing the 8 warps, skipped slots, clamps)."""
    _need_cuda_ext()
    from kernels.moe import mxfp4_moe_packed
    from kernels.tuning import get_config

    seed = fresh_seed()
    x, ids, wts, gu, dn, p, ref = _packed_case(3, 6, 128, 160, 3, seed, 40.0, True, dev="cuda")
    cfg = {**get_config("moe").get("packed", {}), "gate_up_variant": gate_up_variant, "down_variant": down_variant}
    out = poisoned((3, 128), torch.bfloat16, "cuda")
    mxfp4_moe_packed(x, ids, wts, gu, p["gate_up_bias"], dn, p["down_bias"], out=out, config=cfg)
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"gate_up variant {gate_up_variant}, down variant {down_variant}")


@pytest.mark.gpu
def test_moe_forward_packed_gpt_oss_shapes():
    _need_cuda_ext()
    from kernels.moe import moe_forward_packed, pack_moe_experts

    seed = fresh_seed()
    g = generator(seed, "cuda")
    e, h, inter, k = MOE.experts, MOE.hidden, MOE.inter, MOE.top_k
    p = _random_experts(g, e, h, inter)
    router_w = (torch.randn(e, h, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    x = torch.randn(1, h, generator=g, device="cuda").to(torch.bfloat16)
    gu, dn = pack_moe_experts(p["gate_up_blocks"], p["gate_up_scales"], p["down_blocks"], p["down_scales"])
    out = moe_forward_packed(x, router_w, None, gu, p["gate_up_bias"], dn, p["down_bias"], top_k=k)
    ref = reference.moe_ref(x, router_w, None, top_k=k, **p)
    assert_close_nmse(out, ref, MOE_NMSE, seed, "moe_forward_packed 120b")
