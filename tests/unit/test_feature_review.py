"""The review file (docs/porting/FEATURE_<name>.md, the users' template): measured sections regenerated from a
result, hand-written sections kept byte for byte; the matrix and the verdict JSON."""
import json

import pytest

from harness.core.errors import SuiteError
from harness.features.judge import Status, judge_number, judge_samples
from harness.features.levels import LevelOutcome, read_junit, run_levels
from harness.features.measure import Side
from harness.features.review import split_sections, write_matrix, write_review, write_verdicts
from harness.features.run import FeatureResult
from harness.features.spec import load_features


def result(tmp_path, tg_ratio=1.2, status=None):
    f = load_features()["cpu-compiled-decode"]
    base, cand = Side("baseline", f.baseline), Side("candidate", f.candidate)
    base.add("tg32", [100.0, 101.0, 99.0, 100.5]), cand.add("tg32", [100.0 * tg_ratio + d for d in (0, 1, -1, 0.5)])
    for s, used in ((base, 4.0), (cand, 4.1)):
        s.number("used_memory", used), s.number("kv_capacity", 30000)
    crit = {c.metric: c for c in f.criteria}
    verdicts = [judge_samples(crit["tg32"], base.value("tg32"), cand.value("tg32")),
                judge_number(crit["used_memory"], 4.0, 4.1), judge_number(crit["kv_capacity"], 30000, 30000)]
    levels = {"level1": LevelOutcome(passed=5), "level1_5": LevelOutcome(passed=3, failed=1, first_failures=["x: y"])}
    return FeatureResult(f, status or Status.PASS, verdicts, levels, [], Status.PASS, [base, cand], "cpu", "test cpu",
                         "cpu", "tiny-gpt-oss", "ABBA, both servers up", 4, False, str(tmp_path / "run"))


HAND = "## Source Files Changed\n- `vllm/x.py` - a hand-written line   with odd  spacing\n\n\n"
NOTES = "## Implementation Notes\nTrade-off: kept *exactly*.\n```\n## not a heading inside a fence? kept anyway\n```\n\n"


def test_a_new_review_has_the_users_template_sections(tmp_path):
    path = write_review(result(tmp_path), tmp_path)
    text = path.read_text()
    headings = [h for h, _ in split_sections(text)[1]]
    assert headings[:6] == ["REQUIRED: Hypothesis (1 sentence)", "REQUIRED: Success Criteria (hard numbers)",
                            "Source Files Changed", "Environment Variables Added", "Implementation Notes",
                            "REQUIRED: Areas for Improvement"]
    assert "| Metric | Baseline | Target | Actual |" in text and "| tg32 |" in text and ">= +10%" in text
    assert "Level 1.5 (Kernel Validation): FAIL" in text and "x: y" in text
    # memory against a GB criterion reads in GB, as the users' template writes it ("memory increase <= 2 GB")
    assert "| used_memory | 4.00 GiB (cpu-bf16-eager) | <= +1 GB | 4.10 GiB (+0.11 GB) |" in text


def test_regenerating_keeps_every_hand_written_byte(tmp_path):
    path = write_review(result(tmp_path), tmp_path)
    text = path.read_text()
    pre, sections = split_sections(text)
    edited = pre + "".join(HAND if h == "Source Files Changed" else NOTES if h == "Implementation Notes" else s
                           for h, s in sections) + "## My own section\nkept too\n"
    path.write_text(edited)
    write_review(result(tmp_path, tg_ratio=0.8, status=Status.FAIL), tmp_path)  # a later run, other numbers
    again = path.read_text()
    assert HAND in again and NOTES in again and again.endswith("## My own section\nkept too\n")
    assert "❌ FAIL" in again and again != edited
    # a regeneration with the same result changes nothing (idempotent)
    write_review(result(tmp_path, tg_ratio=0.8, status=Status.FAIL), tmp_path)
    assert path.read_text() == again


def test_matrix_and_verdicts_cover_every_feature(tmp_path):
    r = result(tmp_path)
    m = write_matrix([r], tmp_path / "matrix.md").read_text()
    rows = [ln for ln in m.splitlines() if ln.startswith("| cpu-bf16")]
    assert rows[0].startswith("| cpu-bf16-eager | baseline") and rows[1].startswith("| cpu-bf16 | candidate")
    data = json.loads(write_verdicts([r], tmp_path / "verdicts.json").read_text())
    assert data["cpu-compiled-decode"]["status"] == "PASS" and data["cpu-compiled-decode"]["criteria"][0]["metric"] == "tg32"


