"""Build and call the CUDA tensor-core kernels of csrc/mxfp4_mma.cu (GPU only).

Why CUDA next to Triton: the M = 1..16 path wants the decoded weights handed to mma.sync straight
from registers, in the fragment order the packed layout already has. Triton (3.6/3.9) decides the
register layout of a tl.dot operand itself and routes a custom-decoded operand through shared
memory (measured: the dequant_dot / dot_scaled paths, NOTES.md); the CUDA kernel fixes the layout.
The portable Triton path on the same packed weights (gemv.py, `packed_fma`) stays the reference
the CPU interpreter checks.

Build: nvcc from CUDA_HOME / PATH compiles the .cu into a shared library for the device's arch (its `a`
target where there is one, as CI builds them: sm_90a, sm_121a; no torch headers, a few seconds per arch;
cached under $KERNELS_CACHE_DIR or ~/.cache/kernels_mxfp4 keyed by source hash, arch and nvcc version),
loaded with ctypes; launches go on torch's current stream, so CUDA graph capture works. `available()` says
why not when it cannot be used.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import torch

from ._checks import check_bias

SRC = Path(__file__).resolve().parent / "csrc" / "mxfp4_mma.cu"
# Same order as NT1/NT2 in the .cu: (NT, RW, RT, PF); KSPLIT = 8 // RW.
VARIANTS = [(nt, rw, rt, pf) for nt in (1, 2) for (rw, rt, pf) in
            ((8, 2, 4), (8, 2, 5), (4, 1, 4), (4, 1, 6), (2, 1, 4), (2, 1, 6), (1, 1, 6), (1, 1, 8))]
WARPS = 8
MODE_DENSE, MODE_GATEUP, MODE_DOWN = 0, 1, 2


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc") or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").exists() else None)


# Parts with an arch-specific `a` target. The build uses it there, as CI does (kernels/tools/build.py builds
# sm_90a and sm_121a): GB10's FP4 conversions (cvt.rn.f16x2.e2m1x2) exist only for sm_121a, and a source using
# something sm_121a lacks must fail here the way it fails in CI, not pass CI and then fail a plain sm_121 build.
A_TARGETS = {"90", "100", "103", "110", "120", "121"}


def arch_target(major: int, minor: int) -> str:
    """nvcc's -arch suffix for a device of compute capability major.minor: '90a', '121a', or plain '80'."""
    cc = f"{major}{minor}"
    return cc + "a" if cc in A_TARGETS else cc


def _arch() -> str:
    return arch_target(*torch.cuda.get_device_capability())


def source_variants(text: str) -> list[tuple[int, int, int, int]]:
    """The (NT, RW, RT, PF) table a kernel source compiles: the launch<MODE, NT, RW, RT, PF> entries of its
    NT1 / NT2 macros, in order."""
    return [tuple(int(v) for v in m.groups())
            for m in re.finditer(r"(?<!pf_)launch<MODE, (\d+), (\d+), (\d+), (\d+)>", text)]


# Prefill kernel table, same order as PF_TABLE in the .cu: (NT, RT, CTAS, FORM) = 8 * NT token rows per CTA, RT row
# tiles per warp, registers capped for CTAS CTAs per SM; FORM 0 f16 activation fragments (xprep_kernel) with the scale
# as an FFMA per MX block, FORM 1 bf16 activations as they are with the scale applied to the decoded bf16 weights,
# FORM 2 the same on Hopper's wgmma (mxfp4_wg_kernel: sm_90a only, GB10 has no wgmma).
PF_VARIANTS = [(8, 2, 1, 1), (8, 2, 2, 1), (8, 2, 1, 0), (8, 1, 2, 2), (16, 1, 2, 2), (16, 2, 1, 2)]
FORM_F16, FORM_BF16, FORM_WG = 0, 1, 2
WG_CAPABILITY = (9, 0)  # wgmma: sm_90a (H100 / H200); the kernel refuses other devices


def reads_bf16_rows(variant: int) -> bool:
    """The prefill variant reads bf16 activation rows as they are (FORM_BF16, FORM_WG), not xprep's f16 fragments."""
    return PF_VARIANTS[variant][3] != FORM_F16


def variant_problem(variant: int) -> str:
    """Why this device cannot run the prefill variant, or "" when it can."""
    if PF_VARIANTS[variant][3] == FORM_WG and torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        if cap != WG_CAPABILITY:
            return (f"prefill variant {variant} uses wgmma, which only sm_90 (H100 / H200) has; this device is "
                    f"sm_{cap[0]}{cap[1]}")
    return ""
# FORM_BF16 multiplies by 2**(b - 1) in bf16 (E8M0 byte b): exact up to b = 128 (weights up to 12 * 2**1); a weight
# with a larger scale byte is served by FORM_F16 (PackedMXFP4.max_scale).
BF16_MAX_SCALE = 128
# the largest M (tokens) the decode kernels take: their NT variants hold up to 16 token rows per tile (VARIANTS)
CUDA_MAX_M = 16


