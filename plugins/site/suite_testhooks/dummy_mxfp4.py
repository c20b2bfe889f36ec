"""Test hook: valid random MXFP4 experts in a dummy-loaded model (SUITE_HOOK_RANDOM_MXFP4=1).

vLLM's dummy loader (`--load-format dummy`) fills floating-point tensors only: the uint8 codes and E8M0 scales of
the MXFP4 experts keep their zeros, every expert outputs just its bias, and routing collapses onto the same few
experts (measured with `routes.py` / scripts/routing_spread.py). This hook wraps the dummy loader so those
tensors get random codes and finite scales before the quant methods repack them.
"""
from __future__ import annotations

import functools
import os

_MARK = "_suite_hook_dummy_mxfp4"

RANDOM_MXFP4_ENV = "SUITE_HOOK_RANDOM_MXFP4"
MXFP4_TENSORS = ("w13_weight", "w2_weight")
# E8M0 bytes 119 / 120 = 2**-8 / 2**-7: random E2M1 codes have an rms of 2.93, so weights of rms ~0.016 ~ 1/sqrt(2880)
# and a projection keeps its input's scale (gpt-oss' hidden size is 2880)
SCALE_BYTES = (119, 121)


def random_mxfp4_wanted() -> bool:
    return os.environ.get(RANDOM_MXFP4_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def fill_valid_mxfp4(model, seed: int = 1234) -> int:
    """Give every MXFP4 expert tensor of a dummy-loaded model random codes and finite scales; returns how many
    modules were filled. vLLM's dummy loader fills floating-point tensors only: the uint8 codes and scales keep
    their zeros (see the module's docstring)."""
    import torch

    filled = 0
    for i, module in enumerate(model.modules()):
        codes = [getattr(module, n, None) for n in MXFP4_TENSORS]
        scales = [getattr(module, f"{n}_scale", None) for n in MXFP4_TENSORS]
        if not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.numel() for t in codes + scales):
            continue
        g = torch.Generator(device=codes[0].device)
        g.manual_seed(seed + i)
        with torch.no_grad():
            for c, s in zip(codes, scales):
                c.copy_(torch.randint(0, 256, c.shape, generator=g, device=c.device, dtype=torch.uint8))
                s.copy_(torch.randint(*SCALE_BYTES, s.shape, generator=g, device=s.device, dtype=torch.uint8))
        filled += 1
    return filled


def install_random_mxfp4() -> None:
    """Wrap vLLM's dummy loader so the MXFP4 experts get valid random values before the quant methods repack them."""
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    if getattr(DummyModelLoader.load_weights, _MARK, False):
        return
    original = DummyModelLoader.load_weights

    @functools.wraps(original)
    def load_weights(self, model, model_config):
        original(self, model, model_config)
        n = fill_valid_mxfp4(model)
        print(f"suite_testhooks: random MXFP4 codes and scales in {n} MoE layers", flush=True)

    setattr(load_weights, _MARK, True)
    DummyModelLoader.load_weights = load_weights
