"""The vLLM plugin that serves gpt-oss MXFP4 layers with kernels/ (plugins/site/suite_kernels).

Here, without a server: its wrappers run our kernels on the packed copy of vLLM's raw expert layout and
match the fp32 reference at every batch size, keep one copy of the weights (vLLM's tensors freed, its
method never called), refuse to load where the CUDA kernels cannot run, and patch the installed vLLM's
real classes (whose parameters they must pass on). In a
served model: the plugin configurations of configs/flavours/upstream.yaml (moe gemv, layers all),
judged by levels 1.5, 2 and 4 on a GPU.

Tolerances: MOE_NMSE and GEMV_NMSE of kernels/cases.py, as test_kernel_moe.py / test_kernel_gemv.py (same
kernels, same derivation); the plugin adds no arithmetic of its own except the routing softmax, compared exactly
within float32 rounding.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernels import reference
from kernels.cases import GEMV_NMSE, MOE_NMSE, ROUTE_WEIGHTS_TOL
from kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from kernels.testing import DEV, assert_close_nmse, fresh_seed, generator, random_mxfp4
from kernels.tuning import get_config

pytestmark = pytest.mark.level1_5

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "plugins" / "site"
sys.path.insert(0, str(SITE))
import suite_kernels as plugin  # noqa: E402

E, H, INTER, TOP_K = 4, 64, 32, 2


def _vllm_layer(seed: int, inter: int = INTER) -> SimpleNamespace:
    """Expert tensors as vLLM's GptOssMxfp4MoEMethod.create_weights makes them (gate/up rows interleaved)."""
    g = generator(seed)
    w13, s13 = random_mxfp4((E, 2 * inter, H), g)
    w2, s2 = random_mxfp4((E, H, inter), g)
    b13 = (torch.randn(E, 2 * inter, generator=g) * 0.5).to(torch.bfloat16)
    b2 = (torch.randn(E, H, generator=g) * 0.1).to(torch.bfloat16)
    return SimpleNamespace(w13_weight=w13.to(DEV), w13_weight_scale=s13.to(DEV), w2_weight=w2.to(DEV),
                           w2_weight_scale=s2.to(DEV), w13_bias=b13.to(DEV), w2_bias=b2.to(DEV), top_k=TOP_K)


def _reference(layer, x, ids, wts):
    return reference.moe_experts_ref(x, ids.long(), wts, layer.w13_weight, layer.w13_weight_scale, layer.w13_bias,
                                     layer.w2_weight, layer.w2_weight_scale, layer.w2_bias)


class _StockMethod:
    """Stands in for vLLM's class: records what the wrappers hand through."""

    def __init__(self):
        self.calls = []

    def process_weights_after_loading(self, layer):
        self.calls.append(("load", layer))

    def apply_monolithic(self, layer, x, router_logits, input_ids=None):
        self.calls.append(("monolithic", dict(layer=layer, x=x, router_logits=router_logits, input_ids=input_ids)))
        return "stock"

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        self.calls.append(("apply", dict(layer=layer, x=x, topk_weights=topk_weights, topk_ids=topk_ids)))
        return "stock"

    def get_fused_moe_quant_config(self, layer):  # vLLM's reads its backend's state (gone with the freed tensors)
        self.calls.append(("quant_config", layer))
        raise AssertionError("w13_precision_config is None")


@pytest.fixture
def stock():
    cls = type("StockMethod", (_StockMethod,), {})
    plugin.patch_moe(cls, threshold=4)
    return cls()


def test_parts_come_from_the_environment_and_a_typo_is_an_error():
    assert plugin.wanted({}) == set()
    assert plugin.wanted({plugin.ENV: "moe, dense"}) == {"moe", "dense"}
    with pytest.raises(ValueError, match="unknown part"):
        plugin.wanted({plugin.ENV: "moe,gemv"})


def test_the_fused_route_is_opt_in_and_needs_the_plugins_moe():
    assert plugin.route({plugin.ENV: "moe,dense"}) == "vllm"
    assert plugin.route({plugin.ENV: "moe", plugin.ROUTE_ENV: "fused"}) == "fused"
    with pytest.raises(ValueError, match="use one of"):
        plugin.route({plugin.ENV: "moe", plugin.ROUTE_ENV: "fuse"})
    with pytest.raises(ValueError, match="add moe to"):
        plugin.route({plugin.ENV: "dense", plugin.ROUTE_ENV: "fused"})


