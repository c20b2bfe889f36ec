"""The one record/compare store (harness/core/store.py) behind goldens and baselines: records of another vLLM
flavour or other weights are refused by name, every run keeps what it obtained, --force-regen is this suite's."""
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.core.store import Regenerated, Store
from harness.correctness.goldens import GoldenStore
from harness.perf.baselines import BaselineStore, save_baseline
from harness.perf.regression import Thresholds, compare_run

REPO = Path(__file__).resolve().parents[2]


def golden_store(tmp_path, flavour, regen=False, run_dir=None):
    meta = {"model": "tiny", "flavour": flavour}
    return GoldenStore("tiny", "sm_121", "gemv-bf16", meta, regen, root=tmp_path / "goldens", run_dir=run_dir)


def test_a_golden_of_another_flavour_is_refused_by_name(tmp_path):
    with pytest.raises(Regenerated):
        golden_store(tmp_path, "fork", regen=True).save("level2", {"x": 1})
    assert golden_store(tmp_path, "fork").load("level2", "level2") == {"x": 1}  # A/A: same flavour
    with pytest.raises(SuiteError, match=r"recorded under the fork flavour, this run is upstream.*moe=gemv.*"
                                         r"regenerate it: pytest -m level2 --config=gemv-bf16 --force-regen --model=tiny"):
        golden_store(tmp_path, "upstream").load("level2", "level2")


def test_a_golden_copied_into_another_models_or_platforms_folder_is_refused_by_name(tmp_path):
    """Real checkpoints have no fingerprint: a golden of another model or platform, copied into this folder, was
    judged without a word. Its own meta names where it belongs."""
    import json

    with pytest.raises(Regenerated):
        golden_store(tmp_path, "fork", regen=True).save("level2", {"x": 1})
    path = golden_store(tmp_path, "fork").path("level2")
    golden = json.loads(path.read_text())
    for key, other in (("model", "gpt-oss-120b"), ("platform", "cpu")):
        path.write_text(json.dumps({**golden, "meta": {**golden["meta"], key: other}}))
        with pytest.raises(SuiteError, match=f"recorded for {key} {other}, this run's is .*regenerate it") as e:
            golden_store(tmp_path, "fork").load("level2", "level2")
        assert "\n" not in str(e.value)
    path.write_text(json.dumps(golden))
    assert golden_store(tmp_path, "fork").load("level2", "level2") == {"x": 1}  # where it belongs: loaded


def test_force_regen_never_reads_the_stored_golden_it_replaces(tmp_path):
    """Under --force-regen `load` hands back nothing, so `settle` records the fresh result: a store that read the old
    golden there compared the run with it and recorded nothing, and a missing golden stopped the regeneration."""
    assert golden_store(tmp_path, "fork", regen=True).load("level2", "level2") is None  # none stored yet: no error
    with pytest.raises(Regenerated):
        golden_store(tmp_path, "fork", regen=True).save("level2", {"x": 1})
    regen = golden_store(tmp_path, "fork", regen=True)
    assert regen.load("level2", "level2") is None
    with pytest.raises(Regenerated):
        regen.settle("level2", regen.load("level2", "level2"), {"x": 2})
    assert golden_store(tmp_path, "fork").load("level2", "level2") == {"x": 2}


def test_a_golden_without_data_or_failing_its_check_is_refused_by_name(tmp_path):
    """A golden whose `data` is gone (a hand edit) or whose data fails the level's own check (`check`, e.g. a
    truncated stream) is refused with the regenerate command, never compared with."""
    import json

    with pytest.raises(Regenerated):
        golden_store(tmp_path, "fork", regen=True).save("level2", {"x": 1})
    store = golden_store(tmp_path, "fork")

    def check(data, where):
        if data != {"x": 1}:
            raise SuiteError(f"{where}: x is not 1; regenerate it")
        return data
    assert store.load("level2", "level2", check) == {"x": 1}  # a good golden passes its check
    path = store.path("level2")
    golden = json.loads(path.read_text())
    path.write_text(json.dumps({**golden, "data": {"x": 2}}))
    with pytest.raises(SuiteError, match="x is not 1"):
        store.load("level2", "level2", check)
    path.write_text(json.dumps({k: v for k, v in golden.items() if k != "data"}))
    with pytest.raises(SuiteError, match="lacks schema 2 / meta / data.*regenerate: pytest -m level2") as e:
        store.load("level2", "level2")
    assert "\n" not in str(e.value)


def results(flavour, **extra):
    tg = {"samples": [50.0, 51.0, 50.5], "unit": "tok/s", "higher_is_better": True}
    return {"config": "gemv-bf16", "flavour": flavour, "model": "tiny", "platform": "cpu", "device": "AMD EPYC",
            "valid": True, "metrics": {"tg32": tg}, "memory_peak_gb": None, "memory_used_gib": None,
            "kv_capacity_tokens": None, **extra}


