"""Level 1.5 (the gate of the users' benchmarking plan): the kernels a config asks for are the kernels that ran.

"If validation fails, benchmark results are INVALID." A silent fallback (Marlin running while the
config asked for CUTLASS, an attention path without sinks) is caught here from profiler traces.
Expectations are data (configs/flavours/*.yaml): each `must` glob names one kernel family, every
sibling backend's kernels are forbidden automatically, and each platform entry says whether a real
trace verified it. The synthetic-trace tests of the test for every config and platform are in
tests/unit/test_kernel_expectations.py; the ones here use the real trace of this run.
"""
import json
from pathlib import Path

import pytest

from harness.config.catalog import SIBLING_AXES, KernelExpectation
from harness.correctness.level2 import load_workload, score
from harness.engine.mutations import mutated_copy, sinks_raised
from harness.kernelpath.traces import check_decode, check_path, cpu_attention_sinks

pytestmark = [pytest.mark.level1_5, pytest.mark.server]


def test_config_declares_kernels_for_this_platform(target, suite):
    exp = target.spec.kernels
    assert exp.must, (f"{target.name} declares no kernel patterns for {suite.platform.name} in flavour "
                      f"{target.spec.flavour}: a path check with nothing to check proves nothing "
                      f"(record them: python scripts/record_kernels.py --config={target.name})")
    for tag, status in exp.verification.items():
        print(f"\n[{target.name}] {tag}: {status}")


def test_kernel_path_matches_the_config(kernel_path, target):
    assert kernel_path.verdict.ok, kernel_path.verdict.explain(kernel_path.summary, target.spec.kernels)
    for excused in kernel_path.verdict.excused:
        print(f"\n[{target.name}] excused: {excused} (this run may not record baselines or goldens)")


def test_swapped_expectation_fails(kernel_path, target):
    """A test of the test: forbid what must run and require what must not; the check must fail."""
    exp = target.spec.kernels
    swapped = KernelExpectation(must=list(exp.must_not), must_not=list(exp.must), source=exp.source)
    assert not check_path(kernel_path.summary, swapped).ok


def test_decode_steps_run_only_this_configs_kernels(kernel_path, target):
    """A trace of decode steps alone shows every kernel the config requires, so a backend that ran once in a prefill
    cannot pass for the one every decode step ran; a config that hands its large (prefill) batches to another backend
    shows none of that backend's there, so a decode step that fell back cannot hide behind the prefill kernels the
    full trace is allowed to show."""
    exp = target.spec.kernels
    window = kernel_path.decode
    assert window is not None, f"{target.name}: no decode window was profiled"
    print(f"\n[{target.name}] decode window: profiler started after {window.before} streamed tokens, "
          f"{window.inside} tokens inside; top kernels:\n{window.summary.top(8)}")
    assert not window.problems, "\n".join(window.problems)
    if not exp.prefill_only:
        return
    # a test of the test on the real traces: the full trace (prefill included) must break the decode rule
    # (no fallback excused), or the prefill-only patterns match nothing that runs and forbid nothing
    assert check_decode(kernel_path.summary, exp).problems, (
        f"the full trace passes the decode-only rule: no kernel of {exp.prefill_only} ran even in prefill, so the "
        f"patterns guard nothing (re-record them: python scripts/record_kernels.py --config={target.name})")


def test_every_sibling_backends_patterns_reject_this_trace(kernel_path, target, suite):
    """A test of the test on the real trace: the `must` patterns of every other MoE, attention and layers value that
    runs here, on their own (without the forbidden list they share with this config), must not all match what
    ran; else the data cannot tell the two backends apart."""
    checked = 0
    for axis in SIBLING_AXES:
        # with what this config hands to another backend (`also_runs`): those kernels may be in its trace
        own = suite.flavour.declared_patterns(axis, target.config[axis], suite.platform.name)
        for value in suite.catalog.axes[axis].tokens:
            if value == target.config[axis] or not suite.flavour.value_runs(axis, value, suite.platform.name)[0]:
                continue
            theirs = [p for _, e in suite.flavour.kernel_entries(axis, value, suite.platform.name) for p in e.get("must") or []
                      if p not in own]
            if not theirs:
                continue  # undeclared, the same backend under another name ("auto"), or one this config declares it runs
            v = check_path(kernel_path.summary, KernelExpectation(must=theirs))
            assert not v.ok, f"{axis}={value}'s patterns {theirs} all match {target.name}'s trace: they cannot tell the backends apart"
            checked += 1
    if not checked:
        pytest.skip(f"no other MoE or attention backend with declared kernels runs on {suite.platform.name} in flavour {suite.flavour.name}")


def test_attention_receives_the_sinks_tensor_on_cpu(kernel_path, suite):
    """CPU: the sinks tensor (one per head) reaches the attention op, on sliding and full layers."""
    if suite.platform.is_cuda:
        pytest.skip("GPU kernels take their arguments as raw pointers; the behavioural sinks test below covers GPUs")
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


# Raising every sink logit by 4 moves the teacher-forced logprobs of the tiny model by far more than this
# (measured: docs/evidence/level2-tolerances.md); an attention kernel that ignored sinks would move them by 0.
SINKS_MIN_MEAN_SHIFT = 0.05


def test_attention_uses_the_sinks(suite, server, tmp_path):
    """Behavioural proof on any platform: the same text scored by the model and by a copy with every sink
    raised must differ. A kernel that drops the sinks (the users saw garbage output without them) scores both alike."""
    if server.external or not suite.model.has_real_weights or not Path(suite.model.path).is_dir():
        pytest.skip("needs a local checkpoint with real weights and servers the suite boots")
    ok, why = suite.can_boot_secondary()
    if not ok:
        pytest.skip(why)
    wl = load_workload()
    ids = server.client().tokenize(wl.perplexity_text)[:512]
    base = score(server.client(), ids, wl.top_k)
    mutant = tmp_path / f"{suite.model.alias}-sinks-raised"
    assert mutated_copy(Path(suite.model.path), mutant, sinks_raised) > 0, "the checkpoint has no self_attn.sinks tensors"
    with suite.boot(server.target, tag="__sinks", model_path=str(mutant), beside_shared=True) as running:
        raised = score(running.client(), ids, wl.top_k)
    deltas = [abs(a - b) for a, b in zip(base.actual[1:], raised.actual[1:])]
    mean = sum(deltas) / len(deltas)
    print(f"\n[{server.target.name}] sinks +4: mean |delta logprob| {mean:.4f}, max {max(deltas):.4f} over {len(deltas)} positions")
    assert mean > SINKS_MIN_MEAN_SHIFT, (f"raising every attention sink moved the logprobs by only {mean:.5f} on average: "
                                         "the attention kernel ignores the sinks")


def test_kernel_summary_artifact_records_validity(kernel_path):
    data = json.loads(kernel_path.artifact.read_text())
    assert data["valid"] is kernel_path.verdict.ok
    assert data["excused"] == kernel_path.verdict.excused
    assert data["summary"]["kernels"], "empty kernel summary"
