"""The level 6 plan's promise, checked from what the plan runs and what its report says (not from how pairwise chose).

harness/matrix/combinations.py promises that every varied value that runs has a partner differing from it in exactly
one axis, the pairs the orthogonality test judges; a value no runnable pair can give one must be listed in the plan's
report with the reason. Shared by tests/level6_matrix/test_combinations.py (this platform's plan) and
tests/unit/test_matrix_review.py (every platform and flavour the data declares).
"""
from __future__ import annotations

# the report's section of values without a partner (harness/matrix/combinations.py Plan.report)
UNPAIRED_SECTION = "## values in no one-axis pair"


def listed_unpaired(report: str) -> dict[str, str]:
    """`axis=value` -> reason, as the report's unpaired section lists them (empty when there is no such section)."""
    listed: dict[str, str] = {}
    inside = False
    for line in report.splitlines():
        if line.startswith("## "):
            inside = line.startswith(UNPAIRED_SECTION)
        elif inside and line.startswith("- ") and not line.startswith("- none"):
            value, _, why = line[2:].partition(": ")
            listed[value] = why.strip()
    return listed


def pairing_problems(plan) -> list[str]:
    """Every (axis, value) some combination runs must be in a pair of combinations that differ only in that axis, or
    be listed in the report's unpaired section with a reason; nothing listed there may be paired or absent."""
    paired = {f"{axis}={c.config[axis]}" for a, b, axis in plan.pairs() for c in (a, b)}
    listed = listed_unpaired(plan.report())
    problems, run = [], set()
    for axis in plan.axes:
        for value in dict.fromkeys(c.config[axis] for c in plan.combos):
            key = f"{axis}={value}"
            run.add(key)
            if key in paired and key in listed:
                problems.append(f"{key} is listed as unpaired but is in a one-axis pair")
            elif key not in paired and not listed.get(key):
                runs_in = ", ".join(c.name for c in plan.combos if c.config[axis] == value)
                problems.append(f"{key} runs ({runs_in}) but no two combinations that differ only in {axis} include it, "
                                f"and the report does not list it with a reason: its orthogonality is unchecked")
    problems += [f"{key} is listed as unpaired but no combination runs it" for key in listed if key not in run]
    return problems
