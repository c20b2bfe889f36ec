"""The shape models (real gpt-oss dimensions, no checkpoint) boot with valid random weights, and what was measured
on vLLM's own dummy weights cannot judge them.

Why: under vLLM's dummy loader the router's bias picks the same four experts for every token (H100, gpt-oss-120b
shape: 4 experts carried 90% of the slots), so every MoE speed read four experts' weights from L2. The shape
aliases set the test hook that gives them valid random weights, and name that init in their fingerprint.
"""
from __future__ import annotations

import pytest

from harness.config.catalog import Catalog
from harness.core.store import identity_problem
from harness.engine.hooks import RANDOM_MXFP4_ENV
from harness.engine.models import ALIASES, SHAPE_FINGERPRINT, Model, resolve_model
from harness.session.suite import Suite


@pytest.mark.parametrize("alias", ["gpt-oss-120b-shape", "gpt-oss-20b-shape"])
def test_a_shape_alias_asks_for_valid_random_weights_and_names_them(alias, tmp_path):
    model = resolve_model(alias, tmp_path)
    assert model.args.get("--load-format") == "dummy"
    assert model.env == {RANDOM_MXFP4_ENV: "1"}, "without the hook the router bias routes every token alike"
    assert model.fingerprint == SHAPE_FINGERPRINT


def test_the_embedded_model_needs_no_hook():
    assert all("env" not in spec for spec in ALIASES.values() if "compact" in spec)
    assert Model("m", "path").env == {}


def test_the_model_env_reaches_every_config_the_suite_boots(tmp_path, on_cpu):
    """Through the suite, as every level boots its servers (Suite.target -> the server spec's env)."""
    suite = Suite.create("cpu-bf16", "gpt-oss-120b-shape", None, None, str(tmp_path / "run"), 60)
    (target,) = suite.targets()
    assert target.spec is not None and target.spec.env.get(RANDOM_MXFP4_ENV) == "1"


def test_the_model_env_overrides_the_flavours():
    catalog = Catalog()
    flavour = catalog.flavour("cpu")
    config = catalog.parse("cpu-bf16")
    (name, value), *_ = flavour.env.items()
    spec = flavour.resolve(config, "cpu", {}, {name: "from-model", RANDOM_MXFP4_ENV: "1"})
    assert spec.env[name] == "from-model" and spec.env[RANDOM_MXFP4_ENV] == "1"
    assert flavour.resolve(config, "cpu", {}, {}).env[name] == value


def test_baselines_measured_on_the_collapsed_routing_are_refused_by_name():
    """Records from before the hook carry no fingerprint (the H200 shape baselines): a shape run must refuse them
    with the reason, not compare a 4-expert MoE with a spread one; a record of the same init is accepted."""
    before = {"model": "gpt-oss-120b-shape", "model_fingerprint": None}
    why = identity_problem(before, {"model_fingerprint": SHAPE_FINGERPRINT}, "baseline", "gpt-oss-120b-shape")
    assert why is not None and "other weights" in why and SHAPE_FINGERPRINT in why
    same = identity_problem({"model_fingerprint": SHAPE_FINGERPRINT}, {"model_fingerprint": SHAPE_FINGERPRINT},
                            "baseline", "gpt-oss-120b-shape")
    assert same is None, "a baseline of the same init must be accepted"


def test_a_shape_server_whose_hook_did_not_run_is_refused(tmp_path):
    """The fingerprint is a claim; the server log is the evidence. Asked for valid weights on a dummy load, a log
    without the hook's line must stop the run with the fix named; with the line, or without the ask, it passes."""
    from harness.engine.hooks import RANDOM_MXFP4_LOG, random_weights_problem

    ask, argv = {RANDOM_MXFP4_ENV: "1"}, ["--load-format", "dummy", "--max-model-len", "16384"]
    without, with_line, missing = tmp_path / "without.log", tmp_path / "with.log", tmp_path / "missing.log"
    without.write_text("INFO ... model loaded\n")
    with_line.write_text(f"(EngineCore pid=1) {RANDOM_MXFP4_LOG} and scales in 36 MoE layers\n")
    why = random_weights_problem(ask, argv, without)
    assert why is not None and "PYTHONPATH" in why
    assert random_weights_problem(ask, ["--load-format=dummy"], missing) is not None
    assert random_weights_problem(ask, argv, with_line) is None
    assert random_weights_problem({RANDOM_MXFP4_ENV: "0"}, argv, without) is None, "--vllm-dummy-weights turns it off"
    assert random_weights_problem(ask, ["--max-model-len", "4096"], without) is None, "a real checkpoint is not filled"
