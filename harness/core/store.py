"""One record/compare store for everything the suite keeps between runs: level 2 and chat goldens, level 6
goldens and level 4 baselines.

Semantics follow pytest-regressions: a missing record fails with the command that creates it; on every run
the fresh result is written to the run directory (`<run>/obtained/<path of the record>`), so a reviewer can diff
it against the record or copy it over; `--force-regen` writes the record (atomically) and fails the test with
`Regenerated`, so a regenerated file is never mistaken for a pass; a run whose kernel path is not known good
may not record (`refusal`). A record names what it was measured with (the weights' fingerprint, the vLLM
flavour): a record of other weights or of another flavour is refused by name, never judged as a regression
(`moe=gemv` is the users' fork's DP4A kernel under `fork` and this repository's plugin under `upstream`).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, NoReturn

from harness.core.errors import SuiteError
from harness.core.paths import REPO, shown


class Regenerated(SuiteError):
    """--force-regen wrote a golden or baseline: the test fails so it is never mistaken for a pass."""


def regen_command(level: str, config: str, model: str | None = None) -> str:
    """The command that records (or re-records) a record; every message that needs a new one names it."""
    return f"pytest -m {level} --config={config} --force-regen" + (f" --model={model}" if model else "")


# identity fields a record carries and the run must match: field -> how a mismatch is named
IDENTITY = {
    "model_fingerprint": "other weights",
    "flavour": "another vLLM flavour",
}


def identity_problem(recorded: Mapping, current: Mapping, what: str, model: str | None) -> str | None:
    """Why a record may not judge this run (None: it may). A field the run does not carry is not checked; a
    fingerprint the record lacks is refused (it cannot say it is the same weights), and so is a record's fingerprint
    where the run's model has none (another checkpoint under the same name); a flavour the record lacks is accepted
    (records from before flavours were kept)."""
    fp_now, fp_then = current.get("model_fingerprint"), recorded.get("model_fingerprint")
    if fp_then and not fp_now and "model_fingerprint" in current:
        return (f"{what} was recorded with the weights fingerprinted {fp_then}; this run's model {model} has no "
                f"fingerprint (a checkpoint folder or hub id named like those weights), so it cannot be the same weights: "
                f"pass --model={model} for them, or rename the folder")
    if fp_now and fp_then != fp_now:
        return (f"{what} was recorded with other weights of {model} (fingerprint {fp_then or 'not recorded'}, "
                f"this run: {fp_now})")
    fl_now, fl_then = current.get("flavour"), recorded.get("flavour")
    if fl_now and fl_then and fl_then != fl_now:
        return (f"{what} was recorded under the {fl_then} flavour, this run is {fl_now}: the same config name runs "
                f"other kernels there (moe=gemv is the fork's DP4A kernel under fork and this repository's plugin under "
                f"upstream), so it is not judged")
    return None


@dataclass
class Store:
    """What one run may do with records: where its obtained copies go, whether it regenerates, why it may not."""

    run_dir: Path | None  # obtained copies go under <run_dir>/obtained; None: not kept (unit tests, scripts)
    force_regen: bool = False
    refusal: Callable[[], str | None] = lambda: None  # why this run may not record (None: it may)
    identity: Mapping[str, str | None] = field(default_factory=dict)  # model_fingerprint, flavour of this run

    def check(self, recorded: Mapping, what: str, model: str | None, remedy: str) -> None:
        """Refuse a record of other weights or another flavour by name (SuiteError naming `remedy`)."""
        problem = identity_problem(recorded, self.identity, what, model)
        if problem:
            raise SuiteError(f"{problem}; {remedy}")

    def obtained(self, record_path: Path, text: str) -> Path | None:
        """Keep this run's fresh result beside the run's other artifacts, at the record's path."""
        if self.run_dir is None:
            return None
        rel = record_path.relative_to(REPO) if record_path.is_relative_to(REPO) else Path(record_path.name)
        path = self.run_dir / "obtained" / rel
        write_atomic(path, text)
        return path

    def record(self, path: Path, text: str, who: str, again: str) -> NoReturn:
        """--force-regen: write the record (refused when the run may not record) and fail the test."""
        why = self.refusal()
        if why:
            raise SuiteError(f"--force-regen refused for {who}: {why}")
        write_atomic(path, text)
        raise Regenerated(f"--force-regen: {again.format(path=shown(path))}")


def write_atomic(path: Path, text: str) -> None:
    """Write then rename, so an interrupted write never leaves half a record behind. A write that cannot happen (a
    folder where the file goes, a file where a folder goes, no permission) is one line naming the path."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise SuiteError(f"cannot write {shown(path)} ({type(e).__name__}: {e.strerror} for {e.filename}); remove what is in "
                         f"the way or make the folder writable") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a record from the other users of a shared checkout
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise SuiteError(f"cannot write {shown(path)} ({type(e).__name__}: {e.strerror}); remove what is in the way "
                         f"(a folder of that name?) or make the folder writable") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
