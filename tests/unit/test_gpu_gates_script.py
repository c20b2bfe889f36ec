"""scripts/gpu_gates.sh, the GPU gate job, on the phases that need no server: bad input stops it with one line and
exit 2, and the summary leaves complete archives for the job's caller to copy."""
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_gates.sh"


def _gates(tmp_path: Path, *phases: str, **env: str) -> subprocess.CompletedProcess:
    # python3 inside the script must be this interpreter (vLLM importable), as on the GPU host after staging
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
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


def test_summary_leaves_complete_archives_and_no_partial_files(tmp_path):
    """The GPU job's caller (scripts/gpu_bg.sh) copies $OUT every minute, so the archives are written aside and renamed
    (a copy once caught gates-runs.tgz half written). What this checks: the renames happen (no `.part` left) and the
    archives are whole and hold the runs and baselines; the race itself needs a concurrent reader and is not rerun."""
    run = tmp_path / "state" / "gates" / "aa1"
    run.mkdir(parents=True)
    (run / "pytest.status").write_text("aa1: pytest rc=0 (must pass) in 1 s\n")
    r = _gates(tmp_path, "summary")
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gates-baselines.tgz", "gates-runs.tgz", "gates-summary.md"]
    with tarfile.open(out / "gates-runs.tgz") as t:
        assert "./aa1/pytest.status" in t.getnames()
    with tarfile.open(out / "gates-baselines.tgz") as t:
        assert any(n.endswith(".yaml") for n in t.getnames())
    assert "aa1" in (out / "gates-summary.md").read_text()