def test_levels_are_read_per_folder_from_junit(tmp_path):
    (tmp_path / "j.xml").write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.level1_smoke.test_smoke" name="a"/>'
        '<testcase classname="tests.level1_smoke.test_smoke" name="b"><failure message="boom (CUDA out of memory); log x.log:&#10;(EngineCore) tail"/></testcase>'
        '<testcase classname="tests.level1_smoke.test_smoke" name="d"><error message="teardown: server left"/></testcase>'
        '<testcase classname="tests.level1_5_kernels.test_kernel_paths" name="c"><skipped message="why"/></testcase>'
        '<testcase classname="tests.level1_5_kernels.test_kernel_paths" name="e"><skipped type="pytest.xfail" message=""/></testcase>'
        '<testcase classname="tests.unit.test_stats" name="f"><failure message="not a level"/></testcase>'
        '</testsuite></testsuites>')
    out = read_junit(tmp_path / "j.xml", ("level1", "level1_5"))
    assert out["level1"].status == "FAIL" and out["level1"].first_failures == [  # one line each; an error fails too
        "b: boom (CUDA out of memory); log x.log:", "d: teardown: server left"]
    assert (out["level1"].passed, out["level1"].failed) == (1, 2)
    assert out["level1_5"].status == "NOT RUN"  # everything skipped is not a pass
    assert (out["level1_5"].skipped, out["level1_5"].xfailed, out["level1_5"].skip_reason) == (1, 1, "why")
    assert set(out) == {"level1", "level1_5"}  # a test outside the levels' folders counts nowhere


def test_a_child_level_run_refused_at_configure_says_why_in_one_line(tmp_path, monkeypatch):
    """A feature's level run of a baseline without level 2 goldens stops at configure (no junit.xml): its own line,
    not "wrote no readable junit.xml". --co: nothing may boot if it were not refused."""
    monkeypatch.setenv("SUITE_PLATFORM", "cpu")  # cpu-bf16-eager has no level 2 goldens on cpu
    with pytest.raises(SuiteError) as e:
        run_levels(("level2",), "cpu-bf16", "cpu-bf16-eager", "cpu", None, tmp_path, ["--co"], 300)
    message = str(e.value)
    assert message.startswith("the candidate's level run refused to start: ERROR: --goldens-of=cpu-bf16-eager: no "
                              "level 2 goldens of cpu-bf16-eager") and message.endswith(f"(see {tmp_path / 'pytest.log'})")
    assert "\n" not in message, message


