"""Import Triton so the kernels run everywhere the suite runs.

Without CUDA, Triton kernels only run in its interpreter, which `@triton.jit` selects from
TRITON_INTERPRET at decoration time. So when no GPU is visible and the user has not chosen, we turn
the interpreter on BEFORE the kernel modules decorate anything (on CPU torch tensors it is exact,
just slow: tests keep shapes small there).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

__all__ = ["triton", "tl", "INTERPRET", "check_device"]


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