@pytest.mark.parametrize("m", [1, 3])
def test_small_batches_run_our_kernels_like_the_reference(stock, m):
    seed = fresh_seed()
    layer = _vllm_layer(seed)
    setattr(layer, plugin.MOE_ATTR, plugin.pack_experts(layer))
    g = generator(seed + 1)
    x = torch.randn(m, H, generator=g).to(torch.bfloat16).to(DEV)
    logits = (torch.randn(m, E, generator=g) * 2).to(DEV)
    # routing the way vLLM's fused_topk does it: softmax over all experts, top-k, renormalise
    probs = torch.softmax(logits, dim=-1)
    wts, ids = torch.topk(probs, TOP_K, dim=-1)
    wts = wts / wts.sum(-1, keepdim=True)
    ref = _reference(layer, x, ids, wts)
    out = stock.apply_monolithic(layer=layer, x=x, router_logits=logits)
    assert stock.calls == [], "a small batch reached vLLM's method"
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"plugin monolithic M={m}")
    out = stock.apply(layer=layer, x=x, topk_weights=wts, topk_ids=ids.to(torch.int32), shared_experts=None,
                      shared_experts_input=None)
    assert_close_nmse(out, ref, MOE_NMSE, seed, f"plugin modular M={m}")
    ids_p, wts_p = plugin.route_from_logits(logits, TOP_K)
    assert torch.equal(ids_p.long(), ids), f"seed={seed}"
    torch.testing.assert_close(wts_p, wts, rtol=1e-6, atol=1e-7)


def test_large_batches_run_the_grouped_path_on_the_same_copy(stock):
    """Above the threshold (4 here) the same packed experts serve the batch (kernels.packed_mm); vLLM's method
    is never called, and a layer the plugin did not pack is a one-line error, not a call into freed tensors."""
    seed = fresh_seed()
    layer = _vllm_layer(seed)
    setattr(layer, plugin.MOE_ATTR, plugin.pack_experts(layer))
    g = generator(seed + 1)
    x = torch.randn(9, H, generator=g).to(torch.bfloat16).to(DEV)
    logits = (torch.randn(9, E, generator=g) * 2).to(DEV)
    ids, wts = plugin.route_from_logits(logits, TOP_K)
    out = stock.apply_monolithic(layer=layer, x=x, router_logits=logits)
    assert_close_nmse(out, _reference(layer, x, ids, wts), MOE_NMSE, seed, "plugin monolithic M=9")
    out = stock.apply(layer=layer, x=x, topk_weights=wts, topk_ids=ids, shared_experts=None, shared_experts_input=None)
    assert_close_nmse(out, _reference(layer, x, ids, wts), MOE_NMSE, seed, "plugin modular M=9")
    assert stock.calls == [], "vLLM's method was called"
    with pytest.raises(RuntimeError, match="was not packed at load") as e:
        stock.apply_monolithic(layer=_vllm_layer(1), x=x, router_logits=logits)
    assert "\n" not in str(e.value)


