"""Where a profiled decode window's GPU idle time sits: boots one config, profiles a batch-1 decode window the way
the feature reviews do (harness/kernelpath/check.py `profile_decode_window`) and a whole 64-token request the way
scripts/plugin_e2e.py does, and prints for each the busy fraction and the largest gaps between kernels (with the
kernels on either side), so an idle share can be told apart from profiler start/stop effects.

    python scripts/decode_window_gaps.py --model gpt-oss-20b-shape --config triton-bf16 --out DIR
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.kernelpath.breakdown import breakdown  # noqa: E402
from harness.kernelpath.check import profile_decode_window  # noqa: E402
from harness.kernelpath.traces import profile, read_trace  # noqa: E402
from harness.perf import bench  # noqa: E402
from harness.plugin.options import positive_number  # noqa: E402
from harness.session.suite import Suite  # noqa: E402


def gaps(trace: Path, top: int = 12) -> dict:
    events = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"])
                    for e in read_trace(trace).get("traceEvents", []) if e.get("cat") == "kernel")
    out, end, prev = [], events[0][1], events[0][2]
    for start, stop, name in events[1:]:
        if start > end:
            out.append((start - end, prev[:60], name[:60], start - events[0][0]))
        if stop > end:
            end, prev = stop, name
    out.sort(reverse=True)
    wall = end - events[0][0]
    return {"kernels": len(events), "wall_us": round(wall, 1), "idle_us": round(sum(g[0] for g in out), 1),
            "largest": [{"gap_us": round(g, 1), "after": a, "before": b, "at_us": round(t, 1)} for g, a, b, t in out[:top]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-20b-shape")
    ap.add_argument("--config", default="triton-bf16")
    ap.add_argument("--tokens", type=positive_number(int), default=64)
    ap.add_argument("--out", required=True)
    try:
        return _run(ap.parse_args(argv))
    except SuiteError as e:
        print(f"decode_window_gaps: {e}", file=sys.stderr)
        return 2


def _run(a: argparse.Namespace) -> int:
    out = writable_dir(Path(a.out), "--out")
    suite = Suite.create(a.config, a.model, None, None, str(out / "run"), 900.0)
    target = suite.targets()[0]
    report = {}
    with suite.boot(target, tag="__gaps") as running:
        client = running.client(timeout_s=600)
        maker = bench.PromptMaker(client, seed=7)
        client.complete(maker.make(16), a.tokens, ignore_eos=True)  # warm
        window = profile_decode_window(running, "kernel", a.tokens)
        w_trace = Path(window.summary.source)
        w = bench.Workload("decode", 16, a.tokens, runs=1, warmup=0)
        whole = profile(running.url, running.trace_dir, lambda: bench.run_workload(client, maker, w), "kernel")
        cats = suite.catalog.kernel_categories()
        for name, trace, tokens in (("decode_window", w_trace, window.inside), ("whole_request", Path(whole.source), a.tokens)):
            b = breakdown(trace, cats, tokens)
            report[name] = {"tokens": b.tokens, "tokens_counted": tokens, "prefill_steps": b.prefill_steps,
                            "busy_fraction": round(b.busy_fraction, 4),
                            "kernel_us_per_token": round(b.total_us_per_token, 1),
                            "wall_us_per_token": round(b.wall_us_per_token, 1),
                            "graph_launches_per_token": b.graph_launches_per_token, **gaps(trace)}
            shutil.copy(trace, out / f"{name}.pt.trace.json.gz")
    (out / "gaps.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
