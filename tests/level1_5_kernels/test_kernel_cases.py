"""kernels/cases.py holds the real gpt-oss dimensions: each field against the model's config.json in models/shapes/
(the shape-only configs the suite serves), so a typo there cannot quietly move every kernel test to another shape."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from kernels import cases

pytestmark = pytest.mark.level1_5

SHAPES_DIR = Path(__file__).resolve().parents[2] / "models" / "shapes"
CONFIG_KEY = {"layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
              "experts": "num_local_experts", "top_k": "num_experts_per_tok", "q_heads": "num_attention_heads",
              "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "vocab": "vocab_size"}


@pytest.mark.parametrize("model", cases.MODELS, ids=lambda m: m.name)
def test_case_dimensions_are_the_models_config(model):
    cfg = json.loads((SHAPES_DIR / model.name / "config.json").read_text())
    assert set(CONFIG_KEY) == {f.name for f in fields(model)} - {"name"}, "a new GptOss field needs its config key here"
    wrong = {k: (getattr(model, k), cfg[key]) for k, key in CONFIG_KEY.items() if getattr(model, k) != cfg[key]}
    assert not wrong, f"kernels/cases.py {model.name} (ours, config.json): {wrong}"


def test_the_tested_shapes_are_the_120b_decode_layers():
    m = cases.GPT_OSS_120B
    assert cases.MOE == cases.MoeLayer(m.experts, m.top_k, m.hidden, m.intermediate)
    assert cases.HIDDEN == m.hidden
    # every projection reads x of width hidden, except o_proj, which reads the attention output (heads x head_dim)
    assert {name: k for name, (_, k) in cases.LINEAR_SHAPES.items() if k != m.hidden} == {"o_proj": m.q_heads * m.head_dim}
    assert cases.LINEAR_SHAPES["lm_head"][0] == m.vocab
