"""harness.reports: the markdown matrix says where each number came from; the plots are real PNGs."""
import numpy as np
import pytest

from harness import reports
from harness.errors import SuiteError
from harness.regression import Thresholds, compare_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metric(mean, unit="tok/s", hib=True, seed=0):
    rng = np.random.default_rng(seed)
    return {"samples": list(mean * (1 + 0.003 * rng.standard_normal(10))), "unit": unit, "higher_is_better": hib}


def result(config, platform, device, tg=31.6, pp=4341.0, mem=80.0, valid=True):
    return {
        "config": config, "model": "tiny-gpt-oss-mxfp4", "platform": platform, "device": device, "valid": valid,
        "metrics": {
            "tg32": metric(tg), "tg128": metric(tg, seed=1), "pp512": metric(pp / 2, seed=2), "pp2048": metric(pp, seed=3),
            "tg32@d4096": metric(tg * 0.97, seed=4), "pp2048@d4096": metric(pp * 0.73, seed=5),
            "ttft_ms": metric(555.0, "ms", False, seed=6),
        },
        "workload": {"prompt_tokens": 2048, "output_tokens": 32, "runs": 10},
        "metadata": {},
        "memory_peak_gb": mem,
    }


@pytest.fixture
def runs():
    base = result("baseline", "sm_121", "NVIDIA GB10")
    cur = result("baseline", "sm_121", "NVIDIA GB10", tg=31.6 * 0.95, mem=81.5)
    cpu = result("marlin", "cpu", "AMD EPYC", tg=2.1, pp=150.0, mem=None)
    bad = result("cutlass", "sm_90", "NVIDIA H100 80GB HBM3", valid=False)
    return base, [cur, cpu, bad]


def test_markdown_summary_rows_columns_and_marks(tmp_path, runs):
    base, results = runs
    verdicts = {"baseline": compare_run(base, results[0], Thresholds())}
    path = reports.write_markdown_summary(results, verdicts, tmp_path / "out" / "summary.md")
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| Config |"))
    for col in ("tg32", "tg128", "pp512", "pp2048", "TTFT p50", "Peak mem", "Platform"):
        assert col in header
    assert header.index("tg32") < header.index("tg128") < header.index("pp512") < header.index("pp2048")
    row = {name: next(line for line in lines if line.startswith(f"| **{name}** |"))
           for name in ("baseline", "marlin", "cutlass")}
    assert "sm_121 (NVIDIA GB10)" in row["baseline"]
    assert "cpu (AMD EPYC)" in row["marlin"]
    assert "sm_90 (NVIDIA H100 80GB HBM3)" in row["cutlass"]
    cells = [c.strip() for c in row["baseline"].strip("|").split("|")]
    tg32 = cells[header.strip("|").split("|").index(" tg32 ")]
    mean = np.mean(results[0]["metrics"]["tg32"]["samples"])
    assert tg32.startswith(f"{mean:.2f} ±") and "(-5." in tg32 and "❌ FAIL" in tg32
    assert "+1.50 GB ❌ FAIL" in row["baseline"]
    assert row["baseline"].rstrip().endswith("❌ FAIL |")
    assert "INVALID" in row["cutlass"]
    assert "no baseline" in row["marlin"]
    assert "- **cpu** (AMD EPYC): marlin" in text
    assert "## Needs attention" in text and "FAIL tg32" in text
    assert "| marlin | cpu | pp2048 @ d4096 |" in text


def test_summary_refuses_results_without_platform(tmp_path, runs):
    _, results = runs
    del results[1]["platform"]
    with pytest.raises(SuiteError, match="platform"):
        reports.write_markdown_summary(results, {}, tmp_path / "s.md")


@pytest.mark.parametrize("plot", [reports.plot_depth, reports.plot_configs])
def test_plots_are_png_files(tmp_path, runs, plot):
    _, results = runs
    path = plot(results, tmp_path / "plots" / f"{plot.__name__}.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # a drawn figure, not an empty canvas


@pytest.mark.parametrize("plot", [reports.plot_depth, reports.plot_configs])
def test_plots_without_throughput_metrics_still_render(tmp_path, plot):
    only_latency = {"config": "x", "platform": "cpu", "device": "AMD EPYC",
                    "metrics": {"ttft_ms": metric(5.0, "ms", False)}, "memory_peak_gb": None}
    assert plot([only_latency], tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC
