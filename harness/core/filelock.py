"""An exclusive file lock with a timeout, shared by pytest-xdist workers and concurrent runs (the `filelock`
package does the locking; this wrapper turns a timeout into the suite's one-line error naming who waits and,
where the holder left a note, who holds it), and the re-entrant form one process's servers share."""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import filelock

from harness.core.errors import SuiteError

# how long a server waits for its slot: another worker (or another run) may hold it for all levels of a config
SLOT_TIMEOUT_S = 12 * 3600.0


def slot_timeout_s() -> float:
    """SUITE_SLOT_TIMEOUT (seconds) or SLOT_TIMEOUT_S. A wait that never ends (0, negative, nan: the lock's
    deadline never comes) or a value like "12h" is one line naming the variable, at the first wait for a slot."""
    raw = os.environ.get("SUITE_SLOT_TIMEOUT")
    if raw is None:
        return SLOT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SuiteError(f"SUITE_SLOT_TIMEOUT={raw!r}: expected seconds above 0 (e.g. 43200 for 12 hours)")
    return value


def holder_path(path: Path) -> Path:
    """Where the lock's holder leaves its note (not the lock file itself: filelock truncates that on every open)."""
    return path.with_name(path.name + ".holder")


def holder_note(path: Path) -> str:
    try:
        return holder_path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


@dataclass
class FileLock:
    """An exclusive lock on `path`, waited for at most `timeout_s` (xdist workers and other runs share one
    machine's GPUs or CPU cores). `note` says who holds it (written beside the lock while held);
    `on_wait(text)` is called once when the lock is taken by someone else, with what their note says."""

    path: Path
    timeout_s: float
    what: str = "lock"
    note: str = ""
    on_wait: Callable[[str], None] | None = None
    _lock: filelock.BaseFileLock | None = field(default=None, repr=False)

    def __enter__(self) -> "FileLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # mode 0o666: a lock directory shared by every user of the machine (another user's run must open it)
            # thread_local off: one process's servers share a slot across threads, and the last to leave releases it
            lock = filelock.FileLock(str(self.path), mode=0o666, thread_local=False)
            if self.on_wait is not None:
                try:
                    lock.acquire(timeout=0)
                except filelock.Timeout:
                    self.on_wait(self._held_by())
                    lock.acquire(timeout=self.timeout_s, poll_interval=0.5)
            else:
                lock.acquire(timeout=self.timeout_s, poll_interval=0.5)
        except filelock.Timeout:
            raise SuiteError(f"waited {self.timeout_s:.0f} s for the {self.what} ({self.path}); "
                             f"{self._held_by()} (a stuck test run? `ps -ef | grep pytest`)") from None
        except OSError as e:
            # another user's folder without write access for us, a read-only /tmp: one line naming the folder
            raise SuiteError(f"cannot take the {self.what}: {self.path} ({e.strerror or e}); make "
                             f"{self.path.parent} writable, or point SUITE_LOCK_DIR (server slots) elsewhere") from None
        self._lock = lock
        if self.note:
            try:
                holder_path(self.path).write_text(self.note + "\n", encoding="utf-8")
            except OSError:
                pass  # the note only names the holder in others' messages
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            if self.note:
                try:
                    holder_path(self.path).unlink()
                except OSError:
                    pass
            self._lock.release()
            self._lock = None

    def _held_by(self) -> str:
        note = holder_note(self.path)
        return f"held by {note}" if note else "another process holds it"


# (owner, lock file) -> [its open FileLock, how many of the owner's servers hold it now]. One process's servers
# share its slots: a session server holds its slot for the whole session, and a second server of the same process
# (level 6, a mutation check beside the shared server) asking for the same lock file waited for itself until the
# timeout.
_HELD: dict[tuple[str, Path], list] = {}
# a server booted ahead on another thread asks while the first holder may still be waiting for the file: it must
# wait for that holder, not open the file a second time (a second open waits for the first, in the same process)
_KEY_GUARDS: dict[tuple[str, Path], threading.Lock] = {}
_GUARD = threading.Lock()


@contextmanager
def shared_by_owner(owner: str, path: Path, timeout_s: float, what: str, note: str = "",
                    on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """`FileLock(path)` for the first of `owner`'s holders; its later holders share it, and whoever leaves last
    (not necessarily the first) releases it."""
    key = (owner, Path(path))
    with _GUARD:
        guard = _KEY_GUARDS.setdefault(key, threading.Lock())
    with guard:
        if key in _HELD:
            _HELD[key][1] += 1
        else:
            _HELD[key] = [FileLock(Path(path), timeout_s, what, note, on_wait).__enter__(), 1]
    try:
        yield
    finally:
        with guard:
            _HELD[key][1] -= 1
            if _HELD[key][1] == 0:
                _HELD.pop(key)[0].__exit__(None, None, None)
