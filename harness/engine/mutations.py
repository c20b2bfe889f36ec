"""Deliberately broken copies of a checkpoint: the faults level 2 (and the sinks check of level 1.5) must see.

Each mutation changes one family of tensors in a copy of the model directory. They range from gross
(router biased to one expert) to the small faults an argmax-only check passes: one layer's expert scales
off by one E8M0 exponent, logits scaled by 2% (greedy tokens unchanged), and a change the size of
quantizing a whole weight family to MXFP4. Tensor names are the gpt-oss checkpoint's (BF16 experts in
`mlp.experts.{gate_up,down}_proj`, MXFP4 experts in `*_blocks` / `*_scales`).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

import torch

from harness.engine import hooks

Mutation = Callable[[str, torch.Tensor, int], torch.Tensor]  # (name, tensor, num_layers) -> tensor


def _layer(name: str) -> int | None:
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def router_biased(name: str, t: torch.Tensor, layers: int) -> torch.Tensor:
    """Expert 0 wins every token with weight ~1 after the top-k softmax."""
    if name.endswith("mlp.router.bias"):
        t.zero_()
        t[0] = 100.0
    return t


def _scale_down_proj(name: str, t: torch.Tensor) -> torch.Tensor:
    if name.endswith("mlp.experts.down_proj_scales"):  # MXFP4: uint8 E8M0 exponents, +1 = x2
        return t.add_(1)
    if name.endswith("mlp.experts.down_proj"):  # BF16: the same effect on the weights
        return t.mul_(2)
    return t


def expert_scales_off_by_one(name: str, t: torch.Tensor, layers: int) -> torch.Tensor:
    """The classic E8M0 bias bug: every down-projection block scale one exponent too high (x2)."""
    return _scale_down_proj(name, t)


def one_layer_expert_scales_off_by_one(name: str, t: torch.Tensor, layers: int) -> torch.Tensor:
    """The same bug in the last layer only: a small fault an argmax-only check can pass."""
    return _scale_down_proj(name, t) if _layer(name) == layers - 1 else t


def logits_scaled(name: str, t: torch.Tensor, layers: int) -> torch.Tensor:
    """The final norm's gain x1.02: every logit 2% larger, a temperature-like shift that leaves greedy
    tokens unchanged; only the distributions can see it."""
    return t.mul_(1.02) if name == "model.norm.weight" else t


def mxfp4_round_trip(name: str, t: torch.Tensor, layers: int) -> torch.Tensor:
    """A change the size of quantizing a weight family: BF16 experts (or, where the experts already are
    MXFP4, the attention projections) replaced by their MXFP4-quantized values."""
    from kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4

    def round_trip(w: torch.Tensor) -> torch.Tensor:  # blocks of 32 along the last dimension
        packed, scales = quantize_mxfp4(w.float())
        return dequantize_mxfp4(packed, scales).to(w.dtype)

    if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):  # BF16 [E, in, out]: blocks along in
        return round_trip(t.transpose(1, 2)).transpose(1, 2).contiguous()
    if re.search(r"self_attn\.[qkvo]_proj\.weight$", name):  # [out, in]: blocks along in
        return round_trip(t)
    return t


def sinks_raised(name: str, t: torch.Tensor, layers: int) -> torch.Tensor:
    """Every attention sink logit +4: most attention mass goes to the sink. A kernel that ignores sinks
    gives the same logprobs with or without this; one that uses them cannot."""
    return t.add_(4.0) if name.endswith("self_attn.sinks") else t


LEVEL2 = {
    "router-biased-to-expert-0": router_biased,
    "expert-scales-off-by-one-exponent": expert_scales_off_by_one,
    "one-layer-expert-scales-off-by-one": one_layer_expert_scales_off_by_one,
    "logits-scaled-2pct": logits_scaled,
    "mxfp4-round-trip": mxfp4_round_trip,
}

# Faults no checkpoint can make: the same model served with a test hook (plugins/site/suite_testhooks) that breaks
# one path of the engine. Logits x1.5 after forward passes of <= 16 tokens only: a decode-only kernel's fault (the
# kernels plugin's GEMV path serves M <= 16), invisible to the prefills that teacher forcing and perplexity score,
# and argmax-preserving (a BF16 near tie aside), so the greedy tokens stay the same. Only the streams can catch it.
HOOKED = {
    "decode-only-logits-x1.5": {hooks.DECODE_LOGITS_ENV: "1.5"},
}


def mutated_copy(src: Path, dst: Path, mutate: Mutation) -> int:
    """Copy the checkpoint `src` to `dst` with `mutate` applied to every tensor; returns how many changed."""
    import json

    from safetensors.torch import load_file, save_file

    layers = int(json.loads((src / "config.json").read_text())["num_hidden_layers"])
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "SHA256SUMS"))
    changed = 0
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(f)
        for name, t in tensors.items():
            before = t.clone()
            tensors[name] = mutate(name, t, layers)
            changed += int(not tensors[name].equal(before))
        save_file(tensors, dst / f.name, metadata={"format": "pt"})
    return changed