def test_a_rerendered_review_keeps_the_baseline_its_run_judged_against(tmp_path):
    """`python -m harness.features.review verdict.json` re-renders a run's review from its JSON: the baseline named is
    the one that run measured (e.g. marlin-bf16 on GB10), never what configs/features.yaml would pick today."""
    from harness.features import review

    r = result(tmp_path)
    data = r.to_json()
    assert data["baseline"] == "cpu-bf16-eager"
    data["baseline"] = "cpu-bf16-noprefix"  # as if the file's baseline had changed since that run
    (tmp_path / "verdict.json").write_text(json.dumps(data))
    assert review.main([str(tmp_path / "verdict.json"), "--review-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "FEATURE_cpu-compiled-decode.md").read_text()
    assert "(cpu-bf16-noprefix)" in text and "(cpu-bf16-eager)" not in text


def test_the_host_cpu_loop_of_each_side_survives_the_verdict_file(tmp_path):
    """A review re-rendered from verdict.json judges with the same loop timings the run measured."""
    r = result(tmp_path)
    r.sides[1].host_loop_us.extend([1250.0, 2250.0, 1200.0])
    r.sides[1].host_cpus.append(5)
    r.sides[0].host_reason = "no engine core process found (an external server, or a vLLM without one)"
    again = FeatureResult.from_json(json.loads(json.dumps(r.to_json())), r.feature)
    assert again.sides[1].host_cpu() == r.sides[1].host_cpu() and again.sides[1].host_cpu()["cv"] > 0.15
    assert again.sides[0].host_cpu() == {"available": False, "reason": r.sides[0].host_reason}


def test_the_sequences_each_server_admitted_survive_the_verdict_file(tmp_path):
    """A re-rendered review still says when a concurrency criterion's requests queued (harness.features.run
    queued_note reads each side's --max-num-seqs)."""
    r = result(tmp_path)
    r.sides[0].max_num_seqs, r.sides[1].max_num_seqs = 2, 32
    again = FeatureResult.from_json(json.loads(json.dumps(r.to_json())), r.feature)
    assert [s.max_num_seqs for s in again.sides] == [2, 32]


def test_a_rerendered_review_shows_the_candidate_hypothesis_and_criteria_its_run_judged(tmp_path):
    """The candidate, hypothesis and criterion units of a re-rendered review come from the run's verdict.json: a
    review once named today's candidate and hypothesis beside numbers another candidate produced."""
    from harness.features import review

    data = result(tmp_path).to_json()
    data["candidate"] = "cpu-bf16-noprefix"
    data["hypothesis"] = "An older hypothesis that this run tested, in one sentence"
    (tmp_path / "verdict.json").write_text(json.dumps(data))
    assert review.main([str(tmp_path / "verdict.json"), "--review-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "FEATURE_cpu-compiled-decode.md").read_text()
    assert "An older hypothesis that this run tested" in text and "`cpu-bf16-noprefix`" in text
    assert "Candidate `cpu-bf16` " not in text


def test_a_baseline_row_shows_its_metrics_when_another_feature_leads_the_columns(tmp_path):
    """The matrix's columns are every feature's metrics in order; a baseline whose features lack the first column's
    metric once got an empty row, its measured tg32 included."""
    from dataclasses import replace

    from harness.features.spec import parse_criterion

    r = result(tmp_path)
    ttft = parse_criterion("ttft_p50 <= +10%")
    other_base, other_cand = Side("baseline", "cpu-bf16-nochunk"), Side("candidate", "cpu-bf16-noprefix")
    other_base.add(ttft.metric, [50.0, 51.0, 49.0, 50.5]), other_cand.add(ttft.metric, [50.0, 51.0, 49.0, 50.5])
    other = replace(r, feature=replace(r.feature, name="other", baseline="cpu-bf16-nochunk", candidate="cpu-bf16-noprefix",
                                       criteria=(ttft,)),
                    criteria=[judge_samples(ttft, other_base.value(ttft.metric), other_cand.value(ttft.metric))],
                    sides=[other_base, other_cand])
    m = write_matrix([other, r], tmp_path / "matrix.md").read_text()
    header = next(ln for ln in m.splitlines() if ln.startswith("| config"))
    assert [c.strip() for c in header.strip("|").split("|")][4:6] == [ttft.metric, "tg32"], header
    row = next(ln for ln in m.splitlines() if ln.startswith("| cpu-bf16-eager | baseline"))
    assert [c.strip() for c in row.strip("|").split("|")][5] == "100.2", row  # the median of the baseline's tg32


@pytest.mark.parametrize("case", ["missing", "not-json", "not-a-verdict", "unknown-feature", "review-dir-unwritable"])
def test_rerendering_bad_input_is_one_line(tmp_path, capsys, case):
    """A missing or non-JSON verdict file, an unknown feature (a SuiteError raised out of main) and a --review-dir it
    cannot write were each a traceback."""
    from harness.features import review

    verdict, review_dir = tmp_path / "verdict.json", str(tmp_path / "out")
    data = result(tmp_path).to_json()
    if case == "not-json":
        verdict.write_text("{cut")
    elif case == "not-a-verdict":
        verdict.write_text("[1, 2]")
    elif case == "unknown-feature":
        verdict.write_text(json.dumps({**data, "feature": "no-such-feature"}))
    elif case == "review-dir-unwritable":
        verdict.write_text(json.dumps(data))
        review_dir = "/proc/nope"
    assert review.main([str(verdict), "--review-dir", review_dir]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("review: ") and "Traceback" not in err, (out, err)


# -- mutation audit: what the review tells its reader, each with the fault it guards against --------------------------
def test_each_criterion_row_shows_its_own_verdict_and_the_change_with_its_sign(tmp_path):
    """Guards the evaluation table's per-criterion mark (a criterion that failed read as the feature's overall PASS) and
    the sign of the Actual column's change (a 20% slowdown read +20%)."""
    from harness.features.review import render

    text = render(result(tmp_path, tg_ratio=0.8, status=Status.PASS), None, tmp_path / "FEATURE_x.md")
    row = next(ln for ln in text.splitlines() if ln.startswith("| tg32 >="))
    assert "❌ FAIL" in row, f"the tg32 criterion failed: {row}"
    assert "| used_memory <= +1 GB | ✅ PASS |" in text
    actual = next(ln for ln in text.splitlines() if ln.startswith("| tg32 |"))
    assert "(-20.0%)" in actual, f"a slowdown reads negative: {actual}"
    assert "**Verdict: ✅ PASS**" in text


def test_the_verdict_gate_and_level_lines_say_what_happened(tmp_path):
    """Guards the review's verdict line (it once always read PASS), the gate rows for the next phase, a level's skip
    reason shown only when it did not run, and the 'blocked by' line of a blocked feature without levels."""
    from dataclasses import replace

    from harness.features.levels import LevelOutcome
    from harness.features.review import render

    r = result(tmp_path, tg_ratio=0.8, status=Status.FAIL)
    r.gate.append(r.criteria[0])
    r.levels["level2"] = LevelOutcome(skipped=3, skip_reason="no level 2 goldens")
    r.levels["level1"] = LevelOutcome(passed=5, skip_reason="not shown")
    text = render(r, None, tmp_path / "FEATURE_x.md")
    assert "**Verdict: ❌ FAIL**" in text, "the feature failed"
    assert "| gate for the next phase: tg32 >= +10% | ❌ FAIL |" in text, "the gate's rows are listed"
    assert "- Level 2 (Correctness): NOT RUN (0 passed, 0 failed, 3 skipped): no level 2 goldens" in text
    assert "- Level 1 (Smoke): PASS (5 passed, 0 failed, 0 skipped)\n" in text, "a level that ran shows no skip reason"
    blocked = replace(result(tmp_path, status=Status.BLOCKED), levels={}, blocked_by="phase-1")
    text = render(blocked, None, tmp_path / "FEATURE_x.md")
    assert "- not run: blocked by phase-1" in text and "no level required" not in text


def test_the_benchmark_table_shows_the_median_and_the_matrix_the_candidates_number(tmp_path):
    """Guards the Benchmark Results cell (the median of the side's samples, not another statistic) and the matrix's
    candidate cell (the candidate's value, not its baseline's)."""
    from harness.features.review import render

    r = result(tmp_path, tg_ratio=1.2)
    r.sides[1].value("tg32").append(1000.0)  # an outlier round: the median stays, a max or mean would not
    text = render(r, None, tmp_path / "FEATURE_x.md")
    row = next(ln for ln in text.splitlines() if ln.startswith("| cpu-bf16 | candidate |"))
    assert "120.50 (n=5)" in row.replace("120.5 (", "120.50 ("), row
    m = write_matrix([result(tmp_path, tg_ratio=1.2)], tmp_path / "matrix.md").read_text()
    cand = next(ln for ln in m.splitlines() if ln.startswith("| cpu-bf16 | candidate"))
    assert "120.2 ✅" in cand or "120 ✅" in cand, cand


def test_a_regenerated_last_section_keeps_a_final_newline(tmp_path):
    """Guards _keep_spacing's minimum of one newline: a review whose last (measured) section lost its final newline was
    rewritten without one, and the next section appended after it started on the same line."""
    from harness.features.review import render

    first = render(result(tmp_path), None, tmp_path / "FEATURE_x.md")
    again = render(result(tmp_path), first.rstrip("\n"), tmp_path / "FEATURE_x.md")
    assert again.endswith("\n") and again == first, repr(again[-80:])


def test_a_rerendered_review_keeps_its_runs_phase_and_moved_artifacts(tmp_path):
    """Guards _as_run's phase (a re-rendered review named today's phase) and --artifacts (a run's folder moved, e.g. a
    GPU machine's results copied here: the review must name where they now are)."""
    from harness.features import review

    data = result(tmp_path).to_json()
    data["phase"] = "9"
    (tmp_path / "verdict.json").write_text(json.dumps(data))
    moved = tmp_path / "elsewhere"
    assert review.main([str(tmp_path / "verdict.json"), "--review-dir", str(tmp_path / "out"),
                        "--artifacts", str(moved)]) == 0
    text = (tmp_path / "out" / "FEATURE_cpu-compiled-decode.md").read_text()
    assert "Phase 9. " in text, "the run's phase"
    assert f"`{moved / 'cpu-compiled-decode'}`" in text, "the artifacts' new place"
