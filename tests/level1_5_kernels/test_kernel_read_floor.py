"""The plain-read yardstick the bench prints next to the MoE layer (kernels/tools/read_floor.py) reads every byte it is
timed on, once: a read kernel that skipped or repeated blocks would make the yardstick look faster than a read.
Runs compiled on a GPU and in the Triton interpreter on CPU."""
from __future__ import annotations

import functools
import operator

import pytest
import torch

from kernels.tools.read_floor import TILINGS, reader
from kernels.testing import DEV, fresh_seed, generator

pytestmark = pytest.mark.level1_5


@pytest.mark.parametrize("tiling", TILINGS)
def test_read_kernel_xors_every_element_once(tiling):
    block, iters, warps = tiling
    seed = fresh_seed()
    g = generator(seed, DEV)
    # Not a multiple of any program's span (masked tail), and a few programs' worth on CPU; XOR is order-free, and a
    # skipped or doubly read element changes it unless that element is 0 (2**-31 per element for random data).
    n = 3 * block * iters + 17
    t = torch.randint(-(1 << 31), (1 << 31) - 1, (n + 64,), dtype=torch.int32, generator=g, device=DEV)
    read, out = reader(4 * n, block, iters, warps, DEV)
    read(t)
    got = functools.reduce(operator.xor, out.cpu().tolist(), 0)
    want = functools.reduce(operator.xor, t[:n].cpu().tolist(), 0)
    assert got == want, f"seed={seed}: the read kernel ({tiling}) did not read elements 0..{n - 1} exactly once"
