"""How fast the portable tensor-core instruction runs on this GPU, against cuBLAS in the same process:
`python -m kernels.tools.mma_peak [--out F.json]`.

Why: our prefill kernels (and Marlin, vLLM's MXFP4 MoE on GB10) are built from `mma.sync` m16n8k16, the only
tensor-core MMA sm_121 has. On Hopper, stock's prefill runs on wgmma (cuBLAS, and `matmul_ogs` in vLLM's Triton MoE).
If `mma.sync` alone peaks well below what cuBLAS reaches on a Hopper stand-in, a prefill gate against stock measured
there judges the instruction set, not the kernel, and cannot say how the kernel does on GB10.

Method: `csrc/mma_peak.cu` runs independent bf16 -> fp32 MMA chains on register-resident fragments across every SM,
at several warps per SM and chain counts; the best is the peak. The sums of each setting's last launch are checked,
so a loop the compiler shortened fails instead of being timed. The fragments never leave registers, so the peak is an
issue-rate ceiling that no kernel feeding its operands from memory reaches. cuBLAS: `x @ W.T` bf16 at 8192^3 and at
the gpt-oss-120b qkv prefill shape (2048 x 2880 -> 5120). Device events after warm-up, median of `--reps` (`timing.time_calls`).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch

from ..cuda_ext import build_shared
from .timing import time_calls

SRC = Path(__file__).resolve().parents[1] / "csrc" / "mma_peak.cu"
FLOP_PER_MMA = 2 * 16 * 8 * 16
ITERS = 4096
# Each MMA adds 16 * 1.0 * 2**-10 to each of a lane's 4 accumulators per chain: exact in fp32 at ITERS.
PER_CHAIN = 4 * ITERS * 16 * 2.0 ** -10


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_shared(SRC)))
    lib.mma_peak_launch.restype = ctypes.c_int
    lib.mma_peak_launch.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p, ctypes.c_void_p]
    return lib


def mma_sync_tflops(reps: int) -> list[dict]:
    """TFLOPS of mma.sync bf16 at each (warps per SM, chains per warp), sums checked."""
    lib, sms = _lib(), torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for warps_per_sm in (4, 8, 16, 32):
        for ilp in (4, 8):
            blocks, threads = sms * max(1, warps_per_sm // 8), 32 * min(8, warps_per_sm)
            out = torch.empty(blocks * threads, device="cuda", dtype=torch.float32)

            def call(out=out, ilp=ilp, blocks=blocks, threads=threads):
                err = lib.mma_peak_launch(ilp, blocks, threads, ITERS, out.data_ptr(), torch.cuda.current_stream().cuda_stream)
                if err:
                    raise RuntimeError(f"mma_peak_launch: CUDA error {err}")

            us = time_calls([call], reps, 1)
            want = ilp * PER_CHAIN
            if not torch.all(out == want):
                raise RuntimeError(f"mma_peak: sums are not {want} at {warps_per_sm} warps/SM, {ilp} chains: the MMAs "
                                   "did not all run, so the time would be wrong")
            flops = blocks * threads / 32 * ilp * ITERS * FLOP_PER_MMA
            rows.append({"warps_per_sm": warps_per_sm, "chains": ilp, "us": us, "tflops": flops / us / 1e6})
            print(f"mma.sync bf16  {warps_per_sm:2d} warps/SM x {ilp} chains  {us:9.1f} us  {rows[-1]['tflops']:7.1f} TFLOPS",
                  flush=True)
    return rows


def cublas_tflops(reps: int) -> list[dict]:
    rows = []
    for name, (m, k, n) in {"8192^3": (8192, 8192, 8192), "qkv 2048 tokens": (2048, 2880, 5120)}.items():
        # x @ W.T with W [n, k], as a served linear layer (and bench_prefill) calls it. Full-scale random bf16: cuBLAS's
        # time depends on the data (power), so it is not the bench's number (weights x 0.02 there: qkv 81.0 us on an
        # H200, 96.6 here)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        us = time_calls([lambda a=a, w=w: torch.matmul(a, w.t())], reps, 4)
        rows.append({"shape": name, "us": us, "tflops": 2 * m * k * n / us / 1e6})
        print(f"cuBLAS bf16    {name:18s}  {us:9.1f} us  {rows[-1]['tflops']:7.1f} TFLOPS", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write the results as JSON")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mma_peak needs a CUDA GPU (it times the tensor cores); nothing measured", file=sys.stderr)
        return 2
    cc = "".join(map(str, torch.cuda.get_device_capability()))
    print(f"{torch.cuda.get_device_name()} (sm_{cc}), torch {torch.__version__}", flush=True)
    mma, cublas = mma_sync_tflops(a.reps), cublas_tflops(a.reps)
    peak = max(r["tflops"] for r in mma)
    for r in cublas:
        print(f"mma.sync peak / cuBLAS {r['shape']}: {peak / r['tflops']:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "sm": cc, "mma_sync": mma, "cublas": cublas,
                       "mma_sync_peak_tflops": peak}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
