"""kernels.tools.bench_prefill: the prefill A/B must always time the tiling the plugin serves, and say plainly when
it cannot measure (no GPU) instead of printing numbers."""

from __future__ import annotations

import os

import pytest
import torch

from kernels.tools import bench_prefill
from kernels.tuning import get_config

pytestmark = pytest.mark.level1_5


def test_the_grid_includes_the_served_tiling(monkeypatch):
    for var in [v for v in os.environ if v.startswith("KERNELS_PACKED_MM_") or v == "KERNELS_TUNING"]:
        monkeypatch.delenv(var)
    cfg = get_config("packed_mm", "sm_90")
    served = (cfg["block_m"], cfg["block_tiles"], cfg["num_warps"], cfg["num_stages"])
    assert served in bench_prefill.GRID, f"the served sm_90 tiling {served} is not timed against stock"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses_with_the_reason(capsys):
    assert bench_prefill.main(["--m", "64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
