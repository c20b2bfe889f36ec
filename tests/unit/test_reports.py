"""harness.report.run_report: the markdown matrix says where each number came from; the plots are real PNGs."""
import numpy as np
import pytest

from harness.core.errors import SuiteError
from harness.perf.regression import Thresholds, compare_run
from harness.report import run_report as reports

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metric(mean, unit="tok/s", hib=True, seed=0):
    rng = np.random.default_rng(seed)
    return {"samples": list(mean * (1 + 0.003 * rng.standard_normal(10))), "unit": unit, "higher_is_better": hib}


def result(config, platform, device, tg=31.6, pp=4341.0, mem=80.0, valid=True, used=None, kv=None):
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
        "memory_used_gib": used, "kv_capacity_tokens": kv,
    }


@pytest.fixture
def runs():
    base = result("baseline", "sm_121", "NVIDIA GB10", used=62.0, kv=100_000)
    cur = result("baseline", "sm_121", "NVIDIA GB10", tg=31.6 * 0.95, mem=81.5, used=63.5, kv=97_000)
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
    assert "63.50 (+1.50 GiB ❌ FAIL)" in row["baseline"]  # used memory is gated
    assert "97,000 (-3.00% ✅)" in row["baseline"]  # KV capacity within its 5% gate
    assert "| 81.50 |" in row["baseline"]  # peak memory is informational: no verdict
    assert row["baseline"].rstrip().endswith("❌ FAIL |")
    assert "INVALID" in row["cutlass"]
    assert "no baseline" in row["marlin"]
    assert "- **cpu** (AMD EPYC): marlin" in text
    assert "| marlin | cpu | pp2048 @ d4096 |" in text


def test_report_leads_with_failed_metrics_and_their_cis(tmp_path, runs):
    base, results = runs
    verdicts = {"baseline": compare_run(base, results[0], Thresholds())}
    text = reports.write_markdown_summary(results, verdicts, tmp_path / "s.md").read_text(encoding="utf-8")
    first_section = next(line for line in text.splitlines() if line.startswith("## "))
    assert first_section == "## ❌ Failed (4)"  # tg32, tg128, tg32@d4096 (all 5% slower) and used memory
    failed = text.split("## ❌ Failed (4)")[1].split("\n## ")[0]
    assert "`tg32`: FAIL tg32" in failed and "CI of ratio [0.9" in failed
    assert "`memory_used_gib`: FAIL used memory 62.00 -> 63.50 GiB" in failed
    assert text.index("## ❌ Failed") < text.index("| Config |")


def test_advisory_verdicts_are_shown_as_advisory_with_why(tmp_path, runs):
    """On CPU the timing gate is advisory: its fails must not read as ❌ FAIL in a run whose tests pass."""
    base, results = runs
    cpu_base = result("marlin", "cpu", "AMD EPYC", tg=2.1, pp=150.0, used=3.0, kv=50_000)
    cpu_cur = result("marlin", "cpu", "AMD EPYC", tg=2.1 * 0.8, pp=150.0, used=3.1, kv=50_000)
    verdicts = {"marlin": compare_run(cpu_base, cpu_cur, Thresholds(throughput_drop=0.1, advisory=True))}
    text = reports.write_markdown_summary([cpu_cur], verdicts, tmp_path / "s.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| **marlin** |"))
    assert "❌" not in row and "(-20.0% ⚠️ advisory fail)" in row
    assert row.rstrip().endswith("✅ (3 advisory) |")  # tg32, tg128, tg32@d4096
    assert "## ❌ Failed" not in text and "## ⚠️ Advisory, not gating (3)" in text
    assert "advisory: timing verdicts on cpu are advisory" in text and "memory verdicts stay strict" in text


