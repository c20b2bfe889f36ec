"""Known engine issues as data: matching, strict xfail semantics, and bad entries (no vLLM)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.engine.server import EngineCrashed
from harness.plugin import known_issues

REPO = Path(__file__).resolve().parents[2]


# An entry as the file takes them (the shape of a real report: vLLM 0.26.0 on sm_90, since fixed or not
# reproduced; tests/known_engine_issues.yaml says why it is no longer listed).
SAMPLE = textwrap.dedent('''
    issues:
      - id: vllm-negative-token-id-crashes-engine
        engine: vllm
        versions: ">=0.26.0,<0.26.1"
        platforms: [">=sm_80"]
        tests:
          - "tests/level3_stress/test_abuse.py::test_abusive_request_gets_an_error_and_the_server_survives[*negative-token-id*]"
        raises: engine-crash
        upstream: "https://github.com/vllm-project/vllm/pull/51795"
        symptom: "a prompt with token id -1 kills the EngineCore, HTTP 500"
        evidence: "the run that showed it"
''')


def test_the_committed_file_loads_and_every_entry_names_existing_tests():
    for issue in known_issues.load():
        path = REPO / issue.tests[0].split("::")[0]
        assert path.is_file(), f"{issue.id}: {path} does not exist"
        assert issue.raises is EngineCrashed and issue.upstream.startswith("https://")


def test_an_entry_applies_only_to_its_engine_versions_and_platforms(tmp_path):
    (tmp_path / "k.yaml").write_text(SAMPLE)
    issue = known_issues.load(tmp_path / "k.yaml")[0]
    path = REPO / issue.tests[0].split("::")[0]
    assert path.is_file() and issue.raises is EngineCrashed
    assert issue.applies("vllm", "0.26.0", "sm_90")
    assert issue.applies("vllm", "0.26.0+cu130", "sm_90")
    assert not issue.applies("vllm", "0.32.0", "sm_90")  # fixed there: the test runs normally
    assert not issue.applies("vllm", "0.26.0", "cpu")
    assert not issue.applies("vllm", None, "sm_90")
    assert issue.matches("tests/level3_stress/test_abuse.py::test_abusive_request_gets_an_error_and_the_server_survives[negative-token-id-triton-bf16]")
    assert not issue.matches("tests/level3_stress/test_abuse.py::test_abusive_request_gets_an_error_and_the_server_survives[empty-prompt-triton-bf16]")


@pytest.mark.parametrize("broken, expect", [
    ("issues: {}", "expected `issues:` with a list"),
    ("", r"expected `issues:` with a list of entries \(`issues: \[\]` for none\); fix the file or restore it from git"),
    ("\udcff", "not UTF-8 text"),  # binary junk: a UnicodeDecodeError traceback (INTERNALERROR) before
    ("issues: [{id: x}]", "needs exactly"),
    ("issues: [{id: x, engine: vllm, versions: 'not a range', platforms: [sm_90], tests: ['a.py::b'], raises: engine-crash, upstream: u, symptom: s, evidence: e}]", "not a version range"),
    ("issues: [{id: x, engine: vllm, versions: '<1', platforms: [sm_90], tests: ['a.py::b'], raises: timeout, upstream: u, symptom: s, evidence: e}]", "is not one of engine-crash"),
    ("issues: [", "malformed YAML"),
    # null or one value where a list belongs: an INTERNALERROR (TypeError) before, or a string read letter by letter
    ("issues: [{id: x, engine: vllm, versions: '<1', platforms: null, tests: ['a.py::b'], raises: engine-crash, upstream: u, symptom: s, evidence: e}]", r"platforms must be a list"),
    ("issues: [{id: x, engine: vllm, versions: '<1', platforms: [sm_90], tests: 'a.py::b', raises: engine-crash, upstream: u, symptom: s, evidence: e}]", r"tests must be a list"),
])
def test_a_bad_file_is_one_line(tmp_path, broken, expect):
    p = tmp_path / "k.yaml"
    p.write_text(broken, errors="surrogateescape")
    with pytest.raises(SuiteError, match=expect) as e:
        known_issues.load(p)
    assert "\n" not in str(e.value)


def test_strict_xfail_semantics_as_the_suite_applies_them(tmp_path):
    """The known symptom xfails; a fixed engine (the test passes) fails the run with the removal hint; any
    other failure of the test stays a plain failure."""
    test = tmp_path / "test_k.py"
    test.write_text(textwrap.dedent('''
        import pytest
        from harness.engine.server import EngineCrashed
        mark = pytest.mark.xfail(strict=True, raises=EngineCrashed, reason="known engine issue X: remove 'X' from tests/known_engine_issues.yaml")
        @mark
        def test_crashes():
            raise EngineCrashed("engine crashed on negative-token-id")
        @mark
        def test_fixed():
            pass
        @mark
        def test_other_failure():
            assert 500 == 400
    '''))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rxXf", "-c", "/dev/null",
                        f"--rootdir={tmp_path}", str(test)], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    out = r.stdout
    assert "1 failed" not in out or "2 failed" in out, out
    assert "XFAIL" in out and "test_crashes" in out
    assert "test_fixed" in out and "[XPASS(strict)]" in out and "remove 'X'" in out
    assert "FAILED" in out and "test_other_failure" in out
