"""Level 1: the embedded tiny gpt-oss checkpoints are intact and are what the suite claims.

No server: reads models/tiny-gpt-oss (BF16, compact vocabulary), models/tiny-gpt-oss-mxfp4 (MXFP4
experts) and models/tokenizer from disk, and the full checkpoints harness/engine/models.py materializes
from them (models/.materialized/, built once). Checks checksums, the real gpt-oss architecture and
o200k_harmony ids in config + weights, the compact map, the MXFP4 layout and rounding bound, that
expansion copies the right rows, and the tokenizer's harmony special ids. How they were made:
models/training/ and each folder's MODEL_CARD.md.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.engine import models as hm

pytestmark = pytest.mark.level1

REPO = Path(__file__).resolve().parents[2]
BF16 = REPO / "models" / "tiny-gpt-oss"
MXFP4 = REPO / "models" / "tiny-gpt-oss-mxfp4"
TOKENIZER = REPO / "models" / "tokenizer"
REGEN = {
    "tiny-gpt-oss": ".venv/bin/python models/training/train_tiny_gpt_oss.py "
    "(arguments in models/tiny-gpt-oss/MODEL_CARD.md), or restore it: git checkout -- models/tiny-gpt-oss",
    "tiny-gpt-oss-mxfp4": ".venv/bin/python models/training/convert_to_mxfp4.py, "
    "or restore it: git checkout -- models/tiny-gpt-oss-mxfp4",
}
REQUIRED = {
    "tiny-gpt-oss": ["config.json", "generation_config.json", "compact.json", "compact_vocab.json",
                     "model.compact.safetensors", "MODEL_CARD.md", "heldout.txt"],
    "tiny-gpt-oss-mxfp4": ["config.json", "generation_config.json", "compact.json",
                           "model.experts-mxfp4.safetensors", "MODEL_CARD.md"],
}
VOCAB = 201088
HARMONY = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
           "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012}


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _harmony():
    """openai_harmony and its o200k_harmony encoding; openai-harmony (vLLM <= 0.26) reads the
    vocabulary from TIKTOKEN_ENCODINGS_BASE (else it downloads it), oss-harmony embeds it."""
    import os

    oh = pytest.importorskip("openai_harmony")
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(TOKENIZER))
    return oh, oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="module")
def vocab_map() -> dict:
    return hm.read_vocab_map(BF16 / "compact_vocab.json")


@pytest.fixture(scope="module")
def bf16_weights():
    from safetensors.torch import load_file

    return load_file(str(BF16 / "model.compact.safetensors"))


@pytest.fixture(scope="module")
def mxfp4_weights():
    from safetensors.torch import load_file

    return load_file(str(MXFP4 / "model.experts-mxfp4.safetensors"))


@pytest.fixture(scope="module")
def materialized(tmp_path_factory) -> dict[str, Path]:
    """The suite's own resolution of the embedded aliases (the shared cache)."""
    work = tmp_path_factory.mktemp("models")
    return {a: Path(hm.resolve_model(a, work).path) for a in ("tiny-gpt-oss", "tiny-gpt-oss-mxfp4")}


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
        actual = hm.file_sha256(path)
        assert actual == digest, (
            f"{folder.name}/{name}: sha256 {actual} != {digest} in SHA256SUMS (file changed or corrupt, "
            f"e.g. a Git LFS pointer); regenerate: {regen}")


def test_tiktoken_file_is_o200k_base():
    build = hm._load_module(TOKENIZER / "build.py", "_test_tokenizer_build")
    ranks = build.load_ranks()  # checks the sha256 446a9538...
    assert len(ranks) == 199998 and ranks[b"!"] == 0


def test_mxfp4_manifest_points_at_the_bf16_files():
    m = json.loads((MXFP4 / "compact.json").read_text())
    bf = json.loads((BF16 / "compact.json").read_text())
    assert m["weights"][0] == f"../tiny-gpt-oss/{bf['weights'][0]}" and m["vocab_map"] == f"../tiny-gpt-oss/{bf['vocab_map']}"
    for rel, digest in m["sha256"].items():
        assert hm.file_sha256(MXFP4 / rel) == digest, f"{rel} changed since the MXFP4 sibling was made; regenerate: {REGEN['tiny-gpt-oss-mxfp4']}"


