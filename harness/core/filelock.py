"""An exclusive file lock with a timeout, shared by pytest-xdist workers and concurrent runs (the `filelock`
package does the locking; this wrapper turns a timeout into the suite's one-line error naming who waits)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import filelock

from harness.core.errors import SuiteError


@dataclass
class FileLock:
    """An exclusive lock on `path`, waited for at most `timeout_s` (xdist workers share one machine's GPUs or
    CPU cores)."""

    path: Path
    timeout_s: float
    what: str = "lock"
    _lock: filelock.BaseFileLock | None = field(default=None, repr=False)

    def __enter__(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = filelock.FileLock(str(self.path))
        try:
            self._lock.acquire(timeout=self.timeout_s, poll_interval=0.5)
        except filelock.Timeout:
            self._lock = None
            raise SuiteError(f"waited {self.timeout_s:.0f} s for the {self.what} ({self.path}); "
                             f"another process holds it (a stuck test run? `ps -ef | grep pytest`)") from None
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