def _storages(tensors) -> list:
    """Weak references to the tensors' memory: an attribute emptied while another reference (a view, a list, the
    old Parameter) keeps the bytes would still hold the second copy."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return [StorageWeakRef(t.untyped_storage()) for t in tensors]


def _alive(storages) -> int:
    import gc

    gc.collect()
    return sum(not ref.expired() for ref in storages)


def test_loading_keeps_one_copy_of_the_experts(stock, monkeypatch):
    """After load the layer holds our packed copy (exactly the loaded codes and scales) and vLLM's expert tensors
    are empty; vLLM's own load step (which would build its backend's second copy) never runs."""
    from kernels.packed import unpack_mxfp4

    monkeypatch.setattr(plugin, "require_cuda_kernels", lambda: None)  # the packing itself runs anywhere
    layer = _vllm_layer(fresh_seed())
    loaded = {n: getattr(layer, n).clone() for n in plugin.EXPERT_TENSORS}
    storages = _storages(getattr(layer, n) for n in plugin.EXPERT_TENSORS)
    stock.process_weights_after_loading(layer)
    assert stock.calls == [], "vLLM's process_weights_after_loading ran"
    assert all(getattr(layer, n).numel() == 0 for n in plugin.EXPERT_TENSORS), "vLLM's expert tensors were kept"
    assert _alive(storages) == 0, "vLLM's expert tensors are still held somewhere (their memory is not freed)"
    p = getattr(layer, plugin.MOE_ATTR)
    assert [torch.equal(a, b) for a, b in zip(unpack_mxfp4(p.gate_up), (loaded["w13_weight"], loaded["w13_weight_scale"]))] == [True, True]
    assert [torch.equal(a, b) for a, b in zip(unpack_mxfp4(p.down), (loaded["w2_weight"], loaded["w2_weight_scale"]))] == [True, True]
    assert stock.moe_quant_config is not None, "the runner would build vLLM's quant config from the freed tensors"
    # vLLM asks for it outside the forward too (its DeepGEMM warm-up): answered without vLLM's method
    assert stock.get_fused_moe_quant_config(layer) is stock.moe_quant_config and stock.calls == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_loading_refuses_in_one_line_where_the_cuda_kernels_cannot_run(stock):
    layer = _vllm_layer(1)
    with pytest.raises(RuntimeError) as e:
        stock.process_weights_after_loading(layer)
    msg = str(e.value)
    assert "\n" not in msg and plugin.ENV in msg and "CUDA" in msg, msg
    assert stock.calls == [] and not hasattr(layer, plugin.MOE_ATTR)


class UnquantizedLinearMethod:  # the name vLLM's BF16 linear method has: install_dense checks it
    def apply(self, layer, x, bias=None):
        return torch.nn.functional.linear(x, layer.weight, bias)


def _dense_model(seed: int) -> torch.nn.Module:
    g = generator(seed)
    root = torch.nn.Module()
    for name, n in (("qkv_proj", 96), ("o_proj", 64), ("router", E), ("lm_head", 128)):
        mod = torch.nn.Module()
        mod.weight = torch.nn.Parameter((torch.randn(n, 64, generator=g) * 0.05).to(torch.bfloat16), requires_grad=False)
        mod.quant_method = UnquantizedLinearMethod()
        root.add_module(name, mod)
    return root.to(DEV)


def test_dense_layers_serve_every_batch_from_one_mxfp4_copy(monkeypatch, capsys):
    from kernels import packed_mm

    seed = fresh_seed()
    monkeypatch.setattr(plugin, "_seen_paths", set())
    monkeypatch.delenv("KERNELS_PACKED_MM_DEQUANT_MIN_M", raising=False)
    monkeypatch.delenv("KERNELS_GEMV_PACKED__DECODE_CHUNKS_MAX_MIB", raising=False)
    monkeypatch.setenv("KERNELS_GEMV_PACKED__DECODE_CHUNKS_MAX_M", "12")  # a decode batch above the threshold
    copies = []
    real = packed_mm.dequantize_packed
    monkeypatch.setattr(packed_mm, "dequantize_packed", lambda *a: copies.append(a[0].n) or real(*a))
    model = _dense_model(seed)
    q, s = quantize_mxfp4(model.qkv_proj.weight.float())
    storages = _storages(getattr(model, n).weight for n in ("qkv_proj", "o_proj", "lm_head"))
    names = plugin.install_dense(model, threshold=4)
    assert sorted(names) == ["lm_head", "o_proj", "qkv_proj"], names
    assert _alive(storages) == 0, "the BF16 weights of the quantized layers are still held (two copies)"
    assert type(model.router.quant_method) is UnquantizedLinearMethod, "the router must stay BF16"
    assert model.router.weight.numel() > 0 and all(getattr(model, n).weight.numel() == 0 for n in names), \
        "the BF16 weights of the quantized layers must be freed (one copy), the router's kept"
    # vLLM's isinstance checks still see its unquantized method; installing twice changes nothing
    assert all(isinstance(getattr(model, n).quant_method, UnquantizedLinearMethod) for n in names)
    assert plugin.install_dense(model, threshold=4) == []
    qkv = model.qkv_proj
    bias = torch.randn(96, generator=generator(seed + 1)).to(torch.bfloat16).to(DEV)
    # the packed GEMM at 21 tokens and the copy from 32, whatever this device's tuning (sm_90 copies from 17)
    monkeypatch.setenv("KERNELS_PACKED_MM_DEQUANT_MIN_M", "32")
    big = get_config("packed_mm")["dequant_min_m"]
    for m in (3, 9, 21, big):  # decode kernels (<= 4 here; in 4-row calls to 12), the packed GEMM, the bf16 copy + BLAS
        x = torch.randn(m, 64, generator=generator(seed + m)).to(torch.bfloat16).to(DEV)
        ref = x.float() @ dequantize_mxfp4(q, s).T + bias.float()
        assert_close_nmse(qkv.quant_method.apply(qkv, x, bias), ref, GEMV_NMSE, seed, f"plugin dense M={m}")
        assert copies == ([96] if m == big else []), f"M={m}: bf16 copies made {copies}"
    logged = [line for line in capsys.readouterr().err.splitlines() if line.startswith("suite_kernels: mxfp4_linear 96x64")]
    assert logged == ["suite_kernels: mxfp4_linear 96x64 M=3 -> decode kernels",
                      "suite_kernels: mxfp4_linear 96x64 M=9 -> decode kernels, 3 calls of <= 4 tokens",
                      "suite_kernels: mxfp4_linear 96x64 M=21 -> packed_mm",
                      f"suite_kernels: mxfp4_linear 96x64 M={big} -> bf16 copy + BLAS"], logged
    with pytest.raises(RuntimeError, match="no qkv_proj"):
        plugin.install_dense(torch.nn.Module(), threshold=4)


def test_eager_dense_calls_skip_the_custom_op_and_agree_with_it(monkeypatch):
    """vLLM computes the logits outside its CUDA graphs: the lm_head runs eagerly every decode step, where the custom
    op's dispatch cost ~30 us of host time per call (H100 host). Eager calls go straight to the layer's PackedLinear;
    the op (what torch.compile puts in the graph) runs the same PackedLinear and gives the same numbers."""
    seed = fresh_seed()
    model = _dense_model(seed)
    plugin.install_dense(model, threshold=4)
    head = model.lm_head
    linear, op = getattr(head.quant_method, plugin.DENSE_ATTR)
    assert plugin._linear_for(linear.p.words, linear.p.scales, linear.p.n, linear.p.k, 4) is linear
    for m in (1, 3, 9):
        x = torch.randn(m, 64, generator=generator(seed + m)).to(torch.bfloat16).to(DEV)
        via_op = op(x, linear.p.words, linear.p.scales, None, linear.p.n, linear.p.k, linear.threshold)
        with monkeypatch.context() as mp:
            mp.setattr(head.quant_method, plugin.DENSE_ATTR, (linear, None))  # an eager call that used the op fails
            eager = head.quant_method.apply(head, x)
        assert torch.equal(eager, via_op), f"M={m}: the eager path and the custom op disagree"
    # traced by torch.compile, the layer is the custom op (one opaque call in the graph), with the layer's own weights
    calls = []
    with monkeypatch.context() as mp:
        mp.setattr(torch.compiler, "is_compiling", lambda: True)
        mp.setattr(head.quant_method, plugin.DENSE_ATTR, (linear, lambda *a: calls.append(a) or "op"))
        assert head.quant_method.apply(head, x) == "op"
    assert len(calls) == 1 and calls[0][1] is linear.p.words and calls[0][4:] == (linear.p.n, linear.p.k, 4)
    # the op's body finds the layer's PackedLinear by its weights; other tensors or another threshold get their own
    assert plugin._linear_for(linear.p.words, linear.p.scales, linear.p.n, linear.p.k, 8) is not linear
    assert plugin._linear_for(linear.p.words, linear.p.scales.clone(), linear.p.n, linear.p.k, 4) is not linear


class _Router(torch.nn.Module):
    """vLLM's ReplicatedLinear as the plugin sees it: weight, bias, and a quant_method whose apply is the GEMM."""

    def __init__(self, w, b):
        super().__init__()
        self.weight, self.bias = torch.nn.Parameter(w, requires_grad=False), torch.nn.Parameter(b, requires_grad=False)
        self.quant_method = UnquantizedLinearMethod()

    def forward(self, x):
        return self.quant_method.apply(self, x, self.bias)