def test_a_baseline_of_another_flavour_is_refused_by_name(tmp_path):
    path = save_baseline(tmp_path / "gemv-bf16.yaml", results("fork"))
    from harness.perf.baselines import load_baseline

    base = load_baseline(path)
    assert base["flavour"] == "fork"
    assert compare_run(base, results("fork"), Thresholds())  # A/A: judged
    with pytest.raises(SuiteError, match=r"baseline was recorded under the fork flavour, this run is upstream.*"
                                         r"re-record it with: pytest -m level5 --config=gemv-bf16 --force-regen"):
        compare_run(base, results("upstream"), Thresholds())
    legacy = {k: v for k, v in base.items() if k != "flavour"}  # recorded before flavours were kept: judged
    assert compare_run(legacy, results("upstream"), Thresholds())


def test_every_run_keeps_what_it_obtained_and_regen_records_it(tmp_path):
    run = tmp_path / "run"
    store = golden_store(tmp_path, "cpu", run_dir=run)
    with pytest.raises(Regenerated):
        golden_store(tmp_path, "cpu", regen=True, run_dir=run).settle("level2", None, {"x": 1})
    assert store.settle("level2", store.load("level2", "level2"), {"x": 2}) == {"x": 1}  # compared with the record
    obtained = run / "obtained" / "level2.json"  # outside the repository: under the record's file name
    assert '"x":2' in obtained.read_text().replace(" ", "")  # the fresh result, not the record


def test_a_baseline_is_recorded_only_when_the_run_may_record(tmp_path):
    path = tmp_path / "baselines" / "gemv-bf16.yaml"
    refused = BaselineStore(path, Store(tmp_path / "run", True, lambda: "its kernel path failed level 1.5"))
    with pytest.raises(SuiteError, match="--force-regen refused for gemv-bf16: its kernel path failed"):
        refused.settle(results("cpu"))
    assert not path.exists() and (tmp_path / "run" / "obtained" / "gemv-bf16.yaml").is_file()
    with pytest.raises(Regenerated, match="recorded"):
        BaselineStore(path, Store(None, True)).settle(results("cpu"))
    assert BaselineStore(path, Store(None, False)).settle(results("cpu"))["flavour"] == "cpu"


def test_force_regen_is_this_suites_option_and_regen_all_is_refused():
    """--force-regen is registered by this project (not borrowed from an installed pytest-regressions), and
    pytest-regressions' --regen-all, which this suite would silently ignore, is an unknown argument."""
    from harness.plugin import options

    assert "--force-regen" in Path(options.__file__).read_text()
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--regen-all", "--collect-only",
                          "-q", "tests/unit/test_stats.py"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "unrecognized arguments: --regen-all" in run.stderr


def test_goldens_of_keeps_each_running_configs_fresh_copy_in_its_own_folder(tmp_path):
    """--goldens-of=triton-bf16 judges several configs against one config's goldens: each fresh copy goes to its own
    config's path (they overwrote each other at the target's path, the last config's output left)."""
    run = tmp_path / "run"
    for config in ("gemv-bf16", "marlin-bf16"):
        store = GoldenStore("tiny", "cpu", "triton-bf16", {"model": "tiny", "config": config}, False,
                            root=REPO / "goldens", run_dir=run)
        assert store.settle("level2", {"x": 1}, {"x": config}) == {"x": 1}
    for config in ("gemv-bf16", "marlin-bf16"):
        assert f'"x": "{config}"' in (run / "obtained" / "goldens" / "tiny" / "cpu" / config / "level2.json").read_text()
    assert not (run / "obtained" / "goldens" / "tiny" / "cpu" / "triton-bf16").exists()


def test_a_record_with_a_fingerprint_never_judges_a_model_without_one(tmp_path):
    """A plain checkpoint folder named like the embedded model has no fingerprint: the record of the fingerprinted
    weights must not judge it (nor, at --force-regen, be overwritten by it: resolve_model refuses that name)."""
    from harness.core.store import identity_problem

    assert identity_problem({"model_fingerprint": "163c8eae3f65"}, {"model_fingerprint": None}, "golden g", "tiny-gpt-oss")
    assert identity_problem({"model_fingerprint": None}, {"model_fingerprint": None}, "golden g", "gpt-oss-120b") is None
    assert identity_problem({"model_fingerprint": "a"}, {"model_fingerprint": "a"}, "golden g", "tiny") is None


def test_a_checkpoint_folder_named_like_a_model_alias_is_refused(tmp_path):
    from harness.engine.models import resolve_model

    folder = tmp_path / "other" / "tiny-gpt-oss"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(SuiteError, match="named like the suite's model alias tiny-gpt-oss.*rename the folder") as e:
        resolve_model(str(folder), tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / "my-ckpt").mkdir()
    (tmp_path / "my-ckpt" / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path / "my-ckpt"), tmp_path).alias == "my-ckpt"


@pytest.mark.parametrize("obstacle", ["folder at the file", "file at the folder"])
def test_a_record_that_cannot_be_written_is_one_line(tmp_path, obstacle):
    from harness.core.store import write_atomic

    path = tmp_path / "goldens" / "tiny" / "level2.json"
    if obstacle == "folder at the file":
        path.mkdir(parents=True)
    else:
        path.parent.parent.mkdir(parents=True)
        path.parent.write_text("a file where the config folder goes")
    with pytest.raises(SuiteError, match="cannot write .*remove what is in the way") as e:
        write_atomic(path, "{}")
    assert "\n" not in str(e.value)
    assert [p.name for p in path.parent.glob(".*.tmp")] == [] if path.parent.is_dir() else True


