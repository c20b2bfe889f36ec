"""Human-readable outputs of a run: a markdown summary table and PNG plots.

Results dict (the content of a level 4 results file; one per config and platform; also what
`harness.perf.baselines.save_baseline` records and `harness.perf.regression.compare_run` judges):

    {
      "config": "baseline",                # named configuration (configs/configs.yaml)
      "model": "tiny-gpt-oss-mxfp4",       # model alias (harness.engine.models)
      "platform": "cpu",                   # harness.core.platform name: cpu / sm_90 / sm_121 ...
      "device": "AMD EPYC",                # CPU model name or GPU name
      "valid": True,                       # False when the level 1.5 kernel-path check failed:
                                           #   the numbers do not measure the config they claim
      "metrics": {                         # per-run samples, names per harness.perf.metrics:
        "tg32":         {"samples": [31.5, 31.6], "unit": "tok/s", "higher_is_better": True},
        "pp2048":       {"samples": [...],        "unit": "tok/s", "higher_is_better": True},
        "tg32@d4096":   {"samples": [...],        "unit": "tok/s", "higher_is_better": True},
        "ttft_ms":      {"samples": [...],        "unit": "ms",    "higher_is_better": False},
      },
      "workload": {"prompt_tokens": 2048, "output_tokens": 32, "runs": 10, "warmup": 3, "depths": [0], ...},
      "metadata": {...},                   # Phase 7 reproducibility metadata (harness.perf.metadata)
      "memory_peak_gb": 61.2,              # GB (1e9 bytes); None when not measurable
    }

`verdicts` for the summary maps a config name (or "<platform>/<config>" when one report mixes platforms
that share config names) to that config's `harness.perf.regression.Verdict`s (a list, or a dict by metric).
Plots are drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global backend switch).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.core import stats
from harness.core.errors import SuiteError
from harness.perf import host_cpu
from harness.perf import metrics as perf
from harness.perf.baselines import check_metrics
from harness.perf.regression import DETAIL_WITHOUT_CI, Verdict
from harness.perf.results import UNJUDGED, read_results, results_files

MARKS = {"pass": "✅", "fail": "❌ FAIL", "inconclusive": "⚠️ inconclusive", "improved": "🚀 improved"}
ADVISORY_MARKS = {"fail": "⚠️ advisory fail", "inconclusive": "⚠️ advisory inconclusive"}
_WORST_FIRST = ("fail", "inconclusive", "improved", "pass")
_LATENCY_COLUMNS = (("ttft_ms", "TTFT p50 (ms)"), ("tpot_ms", "TPOT p50 (ms)"))


def mark(verdict) -> str:
    """The cell mark of a verdict: an advisory verdict never reads as a failure."""
    if getattr(verdict, "advisory", False) and verdict.status in ADVISORY_MARKS:
        return ADVISORY_MARKS[verdict.status]
    return MARKS.get(verdict.status, verdict.status)


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
    if verdict.kind == "memory" or verdict.name == "memory_peak_gb":
        change = "n/a" if verdict.delta_abs != verdict.delta_abs else f"{verdict.delta_abs:+.2f} GiB"
    elif verdict.kind == "capacity":
        change = "n/a" if verdict.delta != verdict.delta else f"{verdict.delta * 100:+.2f}%"
    else:
        change = f"{verdict.delta * 100:+.1f}%"
    return f"{value} ({change} {mark(verdict)})"


def _ci(v) -> str:
    return f"; 95% CI of ratio [{v.ci[0]:.3f}, {v.ci[1]:.3f}]" if v.ci else ""


def _clock_text(rec: Mapping | None) -> str:
    if not rec:
        return ""
    parts = []
    if rec.get("sm_mhz") is not None:
        sm = f"SM {rec['sm_mhz']:.0f}"
        if rec.get("sm_min_mhz") is not None and rec["sm_min_mhz"] < rec["sm_mhz"] - 1:
            sm += f" (min {rec['sm_min_mhz']:.0f})"
        parts.append(sm + " MHz")
    if rec.get("mem_mhz") is not None:
        parts.append(f"mem {rec['mem_mhz']:.0f} MHz")
    if rec.get("power_w") is not None:
        parts.append(f"{rec['power_w']:.0f} W")
    return ", ".join(parts)


def _round_lines(r: Mapping) -> list[str]:
    """Per metric: every sample with the clocks it ran at, and the rounds set aside (below the loaded clock)."""
    lines = []
    for name, entry in r["metrics"].items():
        rounds = entry.get("rounds")
        flagged = entry.get("flagged") or []
        if not rounds and not flagged:
            continue
        cells = [f"{stats.fmt(x)} @ {_clock_text(c) or 'no clocks'}" for x, c in zip(entry["samples"], rounds or [])]
        lines.append(f"- `{name}` ({entry['unit']}): " + "; ".join(cells))
        for f in flagged:
            lines.append(f"  - set aside (below the loaded clock): {stats.fmt(f['value'])} @ {_clock_text(f)}"
                         + (f" ({f['why']})" if f.get("why") else ""))
        if entry.get("unresolved"):
            lines.append(f"  - unresolved: {entry['unresolved']}")
    return lines


def write_markdown_summary(results: Sequence[Mapping], verdicts: Mapping, path: str | os.PathLike) -> Path:
    """Comparison matrix like the users' GB10 results table, led by what failed: first every gating failure with its CI, then
    advisory verdicts (shown as advisory, with why), then the inconclusive ones; then one row per result
    (depth-0 throughputs as mean ± std over runs, latency p50s, used memory, KV capacity, peak memory, each
    with its change vs baseline and gate mark), the per-round clocks next to the numbers they explain, and
    a llama-bench style view of every depth."""
    _check(results)
    columns: list[str] = []
    for r in results:
        for name, _, _, depth in _throughput(r["metrics"]):
            if depth == 0 and name not in columns:
                columns.append(name)
    columns.sort(key=lambda n: (not n.startswith("tg"), int(re.sub(r"\D", "", n.split("@")[0]))))
    latency = [(k, title) for k, title in _LATENCY_COLUMNS if any(k in r["metrics"] for r in results)]

    failed, advisory, unclear = [], [], []
    for r in results:
        for v in _verdicts_for(r, verdicts).values():
            line = f"- **{_label(r)}** `{v.name}`: {v.message}"
            if v.status == "fail" and not v.advisory:
                failed.append(line + (_ci(v) if v.ci and v.reason in DETAIL_WITHOUT_CI else ""))
            elif v.advisory and v.status in ADVISORY_MARKS:
                advisory.append(f"{line} — advisory: {v.advisory_reason}")
            elif v.status == "inconclusive":
                unclear.append(line)

    lines = ["# Performance summary", ""]
    if failed:
        lines += [f"## ❌ Failed ({len(failed)})", "", *failed, ""]
    elif any(_verdicts_for(r, verdicts) for r in results):
        lines += ["## ✅ No gating failure", ""]
    if advisory:
        lines += [f"## ⚠️ Advisory, not gating ({len(advisory)})", "",
                  "These timing verdicts would fail a strict gate; on this platform timing is advisory (the run "
                  "passes), memory stays strict.", "", *advisory, ""]
    if unclear:
        lines += [f"## ⚠️ Inconclusive ({len(unclear)})", "", *unclear, ""]

    platforms: dict[tuple[str, str], list[str]] = {}
    for r in results:
        platforms.setdefault((r["platform"], str(r.get("device") or "unknown device")), []).append(r["config"])
    lines.append("Every row names the platform it was measured on; numbers from different platforms are not "
                 "comparable with each other.")
    lines.append("")
    for (plat, device), configs in platforms.items():
        lines.append(f"- **{plat}** ({device}): {', '.join(configs)}")
    lines.append("")

    header = ["Config", "Platform", *columns, *(t for _, t in latency), "Used mem (GiB)", "KV capacity (tokens)",
              "Peak mem (GB)", "Gate"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
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
        used, kv, mem = r.get("memory_used_gib"), r.get("kv_capacity_tokens"), r.get("memory_peak_gb")
        row.append("-" if used is None else _cell(f"{used:.2f}", vs.get("memory_used_gib")))
        row.append("-" if kv is None else _cell(f"{kv:,}", vs.get("kv_capacity_tokens")))
        row.append("-" if mem is None else _cell(f"{mem:.2f}", vs.get("memory_peak_gb")))
        if r.get("valid") is False:
            gate = "❌ INVALID (kernel-path check failed)"
        elif vs:
            strict = [v for v in vs.values() if not v.advisory]
            adv = [v for v in vs.values() if v.advisory and v.status in ADVISORY_MARKS]
            worst = min(strict, key=lambda v: _WORST_FIRST.index(v.status)).status if strict else "pass"
            gate = MARKS[worst] + (f" ({len(adv)} advisory)" if adv else "")
        else:
            gate = "no baseline"
        row.append(gate)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Throughput cells: mean ± std over runs (tok/s); latency cells: p50 over runs. Changes in "
              "parentheses compare medians with the stored baseline; ✅ pass, ❌ fail, ⚠️ inconclusive or "
              "advisory (timing on a platform where it does not gate), 🚀 improved. Used memory: what vLLM "
              "accounts for (GPU) / the process group's RSS at boot (CPU); peak memory is informational."]
    for r in results:
        mem = r.get("memory") or {}
        if mem.get("used_source") or mem.get("cross_check"):
            lines += ["", f"Memory of {_label(r)}: {mem.get('used_source') or 'n/a'}; "
                          f"cross-check: {(mem.get('cross_check') or {}).get('message', 'n/a')}"]
        cpu = host_cpu.summary(r.get("host_cpu"))
        if cpu:
            lines += ["", f"Host CPU of {_label(r)}: a fixed loop on the engine core's CPU took {cpu}; a host-side "
                          "decode verdict compares it with the baseline's"]

    clock_lines = []
    for r in results:
        rl = _round_lines(r)
        if rl:
            ck = r.get("clocks") or {}
            head = f"### {_label(r)}"
            if ck.get("loaded_sm_mhz"):
                head += (f" (loaded SM clock {ck['loaded_sm_mhz']:.0f} MHz; rounds below "
                         f"{ck.get('flag_below_mhz') or '?'} MHz are set aside)")
            clock_lines += ["", head, "", *rl]
    if clock_lines:
        lines += ["", "## Per-round clocks", "", "Every sample with the GPU clocks and power it ran at (NVML, "
                  "sampled every ~10 ms during the measured request).", *clock_lines]

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


    run_dir = Path(run_dir)
    results = [read_results(p) for p in results_files(run_dir, side_servers=True)]
    if not results:
        curves = sensitivity_lines(run_dir)
        if not curves:
            return []
        path = run_dir / "report.md"
        path.write_text("# Performance summary\n\n" + "\n".join(curves) + "\n", encoding="utf-8")
        return [path]
    verdicts = {}
    for p in sorted((run_dir / "verdicts").glob("*.json")):
        config = p.stem.split("__", 1)[-1]
        try:
            verdicts[config] = [Verdict.from_json(v) for v in json.loads(p.read_text())]
        except (OSError, ValueError, TypeError, KeyError) as e:  # a run killed while writing them: name it, not a traceback
            raise SuiteError(f"cannot read verdicts {p} ({type(e).__name__}); rerun level 5 to write them again") from None
    report = write_markdown_summary(results, verdicts, run_dir / "report.md")
    curves = sensitivity_lines(run_dir)
    if curves:
        report.write_text(report.read_text(encoding="utf-8") + "\n" + "\n".join(curves) + "\n", encoding="utf-8")
    return [report, plot_depth(results, run_dir / "depth.png"), plot_configs(results, run_dir / "configs.png")]


def sensitivity_lines(run_dir: Path) -> list[str]:
    """The run's sensitivity curves (tests/level5_regression/test_sensitivity.py) as a markdown section."""
    import json

    lines = []
    for p in sorted((Path(run_dir) / "sensitivity").glob("*.json")):
        s = json.loads(p.read_text())
        lines += [f"## Sensitivity curve: {p.stem}", "",
                  f"Injected slowdowns on one server (suite_testhooks plugin), each interleaved ABBA with 0%, "
                  f"{s['rounds_per_side']} rounds per side; {s.get('decode_step_from', 'decode')} step "
                  f"{s['decode_step_ms']:.3f} ms, "
                  f"{s.get('prefill_metric', 'pp' + str(s['prefill_tokens']))} {s['prefill_ms']:.2f} ms; gate {s['thresholds']['throughput_drop']:.0%}.",
                  "", "| slower by | metric | expected ratio | measured ratio | verdict |", "|---|---|---|---|---|"]
        for pt in s["points"]:
            for name, ratio in pt["measured_ratio"].items():
                status = pt["status"].get(name, UNJUDGED)
                lines.append(f"| {pt['fraction']:.0%} | {name} | {pt['expected_ratio']:.4f} | {ratio:.4f} | "
                             f"{MARKS.get(status, status)} |")
        lines.append("")
    return lines
