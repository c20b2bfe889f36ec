"""Human-readable outputs of a run: a markdown summary table and PNG plots.

Results dict (the content of a level 4 results file; one per config and platform; also what
`harness.baselines.save_baseline` records and `harness.regression.compare_run` judges):

    {
      "config": "baseline",                # named configuration (configs/configs.yaml)
      "model": "tiny-gpt-oss-mxfp4",       # model alias (harness.models)
      "platform": "cpu",                   # harness.platform name: cpu / sm_90 / sm_121 ...
      "device": "AMD EPYC",                # CPU model name or GPU name
      "valid": True,                       # False when the level 1.5 kernel-path check failed:
                                           #   the numbers do not measure the config they claim
      "metrics": {                         # per-run samples, names per harness.perf:
        "tg32":         {"samples": [31.5, 31.6], "unit": "tok/s", "higher_is_better": True},
        "pp2048":       {"samples": [...],        "unit": "tok/s", "higher_is_better": True},
        "tg32@d4096":   {"samples": [...],        "unit": "tok/s", "higher_is_better": True},
        "ttft_ms":      {"samples": [...],        "unit": "ms",    "higher_is_better": False},
      },
      "workload": {"prompt_tokens": 2048, "output_tokens": 32, "runs": 10, "warmup": 3, "depths": [0], ...},
      "metadata": {...},                   # Phase 7 reproducibility metadata (harness.metadata)
      "memory_peak_gb": 61.2,              # None when not measurable
    }

`verdicts` for the summary maps a config name (or "<platform>/<config>" when one report mixes platforms
that share config names) to that config's `harness.regression.Verdict`s (a list, or a dict by metric).
Plots are drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global backend switch).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness import perf, stats
from harness.baselines import check_metrics
from harness.errors import SuiteError

MARKS = {"pass": "✅", "fail": "❌ FAIL", "inconclusive": "⚠️ inconclusive", "improved": "🚀 improved"}
_WORST_FIRST = ("fail", "inconclusive", "improved", "pass")
_LATENCY_COLUMNS = (("ttft_ms", "TTFT p50 (ms)"), ("tpot_ms", "TPOT p50 (ms)"))


def _check(results: Sequence[Mapping]) -> None:
    for i, r in enumerate(results):
        where = f"results[{i}] ({r.get('config', '?') if isinstance(r, Mapping) else '?'})"
        if not isinstance(r, Mapping) or not r.get("config") or not r.get("platform"):
            # Without the platform a reader could take a CPU number for a GPU one: refuse rather than guess.
            raise SuiteError(f"{where} lacks 'config' or 'platform'; every result must say where it came from")
        check_metrics(r.get("metrics"), where)


def _throughput(metrics: Mapping) -> list[tuple[str, str, int, int]]:
    """(name, kind, size, depth) of every pp/tg metric, sorted tg before pp, then by size and depth."""
    out = []
    for name in metrics:
        try:
            base, depth = perf.parse_metric_name(name)
        except SuiteError:
            continue
        m = re.fullmatch(r"(pp|tg)(\d+)", base)
        if m:
            out.append((name, m.group(1), int(m.group(2)), depth))
    return sorted(out, key=lambda t: (t[1] != "tg", t[2], t[3]))


def _label(r: Mapping) -> str:
    return f"{r['config']} [{r['platform']}]"


def _verdicts_for(r: Mapping, verdicts: Mapping) -> dict:
    found = verdicts.get(f"{r['platform']}/{r['config']}", verdicts.get(r["config"])) or {}
    return dict(found) if isinstance(found, Mapping) else {v.name: v for v in found}


def _mean_pm_std(samples: Sequence[float]) -> str:
    mean, std = stats.mean_std(samples)
    decimals = 0 if abs(mean) >= 1000 else 2  # llama-bench style: "4341 ± 12", "31.58 ± 0.06"
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def _cell(value: str, verdict) -> str:
    if verdict is None:
        return value
    if verdict.name == "memory_peak_gb":
        change = f"{verdict.delta_abs:+.2f} GB"
    else:
        change = f"{verdict.delta * 100:+.1f}%"
    return f"{value} ({change} {MARKS.get(verdict.status, verdict.status)})"


def write_markdown_summary(results: Sequence[Mapping], verdicts: Mapping, path: str | os.PathLike) -> Path:
    """Comparison matrix like seed 001's: one row per result, depth-0 throughputs (mean ± std over runs),
    latency p50s and peak memory, each with its change vs baseline and gate mark; plus the platform of
    every row, the verdict messages that need attention, and a llama-bench style view of every depth."""
    _check(results)
    columns: list[str] = []
    for r in results:
        for name, _, _, depth in _throughput(r["metrics"]):
            if depth == 0 and name not in columns:
                columns.append(name)
    columns.sort(key=lambda n: (not n.startswith("tg"), int(re.sub(r"\D", "", n))))
    latency = [(k, title) for k, title in _LATENCY_COLUMNS if any(k in r["metrics"] for r in results)]

    lines = ["# Performance summary", ""]
    platforms: dict[tuple[str, str], list[str]] = {}
    for r in results:
        platforms.setdefault((r["platform"], str(r.get("device") or "unknown device")), []).append(r["config"])
    lines.append("Every row names the platform it was measured on; numbers from different platforms are not "
                 "comparable with each other.")
    lines.append("")
    for (plat, device), configs in platforms.items():
        lines.append(f"- **{plat}** ({device}): {', '.join(configs)}")
    lines.append("")

    header = ["Config", "Platform", *columns, *(t for _, t in latency), "Peak mem (GB)", "Gate"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    details = []
    for r in results:
        vs = _verdicts_for(r, verdicts)
        row = [f"**{r['config']}**", f"{r['platform']} ({r.get('device') or '?'})"]
        for name in columns:
            entry = r["metrics"].get(name)
            if entry is None:
                row.append("-")
                continue
            row.append(_cell(_mean_pm_std(entry["samples"]), vs.get(name)))
        for key, _ in latency:
            entry = r["metrics"].get(key)
            row.append("-" if entry is None else _cell(stats.fmt(stats.percentile(entry["samples"], 50)), vs.get(key)))
        mem = r.get("memory_peak_gb")
        row.append("-" if mem is None else _cell(f"{mem:.2f}", vs.get("memory_peak_gb")))
        if r.get("valid") is False:
            gate = "❌ INVALID (kernel-path check failed)"
        elif vs:
            worst = min(vs.values(), key=lambda v: _WORST_FIRST.index(v.status)).status
            gate = MARKS[worst]
        else:
            gate = "no baseline"
        row.append(gate)
        lines.append("| " + " | ".join(row) + " |")
        details += [f"- {_label(r)}: {v.message}" for v in vs.values() if v.status != "pass"]
    lines += ["", "Throughput cells: mean ± std over runs (tok/s); latency cells: p50 over runs. Changes in "
              "parentheses compare medians with the stored baseline; ✅ pass, ❌ fail, ⚠️ inconclusive, "
              "🚀 improved."]
    if details:
        lines += ["", "## Needs attention", "", *details]

    lines += ["", "## All throughput tests (llama-bench view)", "", "| Config | Platform | test | t/s |", "|---|---|---|---|"]
    for r in results:
        for name, kind, size, depth in _throughput(r["metrics"]):
            test = f"{kind}{size}" + (f" @ d{depth}" if depth else "") + (f" (concurrency {name.split('@c')[1]})" if "@c" in name else "")
            lines.append(f"| {r['config']} | {r['platform']} | {test} | {_mean_pm_std(r['metrics'][name]['samples'])} |")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=100)
    return path


def plot_depth(results: Sequence[Mapping], path_png: str | os.PathLike) -> Path:
    """tg (left) and pp (right) against context depth, one line per config / platform / test size."""
    _check(results)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    axes = {"tg": fig.add_subplot(1, 2, 1), "pp": fig.add_subplot(1, 2, 2)}
    for r in results:
        series: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
        for name, kind, size, depth in _throughput(r["metrics"]):
            if "@c" in name:  # concurrent runs are not points of the batch-1 depth curve
                continue
            series.setdefault((kind, size), []).append((depth, *stats.mean_std(r["metrics"][name]["samples"])))
        for (kind, size), points in series.items():
            points.sort()
            axes[kind].errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                                marker="o", capsize=3, label=f"{_label(r)} {kind}{size}")
    for kind, ax in axes.items():
        ax.set_title(f"{'decode (tg)' if kind == 'tg' else 'prefill (pp)'} vs context depth")
        ax.set_xlabel("context depth (tokens)")
        ax.set_ylabel("tok/s")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no {kind} results", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path_png)


def plot_configs(results: Sequence[Mapping], path_png: str | os.PathLike) -> Path:
    """Grouped bars of every depth-0 tg / pp test per config (mean ± std); invalid results are hatched."""
    _check(results)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    for i, kind in enumerate(("tg", "pp")):
        ax = fig.add_subplot(1, 2, i + 1)
        tests = sorted({(size, name) for r in results for name, k, size, depth in _throughput(r["metrics"])
                        if k == kind and depth == 0})
        width = 0.8 / max(len(results), 1)
        for j, r in enumerate(results):
            xs, ys, errs = [], [], []
            for x, (_, name) in enumerate(tests):
                if name in r["metrics"]:
                    mean, std = stats.mean_std(r["metrics"][name]["samples"])
                    xs.append(x + (j - (len(results) - 1) / 2) * width)
                    ys.append(mean)
                    errs.append(std)
            invalid = r.get("valid") is False
            ax.bar(xs, ys, width, yerr=errs, capsize=3, hatch="//" if invalid else None,
                   label=_label(r) + (" INVALID" if invalid else ""))
        ax.set_xticks(range(len(tests)), [name for _, name in tests])
        ax.set_title("decode (tg)" if kind == "tg" else "prefill (pp)")
        ax.set_ylabel("tok/s")
        ax.grid(axis="y", alpha=0.3)
        if tests:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no {kind} results", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path_png)


def write_run_report(run_dir: str | os.PathLike) -> list[Path]:
    """Report of one run from its `results/*.json` and `verdicts/*.json`: report.md + two PNGs."""
    import json

    from harness.regression import Verdict

    run_dir = Path(run_dir)
    results = [json.loads(p.read_text()) for p in sorted((run_dir / "results").glob("*.json"))
               if "__slowdown" not in p.name]
    if not results:
        return []
    verdicts = {}
    for p in sorted((run_dir / "verdicts").glob("*.json")):
        config = p.stem.split("__", 1)[-1]
        verdicts[config] = [Verdict(**{**v, "ci": tuple(v["ci"]) if v.get("ci") else None}) for v in json.loads(p.read_text())]
    return [
        write_markdown_summary(results, verdicts, run_dir / "report.md"),
        plot_depth(results, run_dir / "depth.png"),
        plot_configs(results, run_dir / "configs.png"),
    ]
