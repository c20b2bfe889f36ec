"""How far ahead of its first wait a loop's global loads are issued, read from the SASS control codes (no GPU).

A load of variable latency (LDG) names one of six scoreboards in its control code; an instruction that needs the
loaded register waits on that scoreboard, and a scoreboard counts every load still in flight on it, so the wait
lasts until the newest of them has landed (`DEPBAR.LE SBk, N` waits for all but the newest N instead). ptxas put
every weight load of the served wgmma MoE prefill loop on one scoreboard (SB5, sm_90a, nvcc 13.x): the decode of one
weight word per 3-chunk pass waits on it two wgmmas after the newest weight load was issued, and that one instruction
held 28% of gate_up's and 38% of down's samples in Nsight Compute on an H100 (long scoreboard; the evidence folder
docs/evidence/sm_90-2026-12-06-h100-wide-tiling-120b-ncu/). A ring of weight registers refilled three chunks ahead
buys nothing when a wait drains the ring; that kernel now stages its weights with the activations' cp.async groups
(kernels/NOTES.md), and sass_count says so for a loop with no weight load on a register scoreboard.

`load_cover(loop, controls)`: the fewest MMA instructions issued between a global load and the wait that drains it,
over every wait in the loop (the loop read as a cycle); sass_count reports the least over a kernel's copies of its hot
loop. Decoded from nvdisasm -hex: bits 105.. of each 128-bit
instruction are the stall count (4 bits), yield (1), write scoreboard (3, 7 = none), read scoreboard (3) and the
wait mask (6), as in the published Volta-to-Hopper encodings (Jia et al., "Dissecting the NVIDIA Volta GPU
Architecture via Microbenchmarking", 2018; the control-code layout maxas and CuAssembler read).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

NO_SCOREBOARD = 7
MMA_OPCODES = ("HMMA", "HGMMA")


@dataclass(frozen=True)
class Control:
    stall: int
    yields: bool
    write_sb: int  # scoreboard the instruction's result is tracked on (NO_SCOREBOARD: fixed latency)
    read_sb: int
    wait_mask: int  # scoreboards waited on before issue

    @classmethod
    def decode(cls, high_word: int) -> "Control":
        c = high_word >> 41
        return cls(stall=c & 0xF, yields=bool(c >> 4 & 1), write_sb=c >> 5 & 7, read_sb=c >> 8 & 7,
                   wait_mask=c >> 11 & 0x3F)

    def waits_on(self, sb: int) -> bool:
        return bool(self.wait_mask >> sb & 1)


def control_words(text: str) -> dict[str, dict[int, Control]]:
    """nvdisasm -hex output -> {function: {address: Control}}. The control code is the second 64-bit word of each
    instruction, printed on the line after it."""
    out: dict[str, dict[int, Control]] = {}
    cur, addr = None, None
    for raw in text.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", raw)
        if m:
            cur = m.group(1)
            out[cur] = {}
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+.*?;\s*/\* 0x[0-9a-f]{16} \*/", raw)
        if m:
            addr = int(m.group(1), 16)
            continue
        m = re.match(r"\s*/\* (0x[0-9a-f]{16}) \*/\s*$", raw)
        if m and cur is not None and addr is not None:
            out[cur][addr] = Control.decode(int(m.group(1), 16))
            addr = None
    return out


def opcode(ins: str) -> str:
    """A SASS instruction's opcode with its modifiers, its predicate dropped: '@!P0 STG.E.128 [R2], R4' -> 'STG.E.128'."""
    return next((w for w in ins.split() if not w.startswith("@")), "")


def is_global_load(ins: str) -> bool:
    """LDG and its forms; not LDGSTS (cp.async: counted by its commit groups, LDGDEPBAR / DEPBAR.LE SB0)."""
    op = opcode(ins)
    return op.startswith("LDG") and not op.startswith(("LDGSTS", "LDGDEPBAR"))


@dataclass(frozen=True)
class Cover:
    mma: int  # MMA instructions issued between the load and the wait
    instructions: int  # every instruction between them
    load: str  # the newest load the wait drains
    wait: str  # the instruction that waits
    load_addr: int
    wait_addr: int


def _partial_wait(ins: str) -> tuple[int, int] | None:
    """`DEPBAR.LE SB5, 0x2` -> (5, 2): wait until at most 2 on SB5 are in flight."""
    m = re.search(r"DEPBAR\.LE\s+SB(\d),\s*(0x[0-9a-f]+|\d+)", ins)
    return (int(m.group(1)), int(m.group(2), 0)) if m else None


def covers(loop: list[tuple[int, str, int]], controls: dict[int, Control]) -> list[Cover]:
    """For every wait in `loop` (a loop body, in address order, read as a cycle) on a scoreboard a global load of the
    loop writes: the MMAs issued between the load that wait must let land and the wait. A wait drains what was issued
    on its scoreboard since the previous wait on it; `DEPBAR.LE SBk, N` leaves the newest N in flight."""
    n = len(loop)
    ctl = [controls.get(a) for a, _, _ in loop]
    partials = [_partial_wait(t) for _, t, _ in loop]
    out = []
    for i, (addr, ins, _) in enumerate(loop):
        c = ctl[i]
        if c is None:
            continue
        partial = partials[i]
        sbs = [sb for sb in range(6) if c.waits_on(sb)] + ([partial[0]] if partial else [])
        for sb in sbs:
            skip = partial[1] if partial and partial[0] == sb else 0  # loads allowed to stay in flight
            mma = 0
            for back in range(1, n + 1):  # at most once round the loop
                j = (i - back) % n
                cj, ins_j = ctl[j], loop[j][1]
                if cj is not None and cj.write_sb == sb:
                    if skip:
                        skip -= 1
                    else:
                        if is_global_load(ins_j):
                            out.append(Cover(mma, back - 1, ins_j, ins, loop[j][0], addr))
                        break
                if (cj is not None and cj.waits_on(sb)) or (partials[j] or (None,))[0] == sb:
                    break  # drained there: nothing older is waited on here
                if opcode(ins_j).startswith(MMA_OPCODES):
                    mma += 1
    return out


def load_cover(loop: list[tuple[int, str, int]], controls: dict[int, Control]) -> Cover | None:
    """The least-covered global load of the loop (fewest MMAs between it and the wait that drains it); None when no
    wait in the loop drains a global load."""
    found = covers(loop, controls)
    return min(found, key=lambda c: c.mma) if found else None
