"""The CUDA kernels build for every architecture we ship, on CPU: kernels/csrc/mxfp4_mma.cu for sm_90a (H100 /
H200) and sm_121a (GB10) with the pinned nvcc wheel (requirements-kernels-build.txt, kernels/tools/build.py).

(a) the real source builds for both, and each decode loop's static SASS counts are recorded (JUnit properties);
(b) the test of that test: a copy using TMA gather4, which sm_12x lacks, fails the sm_121a build with ptxas'
    reason, while the same instruction alone builds for sm_100a (so the failure is the architecture's, not a typo);
    and the instruction facts the GB10 plans rely on (tuning.yaml sm_121 notes) hold for this nvcc;
(c) the hot loops stay within kernels/sass_budget.yaml (both arches), and a copy whose decode grows by two
    instructions per weight word fails that check, as does one that computes each product twice (the MMAs per word
    are budgeted, and words per pass come from the template arguments, not from the MMA count); the budget holds
    every decode variant cuda_ext.pick_variant gives the served shapes on sm_90 and sm_121 (no nvcc needed);
(d) the same for the Triton loops (the prefill GEMM on the packed bytes, the decode GEMVs), compiled for both arches
    by the installed Triton in a child process (this one runs Triton's interpreter), with one more FADD per
    decoded element pair as the test of the test.

Without the wheel the tests skip and say what to install; SUITE_REQUIRE_NVCC=1 (CI: .ci/build_kernels.sh installs
it first) turns that skip into a failure, as SUITE_REQUIRE_ACTIONLINT=1 does for the workflow lint. Only the
wheel's nvcc is used: the budget holds its counts, and another nvcc schedules differently. Cubins are cached by
source hash, so after .ci/build_kernels.sh the real source is not compiled again here; each mutated copy is.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.tools import build, mma_peak, sass_budget, sass_count

pytestmark = pytest.mark.level1_5

REQUIRE_ENV = "SUITE_REQUIRE_NVCC"
PROBE = mma_peak.SRC


@pytest.fixture(scope="module")
def toolchain() -> build.Toolchain:
    try:
        return build.find_toolchain(wheel_only=True)
    except build.ToolchainMissing as ex:
        why = str(ex)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{why} ({REQUIRE_ENV}=1)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def counts(toolchain) -> dict[str, list[dict]]:
    build.compile_all(build.SRC, build.ARCHS, toolchain)  # both arches at once; a BuildError fails the tests using it
    return {arch: sass_count.cuda_counts(arch, toolchain) for arch in build.ARCHS}


def test_the_kernels_build_for_every_shipped_arch(counts, toolchain, record_property):
    record_property("nvcc", toolchain.describe())
    for arch, rows in counts.items():
        found = {r["variant"] for r in rows}
        want = {sass_count.variant_id(k) for k in sass_count.CUDA_VARIANTS}
        want |= {sass_count.variant_id(k, "mxfp4_pf_kernel") for k in sass_count.PF_VARIANTS}
        want |= {sass_count.variant_id(k, "mxfp4_pf_live_kernel") for k in sass_count.PF_LIVE_VARIANTS}
        if arch == "90a":  # wgmma: Hopper only; the sm_121a build of that kernel is empty (and so not counted)
            want |= {sass_count.variant_id(k, "mxfp4_wg_kernel") for k in sass_count.WG_VARIANTS}
            want |= {sass_count.variant_id(k, "mxfp4_wg_live_kernel") for k in sass_count.WG_LIVE_VARIANTS}
        assert found == want, (f"sm_{arch}: no decode or prefill loop found for {sorted(want - found)}, "
                               f"or one found that must not be there: {sorted(found - want)}")
        record_property(f"sass_sm_{arch}", json.dumps({r["variant"]: [r["instr_per_word"], r["loop_instr_per_word"]]
                                                       for r in rows}))
        sass_count.print_rows(rows, arch)  # shown with -s / -rA; .ci/build_kernels.sh prints them in every CI log


def test_words_per_pass_give_one_mma_per_word_and_token_tile(counts):
    """sass_count.words_per_pass reads the words from the template arguments (RT row tiles x PF chunks x 4 words);
    chunk_mma and the prefill loop issue one m16n8k16 per 4-word chunk, k-step and token tile, i.e. NT per word. A
    source whose chunk holds another number of words would break that formula: it shows here first. The wgmma kernel
    issues one m64nNk16 per word: each covers all NT token tiles of its warpgroup's four row tiles."""
    for arch, rows in counts.items():
        for r in rows:
            nt = int(r["variant"].split("<")[1].split(",")[1])  # <MODE, NT, ...> for every kernel
            want = 1 if r["variant"].startswith("mxfp4_wg") else nt
            assert r["mma_per_word"] == want, f"sm_{arch} {r['variant']}: {r['mma_per_word']} MMA per word, want {want}"


