"""What a plain read of the same bytes costs: the yardstick the MoE layer's time is read against (GPU only).

The MoE floor in `kernels.tools.bench` is bytes / copy bandwidth (a 1 GiB copy). A decode layer reads ~53 MB in two
dependent launches (gate_up's weights, then down's, which need gate_up's output), and a read that short never
reaches the copy rate: it pays a launch, a ramp and a tail. `plain_read_us` times a plain vectorized read kernel
(each program XORs its 16-byte loads into one output, so nothing is elided) over the given byte counts, one launch
per part in stream order, in a CUDA graph with rotating buffers as the bench times the layer, and returns the best
time over a few tilings. It is a reference, not a bound: a better read kernel could be faster.
"""

from __future__ import annotations

import torch

from .._triton import tl, triton
from .timing import n_buffers, time_calls

# (int32 elements per load step, steps per program, warps). H200 sweeps of these kernels (a loop, then the steps
# unrolled so that all of a program's loads are issued before the first is used) put these among the fastest for
# the MoE's byte counts: 52.9 MB in one launch 13.8-14.3 us, 35.3 + 17.6 MB in two 15.5-16.7 us. On 1 GiB they read
# 3.4-3.7 TB/s, below the ~4.1 TB/s the lm_head GEMV streams at (308 MB in 75 us), so they may overstate what a
# short read costs by up to ~10%: a reference for the MoE layer, not a floor.
TILINGS = ((512, 16, 4), (1024, 16, 8), (1024, 16, 4), (1024, 8, 4))


@triton.jit
def _read_kernel(src, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(ITERS):  # unrolled: every load of the program in flight at once
        offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


def reader(nbytes: int, block: int, iters: int, warps: int, device: torch.device | str):
    """(read, out): read(t) XORs the first nbytes of int32 tensor t into out, one output block per program."""
    n = nbytes // 4
    grid = triton.cdiv(n, block * iters)
    out = torch.empty(grid * block, dtype=torch.int32, device=device)

    def read(t: torch.Tensor) -> None:
        _read_kernel[(grid,)](t, out, n, BLOCK=block, ITERS=iters, num_warps=warps)

    return read, out


def plain_read_us(parts: list[int], l2_bytes: int, reps: int) -> float:
    """Best microseconds per call of reading `parts` bytes one launch after another (a fresh buffer each call)."""
    total = sum(parts)
    nb = n_buffers(total, l2_bytes)
    bufs = [torch.randint(0, 1 << 30, (total // 4,), dtype=torch.int32, device="cuda") for _ in range(nb)]
    offsets = [sum(parts[:i]) // 4 for i in range(len(parts))]
    best = float("inf")
    for block, iters, warps in TILINGS:
        readers = [reader(p, block, iters, warps, bufs[0].device)[0] for p in parts]

        def call(b: torch.Tensor, readers=readers) -> None:
            for read, off in zip(readers, offsets):
                read(b[off:])

        best = min(best, time_calls([lambda b=b, call=call: call(b) for b in bufs], reps, max(32, nb)))
    del bufs
    torch.cuda.empty_cache()
    return best
