"""Parsing of Nsight Compute's raw CSV (kernels.tools.ncu_profile): the counters NOTES.md quotes come from here,
so a unit ncu chose (us vs nsecond, Mbyte vs byte) must not change the numbers. Synthetic CSVs, CPU."""
from __future__ import annotations

import math

import pytest

from kernels.tools.ncu_profile import format_hot_loops, hot_loops, metric_values, raw_rows, stalls_by_opcode

pytestmark = pytest.mark.level1_5


def _csv(time_unit: str, duration: str, byte_unit: str, read: str) -> str:
    return (
        '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","lts__t_bytes.sum",'
        '"launch__registers_per_thread"\n'
        f'"","","{time_unit}","{byte_unit}","Gbyte","register/thread"\n'
        f'"0","warm-up","1","1","1","1"\n'
        f'"1","mxfp4_kernel<0, 1, 1, 1, 6>","{duration}","{read}","1.25","128"\n'
    )


@pytest.mark.parametrize("time_unit, duration, byte_unit, read", [
    ("us", "10.272000", "Mbyte", "7.895552"),  # what `ncu -i rep --page raw --csv` printed on an H200
    ("nsecond", "10,272", "byte", "7,895,552"),
])
def test_durations_and_sizes_come_out_in_base_units_whatever_ncu_printed(time_unit, duration, byte_unit, read):
    rows, units = raw_rows(_csv(time_unit, duration, byte_unit, read))
    assert [r["ID"] for r in rows] == ["0", "1"]  # the units row is not a kernel
    rec = metric_values(rows[1], units)
    assert rec["duration_ns"] == pytest.approx(10272.0)
    assert rec["dram_read_bytes"] == pytest.approx(7895552.0)
    assert rec["l2_bytes"] == pytest.approx(1.25e9)
    assert rec["regs"] == 128.0
    assert math.isnan(rec["thread_inst"])  # not collected: NaN, not 0


def test_stall_samples_are_summed_per_opcode_and_a_kernel_printed_twice_counts_once():
    """The per-instruction stall table NOTES.md reads ("wait" on the branches between MMAs): predicates and modifiers
    dropped, thousands separators read, the duplicate block ncu prints for each kernel skipped."""
    block = ('"Kernel Name","void k<1>(Args)",\n'
             '"Address","Source","stall_wait","stall_short_sb"\n'
             '"0x10","HMMA.16816.F32.BF16 R4, R8, R12, R4","1,200","300"\n'
             '"0x20","@!P0 BRA 0x40","500","0"\n'
             '"0x30","HMMA.16816.F32.BF16 R6, R8, R14, R6","100","50"\n')
    other = '"Kernel Name","void k<2>(Args)",\n"Address","Source","stall_wait"\n"0x10","NOP","7"\n'
    got = stalls_by_opcode(block + block + other)
    assert [g["kernel"] for g in got] == ["void k<1>(Args)", "void k<2>(Args)"]
    assert got[0]["samples"] == {"stall_wait": 1800.0, "stall_short_sb": 350.0}
    assert got[0]["by_opcode"]["stall_wait"] == [("HMMA", 1300.0), ("BRA", 500.0)]
    assert got[1]["by_opcode"] == {"stall_wait": [("NOP", 7.0)]}


def test_the_hot_loop_is_the_backward_branch_around_the_most_mmas_with_its_samples_line_by_line():
    """What NOTES.md reads off a profile ("the MMA waits for its ldmatrix"): the loop is the one with the most MMAs
    (not the most sampled straight-line code, not a loop with fewer MMAs), every line keeps its own samples and its two
    largest stall reasons, and the loop's share of the kernel's samples is right."""
    head = '"Kernel Name","void k<1>(Args)",\n"Address","Source","stall_wait","stall_short_sb","stall_barrier"\n'
    rows = [("0x00", "LDC R0, c[0x0][0x0]", "900", "0", "0"),          # prologue, outside every loop
            ("0x10", "HMMA.16816.F32.BF16 R4, R8, R12, R4", "5,000", "0", "0"),
            ("0x20", "@P0 BRA 0x10", "0", "0", "0"),                    # a loop with one MMA, sampled more
            ("0x30", "LDSM.16.M88.4 R12, [R0]", "5", "0", "0"),
            ("0x40", "HMMA.16816.F32.BF16 R4, R8, R12, R4", "20", "300", "0"),
            ("0x50", "NOP", "40", "0", "0"),
            ("0x60", "HMMA.16816.F32.BF16 R4, R9, R14, R4", "10", "0", "0"),
            ("0x70", "BAR.SYNC.DEFER_BLOCKING 0x0", "0", "0", "1,000"),
            ("0x80", "@P1 BRA 0x30", "0", "0", "0")]                    # the loop with two MMAs
    csv_text = head + "".join(f'"{a}","{t}","{w}","{sb}","{b}"\n' for a, t, w, sb, b in rows)
    (lp,) = hot_loops(csv_text + csv_text)  # printed twice: one kernel
    assert (lp["instructions"], lp["markers"]) == (6, 2)
    assert [x["address"] for x in lp["lines"]] == [0x30, 0x40, 0x50, 0x60, 0x70, 0x80]
    assert lp["lines"][1]["samples"] == 320.0 and lp["lines"][1]["top"] == [("stall_short_sb", 300.0), ("stall_wait", 20.0)]
    assert lp["samples"] == 1375.0 and lp["share_of_kernel"] == round(1375 / 7275, 3)
    text = format_hot_loops([lp])
    assert "2 markers" in text and "short_sb=300 wait=20" in text and "barrier=1000" in text