def test_every_served_loop_s_weight_loads_are_read_from_real_control_codes(counts, toolchain):
    """kernels/tools/scoreboard.py against ptxas' own output: in every served hot loop each global load names one of
    the six scoreboards and some instruction of the loop waits on it (a wrong bit layout reads 7, "none", or a
    scoreboard nothing waits on), and the loads' cover is found. What it prints (sass_count rows) is the static side of
    the Nsight Compute stall that cover explains: the wgmma MoE prefill waited on its weight loads two wgmmas after the
    newest was issued (docs/evidence/sm_90-2026-12-06-h100-wide-tiling-120b-ncu/); it now stages them through cp.async,
    and a loop with no register-scoreboard load is checked to stage its weights that way."""
    from kernels.tools import scoreboard

    for arch in build.ARCHS:
        text = build.disassemble(build.compile_cubin(build.SRC, arch, toolchain), toolchain)
        funcs, controls = sass_count.parse_nvdisasm(text), scoreboard.control_words(text)
        for r in counts[arch]:
            kernel, args = r["variant"].split("<")
            mangled = "I" + "".join(f"Li{a}E" for a in args.rstrip(">").split(",")) + "E"
            name = next(f for f in funcs if f"{kernel}{mangled}" in f)
            loop = sass_count.hot_loop(funcs[name], "HGMMA" if kernel.startswith("mxfp4_wg") else "HMMA")[1]
            ctl = [controls[name][a] for a, _, _ in loop]
            loads = [(c, t) for c, (_, t, _) in zip(ctl, loop) if scoreboard.is_global_load(t)]
            if r["loads_via_cp_async"]:  # the wgmma prefill stages its weights with the activations' cp.async groups
                assert not loads and r["load_cover_mma"] is None, f"sm_{arch} {r['variant']}: {r}"
                assert any(scoreboard.opcode(t).startswith("LDGSTS") for _, t, _ in loop), r["variant"]
                continue
            assert loads, f"sm_{arch} {r['variant']}: no global load in its hot loop"
            for c, t in loads:
                assert c.write_sb < 6, f"sm_{arch} {r['variant']}: {t} names no scoreboard (control {c})"
                assert any(o.waits_on(c.write_sb) for o in ctl) or f"SB{c.write_sb}," in " ".join(
                    t2 for _, t2, _ in loop if "DEPBAR" in t2), f"sm_{arch} {r['variant']}: nothing waits on {t}"
            assert r["load_cover_mma"] is not None, f"sm_{arch} {r['variant']}: no wait drains its weight loads"
        # the decode kernels and the mma.sync prefill load their weights into registers on every arch: the decoding
        # above is exercised on real loads, not skipped for every kernel
        assert sum(not r["loads_via_cp_async"] for r in counts[arch]) >= 5, arch


def test_the_mma_throughput_probe_builds_for_every_shipped_arch(toolchain):
    # kernels.tools.mma_peak times mma.sync bf16 on a GPU to read a Hopper prefill gate; the instruction is GB10's only
    # tensor-core MMA, so the probe must build for sm_121a as well as for the Hopper stand-in
    for arch in build.ARCHS:
        cubin = build.compile_cubin(PROBE, arch, toolchain)
        sass = build.disassemble(cubin, toolchain)
        assert "mma_peak_kernel" in sass and "HMMA.16816.F32.BF16" in sass, f"sm_{arch}: no bf16 HMMA probe in the cubin"


