"""The shape models (real gpt-oss dimensions, no checkpoint) boot with valid random weights, and what was measured
on vLLM's own dummy weights cannot judge them.

Why: under vLLM's dummy loader the router's bias picks the same four experts for every token (H100, gpt-oss-120b
shape: 4 experts carried 90% of the slots), so every MoE speed read four experts' weights from L2. The shape
aliases set the test hook that gives them valid random weights, and name that init in their fingerprint.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.config.catalog import Catalog
from harness.core.store import identity_problem
from harness.engine.hooks import RANDOM_MXFP4_ENV
from harness.engine.models import SHAPE_FINGERPRINT, resolve_model

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("alias", ["gpt-oss-120b-shape", "gpt-oss-20b-shape"])
def test_a_shape_alias_asks_for_valid_random_weights_and_names_them(alias, tmp_path):
    model = resolve_model(alias, tmp_path)
    assert model.args.get("--load-format") == "dummy"
    assert model.env == {RANDOM_MXFP4_ENV: "1"}, "without the hook the router bias routes every token alike"
    assert model.fingerprint == SHAPE_FINGERPRINT


def test_the_embedded_model_needs_no_hook(tmp_path):
    assert resolve_model("tiny-gpt-oss", tmp_path).env == {}


def test_the_model_env_reaches_the_server_and_a_config_can_override_it():
    catalog = Catalog()
    flavour = catalog.flavour("upstream")
    config = catalog.parse("triton-bf16")
    spec = flavour.resolve(config, "sm_90", {"--load-format": "dummy"}, {RANDOM_MXFP4_ENV: "1"})
    assert spec.env.get(RANDOM_MXFP4_ENV) == "1"
    assert "--load-format" in spec.args


def test_baselines_measured_on_the_collapsed_routing_are_refused_by_name():
    """The H200 shape baselines were recorded before the hook (no fingerprint): a shape run must refuse them with
    the reason, not compare a 4-expert MoE with a spread one."""
    recorded = yaml.safe_load((REPO / "baselines/nvidia-h200/gpt-oss-120b-shape/gemv-bf16.yaml").read_text())
    assert recorded.get("model_fingerprint") is None
    why = identity_problem(recorded, {"model_fingerprint": SHAPE_FINGERPRINT}, "baseline", "gpt-oss-120b-shape")
    assert why is not None and "other weights" in why and SHAPE_FINGERPRINT in why
    same = identity_problem({"model_fingerprint": SHAPE_FINGERPRINT}, {"model_fingerprint": SHAPE_FINGERPRINT},
                            "baseline", "gpt-oss-120b-shape")
    assert same is None, "a baseline of the same init must be accepted"