def test_embedded_models_are_small():
    """The repository travels to GPU machines under a 64 MiB limit: the compact checkpoints and the
    tokenizer together stay under 20 MiB (the expanded ones are ~214 MB each, never committed)."""
    folders = (BF16, MXFP4, TOKENIZER)
    total = sum(p.stat().st_size for d in folders for p in d.iterdir() if p.is_file())
    assert total < 20 * 2**20, f"embedded models take {total / 2**20:.1f} MiB (budget 20 MiB)"


# ----------------------------------------------------------------------------- architecture
@pytest.mark.parametrize("folder", [BF16, MXFP4], ids=lambda p: p.name)
def test_config_has_the_real_gpt_oss_features(folder: Path):
    c = _config(folder)
    assert c["model_type"] == "gpt_oss" and c["architectures"] == ["GptOssForCausalLM"]
    assert c["vocab_size"] == VOCAB, "o200k_harmony ids (vLLM renders chats with openai_harmony)"
    assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (199998, 200002, 199999)
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
    assert c["tie_word_embeddings"] is False, "vLLM 0.26 skips lm_head when tied and never ties it"
    assert c["num_local_experts"] > c["num_experts_per_tok"] >= 2
    assert c.get("swiglu_limit", 7.0) == 7.0 and c.get("swiglu_alpha", 1.702) == 1.702
    assert c["torch_dtype"] == "bfloat16"
    assert c["hidden_size"] % 32 == 0 and c["intermediate_size"] % 32 == 0, "MXFP4 blocks need multiples of 32"
    if folder == MXFP4:
        q = c["quantization_config"]
        assert q["quant_method"] == "mxfp4"
        assert set(q["modules_to_not_convert"]) >= {
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}
        assert {k: v for k, v in c.items() if k != "quantization_config"} == _config(BF16)
    else:
        assert "quantization_config" not in c


@pytest.mark.parametrize("folder", [BF16, MXFP4], ids=lambda p: p.name)
def test_generation_config_stops_like_gpt_oss(folder: Path):
    g = json.loads((folder / "generation_config.json").read_text())
    assert g["eos_token_id"] == [200002, 199999, 200012], "<|return|>, <|endoftext|>, <|call|>"
    assert 200007 not in g["eos_token_id"], "<|end|> separates analysis from final: never a stop token"


def test_compact_vocab_map(vocab_map, bf16_weights):
    ids, C = vocab_map["ids"], vocab_map["rows"]
    assert vocab_map["vocab_size"] == VOCAB and C == len(ids) + 1 and vocab_map["other_row"] == C - 1
    assert 1024 <= C <= 8192, f"C = {C}: keep the compact vocabulary small"
    assert vocab_map["other_stands_for"] == VOCAB - len(ids)
    assert set(HARMONY.values()) <= set(ids), "every harmony special the chat path uses has its own row"
    assert all(0 <= i < VOCAB for i in ids) and ids == sorted(set(ids))
    H = _config(BF16)["hidden_size"]
    for k in hm.VOCAB_ROW_TENSORS:
        assert tuple(bf16_weights[k].shape) == (C, H), (k, tuple(bf16_weights[k].shape))


def test_chat_preamble_is_covered_by_the_compact_vocab(vocab_map):
    """vLLM's system preamble (harmony-rendered) and a harmony answer use only rows of their own."""
    oh, enc = _harmony()
    sys_msg = oh.Message.from_role_and_content(
        oh.Role.SYSTEM, oh.SystemContent.new().with_conversation_start_date("2026-01-01"))
    conv = oh.Conversation.from_messages([sys_msg, oh.Message.from_role_and_content(oh.Role.USER, "What is 3 + 5?")])
    ids = enc.render_conversation_for_completion(conv, oh.Role.ASSISTANT)
    ids += enc.encode("<|channel|>analysis<|message|>3 + 5 = 8.<|end|><|start|>assistant<|channel|>final"
                      "<|message|>8<|return|>", allowed_special="all")
    missing = sorted(set(ids) - set(vocab_map["ids"]))
    assert not missing, f"ids without a compact row: {missing} ({enc.decode(missing)!r})"


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
    assert all(str(t.dtype) == "torch.bfloat16" for t in w.values())


