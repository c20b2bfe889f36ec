"""The repository stands alone: a user clones only this repository.

No file may point at a path outside it (the developers' shared folder beside the checkout) or cite our
internal planning documents by number; cite the fact itself instead (e.g. the users' plan: "if validation
fails, benchmark results are INVALID"). Checked over every file git tracks or would add (not ignored).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# spelled so that this file does not match itself
OUTSIDE = re.compile(re.escape("../" + "shared") + r"\b|/work/" + "shared")
NUMBERED_DOC = re.compile(r"\bseeds?[ _-]?0\d\d\b", re.IGNORECASE)


def _files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / p for p in sorted(set(out.split("\0"))) if p and (REPO / p).is_file()]


def _offenders(pattern: re.Pattern) -> list[str]:
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (weights, images)
        for i, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()[:120]}")
    return hits


def test_no_file_names_a_path_outside_the_repository():
    hits = _offenders(OUTSIDE)
    assert not hits, "paths outside the repository (a user has only this checkout):\n" + "\n".join(hits)


def test_no_file_cites_internal_documents_by_number():
    hits = _offenders(NUMBERED_DOC)
    assert not hits, "cite the fact, not an internal document's number:\n" + "\n".join(hits)


def test_the_patterns_catch_what_they_should():
    assert OUTSIDE.search("see " + "../" + "shared/device/README.md") and not OUTSIDE.search("../" + "sharedmemory.h")
    for text in ("seed" + " 000 Phase 3", "Seeds" + " 001: tg", "(seed" + "-003)", "SEED" + " 004"):
        assert NUMBERED_DOC.search(text), text
    for text in ("fresh seeds, normalized MSE", "seed 1234", "the script seeds that file", "--seed 0"):
        assert not NUMBERED_DOC.search(text), text
