"""What --force-regen may record (Suite.record_refusal, the level 6 runner's refusal): only a run level 1.5 can vouch
for. A config whose kernel patterns no trace of this platform confirmed yet (GB10's, from public sources) can pass
level 1.5 on a guess that also matches a fallback, and a server given with --server-url cannot be profiled at all; a
golden or baseline recorded from either would bless whatever ran. Both are refused unless --allow-unverified, and
what was recorded that way says so."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config.catalog import Catalog
from harness.core.errors import SuiteError
from harness.core.platform import Platform
from harness.engine.models import Model
from harness.matrix.runner import Runner
from harness.perf.baselines import baseline_text
from harness.session.suite import RunningServer, Suite, Target
from tests.unit.recordings import catalog_unrecorded_on

REPO = Path(__file__).resolve().parents[2]
# GB10 as shipped: its patterns unconfirmed, whatever the users recorded since (sm_90 recordings still count)
CATALOG = catalog_unrecorded_on("sm_121")
PLATFORMS = {"sm_121": Platform("sm_121", "NVIDIA GB10", (12, 1)), "sm_90": Platform("sm_90", "NVIDIA H200", (9, 0))}
PASSED = SimpleNamespace(verdict=SimpleNamespace(ok=True, problems=[], excused=[]))


def suite_on(platform: str, allow_unverified: bool = False) -> Suite:
    return Suite(CATALOG, PLATFORMS[platform], CATALOG.flavour("upstream"), Model("tiny-gpt-oss-mxfp4", "unused"),
                 Path("/nonexistent"), None, allow_unverified=allow_unverified)


def server_of(suite: Suite, name: str, external: bool = False) -> RunningServer:
    cfg = CATALOG.parse(name)
    spec = suite.flavour.resolve(cfg, suite.platform.name)
    return RunningServer("http://127.0.0.1:9", "fake", Target(name, cfg, spec, True, ""),
                         process=None if external else object())


def refusal(suite: Suite, server: RunningServer) -> str | None:
    return suite.record_refusal(server, SimpleNamespace(getfixturevalue=lambda name: PASSED))


def test_a_passed_level1_5_on_unconfirmed_patterns_may_not_record_and_says_how_to_confirm_them():
    suite = suite_on("sm_121")
    server = server_of(suite, "marlin-bf16")
    assert server.target.spec.kernels.unverified == ["moe=marlin", "attention=auto"]  # the premise: GB10 unconfirmed
    why = refusal(suite, server)
    assert why is not None and "\n" not in why
    assert "not yet confirmed on a sm_121 trace (moe=marlin, attention=auto)" in why, why
    assert "scripts/record_kernels.py --config=marlin-bf16" in why and "--allow-unverified" in why
    # the fix accepts the trace the user reviewed, never a fresh one in the same command
    assert "review its recording.md, then accept it with --from-summaries" in why and "--accept" not in why, why
    # level 6 refuses the same combination by the same rule
    runner = Runner.__new__(Runner)
    runner.suite, runner.plan = suite, SimpleNamespace(combo=lambda name: SimpleNamespace(config=server.target.config))
    runner.stage = lambda name, kind: {"kernel_path": {"ok": True, "problems": [], "excused": []}}
    assert runner.refusal("marlin-bf16") == why


def test_allow_unverified_records_them_and_the_golden_names_the_patterns_it_rested_on():
    suite = suite_on("sm_121", allow_unverified=True)
    server = server_of(suite, "gemv-bf16")
    assert refusal(suite, server) is None
    assert suite.kernel_path_note(server) == ("level 1.5 passed without a sm_121 trace confirming the patterns of "
                                              "moe=gemv, attention=auto")
    # a failed level 1.5 is refused whatever the option says
    failed = SimpleNamespace(verdict=SimpleNamespace(ok=False, problems=["moe=gemv: no kernel matched"], excused=[]))
    assert "failed level 1.5" in suite.record_refusal(server, SimpleNamespace(getfixturevalue=lambda name: failed))


def test_an_axis_value_no_kernel_can_show_may_not_record_either():
    """The fork reads no VLLM_MXFP4_ACTIVATION, so gemm-mxfp4 launches gemm-bf16's kernels: with moe=gemm confirmed on
    GB10, gemm-bf16's trace passes gemm-mxfp4's level 1.5, and a golden would bless an activation that never ran."""
    suite = Suite(CATALOG, PLATFORMS["sm_121"], CATALOG.flavour("fork"), Model("tiny-gpt-oss-mxfp4", "unused"),
                  Path("/nonexistent"), None)
    server = server_of(suite, "gemm-mxfp4")
    assert server.target.spec.kernels.verification["activation=mxfp4"].startswith("undeclared")  # the premise
    why = refusal(suite, server)
    assert why is not None and "no kernel declared for activation=mxfp4 can show it took effect" in why, why
    assert "--allow-unverified" in why and "\n" not in why


def test_confirmed_patterns_record_as_before():
    """A/A: on sm_90 stock's patterns were recorded from H200 traces. (moe=gemv's recording predates the one-copy
    plugin and the recording of its rules: gemv-bf16 records on sm_90 again after record_kernels --accept.)"""
    suite = suite_on("sm_90")
    for name in ("triton-bf16", "marlin-bf16", "marlin-bf16-attn-triton", "triton-bf16-attn-triton"):
        server = server_of(suite, name)
        assert not server.target.spec.kernels.unverified, name
        assert refusal(suite, server) is None, name
        assert suite.kernel_path_note(server) == "level 1.5 passed"


def test_a_server_the_suite_did_not_boot_records_only_with_allow_unverified():
    suite = suite_on("sm_90")
    server = server_of(suite, "triton-bf16", external=True)
    why = refusal(suite, server)
    assert why is not None and "--server-url" in why and "--allow-unverified" in why and "\n" not in why
    allowed = suite_on("sm_90", allow_unverified=True)
    assert refusal(allowed, server) is None
    assert allowed.kernel_path_note(server) == "unchecked (external server)"


def test_a_baseline_recorded_on_unconfirmed_patterns_says_so():
    results = {"config": "gemv-bf16", "flavour": "upstream", "model": "tiny", "platform": "sm_121", "device": "NVIDIA GB10",
               "valid": True, "metrics": {"tg32": {"samples": [50.0, 51.0], "unit": "tok/s", "higher_is_better": True}},
               "memory_used_gib": None, "kv_capacity_tokens": None}
    assert "kernel_patterns_unverified" not in baseline_text(results, "gemv-bf16")
    text = baseline_text({**results, "kernel_patterns_unverified": ["moe=gemv"]}, "gemv-bf16")
    assert "kernel_patterns_unverified: [moe=gemv]" in text


@pytest.mark.parametrize("args", [["--allow-unverified"]])
def test_allow_unverified_without_force_regen_is_one_line(args):
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "--collect-only", "-q",
                          "tests/unit/test_stats.py"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stdout + run.stderr
    lines = [ln for ln in run.stderr.splitlines() if "--allow-unverified" in ln]
    assert lines and "add --force-regen" in lines[0] and "Traceback" not in run.stderr, run.stderr


def _level6_runner(suite: Suite, name: str, kernel_path: dict) -> Runner:
    runner = Runner.__new__(Runner)
    runner.suite, runner.plan = suite, SimpleNamespace(combo=lambda n: SimpleNamespace(config=CATALOG.parse(name)))
    runner.stage = lambda n, kind: {"kernel_path": kernel_path}
    return runner


def test_level6_records_a_confirmed_combination_only_when_its_own_kernel_path_passed_unexcused():
    suite = suite_on("sm_90")
    assert server_of(suite, "triton-bf16").target.spec.kernels.unverified == []  # the premise: H200 confirmed
    assert _level6_runner(suite, "triton-bf16", {"ok": True, "problems": [], "excused": []}).refusal("triton-bf16") is None
    failed = {"ok": False, "problems": ["moe=triton: no kernel matched *_matmul_ogs_*"], "excused": []}
    assert _level6_runner(suite, "triton-bf16", failed).refusal("triton-bf16") == (
        "its kernel path failed (moe=triton: no kernel matched *_matmul_ogs_*)")
    excused = {"ok": True, "problems": [], "excused": ["*_matmul_ogs_*: fell back to Marlin"]}
    assert "passed only by logged fallbacks' excuses (*_matmul_ogs_*: fell back to Marlin)" in (
        _level6_runner(suite, "triton-bf16", excused).refusal("triton-bf16") or "")


@pytest.mark.parametrize("evidence, said", [
    ({"errors": {"boot": "did not start in 600 s"}}, "triton-bf16: boot failed: did not start in 600 s"),
    ({"errors": {"kernel_path": "no trace written"}}, "triton-bf16: kernel_path failed: no trace written"),
    ({"errors": {}, "log": "x.log"}, "triton-bf16: no kernel_path evidence recorded (see x.log)"),
])
def test_a_level6_stage_without_evidence_is_an_error_saying_why(evidence, said):
    runner = Runner.__new__(Runner)
    runner.memory = {"triton-bf16": evidence}
    with pytest.raises(SuiteError) as e:
        runner.stage("triton-bf16", "kernel_path")
    assert str(e.value) == said


def test_level6_under_force_regen_never_reads_the_golden_it_replaces():
    runner = Runner.__new__(Runner)
    runner.force_regen = True
    runner.store = lambda name: pytest.fail("the stored golden was read under --force-regen")
    assert runner.golden("triton-bf16") is None