# TMA gather4 (Blackwell datacenter, sm_100a): rows gathered by index into shared memory. sm_12x has no gather4.
GATHER4 = r"""
extern "C" __global__ void gather4_probe(const void* tmap, int* out) {
  __shared__ __align__(128) int smem[1024];
  __shared__ __align__(8) unsigned long long bar;
  unsigned s = (unsigned)__cvta_generic_to_shared(smem), b = (unsigned)__cvta_generic_to_shared(&bar);
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile::gather4.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
               :: "r"(s), "l"(tmap), "r"(0), "r"(0), "r"(1), "r"(2), "r"(3), "r"(b) : "memory");
  out[threadIdx.x] = smem[threadIdx.x];
}
"""


def test_a_source_using_what_sm_121a_lacks_fails_its_build(toolchain, tmp_path):
    mutated = tmp_path / "mxfp4_mma_gather4.cu"
    mutated.write_text(build.SRC.read_text() + GATHER4)
    with pytest.raises(build.BuildError) as e:
        build.compile_cubin(mutated, "121a", toolchain, cache=False)
    assert "gather4" in str(e.value) and "not supported on .target 'sm_121a'" in str(e.value), str(e.value)[-1500:]
    alone = tmp_path / "gather4.cu"
    alone.write_text(GATHER4)
    build.compile_cubin(alone, "100a", toolchain, cache=False)  # exists there: the refusal above is sm_121a's


# Kernel bodies (r: the value stored, p: a global pointer) for what the GB10 notes rely on (tuning.yaml sm_121).
FACTS = {
    "cvt_e2m1x2": """unsigned short v = threadIdx.x;
  asm volatile("{ .reg .b8 b; cvt.u8.u16 b, %1; cvt.rn.f16x2.e2m1x2 %0, b; }" : "=r"(r) : "h"(v));""",
    "mma_sync_bf16": """unsigned a = threadIdx.x; float d0, d1, d2, d3;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, "
               "{%5,%5,%5,%5};" : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3) : "r"(a), "f"(0.f));
  r = __float_as_uint(d0 + d1 + d2 + d3);""",
    "griddepcontrol": """asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");""",
    "cp_async_bulk": """__shared__ __align__(16) unsigned buf[64]; __shared__ __align__(8) unsigned long long bar;
  unsigned s = (unsigned)__cvta_generic_to_shared(buf), b = (unsigned)__cvta_generic_to_shared(&bar);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 256, [%2];"
               :: "r"(s), "l"(p), "r"(b) : "memory");
  r = buf[threadIdx.x % 64];""",
}
EXPECT = [  # (fact, arch, builds): a change here changes what the kernels may use on GB10
    ("cvt_e2m1x2", "121a", True),  # 2 FP4 codes per instruction (the decode4 alternative in the notes)
    ("cvt_e2m1x2", "121", False),  # ... only for the `a` (or 120f) target
    ("cvt_e2m1x2", "90a", False),
    ("mma_sync_bf16", "121a", True),
    ("griddepcontrol", "121a", True),  # programmatic dependent launch (gate_up -> down)
    ("cp_async_bulk", "121a", True),  # TMA bulk copies without a tensor map
]


@pytest.mark.parametrize("fact,arch,builds", EXPECT, ids=[f"{f}-sm_{a}" for f, a, _ in EXPECT])
def test_instruction_facts_of_the_gb10_notes(toolchain, tmp_path, fact, arch, builds):
    src = tmp_path / "probe.cu"
    src.write_text(f'extern "C" __global__ void probe(unsigned* out, const void* p) {{\n  unsigned r = 0;\n'
                   f"  {FACTS[fact]}\n  out[threadIdx.x] = r;\n}}\n")
    if builds:
        build.compile_cubin(src, arch, toolchain, cache=False)
    else:  # ptxas refuses the instruction for that target
        with pytest.raises(build.BuildError, match=rf"not supported on \.target 'sm_{arch}'"):
            build.compile_cubin(src, arch, toolchain, cache=False)


