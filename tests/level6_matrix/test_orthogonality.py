"""Level 6 (seed 000): orthogonal gating, no feature interference.

For every two combinations that differ in exactly one axis, the kernels (CPU ops) that ran on one
side only must be the ones the flavour declares for that axis's values, and the kernels the other
axes declare must run as often on both sides. The rule and its thresholds: harness/matrix.py and
tests/level6_matrix/matrix.yaml; every diff is appended to <run_dir>/level6/orthogonality.md.
"""
import pytest

from harness.matrix import load_matrix, orthogonality_diff
from harness.traces import KernelSummary

pytestmark = [pytest.mark.level6, pytest.mark.server]


def test_one_axis_changes_only_its_declared_kernels(runner, plan, pair, level6_dir):
    a_name, b_name = pair.split("~")
    a, b = plan.combo(a_name), plan.combo(b_name)
    ev_a, ev_b = runner.stage(a_name, "kernel_path"), runner.stage(b_name, "kernel_path")
    target_a, target_b = runner.suite.target(a.config), runner.suite.target(b.config)
    diff = orthogonality_diff(
        a_name, a.config, KernelSummary.from_json(ev_a["kernel_path"]["summary"]), target_a.spec.kernels,
        b_name, b.config, KernelSummary.from_json(ev_b["kernel_path"]["summary"]), target_b.spec.kernels,
        load_matrix().rules,
    )
    text = diff.explain()
    with open(level6_dir / "orthogonality.md", "a", encoding="utf-8") as f:
        f.write(text + "\n\n")
    print("\n" + text)
    assert diff.ok, text
