"""scripts/gpu_prefill.sh, the prefill's GPU job, with a stand-in `python3` that logs each command and exits as the test
says: which commands each phase runs, that a failed `kernels` phase stops the job before any server boots (device time
is scarce, and a served number from a kernel that failed its tests means nothing), and bad phases. What the commands
measure is tested where they live (bench_prefill, plugin_e2e)."""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_prefill.sh"

# The stand-in: `-c` with flavour_baseline prints Hopper's stock, `import vllm` passes, pytest / bench_prefill /
# plugin_e2e exit with $PYTEST_RC / $AB_RC / $E2E_RC (0 by default); every call is logged one line each.
SHIM = """#!/bin/bash
echo "$*" >> "$LOG"
pwd >> "$LOG.cwd"
case "$*" in
  *flavour_baseline*) echo triton-bf16 ;;
  *"import vllm"*) exit 0 ;;
  *"-m pytest"*) exit "${PYTEST_RC:-0}" ;;
  *kernels.tools.bench_prefill*) exit "${AB_RC:-0}" ;;
  *scripts/plugin_e2e.py*) exit "${E2E_RC:-0}" ;;
esac
"""


def _job(tmp_path: Path, *phases: str, copy: bool = False, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the job with the stand-in; `copy`: from its own copy of the tree as on the GPU (else from this checkout,
    GPU_PREFILL_TREE naming it, which skips the copy)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(SHIM)
    (bin_dir / "python3").chmod(0o755)
    r = subprocess.run(["bash", str(SCRIPT), *phases], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LOG": str(log),
                            "PREFILL_DIR": str(tmp_path / "out"), "OUT": str(tmp_path / "tool-out"),
                            **({} if copy else {"GPU_PREFILL_TREE": str(REPO.resolve())}), **env})
    calls = log.read_text().splitlines() if log.exists() else []
    return r, [c for c in calls if "import vllm" not in c]


def test_kernels_judges_the_served_build_against_the_previous_one_bit_for_bit(tmp_path):
    prev = tmp_path / "prev.cu"
    prev.write_text("// the build before the change\n")
    r, calls = _job(tmp_path, "kernels", PREV=str(prev))
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls[0].startswith("-m pytest") and "test_kernel_packed_mm.py" in calls[0] and "test_kernel_moe.py" in calls[0]
    sweep = calls[2].split()  # after the A/B: the dense layers at decode-batch sizes, recorded beside it
    assert "--only-dense-sweep" in sweep and sweep[sweep.index("--dense-m") + 1] == "17,32,48,63,64,256"
    batch = calls[3].split()  # then the MoE at a decode batch's tokens, padding rows staged as zeros among the specs
    live = tmp_path / "out" / "live_rows.cu"
    assert batch[batch.index("--ab") + 1] == f"served,@4,{live}" and batch[batch.index("--ab-m") + 1] == "32,64,2048"
    assert live.read_text().startswith("#define MXFP4_STAGE_LIVE_ROWS 1\n")
    ab = calls[1].split()
    assert ab[:2] == ["-m", "kernels.tools.bench_prefill"]
    # the previous build first: the served one is the spec judged against it
    assert ab[ab.index("--ab") + 1] == f"{prev},served"
    assert ab[ab.index("--expect") + 1] == "not-slower,identical"
    # routed as the served shape models route (the uniformly routed bench read the 120b's layer 12% faster than served)
    assert ab[ab.index("--routing-skew") + 1] == "served"
    assert (tmp_path / "out" / "phases.txt").read_text() == "kernels rc 0\n"
    r, calls = _job(tmp_path, "kernels", PREV=str(prev), ROUTING_SKEW="0")
    last_ab = [c.split() for c in calls if "--ab" in c.split()][-1]
    assert r.returncode == 0 and last_ab[last_ab.index("--routing-skew") + 1] == "0", calls


