"""Boot the next server of a known sequence while the current one is in use (level 2's mutations, level 6's
combinations): a boot is mostly process start-up and imports, one core's work, so on the 2-core CPU machines it
overlaps well with the checks running on the server before it. At most one boot runs ahead; every server is
still stopped by its user (`with ahead.take(key) as running:`), and `close()` stops one booted ahead and never
taken (a deselected or skipped test).

Only for checks whose verdicts do not depend on speed: a server measured for speed must not share the machine
with a boot. A server booted ahead shared the machine while it booted, so its boot time in boots.json is not a
start-up measurement (level 4's `startup_time_s` comes from the config's own server, never booted ahead).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Callable, Generic, Hashable, TypeVar

from harness.core.errors import SuiteError
from harness.session.suite import RunningServer, Suite

K = TypeVar("K", bound=Hashable)


def ahead_allowed(suite: Suite) -> bool:
    """Boots ahead on CPU only, and not under pytest-xdist (whose workers already run servers side by side). On a
    GPU a third server beside the shared one (0.70 of its memory) and the one in use (0.12) does not fit reliably:
    at 0.2 a second one already failed to boot on an H200."""
    return not suite.platform.is_cuda and not os.environ.get("PYTEST_XDIST_WORKER")


class BootAhead(Generic[K]):
    """`enabled=False`: every server boots when taken, none ahead (see `ahead_allowed`)."""

    def __init__(self, keys: list[K], boot: Callable[[K], RunningServer], timeout_s: float, enabled: bool = True) -> None:
        self.keys, self.boot, self.timeout_s, self.enabled = list(keys), boot, timeout_s, enabled
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="boot-ahead")
        self._ahead: dict[K, Future] = {}
        self._lock = threading.Lock()

    def take(self, key: K) -> RunningServer:
        """The server of `key`, booted now or ahead (a boot error is raised here). Once it is up (or failed), the
        key after it starts booting."""
        with self._lock:
            fut = self._ahead.pop(key, None)
            for skipped in [k for k in self._ahead if self._index(k) < self._index(key)]:
                self._ahead.pop(skipped).add_done_callback(_stop_when_up)  # its test was skipped: never taken
        try:
            if fut is None:
                return self.boot(key)
            try:
                return fut.result(timeout=self.timeout_s)
            except FuturesTimeout:
                fut.add_done_callback(_stop_when_up)  # nobody will take it: stop it once its boot ends
                raise SuiteError(f"the server of {key} booting ahead was not up within {self.timeout_s:.0f} s") from None
        finally:
            self._boot_next(key)

    def _boot_next(self, key: K) -> None:
        nxt = self._next(key) if self.enabled else None
        with self._lock:
            if nxt is not None and nxt not in self._ahead:
                self._ahead[nxt] = self._pool.submit(self.boot, nxt)

    def _index(self, key: K) -> int:
        return self.keys.index(key) if key in self.keys else -1

    def _next(self, key: K) -> K | None:
        i = self._index(key)
        return self.keys[i + 1] if 0 <= i < len(self.keys) - 1 else None

    def close(self) -> None:
        """Stop the servers booted ahead and never taken (after their boots finish: a boot is not interrupted)."""
        with self._lock:
            pending, self._ahead = list(self._ahead.values()), {}
        for fut in pending:
            try:
                fut.result(timeout=self.timeout_s).stop()
            except FuturesTimeout:  # still booting past its wait: stopped when its boot ends (its own timeout)
                fut.add_done_callback(_stop_when_up)
            except Exception:  # a failed boot already stopped its process group
                pass
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "BootAhead[K]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stop_when_up(fut: Future) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().stop()