def test_a_wgmma_kernel_s_hot_loop_is_its_most_sampled_copy_found_by_its_hgmma_instructions():
    """The served MoE prefill on sm_90 multiplies with wgmma (SASS HGMMA, no HMMA): its loop must be in the hot-loop
    file like the mma.sync kernels' (a profile on an H100 left it out). It compiles one copy of the loop per live
    token-tile count, each with as many MMAs: the copy the profiled call ran, the most sampled, is the one to read (the
    shortest, the static counts' choice, held 1.3% of that kernel's samples)."""
    head = '"Kernel Name","void mxfp4_wg_kernel<1, 16, 1, 2>(PfArgs)",\n"Address","Source","stall_long_sb"\n'
    rows = [("0x00", "LDC R0, c[0x0][0x0]", "5"),
            ("0x10", "HGMMA.64x16x16.F32.BF16 R24, R4, gdesc[UR4], R24", "2"),   # a copy for 2 live tiles, shorter
            ("0x20", "@P0 BRA 0x10", "0"),
            ("0x30", "IMAD.SHL.U32 R57, R8, 0x40, RZ", "1,171"),                 # the copy for 16 tiles
            ("0x40", "HGMMA.64x128x16.F32.BF16 R24, R4, gdesc[UR4], R24", "3"),
            ("0x50", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "0"),
            ("0x60", "@P0 BRA 0x30", "0")]
    (lp,) = hot_loops(head + "".join(f'"{a}","{t}","{n}"\n' for a, t, n in rows))
    assert (lp["instructions"], lp["markers"]) == (4, 1)
    assert lp["lines"][0]["samples"] == 1171.0 and lp["lines"][0]["top"] == [("stall_long_sb", 1171.0)]


def test_a_kernel_without_an_mma_loop_is_left_out():
    block = '"Kernel Name","void k<2>(Args)",\n"Address","Source","stall_wait"\n"0x10","NOP","7"\n"0x20","@P0 BRA 0x10","1"\n'
    assert hot_loops(block) == []


@pytest.mark.parametrize("kernels", [2, 3, 4])
def test_a_profile_whose_kernel_count_differs_from_the_driver_s_launches_is_refused(tmp_path, monkeypatch, capsys,
                                                                                    kernels):
    """The summary names each profiled kernel by launch order. The prefill profile's name filter once missed the
    wgmma MoE kernels on sm_90, so the one kernel left (qkv) was reported as the MoE's gate_up: a count that is not the
    driver's must stop the run with the reason, not shift every label (synthetic ncu output, CPU)."""
    import subprocess
    from types import SimpleNamespace

    from kernels.tools import ncu_profile

    rows = "".join(f'"{i}","kernel{i}","10","1","128"\n' for i in range(kernels))
    raw = ('"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","launch__registers_per_thread"\n'
           '"","","us","byte","register/thread"\n' + rows)

    def run(cmd, **kw):
        out = raw if "raw" in cmd else ""
        return SimpleNamespace(returncode=0, stdout=out, stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    rc = ncu_profile.stall_profile(tmp_path, "ncu", "prefill", [], ["moe_gate_up", "moe_down", "qkv"], "x")
    if kernels == 3:
        assert rc == 0 and (tmp_path / "prefill_summary.json").exists()
    else:
        assert rc == 1 and not (tmp_path / "prefill_summary.json").exists()
        assert f"ncu profiled {kernels} kernels where the driver launches 3" in capsys.readouterr().out