def _moe_model(seed: int, packed: int = 1) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A gpt-oss MLP block: `router` and `experts`, whose submodule holds the packed copy (vLLM 0.26 hands its
    RoutedExperts, not the FusedMoE module, to the MoE method). Returns (model, the layer the method receives)."""
    g = generator(seed)
    layer = _vllm_layer(seed)
    routed = torch.nn.Module()
    routed.top_k = TOP_K
    for _ in range(packed):
        setattr(routed, plugin.MOE_ATTR, plugin.pack_experts(layer))
    experts = torch.nn.Module()
    experts.routed = routed
    if packed > 1:
        experts.other = torch.nn.Module()
        setattr(experts.other, plugin.MOE_ATTR, getattr(routed, plugin.MOE_ATTR))
    block = torch.nn.Module()
    block.router = _Router((torch.randn(E, H, generator=g) * 0.3).to(torch.bfloat16).to(DEV),
                           (torch.randn(E, generator=g) * 0.1).to(torch.bfloat16).to(DEV))
    block.experts = experts
    model = torch.nn.Module()
    model.mlp = block
    return model, routed


@pytest.mark.parametrize("m", [1, 4, 9])
def test_decode_batches_route_from_x_and_skip_the_router_gemm_larger_ones_keep_it(stock, m, monkeypatch):
    """Threshold 4: at M <= 4 the router module returns an unfilled tensor and the MoE routes from x and the
    router's weights (its logits are never read: NaN here); above 4 the router is vLLM's GEMM and the MoE routes
    from its logits. Either way the output is the experts' reference on the fp32 routing of x."""
    seed = fresh_seed()
    model, routed = _moe_model(seed)
    assert plugin.install_route(model, 4) == 1 and plugin.install_route(model, 4) == 1  # idempotent
    router = model.mlp.router
    x = torch.randn(m, H, generator=generator(seed + 1)).to(torch.bfloat16).to(DEV)
    gemms, linear = [], torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **k: gemms.append(1) or linear(*a, **k))
    logits = router(x)
    monkeypatch.setattr(torch.nn.functional, "linear", linear)
    assert logits.shape == (m, E) and len(gemms) == (m > 4), "the router's GEMM ran for a batch the MoE routes itself"
    if m > 4:
        assert torch.equal(logits, torch.nn.functional.linear(x, router.weight, router.bias))
    else:
        logits = torch.full((m, E), float("nan"), device=DEV)  # what an unfilled tensor may hold
    ids, wts = reference.route(x, router.weight, router.bias, TOP_K)
    layer = _vllm_layer(seed)
    want = _reference(layer, x, ids, wts) if m <= 4 else _reference(layer, x, *plugin.route_from_logits(logits, TOP_K))
    out = stock.apply_monolithic(layer=routed, x=x, router_logits=logits)
    assert torch.isfinite(out.float()).all(), f"seed={seed}: the MoE read the router's unfilled logits"
    assert_close_nmse(out, want, MOE_NMSE, seed, f"monolithic, routed from {'x' if m <= 4 else 'logits'} M={m}")
    # the modular path: vLLM routes from the logits first; for a decode batch that routing read the unfilled tensor
    vllm_ids, vllm_wts = plugin.route_from_logits(logits, TOP_K)
    out = stock.apply(layer=routed, x=x, topk_weights=vllm_wts, topk_ids=vllm_ids, shared_experts=None,
                      shared_experts_input=None)
    assert torch.isfinite(out.float()).all(), f"seed={seed}: the MoE used vLLM's routing of the unfilled logits"
    assert_close_nmse(out, want, MOE_NMSE, seed, f"modular, routed from {'x' if m <= 4 else 'logits'} M={m}")
    assert stock.calls == []