def test_written_records_are_readable_by_the_checkouts_other_users(tmp_path):
    from harness.core.store import write_atomic

    write_atomic(tmp_path / "b.yaml", "x: 1\n")
    assert (tmp_path / "b.yaml").stat().st_mode & 0o044 == 0o044


def test_a_repeated_key_in_a_baseline_or_golden_is_one_line_not_the_last_value(tmp_path):
    import json

    from harness.correctness.goldens import load_golden
    from harness.perf.baselines import load_baseline

    path = save_baseline(tmp_path / "gemv-bf16.yaml", results("cpu", memory_used_gib=5.2687))
    path.write_text(path.read_text() + "memory_used_gib: 0.001\n")
    with pytest.raises(SuiteError, match="appears twice") as e:
        load_baseline(path)
    assert "\n" not in str(e.value)
    golden = tmp_path / "level2.json"
    golden.write_text('{"schema": 2, "meta": {}, "data": {"a": 1, "a": 2}}')
    with pytest.raises(SuiteError, match="corrupt .*appears twice") as e:
        load_golden(golden, "pytest -m level2 --force-regen")
    assert "\n" not in str(e.value) and json.loads('{"a": 1}')


def test_a_comparison_run_with_an_unresolved_metric_is_judged_not_refused_as_a_baseline(tmp_path):
    """Results that could not become a baseline (a metric unresolved at the loaded clock) are still compared with the
    stored one; the error told the user to re-record a baseline that was fine."""
    path = save_baseline(tmp_path / "gemv-bf16.yaml", results("cpu"))
    fresh = results("cpu")
    fresh["metrics"]["tg32"] = {**fresh["metrics"]["tg32"], "unresolved": "2 of 5 rounds at the loaded clock"}
    assert BaselineStore(path, Store(tmp_path / "run", False)).settle(fresh)["config"] == "gemv-bf16"
    with pytest.raises(SuiteError, match="unresolved"):  # recording it is still refused
        BaselineStore(path, Store(tmp_path / "run", True)).settle(fresh)


def test_the_forks_records_live_apart_so_both_flavours_records_coexist_on_one_machine(tmp_path):
    """configs/nightly.yaml runs sets for the fork and for upstream vLLM on the same GB10, sharing config names
    (marlin-bf16, gemm-mxfp8). In one folder each flavour's records refused the other's, and regenerating one erased
    the other. The fork's flavour file keeps its records apart (`<platform>-fork`); upstream and cpu keep theirs."""
    from harness.config.catalog import Catalog

    from harness.core.platform import Platform
    from harness.session.suite import Suite

    cat = Catalog()
    assert cat.flavour("fork").records_suffix == "-fork"
    assert cat.flavour("upstream").records_suffix == "" and cat.flavour("cpu").records_suffix == ""
    gb10 = Platform("sm_121", "NVIDIA GB10", (12, 1))
    folders = {f: Suite(cat, gb10, cat.flavour(f), SuiteError("no model"), tmp_path, None).golden_folder()
               for f in ("fork", "upstream")}
    assert folders == {"fork": "sm_121-fork", "upstream": "sm_121"}  # what level 2 and level 6 record under

    def store(flavour, regen=False):
        meta = {"model": "tiny", "platform": "sm_121", "flavour": flavour}
        return GoldenStore("tiny", "sm_121", "marlin-bf16", meta, regen, root=tmp_path / "goldens",
                           folder="sm_121" + cat.flavour(flavour).records_suffix)

    for flavour, data in (("fork", {"x": 1}), ("upstream", {"x": 2})):
        with pytest.raises(Regenerated):
            store(flavour, regen=True).save("level2", data)
    assert store("fork").load("level2", "level2") == {"x": 1} and store("upstream").load("level2", "level2") == {"x": 2}
    assert store("fork").path("level2") == tmp_path / "goldens" / "tiny" / "sm_121-fork" / "marlin-bf16" / "level2.json"
    assert store("upstream").path("level2") == tmp_path / "goldens" / "tiny" / "sm_121" / "marlin-bf16" / "level2.json"


def test_a_flavour_files_records_value_other_than_shared_or_apart_is_one_line(tmp_path):
    import shutil

    from harness.config.catalog import CONFIG_DIR, Catalog

    shutil.copytree(CONFIG_DIR, tmp_path / "configs")
    fork = tmp_path / "configs" / "flavours" / "fork.yaml"
    fork.write_text(fork.read_text().replace("records: apart", "records: separate"))
    with pytest.raises(SuiteError, match=r"fork.yaml: records: 'separate'; expected shared .* or apart") as e:
        Catalog(tmp_path / "configs", verified_dir=tmp_path / "configs" / "verified")
    assert "\n" not in str(e.value)
