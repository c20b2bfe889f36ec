"""Parsing of Nsight Compute's raw CSV (kernels.tools.ncu_profile): the counters NOTES.md quotes come from here,
so a unit ncu chose (us vs nsecond, Mbyte vs byte) must not change the numbers. Synthetic CSVs, CPU."""
from __future__ import annotations

import math

import pytest

from kernels.tools.ncu_profile import metric_values, raw_rows

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
