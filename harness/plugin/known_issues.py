"""Known engine bugs as data: a test an engine bug breaks becomes a strict xfail naming the bug.

`tests/known_engine_issues.yaml` lists, per bug: the engine and the version range where it was seen,
the platforms, the test ids it breaks (node ids with `*` wildcards), the upstream reference and
the observed symptom. A matching test is marked `xfail(strict=True)`: while the bug is there the run
says "known engine issue <id>" instead of failing; once the engine is fixed the test passes, the strict
XPASS fails the run, and its message says to remove the entry. Only the documented symptom counts as the known
bug (`raises`: e.g. engine-crash = harness.engine.server.EngineCrashed); any other failure of the test stays a failure.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.core.errors import SuiteError
from harness.core.paths import TESTS_DIR
from harness.core.platform import is_valid_selector, platform_matches
from harness.core.yamlfile import load_mapping
from harness.engine.server import EngineCrashed

FILE = TESTS_DIR / "known_engine_issues.yaml"
_KEYS = {"id", "engine", "versions", "platforms", "tests", "raises", "upstream", "symptom", "evidence"}


def _symptoms() -> dict[str, type[BaseException]]:
    """What a known issue may raise; any other failure of the test is a real failure, not the known bug."""
    return {"engine-crash": EngineCrashed}


@dataclass(frozen=True)
class KnownIssue:
    id: str
    engine: str
    versions: SpecifierSet
    platforms: tuple[str, ...]
    tests: tuple[str, ...]
    raises: type[BaseException]
    upstream: str
    symptom: str
    evidence: str

    def applies(self, engine: str, version: str | None, platform: str) -> bool:
        if engine != self.engine or version is None or not any(platform_matches(s, platform) for s in self.platforms):
            return False
        try:
            return Version(version) in self.versions
        except InvalidVersion:
            return False

    def matches(self, nodeid: str) -> bool:
        """`*` and `?` are wildcards; brackets are literal (node ids carry their parameters in [...])."""
        return any(re.fullmatch(re.escape(p).replace(r"\*", ".*").replace(r"\?", "."), nodeid) for p in self.tests)

    def reason(self) -> str:
        return (f"known engine issue {self.id} ({self.engine} {self.versions}): {self.symptom}; upstream: {self.upstream}. "
                f"If this test now passes, the engine is fixed: remove '{self.id}' from tests/known_engine_issues.yaml")


def load(path: Path = FILE) -> list[KnownIssue]:
    entries = load_mapping(path, empty_ok=True).get("issues")
    if not isinstance(entries, list):
        raise SuiteError(f"{path}: expected `issues:` with a list of entries (`issues: []` for none); fix the file or "
                         "restore it from git")
    out = []
    for i, e in enumerate(entries):
        at = f"{path}: issues[{i}]"
        if not isinstance(e, dict) or set(e) != _KEYS:
            missing = sorted(_KEYS - set(e)) if isinstance(e, dict) else sorted(_KEYS)
            extra = sorted(set(e) - _KEYS) if isinstance(e, dict) else []
            raise SuiteError(f"{at}: needs exactly {sorted(_KEYS)} (missing {missing}, unknown {extra})")
        try:
            versions = SpecifierSet(str(e["versions"]))
        except InvalidSpecifier:
            raise SuiteError(f"{at}: versions '{e['versions']}' is not a version range such as '>=0.26,<0.27'") from None
        for key in ("platforms", "tests"):  # a single value or null would be iterated letter by letter, or not at all
            if not isinstance(e[key], list):
                raise SuiteError(f"{at}: {key} must be a list, e.g. {key}: [{e[key]}]")
        platforms = tuple(str(p) for p in e["platforms"])
        bad = [p for p in platforms if not is_valid_selector(p)]
        if bad or not platforms:
            raise SuiteError(f"{at}: platforms {bad or '[]'} are not platform selectors (cpu, sm_90, sm_12x, >=sm_80)")
        tests = tuple(str(t) for t in e["tests"])
        if not tests or not all("::" in t for t in tests):
            raise SuiteError(f"{at}: tests must be pytest node ids (path::name[params], globs allowed)")
        symptoms = _symptoms()
        if str(e["raises"]) not in symptoms:
            raise SuiteError(f"{at}: raises '{e['raises']}' is not one of {', '.join(symptoms)}")
        out.append(KnownIssue(str(e["id"]), str(e["engine"]), versions, platforms, tests, symptoms[str(e["raises"])],
                              str(e["upstream"]), str(e["symptom"]), str(e["evidence"])))
    return out