def test_a_change_that_rounds_differently_by_design_is_judged_on_speed_alone_when_asked(tmp_path):
    """EXPECT replaces the A/B's gate (the MoE down kernel's bf16 rows differ from its fp32 ones by a rounding):
    not asked, the gate stays bit for bit."""
    prev = tmp_path / "prev.cu"
    prev.write_text("// the build before the change\n")
    r, calls = _job(tmp_path, "kernels", PREV=str(prev), EXPECT="not-slower")
    ab = calls[1].split()
    assert r.returncode == 0 and ab[ab.index("--expect") + 1] == "not-slower", calls


def test_prefill_measures_only_the_kernel_time_of_a_prefill_of_stock_and_the_plugin(tmp_path):
    r, calls = _job(tmp_path, "prefill", MODEL="gpt-oss-20b-shape")
    assert r.returncode == 0, r.stdout + r.stderr
    (argv,) = [c.split() for c in calls if "plugin_e2e" in c]
    assert "--prefill-gpu-only" in argv and "--warm" not in argv
    assert argv[argv.index("--model") + 1] == "gpt-oss-20b-shape"
    assert argv[argv.index("--configs") + 1] == "triton-bf16,gemv-bf16-mxfp4-all"
    assert argv[argv.index("--out") + 1] == str(tmp_path / "out" / "prefill-gpt-oss-20b-shape")
    assert (tmp_path / "out" / "phases.txt").read_text() == "prefill rc 0\n"


def test_kernels_without_a_previous_build_compares_with_the_mma_sync_tiling_and_judges_nothing(tmp_path):
    r, calls = _job(tmp_path, "kernels", PREV=str(tmp_path / "absent.cu"))
    ab = calls[1].split()
    assert r.returncode == 0 and ab[ab.index("--ab") + 1] == "@1,served" and "--expect" not in ab


@pytest.mark.parametrize("failing", ["PYTEST_RC", "AB_RC"])
def test_a_failed_kernels_phase_stops_the_job_before_any_server_boots(tmp_path, failing):
    r, calls = _job(tmp_path, "kernels", "e2e", "e2e-aa", **{failing: "1"})
    assert r.returncode == 1
    assert not [c for c in calls if "plugin_e2e" in c], calls
    # failed tests: no A/B, whose verdict could not change the phase's
    assert bool([c for c in calls if "bench_prefill" in c]) == (failing == "AB_RC"), calls
    assert (tmp_path / "out" / "phases.txt").read_text() == "kernels rc 1\n"
    assert "not measured" in r.stdout


def test_e2e_runs_stock_and_the_plugin_in_one_run_and_the_aa_the_plugin_twice(tmp_path):
    r, calls = _job(tmp_path, "e2e", "e2e-aa", MODEL="gpt-oss-120b-shape")
    assert r.returncode == 0, r.stdout + r.stderr
    e2e = [c.split() for c in calls if "plugin_e2e" in c]
    assert len(e2e) == 2
    for argv in e2e:
        assert argv[argv.index("--model") + 1] == "gpt-oss-120b-shape" and "--warm" in argv
        assert "--prefill-gpu-only" not in argv and "--decode-only" not in argv  # concurrency 4 and 32 are measured
    assert e2e[0][e2e[0].index("--configs") + 1] == "triton-bf16,gemv-bf16-mxfp4-all"
    first, second = e2e[1][e2e[1].index("--configs") + 1].split(",")
    assert second.split("+")[0] == first == "gemv-bf16-mxfp4-all" and second != first
    assert (tmp_path / "out" / "phases.txt").read_text() == "e2e rc 0\ne2e-aa rc 0\n"


def test_batch_runs_the_concurrent_workloads_alone_of_stock_and_every_plugin_entry(tmp_path):
    plugin = "gemv-bf16-mxfp4-all,gemv-bf16-mxfp4-all+KERNELS_PACKED_MM_DEQUANT_MIN_M=17"
    r, calls = _job(tmp_path, "batch", PLUGIN=plugin)
    assert r.returncode == 0, r.stdout + r.stderr
    (argv,) = [c.split() for c in calls if "plugin_e2e" in c]
    assert "--batch-only" in argv and "--warm" in argv and argv[argv.index("--model") + 1] == "gpt-oss-20b-shape"
    assert argv[argv.index("--configs") + 1] == f"triton-bf16,{plugin}"
    assert (tmp_path / "out" / "phases.txt").read_text() == "batch rc 0\n"


