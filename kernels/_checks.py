"""Shape checks the kernels' entry points share (torch only: cuda_ext uses them too).

The kernels index their inputs by the sizes of x and the weights, not by the inputs' own shapes: routes for more
tokens than x has are dropped without a word, and a bias shorter than the layer's rows is read past its end. So each
entry point checks these first and says, in one line, what it expected.
"""

from __future__ import annotations

import torch


def check_routes(m: int, expert_ids: torch.Tensor, expert_weights: torch.Tensor) -> int:
    """top_k, once expert_ids and expert_weights are both [M, k] for x's M rows; ValueError otherwise."""
    if expert_ids.dim() != 2 or expert_ids.shape[0] != m or tuple(expert_weights.shape) != tuple(expert_ids.shape):
        raise ValueError(f"expert_ids {tuple(expert_ids.shape)} and expert_weights {tuple(expert_weights.shape)} must "
                         f"both be [M, k] with M = {m}, x's rows")
    return expert_ids.shape[1]


def check_bias(bias: torch.Tensor | None, shape: tuple[int, ...], what: str) -> None:
    """ValueError unless `bias` is None or exactly `shape` (the kernels read shape's elements from it)."""
    if bias is not None and tuple(bias.shape) != tuple(shape):
        raise ValueError(f"{what} bias must be {list(shape)}, got {list(bias.shape)}")