def source_pf_variants(text: str) -> list[tuple[int, ...]]:
    """The (NT, RT, CTAS, FORM) table of a kernel source's PF_TABLE macro, in order (any number of template
    arguments is read, so an older source's table is refused as a mismatch instead of read as none)."""
    return [tuple(int(v) for v in re.findall(r"\d+", m.group(1)))
            for m in re.finditer(r"pf_launch<MODE((?:, \d+)+)(?:, LIVE)?>", text)]


def build_shared(src_path: Path, src_bytes: bytes | None = None) -> Path:
    """A shared library of one CUDA source for this device's arch, built by nvcc once and cached by source hash, arch
    and nvcc version under $KERNELS_CACHE_DIR (or ~/.cache/kernels_mxfp4). RuntimeError says why it cannot be."""
    if os.environ.get("KERNELS_DISABLE_CUDA_EXT"):
        raise RuntimeError("disabled by KERNELS_DISABLE_CUDA_EXT")
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    nvcc = _nvcc()
    if not nvcc:
        raise RuntimeError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    src_bytes = src_path.read_bytes() if src_bytes is None else src_bytes
    arch = _arch()
    ver = _nvcc_run([nvcc, "--version"], 60, "nvcc --version").stdout
    key = hashlib.sha256(src_bytes + arch.encode() + ver.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("KERNELS_CACHE_DIR", Path.home() / ".cache" / "kernels_mxfp4"))
    cache.mkdir(parents=True, exist_ok=True)
    so = cache / f"{src_path.stem}_sm{arch}_{key}.so"
    if not so.exists():
        tmp = so.with_suffix(f".{os.getpid()}.tmp")
        cmd = [nvcc, "-O3", f"-arch=sm_{arch}", "-shared", "-Xcompiler", "-fPIC", "-lineinfo",
               "-diag-suppress", "177", "-o", str(tmp), str(src_path)]
        r = _nvcc_run(cmd, BUILD_TIMEOUT_S, f"building {src_path.name} for sm_{arch}")
        if r.returncode:
            # one line (a vLLM server's log shows the last error line as the boot's cause, and nvcc's own lines read
            # as that cause otherwise); every line of nvcc's output in a file beside the cache
            log = so.with_suffix(".nvcc-errors.txt")
            log.write_text(" ".join(cmd) + "\n" + r.stdout + r.stderr)
            errors = [ln.strip() for ln in r.stderr.splitlines() if "error" in ln] or r.stderr.strip().splitlines() or [""]
            raise RuntimeError(f"nvcc exited {r.returncode} building {src_path.name} for sm_{arch}: {errors[0][:200]} "
                               f"(all of its output: {log})")
        os.replace(tmp, so)
    return so


# a cold build of mxfp4_mma.cu takes about a minute; a hung nvcc (a licence server, a full disk) must not hang a boot
BUILD_TIMEOUT_S = 900


def _nvcc_run(cmd: list[str], timeout_s: float, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} did not finish in {timeout_s:.0f} s ({cmd[0]}): check that nvcc runs on this "
                           f"machine") from None


def check_source_tables(src_path: Path, text: str) -> None:
    """RuntimeError unless the source compiles the variant tables this host code sizes its launches for."""
    # The host sizes items, K split and shared memory from VARIANTS[v]; a source whose table differs (an
    # older version) would run another tiling than the one sized for, and an A/B against it would time
    # a wrong computation without a word.
    table = source_variants(text)
    if table != VARIANTS:
        raise RuntimeError(f"{src_path}: its variant table {table} is not cuda_ext.VARIANTS {VARIANTS}; "
                           "compare against a source with the same table (edit its NT1/NT2 macros to match)")
    pf_table = source_pf_variants(text)
    if pf_table and pf_table != PF_VARIANTS:  # no table: a source older than the prefill kernel (prefill_available)
        raise RuntimeError(f"{src_path}: its prefill table {pf_table} is not cuda_ext.PF_VARIANTS {PF_VARIANTS}; "
                           "edit its PF_TABLE macro to match")


