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
