"""The testcases of a pytest junit.xml: the one reader behind a feature's per-level outcomes and the nightly's list
of failures."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JunitCase:
    classname: str
    name: str
    outcome: str  # "passed", "failed" (a failure or an error), "skipped" or "xfailed"
    message: str  # the failure's or the skip's message, "" when it has none


def read_cases(path: Path) -> list[JunitCase]:
    """Every testcase of `path`, in file order. A missing or unparsable file raises OSError / ET.ParseError: what that
    means (a run killed before writing it) is the caller's to say."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            outcome, message = "failed", bad.get("message") or ""
        elif skipped is not None:
            message = skipped.get("message") or ""
            xfail = "xfail" in (skipped.get("type") or "") or "xfail" in message.lower()
            outcome = "xfailed" if xfail else "skipped"
        else:
            outcome, message = "passed", ""
        out.append(JunitCase(case.get("classname", ""), case.get("name", ""), outcome, message))
    return out
