"""One rule for every platform-keyed data file: the most specific matching selector wins, whatever the file's order.

A catch-all (`>=sm_80`, `default`) written before GB10's own entry must not shadow it: GB10 would then boot a default
config, judge a tolerance or a matrix base, or gate with thresholds that were written for another platform.
"""
from __future__ import annotations

import shutil

import pytest
import yaml

from harness.config.catalog import Catalog
from harness.core.paths import CONFIG_DIR, REPO
from harness.core.platform import best_selector, broadest_first
from harness.correctness.level2 import load_workload
from harness.matrix.combinations import load_matrix
from harness.perf.regression import load_thresholds


def _reordered(mapping: dict, first: str) -> dict:
    return {first: mapping[first], **{k: v for k, v in mapping.items() if k != first}}


@pytest.mark.parametrize("selectors", [[">=sm_80", "sm_12x", "sm_121"], ["sm_121", "sm_12x", ">=sm_80"],
                                       ["sm_12x", ">=sm_80", "sm_121"]])
def test_the_most_specific_selector_wins_in_any_order(selectors):
    assert best_selector(selectors, "sm_121") == "sm_121"
    assert best_selector(selectors, "sm_120") == "sm_12x"
    assert best_selector(selectors, "sm_90") == ">=sm_80"
    assert best_selector(selectors, "cpu") is None
    assert broadest_first(selectors, "sm_121") == [">=sm_80", "sm_12x", "sm_121"]


def test_equally_specific_selectors_keep_the_files_order():
    """Between equally specific selectors the file's first wins, whether one entry is picked or entries are layered."""
    assert best_selector(["sm_12x", "sm_1xx"], "sm_121") == "sm_12x"
    assert best_selector(["sm_1xx", "sm_12x"], "sm_121") == "sm_1xx"
    assert broadest_first(["sm_12x", "sm_1xx", ">=sm_80"], "sm_121") == [">=sm_80", "sm_1xx", "sm_12x"]


def test_layered_thresholds_break_ties_as_one_pick_does(tmp_path):
    path = tmp_path / "thresholds.yaml"
    path.write_text(yaml.safe_dump({"defaults": {}, "platforms": {"sm_12x": {"max_cv": 0.02},
                                                                  "sm_1xx": {"max_cv": 0.04}}}, sort_keys=False))
    assert load_thresholds(path, "sm_121").max_cv == 0.02


def test_default_config_with_a_catch_all_written_first(tmp_path):
    shutil.copytree(CONFIG_DIR, tmp_path / "configs")
    path = tmp_path / "configs" / "configs.yaml"
    text = path.read_text()
    old = 'defaults:            # what runs when --config is not given (the most specific matching selector wins)\n'
    catch_all = '  ">=sm_80": marlin-bf16\n'
    assert old in text and catch_all in text
    path.write_text(text.replace(catch_all, "", 1).replace(old, old + '  ">=sm_80": triton-bf16\n', 1))
    catalog = Catalog(tmp_path / "configs")
    assert list(catalog.defaults)[0] == ">=sm_80"
    assert catalog.name(catalog.default_for("sm_121")) == "marlin-bf16"  # GB10's own entry, not the catch-all
    assert catalog.name(catalog.default_for("sm_100")) == "triton-bf16"


def test_level2_tolerance_with_default_written_first(tmp_path):
    path = REPO / "tests" / "level2_correctness" / "prompts.yaml"
    raw = yaml.safe_load(path.read_text())
    tol = raw["tolerances"]
    tol["sm_12x"] = {**tol["sm_90"], "max_abs": 0.25, "measured": "test: GB10's own entry"}
    raw["tolerances"] = _reordered(tol, "default")
    bad = tmp_path / "prompts.yaml"
    bad.write_text(yaml.safe_dump(raw, sort_keys=False))
    workload = load_workload(bad)
    assert list(workload.tolerances)[0] == "default"
    assert workload.tolerance("sm_121").max_abs == 0.25
    assert workload.tolerance("sm_90") is workload.tolerances["sm_90"]
    assert workload.tolerance("sm_100") is workload.tolerances["default"]


def test_level6_matrix_with_a_catch_all_written_first(tmp_path):
    path = REPO / "tests" / "level6_matrix" / "matrix.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["platforms"] = _reordered(raw["platforms"], ">=sm_80")
    bad = tmp_path / "matrix.yaml"
    bad.write_text(yaml.safe_dump(raw, sort_keys=False))
    matrix = load_matrix(bad)
    assert matrix.platforms[0].selector == ">=sm_80"
    assert matrix.for_platform("sm_121").selector == "sm_12x"
    assert matrix.for_platform("sm_100").selector == ">=sm_80"


@pytest.mark.parametrize("order", [("sm_12x", "sm_121"), ("sm_121", "sm_12x")])
def test_thresholds_layer_the_most_specific_last_in_any_order(tmp_path, order):
    values = {"sm_12x": {"max_cv": 0.04, "throughput_drop": 0.05}, "sm_121": {"max_cv": 0.02}}
    path = tmp_path / "thresholds.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"max_cv": 0.05}, "platforms": {s: values[s] for s in order}},
                                   sort_keys=False))
    on_gb10 = load_thresholds(path, "sm_121")
    assert on_gb10.max_cv == 0.02  # the exact platform's value
    assert on_gb10.throughput_drop == 0.05  # the family's, where the exact entry says nothing
    assert load_thresholds(path, "sm_120").max_cv == 0.04
    assert load_thresholds(path, "sm_90").max_cv == 0.05
