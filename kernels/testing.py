"""Helpers the kernel conformance tests share: fresh seeds, normalized MSE, poisoned outputs."""

from __future__ import annotations

import math
import secrets

import torch

from ._triton import INTERPRET

# Where the conformance tests put their tensors: the GPU, or the CPU under Triton's interpreter (set when no
# GPU is visible, kernels/_triton.py).
DEV = "cpu" if INTERPRET else "cuda"


def fresh_seed() -> int:
    """A new seed every run (the same function must hold on any valid input); tests print it on failure."""
    return secrets.randbits(31)


def generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def nmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    """sum((out-ref)^2) / sum(ref^2) in float64, as llama.cpp's test-backend-ops. NaN anywhere -> nan."""
    o = out.double()
    r = ref.double()
    den = (r * r).sum().item()
    num = ((o - r) ** 2).sum().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def assert_close_nmse(out: torch.Tensor, ref: torch.Tensor, bound: float, seed: int, what: str = "") -> float:
    """NaN never passes (a poisoned, unwritten element shows up as NaN); then NMSE <= bound."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)} (seed={seed})"
    bad = ~torch.isfinite(out)
    n_bad = int(bad.sum())
    ref_bad = int((~torch.isfinite(ref)).sum())
    assert n_bad == 0, (
        f"{what}: {n_bad} non-finite output elements (unwritten or NaN), first at "
        f"{bad.nonzero()[0].tolist()}; reference has {ref_bad} (seed={seed})"
    )
    err = nmse(out, ref)
    assert err <= bound, f"{what}: NMSE {err:.3e} > bound {bound:.1e} (seed={seed})"
    return err


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """An output buffer filled with NaN so any element a kernel fails to write is caught."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def random_mxfp4(
    shape_nk: tuple[int, ...], gen: torch.Generator, scale_lo: int = 118, scale_hi: int = 124
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed codes [..., K//2] and scales [..., K//32] on the generator's device.

    gpt-oss weights have magnitudes ~1e-2; scale bytes 118..123 give 2**-9..2**-4 per block, i.e.
    values up to 6 * 2**-4 = 0.375. Codes are uniform over all 16, -0 included.
    """
    *lead, k = shape_nk
    dev = gen.device
    packed = torch.randint(0, 256, (*lead, k // 2), generator=gen, device=dev, dtype=torch.uint8)
    scales = torch.randint(scale_lo, scale_hi, (*lead, k // 32), generator=gen, device=dev, dtype=torch.uint8)
    return packed, scales


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def random_mxfp4_rms(scale_lo: int = 118, scale_hi: int = 124) -> float:
    """Root mean square of the weights `random_mxfp4` draws (exact, from its distribution): codes uniform over all 16,
    so |value| uniform over the 8 E2M1 magnitudes, times a scale 2**(b - 127) with b uniform in [scale_lo, scale_hi)
    and independent of the code. 0.0862 for the default bytes."""
    codes = sum(v * v for v in E2M1_MAGNITUDES) / len(E2M1_MAGNITUDES)
    scales = sum(4.0 ** (b - 127) for b in range(scale_lo, scale_hi)) / (scale_hi - scale_lo)
    return math.sqrt(codes * scales)
