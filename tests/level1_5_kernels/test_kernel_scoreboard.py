"""kernels.tools.scoreboard: which wait drains a loop's global loads, and how many MMAs after their issue. Synthetic
nvdisasm -hex listings (CPU); tests/level1_5_kernels/test_kernel_build.py reads the served kernels' own."""
from __future__ import annotations

import pytest

from kernels.tools.sass_count import hot_loop, parse_nvdisasm
from kernels.tools.scoreboard import Control, control_words, covers, load_cover

pytestmark = pytest.mark.level1_5

NONE = 7


def _control(write: int = NONE, read: int = NONE, wait: tuple[int, ...] = (), stall: int = 1) -> int:
    code = stall | 1 << 4 | write << 5 | read << 8 | sum(1 << w for w in wait) << 11
    return code << 41 | 0x78E00FF  # low bits: operand encoding, never read


def _listing(body: list[tuple[str, dict]], name: str = "k") -> str:
    """A function as nvdisasm --print-line-info -hex prints it: each instruction, then its control word's line."""
    out = [f"        .text.{name}:"]
    for i, (ins, ctl) in enumerate(body):
        out.append(f"        /*{i * 16:04x}*/                   {ins} ;    /* 0x0000004008397824 */")
        out.append(f"                                                              /* 0x{_control(**ctl):016x} */")
    return "\n".join(out) + "\n"


def _loop(body):
    text = _listing(body)
    ins = parse_nvdisasm(text)["k"]
    return hot_loop(ins, "HGMMA")[1], control_words(text)["k"]


BACK = ("@!P0 BRA 0x0", {})


def test_the_control_code_of_a_real_instruction_decodes_to_its_scoreboards():
    # IMAD.SHL.U32 R57, R8, 0x40 of the wgmma MoE prefill before its weights moved to cp.async (sm_90a, nvcc 13): waits on SB5, writes none
    c = Control.decode(0x020FE200078E00FF)
    assert (c.stall, c.write_sb, c.read_sb, c.wait_mask) == (1, 7, 7, 1 << 5)
    assert c.waits_on(5) and not c.waits_on(4)


def test_a_ring_whose_first_use_waits_on_the_newest_load_is_covered_by_the_mmas_between_them_only():
    """The register-ring wgmma loop's shape (before cp.async): three slots refilled in turn, all on SB5; one use per pass waits on SB5 two wgmmas
    after the newest refill, so the three-chunk ring hides no more than those two."""
    body = [("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {}),
            ("@!P0 LDG.E.128.CONSTANT R8, desc[UR28][R64.64]", {"write": 5, "read": 1}),
            ("HGMMA.64x64x16.F32.BF16 R24, R60, gdesc[UR4], R24", {}),
            ("HGMMA.64x64x16.F32.BF16 R24, R64, gdesc[UR4], R24", {}),
            ("@!P0 LDG.E.128.CONSTANT R4, desc[UR28][R66.64]", {"write": 5, "read": 1}),
            ("HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR4], R24", {}),
            ("@!P0 LDG.E.128.CONSTANT R12, desc[UR28][R68.64]", {"write": 5, "read": 1}),
            ("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {}),
            ("HGMMA.64x64x16.F32.BF16 R24, R60, gdesc[UR4], R24", {}),
            ("IMAD.SHL.U32 R57, R8, 0x40, RZ", {"wait": (5,)}),
            BACK]
    loop, ctl = _loop(body)
    c = load_cover(loop, ctl)
    assert c is not None and c.mma == 2 and c.instructions == 2 and "R12" in c.load and "R8" in c.wait


def test_loads_issued_after_the_wait_are_covered_by_the_whole_pass():
    """Wait first, then refill: the wait drains what the previous pass issued, a full pass of MMAs earlier."""
    body = [("IMAD.SHL.U32 R57, R8, 0x40, RZ", {"wait": (5,)}),
            ("@!P0 LDG.E.128.CONSTANT R8, desc[UR28][R64.64]", {"write": 5}),
            *[("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {})] * 12,
            BACK]
    loop, ctl = _loop(body)
    assert (load_cover(loop, ctl).mma, load_cover(loop, ctl).instructions) == (12, 13)  # the pass and its branch


def test_a_counted_wait_leaves_the_newest_loads_in_flight():
    """DEPBAR.LE SB5, 0x1 waits for all but the newest load: the one it drains is the older, 3 MMAs back."""
    body = [("@!P0 LDG.E.128.CONSTANT R8, desc[UR28][R64.64]", {"write": 5}),
            *[("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {})] * 3,
            ("@!P0 LDG.E.128.CONSTANT R4, desc[UR28][R66.64]", {"write": 5}),
            ("DEPBAR.LE SB5, 0x1", {}),
            ("IMAD.SHL.U32 R57, R8, 0x40, RZ", {}),
            ("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {}),
            BACK]
    loop, ctl = _loop(body)
    assert load_cover(loop, ctl).mma == 3
    assert "R8" in load_cover(loop, ctl).load


def test_a_second_wait_finds_nothing_left_to_drain_and_cp_async_is_not_a_register_load():
    body = [("LDGSTS.E.BYPASS.128 [R93], desc[UR28][R64.64]", {"read": 1}),
            ("LDGDEPBAR", {"write": 0}),
            ("@!P0 LDG.E.128.CONSTANT R8, desc[UR28][R64.64]", {"write": 5}),
            *[("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {})] * 4,
            ("IMAD.SHL.U32 R57, R8, 0x40, RZ", {"wait": (5,)}),
            ("IMAD.SHL.U32 R59, R8, 0x200, RZ", {"wait": (5,)}),  # drained already: no second cover
            ("DEPBAR.LE SB0, 0x0", {}),  # every cp.async group landed: not a register load's wait
            ("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {}),
            BACK]
    loop, ctl = _loop(body)
    assert [c.mma for c in covers(loop, ctl)] == [4]


def test_a_loop_without_a_wait_on_a_global_load_has_no_cover():
    body = [("HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24", {}), ("LDS.128 R8, [R2]", {"write": 2}),
            ("IMAD.SHL.U32 R57, R8, 0x40, RZ", {"wait": (2,)}), BACK]
    loop, ctl = _loop(body)
    assert load_cover(loop, ctl) is None
