"""kernels/tools/decode_sequence.py: the served MoE step timed in one process. Its summary must say what the rounds
say (a wrong subtraction would blame the wrong step), it refuses what it cannot run with one line, and on a GPU
every sequence does the work it is named for: the same experts and the same output."""
from __future__ import annotations

import pytest
import torch

from kernels.cases import MOE
from kernels.tools import decode_sequence as ds

pytestmark = pytest.mark.level1_5


def test_summary_medians_ratios_and_the_moe_beside_dense():
    rounds = {"experts": [20.0, 22.0, 21.0], "served": [30.0, 27.0, 28.0], "served+dense": [40.0, 41.0, 39.0],
              "dense": [12.0, 13.0, 11.0], "route+experts": [23.0, 23.0, 23.0]}
    s = ds.summarize(rounds)
    assert s["experts"]["us_per_layer"] == 21.0
    assert s["served"]["vs_experts"] == round(28.0 / 21.0, 3)
    assert s["moe_beside_dense"]["us_per_layer"] == 40.0 - 12.0
    assert s["served"]["spread_pct"] == round(100 * 3.0 / 28.0, 2)
    assert s["route+experts"]["spread_pct"] == 0.0


def test_summary_of_a_sequence_that_failed_every_round_leaves_it_out():
    s = ds.summarize({"experts": [20.0], "served": []})
    assert "served" not in s and s["experts"]["vs_experts"] == 1.0 and "moe_beside_dense" not in s


@pytest.mark.parametrize("args", [["--layers", "0"], ["--rounds", "0"], ["--reps", "0"]])
def test_bad_counts_are_refused_with_one_line(args, capsys):
    assert ds.main(args) == 2
    out = capsys.readouterr().out.strip()
    assert out == "decode_sequence: --layers, --rounds and --reps must be at least 1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal; this machine has a CUDA GPU")
def test_without_cuda_it_says_so_in_one_line(capsys):
    assert ds.main(["--layers", "1"]) == 2
    out = capsys.readouterr().out.strip()
    assert "needs CUDA" in out and "\n" not in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sequences launch the CUDA kernels: needs a CUDA GPU")
def test_the_served_sequences_run_the_precomputed_experts_bit_for_bit():
    # `experts` times the ids the served routing gives (build_layers): the served sequences must compute exactly its
    # output, or the difference between their times is not the routing's. route+experts routes with our own GEMV
    # (fp32 logits, not cuBLAS's bf16 ones), which can pick another expert at a near tie: finite output only.
    layers = ds.build_layers(2, seed=11)
    outs = {}
    for name in ("experts", "route+experts", "served", "served+dense"):
        for ly in layers:
            ly["out"].fill_(float("nan"))
        ds.sequence(name, layers)()
        torch.cuda.synchronize()
        outs[name] = [ly["out"].clone() for ly in layers]
        assert all(torch.isfinite(o.float()).all() for o in outs[name]), f"{name}: an output was not written"
    for name in ("served", "served+dense"):
        assert all(torch.equal(a, b) for a, b in zip(outs["experts"], outs[name])), f"{name} differs from experts"
    # and they route for themselves: with the stored ids moved to other experts, `experts` changes and they do not
    for ly in layers:
        ly["ids"] = (ly["ids"] + 1) % MOE.experts
    for name in ("experts", "served"):
        ds.sequence(name, layers)()
        torch.cuda.synchronize()
        same = all(torch.equal(ly["out"], o) for ly, o in zip(layers, outs["served"]))
        assert same == (name == "served"), f"{name}: {'the stored ids decided' if name == 'served' else 'ids ignored'}"
