"""The gpt-oss shapes the kernels are tested and measured at, and the conformance tolerances: defined here once.

Shapes are the real models' (models/shapes/gpt-oss-{120b,20b}/config.json; tests/level1_5_kernels/
test_kernel_cases.py checks these numbers against those files). The tests, the benchmark and the profilers
import them, so a shape or a bound changes in one place.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeLayer:
    """One MoE block: `experts` of which `top_k` run per token; gate_up is [2 * inter, hidden], down [hidden, inter]."""

    experts: int
    top_k: int
    hidden: int
    inter: int


@dataclass(frozen=True)
class GptOss:
    """The dimensions of a gpt-oss model that fix the decode kernels' shapes (names as in its config.json)."""

    name: str
    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size (per expert)
    experts: int  # num_local_experts
    top_k: int  # num_experts_per_tok
    q_heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int
    vocab: int  # vocab_size

    @property
    def moe(self) -> MoeLayer:
        return MoeLayer(self.experts, self.top_k, self.hidden, self.intermediate)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """The decode GEMV shapes, name -> (N, K) with y = x @ W.T and W [N, K]; lm_head first (the largest)."""
        return {
            "lm_head": (self.vocab, self.hidden),
            "qkv": ((self.q_heads + 2 * self.kv_heads) * self.head_dim, self.hidden),
            "o_proj": (self.hidden, self.q_heads * self.head_dim),
            "expert_gate_up": (2 * self.intermediate, self.hidden),  # gate and up rows of one expert
            "expert_down": (self.hidden, self.intermediate),
        }


GPT_OSS_120B = GptOss("gpt-oss-120b", layers=36, hidden=2880, intermediate=2880, experts=128, top_k=4,
                      q_heads=64, kv_heads=8, head_dim=64, vocab=201088)
GPT_OSS_20B = GptOss("gpt-oss-20b", layers=24, hidden=2880, intermediate=2880, experts=32, top_k=4,
                     q_heads=64, kv_heads=8, head_dim=64, vocab=201088)
MODELS = (GPT_OSS_120B, GPT_OSS_20B)

# What the tests and tools run: the 120b's shapes (the 20b's layers are the same sizes, fewer experts and layers).
HIDDEN = GPT_OSS_120B.hidden  # K of every projection but o_proj; the width of x
LINEAR_SHAPES = GPT_OSS_120B.linear_shapes()  # name -> (N, K)
MOE = GPT_OSS_120B.moe  # the decode MoE layer: 128 experts, top-4, 2880 <-> 2 x 2880 / 2880
# The same layer as vLLM allocates it for its Marlin MoE backend, the default on GB10: hidden rounded up to 256 and
# intermediate to 128 (vLLM's mxfp4_round_up_hidden_size_and_intermediate_size), zeros the loader never writes. The
# plugin packs the model's own sizes where vLLM's MoE config gives them, and this layout as allocated where it does
# not: then our kernels run these sizes.
MOE_MARLIN_PADDED = MoeLayer(MOE.experts, MOE.top_k, 3072, 2944)

# Conformance bounds on NMSE = sum((out - ref)^2) / sum(ref^2) against the fp32 references (kernels/reference.py).
# Full derivations: the docstrings of tests/level1_5_kernels/test_kernel_gemv.py and test_kernel_moe.py.
GEMV_NMSE = 2e-5  # exact operands, fp32 accumulation, one BF16 output rounding (<= 2**-16 = 1.53e-5) + margin
MATMUL_NMSE = 1e-4  # dequantize + torch.matmul: cuBLAS may round BF16 partial sums a few times, ~6x one rounding
MOE_NMSE = 5e-5  # BF16 h between the GEMMs (~3e-6 expected) + BF16 output rounding (1.53e-5), 10x margin on the first
# Softmax routing weights against fp32 torch: fp32 rounding of a k-element softmax (torch.testing's rtol / atol).
ROUTE_WEIGHTS_TOL = {"rtol": 1e-5, "atol": 1e-6}