@functools.lru_cache(maxsize=None)
def _load(src: str = "") -> ctypes.CDLL:
    """The compiled library of `src` (default: csrc/mxfp4_mma.cu). Another source with the same C API
    (e.g. the previous version, `bench --cuda-src-before`) can be loaded beside it for a same-run A/B."""
    src_path = Path(src) if src else SRC
    src_bytes = src_path.read_bytes()  # read once: the table checked is the one hashed into the cache key
    check_source_tables(src_path, src_bytes.decode())
    lib = ctypes.CDLL(str(build_shared(src_path, src_bytes)))
    P, I, LL, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
    lib.mxfp4_launch.restype = I
    lib.mxfp4_launch.argtypes = [I, I, P, LL, P, P, LL, LL, P, I, LL, P, LL, P, I, I, P, P,
                                 I, I, I, I, I, I, I, F, F, I, LL, P, I]
    if hasattr(lib, "mxfp4_launch2"):  # absent from sources older than the once-per-call activation prep
        lib.mxfp4_launch2.restype = I
        lib.mxfp4_launch2.argtypes = lib.mxfp4_launch.argtypes + [P, P]
        lib.mxfp4_xprep.restype = I
        lib.mxfp4_xprep.argtypes = [P, LL, I, I, I, P, P, P]
    if hasattr(lib, "mxfp4_prefill"):  # absent from sources older than the CUDA prefill (A/B runs load those)
        lib.mxfp4_prefill.restype = I
        lib.mxfp4_prefill.argtypes = [I, I, P, P, F, P, P, I, I, I, P, P, LL, LL, P, I, LL, P, LL, I, P, I, I, I, F, F,
                                      P, LL, I]
    if hasattr(lib, "mxfp4_prefill2"):  # absent from sources older than the MoE down kernel's f16 rows
        lib.mxfp4_prefill2.restype = I
        lib.mxfp4_prefill2.argtypes = lib.mxfp4_prefill.argtypes + [I]
        lib.mxfp4_combine_f16.restype = I
        lib.mxfp4_combine_f16.argtypes = [P, P, I, I, I, I, P, LL, P]
    if hasattr(lib, "mxfp4_prefill3"):  # absent from sources older than the live-row kernels
        lib.mxfp4_prefill3.restype = I
        lib.mxfp4_prefill3.argtypes = lib.mxfp4_prefill2.argtypes + [I]
    if hasattr(lib, "mxfp4_combine"):  # absent from sources older than the one-pass MoE combine
        lib.mxfp4_combine.restype = I
        lib.mxfp4_combine.argtypes = [P, P, I, I, I, I, P, LL, P]
    if hasattr(lib, "mxfp4_align"):  # absent from sources older than the one-launch MoE sort
        lib.mxfp4_align.restype = I
        lib.mxfp4_align.argtypes = [P, I, I, I, I, P, P, P]
    lib.mxfp4_route.restype = I
    lib.mxfp4_route.argtypes = [P, LL, P, I, P, I, P, P, P, P, I, I, I, I, P]
    if hasattr(lib, "mxfp4_topk"):  # absent from sources older than the plugin's top-k (A/B runs load those)
        lib.mxfp4_topk.restype = I
        lib.mxfp4_topk.argtypes = [P, I, LL, P, P, I, I, I, P]
    lib.mxfp4_error_string.restype = ctypes.c_char_p
    lib.mxfp4_error_string.argtypes = [I]
    lib.mxfp4_max_smem_optin.restype = I
    lib.mxfp4_max_smem_optin.argtypes = [I]
    return lib


def available() -> tuple[bool, str]:
    try:
        _load()
        return True, ""
    except Exception as e:  # noqa: BLE001 - the reason is the answer
        return False, f"{type(e).__name__}: {e}"


def _check(err: int, what: str) -> None:
    if err:
        raise RuntimeError(f"{what}: CUDA error {err} ({_load().mxfp4_error_string(err).decode()})")


@functools.lru_cache(maxsize=None)
def _sms(dev: int) -> int:
    return torch.cuda.get_device_properties(dev).multi_processor_count


def _param_kind(t: torch.Tensor | None) -> tuple[int, torch.Tensor | None]:
    if t is None:
        return 0, None
    if t.dtype == torch.float32:
        return 1, t.contiguous()
    if t.dtype == torch.bfloat16:
        return 2, t.contiguous()
    return 1, t.to(torch.float32).contiguous()


