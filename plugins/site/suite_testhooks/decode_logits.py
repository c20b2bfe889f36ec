"""Test hook: a decode-only fault (SUITE_HOOK_DECODE_LOGITS_SCALE=S), for level 2's mutation check.

Why: a kernel that serves only small batches (the kernels plugin's GEMV path takes M <= 16) never runs in the
prefills that teacher forcing and perplexity score, nor in the prefill that yields a stream's first token, so its
faults reach only the free-running streams from their second token on. This hook is such a fault without a kernel:
it multiplies the logits by S in every step whose forward pass had at most 16 tokens (as the model saw them, CUDA
graph padding included: what a kernel's M would be), and leaves the logits of larger passes alone. A positive S
keeps every argmax (a BF16 near tie can round into an exact one), so greedy tokens stay the same and only the
distributions move: what the streams' logprob and top-k rules exist to catch.

It wraps the model runner's `_model_forward` (Python on every step, also where the model itself replays a CUDA
graph) to note the pass's tokens, and `LogitsProcessor.forward`, which vLLM runs eagerly after the pass (outside
its CUDA graphs) for the sampled rows and the prompt logprobs.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

DECODE_LOGITS_ENV = "SUITE_HOOK_DECODE_LOGITS_SCALE"
MAX_TOKENS = 16  # the kernels plugin's decode threshold (its GEMV kernels serve M <= 16)
LOG_LINE = "suite_testhooks: decode-only logits scale"
_MARK = "_suite_hook_decode_logits"
_last = {"tokens": None}  # tokens of the latest forward pass in this process


def decode_logits_scale() -> float | None:
    """S from the environment; None when unset, 1, or not a positive number (the hook stays off)."""
    raw = os.environ.get(DECODE_LOGITS_ENV, "").strip()
    try:
        scale = float(raw) if raw else None
    except ValueError:
        return None
    return scale if scale is not None and scale > 0 and scale != 1.0 else None


def install(scale: float, tokens_in_batch: Callable[[tuple, dict], int]) -> None:
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # the CPU runner inherits its _model_forward

    if getattr(LogitsProcessor.forward, _MARK, False):
        return
    model_forward, logits_forward = GPUModelRunner._model_forward, LogitsProcessor.forward

    @functools.wraps(model_forward)
    def _model_forward(self, *args, **kwargs):
        _last["tokens"] = tokens_in_batch(args, kwargs)
        return model_forward(self, *args, **kwargs)

    @functools.wraps(logits_forward)
    def forward(self, lm_head, hidden_states, *args, **kwargs):
        logits = logits_forward(self, lm_head, hidden_states, *args, **kwargs)
        if logits is not None and _last["tokens"] is not None and _last["tokens"] <= MAX_TOKENS:
            logits = logits * scale
        return logits

    setattr(forward, _MARK, True)
    GPUModelRunner._model_forward, LogitsProcessor.forward = _model_forward, forward
    print(f"{LOG_LINE} x{scale:g} after forward passes of <= {MAX_TOKENS} tokens (pid {os.getpid()})", flush=True)
