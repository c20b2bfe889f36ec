"""Reading the suite's YAML data files: one line naming the file, the line and the fix on any problem."""
from __future__ import annotations

from pathlib import Path

import yaml

from harness.core.errors import SuiteError


def load_mapping(path: Path, fix: str = "fix the file", empty_ok: bool = False) -> dict:
    """The top-level mapping of `path` ({} for an empty file when `empty_ok`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SuiteError(f"{path}: cannot read ({e.strerror}); restore it from git") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SuiteError(f"{path}:{line}: malformed YAML ({problem}); {fix}") from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: expected a mapping at the top level; {fix}")
    return data
