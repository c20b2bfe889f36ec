"""Level 1: the embedded tiny gpt-oss checkpoints are intact and are what the suite claims.

No server: reads models/tiny-gpt-oss (BF16) and models/tiny-gpt-oss-mxfp4 (MXFP4 experts) from
disk. Checks checksums, the real gpt-oss architecture features in config + weights, the MXFP4
checkpoint layout, and that the MXFP4 experts dequantize back to the BF16 experts within MXFP4
rounding. How they were made: models/training/ and each folder's MODEL_CARD.md.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.level1

REPO = Path(__file__).resolve().parents[2]
BF16 = REPO / "models" / "tiny-gpt-oss"
MXFP4 = REPO / "models" / "tiny-gpt-oss-mxfp4"
REGEN = {
    "tiny-gpt-oss": ".venv/bin/python models/training/train_tiny_gpt_oss.py "
    "(arguments in models/tiny-gpt-oss/MODEL_CARD.md), or restore it: git checkout -- models/tiny-gpt-oss",
    "tiny-gpt-oss-mxfp4": ".venv/bin/python models/training/convert_to_mxfp4.py, "
    "or restore it: git checkout -- models/tiny-gpt-oss-mxfp4",
}
REQUIRED = {
    "tiny-gpt-oss": ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json", "MODEL_CARD.md", "heldout.txt"],
    "tiny-gpt-oss-mxfp4": ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json", "MODEL_CARD.md"],
}


def _sha256(p: Path) -> str:
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.fixture(scope="module")
def bf16_weights():
    from safetensors.torch import load_file

    return load_file(str(BF16 / "model.safetensors"))


@pytest.fixture(scope="module")
def mxfp4_weights():
    from safetensors.torch import load_file

    return load_file(str(MXFP4 / "model.safetensors"))


# ----------------------------------------------------------------------------- integrity
@pytest.mark.parametrize("folder", [BF16, MXFP4], ids=lambda p: p.name)
def test_files_match_sha256sums(folder: Path):
    regen = REGEN[folder.name]
    sums_file = folder / "SHA256SUMS"
    assert sums_file.is_file(), f"{sums_file.relative_to(REPO)} is missing; regenerate: {regen}"
    listed = {}
    for line in sums_file.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.lstrip("*")] = digest
    for name in REQUIRED[folder.name]:
        assert name in listed, f"{folder.name}/{name} is not listed in SHA256SUMS; regenerate: {regen}"
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != "SHA256SUMS"}
    assert present <= set(listed), (
        f"{folder.name}: files not covered by SHA256SUMS: {sorted(present - set(listed))}; regenerate: {regen}")
    for name, digest in listed.items():
        path = folder / name
        assert path.is_file(), f"{folder.name}/{name} (listed in SHA256SUMS) is missing; regenerate: {regen}"
        actual = _sha256(path)
        assert actual == digest, (
            f"{folder.name}/{name}: sha256 {actual} != {digest} in SHA256SUMS (file changed or corrupt, "
            f"e.g. a Git LFS pointer); regenerate: {regen}")


def test_embedded_models_are_small():
    total = sum(p.stat().st_size for d in (BF16, MXFP4) for p in d.iterdir() if p.is_file())
    assert total < 20 * 2**20, f"embedded models take {total / 2**20:.1f} MiB (budget 20 MiB)"


# ----------------------------------------------------------------------------- architecture
@pytest.mark.parametrize("folder", [BF16, MXFP4], ids=lambda p: p.name)
def test_config_has_the_real_gpt_oss_features(folder: Path):
    c = _config(folder)
    assert c["model_type"] == "gpt_oss" and c["architectures"] == ["GptOssForCausalLM"]
    n = c["num_hidden_layers"]
    # vLLM's gpt_oss.py applies the sliding window to even layers (layer_idx % 2 == 0) whatever
    # layer_types says, transformers follows layer_types: they must agree, as in gpt-oss.
    expected = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    assert c["layer_types"] == expected, f"layer_types must alternate sliding/full from layer 0: {c['layer_types']}"
    assert n >= 2 and c["sliding_window"] == 128
    rs = c["rope_scaling"]
    assert rs["rope_type"] == "yarn", rs
    for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
        assert k in rs, f"rope_scaling lacks {k} (vLLM's gpt_oss.py reads it)"
    assert rs["factor"] > 1 and rs["original_max_position_embeddings"] * rs["factor"] == c["max_position_embeddings"]
    assert c["rope_theta"] > 0
    assert c["attention_bias"] is True
    assert c["tie_word_embeddings"] is False
    assert c["num_local_experts"] > c["num_experts_per_tok"] >= 2
    assert c.get("swiglu_limit", 7.0) == 7.0 and c.get("swiglu_alpha", 1.702) == 1.702
    assert c["torch_dtype"] == "bfloat16"
    assert c["hidden_size"] % 32 == 0 and c["intermediate_size"] % 32 == 0, "MXFP4 blocks need multiples of 32"
    if folder == MXFP4:
        q = c["quantization_config"]
        assert q["quant_method"] == "mxfp4"
        assert set(q["modules_to_not_convert"]) >= {
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}
    else:
        assert "quantization_config" not in c


def test_weights_have_sinks_biases_and_untied_head(bf16_weights):
    c = _config(BF16)
    w = bf16_weights
    for i in range(c["num_hidden_layers"]):
        sinks = w[f"model.layers.{i}.self_attn.sinks"]
        assert tuple(sinks.shape) == (c["num_attention_heads"],)
        assert bool((sinks != 0).any()), f"layer {i}: attention sinks are all zero"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"model.layers.{i}.self_attn.{proj}.bias" in w, f"layer {i}: no {proj} bias"
        assert f"model.layers.{i}.mlp.router.bias" in w
    assert "lm_head.weight" in w and not w["lm_head.weight"].equal(w["model.embed_tokens.weight"])
    assert all(t.dtype.is_floating_point is False or str(t.dtype) == "torch.bfloat16" for t in w.values())


def test_tokenizer_and_heldout_text():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(BF16 / "tokenizer.json"))
    c = _config(BF16)
    assert tok.get_vocab_size() == c["vocab_size"]
    assert tok.token_to_id("<|endoftext|>") == c["eos_token_id"]
    assert tok.token_to_id("<|startoftext|>") == c["bos_token_id"]
    text = (BF16 / "heldout.txt").read_text()
    assert 3000 <= len(text.encode()) <= 6144
    n = len(tok.encode(text, add_special_tokens=False).ids)
    assert n < 2000, f"heldout.txt is {n} tokens; the level 2 perplexity test needs < 2000"
    assert tok.decode(tok.encode(text).ids) == text, "byte-level BPE must round-trip heldout.txt"


# ----------------------------------------------------------------------------- MXFP4
def _experts(c: dict):
    E, H, I = c["num_local_experts"], c["hidden_size"], c["intermediate_size"]
    for i in range(c["num_hidden_layers"]):
        # name, BF16 shape (in x out), MXFP4 [E, N=out, K=in]
        yield f"model.layers.{i}.mlp.experts.gate_up_proj", (E, H, 2 * I), (E, 2 * I, H)
        yield f"model.layers.{i}.mlp.experts.down_proj", (E, I, H), (E, H, I)


def test_mxfp4_checkpoint_layout(bf16_weights, mxfp4_weights):
    import torch

    c = _config(MXFP4)
    q, b = mxfp4_weights, bf16_weights
    for name, bf16_shape, (E, N, K) in _experts(c):
        assert name not in q, f"{name} should be quantized, found BF16 in the MXFP4 checkpoint"
        assert tuple(b[name].shape) == bf16_shape
        blocks, scales, bias = q[name + "_blocks"], q[name + "_scales"], q[name + "_bias"]
        assert blocks.dtype == torch.uint8 and tuple(blocks.shape) == (E, N, K // 32, 16), (name, blocks.shape)
        assert scales.dtype == torch.uint8 and tuple(scales.shape) == (E, N, K // 32), (name, scales.shape)
        assert bias.dtype == torch.bfloat16 and tuple(bias.shape) == (E, N)
        assert torch.equal(bias, b[name + "_bias"])
    expert_keys = {n for n, *_ in _experts(c)}
    others = {k for k in b if k not in expert_keys}
    assert others == {k for k in q if not k.endswith(("_blocks", "_scales"))}
    for k in others:  # attention (sinks included), router, norms, embeddings, head: unchanged BF16
        assert q[k].dtype == torch.bfloat16 and torch.equal(q[k], b[k]), f"{k} differs between the checkpoints"


def test_mxfp4_experts_dequantize_to_the_bf16_experts(bf16_weights, mxfp4_weights):
    """Each expert weight is within MXFP4 rounding of the BF16 weight it was quantized from.

    Derivation of the bound. A 32-element block with shared E8M0 scale byte s has exponent
    e = s - 127 and stores q(v) * 2^e with v = w / 2^e and q rounding to the nearest E2M1 value
    (ties to even). E2M1 magnitudes are {0, 0.5, 1, 1.5, 2, 3, 4, 6}: spacing 0.5 on [0, 2],
    1 on [2, 4], 2 on [4, 6]. Round-to-nearest errs by at most half the spacing of the interval
    holding |v| (the interval ends 0, 2, 4, 6 are exact, so closed intervals are fine):
        |v - q(v)| <= 0.25 for |v| <= 2,  0.5 for 2 < |v| <= 4,  1 for 4 < |v| <= 6,
    and scaling by the power of two 2^e is exact, so |w - deq| <= that half-step * 2^e (exact
    comparison: w is BF16, deq is E2M1 * 2^e, both exact in float32).
    Saturation: the quantizer picks e = floor(log2(amax)) - 2 (OCP MX v1.0), so amax / 2^e is in
    [4, 8): elements with 6 < |v| < 8 do not fit E2M1 and clamp to +-6 (error up to 2 * 2^e).
    They are excluded from the half-step bound and checked instead to be exactly +-6 * 2^e,
    with the right sign, and |v| < 8 (which also checks each block's scale is not too small);
    each block's max |v| >= 4 checks the scale is not too large (all-zero blocks excepted).
    """
    import torch

    from kernels.mxfp4 import dequantize_gpt_oss_experts

    c = _config(MXFP4)
    for name, _, _ in _experts(c):
        w = bf16_weights[name].float().transpose(1, 2)  # [E, in, out] -> [E, N=out, K=in]
        blocks, scales = mxfp4_weights[name + "_blocks"], mxfp4_weights[name + "_scales"]
        deq = dequantize_gpt_oss_experts(blocks, scales, torch.float32)
        assert deq.shape == w.shape, f"{name}: dequantized {tuple(deq.shape)} vs BF16^T {tuple(w.shape)}"
        e = scales.to(torch.int32) - 127
        scale = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e).repeat_interleave(32, dim=-1)
        v = w.abs() / scale
        sat = v > 6
        half_step = torch.where(v <= 2, 0.25, torch.where(v <= 4, 0.5, 1.0)) * scale
        err = (w - deq).abs()
        bad = ~sat & (err > half_step)
        assert not bool(bad.any()), (
            f"{name}: {int(bad.sum())} elements farther than half an E2M1 step from the BF16 weight "
            f"(worst error / 2^e = {float((err / scale)[bad].max()):.3f}); "
            "were the experts transposed (MXFP4 is out x in)? regenerate: convert_to_mxfp4.py")
        assert torch.equal(deq[sat], torch.sign(w[sat]) * 6 * scale[sat]), f"{name}: saturated elements != +-6*2^e"
        assert bool((v < 8).all()), f"{name}: an element exceeds 8 * 2^e (block scale too small)"
        vmax = v.reshape(*v.shape[:-1], -1, 32).amax(-1)
        nonzero = w.reshape(*w.shape[:-1], -1, 32).abs().amax(-1) > 0
        assert bool((vmax[nonzero] >= 4).all()), f"{name}: a block's scale is larger than floor(log2 amax) - 2"


def test_mxfp4_blocks_are_what_the_project_quantizer_produces(bf16_weights, mxfp4_weights):
    """Bit-exact: re-quantizing the BF16 experts with kernels.mxfp4 gives the stored bytes."""
    import torch

    from kernels.mxfp4 import quantize_gpt_oss_experts

    for name, _, _ in _experts(_config(MXFP4)):
        blocks, scales = quantize_gpt_oss_experts(bf16_weights[name].transpose(1, 2).contiguous())
        assert torch.equal(scales, mxfp4_weights[name + "_scales"]), f"{name}_scales differ; regenerate: {REGEN['tiny-gpt-oss-mxfp4']}"
        assert torch.equal(blocks, mxfp4_weights[name + "_blocks"]), f"{name}_blocks differ; regenerate: {REGEN['tiny-gpt-oss-mxfp4']}"
