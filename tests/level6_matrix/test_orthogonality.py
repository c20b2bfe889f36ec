"""Level 6 (the users' plan): orthogonal gating, no feature interference.

For every two combinations that differ in exactly one axis, the kernels (CPU ops) that ran on one
side only must be the ones the flavour declares for that axis's values, and the kernels the other
axes declare must run as often on both sides. The rule and its thresholds: harness/matrix/combinations.py and
tests/level6_matrix/matrix.yaml; every diff is appended to <run_dir>/level6/orthogonality.md.
"""
import pytest

from harness.config.catalog import KernelExpectation
from harness.kernelpath.traces import KernelSummary
from harness.matrix.combinations import load_matrix, orthogonality_diff

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


def _without_axis(exp: KernelExpectation, axis: str) -> KernelExpectation:
    keep = {p: src for p, src in exp.source.items() if not any(s.startswith(f"{axis}=") for s in src)}
    return KernelExpectation([p for p in exp.must if p in keep], [p for p in exp.must_not if p in keep], source=keep)


def test_without_the_axis_patterns_the_same_pair_is_not_orthogonal(runner, plan, pair):
    """A test of the test: the patterns do the explaining; the rule is not blind to the difference."""
    a_name, b_name = pair.split("~")
    a, b = plan.combo(a_name), plan.combo(b_name)
    axis = next(ax for ax, _ in a.config.axes if a.config[ax] != b.config[ax])
    sa = KernelSummary.from_json(runner.stage(a_name, "kernel_path")["kernel_path"]["summary"])
    sb = KernelSummary.from_json(runner.stage(b_name, "kernel_path")["kernel_path"]["summary"])
    ea, eb = runner.suite.target(a.config).spec.kernels, runner.suite.target(b.config).spec.kernels
    full = orthogonality_diff(a_name, a.config, sa, ea, b_name, b.config, sb, eb, load_matrix().rules)
    if not full.explained:
        pytest.skip(f"{a_name} and {b_name} ran the same ops: there is nothing for {axis} patterns to explain")
    stripped = orthogonality_diff(a_name, a.config, sa, _without_axis(ea, axis), b_name, b.config, sb,
                                  _without_axis(eb, axis), load_matrix().rules)
    assert not stripped.ok, f"with no {axis} patterns declared, {a_name} vs {b_name} still passes:\n{stripped.explain()}"
    judged = {o.name for o in stripped.unexplained + stripped.below_threshold}
    assert judged == {o.name for o in full.explained}, "the ops the patterns explained are not the ops that differ"
