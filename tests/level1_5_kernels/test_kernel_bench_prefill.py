"""kernels.tools.bench_prefill: the prefill A/B must always time the tiling the plugin serves, and say plainly when
it cannot measure (no GPU) instead of printing numbers."""

from __future__ import annotations

import os

import pytest
import torch

from kernels.packed_mm import _cuda_variant
from kernels.tools import bench_prefill
from kernels.tuning import get_config

pytestmark = pytest.mark.level1_5


def test_the_grid_includes_the_served_tiling(monkeypatch):
    for var in [v for v in os.environ if v.startswith("KERNELS_PACKED_MM_") or v == "KERNELS_TUNING"]:
        monkeypatch.delenv(var)
    cfg = get_config("packed_mm", "sm_90")
    triton = ("triton", cfg["block_m"], cfg["block_tiles"], cfg["num_warps"], cfg["num_stages"])
    assert triton in bench_prefill.GRID, f"the sm_90 Triton tiling {triton} is not timed against stock"
    for moe in (False, True):  # the CUDA kernel's pick for the dense layers and for the MoE
        served = ("cuda", _cuda_variant(cfg, moe))
        assert served in bench_prefill.GRID, f"the CUDA tiling served (moe={moe}), {served}, is not timed"


def test_env_lines_select_the_entry(monkeypatch):
    """The --env-out lines a served run takes must select that entry's implementation and tiling."""
    for var in [v for v in os.environ if v.startswith("KERNELS_PACKED_MM_") or v == "KERNELS_TUNING"]:
        monkeypatch.delenv(var)
    for c in (bench_prefill.GRID[0], ("cuda", 3)):
        for kv in bench_prefill.env_lines(c).split()[1:]:
            k, v = kv.split("=")
            monkeypatch.setenv(k, v)
        cfg = get_config("packed_mm", "sm_90")
        want = bench_prefill._cfg(c)
        assert {k: cfg[k] for k in want} == want, c


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses_with_the_reason(capsys):
    assert bench_prefill.main(["--m", "64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
