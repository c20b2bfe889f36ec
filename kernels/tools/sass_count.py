"""Static instruction counts of the decode loops from compiled SASS (no GPU needed).

    python -m kernels.tools.sass_count [--arch 90a] [--arch 121a] [--cuda] [--triton] [--nvcc PATH]
                                      [--check-budget | --write-budget]

For each kernel: find the loop with the most weight math (HMMA for the CUDA kernel, HFMA2 /
the inline-asm block for Triton), drop instructions that belong to source lines that only run
once per work item (`cold` lines, e.g. the address setup of the next item), and divide by the
32-bit weight words one pass of the loop consumes per thread. This is a static proxy for Nsight
Compute's thread instructions per word (it assumes every hot instruction runs once per pass:
predicated-off and branched-over hot code is counted). `python -m kernels.tools.ncu_profile` measures
the real number on a GPU. The words per pass come from the kernel's configuration (the CUDA variants' template
arguments, the Triton cases' `words_per_pass`), never from the instructions counted: derived from the MMA count, a
loop that issued more MMAs per weight word would have counted as consuming more words, so cheaper per word. The MMA
instructions per word (`mma_per_word`) are counted too and budgeted for the CUDA kernels. For the CUDA kernels each
row also says how many MMAs after its issue the least-covered weight load of the loop is waited on
(kernels/tools/scoreboard.py: a wait on a scoreboard drains every load on it), reported, not budgeted.

The CUDA source is built by kernels/tools/build.py (the nvcc wheel of requirements-kernels-build.txt when
installed, one `-gencode` per --arch); the Triton kernels are compiled by the installed Triton for the same arches,
with the arguments the JIT would specialize as multiples of 16 marked so. --check-budget compares both with
kernels/sass_budget.yaml (CI: .ci/build_kernels.sh); --write-budget records them there.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import build, sass_budget, scoreboard
from .scoreboard import MMA_OPCODES, opcode


def _tool(name: str) -> str:
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if p.exists():
            return str(p)
    except ImportError:
        pass
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (Triton's bundled copy or PATH)")
    return found


def parse_nvdisasm(text: str) -> dict[str, list[tuple[int, str, int]]]:
    """nvdisasm --print-line-info output -> {function: [(address, instruction, source line)]}."""
    funcs: dict[str, list] = {}
    labels: dict[str, dict[str, int]] = {}
    pending: list[str] = []
    cur = None
    line = -1
    for raw in text.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", raw)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            labels[cur] = {}
            continue
        m = re.match(r"^(\.L\w+):", raw.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = re.search(r'//## File ".*", line (\d+)', raw)
        if m:
            line = int(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", raw)
        if m and cur:
            addr = int(m.group(1), 16)
            for lab in pending:
                labels[cur][lab] = addr
            pending = []
            funcs[cur].append((addr, m.group(2).strip(), line))
    for f, ins in funcs.items():  # branch targets: labels -> addresses
        funcs[f] = [(a, re.sub(r"`\((\.L\w+)\)", lambda mm: hex(labels[f].get(mm.group(1), -1)), t), ln)
                    for a, t, ln in ins]
    return funcs


def loops(ins, marker: str):
    """Every backward-branch loop with `marker` instructions in it: (how many, body)."""
    for addr, txt, _ in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", txt)
        if not m:
            continue
        tgt = int(m.group(1), 16)
        if tgt > addr:
            continue
        body = [(a, t, ln) for a, t, ln in ins if tgt <= a <= addr]
        n = sum(1 for _, t, _ in body if marker in t)
        if n:
            yield n, body


def hot_loop(ins, marker: str, weight=None):
    """The backward-branch loop containing the most `marker` instructions; among loops with as many, the shortest, or
    with `weight` (body -> number) the heaviest: a profile's most sampled of a kernel's per-tile-count copies."""
    best = None
    for n, body in loops(ins, marker):
        if best is None or n > best[0]:
            best = (n, body)
        elif n == best[0] and (weight(body) > weight(best[1]) if weight else len(body) < len(best[1])):
            best = (n, body)
    return best


def summarize(name: str, ins, marker: str, words: float, cold_lines: set[int]) -> dict:
    """Counts of the hot loop (the one with the most `marker` instructions) per 32-bit weight word, `words` being what
    one pass of it consumes per thread."""
    _, body = hot_loop(ins, marker)
    hot = [(a, t, ln) for a, t, ln in body if ln not in cold_lines]
    ops = collections.Counter(opcode(t) for _, t, _ in hot)
    mma = sum(1 for _, t, _ in body if opcode(t).startswith(MMA_OPCODES))
    return {"kernel": name, "loop_instructions": len(body), "hot_instructions": len(hot), "words": words,
            "instr_per_word": round(len(hot) / words, 2), "loop_instr_per_word": round(len(body) / words, 2),
            "mma_per_word": round(mma / words, 2), "ops": dict(ops.most_common())}


def _lines_matching(src: Path, start_pat: str, end_pat: str) -> set[int]:
    """Line numbers from the first line containing start_pat to the next one matching end_pat
    (a substring, or a regex when it starts with ^)."""
    lines = src.read_text().splitlines()
    out: set[int] = set()
    on = False
    for i, ln in enumerate(lines, 1):
        if not on and start_pat in ln:
            on = True
            out.add(i)
            continue
        if on:
            out.add(i)
            if (re.match(end_pat, ln) if end_pat.startswith("^") else end_pat in ln):
                on = False
    return out


# The decode kernel mxfp4_kernel<MODE, NT, RW, RT, PF> (M <= 16; KSPLIT = 8 / RW): mangled template args ->
# description. Every variant cuda_ext.pick_variant gives the served dense shapes (gpt-oss-120b / 20b, M 1..16) on
# sm_90 (132 SMs) and sm_121 (GB10, 48 SMs), and the MoE's gate_up / down variants of tuning.yaml:
# tests/level1_5_kernels/test_kernel_build.py checks that the budget holds each of them.
CUDA_VARIANTS = {
    "ILi0ELi1ELi8ELi2ELi5E": "dense NT=1 RT=2 PF=5 (lm_head, M<=8)",
    "ILi0ELi2ELi8ELi2ELi5E": "dense NT=2 RT=2 PF=5 (lm_head, M 9-16)",
    "ILi0ELi1ELi8ELi2ELi4E": "dense NT=1 RT=2 PF=4 (K chunks not a multiple of 5: no served shape)",
    "ILi0ELi2ELi8ELi2ELi4E": "dense NT=2 RT=2 PF=4 (K chunks not a multiple of 5: no served shape)",
    "ILi0ELi1ELi4ELi1ELi6E": "dense NT=1 KSPLIT=2 PF=6 (qkv / expert gate_up shape, M<=8, sm_121)",
    "ILi0ELi2ELi4ELi1ELi6E": "dense NT=2 KSPLIT=2 PF=6 (qkv / expert gate_up shape, M 9-16, sm_121)",
    "ILi0ELi1ELi2ELi1ELi4E": "dense NT=1 KSPLIT=4 PF=4 (qkv / gate_up shape sm_90, o_proj / down shape sm_121; M<=8)",
    "ILi0ELi2ELi2ELi1ELi4E": "dense NT=2 KSPLIT=4 PF=4 (qkv / gate_up shape sm_90, o_proj / down shape sm_121; M 9-16)",
    "ILi0ELi1ELi1ELi1ELi8E": "dense NT=1 KSPLIT=8 PF=8 (o_proj, M<=8, sm_90)",
    "ILi0ELi2ELi1ELi1ELi8E": "dense NT=2 KSPLIT=8 PF=8 (o_proj, M 9-16, sm_90)",
    "ILi0ELi1ELi1ELi1ELi6E": "dense NT=1 KSPLIT=8 PF=6 (expert down shape, M<=8, sm_90)",
    "ILi0ELi2ELi1ELi1ELi6E": "dense NT=2 KSPLIT=8 PF=6 (expert down shape, M 9-16, sm_90)",
    "ILi1ELi1ELi4ELi1ELi4E": "moe gate_up NT=1 KSPLIT=2 PF=4 (default)",
    "ILi1ELi1ELi2ELi1ELi4E": "moe gate_up NT=1 KSPLIT=4 PF=4 (default until 2026-11-26)",
    "ILi2ELi1ELi1ELi1ELi8E": "moe down NT=1 PF=8 (default)",
}
# The prefill kernel mxfp4_pf_kernel<MODE, NT, RT, CTAS, FORM> (M > 16): the served tilings (tuning.yaml packed_mm;
# FORM 1 bf16 activations, the default; FORM 0 f16 fragments, for weights with scale bytes above 128).
PF_VARIANTS = {
    "ILi0ELi8ELi2ELi1ELi1EE": "prefill dense NT=8 RT=2 bf16 (default)",
    "ILi1ELi8ELi2ELi2ELi1EE": "prefill moe gate_up NT=8 RT=2 bf16 2 CTAs/SM (default)",
    "ILi2ELi8ELi2ELi2ELi1EE": "prefill moe down NT=8 RT=2 bf16 2 CTAs/SM (default)",
    "ILi0ELi8ELi2ELi1ELi0EE": "prefill dense NT=8 RT=2 f16 (scale bytes > 128)",
    "ILi1ELi8ELi2ELi1ELi0EE": "prefill moe gate_up NT=8 RT=2 f16 (scale bytes > 128)",
    "ILi2ELi8ELi2ELi1ELi0EE": "prefill moe down NT=8 RT=2 f16 (scale bytes > 128)",
}


# The same kernels with a token block's padding rows staged as zeros (csrc *_live_kernel, packed_mm's
# cuda_moe_live_rows_max_slots): the MoE tilings that rule would serve, sm_12x's (bf16, 2 CTAs per SM) and sm_90's
# sparse one (wgmma, 64 token rows).
PF_LIVE_VARIANTS = {
    "ILi1ELi8ELi2ELi2ELi1EE": "prefill moe gate_up NT=8 RT=2 bf16 2 CTAs/SM, padding rows as zeros",
    "ILi2ELi8ELi2ELi2ELi1EE": "prefill moe down NT=8 RT=2 bf16 2 CTAs/SM, padding rows as zeros",
}


def template_args(mangled: str) -> tuple[int, ...]:
    """'ILi0ELi1ELi8ELi2ELi5E' -> (0, 1, 8, 2, 5)."""
    return tuple(int(a) for a in re.findall(r"Li(\d+)E", mangled))


# The wgmma prefill kernel mxfp4_wg_kernel<MODE, NT, RT, CTAS> (sm_90a only): the MoE tilings sm_90 serves (tuning.yaml
# sm_90 packed_mm cuda_moe_*: 128 token rows, 64 where experts are sparse).
WG_VARIANTS = {
    "ILi1ELi16ELi1ELi2EE": "prefill moe gate_up NT=16 RT=1 wgmma 2 CTAs/SM (sm_90 default)",
    "ILi2ELi16ELi1ELi2EE": "prefill moe down NT=16 RT=1 wgmma 2 CTAs/SM (sm_90 default)",
    "ILi1ELi8ELi1ELi2EE": "prefill moe gate_up NT=8 RT=1 wgmma 2 CTAs/SM (sm_90, <= 64 slots per expert)",
    "ILi2ELi8ELi1ELi2EE": "prefill moe down NT=8 RT=1 wgmma 2 CTAs/SM (sm_90, <= 64 slots per expert)",
}
WG_LIVE_VARIANTS = {
    "ILi1ELi8ELi1ELi2EE": "prefill moe gate_up NT=8 RT=1 wgmma 2 CTAs/SM, padding rows as zeros",
    "ILi2ELi8ELi1ELi2EE": "prefill moe down NT=8 RT=1 wgmma 2 CTAs/SM, padding rows as zeros",
}


def words_per_pass(kernel: str, args: tuple[int, ...], src_text: str) -> int:
    """32-bit weight words one thread consumes per pass of the kernel's chunk loop, from its template arguments.
    A chunk is one uint4 (4 words) per row tile (chunk_mma; the prefill's wb[PF_W][RT]). mxfp4_kernel<MODE, NT, RW,
    RT, PF>: PF chunks per pass (`for (int i0 = 0; i0 < np; i0 += PF)`) of RT row tiles. mxfp4_pf_kernel<MODE, NT,
    RT, CTAS, FORM>: PF_W chunks per pass (`for (int c0 = 0; c0 < a.kc; c0 += PF_W)`, PF_W read from the source) of
    RT row tiles; mxfp4_wg_kernel<MODE, NT, RT, CTAS>: WG_WPF chunks per pass of RT row tiles. NT (token tiles)
    multiplies the MMAs, not the words: each decoded word feeds NT of them."""
    if kernel == "mxfp4_kernel":
        _, _, _, rt, pf = args
        return rt * pf * 4
    const = "WG_WPF" if kernel.startswith("mxfp4_wg") else "PF_W"
    m = re.search(rf"constexpr int {const} = (\d+);", src_text)
    if not m:
        raise RuntimeError(f"the kernel source no longer defines `constexpr int {const}`: update sass_count.words_per_pass")
    return args[2] * int(m.group(1)) * 4


def variant_id(mangled: str, kernel: str = "mxfp4_kernel") -> str:
    """'ILi0ELi1ELi8ELi2ELi5E' -> 'mxfp4_kernel<0,1,8,2,5>' (MODE, NT, RW, RT, PF), as Nsight Compute names it."""
    return f"{kernel}<{','.join(str(a) for a in template_args(mangled))}>"


def cuda_counts(arch: str = "90a", tc: build.Toolchain | None = None, src: Path = build.SRC) -> list[dict]:
    """Hot-loop counts of every CUDA_VARIANTS kernel in `src` built for sm_<arch> (BuildError if nvcc refuses it)."""
    tc = tc or build.find_toolchain()
    text = build.disassemble(build.compile_cubin(Path(src), arch, tc), tc)
    return count_cuda_functions(parse_nvdisasm(text), Path(src), scoreboard.control_words(text))


def count_cuda_functions(funcs: dict[str, list[tuple[int, str, int]]], src: Path,
                         controls: dict[str, dict[int, scoreboard.Control]] | None = None) -> list[dict]:
    # Hot = source lines that run per chunk: the decode, mma, loads, scale FFMAs, the x-fragment
    # loads, the prefetch `issue` and the chunk loop itself. Other lines inside the loop body are
    # the next item's address setup (`set_item`, item_info, tile_of), run once per item.
    hot = set()
    for a, b in (("__device__ __forceinline__ void decode4", "^}"), ("__device__ __forceinline__ void mma16816", "^}"),
                 ("__device__ __forceinline__ void decode4_bf16", "^}"), ("__device__ __forceinline__ uint32_t e8m0_bf16x2", "^}"),
                 ("__device__ __forceinline__ uint32_t bf16x2_mul", "^}"),
                 ("__device__ __forceinline__ uint32_t lop3", "^}"),
                 ("__device__ __forceinline__ void mma16816_bf16", "^}"), ("__device__ __forceinline__ void ldmatrix_x4", "^}"),
                 ("__device__ __forceinline__ void ld_stream_v4_if", "^}"),
                 ("__device__ __forceinline__ void ld_stream_u32_if", "^}"),
                 ("__device__ __forceinline__ void chunk_mma", "^}"), ("__device__ __forceinline__ void load_xb", "^}"),
                 ("auto issue = [&]", "  };"), ("    for (int i0 = 0; i0 < np; i0 += PF) {", "issue(wb[p], sb[p]);"),
                 # prefill: the chunk loop and the activation staging it calls
                 ("  auto stage = [&](int c) {", "  };"), ("  auto stage_weights = [&](int c) {", "  };"),
                 ("  auto load_slot = [&](int p, int c) {", "  };"),
                 ("  for (int c0 = 0; c0 < a.kc; c0 += PF_W) {", 'asm volatile("cp.async.wait_all;'),
                 ("__device__ __forceinline__ void pf_decode_step", "^}"),
                 # the wgmma prefill: its chunk loop and the wgmma wrappers, fence, commit and wait it calls
                 ("    for (int c0 = 0; c0 < a.kc; c0 += WG_WPF) {", "wgmma_wait<0>();"),
                 ("// One wrapper per N (16..128 token columns)", "// Shared-memory matrix descriptor")):
        hot |= _lines_matching(src, a, b)
    text = src.read_text()
    all_lines = set(range(1, len(text.splitlines()) + 1))
    cold = all_lines - hot
    out = []
    for kernel, table, marker in (("mxfp4_kernel", CUDA_VARIANTS, "HMMA"), ("mxfp4_pf_kernel", PF_VARIANTS, "HMMA"),
                                  ("mxfp4_wg_kernel", WG_VARIANTS, "HGMMA"),
                                  ("mxfp4_pf_live_kernel", PF_LIVE_VARIANTS, "HMMA"),
                                  ("mxfp4_wg_live_kernel", WG_LIVE_VARIANTS, "HGMMA")):
        for key, desc in table.items():
            name = next((f for f in funcs if f"{kernel}{key}" in f), None)
            # the wgmma kernel is built empty for archs without wgmma (sm_121a): nothing to count there
            if name and any(marker in t for _, t, _ in funcs[name]):
                words = words_per_pass(kernel, template_args(key), text)
                row = {"variant": variant_id(key, kernel), **summarize(f"cuda {desc}", funcs[name], marker, words, cold)}
                if controls is not None and name in controls:
                    # the least over the kernel's copies of its hot loop (one per live token-tile count for the wgmma
                    # kernel): which copy a call runs depends on its tokens
                    copies = list(loops(funcs[name], marker))
                    most = max(n for n, _ in copies)  # the hot loop's count (hot_loop)
                    found = [c for n, body in copies if n == most
                             for c in [scoreboard.load_cover(body, controls[name])] if c is not None]
                    cover = min(found, key=lambda c: c.mma) if found else None
                    row["load_cover_mma"] = None if cover is None else cover.mma
                    row["load_cover_instructions"] = None if cover is None else cover.instructions
                    # no cover because no weight load is on a register scoreboard: all of them come through cp.async
                    # into shared memory (counted waits on its commit groups), not because no wait was found
                    row["loads_via_cp_async"] = all(
                        not any(scoreboard.is_global_load(t) for _, t, _ in body)
                        and any(scoreboard.opcode(t).startswith("LDGSTS") for _, t, _ in body) for _, body in copies)
                out.append(row)
    return out


def triton_counts(arch: int = 90, tc: build.Toolchain | None = None, cases=None) -> list[dict]:
    """Compile the Triton kernels for sm_<arch> without a GPU and count their loops: the decode GEMVs
    (gemv.static_count_cases) and the prefill GEMMs on the same packed bytes (packed_mm.static_count_cases, at
    this arch's tuned config), or `cases`. Arguments the JIT would specialize as multiples of 16 are passed as such."""
    nvdisasm = str(tc.nvdisasm) if tc and tc.nvdisasm else _tool("nvdisasm")
    os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret (must precede importing gemv)
    import triton

    from .. import gemv, packed_mm

    results = []
    for case in cases if cases is not None else gemv.static_count_cases() + packed_mm.static_count_cases(f"sm_{arch}"):
        funcs = parse_nvdisasm(triton_sass(case, arch, nvdisasm))
        ins = next(iter(funcs.values()))
        found = hot_loop(ins, case.marker)
        if found is None:
            raise RuntimeError(f"sm_{arch} {case.name}: no loop containing {case.marker} in its SASS")
        row = summarize(f"triton {triton.__version__} {case.name}", ins, case.marker, case.words_per_pass, set())
        results.append({"variant": case.name, **row})
    return results


def triton_sass(case, arch: int, nvdisasm: str | None = None) -> str:
    """nvdisasm --print-line-info text of one Triton kernel configuration (a StaticCountCase) compiled for sm_<arch>
    without a GPU. The caller must have set TRITON_INTERPRET=0 before the kernel modules were imported."""
    import triton
    from triton.backends.compiler import GPUTarget

    names = list(case.signature)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in case.divisible}
    src = triton.compiler.ASTSource(fn=case.fn, signature=case.signature, constexprs=case.constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": case.num_warps, "num_stages": case.num_stages})
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        Path(cubin).write_bytes(k.asm["cubin"])
        return subprocess.run([nvdisasm or _tool("nvdisasm"), "--print-line-info", cubin], check=True,
                              capture_output=True, text=True).stdout


def memory_ops(sass_text: str) -> dict[str, int]:
    """Global loads and stores of one kernel's SASS by opcode with its width (LDG.E.128, STG.E.U16, ...)."""
    ops: dict[str, int] = collections.Counter()
    for funcs in parse_nvdisasm(sass_text).values():
        for _, ins, _ in funcs:
            op = opcode(ins)
            if op.startswith(("LDG", "STG")):
                ops[op] += 1
    return dict(ops)


def triton_version() -> str:
    import triton

    return triton.__version__


def print_rows(rows: list[dict], arch: str) -> None:
    for r in rows:
        top = ", ".join(f"{k} {v}" for k, v in list(r["ops"].items())[:8])
        print(f"sm_{arch:5s} {r['kernel']:52s} {r['instr_per_word']:6.2f} instr/word hot, {r['loop_instr_per_word']:6.2f} "
              f"whole loop, {r['mma_per_word']:g} MMA/word ({r['words']:g} words/thread/pass; {top})"
              + (f"; a weight load waited on {r['load_cover_mma']} MMAs ({r['load_cover_instructions']} instructions) "
                 "after issue" if r.get("load_cover_mma") is not None else "")
              + ("; every weight load staged through cp.async (none on a register scoreboard)"
                 if r.get("loads_via_cp_async") else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.tools.sass_count", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", type=build.arch_option, help="e.g. 90, 90a, 121a; repeatable (default 90a)")
    ap.add_argument("--cuda", action="store_true", help="only the CUDA kernels")
    ap.add_argument("--triton", action="store_true", help="only the Triton kernels")
    ap.add_argument("--nvcc", help="build with this nvcc instead of the wheel's (kernels/tools/build.py)")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--check-budget", action="store_true",
                        help="exit 1 when a CUDA or Triton hot loop exceeds kernels/sass_budget.yaml")
    budget.add_argument("--write-budget", action="store_true", help="record the CUDA and Triton counts in kernels/sass_budget.yaml")
    args = ap.parse_args(argv)
    archs = args.arch or ["90a"]
    both = not (args.cuda or args.triton)
    if not both and (args.check_budget or args.write_budget):
        ap.error("the budget covers the CUDA and the Triton kernels: drop --cuda / --triton")
    try:
        tc = build.find_toolchain(args.nvcc) if (args.cuda or both) else None
    except build.ToolchainMissing as ex:
        print(f"sass_count: {ex}", file=sys.stderr)
        return 2
    cuda: dict[str, list[dict]] = {}
    if tc:
        print(f"sass_count: {tc.describe()}", flush=True)
        try:
            build.compile_all(build.SRC, archs, tc)  # the arches side by side; cuda_counts then finds them cached
            cuda = {a: cuda_counts(a, tc) for a in archs}
        except build.BuildError as ex:
            print(f"sass_count: {ex}", file=sys.stderr)
            return 1
    tri: dict[str, list[dict]] = {}
    for arch in archs:
        if args.triton or both:
            tri[arch] = triton_counts(int(re.sub(r"\D", "", arch)), tc)
        print_rows(cuda.get(arch, []) + tri.get(arch, []), arch)
    if args.write_budget:
        path = sass_budget.record(cuda, tc.version, tri, triton_version())
        print(f"sass_count: recorded {', '.join(f'sm_{a}' for a in cuda)} in {path}")
    if args.check_budget:
        budget = sass_budget.load()
        problems = sass_budget.check(cuda, budget, tc.version) + sass_budget.check(tri, budget, triton_version(), "triton")
        for line in problems:
            print(f"SASS BUDGET EXCEEDED: {line}")
        if problems:
            return 1
        print(f"sass_count: every hot loop within kernels/sass_budget.yaml ({', '.join(f'sm_{a}' for a in cuda)}; "
              f"CUDA and Triton)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