def test_the_hot_loops_stay_within_the_sass_budget(counts, toolchain):
    problems = sass_budget.check(counts, sass_budget.load(), toolchain.version)
    assert not problems, "\n".join(problems)


# Two more instructions per weight word in decode4 (a bit reverse and a LOP3): +14% on every decode variant. The prefill
# kernel's f16 form decodes with decode4 too (~44 per word: each word feeds 8 MMAs), where two are about its 5% margin;
# its bf16 form has its own decode (decode4_bf16, BF16_BLOAT below). One more (~+7% on the decode loops) would fail
# them; the margin tolerates less than one instruction per word.
BLOAT = ("  a[0] = (w << 2) & M;\n", "  a[0] = ((w << 2) & M) ^ (__brev(w) & 0x00010001u);\n")
# The bf16 decode of the prefill kernel, a bit reverse and a LOP3 more per register: ~8 per weight word, ~+20% on the
# bf16 prefill loops (~40 per word), which serve the MoE and the dense layers below dequant_min_m.
BF16_BLOAT = ("  for (int i = 0; i < 4; ++i) a[i] = lop3<SELECT>(t[i], t[i] >> 3, C);\n",
              "  for (int i = 0; i < 4; ++i) a[i] = lop3<SELECT>(t[i], t[i] >> 3, C) ^ (__brev(t[i]) & 0x00010001u);\n")


def _breaches_of_bloated_source(bloat: tuple[str, str], toolchain, tmp_path) -> tuple[set[str], list[str]]:
    """The kernel variants over the sm_121a budget once bloat[0] (one line of the source) becomes bloat[1], and the
    budget's messages."""
    src = build.SRC.read_text()
    assert src.count(bloat[0]) == 1, f"the kernel source changed: update the bloat of {bloat[0].strip()!r}"
    mutated = tmp_path / "mxfp4_mma_bloated.cu"
    mutated.write_text(src.replace(*bloat))
    rows = sass_count.cuda_counts("121a", toolchain, mutated)
    problems = sass_budget.check({"121a": rows}, sass_budget.load(), toolchain.version)
    return {line.split()[1] for line in problems if "> budget" in line}, problems


def test_the_budget_fails_a_build_whose_decode_loop_grew(toolchain, tmp_path):
    over, problems = _breaches_of_bloated_source(BLOAT, toolchain, tmp_path)
    # Every decode loop (~14 instructions per word: the bloat is +15%). The prefill loops of the f16 form use decode4
    # too (~44 per word, near the 5% margin: over or not); those of the bf16 form decode with their own lop3 sequence
    # and must not move.
    decode = {sass_count.variant_id(k) for k in sass_count.CUDA_VARIANTS}
    f16_prefill = {sass_count.variant_id(k, "mxfp4_pf_kernel") for k in sass_count.PF_VARIANTS if k.endswith("ELi0EE")}
    assert decode <= over <= decode | f16_prefill, problems


# The same product computed a second time and averaged in (same values, twice the tensor work per weight word): with
# words per pass taken from the MMA count this read as twice the words, so fewer instructions per word, and passed.
MMA_TWICE = ("      mma16816(d, a1, xb[nt][4 * bh + 2], xb[nt][4 * bh + 3], d[0], d[1], d[2], d[3]);\n",
             "      mma16816(d, a1, xb[nt][4 * bh + 2], xb[nt][4 * bh + 3], d[0], d[1], d[2], d[3]);\n"
             "      {\n"
             "        float e[4];\n"
             "        mma16816(e, a0, xb[nt][4 * bh], xb[nt][4 * bh + 1], -0.f, -0.f, -0.f, -0.f);\n"
             "        mma16816(e, a1, xb[nt][4 * bh + 2], xb[nt][4 * bh + 3], e[0], e[1], e[2], e[3]);\n"
             "        for (int i = 0; i < 4; ++i) d[i] = (d[i] + e[i]) * 0.5f;\n"
             "      }\n")


