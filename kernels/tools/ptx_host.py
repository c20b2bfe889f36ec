"""Run the kernels' per-thread bit arithmetic on the CPU: `host_source(text, names)` copies device functions out of
kernels/csrc/mxfp4_mma.cu, turns each inline-PTX statement into a call of a small interpreter of that PTX text
(`lop3.b32`, `fma.rn.bf16x2`: the instructions of the weight decode and its scale), and gives a C++ translation unit
that the system's g++ compiles for the host.

Why: the decode is GF(2) bit twiddling whose constants (masks, shifts, lop3 truth tables, operand order) only a GPU
run checked. A wrong one builds for every architecture and fails only numerically, on a GPU. The interpreter reads
the PTX text itself (opcode, operand order, immediates), so a change to the text is judged as the GPU would judge it.
Only the instructions named above are interpreted; any other inline PTX in a copied function is refused by name.
The CUDA intrinsics these functions use (`__funnelshift_l`, `__byte_perm`) are written from the CUDA Math API's
definitions.
"""
from __future__ import annotations

import re

# Per-thread helpers, CUDA's definitions; PTX operands are 32-bit registers (%k: outputs first, then inputs).
SHIM = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#define __device__
#define __forceinline__ inline
static inline uint32_t __funnelshift_l(uint32_t lo, uint32_t hi, uint32_t shift) {
  const uint64_t v = ((uint64_t)hi << 32) | lo;  // hi:lo << (shift & 31), the upper 32 bits
  return (uint32_t)((v << (shift & 31)) >> 32);
}
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = ((uint64_t)y << 32) | x;  // bytes 0-3 from x, 4-7 from y; selector nibble n picks result byte n
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
  return r;
}
static float bf16_to_f(uint32_t h) { uint32_t b = (h & 0xFFFFu) << 16; float f; memcpy(&f, &b, 4); return f; }
static uint32_t f_to_bf16_rn(float f) {  // round to nearest even; the bit pattern is monotonic, subnormals included
  uint32_t b; memcpy(&b, &f, 4);
  if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x7FFFFFu)) return 0x7FC0u | ((b >> 16) & 0x8000u);
  return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}
static std::vector<std::string> ptx_tokens(const char* text) {
  std::vector<std::string> t; std::string cur;
  for (const char* p = text; *p; ++p) {
    if (*p == ' ' || *p == ',' || *p == ';' || *p == '\n' || *p == '\t') { if (!cur.empty()) t.push_back(cur); cur.clear(); }
    else cur += *p;
  }
  if (!cur.empty()) t.push_back(cur);
  return t;
}
static void ptx_exec(const char* text, uint32_t* out, int n_out, const uint32_t* in, int n_in) {
  const std::vector<std::string> t = ptx_tokens(text);
  auto reg = [&](size_t i) -> uint32_t {
    if (i >= t.size() || t[i][0] != '%') { fprintf(stderr, "ptx_host: operand %zu of '%s' is not %%k\n", i, text); exit(3); }
    const int k = atoi(t[i].c_str() + 1);
    if (k < n_out) return out[k];
    if (k - n_out < n_in) return in[k - n_out];
    fprintf(stderr, "ptx_host: '%s' names %%%d of %d operands\n", text, k, n_out + n_in); exit(3);
  };
  auto dst = [&](size_t i) -> uint32_t* {
    const int k = (i < t.size() && t[i][0] == '%') ? atoi(t[i].c_str() + 1) : -1;
    if (k < 0 || k >= n_out) { fprintf(stderr, "ptx_host: the destination of '%s' is not an output\n", text); exit(3); }
    return &out[k];
  };
  if (t.size() == 6 && t[0] == "lop3.b32") {
    const uint32_t a = reg(2), b = reg(3), c = reg(4), lut = reg(5);
    uint32_t d = 0;  // PTX: bit i of immLut is F(a, b, c) at a = bit 2 of i, b = bit 1, c = bit 0 (ta 0xF0, tb 0xCC, tc 0xAA)
    for (int i = 0; i < 32; ++i) {
      const int idx = (((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1);
      d |= ((lut >> idx) & 1u) << i;
    }
    *dst(1) = d;
    return;
  }
  if (t.size() == 5 && t[0] == "fma.rn.bf16x2") {
    const uint32_t a = reg(2), b = reg(3), c = reg(4);
    uint32_t d = 0;
    for (int h = 0; h < 2; ++h) {  // a * b of two bf16 is exact in double, and so is adding the zeros the kernels add
      const double v = (double)bf16_to_f(a >> (16 * h)) * (double)bf16_to_f(b >> (16 * h)) + (double)bf16_to_f(c >> (16 * h));
      d |= f_to_bf16_rn((float)v) << (16 * h);
    }
    *dst(1) = d;
    return;
  }
  fprintf(stderr, "ptx_host: no host interpreter for '%s'\n", text); exit(3);
}
"""

_ASM = re.compile(r'asm\s*(?:volatile\s*)?\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)(?::([^:;]*?))?(?::([^:;]*?))?(?::[^;]*?)?\)\s*;',
                  re.S)
_OPERAND = re.compile(r'"([=+]?)([a-z])"\s*\(')


def _operands(spec: str | None) -> list[tuple[str, str, str]]:
    """'"=r"(d), "n"(LUT)' -> [("=", "r", "d"), ("", "n", "LUT")] (expressions may hold parentheses)."""
    out, s = [], spec or ""
    for m in _OPERAND.finditer(s):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(s[i], 0)
            i += 1
        out.append((m.group(1), m.group(2), s[m.end():i - 1].strip()))
    return out


def _host_asm(m: re.Match) -> str:
    text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
    outs, ins = _operands(m.group(2)), _operands(m.group(3))
    for _, kind, expr in outs + ins:
        if kind not in "rn":
            raise ValueError(f"ptx_host: operand {expr!r} of {text!r} is not a 32-bit register or an immediate")
    init = ", ".join(f"(uint32_t)({e})" if mod == "+" else "0u" for mod, _, e in outs)
    args = ", ".join(f"(uint32_t)({e})" for _, _, e in ins) or "0u"
    back = " ".join(f"{e} = _o[{k}];" for k, (_, _, e) in enumerate(outs))
    return (f'{{ uint32_t _o[{max(1, len(outs))}] = {{{init or "0u"}}}; const uint32_t _i[] = {{{args}}}; '
            f'ptx_exec("{text}", _o, {len(outs)}, _i, {len(ins)}); {back} }}')


def function_text(src: str, name: str) -> str:
    """The definition of device function (or function template) `name` in `src`, from its `template <...>` or
    `__device__` line to its closing brace."""
    m = re.search(r"^(?:template <[^\n]*>\n)?__device__ [^\n(]*\b" + re.escape(name) + r"\(", src, re.M)
    if not m:
        raise ValueError(f"ptx_host: no device function {name} in the source")
    i = src.index("{", m.end())
    depth = 0
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[m.start():j + 1]
    raise ValueError(f"ptx_host: {name} has no closing brace")


def host_source(src: str, names: list[str], main: str) -> str:
    """A host C++ translation unit: the shim, the functions `names` of `src` in that order (their inline PTX
    interpreted), then `main`."""
    parts = [SHIM]
    for name in names:
        parts.append(_ASM.sub(_host_asm, function_text(src, name)))
    parts.append(main)
    return "\n\n".join(parts) + "\n"
