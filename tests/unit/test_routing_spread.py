"""The routing-spread statistics of scripts/routing_spread.py: a collapsed routing and a uniform one must read
differently, and the window between two snapshots of the hook's counts is their difference."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import routing_spread as rs  # noqa: E402


def test_collapsed_routing_reads_as_collapsed_and_uniform_as_spread():
    collapsed = rs.spread([256, 256, 0, 0] + [0] * 124)  # every token on the same 2 experts (top-2 of 128)
    assert collapsed["hit"] == 2 and collapsed["top_share"] == 0.5 and collapsed["experts_for_90pct"] == 2
    assert collapsed["entropy"] < 0.15
    uniform = rs.uniform_reference(tokens=256, top_k=4, experts=128)
    assert uniform["slots"] == 1024 and uniform["hit"] > 120 and uniform["entropy"] > 0.95
    assert uniform["experts_for_90pct"] > 100 and uniform["top_share"] < 0.03


def test_window_is_the_difference_of_two_snapshots_and_empty_layers_have_no_share():
    before = {"layers": {"l0": [1, 2, 3]}}
    after = {"layers": {"l0": [2, 2, 5], "l1": [0, 0, 4]}}
    assert rs.window(before, after) == {"l0": [1, 0, 2], "l1": [0, 0, 4]}
    assert rs.spread([0, 0, 0])["top_share"] is None


def test_routes_hook_writes_cumulative_counts_once_a_step_is_complete(tmp_path, monkeypatch):
    """The hook flushes when the first layer comes round again (the previous step is then complete)."""
    import json
    from types import SimpleNamespace

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "site"))
    from suite_testhooks import routes

    out = tmp_path / "routes.json"
    monkeypatch.setenv(routes.ROUTES_ENV, str(out))
    monkeypatch.setattr(routes, "_state", {"counts": {}, "calls": 0, "captured": 0, "first_layer": None})
    l0, l1 = SimpleNamespace(layer_name="model.layers.0.mlp.experts"), SimpleNamespace(layer_name="model.layers.1.mlp.experts")
    routes.record(l0, torch.tensor([[0, 1], [1, 2]]), 4)
    routes.record(l1, torch.tensor([[3, 3], [-1, 2]]), 4)  # -1: a slot not on this rank, not counted
    assert not out.exists(), "flushed before the step was complete"
    routes.record(l0, torch.tensor([[1, 2]]), 4)
    got = json.loads(out.read_text())
    assert got == {"calls": 2, "eager": True, "layers": {l0.layer_name: [1, 2, 1, 0], l1.layer_name: [0, 0, 1, 2]}}


def test_valid_dummy_mxfp4_fills_only_expert_layers_with_codes_and_finite_scales():
    """vLLM's dummy loader leaves uint8 expert tensors at zero; the hook gives them random codes and scale bytes
    119-120 (2**-8, 2**-7: finite, never the NaN byte 255), and leaves other modules alone."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "site"))
    from suite_testhooks import dummy_mxfp4

    experts = torch.nn.Module()
    for name, shape in (("w13_weight", (4, 64, 32)), ("w13_weight_scale", (4, 64, 2)),
                        ("w2_weight", (4, 64, 16)), ("w2_weight_scale", (4, 64, 1))):
        setattr(experts, name, torch.nn.Parameter(torch.zeros(shape, dtype=torch.uint8), requires_grad=False))
    dense = torch.nn.Linear(8, 8)
    before = dense.weight.detach().clone()
    model = torch.nn.ModuleDict({"experts": experts, "dense": dense})
    assert dummy_mxfp4.fill_valid_mxfp4(model, seed=5) == 1
    assert len(experts.w13_weight.unique()) > 200, "codes are not random bytes"
    for s in (experts.w13_weight_scale, experts.w2_weight_scale):
        assert set(s.unique().tolist()) <= {119, 120} and len(s.unique()) == 2
    assert torch.equal(dense.weight, before)
    first = experts.w2_weight.clone()
    dummy_mxfp4.fill_valid_mxfp4(model, seed=5)
    assert torch.equal(experts.w2_weight, first), "the same seed must give the same weights (comparable runs)"


class RMSNorm(torch.nn.Module):  # the class name the hook recognises, as vLLM's
    def __init__(self, h: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(h))

    def forward(self, x):
        return x * x.pow(2).mean(-1, keepdim=True).add(1e-5).rsqrt() * self.weight