def test_per_round_clocks_sit_next_to_the_numbers(tmp_path, runs):
    _, results = runs
    r = results[0]
    r["metrics"]["pp2048"]["rounds"] = [{"sm_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 512.0}] * 10
    r["metrics"]["pp2048"]["flagged"] = [{"value": 2300.0, "sm_mhz": 1500.0, "sm_min_mhz": 345.0, "flagged": True,
                                          "why": "SM clock fell to 345 MHz"}]
    r["clocks"] = {"loaded_sm_mhz": 1980.0, "flag_below_mhz": 1782.0}
    text = reports.write_markdown_summary([r], {}, tmp_path / "s.md").read_text(encoding="utf-8")
    section = text.split("## Per-round clocks")[1]
    assert "loaded SM clock 1980 MHz" in section
    assert "`pp2048` (tok/s): " in section and "@ SM 1980 MHz, mem 3201 MHz, 512 W" in section
    assert "set aside (below the loaded clock): 2300 @ SM 1500 (min 345) MHz" in section


def test_the_hosts_cpu_speed_is_shown_where_it_was_timed(tmp_path, runs):
    _, results = runs
    results[0]["host_cpu"] = {"available": True, "loop_us": [1012.0, 1708.0, 1650.0], "median_us": 1650.0,
                              "cv": 0.255, "cpus": [1, 15], "loops": 20000}
    results[1]["host_cpu"] = {"available": False, "reason": "no engine core process found"}
    text = reports.write_markdown_summary(results[:2], {}, tmp_path / "s.md").read_text(encoding="utf-8")
    assert ("a fixed loop on the engine core's CPU took 1650 us median over 3 rounds, CV 25.5% (the CPU changed speed "
            "or load: a steady one stays under 15%), on CPUs 1, 15" in text), text
    assert text.count("Host CPU of") == 1


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


def test_the_shared_servers_results_are_told_from_side_servers_by_one_rule(tmp_path):
    """Level 4 names a shared server's results <model>__<config>.json and a side server's (booted beside it, the
    n-gram speculator) <model>__<config>__<tag>.json: the gate readers take the first only, the run report both,
    and a file level 4 did not name (no '__') neither."""
    from harness.perf.results import results_files, results_name
    d = tmp_path / "results"
    d.mkdir()
    names = [results_name("m", "gemv-bf16"), results_name("m", "gemv-bf16", "__ngram"), "notes.json",
             results_name("m", "triton-bf16")]
    for n in names:
        (d / n).write_text("{}")
    assert [p.name for p in results_files(tmp_path)] == ["m__gemv-bf16.json", "m__triton-bf16.json"]
    assert [p.name for p in results_files(tmp_path, side_servers=True)] == [
        "m__gemv-bf16.json", "m__gemv-bf16__ngram.json", "m__triton-bf16.json"]
    assert results_files(tmp_path / "absent") == []


def test_run_report_reads_verdicts_named_model__config(tmp_path, runs):
    """Guards against the run report keying a verdicts file by its whole stem: level 5 writes
    verdicts/<model>__<config>.json, and a row must find its verdicts under the config name, not read "no baseline"."""
    import json

    from harness.perf.results import results_name
    base, results = runs
    (tmp_path / "results").mkdir()
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "results" / results_name("tiny-gpt-oss-mxfp4", "baseline")).write_text(json.dumps(results[0]))
    verdicts = compare_run(base, results[0], Thresholds())
    (tmp_path / "verdicts" / "tiny-gpt-oss-mxfp4__baseline.json").write_text(json.dumps([v.to_json() for v in verdicts]))
    paths = reports.write_run_report(tmp_path)
    row = next(l for l in paths[0].read_text(encoding="utf-8").splitlines() if l.startswith("| **baseline** |"))
    assert "no baseline" not in row and row.rstrip().endswith("❌ FAIL |"), row


def test_verdicts_keyed_by_platform_go_to_that_platforms_row(tmp_path, runs):
    """Guards against ignoring "<platform>/<config>" keys: when two platforms share a config name, each row must
    carry its own platform's verdicts, not the other's or none."""
    base, results = runs
    gpu = results[0]
    cpu = result("baseline", "cpu", "AMD EPYC", tg=2.1, pp=150.0, mem=None)
    fail = compare_run(base, gpu, Thresholds())
    same = compare_run(gpu, gpu, Thresholds())
    verdicts = {"sm_121/baseline": fail, "cpu/baseline": same}
    lines = reports.write_markdown_summary([gpu, cpu], verdicts, tmp_path / "s.md").read_text(encoding="utf-8").splitlines()
    rows = [l for l in lines if l.startswith("| **baseline** |")]
    assert "sm_121" in rows[0] and rows[0].rstrip().endswith("❌ FAIL |"), rows[0]
    assert "cpu (" in rows[1] and not rows[1].rstrip().endswith("❌ FAIL |") and "no baseline" not in rows[1], rows[1]


def test_without_any_verdict_the_report_claims_no_pass(tmp_path, runs):
    """Guards against a "No gating failure" headline on a report that judged nothing (no baseline for any row): the
    reader would take an ungated run for a passing one."""
    _, results = runs
    text = reports.write_markdown_summary(results, {}, tmp_path / "s.md").read_text(encoding="utf-8")
    assert "No gating failure" not in text and "## ❌ Failed" not in text, text.split("| Config |")[0]


def test_matrix_columns_are_depth_zero_and_latency_is_the_median(tmp_path):
    """Guards against depth-suffixed metrics (tg32@d4096) getting their own columns in the main matrix (they belong to
    the llama-bench view) and against the latency cell showing another percentile than p50."""
    r = result("baseline", "cpu", "AMD EPYC", mem=None)
    r["metrics"]["ttft_ms"] = {"samples": [100.0, 100.0, 100.0, 100.0, 900.0], "unit": "ms", "higher_is_better": False}
    lines = reports.write_markdown_summary([r], {}, tmp_path / "s.md").read_text(encoding="utf-8").splitlines()
    header = next(l for l in lines if l.startswith("| Config |"))
    assert "@d" not in header, header
    cells = [c.strip() for c in next(l for l in lines if l.startswith("| **baseline** |")).strip("|").split("|")]
    titles = [c.strip() for c in header.strip("|").split("|")]
    assert float(cells[titles.index("TTFT p50 (ms)")]) == 100.0, cells


def test_a_failure_whose_detail_has_no_ci_gets_it_appended(tmp_path, runs):
    """Guards against dropping the CI from a failure line whose detail does not state it (DETAIL_WITHOUT_CI
    reasons): the reader must still see the interval the verdict rests on."""
    import dataclasses

    from harness.perf.regression import DETAIL_WITHOUT_CI
    base, results = runs
    v = next(v for v in compare_run(base, results[0], Thresholds()) if v.name == "tg32")
    v = dataclasses.replace(v, reason=next(iter(DETAIL_WITHOUT_CI)), ci=(0.9123, 0.9456), detail="tg32 dropped")
    text = reports.write_markdown_summary([results[0]], {"baseline": [v]}, tmp_path / "s.md").read_text(encoding="utf-8")
    assert "95% CI of ratio [0.912, 0.946]" in text.split("| Config |")[0], text.split("| Config |")[0]
