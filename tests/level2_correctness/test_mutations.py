"""Level 2 must catch real breakage: mutated checkpoints must FAIL the level 2 checks.

Each mutation (harness/mutations.py) copies the model, changes one tensor family, boots it beside the
config's server and runs the level 2 workload against the original model's golden, by every rule
(streams, teacher-forced distributions, perplexity). A mutation that passes means level 2 is blind to
that kind of bug. The small ones (one layer's expert scales, a 2% logit scale, MXFP4-sized rounding)
pass an argmax-only check: greedy tokens barely move, so only the distributions can see them.

Sinks are not a level 2 mutation: the embedded model's trained sinks barely change its outputs. Level
1.5 proves instead that the attention kernel uses them (a model with sinks raised must score differently).
"""
from pathlib import Path

import pytest

from harness.correctness import judge, load_workload, run_level2
from harness.mutations import LEVEL2, mutated_copy

pytestmark = [pytest.mark.level2, pytest.mark.server]


@pytest.mark.parametrize("mutation", list(LEVEL2))
def test_mutated_checkpoint_fails_level2(mutation, suite, server, level2_golden, tmp_path):
    if server.external or not suite.model.has_real_weights or not Path(suite.model.path).is_dir():
        pytest.skip("mutations need a local checkpoint with real weights and a server the suite boots")
    mutant = tmp_path / f"{suite.model.alias}-{mutation}"
    changed = mutated_copy(Path(suite.model.path), mutant, LEVEL2[mutation])
    assert changed > 0, f"mutation {mutation} changed no tensor: the checkpoint lacks the tensors it targets"
    wl = load_workload()
    running = suite.boot(server.target, tag=f"__{mutation}", model_path=str(mutant), beside_shared=True)
    try:
        result = run_level2(running.client(), wl, level2_golden)
    finally:
        running.process.stop()
    verdict = judge(result, level2_golden, wl.tolerance(suite.platform.name))
    print(f"\n[{mutation}] {len(verdict.problems)} problem(s); perplexity {result.perplexity:.4f}")
    for line in verdict.notes + verdict.problems[:6]:
        print("   ", line.splitlines()[0][:200])
    assert not verdict.ok, f"{mutation}: the mutated model passes level 2; level 2 is blind to it"