def test_heldout_text():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hm.tokenizer_cache() / "tokenizer.json"))
    text = (BF16 / "heldout.txt").read_text()
    assert 2500 <= len(text.encode()) <= 6144
    n = len(tok.encode(text, add_special_tokens=False).ids)
    assert 800 <= n <= 1300, f"heldout.txt is {n} o200k tokens; ~1000 keeps prompt_logprobs x 201088 affordable"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text, "byte-level BPE must round-trip"


# ----------------------------------------------------------------------------- tokenizer
def test_tokenizer_is_o200k_harmony():
    from transformers import AutoTokenizer

    path = hm.tokenizer_cache()
    assert hm.cache_intact(path, full=True)
    tok = AutoTokenizer.from_pretrained(str(path))
    assert len(tok) == VOCAB
    vocab = tok.get_vocab()
    for s, i in HARMONY.items():
        assert vocab[s] == i, (s, vocab.get(s), i)
        assert tok.convert_ids_to_tokens(i) == s
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|return|>", "<|endoftext|>", "<|startoftext|>")
    assert tok.encode("<|channel|>final") == [200005, 17196], "vLLM 0.26's reasoning parser encodes this"
    assert tok.encode("<|message|>") == [200008]
    assert tok("def f():")["input_ids"][0] != 199998, "no BOS is added automatically"
    assert tok.decode([200006, 173781, 200005, 17196, 200008, 3686, 200002]) == \
        "<|start|>assistant<|channel|>final<|message|>hi<|return|>"


def test_tokenizer_encodes_like_harmony():
    from tokenizers import Tokenizer

    _, enc = _harmony()
    tok = Tokenizer.from_file(str(hm.tokenizer_cache() / "tokenizer.json"))
    for text in [(BF16 / "heldout.txt").read_text(), "héllo wörld 🙂 日本語  \r\n\t x'S 'll 123456",
                 "<|start|>user<|message|>What is 3 + 5?<|end|><|start|>assistant"]:
        assert tok.encode(text, add_special_tokens=False).ids == enc.encode(text, allowed_special="all"), text[:40]


# ----------------------------------------------------------------------------- materialization
def test_materialized_bf16_expands_the_compact_rows(materialized, vocab_map, bf16_weights):
    import torch
    from safetensors import safe_open

    path = materialized["tiny-gpt-oss"]
    assert hm.cache_intact(path, full=True), f"{path}: stamp does not match the files"
    assert (path / "config.json").read_bytes() == (BF16 / "config.json").read_bytes()
    assert (path / "generation_config.json").read_bytes() == (BF16 / "generation_config.json").read_bytes()
    ids = torch.tensor(vocab_map["ids"])
    unused = torch.ones(VOCAB, dtype=torch.bool)
    unused[ids] = False
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(bf16_weights)
        for k in f.keys():
            t = f.get_tensor(k)
            if k not in hm.VOCAB_ROW_TENSORS:
                assert torch.equal(t, bf16_weights[k]), k
                continue
            c = bf16_weights[k]
            assert tuple(t.shape) == (VOCAB, c.shape[1]) and t.dtype == c.dtype
            assert torch.equal(t[ids], c[:-1]), f"{k}: covered ids do not hold their compact rows"
            assert bool((t[unused] == c[-1]).all()), f"{k}: an unused id does not hold the 'other' row"


