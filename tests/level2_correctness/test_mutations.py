"""Level 2 must catch real breakage: mutated checkpoints must FAIL the level 2 checks.

Each mutation copies the model, changes one tensor family, boots it with the same config, and runs
the level 2 workload against the original model's golden. A mutation that passes would mean level 2
cannot see that kind of bug.

Not here: a sinks mutation. The embedded model's trained sinks are small (0.04-0.39), and zeroing or
even dropping them (-1e4) moves its held-out perplexity by < 0.1% (90.56 -> 90.54 / 90.60, measured
with transformers) and left every greedy stream unchanged on an H200; no output check can see it.
Sinks are proven at level 1.5 instead: the CPU trace shows the sinks tensor reaching the attention
op, and the GPU patterns name sink-capable attention kernels only.
"""
import shutil
from pathlib import Path

import pytest

from harness.correctness import load_workload, perplexity_problem, run_level2, stream_problems
from harness.goldens import golden_path, load_golden, regen_command

pytestmark = [pytest.mark.level2, pytest.mark.server]


def _router_biased(name, t):
    if name.endswith("mlp.router.bias"):
        t.zero_()
        t[0] = 100.0  # expert 0 wins every token with weight ~1 after the top-k softmax
    return t


def _expert_scale_off_by_one(name, t):
    """The classic E8M0 bias bug: every down-projection block scale one exponent too high (x2)."""
    if name.endswith("mlp.experts.down_proj_scales"):  # MXFP4 checkpoint: uint8 E8M0 exponents
        return t.add_(1)
    if name.endswith("mlp.experts.down_proj"):  # BF16 checkpoint: the same effect on the weights
        return t.mul_(2)
    return t


MUTATIONS = {"router-biased-to-expert-0": _router_biased, "expert-scale-off-by-one-exponent": _expert_scale_off_by_one}


def _mutated_copy(src: Path, dst: Path, mutate) -> int:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "SHA256SUMS"))
    changed = 0
    for f in src.glob("*.safetensors"):
        tensors = load_file(f)
        for name, t in tensors.items():
            before = t.clone()
            tensors[name] = mutate(name, t)
            changed += int(not tensors[name].equal(before))
        save_file(tensors, dst / f.name, metadata={"format": "pt"})
    return changed


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutated_checkpoint_fails_level2(mutation, suite, server, tmp_path):
    if server.external or not suite.model.has_real_weights or not Path(suite.model.path).is_dir():
        pytest.skip("mutations need a local checkpoint with real weights and a server the suite boots")
    name = server.target.name
    gold = load_golden(golden_path(suite.model.alias, suite.platform.name, name, "level2"),
                       regen_command("level2", name, suite.model.alias))["data"]
    mutant = tmp_path / f"{suite.model.alias}-{mutation}"
    changed = _mutated_copy(Path(suite.model.path), mutant, MUTATIONS[mutation])
    assert changed > 0, f"mutation {mutation} changed no tensor: the checkpoint lacks the tensors it targets"
    running = suite.boot(server.target, tag=f"__{mutation}", model_path=str(mutant), beside_shared=True)
    try:
        wl = load_workload()
        result = run_level2(running.client(), wl)
    finally:
        running.process.stop()
    problems, _ = stream_problems(result, gold, wl)
    ppl = perplexity_problem(result, gold, wl)
    print(f"\n[{mutation}] perplexity {result.perplexity:.3f} vs golden {gold['perplexity']['value']:.3f}; "
          f"{len(problems)} of {len(result.streams)} streams diverge")
    assert ppl is not None, f"{mutation}: perplexity stayed within tolerance ({result.perplexity:.4f}); level 2 is blind to it"
    assert problems, f"{mutation}: every token stream still matches the golden; level 2 is blind to it"
