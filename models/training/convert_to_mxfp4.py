#!/usr/bin/env python3
"""Make the MXFP4 sibling of the compact BF16 tiny gpt-oss (real gpt-oss MXFP4 expert layout), and verify it.

The MoE experts become, per layer ``model.layers.{i}.mlp.experts.``:

* ``gate_up_proj_blocks`` uint8 [E, 2I, H/32, 16], ``gate_up_proj_scales`` uint8 [E, 2I, H/32]
  (gate/up rows interleaved, as in the BF16 weights)
* ``down_proj_blocks``    uint8 [E, H, I/32, 16],  ``down_proj_scales``    uint8 [E, H, I/32]

i.e. out x in, while transformers' BF16 ``GptOssExperts`` stores ``gate_up_proj`` [E, H, 2I]
and ``down_proj`` [E, I, H] (in x out, used as ``x @ W``): the weights are transposed before
``kernels.mxfp4.quantize_gpt_oss_experts`` (OCP MX v1.0: shared exponent floor(log2 amax) - 2,
E2M1 round-to-nearest-even, saturating). Everything else (attention incl. sinks, router, norms,
expert biases ``*_bias`` bf16, embed_tokens, lm_head) stays BF16, as in openai/gpt-oss-20b, whose
``quantization_config`` this config copies.

Stored compactly: ``model.experts-mxfp4.safetensors`` holds only the blocks and scales; the
BF16 tensors are the BF16 sibling's (``compact.json`` lists both files, with the sha256 of the
BF16 files it was made from). ``harness/engine/models.py`` materializes the full checkpoint: the BF16
tensors minus the two BF16 expert weights per layer, plus blocks and scales, embed/lm_head expanded
to 201088 rows -- the openai/gpt-oss-20b layout.

Verification (printed, and written to the MODEL_CARD.md of the output), on the materialized checkpoints:

1. transformers' own ``convert_moe_packed_tensors(blocks, scales)`` (which returns the
   [E, in, out] orientation) equals ``dequantize_gpt_oss_experts(blocks, scales).transpose(1, 2)``
   bit for bit, and is within the MXFP4 rounding bound of the BF16 experts.
2. The materialized checkpoint loads in transformers with ``Mxfp4Config(dequantize=True)`` (CPU); its
   logits equal those of the BF16 model whose experts are replaced by the dequantized weights, and
   are compared with the BF16 model's (the quantization error) on code prompts; greedy chat too.

Usage::

    .venv/bin/python models/training/convert_to_mxfp4.py [--src models/tiny-gpt-oss] [--out models/tiny-gpt-oss-mxfp4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from harness.engine.models import file_sha256 as sha256  # noqa: E402

MODULES_TO_NOT_CONVERT = [
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
]
EXPERTS_FILE = "model.experts-mxfp4.safetensors"
PROMPTS = [
    "def ",
    "import os\nimport sys\n\n",
    "class Foo:\n    def __init__(self, name):\n        self.",
    "    for i in range(len(",
]
CHATS = [
    {"messages": [{"role": "user", "content": "What is the capital of France? Please reply with one word only"}]},
    {"messages": [{"role": "user", "content": "What is 3 + 5?"}]},
    {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": None},
]


def mxfp4_error_bound(w, blocks, scales):
    """(bound, saturated) per element of w [E, N, K] (float32): see tests/level1_smoke/
    test_embedded_model.py for the derivation. bound = half the E2M1 step at |w|/2^e times 2^e;
    saturated = |w|/2^e > 6 (dequantizes to +-6 * 2^e)."""
    import torch

    e = scales.to(torch.int32) - 127
    scale = torch.pow(2.0, e.to(torch.float32)).repeat_interleave(32, dim=-1)
    v = w.abs() / scale
    half_step = torch.where(v <= 2, 0.25, torch.where(v <= 4, 0.5, 1.0))
    return half_step * scale, v > 6, scale


def heldout_ppl(model, ids, chunk: int = 256) -> float:
    """Perplexity of one sequence, lm_head applied in chunks (201088 logits per position)."""
    import torch

    with torch.no_grad():
        h = model.model(input_ids=ids).last_hidden_state[0, :-1]
        nll = 0.0
        for s in range(0, h.shape[0], chunk):
            lp = torch.log_softmax(model.lm_head(h[s:s + chunk]).float(), -1)
            nll -= lp.gather(1, ids[0, 1 + s:1 + s + chunk, None]).sum().item()
    return float(torch.exp(torch.tensor(nll / h.shape[0])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=str(REPO / "models/tiny-gpt-oss"))
    ap.add_argument("--out", default=str(REPO / "models/tiny-gpt-oss-mxfp4"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, GptOssForCausalLM, Mxfp4Config
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    import chat_data
    from harness.engine import models as hm
    from kernels.mxfp4 import dequantize_gpt_oss_experts, quantize_gpt_oss_experts

    torch.set_num_threads(args.threads)
    src, out = Path(args.src).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if p.is_file():
            p.unlink()

    src_man = json.loads((src / hm.MANIFEST).read_text())
    cfg = json.loads((src / "config.json").read_text())
    E, H, I = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    src_weights = src / src_man["weights"][0]
    sd = load_file(str(src_weights))
    new = {}
    worst = {"gate_up": 0.0, "down": 0.0}
    n_sat = 0
    for name, t in sd.items():
        if not (name.endswith(".mlp.experts.gate_up_proj") or name.endswith(".mlp.experts.down_proj")):
            continue
        kind = "gate_up" if name.endswith("gate_up_proj") else "down"
        exp_in_out = (E, H, 2 * I) if kind == "gate_up" else (E, I, H)
        assert tuple(t.shape) == exp_in_out, (name, tuple(t.shape), exp_in_out)
        w = t.transpose(1, 2).contiguous()  # [E, out, in]
        blocks, scales = quantize_gpt_oss_experts(w)
        n_out, n_in = w.shape[1], w.shape[2]
        assert tuple(blocks.shape) == (E, n_out, n_in // 32, 16) and blocks.dtype == torch.uint8
        assert tuple(scales.shape) == (E, n_out, n_in // 32) and scales.dtype == torch.uint8
        new[name + "_blocks"] = blocks.contiguous()
        new[name + "_scales"] = scales.contiguous()

        # check 1: transformers' dequantizer == ours (transposed) == BF16 within the bound
        deq_tf = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        deq_ours = dequantize_gpt_oss_experts(blocks, scales, torch.float32)
        assert torch.equal(deq_tf, deq_ours.transpose(1, 2)), f"{name}: transformers != kernels.mxfp4"
        assert tuple(deq_tf.shape) == tuple(t.shape), (deq_tf.shape, t.shape)
        wf = w.float()
        bound, sat, scale = mxfp4_error_bound(wf, blocks, scales)
        err = (deq_ours - wf).abs()
        ok = (err <= bound) | sat
        assert bool(ok.all()), f"{name}: {int((~ok).sum())} elements outside the MXFP4 bound"
        assert torch.equal(deq_ours[sat].abs(), 6 * scale[sat]), f"{name}: saturated elements not +-6*2^e"
        n_sat += int(sat.sum())
        rel = (deq_tf - t.float()).norm() / t.float().norm()
        worst[kind] = max(worst[kind], rel.item())
    save_file(dict(sorted(new.items())), str(out / EXPERTS_FILE), metadata={"format": "pt"})
    os.chmod(out / EXPERTS_FILE, 0o644)

    qcfg = dict(cfg)
    qcfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MODULES_TO_NOT_CONVERT}
    (out / "config.json").write_text(json.dumps(dict(sorted(qcfg.items())), indent=2) + "\n")
    shutil.copyfile(src / "generation_config.json", out / "generation_config.json")
    rel_src = os.path.relpath(src, out)
    base_files = [f"{rel_src}/{src_man['weights'][0]}", f"{rel_src}/{src_man['vocab_map']}"]
    manifest = {"format": "compact-gpt-oss/1", "vocab_map": base_files[1], "weights": [base_files[0], EXPERTS_FILE],
                "sha256": {f: sha256(out / f) for f in base_files}}
    (out / hm.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {out}: experts relative Frobenius error gate_up {worst['gate_up']:.4f}, "
          f"down {worst['down']:.4f}; {n_sat} saturated elements")

    # check 2: the materialized checkpoints in transformers (MXFP4 dequantized on CPU)
    tmp = Path(tempfile.mkdtemp(prefix="tiny-gpt-oss-convert-"))
    try:
        d_bf16 = hm.materialize_compact(src, tmp / "bf16")
        d_q = hm.materialize_compact(out, tmp / "mxfp4")
        from safetensors import safe_open

        with safe_open(str(d_q / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        with safe_open(str(d_bf16 / "model.safetensors"), "pt") as f:
            bkeys = set(f.keys())
        expert_w = {k for k in bkeys if k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))}
        assert keys == (bkeys - expert_w) | {k + s for k in expert_w for s in ("_blocks", "_scales")}, \
            "materialized MXFP4 tensor names are not the gpt-oss layout"
        tok = AutoTokenizer.from_pretrained(str(d_bf16))
        bf16 = GptOssForCausalLM.from_pretrained(str(d_bf16), dtype=torch.bfloat16, attn_implementation="eager").eval()
        q = GptOssForCausalLM.from_pretrained(str(d_q), dtype=torch.bfloat16, attn_implementation="eager",
                                              quantization_config=Mxfp4Config(dequantize=True)).eval()
        ref = GptOssForCausalLM.from_pretrained(str(d_bf16), dtype=torch.bfloat16, attn_implementation="eager").eval()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with torch.no_grad():
        for i, layer in enumerate(ref.model.layers):
            ex = layer.mlp.experts
            for proj in ("gate_up_proj", "down_proj"):
                k = f"model.layers.{i}.mlp.experts.{proj}"
                getattr(ex, proj).copy_(convert_moe_packed_tensors(new[k + "_blocks"], new[k + "_scales"]))
            qex = q.model.layers[i].mlp.experts
            assert torch.equal(qex.gate_up_proj.to(torch.bfloat16), ex.gate_up_proj), "loaded gate_up differs"
            assert torch.equal(qex.down_proj.to(torch.bfloat16), ex.down_proj), "loaded down differs"

    rows = []
    max_abs_q_bf16 = max_rel_q_bf16 = max_abs_q_ref = 0.0
    greedy_same = 0
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt")["input_ids"]
            lb, lq, lr = (m(input_ids=ids).logits.float()[0] for m in (bf16, q, ref))
            d = (lq - lb).abs().max().item()
            r = d / lb.abs().max().item()
            dr = (lq - lr).abs().max().item()
            same = int((lq.argmax(-1) == lb.argmax(-1)).sum()), lb.shape[0]
            gb = bf16.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None)[0, ids.shape[1]:]
            gq = q.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None)[0, ids.shape[1]:]
            greedy_same += int(torch.equal(gb, gq))
            rows.append((p, ids.shape[1], d, r, dr, same, tok.decode(gb), tok.decode(gq)))
            max_abs_q_bf16, max_rel_q_bf16 = max(max_abs_q_bf16, d), max(max_rel_q_bf16, r)
            max_abs_q_ref = max(max_abs_q_ref, dr)
            print(f"{p!r}: {ids.shape[1]} tokens, max|logits MXFP4 - BF16| {d:.4f} (rel to max|BF16 logit| {r:.4f}), "
                  f"MXFP4 vs BF16-with-dequantized-experts {dr:.2e}, argmax agree {same[0]}/{same[1]}, "
                  f"greedy 24 {'same' if torch.equal(gb, gq) else 'DIFFERENT'}")
    assert max_abs_q_ref == 0.0, "MXFP4 load != BF16 with dequantized experts"

    chats = []
    for req in CHATS:
        req = {k: (v if v is not None else [chat_data.WEATHER_TOOL]) for k, v in req.items()}
        ids = torch.tensor([chat_data.render_prompt(req)])
        outs = []
        for m in (bf16, q):
            with torch.no_grad():
                g = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                               eos_token_id=[200002, 200012, 199999])[0, ids.shape[1]:]
            outs.append(tok.decode(g.tolist()))
        chats.append((req["messages"][-1]["content"], "tools" in req, *outs))
        print(f"chat {chats[-1][0]!r}: BF16 {outs[0]!r} / MXFP4 {outs[1]!r}")

    ids = tok((src / "heldout.txt").read_text(), return_tensors="pt")["input_ids"]
    ppl = {"bf16": heldout_ppl(bf16, ids), "mxfp4": heldout_ppl(q, ids)}
    print(f"heldout.txt perplexity ({ids.shape[1]} tokens): BF16 {ppl['bf16']:.3f}, MXFP4 {ppl['mxfp4']:.3f}")

    table = "\n".join(
        f"| `{p!r}` | {n} | {d:.4f} | {r:.4f} | {dr:.1e} | {s[0]}/{s[1]} | `{gb!r}` | `{gq!r}` |"
        for p, n, d, r, dr, s, gb, gq in rows
    )
    chat_table = "\n".join(f"| {'(tools) ' if t else ''}`{c!r}` | `{b!r}` | `{m!r}` |" for c, t, b, m in chats)
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in ("SHA256SUMS", "MODEL_CARD.md"))
    sums = "\n".join(f"| `{f}` | {(out / f).stat().st_size} | `{sha256(out / f)}` |" for f in files)
    card = f"""# tiny-gpt-oss-mxfp4

