"""Test hook: valid random weights in a dummy-loaded model (SUITE_HOOK_RANDOM_MXFP4=1).

vLLM's dummy loader (`--load-format dummy`) fills floating-point tensors with uniform values in [-1e-3, 1e-3]
and leaves the uint8 codes and E8M0 scales of the MXFP4 experts at zero. Routing then collapses onto the same
four experts in every layer (scripts/routing_spread.py, gpt-oss-120b shape on an H100): the RMSNorm weights
(~1e-3) shrink the router's input until its logits (~2e-5) are far below its bias (~1e-3), so the bias alone picks
the top-4 for every token; random expert codes alone did not change that (measured: still 4 experts for 90% of
the slots). This hook wraps the dummy loader so that, before the quant methods repack anything, the experts get
random codes and finite scales and the floating-point weights a scaled random init (norm weights 1, matrices
N(0, 1/fan_in), biases 0): unit-scale activations, router logits ~N(0, 1) that differ per token, attention that
mixes context, so routing spreads as in a load-balanced trained model.
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
LOG_LINE = "suite_testhooks: random MXFP4 codes"  # the harness checks a shape server's log for it


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


def fill_scaled_floats(model, seed: int = 4321) -> int:
    """Scaled random init of every floating-point weight of a dummy-loaded model: norm weights (modules whose class
    name ends in "Norm") 1, biases 0, matrices (2-D or more) N(0, 1/fan_in) with fan_in the last dim; other
    floating-point parameters (e.g. attention sinks) keep the dummy loader's values. Returns how many parameters
    changed. Integer tensors (MXFP4 codes, scales) are left to fill_valid_mxfp4."""
    import torch

    changed = 0
    with torch.no_grad():
        for i, module in enumerate(model.modules()):
            is_norm = type(module).__name__.endswith("Norm")
            for j, (name, p) in enumerate(module.named_parameters(recurse=False)):
                if not (isinstance(p, torch.Tensor) and p.is_floating_point() and p.numel()):
                    continue
                if is_norm and name == "weight":
                    p.fill_(1.0)
                elif name == "bias" or name.endswith("_bias"):
                    p.zero_()
                elif p.dim() >= 2:
                    g = torch.Generator(device=p.device)
                    g.manual_seed(seed + 1000 * i + j)  # one stream per parameter
                    p.normal_(0.0, p.shape[-1] ** -0.5, generator=g)
                else:
                    continue
                changed += 1
    return changed


def install_random_mxfp4() -> None:
    """Wrap vLLM's dummy loader so the model gets valid random weights before the quant methods repack them."""
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    if getattr(DummyModelLoader.load_weights, _MARK, False):
        return
    original = DummyModelLoader.load_weights

    @functools.wraps(original)
    def load_weights(self, model, model_config):
        original(self, model, model_config)
        n = fill_valid_mxfp4(model)
        f = fill_scaled_floats(model)
        print(f"{LOG_LINE} and scales in {n} MoE layers, scaled init of {f} floating-point weights", flush=True)

    setattr(load_weights, _MARK, True)
    DummyModelLoader.load_weights = load_weights