def test_the_budget_fails_a_build_that_computes_each_product_twice(toolchain, tmp_path):
    over, problems = _breaches_of_bloated_source(MMA_TWICE, toolchain, tmp_path)
    # every decode variant (chunk_mma), on its MMAs per word (x2) and on its instructions per word; the prefill
    # kernel has its own MMA loop and must not move
    decode = {sass_count.variant_id(k) for k in sass_count.CUDA_VARIANTS}
    assert over == decode, problems
    assert {line.split()[1] for line in problems if "): mma " in line} == decode, problems


def test_the_budget_fails_a_build_whose_bf16_prefill_decode_grew(toolchain, tmp_path):
    over, problems = _breaches_of_bloated_source(BF16_BLOAT, toolchain, tmp_path)
    bf16 = ({sass_count.variant_id(k, "mxfp4_pf_kernel") for k in sass_count.PF_VARIANTS if k.endswith("ELi1EE")}
            | {sass_count.variant_id(k, "mxfp4_pf_live_kernel") for k in sass_count.PF_LIVE_VARIANTS})
    assert bf16 and over == bf16, problems


# The decode kernels' served shapes (gpt-oss-120b and 20b: the same layer sizes, kernels/cases.py) and the SM counts
# pick_variant sizes them for: H100 / H200 (sm_90, 132 SMs) and GB10 (sm_121, 48 SMs).
SERVED_ARCHS = {"sm_90": 132, "sm_121": 48}