`models/tiny-gpt-oss` (see its MODEL_CARD.md) with the MoE experts in the real gpt-oss MXFP4
checkpoint layout; made by `models/training/convert_to_mxfp4.py` ({datetime.date.today().isoformat()},
transformers {transformers.__version__}, torch {torch.__version__}). For the GPU machines: vLLM's
MXFP4 MoE does not run on this CPU (it needs AMX), so the CPU flavour serves the BF16 sibling.

- experts: `model.layers.{{i}}.mlp.experts.gate_up_proj_blocks` uint8 [{E}, {2*I}, {H//32}, 16], `_scales` uint8
  [{E}, {2*I}, {H//32}] (gate/up rows interleaved); `down_proj_blocks` [{E}, {H}, {I//32}, 16], `down_proj_scales`
  [{E}, {H}, {I//32}]: out x in, the BF16 weights transposed and quantized by
  `kernels.mxfp4.quantize_gpt_oss_experts` (OCP MX v1.0, E8M0 scale = floor(log2 amax) - 2 per 32, E2M1
  round-to-nearest-even, saturating at +-6); biases `*_proj_bias` bf16 [{E}, {2*I}] / [{E}, {H}].
- stored compactly: `{EXPERTS_FILE}` holds only the blocks and scales; every BF16 tensor
  (attention incl. sinks, router, norms, expert biases, the compact embed_tokens/lm_head) is the BF16
  sibling's `{src_man['weights'][0]}`, listed in `{hm.MANIFEST}` with its sha256. `harness/engine/models.py`
  materializes the openai/gpt-oss-20b layout: BF16 tensors minus the BF16 expert weights, plus blocks and
  scales, embed/lm_head expanded to {cfg['vocab_size']} rows, the o200k_harmony tokenizer.
- `quantization_config` = `{json.dumps(qcfg['quantization_config'])}` (as openai/gpt-oss-20b);
  generation_config copied unchanged.

## Verification
- transformers' `convert_moe_packed_tensors` == `kernels.mxfp4.dequantize_gpt_oss_experts(...).transpose(1, 2)`
  bit for bit; every element within half an E2M1 step (x 2^scale) of the BF16 weight, {n_sat} saturated
  elements exactly +-6 x 2^scale; relative Frobenius error of the experts: gate_up {worst['gate_up']:.4f},
  down {worst['down']:.4f}.
- the materialized checkpoint's tensor names are the gpt-oss MXFP4 layout; transformers
  `Mxfp4Config(dequantize=True)` load on CPU: logits identical (max abs diff {max_abs_q_ref:.1e}) to
  the BF16 model with its experts replaced by the dequantized weights. Against the BF16 model (the MXFP4
  quantization error), all positions of each prompt, eager attention, bf16:

| prompt | tokens | max abs diff | / max abs BF16 logit | vs BF16+dequant experts | argmax agree | BF16 greedy 24 | MXFP4 greedy 24 |
|---|---|---|---|---|---|---|---|
{table}

Max over prompts: abs {max_abs_q_bf16:.4f}, relative {max_rel_q_bf16:.4f}; greedy continuations identical for
{greedy_same}/{len(PROMPTS)} prompts (a tiny model without quantization-aware training: MXFP4 moves
near-tie argmaxes). `heldout.txt` perplexity (one sequence of {ids.shape[1]} tokens): BF16 {ppl['bf16']:.3f},
MXFP4 {ppl['mxfp4']:.3f}.

Greedy chat (vLLM-rendered prompt, raw harmony output):

| request | BF16 | MXFP4 |
|---|---|---|
{chat_table}

## Files (sha256; `SHA256SUMS` covers these and this card)
| file | bytes | sha256 |
|---|---|---|
{sums}

## Regenerate
`.venv/bin/python models/training/convert_to_mxfp4.py` (deterministic given the BF16 checkpoint).
"""
    (out / "MODEL_CARD.md").write_text(card)
    sums_all = {p.name: sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != "SHA256SUMS"}
    (out / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sums_all.items()))
    print(f"max over prompts: |MXFP4 - BF16| {max_abs_q_bf16:.4f} (rel {max_rel_q_bf16:.4f}); "
          f"greedy identical {greedy_same}/{len(PROMPTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
