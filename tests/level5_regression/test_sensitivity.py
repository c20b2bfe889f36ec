"""Tests of the level 5 gate with known injected changes (the suite_testhooks vLLM plugin, plugins/site):

- the sensitivity curve: one server slowed by `sensitivity_pass` and `sensitivity_fail` of its measured step
  time (thresholds.yaml: 2% / 5% on GPUs), each interleaved with 0%; the larger must FAIL and the smaller
  PASS, on decode and on prefill, each on the clocks level 5 gates it by on the platform (on a GPU prefill by
  kernel time, ppN_gpu; decode by kernel time, tgN_gpu, and on the engine clock unless it is host-bound;
  `harness.perf.sensitivity.curve_problems` says what counts); the measured ratios are printed and kept under
  `sensitivity/`;
- memory: a server holding 1.5 GiB (allocated inside vLLM's model loader) must fail the used-memory gate
  against the baseline, and the unchanged shared server must pass it (A/A).

CPU: the curve uses thresholds.yaml's CPU fractions (what the measured CPU noise resolves, and why); the
smaller fraction must not fail (on a noisy runner the gate may say inconclusive there, never fail).
GPU, gpt-oss-120b shape: run with SUITE_HOOK_HOLD_GIB=1.5 SUITE_HOOK_SLOWDOWN=1 so the shared server carries
the hooks (scripts/gpu_gates.sh does).
"""
from __future__ import annotations

import json

import pytest

from harness.engine import hooks
from harness.perf import memory, sensitivity
from harness.perf.baselines import load_baseline
from harness.perf.benchmark import kernel_time_probe
from harness.perf.clocks import ClockSampler
from harness.core.store import regen_command
from harness.perf.regression import compare_memory_section
from harness.perf.results import UNJUDGED

pytestmark = [pytest.mark.level5, pytest.mark.server]


def _baseline_with_memory(baseline_file, suite, config):
    if not baseline_file.is_file():
        pytest.skip(f"no baseline at {baseline_file}; record one with: {regen_command('level5', config, suite.model.alias)}")
    baseline = load_baseline(baseline_file)
    if baseline.get("memory_used_gib") is None:
        pytest.skip(f"{baseline_file.name} predates used-memory accounting (schema 1); re-record with: "
                    f"{regen_command('level5', config, suite.model.alias)}")
    return baseline


def _keep(suite, what, config, verdicts, hold) -> None:
    path = suite.artifact("memory_gate", f"{suite.model.alias}__{config}__{what}.json")
    path.write_text(json.dumps({"check": what, "hold": hold, "verdicts": [v.to_json() for v in verdicts]},
                               indent=1, default=str))


def test_memory_gate_fails_a_held_allocation(hooked, baseline_file, thresholds, suite):
    ack = hooks.wait_for_ack(hooked.hook_dir, "hold", alive=hooked.running.ensure_alive)
    print(f"\n[suite_testhooks ack] {json.dumps(ack['hold'])}")
    baseline = _baseline_with_memory(baseline_file, suite, hooked.running.target.name)
    mem = memory.server_memory(hooked.running, suite.platform.is_cuda)
    current = {"memory_used_gib": mem["used_gib"], "memory": mem, "kv_capacity_tokens": mem["kv_capacity_tokens"]}
    if suite.platform.is_cuda and not hooked.shared:
        # KV capacity is comparable only at the same memory fraction: the shared server, or CPU (explicit size);
        # left out on both sides (results lacking a number the baseline gates are an error)
        baseline, current["kv_capacity_tokens"] = {**baseline, "kv_capacity_tokens": None}, None
    verdicts = {v.name: v for v in compare_memory_section(baseline, current, thresholds, hooked.running.target.name)}
    _keep(suite, "held", hooked.running.target.name, list(verdicts.values()), ack["hold"])
    for v in verdicts.values():
        print(f"  {v.status:12s} {v.message}")
    used = verdicts["memory_used_gib"]
    assert used.status == "fail" and not used.advisory, f"a held {hooked.hold_gib} GiB passed the memory gate: {used.message}"
    assert abs(used.delta_abs - hooked.hold_gib) < 0.5, (
        f"used memory grew by {used.delta_abs:+.2f} GiB for {hooked.hold_gib} GiB held; the accounting is off: {used.message}")
    if "kv_capacity_tokens" in verdicts:
        kv = verdicts["kv_capacity_tokens"]
        # GPU: vLLM shrinks the KV cache by what it counted as weights; CPU: the KV size is explicit
        assert kv.status in ("pass", "fail") and (kv.delta < 0 if suite.platform.is_cuda else kv.delta == 0), kv.message


