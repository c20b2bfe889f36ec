"""The CUDA kernels' weight decode and scale, run on the CPU from their source text (kernels.tools.ptx_host): the
device functions of kernels/csrc/mxfp4_mma.cu are compiled for the host with their inline PTX interpreted, and
every E2M1 code in every position of a word, times every E8M0 scale byte the bf16 form serves, must decode to the
reference's value bit for bit (sign of zero included).

Why: a wrong mask, shift, lop3 truth table or operand order builds for sm_90a and sm_121a alike and shows only as
wrong numbers on a GPU; CI has none. Exact equality is the tolerance: the decode is integer bit moves, and the scale
multiply is exact (bf16 has fp32's exponent range, the products have at most 3 significant bits). The tests of the
test: four one-token mutations of the source (a lop3 operand order, the sign-select mask, the -0 addend, the scale's
exponent bias) each fail it.
"""
from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from kernels.mxfp4 import E2M1_VALUES
from kernels.packed import decode_words
from kernels.tools import build, ptx_host

pytestmark = pytest.mark.level1_5

FUNCTIONS = ["decode4", "lop3", "decode4_bf16", "e8m0_bf16x2", "bf16x2_mul"]
MAX_SCALE = 128  # cuda_ext.BF16_MAX_SCALE: the bf16 form's multiplier is exact up to this byte

MAIN = r"""
int main() {
  unsigned w, sv;
  while (scanf("%x %x", &w, &sv) == 2) {
    uint32_t a[4], b[4];
    decode4(w, a);
    decode4_bf16(w, b);
    const uint32_t s[4] = {e8m0_bf16x2<0>(sv), e8m0_bf16x2<1>(sv), e8m0_bf16x2<2>(sv), e8m0_bf16x2<3>(sv)};
    for (int j = 0; j < 4; ++j) printf("%08x ", a[j]);
    for (int j = 0; j < 4; ++j) printf("%08x ", b[j]);
    for (int q = 0; q < 4; ++q) printf("%08x ", s[q]);
    for (int q = 0; q < 4; ++q)
      for (int j = 0; j < 4; ++j) printf("%08x ", bf16x2_mul(b[j], s[q]));
    printf("\n");
  }
  return 0;
}
"""


def _bf16_bits(v: float) -> int:
    """bf16 bits of a value bf16 holds exactly (the low half of its fp32 bits is zero)."""
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    assert bits & 0xFFFF == 0, v
    return bits >> 16


def _code_value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7]


def _halves(r: int) -> tuple[int, int]:
    return r & 0xFFFF, r >> 16


def _f16_code(h: int) -> int:
    return ((h >> 9) & 7) | ((h >> 12) & 8)  # decode4's f16 half: sign at 15, e1 e0 m at 11..9 (kernels/packed.py)


def _inputs(n: int, seed: int) -> list[tuple[int, int]]:
    """Fresh random words (the decode is a bijection of 32-bit words, so random words carry every code at every
    position), each with four scale bytes in 0..MAX_SCALE, bytes 0 and 128 included."""
    rng = random.Random(seed)
    pairs = [(0, 0), (0xFFFFFFFF, MAX_SCALE << 24 | 127 << 16 | 1 << 8)]
    for _ in range(n):
        sv = sum(rng.randint(0, MAX_SCALE) << (8 * q) for q in range(4))
        pairs.append((rng.getrandbits(32), sv))
    return pairs


