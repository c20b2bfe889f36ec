"""fp32 references (W4A16 linear, gpt-oss MoE, attention with sinks / sliding window / paged KV)
checked against independent implementations: transformers' gpt-oss modules and a naive loop. CPU."""

from __future__ import annotations

import math

import pytest
import torch

from kernels import mxfp4, reference
from kernels.testing import fresh_seed, generator, nmse

pytestmark = pytest.mark.level1_5


def test_linear_ref_accepts_blocks_and_packed():
    g = generator(fresh_seed())
    w = torch.randn(40, 96, generator=g) * 0.05
    packed, scales = mxfp4.quantize_mxfp4(w)
    x = torch.randn(3, 96, generator=g).to(torch.bfloat16)
    bias = torch.randn(40, generator=g)
    a = reference.mxfp4_linear_ref(x, packed, scales, bias)
    b = reference.mxfp4_linear_ref(x, packed.view(40, 3, 16), scales, bias)
    wd = mxfp4.dequantize_mxfp4(packed, scales).double()
    exp = x.double() @ wd.T + bias.double()
    assert torch.equal(a, b) and a.dtype == torch.float32
    torch.testing.assert_close(a.double(), exp, rtol=1e-6, atol=1e-6)


def test_swiglu_matches_gpt_oss_definition():
    t = torch.tensor([[10.0, -9.0, 0.5, 8.0, -3.0, 0.0]])  # (gate, up) pairs
    out = reference.swiglu_ref(t)
    expect = []
    for gate, up in [(10.0, -9.0), (0.5, 8.0), (-3.0, 0.0)]:
        gate, up = min(gate, 7.0), max(-7.0, min(up, 7.0))
        expect.append((up + 1) * gate / (1 + math.exp(-1.702 * gate)))
    torch.testing.assert_close(out, torch.tensor([expect]), rtol=1e-6, atol=1e-6)


def _random_moe(g: torch.Generator, e: int, h: int, inter: int):
    gate_up = torch.randn(e, 2 * inter, h, generator=g) * 0.1
    down = torch.randn(e, h, inter, generator=g) * 0.1
    gu_b, gu_s = mxfp4.quantize_gpt_oss_experts(gate_up)
    d_b, d_s = mxfp4.quantize_gpt_oss_experts(down)
    return dict(
        router_w=torch.randn(e, h, generator=g) * 0.2,
        router_b=torch.randn(e, generator=g) * 0.1,
        gate_up_blocks=gu_b, gate_up_scales=gu_s, gate_up_bias=torch.randn(e, 2 * inter, generator=g) * 0.1,
        down_blocks=d_b, down_scales=d_s, down_bias=torch.randn(e, h, generator=g) * 0.1,
    )


def test_moe_ref_matches_transformers_gpt_oss_mlp():
    tr = pytest.importorskip("transformers", reason="transformers not installed")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    convert = __import__("transformers.integrations.mxfp4", fromlist=["x"]).convert_moe_packed_tensors
    seed = fresh_seed()
    g = generator(seed)
    e, h, inter, top_k, m = 8, 64, 96, 4, 7
    p = _random_moe(g, e, h, inter)
    cfg = tr.GptOssConfig(hidden_size=h, intermediate_size=inter, num_local_experts=e, num_experts_per_tok=top_k,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=1)
    cfg._experts_implementation = "eager"  # the plain per-expert loop, not a fused kernel
    mlp = GptOssMLP(cfg).float().eval()
    with torch.no_grad():
        mlp.router.weight.copy_(p["router_w"])
        mlp.router.bias.copy_(p["router_b"])
        # transformers' own loader path: dequantize + transpose to [E, in, out].
        mlp.experts.gate_up_proj.copy_(convert(p["gate_up_blocks"], p["gate_up_scales"], dtype=torch.float32))
        mlp.experts.gate_up_proj_bias.copy_(p["gate_up_bias"])
        mlp.experts.down_proj.copy_(convert(p["down_blocks"], p["down_scales"], dtype=torch.float32))
        mlp.experts.down_proj_bias.copy_(p["down_bias"])
        x = torch.randn(1, m, h, generator=g)
        theirs, _ = mlp(x)
    ours = reference.moe_ref(x[0], top_k=top_k, **p)
    # Both are float32 with the same math; only summation order differs (~1e-7 relative).
    err = nmse(ours, theirs[0])
    assert err < 1e-10, f"NMSE {err:.2e} (seed={seed})"


def test_moe_experts_ref_only_touches_selected_experts():
    g = generator(fresh_seed())
    p = _random_moe(g, 6, 32, 32)
    x = torch.randn(2, 32, generator=g)
    ids = torch.tensor([[1, 4], [4, 2]])
    w = torch.tensor([[0.7, 0.3], [0.5, 0.5]])
    a = reference.moe_experts_ref(x, ids, w, p["gate_up_blocks"], p["gate_up_scales"], p["gate_up_bias"],
                                  p["down_blocks"], p["down_scales"], p["down_bias"])
    # Poison experts that were not selected: the result must not change.
    for key in ("gate_up_scales", "down_scales"):
        p[key][[0, 3, 5]] = 255
    b = reference.moe_experts_ref(x, ids, w, p["gate_up_blocks"], p["gate_up_scales"], p["gate_up_bias"],
                                  p["down_blocks"], p["down_scales"], p["down_bias"])
    assert torch.equal(a, b)


# --- attention -----------------------------------------------------------------------------------

ATTN_CASES = [
    # (Tq, Tk, Hq, Hkv, D, window, sinks)
    (9, 9, 4, 2, 8, None, True),  # prefill, full attention
    (12, 12, 4, 1, 8, 5, True),  # prefill, sliding window
    (1, 17, 8, 2, 16, None, True),  # decode
    (1, 17, 8, 2, 16, 4, True),  # decode, window
    (4, 20, 2, 2, 8, 6, False),  # chunked prefill, no sinks
]


