"""The arithmetic of kernels.tools.phase_timing (the per-phase times kernels/NOTES.md quotes): synthetic
records in the layout the MXFP4_PHASES build writes, CPU."""
from __future__ import annotations

import pytest
import torch

from kernels.tools.phase_timing import SLOTS, moe_timeline, summarize

pytestmark = pytest.mark.level1_5

GHZ = 2.0  # clock64 ticks per globaltimer ns in these records


def _records(ctas: list[dict], mode: int = 0) -> torch.Tensor:
    """ctas: {"start": ns, "events": [ns from start for events 0..6], "items": n} -> the int64 buffer."""
    rec = torch.zeros(3, 2048, SLOTS, dtype=torch.int64)
    for i, c in enumerate(ctas):
        row = rec[mode, i]
        row[0] = c["start"]
        row[1] = c["start"] + c["events"][6]
        row[2] = i % 2  # SM id
        row[3] = c["items"]
        for e, t in enumerate(c["events"]):
            row[4 + e] = 1_000_000 + int(t * GHZ)  # clock64 has its own origin per SM
    return rec.view(-1)


def test_intervals_are_medians_over_ctas_in_ns_and_span_covers_the_late_cta():
    one_item = {"start": 10_000, "events": [0, 100, 400, 500, 900, 0, 1000], "items": 1}
    two_items = {"start": 10_300, "events": [0, 200, 600, 700, 1100, 1500, 2000], "items": 2}
    s = summarize(_records([one_item, one_item, two_items]), mode=0, grid=3)
    assert s["ctas"] == 3 and s["items_max"] == 2 and s["sms"] == 2
    assert s["clock_ghz"] == pytest.approx(GHZ)
    assert (s["issue"], s["prep"], s["first"], s["loop"], s["total"]) == (100, 300, 100, 400, 1000)
    assert s["epi"] == 400, "the epilogue interval uses only CTAs that reached a second item"
    assert s["last_start_ns"] == 300 and s["span_ns"] == 300 + 2000


def test_a_kernel_without_records_says_so():
    assert "error" in summarize(torch.zeros(3 * 2048 * SLOTS, dtype=torch.int64), mode=1, grid=4)


def test_moe_timeline_places_down_after_the_last_gate_up_cta():
    # gate_up CTAs end at 5,000 / 6,000 / 9,000 ns (the first starts at 1,000, the origin); down's two CTAs start at
    # 7,500 and 8,000 (launched early), see h 3,000 and 2,600 ns after their start, and the last ends at 13,000.
    gu = [{"start": 1_000 + d, "events": [0, 10, 20, 30, 40, 0, e - d], "items": 1}
          for d, e in ((0, 4_000), (100, 5_000), (200, 8_000))]
    dn = [{"start": 7_500, "events": [0, 100, 3_000, 3_500, 4_000, 0, 4_500], "items": 1},
          {"start": 8_000, "events": [0, 100, 2_600, 3_000, 4_000, 0, 5_000], "items": 1}]
    t = moe_timeline(_records(gu, mode=1) + _records(dn, mode=2))
    assert t == {"gate_up_end_median": 5_000, "gate_up_end": 8_000, "down_start": 6_500, "down_start_median": 7_000,
                 "down_h_seen_first": 9_500, "down_h_seen_median": 9_600, "down_end": 12_000}


def test_moe_timeline_without_down_records_says_so():
    gu = [{"start": 1_000, "events": [0, 10, 20, 30, 40, 0, 4_000], "items": 1}]
    assert "error" in moe_timeline(_records(gu, mode=1))


def test_moe_variants_option_parses_configs_and_names_a_bad_entry():
    from kernels.tools.bench import parse_moe_variants

    assert parse_moe_variants('g4={"gate_up_variant": 4}; c2={"gate_up_ctas_per_sm": 2};') == {
        "g4": {"gate_up_variant": 4}, "c2": {"gate_up_ctas_per_sm": 2}}
    assert parse_moe_variants(None) == {}
    for bad, named in (('g4={"gate_up_variant": 4', "'g4'"), ("g5=5", "g5=5"), ('={"pdl": 0}', '{"pdl": 0}')):
        with pytest.raises(ValueError, match="--moe-variants") as ex:
            parse_moe_variants(bad)
        assert named in str(ex.value)
