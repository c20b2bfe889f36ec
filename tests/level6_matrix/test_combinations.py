"""Level 6 (the users' plan): feature combinations boot, answer, take their kernel path and stay correct.

Which combinations: tests/level6_matrix/matrix.yaml (per platform; full product where small, pairwise
otherwise, minus what the flavour cannot run). Each combination boots its own server once; see
conftest.py. Goldens: goldens/<model>/<platform>/<combination>/level6.json (--force-regen).
"""
import pytest

from harness.correctness.level2 import Level2Result, judge
from harness.correctness.logprobs import Scored, Stream
from harness.engine.client import all_finite
from harness.kernelpath.traces import KernelSummary, PathVerdict
from tests.level6_matrix.pairing import pairing_problems

pytestmark = [pytest.mark.level6, pytest.mark.server]


def test_the_plan_lists_every_combination_and_every_exclusion(plan, suite, level6_dir):
    report = plan.report()
    path = level6_dir / "matrix.md"
    path.write_text(report)
    print("\n" + report + f"(written to {path})")
    assert plan.combos[0].name == plan.base.name, "the base combination must come first"
    for c in plan.combos:
        ok, why = suite.flavour.runnable(c.config, suite.platform.name, getattr(suite.model_or_error, "path", None))
        assert ok, f"{c.name} is in the plan but the flavour cannot run it: {why}"
    for name, why in plan.excluded:
        assert why and f"- {name}: {why}" in report, f"exclusion {name} is not reported with its reason"
    # per value, not per axis: moe paired through marlin~gemv says nothing about moe=gemm
    problems = pairing_problems(plan)
    assert not problems, "values of the plan whose orthogonality no pair checks:\n  " + "\n  ".join(problems)


def test_combination_boots_and_answers_with_finite_logprobs(runner, combo):
    ev = runner.stage(combo, "smoke")
    choice = ev["smoke"]["choices"][0]
    lps = choice["logprobs"]["token_logprobs"]
    print(f"\n[{combo}] booted in {ev['boot_seconds']} s; {choice['text']!r}")
    assert ev["smoke"]["usage"]["completion_tokens"] == runner.smoke_tokens == len(lps)
    assert all_finite(lps) and all(lp <= 0.0 for lp in lps), f"non-finite or positive logprobs: {lps}"
    assert ev["alive_at_end"], f"{combo}: the server died during its checks; log {ev['log']}"


def test_combination_takes_its_kernel_path(runner, combo):
    ev = runner.stage(combo, "kernel_path")
    kp = ev["kernel_path"]
    if not kp["ok"]:
        target = runner.suite.target(runner.plan.combo(combo).config)
        verdict = PathVerdict(kp["ok"], kp["problems"], kp["excused"])
        pytest.fail(verdict.explain(KernelSummary.from_json(kp["summary"]), target.spec.kernels), pytrace=False)
    for pattern in kp["excused"]:
        print(f"\n[{combo}] '{pattern}' missing but a fallback was logged")


def _need_level2(runner):
    if not runner.suite.model.has_real_weights:
        pytest.skip(f"{runner.suite.model.alias} has dummy weights: outputs are meaningless, so there is nothing to check")
    if isinstance(runner.workload, Exception):
        raise runner.workload


def _result(ev: dict, scored_key: str = "scored") -> Level2Result:
    data = ev["level2"]
    return Level2Result({k: Stream.from_json(v) for k, v in data["streams"].items()},
                        {k: Scored.from_json(v) for k, v in data[scored_key].items()}, "golden")


def test_combination_matches_its_golden(runner, combo):
    _need_level2(runner)
    ev = runner.stage(combo, "level2")
    data = ev["level2"]
    fresh = {"streams": data["streams"], "scored": data["scored"],
             "perplexity": {"value": _result(ev).perplexity, "tokens": _result(ev).perplexity_tokens}}
    store = runner.store(combo)
    gold = store.settle("level6", store.load("level6", "level6", runner.check_golden), fresh,
                        {"vllm": ev.get("vllm", "unknown")})
    verdict = judge(_result(ev), gold, runner.workload.tolerance(runner.suite.platform.name))
    for n in verdict.notes:
        print(f"\n  [{combo}] {n}")
    assert verdict.ok, f"{combo} vs its golden:\n  " + "\n  ".join(verdict.problems)


def test_combination_gives_the_base_outputs(runner, plan, variant):
    """No feature interference: knobs the data calls neutral leave the base's distributions alone (the variant
    scores the base's golden sequences; same rules and tolerances as level 2)."""
    _need_level2(runner)
    spec_neutral = set(plan.neutral)
    differs = plan.combo(variant).differs
    if not set(differs) <= spec_neutral:
        pytest.skip(f"{variant} changes {sorted(set(differs) - spec_neutral)}, which matrix.yaml does not call neutral "
                    f"(outputs may legitimately differ; its own golden checks it)")
    base = runner.golden(plan.base.name)
    if base is None:
        pytest.skip(f"no level 6 golden of the base {plan.base.name} yet: record it first (pytest -m level6 --force-regen)")
    ev = runner.stage(variant, "level2")
    if "scored_base" not in ev["level2"]:
        pytest.fail(f"{variant} did not score the base's golden sequences (see its log {ev.get('log')})", pytrace=False)
    verdict = judge(_result(ev, "scored_base"), base, runner.workload.tolerance(runner.suite.platform.name))
    print(f"\n[{variant} vs {plan.base.name}'s golden]" + "".join(f"\n  {n}" for n in verdict.notes))
    assert verdict.ok, f"{variant} ({differs}) changes the base's outputs:\n  " + "\n  ".join(verdict.problems)