def pick_variant(m: int, n_tiles: int, kc: int, cfg: dict, sms: int, moe: bool = False) -> int:
    """Variant index: NT by M; K split across the CTA's warps when there are too few row tiles to
    give every SM several (the small layers), with the fewest row tiles per CTA that still fit the
    grid in one wave; PF dividing the chunk count when possible."""
    nt = 1 if m <= 8 else 2
    if "variant" in cfg:
        return int(cfg["variant"]) + (8 if nt == 2 and int(cfg["variant"]) < 8 else 0)
    big = n_tiles >= int(cfg.get("big_tiles_per_sm", 16)) * sms
    if big:
        rw, rt, pf = (8, 2, 5) if kc % 5 == 0 else (8, 2, 4)
    elif n_tiles <= sms * int(cfg.get("ctas_per_sm", 2)):
        # one tile per CTA, 8 warps split K (o_proj / expert down on an H200: 180 tiles, 264 CTAs)
        rw, rt = 1, 1
        pf = 8 if -(-kc // 8) >= 8 else 6
    else:
        # two tiles per CTA, 4 warps each: one wave instead of two (qkv: 320 tiles; H200 sweep at
        # M=1: 8.0 us vs 8.5 for one tile per CTA; the expert gate_up shape 8.1 vs 9.2)
        rw, rt, pf = (2, 1, 4) if -(-n_tiles // 2) <= sms * int(cfg.get("ctas_per_sm", 2)) else (4, 1, 6)
    return VARIANTS.index((nt, rw, rt, pf))


def _resident_ctas(per_sm: int, smem: int, device: torch.device) -> int:
    """CTAs per SM for a persistent grid: the configured count, or fewer where that many CTAs' shared memory
    does not fit on an SM (MoE gate_up at M = 16 holds 96 KB of activation rows per CTA: 3 of them do not
    fit an H200's 228 KB, and the CTAs beyond the resident ones would run as a second wave; sm_12x parts
    have ~100 KB per SM, so the dense GEMV's M = 16 rows fit one CTA per SM there). 1 KB per CTA is
    reserved by the hardware."""
    per_sm_smem = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
    return max(1, min(per_sm, per_sm_smem // (smem + 1024)))


def _smem(m_rows: int, kc: int, rt: int, nt: int) -> int:
    # activation fragment rows, 16 spare words, xdown[16], 8 spare words, amax[16], the K-split reduction buffer
    return m_rows * kc * 128 + 56 * 4 + WARPS * rt * nt * 4 * 32 * 4


_pdl_ok: dict[int, bool] = {}  # device -> programmatic dependent launch works (learned from a failed launch)


@functools.lru_cache(maxsize=None)
def _major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def _pdl_works(device: torch.device) -> bool:
    """Programmatic dependent launch: sm_90 and later, unless a launch with it failed on this device. Asked on every
    launch, eager ones included: the capability is read once per device."""
    index = device.index or 0
    return _major(index) >= 9 and _pdl_ok.get(index) is not False


def _launch_pdl(launch, pdl: int, device: torch.device) -> tuple[int, int]:
    """launch(pdl) -> CUDA error code. Where programmatic dependent launch is refused, launch once more
    without it (plain launches after that on this device). Returns (error, the pdl flag used)."""
    err = launch(pdl)
    if err and pdl:
        _pdl_ok[device.index or 0] = False
        return launch(0), 0
    return err, pdl


def gemv_tiling(m: int, p, cfg: dict, sms: int) -> tuple[int, int, int]:
    """(variant, work items, grid) of the tensor-core GEMV for M tokens on packed weights `p`."""
    v = pick_variant(m, p.n_tiles, p.k_chunks, cfg, sms)
    nt, rw, rt, _ = VARIANTS[v]
    items = -(-p.n_tiles // (rw * rt))
    per_sm = _resident_ctas(int(cfg.get("ctas_per_sm", 2)), _smem(m, p.k_chunks, rt, nt), p.words.device)
    return v, items, max(1, min(items, sms * per_sm))


@dataclass(frozen=True)
class GemvPlan:
    """What one M's launch of the dense GEMV needs besides its pointers: resolved once per (weight, M) by a caller
    that runs the same weight many times (kernels.gemv.PackedLinear), per call otherwise."""
    lib: ctypes.CDLL
    m: int
    tiling: tuple[int, int, int]  # the weight's (n, n_tiles, k_chunks): grid and shared memory were sized for them
    variant: int
    grid: int
    smem: int
    ksplit: int
    xprep: str  # "kernel": a prep launch then the GEMV (programmatic dependent launch); "cta": one launch


def gemv_plan(m: int, p, cfg: dict) -> GemvPlan:
    xprep = cfg.get("xprep", "auto")
    if xprep not in ("auto", "kernel", "cta"):
        raise ValueError(f"gemv.packed.xprep must be auto, kernel or cta (kernels/tuning.yaml), got {xprep!r}")
    if m > CUDA_MAX_M:
        raise ValueError(f"the tensor-core GEMV serves M <= {CUDA_MAX_M}, got {m}")
    lib = _load(cfg.get("cuda_src", ""))
    v, _, grid = gemv_tiling(m, p, cfg, _sms(p.words.device.index or 0))
    nt, rw, rt, pf = VARIANTS[v]
    if xprep == "auto":  # H200 bench, same run: the prep kernel wins from M = 2 (qkv M=8 9.4 vs 14.0 us), loses
        xprep = "kernel" if m >= 2 else "cta"  # ~0.5 us at M = 1, where x fits in registers (one load per thread)
    if xprep == "kernel" and not hasattr(lib, "mxfp4_launch2"):
        xprep = "cta"  # a source older than the once-per-call activation prep (A/B runs load those)
    return GemvPlan(lib, m, (p.n, p.n_tiles, p.k_chunks), v, grid, _smem(m, p.k_chunks, rt, nt), WARPS // rw, xprep)


def gemv(x: torch.Tensor, p, bias: torch.Tensor | None, out: torch.Tensor, cfg: dict,
         plan: GemvPlan | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) on tensor cores. x [M, K] bf16 contiguous, M <= 16; p PackedMXFP4 (2-D)."""
    m, k = x.shape
    if bias is not None:
        check_bias(bias, (p.n,), "the layer's")  # the kernel reads bias[n] for every row n < N
    if plan is None:
        plan = gemv_plan(m, p, cfg)
    elif (plan.m, plan.tiling) != (m, (p.n, p.n_tiles, p.k_chunks)):
        raise ValueError(f"a launch plan for M={plan.m} and weight tiling {plan.tiling} used for M={m} and "
                         f"{(p.n, p.n_tiles, p.k_chunks)}")
    lib = plan.lib
    bk, b = _param_kind(bias)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    args = (MODE_DENSE, plan.variant, x.data_ptr(), x.stride(0), p.words.data_ptr(), p.scales.data_ptr(), 0, 0,
            b.data_ptr() if b is not None else None, bk, 0, out.data_ptr(), out.stride(0), None, 0, 0,
            None, None, m, p.n, k, p.n_tiles, p.k_chunks, 1, plan.ksplit, 0.0, 0.0, plan.grid, plan.smem, stream)
    if plan.xprep == "kernel":
        # The activation's fragments prepared once (xprep_kernel), not in each of the persistent CTAs;
        # the GEMV starts early (programmatic dependent launch), waits for them and copies them before
        # issuing its weight prefetch.
        frag, xdown = _xprep(lib, x, p.k_chunks, stream)
        err, _ = _launch_pdl(lambda pdl: lib.mxfp4_launch2(*args, pdl, frag.data_ptr(), xdown.data_ptr()),
                             int(_pdl_works(x.device)), x.device)
    else:
        err = lib.mxfp4_launch(*args, 0)
    _check(err, "mxfp4 gemv launch")
    return out


_scratch: dict[tuple, torch.Tensor] = {}


def _cached_zeros(key: tuple, shape, dtype, device) -> torch.Tensor:
    t = _scratch.get(key)
    if t is None:
        t = torch.zeros(shape, dtype=dtype, device=device)
        _scratch[key] = t
    return t


TOPK_MAX_EXPERTS = 256  # csrc/mxfp4_mma.cu TOPK_PL keys per lane x 32 lanes
TOPK_MAX_K = 8


def topk_supported(n_experts: int, top_k: int) -> bool:
    return 1 <= top_k <= min(TOPK_MAX_K, n_experts) and n_experts <= TOPK_MAX_EXPERTS


def _check_topk(n_experts: int, top_k: int) -> None:
    if not topk_supported(n_experts, top_k):
        raise ValueError(f"the CUDA top-k takes 1 <= top_k <= min({TOPK_MAX_K}, experts) and experts <= "
                         f"{TOPK_MAX_EXPERTS}, got top_k={top_k} of {n_experts}; route with torch.topk instead")


def route(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None, top_k: int, src: str = ""):
    """Router GEMV (weights in their stored dtype) + top-k + softmax in one launch -> (ids int32 [M, k],
    weights float32 [M, k])."""
    lib = _load(src)
    m, h = x.shape
    e = router_w.shape[0]
    _check_topk(e, top_k)
    wk, w = _param_kind(router_w)
    bk, b = _param_kind(router_b)
    dev = x.device
    logits = _cached_zeros(("logits", dev, m, e), (m, e), torch.float32, dev)
    counter = _cached_zeros(("counter", dev), (1,), torch.int32, dev)
    ids = torch.empty((m, top_k), dtype=torch.int32, device=dev)
    wts = torch.empty((m, top_k), dtype=torch.float32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    err = lib.mxfp4_route(x.data_ptr(), x.stride(0), w.data_ptr(), wk, b.data_ptr() if b is not None else None, bk,
                          logits.data_ptr(), counter.data_ptr(), ids.data_ptr(), wts.data_ptr(), m, e, h, top_k, stream)
    _check(err, "mxfp4 route launch")
    return ids, wts


def topk_from_logits(logits: torch.Tensor, top_k: int, src: str = ""):
    """Top-k + softmax over the k of router logits another GEMM produced (fp32 or bf16 [M, E]), one
    launch -> (ids int32 [M, k], weights float32 [M, k])."""
    lib = _load(src)
    if logits.dtype not in (torch.float32, torch.bfloat16) or logits.stride(-1) != 1:
        logits = logits.float().contiguous()
    m, e = logits.shape
    _check_topk(e, top_k)
    ids = torch.empty((m, top_k), dtype=torch.int32, device=logits.device)
    wts = torch.empty((m, top_k), dtype=torch.float32, device=logits.device)
    stream = torch.cuda.current_stream(logits.device).cuda_stream
    err = lib.mxfp4_topk(logits.data_ptr(), 1 if logits.dtype == torch.float32 else 2, logits.stride(0), ids.data_ptr(),
                         wts.data_ptr(), m, e, top_k, stream)
    _check(err, "mxfp4 top-k launch")
    return ids, wts


def moe(x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, gu, gu_bias, dn, dn_bias, out: torch.Tensor,
        cfg: dict, alpha: float, limit: float) -> torch.Tensor:
    """Experts of the MoE block: gate_up + SwiGLU (one launch), down + weighted combine (one launch).
    gu / dn: PackedMXFP4 stacked over experts (gu packed with paired=True). ids int32 [M, k]."""
    lib = _load(cfg.get("cuda_src", ""))
    m, hdim = x.shape
    top_k = ids.shape[1]
    slots = m * top_k
    dev = x.device
    sms = _sms(dev.index or 0)
    stream = torch.cuda.current_stream(dev).cuda_stream
    inter = gu.n // 2
    kc_h = dn.k_chunks
    hfrag = _cached_zeros(("hfrag", dev, slots, kc_h), (slots + 1, kc_h, 32), torch.int32, dev)
    pdl = int(cfg.get("pdl", 1)) if _pdl_works(dev) else 0
    gbk, gb = _param_kind(gu_bias)
    dbk, db = _param_kind(dn_bias)
    # gate_up: items = slots x row-tile groups, K split per cfg
    v1 = int(cfg.get("gate_up_variant", 5))
    nt, rw, rt, pf = VARIANTS[v1]
    items1 = slots * -(-gu.n_tiles // (rw * rt))
    smem1 = _smem(m, gu.k_chunks, rt, nt)
    per_sm1 = _resident_ctas(int(cfg.get("gate_up_ctas_per_sm", cfg.get("ctas_per_sm", 2))), smem1, dev)
    grid1 = max(1, min(items1, sms * per_sm1))
    wst_e = gu.words[0].numel() // 4 if gu.words.dim() == 5 else 0
    sst_e = gu.scales[0].numel() // 4 if gu.scales.dim() == 5 else 0
    ids32 = ids.to(torch.int32).contiguous()
    wts32 = wts.to(torch.float32).contiguous()

    def launch_gu(p):
        return lib.mxfp4_launch(MODE_GATEUP, v1, x.data_ptr(), x.stride(0), gu.words.data_ptr(), gu.scales.data_ptr(),
                                wst_e, sst_e, gb.data_ptr() if gb is not None else None, gbk,
                                gb.stride(0) if gb is not None else 0, None, 0, hfrag.data_ptr(), kc_h, slots,
                                ids32.data_ptr(), wts32.data_ptr(), m, gu.n, hdim, gu.n_tiles, gu.k_chunks, top_k,
                                WARPS // rw, alpha, limit, grid1, smem1, stream, p)

    err, pdl = _launch_pdl(launch_gu, pdl, dev)  # down follows gate_up's choice
    _check(err, "mxfp4 moe gate_up launch")
    v2 = int(cfg.get("down_variant", 7))
    nt, rw, rt, pf = VARIANTS[v2]
    if rw != 1 or nt != 1:
        raise ValueError(f"down_variant {v2} must be an RW=1, NT=1 variant (6 or 7)")
    if top_k > WARPS:
        raise ValueError(f"the CUDA MoE down kernel handles top_k <= {WARPS}, got {top_k}")
    ksp = WARPS // top_k
    items2 = m * -(-dn.n_tiles // rt)
    smem2 = _smem(top_k, dn.k_chunks, rt, nt)  # the token's h slots are staged in shared memory
    grid2 = max(1, min(items2, sms * _resident_ctas(int(cfg.get("ctas_per_sm", 2)), smem2, dev)))
    wst2 = dn.words[0].numel() // 4
    sst2 = dn.scales[0].numel() // 4
    err = lib.mxfp4_launch(MODE_DOWN, v2, None, 0, dn.words.data_ptr(), dn.scales.data_ptr(), wst2, sst2,
                           db.data_ptr() if db is not None else None, dbk, db.stride(0) if db is not None else 0,
                           out.data_ptr(), out.stride(0), hfrag.data_ptr(), kc_h, slots, ids32.data_ptr(),
                           wts32.data_ptr(), m, dn.n, inter, dn.n_tiles, dn.k_chunks, top_k, ksp, alpha, limit,
                           grid2, smem2, stream, pdl)
    _check(err, "mxfp4 moe down launch")
    return out


def prefill_available() -> tuple[bool, str]:
    """Asked on every large-M packed_mm call (eager ones too: the lm_head above 16 sequences); `_load` is cached and
    has checked the source's prefill table."""
    ok, why = available()
    if ok and not hasattr(_load(), "mxfp4_prefill"):
        return False, "the compiled source has no mxfp4_prefill"
    return ok, why


def _xprep(lib: ctypes.CDLL, x: torch.Tensor, kc: int, stream) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] bf16, unit stride along K -> (fragments int32 [M, kc * 32], 2**L float32 [M]) by xprep_kernel."""
    m, k = x.shape
    frag = torch.empty((m, kc * 32), dtype=torch.int32, device=x.device)
    xdown = torch.empty(m, dtype=torch.float32, device=x.device)
    _check(lib.mxfp4_xprep(x.data_ptr(), x.stride(0), m, k, kc, frag.data_ptr(), xdown.data_ptr(), stream),
           "mxfp4 activation prep launch")
    return frag, xdown


def activation_frags(x: torch.Tensor, kc: int, src: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any M) -> (fragments int32 [M, kc * 32], 2**L float32 [M]): packed.prepare_activation's form,
    one CTA per row (xprep_kernel)."""
    x = x.to(torch.bfloat16)
    if x.stride(-1) != 1:
        x = x.contiguous()
    return _xprep(_load(src), x, kc, torch.cuda.current_stream(x.device).cuda_stream)


def prefill_launch(mode: int, variant: int, frag: torch.Tensor, xdown: torch.Tensor | None, xmul: float, p,
                   bias: torch.Tensor | None, out: torch.Tensor, *, n_rows: int, n_blocks: int,
                   rows: torch.Tensor | None = None, bexp: torch.Tensor | None = None, x_div: int = 1,
                   kc_h: int = 0, wts: torch.Tensor | None = None, alpha: float = 0.0, limit: float = 0.0,
                   src: str = "", live: bool = False) -> None:
    """One launch of the prefill kernel (mxfp4_prefill): dense (rows None) or one MoE half over align_by_expert's
    blocks. FORM_F16 variants: `frag` the f16 fragments of `activation_frags`; `out` dense bf16 [M, N], gate_up int32
    h fragments [S, kc_h * 32], down float32 [S, N], or float16 [S, N] holding value * 2**-DOWN_F16_SHIFT
    (`down_f16_supported`). FORM_BF16 variants: `frag` bf16 rows [rows, K] (unit stride along K, rows 16-byte
    aligned), gate_up's `out` bf16 h rows [S, N / 2]. `live`: a MoE half that stages its blocks' padding rows as
    zeros (the *_live_kernel entries; `live_rows_supported`), same output."""
    lib = _load(src)
    if live and (mode == MODE_DENSE or not live_rows_supported(src)):
        raise ValueError("live-row staging serves the MoE halves of a source with mxfp4_prefill3 (live_rows_supported)")
    f16_rows = mode == MODE_DOWN and out.dtype == torch.float16
    if f16_rows and not down_f16_supported(p.n, src):
        raise ValueError(f"f16 down rows need an even N and a source with mxfp4_prefill2 (N={p.n}); pass float32 rows")
    bf16 = reads_bf16_rows(variant)
    if bf16 and (frag.dtype != torch.bfloat16 or frag.stride(-1) != 1 or frag.stride(0) % 8 or frag.data_ptr() % 16):
        raise ValueError("the bf16 prefill form reads bf16 rows with unit stride along K, 16-byte aligned")
    if bf16 and frag.shape[1] != p.k:
        raise ValueError(f"bf16 activation rows of {frag.shape[1]} columns for weights of K={p.k}")
    stacked = p.words.dim() == 5
    bk, b = _param_kind(bias)
    stream = torch.cuda.current_stream(frag.device).cuda_stream
    args = (
        mode, variant, frag.data_ptr(), xdown.data_ptr() if xdown is not None else None, float(xmul),
        rows.data_ptr() if rows is not None else None, bexp.data_ptr() if bexp is not None else None, x_div, n_rows,
        n_blocks, p.words.data_ptr(), p.scales.data_ptr(), p.words[0].numel() // 4 if stacked else 0,
        p.scales[0].numel() // 4 if stacked else 0, b.data_ptr() if b is not None else None, bk,
        b.stride(0) if (b is not None and b.dim() == 2) else 0, out.data_ptr(), out.stride(0), kc_h,
        wts.data_ptr() if wts is not None else None, p.n, p.n_tiles, p.k_chunks, float(alpha), float(limit), stream,
        frag.stride(0) if bf16 else 0, frag.shape[1] if bf16 else 0)
    if live:
        err = lib.mxfp4_prefill3(*args, int(f16_rows), 1)
    else:
        err = lib.mxfp4_prefill2(*args, 1) if f16_rows else lib.mxfp4_prefill(*args)
    _check(err, "mxfp4 prefill launch")


def live_rows_supported(src: str = "") -> bool:
    """The source has the MoE kernels that stage a block's padding rows as zeros (mxfp4_prefill3's `live`)."""
    return hasattr(_load(src), "mxfp4_prefill3")


DOWN_F16_SHIFT = 4  # the .cu's: f16 down rows hold value * 2**-4


def down_f16_supported(n: int, src: str = "") -> bool:
    """The MoE down kernel can write f16 rows of N columns (and `combine` sum them): the source has it, N even."""
    return n % 2 == 0 and hasattr(_load(src), "mxfp4_prefill2")


def combine_supported(out: torch.Tensor, hdim: int, src: str = "") -> bool:
    """`combine` can write `out` (2-D bf16, unit stride along H, 8-byte aligned rows) and the source has it."""
    return (hasattr(_load(src), "mxfp4_combine") and out.dim() == 2 and out.dtype == torch.bfloat16
            and out.stride(1) == 1 and out.stride(0) % 4 == 0 and out.data_ptr() % 8 == 0 and hdim % 4 == 0)


def combine(y: torch.Tensor, ids: torch.Tensor, num_experts: int, out: torch.Tensor, src: str = "") -> torch.Tensor:
    """out [M, H] bf16 = the sum of y's k rows per token (y [M * k, H] fp32, or f16 holding value * 2**-DOWN_F16_SHIFT:
    the down kernel's rows with their routing weights), in slot order, in fp32, leaving out slots whose id is outside
    [0, num_experts) (the sort leaves them out, so their rows are never written and y need not be zeroed). One launch
    (combine_kernel)."""
    if ids.dim() != 2:
        raise ValueError(f"combine: ids must be [M, k], got {tuple(ids.shape)}")
    m, top_k = ids.shape
    h = out.shape[-1]
    if out.shape != (m, h) or not combine_supported(out, h, src):
        raise ValueError(f"combine: out {tuple(out.shape)} {out.dtype} must be bf16 [{m}, H] with unit stride along H, "
                         "8-byte aligned rows and H % 4 == 0 (combine_supported)")
    f16 = y.dtype == torch.float16
    if f16 and not down_f16_supported(h, src):
        raise ValueError("combine: f16 rows need a source with mxfp4_combine_f16; pass fp32 rows")
    if (y.shape != (m * top_k, h) or y.dtype not in (torch.float32, torch.float16) or not y.is_contiguous()
            or y.data_ptr() % 16 or not (y.device == ids.device == out.device)):
        raise ValueError(f"combine: y {tuple(y.shape)} {y.dtype} must be contiguous 16-byte aligned fp32 or f16 "
                         f"[{m * top_k}, {h}] on the device of ids and out")
    ids = ids.to(torch.int32).contiguous()  # the same tensor when it already is
    stream = torch.cuda.current_stream(y.device).cuda_stream
    lib = _load(src)
    fn = lib.mxfp4_combine_f16 if f16 else lib.mxfp4_combine
    _check(fn(y.data_ptr(), ids.data_ptr(), m, top_k, num_experts, h, out.data_ptr(), out.stride(0), stream),
           "mxfp4 combine launch")
    return out


ALIGN_MAX_EXPERTS = 256  # align_kernel's shared-memory tables (ALIGN_MAX_E in the .cu)


def align_supported(num_experts: int, src: str = "") -> bool:
    """`align_by_expert` below can sort for this many experts, and the source has it."""
    return num_experts <= ALIGN_MAX_EXPERTS and hasattr(_load(src), "mxfp4_align")


def align_by_expert(ids: torch.Tensor, num_experts: int, bm: int, src: str = "") -> tuple[torch.Tensor, torch.Tensor, int]:
    """packed_mm.align_by_expert in one launch (align_kernel), the same result bit for bit: rows int32
    [n_blocks * bm] (slot, or S for padding), block experts int32 [n_blocks] (-1 past the last), n_blocks =
    ceil(S / bm) + E (a bound that depends on M only: CUDA graphs capture it). No host sync."""
    flat = ids.reshape(-1).to(torch.int32).contiguous()  # the same tensor when it already is
    s = flat.numel()
    n_blocks = -(-s // bm) + num_experts
    rows = torch.empty(n_blocks * bm, dtype=torch.int32, device=flat.device)
    bexp = torch.empty(n_blocks, dtype=torch.int32, device=flat.device)
    stream = torch.cuda.current_stream(flat.device).cuda_stream
    _check(_load(src).mxfp4_align(flat.data_ptr(), s, num_experts, bm, n_blocks, rows.data_ptr(), bexp.data_ptr(),
                                  stream), "mxfp4 align launch")
    return rows, bexp, n_blocks
