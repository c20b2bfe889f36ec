"""Nsight Compute counters for the decode kernels: `python -m kernels.tools.ncu_profile [--out DIR]` (--small: stall
reasons of the M=1 kernels; --prefill: of the prefill kernels at 2048 tokens).

Runs ncu (`--clock-control none`, so clocks are what the benchmark sees) on a small driver that
executes, after warm-up: the lm_head M=1 GEMV with the old fma16 kernel (before) and the packed
tensor-core kernel (after), and the MoE layer M=1 (route, gate_up, down). Prints per kernel:
thread instructions per 32-bit weight word, issue-active %, warps-active %, DRAM % of peak,
duration; writes the raw CSV and a JSON summary under --out.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..cases import LINEAR_SHAPES, MOE
from .sass_count import hot_loop, opcode

METRICS = {
    "smsp__thread_inst_executed.sum": "thread_inst",
    "smsp__inst_executed.sum": "warp_inst",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_active_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "warps_active_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "dram__bytes_read.sum": "dram_read_bytes",
    # L2: the MoE prefill's CTAs each read their token block's activations again, per 128 output rows (the 20b's
    # 2048-token down: ~1.1 GB per layer against 0.14 GB of weights), so L2 may bound it before DRAM does
    "lts__t_bytes.sum": "l2_bytes",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "l2_pct",
    "gpu__time_duration.sum": "duration_ns",
    "launch__registers_per_thread": "regs",
}
LM = LINEAR_SHAPES["lm_head"]


def driver() -> None:
    """What ncu profiles (run as a child process)."""
    import torch

    from ..gemv import mxfp4_gemv, mxfp4_gemv_packed
    from ..moe import moe_forward_packed, pack_moe_experts
    from ..packed import pack_mxfp4
    from ..testing import generator, random_mxfp4
    from ..tuning import get_config

    g = generator(7, "cuda")
    n, k = LM
    w, s = random_mxfp4((n, k), g)
    q = pack_mxfp4(w, s)
    x = torch.randn(1, k, generator=g, device="cuda").to(torch.bfloat16)
    cfg_old = {**get_config("gemv"), "rows_max_m": 1 << 30}
    for _ in range(2):
        mxfp4_gemv(x, w, s, config=cfg_old)
        mxfp4_gemv_packed(x, q)
    torch.cuda.synchronize()
    mxfp4_gemv(x, w, s, config=cfg_old)
    mxfp4_gemv_packed(x, q)
    del w, s, q
    e, tk, h, inter = MOE.experts, MOE.top_k, MOE.hidden, MOE.inter
    gu_p, gu_s = random_mxfp4((e, 2 * inter, h), g)
    d_p, d_s = random_mxfp4((e, h, inter), g)
    gu, dn = pack_moe_experts(gu_p, gu_s, d_p, d_s)
    gb = torch.randn(e, 2 * inter, generator=g, device="cuda") * 0.1
    db = torch.randn(e, h, generator=g, device="cuda") * 0.1
    rw = (torch.randn(e, h, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    for _ in range(3):
        moe_forward_packed(x, rw, None, gu, gb, dn, db, tk)
    torch.cuda.synchronize()


SMALL = {k: LINEAR_SHAPES[k] for k in ("qkv", "o_proj")}  # dense M=1 shapes of the stall profile


def small_driver(srcs: list[str]) -> None:
    """--small: the latency-bound kernels (qkv / o_proj M=1, the MoE layer M=1 with bias) once each per
    CUDA source, between cudaProfilerStart/Stop (everything before is warm-up); launch order per
    source: qkv, o_proj, route, gate_up, down."""
    import torch

    from ..gemv import mxfp4_gemv_packed
    from ..moe import mxfp4_moe_packed, pack_moe_experts, route_packed
    from ..packed import pack_mxfp4
    from ..testing import generator, random_mxfp4
    from ..tuning import get_config

    g = generator(11, "cuda")
    dense = {}
    for name, (n, k) in SMALL.items():
        w, s = random_mxfp4((n, k), g)
        dense[name] = (pack_mxfp4(w, s), torch.randn(n, generator=g, device="cuda").to(torch.bfloat16),
                       torch.randn(1, k, generator=g, device="cuda").to(torch.bfloat16))
    e, tk, h, inter = MOE.experts, MOE.top_k, MOE.hidden, MOE.inter
    gu_p, gu_s = random_mxfp4((e, 2 * inter, h), g)
    d_p, d_s = random_mxfp4((e, h, inter), g)
    gu, dn = pack_moe_experts(gu_p, gu_s, d_p, d_s)
    gb = (torch.randn(e, 2 * inter, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    db = (torch.randn(e, h, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    rw = (torch.randn(e, h, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    x = torch.randn(1, h, generator=g, device="cuda").to(torch.bfloat16)
    gcfg = {**get_config("gemv"), **get_config("gemv").get("packed", {}), "impl": "cuda"}
    mcfg = {**get_config("moe").get("packed", {}), "impl": "cuda"}

    def once(src: str) -> None:
        for p, b, xx in dense.values():
            mxfp4_gemv_packed(xx, p, b, config={**gcfg, "cuda_src": src})
        ids, wts = route_packed(x, rw, None, tk, config={**mcfg, "cuda_src": src})
        mxfp4_moe_packed(x, ids, wts, gu, gb, dn, db, config={**mcfg, "cuda_src": src})

    for src in srcs:
        for _ in range(3):
            once(src)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for src in srcs:
        once(src)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


PREFILL_M = 2048


def prefill_driver() -> None:
    """--prefill: the prefill kernels at 2048 tokens on gpt-oss-120b shapes (the MoE layer's gate_up and down, top-4 of
    128 from random logits; qkv on the kernels, not the dequantize + BLAS path) once, between cudaProfilerStart/Stop."""
    import torch

    from ..packed import pack_mxfp4
    from ..packed_mm import mxfp4_mm_packed, mxfp4_moe_packed_mm
    from ..testing import random_mxfp4
    from ..tuning import get_config
    from .bench import random_moe_layer, random_routing

    m = PREFILL_M
    _, _, gu_b, _, _, d_b, gu_q, d_q, g = random_moe_layer(11)
    x = torch.randn(m, MOE.hidden, generator=g, device="cuda").to(torch.bfloat16)
    _, ids, wts = random_routing(m, g)
    n, k = LINEAR_SHAPES["qkv"]
    w, s = random_mxfp4((n, k), g)
    qkv, xq = pack_mxfp4(w, s), torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    cfg = {**get_config("packed_mm"), "dequant_min_m": 0}

    def once() -> None:
        mxfp4_moe_packed_mm(x, ids, wts, gu_q, gu_b, d_q, d_b, config=cfg)
        mxfp4_mm_packed(xq, qkv, config=cfg)

    for _ in range(3):
        once()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    once()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def small_main(out: Path, ncu: str, srcs: list[str]) -> int:
    """Stall reasons (warp-state sampling) and per-SASS-line samples of the latency-bound kernels."""
    labels = [f"{name}{'' if not src else ' [' + Path(src).name + ']'}"
              for src in srcs for name in ("qkv", "o_proj", "moe_route", "moe_gate_up", "moe_down")]
    return stall_profile(out, ncu, "small", ["--small-driver", "--srcs", ",".join(srcs)], labels)


def stall_profile(out: Path, ncu: str, tag: str, driver_args: list[str], labels: list[str],
                  kernel_regex: str | None = None) -> int:
    """ncu on one driver (everything between its cudaProfilerStart/Stop): SpeedOfLight, warp-state sampling and
    per-SASS-line samples; writes {tag}_raw.csv, {tag}_source.csv and {tag}_summary.json (one entry per label, in
    launch order) and prints each kernel's issue, occupancy, DRAM and top stall reasons."""
    rep = out / tag
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "-f", "-o", str(rep),
           *(["--kernel-name", f"regex:{kernel_regex}"] if kernel_regex else []),
           "--section", "SpeedOfLight", "--section", "WarpStateStats", "--section", "SourceCounters",
           "--section", "Occupancy", "--section", "LaunchStats", "--section", "MemoryWorkloadAnalysis",
           "--metrics", ",".join(METRICS), sys.executable, "-m", "kernels.tools.ncu_profile", *driver_args]
    print(" ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (out / f"{tag}_stderr.txt").write_text(r.stdout[-20000:] + r.stderr[-20000:])
    if r.returncode:
        print(f"ncu failed (rc {r.returncode}): {r.stderr[-3000:]}")
        return 1
    raw = subprocess.run([ncu, "-i", f"{rep}.ncu-rep", "--page", "raw", "--csv"], capture_output=True, text=True)
    (out / f"{tag}_raw.csv").write_text(raw.stdout)
    src_page = subprocess.run([ncu, "-i", f"{rep}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                              capture_output=True, text=True)
    (out / f"{tag}_source.csv").write_text(src_page.stdout[:40_000_000])
    (out / f"{tag}_source_stderr.txt").write_text(src_page.stderr[-5000:])
    (out / f"{tag}_stalls_by_opcode.json").write_text(json.dumps(stalls_by_opcode(src_page.stdout), indent=1))
    (out / f"{tag}_hot_loops.txt").write_text(format_hot_loops(hot_loops(src_page.stdout)))
    rows, units = raw_rows(raw.stdout)
    if len(rows) != len(labels):  # labels go by launch order: one kernel missed shifts every name after it
        print(f"ncu profiled {len(rows)} kernels where the driver launches {len(labels)} ({', '.join(labels)}): the "
              f"kernel-name filter misses or adds one (a new kernel name?); see {tag}_raw.csv and fix kernel_regex")
        return 1
    summary = []
    for label, row in zip(labels, rows):
        rec = {"case": label, "kernel": row.get("Kernel Name", "")[:120], **metric_values(row, units)}
        stalls = {}
        for col, val in row.items():
            if col and col.startswith("smsp__pcsamp_warps_issue_stalled_") and not col.endswith("_not_issued"):
                try:
                    stalls[col.removeprefix("smsp__pcsamp_warps_issue_stalled_")] = float(str(val).replace(",", ""))
                except ValueError:
                    pass
        total = sum(stalls.values()) or float("nan")
        rec["stall_share"] = {k: round(v / total, 3) for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:8]}
        summary.append(rec)
    (out / f"{tag}_summary.json").write_text(json.dumps(summary, indent=1))
    for rec in summary:
        print(f"{rec['case']:40s} {rec['duration_ns'] / 1e3:7.2f} us  issue {rec['issue_active_pct']:5.1f}%  "
              f"warps {rec['warps_active_pct']:5.1f}%  dram {rec['dram_pct']:5.1f}%  L2 {rec['l2_pct']:5.1f}% "
              f"({rec['l2_bytes'] / 1e9:.2f} GB)  stalls "
              + ", ".join(f"{k} {v:.0%}" for k, v in list(rec["stall_share"].items())[:5]))
    return 0


STALLS = ("stall_wait", "stall_short_sb", "stall_long_sb", "stall_math", "stall_barrier", "stall_mio", "stall_lg",
          "stall_branch_resolving", "stall_dispatch", "stall_no_inst", "stall_selected", "stall_not_selected")


def _kernel_tables(source_csv: str) -> list[tuple[str, list[dict]]]:
    """`ncu --page source --csv --print-source sass` -> [(kernel name, its rows)] in launch order; a kernel printed
    twice in a row (ncu does) is kept once."""
    out: list[tuple[str, list[dict]]] = []
    for block in source_csv.split('"Kernel Name",')[1:]:
        name, _, table = block.partition("\n")
        name = name.strip().strip(",").strip('"')
        if out and out[-1][0] == name:
            continue
        out.append((name, list(csv.DictReader(io.StringIO(table)))))
    return out


def _samples(row: dict, key: str) -> float:
    try:
        return float(str(row.get(key) or 0).replace(",", ""))
    except ValueError:
        return 0.0


def stalls_by_opcode(source_csv: str, top: int = 6) -> list[dict]:
    """Warp-state samples of `ncu --page source --csv --print-source sass` summed per SASS opcode (predicate and
    modifiers dropped): per kernel, in launch order, each stall reason's total and its `top` opcodes. It says which
    instructions a stall falls on (a "wait" on branches is not one on MMAs), which the per-kernel totals do not. A
    kernel printed twice in a row (ncu does) is kept once."""
    out: list[dict] = []
    for name, rows in _kernel_tables(source_csv):
        totals: dict[str, float] = dict.fromkeys(STALLS, 0.0)
        per_op: dict[str, dict[str, float]] = {k: collections.Counter() for k in STALLS}
        for row in rows:
            op = opcode(row.get("Source") or "").split(".")[0]
            for k in STALLS:
                v = _samples(row, k)
                totals[k] += v
                per_op[k][op] += v
        out.append({"kernel": name, "samples": {k: v for k, v in totals.items() if v},
                    "by_opcode": {k: per_op[k].most_common(top) for k in STALLS if totals[k]}})
    return out


def hot_loops(source_csv: str, markers: tuple[str, ...] = ("HMMA", "HGMMA")) -> list[dict]:
    """Per kernel, the backward-branch loop with the most instructions of the first of `markers` it has
    (sass_count.hot_loop: mma.sync's HMMA, else wgmma's HGMMA; of loops with as many, the most sampled) and its warp-state
    samples instruction by instruction: which MMA waits for its ldmatrix, which no-op sits between two dependent MMAs,
    which decode waits for its weight load. Kernels without such a loop are left out."""
    out = []
    for name, rows in _kernel_tables(source_csv):
        ins, samples = [], {}
        for row in rows:
            try:
                addr = int(str(row.get("Address") or ""), 16)
            except ValueError:
                continue
            ins.append((addr, (row.get("Source") or "").strip(), addr))
            samples[addr] = {k: _samples(row, k) for k in STALLS}
        # the MoE kernels compile one copy of the loop per live token-tile count, each with as many MMAs: the most
        # sampled copy is the one the profiled call ran (at 2048 tokens of the 120b shape, not the widest)
        heaviest = lambda body: sum(sum(samples[a].values()) for a, _, _ in body)  # noqa: E731
        found = next((f for f in (hot_loop(ins, m, heaviest) for m in markers) if f), None)
        if not found:
            continue
        n, body = found
        total = sum(sum(v.values()) for v in samples.values()) or float("nan")
        lines = [{"address": a, "source": t, "samples": sum(samples[a].values()),
                  "top": sorted(((k, v) for k, v in samples[a].items() if v), key=lambda kv: -kv[1])[:2]}
                 for a, t, _ in body]
        in_loop = sum(x["samples"] for x in lines)
        out.append({"kernel": name, "instructions": len(body), "markers": n, "samples": in_loop,
                    "share_of_kernel": round(in_loop / total, 3), "lines": lines})
    return out


def format_hot_loops(loops: list[dict]) -> str:
    """hot_loops as text: one header per kernel, then address, samples and the two largest stall reasons per line."""
    out = []
    for lp in loops:
        out.append(f"== {lp['kernel']}: {lp['instructions']} instructions, {lp['markers']} markers, "
                   f"{lp['samples']:.0f} samples ({100 * lp['share_of_kernel']:.0f}% of the kernel's)")
        out += [f"{x['address']:#8x} {x['samples']:7.0f}  {x['source'][:64]:64s} "
                + " ".join(f"{k.removeprefix('stall_')}={v:.0f}" for k, v in x["top"]) for x in lp["lines"]]
    return "\n".join(out) + "\n"


def words_for(kernel: str) -> float | None:
    n, k = LM
    e, tk, h, inter = MOE.experts, MOE.top_k, MOE.hidden, MOE.inter
    mode = None
    for m in (0, 1, 2):  # mangled (ILi0E...) or demangled (mxfp4_kernel<0, ...) template MODE
        if f"mxfp4_kernelILi{m}E" in kernel or f"mxfp4_kernel<{m}," in kernel:
            mode = m
    if "rows_kernel" in kernel or mode == 0:
        return n * k / 8
    if mode == 1:
        return tk * 2 * inter * h / 8
    if mode == 2:
        return tk * h * inter / 8
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--small-driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--small", action="store_true",
                    help="stall reasons of the latency-bound kernels (qkv / o_proj M=1, MoE M=1) instead")
    ap.add_argument("--srcs", default="", help="with --small: comma list of CUDA sources ('' = csrc/mxfp4_mma.cu)")
    ap.add_argument("--prefill-driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prefill", action="store_true",
                    help=f"stall reasons of the prefill kernels at {PREFILL_M} tokens (MoE gate_up and down, qkv) instead")
    args = ap.parse_args(argv)
    if args.driver:
        driver()
        return 0
    if args.prefill_driver:
        prefill_driver()
        return 0
    srcs = args.srcs.split(",") if args.srcs else [""]
    if args.small_driver:
        small_driver(srcs)
        return 0
    ncu = shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if Path("/usr/local/cuda/bin/ncu").exists() else None)
    if not ncu:
        print("ncu not found on PATH")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.small:
        return small_main(out, ncu, srcs)
    if args.prefill:
        return stall_profile(out, ncu, "prefill", ["--prefill-driver"], ["moe_gate_up", "moe_down", "qkv"],
                             kernel_regex="mxfp4_(pf|wg)_kernel")
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:rows_kernel|mxfp4_kernel|route_kernel",
           "--metrics", ",".join(METRICS), "--csv", "--page", "raw", sys.executable, "-m", "kernels.tools.ncu_profile",
           "--driver"]
    print(" ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    (out / "ncu_raw.csv").write_text(r.stdout)
    (out / "ncu_stderr.txt").write_text(r.stderr)
    if r.returncode:
        print(f"ncu failed (rc {r.returncode}): {r.stderr[-3000:]}")
        return 1
    rows, units = raw_rows(r.stdout)
    last = {row.get("Kernel Name", ""): row for row in rows}  # the last launch of each kernel (earlier: warm-up)
    summary = []
    for name, row in last.items():
        rec = {"kernel": name[:160], **metric_values(row, units)}
        wds = words_for(name)
        if wds:
            rec["weight_words"] = wds
            rec["thread_inst_per_word"] = round(rec["thread_inst"] / wds, 2)
        summary.append(rec)
    (out / "ncu_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{'kernel':60s} {'inst/word':>9s} {'issue%':>7s} {'warps%':>7s} {'dram%':>6s} {'us':>8s} {'regs':>5s}")
    for rec in summary:
        print(f"{rec['kernel'][:60]:60s} {rec.get('thread_inst_per_word', float('nan')):9.2f} "
              f"{rec['issue_active_pct']:7.1f} {rec['warps_active_pct']:7.1f} {rec['dram_pct']:6.1f} "
              f"{rec['duration_ns'] / 1e3:8.2f} {rec['regs']:5.0f}")
    return 0


def row_is_data(row: dict) -> bool:
    return bool(row.get("ID", "").strip().isdigit())


# ncu prints each metric in a unit of its choosing (its --page raw CSV has a units row under the
# header: "us" or "nsecond" for durations, "Mbyte" or "byte" for sizes); METRICS keys ending in _ns /
# _bytes are stored in those base units.
_TO_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_TO_BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def raw_rows(csv_text: str) -> tuple[list[dict], dict]:
    """ncu --page raw --csv output -> (data rows, {metric: unit})."""
    rows = list(csv.DictReader(io.StringIO(csv_text[csv_text.find('"ID"'):])))
    units = next((r for r in rows if not row_is_data(r)), {})
    return [r for r in rows if row_is_data(r)], units


def metric_values(row: dict, units: dict) -> dict:
    """METRICS of one kernel row, durations in ns and sizes in bytes whatever unit ncu printed."""
    rec = {}
    for metric, key in METRICS.items():
        try:
            value = float(str(row.get(metric, "nan")).replace(",", ""))
        except ValueError:
            value = float("nan")
        unit = str(units.get(metric, "")).strip()
        if key.endswith("_ns"):
            value *= _TO_NS.get(unit, 1.0)
        elif key.endswith("_bytes"):
            value *= _TO_BYTES.get(unit, 1.0)
        rec[key] = value
    return rec


if __name__ == "__main__":
    sys.exit(main())