def decode_mismatches(src: str, tmp: Path, pairs: list[tuple[int, int]]) -> list[str]:
    """Compile the source's decode functions for the host and compare every output with the reference."""
    cpp = tmp / "decode_host.cpp"
    cpp.write_text(ptx_host.host_source(src, FUNCTIONS, MAIN))
    exe = tmp / "decode_host"
    subprocess.run(["g++", "-O1", "-std=c++17", "-o", str(exe), str(cpp)], check=True, capture_output=True, text=True,
                   timeout=120)
    run = subprocess.run([str(exe)], input="".join(f"{w:08x} {sv:08x}\n" for w, sv in pairs), capture_output=True,
                         text=True, timeout=120)
    if run.returncode:
        return [f"the host program failed: {run.stderr.strip()}"]
    words = torch.tensor([w for w, _ in pairs], dtype=torch.int64).to(torch.int32)
    ref = [o.tolist() for o in decode_words(words)]
    bad: list[str] = []
    seen: set[tuple[int, int, int]] = set()
    for i, (line, (w, sv)) in enumerate(zip(run.stdout.splitlines(), pairs, strict=True)):
        out = [int(v, 16) for v in line.split()]
        f16, bf16, scales, products = out[0:4], out[4:8], out[8:12], out[12:28]
        for j in range(4):
            if f16[j] != ref[j][i] & 0xFFFFFFFF:
                bad.append(f"decode4({w:#010x}) register {j}: {f16[j]:#010x}, reference {ref[j][i] & 0xFFFFFFFF:#010x}")
            codes = [_f16_code(h) for h in _halves(ref[j][i] & 0xFFFFFFFF)]
            for h, code in enumerate(codes):
                seen.add((j, h, code))
                want = _bf16_bits(_code_value(code) * 2.0 ** -126)
                if _halves(bf16[j])[h] != want:
                    bad.append(f"decode4_bf16({w:#010x}) register {j} half {h}: {_halves(bf16[j])[h]:#06x}, code {code} "
                               f"is {want:#06x}")
                for q in range(4):
                    b = (sv >> (8 * q)) & 0xFF
                    want = _bf16_bits(_code_value(code) * 2.0 ** (b - 127))
                    got = _halves(products[4 * q + j])[h]
                    if got != want:
                        bad.append(f"bf16x2_mul(decoded code {code}, scale byte {b}): {got:#06x}, exact {want:#06x}")
        for q in range(4):
            b = (sv >> (8 * q)) & 0xFF
            want = _bf16_bits(2.0 ** (b - 1))
            if _halves(scales[q]) != (want, want):
                bad.append(f"e8m0_bf16x2<{q}>(byte {b}): {scales[q]:#010x}, 2**{b - 1} in both halves is {want:#06x}")
    missing = {(j, h, c) for j in range(4) for h in range(2) for c in range(16)} - seen
    assert not missing, f"the inputs left codes untested at (register, half, code): {sorted(missing)[:8]}"
    return bad[:20]


@pytest.fixture(scope="module")
def gxx() -> None:
    if shutil.which("g++"):
        return
    why = "g++ is not installed: the host compiler nvcc also needs (apt install g++)"
    if os.environ.get("SUITE_REQUIRE_NVCC") == "1":
        pytest.fail(f"{why} (SUITE_REQUIRE_NVCC=1)")
    pytest.skip(why)


def test_the_sources_decode_and_scale_give_every_codes_exact_value(gxx, tmp_path):
    seed = random.randrange(1 << 30)  # fresh inputs each run; the seed in the message reproduces a failure
    assert decode_mismatches(build.SRC.read_text(), tmp_path, _inputs(3000, seed)) == [], f"inputs of seed {seed}"


MUTATIONS = {
    # lop3's b and a swapped in the PTX text: the masked XOR is symmetric in them, the select is not
    "lop3 operand order": ('asm("lop3.b32 %0, %1, %2, %3, %4;\\n"', 'asm("lop3.b32 %0, %2, %1, %3, %4;\\n"'),
    # the select mask without bit 12: the sign bit shifted down by 3 lands in the exponent
    "select mask": ("C = 0x90009000u", "C = 0x80008000u"),
    # the fma adds +0 instead of -0: a negative zero weight comes out +0
    "-0 addend": ('"r"(0x80008000u)', '"r"(0x00000000u)'),
    # the scale's exponent one binade off
    "scale bias": ("return b * 128u + 0x3F003F00u;", "return b * 128u + 0x3F803F80u;"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_one_token_mutation_of_the_decode_fails_the_check(gxx, tmp_path, mutation):
    old, new = MUTATIONS[mutation]
    src = build.SRC.read_text()
    assert src.count(old) == 1, f"{mutation}: the source no longer has {old!r} once; update the mutation"
    assert decode_mismatches(src.replace(old, new), tmp_path, _inputs(200, 1)) != []


def test_inline_ptx_the_interpreter_does_not_know_is_refused_by_name(gxx, tmp_path):
    src = build.SRC.read_text().replace('asm("fma.rn.bf16x2 %0', 'asm("fma.rz.bf16x2 %0', 1)
    assert decode_mismatches(src, tmp_path, _inputs(1, 1)) == [
        "the host program failed: ptx_host: no host interpreter for 'fma.rz.bf16x2 %0, %1, %2, %3;\n'"]
