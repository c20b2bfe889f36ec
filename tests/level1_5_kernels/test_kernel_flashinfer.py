"""Cross-check of our MXFP4 format with FlashInfer's `mxfp4_quantize` / `mxfp4_dequantize`
(flashinfer-python 0.6.x) on the GPU, where FlashInfer's fp4 quantization runs on that
architecture.

FlashInfer quantizes with its own scale rule (a global scale folded in, E8M0 scale rounded its
way) and returns the scales in a swizzled 128x4 layout, so the quantized bytes are not expected to
equal ours bit for bit. What must agree is the element format: its packed bytes decoded with OUR
E2M1 table and nibble order (low nibble first) must equal its own dequantization up to one
constant factor per 32-element block (the block scale). And its quantization error must be of
the same size as ours (both are MXFP4 of the same data).
"""

from __future__ import annotations

import pytest
import torch

from kernels import mxfp4
from kernels.cases import HIDDEN
from kernels.testing import fresh_seed, generator, nmse

pytestmark = [pytest.mark.level1_5, pytest.mark.gpu]


def _flashinfer():
    if not torch.cuda.is_available():
        pytest.skip("FlashInfer's fp4 quantization needs a CUDA GPU")
    fi = pytest.importorskip("flashinfer", reason="flashinfer-python is not installed here")
    quant = getattr(fi, "mxfp4_quantize", None)
    dequant = getattr(fi, "mxfp4_dequantize", None)
    if quant is None or dequant is None:
        fp4 = pytest.importorskip("flashinfer.fp4_quantization", reason="flashinfer has no fp4_quantization")
        quant, dequant = getattr(fp4, "mxfp4_quantize", None), getattr(fp4, "mxfp4_dequantize", None)
    if quant is None or dequant is None:
        pytest.skip(f"flashinfer {getattr(fi, '__version__', '?')} has no mxfp4_quantize / mxfp4_dequantize")
    return quant, dequant


def test_flashinfer_mxfp4_element_format_matches_ours():
    quant, dequant = _flashinfer()
    seed = fresh_seed()
    g = generator(seed, "cuda")
    x = torch.randn(128, HIDDEN, generator=g, device="cuda").to(torch.bfloat16)
    try:
        fi_packed, fi_sf = quant(x)
        fi_deq = dequant(fi_packed, fi_sf)
    except Exception as e:  # JIT / arch support is FlashInfer's: report, don't fail our format
        cap = torch.cuda.get_device_capability()
        pytest.skip(f"FlashInfer mxfp4 quantize/dequantize does not run on sm_{cap[0]}{cap[1]}: "
                    f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    fi_deq = fi_deq.float().reshape(128, HIDDEN).to("cuda")
    cap = torch.cuda.get_device_capability()
    below_sm100 = cap[0] < 10  # FlashInfer's fp4 quantization targets SM100+
    codes = mxfp4.unpack_nibbles(fi_packed.view(torch.uint8).reshape(128, HIDDEN // 2).to("cuda"))
    decoded = mxfp4.e2m1_decode(codes).reshape(128, HIDDEN // 32, 32)
    deq_b = fi_deq.reshape(128, HIDDEN // 32, 32)
    try:
        # Per block: fi_deq = c * decoded for one constant c (zero codes must dequantize to zero).
        nz = decoded != 0
        assert torch.equal(deq_b[~nz], torch.zeros_like(deq_b[~nz])), (
            f"a zero code of FlashInfer's bytes did not dequantize to 0 in its own dequantization (seed={seed})")
        ratio = torch.where(nz, deq_b / decoded.where(nz, torch.ones_like(decoded)), torch.nan)
        rmax = torch.nan_to_num(ratio, nan=-float("inf")).amax(-1)
        rmin = torch.nan_to_num(ratio, nan=float("inf")).amin(-1)
        has = nz.any(-1)
        assert torch.allclose(rmax[has], rmin[has], rtol=1e-6, atol=0), (
            f"FlashInfer's bytes decoded with our E2M1 table / nibble order are not a per-block multiple "
            f"of its dequantization (seed={seed})"
        )
    except AssertionError as e:
        if below_sm100:
            # Seen on an H200 (sm_90), flashinfer 0.6.x, 2026-12-01, with a fresh seed; on 2026-11-21 these checks
            # passed there. Below SM100 its own bytes and dequantization need not agree, so they judge nothing of ours.
            pytest.xfail(f"FlashInfer's mxfp4 on sm_{cap[0]}{cap[1]} (it targets SM100+): {str(e).splitlines()[0]}")
        raise
    ours = mxfp4.dequantize_mxfp4(*mxfp4.quantize_mxfp4(x))
    e_ours, e_fi = nmse(ours, x.float()), nmse(fi_deq, x.float())
    # Gaussian data through MXFP4: NMSE ~1e-2 for either scale rule; 2x covers the rule difference.
    same_size = e_fi < 2 * e_ours and e_ours < 2 * e_fi
    if not same_size and below_sm100:
        # Seen on an H200 (sm_90), flashinfer 0.6.14, 2026-11-21: the element format above matches,
        # but its round trip is off in magnitude (NMSE 1.0): its fp4 quantization targets SM100+.
        pytest.xfail(f"FlashInfer mxfp4 round trip on sm_{cap[0]}{cap[1]}: NMSE {e_fi:.3e} vs ours {e_ours:.3e}; "
                     "it targets SM100+")
    assert same_size, f"NMSE ours {e_ours:.3e} vs FlashInfer {e_fi:.3e} (seed={seed})"