def _served_decode_variants(arch: str, sms: int) -> dict[str, str]:
    """variant id -> one served use of it: what cuda_ext.pick_variant gives each dense layer at M = 1..16 (tuning.yaml
    gemv.packed of `arch`), and the MoE's gate_up / down variants (moe.packed; MODE 1 / 2, one token column)."""
    from kernels import cuda_ext
    from kernels.cases import MODELS
    from kernels.tuning import get_config

    cfg = get_config("gemv", arch)["packed"]
    out = {}
    for model in MODELS:
        for name, (n, k) in model.linear_shapes().items():
            for m in range(1, cuda_ext.CUDA_MAX_M + 1):
                v = cuda_ext.pick_variant(m, -(-n // 16), -(-k // 64), cfg, sms)
                out.setdefault(f"mxfp4_kernel<0,{','.join(map(str, cuda_ext.VARIANTS[v]))}>", f"{model.name} {name} M={m}")
    moe = get_config("moe", arch)["packed"]
    for mode, key in ((cuda_ext.MODE_GATEUP, "gate_up_variant"), (cuda_ext.MODE_DOWN, "down_variant")):
        out[f"mxfp4_kernel<{mode},{','.join(map(str, cuda_ext.VARIANTS[int(moe[key])]))}>"] = f"MoE {key}"
    return out


@pytest.mark.parametrize("arch", list(SERVED_ARCHS))
def test_the_budget_holds_every_decode_variant_the_served_shapes_run(arch):
    """A served variant missing from sass_count.CUDA_VARIANTS is never counted, so its loop could grow unchecked
    (GB10's qkv and expert gate_up shape at M <= 8 ran mxfp4_kernel<0,1,4,1,6>, which was not budgeted)."""
    from kernels.cuda_ext import arch_target

    counted = {sass_count.variant_id(k) for k in sass_count.CUDA_VARIANTS}
    budgeted = set(sass_budget.load()["counts"][f"sm_{arch_target(int(arch[3:-1]), int(arch[-1]))}"])
    served = _served_decode_variants(arch, SERVED_ARCHS[arch])
    missing = {v: use for v, use in served.items() if v not in counted or v not in budgeted}
    assert not missing, f"{arch}: served decode variants not counted or not budgeted (re-record): {missing}"


def test_the_budget_refuses_counts_of_another_nvcc():
    budget = {"nvcc": "13.2.86", "margin": 0.05, "counts": {"sm_121a": {}}}
    problems = sass_budget.check({"121a": []}, budget, "13.0.88")
    assert len(problems) == 1 and "recorded with nvcc 13.2.86" in problems[0], problems


def test_ci_builds_what_the_gpus_build_at_first_use():
    """cuda_ext compiles for the device's `a` target (sm_90a on H100 / H200, sm_121a on GB10): the targets CI
    builds, so a source that passes CI builds on those GPUs, and one using an `a`-only instruction (GB10's FP4
    conversions) builds there too. No nvcc needed."""
    from kernels.cuda_ext import arch_target

    assert {arch_target(9, 0), arch_target(12, 1)} == set(build.ARCHS)
    assert arch_target(8, 0) == "80", "parts without an `a` target build the plain one"


# Child process: the kernels must be decorated with TRITON_INTERPRET=0 to compile, and this process interprets them.
# `rows`: the loop counts of every Triton case; `dequant`: the dense dequantize kernel's global loads and stores. From
# kernels.packed_mm, or from a mutated copy of it.
TRITON_CHILD = """
import importlib.util, json, sys
from kernels.tools import sass_count
what, arch, module = sys.argv[1], sys.argv[2], sys.argv[3]
mod = None
if module:
    spec = importlib.util.spec_from_file_location("packed_mm_mutated", module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
sm = int(arch.rstrip("a"))
if what == "rows":
    cases = mod.static_count_cases(f"sm_{sm}") if mod else None
    print(json.dumps({"version": sass_count.triton_version(), "rows": sass_count.triton_counts(sm, None, cases)}))
else:
    if mod is None:
        from kernels import packed_mm as mod
    case = mod.dequant_static_case(f"sm_{sm}")
    print(json.dumps({"ops": sass_count.memory_ops(sass_count.triton_sass(case, sm)),
                      "bytes_out": case.words_per_pass * 4 * 4}))
"""


def _triton_child(what: str, arch: str, module: Path | None = None) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", TRITON_CHILD, what, arch, str(module or "")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=build.SRC.parents[2])
    assert done.returncode == 0, f"compiling the Triton kernels ({what}) for sm_{arch} failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _triton_rows(arch: str, module: Path | None = None) -> tuple[str, list[dict]]:
    out = _triton_child("rows", arch, module)
    return out["version"], out["rows"]


def test_the_triton_loops_stay_within_the_sass_budget(toolchain, record_property):
    budget = sass_budget.load()
    for arch in build.ARCHS:
        version, rows = _triton_rows(arch)
        assert any(r["variant"].startswith("packed_mm moe gate_up") for r in rows), [r["variant"] for r in rows]
        sass_count.print_rows(rows, arch)
        record_property(f"triton_sass_sm_{arch}", json.dumps({r["variant"]: r["instr_per_word"] for r in rows}))
        problems = sass_budget.check({arch: rows}, budget, version, "triton")
        assert not problems, "\n".join(problems)


# One FADD per decoded element pair in packed_mm's decode: +4 instructions per weight word, +5.9% on sm_90a and
# +7% on sm_121a at the tuned config (one FADD per element would be +12% / +14%).
TRITON_BLOAT = ("    hi = (v >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)\n",
                "    hi = (v >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) + 0.0\n")


def test_the_budget_fails_a_prefill_loop_that_grew(toolchain, tmp_path):
    src = (build.SRC.parents[1] / "packed_mm.py").read_text()
    assert src.count(TRITON_BLOAT[0]) == 1, "packed_mm's decode changed: update TRITON_BLOAT to a line of its body"
    mutated = tmp_path / "packed_mm_bloated.py"
    mutated.write_text(src.replace("from .", "from kernels.").replace(*TRITON_BLOAT))
    budget = sass_budget.load()
    for arch in build.ARCHS:
        version, rows = _triton_rows(arch, mutated)
        problems = sass_budget.check({arch: rows}, budget, version, "triton")
        over = {line.split(" (")[0].split(" ", 1)[1] for line in problems if "> budget" in line}
        assert over == {r["variant"] for r in rows}, problems


def _dequant_ops(arch: str, module: Path | None = None) -> dict:
    return _triton_child("dequant", arch, module)


def _stores_are_16_bytes(out: dict) -> bool:
    """Every global store is 16 bytes wide and they write the program's whole bf16 tile (weight words per thread x 8
    codes x 2 bytes)."""
    stg = {op: n for op, n in out["ops"].items() if op.startswith("STG")}
    return set(stg) == {"STG.E.128"} and stg["STG.E.128"] * 16 == out["bytes_out"]


def test_the_dense_dequantize_kernel_builds_for_every_shipped_arch_with_16_byte_stores(toolchain):
    """The prefill's dense layers dequantize their packed bytes to bf16 on GB10 as on Hopper, so the kernel must
    compile for sm_121a, and it writes 4x the bytes it reads: memory-bound, so its stores must stay coalesced 16-byte
    ones (STG.E.128) and its word loads too (LDG.E.128)."""
    for arch in build.ARCHS:
        out = _dequant_ops(arch)
        assert _stores_are_16_bytes(out), f"sm_{arch}: {out}"
        assert out["ops"].get("LDG.E.128", 0) >= 1, f"sm_{arch}: the packed words are not read 16 bytes at a time: {out}"


def test_the_store_check_fails_a_dequantize_kernel_with_scattered_columns(toolchain, tmp_path):
    """Test of the test: columns written in a strided order (still every element once) compile to 2-byte stores."""
    src = (build.SRC.parents[1] / "packed_mm.py").read_text()
    line = "    cols = c * 64 + tl.arange(0, 64)\n"
    assert src.count(line) == 1, "the dequantize kernel changed: update this mutation to a line of its body"
    mutated = tmp_path / "packed_mm_scattered.py"
    mutated.write_text(src.replace("from .", "from kernels.").replace(line, "    cols = c * 64 + (tl.arange(0, 64) * 9) % 64\n"))
    out = _dequant_ops(build.ARCHS[-1], mutated)
    assert not _stores_are_16_bytes(out), out


SASS_DIFF_SRC = """
namespace {
template <int N> __global__ void scale(float* x, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = x[i] * N + (x[i] > 0.f ? 1.f : 2.f);
}
}  // namespace
extern "C" void launch(float* x, int n) { scale<2><<<1, 32>>>(x, n); scale<3><<<1, 32>>>(x, n); }
"""


def test_sass_diff_names_the_kernels_a_change_reaches_and_only_those(toolchain, tmp_path):
    """kernels.tools.sass_diff backs every 'the SASS is unchanged' claim of a source change. A copy under another file
    name with a kernel added ahead of the others in the cubin (which renumbers their branch labels; the file name
    changes the anonymous namespace's name) must read as that one kernel added, every other the same; a one-operator
    change to the template must read as both of its functions differing (the test of the test)."""
    from kernels.tools import sass_diff

    before = tmp_path / "before.cu"
    before.write_text(SASS_DIFF_SRC)
    moved = tmp_path / "moved_and_added.cu"
    # instantiated last, scale<4>'s section comes first in the cubin (nvcc 13.2) and takes the first branch labels
    last = "scale<3><<<1, 32>>>(x, n);"
    moved.write_text(SASS_DIFF_SRC.replace(last, last + " scale<4><<<1, 32>>>(x, n);"))
    changed = tmp_path / "changed.cu"
    changed.write_text(SASS_DIFF_SRC.replace("x[i] * N +", "x[i] * N -"))
    arch = build.ARCHS[-1]
    read = {p.name: sass_diff.functions(build.disassemble(build.compile_cubin(p, arch, toolchain), toolchain))
            for p in (before, moved, changed)}
    assert len(read["before.cu"]) == 2, read.keys()
    lines = sass_diff.compare(read["before.cu"], read["moved_and_added.cu"])
    assert len(lines) == 1 and lines[0].startswith("added") and "scaleILi4E" in lines[0], lines
    lines = sass_diff.compare(read["before.cu"], read["changed.cu"])
    assert len(lines) == 2 and all(ln.startswith("differs") for ln in lines), lines
    assert sass_diff.main([str(before), str(before), "--arch", arch]) == 0
    assert sass_diff.main([str(before), str(changed), "--arch", arch]) == 1
