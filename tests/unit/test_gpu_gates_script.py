"""scripts/gpu_gates.sh, the GPU gate job, on the phases that need no server: bad input stops it with one line and
exit 2, and the summary leaves whole archives for the job's caller to copy."""
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_gates.sh"


def _gates(tmp_path: Path, *phases: str, path_first: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    # python3 inside the script must be this interpreter (vLLM importable), as on the GPU host after staging
    path = os.pathsep.join([*([str(path_first)] if path_first else []), str(Path(sys.executable).parent),
                            os.environ["PATH"]])
    return subprocess.run(["bash", str(SCRIPT), *phases], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": path, "STATE": str(tmp_path / "state"),
                               "OUT": str(tmp_path / "out"), **env})


@pytest.mark.parametrize("content", [None, "cpu: [unclosed\n", "- a list\n- not sections\n"],
                         ids=["missing", "malformed-yaml", "not-a-mapping"])
def test_warm_with_an_unreadable_workloads_file_stops_with_one_line_naming_it(tmp_path, content):
    wl = tmp_path / "workloads.yaml"
    if content is not None:
        wl.write_text(content)
    r = _gates(tmp_path, "warm", WORKLOADS=str(wl))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(wl) in lines[0] and "tests/level4_perf/workloads.yaml" in lines[0], out


def test_an_unknown_phase_is_refused_with_the_phases_it_knows(tmp_path):
    r = _gates(tmp_path, "wram")
    assert r.returncode == 2
    assert "unknown phase wram" in r.stdout and "warm" in r.stdout


def _tar_shim(tmp_path: Path, fail: bool) -> tuple[Path, Path]:
    """A `tar` (its folder, to put first on PATH) that logs its arguments, then runs the real one, or (fail) writes half
    a file and exits 2; and the log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "tar.log"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "tar"
    shim.write_text(f"#!/bin/bash\necho \"$@\" >> {log}\n"
                    + ('echo half > "$2"; exit 2\n' if fail else f'exec {shutil.which("tar")} "$@"\n'))
    shim.chmod(0o755)
    return bin_dir, log


def test_summary_writes_whole_archives_aside_without_the_excluded_files(tmp_path):
    """The GPU job's caller (scripts/gpu_bg.sh) copies $OUT every minute and once caught gates-runs.tgz half written:
    tar must write each archive under another name (renamed when whole), and leave out the traces and pip freezes (the
    excludes once followed the member names, where GNU tar ignores them)."""
    run = tmp_path / "state" / "gates" / "aa1"
    run.mkdir(parents=True)
    (run / "pytest.status").write_text("aa1: pytest rc=0 (must pass) in 1 s\n")
    (run / "pip_freeze.txt").write_text("vllm==0.26.0\n")
    (run / "x.pt.trace.json.gz").write_bytes(b"trace")
    bin_dir, log = _tar_shim(tmp_path, fail=False)
    r = _gates(tmp_path, "summary", path_first=bin_dir, GPU_GATES_TREE=str(REPO))  # already in its copy: tar packs only
    assert r.returncode == 0, r.stdout + r.stderr
    targets = [line.split()[1] for line in log.read_text().splitlines()]
    assert len(targets) == 2 and all(t.endswith(".part") for t in targets), targets
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gates-baselines.tgz", "gates-runs.tgz", "gates-summary.md"]
    with tarfile.open(out / "gates-runs.tgz") as t:
        assert sorted(t.getnames()) == [".", "./aa1", "./aa1/pytest.status"]
    with tarfile.open(out / "gates-baselines.tgz") as t:
        assert any(n.endswith(".yaml") for n in t.getnames())
    assert "aa1" in (out / "gates-summary.md").read_text()


def test_a_failed_tar_keeps_the_last_whole_archive(tmp_path):
    (tmp_path / "state" / "gates").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "gates-runs.tgz").write_bytes(b"the last whole archive")
    bin_dir, _ = _tar_shim(tmp_path, fail=True)
    r = _gates(tmp_path, "summary", path_first=bin_dir, GPU_GATES_TREE=str(REPO))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "gates-runs.tgz").read_bytes() == b"the last whole archive"
    assert not list(out.glob("*.part"))
    assert f"gpu_gates: {out}/gates-runs.tgz not updated (tar exit 2)" in r.stdout


def test_the_job_runs_from_its_own_copy_of_the_tree_so_a_re_copied_tree_cannot_swap_its_baseline(tmp_path):
    """Our lab's device tool copies the working tree again at every call; an A/A boot that spanned a call was judged
    against the committed baseline instead of the one the job had recorded (2026-12-02). The job copies the tree once
    into $STATE/tree and runs there: a file changed in the original afterwards is not what the job reads."""
    r = _gates(tmp_path, "summary")
    assert r.returncode == 0, r.stdout + r.stderr
    tree = tmp_path / "state" / "tree"
    assert (tree / "scripts" / "gpu_gates.sh").read_bytes() == SCRIPT.read_bytes()
    committed = REPO / "baselines" / "nvidia-h200" / "gpt-oss-120b-shape" / "gemv-bf16.yaml"
    assert (tree / committed.relative_to(REPO)).read_bytes() == committed.read_bytes()
    assert not (tree / ".venv").exists() and not any((tree / "runs").iterdir())  # the original's runs stay out
    assert (tmp_path / "out" / "gates-summary.md").is_file()


def test_a_state_folder_inside_the_repository_is_refused_in_one_line(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), "summary"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "STATE": str(REPO / "runs" / "state-in-repo"), "OUT": str(tmp_path / "out")})
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "inside the repository" in lines[0], r.stdout + r.stderr
