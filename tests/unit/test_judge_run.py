"""scripts/judge_run.py: a stored level 4 run judged against a baseline file by level 5's gate, both ways (an
unchanged run passes, an injected kernel slowdown or memory growth fails with exit 1), and bad input refused in
one line (exit 2). The baseline is the committed H200 one of gemv-bf16 on the 120b shape: real samples, real
spreads."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import judge_run  # noqa: E402

from harness.perf.baselines import load_baseline  # noqa: E402

BASELINE = REPO / "baselines" / "nvidia-h200" / "gpt-oss-120b-shape" / "gemv-bf16.yaml"


def run_dir(tmp_path: Path, results: dict, name: str = "gpt-oss-120b-shape__gemv-bf16.json") -> Path:
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True, exist_ok=True)
    (run / "results" / name).write_text(json.dumps(results))
    return run


def rerun(scale: float = 1.0, metric: str | None = None, **over) -> dict:
    """The baseline's own measurements as a new run's results: every sample x 1.0005 (a run is never bit-equal),
    `metric`'s samples x `scale`, top-level fields replaced by `over`."""
    results = copy.deepcopy(load_baseline(BASELINE))
    for name, entry in results["metrics"].items():
        f = 1.0005 * (scale if name == metric else 1.0)
        entry["samples"] = [s * f for s in entry["samples"]]
    results["valid"] = True
    results.update(over)
    return results


def test_an_unchanged_run_passes_and_its_verdicts_are_written_for_the_gates_summary(tmp_path, capsys):
    run = run_dir(tmp_path, rerun())
    rc = judge_run.main([str(run), "--baseline", str(BASELINE), "--out", str(tmp_path / "judged")])
    out = capsys.readouterr().out
    assert rc == 0, out
    verdicts = json.loads((tmp_path / "judged" / "verdicts" / "gpt-oss-120b-shape__gemv-bf16.json").read_text())
    assert not [v for v in verdicts if v["status"] == "fail"], out
    assert {v["name"] for v in verdicts} >= {"tg32_gpu", "pp2048_gpu", "memory_used_gib", "kv_capacity_tokens"}
    assert (tmp_path / "judged" / "results" / "gpt-oss-120b-shape__gemv-bf16.json").is_file()


@pytest.mark.parametrize("metric", ["tg32_gpu", "pp2048_gpu"])
def test_a_kernel_time_slowdown_of_five_percent_fails_with_exit_1(tmp_path, capsys, metric):
    rc = judge_run.main([str(run_dir(tmp_path, rerun(0.95, metric))), "--baseline", str(BASELINE)])
    out = capsys.readouterr().out
    assert rc == 1, out
    failed = [ln for ln in out.splitlines() if ln.strip().startswith("fail ")]
    assert len(failed) == 1 and f" {metric} " in failed[0], out


def test_used_memory_grown_by_1_5_gib_fails(tmp_path, capsys):
    base = load_baseline(BASELINE)
    rc = judge_run.main([str(run_dir(tmp_path, rerun(memory_used_gib=base["memory_used_gib"] + 1.5))),
                         "--baseline", str(BASELINE)])
    out = capsys.readouterr().out
    assert rc == 1 and "used memory" in out.split("gate failure")[-1], out


def one_line(capsys, argv: list[str]) -> str:
    rc = judge_run.main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("judge_run: ") and "Traceback" not in out + err, (out, err)
    return lines[0]


def test_a_directory_without_results_names_what_to_pass(tmp_path, capsys):
    line = one_line(capsys, [str(tmp_path), "--baseline", str(BASELINE)])
    assert "results/<model>__gemv-bf16.json" in line and "--run-dir" in line, line


def test_a_run_of_other_configs_names_what_it_holds(tmp_path, capsys):
    run = run_dir(tmp_path, rerun(config="triton-bf16"), "gpt-oss-120b-shape__triton-bf16.json")
    line = one_line(capsys, [str(run), "--baseline", str(BASELINE)])
    assert "no results/<model>__gemv-bf16.json" in line and "gpt-oss-120b-shape__triton-bf16" in line, line


def test_the_baselines_config_is_judged_not_another_config_nor_a_side_servers_boot(tmp_path, capsys):
    """A run of several configs, with a server booted beside the shared one (level 4's n-gram speculator writes
    <model>__<config>__ngram.json): the baseline's own config is judged; a slowed side boot or another config in the
    same run dir changes nothing."""
    run_dir(tmp_path, rerun(0.5, "tg32_gpu", config="triton-bf16"), "gpt-oss-120b-shape__triton-bf16.json")
    run_dir(tmp_path, rerun(0.5, "tg32_gpu"), "gpt-oss-120b-shape__gemv-bf16__ngram.json")
    run = run_dir(tmp_path, rerun())
    assert judge_run.main([str(run), "--baseline", str(BASELINE)]) == 0, capsys.readouterr().out
    run_dir(tmp_path, rerun(0.95, "tg32_gpu"))  # the config's own results slowed: now it fails
    assert judge_run.main([str(run), "--baseline", str(BASELINE)]) == 1