def _padded_like_marlin(layer, pad_h: int = 64, pad_i: int = 32, sizes_known: bool = True) -> SimpleNamespace:
    """The same experts as vLLM allocates them for a backend that pads (Marlin, GB10's default: H 2880 -> 3072,
    I 2880 -> 2944): zero rows and columns after the model's own, which the loader never writes. `sizes_known`: the
    MoE config vLLM keeps beside them, with the model's own sizes."""
    f = torch.nn.functional.pad
    inter = layer.w2_weight.shape[2] * 2
    w13 = f(layer.w13_weight.view(E, inter, 2, H // 2), (0, pad_h // 2, 0, 0, 0, pad_i))
    w13 = w13.reshape(E, -1, (H + pad_h) // 2)
    s13 = f(layer.w13_weight_scale.view(E, inter, 2, H // 32), (0, pad_h // 32, 0, 0, 0, pad_i))
    b13 = f(layer.w13_bias.view(E, inter, 2), (0, 0, 0, pad_i)).reshape(E, -1)
    padded = SimpleNamespace(w13_weight=w13, w13_weight_scale=s13.reshape(E, -1, (H + pad_h) // 32), w13_bias=b13,
                             w2_weight=f(layer.w2_weight, (0, pad_i // 2, 0, pad_h)),
                             w2_weight_scale=f(layer.w2_weight_scale, (0, pad_i // 32, 0, pad_h)),
                             w2_bias=f(layer.w2_bias, (0, pad_h)), top_k=TOP_K)
    if sizes_known:
        padded.moe_config = SimpleNamespace(hidden_dim_unpadded=H, intermediate_size_per_partition_unpadded=inter,
                                            hidden_dim=H + pad_h)
    return padded


# I = 64 tiles (our packing needs K % 64): the padding is left out; I = 32 does not, or the sizes are not known: kept
@pytest.mark.parametrize("inter,sizes_known,stripped", [(64, True, True), (32, True, False), (64, False, False)])
@pytest.mark.parametrize("m", [1, 3, 9])
def test_experts_padded_like_marlins_serve_the_unpadded_result(stock, m, inter, sizes_known, stripped):
    """On GB10 vLLM's MoE backend is Marlin, which pads H and I with zeros and x with zero columns. Where vLLM's MoE
    config gives the model's own sizes and they tile, the plugin packs only those: the same bytes as the unpadded
    layer's. Either way the output's model columns are the unpadded layer's (decode kernels at M <= 4, the grouped
    path above) and the padded columns zero, at the width vLLM allocated (it strips them)."""
    seed = fresh_seed()
    layer = _vllm_layer(seed, inter)
    padded = _padded_like_marlin(layer, sizes_known=sizes_known)
    packed = plugin.pack_experts(padded)
    setattr(padded, plugin.MOE_ATTR, packed)
    if stripped:
        own = plugin.pack_experts(layer)
        assert (packed.gate_up.n, packed.gate_up.k, packed.down.n, packed.down.k) == (2 * inter, H, H, inter)
        assert torch.equal(packed.gate_up.words, own.gate_up.words) and torch.equal(packed.down.scales, own.down.scales)
        assert packed.hidden_padded == H + 64
        assert packed.gate_up_bias.is_contiguous() and packed.down_bias.is_contiguous()  # not copied every call
    else:
        assert (packed.gate_up.k, packed.down.k, packed.hidden_padded) == (H + 64, inter + 32, None)
    g = generator(seed + 1)
    x = torch.randn(m, H, generator=g).to(torch.bfloat16).to(DEV)
    logits = (torch.randn(m, E, generator=g) * 2).to(DEV)
    out = stock.apply_monolithic(layer=padded, x=torch.nn.functional.pad(x, (0, 64)), router_logits=logits)
    assert out.shape == (m, H + 64)
    want = _reference(layer, x, *plugin.route_from_logits(logits, TOP_K))
    assert_close_nmse(out[:, :H], want, MOE_NMSE, seed, f"padded like Marlin, M={m}, I={inter}")
    assert torch.equal(out[:, H:], torch.zeros_like(out[:, H:])), f"seed={seed}: padded columns not zero"


def test_a_padded_hidden_state_routes_on_the_routers_own_columns():
    """Backends that pad the MoE's hidden size (Marlin, GB10's default: 2880 -> 3072) hand the MoE x with zero
    columns appended; the router holds the model's columns only. The fused route must give the routing of the
    unpadded x (reading the router as if it had the padded width mixes its rows)."""
    seed = fresh_seed()
    model, routed = _moe_model(seed)
    assert plugin.install_route(model, 4) == 1
    router = model.mlp.router
    x = torch.randn(3, H, generator=generator(seed + 1)).to(torch.bfloat16).to(DEV)
    padded = torch.nn.functional.pad(x, (0, 64))
    ids, wts = plugin.route_for_batch(routed, padded, None, TOP_K, 4)
    want_ids, want_wts = reference.route(x, router.weight, router.bias, TOP_K)
    # as test_kernel_moe.py's route tests judge the kernel: the same experts in value order, fp32 softmax rounding
    assert torch.equal(ids.long(), want_ids), f"seed={seed}"
    torch.testing.assert_close(wts, want_wts, **ROUTE_WEIGHTS_TOL)


def test_a_block_the_plugin_cannot_link_keeps_vllms_router_and_its_logits(stock):
    """Both or neither: a router is taken over only together with the one packed layer that will route from x.
    A block with no packed layer (the plugin did not pack its experts) or two keeps vLLM's router, and its MoE
    routes from vLLM's logits at every M."""
    for packed in (0, 2):
        model, routed = _moe_model(fresh_seed(), packed=packed)
        assert plugin.install_route(model, 4) == 0
        assert type(model.mlp.router.quant_method) is UnquantizedLinearMethod
        assert not hasattr(routed, plugin.ROUTER_ATTR)
    model, routed = _moe_model(fresh_seed())
    model.mlp.router.quant_method = type("Fp8LinearMethod", (), {})()
    assert plugin.install_route(model, 4) == 0 and not hasattr(routed, plugin.ROUTER_ATTR)
    # asked for and linked nowhere: an error, not vLLM's router credited as the fused route
    with pytest.raises(RuntimeError, match="no MoE block of this model") as e:
        plugin.install_route_or_fail(model, 4)
    assert "\n" not in str(e.value)
    assert plugin.install_route_or_fail(_moe_model(fresh_seed())[0], 4) == 1


def test_the_router_op_is_opaque_to_torch_compile_and_branches_at_run_time():
    """vLLM compiles one graph for every batch size: the batch-size branch must live inside the custom op."""
    op = plugin._router_op()
    w = torch.randn(E, H).to(torch.bfloat16)
    b = torch.randn(E).to(torch.bfloat16)
    x = torch.randn(9, H).to(torch.bfloat16)
    assert torch.equal(op(x, w, b, 4), torch.nn.functional.linear(x, w, b))
    assert op(x[:3], w, b, 4).shape == (3, E)
    fake = torch.library.opcheck(op, (x, w, b, 4), test_utils=("test_schema", "test_faketensor"))
    assert all(v == "SUCCESS" for v in fake.values()), fake


def test_register_patches_the_installed_vllm_and_is_idempotent():
    """In a fresh interpreter (the patch is process-wide): the entry point is found the way vLLM looks
    for it, nothing is patched without SUITE_KERNELS, and with it the wrapped methods of the installed
    vLLM take the parameters the wrappers pass on."""
    code = r"""
import inspect, json, os
from importlib.metadata import entry_points
eps = [e.value for e in entry_points(group="vllm.general_plugins") if e.name == "suite_kernels"]
import suite_kernels
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod as C
from vllm.model_executor.model_loader.base_loader import BaseModelLoader as L
os.environ.pop("SUITE_KERNELS", None)
suite_kernels.register()
before = [hasattr(C.apply, "_suite_kernels"), hasattr(L.load_model, "_suite_kernels_load")]
os.environ["SUITE_KERNELS"] = "moe,dense"
suite_kernels.register(); once = C.apply_monolithic
suite_kernels.register()
params = {n: list(inspect.signature(getattr(C, n).__wrapped__).parameters)
          for n in ("process_weights_after_loading", "apply_monolithic", "apply", "get_fused_moe_quant_config")}
print(json.dumps({"eps": eps, "before": before, "idempotent": C.apply_monolithic is once,
                  "dense": hasattr(L.load_model, "_suite_kernels_load"), "params": params}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")])}
    env.pop(plugin.ENV, None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["eps"] == ["suite_kernels:register"], got
    assert got["before"] == [False, False], "SUITE_KERNELS unset must leave vLLM untouched"
    assert got["idempotent"] and got["dense"], got
    assert got["params"] == {
        "process_weights_after_loading": ["self", "layer"],
        "apply_monolithic": ["self", "layer", "x", "router_logits", "input_ids"],
        "apply": ["self", "layer", "x", "topk_weights", "topk_ids", "shared_experts", "shared_experts_input"],
        "get_fused_moe_quant_config": ["self", "layer"],
    }, f"vLLM's MoE method changed its parameters; update plugins/site/suite_kernels: {got['params']}"


@pytest.mark.parametrize("env, why", [
    ({plugin.ENV: "moe", plugin.MAX_M_ENV: "abc"}, "is not an integer"),
    ({plugin.ENV: "moe", plugin.MAX_M_ENV: "1.5"}, "is not an integer"),
    ({plugin.ENV: "moe", plugin.MAX_M_ENV: "0"}, "serve 1..16 tokens"),
    ({plugin.ENV: "moe", plugin.MAX_M_ENV: "-3"}, "serve 1..16 tokens"),
    # above 16 the decode kernels cannot run: dense batches went to the portable Triton path, logged "decode kernels"
    ({plugin.ENV: "moe", plugin.MAX_M_ENV: "32"}, "serve 1..16 tokens"),
    # the plugin off: a route or threshold would be ignored, and a run labelled fused would measure stock
    ({plugin.ROUTE_ENV: "fused"}, "set without SUITE_KERNELS"),
    ({plugin.ENV: " ", plugin.MAX_M_ENV: "8"}, "set without SUITE_KERNELS"),
    ({plugin.ENV: "dense", plugin.ROUTE_ENV: "fused"}, "add moe to"),
])
def test_every_plugin_variable_is_checked_before_the_weights_load_in_one_line(env, why):
    with pytest.raises(ValueError, match=why) as e:
        plugin.check_env(env)
    assert "\n" not in str(e.value)


def test_the_threshold_is_the_variable_else_the_tuning_default_and_never_above_the_decode_kernels(monkeypatch):
    assert plugin.check_env({plugin.ENV: "moe", plugin.MAX_M_ENV: "8"}) == {"moe"}
    assert plugin.max_m({plugin.MAX_M_ENV: "8"}) == 8
    monkeypatch.delenv("KERNELS_GEMV_SMALL_M_THRESHOLD", raising=False)
    assert plugin.max_m({}) == get_config("gemv")["small_m_threshold"]
    monkeypatch.setenv("KERNELS_GEMV_SMALL_M_THRESHOLD", "32")
    with pytest.raises(ValueError, match="KERNELS_GEMV_SMALL_M_THRESHOLD.*serve 1..16"):
        plugin.max_m({})


def test_registering_never_asks_the_device():
    """vLLM calls `register` in its API server too: the tuning lookup of the threshold asks the device's capability,
    which starts CUDA there (memory stock configs do not spend, and vLLM then spawns its workers). Here a device
    that would answer is faked, and asking it fails."""
    code = r"""
import os, torch
torch.cuda.is_available = lambda: True
def asked(*a, **k):
    raise SystemExit("the device was asked at register")
torch.cuda.get_device_capability = asked
torch.cuda.get_device_properties = asked
import suite_kernels
suite_kernels.register()
print("registered")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]),
           plugin.ENV: "moe,dense", plugin.ROUTE_ENV: "fused"}
    for name in (plugin.MAX_M_ENV, "TRITON_INTERPRET"):  # as on a GPU server: the tuning lookup would ask the device
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("registered"), (r.stdout + r.stderr)[-2000:]


def test_the_served_model_gets_the_dense_layers_and_a_drafter_does_not(monkeypatch):
    """The wrapper of vLLM's loader: the served model (no prefix) has its qkv / o / lm_head served from MXFP4 at the
    threshold read at load; a speculative drafter (prefix, by keyword or position) is left as vLLM made it."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    made = []

    def load_model(self, vllm_config, model_config, prefix=""):
        made.append(_dense_model(fresh_seed()))
        return made[-1]

    monkeypatch.setattr(BaseModelLoader, "load_model", load_model)
    monkeypatch.setattr(plugin, "require_cuda_kernels", lambda: None)
    monkeypatch.setenv(plugin.MAX_M_ENV, "4")
    monkeypatch.delenv(plugin.ROUTE_ENV, raising=False)
    plugin.load_threshold.cache_clear()
    try:
        plugin._patch_load({"dense"})
        loader = object.__new__(type("Loader", (BaseModelLoader,), {"download_model": None, "load_weights": None}))
        served = BaseModelLoader.load_model(loader, None, None)
        drafters = [BaseModelLoader.load_model(loader, None, None, prefix="drafter"),
                    BaseModelLoader.load_model(loader, None, None, "drafter")]
    finally:
        plugin.load_threshold.cache_clear()
    assert [hasattr(served.qkv_proj.quant_method, plugin.DENSE_ATTR), served.qkv_proj.weight.numel()] == [True, 0]
    assert getattr(served.lm_head.quant_method, plugin.DENSE_ATTR)[0].threshold == 4
    for d in drafters:
        assert type(d.qkv_proj.quant_method) is UnquantizedLinearMethod and d.qkv_proj.weight.numel() > 0


def test_large_dense_weights_are_quantized_a_slice_of_rows_at_a_time_with_the_same_bytes(monkeypatch):
    """At load the lm_head is quantized in row slices (its float32 temporaries whole would take ~11 GiB beside the
    model); MX blocks run along K, so the slices give exactly the whole matrix's codes and scales."""
    w = (torch.randn(70, 64, generator=generator(fresh_seed())) * 0.05).to(torch.bfloat16).to(DEV)
    whole = quantize_mxfp4(w.float())
    monkeypatch.setattr(plugin, "QUANT_CHUNK_BYTES", 64 * 4 * 8)  # 8 rows a slice: 9 slices, the last of 6 rows
    sliced = plugin.quantize_rows(w)
    assert [torch.equal(a, b) for a, b in zip(sliced, whole)] == [True, True]


def test_a_failing_nvcc_is_one_line_naming_its_log(tmp_path, monkeypatch):
    """nvcc's errors are many lines; a server's log shows the last error line as the boot's cause, so the refusal is
    one line with nvcc's first error and the file holding all of its output."""
    from kernels import cuda_ext

    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "Cuda compilation tools, release 13.2"; exit 0; }\n'
                    'echo "mxfp4_mma.cu(456): error: expected a \\";\\"" >&2\necho "1 error detected" >&2\nexit 2\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KERNELS_DISABLE_CUDA_EXT", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_ext, "_arch", lambda: "90a")
    with pytest.raises(RuntimeError) as e:
        cuda_ext.build_shared(cuda_ext.SRC)
    msg = str(e.value)
    assert "\n" not in msg and "nvcc exited 2" in msg and "error: expected" in msg, msg
    log = Path(msg.rsplit("all of its output: ", 1)[1].rstrip(")"))
    assert "1 error detected" in log.read_text()
    # the plugin's refusal keeps one line whatever the extension says
    monkeypatch.setattr(cuda_ext, "available", lambda: (False, "RuntimeError: first line\nsecond line"))
    with pytest.raises(RuntimeError) as e:
        plugin.require_cuda_kernels()
    assert "\n" not in str(e.value) and "(RuntimeError: first line)" in str(e.value) and "unset SUITE_KERNELS" in str(e.value)
