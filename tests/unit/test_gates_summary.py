"""scripts/gates_summary.py: which A/A boots count as passing in the GPU gate evidence."""
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gates_summary.py"
spec = importlib.util.spec_from_file_location("gates_summary", SCRIPT)
gates_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gates_summary)

RECORDED = REPO / "docs/evidence/sm_90-2026-11-29-h200-gates/gemv-bf16/aa1-verdicts.json"
PER_DEPTH_AA = REPO / "docs/evidence/sm_90-2026-11-29-h200-aa/gemv-bf16-mxfp4-all"


def _v(status: str, within: bool = False) -> dict:
    return {"name": "m", "status": status, "within_boot_spread": within, "advisory": False, "message": status}


def test_inconclusives_within_the_recorded_spreads_do_not_count_against_an_a_a_boot():
    """An unchanged boot of a host-bound config is inconclusive on a dozen metrics by design (host-bound decode, the
    sm_90 boot spreads of pp*/TTFT/e2e); the summary must not report such a boot as failing, nor pass a boot that
    failed or could not resolve two metrics for their noise."""
    assert gates_summary.aa_passed([_v("pass")] + [_v("inconclusive", within=True)] * 12 + [_v("inconclusive")])
    assert not gates_summary.aa_passed([_v("pass"), _v("fail")])
    assert not gates_summary.aa_passed([_v("inconclusive"), _v("inconclusive")])
    # the recorded H200 A/A of gemv-bf16 failed its gate on tg32@c2 (the rule then covered batch-1 decode only)
    recorded = json.loads(RECORDED.read_text())
    assert not gates_summary.aa_passed(recorded)
    assert gates_summary.aa_passed([v for v in recorded if v["name"] != "tg32@c2"])


def test_the_recorded_a_a_under_the_per_depth_rule_counts_as_passing_as_recorded_and_as_re_judged_now():
    """gemv-bf16-mxfp4-all on an H200 (2026-11-29): the verdicts its GPU run wrote, and the same results judged by
    today's rule, make a passing A/A boot; one kernel twin failing makes it fail."""
    from harness.perf import regression
    written = json.loads((PER_DEPTH_AA / "aa1-verdicts.json").read_text())
    assert gates_summary.aa_passed(written)
    assert not gates_summary.aa_passed([{**v, "status": "fail"} if v["name"] == "tg32_gpu@d8192" else v
                                        for v in written])
    t = regression.load_thresholds(REPO / "baselines" / "thresholds.yaml", "sm_90")
    base, a_a = (json.loads((PER_DEPTH_AA / f).read_text()) for f in ("baseline-results.json", "aa1-results.json"))
    assert gates_summary.aa_passed([v.to_json() for v in regression.compare_run(base, a_a, t)])


def test_the_summary_counts_a_passing_a_a_boot(tmp_path):
    (tmp_path / "aa1" / "verdicts").mkdir(parents=True)
    (tmp_path / "aa1" / "verdicts" / "x.json").write_text(json.dumps([_v("pass"), _v("inconclusive", within=True)]))
    out = tmp_path / "summary.md"
    assert gates_summary.main(tmp_path, out) == 0
    assert "recorded boot spreads: 1 of 1" in out.read_text()


def test_metrics_a_decode_only_a_a_left_out_are_counted_apart_not_as_noise_or_as_a_pass(tmp_path):
    """workloads-gpu-decode.yaml leaves the prefill metrics of a quick-set baseline unmeasured: the decode verdicts
    decide the boot, the left-out ones are reported as such, and a boot that measured nothing passes nothing."""
    left_out = {**_v("inconclusive"), "reason": "not_measured"}
    assert gates_summary.aa_passed([_v("pass")] + [left_out] * 6)
    assert not gates_summary.aa_passed([left_out] * 6)
    assert not gates_summary.aa_passed([{**_v("pass"), "kind": "memory"}, {**_v("pass"), "kind": "capacity"}, left_out])
    assert not gates_summary.aa_passed([_v("pass"), left_out, _v("inconclusive"), _v("inconclusive")])
    assert not gates_summary.aa_passed([_v("fail")] + [left_out] * 6)
    (tmp_path / "aa1" / "verdicts").mkdir(parents=True)
    (tmp_path / "aa1" / "verdicts" / "x.json").write_text(json.dumps([_v("pass"), left_out, left_out]))
    out = tmp_path / "summary.md"
    assert gates_summary.main(tmp_path, out) == 0
    text = out.read_text()
    assert "recorded boot spreads: 1 of 1 (0 inconclusive verdicts in all; 2 baseline metrics not measured" in text


