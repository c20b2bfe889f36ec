"""Level 1.5 (seed 000 gate): the kernels a config asks for are the kernels that ran.

"If validation fails, benchmark results are INVALID." A silent fallback (Marlin running while the
config asked for CUTLASS, an attention path without sinks) is caught here from profiler traces.
"""
import json
from pathlib import Path

import pytest

from harness.configs import KernelExpectation
from harness.traces import check_path, cpu_attention_sinks

pytestmark = [pytest.mark.level1_5, pytest.mark.server]


def test_config_declares_kernels_for_this_platform(target, suite):
    exp = target.spec.kernels
    assert exp.must, (f"{target.name} declares no kernel patterns for {suite.platform.name} in flavour "
                      f"{target.spec.flavour}: a path check with nothing to check proves nothing")


def test_kernel_path_matches_the_config(kernel_path, target):
    assert kernel_path.verdict.ok, kernel_path.verdict.explain(kernel_path.summary, target.spec.kernels)
    for pattern in kernel_path.verdict.excused:
        print(f"\n[{target.name}] '{pattern}' missing but a fallback was logged (seed 000: gemv may fall back)")


def test_swapped_expectation_fails(kernel_path, target):
    """A test of the test: forbid what must run and require what must not; the check must fail."""
    exp = target.spec.kernels
    swapped = KernelExpectation(must=list(exp.must_not), must_not=list(exp.must), source=exp.source)
    assert not check_path(kernel_path.summary, swapped).ok


def test_a_sibling_moe_backend_expectation_fails(kernel_path, target, suite):
    """A test of the test: the kernel patterns of another MoE backend runnable here must not pass."""
    siblings = []
    for value in suite.catalog.axes["moe"].tokens:
        if value == target.config["moe"]:
            continue
        other = suite.catalog.make({**target.config.values, "moe": value}, "sibling")
        ok, _ = suite.flavour.runnable(other, suite.platform.name)
        if ok:
            siblings.append(suite.flavour.resolve(other, suite.platform.name))
    if not siblings:
        pytest.skip(f"no other MoE backend runs on {suite.platform.name} in flavour {suite.flavour.name}")
    for sib in siblings:
        assert not check_path(kernel_path.summary, sib.kernels).ok, f"{sib.config_name}'s patterns pass on {target.name}'s trace"


def test_attention_ran_with_sinks(kernel_path, target, suite):
    if suite.platform.is_cuda:
        # On GPUs the flavour's attention patterns name sink-capable kernels only (FA3 on SM90, Triton
        # unified attention, FlashInfer with sinks), and vLLM refuses a gpt-oss backend without sinks.
        attention = [p for p, why in target.spec.kernels.source.items()
                     if p in target.spec.kernels.must and any(w.startswith("attention=") for w in why)]
        assert attention, f"no attention kernel pattern declared for {suite.platform.name}"
        for pattern in attention:
            assert kernel_path.summary.matching(pattern), f"attention kernel '{pattern}' did not run"
        return
    config_path = Path(suite.model.path) / "config.json"
    if not config_path.is_file():
        pytest.skip(f"model {suite.model.path} has no local config.json to read the head count from")
    cfg = json.loads(config_path.read_text())
    heads = cfg["num_attention_heads"]
    sink_dims, windows = cpu_attention_sinks(kernel_path.summary)
    assert sink_dims == {(heads,)}, f"CPU attention sinks argument dims {sink_dims}, expected {{({heads},)}} (one sink per head)"
    if "sliding_attention" in cfg.get("layer_types", []):
        assert str(cfg["sliding_window"]) in windows and "-1" in windows, (
            f"expected both sliding ({cfg['sliding_window']}) and full (-1) attention layers, saw windows {windows}")


def test_kernel_summary_artifact_records_validity(kernel_path):
    data = json.loads(kernel_path.artifact.read_text())
    assert data["valid"] is kernel_path.verdict.ok
    assert data["summary"]["kernels"], "empty kernel summary"
