"""Parsing of Nsight Compute's raw CSV (kernels.tools.ncu_profile): the counters NOTES.md quotes come from here,
so a unit ncu chose (us vs nsecond, Mbyte vs byte) must not change the numbers. Synthetic CSVs, CPU."""
from __future__ import annotations

import math

import pytest

from kernels.tools.ncu_profile import metric_values, raw_rows, stalls_by_opcode

pytestmark = pytest.mark.level1_5


def _csv(time_unit: str, duration: str, byte_unit: str, read: str) -> str:
    return (
        '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","launch__registers_per_thread"\n'
        f'"","","{time_unit}","{byte_unit}","register/thread"\n'
        f'"0","warm-up","1","1","1"\n'
        f'"1","mxfp4_kernel<0, 1, 1, 1, 6>","{duration}","{read}","128"\n'
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
