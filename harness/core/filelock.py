"""An exclusive file lock with a timeout, shared by pytest-xdist workers and concurrent runs."""
from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import SuiteError


@dataclass
class FileLock:
    """An exclusive flock with a timeout (xdist workers share one machine's GPUs or CPU cores)."""

    path: Path
    timeout_s: float
    what: str = "lock"
    _fd: int | None = None

    def __enter__(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    self._fd = None
                    raise SuiteError(f"waited {self.timeout_s:.0f} s for the {self.what} ({self.path}); "
                                     f"another process holds it (a stuck test run? `ps -ef | grep pytest`)") from None
                time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