def test_memory_gate_passes_an_unchanged_server(live_server, baseline_file, thresholds, suite):
    """A/A: the shared server, without any hold, against the baseline: used memory and KV capacity pass."""
    if live_server.external:
        pytest.skip("--server-url: the suite did not boot this server, so it cannot read its memory")
    if hooks.hooks_requested()["hold"]:
        pytest.skip(f"{hooks.HOLD_ENV} is set: the shared server holds memory on purpose (the A/A runs without it)")
    baseline = _baseline_with_memory(baseline_file, suite, live_server.target.name)
    mem = memory.server_memory(live_server, suite.platform.is_cuda)
    current = {"memory_used_gib": mem["used_gib"], "kv_capacity_tokens": mem["kv_capacity_tokens"], "memory": mem}
    verdicts = compare_memory_section(baseline, current, thresholds, live_server.target.name)
    _keep(suite, "unchanged", live_server.target.name, verdicts, None)
    for v in verdicts:
        print(f"\n  {v.status:12s} {v.message}")
    assert verdicts and all(v.status == "pass" for v in verdicts), "\n".join(v.message for v in verdicts)


def test_sensitivity_curve(hooked, thresholds, suite):
    spec = sensitivity.spec_for(suite.platform.name)
    fractions = [thresholds.sensitivity_pass, thresholds.sensitivity_fail]
    sampler = ClockSampler(floor=thresholds.loaded_clock_floor) if suite.platform.is_cuda else None
    # GPU: prefill by kernel time (ppN_gpu; the engine clock's boot spread hides 5%) and decode by kernel time too
    # (tgN_gpu), as level 5 gates them there
    profile_one = kernel_time_probe(hooked.running) if suite.platform.is_cuda and hooked.running.trace_dir else None
    try:
        res = sensitivity.run_curve(hooked.running.client(), hooked.hook_dir, spec, fractions, thresholds, sampler,
                                    alive=hooked.running.ensure_alive, profile_one=profile_one)
    finally:
        if sampler is not None:
            sampler.close()
    points = res.pop("points")
    out = suite.artifact("sensitivity", f"{suite.model.alias}__{hooked.running.target.name}.json")
    out.write_text(json.dumps({**res, "points": [p.summary() for p in points],
                               "acks": hooks.read_acks(hooked.hook_dir)}, indent=1, default=str))
    print(f"\n[sensitivity curve on {suite.platform.name}: {res['decode_step_from']} step {res['decode_step_ms']:.3f} ms, "
          f"{res['prefill_metric']} {res['prefill_ms']:.2f} ms, {res['rounds_per_side']} rounds per side "
          f"({res['prefill_rounds_per_side']} for prefill"
          + (f", {res['decode_kernel_rounds_per_side']} for kernel-time decode" if res["decode_kernel_rounds_per_side"]
             else "")
          + f"), gate {thresholds.throughput_drop:.0%}; calibration at 0%: {res['calibration']}; {out}]")
    if res["decode_host_bound"]:
        print(f"  decode host-bound: {res['decode_host_bound']}")
    for p in points:
        for name in p.base:
            v = p.verdicts.get(name)
            print(f"  {p.fraction:6.1%} slower  {name:10s} measured ratio {p.ratio(name):.4f} (nominal "
                  f"{1 / (1 + p.fraction):.4f})  " + (f"{v.status:12s} {v.message}" if v else UNJUDGED)
                  + (f"  [{p.extra_rounds[name]} rounds per side added for its CV]" if p.extra_rounds.get(name) else ""))
    for note in res["notes"]:
        print(f"  note: {note}")
    assert not res["problems"], "\n".join(res["problems"])
