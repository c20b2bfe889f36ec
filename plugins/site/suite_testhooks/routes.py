"""Test hook: count the experts each gpt-oss MoE layer routes to (SUITE_HOOK_ROUTES=FILE).

Why: dummy-loaded shape models (`--load-format dummy`) keep their MXFP4 bytes zero (`dummy_mxfp4.py`); if their routing
collapses onto a few experts, every MoE kernel looks faster than on a trained model (the same experts stay in
L2). This hook measures it in the served model.

It wraps `GptOssMxfp4MoEMethod.apply_monolithic` / `apply` (stock and the suite_kernels plugin alike) and adds
each call's top-k expert ids (from the router logits, or the ids vLLM chose) to a per-layer count on the GPU,
then writes the cumulative counts to FILE once per forward step (a host sync: measurement servers only).
Python hooks do not run inside CUDA graph replays, so the server must run with `--enforce-eager`; a call
while a graph is being captured is not counted, and FILE says `"eager": false` if any was seen.
FILE: {"calls": n, "eager": bool, "layers": {layer_name: [count per expert]}}.
"""
from __future__ import annotations

import functools
import json
import os
import threading

ROUTES_ENV = "SUITE_HOOK_ROUTES"
_MARK = "_suite_hook_routes"
_lock = threading.Lock()
_state: dict = {"counts": {}, "calls": 0, "captured": 0, "first_layer": None}


def routes_file() -> str | None:
    return os.environ.get(ROUTES_ENV) or None


def _layer_name(layer) -> str:
    return str(getattr(layer, "layer_name", None) or getattr(layer, "prefix", None) or id(layer))


def record(layer, ids, num_experts: int) -> None:
    """Add one call's expert ids [M, k] to the layer's counts; flush all counts at the first layer of a step."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        _state["captured"] += 1
        return
    name = _layer_name(layer)
    flat = ids.reshape(-1).long()
    flat = flat[(flat >= 0) & (flat < num_experts)]
    counts = torch.bincount(flat, minlength=num_experts).cpu()
    with _lock:
        if _state["first_layer"] is None:
            _state["first_layer"] = name
        elif name == _state["first_layer"]:
            _flush()  # the previous step is complete
        have = _state["counts"].get(name)
        _state["counts"][name] = counts if have is None else have + counts
        _state["calls"] += 1


def _flush() -> None:
    path = routes_file()
    if not path:
        return
    data = {"calls": _state["calls"], "eager": _state["captured"] == 0,
            "layers": {k: v.tolist() for k, v in _state["counts"].items()}}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def install() -> None:
    """Wrap the gpt-oss MXFP4 MoE method (idempotent; wraps whatever is there, the kernels plugin included)."""
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod as cls

    if getattr(cls.apply, _MARK, False):
        return
    mono, modular = cls.apply_monolithic, cls.apply

    @functools.wraps(mono)
    def apply_monolithic(self, layer, x, router_logits, *args, **kwargs):
        import torch

        record(layer, torch.topk(router_logits, layer.top_k, dim=-1).indices, router_logits.shape[-1])
        return mono(self, layer, x, router_logits, *args, **kwargs)

    @functools.wraps(modular)
    def apply(self, layer, x, topk_weights, topk_ids, *args, **kwargs):
        record(layer, topk_ids, int(getattr(layer, "global_num_experts", 0) or getattr(layer, "num_experts", 0)))
        return modular(self, layer, x, topk_weights, topk_ids, *args, **kwargs)

    for f in (apply_monolithic, apply):
        setattr(f, _MARK, True)
    cls.apply_monolithic, cls.apply = apply_monolithic, apply

