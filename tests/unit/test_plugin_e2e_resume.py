"""scripts/plugin_e2e.py resumes an --out a time limit cut off; it must never put results measured with other
weights (the shape models' valid random ones, or vLLM's dummy ones) or other kernel settings in the same table."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import plugin_e2e  # noqa: E402

NOW = {"weights": "model default (random-valid-1)", "kernel_env": {}}


def test_results_of_the_same_setting_resume():
    results = {"triton-bf16": {"metrics": {"tg32": {}}, **NOW}, "gemv-bf16": {"error": "boot failed"}}
    assert plugin_e2e.mixed_setting(results, NOW) is None


def test_results_of_other_weights_or_kernel_settings_are_refused():
    dummy = {"triton-bf16": {"metrics": {}, **NOW, "weights": "vllm dummy"}}
    assert "vllm dummy" in plugin_e2e.mixed_setting(dummy, NOW)
    tiled = {"triton-bf16": {"metrics": {}, **NOW, "kernel_env": {"KERNELS_PACKED_MM_BLOCK_M": "128"}}}
    assert "BLOCK_M" in plugin_e2e.mixed_setting(tiled, NOW)
    older = {"triton-bf16": {"metrics": {}}}  # written before results said what they were measured with
    assert plugin_e2e.mixed_setting(older, NOW) is not None
