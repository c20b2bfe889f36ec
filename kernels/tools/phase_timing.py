"""Where the time of one CUDA kernel call goes: `python -m kernels.tools.phase_timing [--out F.json] [--src X.cu]`.

Compiles csrc/mxfp4_mma.cu with MXFP4_PHASES defined (thread 0 of every CTA records globaltimer
at start and end, its SM, and clock64 at fixed events; the normal build has none of this code),
runs each case as the benchmark does (CUDA graph, rotating weight buffers > 3x L2), and reads
the records of the last call. Per case it prints:

* us/call of the graph replay, and of an empty launch (the floor a graph node costs here);
* span: first CTA start to last CTA end (globaltimer), and how late the last CTA started;
* per CTA, median over CTAs of the clock64 intervals between events, in ns:
  issue  = start -> x loads issued (and the weight prefetch, where x comes from xprep_kernel;
           dense M=1 issues its prefetch after the prep, gate_up after the route kernel)
  prep   = -> activation fragments in shared memory (prep_x, or the copy of xprep_kernel's output;
           down: -> gate_up's h visible)
  first  = -> the first chunk's MMA done (the first weights arrived)
  loop   = -> the first item's weight loop done
  epi    = -> the second item starts (epilogue of the first; only CTAs with >= 2 items)
  total  = start -> end.
Events are stamped by warp 0 only; other warps may be ahead or behind by their share of K.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from ..cases import LINEAR_SHAPES, MOE
from .bench import parse_moe_variants
from .timing import n_buffers, time_calls

EVENTS = ["start", "issue", "prep", "first", "loop", "second", "end"]
SLOTS = 16
MODES = {0: "dense", 1: "gate_up", 2: "down"}
XPREP = ["cta", "kernel"]  # gemv.packed.xprep: activation prepared per CTA, or once per call by its own kernel


def phase_source(src: str = "") -> str:
    """A copy of the kernel source with MXFP4_PHASES defined, next to the build cache."""
    from .. import cuda_ext

    base = Path(src) if src else cuda_ext.SRC
    out = Path(tempfile.gettempdir()) / f"phases_{base.stem}.cu"
    out.write_text("#define MXFP4_PHASES 1\n" + base.read_text())
    return str(out)


def summarize(rec: torch.Tensor, mode: int, grid: int) -> dict:
    """Records of one kernel (mode) -> medians per interval in ns, span and start skew."""
    r = rec.view(3, 2048, SLOTS)[mode, :grid].tolist()
    r = [row for row in r if row[0] and row[1]]
    if not r:
        return {"error": "no records (kernel did not run with the phase build?)"}
    t0 = min(row[0] for row in r)
    span = max(row[1] for row in r) - t0
    late = max(row[0] for row in r) - t0
    ghz = statistics.median((row[4 + 6] - row[4]) / max(1, row[1] - row[0]) for row in r)
    ghz = ghz if 0.5 < ghz < 3.0 else 1.98  # globaltimer too coarse for this kernel: H200 boost clock

    def med(a: int, b: int, need_items: int = 1) -> float | None:
        vals = [(row[4 + b] - row[4 + a]) / ghz for row in r if row[3] >= need_items and row[4 + b] and row[4 + a]]
        return round(statistics.median(vals), 1) if vals else None

    return {
        "ctas": len(r), "items_max": max(row[3] for row in r), "span_ns": span, "last_start_ns": late,
        "clock_ghz": round(ghz, 3), "sms": len({row[2] for row in r}),
        "issue": med(0, 1), "prep": med(1, 2), "first": med(2, 3), "loop": med(3, 4),
        "epi": med(4, 5, 2), "total": med(0, 6),
    }


def moe_timeline(rec: torch.Tensor) -> dict:
    """The gate_up -> down handoff of one MoE call, ns from the first gate_up CTA's start: when gate_up's CTAs end
    (median and last), when down's CTAs start (they launch early, programmatic dependent launch), when they see h
    (their wait for gate_up returns: event "prep"), and when the last one ends."""
    rr = rec.view(3, 2048, SLOTS)
    gu_rows = [row for row in rr[1].tolist() if row[0] and row[1]]
    dn_rows = [row for row in rr[2].tolist() if row[0] and row[1]]
    if not gu_rows or not dn_rows:
        return {"error": "no gate_up or down records (kernel did not run with the phase build?)"}
    t0 = min(row[0] for row in gu_rows)
    ghz = summarize(rec, 2, 2048)["clock_ghz"]

    def median(v: list) -> int:
        return round(statistics.median_high(v))

    h_seen = [row[0] + (row[4 + 2] - row[4]) / ghz - t0 for row in dn_rows if row[4 + 2]]
    return {"gate_up_end_median": median([row[1] - t0 for row in gu_rows]),
            "gate_up_end": max(row[1] for row in gu_rows) - t0,
            "down_start": min(row[0] for row in dn_rows) - t0,
            "down_start_median": median([row[0] - t0 for row in dn_rows]),
            "down_h_seen_first": round(min(h_seen)) if h_seen else None,
            "down_h_seen_median": median(h_seen) if h_seen else None,
            "down_end": max(row[1] for row in dn_rows) - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.tools.phase_timing", description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--src", default="", help="kernel source (default csrc/mxfp4_mma.cu)")
    ap.add_argument("--ms", default="1,8", help="token counts of the dense cases")
    ap.add_argument("--only-moe", action="store_true", help="skip the dense cases")
    ap.add_argument("--moe-variants", metavar="NAME=JSON;...", default="",
                    help="MoE configs to time besides tuning.yaml's (overrides of moe.packed, as in kernels.tools.bench)")
    args = ap.parse_args(argv)
    try:
        moe_variants = {"tuning": {}, **parse_moe_variants(args.moe_variants)}
    except ValueError as ex:
        ap.error(str(ex))
    if not torch.cuda.is_available():
        print("kernels.tools.phase_timing needs CUDA: torch.cuda.is_available() is False")
        return 2
    from .. import cuda_ext
    from ..gemv import mxfp4_gemv_packed
    from ..moe import mxfp4_moe_packed, pack_moe_experts
    from ..packed import pack_mxfp4
    from ..testing import generator, random_mxfp4
    from ..tuning import get_config

    src = phase_source(args.src)
    lib = cuda_ext._load(src)
    lib.mxfp4_set_phase_buffer.restype = ctypes.c_int
    lib.mxfp4_set_phase_buffer.argtypes = [ctypes.c_void_p]
    rec = torch.zeros(3 * 2048 * SLOTS, dtype=torch.int64, device="cuda")
    assert lib.mxfp4_set_phase_buffer(rec.data_ptr()) == 0
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    reps = 20
    results: dict = {"device": torch.cuda.get_device_name(0), "cases": []}

    # The floor: one empty CTA per call (top-k of zero rows), same graph timing.
    lt = torch.zeros(1, 128, device="cuda")
    ids = torch.empty(1, 4, dtype=torch.int32, device="cuda")
    wts = torch.empty(1, 4, device="cuda")
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    empty = lambda: lib.mxfp4_topk(lt.data_ptr(), 1, 128, ids.data_ptr(), wts.data_ptr(), 0, 128, 4, stream())  # noqa: E731
    results["empty_launch_us"] = round(time_calls([empty], reps, 64), 2)
    print(f"empty launch in a graph: {results['empty_launch_us']:.2f} us/call", flush=True)

    g = generator(5, "cuda")
    gcfg = {**get_config("gemv"), **get_config("gemv").get("packed", {}), "impl": "cuda", "cuda_src": src}
    for name in ("qkv", "o_proj", "expert_gate_up", "expert_down", "lm_head") if not args.only_moe else ():
        n, k = LINEAR_SHAPES[name]
        nq = n_buffers(n * k // 2 + n * k // 32, l2)
        packed = [pack_mxfp4(*random_mxfp4((n, k), g)) for _ in range(nq)]
        for m, xprep in [(int(v), xp) for v in (args.ms.split(",") if name != "lm_head" else ["1"]) for xp in XPREP]:
            x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
            outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(nq)]
            cfg = {**gcfg, "xprep": xprep}
            calls = [lambda i=i, cfg=cfg: mxfp4_gemv_packed(x, packed[i], out=outs[i], config=cfg) for i in range(nq)]
            rec.zero_()
            us = time_calls(calls, reps, max(nq, 40))
            torch.cuda.synchronize()
            v, items, grid = cuda_ext.gemv_tiling(m, packed[0], cfg, sms)
            res = {"case": f"{name} M={m} xprep={xprep}", "us_per_call": round(us, 2),
                   "variant": list(cuda_ext.VARIANTS[v]), "grid": grid,
                   "items": items, **summarize(rec.cpu(), 0, grid)}
            results["cases"].append(res)
            print(json.dumps(res), flush=True)
        del packed
        torch.cuda.empty_cache()

    e, tk, h, inter = MOE.experts, MOE.top_k, MOE.hidden, MOE.inter
    gu_p, gu_s = random_mxfp4((e, 2 * inter, h), g)
    d_p, d_s = random_mxfp4((e, h, inter), g)
    gu, dn = pack_moe_experts(gu_p, gu_s, d_p, d_s)
    del gu_p, gu_s, d_p, d_s
    gb = torch.randn(e, 2 * inter, generator=g, device="cuda") * 0.1
    db = torch.randn(e, h, generator=g, device="cuda") * 0.1
    x = torch.randn(1, h, generator=g, device="cuda").to(torch.bfloat16)
    routes = [torch.randperm(e, generator=g, device="cuda")[:tk].view(1, tk).to(torch.int32) for _ in range(16)]
    w4 = torch.softmax(torch.randn(1, tk, generator=g, device="cuda"), -1)
    out = torch.empty(1, h, dtype=torch.bfloat16, device="cuda")
    for vname, over in moe_variants.items():
        mcfg = {**get_config("moe").get("packed", {}), **over, "cuda_src": src}
        rec.zero_()
        us = time_calls([lambda r=r: mxfp4_moe_packed(x, r, w4, gu, gb, dn, db, out=out, config=mcfg) for r in routes],
                        reps, 32)
        torch.cuda.synchronize()
        r = rec.cpu()
        for mode in (1, 2):
            per_sm = mcfg.get("gate_up_ctas_per_sm", mcfg.get("ctas_per_sm", 2)) if mode == 1 else mcfg.get("ctas_per_sm", 2)
            grid = sms * int(per_sm)
            res = {"case": f"moe {vname} {MODES[mode]} M=1", "us_per_call_both": round(us, 2), "grid": grid,
                   **summarize(r, mode, grid)}
            results["cases"].append(res)
            print(json.dumps(res), flush=True)
        timeline = moe_timeline(r)
        results[f"moe_timeline_ns_{vname}"] = timeline
        print(f"moe {vname} timeline (ns from gate_up start):", timeline, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
