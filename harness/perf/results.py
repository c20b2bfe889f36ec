"""Where level 4 writes a run's results, and which of them are the shared servers'.

The shared server of a configuration writes `results/<model>__<config>.json`; a server booted beside it for one
test (the n-gram speculator) writes `results/<model>__<config>__<tag>.json`. Readers that judge or summarise the
configurations (`scripts/judge_run.py`, `scripts/gates_summary.py`) take the shared servers' files only; the run
report shows the side servers too.
"""
from __future__ import annotations

import json
from pathlib import Path

from harness.core.errors import SuiteError

RESULTS_DIR = "results"
# How a sensitivity curve's measured metric without a verdict (the engine clock of a host-bound decode) reads in
# reports (harness.perf.sensitivity writes such rows; scripts/gates_summary.py and the run report read them)
UNJUDGED = "measured, not judged (host-bound engine clock)"


def results_name(model: str, config: str, tag: str = "") -> str:
    """`tag` is "" for the shared server, "__<name>" for a server booted beside it."""
    return f"{model}__{config}{tag}.json"


def is_shared(path: Path) -> bool:
    return path.suffix == ".json" and path.stem.count("__") == 1


def results_files(run_dir: Path, side_servers: bool = False) -> list[Path]:
    """A run directory's level 4 results files, sorted: the shared servers', and with `side_servers` the others."""
    found = sorted(Path(run_dir, RESULTS_DIR).glob("*.json"))
    return [p for p in found if "__" in p.stem and (side_servers or is_shared(p))]


def read_results(path: Path) -> dict:
    """A level 4 results file, the one way every reader takes it; a file that cannot be read (truncated by a run killed
    while writing it, before results were written atomically) or is not a results file is one line naming it and
    the fix."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SuiteError(f"cannot read results {path} ({type(e).__name__}); rerun level 4 to write it again") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise SuiteError(f"results {path} has no metrics mapping: not a level 4 results file")
    # the names a run is filed and judged under (slugged into baseline paths): a number there was an AttributeError
    for key in ("platform", "device", "config", "model"):
        if key in data and not isinstance(data[key], str):
            raise SuiteError(f"results {path}: `{key}` is {str(data[key])[:40]!r}, not a name; rerun level 4 to write "
                             "it again")
    # the kernel-path check's mark: the gate refuses `valid: false`, and a "no" or 0 there would pass as valid
    if "valid" in data and not isinstance(data["valid"], bool):
        raise SuiteError(f"results {path}: `valid` is {str(data['valid'])[:40]!r}, not true or false; rerun level 4 to "
                         "write it again")
    return data