def test_a_failed_e2e_is_its_phase_line_and_the_next_phase_still_runs(tmp_path):
    r, calls = _job(tmp_path, "e2e", "e2e-aa", E2E_RC="1")
    assert r.returncode == 1
    assert len([c for c in calls if "plugin_e2e" in c]) == 2
    assert (tmp_path / "out" / "phases.txt").read_text() == "e2e rc 1\ne2e-aa rc 1\n"


@pytest.mark.parametrize("phases, expect", [((), "name a phase"), (("kernel",), "unknown phase 'kernel'"),
                                            (("kernels", "e2e", "e2e-aaa"), "unknown phase 'e2e-aaa'")])
def test_no_phase_or_an_unknown_one_is_one_line_and_exit_2_before_any_phase_runs(tmp_path, phases, expect):
    r, calls = _job(tmp_path, *phases)
    assert r.returncode == 2 and expect in r.stdout and "kernels, level2, prefill, e2e, e2e-aa, batch" in r.stdout
    assert not calls


def test_the_job_runs_from_its_own_copy_of_the_tree_and_writes_outside_the_tools_out(tmp_path):
    """The device tool re-copies the working tree and empties $OUT before every call, under a job that spans calls:
    the job runs from a copy beside PREFILL_DIR and writes nothing to $OUT (a phase's files, plugin_e2e's resume file
    among them, were deleted under it)."""
    r, calls = _job(tmp_path, "e2e", copy=True)
    assert r.returncode == 0, r.stdout + r.stderr
    tree = tmp_path / "out-tree"
    cwds = set((tmp_path / "calls.log.cwd").read_text().split())
    assert cwds == {str(tree.resolve())}, cwds
    assert (tree / "scripts" / "gpu_prefill.sh").read_bytes() == SCRIPT.read_bytes()
    assert not (tree / ".venv").exists() and not (tree / "runs").exists()
    assert (tmp_path / "out" / "phases.txt").read_text() == "e2e rc 0\n"
    assert not (tmp_path / "tool-out").exists()


def test_a_results_folder_inside_the_repository_is_refused(tmp_path):
    r, calls = _job(tmp_path, "kernels", copy=True, PREFILL_DIR=str(REPO / "runs" / "prefill"))
    assert r.returncode == 2 and "inside the repository" in r.stdout and not calls


def test_level2_judges_the_plugin_config_by_stocks_goldens_without_the_mutants(tmp_path):
    r, calls = _job(tmp_path, "level2")
    assert r.returncode == 0, r.stdout + r.stderr
    (argv,) = [c.split() for c in calls if "-m pytest" in c]
    assert argv[argv.index("-m", argv.index("pytest")) + 1] == "level2"
    assert "--config=gemv-bf16" in argv and "--goldens-of=triton-bf16" in argv
    assert " ".join(argv[argv.index("-k") + 1:]) == "not mutated"  # the stand-in logs its arguments unquoted
    assert (tmp_path / "out" / "phases.txt").read_text() == "level2 rc 0\n"


def test_a_failed_level2_stops_the_job_before_any_server_is_measured(tmp_path):
    """A kernel change that rounds the served model's logprobs past level 2's rules (the MoE down kernel's bf16 rows
    flipped a teacher-forced top-1 on an H100) fails the job before its speed is measured."""
    r, calls = _job(tmp_path, "level2", "prefill", "e2e", PYTEST_RC="1")
    assert r.returncode == 1
    assert not [c for c in calls if "plugin_e2e" in c], calls
    assert (tmp_path / "out" / "phases.txt").read_text() == "level2 rc 1\n"
    assert "the level2 phase failed" in r.stdout