def _experts_hit(seed: int, scaled: bool) -> int:
    """A gpt-oss router on a 120b-sized layer (hidden 2880, 128 experts, top-4), as the dummy loader leaves it
    (uniform +-1e-3 everywhere) or after the hook's scaled init; 256 distinct token embeddings -> experts hit."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "site"))
    from suite_testhooks import dummy_mxfp4

    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(256, 2880), "norm": RMSNorm(2880),
                                 "router": torch.nn.Linear(2880, 128)})
    for p in model.parameters():
        torch.nn.init.uniform_(p, -1e-3, 1e-3)  # vLLM's dummy loader
    if scaled:
        assert dummy_mxfp4.fill_scaled_floats(model, seed=seed) == 4
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        logits = model["router"](model["norm"](model["embed"](torch.arange(256))))
    return len(torch.topk(logits.float(), 4, dim=-1).indices.unique())


def test_dummy_weights_collapse_routing_and_the_scaled_init_spreads_it():
    """What the H100 run showed (gpt-oss-120b shape: 4 experts for 90% of the slots even with random expert codes),
    reproduced on one router: the dummy loader's +-1e-3 norm weights shrink the router's input until its bias
    decides the top-4 for every token. After the hook's init, 256 tokens reach most of the 128 experts (uniform
    routing of 1024 slots reaches ~124)."""
    seed = 11
    assert _experts_hit(seed, scaled=False) <= 8
    assert _experts_hit(seed, scaled=True) >= 100


def test_the_scaled_init_sets_norms_biases_and_matrices():
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "site"))
    from suite_testhooks import dummy_mxfp4

    model = torch.nn.ModuleDict({"norm": RMSNorm(64), "proj": torch.nn.Linear(1024, 512)})
    codes = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.uint8), requires_grad=False)
    model["proj"].register_parameter("w13_weight", codes)
    sinks = torch.nn.Parameter(torch.full((8,), 5e-4))
    model["norm"].register_parameter("sinks", sinks)
    assert dummy_mxfp4.fill_scaled_floats(model) == 3
    assert torch.equal(model["norm"].weight, torch.ones(64))
    assert torch.equal(model["proj"].bias, torch.zeros(512))
    assert abs(float(model["proj"].weight.detach().std()) * 1024**0.5 - 1.0) < 0.05
    assert torch.equal(codes, torch.zeros(4, 8, dtype=torch.uint8)), "integer tensors are fill_valid_mxfp4's"
    assert torch.equal(sinks, torch.full((8,), 5e-4)), "1-D non-bias parameters keep their values"


def test_the_harness_and_the_hooks_name_the_same_variables():
    """The hooks cannot import the harness (they run inside vLLM's processes), so the names live twice."""
    from harness.engine import hooks

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "site"))
    from suite_testhooks import dummy_mxfp4, routes

    assert (hooks.ROUTES_ENV, hooks.RANDOM_MXFP4_ENV) == (routes.ROUTES_ENV, dummy_mxfp4.RANDOM_MXFP4_ENV)
    assert hooks.RANDOM_MXFP4_LOG == dummy_mxfp4.LOG_LINE, "the harness would look for a line the hook never prints"


SERVED_ROUTES = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "sm_90-2026-11-27-valid-weights"


def _median_spread(layer, skew: float, slots: int) -> dict:
    """The median over 25 seeds of random_routing's spread at `slots` slots (the served window's size)."""
    import statistics

    from kernels.tools.bench import random_routing

    runs = []
    for seed in range(25):
        _, ids, _ = random_routing(slots // layer.top_k, torch.Generator().manual_seed(seed), layer, skew)
        runs.append(rs.spread(torch.bincount(ids.flatten().long(), minlength=layer.experts).tolist()))
    return {k: statistics.median(r[k] for r in runs) for k in ("entropy", "top_share")}


def test_the_benchs_served_skew_routes_as_the_served_shape_models_did():
    """kernels.tools.bench.SERVED_SKEW must reproduce the routing spread measured in the served 120b and 20b shape
    models (their routes.json, decode windows of 2048 slots): within 0.02 of the median layer's normalised entropy and
    25% of its busiest expert's share. Measured here: 120b 0.926 against 0.915, 4.2% against 4.0%; 20b 0.946 against
    0.952, 8.5% against 7.6% (25 seeds: with 9 the 120b's entropy median reads 0.933, so fewer seeds would leave no
    margin). Skews of 0.35 and 0.5 already fail. Uniform routing (skew 0), which the layer bench used alone before,
    must not pass: its 120b entropy is 0.99, and its busiest expert a third of the served one's share."""
    import json

    from kernels.cases import MODELS
    from kernels.tools.bench import SERVED_SKEW

    def close(got: dict, want: dict) -> bool:
        return (abs(got["entropy"] - want["entropy_median"]) <= 0.02
                and abs(got["top_share"] / want["top_share_median"] - 1) <= 0.25)

    for model, name in zip(MODELS, ("routes-120b-valid", "routes-20b-valid")):
        served = json.loads((SERVED_ROUTES / name / "routes.json").read_text())["summary"]
        assert served["model"] == f"{model.name}-shape"
        got = _median_spread(model.moe, SERVED_SKEW, served["slots_per_layer"])
        assert close(got, served), f"{model.name}: skew {SERVED_SKEW} routes with {got}; served: {served}"
        if model.moe.experts == 128:
            uniform = _median_spread(model.moe, 0.0, served["slots_per_layer"])
            assert not close(uniform, served), f"{model.name}: uniform routing {uniform} reads as the served spread"


def test_uniform_routing_is_the_benchs_routing_of_before():
    """Skew 0 must route exactly as the bench did before the skew existed (N(0, 1) logits rounded to bf16, top-k of
    them), and leave the generator where it did: every earlier uniform A/B stays comparable with a new one."""
    from kernels.cases import MODELS
    from kernels.tools.bench import random_routing

    layer = MODELS[0].moe
    g_new, g_old = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    logits, ids, wts = random_routing(64, g_new, layer, 0.0)
    old = torch.randn(64, layer.experts, generator=g_old).to(torch.bfloat16)
    top = torch.topk(old.float(), layer.top_k, dim=-1)
    assert torch.equal(logits, old) and torch.equal(ids, top.indices.to(torch.int32))
    assert torch.equal(wts, torch.softmax(top.values, -1))
    assert torch.equal(torch.randn(4, generator=g_new), torch.randn(4, generator=g_old)), "the generator moved on"
    _, skewed, _ = random_routing(64, torch.Generator().manual_seed(3), layer, 0.4)
    assert not torch.equal(skewed, ids), "a skew that routes as uniform routing tests nothing"