def test_results_of_one_config_for_two_models_are_refused(tmp_path, capsys):
    run_dir(tmp_path, rerun())
    run = run_dir(tmp_path, rerun(model="gpt-oss-20b-shape"), "gpt-oss-20b-shape__gemv-bf16.json")
    assert "2 models" in one_line(capsys, [str(run), "--baseline", str(BASELINE)])


@pytest.mark.parametrize("typo", ["gemv-bf16.yml", "gemv-bf16", "gemv_bf16.yaml"])
def test_a_mistyped_baseline_path_says_no_such_file_and_names_the_committed_one(tmp_path, capsys, typo):
    """It said 'no baseline at ...; record one with: pytest -m level5 --config=<the typo's stem> --force-regen
    --model=<its folder>': a recording of a config that does not exist, for a file that was only mistyped."""
    line = one_line(capsys, [str(run_dir(tmp_path, rerun())), "--baseline", str(BASELINE.parent / typo)])
    assert "no such file" in line and "baselines/<platform-key>/<model>/<config>.yaml" in line, line
    assert "baselines/nvidia-h200/gpt-oss-120b-shape/gemv-bf16.yaml" in line and "--force-regen" not in line, line


def test_a_baseline_folder_is_not_a_file_and_its_baselines_are_named(tmp_path, capsys):
    line = one_line(capsys, [str(run_dir(tmp_path, rerun())), "--baseline", str(BASELINE.parent)])
    assert "not a file" in line and "gpt-oss-120b-shape/gemv-bf16.yaml" in line, line


def test_a_corrupt_baseline_names_the_file_and_the_fix(tmp_path, capsys):
    bad = tmp_path / "gemv-bf16.yaml"
    bad.write_text("metrics: [unclosed\n")
    line = one_line(capsys, [str(run_dir(tmp_path, rerun())), "--baseline", str(bad)])
    assert str(bad) in line and "--force-regen" in line, line


@pytest.mark.parametrize("where, said", [("nope", "no such directory"), ("file", "not a directory")])
def test_a_run_dir_that_is_not_a_folder_says_so(tmp_path, capsys, where, said):
    """It said "<path> has no results/<model>__gemv-bf16.json (results there: none)" of a path that does not exist."""
    run = tmp_path / where
    if where == "file":
        run.write_text("x")
    line = one_line(capsys, [str(run), "--baseline", str(BASELINE)])
    assert line == (f"judge_run: RUN_DIR {run}: {said}; pass the run directory of a level 4 run of gemv-bf16 (its "
                    "--run-dir, or runs/<stamp>)"), line


def test_corrupt_results_name_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    (run / "results" / "gpt-oss-120b-shape__gemv-bf16.json").write_text("{not json")
    line = one_line(capsys, [str(run), "--baseline", str(BASELINE)])
    assert "gpt-oss-120b-shape__gemv-bf16.json" in line and "rerun level 4" in line, line


@pytest.mark.parametrize("key, value", [("device", 5), ("platform", None), ("config", ["gemv-bf16"])])
def test_results_whose_names_are_not_strings_name_the_file(tmp_path, capsys, key, value):
    """`"device": 5` was an AttributeError traceback from slugging it into the baseline's platform key."""
    line = one_line(capsys, [str(run_dir(tmp_path, rerun(**{key: value}))), "--baseline", str(BASELINE)])
    assert "gpt-oss-120b-shape__gemv-bf16.json" in line and f"`{key}`" in line and "rerun level 4" in line, line


def test_results_of_another_gpu_are_refused_not_judged(tmp_path, capsys):
    line = one_line(capsys, [str(run_dir(tmp_path, rerun(device="NVIDIA H100 80GB HBM3"))), "--baseline", str(BASELINE)])
    assert "nvidia-h100" in line and "nvidia-h200" in line, line


def test_out_that_is_the_run_directory_itself_is_refused_and_its_verdicts_kept(tmp_path, capsys):
    run = run_dir(tmp_path, rerun())
    (run / "verdicts").mkdir()
    (run / "verdicts" / "gpt-oss-120b-shape__gemv-bf16.json").write_text("[]")
    assert "run directory itself" in one_line(capsys, [str(run), "--baseline", str(BASELINE), "--out", str(run)])
    assert (run / "verdicts" / "gpt-oss-120b-shape__gemv-bf16.json").read_text() == "[]"