def test_materialized_mxfp4_has_the_gpt_oss_layout(materialized, bf16_weights, mxfp4_weights):
    import torch
    from safetensors import safe_open

    path = materialized["tiny-gpt-oss-mxfp4"]
    assert hm.cache_intact(path)
    expert_w = {n for n, *_ in _experts(_config(MXFP4))}
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert keys == (set(bf16_weights) - expert_w) | set(mxfp4_weights)
        for k in list(mxfp4_weights)[:4] + ["model.layers.0.mlp.experts.gate_up_proj_bias", "model.norm.weight"]:
            want = mxfp4_weights[k] if k in mxfp4_weights else bf16_weights[k]
            assert torch.equal(f.get_tensor(k), want), k
        with safe_open(str(materialized["tiny-gpt-oss"] / "model.safetensors"), "pt") as g:
            assert torch.equal(f.get_tensor("lm_head.weight"), g.get_tensor("lm_head.weight"))


@pytest.mark.parametrize("alias", ["gpt-oss-20b-shape", "gpt-oss-120b-shape"])
def test_shape_aliases_get_the_o200k_tokenizer(alias, tmp_path):
    m = hm.resolve_model(alias, tmp_path)
    path = Path(m.path)
    assert m.weights == "dummy" and hm.cache_intact(path)
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == [200002, 199999, 200012]
    tok = hm.tokenizer_cache()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (path / f).stat().st_size == (tok / f).stat().st_size
    assert _config(path)["vocab_size"] == VOCAB


# ----------------------------------------------------------------------------- MXFP4
def _experts(c: dict):
    E, H, I = c["num_local_experts"], c["hidden_size"], c["intermediate_size"]
    for i in range(c["num_hidden_layers"]):
        # name, BF16 shape (in x out), MXFP4 [E, N=out, K=in]
        yield f"model.layers.{i}.mlp.experts.gate_up_proj", (E, H, 2 * I), (E, 2 * I, H)
        yield f"model.layers.{i}.mlp.experts.down_proj", (E, I, H), (E, H, I)


def test_mxfp4_experts_file_layout(bf16_weights, mxfp4_weights):
    import torch

    c = _config(MXFP4)
    names = set()
    for name, bf16_shape, (E, N, K) in _experts(c):
        assert tuple(bf16_weights[name].shape) == bf16_shape
        blocks, scales = mxfp4_weights[name + "_blocks"], mxfp4_weights[name + "_scales"]
        assert blocks.dtype == torch.uint8 and tuple(blocks.shape) == (E, N, K // 32, 16), (name, blocks.shape)
        assert scales.dtype == torch.uint8 and tuple(scales.shape) == (E, N, K // 32), (name, scales.shape)
        assert tuple(bf16_weights[name + "_bias"].shape) == (E, N)
        names |= {name + "_blocks", name + "_scales"}
    assert set(mxfp4_weights) == names, "the MXFP4 file holds the experts' blocks and scales only"


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


def test_every_flavour_serves_chat_the_way_the_model_was_trained() -> None:
    """The chat prompt vLLM renders carries VLLM_SYSTEM_START_DATE; the model learned its harmony
    replies after the preamble of models/training/chat_data.py's START_DATE, and the tokenizer folder
    must hold the vocabulary openai-harmony would otherwise download."""
    import ast

    from harness.config.catalog import Catalog

    tree = ast.parse((REPO / "models" / "training" / "chat_data.py").read_text())
    start_date = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                      and getattr(n.targets[0], "id", "") == "START_DATE")
    catalog = Catalog()
    for name, flavour in catalog.flavours.items():
        env = {k: v.replace("${REPO}", str(REPO)) for k, v in flavour.env.items()}
        assert env.get("VLLM_SYSTEM_START_DATE") == start_date, f"flavour {name}: chat date differs from training"
        assert (Path(env["TIKTOKEN_ENCODINGS_BASE"]) / "o200k_base.tiktoken").is_file(), f"flavour {name}: no vocabulary"
        assert flavour.args.get("--reasoning-parser") == "openai_gptoss", f"flavour {name}: no harmony reasoning parser"
