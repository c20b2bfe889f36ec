"""The routing-spread statistics of scripts/routing_spread.py: a collapsed routing and a uniform one must read
differently, and the window between two snapshots of the hook's counts is their difference."""
from __future__ import annotations

import sys
from pathlib import Path

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


def test_the_harness_and_the_hooks_name_the_same_variables():
    """The hooks cannot import the harness (they run inside vLLM's processes), so the names live twice."""
    from harness.engine import hooks

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "site"))
    from suite_testhooks import dummy_mxfp4, routes

    assert (hooks.ROUTES_ENV, hooks.RANDOM_MXFP4_ENV) == (routes.ROUTES_ENV, dummy_mxfp4.RANDOM_MXFP4_ENV)