@pytest.mark.parametrize("tq,tk,hq,hkv,d,window,use_sinks", ATTN_CASES)
def test_attention_ref_matches_naive_loop(tq, tk, hq, hkv, d, window, use_sinks):
    seed = fresh_seed()
    g = generator(seed)
    q, k, v = (torch.randn(n, hh, d, generator=g) for n, hh in ((tq, hq), (tk, hkv), (tk, hkv)))
    sinks = torch.randn(hq, generator=g) * 2 if use_sinks else None
    scale = d**-0.5
    ours = reference.attention_ref(q, k, v, sinks, scale, window)
    naive = reference.attention_naive(q, k, v, sinks, scale, window)
    torch.testing.assert_close(ours.double(), naive, rtol=1e-5, atol=1e-6, msg=lambda m: f"seed={seed}: {m}")


def test_sinks_lower_the_attention_mass():
    # A huge sink absorbs all probability -> output ~0; a very negative sink -> plain softmax.
    g = generator(fresh_seed())
    q, k, v = torch.randn(3, 2, 8, generator=g), torch.randn(3, 2, 8, generator=g), torch.randn(3, 2, 8, generator=g)
    big = reference.attention_ref(q, k, v, torch.full((2,), 80.0), 0.3)
    assert big.abs().max() < 1e-20
    none = reference.attention_ref(q, k, v, None, 0.3)
    tiny = reference.attention_ref(q, k, v, torch.full((2,), -80.0), 0.3)
    torch.testing.assert_close(none, tiny)


@pytest.mark.parametrize("window", [None, 6])
def test_attention_ref_matches_transformers_eager(window):
    pytest.importorskip("transformers", reason="transformers not installed")
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    seed = fresh_seed()
    g = generator(seed)
    t, hq, hkv, d = 11, 4, 2, 16
    q, k, v = torch.randn(t, hq, d, generator=g), torch.randn(t, hkv, d, generator=g), torch.randn(t, hkv, d, generator=g)
    sinks = torch.randn(hq, generator=g)

    class _Mod(torch.nn.Module):
        num_key_value_groups = hq // hkv

        def __init__(self):
            super().__init__()
            self.sinks = torch.nn.Parameter(sinks.clone())

    pos = torch.arange(t)
    allowed = pos[None, :] <= pos[:, None]
    if window is not None:
        allowed &= pos[:, None] - pos[None, :] < window  # transformers: kv_idx > q_idx - window
    mask = torch.zeros(t, t).masked_fill(~allowed, float("-inf"))[None, None]
    with torch.no_grad():
        theirs, _ = eager_attention_forward(_Mod().eval(), q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                            v.transpose(0, 1)[None], mask, scaling=d**-0.5)
    ours = reference.attention_ref(q, k, v, sinks, d**-0.5, window)
    torch.testing.assert_close(ours, theirs[0], rtol=1e-5, atol=1e-6, msg=lambda m: f"seed={seed}: {m}")


def _block_table(seq_lens: list[int], block_size: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
    """Randomly placed cache blocks per sequence (vLLM shares one table for K and V)."""
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + 3  # spare blocks stay poisoned
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    table = torch.full((len(seq_lens), max(need)), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used:used + n]
        used += n
    return table, num_blocks


def _scatter_paged(seqs: list[torch.Tensor], table: torch.Tensor, num_blocks: int, block_size: int, layout: str):
    """Write each sequence's [T, H, D] into its blocks; everything else is NaN so a stray read shows."""
    h, d = seqs[0].shape[1:]
    shape = (num_blocks, block_size, h, d) if layout == "NHD" else (num_blocks, h, block_size, d)
    cache = torch.full(shape, float("nan"))
    for b, x in enumerate(seqs):
        for i in range(-(-x.shape[0] // block_size)):
            chunk = x[i * block_size:(i + 1) * block_size]
            blk = int(table[b, i])
            if layout == "NHD":
                cache[blk, : chunk.shape[0]] = chunk
            else:
                cache[blk, :, : chunk.shape[0]] = chunk.transpose(0, 1)
    return cache


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("window", [None, 5])
def test_paged_attention_ref_prefill_and_decode(layout, window):
    seed = fresh_seed()
    g = generator(seed)
    hq, hkv, d, bs = 4, 2, 8, 4
    seq_lens = [7, 1, 13]
    query_lens = [7, 1, 1]  # prefill, decode at position 0, decode deep into the context
    ks = [torch.randn(n, hkv, d, generator=g) for n in seq_lens]
    vs = [torch.randn(n, hkv, d, generator=g) for n in seq_lens]
    table, num_blocks = _block_table(seq_lens, bs, g)
    k_cache = _scatter_paged(ks, table, num_blocks, bs, layout)
    v_cache = _scatter_paged(vs, table, num_blocks, bs, layout)
    qsl = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist())
    q = torch.randn(int(qsl[-1]), hq, d, generator=g)
    sinks = torch.randn(hq, generator=g)
    out = reference.paged_attention_ref(q, k_cache, v_cache, table, torch.tensor(seq_lens), qsl, sinks,
                                        d**-0.5, window, layout)
    assert torch.isfinite(out).all(), f"read a poisoned cache slot (seed={seed})"
    for b in range(3):
        s, e = int(qsl[b]), int(qsl[b + 1])
        naive = reference.attention_naive(q[s:e], ks[b], vs[b], sinks, d**-0.5, window)
        torch.testing.assert_close(out[s:e].double(), naive, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"seq {b} seed={seed}: {m}")
