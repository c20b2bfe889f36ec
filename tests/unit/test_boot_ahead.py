"""BootAhead (harness/session/ahead.py) with a stand-in boot: the next server boots while this one is used, a
boot error reaches the test that takes the server, and no server booted ahead outlives the block."""
from __future__ import annotations

import threading
import time

import pytest

from harness.core.errors import SuiteError
from harness.session.ahead import BootAhead


class Fake:
    def __init__(self, key: str):
        self.key, self.stopped = key, False

    def stop(self) -> None:
        self.stopped = True


class Boots:
    def __init__(self, fail: str | None = None, seconds: float = 0.2):
        self.started: list[tuple[str, str]] = []  # (key, thread name)
        self.made: list[Fake] = []
        self.fail, self.seconds = fail, seconds
        self.live = 0
        self.most_live = 0
        self.lock = threading.Lock()

    def __call__(self, key: str) -> Fake:
        with self.lock:
            self.started.append((key, threading.current_thread().name))
            self.live += 1
            self.most_live = max(self.most_live, self.live)
        time.sleep(self.seconds)
        with self.lock:
            self.live -= 1
        if key == self.fail:
            raise SuiteError(f"{key} did not boot")
        self.made.append(Fake(key))
        return self.made[-1]


def test_the_next_server_boots_while_this_one_is_used_and_each_boots_once():
    boots = Boots()
    with BootAhead(["a", "b", "c"], boots, timeout_s=10) as ahead:
        a = ahead.take("a")
        # "a" in use: "b" boots meanwhile. Waited for by its result, not a fixed sleep: a loaded machine may start the
        # helper thread late, and what is judged is which boots ran where, not how fast
        deadline = time.monotonic() + 10
        while len(boots.made) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [k for k, _ in boots.started] == ["a", "b"]
        assert boots.started[1][1].startswith("boot-ahead"), "the next boot runs on the helper thread"
        b = ahead.take("b")
        assert [k for k, _ in boots.started] == ["a", "b"], "a server booted ahead is handed over without a second boot"
        assert b is boots.made[1] and (a.key, b.key) == ("a", "b")
        c = ahead.take("c")
    assert [k for k, _ in boots.started] == ["a", "b", "c"]
    assert boots.most_live <= 2 and not c.stopped  # the user stops what it took


def test_a_failed_boot_ahead_is_raised_to_the_test_that_takes_it():
    boots = Boots(fail="b")
    with BootAhead(["a", "b", "c"], boots, timeout_s=10) as ahead:
        ahead.take("a")
        with pytest.raises(SuiteError, match="b did not boot"):
            ahead.take("b")
        assert ahead.take("c").key == "c"


def test_a_server_booted_ahead_and_never_taken_is_stopped():
    boots = Boots()
    with BootAhead(["a", "b"], boots, timeout_s=10) as ahead:
        ahead.take("a")
    assert [f.key for f in boots.made] == ["a", "b"]
    assert boots.made[1].stopped and not boots.made[0].stopped


def test_disabled_boots_each_server_when_taken_and_none_ahead():
    boots = Boots()
    with BootAhead(["a", "b"], boots, timeout_s=10, enabled=False) as ahead:
        ahead.take("a")
        time.sleep(0.3)
        assert [k for k, _ in boots.started] == ["a"]
        ahead.take("b")
    assert boots.most_live == 1 and all(t == "MainThread" for _, t in boots.started)


def test_a_boot_ahead_that_outlasts_the_timeout_is_a_one_line_error():
    boots = Boots(seconds=1.0)
    with BootAhead(["a", "b"], boots, timeout_s=0.3) as ahead:
        ahead.take("a")
        with pytest.raises(SuiteError, match="not up within"):
            ahead.take("b")
    assert [f.key for f in boots.made] == ["a", "b"] and boots.made[1].stopped, "the late server is stopped once up"


def test_a_server_booted_ahead_for_a_skipped_test_is_stopped_when_a_later_one_is_taken():
    boots = Boots()
    with BootAhead(["a", "b", "c"], boots, timeout_s=10) as ahead:
        ahead.take("a")  # "b" boots ahead; its test is then skipped
        time.sleep(0.4)
        c = ahead.take("c")
        assert [f.key for f in boots.made if f.stopped] == ["b"], "b would idle beside c until the module ends"
        assert not c.stopped


def test_a_boot_ahead_still_running_at_close_is_stopped_once_it_is_up():
    """close() waits timeout_s for a boot ahead nobody took; one that outlasts it was left running for good."""
    boots = Boots(seconds=1.0)
    with BootAhead(["a", "b"], boots, timeout_s=0.2) as ahead:
        ahead.take("a")  # "b" boots ahead and is never taken; close() gives up waiting on it after 0.2 s
    assert [f.key for f in boots.made] == ["a", "b"] and boots.made[1].stopped, "the late server outlived close()"