SHARED_HOST_AA = REPO / "docs/evidence/sm_90-2026-11-30-h200-x2/gates-gemv-bf16"


def test_an_a_a_that_failed_on_the_host_side_only_is_not_clean_and_is_named_apart(tmp_path):
    """gemv-bf16 on GPU 0 of a 2-GPU H200 host while GPU 1 served another vLLM (2026-11-30): engine-clock tg128 failed,
    its kernels held. Not a passing A/A, and the summary says the host was the side that slowed; a kernel failure in
    the same boot is not the host's."""
    from harness.perf import regression
    t = regression.load_thresholds(REPO / "baselines" / "thresholds.yaml", "sm_90")
    base, a_a = (json.loads((SHARED_HOST_AA / f).read_text()) for f in ("baseline-results.json", "aa1-results.json"))
    vs = [v.to_json() for v in regression.compare_run(base, a_a, t)]
    assert not gates_summary.aa_passed(vs) and gates_summary.host_side_only(vs)
    kernel_fail = [{**v, "status": "fail", "reason": "regression"} if v["name"] == "tg128_gpu" else v for v in vs]
    assert not gates_summary.host_side_only(kernel_fail)
    assert not gates_summary.host_side_only([_v("pass")])
    (tmp_path / "aa1" / "verdicts").mkdir(parents=True)
    (tmp_path / "aa1" / "verdicts" / "x.json").write_text(json.dumps(vs))
    out = tmp_path / "summary.md"
    assert gates_summary.main(tmp_path, out) == 0
    text = out.read_text()
    assert "recorded boot spreads: 0 of 1" in text and "1 failed on the host side only" in text


def _curve(status_small: dict, status_large: dict, ratios: dict) -> dict:
    point = lambda f, st: {"fraction": f, "expected_ratio": round(1 / (1 + f), 4), "measured_ratio": ratios,  # noqa: E731
                           "status": st}
    return {"decode_step_ms": 1.5, "decode_step_from": "tg128_gpu", "prefill_metric": "pp2048_gpu", "prefill_ms": 51.4,
            "prefill_tokens": 2048, "rounds_per_side": 16, "prefill_rounds_per_side": 8,
            "thresholds": {"throughput_drop": 0.03}, "points": [point(0.02, status_small), point(0.05, status_large)]}


def _summarise(tmp_path, curve: dict) -> str:
    """The summary of a run dir whose one phase, `hooked`, recorded `curve`."""
    (tmp_path / "hooked" / "sensitivity").mkdir(parents=True, exist_ok=True)
    (tmp_path / "hooked" / "sensitivity" / "m__c.json").write_text(json.dumps(curve))
    out = tmp_path / "summary.md"
    assert gates_summary.main(tmp_path, out) == 0
    return out.read_text()


def test_a_host_bound_curve_reports_its_engine_clock_unjudged_and_is_decided_by_its_gated_metrics(tmp_path):
    """The curve of a host-bound decode judges tg128_gpu and only measures tg128 (no status): the summary and the run
    report print that row as not judged, and the curve passes on its gated metrics alone; one of them not failing
    at 5% makes it fail."""
    from harness.report import run_report
    ratios = {"tg128": 1.0, "tg128_gpu": 0.952, "pp2048_gpu": 0.952}
    good = _curve({"tg128_gpu": "pass", "pp2048_gpu": "pass"}, {"tg128_gpu": "fail", "pp2048_gpu": "fail"}, ratios)
    text = _summarise(tmp_path, good)
    assert "| 5% | tg128 | 0.9524 | 1.0000 | measured, not judged" in text and "tg128_gpu step 1.5 ms" in text
    assert "passes on decode and prefill: yes" in text
    assert any("tg128 | 0.9524 | 1.0000 | measured, not judged" in line
               for line in run_report.sensitivity_lines(tmp_path / "hooked"))
    bad = _curve(good["points"][0]["status"], {"tg128_gpu": "inconclusive", "pp2048_gpu": "fail"}, ratios)
    assert "passes on decode and prefill: NO" in _summarise(tmp_path, bad)


def test_a_curve_that_recorded_its_judgement_is_summarised_by_it(tmp_path):
    """A curve JSON carries the test's own problems and notes (curve_problems): a noisy engine clock excused by its
    kernel twin reads as passing with its note, and a recorded problem reads as failing, whatever the statuses."""
    ratios = {"tg128": 0.94, "tg128_gpu": 0.952, "pp2048_gpu": 0.952}
    excused = {**_curve({"tg128": "inconclusive", "tg128_gpu": "pass", "pp2048_gpu": "pass"},
                        {"tg128": "inconclusive", "tg128_gpu": "fail", "pp2048_gpu": "fail"}, ratios),
               "problems": [], "notes": ["5% slower: tg128 could not resolve the gate for noise; its twin did"]}
    text = _summarise(tmp_path, excused)
    assert "passes on decode and prefill: yes" in text and "- note: 5% slower: tg128 could not resolve" in text
    text = _summarise(tmp_path, {**excused, "problems": ["2% slower was inconclusive on tg128"]})
    assert "passes on decode and prefill: NO" in text and "- problem: 2% slower" in text


