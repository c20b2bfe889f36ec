"""Heldout perplexity of the embedded tiny gpt-oss on CPU (transformers) as the served configs quantize it:
`python scripts/dense_quant_ppl.py`.

Why: `gemv-bf16-mxfp4-all` (layers=all) serves qkv / o_proj / lm_head from MXFP4 copies made by the plugin at load
(`suite_kernels.dense_method`: `kernels.mxfp4.quantize_mxfp4` of the BF16 weight), for every M since the plugin keeps
one copy of the weights. When its level 2 perplexity moves, this says how much of the move the quantization itself
explains, with no GPU and no vLLM: the same quantizer, applied step by step to the BF16 model.

Rows: BF16; the experts through the MXFP4 checkpoint's quantizer (`tiny-gpt-oss-mxfp4`, what every GPU config
serves); + qkv and o_proj through `quantize_mxfp4`; + lm_head (all of layers=all); the same architecture untrained,
against which level 2's "embedded model is trained" bound is set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "models" / "training")]

from convert_to_mxfp4 import heldout_ppl  # noqa: E402
from harness.engine import models as hm  # noqa: E402
from kernels.mxfp4 import (  # noqa: E402
    dequantize_gpt_oss_experts,
    dequantize_mxfp4,
    quantize_gpt_oss_experts,
    quantize_mxfp4,
)


def _round_trip(linear: torch.nn.Linear) -> None:
    q, s = quantize_mxfp4(linear.weight.data.float())
    linear.weight.data = dequantize_mxfp4(q, s, torch.float32).to(linear.weight.dtype)


def main(argv: list[str] | None = None) -> int:
    # no options: --help says what it measures, anything else is refused before the minutes of loading
    argparse.ArgumentParser(prog="dense_quant_ppl", description=__doc__.split("\n\n")[0]).parse_args(argv)
    from transformers import AutoTokenizer, GptOssForCausalLM

    path = hm.materialize_compact(REPO / "models" / "tiny-gpt-oss")
    model = GptOssForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids = AutoTokenizer.from_pretrained(path)((REPO / "models/tiny-gpt-oss/heldout.txt").read_text(), return_tensors="pt").input_ids
    rows = [("BF16", heldout_ppl(model, ids))]
    for layer in model.model.layers:
        experts = layer.mlp.experts
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(experts, name).data  # [E, in, out]
            blocks, scales = quantize_gpt_oss_experts(w.transpose(1, 2).contiguous().float())
            getattr(experts, name).data = dequantize_gpt_oss_experts(blocks, scales).transpose(1, 2).contiguous().to(w.dtype)
    rows.append(("MXFP4 experts (tiny-gpt-oss-mxfp4)", heldout_ppl(model, ids)))
    for layer in model.model.layers:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            _round_trip(getattr(layer.self_attn, name))
    rows.append(("+ qkv / o_proj MXFP4", heldout_ppl(model, ids)))
    _round_trip(model.lm_head)
    rows.append(("+ lm_head MXFP4 (layers=all)", heldout_ppl(model, ids)))
    torch.manual_seed(0)  # level 2's "trained" bound sits between these rows and this one
    rows.append(("untrained (transformers init, seed 0)", heldout_ppl(GptOssForCausalLM(model.config).to(torch.bfloat16).eval(), ids)))
    print(f"heldout.txt, {ids.shape[1]} tokens")
    for name, ppl in rows:
        print(f"{name:36s} {ppl:9.3f}  ({ppl / rows[1][1] - 1:+.2%} against the MXFP4-experts model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
