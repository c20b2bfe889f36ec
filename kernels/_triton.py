"""Import Triton so the kernels run everywhere the suite runs.

Without CUDA, Triton kernels only run in its interpreter, which `@triton.jit` selects from
TRITON_INTERPRET at decoration time. So when no GPU is visible and the user has not chosen, we turn
the interpreter on BEFORE the kernel modules decorate anything (on CPU torch tensors it is exact,
just slow: tests keep shapes small there).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

__all__ = ["triton", "tl", "INTERPRET", "check_device", "_dot_bf16", "_round_bf16", "StaticCountCase"]


class StaticCountCase(NamedTuple):
    """One Triton kernel configuration for kernels.tools.sass_count (compiled for an arch without a GPU)."""

    name: str  # also its key in kernels/sass_budget.yaml
    fn: Any  # the @triton.jit kernel
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    words_per_pass: float  # 32-bit weight words one thread consumes per pass of the loop
    marker: str  # an opcode substring the loop's math contains (HFMA2, MMA: HMMA on sm_12x, HGMMA on sm_90)
    # arguments the JIT specializes as multiples of 16 at the shapes served (16-byte-aligned torch pointers, gpt-oss
    # dims and strides): without them the compiled loop computes masks and scalar loads it never runs with
    divisible: tuple[str, ...] = ()
    num_stages: int = 1


def check_device(*tensors: torch.Tensor) -> None:
    """The compiled kernels need CUDA tensors; the interpreter needs CPU tensors."""
    for t in tensors:
        if t is None:
            continue
        if INTERPRET and t.is_cuda:
            raise RuntimeError("TRITON_INTERPRET=1 runs kernels on CPU tensors; move inputs to the CPU")
        if not INTERPRET and not t.is_cuda:
            raise RuntimeError(
                "Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 with CPU tensors, slow, for checking)"
            )


# Helpers every kernel module uses where the interpreter and the GPU differ.


@triton.jit
def _dot_bf16(a, b, acc, INTERPRETED: tl.constexpr):
    """acc + a @ b for bf16 a, b. Triton's interpreter (3.9) multiplies the raw uint16 bit patterns
    of bf16 operands in tl.dot, so there we upcast to fp32 first (exact, ieee precision)."""
    if INTERPRETED:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        r = tl.dot(a, b, acc)
    return r


@triton.jit
def _round_bf16(x, INTERPRETED: tl.constexpr):
    """float32 -> bf16, round-to-nearest-even. The GPU cast already does RNE; Triton's interpreter
    (3.9) truncates, so there we round the bit pattern ourselves first (the cast is then exact)."""
    if INTERPRETED:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        r = b.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        r = x.to(tl.bfloat16)
    return r