def test_a_curve_point_that_added_rounds_for_its_cv_says_how_many(tmp_path):
    """The curve adds ABBA rounds to a noisy metric (CurveSpec.max_rounds): its row says how many it ran and added,
    and a metric at its planned rounds, or a curve recorded before, reads as before."""
    ratios = {"tg128": 0.981, "tg128_gpu": 0.980, "pp2048_gpu": 0.980}
    curve = _curve({"tg128": "pass", "tg128_gpu": "pass", "pp2048_gpu": "pass"},
                   {"tg128": "fail", "tg128_gpu": "fail", "pp2048_gpu": "fail"}, ratios)
    curve["points"][0].update(rounds_per_side={"tg128": 41, "tg128_gpu": 8, "pp2048_gpu": 8}, extra_rounds={"tg128": 25})
    text = _summarise(tmp_path, curve)
    assert "| 2% | tg128 | 0.9804 | 0.9810 | pass (41 rounds per side, 25 added for its CV) |" in text, text
    assert "| 2% | tg128_gpu | 0.9804 | 0.9800 | pass |" in text and "| 5% | tg128 | 0.9524 | 0.9810 | fail |" in text


def test_each_boot_line_says_how_fast_the_hosts_cpu_ran():
    assert gates_summary._host_cpu({}) == "host CPU not timed"
    assert gates_summary._host_cpu({"host_cpu": {"available": False, "reason": "x"}}) == "host CPU not timed"
    line = gates_summary._host_cpu({"host_cpu": {"available": True, "median_us": 1708.2, "cv": 0.21, "cpus": [1, 15],
                                                 "loop_us": [1012.0, 1708.2, 1750.0]}})
    assert line == ("host CPU loop 1708 us median over 3 rounds, CV 21.0% (the CPU changed speed or load: a steady one "
                    "stays under 15%), on CPUs 1, 15")
    steady = gates_summary._host_cpu({"host_cpu": {"available": True, "median_us": 1012.0, "cv": 0.028, "cpus": [3],
                                                   "loop_us": [1012.0, 990.0, 1040.0]}})
    assert steady == "host CPU loop 1012 us median over 3 rounds, CV 2.8%, on CPUs 3"


def test_the_done_when_line_counts_the_a_a_boots_whose_host_cpu_changed_speed(tmp_path):
    """The recorded H200 A/A of 2026-12-03 (loop CV 24.8%) is named; the same boot with a steady loop is not."""
    evidence = REPO / "docs" / "evidence" / "sm_90-2026-12-03-h200-mxfp4all-rebaseline"
    results = json.loads((evidence / "aa1-results.json").read_text())
    verdicts = json.loads((evidence / "aa1-verdicts.json").read_text())
    for cv, named in ((0.248, True), (0.03, False)):
        run = tmp_path / f"cv{cv}" / "aa1"
        (run / "results").mkdir(parents=True)
        (run / "verdicts").mkdir()
        (run / "results" / "gpt-oss-120b-shape__gemv-bf16-mxfp4-all.json").write_text(json.dumps({**results, "host_cpu": {**results["host_cpu"], "cv": cv}}))
        (run / "verdicts" / "r.json").write_text(json.dumps(verdicts))
        gates_summary.main(run.parent, run.parent / "summary.md")
        text = (run.parent / "summary.md").read_text()
        assert ("in 1 of the 1 boots the host's CPU changed speed or load (its loop's CV above 15%)" in text) is named


def test_a_truncated_results_file_is_one_line_naming_it(tmp_path):
    """A phase killed while writing its results once left a file that ended the summary with a JSONDecodeError
    traceback; the summary is written by every phase, so that lost the evidence page too."""
    import subprocess
    import sys

    run = tmp_path / "aa1" / "results"
    run.mkdir(parents=True)
    broken = run / "gpt-oss-120b-shape__marlin-bf16.json"
    broken.write_text('{"config": "marlin-bf16", "metrics": {"tg32": {"samp')
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), str(tmp_path / "summary.md")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot read results {broken} (JSONDecodeError); rerun level 4" in r.stderr
